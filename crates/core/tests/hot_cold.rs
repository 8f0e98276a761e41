//! A cold block answers every query exactly as the hot block it was
//! rewritten from, and the scan's answers agree with a direct evaluation
//! over the OTLP records that went in.

use arrow::array::Array;
use mira_core::convert::{
    LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, logs_to_otlp, points_to_otlp, spans_to_otlp,
};
use mira_core::scan::{
    AttrMatcher, AttrScope, LineFilter, MatchOp, Order, Predicate, ScanRequest, compile_regex, scan,
};
use mira_core::tables::read_tables;
use mira_testkit::corpus::{Cardinality, Corpus};
use mira_testkit::flatten;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::logs::v1::LogRecord;

#[path = "support/blocks.rs"]
#[allow(dead_code)] // each test binary uses part of the support module
mod support;
use support::hot_and_cold;

fn attr(scope: AttrScope, key: &str, op: MatchOp) -> AttrMatcher {
    AttrMatcher {
        scope,
        key: key.into(),
        op,
    }
}

fn re(p: &str) -> regex::Regex {
    compile_regex(p, true).expect("regex")
}

fn log_predicates(t0: u64, t1: u64) -> Vec<(&'static str, ScanRequest)> {
    let mid = t0 + (t1 - t0) / 2;
    let req = |predicate: Predicate, order: Order, limit: Option<usize>| ScanRequest {
        predicate,
        order,
        limit,
    };
    vec![
        (
            "everything newest first",
            req(Predicate::default(), Order::NewestFirst, None),
        ),
        ("newest 100", req(Predicate::default(), Order::NewestFirst, Some(100))),
        ("oldest 7", req(Predicate::default(), Order::OldestFirst, Some(7))),
        (
            "second half",
            req(
                Predicate {
                    time: Some((mid, t1 + 1)),
                    ..Default::default()
                },
                Order::Stored,
                None,
            ),
        ),
        (
            "errors",
            req(
                Predicate {
                    min_severity: Some(17),
                    ..Default::default()
                },
                Order::NewestFirst,
                None,
            ),
        ),
        (
            "body contains",
            req(
                Predicate {
                    lines: vec![LineFilter::Contains("users".into())],
                    ..Default::default()
                },
                Order::NewestFirst,
                Some(50),
            ),
        ),
        (
            "body regex and not contains",
            req(
                Predicate {
                    lines: vec![
                        LineFilter::Regex(compile_regex("in [0-9]+ms", false).expect("re")),
                        LineFilter::NotContains("GET".into()),
                    ],
                    ..Default::default()
                },
                Order::NewestFirst,
                None,
            ),
        ),
        (
            "service equality",
            req(
                Predicate {
                    attrs: vec![attr(
                        AttrScope::Resource,
                        "service.name",
                        MatchOp::Eq("checkout".into()),
                    )],
                    ..Default::default()
                },
                Order::NewestFirst,
                None,
            ),
        ),
        (
            "service regex, record attr not equal",
            req(
                Predicate {
                    attrs: vec![
                        attr(
                            AttrScope::Resource,
                            "service.name",
                            MatchOp::Re(re("(checkout|cart).*")),
                        ),
                        attr(AttrScope::Record, "http.method", MatchOp::Ne("GET".into())),
                    ],
                    ..Default::default()
                },
                Order::OldestFirst,
                Some(1000),
            ),
        ),
        (
            "int attribute as text",
            req(
                Predicate {
                    attrs: vec![attr(AttrScope::Record, "http.status_code", MatchOp::Eq("500".into()))],
                    ..Default::default()
                },
                Order::NewestFirst,
                None,
            ),
        ),
        (
            "absent key reads as empty",
            req(
                Predicate {
                    attrs: vec![attr(AttrScope::Record, "no.such.key", MatchOp::NotRe(re(".+")))],
                    ..Default::default()
                },
                Order::Stored,
                Some(10),
            ),
        ),
    ]
}

