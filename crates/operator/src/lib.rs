//! `mira-operator`: a kube-rs controller that reconciles
//! `MiraRetentionPolicy` custom resources into the catalog's retention and
//! offload policies and reports what the catalog and the compactors did
//! back into each object's status.
//!
//! - [`crd`] — the custom resource's types and the CRD generated from them
//!   (`mira crd`);
//! - [`policy`] — the pure mapping from an object to catalog policies, with
//!   the catalog's own validation and errors naming the object's field;
//! - [`conditions`] — `metav1.Condition` bookkeeping;
//! - [`tenancy`] — which tenants the objects of a namespace may govern
//!   (the operator's namespace: all and `*`; others: what the settings or
//!   the Namespace's `mira.dev/tenants` annotation grant);
//! - [`controller`] — reconcile (finalizer, catalog writes, server-side
//!   apply of status, events on transitions), the error policy with
//!   per-object backoff, the catalog probe and the orphan sweep;
//! - [`lease`] — leader election over a `coordination.k8s.io/v1` Lease with
//!   client-go's timings;
//! - [`metrics`] — `mira_operator_*`;
//! - [`settings`] — the `[operator]` table and its validation;
//! - [`run`] — `mira operator` (probes, CRD check, election, controller).
//!
//! It talks to the catalog through `mira-catalog`'s client only, and to
//! no other role.

pub mod conditions;
pub mod controller;
pub mod crd;
pub mod lease;
pub mod metrics;
pub mod policy;
pub mod run;
pub mod settings;
pub mod tenancy;

#[cfg(test)]
mod fixtures;

pub use crd::{MiraRetentionPolicy, MiraRetentionPolicySpec, MiraRetentionPolicyStatus};
pub use settings::Settings;

use mira_catalog::ClientError;

/// What went wrong in the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes api: {0}")]
    Kube(#[source] kube::Error),
    /// The catalog did not answer (or refused) a call.
    #[error("catalog: {0}")]
    Catalog(#[source] ClientError),
    /// The object's spec cannot be applied (the field is named).
    #[error("invalid spec: {0}")]
    InvalidSpec(#[source] policy::InvalidSpec),
    /// The finalizer helper failed (adding or removing the finalizer, or
    /// the apply or cleanup it ran).
    #[error("{0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The object has no namespace (the CRD is namespaced: a bug).
    #[error("object {0} has no namespace")]
    NoNamespace(String),
    /// The CRD could not be rendered.
    #[error("render the CRD as YAML: {0}")]
    Yaml(String),
    /// The Kubernetes client could not be configured.
    #[error("kubernetes client configuration: {0}")]
    KubeConfig(String),
    /// A setting is not acceptable.
    #[error("{0}")]
    Settings(#[source] mira_common::config::ConfigError),
    /// The CRD is not installed (or not readable with these permissions).
    #[error(
        "cannot list miraretentionpolicies.mira.dev ({0}); install the CRD with `kubectl apply --server-side -f deploy/helm/mira/crds/`"
    )]
    CrdMissing(#[source] kube::Error),
    /// The leader lease could not be renewed in time (fail-stop).
    #[error("lost the leader lease {0}")]
    LeaseLost(String),
    #[error("listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A low-cardinality reason for `mira_operator_reconcile_errors_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubeApi",
            Error::Catalog(ClientError::Unavailable { .. }) => conditions::reason::CATALOG_UNAVAILABLE,
            Error::Catalog(_) => conditions::reason::CATALOG_REJECTED,
            Error::InvalidSpec(_) => conditions::reason::INVALID_SPEC,
            Error::Finalizer(e) => match &**e {
                kube::runtime::finalizer::Error::ApplyFailed(inner)
                | kube::runtime::finalizer::Error::CleanupFailed(inner) => inner.metric_label(),
                kube::runtime::finalizer::Error::AddFinalizer(_)
                | kube::runtime::finalizer::Error::RemoveFinalizer(_) => "Finalizer",
                _ => "Other",
            },
            Error::NoNamespace(_)
            | Error::Yaml(_)
            | Error::KubeConfig(_)
            | Error::Settings(_)
            | Error::CrdMissing(_)
            | Error::LeaseLost(_)
            | Error::Listen { .. } => "Other",
        }
    }
}
