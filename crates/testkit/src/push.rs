//! The corpus in the Prometheus and Loki ecosystems' own formats, so the
//! load generator and the tests can send the same data as remote write or
//! as a Loki push as they send over OTLP.
//!
//! - [`remote_write`]: the gauge and sum points of a metrics request as a
//!   remote write 1.0 `prometheus.WriteRequest` (one sample per point, and
//!   a `target_info` per resource, as the Collector's exporter sends them);
//!   [`numbers_only`] is the OTLP request holding exactly those points.
//! - [`loki_push`]: a logs request as a `logproto.PushRequest`, one stream
//!   per resource, one entry per record.
//!
//! Both give the protobuf bytes uncompressed; the senders snappy them.
//! Names become Prometheus / Loki label names as the OTel project maps
//! them (every character outside `[a-zA-Z0-9_]` becomes `_`).

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use prost::Message;

/// `prometheus.WriteRequest` (remote write 1.0), the fields sent here.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// `logproto.PushRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    pub streams: Vec<Stream>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Stream {
    /// `{name="value", …}`.
    #[prost(string, tag = "1")]
    pub labels: String,
    #[prost(message, repeated, tag = "2")]
    pub entries: Vec<Entry>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Entry {
    #[prost(message, optional, tag = "1")]
    pub timestamp: Option<Timestamp>,
    #[prost(string, tag = "2")]
    pub line: String,
    #[prost(message, repeated, tag = "3")]
    pub structured_metadata: Vec<Label>,
}

/// `google.protobuf.Timestamp`.
#[derive(Clone, PartialEq, Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// Loki's limit on labels per stream.
const MAX_STREAM_LABELS: usize = 15;

