//! Catalog figures: publish commands/s on a local 3-member cluster (real
//! sockets, one process), list latency at 100k blocks, snapshot size and
//! build time at 100k and 1M blocks. Each figure is printed beside a
//! baseline measured in the same run:
//! - publishes against the durable-commit rate of the redb log alone,
//! - the index list against a linear scan of every block,
//! - snapshot bytes against the uncompressed encoding.
//!
//! `cargo bench -p mira-catalog --bench catalog` (MIRA_BENCH_QUICK=1 for a
//! short run).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mira_catalog::model::{BlockRecord, BlockState, Command, Level, StateKind};
use mira_catalog::proto as pb;
use mira_catalog::state::State;
use mira_catalog::state_machine::encode_image;
use mira_catalog::{CatalogClient, CatalogNode, ClientConfig, NodeConfig};
use mira_core::block::path::block_path;
use mira_core::ids::{BlockId, Signal, TenantId};
use mira_testkit::EPOCH_NS;
use mira_testkit::net::free_port;

const HOUR: i64 = 3_600_000_000_000;
const DAY: i64 = 24 * HOUR;

fn quick() -> bool {
    std::env::var_os("MIRA_BENCH_QUICK").is_some()
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn record(seq: u64, tenant: &str, min: i64) -> BlockRecord {
    // A ULID as an ingester makes it: 48 bits of milliseconds, 80 random.
    let random = (u128::from(splitmix(seq)) << 16 | u128::from(splitmix(!seq) as u16)) & ((1u128 << 80) - 1);
    let id = ((min / 1_000_000) as u128) << 80 | random;
    let id = BlockId::from_u128(id);
    let tenant = TenantId::new(tenant).expect("tenant");
    let key = block_path(&tenant, Signal::Logs, min as u64, id);
    BlockRecord {
        id,
        tenant,
        signal: Signal::Logs,
        partition_start_ns: min - min % HOUR,
        min_time_ns: min,
        max_time_ns: min + 290_000_000_000,
        rows: 250_000,
        bytes: 32 << 20,
        level: Level::Hot,
        object_key: key.to_string(),
        created_at_ns: min + 300_000_000_000,
        state: BlockState::Live,
        no_compact: None,
        offload: None,
    }
}

/// `n` blocks of one tenant/signal spread evenly over 30 days.
fn state_with(n: u64) -> State {
    let mut s = State::new();
    let step = 30 * DAY / n as i64;
    let mut batch = Vec::new();
    for i in 0..n {
        batch.push(record(i, "acme", EPOCH_NS + i as i64 * step));
        if batch.len() == 10_000 {
            s.apply(&Command::Publish {
                blocks: std::mem::take(&mut batch),
                watermark: None,
            })
            .expect("publish");
        }
    }
    if !batch.is_empty() {
        s.apply(&Command::Publish {
            blocks: batch,
            watermark: None,
        })
        .expect("publish");
    }
    s
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn bench_list() {
    let s = state_with(100_000);
    let day_start = EPOCH_NS + 10 * DAY;
    let day_end = day_start + DAY - 1;
    let image = s.to_image();
    let runs = if quick() { 20 } else { 200 };
    let mut indexed = Vec::new();
    let mut scanned = Vec::new();
    let mut found = 0;
    let acme = TenantId::new("acme").expect("tenant");
    for _ in 0..runs {
        let t = Instant::now();
        found = s
            .list_blocks(&acme, Signal::Logs, day_start, day_end, &[StateKind::Live])
            .len();
        indexed.push(t.elapsed());
        let t = Instant::now();
        let n = image
            .blocks
            .iter()
            .filter(|b| b.tenant == acme && b.max_time_ns >= day_start && b.min_time_ns <= day_end)
            .count();
        scanned.push(t.elapsed());
        assert_eq!(n, found);
    }
    let (i, sc) = (median(indexed), median(scanned));
    println!(
        "list one tenant/signal/day at 100k blocks ({found} returned): index {:.3} ms, linear scan {:.3} ms, ratio {:.3}",
        i.as_secs_f64() * 1e3,
        sc.as_secs_f64() * 1e3,
        i.as_secs_f64() / sc.as_secs_f64()
    );
}

fn bench_snapshot() {
    let sizes: &[u64] = if quick() { &[100_000] } else { &[100_000, 1_000_000] };
    for &n in sizes {
        let s = state_with(n);
        let t = Instant::now();
        let image = s.to_image();
        let copy = t.elapsed();
        let t = Instant::now();
        let bytes = encode_image(&image).expect("encode");
        let encode = t.elapsed();
        let raw = postcard::to_stdvec(&image).expect("raw").len();
        let t = Instant::now();
        let back = mira_catalog::state_machine::decode_image(&bytes).expect("decode");
        let decode = t.elapsed();
        let t = Instant::now();
        let rebuilt = State::from_image(back);
        let load = t.elapsed();
        assert_eq!(rebuilt.block_count() as u64, n);
        println!(
            "snapshot at {n} blocks: {:.1} MiB ({:.1} B/block; uncompressed {:.1} MiB, ratio {:.3}); copy under lock {:.0} ms, encode {:.0} ms, decode {:.0} ms, rebuild {:.0} ms",
            bytes.len() as f64 / 1048576.0,
            bytes.len() as f64 / n as f64,
            raw as f64 / 1048576.0,
            bytes.len() as f64 / raw as f64,
            copy.as_secs_f64() * 1e3,
            encode.as_secs_f64() * 1e3,
            decode.as_secs_f64() * 1e3,
            load.as_secs_f64() * 1e3
        );
    }
}

/// Durable single-entry commits per second on the same disk: the floor a
/// Raft log with one fsync per append would reach without batching.
fn redb_commit_rate(dir: &std::path::Path) -> f64 {
    let db = redb::Database::create(dir.join("baseline.redb")).expect("db");
    let table: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("t");
    let n = if quick() { 200 } else { 1_000 };
    let payload = vec![7u8; 200];
    let t = Instant::now();
    for i in 0..n {
        let txn = db.begin_write().expect("txn");
        txn.open_table(table)
            .expect("table")
            .insert(i, payload.as_slice())
            .expect("insert");
        txn.commit().expect("commit");
    }
    f64::from(n as u32) / t.elapsed().as_secs_f64()
}

fn pb_block(seq: u64) -> pb::Block {
    mira_catalog::testing::block("acme", EPOCH_NS + seq as i64 * 1_000_000, 1)
}

async fn bench_publish() {
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = {
        let d = dir.path().to_path_buf();
        tokio::task::spawn_blocking(move || redb_commit_rate(&d))
            .await
            .expect("baseline")
    };
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let peers: BTreeMap<u64, String> = (0..3).map(|i| (i as u64, format!("127.0.0.1:{}", ports[i]))).collect();
    let mut nodes = Vec::new();
    for i in 0..3u64 {
        let mut config = NodeConfig::single(
            format!("127.0.0.1:{}", ports[i as usize]).parse().expect("addr"),
            dir.path().join(format!("m{i}")),
        );
        config.node_id = i;
        config.peers = peers.clone();
        nodes.push(
            CatalogNode::start(config, &mira_common::Process::default())
                .await
                .expect("start"),
        );
    }
    for n in &nodes {
        n.wait_for_leader(Duration::from_secs(30)).await.expect("leader");
    }
    let client = Arc::new(CatalogClient::new(
        peers.values().cloned().collect(),
        ClientConfig::default(),
    ));
    let total: u64 = if quick() { 2_000 } else { 20_000 };
    for (label, conns, batch) in [
        ("unbatched, 1 client", 1u64, 1u64),
        ("unbatched, 32 clients", 32, 1),
        ("batched 100/command, 4 clients", 4, 100),
    ] {
        let per = total / conns / batch;
        let t = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..conns {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                for k in 0..per {
                    let blocks = (0..batch).map(|j| pb_block((c * per + k) * batch + j)).collect();
                    client.publish(blocks, None).await.expect("publish");
                }
            }));
        }
        for task in tasks {
            task.await.expect("task");
        }
        let secs = t.elapsed().as_secs_f64();
        let commands = (per * conns) as f64 / secs;
        let blocks = (per * conns * batch) as f64 / secs;
        println!(
            "publish on 3 members ({label}): {commands:.0} commands/s, {blocks:.0} blocks/s; redb durable commits alone {floor:.0}/s, ratio {:.2}",
            commands / floor
        );
    }
    for n in nodes {
        n.shutdown().await;
    }
}

