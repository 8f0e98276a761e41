//! Scans split into row ranges ("morsels"), below-block pruning by the
//! `row_ranges` sidecar, and clustering by resource: a scan of the ranges
//! left after pruning, merged, answers exactly as one scan of the block;
//! the sidecar round-trips and refuses hostile bytes; clustering keeps
//! every record and says where each came from.

use std::sync::Arc;

use mira_core::block::{Block, VerifyCache};
use mira_core::cluster::cluster_by_resource;
use mira_core::convert::{LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, TableSet, logs_to_otlp};
use mira_core::scan::{
    AttrMatcher, AttrScope, LineFilter, MatchOp, Order, Predicate, ScanInput, ScanOutput, ScanRequest, compile_regex,
    prune, record_times, scan,
};
use mira_core::sidecar::{RANGE_ROWS, RowRanges, Verdict, field};
use mira_core::tables::{read_sidecars, read_tables, write_hot};
use mira_core::{BlockId, Signal, TenantId};
use mira_testkit::corpus::{Cardinality, Corpus};
use mira_testkit::flatten;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use proptest::prelude::*;

/// The string form a matcher compares (what the scan reads).
fn text(v: &Option<AnyValue>) -> Option<String> {
    match v.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A small deterministic generator for picking parts of a predicate.
struct Pick(u64);

impl Pick {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// A block of `exports` corpus exports of `per` records each (so resources
/// interleave as they arrive), with the attributes seen, for predicates.
struct Sample {
    tables: TableSet,
    resource_attrs: Vec<KeyValue>,
    record_attrs: Vec<KeyValue>,
    names: Vec<String>,
}

fn sample(signal: Signal, seed: u64, exports: usize, per: usize) -> Sample {
    let card = if seed.is_multiple_of(2) {
        Cardinality::Low
    } else {
        Cardinality::High
    };
    let mut corpus = Corpus::new(seed, card);
    let resource_attrs: Vec<KeyValue> = corpus.resources().iter().flat_map(|r| r.attributes.clone()).collect();
    let mut record_attrs = Vec::new();
    let mut names = Vec::new();
    let tables = match signal {
        Signal::Logs => {
            let mut b = LogsBuilder::default();
            for _ in 0..exports {
                let req = corpus.logs(per);
                for rl in &req.resource_logs {
                    for sl in &rl.scope_logs {
                        for r in &sl.log_records {
                            record_attrs.extend(r.attributes.iter().cloned());
                            names.extend(text(&r.body));
                        }
                    }
                }
                b.append(&req).expect("append");
            }
            b.finish().expect("finish")
        }
        Signal::Traces => {
            let mut b = SpansBuilder::default();
            for _ in 0..exports {
                let req = corpus.traces(per);
                for rs in &req.resource_spans {
                    for ss in &rs.scope_spans {
                        for s in &ss.spans {
                            record_attrs.extend(s.attributes.iter().cloned());
                            names.push(s.name.clone());
                        }
                    }
                }
                b.append(&req).expect("append");
            }
            b.finish().expect("finish")
        }
        Signal::Metrics => {
            let mut b = PointsBuilder::default();
            for _ in 0..exports {
                let req = corpus.metrics(per);
                for rm in &req.resource_metrics {
                    for sm in &rm.scope_metrics {
                        for m in &sm.metrics {
                            names.push(m.name.clone());
                        }
                    }
                }
                b.append(&req).expect("append");
            }
            b.finish().expect("finish")
        }
    };
    Sample {
        tables,
        resource_attrs,
        record_attrs,
        names,
    }
}

fn op(pick: &mut Pick, v: &str) -> MatchOp {
    match pick.below(5) {
        0 => MatchOp::Ne(v.to_owned()),
        1 => MatchOp::Re(compile_regex(&regex_escape(v), true).expect("regex")),
        2 => MatchOp::NotRe(compile_regex(&regex_escape(v), true).expect("regex")),
        _ => MatchOp::Eq(v.to_owned()),
    }
}

fn regex_escape(v: &str) -> String {
    v.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$#&-~".contains(c);
            special.then_some('\\').into_iter().chain(std::iter::once(c))
        })
        .collect()
}

