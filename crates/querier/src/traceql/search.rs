//! TraceQL search: which traces hold span sets the query keeps.
//!
//! The conditions every kept span must meet (the `&&` chain of a lone
//! spanset filter: `resource.service.name`, other `resource.`/`span.`
//! string equalities, `name`, `duration`, `status`) are pushed into the
//! span scan, so blocks are pruned by the same zone maps and attribute
//! index as the native search. The traces of the matching spans, newest
//! first, are then read whole (each through its Bloom filters) and the
//! query runs over each ([`super::eval`]) until `limit` traces match.

use std::sync::Arc;

use mira_core::scan::{AttrMatcher, AttrScope, MatchOp, Predicate};
use serde_json::{Value, json};

use super::ast::{Attribute, BinOp, CmpOp, FieldExpr, Intrinsic, Query, Scope, SpansetExpr, Static, Status};
use super::eval::{Compiled, TraceView, V, attr, hex, named_attributes};
use crate::answer::{Answer, Gaps};
use crate::plan::{Waves, newest_settled};
use crate::stats::Stats;
use crate::{Querier, QueryError};

/// Most traces one search reads whole before it answers with what it
/// found (and a warning).
pub const MAX_TRACES_READ: usize = 5_000;

/// A TraceQL search request, in Tempo's terms.
#[derive(Debug, Clone)]
pub struct TraceqlSearch {
    pub tenant: String,
    pub query: String,
    /// `[start, end)`, Unix nanoseconds.
    pub start: u64,
    pub end: u64,
    pub limit: usize,
    /// Spans per span set returned.
    pub spss: usize,
}

/// Tempo's search answer body (`traces`, `metrics`).
#[derive(Debug)]
pub struct TraceqlResult {
    pub traces: Vec<Value>,
    pub inspected_traces: usize,
}

pub type TraceqlAnswer = Answer<TraceqlResult>;

/// What a span must meet for the query to keep it, as scan filters.
#[derive(Debug, Default)]
struct Pushed {
    attrs: Vec<AttrMatcher>,
    span_name: Option<MatchOp>,
    min_duration: Option<u64>,
    max_duration: Option<u64>,
    status: Option<i32>,
}

fn conjuncts<'a>(f: &'a FieldExpr, out: &mut Vec<&'a FieldExpr>) {
    match f {
        FieldExpr::Binary {
            op: BinOp::And,
            lhs,
            rhs,
        } => {
            conjuncts(lhs, out);
            conjuncts(rhs, out);
        }
        other => out.push(other),
    }
}

/// Conditions every span of every kept span set meets: those of a lone
/// filter, or of the filter a pipeline starts with.
fn pushdown(q: &Query) -> Pushed {
    let filter = match &q.expr {
        SpansetExpr::Filter(f) => f,
        SpansetExpr::Pipeline(first, _) => match &**first {
            SpansetExpr::Filter(f) => f,
            _ => return Pushed::default(),
        },
        _ => return Pushed::default(),
    };
    let mut parts = Vec::new();
    conjuncts(filter, &mut parts);
    let mut p = Pushed::default();
    for c in parts {
        let FieldExpr::Binary { op, lhs, rhs } = c else {
            continue;
        };
        let (FieldExpr::Attr(a), FieldExpr::Static(v)) = (&**lhs, &**rhs) else {
            continue;
        };
        match (a, op, v) {
            (
                Attribute::Named {
                    scope,
                    name,
                    parent: false,
                },
                BinOp::Cmp(CmpOp::Eq),
                Static::Str(s),
            ) if matches!(scope, Scope::Resource | Scope::Span) => {
                p.attrs.push(AttrMatcher {
                    scope: if *scope == Scope::Resource {
                        AttrScope::Resource
                    } else {
                        AttrScope::Record
                    },
                    key: name.clone(),
                    op: MatchOp::Eq(s.clone()),
                });
            }
            (Attribute::Intrinsic(Intrinsic::Name), BinOp::Cmp(CmpOp::Eq), Static::Str(s)) => {
                p.span_name = Some(MatchOp::Eq(s.clone()));
            }
            (Attribute::Intrinsic(Intrinsic::Duration), BinOp::Cmp(op), Static::Duration(d)) => {
                let d = (*d).max(0) as u64;
                match op {
                    CmpOp::Gt => p.min_duration = Some(d.saturating_add(1)),
                    CmpOp::Ge => p.min_duration = Some(d),
                    CmpOp::Lt if d > 0 => p.max_duration = Some(d - 1),
                    CmpOp::Le => p.max_duration = Some(d),
                    _ => {}
                }
            }
            (Attribute::Intrinsic(Intrinsic::Status), BinOp::Cmp(CmpOp::Eq), Static::Status(s)) => {
                p.status = Some(match s {
                    Status::Unset => 0,
                    Status::Ok => 1,
                    Status::Error => 2,
                });
            }
            _ => {}
        }
    }
    p
}

