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
    /// The querier is at a process-wide limit (429): try again later.
    #[error("{0}")]
    Overloaded(String),
    /// The querier cannot answer yet (503).
    #[error("{0}")]
    Unavailable(String),
    /// The query ran longer than `--query-timeout` and was cancelled (504).
    #[error(
        "the query ran longer than the query timeout of {} s (--query-timeout) and was cancelled; narrow its time range or selector",
        .limit.as_secs_f64()
    )]
    Timeout { limit: std::time::Duration },
    /// Work of a request that was dropped (timed out or abandoned) stopped
    /// early ([`crate::pool`]); nobody reads this answer but the logs.
    #[error("the query was cancelled (timed out or abandoned) and its work stopped")]
    Cancelled,
    /// The catalog copy has not heard from the catalog for longer than
    /// `--catalog-max-staleness` (503): a plan from it could name blocks
    /// already replaced and deleted.
    #[error("catalog copy is stale: {} (bound {} s)", stale_age(.age), .bound.as_secs())]
    StaleCatalog {
        /// Since the last update; `None`: never heard.
        age: Option<std::time::Duration>,
        bound: std::time::Duration,
    },
    /// A planned block's object is not in the store (500 when it stays
    /// so): replaced and deleted since the plan, which one re-plan
    /// recovers from, or lost.
    #[error("block {block}: the object is gone from the store")]
    ObjectGone {
        block: String,
        #[source]
        source: BlockError,
    },
    /// The catalog lists a block live whose object is not in the store
    /// (500): lost data, counted in `mira_querier_missing_objects_total`.
    #[error("block {id} is live in the catalog but its object {key} is missing from the store")]
    ObjectMissing { id: String, key: String },
    /// A stored block failed verification (500, `corrupt_block`). Never
    /// answered with rows from it.
    #[error("block {block}: {source}")]
    CorruptBlock {
        block: String,
        #[source]
        source: BlockError,
    },
    /// Stored data decoded but is not what the format promises (500,
    /// `corrupt_block`): a section that does not decode, rows without a
    /// required column.
    #[error("{what}: {detail}")]
    Corrupt { what: String, detail: String },
    /// A block could not be read from the store or the cache (500).
    #[error("block {block}: {source}")]
    BlockRead {
        block: String,
        #[source]
        source: BlockError,
    },
    /// An ingester sent a recent block that does not open (500).
    #[error("recent block {block} from an ingester: {source}")]
    RecentBlock {
        block: String,
        #[source]
        source: BlockError,
    },
    /// The block cache directory cannot be used (at start).
    #[error("block cache at {path}: {source}")]
    Cache {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The scan pool could not be started.
    #[error("scan pool: {0}")]
    ScanPool(#[source] rayon::ThreadPoolBuildError),
    /// A fault of ours with nothing underneath (a broken invariant).
    #[error("{0}")]
    Internal(String),
    /// The tenant's limits (`--limits-file`): too many concurrent queries
    /// (429 with `Retry-After`) or a range over its `max_query_range` (400).
    #[error(transparent)]
    Limited(#[from] mira_common::limits::Refusal),
}

impl ServiceError for QueryError {
    fn error_code(&self) -> ErrorCode {
        match self {
            QueryError::BadRequest(_) => ErrorCode::BadRequest,
            QueryError::NotFound(_) => ErrorCode::NotFound,
            QueryError::TooBig(_) => ErrorCode::TooBig,
            QueryError::Overloaded(_) => ErrorCode::Overloaded,
            QueryError::Unavailable(_) | QueryError::StaleCatalog { .. } => ErrorCode::Unavailable,
            QueryError::Timeout { .. } | QueryError::Cancelled => ErrorCode::DeadlineExceeded,
            QueryError::CorruptBlock { .. }
            | QueryError::ObjectGone { .. }
            | QueryError::ObjectMissing { .. }
            | QueryError::Corrupt { .. }
            | QueryError::BlockRead { .. }
            | QueryError::RecentBlock { .. }
            | QueryError::Cache { .. }
            | QueryError::ScanPool(_)
            | QueryError::Internal(_) => ErrorCode::Internal,
            QueryError::Limited(r) => r.error_code(),
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
            QueryError::Overloaded(_) => "too_many_requests",
            QueryError::Unavailable(_) | QueryError::StaleCatalog { .. } => "unavailable",
            QueryError::Timeout { .. } | QueryError::Cancelled => "timeout",
            QueryError::CorruptBlock { .. } | QueryError::Corrupt { .. } => "corrupt_block",
            QueryError::ObjectGone { .. } | QueryError::ObjectMissing { .. } => "missing_object",
            QueryError::BlockRead { .. }
            | QueryError::RecentBlock { .. }
            | QueryError::Cache { .. }
            | QueryError::ScanPool(_)
            | QueryError::Internal(_) => "internal",
            QueryError::Limited(r) => match r.error_code() {
                ErrorCode::Overloaded => "too_many_requests",
                _ => "bad_data",
            },
        }
    }

    /// When to try again, for refusals that retrying later can cure.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            QueryError::Limited(r) => r.retry_after(),
            _ => None,
        }
    }

    /// A block read failed: corruption, the object gone (noted for the
    /// query's one re-plan, [`crate::attempt`]), or the store.
    pub(crate) fn block(key: &str, e: BlockError) -> QueryError {
        let block = key.to_owned();
        if e.is_corrupt() {
            QueryError::CorruptBlock { block, source: e }
        } else if matches!(
            &e,
            BlockError::ObjectStore {
                source: object_store::Error::NotFound { .. },
                ..
            }
        ) {
            crate::attempt::object_gone(key);
            QueryError::ObjectGone { block, source: e }
        } else {
            QueryError::BlockRead { block, source: e }
        }
    }

    pub(crate) fn corrupt(what: &str, e: impl std::fmt::Display) -> QueryError {
        QueryError::Corrupt {
            what: what.to_owned(),
            detail: e.to_string(),
        }
    }
}

/// "last update 37 s ago", or that there was none.
fn stale_age(age: &Option<std::time::Duration>) -> String {
    match age {
        Some(a) => format!("last update {} s ago", a.as_secs()),
        None => "no update received yet".to_owned(),
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
        let mut r = (status, axum::Json(body)).into_response();
        if let Some(after) = self.retry_after() {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, after.as_secs().max(1).into());
        }
        r
    }
}
