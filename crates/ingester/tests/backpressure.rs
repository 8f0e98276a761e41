//! Backpressure: with a tiny queue and a stalled object store, exports
//! park, then are refused with 429 (Retry-After); once the store recovers,
//! every acknowledged export is published and nothing else.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, CatalogNode, ClientConfig, NodeConfig};
use mira_ingester::otlp::ReceiverConfig;
use mira_ingester::shard::SealPolicy;
use mira_ingester::{IngesterConfig, IngesterNode, PipelineConfig, WalMode};
use mira_testkit::store::TestStore;
use object_store::ObjectStoreExt;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MULTIPART_ABOVE: usize = 16 << 20;

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

fn request(n: u64) -> Vec<u8> {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord {
                    time_unix_nano: 1_796_169_600_000_000_000 + n,
                    body: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(format!("bp-{n} {}", "x".repeat(4000)))),
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

/// POST one export; the status and the Retry-After header.
async fn post(addr: SocketAddr, body: &[u8]) -> (u16, Option<String>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /v1/logs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write");
    s.write_all(body).await.expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    let status = out.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let retry = out
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("retry-after:"))
        .map(|l| l[12..].trim().to_owned());
    (status, retry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_store_parks_then_refuses_and_loses_nothing_admitted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog_addr = free_addr();
    let catalog = CatalogNode::start(NodeConfig::single(catalog_addr, dir.path().join("catalog")))
        .await
        .expect("catalog");
    catalog.wait_for_leader(Duration::from_secs(20)).await.expect("leader");
    let client = Arc::new(CatalogClient::new(
        vec![catalog_addr.to_string()],
        ClientConfig::default(),
    ));
    let store = Arc::new(TestStore::new());
    store.set_writable(false);
    let config = IngesterConfig {
        ingester_id: "bp".into(),
        grpc_listen: free_addr(),
        http_listen: free_addr(),
        advertise: "127.0.0.1:1".into(),
        data_dir: dir.path().join("ingester"),
        wal_mode: WalMode::PageCache,
        pipeline: PipelineConfig {
            shards: 1,
            // About three requests' worth of queue.
            queue_bytes: 12_500,
            admit_wait: Duration::from_millis(300),
            // Seal after every request; one sealed generation may wait.
            seal: SealPolicy {
                max_bytes: 1,
                max_age: Duration::from_secs(3600),
            },
            upload_queue: 1,
        },
        receivers: ReceiverConfig::default(),
        lease_ttl: Duration::from_secs(15),
        multipart_above: MULTIPART_ABOVE,
    };
    let node = IngesterNode::start(config, client.clone(), store.clone())
        .await
        .expect("ingester");
    let http = node.http_addr();

    // Far more exports than the stalled pipeline can hold.
    let tasks: Vec<_> = (0..30u64)
        .map(|n| tokio::spawn(async move { (n, post(http, &request(n)).await) }))
        .collect();
    // Wait until the refusals have come back (those that parked past the
    // admission wait), then let the store recover.
    let mut done = Vec::new();
    let mut pending = Vec::new();
    for t in tasks {
        pending.push(t);
    }
    let mut refused = 0;
    while refused == 0 {
        let mut still = Vec::new();
        for t in pending {
            if t.is_finished() {
                let (n, (status, retry)) = t.await.expect("task");
                if status == 429 {
                    refused += 1;
                    assert_eq!(retry.as_deref(), Some("1"), "429 carries Retry-After");
                }
                done.push((n, status));
            } else {
                still.push(t);
            }
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !pending.is_empty(),
        "some exports must still be parked behind the stalled store"
    );
    store.set_writable(true);
    for t in pending {
        let (n, (status, _)) = t.await.expect("task");
        done.push((n, status));
    }
    assert!(
        done.iter().all(|(_, s)| *s == 200 || *s == 429),
        "only 200 or 429: {done:?}"
    );
    let acked: HashSet<u64> = done.iter().filter(|(_, s)| *s == 200).map(|(n, _)| *n).collect();
    assert!(!acked.is_empty());
    node.shutdown().await;

    // Everything acknowledged is published, once; nothing refused is.
    let blocks = client
        .list_blocks(pb::ListBlocksRequest {
            tenant: "default".into(),
            signal: pb::Signal::Logs as i32,
            min_time_ns: 0,
            max_time_ns: i64::MAX,
            states: vec![],
            linearizable: true,
        })
        .await
        .expect("list")
        .blocks;
    let cache = Arc::new(mira_core::block::VerifyCache::new(64));
    let mut seen = Vec::new();
    for b in blocks {
        let bytes = store
            .get(&object_store::path::Path::from(b.object_key.as_str()))
            .await
            .expect("object")
            .bytes()
            .await
            .expect("bytes");
        let block = mira_core::block::Block::from_bytes(bytes, cache.clone()).expect("block");
        let req = mira_core::convert::logs_to_otlp(&mira_core::tables::read_tables(&block, None).expect("tables"))
            .expect("otlp");
        for r in req
            .resource_logs
            .iter()
            .flat_map(|r| &r.scope_logs)
            .flat_map(|s| &s.log_records)
        {
            if let Some(any_value::Value::StringValue(s)) = r.body.as_ref().and_then(|b| b.value.as_ref())
                && let Some(n) = s
                    .strip_prefix("bp-")
                    .and_then(|s| s.split(' ').next())
                    .and_then(|n| n.parse::<u64>().ok())
            {
                seen.push(n);
            }
        }
    }
    seen.sort_unstable();
    let mut want: Vec<u64> = acked.into_iter().collect();
    want.sort_unstable();
    assert_eq!(seen, want, "published exactly the acknowledged exports");
    catalog.shutdown().await;
}
