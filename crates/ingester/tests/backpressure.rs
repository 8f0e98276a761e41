//! Backpressure: with a tiny queue and a stalled object store, exports
//! park, then are refused with 429 (Retry-After); once the store recovers,
//! every acknowledged export is published and nothing else.

#[path = "support/common.rs"]
mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::{post_log, published_bodies, start, status};
use mira_ingester::PipelineConfig;
use mira_ingester::shard::SealPolicy;
use mira_testkit::store::TestStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_store_parks_then_refuses_and_loses_nothing_admitted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(TestStore::new());
    store.set_writable(false);
    let pipeline = PipelineConfig {
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
        limits: Default::default(),
        max_past: Duration::from_secs(7 * 86_400),
        max_future: Duration::from_secs(600),
    };
    let running = start(dir.path(), pipeline, 16 << 20, store.clone()).await;
    let http = running.node.http_addr();

    // Far more exports than the stalled pipeline can hold.
    let mut pending: Vec<_> = (0..30u64)
        .map(|n| tokio::spawn(async move { (n, post_log(http, n, format!("bp-{n} {}", "x".repeat(4000))).await) }))
        .collect();
    // Wait until the refusals have come back (those that parked past the
    // admission wait), then let the store recover.
    let mut done = Vec::new();
    let mut refused = 0;
    while refused == 0 {
        let mut still = Vec::new();
        for t in pending {
            if t.is_finished() {
                let (n, response) = t.await.expect("task");
                if status(&response) == 429 {
                    refused += 1;
                    let retry = response.as_ref().and_then(|r| r.header("retry-after"));
                    assert_eq!(retry, Some("1"), "429 carries Retry-After");
                }
                done.push((n, status(&response)));
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
        let (n, response) = t.await.expect("task");
        done.push((n, status(&response)));
    }
    assert!(
        done.iter().all(|(_, s)| *s == 200 || *s == 429),
        "only 200 or 429: {done:?}"
    );
    let acked: HashSet<u64> = done.iter().filter(|(_, s)| *s == 200).map(|(n, _)| *n).collect();
    assert!(!acked.is_empty());
    running.node.shutdown().await;

    // Everything acknowledged is published, once; nothing refused is.
    let mut seen: Vec<u64> = published_bodies(&running.client, &store)
        .await
        .iter()
        .filter_map(|body| {
            body.strip_prefix("bp-")
                .and_then(|s| s.split(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
        })
        .collect();
    seen.sort_unstable();
    let mut want: Vec<u64> = acked.into_iter().collect();
    want.sort_unstable();
    assert_eq!(seen, want, "published exactly the acknowledged exports");
    running.catalog.shutdown().await;
}