/// Tempo's `traceID`: hex without leading zeros.
fn trace_id_text(id: &[u8]) -> String {
    let h = hex(id);
    let t = h.trim_start_matches('0');
    if t.is_empty() { "0".into() } else { t.to_owned() }
}

fn attr_key(a: &Attribute) -> Option<String> {
    match a {
        Attribute::Named { name, .. } => Some(name.clone()),
        // Name and duration are fields of the span already.
        Attribute::Intrinsic(Intrinsic::Name | Intrinsic::Duration) => None,
        // Trace-level values describe the trace, not the span (Tempo
        // leaves them out too).
        Attribute::Intrinsic(
            Intrinsic::TraceDuration | Intrinsic::RootName | Intrinsic::RootServiceName | Intrinsic::TraceId,
        ) => None,
        Attribute::Intrinsic(i) => Some(i.as_str().to_owned()),
    }
}

/// A trace's search entry in Tempo's exact JSON types.
fn trace_json(t: &TraceView<'_>, sets: &[Vec<usize>], named: &[Attribute], spss: usize) -> Value {
    let span_sets: Vec<Value> = sets
        .iter()
        .map(|set| {
            let mut ordered = set.clone();
            ordered.sort_by_key(|&i| std::cmp::Reverse(t.spans[i].span.start_time_unix_nano));
            let spans: Vec<Value> = ordered
                .iter()
                .take(spss)
                .map(|&i| {
                    let s = &t.spans[i];
                    let attributes: Vec<Value> = named
                        .iter()
                        .filter_map(|a| {
                            let key = attr_key(a)?;
                            match attr(a, t, i) {
                                V::Nil => None,
                                v => Some(json!({"key": key, "value": v.json()})),
                            }
                        })
                        .collect();
                    json!({
                        "spanID": hex(&s.span.span_id),
                        "name": s.span.name,
                        "startTimeUnixNano": s.span.start_time_unix_nano.to_string(),
                        "durationNanos": s.duration().max(0).to_string(),
                        "attributes": attributes,
                    })
                })
                .collect();
            json!({"spans": spans, "matched": set.len()})
        })
        .collect();
    let duration_ms = t.end.saturating_sub(t.start) / 1_000_000;
    let mut service_stats = serde_json::Map::new();
    for s in &t.spans {
        let e = service_stats
            .entry(s.service.to_owned())
            .or_insert_with(|| json!({"spanCount": 0, "errorCount": 0}));
        e["spanCount"] = json!(e["spanCount"].as_u64().unwrap_or(0) + 1);
        if s.span.status.as_ref().is_some_and(|st| st.code == 2) {
            e["errorCount"] = json!(e["errorCount"].as_u64().unwrap_or(0) + 1);
        }
    }
    let root_service = if t.root.is_some() {
        t.root_service().to_owned()
    } else {
        "<root span not yet received>".to_owned()
    };
    let mut out = json!({
        "traceID": trace_id_text(&t.trace_id),
        "rootServiceName": root_service,
        "rootTraceName": t.root_name(),
        "startTimeUnixNano": t.start.to_string(),
        "durationMs": u32::try_from(duration_ms).unwrap_or(u32::MAX),
        "spanSets": span_sets,
        "serviceStats": Value::Object(service_stats),
    });
    if let Some(first) = span_sets.first() {
        out["spanSet"] = first.clone();
    }
    out
}

