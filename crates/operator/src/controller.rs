//! Reconcile of `MiraRetentionPolicy` objects (the controller-rs shape):
//!
//! - [`reconcile`] runs inside kube's `finalizer()` helper: an object
//!   without [`FINALIZER`] gets it first (a JSON patch) and nothing else;
//!   apply maps the spec ([`crate::policy::to_catalog`]), reads the
//!   catalog's policies once, writes only what differs (`SetPolicy`, and
//!   `SetPolicy`/`DeletePolicy` of the offload policy), copies the
//!   compactor's counts into the status and patches the status by
//!   server-side apply only when it changed; cleanup deletes both catalog
//!   policies, then the helper removes the finalizer. So a reconcile
//!   caused by the operator's own status patch writes nothing anywhere.
//! - Events (events.k8s.io/v1) on transitions of a condition only, after
//!   the status patch.
//! - Catalog unreachable: `Ready=False, reason=CatalogUnavailable`
//!   (`observedGeneration` stays), an error, and [`error_policy`]
//!   requeues the object with its own backoff (5 s doubling to 5 min,
//!   jittered: `mira_common::retry::Backoff`). [`probe_catalog`] notices
//!   the catalog coming back and has every object reconciled at once.
//! - [`sweep_orphans`] deletes `k8s/…` catalog policies whose object is
//!   gone (a finalizer removed by hand, an operator that was down).
//! - `OffloadTargetReady` comes from the catalog's registry: not
//!   registered → `TargetNotRegistered` (no offload policy is set);
//!   registered but its last compactor check failed → `TargetUnreachable`
//!   with the check's time and error (the offload policy stays set);
//!   else `TargetRegistered`.
//! - Before anything else, apply checks that the object's namespace may
//!   govern `spec.tenant` ([`crate::tenancy`]; the Namespace is read only
//!   when the settings alone do not decide). If not: `Ready=False,
//!   reason=TenantNotAllowed` naming the tenant and the namespace, and the
//!   catalog policies set for the object before are deleted. Checked
//!   again at every reconcile, so an edited grant takes effect at the
//!   next one (`crate::run` has every object reconciled when a
//!   Namespace's annotation changes).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientError};
use mira_common::clock::Clock;
use mira_common::retry::Backoff;
use mira_core::policy::PolicyStatus;
use serde_json::json;

use crate::Error;
use crate::conditions::{self, OFFLOAD_TARGET_READY, READY, Want, reason, set_condition};
use crate::crd::{API_VERSION, FINALIZER, KIND, MiraRetentionPolicy, MiraRetentionPolicyStatus};
use crate::metrics::{Metrics, ObjectLabels, ResultLabel};
use crate::policy::{self, catalog_name, owner_of};
use crate::tenancy::{TENANTS_ANNOTATION, Tenancy, TenantNotAllowed};