/// A random predicate over `s`, built from values in the data (and some
/// that are not).
fn predicate(s: &Sample, pick: &mut Pick) -> Predicate {
    let signal = s.tables.signal;
    let mut p = Predicate::default();
    let root = s.tables.get(mira_core::convert::root_table(signal)).expect("root");
    let times = record_times(signal, root).expect("times");
    if pick.chance() && !times.is_empty() {
        let (a, b) = (times[pick.below(times.len())], times[pick.below(times.len())]);
        p.time = Some((a.min(b), a.max(b) + pick.below(2) as u64));
    }
    if pick.chance() && !s.resource_attrs.is_empty() {
        let kv = &s.resource_attrs[pick.below(s.resource_attrs.len())];
        if let Some(v) = text(&kv.value) {
            p.attrs.push(AttrMatcher {
                scope: AttrScope::Resource,
                key: kv.key.clone(),
                op: op(pick, &v),
            });
        }
    }
    for _ in 0..pick.below(3) {
        if s.record_attrs.is_empty() {
            break;
        }
        let kv = &s.record_attrs[pick.below(s.record_attrs.len())];
        let v = if pick.below(4) == 0 {
            "no-such-value".to_owned()
        } else {
            text(&kv.value).unwrap_or_default()
        };
        p.attrs.push(AttrMatcher {
            scope: AttrScope::Record,
            key: kv.key.clone(),
            op: op(pick, &v),
        });
    }
    let name = (!s.names.is_empty()).then(|| s.names[pick.below(s.names.len())].clone());
    match signal {
        Signal::Logs => {
            if pick.chance() {
                p.min_severity = Some([1, 9, 17, 21][pick.below(4)]);
            }
            if let (true, Some(body)) = (pick.chance(), name) {
                let word = body.split_whitespace().next().unwrap_or("x").to_owned();
                p.lines.push(if pick.below(4) == 0 {
                    LineFilter::NotContains(word)
                } else {
                    LineFilter::Contains(word)
                });
            }
        }
        Signal::Traces => {
            if pick.chance() {
                p.min_duration = Some(pick.below(200_000_000) as u64);
            }
            if pick.chance() {
                p.max_duration = Some(pick.below(2_000_000_000) as u64);
            }
            if let (true, Some(n)) = (pick.chance(), name) {
                p.span_name = Some(op(pick, &n));
            }
        }
        Signal::Metrics => {
            if let (true, Some(n)) = (pick.chance(), name) {
                p.metric_name = Some(n.clone());
                if pick.chance() {
                    p.attrs.push(AttrMatcher {
                        scope: AttrScope::Field,
                        key: field::METRIC_NAME.to_owned(),
                        op: op(pick, &n),
                    });
                }
            }
        }
    }
    p
}

/// Scans `tables` range by range (pruned by `ranges` when given) and
/// merges; returns the merged output and how many ranges were scanned.
fn morsel_scan(tables: &TableSet, req: &ScanRequest, ranges: Option<&RowRanges>) -> (ScanOutput, usize) {
    let input = ScanInput::load(tables, &req.predicate).expect("load");
    let prepared = input.prepare(req).expect("prepare");
    let morsels = prepared.morsels(ranges);
    let parts = morsels
        .iter()
        .map(|r| prepared.scan_rows(r.clone()).expect("scan range"))
        .collect();
    (prepared.merge(parts).expect("merge"), morsels.len())
}

fn same(a: &ScanOutput, b: &ScanOutput) -> Result<(), TestCaseError> {
    prop_assert_eq!(&a.rows, &b.rows);
    prop_assert_eq!(&a.times, &b.times);
    prop_assert_eq!(&a.batch, &b.batch);
    Ok(())
}

