//! TLS with rustls (aws-lc-rs, the one crypto provider of the build), on
//! every listening port and for every internal client.
//!
//! - [`ServerTls`]: the certificate and key a process serves
//!   (`--tls-cert`, `--tls-key`), the CA whose client certificates it
//!   requires (`--tls-client-ca`), and the CA whose client certificates make
//!   a caller a cluster member (`--cluster-ca`, see [`crate::cluster`]).
//!   The files are read again when they change ([`crate::watch`]): a
//!   connection made after a rotation gets the new certificate, one made
//!   before keeps its session.
//! - [`Listener`]: what [`crate::http::HttpServer`] serves on: plain TCP or
//!   TLS (handshakes run beside the accept loop, each bounded by
//!   [`HANDSHAKE_TIMEOUT`], so a slow client holds up no one), answering
//!   every request's [`PeerInfo`].
//! - [`ClientTls`] and [`Connector`]: how internal clients (catalog,
//!   Raft, recent data) connect: the CA they trust (`--tls-ca`) and the
//!   client certificate they present (`--tls-cert`, `--tls-key`).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once per listener; more wait in the kernel's
/// accept queue.
const MAX_HANDSHAKES: usize = 256;

/// Why TLS could not be set up; names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {path}: {reason}")]
    File {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn file_err(what: &'static str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The crypto provider: aws-lc-rs, also what object_store's clients use.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(what, path, e))?;
    if certs.is_empty() {
        return Err(file_err(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_err("TLS key", path, e))
}

fn roots(what: &'static str, paths: &[&Path]) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for path in paths {
        for c in certs(what, path)? {
            store.add(c).map_err(|e| file_err(what, path, e))?;
        }
    }
    Ok(store)
}

/// The files of a server's TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA.
    pub client_ca: Option<PathBuf>,
    /// Client certificates signed by this CA are cluster members (asked
    /// for but not required, unless `client_ca` is set).
    pub cluster_ca: Option<PathBuf>,
}

impl ServerFiles {
    fn paths(&self) -> Vec<PathBuf> {
        let mut p = vec![self.cert.clone(), self.key.clone()];
        p.extend(self.client_ca.iter().cloned());
        p.extend(self.cluster_ca.iter().cloned());
        p
    }
}

struct Loaded {
    config: Arc<rustls::ServerConfig>,
    cluster: Option<Arc<dyn ClientCertVerifier>>,
}

/// A server's TLS, read again when its files change.
pub struct ServerTls {
    files: ServerFiles,
    current: RwLock<Arc<Loaded>>,
    /// Loopback peers may also speak plain TCP (`mira serve`, whose own
    /// roles call each other on loopback).
    plain_loopback: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("files", &self.files).finish()
    }
}

fn build_server(files: &ServerFiles) -> Result<Loaded, TlsError> {
    let chain = certs("TLS certificate", &files.cert)?;
    let key = key(&files.key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut cas: Vec<&Path> = Vec::new();
    cas.extend(files.client_ca.as_deref());
    cas.extend(files.cluster_ca.as_deref());
    let builder = if cas.is_empty() {
        builder.with_no_client_auth()
    } else {
        let store = roots("client CA", &cas)?;
        let mut v = WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider());
        if files.client_ca.is_none() {
            v = v.allow_unauthenticated();
        }
        builder.with_client_cert_verifier(v.build().map_err(|e| TlsError::Config(e.to_string()))?)
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| file_err("TLS certificate and key", &files.cert, e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let cluster = match &files.cluster_ca {
        None => None,
        Some(ca) => Some(
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots("cluster CA", &[ca])?), provider())
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?,
        ),
    };
    Ok(Loaded {
        config: Arc::new(config),
        cluster,
    })
}

impl ServerTls {
    /// Reads the files once; [`ServerTls::watch`] follows their changes.
    pub fn load(files: ServerFiles) -> Result<Arc<ServerTls>, TlsError> {
        ServerTls::load_with(files, false)
    }

    /// [`ServerTls::load`]; with `plain_loopback`, a connection from a
    /// loopback address whose first byte is not a TLS handshake is served
    /// in plain TCP (`mira serve`: its roles call each other on loopback
    /// without a CA to check each other's certificate).
    pub fn load_with(files: ServerFiles, plain_loopback: bool) -> Result<Arc<ServerTls>, TlsError> {
        let loaded = build_server(&files)?;
        Ok(Arc::new(ServerTls {
            files,
            current: RwLock::new(Arc::new(loaded)),
            plain_loopback,
        }))
    }

