//! Attribute limits an ingester applies before appending: at most
//! `max_attrs` attributes per record, span, event, link, resource and scope
//! (the rest dropped and added to that item's `dropped_attributes_count`, as
//! the OTLP data model allows) and string / bytes values cut to
//! `max_value_bytes` (at a UTF-8 boundary). A key longer than
//! `max_value_bytes` drops its attribute.
//!
//! Metric data points are different: their attributes are the series'
//! identity and OTLP gives points no dropped count, so a point over either
//! limit is **rejected** (reported as a partial success), the way Mimir
//! refuses series with too many or too long labels.
//!
//! An optional time [`TimeWindow`] rejects records, spans and points whose
//! time falls outside it (Loki's `reject_old_samples_max_age` and
//! `creation_grace_period`): a log record by its time (its observed time
//! when unset), a span by its start and end, a point by its time. When a
//! request loses rows to the window, [`Appended::kept`] holds the request
//! re-encoded without them, which is what a write-ahead log must keep so a
//! replay (which applies no window) rebuilds exactly the accepted rows.

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::wire::{AttrView, Val};

/// Limits on attributes and times; [`Limits::NONE`] applies none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_attrs: usize,
    pub max_value_bytes: usize,
    /// Accepted times; `None` accepts every time.
    pub window: Option<TimeWindow>,
}

/// Accepted record times, Unix nanoseconds, inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeWindow {
    pub min_ns: u64,
    pub max_ns: u64,
}

/// Where a time falls against a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fit {
    In,
    Old,
    New,
}

impl TimeWindow {
    fn fit(&self, t: u64) -> Fit {
        if t < self.min_ns {
            Fit::Old
        } else if t > self.max_ns {
            Fit::New
        } else {
            Fit::In
        }
    }

    /// True when `t` is inside.
    pub fn contains(&self, t: u64) -> bool {
        self.fit(t) == Fit::In
    }
}

/// A log record's time: its own, or its observed time when unset.
pub(crate) fn log_time(time: u64, observed: u64) -> u64 {
    if time != 0 { time } else { observed }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::NONE
    }
}

/// What an append did beyond appending.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Appended {
    /// Root rows appended.
    pub rows: usize,
    /// Root rows (metric data points) refused for their attributes.
    pub rejected: usize,
    /// Attributes dropped over `max_attrs` (or for an over-long key).
    pub dropped_attrs: u64,
    /// Values cut to `max_value_bytes`.
    pub truncated_values: u64,
    /// Root rows refused for a time before the window.
    pub too_old: usize,
    /// Root rows refused for a time after the window.
    pub too_new: usize,
    /// Metric data points of new series refused by a series gate (an
    /// ingester's per-tenant `max_series`, [`gate_series`]).
    pub series_refused: usize,
    /// The series limit that refused them (for the message).
    pub series_limit: u64,
    /// When the window or a series gate refused rows: the request
    /// re-encoded without them (what a WAL keeps).
    pub kept: Option<Vec<u8>>,
}

/// The reference path of an append: `buf` decoded by prost, the limits
/// applied by `limit`, the rows appended by `append`; when the window
/// refused rows, the request without them is kept (what a WAL keeps).
pub(crate) fn append_via_prost<R: Message + Default>(
    buf: &[u8],
    limit: impl FnOnce(&mut R) -> Appended,
    append: impl FnOnce(&R) -> Result<usize, super::ConvertError>,
) -> Result<Appended, super::ConvertError> {
    let mut req = R::decode(buf).map_err(|e| super::ConvertError::Protobuf(e.to_string()))?;
    let mut out = limit(&mut req);
    out.rows = append(&req)?;
    if out.too_old + out.too_new > 0 {
        out.kept = Some(req.encode_to_vec());
    }
    Ok(out)
}

