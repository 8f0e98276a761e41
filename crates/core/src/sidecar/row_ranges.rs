//! [`RowRanges`]: summaries of consecutive row ranges of a block's root
//! table (section `row_ranges`, raw bytes), so a query skips ranges of a
//! large (merged or cold) block instead of scanning all of it, and a
//! querier scans the ranges left in parallel.
//!
//! Per range of [`RANGE_ROWS`] root rows (the last may be shorter): the
//! record time min/max; a second numeric min/max (logs: severity number;
//! spans: duration; points: unused); the set of resource ids its rows
//! belong to (a bitset over the block's `resources` rows; for points, the
//! resources of their series); and a split-block Bloom filter of the
//! record attributes' `(key, value text)` pairs ([`pair_hash`]; for points,
//! their series' attributes). Resource matchers are evaluated once on the
//! small `resources` table and a range whose set holds no matching resource
//! is skipped; an attribute equality whose pair is not in a range's filter
//! skips the range.
//!
//! Only blocks of more than one range get the section: for a smaller block
//! the block-level sidecars say the same. Blocks without it (older ones)
//! read as before and are not pruned below the block.
//!
//! Section bytes (format version 1, integers little-endian):
//!
//! ```text
//! "MIRR" u8 version=1  u8 flags  u16 zero
//!   flags: bit 0 resource sets present; bit 1 aux is the severity number;
//!   bit 2 aux is the span duration (at most one of bits 1 and 2)
//! u32 range count  u32 resource count (bits per set; 0 without sets)
//! per range:  u32 first row  u32 rows  u64 min time  u64 max time
//!             i64 aux min  i64 aux max
//!             ceil(resource count / 64) × u64 set words (with sets)
//!             u32 Bloom block count  u64 items  block count × 8 × u32 words
//! ```
//!
//! Ranges are non-empty, contiguous and start at row 0. Every check is
//! conservative: a range holding a match is never skipped.

use rayon::prelude::*;
use std::collections::HashMap;
use std::ops::Range;

use arrow::array::{Int32Array, UInt32Array, UInt64Array};
use arrow::record_batch::RecordBatch;

use super::error::SidecarError;
use super::id_filter::{SplitBlockBloom, pair_hash};
use crate::attrs::AttrReader;
use crate::convert::columns::col;
use crate::convert::{ConvertError, TableSet, root_table};
use crate::ids::Signal;
use crate::schema;

/// Root rows per range: a scan morsel, and the row group size of cold
/// root tables.
pub const RANGE_ROWS: usize = 64 * 1024;
/// Most resources a block may have and still carry per-range resource sets
/// (a set is a bitset over all of them).
pub const MAX_RESOURCE_SETS: usize = 1 << 16;

const SECTION: &str = "row_ranges";
const MAGIC: [u8; 4] = *b"MIRR";
const VERSION: u8 = 1;
const FLAG_RESOURCES: u8 = 1;
const FLAG_SEVERITY: u8 = 2;
const FLAG_DURATION: u8 = 4;
const HEADER_LEN: usize = 16;
const RANGE_HEADER_LEN: usize = 40;

/// What one range holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSummary {
    /// First root row.
    pub start: u32,
    /// Root rows in the range (at least one).
    pub rows: u32,
    /// Record time bounds, inclusive.
    pub min_time: u64,
    pub max_time: u64,
    /// Logs: severity number bounds; spans: duration bounds (nanoseconds,
    /// capped at `i64::MAX`); points: 0.
    pub aux_min: i64,
    pub aux_max: i64,
    /// Bitset of the resource ids present (bit `r % 64` of word `r / 64`);
    /// empty when the block carries no resource sets.
    pub resources: Vec<u64>,
    /// Record attribute `(key, value)` pairs present.
    pub attrs: SplitBlockBloom,
}

