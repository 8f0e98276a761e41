//! Who may use the external ports (OTLP in, query APIs, the compactor's
//! status), one implementation for every role: [`Authenticator::authorize`]
//! takes a request's headers and peer address and the [`Scope`] the
//! endpoint needs, and answers the tenant the request acts for or why it
//! is refused. Modes (`--auth`):
//!
//! - `none`: anyone who reaches the port is any tenant (`X-Scope-OrgID`,
//!   `default` when absent). The default; a warning is logged when a port
//!   listens beyond loopback.
//! - `tokens`: a bearer token (`Authorization: Bearer <token>`, what the
//!   Collector's `headers` or bearertokenauth send) or HTTP basic auth with
//!   the token as password (what Grafana's data sources send). The tokens
//!   file ([`TokenSet`]) maps SHA-256 digests of tokens to tenants and
//!   scopes; it is read again when it changes ([`crate::watch`]). The
//!   tenant header must name one of the token's tenants; a token of one
//!   tenant may omit it.
//! - `trusted-header`: behind a gateway that authenticates. The tenant
//!   header is taken only from peers in the configured proxy networks;
//!   anyone else is refused.
//!
//! Refusals: no or a bad credential is [`AuthError::Unauthenticated`]
//! (401 / UNAUTHENTICATED), a tenant or scope outside the credential
//! [`AuthError::Forbidden`] (403 / PERMISSION_DENIED). Neither message
//! depends on whether the tenant exists or holds data: the decision reads
//! only the credential and the tokens file.
//!
//! A per-tenant limiter belongs right after a successful `authorize` and
//! before the request body is read: every role calls `authorize` at that
//! point (the ingester before it takes an in-flight slot or reads the
//! body, the querier in the middleware in front of every API route).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use mira_core::ids::TenantId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::clock::Clock;
use crate::error::{ErrorCode, ServiceError};

/// The tenant header (Loki/Mimir/Tempo convention).
pub const TENANT_HEADER: &str = "x-scope-orgid";
/// Largest tokens file read.
pub const MAX_TOKENS_FILE: u64 = 4 << 20;
/// Longest token accepted in a request.
pub const MAX_TOKEN_LEN: usize = 4096;

/// What an endpoint lets a caller do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Send OTLP (the ingester's receivers).
    Write,
    /// Query (every query API of the querier).
    Read,
    /// Operator endpoints (the compactor's status).
    Admin,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Write => "write",
            Scope::Read => "read",
            Scope::Admin => "admin",
        })
    }
}

/// `--auth`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthMode {
    #[default]
    None,
    Tokens,
    TrustedHeader,
}

impl std::str::FromStr for AuthMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "none" => Ok(AuthMode::None),
            "tokens" => Ok(AuthMode::Tokens),
            "trusted-header" => Ok(AuthMode::TrustedHeader),
            other => Err(format!(
                "{other:?} is not an auth mode: use none, tokens or trusted-header"
            )),
        }
    }
}

impl fmt::Display for AuthMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AuthMode::None => "none",
            AuthMode::Tokens => "tokens",
            AuthMode::TrustedHeader => "trusted-header",
        })
    }
}

/// Why a request was refused. The messages say what to fix without
/// saying whether a tenant exists.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential, an unknown, expired or revoked one, or a peer that
    /// is not a trusted proxy. 401 / UNAUTHENTICATED.
    #[error("unauthenticated: {0}")]
    Unauthenticated(&'static str),
    /// The credential does not grant this scope on this tenant. 403 /
    /// PERMISSION_DENIED.
    #[error("permission denied: the credential does not grant {scope} on the requested tenant")]
    Forbidden { scope: Scope },
    /// The tenant header is malformed, or required and absent. 400 /
    /// INVALID_ARGUMENT.
    #[error("X-Scope-OrgID: {0}")]
    BadTenant(String),
}

impl ServiceError for AuthError {
    fn error_code(&self) -> ErrorCode {
        match self {
            AuthError::Unauthenticated(_) => ErrorCode::Unauthenticated,
            AuthError::Forbidden { .. } => ErrorCode::Forbidden,
            AuthError::BadTenant(_) => ErrorCode::BadRequest,
        }
    }
}

