//! OTLP → Arrow → OTLP gives back an equal request (up to grouping order),
//! for generated requests full of edge cases, through the in-memory tables,
//! a hot block and a cold block.

use mira_core::convert::{LogsBuilder, PointsBuilder, SpansBuilder, logs_to_otlp, points_to_otlp, spans_to_otlp};
use mira_testkit::{arb, flatten};
use proptest::prelude::*;

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
}
