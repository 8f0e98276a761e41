//! `pb::WriteRequest` → [`Command`], validated.

use mira_proto::catalog as pb;

use super::{block_id, policy};
use crate::error::CommandError;
use crate::model::{BlockRecord, Command, OffloadItem, Policy, ReplaceReason, TombstoneReason, Watermark};

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
            Some(C::MarkOffloadedV2(m)) => Command::MarkOffloadedV2 {
                items: m
                    .items
                    .iter()
                    .map(|i| {
                        Ok(OffloadItem {
                            id: block_id::parse("items.id", &i.id)?,
                            location: i.location.clone(),
                            sha256: i.sha256.clone(),
                            at_ns: i.at_ns,
                        })
                    })
                    .collect::<Result<_, CommandError>>()?,
            },
            Some(C::MarkPrimaryFreed(m)) => Command::MarkPrimaryFreed {
                ids: block_id::parse_list("ids", &m.ids)?,
                now_ns: m.now_ns,
                lease_key: m.lease_key.clone(),
                lease_holder: m.lease_holder.clone(),
            },
            Some(C::MarkRestoredV2(m)) => Command::MarkRestoredV2 {
                ids: block_id::parse_list("ids", &m.ids)?,
                pin_until_ns: m.pin_until_ns,
                now_ns: m.now_ns,
                lease_key: m.lease_key.clone(),
                lease_holder: m.lease_holder.clone(),
            },
            Some(C::TombstoneV2(t)) => Command::TombstoneV2 {
                ids: block_id::parse_list("ids", &t.ids)?,
                now_ns: t.now_ns,
                reason: match pb::TombstoneReason::try_from(t.reason) {
                    Ok(pb::TombstoneReason::Retention) => TombstoneReason::Retention,
                    Ok(pb::TombstoneReason::Manual) => TombstoneReason::Manual,
                    _ => {
                        return Err(CommandError::invalid(
                            "reason",
                            format!("unknown tombstone reason {}", t.reason),
                        ));
                    }
                },
            },
            Some(C::SetPolicyStatus(st)) => Command::SetPolicyStatus {
                kind: policy::kind_from_pb(st.kind)?,
                name: st.name.clone(),
                status_json: st.status_json.clone(),
            },
            // Without checks (a compactor from before them): the first
            // variant, which every catalog member can read from the log.
            Some(C::RegisterOffloadTargets(r)) if r.checks.is_empty() => {
                Command::RegisterOffloadTargets { names: r.names.clone() }
            }
            Some(C::RegisterOffloadTargets(r)) => Command::RegisterOffloadTargetsV2 {
                names: r.names.clone(),
                checks: r
                    .checks
                    .iter()
                    .map(|c| crate::model::TargetCheck {
                        name: c.name.clone(),
                        reachable: c.reachable,
                        checked_at_ns: c.checked_at_ns,
                        error: c.error.clone(),
                    })
                    .collect(),
            },
            Some(C::RegisterMember(r)) => Command::RegisterMember {
                node_id: r.node_id,
                incarnation: r.incarnation.clone(),
                replace: r.replace,
            },
            Some(C::ForgetMember(f)) => Command::ForgetMember { node_id: f.node_id },
        };
        cmd.validate()?;
        Ok(cmd)
    }
}

#[cfg(test)]
mod tests {
    use mira_core::block::path::block_path;
    use mira_core::ids::{BlockId, Signal, TenantId};

    use super::*;
    use crate::model::{BlockState, Level};

    const HOUR: i64 = 3_600_000_000_000;

    fn record(n: u128, rows: u64) -> BlockRecord {
        let tenant = TenantId::new("t").expect("tenant");
        let id = BlockId::from_u128(n << 80 | 7);
        BlockRecord {
            id,
            tenant: tenant.clone(),
            signal: Signal::Logs,
            partition_start_ns: HOUR,
            min_time_ns: HOUR + 1,
            max_time_ns: HOUR + 2,
            rows,
            bytes: 10,
            level: Level::Cold,
            object_key: block_path(&tenant, Signal::Logs, (HOUR + 1) as u64, id).to_string(),
            created_at_ns: 3,
            state: BlockState::Live,
            no_compact: None,
            offload: None,
        }
    }

