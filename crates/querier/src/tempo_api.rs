//! Tempo's HTTP API, the part Grafana's Tempo data source needs besides
//! TraceQL search: `/api/echo` (Save & test), trace by id
//! (`/api/v2/traces/{id}` as `tempopb.TraceByIDResponse`, `/api/traces/{id}`
//! as `tempopb.Trace`; protobuf, or JSON on `Accept: application/json`),
//! tag names and values (`/api/v2/search/tags`,
//! `/api/v2/search/tag/{tag}/values` and their v1 forms) and
//! `/api/status/buildinfo`. Times are Unix seconds; the tenant is
//! `X-Scope-OrgID`. Errors are plain text, as Tempo answers them.

use std::sync::Arc;

use axum::extract::{MatchedPath, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use mira_core::Signal;
use prost::Message;
use serde_json::{Value, json};

use crate::api::{last, tenant};
use crate::error::ServiceError;
use crate::traces::parse_trace_id;
use crate::{Querier, QueryError};

/// Tag values listed at most (Tempo's default `limit`).
const MAX_TAG_VALUES: usize = 5_000;
/// The intrinsics Grafana's builder offers.
const INTRINSICS: [&str; 8] = [
    "duration",
    "kind",
    "name",
    "status",
    "statusMessage",
    "traceDuration",
    "rootName",
    "rootServiceName",
];

/// The routes, to be merged into the querier's router.
pub fn router(q: Arc<Querier>) -> axum::Router {
    axum::Router::new()
        .route("/api/echo", get(|| async { "echo" }))
        .route("/api/status/buildinfo", get(buildinfo))
        .route("/api/v2/traces/{id}", get(trace))
        .route("/api/traces/{id}", get(trace))
        .route("/api/search", get(search))
        .route("/api/v2/search/tags", get(tags_v2))
        .route("/api/search/tags", get(tags_v1))
        .route("/api/v2/search/tag/{tag}/values", get(tag_values))
        .route("/api/search/tag/{tag}/values", get(tag_values))
        .route_layer(axum::middleware::from_fn_with_state(
            q.clone(),
            crate::attempt::guard::<TempoError>,
        ))
        .with_state(q)
}

/// An error as Tempo answers it: the status and a line of text.
struct TempoError(Box<QueryError>);

impl From<QueryError> for TempoError {
    fn from(e: QueryError) -> Self {
        TempoError(Box::new(e))
    }
}

impl IntoResponse for TempoError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.error_code().http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, self.0.public_message()).into_response()
    }
}

type Result<T> = std::result::Result<T, TempoError>;

type Params = Query<Vec<(String, String)>>;

/// `start`/`end` (Unix seconds) as `[start, end)` ns; without them, the
/// longest range a query may cover, ending now (Grafana sends none unless
/// the data source shifts time).
fn window(q: &Querier, p: &[(String, String)], default_ns: u64) -> Result<(u64, u64)> {
    let secs = |name: &str| -> Result<Option<u64>> {
        last(p, name)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse::<u64>()
                    .ok()
                    .and_then(|s| s.checked_mul(1_000_000_000))
                    .ok_or_else(|| {
                        TempoError::from(QueryError::BadRequest(format!("{name}={v:?}: expected Unix seconds")))
                    })
            })
            .transpose()
    };
    let now = u64::try_from(q.now_ns()).unwrap_or(0);
    let end = secs("end")?.map_or(now, |e| e.saturating_add(1_000_000_000));
    let start = secs("start")?.unwrap_or(end.saturating_sub(crate::tenant_limits::cap_ns(default_ns)));
    if start > end {
        return Err(QueryError::BadRequest(format!("start ({start}) is after end ({end})")).into());
    }
    Ok((start, end))
}

/// A trace id as Tempo takes it: hex of 1 to 32 digits, either case,
/// padded on the left with zeros.
fn trace_id(s: &str) -> std::result::Result<[u8; 16], QueryError> {
    let s = s.trim();
    if s.is_empty() || s.len() > 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(QueryError::BadRequest(format!(
            "trace id {:?} is not 1 to 32 hex digits",
            s.chars().take(64).collect::<String>()
        )));
    }
    parse_trace_id(&format!("{:0>32}", s.to_ascii_lowercase()))
}

fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"))
}

fn protobuf(bytes: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/protobuf")], bytes).into_response()
}

