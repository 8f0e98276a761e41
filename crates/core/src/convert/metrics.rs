//! Metric data points ↔ the `points` table (one row per data point; the
//! metric's name, unit, type and temporality repeat per row,
//! dictionary-encoded).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, BinaryBuilder, BooleanArray, DictionaryArray, Float64Array, Float64Builder,
    Int32Array, Int32Builder, Int64Array, Int64Builder, ListArray, ListBuilder, UInt8Array, UInt32Array, UInt64Array,
    UInt64Builder,
};
use arrow::datatypes::{DataType, Field, UInt32Type};
use arrow::record_batch::RecordBatch;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, KeyValueList};
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint,
    exponential_histogram_data_point::Buckets, metric::Data, number_data_point, summary_data_point::ValueAtQuantile,
};
use prost::Message;

use super::columns::{DictStr, check_id, col};
use super::context::{ContextBuilder, Contexts, FNV_OFFSET, Grouper, fnv1a};
use super::wire::{self, AttrView, Fast, Val};
use super::{Appended, ConvertError, Limits, SignalBuilder, TableSet, TimeRange};
use crate::attrs::{AttrBuilder, AttrReader};
use crate::dict::DictBuilder;
use crate::ids::Signal;
use crate::schema::{self, metric_type};

/// The resource attribute naming the protocol a resource's metrics came
/// in by, when it was not OTLP: the querier then shows their series as
/// that protocol wrote them (see `mira_ingester::prom`).
pub const SOURCE_ATTR: &str = "mira.source";

/// [`SOURCE_ATTR`] of metrics written by Prometheus remote write: their
/// names are Prometheus names already, and their resource is exactly the
/// `job` and `instance` labels.
pub const SOURCE_REMOTE_WRITE: &str = "prometheus.remote_write";

/// A point's exemplars, stored protobuf-encoded (they are rarely read and
/// never filtered on).
#[derive(Clone, PartialEq, Message)]
struct Exemplars {
    #[prost(message, repeated, tag = "1")]
    items: Vec<Exemplar>,
}

fn u64_list() -> ListBuilder<UInt64Builder> {
    ListBuilder::new(UInt64Builder::new()).with_field(Arc::new(Field::new_list_field(DataType::UInt64, false)))
}

fn f64_list() -> ListBuilder<Float64Builder> {
    ListBuilder::new(Float64Builder::new()).with_field(Arc::new(Field::new_list_field(DataType::Float64, false)))
}

fn push_u64s(b: &mut ListBuilder<UInt64Builder>, v: Option<&[u64]>) {
    match v {
        Some(v) => {
            b.values().append_slice(v);
            b.append(true);
        }
        None => b.append(false),
    }
}

fn push_f64s(b: &mut ListBuilder<Float64Builder>, v: Option<&[f64]>) {
    match v {
        Some(v) => {
            b.values().append_slice(v);
            b.append(true);
        }
        None => b.append(false),
    }
}

/// The metric-level fields of a row.
/// Computed once per `Metric`, not per point: a metric's name, description
/// and metadata can be large and repeat over many points.
struct MetricFields {
    name: u32,
    description: u32,
    unit: u32,
    metadata: Option<u32>,
    name_hash: u64,
    kind: u8,
    temporality: i32,
    monotonic: bool,
}

/// What makes points one series: their resource and scope rows, the
/// metric's dictionary keys and type, and their attributes. Its bytes key
/// the series index of the builder and of the compactor's merge alike, so
/// both number series the same way.
pub(crate) struct SeriesKey {
    pub resource: u32,
    pub scope: u32,
    pub name: u32,
    pub description: u32,
    pub unit: u32,
    pub metadata: Option<u32>,
    pub kind: u8,
    pub temporality: i32,
    pub monotonic: bool,
}

impl SeriesKey {
    /// Appends the key's bytes to `out`.
    pub(crate) fn write(&self, attributes: &[KeyValue], out: &mut Vec<u8>) {
        self.write_head(out);
        for kv in attributes {
            // Encoding into a Vec cannot fail.
            let _ = kv.encode_length_delimited(out);
        }
    }

    /// Appends the key's bytes for attributes the wire reader parsed: the
    /// same bytes [`SeriesKey::write`] gives for their prost decoding.
    fn write_wire(&self, attributes: &[AttrView<'_>], out: &mut Vec<u8>) {
        self.write_head(out);
        for a in attributes {
            encode_wire_attr(a, true, out);
        }
    }

    fn write_head(&self, out: &mut Vec<u8>) {
        for v in [
            self.resource,
            self.scope,
            self.name,
            self.description,
            self.unit,
            self.metadata.unwrap_or(u32::MAX),
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.push(self.kind);
        out.extend_from_slice(&self.temporality.to_le_bytes());
        out.push(u8::from(self.monotonic));
    }
}

/// Appends the protobuf encoding prost gives a `KeyValue` the wire reader
/// parsed as `a` (length-prefixed when `delimited`): the key when not empty,
/// then the value (always present, its one member always written).
fn encode_wire_attr(a: &AttrView<'_>, delimited: bool, out: &mut Vec<u8>) {
    use prost::encoding::{encode_varint, encoded_len_varint};
    let str_len = |n: usize| 1 + encoded_len_varint(n as u64) + n;
    let member = match &a.value {
        Val::Str(s) => str_len(s.len()),
        Val::Bytes(b) => str_len(b.len()),
        Val::Int(i) => 1 + encoded_len_varint(*i as u64),
        Val::Double(_) => 9,
        Val::Bool(_) => 2,
        Val::Other(kv) => {
            // Encoding into a Vec cannot fail.
            let _ = if delimited {
                kv.encode_length_delimited(out)
            } else {
                kv.encode(out)
            };
            return;
        }
    };
    if delimited {
        let key = if a.key.is_empty() { 0 } else { str_len(a.key.len()) };
        encode_varint((key + str_len(member)) as u64, out);
    }
    if !a.key.is_empty() {
        out.push(0x0a);
        encode_varint(a.key.len() as u64, out);
        out.extend_from_slice(a.key.as_bytes());
    }
    out.push(0x12);
    encode_varint(member as u64, out);
    match &a.value {
        Val::Str(s) => {
            out.push(0x0a);
            encode_varint(s.len() as u64, out);
            out.extend_from_slice(s.as_bytes());
        }
        Val::Bool(b) => out.extend_from_slice(&[0x10, u8::from(*b)]),
        Val::Int(i) => {
            out.push(0x18);
            encode_varint(*i as u64, out);
        }
        Val::Double(d) => {
            out.push(0x21);
            out.extend_from_slice(&d.to_bits().to_le_bytes());
        }
        Val::Bytes(b) => {
            out.push(0x3a);
            encode_varint(b.len() as u64, out);
            out.extend_from_slice(b);
        }
        Val::Other(_) => {}
    }
}

/// A point's attributes, from either decode path.
#[derive(Clone, Copy)]
enum Attrs<'a> {
    Prost(&'a [KeyValue]),
    Wire(&'a [AttrView<'a>]),
}

impl Default for Attrs<'_> {
    fn default() -> Self {
        Attrs::Prost(&[])
    }
}

