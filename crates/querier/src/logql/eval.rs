//! Evaluating LogQL.
//!
//! A log query pages through the native logs scan (the selector's stream
//! labels, a `trace_id` filter and the line filters before any
//! `line_format` are pushed down, so blocks are pruned by the same zone
//! maps, attribute index and Bloom filters) and runs the pipeline over
//! every line, until `limit` lines pass. A metric query reads every line
//! of each range aggregation's window once, turns the pipeline's survivors
//! into per-step samples (Loki's range semantics: a step `t` covers
//! `(t - range, t]`), and hands the rest of the expression (vector
//! aggregations, binary operators, `vector()`, `label_replace`) to the
//! PromQL engine, where each range aggregation is a series set of its own.

use std::collections::HashMap;
use std::sync::Arc;

use mira_core::Signal;
use mira_core::convert::{LogRow, log_rows, table_names};
use mira_core::scan::{AttrMatcher, AttrScope, LineFilter, MatchOp as CoreOp, Order, Predicate, ScanRequest};
use serde_json::Value;

use super::ast::{
    Expr, Grouping, LabelFilter, LineOp, LineValue, LogExpr, MatchOp, MetricExpr, RangeAgg, RangeOp, Stage, VectorOp,
};
use super::model::{Cat, Entry, FIELDS, INDEX, UNKNOWN_SERVICE, entry, index_key, label_name};
use super::parse::parse;
use super::pipeline::{ERROR, ERROR_DETAILS, Pipeline, str_test};
use crate::answer::{Answer, Gaps};
use crate::logs::{LineKey, LogsQuery};
use crate::plan::{Candidate, Waves};
use crate::promql::{self, PromData, PromQuery, eval as engine};
use crate::stats::Stats;
use crate::{Querier, QueryError};

/// Most series one range aggregation may produce.
pub const MAX_SERIES: usize = 100_000;
/// Most log lines one metric query may read.
pub const MAX_LINES: usize = 20_000_000;

/// A LogQL request, in Loki's terms.
#[derive(Debug, Clone)]
pub struct LogqlQuery {
    pub tenant: String,
    pub query: String,
    /// `[start, end]` Unix nanoseconds (log queries: `[start, end)`).
    pub start: u64,
    pub end: u64,
    /// Step of a range query, ms (0 for an instant query).
    pub step_ms: i64,
    pub instant: bool,
    pub limit: usize,
    /// `NewestFirst` (Loki's `backward`) or `OldestFirst`.
    pub order: Order,
    /// Answer streams with `categorize-labels` 3-tuples.
    pub categorize: bool,
}

/// A Loki answer's `result`: lines (streams) or samples (as the PromQL
/// engine renders them).
#[derive(Debug)]
pub enum LogqlResult {
    Streams(Vec<Entry>),
    Samples(Value),
}

/// The `data` of a Loki answer.
#[derive(Debug)]
pub struct LogqlData {
    pub result_type: &'static str,
    pub result: LogqlResult,
    /// Lines returned (log queries).
    pub entries: usize,
    /// Set on categorized streams answers.
    pub categorized: bool,
}

pub type LogqlAnswer = Answer<LogqlData>;

fn bad(msg: String) -> QueryError {
    QueryError::BadRequest(msg)
}

/// Parses a query with Loki's error text.
pub fn parse_query(q: &str) -> Result<Expr, QueryError> {
    parse(q).map_err(|e| bad(e.to_string()))
}

/// A compiled log expression: pushed-down scan filters, the full
/// selector, the pipeline.
pub(crate) struct Compiled {
    pub matchers: Vec<AttrMatcher>,
    pub lines: Vec<LineFilter>,
    pub trace_id: Option<[u8; 16]>,
    selector: Vec<(String, CoreOp)>,
    pipeline: Pipeline,
}

/// Label names that only attributes give, and the attributes (scope,
/// key) that give each: a matcher on such a name that only one attribute
/// can satisfy runs in the scan.
pub(crate) type Names = HashMap<String, Vec<(AttrScope, String)>>;

/// The attributes found to give a label name in a tenant's published
/// blocks, and which blocks were looked at (published blocks never
/// change): a query looks only at blocks it has not seen before. The keys
/// are those of every block seen, a superset of any query's, so a
/// pushdown decided from them is never wrong (at worst not made).
#[derive(Debug, Default)]
pub struct Resolutions {
    map: std::sync::Mutex<HashMap<(String, String), Resolved>>,
}

#[derive(Debug, Default, Clone)]
struct Resolved {
    keys: Vec<(AttrScope, String)>,
    seen: std::collections::HashSet<mira_core::BlockId>,
}

/// Most (tenant, label) resolutions kept.
const RESOLUTIONS: usize = 1024;

/// Adds the attributes of `sidecars` that give `label` to `keys`.
fn add_keys(keys: &mut Vec<(AttrScope, String)>, sidecars: &mira_core::sidecar::Sidecars, label: &str) {
    for scope in [AttrScope::Resource, AttrScope::Record] {
        for key in sidecars.attrs.keys(scope) {
            if !gives(key, label) || (scope == AttrScope::Resource && INDEX.iter().any(|(_, k)| *k == key)) {
                continue;
            }
            if !keys.iter().any(|(s, k)| *s == scope && k == key) {
                keys.push((scope, key.to_owned()));
            }
        }
    }
}

