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
//!   TOML file reader.
//!
//! It depends on no role crate and holds no data model (that is
//! `mira-core`).

pub mod clock;
pub mod config;
pub mod http;
pub mod retry;
pub mod telemetry;

pub use mira_proto::error;

use std::sync::Arc;

/// What one process gives every role it runs: one clock and one
/// telemetry (registry and probes). `mira serve` passes the same
/// `Process` to all its roles, so its ports answer for all of them.
#[derive(Clone, Debug)]
pub struct Process {
    pub clock: clock::Clock,
    pub telemetry: Arc<telemetry::Telemetry>,
}

impl Process {
    pub fn new(clock: clock::Clock) -> Process {
        Process {
            clock,
            telemetry: telemetry::Telemetry::new(),
        }
    }
}

impl Default for Process {
    /// The system clock and an empty telemetry (tests running a role in
    /// process).
    fn default() -> Self {
        Process::new(clock::Clock::system())
    }
}
