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
//!
//! Only `mira loadgen` uses it outside tests and benches (the corpus); the
//! crate is `publish = false`.

pub mod arb;
pub mod corpus;
pub mod flatten;
pub mod store;
