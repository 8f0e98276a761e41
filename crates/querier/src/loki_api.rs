//! Loki's HTTP API under `/loki/api/v1/`, as Grafana's Loki data source
//! calls it: `query` and `query_range` (LogQL, [`crate::logql`]), `labels`,
//! `label/{name}/values`, `series`, `tail` (a WebSocket), `index/stats`,
//! `index/volume`, `index/volume_range`, `status/buildinfo`; the
//! `detected_*` and `patterns` paths answer 404, which makes Grafana fall
//! back to `labels` and data samples (a 200 of another shape would hide
//! every label). Times are Unix nanoseconds (or seconds, or RFC 3339);
//! steps are durations or seconds; the tenant is `X-Scope-OrgID`. Errors
//! are plain text with Loki's codes (400 for a bad query or a limit, 404,
//! 503, 500).

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use mira_core::Signal;
use mira_core::scan::Order;
use serde_json::{Value, json};

use crate::api::{P, tenant};
use crate::error::ServiceError;
use crate::logql::ast::Expr;
use crate::logql::eval::{LogqlData, LogqlQuery, LogqlResult, Streams, parse_query};
use crate::logql::model::{FIELDS, INDEX, index_key, label_name};
use crate::{Answer, Querier, QueryError};

/// Loki's default `limit` of `query` and `query_range`.
const DEFAULT_LIMIT: usize = 100;
/// The window of labels, values and series without `start` (Loki: 6h).
const META_WINDOW_NS: u64 = 6 * 3_600_000_000_000;
/// The window of a query without `start` (Loki: 1h).
const QUERY_WINDOW_NS: u64 = 3_600_000_000_000;
/// Lines read to find label names and values not in the attribute index
/// (severity, trace and span ids, `detected_level`) or of a selector.
const SAMPLE_LINES: usize = 2_000;
/// How often a tail looks for new lines, and how far back it looks.
const TAIL_EVERY: Duration = Duration::from_secs(1);
const TAIL_LOOKBACK_NS: u64 = 120_000_000_000;

/// The routes, to be merged into the querier's router.
pub fn router(q: Arc<Querier>) -> axum::Router {
    axum::Router::new()
        .route("/loki/api/v1/query", get(query))
        .route("/loki/api/v1/query_range", get(query_range))
        .route("/loki/api/v1/labels", get(labels))
        .route("/loki/api/v1/label", get(labels))
        .route("/loki/api/v1/label/{name}/values", get(label_values))
        .route("/loki/api/v1/series", get(series).post(series))
        .route("/loki/api/v1/index/stats", get(index_stats))
        .route("/loki/api/v1/index/volume", get(volume))
        .route("/loki/api/v1/index/volume_range", get(volume_range))
        .route("/loki/api/v1/status/buildinfo", get(buildinfo))
        .route("/prometheus/api/v1/rules", get(rules))
        .route("/loki/api/v1/{*rest}", get(not_found).post(not_found))
        .route_layer(axum::middleware::from_fn_with_state(
            q.clone(),
            crate::attempt::guard::<LokiError>,
        ))
        // A tail is a long-lived WebSocket: no query timeout, no replay.
        .route("/loki/api/v1/tail", get(tail))
        .with_state(q)
}

/// An error as Loki answers it: the status and a line of text.
#[derive(Debug)]
pub struct LokiError(Box<QueryError>);

impl From<QueryError> for LokiError {
    fn from(e: QueryError) -> Self {
        LokiError(Box::new(e))
    }
}

impl IntoResponse for LokiError {
    fn into_response(self) -> Response {
        let code = match self.0.error_code().http_status() {
            // Loki answers limits with 400 too.
            422 => 400,
            c => c,
        };
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, self.0.public_message()).into_response()
    }
}

type Result<T> = std::result::Result<T, LokiError>;

type Params = Query<Vec<(String, String)>>;

fn bad(msg: String) -> LokiError {
    QueryError::BadRequest(msg).into()
}

fn now(q: &Querier) -> u64 {
    u64::try_from(q.now_ns()).unwrap_or(0)
}