/// The spans of trace `id` as OTLP (`TracesData` and Tempo's `Trace` are
/// wire-identical to the export request's one field).
async fn spans(
    q: &Arc<Querier>,
    headers: &HeaderMap,
    id: &str,
    p: &[(String, String)],
) -> Result<opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest> {
    let tenant = tenant(headers)?;
    let id = trace_id(id)?;
    let range = u64::try_from(q.config.max_range.as_nanos()).unwrap_or(u64::MAX);
    let (start, end) = window(q, p, range)?;
    Ok(q.trace(&tenant, id, start, end).await?.body.trace)
}

/// `/api/v2/traces/{id}` (a `TraceByIDResponse`) and `/api/traces/{id}`
/// (a `Trace`), by the route matched.
async fn trace(
    State(q): State<Arc<Querier>>,
    route: MatchedPath,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(p): Params,
) -> Result<Response> {
    let v2 = route.as_str().starts_with("/api/v2/");
    let trace = spans(&q, &headers, &id, &p).await?;
    Ok(match (v2, wants_json(&headers)) {
        (true, true) => axum::Json(json!({"trace": trace})).into_response(),
        (false, true) => axum::Json(json!({"batches": trace.resource_spans})).into_response(),
        (false, false) => protobuf(trace.encode_to_vec()),
        (true, false) => {
            // TraceByIDResponse { Trace trace = 1; }: the trace as field 1.
            let inner = trace.encode_to_vec();
            let mut out = Vec::with_capacity(inner.len() + 6);
            prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut out);
            prost::encoding::encode_varint(inner.len() as u64, &mut out);
            out.extend_from_slice(&inner);
            protobuf(out)
        }
    })
}

/// TraceQL search (`q`, `limit` 20, `spss` 3, `start`, `end` in Unix
/// seconds; without a window, the last hour). No query is `{}`.
async fn search(State(q): State<Arc<Querier>>, headers: HeaderMap, Query(p): Params) -> Result<Response> {
    let num = |name: &str, default: usize| -> Result<usize> {
        match last(&p, name).filter(|v| !v.is_empty()) {
            None => Ok(default),
            Some(v) => v
                .parse::<usize>()
                .map_err(|_| QueryError::BadRequest(format!("{name}={v:?}: expected a positive integer")).into()),
        }
    };
    let (start, end) = window(&q, &p, 3_600_000_000_000)?;
    let query = last(&p, "q")
        .filter(|v| !v.trim().is_empty())
        .unwrap_or("{}")
        .to_owned();
    let a = q
        .traceql_search(crate::traceql::search::TraceqlSearch {
            tenant: tenant(&headers)?,
            query,
            start,
            end,
            limit: num("limit", 20)?.max(1),
            spss: num("spss", 3)?.max(1),
        })
        .await?;
    Ok(axum::Json(json!({
        "traces": a.body.traces,
        "metrics": {
            "inspectedTraces": a.body.inspected_traces,
            "inspectedBytes": (a.stats.bytes_from_store + a.stats.bytes_from_cache).to_string(),
            "totalBlocks": a.stats.blocks_considered,
            "completedJobs": 1,
            "totalJobs": 1,
        },
        "stats": a.stats,
    }))
    .into_response())
}

/// Attribute names of traces in the window, split by scope: Mira's
/// `resource.<key>` names are the resource scope, the rest span scope.
async fn scoped_tags(
    q: &Arc<Querier>,
    headers: &HeaderMap,
    p: &[(String, String)],
) -> Result<(Vec<String>, Vec<String>)> {
    let tenant = tenant(headers)?;
    let (start, end) = window(q, p, 3_600_000_000_000)?;
    let names = q.labels(&tenant, Signal::Traces, start, end).await?.body.data;
    let mut resource = Vec::new();
    let mut span = Vec::new();
    for n in names {
        match n.strip_prefix("resource.") {
            Some(r) => resource.push(r.to_owned()),
            None => span.push(n),
        }
    }
    Ok((resource, span))
}

async fn tags_v2(State(q): State<Arc<Querier>>, headers: HeaderMap, Query(p): Params) -> Result<Response> {
    let (resource, span) = scoped_tags(&q, &headers, &p).await?;
    let mut scopes = vec![
        json!({"name": "resource", "tags": resource}),
        json!({"name": "span", "tags": span}),
    ];
    scopes.push(json!({"name": "intrinsic", "tags": INTRINSICS}));
    if let Some(only) = last(&p, "scope").filter(|s| !s.is_empty() && *s != "all") {
        scopes.retain(|s| s["name"] == only);
    }
    Ok(axum::Json(json!({"scopes": scopes})).into_response())
}

async fn tags_v1(State(q): State<Arc<Querier>>, headers: HeaderMap, Query(p): Params) -> Result<Response> {
    let (mut resource, span) = scoped_tags(&q, &headers, &p).await?;
    resource.extend(span);
    resource.sort();
    resource.dedup();
    Ok(axum::Json(json!({"tagNames": resource})).into_response())
}

