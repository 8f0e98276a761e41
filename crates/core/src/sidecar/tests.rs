//! Sidecars built from real block tables (hand-made OTLP and the testkit
//! corpus), their sections, and pruning decisions.

use std::collections::BTreeSet;
use std::io::Cursor;

use arrow::record_batch::RecordBatch;
use arrow_ipc::reader::FileReader;
use arrow_ipc::writer::FileWriter;
use mira_testkit::corpus::{Cardinality, Corpus};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

use super::*;
use crate::convert::{LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder};

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        key_strindex: 0,
    }
}

fn s(v: &str) -> Value {
    Value::StringValue(v.into())
}

fn resource(service: &str) -> Option<Resource> {
    Some(Resource {
        attributes: vec![kv("service.name", s(service)), kv("host.cpu.count", Value::IntValue(8))],
        ..Default::default()
    })
}

fn trace_id(i: u64) -> Vec<u8> {
    [i.to_le_bytes(), (!i).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes()].concat()
}

/// Three log records per service with known times, severities and ids.
fn logs_request() -> ExportLogsServiceRequest {
    let record = |i: u64, severity: i32, text: &str, attrs: Vec<KeyValue>| LogRecord {
        time_unix_nano: 1_000 + i * 10,
        observed_time_unix_nano: 5_000 + i,
        severity_number: severity,
        severity_text: text.into(),
        body: Some(AnyValue {
            value: Some(s("hello")),
        }),
        attributes: attrs,
        trace_id: if i.is_multiple_of(2) { trace_id(i) } else { Vec::new() },
        span_id: if i.is_multiple_of(2) {
            (i + 100).to_le_bytes().to_vec()
        } else {
            Vec::new()
        },
        ..Default::default()
    };
    let group = |service: &str, base: u64| ResourceLogs {
        resource: resource(service),
        scope_logs: vec![ScopeLogs {
            log_records: vec![
                record(
                    base,
                    9,
                    "INFO",
                    vec![kv("http.method", s("GET")), kv("retries", Value::IntValue(2))],
                ),
                record(base + 1, 13, "WARN", vec![kv("http.method", s("POST"))]),
                record(base + 2, 17, "ERROR", vec![kv("user.tier", s(""))]),
            ],
            ..Default::default()
        }],
        ..Default::default()
    };
    ExportLogsServiceRequest {
        resource_logs: vec![group("api", 0), group("db", 3)],
    }
}

fn logs_tables() -> TableSet {
    let mut b = LogsBuilder::default();
    b.append(&logs_request()).expect("append");
    b.finish().expect("finish")
}

fn span(i: u64, name: &str, start: u64, end: u64) -> Span {
    Span {
        trace_id: trace_id(i / 3),
        span_id: (i + 1).to_le_bytes().to_vec(),
        name: name.into(),
        kind: 2,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        attributes: vec![kv("http.route", s(&format!("/r/{}", i % 4)))],
        ..Default::default()
    }
}

