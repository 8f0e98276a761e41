//! Deterministic OTLP corpus, shaped like a real load generator.
//!
//! [`Corpus::new`] takes a seed and a [`Cardinality`]; [`Corpus::logs`], [`Corpus::traces`] and
//! [`Corpus::metrics`] each build one export request. The same seed gives the same requests, and
//! successive calls continue the stream: log and span time keeps advancing (about 1 µs per record
//! from [`BASE_TIME_UNIX_NANO`]), and metric series are scraped round-robin every
//! [`SCRAPE_INTERVAL_NANOS`], so the same series shows up again at later timestamps with its
//! counters grown.
//!
//! - [`Cardinality::Low`]: 16 resources, 2 severities (INFO and ERROR), [`LOW_DISTINCT_BODIES`]
//!   distinct log bodies, attribute values drawn from small sets.
//! - [`Cardinality::High`]: 50 resources, and bodies and attributes carry unique request ids.
//!
//! Randomness comes from a private splitmix64 generator and only arithmetic on it, so output does
//! not depend on any external crate's algorithm. (The one exception is `f64::log2` for
//! exponential-histogram bucket indices, which comes from the platform's libm.)

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram,
    HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint,
    exemplar, exponential_histogram_data_point, metric, number_data_point, summary_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span, status};

/// 2026-11-30T00:00:00Z in unix nanoseconds: where every corpus clock starts.
pub const BASE_TIME_UNIX_NANO: u64 = 1_795_996_800_000_000_000;

/// Time between two scrapes of the same metric series.
pub const SCRAPE_INTERVAL_NANOS: u64 = 10_000_000_000;

/// Number of distinct log bodies in a [`Cardinality::Low`] corpus.
pub const LOW_DISTINCT_BODIES: usize = 91;

/// Resource `schema_url` on every resource group.
pub const RESOURCE_SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.26.0";

/// Instrumentation scope name on every scope group.
pub const SCOPE_NAME: &str = "mira-loadgen";

/// Instrumentation scope version on every scope group.
pub const SCOPE_VERSION: &str = "1.0.0";

/// Explicit bucket bounds of every histogram in the corpus.
pub const HISTOGRAM_BOUNDS: [f64; 8] = [5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];

/// Scale of every exponential histogram in the corpus.
const EXP_SCALE: i32 = 2;

/// How many distinct values the corpus draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cardinality {
    /// 16 resources, ~91 distinct log bodies, attribute values from small sets.
    Low,
    /// 50 resources, unique request ids in bodies and attributes.
    High,
}

impl Cardinality {
    fn resources(self) -> usize {
        match self {
            Cardinality::Low => 16,
            Cardinality::High => 50,
        }
    }

    /// Attribute combinations (series) per metric name and resource, at most.
    fn series_per_metric(self) -> usize {
        match self {
            Cardinality::Low => 3,
            Cardinality::High => 8,
        }
    }
}

/// A deterministic stream of OTLP logs, traces and metrics. See the module doc.
#[derive(Debug)]
pub struct Corpus {
    rng: Rng,
    cardinality: Cardinality,
    resources: Vec<Resource>,
    /// Clock of logs and spans, in unix nanos.
    now: u64,
    /// Counter behind unique request ids.
    next_id: u64,
    id_salt: u64,
    series: Vec<Series>,
    /// Next series to scrape.
    cursor: usize,
    /// Time of the scrape in progress, in unix nanos.
    scrape_time: u64,
}

impl Corpus {
    /// A corpus whose every output is a function of `seed` and `cardinality` (and the calls made
    /// before).
    pub fn new(seed: u64, cardinality: Cardinality) -> Self {
        Corpus::starting_at(seed, cardinality, BASE_TIME_UNIX_NANO)
    }

    /// [`Corpus::new`] with record times counting from `base` (Unix ns)
    /// instead of [`BASE_TIME_UNIX_NANO`]: what is sent to an ingester,
    /// which refuses times far from its clock.
    pub fn starting_at(seed: u64, cardinality: Cardinality, base: u64) -> Self {
        // Resources and series come from their own generator so they do not depend on how the
        // record stream is consumed.
        let mut setup = Rng::new(seed ^ 0x5EED_0F2E_5EED_0F2E);
        let resources = (0..cardinality.resources())
            .map(|i| resource(i, &mut setup))
            .collect::<Vec<_>>();
        let series = build_series(resources.len(), cardinality.series_per_metric());
        Corpus {
            rng: Rng::new(seed),
            cardinality,
            resources,
            now: base,
            next_id: 0,
            id_salt: mix(seed),
            series,
            cursor: 0,
            scrape_time: base + SCRAPE_INTERVAL_NANOS,
        }
    }

    /// Number of metric series, i.e. points per scrape interval: about 20 metrics × 3 attribute
    /// sets per resource for low cardinality, × 8 for high.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// The resources records are spread over (16 for low cardinality, 50 for high).
    pub fn resources(&self) -> &[Resource] {
        &self.resources
    }

