//! Errors of the ingester.

use std::path::Path;

pub use mira_proto::error::{ErrorCode, ServiceError};

/// Why a WAL operation failed. Clonable so one failed group write can fail
/// every append in it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum WalError {
    #[error("WAL I/O on {path}: {message}")]
    Io { path: String, message: String },
    #[error("the WAL writer has stopped")]
    Stopped,
    /// A frame that fails its checks inside a segment (not a torn tail).
    #[error(
        "corrupt WAL segment {path} at offset {offset}: {reason} (start with --wal-skip-corrupt to skip the rest of that segment and count it)"
    )]
    Corrupt { path: String, offset: u64, reason: String },
}

impl WalError {
    pub(crate) fn io(path: &Path, e: std::io::Error) -> WalError {
        WalError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }
}

/// Why an export was not accepted; its status comes from the one mapping
/// ([`ServiceError`]).
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The request is malformed; names the problem. 400 / INVALID_ARGUMENT.
    #[error("{0}")]
    Invalid(String),
    /// Every shard stayed full, or every in-flight slot stayed taken, for
    /// the admission wait. 429 / RESOURCE_EXHAUSTED.
    #[error("ingester is full: {what} within {wait_ms} ms; retry later")]
    Overloaded { what: String, wait_ms: u64 },
    /// The request is larger than one shard's whole queue. 413 / RESOURCE_EXHAUSTED.
    #[error("request of {bytes} bytes exceeds the {limit}-byte limit")]
    TooLarge { bytes: usize, limit: usize },
    /// What the request would take to decode, counted on the wire before
    /// anything is decoded, is over a memory limit.
    #[error("request holds {what}: decoding it would take about {estimate} bytes, more than {limit} bytes ({flag})")]
    DecodedTooLarge {
        what: String,
        estimate: u64,
        limit: u64,
        flag: &'static str,
    },
    /// The client was too slow sending its request. 408 / DEADLINE_EXCEEDED.
    #[error("{0}")]
    Timeout(String),
    /// The WAL or a shard stopped (shutting down, disk failure). 503 / UNAVAILABLE.
    #[error("ingester unavailable: {0}")]
    Unavailable(String),
    /// The request's credential or tenant was refused. 401 / 403 / 400.
    #[error(transparent)]
    Auth(#[from] mira_common::auth::AuthError),
    /// The tenant is over its ingest rate (`--limits-file`). 429 /
    /// RESOURCE_EXHAUSTED with a retry hint.
    #[error(transparent)]
    Limited(#[from] mira_common::limits::Refusal),
}

impl IngestError {
    /// When the client should try again (`Retry-After`, RetryInfo), for
    /// refusals that retrying later can cure.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            IngestError::Overloaded { .. } => Some(std::time::Duration::from_secs(1)),
            IngestError::Limited(r) => r.retry_after(),
            _ => None,
        }
    }
}

impl ServiceError for IngestError {
    fn error_code(&self) -> ErrorCode {
        match self {
            IngestError::Invalid(_) => ErrorCode::BadRequest,
            IngestError::Overloaded { .. } => ErrorCode::Overloaded,
            IngestError::TooLarge { .. } | IngestError::DecodedTooLarge { .. } => ErrorCode::TooLarge,
            IngestError::Timeout(_) => ErrorCode::Timeout,
            IngestError::Unavailable(_) => ErrorCode::Unavailable,
            IngestError::Auth(e) => e.error_code(),
            IngestError::Limited(e) => e.error_code(),
        }
    }
}

impl From<WalError> for IngestError {
    fn from(e: WalError) -> Self {
        IngestError::Unavailable(e.to_string())
    }
}

/// Why an ingester could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error("listen on {0}: {1}")]
    Listen(String, #[source] std::io::Error),
    #[error("the catalog refused this ingester: {0}")]
    Catalog(String),
    #[error("another process took over ingester id {0:?} while this one was recovering its WAL")]
    Fenced(String),
    #[error(
        "a WAL generation cannot be published (the catalog refused it or it does not encode); it was written to {0} and the WAL keeps its frames; fix the cause and restart"
    )]
    Quarantined(String),
}
