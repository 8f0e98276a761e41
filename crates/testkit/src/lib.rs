//! Test support for Mira: OTLP data to feed the store and a way to compare what comes back.
//!
//! The crate owns these things, one module each:
//!
//! - [`corpus`]: a deterministic OTLP generator shaped like a real load generator (logs, traces,
//!   metrics; low or high cardinality). Same seed, same bytes. Used by tests, benches and the load
//!   generator.
//! - [`arb`]: proptest strategies producing arbitrary but valid OTLP export requests that stress
//!   edge cases (empty strings, `None` values, NaN, extreme integers, nested values), for
//!   round-trip property tests.
//! - [`flatten`]: a canonical form of an export request, one entry per leaf (log record, span, data
//!   point) with its full resource and scope context, so two requests can be compared "equal modulo
//!   resource/scope grouping order".
//! - [`store`]: an in-memory object store that records GET ranges and can stall writes.
//! - [`net`]: free loopback ports and waiting on a condition with a deadline.
//! - [`http`]: an HTTP client for the servers under test (`reqwest`), waiting for `/ready`, and a
//!   raw socket writer for the hostile requests no real client sends.
//! - [`otlp`]: small hand-written exports whose records the tests name.
//! - [`push`]: the corpus as Prometheus remote write and Loki push requests, so the load generator
//!   and the tests send the same data over those protocols as over OTLP.
//! - [`certs`]: certificate authorities and the certificates they sign (`rcgen`), written to files
//!   the way cert-manager rotates them, for the TLS tests (behind the `certs` feature).
//!
//! And two times: [`recent_base_time`], the clock-relative base of test record times, and
//! [`EPOCH_NS`] (with [`EPOCH_S`]), the fixed instant of tests that need a date, not the clock.
//!
//! `arb` (and proptest) are behind the `arb` feature and `http` (and reqwest) behind the `http`
//! feature, which only test builds turn on. Only `mira loadgen` uses the crate outside tests and
//! benches (the corpus); the crate is `publish = false`.

#[cfg(feature = "arb")]
pub mod arb;
#[cfg(feature = "certs")]
pub mod certs;
pub mod corpus;
pub mod flatten;
#[cfg(feature = "http")]
pub mod http;
pub mod net;
pub mod otlp;
pub mod push;
pub mod store;

/// 2026-12-02T00:00:00Z in Unix seconds: the fixed instant of tests whose
/// times no ingester checks against its clock (catalog blocks and leases,
/// query ranges).
pub const EPOCH_S: i64 = 1_796_169_600;

/// [`EPOCH_S`] in Unix nanoseconds.
pub const EPOCH_NS: i64 = EPOCH_S * 1_000_000_000;

/// A time ten minutes before this process first asked, in Unix ns: record
/// times for tests that go through an ingester, which refuses times far
/// from its clock (so no test depends on the day it runs).
pub fn recent_base_time() -> u64 {
    static BASE: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        now.saturating_sub(600_000_000_000)
    });
    *BASE
}
