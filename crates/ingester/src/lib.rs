//! mira-ingester: the write path. It owns the write-ahead log ([`wal`]);
//! the OTLP servers, admission, shards with their open blocks, sealing,
//! upload and publish are built on it.

pub mod error;
pub mod wal;

pub use error::WalError;
pub use wal::{Wal, WalConfig, WalMode};