const NO_CREDENTIAL: &str = "send Authorization: Bearer <token>, or basic auth with the token as the password";
const BAD_CREDENTIAL: &str = "the credential is not valid (unknown, expired or revoked)";
const MALFORMED: &str = "the Authorization header is not \"Bearer <token>\" or \"Basic <base64>\"";
const UNTRUSTED_PEER: &str = "this address is not a trusted proxy; requests must come through the gateway";

impl AuthError {
    /// The HTTP answer: the status, a `WWW-Authenticate` challenge on 401,
    /// and the JSON error body the query APIs use.
    pub fn http_response(&self) -> Response {
        let code = self.error_code();
        let status = StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let kind = match code {
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::Forbidden => "forbidden",
            _ => "bad_data",
        };
        let body = serde_json::json!({"status": "error", "errorType": kind, "error": self.to_string()});
        let mut r = (status, axum::Json(body)).into_response();
        if code == ErrorCode::Unauthenticated {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"mira\", Basic realm=\"mira\""),
            );
        }
        r
    }
}

/// The hex SHA-256 of a token: what the tokens file stores.
pub fn hash_token(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let s = s.as_bytes();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.chunks(2).enumerate() {
        let d = |c: u8| (c as char).to_digit(16);
        out[i] = u8::try_from(d(pair[0])? * 16 + d(pair[1])?).ok()?;
    }
    Some(out)
}

/// One entry of the tokens file as written.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    /// Who holds it (logged on refusals, never sent).
    name: String,
    /// Hex SHA-256 of the token.
    sha256: String,
    tenants: Vec<String>,
    scopes: Vec<Scope>,
    /// After this (RFC 3339) the token is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

/// A token's grant, once parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub name: String,
    pub tenants: BTreeSet<TenantId>,
    pub scopes: BTreeSet<Scope>,
    pub expires: Option<SystemTime>,
}

/// The tokens of a tokens file, by digest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenSet {
    by_digest: HashMap<[u8; 32], Arc<Grant>>,
}

/// Why a tokens file was not taken; names the file and the entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tokens file {path}: {reason}")]
pub struct TokensFileError {
    pub path: String,
    pub reason: String,
}

