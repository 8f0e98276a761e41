//! Query evaluation over one block: a [`Predicate`] (time range, resource
//! and record attribute matchers, line filters, severity, trace id, span
//! name, duration) evaluated with Arrow kernels over the tables it needs,
//! returning the matching root rows, newest first with a limit when asked.
//!
//! Only the sections a predicate needs are read (the "split"): the root
//! table always; `resources`' attributes only for resource matchers; the
//! record attribute table only for record matchers. With a block as the
//! source, each section read is verified on first read.
//!
//! A scan can also run range by range ("morsels"): [`ScanInput`] loads the
//! tables once, [`ScanInput::prepare`] evaluates what is per block
//! (resource matchers on the `resources` table), [`PreparedScan::morsels`]
//! picks the row ranges the `row_ranges` sidecar cannot rule out, and
//! [`PreparedScan::scan_rows`] / [`PreparedScan::merge`] scan them
//! (concurrently, if the caller likes) and join the results into exactly
//! what [`scan`] returns for those rows.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::ops::Range;

use arrow::array::{Array, BooleanArray, FixedSizeBinaryArray, Int32Array, StringArray, UInt32Array, UInt64Array};
use arrow::buffer::BooleanBuffer;
use arrow::compute::kernels::comparison::contains;
use arrow::compute::{and, not, take_record_batch};
use arrow::record_batch::RecordBatch;
use regex::Regex;

use crate::attrs::AttrReader;
use crate::block::Block;
use crate::convert::columns::{DictStr, col};
use crate::convert::{ConvertError, TableSet, root_table};
use crate::error::Error;
use crate::ids::Signal;
use crate::schema;
pub use crate::sidecar::AttrScope;
use crate::sidecar::{Probe, RANGE_ROWS, RangeProbe, RowRanges, Verdict, field as sidecar_field};

/// Longest regex source accepted; the engine is linear-time, this bounds
/// compile cost and memory.
pub const MAX_REGEX_LEN: usize = 4096;
/// Compiled-program size limit for one regex.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Bad predicates (the caller's fault).
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("regex {pattern:?} is invalid: {reason}")]
    BadRegex { pattern: String, reason: String },
    #[error("time range start {start} is after its end {end}")]
    ReversedTimeRange { start: u64, end: u64 },
    #[error("{what} does not apply to {signal} blocks")]
    NotApplicable { what: &'static str, signal: Signal },
}

/// How many compiled regexes [`compile_regex`] keeps: dashboards send the
/// same queries again and again, and compiling costs more than a small
/// scan.
const REGEX_CACHE: usize = 256;

/// Compiles a user regex with the linear-time engine and bounded size.
/// Anchored at both ends, as Prometheus and Loki label matchers are.
/// Recently compiled patterns are reused.
pub fn compile_regex(pattern: &str, anchored: bool) -> Result<Regex, ScanError> {
    type Cache = std::sync::Mutex<HashMap<(String, bool), Regex>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (pattern.to_owned(), anchored);
    if let Some(re) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(re.clone());
    }
    let re = compile_regex_uncached(pattern, anchored)?;
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if c.len() >= REGEX_CACHE {
        c.clear();
    }
    c.insert(key, re.clone());
    Ok(re)
}

fn compile_regex_uncached(pattern: &str, anchored: bool) -> Result<Regex, ScanError> {
    let bad = |reason: String| ScanError::BadRegex {
        pattern: pattern.chars().take(200).collect(),
        reason,
    };
    if pattern.len() > MAX_REGEX_LEN {
        return Err(bad(format!("longer than {MAX_REGEX_LEN} bytes")));
    }
    let build = |source: &str| {
        regex::RegexBuilder::new(source)
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| bad(e.to_string()))
    };
    // Compiled alone first: a pattern such as `a)|(b` must be refused, not
    // close our group and escape the anchors.
    let plain = build(pattern)?;
    if anchored {
        build(&format!("^(?:{pattern})$"))
    } else {
        Ok(plain)
    }
}

/// How an attribute's value is compared.
#[derive(Debug, Clone)]
pub enum MatchOp {
    Eq(String),
    Ne(String),
    Re(Regex),
    NotRe(Regex),
}

impl MatchOp {
    /// Whether a present value matches.
    pub fn matches(&self, v: &str) -> bool {
        self.test(Some(v))
    }