/// The point-level fields of a row; `None` columns are null.
#[derive(Default)]
struct PointFields<'a> {
    attributes: Attrs<'a>,
    start: u64,
    time: u64,
    flags: u32,
    exemplars: &'a [Exemplar],
    value_int: Option<i64>,
    value_double: Option<f64>,
    count: Option<u64>,
    sum: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
    bucket_counts: Option<&'a [u64]>,
    explicit_bounds: Option<&'a [f64]>,
    exp_scale: Option<i32>,
    exp_zero_count: Option<u64>,
    exp_zero_threshold: Option<f64>,
    /// (offset, bucket counts).
    positive: Option<(i32, &'a [u64])>,
    negative: Option<(i32, &'a [u64])>,
    /// (quantiles, values).
    quantiles: Option<(&'a [f64], &'a [f64])>,
}

/// (attributes, start, time, flags, exemplars) of a point.
type PointCommon<'a> = (&'a [KeyValue], u64, u64, u32, &'a [Exemplar]);

/// The [`PointCommon`] fields of any data point type that has exemplars.
macro_rules! point_common {
    ($p:expr) => {
        (
            &$p.attributes[..],
            $p.start_time_unix_nano,
            $p.time_unix_nano,
            $p.flags,
            &$p.exemplars[..],
        )
    };
}

impl<'a> PointFields<'a> {
    /// A point with only the common fields set.
    fn with_common((attributes, start, time, flags, exemplars): PointCommon<'a>) -> Self {
        PointFields {
            attributes: Attrs::Prost(attributes),
            start,
            time,
            flags,
            exemplars,
            ..Default::default()
        }
    }

    /// The fields histograms and exponential histograms share: common point
    /// fields plus (count, sum, min, max).
    fn dist(common: PointCommon<'a>, (count, sum, min, max): (u64, Option<f64>, Option<f64>, Option<f64>)) -> Self {
        PointFields {
            count: Some(count),
            sum,
            min,
            max,
            ..Self::with_common(common)
        }
    }
}

/// Appends OTLP metric requests to the tables of one open block.
pub struct PointsBuilder {
    ctx: ContextBuilder,
    name: DictBuilder,
    description: DictBuilder,
    unit: DictBuilder,
    /// Metadata of each row as a key into `metadata_values` (one entry per
    /// distinct metadata list).
    metadata: Vec<Option<u32>>,
    metadata_values: BinaryBuilder,
    metadata_index: HashMap<Vec<u8>, u32, foldhash::fast::RandomState>,
    kind: Vec<u8>,
    temporality: Vec<i32>,
    monotonic: Vec<bool>,
    series_hash: Vec<u64>,
    /// Series row of each point.
    series_row: Vec<u32>,
    /// Series identity (resource, scope, metric keys, encoded attributes)
    /// to series row.
    series_index: HashMap<Vec<u8>, u32, foldhash::fast::RandomState>,
    series_key_bytes: usize,
    time: Vec<u64>,
    start: Vec<u64>,
    flags: Vec<u32>,
    value_int: Int64Builder,
    value_double: Float64Builder,
    count: UInt64Builder,
    sum: Float64Builder,
    min: Float64Builder,
    max: Float64Builder,
    bucket_counts: ListBuilder<UInt64Builder>,
    explicit_bounds: ListBuilder<Float64Builder>,
    exp_scale: Int32Builder,
    exp_zero_count: UInt64Builder,
    exp_zero_threshold: Float64Builder,
    pos_offset: Int32Builder,
    pos_counts: ListBuilder<UInt64Builder>,
    neg_offset: Int32Builder,
    neg_counts: ListBuilder<UInt64Builder>,
    quantiles: ListBuilder<Float64Builder>,
    quantile_values: ListBuilder<Float64Builder>,
    exemplars: BinaryBuilder,
    resource_id: Vec<u32>,
    scope_id: Vec<u32>,
    attrs: AttrBuilder,
    times: TimeRange,
    scratch: Vec<u8>,
    /// Point row of each `point_dists` row.
    dist_parent: Vec<u32>,
    /// The wire reader's views, kept between requests.
    views: wire::MetricsScratch,
}

impl Default for PointsBuilder {
    fn default() -> Self {
        PointsBuilder {
            ctx: ContextBuilder::default(),
            name: DictBuilder::default(),
            description: DictBuilder::default(),
            unit: DictBuilder::default(),
            metadata: Vec::new(),
            metadata_values: BinaryBuilder::new(),
            metadata_index: HashMap::default(),
            kind: Vec::new(),
            temporality: Vec::new(),
            monotonic: Vec::new(),
            series_hash: Vec::new(),
            series_row: Vec::new(),
            series_index: HashMap::default(),
            series_key_bytes: 0,
            time: Vec::new(),
            start: Vec::new(),
            flags: Vec::new(),
            value_int: Int64Builder::new(),
            value_double: Float64Builder::new(),
            count: UInt64Builder::new(),
            sum: Float64Builder::new(),
            min: Float64Builder::new(),
            max: Float64Builder::new(),
            bucket_counts: u64_list(),
            explicit_bounds: f64_list(),
            exp_scale: Int32Builder::new(),
            exp_zero_count: UInt64Builder::new(),
            exp_zero_threshold: Float64Builder::new(),
            pos_offset: Int32Builder::new(),
            pos_counts: u64_list(),
            neg_offset: Int32Builder::new(),
            neg_counts: u64_list(),
            quantiles: f64_list(),
            quantile_values: f64_list(),
            exemplars: BinaryBuilder::new(),
            resource_id: Vec::new(),
            scope_id: Vec::new(),
            attrs: AttrBuilder::default(),
            times: TimeRange::default(),
            scratch: Vec::new(),
            dist_parent: Vec::new(),
            views: wire::MetricsScratch::default(),
        }
    }
}

fn exemplars_of(m: &Metric) -> Vec<&Exemplar> {
    match &m.data {
        Some(Data::Gauge(g)) => g.data_points.iter().flat_map(|p| &p.exemplars).collect(),
        Some(Data::Sum(s)) => s.data_points.iter().flat_map(|p| &p.exemplars).collect(),
        Some(Data::Histogram(h)) => h.data_points.iter().flat_map(|p| &p.exemplars).collect(),
        Some(Data::ExponentialHistogram(h)) => h.data_points.iter().flat_map(|p| &p.exemplars).collect(),
        Some(Data::Summary(_)) | None => Vec::new(),
    }
}

/// Checks a request can be appended whole; returns the number of points.
pub fn validate(req: &ExportMetricsServiceRequest) -> Result<usize, ConvertError> {
    let mut n = 0;
    for rm in &req.resource_metrics {
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                for e in exemplars_of(m) {
                    check_id("exemplar trace_id", &e.trace_id, 16)?;
                    check_id("exemplar span_id", &e.span_id, 8)?;
                }
                n += match &m.data {
                    Some(Data::Gauge(g)) => g.data_points.len(),
                    Some(Data::Sum(s)) => s.data_points.len(),
                    Some(Data::Histogram(h)) => h.data_points.len(),
                    Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
                    Some(Data::Summary(s)) => s.data_points.len(),
                    None => 0,
                };
            }
        }
    }
    Ok(n)
}