impl TokenSet {
    /// Parses a tokens file's text (`path` names it in errors).
    pub fn parse(path: &Path, text: &str) -> Result<TokenSet, TokensFileError> {
        let err = |reason: String| TokensFileError {
            path: path.display().to_string(),
            reason,
        };
        let file: TokensFile = toml::from_str(text).map_err(|e| err(e.to_string().trim_end().to_owned()))?;
        let mut by_digest = HashMap::new();
        let mut names = BTreeSet::new();
        for (i, t) in file.token.into_iter().enumerate() {
            let at = |what: &str| {
                format!(
                    "token #{} ({:?}): {what}",
                    i + 1,
                    t.name.chars().take(64).collect::<String>()
                )
            };
            if t.name.is_empty() || t.name.len() > 128 || t.name.chars().any(char::is_control) {
                return Err(err(at("name must be 1..=128 characters without control characters")));
            }
            if !names.insert(t.name.clone()) {
                return Err(err(at("name used twice")));
            }
            let digest = unhex(&t.sha256.to_ascii_lowercase()).ok_or_else(|| {
                err(at(
                    "sha256 must be 64 hex digits (the SHA-256 of the token: printf %s TOKEN | sha256sum)",
                ))
            })?;
            if t.tenants.is_empty() {
                return Err(err(at("tenants is empty")));
            }
            let mut tenants = BTreeSet::new();
            for name in &t.tenants {
                tenants.insert(TenantId::new(name).map_err(|e| err(at(&format!("tenants: {e}"))))?);
            }
            if t.scopes.is_empty() {
                return Err(err(at("scopes is empty (write, read, admin)")));
            }
            let expires = match &t.expires {
                None => None,
                Some(s) => match s.parse::<crate::config::TimeArg>() {
                    Ok(crate::config::TimeArg::At(ns)) => {
                        Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns).unwrap_or(0)))
                    }
                    _ => {
                        return Err(err(at(&format!(
                            "expires {s:?} is not an RFC 3339 time (2027-01-01T00:00:00Z)"
                        ))));
                    }
                },
            };
            let grant = Grant {
                name: t.name.clone(),
                tenants,
                scopes: t.scopes.iter().copied().collect(),
                expires,
            };
            if by_digest.insert(digest, Arc::new(grant)).is_some() {
                return Err(err(at("the same token is listed twice")));
            }
        }
        Ok(TokenSet { by_digest })
    }

    /// Reads and parses a tokens file.
    pub fn load(path: &Path) -> Result<TokenSet, TokensFileError> {
        let err = |reason: String| TokensFileError {
            path: path.display().to_string(),
            reason,
        };
        let len = std::fs::metadata(path).map_err(|e| err(e.to_string()))?.len();
        if len > MAX_TOKENS_FILE {
            return Err(err(format!("{len} bytes, more than the {MAX_TOKENS_FILE} allowed")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        TokenSet::parse(path, &text)
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// The grant of `token`, if it is listed.
    pub fn find(&self, token: &str) -> Option<Arc<Grant>> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.by_digest.get(&digest).cloned()
    }
}

/// The token a request presents: a bearer token, or the password of
/// basic auth. `Ok(None)` when there is no `Authorization` header.
pub fn presented_token(headers: &HeaderMap) -> Result<Option<String>, AuthError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(AuthError::Unauthenticated("more than one Authorization header"));
    }
    let value = value
        .to_str()
        .map_err(|_| AuthError::Unauthenticated(MALFORMED))?
        .trim();
    let (scheme, rest) = value.split_once(' ').ok_or(AuthError::Unauthenticated(MALFORMED))?;
    let rest = rest.trim();
    let token = if scheme.eq_ignore_ascii_case("bearer") {
        rest.to_owned()
    } else if scheme.eq_ignore_ascii_case("basic") {
        if rest.len() > MAX_TOKEN_LEN * 2 {
            return Err(AuthError::Unauthenticated(MALFORMED));
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .map_err(|_| AuthError::Unauthenticated(MALFORMED))?;
        let text = String::from_utf8(decoded).map_err(|_| AuthError::Unauthenticated(MALFORMED))?;
        let (_user, password) = text.split_once(':').ok_or(AuthError::Unauthenticated(MALFORMED))?;
        password.to_owned()
    } else {
        return Err(AuthError::Unauthenticated(MALFORMED));
    };
    if token.is_empty() || token.len() > MAX_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(AuthError::Unauthenticated(BAD_CREDENTIAL));
    }
    Ok(Some(token))
}

/// The tenant header's value: `Ok(None)` when absent or empty.
pub fn header_tenant(headers: &HeaderMap) -> Result<Option<TenantId>, AuthError> {
    let Some(v) = headers.get(TENANT_HEADER) else {
        return Ok(None);
    };
    let v = v
        .to_str()
        .map_err(|_| AuthError::BadTenant("not ASCII".to_owned()))?
        .trim();
    if v.is_empty() {
        return Ok(None);
    }
    TenantId::new(v)
        .map(Some)
        .map_err(|e| AuthError::BadTenant(e.to_string()))
}

/// A network of trusted proxies (`10.0.0.0/8`, `192.168.1.7`, `::1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyNet(ipnet::IpNet);

impl std::str::FromStr for ProxyNet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Ok(n) = s.parse::<ipnet::IpNet>() {
            return Ok(ProxyNet(n.trunc()));
        }
        s.parse::<IpAddr>()
            .map(|a| ProxyNet(ipnet::IpNet::from(a)))
            .map_err(|_| format!("{s:?} is not an address or network (10.0.0.0/8, 192.168.1.7, ::1)"))
    }
}

impl ProxyNet {
    fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.contains(&ip)
    }
}

/// The tenant a request acts for, and who vouched for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub tenant: TenantId,
    /// The token's name, `proxy` (trusted-header) or `anonymous` (none).
    pub who: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    scope: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    outcome: &'static str,
}

/// `mira_auth_*`.
#[derive(Debug, Default)]
struct Metrics {
    requests: Family<OutcomeLabels, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    tokens: Gauge,
}

