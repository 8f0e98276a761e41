//! The native HTTP API under `/api/mira/v1/` (documented in `docs/api.md`).
//! Query parameters may repeat (line filters); the tenant is the
//! `X-Scope-OrgID` header, `default` when absent.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use mira_core::scan::{LineFilter, MatchOp, Order, compile_regex};
use mira_core::{Signal, TenantId};

use crate::logs::{LineKey, LogsQuery};
use crate::promql::PromQuery;
use crate::traces::{TraceSearch, parse_trace_id};
use crate::{Querier, QueryError, selector};

type Params = Query<Vec<(String, String)>>;

/// Default window when `start` is absent: the hour before `end`.
const DEFAULT_WINDOW_NS: u64 = 3_600_000_000_000;
/// Default `limit` for logs and trace search.
const DEFAULT_LOG_LIMIT: usize = 100;
const DEFAULT_TRACE_LIMIT: usize = 20;

/// The routes, to be merged into a server's router.
pub fn router(q: Arc<Querier>) -> axum::Router {
    axum::Router::new()
        .route("/api/mira/v1/logs", get(logs))
        .route("/api/mira/v1/traces/search", get(search))
        .route("/api/mira/v1/traces/{id}", get(trace))
        .route("/api/mira/v1/metrics/query", get(metrics_query))
        .route("/api/mira/v1/metrics/query_range", get(metrics_query_range))
        .route("/api/mira/v1/labels", get(labels))
        .route("/api/mira/v1/label/{name}/values", get(label_values))
        .route_layer(axum::middleware::from_fn_with_state(
            q.clone(),
            crate::attempt::guard::<QueryError>,
        ))
        .with_state(q)
}

pub(crate) fn tenant(headers: &HeaderMap) -> Result<String, QueryError> {
    match headers.get("x-scope-orgid") {
        None => Ok(TenantId::default_tenant().as_str().to_owned()),
        Some(v) => {
            let v = v
                .to_str()
                .map_err(|_| QueryError::BadRequest("X-Scope-OrgID is not ASCII".into()))?;
            TenantId::new(v)
                .map(|t| t.as_str().to_owned())
                .map_err(|e| QueryError::BadRequest(format!("X-Scope-OrgID: {e}")))
        }
    }
}

/// The build info Prometheus, Loki and Tempo answer, claiming `version`
/// of the API they serve (Grafana reads only `version`).
pub(crate) fn buildinfo(version: &str) -> serde_json::Value {
    serde_json::json!({
        "version": version,
        "revision": concat!("mira-", env!("CARGO_PKG_VERSION")),
        "branch": "main",
        "buildUser": "mira",
        "buildDate": "",
        "goVersion": "none (Mira, Rust)",
    })
}

/// The last value of `name` in request parameters (every API's rule for a
/// repeated parameter that is not documented as repeatable).
pub(crate) fn last<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// Query parameters, with the last value of a repeated name winning
/// except where a parameter is documented as repeatable.
pub(crate) struct P(pub Vec<(String, String)>);

