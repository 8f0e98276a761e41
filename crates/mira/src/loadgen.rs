//! `mira loadgen`: a load generator over OTLP (gRPC or HTTP), Prometheus
//! remote write 1.0 (the corpus' gauge and sum points, one sample each)
//! and Loki push (the corpus' logs), all snappy-compressed as Prometheus
//! and the Loki agents send them. Requests are built from the testkit
//! corpus and encoded once up front, so the generator spends its CPU on
//! sending. With `--acked-file`, each request also carries one
//! marker record (`loadgen-<n>`, appended as an extra ResourceLogs /
//! ResourceSpans / ResourceMetrics entry, which protobuf merges) and the
//! numbers of acknowledged requests are written to the file, so a test can
//! check that every acknowledged request was stored exactly once.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use clap::{Args, ValueEnum};
use mira_testkit::corpus::{Cardinality, Corpus};
use mira_testkit::push;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    Grpc,
    Http,
    /// `POST /api/v1/write`, remote write 1.0; metrics only.
    RemoteWrite,
    /// `POST /loki/api/v1/push`, protobuf; logs only.
    LokiPush,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SignalArg {
    Logs,
    Traces,
    Metrics,
}

/// Flags of `mira loadgen`.
#[derive(Debug, Args)]
pub struct LoadgenArgs {
    /// host:port of the ingester's port for --protocol: OTLP gRPC for
    /// grpc, its HTTP port (4318) for the others.
    #[arg(long, env = "MIRA_LOADGEN_TARGET", default_value = "127.0.0.1:4317")]
    pub target: String,
    #[arg(long, value_enum, default_value = "grpc")]
    pub protocol: Protocol,
    #[arg(long, value_enum, default_value = "logs")]
    pub signal: SignalArg,
    /// Concurrent connections.
    #[arg(long, default_value_t = 4)]
    pub conns: usize,
    /// Records per request (points drawn, for metrics: with
    /// --numbers-only or remote write, the histograms among them are left
    /// out).
    #[arg(long, default_value_t = 8192)]
    pub batch: usize,
    /// Metrics: send only the gauge and sum points, the ones remote write
    /// carries as one sample each (an OTLP baseline of the same data).
    #[arg(long)]
    pub numbers_only: bool,
    /// How long to run, seconds.
    #[arg(long = "for", default_value_t = 10)]
    pub duration_s: u64,
    /// Requests per second over all connections; 0 = as fast as acknowledged.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Tenant (X-Scope-OrgID).
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// A bearer token sent with every request (an ingester with `--auth tokens`).
    #[arg(long, env = "MIRA_LOADGEN_TOKEN")]
    pub token: Option<String>,
    /// High-cardinality corpus (unique ids, more resources).
    #[arg(long)]
    pub high_cardinality: bool,
    /// Write the numbers of acknowledged requests here (one per line) and
    /// mark each request with a `loadgen-<n>` record.
    #[arg(long)]
    pub acked_file: Option<std::path::PathBuf>,
    /// Distinct requests encoded before sending, reused round robin (send
    /// fewer than this for a corpus without repeats, e.g. to measure bytes
    /// stored per wire byte).
    #[arg(long, default_value_t = 16)]
    pub pool: usize,
    /// Record times this long before now (a past hour, e.g. for the
    /// compactor's cold rewrite); within the ingester's --max-past.
    #[arg(long, default_value = "1m")]
    pub past: mira_common::config::Duration,
}

/// A pre-encoded request and the records it carries.
struct Pooled {
    body: Bytes,
    records: u64,
}

