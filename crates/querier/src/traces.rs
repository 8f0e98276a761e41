//! Trace queries: a whole trace by id (blocks pruned by their trace-id
//! Bloom filter), and search returning trace summaries.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, Int32Array};
use mira_core::Signal;
use mira_core::convert::{spans_to_otlp_rows, table_names};
use mira_core::scan::{AttrMatcher, AttrScope, MatchOp, Order, Predicate, ScanRequest};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use serde::Serialize;

use crate::answer::{Answer, Gaps, u64_as_string};
use crate::plan::{Candidate, Waves, newest_settled};
use crate::stats::Stats;
use crate::{Querier, QueryError};

/// Parses a 32-hex-digit trace id.
pub fn parse_trace_id(s: &str) -> Result<[u8; 16], QueryError> {
    let bad = || {
        QueryError::BadRequest(format!(
            "trace id {:?} is not 32 hex digits",
            s.chars().take(64).collect::<String>()
        ))
    };
    if s.len() != 32 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// A whole trace.
#[derive(Debug, Serialize)]
pub struct Trace {
    /// The spans as an OTLP/JSON `ExportTraceServiceRequest` body.
    pub trace: ExportTraceServiceRequest,
    pub span_count: usize,
}

pub type TraceAnswer = Answer<Trace>;

/// Trace search parameters.
#[derive(Debug, Clone, Default)]
pub struct TraceSearch {
    pub tenant: String,
    pub start: u64,
    pub end: u64,
    /// `service.name` of the span's resource.
    pub service: Option<String>,
    pub span_name: Option<MatchOp>,
    /// OTLP status code: 0 unset, 1 ok, 2 error.
    pub status: Option<i32>,
    pub min_duration: Option<u64>,
    pub max_duration: Option<u64>,
    pub matchers: Vec<AttrMatcher>,
    pub limit: usize,
}

/// One trace found by search.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TraceSummary {
    pub trace_id: String,
    pub root_service_name: String,
    pub root_span_name: String,
    #[serde(serialize_with = "u64_as_string")]
    pub start_time_unix_nano: u64,
    #[serde(serialize_with = "u64_as_string")]
    pub duration_nano: u64,
    pub span_count: usize,
    /// Spans of the trace that matched the search.
    pub matched: usize,
}

/// The traces a search found.
#[derive(Debug, Serialize)]
pub struct TraceList {
    pub traces: Vec<TraceSummary>,
}

pub type SearchAnswer = Answer<TraceList>;

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

impl Querier {
    /// Every span of a trace in `[start, end)`.
    pub async fn trace(
        self: &Arc<Self>,
        tenant: &str,
        id: [u8; 16],
        start: u64,
        end: u64,
    ) -> Result<TraceAnswer, QueryError> {
        let stats = Stats::default();
        let (trace, gaps) = self.trace_spans(tenant, id, start, end, &stats).await?;
        let span_count = count_spans(&trace);
        if span_count == 0 {
            return Err(QueryError::NotFound(format!("trace {} not found", hex(&id))));
        }
        Ok(Answer::new(Trace { trace, span_count }, gaps, &stats))
    }

    pub(crate) async fn trace_spans(
        &self,
        tenant: &str,
        id: [u8; 16],
        start: u64,
        end: u64,
        stats: &Stats,
    ) -> Result<(ExportTraceServiceRequest, Gaps), QueryError> {
        self.check_range(start, end)?;
        let plan = self.plan(tenant, Signal::Traces, start, end, stats).await?;
        let trace = self.trace_in(&plan.candidates, id, stats).await?;
        Ok((trace, plan.gaps))
    }

    /// The spans of trace `id` in `candidates` (blocks pruned by their
    /// trace-id Bloom filters). Several traces read from one plan ask the
    /// ingesters for their recent data once.
    pub(crate) async fn trace_in(
        &self,
        candidates: &[Candidate],
        id: [u8; 16],
        stats: &Stats,
    ) -> Result<ExportTraceServiceRequest, QueryError> {
        let predicate = Predicate {
            trace_id: Some(id),
            ..Default::default()
        };
        let reads = candidates.iter().map(|c| self.spans_of(c, &predicate, stats));
        let mut out = ExportTraceServiceRequest::default();
        for part in futures::future::try_join_all(reads).await?.into_iter().flatten() {
            out.resource_spans.extend(part.resource_spans);
        }
        Ok(out)
    }

