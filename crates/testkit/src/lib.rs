//! Test support for Mira: OTLP data to feed the store and a way to compare what comes back.
//!
//! The crate owns four things, one module each:
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
//!
//! And [`recent_base_time`], the clock-relative base of test record times.
//!
//! `arb` (and proptest) are behind the `arb` feature, which only test
//! builds turn on. Only `mira loadgen` uses the crate outside tests and benches (the corpus); the
//! crate is `publish = false`.

#[cfg(feature = "arb")]
pub mod arb;
pub mod corpus;
pub mod flatten;
pub mod net;
pub mod store;

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
