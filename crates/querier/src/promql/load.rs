//! Metric blocks as Prometheus series: each OTLP series becomes one series
//! (gauge, sum), or `_bucket{le}` + `_sum` + `_count` (histogram), or
//! `{quantile}` + `_sum` + `_count` (summary). Labels are the resource
//! attributes, then the point attributes (which win), with names mapped by
//! [`label_name`]; `service.name` (with `service.namespace`) also gives
//! `job` and `service.instance.id` gives `instance`, as Prometheus' OTLP
//! receiver does. Exponential histograms give `_sum` and `_count` only.
//!
//! A block is read for a query's selectors ([`read_block`]): they are
//! asked of each series' labels without building them ([`Want`]; bucket
//! and quantile series without their `le` / `quantile`), and only the
//! points of series they may want are read: a sealed block's points are
//! ordered by series, so each wanted series' run is found by binary
//! search; blocks in another order are walked.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, BooleanArray, Float64Array, Int64Array, ListArray, PrimitiveArray, UInt8Array,
    UInt32Array, UInt64Array,
};
use arrow::datatypes::{Float64Type, UInt64Type};
use arrow::record_batch::RecordBatch;
use mira_core::attrs::AttrReader;
use mira_core::convert::columns::{DictStr, col};
use mira_core::convert::metrics::{SOURCE_ATTR, SOURCE_REMOTE_WRITE};
use mira_core::convert::{ConvertError, TableSet};
use mira_core::schema::{self, metric_type};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;

use std::sync::Arc;

use super::eval::{LabelLookup, Labels, NAME, Series};
use super::names::{label_name, label_name_ref, metric_name};

/// Tables a metrics block is read from.
pub const TABLES: [&str; 6] = [
    schema::SERIES,
    schema::SERIES_ATTRS,
    schema::RESOURCES,
    schema::RESOURCE_ATTRS,
    schema::POINTS,
    schema::POINT_DISTS,
];

/// A block's series: distinct labels, samples sorted by time with one per
/// time (the first read). Shared: kept in the result cache, and handed to
/// the evaluator as they are when no other block has the same series.
pub type BlockSeries = Vec<Arc<Series>>;

fn text(kv: &KeyValue) -> Option<String> {
    match kv.value.as_ref()?.value.as_ref()? {
        AnyV::StringValue(s) => Some(s.clone()),
        AnyV::IntValue(i) => Some(i.to_string()),
        AnyV::DoubleValue(d) => Some(d.to_string()),
        AnyV::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Whether a resource came by Prometheus remote write: its series keep
/// their names, and its labels are only `job` and `instance`.
fn remote_written(resource: &[KeyValue]) -> bool {
    resource
        .iter()
        .any(|kv| kv.key == SOURCE_ATTR && text(kv).as_deref() == Some(SOURCE_REMOTE_WRITE))
}

/// Every resource's attributes, by resource row.
fn resource_attrs(tables: &TableSet) -> Result<Vec<Vec<KeyValue>>, ConvertError> {
    let resources = tables.get(schema::RESOURCES)?;
    AttrReader::new(tables.get(schema::RESOURCE_ATTRS)?, schema::RESOURCE_ATTRS)?.grouped(resources.num_rows())
}

/// A series' Prometheus name: its own when remote written (`verbatim`),
/// else the OTLP translation of its name and unit.
fn prometheus_name(name: Option<&str>, unit: Option<&str>, is_gauge: bool, counter: bool, verbatim: bool) -> String {
    let name = name.unwrap_or("");
    if verbatim {
        name.to_owned()
    } else {
        metric_name(name, unit.unwrap_or(""), is_gauge, counter)
    }
}

/// A resource's labels before a series' own: its attributes (none for a
/// remote-written one), then `job` and `instance`; sorted by name, empty
/// values kept (a series' attribute may still override them).
fn resource_labels(resource: &[KeyValue]) -> Vec<(String, String)> {
    let mut m: BTreeMap<String, String> = BTreeMap::new();
    let find = |k: &str| resource.iter().find(|kv| kv.key == k).and_then(text);
    if !remote_written(resource) {
        for kv in resource {
            if let Some(v) = text(kv) {
                m.insert(label_name(&kv.key), v);
            }
        }
    }
    if let Some(service) = find("service.name") {
        let job = match find("service.namespace") {
            Some(ns) => format!("{ns}/{service}"),
            None => service,
        };
        m.insert("job".into(), job);
    }
    if let Some(instance) = find("service.instance.id") {
        m.insert("instance".into(), instance);
    }
    m.into_iter().collect()
}

/// A label as read from a block: borrowed from its tables where the
/// attribute's key is a label name already and its value a string.
type LabelRef<'a> = (Cow<'a, str>, Cow<'a, str>);

/// Every series' own attributes as labels, in row order (a later one wins),
/// borrowed from the table: series `i`'s are `labels[starts[i]..starts[i + 1]]`.
/// Attributes without a text value (bytes, lists, maps) give none.
struct PointLabels<'a> {
    labels: Vec<LabelRef<'a>>,
    starts: Vec<usize>,
}

impl<'a> PointLabels<'a> {
    fn new(attrs: &AttrReader<'a>, n_series: usize) -> Result<Self, ConvertError> {
        let mut counts = vec![0usize; n_series + 1];
        let mut rows = Vec::with_capacity(attrs.len());
        for (row, parent) in attrs.parents().enumerate() {
            let p = parent as usize;
            if p >= n_series {
                return Err(ConvertError::BadReference {
                    table: schema::SERIES_ATTRS,
                    row,
                });
            }
            let label = if attrs.type_id(row) == schema::attr_type::KV {
                // A whole KeyValue (the rare shapes other types cannot say):
                // read as OTLP, as the resource's attributes are.
                let kv = attrs.key_value(row)?;
                text(&kv).map(|v| (Cow::Owned(label_name(&kv.key)), Cow::Owned(v)))
            } else {
                attrs.text(row).map(|v| (label_name_ref(attrs.key(row)), v))
            };
            if let Some(label) = label {
                counts[p + 1] += 1;
                rows.push((p, label));
            }
        }
        for i in 1..counts.len() {
            counts[i] += counts[i - 1];
        }
        // Stable, so a series' rows keep their order; rows are usually in
        // series order already, which the sort only checks.
        rows.sort_by_key(|(p, _)| *p);
        Ok(PointLabels {
            labels: rows.into_iter().map(|(_, l)| l).collect(),
            starts: counts,
        })
    }

    fn of(&self, series: usize) -> &[LabelRef<'a>] {
        &self.labels[self.starts[series]..self.starts[series + 1]]
    }
}

/// A series' labels without its name: the resource's, overridden by its
/// own, empty values dropped.
fn base_labels(resource: &[(String, String)], point: &[LabelRef<'_>]) -> Vec<(String, String)> {
    let mut m: BTreeMap<String, String> = resource.iter().cloned().collect();
    for (k, v) in point {
        m.insert(k.to_string(), v.to_string());
    }
    m.into_iter().filter(|(_, v)| !v.is_empty()).collect()
}

/// A series' labels read without building them (what [`base_labels`]
/// and [`with`] would give, for asking a selector).
struct SeriesView<'a> {
    name: &'a str,
    resource: &'a [(String, String)],
    point: &'a [LabelRef<'a>],
}