    fn test(&self, v: Option<&str>) -> bool {
        match self {
            MatchOp::Eq(want) => v == Some(want.as_str()),
            MatchOp::Ne(want) => v != Some(want.as_str()),
            MatchOp::Re(re) => re.is_match(v.unwrap_or("")),
            MatchOp::NotRe(re) => !re.is_match(v.unwrap_or("")),
        }
    }
}

/// `key op value` on resource attributes, record attributes, or (scope
/// `Field`) a root dictionary column named by [`sidecar_field`] (severity
/// text, span name, metric name). A missing attribute reads as the empty
/// string, as a missing label does in Prometheus and Loki (so `k != "x"`
/// and `k =~ ".*"` match rows without `k`).
#[derive(Debug, Clone)]
pub struct AttrMatcher {
    pub scope: AttrScope,
    pub key: String,
    pub op: MatchOp,
}

/// A filter on the log body (string bodies; other bodies read as empty).
#[derive(Debug, Clone)]
pub enum LineFilter {
    Contains(String),
    NotContains(String),
    Regex(Regex),
    NotRegex(Regex),
}

/// What rows to select. All parts must hold (AND).
#[derive(Debug, Clone, Default)]
pub struct Predicate {
    /// `[start, end)` in Unix nanoseconds, on the record's time (logs: event
    /// time, or observed time when unset; spans: start; points: time).
    pub time: Option<(u64, u64)>,
    pub attrs: Vec<AttrMatcher>,
    pub lines: Vec<LineFilter>,
    /// Logs: `severity_number >= n`.
    pub min_severity: Option<i32>,
    /// Logs and spans.
    pub trace_id: Option<[u8; 16]>,
    /// Spans: name matcher.
    pub span_name: Option<MatchOp>,
    /// Spans: `end - start` bounds in nanoseconds, inclusive.
    pub min_duration: Option<u64>,
    pub max_duration: Option<u64>,
    /// Points: metric name equality.
    pub metric_name: Option<String>,
}

/// Result order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Latest time first; ties go to the later-arriving row.
    #[default]
    NewestFirst,
    OldestFirst,
    /// Arrival order.
    Stored,
}

#[derive(Debug, Clone, Default)]
pub struct ScanRequest {
    pub predicate: Predicate,
    pub order: Order,
    pub limit: Option<usize>,
}

/// Matching rows of the root table.
#[derive(Debug, Clone)]
pub struct ScanOutput {
    /// Row numbers in the root table, in the requested order.
    pub rows: Vec<u32>,
    /// The root table's columns for those rows.
    pub batch: RecordBatch,
    /// The record time of each returned row.
    pub times: Vec<u64>,
    /// Root rows examined.
    pub rows_scanned: usize,
}

/// Something that hands out a block's tables by name.
pub trait TableSource {
    fn signal(&self) -> Signal;
    fn table(&self, name: &'static str) -> Result<RecordBatch, Error>;
}

impl TableSource for TableSet {
    fn signal(&self) -> Signal {
        self.signal
    }

    fn table(&self, name: &'static str) -> Result<RecordBatch, Error> {
        Ok(self.get(name)?.clone())
    }
}

impl TableSource for Block {
    fn signal(&self) -> Signal {
        self.manifest().meta().signal
    }

    fn table(&self, name: &'static str) -> Result<RecordBatch, Error> {
        crate::tables::read_table(self, name)
    }
}

fn u64_col<'a>(b: &'a RecordBatch, table: &'static str, column: &'static str) -> Result<&'a UInt64Array, Error> {
    Ok(col(b, table, column)?)
}

/// Each row's record time.
pub fn record_times(signal: Signal, root: &RecordBatch) -> Result<Vec<u64>, Error> {
    let t = root_table(signal);
    Ok(match signal {
        Signal::Logs => {
            let time = u64_col(root, t, "time_unix_nano")?.values();
            let observed = u64_col(root, t, "observed_time_unix_nano")?.values();
            time.iter()
                .zip(observed.iter())
                .map(|(&t, &o)| crate::convert::logs::effective_time(t, o))
                .collect()
        }
        Signal::Traces => u64_col(root, t, "start_time_unix_nano")?.values().to_vec(),
        Signal::Metrics => u64_col(root, t, "time_unix_nano")?.values().to_vec(),
    })
}