async fn bench_list_grpc() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let node = CatalogNode::start(
        NodeConfig::single(addr, dir.path().to_path_buf()),
        &mira_common::Process::default(),
    )
    .await
    .expect("start");
    node.wait_for_leader(Duration::from_secs(30)).await.expect("leader");
    let client = CatalogClient::new(vec![addr.to_string()], ClientConfig::default());
    let n = 100_000u64;
    let step = 30 * DAY as u64 / n;
    for chunk in 0..n / 5_000 {
        let blocks = (0..5_000)
            .map(|i| pb_block((chunk * 5_000 + i) * step / 1_000_000))
            .collect();
        client.publish(blocks, None).await.expect("publish");
    }
    let day_start = EPOCH_NS + 10 * DAY;
    let runs = if quick() { 20 } else { 100 };
    let mut times = Vec::new();
    let mut found = 0;
    for _ in 0..runs {
        let t = Instant::now();
        found = client
            .list_blocks(pb::ListBlocksRequest {
                tenant: "acme".into(),
                signal: pb::Signal::Logs as i32,
                min_time_ns: day_start,
                max_time_ns: day_start + DAY - 1,
                states: vec![],
                linearizable: false,
                ..Default::default()
            })
            .await
            .expect("list")
            .blocks
            .len();
        times.push(t.elapsed());
    }
    println!(
        "list one tenant/signal/day at 100k blocks over gRPC ({found} returned): {:.2} ms median",
        median(times).as_secs_f64() * 1e3
    );
    node.shutdown().await;
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing we need.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    bench_list();
    bench_snapshot();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(bench_list_grpc());
    rt.block_on(bench_publish());
}
