//! OTLP → Arrow → OTLP gives back an equal request (up to grouping order),
//! for generated requests full of edge cases, through the in-memory tables,
//! a hot block and a cold block.

use arrow::array::{AsArray, RecordBatch, UInt32Array};
use arrow::datatypes::{UInt32Type, UInt64Type};
use mira_core::convert::TableSet;
use mira_core::convert::{
    LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, logs_to_otlp, points_by_series, points_to_otlp,
    spans_to_otlp,
};
use mira_core::schema;
use mira_testkit::corpus::{Cardinality, Corpus};
use mira_testkit::{arb, flatten};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use proptest::prelude::*;
use prost::Message;

#[path = "support/blocks.rs"]
mod support;
use support::through_blocks;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn logs_round_trip(reqs in proptest::collection::vec(arb::logs_request(), 1..3)) {
        let mut b = LogsBuilder::default();
        let mut all = reqs[0].clone();
        all.resource_logs.clear();
        for r in &reqs {
            b.append(r).expect("append");
            all.resource_logs.extend(r.resource_logs.iter().cloned());
        }
        let want = flatten::logs(&all);
        let tables = b.finish().expect("finish");
        for t in through_blocks(&tables) {
            let got = flatten::logs(&logs_to_otlp(&t).expect("to otlp"));
            prop_assert_eq!(&got, &want);
        }
    }

    #[test]
    fn traces_round_trip(reqs in proptest::collection::vec(arb::traces_request(), 1..3)) {
        let mut b = SpansBuilder::default();
        let mut all = reqs[0].clone();
        all.resource_spans.clear();
        for r in &reqs {
            b.append(r).expect("append");
            all.resource_spans.extend(r.resource_spans.iter().cloned());
        }
        let want = flatten::traces(&all);
        let tables = b.finish().expect("finish");
        for t in through_blocks(&tables) {
            let got = flatten::traces(&spans_to_otlp(&t).expect("to otlp"));
            prop_assert_eq!(&got, &want);
        }
    }

    #[test]
    fn metrics_round_trip(reqs in proptest::collection::vec(arb::metrics_request(), 1..3)) {
        let mut b = PointsBuilder::default();
        let mut all = reqs[0].clone();
        all.resource_metrics.clear();
        for r in &reqs {
            b.append(r).expect("append");
            all.resource_metrics.extend(r.resource_metrics.iter().cloned());
        }
        let want = flatten::metrics(&all);
        let tables = b.finish().expect("finish");
        for t in through_blocks(&tables) {
            let got = flatten::metrics(&points_to_otlp(&t).expect("to otlp"));
            prop_assert_eq!(&got, &want);
        }
        // Ordered by series (what a sealed block holds): the same points,
        // each series' in arrival order, its distribution still its own.
        let sorted = points_by_series(tables.clone()).expect("by series");
        check_by_series(&tables, &sorted);
        let mut want = want;
        want.sort();
        let mut got = flatten::metrics(&points_to_otlp(&sorted).expect("to otlp"));
        got.sort();
        prop_assert_eq!(got, want);
    }
}

/// Per series, the times of its points in row order.
fn times_by_series(t: &TableSet) -> std::collections::BTreeMap<u32, Vec<u64>> {
    let points = t.get(schema::POINTS).expect("points");
    let of = points
        .column_by_name("series")
        .expect("series")
        .as_primitive::<UInt32Type>();
    let time = points
        .column_by_name("time_unix_nano")
        .expect("time")
        .as_primitive::<UInt64Type>();
    let mut m = std::collections::BTreeMap::<u32, Vec<u64>>::new();
    for row in 0..points.num_rows() {
        m.entry(of.value(row)).or_default().push(time.value(row));
    }
    m
}

/// A `UInt32` column of one of `t`'s tables.
fn u32_column<'a>(t: &'a TableSet, table: &'static str, column: &str) -> &'a UInt32Array {
    t.get(table)
        .expect("table")
        .column_by_name(column)
        .expect("column")
        .as_primitive::<UInt32Type>()
}

