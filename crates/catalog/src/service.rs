//! The gRPC services of a catalog member: the Raft transport (from other
//! members) and the client API (writes, reads, watch, admin).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use mira_core::ids::TenantId;
use mira_proto::catalog as pb;
use openraft::{BasicNode, ChangeMembers};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::error::{CommandError, RequestError};
use crate::metrics::Metrics;
use crate::model::{Command, StateKind, check_time};
use crate::pb_impl::block::{page_token, parse_page_token, state_kind_from_pb};
use crate::pb_impl::{policy, signal};
use crate::state::BlockQuery;
use crate::state_machine::{Catalog, HistoryGone};
use crate::types::{NodeId, Raft};

/// Metadata key carrying the leader's address on a redirect.
pub const LEADER_HEADER: &str = "x-mira-leader";
/// Changes per watch event when sending a full reset.
const RESET_CHUNK: usize = 1_000;
/// Events read from the history per wake-up.
const WATCH_BATCH: usize = 256;
/// How long `trigger_snapshot` waits for the snapshot to be built.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(60);
/// Most blocks one ListBlocks reply holds (about 20 MiB of messages, well
/// under the clients' 64 MiB decoding limit).
pub const MAX_LIST_LIMIT: u32 = 100_000;
/// Blocks per reply of a listing that names no limit and spans more than
/// one tenant or signal.
pub const DEFAULT_LIST_LIMIT: u32 = 10_000;
const NANOS_PER_HOUR: i64 = 3_600_000_000_000;

/// The client API.
#[derive(Clone)]
pub struct CatalogService {
    pub(crate) raft: Raft,
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) metrics: Arc<Metrics>,
    /// Decides which leases are live when a caller sends no time.
    pub(crate) clock: mira_common::clock::Clock,
    pub(crate) node_id: NodeId,
    pub(crate) cluster_id: String,
    /// Full-state resets built at once (each copies the whole state).
    pub(crate) resets: Arc<tokio::sync::Semaphore>,
    /// Reaches the other members when this one removes itself.
    pub(crate) dialer: mira_common::cluster::Dialer,
}

/// Watch resets built concurrently per member.
pub const MAX_CONCURRENT_RESETS: usize = 4;
/// A watch sends a progress event at least this often, so a client can
/// tell a quiet catalog from a dead connection.
pub const WATCH_HEARTBEAT: Duration = Duration::from_secs(1);

impl std::fmt::Debug for CatalogService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogService")
            .field("node_id", &self.node_id)
            .finish()
    }
}

