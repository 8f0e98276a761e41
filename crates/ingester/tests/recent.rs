//! The recent-data contract: a querier that merges the catalog's blocks
//! with an ingester's recent-data reply (as `proto/ingester.proto` says)
//! sees every acknowledged row exactly once, in a tight loop while the
//! ingester seals and publishes.

#[path = "support/common.rs"]
mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{block_bodies, log_export, post, published_logs, start, status};
use mira_ingester::PipelineConfig;
use mira_ingester::shard::SealPolicy;
use mira_proto::ingester as ipb;
use mira_testkit::store::TestStore;
use object_store::ObjectStoreExt;

/// Every block goes up in parts here (the multipart path under the contract).
const MULTIPART_ABOVE: usize = 0;

/// The `r-N` numbers in a block's bytes.
fn rows(bytes: bytes::Bytes) -> Vec<u64> {
    block_bodies(bytes)
        .iter()
        .filter_map(|s| s.strip_prefix("r-").and_then(|n| n.parse().ok()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_plus_recent_data_has_every_acknowledged_row_once_across_seals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(TestStore::new());
    let pipeline = PipelineConfig {
        shards: 2,
        queue_bytes: 1 << 20,
        admit_wait: Duration::from_secs(5),
        // Seal often: every few exports or 50 ms.
        seal: SealPolicy {
            max_bytes: 4_000,
            max_age: Duration::from_millis(50),
        },
        upload_queue: 2,
        limits: Default::default(),
        max_past: Duration::from_secs(7 * 86_400),
        max_future: Duration::from_secs(600),
    };
    let running = start(dir.path(), pipeline, MULTIPART_ABOVE, store.clone()).await;
    let (node, client) = (&running.node, running.client.clone());
    let (http, grpc) = (node.http_addr(), node.grpc_addr());

    let acked = Arc::new(Mutex::new(HashSet::new()));
    let sender = {
        let acked = acked.clone();
        tokio::spawn(async move {
            for n in 0..600u64 {
                if status(&post(http, &log_export(n, format!("r-{n}"))).await) == 200 {
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
        let listing = published_logs(&client).await;
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
    running.node.shutdown().await;
    running.catalog.shutdown().await;
}
