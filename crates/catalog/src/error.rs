//! Errors of the catalog: why a command was rejected (replicated, part of
//! the state machine's answer), why a member did not answer a call, and
//! what a client call ended with. Every status the catalog's gRPC services
//! answer with comes from [`CommandError`] or [`RequestError`] through
//! [`ServiceError`].

pub use mira_proto::error::{ErrorCode, ServiceError};
use openraft::BasicNode;
use openraft::error::{CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError};
use serde::{Deserialize, Serialize};
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::service::LEADER_HEADER;
use crate::types::NodeId;

/// Why the state machine (or the validation in front of it) rejected a
/// command. Rejection is whole: no part of the command was applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum CommandError {
    /// The command is malformed; names the field and the reason.
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    /// Named blocks (or a policy) do not exist.
    #[error("not found: {what}")]
    NotFound { what: String },
    /// A different block is already published under this id.
    #[error("block {id} already exists with different contents")]
    AlreadyExists { id: String },
    /// The command is well formed but the current state does not allow it
    /// (a block not live, a lease held by someone else, a watermark going
    /// backwards).
    #[error("{reason}")]
    Conflict { reason: String },
}

impl CommandError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        CommandError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub fn conflict(reason: impl Into<String>) -> Self {
        CommandError::Conflict { reason: reason.into() }
    }
}

impl ServiceError for CommandError {
    fn error_code(&self) -> ErrorCode {
        match self {
            CommandError::Invalid { .. } => ErrorCode::BadRequest,
            CommandError::NotFound { .. } => ErrorCode::NotFound,
            CommandError::AlreadyExists { .. } => ErrorCode::AlreadyExists,
            CommandError::Conflict { .. } => ErrorCode::Conflict,
        }
    }
}

impl From<CommandError> for Status {
    fn from(e: CommandError) -> Status {
        e.to_status()
    }
}

/// Why a catalog member did not answer a request (besides a rejected
/// command): not the leader, no quorum, stopping, a Raft message it must
/// not take.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Command(#[from] CommandError),
    /// A write or linearizable read reached a follower. The answer carries
    /// the leader's address in [`LEADER_HEADER`]; the client goes there.
    #[error("not the leader; the leader is member {id} at {address}")]
    NotLeader { id: NodeId, address: String },
    /// A write or linearizable read while no leader is known.
    #[error("no catalog leader is elected yet")]
    NoLeader,
    /// A watch on a member that lost its leader (partitioned or removed):
    /// the client watches another member.
    #[error("this catalog member knows no leader; watch another")]
    WatchLeaderLost,
    /// Leadership could not be confirmed by a quorum.
    #[error("{0}")]
    NoQuorum(String),
    /// The membership change is not allowed from the current configuration.
    #[error("{0}")]
    Membership(String),
    /// The member's Raft stopped (shutdown or a fatal storage error).
    #[error("catalog member stopping: {0}")]
    Stopping(String),
    #[error("snapshot not finished within {secs} s")]
    SnapshotTimeout { secs: u64 },
    /// A Raft message from a member of another cluster.
    #[error("cluster id mismatch: this member belongs to {ours:?}, the request to {theirs:?}")]
    ForeignCluster { ours: String, theirs: String },
    #[error("malformed raft payload: {0}")]
    MalformedPayload(#[source] postcard::Error),
    #[error("encode raft reply: {0}")]
    Encode(#[source] postcard::Error),
}

impl RequestError {
    /// Where a follower sends a client.
    pub fn forward(f: &ForwardToLeader<NodeId, BasicNode>) -> Self {
        match (&f.leader_id, &f.leader_node) {
            (Some(id), Some(node)) => RequestError::NotLeader {
                id: *id,
                address: node.addr.clone(),
            },
            _ => RequestError::NoLeader,
        }
    }
}

impl From<RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>> for RequestError {
    fn from(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> Self {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => RequestError::forward(&f),
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => RequestError::Membership(e.to_string()),
            RaftError::Fatal(e) => RequestError::Stopping(e.to_string()),
        }
    }
}

impl From<RaftError<NodeId, CheckIsLeaderError<NodeId, BasicNode>>> for RequestError {
    fn from(e: RaftError<NodeId, CheckIsLeaderError<NodeId, BasicNode>>) -> Self {
        match e {
            RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => RequestError::forward(&f),
            RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e)) => RequestError::NoQuorum(e.to_string()),
            RaftError::Fatal(e) => RequestError::Stopping(e.to_string()),
        }
    }
}