/// The field manager of the status (server-side apply) and the events'
/// reporting controller.
pub const FIELD_MANAGER: &str = "mira-operator";
/// First delay of an object's retries after an error.
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(5);
/// Longest delay of an object's retries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub catalog: Arc<CatalogClient>,
    pub metrics: Metrics,
    pub clock: Clock,
    /// Every object is reconciled again this often.
    pub requeue: Duration,
    /// Which namespaces may govern which tenants.
    pub tenancy: Tenancy,
    backoff: Mutex<HashMap<ObjectRef<MiraRetentionPolicy>, Backoff>>,
    catalog_up: AtomicBool,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("requeue", &self.requeue)
            .field("tenancy", &self.tenancy)
            .field("catalog_up", &self.catalog_up)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// `identity` names this replica in the events it publishes.
    pub fn new(
        client: Client,
        catalog: Arc<CatalogClient>,
        metrics: Metrics,
        clock: Clock,
        identity: &str,
        requeue: Duration,
        tenancy: Tenancy,
    ) -> Context {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: (!identity.is_empty()).then(|| identity.to_owned()),
        };
        metrics.catalog_up.set(1);
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            catalog,
            metrics,
            clock,
            requeue,
            tenancy,
            backoff: Mutex::new(HashMap::new()),
            catalog_up: AtomicBool::new(true),
        }
    }

    fn now(&self) -> Timestamp {
        let t = Timestamp::try_from(self.clock.now()).unwrap_or(Timestamp::UNIX_EPOCH);
        // Kubernetes keeps seconds; so do we, so what we read back equals
        // what we wrote.
        Timestamp::from_second(t.as_second()).unwrap_or(t)
    }

    /// Whether the catalog answered last time it was asked.
    pub fn catalog_up(&self) -> bool {
        self.catalog_up.load(Ordering::Relaxed)
    }

    /// Records whether the catalog answers; true when it just came back.
    fn set_catalog_up(&self, up: bool) -> bool {
        self.metrics.catalog_up.set(i64::from(up));
        let was = self.catalog_up.swap(up, Ordering::Relaxed);
        up && !was
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<MiraRetentionPolicy>, Backoff>> {
        self.backoff.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next retry delay of `obj` (each call doubles it, to the cap).
    pub fn next_backoff(&self, obj: &ObjectRef<MiraRetentionPolicy>) -> Duration {
        self.backoff()
            .entry(obj.clone())
            .or_insert_with(|| Backoff::new(BACKOFF_INITIAL, BACKOFF_MAX))
            .next_delay()
    }

    fn reset_backoff(&self, obj: &ObjectRef<MiraRetentionPolicy>) {
        self.backoff().remove(obj);
    }

    fn set_ready_metric(&self, obj: &MiraRetentionPolicy, ready: Option<bool>) {
        let labels = ObjectLabels {
            namespace: obj.namespace().unwrap_or_default(),
            name: obj.name_any(),
        };
        match ready {
            Some(r) => {
                self.metrics.policy_ready.get_or_create(&labels).set(i64::from(r));
            }
            None => {
                self.metrics.policy_ready.remove(&labels);
            }
        }
    }

    /// Patches the status when it differs from `before`, then publishes
    /// an event for each condition that changed status or reason.
    async fn finish(
        &self,
        obj: &MiraRetentionPolicy,
        api: &Api<MiraRetentionPolicy>,
        before: &MiraRetentionPolicyStatus,
        after: MiraRetentionPolicyStatus,
    ) -> Result<(), Error> {
        if &after == before {
            return Ok(());
        }
        let patch = json!({"apiVersion": API_VERSION, "kind": KIND, "status": after});
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch_status(&obj.name_any(), &params, &Patch::Apply(&patch))
            .await
            .map_err(Error::Kube)?;
        for type_ in [READY, OFFLOAD_TARGET_READY] {
            let (old, new) = (
                conditions::find(&before.conditions, type_),
                conditions::find(&after.conditions, type_),
            );
            let Some(new) = new else { continue };
            if old.is_some_and(|o| o.status == new.status && o.reason == new.reason) {
                continue;
            }
            let (type_, reason, action) = match new.reason.as_str() {
                reason::APPLIED => (EventType::Normal, "Applied", "SetPolicy"),
                reason::INVALID_SPEC => (EventType::Warning, "InvalidSpec", "Validate"),
                reason::TENANT_NOT_ALLOWED => (EventType::Warning, "TenantNotAllowed", "Validate"),
                reason::CATALOG_UNAVAILABLE => (EventType::Warning, "CatalogUnavailable", "SetPolicy"),
                reason::CATALOG_REJECTED => (EventType::Warning, "CatalogRejected", "SetPolicy"),
                reason::TARGET_NOT_REGISTERED => (EventType::Warning, "OffloadTargetNotFound", "SetPolicy"),
                reason::TARGET_UNREACHABLE => (EventType::Warning, "OffloadTargetUnreachable", "SetPolicy"),
                _ => continue,
            };
            self.publish(obj, type_, reason, action, new.message.clone()).await;
        }
        Ok(())
    }

    /// Publishes an event; a failure is logged, not the reconcile's.
    async fn publish(&self, obj: &MiraRetentionPolicy, type_: EventType, reason: &str, action: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            tracing::warn!(
                target: "mira::operator",
                namespace = obj.namespace().unwrap_or_default(),
                name = obj.name_any(),
                reason,
                error = %e,
                "publish event"
            );
        }
    }

    /// A catalog call failed: status and the outcome by the error's kind.
    async fn catalog_failed(
        &self,
        obj: &MiraRetentionPolicy,
        api: &Api<MiraRetentionPolicy>,
        before: &MiraRetentionPolicyStatus,
        mut status: MiraRetentionPolicyStatus,
        e: ClientError,
    ) -> Result<Action, Error> {
        let (why, outcome) = match &e {
            ClientError::Unavailable { .. } => {
                self.set_catalog_up(false);
                (reason::CATALOG_UNAVAILABLE, None)
            }
            ClientError::Rejected(s) if s.code() == tonic::Code::InvalidArgument => {
                (reason::INVALID_SPEC, Some(Action::await_change()))
            }
            ClientError::Rejected(_) | ClientError::Endpoint(_) => {
                (reason::CATALOG_REJECTED, Some(Action::requeue(self.requeue)))
            }
        };
        tracing::warn!(
            target: "mira::operator",
            namespace = obj.namespace().unwrap_or_default(),
            name = obj.name_any(),
            reason = why,
            error = %e,
            "catalog call failed"
        );
        set_condition(
            &mut status.conditions,
            Want {
                type_: READY,
                status: false,
                reason: why,
                message: e.to_string(),
                generation: obj.metadata.generation,
            },
            self.now(),
        );
        self.set_ready_metric(obj, Some(false));
        self.finish(obj, api, before, status).await?;
        match outcome {
            Some(action) => Ok(action),
            None => Err(Error::Catalog(e)),
        }
    }
}

