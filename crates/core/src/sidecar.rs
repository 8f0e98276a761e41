//! Pruning sidecars: small summaries of a block, computed from its tables at
//! seal time and stored as sections of the block (DESIGN §4, §7), that answer
//! "can this block hold a match?" without reading any row section.
//!
//! This module owns what the sidecars hold, how they are built from a
//! [`TableSet`], their section encodings and the pruning decision:
//!
//! - [`ZoneMap`] (section `zone_map`, an Arrow batch): min/max of every
//!   numeric column of the root table, plus the span `duration`.
//! - [`AttrIndex`] (section `attr_index`, an Arrow batch): per scope
//!   (resource attributes, record attributes, indexed root fields such as the
//!   span name), the keys present and their string values while there are
//!   few of them.
//! - [`IdFilter`] (section `id_bloom`, raw bytes): split-block Bloom filters of
//!   the trace ids (spans and logs) and span ids (logs) a block holds.
//! - [`RowRanges`] (section `row_ranges`, raw bytes; blocks of more than
//!   [`RANGE_ROWS`] rows): per range of root rows, time and severity or
//!   duration bounds, the resources present and a Bloom filter of record
//!   attribute pairs, so scans skip ranges of large blocks.
//! - [`Sidecars::may_match`] applies a [`Probe`] and says which rule, if any,
//!   rules the block out, so a querier can count prunes per rule.
//!
//! Every check is conservative: "pruned" means no row of the block can
//! match; anything the sidecars do not know answers "may match". Decoding
//! never trusts its input: malformed sections give a [`SidecarError`], never a
//! panic or an allocation larger than the section.
//!
//! Writing sections into the block and reading them back belongs to
//! [`crate::block`]; deciding which probe a query implies belongs to the
//! querier.

mod attr_index;
mod error;
mod id_filter;
mod row_ranges;
mod zone_map;

#[cfg(test)]
mod tests;

use arrow::record_batch::RecordBatch;

pub use attr_index::{AttrIndex, AttrScope, KeyEntry, MAX_VALUE_LEN, MAX_VALUES_PER_FIELD, MAX_VALUES_PER_KEY, field};
pub use error::SidecarError;
pub use id_filter::{BITS_PER_ID, IdFilter, SplitBlockBloom, pair_hash, span_hash, trace_hash};
pub use row_ranges::{Aux, MAX_RESOURCE_SETS, RANGE_ROWS, RangeProbe, RangeSummary, RowRanges};
pub use zone_map::{DURATION, ZoneMap, ZoneRange};

use crate::convert::{TableSet, root_table};
use crate::ids::Signal;

/// Section name of the [`ZoneMap`].
pub const ZONE_MAP_SECTION: &str = "zone_map";
/// Section name of the [`AttrIndex`].
pub const ATTR_INDEX_SECTION: &str = "attr_index";
/// Section name of the [`IdFilter`].
pub const ID_BLOOM_SECTION: &str = "id_bloom";
/// Section name of the [`RowRanges`].
pub const ROW_RANGES_SECTION: &str = "row_ranges";

/// One sidecar as the block writer stores it.
#[derive(Debug, Clone)]
pub enum SidecarSection {
    /// Stored as an Arrow IPC section.
    Batch(RecordBatch),
    /// Stored as an opaque (`raw`) section.
    Bytes(Vec<u8>),
}

/// All sidecars of one block.
#[derive(Debug, Clone, PartialEq)]
pub struct Sidecars {
    pub zone: ZoneMap,
    pub attrs: AttrIndex,
    /// Trace and span id filters; `None` for metrics blocks, which hold no
    /// ids.
    pub ids: Option<IdFilter>,
    /// Per row range summaries; `None` for blocks of one range and for
    /// blocks written before the section existed.
    pub ranges: Option<RowRanges>,
}

impl Sidecars {
    /// Builds every sidecar of a block from its tables.
    pub fn build(tables: &TableSet) -> Result<Self, SidecarError> {
        let root = tables.get(root_table(tables.signal))?;
        // The four are independent: built side by side on the current
        // rayon pool.
        let ((zone, ids), (attrs, ranges)) = rayon::join(
            || {
                rayon::join(
                    || ZoneMap::build(root, tables.signal),
                    || match tables.signal {
                        Signal::Logs | Signal::Traces => IdFilter::build(tables).map(Some),
                        Signal::Metrics => Ok(None),
                    },
                )
            },
            || rayon::join(|| AttrIndex::build(tables), || RowRanges::build(tables)),
        );
        Ok(Sidecars {
            zone: zone?,
            attrs: attrs?,
            ids: ids?,
            ranges: ranges?,
        })
    }

    /// The sections to write, by name: `zone_map` and `attr_index` as Arrow
    /// batches, `id_bloom` (when there is one) as raw bytes.
    pub fn sections(&self) -> Result<Vec<(&'static str, SidecarSection)>, SidecarError> {
        let mut out = vec![
            (ZONE_MAP_SECTION, SidecarSection::Batch(self.zone.to_batch()?)),
            (ATTR_INDEX_SECTION, SidecarSection::Batch(self.attrs.to_batch()?)),
        ];
        if let Some(ids) = &self.ids {
            out.push((ID_BLOOM_SECTION, SidecarSection::Bytes(ids.to_bytes())));
        }
        if let Some(ranges) = &self.ranges {
            out.push((ROW_RANGES_SECTION, SidecarSection::Bytes(ranges.to_bytes())));
        }
        Ok(out)
    }