/// A time as Loki reads one: a decimal is Unix seconds; an integer of at
/// most 10 digits is seconds, a longer one nanoseconds; else RFC 3339.
fn time(p: &P, name: &str) -> Result<Option<u64>> {
    let Some(v) = p.one(name).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let bad_time = || bad(format!("{name}={v:?}: expected Unix nanoseconds, seconds or RFC 3339"));
    if v.contains('.')
        && let Ok(secs) = v.parse::<f64>()
    {
        if !secs.is_finite() || secs < 0.0 || secs > (u64::MAX / 1_000_000_000) as f64 {
            return Err(bad_time());
        }
        return Ok(Some((secs * 1e9).round() as u64));
    }
    if let Ok(n) = v.parse::<u64>() {
        return if v.len() <= 10 {
            n.checked_mul(1_000_000_000).map(Some).ok_or_else(bad_time)
        } else {
            Ok(Some(n))
        };
    }
    humantime::parse_rfc3339_weak(v)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| Some(d.as_nanos() as u64))
        .ok_or_else(bad_time)
}

/// `[start, end]` with Loki's defaults (`end` now, `start` `window`
/// before it).
fn window(q: &Querier, p: &P, window: u64) -> Result<(u64, u64)> {
    let end = time(p, "end")?.unwrap_or_else(|| now(q));
    let start = time(p, "start")?.unwrap_or(end.saturating_sub(crate::tenant_limits::cap_ns(window)));
    if start > end {
        return Err(bad(format!(
            "the query time range is reversed: start ({start}) is after end ({end})"
        )));
    }
    Ok((start, end))
}

fn limit(p: &P) -> Result<usize> {
    Ok(p.num::<usize>("limit")?.unwrap_or(DEFAULT_LIMIT))
}

fn order(p: &P) -> Result<Order> {
    match p.one("direction").unwrap_or("backward") {
        "backward" | "BACKWARD" | "" => Ok(Order::NewestFirst),
        "forward" | "FORWARD" => Ok(Order::OldestFirst),
        other => Err(bad(format!("direction={other:?}: expected forward or backward"))),
    }
}

fn categorize(h: &HeaderMap) -> bool {
    h.get_all("x-loki-response-encoding-flags")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|f| f.trim() == "categorize-labels"))
}

/// Loki's `stats.summary` (with Mira's own counters beside it).
fn stats_json(a: &Answer<LogqlData>) -> Value {
    let s = &a.stats;
    let secs = (s.elapsed_us as f64 / 1e6).max(1e-9);
    json!({
        "summary": {
            "bytesProcessedPerSecond": ((s.bytes_from_store + s.bytes_from_cache) as f64 / secs) as u64,
            "linesProcessedPerSecond": (s.rows_scanned as f64 / secs) as u64,
            "totalBytesProcessed": s.bytes_from_store + s.bytes_from_cache,
            "totalLinesProcessed": s.rows_scanned,
            "totalEntriesReturned": a.body.entries,
            "execTime": secs,
            "queueTime": 0,
        },
        "mira": s,
    })
}

/// `{"status":"success","data":{"resultType","result","stats"[,
/// "encodingFlags"]}[,"warnings"]}`, streams written straight from the
/// entries.
fn answer(a: Answer<LogqlData>) -> Response {
    #[derive(serde::Serialize)]
    struct Body<'a> {
        status: &'static str,
        data: Data<'a>,
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        warnings: &'a [String],
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Data<'a> {
        result_type: &'static str,
        result: ResultJson<'a>,
        stats: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        encoding_flags: Option<[&'static str; 1]>,
    }
    #[derive(serde::Serialize)]
    #[serde(untagged)]
    enum ResultJson<'a> {
        Streams(Streams<'a>),
        Samples(&'a Value),
    }
    let result = match &a.body.result {
        LogqlResult::Streams(entries) => ResultJson::Streams(Streams::new(entries, a.body.categorized)),
        LogqlResult::Samples(v) => ResultJson::Samples(v),
    };
    let body = Body {
        status: "success",
        data: Data {
            result_type: a.body.result_type,
            result,
            stats: stats_json(&a),
            encoding_flags: a.body.categorized.then_some(["categorize-labels"]),
        },
        warnings: &a.warnings,
    };
    axum::Json(body).into_response()
}

fn required<'a>(p: &'a P, name: &str) -> Result<&'a str> {
    p.one(name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| bad(format!("{name} is required")))
}

/// A step: a duration (`15000ms`, `1m`) or seconds; Loki's default makes
/// about 250 steps, at least one second.
fn step(p: &P, start: u64, end: u64) -> Result<i64> {
    match p.one("step").filter(|v| !v.is_empty()) {
        Some(v) => Ok(crate::api::parse_step(v)?),
        None => Ok((((end - start) / 250 / 1_000_000_000).max(1) * 1000) as i64),
    }
}

