//! The compactor's HTTP port: the process's probes (`/metrics`, `/ready`,
//! `/live`) and `GET /api/mira/v1/compactor/status` (jobs running, the last
//! finished ones with their errors, the backlog, quarantined blocks: every
//! tenant's, so with `--auth tokens` it needs a token with the `admin`
//! scope).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use mira_common::Process;
use mira_common::http::HttpServer;

use crate::{Compactor, Status};

async fn status(State(c): State<Arc<Compactor>>) -> Json<Status> {
    Json(c.status())
}

/// The status names every tenant: `admin` scope.
async fn admin_only(
    State(auth): State<Arc<mira_common::auth::Authenticator>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let peer = mira_common::tls::PeerInfo::of(req.extensions()).map(|p| p.addr.ip());
    match auth.authorize(req.headers(), peer, mira_common::auth::Scope::Admin, false) {
        Ok(_) => next.run(req).await,
        Err(e) => e.http_response(),
    }
}

/// Serves the status API and the process's probes on `listen`.
pub async fn start(compactor: Arc<Compactor>, listen: SocketAddr, process: &Process) -> std::io::Result<HttpServer> {
    let app = axum::Router::new()
        .route("/api/mira/v1/compactor/status", get(status))
        .with_state(compactor)
        .layer(axum::middleware::from_fn_with_state(
            process.security.auth.clone(),
            admin_only,
        ))
        .merge(process.telemetry.router());
    HttpServer::bind(listen, app, "compactor", process.security.tls.clone()).await
}
