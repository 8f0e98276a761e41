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
//! - [`config`]: duration and size values, field-naming validation, the
//!   TOML file reader.
//!
//! It depends on no role crate and holds no data model (that is
//! `mira-core`).

pub mod clock;
pub mod config;
pub mod retry;
pub mod telemetry;

pub use mira_proto::error;