/// The attribute-only label names a query matches on (whose attributes
/// the scan may test).
fn wanted_names(log: &LogExpr) -> Vec<&str> {
    let attr_only = |n: &str| index_key(n).is_none() && !FIELDS.contains(&n);
    let mut out: Vec<&str> = log
        .selector
        .iter()
        .map(|m| m.name.as_str())
        .filter(|n| attr_only(n))
        .collect();
    for s in &log.stages {
        if let Stage::LabelFilter(LabelFilter::Str { name, .. }) = s
            && attr_only(name)
        {
            out.push(name);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether attribute `key` gives label `label` (its Loki name), without
/// allocating.
fn gives(key: &str, label: &str) -> bool {
    let mut k = key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' });
    let mut l = label.chars();
    if (key.is_empty() || key.starts_with(|c: char| c.is_ascii_digit())) && l.next() != Some('_') {
        return false;
    }
    k.by_ref().eq(l)
}

/// The scan matcher for `name op value`, when the scan can decide it: a
/// stream label's resource attribute, or the one attribute that gives
/// an attribute-only name (then only for a test that "" fails, as a
/// line without the attribute reads "").
fn push_matcher(name: &str, test: &CoreOp, names: &Names) -> Option<AttrMatcher> {
    if let Some(key) = index_key(name) {
        if name == "service_name" && test.matches(UNKNOWN_SERVICE) {
            return None;
        }
        return Some(AttrMatcher {
            scope: AttrScope::Resource,
            key: key.to_owned(),
            op: test.clone(),
        });
    }
    if FIELDS.contains(&name) || test.matches("") {
        return None;
    }
    match names.get(name).map(Vec::as_slice) {
        Some([(scope, key)]) => Some(AttrMatcher {
            scope: *scope,
            key: key.clone(),
            op: test.clone(),
        }),
        _ => None,
    }
}

impl Compiled {
    pub fn new(log: &LogExpr, names: &Names) -> Result<Compiled, QueryError> {
        let mut selector = Vec::with_capacity(log.selector.len());
        let mut matchers = Vec::new();
        for m in &log.selector {
            let test = str_test(m.op, &m.value)?;
            matchers.extend(push_matcher(&m.name, &test, names));
            selector.push((m.name.clone(), test));
        }
        let mut lines = Vec::new();
        let mut trace_id = None;
        // Stages before the first one that rewrites the line (line
        // filters) or the labels (label filters) see what is stored.
        let (mut line_same, mut labels_same) = (true, true);
        for s in &log.stages {
            match s {
                Stage::Line(f) if line_same => lines.extend(push_line(f.op, &f.values)?),
                Stage::LabelFilter(LabelFilter::Str {
                    name,
                    op: MatchOp::Eq,
                    value,
                }) if labels_same && name == "trace_id" => {
                    trace_id = crate::traces::parse_trace_id(value).ok();
                }
                Stage::LabelFilter(LabelFilter::Str { name, op, value }) if labels_same => {
                    matchers.extend(push_matcher(name, &str_test(*op, value)?, names));
                }
                Stage::Line(_) | Stage::LabelFilter(_) => {}
                Stage::LineFormat(_) | Stage::Decolorize | Stage::Unpack => {
                    line_same = false;
                    labels_same = false;
                }
                _ => labels_same = false,
            }
        }
        Ok(Compiled {
            matchers,
            lines,
            trace_id,
            selector,
            pipeline: Pipeline::compile(&log.stages)?,
        })
    }

    /// The entry of a stored row after the selector and the pipeline;
    /// None when it is filtered out.
    fn run(&self, row: &LogRow, ts: u64) -> Option<(Entry, Option<f64>)> {
        let mut e = entry(row, ts);
        if !self.selector.iter().all(|(n, t)| t.matches(e.get(n).unwrap_or(""))) {
            return None;
        }
        let mut v = None;
        self.pipeline.run(&mut e, &mut v).then_some((e, v))
    }
}

/// A line filter as scan filters (the alternatives of `or` as one
/// regex).
fn push_line(op: LineOp, values: &[LineValue]) -> Result<Vec<LineFilter>, QueryError> {
    let strs: Vec<&str> = values
        .iter()
        .filter_map(|v| match v {
            LineValue::Str(s) => Some(s.as_str()),
            LineValue::Ip(_) => None,
        })
        .collect();
    if strs.len() != values.len() {
        return Ok(Vec::new());
    }
    let re = |alts: Vec<String>| -> Result<regex::Regex, QueryError> {
        mira_core::scan::compile_regex(&alts.join("|"), false).map_err(|e| bad(format!("line filter: {e}")))
    };
    Ok(match (op, strs.as_slice()) {
        (LineOp::Contains, [one]) => vec![LineFilter::Contains((*one).to_owned())],
        (LineOp::NotContains, many) => many.iter().map(|s| LineFilter::NotContains((*s).to_owned())).collect(),
        (LineOp::Contains, many) => vec![LineFilter::Regex(re(many.iter().map(|s| regex::escape(s)).collect())?)],
        (LineOp::Re, many) => vec![LineFilter::Regex(re(many
            .iter()
            .map(|s| format!("(?:{s})"))
            .collect())?)],
        (LineOp::NotRe, many) => many
            .iter()
            .map(|s| re(vec![(*s).to_owned()]).map(LineFilter::NotRegex))
            .collect::<Result<_, _>>()?,
        (LineOp::Pattern | LineOp::NotPattern, _) => Vec::new(),
    })
}

/// The error Loki gives a metric query whose samples carry `__error__`.
fn pipeline_error(labels: &[(String, String)]) -> QueryError {
    let err = labels
        .iter()
        .find(|(k, _)| k == ERROR)
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    let shown: Vec<String> = labels
        .iter()
        .filter(|(k, _)| k != ERROR_DETAILS)
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    bad(format!(
        "pipeline error: '{err}' for series: '{{{}}}'. Use a label filter to intentionally skip this error. (e.g | __error__!=\"{err}\"). To skip all potential errors you can match empty errors.(e.g __error__=\"\")",
        shown.join(", ")
    ))
}

impl Querier {
    /// Evaluates a LogQL query.
    pub async fn logql(self: &Arc<Self>, q: LogqlQuery) -> Result<LogqlAnswer, QueryError> {
        let expr = parse_query(&q.query)?;
        if q.start > q.end {
            return Err(bad(format!(
                "the query time range is reversed: start {} is after end {}",
                q.start, q.end
            )));
        }
        match expr {
            Expr::Log(log) => {
                if q.instant {
                    return Err(bad(
                        "log queries are not supported as an instant query type, please change your query to a range query type"
                            .into(),
                    ));
                }
                self.logql_lines(&q, &log).await
            }
            Expr::Metric(m) => self.logql_metric(&q, &m).await,
        }
    }

    /// The attributes of the planned blocks that give the attribute-only
    /// label names the query matches on, by label name (see
    /// [`Resolutions`]).
    async fn attribute_names(
        &self,
        tenant: &str,
        candidates: &[Candidate],
        log: &LogExpr,
        stats: &Stats,
    ) -> Result<Names, QueryError> {
        let mut names = Names::new();
        for label in wanted_names(log) {
            let id = (tenant.to_owned(), label.to_owned());
            let mut r = self
                .resolutions
                .map
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&id)
                .cloned()
                .unwrap_or_default();
            let mut fresh = Vec::new();
            let mut recent = Vec::new();
            for c in candidates {
                match &c.src {
                    crate::plan::Src::Published { .. } if r.seen.contains(&c.id) => {}
                    crate::plan::Src::Published { .. } => fresh.push(c),
                    crate::plan::Src::Recent(_) => recent.push(c),
                }
            }
            let reads = fresh.iter().map(|c| self.block_sidecars(c, stats));
            for (c, sidecars) in fresh.iter().zip(futures::future::try_join_all(reads).await?) {
                add_keys(&mut r.keys, &sidecars, label);
                r.seen.insert(c.id);
            }
            // Recent blocks still grow: looked at every time, not kept.
            let mut keys = r.keys.clone();
            let reads = recent.iter().map(|c| self.block_sidecars(c, stats));
            for sidecars in futures::future::try_join_all(reads).await? {
                add_keys(&mut keys, &sidecars, label);
            }
            if !fresh.is_empty() {
                let mut map = self.resolutions.map.lock().unwrap_or_else(|e| e.into_inner());
                if map.len() >= RESOLUTIONS {
                    map.clear();
                }
                map.insert(id, r);
            }
            names.insert(label.to_owned(), keys);
        }
        Ok(names)
    }

    /// The Loki label names the attributes of the logs in `[start, end)`
    /// give: every attribute with a string value (or too many values to
    /// list), by its Loki name. An attribute with only other values may be
    /// a map, whose names are its flattened keys, so it is left to the
    /// names lines carry.
    pub async fn loki_attribute_names(
        self: &Arc<Self>,
        tenant: &str,
        start: u64,
        end: u64,
    ) -> Result<std::collections::BTreeSet<String>, QueryError> {
        self.check_range(start, end)?;
        let stats = Stats::default();
        let plan = self.plan(tenant, Signal::Logs, start, end, &stats).await?;
        let reads = plan.candidates.iter().map(|c| self.block_sidecars(c, &stats));
        let mut names = std::collections::BTreeSet::new();
        for sidecars in futures::future::try_join_all(reads).await? {
            for scope in [AttrScope::Resource, AttrScope::Record] {
                for key in sidecars.attrs.keys(scope) {
                    let listed = sidecars
                        .attrs
                        .entry(scope, key)
                        .is_some_and(|e| e.string_values().is_none_or(|v| !v.is_empty()));
                    if listed {
                        names.insert(label_name(key));
                    }
                }
            }
        }
        Ok(names)
    }

    /// A log query: the best `limit` lines after the pipeline.
    async fn logql_lines(self: &Arc<Self>, q: &LogqlQuery, log: &LogExpr) -> Result<LogqlAnswer, QueryError> {
        self.check_limit(q.limit)?;
        let stats = Stats::default();
        let (kept, gaps) = self
            .collect_lines(&q.tenant, log, q.start, q.end, q.limit, q.order, &stats)
            .await?;
        let entries = kept.len();
        Ok(Answer::new(
            LogqlData {
                result_type: "streams",
                result: LogqlResult::Streams(kept),
                entries,
                categorized: q.categorize,
            },
            gaps,
            &stats,
        ))
    }

    /// The newest `limit` entries of a log query in `[start, end)`.
    pub async fn logql_entries(
        self: &Arc<Self>,
        tenant: &str,
        query: &str,
        start: u64,
        end: u64,
        limit: usize,
    ) -> Result<Vec<Entry>, QueryError> {
        let Expr::Log(log) = parse_query(query)? else {
            return Err(bad(format!("{query:?} is not a log query")));
        };
        let stats = Stats::default();
        let (entries, _) = self
            .collect_lines(tenant, &log, start, end, limit.max(1), Order::NewestFirst, &stats)
            .await?;
        Ok(entries)
    }

    /// Pages through the scan until `limit` lines pass the pipeline.
    #[allow(clippy::too_many_arguments)]
    async fn collect_lines(
        self: &Arc<Self>,
        tenant: &str,
        log: &LogExpr,
        start: u64,
        end: u64,
        limit: usize,
        order: Order,
        stats: &Stats,
    ) -> Result<(Vec<Entry>, Gaps), QueryError> {
        // One plan for every page: the ingesters are asked for their
        // recent data once, and the blocks' attribute names come from it.
        self.check_range(start, end)?;
        let plan = self.plan(tenant, Signal::Logs, start, end, stats).await?;
        let names = self.attribute_names(tenant, &plan.candidates, log, stats).await?;
        let compiled = Arc::new(Compiled::new(log, &names)?);
        let gaps = plan.gaps;
        let mut kept: Vec<Entry> = Vec::new();
        let mut cursor: Option<LineKey> = None;
        // The first page is the limit; when the pipeline filters lines
        // out, each next page is four times larger (up to the largest
        // limit).
        let mut page = limit.min(self.config.max_limit);
        loop {
            let q = LogsQuery {
                tenant: tenant.to_owned(),
                start,
                end,
                matchers: compiled.matchers.clone(),
                lines: compiled.lines.clone(),
                min_severity: None,
                trace_id: compiled.trace_id,
                limit: page,
                order,
                cursor: cursor.take(),
            };
            let page_lines = self.logs_in(&plan.candidates, &q, stats).await?;
            let next = page_lines.cursor;
            let lines = page_lines.lines;
            let c = compiled.clone();
            let passed = self
                .on_pool(move || {
                    lines
                        .into_iter()
                        .filter_map(|l| {
                            let row = LogRow {
                                resource: l.resource,
                                resource_schema_url: String::new(),
                                scope: l.scope,
                                scope_schema_url: String::new(),
                                record: l.record,
                            };
                            c.run(&row, l.time_unix_nano).map(|(e, _)| e)
                        })
                        .collect::<Vec<_>>()
                })
                .await;
            kept.extend(passed);
            if kept.len() >= limit {
                kept.truncate(limit);
                break;
            }
            match next {
                Some(c) => cursor = Some(LineKey::decode(&c)?),
                None => break,
            }
            page = page.saturating_mul(4).min(self.config.max_limit);
        }
        Ok((kept, gaps))
    }

    /// A metric query.
    async fn logql_metric(self: &Arc<Self>, q: &LogqlQuery, m: &MetricExpr) -> Result<LogqlAnswer, QueryError> {
        let start_ms = (q.start / 1_000_000) as i64;
        let end_ms = (q.end / 1_000_000) as i64;
        let steps: Vec<i64> = if q.instant {
            vec![end_ms]
        } else {
            if q.step_ms <= 0 {
                return Err(bad("step must be positive".into()));
            }
            let n = (end_ms - start_ms) / q.step_ms + 1;
            if n > promql::MAX_STEPS {
                return Err(QueryError::TooBig(format!(
                    "the range holds {n} steps; the limit is {}: raise step or narrow the range",
                    promql::MAX_STEPS
                )));
            }
            (0..n).map(|i| start_ms + i * q.step_ms).collect()
        };
        let mut ranges = Vec::new();
        let text = render(m, &mut ranges)?;
        let stats = Stats::default();
        let mut gaps = Gaps::default();
        let mut series: promql::load::BlockSeries = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            let from = steps[0] as u64 * 1_000_000;
            let from = from.saturating_sub((r.range_ns + r.offset_ns).max(0) as u64);
            let to = (*steps.last().unwrap_or(&0) as u64 * 1_000_000).saturating_sub(r.offset_ns.max(0) as u64);
            self.check_range(from, to)?;
            let (samples, g) = self.logql_samples(&q.tenant, r, from, to, &stats).await?;
            if g.partial {
                gaps.partial = true;
            }
            gaps.warnings.extend(g.warnings);
            let name = format!("__logql_{i}__");
            let r = r.clone();
            let steps = steps.clone();
            let part = self.on_pool(move || range_series(&r, samples, &steps, &name)).await?;
            series.extend(part);
        }
        let expr = promql::parse(&text)
            .map_err(|e| QueryError::Internal(format!("LogQL as PromQL {text:?} did not parse: {e}")))?;
        let pq = PromQuery {
            tenant: q.tenant.clone(),
            query: text,
            start_ms,
            end_ms,
            step_ms: q.step_ms.max(1),
            instant: q.instant,
        };
        let settings = engine::Settings {
            // Each range aggregation has a sample at every step it has a
            // value for, and nothing between.
            lookback_ms: 1,
            start_ms,
            end_ms,
            max_samples: 5_000_000,
        };
        let data = self
            .on_pool(move || promql::evaluate(expr, series, settings, &pq))
            .await
            .map_err(|e| bad(e.0))?;
        let PromData { result_type, result } = data;
        Ok(Answer::new(
            LogqlData {
                result_type,
                result: LogqlResult::Samples(strip_names(result)),
                entries: 0,
                categorized: false,
            },
            gaps,
            &stats,
        ))
    }

    /// Every line of `r`'s window `(from, to]` that passes its pipeline,
    /// as (labels, time, value).
    async fn logql_samples(
        self: &Arc<Self>,
        tenant: &str,
        r: &RangeAgg,
        from: u64,
        to: u64,
        stats: &Stats,
    ) -> Result<(Vec<Sampled>, Gaps), QueryError> {
        let plan = self
            .plan(
                tenant,
                Signal::Logs,
                from.saturating_add(1),
                to.saturating_add(1),
                stats,
            )
            .await?;
        let names = self.attribute_names(tenant, &plan.candidates, &r.log, stats).await?;
        let compiled = Arc::new(Compiled::new(&r.log, &names)?);
        let unwrap = compiled.pipeline.unwraps();
        if needs_unwrap(r.op) && !unwrap {
            return Err(bad(format!("invalid aggregation {} without unwrap", range_name(r.op))));
        }
        if !needs_unwrap(r.op) && unwrap && r.op != RangeOp::Rate {
            return Err(bad(format!("invalid aggregation {} with unwrap", range_name(r.op))));
        }
        let predicate = Predicate {
            time: Some((from.saturating_add(1), to.saturating_add(1))),
            attrs: compiled.matchers.clone(),
            lines: compiled.lines.clone(),
            trace_id: compiled.trace_id,
            ..Default::default()
        };
        let op = r.op;
        let grouping = r.grouping.clone();
        let mut out: Vec<Sampled> = Vec::new();
        let mut waves = Waves::new(plan.candidates.len(), self.config.threads);
        while let Some(wave) = waves.next_wave() {
            let reads = plan.candidates[wave].iter().map(|c| {
                let compiled = compiled.clone();
                let predicate = predicate.clone();
                let grouping = grouping.clone();
                async move {
                    let req = ScanRequest {
                        predicate,
                        order: Order::Stored,
                        limit: None,
                    };
                    let Some(found) = self.scan_candidate(c, Signal::Logs, req, stats).await? else {
                        return Ok::<_, QueryError>(Vec::new());
                    };
                    if found.rows.is_empty() {
                        return Ok(Vec::new());
                    }
                    let tables = self.tables(c, table_names(Signal::Logs), stats).await?;
                    let id = c.id;
                    self.on_pool(move || {
                        let rows = log_rows(&tables, &found.rows)
                            .map_err(|e| QueryError::corrupt(&format!("block {id}"), e))?;
                        let cancel = crate::pool::current();
                        let mut got = Vec::new();
                        for (n, (row, &ts)) in rows.iter().zip(&found.times).enumerate() {
                            // The pipeline is the costly part: stop within
                            // 1,024 lines of the query being dropped.
                            if n % 1024 == 0 && cancel.is_set() {
                                return Err(QueryError::Cancelled);
                            }
                            let Some((e, v)) = compiled.run(row, ts) else { continue };
                            let value = match op {
                                RangeOp::BytesOverTime | RangeOp::BytesRate => e.line.len() as f64,
                                _ if unwrap => v.unwrap_or(0.0),
                                _ => 1.0,
                            };
                            let mut labels = e.sorted();
                            if let Some(g) = &grouping {
                                // `__error__` outlives the grouping (as in
                                // Loki), so the query still fails on it.
                                labels.retain(|(k, _)| k == ERROR || g.labels.contains(k) != g.without);
                            }
                            got.push(Sampled { labels, ts, value });
                        }
                        Ok(got)
                    })
                    .await
                }
            });
            for part in futures::future::try_join_all(reads).await? {
                out.extend(part);
            }
            if out.len() > MAX_LINES {
                return Err(QueryError::TooBig(format!(
                    "the query reads more than {MAX_LINES} lines; narrow the selector or the range"
                )));
            }
        }
        if let Some(s) = out.iter().find(|s| s.labels.iter().any(|(k, _)| k == ERROR)) {
            return Err(pipeline_error(&s.labels));
        }
        Ok((out, plan.gaps))
    }
}

/// A series' labels, sorted.
type SeriesLabels = Vec<(String, String)>;

/// One line as a sample.
#[derive(Debug)]
pub(crate) struct Sampled {
    labels: Vec<(String, String)>,
    ts: u64,
    value: f64,
}

fn needs_unwrap(op: RangeOp) -> bool {
    matches!(
        op,
        RangeOp::SumOverTime
            | RangeOp::AvgOverTime
            | RangeOp::MinOverTime
            | RangeOp::MaxOverTime
            | RangeOp::StddevOverTime
            | RangeOp::StdvarOverTime
            | RangeOp::QuantileOverTime
            | RangeOp::FirstOverTime
            | RangeOp::LastOverTime
            | RangeOp::RateCounter
    )
}

fn range_name(op: RangeOp) -> &'static str {
    match op {
        RangeOp::CountOverTime => "count_over_time",
        RangeOp::Rate => "rate",
        RangeOp::RateCounter => "rate_counter",
        RangeOp::BytesOverTime => "bytes_over_time",
        RangeOp::BytesRate => "bytes_rate",
        RangeOp::AbsentOverTime => "absent_over_time",
        RangeOp::SumOverTime => "sum_over_time",
        RangeOp::AvgOverTime => "avg_over_time",
        RangeOp::MinOverTime => "min_over_time",
        RangeOp::MaxOverTime => "max_over_time",
        RangeOp::StddevOverTime => "stddev_over_time",
        RangeOp::StdvarOverTime => "stdvar_over_time",
        RangeOp::QuantileOverTime => "quantile_over_time",
        RangeOp::FirstOverTime => "first_over_time",
        RangeOp::LastOverTime => "last_over_time",
    }
}

