//! `mira operator`: serves `/metrics`, `/ready` and `/live`, checks that
//! the CRD is installed (`/ready` turns 200 after it), waits to hold the
//! leader Lease (unless `leader_elect` is off), then runs the controller
//! with the catalog probe and the orphan sweep until shutdown (the lease
//! is released) or until the lease cannot be renewed (an error: the
//! process exits and Kubernetes restarts it). With the `mira.dev/tenants`
//! annotation on (the default), it also watches Namespaces (only the
//! watched one with `--namespace`; none when that is its own) and has
//! every object reconciled when an annotation changes.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, WatchStreamExt, controller, watcher};
use kube::{Client, Config};
use mira_catalog::{CatalogClient, ClientConfig};
use mira_common::Process;
use mira_common::http::HttpServer;

use crate::controller::{Context, error_policy, probe_catalog, reconcile, sweep_orphans};
use crate::crd::MiraRetentionPolicy;
use crate::lease::{Held, LeaderElector, LeaseConfig};
use crate::metrics::Metrics;
use crate::tenancy::{Tenancy, annotation_changes};
use crate::{Error, Settings};

/// How often the catalog is probed while it is down (and up).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(10);
/// How often the orphan sweep runs while leading.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(600);

/// A Kubernetes client: from `--kubeconfig`, else in-cluster, else kube's
/// inference.
pub async fn kube_client(settings: &Settings) -> Result<Client, Error> {
    let config = match &settings.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| Error::KubeConfig(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::KubeConfig(format!("{}: {e}", path.display())))?
        }
        None => Config::infer().await.map_err(|e| Error::KubeConfig(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| Error::KubeConfig(e.to_string()))
}

/// The identity in the Lease: the setting, else the host name.
fn identity(settings: &Settings) -> String {
    if !settings.identity.is_empty() {
        return settings.identity.clone();
    }
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("mira-operator-{}", std::process::id()))
}

/// Runs the operator until `shutdown` resolves (see the module doc).
pub async fn run(settings: Settings, process: &Process, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let metrics = Metrics::register(&process.telemetry);
    let crd_ok = Arc::new(AtomicBool::new(false));
    {
        let crd_ok = crd_ok.clone();
        process.telemetry.readiness("operator", move || {
            if crd_ok.load(Ordering::Relaxed) {
                Ok(())
            } else {
                Err("the MiraRetentionPolicy CRD has not been found yet".to_owned())
            }
        });
    }
    let server = HttpServer::bind(
        settings.listen,
        process.telemetry.router(),
        "operator",
        process.security.tls.clone(),
    )
    .await
    .map_err(|source| Error::Listen {
        addr: settings.listen,
        source,
    })?;
    tracing::info!(target: "mira::operator", addr = %server.addr(), "operator http");
    let result = operate(&settings, process, metrics, crd_ok, shutdown).await;
    server.shutdown().await;
    result
}

