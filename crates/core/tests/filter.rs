//! Merging with a row filter (a retention rewrite): the output holds
//! exactly the inputs' records the filter kept, in their order, with
//! their lineage origins; resources, scopes and series no kept record
//! uses are gone; the count of dropped rows balances rows in and out; a
//! filter that keeps nothing writes nothing, and one that keeps
//! everything writes what the plain merge writes.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::UInt32Array;
use mira_core::block::{Block, Level, VerifyCache};
use mira_core::compact::filter::{filter_tables, keep_unexpired, resource_attributes, row_resources};
use mira_core::compact::{FilteredBlock, RowFilter, merge_blocks, merge_blocks_at, merge_blocks_filtered};
use mira_core::convert::{
    LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, TableSet, logs_to_otlp, points_to_otlp, root_table,
    spans_to_otlp,
};
use mira_core::policy::Attributes;
use mira_core::scan::record_times;
use mira_core::schema;
use mira_core::tables::{read_tables, write_hot};
use mira_core::{BlockId, Signal, TenantId};
use mira_testkit::corpus::{Cardinality, Corpus};
use mira_testkit::{arb, flatten};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::resource::v1::Resource;
use proptest::prelude::*;
use prost::Message;

#[path = "support/merged.rs"]
#[allow(dead_code)] // each test binary uses part of the support module
mod merged;
use merged::{check_same_as_otlp, row_leaves};

fn cache() -> Arc<VerifyCache> {
    Arc::new(VerifyCache::new(256))
}

fn open(bytes: bytes::Bytes) -> Block {
    Block::from_bytes(bytes, cache()).expect("open")
}