    fn command(c: pb::write_request::Command) -> Result<Command, CommandError> {
        Command::try_from(&pb::WriteRequest { command: Some(c) })
    }

    #[test]
    fn target_registrations_without_checks_stay_the_first_variant() {
        use pb::write_request::Command as C;
        let names = vec!["a".to_owned()];
        assert_eq!(
            command(C::RegisterOffloadTargets(pb::RegisterOffloadTargets {
                names: names.clone(),
                checks: vec![],
            }))
            .expect("names only"),
            Command::RegisterOffloadTargets { names: names.clone() }
        );
        let check = pb::OffloadTargetCheck {
            name: "a".into(),
            reachable: false,
            checked_at_ns: 5,
            error: "refused".into(),
        };
        assert_eq!(
            command(C::RegisterOffloadTargets(pb::RegisterOffloadTargets {
                names: names.clone(),
                checks: vec![check.clone()],
            }))
            .expect("with checks"),
            Command::RegisterOffloadTargetsV2 {
                names: names.clone(),
                checks: vec![crate::model::TargetCheck {
                    name: "a".into(),
                    reachable: false,
                    checked_at_ns: 5,
                    error: "refused".into(),
                }],
            }
        );
        // A compactor's request as a catalog from before the checks reads
        // it: the names (prost skips the unknown field).
        let bytes = prost::Message::encode_to_vec(&pb::RegisterOffloadTargets {
            names: names.clone(),
            checks: vec![check],
        });
        #[derive(Clone, PartialEq, prost::Message)]
        struct Before {
            #[prost(string, repeated, tag = "1")]
            names: Vec<String>,
        }
        let old: Before = prost::Message::decode(bytes.as_slice()).expect("decode");
        assert_eq!(old.names, names);
    }

    #[test]
    fn replace_v2_maps_field_by_field() {
        use pb::write_request::Command as C;
        let (out, input) = (record(1, 5), record(2, 6));
        for (reason, model, dropped) in [
            (pb::ReplaceReason::Merge, ReplaceReason::Merge, 0),
            (pb::ReplaceReason::Cold, ReplaceReason::Cold, 0),
            (pb::ReplaceReason::RetentionRewrite, ReplaceReason::RetentionRewrite, 1),
        ] {
            assert_eq!(pb::ReplaceReason::from(model), reason);
            let msg = pb::ReplaceV2 {
                add: vec![pb::Block::from(&out)],
                tombstone: vec![input.id.to_string()],
                now_ns: 9,
                lease_key: "part/t/logs/1".into(),
                lease_holder: "c/1".into(),
                reason: reason as i32,
                dropped_rows: dropped,
            };
            assert_eq!(
                command(C::ReplaceV2(msg)).expect("valid"),
                Command::ReplaceV2 {
                    add: vec![out.clone()],
                    tombstone: vec![input.id],
                    now_ns: 9,
                    lease_key: "part/t/logs/1".into(),
                    lease_holder: "c/1".into(),
                    reason: model,
                    dropped_rows: dropped,
                }
            );
        }
        let unspecified = pb::ReplaceV2 {
            add: vec![pb::Block::from(&out)],
            tombstone: vec![input.id.to_string()],
            lease_key: "k".into(),
            lease_holder: "h".into(),
            ..Default::default()
        };
        let err = command(C::ReplaceV2(unspecified)).expect_err("no reason");
        assert!(err.to_string().contains("reason"), "{err}");
    }