/// `sorted` holds `before`'s points ordered by series, arrival order kept
/// within a series, and its distributions in point order.
fn check_by_series(before: &TableSet, sorted: &TableSet) {
    let of = u32_column(sorted, schema::POINTS, "series");
    assert!(
        of.values().windows(2).all(|w| w[0] <= w[1]),
        "points not ordered by series"
    );
    assert_eq!(times_by_series(before), times_by_series(sorted));
    let parent = u32_column(sorted, schema::POINT_DISTS, "parent");
    assert!(
        parent.values().windows(2).all(|w| w[0] < w[1]),
        "distributions not in point order"
    );
    let dists = sorted.get(schema::POINT_DISTS).expect("dists");
    assert_eq!(
        dists.num_rows(),
        before.get(schema::POINT_DISTS).expect("dists").num_rows()
    );
}

/// Points of many series sent interleaved, as scrapes arrive (every request
/// holds a slice of every series): ordered by series, each series' points
/// are one run, and the block reads back the same points.
#[test]
fn interleaved_points_are_ordered_by_series() {
    let mut corpus = Corpus::new(3, Cardinality::Low);
    let per_request = corpus.series_count() / 3 + 1;
    let mut b = PointsBuilder::default();
    let mut all = ExportMetricsServiceRequest::default();
    for _ in 0..12 {
        let r = corpus.metrics(per_request);
        b.append(&r).expect("append");
        all.resource_metrics.extend(r.resource_metrics);
    }
    let tables = b.finish().expect("finish");
    let of = tables
        .get(schema::POINTS)
        .expect("points")
        .column_by_name("series")
        .expect("series")
        .as_primitive::<UInt32Type>()
        .clone();
    assert!(
        !of.values().windows(2).all(|w| w[0] <= w[1]),
        "the corpus must interleave series for this test to mean anything"
    );
    let dists = tables.get(schema::POINT_DISTS).expect("dists").num_rows();
    assert!(dists > 0, "the corpus must hold histograms or summaries");
    let sorted = points_by_series(tables.clone()).expect("by series");
    check_by_series(&tables, &sorted);
    for t in through_blocks(&sorted) {
        let mut got = flatten::metrics(&points_to_otlp(&t).expect("to otlp"));
        got.sort();
        let mut want = flatten::metrics(&all);
        want.sort();
        assert_eq!(got, want);
    }
    // Already ordered: returned as it is.
    let again = points_by_series(sorted.clone()).expect("by series");
    assert_eq!(
        again.get(schema::POINTS).expect("points"),
        sorted.get(schema::POINTS).expect("points")
    );
}

/// A points table naming a series the block does not have is refused, not
/// a panic or an out-of-bounds write.
#[test]
fn points_by_series_refuses_a_dangling_series() {
    let mut corpus = Corpus::new(4, Cardinality::Low);
    let mut b = PointsBuilder::default();
    b.append(&corpus.metrics(50)).expect("append");
    b.append(&corpus.metrics(50)).expect("append");
    let mut tables = b.finish().expect("finish");
    let n_series = tables.get(schema::SERIES).expect("series").num_rows() as u32;
    for (name, batch) in &mut tables.tables {
        if *name == schema::POINTS {
            let at = batch.schema().index_of("series").expect("series");
            let mut cols = batch.columns().to_vec();
            let mut v: Vec<u32> = cols[at].as_primitive::<UInt32Type>().values().to_vec();
            v[0] = n_series + 7;
            cols[at] = std::sync::Arc::new(UInt32Array::from(v));
            *batch = RecordBatch::try_new(batch.schema(), cols).expect("batch");
        }
    }
    let err = points_by_series(tables).expect_err("a dangling series");
    assert!(err.to_string().contains("points"), "{err}");
}

/// Builds tables from encoded bytes both ways: the wire reader and prost.
fn both_ways(bytes: &[u8]) -> (Result<TableSet, String>, Result<TableSet, String>) {
    let mut fast = LogsBuilder::default();
    let a = fast
        .append_encoded(bytes)
        .map_err(|e| e.to_string())
        .and_then(|_| fast.finish().map_err(|e| e.to_string()));
    let mut slow = LogsBuilder::default();
    let b = ExportLogsServiceRequest::decode(bytes)
        .map_err(|e| e.to_string())
        .and_then(|r| slow.append(&r).map_err(|e| e.to_string()))
        .and_then(|_| slow.finish().map_err(|e| e.to_string()));
    (a, b)
}

