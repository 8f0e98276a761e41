//! A querier behind a real catalog member and a store that can hang, while
//! blocks are swapped under it the way the compactor swaps them: the query
//! timeout (504, the next query served), the staleness guard (503 while
//! the catalog is down, answers again once it is back), one re-plan when a
//! planned block was replaced and its object deleted (the same answer), and
//! a live block without its object (500, counted as missing); decoded
//! tables reused by later queries within the decoded cache's bytes; a
//! repeated PromQL query and a sliding range answered from the result
//! cache as an uncached querier answers them; PromQL's `@` and negative
//! offsets answered from the samples they name, the range limit over what
//! a query reads, unrepresentable times refused, series and samples limits
//! that stop the reads, and deep nesting refused while the querier serves.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, CatalogNode, ClientConfig, NodeConfig};
use mira_common::Process;
use mira_core::block::path::block_path;
use mira_core::block::{Block, VerifyCache};
use mira_core::compact::merge_blocks;
use mira_core::convert::{LogsBuilder, SignalBuilder, SpansBuilder};
use mira_core::tables::write_hot;
use mira_core::{BlockId, Signal, TenantId};
use mira_querier::server::QuerierServer;
use mira_querier::{Querier, QuerierConfig};
use mira_testkit::http;
use mira_testkit::net::{free_addr, wait_for};
use mira_testkit::otlp::log_export;
use mira_testkit::recent_base_time as t0;
use mira_testkit::store::TestStore;
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use serde_json::Value;

/// Long enough for anything that should happen; a test waits on a
/// condition, never this long unless it fails.
const PATIENCE: Duration = Duration::from_secs(60);

async fn start_catalog(addr: SocketAddr, dir: &Path) -> CatalogNode {
    let node = CatalogNode::start(NodeConfig::single(addr, dir.join("catalog")), &Process::default())
        .await
        .expect("catalog");
    node.wait_for_leader(Duration::from_secs(20)).await.expect("leader");
    node
}

/// A logs block of the default tenant holding records `r-{n}` at
/// `t0() + n`: its bytes and its catalog row.
fn logs_block(ns: impl IntoIterator<Item = u64>) -> (Bytes, pb::Block) {
    let export = ExportLogsServiceRequest::decode(
        log_export(
            &[("service.name", "svc")],
            ns.into_iter().map(|n| (n, format!("r-{n}"))),
        )
        .as_slice(),
    )
    .expect("export");
    let mut b = LogsBuilder::default();
    b.append(&export).expect("append");
    let tables = b.finish().expect("finish");
    let bytes = write_hot(&tables, BlockId::new(), TenantId::default_tenant()).expect("write");
    row(bytes)
}

/// A traces block of one span per `(trace byte, name, t0() + offset)`
/// (each its trace's root, service `svc`): its bytes and its catalog row.
fn traces_block(spans: &[(u8, &str, u64)]) -> (Bytes, pb::Block) {
    let spans = spans
        .iter()
        .map(|(n, name, at)| Span {
            trace_id: vec![*n; 16],
            span_id: vec![*n, 1, 1, 1, 1, 1, 1, 1],
            name: (*name).into(),
            start_time_unix_nano: t0() + at,
            end_time_unix_nano: t0() + at + 5,
            ..Default::default()
        })
        .collect();
    let export = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue("svc".into())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let mut b = SpansBuilder::default();
    b.append(&export).expect("append");
    let tables = b.finish().expect("finish");
    let bytes = write_hot(&tables, BlockId::new(), TenantId::default_tenant()).expect("write");
    row(bytes)
}

fn open(bytes: &Bytes) -> Block {
    Block::from_bytes(bytes.clone(), Arc::new(VerifyCache::new(64))).expect("open")
}

/// A block's bytes and its catalog row (its canonical key, its meta).
fn row(bytes: Bytes) -> (Bytes, pb::Block) {
    let meta = open(&bytes).meta().clone();
    let key = block_path(&TenantId::default_tenant(), meta.signal, meta.min_time, meta.block_id);
    let row = pb::Block {
        id: meta.block_id.to_string(),
        tenant: "default".into(),
        signal: match meta.signal {
            Signal::Logs => pb::Signal::Logs,
            Signal::Traces => pb::Signal::Traces,
            Signal::Metrics => pb::Signal::Metrics,
        } as i32,
        min_time_ns: meta.min_time as i64,
        max_time_ns: meta.max_time as i64,
        rows: meta.rows,
        bytes: bytes.len() as u64,
        level: pb::Level::Hot as i32,
        object_key: key.to_string(),
        created_at_ns: t0() as i64,
        ..Default::default()
    };
    (bytes, row)
}

