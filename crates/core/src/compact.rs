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
//! A retention rewrite merges with a row filter ([`merge_filtered`],
//! [`merge_blocks_filtered`]; see [`filter`]): each input keeps only the
//! root rows the filter flags, children follow them, resources, scopes
//! and series no kept row uses are gone, and the lineage runs split
//! where rows were dropped, so every kept row still names its origin.
//!
//! The output's time range and row count are in its footer: parse it with
//! [`crate::block::Manifest::from_tail`] (or open the bytes as a
//! [`Block`]) instead of reading any section.

mod concat;
pub mod filter;

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
use crate::{BlockId, Error, Signal, TenantId};

/// The merged tables of `inputs`, which must share one tenant and signal.
pub fn merge_tables(inputs: &[Block]) -> Result<TableSet, Error> {
    Ok(merge(inputs)?.0)
}

/// The merged tables of `inputs` (which must share one tenant and signal)
/// and the origin of each of their rows.
pub fn merge(inputs: &[Block]) -> Result<(TableSet, Lineage), Error> {
    let m = merge_kept(inputs, None)?;
    // Without a filter every input is merged: there are tables.
    let tables = m.tables.ok_or_else(|| Error::Merge("no input tables".into()))?;
    Ok((tables, m.lineage))
}

/// Which root rows of each input a filtered merge keeps: called with the
/// input's position in `inputs` and its tables as read, it answers one
/// flag per root row (true keeps the row). Called for every input, from
/// several threads at once.
pub type RowFilter<'a> = dyn Fn(usize, &TableSet) -> Result<Vec<bool>, Error> + Sync + 'a;

/// A merge of the rows a filter kept.
#[derive(Debug, Clone)]
pub struct FilteredMerge {
    /// The merged tables; `None` when no row was kept.
    pub tables: Option<TableSet>,
    /// The origin of each kept row.
    pub lineage: Lineage,
    /// Root rows of the inputs.
    pub rows_in: u64,
    /// Root rows the filter dropped: `rows_in` less the merged rows.
    pub dropped_rows: u64,
}

/// The merged tables of the rows of `inputs` (which must share one tenant
/// and signal) that `keep` flags, in their order, and the origin of each.
/// Resources, scopes and series no kept row uses are not in the output.
pub fn merge_filtered(inputs: &[Block], keep: &RowFilter<'_>) -> Result<FilteredMerge, Error> {
    merge_kept(inputs, Some(keep))
}

fn merge_kept(inputs: &[Block], keep: Option<&RowFilter<'_>>) -> Result<FilteredMerge, Error> {
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
    // Each input read, filtered and its lineage cut alike, side by side.
    let read = inputs
        .par_iter()
        .enumerate()
        .map(|(i, b)| {
            let (tables, lineage) = (read_tables(b, None)?, b.lineage_or_identity()?);
            let rows = tables.rows as u64;
            if lineage.rows() != rows {
                return Err(Error::Merge(format!(
                    "block {} holds {rows} rows, its lineage covers {}",
                    b.meta().block_id,
                    lineage.rows()
                )));
            }
            let Some(keep) = keep else {
                return Ok((tables, lineage, rows));
            };
            let flags = keep(i, &tables)?;
            if flags.len() != tables.rows {
                return Err(Error::Merge(format!(
                    "the row filter gave {} flags for the {} rows of block {}",
                    flags.len(),
                    tables.rows,
                    b.meta().block_id
                )));
            }
            Ok((filter::filter_tables(&tables, &flags)?, lineage.filter(&flags), rows))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let rows_in = read.iter().map(|(_, _, rows)| rows).sum::<u64>();
    let mut lineage = Lineage::default();
    for (_, l, _) in &read {
        lineage.extend(l);
    }
    // A filtered input left without rows adds nothing to the merge.
    let read: Vec<TableSet> = read
        .into_iter()
        .map(|(t, _, _)| t)
        .filter(|t| keep.is_none() || t.rows > 0)
        .collect();
    let tables = if read.is_empty() {
        None
    } else {
        let tables = match merge_on_arrow(signal, &read)? {
            Some(tables) => tables,
            None => merge_via_otlp(signal, &read)?,
        };
        Some(tables)
    };
    // Each input's lineage covers its rows, and a filter only drops:
    // `rows_out <= rows_in` once this holds.
    let rows_out = tables.as_ref().map_or(0, |t| t.rows as u64);
    if lineage.rows() != rows_out {
        return Err(Error::Merge(format!(
            "the inputs keep {} rows, the merge holds {rows_out}",
            lineage.rows(),
        )));
    }
    Ok(FilteredMerge {
        tables,
        lineage,
        rows_in,
        dropped_rows: rows_in - rows_out,
    })
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
    write_merged(&tables, &lineage, id, inputs[0].meta().tenant.clone(), level)
}

/// What [`merge_blocks_filtered`] wrote.
#[derive(Debug, Clone)]
pub struct FilteredBlock {
    /// The whole object, ready for one PUT; `None` when no row was kept
    /// (nothing to write: the inputs are dropped whole).
    pub bytes: Option<Bytes>,
    /// Root rows of the inputs.
    pub rows_in: u64,
    /// Root rows of the output.
    pub rows_out: u64,
    /// Root rows the filter dropped (`rows_in - rows_out`).
    pub dropped_rows: u64,
}

/// The rows of `inputs` that `keep` flags (see [`merge_filtered`]) merged
/// into one block with id `id` at `level`, as [`merge_blocks_at`] writes
/// it: a retention rewrite.
pub fn merge_blocks_filtered(
    inputs: &[Block],
    id: BlockId,
    level: Level,
    keep: &RowFilter<'_>,
) -> Result<FilteredBlock, Error> {
    let m = merge_filtered(inputs, keep)?;
    let tenant = inputs[0].meta().tenant.clone();
    let bytes = m
        .tables
        .as_ref()
        .map(|tables| write_merged(tables, &m.lineage, id, tenant, level))
        .transpose()?;
    Ok(FilteredBlock {
        bytes,
        rows_in: m.rows_in,
        rows_out: m.rows_in - m.dropped_rows,
        dropped_rows: m.dropped_rows,
    })
}

/// Merged tables written as a block at `level`, sidecars built over them
/// and `lineage` added.
fn write_merged(
    tables: &TableSet,
    lineage: &Lineage,
    id: BlockId,
    tenant: TenantId,
    level: Level,
) -> Result<Bytes, Error> {
    let extra = [(LINEAGE_SECTION, SidecarSection::Batch(lineage.to_batch()?))];
    match level {
        Level::Hot => write_hot_with(tables, id, tenant, &extra),
        Level::Cold => write_cold(tables, id, tenant, &extra),
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
