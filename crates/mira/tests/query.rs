//! The querier in process behind a real catalog member and ingester: the
//! merge of published and recent data across seals (every acknowledged row
//! exactly once), pruning by trace-id Bloom filters seen in `stats`,
//! corrupted cache files and objects, and hostile queries.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mira_catalog::{CatalogClient, CatalogNode, ClientConfig, NodeConfig};
use mira_ingester::otlp::ReceiverConfig;
use mira_ingester::shard::SealPolicy;
use mira_ingester::{IngesterConfig, IngesterNode, PipelineConfig, WalMode};
use mira_querier::server::QuerierServer;
use mira_querier::{Querier, QuerierConfig};
use mira_testkit::net::free_addr;
use mira_testkit::store::TestStore;
use object_store::{ObjectStore, ObjectStoreExt};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Record times: ten minutes before this test process started, plus n ns
/// (the ingester refuses times far from its clock).
fn t0() -> u64 {
    mira_testkit::recent_base_time()
}

fn log_export(n: u64) -> Vec<u8> {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![str_kv("service.name", "svc")],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord {
                    time_unix_nano: t0() + n,
                    body: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(format!("r-{n}"))),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn str_kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        key_strindex: 0,
    }
}

/// One trace of three spans, id derived from `n`.
fn trace_export(n: u8) -> (Vec<u8>, String) {
    let trace_id = vec![n; 16];
    let spans = (0..3u8)
        .map(|i| Span {
            trace_id: trace_id.clone(),
            span_id: vec![n, i, 1, 1, 1, 1, 1, 1],
            parent_span_id: if i == 0 { vec![] } else { vec![n, 0, 1, 1, 1, 1, 1, 1] },
            name: format!("op-{i}"),
            start_time_unix_nano: t0() + u64::from(n) * 1000 + u64::from(i),
            end_time_unix_nano: t0() + u64::from(n) * 1000 + 500,
            ..Default::default()
        })
        .collect();
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![str_kv("service.name", "checkout")],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    (req.encode_to_vec(), format!("{n:02x}").repeat(16))
}

/// A raw HTTP/1.1 request; (status, body).
async fn http(addr: SocketAddr, method: &str, path: &str, body: &[u8], content_type: &str) -> (u16, String) {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return (0, String::new());
    };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    // A server may answer and close before taking the whole request (an
    // oversized head): read its answer even when writing failed.
    if s.write_all(head.as_bytes()).await.is_ok() {
        let _ = s.write_all(body).await;
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = match text.split_once("\r\n\r\n") {
        Some((head, rest)) if head.to_ascii_lowercase().contains("transfer-encoding: chunked") => dechunk(rest),
        Some((_, rest)) => rest.to_owned(),
        None => String::new(),
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(len.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

async fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    let (status, body) = http(addr, "GET", path, b"", "text/plain").await;
    let v = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, v)
}

struct Stack {
    _catalog: CatalogNode,
    client: Arc<CatalogClient>,
    ingester: IngesterNode,
    store: Arc<TestStore>,
}

async fn stack(dir: &Path, seal: SealPolicy) -> Stack {
    let catalog_addr = free_addr();
    let catalog = CatalogNode::start(
        NodeConfig::single(catalog_addr, dir.join("catalog")),
        &mira_common::Process::default(),
    )
    .await
    .expect("catalog");
    catalog.wait_for_leader(Duration::from_secs(20)).await.expect("leader");
    let client = Arc::new(CatalogClient::new(
        vec![catalog_addr.to_string()],
        ClientConfig::default(),
    ));
    let store = Arc::new(TestStore::new());
    let config = IngesterConfig {
        ingester_id: "test".into(),
        grpc_listen: free_addr(),
        http_listen: free_addr(),
        advertise: "127.0.0.1:0".into(),
        data_dir: dir.join("ingester"),
        wal_mode: WalMode::PageCache,
        pipeline: PipelineConfig {
            shards: 2,
            queue_bytes: 1 << 20,
            admit_wait: Duration::from_secs(5),
            seal,
            upload_queue: 2,
            limits: Default::default(),
            max_past: Duration::from_secs(7 * 86_400),
            max_future: Duration::from_secs(600),
        },
        receivers: ReceiverConfig::default(),
        lease_ttl: Duration::from_secs(15),
        multipart_above: 16 << 20,
        publish_chunk_blocks: mira_catalog::model::MAX_BLOCKS_PER_COMMAND,
        wal_skip_corrupt: false,
    };
    let ingester = IngesterNode::start(config, &mira_common::Process::default(), client.clone(), store.clone())
        .await
        .expect("ingester");
    Stack {
        _catalog: catalog,
        client,
        ingester,
        store,
    }
}

/// POSTs the one-record export `n` to the stack's ingester; the status.
async fn post_log(s: &Stack, n: u64) -> u16 {
    http(
        s.ingester.http_addr(),
        "POST",
        "/v1/logs",
        &log_export(n),
        "application/x-protobuf",
    )
    .await
    .0
}

async fn querier(s: &Stack, cache_dir: &Path) -> QuerierServer {
    querier_with(s, cache_dir, Duration::from_secs(2)).await
}

async fn querier_with(s: &Stack, cache_dir: &Path, recent_timeout: Duration) -> QuerierServer {
    let mut config = QuerierConfig::new(cache_dir.to_owned());
    config.threads = 2;
    config.recent_timeout = recent_timeout;
    let q = Querier::new(config, s.store.clone(), s.client.clone()).expect("querier");
    QuerierServer::start(q, free_addr(), &mira_common::Process::default())
        .await
        .expect("server")
}

fn bodies(answer: &Value) -> Vec<String> {
    answer["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .map(|l| {
            l["record"]["body"]["stringValue"]
                .as_str()
                .expect("string body")
                .to_owned()
        })
        .collect()
}

