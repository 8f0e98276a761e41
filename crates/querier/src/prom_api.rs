//! The Prometheus HTTP API under `/api/v1/`, as Grafana's Prometheus data
//! source and Prometheus' own clients (`promtool`, client_golang) call it:
//! `query`, `query_range`, `labels`, `label/{name}/values`, `series`,
//! `metadata`, `query_exemplars`, `status/buildinfo`, `rules`, `alerts`.
//! GET with query parameters and POST with a form-encoded body (both
//! merged, as Prometheus does); times are float seconds or RFC 3339, a
//! step is float seconds or a duration. Answers are Prometheus' envelope
//! (`status`, `data`, `warnings`) and errors its shape and types
//! (`bad_data` 400, `execution` 422, `not_found` 404, `unavailable` 503,
//! `internal` 500). The evaluation is the native API's ([`crate::promql`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::answer::Answer;
use crate::api::{last, parse_step, tenant};
use crate::error::ServiceError;
use crate::promql::{PromQuery, PromResult};
use crate::{Querier, QueryError};

/// The window of `labels`, `label/{name}/values` and `series` when the
/// request gives no `start`: the hour before `end` (as the native API).
const DEFAULT_WINDOW_MS: i64 = 3_600_000;
/// How far past now a labels or series window may reach (records are
/// accepted up to the ingester's `--max-future`, 10 minutes by default).
const FUTURE_MARGIN_MS: i64 = 3_600_000;
/// The window `metadata` reads: the last day.
const METADATA_WINDOW_MS: i64 = 86_400_000;
/// The largest form body (a query string is at most 64 KiB).
const MAX_FORM_BYTES: usize = 256 * 1024;

/// The routes, to be merged into the querier's router.
pub fn router(q: Arc<Querier>) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/query", get(query).post(query))
        .route("/api/v1/query_range", get(query_range).post(query_range))
        .route("/api/v1/labels", get(labels).post(labels))
        .route("/api/v1/label/{name}/values", get(label_values))
        .route("/api/v1/series", get(series).post(series))
        .route("/api/v1/metadata", get(metadata))
        .route("/api/v1/query_exemplars", get(exemplars).post(exemplars))
        .route("/api/v1/status/buildinfo", get(buildinfo))
        .route("/api/v1/rules", get(rules))
        .route("/api/v1/alerts", get(alerts))
        .route_layer(axum::middleware::from_fn_with_state(
            q.clone(),
            crate::attempt::guard::<PromError>,
        ))
        .with_state(q)
}

/// An error in Prometheus' shape: its `errorType` names and codes.
struct PromError(Box<QueryError>);

impl From<QueryError> for PromError {
    fn from(e: QueryError) -> Self {
        PromError(Box::new(e))
    }
}

impl IntoResponse for PromError {
    fn into_response(self) -> Response {
        let e = *self.0;
        let (status, kind) = match e.error_code().http_status() {
            400 => (StatusCode::BAD_REQUEST, "bad_data"),
            404 => (StatusCode::NOT_FOUND, "not_found"),
            422 => (StatusCode::UNPROCESSABLE_ENTITY, "execution"),
            429 => (StatusCode::TOO_MANY_REQUESTS, "too_many_requests"),
            503 => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            504 => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let body = json!({"status": "error", "errorType": kind, "error": e.public_message()});
        let mut r = (status, axum::Json(body)).into_response();
        if let Some(after) = e.retry_after() {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, after.as_secs().max(1).into());
        }
        r
    }
}

type Result<T> = std::result::Result<T, PromError>;

/// The parameters of a request: the URL's and, for a form POST, the
/// body's (Prometheus' `ParseForm`).
struct Form(Vec<(String, String)>);

impl<S: Send + Sync> FromRequest<S> for Form {
    type Rejection = PromError;

