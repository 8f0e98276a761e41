//! The result cache: what one published block gave a query, kept in
//! memory so a repeated query (a dashboard refresh, the same query over a
//! sliding range) skips the block's predicate evaluation.
//!
//! Three kinds of result are kept:
//! - **scans** ([`Querier::scan_candidate`](crate::Querier)): the rows of
//!   a block a predicate matched, with their times and root columns, in
//!   the scan's order. Logs, LogQL and trace searches read blocks here.
//! - **series** (PromQL's per-block load): the samples of the series the
//!   query's selectors match, of the whole block (so a sliding range finds
//!   the blocks it cuts as well as the ones it covers). The PromQL
//!   evaluation itself (functions, aggregations, steps) runs on every
//!   query over these samples: per-step partial aggregates are not kept,
//!   since few of them compose exactly (`rate` extrapolates over a window
//!   that spans blocks; `quantile`, `topk` and `histogram_quantile` do not
//!   split), and the selected samples are exact for every operation.
//! - **pages** ([`Querier::logs_in`](crate::Querier)): a page of log lines
//!   whose blocks are all published, keyed by the whole query and a
//!   SHA-256 digest of the blocks it reads (ids and object keys, in
//!   reading order). The same blocks give the same page, so a repeated
//!   query over published data skips the per-block work too (a lookup per
//!   block costs microseconds, over a thousand blocks milliseconds); a
//!   page that reads any recent block is never kept. PromQL answers are
//!   kept the same way (the query, its range and step, and its blocks).
//!
//! Keys are (tenant, block id, normalised request). Blocks are immutable
//! and ids are never reused: a compaction, a retention rewrite or a
//! deletion publishes new ids and tombstones the old ones, which no later
//! plan lists, so an entry can never answer for rows that changed.
//! Recent (unpublished) blocks are never cached. The normalised request
//! is a canonical serialisation of the parsed predicate (matchers and
//! line filters sorted and deduplicated: they are ANDed, so order does
//! not change the rows), the scan order, and the part of the time range
//! that cuts the block: a range covering the whole block keys as `whole`,
//! so every covering range shares the entry; a range that cuts the block
//! keys on the cut, clamped to the block's own time span.
//!
//! A scan's `limit` is not in the key. An entry remembers whether it
//! holds every matching row (an unlimited scan, or a limited one that
//! found fewer than its limit) or only the first `n` in the key's order;
//! a later scan with limit `m` is served only when the entry is complete
//! or `m <= n`, and then gets the first `m` rows, which is exactly what
//! a scan with limit `m` returns (scans order by (time, row), a total
//! order). Otherwise it is a miss, and the new, larger result replaces
//! the entry.
//!
//! Bounded by bytes (`--result-cache-size`; 0 disables it), least
//! recently used evicted first. Counted per query in `stats`
//! (`result_cache_hits`, `_misses`, `_bytes`) and in `/metrics`
//! (`mira_querier_result_cache_{hits,misses,evictions}_total`,
//! `mira_querier_result_cache_bytes`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::record_batch::RecordBatch;
use mira_core::scan::{AttrMatcher, LineFilter, MatchOp, Order, ScanOutput, ScanRequest};
use mira_core::{BlockId, Signal};
use promql_parser::parser::VectorSelector;

use crate::logs::LogLines;
use crate::plan::{Candidate, Src};
use crate::promql::PromData;
use crate::promql::load::BlockSeries;
use crate::stats::Stats;

/// What a per-block result is for; see the module doc.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResultKey {
    tenant: String,
    block: BlockId,
    /// The canonical request.
    what: String,
}

impl ResultKey {
    fn weight(&self) -> u64 {
        (self.tenant.len() + self.what.len() + 64) as u64
    }
}

/// The part of `[start, end)` (ns) that falls in a block spanning
/// `[min, max]` (ns, inclusive): `None` when the range covers the block.
fn cut(start: u64, end: u64, min: u64, max: u64) -> Option<(u64, u64)> {
    let (s, e) = (start.max(min), end.min(max.saturating_add(1)));
    if s == min && e == max.saturating_add(1) {
        None
    } else if s >= e {
        // Nothing of the block: every such range selects no rows.
        Some((0, 0))
    } else {
        Some((s, e))
    }
}