/// Reconciles one object (see the module doc).
pub async fn reconcile(obj: Arc<MiraRetentionPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let namespace = obj.namespace().ok_or_else(|| Error::NoNamespace(obj.name_any()))?;
    let api: Api<MiraRetentionPolicy> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, FINALIZER, obj, |event| {
        let (api, ctx) = (api.clone(), ctx.clone());
        async move {
            match event {
                Finalizer::Apply(o) => apply(&o, &api, &ctx).await,
                Finalizer::Cleanup(o) => cleanup(&o, &api, &ctx).await,
            }
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics.duration.observe(started.elapsed().as_secs_f64());
    let result_label = if result.is_ok() { "ok" } else { "error" };
    ctx.metrics
        .reconcile
        .get_or_create(&ResultLabel { result: result_label })
        .inc();
    result
}

/// The counts of a catalog policy's status JSON (written by compactors).
fn enforced(policy: Option<&pb::Policy>) -> Option<PolicyStatus> {
    policy
        .filter(|p| !p.status_json.is_empty())
        .and_then(|p| serde_json::from_str(&p.status_json).ok())
}

/// A check's time as RFC 3339, whole seconds.
fn checked_at(ns: i64) -> String {
    Timestamp::from_second(ns / 1_000_000_000).map_or_else(|_| format!("{ns} ns"), |t| t.to_string())
}

fn count(n: u64) -> Option<i64> {
    Some(i64::try_from(n).unwrap_or(i64::MAX))
}

async fn apply(obj: &MiraRetentionPolicy, api: &Api<MiraRetentionPolicy>, ctx: &Context) -> Result<Action, Error> {
    let generation = obj.metadata.generation;
    let before = obj.status.clone().unwrap_or_default();
    let mut status = before.clone();
    let now = ctx.now();
    let namespace = obj.namespace().unwrap_or_default();
    let tenant = obj.spec.tenant.as_str();
    let annotation = if ctx.tenancy.needs_annotation(&namespace, tenant) {
        let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
        let ns = namespaces.get(&namespace).await.map_err(Error::Kube)?;
        ns.annotations().get(TENANTS_ANNOTATION).cloned()
    } else {
        None
    };
    if let Err(refusal) = ctx.tenancy.check(&namespace, tenant, annotation.as_deref()) {
        return refuse(obj, api, ctx, &before, status, refusal).await;
    }
    let desired = match policy::to_catalog(obj) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(
                target: "mira::operator",
                namespace = obj.namespace().unwrap_or_default(),
                name = obj.name_any(),
                error = %e,
                "invalid spec"
            );
            status.catalog_policy = Some(catalog_name(&obj.namespace().unwrap_or_default(), &obj.name_any()));
            set_condition(
                &mut status.conditions,
                Want {
                    type_: READY,
                    status: false,
                    reason: reason::INVALID_SPEC,
                    message: e.to_string(),
                    generation,
                },
                now,
            );
            ctx.set_ready_metric(obj, Some(false));
            ctx.finish(obj, api, &before, status).await?;
            return Ok(Action::await_change());
        }
    };
    status.catalog_policy = Some(desired.name.clone());
    let listing = match ctx.catalog.list_policies(pb::ListPoliciesRequest::default()).await {
        Ok(l) => l,
        Err(e) => return ctx.catalog_failed(obj, api, &before, status, e).await,
    };
    ctx.set_catalog_up(true);
    let existing =
        |kind: pb::PolicyKind| (listing.policies.iter()).find(|p| p.kind == kind as i32 && p.name == desired.name);
    let differs = |have: Option<&pb::Policy>, want: &pb::Policy| {
        have.is_none_or(|p| p.tenant != want.tenant || p.body_json != want.body_json)
    };
    if differs(existing(pb::PolicyKind::Retention), &desired.retention)
        && let Err(e) = ctx.catalog.set_policy(desired.retention.clone()).await
    {
        return ctx.catalog_failed(obj, api, &before, status, e).await;
    }
    let mut target_ready: Option<(bool, &str, String)> = None;
    match (&desired.offload, &obj.spec.offload) {
        (Some(want), Some(spec)) => {
            let target = &spec.target;
            if listing.offload_targets.iter().any(|t| t == target) {
                if differs(existing(pb::PolicyKind::Offload), want)
                    && let Err(e) = ctx.catalog.set_policy(want.clone()).await
                {
                    return ctx.catalog_failed(obj, api, &before, status, e).await;
                }
                target_ready = Some(match listing.offload_target_checks.iter().find(|c| &c.name == target) {
                    Some(c) if !c.reachable => (
                        false,
                        reason::TARGET_UNREACHABLE,
                        format!(
                            "offload target {target:?} is registered, but a compactor could not reach it at {}: {}",
                            checked_at(c.checked_at_ns),
                            c.error
                        ),
                    ),
                    Some(c) => (
                        true,
                        reason::TARGET_REGISTERED,
                        format!(
                            "offload target {target:?} is registered and was reachable at {}",
                            checked_at(c.checked_at_ns)
                        ),
                    ),
                    // Registered by a compactor from before reachability checks.
                    None => (
                        true,
                        reason::TARGET_REGISTERED,
                        format!("offload target {target:?} is registered by a compactor"),
                    ),
                });
            } else {
                if existing(pb::PolicyKind::Offload).is_some()
                    && let Err(e) = ctx.catalog.delete_policy(pb::PolicyKind::Offload, &desired.name).await
                {
                    return ctx.catalog_failed(obj, api, &before, status, e).await;
                }
                let known = if listing.offload_targets.is_empty() {
                    "none".to_owned()
                } else {
                    listing.offload_targets.join(", ")
                };
                let msg = format!(
                    "no compactor registered offload target {target:?} (registered: {known}); start a compactor with --offload-target {target}=URL"
                );
                target_ready = Some((false, reason::TARGET_NOT_REGISTERED, msg));
            }
        }
        _ => {
            if existing(pb::PolicyKind::Offload).is_some()
                && let Err(e) = ctx.catalog.delete_policy(pb::PolicyKind::Offload, &desired.name).await
            {
                return ctx.catalog_failed(obj, api, &before, status, e).await;
            }
        }
    }

    let retention = enforced(existing(pb::PolicyKind::Retention));
    let offload = enforced(existing(pb::PolicyKind::Offload));
    status.blocks_dropped = retention.as_ref().and_then(|s| count(s.blocks_dropped));
    status.bytes_dropped = retention.as_ref().and_then(|s| count(s.bytes_dropped));
    status.rows_dropped = retention.as_ref().and_then(|s| count(s.rows_dropped));
    status.would_drop_blocks = (retention.as_ref())
        .filter(|_| obj.spec.dry_run)
        .and_then(|s| count(s.would_drop_blocks));
    status.blocks_offloaded = offload.as_ref().and_then(|s| count(s.blocks_offloaded));
    status.bytes_offloaded = offload.as_ref().and_then(|s| count(s.bytes_offloaded));
    let last_run = [&retention, &offload]
        .into_iter()
        .flatten()
        .map(|s| s.last_run_ns)
        .filter(|ns| *ns > 0)
        .max();
    status.last_enforced = last_run
        .and_then(|ns| Timestamp::from_second(ns / 1_000_000_000).ok())
        .map(|t| t.to_string());
    status.enforcement_errors = [&retention, &offload]
        .into_iter()
        .flatten()
        .flat_map(|s| s.errors.iter().cloned())
        .take(5)
        .collect();

    match &target_ready {
        Some((ok, why, msg)) => set_condition(
            &mut status.conditions,
            Want {
                type_: OFFLOAD_TARGET_READY,
                status: *ok,
                reason: why,
                message: msg.clone(),
                generation,
            },
            now,
        ),
        None => conditions::remove_condition(&mut status.conditions, OFFLOAD_TARGET_READY),
    }
    let ready = match &target_ready {
        Some((false, _, msg)) => Want {
            type_: READY,
            status: false,
            reason: reason::OFFLOAD_TARGET_NOT_READY,
            message: format!("retention applied; offload not: {msg}"),
            generation,
        },
        _ => {
            status.observed_generation = generation;
            Want {
                type_: READY,
                status: true,
                reason: reason::APPLIED,
                message: desired.summary.clone(),
                generation,
            }
        }
    };
    let is_ready = ready.status;
    set_condition(&mut status.conditions, ready, now);
    ctx.set_ready_metric(obj, Some(is_ready));
    ctx.finish(obj, api, &before, status).await?;
    ctx.reset_backoff(&ObjectRef::from_obj(obj));
    Ok(Action::requeue(ctx.requeue))
}