/// True when the limits change nothing in a parsed request.
fn view_fits(view: &wire::MetricsView<'_>, limits: &Limits) -> bool {
    view.points
        .iter()
        .all(|p| limits.time_fits(p.time) && limits.wire_attrs_fit(&view.attrs[p.attrs.clone()]))
        && view
            .resources
            .iter()
            .all(|r| r.resource.as_ref().is_none_or(|r| limits.fits(&r.attributes)))
        && view
            .scopes
            .iter()
            .all(|s| s.scope.as_ref().is_none_or(|s| limits.fits(&s.attributes)))
}

impl std::fmt::Debug for PointsBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PointsBuilder")
            .field("rows", &self.time.len())
            .finish_non_exhaustive()
    }
}

impl PointsBuilder {
    /// Appends a request the wire reader parsed, exemplar ids checked first.
    fn append_checked(&mut self, view: &wire::MetricsView<'_>) -> Result<Appended, ConvertError> {
        for e in &view.exemplars {
            check_id("exemplar trace_id", &e.trace_id, 16)?;
            check_id("exemplar span_id", &e.span_id, 8)?;
        }
        self.append_view(view);
        Ok(Appended {
            rows: view.points.len(),
            ..Appended::default()
        })
    }

    /// [`SignalBuilder::append_limited`], with `gate` deciding which
    /// points' series may be added ([`super::gate_series`]) between the
    /// limits and the append; the points it refuses are counted in
    /// `series_refused` and left out of `kept`. `gate` is called once per
    /// request (hold a lock in it, not across the append).
    pub fn append_gated(
        &mut self,
        buf: &[u8],
        limits: &Limits,
        gate: impl FnOnce(&mut ExportMetricsServiceRequest) -> (usize, u64),
    ) -> Result<Appended, ConvertError> {
        let mut req = ExportMetricsServiceRequest::decode(buf).map_err(|e| ConvertError::Protobuf(e.to_string()))?;
        let mut out = Self::apply_limits(limits, &mut req);
        (out.series_refused, out.series_limit) = gate(&mut req);
        out.rows = self.append(&req)?;
        if out.too_old + out.too_new + out.series_refused > 0 {
            out.kept = Some(req.encode_to_vec());
        }
        Ok(out)
    }
}

impl SignalBuilder for PointsBuilder {
    type Request = ExportMetricsServiceRequest;
    const SIGNAL: Signal = Signal::Metrics;

    fn apply_limits(limits: &Limits, req: &mut ExportMetricsServiceRequest) -> Appended {
        limits.apply_metrics(req)
    }

    fn rows(&self) -> usize {
        self.time.len()
    }

    fn approx_bytes(&self) -> usize {
        self.time.len() * 48
            + self.series_hash.len() * 48
            + self.series_key_bytes
            + self.dist_parent.len() * 120
            + self.bucket_counts.values_ref().values_slice().len() * 8
            + self.explicit_bounds.values_ref().values_slice().len() * 8
            + self.pos_counts.values_ref().values_slice().len() * 8
            + self.neg_counts.values_ref().values_slice().len() * 8
            + self.quantiles.values_ref().values_slice().len() * 16
            + self.exemplars.values_slice().len()
            + self.metadata_values.values_slice().len()
            + self.name.value_bytes()
            + self.description.value_bytes()
            + self.unit.value_bytes()
            + self.attrs.approx_bytes()
            + self.ctx.approx_bytes()
    }

    fn append(&mut self, req: &ExportMetricsServiceRequest) -> Result<usize, ConvertError> {
        let n = validate(req)?;
        for rm in &req.resource_metrics {
            let rid = self.ctx.resource(rm.resource.as_ref(), &rm.schema_url);
            for sm in &rm.scope_metrics {
                let sid = self.ctx.scope(sm.scope.as_ref(), &sm.schema_url);
                for m in &sm.metrics {
                    self.append_metric(rid, sid, m);
                }
            }
        }
        Ok(n)
    }

    /// Appends an encoded `ExportMetricsServiceRequest`. Common shapes are
    /// read straight from the wire; anything else (and requests the limits
    /// change) is decoded by prost first. Either way the request is checked
    /// whole before anything is appended.
    fn append_limited(&mut self, buf: &[u8], limits: &Limits) -> Result<Appended, ConvertError> {
        let view = match wire::parse_metrics(buf, &mut self.views) {
            Fast::Done(view) if limits.is_none() || view_fits(&view, limits) => view,
            other => {
                if let Fast::Done(view) = other {
                    self.views.keep(view);
                }
                return super::limits::append_via_prost::<ExportMetricsServiceRequest>(
                    buf,
                    |req| limits.apply_metrics(req),
                    |req| self.append(req),
                );
            }
        };
        let appended = self.append_checked(&view);
        self.views.keep(view);
        appended
    }