impl RangeSummary {
    /// Root rows of the range.
    pub fn rows(&self) -> Range<usize> {
        self.start as usize..self.start as usize + self.rows as usize
    }
}

/// The row range summaries of one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowRanges {
    /// What `aux_min`/`aux_max` of every range hold.
    pub aux: Aux,
    /// Bits per resource set; `None` when the block has none (too many
    /// resources).
    pub resource_count: Option<u32>,
    pub ranges: Vec<RangeSummary>,
}

/// What the second numeric bounds of a range hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aux {
    None,
    /// Log severity number.
    Severity,
    /// Span duration, nanoseconds capped at `i64::MAX`.
    Duration,
}

/// What a scan asks of a range. All conditions must hold (AND); an empty
/// probe keeps every range.
#[derive(Debug, Clone, Default)]
pub struct RangeProbe {
    /// Record time range, inclusive at both ends (lo > hi keeps nothing).
    pub time: Option<(u64, u64)>,
    /// Logs: lowest severity number wanted.
    pub min_severity: Option<i32>,
    /// Spans: duration bounds, inclusive.
    pub min_duration: Option<u64>,
    pub max_duration: Option<u64>,
    /// Per resource id: whether the resource satisfies every resource
    /// matcher (evaluated exactly on the `resources` table). `None` keeps
    /// ranges whatever their resources.
    pub resources: Option<Vec<bool>>,
    /// [`pair_hash`]es of record attribute `key == value` conditions
    /// (non-empty values only: a matcher that also matches rows without the
    /// key must not be here).
    pub attr_eq: Vec<u64>,
}

impl RangeProbe {
    /// The part of a block [`super::Probe`] that ranges can check (no
    /// resource condition: that needs the `resources` table).
    pub fn from_probe(p: &super::Probe) -> Self {
        RangeProbe {
            time: p.time,
            min_severity: p.min_severity,
            min_duration: p.min_duration,
            max_duration: p.max_duration,
            resources: None,
            attr_eq: p.attr_eq.iter().map(|(k, v)| pair_hash(k, v)).collect(),
        }
    }
}

fn dur(d: u64) -> i64 {
    d.min(i64::MAX as u64) as i64
}

/// Attribute pairs hashed for the Bloom filters, each distinct pair once:
/// string values by their dictionary indices (without hashing their
/// text), other values by their text.
struct PairHasher<'a> {
    attrs: &'a AttrReader<'a>,
    by_index: HashMap<(usize, usize), u64, foldhash::fast::RandomState>,
    by_text: HashMap<(&'a str, std::borrow::Cow<'a, str>), u64, foldhash::fast::RandomState>,
}

impl<'a> PairHasher<'a> {
    fn new(attrs: &'a AttrReader<'a>) -> Self {
        PairHasher {
            attrs,
            by_index: HashMap::default(),
            by_text: HashMap::default(),
        }
    }

    fn hash(&mut self, row: usize) -> Option<u64> {
        let attrs = self.attrs;
        if let Some(pair) = attrs.str_pair_index(row) {
            return Some(
                *self
                    .by_index
                    .entry(pair)
                    .or_insert_with(|| pair_hash(attrs.key(row), attrs.str_value(row).unwrap_or(""))),
            );
        }
        let value = attrs.text(row)?;
        let key = attrs.key(row);
        Some(
            *self
                .by_text
                .entry((key, value))
                .or_insert_with_key(|(k, v)| pair_hash(k, v)),
        )
    }
}

impl RowRanges {
    /// The summaries of `tables` in ranges of [`RANGE_ROWS`] rows, or
    /// `None` when the root table fits in one range.
    pub fn build(tables: &TableSet) -> Result<Option<Self>, SidecarError> {
        let root = tables.get(root_table(tables.signal))?;
        if root.num_rows() <= RANGE_ROWS {
            return Ok(None);
        }
        Self::build_with(tables, RANGE_ROWS).map(Some)
    }

