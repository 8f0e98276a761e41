//! The recent-data contract: a querier that merges the catalog's blocks
//! with an ingester's recent-data reply (as `proto/ingester.proto` says)
//! sees every acknowledged row exactly once, in a tight loop while the
//! ingester seals and publishes.

#[path = "support/common.rs"]
mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{block_bodies, post_log, published_logs, start, status};
use mira_catalog::proto as pb;
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

/// A recent-data request for every log row of the default tenant.
fn every_log() -> ipb::RecentRequest {
    ipb::RecentRequest {
        tenant: "default".into(),
        signal: 1,
        min_time_ns: 0,
        max_time_ns: i64::MAX,
    }
}

/// The `r-N` rows of every block in `listing`, decoded once per block id.
async fn catalog_rows(
    listing: &pb::ListBlocksReply,
    store: &TestStore,
    decoded: &mut HashMap<String, Vec<u64>>,
) -> Vec<u64> {
    let mut out = Vec::new();
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
        out.extend(&decoded[&b.id]);
    }
    out
}

type Sources = HashMap<u64, Vec<String>>;

/// A querier's merge: the catalog's rows plus the recent blocks not in
/// the listing; returns the rows, where each came from, and how many
/// recent blocks were skipped as already published.
async fn merge(
    listing: &pb::ListBlocksReply,
    recent: &[(String, Vec<u64>)],
    store: &TestStore,
    decoded: &mut HashMap<String, Vec<u64>>,
) -> (Vec<u64>, Sources, usize) {
    let in_catalog: HashSet<&str> = listing.blocks.iter().map(|b| b.id.as_str()).collect();
    let mut seen = catalog_rows(listing, store, decoded).await;
    let mut sources: Sources = HashMap::new();
    for b in &listing.blocks {
        for n in &decoded[&b.id] {
            sources.entry(*n).or_default().push(format!("catalog {}", b.id));
        }
    }
    let mut skipped = 0;
    for (id, r) in recent {
        if in_catalog.contains(id.as_str()) {
            skipped += 1;
            continue;
        }
        for n in r {
            sources.entry(*n).or_default().push(format!("recent {id:?}"));
        }
        seen.extend(r);
    }
    (seen, sources, skipped)
}

