//! mira-ingester: the write path. It owns the write-ahead log ([`wal`])
//! and request-body handling ([`body`]: content encodings with bounded
//! decompression); the OTLP servers, admission, shards with their open
//! blocks, sealing, upload and publish are built on them.

pub mod body;
pub mod error;
pub mod wal;

pub use error::WalError;
pub use wal::{Wal, WalConfig, WalMode};
