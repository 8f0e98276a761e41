//! A local copy of the catalog kept current through [`CatalogClient::watch`]:
//! the live block list and the ingester leases, at a known version. The
//! querier plans from it; it can wait until the copy has reached a version
//! another party reported (the recent-data contract) or the catalog's
//! current version ([`Mirror::catch_up`]).
//!
//! The mirror also records when it last heard from the catalog: every
//! event counts, and an idle member sends progress every
//! [`WATCH_HEARTBEAT`](crate::service::WATCH_HEARTBEAT), so an old last
//! event means the copy may be stale ([`Mirror::wait_fresh`]). That time
//! is monotonic (`tokio::time::Instant`): it measures what this process
//! heard, it decides nothing about data, so it is not the shared clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use mira_common::retry::Backoff;
use mira_core::ids::Signal;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::CatalogClient;
use crate::proto as pb;

/// What the mirror holds at one version.
#[derive(Debug, Default, Clone)]
pub struct MirrorState {
    /// Catalog version this state reflects; 0 until the first event.
    pub version: u64,
    /// Every block row (any state), by id.
    pub blocks: HashMap<String, pb::Block>,
    /// Ingester leases by ingester id (expired ones included; callers
    /// compare `expires_at_ns` with their clock).
    pub ingesters: HashMap<String, pb::IngesterLease>,
    /// True once a first complete state has arrived.
    pub synced: bool,
}

impl MirrorState {
    fn apply(&mut self, change: pb::Change) {
        use pb::change::Change as C;
        match change.change {
            Some(C::Block(b)) => {
                self.blocks.insert(b.id.clone(), b);
            }
            Some(C::PurgedBlockId(id)) => {
                self.blocks.remove(&id);
            }
            Some(C::Ingester(lease)) => {
                self.ingesters.insert(lease.ingester_id.clone(), lease);
            }
            _ => {}
        }
    }

    /// Live blocks of `tenant`/`signal` whose time range overlaps
    /// `[min_ns, max_ns]` (inclusive), oldest first by min time.
    pub fn live_blocks(&self, tenant: &str, signal: Signal, min_ns: i64, max_ns: i64) -> Vec<pb::Block> {
        self.blocks_in(pb::BlockState::Live, tenant, signal, min_ns, max_ns)
    }

    /// Blocks in `state` of `tenant`/`signal` whose time range overlaps
    /// `[min_ns, max_ns]` (inclusive), oldest first by min time.
    pub fn blocks_in(
        &self,
        state: pb::BlockState,
        tenant: &str,
        signal: Signal,
        min_ns: i64,
        max_ns: i64,
    ) -> Vec<pb::Block> {
        let signal = crate::pb_impl::signal::to_pb(signal);
        let mut out: Vec<pb::Block> = self
            .blocks
            .values()
            .filter(|b| {
                b.tenant == tenant
                    && b.signal == signal
                    && b.state == state as i32
                    && b.max_time_ns >= min_ns
                    && b.min_time_ns <= max_ns
            })
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.min_time_ns, &a.id).cmp(&(b.min_time_ns, &b.id)));
        out
    }

    /// Ingesters whose lease is unexpired at `now_ns`; with `now_ns ==
    /// i64::MIN`, every registered one.
    pub fn live_ingesters(&self, now_ns: i64) -> Vec<pb::IngesterLease> {
        let mut out: Vec<pb::IngesterLease> = self
            .ingesters
            .values()
            .filter(|l| l.expires_at_ns > now_ns && !l.address.is_empty())
            .cloned()
            .collect();
        out.sort_by(|a, b| a.ingester_id.cmp(&b.ingester_id));
        out
    }
}

/// The catalog's applied version, read linearizably (through the leader).
async fn linearizable_version(client: &CatalogClient) -> Result<u64, crate::ClientError> {
    client
        .list_ingesters(pb::ListIngestersRequest {
            now_ns: 0,
            linearizable: true,
            include_expired: false,
        })
        .await
        .map(|r| r.version)
}

