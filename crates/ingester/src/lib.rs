//! mira-ingester: the write path. It owns the write-ahead log ([`wal`]),
//! request-body handling ([`body`]: content encodings with bounded
//! decompression), the OTLP servers ([`otlp`]), Prometheus remote write
//! ([`prom`]) and Loki push ([`loki`]) on the same contract ([`push`],
//! written as OTLP by [`pbwrite`]), the shards with their open
//! generations ([`shard`]), the uploader that writes and publishes sealed
//! blocks under the process's epoch ([`upload`]), start-up recovery of the
//! WAL ([`recover`]), whether writes may be acknowledged ([`health`]), the
//! admission pipeline in front of the shards ([`pipeline`]), the
//! recent-data service for queriers ([`recent`]), its metrics
//! ([`metrics`]), errors ([`error`]), what an operator configures
//! ([`settings`]: validated, then built into an [`IngesterConfig`]) and the
//! running node ([`node`]).

pub mod body;
pub mod error;
pub mod health;
pub mod loki;
pub mod metrics;
pub mod node;
pub mod otlp;
pub mod pbwrite;
pub mod pipeline;
pub mod prom;
pub mod push;
pub mod recent;
pub mod records;
pub mod recover;
pub mod series;
pub mod settings;
pub mod shard;
pub mod upload;
pub mod wal;

pub use error::{IngestError, StartError, WalError};
pub use node::{IngesterConfig, IngesterNode};
pub use pipeline::{Pipeline, PipelineConfig};
pub use settings::Settings;
pub use wal::{Wal, WalConfig, WalMode};