    /// The summaries of `tables` in ranges of `range_rows` rows (tests use
    /// small ranges).
    pub fn build_with(tables: &TableSet, range_rows: usize) -> Result<Self, SidecarError> {
        let signal = tables.signal;
        let root_name = root_table(signal);
        let root = tables.get(root_name)?;
        let n = root.num_rows();
        let range_rows = range_rows.max(1);
        let times = crate::scan::record_times(signal, root).map_err(|_| SidecarError::WrongType {
            table: root_name,
            column: "time_unix_nano",
        })?;
        let aux: Vec<i64> = match signal {
            Signal::Logs => {
                let sev: &Int32Array = col(root, root_name, "severity_number")?;
                sev.values().iter().map(|&s| i64::from(s)).collect()
            }
            Signal::Traces => {
                let start: &UInt64Array = col(root, root_name, "start_time_unix_nano")?;
                let end: &UInt64Array = col(root, root_name, "end_time_unix_nano")?;
                start
                    .values()
                    .iter()
                    .zip(end.values())
                    .map(|(&s, &e)| dur(e.saturating_sub(s)))
                    .collect()
            }
            Signal::Metrics => vec![0; n],
        };
        // The owner of each root row's resource and record attributes: the
        // row itself, or for points their series.
        let (owner_table, owner_name, of_row): (&RecordBatch, &'static str, Option<Vec<u32>>) = match signal {
            Signal::Metrics => {
                let series = tables.get(schema::SERIES)?;
                let s: &UInt32Array = col(root, root_name, "series")?;
                if let Some(row) = s.values().iter().position(|&s| s as usize >= series.num_rows()) {
                    return Err(ConvertError::BadReference { table: root_name, row }.into());
                }
                (series, schema::SERIES, Some(s.values().to_vec()))
            }
            _ => (root, root_name, None),
        };
        let owner = |row: usize| of_row.as_ref().map_or(row, |o| o[row] as usize);
        let rid: &UInt32Array = col(owner_table, owner_name, "resource_id")?;
        let resource_count = tables.get(schema::RESOURCES)?.num_rows();
        let with_sets = resource_count <= MAX_RESOURCE_SETS;
        if let Some(row) = rid.values().iter().position(|&r| r as usize >= resource_count) {
            return Err(ConvertError::BadReference { table: owner_name, row }.into());
        }
        let attr_name = match signal {
            Signal::Logs => schema::LOG_ATTRS,
            Signal::Traces => schema::SPAN_ATTRS,
            Signal::Metrics => schema::SERIES_ATTRS,
        };
        let attr_batch = tables.get(attr_name)?;
        let attrs = AttrReader::new(attr_batch, attr_name)?;
        // Points: each series' hashes once.
        let per_series: Option<Vec<Vec<u64>>> = match signal {
            Signal::Metrics => {
                let mut hasher = PairHasher::new(&attrs);
                let mut per = vec![Vec::new(); owner_table.num_rows()];
                for (row, p) in attrs.rows_of(0..u32::MAX) {
                    if let (Some(slot), Some(h)) = (per.get_mut(p as usize), hasher.hash(row)) {
                        slot.push(h);
                    }
                }
                Some(per)
            }
            _ => None,
        };
        let words = resource_count.div_ceil(64);
        // Ranges are independent: each is summarised as its own task.
        let starts: Vec<usize> = (0..n).step_by(range_rows).collect();
        let ranges: Vec<RangeSummary> = starts
            .into_par_iter()
            .map(|start| {
                let end = (start + range_rows).min(n);
                let (mut min_time, mut max_time) = (u64::MAX, 0u64);
                let (mut aux_min, mut aux_max) = (i64::MAX, i64::MIN);
                let mut set = if with_sets { vec![0u64; words] } else { Vec::new() };
                for row in start..end {
                    min_time = min_time.min(times[row]);
                    max_time = max_time.max(times[row]);
                    aux_min = aux_min.min(aux[row]);
                    aux_max = aux_max.max(aux[row]);
                    if with_sets {
                        let r = rid.value(owner(row)) as usize;
                        set[r / 64] |= 1 << (r % 64);
                    }
                }
                let mut hashes = Vec::new();
                match &per_series {
                    Some(per) => {
                        let mut seen = vec![false; per.len()];
                        for row in start..end {
                            let s = owner(row);
                            if !std::mem::replace(&mut seen[s], true) {
                                hashes.extend_from_slice(&per[s]);
                            }
                        }
                    }
                    None => {
                        let mut hasher = PairHasher::new(&attrs);
                        for (row, _) in attrs.rows_of(start as u32..end as u32) {
                            hashes.extend(hasher.hash(row));
                        }
                    }
                }
                RangeSummary {
                    start: start as u32,
                    rows: (end - start) as u32,
                    min_time,
                    max_time,
                    aux_min,
                    aux_max,
                    resources: set,
                    attrs: SplitBlockBloom::from_hashes(&mut hashes),
                }
            })
            .collect();
        Ok(RowRanges {
            aux: match signal {
                Signal::Logs => Aux::Severity,
                Signal::Traces => Aux::Duration,
                Signal::Metrics => Aux::None,
            },
            resource_count: with_sets.then_some(resource_count as u32),
            ranges,
        })
    }

