//! The catalog client: follows leader redirects, retries transient errors
//! with capped exponential backoff across members, and gives up at a
//! deadline. Every write command is idempotent in the state machine, so a
//! retry after an unknown outcome (a timeout, a leader lost mid-commit)
//! never applies a command twice.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mira_common::cluster::{ClusterChannel, Dialer};
use mira_common::retry::Backoff;
use mira_proto::catalog as pb;
use mira_proto::catalog::catalog_client::CatalogClient as Grpc;
use pb::write_request::Command;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status};

use crate::error::ClientError;
use crate::service::LEADER_HEADER;

type Channel = ClusterChannel;

/// The lease a lease command's reply carries.
fn lease_of(reply: pb::WriteReply) -> Result<pb::Lease, ClientError> {
    reply.lease.ok_or_else(|| ClientError::Unavailable {
        attempts: 1,
        last: "the catalog answered a lease command without the lease".to_owned(),
    })
}

/// A watch with no event for this long reconnects elsewhere.
const WATCH_IDLE: Duration = Duration::from_secs(5);

/// Timeouts and backoff of a [`CatalogClient`].
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Give up on a call after this long.
    pub timeout: Duration,
    /// One attempt against one member.
    pub attempt_timeout: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub connect_timeout: Duration,
    /// How to connect (TLS or not) and the cluster credential sent on
    /// every call.
    pub dialer: Dialer,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            timeout: Duration::from_secs(15),
            attempt_timeout: Duration::from_secs(3),
            backoff_initial: Duration::from_millis(25),
            backoff_max: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            dialer: Dialer::default(),
        }
    }
}

#[derive(Debug, Default)]
struct Routing {
    /// Where to send the next call (a leader hint or a member that answered).
    preferred: Option<String>,
    next: usize,
    channels: HashMap<String, Channel>,
}

/// A client of the catalog cluster.
#[derive(Debug)]
pub struct CatalogClient {
    endpoints: Vec<String>,
    config: ClientConfig,
    routing: Mutex<Routing>,
}

fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Cancelled | Code::Unknown | Code::Internal
    )
}

impl CatalogClient {
    /// A client of the members at `endpoints` (`host:port`).
    pub fn new(endpoints: Vec<String>, config: ClientConfig) -> CatalogClient {
        CatalogClient {
            endpoints,
            config,
            routing: Mutex::new(Routing::default()),
        }
    }

    /// How this client connects; the querier dials ingesters the same way.
    pub fn dialer(&self) -> &Dialer {
        &self.config.dialer
    }

    fn routing(&self) -> std::sync::MutexGuard<'_, Routing> {
        self.routing.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn target(&self) -> Option<String> {
        let mut r = self.routing();
        if let Some(p) = &r.preferred {
            return Some(p.clone());
        }
        if self.endpoints.is_empty() {
            return None;
        }
        let i = r.next % self.endpoints.len();
        r.next = r.next.wrapping_add(1);
        Some(self.endpoints[i].clone())
    }

    fn channel(&self, addr: &str) -> Result<Grpc<Channel>, ClientError> {
        let mut r = self.routing();
        let channel = match r.channels.get(addr) {
            Some(c) => c.clone(),
            None => {
                let c = self
                    .config
                    .dialer
                    .channel(addr, self.config.connect_timeout)
                    .map_err(|_| ClientError::Endpoint(addr.to_owned()))?;
                r.channels.insert(addr.to_owned(), c.clone());
                c
            }
        };
        Ok(Grpc::new(channel)
            .max_decoding_message_size(64 * 1024 * 1024)
            .max_encoding_message_size(16 * 1024 * 1024))
    }

    fn prefer(&self, addr: Option<String>) {
        self.routing().preferred = addr;
    }

    fn forget_channel(&self, addr: &str) {
        self.routing().channels.remove(addr);
    }