fn block(tables: &TableSet) -> Block {
    open(write_hot(tables, BlockId::new(), TenantId::default_tenant()).expect("write hot"))
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

/// Input blocks from a corpus of 16 resources: three sealed blocks and a
/// merge of two more (so one input carries lineage runs of its own).
fn corpus_inputs<B: SignalBuilder>(seed: u64, mut next: impl FnMut(&mut Corpus) -> B::Request) -> Vec<Block> {
    let mut corpus = Corpus::new(seed, Cardinality::Low);
    let reqs: Vec<B::Request> = (0..5).map(|_| next(&mut corpus)).collect();
    let mut inputs = blocks::<B>(&reqs[..3]);
    let merged = merge_blocks(&blocks::<B>(&reqs[3..]), BlockId::new()).expect("merge");
    inputs.push(open(merged));
    inputs
}

/// The resource a one-record request (a [`row_leaves`] entry) holds its
/// record under, and the record's time (the log's effective time, the
/// span's start, the point's time).
fn leaf_context(signal: Signal, leaf: &[u8]) -> (Option<Resource>, u64) {
    match signal {
        Signal::Logs => {
            let mut r = ExportLogsServiceRequest::decode(leaf).expect("decode");
            let rl = r.resource_logs.remove(0);
            let rec = &rl.scope_logs[0].log_records[0];
            let t = if rec.time_unix_nano != 0 {
                rec.time_unix_nano
            } else {
                rec.observed_time_unix_nano
            };
            (rl.resource, t)
        }
        Signal::Traces => {
            let mut r = ExportTraceServiceRequest::decode(leaf).expect("decode");
            let rs = r.resource_spans.remove(0);
            let t = rs.scope_spans[0].spans[0].start_time_unix_nano;
            (rs.resource, t)
        }
        Signal::Metrics => {
            use opentelemetry_proto::tonic::metrics::v1::metric::Data;
            let mut r = ExportMetricsServiceRequest::decode(leaf).expect("decode");
            let rm = r.resource_metrics.remove(0);
            let t = match rm.scope_metrics[0].metrics[0].data.as_ref().expect("data") {
                Data::Gauge(g) => g.data_points[0].time_unix_nano,
                Data::Sum(s) => s.data_points[0].time_unix_nano,
                Data::Histogram(h) => h.data_points[0].time_unix_nano,
                Data::ExponentialHistogram(h) => h.data_points[0].time_unix_nano,
                Data::Summary(s) => s.data_points[0].time_unix_nano,
            };
            (rm.resource, t)
        }
    }
}

fn service(resource: &Option<Resource>) -> Option<String> {
    let attrs = &resource.as_ref()?.attributes;
    let kv = attrs.iter().find(|kv| kv.key == "service.name")?;
    match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// Per input, each row's flag by `keep` on its resource and time, read
/// from the records themselves (not through the filter's helpers).
fn flags_by_record(inputs: &[Block], keep: impl Fn(Option<&str>, u64) -> bool) -> Vec<Vec<bool>> {
    inputs
        .iter()
        .map(|b| {
            row_leaves(b)
                .iter()
                .map(|leaf| {
                    let (resource, t) = leaf_context(b.meta().signal, leaf);
                    keep(service(&resource).as_deref(), t)
                })
                .collect()
        })
        .collect()
}

/// The leaves as one request `flatten` canonicalises (the expected side
/// of an OTLP comparison).
fn flatten_leaves(signal: Signal, leaves: &[Vec<u8>]) -> Vec<Vec<u8>> {
    match signal {
        Signal::Logs => flatten::logs(&ExportLogsServiceRequest {
            resource_logs: leaves
                .iter()
                .flat_map(|l| {
                    ExportLogsServiceRequest::decode(l.as_slice())
                        .expect("decode")
                        .resource_logs
                })
                .collect(),
        }),
        Signal::Traces => flatten::traces(&ExportTraceServiceRequest {
            resource_spans: leaves
                .iter()
                .flat_map(|l| {
                    ExportTraceServiceRequest::decode(l.as_slice())
                        .expect("decode")
                        .resource_spans
                })
                .collect(),
        }),
        Signal::Metrics => flatten::metrics(&ExportMetricsServiceRequest {
            resource_metrics: leaves
                .iter()
                .flat_map(|l| {
                    ExportMetricsServiceRequest::decode(l.as_slice())
                        .expect("decode")
                        .resource_metrics
                })
                .collect(),
        }),
    }
}

fn flatten_block(t: &TableSet) -> Vec<Vec<u8>> {
    match t.signal {
        Signal::Logs => flatten::logs(&logs_to_otlp(t).expect("otlp")),
        Signal::Traces => flatten::traces(&spans_to_otlp(t).expect("otlp")),
        Signal::Metrics => flatten::metrics(&points_to_otlp(t).expect("otlp")),
    }
}

fn u32s(t: &TableSet, table: &'static str, column: &str) -> Vec<u32> {
    t.get(table)
        .expect("table")
        .column_by_name(column)
        .and_then(|c| c.as_any().downcast_ref::<UInt32Array>())
        .expect("u32 column")
        .values()
        .to_vec()
}

/// Every resource, scope and series of `t` is used by some root row.
fn assert_all_referenced(t: &TableSet) -> Result<(), TestCaseError> {
    let all = |n: usize| (0..n as u32).collect::<BTreeSet<u32>>();
    let rows = |name| t.get(name).expect("table").num_rows();
    let resources: BTreeSet<u32> = row_resources(t).expect("resources").into_iter().collect();
    prop_assert_eq!(resources, all(rows(schema::RESOURCES)), "unused resources");
    let scopes: BTreeSet<u32> = match t.signal {
        Signal::Metrics => {
            let used: BTreeSet<u32> = u32s(t, schema::POINTS, "series").into_iter().collect();
            prop_assert_eq!(&used, &all(rows(schema::SERIES)), "unused series");
            let of = u32s(t, schema::SERIES, "scope_id");
            used.iter().map(|&s| of[s as usize]).collect()
        }
        s => u32s(t, root_table(s), "scope_id").into_iter().collect(),
    };
    prop_assert_eq!(scopes, all(rows(schema::SCOPES)), "unused scopes");
    Ok(())
}

/// Merges `inputs` at `level` with `filter`, which must keep exactly the
/// rows `flags` flags, and checks the output against the inputs' kept
/// records: row for row in order, through OTLP, lineage origins, row
/// counts, time range, no unused resources, scopes or series. Returns the
/// output's tables (`None` when nothing was kept).
fn check_filtered(
    inputs: &[Block],
    level: Level,
    flags: &[Vec<bool>],
    filter: &RowFilter<'_>,
) -> Result<Option<TableSet>, TestCaseError> {
    let signal = inputs[0].meta().signal;
    let out: FilteredBlock = merge_blocks_filtered(inputs, BlockId::new(), level, filter).expect("filtered merge");
    let rows_in: u64 = inputs.iter().map(|b| b.meta().rows).sum();
    let kept = flags.iter().flatten().filter(|&&k| k).count() as u64;
    prop_assert_eq!(out.rows_in, rows_in);
    prop_assert_eq!(out.rows_out, kept);
    prop_assert_eq!(out.dropped_rows, rows_in - kept);

    let mut want_leaves = Vec::new();
    let mut want_origins = Vec::new();
    let mut times = Vec::new();
    for (b, f) in inputs.iter().zip(flags) {
        let rows: Vec<u32> = (0..b.meta().rows as u32).filter(|&r| f[r as usize]).collect();
        let leaves = row_leaves(b);
        want_leaves.extend(rows.iter().map(|&r| leaves[r as usize].clone()));
        want_origins.extend(b.lineage_or_identity().expect("lineage").origins(&rows));
        let t = read_tables(b, None).expect("read");
        let all = record_times(signal, t.get(root_table(signal)).expect("root")).expect("times");
        times.extend(rows.iter().map(|&r| all[r as usize]));
    }
    let Some(bytes) = out.bytes else {
        prop_assert_eq!(kept, 0, "nothing written, yet rows were kept");
        return Ok(None);
    };
    prop_assert!(kept > 0, "a block written for no rows");
    let b = open(bytes);
    prop_assert_eq!(b.meta().level, level);
    prop_assert_eq!(b.meta().rows, kept);
    prop_assert_eq!(b.meta().min_time, times.iter().copied().min().unwrap_or(0));
    prop_assert_eq!(b.meta().max_time, times.iter().copied().max().unwrap_or(0));
    prop_assert_eq!(&row_leaves(&b), &want_leaves, "kept records, row for row");
    let tables = read_tables(&b, None).expect("read output");
    prop_assert_eq!(
        flatten_block(&tables),
        flatten_leaves(signal, &want_leaves),
        "through OTLP"
    );
    let lineage = b
        .lineage()
        .expect("read lineage")
        .expect("a merged block has a lineage");
    prop_assert_eq!(lineage.origins(&(0..kept as u32).collect::<Vec<_>>()), want_origins);
    assert_all_referenced(&tables)?;
    Ok(Some(tables))
}

/// For each signal and level: the rows of one service's resources
/// dropped, the rest kept in order.
fn check_drop_service(inputs: &[Block]) {
    let signal = inputs[0].meta().signal;
    // The service of some row of the first input, so it is there.
    let first = row_leaves(&inputs[0]);
    let drop = service(&leaf_context(signal, &first[first.len() / 2]).0).expect("service.name");
    let flags = flags_by_record(inputs, |s, _| s != Some(drop.as_str()));
    let dropped = flags.iter().flatten().filter(|&&k| !k).count();
    let total: usize = flags.iter().map(Vec::len).sum();
    assert!(dropped > 0 && dropped < total, "{dropped} of {total} rows are {drop}'s");
    let filter = |_: usize, t: &TableSet| {
        keep_unexpired(t, |attrs| {
            (attrs.attr("service.name").as_deref() == Some(drop.as_str())).then_some(u64::MAX)
        })
    };
    for level in [Level::Hot, Level::Cold] {
        let out = check_filtered(inputs, level, &flags, &filter)
            .expect("filtered merge")
            .expect("rows kept");
        for attrs in resource_attributes(&out).expect("resource attributes") {
            assert_ne!(attrs.attr("service.name").as_deref(), Some(drop.as_str()), "{attrs:?}");
        }
    }
}

#[test]
fn dropping_a_service_from_logs_keeps_every_other_record_in_order() {
    check_drop_service(&corpus_inputs::<LogsBuilder>(21, |c| c.logs(300)));
}

#[test]
fn dropping_a_service_from_traces_keeps_every_other_span_in_order() {
    check_drop_service(&corpus_inputs::<SpansBuilder>(22, |c| c.traces(300)));
}

#[test]
fn dropping_a_service_from_metrics_keeps_every_other_point_in_order() {
    check_drop_service(&corpus_inputs::<PointsBuilder>(23, |c| c.metrics(400)));
}

#[test]
fn resource_attributes_are_read_as_text_by_key() {
    let inputs = corpus_inputs::<LogsBuilder>(24, |c| c.logs(50));
    let t = read_tables(&inputs[0], None).expect("read");
    let otlp = mira_core::convert::logs_to_otlp_in_row_order(&t).expect("otlp");
    let attrs = resource_attributes(&t).expect("attributes");
    let of = row_resources(&t).expect("row resources");
    // Logs are grouped under their resource in row order.
    let mut row = 0usize;
    for rl in &otlp.resource_logs {
        let resource = rl.resource.as_ref().expect("resource");
        let r = &attrs[of[row] as usize];
        for kv in &resource.attributes {
            let want = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                _ => String::new(),
            };
            assert_eq!(r.attr(&kv.key).as_deref(), Some(want.as_str()), "{}", kv.key);
        }
        assert_eq!(r.len(), resource.attributes.len());
        row += rl.scope_logs.iter().map(|s| s.log_records.len()).sum::<usize>();
    }
    assert_eq!(row, t.rows);
}

#[test]
fn dropping_a_services_old_logs_keeps_its_newer_ones() {
    let inputs = corpus_inputs::<LogsBuilder>(25, |c| c.logs(300));
    let first = row_leaves(&inputs[0]);
    let drop = service(&leaf_context(Signal::Logs, &first[0]).0).expect("service.name");
    let (min, max) = (
        inputs.iter().map(|b| b.meta().min_time).min().unwrap_or(0),
        inputs.iter().map(|b| b.meta().max_time).max().unwrap_or(0),
    );
    let cutoff = min + (max - min) / 2;
    let flags = flags_by_record(&inputs, |s, t| s != Some(drop.as_str()) || t >= cutoff);
    let of_service = flags_by_record(&inputs, |s, _| s == Some(drop.as_str()));
    let (mut old, mut new) = (0, 0);
    for (f, s) in flags.iter().flatten().zip(of_service.iter().flatten()) {
        match (s, f) {
            (true, false) => old += 1,
            (true, true) => new += 1,
            _ => {}
        }
    }
    assert!(old > 0 && new > 0, "{drop}: {old} rows before the cutoff, {new} after");
    let filter = |_: usize, t: &TableSet| {
        keep_unexpired(t, |attrs| {
            (attrs.attr("service.name").as_deref() == Some(drop.as_str())).then_some(cutoff)
        })
    };
    for level in [Level::Hot, Level::Cold] {
        check_filtered(&inputs, level, &flags, &filter)
            .expect("filtered merge")
            .expect("rows kept");
    }
}

#[test]
fn a_filter_that_keeps_nothing_writes_nothing() {
    let inputs = corpus_inputs::<SpansBuilder>(26, |c| c.traces(100));
    let rows_in: u64 = inputs.iter().map(|b| b.meta().rows).sum();
    let by_mask = |_: usize, t: &TableSet| Ok(vec![false; t.rows]);
    let by_cutoff = |_: usize, t: &TableSet| keep_unexpired(t, |_| Some(u64::MAX));
    for filter in [&by_mask as &RowFilter<'_>, &by_cutoff] {
        for level in [Level::Hot, Level::Cold] {
            let out = merge_blocks_filtered(&inputs, BlockId::new(), level, filter).expect("merge");
            assert!(out.bytes.is_none());
            assert_eq!((out.rows_in, out.rows_out, out.dropped_rows), (rows_in, 0, rows_in));
        }
    }
}

#[test]
fn a_filter_that_keeps_everything_writes_what_the_merge_writes() {
    let inputs = corpus_inputs::<PointsBuilder>(27, |c| c.metrics(200));
    let rows_in: u64 = inputs.iter().map(|b| b.meta().rows).sum();
    let by_mask = |_: usize, t: &TableSet| Ok(vec![true; t.rows]);
    let by_cutoff = |_: usize, t: &TableSet| keep_unexpired(t, |_| Some(0));
    for filter in [&by_mask as &RowFilter<'_>, &by_cutoff] {
        for level in [Level::Hot, Level::Cold] {
            let id = BlockId::new();
            let out = merge_blocks_filtered(&inputs, id, level, filter).expect("filtered merge");
            assert_eq!((out.rows_in, out.rows_out, out.dropped_rows), (rows_in, rows_in, 0));
            let plain = merge_blocks_at(&inputs, id, level).expect("merge");
            assert!(out.bytes == Some(plain), "{level:?}: not the plain merge's object");
        }
    }
}

#[test]
fn a_keep_mask_of_the_wrong_length_is_refused() {
    let inputs = corpus_inputs::<LogsBuilder>(28, |c| c.logs(20));
    let short = |_: usize, t: &TableSet| Ok(vec![true; t.rows - 1]);
    let e = merge_blocks_filtered(&inputs, BlockId::new(), Level::Hot, &short).expect_err("short mask");
    assert!(e.to_string().contains("flags"), "{e}");
}

// ---- Random blocks, random masks ----

/// Per input, a flag per row taken from `bits` in turn.
fn flags_from(inputs: &[Block], bits: &[bool]) -> Vec<Vec<bool>> {
    let mut next = bits.iter().copied().cycle();
    inputs
        .iter()
        .map(|b| (0..b.meta().rows).map(|_| next.next().unwrap_or(true)).collect())
        .collect()
}

/// The mask test for one signal: the output holds the flagged rows (see
/// [`check_filtered`]), and the filtered inputs are taken by the Arrow
/// merge, giving what the OTLP path gives.
fn check_mask(inputs: &[Block], bits: &[bool], cold: bool) -> Result<(), TestCaseError> {
    let flags = flags_from(inputs, bits);
    let level = if cold { Level::Cold } else { Level::Hot };
    check_filtered(inputs, level, &flags, &|i, _| Ok(flags[i].clone()))?;
    let filtered: Vec<TableSet> = inputs
        .iter()
        .zip(&flags)
        .map(|(b, f)| filter_tables(&read_tables(b, None).expect("read"), f).expect("filter"))
        .collect();
    check_same_as_otlp(inputs[0].meta().signal, &filtered)
}

/// `reqs` as blocks, the last two (when there are) also as one merged
/// input, so lineage runs of a merge are cut too.
fn mask_inputs<B: SignalBuilder>(reqs: &[B::Request]) -> Vec<Block> {
    let mut inputs = blocks::<B>(reqs);
    if reqs.len() >= 2 {
        let tail = blocks::<B>(&reqs[reqs.len() - 2..]);
        inputs.push(open(merge_blocks(&tail, BlockId::new()).expect("merge")));
    }
    inputs
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn filtered_logs_hold_exactly_the_flagged_rows(
        reqs in proptest::collection::vec(arb::logs_request(), 1..4),
        bits in proptest::collection::vec(any::<bool>(), 1..24),
        cold in any::<bool>(),
    ) {
        check_mask(&mask_inputs::<LogsBuilder>(&reqs), &bits, cold)?;
    }

    #[test]
    fn filtered_spans_hold_exactly_the_flagged_rows(
        reqs in proptest::collection::vec(arb::traces_request(), 1..4),
        bits in proptest::collection::vec(any::<bool>(), 1..24),
        cold in any::<bool>(),
    ) {
        check_mask(&mask_inputs::<SpansBuilder>(&reqs), &bits, cold)?;
    }

    #[test]
    fn filtered_points_hold_exactly_the_flagged_rows(
        reqs in proptest::collection::vec(arb::metrics_request(), 1..4),
        bits in proptest::collection::vec(any::<bool>(), 1..24),
        cold in any::<bool>(),
    ) {
        check_mask(&mask_inputs::<PointsBuilder>(&reqs), &bits, cold)?;
    }
}

/// A cold block (Parquet, typed attribute columns) gives the same
/// resources, the same row resources and the same keep mask as the hot
/// block of the same tables: retention decides alike on either tier.
#[test]
fn cold_blocks_read_resources_like_hot_ones() {
    let mut corpus = Corpus::new(21, Cardinality::Low);
    let mut b = LogsBuilder::default();
    for _ in 0..3 {
        b.append(&corpus.logs(200)).expect("append");
    }
    let tables = b.finish().expect("finish");
    let hot = open(write_hot(&tables, BlockId::new(), TenantId::default_tenant()).expect("hot"));
    let cold =
        open(mira_core::cold::write_cold(&tables, BlockId::new(), TenantId::default_tenant(), &[]).expect("cold"));
    let (h, c) = (
        read_tables(&hot, None).expect("hot"),
        read_tables(&cold, None).expect("cold"),
    );
    assert_eq!(
        resource_attributes(&h).expect("hot"),
        resource_attributes(&c).expect("cold")
    );
    assert_eq!(row_resources(&h).expect("hot"), row_resources(&c).expect("cold"));
    let drop_checkout = |attrs: &[(String, String)]| {
        attrs
            .iter()
            .any(|(k, v)| k == "service.name" && v == "checkout")
            .then_some(u64::MAX)
    };
    let (kh, kc) = (
        keep_unexpired(&h, drop_checkout).expect("hot"),
        keep_unexpired(&c, drop_checkout).expect("cold"),
    );
    assert_eq!(kh, kc);
    assert!(kh.iter().any(|k| !k) && kh.iter().any(|k| *k));
    // And the summaries agree with the rows.
    for block in [&hot, &cold] {
        let s = mira_core::compact::filter::resource_summaries(block).expect("summaries");
        assert_eq!(s.iter().map(|r| r.rows).sum::<u64>(), tables.rows as u64);
    }
}
