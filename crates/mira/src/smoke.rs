//! `mira smoke`: an end-to-end check of a running Mira, what the Helm
//! chart's `helm test` hook runs. It sends one marked OTLP/HTTP export of
//! each signal (a log record, a span, a gauge point, all carrying a fresh
//! id) and polls the Loki, Tempo and Prometheus APIs until each is found.
//! Exit 0: all three came back; 1: something was not sent or not found
//! before `--timeout`, with a message naming the signal, the URL and the
//! last answer; 2: usage.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use mira_common::retry::Backoff;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span};
use prost::Message;

/// The `service.name` of everything smoke sends.
pub const SERVICE: &str = "mira-smoke";
/// The gauge smoke sends (`mira.smoke.check`, as Prometheus names it).
pub const METRIC: &str = "mira_smoke_check";

/// Flags of `mira smoke`.
#[derive(Debug, Args)]
pub struct SmokeArgs {
    /// OTLP/HTTP base URL of an ingester (or `mira serve`), e.g. http://mira-ingester:4318.
    #[arg(long, env = "MIRA_SMOKE_OTLP")]
    pub otlp: String,
    /// Query API base URL of a querier (or `mira serve`), e.g. http://mira-querier:3100.
    #[arg(long, env = "MIRA_SMOKE_QUERY")]
    pub query: String,
    /// Tenant (X-Scope-OrgID) to write and read as.
    #[arg(long, env = "MIRA_SMOKE_TENANT", default_value = "default")]
    pub tenant: String,
    /// How long to keep trying before failing.
    #[arg(long, env = "MIRA_SMOKE_TIMEOUT", default_value = "120s")]
    pub timeout: mira_common::config::Duration,
    /// A file holding the bearer token to send (a Mira with `--auth
    /// tokens`; the token needs the `write` and `read` scopes for
    /// `--tenant`). Surrounding whitespace is ignored.
    #[arg(long, env = "MIRA_SMOKE_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// CA (PEM) that signed the ports' certificates, for https:// URLs
    /// (otherwise the system's roots).
    #[arg(long, env = "MIRA_SMOKE_CA")]
    pub ca: Option<std::path::PathBuf>,
}

/// One check's result, for the report.
#[derive(Debug)]
struct Found {
    signal: &'static str,
    after: Duration,
}

/// A base URL: http(s), a host, no query; the trailing slash dropped.
fn base_url(flag: &str, s: &str) -> anyhow::Result<String> {
    let trimmed = s.trim().trim_end_matches('/');
    let rest = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"))
        .with_context(|| format!("--{flag} {s:?}: not an http:// or https:// URL"))?;
    if rest.is_empty() || rest.starts_with('/') || rest.contains(['?', '#', ' ']) || trimmed.len() > 2048 {
        anyhow::bail!("--{flag} {s:?}: expected a base URL such as http://host:port");
    }
    Ok(trimmed.to_owned())
}

/// The bearer token of `--token-file`: visible ASCII, one line.
fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    let meta = std::fs::metadata(path).with_context(|| format!("--token-file {}", path.display()))?;
    if meta.len() > 4096 {
        anyhow::bail!(
            "--token-file {}: {} bytes, more than a token (4096)",
            path.display(),
            meta.len()
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("--token-file {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        anyhow::bail!(
            "--token-file {}: expected one token of visible ASCII characters",
            path.display()
        );
    }
    Ok(token.to_owned())
}

/// The HTTP client: the `--ca` roots added when given.
fn http_client(args: &SmokeArgs) -> anyhow::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder().timeout(Duration::from_secs(30));
    if let Some(ca) = &args.ca {
        let pem = std::fs::read(ca).with_context(|| format!("--ca {}", ca.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| anyhow::anyhow!("--ca {}: not a PEM certificate bundle: {e}", ca.display()))?;
        if certs.is_empty() {
            anyhow::bail!("--ca {}: no certificate in the file", ca.display());
        }
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build().context("HTTP client")
}

/// Checks the flags (exit 2 on a bad one, before anything is sent).
fn validate(args: &SmokeArgs) -> anyhow::Result<(String, String)> {
    let otlp = base_url("otlp", &args.otlp)?;
    let query = base_url("query", &args.query)?;
    mira_core::ids::TenantId::new(&args.tenant)
        .map_err(|e| anyhow::anyhow!("--tenant {:?}: {e}", args.tenant.chars().take(64).collect::<String>()))?;
    if args.timeout.0.is_zero() {
        anyhow::bail!("--timeout must be above 0");
    }
    Ok((otlp, query))
}

/// The marked records: one export per signal.
struct Marked {
    id: String,
    trace_id: [u8; 16],
    logs: Vec<u8>,
    traces: Vec<u8>,
    metrics: Vec<u8>,
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.to_owned())),
        }),
        ..Default::default()
    }
}

