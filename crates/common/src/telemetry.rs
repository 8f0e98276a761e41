//! One metrics registry per process, with a sub-registry per role, and the
//! one probe router every role's HTTP port serves:
//!
//! - `/metrics`: the whole process's registry in the Prometheus text
//!   format (`mira serve` answers for every role it runs);
//! - `/ready`: 200 when every role's readiness check passes (its body
//!   `ready`, then one `warning: <role>: …` line per note a role adds with
//!   [`Telemetry::ready_notes`]: something an operator must see that does
//!   not take the process out of service), else 503 naming the first role
//!   that is not ready and why;
//! - `/live`: 200 while the process answers HTTP at all (the Kubernetes
//!   liveness probe; readiness, not liveness, reflects dependencies).
//!
//! A role registers its metrics with [`Telemetry::register`] (names inside
//! the sub-registry have no `mira_<role>_` prefix; it is added), gauges read
//! at scrape time with [`Telemetry::on_scrape`], and its readiness with
//! [`Telemetry::readiness`].

use std::sync::{Arc, Mutex, PoisonError};

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use futures::future::BoxFuture;
use prometheus_client::registry::Registry;

/// What a role's readiness check answers: `Err(reason)` when not ready.
pub type Readiness = Result<(), String>;

type ScrapeHook = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;
type ReadyCheck = Arc<dyn Fn() -> Readiness + Send + Sync>;
type ReadyNotes = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// The process's metrics and probes (share it as `Arc<Telemetry>`).
pub struct Telemetry {
    registry: Mutex<Registry>,
    on_scrape: Mutex<Vec<ScrapeHook>>,
    ready: Mutex<Vec<(&'static str, ReadyCheck)>>,
    notes: Mutex<Vec<(&'static str, ReadyNotes)>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let roles: Vec<&str> = lock(&self.ready).iter().map(|(r, _)| *r).collect();
        f.debug_struct("Telemetry").field("roles", &roles).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Telemetry {
    /// An empty registry (prefix `mira`) with no readiness checks: ready.
    pub fn new() -> Arc<Telemetry> {
        Arc::new(Telemetry {
            registry: Mutex::new(Registry::with_prefix("mira")),
            on_scrape: Mutex::new(Vec::new()),
            ready: Mutex::new(Vec::new()),
            notes: Mutex::new(Vec::new()),
        })
    }

    /// Registers a role's metrics in its sub-registry (`mira_<role>_…`).
    pub fn register<T>(&self, role: &str, f: impl FnOnce(&mut Registry) -> T) -> T {
        let mut root = lock(&self.registry);
        f(root.sub_registry_with_prefix(role))
    }

    /// Runs `hook` before each scrape (gauges read from state that is not
    /// kept in a metric, e.g. Raft's indexes).
    pub fn on_scrape(&self, hook: impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static) {
        lock(&self.on_scrape).push(Arc::new(hook));
    }

    /// Adds a role's readiness check to `/ready`.
    pub fn readiness(&self, role: &'static str, check: impl Fn() -> Readiness + Send + Sync + 'static) {
        lock(&self.ready).push((role, Arc::new(check)));
    }

    /// Adds a role's warnings to a ready `/ready`'s body.
    pub fn ready_notes(&self, role: &'static str, notes: impl Fn() -> Vec<String> + Send + Sync + 'static) {
        lock(&self.notes).push((role, Arc::new(notes)));
    }

    /// Every role's warnings, as `role: note`.
    pub fn notes(&self) -> Vec<String> {
        let notes: Vec<(&'static str, ReadyNotes)> = lock(&self.notes).clone();
        notes
            .into_iter()
            .flat_map(|(role, f)| f().into_iter().map(move |n| format!("{role}: {n}")))
            .collect()
    }

    /// The `/metrics` text.
    pub async fn render(&self) -> String {
        let hooks: Vec<ScrapeHook> = lock(&self.on_scrape).clone();
        for hook in hooks {
            hook().await;
        }
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &lock(&self.registry)) {
            tracing::error!(target: "mira::telemetry", error = %e, "encode metrics");
            out.clear();
        }
        out
    }

    /// Every role's readiness: the first failing one as `role: reason`.
    pub fn ready(&self) -> Readiness {
        let checks: Vec<(&'static str, ReadyCheck)> = lock(&self.ready).clone();
        for (role, check) in checks {
            check().map_err(|why| format!("{role}: {why}"))?;
        }
        Ok(())
    }

    /// `/metrics`, `/ready` and `/live`, to merge into a role's HTTP router.
    pub fn router<S: Clone + Send + Sync + 'static>(self: &Arc<Self>) -> axum::Router<S> {
        let metrics = self.clone();
        let ready = self.clone();
        axum::Router::new()
            .route(
                "/metrics",
                get(move || {
                    let t = metrics.clone();
                    async move {
                        (
                            [(
                                header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            t.render().await,
                        )
                    }
                }),
            )
            .route(
                "/ready",
                get(move || {
                    let t = ready.clone();
                    async move {
                        match t.ready() {
                            Ok(()) => {
                                let mut body = "ready\n".to_owned();
                                for n in t.notes() {
                                    body.push_str(&format!("warning: {n}\n"));
                                }
                                (StatusCode::OK, body).into_response()
                            }
                            Err(why) => {
                                (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response()
                            }
                        }
                    }
                }),
            )
            .route("/live", get(|| async { "live\n" }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;
    use tower::ServiceExt;

    use super::*;

    async fn get_text(router: &axum::Router, path: &str) -> (u16, String) {
        let res = router
            .clone()
            .oneshot(
                axum::http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .expect("test setup"),
            )
            .await
            .expect("test setup");
        let status = res.status().as_u16();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .expect("test setup");
        (status, String::from_utf8(body.to_vec()).expect("test setup"))
    }

    #[tokio::test]
    async fn one_registry_serves_every_role_with_its_prefix() {
        let t = Telemetry::new();
        let c = t.register("ingester", |r| {
            let c = Counter::<u64>::default();
            r.register("records", "Records accepted", c.clone());
            c
        });
        let g = t.register("catalog", |r| {
            let g = Gauge::<i64>::default();
            r.register("raft_term", "Current Raft term", g.clone());
            g
        });
        let term = Arc::new(AtomicI64::new(0));
        {
            let (g, term) = (g.clone(), term.clone());
            t.on_scrape(move || {
                g.set(term.load(Ordering::Relaxed));
                Box::pin(async {})
            });
        }
        c.inc_by(7);
        term.store(3, Ordering::Relaxed);
        let router: axum::Router = t.router();
        let (status, text) = get_text(&router, "/metrics").await;
        assert_eq!(status, 200);
        assert!(text.contains("mira_ingester_records_total 7"), "{text}");
        // Read at scrape time, not when registered.
        assert!(text.contains("mira_catalog_raft_term 3"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    }

    #[tokio::test]
    async fn ready_names_the_role_that_is_not_and_live_does_not_care() {
        let t = Telemetry::new();
        let ingester_ok = Arc::new(AtomicBool::new(true));
        t.readiness("catalog", || Ok(()));
        {
            let ok = ingester_ok.clone();
            t.readiness("ingester", move || {
                if ok.load(Ordering::Relaxed) {
                    Ok(())
                } else {
                    Err("lease lapsed".into())
                }
            });
        }
        let router: axum::Router = t.router();
        assert_eq!(get_text(&router, "/ready").await, (200, "ready\n".to_owned()));
        ingester_ok.store(false, Ordering::Relaxed);
        assert_eq!(
            get_text(&router, "/ready").await,
            (503, "not ready: ingester: lease lapsed\n".to_owned())
        );
        assert_eq!(get_text(&router, "/live").await, (200, "live\n".to_owned()));
    }

    #[tokio::test]
    async fn a_ready_body_carries_each_roles_notes() {
        let t = Telemetry::new();
        t.readiness("ingester", || Ok(()));
        t.ready_notes("ingester", || vec!["quarantined: q/logs-0-3".to_owned()]);
        let router: axum::Router = t.router();
        assert_eq!(
            get_text(&router, "/ready").await,
            (200, "ready\nwarning: ingester: quarantined: q/logs-0-3\n".to_owned())
        );
    }
}
