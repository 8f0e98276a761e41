//! mira-ingester: the write path. It owns the write-ahead log ([`wal`]),
//! request-body handling ([`body`]: content encodings with bounded
//! decompression), the shards with their open generations ([`shard`]), the
//! uploader that writes and publishes sealed blocks ([`upload`]), and the
//! admission pipeline in front of them ([`pipeline`]).

pub mod body;
pub mod error;
pub mod metrics;
pub mod node;
pub mod otlp;
pub mod pipeline;
pub mod recent;
pub mod shard;
pub mod upload;
pub mod wal;

pub use error::{IngestError, StartError, WalError};
pub use node::{IngesterConfig, IngesterNode};
pub use pipeline::{Pipeline, PipelineConfig};
pub use wal::{Wal, WalConfig, WalMode};