    /// The spans of one block matching `predicate`, as OTLP (None when
    /// pruned or none match).
    async fn spans_of(
        &self,
        c: &Candidate,
        predicate: &Predicate,
        stats: &Stats,
    ) -> Result<Option<ExportTraceServiceRequest>, QueryError> {
        let req = ScanRequest {
            predicate: predicate.clone(),
            order: Order::Stored,
            limit: None,
        };
        let Some(out) = self.scan_candidate(c, Signal::Traces, req, stats).await? else {
            return Ok(None);
        };
        if out.rows.is_empty() {
            return Ok(None);
        }
        let all = self.tables(c, table_names(Signal::Traces), stats).await?;
        let rows = out.rows;
        let id = c.id;
        let otlp = self
            .on_pool(move || spans_to_otlp_rows(&all, Some(&rows)))
            .await
            .map_err(|e| QueryError::corrupt(&format!("block {id}"), e))?;
        Ok(Some(otlp))
    }

    /// Traces with a span matching the search, newest first, summarized
    /// over their whole trace.
    pub async fn search_traces(self: &Arc<Self>, s: TraceSearch) -> Result<SearchAnswer, QueryError> {
        self.check_range(s.start, s.end)?;
        self.check_limit(s.limit)?;
        let stats = Stats::default();
        let mut plan = self.plan(&s.tenant, Signal::Traces, s.start, s.end, &stats).await?;
        plan.candidates
            .sort_by(|a, b| (b.max_time, &b.id).cmp(&(a.max_time, &a.id)));
        let mut attrs = s.matchers.clone();
        if let Some(service) = &s.service {
            attrs.push(AttrMatcher {
                scope: AttrScope::Resource,
                key: "service.name".into(),
                op: MatchOp::Eq(service.clone()),
            });
        }
        let predicate = Predicate {
            time: Some((s.start, s.end)),
            attrs,
            span_name: s.span_name.clone(),
            min_duration: s.min_duration,
            max_duration: s.max_duration,
            ..Default::default()
        };
        // trace id -> (newest matching span start, matched spans)
        let mut found: HashMap<[u8; 16], (u64, usize)> = HashMap::new();
        let mut waves = Waves::new(plan.candidates.len(), self.config.threads);
        while let Some(wave) = waves.next_wave() {
            let scans = plan.candidates[wave]
                .iter()
                .map(|c| self.matching_traces(c, &predicate, s.status, &stats));
            for part in futures::future::try_join_all(scans).await? {
                for (id, t) in part {
                    let e = found.entry(id).or_insert((0, 0));
                    e.0 = e.0.max(t);
                    e.1 += 1;
                }
            }
            // Blocks come newest first (by max time): once the `limit`
            // newest traces found are newer than anything the next block
            // can hold, the rest can only add older ones (a trace's spans
            // may still be in later blocks; the summary reads the whole
            // trace).
            let horizon = plan.candidates.get(waves.position()).map(|c| c.max_time);
            if newest_settled(found.values().map(|(t, _)| *t), s.limit, horizon) {
                break;
            }
        }
        let mut ids: Vec<([u8; 16], u64, usize)> = found.into_iter().map(|(id, (t, n))| (id, t, n)).collect();
        ids.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ids.truncate(s.limit);
        // The whole traces, within the search range widened by an hour
        // each side for spans that started earlier or later: one plan.
        let (wide, gaps) = self.wide_plan(&s.tenant, s.start, s.end, plan.gaps, &stats).await?;
        let summaries = ids.iter().map(|(id, _, matched)| {
            let (stats, wide) = (&stats, &wide);
            async move {
                let t = self.trace_in(wide, *id, stats).await?;
                Ok::<_, QueryError>(summarize(id, &t, *matched))
            }
        });
        let traces = futures::future::try_join_all(summaries).await?;
        Ok(Answer::new(TraceList { traces }, gaps, &stats))
    }

