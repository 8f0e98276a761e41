//! What an OTLP export request holds, counted straight from the protobuf
//! wire format without decoding or allocating: its records (log records,
//! spans, metric data points) and every other item that decoding
//! materialises (attributes at every level, nested attribute values, span
//! events and links, exemplars, quantiles, histogram buckets, resources and
//! scopes). The per-tenant records rate ([`mira_common::limits`]) is
//! charged the records, and the receivers bound a request's memory by the
//! [`Census::decoded_bytes`] estimate before anything is decoded, so a
//! request of millions of empty items is refused for what it would cost,
//! not for its wire size. Only the nesting is walked; every other field is
//! skipped by length. [`json_objects`] is the same bound for an OTLP/JSON
//! body before serde builds it.

use bytes::Buf;
use mira_core::ids::Signal;

/// Why a request could not be counted (it will not decode either).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// Deepest nesting of attribute values (arrays and key-value lists) a
/// request may hold: prost's own decode limit.
pub const MAX_VALUE_DEPTH: usize = 100;

/// What decoding one item costs at most, bytes: the views, the Arrow
/// builders' rows and their growth. Measured with `mira serve` (debug
/// build) as the peak memory of requests of a million empty items of each
/// kind: 456 B a span, 324 a log record, 355 a data point, 190 an
/// attribute (docs/security.md, "What one request can cost"); each rounded
/// up.
const SPAN_COST: u64 = 512;
const LOG_COST: u64 = 384;
const POINT_COST: u64 = 384;
const ATTRIBUTE_COST: u64 = 224;
/// Events, links, exemplars, quantiles, resources, scopes, nested values.
const OTHER_COST: u64 = 384;
/// One histogram bucket count or bound (a list entry, 8 bytes, twice).
const BUCKET_COST: u64 = 16;
/// The wire bytes themselves are held twice (the payload, kept for the
/// WAL and recent reads, and the strings copied into the builders).
const WIRE_FACTOR: u64 = 2;
/// One JSON object as a prost message, with its vector's growth.
const JSON_OBJECT_COST: u64 = 512;

/// The items of one export request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// Log records, spans or data points.
    pub records: u64,
    /// Attributes of records, spans, events, links, points, exemplars,
    /// resources and scopes, and metric metadata.
    pub attributes: u64,
    /// Events, links, exemplars, quantiles, resources, scopes and nested
    /// attribute values.
    pub others: u64,
    /// Histogram bucket counts and bounds.
    pub buckets: u64,
    /// The request's size on the wire (decompressed).
    pub bytes: u64,
}

impl Census {
    /// An upper estimate of the memory decoding the request takes.
    pub fn decoded_bytes(&self, signal: Signal) -> u64 {
        let record = match signal {
            Signal::Logs => LOG_COST,
            Signal::Traces => SPAN_COST,
            Signal::Metrics => POINT_COST,
        };
        self.records
            .saturating_mul(record)
            .saturating_add(self.attributes.saturating_mul(ATTRIBUTE_COST))
            .saturating_add(self.others.saturating_mul(OTHER_COST))
            .saturating_add(self.buckets.saturating_mul(BUCKET_COST))
            .saturating_add(self.bytes.saturating_mul(WIRE_FACTOR))
    }

    /// "N spans, M attributes, K other items" for error messages.
    pub fn describe(&self, signal: Signal) -> String {
        let what = match signal {
            Signal::Logs => "log records",
            Signal::Traces => "spans",
            Signal::Metrics => "data points",
        };
        format!(
            "{} {what}, {} attributes, {} other items, {} histogram buckets",
            self.records, self.attributes, self.others, self.buckets
        )
    }
}

const BAD: Malformed = Malformed("truncated or malformed protobuf");

