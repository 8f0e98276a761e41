//! The catalog reads what an earlier release wrote: a Raft log (redb) and a
//! snapshot written by the catalog as of 2026-12-03 (before ingester epochs,
//! staged publishes and the fenced publish command were added) are opened
//! by today's code and every record reads back exactly as that release
//! listed it (`expected.txt`, dumped by that release from the same files).

use std::time::Duration;

use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, CatalogNode, ClientConfig, NodeConfig};

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read fixture") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != "expected.txt" {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Every record, one line each, in the form the fixture's `expected.txt` holds.
async fn dump(c: &CatalogClient) -> String {
    let mut out = String::new();
    for tenant in ["t", "u"] {
        let r = c
            .list_blocks(pb::ListBlocksRequest {
                tenant: tenant.into(),
                signal: pb::Signal::Logs as i32,
                min_time_ns: 0,
                max_time_ns: i64::MAX,
                states: vec![1, 2, 3],
                linearizable: true,
                ..Default::default()
            })
            .await
            .expect("list");
        for b in r.blocks {
            out += &format!(
                "block {} {} {} {} {} {} {} {} {} {} {} {} {} {}\n",
                b.id,
                b.tenant,
                b.signal,
                b.partition_start_ns,
                b.min_time_ns,
                b.max_time_ns,
                b.rows,
                b.bytes,
                b.level,
                b.object_key,
                b.created_at_ns,
                b.state,
                b.offload_location,
                b.tombstoned_at_ns
            );
        }
    }
    let marks = c
        .get_watermarks(pb::GetWatermarksRequest::default())
        .await
        .expect("watermarks");
    for w in marks.watermarks {
        out += &format!("watermark {} {} {}\n", w.ingester_id, w.shard, w.wal_seq);
    }
    let policies = c
        .list_policies(pb::ListPoliciesRequest::default())
        .await
        .expect("policies");
    for p in policies.policies {
        out += &format!("policy {} {} {} {}\n", p.kind, p.name, p.tenant, p.body_json);
    }
    for l in c
        .list_leases(pb::ListLeasesRequest::default())
        .await
        .expect("leases")
        .leases
    {
        out += &format!("lease {} {} {}\n", l.key, l.holder, l.expires_at_ns);
    }
    let ingesters = c
        .list_ingesters(pb::ListIngestersRequest {
            now_ns: 1,
            linearizable: true,
            ..Default::default()
        })
        .await
        .expect("ingesters");
    for i in ingesters.ingesters {
        out += &format!("ingester {} {} {}\n", i.ingester_id, i.address, i.expires_at_ns);
    }
    out
}

#[tokio::test]
async fn log_and_snapshot_of_the_2026_12_03_release_read_back_exactly() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/catalog-2026-12-03");
    let expected = std::fs::read_to_string(fixture.join("expected.txt")).expect("expected.txt");
    let dir = tempfile::tempdir().expect("tempdir");
    copy_dir(&fixture, dir.path());
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let node = CatalogNode::start(
        NodeConfig::single(addr, dir.path().to_path_buf()),
        &mira_common::Process::default(),
    )
    .await
    .expect("start on the old files");
    node.wait_for_leader(Duration::from_secs(20)).await.expect("leader");
    let c = CatalogClient::new(vec![addr.to_string()], ClientConfig::default());
    let got = dump(&c).await;
    assert_eq!(got, expected);
    // The old files came with a snapshot and log entries after it: both
    // were read (45 records, 30 publishes, then replace/tombstone/purge...).
    let status = c.status().await.expect("status");
    assert!(status.snapshot_index > 0, "the old snapshot was loaded");
    assert!(
        status.applied_index > status.snapshot_index,
        "log entries after the snapshot were applied"
    );
    node.shutdown().await;
}
