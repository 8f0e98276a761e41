//! Test-only aborts at named steps (the crash tests' kill -9 at an exact
//! point). Each flow names its environment variable: a rewrite job reads
//! [`COMPACTOR`] (`MIRA_FAULT_COMPACTOR=after_put`), a restore reads
//! [`RESTORE`] (`MIRA_FAULT_RESTORE=after_mark`); the value is a
//! comma-separated list of steps. Without the `fault-hooks` feature every
//! point is a no-op.

/// The variable naming the steps a compactor job aborts at.
pub const COMPACTOR: &str = "MIRA_FAULT_COMPACTOR";
/// The variable naming the steps a restore aborts at.
pub const RESTORE: &str = "MIRA_FAULT_RESTORE";

/// Aborts the process at `step` when the variable `var` names it.
pub(crate) fn point(var: &str, step: &str) {
    #[cfg(feature = "fault-hooks")]
    if std::env::var(var).is_ok_and(|s| s.split(',').any(|s| s == step)) {
        tracing::warn!(target: "mira::compactor", var, step, "fault hook: aborting");
        std::process::abort();
    }
    let _ = (var, step);
}
