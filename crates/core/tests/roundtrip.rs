//! OTLP → Arrow → OTLP gives back an equal request (up to grouping order),
//! for generated requests full of edge cases, through the in-memory tables,
//! a hot block and a cold block.

use mira_core::convert::TableSet;
use mira_core::convert::{
    LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, logs_to_otlp, points_to_otlp, spans_to_otlp,
};
use mira_testkit::{arb, flatten};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
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
    }
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