    fn finish(&mut self) -> Result<TableSet, ConvertError> {
        let rows = self.time.len();
        let take32 = |v: &mut Vec<u32>| Arc::new(UInt32Array::from(std::mem::take(v))) as ArrayRef;
        let take64 = |v: &mut Vec<u64>| Arc::new(UInt64Array::from(std::mem::take(v))) as ArrayRef;
        let series: Vec<ArrayRef> = vec![
            self.name.finish()?,
            self.description.finish()?,
            self.unit.finish()?,
            {
                self.metadata_index.clear();
                let keys = UInt32Array::from(std::mem::take(&mut self.metadata));
                Arc::new(DictionaryArray::<UInt32Type>::try_new(
                    keys,
                    Arc::new(self.metadata_values.finish()),
                )?)
            },
            Arc::new(UInt8Array::from(std::mem::take(&mut self.kind))),
            Arc::new(Int32Array::from(std::mem::take(&mut self.temporality))),
            Arc::new(BooleanArray::from(std::mem::take(&mut self.monotonic))),
            take64(&mut self.series_hash),
            take32(&mut self.resource_id),
            take32(&mut self.scope_id),
        ];
        self.series_index.clear();
        self.series_key_bytes = 0;
        let cols: Vec<ArrayRef> = vec![
            take32(&mut self.series_row),
            take64(&mut self.time),
            take64(&mut self.start),
            take32(&mut self.flags),
            Arc::new(self.value_int.finish()),
            Arc::new(self.value_double.finish()),
            Arc::new(self.exemplars.finish()),
        ];
        let dists: Vec<ArrayRef> = vec![
            take32(&mut self.dist_parent),
            Arc::new(self.count.finish()),
            Arc::new(self.sum.finish()),
            Arc::new(self.min.finish()),
            Arc::new(self.max.finish()),
            Arc::new(self.bucket_counts.finish()),
            Arc::new(self.explicit_bounds.finish()),
            Arc::new(self.exp_scale.finish()),
            Arc::new(self.exp_zero_count.finish()),
            Arc::new(self.exp_zero_threshold.finish()),
            Arc::new(self.pos_offset.finish()),
            Arc::new(self.pos_counts.finish()),
            Arc::new(self.neg_offset.finish()),
            Arc::new(self.neg_counts.finish()),
            Arc::new(self.quantiles.finish()),
            Arc::new(self.quantile_values.finish()),
        ];
        let mut tables = vec![
            (schema::POINTS, schema::batch(&schema::points(), cols)?),
            (schema::POINT_DISTS, schema::batch(&schema::point_dists(), dists)?),
            (schema::SERIES, schema::batch(&schema::series(), series)?),
            (schema::SERIES_ATTRS, self.attrs.finish()?),
        ];
        self.ctx.finish(&mut tables)?;
        self.views = wire::MetricsScratch::default();
        let (min_time, max_time) = std::mem::take(&mut self.times).bounds();
        Ok(TableSet {
            signal: Signal::Metrics,
            tables,
            rows,
            min_time,
            max_time,
        })
    }
}

impl PointsBuilder {
    /// The metric-level fields of a metric's rows. Interns the metric's
    /// strings and metadata whether or not it has points, as both decode
    /// paths do.
    fn metric_fields(
        &mut self,
        (name, description, unit): (&str, &str, &str),
        metadata: &[KeyValue],
        (kind, temporality, monotonic): (u8, i32, bool),
    ) -> MetricFields {
        let metadata = (!metadata.is_empty()).then(|| {
            let encoded = KeyValueList {
                values: metadata.to_vec(),
            }
            .encode_to_vec();
            let next = self.metadata_index.len() as u32;
            *self.metadata_index.entry(encoded).or_insert_with_key(|bytes| {
                self.metadata_values.append_value(bytes);
                next
            })
        });
        MetricFields {
            name: self.name.intern(name),
            description: self.description.intern(description),
            unit: self.unit.intern(unit),
            metadata,
            name_hash: fnv1a(FNV_OFFSET, name.as_bytes()),
            kind,
            temporality,
            monotonic,
        }
    }

    fn append_metric(&mut self, rid: u32, sid: u32, m: &Metric) {
        let (kind, temporality, monotonic) = match &m.data {
            Some(Data::Gauge(_)) | None => (metric_type::GAUGE, 0, false),
            Some(Data::Sum(s)) => (metric_type::SUM, s.aggregation_temporality, s.is_monotonic),
            Some(Data::Histogram(h)) => (metric_type::HISTOGRAM, h.aggregation_temporality, false),
            Some(Data::ExponentialHistogram(h)) => (metric_type::EXP_HISTOGRAM, h.aggregation_temporality, false),
            Some(Data::Summary(_)) => (metric_type::SUMMARY, 0, false),
        };
        let f = self.metric_fields(
            (&m.name, &m.description, &m.unit),
            &m.metadata,
            (kind, temporality, monotonic),
        );
        match &m.data {
            Some(Data::Gauge(Gauge { data_points })) | Some(Data::Sum(Sum { data_points, .. })) => {
                for p in data_points {
                    self.row(rid, sid, &f, number_fields(p));
                }
            }
            Some(Data::Histogram(h)) => {
                for p in &h.data_points {
                    let pf = PointFields {
                        bucket_counts: Some(&p.bucket_counts),
                        explicit_bounds: Some(&p.explicit_bounds),
                        ..PointFields::dist(point_common!(p), (p.count, p.sum, p.min, p.max))
                    };
                    self.row(rid, sid, &f, pf);
                }
            }
            Some(Data::ExponentialHistogram(h)) => {
                for p in &h.data_points {
                    let pf = PointFields {
                        exp_scale: Some(p.scale),
                        exp_zero_count: Some(p.zero_count),
                        exp_zero_threshold: Some(p.zero_threshold),
                        positive: p.positive.as_ref().map(|b| (b.offset, b.bucket_counts.as_slice())),
                        negative: p.negative.as_ref().map(|b| (b.offset, b.bucket_counts.as_slice())),
                        ..PointFields::dist(point_common!(p), (p.count, p.sum, p.min, p.max))
                    };
                    self.row(rid, sid, &f, pf);
                }
            }
            Some(Data::Summary(s)) => {
                for p in &s.data_points {
                    let q: Vec<f64> = p.quantile_values.iter().map(|q| q.quantile).collect();
                    let qv: Vec<f64> = p.quantile_values.iter().map(|q| q.value).collect();
                    let pf = PointFields {
                        attributes: Attrs::Prost(&p.attributes),
                        start: p.start_time_unix_nano,
                        time: p.time_unix_nano,
                        flags: p.flags,
                        count: Some(p.count),
                        sum: Some(p.sum),
                        quantiles: Some((&q, &qv)),
                        ..Default::default()
                    };
                    self.row(rid, sid, &f, pf);
                }
            }
            None => {}
        }
    }