/// Calls `f(field number, bytes)` for each length-delimited field of
/// `buf`, skipping the others.
fn each_message(mut buf: &[u8], mut f: impl FnMut(u32, &[u8]) -> Result<(), Malformed>) -> Result<(), Malformed> {
    while buf.has_remaining() {
        let key = prost::encoding::decode_varint(&mut buf).map_err(|_| BAD)?;
        let field = u32::try_from(key >> 3).map_err(|_| BAD)?;
        let skip = match key & 7 {
            0 => {
                prost::encoding::decode_varint(&mut buf).map_err(|_| BAD)?;
                0
            }
            1 => 8,
            5 => 4,
            2 => {
                let len =
                    usize::try_from(prost::encoding::decode_varint(&mut buf).map_err(|_| BAD)?).map_err(|_| BAD)?;
                let body = buf.get(..len).ok_or(BAD)?;
                f(field, body)?;
                len
            }
            _ => return Err(Malformed("unsupported protobuf wire type")),
        };
        if skip > buf.len() {
            return Err(BAD);
        }
        buf.advance(skip);
    }
    Ok(())
}

/// Counts the numbers of a repeated scalar field `field` of `buf`, packed
/// (`varint`: one per byte without a continuation bit; else 8-byte) or
/// not.
fn count_scalars(buf: &[u8], field: u32, varint: bool, n: &mut u64) -> Result<(), Malformed> {
    let mut rest = buf;
    while rest.has_remaining() {
        let key = prost::encoding::decode_varint(&mut rest).map_err(|_| BAD)?;
        let skip = match key & 7 {
            0 => {
                prost::encoding::decode_varint(&mut rest).map_err(|_| BAD)?;
                if key >> 3 == u64::from(field) {
                    *n += 1;
                }
                0
            }
            1 => {
                if key >> 3 == u64::from(field) {
                    *n += 1;
                }
                8
            }
            5 => 4,
            2 => {
                let len =
                    usize::try_from(prost::encoding::decode_varint(&mut rest).map_err(|_| BAD)?).map_err(|_| BAD)?;
                let body = rest.get(..len).ok_or(BAD)?;
                if key >> 3 == u64::from(field) {
                    *n += if varint {
                        body.iter().filter(|b| **b < 0x80).count() as u64
                    } else {
                        (body.len() / 8) as u64
                    };
                }
                len
            }
            _ => return Err(Malformed("unsupported protobuf wire type")),
        };
        if skip > rest.len() {
            return Err(BAD);
        }
        rest.advance(skip);
    }
    Ok(())
}

impl Census {
    /// A `KeyValue` list entry: one attribute, and its value's nested
    /// values.
    fn attribute(&mut self, kv: &[u8], depth: usize) -> Result<(), Malformed> {
        self.attributes += 1;
        each_message(kv, |f, value| if f == 2 { self.value(value, depth) } else { Ok(()) })
    }

    /// An `AnyValue`: arrays (5, `values` = 1) and key-value lists (6,
    /// `values` = 1) count each member.
    fn value(&mut self, value: &[u8], depth: usize) -> Result<(), Malformed> {
        each_message(value, |f, list| match f {
            5 | 6 => {
                let kv = f == 6;
                if depth >= MAX_VALUE_DEPTH {
                    return Err(Malformed("attribute values nested deeper than 100 levels"));
                }
                each_message(list, |f, member| {
                    if f != 1 {
                        return Ok(());
                    }
                    self.others += 1;
                    if kv {
                        self.attribute(member, depth + 1)
                    } else {
                        self.value(member, depth + 1)
                    }
                })
            }
            _ => Ok(()),
        })
    }

    /// The attributes (field `attrs`) of a message that has some.
    fn attributes_of(&mut self, message: &[u8], attrs: u32) -> Result<(), Malformed> {
        each_message(message, |f, kv| if f == attrs { self.attribute(kv, 0) } else { Ok(()) })
    }

    /// A `Resource` (attributes = 1) or `InstrumentationScope`
    /// (attributes = 3).
    fn context(&mut self, message: &[u8], attrs: u32) -> Result<(), Malformed> {
        self.others += 1;
        self.attributes_of(message, attrs)
    }

