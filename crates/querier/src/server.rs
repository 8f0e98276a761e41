//! The querier's HTTP server: the API routes, `/metrics` (query counts and
//! durations by endpoint, cache counters) and `/ready` (the catalog copy is
//! complete). `mira serve` adds the other roles' metrics and readiness to
//! the same port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::Querier;

/// Metrics text of another role (`mira serve`).
pub type MetricsSource = Arc<dyn Fn() -> futures::future::BoxFuture<'static, String> + Send + Sync>;
/// Readiness of another role (`mira serve`).
pub type ReadySource = Arc<dyn Fn() -> bool + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueryLabels {
    endpoint: String,
    code: u16,
}

#[derive(Debug)]
struct Metrics {
    registry: Registry,
    queries: Family<QueryLabels, Counter>,
    duration: Family<QueryLabels, Histogram, fn() -> Histogram>,
}

fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.5, 14))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::default();
        let queries = Family::<QueryLabels, Counter>::default();
        registry.register(
            "mira_querier_requests",
            "Query API requests by endpoint and status",
            queries.clone(),
        );
        let duration = Family::<QueryLabels, Histogram, fn() -> Histogram>::new_with_constructor(seconds);
        registry.register(
            "mira_querier_request_duration_seconds",
            "Query API request duration by endpoint and status",
            duration.clone(),
        );
        Metrics {
            registry,
            queries,
            duration,
        }
    }
}

#[derive(Clone)]
struct AppState {
    querier: Arc<Querier>,
    metrics: Arc<Metrics>,
    extra_metrics: Vec<MetricsSource>,
    extra_ready: Vec<ReadySource>,
}

fn strip_eof(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| *l != "# EOF")
}

async fn metrics(State(s): State<AppState>) -> Response {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &s.metrics.registry).is_err() {
        out.clear();
    }
    let mut text: Vec<String> = strip_eof(&out).map(str::to_owned).collect();
    let c = &s.querier.cache().counters;
    for (name, help, v) in [
        (
            "mira_querier_cache_hits_total",
            "Sections read from the disk cache",
            c.hits.load(Ordering::Relaxed),
        ),
        (
            "mira_querier_cache_misses_total",
            "Sections fetched from the object store",
            c.misses.load(Ordering::Relaxed),
        ),
        (
            "mira_querier_cache_evictions_total",
            "Cache files evicted for room",
            c.evictions.load(Ordering::Relaxed),
        ),
        (
            "mira_querier_cache_corrupt_total",
            "Cache files that failed verification and were fetched again",
            c.corrupt_evictions.load(Ordering::Relaxed),
        ),
    ] {
        text.push(format!("# HELP {name} {help}.\n# TYPE {name} counter\n{name} {v}"));
    }
    text.push(format!(
        "# HELP mira_querier_cache_bytes Bytes held by the disk cache.\n# TYPE mira_querier_cache_bytes gauge\nmira_querier_cache_bytes {}",
        s.querier.cache().bytes()
    ));
    for extra in &s.extra_metrics {
        text.extend(strip_eof(&extra().await).map(str::to_owned));
    }
    text.push("# EOF".to_owned());
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        text.join("\n") + "\n",
    )
        .into_response()
}

async fn ready(State(s): State<AppState>) -> Response {
    if s.querier.ready() && s.extra_ready.iter().all(|r| r()) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

async fn observe(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let started = Instant::now();
    let response = next.run(req).await;
    let labels = QueryLabels {
        endpoint,
        code: response.status().as_u16(),
    };
    s.metrics.queries.get_or_create(&labels).inc();
    s.metrics
        .duration
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    response
}

/// A running querier HTTP server.
#[derive(Debug)]
pub struct QuerierServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl QuerierServer {
    /// Binds `listen` and serves the API, `/metrics` and `/ready`.
    pub async fn start(
        querier: Arc<Querier>,
        listen: SocketAddr,
        extra_metrics: Vec<MetricsSource>,
        extra_ready: Vec<ReadySource>,
    ) -> std::io::Result<QuerierServer> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let state = AppState {
            querier: querier.clone(),
            metrics: Arc::new(Metrics::new()),
            extra_metrics,
            extra_ready,
        };
        let app = crate::api::router(querier)
            .route_layer(axum::middleware::from_fn_with_state(state.clone(), observe))
            .merge(
                axum::Router::new()
                    .route("/metrics", get(metrics))
                    .route("/ready", get(ready))
                    .with_state(state),
            );
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = rx.await;
            });
            if let Err(e) = serve.await {
                tracing::error!(target: "mira::querier", error = %e, "server stopped");
            }
        });
        Ok(QuerierServer {
            addr,
            stop: Some(tx),
            handle: Some(handle),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, finishes requests in flight.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = h.await;
        }
    }
}
