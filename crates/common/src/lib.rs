//! `mira-common` is the plumbing every Mira role shares, one of each (see
//! docs/development.md, "Adding a role"):
//!
//! - [`error`]: what went wrong → HTTP status and gRPC code (`ErrorCode`,
//!   `ServiceError`; defined next to the generated contracts in
//!   `mira-proto` and re-exported here);
//! - [`retry`]: the backoff every retry loop uses;
//! - [`clock`]: the clock everything that decides by time is given;
//! - [`telemetry`]: the process's metrics registry (a sub-registry per
//!   role) and the probe router (`/metrics`, `/ready`, `/live`);
//! - [`http`]: the one way a role runs an HTTP server and stops it;
//! - [`config`]: duration and size values, field-naming validation, the
//!   TOML file reader;
//! - [`security`]: who may use the ports: external authentication
//!   ([`auth`]), TLS on every port and for internal clients ([`tls`]),
//!   the cluster credential of the internal services ([`cluster`]), and
//!   files followed for changes ([`watch`]);
//! - [`limits`]: per-tenant ingest rates, series, query concurrency and
//!   range (`--limits-file`), carried by the security.
//!
//! It depends on no role crate and holds no data model (that is
//! `mira-core`).

pub mod auth;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod http;
pub mod limits;
pub mod retry;
pub mod security;
pub mod telemetry;
pub mod tls;
pub mod watch;

pub use mira_proto::error;

use std::sync::Arc;

/// What one process gives every role it runs: one clock, one telemetry
/// (registry and probes) and one security (authentication, TLS, cluster
/// credential). `mira serve` passes the same `Process` to all its roles,
/// so its ports answer for all of them.
#[derive(Clone, Debug)]
pub struct Process {
    pub clock: clock::Clock,
    pub telemetry: Arc<telemetry::Telemetry>,
    pub security: security::Security,
}

impl Process {
    /// A process with open security ([`security::Security::open`]).
    pub fn new(clock: clock::Clock) -> Process {
        Process {
            clock,
            telemetry: telemetry::Telemetry::new(),
            security: security::Security::open(),
        }
    }

    /// The same process with `security` (built from its settings with
    /// this process's clock and telemetry).
    pub fn with_security(mut self, security: security::Security) -> Process {
        self.security = security;
        self
    }
}

impl Default for Process {
    /// The system clock and an empty telemetry (tests running a role in
    /// process).
    fn default() -> Self {
        Process::new(clock::Clock::system())
    }
}