enum Mode {
    None,
    Tokens { path: PathBuf, set: RwLock<Arc<TokenSet>> },
    TrustedHeader { proxies: Vec<ProxyNet> },
}

/// The process's authenticator (share it as `Arc<Authenticator>`).
pub struct Authenticator {
    mode: Mode,
    metrics: Metrics,
    clock: Clock,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator").field("mode", &self.mode()).finish()
    }
}

/// How the authenticator is set up.
#[derive(Clone, Debug, Default)]
pub struct AuthConfig {
    pub mode: AuthMode,
    pub tokens_file: Option<PathBuf>,
    pub trusted_proxies: Vec<ProxyNet>,
}

impl Authenticator {
    /// `none`, without metrics (tests and in-process roles).
    pub fn open() -> Arc<Authenticator> {
        Arc::new(Authenticator {
            mode: Mode::None,
            metrics: Metrics::default(),
            clock: Clock::system(),
        })
    }

    /// Builds the authenticator (reading the tokens file once) and
    /// registers `mira_auth_*` in `telemetry`. Call
    /// [`Authenticator::watch`] to follow changes of the tokens file.
    pub fn new(
        config: &AuthConfig,
        clock: Clock,
        telemetry: &crate::telemetry::Telemetry,
    ) -> Result<Arc<Authenticator>, crate::config::ConfigError> {
        use crate::config::ConfigError;
        let mode = match config.mode {
            AuthMode::None => Mode::None,
            AuthMode::Tokens => {
                let path = config.tokens_file.clone().ok_or_else(|| {
                    ConfigError::new("security.tokens_file", "--auth tokens needs --auth-tokens-file")
                })?;
                let set = TokenSet::load(&path).map_err(|e| ConfigError::new("security.tokens_file", e.to_string()))?;
                Mode::Tokens {
                    path,
                    set: RwLock::new(Arc::new(set)),
                }
            }
            AuthMode::TrustedHeader => {
                if config.trusted_proxies.is_empty() {
                    return Err(ConfigError::new(
                        "security.trusted_proxies",
                        "--auth trusted-header needs --auth-trusted-proxies (the gateway's addresses or networks)",
                    ));
                }
                Mode::TrustedHeader {
                    proxies: config.trusted_proxies.clone(),
                }
            }
        };
        let metrics = Metrics::default();
        telemetry.register("auth", |r| {
            r.register(
                "requests",
                "Requests checked by the external authentication, by scope and outcome",
                metrics.requests.clone(),
            );
            r.register("reloads", "Tokens file reloads by outcome", metrics.reloads.clone());
            r.register("tokens", "Tokens in the tokens file in use", metrics.tokens.clone());
        });
        let auth = Authenticator { mode, metrics, clock };
        if let Mode::Tokens { set, .. } = &auth.mode {
            auth.metrics
                .tokens
                .set(i64::try_from(read(set).len()).unwrap_or(i64::MAX));
        }
        Ok(Arc::new(auth))
    }

    pub fn mode(&self) -> AuthMode {
        match self.mode {
            Mode::None => AuthMode::None,
            Mode::Tokens { .. } => AuthMode::Tokens,
            Mode::TrustedHeader { .. } => AuthMode::TrustedHeader,
        }
    }

    /// Reads the tokens file again when it changes (checked every
    /// `every`); a file that no longer parses keeps the tokens in use,
    /// logs why and counts `mira_auth_reloads_total{outcome="error"}`.
    /// Nothing to do in the other modes. Stops when the authenticator is
    /// dropped.
    pub fn watch(self: &Arc<Self>, every: Duration) -> Option<tokio::task::JoinHandle<()>> {
        let Mode::Tokens { path, .. } = &self.mode else {
            return None;
        };
        let weak = Arc::downgrade(self);
        Some(crate::watch::spawn_poll(vec![path.clone()], every, move || {
            weak.upgrade().map(|a| a.reload()).is_some()
        }))
    }