    /// `Resource*` / `Scope*` nesting shared by the three signals:
    /// resource = 1 and scopes = 2 in the first, scope = 1 and the items
    /// = 2 in the second; `item` counts each item.
    fn groups(
        &mut self,
        payload: &[u8],
        mut item: impl FnMut(&mut Census, &[u8]) -> Result<(), Malformed>,
    ) -> Result<(), Malformed> {
        each_message(payload, |f, resource| {
            if f != 1 {
                return Ok(());
            }
            each_message(resource, |f, scope| match f {
                1 => self.context(scope, 1),
                2 => each_message(scope, |f, body| match f {
                    1 => self.context(body, 3),
                    2 => item(self, body),
                    _ => Ok(()),
                }),
                _ => Ok(()),
            })
        })
    }

    fn log(&mut self, record: &[u8]) -> Result<(), Malformed> {
        self.records += 1;
        // attributes = 6, body = 5.
        each_message(record, |f, m| match f {
            6 => self.attribute(m, 0),
            5 => self.value(m, 0),
            _ => Ok(()),
        })
    }

    fn span(&mut self, span: &[u8]) -> Result<(), Malformed> {
        self.records += 1;
        // attributes = 9, events = 11 (attributes = 3), links = 13
        // (attributes = 4).
        each_message(span, |f, m| match f {
            9 => self.attribute(m, 0),
            11 => self.context(m, 3),
            13 => self.context(m, 4),
            _ => Ok(()),
        })
    }

    fn metric(&mut self, metric: &[u8]) -> Result<(), Malformed> {
        // gauge = 5, sum = 7, histogram = 9, exponential_histogram = 10,
        // summary = 11, each with data_points = 1; metadata = 12.
        each_message(metric, |f, data| match f {
            5 | 7 | 9 | 10 | 11 => each_message(data, |g, point| if g == 1 { self.point(f, point) } else { Ok(()) }),
            12 => self.attribute(data, 0),
            _ => Ok(()),
        })
    }

    fn point(&mut self, kind: u32, point: &[u8]) -> Result<(), Malformed> {
        self.records += 1;
        // (attributes, exemplars) per kind; exemplars' filtered_attributes = 7.
        let (attrs, exemplars) = match kind {
            5 | 7 => (7, 5),
            9 => (9, 8),
            10 => (1, 11),
            _ => (7, 0),
        };
        match kind {
            // bucket_counts = 6 (fixed64), explicit_bounds = 7 (double).
            9 => {
                count_scalars(point, 6, false, &mut self.buckets)?;
                count_scalars(point, 7, false, &mut self.buckets)?;
            }
            // positive = 8, negative = 9: Buckets.bucket_counts = 2 (varint).
            10 => each_message(point, |f, buckets| {
                if matches!(f, 8 | 9) {
                    count_scalars(buckets, 2, true, &mut self.buckets)
                } else {
                    Ok(())
                }
            })?,
            _ => {}
        }
        each_message(point, |f, m| {
            if f == attrs {
                self.attribute(m, 0)
            } else if f == exemplars {
                self.context(m, 7)
            } else if kind == 11 && f == 6 {
                // Summary quantile_values.
                self.others += 1;
                Ok(())
            } else {
                Ok(())
            }
        })
    }
}

/// The items of an OTLP protobuf export request of `signal`.
pub fn census(signal: Signal, payload: &[u8]) -> Result<Census, Malformed> {
    let mut c = Census {
        bytes: payload.len() as u64,
        ..Census::default()
    };
    match signal {
        Signal::Logs => c.groups(payload, Census::log)?,
        Signal::Traces => c.groups(payload, Census::span)?,
        // ScopeMetrics.metrics = 2.
        Signal::Metrics => c.groups(payload, Census::metric)?,
    }
    Ok(c)
}

/// The records in an OTLP protobuf export request of `signal`.
pub fn count(signal: Signal, payload: &[u8]) -> Result<u64, Malformed> {
    census(signal, payload).map(|c| c.records)
}

