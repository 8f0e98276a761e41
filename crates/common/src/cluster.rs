//! The internal ports are not open doors: the catalog's Raft and client
//! services and the ingesters' recent-data service answer only cluster
//! members. A caller is a member when it
//!
//! - sends the cluster secret (`--cluster-secret-file`) in the
//!   [`SECRET_HEADER`] metadata of every call (compared in constant time,
//!   as SHA-256 digests), or
//! - connected with a client certificate that verifies against
//!   `--cluster-ca` (mutual TLS, see [`crate::tls`]), or
//! - is on loopback and the process trusts loopback (`mira serve` only:
//!   every role is in the one process, and its catalog listens on
//!   127.0.0.1 by default), or
//! - the process runs with `--insecure-cluster` (no check at all, said
//!   loudly at start).
//!
//! Anyone else is refused with UNAUTHENTICATED and counted in
//! `mira_cluster_refused_total{service}`. Every internal client
//! ([`Dialer`]) sends the secret and, over TLS, presents the process's
//! certificate.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::tls::{ClientTls, Connector, PeerInfo};

/// The metadata key carrying the cluster secret.
pub const SECRET_HEADER: &str = "x-mira-cluster-secret";
/// Shortest secret accepted.
pub const MIN_SECRET_LEN: usize = 16;
const MAX_SECRET_FILE: u64 = 4096;

/// Why a cluster secret was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cluster secret {path}: {reason}")]
pub struct SecretError {
    pub path: String,
    pub reason: String,
}

/// The shared secret of a cluster.
#[derive(Clone)]
pub struct ClusterSecret {
    value: AsciiMetadataValue,
    digest: [u8; 32],
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// A secret from its text: at least [`MIN_SECRET_LEN`] visible ASCII
    /// characters (surrounding whitespace, e.g. a final newline, is cut).
    pub fn new(text: &str) -> Result<ClusterSecret, String> {
        let t = text.trim();
        if t.len() < MIN_SECRET_LEN {
            return Err(format!(
                "{} characters; at least {MIN_SECRET_LEN} are needed (e.g. `openssl rand -hex 32`)",
                t.len()
            ));
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("only visible ASCII characters may be used (e.g. `openssl rand -hex 32`)".to_owned());
        }
        let mut value = AsciiMetadataValue::try_from(t).map_err(|e| e.to_string())?;
        value.set_sensitive(true);
        Ok(ClusterSecret {
            value,
            digest: Sha256::digest(t.as_bytes()).into(),
        })
    }

    /// Reads a secret file.
    pub fn load(path: &std::path::Path) -> Result<ClusterSecret, SecretError> {
        let err = |reason: String| SecretError {
            path: path.display().to_string(),
            reason,
        };
        let len = std::fs::metadata(path).map_err(|e| err(e.to_string()))?.len();
        if len > MAX_SECRET_FILE {
            return Err(err(format!("{len} bytes, more than the {MAX_SECRET_FILE} allowed")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        ClusterSecret::new(&text).map_err(err)
    }

    /// A new random secret (32 bytes, hex): `mira serve`'s in-process one.
    pub fn generate() -> Result<ClusterSecret, String> {
        ClusterSecret::new(&crate::auth::new_token()?)
    }

    /// Whether `presented` is this secret, in time independent of where
    /// they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let d: [u8; 32] = Sha256::digest(presented).into();
        bool::from(d.ct_eq(&self.digest))
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    service: &'static str,
}

/// What the internal services accept (one per process).
pub struct ClusterGuard {
    secret: Option<ClusterSecret>,
    trust_loopback: bool,
    open: bool,
    refused: Family<ServiceLabels, Counter>,
}

impl std::fmt::Debug for ClusterGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterGuard")
            .field("secret", &self.secret.is_some())
            .field("trust_loopback", &self.trust_loopback)
            .field("open", &self.open)
            .finish()
    }
}

/// How a process's internal services check callers.
#[derive(Clone, Debug, Default)]
pub struct GuardConfig {
    pub secret: Option<ClusterSecret>,
    /// Callers on loopback are members (`mira serve`).
    pub trust_loopback: bool,
    /// Anyone is a member (`--insecure-cluster`).
    pub open: bool,
}

impl ClusterGuard {
    /// A guard that lets everyone in, without metrics (tests running roles
    /// in process).
    pub fn open() -> Arc<ClusterGuard> {
        Arc::new(ClusterGuard {
            secret: None,
            trust_loopback: false,
            open: true,
            refused: Family::default(),
        })
    }