impl LabelLookup for SeriesView<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        if name == NAME {
            return Some(self.name);
        }
        let v: &str = match self.point.iter().rev().find(|(k, _)| k == name) {
            Some((_, v)) => v,
            None => {
                let i = self.resource.binary_search_by(|(k, _)| k.as_str().cmp(name)).ok()?;
                &self.resource[i].1
            }
        };
        (!v.is_empty()).then_some(v)
    }
}

fn with(base: &[(String, String)], name: &str, extra: Option<(&str, String)>) -> Labels {
    let mut l: Labels = base.to_vec();
    l.push((NAME.to_owned(), name.to_owned()));
    if let Some((k, v)) = extra {
        l.retain(|(n, _)| n != k);
        l.push((k.to_owned(), v));
    }
    l.sort();
    l
}

/// Prometheus' rendering of a bucket bound or quantile.
pub fn format_float(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else if v.is_nan() {
        "NaN".into()
    } else {
        format!("{v}")
    }
}

/// Prometheus metadata of a block's metrics: (name, type, help), the
/// type as Prometheus names it (`counter` for a monotonic sum, `gauge`
/// for a gauge or another sum, `histogram`, `summary`).
pub fn read_metadata(tables: &TableSet) -> Result<Vec<(String, &'static str, String)>, ConvertError> {
    let series = tables.get(schema::SERIES)?;
    let t = schema::SERIES;
    let names = DictStr::new(series, t, "metric_name")?;
    let units = DictStr::new(series, t, "metric_unit")?;
    let help = DictStr::new(series, t, "metric_description")?;
    let types: &UInt8Array = col(series, t, "metric_type")?;
    let monotonic: &BooleanArray = col(series, t, "is_monotonic")?;
    let resource_id: &UInt32Array = col(series, t, "resource_id")?;
    let verbatim: Vec<bool> = resource_attrs(tables)?.iter().map(|a| remote_written(a)).collect();
    let mut out = Vec::new();
    for i in 0..series.num_rows() {
        let kind = types.value(i);
        let counter = kind == metric_type::SUM && monotonic.value(i);
        let is_gauge = kind == metric_type::GAUGE || (kind == metric_type::SUM && !counter);
        let verbatim = verbatim.get(resource_id.value(i) as usize).copied().unwrap_or(false);
        let name = prometheus_name(names.get(i), units.get(i), is_gauge, counter, verbatim);
        let kind = match kind {
            metric_type::HISTOGRAM | metric_type::EXP_HISTOGRAM => "histogram",
            metric_type::SUMMARY => "summary",
            _ if counter => "counter",
            _ => "gauge",
        };
        out.push((name, kind, help.get(i).unwrap_or("").to_owned()));
    }
    Ok(out)
}

