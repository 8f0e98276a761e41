//! Row filters on a merge (compactor design §6.1 step 6, §8.4): what a
//! retention rewrite needs to merge blocks without the rows of some
//! resources. This module owns
//!
//! - what retention policies decide on, read from a block's tables: each
//!   `resources` row's attributes as text ([`resource_attributes`], for
//!   [`crate::policy::RuleSet::resolve`]) and each root row's resource
//!   ([`row_resources`]); with each root row's time
//!   ([`crate::scan::record_times`]) they make a keep mask
//!   ([`keep_unexpired`]);
//! - dropping root rows from a block's tables ([`filter_tables`]): the
//!   child tables (`*_attrs` of records, span events and links with their
//!   attributes, `point_dists`) keep only the rows of kept owners, in
//!   order, with `parent` re-based (a kept row's new index is the number
//!   of kept rows before it). Resources, scopes and series are left as
//!   they are.
//!
//! The filtered merge ([`super::merge_filtered`]) filters each input with
//! [`filter_tables`] and merges the results as usual: the merge numbers
//! resources, scopes and series by first use in the merged rows, so those
//! no kept row uses are not carried over.

use arrow::array::{ArrayRef, BooleanArray, UInt32Array};
use arrow::compute::filter_record_batch;
use arrow::record_batch::RecordBatch;
use std::sync::Arc;

use crate::attrs::{AttrReader, filter_by_parent};
use crate::convert::columns::col;
use crate::convert::{ConvertError, TableSet, TimeRange, root_table};
use crate::error::Error;
use crate::ids::Signal;
use crate::scan::record_times;
use crate::schema;
use crate::tables::is_attr_table;

/// Each row of the `resources` table as (key, value) pairs in attribute
/// order, values as text the way queries match them
/// ([`AttrReader::text`]: ints, doubles and bools as text; a value with no
/// text form, such as bytes or an array, as ""). A key given twice keeps
/// its last value, as query matchers read it. Needs the `resources` and
/// `resource_attrs` tables only.
pub fn resource_attributes(tables: &TableSet) -> Result<Vec<Vec<(String, String)>>, Error> {
    let resources = tables.get(schema::RESOURCES)?.num_rows();
    let r = AttrReader::new(tables.get(schema::RESOURCE_ATTRS)?, schema::RESOURCE_ATTRS)?;
    let mut out = vec![Vec::new(); resources];
    for (row, p) in r.parents().enumerate() {
        let attrs: &mut Vec<(String, String)> = out.get_mut(p as usize).ok_or(ConvertError::BadReference {
            table: schema::RESOURCE_ATTRS,
            row,
        })?;
        let (key, value) = (r.key(row), r.text(row).unwrap_or_default().into_owned());
        match attrs.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => attrs.push((key.to_owned(), value)),
        }
    }
    Ok(out)
}

/// For each root row, its row of the `resources` table: the root's
/// `resource_id` for logs and spans; for metrics, the `resource_id` of the
/// point's series. Needs the root and `resources` tables (and `series`
/// for metrics) only.
pub fn row_resources(tables: &TableSet) -> Result<Vec<u32>, Error> {
    let name = root_table(tables.signal);
    let root = tables.get(name)?;
    let resources = tables.get(schema::RESOURCES)?.num_rows();
    let in_range = |table: &'static str, row: usize, r: u32| {
        if (r as usize) < resources {
            Ok(r)
        } else {
            Err(ConvertError::BadReference { table, row })
        }
    };
    let out = match tables.signal {
        Signal::Logs | Signal::Traces => {
            let rid: &UInt32Array = col(root, name, "resource_id")?;
            rid.values()
                .iter()
                .enumerate()
                .map(|(row, &r)| in_range(name, row, r))
                .collect::<Result<Vec<_>, _>>()?
        }
        Signal::Metrics => {
            let series = tables.get(schema::SERIES)?;
            let rid: &UInt32Array = col(series, schema::SERIES, "resource_id")?;
            let of: &UInt32Array = col(root, name, "series")?;
            of.values()
                .iter()
                .enumerate()
                .map(|(row, &s)| {
                    let r = rid
                        .values()
                        .get(s as usize)
                        .ok_or(ConvertError::BadReference { table: name, row })?;
                    in_range(schema::SERIES, s as usize, *r)
                })
                .collect::<Result<Vec<_>, _>>()?
        }
    };
    Ok(out)
}

