//! The on-disk format is pinned: a fixed request written as a hot and a cold
//! block must give the manifests recorded in `golden/`. A change to the
//! layout, a schema, a codec setting or a sidecar shows up here and has to
//! be made on purpose: rerun with `MIRA_BLESS=1` to rewrite the files, and
//! bump `FORMAT_VERSION` / `SCHEMA_VERSION` when old blocks no longer read.

use std::fmt::Write;
use std::sync::Arc;

use mira_core::block::{Block, VerifyCache};
use mira_core::cold::rewrite_cold;
use mira_core::convert::{LogsBuilder, SignalBuilder};
use mira_core::tables::write_hot;
use mira_core::{BlockId, TenantId};
use mira_testkit::corpus::{Cardinality, Corpus};

fn manifest_text(block: &Block) -> String {
    let m = block.manifest();
    let meta = m.meta();
    let mut out = format!(
        "block {} tenant {} signal {} level {} rows {} time {}..={} schema {} bytes {}\n",
        meta.block_id,
        meta.tenant,
        meta.signal,
        meta.level,
        meta.rows,
        meta.min_time,
        meta.max_time,
        meta.schema_version,
        block.data().len()
    );
    for s in &m.sections {
        let _ = writeln!(
            out,
            "{:<16} {:<8} offset {:>8} length {:>7} rows {:>5} crc {:08x}",
            s.name, s.codec, s.offset, s.length, s.rows, s.crc32
        );
    }
    out
}

fn check(name: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("MIRA_BLESS").is_some() {
        std::fs::write(&path, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        actual, expected,
        "{name} changed; rerun with MIRA_BLESS=1 if that is intended"
    );
}

#[test]
fn block_layout_is_pinned() {
    let req = Corpus::new(99, Cardinality::Low).logs(500);
    let mut b = LogsBuilder::default();
    b.append(&req).expect("append");
    let tables = b.finish().expect("finish");
    let tenant = TenantId::new("golden").expect("tenant");
    let hot = write_hot(&tables, BlockId::from_u128(1), tenant).expect("hot");
    let hot = Block::from_bytes(hot, Arc::new(VerifyCache::new(16))).expect("open hot");
    check("logs_hot.txt", &manifest_text(&hot));
    let cold = rewrite_cold(&hot, BlockId::from_u128(2)).expect("cold");
    let cold = Block::from_bytes(cold, Arc::new(VerifyCache::new(16))).expect("open cold");
    check("logs_cold.txt", &manifest_text(&cold));
}