#[test]
fn cold_logs_answer_like_hot() {
    let mut corpus = Corpus::new(11, Cardinality::Low);
    let mut b = LogsBuilder::default();
    for _ in 0..4 {
        b.append(&corpus.logs(5000)).expect("append");
    }
    let tables = b.finish().expect("finish");
    let (hot, cold) = hot_and_cold(&tables);
    let mut nonempty = 0;
    for (name, req) in log_predicates(tables.min_time, tables.max_time) {
        let h = scan(&hot, &req).expect("hot scan");
        let c = scan(&cold, &req).expect("cold scan");
        assert_eq!(h.rows, c.rows, "{name}: rows differ");
        assert_eq!(h.batch, c.batch, "{name}: columns differ");
        let t = scan(&tables, &req).expect("table scan");
        assert_eq!(h.rows, t.rows, "{name}: block and in-memory tables differ");
        nonempty += usize::from(!h.rows.is_empty());
    }
    assert!(
        nonempty >= 8,
        "too few predicates matched anything ({nonempty}); the corpus changed?"
    );
    let hot_req = logs_to_otlp(&read_tables(&hot, None).expect("hot")).expect("otlp");
    let cold_req = logs_to_otlp(&read_tables(&cold, None).expect("cold")).expect("otlp");
    assert_eq!(flatten::logs(&hot_req), flatten::logs(&cold_req));
}

#[test]
fn cold_spans_and_points_answer_like_hot() {
    let mut corpus = Corpus::new(12, Cardinality::High);
    let mut s = SpansBuilder::default();
    s.append(&corpus.traces(4000)).expect("append");
    let spans = s.finish().expect("finish");
    let (hot, cold) = hot_and_cold(&spans);
    let some_trace = {
        let root = spans.get(mira_core::schema::SPANS).expect("spans");
        let ids = root
            .column_by_name("trace_id")
            .and_then(|c| c.as_any().downcast_ref::<arrow::array::FixedSizeBinaryArray>().cloned())
            .expect("trace ids");
        let mut id = [0u8; 16];
        id.copy_from_slice(ids.value(ids.len() / 2));
        id
    };
    let reqs = [
        Predicate {
            trace_id: Some(some_trace),
            ..Default::default()
        },
        Predicate {
            min_duration: Some(1_000_000),
            ..Default::default()
        },
        Predicate {
            span_name: Some(MatchOp::Re(re("GET.*"))),
            ..Default::default()
        },
    ];
    for p in reqs {
        let req = ScanRequest {
            predicate: p.clone(),
            ..Default::default()
        };
        let h = scan(&hot, &req).expect("hot");
        assert_eq!(h.rows, scan(&cold, &req).expect("cold").rows, "{p:?}");
        if p.trace_id.is_some() {
            assert!(!h.rows.is_empty(), "the trace we picked was not found");
        }
    }
    assert_eq!(
        flatten::traces(&spans_to_otlp(&read_tables(&hot, None).expect("hot")).expect("otlp")),
        flatten::traces(&spans_to_otlp(&read_tables(&cold, None).expect("cold")).expect("otlp"))
    );

    let mut m = PointsBuilder::default();
    m.append(&corpus.metrics(4000)).expect("append");
    let points = m.finish().expect("finish");
    let (hot, cold) = hot_and_cold(&points);
    let name = mira_core::convert::columns::DictStr::new(
        points.get(mira_core::schema::SERIES).expect("series"),
        "series",
        "metric_name",
    )
    .expect("names")
    .get(0)
    .expect("a name")
    .to_owned();
    let req = ScanRequest {
        predicate: Predicate {
            metric_name: Some(name),
            ..Default::default()
        },
        ..Default::default()
    };
    let h = scan(&hot, &req).expect("hot");
    assert!(!h.rows.is_empty());
    assert_eq!(h.rows, scan(&cold, &req).expect("cold").rows);
    assert_eq!(
        flatten::metrics(&points_to_otlp(&read_tables(&hot, None).expect("hot")).expect("otlp")),
        flatten::metrics(&points_to_otlp(&read_tables(&cold, None).expect("cold")).expect("otlp"))
    );
}

fn body(r: &LogRecord) -> &str {
    match r.body.as_ref().and_then(|b| b.value.as_ref()) {
        Some(Value::StringValue(s)) => s,
        _ => "",
    }
}