impl P {
    pub(crate) fn one(&self, name: &str) -> Option<&str> {
        last(&self.0, name)
    }

    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0.iter().filter(move |(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub(crate) fn num<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, QueryError> {
        self.one(name)
            .map(|v| v.parse().map_err(|_| bad_param(name, v, "not a valid number")))
            .transpose()
    }

    /// `start`/`end`: Unix nanoseconds (an integer of 13 or more digits) or
    /// seconds (an integer or decimal).
    pub(crate) fn time(&self, name: &str) -> Result<Option<u64>, QueryError> {
        self.one(name).map(|v| parse_time(name, v)).transpose()
    }

    /// `[start, end)` with defaults: `end` now, `start` `default_window`
    /// before it.
    pub(crate) fn range(&self, default_window: u64, now_ns: i64) -> Result<(u64, u64), QueryError> {
        let end = self.time("end")?.unwrap_or(now_ns.max(0) as u64);
        let start = self
            .time("start")?
            .unwrap_or(end.saturating_sub(crate::tenant_limits::cap_ns(default_window)));
        if start > end {
            return Err(QueryError::BadRequest(format!("start ({start}) is after end ({end})")));
        }
        Ok((start, end))
    }

    pub(crate) fn signal(&self) -> Result<Signal, QueryError> {
        let v = self.one("signal").unwrap_or("logs");
        v.parse()
            .map_err(|_| bad_param("signal", v, "expected logs, traces or metrics"))
    }
}

/// "name=\"value\": what was expected" (the value cut to 64 characters).
fn bad_param(name: &str, v: &str, expected: &str) -> QueryError {
    let v: String = v.chars().take(64).collect();
    QueryError::BadRequest(format!("{name}={v:?}: {expected}"))
}

/// Parses a time parameter (see [`P::time`]).
pub fn parse_time(name: &str, v: &str) -> Result<u64, QueryError> {
    let bad = || bad_param(name, v, "expected Unix nanoseconds or seconds");
    if v.len() >= 13 && v.bytes().all(|b| b.is_ascii_digit()) {
        return v.parse::<u64>().map_err(|_| bad());
    }
    let secs: f64 = v.parse().map_err(|_| bad())?;
    if !secs.is_finite() || secs < 0.0 || secs > (u64::MAX / 1_000_000_000) as f64 {
        return Err(bad());
    }
    Ok((secs * 1e9).round() as u64)
}

fn ok_json<T: serde::Serialize>(v: &T) -> Response {
    Json(v).into_response()
}

async fn logs(
    State(q): State<Arc<Querier>>,
    headers: HeaderMap,
    Query(params): Params,
) -> Result<Response, QueryError> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let (start, end) = p.range(DEFAULT_WINDOW_NS, q.now_ns())?;
    let matchers = selector::parse(p.one("selector").unwrap_or(""))?;
    let mut lines = Vec::new();
    for v in p.all("contains") {
        lines.push(LineFilter::Contains(v.to_owned()));
    }
    for v in p.all("not_contains") {
        lines.push(LineFilter::NotContains(v.to_owned()));
    }
    for v in p.all("regex") {
        lines.push(LineFilter::Regex(compile_regex(v, false)?));
    }
    for v in p.all("not_regex") {
        lines.push(LineFilter::NotRegex(compile_regex(v, false)?));
    }
    let order = match p.one("direction").unwrap_or("backward") {
        "backward" | "newest" => Order::NewestFirst,
        "forward" | "oldest" => Order::OldestFirst,
        other => {
            return Err(bad_param("direction", other, "expected backward or forward"));
        }
    };
    let cursor = p.one("cursor").map(|c| LineKey::decode_for(c, &tenant)).transpose()?;
    let answer = q
        .logs(LogsQuery {
            tenant,
            start,
            end,
            matchers,
            lines,
            min_severity: p.num("severity")?,
            trace_id: None,
            limit: p.num("limit")?.unwrap_or(DEFAULT_LOG_LIMIT),
            order,
            cursor,
        })
        .await?;
    Ok(ok_json(&answer))
}

async fn trace(
    State(q): State<Arc<Querier>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(params): Params,
) -> Result<Response, QueryError> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let id = parse_trace_id(&id)?;
    let (start, end) = p.range(q.config.max_range.as_nanos() as u64, q.now_ns())?;
    let answer = q.trace(&tenant, id, start, end).await?;
    Ok(match p.one("format") {
        Some("otlp") => ok_json(&answer.body.trace),
        None | Some("native") => ok_json(&answer),
        Some(other) => {
            return Err(bad_param("format", other, "expected native or otlp"));
        }
    })
}

/// Durations: an integer of nanoseconds, or a number with a unit
/// (`ns`, `us`, `ms`, `s`, `m`, `h`), e.g. `250ms`, `1.5s`.
pub fn parse_duration(name: &str, v: &str) -> Result<u64, QueryError> {
    let bad = || bad_param(name, v, "expected a duration such as 250ms");
    let split = v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let scale = match unit {
        "" | "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        _ => return Err(bad()),
    };
    let ns = n * scale;
    if !ns.is_finite() || ns < 0.0 || ns > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(ns.round() as u64)
}

