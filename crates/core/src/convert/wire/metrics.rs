//! `ExportMetricsServiceRequest` read from the wire: metrics and their data
//! points of every kind, as views borrowing the request bytes. Repeated
//! numbers (bucket counts, bounds, quantiles) are copied into pools, packed
//! or not, so each point's lists are plain slices. Exemplars and metric
//! metadata are rare and never filtered on: prost decodes those.

use std::ops::Range;

use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::Exemplar;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::{AttrView, Fast, Reader, ResourceView, ScopeView, W, parse_attr, parse_group, recycle};
use crate::schema::metric_type;

#[derive(Debug)]
pub(crate) struct MetricView<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub unit: &'a str,
    /// Into [`MetricsView::metadata`].
    pub metadata: Range<usize>,
    /// `metric_type` of the data, `None` when the metric has none.
    pub kind: Option<u8>,
    pub temporality: i32,
    pub monotonic: bool,
    /// Into [`MetricsView::points`].
    pub points: Range<usize>,
}

/// One data point of any kind; fields a kind does not have stay at their
/// defaults and are not read for it.
#[derive(Debug, Default)]
pub(crate) struct PointView {
    /// Into [`MetricsView::attrs`].
    pub attrs: Range<usize>,
    pub start: u64,
    pub time: u64,
    pub flags: u32,
    /// Into [`MetricsView::exemplars`].
    pub exemplars: Range<usize>,
    pub value_int: Option<i64>,
    pub value_double: Option<f64>,
    pub count: u64,
    pub sum: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Into [`MetricsView::u64s`].
    pub bucket_counts: Range<usize>,
    /// Into [`MetricsView::f64s`].
    pub explicit_bounds: Range<usize>,
    pub scale: i32,
    pub zero_count: u64,
    pub zero_threshold: f64,
    /// (offset, counts into [`MetricsView::u64s`]).
    pub positive: Option<(i32, Range<usize>)>,
    pub negative: Option<(i32, Range<usize>)>,
    /// Into [`MetricsView::quantiles`] and [`MetricsView::quantile_values`].
    pub quantiles: Range<usize>,
}

/// A whole metrics export request, parsed and checked, borrowing from the
/// bytes.
#[derive(Debug, Default)]
pub(crate) struct MetricsView<'a> {
    pub resources: Vec<ResourceView<'a>>,
    /// `records` of each scope index [`MetricsView::metrics`].
    pub scopes: Vec<ScopeView<'a>>,
    pub metrics: Vec<MetricView<'a>>,
    pub points: Vec<PointView>,
    pub attrs: Vec<AttrView<'a>>,
    pub exemplars: Vec<Exemplar>,
    pub metadata: Vec<KeyValue>,
    pub u64s: Vec<u64>,
    pub f64s: Vec<f64>,
    pub quantiles: Vec<f64>,
    pub quantile_values: Vec<f64>,
}

/// The allocations of a [`MetricsView`], kept by the builder between
/// requests (and dropped when it seals).
#[derive(Debug, Default)]
pub(crate) struct MetricsScratch {
    resources: Vec<ResourceView<'static>>,
    scopes: Vec<ScopeView<'static>>,
    metrics: Vec<MetricView<'static>>,
    points: Vec<PointView>,
    attrs: Vec<AttrView<'static>>,
    exemplars: Vec<Exemplar>,
    metadata: Vec<KeyValue>,
    u64s: Vec<u64>,
    f64s: Vec<f64>,
    quantiles: Vec<f64>,
    quantile_values: Vec<f64>,
}

impl MetricsScratch {
    fn take<'a>(&mut self) -> MetricsView<'a> {
        MetricsView {
            resources: recycle(std::mem::take(&mut self.resources)),
            scopes: recycle(std::mem::take(&mut self.scopes)),
            metrics: recycle(std::mem::take(&mut self.metrics)),
            points: recycle(std::mem::take(&mut self.points)),
            attrs: recycle(std::mem::take(&mut self.attrs)),
            exemplars: recycle(std::mem::take(&mut self.exemplars)),
            metadata: recycle(std::mem::take(&mut self.metadata)),
            u64s: recycle(std::mem::take(&mut self.u64s)),
            f64s: recycle(std::mem::take(&mut self.f64s)),
            quantiles: recycle(std::mem::take(&mut self.quantiles)),
            quantile_values: recycle(std::mem::take(&mut self.quantile_values)),
        }
    }