async fn wait_ready(addr: SocketAddr) {
    for _ in 0..400 {
        if http(addr, "GET", "/ready", b"", "text/plain").await.0 == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("querier at {addr} never became ready");
}

fn logs_path(limit: usize) -> String {
    format!(
        "/api/mira/v1/logs?start={}&end={}&limit={limit}",
        t0(),
        t0() + 1_000_000_000
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_in_a_tight_loop_see_every_acknowledged_row_once_across_seals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = stack(
        dir.path(),
        SealPolicy {
            max_bytes: 4_000,
            max_age: Duration::from_millis(50),
        },
    )
    .await;
    let q = querier(&s, &dir.path().join("cache")).await;
    wait_ready(q.addr()).await;
    let http_addr = s.ingester.http_addr();
    let acked = Arc::new(Mutex::new(HashSet::new()));
    let sender = {
        let acked = acked.clone();
        tokio::spawn(async move {
            for n in 0..400u64 {
                let (status, _) = http(http_addr, "POST", "/v1/logs", &log_export(n), "application/x-protobuf").await;
                if status == 200 {
                    acked.lock().expect("lock").insert(n);
                }
            }
        })
    };
    let mut rounds = 0;
    let mut last_seen = 0;
    let mut done = false;
    let (mut saw_recent, mut saw_published) = (false, false);
    // Rounds while the sender runs, then one after it finished.
    while !done {
        done = sender.is_finished();
        rounds += 1;
        let must_have: HashSet<u64> = acked.lock().expect("lock").clone();
        let (status, answer) = get(q.addr(), &logs_path(10_000)).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["partial"], false, "{answer}");
        saw_recent |= answer["stats"]["recent_blocks"].as_u64() > Some(0);
        saw_published |= answer["stats"]["blocks_considered"].as_u64() > Some(0);
        let seen = bodies(&answer);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for b in &seen {
            *counts.entry(b.as_str()).or_default() += 1;
        }
        if let Some((b, c)) = counts.iter().find(|(_, c)| **c > 1) {
            panic!("round {rounds}: {b} seen {c} times");
        }
        for n in &must_have {
            assert!(
                counts.contains_key(format!("r-{n}").as_str()),
                "round {rounds}: r-{n} missing; saw {} rows: {}",
                seen.len(),
                answer["stats"]
            );
        }
        // Newest first: r-N has time t0() + N.
        let nums: Vec<u64> = seen.iter().map(|b| b[2..].parse().expect("number")).collect();
        assert!(nums.windows(2).all(|w| w[0] > w[1]), "round {rounds}: not newest first");
        last_seen = seen.len();
    }
    sender.await.expect("sender");
    assert_eq!(acked.lock().expect("lock").len(), 400);
    assert!(rounds > 3, "the loop ran alongside the sender");
    assert_eq!(last_seen, 400, "the round after the sender saw everything");
    assert!(saw_recent && saw_published, "rounds merged open and published blocks");

    // Pages of 7 through the cursor give every row once, in order.
    let mut cursor: Option<String> = None;
    let mut paged = Vec::new();
    loop {
        let mut path = logs_path(7);
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (status, answer) = get(q.addr(), &path).await;
        assert_eq!(status, 200, "{answer}");
        paged.extend(bodies(&answer));
        match answer["cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
        assert!(paged.len() <= 400, "the cursor loops");
    }
    let expected: Vec<String> = (0..400u64).rev().map(|n| format!("r-{n}")).collect();
    assert_eq!(paged, expected);
    // Oldest first with a selector and a line filter.
    let path = format!(
        "{}&direction=forward&selector=%7Bresource.service.name%3D%22svc%22%7D&regex=r-1[0-9]$",
        logs_path(5)
    );
    let (status, answer) = get(q.addr(), &path).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(bodies(&answer), ["r-10", "r-11", "r-12", "r-13", "r-14"]);
    q.shutdown().await;
    s.ingester.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_lookup_reads_only_blocks_whose_bloom_filter_matches() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Every export seals its own block.
    let s = stack(
        dir.path(),
        SealPolicy {
            max_bytes: 1,
            max_age: Duration::from_millis(20),
        },
    )
    .await;
    let q = querier(&s, &dir.path().join("cache")).await;
    wait_ready(q.addr()).await;
    let mut ids = Vec::new();
    for n in 1..=12u8 {
        let (body, id) = trace_export(n);
        let (status, text) = http(
            s.ingester.http_addr(),
            "POST",
            "/v1/traces",
            &body,
            "application/x-protobuf",
        )
        .await;
        assert_eq!(status, 200, "{text}");
        ids.push(id);
    }
    // Wait until all twelve are published.
    let range = format!("start={}&end={}", t0(), t0() + 1_000_000_000);
    for _ in 0..400 {
        let (_, a) = get(q.addr(), &format!("/api/mira/v1/traces/{}?{range}", ids[0])).await;
        if a["stats"]["blocks_considered"].as_u64() == Some(12) && a["stats"]["recent_blocks"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (status, a) = get(q.addr(), &format!("/api/mira/v1/traces/{}?{range}", ids[5])).await;
    assert_eq!(status, 200, "{a}");
    let stats = &a["stats"];
    assert_eq!(stats["blocks_considered"], 12, "{stats}");
    assert_eq!(
        stats["blocks_fetched"], 1,
        "only the matching block's rows are read: {stats}"
    );
    assert_eq!(stats["blocks_pruned"]["bloom"], 11, "{stats}");
    assert_eq!(a["span_count"], 3);
    let spans = &a["trace"]["resourceSpans"][0]["scopeSpans"][0]["spans"];
    assert_eq!(spans[0]["traceId"], ids[5].as_str());
    assert_eq!(
        a["trace"]["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
        "checkout"
    );
    // OTLP form, and search summaries.
    let (status, otlp) = get(q.addr(), &format!("/api/mira/v1/traces/{}?{range}&format=otlp", ids[5])).await;
    assert_eq!(status, 200);
    assert_eq!(otlp, a["trace"]);
    let (status, found) = get(
        q.addr(),
        &format!("/api/mira/v1/traces/search?{range}&service=checkout&name=op-0&limit=3"),
    )
    .await;
    assert_eq!(status, 200, "{found}");
    let traces = found["traces"].as_array().expect("traces");
    assert_eq!(traces.len(), 3);
    assert_eq!(traces[0]["traceId"], ids[11].as_str(), "newest first");
    assert_eq!(traces[0]["rootServiceName"], "checkout");
    assert_eq!(traces[0]["rootSpanName"], "op-0");
    assert_eq!(traces[0]["spanCount"], 3);
    assert_eq!(traces[0]["durationNano"], "500");
    // An unknown trace is a 404.
    let (status, _) = get(q.addr(), &format!("/api/mira/v1/traces/{}?{range}", "ab".repeat(16))).await;
    assert_eq!(status, 404);
    // Labels and values for pickers.
    let (status, labels) = get(q.addr(), &format!("/api/mira/v1/labels?signal=traces&{range}")).await;
    assert_eq!(status, 200, "{labels}");
    assert!(
        labels["data"]
            .as_array()
            .expect("data")
            .contains(&Value::from("resource.service.name"))
    );
    let (_, values) = get(
        q.addr(),
        &format!("/api/mira/v1/label/resource.service.name/values?signal=traces&{range}"),
    )
    .await;
    assert_eq!(values["data"], serde_json::json!(["checkout"]));
    q.shutdown().await;
    s.ingester.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_cache_files_are_refetched_and_corrupted_objects_are_errors_not_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = stack(
        dir.path(),
        SealPolicy {
            max_bytes: 1,
            max_age: Duration::from_millis(20),
        },
    )
    .await;
    for n in 0..3 {
        let status = post_log(&s, n).await;
        assert_eq!(status, 200);
    }
    let cache = dir.path().join("cache");
    let q = querier(&s, &cache).await;
    wait_ready(q.addr()).await;
    let mut expected = Vec::new();
    for _ in 0..400 {
        let (_, a) = get(q.addr(), &logs_path(10)).await;
        if a["stats"]["recent_blocks"] == 0 && a["lines"].as_array().is_some_and(|l| l.len() == 3) {
            expected = bodies(&a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(expected, ["r-2", "r-1", "r-0"]);
    q.shutdown().await;

    // Flip a byte in every cached section; a new querier (a restart) over
    // the same cache answers the same rows, fetching each section again.
    let mut flipped = 0;
    for entry in std::fs::read_dir(&cache).expect("cache dir") {
        let path = entry.expect("entry").path();
        let mut bytes = std::fs::read(&path).expect("read");
        if let Some(b) = bytes.get_mut(0) {
            *b ^= 0xff;
            std::fs::write(&path, &bytes).expect("write");
            flipped += 1;
        }
    }
    assert!(flipped > 3, "the first queries filled the cache ({flipped} files)");
    let q = querier(&s, &cache).await;
    wait_ready(q.addr()).await;
    let (status, a) = get(q.addr(), &logs_path(10)).await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(bodies(&a), expected);
    assert!(a["stats"]["bytes_from_store"].as_u64() > Some(0), "{a}");
    let (_, metrics) = http(q.addr(), "GET", "/metrics", b"", "text/plain").await;
    let corrupt: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("mira_querier_cache_corrupt_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("corrupt counter");
    assert!(corrupt >= 3, "{metrics}");
    q.shutdown().await;

    // Corrupt the objects themselves: a fresh querier with an empty cache
    // answers an error naming the block, never rows.
    let listing: Vec<object_store::ObjectMeta> = futures::TryStreamExt::try_collect(s.store.list(None))
        .await
        .expect("list");
    let mut damaged = 0;
    for meta in listing {
        let mut bytes = s
            .store
            .get(&meta.location)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes")
            .to_vec();
        // Inside the first section (after the 8-byte header and padding).
        bytes[70] ^= 0x55;
        s.store.put(&meta.location, bytes.into()).await.expect("put");
        damaged += 1;
    }
    assert_eq!(damaged, 3);
    let q = querier(&s, &dir.path().join("cache2")).await;
    wait_ready(q.addr()).await;
    let (status, a) = get(q.addr(), &logs_path(10)).await;
    assert_eq!(status, 500, "{a}");
    assert_eq!(a["errorType"], "corrupt_block", "{a}");
    assert!(a.get("lines").is_none());
    // A 500 names its kind only: the detail (which object, which check)
    // is in the querier's log, not sent to the client.
    assert!(!a.to_string().contains(".mira"), "{a}");
    q.shutdown().await;
    s.ingester.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_queries_get_a_clear_4xx_and_the_querier_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = stack(
        dir.path(),
        SealPolicy {
            max_bytes: 1 << 20,
            max_age: Duration::from_millis(50),
        },
    )
    .await;
    let status = post_log(&s, 1).await;
    assert_eq!(status, 200);
    let q = querier(&s, &dir.path().join("cache")).await;
    wait_ready(q.addr()).await;
    let base = "/api/mira/v1/logs";
    let cases: Vec<(String, u16, &str)> = vec![
        (format!("{base}?selector=%7Ba%3D%22b%22"), 400, "expected ',' or '}'"),
        (format!("{base}?selector=a%3D%22b%22%7D"), 400, "expected '{'"),
        (format!("{base}?regex=(a"), 400, "regex"),
        (format!("{base}?limit=1000000000"), 422, "--max-query-limit"),
        (format!("{base}?limit=-1"), 400, "limit="),
        (format!("{base}?start=200&end=100"), 400, "after end"),
        (
            format!("{base}?start=0&end=1796169600000000000"),
            422,
            "--max-query-range",
        ),
        (format!("{base}?direction=sideways"), 400, "direction="),
        (format!("{base}?cursor=garbage"), 400, "cursor"),
        ("/api/mira/v1/traces/xyz".to_owned(), 400, "32 hex digits"),
        ("/api/mira/v1/labels?signal=metricz".to_owned(), 400, "signal="),
        (
            "/api/mira/v1/traces/search?min_duration=5parsecs".to_owned(),
            400,
            "min_duration=",
        ),
        ("/api/mira/v1/traces/search?status=maybe".to_owned(), 400, "status="),
        (
            "/api/mira/v1/metrics/query?query=sum(rate(x%5B5m%5D)".to_owned(),
            400,
            "parse error at byte 15",
        ),
        (
            "/api/mira/v1/metrics/query?query=x%7Ba%3D%22b%22".to_owned(),
            400,
            "inside braces",
        ),
        (
            "/api/mira/v1/metrics/query?query=sort(x)".to_owned(),
            400,
            "not supported",
        ),
        (
            "/api/mira/v1/metrics/query_range?query=x&start=1796169600&end=1796256000&step=0.1".to_owned(),
            422,
            "steps",
        ),
        (
            "/api/mira/v1/metrics/query_range?query=x&start=1796169600&end=1796169500&step=15".to_owned(),
            400,
            "after end",
        ),
        ("/api/mira/v1/metrics/query".to_owned(), 400, "query is required"),
    ];
    for (path, want, says) in &cases {
        let (status, body) = get(q.addr(), path).await;
        assert_eq!(status, *want, "{path}: {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(says)),
            "{path}: {body}"
        );
    }
    // A catastrophic regex for a backtracking engine runs in linear time.
    let (status, body) = get(q.addr(), &format!("{}&regex=%5E(a%2B)%2B%24", logs_path(10))).await;
    assert_eq!(status, 200, "{body}");
    // A tenant header with characters a tenant id cannot hold.
    let (status, body) = {
        let Ok(mut c) = tokio::net::TcpStream::connect(q.addr()).await else {
            panic!("connect")
        };
        c.write_all(b"GET /api/mira/v1/logs HTTP/1.1\r\nHost: x\r\nX-Scope-OrgID: ../etc\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut out = String::new();
        let _ = c.read_to_string(&mut out).await;
        (
            out.split_whitespace()
                .nth(1)
                .and_then(|s| s.parse::<u16>().ok())
                .unwrap_or(0),
            out,
        )
    };
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("X-Scope-OrgID"), "{body}");
    // A 10 MB query string is refused before it reaches a handler.
    let huge = format!("{base}?selector={}", "a".repeat(10 << 20));
    let (status, _) = get(q.addr(), &huge).await;
    assert!((400..500).contains(&status), "10 MB query string: {status}");
    // Still serving, with the right answer.
    let (status, body) = get(q.addr(), &logs_path(10)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(bodies(&body), ["r-1"]);
    q.shutdown().await;
    s.ingester.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingester_that_does_not_answer_makes_the_answer_partial_not_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = stack(
        dir.path(),
        SealPolicy {
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(300),
        },
    )
    .await;
    let status = post_log(&s, 1).await;
    assert_eq!(status, 200);
    // A registered ingester that takes connections and never answers.
    let ghost = TcpListener::bind("127.0.0.1:0").expect("bind");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as i64;
    s.client
        .heartbeat("ghost", &ghost.local_addr().expect("addr").to_string(), now, 600_000)
        .await
        .expect("lease");
    let q = querier_with(&s, &dir.path().join("cache"), Duration::from_millis(300)).await;
    wait_ready(q.addr()).await;
    let (status, a) = get(q.addr(), &logs_path(10)).await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["partial"], true, "{a}");
    assert!(
        a["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("ingester ghost did not answer")),
        "{a}"
    );
    assert_eq!(bodies(&a), ["r-1"], "the live ingester's rows are still there");
    assert_eq!(a["stats"]["ingesters_asked"], 2);
    drop(ghost);
    q.shutdown().await;
    s.ingester.shutdown().await;
}