    /// Appends a request the wire reader parsed (ids checked).
    fn append_view(&mut self, view: &wire::MetricsView<'_>) {
        for res in &view.resources {
            let rid = self.ctx.resource(res.resource.as_ref(), res.schema_url);
            for scope in &view.scopes[res.scopes.clone()] {
                let sid = self.ctx.scope(scope.scope.as_ref(), scope.schema_url);
                for m in &view.metrics[scope.records.clone()] {
                    let kind = m.kind.unwrap_or(metric_type::GAUGE);
                    let (temporality, monotonic) = match kind {
                        metric_type::SUM => (m.temporality, m.monotonic),
                        metric_type::HISTOGRAM | metric_type::EXP_HISTOGRAM => (m.temporality, false),
                        _ => (0, false),
                    };
                    let f = self.metric_fields(
                        (m.name, m.description, m.unit),
                        &view.metadata[m.metadata.clone()],
                        (kind, temporality, monotonic),
                    );
                    for p in &view.points[m.points.clone()] {
                        let mut pf = PointFields {
                            attributes: Attrs::Wire(&view.attrs[p.attrs.clone()]),
                            start: p.start,
                            time: p.time,
                            flags: p.flags,
                            exemplars: &view.exemplars[p.exemplars.clone()],
                            ..PointFields::default()
                        };
                        match kind {
                            metric_type::GAUGE | metric_type::SUM => {
                                pf.value_int = p.value_int;
                                pf.value_double = p.value_double;
                            }
                            metric_type::HISTOGRAM => {
                                (pf.count, pf.sum, pf.min, pf.max) = (Some(p.count), p.sum, p.min, p.max);
                                pf.bucket_counts = Some(&view.u64s[p.bucket_counts.clone()]);
                                pf.explicit_bounds = Some(&view.f64s[p.explicit_bounds.clone()]);
                            }
                            metric_type::EXP_HISTOGRAM => {
                                (pf.count, pf.sum, pf.min, pf.max) = (Some(p.count), p.sum, p.min, p.max);
                                pf.exp_scale = Some(p.scale);
                                pf.exp_zero_count = Some(p.zero_count);
                                pf.exp_zero_threshold = Some(p.zero_threshold);
                                pf.positive = p.positive.as_ref().map(|(o, r)| (*o, &view.u64s[r.clone()]));
                                pf.negative = p.negative.as_ref().map(|(o, r)| (*o, &view.u64s[r.clone()]));
                            }
                            _ => {
                                (pf.count, pf.sum) = (Some(p.count), p.sum);
                                pf.quantiles = Some((
                                    &view.quantiles[p.quantiles.clone()],
                                    &view.quantile_values[p.quantiles.clone()],
                                ));
                            }
                        }
                        self.row(rid, sid, &f, pf);
                    }
                }
            }
        }
    }

    /// Series id: a stable hash of metric name, resource and point
    /// attributes (attribute order does not matter).
    fn series_id(&self, rid: u32, name_hash: u64, attributes: Attrs<'_>) -> u64 {
        let mut h = name_hash ^ self.ctx.resource_hash(rid).rotate_left(17);
        let mut buf = Vec::new();
        let mut add = |buf: &[u8]| h = h.wrapping_add(fnv1a(FNV_OFFSET, buf).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        match attributes {
            Attrs::Prost(kvs) => {
                for kv in kvs {
                    buf.clear();
                    let _ = kv.encode(&mut buf);
                    add(&buf);
                }
            }
            Attrs::Wire(attrs) => {
                for a in attrs {
                    buf.clear();
                    encode_wire_attr(a, false, &mut buf);
                    add(&buf);
                }
            }
        }
        h
    }

    /// The series row of a point: found by its identity, or added (with its
    /// attributes) when new.
    fn series_of(&mut self, rid: u32, sid: u32, m: &MetricFields, attributes: Attrs<'_>) -> u32 {
        self.scratch.clear();
        let key = SeriesKey {
            resource: rid,
            scope: sid,
            name: m.name,
            description: m.description,
            unit: m.unit,
            metadata: m.metadata,
            kind: m.kind,
            temporality: m.temporality,
            monotonic: m.monotonic,
        };
        match attributes {
            Attrs::Prost(kvs) => key.write(kvs, &mut self.scratch),
            Attrs::Wire(attrs) => key.write_wire(attrs, &mut self.scratch),
        }
        if let Some(&s) = self.series_index.get(self.scratch.as_slice()) {
            return s;
        }
        let s = self.series_hash.len() as u32;
        self.series_key_bytes += self.scratch.len();
        self.series_index.insert(self.scratch.clone(), s);
        let hash = self.series_id(rid, m.name_hash, attributes);
        self.name.push_key(m.name);
        self.description.push_key(m.description);
        self.unit.push_key(m.unit);
        self.metadata.push(m.metadata);
        self.kind.push(m.kind);
        self.temporality.push(m.temporality);
        self.monotonic.push(m.monotonic);
        self.series_hash.push(hash);
        self.resource_id.push(rid);
        self.scope_id.push(sid);
        match attributes {
            Attrs::Prost(kvs) => self.attrs.append_all(s, kvs),
            Attrs::Wire(attrs) => {
                for a in attrs {
                    self.attrs.append_val(s, a.key, &a.value);
                }
            }
        }
        s
    }

    fn row(&mut self, rid: u32, sid: u32, m: &MetricFields, p: PointFields<'_>) {
        let row = self.time.len() as u32;
        let series = self.series_of(rid, sid, m, p.attributes);
        self.series_row.push(series);
        self.time.push(p.time);
        self.times.add(p.time);
        self.start.push(p.start);
        self.flags.push(p.flags);
        self.value_int.append_option(p.value_int);
        self.value_double.append_option(p.value_double);
        if let Some(count) = p.count {
            self.dist_parent.push(row);
            self.dist(count, &p);
        }
        if p.exemplars.is_empty() {
            self.exemplars.append_null();
        } else {
            self.exemplars.append_value(
                Exemplars {
                    items: p.exemplars.to_vec(),
                }
                .encode_to_vec(),
            );
        }
    }

    /// Appends the distribution fields of a histogram, exponential
    /// histogram or summary point to `point_dists`.
    fn dist(&mut self, count: u64, p: &PointFields<'_>) {
        self.count.append_value(count);
        self.sum.append_option(p.sum);
        self.min.append_option(p.min);
        self.max.append_option(p.max);
        push_u64s(&mut self.bucket_counts, p.bucket_counts);
        push_f64s(&mut self.explicit_bounds, p.explicit_bounds);
        self.exp_scale.append_option(p.exp_scale);
        self.exp_zero_count.append_option(p.exp_zero_count);
        self.exp_zero_threshold.append_option(p.exp_zero_threshold);
        self.pos_offset.append_option(p.positive.map(|b| b.0));
        push_u64s(&mut self.pos_counts, p.positive.map(|b| b.1));
        self.neg_offset.append_option(p.negative.map(|b| b.0));
        push_u64s(&mut self.neg_counts, p.negative.map(|b| b.1));
        let (q, qv) = match p.quantiles {
            Some((q, v)) => (Some(q), Some(v)),
            None => (None, None),
        };
        push_f64s(&mut self.quantiles, q);
        push_f64s(&mut self.quantile_values, qv);
    }
}

fn number_fields(p: &NumberDataPoint) -> PointFields<'_> {
    let (value_int, value_double) = match p.value {
        Some(number_data_point::Value::AsInt(i)) => (Some(i), None),
        Some(number_data_point::Value::AsDouble(d)) => (None, Some(d)),
        None => (None, None),
    };
    PointFields {
        value_int,
        value_double,
        ..PointFields::with_common(point_common!(p))
    }
}

