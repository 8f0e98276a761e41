//! PromQL over stored metric points: parse (the `promql-parser` crate),
//! find the series every selector names in the blocks of the time window
//! (published and recent; blocks whose metric names cannot match are
//! pruned from their attribute index), then evaluate on the scan pool
//! ([`eval`]): a range query over every step at once where its shape
//! allows, else step by step. Answers use the Prometheus HTTP API's JSON shape,
//! plus `stats`.

pub mod eval;
pub mod load;
pub mod names;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use lrpar::{Lexeme as _, Lexer as _};
use mira_core::Signal;
use mira_core::scan::AttrScope;
use mira_core::sidecar::field;
use promql_parser::parser::{Expr, VectorSelector};
use serde::Serialize;
use serde_json::json;

use crate::answer::{Answer, Gaps};
use crate::labels::{LabelList, LabelsAnswer};
use crate::plan::{Candidate, Plan, Src};
use crate::stats::Stats;
use crate::{Querier, QueryError};
use eval::{Engine, Labels, Settings, Value};
use load::{BlockSeries, format_float};

/// Longest PromQL expression accepted, bytes.
pub const MAX_QUERY_LEN: usize = 64 * 1024;
/// Most steps of a range query (as Prometheus).
pub const MAX_STEPS: i64 = 11_000;
/// Most samples one evaluation step may hold.
pub const MAX_STEP_SAMPLES: usize = 5_000_000;
/// Instant selectors look this far back for a sample.
pub const LOOKBACK_MS: i64 = 300_000;