async fn query(State(q): State<Arc<Querier>>, headers: HeaderMap, Query(params): Params) -> Result<Response> {
    let p = P(params);
    let t = time(&p, "time")?.unwrap_or_else(|| now(&q));
    let a = q
        .logql(LogqlQuery {
            tenant: tenant(&headers)?,
            query: required(&p, "query")?.to_owned(),
            start: t,
            end: t,
            step_ms: 0,
            instant: true,
            limit: limit(&p)?,
            order: order(&p)?,
            categorize: categorize(&headers),
        })
        .await?;
    Ok(answer(a))
}

async fn query_range(State(q): State<Arc<Querier>>, headers: HeaderMap, Query(params): Params) -> Result<Response> {
    let p = P(params);
    let (start, end) = window(&q, &p, QUERY_WINDOW_NS)?;
    let a = q
        .logql(LogqlQuery {
            tenant: tenant(&headers)?,
            query: required(&p, "query")?.to_owned(),
            start,
            end,
            step_ms: step(&p, start, end)?,
            instant: false,
            limit: limit(&p)?,
            order: order(&p)?,
            categorize: categorize(&headers),
        })
        .await?;
    Ok(answer(a))
}

fn success(data: Value) -> Response {
    axum::Json(json!({"status": "success", "data": data})).into_response()
}

/// The entries of up to `n` newest lines of `selector` (all lines when
/// None) in `[start, end)`.
async fn sample(
    q: &Arc<Querier>,
    tenant: &str,
    selector: Option<&str>,
    start: u64,
    end: u64,
    n: usize,
) -> Result<Vec<crate::logql::model::Entry>> {
    // `logql_entries` refuses a metric query itself.
    let selector = selector.unwrap_or("{}");
    Ok(q.logql_entries(tenant, selector, start, end, n.min(q.config.max_limit))
        .await?)
}

/// Label names: the attribute names of the blocks in the window (as Loki
/// label names) and the names the newest lines carry; with `query`, the
/// names of that selector's lines.
async fn labels(State(q): State<Arc<Querier>>, headers: HeaderMap, Query(params): Params) -> Result<Response> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let (start, end) = window(&q, &p, META_WINDOW_NS)?;
    let selector = p.one("query").filter(|v| !v.is_empty());
    let mut names = BTreeSet::new();
    let lines = sample(&q, &tenant, selector, start, end, SAMPLE_LINES).await?;
    for e in &lines {
        names.extend(e.labels.iter().map(|l| l.name.clone()));
    }
    if selector.is_none() {
        names.extend(q.loki_attribute_names(&tenant, start, end).await?);
        if !names.is_empty() {
            names.insert("service_name".into());
            names.insert("detected_level".into());
        }
    }
    names.retain(|n| !n.starts_with("__"));
    Ok(success(json!(names)))
}

/// The values of a label in the window: from the attribute index for
/// the attributes that give the name, and from the newest lines (all of
/// a selector's, with `query`).
async fn label_values(
    State(q): State<Arc<Querier>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(params): Params,
) -> Result<Response> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let (start, end) = window(&q, &p, META_WINDOW_NS)?;
    let selector = p.one("query").filter(|v| !v.is_empty());
    let mut values = BTreeSet::new();
    for e in sample(&q, &tenant, selector, start, end, SAMPLE_LINES).await? {
        if let Some(v) = e.get(&name) {
            values.insert(v.to_owned());
        }
    }
    if selector.is_none() && !FIELDS.contains(&name.as_str()) {
        // Every attribute whose Loki name is `name`.
        let listed = q.labels(&tenant, Signal::Logs, start, end).await?;
        for native in listed.body.data {
            let key = native.strip_prefix("resource.").unwrap_or(&native);
            let is_resource = native.starts_with("resource.");
            let is_index = INDEX.iter().any(|(l, _)| *l == name);
            if label_name(key) != name || (is_index && !(is_resource && index_key(&name) == Some(key))) {
                continue;
            }
            let got = q.label_values(&tenant, Signal::Logs, &native, start, end).await?;
            values.extend(got.body.data);
        }
    }
    values.retain(|v| !v.is_empty());
    Ok(success(json!(values)))
}