/// The object names a tenant its namespace may not govern: its catalog
/// policies (if the operator set any before) are deleted, and the status
/// says why.
async fn refuse(
    obj: &MiraRetentionPolicy,
    api: &Api<MiraRetentionPolicy>,
    ctx: &Context,
    before: &MiraRetentionPolicyStatus,
    mut status: MiraRetentionPolicyStatus,
    refusal: TenantNotAllowed,
) -> Result<Action, Error> {
    let name = catalog_name(&refusal.namespace, &obj.name_any());
    tracing::warn!(
        target: "mira::operator",
        namespace = refusal.namespace,
        name = obj.name_any(),
        tenant = refusal.tenant,
        "tenant not allowed in this namespace"
    );
    let listing = match ctx.catalog.list_policies(pb::ListPoliciesRequest::default()).await {
        Ok(l) => l,
        Err(e) => return ctx.catalog_failed(obj, api, before, status, e).await,
    };
    ctx.set_catalog_up(true);
    for kind in [pb::PolicyKind::Retention, pb::PolicyKind::Offload] {
        if !(listing.policies.iter()).any(|p| p.kind == kind as i32 && p.name == name) {
            continue;
        }
        if let Err(e) = ctx.catalog.delete_policy(kind, &name).await {
            return ctx.catalog_failed(obj, api, before, status, e).await;
        }
        tracing::info!(
            target: "mira::operator",
            policy = name,
            kind = kind.as_str_name(),
            "deleted the catalog policy of a refused object"
        );
    }
    status.catalog_policy = None;
    conditions::remove_condition(&mut status.conditions, OFFLOAD_TARGET_READY);
    set_condition(
        &mut status.conditions,
        Want {
            type_: READY,
            status: false,
            reason: reason::TENANT_NOT_ALLOWED,
            message: refusal.to_string(),
            generation: obj.metadata.generation,
        },
        ctx.now(),
    );
    ctx.set_ready_metric(obj, Some(false));
    ctx.finish(obj, api, before, status).await?;
    ctx.reset_backoff(&ObjectRef::from_obj(obj));
    // Checked again at every requeue, so a grant added later is seen even
    // without the Namespace watch.
    Ok(Action::requeue(ctx.requeue))
}

