//! Query errors; their statuses come from the one mapping
//! (`mira_proto::error`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mira_core::block::BlockError;
pub use mira_proto::error::{ErrorCode, ServiceError};

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The request is malformed (400): a parse error names its position.
    #[error("{0}")]
    BadRequest(String),
    /// Nothing matches an id lookup (404).
    #[error("{0}")]
    NotFound(String),
    /// A valid query over a configured limit (422).
    #[error("{0}")]
    TooBig(String),
    /// The querier cannot answer yet (503).
    #[error("{0}")]
    Unavailable(String),
    /// Stored data failed verification or could not be read (500). Never
    /// answered with rows.
    #[error("{0}")]
    Corrupt(String),
    #[error("{0}")]
    Internal(String),
}

impl ServiceError for QueryError {
    fn error_code(&self) -> ErrorCode {
        match self {
            QueryError::BadRequest(_) => ErrorCode::BadRequest,
            QueryError::NotFound(_) => ErrorCode::NotFound,
            QueryError::TooBig(_) => ErrorCode::TooBig,
            QueryError::Unavailable(_) => ErrorCode::Unavailable,
            QueryError::Corrupt(_) | QueryError::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl QueryError {
    /// A short machine-readable kind for the JSON body.
    pub fn kind(&self) -> &'static str {
        match self {
            QueryError::BadRequest(_) => "bad_request",
            QueryError::NotFound(_) => "not_found",
            QueryError::TooBig(_) => "too_big",
            QueryError::Unavailable(_) => "unavailable",
            QueryError::Corrupt(_) => "corrupt_block",
            QueryError::Internal(_) => "internal",
        }
    }

    /// A block read failed: corruption, or the store.
    pub(crate) fn block(key: &str, e: BlockError) -> QueryError {
        if e.is_corrupt() {
            QueryError::Corrupt(format!("block {key}: {e}"))
        } else {
            QueryError::Internal(format!("block {key}: {e}"))
        }
    }

    pub(crate) fn corrupt(what: &str, e: impl std::fmt::Display) -> QueryError {
        QueryError::Corrupt(format!("{what}: {e}"))
    }
}

impl From<mira_core::scan::ScanError> for QueryError {
    fn from(e: mira_core::scan::ScanError) -> Self {
        QueryError::BadRequest(e.to_string())
    }
}

impl IntoResponse for QueryError {
    /// The status from the one mapping; a 500 says its kind
    /// (`corrupt_block`, `internal`) and logs its detail instead of
    /// sending it.
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.error_code().http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::json!({
            "status": "error",
            "errorType": self.kind(),
            "error": self.public_message(),
        });
        (status, axum::Json(body)).into_response()
    }
}
