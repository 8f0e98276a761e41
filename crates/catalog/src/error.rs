//! Errors of the catalog: why a command was rejected (replicated, part of
//! the state machine's answer), and what a client call ended with.

pub use mira_proto::error::{ErrorCode, ServiceError};
use serde::{Deserialize, Serialize};
use tonic::{Code, Status};

/// Why the state machine (or the validation in front of it) rejected a
/// command. Rejection is whole: no part of the command was applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum CommandError {
    /// The command is malformed; names the field and the reason.
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    /// Named blocks (or a policy) do not exist.
    #[error("not found: {what}")]
    NotFound { what: String },
    /// A different block is already published under this id.
    #[error("block {id} already exists with different contents")]
    AlreadyExists { id: String },
    /// The command is well formed but the current state does not allow it
    /// (a block not live, a lease held by someone else, a watermark going
    /// backwards).
    #[error("{reason}")]
    Conflict { reason: String },
}

impl CommandError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        CommandError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub fn conflict(reason: impl Into<String>) -> Self {
        CommandError::Conflict { reason: reason.into() }
    }
}

impl ServiceError for CommandError {
    fn error_code(&self) -> ErrorCode {
        match self {
            CommandError::Invalid { .. } => ErrorCode::BadRequest,
            CommandError::NotFound { .. } => ErrorCode::NotFound,
            CommandError::AlreadyExists { .. } => ErrorCode::AlreadyExists,
            CommandError::Conflict { .. } => ErrorCode::Conflict,
        }
    }
}

impl From<CommandError> for Status {
    fn from(e: CommandError) -> Status {
        e.to_status()
    }
}

/// Errors of the catalog member itself (storage, startup).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("catalog storage at {path}: {source}")]
    Storage {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("invalid catalog configuration: {0}")]
    Config(String),
    #[error("catalog raft: {0}")]
    Raft(String),
    #[error("catalog listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// What a [`crate::client::CatalogClient`] call ended with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The catalog answered with a non-retryable status (a rejected
    /// command, bad input, not found).
    #[error("catalog rejected the request: {}: {}", .0.code(), .0.message())]
    Rejected(Status),
    /// No member gave an answer before the deadline; the last error seen is
    /// attached. A write that ends like this may or may not have been
    /// applied; every write command is idempotent, so retrying is safe.
    #[error("catalog unavailable after {attempts} attempts: {last}")]
    Unavailable { attempts: u32, last: String },
    #[error("invalid catalog endpoint {0}")]
    Endpoint(String),
}

impl ClientError {
    pub fn code(&self) -> Code {
        match self {
            ClientError::Rejected(s) => s.code(),
            ClientError::Unavailable { .. } => Code::Unavailable,
            ClientError::Endpoint(_) => Code::InvalidArgument,
        }
    }
}