    /// Reads the files again when they change (checked every `every`). A
    /// set that does not load (a half-written rotation) keeps the one in
    /// use and is tried again at the next change. Stops when dropped.
    pub fn watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        crate::watch::spawn_poll(self.files.paths(), every, move || {
            weak.upgrade().map(|t| t.reload()).is_some()
        })
    }

    /// Reads the files now; `true` when the new ones are in use.
    pub fn reload(&self) -> bool {
        match build_server(&self.files) {
            Ok(l) => {
                *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(l);
                tracing::info!(target: "mira::tls", cert = %self.files.cert.display(), "TLS files reloaded");
                true
            }
            Err(e) => {
                tracing::error!(target: "mira::tls", error = %e, "TLS files not reloaded; the previous ones stay in use");
                false
            }
        }
    }

    fn loaded(&self) -> Arc<Loaded> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether connections must present a client certificate.
    pub fn requires_client_cert(&self) -> bool {
        self.files.client_ca.is_some()
    }
}

/// Who is at the other end of a connection.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    pub addr: SocketAddr,
    /// Over TLS.
    pub tls: bool,
    /// Presented a client certificate the port verified.
    pub client_cert: bool,
    /// The client certificate verifies against the cluster CA.
    pub cluster_member: bool,
}

impl PeerInfo {
    /// The peer of a request, as the server put it in its extensions.
    pub fn of(extensions: &axum::http::Extensions) -> Option<&PeerInfo> {
        extensions.get::<axum::extract::ConnectInfo<PeerInfo>>().map(|c| &c.0)
    }
}

/// An accepted connection.
#[derive(Debug)]
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

macro_rules! delegate_io {
    ($ty:ty) => {
        impl AsyncRead for $ty {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
                }
            }
        }

        impl AsyncWrite for $ty {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    Self::Plain(s) => s.is_write_vectored(),
                    Self::Tls(s) => s.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_flush(cx),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_io!(Conn);

/// What an HTTP server accepts on: plain TCP, or TLS.
pub struct Listener {
    local: SocketAddr,
    inner: Inner,
}

enum Inner {
    Plain(TcpListener),
    Tls {
        accepted: tokio::sync::mpsc::Receiver<(Conn, PeerInfo)>,
        task: tokio::task::JoinHandle<()>,
    },
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local", &self.local)
            .field("tls", &matches!(self.inner, Inner::Tls { .. }))
            .finish()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Inner::Tls { task, .. } = &self.inner {
            task.abort();
        }
    }
}

async fn accept_tcp(listener: &mut TcpListener) -> (TcpStream, SocketAddr) {
    let (tcp, addr) = axum::serve::Listener::accept(listener).await;
    // The APIs are small request/response pairs: without TCP_NODELAY,
    // Nagle plus delayed ACKs adds tens of ms to each.
    let _ = tcp.set_nodelay(true);
    (tcp, addr)
}

/// The first byte of a TLS connection (a handshake record).
const TLS_HANDSHAKE: u8 = 0x16;

async fn handshake(tls: &ServerTls, tcp: TcpStream, addr: SocketAddr) -> Result<(Conn, PeerInfo), String> {
    if tls.plain_loopback && addr.ip().is_loopback() {
        let mut first = [0u8; 1];
        let n = tokio::time::timeout(HANDSHAKE_TIMEOUT, tcp.peek(&mut first))
            .await
            .map_err(|_| format!("nothing sent within {HANDSHAKE_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        if n == 1 && first[0] != TLS_HANDSHAKE {
            return Ok((
                Conn::Plain(tcp),
                PeerInfo {
                    addr,
                    tls: false,
                    client_cert: false,
                    cluster_member: false,
                },
            ));
        }
    }
    let loaded = tls.loaded();
    let acceptor = tokio_rustls::TlsAcceptor::from(loaded.config.clone());
    let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
        .await
        .map_err(|_| format!("no handshake within {HANDSHAKE_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    let (client_cert, cluster_member) = {
        let (_, conn) = stream.get_ref();
        match conn.peer_certificates() {
            Some([end, rest @ ..]) => {
                let member = loaded
                    .cluster
                    .as_ref()
                    .is_some_and(|v| v.verify_client_cert(end, rest, UnixTime::now()).is_ok());
                (true, member)
            }
            _ => (false, false),
        }
    };
    Ok((
        Conn::Tls(Box::new(stream)),
        PeerInfo {
            addr,
            tls: true,
            client_cert,
            cluster_member,
        },
    ))
}

impl Listener {
    /// Serves `tcp` as is, or with `tls`. Call inside a runtime.
    pub fn new(tcp: TcpListener, tls: Option<Arc<ServerTls>>) -> io::Result<Listener> {
        let local = tcp.local_addr()?;
        let Some(tls) = tls else {
            return Ok(Listener {
                local,
                inner: Inner::Plain(tcp),
            });
        };
        let (tx, accepted) = tokio::sync::mpsc::channel(64);
        let task = tokio::spawn(async move {
            let mut tcp = tcp;
            let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (stream, addr) = accept_tcp(&mut tcp).await;
                let tls = tls.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match handshake(&tls, stream, addr).await {
                        Ok(c) => {
                            drop(slot);
                            let _ = tx.send(c).await;
                        }
                        Err(e) => {
                            tracing::debug!(target: "mira::tls", peer = %addr, error = %e, "TLS handshake failed")
                        }
                    }
                });
            }
        });
        Ok(Listener {
            local,
            inner: Inner::Tls { accepted, task },
        })
    }
}