fn op_text(op: &MatchOp) -> (&'static str, String) {
    match op {
        MatchOp::Eq(v) => ("=", v.clone()),
        MatchOp::Ne(v) => ("!=", v.clone()),
        MatchOp::Re(re) => ("=~", re.as_str().to_owned()),
        MatchOp::NotRe(re) => ("!~", re.as_str().to_owned()),
    }
}

fn attr_text(m: &AttrMatcher) -> (String, String, &'static str, String) {
    let (op, v) = op_text(&m.op);
    (format!("{:?}", m.scope), m.key.clone(), op, v)
}

fn line_text(f: &LineFilter) -> (&'static str, String) {
    match f {
        LineFilter::Contains(s) => ("|=", s.clone()),
        LineFilter::NotContains(s) => ("!=", s.clone()),
        LineFilter::Regex(re) => ("|~", re.as_str().to_owned()),
        LineFilter::NotRegex(re) => ("!~", re.as_str().to_owned()),
    }
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v.dedup();
    v
}

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of a scan of a published block of `tenant` spanning
/// `[min, max]` ns (see the module doc: no limit in it).
pub fn scan_key(tenant: &str, block: BlockId, signal: Signal, req: &ScanRequest, min: u64, max: u64) -> ResultKey {
    let p = &req.predicate;
    let time = p.time.map(|(s, e)| cut(s, e, min, max));
    let order = match req.order {
        Order::NewestFirst => "newest",
        Order::OldestFirst => "oldest",
        Order::Stored => "stored",
    };
    // Debug forms: strings quoted and escaped, so fields cannot run into
    // each other (and cheaper than building a JSON tree per block).
    let what = format!(
        "scan {} {order} {time:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        signal.as_str(),
        sorted(p.attrs.iter().map(attr_text).collect()),
        sorted(p.lines.iter().map(line_text).collect()),
        p.min_severity,
        p.trace_id.map(|t| hex(&t)),
        p.span_name.as_ref().map(op_text),
        p.min_duration,
        p.max_duration,
        p.metric_name,
    );
    ResultKey {
        tenant: tenant.to_owned(),
        block,
        what,
    }
}

/// The key of a whole answer of `tenant` (a page of log lines, a PromQL
/// answer) read from `blocks`: `query` (every field that selects, orders
/// or cuts what it answers) and the blocks, as (id, object key) in reading
/// order. `None` when one of them is recent (not published), or without
/// blocks.
pub(crate) fn answer_key<'a>(
    tenant: &str,
    query: &str,
    blocks: impl IntoIterator<Item = &'a Candidate>,
) -> Option<ResultKey> {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    let (mut first, mut n) = (None, 0);
    for c in blocks {
        let Src::Published { key } = &c.src else {
            return None;
        };
        first.get_or_insert(c.id);
        h.update(c.id.0.to_bytes());
        h.update((key.len() as u64).to_le_bytes());
        h.update(key.as_bytes());
        n += 1;
    }
    let digest: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Some(ResultKey {
        tenant: tenant.to_owned(),
        block: first?,
        what: format!("answer {n} {digest} {query}"),
    })
}

/// A matcher as (label, op, value).
type MatcherText = (String, String, String);

/// A selector's matchers (its name as `__name__=`) and its `or` groups,
/// each sorted.
fn selector_text(s: &VectorSelector) -> (Vec<MatcherText>, Vec<Vec<MatcherText>>) {
    let text = |m: &promql_parser::label::Matcher| (m.name.clone(), m.op.to_string(), m.value.clone());
    // `foo` and `{__name__="foo"}` select the same series.
    let name = s
        .name
        .iter()
        .map(|n| (crate::promql::eval::NAME.to_owned(), "=".to_owned(), n.clone()));
    let all = sorted(name.chain(s.matchers.matchers.iter().map(text)).collect());
    let or = sorted(
        s.matchers
            .or_matchers
            .iter()
            .map(|g| sorted(g.iter().map(text).collect()))
            .collect(),
    );
    (all, or)
}