/// A running catalog member, the store and what publishes into them.
struct Stack {
    dir: tempfile::TempDir,
    catalog_addr: SocketAddr,
    catalog: Option<CatalogNode>,
    client: Arc<CatalogClient>,
    store: Arc<TestStore>,
}

impl Stack {
    async fn start() -> Stack {
        let dir = tempfile::tempdir().expect("tempdir");
        let catalog_addr = free_addr();
        let catalog = start_catalog(catalog_addr, dir.path()).await;
        let client = Arc::new(CatalogClient::new(
            vec![catalog_addr.to_string()],
            ClientConfig::default(),
        ));
        Stack {
            dir,
            catalog_addr,
            catalog: Some(catalog),
            client,
            store: Arc::new(TestStore::new()),
        }
    }

    /// Uploads a block's object.
    async fn upload(&self, bytes: &Bytes, row: &pb::Block) {
        self.store
            .put(&ObjectPath::from(row.object_key.as_str()), bytes.clone().into())
            .await
            .expect("put");
    }

    /// Uploads and publishes blocks.
    async fn publish(&self, blocks: &[&(Bytes, pb::Block)]) {
        for (bytes, row) in blocks {
            self.upload(bytes, row).await;
        }
        self.client
            .publish(blocks.iter().map(|(_, r)| r.clone()).collect(), None)
            .await
            .expect("publish");
    }

    async fn delete(&self, row: &pb::Block) {
        self.store
            .delete(&ObjectPath::from(row.object_key.as_str()))
            .await
            .expect("delete");
    }

    /// A querier (its own cache) over the stack, serving on a free port;
    /// `tune` changes its config first.
    async fn querier(&self, name: &str, tune: impl FnOnce(&mut QuerierConfig)) -> Serving {
        self.querier_via(self.client.clone(), name, tune).await
    }

    /// The same, reaching the catalog through `client`.
    async fn querier_via(
        &self,
        client: Arc<CatalogClient>,
        name: &str,
        tune: impl FnOnce(&mut QuerierConfig),
    ) -> Serving {
        let mut config = QuerierConfig::new(self.dir.path().join(name));
        config.threads = 2;
        tune(&mut config);
        let process = Process::default();
        let querier = Querier::new(config, process.clock.clone(), self.store.clone(), client).expect("querier");
        let server = QuerierServer::start(querier, free_addr(), &process)
            .await
            .expect("server");
        let addr = server.addr().to_string();
        http::wait_ready(&addr).await;
        Serving { addr, _server: server }
    }
}

/// A TCP proxy to the catalog that can be cut: every connection through it
/// dropped and new ones refused, as when the catalog's process stops or
/// the network parts. (Stopping an in-process member leaves the watch
/// streams it serves running, so the proxy is what the querier sees.)
struct Proxy {
    addr: SocketAddr,
    open: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (open, rx) = tokio::sync::watch::channel(true);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut rx = rx.clone();
                if !*rx.borrow_and_update() {
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.wait_for(|open| !*open) => {}
                    }
                });
            }
        });
        Proxy { addr, open, task }
    }

    fn set_open(&self, open: bool) {
        self.open.send_replace(open);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Serving {
    addr: String,
    _server: QuerierServer,
}

impl Serving {
    /// GETs `path`: the status and the body (status 0 when none came).
    async fn get(&self, path: &str) -> (u16, String) {
        http::get(&self.addr, path)
            .await
            .map_or((0, String::new()), |r| (r.status, r.text()))
    }

    /// The value of a sample in `/metrics` (0 when absent).
    async fn metric(&self, sample: &str) -> f64 {
        let (status, text) = self.get("/metrics").await;
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|v| v.strip_prefix(' ')))
            .map_or(0.0, |v| v.trim().parse().expect("a number"))
    }
}

/// The native logs query over every row these tests write.
fn logs_path() -> String {
    format!(
        "/api/mira/v1/logs?start={}&end={}&limit=100&direction=forward",
        t0(),
        t0() + 1_000_000
    )
}

