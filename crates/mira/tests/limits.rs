//! Per-tenant limits (`--limits-file`, docs/security.md) against a real
//! `mira serve`: a tenant over its records rate is refused with 429 and
//! `Retry-After` on OTLP/HTTP and RESOURCE_EXHAUSTED with a
//! `google.rpc.RetryInfo` on OTLP/gRPC, naming its limit; nothing of a
//! refused request is readable afterwards and everything acknowledged is;
//! another tenant is not refused; points of new metric series past
//! `max_series` are refused through OTLP's partial success with exact
//! counts and only the admitted series are stored; a query over the tenant's
//! `max_query_range` is refused with 400 naming both ranges; a changed
//! file applies while running, a broken one keeps the last good limits
//! (and is counted); a bad file at start refuses to start naming the key.

#[path = "support/procs.rs"]
mod procs;

use std::time::Duration;

use mira_testkit::http::{self, wait_ready};
use mira_testkit::net::wait_for;
use mira_testkit::otlp::log_export;
use mira_testkit::recent_base_time as t0;
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use procs::{Procs, Role, bin};
use prost::Message;

const PB: (&str, &str) = ("content-type", "application/x-protobuf");

/// google.rpc.Status, Any, RetryInfo and Duration: what a client reads
/// from a gRPC status's details.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<PbDuration>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PbDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// An export of `n` log records with bodies `{prefix}-{i}`.
fn export(prefix: &str, n: u64) -> Vec<u8> {
    log_export(
        &[("service.name", "limits")],
        (0..n).map(|i| (i, format!("{prefix}-{i}"))),
    )
}

async fn post(addr: &str, tenant: &str, body: Vec<u8>) -> http::Response {
    http::post(addr, "/v1/logs", &[PB, ("X-Scope-OrgID", tenant)], body)
        .await
        .expect("an answer")
}

/// The log bodies of `tenant` the querier answers.
async fn bodies(addr: &str, tenant: &str) -> Option<Vec<String>> {
    let path = format!(
        "/api/mira/v1/logs?start={}&end={}&limit=5000",
        t0(),
        t0() + 3_600_000_000_000
    );
    let r = http::request("GET", addr, &path, &[("X-Scope-OrgID", tenant)], Vec::new()).await?;
    if r.status != 200 {
        return None;
    }
    let v = r.json();
    let mut out: Vec<String> = v["lines"]
        .as_array()?
        .iter()
        .filter_map(|l| l["record"]["body"]["stringValue"].as_str().map(str::to_owned))
        .collect();
    out.sort();
    Some(out)
}

/// A gauge `limits_gauge` with one point per `host` value.
async fn post_metrics(addr: &str, tenant: &str, hosts: &[&str]) -> http::Response {
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
    };
    let points = hosts
        .iter()
        .map(|h| NumberDataPoint {
            attributes: vec![KeyValue {
                key: "host".to_owned(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue((*h).to_owned())),
                }),
                ..KeyValue::default()
            }],
            time_unix_nano: t0() + 1_000_000_000,
            value: Some(number_data_point::Value::AsDouble(1.0)),
            ..NumberDataPoint::default()
        })
        .collect();
    let req = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "limits_gauge".to_owned(),
                    data: Some(metric::Data::Gauge(Gauge { data_points: points })),
                    ..Metric::default()
                }],
                ..ScopeMetrics::default()
            }],
            ..ResourceMetrics::default()
        }],
    };
    http::post(
        addr,
        "/v1/metrics",
        &[PB, ("X-Scope-OrgID", tenant)],
        req.encode_to_vec(),
    )
    .await
    .expect("an answer")
}

