//! Open + verify + first scan of one sealed log block: memory-mapped hot
//! block (cold verify cache, then warm), and the same block in the cold
//! tier, answering "newest 100 lines"; and the cold rewrite of that block.
//!
//! `cargo bench -p mira-core --bench open`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use mira_core::block::{Block, VerifyCache};
use mira_core::cold::rewrite_cold;
use mira_core::convert::{LogsBuilder, SignalBuilder};
use mira_core::scan::{ScanRequest, scan};
use mira_core::tables::write_hot;
use mira_core::{BlockId, TenantId};
use mira_testkit::corpus::{Cardinality, Corpus};

fn newest_100() -> ScanRequest {
    ScanRequest {
        limit: Some(100),
        ..Default::default()
    }
}

fn bench(c: &mut Criterion) {
    let mut corpus = Corpus::new(3, Cardinality::Low);
    let mut b = LogsBuilder::default();
    for _ in 0..32 {
        b.append(&corpus.logs(8192)).expect("append");
    }
    let tables = b.finish().expect("finish");
    let hot = write_hot(&tables, BlockId::new(), TenantId::default_tenant()).expect("hot");
    let cold = rewrite_cold(
        &Block::from_bytes(hot.clone(), Arc::new(VerifyCache::new(64))).expect("open"),
        BlockId::new(),
    )
    .expect("cold");
    let dir = tempfile::tempdir().expect("tempdir");
    let hot_path = dir.path().join("hot.mira");
    let cold_path = dir.path().join("cold.mira");
    std::fs::write(&hot_path, &hot).expect("write");
    std::fs::write(&cold_path, &cold).expect("write");

    let mut g = c.benchmark_group("open_verify_scan");
    g.sample_size(20);
    g.bench_function("hot_mmap_first_read", |bch| {
        bch.iter(|| {
            // A fresh cache: every section read is verified.
            let block = Block::open_file(&hot_path, Arc::new(VerifyCache::new(1024))).expect("open");
            black_box(scan(&block, &newest_100()).expect("scan").rows.len())
        })
    });
    let warm = Arc::new(VerifyCache::new(1024));
    g.bench_function("hot_mmap_verified", |bch| {
        bch.iter(|| {
            let block = Block::open_file(&hot_path, warm.clone()).expect("open");
            black_box(scan(&block, &newest_100()).expect("scan").rows.len())
        })
    });
    g.bench_function("cold_mmap_first_read", |bch| {
        bch.iter(|| {
            let block = Block::open_file(&cold_path, Arc::new(VerifyCache::new(1024))).expect("open");
            black_box(scan(&block, &newest_100()).expect("scan").rows.len())
        })
    });
    g.finish();

    let mut g = c.benchmark_group("cold_rewrite");
    g.sample_size(10);
    g.throughput(criterion::Throughput::Bytes(hot.len() as u64));
    let src = Block::from_bytes(hot.clone(), Arc::new(VerifyCache::new(64))).expect("open");
    g.bench_function("logs_block", |bch| {
        bch.iter(|| black_box(rewrite_cold(&src, BlockId::new()).expect("cold").len()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