async fn cleanup(obj: &MiraRetentionPolicy, api: &Api<MiraRetentionPolicy>, ctx: &Context) -> Result<Action, Error> {
    let name = catalog_name(&obj.namespace().unwrap_or_default(), &obj.name_any());
    let before = obj.status.clone().unwrap_or_default();
    for kind in [pb::PolicyKind::Retention, pb::PolicyKind::Offload] {
        if let Err(e) = ctx.catalog.delete_policy(kind, &name).await {
            // The finalizer stays until the catalog has forgotten both.
            let status = before.clone();
            return match ctx.catalog_failed(obj, api, &before, status, e).await {
                Ok(_) => Err(Error::Catalog(ClientError::Unavailable {
                    attempts: 1,
                    last: "the catalog refused to delete the policy".to_owned(),
                })),
                Err(e) => Err(e),
            };
        }
    }
    ctx.set_catalog_up(true);
    tracing::info!(
        target: "mira::operator",
        namespace = obj.namespace().unwrap_or_default(),
        name = obj.name_any(),
        policy = name,
        "deleted catalog policies"
    );
    ctx.publish(
        obj,
        EventType::Normal,
        "Deleted",
        "DeletePolicy",
        format!("catalog policy {name} deleted"),
    )
    .await;
    ctx.set_ready_metric(obj, None);
    ctx.reset_backoff(&ObjectRef::from_obj(obj));
    Ok(Action::await_change())
}