/// The scan agrees with filtering the OTLP records by hand.
#[test]
fn scan_matches_a_direct_evaluation() {
    let mut corpus = Corpus::new(13, Cardinality::Low);
    let req = corpus.logs(20_000);
    let mut b = LogsBuilder::default();
    b.append(&req).expect("append");
    let tables = b.finish().expect("finish");
    let (hot, _) = hot_and_cold(&tables);

    // Expected: errors from service "checkout" whose body contains "in ".
    let mut want: Vec<(u64, String)> = Vec::new();
    for rl in &req.resource_logs {
        let service = rl
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.as_ref());
        let is_checkout = matches!(service, Some(Value::StringValue(s)) if s == "checkout");
        for sl in &rl.scope_logs {
            for r in &sl.log_records {
                if is_checkout && r.severity_number >= 17 && body(r).contains("in ") {
                    want.push((r.time_unix_nano, body(r).to_owned()));
                }
            }
        }
    }
    want.sort_by_key(|w| std::cmp::Reverse(w.0));
    want.truncate(25);
    assert!(
        !want.is_empty(),
        "the corpus has no checkout errors; pick another predicate"
    );

    let out = scan(
        &hot,
        &ScanRequest {
            predicate: Predicate {
                attrs: vec![attr(
                    AttrScope::Resource,
                    "service.name",
                    MatchOp::Eq("checkout".into()),
                )],
                min_severity: Some(17),
                lines: vec![LineFilter::Contains("in ".into())],
                ..Default::default()
            },
            order: Order::NewestFirst,
            limit: Some(25),
        },
    )
    .expect("scan");
    let bodies = out
        .batch
        .column_by_name("body")
        .and_then(|c| c.as_any().downcast_ref::<arrow::array::StringArray>().cloned())
        .expect("body");
    let got: Vec<(u64, String)> = out
        .times
        .iter()
        .enumerate()
        .map(|(i, t)| (*t, bodies.value(i).to_owned()))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn bad_predicates_are_refused() {
    let mut corpus = Corpus::new(14, Cardinality::Low);
    let mut b = LogsBuilder::default();
    b.append(&corpus.logs(100)).expect("append");
    let tables = b.finish().expect("finish");
    let reversed = ScanRequest {
        predicate: Predicate {
            time: Some((10, 5)),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(
        scan(&tables, &reversed)
            .expect_err("reversed range")
            .to_string()
            .contains("after its end")
    );
    let wrong_signal = ScanRequest {
        predicate: Predicate {
            metric_name: Some("x".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(scan(&tables, &wrong_signal).is_err());
    assert!(compile_regex("(", true).is_err());
    assert!(compile_regex(&"a".repeat(10_000), true).is_err());
    // Nested repetition compiles to a linear-time automaton or is refused
    // for size; either way it never backtracks.
    if let Ok(r) = compile_regex("(a+)+$", true) {
        assert!(!r.is_match(&format!("{}b", "a".repeat(50_000))));
    }
}

/// Every buffer of every column of every table of a memory-mapped hot block
/// — dictionaries, union children and run-end encoded parents included —
/// points into the mapping: nothing was copied.
#[test]
fn hot_tables_read_zero_copy_from_the_mapping() {
    use arrow::array::ArrayData;
    use mira_core::block::{Block, VerifyCache};
    use mira_core::tables::write_hot;
    use mira_core::{BlockId, TenantId};
    use std::sync::Arc;

    fn inside(d: &ArrayData, lo: usize, hi: usize, what: &str) {
        for b in d.buffers() {
            let p = b.as_ptr() as usize;
            assert!(
                b.is_empty() || (p >= lo && p + b.len() <= hi),
                "{what}: a buffer lies outside the mapping"
            );
        }
        if let Some(n) = d.nulls() {
            let p = n.buffer().as_ptr() as usize;
            assert!(p >= lo && p < hi, "{what}: a validity buffer lies outside the mapping");
        }
        for c in d.child_data() {
            inside(c, lo, hi, what);
        }
    }

    let mut corpus = Corpus::new(15, Cardinality::Low);
    let mut sets = Vec::new();
    let mut l = LogsBuilder::default();
    l.append(&corpus.logs(3000)).expect("append");
    sets.push(l.finish().expect("finish"));
    let mut s = SpansBuilder::default();
    s.append(&corpus.traces(3000)).expect("append");
    sets.push(s.finish().expect("finish"));
    let mut m = PointsBuilder::default();
    m.append(&corpus.metrics(3000)).expect("append");
    sets.push(m.finish().expect("finish"));

    let dir = tempfile::tempdir().expect("tempdir");
    for (i, tables) in sets.iter().enumerate() {
        let path = dir.path().join(format!("{i}.mira"));
        std::fs::write(
            &path,
            write_hot(tables, BlockId::new(), TenantId::default_tenant()).expect("write"),
        )
        .expect("write file");
        let block = Block::open_file(&path, Arc::new(VerifyCache::new(64))).expect("open");
        let (lo, hi) = (
            block.data().as_ptr() as usize,
            block.data().as_ptr() as usize + block.data().len(),
        );
        let read = read_tables(&block, None).expect("read");
        assert_eq!(read.tables.len(), tables.tables.len());
        for (name, batch) in &read.tables {
            for (col, field) in batch.columns().iter().zip(batch.schema().fields()) {
                inside(&col.to_data(), lo, hi, &format!("{name}.{}", field.name()));
            }
        }
    }
}

/// Metric points keep their names, attributes and resource in `series`:
/// scans over them agree with counting the OTLP points directly.
#[test]
fn metric_scans_match_a_direct_count() {
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let mut corpus = Corpus::new(16, Cardinality::Low);
    let req = corpus.metrics(3000);
    let mut b = PointsBuilder::default();
    b.append(&req).expect("append");
    let (hot, cold) = hot_and_cold(&b.finish().expect("finish"));

    // Pick the first point's first string attribute and its resource's service.
    let rm = &req.resource_metrics[0];
    let service = rm
        .resource
        .as_ref()
        .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
        .and_then(|kv| kv.value.clone())
        .and_then(|v| v.value);
    let Some(Value::StringValue(service)) = service else {
        panic!("no service.name")
    };
    let points = |m: &opentelemetry_proto::tonic::metrics::v1::Metric| -> Vec<Vec<opentelemetry_proto::tonic::common::v1::KeyValue>> {
        match &m.data {
            Some(Data::Gauge(g)) => g.data_points.iter().map(|p| p.attributes.clone()).collect(),
            Some(Data::Sum(s)) => s.data_points.iter().map(|p| p.attributes.clone()).collect(),
            Some(Data::Histogram(h)) => h.data_points.iter().map(|p| p.attributes.clone()).collect(),
            Some(Data::ExponentialHistogram(h)) => h.data_points.iter().map(|p| p.attributes.clone()).collect(),
            Some(Data::Summary(s)) => s.data_points.iter().map(|p| p.attributes.clone()).collect(),
            None => Vec::new(),
        }
    };
    let first = &rm.scope_metrics[0].metrics[0];
    let (key, value) = points(first)[0]
        .iter()
        .find_map(|kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(s)) => Some((kv.key.clone(), s.clone())),
            _ => None,
        })
        .expect("a string attribute");

    let mut want = 0;
    for rm in &req.resource_metrics {
        let svc = rm
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"));
        let same_service = matches!(svc.and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref()), Some(Value::StringValue(s)) if *s == service);
        for m in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
            if m.name != first.name || !same_service {
                continue;
            }
            want += points(m)
                .iter()
                .filter(|attrs| {
                    attrs.iter().any(|kv| {
                        kv.key == key
                            && matches!(kv.value.as_ref().and_then(|v| v.value.as_ref()), Some(Value::StringValue(s)) if *s == value)
                    })
                })
                .count();
        }
    }
    assert!(want > 0);
    let req = ScanRequest {
        predicate: Predicate {
            metric_name: Some(first.name.clone()),
            attrs: vec![
                attr(AttrScope::Resource, "service.name", MatchOp::Eq(service)),
                attr(AttrScope::Record, &key, MatchOp::Eq(value)),
            ],
            ..Default::default()
        },
        order: Order::Stored,
        limit: None,
    };
    let h = scan(&hot, &req).expect("hot");
    assert_eq!(h.rows.len(), want);
    assert_eq!(h.rows, scan(&cold, &req).expect("cold").rows);
}

#[test]
fn scans_need_only_the_tables_they_name_and_row_selection_matches_whole_conversion() {
    use mira_core::convert::{log_rows, spans_to_otlp_rows};
    use mira_core::scan::tables_needed;
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};
    use prost::Message;

    let mut corpus = Corpus::new(21, Cardinality::High);
    let mut b = LogsBuilder::default();
    b.append(&corpus.logs(3000)).expect("append");
    let tables = b.finish().expect("finish");
    let (hot, _) = hot_and_cold(&tables);
    let all_rows: Vec<u32> = (0..scan(&hot, &ScanRequest::default()).expect("scan").rows_scanned as u32).collect();
    for (name, req) in log_predicates(tables.min_time, tables.max_time) {
        // Only the named tables: a scan that read another would fail.
        let needed = tables_needed(mira_core::Signal::Logs, &req.predicate);
        let some = read_tables(&hot, Some(&needed)).expect("needed tables");
        let full = scan(&hot, &req).expect("full scan");
        assert_eq!(
            scan(&some, &req).expect("scan over needed tables").rows,
            full.rows,
            "{name}"
        );
    }
    // Every row selected one by one gives back what whole conversion does.
    let as_request = |rows: Vec<mira_core::convert::LogRow>| ExportLogsServiceRequest {
        resource_logs: rows
            .into_iter()
            .map(|r| ResourceLogs {
                resource: r.resource,
                schema_url: r.resource_schema_url,
                scope_logs: vec![ScopeLogs {
                    scope: r.scope,
                    schema_url: r.scope_schema_url,
                    log_records: vec![r.record],
                }],
            })
            .collect(),
    };
    let all = read_tables(&hot, None).expect("tables");
    assert_eq!(
        flatten::logs(&as_request(log_rows(&all, &all_rows).expect("rows"))),
        flatten::logs(&logs_to_otlp(&all).expect("otlp"))
    );
    assert!(
        log_rows(&all, &[all_rows.len() as u32]).is_err(),
        "a row past the end is refused"
    );

    // One trace's spans: exactly the spans of the whole conversion with that id.
    let mut s = SpansBuilder::default();
    s.append(&corpus.traces(3000)).expect("append");
    let spans = s.finish().expect("finish");
    let (hot, _) = hot_and_cold(&spans);
    let all = read_tables(&hot, None).expect("tables");
    let whole = flatten::traces(&spans_to_otlp(&all).expect("otlp"));
    assert_eq!(
        flatten::traces(&spans_to_otlp_rows(&all, None).expect("all rows")),
        whole
    );
    let first = ExportTraceServiceRequest::decode(whole[whole.len() / 2].as_slice()).expect("leaf");
    let trace_id = first.resource_spans[0].scope_spans[0].spans[0].trace_id.clone();
    let mut id = [0u8; 16];
    id.copy_from_slice(&trace_id);
    let req = ScanRequest {
        predicate: Predicate {
            trace_id: Some(id),
            ..Default::default()
        },
        order: Order::Stored,
        limit: None,
    };
    let rows = scan(&hot, &req).expect("scan").rows;
    let expected: Vec<Vec<u8>> = whole
        .iter()
        .filter(|leaf| {
            let r = ExportTraceServiceRequest::decode(leaf.as_slice()).expect("leaf");
            r.resource_spans[0].scope_spans[0].spans[0].trace_id == trace_id
        })
        .cloned()
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(
        flatten::traces(&spans_to_otlp_rows(&all, Some(&rows)).expect("rows")),
        expected
    );
}