    /// The guard, with `mira_cluster_refused_total` in `telemetry`.
    pub fn new(config: GuardConfig, telemetry: &crate::telemetry::Telemetry) -> Arc<ClusterGuard> {
        let refused = Family::<ServiceLabels, Counter>::default();
        telemetry.register("cluster", |r| {
            r.register(
                "refused",
                "Internal calls (Raft, catalog, recent data) refused for want of a cluster credential",
                refused.clone(),
            );
        });
        Arc::new(ClusterGuard {
            secret: config.secret,
            trust_loopback: config.trust_loopback,
            open: config.open,
            refused,
        })
    }

    /// Whether the caller of a request is a cluster member; counts and
    /// refuses (UNAUTHENTICATED) when not.
    pub fn check(
        &self,
        service: &'static str,
        metadata: &MetadataMap,
        extensions: &axum::http::Extensions,
    ) -> Result<(), tonic::Status> {
        if self.open {
            return Ok(());
        }
        let peer = PeerInfo::of(extensions);
        if peer.is_some_and(|p| p.cluster_member) {
            return Ok(());
        }
        if let (Some(secret), Some(v)) = (&self.secret, metadata.get(SECRET_HEADER))
            && secret.matches(v.as_bytes())
        {
            return Ok(());
        }
        if self.trust_loopback && peer.is_some_and(|p| p.addr.ip().is_loopback()) {
            return Ok(());
        }
        self.refused.get_or_create(&ServiceLabels { service }).inc();
        tracing::warn!(
            target: "mira::cluster",
            service,
            peer = ?peer.map(|p| p.addr),
            "refused an internal call without a valid cluster credential"
        );
        Err(tonic::Status::unauthenticated(format!(
            "the {service} service answers cluster members only: send the cluster secret (--cluster-secret-file) or connect with a certificate of the cluster CA"
        )))
    }

    /// A tonic interceptor that checks every call of `service`.
    pub fn interceptor(self: &Arc<Self>, service: &'static str) -> GuardInterceptor {
        GuardInterceptor {
            guard: self.clone(),
            service,
        }
    }

    /// Wraps a generated tonic server so that every call is checked.
    pub fn wrap<S>(self: &Arc<Self>, service: &'static str, server: S) -> InterceptedService<S, GuardInterceptor> {
        InterceptedService::new(server, self.interceptor(service))
    }
}

/// See [`ClusterGuard::interceptor`].
#[derive(Clone, Debug)]
pub struct GuardInterceptor {
    guard: Arc<ClusterGuard>,
    service: &'static str,
}

impl Interceptor for GuardInterceptor {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        self.guard
            .check(self.service, request.metadata(), request.extensions())?;
        Ok(request)
    }
}

/// Adds the cluster secret to every call of a client.
#[derive(Clone, Debug, Default)]
pub struct Credential(Option<AsciiMetadataValue>);

impl Interceptor for Credential {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert(SECRET_HEADER, v.clone());
        }
        Ok(request)
    }
}

/// A channel to a cluster member that carries the credential.
pub type ClusterChannel = InterceptedService<Channel, Credential>;

/// How internal clients connect: TLS or not, and the secret they send.
#[derive(Clone, Debug, Default)]
pub struct Dialer {
    tls: Option<Arc<ClientTls>>,
    secret: Option<ClusterSecret>,
}

impl Dialer {
    pub fn new(tls: Option<Arc<ClientTls>>, secret: Option<ClusterSecret>) -> Dialer {
        Dialer { tls, secret }
    }

    /// Whether connections use TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The URL for an address (`host:port`, or `http://` / `https://`):
    /// `https://` when this dialer uses TLS.
    pub fn url(&self, addr: &str) -> String {
        let bare = addr
            .strip_prefix("http://")
            .or_else(|| addr.strip_prefix("https://"))
            .unwrap_or(addr);
        if self.tls.is_some() {
            format!("https://{bare}")
        } else {
            format!("http://{bare}")
        }
    }