/// Checks eight random scans; returns how many ranges pruning skipped.
fn check(
    signal: Signal,
    seed: u64,
    exports: usize,
    per: usize,
    range_rows: usize,
    pick: u64,
) -> Result<usize, TestCaseError> {
    let s = sample(signal, seed, exports, per);
    let ranges = RowRanges::build_with(&s.tables, range_rows).expect("build ranges");
    let back = RowRanges::from_bytes(&ranges.to_bytes()).expect("decode ranges");
    prop_assert_eq!(&back, &ranges);
    let mut pick = Pick(pick);
    let mut skipped = 0;
    for _ in 0..8 {
        let req = ScanRequest {
            predicate: predicate(&s, &mut pick),
            order: [Order::NewestFirst, Order::OldestFirst, Order::Stored][pick.below(3)],
            limit: pick.chance().then(|| 1 + pick.below(40)),
        };
        let full = scan(&s.tables, &req).expect("scan");
        let (unpruned, all) = morsel_scan(&s.tables, &req, None);
        same(&unpruned, &full)?;
        prop_assert_eq!(unpruned.rows_scanned, full.rows_scanned);
        let (pruned, kept) = morsel_scan(&s.tables, &req, Some(&back));
        same(&pruned, &full)?;
        // In waves, newest (or oldest) ranges first, stopping early.
        let input = ScanInput::load(&s.tables, &req.predicate).expect("load");
        let prepared = input.prepare(&req).expect("prepare");
        let wave = 1 + pick.below(3);
        let waved = prepared
            .scan_in_waves(Some(&back), wave, |batch| {
                batch.iter().map(|r| prepared.scan_rows(r.clone())).collect()
            })
            .expect("scan in waves");
        same(&waved, &full)?;
        skipped += all.saturating_sub(kept);
    }
    Ok(skipped)
}

/// Line filters run last, and on few survivors row by row: a scan with
/// line filters and other parts equals the rows both a lines-only scan and
/// a scan without the lines select (each evaluated on its own, so the
/// lines-only one takes the whole-column kernel).
fn check_lines_last(seed: u64, exports: usize, per: usize, pick: u64) -> Result<usize, TestCaseError> {
    let s = sample(Signal::Logs, seed, exports, per);
    let mut pick = Pick(pick);
    let mut both = 0;
    for _ in 0..16 {
        let mut predicate = predicate(&s, &mut pick);
        if predicate.lines.is_empty() {
            let body = s
                .names
                .get(pick.below(s.names.len().max(1)))
                .cloned()
                .unwrap_or_default();
            let word = body.split_whitespace().next().unwrap_or("x").to_owned();
            predicate.lines.push(if pick.chance() {
                LineFilter::Contains(word)
            } else {
                LineFilter::NotContains(word)
            });
        }
        let request = |predicate: Predicate| ScanRequest {
            predicate,
            order: Order::Stored,
            limit: None,
        };
        let lines_only = Predicate {
            lines: predicate.lines.clone(),
            ..Predicate::default()
        };
        let rest = Predicate {
            lines: Vec::new(),
            ..predicate.clone()
        };
        let with = scan(&s.tables, &request(predicate)).expect("scan");
        let by_lines = scan(&s.tables, &request(lines_only)).expect("scan lines");
        let by_rest = scan(&s.tables, &request(rest)).expect("scan rest");
        let lines: std::collections::HashSet<u32> = by_lines.rows.iter().copied().collect();
        let expected: Vec<u32> = by_rest.rows.iter().copied().filter(|r| lines.contains(r)).collect();
        prop_assert_eq!(&with.rows, &expected);
        if by_rest.rows.len() * 4 < by_rest.rows_scanned.max(1) && !expected.is_empty() {
            both += 1;
        }
    }
    Ok(both)
}

/// The sparse line test is reached (few survivors, some of them matching)
/// by the random predicates, so the property above covers it.
#[test]
fn line_filters_on_few_survivors_are_exercised() {
    let sparse: usize = (0..8)
        .map(|seed| check_lines_last(seed, 4, 120, seed * 31 + 5).expect("check"))
        .sum();
    assert!(sparse > 0, "no scan took the sparse line test with a match");
}

