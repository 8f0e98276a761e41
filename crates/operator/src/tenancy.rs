//! Which tenants the `MiraRetentionPolicy` objects of a namespace may
//! govern ([`Tenancy`]), so that whoever may create objects in namespace
//! `team-a` cannot expire `team-b`'s data.
//!
//! - Objects in the operator's own namespace (its Lease's namespace:
//!   `--lease-namespace`/`POD_NAMESPACE`, else the client's namespace) may
//!   name any tenant and `*` (every tenant). `*` is refused everywhere
//!   else.
//! - Objects in another namespace may name the tenants listed for it in
//!   the operator's settings (`namespace_tenants`, `NS=TENANT[,TENANT…]`)
//!   and, unless `namespace_annotation` is off, in the annotation
//!   [`TENANTS_ANNOTATION`] of the Namespace object (comma separated).
//!   Editing a Namespace is a cluster-scoped permission, so a team with
//!   only namespaced RBAC cannot grant itself a tenant.
//! - A namespace with no mapping may govern no tenant. Not even a tenant
//!   named like the namespace: every cluster has a namespace `default`,
//!   and `default` is also the tenant of every request that names none.
//!
//! An object that names a tenant its namespace may not govern is refused
//! (`Ready=False, reason=TenantNotAllowed`) and the catalog policies the
//! operator set for it before are removed (see `crate::controller`).
//! [`annotation_changes`] turns a watch of Namespaces into a trigger that
//! has every object reconciled again when an annotation changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::runtime::watcher;
use mira_common::config::ConfigError;
use mira_core::ids::TenantId;

/// The annotation of a Namespace listing the tenants its objects may
/// govern, comma separated (`mira.dev/tenants: "team-a,team-a-dev"`).
pub const TENANTS_ANNOTATION: &str = "mira.dev/tenants";
/// What names every tenant in `spec.tenant`.
pub const EVERY_TENANT: &str = "*";
/// Most tenants a refusal's message lists (the rest are counted).
const LISTED: usize = 16;

/// One `namespace_tenants` entry, `NS=TENANT[,TENANT…]`, parsed; the
/// error names the entry's problem (the caller names the field).
pub fn parse_entry(entry: &str) -> Result<(String, BTreeSet<String>), String> {
    let Some((ns, tenants)) = entry.split_once('=') else {
        return Err(format!("{entry:?} is not NAMESPACE=TENANT[,TENANT...]"));
    };
    let ns = ns.trim();
    crate::settings::dns_name(ns).map_err(|why| format!("{entry:?}: {why}"))?;
    let mut set = BTreeSet::new();
    for t in tenants.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if t == EVERY_TENANT {
            return Err(format!(
                "{entry:?}: \"*\" (every tenant) may be named only by objects in the operator's own namespace"
            ));
        }
        TenantId::new(t).map_err(|e| format!("{entry:?}: {e}"))?;
        set.insert(t.to_owned());
    }
    if set.is_empty() {
        return Err(format!("{entry:?} names no tenant"));
    }
    Ok((ns.to_owned(), set))
}

/// The annotation's value: its valid tenant ids, and the entries that are
/// not (ignored; `*` among them).
pub fn parse_annotation(value: &str) -> (BTreeSet<String>, Vec<String>) {
    let mut valid = BTreeSet::new();
    let mut ignored = Vec::new();
    for t in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if t != EVERY_TENANT && TenantId::new(t).is_ok() {
            valid.insert(t.to_owned());
        } else {
            ignored.push(t.chars().take(130).collect());
        }
    }
    (valid, ignored)
}

/// Why an object may not name its tenant (the `TenantNotAllowed`
/// condition's message).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct TenantNotAllowed {
    pub tenant: String,
    pub namespace: String,
    detail: String,
}

impl fmt::Display for TenantNotAllowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tenant == EVERY_TENANT {
            write!(
                f,
                "tenant \"*\" (every tenant) may be named only in the operator's namespace, not in namespace {:?}; {}",
                self.namespace, self.detail
            )
        } else {
            write!(
                f,
                "namespace {:?} may not govern tenant {:?}; {}",
                self.namespace, self.tenant, self.detail
            )
        }
    }
}

/// Which namespaces may govern which tenants (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenancy {
    /// The operator's own namespace: its objects may govern every tenant.
    pub operator_namespace: String,
    /// Namespace → tenants, from the settings.
    configured: BTreeMap<String, BTreeSet<String>>,
    /// Whether [`TENANTS_ANNOTATION`] on the Namespace counts.
    annotation: bool,
}

impl Tenancy {
    /// From validated `namespace_tenants` entries (an entry that does not
    /// parse is an error naming `field`).
    pub fn new(
        operator_namespace: &str,
        entries: &[String],
        annotation: bool,
        field: &str,
    ) -> Result<Tenancy, ConfigError> {
        let mut configured = BTreeMap::new();
        for entry in entries {
            let (ns, tenants) = parse_entry(entry).map_err(|why| ConfigError::new(field, why))?;
            if configured.insert(ns.clone(), tenants).is_some() {
                return Err(ConfigError::new(field, format!("namespace {ns:?} is listed twice")));
            }
        }
        Ok(Tenancy {
            operator_namespace: operator_namespace.to_owned(),
            configured,
            annotation,
        })
    }