fn record_attr_table(signal: Signal) -> &'static str {
    match signal {
        Signal::Logs => schema::LOG_ATTRS,
        Signal::Traces => schema::SPAN_ATTRS,
        Signal::Metrics => schema::SERIES_ATTRS,
    }
}

/// Where a row's names, resource and attributes live: the root row itself,
/// or, for metrics, the row's series.
struct Owners {
    table: RecordBatch,
    name: &'static str,
    /// For metrics, the series row of each point.
    of_row: Option<Vec<usize>>,
}

impl Owners {
    /// The owners of the rows of `root` (a whole root table or a slice of
    /// one); `series` is the block's series table for metrics.
    fn of(signal: Signal, root: &RecordBatch, series: Option<&RecordBatch>) -> Result<Self, Error> {
        let Some(table) = series.filter(|_| signal == Signal::Metrics) else {
            return Ok(Owners {
                table: root.clone(),
                name: root_table(signal),
                of_row: None,
            });
        };
        let s: &UInt32Array = col(root, schema::POINTS, "series")?;
        if let Some(row) = s.values().iter().position(|&s| s as usize >= table.num_rows()) {
            return Err(ConvertError::BadReference {
                table: schema::POINTS,
                row,
            }
            .into());
        }
        Ok(Owners {
            table: table.clone(),
            name: schema::SERIES,
            of_row: Some(s.values().iter().map(|&s| s as usize).collect()),
        })
    }

    /// A per-owner verdict as a per-row mask.
    fn expand(&self, per_owner: &[bool]) -> BooleanArray {
        match &self.of_row {
            None => mask_from(per_owner.iter().copied()),
            Some(map) => mask_from(map.iter().map(|&o| per_owner[o])),
        }
    }

    /// Per owner: does the dictionary column `column` satisfy `test`?
    fn dict_test(&self, column: &'static str, test: impl Fn(&str) -> bool) -> Result<BooleanArray, Error> {
        let values = DictStr::new(&self.table, self.name, column)?;
        let per_key: Vec<bool> = (0..values.values().len())
            .map(|k| test(values.values().value(k)))
            .collect();
        Ok(self.expand(&values.map_values(&per_key)))
    }
}

/// For each parent `parents.start..parents.end`, whether the matcher holds
/// (a value read with [`AttrReader::text`], absent as "").
fn attr_mask(r: &AttrReader<'_>, parents: Range<usize>, m: &AttrMatcher) -> Vec<bool> {
    let mut found: Vec<Option<std::borrow::Cow<'_, str>>> = vec![None; parents.len()];
    for (row, p) in r.rows_of(parents.start as u32..parents.end as u32) {
        if r.key(row) == m.key {
            found[p as usize - parents.start] = Some(r.text(row).unwrap_or_default());
        }
    }
    found
        .iter()
        .map(|v| m.op.test(Some(v.as_deref().unwrap_or(""))))
        .collect()
}

/// Per owner, whether all `matchers` hold; `None` without matchers.
fn all_matchers(r: &AttrReader<'_>, parents: Range<usize>, matchers: &[&AttrMatcher]) -> Option<Vec<bool>> {
    matchers
        .iter()
        .map(|m| attr_mask(r, parents.clone(), m))
        .reduce(|a, b| a.iter().zip(&b).map(|(&x, &y)| x && y).collect())
}

fn mask_from(v: impl IntoIterator<Item = bool>) -> BooleanArray {
    BooleanArray::new(BooleanBuffer::from_iter(v), None)
}

fn and_mask(acc: &mut Option<BooleanArray>, m: BooleanArray) -> Result<(), Error> {
    *acc = Some(match acc.take() {
        Some(a) => and(&a, &m)?,
        None => m,
    });
    Ok(())
}

/// The tables [`scan`] reads for predicate `p` over a `signal` block, so a
/// remote reader can fetch exactly those sections up front.
pub fn tables_needed(signal: Signal, p: &Predicate) -> Vec<&'static str> {
    let mut out = vec![root_table(signal)];
    let needs_owners = p.metric_name.is_some() || !p.attrs.is_empty();
    if needs_owners && signal == Signal::Metrics {
        out.push(schema::SERIES);
    }
    if p.attrs.iter().any(|m| m.scope == AttrScope::Resource) {
        out.extend([schema::RESOURCES, schema::RESOURCE_ATTRS]);
    }
    if p.attrs.iter().any(|m| m.scope == AttrScope::Record) {
        out.push(record_attr_table(signal));
    }
    out
}

