//! A process's security, configured once for every role it runs (the
//! `[security]` table of the configuration file and the `--auth*`,
//! `--tls-*` and `--cluster-*` flags): the external [`Authenticator`],
//! the server TLS of every port, the [`ClusterGuard`] of the internal
//! services, the [`Dialer`] of the internal clients, and the per-tenant
//! [`Limiter`] (`--limits-file`, which sits right after authentication
//! and is reloaded like the tokens file). See
//! docs/security.md for the threat model.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::auth::{AuthConfig, AuthMode, Authenticator, ProxyNet};
use crate::cluster::{ClusterGuard, ClusterSecret, Dialer, GuardConfig};
use crate::config::{ConfigError, Duration};
use crate::limits::Limiter;
use crate::tls::{ClientFiles, ClientTls, ServerFiles, ServerTls};

/// The `[security]` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecuritySettings {
    /// External authentication: none, tokens or trusted-header.
    pub auth: AuthMode,
    /// The tokens file (`--auth tokens`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_file: Option<PathBuf>,
    /// Addresses or networks of the gateway (`--auth trusted-header`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trusted_proxies: Vec<String>,
    /// How often the tokens, limits and TLS files are checked for changes.
    pub reload_interval: Duration,
    /// Per-tenant limits (TOML, see docs/security.md); none: unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits_file: Option<PathBuf>,
    /// Server certificate (PEM, chain first) of every port of the process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA on every port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_client_ca: Option<PathBuf>,
    /// The CA internal clients trust; set, they connect with TLS (and
    /// present tls_cert as their client certificate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    /// The cluster secret, sent and required on internal calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Client certificates signed by this CA are cluster members.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_ca: Option<PathBuf>,
    /// Accept internal calls without a credential.
    pub insecure_cluster: bool,
}

impl Default for SecuritySettings {
    fn default() -> Self {
        SecuritySettings {
            auth: AuthMode::None,
            tokens_file: None,
            trusted_proxies: Vec::new(),
            reload_interval: Duration::from_secs(5),
            limits_file: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_ca: None,
            cluster_secret_file: None,
            cluster_ca: None,
            insecure_cluster: false,
        }
    }
}

/// What the process is, for what its security must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposure {
    /// Serves internal services (catalog member, ingester): needs a
    /// cluster credential or `insecure_cluster`.
    Member,
    /// Only calls internal services (querier, compactor, CLI tools).
    Client,
    /// `mira serve`: every role in one process; without a configured
    /// secret it makes one for itself (and its roles send it); it trusts
    /// loopback callers only with `--auth none`.
    AllInOne,
}