impl ServiceError for RequestError {
    fn error_code(&self) -> ErrorCode {
        match self {
            RequestError::Command(e) => e.error_code(),
            RequestError::NotLeader { .. }
            | RequestError::NoLeader
            | RequestError::WatchLeaderLost
            | RequestError::NoQuorum(_)
            | RequestError::Stopping(_) => ErrorCode::Unavailable,
            RequestError::Membership(_) => ErrorCode::Conflict,
            RequestError::SnapshotTimeout { .. } => ErrorCode::Timeout,
            RequestError::ForeignCluster { .. } => ErrorCode::Forbidden,
            RequestError::MalformedPayload(_) => ErrorCode::BadRequest,
            RequestError::Encode(_) => ErrorCode::Internal,
        }
    }

    /// The status from the error code, plus the leader's address on a
    /// redirect.
    fn to_status(&self) -> Status {
        let mut status = Status::new(self.error_code().grpc_code(), self.public_message());
        if let RequestError::NotLeader { address, .. } = self
            && let Ok(v) = MetadataValue::try_from(address.as_str())
        {
            status.metadata_mut().insert(LEADER_HEADER, v);
        }
        status
    }
}

impl From<RequestError> for Status {
    fn from(e: RequestError) -> Status {
        e.to_status()
    }
}

/// Errors of the catalog member itself (storage, startup).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("catalog storage at {path}: {source}")]
    Storage {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A bad configuration value, naming its field (`catalog.peers`).
    #[error(transparent)]
    Config(#[from] mira_common::config::ConfigError),
    #[error("catalog raft: {0}")]
    Raft(String),
    #[error("catalog listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// This member's data directory is empty, but its peers know the id
    /// with another data directory: it was lost (a deleted PVC). Voting
    /// again under the id would break Raft's safety, so the member does
    /// not start.
    #[error(
        "catalog member {node_id} refuses to start: its data directory {data_dir} is empty, but member {peer} \
         knows member {node_id} as data directory incarnation {incarnation:?}, so this member lost its data. \
         Remove the id from the cluster first (mira catalog-admin set-members with every other member), then \
         start this member again to rejoin as a new one and add it back with set-members \
         (docs/operations.md, \"A catalog member lost its data directory\")"
    )]
    LostDataDir {
        node_id: u64,
        data_dir: String,
        peer: u64,
        incarnation: String,
    },
}

/// What a [`crate::client::CatalogClient`] call ended with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The catalog answered with a non-retryable status (a rejected
    /// command, bad input, not found).
    #[error("catalog rejected the request: {}: {}", .0.code(), .0.message())]
    Rejected(Status),
    /// No member gave an answer before the deadline; the last error seen is
    /// attached. A write that ends like this may or may not have been
    /// applied; every write command is idempotent, so retrying is safe.
    #[error("catalog unavailable after {attempts} attempts: {last}")]
    Unavailable { attempts: u32, last: String },
    #[error("invalid catalog endpoint {0}")]
    Endpoint(String),
}

impl ClientError {
    pub fn code(&self) -> Code {
        match self {
            ClientError::Rejected(s) => s.code(),
            ClientError::Unavailable { .. } => Code::Unavailable,
            ClientError::Endpoint(_) => Code::InvalidArgument,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_answers_keep_the_codes_clients_rely_on() {
        let redirect = Status::from(RequestError::forward(&ForwardToLeader::new(
            2,
            BasicNode {
                addr: "10.0.0.2:7000".into(),
            },
        )));
        assert_eq!(redirect.code(), Code::Unavailable);
        assert_eq!(
            redirect.metadata().get(LEADER_HEADER).and_then(|v| v.to_str().ok()),
            Some("10.0.0.2:7000")
        );
        let no_leader = Status::from(RequestError::forward(&ForwardToLeader::empty()));
        assert_eq!(no_leader.code(), Code::Unavailable);
        assert!(no_leader.metadata().get(LEADER_HEADER).is_none());
        let malformed = postcard::from_bytes::<u64>(&[]).expect_err("empty payload");
        for (e, code) in [
            (RequestError::Membership("not a voter".into()), Code::FailedPrecondition),
            (RequestError::SnapshotTimeout { secs: 60 }, Code::DeadlineExceeded),
            (
                RequestError::ForeignCluster {
                    ours: "a".into(),
                    theirs: "b".into(),
                },
                Code::PermissionDenied,
            ),
            (RequestError::MalformedPayload(malformed), Code::InvalidArgument),
            (
                RequestError::Command(CommandError::conflict("busy")),
                Code::FailedPrecondition,
            ),
        ] {
            assert_eq!(Status::from(e).code(), code);
        }
    }
}