/// The stream label sets of the lines of every `match[]` selector.
async fn series(State(q): State<Arc<Querier>>, headers: HeaderMap, Query(params): Params) -> Result<Response> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let (start, end) = window(&q, &p, META_WINDOW_NS)?;
    let matches: Vec<String> = p.all("match[]").chain(p.all("match")).map(str::to_owned).collect();
    if matches.is_empty() {
        return Err(bad("match[] is required".into()));
    }
    let mut sets = BTreeSet::new();
    for m in &matches {
        for e in sample(&q, &tenant, Some(m), start, end, q.config.max_limit).await? {
            sets.insert(e.of(crate::logql::model::Cat::Stream));
        }
    }
    let data: Vec<Value> = sets
        .iter()
        .map(|s| Value::Object(s.iter().map(|(k, v)| (k.clone(), json!(v))).collect()))
        .collect();
    Ok(success(json!(data)))
}

/// A metric query over one window ending at `end`, as Loki's volume and
/// stats endpoints compute them.
async fn over_window(q: &Arc<Querier>, tenant: &str, expr: String, end: u64) -> Result<Value> {
    let a = q
        .logql(LogqlQuery {
            tenant: tenant.to_owned(),
            query: expr,
            start: end,
            end,
            step_ms: 0,
            instant: true,
            limit: DEFAULT_LIMIT,
            order: Order::NewestFirst,
            categorize: false,
        })
        .await?;
    match a.body.result {
        LogqlResult::Samples(v) => Ok(v),
        LogqlResult::Streams(_) => Err(bad("a stats or volume query gave lines, not samples".into())),
    }
}

/// The log selector of a stats or volume request.
fn selector_param(p: &P) -> Result<String> {
    let s = required(p, "query")?;
    match parse_query(s)? {
        Expr::Log(_) => Ok(s.to_owned()),
        Expr::Metric(_) => Err(bad(format!("query={s:?}: expected a log selector"))),
    }
}

fn range_ms(start: u64, end: u64) -> u64 {
    ((end - start) / 1_000_000).max(1)
}

/// The value of one vector element (`{"metric":…,"value":[t,"v"]}`).
fn sample_value(s: &Value) -> f64 {
    s.get("value")
        .and_then(|v| v.get(1))
        .and_then(|v| v.as_str())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The value of a vector's first element (0 when empty).
fn first_value(v: &Value) -> f64 {
    v.get(0).map_or(0.0, sample_value)
}

/// `{"streams","chunks","entries","bytes"}` of a selector in the window
/// (chunks: the streams, as Mira has no chunks).
async fn index_stats(State(q): State<Arc<Querier>>, headers: HeaderMap, Query(params): Params) -> Result<Response> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let (start, end) = window(&q, &p, QUERY_WINDOW_NS)?;
    let sel = selector_param(&p)?;
    let r = range_ms(start, end);
    let by: Vec<&str> = INDEX.iter().map(|(l, _)| *l).collect();
    let entries = first_value(&over_window(&q, &tenant, format!("sum(count_over_time({sel} [{r}ms]))"), end).await?);
    let bytes = first_value(&over_window(&q, &tenant, format!("sum(bytes_over_time({sel} [{r}ms]))"), end).await?);
    let streams = first_value(
        &over_window(
            &q,
            &tenant,
            format!("count(sum by ({}) (count_over_time({sel} [{r}ms])))", by.join(", ")),
            end,
        )
        .await?,
    );
    Ok(axum::Json(json!({
        "streams": streams as u64,
        "chunks": streams as u64,
        "entries": entries as u64,
        "bytes": bytes as u64,
    }))
    .into_response())
}

/// The labels a volume groups by: `targetLabels`, else the selector's.
fn volume_by(p: &P, sel: &str) -> Result<Vec<String>> {
    if let Some(t) = p.one("targetLabels").filter(|v| !v.is_empty()) {
        return Ok(t
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect());
    }
    match parse_query(sel)? {
        Expr::Log(l) => Ok(l.selector.iter().map(|m| m.name.clone()).collect()),
        Expr::Metric(_) => Ok(Vec::new()),
    }
}

/// Bytes of lines by the selector's labels over the window, the largest
/// `limit` first.
async fn volume(State(q): State<Arc<Querier>>, headers: HeaderMap, Query(params): Params) -> Result<Response> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let (start, end) = window(&q, &p, QUERY_WINDOW_NS)?;
    let sel = selector_param(&p)?;
    let by = volume_by(&p, &sel)?;
    let expr = format!(
        "topk({}, sum by ({}) (bytes_over_time({sel} [{}ms])))",
        limit(&p)?,
        by.join(", "),
        range_ms(start, end)
    );
    let mut result = over_window(&q, &tenant, expr, end).await?;
    if let Value::Array(items) = &mut result {
        items.sort_by(|a, b| sample_value(b).total_cmp(&sample_value(a)));
    }
    Ok(success(json!({"resultType": "vector", "result": result})))
}