impl SecuritySettings {
    /// Checks what can be checked without reading files.
    pub fn validate(&self, exposure: Exposure) -> Result<(), ConfigError> {
        match self.auth {
            AuthMode::Tokens if self.tokens_file.is_none() => {
                return Err(ConfigError::new(
                    "security.tokens_file",
                    "--auth tokens needs --auth-tokens-file",
                ));
            }
            AuthMode::TrustedHeader if self.trusted_proxies.is_empty() => {
                return Err(ConfigError::new(
                    "security.trusted_proxies",
                    "--auth trusted-header needs --auth-trusted-proxies",
                ));
            }
            _ => {}
        }
        self.proxies()?;
        crate::config::in_range(
            "security.reload_interval",
            self.reload_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        )?;
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::new(
                "security.tls_key",
                "--tls-cert and --tls-key go together",
            ));
        }
        if self.tls_cert.is_none() {
            for (field, set) in [
                ("security.tls_client_ca", self.tls_client_ca.is_some()),
                ("security.cluster_ca", self.cluster_ca.is_some()),
            ] {
                if set {
                    return Err(ConfigError::new(
                        field,
                        "client certificates need TLS: set --tls-cert and --tls-key",
                    ));
                }
            }
        }
        if exposure == Exposure::Member
            && self.cluster_secret_file.is_none()
            && self.cluster_ca.is_none()
            && !self.insecure_cluster
        {
            return Err(ConfigError::new(
                "security.cluster_secret_file",
                "internal ports need a cluster credential: set --cluster-secret-file (or --cluster-ca for mutual TLS), or --insecure-cluster to accept anyone who can reach them",
            ));
        }
        Ok(())
    }

    fn proxies(&self) -> Result<Vec<ProxyNet>, ConfigError> {
        self.trusted_proxies
            .iter()
            .map(|p| p.parse().map_err(|e| ConfigError::new("security.trusted_proxies", e)))
            .collect()
    }

    /// Reads every file and builds the process's security (and starts
    /// following the files' changes). `generated`: `mira serve`'s secret
    /// when none is configured.
    pub fn build(
        &self,
        exposure: Exposure,
        clock: crate::clock::Clock,
        telemetry: &crate::telemetry::Telemetry,
    ) -> Result<Security, ConfigError> {
        self.validate(exposure)?;
        let every = self.reload_interval.get();
        let auth = Authenticator::new(
            &AuthConfig {
                mode: self.auth,
                tokens_file: self.tokens_file.clone(),
                trusted_proxies: self.proxies()?,
            },
            clock.clone(),
            telemetry,
        )?;
        let mut tasks = Vec::new();
        tasks.extend(auth.watch(every));
        let limits = match &self.limits_file {
            Some(path) => {
                let l = Limiter::load(path, clock.clone(), telemetry)
                    .map_err(|e| ConfigError::new("security.limits_file", e.to_string()))?;
                tasks.extend(l.watch(every));
                l
            }
            None => Limiter::unlimited(),
        };
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                // `mira serve` without --tls-ca: its roles call each other
                // in plain TCP on loopback.
                let plain_loopback = exposure == Exposure::AllInOne && self.tls_ca.is_none();
                let t = ServerTls::load_with(
                    ServerFiles {
                        cert: cert.clone(),
                        key: key.clone(),
                        client_ca: self.tls_client_ca.clone(),
                        cluster_ca: self.cluster_ca.clone(),
                    },
                    plain_loopback,
                )
                .map_err(|e| ConfigError::new("security.tls_cert", e.to_string()))?;
                tasks.push(t.watch(every));
                Some(t)
            }
            _ => None,
        };
        let client_tls = match &self.tls_ca {
            Some(ca) => {
                let t = ClientTls::load(ClientFiles {
                    ca: ca.clone(),
                    identity: self.tls_cert.clone().zip(self.tls_key.clone()),
                })
                .map_err(|e| ConfigError::new("security.tls_ca", e.to_string()))?;
                tasks.push(t.watch(every));
                Some(t)
            }
            None => None,
        };
        let mut secret = match &self.cluster_secret_file {
            Some(p) => Some(
                ClusterSecret::load(p).map_err(|e| ConfigError::new("security.cluster_secret_file", e.to_string()))?,
            ),
            None => None,
        };
        let all_in_one = exposure == Exposure::AllInOne;
        if all_in_one && secret.is_none() {
            secret = Some(ClusterSecret::generate().map_err(|e| ConfigError::new("security.cluster_secret_file", e))?);
        }
        // Loopback peers are trusted only by `mira serve` with `--auth
        // none`, where every tenant's data is open to every caller anyway;
        // with authentication on, every peer shows the secret (serve's own
        // roles send the one it made) or a member certificate.
        let trust_loopback = all_in_one && self.auth == AuthMode::None && !self.insecure_cluster;
        if trust_loopback {
            tracing::warn!(
                target: "mira::cluster",
                "--auth none: the recent-data service on the OTLP/gRPC port, the catalog and Raft answer every loopback peer without a credential; any process on this host or in this pod, and any remote client a mesh sidecar forwards from 127.0.0.6, reads every tenant's rows not yet published and can change the catalog (see docs/security.md#internal-ports)"
            );
        }
        let guard = ClusterGuard::new(
            GuardConfig {
                secret: secret.clone(),
                trust_loopback,
                open: self.insecure_cluster,
            },
            telemetry,
        );
        if self.insecure_cluster && exposure != Exposure::Client {
            tracing::warn!(target: "mira::cluster", "--insecure-cluster: internal ports (catalog, Raft, recent data) answer anyone who can reach them");
        }
        Ok(Security {
            auth,
            tls,
            guard,
            dialer: Dialer::new(client_tls, secret),
            limits,
            _tasks: Arc::new(Tasks(tasks)),
        })
    }
}

/// Aborts the reload tasks when the last copy of the security goes.
#[derive(Debug)]
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// A process's security (cheap to clone).
#[derive(Clone, Debug)]
pub struct Security {
    pub auth: Arc<Authenticator>,
    /// TLS of every listening port; `None`: plain TCP.
    pub tls: Option<Arc<ServerTls>>,
    pub guard: Arc<ClusterGuard>,
    pub dialer: Dialer,
    /// Per-tenant limits (unlimited without `--limits-file`).
    pub limits: Arc<Limiter>,
    _tasks: Arc<Tasks>,
}

