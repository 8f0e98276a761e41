//! What an operator configures for `mira operator` ([`Settings`]): the
//! `[operator]` table of the TOML file, the flags and their variables.
//! [`Settings::validate`] names the bad field and rejects (never clamps).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use mira_common::config::{ConfigError, in_range};
use serde::{Deserialize, Serialize};

use crate::tenancy::Tenancy;

/// The operator's settings (defaults in `Default`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// HTTP listen address: /metrics, /ready, /live.
    pub listen: SocketAddr,
    /// Catalog members, comma separated host:port.
    pub catalog: String,
    /// The namespace whose objects are reconciled; empty: every namespace.
    pub namespace: String,
    /// Reconcile only while holding the leader Lease.
    pub leader_elect: bool,
    /// The Lease's name.
    pub lease_name: String,
    /// The Lease's namespace; empty: the client's default namespace.
    pub lease_namespace: String,
    /// This replica's name in the Lease; empty: the host name.
    pub identity: String,
    /// Every object is reconciled again this often (counts refresh, drift
    /// such as a policy deleted with `mira policy delete` is repaired).
    pub requeue_s: u64,
    /// Longest a catalog call may take before the object is reported
    /// `CatalogUnavailable`.
    pub catalog_timeout_ms: u64,
    /// A kubeconfig file; absent: in-cluster, else kube's inference
    /// (`KUBECONFIG`, `~/.kube/config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// `NAMESPACE=TENANT[,TENANT…]` entries: the tenants the objects of a
    /// namespace may govern (besides what its annotation grants; see
    /// [`crate::tenancy`]).
    pub namespace_tenants: Vec<String>,
    /// Whether the Namespace's `mira.dev/tenants` annotation grants
    /// tenants too (off: only `namespace_tenants`, and Namespaces are
    /// neither read nor watched).
    pub namespace_annotation: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            catalog: "127.0.0.1:7400".to_owned(),
            namespace: String::new(),
            leader_elect: true,
            lease_name: "mira-operator".to_owned(),
            lease_namespace: String::new(),
            identity: String::new(),
            requeue_s: 300,
            catalog_timeout_ms: 5000,
            kubeconfig: None,
            namespace_tenants: Vec::new(),
            namespace_annotation: true,
        }
    }
}

/// A Kubernetes object name (RFC 1123 DNS subdomain), or why not.
pub(crate) fn dns_name(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!("{s:?} is not a Kubernetes name (lowercase a-z, 0-9, '-', '.')"))
    }
}

fn dns_subdomain(field: &str, s: &str) -> Result<(), ConfigError> {
    dns_name(s).map_err(|why| ConfigError::new(field, why))
}

impl Settings {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.catalog.split(',').all(|s| s.trim().is_empty()) {
            return Err(ConfigError::new("operator.catalog", "names no catalog member"));
        }
        if !self.namespace.is_empty() {
            dns_subdomain("operator.namespace", &self.namespace)?;
        }
        dns_subdomain("operator.lease_name", &self.lease_name)?;
        if !self.lease_namespace.is_empty() {
            dns_subdomain("operator.lease_namespace", &self.lease_namespace)?;
        }
        if self.identity.len() > 253 {
            return Err(ConfigError::new("operator.identity", "longer than 253 bytes"));
        }
        in_range("operator.requeue_s", self.requeue_s, 10, 86_400)?;
        in_range("operator.catalog_timeout_ms", self.catalog_timeout_ms, 100, 600_000)?;
        self.tenancy("")?;
        Ok(())
    }

    /// Which namespaces may govern which tenants, `operator_namespace`
    /// being the operator's own (see [`crate::tenancy`]).
    pub fn tenancy(&self, operator_namespace: &str) -> Result<Tenancy, ConfigError> {
        Tenancy::new(
            operator_namespace,
            &self.namespace_tenants,
            self.namespace_annotation,
            "operator.namespace_tenants",
        )
    }

    pub fn requeue(&self) -> Duration {
        Duration::from_secs(self.requeue_s)
    }

    pub fn catalog_timeout(&self) -> Duration {
        Duration::from_millis(self.catalog_timeout_ms)
    }

    /// The catalog members.
    pub fn catalog_members(&self) -> Vec<String> {
        (self.catalog.split(','))
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        Settings::default().validate().expect("defaults");
        let cases: Vec<(Settings, &str)> = vec![
            (
                Settings {
                    catalog: " , ".into(),
                    ..Settings::default()
                },
                "operator.catalog",
            ),
            (
                Settings {
                    namespace: "Obs".into(),
                    ..Settings::default()
                },
                "operator.namespace",
            ),
            (
                Settings {
                    lease_name: String::new(),
                    ..Settings::default()
                },
                "operator.lease_name",
            ),
            (
                Settings {
                    requeue_s: 0,
                    ..Settings::default()
                },
                "operator.requeue_s",
            ),
            (
                Settings {
                    catalog_timeout_ms: 10,
                    ..Settings::default()
                },
                "operator.catalog_timeout_ms",
            ),
            (
                Settings {
                    namespace_tenants: vec!["team-a=team-a".into(), "team-b=*".into()],
                    ..Settings::default()
                },
                "operator.namespace_tenants",
            ),
        ];
        for (s, field) in cases {
            assert_eq!(s.validate().expect_err(field).field, field);
        }
    }
}