    /// Keeps the allocations of a view that is no longer needed.
    pub(crate) fn keep(&mut self, v: MetricsView<'_>) {
        self.resources = recycle(v.resources);
        self.scopes = recycle(v.scopes);
        self.metrics = recycle(v.metrics);
        self.points = recycle(v.points);
        self.attrs = recycle(v.attrs);
        self.exemplars = recycle(v.exemplars);
        self.metadata = recycle(v.metadata);
        self.u64s = recycle(v.u64s);
        self.f64s = recycle(v.f64s);
        self.quantiles = recycle(v.quantiles);
        self.quantile_values = recycle(v.quantile_values);
    }
}

/// Parses an `ExportMetricsServiceRequest` into views built in `scratch`'s
/// allocations; [`Fast::Fallback`] for anything prost should decide
/// (malformed bytes included).
pub(crate) fn parse_metrics<'a>(buf: &'a [u8], scratch: &mut MetricsScratch) -> Fast<MetricsView<'a>> {
    let mut v = scratch.take();
    v.points.reserve(buf.len() / 64);
    v.attrs.reserve(buf.len() / 32);
    match parse_request(buf, &mut v) {
        Some(()) => Fast::Done(v),
        None => {
            scratch.keep(v);
            Fast::Fallback
        }
    }
}

fn parse_request<'a>(buf: &'a [u8], v: &mut MetricsView<'a>) -> W<()> {
    let mut r = Reader::new(buf);
    while !r.done() {
        match r.key()? {
            (1, 2) => parse_resource_metrics(r.bytes()?, v)?,
            (1, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    Some(())
}

fn parse_resource_metrics<'a>(buf: &'a [u8], v: &mut MetricsView<'a>) -> W<()> {
    let first = v.scopes.len();
    let (resource, schema_url) = parse_group::<Resource, _>(buf, v, parse_scope_metrics)?;
    v.resources.push(ResourceView {
        resource,
        schema_url,
        scopes: first..v.scopes.len(),
    });
    Some(())
}

fn parse_scope_metrics<'a>(buf: &'a [u8], v: &mut MetricsView<'a>) -> W<()> {
    let first = v.metrics.len();
    let (scope, schema_url) = parse_group::<InstrumentationScope, _>(buf, v, parse_metric)?;
    v.scopes.push(ScopeView {
        scope,
        schema_url,
        records: first..v.metrics.len(),
    });
    Some(())
}

fn parse_metric<'a>(buf: &'a [u8], v: &mut MetricsView<'a>) -> W<()> {
    let mut r = Reader::new(buf);
    let metadata = v.metadata.len();
    let mut m = MetricView {
        name: "",
        description: "",
        unit: "",
        metadata: 0..0,
        kind: None,
        temporality: 0,
        monotonic: false,
        points: 0..0,
    };
    let points = v.points.len();
    while !r.done() {
        let (field, wire) = r.key()?;
        let kind = match field {
            5 => metric_type::GAUGE,
            7 => metric_type::SUM,
            9 => metric_type::HISTOGRAM,
            10 => metric_type::EXP_HISTOGRAM,
            11 => metric_type::SUMMARY,
            _ => {
                match (field, wire) {
                    (1, 2) => m.name = r.str()?,
                    (2, 2) => m.description = r.str()?,
                    (3, 2) => m.unit = r.str()?,
                    (12, 2) => v.metadata.push(KeyValue::decode(r.bytes()?).ok()?),
                    (1..=3 | 12, _) => return None,
                    (_, wire) => r.skip(wire)?,
                }
                continue;
            }
        };
        // A second data member would replace or merge into the first.
        if wire != 2 || m.kind.replace(kind).is_some() {
            return None;
        }
        let (temporality, monotonic) = parse_data(kind, r.bytes()?, v)?;
        m.temporality = temporality;
        m.monotonic = monotonic;
    }
    m.metadata = metadata..v.metadata.len();
    m.points = points..v.points.len();
    v.metrics.push(m);
    Some(())
}

