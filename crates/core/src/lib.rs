//! `mira-core` owns what every Mira role shares: the data model (OTLP
//! signals as Arrow tables), the conversion both ways between OTLP and
//! Arrow, the block format (one immutable object per block: Arrow IPC or
//! Parquet sections, a CRC-checked manifest), the pruning sidecars,
//! query evaluation over one block, and the retention and offload policy
//! body with its validation and rule resolution (`policy`). It depends on
//! no role crate.

pub mod attrs;
pub mod block;
pub mod cluster;
pub mod cold;
pub mod compact;
pub mod convert;
pub mod decoded;
pub mod dict;
pub mod error;
pub mod ids;
pub mod lineage;
pub mod policy;
pub mod scan;
pub mod schema;
pub mod sidecar;
pub mod store;
pub mod tables;
pub mod wal;

pub use error::Error;
pub use ids::{BlockId, Signal, TenantId};
