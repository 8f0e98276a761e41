//! Counts the records of an OTLP export request (log records, spans,
//! metric data points) straight from the protobuf wire format, without
//! decoding or allocating: what the per-tenant records rate
//! ([`mira_common::limits`]) is charged before the request goes to a
//! shard, so a refused request takes no queue room and writes nothing.
//! Only the nesting is walked; every other field is skipped by length.

use bytes::Buf;
use mira_core::ids::Signal;

/// Why a request could not be counted (it will not decode either).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// Calls `f(field number, bytes)` for each length-delimited field of
/// `buf`, skipping the others.
fn each_message(mut buf: &[u8], mut f: impl FnMut(u32, &[u8]) -> Result<(), Malformed>) -> Result<(), Malformed> {
    const BAD: Malformed = Malformed("truncated or malformed protobuf");
    while buf.has_remaining() {
        let key = prost::encoding::decode_varint(&mut buf).map_err(|_| BAD)?;
        let field = u32::try_from(key >> 3).map_err(|_| BAD)?;
        let skip = match key & 7 {
            0 => {
                prost::encoding::decode_varint(&mut buf).map_err(|_| BAD)?;
                0
            }
            1 => 8,
            5 => 4,
            2 => {
                let len =
                    usize::try_from(prost::encoding::decode_varint(&mut buf).map_err(|_| BAD)?).map_err(|_| BAD)?;
                let body = buf.get(..len).ok_or(BAD)?;
                f(field, body)?;
                len
            }
            _ => return Err(Malformed("unsupported protobuf wire type")),
        };
        if skip > buf.len() {
            return Err(BAD);
        }
        buf.advance(skip);
    }
    Ok(())
}

/// Counts the messages at `path` (field numbers, outermost first) below `buf`.
fn count_at(buf: &[u8], path: &[u32], count: &mut u64) -> Result<(), Malformed> {
    let Some((&first, rest)) = path.split_first() else {
        *count += 1;
        return Ok(());
    };
    each_message(buf, |field, body| {
        if field == first {
            count_at(body, rest, count)?;
        }
        Ok(())
    })
}

/// The records in an OTLP protobuf export request of `signal`.
pub fn count(signal: Signal, payload: &[u8]) -> Result<u64, Malformed> {
    let mut n = 0;
    match signal {
        // Export*ServiceRequest.resource_* = 1, Resource*.scope_* = 2,
        // Scope*.log_records / spans = 2.
        Signal::Logs | Signal::Traces => count_at(payload, &[1, 2, 2], &mut n)?,
        Signal::Metrics => {
            // ... ScopeMetrics.metrics = 2; Metric.gauge = 5, sum = 7,
            // histogram = 9, exponential_histogram = 10, summary = 11,
            // each with data_points = 1.
            each_message(payload, |f, resource| {
                if f != 1 {
                    return Ok(());
                }
                each_message(resource, |f, scope| {
                    if f != 2 {
                        return Ok(());
                    }
                    each_message(scope, |f, metric| {
                        if f != 2 {
                            return Ok(());
                        }
                        each_message(metric, |f, data| {
                            if matches!(f, 5 | 7 | 9 | 10 | 11) {
                                count_at(data, &[1], &mut n)?;
                            }
                            Ok(())
                        })
                    })
                })
            })?;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, metric,
    };
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;

    use super::*;

    fn log(body: &str) -> LogRecord {
        LogRecord {
            time_unix_nano: 1,
            body: Some(AnyValue {
                value: Some(any_value::Value::StringValue(body.to_owned())),
            }),
            attributes: vec![KeyValue {
                key: "k".to_owned(),
                value: None,
                ..KeyValue::default()
            }],
            ..LogRecord::default()
        }
    }

    #[test]
    fn counts_match_the_requests() {
        let logs = ExportLogsServiceRequest {
            resource_logs: vec![
                ResourceLogs {
                    scope_logs: vec![
                        ScopeLogs {
                            log_records: vec![log("a"), log("b")],
                            ..ScopeLogs::default()
                        },
                        ScopeLogs {
                            log_records: vec![log("c")],
                            ..ScopeLogs::default()
                        },
                    ],
                    ..ResourceLogs::default()
                },
                ResourceLogs {
                    scope_logs: vec![ScopeLogs {
                        log_records: vec![log("d"), log("e"), log("f")],
                        ..ScopeLogs::default()
                    }],
                    ..ResourceLogs::default()
                },
            ],
        };
        assert_eq!(count(Signal::Logs, &logs.encode_to_vec()), Ok(6));
        let spans = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span::default(); 4],
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        };
        assert_eq!(count(Signal::Traces, &spans.encode_to_vec()), Ok(4));
        let metric = |data| Metric {
            name: "m".to_owned(),
            data: Some(data),
            ..Metric::default()
        };
        let metrics = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![
                        metric(metric::Data::Gauge(Gauge {
                            data_points: vec![NumberDataPoint::default(); 3],
                        })),
                        metric(metric::Data::Sum(Sum {
                            data_points: vec![NumberDataPoint::default(); 2],
                            ..Sum::default()
                        })),
                        metric(metric::Data::Histogram(Histogram {
                            data_points: vec![HistogramDataPoint::default()],
                            ..Histogram::default()
                        })),
                    ],
                    ..ScopeMetrics::default()
                }],
                ..ResourceMetrics::default()
            }],
        };
        assert_eq!(count(Signal::Metrics, &metrics.encode_to_vec()), Ok(6));
        assert_eq!(count(Signal::Logs, &[]), Ok(0));
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let good = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![log("a"); 3],
                    ..ScopeLogs::default()
                }],
                ..ResourceLogs::default()
            }],
        }
        .encode_to_vec();
        for cut in 1..good.len() {
            // Every prefix either counts (a prefix ending on a field
            // boundary) or is refused; none panics.
            let _ = count(Signal::Logs, &good[..cut]);
        }
        assert!(count(Signal::Logs, &good[..good.len() - 1]).is_err());
        assert!(count(Signal::Metrics, &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
        assert!(count(Signal::Traces, &[0x0b]).is_err(), "group wire type");
    }
}