    async fn from_request(req: Request, state: &S) -> Result<Form> {
        let query = req.uri().query().map(str::to_owned);
        let headers = req.headers().clone();
        let body = Bytes::from_request(req, state)
            .await
            .map_err(|e| bad(format!("the request body: {e}")))?;
        Form::read(query, &headers, &body)
    }
}

impl Form {
    fn read(query: Option<String>, headers: &HeaderMap, body: &Bytes) -> Result<Form> {
        let mut pairs: Vec<(String, String)> = query
            .as_deref()
            .map(|q| url::form_urlencoded::parse(q.as_bytes()).into_owned().collect())
            .unwrap_or_default();
        if !body.is_empty() {
            let form = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
            if !form {
                return Err(bad("a request body must be application/x-www-form-urlencoded".into()));
            }
            if body.len() > MAX_FORM_BYTES {
                return Err(bad(format!(
                    "the form is {} bytes; the limit is {MAX_FORM_BYTES}",
                    body.len()
                )));
            }
            pairs.extend(url::form_urlencoded::parse(body).into_owned());
        }
        Ok(Form(pairs))
    }

    /// The last value of `name`.
    fn one(&self, name: &str) -> Option<&str> {
        last(&self.0, name)
    }

    fn required(&self, name: &str) -> Result<&str> {
        self.one(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| bad(format!("{name} is required")))
    }

    /// Every `match[]`.
    fn matches(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == "match[]")
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// `name` as Unix milliseconds.
    fn time(&self, name: &str) -> Result<Option<i64>> {
        self.one(name)
            .filter(|v| !v.is_empty())
            .map(|v| time_ms(name, v))
            .transpose()
    }

    /// `limit`: 0 or absent is no limit.
    fn limit(&self) -> Result<Option<usize>> {
        match self.one("limit").filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v
                .parse::<usize>()
                .map(|n| (n > 0).then_some(n))
                .map_err(|_| bad(format!("limit={v:?}: not a non-negative integer"))),
        }
    }

    /// `[start, end]` in ms of a labels or series request: `end` defaults
    /// to now, `start` to an hour before. Clients ask these over all time
    /// (promtool: a year either side of now), so the window is cut to what
    /// can hold data, an `end` at most an hour ahead of now, and to its
    /// newest `max_range`, or the tenant's `max_query_range` when narrower
    /// (as Mimir clamps label queries).
    fn window(&self, now_ms: i64, max_range: std::time::Duration) -> Result<(i64, i64)> {
        let end = self.time("end")?.unwrap_or(now_ms);
        let start = self.time("start")?.unwrap_or(end.saturating_sub(DEFAULT_WINDOW_MS));
        if start > end {
            return Err(bad(format!("end ({end} ms) is before start ({start} ms)")));
        }
        let end = end.min(now_ms.saturating_add(FUTURE_MARGIN_MS));
        let max = i64::try_from(crate::tenant_limits::window_cap(max_range).as_millis()).unwrap_or(i64::MAX);
        Ok((start.max(end.saturating_sub(max)).min(end), end))
    }
}

fn bad(msg: String) -> PromError {
    PromError(Box::new(QueryError::BadRequest(msg)))
}

/// The earliest and latest times as Prometheus' clients write them
/// (`MinTime`, `MaxTime` formatted): its `parseTime` takes them although
/// they are not RFC 3339 (five- and nine-digit years). A query refuses
/// them (outside the times it can read); a labels or series window is cut.
const PROM_MIN_TIME: (&str, i64) = ("-292273086-05-16T16:47:06Z", -9_223_309_901_257_974_000);
const PROM_MAX_TIME: (&str, i64) = ("292277025-08-18T07:12:54.999999999Z", 9_223_309_901_257_974_999);