/// The series of one range aggregation at every step: labels with
/// `__name__` = `name`, a sample at each step whose window `(t - range,
/// t]` (shifted by the offset) holds a line.
fn range_series(
    r: &RangeAgg,
    samples: Vec<Sampled>,
    steps: &[i64],
    name: &str,
) -> Result<promql::load::BlockSeries, QueryError> {
    let mut by_series: HashMap<SeriesLabels, Vec<(u64, f64)>> = HashMap::new();
    for s in samples {
        by_series.entry(s.labels).or_default().push((s.ts, s.value));
        if by_series.len() > MAX_SERIES {
            return Err(QueryError::TooBig(format!(
                "{} gives more than {MAX_SERIES} series; aggregate with sum by (...)",
                range_name(r.op)
            )));
        }
    }
    let secs = r.range_ns as f64 / 1e9;
    let cancel = crate::pool::current();
    let mut out = promql::load::BlockSeries::new();
    for (mut labels, mut points) in by_series {
        points.sort_by_key(|p| p.0);
        let mut values = Vec::new();
        for (k, &t) in steps.iter().enumerate() {
            // A window is up to every sample of the series: check often.
            if k % 64 == 0 && cancel.is_set() {
                return Err(QueryError::Cancelled);
            }
            let hi_ns = (t as u64 * 1_000_000).saturating_sub(r.offset_ns.max(0) as u64);
            let lo_ns = hi_ns.saturating_sub(r.range_ns.max(0) as u64);
            let a = points.partition_point(|p| p.0 <= lo_ns);
            let b = points.partition_point(|p| p.0 <= hi_ns);
            if a >= b {
                continue;
            }
            let w: Vec<f64> = points[a..b].iter().map(|p| p.1).collect();
            let n = w.len() as f64;
            let sum: f64 = w.iter().sum();
            let v = match r.op {
                RangeOp::CountOverTime => n,
                RangeOp::Rate if r.log.stages.iter().any(|s| matches!(s, Stage::Unwrap(_))) => sum / secs,
                RangeOp::Rate => n / secs,
                RangeOp::BytesOverTime | RangeOp::SumOverTime => sum,
                RangeOp::BytesRate => sum / secs,
                RangeOp::AvgOverTime => sum / n,
                RangeOp::MinOverTime => w.iter().copied().fold(f64::INFINITY, f64::min),
                RangeOp::MaxOverTime => w.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                RangeOp::FirstOverTime => w[0],
                RangeOp::LastOverTime => w[w.len() - 1],
                RangeOp::StdvarOverTime | RangeOp::StddevOverTime => {
                    let mean = sum / n;
                    let var = w.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
                    if r.op == RangeOp::StdvarOverTime {
                        var
                    } else {
                        var.sqrt()
                    }
                }
                RangeOp::QuantileOverTime => engine::quantile(r.param.unwrap_or(f64::NAN), w),
                RangeOp::RateCounter | RangeOp::AbsentOverTime => {
                    return Err(bad(format!(
                        "{} is not supported by Mira's LogQL evaluator",
                        range_name(r.op)
                    )));
                }
            };
            values.push((t, v));
        }
        if values.is_empty() {
            continue;
        }
        labels.push((engine::NAME.to_owned(), name.to_owned()));
        labels.sort();
        // One sample per step, in step order.
        out.push(Arc::new(engine::Series {
            labels,
            samples: values,
        }));
    }
    Ok(out)
}

fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "Inf".into() } else { "-Inf".into() }
    } else {
        format!("{v:?}")
    }
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn labels_list(l: &[String]) -> String {
    l.join(", ")
}

/// Whether `op` over the series of `r` equals `r` over the lines grouped
/// as `op` groups: sums of additive aggregations, the largest of maxima,
/// the smallest of minima.
fn merges(op: VectorOp, r: &RangeAgg) -> bool {
    match op {
        VectorOp::Sum => matches!(
            r.op,
            RangeOp::CountOverTime | RangeOp::Rate | RangeOp::BytesOverTime | RangeOp::BytesRate | RangeOp::SumOverTime
        ),
        VectorOp::Max => r.op == RangeOp::MaxOverTime,
        VectorOp::Min => r.op == RangeOp::MinOverTime,
        _ => false,
    }
}

/// The metric expression as PromQL, each range aggregation a selector of
/// its own (`__logql_<i>__`, collected in `ranges`).
fn render(m: &MetricExpr, ranges: &mut Vec<RangeAgg>) -> Result<String, QueryError> {
    Ok(match m {
        MetricExpr::Range(r) => {
            if matches!(r.op, RangeOp::RateCounter | RangeOp::AbsentOverTime) {
                return Err(bad(format!(
                    "{} is not supported by Mira's LogQL evaluator",
                    range_name(r.op)
                )));
            }
            ranges.push(r.clone());
            format!("__logql_{}__", ranges.len() - 1)
        }
        MetricExpr::Vector(v) => {
            // `sum by (l) (count_over_time(...))` and the like: the range
            // aggregation may as well group its lines by `l` first (the
            // same sums; one series per group instead of one per label
            // set, which with per-line labels such as trace_id is one per
            // line).
            let inner = match &*v.inner {
                MetricExpr::Range(r) if r.grouping.is_none() && merges(v.op, r) => {
                    let mut r = r.clone();
                    r.grouping = Some(v.grouping.clone().unwrap_or(Grouping {
                        without: false,
                        labels: Vec::new(),
                    }));
                    render(&MetricExpr::Range(r), ranges)?
                }
                other => render(other, ranges)?,
            };
            let name = match v.op {
                VectorOp::Sum => "sum",
                VectorOp::Avg => "avg",
                VectorOp::Min => "min",
                VectorOp::Max => "max",
                VectorOp::Count => "count",
                VectorOp::Stddev => "stddev",
                VectorOp::Stdvar => "stdvar",
                // Mira's topk is exact; approx_topk answers the same.
                VectorOp::Topk | VectorOp::ApproxTopk => "topk",
                VectorOp::Bottomk => "bottomk",
                VectorOp::Sort => return Ok(format!("sort({inner})")),
                VectorOp::SortDesc => return Ok(format!("sort_desc({inner})")),
            };
            let grouping = match &v.grouping {
                None => String::new(),
                Some(g) => format!(
                    " {} ({})",
                    if g.without { "without" } else { "by" },
                    labels_list(&g.labels)
                ),
            };
            match v.param {
                Some(p) => format!("{name}{grouping} ({}, {inner})", num(p)),
                None => format!("{name}{grouping} ({inner})"),
            }
        }
        MetricExpr::Binary(b) => {
            let op = b.op.symbol();
            let mut mods = String::new();
            if b.return_bool {
                mods.push_str(" bool");
            }
            if let Some(vm) = &b.matching {
                mods.push_str(&format!(
                    " {} ({})",
                    if vm.on { "on" } else { "ignoring" },
                    labels_list(&vm.labels)
                ));
                if let Some(g) = &vm.group {
                    mods.push_str(&format!(
                        " {} ({})",
                        if g.left { "group_left" } else { "group_right" },
                        labels_list(&g.labels)
                    ));
                }
            }
            format!("({}) {op}{mods} ({})", render(&b.lhs, ranges)?, render(&b.rhs, ranges)?)
        }
        MetricExpr::Literal(v) => num(*v),
        MetricExpr::VectorOf(v) => format!("vector({})", num(*v)),
        MetricExpr::LabelReplace(l) => format!(
            "label_replace({}, {}, {}, {}, {})",
            render(&l.inner, ranges)?,
            quote(&l.dst),
            quote(&l.replacement),
            quote(&l.src),
            quote(&l.regex)
        ),
        MetricExpr::Paren(inner) => format!("({})", render(inner, ranges)?),
    })
}

