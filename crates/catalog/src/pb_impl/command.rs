//! `pb::WriteRequest` → [`Command`], validated.

use mira_proto::catalog as pb;

use super::{block_id, policy};
use crate::error::CommandError;
use crate::model::{BlockRecord, Command, Policy, ReplaceReason, Watermark};

fn replace_reason(v: i32) -> Result<ReplaceReason, CommandError> {
    match pb::ReplaceReason::try_from(v) {
        Ok(pb::ReplaceReason::Merge) => Ok(ReplaceReason::Merge),
        Ok(pb::ReplaceReason::Cold) => Ok(ReplaceReason::Cold),
        Ok(pb::ReplaceReason::RetentionRewrite) => Ok(ReplaceReason::RetentionRewrite),
        _ => Err(CommandError::invalid("reason", format!("unknown replace reason {v}"))),
    }
}

impl From<ReplaceReason> for pb::ReplaceReason {
    fn from(r: ReplaceReason) -> pb::ReplaceReason {
        match r {
            ReplaceReason::Merge => pb::ReplaceReason::Merge,
            ReplaceReason::Cold => pb::ReplaceReason::Cold,
            ReplaceReason::RetentionRewrite => pb::ReplaceReason::RetentionRewrite,
        }
    }
}

fn blocks(list: &[pb::Block]) -> Result<Vec<BlockRecord>, CommandError> {
    list.iter().map(BlockRecord::try_from).collect()
}

/// The command a write request carries, validated
/// ([`Command::validate`]).
impl TryFrom<&pb::WriteRequest> for Command {
    type Error = CommandError;

    fn try_from(req: &pb::WriteRequest) -> Result<Command, CommandError> {
        use pb::write_request::Command as C;
        let cmd = match req.command.as_ref() {
            None => return Err(CommandError::invalid("command", "missing")),
            Some(C::Publish(p)) => Command::Publish {
                blocks: blocks(&p.blocks)?,
                watermark: p.watermark.as_ref().map(Watermark::from),
            },
            Some(C::Replace(r)) => Command::Replace {
                add: blocks(&r.add)?,
                tombstone: block_id::parse_list("tombstone", &r.tombstone)?,
                now_ns: r.now_ns,
                lease: match (r.lease_key.is_empty(), r.lease_holder.is_empty()) {
                    (true, true) => None,
                    (false, false) => Some((r.lease_key.clone(), r.lease_holder.clone())),
                    _ => return Err(CommandError::invalid("lease_key", "lease key and holder go together")),
                },
            },
            Some(C::Tombstone(t)) => Command::Tombstone {
                ids: block_id::parse_list("ids", &t.ids)?,
                now_ns: t.now_ns,
            },
            Some(C::Purge(p)) => Command::Purge {
                ids: block_id::parse_list("ids", &p.ids)?,
            },
            Some(C::MarkOffloaded(m)) => Command::MarkOffloaded {
                id: block_id::parse("id", &m.id)?,
                location: m.location.clone(),
            },
            Some(C::MarkRestored(m)) => Command::MarkRestored {
                id: block_id::parse("id", &m.id)?,
            },
            Some(C::SetPolicy(s)) => {
                let p = s
                    .policy
                    .as_ref()
                    .ok_or_else(|| CommandError::invalid("policy", "missing"))?;
                Command::SetPolicy(Policy::try_from(p)?)
            }
            Some(C::DeletePolicy(d)) => Command::DeletePolicy {
                kind: policy::kind_from_pb(d.kind)?,
                name: d.name.clone(),
            },
            // The variants with a job (the older ones stay for log entries
            // already written; they neither carry a job nor prune).
            Some(C::AcquireLease(l)) => Command::AcquireLeaseJob {
                key: l.key.clone(),
                holder: l.holder.clone(),
                now_ns: l.now_ns,
                ttl_ms: l.ttl_ms,
                job: l.job.clone(),
            },
            Some(C::RenewLease(l)) => Command::RenewLeaseJob {
                key: l.key.clone(),
                holder: l.holder.clone(),
                now_ns: l.now_ns,
                ttl_ms: l.ttl_ms,
                job: l.job.clone(),
            },
            Some(C::ReleaseLease(l)) => Command::ReleaseLease {
                key: l.key.clone(),
                holder: l.holder.clone(),
            },
            Some(C::Heartbeat(h)) => Command::Heartbeat {
                ingester_id: h.ingester_id.clone(),
                address: h.address.clone(),
                now_ns: h.now_ns,
                ttl_ms: h.ttl_ms,
            },
            Some(C::Fence(f)) => Command::Fence {
                ingester_id: f.ingester_id.clone(),
            },
            Some(C::Stage(st)) => Command::Stage {
                ingester_id: st.ingester_id.clone(),
                epoch: st.epoch,
                txn: block_id::parse_ulid("txn", &st.txn)?,
                blocks: blocks(&st.blocks)?,
            },
            Some(C::FencedPublish(p)) => Command::FencedPublish {
                ingester_id: p.ingester_id.clone(),
                epoch: p.epoch,
                blocks: blocks(&p.blocks)?,
                watermark: p.watermark.as_ref().map(Watermark::from),
                txn: if p.txn.is_empty() {
                    None
                } else {
                    Some(block_id::parse_ulid("txn", &p.txn)?)
                },
            },
            Some(C::ReplaceV2(r)) => Command::ReplaceV2 {
                add: blocks(&r.add)?,
                tombstone: block_id::parse_list("tombstone", &r.tombstone)?,
                now_ns: r.now_ns,
                lease_key: r.lease_key.clone(),
                lease_holder: r.lease_holder.clone(),
                reason: replace_reason(r.reason)?,
                dropped_rows: r.dropped_rows,
            },
            Some(C::Abandon(a)) => Command::Abandon {
                ids: block_id::parse_list("ids", &a.ids)?,
            },
            Some(C::MarkNoCompact(m)) => Command::MarkNoCompact {
                ids: block_id::parse_list("ids", &m.ids)?,
                reason: m.reason.clone(),
            },
            Some(C::ClearNoCompact(c)) => Command::ClearNoCompact {
                ids: block_id::parse_list("ids", &c.ids)?,
            },
        };
        cmd.validate()?;
        Ok(cmd)
    }
}
