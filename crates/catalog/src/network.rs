//! Raft transport over tonic: each openraft RPC is serialized with postcard
//! into a `RaftRequest` that also names the cluster, so a stray member of
//! another cluster is refused.

use std::time::Duration;

use mira_common::cluster::{ClusterChannel, Dialer};
use mira_proto::catalog::RaftRequest;
use mira_proto::catalog::raft_client::RaftClient;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{AnyError, BasicNode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::types::{NodeId, TypeConfig};

/// Largest Raft message in either direction (snapshots are chunked by
/// openraft well below this).
pub const MAX_RAFT_MESSAGE: usize = 64 * 1024 * 1024;

/// Builds a connection per target member.
#[derive(Clone, Debug)]
pub struct Network {
    cluster_id: String,
    dialer: Dialer,
}

impl Network {
    /// Connections to members of `cluster_id`, made by `dialer` (TLS and
    /// the cluster credential).
    pub fn new(cluster_id: String, dialer: Dialer) -> Network {
        Network { cluster_id, dialer }
    }
}

/// A lazily connected channel to one member.
#[derive(Debug)]
pub struct Connection {
    target: NodeId,
    cluster_id: String,
    dialer: Dialer,
    client: Option<RaftClient<ClusterChannel>>,
    addr: String,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Connection {
        Connection {
            target,
            cluster_id: self.cluster_id.clone(),
            dialer: self.dialer.clone(),
            client: None,
            addr: node.addr.clone(),
        }
    }
}

type RpcErr<E> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

/// The URL tonic connects to for a member address (`host:port` or a URL).
pub fn endpoint_url(addr: &str) -> String {
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}

impl Connection {
    fn client<E: std::error::Error>(&mut self) -> Result<RaftClient<ClusterChannel>, RpcErr<E>> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let channel = self
            .dialer
            .channel(&self.addr, Duration::from_secs(1))
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&AnyError::error(e))))?;
        let client = RaftClient::new(channel)
            .max_decoding_message_size(MAX_RAFT_MESSAGE)
            .max_encoding_message_size(MAX_RAFT_MESSAGE);
        self.client = Some(client.clone());
        Ok(client)
    }

    async fn call<Req, Resp, E>(&mut self, kind: RpcKind, req: &Req, option: &RPCOption) -> Result<Resp, RpcErr<E>>
    where
        Req: Serialize + EntryCount,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload = postcard::to_stdvec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        if payload.len() > MAX_RAFT_MESSAGE {
            // openraft retries with fewer entries (append only; snapshots
            // are chunked well below the limit).
            let entries = match kind {
                RpcKind::Append => (req.entry_count() / 2).max(1),
                _ => 1,
            };
            return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(entries)));
        }
        let mut request = tonic::Request::new(RaftRequest {
            cluster_id: self.cluster_id.clone(),
            payload,
        });
        request.set_timeout(option.hard_ttl());
        let mut client = self.client()?;
        let reply = match kind {
            RpcKind::Append => client.append_entries(request).await,
            RpcKind::Vote => client.vote(request).await,
            RpcKind::Snapshot => client.install_snapshot(request).await,
        };
        let reply = match reply {
            Ok(r) => r.into_inner(),
            Err(status) => {
                let err = AnyError::error(format!("{}: {}", status.code(), status.message()));
                return Err(match status.code() {
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                        // Drop the channel so the next call reconnects.
                        self.client = None;
                        RPCError::Unreachable(Unreachable::new(&err))
                    }
                    _ => RPCError::Network(NetworkError::new(&err)),
                });
            }
        };
        let result: Result<Resp, RaftError<NodeId, E>> =
            postcard::from_bytes(&reply.payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// How many log entries a Raft request carries (for the size hint).
trait EntryCount {
    fn entry_count(&self) -> u64;
}

impl EntryCount for AppendEntriesRequest<TypeConfig> {
    fn entry_count(&self) -> u64 {
        self.entries.len() as u64
    }
}

impl EntryCount for InstallSnapshotRequest<TypeConfig> {
    fn entry_count(&self) -> u64 {
        0
    }
}

impl EntryCount for VoteRequest<NodeId> {
    fn entry_count(&self) -> u64 {
        0
    }
}

#[derive(Clone, Copy, Debug)]
enum RpcKind {
    Append,
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr<openraft::error::Infallible>> {
        self.call(RpcKind::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        self.call(RpcKind::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr<openraft::error::Infallible>> {
        self.call(RpcKind::Vote, &rpc, &option).await
    }
}