    /// A lazily connected channel to `addr`.
    pub fn channel(&self, addr: &str, connect_timeout: Duration) -> Result<ClusterChannel, String> {
        if addr.starts_with("https://") && self.tls.is_none() {
            return Err(format!("{addr}: an https:// address needs --tls-ca"));
        }
        let endpoint = Endpoint::from_shared(self.url(addr))
            .map_err(|e| format!("bad address {addr:?}: {e}"))?
            .connect_timeout(connect_timeout);
        let channel = endpoint.connect_with_connector_lazy(Connector { tls: self.tls.clone() });
        Ok(InterceptedService::new(channel, self.credential()))
    }

    /// What this dialer's calls carry: the secret, when it has one.
    pub fn credential(&self) -> Credential {
        Credential(self.secret.as_ref().map(|s| s.value.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(addr: &str, member: bool) -> axum::http::Extensions {
        let mut e = axum::http::Extensions::new();
        e.insert(axum::extract::ConnectInfo(PeerInfo {
            addr: addr.parse().expect("addr"),
            tls: member,
            client_cert: member,
            cluster_member: member,
        }));
        e
    }

    fn with_secret(s: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(SECRET_HEADER, s.parse().expect("ascii"));
        m
    }

    #[test]
    fn secrets_must_be_long_and_printable() {
        assert!(ClusterSecret::new("0123456789abcdef\n").is_ok());
        assert!(ClusterSecret::new("short").expect_err("short").contains("at least 16"));
        assert!(ClusterSecret::new("0123456789abcdef with space").is_err());
        assert!(ClusterSecret::new("0123456789abcdéf0").is_err());
        let g = ClusterSecret::generate().expect("random");
        assert!(g.matches(g.value.as_bytes()));
        assert!(!format!("{g:?}").contains(g.value.to_str().expect("ascii")));
        let dir = tempfile::tempdir().expect("test setup");
        let p = dir.path().join("secret");
        std::fs::write(&p, "x".repeat(5000)).expect("test setup");
        assert!(ClusterSecret::load(&p).expect_err("big").reason.contains("more than"));
        let e = ClusterSecret::load(&dir.path().join("none")).expect_err("missing");
        assert!(e.to_string().contains("none"), "{e}");
    }

    #[test]
    fn the_guard_takes_the_secret_a_member_certificate_or_trusted_loopback() {
        let secret = ClusterSecret::new("the-cluster-secret-0123").expect("secret");
        let t = crate::telemetry::Telemetry::new();
        let guard = ClusterGuard::new(
            GuardConfig {
                secret: Some(secret),
                ..GuardConfig::default()
            },
            &t,
        );
        let none = MetadataMap::new();
        let remote = peer("10.0.0.9:4000", false);
        guard
            .check("raft", &with_secret("the-cluster-secret-0123"), &remote)
            .expect("secret");
        guard
            .check("raft", &none, &peer("10.0.0.9:4000", true))
            .expect("member cert");
        for (m, e) in [
            (&none, &remote),
            (&with_secret("the-cluster-secret-0124"), &remote),
            (&with_secret("the-cluster-secret-012"), &remote),
            (&none, &peer("127.0.0.1:4000", false)),
        ] {
            let s = guard.check("raft", m, e).expect_err("refused");
            assert_eq!(s.code(), tonic::Code::Unauthenticated);
            assert!(s.message().contains("raft"), "{}", s.message());
        }
        let trusting = ClusterGuard::new(
            GuardConfig {
                trust_loopback: true,
                ..GuardConfig::default()
            },
            &crate::telemetry::Telemetry::new(),
        );
        trusting
            .check("catalog", &none, &peer("127.0.0.1:4000", false))
            .expect("loopback");
        assert!(trusting.check("catalog", &none, &remote).is_err());
        assert!(
            trusting
                .check("catalog", &none, &axum::http::Extensions::new())
                .is_err()
        );
        let text = futures::executor::block_on(t.render());
        assert!(
            text.contains("mira_cluster_refused_total{service=\"raft\"} 4"),
            "{text}"
        );
    }
}
