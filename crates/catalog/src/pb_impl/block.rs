//! [`BlockRecord`] ↔ `pb::Block`, with its level and lifecycle state.

use mira_core::block::path::parse_block_path;
use mira_core::ids::TenantId;
use mira_proto::catalog as pb;
use object_store::path::Path;

use super::{block_id, signal, truncate};
use crate::error::CommandError;
use crate::model::{BlockRecord, BlockState, Level, StateKind};
use crate::state::BlockCursor;

impl From<&BlockRecord> for pb::Block {
    fn from(b: &BlockRecord) -> pb::Block {
        let (state, offload_location, tombstoned_at_ns) = match &b.state {
            BlockState::Live => (pb::BlockState::Live, String::new(), 0),
            BlockState::Tombstoned { at_ns } => (pb::BlockState::Tombstoned, String::new(), *at_ns),
            BlockState::Offloaded { location } => (pb::BlockState::Offloaded, location.clone(), 0),
        };
        let copy = b.offload.as_ref();
        let offload_location = copy.map_or(offload_location, |c| c.location.clone());
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
            no_compact_reason: b.no_compact.clone().unwrap_or_default(),
            offload_sha256: copy.map(|c| c.sha256.clone()).unwrap_or_default(),
            offloaded_at_ns: copy.map_or(0, |c| c.at_ns),
            primary_freed: copy.is_some_and(|c| c.primary_freed),
            pinned_until_ns: copy.map_or(0, |c| c.pinned_until_ns),
        }
    }
}

/// A block as sent in a publish or replace (its state must be live or
/// unspecified; partition start is taken from the object key; a quarantine
/// reason is ignored: new blocks are not quarantined). The rest of
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
            no_compact: None,
            offload: None,
        })
    }
}

/// Whether a publish or stage would accept `b` as a new block (the same
/// stateless checks the catalog runs on each block of the command): lets a
/// publisher set one bad block aside instead of having the whole command
/// refused.
pub fn check_new_block(b: &pb::Block) -> Result<(), CommandError> {
    crate::model::validate_block(&BlockRecord::try_from(b)?)
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

/// The `next_page_token` resuming a listing after `c`:
/// `{tenant}/{signal code}/{min_time_ns}/{id}` (opaque to clients).
pub fn page_token(c: &BlockCursor) -> String {
    format!("{}/{}/{}/{}", c.tenant.as_str(), c.signal.code(), c.min_time_ns, c.id)
}

/// Inverse of [`page_token`].
pub fn parse_page_token(s: &str) -> Result<BlockCursor, CommandError> {
    let bad = || CommandError::invalid("page_token", format!("{:?} is not a page token", truncate(s)));
    let mut parts = s.rsplitn(4, '/');
    let (Some(id), Some(min), Some(code), Some(tenant)) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    Ok(BlockCursor {
        tenant: TenantId::new(tenant).map_err(|_| bad())?,
        signal: code
            .parse::<u8>()
            .ok()
            .and_then(mira_core::ids::Signal::from_code)
            .ok_or_else(bad)?,
        min_time_ns: min.parse().map_err(|_| bad())?,
        id: block_id::parse("page_token", id)?,
    })
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
            no_compact: None,
            offload: None,
        };
        let message = pb::Block::from(&record);
        assert!(message.no_compact_reason.is_empty());
        let marked = BlockRecord {
            no_compact: Some("decode error".into()),
            offload: None,
            ..record.clone()
        };
        assert_eq!(pb::Block::from(&marked).no_compact_reason, "decode error");
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

    /// The last publishable time passes the catalog's block checks; times
    /// at and past `i64::MAX` and a negative creation time do not.
    #[test]
    fn check_new_block_accepts_up_to_the_last_publishable_time() {
        use mira_core::block::path::LAST_PUBLISHABLE_NS;
        let tenant = TenantId::new("t").expect("tenant");
        let id = BlockId::from_u128(7 << 80 | 42);
        let block = |t: u64, created: i64| pb::Block {
            id: id.to_string(),
            tenant: "t".into(),
            signal: signal::to_pb(Signal::Logs),
            min_time_ns: i64::try_from(t).unwrap_or(i64::MAX),
            max_time_ns: i64::try_from(t).unwrap_or(i64::MAX),
            rows: 1,
            bytes: 1,
            level: pb::Level::Hot as i32,
            object_key: block_path(&tenant, Signal::Logs, t, id).to_string(),
            created_at_ns: created,
            ..Default::default()
        };
        check_new_block(&block(LAST_PUBLISHABLE_NS, 1)).expect("the last publishable time");
        check_new_block(&block(i64::MAX as u64, 1)).expect_err("i64::MAX");
        check_new_block(&block(1 << 63, 1)).expect_err("past i64::MAX");
        let err = check_new_block(&block(5, -1)).expect_err("negative creation time");
        assert!(err.to_string().contains("created_at_ns"), "{err}");
    }

    #[test]
    fn page_tokens_round_trip_and_garbage_is_refused() {
        let cursor = BlockCursor {
            tenant: TenantId::new("team-a.prod_1").expect("tenant"),
            signal: Signal::Metrics,
            min_time_ns: 3_600_000_000_017,
            id: BlockId::from_u128(u128::MAX - 5),
        };
        assert_eq!(parse_page_token(&page_token(&cursor)).expect("back"), cursor);
        for bad in [
            "",
            "t/1/2",
            "t/9/2/01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "../x/1/2/01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "t/1/x/01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "t/1/2/nope",
        ] {
            let err = parse_page_token(bad).expect_err(bad);
            assert!(err.to_string().contains("page_token"), "{bad}: {err}");
        }
    }
}
