//! The recent-data contract: a querier that merges the catalog's blocks
//! with an ingester's recent-data reply (as `proto/ingester.proto` says)
//! sees every acknowledged row exactly once, in a tight loop while the
//! ingester seals and publishes.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, CatalogNode, ClientConfig, NodeConfig};
use mira_ingester::otlp::ReceiverConfig;
use mira_ingester::shard::SealPolicy;
use mira_ingester::{IngesterConfig, IngesterNode, PipelineConfig, WalMode};
use mira_proto::ingester as ipb;
use mira_testkit::store::TestStore;
use object_store::ObjectStoreExt;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every block goes up in parts here (the multipart path under the contract).
const MULTIPART_ABOVE: usize = 0;

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

async fn post(addr: SocketAddr, body: &[u8]) -> u16 {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return 0;
    };
    let head = format!(
        "POST /v1/logs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).await.is_err() || s.write_all(body).await.is_err() {
        return 0;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The `r-N` numbers in a block's bytes.
fn rows(bytes: bytes::Bytes) -> Vec<u64> {
    let cache = Arc::new(mira_core::block::VerifyCache::new(16));
    let block = mira_core::block::Block::from_bytes(bytes, cache).expect("block");
    let req =
        mira_core::convert::logs_to_otlp(&mira_core::tables::read_tables(&block, None).expect("tables")).expect("otlp");
    req.resource_logs
        .iter()
        .flat_map(|r| &r.scope_logs)
        .flat_map(|s| &s.log_records)
        .filter_map(|r| match r.body.as_ref().and_then(|b| b.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => s.strip_prefix("r-").and_then(|n| n.parse().ok()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_plus_recent_data_has_every_acknowledged_row_once_across_seals() {
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
    let config = IngesterConfig {
        ingester_id: "recent".into(),
        grpc_listen: free_addr(),
        http_listen: free_addr(),
        advertise: "127.0.0.1:1".into(),
        data_dir: dir.path().join("ingester"),
        wal_mode: WalMode::PageCache,
        pipeline: PipelineConfig {
            shards: 2,
            queue_bytes: 1 << 20,
            admit_wait: Duration::from_secs(5),
            // Seal often: every few exports or 50 ms.
            seal: SealPolicy {
                max_bytes: 4_000,
                max_age: Duration::from_millis(50),
            },
            upload_queue: 2,
        },
        receivers: ReceiverConfig::default(),
        lease_ttl: Duration::from_secs(15),
        multipart_above: MULTIPART_ABOVE,
    };
    let node = IngesterNode::start(config, client.clone(), store.clone())
        .await
        .expect("ingester");
    let (http, grpc) = (node.http_addr(), node.grpc_addr());

    let acked = Arc::new(Mutex::new(HashSet::new()));
    let sender = {
        let acked = acked.clone();
        tokio::spawn(async move {
            for n in 0..600u64 {
                if post(http, &request(n)).await == 200 {
                    acked.lock().expect("lock").insert(n);
                }
            }
        })
    };
    let mut recent = ipb::recent_client::RecentClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    let mut decoded: HashMap<String, Vec<u64>> = HashMap::new();
    let mut rounds = 0;
    let mut saw_published_meanwhile = false;
    while !sender.is_finished() || rounds < 5 {
        rounds += 1;
        let must_have: HashSet<u64> = acked.lock().expect("lock").clone();
        let reply = recent
            .query(ipb::RecentRequest {
                tenant: "default".into(),
                signal: 1,
                min_time_ns: 0,
                max_time_ns: i64::MAX,
            })
            .await
            .expect("recent")
            .into_inner();
        // The querier's catalog view must have reached the reply's version.
        let listing = client
            .list_blocks(pb::ListBlocksRequest {
                tenant: "default".into(),
                signal: pb::Signal::Logs as i32,
                min_time_ns: 0,
                max_time_ns: i64::MAX,
                states: vec![],
                linearizable: true,
            })
            .await
            .expect("list");
        assert!(listing.version >= reply.published_version);
        let in_catalog: HashSet<&str> = listing.blocks.iter().map(|b| b.id.as_str()).collect();
        let mut seen: Vec<u64> = Vec::new();
        let mut sources: HashMap<u64, Vec<String>> = HashMap::new();
        for b in &listing.blocks {
            if !decoded.contains_key(&b.id) {
                let bytes = store
                    .get(&object_store::path::Path::from(b.object_key.as_str()))
                    .await
                    .expect("published object")
                    .bytes()
                    .await
                    .expect("bytes");
                decoded.insert(b.id.clone(), rows(bytes));
            }
            seen.extend(&decoded[&b.id]);
            for n in &decoded[&b.id] {
                sources.entry(*n).or_default().push(format!("catalog {}", b.id));
            }
        }
        for rb in reply.blocks {
            assert!(
                !rb.pending_block_id.is_empty(),
                "every recent block names its future id"
            );
            if in_catalog.contains(rb.pending_block_id.as_str()) {
                saw_published_meanwhile = true;
                continue;
            }
            let r = rows(bytes::Bytes::from(rb.block));
            for n in &r {
                sources
                    .entry(*n)
                    .or_default()
                    .push(format!("recent {:?}", rb.pending_block_id));
            }
            seen.extend(r);
        }
        let mut counts: HashMap<u64, usize> = HashMap::new();
        for n in &seen {
            *counts.entry(*n).or_default() += 1;
        }
        if let Some((n, c)) = counts.iter().find(|(_, c)| **c > 1) {
            panic!("round {rounds}: row r-{n} seen {c} times: {:?}", sources.get(n));
        }
        for n in &must_have {
            assert!(
                counts.contains_key(n),
                "round {rounds}: acknowledged row r-{n} is missing"
            );
        }
    }
    sender.await.expect("sender");
    assert!(store.multipart_uploads() > 0, "blocks were uploaded in parts");
    assert!(rounds > 5, "the loop ran alongside the sender");
    // (Whether a block was published between a reply and the listing
    // depends on timing; the assertions above hold either way.)
    let _ = saw_published_meanwhile;
    node.shutdown().await;
    catalog.shutdown().await;
}