    /// Root rows covered (the block's root row count).
    pub fn rows(&self) -> usize {
        self.ranges.last().map_or(0, |r| r.rows().end)
    }

    /// Whether range `i` may hold a row matching every condition of `p`.
    pub fn may_match(&self, i: usize, p: &RangeProbe) -> bool {
        let Some(r) = self.ranges.get(i) else {
            return true;
        };
        if let Some((lo, hi)) = p.time
            && (lo > hi || r.max_time < lo || r.min_time > hi)
        {
            return false;
        }
        if let (Some(min), Aux::Severity) = (p.min_severity, self.aux)
            && r.aux_max < i64::from(min)
        {
            return false;
        }
        if self.aux == Aux::Duration && (p.min_duration.is_some() || p.max_duration.is_some()) {
            let lo = dur(p.min_duration.unwrap_or(0));
            let hi = dur(p.max_duration.unwrap_or(u64::MAX));
            if r.aux_max < lo || r.aux_min > hi {
                return false;
            }
        }
        if let (Some(ok), Some(_)) = (&p.resources, self.resource_count) {
            let any = r.resources.iter().enumerate().any(|(w, &bits)| {
                let mut bits = bits;
                while bits != 0 {
                    let b = bits.trailing_zeros() as usize;
                    if ok.get(w * 64 + b).copied().unwrap_or(true) {
                        return true;
                    }
                    bits &= bits - 1;
                }
                false
            });
            if !any {
                return false;
            }
        }
        p.attr_eq.iter().all(|&h| r.attrs.contains_hash(h))
    }

    /// The row ranges that may hold a match of `p`, in row order.
    pub fn kept(&self, p: &RangeProbe) -> Vec<Range<usize>> {
        (0..self.ranges.len())
            .filter(|&i| self.may_match(i, p))
            .map(|i| self.ranges[i].rows())
            .collect()
    }