/// The catalog's applied version (any member), retried until one answers.
async fn current_version(client: &CatalogClient) -> u64 {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        match linearizable_version(client).await {
            Ok(v) => return v,
            Err(e) => {
                tracing::debug!(target: "mira::catalog", error = %e, "mirror: catalog version not known yet");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// The running mirror. Cloning shares it; the background task ends when the
/// last clone is dropped.
#[derive(Debug, Clone)]
pub struct Mirror {
    rx: watch::Receiver<Arc<MirrorState>>,
    /// When the last event (changes or progress) arrived; `None` before
    /// the first.
    heard: watch::Receiver<Option<Instant>>,
    client: Arc<CatalogClient>,
    _task: Arc<AbortOnDrop>,
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Mirror {
    /// Starts following the catalog from scratch (a full state first).
    pub fn start(client: Arc<CatalogClient>) -> Mirror {
        let (tx, rx) = watch::channel(Arc::new(MirrorState::default()));
        let (heard_tx, heard) = watch::channel(None);
        let watcher = client.clone();
        let task = tokio::spawn(async move {
            let client = watcher;
            // The catalog's version now: the copy is complete ("synced")
            // once it has caught up to it, not after the first event (a
            // long history arrives in many).
            let target = current_version(&client).await;
            let mut events = client.watch(0);
            let mut state = MirrorState::default();
            // A reset's changes are gathered here and swapped in whole.
            let mut incoming: Option<MirrorState> = None;
            while let Some(first) = events.next().await {
                // Apply every event already waiting, then publish one copy
                // (a replayed history arrives as many events).
                let mut batch = vec![first];
                while batch.len() < 4096
                    && let Some(Some(e)) = events.next().now_or_never()
                {
                    batch.push(e);
                }
                heard_tx.send_replace(Some(Instant::now()));
                let mut changed = false;
                for event in batch {
                    if event.reset {
                        let next = incoming.get_or_insert_with(MirrorState::default);
                        for c in event.changes {
                            next.apply(c);
                        }
                        if !event.reset_done {
                            continue;
                        }
                        state = incoming.take().unwrap_or_default();
                    } else if event.changes.is_empty() && event.version == state.version && state.synced {
                        // Progress that moves nothing (the idle heartbeat):
                        // no copy of the state to publish.
                        continue;
                    } else {
                        for c in event.changes {
                            state.apply(c);
                        }
                    }
                    state.version = event.version;
                    state.synced = state.version >= target;
                    changed = true;
                }
                if changed && tx.send(Arc::new(state.clone())).is_err() {
                    return;
                }
            }
        });
        Mirror {
            rx,
            heard,
            client,
            _task: Arc::new(AbortOnDrop(task)),
        }
    }

    /// The current state (cheap: shared).
    pub fn state(&self) -> Arc<MirrorState> {
        self.rx.borrow().clone()
    }

    /// Waits until the mirror has reached `version` (and holds a complete
    /// state), up to `timeout`. Returns the state, or `None` on timeout.
    pub async fn wait_for(&self, version: u64, timeout: Duration) -> Option<Arc<MirrorState>> {
        let mut rx = self.rx.clone();
        let reached = tokio::time::timeout(timeout, rx.wait_for(|s| s.synced && s.version >= version)).await;
        match reached {
            Ok(Ok(state)) => Some(state.clone()),
            _ => None,
        }
    }

    /// How long ago the last event (changes or progress) arrived; `None`
    /// before the first.
    pub fn since_last_event(&self) -> Option<Duration> {
        self.heard.borrow().map(|t| t.elapsed())
    }

    /// Returns at once if the last event is at most `max_age` old, else
    /// waits up to `timeout` for a new one. `Err` carries the age of the
    /// last event (`None`: never heard) when none came in time.
    ///
    /// Cancel safe: it only reads the mirror.
    pub async fn wait_fresh(&self, max_age: Duration, timeout: Duration) -> Result<(), Option<Duration>> {
        let fresh = |t: &Option<Instant>| t.is_some_and(|t| t.elapsed() <= max_age);
        let mut heard = self.heard.clone();
        if fresh(&heard.borrow_and_update()) {
            return Ok(());
        }
        match tokio::time::timeout(timeout, heard.wait_for(fresh)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(self.since_last_event()),
        }
    }

    /// Waits up to `timeout` until the mirror has reached the catalog's
    /// current version, read linearizably now: every command committed
    /// before this call is in the returned state. `None` when the catalog
    /// did not answer or the copy did not catch up in time.
    ///
    /// Cancel safe: it only reads.
    pub async fn catch_up(&self, timeout: Duration) -> Option<Arc<MirrorState>> {
        let deadline = Instant::now() + timeout;
        let version = match tokio::time::timeout_at(deadline, linearizable_version(&self.client)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                tracing::debug!(target: "mira::catalog", error = %e, "mirror: catalog version not known");
                return None;
            }
            Err(_) => return None,
        };
        self.wait_for(version, deadline.saturating_duration_since(Instant::now()))
            .await
    }
}