/// Pre-encoded requests (distinct corpus slices, reused round robin).
fn encode_pool(args: &LoadgenArgs) -> Vec<Pooled> {
    let card = if args.high_cardinality {
        Cardinality::High
    } else {
        Cardinality::Low
    };
    // Times before now (a minute by default): an ingester refuses records
    // far from its clock.
    let past = u64::try_from(args.past.get().as_nanos()).unwrap_or(u64::MAX);
    let mut corpus = Corpus::starting_at(42, card, now_ns().saturating_sub(past));
    // Metrics advance a scrape interval each time the series come round,
    // so the pool starts early enough to end `past` before now (an
    // ingester refuses points past its --max-future).
    if args.signal == SignalArg::Metrics || args.protocol == Protocol::RemoteWrite {
        let rounds = (args.pool.max(1) * args.batch).div_ceil(corpus.series_count().max(1)) as u64 + 1;
        let span = rounds.saturating_mul(mira_testkit::corpus::SCRAPE_INTERVAL_NANOS);
        corpus = Corpus::starting_at(42, card, now_ns().saturating_sub(past).saturating_sub(span));
    }
    let snappy = |b: Vec<u8>| snap::raw::Encoder::new().compress_vec(&b).unwrap_or_default();
    let whole = args.batch as u64;
    (0..args.pool.max(1))
        .map(|_| {
            let (body, records) = match (args.protocol, args.signal) {
                (Protocol::RemoteWrite, _) => {
                    let (req, n) = push::numbers_only(&corpus.metrics(args.batch));
                    (snappy(push::remote_write(&req).encode_to_vec()), n as u64)
                }
                (Protocol::LokiPush, _) => (snappy(push::loki_push(&corpus.logs(args.batch)).encode_to_vec()), whole),
                (_, SignalArg::Logs) => (corpus.logs(args.batch).encode_to_vec(), whole),
                (_, SignalArg::Traces) => (corpus.traces(args.batch).encode_to_vec(), whole),
                (_, SignalArg::Metrics) if args.numbers_only => {
                    let (req, n) = push::numbers_only(&corpus.metrics(args.batch));
                    (req.encode_to_vec(), n as u64)
                }
                (_, SignalArg::Metrics) => (corpus.metrics(args.batch).encode_to_vec(), whole),
            };
            Pooled {
                body: Bytes::from(body),
                records,
            }
        })
        .collect()
}

/// Record timestamps: the process clock (what the ingester's time window
/// is measured against).
fn now_ns() -> u64 {
    static CLOCK: std::sync::LazyLock<mira_common::clock::Clock> =
        std::sync::LazyLock::new(mira_common::clock::Clock::system);
    u64::try_from(CLOCK.now_ns()).unwrap_or(0)
}

fn marker_value(n: u64) -> Option<AnyValue> {
    Some(AnyValue {
        value: Some(any_value::Value::StringValue(format!("loadgen-{n}"))),
    })
}

