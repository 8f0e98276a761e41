//! Merging blocks (the compactor's hot merge): the merged block holds
//! exactly the records of its inputs, answers every scan as the inputs do
//! together, and its sidecars never prune a block that holds a match.

use std::sync::Arc;

use mira_core::block::{Block, VerifyCache};
use mira_core::cold::rewrite_cold;
use mira_core::compact::{merge_blocks, merge_tables};
use mira_core::convert::{
    LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, TableSet, logs_to_otlp, points_to_otlp, spans_to_otlp,
};
use mira_core::scan::{AttrMatcher, AttrScope, LineFilter, MatchOp, Predicate, ScanRequest, prune, scan};
use mira_core::sidecar::Verdict;
use mira_core::tables::{read_tables, write_hot};
use mira_core::{BlockId, Error, TenantId};
use mira_testkit::corpus::{Cardinality, Corpus};
use mira_testkit::{arb, flatten};
use proptest::prelude::*;

fn cache() -> Arc<VerifyCache> {
    Arc::new(VerifyCache::new(256))
}

fn block(tables: &TableSet) -> Block {
    let bytes = write_hot(tables, BlockId::new(), TenantId::default_tenant()).expect("write hot");
    Block::from_bytes(bytes, cache()).expect("open")
}

fn blocks<B: SignalBuilder>(reqs: &[B::Request]) -> Vec<Block> {
    reqs.iter()
        .map(|r| {
            let mut b = B::default();
            b.append(r).expect("append");
            block(&b.finish().expect("finish"))
        })
        .collect()
}

fn merged(inputs: &[Block]) -> Block {
    let bytes = merge_blocks(inputs, BlockId::new()).expect("merge");
    Block::from_bytes(bytes, cache()).expect("open merged")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn merged_logs_hold_exactly_the_inputs_records(reqs in proptest::collection::vec(arb::logs_request(), 1..4)) {
        let inputs = blocks::<LogsBuilder>(&reqs);
        let mut all = reqs[0].clone();
        all.resource_logs = reqs.iter().flat_map(|r| r.resource_logs.iter().cloned()).collect();
        let out = merged(&inputs);
        prop_assert_eq!(out.meta().rows, inputs.iter().map(|b| b.meta().rows).sum::<u64>());
        let got = flatten::logs(&logs_to_otlp(&read_tables(&out, None).expect("read")).expect("otlp"));
        prop_assert_eq!(got, flatten::logs(&all));
    }

    #[test]
    fn merged_traces_hold_exactly_the_inputs_spans(reqs in proptest::collection::vec(arb::traces_request(), 1..4)) {
        let inputs = blocks::<SpansBuilder>(&reqs);
        let mut all = reqs[0].clone();
        all.resource_spans = reqs.iter().flat_map(|r| r.resource_spans.iter().cloned()).collect();
        let out = merged(&inputs);
        let got = flatten::traces(&spans_to_otlp(&read_tables(&out, None).expect("read")).expect("otlp"));
        prop_assert_eq!(got, flatten::traces(&all));
    }

    #[test]
    fn merged_metrics_hold_exactly_the_inputs_points(reqs in proptest::collection::vec(arb::metrics_request(), 1..4)) {
        let inputs = blocks::<PointsBuilder>(&reqs);
        let mut all = reqs[0].clone();
        all.resource_metrics = reqs.iter().flat_map(|r| r.resource_metrics.iter().cloned()).collect();
        let out = merged(&inputs);
        let got = flatten::metrics(&points_to_otlp(&read_tables(&out, None).expect("read")).expect("otlp"));
        prop_assert_eq!(got, flatten::metrics(&all));
    }
}

/// Rows a predicate selects.
fn count(src: &dyn mira_core::scan::TableSource, p: &Predicate) -> usize {
    scan(
        src,
        &ScanRequest {
            predicate: p.clone(),
            ..Default::default()
        },
    )
    .expect("scan")
    .rows
    .len()
}