/// The keep mask of a retention rewrite: a root row is dropped when
/// `cutoff` gives its resource a cutoff and the row's time
/// ([`record_times`]) is before it (`Some(u64::MAX)`: every row of the
/// resource; `None`: none). `cutoff` is asked once per `resources` row,
/// with its attributes as [`resource_attributes`] reads them. Needs the
/// tables [`row_resources`] does.
pub fn keep_unexpired(
    tables: &TableSet,
    mut cutoff: impl FnMut(&[(String, String)]) -> Option<u64>,
) -> Result<Vec<bool>, Error> {
    let cutoffs: Vec<Option<u64>> = resource_attributes(tables)?.iter().map(|a| cutoff(a)).collect();
    let resource_of = row_resources(tables)?;
    if cutoffs.iter().all(Option::is_none) {
        return Ok(vec![true; resource_of.len()]);
    }
    let times = record_times(tables.signal, tables.get(root_table(tables.signal))?)?;
    Ok(resource_of
        .iter()
        .zip(&times)
        .map(|(&r, &t)| cutoffs[r as usize].is_none_or(|c| t >= c))
        .collect())
}

/// One row of a block's `resources` table and the records that have it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceSummary {
    /// As [`resource_attributes`] reads them.
    pub attrs: Vec<(String, String)>,
    pub rows: u64,
    /// Record times ([`record_times`]) of its rows; `u64::MAX` / 0 when it
    /// has none.
    pub min_time: u64,
    pub max_time: u64,
}

/// Each resource of `block` with its rows' count and time range, reading
/// only the root, `resources` and `resource_attrs` sections (and `series`
/// for metrics): what retention and offload policies decide on.
pub fn resource_summaries(block: &crate::block::Block) -> Result<Vec<ResourceSummary>, Error> {
    let signal = block.meta().signal;
    let names: &[&'static str] = match signal {
        Signal::Logs => &[schema::LOGS, schema::RESOURCES, schema::RESOURCE_ATTRS],
        Signal::Traces => &[schema::SPANS, schema::RESOURCES, schema::RESOURCE_ATTRS],
        Signal::Metrics => &[
            schema::POINTS,
            schema::SERIES,
            schema::RESOURCES,
            schema::RESOURCE_ATTRS,
        ],
    };
    let tables = crate::tables::read_tables(block, Some(names))?;
    let mut out: Vec<ResourceSummary> = resource_attributes(&tables)?
        .into_iter()
        .map(|attrs| ResourceSummary {
            attrs,
            rows: 0,
            min_time: u64::MAX,
            max_time: 0,
        })
        .collect();
    let times = record_times(signal, tables.get(root_table(signal))?)?;
    for (&r, &t) in row_resources(&tables)?.iter().zip(&times) {
        // row_resources checked every index against the resources table.
        if let Some(s) = out.get_mut(r as usize) {
            s.rows += 1;
            s.min_time = s.min_time.min(t);
            s.max_time = s.max_time.max(t);
        }
    }
    Ok(out)
}