async fn metric(addr: &str, name: &str) -> u64 {
    let text = http::get(addr, "/metrics").await.map(|r| r.text()).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

const LIMITS: &str = r#"
[tenants.metered]
max_series = 3

[tenants.slow]
ingest_records_per_second = 1
ingest_records_burst = 100
max_query_range = "1h"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_limits_is_refused_naming_them_and_loses_nothing_acknowledged() {
    let mut p = Procs::new();
    let file = p.root.path().join("limits.toml");
    std::fs::write(&file, LIMITS).expect("test setup");
    let file_arg = file.display().to_string();
    let i = p.add(Role::Serve, &["--limits-file", &file_arg, "--reload-interval", "50ms"]);
    p.start(i);
    let (query, otlp, grpc) = (p[i].addr.clone(), p[i].http.clone(), p[i].grpc.clone());
    wait_ready(&query).await;

    // The whole burst in one request: acknowledged.
    let r = post(&otlp, "slow", export("kept", 100)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // 50 more need 50 s of refill at 1 record/s: refused, naming the limit.
    let r = post(&otlp, "slow", export("refused-http", 50)).await;
    assert_eq!(r.status, 429, "{}", r.text());
    let after: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=60).contains(&after), "Retry-After {after}");
    let text = r.text();
    assert!(
        text.contains("tenant slow") && text.contains("1 records/s (burst 100)"),
        "{text}"
    );
    // Another tenant is not limited.
    let r = post(&otlp, "fast", export("fast", 500)).await;
    assert_eq!(r.status, 200, "{}", r.text());

    // gRPC: RESOURCE_EXHAUSTED with a RetryInfo detail.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.expect("ready");
    let mut req = tonic::Request::new(bytes::Bytes::from(export("refused-grpc", 50)));
    req.metadata_mut()
        .insert("x-scope-orgid", "slow".parse().expect("ascii"));
    let status = client
        .unary(
            req,
            tonic::codegen::http::uri::PathAndQuery::from_static(mira_ingester::otlp::GRPC_LOGS),
            mira_ingester::otlp::RawCodec,
        )
        .await
        .expect_err("over the limit");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("1 records/s"), "{}", status.message());
    let details = RpcStatus::decode(status.details()).expect("google.rpc.Status");
    let retry = details
        .details
        .iter()
        .find(|a| a.type_url == "type.googleapis.com/google.rpc.RetryInfo")
        .expect("a RetryInfo detail");
    let delay = RetryInfo::decode(&retry.value[..])
        .expect("RetryInfo")
        .retry_delay
        .expect("retry_delay");
    assert!(delay.seconds >= 1, "{delay:?}");

    // Exactly the acknowledged rows are readable; none of the refused.
    let want: Vec<String> = {
        let mut w: Vec<String> = (0..100).map(|i| format!("kept-{i}")).collect();
        w.sort();
        w
    };
    let got = wait_for("the acknowledged rows of slow", Duration::from_secs(60), || async {
        bodies(&query, "slow").await.filter(|b| b.len() >= want.len())
    })
    .await;
    assert_eq!(got, want);
    let fast = wait_for("the rows of fast", Duration::from_secs(60), || async {
        bodies(&query, "fast").await.filter(|b| b.len() >= 500)
    })
    .await;
    assert_eq!(fast.len(), 500);

    // Query range: over slow's limit of 1h → 400 naming both; fast is not limited.
    let two_hours = format!(
        "/api/mira/v1/logs?start={}&end={}&limit=10",
        t0(),
        t0() + 7_200_000_000_000
    );
    let r = http::request("GET", &query, &two_hours, &[("X-Scope-OrgID", "slow")], Vec::new())
        .await
        .expect("answer");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("query length: 2h") && r.text().contains("limit: 1h"),
        "{}",
        r.text()
    );
    let r = http::request("GET", &query, &two_hours, &[("X-Scope-OrgID", "fast")], Vec::new())
        .await
        .expect("answer");
    assert_eq!(r.status, 200, "{}", r.text());
    // Without `start`, slow's window is clamped to its 1h, not refused
    // (Grafana's trace-by-id and label lookups send no range).
    for path in [
        "/api/mira/v1/logs?limit=10".to_owned(),
        "/loki/api/v1/labels".to_owned(),
        "/api/v1/labels".to_owned(),
        format!("/api/traces/{}", "ab".repeat(16)),
    ] {
        let r = http::request("GET", &query, &path, &[("X-Scope-OrgID", "slow")], Vec::new())
            .await
            .expect("answer");
        assert!(r.status == 200 || r.status == 404, "{path}: {} {}", r.status, r.text());
    }
    assert!(metric(&query, "mira_limits_refusals_total").await >= 3);

    // Series: points of new series past metered's 3 are refused through
    // a partial success, the rest acknowledged.
    let r = post_metrics(&otlp, "metered", &["a", "b", "c", "d", "e"]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let partial = ExportMetricsServiceResponse::decode(&r.body[..])
        .expect("response")
        .partial_success
        .expect("a partial success");
    assert_eq!(partial.rejected_data_points, 2);
    assert!(
        partial.error_message.contains("limit of 3 active series"),
        "{}",
        partial.error_message
    );
    // Known series pass, a new one still does not.
    let r = post_metrics(&otlp, "metered", &["c", "b", "f", "a"]).await;
    let partial = ExportMetricsServiceResponse::decode(&r.body[..])
        .expect("response")
        .partial_success
        .expect("a partial success");
    assert_eq!(partial.rejected_data_points, 1);
    // Another tenant has no series limit.
    let r = post_metrics(&otlp, "fast", &["a", "b", "c", "d", "e"]).await;
    let partial = ExportMetricsServiceResponse::decode(&r.body[..])
        .expect("response")
        .partial_success;
    assert!(
        partial.as_ref().is_none_or(|p| p.rejected_data_points == 0),
        "{partial:?}"
    );
    // Exactly the acknowledged points are readable: 3 + 3 for metered.
    let points = wait_for("metered's points", Duration::from_secs(60), || async {
        let path = format!(
            "/api/v1/query?query=count(limits_gauge)&time={}",
            t0() / 1_000_000_000 + 60
        );
        let r = http::request("GET", &query, &path, &[("X-Scope-OrgID", "metered")], Vec::new()).await?;
        let v = r.json();
        let n: u64 = v["data"]["result"][0]["value"][1].as_str()?.parse().ok()?;
        (n >= 3).then_some(n)
    })
    .await;
    assert_eq!(points, 3, "three series of metered are stored");

    // A changed file applies while running: slow unlimited.
    std::fs::write(&file, "[tenants.slow]\ningest_records_per_second = 0\n").expect("test setup");
    wait_for("the reloaded limits", Duration::from_secs(30), || async {
        (post(&otlp, "slow", export("after-reload", 50)).await.status == 200).then_some(())
    })
    .await;
    // A broken file keeps them, and is counted.
    std::fs::write(&file, "[tenants.slow]\ningest_records_per_secnd = 1\n").expect("test setup");
    wait_for("the reload error to be counted", Duration::from_secs(30), || async {
        (metric(&query, "mira_limits_reload_errors_total").await >= 1).then_some(())
    })
    .await;
    let r = post(&otlp, "slow", export("after-bad-reload", 50)).await;
    assert_eq!(r.status, 200, "the last good limits stay: {}", r.text());
    assert!(p.is_running(i), "the process keeps serving");
}

#[test]
fn a_bad_limits_file_refuses_to_start_naming_the_key() {
    let dir = tempfile::tempdir().expect("test setup");
    let file = dir.path().join("limits.toml");
    for (text, word) in [
        ("[defaults]\ningest_records_per_sec = 5\n", "ingest_records_per_sec"),
        ("[tenants.a]\ningest_bytes_burst = 5\n", "tenants.a.ingest_bytes_burst"),
    ] {
        std::fs::write(&file, text).expect("test setup");
        let out = std::process::Command::new(bin())
            .args([
                "querier",
                "--catalog",
                "127.0.0.1:1",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(dir.path())
            .arg("--limits-file")
            .arg(&file)
            .output()
            .expect("mira");
        assert!(!out.status.success(), "started with {text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(word) && err.contains("limits_file"), "{text}: {err}");
    }
}
