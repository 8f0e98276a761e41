//! The one way a role serves HTTP (and gRPC, which tonic serves as axum
//! routes): [`HttpServer::spawn`] runs an axum app on a bound listener,
//! plain or TLS ([`crate::tls::Listener`], TCP_NODELAY on every
//! connection: the APIs are small request/response pairs), with each
//! request's [`crate::tls::PeerInfo`] in its extensions, until
//! [`HttpServer::shutdown`], which stops accepting and lets requests in
//! flight finish.

use std::net::SocketAddr;

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::tls::{Listener, PeerInfo, ServerTls};
use tokio::task::JoinHandle;

/// A running HTTP server.
#[derive(Debug)]
pub struct HttpServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Serves `app` on `listener`, over TLS when `tls` is given; `role`
    /// names it in the log if it fails.
    pub fn spawn(
        listener: tokio::net::TcpListener,
        app: axum::Router,
        role: &'static str,
        tls: Option<Arc<ServerTls>>,
    ) -> std::io::Result<HttpServer> {
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let listener = Listener::new(listener, tls)?;
        let handle = tokio::spawn(async move {
            let app = app.into_make_service_with_connect_info::<PeerInfo>();
            let serve = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                tracing::error!(target: "mira::http", role, error = %e, "server stopped");
            }
        });
        Ok(HttpServer {
            addr,
            stop: Some(stop),
            handle: Some(handle),
        })
    }

    /// Binds `listen`, then [`HttpServer::spawn`].
    pub async fn bind(
        listen: SocketAddr,
        app: axum::Router,
        role: &'static str,
        tls: Option<Arc<ServerTls>>,
    ) -> std::io::Result<HttpServer> {
        HttpServer::spawn(tokio::net::TcpListener::bind(listen).await?, app, role, tls)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting without waiting (see [`HttpServer::shutdown`]).
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Stops accepting and waits up to `limit` for requests in flight
    /// (long-lived streams too), then drops the connections left.
    pub async fn shutdown_within(mut self, limit: std::time::Duration) {
        self.stop();
        if let Some(mut h) = self.handle.take()
            && tokio::time::timeout(limit, &mut h).await.is_err()
        {
            h.abort();
        }
    }

    /// Stops accepting and waits for requests in flight to finish.
    pub async fn shutdown(mut self) {
        self.stop();
        if let Some(h) = self.handle.take() {
            let _ = h.await;
        }
    }
}