/// The key of a PromQL load of a published metrics block of `tenant`
/// spanning `[min, max]` ns: the series any of `selectors` matches (their
/// order does not matter), samples in `[from_ms, to_ms]`.
pub fn series_key(
    tenant: &str,
    block: BlockId,
    selectors: &[VectorSelector],
    from_ms: i64,
    to_ms: i64,
    min: u64,
    max: u64,
) -> ResultKey {
    // Samples are selected by their time in whole milliseconds.
    let (bmin, bmax) = ((min / 1_000_000) as i64, (max / 1_000_000) as i64);
    let (f, t) = (from_ms.max(bmin), to_ms.min(bmax));
    let time = if f == bmin && t == bmax {
        None
    } else if f > t {
        Some((0, -1))
    } else {
        Some((f, t))
    };
    let what = serde_json::json!(["series", time, sorted(selectors.iter().map(selector_text).collect())]);
    ResultKey {
        tenant: tenant.to_owned(),
        block,
        what: what.to_string(),
    }
}

/// A scan's result as kept.
#[derive(Debug)]
struct Scanned {
    rows: Vec<u32>,
    times: Vec<u64>,
    batch: RecordBatch,
    /// Every matching row (else only the first `rows.len()`).
    complete: bool,
}

#[derive(Debug)]
enum Cached {
    Scan(Scanned),
    Series(Arc<BlockSeries>),
    Page(Arc<LogLines>),
    Prom(Arc<PromData>),
}

#[derive(Debug)]
struct Slot {
    value: Arc<Cached>,
    weight: u64,
    tick: u64,
}

/// Entries by key and keys by last use (keys shared, not copied, on a
/// hit).
#[derive(Debug, Default)]
struct Lru {
    entries: HashMap<Arc<ResultKey>, Slot>,
    by_tick: BTreeMap<u64, Arc<ResultKey>>,
    total: u64,
    tick: u64,
}

impl Lru {
    fn get(&mut self, key: &ResultKey) -> Option<(Arc<Cached>, u64)> {
        self.tick += 1;
        let tick = self.tick;
        let (shared, old) = self.entries.get_key_value(key).map(|(k, s)| (k.clone(), s.tick))?;
        self.by_tick.remove(&old);
        self.by_tick.insert(tick, shared);
        let slot = self.entries.get_mut(key)?;
        slot.tick = tick;
        Some((slot.value.clone(), slot.weight))
    }

    /// Inserts (replacing), then evicts down to `capacity`; returns how
    /// many entries were evicted.
    fn insert(&mut self, key: ResultKey, value: Arc<Cached>, weight: u64, capacity: u64) -> u64 {
        if let Some(old) = self.entries.remove(&key) {
            self.by_tick.remove(&old.tick);
            self.total -= old.weight;
        }
        let key = Arc::new(key);
        self.tick += 1;
        self.by_tick.insert(self.tick, key.clone());
        self.entries.insert(
            key,
            Slot {
                value,
                weight,
                tick: self.tick,
            },
        );
        self.total += weight;
        let mut evicted = 0;
        while self.total > capacity {
            let Some((_, k)) = self.by_tick.pop_first() else { break };
            if let Some(s) = self.entries.remove(&*k) {
                self.total -= s.weight;
                evicted += 1;
            }
        }
        evicted
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ResultCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
}

/// See the module doc.
#[derive(Debug)]
pub struct ResultCache {
    capacity: u64,
    lru: Mutex<Lru>,
    pub counters: ResultCounters,
}

fn scanned_weight(s: &Scanned) -> u64 {
    (s.rows.len() * 4 + s.times.len() * 8) as u64 + mira_core::decoded::batch_weight(&s.batch)
}

fn series_weight(m: &BlockSeries) -> u64 {
    m.iter()
        .map(|s| {
            let l: usize = s.labels.iter().map(|(k, v)| k.len() + v.len() + 48).sum();
            (l + s.samples.len() * 16 + 64) as u64
        })
        .sum()
}

impl ResultCache {
    /// A cache of at most `capacity` bytes (0: nothing kept).
    pub fn new(capacity: u64) -> ResultCache {
        ResultCache {
            capacity,
            lru: Mutex::new(Lru::default()),
            counters: ResultCounters::default(),
        }
    }

    /// Whether anything is kept (lookups are skipped otherwise).
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.lru.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, key: &ResultKey) -> Option<(Arc<Cached>, u64)> {
        self.lock().get(key)
    }