/// The JSON objects (`{`) of `body` outside strings: every OTLP/JSON
/// message is one, so this bounds the prost messages serde would build.
pub fn json_objects(body: &[u8]) -> u64 {
    let (mut n, mut i) = (0u64, 0usize);
    while let Some(at) = memchr::memchr2(b'{', b'"', &body[i..]) {
        let at = i + at;
        if body[at] == b'{' {
            n += 1;
            i = at + 1;
            continue;
        }
        // A string: skip to its closing quote, past escapes.
        let mut j = at + 1;
        loop {
            match memchr::memchr2(b'"', b'\\', &body[j..]) {
                None => return n,
                Some(k) if body[j + k] == b'\\' => j += k + 2,
                Some(k) => {
                    j += k + 1;
                    break;
                }
            }
            if j >= body.len() {
                return n;
            }
        }
        i = j;
    }
    n
}

/// An upper estimate of the memory serde takes to build an OTLP/JSON
/// body of `objects` objects and `len` bytes as prost messages.
pub fn json_decoded_bytes(objects: u64, len: usize) -> u64 {
    objects
        .saturating_mul(JSON_OBJECT_COST)
        .saturating_add((len as u64).saturating_mul(WIRE_FACTOR))
}

#[cfg(test)]
mod tests {
    use mira_testkit::corpus::{Cardinality, Corpus};
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{
        AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value,
    };
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::metrics::v1::{
        Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint, Metric,
        NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint,
        exponential_histogram_data_point, metric, summary_data_point,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span};
    use prost::Message;

    use super::*;

    fn log(body: &str) -> LogRecord {
        LogRecord {
            time_unix_nano: 1,
            body: Some(AnyValue {
                value: Some(any_value::Value::StringValue(body.to_owned())),
            }),
            attributes: vec![KeyValue {
                key: "k".to_owned(),
                value: None,
                ..KeyValue::default()
            }],
            ..LogRecord::default()
        }
    }