/// Evaluates a scan over one block's tables: every row, as one range.
pub fn scan(src: &dyn TableSource, req: &ScanRequest) -> Result<ScanOutput, Error> {
    let input = ScanInput::load(src, &req.predicate)?;
    let prepared = input.prepare(req)?;
    prepared.scan_rows(0..prepared.rows())
}

/// The tables one scan of a block reads (see [`tables_needed`]), loaded
/// once; [`ScanInput::prepare`] then evaluates what is per block, and
/// [`PreparedScan::scan_rows`] any row range, so the ranges of a large
/// block can be scanned in parallel.
#[derive(Debug)]
pub struct ScanInput {
    signal: Signal,
    root: RecordBatch,
    /// Metrics: the series table, when the predicate needs owners.
    series: Option<RecordBatch>,
    /// `resources` and `resource_attrs`, for resource matchers.
    resources: Option<(RecordBatch, RecordBatch)>,
    /// The record attribute table, for record matchers.
    record_attrs: Option<RecordBatch>,
}

impl ScanInput {
    /// Checks that `p` applies to the source's signal and loads the tables
    /// it needs.
    pub fn load(src: &dyn TableSource, p: &Predicate) -> Result<Self, Error> {
        let signal = src.signal();
        if let Some((start, end)) = p.time
            && start > end
        {
            return Err(ScanError::ReversedTimeRange { start, end }.into());
        }
        let na = |what| -> Error { ScanError::NotApplicable { what, signal }.into() };
        if (!p.lines.is_empty() || p.min_severity.is_some()) && signal != Signal::Logs {
            return Err(na("a log line or severity filter"));
        }
        if (p.span_name.is_some() || p.min_duration.is_some() || p.max_duration.is_some()) && signal != Signal::Traces {
            return Err(na("a span name or duration filter"));
        }
        if p.metric_name.is_some() && signal != Signal::Metrics {
            return Err(na("a metric name filter"));
        }
        if p.trace_id.is_some() && signal == Signal::Metrics {
            return Err(na("a trace id filter"));
        }
        for m in p.attrs.iter().filter(|m| m.scope == AttrScope::Field) {
            match (signal, m.key.as_str()) {
                (Signal::Logs, sidecar_field::SEVERITY_TEXT)
                | (Signal::Traces, sidecar_field::SPAN_NAME)
                | (Signal::Metrics, sidecar_field::METRIC_NAME) => {}
                _ => return Err(na("this field matcher")),
            }
        }
        let needs_owners = p.metric_name.is_some() || !p.attrs.is_empty();
        let has = |scope| p.attrs.iter().any(|m| m.scope == scope);
        Ok(ScanInput {
            signal,
            root: src.table(root_table(signal))?,
            series: if needs_owners && signal == Signal::Metrics {
                Some(src.table(schema::SERIES)?)
            } else {
                None
            },
            resources: if has(AttrScope::Resource) {
                Some((src.table(schema::RESOURCES)?, src.table(schema::RESOURCE_ATTRS)?))
            } else {
                None
            },
            record_attrs: if has(AttrScope::Record) {
                Some(src.table(record_attr_table(signal))?)
            } else {
                None
            },
        })
    }

    /// Evaluates what does not depend on the rows scanned: resource
    /// matchers on the `resources` table, and (metrics) record matchers on
    /// the series.
    pub fn prepare<'a>(&'a self, req: &'a ScanRequest) -> Result<PreparedScan<'a>, Error> {
        let p = &req.predicate;
        let of_scope = |scope| p.attrs.iter().filter(|m| m.scope == scope).collect::<Vec<_>>();
        let resource_ok = match &self.resources {
            Some((resources, rattrs)) => {
                let reader = AttrReader::new(rattrs, schema::RESOURCE_ATTRS)?;
                all_matchers(&reader, 0..resources.num_rows(), &of_scope(AttrScope::Resource))
            }
            None => None,
        };
        let record = of_scope(AttrScope::Record);
        let (attrs, series_ok) = match (&self.record_attrs, &self.series) {
            (Some(batch), Some(series)) => {
                let reader = AttrReader::new(batch, record_attr_table(self.signal))?;
                (None, all_matchers(&reader, 0..series.num_rows(), &record))
            }
            (Some(batch), None) => (Some(AttrReader::new(batch, record_attr_table(self.signal))?), None),
            (None, _) => (None, None),
        };
        Ok(PreparedScan {
            input: self,
            req,
            resource_ok,
            attrs,
            record,
            series_ok,
        })
    }
}