    fn counted(&self, hit: Option<u64>, stats: &Stats) {
        match hit {
            Some(bytes) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                stats.add_result_hit(bytes);
            }
            None => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                stats.add_result_miss();
            }
        }
    }

    fn insert(&self, key: ResultKey, value: Cached, weight: u64) {
        let weight = weight + key.weight();
        if weight > self.capacity {
            return;
        }
        let evicted = self.lock().insert(key, Arc::new(value), weight, self.capacity);
        self.counters.evictions.fetch_add(evicted, Ordering::Relaxed);
    }

    /// What a scan with `limit` returns, when an entry holds it (counted
    /// as a hit or a miss).
    pub fn scan(&self, key: &ResultKey, limit: Option<usize>, stats: &Stats) -> Option<ScanOutput> {
        self.lookup(key, stats, |v| {
            let Cached::Scan(s) = v else { return None };
            let n = match limit {
                None if s.complete => s.rows.len(),
                Some(m) if s.complete || m <= s.rows.len() => m.min(s.rows.len()),
                _ => return None,
            };
            Some(ScanOutput {
                rows: s.rows[..n].to_vec(),
                times: s.times[..n].to_vec(),
                batch: s.batch.slice(0, n),
                rows_scanned: 0,
            })
        })
    }

    /// What `pick` takes from the entry under `key` (counted as a hit, or
    /// a miss when there is none or `pick` takes nothing).
    fn lookup<T>(&self, key: &ResultKey, stats: &Stats, pick: impl FnOnce(&Cached) -> Option<T>) -> Option<T> {
        let found = self.get(key).and_then(|(v, weight)| pick(&v).map(|t| (t, weight)));
        self.counted(found.as_ref().map(|(_, w)| *w), stats);
        found.map(|(t, _)| t)
    }

    /// Keeps what a scan with `limit` returned.
    pub fn insert_scan(&self, key: ResultKey, out: &ScanOutput, limit: Option<usize>) {
        let s = Scanned {
            rows: out.rows.clone(),
            times: out.times.clone(),
            batch: out.batch.clone(),
            complete: limit.is_none_or(|l| out.rows.len() < l),
        };
        let w = scanned_weight(&s);
        self.insert(key, Cached::Scan(s), w);
    }

    /// The series a load found, when an entry holds them (counted).
    pub fn series(&self, key: &ResultKey, stats: &Stats) -> Option<Arc<BlockSeries>> {
        self.lookup(key, stats, |v| match v {
            Cached::Series(m) => Some(m.clone()),
            _ => None,
        })
    }

    /// Keeps what a load found.
    pub fn insert_series(&self, key: ResultKey, map: Arc<BlockSeries>) {
        let w = series_weight(&map);
        self.insert(key, Cached::Series(map), w);
    }

    /// The page of log lines an entry holds (counted).
    pub fn page(&self, key: &ResultKey, stats: &Stats) -> Option<Arc<LogLines>> {
        self.lookup(key, stats, |v| match v {
            Cached::Page(p) => Some(p.clone()),
            _ => None,
        })
    }

    /// The PromQL answer an entry holds (counted).
    pub fn prom_answer(&self, key: &ResultKey, stats: &Stats) -> Option<Arc<PromData>> {
        self.lookup(key, stats, |v| match v {
            Cached::Prom(p) => Some(p.clone()),
            _ => None,
        })
    }

    /// Keeps a PromQL answer (weighed by its JSON form).
    pub fn insert_prom_answer(&self, key: ResultKey, data: Arc<PromData>) {
        let w = serde_json::to_vec(&*data).map_or(0, |j| j.len() as u64) + 64;
        self.insert(key, Cached::Prom(data), w);
    }

    /// Keeps a page of log lines (weighed by its records' protobuf sizes).
    pub fn insert_page(&self, key: ResultKey, page: Arc<LogLines>) {
        use prost::Message as _;
        let w: usize = page
            .lines
            .iter()
            .map(|l| {
                l.record.encoded_len()
                    + l.resource.as_ref().map_or(0, |r| r.encoded_len())
                    + l.scope.as_ref().map_or(0, |s| s.encoded_len())
                    + 64
            })
            .sum();
        self.insert(key, Cached::Page(page), w as u64 + 64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mira_core::scan::{AttrScope, Predicate, compile_regex};

    fn attr(key: &str, op: MatchOp) -> AttrMatcher {
        AttrMatcher {
            scope: AttrScope::Resource,
            key: key.into(),
            op,
        }
    }

    fn req(attrs: Vec<AttrMatcher>, lines: Vec<LineFilter>, time: (u64, u64), limit: Option<usize>) -> ScanRequest {
        ScanRequest {
            predicate: Predicate {
                time: Some(time),
                attrs,
                lines,
                ..Default::default()
            },
            order: Order::NewestFirst,
            limit,
        }
    }

    fn re(p: &str) -> regex::Regex {
        compile_regex(p, true).expect("regex")
    }

    #[test]
    fn equal_predicates_written_differently_share_a_key_and_different_ones_do_not() {
        let b = BlockId::new();
        let (min, max) = (1_000, 2_000);
        let key = |r: &ScanRequest| scan_key("acme", b, Signal::Logs, r, min, max);
        let a = req(
            vec![
                attr("service.name", MatchOp::Eq("api".into())),
                attr("env", MatchOp::Re(re("p.*"))),
            ],
            vec![
                LineFilter::Contains("error".into()),
                LineFilter::NotContains("debug".into()),
            ],
            (0, 10_000),
            Some(100),
        );
        // Matchers and filters in another order, repeated, another limit,
        // another range that also covers the whole block.
        let b2 = req(
            vec![
                attr("env", MatchOp::Re(re("p.*"))),
                attr("service.name", MatchOp::Eq("api".into())),
                attr("env", MatchOp::Re(re("p.*"))),
            ],
            vec![
                LineFilter::NotContains("debug".into()),
                LineFilter::Contains("error".into()),
            ],
            (500, 2_001),
            Some(5),
        );
        assert_eq!(key(&a), key(&b2));
        // A range cutting the block keys on the cut, clamped to the block.
        let cut1 = req(
            a.predicate.attrs.clone(),
            a.predicate.lines.clone(),
            (1_500, 10_000),
            None,
        );
        let cut2 = req(
            a.predicate.attrs.clone(),
            a.predicate.lines.clone(),
            (1_500, 99_999),
            None,
        );
        assert_eq!(key(&cut1), key(&cut2));
        assert_ne!(key(&a), key(&cut1));
        // Different predicates do not share a key.
        let other_value = req(
            vec![
                attr("service.name", MatchOp::Eq("web".into())),
                attr("env", MatchOp::Re(re("p.*"))),
            ],
            a.predicate.lines.clone(),
            (0, 10_000),
            None,
        );
        let other_op = req(
            vec![
                attr("service.name", MatchOp::Ne("api".into())),
                attr("env", MatchOp::Re(re("p.*"))),
            ],
            a.predicate.lines.clone(),
            (0, 10_000),
            None,
        );
        let other_line = req(
            a.predicate.attrs.clone(),
            vec![LineFilter::Contains("error".into())],
            (0, 10_000),
            None,
        );
        let mut oldest = a.clone();
        oldest.order = Order::OldestFirst;
        for k in [&other_value, &other_op, &other_line, &oldest] {
            assert_ne!(key(&a), key(k));
        }
        // The tenant and the block are in the key.
        assert_ne!(key(&a), scan_key("beta", b, Signal::Logs, &a, min, max));
        assert_ne!(key(&a), scan_key("acme", BlockId::new(), Signal::Logs, &a, min, max));
    }

    #[test]
    fn selectors_normalise_by_meaning() {
        let sel = |q: &str| match crate::promql::parse(q) {
            Ok(promql_parser::parser::Expr::VectorSelector(s)) => s,
            other => panic!("{q}: {other:?}"),
        };
        let b = BlockId::new();
        let (min, max) = (60_000_000_000, 120_000_000_000);
        let key = |s: &[VectorSelector], from: i64, to: i64| series_key("acme", b, s, from, to, min, max);
        let a = sel(r#"up{job="api",env=~"p.*"}"#);
        let a2 = sel(r#"{env=~"p.*",__name__="up",job="api"}"#);
        let other = sel(r#"up{job="web",env=~"p.*"}"#);
        assert_eq!(
            key(std::slice::from_ref(&a), 0, 1_000_000),
            key(std::slice::from_ref(&a2), 50_000, 200_000)
        );
        assert_eq!(
            key(&[a.clone(), other.clone()], 0, 1_000_000),
            key(&[other.clone(), a.clone()], 0, 1_000_000)
        );
        assert_ne!(
            key(std::slice::from_ref(&a), 0, 1_000_000),
            key(std::slice::from_ref(&other), 0, 1_000_000)
        );
        assert_ne!(
            key(std::slice::from_ref(&a), 0, 1_000_000),
            key(std::slice::from_ref(&a), 90_000, 1_000_000)
        );
        assert_eq!(
            key(std::slice::from_ref(&a), 90_000, 1_000_000),
            key(std::slice::from_ref(&a), 90_000, 2_000_000)
        );
        assert_ne!(
            key(std::slice::from_ref(&a), 0, 1_000_000),
            series_key("beta", b, &[a], 0, 1_000_000, min, max)
        );
    }

    fn scanned(rows: &[u32]) -> ScanOutput {
        let times: Vec<u64> = rows.iter().map(|&r| 1_000 - r as u64).collect();
        let batch = RecordBatch::try_new(
            Arc::new(arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
                "row",
                arrow::datatypes::DataType::UInt32,
                false,
            )])),
            vec![Arc::new(arrow::array::UInt32Array::from(rows.to_vec()))],
        )
        .expect("batch");
        ScanOutput {
            rows: rows.to_vec(),
            times,
            batch,
            rows_scanned: 100,
        }
    }

    #[test]
    fn a_limited_entry_serves_only_limits_it_holds_and_tenant_b_never_hits_as_entry() {
        let cache = ResultCache::new(1 << 20);
        let stats = Stats::default();
        let b = BlockId::new();
        let r = req(Vec::new(), Vec::new(), (0, 10_000), Some(3));
        let ka = scan_key("a", b, Signal::Logs, &r, 0, 5_000);
        let kb = scan_key("b", b, Signal::Logs, &r, 0, 5_000);
        // Three of more rows: a prefix.
        cache.insert_scan(ka.clone(), &scanned(&[9, 8, 7]), Some(3));
        assert_eq!(cache.scan(&ka, Some(2), &stats).map(|o| o.rows), Some(vec![9, 8]));
        assert_eq!(cache.scan(&ka, Some(3), &stats).map(|o| o.batch.num_rows()), Some(3));
        assert!(cache.scan(&ka, Some(4), &stats).is_none(), "more than it holds");
        assert!(cache.scan(&ka, None, &stats).is_none(), "every row");
        assert!(cache.scan(&kb, Some(1), &stats).is_none(), "another tenant");
        // Fewer rows than the limit: every matching row.
        cache.insert_scan(ka.clone(), &scanned(&[9, 8]), Some(3));
        assert_eq!(cache.scan(&ka, None, &stats).map(|o| o.rows), Some(vec![9, 8]));
        assert_eq!(cache.scan(&ka, Some(50), &stats).map(|o| o.rows), Some(vec![9, 8]));
        let s = stats.snapshot();
        assert_eq!((s.result_cache_hits, s.result_cache_misses), (4, 3));
        assert!(s.result_cache_bytes > 0);
        assert_eq!(cache.counters.hits.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn the_cache_stays_within_its_bytes_evicting_least_recently_used_first() {
        let b = BlockId::new();
        let key = |i: u64| {
            scan_key(
                "a",
                b,
                Signal::Logs,
                &req(Vec::new(), Vec::new(), (i, i + 1), None),
                0,
                1 << 40,
            )
        };
        let one = scanned(&(0..100).collect::<Vec<u32>>());
        let w = scanned_weight(&Scanned {
            rows: one.rows.clone(),
            times: one.times.clone(),
            batch: one.batch.clone(),
            complete: true,
        }) + key(0).weight();
        let cache = ResultCache::new(3 * w + w / 2);
        let stats = Stats::default();
        for i in 0..3 {
            cache.insert_scan(key(i), &one, None);
        }
        assert!(cache.scan(&key(0), None, &stats).is_some());
        cache.insert_scan(key(3), &one, None);
        assert!(cache.bytes() <= 3 * w + w / 2, "{} > {}", cache.bytes(), 3 * w + w / 2);
        assert!(
            cache.scan(&key(1), None, &stats).is_none(),
            "the least recently used went"
        );
        for i in [0, 2, 3] {
            assert!(cache.scan(&key(i), None, &stats).is_some(), "{i} stays");
        }
        assert_eq!(cache.counters.evictions.load(Ordering::Relaxed), 1);
        // Disabled: nothing kept.
        let none = ResultCache::new(0);
        none.insert_scan(key(0), &one, None);
        assert_eq!(none.bytes(), 0);
        assert!(!none.enabled());
    }
}
