//! Why a compactor job or step failed. A job's error never stops the
//! compactor: it is counted by outcome, logged with the partition, and the
//! partition is planned again on a later round.

use mira_catalog::ClientError;
use mira_common::error::{ErrorCode, ServiceError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The catalog refused a command (the state moved on: inputs replaced
    /// or tombstoned meanwhile, an output id fenced). Nothing was changed.
    #[error("catalog refused {what} for partition {partition}: {source}")]
    Conflict {
        what: &'static str,
        partition: String,
        #[source]
        source: ClientError,
    },
    /// The catalog did not answer; the command may or may not have been
    /// applied (the next holder of the lease finds out from the manifest).
    #[error("catalog unavailable during {what} for partition {partition}: {source}")]
    Catalog {
        what: &'static str,
        partition: String,
        #[source]
        source: ClientError,
    },
    /// The lease was lost (expired or taken) before the commit.
    #[error("lease {key} lost: {reason}")]
    LeaseLost { key: String, reason: String },
    #[error("object store {op} {key}: {source}")]
    Store {
        op: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
    /// An input block failed verification or decoding: it is quarantined.
    #[error("block {id} is corrupt: {reason}")]
    CorruptInput { id: String, reason: String },
    /// An object read for a copy is not what the catalog records.
    #[error("object {key} does not match the catalog: {reason}")]
    CopyMismatch { key: String, reason: String },
    #[error("merging partition {partition}: {source}")]
    Merge {
        partition: String,
        #[source]
        source: mira_core::Error,
    },
    /// A catalog row that cannot be a block (an id or tenant this build
    /// cannot parse).
    #[error("catalog block {id}: {reason}")]
    BadRecord { id: String, reason: String },
    #[error("the compactor is shutting down")]
    Stopping,
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// The outcome label of a job that ended with this error.
    pub fn outcome(&self) -> &'static str {
        match self {
            Error::Conflict { .. } => "conflict",
            Error::LeaseLost { .. } => "lease_lost",
            Error::Stopping => "aborted",
            _ => "error",
        }
    }
}

impl ServiceError for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::Conflict { .. } | Error::LeaseLost { .. } => ErrorCode::Conflict,
            Error::Catalog { .. } | Error::Stopping => ErrorCode::Unavailable,
            _ => ErrorCode::Internal,
        }
    }
}
