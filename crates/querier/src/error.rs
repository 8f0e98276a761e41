//! Query errors and the HTTP status each maps to.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mira_core::block::BlockError;

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

impl QueryError {
    pub fn status(&self) -> StatusCode {
        match self {
            QueryError::BadRequest(_) => StatusCode::BAD_REQUEST,
            QueryError::NotFound(_) => StatusCode::NOT_FOUND,
            QueryError::TooBig(_) => StatusCode::UNPROCESSABLE_ENTITY,
            QueryError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            QueryError::Corrupt(_) | QueryError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

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
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "status": "error",
            "errorType": self.kind(),
            "error": self.to_string(),
        });
        (self.status(), axum::Json(body)).into_response()
    }
}
