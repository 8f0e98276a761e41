//! The compactor's HTTP port: the process's probes (`/metrics`, `/ready`,
//! `/live`) and `GET /api/mira/v1/compactor/status` (jobs running, the last
//! finished ones with their errors, the backlog, quarantined blocks).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use mira_common::Process;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::{Compactor, Status};

async fn status(State(c): State<Arc<Compactor>>) -> Json<Status> {
    Json(c.status())
}

/// A running compactor HTTP server.
#[derive(Debug)]
pub struct CompactorServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl CompactorServer {
    pub async fn start(
        compactor: Arc<Compactor>,
        listen: SocketAddr,
        process: &Process,
    ) -> std::io::Result<CompactorServer> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .route("/api/mira/v1/compactor/status", get(status))
            .with_state(compactor)
            .merge(process.telemetry.router());
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = rx.await;
            });
            if let Err(e) = serve.await {
                tracing::error!(target: "mira::compactor", error = %e, "server stopped");
            }
        });
        Ok(CompactorServer {
            addr,
            stop: Some(tx),
            handle: Some(handle),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = h.await;
        }
    }
}