    #[test]
    fn counts_match_the_requests() {
        let logs = ExportLogsServiceRequest {
            resource_logs: vec![
                ResourceLogs {
                    scope_logs: vec![
                        ScopeLogs {
                            log_records: vec![log("a"), log("b")],
                            ..ScopeLogs::default()
                        },
                        ScopeLogs {
                            log_records: vec![log("c")],
                            ..ScopeLogs::default()
                        },
                    ],
                    ..ResourceLogs::default()
                },
                ResourceLogs {
                    scope_logs: vec![ScopeLogs {
                        log_records: vec![log("d"), log("e"), log("f")],
                        ..ScopeLogs::default()
                    }],
                    ..ResourceLogs::default()
                },
            ],
        };
        assert_eq!(count(Signal::Logs, &logs.encode_to_vec()), Ok(6));
        let spans = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span::default(); 4],
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        };
        assert_eq!(count(Signal::Traces, &spans.encode_to_vec()), Ok(4));
        let metric = |data| Metric {
            name: "m".to_owned(),
            data: Some(data),
            ..Metric::default()
        };
        let metrics = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![
                        metric(metric::Data::Gauge(Gauge {
                            data_points: vec![NumberDataPoint::default(); 3],
                        })),
                        metric(metric::Data::Sum(Sum {
                            data_points: vec![NumberDataPoint::default(); 2],
                            ..Sum::default()
                        })),
                        metric(metric::Data::Histogram(Histogram {
                            data_points: vec![HistogramDataPoint::default()],
                            ..Histogram::default()
                        })),
                    ],
                    ..ScopeMetrics::default()
                }],
                ..ResourceMetrics::default()
            }],
        };
        assert_eq!(count(Signal::Metrics, &metrics.encode_to_vec()), Ok(6));
        assert_eq!(count(Signal::Logs, &[]), Ok(0));
    }

    /// The reference: what a census must find, walked over prost's decode.
    fn walk_value(v: &AnyValue, c: &mut Census) {
        match &v.value {
            Some(any_value::Value::ArrayValue(a)) => {
                for m in &a.values {
                    c.others += 1;
                    walk_value(m, c);
                }
            }
            Some(any_value::Value::KvlistValue(l)) => {
                for kv in &l.values {
                    c.others += 1;
                    walk_attrs(std::slice::from_ref(kv), c);
                }
            }
            _ => {}
        }
    }

    fn walk_attrs(attrs: &[KeyValue], c: &mut Census) {
        for kv in attrs {
            c.attributes += 1;
            if let Some(v) = &kv.value {
                walk_value(v, c);
            }
        }
    }

    fn walk_context(attrs: &[KeyValue], c: &mut Census) {
        c.others += 1;
        walk_attrs(attrs, c);
    }

    fn expected_logs(r: &ExportLogsServiceRequest) -> Census {
        let mut c = Census {
            bytes: r.encoded_len() as u64,
            ..Census::default()
        };
        for rl in &r.resource_logs {
            if let Some(res) = &rl.resource {
                walk_context(&res.attributes, &mut c);
            }
            for sl in &rl.scope_logs {
                if let Some(s) = &sl.scope {
                    walk_context(&s.attributes, &mut c);
                }
                for l in &sl.log_records {
                    c.records += 1;
                    walk_attrs(&l.attributes, &mut c);
                    if let Some(b) = &l.body {
                        walk_value(b, &mut c);
                    }
                }
            }
        }
        c
    }

    fn expected_traces(r: &ExportTraceServiceRequest) -> Census {
        let mut c = Census {
            bytes: r.encoded_len() as u64,
            ..Census::default()
        };
        for rs in &r.resource_spans {
            if let Some(res) = &rs.resource {
                walk_context(&res.attributes, &mut c);
            }
            for ss in &rs.scope_spans {
                if let Some(s) = &ss.scope {
                    walk_context(&s.attributes, &mut c);
                }
                for sp in &ss.spans {
                    c.records += 1;
                    walk_attrs(&sp.attributes, &mut c);
                    for e in &sp.events {
                        walk_context(&e.attributes, &mut c);
                    }
                    for l in &sp.links {
                        walk_context(&l.attributes, &mut c);
                    }
                }
            }
        }
        c
    }

    fn expected_metrics(r: &ExportMetricsServiceRequest) -> Census {
        let mut c = Census {
            bytes: r.encoded_len() as u64,
            ..Census::default()
        };
        for rm in &r.resource_metrics {
            if let Some(res) = &rm.resource {
                walk_context(&res.attributes, &mut c);
            }
            for sm in &rm.scope_metrics {
                if let Some(s) = &sm.scope {
                    walk_context(&s.attributes, &mut c);
                }
                for m in &sm.metrics {
                    walk_attrs(&m.metadata, &mut c);
                    match &m.data {
                        Some(metric::Data::Gauge(g)) => number_points(&g.data_points, &mut c),
                        Some(metric::Data::Sum(s)) => number_points(&s.data_points, &mut c),
                        Some(metric::Data::Histogram(h)) => {
                            for p in &h.data_points {
                                c.records += 1;
                                c.buckets += (p.bucket_counts.len() + p.explicit_bounds.len()) as u64;
                                walk_attrs(&p.attributes, &mut c);
                                for e in &p.exemplars {
                                    walk_context(&e.filtered_attributes, &mut c);
                                }
                            }
                        }
                        Some(metric::Data::ExponentialHistogram(h)) => {
                            for p in &h.data_points {
                                c.records += 1;
                                for b in p.positive.iter().chain(p.negative.iter()) {
                                    c.buckets += b.bucket_counts.len() as u64;
                                }
                                walk_attrs(&p.attributes, &mut c);
                                for e in &p.exemplars {
                                    walk_context(&e.filtered_attributes, &mut c);
                                }
                            }
                        }
                        Some(metric::Data::Summary(s)) => {
                            for p in &s.data_points {
                                c.records += 1;
                                c.others += p.quantile_values.len() as u64;
                                walk_attrs(&p.attributes, &mut c);
                            }
                        }
                        None => {}
                    }
                }
            }
        }
        c
    }

    fn number_points(points: &[NumberDataPoint], c: &mut Census) {
        for p in points {
            c.records += 1;
            walk_attrs(&p.attributes, c);
            for e in &p.exemplars {
                walk_context(&e.filtered_attributes, c);
            }
        }
    }

    fn nested(depth: usize) -> AnyValue {
        let mut v = AnyValue {
            value: Some(any_value::Value::IntValue(1)),
        };
        for i in 0..depth {
            v = AnyValue {
                value: Some(if i % 2 == 0 {
                    any_value::Value::ArrayValue(ArrayValue {
                        values: vec![v, AnyValue::default()],
                    })
                } else {
                    any_value::Value::KvlistValue(KeyValueList {
                        values: vec![KeyValue {
                            key: "k".to_owned(),
                            value: Some(v),
                            ..KeyValue::default()
                        }],
                    })
                }),
            };
        }
        v
    }

    #[test]
    fn the_census_counts_every_item_decoding_materialises() {
        for cardinality in [Cardinality::Low, Cardinality::High] {
            let mut corpus = Corpus::new(7, cardinality);
            let logs = corpus.logs(500);
            assert_eq!(census(Signal::Logs, &logs.encode_to_vec()), Ok(expected_logs(&logs)));
            let traces = corpus.traces(500);
            let got = census(Signal::Traces, &traces.encode_to_vec()).expect("traces");
            assert_eq!(got, expected_traces(&traces));
            assert!(got.attributes > got.records, "{got:?}");
            let metrics = corpus.metrics(500);
            let got = census(Signal::Metrics, &metrics.encode_to_vec()).expect("metrics");
            assert_eq!(got, expected_metrics(&metrics));
            assert_eq!(got.records, 500);
        }
        // Nested values, events, links, exemplars, buckets and summaries.
        let mut l = log("x");
        l.body = Some(nested(20));
        l.attributes.push(KeyValue {
            key: "deep".to_owned(),
            value: Some(nested(30)),
            ..KeyValue::default()
        });
        let logs = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![l],
                    ..ScopeLogs::default()
                }],
                ..ResourceLogs::default()
            }],
        };
        let got = census(Signal::Logs, &logs.encode_to_vec()).expect("nested");
        assert_eq!(got, expected_logs(&logs));
        assert!(got.others >= 50, "{got:?}");
        let kv = |k: &str| KeyValue {
            key: k.to_owned(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue("v".to_owned())),
            }),
            ..KeyValue::default()
        };
        let span = Span {
            attributes: vec![kv("a"), kv("b")],
            events: vec![
                span::Event {
                    attributes: vec![kv("e")],
                    ..span::Event::default()
                };
                3
            ],
            links: vec![
                span::Link {
                    attributes: vec![kv("l"), kv("m")],
                    ..span::Link::default()
                };
                2
            ],
            ..Span::default()
        };
        let traces = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name")],
                    ..Resource::default()
                }),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        attributes: vec![kv("s")],
                        ..InstrumentationScope::default()
                    }),
                    spans: vec![span; 2],
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        };
        let got = census(Signal::Traces, &traces.encode_to_vec()).expect("spans");
        assert_eq!(got, expected_traces(&traces));
        assert_eq!(
            (got.records, got.attributes, got.others),
            (2, 2 + 2 * (2 + 3 + 4), 2 + 2 * 5)
        );
        let exemplar = Exemplar {
            filtered_attributes: vec![kv("x")],
            ..Exemplar::default()
        };
        let metric = |data| Metric {
            name: "m".to_owned(),
            metadata: vec![kv("meta")],
            data: Some(data),
            ..Metric::default()
        };
        let metrics = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![
                        metric(metric::Data::Gauge(Gauge {
                            data_points: vec![NumberDataPoint {
                                attributes: vec![kv("p")],
                                exemplars: vec![exemplar.clone(); 2],
                                ..NumberDataPoint::default()
                            }],
                        })),
                        metric(metric::Data::Histogram(Histogram {
                            data_points: vec![HistogramDataPoint {
                                bucket_counts: vec![1, 2, 300, 4],
                                explicit_bounds: vec![1.0, 2.0, 3.0],
                                exemplars: vec![exemplar],
                                ..HistogramDataPoint::default()
                            }],
                            ..Histogram::default()
                        })),
                        metric(metric::Data::ExponentialHistogram(ExponentialHistogram {
                            data_points: vec![ExponentialHistogramDataPoint {
                                positive: Some(exponential_histogram_data_point::Buckets {
                                    offset: 1,
                                    bucket_counts: vec![1, 200, 70_000],
                                }),
                                negative: Some(exponential_histogram_data_point::Buckets {
                                    offset: 0,
                                    bucket_counts: vec![5],
                                }),
                                ..ExponentialHistogramDataPoint::default()
                            }],
                            ..ExponentialHistogram::default()
                        })),
                        metric(metric::Data::Summary(Summary {
                            data_points: vec![SummaryDataPoint {
                                quantile_values: vec![summary_data_point::ValueAtQuantile::default(); 3],
                                ..SummaryDataPoint::default()
                            }],
                        })),
                    ],
                    ..ScopeMetrics::default()
                }],
                ..ResourceMetrics::default()
            }],
        };
        let got = census(Signal::Metrics, &metrics.encode_to_vec()).expect("metrics");
        assert_eq!(got, expected_metrics(&metrics));
        assert_eq!((got.records, got.buckets), (4, 7 + 4));
    }

    #[test]
    fn values_nested_past_the_limit_are_refused() {
        let request = |depth| {
            let mut l = log("x");
            l.body = Some(nested(depth));
            ExportLogsServiceRequest {
                resource_logs: vec![ResourceLogs {
                    scope_logs: vec![ScopeLogs {
                        log_records: vec![l],
                        ..ScopeLogs::default()
                    }],
                    ..ResourceLogs::default()
                }],
            }
            .encode_to_vec()
        };
        assert!(census(Signal::Logs, &request(MAX_VALUE_DEPTH)).is_ok());
        let err = census(Signal::Logs, &request(MAX_VALUE_DEPTH + 1)).expect_err("too deep");
        assert!(err.0.contains("nested deeper than 100"), "{err:?}");
        // 5,000 levels of arrays on the wire (prost could not even encode
        // them): refused at the limit, not walked to the bottom.
        let mut value: Vec<u8> = Vec::new();
        for _ in 0..5_000 {
            // ArrayValue { values = 1: value }, then AnyValue { array = 5 }.
            for field in [1u8, 5] {
                let mut outer = vec![field << 3 | 2];
                prost::encoding::encode_varint(value.len() as u64, &mut outer);
                outer.extend_from_slice(&value);
                value = outer;
            }
        }
        let wrap = |field: u8, inner: &[u8]| {
            let mut out = vec![field << 3 | 2];
            prost::encoding::encode_varint(inner.len() as u64, &mut out);
            out.extend_from_slice(inner);
            out
        };
        let request = wrap(1, &wrap(2, &wrap(2, &wrap(5, &value))));
        let err = census(Signal::Logs, &request).expect_err("too deep");
        assert!(err.0.contains("nested deeper"), "{err:?}");
    }

    #[test]
    fn a_million_empty_spans_are_priced_at_what_they_cost() {
        // Two bytes a span on the wire; about 456 bytes each once decoded.
        let mut scope = Vec::new();
        for _ in 0..1_000_000 {
            scope.extend([0x12, 0x00]);
        }
        let wrap = |field: u8, inner: Vec<u8>| {
            let mut out = vec![field << 3 | 2];
            prost::encoding::encode_varint(inner.len() as u64, &mut out);
            out.extend(inner);
            out
        };
        let request = wrap(1, wrap(2, scope));
        let c = census(Signal::Traces, &request).expect("spans");
        assert_eq!(c.records, 1_000_000);
        assert!(c.decoded_bytes(Signal::Traces) >= 456_000_000, "{c:?}");
        assert!(
            c.describe(Signal::Traces).starts_with("1000000 spans"),
            "{}",
            c.describe(Signal::Traces)
        );
    }

    #[test]
    fn json_objects_are_counted_outside_strings() {
        assert_eq!(json_objects(br#"{"a":[{},{}],"b":"{not{one}"}"#), 3);
        assert_eq!(json_objects(br#"{"a":"esc\\\"{","b":"\"{"}"#), 1);
        assert_eq!(json_objects(br#"{"unterminated":"{{{"#), 1);
        assert_eq!(json_objects(b""), 0);
        let body = format!(
            "{{\"resourceSpans\":[{{\"scopeSpans\":[{{\"spans\":[{}]}}]}}]}}",
            vec!["{}"; 1000].join(",")
        );
        assert_eq!(json_objects(body.as_bytes()), 1003);
        assert!(json_decoded_bytes(1003, body.len()) >= 1003 * 460);
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let good = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![log("a"); 3],
                    ..ScopeLogs::default()
                }],
                ..ResourceLogs::default()
            }],
        }
        .encode_to_vec();
        for cut in 1..good.len() {
            // Every prefix either counts (a prefix ending on a field
            // boundary) or is refused; none panics.
            let _ = count(Signal::Logs, &good[..cut]);
        }
        assert!(count(Signal::Logs, &good[..good.len() - 1]).is_err());
        assert!(count(Signal::Metrics, &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
        assert!(count(Signal::Traces, &[0x0b]).is_err(), "group wire type");
    }
}

/// Why a push parser (remote write, Loki push) stopped reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// The request is malformed or breaks a rule that refuses it whole:
    /// 400 with this message.
    Invalid(String),
    /// Its views would take more memory than the reading was given: they
    /// had come to `used` bytes when it stopped.
    OverBudget { used: usize },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Invalid(m) => f.write_str(m),
            ReadError::OverBudget { used } => write!(
                f,
                "the request's views passed {used} bytes, over the memory reserved for them"
            ),
        }
    }
}