/// A scan ready to run over any row range of its block (see [`ScanInput`]).
/// Ranges may be scanned concurrently; [`PreparedScan::merge`] joins their
/// outputs into what one scan of all of them gives.
#[derive(Debug)]
pub struct PreparedScan<'a> {
    input: &'a ScanInput,
    req: &'a ScanRequest,
    /// Per resource, whether every resource matcher holds.
    resource_ok: Option<Vec<bool>>,
    /// Record attributes (logs, spans), read range by range.
    attrs: Option<AttrReader<'a>>,
    record: Vec<&'a AttrMatcher>,
    /// Metrics: per series, whether every record matcher holds.
    series_ok: Option<Vec<bool>>,
}

impl PreparedScan<'_> {
    /// Root rows of the block.
    pub fn rows(&self) -> usize {
        self.input.root.num_rows()
    }

    /// What the row range sidecar can check of this scan: its time range,
    /// severity, durations, positive record attribute equalities, and which
    /// resources pass the resource matchers.
    pub fn range_probe(&self) -> RangeProbe {
        let block = probe(&self.req.predicate);
        RangeProbe {
            resources: self.resource_ok.clone(),
            ..RangeProbe::from_probe(&block)
        }
    }

    /// The row ranges to scan: the ranges of `ranges` (the block's
    /// `row_ranges` sidecar) that may hold a match, or without it every row
    /// in ranges of [`RANGE_ROWS`]. A sidecar that does not cover the
    /// block's rows is not trusted.
    pub fn morsels(&self, ranges: Option<&RowRanges>) -> Vec<Range<usize>> {
        let n = self.rows();
        match ranges {
            Some(r) if r.rows() == n => r.kept(&self.range_probe()),
            _ => (0..n).step_by(RANGE_ROWS).map(|s| s..(s + RANGE_ROWS).min(n)).collect(),
        }
    }

    /// Scans the ranges that may match and merges them, handing `run` (the
    /// caller's parallel map) up to `wave` ranges at a time. A request
    /// ordered by time with a limit takes the ranges newest (or oldest)
    /// first by their time bounds and stops once no range left can hold a
    /// row that would make the cut: the newest 100 lines of a merged block
    /// read its last ranges only. The answer equals scanning every range.
    pub fn scan_in_waves(
        &self,
        ranges: Option<&RowRanges>,
        wave: usize,
        run: impl Fn(&[Range<usize>]) -> Result<Vec<ScanOutput>, Error>,
    ) -> Result<ScanOutput, Error> {
        let morsels = self.morsels(ranges);
        let (Some(limit), Some(ranges)) = (self.req.limit, ranges) else {
            return self.merge(run(&morsels)?);
        };
        if self.req.order == Order::Stored || ranges.rows() != self.rows() {
            return self.merge(run(&morsels)?);
        }
        let bounds: HashMap<usize, (u64, u64)> = ranges
            .ranges
            .iter()
            .map(|r| (r.start as usize, (r.min_time, r.max_time)))
            .collect();
        let mut ordered: Vec<(Range<usize>, (u64, u64))> = morsels
            .into_iter()
            .map(|m| {
                let b = bounds.get(&m.start).copied().unwrap_or((0, u64::MAX));
                (m, b)
            })
            .collect();
        let newest = self.req.order == Order::NewestFirst;
        if newest {
            ordered.sort_by_key(|(_, (_, max))| Reverse(*max));
        } else {
            ordered.sort_by_key(|(_, (min, _))| *min);
        }
        let mut parts = Vec::new();
        let mut times: Vec<u64> = Vec::new();
        let mut next = 0;
        while next < ordered.len() {
            if times.len() >= limit {
                // The time of the limit-th best row so far: a range whose
                // bounds lie strictly beyond it cannot make the cut (equal
                // times may, by their tie-break).
                let cut = if newest {
                    *times.select_nth_unstable_by_key(limit - 1, |&t| Reverse(t)).1
                } else {
                    *times.select_nth_unstable(limit - 1).1
                };
                let (min, max) = ordered[next].1;
                if (newest && max < cut) || (!newest && min > cut) {
                    break;
                }
            }
            let end = (next + wave.max(1)).min(ordered.len());
            let batch: Vec<Range<usize>> = ordered[next..end].iter().map(|(m, _)| m.clone()).collect();
            for part in run(&batch)? {
                times.extend_from_slice(&part.times);
                parts.push(part);
            }
            next = end;
        }
        self.merge(parts)
    }

    /// Scans root rows `rows` (clamped to the block). Row numbers in the
    /// output are the block's.
    pub fn scan_rows(&self, rows: Range<usize>) -> Result<ScanOutput, Error> {
        let signal = self.input.signal;
        let p = &self.req.predicate;
        let first = rows.start.min(self.rows());
        let root = self
            .input
            .root
            .slice(first, rows.end.min(self.rows()).saturating_sub(first));
        let root_name = root_table(signal);
        let n = root.num_rows();
        let times = record_times(signal, &root)?;
        let mut mask: Option<BooleanArray> = None;

        if let Some((start, end)) = p.time {
            and_mask(&mut mask, mask_from(times.iter().map(|&t| t >= start && t < end)))?;
        }
        if let Some(min) = p.min_severity {
            let sev: &Int32Array = col(&root, root_name, "severity_number")?;
            and_mask(&mut mask, mask_from(sev.values().iter().map(|&s| s >= min)))?;
        }
        if let Some(id) = p.trace_id {
            let ids: &FixedSizeBinaryArray = col(&root, root_name, "trace_id")?;
            and_mask(
                &mut mask,
                mask_from((0..n).map(|i| ids.is_valid(i) && ids.value(i) == id)),
            )?;
        }
        if let Some(op) = &p.span_name {
            let names = DictStr::new(&root, root_name, "name")?;
            let per_key: Vec<bool> = (0..names.values().len())
                .map(|k| op.test(Some(names.values().value(k))))
                .collect();
            and_mask(&mut mask, mask_from(names.map_values(&per_key)))?;
        }
        if p.min_duration.is_some() || p.max_duration.is_some() {
            let start = u64_col(&root, root_name, "start_time_unix_nano")?.values();
            let end = u64_col(&root, root_name, "end_time_unix_nano")?.values();
            let (lo, hi) = (p.min_duration.unwrap_or(0), p.max_duration.unwrap_or(u64::MAX));
            and_mask(
                &mut mask,
                mask_from(start.iter().zip(end.iter()).map(|(&s, &e)| {
                    let d = e.saturating_sub(s);
                    d >= lo && d <= hi
                })),
            )?;
        }
        let needs_owners = p.metric_name.is_some() || !p.attrs.is_empty();
        if needs_owners {
            let o = Owners::of(signal, &root, self.input.series.as_ref())?;
            if let Some(name) = &p.metric_name {
                and_mask(&mut mask, o.dict_test("metric_name", |v| v == name)?)?;
            }
            for m in p.attrs.iter().filter(|m| m.scope == AttrScope::Field) {
                // ScanInput::load checked the key against the signal.
                let column = match m.key.as_str() {
                    sidecar_field::SEVERITY_TEXT => sidecar_field::SEVERITY_TEXT,
                    sidecar_field::SPAN_NAME => sidecar_field::SPAN_NAME,
                    _ => sidecar_field::METRIC_NAME,
                };
                and_mask(&mut mask, o.dict_test(column, |v| m.op.test(Some(v)))?)?;
            }
            if let Some(ok) = &self.resource_ok {
                let rid: &UInt32Array = col(&o.table, o.name, "resource_id")?;
                if let Some(row) = rid.values().iter().position(|&r| r as usize >= ok.len()) {
                    return Err(ConvertError::BadReference { table: o.name, row }.into());
                }
                let per_owner: Vec<bool> = rid.values().iter().map(|&r| ok[r as usize]).collect();
                and_mask(&mut mask, o.expand(&per_owner))?;
            }
            if let Some(ok) = &self.series_ok {
                and_mask(&mut mask, o.expand(ok))?;
            }
            if let (Some(reader), false) = (&self.attrs, self.record.is_empty()) {
                let parents = first..first + n;
                if let Some(ok) = all_matchers(reader, parents, &self.record) {
                    and_mask(&mut mask, o.expand(&ok))?;
                }
            }
        }

        // Line filters last: they read every body byte, so when the other
        // parts of the predicate (a resource selector, a severity) leave
        // few rows, only those rows' bodies are tested.
        let selected: Vec<u32> = if p.lines.is_empty() {
            selected_rows(mask.as_ref(), n)
        } else {
            let body: &StringArray = col(&root, root_name, "body")?;
            let survivors = mask.as_ref().map_or(n, |m| m.true_count());
            if survivors.saturating_mul(SPARSE_LINE_TEST) < n {
                let tests: Vec<LineTest<'_>> = p.lines.iter().map(LineTest::new).collect();
                let mut rows = selected_rows(mask.as_ref(), n);
                rows.retain(|&i| tests.iter().all(|t| t.test(body, i as usize)));
                rows
            } else {
                for f in &p.lines {
                    let m = match f {
                        LineFilter::Contains(s) => contains(body, &StringArray::new_scalar(s))?,
                        LineFilter::NotContains(s) => not(&contains(body, &StringArray::new_scalar(s))?)?,
                        LineFilter::Regex(re) => mask_from((0..n).map(|i| re.is_match(body_text(body, i)))),
                        LineFilter::NotRegex(re) => mask_from((0..n).map(|i| !re.is_match(body_text(body, i)))),
                    };
                    // A null body (non-string) reads as "" for every filter.
                    let m = mask_from((0..n).map(|i| if body.is_null(i) { f.test_empty() } else { m.value(i) }));
                    and_mask(&mut mask, m)?;
                }
                selected_rows(mask.as_ref(), n)
            }
        };
        let local = order_and_limit(selected, &times, self.req.order, self.req.limit);
        let batch = take_record_batch(&root, &UInt32Array::from(local.clone()))?;
        let out_times = local.iter().map(|&r| times[r as usize]).collect();
        Ok(ScanOutput {
            rows: local.iter().map(|&r| r + first as u32).collect(),
            batch,
            times: out_times,
            rows_scanned: n,
        })
    }

    /// The outputs of scans of disjoint row ranges joined into what one
    /// scan over all of them returns: the request's order and limit over
    /// the union (ties broken by row, as in one scan), rows scanned summed.
    pub fn merge(&self, mut parts: Vec<ScanOutput>) -> Result<ScanOutput, Error> {
        if parts.len() == 1
            && let Some(only) = parts.pop()
        {
            return Ok(only);
        }
        // (time, row, index into the concatenated batches)
        let mut all: Vec<(u64, u32, u32)> = Vec::new();
        let mut at = 0u32;
        for part in &parts {
            all.extend(
                part.times
                    .iter()
                    .zip(&part.rows)
                    .enumerate()
                    .map(|(i, (&t, &r))| (t, r, at + i as u32)),
            );
            at += part.rows.len() as u32;
        }
        match self.req.order {
            Order::Stored => all.sort_unstable_by_key(|&(_, r, _)| r),
            Order::NewestFirst => all.sort_unstable_by_key(|&(t, r, _)| Reverse((t, r))),
            Order::OldestFirst => all.sort_unstable_by_key(|&(t, r, _)| (t, r)),
        }
        all.truncate(self.req.limit.unwrap_or(usize::MAX));
        let schema = self.input.root.schema();
        let batches: Vec<&RecordBatch> = parts.iter().map(|p| &p.batch).collect();
        let joined = arrow::compute::concat_batches(&schema, batches)?;
        let take: Vec<u32> = all.iter().map(|&(_, _, i)| i).collect();
        Ok(ScanOutput {
            rows: all.iter().map(|&(_, r, _)| r).collect(),
            times: all.iter().map(|&(t, _, _)| t).collect(),
            batch: take_record_batch(&joined, &UInt32Array::from(take))?,
            rows_scanned: parts.iter().map(|p| p.rows_scanned).sum(),
        })
    }
}

