//! Merging blocks (the compactor's merge, hot and cold): the merged block
//! holds exactly the records of its inputs, in their order, with a lineage
//! that maps every row to the identical record of an input (and composes
//! across merges of merges); it answers every scan as the inputs do
//! together, and its sidecars never prune a block that holds a match.

use std::sync::Arc;

use mira_core::block::{Block, VerifyCache};
use mira_core::block::{Level, Manifest};
use mira_core::cold::rewrite_cold;
use mira_core::compact::{
    merge_blocks, merge_blocks_at, merge_blocks_cold, merge_on_arrow, merge_tables, merge_via_otlp,
};
use mira_core::convert::{
    LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, TableSet, logs_to_otlp, points_to_otlp, spans_to_otlp,
};
use mira_core::lineage::Lineage;
use mira_core::scan::{AttrMatcher, AttrScope, LineFilter, MatchOp, Predicate, ScanRequest, prune, scan};
use mira_core::sidecar::Verdict;
use mira_core::tables::{read_tables, write_hot};
use mira_core::{BlockId, Error, Signal, TenantId};
use mira_testkit::corpus::{Cardinality, Corpus};
use mira_testkit::{arb, flatten};
use proptest::prelude::*;

#[path = "support/merged.rs"]
#[allow(dead_code)] // each test binary uses part of the support module
mod merged;
use merged::{check_same_as_otlp, row_leaves};

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
    let merged_cold = Block::from_bytes(merge_blocks_cold(&inputs, BlockId::new()).expect("merge cold"), cache())
        .expect("open merged cold");
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
        assert_eq!(count(&merged_cold, p), want, "merged cold: {p:?}");
        if want > 0 {
            for b in [&out, &cold, &merged_cold] {
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

// ---- Row order and lineage ----

/// One block holding `reqs` appended in turn to one builder, then the
/// first again: a resource of the first request recurs after the others',
/// which a regrouping round trip would move.
fn interleaved<B: SignalBuilder>(reqs: &[B::Request]) -> Block {
    let mut b = B::default();
    for r in reqs.iter().chain(reqs.first()) {
        b.append(r).expect("append");
    }
    block(&b.finish().expect("finish"))
}

/// Per root row, the columns that do not refer to block-local rows, as
/// text (so rows of different blocks compare).
fn root_values(b: &Block) -> Vec<String> {
    use arrow::util::display::{ArrayFormatter, FormatOptions};
    let t = read_tables(b, None).expect("read");
    let root = t.get(mira_core::convert::root_table(b.meta().signal)).expect("root");
    let local = ["resource_id", "scope_id", "series"];
    let opts = FormatOptions::default();
    let cols: Vec<ArrayFormatter<'_>> = root
        .schema()
        .fields()
        .iter()
        .zip(root.columns())
        .filter(|(f, _)| !local.contains(&f.name().as_str()))
        .map(|(_, c)| ArrayFormatter::try_new(c.as_ref(), &opts).expect("format"))
        .collect();
    (0..root.num_rows())
        .map(|r| {
            cols.iter()
                .map(|c| c.value(r).to_string())
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect()
}

fn open(bytes: bytes::Bytes) -> Block {
    Block::from_bytes(bytes, cache()).expect("open")
}

fn origins(b: &Block) -> Vec<(BlockId, u32)> {
    let l = b.lineage().expect("lineage").expect("a merged block has a lineage");
    l.origins(&(0..b.meta().rows as u32).collect::<Vec<_>>())
}

/// Checks one merge of `inputs` at both levels: rows in concatenation
/// order, lineage origins unique and each the identical record of an
/// input, a merge of two partial merges giving the same origins and rows.
fn check_merge(inputs: &[Block]) -> Result<(), TestCaseError> {
    let want_origins: Vec<(BlockId, u32)> = inputs
        .iter()
        .flat_map(|b| (0..b.meta().rows as u32).map(move |j| (b.meta().block_id, j)))
        .collect();
    let want_leaves: Vec<Vec<u8>> = inputs.iter().flat_map(row_leaves).collect();
    let want_values: Vec<String> = inputs.iter().flat_map(root_values).collect();
    let hot = open(merge_blocks(inputs, BlockId::new()).expect("merge"));
    let cold = open(merge_blocks_cold(inputs, BlockId::new()).expect("merge cold"));
    prop_assert_eq!(hot.meta().level, Level::Hot);
    prop_assert_eq!(cold.meta().level, Level::Cold);
    for out in [&hot, &cold] {
        prop_assert_eq!(out.meta().rows, want_origins.len() as u64);
        // Row k of the output is row j of input i, in concatenation order.
        prop_assert_eq!(&root_values(out), &want_values);
        prop_assert_eq!(&row_leaves(out), &want_leaves);
        prop_assert_eq!(&origins(out), &want_origins);
    }
    // Origins are unique.
    let mut seen = want_origins.clone();
    seen.sort();
    seen.dedup();
    prop_assert_eq!(seen.len(), want_origins.len());

    // Nested merges compose: a merge of partial merges (and a cold rewrite
    // of one) points at the first blocks, row for row.
    if inputs.len() >= 2 {
        let (a, b) = inputs.split_at(inputs.len() / 2);
        let left = open(merge_blocks(a, BlockId::new()).expect("merge left"));
        let right = open(merge_blocks_at(b, BlockId::new(), Level::Cold).expect("merge right"));
        let right = open(rewrite_cold(&right, BlockId::new()).expect("rewrite"));
        let nested = open(merge_blocks(&[left, right], BlockId::new()).expect("merge of merges"));
        prop_assert_eq!(&origins(&nested), &want_origins);
        prop_assert_eq!(&row_leaves(&nested), &want_leaves);
        prop_assert_eq!(
            nested.lineage().expect("read").map(|l| l.runs().len()),
            hot.lineage().expect("read").map(|l| l.runs().len())
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn merged_logs_keep_row_order_and_lineage(reqs in proptest::collection::vec(arb::logs_request(), 1..5)) {
        let inputs: Vec<Block> = reqs.windows(2).map(interleaved::<LogsBuilder>).chain(blocks::<LogsBuilder>(&reqs[..1])).collect();
        check_merge(&inputs)?;
    }

    #[test]
    fn merged_spans_keep_row_order_and_lineage(reqs in proptest::collection::vec(arb::traces_request(), 1..5)) {
        let inputs: Vec<Block> = reqs.windows(2).map(interleaved::<SpansBuilder>).chain(blocks::<SpansBuilder>(&reqs[..1])).collect();
        check_merge(&inputs)?;
    }

    #[test]
    fn merged_points_keep_row_order_and_lineage(reqs in proptest::collection::vec(arb::metrics_request(), 1..5)) {
        let inputs: Vec<Block> = reqs.windows(2).map(interleaved::<PointsBuilder>).chain(blocks::<PointsBuilder>(&reqs[..1])).collect();
        check_merge(&inputs)?;
    }
}

#[test]
fn blocks_without_a_lineage_section_are_their_own_origin() {
    let mut corpus = Corpus::new(5, Cardinality::Low);
    let mut b = LogsBuilder::default();
    b.append(&corpus.logs(30)).expect("append");
    // What the ingester (and every release before lineage) writes.
    let old = block(&b.finish().expect("finish"));
    assert!(old.manifest().section("lineage").is_none());
    assert_eq!(old.lineage().expect("read"), None);
    let id = old.meta().block_id;
    assert_eq!(old.lineage_or_identity().expect("identity"), Lineage::identity(id, 30));
    let merged = open(merge_blocks(&[old], BlockId::new()).expect("merge"));
    let l = merged.lineage().expect("read").expect("lineage");
    assert_eq!(l.runs().len(), 1);
    assert_eq!(l.origin(29), (id, 29));
}

#[test]
fn a_merge_output_footer_gives_its_time_range_and_rows() {
    let mut corpus = Corpus::new(9, Cardinality::Low);
    let inputs: Vec<Block> = (0..3)
        .map(|_| {
            let mut b = LogsBuilder::default();
            b.append(&corpus.logs(50)).expect("append");
            block(&b.finish().expect("finish"))
        })
        .collect();
    for level in [Level::Hot, Level::Cold] {
        let bytes = merge_blocks_at(&inputs, BlockId::new(), level).expect("merge");
        // The footer alone, as the compactor reads it before the PUT.
        let m = Manifest::from_tail(&bytes, bytes.len() as u64).expect("manifest");
        assert_eq!(m.meta.rows, 150);
        assert_eq!(m.meta.level, level);
        assert_eq!(
            m.meta.min_time,
            inputs.iter().map(|b| b.meta().min_time).min().unwrap_or(0)
        );
        assert_eq!(
            m.meta.max_time,
            inputs.iter().map(|b| b.meta().max_time).max().unwrap_or(0)
        );
    }
}

/// The tables of `inputs` as a merge reads them: each input hot, or
/// rewritten cold (attribute tables come back from the typed layout) when
/// its flag says so, or itself a merge of two copies of the request.
fn merge_inputs<B: SignalBuilder>(reqs: &[(B::Request, u8)]) -> Vec<TableSet>
where
    B::Request: Clone,
{
    reqs.iter()
        .map(|(r, how)| {
            let mut hot = blocks::<B>(&[r.clone(), r.clone()]);
            let b = match how % 3 {
                0 => hot.remove(0),
                1 => open(rewrite_cold(&hot[0], BlockId::new()).expect("cold")),
                _ => merged(&hot),
            };
            read_tables(&b, None).expect("read")
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn arrow_merge_of_logs_equals_the_otlp_path(
        reqs in proptest::collection::vec((arb::logs_request(), any::<u8>()), 1..5)
    ) {
        check_same_as_otlp(Signal::Logs, &merge_inputs::<LogsBuilder>(&reqs))?;
    }

    #[test]
    fn arrow_merge_of_points_equals_the_otlp_path(
        reqs in proptest::collection::vec((arb::metrics_request(), any::<u8>()), 1..5)
    ) {
        check_same_as_otlp(Signal::Metrics, &merge_inputs::<PointsBuilder>(&reqs))?;
    }

    #[test]
    fn arrow_merge_of_spans_equals_the_otlp_path(
        reqs in proptest::collection::vec((arb::traces_request(), any::<u8>()), 1..5)
    ) {
        check_same_as_otlp(Signal::Traces, &merge_inputs::<SpansBuilder>(&reqs))?;
    }
}

#[test]
fn arrow_merge_of_shared_resources_stores_them_once() {
    let mut corpus = Corpus::new(3, Cardinality::Low);
    let reqs: Vec<_> = (0..6).map(|_| (corpus.logs(200), 0u8)).collect();
    let inputs = merge_inputs::<LogsBuilder>(&reqs);
    let merged = merge_on_arrow(Signal::Logs, &inputs).expect("merge").expect("taken");
    let resources = |t: &TableSet| t.get(mira_core::schema::RESOURCES).expect("resources").num_rows();
    let sum: usize = inputs.iter().map(resources).sum();
    assert!(resources(&merged) < sum, "{} resources of {sum}", resources(&merged));
    assert_eq!(merged.rows, 1_200);
    check_same_as_otlp(Signal::Logs, &inputs).expect("same as the otlp path");
}

#[test]
fn arrow_merge_of_shared_series_stores_them_once() {
    let mut corpus = Corpus::new(4, Cardinality::Low);
    let reqs: Vec<_> = (0..6).map(|_| (corpus.metrics(200), 0u8)).collect();
    let inputs = merge_inputs::<PointsBuilder>(&reqs);
    let merged = merge_on_arrow(Signal::Metrics, &inputs).expect("merge").expect("taken");
    let series = |t: &TableSet| t.get(mira_core::schema::SERIES).expect("series").num_rows();
    let sum: usize = inputs.iter().map(series).sum();
    assert!(series(&merged) < sum, "{} series of {sum}", series(&merged));
    assert_eq!(merged.rows, inputs.iter().map(|t| t.rows).sum::<usize>());
    check_same_as_otlp(Signal::Metrics, &inputs).expect("same as the otlp path");
}

/// A logs input whose attribute table is out of parent order (no builder
/// writes that): the Arrow merge declines it, and the merge still gives
/// the OTLP path's tables.
#[test]
fn inputs_off_the_builders_layout_take_the_otlp_path() {
    use mira_core::attrs::AttrBuilder;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
    let mut corpus = Corpus::new(9, Cardinality::Low);
    let reqs: Vec<_> = (0..2).map(|_| (corpus.logs(3), 0u8)).collect();
    let mut inputs = merge_inputs::<LogsBuilder>(&reqs);
    let kv = |v: &str| KeyValue {
        key: "k".into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        key_strindex: 0,
    };
    let mut attrs = AttrBuilder::default();
    attrs.append(2, &kv("two"));
    attrs.append(0, &kv("zero"));
    let attrs = attrs.finish().expect("attrs");
    for (name, batch) in &mut inputs[1].tables {
        if *name == mira_core::schema::LOG_ATTRS {
            *batch = attrs.clone();
        }
    }
    assert!(merge_on_arrow(Signal::Logs, &inputs).expect("merge").is_none());
    let otlp = merge_via_otlp(Signal::Logs, &inputs).expect("otlp merge");
    let got = flatten::logs(&logs_to_otlp(&otlp).expect("otlp"));
    assert_eq!(got.len(), 6);
    let third = mira_core::convert::log_rows(&otlp, &[3, 5]).expect("rows");
    let values: Vec<_> = third.iter().map(|r| r.record.attributes.clone()).collect();
    assert_eq!(values, vec![vec![kv("zero")], vec![kv("two")]]);
}
