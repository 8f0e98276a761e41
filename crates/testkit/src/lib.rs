//! Test support for Mira: OTLP data to feed the store and a way to compare what comes back.
//!
//! The crate owns three things, one module each:
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
//!
//! Nothing here is used in production code paths; the crate is `publish = false`.

pub mod arb;
pub mod corpus;
pub mod flatten;