/// A PromQL request: one instant, or a range on a step grid (ms).
#[derive(Debug, Clone)]
pub struct PromQuery {
    pub tenant: String,
    pub query: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub step_ms: i64,
    pub instant: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PromData {
    #[serde(rename = "resultType")]
    pub result_type: &'static str,
    pub result: serde_json::Value,
}

/// The Prometheus-shaped result.
#[derive(Debug, Serialize)]
pub struct PromResult {
    pub status: &'static str,
    pub data: PromData,
}

pub type PromAnswer = Answer<PromResult>;

/// Deepest expression tree accepted: nested calls, aggregations,
/// parentheses, subqueries, unary and binary operators each count a level
/// (LogQL's `MAX_DEPTH` is 64; a chain `a + b + c` is as deep as its
/// terms).
pub const MAX_DEPTH: usize = 100;

/// The stack of the thread a query is parsed, measured and (when too
/// deep) dropped on: an expression [`MAX_QUERY_LEN`] long nests at most
/// about 32,000 levels, and building, measuring and dropping it recurses
/// once per level.
const PARSE_STACK: usize = 64 << 20;

/// Parses `query` and checks its depth ([`MAX_DEPTH`]) on a thread of its
/// own with a stack large enough for the deepest expression the length
/// limit allows, so no query can overflow a stack: not in the parser, not
/// while its depth is measured, not when a refused tree is dropped, and
/// (bounded to [`MAX_DEPTH`]) not in the evaluators, which recurse once a
/// level. Errors are [`parse_shallow`]'s, or a depth refusal naming the
/// limit.
pub fn parse(query: &str) -> Result<Expr, QueryError> {
    let owned = query.to_owned();
    let worker = std::thread::Builder::new()
        .name("mira-promql-parse".into())
        .stack_size(PARSE_STACK)
        .spawn(move || {
            let expr = parse_shallow(&owned)?;
            let depth = depth(&expr);
            if depth > MAX_DEPTH {
                return Err(QueryError::BadRequest(format!(
                    "the query is nested {depth} levels deep (calls, aggregations, parentheses and operators); the limit is {MAX_DEPTH}"
                )));
            }
            Ok(expr)
        });
    match worker {
        Ok(handle) => handle
            .join()
            .unwrap_or_else(|_| Err(QueryError::BadRequest("the query could not be parsed".into()))),
        Err(e) => Err(QueryError::Internal(format!("starting the PromQL parse thread: {e}"))),
    }
}

/// How deep `expr` nests (a selector or literal is 1).
fn depth(expr: &Expr) -> usize {
    let below = match expr {
        Expr::Aggregate(a) => depth(&a.expr).max(a.param.as_deref().map_or(0, depth)),
        Expr::Unary(u) => depth(&u.expr),
        Expr::Binary(b) => depth(&b.lhs).max(depth(&b.rhs)),
        Expr::Paren(p) => depth(&p.expr),
        Expr::Subquery(s) => depth(&s.expr),
        Expr::Call(c) => c.args.args.iter().map(|a| depth(a)).max().unwrap_or(0),
        Expr::NumberLiteral(_)
        | Expr::StringLiteral(_)
        | Expr::VectorSelector(_)
        | Expr::MatrixSelector(_)
        | Expr::Extension(_) => 0,
    };
    below + 1
}

/// "parse error at byte N: reason". The parser reports reasons without
/// positions; the position is the end of the input for an unfinished
/// query, else the start of the first token after the longest prefix that
/// parses (or, for a lexical error, the first byte that fails to lex).
/// No depth check: [`parse`] is the entry for outside queries.
fn parse_shallow(query: &str) -> Result<Expr, QueryError> {
    if query.len() > MAX_QUERY_LEN {
        return Err(QueryError::BadRequest(format!(
            "the query is {} bytes; the limit is {MAX_QUERY_LEN}",
            query.len()
        )));
    }
    if query.trim().is_empty() {
        return Err(QueryError::BadRequest("parse error at byte 0: empty query".into()));
    }
    promql_parser::parser::parse(query).map_err(|reason| {
        let pos = error_position(query, &reason);
        QueryError::BadRequest(format!("parse error at byte {pos}: {reason}"))
    })
}

/// Most bytes [`error_position`] parses to find where a query fails.
const ERROR_SEARCH_BYTES: usize = 256 * 1024;

fn error_position(query: &str, reason: &str) -> usize {
    let at_end = ["end of input", "unclosed", "unterminated", "unexpected end"];
    if at_end.iter().any(|w| reason.contains(w)) {
        return query.len();
    }
    match promql_parser::parser::lex::lexer(query) {
        Ok(lexer) => {
            let spans: Vec<(usize, usize)> = lexer
                .iter()
                .filter_map(Result::ok)
                .map(|l| (l.span().start(), l.span().end()))
                .collect();
            // The longest parsing prefix, found from the end: parses of
            // at most [`ERROR_SEARCH_BYTES`] in all (every prefix of a long
            // query would be quadratic), else position 0.
            let mut budget = ERROR_SEARCH_BYTES;
            for (i, &(_, end)) in spans.iter().enumerate().rev() {
                if end > budget {
                    return 0;
                }
                budget -= end;
                if promql_parser::parser::parse(&query[..end]).is_ok() {
                    return spans.get(i + 1).map_or(query.len(), |s| s.0);
                }
            }
            spans.first().map_or(query.len(), |s| s.0)
        }
        Err(_) => {
            // The first prefix (at a character boundary) that fails to lex
            // with an error other than running out of input.
            let limit = query.len().min(4096);
            (1..=limit)
                .filter(|&n| query.is_char_boundary(n))
                .find(|&n| match promql_parser::parser::lex::lexer(&query[..n]) {
                    Err(e) => !at_end.iter().any(|w| e.contains(w)),
                    Ok(_) => false,
                })
                .map_or(0, |n| n.saturating_sub(1))
        }
    }
}

/// The latest time a query may evaluate at or read, ms: the last one a
/// nanosecond count in an `i64` holds (2262-04-11), as stored times.
pub const MAX_TIME_MS: i64 = i64::MAX / 1_000_000;
/// The earliest, ms (1677-09-21).
pub const MIN_TIME_MS: i64 = -MAX_TIME_MS;

/// `ms` as a stored time (ns): before 1970 is 0, where no sample is.
/// `ms` is within [`MIN_TIME_MS`, `MAX_TIME_MS`] ([`check_time`]).
fn ns(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000)
}

/// Refuses a time outside the ones a query can read.
fn check_time(name: &str, ms: i64) -> Result<(), QueryError> {
    if (MIN_TIME_MS..=MAX_TIME_MS).contains(&ms) {
        return Ok(());
    }
    Err(QueryError::BadRequest(format!(
        "{name} ({ms} ms) is outside the times a query can read (1677-09-21 to 2262-04-11)"
    )))
}