    /// `n` log records, grouped into one resource group per resource present (in order of first
    /// appearance) with one scope group each.
    pub fn logs(&mut self, n: usize) -> ExportLogsServiceRequest {
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            let r = self.rng.below(self.resources.len());
            let record = self.log_record();
            items.push((r, record));
        }
        let resource_logs = group_by(items, self.resources.len())
            .into_iter()
            .map(|(r, log_records)| ResourceLogs {
                resource: Some(self.resources[r].clone()),
                scope_logs: vec![ScopeLogs {
                    scope: Some(scope()),
                    log_records,
                    schema_url: String::new(),
                }],
                schema_url: RESOURCE_SCHEMA_URL.to_owned(),
            })
            .collect();
        ExportLogsServiceRequest { resource_logs }
    }

    /// `n_spans` spans making traces of 3–10 spans (the last trace may be cut short to make the
    /// count), grouped like [`Corpus::logs`].
    pub fn traces(&mut self, n_spans: usize) -> ExportTraceServiceRequest {
        let mut items = Vec::with_capacity(n_spans);
        while items.len() < n_spans {
            let size = self.rng.range(3, 10) as usize;
            self.trace(size.min(n_spans - items.len()), &mut items);
        }
        let resource_spans = group_by(items, self.resources.len())
            .into_iter()
            .map(|(r, spans)| ResourceSpans {
                resource: Some(self.resources[r].clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(scope()),
                    spans,
                    schema_url: String::new(),
                }],
                schema_url: RESOURCE_SCHEMA_URL.to_owned(),
            })
            .collect();
        ExportTraceServiceRequest { resource_spans }
    }

    /// `n_points` data points, taken from the series round-robin (every series once per scrape
    /// interval), grouped by resource then metric.
    ///
    /// Series are ordered resource by resource, so a request smaller than one scrape covers only
    /// a few resources, like an export from a handful of SDKs. A full scrape is
    /// [`Corpus::series_count`] points; counters and cumulative histograms grow from one scrape to
    /// the next.
    pub fn metrics(&mut self, n_points: usize) -> ExportMetricsServiceRequest {
        let mut items = Vec::with_capacity(n_points);
        for _ in 0..n_points {
            if self.cursor == self.series.len() {
                self.cursor = 0;
                self.scrape_time += SCRAPE_INTERVAL_NANOS;
            }
            let series = &mut self.series[self.cursor];
            let point = series.observe(&mut self.rng, self.scrape_time);
            items.push((series.resource, (series.def, point)));
            self.cursor += 1;
        }
        let resource_metrics = group_by(items, self.resources.len())
            .into_iter()
            .map(|(r, points)| ResourceMetrics {
                resource: Some(self.resources[r].clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(scope()),
                    metrics: group_by(points, METRICS.len())
                        .into_iter()
                        .map(|(d, points)| METRICS[d].metric(points))
                        .collect(),
                    schema_url: String::new(),
                }],
                schema_url: RESOURCE_SCHEMA_URL.to_owned(),
            })
            .collect();
        ExportMetricsServiceRequest { resource_metrics }
    }

    /// The current clock, then moves it forward by about 1 µs.
    fn tick(&mut self) -> u64 {
        let t = self.now;
        self.now += self.rng.range(500, 1_500);
        t
    }

    /// A unique, random-looking request id (16 hex digits).
    fn unique_id(&mut self) -> String {
        // `mix` is a bijection, so distinct counters give distinct ids.
        let id = mix(self.next_id ^ self.id_salt);
        self.next_id += 1;
        format!("{id:016x}")
    }

    fn request_id(&mut self) -> Option<String> {
        match self.cardinality {
            Cardinality::Low => None,
            Cardinality::High => Some(self.unique_id()),
        }
    }

    fn log_record(&mut self) -> LogRecord {
        let time = self.tick();
        let observed = time + self.rng.range(2_000, 8_000);
        let error = self.rng.chance(0.1);
        let (templates, severity, severity_text) = if error {
            (ERROR_TEMPLATES, SeverityNumber::Error, "ERROR")
        } else {
            (INFO_TEMPLATES, SeverityNumber::Info, "INFO")
        };
        let mut body = self.rng.pick(templates).render(&mut self.rng);
        let request_id = self.request_id();
        if let Some(id) = &request_id
            && self.rng.chance(0.95)
        {
            body.push_str(" request_id=");
            body.push_str(id);
        }
        let attributes = self.log_attributes(request_id, error);
        let (trace_id, span_id, flags) = if self.rng.chance(0.5) {
            (self.rng.bytes(16), self.rng.bytes(8), 1)
        } else {
            (Vec::new(), Vec::new(), 0)
        };
        LogRecord {
            time_unix_nano: time,
            observed_time_unix_nano: observed,
            severity_number: severity as i32,
            severity_text: severity_text.to_owned(),
            body: Some(string_value(body)),
            attributes,
            dropped_attributes_count: 0,
            flags,
            trace_id,
            span_id,
            event_name: String::new(),
        }
    }

    /// 3–6 attributes of mixed types; the request id comes first when there is one.
    fn log_attributes(&mut self, request_id: Option<String>, error: bool) -> Vec<KeyValue> {
        let n = self.rng.range(3, 6) as usize;
        let method = *self.rng.pick(&["GET", "GET", "GET", "POST", "PUT", "DELETE"]);
        let status = if error {
            *self.rng.pick(&[500, 502, 503, 504])
        } else {
            *self.rng.pick(&[200, 200, 200, 200, 201, 204, 304, 404])
        };
        let duration = match self.cardinality {
            Cardinality::Low => *self.rng.pick(&[0.5, 1.25, 3.0, 12.5, 48.0, 250.75]),
            Cardinality::High => (self.rng.unit() * 10_000.0).round() / 10.0,
        };
        let retry = self.rng.chance(if error { 0.5 } else { 0.02 });
        let tier = *self.rng.pick(&["free", "free", "pro", "enterprise"]);
        let thread = self.rng.range(1, 16) as i64;
        let mut attributes = Vec::with_capacity(n);
        if let Some(id) = request_id {
            attributes.push(kv("request.id", string_value(id)));
        }
        let rest = [
            kv("http.method", str_value(method)),
            kv("http.status_code", int_value(status)),
            kv("duration_ms", double_value(duration)),
            kv("retry", bool_value(retry)),
            kv("user.tier", str_value(tier)),
            kv("thread.id", int_value(thread)),
        ];
        let missing = n - attributes.len();
        attributes.extend(rest.into_iter().take(missing));
        attributes
    }

    /// One trace of `size` spans appended to `out` as (resource index, span).
    fn trace(&mut self, size: usize, out: &mut Vec<(usize, Span)>) {
        struct Node {
            span_id: Vec<u8>,
            start: u64,
            end: u64,
            resource: usize,
        }
        if size == 0 {
            return;
        }
        let trace_id = self.rng.bytes(16);
        let trace_state = if self.rng.chance(0.1) {
            "rojo=00f067aa0ba902b7".to_owned()
        } else {
            String::new()
        };
        let mut nodes: Vec<Node> = Vec::with_capacity(size);
        for i in 0..size {
            let now = self.tick();
            let span_id = self.rng.bytes(8);
            let (parent_span_id, start, end, resource) = if i == 0 {
                let duration = self.rng.range(2_000_000, 300_000_000);
                (Vec::new(), now, now + duration, self.rng.below(self.resources.len()))
            } else {
                let parent = &nodes[self.rng.below(i)];
                let start = parent.start + self.rng.range(0, (parent.end - parent.start) / 2);
                let room = parent.end - start;
                let end = start + self.rng.range(room / 4, room);
                let resource = if self.rng.chance(0.5) {
                    parent.resource
                } else {
                    self.rng.below(self.resources.len())
                };
                (parent.span_id.clone(), start, end, resource)
            };
            let error = self.rng.chance(0.05);
            let shape = if i == 0 {
                SpanShape::Server
            } else {
                *self.rng.pick(&[
                    SpanShape::Internal,
                    SpanShape::Database,
                    SpanShape::Database,
                    SpanShape::Cache,
                    SpanShape::HttpClient,
                    SpanShape::Producer,
                    SpanShape::Consumer,
                ])
            };
            let (name, kind, attributes) = self.span_shape(shape, error);
            let events = self.span_events(start, end, error);
            let links = if shape == SpanShape::Consumer || self.rng.chance(0.05) {
                vec![span::Link {
                    trace_id: self.rng.bytes(16),
                    span_id: self.rng.bytes(8),
                    trace_state: String::new(),
                    attributes: vec![kv("link.kind", str_value("follows_from"))],
                    dropped_attributes_count: 0,
                    flags: 0x101,
                }]
            } else {
                Vec::new()
            };
            let status = if error {
                Status {
                    message: (*self
                        .rng
                        .pick(&["deadline exceeded", "connection reset by peer", "internal error"]))
                    .to_owned(),
                    code: status::StatusCode::Error as i32,
                }
            } else if shape == SpanShape::Server && self.rng.chance(0.2) {
                Status {
                    message: String::new(),
                    code: status::StatusCode::Ok as i32,
                }
            } else {
                Status::default()
            };
            out.push((
                resource,
                Span {
                    trace_id: trace_id.clone(),
                    span_id: span_id.clone(),
                    trace_state: trace_state.clone(),
                    parent_span_id,
                    flags: 0x101,
                    name,
                    kind: kind as i32,
                    start_time_unix_nano: start,
                    end_time_unix_nano: end,
                    attributes,
                    dropped_attributes_count: 0,
                    events,
                    dropped_events_count: 0,
                    links,
                    dropped_links_count: 0,
                    status: Some(status),
                },
            ));
            nodes.push(Node {
                span_id,
                start,
                end,
                resource,
            });
        }
    }

    fn span_shape(&mut self, shape: SpanShape, error: bool) -> (String, span::SpanKind, Vec<KeyValue>) {
        match shape {
            SpanShape::Server => {
                let (method, route, path_prefix) = *self.rng.pick(&[
                    ("GET", "/api/v1/users/{id}", "/api/v1/users/"),
                    ("GET", "/api/v1/products/{id}", "/api/v1/products/"),
                    ("POST", "/api/v1/orders", "/api/v1/orders"),
                    ("GET", "/api/v1/cart/{id}", "/api/v1/cart/"),
                    ("PUT", "/api/v1/cart/{id}", "/api/v1/cart/"),
                    ("GET", "/healthz", "/healthz"),
                ]);
                let request_id = self.request_id();
                let path = if route.ends_with("{id}") {
                    let id = match &request_id {
                        Some(id) => id.clone(),
                        None => (*self.rng.pick(&["42", "7", "1001", "31337"])).to_owned(),
                    };
                    format!("{path_prefix}{id}")
                } else {
                    path_prefix.to_owned()
                };
                let status = if error {
                    500
                } else {
                    *self.rng.pick(&[200, 200, 200, 201, 404])
                };
                let user_agent = *self
                    .rng
                    .pick(&["Mozilla/5.0 (X11; Linux x86_64)", "curl/8.5.0", "okhttp/4.12.0"]);
                let mut attributes = vec![
                    kv("http.request.method", str_value(method)),
                    kv("http.route", str_value(route)),
                    kv("url.path", string_value(path)),
                    kv("url.scheme", str_value("https")),
                    kv("http.response.status_code", int_value(status)),
                    kv("server.address", str_value("shop.example.com")),
                    kv("user_agent.original", str_value(user_agent)),
                ];
                if let Some(id) = request_id {
                    attributes.push(kv("request.id", string_value(id)));
                }
                (format!("{method} {route}"), span::SpanKind::Server, attributes)
            }
            SpanShape::Internal => {
                let name = *self.rng.pick(&[
                    "validate cart",
                    "compute price",
                    "render template",
                    "serialize response",
                ]);
                let attributes = vec![
                    kv("code.function", str_value(name)),
                    kv("thread.id", int_value(self.rng.range(1, 16) as i64)),
                ];
                (name.to_owned(), span::SpanKind::Internal, attributes)
            }
            SpanShape::Database => {
                let (op, table) = *self.rng.pick(&[
                    ("SELECT", "users"),
                    ("SELECT", "orders"),
                    ("SELECT", "products"),
                    ("INSERT", "orders"),
                    ("UPDATE", "inventory"),
                ]);
                let query = match op {
                    "SELECT" => format!("SELECT * FROM {table} WHERE id = $1"),
                    "INSERT" => format!("INSERT INTO {table} (id, payload) VALUES ($1, $2)"),
                    _ => format!("UPDATE {table} SET count = count - 1 WHERE id = $1"),
                };
                let attributes = vec![
                    kv("db.system", str_value("postgresql")),
                    kv("db.namespace", str_value("shop")),
                    kv("db.operation.name", str_value(op)),
                    kv("db.collection.name", str_value(table)),
                    kv("db.query.text", string_value(query)),
                    kv("server.address", str_value("db-primary")),
                    kv("server.port", int_value(5432)),
                    kv("db.response.returned_rows", int_value(self.rng.range(0, 50) as i64)),
                ];
                (format!("{op} shop.{table}"), span::SpanKind::Client, attributes)
            }
            SpanShape::Cache => {
                let op = *self.rng.pick(&["GET", "SET", "DEL"]);
                let attributes = vec![
                    kv("db.system", str_value("redis")),
                    kv("db.operation.name", str_value(op)),
                    kv("server.address", str_value("redis-0")),
                    kv("server.port", int_value(6379)),
                    kv("cache.hit", bool_value(self.rng.chance(0.8))),
                ];
                (op.to_owned(), span::SpanKind::Client, attributes)
            }
            SpanShape::HttpClient => {
                let (method, host, path) = *self.rng.pick(&[
                    ("GET", "inventory", "/stock"),
                    ("POST", "payment", "/charge"),
                    ("POST", "shipping", "/quote"),
                    ("GET", "auth", "/verify"),
                ]);
                let status = if error { 503 } else { 200 };
                let attributes = vec![
                    kv("http.request.method", str_value(method)),
                    kv("url.full", string_value(format!("http://{host}:8080{path}"))),
                    kv("server.address", str_value(host)),
                    kv("server.port", int_value(8080)),
                    kv("http.response.status_code", int_value(status)),
                    kv("http.request.resend_count", int_value(if error { 1 } else { 0 })),
                ];
                (method.to_owned(), span::SpanKind::Client, attributes)
            }
            SpanShape::Producer | SpanShape::Consumer => {
                let topic = *self.rng.pick(&["orders", "payments", "shipments"]);
                let (operation, kind) = if shape == SpanShape::Producer {
                    ("publish", span::SpanKind::Producer)
                } else {
                    ("process", span::SpanKind::Consumer)
                };
                let attributes = vec![
                    kv("messaging.system", str_value("kafka")),
                    kv("messaging.destination.name", str_value(topic)),
                    kv("messaging.operation.type", str_value(operation)),
                    kv(
                        "messaging.destination.partition.id",
                        string_value(self.rng.range(0, 11).to_string()),
                    ),
                    kv(
                        "messaging.message.body.size",
                        int_value(self.rng.range(100, 4_000) as i64),
                    ),
                ];
                (format!("{operation} {topic}"), kind, attributes)
            }
        }
    }

    /// 0–2 events inside `[start, end]`: an exception on errors, sometimes a retry or cache note.
    fn span_events(&mut self, start: u64, end: u64, error: bool) -> Vec<span::Event> {
        let mut events = Vec::new();
        if self.rng.chance(0.15) {
            let name = *self.rng.pick(&["cache.miss", "retry", "message.sent"]);
            events.push(span::Event {
                time_unix_nano: self.rng.range(start, end),
                name: name.to_owned(),
                attributes: vec![kv("attempt", int_value(self.rng.range(1, 3) as i64))],
                dropped_attributes_count: 0,
            });
        }
        if error {
            let (ty, message) = *self.rng.pick(&[
                ("java.net.SocketTimeoutException", "Read timed out"),
                ("io.grpc.StatusRuntimeException", "UNAVAILABLE: upstream connect error"),
                ("ValueError", "invalid literal for int() with base 10"),
            ]);
            events.push(span::Event {
                time_unix_nano: end,
                name: "exception".to_owned(),
                attributes: vec![
                    kv("exception.type", str_value(ty)),
                    kv("exception.message", str_value(message)),
                    kv("exception.escaped", bool_value(true)),
                ],
                dropped_attributes_count: 0,
            });
        }
        events
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpanShape {
    Server,
    Internal,
    Database,
    Cache,
    HttpClient,
    Producer,
    Consumer,
}

/// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and good enough for test data.
#[derive(Clone, Debug)]
struct Rng {
    state: u64,
}

impl Rng {
    fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// Uniform in `0..n`; `n` must be nonzero.
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        let span = u128::from(hi - lo) + 1;
        lo + ((u128::from(self.next_u64()) * span) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

/// The splitmix64 finalizer: a bijection on `u64`.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Groups `(key, item)` pairs by key (`key < n_keys`), keys in order of first appearance, items in
/// input order.
fn group_by<T>(items: Vec<(usize, T)>, n_keys: usize) -> Vec<(usize, Vec<T>)> {
    let mut slot: Vec<Option<usize>> = vec![None; n_keys];
    let mut groups: Vec<(usize, Vec<T>)> = Vec::new();
    for (key, item) in items {
        let g = *slot[key].get_or_insert_with(|| {
            groups.push((key, Vec::new()));
            groups.len() - 1
        });
        groups[g].1.push(item);
    }
    groups
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: SCOPE_NAME.to_owned(),
        version: SCOPE_VERSION.to_owned(),
        attributes: Vec::new(),
        dropped_attributes_count: 0,
    }
}

fn kv(key: &str, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(value),
        key_strindex: 0,
    }
}

fn string_value(s: String) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(s)),
    }
}

