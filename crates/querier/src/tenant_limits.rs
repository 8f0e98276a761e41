//! The per-tenant query limits ([`mira_common::limits`]) in front of every
//! API (native, Loki, Tempo, Prometheus): the middleware after
//! authentication takes one of the tenant's query slots for the whole
//! request (`max_query_concurrency`; over it: 429 with `Retry-After`, in
//! the APIs' error JSON) and scopes the request's task with the tenant, so
//! the one range check every query passes ([`crate::Querier`]'s
//! `check_range`) also holds it to the tenant's `max_query_range` (400
//! naming the asked range and the limit, as Loki's `max_query_length`).
//! A handler whose work outlives its response (a live tail) takes the
//! slot with it from the request's [`Lease`].

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use mira_common::auth::Principal;
use mira_common::limits::{Limiter, Refusal};
use mira_core::ids::TenantId;

use crate::error::QueryError;

/// The request's query slot, in its extensions: the middleware holds it
/// until the response, unless a handler [`Lease::take`]s it for work that
/// outlives the response.
#[derive(Clone, Debug, Default)]
pub(crate) struct Lease(Arc<std::sync::Mutex<Option<mira_common::limits::QueryGuard>>>);

impl Lease {
    /// The slot, to hold for as long as the work runs (`None`: the
    /// tenant has no concurrency limit, or it was taken already).
    pub(crate) fn take(&self) -> Option<mira_common::limits::QueryGuard> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

#[derive(Clone, Debug)]
struct Current {
    limiter: Arc<Limiter>,
    tenant: TenantId,
}

tokio::task_local! {
    static CURRENT: Current;
}

/// Checks a query's range against the tenant's `max_query_range` when
/// called inside a request scoped by [`middleware`] (elsewhere: no limit).
pub(crate) fn check_range(asked: std::time::Duration) -> Result<(), Refusal> {
    CURRENT
        .try_with(|c| c.limiter.check_range(&c.tenant, asked))
        .unwrap_or(Ok(()))
}

/// The widest window a request of the current tenant may read: its
/// `max_query_range` when set and narrower than `fallback` (the window a
/// request without `start` gets, so it is clamped, not refused).
pub(crate) fn window_cap(fallback: std::time::Duration) -> std::time::Duration {
    CURRENT
        .try_with(|c| c.limiter.max_query_range(&c.tenant))
        .ok()
        .flatten()
        .map_or(fallback, |limit| limit.min(fallback))
}

/// [`window_cap`] of a default window in nanoseconds.
pub(crate) fn cap_ns(default_ns: u64) -> u64 {
    u64::try_from(window_cap(std::time::Duration::from_nanos(default_ns)).as_nanos()).unwrap_or(u64::MAX)
}

/// Runs after the authentication middleware (which put the [`Principal`]
/// in the request's extensions).
pub(crate) async fn middleware(State(limiter): State<Arc<Limiter>>, mut req: Request, next: Next) -> Response {
    if !limiter.enabled() {
        return next.run(req).await;
    }
    let Some(tenant) = req.extensions().get::<Principal>().map(|p| p.tenant.clone()) else {
        return next.run(req).await;
    };
    let slot = match limiter.enter_query(&tenant) {
        Ok(slot) => slot,
        Err(refusal) => return QueryError::from(refusal).into_response(),
    };
    // Held here (this clone) until the response, or taken by a handler.
    let lease = Lease(Arc::new(std::sync::Mutex::new(Some(slot))));
    req.extensions_mut().insert(lease.clone());
    let response = CURRENT.scope(Current { limiter, tenant }, next.run(req)).await;
    drop(lease);
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::http::HeaderMap;
    use mira_common::auth::Principal;
    use mira_common::clock::Clock;
    use mira_common::limits::{Limiter, LimitsFile};
    use tokio::sync::Notify;

    use super::*;

    #[tokio::test]
    async fn a_tenant_past_its_concurrent_queries_gets_429_and_others_still_run() {
        let file = LimitsFile::parse("[tenants.a]\nmax_query_concurrency = 1\n").expect("limits");
        let limiter = Arc::new(Limiter::with_file(None, file, Clock::system()));
        let (entered, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let handler = {
            let (entered, gate) = (entered.clone(), gate.clone());
            move |headers: HeaderMap| async move {
                if headers.get("x-scope-orgid").is_some_and(|v| v == "a") {
                    entered.notify_one();
                    gate.notified().await;
                }
                "done"
            }
        };
        // The authentication middleware's part: the Principal.
        let authenticate = |mut req: Request, next: Next| async move {
            let tenant = req
                .headers()
                .get("x-scope-orgid")
                .and_then(|v| v.to_str().ok())
                .and_then(|t| TenantId::new(t).ok())
                .unwrap_or_else(TenantId::default_tenant);
            req.extensions_mut().insert(Principal {
                tenant,
                who: "test".to_owned(),
            });
            next.run(req).await
        };
        let app = axum::Router::new()
            .route("/q", axum::routing::get(handler))
            .layer(axum::middleware::from_fn_with_state(limiter, middleware))
            .layer(axum::middleware::from_fn(authenticate));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let get = move |tenant: &'static str| async move {
            mira_testkit::http::request("GET", addr, "/q", &[("X-Scope-OrgID", tenant)], Vec::new())
                .await
                .expect("answer")
        };

        let first = tokio::spawn(get("a"));
        entered.notified().await;
        // a's one slot is taken: refused at once, in the APIs' error JSON.
        let r = get("a").await;
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.header("retry-after"), Some("1"));
        let body = r.json();
        assert_eq!(body["errorType"], "too_many_requests");
        let message = body["error"].as_str().expect("error");
        assert!(
            message.contains("tenant a") && message.contains("limit of 1 concurrent queries"),
            "{message}"
        );
        // Another tenant runs while a waits.
        assert_eq!(get("b").await.status, 200);
        gate.notify_one();
        assert_eq!(first.await.expect("first").status, 200);
        // The slot came back.
        let again = tokio::spawn(get("a"));
        entered.notified().await;
        gate.notify_one();
        assert_eq!(again.await.expect("again").status, 200);
        server.abort();
    }
}