/// The selectors of `expr` and the times (ms) each reads samples in:
/// `(t - offset - range, t - offset]` for every evaluation time `t` in
/// `[start_ms, end_ms]`, or at its `@` time alone (a range selector's
/// range; an instant selector's, the lookback). Windows outside the
/// representable times ([`check_time`]) are refused, so the evaluator's
/// time arithmetic cannot overflow.
fn reads(expr: &Expr, s: &Settings) -> Result<Vec<(VectorSelector, i64, i64)>, QueryError> {
    fn walk<'e>(expr: &'e Expr, out: &mut Vec<(&'e VectorSelector, Option<i64>)>) {
        match expr {
            Expr::VectorSelector(vs) => out.push((vs, None)),
            Expr::MatrixSelector(ms) => out.push((&ms.vs, Some(eval::range_ms(ms)))),
            Expr::Aggregate(a) => {
                walk(&a.expr, out);
                if let Some(p) = &a.param {
                    walk(p, out);
                }
            }
            Expr::Unary(u) => walk(&u.expr, out),
            Expr::Binary(b) => {
                walk(&b.lhs, out);
                walk(&b.rhs, out);
            }
            Expr::Paren(p) => walk(&p.expr, out),
            Expr::Subquery(sq) => walk(&sq.expr, out),
            Expr::Call(c) => c.args.args.iter().for_each(|a| walk(a, out)),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
        }
    }
    // Recursion bounded by [`MAX_DEPTH`] ([`parse`]).
    let mut found = Vec::new();
    walk(expr, &mut found);
    found
        .into_iter()
        .map(|(vs, range)| {
            let back = i128::from(range.unwrap_or(s.lookback_ms));
            let (first, last) = match eval::at_ms(&vs.at, s) {
                Some(at) => (at, at),
                None => (s.start_ms, s.end_ms),
            };
            let off = i128::from(eval::offset_ms(&vs.offset));
            let (from, to) = (i128::from(first) - off - back, i128::from(last) - off);
            let inside = |t: i128| (i128::from(MIN_TIME_MS)..=i128::from(MAX_TIME_MS)).contains(&t);
            if !inside(from) || !inside(to) {
                let shown: String = vs.to_string().chars().take(200).collect();
                return Err(QueryError::BadRequest(format!(
                    "{shown} reads samples from {from} ms to {to} ms (its range, offset and @ applied), outside the times a query can read (1677-09-21 to 2262-04-11)"
                )));
            }
            Ok((vs.clone(), from as i64, to as i64))
        })
        .collect()
}

fn fmt_value(v: f64) -> String {
    format_float(v)
}

fn fmt_time(ms: i64) -> serde_json::Value {
    if ms % 1000 == 0 {
        json!(ms / 1000)
    } else {
        json!(ms as f64 / 1000.0)
    }
}

/// A matrix element: `{"metric": {...}, "values": [[t, "v"], ...]}`.
fn series_json(labels: &Labels, points: &[(i64, f64)]) -> serde_json::Value {
    json!({"metric": metric_json(labels),
        "values": points.iter().map(|(t, v)| json!([fmt_time(*t), fmt_value(*v)])).collect::<Vec<_>>()})
}

