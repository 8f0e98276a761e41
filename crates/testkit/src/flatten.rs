//! Canonical form of OTLP export requests: "equal modulo resource/scope grouping order".
//!
//! Each function returns one entry per leaf (log record, span, data point). An entry is the
//! prost-encoded bytes of a request that holds exactly that leaf under its full context: one
//! resource group (resource and its `schema_url`), one scope group (scope and its `schema_url`)
//! and, for metrics, the [`Metric`] with all its fields but only that one data point.
//!
//! Leaves are taken in request order, then stable-sorted by their context bytes (resource group,
//! then scope group, then for metrics the metric without its points). Two requests that hold the
//! same leaves under the same contexts therefore flatten equal whatever their grouping, while the
//! order of leaves under one context still matters. Comparing encoded bytes makes a NaN equal to
//! itself. Resource or scope groups without leaves, and metrics without points, contribute
//! nothing.
//!
//! `None` and `Some(empty)` are different here (an absent resource is not an empty resource), as
//! they are on the wire.

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    ExponentialHistogram, Gauge, Histogram, Metric, ResourceMetrics, ScopeMetrics, Sum, Summary, metric,
};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use prost::Message;

/// One leaf: the bytes of its context (for sorting) and the bytes of the whole one-leaf request.
struct Leaf {
    context: Vec<Vec<u8>>,
    bytes: Vec<u8>,
}

fn sorted(mut leaves: Vec<Leaf>) -> Vec<Vec<u8>> {
    // `sort_by` is stable: leaves under one context keep their request order.
    leaves.sort_by(|a, b| a.context.cmp(&b.context));
    leaves.into_iter().map(|leaf| leaf.bytes).collect()
}

/// One entry per log record, each an encoded [`ExportLogsServiceRequest`] holding that record
/// alone under its resource and scope, sorted by context (see the module doc).
pub fn logs(req: &ExportLogsServiceRequest) -> Vec<Vec<u8>> {
    let mut leaves = Vec::new();
    for rl in &req.resource_logs {
        let resource_group = ResourceLogs {
            resource: rl.resource.clone(),
            scope_logs: Vec::new(),
            schema_url: rl.schema_url.clone(),
        };
        let resource_key = resource_group.encode_to_vec();
        for sl in &rl.scope_logs {
            let scope_group = ScopeLogs {
                scope: sl.scope.clone(),
                log_records: Vec::new(),
                schema_url: sl.schema_url.clone(),
            };
            let scope_key = scope_group.encode_to_vec();
            for record in &sl.log_records {
                let one = ExportLogsServiceRequest {
                    resource_logs: vec![ResourceLogs {
                        scope_logs: vec![ScopeLogs {
                            log_records: vec![record.clone()],
                            ..scope_group.clone()
                        }],
                        ..resource_group.clone()
                    }],
                };
                leaves.push(Leaf {
                    context: vec![resource_key.clone(), scope_key.clone()],
                    bytes: one.encode_to_vec(),
                });
            }
        }
    }
    sorted(leaves)
}

/// One entry per span, each an encoded [`ExportTraceServiceRequest`] holding that span alone
/// under its resource and scope, sorted by context (see the module doc).
pub fn traces(req: &ExportTraceServiceRequest) -> Vec<Vec<u8>> {
    let mut leaves = Vec::new();
    for rs in &req.resource_spans {
        let resource_group = ResourceSpans {
            resource: rs.resource.clone(),
            scope_spans: Vec::new(),
            schema_url: rs.schema_url.clone(),
        };
        let resource_key = resource_group.encode_to_vec();
        for ss in &rs.scope_spans {
            let scope_group = ScopeSpans {
                scope: ss.scope.clone(),
                spans: Vec::new(),
                schema_url: ss.schema_url.clone(),
            };
            let scope_key = scope_group.encode_to_vec();
            for span in &ss.spans {
                let one = ExportTraceServiceRequest {
                    resource_spans: vec![ResourceSpans {
                        scope_spans: vec![ScopeSpans {
                            spans: vec![span.clone()],
                            ..scope_group.clone()
                        }],
                        ..resource_group.clone()
                    }],
                };
                leaves.push(Leaf {
                    context: vec![resource_key.clone(), scope_key.clone()],
                    bytes: one.encode_to_vec(),
                });
            }
        }
    }
    sorted(leaves)
}