    /// The `row_ranges` section bytes (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        let aux = match self.aux {
            Aux::None => 0,
            Aux::Severity => FLAG_SEVERITY,
            Aux::Duration => FLAG_DURATION,
        };
        out.push(
            if self.resource_count.is_some() {
                FLAG_RESOURCES
            } else {
                0
            } | aux,
        );
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&(self.ranges.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.resource_count.unwrap_or(0).to_le_bytes());
        for r in &self.ranges {
            out.extend_from_slice(&r.start.to_le_bytes());
            out.extend_from_slice(&r.rows.to_le_bytes());
            out.extend_from_slice(&r.min_time.to_le_bytes());
            out.extend_from_slice(&r.max_time.to_le_bytes());
            out.extend_from_slice(&r.aux_min.to_le_bytes());
            out.extend_from_slice(&r.aux_max.to_le_bytes());
            for w in &r.resources {
                out.extend_from_slice(&w.to_le_bytes());
            }
            r.attrs.write(&mut out);
        }
        out
    }

    /// Parses `row_ranges` section bytes. Every length is checked against
    /// the input first, so hostile bytes give an error and allocate at most
    /// about the input's size.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SidecarError> {
        let bad = |row: usize, reason: &str| SidecarError::InvalidEntry {
            section: SECTION,
            row,
            reason: reason.to_owned(),
        };
        let h = bytes.get(..HEADER_LEN).ok_or(bad(0, "shorter than its header"))?;
        let u32_at = |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |b: &[u8], at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(a)
        };
        if h[..4] != MAGIC {
            return Err(bad(0, "does not start with the MIRR magic"));
        }
        if h[4] != VERSION {
            return Err(bad(0, &format!("format version {}, this build reads 1", h[4])));
        }
        if h[5] & !(FLAG_RESOURCES | FLAG_SEVERITY | FLAG_DURATION) != 0 || h[6..8] != [0, 0] {
            return Err(bad(0, "unknown flags or reserved bytes not zero"));
        }
        let aux = match h[5] & (FLAG_SEVERITY | FLAG_DURATION) {
            0 => Aux::None,
            FLAG_SEVERITY => Aux::Severity,
            FLAG_DURATION => Aux::Duration,
            _ => return Err(bad(0, "aux is both severity and duration")),
        };
        let count = u32_at(h, 8) as usize;
        let resource_count = u32_at(h, 12);
        let with_sets = h[5] & FLAG_RESOURCES != 0;
        if !with_sets && resource_count != 0 {
            return Err(bad(0, "a resource count without resource sets"));
        }
        let words = if with_sets {
            resource_count.div_ceil(64) as usize
        } else {
            0
        };
        // Each range takes at least its header, its set and a Bloom block.
        let min_range = RANGE_HEADER_LEN + words * 8 + 12 + 32;
        if count.saturating_mul(min_range) > bytes.len() {
            return Err(bad(0, "more ranges than the section can hold"));
        }
        let mut ranges = Vec::with_capacity(count);
        let mut at = HEADER_LEN;
        let mut next_row = 0u64;
        for i in 0..count {
            let b = bytes
                .get(at..at + RANGE_HEADER_LEN + words * 8)
                .ok_or(bad(i, "truncated"))?;
            let (start, rows) = (u32_at(b, 0), u32_at(b, 4));
            if u64::from(start) != next_row || rows == 0 {
                return Err(bad(i, "ranges must be non-empty, contiguous and start at row 0"));
            }
            next_row += u64::from(rows);
            let (min_time, max_time) = (u64_at(b, 8), u64_at(b, 16));
            let (aux_min, aux_max) = (u64_at(b, 24) as i64, u64_at(b, 32) as i64);
            if min_time > max_time || aux_min > aux_max {
                return Err(bad(i, "a minimum above its maximum"));
            }
            let resources = (0..words).map(|w| u64_at(b, RANGE_HEADER_LEN + 8 * w)).collect();
            at += RANGE_HEADER_LEN + words * 8;
            let (attrs, used) = SplitBlockBloom::read(&bytes[at..]).ok_or(bad(i, "truncated attribute filter"))?;
            at += used;
            ranges.push(RangeSummary {
                start,
                rows,
                min_time,
                max_time,
                aux_min,
                aux_max,
                resources,
                attrs,
            });
        }
        if at != bytes.len() {
            return Err(bad(count, "trailing bytes after the last range"));
        }
        Ok(RowRanges {
            aux,
            resource_count: with_sets.then_some(resource_count),
            ranges,
        })
    }
}