/// Parses a Gauge, Sum, Histogram, ExponentialHistogram or Summary: its
/// points, and (aggregation temporality, monotonic) where it has them.
fn parse_data<'a>(kind: u8, buf: &'a [u8], v: &mut MetricsView<'a>) -> W<(i32, bool)> {
    let mut r = Reader::new(buf);
    let (mut temporality, mut monotonic) = (0, false);
    let has_temporality = matches!(
        kind,
        metric_type::SUM | metric_type::HISTOGRAM | metric_type::EXP_HISTOGRAM
    );
    while !r.done() {
        match r.key()? {
            (1, 2) => {
                let p = r.bytes()?;
                let point = match kind {
                    metric_type::GAUGE | metric_type::SUM => parse_number(p, v)?,
                    metric_type::HISTOGRAM => parse_histogram(p, v)?,
                    metric_type::EXP_HISTOGRAM => parse_exp_histogram(p, v)?,
                    _ => parse_summary(p, v)?,
                };
                v.points.push(point);
            }
            (2, 0) if has_temporality => temporality = r.varint()? as i32,
            (3, 0) if kind == metric_type::SUM => monotonic = r.varint()? != 0,
            (1, _) => return None,
            (2, _) if has_temporality => return None,
            (3, _) if kind == metric_type::SUM => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    // Gauges and summaries have no temporality: the builder files them as 0.
    Some((temporality, monotonic))
}

fn f64_of(r: &mut Reader<'_>) -> W<f64> {
    r.fixed64().map(f64::from_bits)
}

fn exemplar<'a>(buf: &'a [u8], v: &mut MetricsView<'a>) -> W<()> {
    v.exemplars.push(Exemplar::decode(buf).ok()?);
    Some(())
}