/// Typed view of the `points` table.
#[derive(Debug)]
pub struct PointColumns<'a> {
    /// `point_dists` row of each point, `u32::MAX` for number points.
    dist_row: Vec<u32>,
    /// `series` row of each point (checked in range).
    series_of: &'a UInt32Array,
    pub name: DictStr<'a>,
    pub description: DictStr<'a>,
    pub unit: DictStr<'a>,
    pub metadata: &'a DictionaryArray<UInt32Type>,
    metadata_values: &'a BinaryArray,
    pub kind: &'a UInt8Array,
    pub temporality: &'a Int32Array,
    pub monotonic: &'a BooleanArray,
    pub series: &'a UInt64Array,
    pub time: &'a UInt64Array,
    pub start: &'a UInt64Array,
    pub flags: &'a UInt32Array,
    pub value_int: &'a Int64Array,
    pub value_double: &'a Float64Array,
    pub count: &'a UInt64Array,
    pub sum: &'a Float64Array,
    pub min: &'a Float64Array,
    pub max: &'a Float64Array,
    pub bucket_counts: &'a ListArray,
    pub explicit_bounds: &'a ListArray,
    pub exp_scale: &'a Int32Array,
    pub exp_zero_count: &'a UInt64Array,
    pub exp_zero_threshold: &'a Float64Array,
    pub pos_offset: &'a Int32Array,
    pub pos_counts: &'a ListArray,
    pub neg_offset: &'a Int32Array,
    pub neg_counts: &'a ListArray,
    pub quantiles: &'a ListArray,
    pub quantile_values: &'a ListArray,
    pub exemplars: &'a BinaryArray,
    pub resource_id: &'a UInt32Array,
    pub scope_id: &'a UInt32Array,
}

impl<'a> PointColumns<'a> {
    /// Views `points` with its `point_dists` and `series`.
    pub fn new(b: &'a RecordBatch, d: &'a RecordBatch, sr: &'a RecordBatch) -> Result<Self, ConvertError> {
        let t = schema::POINTS;
        let dt = schema::POINT_DISTS;
        let st = schema::SERIES;
        // Row of each point's distribution fields (u32::MAX: none).
        let parents: &UInt32Array = col(d, dt, "parent")?;
        let mut dist_row = vec![u32::MAX; b.num_rows()];
        for (i, p) in parents.values().iter().enumerate() {
            let slot = dist_row
                .get_mut(*p as usize)
                .ok_or(ConvertError::BadReference { table: dt, row: i })?;
            *slot = i as u32;
        }
        let series_of: &UInt32Array = col(b, t, "series")?;
        if let Some(row) = series_of.values().iter().position(|&s| s as usize >= sr.num_rows()) {
            return Err(ConvertError::BadReference { table: t, row });
        }
        let metadata: &DictionaryArray<UInt32Type> = col(sr, st, "metric_metadata")?;
        let metadata_values =
            metadata
                .values()
                .as_any()
                .downcast_ref::<BinaryArray>()
                .ok_or(ConvertError::WrongType {
                    table: st,
                    column: "metric_metadata",
                })?;
        Ok(PointColumns {
            dist_row,
            series_of,
            name: DictStr::new(sr, st, "metric_name")?,
            description: DictStr::new(sr, st, "metric_description")?,
            unit: DictStr::new(sr, st, "metric_unit")?,
            metadata,
            metadata_values,
            kind: col(sr, st, "metric_type")?,
            temporality: col(sr, st, "temporality")?,
            monotonic: col(sr, st, "is_monotonic")?,
            series: col(sr, st, "series_id")?,
            time: col(b, t, "time_unix_nano")?,
            start: col(b, t, "start_time_unix_nano")?,
            flags: col(b, t, "flags")?,
            value_int: col(b, t, "value_int")?,
            value_double: col(b, t, "value_double")?,
            count: col(d, dt, "count")?,
            sum: col(d, dt, "sum")?,
            min: col(d, dt, "min")?,
            max: col(d, dt, "max")?,
            bucket_counts: col(d, dt, "bucket_counts")?,
            explicit_bounds: col(d, dt, "explicit_bounds")?,
            exp_scale: col(d, dt, "exp_scale")?,
            exp_zero_count: col(d, dt, "exp_zero_count")?,
            exp_zero_threshold: col(d, dt, "exp_zero_threshold")?,
            pos_offset: col(d, dt, "exp_positive_offset")?,
            pos_counts: col(d, dt, "exp_positive_counts")?,
            neg_offset: col(d, dt, "exp_negative_offset")?,
            neg_counts: col(d, dt, "exp_negative_counts")?,
            quantiles: col(d, dt, "quantiles")?,
            quantile_values: col(d, dt, "quantile_values")?,
            exemplars: col(b, t, "exemplars")?,
            resource_id: col(sr, st, "resource_id")?,
            scope_id: col(sr, st, "scope_id")?,
        })
    }

    /// The `series` row of point `row`.
    pub fn series_row(&self, row: usize) -> usize {
        self.series_of.value(row) as usize
    }

    fn bad(column: &'static str) -> ConvertError {
        ConvertError::WrongType {
            table: schema::POINTS,
            column,
        }
    }

    fn u64s(list: &ListArray, row: usize, column: &'static str) -> Result<Vec<u64>, ConvertError> {
        let v = list.value(row);
        Ok(v.as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or(Self::bad(column))?
            .values()
            .to_vec())
    }

    fn f64s(list: &ListArray, row: usize, column: &'static str) -> Result<Vec<f64>, ConvertError> {
        let v = list.value(row);
        Ok(v.as_any()
            .downcast_ref::<Float64Array>()
            .ok_or(Self::bad(column))?
            .values()
            .to_vec())
    }

    fn opt<T: arrow::datatypes::ArrowPrimitiveType>(
        a: &arrow::array::PrimitiveArray<T>,
        row: usize,
    ) -> Option<T::Native> {
        a.is_valid(row).then(|| a.value(row))
    }

    fn exemplars(&self, row: usize) -> Result<Vec<Exemplar>, ConvertError> {
        if self.exemplars.is_null(row) {
            return Ok(Vec::new());
        }
        Ok(Exemplars::decode(self.exemplars.value(row))
            .map_err(|_| Self::bad("exemplars"))?
            .items)
    }