/// Drops the placeholder `__name__` of a bare range aggregation's series.
fn strip_names(mut v: Value) -> Value {
    if let Value::Array(items) = &mut v {
        for it in items {
            if let Some(Value::Object(m)) = it.get_mut("metric") {
                m.remove(engine::NAME);
            }
        }
    }
    v
}

/// Streams in Loki's shape, entries in the order given: grouped by all
/// labels, or (categorized) by stream labels with the others in a third
/// element. Serialized straight from the entries (no JSON tree).
#[derive(Debug)]
pub struct Streams<'a> {
    entries: &'a [Entry],
    categorize: bool,
}

impl<'a> Streams<'a> {
    pub fn new(entries: &'a [Entry], categorize: bool) -> Streams<'a> {
        Streams { entries, categorize }
    }
}

/// Labels of one kind (or all), sorted, as a JSON object.
struct LabelMap<'a>(Vec<(&'a str, &'a str)>);

impl<'a> LabelMap<'a> {
    fn of(e: &'a Entry, cat: Option<Cat>) -> LabelMap<'a> {
        let mut v: Vec<(&str, &str)> = e
            .labels
            .iter()
            .filter(|l| cat.is_none_or(|c| l.cat == c))
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        v.sort_unstable();
        LabelMap(v)
    }
}

impl serde::Serialize for LabelMap<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// One value: `["<ns>", "<line>"]`, or with the categorized labels.
struct Row<'a>(&'a Entry, bool);

impl serde::Serialize for Row<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeTuple};
        let Row(e, categorize) = *self;
        let mut t = s.serialize_tuple(if categorize { 3 } else { 2 })?;
        t.serialize_element(&e.ts.to_string())?;
        t.serialize_element(&e.line)?;
        if categorize {
            struct Extra<'a>(&'a Entry);
            impl serde::Serialize for Extra<'_> {
                fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                    let meta = LabelMap::of(self.0, Some(Cat::Meta));
                    let parsed = LabelMap::of(self.0, Some(Cat::Parsed));
                    let mut m = s.serialize_map(None)?;
                    if !meta.0.is_empty() {
                        m.serialize_entry("structuredMetadata", &meta)?;
                    }
                    if !parsed.0.is_empty() {
                        m.serialize_entry("parsed", &parsed)?;
                    }
                    m.end()
                }
            }
            t.serialize_element(&Extra(e))?;
        }
        t.end()
    }
}