async fn search(
    State(q): State<Arc<Querier>>,
    headers: HeaderMap,
    Query(params): Params,
) -> Result<Response, QueryError> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let (start, end) = p.range(DEFAULT_WINDOW_NS, q.now_ns())?;
    let status = match p.one("status") {
        None => None,
        Some("unset") => Some(0),
        Some("ok") => Some(1),
        Some("error") => Some(2),
        Some(other) => {
            return Err(bad_param("status", other, "expected unset, ok or error"));
        }
    };
    let span_name = match (p.one("name"), p.one("name_regex")) {
        (Some(n), _) => Some(MatchOp::Eq(n.to_owned())),
        (None, Some(re)) => Some(MatchOp::Re(compile_regex(re, true)?)),
        (None, None) => None,
    };
    let answer = q
        .search_traces(TraceSearch {
            tenant,
            start,
            end,
            service: p.one("service").map(str::to_owned),
            span_name,
            status,
            min_duration: p
                .one("min_duration")
                .map(|v| parse_duration("min_duration", v))
                .transpose()?,
            max_duration: p
                .one("max_duration")
                .map(|v| parse_duration("max_duration", v))
                .transpose()?,
            matchers: selector::parse(p.one("selector").unwrap_or(""))?,
            limit: p.num("limit")?.unwrap_or(DEFAULT_TRACE_LIMIT),
        })
        .await?;
    Ok(ok_json(&answer))
}

/// A Prometheus step: seconds (a number) or a duration such as `15s`.
pub fn parse_step(v: &str) -> Result<i64, QueryError> {
    let ns = match v.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs < 1e12 => (secs * 1e9) as u64,
        Ok(_) => {
            return Err(bad_param("step", v, "must be positive"));
        }
        Err(_) => parse_duration("step", v)?,
    };
    let ms = (ns / 1_000_000) as i64;
    if ms <= 0 {
        return Err(QueryError::BadRequest("step must be at least 1ms".into()));
    }
    Ok(ms)
}

fn ms(ns: u64) -> i64 {
    (ns / 1_000_000) as i64
}

fn required<'a>(p: &'a P, name: &str) -> Result<&'a str, QueryError> {
    p.one(name)
        .ok_or_else(|| QueryError::BadRequest(format!("{name} is required")))
}

async fn metrics_query(
    State(q): State<Arc<Querier>>,
    headers: HeaderMap,
    Query(params): Params,
) -> Result<Response, QueryError> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let query = required(&p, "query")?.to_owned();
    let t = ms(p.time("time")?.unwrap_or_else(|| q.now_ns().max(0) as u64));
    let answer = q
        .promql(PromQuery {
            tenant,
            query,
            start_ms: t,
            end_ms: t,
            step_ms: 0,
            instant: true,
        })
        .await?;
    Ok(ok_json(&answer))
}

async fn metrics_query_range(
    State(q): State<Arc<Querier>>,
    headers: HeaderMap,
    Query(params): Params,
) -> Result<Response, QueryError> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let query = required(&p, "query")?.to_owned();
    let start = parse_time("start", required(&p, "start")?)?;
    let end = parse_time("end", required(&p, "end")?)?;
    let step = parse_step(required(&p, "step")?)?;
    let answer = q
        .promql(PromQuery {
            tenant,
            query,
            start_ms: ms(start),
            end_ms: ms(end),
            step_ms: step,
            instant: false,
        })
        .await?;
    Ok(ok_json(&answer))
}

async fn labels(
    State(q): State<Arc<Querier>>,
    headers: HeaderMap,
    Query(params): Params,
) -> Result<Response, QueryError> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let (start, end) = p.range(DEFAULT_WINDOW_NS, q.now_ns())?;
    Ok(ok_json(&q.labels(&tenant, p.signal()?, start, end).await?))
}

async fn label_values(
    State(q): State<Arc<Querier>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Params,
) -> Result<Response, QueryError> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let (start, end) = p.range(DEFAULT_WINDOW_NS, q.now_ns())?;
    Ok(ok_json(&q.label_values(&tenant, p.signal()?, &name, start, end).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_parse_or_name_the_parameter() {
        assert_eq!(
            parse_time("start", "1700000000000000000").expect("ns"),
            1_700_000_000_000_000_000
        );
        assert_eq!(parse_time("start", "1700000000").expect("s"), 1_700_000_000_000_000_000);
        assert_eq!(parse_time("start", "1.5").expect("s"), 1_500_000_000);
        for bad in ["", "-1", "NaN", "inf", "1e300", "abc", "99999999999999999999999"] {
            let e = parse_time("start", bad).expect_err(bad).to_string();
            assert!(e.contains("start="), "{e}");
        }
        assert_eq!(parse_duration("d", "250ms").expect("ms"), 250_000_000);
        assert_eq!(parse_duration("d", "1.5s").expect("s"), 1_500_000_000);
        assert_eq!(parse_duration("d", "42").expect("ns"), 42);
        for bad in ["", "ms", "1x", "-1s", "1e400s"] {
            assert!(parse_duration("d", bad).is_err(), "{bad}");
        }
    }
}
