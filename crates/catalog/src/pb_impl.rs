//! The mapping between the catalog's records and the gRPC messages of
//! `proto/catalog.proto` (after openraft's `raft-kv-memstore-grpc`
//! example): one file per type, each a `From` (record to message) and,
//! where a message comes in, a `TryFrom` that names the bad field.

pub mod block;
pub mod block_id;
pub mod change;
pub mod command;
pub mod ingester_lease;
pub mod lease;
pub mod policy;
pub mod signal;
pub mod watermark;

/// The start of an untrusted string, for an error message.
fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}