async fn volume_range(State(q): State<Arc<Querier>>, headers: HeaderMap, Query(params): Params) -> Result<Response> {
    let p = P(params);
    let tenant = tenant(&headers)?;
    let (start, end) = window(&q, &p, QUERY_WINDOW_NS)?;
    let sel = selector_param(&p)?;
    let by = volume_by(&p, &sel)?;
    let step_ms = step(&p, start, end)?;
    let expr = format!("sum by ({}) (bytes_over_time({sel} [{step_ms}ms]))", by.join(", "));
    let a = q
        .logql(LogqlQuery {
            tenant,
            query: expr,
            start,
            end,
            step_ms,
            instant: false,
            limit: DEFAULT_LIMIT,
            order: Order::NewestFirst,
            categorize: false,
        })
        .await?;
    Ok(answer(a))
}

async fn buildinfo() -> Response {
    axum::Json(crate::api::buildinfo("3.4.0")).into_response()
}

async fn rules() -> Response {
    success(json!({"groups": []}))
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
}

/// Live tail: the newest `limit` lines of the last hour (or since
/// `start`), then every new line once, each batch a text message
/// `{"streams": [...], "dropped_entries": null}`. A query that cannot run
/// closes the socket with 1008 and the reason.
///
/// A tail is a query for its whole life: it keeps the tenant's query slot
/// (`max_query_concurrency`), its `start` obeys the tenant's
/// `max_query_range`, it counts against `--max-tails` (over it: 429 before
/// the upgrade), each poll runs under `--query-timeout` on the scan pool
/// in the tenant's turn, and it is closed with 1000 and the reason after
/// `--tail-max-duration`, or `--tail-idle-timeout` without a line to send,
/// and with 1008 within a second of its credential no longer granting the
/// tenant (a token revoked at the tokens file's reload, or expired).
async fn tail(
    State(q): State<Arc<Querier>>,
    headers: HeaderMap,
    lease: Option<axum::Extension<crate::tenant_limits::Lease>>,
    recheck: Option<axum::Extension<crate::server::Recheck>>,
    Query(params): Params,
    ws: WebSocketUpgrade,
) -> Response {
    let Ok(permit) = q.tails.clone().try_acquire_owned() else {
        return LokiError::from(QueryError::Overloaded(format!(
            "the querier runs {} live tails, its limit (--max-tails); retry later",
            q.config.max_tails
        )))
        .into_response();
    };
    let p = P(params);
    let setup = (|| -> Result<Tail> {
        let tenant = tenant(&headers)?;
        let query = required(&p, "query")?.to_owned();
        match parse_query(&query)? {
            Expr::Log(_) => {}
            Expr::Metric(_) => return Err(bad("tail takes a log query, not a metric query".into())),
        }
        let now = now(&q);
        let start = time(&p, "start")?.unwrap_or_else(|| now.saturating_sub(QUERY_WINDOW_NS));
        crate::tenant_limits::check_range(Duration::from_nanos(now.saturating_sub(start)))
            .map_err(|r| LokiError::from(QueryError::from(r)))?;
        let limit = limit(&p)?;
        Ok(Tail {
            tenant,
            query,
            start,
            limit,
        })
    })();
    let hold = Held {
        _slot: lease.and_then(|l| l.0.take()),
        _permit: permit,
        recheck: recheck.map(|r| (r.0, headers.clone())),
    };
    ws.on_upgrade(move |socket| async move {
        match setup {
            Ok(t) => run_tail(q, socket, t, hold).await,
            Err(e) => close(socket, 1008, &e.0.public_message()).await,
        }
    })
}

/// What a tail asks for.
struct Tail {
    tenant: String,
    query: String,
    start: u64,
    limit: usize,
}

/// What a tail holds while it runs: the tenant's query slot, a place
/// under `--max-tails`, and the credential to check again.
struct Held {
    _slot: Option<mira_common::limits::QueryGuard>,
    _permit: tokio::sync::OwnedSemaphorePermit,
    recheck: Option<(crate::server::Recheck, HeaderMap)>,
}

async fn close(mut socket: WebSocket, code: u16, reason: &str) {
    // A close reason holds at most 123 bytes.
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let frame = CloseFrame {
        code,
        reason: reason[..end].to_owned().into(),
    };
    let _ = socket.send(Message::Close(Some(frame))).await;
}

type Seen = HashSet<(u64, String, Vec<(String, String)>)>;