impl Security {
    /// No authentication, no TLS, internal ports open, no limits: what
    /// tests running roles inside their own process use.
    pub fn open() -> Security {
        Security::open_with_limits(Limiter::unlimited())
    }

    /// [`Security::open`] with per-tenant limits (tests of the limits).
    pub fn open_with_limits(limits: Arc<Limiter>) -> Security {
        Security {
            auth: Authenticator::open(),
            tls: None,
            guard: ClusterGuard::open(),
            dialer: Dialer::default(),
            limits,
            _tasks: Arc::new(Tasks(Vec::new())),
        }
    }

    /// Logs a warning when an external port listens beyond loopback with
    /// `--auth none`.
    pub fn warn_if_open(&self, role: &str, listen: SocketAddr) {
        if self.auth.mode() == AuthMode::None && !listen.ip().is_loopback() {
            tracing::warn!(
                target: "mira::auth",
                role,
                %listen,
                "--auth none on an address beyond loopback: anyone who reaches it can write and read every tenant (see docs/security.md)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn bad_combinations_name_the_field() {
        type Change = fn(&mut SecuritySettings);
        let cases: [(&str, Exposure, Change); 7] = [
            ("security.tokens_file", Exposure::Client, |s| s.auth = AuthMode::Tokens),
            ("security.trusted_proxies", Exposure::Client, |s| {
                s.auth = AuthMode::TrustedHeader
            }),
            ("security.trusted_proxies", Exposure::Client, |s| {
                s.trusted_proxies = vec!["the gateway".to_owned()]
            }),
            ("security.tls_key", Exposure::Client, |s| {
                s.tls_cert = Some("c.pem".into())
            }),
            ("security.tls_client_ca", Exposure::Client, |s| {
                s.tls_client_ca = Some("ca.pem".into())
            }),
            ("security.reload_interval", Exposure::Client, |s| {
                s.reload_interval = Duration::default()
            }),
            ("security.cluster_secret_file", Exposure::Member, |_| {}),
        ];
        for (field, exposure, change) in cases {
            let mut s = SecuritySettings::default();
            change(&mut s);
            assert_eq!(s.validate(exposure).expect_err(field).field, field);
        }
        SecuritySettings::default()
            .validate(Exposure::Client)
            .expect("defaults for a client");
        SecuritySettings::default()
            .validate(Exposure::AllInOne)
            .expect("defaults for serve");
        let s = SecuritySettings {
            insecure_cluster: true,
            ..SecuritySettings::default()
        };
        s.validate(Exposure::Member).expect("explicitly open");
    }

    #[tokio::test]
    async fn serve_makes_its_own_secret_and_trusts_loopback_only_without_auth() {
        let t = crate::telemetry::Telemetry::new();
        let s = SecuritySettings::default()
            .build(Exposure::AllInOne, crate::clock::Clock::system(), &t)
            .expect("serve");
        let mut loopback = axum::http::Extensions::new();
        loopback.insert(axum::extract::ConnectInfo(crate::tls::PeerInfo {
            addr: "127.0.0.6:9".parse().expect("addr"),
            tls: false,
            client_cert: false,
            cluster_member: false,
        }));
        let none = tonic::metadata::MetadataMap::new();
        s.guard
            .check("catalog", &none, &loopback)
            .expect("loopback, --auth none");
        // With authentication on, a loopback peer (a mesh sidecar's
        // 127.0.0.6 included) needs the process's own secret.
        let dir = tempfile::tempdir().expect("dir");
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "").expect("tokens");
        let s = SecuritySettings {
            auth: AuthMode::Tokens,
            tokens_file: Some(tokens),
            ..SecuritySettings::default()
        }
        .build(Exposure::AllInOne, crate::clock::Clock::system(), &t)
        .expect("serve with tokens");
        let refused = s
            .guard
            .check("recent", &none, &loopback)
            .expect_err("no loopback trust");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        let call = s.dialer.credential().call(tonic::Request::new(())).expect("credential");
        s.guard
            .check("recent", call.metadata(), &loopback)
            .expect("the process's own secret");
        // A secret file that is missing is named.
        let e = SecuritySettings {
            cluster_secret_file: Some("/nonexistent/secret".into()),
            ..SecuritySettings::default()
        }
        .build(Exposure::Member, crate::clock::Clock::system(), &t)
        .expect_err("missing");
        assert!(e.to_string().contains("/nonexistent/secret"), "{e}");
    }
}
