//! The openraft type configuration of the catalog.

use std::io::Cursor;

use crate::error::CommandError;
use crate::model::{Command, Lease};

/// What the state machine answers for one command: accepted (with the lease
/// for lease commands) or rejected whole.
pub type CommandResult = Result<Accepted, CommandError>;

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Accepted {
    pub lease: Option<Lease>,
    /// Fence: the ingester's new epoch.
    pub epoch: Option<u64>,
}

openraft::declare_raft_types!(
    /// Raft types of the catalog.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