    fn buckets(
        offset: &Int32Array,
        counts: &ListArray,
        row: usize,
        column: &'static str,
    ) -> Result<Option<Buckets>, ConvertError> {
        if offset.is_null(row) {
            return Ok(None);
        }
        Ok(Some(Buckets {
            offset: offset.value(row),
            bucket_counts: Self::u64s(counts, row, column)?,
        }))
    }

    /// The point at `row` as OTLP.
    pub fn point(&self, row: usize, attributes: Vec<KeyValue>) -> Result<Point, ConvertError> {
        let start_time_unix_nano = self.start.value(row);
        let time_unix_nano = self.time.value(row);
        let flags = self.flags.value(row);
        // Distribution fields of this point (read only for distribution kinds).
        let d = match self.dist_row.get(row) {
            Some(&d) if d != u32::MAX => d as usize,
            _ => usize::MAX,
        };
        let need = |column| if d == usize::MAX { Err(Self::bad(column)) } else { Ok(d) };
        Ok(match self.kind.value(self.series_row(row)) {
            metric_type::GAUGE | metric_type::SUM => {
                let value = if self.value_int.is_valid(row) {
                    Some(number_data_point::Value::AsInt(self.value_int.value(row)))
                } else {
                    Self::opt(self.value_double, row).map(number_data_point::Value::AsDouble)
                };
                Point::Number(NumberDataPoint {
                    attributes,
                    start_time_unix_nano,
                    time_unix_nano,
                    exemplars: self.exemplars(row)?,
                    flags,
                    value,
                })
            }
            metric_type::HISTOGRAM => Point::Histogram(HistogramDataPoint {
                attributes,
                start_time_unix_nano,
                time_unix_nano,
                count: Self::opt(self.count, need("count")?).ok_or(Self::bad("count"))?,
                sum: Self::opt(self.sum, need("sum")?),
                bucket_counts: Self::u64s(self.bucket_counts, need("bucket_counts")?, "bucket_counts")?,
                explicit_bounds: Self::f64s(self.explicit_bounds, need("explicit_bounds")?, "explicit_bounds")?,
                exemplars: self.exemplars(row)?,
                flags,
                min: Self::opt(self.min, need("min")?),
                max: Self::opt(self.max, need("max")?),
            }),
            metric_type::EXP_HISTOGRAM => Point::ExpHistogram(ExponentialHistogramDataPoint {
                attributes,
                start_time_unix_nano,
                time_unix_nano,
                count: Self::opt(self.count, need("count")?).ok_or(Self::bad("count"))?,
                sum: Self::opt(self.sum, need("sum")?),
                scale: Self::opt(self.exp_scale, need("exp_scale")?).ok_or(Self::bad("exp_scale"))?,
                zero_count: Self::opt(self.exp_zero_count, need("exp_zero_count")?)
                    .ok_or(Self::bad("exp_zero_count"))?,
                positive: Self::buckets(
                    self.pos_offset,
                    self.pos_counts,
                    need("exp_positive_counts")?,
                    "exp_positive_counts",
                )?,
                negative: Self::buckets(
                    self.neg_offset,
                    self.neg_counts,
                    need("exp_negative_counts")?,
                    "exp_negative_counts",
                )?,
                flags,
                exemplars: self.exemplars(row)?,
                min: Self::opt(self.min, need("min")?),
                max: Self::opt(self.max, need("max")?),
                zero_threshold: Self::opt(self.exp_zero_threshold, need("exp_zero_threshold")?)
                    .ok_or(Self::bad("exp_zero_threshold"))?,
            }),
            metric_type::SUMMARY => {
                let q = Self::f64s(self.quantiles, need("quantiles")?, "quantiles")?;
                let v = Self::f64s(self.quantile_values, need("quantile_values")?, "quantile_values")?;
                if q.len() != v.len() {
                    return Err(Self::bad("quantile_values"));
                }
                Point::Summary(SummaryDataPoint {
                    attributes,
                    start_time_unix_nano,
                    time_unix_nano,
                    count: Self::opt(self.count, need("count")?).ok_or(Self::bad("count"))?,
                    sum: Self::opt(self.sum, need("sum")?).ok_or(Self::bad("sum"))?,
                    quantile_values: q
                        .into_iter()
                        .zip(v)
                        .map(|(quantile, value)| ValueAtQuantile { quantile, value })
                        .collect(),
                    flags,
                })
            }
            _ => return Err(Self::bad("metric_type")),
        })
    }

    /// What identifies `row`'s metric: dictionary keys of name,
    /// description, unit and metadata, type, temporality, monotonicity.
    fn metric_key(&self, row: usize) -> MetricKey {
        let row = self.series_row(row);
        (
            self.name.key(row),
            self.description.key(row),
            self.unit.key(row),
            self.metadata.key(row),
            self.kind.value(row),
            self.temporality.value(row),
            self.monotonic.value(row),
        )
    }

    /// The metric (without points) that `row` belongs to.
    fn metric(&self, row: usize) -> Result<Metric, ConvertError> {
        let row = self.series_row(row);
        let metadata = match self.metadata.key(row) {
            None => Vec::new(),
            Some(k) if k < self.metadata_values.len() => {
                KeyValueList::decode(self.metadata_values.value(k))
                    .map_err(|_| Self::bad("metric_metadata"))?
                    .values
            }
            Some(_) => return Err(Self::bad("metric_metadata")),
        };
        Ok(Metric {
            name: self.name.get(row).unwrap_or("").to_owned(),
            description: self.description.get(row).unwrap_or("").to_owned(),
            unit: self.unit.get(row).unwrap_or("").to_owned(),
            metadata,
            data: None,
        })
    }
}

/// See [`PointColumns::metric_key`].
type MetricKey = (usize, usize, usize, Option<usize>, u8, i32, bool);

/// One data point of any type.
#[derive(Debug, Clone)]
pub enum Point {
    Number(NumberDataPoint),
    Histogram(HistogramDataPoint),
    ExpHistogram(ExponentialHistogramDataPoint),
    Summary(SummaryDataPoint),
}

