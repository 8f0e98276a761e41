//! Clustering a block's rows by resource: the rows of one resource (and
//! within it one scope) made contiguous, keeping arrival order within
//! each, so the `row_ranges` sidecar ([`crate::sidecar::RowRanges`]) of a
//! merged or cold block lets a resource selector skip most of its ranges.
//! Arrival order interleaves services (every export carries records of
//! several), so without this nearly every range holds every resource.
//!
//! The rows go back through OTLP into a fresh builder, the same path as
//! [`crate::compact::merge_tables`], which groups records by resource and
//! scope in order of first appearance; the permutation returned says where
//! each row came from, so a lineage can follow rows across the rewrite.

use arrow::array::UInt32Array;

use crate::convert::columns::col;
use crate::convert::{
    Grouper, LogsBuilder, SignalBuilder, SpansBuilder, TableSet, logs_to_otlp, root_table, spans_to_otlp,
};
use crate::error::Error;
use crate::ids::Signal;

/// `tables` with root rows grouped by (resource, scope) in order of first
/// appearance, arrival order kept within a group, and the permutation:
/// row `i` of the result is row `perm[i]` of `tables`. Metrics blocks are
/// returned as they are (their points are already grouped by series),
/// with the identity permutation.
pub fn cluster_by_resource(tables: &TableSet) -> Result<(TableSet, Vec<u32>), Error> {
    let signal = tables.signal;
    let root_name = root_table(signal);
    let root = tables.get(root_name)?;
    if signal == Signal::Metrics {
        return Ok((tables.clone(), (0..root.num_rows() as u32).collect()));
    }
    let rid: &UInt32Array = col(root, root_name, "resource_id")?;
    let sid: &UInt32Array = col(root, root_name, "scope_id")?;
    // The grouping the OTLP conversion applies, over row numbers.
    let mut groups = Grouper::default();
    for row in 0..root.num_rows() {
        groups.push(rid.value(row), sid.value(row), row as u32);
    }
    let perm: Vec<u32> = groups
        .groups
        .into_iter()
        .flat_map(|(_, scopes)| scopes.into_iter().flat_map(|(_, rows)| rows))
        .collect();
    let clustered = match signal {
        Signal::Logs => {
            let mut b = LogsBuilder::default();
            b.append(&logs_to_otlp(tables)?)?;
            b.finish()?
        }
        _ => {
            let mut b = SpansBuilder::default();
            b.append(&spans_to_otlp(tables)?)?;
            b.finish()?
        }
    };
    Ok((clustered, perm))
}