/// Every row at most once, every acknowledged row present.
fn check_once(round: usize, seen: &[u64], sources: &Sources, must_have: &HashSet<u64>) {
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for n in seen {
        *counts.entry(*n).or_default() += 1;
    }
    if let Some((n, c)) = counts.iter().find(|(_, c)| **c > 1) {
        panic!("round {round}: row r-{n} seen {c} times: {:?}", sources.get(n));
    }
    for n in must_have {
        assert!(
            counts.contains_key(n),
            "round {round}: acknowledged row r-{n} is missing"
        );
    }
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
                if status(&post_log(http, n, format!("r-{n}")).await) == 200 {
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
    let mut catch_ups = 0;
    while !sender.is_finished() || rounds < 5 {
        rounds += 1;
        let must_have: HashSet<u64> = acked.lock().expect("lock").clone();
        // A querier's copy of the catalog, taken before it asks (it may lag).
        let stale = published_logs(&client).await;
        let reply = recent.query(every_log()).await.expect("recent").into_inner();
        let reply_blocks: Vec<(String, Vec<u64>)> = reply
            .blocks
            .iter()
            .map(|rb| {
                assert!(
                    !rb.pending_block_id.is_empty(),
                    "every recent block names its future id"
                );
                (rb.pending_block_id.clone(), rows(bytes::Bytes::from(rb.block.clone())))
            })
            .collect();
        // The contract: rows that left the recent view before the reply are
        // in the catalog at the reply's version. If the stale copy and the
        // reply together miss an acknowledged row, the reply's version must
        // be newer than the stale copy, telling the querier to catch up.
        let stale_rows = catalog_rows(&stale, &store, &mut decoded).await;
        let covered: HashSet<u64> = stale_rows
            .iter()
            .copied()
            .chain(reply_blocks.iter().flat_map(|(_, r)| r.iter().copied()))
            .collect();
        if must_have.iter().any(|n| !covered.contains(n)) {
            assert!(
                reply.published_version > stale.version,
                "round {rounds}: acknowledged rows are in neither the catalog copy (version {}) nor the reply, whose version {} does not send the querier to catch up",
                stale.version,
                reply.published_version
            );
            catch_ups += 1;
        }
        // Catch up (a linearizable listing is at least the reply's
        // version), then merge: recent blocks already in the catalog (by
        // their pending id) are skipped.
        let listing = published_logs(&client).await;
        let (seen, sources, _) = merge(&listing, &reply_blocks, &store, &mut decoded).await;
        check_once(rounds, &seen, &sources, &must_have);
    }
    sender.await.expect("sender");
    assert!(store.multipart_uploads() > 0, "blocks were uploaded in parts");
    assert!(rounds > 5, "the loop ran alongside the sender");
    eprintln!("{rounds} rounds, {catch_ups} needed a catch-up");

    // The dedup branch, made to happen: with the store stalled, a sealed
    // generation is pending (in the reply, not in the catalog); once
    // released and published, a querier whose listing has it must skip the
    // reply's copy.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    store.set_writable(false);
    assert_eq!(status(&post_log(http, 9_999, "r-9999".into()).await), 200);
    let pending = loop {
        let reply = recent.query(every_log()).await.expect("recent").into_inner();
        let blocks: Vec<(String, Vec<u64>)> = reply
            .blocks
            .iter()
            .map(|rb| (rb.pending_block_id.clone(), rows(bytes::Bytes::from(rb.block.clone()))))
            .collect();
        let listing = published_logs(&client).await;
        let in_catalog: HashSet<&str> = listing.blocks.iter().map(|b| b.id.as_str()).collect();
        if blocks
            .iter()
            .any(|(id, r)| r.contains(&9_999) && !in_catalog.contains(id.as_str()))
        {
            break blocks;
        }
        assert!(std::time::Instant::now() < deadline, "r-9999 never showed as pending");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    store.set_writable(true);
    let listing = loop {
        let listing = published_logs(&client).await;
        let ids: HashSet<&str> = listing.blocks.iter().map(|b| b.id.as_str()).collect();
        if pending
            .iter()
            .any(|(id, r)| r.contains(&9_999) && ids.contains(id.as_str()))
        {
            break listing;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the pending block was never published"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let mut all: HashSet<u64> = acked.lock().expect("lock").clone();
    all.insert(9_999);
    let (seen, sources, skipped) = merge(&listing, &pending, &store, &mut decoded).await;
    assert!(skipped > 0, "the reply's copy of a published block was skipped");
    check_once(rounds + 1, &seen, &sources, &all);
    running.node.shutdown().await;
    running.catalog.shutdown().await;
}

/// Recent-data requests are bounded: many at once over a large open
/// generation get RESOURCE_EXHAUSTED past the slots (a querier reports
/// that as partial), the rest are answered whole, and the ingester keeps
/// answering afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recent_requests_past_the_slots_are_refused_as_resource_exhausted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(TestStore::new());
    let pipeline = PipelineConfig {
        shards: 1,
        queue_bytes: 64 << 20,
        admit_wait: Duration::from_secs(5),
        seal: SealPolicy {
            max_bytes: 1 << 30,
            max_age: Duration::from_secs(3600),
        },
        upload_queue: 2,
        limits: Default::default(),
        max_past: Duration::from_secs(7 * 86_400),
        max_future: Duration::from_secs(600),
    };
    let running = start(dir.path(), pipeline, 16 << 20, store).await;
    let (http, grpc) = (running.node.http_addr(), running.node.grpc_addr());
    // A large open generation: every recent request rebuilds it.
    let sends: Vec<_> = (0..4u64)
        .map(|w| {
            tokio::spawn(async move {
                for n in 0..1_000u64 {
                    let n = w * 1_000 + n;
                    assert_eq!(status(&post_log(http, n, format!("r-{n}")).await), 200);
                }
            })
        })
        .collect();
    for s in sends {
        s.await.expect("sender");
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let ask = || {
        let mut client = ipb::recent_client::RecentClient::new(channel.clone()).max_decoding_message_size(256 << 20);
        async move { client.query(every_log()).await }
    };
    let answers = futures::future::join_all((0..64).map(|_| ask())).await;
    let exhausted = answers
        .iter()
        .filter(|a| a.as_ref().is_err_and(|s| s.code() == tonic::Code::ResourceExhausted))
        .count();
    let whole = answers
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .filter(|r| {
            r.get_ref()
                .blocks
                .iter()
                .map(|b| rows(bytes::Bytes::from(b.block.clone())).len())
                .sum::<usize>()
                == 4_000
        })
        .count();
    eprintln!("{exhausted} of 64 requests refused, {whole} answered whole");
    assert!(exhausted > 0, "64 requests at once never found the slots taken");
    assert_eq!(exhausted + whole, 64, "every other answer is whole");
    // Slots come back.
    let again = ask().await.expect("answered once the burst is over");
    assert!(!again.get_ref().blocks.is_empty());
    running.node.shutdown().await;
    running.catalog.shutdown().await;
}
