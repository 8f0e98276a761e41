//! The `MiraRetentionPolicy` custom resource (group [`GROUP`], version
//! `v1alpha1`, namespaced, short name `mrp`): its spec, its status and the
//! CRD generated from these types ([`crd_yaml`], what `mira crd` prints and
//! `deploy/helm/mira/crds/miraretentionpolicies.mira.dev.yaml` holds).
//!
//! The schema carries what Kubernetes can check by itself (required
//! fields, enums, patterns, sizes); everything else (regexes compile,
//! durations in range, `offload.after` before `retain`, the operator arity
//! of a match expression) is checked by [`crate::policy::to_catalog`] and
//! reported as `Ready=False, reason=InvalidSpec` naming the field. There
//! are no CEL rules in v1alpha1.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group (a placeholder until the project owns a DNS name: change
/// it here only).
pub const GROUP: &str = "mira.dev";
/// The API version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of the objects.
pub const API_VERSION: &str = "mira.dev/v1alpha1";
/// The kind.
pub const KIND: &str = "MiraRetentionPolicy";
/// The finalizer that keeps an object until its catalog policies are gone.
pub const FINALIZER: &str = "mira.dev/catalog-policy";
/// What `retain` and `offload.after` look like (Loki/Prometheus style).
pub const DURATION_PATTERN: &str = "^([0-9]+(ms|s|m|h|d|w|y))+$";
/// What `tenant` looks like: `*` or a tenant id.
pub const TENANT_PATTERN: &str = r"^(\*|[A-Za-z0-9._-]{1,128})$";
/// What an offload target name looks like (the compactor's `NAME=URL`).
pub const TARGET_PATTERN: &str = "^[a-z0-9][a-z0-9-]{0,62}$";
/// Most `matchAttributes` entries plus `matchExpressions` (the catalog's
/// limit of matchers in one selector).
pub const MAX_MATCHERS: usize = mira_core::policy::MAX_MATCHERS;
/// Most values of one expression.
pub const MAX_VALUES: usize = mira_core::policy::MAX_SET_VALUES;
/// Longest attribute key or value.
pub const MAX_TEXT: usize = mira_core::policy::MAX_TEXT_BYTES;

/// Retention (and optionally offload) of one tenant's (or every tenant's)
/// data, for some signals and some resources.
// kube's `printcolumn(...)` repeats keys by design; clippy reads them as
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "mira.dev",
    version = "v1alpha1",
    kind = "MiraRetentionPolicy",
    plural = "miraretentionpolicies",
    namespaced,
    status = "MiraRetentionPolicyStatus",
    shortname = "mrp",
    category = "mira",
    doc = "Retention and offload of Mira data, reconciled into the catalog by the Mira operator.",
    printcolumn(name = "Tenant", type_ = "string", json_path = ".spec.tenant"),
    printcolumn(name = "Signals", type_ = "string", json_path = ".spec.signals"),
    printcolumn(name = "Retain", type_ = "string", json_path = ".spec.retain"),
    printcolumn(name = "Offload-After", type_ = "string", json_path = ".spec.offload.after"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        priority = 1
    ),
    printcolumn(
        name = "Dropped",
        type_ = "integer",
        json_path = ".status.blocksDropped",
        priority = 1
    ),
    printcolumn(
        name = "Offloaded",
        type_ = "integer",
        json_path = ".status.blocksOffloaded",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".spec.tenant"
)]
#[serde(rename_all = "camelCase")]
pub struct MiraRetentionPolicySpec {
    /// The tenant whose data this governs; `*` for every tenant. Only a
    /// tenant the object's namespace is granted (its `mira.dev/tenants`
    /// annotation or the operator's settings), and `*` only in the
    /// operator's own namespace; else Ready=False, TenantNotAllowed.
    #[schemars(regex(pattern = r"^(\*|[A-Za-z0-9._-]{1,128})$"))]
    pub tenant: String,
    /// The signals this governs; omitted or empty: all three.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3), extend("x-kubernetes-list-type" = "set"))]
    pub signals: Vec<Signal>,
    /// Which resources (by OpenTelemetry resource attribute) this governs;
    /// omitted: all of the tenant's. Every matcher must hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_selector: Option<AttributeSelector>,
    /// How long data is kept after its newest row, e.g. `30d` (units ms,
    /// s, m, h, d, w, y = 365.25 d; at least 1h, at most 100y).
    #[schemars(regex(pattern = "^([0-9]+(ms|s|m|h|d|w|y))+$"), length(max = 64))]
    pub retain: String,
    /// Move data to an offload target before it is dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<OffloadSpec>,
    /// Among overlapping policies of the same specificity, the higher
    /// priority decides (docs/operations.md, "Which rule decides").
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// Report what would be dropped without dropping anything.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

/// A signal.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Signal {
    Logs,
    Traces,
    Metrics,
}

