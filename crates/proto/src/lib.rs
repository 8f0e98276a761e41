//! Mira's internal gRPC contracts, generated at build time from the files
//! in `proto/` (see `build.rs`). Hand-written code lives in the crates that
//! use these types; this crate holds generated code only.

#![allow(clippy::all, missing_debug_implementations)]

/// The catalog: Raft transport and client API (`proto/catalog.proto`).
pub mod catalog {
    tonic::include_proto!("mira.catalog.v1");
}

/// The ingester's recent-data service (`proto/ingester.proto`).
pub mod ingester {
    tonic::include_proto!("mira.ingester.v1");
}