fn same_tables(a: &TableSet, b: &TableSet) -> bool {
    a.rows == b.rows
        && a.min_time == b.min_time
        && a.max_time == b.max_time
        && a.tables.len() == b.tables.len()
        && a.tables
            .iter()
            .zip(&b.tables)
            .all(|((na, ta), (nb, tb))| na == nb && ta == tb)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The wire reader builds exactly what prost + append builds.
    #[test]
    fn wire_reader_matches_prost(req in arb::logs_request()) {
        let bytes = req.encode_to_vec();
        let (a, b) = both_ways(&bytes);
        let (a, b) = (a.expect("fast path"), b.expect("prost path"));
        prop_assert!(same_tables(&a, &b));
    }

    /// On damaged bytes both paths fail, or both succeed with equal tables.
    #[test]
    fn wire_reader_agrees_on_damaged_bytes(
        req in arb::logs_request(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        let mut bytes = req.encode_to_vec();
        if !bytes.is_empty() {
            for (at, v) in edits {
                let i = at % bytes.len();
                bytes[i] = v;
            }
            bytes.truncate(cut % (bytes.len() + 1));
        }
        match both_ways(&bytes) {
            (Ok(a), Ok(b)) => prop_assert!(same_tables(&a, &b)),
            (Err(_), Err(_)) => {}
            (a, b) => prop_assert!(false, "paths disagree: fast {:?} prost {:?}", a.map(|t| t.rows), b.map(|t| t.rows)),
        }
    }
}

#[test]
fn a_bad_id_refuses_the_whole_request() {
    let mut corpus = mira_testkit::corpus::Corpus::new(7, mira_testkit::corpus::Cardinality::Low);
    let mut req = corpus.logs(100);
    let last = req
        .resource_logs
        .last_mut()
        .and_then(|r| r.scope_logs.last_mut())
        .and_then(|s| s.log_records.last_mut());
    last.expect("a record").trace_id = vec![1, 2, 3];
    let mut b = LogsBuilder::default();
    let err = b.append(&req).expect_err("3-byte trace id accepted");
    assert!(err.to_string().contains("trace_id must be 16 bytes"), "{err}");
    assert_eq!(b.rows(), 0, "a refused request left rows behind");
    let err = b
        .append_encoded(&req.encode_to_vec())
        .expect_err("3-byte trace id accepted");
    assert!(err.to_string().contains("trace_id must be 16 bytes"), "{err}");
    assert_eq!(b.rows(), 0, "a refused request left rows behind");
    let err = b
        .append_encoded(&[0x0a, 0x05, 0x01])
        .expect_err("truncated protobuf accepted");
    assert!(err.to_string().contains("malformed protobuf"), "{err}");
}

/// Found by fuzzing: a scope named "\n\0" with no schema url and an empty
/// scope whose schema url is those scope bytes must stay two scopes.
#[test]
fn scope_and_schema_url_bytes_cannot_collide() {
    use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    let named = InstrumentationScope {
        name: "\n\0".into(),
        ..Default::default()
    };
    let url = String::from_utf8(named.encode_to_vec()).expect("utf8");
    let req = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![
                ScopeLogs {
                    scope: Some(named),
                    log_records: vec![LogRecord::default()],
                    schema_url: String::new(),
                },
                ScopeLogs {
                    scope: Some(InstrumentationScope::default()),
                    log_records: vec![LogRecord::default()],
                    schema_url: url,
                },
            ],
            ..Default::default()
        }],
    };
    let mut b = LogsBuilder::default();
    b.append(&req).expect("append");
    let back = logs_to_otlp(&b.finish().expect("finish")).expect("otlp");
    assert_eq!(flatten::logs(&back), flatten::logs(&req));
}
