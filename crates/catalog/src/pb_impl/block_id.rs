//! Block ids (and the ULIDs naming staged publishes) as the messages carry
//! them: ULID text. `BlockId` is `mira-core`'s and the message field a
//! `String`, so these are functions, not `From` impls.

use mira_core::ids::BlockId;

use super::truncate;
use crate::error::CommandError;
use crate::model::MAX_BLOCKS_PER_COMMAND;

/// A ULID in text form, as its `u128`.
pub fn parse_ulid(field: &str, s: &str) -> Result<u128, CommandError> {
    s.parse::<ulid::Ulid>()
        .map(u128::from)
        .map_err(|e| CommandError::invalid(field, format!("{:?} is not a ULID: {e}", truncate(s))))
}

pub fn parse(field: &str, s: &str) -> Result<BlockId, CommandError> {
    parse_ulid(field, s).map(BlockId::from_u128)
}

/// A list of ids, at most [`MAX_BLOCKS_PER_COMMAND`].
pub fn parse_list(field: &str, ids: &[String]) -> Result<Vec<BlockId>, CommandError> {
    if ids.len() > MAX_BLOCKS_PER_COMMAND {
        return Err(CommandError::invalid(
            field,
            format!("{} entries, at most {MAX_BLOCKS_PER_COMMAND} per command", ids.len()),
        ));
    }
    ids.iter().map(|s| parse(field, s)).collect()
}