/// A Prometheus time: float Unix seconds or RFC 3339, as milliseconds.
/// Infinite, NaN and |seconds| >= 1e13 are refused (Prometheus' own
/// conversion of those is undefined).
fn time_ms(name: &str, v: &str) -> std::result::Result<i64, PromError> {
    if let Some((_, ms)) = [PROM_MIN_TIME, PROM_MAX_TIME].into_iter().find(|(text, _)| *text == v) {
        return Ok(ms);
    }
    if let Ok(secs) = v.parse::<f64>() {
        if secs.is_finite() && secs.abs() < 1e13 {
            return Ok((secs * 1000.0).round() as i64);
        }
        return Err(bad(format!("{name}={v:?}: out of range")));
    }
    humantime::parse_rfc3339_weak(v)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .ok_or_else(|| bad(format!("{name}={v:?}: expected Unix seconds or RFC 3339")))
}

/// `{"status":"success","data":…}` with the warnings, if any.
fn success(data: Value, warnings: &[String]) -> Response {
    let mut body = json!({"status": "success", "data": data});
    if !warnings.is_empty() {
        body["warnings"] = json!(warnings);
    }
    axum::Json(body).into_response()
}

fn prom(answer: Answer<PromResult>) -> Response {
    let data = serde_json::to_value(&answer.body.data).unwrap_or(Value::Null);
    success(data, &answer.warnings)
}

async fn query(State(q): State<Arc<Querier>>, headers: HeaderMap, f: Form) -> Result<Response> {
    let t = f.time("time")?.unwrap_or(q.now_ns() / 1_000_000);
    let answer = q
        .promql(PromQuery {
            tenant: tenant(&headers)?,
            query: f.required("query")?.to_owned(),
            start_ms: t,
            end_ms: t,
            step_ms: 0,
            instant: true,
        })
        .await?;
    Ok(prom(answer))
}

async fn query_range(State(q): State<Arc<Querier>>, headers: HeaderMap, f: Form) -> Result<Response> {
    let start = time_ms("start", f.required("start")?)?;
    let end = time_ms("end", f.required("end")?)?;
    if end < start {
        return Err(bad("end timestamp must not be before start time".into()));
    }
    let step = parse_step(f.required("step")?)?;
    let answer = q
        .promql(PromQuery {
            tenant: tenant(&headers)?,
            query: f.required("query")?.to_owned(),
            start_ms: start,
            end_ms: end,
            step_ms: step,
            instant: false,
        })
        .await?;
    Ok(prom(answer))
}

/// Label names (`name` None) or the values of `name`, of the series that
/// match any `match[]` (every series without one).
async fn names_or_values(q: &Arc<Querier>, headers: &HeaderMap, f: &Form, name: Option<&str>) -> Result<Response> {
    let (start, end) = f.window(q.now_ns() / 1_000_000, q.config.max_range)?;
    let (series, gaps) = q.metric_series(&tenant(headers)?, &f.matches(), start, end).await?;
    let warnings = gaps.warnings;
    let mut out = std::collections::BTreeSet::new();
    for labels in &series {
        match name {
            None => out.extend(labels.iter().map(|(k, _)| k.as_str())),
            Some(n) => out.extend(labels.iter().filter(|(k, _)| k == n).map(|(_, v)| v.as_str())),
        }
    }
    let limit = f.limit()?.unwrap_or(usize::MAX);
    let data: Vec<&str> = out.into_iter().take(limit).collect();
    Ok(success(json!(data), &warnings))
}

async fn labels(State(q): State<Arc<Querier>>, headers: HeaderMap, f: Form) -> Result<Response> {
    names_or_values(&q, &headers, &f, None).await
}

async fn label_values(
    State(q): State<Arc<Querier>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    f: Form,
) -> Result<Response> {
    // Grafana 11+ escapes names that are not legacy-valid as `U__…`;
    // Mira's names are all legacy-valid, so such a name has no values.
    names_or_values(&q, &headers, &f, Some(&name)).await
}

