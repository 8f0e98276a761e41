//! Test support: the same tables through every storage path.

use std::sync::Arc;

use mira_core::block::{Block, VerifyCache};
use mira_core::cold::rewrite_cold;
use mira_core::convert::TableSet;
use mira_core::tables::{read_tables, write_hot};
use mira_core::{BlockId, TenantId};

pub fn cache() -> Arc<VerifyCache> {
    Arc::new(VerifyCache::new(256))
}

/// (hot block, cold block) for the tables.
pub fn hot_and_cold(tables: &TableSet) -> (Block, Block) {
    let hot = write_hot(tables, BlockId::new(), TenantId::default_tenant()).expect("write hot");
    let hot = Block::from_bytes(hot, cache()).expect("open hot");
    let cold = rewrite_cold(&hot, BlockId::new()).expect("rewrite cold");
    let cold = Block::from_bytes(cold, cache()).expect("open cold");
    (hot, cold)
}

/// The tables as built, as read back from a hot block, and from a cold one.
pub fn through_blocks(tables: &TableSet) -> Vec<TableSet> {
    let (hot, cold) = hot_and_cold(tables);
    vec![
        tables.clone(),
        read_tables(&hot, None).expect("read hot"),
        read_tables(&cold, None).expect("read cold"),
    ]
}