fn str_value(s: &str) -> AnyValue {
    string_value(s.to_owned())
}

fn int_value(i: i64) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::IntValue(i)),
    }
}

fn double_value(d: f64) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::DoubleValue(d)),
    }
}

fn bool_value(b: bool) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::BoolValue(b)),
    }
}

// ---------------------------------------------------------------------------------------------
// Resources

/// (service.name, service.namespace, telemetry.sdk.language, telemetry.sdk.version)
const SERVICES: [(&str, &str, &str, &str); 8] = [
    ("frontend", "shop", "nodejs", "1.30.1"),
    ("cart", "shop", "go", "1.35.0"),
    ("checkout", "shop", "java", "1.48.0"),
    ("payment", "payments", "java", "1.48.0"),
    ("inventory", "shop", "python", "1.31.1"),
    ("shipping", "logistics", "rust", "0.30.0"),
    ("auth", "platform", "go", "1.35.0"),
    ("search", "platform", "python", "1.31.1"),
];

const REGIONS: [&str; 3] = ["us-east-1", "eu-west-1", "ap-southeast-2"];

fn resource(i: usize, rng: &mut Rng) -> Resource {
    let (service, namespace, language, sdk_version) = SERVICES[i % SERVICES.len()];
    let replica = i / SERVICES.len();
    let region = REGIONS[replica % REGIONS.len()];
    let zone = ["a", "b", "c"][(i / 2) % 3];
    let environment = if replica == 1 { "staging" } else { "production" };
    let instance = rng.bytes(16);
    let instance_id = format!(
        "{}-{}-{}-{}-{}",
        hex(&instance[0..4]),
        hex(&instance[4..6]),
        hex(&instance[6..8]),
        hex(&instance[8..10]),
        hex(&instance[10..16])
    );
    let replica_set = hex(&rng.bytes(5));
    let pod_suffix: String = rng
        .bytes(5)
        .iter()
        .map(|b| char::from(b"bcdfghjklmnpqrstvwxz2456789"[usize::from(*b) % 27]))
        .collect();
    let node = format!("ip-10-0-{}-{}.{region}.compute.internal", replica, 10 + (i * 7) % 200);
    Resource {
        attributes: vec![
            kv("service.name", str_value(service)),
            kv("service.namespace", str_value(namespace)),
            kv("service.version", string_value(format!("1.{}.{}", 2 + i % 3, replica))),
            kv("service.instance.id", string_value(instance_id)),
            kv("host.name", string_value(node.clone())),
            kv("host.arch", str_value("amd64")),
            kv("os.type", str_value("linux")),
            kv("process.pid", int_value(1 + rng.range(1, 65_535) as i64)),
            kv("k8s.cluster.name", string_value(format!("{environment}-{region}"))),
            kv("k8s.namespace.name", str_value(namespace)),
            kv("k8s.node.name", string_value(node)),
            kv("k8s.deployment.name", str_value(service)),
            kv(
                "k8s.pod.name",
                string_value(format!("{service}-{replica_set}-{pod_suffix}")),
            ),
            kv("cloud.provider", str_value("aws")),
            kv("cloud.platform", str_value("aws_eks")),
            kv("cloud.region", str_value(region)),
            kv("cloud.availability_zone", string_value(format!("{region}{zone}"))),
            kv("deployment.environment.name", str_value(environment)),
            kv("deployment.environment", str_value(environment)),
            kv("telemetry.sdk.name", str_value("opentelemetry")),
            kv("telemetry.sdk.language", str_value(language)),
            kv("telemetry.sdk.version", str_value(sdk_version)),
        ],
        dropped_attributes_count: 0,
        entity_refs: Vec::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------------------
// Log bodies

/// A body template: `{}` placeholders filled in order from `tokens`. Distinct bodies per template
/// are the product of the token list lengths.
struct Template {
    text: &'static str,
    tokens: &'static [&'static [&'static str]],
}

impl Template {
    fn render(&self, rng: &mut Rng) -> String {
        let mut parts = self.text.split("{}");
        let mut out = String::with_capacity(self.text.len() + 16);
        out.push_str(parts.next().unwrap_or_default());
        for (tokens, part) in self.tokens.iter().zip(parts) {
            let token = *rng.pick(tokens);
            out.push_str(token);
            out.push_str(part);
        }
        out
    }

    #[cfg(test)]
    fn distinct(&self) -> usize {
        self.tokens.iter().map(|t| t.len()).product()
    }
}

const INFO_TEMPLATES: &[Template] = &[
    Template {
        text: "GET /api/v1/users/{} 200 in {}ms",
        tokens: &[&["42", "1001", "7"], &["3", "12", "48"]],
    },
    Template {
        text: "POST /api/v1/orders 201 in {}ms",
        tokens: &[&["15", "37", "120"]],
    },
    Template {
        text: "GET /api/v1/products?page={} 200 in {}ms",
        tokens: &[&["1", "2", "3"], &["5", "9"]],
    },
    Template {
        text: "cache {} for key {}",
        tokens: &[&["hit", "miss"], &["user:42", "cart:7", "product:1001", "session:abc"]],
    },
    Template {
        text: "user {} logged in from {}",
        tokens: &[&["alice", "bob", "carol"], &["10.0.0.12", "192.168.1.7"]],
    },
    Template {
        text: "processed batch of {} messages from topic {}",
        tokens: &[&["10", "50", "100"], &["orders", "payments"]],
    },
    Template {
        text: "scheduled job {} completed in {}s",
        tokens: &[&["cleanup", "reindex", "report"], &["1", "4"]],
    },
    Template {
        text: "connection pool stats: active={} idle={}",
        tokens: &[&["2", "5", "8"], &["0", "3"]],
    },
    Template {
        text: "health check passed",
        tokens: &[],
    },
    Template {
        text: "served static asset /assets/{}",
        tokens: &[&["app.js", "main.css", "logo.svg", "vendor.js"]],
    },
    Template {
        text: "query on table {} returned {} rows",
        tokens: &[&["users", "orders", "items"], &["0", "1", "25"]],
    },
    Template {
        text: "worker shutting down gracefully",
        tokens: &[],
    },
];

const ERROR_TEMPLATES: &[Template] = &[
    Template {
        text: "failed to connect to {}: connection refused",
        tokens: &[&["db-primary:5432", "redis-0:6379", "kafka-1:9092"]],
    },
    Template {
        text: "request to payment-gateway timed out after {}ms",
        tokens: &[&["5000", "10000"]],
    },
    Template {
        text: "GET /api/v1/users/{} 500 in {}ms",
        tokens: &[&["42", "7"], &["250", "900"]],
    },
    Template {
        text: "panic recovered: index out of range [{}] with length 3",
        tokens: &[&["3", "5"]],
    },
    Template {
        text: "order {} rejected: insufficient stock for sku {}",
        tokens: &[&["A1", "B2"], &["SKU-1", "SKU-2", "SKU-3"]],
    },
    Template {
        text: "retry {}/3 for upstream {}",
        tokens: &[&["1", "2", "3"], &["inventory", "shipping"]],
    },
    Template {
        text: "TLS handshake error from {}: EOF",
        tokens: &[&["10.0.3.4:51234", "10.0.9.1:40022", "172.16.0.5:33010"]],
    },
];

// ---------------------------------------------------------------------------------------------
// Metrics

#[derive(Clone, Copy, Debug)]
enum AttrValue {
    Str(&'static str),
    Int(i64),
    Bool(bool),
}

impl AttrValue {
    fn any_value(self) -> AnyValue {
        match self {
            AttrValue::Str(s) => str_value(s),
            AttrValue::Int(i) => int_value(i),
            AttrValue::Bool(b) => bool_value(b),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Double gauge wandering around `base` by at most `spread`.
    Gauge { base: f64, spread: f64 },
    /// Cumulative monotonic int sum growing by `1..=step` per scrape.
    Counter { step: u64 },
    /// Cumulative explicit-bucket histogram of observations in `[scale, 20 * scale]`.
    Histogram { scale: f64 },
    /// Cumulative exponential histogram of observations in `[scale, 20 * scale]`.
    ExpHistogram { scale: f64 },
    /// Cumulative summary of observations in `[scale, 20 * scale]`.
    Summary { scale: f64 },
}

struct MetricDef {
    name: &'static str,
    description: &'static str,
    unit: &'static str,
    kind: Kind,
    attributes: &'static [(&'static str, &'static [AttrValue])],
}

impl MetricDef {
    fn metric(&self, points: Vec<Point>) -> Metric {
        let temporality = AggregationTemporality::Cumulative as i32;
        let data = match self.kind {
            Kind::Gauge { .. } => metric::Data::Gauge(Gauge {
                data_points: points.into_iter().filter_map(Point::number).collect(),
            }),
            Kind::Counter { .. } => metric::Data::Sum(Sum {
                data_points: points.into_iter().filter_map(Point::number).collect(),
                aggregation_temporality: temporality,
                is_monotonic: true,
            }),
            Kind::Histogram { .. } => metric::Data::Histogram(Histogram {
                data_points: points.into_iter().filter_map(Point::histogram).collect(),
                aggregation_temporality: temporality,
            }),
            Kind::ExpHistogram { .. } => metric::Data::ExponentialHistogram(ExponentialHistogram {
                data_points: points.into_iter().filter_map(Point::exp_histogram).collect(),
                aggregation_temporality: temporality,
            }),
            Kind::Summary { .. } => metric::Data::Summary(Summary {
                data_points: points.into_iter().filter_map(Point::summary).collect(),
            }),
        };
        Metric {
            name: self.name.to_owned(),
            description: self.description.to_owned(),
            unit: self.unit.to_owned(),
            metadata: Vec::new(),
            data: Some(data),
        }
    }

    /// Distinct attribute combinations this metric can take.
    fn combinations(&self) -> usize {
        self.attributes.iter().map(|(_, values)| values.len()).product()
    }

    /// Attribute combination `c` (< [`MetricDef::combinations`]), read as a mixed-radix number.
    fn attributes(&self, mut c: usize) -> Vec<KeyValue> {
        self.attributes
            .iter()
            .map(|(key, values)| {
                let v = values[c % values.len()];
                c /= values.len();
                kv(key, v.any_value())
            })
            .collect()
    }
}

use AttrValue::{Bool, Int, Str};

const HTTP_METHODS: &[AttrValue] = &[Str("GET"), Str("POST"), Str("PUT"), Str("DELETE")];
const HTTP_STATUS: &[AttrValue] = &[Int(200), Int(201), Int(404), Int(500)];
const HTTP_ROUTES: &[AttrValue] = &[
    Str("/api/v1/users/{id}"),
    Str("/api/v1/orders"),
    Str("/api/v1/cart/{id}"),
];
const DB_OPS: &[AttrValue] = &[Str("SELECT"), Str("INSERT"), Str("UPDATE")];
const DB_TABLES: &[AttrValue] = &[Str("users"), Str("orders"), Str("inventory")];
const TOPICS: &[AttrValue] = &[Str("orders"), Str("payments"), Str("shipments")];
const CPUS: &[AttrValue] = &[Int(0), Int(1), Int(2), Int(3)];
const DIRECTIONS: &[AttrValue] = &[Str("receive"), Str("transmit")];
const DEVICES: &[AttrValue] = &[Str("eth0"), Str("eth1"), Str("lo")];
const BOOLS: &[AttrValue] = &[Bool(false), Bool(true)];

const METRICS: &[MetricDef] = &[
    MetricDef {
        name: "system.cpu.utilization",
        description: "Fraction of CPU time spent in each state",
        unit: "1",
        kind: Kind::Gauge {
            base: 0.4,
            spread: 0.35,
        },
        attributes: &[("cpu", CPUS), ("cpu.mode", &[Str("user"), Str("system"), Str("idle")])],
    },
    MetricDef {
        name: "system.memory.usage",
        description: "Bytes of memory in use",
        unit: "By",
        kind: Kind::Gauge {
            base: 2.0e9,
            spread: 1.0e9,
        },
        attributes: &[
            (
                "system.memory.state",
                &[Str("used"), Str("free"), Str("cached"), Str("buffered")],
            ),
            ("host.swap", BOOLS),
        ],
    },
    MetricDef {
        name: "process.cpu.utilization",
        description: "Fraction of CPU used by the process",
        unit: "1",
        kind: Kind::Gauge {
            base: 0.2,
            spread: 0.15,
        },
        attributes: &[
            ("cpu.mode", &[Str("user"), Str("system")]),
            ("process.runtime.name", &[Str("main"), Str("gc")]),
        ],
    },
    MetricDef {
        name: "jvm.thread.count",
        description: "Number of executing platform threads",
        unit: "{thread}",
        kind: Kind::Gauge {
            base: 40.0,
            spread: 20.0,
        },
        attributes: &[
            ("jvm.thread.daemon", BOOLS),
            (
                "jvm.thread.state",
                &[Str("runnable"), Str("blocked"), Str("waiting"), Str("timed_waiting")],
            ),
        ],
    },
    MetricDef {
        name: "messaging.queue.depth",
        description: "Messages waiting in the queue",
        unit: "{message}",
        kind: Kind::Gauge {
            base: 120.0,
            spread: 100.0,
        },
        attributes: &[
            ("messaging.destination.name", TOPICS),
            ("messaging.system", &[Str("kafka"), Str("rabbitmq")]),
        ],
    },
    MetricDef {
        name: "http.server.request.count",
        description: "Number of HTTP requests served",
        unit: "{request}",
        kind: Kind::Counter { step: 50 },
        attributes: &[
            ("http.request.method", HTTP_METHODS),
            ("http.route", HTTP_ROUTES),
            ("http.response.status_code", HTTP_STATUS),
        ],
    },
    MetricDef {
        name: "http.server.errors",
        description: "Number of HTTP requests that failed",
        unit: "{request}",
        kind: Kind::Counter { step: 3 },
        attributes: &[
            ("http.route", HTTP_ROUTES),
            ("error.type", &[Str("timeout"), Str("500"), Str("connection_reset")]),
        ],
    },
    MetricDef {
        name: "db.client.operations",
        description: "Number of database operations",
        unit: "{operation}",
        kind: Kind::Counter { step: 80 },
        attributes: &[
            ("db.system", &[Str("postgresql"), Str("redis")]),
            ("db.operation.name", DB_OPS),
            ("db.collection.name", DB_TABLES),
        ],
    },
    MetricDef {
        name: "messaging.client.consumed.messages",
        description: "Number of messages consumed",
        unit: "{message}",
        kind: Kind::Counter { step: 200 },
        attributes: &[
            ("messaging.destination.name", TOPICS),
            ("messaging.consumer.group.name", &[Str("billing"), Str("fulfilment")]),
            ("messaging.destination.partition.id", &[Str("0"), Str("1"), Str("2")]),
        ],
    },
    MetricDef {
        name: "system.network.io",
        description: "Bytes transmitted and received",
        unit: "By",
        kind: Kind::Counter { step: 1_000_000 },
        attributes: &[
            ("network.io.direction", DIRECTIONS),
            ("network.interface.name", DEVICES),
        ],
    },
    MetricDef {
        name: "system.disk.io",
        description: "Disk bytes transferred",
        unit: "By",
        kind: Kind::Counter { step: 4_000_000 },
        attributes: &[
            ("disk.io.direction", &[Str("read"), Str("write")]),
            ("system.device", &[Str("nvme0n1"), Str("nvme1n1"), Str("xvda")]),
        ],
    },
    MetricDef {
        name: "cache.requests",
        description: "Cache lookups",
        unit: "{request}",
        kind: Kind::Counter { step: 500 },
        attributes: &[
            ("cache.name", &[Str("sessions"), Str("products"), Str("carts")]),
            ("cache.hit", BOOLS),
            ("cache.tier", &[Int(1), Int(2)]),
        ],
    },
    MetricDef {
        name: "http.server.request.duration",
        description: "Duration of HTTP server requests",
        unit: "ms",
        kind: Kind::Histogram { scale: 4.0 },
        attributes: &[
            ("http.request.method", HTTP_METHODS),
            ("http.route", HTTP_ROUTES),
            ("http.response.status_code", HTTP_STATUS),
        ],
    },
    MetricDef {
        name: "http.client.request.duration",
        description: "Duration of HTTP client requests",
        unit: "ms",
        kind: Kind::Histogram { scale: 8.0 },
        attributes: &[
            ("http.request.method", HTTP_METHODS),
            ("server.address", &[Str("inventory"), Str("payment"), Str("shipping")]),
        ],
    },
    MetricDef {
        name: "db.client.operation.duration",
        description: "Duration of database client operations",
        unit: "ms",
        kind: Kind::Histogram { scale: 1.0 },
        attributes: &[("db.operation.name", DB_OPS), ("db.collection.name", DB_TABLES)],
    },
    MetricDef {
        name: "rpc.server.duration",
        description: "Duration of inbound RPCs",
        unit: "ms",
        kind: Kind::Histogram { scale: 2.0 },
        attributes: &[
            ("rpc.system", &[Str("grpc")]),
            ("rpc.service", &[Str("CartService"), Str("CheckoutService")]),
            ("rpc.method", &[Str("Get"), Str("Add"), Str("Empty")]),
            ("rpc.grpc.status_code", &[Int(0), Int(14)]),
        ],
    },
    MetricDef {
        name: "http.server.request.body.size",
        description: "Size of HTTP request bodies",
        unit: "By",
        kind: Kind::ExpHistogram { scale: 200.0 },
        attributes: &[("http.request.method", HTTP_METHODS), ("http.route", HTTP_ROUTES)],
    },
    MetricDef {
        name: "messaging.process.duration",
        description: "Duration of message processing",
        unit: "ms",
        kind: Kind::ExpHistogram { scale: 3.0 },
        attributes: &[
            ("messaging.destination.name", TOPICS),
            ("messaging.system", &[Str("kafka")]),
            ("error", BOOLS),
        ],
    },
    MetricDef {
        name: "jvm.gc.pause",
        description: "Garbage collection pause times",
        unit: "ms",
        kind: Kind::Summary { scale: 5.0 },
        attributes: &[
            ("jvm.gc.name", &[Str("G1 Young Generation"), Str("G1 Old Generation")]),
            ("jvm.gc.action", &[Str("end of minor GC"), Str("end of major GC")]),
        ],
    },
    MetricDef {
        name: "legacy.request.latency",
        description: "Request latency quantiles from a Prometheus summary",
        unit: "ms",
        kind: Kind::Summary { scale: 10.0 },
        attributes: &[
            ("handler", &[Str("/metrics"), Str("/api"), Str("/admin")]),
            ("instance.shard", &[Int(0), Int(1)]),
        ],
    },
];

#[derive(Debug)]
struct Series {
    resource: usize,
    def: usize,
    attributes: Vec<KeyValue>,
    state: State,
}

/// A series' running state, with its metric kind's parameters.
#[derive(Debug)]
enum State {
    Gauge {
        value: f64,
        base: f64,
        spread: f64,
    },
    Counter {
        value: i64,
        step: u64,
    },
    Histogram {
        obs: Observations,
        counts: Vec<u64>,
        scale: f64,
    },
    ExpHistogram {
        obs: Observations,
        buckets: ExpBuckets,
        scale: f64,
    },
    Summary {
        obs: Observations,
        scale: f64,
    },
}

/// Cumulative count, sum, min and max of a series' observations.
#[derive(Debug, Default)]
struct Observations {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Observations {
    fn add(&mut self, v: f64) {
        if self.count == 0 {
            self.min = v;
            self.max = v;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.count += 1;
        self.sum += v;
    }
}

/// Cumulative positive buckets of an exponential histogram at [`EXP_SCALE`].
#[derive(Debug, Default)]
struct ExpBuckets {
    offset: i32,
    counts: Vec<u64>,
}

impl ExpBuckets {
    fn add(&mut self, v: f64) {
        // Bucket `i` holds (base^i, base^(i+1)] with base = 2^(2^-scale).
        let index = (v.log2() * f64::from(1 << EXP_SCALE)).ceil() as i32 - 1;
        if self.counts.is_empty() {
            self.offset = index;
        } else if index < self.offset {
            let grow = (self.offset - index) as usize;
            self.counts.splice(0..0, std::iter::repeat_n(0, grow));
            self.offset = index;
        }
        let at = (index - self.offset) as usize;
        if at >= self.counts.len() {
            self.counts.resize(at + 1, 0);
        }
        self.counts[at] += 1;
    }
}

fn build_series(n_resources: usize, per_metric: usize) -> Vec<Series> {
    let mut series = Vec::new();
    for resource in 0..n_resources {
        for (def, m) in METRICS.iter().enumerate() {
            for c in 0..per_metric.min(m.combinations()) {
                let state = match m.kind {
                    Kind::Gauge { base, spread } => State::Gauge {
                        value: base,
                        base,
                        spread,
                    },
                    Kind::Counter { step } => State::Counter { value: 0, step },
                    Kind::Histogram { scale } => State::Histogram {
                        obs: Observations::default(),
                        counts: vec![0; HISTOGRAM_BOUNDS.len() + 1],
                        scale,
                    },
                    Kind::ExpHistogram { scale } => State::ExpHistogram {
                        obs: Observations::default(),
                        buckets: ExpBuckets::default(),
                        scale,
                    },
                    Kind::Summary { scale } => State::Summary {
                        obs: Observations::default(),
                        scale,
                    },
                };
                series.push(Series {
                    resource,
                    def,
                    attributes: m.attributes(c),
                    state,
                });
            }
        }
    }
    series
}

/// One data point of any type.
#[derive(Debug)]
enum Point {
    Number(NumberDataPoint),
    Histogram(HistogramDataPoint),
    ExpHistogram(ExponentialHistogramDataPoint),
    Summary(SummaryDataPoint),
}

impl Point {
    fn number(self) -> Option<NumberDataPoint> {
        match self {
            Point::Number(p) => Some(p),
            _ => None,
        }
    }

    fn histogram(self) -> Option<HistogramDataPoint> {
        match self {
            Point::Histogram(p) => Some(p),
            _ => None,
        }
    }

    fn exp_histogram(self) -> Option<ExponentialHistogramDataPoint> {
        match self {
            Point::ExpHistogram(p) => Some(p),
            _ => None,
        }
    }

    fn summary(self) -> Option<SummaryDataPoint> {
        match self {
            Point::Summary(p) => Some(p),
            _ => None,
        }
    }
}

/// An observation in `[scale, 20 * scale)`, skewed towards the low end like a latency.
fn observation(rng: &mut Rng, scale: f64) -> f64 {
    let u = rng.unit();
    let v = scale * (1.0 + 19.0 * u * u * u);
    // Keep three decimals so values read like measurements.
    (v * 1000.0).round() / 1000.0
}

impl Series {
    /// Advances the series by one scrape and returns its point at `time`.
    fn observe(&mut self, rng: &mut Rng, time: u64) -> Point {
        let attributes = self.attributes.clone();
        match &mut self.state {
            State::Gauge { value, base, spread } => {
                let (base, spread) = (*base, *spread);
                let step = spread * 0.2 * (rng.unit() * 2.0 - 1.0);
                *value = (*value + step).clamp((base - spread).max(0.0), base + spread);
                Point::Number(NumberDataPoint {
                    attributes,
                    start_time_unix_nano: 0,
                    time_unix_nano: time,
                    exemplars: Vec::new(),
                    flags: 0,
                    value: Some(number_data_point::Value::AsDouble(*value)),
                })
            }
            State::Counter { value, step } => {
                *value += rng.range(1, *step) as i64;
                Point::Number(NumberDataPoint {
                    attributes,
                    start_time_unix_nano: BASE_TIME_UNIX_NANO,
                    time_unix_nano: time,
                    exemplars: Vec::new(),
                    flags: 0,
                    value: Some(number_data_point::Value::AsInt(*value)),
                })
            }
            State::Histogram { obs, counts, scale } => {
                let scale = *scale;
                let mut last = scale;
                for _ in 0..rng.range(1, 20) {
                    last = observation(rng, scale);
                    obs.add(last);
                    counts[HISTOGRAM_BOUNDS.partition_point(|b| *b < last)] += 1;
                }
                let exemplars = if rng.chance(0.1) {
                    vec![Exemplar {
                        filtered_attributes: Vec::new(),
                        time_unix_nano: time - rng.range(0, SCRAPE_INTERVAL_NANOS - 1),
                        span_id: rng.bytes(8),
                        trace_id: rng.bytes(16),
                        value: Some(exemplar::Value::AsDouble(last)),
                    }]
                } else {
                    Vec::new()
                };
                Point::Histogram(HistogramDataPoint {
                    attributes,
                    start_time_unix_nano: BASE_TIME_UNIX_NANO,
                    time_unix_nano: time,
                    count: obs.count,
                    sum: Some(obs.sum),
                    bucket_counts: counts.clone(),
                    explicit_bounds: HISTOGRAM_BOUNDS.to_vec(),
                    exemplars,
                    flags: 0,
                    min: Some(obs.min),
                    max: Some(obs.max),
                })
            }
            State::ExpHistogram { obs, buckets, scale } => {
                let scale = *scale;
                for _ in 0..rng.range(1, 20) {
                    let v = observation(rng, scale);
                    obs.add(v);
                    buckets.add(v);
                }
                Point::ExpHistogram(ExponentialHistogramDataPoint {
                    attributes,
                    start_time_unix_nano: BASE_TIME_UNIX_NANO,
                    time_unix_nano: time,
                    count: obs.count,
                    sum: Some(obs.sum),
                    scale: EXP_SCALE,
                    zero_count: 0,
                    positive: Some(exponential_histogram_data_point::Buckets {
                        offset: buckets.offset,
                        bucket_counts: buckets.counts.clone(),
                    }),
                    negative: Some(exponential_histogram_data_point::Buckets::default()),
                    flags: 0,
                    exemplars: Vec::new(),
                    min: Some(obs.min),
                    max: Some(obs.max),
                    zero_threshold: 0.0,
                })
            }
            State::Summary { obs, scale } => {
                let scale = *scale;
                let mut recent: Vec<f64> = (0..rng.range(1, 20)).map(|_| observation(rng, scale)).collect();
                for v in &recent {
                    obs.add(*v);
                }
                recent.sort_by(f64::total_cmp);
                let quantile_values = [0.0, 0.5, 0.9, 0.99, 1.0]
                    .into_iter()
                    .map(|q| summary_data_point::ValueAtQuantile {
                        quantile: q,
                        value: recent[((recent.len() - 1) as f64 * q).round() as usize],
                    })
                    .collect();
                Point::Summary(SummaryDataPoint {
                    attributes,
                    start_time_unix_nano: BASE_TIME_UNIX_NANO,
                    time_unix_nano: time,
                    count: obs.count,
                    sum: obs.sum,
                    quantile_values,
                    flags: 0,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use std::collections::{HashMap, HashSet};

    fn bytes_of<M: Message>(m: &Option<M>) -> Vec<u8> {
        m.as_ref().map(Message::encode_to_vec).unwrap_or_default()
    }

    fn all_records(req: &ExportLogsServiceRequest) -> impl Iterator<Item = (&ResourceLogs, &LogRecord)> {
        req.resource_logs.iter().flat_map(|rl| {
            rl.scope_logs
                .iter()
                .flat_map(move |sl| sl.log_records.iter().map(move |r| (rl, r)))
        })
    }

    fn body(record: &LogRecord) -> &str {
        match record.body.as_ref().and_then(|b| b.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => s,
            other => panic!("corpus bodies are strings, got {other:?}"),
        }
    }

    #[test]
    fn templates_add_up() {
        for t in INFO_TEMPLATES.iter().chain(ERROR_TEMPLATES) {
            assert_eq!(t.text.matches("{}").count(), t.tokens.len(), "{}", t.text);
        }
        let distinct: usize = INFO_TEMPLATES
            .iter()
            .chain(ERROR_TEMPLATES)
            .map(Template::distinct)
            .sum();
        assert_eq!(distinct, LOW_DISTINCT_BODIES);
    }

    #[test]
    fn same_seed_same_output() {
        let mut a = Corpus::new(42, Cardinality::Low);
        let mut b = Corpus::new(42, Cardinality::Low);
        assert_eq!(a.logs(1_000).encode_to_vec(), b.logs(1_000).encode_to_vec());
        assert_eq!(a.traces(500).encode_to_vec(), b.traces(500).encode_to_vec());
        assert_eq!(a.metrics(2_000).encode_to_vec(), b.metrics(2_000).encode_to_vec());
        assert_eq!(a.logs(10).encode_to_vec(), b.logs(10).encode_to_vec());

        let mut c = Corpus::new(43, Cardinality::Low);
        let mut d = Corpus::new(42, Cardinality::Low);
        assert_ne!(c.logs(1_000), d.logs(1_000));
        assert_ne!(c.traces(500), d.traces(500));
        assert_ne!(c.metrics(2_000), d.metrics(2_000));
    }

    #[test]
    fn successive_calls_continue_the_stream() {
        let mut corpus = Corpus::new(1, Cardinality::Low);
        let first = corpus.logs(1_000);
        let second = corpus.logs(1_000);
        let last_of_first = all_records(&first).map(|(_, r)| r.time_unix_nano).max();
        let first_of_second = all_records(&second).map(|(_, r)| r.time_unix_nano).min();
        assert!(last_of_first < first_of_second);
        assert!(all_records(&first).all(|(_, r)| r.time_unix_nano >= BASE_TIME_UNIX_NANO));
        assert!(
            all_records(&second).all(|(_, r)| r.observed_time_unix_nano > r.time_unix_nano
                && r.observed_time_unix_nano - r.time_unix_nano <= 8_000)
        );
        // About 1 µs apart.
        let spread = all_records(&first)
            .map(|(_, r)| r.time_unix_nano)
            .max()
            .unwrap_or_default()
            - BASE_TIME_UNIX_NANO;
        assert!((500_000..1_500_000).contains(&spread), "{spread}");
    }

    #[test]
    fn low_cardinality_shape() {
        let mut corpus = Corpus::new(9, Cardinality::Low);
        let mut resources = HashSet::new();
        let mut bodies = HashSet::new();
        let (mut info, mut error, mut with_trace, mut total) = (0, 0, 0, 0);
        for _ in 0..10 {
            let req = corpus.logs(10_000);
            // One resource group per resource, one scope group each.
            let distinct: HashSet<_> = req.resource_logs.iter().map(|rl| bytes_of(&rl.resource)).collect();
            assert_eq!(distinct.len(), req.resource_logs.len());
            for rl in &req.resource_logs {
                assert_eq!(rl.scope_logs.len(), 1);
                assert_eq!(
                    rl.scope_logs[0].scope.as_ref().map(|s| s.name.as_str()),
                    Some(SCOPE_NAME)
                );
                assert_eq!(rl.schema_url, RESOURCE_SCHEMA_URL);
            }
            for (rl, record) in all_records(&req) {
                total += 1;
                resources.insert(bytes_of(&rl.resource));
                bodies.insert(body(record).to_owned());
                match (record.severity_number, record.severity_text.as_str()) {
                    (9, "INFO") => info += 1,
                    (17, "ERROR") => error += 1,
                    other => panic!("unexpected severity {other:?}"),
                }
                assert!((3..=6).contains(&record.attributes.len()));
                match (record.trace_id.len(), record.span_id.len()) {
                    (16, 8) => with_trace += 1,
                    (0, 0) => {}
                    other => panic!("unexpected id lengths {other:?}"),
                }
            }
        }
        assert_eq!(total, 100_000);
        assert_eq!(resources.len(), 16);
        assert!(bodies.len() <= 100);
        assert_eq!(bodies.len(), LOW_DISTINCT_BODIES);
        assert!(info > 8 * error, "info {info}, error {error}");
        assert!((45_000..55_000).contains(&with_trace), "{with_trace}");
    }

    #[test]
    fn high_cardinality_shape() {
        let mut corpus = Corpus::new(9, Cardinality::High);
        let req = corpus.logs(20_000);
        let resources: HashSet<_> = all_records(&req).map(|(rl, _)| bytes_of(&rl.resource)).collect();
        assert_eq!(resources.len(), 50);
        let bodies: HashSet<_> = all_records(&req).map(|(_, r)| body(r)).collect();
        assert!(bodies.len() > 18_000, "{}", bodies.len());
        let ids: HashSet<_> = all_records(&req)
            .filter_map(|(_, r)| r.attributes.iter().find(|kv| kv.key == "request.id"))
            .map(|kv| bytes_of(&kv.value))
            .collect();
        assert_eq!(ids.len(), 20_000);
    }

    #[test]
    fn traces_have_structure() {
        let mut corpus = Corpus::new(5, Cardinality::Low);
        let req = corpus.traces(5_000);
        let spans: Vec<&Span> = req
            .resource_spans
            .iter()
            .flat_map(|rs| rs.scope_spans.iter().flat_map(|ss| ss.spans.iter()))
            .collect();
        assert_eq!(spans.len(), 5_000);
        let by_id: HashMap<&[u8], &Span> = spans.iter().map(|s| (s.span_id.as_slice(), *s)).collect();
        let mut per_trace: HashMap<&[u8], (usize, usize)> = HashMap::new();
        for s in &spans {
            assert_eq!((s.trace_id.len(), s.span_id.len()), (16, 8));
            assert!(s.start_time_unix_nano <= s.end_time_unix_nano);
            let entry = per_trace.entry(s.trace_id.as_slice()).or_default();
            entry.0 += 1;
            if s.parent_span_id.is_empty() {
                entry.1 += 1;
            } else {
                let parent = by_id[s.parent_span_id.as_slice()];
                assert_eq!(parent.trace_id, s.trace_id);
                assert!(parent.start_time_unix_nano <= s.start_time_unix_nano);
                assert!(s.end_time_unix_nano <= parent.end_time_unix_nano);
            }
            assert!(s.links.iter().all(|l| l.trace_id.len() == 16 && l.span_id.len() == 8));
            assert!(s.events.len() <= 2);
            assert!(s.links.len() <= 1);
        }
        let short = per_trace.values().filter(|(n, _)| !(3..=10).contains(n)).count();
        assert!(short <= 1, "only the last trace may be cut short");
        assert!(per_trace.values().all(|(_, roots)| *roots == 1));
        assert!(spans.iter().any(|s| !s.events.is_empty()));
        assert!(spans.iter().any(|s| !s.links.is_empty()));
        assert!(spans.iter().any(|s| s.status.as_ref().is_some_and(|st| st.code == 2)));
    }

    /// Key of a series: resource, metric name and point attributes, as bytes.
    type SeriesKey = (Vec<u8>, String, Vec<u8>);

    fn key(rm: &ResourceMetrics, m: &Metric, attributes: &[KeyValue]) -> SeriesKey {
        let attrs = attributes.iter().flat_map(|kv| kv.encode_to_vec()).collect();
        (bytes_of(&rm.resource), m.name.clone(), attrs)
    }

    #[test]
    fn metric_series_repeat_and_counters_grow() {
        let mut corpus = Corpus::new(11, Cardinality::Low);
        let n_series = corpus.series_count();
        assert!(n_series >= 16 * 20 * 2);
        let mut counters: HashMap<SeriesKey, Vec<(u64, i64)>> = HashMap::new();
        let mut histograms: HashMap<SeriesKey, Vec<(u64, u64, Vec<u64>)>> = HashMap::new();
        let mut names = HashSet::new();
        let mut kinds = HashSet::new();
        for _ in 0..5 {
            let req = corpus.metrics(n_series);
            for rm in &req.resource_metrics {
                for m in &rm.scope_metrics[0].metrics {
                    names.insert(m.name.clone());
                    match &m.data {
                        Some(metric::Data::Sum(s)) => {
                            kinds.insert("sum");
                            assert!(s.is_monotonic);
                            assert_eq!(s.aggregation_temporality, AggregationTemporality::Cumulative as i32);
                            for p in &s.data_points {
                                let Some(number_data_point::Value::AsInt(v)) = p.value else {
                                    panic!("counters are ints")
                                };
                                counters
                                    .entry(key(rm, m, &p.attributes))
                                    .or_default()
                                    .push((p.time_unix_nano, v));
                            }
                        }
                        Some(metric::Data::Histogram(h)) => {
                            kinds.insert("histogram");
                            for p in &h.data_points {
                                assert_eq!(p.bucket_counts.iter().sum::<u64>(), p.count);
                                assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
                                histograms.entry(key(rm, m, &p.attributes)).or_default().push((
                                    p.time_unix_nano,
                                    p.count,
                                    p.bucket_counts.clone(),
                                ));
                            }
                        }
                        Some(metric::Data::ExponentialHistogram(h)) => {
                            kinds.insert("exp");
                            for p in &h.data_points {
                                let positive = p.positive.as_ref().map_or(0, |b| b.bucket_counts.iter().sum::<u64>());
                                assert_eq!(positive + p.zero_count, p.count);
                                let (Some(min), Some(max)) = (p.min, p.max) else {
                                    panic!("min and max are set")
                                };
                                let b = p.positive.as_ref().expect("positive buckets are set");
                                let index = |v: f64| (v.log2() * f64::from(1 << p.scale)).ceil() as i32 - 1;
                                assert_eq!(b.offset, index(min));
                                assert_eq!(b.offset + b.bucket_counts.len() as i32 - 1, index(max));
                            }
                        }
                        Some(metric::Data::Summary(s)) => {
                            kinds.insert("summary");
                            for p in &s.data_points {
                                assert_eq!(p.quantile_values.len(), 5);
                                assert!(p.quantile_values.windows(2).all(|w| w[0].value <= w[1].value));
                            }
                        }
                        Some(metric::Data::Gauge(g)) => {
                            kinds.insert("gauge");
                            assert!(
                                g.data_points
                                    .iter()
                                    .all(|p| matches!(p.value, Some(number_data_point::Value::AsDouble(_))))
                            );
                        }
                        None => panic!("every corpus metric has data"),
                    }
                }
            }
        }
        assert_eq!(names.len(), METRICS.len());
        assert_eq!(kinds.len(), 5);
        assert!(!counters.is_empty());
        for (series, points) in &counters {
            assert_eq!(points.len(), 5, "{series:?}");
            assert!(
                points.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1),
                "{series:?}: {points:?}"
            );
        }
        for (series, points) in &histograms {
            assert_eq!(points.len(), 5, "{series:?}");
            for w in points.windows(2) {
                assert!(w[0].0 < w[1].0 && w[0].1 < w[1].1);
                assert!(w[0].2.iter().zip(&w[1].2).all(|(a, b)| a <= b));
            }
        }
    }

    #[test]
    fn high_cardinality_metrics_use_fifty_resources() {
        let mut corpus = Corpus::new(11, Cardinality::High);
        let n_series = corpus.series_count();
        let req = corpus.metrics(n_series);
        assert_eq!(req.resource_metrics.len(), 50);
    }
}