impl From<String> for ReadError {
    fn from(m: String) -> Self {
        ReadError::Invalid(m)
    }
}

/// The memory a push parser's borrowed views (label pairs, samples,
/// entries, symbol references) take, counted as they are pushed, against
/// what the receiver reserved for them before reading: a request of
/// millions of empty labels or entries stops at the reservation instead
/// of allocating many times its wire size. A `Vec` that grows holds up to
/// three times its length while it moves, so the views may use a third of
/// the reservation.
#[derive(Debug)]
pub struct Meter {
    used: usize,
    budget: usize,
}

impl Meter {
    /// Memory the views take with their growth, bytes: three times what
    /// was counted.
    pub fn held(used: usize) -> u64 {
        3 * used as u64
    }

    /// Views within a third of `reserved` bytes.
    pub fn new(reserved: usize) -> Meter {
        Meter {
            used: 0,
            budget: reserved / 3,
        }
    }

    /// No bound (tests, and the fuzz targets' second reading).
    pub fn unlimited() -> Meter {
        Meter {
            used: 0,
            budget: usize::MAX,
        }
    }

    /// Bytes of views still within the budget.
    pub fn room(&self) -> usize {
        self.budget.saturating_sub(self.used)
    }

    /// Counts `n` more views of type `T`.
    pub fn take<T>(&mut self, n: usize) -> Result<(), ReadError> {
        self.used = self.used.saturating_add(n.saturating_mul(size_of::<T>()));
        if self.used > self.budget {
            Err(ReadError::OverBudget { used: self.used })
        } else {
            Ok(())
        }
    }
}
