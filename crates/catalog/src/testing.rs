//! Helpers for tests and benchmarks of the catalog and its users: a
//! publishable block with a fresh id.

use mira_core::block::path::block_path;
use mira_core::ids::{BlockId, Signal, TenantId};
use mira_proto::catalog as pb;

/// A valid logs block of `tenant` starting at `min_time_ns` (which must be
/// ≥ 0) and lasting `span_ns`, with a fresh ULID and its canonical key.
pub fn block(tenant: &str, min_time_ns: i64, span_ns: i64) -> pb::Block {
    let id = BlockId::new();
    let key = TenantId::new(tenant)
        .map(|t| block_path(&t, Signal::Logs, min_time_ns.max(0) as u64, id).to_string())
        .unwrap_or_default();
    pb::Block {
        id: id.to_string(),
        tenant: tenant.to_owned(),
        signal: pb::Signal::Logs as i32,
        min_time_ns,
        max_time_ns: min_time_ns + span_ns,
        rows: 1,
        bytes: 1,
        level: pb::Level::Hot as i32,
        object_key: key,
        created_at_ns: min_time_ns,
        ..Default::default()
    }
}