/// Which Prometheus series of an OTLP series a sample belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Variant {
    /// A gauge's or a sum's value (the series' own name).
    Value,
    Count,
    Sum,
    /// `_bucket`, with the bound's bits.
    Bucket,
    /// A summary's `{quantile}`, with the quantile's bits.
    Quantile,
}

/// A block's samples grouped by Prometheus series while its points are
/// read: a series' labels are built, and `wanted` asked, once per block
/// (at its first sample), not once per sample; each sample then costs a
/// lookup by (OTLP series, variant, bound) and a push.
struct Slots<'w> {
    wanted: &'w dyn Fn(&dyn LabelLookup) -> bool,
    /// A gauge's or sum's slot by OTLP series (the common case, no hash):
    /// None: not met yet; Some(None): not wanted.
    value_of: Vec<Option<Option<usize>>>,
    /// (OTLP series, variant, bound bits) -> slot of the other variants.
    of: HashMap<(usize, Variant, u64), Option<usize>, foldhash::fast::RandomState>,
    /// Labels -> slot (two OTLP series may give the same labels).
    by_labels: HashMap<Labels, usize, foldhash::fast::RandomState>,
    series: Vec<(Labels, Vec<(i64, f64)>)>,
}

impl<'w> Slots<'w> {
    fn new(wanted: &'w dyn Fn(&dyn LabelLookup) -> bool) -> Slots<'w> {
        Slots {
            wanted,
            value_of: Vec::new(),
            of: HashMap::default(),
            by_labels: HashMap::default(),
            series: Vec::new(),
        }
    }

    /// The slot of new labels: shared with equal labels met before; None
    /// when the query does not want them.
    fn slot_for(&mut self, l: Labels) -> Option<usize> {
        if !(self.wanted)(&l) {
            return None;
        }
        let next = self.series.len();
        let s = *self.by_labels.entry(l.clone()).or_insert(next);
        if s == next {
            self.series.push((l, Vec::new()));
        }
        Some(s)
    }

    /// The slot of `key`'s samples (labels built at its first sample);
    /// None when the query does not want them.
    fn slot(&mut self, key: (usize, Variant, u64), labels: impl FnOnce() -> Labels) -> Option<usize> {
        let known = if key.1 == Variant::Value {
            self.value_of.get(key.0).copied().flatten()
        } else {
            self.of.get(&key).copied()
        };
        match known {
            Some(s) => s,
            None => {
                let slot = self.slot_for(labels());
                if key.1 == Variant::Value {
                    if self.value_of.len() <= key.0 {
                        self.value_of.resize(key.0 + 1, None);
                    }
                    self.value_of[key.0] = Some(slot);
                } else {
                    self.of.insert(key, slot);
                }
                slot
            }
        }
    }

    fn push(&mut self, key: (usize, Variant, u64), tms: i64, v: f64, labels: impl FnOnce() -> Labels) {
        if let Some(s) = self.slot(key, labels) {
            self.series[s].1.push((tms, v));
        }
    }

    fn finish(self) -> BlockSeries {
        self.series
            .into_iter()
            .map(|(labels, samples)| Arc::new(Series::sorted(labels, samples)))
            .collect()
    }
}

/// How many runs a search of `rows` rows for `wanted` series pays for: a
/// search costs about 2 log2(rows) steps per wanted series and run, a walk
/// one step per row.
fn most_runs(rows: usize, wanted: usize) -> usize {
    let per_run = 2 * (usize::BITS - rows.leading_zeros()) as usize * wanted.max(1);
    rows / per_run.max(1)
}

/// The runs of rows over which `series` does not decrease, when there are
/// few enough for a search of one series to pay; None otherwise (and for
/// no rows).
fn all_runs(series: &[u32]) -> Option<Vec<std::ops::Range<usize>>> {
    if series.is_empty() {
        return None;
    }
    let most = most_runs(series.len(), 1);
    let mut runs = Vec::new();
    let mut start = 0;
    // Chunks are first checked without a branch per row (this vectorises);
    // only a chunk with a descent is walked row by row.
    const CHUNK: usize = 4096;
    let mut base = 1;
    while base < series.len() {
        let end = (base + CHUNK).min(series.len());
        let descents = series[base - 1..end - 1]
            .iter()
            .zip(&series[base..end])
            .filter(|(a, b)| b < a)
            .count();
        if descents > 0 {
            for i in base..end {
                if series[i] < series[i - 1] {
                    runs.push(start..i);
                    start = i;
                    if runs.len() >= most {
                        return None;
                    }
                }
            }
        }
        base = end;
    }
    runs.push(start..series.len());
    (runs.len() <= most).then_some(runs)
}

/// A block's point runs ([`point_runs`]), as kept in the decoded-table
/// cache under [`POINT_RUNS`]: one row per run; no rows when the block is
/// walked.
pub type PointRuns = Option<Vec<std::ops::Range<usize>>>;

/// The decoded-table cache's name for a block's [`PointRuns`]: they are
/// found once per block, not per query (a pass over every point).
pub const POINT_RUNS: &str = "derived.point_runs";

/// A metrics block's [`PointRuns`]: the runs of points over which their
/// series does not decrease (a sealed block is one run, a merged one a
/// run per input), or None when there are too many to search.
pub fn point_runs(tables: &TableSet) -> Result<PointRuns, ConvertError> {
    let points = tables.get(schema::POINTS)?;
    let of: &UInt32Array = col(points, schema::POINTS, "series")?;
    Ok(all_runs(of.values()))
}

/// [`PointRuns`] as a table, for the decoded-table cache.
pub fn runs_table(runs: &PointRuns) -> RecordBatch {
    let runs = runs.as_deref().unwrap_or_default();
    let start: ArrayRef = Arc::new(UInt64Array::from_iter_values(runs.iter().map(|r| r.start as u64)));
    let end: ArrayRef = Arc::new(UInt64Array::from_iter_values(runs.iter().map(|r| r.end as u64)));
    // Two non-null u64 columns of equal length: this cannot fail.
    RecordBatch::try_from_iter([("start", start), ("end", end)])
        .unwrap_or_else(|_| RecordBatch::new_empty(Arc::new(arrow::datatypes::Schema::empty())))
}

/// [`runs_table`] read back; None for a table that is not one.
pub fn runs_from_table(t: &RecordBatch) -> Option<PointRuns> {
    let start = t.column_by_name("start")?.as_any().downcast_ref::<UInt64Array>()?;
    let end = t.column_by_name("end")?.as_any().downcast_ref::<UInt64Array>()?;
    let runs: Vec<std::ops::Range<usize>> = start
        .values()
        .iter()
        .zip(end.values())
        .map(|(&s, &e)| s as usize..e as usize)
        .collect();
    Some((!runs.is_empty()).then_some(runs))
}

/// Where a point's distribution is: by binary search when the
/// distributions are in point order (what every builder and merge
/// writes), else by a map.
enum DistIndex<'a> {
    Sorted(&'a [u32]),
    Map(HashMap<u32, usize, foldhash::fast::RandomState>),
}

impl<'a> DistIndex<'a> {
    fn new(parent: &'a [u32]) -> DistIndex<'a> {
        if parent.windows(2).all(|w| w[0] < w[1]) {
            DistIndex::Sorted(parent)
        } else {
            DistIndex::Map(parent.iter().enumerate().map(|(r, &p)| (p, r)).collect())
        }
    }

    fn get(&self, point: u32) -> Option<usize> {
        match self {
            DistIndex::Sorted(parent) => parent.binary_search(&point).ok(),
            DistIndex::Map(m) => m.get(&point).copied(),
        }
    }
}

/// Which Prometheus series a read wants.
pub struct Want<'a> {
    /// Asked of a series' labels.
    pub full: &'a dyn Fn(&dyn LabelLookup) -> bool,
    /// Asked of labels without `le` or `quantile` (a bucket or quantile
    /// series before its points are read): whether a series with these
    /// labels and some value of those could be wanted. Never false when
    /// one could.
    pub partial: &'a dyn Fn(&dyn LabelLookup) -> bool,
}

impl std::fmt::Debug for Want<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Want").finish_non_exhaustive()
    }
}