fn parse_number<'a>(buf: &'a [u8], v: &mut MetricsView<'a>) -> W<PointView> {
    let mut r = Reader::new(buf);
    let (attrs, exemplars) = (v.attrs.len(), v.exemplars.len());
    let mut p = PointView::default();
    while !r.done() {
        match r.key()? {
            (7, 2) => {
                let kv = r.bytes()?;
                v.attrs.push(parse_attr(kv, None)?);
            }
            (2, 1) => p.start = r.fixed64()?,
            (3, 1) => p.time = r.fixed64()?,
            // A oneof: the last member on the wire wins, as in prost.
            (4, 1) => {
                p.value_double = Some(f64_of(&mut r)?);
                p.value_int = None;
            }
            (6, 1) => {
                p.value_int = Some(r.fixed64()? as i64);
                p.value_double = None;
            }
            (5, 2) => exemplar(r.bytes()?, v)?,
            (8, 0) => p.flags = r.varint()? as u32,
            (2..=8, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    p.attrs = attrs..v.attrs.len();
    p.exemplars = exemplars..v.exemplars.len();
    Some(p)
}

/// Appends a repeated fixed64 or double (packed or one element) to `out`.
fn fixed64s<T>(r: &mut Reader<'_>, wire: u8, out: &mut Vec<T>, f: fn(u64) -> T) -> W<()> {
    match wire {
        1 => out.push(f(r.fixed64()?)),
        2 => {
            let b = r.bytes()?;
            if b.len() % 8 != 0 {
                return None;
            }
            out.extend(
                b.chunks_exact(8)
                    .map(|c| f(u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))),
            );
        }
        _ => return None,
    }
    Some(())
}

fn parse_histogram<'a>(buf: &'a [u8], v: &mut MetricsView<'a>) -> W<PointView> {
    let mut r = Reader::new(buf);
    let (attrs, exemplars, counts, bounds) = (v.attrs.len(), v.exemplars.len(), v.u64s.len(), v.f64s.len());
    let mut p = PointView::default();
    while !r.done() {
        match r.key()? {
            (9, 2) => {
                let kv = r.bytes()?;
                v.attrs.push(parse_attr(kv, None)?);
            }
            (2, 1) => p.start = r.fixed64()?,
            (3, 1) => p.time = r.fixed64()?,
            (4, 1) => p.count = r.fixed64()?,
            (5, 1) => p.sum = Some(f64_of(&mut r)?),
            (6, wire @ (1 | 2)) => fixed64s(&mut r, wire, &mut v.u64s, |x| x)?,
            (7, wire @ (1 | 2)) => fixed64s(&mut r, wire, &mut v.f64s, f64::from_bits)?,
            (8, 2) => exemplar(r.bytes()?, v)?,
            (10, 0) => p.flags = r.varint()? as u32,
            (11, 1) => p.min = Some(f64_of(&mut r)?),
            (12, 1) => p.max = Some(f64_of(&mut r)?),
            (2..=12, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    p.attrs = attrs..v.attrs.len();
    p.exemplars = exemplars..v.exemplars.len();
    p.bucket_counts = counts..v.u64s.len();
    p.explicit_bounds = bounds..v.f64s.len();
    Some(p)
}

fn zigzag32(v: u64) -> i32 {
    let v = v as u32;
    ((v >> 1) as i32) ^ -((v & 1) as i32)
}

fn parse_buckets(buf: &[u8], out: &mut Vec<u64>) -> W<(i32, Range<usize>)> {
    let mut r = Reader::new(buf);
    let first = out.len();
    let mut offset = 0;
    while !r.done() {
        match r.key()? {
            (1, 0) => offset = zigzag32(r.varint()?),
            (2, 0) => out.push(r.varint()?),
            (2, 2) => {
                let mut packed = Reader::new(r.bytes()?);
                while !packed.done() {
                    out.push(packed.varint()?);
                }
            }
            (1 | 2, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    Some((offset, first..out.len()))
}

fn parse_exp_histogram<'a>(buf: &'a [u8], v: &mut MetricsView<'a>) -> W<PointView> {
    let mut r = Reader::new(buf);
    let (attrs, exemplars) = (v.attrs.len(), v.exemplars.len());
    let mut p = PointView::default();
    while !r.done() {
        match r.key()? {
            (1, 2) => {
                let kv = r.bytes()?;
                v.attrs.push(parse_attr(kv, None)?);
            }
            (2, 1) => p.start = r.fixed64()?,
            (3, 1) => p.time = r.fixed64()?,
            (4, 1) => p.count = r.fixed64()?,
            (5, 1) => p.sum = Some(f64_of(&mut r)?),
            (6, 0) => p.scale = zigzag32(r.varint()?),
            (7, 1) => p.zero_count = r.fixed64()?,
            // A second Buckets would merge into the first: prost decides.
            (8, 2) if p.positive.is_none() => p.positive = Some(parse_buckets(r.bytes()?, &mut v.u64s)?),
            (9, 2) if p.negative.is_none() => p.negative = Some(parse_buckets(r.bytes()?, &mut v.u64s)?),
            (10, 0) => p.flags = r.varint()? as u32,
            (11, 2) => exemplar(r.bytes()?, v)?,
            (12, 1) => p.min = Some(f64_of(&mut r)?),
            (13, 1) => p.max = Some(f64_of(&mut r)?),
            (14, 1) => p.zero_threshold = f64_of(&mut r)?,
            (1..=14, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    p.attrs = attrs..v.attrs.len();
    p.exemplars = exemplars..v.exemplars.len();
    Some(p)
}

fn parse_summary<'a>(buf: &'a [u8], v: &mut MetricsView<'a>) -> W<PointView> {
    let mut r = Reader::new(buf);
    let (attrs, quantiles) = (v.attrs.len(), v.quantiles.len());
    let mut p = PointView {
        sum: Some(0.0),
        ..PointView::default()
    };
    while !r.done() {
        match r.key()? {
            (7, 2) => {
                let kv = r.bytes()?;
                v.attrs.push(parse_attr(kv, None)?);
            }
            (2, 1) => p.start = r.fixed64()?,
            (3, 1) => p.time = r.fixed64()?,
            (4, 1) => p.count = r.fixed64()?,
            (5, 1) => p.sum = Some(f64_of(&mut r)?),
            (6, 2) => {
                let mut q = Reader::new(r.bytes()?);
                let (mut quantile, mut value) = (0.0, 0.0);
                while !q.done() {
                    match q.key()? {
                        (1, 1) => quantile = f64_of(&mut q)?,
                        (2, 1) => value = f64_of(&mut q)?,
                        (1 | 2, _) => return None,
                        (_, wire) => q.skip(wire)?,
                    }
                }
                v.quantiles.push(quantile);
                v.quantile_values.push(value);
            }
            (8, 0) => p.flags = r.varint()? as u32,
            (2..=8, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    p.attrs = attrs..v.attrs.len();
    p.quantiles = quantiles..v.quantiles.len();
    Some(p)
}
