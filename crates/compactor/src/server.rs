//! The compactor's HTTP port: the process's probes (`/metrics`, `/ready`,
//! `/live`) and `GET /api/mira/v1/compactor/status` (jobs running, the last
//! finished ones with their errors, the backlog, quarantined blocks).

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

/// Serves the status API and the process's probes on `listen`.
pub async fn start(compactor: Arc<Compactor>, listen: SocketAddr, process: &Process) -> std::io::Result<HttpServer> {
    let app = axum::Router::new()
        .route("/api/mira/v1/compactor/status", get(status))
        .with_state(compactor)
        .merge(process.telemetry.router());
    HttpServer::bind(listen, app, "compactor").await
}