/// Line filters are tested row by row on the survivors of the rest of the
/// predicate when fewer than one row in this many survives; otherwise the
/// whole body column goes through the Arrow kernel.
const SPARSE_LINE_TEST: usize = 4;

/// The rows a mask selects (all `n` without one), ascending.
fn selected_rows(mask: Option<&BooleanArray>, n: usize) -> Vec<u32> {
    match mask {
        Some(m) => m.values().set_indices().map(|i| i as u32).collect(),
        None => (0..n as u32).collect(),
    }
}

/// One line filter ready to test single rows.
enum LineTest<'a> {
    Contains(Box<memchr::memmem::Finder<'a>>, bool),
    Regex(&'a Regex, bool),
}

impl<'a> LineTest<'a> {
    fn new(f: &'a LineFilter) -> Self {
        match f {
            LineFilter::Contains(s) => LineTest::Contains(Box::new(memchr::memmem::Finder::new(s.as_bytes())), true),
            LineFilter::NotContains(s) => {
                LineTest::Contains(Box::new(memchr::memmem::Finder::new(s.as_bytes())), false)
            }
            LineFilter::Regex(re) => LineTest::Regex(re, true),
            LineFilter::NotRegex(re) => LineTest::Regex(re, false),
        }
    }

    /// The filter's verdict on row `i`; a null body reads as "".
    fn test(&self, body: &StringArray, i: usize) -> bool {
        let line = body_text(body, i);
        match self {
            LineTest::Contains(f, want) => f.find(line.as_bytes()).is_some() == *want,
            LineTest::Regex(re, want) => re.is_match(line) == *want,
        }
    }
}

fn body_text(body: &StringArray, i: usize) -> &str {
    if body.is_null(i) { "" } else { body.value(i) }
}

impl LineFilter {
    /// The filter's verdict on an empty line.
    fn test_empty(&self) -> bool {
        match self {
            LineFilter::Contains(s) => s.is_empty(),
            LineFilter::NotContains(s) => !s.is_empty(),
            LineFilter::Regex(re) => re.is_match(""),
            LineFilter::NotRegex(re) => !re.is_match(""),
        }
    }
}

/// Orders selected rows and keeps the first `limit`. Newest-first with a
/// limit uses a partial selection, not a full sort.
fn order_and_limit(mut rows: Vec<u32>, times: &[u64], order: Order, limit: Option<usize>) -> Vec<u32> {
    let key_new = |r: &u32| Reverse((times[*r as usize], *r));
    let key_old = |r: &u32| (times[*r as usize], *r);
    let limit = limit.unwrap_or(usize::MAX);
    match order {
        Order::Stored => rows.truncate(limit),
        Order::NewestFirst => {
            if limit < rows.len() {
                rows.select_nth_unstable_by_key(limit, key_new);
                rows.truncate(limit);
            }
            rows.sort_unstable_by_key(key_new);
        }
        Order::OldestFirst => {
            if limit < rows.len() {
                rows.select_nth_unstable_by_key(limit, key_old);
                rows.truncate(limit);
            }
            rows.sort_unstable_by_key(key_old);
        }
    }
    rows
}

/// What the sidecars can check of a predicate: the time range, positive
/// equality matchers (a negative or regex matcher, or one that matches the
/// empty string and so rows without the key, cannot prune), severity, span
/// name and duration, metric name and trace id.
pub fn probe(p: &Predicate) -> Probe {
    let mut probe = Probe {
        // The probe's range is inclusive; ours is [start, end). An empty
        // range becomes lo > hi, which prunes every block, as it should.
        time: p
            .time
            .map(|(start, end)| if end > start { (start, end - 1) } else { (1, 0) }),
        trace_id: p.trace_id,
        min_severity: p.min_severity,
        min_duration: p.min_duration,
        max_duration: p.max_duration,
        ..Default::default()
    };
    for m in &p.attrs {
        if let MatchOp::Eq(v) = &m.op
            && !v.is_empty()
        {
            let pair = (m.key.clone(), v.clone());
            match m.scope {
                AttrScope::Resource => probe.resource_eq.push(pair),
                AttrScope::Record => probe.attr_eq.push(pair),
                AttrScope::Field => probe.field_eq.push(pair),
            }
        }
    }
    if let Some(MatchOp::Eq(name)) = &p.span_name {
        probe.field_eq.push((sidecar_field::SPAN_NAME.to_owned(), name.clone()));
    }
    if let Some(name) = &p.metric_name {
        probe
            .field_eq
            .push((sidecar_field::METRIC_NAME.to_owned(), name.clone()));
    }
    probe
}

/// Whether `block` may hold a row matching `p`, judged from its manifest and
/// sidecars alone: no row section is read.
pub fn prune(block: &Block, p: &Predicate) -> Result<Verdict, Error> {
    let meta = block.manifest().meta();
    let sidecars = crate::tables::read_sidecars(block)?;
    Ok(sidecars.may_match(&probe(p), meta.min_time, meta.max_time))
}