impl axum::serve::Listener for Listener {
    type Io = Conn;
    type Addr = PeerInfo;

    async fn accept(&mut self) -> (Conn, PeerInfo) {
        match &mut self.inner {
            Inner::Plain(tcp) => {
                let (stream, addr) = accept_tcp(tcp).await;
                (
                    Conn::Plain(stream),
                    PeerInfo {
                        addr,
                        tls: false,
                        client_cert: false,
                        cluster_member: false,
                    },
                )
            }
            Inner::Tls { accepted, .. } => match accepted.recv().await {
                Some(c) => c,
                None => std::future::pending().await,
            },
        }
    }

    fn local_addr(&self) -> io::Result<PeerInfo> {
        Ok(PeerInfo {
            addr: self.local,
            tls: matches!(self.inner, Inner::Tls { .. }),
            client_cert: false,
            cluster_member: false,
        })
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Listener>> for PeerInfo {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Listener>) -> Self {
        stream.remote_addr().clone()
    }
}

// ---- clients ----

/// The files of an internal client's TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientFiles {
    /// The CA that signed the servers' certificates.
    pub ca: PathBuf,
    /// A client certificate and key to present (mutual TLS).
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// An internal client's TLS, read again when its files change.
pub struct ClientTls {
    files: ClientFiles,
    current: RwLock<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("files", &self.files).finish()
    }
}

fn build_client(files: &ClientFiles) -> Result<rustls::ClientConfig, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots("TLS CA", &[&files.ca])?);
    let mut config = match &files.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key_path)) => builder
            .with_client_auth_cert(certs("TLS certificate", cert)?, key(key_path)?)
            .map_err(|e| file_err("TLS certificate and key", cert, e))?,
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

impl ClientTls {
    pub fn load(files: ClientFiles) -> Result<Arc<ClientTls>, TlsError> {
        let config = build_client(&files)?;
        Ok(Arc::new(ClientTls {
            files,
            current: RwLock::new(Arc::new(config)),
        }))
    }

    /// Reads the files again when they change; stops when dropped.
    pub fn watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let mut paths = vec![self.files.ca.clone()];
        if let Some((c, k)) = &self.files.identity {
            paths.extend([c.clone(), k.clone()]);
        }
        let weak = Arc::downgrade(self);
        crate::watch::spawn_poll(paths, every, move || {
            weak.upgrade()
                .map(|t| match build_client(&t.files) {
                    Ok(c) => *t.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(c),
                    Err(e) => tracing::error!(target: "mira::tls", error = %e, "client TLS files not reloaded"),
                })
                .is_some()
        })
    }

    fn config(&self) -> Arc<rustls::ClientConfig> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// A connection an internal client made.
#[derive(Debug)]
pub enum ClientConn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

delegate_io!(ClientConn);

/// Connects tonic channels: TCP (TCP_NODELAY), then TLS when configured,
/// checking the server's name against the address dialled.
#[derive(Clone, Debug, Default)]
pub struct Connector {
    pub tls: Option<Arc<ClientTls>>,
}

impl tower_service::Service<axum::http::Uri> for Connector {
    type Response = hyper_util::rt::TokioIo<ClientConn>;
    type Error = io::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: axum::http::Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move {
            let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: {why}"));
            let host = uri.host().ok_or_else(|| bad("no host"))?.to_owned();
            let port = uri.port_u16().unwrap_or(if tls.is_some() { 443 } else { 80 });
            let bare = host.trim_start_matches('[').trim_end_matches(']').to_owned();
            let tcp = TcpStream::connect((bare.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let conn = match tls {
                None => ClientConn::Plain(tcp),
                Some(tls) => {
                    let name = ServerName::try_from(bare).map_err(|_| bad("not a server name"))?;
                    let stream = tokio_rustls::TlsConnector::from(tls.config())
                        .connect(name, tcp)
                        .await?;
                    ClientConn::Tls(Box::new(stream))
                }
            };
            Ok(hyper_util::rt::TokioIo::new(conn))
        })
    }
}

#[cfg(test)]
mod tests;