impl Signal {
    pub fn core(self) -> mira_core::ids::Signal {
        match self {
            Signal::Logs => mira_core::ids::Signal::Logs,
            Signal::Traces => mira_core::ids::Signal::Traces,
            Signal::Metrics => mira_core::ids::Signal::Metrics,
        }
    }
}

/// Like a Kubernetes label selector, but on OpenTelemetry resource
/// attribute names (`service.name`, `deployment.environment`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttributeSelector {
    /// Attribute = value, all of which must hold.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    pub match_attributes: BTreeMap<String, String>,
    /// Further matchers, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub match_expressions: Vec<AttributeExpression>,
}

/// One matcher on a resource attribute.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttributeExpression {
    /// The resource attribute, e.g. `service.name`.
    #[schemars(length(min = 1, max = 1024))]
    pub key: String,
    /// `In`/`NotIn` (one or more values; a missing attribute fails `In`
    /// and passes `NotIn`), `Exists`/`DoesNotExist` (no values),
    /// `Equals`/`NotEquals` and `Matches`/`NotMatches` (one value; a
    /// regular expression anchored at both ends for `Matches`; a missing
    /// attribute reads as "").
    pub operator: Operator,
    /// The operands (see `operator`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = 1024)))]
    pub values: Vec<String>,
}

/// A matcher's operator; every operator of the catalog's policy body.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Equals,
    NotEquals,
    Matches,
    NotMatches,
}

impl Operator {
    pub fn core(self) -> mira_core::policy::SelectorOp {
        use mira_core::policy::SelectorOp as Op;
        match self {
            Operator::In => Op::In,
            Operator::NotIn => Op::NotIn,
            Operator::Exists => Op::Exists,
            Operator::DoesNotExist => Op::NotExists,
            Operator::Equals => Op::Eq,
            Operator::NotEquals => Op::Ne,
            Operator::Matches => Op::Re,
            Operator::NotMatches => Op::NotRe,
        }
    }
}

/// Offload: copy data to a second store after a while (and free the
/// primary copy); `retain` still decides when it is deleted.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OffloadSpec {
    /// How long after its newest row data moves, e.g. `7d`; shorter than
    /// `retain`.
    #[schemars(regex(pattern = "^([0-9]+(ms|s|m|h|d|w|y))+$"), length(max = 64))]
    pub after: String,
    /// The offload target's name, as a compactor is configured with
    /// (`--offload-target NAME=URL`); credentials stay with the compactor.
    #[schemars(regex(pattern = "^[a-z0-9][a-z0-9-]{0,62}$"))]
    pub target: String,
}

/// What the operator and the catalog report.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MiraRetentionPolicyStatus {
    /// The generation whose policy the catalog holds (not advanced when
    /// an apply fails).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` and, with `spec.offload`, `OffloadTargetReady`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The catalog policy name (both kinds): `k8s/<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog_policy: Option<String>,
    /// Blocks the compactor dropped under this policy (its life's total).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks_dropped: Option<i64>,
    /// Bytes of those blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_dropped: Option<i64>,
    /// Rows of those blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_dropped: Option<i64>,
    /// Blocks the compactor offloaded under this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks_offloaded: Option<i64>,
    /// Bytes of those blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_offloaded: Option<i64>,
    /// With `dryRun`: blocks the last enforcement would have dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_drop_blocks: Option<i64>,
    /// When a compactor last enforced the policy (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_enforced: Option<String>,
    /// The last enforcement's errors, if any (at most 5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub enforcement_errors: Vec<String>,
}

/// The schema of a `metav1.Condition` list: a map keyed by `type`, so
/// server-side apply merges per condition (kube's `crd_derive` example).
fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "message": {"type": "string", "maxLength": 32768},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "reason": {
                    "type": "string",
                    "maxLength": 1024,
                    "minLength": 1,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "type": {
                    "type": "string",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                }
            }
        }
    })
}

/// The CRD as YAML (what `mira crd` prints).
pub fn crd_yaml() -> Result<String, crate::Error> {
    serde_saphyr::to_string(&MiraRetentionPolicy::crd()).map_err(|e| crate::Error::Yaml(e.to_string()))
}