/// The tables holding only the root rows `keep` flags (one flag per root
/// row), in their order; child tables follow their owners with `parent`
/// re-based, resources, scopes and series are left as they are (unused
/// ones included; a merge drops them), dictionaries keep their values (a
/// merge re-interns them). Rows and time range are those of the kept
/// rows.
pub fn filter_tables(tables: &TableSet, keep: &[bool]) -> Result<TableSet, Error> {
    let signal = tables.signal;
    let name = root_table(signal);
    let root = tables.get(name)?;
    if keep.len() != root.num_rows() {
        return Err(Error::Merge(format!(
            "{} keep flags for the {} rows of table {name}",
            keep.len(),
            root.num_rows()
        )));
    }
    if keep.iter().all(|&k| k) {
        return Ok(tables.clone());
    }
    let mut out = tables.clone();
    let root = filter_record_batch(root, &BooleanArray::from(keep.to_vec()))?;
    let mut times = TimeRange::default();
    for t in record_times(signal, &root)? {
        times.add(t);
    }
    let rows = root.num_rows();
    replace(&mut out, name, root);
    // The new row of each kept row, per table filtered so far.
    let mut renumbered: Vec<(&'static str, Vec<Option<u32>>)> = vec![(name, renumber(keep.iter().copied()))];
    for &(child, owner) in owned_tables(signal) {
        let batch = tables.get(child)?;
        let new_parent = renumbered
            .iter()
            .find(|(n, _)| *n == owner)
            .map(|(_, m)| m.as_slice())
            .ok_or(ConvertError::MissingTable(owner))?;
        let filtered = if is_attr_table(child) {
            filter_by_parent(batch, child, new_parent)?
        } else {
            let (filtered, kept) = filter_children(batch, child, new_parent)?;
            renumbered.push((child, kept));
            filtered
        };
        replace(&mut out, child, filtered);
    }
    let (min_time, max_time) = times.bounds();
    Ok(TableSet {
        rows,
        min_time,
        max_time,
        ..out
    })
}

/// The tables whose rows belong to a row of another table that a filter
/// drops, with that table, owners before what they own.
fn owned_tables(signal: Signal) -> &'static [(&'static str, &'static str)] {
    use schema::*;
    match signal {
        Signal::Logs => &[(LOG_ATTRS, LOGS)],
        Signal::Traces => &[
            (SPAN_ATTRS, SPANS),
            (SPAN_EVENTS, SPANS),
            (EVENT_ATTRS, SPAN_EVENTS),
            (SPAN_LINKS, SPANS),
            (LINK_ATTRS, SPAN_LINKS),
        ],
        Signal::Metrics => &[(POINT_DISTS, POINTS)],
    }
}

/// Each row's index among the kept rows before it, `None` when dropped.
fn renumber(keep: impl Iterator<Item = bool>) -> Vec<Option<u32>> {
    let mut next = 0u32;
    keep.map(|k| {
        k.then(|| {
            next += 1;
            next - 1
        })
    })
    .collect()
}

fn replace(tables: &mut TableSet, name: &'static str, batch: RecordBatch) {
    if let Some((_, b)) = tables.tables.iter_mut().find(|(n, _)| *n == name) {
        *b = batch;
    }
}

/// A child table with a plain `parent` column (`span_events`,
/// `span_links`, `point_dists`) with only the rows of kept owners
/// (`new_parent[p]` is owner row `p`'s new row, `None` when dropped),
/// re-parented; and its own rows renumbered, for what they own.
fn filter_children(
    batch: &RecordBatch,
    table: &'static str,
    new_parent: &[Option<u32>],
) -> Result<(RecordBatch, Vec<Option<u32>>), ConvertError> {
    let parent: &UInt32Array = col(batch, table, "parent")?;
    let mut keep = Vec::with_capacity(parent.len());
    let mut parents = Vec::new();
    for (row, p) in parent.iter().enumerate() {
        let to = p
            .and_then(|p| new_parent.get(p as usize))
            .ok_or(ConvertError::BadReference { table, row })?;
        keep.push(to.is_some());
        parents.extend(*to);
    }
    let filtered = filter_record_batch(batch, &BooleanArray::from(keep.clone()))?;
    let mut parents = Some(Arc::new(UInt32Array::from(parents)) as ArrayRef);
    let columns = filtered
        .schema()
        .fields()
        .iter()
        .zip(filtered.columns())
        .map(|(f, c)| match f.name().as_str() {
            "parent" => parents.take().unwrap_or_else(|| c.clone()),
            _ => c.clone(),
        })
        .collect();
    let filtered = RecordBatch::try_new(filtered.schema(), columns)?;
    Ok((filtered, renumber(keep.into_iter())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renumbering_counts_the_kept_rows_before() {
        let got = renumber([true, false, false, true, true, false].into_iter());
        assert_eq!(got, vec![Some(0), None, None, Some(1), Some(2), None]);
    }
}