    /// Rebuilds the sidecars from their sections as read back from a block.
    pub fn from_sections(
        zone_map: &RecordBatch,
        attr_index: &RecordBatch,
        id_bloom: Option<&[u8]>,
        row_ranges: Option<&[u8]>,
    ) -> Result<Self, SidecarError> {
        Ok(Sidecars {
            zone: ZoneMap::from_batch(zone_map)?,
            attrs: AttrIndex::from_batch(attr_index)?,
            ids: id_bloom.map(IdFilter::from_bytes).transpose()?,
            ranges: row_ranges.map(RowRanges::from_bytes).transpose()?,
        })
    }

    /// Whether a block whose record times span `block_min_time..=block_max_time`
    /// (from its manifest) may hold a row matching every condition of
    /// `probe`. Rules are tried cheapest first; the first that rules the
    /// block out is reported.
    pub fn may_match(&self, probe: &Probe, block_min_time: u64, block_max_time: u64) -> Verdict {
        if let Some((lo, hi)) = probe.time
            && (lo > hi || block_max_time < lo || block_min_time > hi)
        {
            return Verdict::Pruned(PruneRule::Time);
        }
        if !self.zone_may_match(probe) {
            return Verdict::Pruned(PruneRule::ZoneMap);
        }
        if !self.attrs_may_match(probe) {
            return Verdict::Pruned(PruneRule::AttrIndex);
        }
        if let Some(ranges) = &self.ranges {
            let rp = RangeProbe::from_probe(probe);
            if (0..ranges.ranges.len()).all(|i| !ranges.may_match(i, &rp)) {
                // Every range ruled out: by an attribute pair, or by the
                // time or numeric bounds.
                let rule = if rp.attr_eq.is_empty() {
                    PruneRule::ZoneMap
                } else {
                    PruneRule::AttrIndex
                };
                return Verdict::Pruned(rule);
            }
        }
        if let (Some(id), Some(ids)) = (&probe.trace_id, &self.ids)
            && !ids.may_contain_trace(id)
        {
            return Verdict::Pruned(PruneRule::Bloom);
        }
        if let (Some(id), Some(ids)) = (&probe.span_id, &self.ids)
            && !ids.may_contain_span(id)
        {
            return Verdict::Pruned(PruneRule::Bloom);
        }
        Verdict::MayMatch
    }

    fn zone_may_match(&self, probe: &Probe) -> bool {
        if probe.min_duration.is_some() || probe.max_duration.is_some() {
            let lo = probe.min_duration.unwrap_or(0);
            let hi = probe.max_duration.unwrap_or(u64::MAX);
            if !self.zone.may_overlap(DURATION, i128::from(lo), i128::from(hi)) {
                return false;
            }
        }
        if let Some(min) = probe.min_severity
            && !self
                .zone
                .may_overlap("severity_number", i128::from(min), i128::from(i32::MAX))
        {
            return false;
        }
        true
    }

    fn attrs_may_match(&self, probe: &Probe) -> bool {
        let all = |scope: AttrScope, pairs: &[(String, String)]| {
            pairs.iter().all(|(k, v)| self.attrs.may_contain(scope, k, v))
        };
        all(AttrScope::Resource, &probe.resource_eq)
            && all(AttrScope::Record, &probe.attr_eq)
            && all(AttrScope::Field, &probe.field_eq)
    }
}

/// What a query asks of a block, as far as the sidecars can judge it. All
/// conditions must hold for one row (they are ANDed); an empty probe
/// matches every block.
///
/// Equality conditions mean "some row has this key with exactly this
/// value": a matcher that also matches rows *without* the key (LogQL
/// `label=""`) or a negative matcher must not be put here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probe {
    /// Record time range, inclusive at both ends, in unix nanoseconds. The
    /// record time is what a block's min/max time covers: the log time (or
    /// observed time when unset), the span start, the data point time.
    pub time: Option<(u64, u64)>,
    /// Resource attribute `key == value` conditions.
    pub resource_eq: Vec<(String, String)>,
    /// Record (log / span / data point) attribute `key == value` conditions.
    pub attr_eq: Vec<(String, String)>,
    /// Root-field conditions, keyed by the names in [`field`] (span name,
    /// severity text, metric name).
    pub field_eq: Vec<(String, String)>,
    /// A trace id the row must carry (spans, and logs for trace → logs).
    pub trace_id: Option<[u8; 16]>,
    /// A span id the row must carry (logs, for span → logs).
    pub span_id: Option<[u8; 8]>,
    /// Spans only: the shortest duration wanted, nanoseconds, inclusive.
    pub min_duration: Option<u64>,
    /// Spans only: the longest duration wanted, nanoseconds, inclusive.
    pub max_duration: Option<u64>,
    /// Logs only: the lowest severity number wanted, inclusive.
    pub min_severity: Option<i32>,
}

/// The sidecar rule that ruled a block out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PruneRule {
    /// The block's time range misses the probe's.
    Time,
    /// A column's min/max misses the probe's range.
    ZoneMap,
    /// A key or value the probe needs does not occur in the block.
    AttrIndex,
    /// The trace or span id is not in the block's Bloom filter.
    Bloom,
}

impl PruneRule {
    pub const ALL: [PruneRule; 4] = [
        PruneRule::Time,
        PruneRule::ZoneMap,
        PruneRule::AttrIndex,
        PruneRule::Bloom,
    ];

    /// A stable lowercase name, for metric labels and API counters.
    pub fn as_str(self) -> &'static str {
        match self {
            PruneRule::Time => "time",
            PruneRule::ZoneMap => "zone_map",
            PruneRule::AttrIndex => "attr_index",
            PruneRule::Bloom => "bloom",
        }
    }
}

/// The answer of [`Sidecars::may_match`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The block may hold a match: read it.
    MayMatch,
    /// No row of the block can match, by this rule.
    Pruned(PruneRule),
}

impl Verdict {
    pub fn is_pruned(self) -> bool {
        matches!(self, Verdict::Pruned(_))
    }
}