    /// The blocks whole traces of a search in `[start, end)` are read
    /// from: that window widened by [`TRACE_MARGIN_NS`] each side, with
    /// the search plan's gaps and its own merged.
    pub(crate) async fn wide_plan(
        &self,
        tenant: &str,
        start: u64,
        end: u64,
        mut gaps: Gaps,
        stats: &Stats,
    ) -> Result<(Vec<Candidate>, Gaps), QueryError> {
        let wide = self
            .plan(
                tenant,
                Signal::Traces,
                start.saturating_sub(TRACE_MARGIN_NS),
                end.saturating_add(TRACE_MARGIN_NS),
                stats,
            )
            .await?;
        gaps.partial |= wide.gaps.partial;
        for w in wide.gaps.warnings {
            if !gaps.warnings.contains(&w) {
                gaps.warnings.push(w);
            }
        }
        Ok((wide.candidates, gaps))
    }

    /// (trace id, span start) of the matching spans of one block.
    pub(crate) async fn matching_traces(
        &self,
        c: &Candidate,
        predicate: &Predicate,
        status: Option<i32>,
        stats: &Stats,
    ) -> Result<Vec<([u8; 16], u64)>, QueryError> {
        let req = ScanRequest {
            predicate: predicate.clone(),
            order: Order::NewestFirst,
            limit: None,
        };
        let Some(out) = self.scan_candidate(c, Signal::Traces, req, stats).await? else {
            return Ok(Vec::new());
        };
        let ids = out
            .batch
            .column_by_name("trace_id")
            .and_then(|a| a.as_any().downcast_ref::<arrow::array::FixedSizeBinaryArray>())
            .ok_or_else(|| QueryError::Corrupt {
                what: format!("block {}", c.id),
                detail: "spans without trace_id".to_owned(),
            })?;
        let codes = out
            .batch
            .column_by_name("status_code")
            .and_then(|a| a.as_any().downcast_ref::<Int32Array>());
        let mut res = Vec::new();
        for (i, &t) in out.times.iter().enumerate() {
            if let Some(want) = status {
                let code = codes.and_then(|c| c.is_valid(i).then(|| c.value(i))).unwrap_or(0);
                if code != want {
                    continue;
                }
            }
            if ids.is_valid(i) {
                let mut id = [0u8; 16];
                id.copy_from_slice(ids.value(i));
                res.push((id, t));
            }
        }
        Ok(res)
    }
}

/// How far before or after a search window a trace's other spans are
/// looked for (the longest trace searches see whole).
pub const TRACE_MARGIN_NS: u64 = 3_600_000_000_000;

fn count_spans(t: &ExportTraceServiceRequest) -> usize {
    t.resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len())
        .sum()
}

/// Root span (no parent; else the earliest), start, duration, count.
fn summarize(id: &[u8; 16], t: &ExportTraceServiceRequest, matched: usize) -> TraceSummary {
    let mut root: Option<(&str, &str, u64, bool)> = None;
    let (mut start, mut end) = (u64::MAX, 0u64);
    for rs in &t.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .and_then(|kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => Some(s.as_str()),
                _ => None,
            })
            .unwrap_or("");
        for span in rs.scope_spans.iter().flat_map(|s| &s.spans) {
            start = start.min(span.start_time_unix_nano);
            end = end.max(span.end_time_unix_nano);
            let is_root = span.parent_span_id.is_empty();
            let better = match root {
                None => true,
                Some((_, _, t, r)) => (is_root && !r) || (is_root == r && span.start_time_unix_nano < t),
            };
            if better {
                root = Some((service, span.name.as_str(), span.start_time_unix_nano, is_root));
            }
        }
    }
    let (service, name, _, _) = root.unwrap_or(("", "", 0, false));
    TraceSummary {
        trace_id: hex(id),
        root_service_name: service.to_owned(),
        root_span_name: name.to_owned(),
        start_time_unix_nano: if start == u64::MAX { 0 } else { start },
        duration_nano: end.saturating_sub(if start == u64::MAX { end } else { start }),
        span_count: count_spans(t),
        matched,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_are_32_hex_digits() {
        let id = parse_trace_id("0102030405060708090a0b0c0d0e0fFF").expect("id");
        assert_eq!(id[0], 1);
        assert_eq!(id[15], 0xff);
        for bad in [
            "",
            "01",
            "zz02030405060708090a0b0c0d0e0f10",
            "0102030405060708090a0b0c0d0e0f1011",
            "é102030405060708090a0b0c0d0e0f1",
        ] {
            assert!(parse_trace_id(bad).is_err(), "{bad}");
        }
    }
}
