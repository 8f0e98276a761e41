//! The querier's HTTP server: the API routes behind the one authentication
//! ([`mira_common::auth`], scope `read`: the tenant every handler reads
//! from `X-Scope-OrgID` is the one the credential was checked for), its
//! metrics (query counts and durations by endpoint, cache counters) in the
//! process's registry, its readiness (the catalog copy is complete), and
//! the process's probe router (`/metrics`, `/ready`, `/live`, open).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use mira_common::Process;
use mira_common::http::HttpServer;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::Querier;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueryLabels {
    endpoint: String,
    code: u16,
}

#[derive(Debug)]
struct Metrics {
    queries: Family<QueryLabels, Counter>,
    duration: Family<QueryLabels, Histogram, fn() -> Histogram>,
}

fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.5, 14))
}

impl Metrics {
    /// Registers the querier's metrics (`mira_querier_`), the block cache's
    /// counters read at each scrape among them.
    fn new(registry: &mut Registry, querier: Arc<Querier>) -> Metrics {
        let queries = Family::<QueryLabels, Counter>::default();
        registry.register("requests", "Query API requests by endpoint and status", queries.clone());
        let duration = Family::<QueryLabels, Histogram, fn() -> Histogram>::new_with_constructor(seconds);
        registry.register(
            "request_duration_seconds",
            "Query API request duration by endpoint and status",
            duration.clone(),
        );
        querier.counters.register(registry);
        querier.pool.register(registry);
        registry.register_collector(Box::new(CacheCollector(querier)));
        Metrics { queries, duration }
    }
}

/// The block cache's counters, read when scraped.
#[derive(Debug)]
struct CacheCollector(Arc<Querier>);

impl Collector for CacheCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let cache = self.0.cache();
        let c = &cache.counters;
        for (name, help, v) in [
            ("cache_hits", "Sections read from the disk cache", &c.hits),
            ("cache_misses", "Sections fetched from the object store", &c.misses),
            ("cache_evictions", "Cache files evicted for room", &c.evictions),
            (
                "cache_corrupt",
                "Cache files that failed verification and were fetched again",
                &c.corrupt_evictions,
            ),
        ] {
            let counter = ConstCounter::new(v.load(Ordering::Relaxed));
            counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)?;
        }
        let d = &self.0.decoded().counters;
        for (name, help, v) in [
            ("decoded_cache_hits", "Tables found decoded in memory", &d.hits),
            ("decoded_cache_misses", "Tables not found decoded in memory", &d.misses),
            ("decoded_cache_inserts", "Decoded tables kept in memory", &d.inserts),
            (
                "decoded_cache_evictions",
                "Decoded tables evicted for room",
                &d.evictions,
            ),
        ] {
            let counter = ConstCounter::new(v.load(Ordering::Relaxed));
            counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)?;
        }
        let r = &self.0.results().counters;
        for (name, help, v) in [
            (
                "result_cache_hits",
                "Per-block query results found in the result cache",
                &r.hits,
            ),
            (
                "result_cache_misses",
                "Per-block query results not found in the result cache",
                &r.misses,
            ),
            (
                "result_cache_evictions",
                "Per-block query results evicted for room",
                &r.evictions,
            ),
        ] {
            let counter = ConstCounter::new(v.load(Ordering::Relaxed));
            counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)?;
        }
        for (name, help, v) in [
            (
                "result_cache_bytes",
                "Bytes of per-block query results held in memory",
                self.0.results().bytes(),
            ),
            ("cache_bytes", "Bytes held by the disk cache", cache.bytes()),
            (
                "decoded_cache_bytes",
                "Bytes of decoded tables held in memory",
                self.0.decoded().bytes(),
            ),
        ] {
            let gauge = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
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

/// Authenticates every API request and sets `X-Scope-OrgID` to the tenant
/// it was authorized for (a single-tenant token may omit the header; what
/// a client sent is replaced, never trusted). The per-tenant query limits
/// ([`crate::tenant_limits`]) run right after it.
async fn authenticate(
    State(auth): State<Arc<mira_common::auth::Authenticator>>,
    mut req: Request,
    next: Next,
) -> Response {
    let peer = mira_common::tls::PeerInfo::of(req.extensions()).map(|p| p.addr.ip());
    match auth.authorize(req.headers(), peer, mira_common::auth::Scope::Read, false) {
        Ok(p) => {
            match axum::http::HeaderValue::from_str(p.tenant.as_str()) {
                Ok(v) => {
                    req.headers_mut().insert(mira_common::auth::TENANT_HEADER, v);
                }
                Err(_) => return axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            }
            // Work that outlives the request (a live tail) asks again
            // with the same credential, so a revoked or expired token
            // ends it.
            let recheck = Recheck {
                auth,
                peer,
                tenant: p.tenant.clone(),
            };
            req.extensions_mut().insert(recheck);
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Err(e) => e.http_response(),
    }
}

/// What a request was authorized by, kept so work it started that runs on
/// (a live tail) can ask again with the request's headers.
#[derive(Clone)]
pub(crate) struct Recheck {
    auth: Arc<mira_common::auth::Authenticator>,
    peer: Option<std::net::IpAddr>,
    tenant: mira_core::ids::TenantId,
}

impl Recheck {
    /// Whether the credential in `headers` (the request's) still grants
    /// `read` on the same tenant (the tokens file is re-read every
    /// `--reload-interval`; an expiry is read against the clock): why
    /// not, when it does not.
    pub(crate) fn still_valid(&self, headers: &axum::http::HeaderMap) -> Result<(), String> {
        match self
            .auth
            .authorize(headers, self.peer, mira_common::auth::Scope::Read, false)
        {
            Ok(p) if p.tenant == self.tenant => Ok(()),
            Ok(p) => Err(format!("the credential now acts for tenant {}", p.tenant)),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// A running querier HTTP server.
#[derive(Debug)]
pub struct QuerierServer(HttpServer);

impl QuerierServer {
    /// Binds `listen` and serves the API and the process's probes
    /// (`/metrics`, `/ready`, `/live`).
    pub async fn start(querier: Arc<Querier>, listen: SocketAddr, process: &Process) -> std::io::Result<QuerierServer> {
        let state = AppState {
            metrics: Arc::new(
                process
                    .telemetry
                    .register("querier", |r| Metrics::new(r, querier.clone())),
            ),
        };
        {
            let q = querier.clone();
            process.telemetry.readiness("querier", move || {
                if q.ready() {
                    Ok(())
                } else {
                    Err("the catalog copy is not complete yet".to_owned())
                }
            });
        }
        let app = crate::api::router(querier.clone())
            .merge(crate::prom_api::router(querier.clone()))
            .merge(crate::loki_api::router(querier.clone()))
            .merge(crate::tempo_api::router(querier))
            .layer(axum::middleware::from_fn_with_state(
                process.security.limits.clone(),
                crate::tenant_limits::middleware,
            ))
            .layer(axum::middleware::from_fn_with_state(
                process.security.auth.clone(),
                authenticate,
            ))
            .route_layer(axum::middleware::from_fn_with_state(state, observe))
            .merge(process.telemetry.router());
        process.security.warn_if_open("querier", listen);
        Ok(QuerierServer(
            HttpServer::bind(listen, app, "querier", process.security.tls.clone()).await?,
        ))
    }

    pub fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    /// Stops accepting, finishes requests in flight.
    pub async fn shutdown(self) {
        self.0.shutdown().await;
    }
}
