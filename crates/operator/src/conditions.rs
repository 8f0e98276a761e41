//! `metav1.Condition`s by the Kubernetes API conventions: one per `type`,
//! `lastTransitionTime` moves only when `status` flips, so writing the same
//! condition again changes nothing (and a status patch the operator makes
//! does not make the next reconcile patch again).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// `Ready`: the spec is in the catalog.
pub const READY: &str = "Ready";
/// `OffloadTargetReady`: a compactor registered the offload target and
/// its last reachability check of it passed.
pub const OFFLOAD_TARGET_READY: &str = "OffloadTargetReady";

/// Reasons of the conditions (docs/operations.md has the table).
pub mod reason {
    pub const APPLIED: &str = "Applied";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// `spec.tenant` names a tenant the object's namespace may not govern.
    pub const TENANT_NOT_ALLOWED: &str = "TenantNotAllowed";
    pub const CATALOG_UNAVAILABLE: &str = "CatalogUnavailable";
    pub const CATALOG_REJECTED: &str = "CatalogRejected";
    pub const OFFLOAD_TARGET_NOT_READY: &str = "OffloadTargetNotReady";
    pub const TARGET_REGISTERED: &str = "TargetRegistered";
    pub const TARGET_NOT_REGISTERED: &str = "TargetNotRegistered";
    /// Registered, but the compactor's last reachability check of it failed.
    pub const TARGET_UNREACHABLE: &str = "TargetUnreachable";
}

/// A condition to set (its time is filled in by [`set_condition`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want<'a> {
    pub type_: &'a str,
    pub status: bool,
    pub reason: &'a str,
    pub message: String,
    pub generation: Option<i64>,
}

fn status_text(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Sets the condition of `want.type_` in `conditions`, keeping its
/// `lastTransitionTime` unless the status flips (or it is new, then `now`).
pub fn set_condition(conditions: &mut Vec<Condition>, want: Want<'_>, now: Timestamp) {
    let status = status_text(want.status).to_owned();
    let existing = conditions.iter().position(|c| c.type_ == want.type_);
    let last_transition_time = match existing.map(|i| &conditions[i]) {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(now),
    };
    let c = Condition {
        type_: want.type_.to_owned(),
        status,
        reason: want.reason.to_owned(),
        message: want.message,
        observed_generation: want.generation,
        last_transition_time,
    };
    match existing {
        Some(i) => conditions[i] = c,
        None => conditions.push(c),
    }
}

/// Removes the condition of `type_`.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// The condition of `type_`.
pub fn find<'c>(conditions: &'c [Condition], type_: &str) -> Option<&'c Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(status: bool, reason: &str) -> Want<'_> {
        Want {
            type_: READY,
            status,
            reason,
            message: format!("m {reason}"),
            generation: Some(2),
        }
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let t0 = Timestamp::from_second(1_000).expect("time");
        let t1 = Timestamp::from_second(2_000).expect("time");
        let t2 = Timestamp::from_second(3_000).expect("time");
        let mut cs = Vec::new();
        set_condition(&mut cs, want(false, reason::CATALOG_UNAVAILABLE), t0);
        assert_eq!(cs[0].last_transition_time, Time(t0));
        // Same status, another reason: the time stays.
        set_condition(&mut cs, want(false, reason::INVALID_SPEC), t1);
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].reason, reason::INVALID_SPEC);
        assert_eq!(cs[0].last_transition_time, Time(t0));
        // A flip: the time moves.
        set_condition(&mut cs, want(true, reason::APPLIED), t2);
        assert_eq!(cs[0].status, "True");
        assert_eq!(cs[0].last_transition_time, Time(t2));
        // Another type is another entry; removing one leaves the other.
        set_condition(
            &mut cs,
            Want {
                type_: OFFLOAD_TARGET_READY,
                ..want(true, reason::TARGET_REGISTERED)
            },
            t2,
        );
        assert_eq!(cs.len(), 2);
        remove_condition(&mut cs, OFFLOAD_TARGET_READY);
        assert_eq!(cs.len(), 1);
        assert_eq!(find(&cs, READY).map(|c| c.reason.as_str()), Some(reason::APPLIED));
    }
}