    /// Whether the Namespace's annotations are read at all.
    pub fn reads_annotation(&self) -> bool {
        self.annotation
    }

    /// Whether deciding on `tenant` in `namespace` needs the Namespace's
    /// annotation (the settings alone do not allow it, and it could).
    pub fn needs_annotation(&self, namespace: &str, tenant: &str) -> bool {
        self.annotation
            && namespace != self.operator_namespace
            && tenant != EVERY_TENANT
            && !(self.configured.get(namespace)).is_some_and(|t| t.contains(tenant))
    }

    /// Whether objects of `namespace` may name `tenant`, given the value
    /// of the Namespace's [`TENANTS_ANNOTATION`] (`None`: absent or not
    /// read).
    pub fn check(&self, namespace: &str, tenant: &str, annotation: Option<&str>) -> Result<(), TenantNotAllowed> {
        if namespace == self.operator_namespace {
            return Ok(());
        }
        let from_settings = self.configured.get(namespace);
        let (from_annotation, ignored) = match annotation.filter(|_| self.annotation) {
            Some(v) => parse_annotation(v),
            None => (BTreeSet::new(), Vec::new()),
        };
        if tenant != EVERY_TENANT
            && (from_settings.is_some_and(|t| t.contains(tenant)) || from_annotation.contains(tenant))
        {
            return Ok(());
        }
        let mut may: BTreeSet<&str> = from_annotation.iter().map(String::as_str).collect();
        may.extend(from_settings.into_iter().flatten().map(String::as_str));
        let mut detail = if may.is_empty() {
            format!("namespace {namespace:?} may govern no tenant")
        } else {
            let listed: Vec<&str> = may.iter().copied().take(LISTED).collect();
            let more = may.len().saturating_sub(LISTED);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("namespace {namespace:?} may govern: {}{more}", listed.join(", "))
        };
        if tenant == EVERY_TENANT {
            detail.push_str(&format!(" (the operator's namespace is {:?})", self.operator_namespace));
        } else {
            let how = if self.annotation {
                format!("the Namespace's {TENANTS_ANNOTATION} annotation or the operator's --namespace-tenants")
            } else {
                "the operator's --namespace-tenants".to_owned()
            };
            detail.push_str(&format!("; a cluster administrator grants tenants with {how}"));
        }
        if !ignored.is_empty() {
            let shown: Vec<String> = ignored.iter().take(LISTED).map(|t| format!("{t:?}")).collect();
            detail.push_str(&format!(
                " (ignored in {TENANTS_ANNOTATION}, not tenant ids: {})",
                shown.join(", ")
            ));
        }
        Err(TenantNotAllowed {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            detail,
        })
    }
}