/// After a failed reconcile: count it and retry the object after its
/// next backoff delay.
pub fn error_policy(obj: Arc<MiraRetentionPolicy>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(err.metric_label());
    let delay = ctx.next_backoff(&ObjectRef::from_obj(&*obj));
    tracing::warn!(
        target: "mira::operator",
        namespace = obj.namespace().unwrap_or_default(),
        name = obj.name_any(),
        error = %err,
        retry_in_ms = delay.as_millis() as u64,
        "reconcile failed"
    );
    Action::requeue(delay)
}

/// Asks the catalog for its status every `interval`; when it answers
/// after it did not, sends on `recovered` (the controller's
/// `reconcile_all_on` trigger). Runs until dropped.
pub async fn probe_catalog(ctx: Arc<Context>, recovered: tokio::sync::mpsc::Sender<()>, interval: Duration) {
    loop {
        let up = ctx.catalog.status().await.is_ok();
        if ctx.set_catalog_up(up) {
            tracing::info!(target: "mira::operator", "catalog answers again; reconciling every object");
            let _ = recovered.try_send(());
        }
        tokio::time::sleep(interval).await;
    }
}

/// Deletes the catalog policies the operator owns (`k8s/<ns>/<name>`)
/// whose object does not exist (`exists(ns, name)` false), in `namespace`
/// only when given. Returns the names deleted.
pub async fn sweep_orphans(
    catalog: &CatalogClient,
    namespace: Option<&str>,
    exists: impl Fn(&str, &str) -> bool,
) -> Result<Vec<String>, ClientError> {
    let listing = catalog.list_policies(pb::ListPoliciesRequest::default()).await?;
    let mut deleted = Vec::new();
    for p in listing.policies {
        let Some((ns, name)) = owner_of(&p.name) else { continue };
        if namespace.is_some_and(|only| only != ns) || exists(ns, name) {
            continue;
        }
        let kind = pb::PolicyKind::try_from(p.kind).unwrap_or(pb::PolicyKind::Retention);
        catalog.delete_policy(kind, &p.name).await?;
        tracing::info!(target: "mira::operator", policy = p.name, kind = kind.as_str_name(), "deleted orphaned catalog policy");
        deleted.push(p.name);
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests;