/// The property tests above would pass if nothing were ever pruned: the
/// same random predicates do skip ranges.
#[test]
fn random_predicates_skip_ranges() {
    for signal in [Signal::Logs, Signal::Traces, Signal::Metrics] {
        let skipped: usize = (0..6)
            .map(|seed| check(signal, seed, 4, 120, 16, seed * 77).expect("check"))
            .sum();
        assert!(skipped > 0, "{signal}: no range was ever skipped");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn pruned_range_scans_equal_one_scan_logs(seed in any::<u64>(), exports in 1..5usize, per in 1..150usize,
                                              range_rows in 1..80usize, pick in any::<u64>()) {
        check(Signal::Logs, seed, exports, per, range_rows, pick)?;
    }

    #[test]
    fn pruned_range_scans_equal_one_scan_traces(seed in any::<u64>(), exports in 1..5usize, per in 1..150usize,
                                                range_rows in 1..80usize, pick in any::<u64>()) {
        check(Signal::Traces, seed, exports, per, range_rows, pick)?;
    }

    #[test]
    fn pruned_range_scans_equal_one_scan_metrics(seed in any::<u64>(), exports in 1..5usize, per in 1..150usize,
                                                 range_rows in 1..80usize, pick in any::<u64>()) {
        check(Signal::Metrics, seed, exports, per, range_rows, pick)?;
    }

    #[test]
    fn clustered_blocks_scan_like_their_source(seed in any::<u64>(), exports in 1..5usize, per in 1..150usize,
                                                range_rows in 1..80usize, pick in any::<u64>()) {
        let s = sample(Signal::Logs, seed, exports, per);
        let (clustered, perm) = cluster_by_resource(&s.tables).expect("cluster");
        let c = Sample { tables: clustered, ..s };
        check_clustered(&c, &perm)?;
        let ranges = RowRanges::build_with(&c.tables, range_rows).expect("build ranges");
        let mut pick = Pick(pick);
        for _ in 0..4 {
            let req = ScanRequest { predicate: predicate(&c, &mut pick), ..Default::default() };
            same(&morsel_scan(&c.tables, &req, Some(&ranges)).0, &scan(&c.tables, &req).expect("scan"))?;
        }
    }

    #[test]
    fn line_filters_last_equal_both_scans_intersected(seed in any::<u64>(), exports in 1..5usize, per in 1..150usize,
                                                      pick in any::<u64>()) {
        check_lines_last(seed, exports, per, pick)?;
    }

    #[test]
    fn hostile_row_ranges_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400), cut in any::<usize>()) {
        let _ = RowRanges::from_bytes(&bytes);
        let s = sample(Signal::Logs, 3, 2, 50);
        let good = RowRanges::build_with(&s.tables, 16).expect("build").to_bytes();
        let cut = cut % good.len();
        prop_assert!(RowRanges::from_bytes(&good[..cut]).is_err());
        let mut flipped = good.clone();
        flipped[cut] ^= 0x5a;
        let _ = RowRanges::from_bytes(&flipped);
    }
}

/// Row `i` of the clustered table is row `perm[i]` of the source, rows of
/// one resource are contiguous, and the records are the same.
fn check_clustered(c: &Sample, perm: &[u32]) -> Result<(), TestCaseError> {
    let n = perm.len();
    let mut sorted = perm.to_vec();
    sorted.sort_unstable();
    prop_assert_eq!(sorted, (0..n as u32).collect::<Vec<_>>());
    let root = c.tables.get(mira_core::schema::LOGS).expect("logs");
    let rid = root
        .column_by_name("resource_id")
        .and_then(|a| a.as_any().downcast_ref::<arrow::array::UInt32Array>().cloned())
        .expect("resource_id");
    let mut seen = std::collections::HashSet::new();
    for i in 0..n {
        if i == 0 || rid.value(i) != rid.value(i - 1) {
            prop_assert!(seen.insert(rid.value(i)), "resource {} in two runs", rid.value(i));
        }
    }
    Ok(())
}

#[test]
fn clustering_says_where_each_row_came_from() {
    let s = sample(Signal::Logs, 8, 6, 300);
    let (clustered, perm) = cluster_by_resource(&s.tables).expect("cluster");
    let before = logs_to_otlp(&s.tables).expect("otlp");
    let after = logs_to_otlp(&clustered).expect("otlp");
    let (mut a, mut b) = (flatten::logs(&before), flatten::logs(&after));
    a.sort();
    b.sort();
    assert_eq!(a, b, "clustering changed the records");
    let old = mira_core::convert::log_rows(&s.tables, &perm).expect("rows");
    let all: Vec<u32> = (0..perm.len() as u32).collect();
    let new = mira_core::convert::log_rows(&clustered, &all).expect("rows");
    assert_eq!(
        old, new,
        "row i of the clustered block is not row perm[i] of the source"
    );
}

fn open(tables: &TableSet) -> Block {
    let bytes = write_hot(tables, BlockId::new(), TenantId::default_tenant()).expect("write");
    Block::from_bytes(bytes, Arc::new(VerifyCache::new(64))).expect("open")
}