/// A Prometheus / Loki label name for an OTel attribute key.
pub fn label_name(key: &str) -> String {
    let mut s: String = key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// A scalar attribute value as text; `None` for arrays, maps, bytes.
fn text(v: &Option<AnyValue>) -> Option<String> {
    match v.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

fn labels(attrs: &[KeyValue]) -> Vec<Label> {
    attrs
        .iter()
        .filter_map(|kv| {
            Some(Label {
                name: label_name(&kv.key),
                value: text(&kv.value)?,
            })
        })
        .filter(|l| !l.value.is_empty())
        .collect()
}

/// The request with only its gauge and sum points (the ones remote write
/// carries one sample each), and how many there are.
pub fn numbers_only(req: &ExportMetricsServiceRequest) -> (ExportMetricsServiceRequest, usize) {
    let mut out = req.clone();
    let mut n = 0;
    for rm in &mut out.resource_metrics {
        for sm in &mut rm.scope_metrics {
            sm.metrics.retain(|m| match &m.data {
                Some(metric::Data::Gauge(g)) => {
                    n += g.data_points.len();
                    true
                }
                Some(metric::Data::Sum(s)) => {
                    n += s.data_points.len();
                    true
                }
                _ => false,
            });
        }
        rm.scope_metrics.retain(|sm| !sm.metrics.is_empty());
    }
    out.resource_metrics.retain(|rm| !rm.scope_metrics.is_empty());
    (out, n)
}

/// The gauge and sum points of `req` as a remote write 1.0 request, as
/// the OpenTelemetry Collector's `prometheusremotewrite` exporter sends
/// them by default: one series per point, labelled `__name__`, `job`
/// (`service.namespace/service.name`), `instance` (`service.instance.id`)
/// and the point's attributes, sorted by name; and per resource one
/// `target_info` series (value 1, at its newest point's time) with the
/// resource's other attributes.
pub fn remote_write(req: &ExportMetricsServiceRequest) -> WriteRequest {
    let mut timeseries = Vec::new();
    for rm in &req.resource_metrics {
        let attrs = rm
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or_default();
        let attr = |k: &str| attrs.iter().find(|kv| kv.key == k).and_then(|kv| text(&kv.value));
        let job = match (attr("service.namespace"), attr("service.name")) {
            (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
            (None, name) => name,
            (Some(ns), None) => Some(format!("{ns}/unknown_service")),
        };
        let mut target = Vec::new();
        target.extend(job.map(|v| label("job", v)));
        target.extend(attr("service.instance.id").map(|v| label("instance", v)));
        let mut newest = None;
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                let points = match &m.data {
                    Some(metric::Data::Gauge(g)) => &g.data_points,
                    Some(metric::Data::Sum(s)) => &s.data_points,
                    _ => continue,
                };
                for p in points {
                    let value = match p.value {
                        Some(number_data_point::Value::AsDouble(d)) => d,
                        Some(number_data_point::Value::AsInt(i)) => i as f64,
                        None => continue,
                    };
                    let mut ls = labels(&p.attributes);
                    ls.push(label("__name__", label_name(&m.name)));
                    ls.extend(target.iter().cloned());
                    let timestamp = millis(p.time_unix_nano);
                    newest = newest.max(Some(timestamp));
                    timeseries.push(series(ls, value, timestamp));
                }
            }
        }
        if let Some(t) = newest {
            let skip = ["service.name", "service.namespace", "service.instance.id"];
            let rest: Vec<KeyValue> = attrs
                .iter()
                .filter(|kv| !skip.contains(&kv.key.as_str()))
                .cloned()
                .collect();
            let mut ls = labels(&rest);
            ls.push(label("__name__", "target_info".into()));
            ls.extend(target);
            timeseries.push(series(ls, 1.0, t));
        }
    }
    WriteRequest { timeseries }
}

fn label(name: &str, value: String) -> Label {
    Label {
        name: name.into(),
        value,
    }
}

fn millis(ns: u64) -> i64 {
    i64::try_from(ns / 1_000_000).unwrap_or(i64::MAX)
}

/// One series of one sample, its labels sorted by name (the last of a
/// repeated name wins).
fn series(mut labels: Vec<Label>, value: f64, timestamp: i64) -> TimeSeries {
    labels.reverse();
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    labels.dedup_by(|a, b| a.name == b.name);
    TimeSeries {
        labels,
        samples: vec![Sample { value, timestamp }],
    }
}

/// A logs request as a Loki push: one stream per resource, labelled with
/// its scalar attributes (at most Loki's 15 in name order, `service_name`
/// among them), one entry per record with its body as the line and its
/// attributes as structured metadata.
pub fn loki_push(req: &ExportLogsServiceRequest) -> PushRequest {
    let mut streams = Vec::new();
    for rl in &req.resource_logs {
        let mut ls = rl.resource.as_ref().map(|r| labels(&r.attributes)).unwrap_or_default();
        ls.sort_by(|a, b| a.name.cmp(&b.name));
        ls.dedup_by(|a, b| a.name == b.name);
        // Over Loki's limit, `service_name` stays and the last names go.
        if ls.len() > MAX_STREAM_LABELS {
            let keep = ls.iter().position(|l| l.name == "service_name");
            let kept = keep.map(|i| ls.remove(i));
            ls.truncate(MAX_STREAM_LABELS - usize::from(kept.is_some()));
            ls.extend(kept);
            ls.sort_by(|a, b| a.name.cmp(&b.name));
        }
        if ls.is_empty() {
            ls.push(Label {
                name: "service_name".into(),
                value: "unknown_service".into(),
            });
        }
        let selector = ls
            .iter()
            .map(|l| format!("{}={:?}", l.name, l.value))
            .collect::<Vec<_>>()
            .join(", ");
        let entries = rl
            .scope_logs
            .iter()
            .flat_map(|sl| &sl.log_records)
            .map(|r| {
                let t = if r.time_unix_nano != 0 {
                    r.time_unix_nano
                } else {
                    r.observed_time_unix_nano
                };
                Entry {
                    timestamp: Some(Timestamp {
                        seconds: i64::try_from(t / 1_000_000_000).unwrap_or(i64::MAX),
                        nanos: (t % 1_000_000_000) as i32,
                    }),
                    line: text(&r.body).unwrap_or_default(),
                    structured_metadata: labels(&r.attributes),
                }
            })
            .collect();
        streams.push(Stream {
            labels: format!("{{{selector}}}"),
            entries,
        });
    }
    PushRequest { streams }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{Cardinality, Corpus};

    #[test]
    fn remote_write_carries_one_sample_per_number_point() {
        let req = Corpus::new(7, Cardinality::Low).metrics(2000);
        let (numbers, n) = numbers_only(&req);
        let rw = remote_write(&req);
        assert!(n > 0 && n < 2000, "the corpus mixes number points with histograms: {n}");
        let name = |ts: &TimeSeries| ts.labels.iter().find(|l| l.name == "__name__").map(|l| l.value.clone());
        let targets = rw
            .timeseries
            .iter()
            .filter(|ts| name(ts).as_deref() == Some("target_info"))
            .count();
        assert_eq!(targets, numbers.resource_metrics.len());
        assert_eq!(rw.timeseries.len(), n + targets);
        assert_eq!(remote_write(&numbers), rw);
        for ts in &rw.timeseries {
            assert!(ts.labels.iter().any(|l| l.name == "job"), "{:?}", ts.labels);
            assert_eq!(ts.labels.iter().filter(|l| l.name == "__name__").count(), 1);
            assert!(ts.labels.windows(2).all(|w| w[0].name < w[1].name), "{:?}", ts.labels);
        }
    }

    #[test]
    fn loki_push_carries_every_record_once() {
        let req = Corpus::new(7, Cardinality::High).logs(500);
        let push = loki_push(&req);
        let lines: Vec<&str> = push
            .streams
            .iter()
            .flat_map(|s| &s.entries)
            .map(|e| e.line.as_str())
            .collect();
        assert_eq!(lines, crate::flatten::log_bodies(&req));
        assert_eq!(push.streams.len(), req.resource_logs.len());
        assert!(push.streams.iter().all(|s| s.labels.contains("service_name=")));
    }
}
