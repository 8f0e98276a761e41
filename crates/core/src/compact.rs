//! Merging blocks: the records of several blocks of one tenant and signal
//! rewritten as one block (the compactor's merge), hot ([`merge_blocks`])
//! or straight into the cold codec ([`merge_blocks_cold`]). Blocks are
//! merged on Arrow ([`concat`]): root and child tables concatenated,
//! resources, scopes and metric series deduplicated across inputs by
//! content, dictionaries re-interned. Inputs not in the layout the
//! builders write take the OTLP path ([`merge_via_otlp`]): each input's
//! tables are turned back into OTLP and appended to a fresh builder. Both
//! give the same tables (a property test holds them equal): resources,
//! scopes and series repeated across inputs are stored once in the
//! output. Its sidecars (zone maps, attribute index, id filters) are
//! built anew over all its rows.
//!
//! Records keep their order exactly: row `k` of the output is row `k - n`
//! of input `i`, where `n` is the rows of the inputs before `i` (tables
//! are concatenated in input order; the OTLP path produces OTLP in row
//! order, never regrouped). Every merged block carries
//! a [`Lineage`] section saying so: each input contributes its own runs
//! when it has them (a merge of merges keeps the first origins), else one
//! run of its own id.
//!
//! The output's time range and row count are in its footer: parse it with
//! [`crate::block::Manifest::from_tail`] (or open the bytes as a
//! [`Block`]) instead of reading any section.

mod concat;

use bytes::Bytes;
use rayon::prelude::*;

use crate::block::{Block, Level};
use crate::cold::write_cold;
use crate::convert::{
    LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, TableSet, logs_to_otlp_in_row_order,
    points_to_otlp_in_row_order, spans_to_otlp_in_row_order,
};
use crate::lineage::{LINEAGE_SECTION, Lineage};
use crate::sidecar::SidecarSection;
use crate::tables::{read_tables, write_hot_with};
use crate::{BlockId, Error, Signal};

/// The merged tables of `inputs`, which must share one tenant and signal.
pub fn merge_tables(inputs: &[Block]) -> Result<TableSet, Error> {
    Ok(merge(inputs)?.0)
}

/// The merged tables of `inputs` (which must share one tenant and signal)
/// and the origin of each of their rows.
pub fn merge(inputs: &[Block]) -> Result<(TableSet, Lineage), Error> {
    let Some(first) = inputs.first() else {
        return Err(Error::Merge("no input blocks".into()));
    };
    let (tenant, signal) = (&first.meta().tenant, first.meta().signal);
    for b in inputs {
        let m = b.meta();
        if &m.tenant != tenant || m.signal != signal {
            return Err(Error::Merge(format!(
                "block {} is {}/{}, block {} is {}/{}",
                first.meta().block_id,
                tenant.as_str(),
                signal,
                m.block_id,
                m.tenant.as_str(),
                m.signal
            )));
        }
    }
    let mut lineage = Lineage::default();
    for b in inputs {
        lineage.extend(&b.lineage_or_identity()?);
    }
    let read = inputs
        .par_iter()
        .map(|b| read_tables(b, None))
        .collect::<Result<Vec<_>, _>>()?;
    let tables = match merge_on_arrow(signal, &read)? {
        Some(tables) => tables,
        None => merge_via_otlp(signal, &read)?,
    };
    if lineage.rows() != tables.rows as u64 {
        return Err(Error::Merge(format!(
            "the inputs hold {} rows, the merge {}",
            lineage.rows(),
            tables.rows
        )));
    }
    Ok((tables, lineage))
}

/// The merged tables of `inputs` (tables of one signal, in merge order)
/// by the OTLP path: every input's rows back as OTLP in row order,
/// appended to one builder. The reference the Arrow merge is tested
/// against, and the path for what it does not take.
pub fn merge_via_otlp(signal: Signal, inputs: &[TableSet]) -> Result<TableSet, Error> {
    match signal {
        Signal::Logs => merge_with::<LogsBuilder>(inputs, |t| Ok(logs_to_otlp_in_row_order(t)?)),
        Signal::Traces => merge_with::<SpansBuilder>(inputs, |t| Ok(spans_to_otlp_in_row_order(t)?)),
        Signal::Metrics => merge_with::<PointsBuilder>(inputs, |t| Ok(points_to_otlp_in_row_order(t)?)),
    }
}

/// The merged tables of `inputs` on Arrow (see [`concat`]), or `None` for
/// what it does not take (tables not in the builders' layout).
pub fn merge_on_arrow(signal: Signal, inputs: &[TableSet]) -> Result<Option<TableSet>, Error> {
    Ok(concat::concat(signal, inputs)?)
}

fn merge_with<B: SignalBuilder>(
    inputs: &[TableSet],
    to_otlp: impl Fn(&TableSet) -> Result<B::Request, Error>,
) -> Result<TableSet, Error> {
    let mut builder = B::default();
    for tables in inputs {
        builder.append(&to_otlp(tables)?)?;
    }
    Ok(builder.finish()?)
}

/// `inputs` merged into one block with id `id` at `level` (hot: IPC
/// tables; cold: Parquet tables, no hot block in between), with its
/// `lineage` section: the whole object, ready for one PUT.
pub fn merge_blocks_at(inputs: &[Block], id: BlockId, level: Level) -> Result<Bytes, Error> {
    let (tables, lineage) = merge(inputs)?;
    let tenant = inputs[0].meta().tenant.clone();
    let extra = [(LINEAGE_SECTION, SidecarSection::Batch(lineage.to_batch()?))];
    match level {
        Level::Hot => write_hot_with(&tables, id, tenant, &extra),
        Level::Cold => write_cold(&tables, id, tenant, &extra),
    }
}

/// `inputs` merged into one hot block with id `id`.
pub fn merge_blocks(inputs: &[Block], id: BlockId) -> Result<Bytes, Error> {
    merge_blocks_at(inputs, id, Level::Hot)
}

/// `inputs` merged into one cold block with id `id`.
pub fn merge_blocks_cold(inputs: &[Block], id: BlockId) -> Result<Bytes, Error> {
    merge_blocks_at(inputs, id, Level::Cold)
}