/// One entry per data point, each an encoded [`ExportMetricsServiceRequest`] holding the point's
/// metric (name, description, unit, metadata, type, temporality, monotonicity) with only that
/// point, under its resource and scope, sorted by context (see the module doc).
pub fn metrics(req: &ExportMetricsServiceRequest) -> Vec<Vec<u8>> {
    let mut leaves = Vec::new();
    for rm in &req.resource_metrics {
        let resource_group = ResourceMetrics {
            resource: rm.resource.clone(),
            scope_metrics: Vec::new(),
            schema_url: rm.schema_url.clone(),
        };
        let resource_key = resource_group.encode_to_vec();
        for sm in &rm.scope_metrics {
            let scope_group = ScopeMetrics {
                scope: sm.scope.clone(),
                metrics: Vec::new(),
                schema_url: sm.schema_url.clone(),
            };
            let scope_key = scope_group.encode_to_vec();
            for metric in &sm.metrics {
                let Some(data) = &metric.data else { continue };
                let shell = Metric {
                    data: Some(without_points(data)),
                    ..metric.clone()
                };
                let metric_key = shell.encode_to_vec();
                for point in single_points(data) {
                    let one = ExportMetricsServiceRequest {
                        resource_metrics: vec![ResourceMetrics {
                            scope_metrics: vec![ScopeMetrics {
                                metrics: vec![Metric {
                                    data: Some(point),
                                    ..shell.clone()
                                }],
                                ..scope_group.clone()
                            }],
                            ..resource_group.clone()
                        }],
                    };
                    leaves.push(Leaf {
                        context: vec![resource_key.clone(), scope_key.clone(), metric_key.clone()],
                        bytes: one.encode_to_vec(),
                    });
                }
            }
        }
    }
    sorted(leaves)
}

/// The metric's data with every field kept but the data points.
fn without_points(data: &metric::Data) -> metric::Data {
    match data {
        metric::Data::Gauge(_) => metric::Data::Gauge(Gauge {
            data_points: Vec::new(),
        }),
        metric::Data::Sum(s) => metric::Data::Sum(Sum {
            data_points: Vec::new(),
            ..s.clone()
        }),
        metric::Data::Histogram(h) => metric::Data::Histogram(Histogram {
            data_points: Vec::new(),
            aggregation_temporality: h.aggregation_temporality,
        }),
        metric::Data::ExponentialHistogram(h) => metric::Data::ExponentialHistogram(ExponentialHistogram {
            data_points: Vec::new(),
            aggregation_temporality: h.aggregation_temporality,
        }),
        metric::Data::Summary(_) => metric::Data::Summary(Summary {
            data_points: Vec::new(),
        }),
    }
}

/// One `Data` per data point, each holding only that point, in request order.
fn single_points(data: &metric::Data) -> Vec<metric::Data> {
    match data {
        metric::Data::Gauge(g) => g
            .data_points
            .iter()
            .map(|p| {
                metric::Data::Gauge(Gauge {
                    data_points: vec![p.clone()],
                })
            })
            .collect(),
        metric::Data::Sum(s) => s
            .data_points
            .iter()
            .map(|p| {
                metric::Data::Sum(Sum {
                    data_points: vec![p.clone()],
                    ..s.clone()
                })
            })
            .collect(),
        metric::Data::Histogram(h) => h
            .data_points
            .iter()
            .map(|p| {
                metric::Data::Histogram(Histogram {
                    data_points: vec![p.clone()],
                    aggregation_temporality: h.aggregation_temporality,
                })
            })
            .collect(),
        metric::Data::ExponentialHistogram(h) => h
            .data_points
            .iter()
            .map(|p| {
                metric::Data::ExponentialHistogram(ExponentialHistogram {
                    data_points: vec![p.clone()],
                    aggregation_temporality: h.aggregation_temporality,
                })
            })
            .collect(),
        metric::Data::Summary(s) => s
            .data_points
            .iter()
            .map(|p| {
                metric::Data::Summary(Summary {
                    data_points: vec![p.clone()],
                })
            })
            .collect(),
    }
}

