//! Mira's internal gRPC contracts, generated at build time from the files
//! in `proto/` (see `build.rs`), and the one mapping from errors to HTTP
//! statuses and gRPC codes every role answers with ([`error`]). Other
//! hand-written code lives in the crates that use these types.

pub mod error;

/// The catalog: Raft transport and client API (`proto/catalog.proto`).
#[allow(clippy::all, missing_debug_implementations)]
pub mod catalog {
    tonic::include_proto!("mira.catalog.v1");
}

/// The ingester's recent-data service (`proto/ingester.proto`).
#[allow(clippy::all, missing_debug_implementations)]
pub mod ingester {
    tonic::include_proto!("mira.ingester.v1");
}