/// The bodies of a native logs answer, in its order.
fn bodies(answer: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(answer).expect("json");
    v["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .map(|l| l["record"]["body"]["stringValue"].as_str().expect("body").to_owned())
        .collect()
}

fn rs(ns: std::ops::RangeInclusive<u64>) -> Vec<String> {
    ns.map(|n| format!("r-{n}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_over_the_timeout_answers_504_and_the_next_query_is_served() {
    let stack = Stack::start().await;
    let a = logs_block(1..=3);
    stack.publish(&[&a]).await;
    let q = stack
        .querier("cache", |c| c.query_timeout = Duration::from_millis(500))
        .await;

    // Reads never complete: every query endpoint gives up at the timeout.
    stack.store.set_readable(false);
    let (status, body) = q.get(&logs_path()).await;
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("query timeout of 0.5 s"), "{body}");
    assert!(body.contains("\"timeout\""), "{body}");
    let loki = format!(
        "/loki/api/v1/query_range?query=%7Bservice_name%3D%22svc%22%7D&start={}&end={}&limit=10",
        t0(),
        t0() + 1_000_000
    );
    let (status, body) = q.get(&loki).await;
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("--query-timeout"), "{body}");
    // The cancelled queries left nothing waiting on the store.
    wait_for("the cancelled reads to go", PATIENCE, || async {
        (stack.store.stalled_reads() == 0).then_some(())
    })
    .await;

    stack.store.set_readable(true);
    let (status, body) = q.get(&logs_path()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(bodies(&body), rs(1..=3));
    assert_eq!(
        q.metric("mira_querier_requests_total{endpoint=\"/api/mira/v1/logs\",code=\"504\"}")
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_catalog_copy_answers_503_until_the_catalog_is_back() {
    let mut stack = Stack::start().await;
    let a = logs_block(1..=3);
    stack.publish(&[&a]).await;
    let proxy = Proxy::start(stack.catalog_addr).await;
    let through = Arc::new(CatalogClient::new(
        vec![proxy.addr.to_string()],
        ClientConfig::default(),
    ));
    let q = stack
        .querier_via(through, "cache", |c| {
            c.max_staleness = Duration::from_secs(2);
            c.catalog_wait = Duration::from_millis(500);
        })
        .await;
    let (status, body) = q.get(&logs_path()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(bodies(&body), rs(1..=3));

    proxy.set_open(false);
    if let Some(node) = stack.catalog.take() {
        node.shutdown().await;
    }
    let body = wait_for("a 503 from the stale copy", PATIENCE, || async {
        let (status, body) = q.get(&logs_path()).await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(body.contains("catalog copy is stale: last update"), "{body}");
    assert!(body.contains("(bound 2 s)"), "{body}");

    stack.catalog = Some(start_catalog(stack.catalog_addr, stack.dir.path()).await);
    proxy.set_open(true);
    let body = wait_for("answers once the catalog is back", PATIENCE, || async {
        let (status, body) = q.get(&logs_path()).await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(bodies(&body), rs(1..=3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_planned_before_a_swap_replans_once_and_answers_the_same() {
    let stack = Stack::start().await;
    let (a, b) = (logs_block(1..=3), logs_block(4..=6));
    stack.publish(&[&a, &b]).await;
    // The answer before the swap, from a querier of its own (its cache
    // would otherwise spare the second one every read).
    let before = stack.querier("cache-before", |_| {}).await;
    let (status, expected) = before.get(&logs_path()).await;
    assert_eq!(status, 200, "{expected}");
    assert_eq!(bodies(&expected), rs(1..=6));

    let q = stack.querier("cache", |_| {}).await;
    // The query plans A and B, then waits at its first read.
    stack.store.set_readable(false);
    let running = {
        let (addr, path) = (q.addr.clone(), logs_path());
        tokio::spawn(async move { http::get(&addr, &path).await })
    };
    wait_for("the query to plan and read", PATIENCE, || async {
        (stack.store.stalled_reads() > 0).then_some(())
    })
    .await;
    // The compactor's swap: C holds A's and B's rows, one Replace, then
    // A's object is deleted (its grace assumed passed).
    let inputs = [open(&a.0), open(&b.0)];
    let c = row(merge_blocks(&inputs, BlockId::new()).expect("merge"));
    stack.upload(&c.0, &c.1).await;
    stack
        .client
        .replace(pb::Replace {
            add: vec![c.1.clone()],
            tombstone: vec![a.1.id.clone(), b.1.id.clone()],
            now_ns: t0() as i64,
            ..Default::default()
        })
        .await
        .expect("replace");
    stack.delete(&a.1).await;
    stack.store.set_readable(true);

    let answer = running.await.expect("task").expect("an answer");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let v: Value = serde_json::from_str(&answer.text()).expect("json");
    let want: Value = serde_json::from_str(&expected).expect("json");
    assert_eq!(v["lines"], want["lines"]);
    assert_eq!(
        q.metric("mira_querier_replans_total{reason=\"object_gone\"}").await,
        1.0
    );
    assert_eq!(q.metric("mira_querier_missing_objects_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_block_without_its_object_is_a_500_counted_as_missing() {
    let stack = Stack::start().await;
    let a = logs_block(1..=3);
    stack.publish(&[&a]).await;
    stack.delete(&a.1).await;
    let q = stack.querier("cache", |_| {}).await;

    let (status, body) = q.get(&logs_path()).await;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("\"missing_object\""), "{body}");
    // Planned again once, then found missing while still live.
    assert_eq!(
        q.metric("mira_querier_replans_total{reason=\"object_gone\"}").await,
        1.0
    );
    assert_eq!(q.metric("mira_querier_missing_objects_total").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_trace_search_answers_by_span_time_however_spans_are_split_into_blocks() {
    let stack = Stack::start().await;
    // Four blocks that end late (a `noise` span) but match early, and a
    // fifth that ends earlier than all of them yet holds the newest match:
    // a search that stopped once it had `limit` traces from the newest
    // blocks would miss it, and a merge of the blocks would find it.
    let mut blocks: Vec<(Bytes, pb::Block)> = (0..4u8)
        .map(|i| {
            traces_block(&[
                (0xa0 + i, "noise", 2_000 + u64::from(i)),
                (0x11 + i, "hit", 10 + u64::from(i)),
            ])
        })
        .collect();
    blocks.push(traces_block(&[(0x15, "hit", 500)]));
    stack.publish(&blocks.iter().collect::<Vec<_>>()).await;
    let q = stack.querier("cache", |c| c.threads = 1).await;

    let native = format!(
        "/api/mira/v1/traces/search?start={}&end={}&name=hit&limit=2",
        t0(),
        t0() + 1_000_000
    );
    let (status, body) = q.get(&native).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    let ids: Vec<&str> = v["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .map(|t| t["traceId"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["15".repeat(16), "14".repeat(16)], "{body}");

    let tempo = format!(
        "/api/search?q=%7Bname%3D%22hit%22%7D&start={}&end={}&limit=2",
        t0() / 1_000_000_000,
        t0() / 1_000_000_000 + 1
    );
    let (status, body) = q.get(&tempo).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    let ids: Vec<&str> = v["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .map(|t| t["traceID"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["15".repeat(16), "14".repeat(16)], "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_label_value_list_is_the_first_values_in_order_not_the_first_rows() {
    let stack = Stack::start().await;
    // More values of `k` than a list holds, stored in descending order:
    // the first rows hold the last values.
    let n = mira_querier::labels::MAX_VALUES as u64 + 5;
    let records = (0..n)
        .map(|i| LogRecord {
            time_unix_nano: t0() + i,
            attributes: vec![KeyValue {
                key: "k".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(format!("v{:05}", n - 1 - i))),
                }),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    let export = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: records,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let mut b = LogsBuilder::default();
    b.append(&export).expect("append");
    let bytes = write_hot(&b.finish().expect("finish"), BlockId::new(), TenantId::default_tenant()).expect("write");
    stack.publish(&[&row(bytes)]).await;
    let q = stack.querier("cache", |_| {}).await;

    let path = format!("/api/mira/v1/label/k/values?start={}&end={}", t0(), t0() + 1_000_000);
    let (status, body) = q.get(&path).await;
    assert_eq!(status, 200, "{}", &body[..body.len().min(500)]);
    let v: Value = serde_json::from_str(&body).expect("json");
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.len(), mira_querier::labels::MAX_VALUES);
    assert_eq!(data[0], "v00000");
    assert_eq!(
        data[data.len() - 1],
        format!("v{:05}", mira_querier::labels::MAX_VALUES - 1)
    );
    assert!(v["warnings"].to_string().contains("more than"), "{}", v["warnings"]);
}

/// `bytes` (a hot block) rewritten cold under a new id, and its row.
fn cold_block(bytes: &Bytes) -> (Bytes, pb::Block) {
    let cold = mira_core::cold::rewrite_cold(&open(bytes), BlockId::new()).expect("cold");
    let (bytes, mut row) = row(cold);
    row.level = pb::Level::Cold as i32;
    (bytes, row)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_query_reuses_decoded_tables_and_answers_the_same() {
    let stack = Stack::start().await;
    let a = logs_block(1..=3);
    let b = cold_block(&logs_block(4..=6).0);
    stack.publish(&[&a, &b]).await;
    // The result cache off: it would keep the whole page and read nothing.
    let q = stack.querier("cache", |c| c.result_cache_bytes = 0).await;
    let inserts = "mira_querier_decoded_cache_inserts_total";

    let hits = "mira_querier_decoded_cache_hits_total";

    // The first query decodes the tables it reads of each block (the root
    // table to scan, the others to render records) and keeps them.
    let (status, first) = q.get(&logs_path()).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(bodies(&first), rs(1..=6));
    let decoded = q.metric(inserts).await;
    assert!(decoded >= 2.0, "{decoded} tables decoded");
    let hit = q.metric(hits).await;
    assert!(q.metric("mira_querier_decoded_cache_bytes").await > 0.0);
    // The second decodes nothing, finds every table, and answers the same.
    let (status, second) = q.get(&logs_path()).await;
    assert_eq!(status, 200, "{second}");
    let (first, second): (Value, Value) = (
        serde_json::from_str(&first).expect("json"),
        serde_json::from_str(&second).expect("json"),
    );
    assert_eq!(second["lines"], first["lines"]);
    // No section was read again, from the store or the disk cache.
    assert_eq!(second["stats"]["bytes_from_store"], 0);
    assert_eq!(second["stats"]["bytes_from_cache"], 0);
    assert_eq!(q.metric(inserts).await, decoded);
    assert!(q.metric(hits).await >= hit + decoded, "{} hits", q.metric(hits).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decoded_cache_stays_within_its_bytes_and_answers_the_same() {
    let stack = Stack::start().await;
    let (a, b) = (logs_block(1..=3), logs_block(4..=6));
    stack.publish(&[&a, &b]).await;
    // Room for one hot root table (a zero-copy table weighs its section).
    let room = [&a, &b]
        .iter()
        .map(|(bytes, _)| open(bytes).manifest().section("logs").expect("logs").1.length)
        .max()
        .expect("two");
    let q = stack.querier("cache", |c| c.decoded_cache_bytes = room).await;
    for _ in 0..3 {
        let (status, body) = q.get(&logs_path()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(bodies(&body), rs(1..=6));
        assert!(q.metric("mira_querier_decoded_cache_bytes").await <= room as f64);
    }
    assert!(q.metric("mira_querier_decoded_cache_evictions_total").await >= 1.0);

    // Nothing kept at all: every query decodes, and answers the same.
    let none = stack.querier("none", |c| c.decoded_cache_bytes = 0).await;
    for _ in 0..2 {
        let (status, body) = none.get(&logs_path()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(bodies(&body), rs(1..=6));
    }
    assert_eq!(none.metric("mira_querier_decoded_cache_inserts_total").await, 0.0);
    assert_eq!(none.metric("mira_querier_decoded_cache_bytes").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offloaded_block_is_not_read_and_the_answer_says_how_to_restore_it() {
    let stack = Stack::start().await;
    let (a, b) = (logs_block(1..=3), logs_block(4..=6));
    stack.publish(&[&a, &b]).await;
    let q = stack.querier("cache", |_| {}).await;
    let (status, text) = q.get(&logs_path()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(bodies(&text), rs(1..=6));
    stack
        .client
        .mark_offloaded_v2(vec![pb::OffloadItem {
            id: a.1.id.clone(),
            location: format!("file:///archive/{}", a.1.object_key),
            sha256: "0".repeat(64),
            at_ns: t0() as i64,
        }])
        .await
        .expect("mark offloaded");
    // The querier's copy follows the catalog: once it sees the mark, the
    // block's rows are gone from answers and the warning names it.
    let answer = wait_for("the offload mark to reach the querier", PATIENCE, || async {
        let (status, text) = q.get(&logs_path()).await;
        (status == 200 && bodies(&text) == rs(4..=6)).then_some(text)
    })
    .await;
    let v: Value = serde_json::from_str(&answer).expect("json");
    assert_eq!(v["stats"]["blocks_offloaded"], 1, "{answer}");
    assert_eq!(v["partial"], false);
    let warning = v["warnings"][0].as_str().expect("a warning");
    assert!(
        warning.starts_with("1 blocks offloaded in range") && warning.contains("mira offload restore --tenant"),
        "{warning}"
    );
}

/// A metrics block: gauge `temp` for cpu 0 and 1, a point every 10 s for
/// 50 s from `t0() + offset_s`.
fn metrics_block(offset_s: u64) -> (Bytes, pb::Block) {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
    };
    let text = |v: &str| {
        Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        })
    };
    let points = (0..2u64)
        .flat_map(|cpu| (0..6u64).map(move |k| (cpu, k)))
        .map(|(cpu, k)| NumberDataPoint {
            time_unix_nano: t0() + (offset_s + k * 10) * 1_000_000_000,
            value: Some(number_data_point::Value::AsDouble((offset_s + k + cpu * 100) as f64)),
            attributes: vec![KeyValue {
                key: "cpu".into(),
                value: text(&cpu.to_string()),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    let req = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: text("svc"),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "temp".into(),
                    data: Some(metric::Data::Gauge(Gauge { data_points: points })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let mut b = mira_core::convert::PointsBuilder::default();
    b.append(&req).expect("append");
    let tables = b.finish().expect("finish");
    row(write_hot(&tables, BlockId::new(), TenantId::default_tenant()).expect("write"))
}

/// `t0() + s` seconds as Prometheus API seconds (ms precision).
fn secs(s: i64) -> String {
    let ms = (t0() / 1_000_000) as i64 + s * 1000;
    format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
}

/// `query` percent-encoded for a URL.
fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A PromQL range query over `[t0() + from_s, t0() + to_s]`, step 10 s.
fn promql_path(query: &str, from_s: u64, to_s: u64) -> String {
    format!(
        "/api/v1/query_range?query={}&start={}&end={}&step=10",
        encode(query),
        secs(from_s as i64),
        secs(to_s as i64)
    )
}

/// A PromQL instant query at `time` (Prometheus API seconds).
fn instant_path(query: &str, time: &str) -> String {
    format!("/api/v1/query?query={}&time={}", encode(query), encode(time))
}

/// Each series' values of a Prometheus answer: (labels, [value]).
fn values(status: u16, body: &str) -> Vec<(String, Vec<String>)> {
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(body).expect("json");
    v["data"]["result"]
        .as_array()
        .expect("result")
        .iter()
        .map(|s| {
            let points = match s.get("values") {
                Some(p) => p.as_array().expect("values").iter().map(|p| p[1].clone()).collect(),
                None => vec![s["value"][1].clone()],
            };
            let texts = points.iter().map(|p| p.as_str().expect("text").to_owned()).collect();
            (s["metric"].to_string(), texts)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_and_negative_offsets_read_the_samples_they_name_and_are_held_to_the_range_limit() {
    let stack = Stack::start().await;
    // temp{cpu="0"} is 0..5 at t0 + 0..50 s, 600..605 at t0 + 600..650 s.
    let blocks = [metrics_block(0), metrics_block(600)];
    stack.publish(&blocks.iter().collect::<Vec<_>>()).await;
    let cached = stack
        .querier("cached", |c| c.max_range = Duration::from_secs(3600))
        .await;
    let plain = stack
        .querier("plain", |c| {
            c.result_cache_bytes = 0;
            c.max_range = Duration::from_secs(3600);
        })
        .await;
    let one = |v: &[&str]| {
        vec![(
            r#"{"__name__":"temp","cpu":"0","job":"svc","service_name":"svc"}"#.to_owned(),
            v.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )]
    };
    let at = |s: i64| secs(s);
    for q in [&cached, &plain] {
        for (path, want) in [
            // `@` an hour before the evaluation time: the sample at t0 + 50.
            (
                instant_path(&format!(r#"temp{{cpu="0"}} @ {}"#, at(50)), &at(3000)),
                one(&["5"]),
            ),
            (
                instant_path(&format!(r#"max_over_time(temp{{cpu="0"}}[1m] @ {})"#, at(650)), &at(50)),
                vec![(
                    r#"{"cpu":"0","job":"svc","service_name":"svc"}"#.to_owned(),
                    vec!["605".to_owned()],
                )],
            ),
            // A negative offset reads later samples: t0 + 650 at t0 + 50.
            (instant_path(r#"temp{cpu="0"} offset -10m"#, &at(50)), one(&["605"])),
            (
                promql_path(r#"temp{cpu="0"} offset -10m"#, 0, 50),
                one(&["600", "601", "602", "603", "604", "605"]),
            ),
            (
                promql_path(&format!(r#"temp{{cpu="0"}} @ {}"#, at(650)), 0, 20),
                one(&["605", "605", "605"]),
            ),
        ] {
            let (status, body) = q.get(&path).await;
            assert_eq!(values(status, &body), want, "{path}: {body}");
        }
        // What a query reads is held to --max-query-range (1 h here), its
        // ranges, offsets and `@` applied, not only [start, end].
        for query in [
            "count_over_time(temp[3650d])".to_owned(),
            "temp offset 2h".to_owned() + " + temp",
            format!("temp @ {} + temp", at(-7200)),
            "temp offset -2h + temp".to_owned(),
        ] {
            let (status, body) = q.get(&instant_path(&query, &at(50))).await;
            assert_eq!(status, 422, "{query}: {body}");
            assert!(
                body.contains("--max-query-range") && body.contains("offsets"),
                "{query}: {body}"
            );
        }
        // Times no stored sample can have: 400, the querier still serving.
        for time in [
            "9999999999999",
            "-9999999999999",
            "1e300",
            "-1e300",
            "NaN",
            "+Inf",
            "-Inf",
        ] {
            let (status, body) = q.get(&instant_path("temp", time)).await;
            assert_eq!(status, 400, "time={time}: {body}");
            assert!(body.contains("bad_data"), "time={time}: {body}");
        }
        let range = format!(
            "/api/v1/query_range?query=temp&start={}&end=9999999999999&step=1000000000",
            at(0)
        );
        let (status, body) = q.get(&range).await;
        assert_eq!(status, 400, "{body}");
        for query in ["temp @ 9999999999999", "temp offset -300000y", "rate(temp[300000y])"] {
            let (status, body) = q.get(&instant_path(query, &at(50))).await;
            assert_eq!(status, 400, "{query}: {body}");
            assert!(body.contains("outside the times a query can read"), "{query}: {body}");
        }
        // Prometheus' own bounds, as its clients send them for all time: a
        // labels window is cut to what can hold data.
        let all = format!(
            "/api/v1/labels?start={}&end={}",
            encode("-292273086-05-16T16:47:06Z"),
            encode("292277025-08-18T07:12:54.999999999Z")
        );
        let (status, body) = q.get(&all).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"cpu\""), "{body}");
        let (status, body) = q.get(&instant_path(r#"temp{cpu="0"}"#, &at(50))).await;
        assert_eq!(values(status, &body), one(&["5"]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_promql_query_and_a_sliding_range_reuse_unchanged_blocks_and_answer_the_same() {
    let stack = Stack::start().await;
    let blocks: Vec<_> = (0..4).map(|i| metrics_block(i * 60)).collect();
    stack.publish(&blocks.iter().collect::<Vec<_>>()).await;
    let cached = stack.querier("cached", |_| {}).await;
    let plain = stack.querier("plain", |c| c.result_cache_bytes = 0).await;
    let (hits, misses) = (
        "mira_querier_result_cache_hits_total",
        "mira_querier_result_cache_misses_total",
    );
    let answer = |(status, body): (u16, String)| {
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("json");
        v["data"].clone()
    };
    for query in ["sum by (cpu) (temp)", r#"max_over_time(temp{cpu="1"}[30s])"#] {
        let path = promql_path(query, 60, 180);
        let want = answer(plain.get(&path).await);
        assert!(
            want["result"].as_array().is_some_and(|r| !r.is_empty()),
            "{query}: {want}"
        );
        let (h0, m0) = (cached.metric(hits).await, cached.metric(misses).await);
        assert_eq!(answer(cached.get(&path).await), want, "{query}: first run");
        let (h1, m1) = (cached.metric(hits).await, cached.metric(misses).await);
        assert!(m1 > m0, "{query}: the first run misses");
        assert_eq!(answer(cached.get(&path).await), want, "{query}: second run");
        let (h2, m2) = (cached.metric(hits).await, cached.metric(misses).await);
        assert_eq!(m2, m1, "{query}: the second run misses nothing");
        assert_eq!(h2, h1 + 1.0, "{query}: the whole answer is kept, one hit");
        let _ = h0;
    }
    // The dashboard slides: a new answer (its one miss), but a block's
    // series are kept whole, so every block is reused, the ones the range
    // cuts included, and the answer is the uncached one (which reads only
    // the range's samples).
    for (from, to) in [(120, 240), (130, 195), (200, 205)] {
        let path = promql_path("sum by (cpu) (temp)", from, to);
        let want = answer(plain.get(&path).await);
        let (h1, m1) = (cached.metric(hits).await, cached.metric(misses).await);
        assert_eq!(answer(cached.get(&path).await), want, "slid to {from}..{to}");
        let (h2, m2) = (cached.metric(hits).await, cached.metric(misses).await);
        assert!(h2 - h1 >= 4.0, "{from}..{to}: {h1} -> {h2} hits");
        assert_eq!(m2, m1 + 1.0, "{from}..{to}: no block read again");
    }
    let (from, to) = (130, 195);
    let path = promql_path(r#"max_over_time(temp{cpu="1"}[20s])"#, from, to);
    assert_eq!(
        answer(cached.get(&path).await),
        answer(plain.get(&path).await),
        "a cut block's later samples are not in the answer"
    );
    assert!(cached.metric("mira_querier_result_cache_bytes").await > 0.0);
    assert_eq!(plain.metric(hits).await + plain.metric(misses).await, 0.0);
    assert_eq!(plain.metric("mira_querier_result_cache_bytes").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_past_its_series_or_samples_stops_reading_and_answers_422() {
    let stack = Stack::start().await;
    // Two series (cpu 0 and 1), six samples each per block.
    let (a, b, c) = (metrics_block(0), metrics_block(60), metrics_block(120));
    stack.publish(&[&a, &b, &c]).await;
    let q = stack
        .querier("limited", |c| {
            c.max_series = 1;
            c.max_samples = 12;
        })
        .await;
    // Within both limits, over a and b only: one series, twelve samples
    // (a and b now in the querier's caches).
    let (status, body) = q.get(&promql_path(r#"temp{cpu="0"}"#, 0, 110)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = q
        .get(&instant_path(r#"count_over_time(temp{cpu="0"}[2m])"#, &secs(110)))
        .await;
    assert_eq!(values(status, &body)[0].1, ["12"], "{body}");
    // Block c's reads hang; a and b come from the caches and already select
    // two series: the query is refused without waiting for c (before, every
    // block was read first and the query hung until its timeout), and c's
    // read is dropped.
    stack.store.set_readable(false);
    let (status, body) = q.get(&promql_path("temp", 0, 170)).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("more than 1 series (--max-query-series)"), "{body}");
    wait_for("the hung read to be dropped", PATIENCE, || async {
        (stack.store.stalled_reads() == 0).then_some(())
    })
    .await;
    stack.store.set_readable(true);
    // Eighteen samples of one series (a, b and c): refused, naming the limit.
    let (status, body) = q
        .get(&instant_path(r#"count_over_time(temp{cpu="0"}[3m])"#, &secs(170)))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("more than 12 samples (--max-query-samples)"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_promql_answers_400_naming_the_limit_and_the_querier_keeps_serving() {
    let stack = Stack::start().await;
    let a = metrics_block(0);
    stack.publish(&[&a]).await;
    let q = stack.querier("deep", |_| {}).await;
    for query in [
        format!("{}temp{}", "abs(".repeat(3_000), ")".repeat(3_000)),
        vec!["temp"; 3_000].join(" + "),
        format!("{}temp{}", "(".repeat(3_000), ")".repeat(3_000)),
    ] {
        let (status, body) = q.get(&instant_path(&query, &secs(50))).await;
        assert_eq!(status, 400, "{}: {body}", &query[..20]);
        assert!(body.contains("bad_data") && body.contains("the limit is 100"), "{body}");
    }
    let (status, body) = q.get(&instant_path(r#"abs(temp{cpu="0"})"#, &secs(50))).await;
    assert_eq!(values(status, &body)[0].1, ["5"], "{body}");
}