impl serde::Serialize for Streams<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        let cat = self.categorize.then_some(Cat::Stream);
        let mut keys: Vec<LabelMap<'_>> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let mut index: HashMap<Vec<(&str, &str)>, usize> = HashMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            let key = LabelMap::of(e, cat);
            match index.get(&key.0) {
                Some(&k) => members[k].push(i),
                None => {
                    index.insert(key.0.clone(), keys.len());
                    keys.push(key);
                    members.push(vec![i]);
                }
            }
        }
        struct Values<'a>(&'a [Entry], &'a [usize], bool);
        impl serde::Serialize for Values<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.1.iter().map(|&i| Row(&self.0[i], self.2)))
            }
        }
        let mut seq = s.serialize_seq(Some(keys.len()))?;
        for (key, rows) in keys.iter().zip(&members) {
            struct Stream<'a>(&'a LabelMap<'a>, Values<'a>);
            impl serde::Serialize for Stream<'_> {
                fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                    let mut m = s.serialize_map(Some(2))?;
                    m.serialize_entry("stream", self.0)?;
                    m.serialize_entry("values", &self.1)?;
                    m.end()
                }
            }
            seq.serialize_element(&Stream(key, Values(self.entries, rows, self.categorize)))?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logql::ast::{LogExpr, Matcher, VectorAgg};

    fn count(range_ns: i64) -> RangeAgg {
        RangeAgg {
            op: RangeOp::CountOverTime,
            param: None,
            log: LogExpr {
                selector: vec![Matcher {
                    name: "service_name".into(),
                    op: MatchOp::Eq,
                    value: "x".into(),
                }],
                stages: vec![],
            },
            range_ns,
            offset_ns: 0,
            grouping: None,
        }
    }

    #[test]
    fn renders_as_promql_with_placeholders() {
        let m = MetricExpr::Vector(VectorAgg {
            op: VectorOp::Topk,
            grouping: Some(Grouping {
                without: false,
                labels: vec!["level".into(), "detected_level".into()],
            }),
            param: Some(5.0),
            inner: Box::new(MetricExpr::Range(count(60_000_000_000))),
        });
        let mut ranges = Vec::new();
        let text = render(&m, &mut ranges).expect("render");
        assert_eq!(text, "topk by (level, detected_level) (5.0, __logql_0__)");
        assert_eq!(ranges.len(), 1);
        assert!(promql::parse(&text).is_ok());
        // topk needs every series: its range aggregation keeps all labels.
        assert_eq!(ranges[0].grouping, None);
        // A sum of counts groups the lines before counting them.
        let sum = |op: RangeOp| {
            let mut r = count(60_000_000_000);
            r.op = op;
            MetricExpr::Vector(VectorAgg {
                op: VectorOp::Sum,
                grouping: Some(Grouping {
                    without: false,
                    labels: vec!["detected_level".into()],
                }),
                param: None,
                inner: Box::new(MetricExpr::Range(r)),
            })
        };
        let mut ranges = Vec::new();
        render(&sum(RangeOp::CountOverTime), &mut ranges).expect("render");
        assert_eq!(
            ranges[0].grouping,
            Some(Grouping {
                without: false,
                labels: vec!["detected_level".into()]
            })
        );
        // A sum of averages does not.
        let mut ranges = Vec::new();
        render(&sum(RangeOp::AvgOverTime), &mut ranges).expect("render");
        assert_eq!(ranges[0].grouping, None);
    }

    #[test]
    fn attribute_keys_give_their_loki_names() {
        assert!(gives("http.method", "http_method"));
        assert!(gives("http_method", "http_method"));
        assert!(gives("9lives", "_9lives"));
        assert!(!gives("http.method", "http_methods"));
        assert!(!gives("http.methods", "http_method"));
        assert!(!gives("a-b", "a_c"));
        for key in ["service.name", "k8s.pod.name", "x/y-z", "7up", "é"] {
            assert!(gives(key, &label_name(key)), "{key}");
        }
    }

    #[test]
    fn windows_are_left_open_right_closed() {
        let s = |ts: u64| Sampled {
            labels: vec![("a".into(), "b".into())],
            ts,
            value: 1.0,
        };
        // Lines at 1s, 2s, 3s; range 2s; steps at 2s, 3s, 5s, 6s.
        let samples = vec![s(1_000_000_000), s(2_000_000_000), s(3_000_000_000)];
        let out =
            range_series(&count(2_000_000_000), samples, &[2000, 3000, 5000, 6000], "__logql_0__").expect("series");
        let series = out.into_iter().next().expect("one series");
        let (labels, points) = (&series.labels, &series.samples);
        assert!(labels.contains(&("__name__".to_owned(), "__logql_0__".to_owned())));
        // (0,2] holds 1s and 2s; (1,3] holds 2s and 3s; (3,5] none shown
        // as no point; (4,6] none.
        assert_eq!(points, &vec![(2000, 2.0), (3000, 2.0)]);
    }
}