    #[test]
    fn lease_jobs_abandon_and_marks_map() {
        use pb::write_request::Command as C;
        let acquire = |job: Option<&str>| pb::AcquireLease {
            key: "k".into(),
            holder: "h".into(),
            now_ns: 1,
            ttl_ms: 2,
            job: job.map(str::to_owned),
        };
        for job in [None, Some(""), Some("{\"v\":1}")] {
            assert_eq!(
                command(C::AcquireLease(acquire(job))).expect("acquire"),
                Command::AcquireLeaseJob {
                    key: "k".into(),
                    holder: "h".into(),
                    now_ns: 1,
                    ttl_ms: 2,
                    job: job.map(str::to_owned),
                }
            );
            let renew = pb::RenewLease {
                key: "k".into(),
                holder: "h".into(),
                now_ns: 1,
                ttl_ms: 2,
                job: job.map(str::to_owned),
            };
            assert!(matches!(
                command(C::RenewLease(renew)).expect("renew"),
                Command::RenewLeaseJob { job: j, .. } if j.as_deref() == job
            ));
        }
        let lease = crate::model::Lease {
            key: "k".into(),
            holder: "h".into(),
            expires_at_ns: 5,
            job: "{}".into(),
        };
        assert_eq!(pb::Lease::from(&lease).job, "{}");

        let ids = vec![BlockId::from_u128(1 << 90), BlockId::from_u128(2 << 90)];
        let text: Vec<String> = ids.iter().map(BlockId::to_string).collect();
        assert_eq!(
            command(C::Abandon(pb::Abandon { ids: text.clone() })).expect("abandon"),
            Command::Abandon { ids: ids.clone() }
        );
        assert_eq!(
            command(C::MarkNoCompact(pb::MarkNoCompact {
                ids: text.clone(),
                reason: "r".into()
            }))
            .expect("mark"),
            Command::MarkNoCompact {
                ids: ids.clone(),
                reason: "r".into()
            }
        );
        assert_eq!(
            command(C::ClearNoCompact(pb::ClearNoCompact { ids: text })).expect("clear"),
            Command::ClearNoCompact { ids }
        );
        let err = command(C::Abandon(pb::Abandon { ids: vec![] })).expect_err("empty");
        assert!(err.to_string().contains("ids"), "{err}");
        let err = command(C::Abandon(pb::Abandon {
            ids: vec!["nope".into()],
        }))
        .expect_err("bad id");
        assert!(err.to_string().contains("ids"), "{err}");
    }

    #[test]
    fn new_commands_encode_after_the_old_ones() {
        // postcard encodes the variant index first: the new commands take
        // indexes after FencedPublish (14), so log entries already written
        // keep decoding as the variants they were.
        let first = |c: &Command| postcard::to_stdvec(c).expect("encode")[0];
        let ids = vec![BlockId::from_u128(1)];
        assert_eq!(
            first(&Command::ReplaceV2 {
                add: vec![],
                tombstone: vec![],
                now_ns: 0,
                lease_key: String::new(),
                lease_holder: String::new(),
                reason: ReplaceReason::Merge,
                dropped_rows: 0,
            }),
            15
        );
        assert_eq!(first(&Command::Abandon { ids: ids.clone() }), 16);
        assert_eq!(
            first(&Command::MarkNoCompact {
                ids: ids.clone(),
                reason: String::new()
            }),
            17
        );
        assert_eq!(first(&Command::ClearNoCompact { ids }), 18);
        let lease = |renew| {
            let (key, holder, job) = (String::new(), String::new(), None);
            if renew {
                Command::RenewLeaseJob {
                    key,
                    holder,
                    now_ns: 0,
                    ttl_ms: 0,
                    job,
                }
            } else {
                Command::AcquireLeaseJob {
                    key,
                    holder,
                    now_ns: 0,
                    ttl_ms: 0,
                    job,
                }
            }
        };
        assert_eq!((first(&lease(false)), first(&lease(true))), (19, 20));
        // And a command round-trips, its new blocks without a mark.
        let cmd = Command::ReplaceV2 {
            add: vec![record(1, 5)],
            tombstone: vec![BlockId::from_u128(9)],
            now_ns: 4,
            lease_key: "k".into(),
            lease_holder: "h".into(),
            reason: ReplaceReason::RetentionRewrite,
            dropped_rows: 2,
        };
        let back: Command = postcard::from_bytes(&postcard::to_stdvec(&cmd).expect("encode")).expect("decode");
        assert_eq!(back, cmd);
    }
}
