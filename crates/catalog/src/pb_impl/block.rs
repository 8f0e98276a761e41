//! [`BlockRecord`] ↔ `pb::Block`, with its level and lifecycle state.

use mira_core::block::path::parse_block_path;
use mira_core::ids::TenantId;
use mira_proto::catalog as pb;
use object_store::path::Path;

use super::{block_id, signal};
use crate::error::CommandError;
use crate::model::{BlockRecord, BlockState, Level, StateKind};

impl From<&BlockRecord> for pb::Block {
    fn from(b: &BlockRecord) -> pb::Block {
        let (state, offload_location, tombstoned_at_ns) = match &b.state {
            BlockState::Live => (pb::BlockState::Live, String::new(), 0),
            BlockState::Tombstoned { at_ns } => (pb::BlockState::Tombstoned, String::new(), *at_ns),
            BlockState::Offloaded { location } => (pb::BlockState::Offloaded, location.clone(), 0),
        };
        pb::Block {
            id: b.id.to_string(),
            tenant: b.tenant.as_str().to_owned(),
            signal: signal::to_pb(b.signal),
            partition_start_ns: b.partition_start_ns,
            min_time_ns: b.min_time_ns,
            max_time_ns: b.max_time_ns,
            rows: b.rows,
            bytes: b.bytes,
            level: match b.level {
                Level::Hot => pb::Level::Hot,
                Level::Cold => pb::Level::Cold,
            } as i32,
            object_key: b.object_key.clone(),
            created_at_ns: b.created_at_ns,
            state: state as i32,
            offload_location,
            tombstoned_at_ns,
        }
    }
}

/// A block as sent in a publish or replace (its state must be live or
/// unspecified; partition start is taken from the object key). The rest of
/// its validation is [`crate::model::Command::validate`]'s.
impl TryFrom<&pb::Block> for BlockRecord {
    type Error = CommandError;

    fn try_from(b: &pb::Block) -> Result<BlockRecord, CommandError> {
        let id = block_id::parse("block.id", &b.id)?;
        let level = match pb::Level::try_from(b.level) {
            Ok(pb::Level::Hot) | Ok(pb::Level::Unspecified) => Level::Hot,
            Ok(pb::Level::Cold) => Level::Cold,
            Err(_) => {
                return Err(CommandError::invalid(
                    "block.level",
                    format!("unknown level {}", b.level),
                ));
            }
        };
        match pb::BlockState::try_from(b.state) {
            Ok(pb::BlockState::Live) | Ok(pb::BlockState::Unspecified) => {}
            _ => return Err(CommandError::invalid("block.state", "new blocks are live")),
        }
        let key = Path::from(b.object_key.as_str());
        let partition_start_ns = parse_block_path(&key)
            .ok()
            .and_then(|l| i64::try_from(l.hour_start).ok())
            .unwrap_or(-1);
        let signal = signal::parse("block.signal", b.signal)?;
        let tenant = TenantId::new(&b.tenant)
            .map_err(|e| CommandError::invalid(format!("block {id}: tenant"), e.to_string()))?;
        Ok(BlockRecord {
            id,
            tenant,
            signal,
            partition_start_ns,
            min_time_ns: b.min_time_ns,
            max_time_ns: b.max_time_ns,
            rows: b.rows,
            bytes: b.bytes,
            level,
            object_key: b.object_key.clone(),
            created_at_ns: b.created_at_ns,
            state: BlockState::Live,
        })
    }
}

/// A block state a listing asks for.
pub fn state_kind_from_pb(v: i32) -> Result<StateKind, CommandError> {
    match pb::BlockState::try_from(v) {
        Ok(pb::BlockState::Live) => Ok(StateKind::Live),
        Ok(pb::BlockState::Tombstoned) => Ok(StateKind::Tombstoned),
        Ok(pb::BlockState::Offloaded) => Ok(StateKind::Offloaded),
        _ => Err(CommandError::invalid("states", format!("unknown block state {v}"))),
    }
}

#[cfg(test)]
mod tests {
    use mira_core::block::path::block_path;
    use mira_core::ids::{BlockId, Signal};

    use super::*;

    #[test]
    fn a_block_round_trips_and_a_bad_tenant_is_named() {
        let tenant = TenantId::new("t").expect("tenant");
        let id = BlockId::from_u128(7 << 80 | 42);
        let hour = 3_600_000_000_000u64;
        let record = BlockRecord {
            id,
            tenant: tenant.clone(),
            signal: Signal::Traces,
            partition_start_ns: hour as i64,
            min_time_ns: hour as i64 + 5,
            max_time_ns: hour as i64 + 9,
            rows: 3,
            bytes: 100,
            level: Level::Hot,
            object_key: block_path(&tenant, Signal::Traces, hour + 5, id).to_string(),
            created_at_ns: 1,
            state: BlockState::Live,
        };
        let message = pb::Block::from(&record);
        assert_eq!(message.id, id.to_string());
        assert_eq!(message.signal, pb::Signal::Traces as i32);
        assert_eq!(BlockRecord::try_from(&message).expect("back"), record);

        let bad = pb::Block {
            tenant: "../etc".into(),
            ..message
        };
        let err = BlockRecord::try_from(&bad).expect_err("path tricks");
        assert!(err.to_string().contains("tenant"), "{err}");
    }
}
