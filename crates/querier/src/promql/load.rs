//! Metric blocks as Prometheus series: each OTLP series becomes one series
//! (gauge, sum), or `_bucket{le}` + `_sum` + `_count` (histogram), or
//! `{quantile}` + `_sum` + `_count` (summary). Labels are the resource
//! attributes, then the point attributes (which win), with names mapped by
//! [`label_name`]; `service.name` (with `service.namespace`) also gives
//! `job` and `service.instance.id` gives `instance`, as Prometheus' OTLP
//! receiver does. Exponential histograms give `_sum` and `_count` only.

use std::collections::HashMap;

use arrow::array::{Array, BooleanArray, Float64Array, Int64Array, ListArray, UInt8Array, UInt32Array, UInt64Array};
use mira_core::attrs::AttrReader;
use mira_core::convert::columns::{DictStr, col};
use mira_core::convert::{ConvertError, TableSet};
use mira_core::schema::{self, metric_type};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyV;

use std::sync::Arc;

use super::eval::{Labels, NAME, Series};
use super::names::{label_name, metric_name};

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

fn base_labels(resource: &[KeyValue], point: &[KeyValue]) -> Vec<(String, String)> {
    let mut m: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    let find = |k: &str| resource.iter().find(|kv| kv.key == k).and_then(text);
    for kv in resource {
        if let Some(v) = text(kv) {
            m.insert(label_name(&kv.key), v);
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
    for kv in point {
        if let Some(v) = text(kv) {
            m.insert(label_name(&kv.key), v);
        }
    }
    m.into_iter().filter(|(_, v)| !v.is_empty()).collect()
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
    let mut out = Vec::new();
    for i in 0..series.num_rows() {
        let kind = types.value(i);
        let counter = kind == metric_type::SUM && monotonic.value(i);
        let is_gauge = kind == metric_type::GAUGE || (kind == metric_type::SUM && !counter);
        let name = metric_name(
            names.get(i).unwrap_or(""),
            units.get(i).unwrap_or(""),
            is_gauge,
            counter,
        );
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
    wanted: &'w dyn Fn(&Labels) -> bool,
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
    fn new(wanted: &'w dyn Fn(&Labels) -> bool) -> Slots<'w> {
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

    fn push(&mut self, key: (usize, Variant, u64), tms: i64, v: f64, labels: impl FnOnce() -> Labels) {
        let known = if key.1 == Variant::Value {
            self.value_of.get(key.0).copied().flatten()
        } else {
            self.of.get(&key).copied()
        };
        let slot = match known {
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
        };
        if let Some(s) = slot {
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

/// The block's series `wanted` accepts, with their samples with time in
/// `[from_ms, to_ms]`, and the points read.
pub fn read_block(
    tables: &TableSet,
    from_ms: i64,
    to_ms: i64,
    wanted: &dyn Fn(&Labels) -> bool,
) -> Result<(BlockSeries, usize), ConvertError> {
    let series = tables.get(schema::SERIES)?;
    let t = schema::SERIES;
    let names = DictStr::new(series, t, "metric_name")?;
    let units = DictStr::new(series, t, "metric_unit")?;
    let types: &UInt8Array = col(series, t, "metric_type")?;
    let monotonic: &BooleanArray = col(series, t, "is_monotonic")?;
    let resource_id: &UInt32Array = col(series, t, "resource_id")?;
    let n_series = series.num_rows();
    let point_attrs = AttrReader::new(tables.get(schema::SERIES_ATTRS)?, schema::SERIES_ATTRS)?.grouped(n_series)?;
    let resources = tables.get(schema::RESOURCES)?;
    let resource_attrs =
        AttrReader::new(tables.get(schema::RESOURCE_ATTRS)?, schema::RESOURCE_ATTRS)?.grouped(resources.num_rows())?;

    // Per OTLP series: its base labels, Prometheus name, type; None when no
    // Prometheus series of it can be wanted.
    struct Info {
        base: Vec<(String, String)>,
        name: String,
        kind: u8,
    }
    let mut infos: Vec<Option<Info>> = Vec::with_capacity(n_series);
    for (i, point_attrs) in point_attrs.iter().enumerate() {
        let kind = types.value(i);
        let rid = resource_id.value(i) as usize;
        let resource = resource_attrs
            .get(rid)
            .ok_or(ConvertError::BadReference { table: t, row: i })?;
        let base = base_labels(resource, point_attrs);
        let is_gauge = kind == metric_type::GAUGE || (kind == metric_type::SUM && !monotonic.value(i));
        let name = metric_name(
            names.get(i).unwrap_or(""),
            units.get(i).unwrap_or(""),
            is_gauge,
            kind == metric_type::SUM && monotonic.value(i),
        );
        // A cheap check on the plain name before building every variant.
        let candidates: Vec<String> = match kind {
            metric_type::HISTOGRAM => vec![format!("{name}_bucket"), format!("{name}_sum"), format!("{name}_count")],
            metric_type::SUMMARY | metric_type::EXP_HISTOGRAM => {
                vec![name.clone(), format!("{name}_sum"), format!("{name}_count")]
            }
            _ => vec![name.clone()],
        };
        let any = kind == metric_type::HISTOGRAM
            || kind == metric_type::SUMMARY
            || candidates.iter().any(|n| wanted(&with(&base, n, None)));
        infos.push(any.then_some(Info { base, name, kind }));
    }

    let points = tables.get(schema::POINTS)?;
    let p = schema::POINTS;
    let of: &UInt32Array = col(points, p, "series")?;
    let time: &UInt64Array = col(points, p, "time_unix_nano")?;
    let vi: &Int64Array = col(points, p, "value_int")?;
    let vd: &Float64Array = col(points, p, "value_double")?;
    let dists = tables.get(schema::POINT_DISTS)?;
    let d = schema::POINT_DISTS;
    let parent: &UInt32Array = col(dists, d, "parent")?;
    let count: &UInt64Array = col(dists, d, "count")?;
    let sum: &Float64Array = col(dists, d, "sum")?;
    let bucket_counts: &ListArray = col(dists, d, "bucket_counts")?;
    let bounds: &ListArray = col(dists, d, "explicit_bounds")?;
    let quantiles: &ListArray = col(dists, d, "quantiles")?;
    let quantile_values: &ListArray = col(dists, d, "quantile_values")?;
    let dist_of: HashMap<u32, usize, foldhash::fast::RandomState> =
        (0..dists.num_rows()).map(|r| (parent.value(r), r)).collect();

    let mut slots = Slots::new(wanted);
    let mut read = 0;
    for row in 0..points.num_rows() {
        let sid = of.value(row) as usize;
        let Some(Some(info)) = infos.get(sid) else {
            if sid >= n_series {
                return Err(ConvertError::BadReference { table: p, row });
            }
            continue;
        };
        let tms = (time.value(row) / 1_000_000) as i64;
        if tms < from_ms || tms > to_ms {
            continue;
        }
        read += 1;
        match info.kind {
            metric_type::GAUGE | metric_type::SUM => {
                let v = if vd.is_valid(row) {
                    vd.value(row)
                } else if vi.is_valid(row) {
                    vi.value(row) as f64
                } else {
                    continue;
                };
                slots.push((sid, Variant::Value, 0), tms, v, || with(&info.base, &info.name, None));
            }
            kind => {
                let Some(&dr) = dist_of.get(&(row as u32)) else {
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
                if kind == metric_type::HISTOGRAM && bucket_counts.is_valid(dr) {
                    let counts = bucket_counts.value(dr);
                    let counts = counts
                        .as_any()
                        .downcast_ref::<UInt64Array>()
                        .ok_or(ConvertError::WrongType {
                            table: d,
                            column: "bucket_counts",
                        })?;
                    let b = if bounds.is_valid(dr) {
                        bounds.value(dr)
                    } else {
                        continue;
                    };
                    let b = b
                        .as_any()
                        .downcast_ref::<Float64Array>()
                        .ok_or(ConvertError::WrongType {
                            table: d,
                            column: "explicit_bounds",
                        })?;
                    let mut cumulative = 0u64;
                    for i in 0..counts.len() {
                        cumulative = cumulative.saturating_add(counts.value(i));
                        let le = if i < b.len() { b.value(i) } else { f64::INFINITY };
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
                if kind == metric_type::SUMMARY && quantiles.is_valid(dr) && quantile_values.is_valid(dr) {
                    let qs = quantiles.value(dr);
                    let vs = quantile_values.value(dr);
                    if let (Some(qs), Some(vs)) = (
                        qs.as_any().downcast_ref::<Float64Array>(),
                        vs.as_any().downcast_ref::<Float64Array>(),
                    ) {
                        for i in 0..qs.len().min(vs.len()) {
                            let q = qs.value(i);
                            slots.push((sid, Variant::Quantile, q.to_bits()), tms, vs.value(i), || {
                                with(&info.base, &info.name, Some(("quantile", format_float(q))))
                            });
                        }
                    }
                }
            }
        }
    }
    Ok((slots.finish(), read))
}