impl Querier {
    /// A TraceQL search.
    pub async fn traceql_search(self: &Arc<Self>, s: TraceqlSearch) -> Result<TraceqlAnswer, QueryError> {
        let query = super::parse::parse(&s.query).map_err(|e| QueryError::BadRequest(e.to_string()))?;
        self.check_range(s.start, s.end)?;
        self.check_limit(s.limit)?;
        let pushed = pushdown(&query);
        let named = named_attributes(&query);
        let compiled = Arc::new(Compiled::new(query)?);
        let stats = Stats::default();
        // Tempo finds the traces that overlap the window: a kept span may
        // start before or after it. Candidate spans are looked for in the
        // window widened as whole traces are read, and a trace is kept
        // when it overlaps the window.
        let (wide, gaps) = self
            .wide_plan(&s.tenant, s.start, s.end, Gaps::default(), &stats)
            .await?;
        let mut candidates = wide.clone();
        candidates.sort_by(|a, b| (b.max_time, &b.id).cmp(&(a.max_time, &a.id)));
        let predicate = Predicate {
            attrs: pushed.attrs,
            span_name: pushed.span_name,
            min_duration: pushed.min_duration,
            max_duration: pushed.max_duration,
            ..Default::default()
        };
        // Trace ids by their newest matching span. Blocks are read newest
        // first, in waves; once the traces found (and not yet read) could
        // fill the limit, they are read whole, newest first, and the query
        // runs over each; older blocks (and traces) are read until the
        // `limit` newest answers are newer than anything left, so the
        // answer does not depend on how spans are split into blocks.
        let mut found: std::collections::HashMap<[u8; 16], u64> = std::collections::HashMap::new();
        let mut done: std::collections::HashSet<[u8; 16]> = std::collections::HashSet::new();
        let mut gaps = gaps;
        let wide = Arc::new(wide);
        // Answers by trace id; each ranks by its newest matching span in
        // `found` (a later block may still raise it).
        let mut traces: Vec<([u8; 16], Value)> = Vec::new();
        let mut waves = Waves::new(candidates.len(), self.config.threads);
        loop {
            let wave = waves.next_wave();
            if let Some(wave) = wave.clone() {
                let scans = candidates[wave]
                    .iter()
                    .map(|c| self.matching_traces(c, &predicate, pushed.status, &stats));
                for part in futures::future::try_join_all(scans).await? {
                    for (id, t) in part {
                        let e = found.entry(id).or_insert(0);
                        *e = (*e).max(t);
                    }
                }
            }
            let last = wave.is_none();
            let pending = found.len() - done.len();
            if last || traces.len() + pending >= s.limit {
                let mut ids: Vec<([u8; 16], u64)> = found
                    .iter()
                    .filter(|(id, _)| !done.contains(*id))
                    .map(|(id, t)| (*id, *t))
                    .collect();
                ids.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                for batch in ids.chunks(s.limit.max(8)) {
                    if done.len() >= MAX_TRACES_READ {
                        gaps.note(format!(
                            "more than {MAX_TRACES_READ} traces hold candidate spans; {MAX_TRACES_READ} were searched"
                        ));
                        break;
                    }
                    done.extend(batch.iter().map(|(id, _)| *id));
                    let reads = batch.iter().map(|(id, _)| {
                        let (stats, wide) = (&stats, &wide);
                        async move { self.trace_in(wide, *id, stats).await }
                    });
                    let whole = futures::future::try_join_all(reads).await?;
                    let ids: Vec<[u8; 16]> = batch.iter().map(|(id, _)| *id).collect();
                    let c = compiled.clone();
                    let named = named.clone();
                    let (spss, start, end) = (s.spss, s.start, s.end);
                    let max_spans = self.config.max_spans_per_trace;
                    let got: Vec<([u8; 16], Value)> = self
                        .on_pool(move || {
                            let cancel = crate::pool::current();
                            let mut got = Vec::new();
                            for (t, id) in whole.iter().zip(ids) {
                                if cancel.is_set() {
                                    return Err(QueryError::Cancelled);
                                }
                                let view = TraceView::new(t);
                                if view.spans.len() > max_spans {
                                    return Err(QueryError::TooBig(format!(
                                        "trace {} has {} spans, more than the {max_spans} a search evaluates per trace (--max-spans-per-trace); narrow the query to other traces or raise the limit",
                                        hex(&id),
                                        view.spans.len()
                                    )));
                                }
                                if view.spans.is_empty() || view.start >= end || view.end < start {
                                    continue;
                                }
                                let sets = c.run(&view);
                                if !sets.is_empty() {
                                    got.push((id, trace_json(&view, &sets, &named, spss)));
                                }
                            }
                            Ok(got)
                        })
                        .await?;
                    traces.extend(got);
                    if traces.len() >= s.limit {
                        break;
                    }
                }
            }
            let unread = found
                .iter()
                .filter(|(id, _)| !done.contains(*id))
                .map(|(_, t)| *t)
                .max();
            let next_block = candidates.get(waves.position()).map(|c| c.max_time);
            let horizon = unread.max(next_block);
            if (last && unread.is_none())
                || newest_settled(traces.iter().map(|(id, _)| found[id]), s.limit, horizon)
                || done.len() >= MAX_TRACES_READ
            {
                break;
            }
        }
        traces.sort_by(|a, b| found[&b.0].cmp(&found[&a.0]).then(a.0.cmp(&b.0)));
        traces.truncate(s.limit);
        let inspected = done.len();
        let traces: Vec<Value> = traces.into_iter().map(|(_, v)| v).collect();
        Ok(Answer::new(
            TraceqlResult {
                traces,
                inspected_traces: inspected,
            },
            gaps,
            &stats,
        ))
    }
}
