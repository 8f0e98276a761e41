//! [`Policy`] ↔ `pb::Policy`, with its kind.

use mira_proto::catalog as pb;

use crate::error::CommandError;
use crate::model::{Policy, PolicyKind};

impl From<PolicyKind> for pb::PolicyKind {
    fn from(k: PolicyKind) -> pb::PolicyKind {
        match k {
            PolicyKind::Retention => pb::PolicyKind::Retention,
            PolicyKind::Offload => pb::PolicyKind::Offload,
        }
    }
}

/// A policy kind a command names.
pub fn kind_from_pb(v: i32) -> Result<PolicyKind, CommandError> {
    match pb::PolicyKind::try_from(v) {
        Ok(pb::PolicyKind::Retention) => Ok(PolicyKind::Retention),
        Ok(pb::PolicyKind::Offload) => Ok(PolicyKind::Offload),
        _ => Err(CommandError::invalid("kind", format!("unknown policy kind {v}"))),
    }
}

/// A kind a listing asks for; `None` for "unspecified" (every kind).
pub fn kind_filter_from_pb(v: i32) -> Result<Option<PolicyKind>, CommandError> {
    if v == pb::PolicyKind::Unspecified as i32 {
        return Ok(None);
    }
    kind_from_pb(v).map(Some)
}

impl From<&Policy> for pb::Policy {
    fn from(p: &Policy) -> pb::Policy {
        pb::Policy {
            kind: pb::PolicyKind::from(p.kind) as i32,
            name: p.name.clone(),
            tenant: p.tenant.clone(),
            body_json: p.body_json.clone(),
            status_json: String::new(),
        }
    }
}

impl TryFrom<&pb::Policy> for Policy {
    type Error = CommandError;

    fn try_from(p: &pb::Policy) -> Result<Policy, CommandError> {
        Ok(Policy {
            kind: kind_from_pb(p.kind)?,
            name: p.name.clone(),
            tenant: p.tenant.clone(),
            body_json: p.body_json.clone(),
        })
    }
}