fn add_point(m: &mut Metric, kind: u8, temporality: i32, monotonic: bool, p: Point) -> Result<(), ConvertError> {
    let data = m.data.get_or_insert_with(|| match kind {
        metric_type::GAUGE => Data::Gauge(Gauge::default()),
        metric_type::SUM => Data::Sum(Sum {
            data_points: Vec::new(),
            aggregation_temporality: temporality,
            is_monotonic: monotonic,
        }),
        metric_type::HISTOGRAM => Data::Histogram(Histogram {
            data_points: Vec::new(),
            aggregation_temporality: temporality,
        }),
        metric_type::EXP_HISTOGRAM => Data::ExponentialHistogram(ExponentialHistogram {
            data_points: Vec::new(),
            aggregation_temporality: temporality,
        }),
        _ => Data::Summary(Summary::default()),
    });
    match (data, p) {
        (Data::Gauge(g), Point::Number(p)) => g.data_points.push(p),
        (Data::Sum(s), Point::Number(p)) => s.data_points.push(p),
        (Data::Histogram(h), Point::Histogram(p)) => h.data_points.push(p),
        (Data::ExponentialHistogram(h), Point::ExpHistogram(p)) => h.data_points.push(p),
        (Data::Summary(s), Point::Summary(p)) => s.data_points.push(p),
        _ => return Err(PointColumns::bad("metric_type")),
    }
    Ok(())
}

/// A block's metric tables back as one OTLP request. Points of one metric
/// (same name, description, unit, metadata, type, temporality) under one
/// resource and scope are gathered under one `Metric`.
pub fn points_to_otlp(tables: &TableSet) -> Result<ExportMetricsServiceRequest, ConvertError> {
    points_to_otlp_grouped(tables, Grouper::default())
}

/// A block's metric tables back as one OTLP request whose data points, read
/// in order, are the table's rows in order (see
/// [`super::logs_to_otlp_in_row_order`]): a metric that recurs after another
/// one starts a new `Metric`.
pub fn points_to_otlp_in_row_order(tables: &TableSet) -> Result<ExportMetricsServiceRequest, ConvertError> {
    points_to_otlp_grouped(tables, Grouper::in_row_order())
}

fn points_to_otlp_grouped(
    tables: &TableSet,
    mut groups: Grouper<(usize, Point)>,
) -> Result<ExportMetricsServiceRequest, ConvertError> {
    let row_order = groups.keeps_row_order();
    let root = tables.get(schema::POINTS)?;
    let series = tables.get(schema::SERIES)?;
    let c = PointColumns::new(root, tables.get(schema::POINT_DISTS)?, series)?;
    let ctx = Contexts::read(tables)?;
    let series_attrs =
        AttrReader::new(tables.get(schema::SERIES_ATTRS)?, schema::SERIES_ATTRS)?.grouped(series.num_rows())?;
    for row in 0..root.num_rows() {
        let s = c.series_row(row);
        let point = c.point(row, series_attrs[s].clone())?;
        groups.push(c.resource_id.value(s), c.scope_id.value(s), (row, point));
    }
    let mut resource_metrics = Vec::with_capacity(groups.groups.len());
    for (rid, scopes) in groups.groups {
        let (resource, schema_url) = ctx.resource(rid, 0, schema::POINTS)?.clone();
        let mut scope_metrics = Vec::with_capacity(scopes.len());
        for (sid, points) in scopes {
            let (scope, schema_url) = ctx.scope(sid, 0, schema::POINTS)?.clone();
            let mut metrics: Vec<Metric> = Vec::new();
            // Keyed by dictionary keys, so a metric's strings and metadata
            // are decoded once per metric, not once per point.
            let mut index: HashMap<MetricKey, usize> = HashMap::new();
            for (row, point) in points {
                let key = c.metric_key(row);
                let (kind, temporality, monotonic) = (key.4, key.5, key.6);
                let i = match index.get(&key) {
                    // In row order only the last metric may take the point.
                    Some(&i) if !row_order || i + 1 == metrics.len() => i,
                    _ => {
                        metrics.push(c.metric(row)?);
                        index.insert(key, metrics.len() - 1);
                        metrics.len() - 1
                    }
                };
                add_point(&mut metrics[i], kind, temporality, monotonic, point)?;
            }
            scope_metrics.push(ScopeMetrics {
                scope,
                metrics,
                schema_url,
            });
        }
        resource_metrics.push(ResourceMetrics {
            resource,
            scope_metrics,
            schema_url,
        });
    }
    Ok(ExportMetricsServiceRequest { resource_metrics })
}

/// `tables` (a metrics block's) with the points ordered by series,
/// arrival order kept within a series, and the point distributions
/// following their points (their `parent` renumbered, in point order).
/// What a sealed block holds: a series' points are then one run of rows,
/// which a reader that wants a few series finds by binary search on the
/// `series` column instead of walking every point. Tables already in
/// that order are returned as they are.
pub fn points_by_series(tables: TableSet) -> Result<TableSet, ConvertError> {
    let p = schema::POINTS;
    let points = tables.get(p)?;
    let of: &UInt32Array = col(points, p, "series")?;
    let of = of.values();
    if of.windows(2).all(|w| w[0] <= w[1]) {
        return Ok(tables);
    }
    let n_series = tables.get(schema::SERIES)?.num_rows();
    // A counting sort: stable, one pass to count and one to place.
    let mut start = vec![0u32; n_series + 1];
    for (row, &s) in of.iter().enumerate() {
        let slot = start
            .get_mut(s as usize + 1)
            .ok_or(ConvertError::BadReference { table: p, row })?;
        *slot += 1;
    }
    for i in 1..start.len() {
        start[i] += start[i - 1];
    }
    // `order[new] = old` and `new_row[old] = new`.
    let mut order = vec![0u32; of.len()];
    let mut new_row = vec![0u32; of.len()];
    for (row, &s) in of.iter().enumerate() {
        let at = &mut start[s as usize];
        order[*at as usize] = row as u32;
        new_row[row] = *at;
        *at += 1;
    }
    let points = arrow::compute::take_record_batch(points, &UInt32Array::from(order))?;

    let d = schema::POINT_DISTS;
    let dists = tables.get(d)?;
    let parent: &UInt32Array = col(dists, d, "parent")?;
    let mut by_point: Vec<(u32, u32)> = Vec::with_capacity(parent.len());
    for (row, &old) in parent.values().iter().enumerate() {
        let new = *new_row
            .get(old as usize)
            .ok_or(ConvertError::BadReference { table: d, row })?;
        by_point.push((new, row as u32));
    }
    by_point.sort_unstable();
    let dist_order = UInt32Array::from_iter_values(by_point.iter().map(|&(_, row)| row));
    let dists = arrow::compute::take_record_batch(dists, &dist_order)?;
    let parent_at = dists.schema().index_of("parent")?;
    let mut columns = dists.columns().to_vec();
    columns[parent_at] = Arc::new(UInt32Array::from_iter_values(by_point.iter().map(|&(new, _)| new)));
    let dists = RecordBatch::try_new(dists.schema(), columns)?;

    let mut tables = tables;
    for (name, batch) in &mut tables.tables {
        if *name == p {
            *batch = points.clone();
        } else if *name == d {
            *batch = dists.clone();
        }
    }
    Ok(tables)
}