/// The extra top-level entry (field 1 of every Export*ServiceRequest)
/// carrying request `n`'s marker record.
fn marker(signal: SignalArg, n: u64) -> Vec<u8> {
    let inner = match signal {
        SignalArg::Logs => ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord {
                    time_unix_nano: now_ns(),
                    body: marker_value(n),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec(),
        SignalArg::Traces => ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id: n.to_be_bytes().repeat(2),
                    span_id: n.to_be_bytes().to_vec(),
                    name: format!("loadgen-{n}"),
                    start_time_unix_nano: now_ns(),
                    end_time_unix_nano: 2,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec(),
        SignalArg::Metrics => ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "loadgen_marker".into(),
                    data: Some(metric::Data::Gauge(Gauge {
                        data_points: vec![NumberDataPoint {
                            time_unix_nano: now_ns(),
                            value: Some(number_data_point::Value::AsInt(i64::try_from(n).unwrap_or(i64::MAX))),
                            attributes: vec![KeyValue {
                                key: "loadgen".into(),
                                value: marker_value(n),
                                ..Default::default()
                            }],
                            ..Default::default()
                        }],
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec(),
    };
    let mut out = Vec::with_capacity(inner.len() + 8);
    prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(inner.len() as u64, &mut out);
    out.extend_from_slice(&inner);
    out
}

fn path(signal: SignalArg, protocol: Protocol) -> &'static str {
    match (protocol, signal) {
        (Protocol::RemoteWrite, _) => "/api/v1/write",
        (Protocol::LokiPush, _) => "/loki/api/v1/push",
        (Protocol::Http, SignalArg::Logs) => "/v1/logs",
        (Protocol::Http, SignalArg::Traces) => "/v1/traces",
        (Protocol::Http, SignalArg::Metrics) => "/v1/metrics",
        (Protocol::Grpc, SignalArg::Logs) => mira_ingester::otlp::GRPC_LOGS,
        (Protocol::Grpc, SignalArg::Traces) => mira_ingester::otlp::GRPC_TRACES,
        (Protocol::Grpc, SignalArg::Metrics) => mira_ingester::otlp::GRPC_METRICS,
    }
}

/// A keep-alive HTTP/1.1 connection (the loadgen talks only to Mira).
struct HttpConn {
    stream: BufReader<tokio::net::TcpStream>,
}

impl HttpConn {
    async fn connect(addr: &str) -> std::io::Result<HttpConn> {
        let s = tokio::net::TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(HttpConn {
            stream: BufReader::new(s),
        })
    }

    /// The status and the answer's body.
    async fn post(&mut self, path: &str, headers: &[(&str, String)], body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: mira\r\n{extra}Content-Length: {}\r\n\r\n",
            body.len()
        );
        let s = self.stream.get_mut();
        s.write_all(head.as_bytes()).await?;
        s.write_all(body).await?;
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut len = 0usize;
        loop {
            line.clear();
            if self.stream.read_line(&mut line).await? == 0 || line == "\r\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut answer = vec![0u8; len];
        self.stream.read_exact(&mut answer).await?;
        Ok((status, answer))
    }
}

struct Totals {
    acked_requests: AtomicU64,
    acked_records: AtomicU64,
    acked_bytes: AtomicU64,
    failed: AtomicU64,
    latencies: std::sync::Mutex<Vec<Duration>>,
    acked_ids: std::sync::Mutex<Vec<u64>>,
}

pub async fn run(args: LoadgenArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.conns > 0 && args.batch > 0, "conns and batch must be positive");
    anyhow::ensure!(
        args.acked_file.is_none() || matches!(args.protocol, Protocol::Grpc | Protocol::Http),
        "--acked-file marks OTLP requests only"
    );
    let pool = Arc::new(encode_pool(&args));
    let totals = Arc::new(Totals {
        acked_requests: AtomicU64::new(0),
        acked_records: AtomicU64::new(0),
        acked_bytes: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        latencies: std::sync::Mutex::new(Vec::new()),
        acked_ids: std::sync::Mutex::new(Vec::new()),
    });
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(args.duration_s);
    let interval = (args.rate > 0).then(|| Duration::from_secs_f64(args.conns as f64 / args.rate as f64));
    let path = path(args.signal, args.protocol);
    let marked = args.acked_file.is_some();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for conn in 0..args.conns {
        let (pool, totals, next, stop) = (pool.clone(), totals.clone(), next.clone(), stop.clone());
        let offset = interval.map(|iv| iv.mul_f64(conn as f64 / args.conns as f64));
        let mut headers = vec![(mira_ingester::otlp::TENANT_HEADER, args.tenant.clone())];
        if args.protocol != Protocol::Grpc {
            headers.push(("content-type", "application/x-protobuf".to_owned()));
        }
        match args.protocol {
            Protocol::RemoteWrite => {
                headers.push(("content-encoding", "snappy".to_owned()));
                headers.push(("x-prometheus-remote-write-version", "0.1.0".to_owned()));
            }
            Protocol::LokiPush => headers.push(("content-encoding", "snappy".to_owned())),
            Protocol::Grpc | Protocol::Http => {}
        }
        if let Some(t) = &args.token {
            headers.push(("authorization", format!("Bearer {t}")));
        }
        let (target, protocol, signal) = (args.target.clone(), args.protocol, args.signal);
        tasks.push(tokio::spawn(async move {
            let mut grpc: Option<tonic::client::Grpc<tonic::transport::Channel>> = None;
            let mut http: Option<HttpConn> = None;
            // Paced connections start spread over one interval, so the
            // requests arrive evenly rather than `conns` at a time.
            if let Some(offset) = offset {
                tokio::time::sleep(offset).await;
            }
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let Pooled { body: base, records } = &pool[(n as usize) % pool.len()];
                let body = if marked {
                    let m = marker(signal, n);
                    let mut b = BytesMut::with_capacity(base.len() + m.len());
                    b.put_slice(base);
                    b.put_slice(&m);
                    b.freeze()
                } else {
                    base.clone()
                };
                let t = Instant::now();
                let ok = match protocol {
                    Protocol::Http | Protocol::RemoteWrite | Protocol::LokiPush => {
                        if http.is_none() {
                            http = HttpConn::connect(&target).await.ok();
                        }
                        match http.as_mut() {
                            Some(c) => match c.post(path, &headers, &body).await {
                                Ok((s, _)) if s == 200 || s == 204 => true,
                                Ok((s, answer)) => {
                                    // The first refusal is named, so a
                                    // run with failures says why.
                                    if totals.failed.load(Ordering::Relaxed) == 0 {
                                        eprintln!(
                                            "loadgen: {s} {}",
                                            String::from_utf8_lossy(&answer[..answer.len().min(300)])
                                        );
                                    }
                                    false
                                }
                                Err(_) => {
                                    http = None;
                                    false
                                }
                            },
                            None => false,
                        }
                    }
                    Protocol::Grpc => {
                        if grpc.is_none() {
                            grpc = tonic::transport::Endpoint::from_shared(format!("http://{target}"))
                                .ok()
                                .map(|e| tonic::client::Grpc::new(e.tcp_nodelay(true).connect_lazy()));
                        }
                        match grpc.as_mut() {
                            Some(g) => grpc_export(g, path, &headers, body.clone()).await,
                            None => false,
                        }
                    }
                };
                if ok {
                    totals.acked_requests.fetch_add(1, Ordering::Relaxed);
                    totals.acked_records.fetch_add(*records, Ordering::Relaxed);
                    totals.acked_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                    if let Ok(mut l) = totals.latencies.lock() {
                        l.push(t.elapsed());
                    }
                    if marked && let Ok(mut ids) = totals.acked_ids.lock() {
                        ids.push(n);
                    }
                } else {
                    totals.failed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if let Some(iv) = interval {
                    tokio::time::sleep(iv.saturating_sub(t.elapsed())).await;
                }
            }
        }));
    }
    tokio::select! {
        _ = futures::future::join_all(tasks) => {}
        () = crate::shutdown_signal() => { stop.store(true, Ordering::Relaxed); }
    }
    let secs = start.elapsed().as_secs_f64();
    let mut lat = totals.latencies.lock().map(|l| l.clone()).unwrap_or_default();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "acked {} requests, {} records, {} bytes in {secs:.1} s: {:.0} records/s, {:.1} MiB/s; ack latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {} failed attempts",
        totals.acked_requests.load(Ordering::Relaxed),
        totals.acked_records.load(Ordering::Relaxed),
        totals.acked_bytes.load(Ordering::Relaxed),
        totals.acked_records.load(Ordering::Relaxed) as f64 / secs,
        totals.acked_bytes.load(Ordering::Relaxed) as f64 / secs / 1048576.0,
        ms(pct(0.5)),
        ms(pct(0.99)),
        ms(lat.last().copied().unwrap_or_default()),
        totals.failed.load(Ordering::Relaxed),
    );
    if let Some(path) = &args.acked_file {
        let ids = totals.acked_ids.lock().map(|l| l.clone()).unwrap_or_default();
        let mut f = std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
        for id in ids {
            writeln!(f, "{id}")?;
        }
    }
    Ok(())
}

async fn grpc_export(
    g: &mut tonic::client::Grpc<tonic::transport::Channel>,
    path: &'static str,
    headers: &[(&'static str, String)],
    body: Bytes,
) -> bool {
    if g.ready().await.is_err() {
        return false;
    }
    let mut req = tonic::Request::new(body);
    for (k, v) in headers {
        if let Ok(v) = v.parse() {
            req.metadata_mut().insert(*k, v);
        }
    }
    g.unary(
        req,
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        mira_ingester::otlp::RawCodec,
    )
    .await
    .is_ok()
}