    /// Runs `f` against members until one answers, following redirects.
    pub async fn call<T, F, Fut>(&self, f: F) -> Result<T, ClientError>
    where
        F: FnMut(Grpc<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_with(self.config.attempt_timeout, true, f).await
    }

    /// [`Self::call`] with its own attempt timeout; when `retry_slow` is
    /// false an attempt that times out ends the call (for admin operations
    /// that must not be started on every member in turn).
    async fn call_with<T, F, Fut>(
        &self,
        attempt_timeout: Duration,
        retry_slow: bool,
        mut f: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Grpc<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let deadline = Instant::now() + self.config.timeout;
        let mut backoff = Backoff::new(self.config.backoff_initial, self.config.backoff_max);
        let mut attempts = 0u32;
        let mut last = String::from("no catalog endpoints configured");
        while let Some(addr) = self.target() {
            attempts += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            let client = match self.channel(&addr) {
                Ok(c) => c,
                Err(e) => {
                    // A bad leader hint must not wedge the client.
                    last = e.to_string();
                    self.prefer(None);
                    continue;
                }
            };
            let mut redirected = false;
            match tokio::time::timeout(attempt_timeout.min(remaining), f(client)).await {
                Ok(Ok(resp)) => {
                    self.prefer(Some(addr));
                    return Ok(resp.into_inner());
                }
                Ok(Err(status)) => {
                    let leader = status
                        .metadata()
                        .get(LEADER_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    if let Some(leader) = leader.filter(|l| *l != addr) {
                        last = format!("redirected to {leader}: {}", status.message());
                        self.prefer(Some(leader));
                        redirected = true;
                    } else if retryable(status.code()) {
                        last = format!("{addr}: {}: {}", status.code(), status.message());
                        self.prefer(None);
                        if status.code() == Code::Unavailable {
                            self.forget_channel(&addr);
                        }
                    } else {
                        return Err(ClientError::Rejected(status));
                    }
                }
                Err(_) => {
                    last = format!("{addr}: no answer within {attempt_timeout:?}");
                    if !retry_slow {
                        return Err(ClientError::Unavailable { attempts, last });
                    }
                    self.prefer(None);
                    self.forget_channel(&addr);
                }
            }
            if redirected && !attempts.is_multiple_of(4) {
                continue;
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            tokio::time::sleep(backoff.next_delay().min(remaining)).await;
        }
        Err(ClientError::Unavailable { attempts, last })
    }

    /// Sends one write command; returns the reply (version, lease).
    pub async fn write(&self, command: Command) -> Result<pb::WriteReply, ClientError> {
        let req = pb::WriteRequest { command: Some(command) };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.write(req).await }
        })
        .await
    }

    /// Publishes blocks (and advances a WAL watermark); returns the version.
    pub async fn publish(&self, blocks: Vec<pb::Block>, watermark: Option<pb::Watermark>) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::Publish(pb::Publish { blocks, watermark }))
            .await?
            .version)
    }

    /// Takes a new epoch for `ingester_id` (dropping what it had staged);
    /// publishes under an older epoch are refused from now on.
    pub async fn fence(&self, ingester_id: &str) -> Result<u64, ClientError> {
        let reply = self
            .write(Command::Fence(pb::Fence {
                ingester_id: ingester_id.to_owned(),
            }))
            .await?;
        reply.epoch.ok_or_else(|| ClientError::Unavailable {
            attempts: 1,
            last: "the catalog answered a fence without an epoch (an older member?)".to_owned(),
        })
    }

    /// Atomically adds `add` and tombstones `tombstone`.
    pub async fn replace(&self, replace: pb::Replace) -> Result<u64, ClientError> {
        Ok(self.write(Command::Replace(replace)).await?.version)
    }

    /// The compactor's swap under its lease (rules in `proto/catalog.proto`
    /// and docs/api.md); returns the version. A retry of an applied
    /// ReplaceV2 succeeds without change.
    pub async fn replace_v2(&self, replace: pb::ReplaceV2) -> Result<u64, ClientError> {
        Ok(self.write(Command::ReplaceV2(replace)).await?.version)
    }

    /// Fences ids the catalog does not hold, so a late publish or replace
    /// of them is refused; rejected (FAILED_PRECONDITION) when one is held.
    pub async fn abandon(&self, ids: Vec<String>) -> Result<u64, ClientError> {
        Ok(self.write(Command::Abandon(pb::Abandon { ids })).await?.version)
    }

    /// Quarantines blocks from compaction (they stay queryable).
    pub async fn mark_no_compact(&self, ids: Vec<String>, reason: &str) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::MarkNoCompact(pb::MarkNoCompact {
                ids,
                reason: reason.to_owned(),
            }))
            .await?
            .version)
    }

    /// Lifts the quarantine of blocks.
    pub async fn clear_no_compact(&self, ids: Vec<String>) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::ClearNoCompact(pb::ClearNoCompact { ids }))
            .await?
            .version)
    }

    /// Sets a policy (its body validated by the catalog: an invalid one is
    /// INVALID_ARGUMENT naming the field); setting it unchanged is a no-op.
    pub async fn set_policy(&self, policy: pb::Policy) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::SetPolicy(pb::SetPolicy { policy: Some(policy) }))
            .await?
            .version)
    }

    /// Deletes a policy (and its status); deleting an absent one succeeds.
    pub async fn delete_policy(&self, kind: pb::PolicyKind, name: &str) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::DeletePolicy(pb::DeletePolicy {
                kind: kind as i32,
                name: name.to_owned(),
            }))
            .await?
            .version)
    }

    /// Records what enforcing a policy did last.
    pub async fn set_policy_status(
        &self,
        kind: pb::PolicyKind,
        name: &str,
        status_json: String,
    ) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::SetPolicyStatus(pb::SetPolicyStatus {
                kind: kind as i32,
                name: name.to_owned(),
                status_json,
            }))
            .await?
            .version)
    }

    /// Registers offload target names policies may name.
    pub async fn register_offload_targets(&self, names: Vec<String>) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::RegisterOffloadTargets(pb::RegisterOffloadTargets {
                names,
                checks: Vec::new(),
            }))
            .await?
            .version)
    }

    /// Registers offload targets with a reachability check of each (the
    /// names are the checks').
    pub async fn register_offload_target_checks(
        &self,
        checks: Vec<pb::OffloadTargetCheck>,
    ) -> Result<u64, ClientError> {
        let names = checks.iter().map(|c| c.name.clone()).collect();
        Ok(self
            .write(Command::RegisterOffloadTargets(pb::RegisterOffloadTargets {
                names,
                checks,
            }))
            .await?
            .version)
    }

    /// Tombstones live or offloaded blocks, saying why.
    pub async fn tombstone_v2(
        &self,
        ids: Vec<String>,
        now_ns: i64,
        reason: pb::TombstoneReason,
    ) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::TombstoneV2(pb::TombstoneV2 {
                ids,
                now_ns,
                reason: reason as i32,
            }))
            .await?
            .version)
    }

    /// Marks live blocks offloaded with their copies (whole or nothing).
    pub async fn mark_offloaded_v2(&self, items: Vec<pb::OffloadItem>) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::MarkOffloadedV2(pb::MarkOffloadedV2 { items }))
            .await?
            .version)
    }

    /// Records that offloaded blocks' primary objects were deleted, under
    /// the partition lease `(key, holder)`.
    pub async fn mark_primary_freed(
        &self,
        ids: Vec<String>,
        now_ns: i64,
        (lease_key, lease_holder): (&str, &str),
    ) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::MarkPrimaryFreed(pb::MarkPrimaryFreed {
                ids,
                now_ns,
                lease_key: lease_key.to_owned(),
                lease_holder: lease_holder.to_owned(),
            }))
            .await?
            .version)
    }

    /// Makes restored blocks live again, pinned until `pin_until_ns`,
    /// under the partition lease `(key, holder)`.
    pub async fn mark_restored_v2(
        &self,
        ids: Vec<String>,
        pin_until_ns: i64,
        now_ns: i64,
        (lease_key, lease_holder): (&str, &str),
    ) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::MarkRestoredV2(pb::MarkRestoredV2 {
                ids,
                pin_until_ns,
                now_ns,
                lease_key: lease_key.to_owned(),
                lease_holder: lease_holder.to_owned(),
            }))
            .await?
            .version)
    }

    /// Takes the lease `key` for `ttl_ms` from `now_ns` unless another
    /// holder's is unexpired. `job`: `Some` sets the manifest, `None` keeps
    /// this holder's own. Returns the lease as it now stands.
    pub async fn acquire_lease(
        &self,
        key: &str,
        holder: &str,
        now_ns: i64,
        ttl_ms: i64,
        job: Option<String>,
    ) -> Result<pb::Lease, ClientError> {
        let reply = self
            .write(Command::AcquireLease(pb::AcquireLease {
                key: key.to_owned(),
                holder: holder.to_owned(),
                now_ns,
                ttl_ms,
                job,
            }))
            .await?;
        lease_of(reply)
    }

    /// Extends this holder's unexpired lease; `job` as in
    /// [`Self::acquire_lease`].
    pub async fn renew_lease(
        &self,
        key: &str,
        holder: &str,
        now_ns: i64,
        ttl_ms: i64,
        job: Option<String>,
    ) -> Result<pb::Lease, ClientError> {
        let reply = self
            .write(Command::RenewLease(pb::RenewLease {
                key: key.to_owned(),
                holder: holder.to_owned(),
                now_ns,
                ttl_ms,
                job,
            }))
            .await?;
        lease_of(reply)
    }

    /// Releases the lease (and its job); releasing a lease not held is a
    /// no-op, one held by another holder is rejected.
    pub async fn release_lease(&self, key: &str, holder: &str) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::ReleaseLease(pb::ReleaseLease {
                key: key.to_owned(),
                holder: holder.to_owned(),
            }))
            .await?
            .version)
    }

    pub async fn heartbeat(
        &self,
        ingester_id: &str,
        address: &str,
        now_ns: i64,
        ttl_ms: i64,
    ) -> Result<u64, ClientError> {
        Ok(self
            .write(Command::Heartbeat(pb::Heartbeat {
                ingester_id: ingester_id.to_owned(),
                address: address.to_owned(),
                now_ns,
                ttl_ms,
            }))
            .await?
            .version)
    }

    pub async fn list_blocks(&self, req: pb::ListBlocksRequest) -> Result<pb::ListBlocksReply, ClientError> {
        self.call(|mut c| {
            let req = req.clone();
            async move { c.list_blocks(req).await }
        })
        .await
    }

    /// Every block of every tenant and signal whose state is in `states`
    /// (empty: live), paging through the catalog. Each page is read at
    /// one version; a block that exists for the whole listing is returned
    /// exactly once, in its state when its page was read.
    pub async fn list_all_blocks(&self, states: &[pb::BlockState]) -> Result<Vec<pb::Block>, ClientError> {
        let mut out = Vec::new();
        let mut page_token = String::new();
        loop {
            let reply = self
                .list_blocks(pb::ListBlocksRequest {
                    min_time_ns: 0,
                    max_time_ns: i64::MAX,
                    states: states.iter().map(|s| *s as i32).collect(),
                    page_token,
                    ..Default::default()
                })
                .await?;
            out.extend(reply.blocks);
            if reply.next_page_token.is_empty() {
                return Ok(out);
            }
            page_token = reply.next_page_token;
        }
    }

    pub async fn get_watermarks(&self, req: pb::GetWatermarksRequest) -> Result<pb::GetWatermarksReply, ClientError> {
        self.call(|mut c| {
            let req = req.clone();
            async move { c.get_watermarks(req).await }
        })
        .await
    }

    pub async fn list_ingesters(&self, req: pb::ListIngestersRequest) -> Result<pb::ListIngestersReply, ClientError> {
        self.call(|mut c| async move { c.list_ingesters(req).await }).await
    }

    pub async fn list_policies(&self, req: pb::ListPoliciesRequest) -> Result<pb::ListPoliciesReply, ClientError> {
        self.call(|mut c| async move { c.list_policies(req).await }).await
    }

    pub async fn list_leases(&self, req: pb::ListLeasesRequest) -> Result<pb::ListLeasesReply, ClientError> {
        self.call(|mut c| async move { c.list_leases(req).await }).await
    }

    /// Status of whichever member answers.
    pub async fn status(&self) -> Result<pb::StatusReply, ClientError> {
        self.call(|mut c| async move { c.status(pb::StatusRequest {}).await })
            .await
    }

    /// Status of the first configured member, one attempt, no retry.
    pub async fn status_of_first(&self) -> Result<pb::StatusReply, ClientError> {
        let addr = self
            .endpoints
            .first()
            .ok_or_else(|| ClientError::Endpoint(String::new()))?;
        let mut c = self.channel(addr)?;
        c.status(pb::StatusRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(ClientError::Rejected)
    }

    pub async fn change_membership(&self, members: Vec<pb::Member>) -> Result<pb::ChangeMembershipReply, ClientError> {
        let req = pb::ChangeMembershipRequest { members };
        self.call_with(self.config.timeout, false, |mut c| {
            let req = req.clone();
            async move { c.change_membership(req).await }
        })
        .await
    }

    pub async fn trigger_snapshot(&self) -> Result<u64, ClientError> {
        self.call_with(self.config.timeout, false, |mut c| async move {
            c.trigger_snapshot(pb::TriggerSnapshotRequest {}).await
        })
        .await
        .map(|r| r.snapshot_index)
    }

    /// Every change after `after_version`, in order, from any member;
    /// reconnects (to another member if need be) and resumes after the last
    /// complete event. The stream ends only when dropped; an event with
    /// `reset` starts a full state that ends with `reset_done`.
    pub fn watch(self: &std::sync::Arc<Self>, after_version: u64) -> ReceiverStream<pb::WatchEvent> {
        let (tx, rx) = mpsc::channel(64);
        let me = self.clone();
        tokio::spawn(async move {
            let mut resume = after_version;
            let mut backoff = Backoff::new(me.config.backoff_initial, me.config.backoff_max);
            loop {
                let Some(addr) = me.target() else { return };
                let Ok(mut client) = me.channel(&addr) else {
                    me.prefer(None);
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                };
                match client.watch(pb::WatchRequest { after_version: resume }).await {
                    Ok(stream) => {
                        let mut stream = stream.into_inner();
                        // A reset is forwarded only once complete, so a
                        // connection lost mid-reset never leaves half a state.
                        let mut pending: Vec<pb::WatchEvent> = Vec::new();
                        // The server sends progress at least every second;
                        // silence means a dead member or connection.
                        while let Ok(Some(item)) = tokio::time::timeout(WATCH_IDLE, stream.next()).await {
                            let Ok(event) = item else { break };
                            backoff.reset();
                            if event.reset && !event.reset_done {
                                pending.push(event);
                                continue;
                            }
                            resume = event.version;
                            for e in pending.drain(..).chain(std::iter::once(event)) {
                                if tx.send(e).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    Err(status) => {
                        if !retryable(status.code()) {
                            tracing::warn!(target: "mira::catalog", %status, "watch refused");
                        }
                    }
                }
                me.prefer(None);
                me.forget_channel(&addr);
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        });
        ReceiverStream::new(rx)
    }
}