/// The parallel Parquet encoder writes exactly the bytes `ArrowWriter`
/// writes for the same table and row groups, for every table of every
/// signal (attribute tables in their cold layout), with groups small
/// enough that each table has several.
#[test]
fn parallel_parquet_encoding_equals_the_arrow_writer() {
    use mira_core::cold::{cold_layout, encode_parquet_grouped, writer_properties};
    use parquet::arrow::ArrowWriter;
    let mut corpus = Corpus::new(13, Cardinality::High);
    let mut logs = LogsBuilder::default();
    logs.append(&corpus.logs(3000)).expect("append logs");
    let mut spans = SpansBuilder::default();
    spans.append(&corpus.traces(1500)).expect("append spans");
    let mut points = PointsBuilder::default();
    points.append(&corpus.metrics(1500)).expect("append points");
    let sets = [
        logs.finish().expect("logs"),
        spans.finish().expect("spans"),
        points.finish().expect("points"),
    ];
    let mut compared = 0;
    for tables in &sets {
        for &name in mira_core::convert::table_names(tables.signal) {
            let batch = cold_layout(name, tables.get(name).expect("table")).expect("cold layout");
            for group in [97, 1000, 1 << 20] {
                let parallel = encode_parquet_grouped(&batch, group).expect("parallel");
                let mut serial = Vec::new();
                let mut w = ArrowWriter::try_new(&mut serial, batch.schema(), Some(writer_properties(&batch, group)))
                    .expect("writer");
                w.write(&batch).expect("write");
                w.close().expect("close");
                assert!(
                    parallel == serial,
                    "{}/{name} with groups of {group}: {} bytes parallel, {} serial",
                    tables.signal,
                    parallel.len(),
                    serial.len()
                );
                compared += usize::from(batch.num_rows() > group);
            }
        }
    }
    assert!(compared >= 6, "too few tables spanned several groups ({compared})");
}