/// A block of more than one range carries the section; a rare attribute
/// value and one resource then skip ranges (and, absent from every range,
/// the block), never a range holding a match. A small block has no
/// section and scans as before.
#[test]
fn large_blocks_prune_ranges_and_small_blocks_have_none() {
    let rows = RANGE_ROWS * 2 + 1000;
    let mut corpus = Corpus::new(5, Cardinality::Low);
    let mut b = LogsBuilder::default();
    let mut n = 0;
    while n < rows {
        let mut req = corpus.logs(1000);
        if n == 70_000 {
            let r = &mut req.resource_logs[0].scope_logs[0].log_records[0];
            r.attributes.push(KeyValue {
                key: "rare".into(),
                value: Some(AnyValue {
                    value: Some(Value::StringValue("needle".into())),
                }),
                ..Default::default()
            });
        }
        b.append(&req).expect("append");
        n += 1000;
    }
    let (tables, _) = cluster_by_resource(&b.finish().expect("finish")).expect("cluster");
    let block = open(&tables);
    let sidecars = read_sidecars(&block).expect("sidecars");
    let ranges = sidecars.ranges.as_ref().expect("a large block has row ranges");
    assert_eq!(ranges.ranges.len(), 3);
    let tables = read_tables(&block, None).expect("read");

    let eq = |scope, key: &str, v: &str| AttrMatcher {
        scope,
        key: key.into(),
        op: MatchOp::Eq(v.into()),
    };
    let rare = Predicate {
        attrs: vec![eq(AttrScope::Record, "rare", "needle")],
        ..Default::default()
    };
    let req = ScanRequest {
        predicate: rare.clone(),
        ..Default::default()
    };
    let (out, scanned) = morsel_scan(&tables, &req, Some(ranges));
    assert_eq!(out.rows.len(), 1);
    assert!(scanned < 3, "the rare value scanned every range");
    let missing = Predicate {
        attrs: vec![eq(AttrScope::Record, "rare", "hay")],
        ..Default::default()
    };
    assert!(prune(&block, &missing).expect("prune").is_pruned());
    assert_eq!(prune(&block, &rare).expect("prune"), Verdict::MayMatch);

    let service = corpus.resources()[0].attributes[0].clone();
    let one = Predicate {
        attrs: vec![eq(
            AttrScope::Resource,
            &service.key,
            &text(&service.value).expect("service"),
        )],
        ..Default::default()
    };
    let req = ScanRequest {
        predicate: one,
        ..Default::default()
    };
    let (out, scanned) = morsel_scan(&tables, &req, Some(ranges));
    let full = scan(&tables, &req).expect("scan");
    assert!(!full.rows.is_empty());
    assert_eq!(out.rows, full.rows);
    assert!(scanned < 3, "one service scanned every range of a clustered block");

    let small = open(&sample(Signal::Logs, 1, 2, 100).tables);
    assert!(small.manifest().section("row_ranges").is_none());
    assert!(read_sidecars(&small).expect("sidecars").ranges.is_none());
}

/// A limited newest-first (or oldest-first) scan of a large block in time
/// order reads only the ranges at that end, and answers as a full scan.
#[test]
fn a_limited_scan_in_time_order_stops_after_the_ranges_that_make_the_cut() {
    let rows = RANGE_ROWS * 3 + 500;
    let mut corpus = Corpus::new(9, Cardinality::Low);
    let mut b = LogsBuilder::default();
    let mut n = 0;
    while n < rows {
        b.append(&corpus.logs(500)).expect("append");
        n += 500;
    }
    let block = open(&b.finish().expect("finish"));
    let sidecars = read_sidecars(&block).expect("sidecars");
    let ranges = sidecars.ranges.as_ref().expect("row ranges");
    assert_eq!(ranges.ranges.len(), 4);
    let tables = read_tables(&block, None).expect("read");
    for order in [Order::NewestFirst, Order::OldestFirst] {
        let req = ScanRequest {
            predicate: Predicate::default(),
            order,
            limit: Some(100),
        };
        let full = scan(&tables, &req).expect("scan");
        let input = ScanInput::load(&tables, &req.predicate).expect("load");
        let prepared = input.prepare(&req).expect("prepare");
        let waved = prepared
            .scan_in_waves(Some(ranges), 1, |batch| {
                batch.iter().map(|r| prepared.scan_rows(r.clone())).collect()
            })
            .expect("waves");
        same(&waved, &full).expect("same answer");
        assert!(
            waved.rows_scanned <= RANGE_ROWS,
            "{order:?}: scanned {} rows for 100",
            waved.rows_scanned
        );
        assert_eq!(full.rows_scanned as u64, block.meta().rows);
    }
}