#[test]
fn a_merged_block_answers_every_scan_as_its_inputs_do_and_prunes_no_match() {
    let mut corpus = Corpus::new(11, Cardinality::High);
    let inputs: Vec<Block> = (0..5)
        .map(|_| {
            let mut b = LogsBuilder::default();
            b.append(&corpus.logs(400)).expect("append");
            block(&b.finish().expect("finish"))
        })
        .collect();
    let out = merged(&inputs);
    assert_eq!(out.meta().rows, 2_000);
    assert_eq!(
        out.meta().min_time,
        inputs.iter().map(|b| b.meta().min_time).min().unwrap_or(0)
    );
    assert_eq!(
        out.meta().max_time,
        inputs.iter().map(|b| b.meta().max_time).max().unwrap_or(0)
    );
    let cold = Block::from_bytes(rewrite_cold(&out, BlockId::new()).expect("cold"), cache()).expect("open cold");
    // Values taken from the data, so each predicate matches something in
    // some input and (most) not in others.
    let tables = read_tables(&inputs[2], None).expect("read");
    let sample = logs_to_otlp(&tables).expect("otlp");
    let rl = &sample.resource_logs[0];
    let resource = &rl.resource.as_ref().expect("resource").attributes[0];
    let record = &rl.scope_logs[0].log_records[0];
    let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
        .as_ref()
        .and_then(|v| v.value.as_ref())
    {
        Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => s.clone(),
        _ => String::new(),
    };
    let word: String = text(&record.body).split_whitespace().next().unwrap_or("x").to_owned();
    let mid = (inputs[2].meta().min_time + inputs[2].meta().max_time) / 2;
    let predicates = [
        Predicate::default(),
        Predicate {
            time: Some((inputs[1].meta().min_time, mid)),
            ..Default::default()
        },
        Predicate {
            attrs: vec![AttrMatcher {
                scope: AttrScope::Resource,
                key: resource.key.clone(),
                op: MatchOp::Eq(text(&resource.value)),
            }],
            ..Default::default()
        },
        Predicate {
            lines: vec![LineFilter::Contains(word)],
            ..Default::default()
        },
        Predicate {
            trace_id: record.trace_id.clone().try_into().ok(),
            ..Default::default()
        },
        Predicate {
            lines: vec![LineFilter::Contains("no-such-token".into())],
            ..Default::default()
        },
    ];
    for (i, p) in predicates.iter().enumerate() {
        let want: usize = inputs.iter().map(|b| count(b, p)).sum();
        // All but the last match something; the last nothing.
        assert_eq!(want > 0, i + 1 < predicates.len(), "{p:?}");
        assert_eq!(count(&out, p), want, "{p:?}");
        assert_eq!(count(&cold, p), want, "cold: {p:?}");
        if want > 0 {
            for b in [&out, &cold] {
                assert_eq!(
                    prune(b, p).expect("prune"),
                    Verdict::MayMatch,
                    "pruned a block holding a match: {p:?}"
                );
            }
        }
    }
}

#[test]
fn blocks_of_other_signals_or_tenants_are_not_merged() {
    let mut corpus = Corpus::new(3, Cardinality::Low);
    let mut logs = LogsBuilder::default();
    logs.append(&corpus.logs(10)).expect("append");
    let logs = logs.finish().expect("finish");
    let mut spans = SpansBuilder::default();
    spans.append(&corpus.traces(10)).expect("append");
    let spans = spans.finish().expect("finish");
    let e = merge_tables(&[block(&logs), block(&spans)]).expect_err("two signals");
    assert!(matches!(e, Error::Merge(_)), "{e}");
    let other = TenantId::new("other").expect("tenant");
    let theirs = Block::from_bytes(write_hot(&logs, BlockId::new(), other).expect("write"), cache()).expect("open");
    let e = merge_tables(&[block(&logs), theirs]).expect_err("two tenants");
    assert!(e.to_string().contains("other"), "{e}");
    assert!(matches!(merge_tables(&[]), Err(Error::Merge(_))));
}
