//! Mira's internal gRPC contracts, generated at build time from the files
//! in `proto/` (see `build.rs`), and the one mapping from errors to HTTP
//! statuses and gRPC codes every role answers with ([`error`]). Other
//! hand-written code lives in the crates that use these types.

pub mod error;

/// The generated code, nested as the protobuf packages are, so one file's
/// references to another package's types (the ingester's request names the
/// catalog's `Signal`) resolve.
#[allow(clippy::all, missing_debug_implementations)]
mod generated {
    pub mod mira {
        pub mod catalog {
            pub mod v1 {
                tonic::include_proto!("mira.catalog.v1");
            }
        }
        pub mod ingester {
            pub mod v1 {
                tonic::include_proto!("mira.ingester.v1");
            }
        }
    }
}

/// The catalog: Raft transport and client API (`proto/catalog.proto`).
pub use generated::mira::catalog::v1 as catalog;
/// The ingester's recent-data service (`proto/ingester.proto`).
pub use generated::mira::ingester::v1 as ingester;