async fn run_tail(q: Arc<Querier>, mut socket: WebSocket, t: Tail, held: Held) {
    let mut seen: Seen = HashSet::new();
    let mut from = t.start;
    let mut first = true;
    let started = tokio::time::Instant::now();
    let mut last_sent = started;
    let (max_duration, idle) = (q.config.tail_max_duration, q.config.tail_idle_timeout);
    loop {
        if let Some((r, headers)) = &held.recheck
            && let Err(why) = r.still_valid(headers)
        {
            return close(socket, 1008, &format!("the tail's credential no longer holds: {why}")).await;
        }
        if started.elapsed() >= max_duration {
            let reason = format!(
                "reached tail max duration limit of {} (--tail-max-duration)",
                humantime::format_duration(max_duration)
            );
            return close(socket, 1000, &reason).await;
        }
        if last_sent.elapsed() >= idle {
            let reason = format!(
                "no new line for {} (--tail-idle-timeout); closed",
                humantime::format_duration(idle)
            );
            return close(socket, 1000, &reason).await;
        }
        let end = now(&q).saturating_add(1);
        let n = if first { t.limit } else { q.config.max_limit };
        // Each poll is a query: the query timeout, the tenant's turn on
        // the scan pool, its work stopped when the timeout drops it.
        let poll = crate::pool::scope(
            &t.tenant,
            q.logql_entries(&t.tenant, &t.query, from, end, n.min(q.config.max_limit)),
        );
        let got = match tokio::time::timeout(q.config.query_timeout, poll).await {
            Ok(got) => got,
            Err(_) => Err(QueryError::Timeout {
                limit: q.config.query_timeout,
            }),
        };
        let mut entries = match got {
            Ok(e) => e,
            Err(e) => return close(socket, 1011, &e.public_message()).await,
        };
        entries.reverse();
        entries.retain(|e| seen.insert((e.ts, e.line.clone(), e.sorted())));
        if !entries.is_empty() {
            let msg = json!({
                "streams": Streams::new(&entries, false),
                "dropped_entries": null,
            });
            if socket.send(Message::Text(msg.to_string().into())).await.is_err() {
                return;
            }
            last_sent = tokio::time::Instant::now();
        }
        first = false;
        // Lines are looked for again for a while, as they may arrive
        // late; those already sent are remembered until they leave that
        // window.
        from = from.max(now(&q).saturating_sub(TAIL_LOOKBACK_NS));
        seen.retain(|(ts, _, _)| *ts >= from);
        tokio::select! {
            _ = tokio::time::sleep(TAIL_EVERY) => {}
            msg = socket.recv() => match msg {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> P {
        P(pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
    }

    #[test]
    fn times_are_read_as_loki_reads_them() {
        let t = |v: &str| time(&p(&[("time", v)]), "time").map_err(|e| e.0.to_string());
        // Grafana's health check sends 4 s as nanoseconds; ten digits are
        // seconds to Loki, so this is 4e9 seconds.
        assert_eq!(t("4000000000").ok(), Some(Some(4_000_000_000_000_000_000)));
        assert_eq!(t("1700000000123456789").ok(), Some(Some(1_700_000_000_123_456_789)));
        assert_eq!(t("17000000001").ok(), Some(Some(17_000_000_001)));
        assert_eq!(t("1700000000.5").ok(), Some(Some(1_700_000_000_500_000_000)));
        assert_eq!(t("2026-12-01T00:00:00Z").ok(), Some(Some(1_796_083_200_000_000_000)));
        assert_eq!(t("").ok(), Some(None));
        for bad in ["soon", "-1", "1e300.0", "99999999999999999999999"] {
            assert!(t(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn steps_default_to_about_250_and_directions_parse() {
        let hour = 3_600_000_000_000;
        assert_eq!(step(&p(&[]), 0, hour).ok(), Some(14_000));
        assert_eq!(step(&p(&[]), 0, 1_000_000_000).ok(), Some(1_000));
        assert_eq!(step(&p(&[("step", "15000ms")]), 0, hour).ok(), Some(15_000));
        assert_eq!(step(&p(&[("step", "30")]), 0, hour).ok(), Some(30_000));
        assert!(step(&p(&[("step", "-5")]), 0, hour).is_err());
        assert_eq!(order(&p(&[("direction", "forward")])).ok(), Some(Order::OldestFirst));
        assert_eq!(order(&p(&[])).ok(), Some(Order::NewestFirst));
        assert!(order(&p(&[("direction", "sideways")])).is_err());
    }
}