fn marked(now_ns: i64) -> Marked {
    let ulid = mira_core::ids::BlockId::new();
    let id = ulid.to_string().to_ascii_lowercase();
    let bits: u128 = ulid.0.into();
    let trace_id = bits.to_be_bytes();
    let span_id = (bits as u64 | 1).to_be_bytes();
    let now = u64::try_from(now_ns).unwrap_or(0);
    let resource = Some(Resource {
        attributes: vec![kv("service.name", SERVICE), kv("smoke.id", &id)],
        ..Default::default()
    });
    let logs = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: resource.clone(),
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord {
                    time_unix_nano: now,
                    observed_time_unix_nano: now,
                    severity_number: 9,
                    severity_text: "INFO".to_owned(),
                    body: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(format!("mira smoke {id}"))),
                    }),
                    trace_id: trace_id.to_vec(),
                    span_id: span_id.to_vec(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let traces = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: resource.clone(),
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id: trace_id.to_vec(),
                    span_id: span_id.to_vec(),
                    name: format!("mira-smoke-{id}"),
                    kind: span::SpanKind::Internal as i32,
                    start_time_unix_nano: now.saturating_sub(1_000_000),
                    end_time_unix_nano: now,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let metrics = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource,
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "mira.smoke.check".to_owned(),
                    description: "mira smoke's marked point".to_owned(),
                    data: Some(metric::Data::Gauge(Gauge {
                        data_points: vec![NumberDataPoint {
                            attributes: vec![kv("smoke.id", &id)],
                            time_unix_nano: now,
                            value: Some(number_data_point::Value::AsDouble(1.0)),
                            ..Default::default()
                        }],
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    Marked {
        id,
        trace_id,
        logs: logs.encode_to_vec(),
        traces: traces.encode_to_vec(),
        metrics: metrics.encode_to_vec(),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The first 300 characters of a body, on one line.
fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .chars()
        .take(300)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

struct Smoke {
    http: reqwest::Client,
    tenant: String,
    /// `Authorization: Bearer …`, when `--token-file` is given.
    auth: Option<String>,
    deadline: Instant,
    started: Instant,
}

impl Smoke {
    /// A request with the tenant and the credential.
    fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, url).header("x-scope-orgid", &self.tenant);
        match &self.auth {
            Some(a) => r.header("authorization", a),
            None => r,
        }
    }

    /// POSTs one export, retrying (with the one backoff) while the
    /// ingester is unreachable or answers 429/5xx; a 4xx other than 429
    /// fails at once (the export itself is wrong).
    async fn export(&self, url: &str, body: &[u8]) -> anyhow::Result<()> {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        loop {
            let sent = self
                .request(reqwest::Method::POST, url)
                .header("content-type", "application/x-protobuf")
                .body(body.to_vec())
                .send()
                .await;
            let last = match sent {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => {
                    let status = r.status();
                    let body = r.bytes().await.unwrap_or_default();
                    if status.is_client_error() && status.as_u16() != 429 {
                        anyhow::bail!("export to {url} refused: HTTP {status}: {}", excerpt(&body));
                    }
                    format!("HTTP {status}: {}", excerpt(&body))
                }
                Err(e) => format!("{:#}", anyhow::Error::from(e)),
            };
            if Instant::now() >= self.deadline {
                anyhow::bail!("export to {url} did not succeed before the timeout; last answer: {last}");
            }
            eprintln!("smoke: export to {url} not accepted yet ({last}); retrying");
            tokio::time::sleep(backoff.next_delay().min(self.deadline - Instant::now())).await;
        }
    }

    /// GETs `url` until `found` says the answer holds the marked record.
    async fn poll(
        &self,
        signal: &'static str,
        url: &str,
        accept: &str,
        found: impl Fn(&[u8]) -> bool,
    ) -> anyhow::Result<Found> {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        loop {
            let last = match self
                .request(reqwest::Method::GET, url)
                .header("accept", accept)
                .send()
                .await
            {
                Ok(r) => {
                    let status = r.status();
                    let body = r.bytes().await.unwrap_or_default();
                    if status.is_success() && found(&body) {
                        return Ok(Found {
                            signal,
                            after: self.started.elapsed(),
                        });
                    }
                    format!("HTTP {status}: {}", excerpt(&body))
                }
                Err(e) => format!("{:#}", anyhow::Error::from(e)),
            };
            if Instant::now() >= self.deadline {
                anyhow::bail!(
                    "{signal}: the marked record was not found at {url} before the timeout; last answer: {last}"
                );
            }
            tokio::time::sleep(backoff.next_delay().min(self.deadline - Instant::now())).await;
        }
    }
}

/// Whether a Prometheus-style JSON answer has `data.result` non-empty.
fn prom_has_result(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/data/result")
                .and_then(|r| r.as_array())
                .map(|r| !r.is_empty())
        })
        .unwrap_or(false)
}

fn query_string(pairs: &[(&str, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", percent(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Runs the check; returns the process exit code.
pub async fn run(args: SmokeArgs) -> anyhow::Result<i32> {
    let checked = validate(&args).and_then(|(otlp, query)| {
        let auth = match &args.token_file {
            Some(p) => Some(format!("Bearer {}", read_token(p)?)),
            None => None,
        };
        Ok((otlp, query, auth, http_client(&args)?))
    });
    let (otlp, query, auth, http) = match checked {
        Ok(v) => v,
        Err(e) => {
            eprintln!("mira smoke: {e:#}");
            return Ok(2);
        }
    };
    let clock = mira_common::clock::Clock::from_env()?;
    let now_ns = clock.now_ns();
    let m = marked(now_ns);
    let started = Instant::now();
    let smoke = Smoke {
        http,
        tenant: args.tenant.clone(),
        auth,
        deadline: started + args.timeout.0,
        started,
    };
    println!("smoke {}: tenant {}, OTLP {otlp}, queries {query}", m.id, args.tenant);
    let result: anyhow::Result<Vec<Found>> = async {
        smoke.export(&format!("{otlp}/v1/logs"), &m.logs).await?;
        smoke.export(&format!("{otlp}/v1/traces"), &m.traces).await?;
        smoke.export(&format!("{otlp}/v1/metrics"), &m.metrics).await?;
        println!("sent: 1 log record, 1 span, 1 gauge point marked {}", m.id);
        let (start, end) = (now_ns - 3_600_000_000_000, now_ns + 3_600_000_000_000);
        let logs_url = format!(
            "{query}/loki/api/v1/query_range?{}",
            query_string(&[
                ("query", format!("{{service_name=\"{SERVICE}\"}} |= \"{}\"", m.id)),
                ("start", start.to_string()),
                ("end", end.to_string()),
                ("limit", "10".to_owned()),
                ("direction", "backward".to_owned()),
            ])
        );
        let marker = format!("mira smoke {}", m.id);
        let logs = smoke.poll("logs", &logs_url, "application/json", |b| {
            prom_has_result(b) && String::from_utf8_lossy(b).contains(&marker)
        });
        let trace_url = format!("{query}/api/traces/{}", hex(&m.trace_id));
        let span_name = format!("mira-smoke-{}", m.id);
        let traces = smoke.poll("traces", &trace_url, "application/json", |b| {
            String::from_utf8_lossy(b).contains(&span_name)
        });
        let metrics_url = format!(
            "{query}/api/v1/query?{}",
            query_string(&[
                ("query", format!("{METRIC}{{smoke_id=\"{}\"}}", m.id)),
                ("time", format!("{:.3}", now_ns as f64 / 1e9)),
            ])
        );
        let metrics = smoke.poll("metrics", &metrics_url, "application/json", prom_has_result);
        let (l, t, p) = tokio::join!(logs, traces, metrics);
        let mut found = Vec::new();
        let mut failed = Vec::new();
        for r in [l, t, p] {
            match r {
                Ok(f) => found.push(f),
                Err(e) => failed.push(format!("{e:#}")),
            }
        }
        if failed.is_empty() {
            Ok(found)
        } else {
            for f in &found {
                println!("{}: found after {:.1}s", f.signal, f.after.as_secs_f64());
            }
            anyhow::bail!(failed.join("\n"))
        }
    }
    .await;
    match result {
        Ok(found) => {
            for f in &found {
                println!("{}: found after {:.1}s", f.signal, f.after.as_secs_f64());
            }
            println!("ok: logs, traces and metrics written and read back");
            Ok(0)
        }
        Err(e) => {
            eprintln!("mira smoke failed:\n{e:#}");
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked_and_named() {
        assert_eq!(base_url("otlp", "http://h:4318/").expect("ok"), "http://h:4318");
        for bad in [
            "h:4318",
            "ftp://h",
            "http://",
            "http:///x",
            "http://h:1/?q=1",
            "http://a b",
        ] {
            let e = base_url("otlp", bad).expect_err(bad).to_string();
            assert!(e.contains("--otlp"), "{bad}: {e}");
        }
        let long = format!("http://{}", "a".repeat(3000));
        assert!(base_url("query", &long).is_err());
    }

    #[test]
    fn marked_exports_decode_and_carry_the_id() {
        let m = marked(1_700_000_000_000_000_000);
        let logs = ExportLogsServiceRequest::decode(m.logs.as_slice()).expect("logs");
        let rec = &logs.resource_logs[0].scope_logs[0].log_records[0];
        assert_eq!(rec.trace_id, m.trace_id.to_vec());
        let traces = ExportTraceServiceRequest::decode(m.traces.as_slice()).expect("traces");
        assert_eq!(
            traces.resource_spans[0].scope_spans[0].spans[0].name,
            format!("mira-smoke-{}", m.id)
        );
        let metrics = ExportMetricsServiceRequest::decode(m.metrics.as_slice()).expect("metrics");
        assert_eq!(
            metrics.resource_metrics[0].scope_metrics[0].metrics[0].name,
            "mira.smoke.check"
        );
        assert_ne!(marked(1).id, m.id);
    }

    #[test]
    fn percent_encoding_keeps_only_unreserved() {
        assert_eq!(
            percent("{a=\"b c\"} |= \"x\""),
            "%7Ba%3D%22b%20c%22%7D%20%7C%3D%20%22x%22"
        );
        assert!(prom_has_result(
            br#"{"status":"success","data":{"result":[{"metric":{}}]}}"#
        ));
        assert!(!prom_has_result(br#"{"status":"success","data":{"result":[]}}"#));
        assert!(!prom_has_result(b"not json"));
    }
}