impl Appended {
    /// A one-line account for an OTLP partial-success `error_message`, or
    /// `None` when the limits changed nothing.
    pub fn message(&self, limits: &Limits) -> Option<String> {
        let mut parts = Vec::new();
        if self.too_old > 0 {
            parts.push(format!(
                "{} rejected: timestamp older than the accepted window (--max-past)",
                self.too_old
            ));
        }
        if self.too_new > 0 {
            parts.push(format!(
                "{} rejected: timestamp newer than the accepted window (--max-future)",
                self.too_new
            ));
        }
        if self.rejected > 0 {
            parts.push(format!(
                "{} data points rejected: more than {} attributes or an attribute longer than {} bytes",
                self.rejected, limits.max_attrs, limits.max_value_bytes
            ));
        }
        if self.series_refused > 0 {
            parts.push(format!(
                "{} data points rejected: their series are new and the tenant already has its limit of {} active series (max_series, per ingester)",
                self.series_refused, self.series_limit
            ));
        }
        if self.dropped_attrs > 0 {
            parts.push(format!(
                "{} attributes dropped over the limit of {} per item (counted in dropped_attributes_count)",
                self.dropped_attrs, limits.max_attrs
            ));
        }
        if self.truncated_values > 0 {
            parts.push(format!(
                "{} attribute values truncated to {} bytes",
                self.truncated_values, limits.max_value_bytes
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

impl Appended {
    /// Root rows refused for any reason (an OTLP partial success's count).
    pub fn rejected_total(&self) -> usize {
        self.rejected + self.too_old + self.too_new + self.series_refused
    }

    fn count(&mut self, fit: Fit) -> bool {
        match fit {
            Fit::In => return true,
            Fit::Old => self.too_old += 1,
            Fit::New => self.too_new += 1,
        }
        false
    }
}

impl Limits {
    pub const NONE: Limits = Limits {
        max_attrs: usize::MAX,
        max_value_bytes: usize::MAX,
        window: None,
    };

    /// The same limits without a time window.
    pub fn without_window(self) -> Limits {
        Limits { window: None, ..self }
    }

    /// True when `time` is inside the window (or there is none).
    pub(crate) fn time_fits(&self, time: u64) -> bool {
        self.window.is_none_or(|w| w.contains(time))
    }

    fn fit(&self, t: u64) -> Fit {
        self.window.map_or(Fit::In, |w| w.fit(t))
    }

    pub fn is_none(&self) -> bool {
        *self == Limits::NONE
    }

    /// True when a list of attributes the wire reader parsed is within the
    /// limits (so the fast path can append it untouched).
    pub(crate) fn wire_attrs_fit(&self, attrs: &[AttrView<'_>]) -> bool {
        attrs.len() <= self.max_attrs
            && attrs.iter().all(|a| {
                a.key.len() <= self.max_value_bytes
                    && match &a.value {
                        Val::Str(s) => s.len() <= self.max_value_bytes,
                        Val::Bytes(b) => b.len() <= self.max_value_bytes,
                        Val::Int(_) | Val::Double(_) | Val::Bool(_) => true,
                        // Conservative: a nested value's encoding bounds its strings.
                        Val::Other(kv) => kv.encoded_len() <= self.max_value_bytes,
                    }
            })
    }

    /// True when a resource or scope needs no change.
    pub(crate) fn fits(&self, attrs: &[KeyValue]) -> bool {
        attrs.len() <= self.max_attrs
            && attrs
                .iter()
                .all(|kv| kv.key.len() <= self.max_value_bytes && self.value_fits(kv.value.as_ref()))
    }

    fn value_fits(&self, v: Option<&AnyValue>) -> bool {
        match v.and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(s)) => s.len() <= self.max_value_bytes,
            Some(Value::BytesValue(b)) => b.len() <= self.max_value_bytes,
            Some(Value::ArrayValue(a)) => a.values.iter().all(|v| self.value_fits(Some(v))),
            Some(Value::KvlistValue(l)) => l.values.iter().all(|kv| self.value_fits(kv.value.as_ref())),
            _ => true,
        }
    }

    /// Applies the limits to one item's attributes, adding what it drops to
    /// `dropped`.
    fn limit(&self, attrs: &mut Vec<KeyValue>, dropped: &mut u32, out: &mut Appended) {
        if self.fits(attrs) {
            return;
        }
        let before = attrs.len();
        attrs.retain(|kv| kv.key.len() <= self.max_value_bytes);
        attrs.truncate(self.max_attrs);
        let gone = before - attrs.len();
        *dropped = dropped.saturating_add(u32::try_from(gone).unwrap_or(u32::MAX));
        out.dropped_attrs += gone as u64;
        for kv in attrs.iter_mut() {
            if let Some(v) = kv.value.as_mut() {
                self.cut(v, out);
            }
        }
    }

    fn cut(&self, v: &mut AnyValue, out: &mut Appended) {
        match v.value.as_mut() {
            Some(Value::StringValue(s)) if s.len() > self.max_value_bytes => {
                let mut end = self.max_value_bytes;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                s.truncate(end);
                out.truncated_values += 1;
            }
            Some(Value::BytesValue(b)) if b.len() > self.max_value_bytes => {
                b.truncate(self.max_value_bytes);
                out.truncated_values += 1;
            }
            Some(Value::ArrayValue(a)) => a.values.iter_mut().for_each(|v| self.cut(v, out)),
            Some(Value::KvlistValue(l)) => l
                .values
                .iter_mut()
                .filter_map(|kv| kv.value.as_mut())
                .for_each(|v| self.cut(v, out)),
            _ => {}
        }
    }

    /// Applies the limits to a resource and a scope.
    pub(crate) fn context(
        &self,
        resource: Option<&mut Resource>,
        scope: Option<&mut InstrumentationScope>,
        out: &mut Appended,
    ) {
        if let Some(r) = resource {
            self.limit(&mut r.attributes, &mut r.dropped_attributes_count, out);
        }
        if let Some(s) = scope {
            self.limit(&mut s.attributes, &mut s.dropped_attributes_count, out);
        }
    }

    pub fn apply_logs(&self, req: &mut ExportLogsServiceRequest) -> Appended {
        let mut out = Appended::default();
        if self.is_none() {
            return out;
        }
        for rl in &mut req.resource_logs {
            self.context(rl.resource.as_mut(), None, &mut out);
            for sl in &mut rl.scope_logs {
                self.context(None, sl.scope.as_mut(), &mut out);
                if self.window.is_some() {
                    sl.log_records
                        .retain(|r| out.count(self.fit(log_time(r.time_unix_nano, r.observed_time_unix_nano))));
                }
                for r in &mut sl.log_records {
                    self.limit(&mut r.attributes, &mut r.dropped_attributes_count, &mut out);
                }
            }
        }
        out
    }

    pub fn apply_traces(&self, req: &mut ExportTraceServiceRequest) -> Appended {
        let mut out = Appended::default();
        if self.is_none() {
            return out;
        }
        for rs in &mut req.resource_spans {
            self.context(rs.resource.as_mut(), None, &mut out);
            for ss in &mut rs.scope_spans {
                self.context(None, ss.scope.as_mut(), &mut out);
                if self.window.is_some() {
                    ss.spans.retain(|s| {
                        let fit = match (self.fit(s.start_time_unix_nano), self.fit(s.end_time_unix_nano)) {
                            (Fit::In, Fit::In) => Fit::In,
                            (Fit::Old, _) => Fit::Old,
                            _ => Fit::New,
                        };
                        out.count(fit)
                    });
                }
                for s in &mut ss.spans {
                    self.limit(&mut s.attributes, &mut s.dropped_attributes_count, &mut out);
                    for e in &mut s.events {
                        self.limit(&mut e.attributes, &mut e.dropped_attributes_count, &mut out);
                    }
                    for l in &mut s.links {
                        self.limit(&mut l.attributes, &mut l.dropped_attributes_count, &mut out);
                    }
                }
            }
        }
        out
    }

    pub fn apply_metrics(&self, req: &mut ExportMetricsServiceRequest) -> Appended {
        let mut out = Appended::default();
        if self.is_none() {
            return out;
        }
        let mut rejected = 0usize;
        for rm in &mut req.resource_metrics {
            self.context(rm.resource.as_mut(), None, &mut out);
            for sm in &mut rm.scope_metrics {
                self.context(None, sm.scope.as_mut(), &mut out);
                for m in &mut sm.metrics {
                    let (mut old, mut new) = (0, 0);
                    let mut keep = |attrs: &[KeyValue], time: u64| {
                        match self.fit(time) {
                            Fit::In => {}
                            Fit::Old => {
                                old += 1;
                                return false;
                            }
                            Fit::New => {
                                new += 1;
                                return false;
                            }
                        }
                        let ok = self.fits(attrs);
                        if !ok {
                            rejected += 1;
                        }
                        ok
                    };
                    match m.data.as_mut() {
                        Some(Data::Gauge(g)) => g.data_points.retain(|p| keep(&p.attributes, p.time_unix_nano)),
                        Some(Data::Sum(s)) => s.data_points.retain(|p| keep(&p.attributes, p.time_unix_nano)),
                        Some(Data::Histogram(h)) => h.data_points.retain(|p| keep(&p.attributes, p.time_unix_nano)),
                        Some(Data::ExponentialHistogram(h)) => {
                            h.data_points.retain(|p| keep(&p.attributes, p.time_unix_nano))
                        }
                        Some(Data::Summary(s)) => s.data_points.retain(|p| keep(&p.attributes, p.time_unix_nano)),
                        None => {}
                    }
                    out.too_old += old;
                    out.too_new += new;
                }
            }
        }
        out.rejected = rejected;
        out
    }
}

/// Hashes bytes into a series identity (stable within a process: the
/// active-series sets it keys live in memory only).
fn hash_bytes(h: u64, bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut s = std::hash::DefaultHasher::new();
    s.write_u64(h);
    s.write(bytes);
    s.finish()
}

/// Keeps the metric data points whose series `admit` takes, removing the
/// others; returns how many were removed. A series is its resource, its
/// metric's name and its point attributes (in any order), as the block's
/// series id. `admit` is called once per point; nothing is allocated per
/// point (attributes are encoded into one reused buffer).
pub fn gate_series(req: &mut ExportMetricsServiceRequest, admit: &mut dyn FnMut(u64) -> bool) -> usize {
    let mut refused = 0usize;
    let mut scratch = Vec::new();
    for rm in &mut req.resource_metrics {
        scratch.clear();
        if let Some(r) = &rm.resource {
            // Resource attributes in any order: summed per attribute.
            let mut h = 0u64;
            for kv in &r.attributes {
                scratch.clear();
                let _ = kv.encode(&mut scratch);
                h = h.wrapping_add(hash_bytes(1, &scratch));
            }
            scratch.clear();
            scratch.extend_from_slice(&h.to_le_bytes());
        }
        let resource = hash_bytes(0, &scratch);
        for sm in &mut rm.scope_metrics {
            for m in &mut sm.metrics {
                let metric = hash_bytes(resource, m.name.as_bytes());
                let mut keep = |attrs: &[KeyValue]| {
                    let mut h = metric;
                    for kv in attrs {
                        scratch.clear();
                        let _ = kv.encode(&mut scratch);
                        h = h.wrapping_add(hash_bytes(2, &scratch));
                    }
                    let ok = admit(h);
                    if !ok {
                        refused += 1;
                    }
                    ok
                };
                match m.data.as_mut() {
                    Some(Data::Gauge(g)) => g.data_points.retain(|p| keep(&p.attributes)),
                    Some(Data::Sum(s)) => s.data_points.retain(|p| keep(&p.attributes)),
                    Some(Data::Histogram(h)) => h.data_points.retain(|p| keep(&p.attributes)),
                    Some(Data::ExponentialHistogram(h)) => h.data_points.retain(|p| keep(&p.attributes)),
                    Some(Data::Summary(s)) => s.data_points.retain(|p| keep(&p.attributes)),
                    None => {}
                }
            }
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};

    fn kv(key: &str, v: &str) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: Some(AnyValue {
                value: Some(Value::StringValue(v.to_owned())),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn logs_are_cut_and_counted() {
        let limits = Limits {
            max_attrs: 2,
            max_value_bytes: 4,
            window: None,
        };
        let mut req = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![LogRecord {
                        attributes: vec![kv("a", "héllo"), kv("b", "ok"), kv("c", "x")],
                        dropped_attributes_count: 5,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let out = limits.apply_logs(&mut req);
        let r = &req.resource_logs[0].scope_logs[0].log_records[0];
        assert_eq!(r.attributes, vec![kv("a", "hél"), kv("b", "ok")]);
        assert_eq!(r.dropped_attributes_count, 6);
        assert_eq!(out.dropped_attrs, 1);
        assert_eq!(out.truncated_values, 1);
        assert!(
            out.message(&limits)
                .expect("a message")
                .contains("truncated to 4 bytes")
        );
    }

    #[test]
    fn no_limits_change_nothing() {
        let mut req = ExportLogsServiceRequest::default();
        assert_eq!(Limits::NONE.apply_logs(&mut req), Appended::default());
        assert!(Appended::default().message(&Limits::NONE).is_none());
    }
}
