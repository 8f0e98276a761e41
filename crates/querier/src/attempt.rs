//! What every query endpoint shares around running a query, in one layer
//! ([`guard`]) on each API's router:
//!
//! - **The query timeout** (`--query-timeout`): the whole request, re-plan
//!   included, is dropped when it runs longer, and answers 504. Dropping
//!   cancels its fetches and waits, drops its queued scan pool jobs and
//!   stops its running ones at their next check ([`crate::pool`]). The
//!   compactor's deletion grace relies on this bound.
//! - **One re-plan when a planned object is gone**: a compaction may
//!   replace the blocks a query planned with and, after its grace, delete
//!   their objects. A read that finds a planned published object missing
//!   is noted ([`object_gone`], from the one place block reads become
//!   errors); the request is then run once more after the catalog copy has
//!   reached the catalog's current version, so it plans with the
//!   replacement. Gone again while the catalog still lists the block live
//!   is lost data: 500, counted in `mira_querier_missing_objects_total`.
//!
//! The request is replayed whole (its body is buffered, as the handlers'
//! extractors did anyway), so every endpoint, present or future, gets the
//! same rules without code of its own.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::{Querier, QueryError};

/// Largest request body a query may carry: axum's default limit, which
/// the handlers' extractors applied before.
const MAX_BODY: usize = 2 << 20;

/// Why a query was planned again.
pub const REPLAN_OBJECT_GONE: &str = "object_gone";

tokio::task_local! {
    /// The attempt running on this task (set by [`guard`]).
    static ATTEMPT: Arc<Attempt>;
}

/// What one attempt of a request ran into.
#[derive(Debug, Default)]
struct Attempt {
    /// The object key of the first planned published block found missing.
    gone: Mutex<Option<String>>,
}

/// Notes that the published object at `key` was not found, for the
/// attempt running on this task (nothing outside a [`guard`]).
pub(crate) fn object_gone(key: &str) {
    let _ = ATTEMPT.try_with(|a| {
        let mut gone = a.gone.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if gone.is_none() {
            *gone = Some(key.to_owned());
        }
    });
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplanLabels {
    reason: String,
}

/// The re-plan counters (registered with the querier's metrics by the
/// server).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    replans: Family<ReplanLabels, Counter>,
    missing_objects: Counter,
}

impl Counters {
    /// Registers `replans_total{reason}` and `missing_objects_total` in the
    /// querier's sub-registry.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "replans",
            "Queries planned again, by reason (object_gone: a planned block was replaced and deleted)",
            self.replans.clone(),
        );
        registry.register(
            "missing_objects",
            "Reads that found the object of a block the catalog lists live missing (lost data)",
            self.missing_objects.clone(),
        );
    }

    fn replanned(&self, reason: &str) {
        self.replans
            .get_or_create(&ReplanLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }
}

/// The layer of every query router: runs the request under the query
/// timeout, planned again once if a planned object is gone. `E` is the
/// API's error shape.
pub(crate) async fn guard<E>(State(q): State<Arc<Querier>>, req: Request, next: Next) -> Response
where
    E: From<QueryError> + IntoResponse,
{
    let limit = q.config.query_timeout;
    // The tenant authentication set; the scan pool queues its jobs under
    // it and drops or stops them when the timeout drops the request.
    let tenant = req
        .headers()
        .get(mira_common::auth::TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    match tokio::time::timeout(limit, crate::pool::scope(&tenant, attempts(&q, req, next))).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => E::from(e).into_response(),
        Err(_) => {
            tracing::info!(target: "mira::querier", ?limit, "query timed out");
            E::from(QueryError::Timeout { limit }).into_response()
        }
    }
}

/// The request, and once more if its first attempt found an object gone.
async fn attempts(q: &Querier, req: Request, next: Next) -> Result<Response, QueryError> {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| QueryError::BadRequest(format!("the request body: {e}")))?;
    let request = || Request::from_parts(parts.clone(), Body::from(body.clone()));
    let (response, gone) = attempt(next.clone(), request()).await;
    let Some(key) = gone else {
        return Ok(response);
    };
    q.counters.replanned(REPLAN_OBJECT_GONE);
    tracing::info!(target: "mira::querier", key, "a planned block's object is gone; planning again at the catalog's current version");
    let wait = q.config.catalog_wait;
    if q.mirror.catch_up(wait).await.is_none() {
        return Err(QueryError::Unavailable(format!(
            "block {key} was replaced while the query ran and the catalog copy did not catch up within {} s; retry",
            wait.as_secs_f64()
        )));
    }
    let (response, gone) = attempt(next, request()).await;
    let Some(key) = gone else {
        return Ok(response);
    };
    let state = match q.mirror.catch_up(wait).await {
        Some(s) => s,
        None => q.mirror.state(),
    };
    let live = state
        .blocks
        .values()
        .find(|b| b.object_key == key && b.state == mira_catalog::proto::BlockState::Live as i32);
    match live {
        Some(b) => {
            q.counters.missing_objects.inc();
            tracing::error!(target: "mira::querier", block = b.id, key, "a block the catalog lists live has no object");
            Err(QueryError::ObjectMissing { id: b.id.clone(), key })
        }
        None => Err(QueryError::Unavailable(format!(
            "the blocks of this query were replaced twice while it ran (block {key} is gone); retry"
        ))),
    }
}

/// Runs one attempt; its response and the first object it found gone.
async fn attempt(next: Next, req: Request) -> (Response, Option<String>) {
    let a = Arc::new(Attempt::default());
    let response = ATTEMPT.scope(a.clone(), next.run(req)).await;
    let gone = a.gone.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    (response, gone)
}