async fn series(State(q): State<Arc<Querier>>, headers: HeaderMap, f: Form) -> Result<Response> {
    let matches = f.matches();
    if matches.is_empty() {
        return Err(bad("no match[] parameter provided".into()));
    }
    let (start, end) = f.window(q.now_ns() / 1_000_000, q.config.max_range)?;
    let (series, gaps) = q.metric_series(&tenant(&headers)?, &matches, start, end).await?;
    let mut warnings = gaps.warnings;
    let limit = f.limit()?.unwrap_or(usize::MAX);
    if series.len() > limit {
        warnings.push(format!("results truncated due to limit ({limit})"));
    }
    let data: Vec<Value> = series
        .iter()
        .take(limit)
        .map(|labels| Value::Object(labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect()))
        .collect();
    Ok(success(json!(data), &warnings))
}

/// Type and help of the metrics of the last day (`metric` to ask for
/// one, `limit` to cut the list), as Prometheus lists them (the unit is
/// in the name, so `unit` is empty).
async fn metadata(State(q): State<Arc<Querier>>, headers: HeaderMap, f: Form) -> Result<Response> {
    let end = u64::try_from(q.now_ns())
        .unwrap_or(0)
        .saturating_add(FUTURE_MARGIN_MS as u64 * 1_000_000);
    let range = (METADATA_WINDOW_MS as u64 * 1_000_000).min(crate::tenant_limits::cap_ns(
        u64::try_from(q.config.max_range.as_nanos()).unwrap_or(u64::MAX),
    ));
    let metric = f.one("metric").filter(|m| !m.is_empty());
    let (found, gaps) = q
        .metric_metadata(&tenant(&headers)?, metric, end.saturating_sub(range), end)
        .await?;
    let limit = f.limit()?.unwrap_or(usize::MAX);
    let data: serde_json::Map<String, Value> = found
        .into_iter()
        .take(limit)
        .map(|(name, v)| {
            let list = v
                .into_iter()
                .map(|(kind, help)| json!({"type": kind, "help": help, "unit": ""}))
                .collect();
            (name, Value::Array(list))
        })
        .collect();
    Ok(success(Value::Object(data), &gaps.warnings))
}

async fn exemplars() -> Response {
    success(json!([]), &[])
}

/// Prometheus' build info, without `features` (a non-empty `features`
/// makes Grafana assume a Mimir ruler).
async fn buildinfo() -> Response {
    success(crate::api::buildinfo("2.53.0"), &[])
}

async fn rules() -> Response {
    success(json!({"groups": []}), &[])
}

async fn alerts() -> Response {
    success(json!({"alerts": []}), &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_float_seconds_or_rfc3339() {
        assert_eq!(time_ms("time", "4").ok(), Some(4_000));
        assert_eq!(time_ms("time", "1700000000.5").ok(), Some(1_700_000_000_500));
        assert_eq!(time_ms("time", "2026-12-01T00:00:00Z").ok(), Some(1_796_083_200_000));
        assert_eq!(time_ms("start", PROM_MIN_TIME.0).ok(), Some(PROM_MIN_TIME.1));
        assert_eq!(time_ms("end", PROM_MAX_TIME.0).ok(), Some(PROM_MAX_TIME.1));
        for bad in [
            "",
            "soon",
            "NaN",
            "+Inf",
            "-Inf",
            "1e300",
            "-1e300",
            "2026-13-01T00:00:00Z",
        ] {
            assert!(time_ms("time", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_take_prometheus_types() {
        for (e, code, kind) in [
            (QueryError::BadRequest("x".into()), 400, "bad_data"),
            (QueryError::TooBig("x".into()), 422, "execution"),
            (QueryError::NotFound("x".into()), 404, "not_found"),
            (QueryError::Unavailable("x".into()), 503, "unavailable"),
            (
                QueryError::Timeout {
                    limit: std::time::Duration::from_secs(1),
                },
                504,
                "timeout",
            ),
            (QueryError::Internal("secret".into()), 500, "internal"),
        ] {
            let r = PromError::from(e).into_response();
            assert_eq!(r.status().as_u16(), code, "{kind}");
        }
    }
}