fn metric_json(labels: &Labels) -> serde_json::Value {
    serde_json::Value::Object(labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
}

impl Querier {
    /// Loads the series matching any of `sel` with samples in
    /// `[from_ms, to_ms]`. A series may also hold samples outside it: a
    /// published block is read whole when the result cache is on, so a
    /// sliding range (a dashboard's refresh) finds it kept.
    async fn load_series(
        &self,
        tenant: &str,
        sel: &[promql_parser::parser::VectorSelector],
        from_ms: i64,
        to_ms: i64,
        stats: &Stats,
    ) -> Result<(Vec<Arc<eval::Series>>, Gaps), QueryError> {
        let plan = self.plan_metrics(tenant, from_ms, to_ms, stats).await?;
        let series = self.read_series(&plan, sel, from_ms, to_ms, stats).await?;
        Ok((series, plan.gaps))
    }

    /// The metrics blocks of `tenant` with samples in `[from_ms, to_ms]`.
    async fn plan_metrics(&self, tenant: &str, from_ms: i64, to_ms: i64, stats: &Stats) -> Result<Plan, QueryError> {
        let from_ns = ns(from_ms);
        let to_ns = ns(to_ms).saturating_add(999_999);
        self.plan(tenant, Signal::Metrics, from_ns, to_ns.saturating_add(1), stats)
            .await
    }

    /// The series of `plan`'s blocks matching any of `sel` (see
    /// [`Querier::load_series`]).
    async fn read_series(
        &self,
        plan: &Plan,
        sel: &[promql_parser::parser::VectorSelector],
        from_ms: i64,
        to_ms: i64,
        stats: &Stats,
    ) -> Result<Vec<Arc<eval::Series>>, QueryError> {
        // Names the selectors fix; a block none of whose metrics can give
        // one of them is pruned.
        let fixed: Option<Vec<String>> = sel
            .iter()
            .map(|s| {
                s.name.clone().or_else(|| {
                    s.matchers
                        .matchers
                        .iter()
                        .find(|m| m.name == eval::NAME && matches!(m.op, promql_parser::label::MatchOp::Equal))
                        .map(|m| m.value.clone())
                })
            })
            .collect();
        let sel = Arc::new(sel.to_vec());
        let reads = plan.candidates.iter().enumerate().map(|(at, c)| {
            let sel = sel.clone();
            let fixed = fixed.clone();
            async move {
                if let Some(names) = &fixed
                    && !self.metric_names_may_match(c, names, stats).await?
                {
                    stats.add_pruned(mira_core::sidecar::PruneRule::AttrIndex);
                    return Ok::<_, QueryError>((at, Arc::new(BlockSeries::new())));
                }
                // A published block's series may be kept ([`crate::results`]),
                // for the whole block: the evaluator only reads samples in
                // its windows, all inside `[from_ms, to_ms]`.
                let cache_key = match &c.src {
                    Src::Published { key } if self.results.enabled() => {
                        let (manifest, _) = self.published_sidecars(key, stats).await?;
                        let m = &manifest.meta;
                        Some(crate::results::series_key(
                            m.tenant.as_str(),
                            m.block_id,
                            &sel,
                            i64::MIN,
                            i64::MAX,
                            m.min_time,
                            m.max_time,
                        ))
                    }
                    _ => None,
                };
                if let Some(k) = &cache_key
                    && let Some(map) = self.results.series(k, stats)
                {
                    // Counted as fetched, as a scan's hit is.
                    stats.add_fetched();
                    return Ok((at, map));
                }
                let tables = self.scan_tables(c, &load::TABLES, stats).await?;
                let id = c.id;
                // A published block's point runs are found once and kept
                // with its decoded tables (ids are never reused); a recent
                // block's, which grows under its id, on every read.
                let keep = matches!(c.src, Src::Published { .. }).then(|| self.decoded.clone());
                let kept = keep
                    .as_ref()
                    .and_then(|cache| cache.get(id, load::POINT_RUNS))
                    .and_then(|t| load::runs_from_table(&t));
                let (lo, hi) = if cache_key.is_some() {
                    (i64::MIN, i64::MAX)
                } else {
                    (from_ms, to_ms)
                };
                let (map, read) = self
                    .on_pool(move || {
                        // Any selector; `unknown` labels count as met.
                        let asks = |l: &dyn eval::LabelLookup, unknown: &[&str]| {
                            sel.iter()
                                .any(|s| eval::may_match(&s.matchers, s.name.as_deref(), l, unknown))
                        };
                        let full = |l: &dyn eval::LabelLookup| asks(l, &[]);
                        let partial = |l: &dyn eval::LabelLookup| asks(l, &["le", "quantile"]);
                        let want = load::Want {
                            full: &full,
                            partial: &partial,
                        };
                        let runs = match kept {
                            Some(runs) => runs,
                            None => {
                                let runs = load::point_runs(&tables)?;
                                if let Some(cache) = keep {
                                    let t = load::runs_table(&runs);
                                    let weight = mira_core::decoded::batch_weight(&t);
                                    cache.insert(id, load::POINT_RUNS, t, weight);
                                }
                                runs
                            }
                        };
                        load::read_block(&tables, lo, hi, &want, runs.as_deref())
                    })
                    .await
                    .map_err(|e| QueryError::corrupt(&format!("block {id}"), e))?;
                stats.add_rows(read as u64);
                let map = Arc::new(map);
                if let Some(k) = cache_key {
                    self.results.insert_series(k, map.clone());
                }
                Ok((at, map))
            }
        });
        // Each block's series are counted as its read ends, and the reads
        // still running are dropped once the query selects more than
        // `--max-query-series` series or loads more than
        // `--max-query-samples` samples in its window (a block's own size
        // is bounded).
        let (max_series, max_samples) = (self.config.max_series, self.config.max_samples);
        let mut reads: futures::stream::FuturesUnordered<_> = reads.collect();
        let mut parts: Vec<Option<Arc<BlockSeries>>> = vec![None; plan.candidates.len()];
        let in_window = |s: &eval::Series| {
            let first = s.samples.partition_point(|p| p.0 < from_ms);
            s.samples[first..].partition_point(|p| p.0 <= to_ms)
        };
        // Distinct series by a hash of their labels (a collision, at 64
        // bits, only undercounts).
        let hasher = foldhash::fast::FixedState::with_seed(0);
        let mut distinct: std::collections::HashSet<u64, foldhash::fast::RandomState> = Default::default();
        let mut loaded = 0usize;
        while let Some(read) = futures::StreamExt::next(&mut reads).await {
            let (at, part) = read?;
            for s in part.iter() {
                let n = in_window(s);
                if n > 0 {
                    loaded += n;
                    distinct.insert(std::hash::BuildHasher::hash_one(&hasher, &s.labels));
                }
            }
            if distinct.len() > max_series {
                return Err(QueryError::TooBig(format!(
                    "the query selects more than {max_series} series (--max-query-series); add label matchers"
                )));
            }
            if loaded > max_samples {
                return Err(QueryError::TooBig(format!(
                    "the query loads more than {max_samples} samples (--max-query-samples); add label matchers or narrow the range"
                )));
            }
            parts[at] = Some(part);
        }
        // A series held by one block is used as that block gave it (no
        // copy); one several blocks hold is merged, the earlier block's
        // sample kept where two have the same time.
        let mut index: HashMap<&Labels, usize, foldhash::fast::RandomState> = HashMap::default();
        let mut held: Vec<Vec<&Arc<eval::Series>>> = Vec::new();
        for part in parts.iter().flatten() {
            for s in part.iter().filter(|s| in_window(s) > 0) {
                match index.entry(&s.labels) {
                    Entry::Occupied(e) => held[*e.get()].push(s),
                    Entry::Vacant(e) => {
                        e.insert(held.len());
                        held.push(vec![s]);
                    }
                }
            }
        }
        let all = held
            .into_iter()
            .map(|copies| match copies.as_slice() {
                [one] => Arc::clone(one),
                many => Arc::new(eval::Series::sorted(
                    many[0].labels.clone(),
                    many.iter().flat_map(|s| s.samples.iter().copied()).collect(),
                )),
            })
            .collect();
        Ok(all)
    }

    /// Whether the block's metric names (from its attribute index) can
    /// give one of `names` (the Prometheus name starts with the sanitized
    /// OTLP name).
    async fn metric_names_may_match(&self, c: &Candidate, names: &[String], stats: &Stats) -> Result<bool, QueryError> {
        let Src::Published { key } = &c.src else {
            return Ok(true);
        };
        let (_, sidecars) = self.published_sidecars(key, stats).await?;
        let Some(listed) = sidecars.attrs.values(AttrScope::Field, field::METRIC_NAME) else {
            return Ok(true);
        };
        Ok(listed.iter().any(|otlp| {
            let base = names::metric_name(otlp, "", true, false);
            names.iter().any(|n| n.starts_with(&base))
        }))
    }

    /// The label sets of the series in `[start_ms, end_ms]` that match any
    /// of `matches` (PromQL series selectors; none matches every series),
    /// sorted, with the warnings of a partial answer.
    pub async fn metric_series(
        self: &Arc<Self>,
        tenant: &str,
        matches: &[String],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<(Vec<Labels>, Gaps), QueryError> {
        let mut selectors = Vec::new();
        for m in matches {
            match parse(m)? {
                Expr::VectorSelector(s) => selectors.push(s),
                _ => {
                    return Err(QueryError::BadRequest(format!(
                        "match[]={:?} is not a series selector",
                        m.chars().take(200).collect::<String>()
                    )));
                }
            }
        }
        if selectors.is_empty() {
            let Ok(Expr::VectorSelector(all)) = promql_parser::parser::parse(r#"{__name__=~".+"}"#) else {
                return Err(QueryError::Internal("the match-all selector did not parse".into()));
            };
            selectors.push(all);
        }
        check_time("start", start_ms)?;
        check_time("end", end_ms)?;
        self.check_range(ns(start_ms), ns(end_ms))?;
        let stats = Stats::default();
        let (series, gaps) = self.load_series(tenant, &selectors, start_ms, end_ms, &stats).await?;
        let mut out: Vec<Labels> = series.iter().map(|s| s.labels.clone()).collect();
        out.sort();
        Ok((out, gaps))
    }

    /// Metric metadata in `[start, end)` ns: name -> distinct (type, help),
    /// optionally of one metric only.
    pub async fn metric_metadata(
        self: &Arc<Self>,
        tenant: &str,
        metric: Option<&str>,
        start: u64,
        end: u64,
    ) -> Result<(std::collections::BTreeMap<String, Vec<(&'static str, String)>>, Gaps), QueryError> {
        self.check_range(start, end)?;
        let stats = Stats::default();
        let plan = self.plan(tenant, Signal::Metrics, start, end, &stats).await?;
        let reads = plan.candidates.iter().map(|c| async {
            let tables = self
                .scan_tables(
                    c,
                    &[
                        mira_core::schema::SERIES,
                        mira_core::schema::RESOURCES,
                        mira_core::schema::RESOURCE_ATTRS,
                    ],
                    &stats,
                )
                .await?;
            let id = c.id;
            self.on_pool(move || load::read_metadata(&tables))
                .await
                .map_err(|e| QueryError::corrupt(&format!("block {id}"), e))
        });
        let mut out: std::collections::BTreeMap<String, Vec<(&'static str, String)>> = Default::default();
        for part in futures::future::try_join_all(reads).await? {
            for (name, kind, help) in part {
                if metric.is_some_and(|m| m != name) {
                    continue;
                }
                let e = out.entry(name).or_default();
                if !e.iter().any(|(k, h)| *k == kind && *h == help) {
                    e.push((kind, help));
                }
            }
        }
        Ok((out, plan.gaps))
    }

    /// Metric label names (Prometheus form, `__name__` included) in
    /// `[start, end)` ns, or the values of label `name`, sorted.
    pub async fn metric_labels(
        self: &Arc<Self>,
        tenant: &str,
        name: Option<&str>,
        start: u64,
        end: u64,
    ) -> Result<LabelsAnswer, QueryError> {
        let stats = Stats::default();
        let (series, mut gaps) = self
            .metric_series(tenant, &[], (start / 1_000_000) as i64, (end / 1_000_000) as i64)
            .await?;
        let mut out = std::collections::BTreeSet::new();
        for labels in &series {
            match name {
                None => out.extend(labels.iter().map(|(k, _)| k.clone())),
                Some(n) => out.extend(eval::label(labels, n).map(str::to_owned)),
            }
        }
        let max = crate::labels::MAX_VALUES;
        if out.len() > max {
            gaps.note(format!("more than {max} values; the first {max} are listed"));
        }
        let data = out.into_iter().take(max).collect();
        Ok(Answer::new(LabelList { data }, gaps, &stats))
    }

    /// Evaluates a PromQL query.
    pub async fn promql(self: &Arc<Self>, q: PromQuery) -> Result<PromAnswer, QueryError> {
        let Prepared {
            expr,
            settings,
            reads,
            from,
            to,
        } = prepare(&q)?;
        self.check_range(ns(q.start_ms), ns(q.end_ms))?;
        // What the query reads, from its earliest sample (ranges, offsets,
        // the lookback, `@`) to its latest (a negative offset, `@` later
        // than the end), is held to the range limits as `[start, end]` is.
        self.check_range(ns(from), ns(to)).map_err(|e| match e {
            QueryError::TooBig(m) => QueryError::TooBig(format!(
                "{m}: the samples the query reads, its ranges, offsets, `@` and the {}m lookback applied",
                LOOKBACK_MS / 60_000
            )),
            other => other,
        })?;
        let stats = Stats::default();
        let plan = self.plan_metrics(&q.tenant, from, to, &stats).await?;
        // An answer read from published blocks only may be kept whole
        // ([`crate::results`]): the same blocks give the same answer.
        let answer_key = self
            .results
            .enabled()
            .then(|| {
                let what = format!(
                    "promql {} {} {} {} {:?}",
                    q.start_ms, q.end_ms, q.step_ms, q.instant, q.query
                );
                crate::results::answer_key(&q.tenant, &what, &plan.candidates)
            })
            .flatten();
        if let Some(k) = &answer_key
            && let Some(data) = self.results.prom_answer(k, &stats)
        {
            return Ok(Answer::new(
                PromResult {
                    status: "success",
                    data: PromData::clone(&data),
                },
                plan.gaps,
                &stats,
            ));
        }
        let series = self.read_series(&plan, &reads, from, to, &stats).await?;
        let gaps = plan.gaps;
        let data = self
            .on_pool(move || evaluate(expr, series, settings, &q))
            .await
            .map_err(|e| QueryError::BadRequest(e.0))?;
        if let Some(k) = answer_key {
            self.results.insert_prom_answer(k, Arc::new(data.clone()));
        }
        Ok(Answer::new(
            PromResult {
                status: "success",
                data,
            },
            gaps,
            &stats,
        ))
    }
}

/// A checked query, before its series are loaded.
struct Prepared {
    expr: Expr,
    settings: Settings,
    /// Its selectors.
    reads: Vec<VectorSelector>,
    /// The earliest and latest times (ms) it reads samples at.
    from: i64,
    to: i64,
}

/// Parses and checks `q` (depth, times, steps, the windows it reads)
/// without the limits that are the querier's (ranges, blocks, series).
fn prepare(q: &PromQuery) -> Result<Prepared, QueryError> {
    let expr = parse(&q.query)?;
    check_time("start", q.start_ms)?;
    check_time("end", q.end_ms)?;
    if q.start_ms > q.end_ms {
        return Err(QueryError::BadRequest(format!(
            "start ({}) is after end ({})",
            q.start_ms, q.end_ms
        )));
    }
    if !q.instant {
        if q.step_ms <= 0 {
            return Err(QueryError::BadRequest("step must be positive".into()));
        }
        let steps = (q.end_ms - q.start_ms) / q.step_ms + 1;
        if steps > MAX_STEPS {
            return Err(QueryError::TooBig(format!(
                "the range holds {steps} steps; the limit is {MAX_STEPS}: raise step or narrow the range"
            )));
        }
    }
    let settings = Settings {
        lookback_ms: LOOKBACK_MS,
        start_ms: q.start_ms,
        end_ms: q.end_ms,
        max_samples: MAX_STEP_SAMPLES,
    };
    let windows = reads(&expr, &settings)?;
    let from = windows.iter().map(|r| r.1).min().unwrap_or(q.start_ms);
    let to = windows.iter().map(|r| r.2).max().unwrap_or(q.end_ms);
    Ok(Prepared {
        expr,
        settings,
        reads: windows.into_iter().map(|r| r.0).collect(),
        from,
        to,
    })
}

/// [`Querier::promql`] over series held in memory (the fuzz target's
/// entry): the same checks, the series cut to the window the query reads
/// as the loader cuts them, the same evaluation.
pub fn evaluate_in_memory(q: &PromQuery, series: Vec<eval::Series>) -> Result<PromData, QueryError> {
    let p = prepare(q)?;
    let series = series
        .into_iter()
        .map(|s| {
            let samples = s
                .samples
                .into_iter()
                .filter(|t| (p.from..=p.to).contains(&t.0))
                .collect();
            Arc::new(eval::Series::sorted(s.labels, samples))
        })
        .filter(|s| !s.samples.is_empty())
        .collect();
    evaluate(p.expr, series, p.settings, q).map_err(|e| QueryError::BadRequest(e.0))
}

pub(crate) fn evaluate(
    expr: Expr,
    series: Vec<Arc<eval::Series>>,
    settings: Settings,
    q: &PromQuery,
) -> Result<PromData, eval::EvalError> {
    let engine = Engine::shared(series, settings);
    if q.instant {
        let t = q.end_ms;
        return Ok(match engine.eval(&expr, t)? {
            Value::Scalar(v) => PromData {
                result_type: "scalar",
                result: json!([fmt_time(t), fmt_value(v)]),
            },
            Value::Str(s) => PromData {
                result_type: "string",
                result: json!([fmt_time(t), s]),
            },
            Value::Vector(mut v) => {
                v.sort_by(|a, b| a.labels.cmp(&b.labels));
                PromData {
                    result_type: "vector",
                    result: v
                        .iter()
                        .map(|s| json!({"metric": metric_json(&s.labels), "value": [fmt_time(t), fmt_value(s.v)]}))
                        .collect(),
                }
            }
            Value::Matrix(mut m) => {
                m.sort_by(|a, b| a.labels.cmp(&b.labels));
                PromData {
                    result_type: "matrix",
                    result: m.iter().map(|s| series_json(&s.labels, &s.points)).collect(),
                }
            }
        });
    }
    // Over every step at once where the expression's shape allows, else
    // step by step in parallel on the scan pool (this runs on it).
    let steps: Vec<i64> = (0..)
        .map(|k| q.start_ms + k * q.step_ms)
        .take_while(|t| *t <= q.end_ms)
        .collect();
    let out = engine.eval_range(&expr, &steps)?;
    Ok(PromData {
        result_type: "matrix",
        result: out.iter().map(|(labels, points)| series_json(labels, points)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_nested_past_the_limit_are_refused_not_evaluated() {
        let deep = |n: usize| format!("{}m{}", "abs(".repeat(n), ")".repeat(n));
        // 3,000 nested calls overflowed a scan thread's stack before.
        for q in [
            deep(3_000),
            deep(MAX_DEPTH),
            vec!["m"; 5_000].join(" + "),
            format!("{}m", "-".repeat(10_000)),
            format!("{}m{}", "(".repeat(20_000), ")".repeat(20_000)),
            format!("sum({})", vec!["rate(m[1m])"; 2_000].join(" or ")),
        ] {
            let err = parse(&q).expect_err("too deep");
            assert!(
                err.to_string().contains(&format!("the limit is {MAX_DEPTH}")),
                "{}: {err}",
                &q[..40]
            );
        }
        // At the limit: accepted (the call's argument is the 100th level).
        assert!(parse(&deep(MAX_DEPTH - 1)).is_ok());
        assert_eq!(depth(&parse(&deep(MAX_DEPTH - 1)).expect("parse")), MAX_DEPTH);
        assert_eq!(depth(&parse("sum(rate(m[5m])) by (a) / 2").expect("parse")), 4);
        // Errors still name a position and a reason.
        assert!(
            parse("sum(")
                .expect_err("unfinished")
                .to_string()
                .starts_with("parse error at byte")
        );
    }

    #[test]
    fn a_query_reads_its_selectors_windows_at_their_at_and_offset_times() {
        let s = Settings {
            lookback_ms: LOOKBACK_MS,
            start_ms: 1_000_000,
            end_ms: 2_000_000,
            max_samples: 1,
        };
        let windows = |q: &str| -> Vec<(i64, i64)> {
            reads(&parse(q).expect("parse"), &s)
                .expect("reads")
                .into_iter()
                .map(|r| (r.1, r.2))
                .collect()
        };
        assert_eq!(windows("m"), [(700_000, 2_000_000)]);
        assert_eq!(windows("rate(m[10m] offset 1m)"), [(340_000, 1_940_000)]);
        assert_eq!(windows("m offset -5m"), [(1_000_000, 2_300_000)]);
        assert_eq!(windows("m @ 100"), [(-200_000, 100_000)]);
        assert_eq!(windows("rate(m[1m] @ end())"), [(1_940_000, 2_000_000)]);
        assert_eq!(windows("m @ start() offset 1s + vector(1)"), [(699_000, 999_000)]);
        assert!(windows("vector(1)").is_empty());
        for q in [
            "m @ 9999999999999",
            "m offset -300000y",
            "m[300000y]",
            "m offset 300000y",
        ] {
            let e = reads(&parse(q).expect("parse"), &s).expect_err(q).to_string();
            assert!(e.contains("outside the times a query can read"), "{q}: {e}");
        }
    }

    #[test]
    fn queries_at_the_depth_limit_evaluate_and_at_and_offsets_read_their_windows() {
        let m = |v: f64| eval::Series {
            labels: vec![("__name__".to_owned(), "m".to_owned())],
            samples: (0..100).map(|i| (i * 60_000, v + i as f64)).collect(),
        };
        let q = |query: String, start_ms, end_ms, instant| PromQuery {
            tenant: "t".into(),
            query,
            start_ms,
            end_ms,
            step_ms: 60_000,
            instant,
        };
        let answer = |q: &PromQuery| {
            serde_json::to_string(&evaluate_in_memory(q, vec![m(0.0)]).expect("answer").result).expect("json")
        };
        // 100 levels, instant and over a range (the step-by-step and the
        // all-steps evaluators), on a test thread's stack.
        let nested = format!(
            "{}rate(m[5m]){}",
            "abs(".repeat(MAX_DEPTH - 2),
            ")".repeat(MAX_DEPTH - 2)
        );
        let chain = vec!["m"; MAX_DEPTH].join(" + ");
        for text in [nested, chain] {
            assert_eq!(depth(&parse(&text).expect("parse")), MAX_DEPTH);
            assert!(answer(&q(text.clone(), 600_000, 600_000, true)).contains("\"value\""));
            assert!(answer(&q(text, 0, 3_000_000, false)).contains("\"values\""));
        }
        // `@` and a negative offset read the samples they name.
        assert_eq!(
            answer(&q("m @ 120".into(), 3_000_000, 3_000_000, true)),
            r#"[{"metric":{"__name__":"m"},"value":[3000,"2"]}]"#
        );
        assert_eq!(
            answer(&q("m offset -10m".into(), 60_000, 60_000, true)),
            r#"[{"metric":{"__name__":"m"},"value":[60,"11"]}]"#
        );
        let e =
            evaluate_in_memory(&q("m".into(), MAX_TIME_MS + 1, MAX_TIME_MS + 1, true), vec![]).expect_err("too late");
        assert!(e.to_string().contains("outside the times a query can read"), "{e}");
    }

    #[test]
    fn parse_errors_name_a_position_and_a_reason() {
        let e = parse("sum(rate(x[5m])) by (job").expect_err("unclosed").to_string();
        assert!(e.contains("at byte 24") && e.contains("parenthesis"), "{e}");
        let e = parse("1 +* 2").expect_err("bad operator").to_string();
        assert!(e.contains("at byte 2"), "{e}");
        let e = parse(r#"x{a="b""#).expect_err("unbalanced selector").to_string();
        assert!(e.contains("at byte 7") && e.contains("braces"), "{e}");
        let e = parse("").expect_err("empty").to_string();
        assert!(e.contains("empty"), "{e}");
        let e = parse(&"x+".repeat(40_000)).expect_err("huge").to_string();
        assert!(e.contains("limit"), "{e}");
        assert!(parse("histogram_quantile(0.9, sum by (le) (rate(x_bucket[5m])))").is_ok());
    }
}