/// One item per change of a Namespace's [`TENANTS_ANNOTATION`] seen on
/// `events` (a Namespace watch): the first listing only records what each
/// Namespace says; a later event (or re-listing) whose annotation differs
/// from the last one seen yields `()` once. Watch errors are logged and
/// skipped (the watch backs off by itself).
pub fn annotation_changes<S>(events: S) -> impl Stream<Item = ()> + Send
where
    S: Stream<Item = Result<watcher::Event<Namespace>, watcher::Error>> + Send,
{
    let mut seen: HashMap<String, Option<String>> = HashMap::new();
    let mut listed = false;
    let mut changed_in_listing = false;
    events.filter_map(move |event| {
        let mut note = |ns: &Namespace| {
            let value = ns.annotations().get(TENANTS_ANNOTATION).cloned();
            match seen.insert(ns.name_any(), value.clone()) {
                Some(before) => before != value,
                // A Namespace first seen after the first listing: its
                // annotation is a change only if it has one.
                None => listed && value.is_some(),
            }
        };
        let out = match event {
            Ok(watcher::Event::Init) => {
                changed_in_listing = false;
                None
            }
            Ok(watcher::Event::InitApply(ns)) => {
                changed_in_listing |= note(&ns);
                None
            }
            Ok(watcher::Event::InitDone) => {
                let fire = listed && changed_in_listing;
                listed = true;
                fire.then_some(())
            }
            Ok(watcher::Event::Apply(ns)) => note(&ns).then_some(()),
            Ok(watcher::Event::Delete(ns)) => {
                seen.remove(&ns.name_any());
                None
            }
            Err(e) => {
                tracing::warn!(target: "mira::operator", error = %e, "namespace watch");
                None
            }
        };
        futures::future::ready(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenancy(entries: &[&str], annotation: bool) -> Tenancy {
        let entries: Vec<String> = entries.iter().map(|s| (*s).to_owned()).collect();
        Tenancy::new("obs", &entries, annotation, "operator.namespace_tenants").expect("tenancy")
    }

    #[test]
    fn settings_entries_are_parsed_and_bad_ones_named() {
        let (ns, tenants) = parse_entry(" team-a = team-a, team-a-dev ,").expect("entry");
        assert_eq!(ns, "team-a");
        assert_eq!(tenants.into_iter().collect::<Vec<_>>(), ["team-a", "team-a-dev"]);
        for (entry, why) in [
            ("team-a", "is not NAMESPACE=TENANT"),
            ("Team-A=x", "not a Kubernetes name"),
            (
                "team-a=*",
                "may be named only by objects in the operator's own namespace",
            ),
            ("team-a=a/b", "a/b"),
            ("team-a= , ", "names no tenant"),
        ] {
            let e = parse_entry(entry).expect_err(entry);
            assert!(e.contains(why), "{entry}: {e}");
        }
        let twice = ["a=x".to_owned(), "a=y".to_owned()];
        let e = Tenancy::new("obs", &twice, true, "operator.namespace_tenants").expect_err("twice");
        assert_eq!(e.field, "operator.namespace_tenants");
        assert!(e.reason.contains("listed twice"), "{}", e.reason);
    }

    #[test]
    fn the_operator_namespace_governs_everything_others_only_what_they_are_granted() {
        let t = tenancy(&["team-a=team-a"], true);
        t.check("obs", "*", None).expect("* in the operator's namespace");
        t.check("obs", "team-b", None).expect("any tenant there");
        t.check("team-a", "team-a", None).expect("from the settings");
        t.check("team-a", "team-a-dev", Some("team-a-dev, *, a/b"))
            .expect("from the annotation");

        let e = t.check("team-a", "team-b", Some("team-a-dev, *")).expect_err("team-b");
        let m = e.to_string();
        assert!(
            m.starts_with("namespace \"team-a\" may not govern tenant \"team-b\"; namespace \"team-a\" may govern: team-a, team-a-dev;"),
            "{m}"
        );
        assert!(m.contains("ignored in mira.dev/tenants, not tenant ids: \"*\""), "{m}");

        let e = t.check("team-a", "*", Some("*")).expect_err("*");
        assert!(
            e.to_string().starts_with(
                "tenant \"*\" (every tenant) may be named only in the operator's namespace, not in namespace \"team-a\""
            ),
            "{e}"
        );
        assert!(e.to_string().contains("(the operator's namespace is \"obs\")"), "{e}");

        // No mapping: nothing, not even the tenant named like the namespace.
        let e = t.check("default", "default", None).expect_err("unmapped");
        assert!(
            e.to_string().contains("namespace \"default\" may govern no tenant"),
            "{e}"
        );

        // With annotations off the annotation does not count.
        let off = tenancy(&[], false);
        assert!(off.check("team-a", "team-a", Some("team-a")).is_err());
        assert!(!off.needs_annotation("team-a", "team-a"));
        assert!(t.needs_annotation("team-a", "team-b"));
        assert!(!t.needs_annotation("team-a", "team-a"), "the settings decide");
        assert!(!t.needs_annotation("team-a", "*"), "refused without a look");
        assert!(!t.needs_annotation("obs", "team-b"), "allowed without a look");
    }

    #[test]
    fn a_long_grant_is_listed_in_part() {
        let many: Vec<String> = (0..40).map(|i| format!("t{i:02}")).collect();
        let e = tenancy(&[], true)
            .check("team-a", "team-b", Some(&many.join(",")))
            .expect_err("refused");
        assert!(e.to_string().contains("t15 and 24 more"), "{e}");
    }

    fn ns(name: &str, annotation: Option<&str>) -> Namespace {
        let mut n = Namespace::default();
        n.metadata.name = Some(name.to_owned());
        if let Some(v) = annotation {
            n.metadata.annotations = Some([(TENANTS_ANNOTATION.to_owned(), v.to_owned())].into());
        }
        n
    }

    #[tokio::test]
    async fn annotation_edits_fire_and_nothing_else_does() {
        use watcher::Event as E;
        let events = vec![
            // The first listing records.
            Ok(E::Init),
            Ok(E::InitApply(ns("team-a", Some("team-a")))),
            Ok(E::InitApply(ns("team-b", None))),
            Ok(E::InitDone),
            // Unchanged (a label edit): nothing.
            Ok(E::Apply(ns("team-a", Some("team-a")))),
            // Edited: one.
            Ok(E::Apply(ns("team-a", Some("team-a,team-c")))),
            // Added to team-b: one.
            Ok(E::Apply(ns("team-b", Some("team-b")))),
            // A new namespace without it: nothing; removed: one.
            Ok(E::Apply(ns("team-d", None))),
            Ok(E::Apply(ns("team-a", None))),
            Ok(E::Delete(ns("team-d", None))),
            // A re-listing with one change: one, at its end.
            Ok(E::Init),
            Ok(E::InitApply(ns("team-a", Some("x")))),
            Ok(E::InitApply(ns("team-b", Some("team-b")))),
            Ok(E::InitDone),
            // A re-listing without changes: nothing.
            Ok(E::Init),
            Ok(E::InitApply(ns("team-a", Some("x")))),
            Ok(E::InitDone),
        ];
        let fired = annotation_changes(futures::stream::iter(events)).count().await;
        assert_eq!(fired, 4);
    }
}