fn traces_request() -> ExportTraceServiceRequest {
    let spans = vec![
        span(0, "GET /", 100, 600),
        span(1, "SELECT", 200, 250),
        span(2, "GET /", 300, 1_300),
        // An end before the start: duration saturates at zero.
        span(3, "broken", 400, 350),
        span(4, "SELECT", 500, 520),
    ];
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: resource("shop"),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn traces_tables() -> TableSet {
    let mut b = SpansBuilder::default();
    b.append(&traces_request()).expect("append");
    b.finish().expect("finish")
}

fn metrics_tables() -> TableSet {
    let gauge = |name: &str, points: Vec<(u64, f64)>| Metric {
        name: name.into(),
        data: Some(metric::Data::Gauge(Gauge {
            data_points: points
                .into_iter()
                .map(|(t, v)| NumberDataPoint {
                    time_unix_nano: t,
                    value: Some(number_data_point::Value::AsDouble(v)),
                    attributes: vec![kv("cpu", s("0"))],
                    ..Default::default()
                })
                .collect(),
        })),
        ..Default::default()
    };
    let req = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: resource("node"),
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![
                    gauge("cpu_seconds", vec![(10, 1.5), (20, f64::NAN), (30, -2.0)]),
                    gauge("mem_bytes", vec![(15, 1e9)]),
                ],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let mut b = PointsBuilder::default();
    b.append(&req).expect("append");
    b.finish().expect("finish")
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn id16(v: &[u8]) -> [u8; 16] {
    v.try_into().expect("16 bytes")
}

#[test]
fn logs_zone_map_matches_the_data() {
    let t = logs_tables();
    let sc = Sidecars::build(&t).expect("build");
    let req = logs_request();
    let records: Vec<&LogRecord> = req
        .resource_logs
        .iter()
        .flat_map(|r| &r.scope_logs)
        .flat_map(|s| &s.log_records)
        .collect();
    let span = |f: fn(&LogRecord) -> u64| {
        (
            records.iter().map(|r| f(r)).min().expect("rows"),
            records.iter().map(|r| f(r)).max().expect("rows"),
        )
    };
    let (min, max) = span(|r| r.time_unix_nano);
    assert_eq!(sc.zone.get("time_unix_nano"), Some(ZoneRange::UInt { min, max }));
    let (min, max) = span(|r| r.observed_time_unix_nano);
    assert_eq!(
        sc.zone.get("observed_time_unix_nano"),
        Some(ZoneRange::UInt { min, max })
    );
    assert_eq!(sc.zone.get("severity_number"), Some(ZoneRange::Int { min: 9, max: 17 }));
    assert_eq!(sc.zone.get(DURATION), None, "duration is for spans");
    assert_eq!(sc.zone.get("body"), None);

    let probe = |min_severity| Probe {
        min_severity: Some(min_severity),
        ..Default::default()
    };
    assert_eq!(sc.may_match(&probe(17), t.min_time, t.max_time), Verdict::MayMatch);
    assert_eq!(
        sc.may_match(&probe(18), t.min_time, t.max_time),
        Verdict::Pruned(PruneRule::ZoneMap)
    );
}

#[test]
fn time_outside_the_block_is_pruned_by_time() {
    let t = logs_tables();
    let sc = Sidecars::build(&t).expect("build");
    let (lo, hi) = (t.min_time, t.max_time);
    assert!(lo < hi);
    let at = |time| Probe {
        time: Some(time),
        ..Default::default()
    };
    assert_eq!(sc.may_match(&at((0, lo - 1)), lo, hi), Verdict::Pruned(PruneRule::Time));
    assert_eq!(
        sc.may_match(&at((hi + 1, u64::MAX)), lo, hi),
        Verdict::Pruned(PruneRule::Time)
    );
    assert_eq!(
        sc.may_match(&at((hi, hi)), lo, hi),
        Verdict::MayMatch,
        "bounds are inclusive"
    );
    assert_eq!(sc.may_match(&at((0, lo)), lo, hi), Verdict::MayMatch);
    assert_eq!(
        sc.may_match(&at((hi, lo)), lo, hi),
        Verdict::Pruned(PruneRule::Time),
        "empty range"
    );
    assert_eq!(
        sc.may_match(&Probe::default(), lo, hi),
        Verdict::MayMatch,
        "an empty probe matches"
    );
}

#[test]
fn absent_attribute_values_are_pruned_by_attr_index() {
    let t = logs_tables();
    let sc = Sidecars::build(&t).expect("build");
    let m = |p: &Probe| sc.may_match(p, t.min_time, t.max_time);
    let resource = |v: &[(&str, &str)]| Probe {
        resource_eq: pairs(v),
        ..Default::default()
    };
    let attr = |v: &[(&str, &str)]| Probe {
        attr_eq: pairs(v),
        ..Default::default()
    };
    let field = |v: &[(&str, &str)]| Probe {
        field_eq: pairs(v),
        ..Default::default()
    };

    assert_eq!(m(&resource(&[("service.name", "api")])), Verdict::MayMatch);
    assert_eq!(m(&resource(&[("service.name", "db")])), Verdict::MayMatch);
    assert_eq!(
        m(&resource(&[("service.name", "web")])),
        Verdict::Pruned(PruneRule::AttrIndex)
    );
    assert_eq!(
        m(&resource(&[("service.name", "api"), ("k8s.pod", "x")])),
        Verdict::Pruned(PruneRule::AttrIndex)
    );
    assert_eq!(
        m(&resource(&[("host.cpu.count", "8")])),
        Verdict::MayMatch,
        "ints are not pruned by string"
    );
    assert_eq!(m(&attr(&[("http.method", "POST")])), Verdict::MayMatch);
    assert_eq!(
        m(&attr(&[("http.method", "PUT")])),
        Verdict::Pruned(PruneRule::AttrIndex)
    );
    assert_eq!(
        m(&attr(&[("service.name", "api")])),
        Verdict::Pruned(PruneRule::AttrIndex),
        "wrong scope"
    );
    assert_eq!(
        m(&attr(&[("user.tier", "")])),
        Verdict::MayMatch,
        "empty strings are values too"
    );
    assert_eq!(m(&attr(&[("retries", "2")])), Verdict::MayMatch);
    assert_eq!(m(&field(&[(field::SEVERITY_TEXT, "WARN")])), Verdict::MayMatch);
    assert_eq!(
        m(&field(&[(field::SEVERITY_TEXT, "FATAL")])),
        Verdict::Pruned(PruneRule::AttrIndex)
    );

    let a = &sc.attrs;
    assert_eq!(
        a.keys(AttrScope::Resource).collect::<Vec<_>>(),
        ["host.cpu.count", "service.name"]
    );
    assert_eq!(
        a.keys(AttrScope::Record).collect::<Vec<_>>(),
        ["http.method", "retries", "user.tier"]
    );
    assert_eq!(
        a.values(AttrScope::Resource, "service.name"),
        Some(&["api".to_owned(), "db".to_owned()][..])
    );
    assert_eq!(a.values(AttrScope::Resource, "host.cpu.count"), None);
    assert_eq!(
        a.values(AttrScope::Field, field::SEVERITY_TEXT),
        Some(&["ERROR".to_owned(), "INFO".to_owned(), "WARN".to_owned()][..])
    );
}

#[test]
fn too_many_values_prune_nothing_for_that_key() {
    let record = |i: usize| LogRecord {
        time_unix_nano: 1 + i as u64,
        attributes: vec![
            kv("request.id", s(&format!("req-{i}"))),
            kv("shard", s(&format!("s{}", i % 256))),
        ],
        ..Default::default()
    };
    let req = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: resource("api"),
            scope_logs: vec![ScopeLogs {
                log_records: (0..300).map(record).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let mut b = LogsBuilder::default();
    b.append(&req).expect("append");
    let t = b.finish().expect("finish");
    let sc = Sidecars::build(&t).expect("build");
    let attr = |k: &str, v: &str| Probe {
        attr_eq: pairs(&[(k, v)]),
        ..Default::default()
    };
    for v in ["req-0", "req-299", "req-300", "never seen"] {
        assert_eq!(
            sc.may_match(&attr("request.id", v), t.min_time, t.max_time),
            Verdict::MayMatch,
            "{v}"
        );
    }
    assert_eq!(sc.attrs.values(AttrScope::Record, "request.id"), None);
    // Exactly MAX_VALUES_PER_KEY distinct values are still listed.
    assert_eq!(
        sc.attrs.values(AttrScope::Record, "shard").map(<[String]>::len),
        Some(MAX_VALUES_PER_KEY)
    );
    assert!(!sc.may_match(&attr("shard", "s255"), t.min_time, t.max_time).is_pruned());
    assert!(sc.may_match(&attr("shard", "s256"), t.min_time, t.max_time).is_pruned());
    assert!(sc.may_match(&attr("absent", "x"), t.min_time, t.max_time).is_pruned());
}

#[test]
fn trace_and_span_ids_of_logs_are_in_the_bloom_filter() {
    let t = logs_tables();
    let sc = Sidecars::build(&t).expect("build");
    let ids = sc.ids.as_ref().expect("logs have id filters");
    for r in logs_request()
        .resource_logs
        .iter()
        .flat_map(|r| &r.scope_logs)
        .flat_map(|s| &s.log_records)
    {
        if !r.trace_id.is_empty() {
            assert!(ids.may_contain_trace(&id16(&r.trace_id)));
            let span: [u8; 8] = r.span_id.as_slice().try_into().expect("8 bytes");
            assert!(ids.may_contain_span(&span));
        }
    }
    assert_eq!(
        ids.trace_filter().map(SplitBlockBloom::items),
        Some(3),
        "three records carry a trace id"
    );
    let by_trace = |id| Probe {
        trace_id: Some(id),
        ..Default::default()
    };
    assert_eq!(
        sc.may_match(&by_trace(id16(&trace_id(0))), t.min_time, t.max_time),
        Verdict::MayMatch
    );
    // Odd records carry no id; ids never inserted are (almost always) absent.
    let absent = (1000..1100).filter(|&i| sc.may_match(&by_trace(id16(&trace_id(i))), 0, u64::MAX).is_pruned());
    assert!(absent.count() > 90);
    assert_eq!(
        sc.may_match(
            &Probe {
                span_id: Some(7u64.to_le_bytes()),
                ..Default::default()
            },
            0,
            u64::MAX
        ),
        Verdict::Pruned(PruneRule::Bloom)
    );
}

#[test]
fn spans_duration_names_and_trace_ids() {
    let t = traces_tables();
    let sc = Sidecars::build(&t).expect("build");
    assert_eq!(sc.zone.get(DURATION), Some(ZoneRange::UInt { min: 0, max: 1_000 }));
    assert_eq!(
        sc.zone.get("start_time_unix_nano"),
        Some(ZoneRange::UInt { min: 100, max: 500 })
    );
    assert_eq!(
        sc.zone.get("end_time_unix_nano"),
        Some(ZoneRange::UInt { min: 250, max: 1_300 })
    );
    assert_eq!(sc.zone.get("kind"), Some(ZoneRange::Int { min: 2, max: 2 }));
    assert_eq!(
        sc.zone.get("status_code"),
        Some(ZoneRange::Empty),
        "no span had a status"
    );

    let m = |p: Probe| sc.may_match(&p, t.min_time, t.max_time);
    assert_eq!(
        m(Probe {
            min_duration: Some(1_000),
            ..Default::default()
        }),
        Verdict::MayMatch
    );
    assert_eq!(
        m(Probe {
            min_duration: Some(1_001),
            ..Default::default()
        }),
        Verdict::Pruned(PruneRule::ZoneMap)
    );
    assert_eq!(
        m(Probe {
            max_duration: Some(0),
            ..Default::default()
        }),
        Verdict::MayMatch
    );
    assert_eq!(
        m(Probe {
            min_duration: Some(700),
            max_duration: Some(600),
            ..Default::default()
        }),
        Verdict::Pruned(PruneRule::ZoneMap)
    );
    let name = |n: &str| Probe {
        field_eq: pairs(&[(field::SPAN_NAME, n)]),
        ..Default::default()
    };
    assert_eq!(m(name("SELECT")), Verdict::MayMatch);
    assert_eq!(m(name("INSERT")), Verdict::Pruned(PruneRule::AttrIndex));
    assert_eq!(
        m(Probe {
            attr_eq: pairs(&[("http.route", "/r/3")]),
            ..Default::default()
        }),
        Verdict::MayMatch
    );

    let ids = sc.ids.as_ref().expect("spans have a trace filter");
    assert!(ids.span_filter().is_none());
    for i in 0..5 {
        assert!(ids.may_contain_trace(&id16(&trace_id(i / 3))));
    }
    assert_eq!(
        ids.trace_filter().map(SplitBlockBloom::items),
        Some(2),
        "distinct trace ids"
    );
    assert_eq!(
        m(Probe {
            trace_id: Some([0xab; 16]),
            ..Default::default()
        }),
        Verdict::Pruned(PruneRule::Bloom)
    );
    assert_eq!(
        m(Probe {
            span_id: Some([0xab; 8]),
            ..Default::default()
        }),
        Verdict::MayMatch,
        "spans blocks have no span-id filter"
    );
}

#[test]
fn metrics_names_and_float_values() {
    let t = metrics_tables();
    let sc = Sidecars::build(&t).expect("build");
    assert!(sc.ids.is_none());
    assert_eq!(
        sc.zone.get("value_double"),
        Some(ZoneRange::Float { min: -2.0, max: 1e9 }),
        "NaN ignored"
    );
    assert_eq!(sc.zone.get("value_int"), Some(ZoneRange::Empty));
    assert_eq!(
        sc.zone.get("time_unix_nano"),
        Some(ZoneRange::UInt { min: 10, max: 30 })
    );
    let name = |n: &str| Probe {
        field_eq: pairs(&[(field::METRIC_NAME, n)]),
        ..Default::default()
    };
    assert_eq!(
        sc.may_match(&name("mem_bytes"), t.min_time, t.max_time),
        Verdict::MayMatch
    );
    assert_eq!(
        sc.may_match(&name("disk_bytes"), t.min_time, t.max_time),
        Verdict::Pruned(PruneRule::AttrIndex)
    );
    assert_eq!(
        sc.may_match(
            &Probe {
                trace_id: Some([1; 16]),
                ..Default::default()
            },
            t.min_time,
            t.max_time
        ),
        Verdict::MayMatch,
        "metrics have no id filter"
    );
}

fn ipc_round_trip(batch: &RecordBatch) -> RecordBatch {
    let mut buf = Vec::new();
    let mut w = FileWriter::try_new(&mut buf, &batch.schema()).expect("writer");
    w.write(batch).expect("write");
    w.finish().expect("finish");
    drop(w);
    let mut r = FileReader::try_new(Cursor::new(buf), None).expect("reader");
    let out = r.next().expect("one batch").expect("decode");
    assert!(r.next().is_none());
    out
}

fn sections_round_trip(t: &TableSet) {
    let sc = Sidecars::build(t).expect("build");
    let sections = sc.sections().expect("sections");
    let names: Vec<&str> = sections.iter().map(|(n, _)| *n).collect();
    let mut zone = None;
    let mut attrs = None;
    let mut bloom = None;
    let mut ranges = None;
    for (name, section) in sections {
        match (name, section) {
            (ZONE_MAP_SECTION, SidecarSection::Batch(b)) => zone = Some(ipc_round_trip(&b)),
            (ATTR_INDEX_SECTION, SidecarSection::Batch(b)) => attrs = Some(ipc_round_trip(&b)),
            (ID_BLOOM_SECTION, SidecarSection::Bytes(b)) => bloom = Some(b),
            (ROW_RANGES_SECTION, SidecarSection::Bytes(b)) => ranges = Some(b),
            (name, _) => panic!("unexpected section {name}"),
        }
    }
    let back = Sidecars::from_sections(
        &zone.expect("zone_map"),
        &attrs.expect("attr_index"),
        bloom.as_deref(),
        ranges.as_deref(),
    )
    .expect("decode");
    assert_eq!(back, sc, "{names:?}");
}

#[test]
fn sections_round_trip_through_ipc() {
    sections_round_trip(&logs_tables());
    sections_round_trip(&traces_tables());
    sections_round_trip(&metrics_tables());
    let mut corpus = Corpus::new(7, Cardinality::High);
    let mut b = SpansBuilder::default();
    b.append(&corpus.traces(3_000)).expect("append");
    sections_round_trip(&b.finish().expect("finish"));
}

#[test]
fn empty_blocks() {
    for t in [
        LogsBuilder::default().finish().expect("finish"),
        SpansBuilder::default().finish().expect("finish"),
        PointsBuilder::default().finish().expect("finish"),
    ] {
        let sc = Sidecars::build(&t).expect("build");
        sections_round_trip(&t);
        assert_eq!(sc.may_match(&Probe::default(), 0, 0), Verdict::MayMatch);
        let p = Probe {
            attr_eq: pairs(&[("k", "v")]),
            ..Default::default()
        };
        assert_eq!(sc.may_match(&p, 0, 0), Verdict::Pruned(PruneRule::AttrIndex));
    }
}

#[test]
fn missing_tables_are_errors() {
    let mut t = logs_tables();
    t.tables.retain(|(n, _)| *n != crate::schema::RESOURCE_ATTRS);
    assert!(matches!(Sidecars::build(&t), Err(SidecarError::Table(_))));
}

#[test]
fn corpus_logs_and_traces() {
    let mut corpus = Corpus::new(42, Cardinality::Low);
    let logs = corpus.logs(5_000);
    let traces = corpus.traces(5_000);

    let mut b = LogsBuilder::default();
    b.append(&logs).expect("append");
    let t = b.finish().expect("finish");
    let sc = Sidecars::build(&t).expect("build");
    let records: Vec<&LogRecord> = logs
        .resource_logs
        .iter()
        .flat_map(|r| &r.scope_logs)
        .flat_map(|s| &s.log_records)
        .collect();
    let sev = |f: fn(i32, i32) -> i32| records.iter().map(|r| r.severity_number).reduce(f).expect("rows");
    assert_eq!(
        sc.zone.get("severity_number"),
        Some(ZoneRange::Int {
            min: sev(i32::min).into(),
            max: sev(i32::max).into()
        })
    );
    let ids = sc.ids.as_ref().expect("ids");
    for r in records.iter().filter(|r| !r.trace_id.is_empty()) {
        assert!(ids.may_contain_trace(&id16(&r.trace_id)));
    }
    let services: BTreeSet<String> = corpus
        .resources()
        .iter()
        .flat_map(|r| &r.attributes)
        .filter(|kv| kv.key == "service.name")
        .filter_map(|kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
        .collect();
    assert!(!services.is_empty());
    let seen: BTreeSet<String> = logs
        .resource_logs
        .iter()
        .flat_map(|r| r.resource.iter().flat_map(|r| &r.attributes))
        .filter(|kv| kv.key == "service.name")
        .filter_map(|kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
        .collect();
    for service in &services {
        let p = Probe {
            resource_eq: pairs(&[("service.name", service)]),
            ..Default::default()
        };
        assert_eq!(
            sc.may_match(&p, t.min_time, t.max_time).is_pruned(),
            !seen.contains(service),
            "{service}"
        );
    }

    let mut b = SpansBuilder::default();
    b.append(&traces).expect("append");
    let t = b.finish().expect("finish");
    let sc = Sidecars::build(&t).expect("build");
    let spans: Vec<&Span> = traces
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
        .collect();
    let d = spans
        .iter()
        .map(|s| s.end_time_unix_nano.saturating_sub(s.start_time_unix_nano));
    let (min, max) = (d.clone().min().expect("rows"), d.max().expect("rows"));
    assert_eq!(sc.zone.get(DURATION), Some(ZoneRange::UInt { min, max }));
    let ids = sc.ids.as_ref().expect("ids");
    for s in &spans {
        assert!(ids.may_contain_trace(&id16(&s.trace_id)));
    }
}
