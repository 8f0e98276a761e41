//! mira-catalog: which blocks exist, replicated with openraft.
//!
//! It owns the catalog's state and rules ([`state`]), the records and
//! commands with their validation ([`model`]), their mapping to the gRPC
//! messages ([`pb_impl`]), the durable Raft log in redb
//! ([`log_store`]), the snapshot-backed state machine ([`state_machine`]),
//! the tonic transport between members ([`network`]), the gRPC services
//! ([`service`]), a running member ([`node`]) and what an operator
//! configures for it ([`settings`]), the client every other role uses
//! ([`client`]) and a watch-maintained local copy ([`mirror`]).

// openraft's StorageError and RPCError are large by design; the storage
// and network traits return them, so our helpers do too.
#![allow(clippy::result_large_err)]

pub mod client;
pub mod error;
pub mod log_store;
pub mod metrics;
pub mod mirror;
pub mod model;
pub mod network;
pub mod node;
pub mod pb_impl;
pub mod service;
pub mod settings;
pub mod state;
pub mod state_machine;
#[doc(hidden)]
pub mod testing;
pub mod types;

pub use client::{CatalogClient, ClientConfig};
pub use error::{ClientError, CommandError, Error};
pub use mira_proto::catalog as proto;
pub use mirror::{Mirror, MirrorState};
pub use node::{CatalogNode, NodeConfig, parse_peers};
pub use settings::Settings;