    /// Reads the tokens file now; `true` when the new tokens are in use.
    pub fn reload(&self) -> bool {
        let Mode::Tokens { path, set } = &self.mode else {
            return true;
        };
        match TokenSet::load(path) {
            Ok(new) => {
                let n = new.len();
                *set.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(new);
                self.metrics.tokens.set(i64::try_from(n).unwrap_or(i64::MAX));
                self.metrics
                    .reloads
                    .get_or_create(&ReloadLabels { outcome: "ok" })
                    .inc();
                tracing::info!(target: "mira::auth", path = %path.display(), tokens = n, "tokens file reloaded");
                true
            }
            Err(e) => {
                self.metrics
                    .reloads
                    .get_or_create(&ReloadLabels { outcome: "error" })
                    .inc();
                tracing::error!(target: "mira::auth", error = %e, "tokens file not reloaded; the previous tokens stay in use");
                false
            }
        }
    }

    /// The tenant a request may act for with `scope`, or why not.
    /// `require_tenant`: without a tenant header (and without a token of
    /// one tenant) refuse instead of using `default`.
    pub fn authorize(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
        scope: Scope,
        require_tenant: bool,
    ) -> Result<Principal, AuthError> {
        let result = self.decide(headers, peer, scope, require_tenant);
        let outcome = match &result {
            Ok(_) => "ok",
            Err(AuthError::Unauthenticated(_)) => "unauthenticated",
            Err(AuthError::Forbidden { .. }) => "forbidden",
            Err(AuthError::BadTenant(_)) => "bad_tenant",
        };
        self.metrics
            .requests
            .get_or_create(&OutcomeLabels {
                scope: scope.to_string(),
                outcome,
            })
            .inc();
        result
    }

    fn decide(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
        scope: Scope,
        require_tenant: bool,
    ) -> Result<Principal, AuthError> {
        let named_or_default = |who: &str| -> Result<Principal, AuthError> {
            let tenant = match header_tenant(headers)? {
                Some(t) => t,
                None if require_tenant => return Err(AuthError::BadTenant("required by this server".to_owned())),
                None => TenantId::default_tenant(),
            };
            Ok(Principal {
                tenant,
                who: who.to_owned(),
            })
        };
        match &self.mode {
            Mode::None => named_or_default("anonymous"),
            Mode::TrustedHeader { proxies } => match peer {
                Some(ip) if proxies.iter().any(|n| n.contains(ip)) => named_or_default("proxy"),
                _ => Err(AuthError::Unauthenticated(UNTRUSTED_PEER)),
            },
            Mode::Tokens { set, .. } => {
                let token = presented_token(headers)?.ok_or(AuthError::Unauthenticated(NO_CREDENTIAL))?;
                let grant = read(set)
                    .find(&token)
                    .ok_or(AuthError::Unauthenticated(BAD_CREDENTIAL))?;
                if grant.expires.is_some_and(|at| self.clock.now() >= at) {
                    return Err(AuthError::Unauthenticated(BAD_CREDENTIAL));
                }
                if !grant.scopes.contains(&scope) {
                    tracing::debug!(target: "mira::auth", token = %grant.name, %scope, "scope not granted");
                    return Err(AuthError::Forbidden { scope });
                }
                let tenant = match header_tenant(headers)? {
                    Some(t) => t,
                    None if grant.tenants.len() == 1 => grant
                        .tenants
                        .iter()
                        .next()
                        .cloned()
                        .ok_or(AuthError::Forbidden { scope })?,
                    None => {
                        return Err(AuthError::BadTenant(
                            "required: this credential is valid for more than one tenant".to_owned(),
                        ));
                    }
                };
                if !grant.tenants.contains(&tenant) {
                    tracing::debug!(target: "mira::auth", token = %grant.name, tenant = %tenant, "tenant not granted");
                    return Err(AuthError::Forbidden { scope });
                }
                Ok(Principal {
                    tenant,
                    who: grant.name.clone(),
                })
            }
        }
    }
}

fn read(set: &RwLock<Arc<TokenSet>>) -> Arc<TokenSet> {
    set.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

/// A new random token (32 bytes, hex) from the TLS provider's generator.
pub fn new_token() -> Result<String, String> {
    let mut buf = [0u8; 32];
    rustls::crypto::aws_lc_rs::default_provider()
        .secure_random
        .fill(&mut buf)
        .map_err(|_| "the system's random generator failed".to_owned())?;
    Ok(hex(&buf))
}

#[cfg(test)]
mod tests;