async fn operate(
    settings: &Settings,
    process: &Process,
    metrics: Metrics,
    crd_ok: Arc<AtomicBool>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let client = kube_client(settings).await?;
    let namespace = (!settings.namespace.is_empty()).then(|| settings.namespace.clone());
    let api: Api<MiraRetentionPolicy> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    api.list(&ListParams::default().limit(1))
        .await
        .map_err(Error::CrdMissing)?;
    crd_ok.store(true, Ordering::Relaxed);

    let timeout = settings.catalog_timeout();
    let catalog = Arc::new(CatalogClient::new(
        settings.catalog_members(),
        ClientConfig {
            timeout,
            attempt_timeout: timeout.min(Duration::from_secs(3)),
            connect_timeout: timeout.min(Duration::from_secs(1)),
            dialer: process.security.dialer.clone(),
            ..ClientConfig::default()
        },
    ));
    let identity = identity(settings);
    // The operator's own namespace: its Lease's.
    let lease_namespace = if settings.lease_namespace.is_empty() {
        client.default_namespace().to_owned()
    } else {
        settings.lease_namespace.clone()
    };
    let tenancy = settings.tenancy(&lease_namespace).map_err(Error::Settings)?;
    let namespaces = namespace_watch(&client, &tenancy, namespace.as_deref());
    tracing::info!(
        target: "mira::operator",
        operator_namespace = lease_namespace,
        namespace_annotation = tenancy.reads_annotation(),
        "objects of the operator's namespace may govern every tenant; others what they are granted"
    );
    let ctx = Arc::new(Context::new(
        client.clone(),
        catalog,
        metrics.clone(),
        process.clock.clone(),
        &identity,
        settings.requeue(),
        tenancy,
    ));
    let mut shutdown = std::pin::pin!(shutdown);

    if !settings.leader_elect {
        let task = tokio::spawn(control(ctx, api, namespace, namespaces));
        metrics.leader.set(1);
        shutdown.as_mut().await;
        task.abort();
        let _ = task.await;
        return Ok(());
    }

    let leases: Api<Lease> = Api::namespaced(client, &lease_namespace);
    let mut elector = LeaderElector::new(
        leases,
        LeaseConfig::new(&settings.lease_name, &identity),
        process.clock.clone(),
    );
    if !elector.acquire(&mut shutdown).await {
        return Ok(());
    }
    metrics.leader.set(1);
    let task = tokio::spawn(control(ctx, api, namespace, namespaces));
    let held = elector.hold(&mut shutdown).await;
    // Stop reconciling first; then give the lease up.
    task.abort();
    let _ = task.await;
    metrics.leader.set(0);
    match held {
        Held::Stopped => {
            if let Err(e) = elector.release().await {
                tracing::warn!(target: "mira::operator", error = %e, "release the lease");
            }
            Ok(())
        }
        Held::Lost => Err(Error::LeaseLost(settings.lease_name.clone())),
    }
}

/// The Namespaces whose `mira.dev/tenants` annotation can change what an
/// object may govern: none with the annotation off or when the operator
/// watches only its own namespace; the watched one with `--namespace`;
/// else all.
fn namespace_watch(
    client: &Client,
    tenancy: &Tenancy,
    only: Option<&str>,
) -> Option<(Api<Namespace>, watcher::Config)> {
    if !tenancy.reads_annotation() {
        return None;
    }
    let api = Api::all(client.clone());
    match only {
        Some(ns) if ns == tenancy.operator_namespace => None,
        Some(ns) => Some((api, watcher::Config::default().fields(&format!("metadata.name={ns}")))),
        None => Some((api, watcher::Config::default())),
    }
}

/// The controller, the catalog probe and the orphan sweep, until aborted.
async fn control(
    ctx: Arc<Context>,
    api: Api<MiraRetentionPolicy>,
    namespace: Option<String>,
    namespaces: Option<(Api<Namespace>, watcher::Config)>,
) {
    let (recovered, trigger) = tokio::sync::mpsc::channel(1);
    let mut controller = Controller::new(api, watcher::Config::default().any_semantic())
        .with_config(controller::Config::default().concurrency(4))
        .reconcile_all_on(tokio_stream::wrappers::ReceiverStream::new(trigger));
    if let Some((namespaces, config)) = namespaces {
        // Its own backoff: a failing Namespace watch (RBAC missing) must
        // not hold up the objects' own watch, and yields no trigger.
        let changes = annotation_changes(watcher(namespaces, config).default_backoff());
        controller = controller.reconcile_all_on(changes);
    }
    let store = controller.store();
    let probe = tokio::spawn(probe_catalog(ctx.clone(), recovered, PROBE_INTERVAL));
    let sweep = {
        let (ctx, store) = (ctx.clone(), store.clone());
        tokio::spawn(async move {
            if store.wait_until_ready().await.is_err() {
                return;
            }
            loop {
                let exists = |ns: &str, name: &str| store.get(&ObjectRef::new(name).within(ns)).is_some();
                if let Err(e) = sweep_orphans(&ctx.catalog, namespace.as_deref(), exists).await {
                    tracing::warn!(target: "mira::operator", error = %e, "orphan sweep");
                }
                ctx.metrics
                    .policies
                    .set(i64::try_from(store.state().len()).unwrap_or(i64::MAX));
                tokio::time::sleep(SWEEP_INTERVAL).await;
            }
        })
    };
    // Aborted with this task (the controller stops when it is aborted).
    let _tasks = Tasks(vec![probe, sweep]);
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|r| {
            if let Err(e) = r {
                tracing::debug!(target: "mira::operator", error = %e, "controller");
            }
            futures::future::ready(())
        })
        .await;
}

/// Tasks aborted when this is dropped.
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}