impl CatalogService {
    async fn consistent(&self, linearizable: bool) -> Result<(), Status> {
        if linearizable {
            self.raft.ensure_linearizable().await.map_err(RequestError::from)?;
        }
        Ok(())
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl pb::catalog_server::Catalog for CatalogService {
    async fn write(&self, request: Request<pb::WriteRequest>) -> Result<Response<pb::WriteReply>, Status> {
        let start = Instant::now();
        let cmd = match Command::try_from(request.get_ref()) {
            Ok(c) => c,
            Err(e) => {
                self.metrics.observe_command("invalid", false, start.elapsed());
                return Err(e.into());
            }
        };
        if let Command::SetPolicy(p) = &cmd {
            // The body is checked here, before it enters the log, against
            // this member's copy of the registered offload targets.
            let targets = self.catalog.read(|s, _| s.offload_targets());
            if let Err(e) =
                mira_core::policy::validate(p.kind.to_core(), &p.name, &p.tenant, &p.body_json, Some(&targets))
            {
                self.metrics.observe_command("invalid", false, start.elapsed());
                return Err(Status::invalid_argument(e.to_string()));
            }
        }
        let name = cmd.name();
        let res = self.raft.client_write(cmd).await;
        let reply = match res {
            Ok(resp) => match resp.data {
                Ok(accepted) => Ok(pb::WriteReply {
                    version: resp.log_id.index,
                    lease: accepted.lease.as_ref().map(pb::Lease::from),
                    epoch: accepted.epoch,
                }),
                Err(e) => Err(Status::from(e)),
            },
            Err(e) => Err(RequestError::from(e).into()),
        };
        self.metrics.observe_command(name, reply.is_ok(), start.elapsed());
        reply.map(Response::new)
    }

    async fn list_blocks(
        &self,
        request: Request<pb::ListBlocksRequest>,
    ) -> Result<Response<pb::ListBlocksReply>, Status> {
        let req = request.into_inner();
        let tenant = if req.tenant.is_empty() {
            None
        } else {
            Some(TenantId::new(&req.tenant).map_err(|e| CommandError::invalid("tenant", e.to_string()))?)
        };
        let signal = if req.signal == pb::Signal::Unspecified as i32 {
            None
        } else {
            Some(signal::parse("signal", req.signal)?)
        };
        check_time("min_time_ns", req.min_time_ns)?;
        check_time("max_time_ns", req.max_time_ns)?;
        if req.max_time_ns < req.min_time_ns {
            return Err(CommandError::invalid("max_time_ns", "before min_time_ns").into());
        }
        if let Some(p) = req.partition_start_ns {
            check_time("partition_start_ns", p)?;
            if p % NANOS_PER_HOUR != 0 {
                return Err(CommandError::invalid("partition_start_ns", "not the start of an hour").into());
            }
        }
        let limit = match req.limit {
            0 if tenant.is_some() && signal.is_some() => usize::MAX,
            0 => DEFAULT_LIST_LIMIT as usize,
            n if n > MAX_LIST_LIMIT => {
                return Err(CommandError::invalid("limit", format!("{n}, at most {MAX_LIST_LIMIT}")).into());
            }
            n => n as usize,
        };
        let after = if req.page_token.is_empty() {
            None
        } else {
            Some(parse_page_token(&req.page_token)?)
        };
        let mut states = if req.states.is_empty() {
            vec![StateKind::Live]
        } else {
            req.states
                .iter()
                .map(|s| state_kind_from_pb(*s))
                .collect::<Result<Vec<_>, _>>()?
        };
        states.sort_unstable();
        states.dedup();
        self.consistent(req.linearizable).await?;
        let query = BlockQuery {
            tenant: tenant.as_ref(),
            signal,
            min_time_ns: req.min_time_ns,
            max_time_ns: req.max_time_ns,
            partition_start_ns: req.partition_start_ns,
            states: &states,
            after: after.as_ref(),
            limit,
        };
        let (blocks, next, version) = self.catalog.read(|state, version| {
            let (blocks, next) = state.query_blocks(&query);
            (blocks.into_iter().map(pb::Block::from).collect(), next, version)
        });
        Ok(Response::new(pb::ListBlocksReply {
            blocks,
            version,
            next_page_token: next.as_ref().map(page_token).unwrap_or_default(),
        }))
    }

    async fn get_watermarks(
        &self,
        request: Request<pb::GetWatermarksRequest>,
    ) -> Result<Response<pb::GetWatermarksReply>, Status> {
        let req = request.into_inner();
        self.consistent(req.linearizable).await?;
        let filter = (!req.ingester_id.is_empty()).then_some(req.ingester_id.as_str());
        let (watermarks, version) = self
            .catalog
            .read(|s, v| (s.watermarks(filter).iter().map(pb::Watermark::from).collect(), v));
        Ok(Response::new(pb::GetWatermarksReply { watermarks, version }))
    }

    async fn list_ingesters(
        &self,
        request: Request<pb::ListIngestersRequest>,
    ) -> Result<Response<pb::ListIngestersReply>, Status> {
        let req = request.into_inner();
        check_time("now_ns", req.now_ns)?;
        self.consistent(req.linearizable).await?;
        let now = if req.now_ns == 0 {
            self.clock.now_ns()
        } else {
            req.now_ns
        };
        let (ingesters, version) = self.catalog.read(|s, v| {
            let listed = if req.include_expired {
                s.registered_ingesters()
            } else {
                s.live_ingesters(now)
            };
            (listed.iter().map(pb::IngesterLease::from).collect(), v)
        });
        Ok(Response::new(pb::ListIngestersReply { ingesters, version }))
    }

    async fn list_policies(
        &self,
        request: Request<pb::ListPoliciesRequest>,
    ) -> Result<Response<pb::ListPoliciesReply>, Status> {
        let req = request.into_inner();
        let kind = policy::kind_filter_from_pb(req.kind)?;
        self.consistent(req.linearizable).await?;
        let (policies, offload_targets, offload_target_checks, version) = self.catalog.read(|s, v| {
            let policies = s
                .policies(kind)
                .iter()
                .map(|p| pb::Policy {
                    status_json: s.policy_status(p.kind, &p.name).unwrap_or_default().to_owned(),
                    ..pb::Policy::from(p)
                })
                .collect();
            let checks = (s.offload_target_checks().into_iter())
                .map(|c| pb::OffloadTargetCheck {
                    name: c.name,
                    reachable: c.reachable,
                    checked_at_ns: c.checked_at_ns,
                    error: c.error,
                })
                .collect();
            (policies, s.offload_targets(), checks, v)
        });
        Ok(Response::new(pb::ListPoliciesReply {
            policies,
            version,
            offload_targets,
            offload_target_checks,
        }))
    }

    async fn list_leases(
        &self,
        request: Request<pb::ListLeasesRequest>,
    ) -> Result<Response<pb::ListLeasesReply>, Status> {
        self.consistent(request.get_ref().linearizable).await?;
        let (leases, version) = self
            .catalog
            .read(|s, v| (s.leases().iter().map(pb::Lease::from).collect(), v));
        Ok(Response::new(pb::ListLeasesReply { leases, version }))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<WatchStream>, Status> {
        let after = request.into_inner().after_version;
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(watch_loop(
            self.catalog.clone(),
            self.raft.clone(),
            self.resets.clone(),
            after,
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn status(&self, _request: Request<pb::StatusRequest>) -> Result<Response<pb::StatusReply>, Status> {
        let m = self.raft.metrics().borrow().clone();
        let registered = self.catalog.read(|s, _| s.members().clone());
        let members = m
            .membership_config
            .membership()
            .nodes()
            .map(|(id, node)| pb::Member {
                id: *id,
                address: node.addr.clone(),
                voter: m.membership_config.membership().voter_ids().any(|v| v == *id),
                incarnation: registered.get(id).cloned().unwrap_or_default(),
            })
            .collect();
        let leader_address = m
            .current_leader
            .and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.addr.clone()))
            .unwrap_or_default();
        Ok(Response::new(pb::StatusReply {
            node_id: self.node_id,
            cluster_id: self.cluster_id.clone(),
            term: m.current_term,
            leader_id: m.current_leader,
            leader_address,
            applied_index: m.last_applied.map_or(0, |l| l.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            members,
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
        }))
    }

    async fn change_membership(
        &self,
        request: Request<pb::ChangeMembershipRequest>,
    ) -> Result<Response<pb::ChangeMembershipReply>, Status> {
        let req = request.into_inner();
        if req.members.is_empty() {
            return Err(CommandError::invalid("members", "a cluster needs at least one member").into());
        }
        let mut wanted = BTreeMap::new();
        for m in &req.members {
            let parses = tonic::transport::Endpoint::from_shared(crate::network::endpoint_url(&m.address)).is_ok();
            if m.address.is_empty() || m.address.len() > 512 || !parses || m.address.contains(char::is_whitespace) {
                return Err(CommandError::invalid(
                    "members.address",
                    format!("{:?} is not host:port", m.address.chars().take(64).collect::<String>()),
                )
                .into());
            }
            if wanted.insert(m.id, m.address.clone()).is_some() {
                return Err(CommandError::invalid("members.id", format!("member {} named twice", m.id)).into());
            }
        }
        let known: BTreeMap<NodeId, String> = {
            let m = self.raft.metrics().borrow().clone();
            m.membership_config
                .membership()
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect()
        };
        for (id, addr) in &wanted {
            if known.get(id) != Some(addr) {
                self.raft
                    .add_learner(*id, BasicNode { addr: addr.clone() }, true)
                    .await
                    .map_err(RequestError::from)?;
            }
        }
        let voters = wanted.keys().copied().collect();
        let resp = self
            .raft
            .change_membership(ChangeMembers::ReplaceAllVoters(voters), false)
            .await
            .map_err(RequestError::from)?;
        // An id that left may be used again by a new member (an empty data
        // directory under the same id, as a StatefulSet brings back): its
        // old registration goes. Every registered id outside the new
        // membership, so a retried set-members finishes what one cut short.
        let gone: Vec<NodeId> = self.catalog.read(|s, _| {
            s.members()
                .keys()
                .copied()
                .filter(|id| !wanted.contains_key(id))
                .collect()
        });
        //
        // A leader that removed itself steps down once the new membership is
        // applied; an entry it appends after that is never committed by it
        // and its caller would wait forever. So a member leaving the
        // membership sends the forgets to the remaining members, which pass
        // them to their leader.
        let remaining = (!wanted.contains_key(&self.node_id)).then(|| {
            crate::CatalogClient::new(
                wanted.values().cloned().collect(),
                crate::ClientConfig {
                    dialer: self.dialer.clone(),
                    ..crate::client::ClientConfig::default()
                },
            )
        });
        #[cfg(feature = "fault-hooks")]
        if !wanted.contains_key(&self.node_id) && std::env::var_os("MIRA_TEST_FORGET_AFTER_STEP_DOWN").is_some() {
            let _ = self
                .raft
                .wait(Some(Duration::from_secs(30)))
                .metrics(|m| m.state != openraft::ServerState::Leader, "stepped down")
                .await;
        }
        for node_id in gone {
            if let Some(client) = &remaining {
                let forget = pb::write_request::Command::ForgetMember(pb::ForgetMember { node_id });
                client.write(forget).await.map_err(|e| {
                    Status::unavailable(format!(
                        "the membership changed, but forgetting member {node_id}'s registration failed \
                         (set the members again to finish): {e}"
                    ))
                })?;
                continue;
            }
            let res = self.raft.client_write(Command::ForgetMember { node_id }).await;
            match res {
                Ok(r) => r.data.map_err(Status::from)?,
                Err(e) => return Err(RequestError::from(e).into()),
            };
        }
        let members = resp
            .membership
            .as_ref()
            .map(|m| {
                m.nodes()
                    .map(|(id, n)| pb::Member {
                        id: *id,
                        address: n.addr.clone(),
                        voter: m.voter_ids().any(|v| v == *id),
                        incarnation: String::new(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Response::new(pb::ChangeMembershipReply { members }))
    }

    async fn trigger_snapshot(
        &self,
        _request: Request<pb::TriggerSnapshotRequest>,
    ) -> Result<Response<pb::TriggerSnapshotReply>, Status> {
        let target = self.catalog.version();
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| RequestError::Stopping(e.to_string()))?;
        let mut metrics = self.raft.metrics();
        let wait = async {
            loop {
                let index = metrics.borrow().snapshot.map_or(0, |l| l.index);
                if index >= target {
                    return Ok(index);
                }
                if metrics.changed().await.is_err() {
                    return Err(RequestError::Stopping("its metrics ended".into()));
                }
            }
        };
        let index = tokio::time::timeout(SNAPSHOT_WAIT, wait)
            .await
            .map_err(|_| RequestError::SnapshotTimeout {
                secs: SNAPSHOT_WAIT.as_secs(),
            })??;
        Ok(Response::new(pb::TriggerSnapshotReply { snapshot_index: index }))
    }
}

/// Streams every change after `after` until the receiver goes away, with a
/// progress event every [`WATCH_HEARTBEAT`]; ends with `UNAVAILABLE` when
/// this member knows no leader (partitioned or removed), so the client
/// moves to another member.
async fn watch_loop(
    catalog: Arc<Catalog>,
    raft: Raft,
    resets: Arc<tokio::sync::Semaphore>,
    mut after: u64,
    tx: mpsc::Sender<Result<pb::WatchEvent, Status>>,
) {
    let mut versions = catalog.subscribe();
    let mut heartbeat = tokio::time::interval(WATCH_HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Read the applied version before the history: changes are in the
        // history before the version moves, so none up to `applied` is missed.
        let applied = *versions.borrow_and_update();
        match catalog.events_after(after, WATCH_BATCH) {
            Err(HistoryGone) => {
                let Ok(_permit) = resets.acquire().await else { return };
                let (version, changes) = catalog.full_state();
                let chunks: Vec<&[crate::state::Change]> = if changes.is_empty() {
                    vec![&[]]
                } else {
                    changes.chunks(RESET_CHUNK).collect()
                };
                let last = chunks.len() - 1;
                for (i, chunk) in chunks.into_iter().enumerate() {
                    let event = pb::WatchEvent {
                        version,
                        reset: true,
                        reset_done: i == last,
                        changes: chunk.iter().map(pb::Change::from).collect(),
                    };
                    if tx.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
                after = version;
            }
            Ok(events) if !events.is_empty() => {
                for e in events {
                    after = e.version;
                    let event = pb::WatchEvent {
                        version: e.version,
                        reset: false,
                        reset_done: false,
                        changes: e.changes.iter().map(pb::Change::from).collect(),
                    };
                    if tx.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
            }
            Ok(_) => {
                // Caught up. Tell the watcher how far the catalog got (log
                // entries without changes still advance the version), then
                // wait for the next apply or the heartbeat.
                if applied > after {
                    after = applied;
                    let progress = pb::WatchEvent {
                        version: applied,
                        ..Default::default()
                    };
                    if tx.send(Ok(progress)).await.is_err() {
                        return;
                    }
                    continue;
                }
                tokio::select! {
                    changed = versions.changed() => if changed.is_err() { return },
                    () = tx.closed() => return,
                    _ = heartbeat.tick() => {
                        if raft.metrics().borrow().current_leader.is_none() {
                            let _ = tx
                                .send(Err(RequestError::WatchLeaderLost.into()))
                                .await;
                            return;
                        }
                        let progress = pb::WatchEvent { version: after, ..Default::default() };
                        if tx.send(Ok(progress)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// The Raft transport between members.
#[derive(Clone)]
pub struct RaftService {
    pub(crate) raft: Raft,
    pub(crate) cluster_id: String,
    /// Closed while a member on an empty data directory checks with its
    /// peers that it did not lose one (`node::check_data_dir`): it must not
    /// vote or take entries before then.
    pub(crate) gate: Arc<crate::node::RaftGate>,
}

impl std::fmt::Debug for RaftService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftService")
            .field("cluster_id", &self.cluster_id)
            .finish()
    }
}

impl RaftService {
    fn check(&self, req: &pb::RaftRequest) -> Result<(), Status> {
        if let Some(why) = self.gate.closed() {
            return Err(Status::unavailable(why));
        }
        if req.cluster_id != self.cluster_id {
            return Err(RequestError::ForeignCluster {
                ours: self.cluster_id.clone(),
                theirs: req.cluster_id.chars().take(128).collect(),
            }
            .into());
        }
        Ok(())
    }
}

fn decode<T: DeserializeOwned>(req: &pb::RaftRequest) -> Result<T, RequestError> {
    postcard::from_bytes(&req.payload).map_err(RequestError::MalformedPayload)
}

fn encode<T: Serialize>(v: &T) -> Result<Response<pb::RaftReply>, Status> {
    postcard::to_stdvec(v)
        .map(|payload| Response::new(pb::RaftReply { payload }))
        .map_err(|e| RequestError::Encode(e).into())
}

#[tonic::async_trait]
impl pb::raft_server::Raft for RaftService {
    async fn append_entries(&self, request: Request<pb::RaftRequest>) -> Result<Response<pb::RaftReply>, Status> {
        let req = request.into_inner();
        self.check(&req)?;
        encode(&self.raft.append_entries(decode(&req)?).await)
    }

    async fn vote(&self, request: Request<pb::RaftRequest>) -> Result<Response<pb::RaftReply>, Status> {
        let req = request.into_inner();
        self.check(&req)?;
        encode(&self.raft.vote(decode(&req)?).await)
    }

    async fn install_snapshot(&self, request: Request<pb::RaftRequest>) -> Result<Response<pb::RaftReply>, Status> {
        let req = request.into_inner();
        self.check(&req)?;
        encode(&self.raft.install_snapshot(decode(&req)?).await)
    }
}