/// The string bodies of every log record, in request order (records with
/// another body type are skipped).
pub fn log_bodies(req: &ExportLogsServiceRequest) -> Vec<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    req.resource_logs
        .iter()
        .flat_map(|r| &r.scope_logs)
        .flat_map(|s| &s.log_records)
        .filter_map(|r| match r.body.as_ref().and_then(|b| b.value.as_ref()) {
            Some(Value::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{Cardinality, Corpus};
    use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
    use opentelemetry_proto::tonic::metrics::v1::number_data_point;

    /// Reverses the order of resource groups and splits each in two (the first half of each
    /// scope's records, then the rest). Leaves under one context keep their order as long as no
    /// two groups share a resource, which holds for the corpus.
    fn regroup_logs(req: &ExportLogsServiceRequest) -> ExportLogsServiceRequest {
        let mut out = Vec::new();
        for rl in req.resource_logs.iter().rev() {
            let mut first = rl.clone();
            let mut second = rl.clone();
            for (a, b) in first.scope_logs.iter_mut().zip(second.scope_logs.iter_mut()) {
                let half = a.log_records.len() / 2;
                b.log_records = a.log_records.split_off(half);
            }
            out.push(first);
            out.push(second);
        }
        ExportLogsServiceRequest { resource_logs: out }
    }

    #[test]
    fn regrouped_logs_compare_equal() {
        let req = Corpus::new(7, Cardinality::Low).logs(500);
        assert!(req.resource_logs.len() > 1);
        let regrouped = regroup_logs(&req);
        assert_ne!(req, regrouped);
        assert_eq!(logs(&req), logs(&regrouped));
        assert_eq!(logs(&req).len(), 500);
    }

    #[test]
    fn empty_groups_contribute_nothing() {
        let req = Corpus::new(7, Cardinality::Low).logs(50);
        let mut padded = req.clone();
        padded.resource_logs.push(ResourceLogs::default());
        padded.resource_logs[0].scope_logs.push(ScopeLogs::default());
        assert_eq!(logs(&req), logs(&padded));
    }

    #[test]
    fn changed_attribute_compares_different() {
        let req = Corpus::new(7, Cardinality::Low).logs(100);
        let mut changed = req.clone();
        let record = &mut changed.resource_logs[0].scope_logs[0].log_records[0];
        record.attributes[0].value = Some(AnyValue {
            value: Some(any_value::Value::StringValue("changed".to_owned())),
        });
        assert_ne!(logs(&req), logs(&changed));
    }

    #[test]
    fn swapped_records_within_a_group_compare_different() {
        let req = Corpus::new(7, Cardinality::Low).logs(100);
        let mut swapped = req.clone();
        let records = &mut swapped
            .resource_logs
            .iter_mut()
            .find(|rl| rl.scope_logs[0].log_records.len() >= 2)
            .expect("100 records over 16 resources put two under one resource")
            .scope_logs[0]
            .log_records;
        records.swap(0, 1);
        assert_ne!(req, swapped);
        assert_ne!(logs(&req), logs(&swapped));
    }

    #[test]
    fn regrouped_traces_compare_equal() {
        let req = Corpus::new(3, Cardinality::High).traces(200);
        let mut regrouped = req.clone();
        regrouped.resource_spans.reverse();
        assert_eq!(traces(&req), traces(&regrouped));
        let mut swapped = req.clone();
        swapped.resource_spans[0].scope_spans[0].spans.swap(0, 1);
        assert_ne!(traces(&req), traces(&swapped));
    }

    #[test]
    fn regrouped_metrics_compare_equal() {
        let req = Corpus::new(3, Cardinality::Low).metrics(2_000);
        // Split every metric into one metric per point and reverse resources.
        let mut regrouped = req.clone();
        regrouped.resource_metrics.reverse();
        for rm in &mut regrouped.resource_metrics {
            for sm in &mut rm.scope_metrics {
                let mut split = Vec::new();
                for m in &sm.metrics {
                    let Some(data) = &m.data else { continue };
                    for point in single_points(data) {
                        split.push(Metric {
                            data: Some(point),
                            ..m.clone()
                        });
                    }
                }
                sm.metrics = split;
            }
        }
        assert_ne!(req, regrouped);
        assert_eq!(metrics(&req), metrics(&regrouped));
        assert_eq!(metrics(&req).len(), 2_000);
    }

    #[test]
    fn changed_point_value_compares_different() {
        let req = Corpus::new(3, Cardinality::Low).metrics(500);
        let mut changed = req.clone();
        let sm = &mut changed.resource_metrics[0].scope_metrics[0];
        let gauge = sm
            .metrics
            .iter_mut()
            .find_map(|m| match &mut m.data {
                Some(metric::Data::Gauge(g)) => Some(g),
                _ => None,
            })
            .expect("the corpus emits gauges for every resource");
        gauge.data_points[0].value = Some(number_data_point::Value::AsDouble(f64::NAN));
        assert_ne!(metrics(&req), metrics(&changed));
        // NaN equals itself in the flattened form.
        assert_eq!(metrics(&changed), metrics(&changed.clone()));
    }
}