/// A list column read without an array per row: its offsets and values.
struct Lists<'a, T: ArrowPrimitiveType> {
    list: &'a ListArray,
    offsets: &'a [i32],
    values: &'a [T::Native],
}

impl<'a, T: ArrowPrimitiveType> Lists<'a, T> {
    fn new(list: &'a ListArray, table: &'static str, column: &'static str) -> Result<Self, ConvertError> {
        let values = list
            .values()
            .as_any()
            .downcast_ref::<PrimitiveArray<T>>()
            .ok_or(ConvertError::WrongType { table, column })?;
        Ok(Lists {
            list,
            offsets: list.value_offsets(),
            values: values.values(),
        })
    }

    /// Row `row`'s list; None when it is null (or its offsets are not
    /// inside the values).
    fn get(&self, row: usize) -> Option<&'a [T::Native]> {
        if !self.list.is_valid(row) {
            return None;
        }
        let (from, to) = (*self.offsets.get(row)?, *self.offsets.get(row + 1)?);
        self.values.get(usize::try_from(from).ok()?..usize::try_from(to).ok()?)
    }
}

/// The block's series `want` accepts, with their samples with time in
/// `[from_ms, to_ms]`, and the points read. `runs` are the block's
/// [`point_runs`]: each wanted series' rows are found by binary search in
/// each run; None walks every point whatever their order.
pub fn read_block(
    tables: &TableSet,
    from_ms: i64,
    to_ms: i64,
    want: &Want<'_>,
    runs: Option<&[std::ops::Range<usize>]>,
) -> Result<(BlockSeries, usize), ConvertError> {
    let series = tables.get(schema::SERIES)?;
    let t = schema::SERIES;
    let names = DictStr::new(series, t, "metric_name")?;
    let units = DictStr::new(series, t, "metric_unit")?;
    let types: &UInt8Array = col(series, t, "metric_type")?;
    let monotonic: &BooleanArray = col(series, t, "is_monotonic")?;
    let resource_id: &UInt32Array = col(series, t, "resource_id")?;
    let n_series = series.num_rows();
    let series_attrs = AttrReader::new(tables.get(schema::SERIES_ATTRS)?, schema::SERIES_ATTRS)?;
    let point_labels = PointLabels::new(&series_attrs, n_series)?;
    let resource_attrs = resource_attrs(tables)?;

    // Per OTLP series: its base labels, Prometheus name, type; None when no
    // Prometheus series of it can be wanted.
    struct Info {
        base: Vec<(String, String)>,
        name: String,
        kind: u8,
    }
    let mut infos: Vec<Option<Info>> = Vec::with_capacity(n_series);
    // Built once per resource and once per metric, not per series.
    // (labels, whether its series keep their names: remote written)
    type ResourceInfo = (Vec<(String, String)>, bool);
    let mut by_resource: Vec<Option<ResourceInfo>> = vec![None; resource_attrs.len()];
    type MetricKey<'k> = (Option<&'k str>, Option<&'k str>, u8, bool, bool);
    let mut by_metric: HashMap<MetricKey<'_>, (String, Vec<String>), foldhash::fast::RandomState> = HashMap::default();
    for i in 0..n_series {
        let kind = types.value(i);
        let rid = resource_id.value(i) as usize;
        let (resource, verbatim) = match by_resource.get_mut(rid) {
            Some(Some((r, v))) => (&*r, *v),
            Some(slot) => {
                let attrs = &resource_attrs[rid];
                let (r, v) = slot.insert((resource_labels(attrs), remote_written(attrs)));
                (&*r, *v)
            }
            None => return Err(ConvertError::BadReference { table: t, row: i }),
        };
        let point = point_labels.of(i);
        let (name, candidates) = by_metric
            .entry((names.get(i), units.get(i), kind, monotonic.value(i), verbatim))
            .or_insert_with(|| {
                let is_gauge = kind == metric_type::GAUGE || (kind == metric_type::SUM && !monotonic.value(i));
                let counter = kind == metric_type::SUM && monotonic.value(i);
                let name = prometheus_name(names.get(i), units.get(i), is_gauge, counter, verbatim);
                let candidates = match kind {
                    metric_type::HISTOGRAM => {
                        vec![format!("{name}_bucket"), format!("{name}_sum"), format!("{name}_count")]
                    }
                    metric_type::SUMMARY | metric_type::EXP_HISTOGRAM => {
                        vec![name.clone(), format!("{name}_sum"), format!("{name}_count")]
                    }
                    _ => vec![name.clone()],
                };
                (name, candidates)
            });
        // Bucket and quantile series are asked without their `le` or
        // `quantile` (not known before their points are read), and every
        // series without building its labels.
        let any = candidates.iter().any(|n| {
            (want.partial)(&SeriesView {
                name: n,
                resource,
                point,
            })
        });
        let Some(name) = any.then(|| name.clone()) else {
            infos.push(None);
            continue;
        };
        let base = base_labels(resource, point);
        infos.push(Some(Info { base, name, kind }));
    }

    let points = tables.get(schema::POINTS)?;
    let p = schema::POINTS;
    let of: &UInt32Array = col(points, p, "series")?;
    let time: &UInt64Array = col(points, p, "time_unix_nano")?;
    let vi: &Int64Array = col(points, p, "value_int")?;
    let vd: &Float64Array = col(points, p, "value_double")?;
    let flags: &UInt32Array = col(points, p, "flags")?;
    let dists = tables.get(schema::POINT_DISTS)?;
    let d = schema::POINT_DISTS;
    let parent: &UInt32Array = col(dists, d, "parent")?;
    let count: &UInt64Array = col(dists, d, "count")?;
    let sum: &Float64Array = col(dists, d, "sum")?;
    let bucket_counts: &ListArray = col(dists, d, "bucket_counts")?;
    let bounds: &ListArray = col(dists, d, "explicit_bounds")?;
    let quantiles: &ListArray = col(dists, d, "quantiles")?;
    let quantile_values: &ListArray = col(dists, d, "quantile_values")?;
    let dist_of = DistIndex::new(parent.values());

    let counts_of = Lists::<UInt64Type>::new(bucket_counts, d, "bucket_counts")?;
    let bounds_of = Lists::<Float64Type>::new(bounds, d, "explicit_bounds")?;
    let quantiles_of = Lists::<Float64Type>::new(quantiles, d, "quantiles")?;
    let quantile_values_of = Lists::<Float64Type>::new(quantile_values, d, "quantile_values")?;

    let mut slots = Slots::new(want.full);
    let mut read = 0;
    // The samples of series `sid` in `rows` (one row while walking, a
    // series' run while searching).
    let mut visit = |sid: usize, rows: std::ops::Range<usize>| -> Result<(), ConvertError> {
        let Some(Some(info)) = infos.get(sid) else {
            if sid >= n_series {
                return Err(ConvertError::BadReference {
                    table: p,
                    row: rows.start,
                });
            }
            return Ok(());
        };
        // A point that holds no value (OTLP's FLAG_NO_RECORDED_VALUE, such
        // as one carrying only exemplars) is no sample.
        let in_range = |row: usize| {
            let tms = (time.value(row) / 1_000_000) as i64;
            (tms >= from_ms && tms <= to_ms && flags.value(row) & 1 == 0).then_some(tms)
        };
        if matches!(info.kind, metric_type::GAUGE | metric_type::SUM) {
            // One slot for the whole run, looked up at its first sample.
            let mut slot: Option<Option<usize>> = None;
            for row in rows {
                let Some(tms) = in_range(row) else {
                    continue;
                };
                read += 1;
                let v = if vd.is_valid(row) {
                    vd.value(row)
                } else if vi.is_valid(row) {
                    vi.value(row) as f64
                } else {
                    continue;
                };
                let s = *slot
                    .get_or_insert_with(|| slots.slot((sid, Variant::Value, 0), || with(&info.base, &info.name, None)));
                if let Some(s) = s {
                    slots.series[s].1.push((tms, v));
                }
            }
            return Ok(());
        }
        for row in rows {
            let Some(tms) = in_range(row) else {
                continue;
            };
            read += 1;
            let Some(dr) = dist_of.get(row as u32) else {
                continue;
            };
            slots.push((sid, Variant::Count, 0), tms, count.value(dr) as f64, || {
                with(&info.base, &format!("{}_count", info.name), None)
            });
            if sum.is_valid(dr) {
                slots.push((sid, Variant::Sum, 0), tms, sum.value(dr), || {
                    with(&info.base, &format!("{}_sum", info.name), None)
                });
            }
            if info.kind == metric_type::HISTOGRAM
                && let (Some(counts), Some(b)) = (counts_of.get(dr), bounds_of.get(dr))
            {
                let mut cumulative = 0u64;
                for (i, &c) in counts.iter().enumerate() {
                    cumulative = cumulative.saturating_add(c);
                    let le = b.get(i).copied().unwrap_or(f64::INFINITY);
                    slots.push((sid, Variant::Bucket, le.to_bits()), tms, cumulative as f64, || {
                        with(
                            &info.base,
                            &format!("{}_bucket", info.name),
                            Some(("le", format_float(le))),
                        )
                    });
                }
                if counts.len() <= b.len() {
                    // No +Inf bucket was sent: the total count is it.
                    let inf = f64::INFINITY;
                    slots.push(
                        (sid, Variant::Bucket, inf.to_bits()),
                        tms,
                        count.value(dr) as f64,
                        || {
                            with(
                                &info.base,
                                &format!("{}_bucket", info.name),
                                Some(("le", "+Inf".into())),
                            )
                        },
                    );
                }
            }
            if info.kind == metric_type::SUMMARY
                && let (Some(qs), Some(vs)) = (quantiles_of.get(dr), quantile_values_of.get(dr))
            {
                for (&q, &v) in qs.iter().zip(vs) {
                    slots.push((sid, Variant::Quantile, q.to_bits()), tms, v, || {
                        with(&info.base, &info.name, Some(("quantile", format_float(q))))
                    });
                }
            }
        }
        Ok(())
    };
    // A sealed block's points are ordered by series (see
    // `mira_core::convert::points_by_series`), a merged block's are one
    // such run per input: the rows of wanted series are found by binary
    // search in each run, when that is cheaper than walking every point
    // (an older block, or one of many runs).
    let series_of = of.values();
    let wanted_series = infos.iter().filter(|i| i.is_some()).count();
    match runs.filter(|r| r.len() <= most_runs(series_of.len(), wanted_series)) {
        Some(runs) => {
            // Runs that cover the rows exactly (ones kept for another block
            // of the same id cannot, ids are never reused, but a check is
            // cheap), and a run's last row names its largest series.
            let covers = runs.first().is_some_and(|r| r.start == 0)
                && runs.windows(2).all(|w| w[0].end == w[1].start && w[0].start < w[0].end)
                && runs.last().is_some_and(|r| r.end == series_of.len() && r.start < r.end);
            if !covers {
                return Err(ConvertError::BadReference { table: p, row: 0 });
            }
            if let Some(run) = runs.iter().find(|r| series_of[r.end - 1] as usize >= n_series) {
                return Err(ConvertError::BadReference {
                    table: p,
                    row: run.end - 1,
                });
            }
            for run in runs.iter().cloned() {
                let mut at = run.start;
                for (sid, info) in infos.iter().enumerate() {
                    if info.is_none() {
                        continue;
                    }
                    let rest = &series_of[at..run.end];
                    let first = at + rest.partition_point(|&s| (s as usize) < sid);
                    let end = first + series_of[first..run.end].partition_point(|&s| s as usize == sid);
                    if first < end {
                        visit(sid, first..end)?;
                    }
                    at = end;
                }
            }
        }
        None => {
            for (row, &sid) in series_of.iter().enumerate() {
                visit(sid as usize, row..row + 1)?;
            }
        }
    }
    Ok((slots.finish(), read))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mira_core::convert::{PointsBuilder, SignalBuilder, points_by_series};
    use mira_testkit::corpus::{Cardinality, Corpus};

    type Wanted = dyn Fn(&dyn LabelLookup) -> bool;

    /// A selection that needs no `le` or `quantile` to decide.
    fn want(full: &Wanted) -> Want<'_> {
        Want { full, partial: full }
    }

    /// The runs of rows over which `series` does not decrease, when binary
    /// searching them for `wanted` series is cheaper than walking every row;
    /// None otherwise.
    fn sorted_runs(series: &[u32], wanted: usize) -> Option<Vec<std::ops::Range<usize>>> {
        all_runs(series).filter(|r| r.len() <= most_runs(series.len(), wanted))
    }

    /// A read with the block's runs, kept and read back as the querier
    /// keeps them.
    fn read(t: &TableSet, from: i64, to: i64, w: &Want<'_>) -> Result<(BlockSeries, usize), ConvertError> {
        let kept = runs_from_table(&runs_table(&point_runs(t)?)).expect("a runs table");
        read_block(t, from, to, w, kept.as_deref())
    }

    fn label<'a>(l: &'a dyn LabelLookup, name: &str) -> Option<&'a str> {
        l.get(name)
    }

    /// A block read with its points in arrival order (every point walked)
    /// and ordered by series (only the runs of wanted series) gives the
    /// same series and samples, for every kind of selection, histograms
    /// and summaries included, and reads fewer points when fewer series
    /// are wanted.
    #[test]
    fn points_ordered_by_series_read_the_same() {
        let mut corpus = Corpus::new(5, Cardinality::Low);
        let per_request = corpus.series_count() / 4 + 3;
        let mut b = PointsBuilder::default();
        for _ in 0..16 {
            b.append(&corpus.metrics(per_request)).expect("append");
        }
        let arrival = b.finish().expect("finish");
        let sorted = points_by_series(arrival.clone()).expect("by series");
        // Two sealed blocks merged: one run per input per series.
        let mut blocks = Vec::new();
        for _ in 0..2 {
            let mut b = PointsBuilder::default();
            for _ in 0..6 {
                b.append(&corpus.metrics(per_request)).expect("append");
            }
            let t = points_by_series(b.finish().expect("finish")).expect("by series");
            let bytes = mira_core::tables::write_hot(&t, mira_core::BlockId::new(), "t".parse().expect("tenant"))
                .expect("write");
            let verify = Arc::new(mira_core::block::VerifyCache::new(64));
            blocks.push(mira_core::block::Block::from_bytes(bytes, verify).expect("open"));
        }
        let merged = mira_core::compact::merge_tables(&blocks).expect("merge");
        let runs = sorted_runs(
            merged
                .get(schema::POINTS)
                .and_then(|t| col::<UInt32Array>(t, schema::POINTS, "series"))
                .expect("series")
                .values(),
            1,
        )
        .expect("runs");
        // At least one run per input (more where the merge numbered the
        // second input's new series before series it shares with the first).
        assert!(
            (2..=8).contains(&runs.len()),
            "a merge of two ordered blocks is a few runs: {}",
            runs.len()
        );
        let all = |_: &dyn LabelLookup| true;
        let histograms = |l: &dyn LabelLookup| label(l, NAME).is_some_and(|n| n.ends_with("_bucket"));
        let one_instance = |l: &dyn LabelLookup| {
            label(l, "instance").is_some_and(|i| i.ends_with('1')) && label(l, NAME).is_some_and(|n| !n.is_empty())
        };
        let none = |_: &dyn LabelLookup| false;
        let inf_buckets = |l: &dyn LabelLookup| histograms(l) && label(l, "le") == Some("+Inf");
        let wanted: [(&str, Want<'_>); 5] = [
            ("all", want(&all)),
            ("histogram buckets", want(&histograms)),
            ("a tenth of the instances", want(&one_instance)),
            ("none", want(&none)),
            (
                "+Inf buckets",
                Want {
                    full: &inf_buckets,
                    partial: &histograms,
                },
            ),
        ];
        let (_, everything) = read(&sorted, i64::MIN, i64::MAX, &want(&all)).expect("read");
        for (what, w) in &wanted {
            let mid = ((arrival.min_time / 2 + arrival.max_time / 2) / 1_000_000) as i64;
            for (from, to) in [(i64::MIN, i64::MAX), (mid, i64::MAX)] {
                let (a, read_a) = read(&arrival, from, to, w).expect("read arrival order");
                let (b, read_b) = read(&sorted, from, to, w).expect("read by series");
                assert_eq!(a, b, "{what}: series differ");
                assert_eq!(read_a, read_b, "{what}: points read differ");
                let walked = read_block(&merged, from, to, w, None).expect("walk the merge");
                let searched = read(&merged, from, to, w).expect("search the merge");
                assert_eq!(walked, searched, "{what}: merged block read differs");
                if *what != "all" {
                    assert!(read_b < everything, "{what}: {read_b} of {everything} points read");
                }
                if *what == "none" {
                    assert_eq!(read_b, 0, "no series wanted, no point read");
                }
                if *what == "+Inf buckets" {
                    assert!(b.iter().all(|s| label(&s.labels, "le") == Some("+Inf")), "{b:?}");
                }
            }
        }
        for (what, w) in [&wanted[1], &wanted[2], &wanted[4]] {
            let (some, _) = read(&sorted, i64::MIN, i64::MAX, w).expect("read");
            assert!(
                !some.is_empty(),
                "the corpus must hold {what} for this test to mean anything"
            );
        }
    }

    /// Runs that do not cover a block's points exactly (another block's)
    /// are refused, not searched.
    #[test]
    fn runs_of_another_block_are_refused() {
        let mut corpus = Corpus::new(6, Cardinality::Low);
        let mut b = PointsBuilder::default();
        b.append(&corpus.metrics(corpus.series_count() * 3)).expect("append");
        let arrival = b.finish().expect("finish");
        let sorted = points_by_series(arrival).expect("by series");
        let runs = point_runs(&sorted).expect("runs").expect("a sealed block is one run");
        assert_eq!(runs.len(), 1);
        // One wanted series: a search of one run pays, so runs are used.
        let first = |l: &dyn LabelLookup| label(l, NAME).is_some_and(|n| n == "system_cpu_utilization_ratio");
        let w = want(&first);
        let short = vec![std::ops::Range {
            start: 0,
            end: runs[0].end - 1,
        }];
        let refused = |runs: &[std::ops::Range<usize>]| {
            matches!(
                read_block(&sorted, i64::MIN, i64::MAX, &w, Some(runs)),
                Err(ConvertError::BadReference { .. })
            )
        };
        assert!(refused(&short), "runs short of the points");
        assert!(refused(&[0..1, 2..runs[0].end]), "runs with a gap");
        let past = vec![std::ops::Range {
            start: 0,
            end: runs[0].end + 1,
        }];
        assert!(refused(&past), "runs past the points");
        let (kept, read) = read_block(&sorted, i64::MIN, i64::MAX, &w, Some(&runs)).expect("the block's own runs");
        let (walked, _) = read_block(&sorted, i64::MIN, i64::MAX, &w, None).expect("walk");
        assert!(!kept.is_empty() && kept == walked);
        let points = sorted.get(schema::POINTS).expect("points").num_rows();
        assert!(read < points, "{read} of {points} points read");
    }

    /// The runs found chunk by chunk are the runs a row-by-row walk finds,
    /// with descents on, next to and away from the chunk edges, and the
    /// give-up threshold is the same.
    #[test]
    fn runs_are_found_across_chunk_edges() {
        fn reference(series: &[u32], wanted: usize) -> Option<Vec<std::ops::Range<usize>>> {
            let per_run = 2 * (usize::BITS - series.len().leading_zeros()) as usize * wanted.max(1);
            let most = series.len() / per_run.max(1);
            let mut runs = Vec::new();
            let mut start = 0;
            for i in 1..series.len() {
                if series[i] < series[i - 1] {
                    runs.push(start..i);
                    start = i;
                    if runs.len() >= most {
                        return None;
                    }
                }
            }
            runs.push(start..series.len());
            (!series.is_empty() && runs.len() <= most).then_some(runs)
        }
        for len in [0, 1, 2, 4095, 4096, 4097, 8192, 8193, 20_000] {
            for descents in [
                vec![],
                vec![1],
                vec![4095],
                vec![4096],
                vec![4097],
                vec![8191, 8192, 12_000],
            ] {
                let series: Vec<u32> = (0..len)
                    .map(|i| {
                        let back = descents.iter().filter(|&&d| d <= i).count() as u32;
                        (i as u32 / 3) + 20_000 - back * 5_000
                    })
                    .collect();
                for wanted in [1, 50] {
                    assert_eq!(
                        sorted_runs(&series, wanted),
                        reference(&series, wanted),
                        "len {len}, descents {descents:?}, wanted {wanted}"
                    );
                }
            }
        }
    }
}