/// The values of a tag (`resource.x`, `span.x`, `.x`, bare `x`, or the
/// colon forms) from Mira's native label names (`resource.x`, `x`);
/// intrinsics with fixed values answer them.
async fn values(q: &Arc<Querier>, headers: &HeaderMap, tag: &str, p: &[(String, String)]) -> Result<Vec<Value>> {
    let tag = match tag {
        "span:name" | "trace:rootName" => "name".to_owned(),
        "trace:rootService" => "rootServiceName".to_owned(),
        other => other.replacen(':', ".", 1),
    };
    match tag.as_str() {
        // Span names (root names are among them).
        "name" | "intrinsic.name" | "rootName" | "intrinsic.rootName" => {
            let tenant = tenant(headers)?;
            let (start, end) = window(q, p, 3_600_000_000_000)?;
            let names = q
                .field_values(
                    &tenant,
                    Signal::Traces,
                    mira_core::sidecar::field::SPAN_NAME,
                    start,
                    end,
                )
                .await?;
            return Ok(names
                .body
                .data
                .into_iter()
                .filter(|v| !v.is_empty())
                .map(|v| json!({"type": "string", "value": v}))
                .collect());
        }
        "rootServiceName" | "intrinsic.rootServiceName" => {
            return Box::pin(values(q, headers, "resource.service.name", p)).await;
        }
        "status" | "intrinsic.status" => {
            return Ok(["error", "ok", "unset"]
                .map(|v| json!({"type": "keyword", "value": v}))
                .to_vec());
        }
        "kind" | "intrinsic.kind" => {
            return Ok(["unspecified", "internal", "server", "client", "producer", "consumer"]
                .map(|v| json!({"type": "keyword", "value": v}))
                .to_vec());
        }
        _ => {}
    }
    // `resource.x` and `span.x` are one scope each; `.x` and a bare `x`
    // (the v1 form) are any scope.
    let names = if let Some(r) = tag.strip_prefix("resource.") {
        vec![format!("resource.{r}")]
    } else if let Some(s) = tag.strip_prefix("span.") {
        vec![s.to_owned()]
    } else if INTRINSICS.contains(&tag.as_str()) || tag.starts_with("intrinsic.") {
        // Span names and the other intrinsics are not listed yet.
        return Ok(Vec::new());
    } else {
        let bare = tag.strip_prefix('.').unwrap_or(&tag);
        vec![format!("resource.{bare}"), bare.to_owned()]
    };
    let tenant = tenant(headers)?;
    let (start, end) = window(q, p, 3_600_000_000_000)?;
    let mut found = std::collections::BTreeSet::new();
    for name in &names {
        found.extend(
            q.label_values(&tenant, Signal::Traces, name, start, end)
                .await?
                .body
                .data,
        );
    }
    let limit = last(p, "limit")
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(MAX_TAG_VALUES)
        .min(MAX_TAG_VALUES);
    Ok(found
        .into_iter()
        .filter(|v| !v.is_empty())
        .take(limit)
        .map(|v| json!({"type": "string", "value": v}))
        .collect())
}

/// Tag values: typed (`{"type","value"}`) on v2, plain strings on v1.
async fn tag_values(
    State(q): State<Arc<Querier>>,
    route: MatchedPath,
    headers: HeaderMap,
    Path(tag): Path<String>,
    Query(p): Params,
) -> Result<Response> {
    let mut v = values(&q, &headers, &tag, &p).await?;
    if !route.as_str().starts_with("/api/v2/") {
        v = v.into_iter().map(|v| v["value"].clone()).collect();
    }
    Ok(axum::Json(json!({"tagValues": v})).into_response())
}

/// A Tempo version below 2.2: Grafana then keeps search and metrics
/// streaming (gRPC, which Mira does not serve) off.
async fn buildinfo() -> Response {
    axum::Json(crate::api::buildinfo("2.1.0")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_are_short_or_long_hex_of_either_case() {
        let full = trace_id("5B8EFFF798038103D269B633813FC60C").expect("upper");
        assert_eq!(full[0], 0x5b);
        assert_eq!(trace_id("  abc ").expect("short"), {
            let mut id = [0u8; 16];
            id[14] = 0x0a;
            id[15] = 0xbc;
            id
        });
        for bad in ["", "xyz", "5b8efff798038103d269b633813fc60c0", "12 34", "../etc"] {
            assert!(trace_id(bad).is_err(), "{bad}");
        }
    }
}
