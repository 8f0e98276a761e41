//! `mira ingester` as a real process behind a real `mira catalog`: every
//! acknowledged OTLP export is in the published blocks exactly once, across
//! a kill -9 and restart, and bad requests get a 4xx naming the problem.

#[path = "support/cluster.rs"]
mod cluster;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cluster::{free_port, wait_for};
use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientConfig};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Procs {
    root: tempfile::TempDir,
    catalog: Option<Child>,
    ingester: Option<Child>,
    catalog_addr: String,
    http: String,
    grpc: String,
    starts: u32,
}

impl Procs {
    fn new() -> Procs {
        let root = tempfile::tempdir().expect("tempdir");
        let catalog_addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(root.path().join("catalog.log")).expect("log");
        let catalog = Command::new(env!("CARGO_BIN_EXE_mira"))
            .args([
                "catalog",
                "--listen",
                &catalog_addr,
                "--peers",
                &format!("0={catalog_addr}"),
            ])
            .arg("--data-dir")
            .arg(root.path().join("catalog"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn catalog");
        Procs {
            catalog: Some(catalog),
            ingester: None,
            catalog_addr,
            http: format!("127.0.0.1:{}", free_port()),
            grpc: format!("127.0.0.1:{}", free_port()),
            root,
            starts: 0,
        }
    }

    fn start_ingester(&mut self, extra: &[&str]) {
        self.starts += 1;
        let log = std::fs::File::create(self.root.path().join(format!("ingester.{}.log", self.starts))).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_mira"))
            .args([
                "ingester",
                "--catalog",
                &self.catalog_addr,
                "--http-listen",
                &self.http,
                "--grpc-listen",
                &self.grpc,
            ])
            .arg("--data-dir")
            .arg(self.root.path().join("ingester"))
            .args(["--shards", "2", "--seal-age-s", "1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn ingester");
        self.ingester = Some(child);
    }

    fn kill_ingester(&mut self) {
        if let Some(mut c) = self.ingester.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait: the ingester seals and publishes what is open.
    fn stop_ingester(&mut self) {
        if let Some(mut c) = self.ingester.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let _ = c.wait();
        }
    }

    fn objects(&self) -> std::path::PathBuf {
        self.root.path().join("ingester/objects")
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in [self.catalog.take(), self.ingester.take()].into_iter().flatten() {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One HTTP/1.1 request; returns (status, body) or None when the
/// connection failed.
async fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Option<(u16, Vec<u8>)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.ok()?;
    s.write_all(body).await.ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.ok()?;
    let text = String::from_utf8_lossy(&out);
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(out.len(), |p| p + 4);
    Some((status, out[split..].to_vec()))
}

fn request(first: u64, n: u64) -> Vec<u8> {
    let records = (first..first + n)
        .map(|i| LogRecord {
            time_unix_nano: 1_796_169_600_000_000_000 + i,
            body: Some(AnyValue {
                value: Some(any_value::Value::StringValue(format!("rec-{i}"))),
            }),
            ..Default::default()
        })
        .collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: records,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

async fn wait_ready(addr: &str) {
    wait_for("the ingester to be ready", Duration::from_secs(60), || async {
        http(addr, "GET", "/ready", &[], b"")
            .await
            .filter(|(s, _)| *s == 200)
            .map(|_| ())
    })
    .await;
}

/// Every `rec-N` body in the published blocks, with its count.
async fn published_bodies(p: &Procs) -> HashMap<String, usize> {
    let client = CatalogClient::new(vec![p.catalog_addr.clone()], ClientConfig::default());
    let blocks = client
        .list_blocks(pb::ListBlocksRequest {
            tenant: "default".into(),
            signal: pb::Signal::Logs as i32,
            min_time_ns: 0,
            max_time_ns: i64::MAX,
            states: vec![],
            linearizable: true,
        })
        .await
        .expect("list")
        .blocks;
    let cache = Arc::new(mira_core::block::VerifyCache::new(1024));
    let mut counts = HashMap::new();
    for b in blocks {
        let bytes = std::fs::read(p.objects().join(&b.object_key)).expect("published object exists");
        let block = mira_core::block::Block::from_bytes(bytes.into(), cache.clone()).expect("block");
        let tables = mira_core::tables::read_tables(&block, None).expect("tables");
        let req = mira_core::convert::logs_to_otlp(&tables).expect("otlp");
        for body in mira_testkit::flatten::log_bodies(&req) {
            *counts.entry(body).or_insert(0) += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_record_and_duplicates_none() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let mut p = Procs::new();
    p.start_ingester(&[]);
    wait_ready(&p.http).await;
    const PER: u64 = 50;
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let http_addr = p.http.clone();
    // Four senders run through the kill: exports in flight when the process
    // dies are not acknowledged and may or may not be published (once).
    let senders: Vec<_> = (0..4)
        .map(|_| {
            let (next, stop, acked, addr) = (next.clone(), stop.clone(), acked.clone(), http_addr.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let body = request(n * PER, PER);
                    match http(
                        &addr,
                        "POST",
                        "/v1/logs",
                        &[("Content-Type", "application/x-protobuf")],
                        &body,
                    )
                    .await
                    {
                        Some((200, _)) => acked.lock().expect("lock").push(n),
                        Some(_) => {}
                        None => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            })
        })
        .collect();
    let acked_len = || acked.lock().expect("lock").len();
    wait_for("300 acknowledged exports", Duration::from_secs(60), || async {
        (acked_len() >= 300).then_some(())
    })
    .await;
    p.kill_ingester();
    let at_kill = acked_len();
    p.start_ingester(&[]);
    wait_ready(&p.http).await;
    wait_for("300 more acknowledged exports", Duration::from_secs(60), || async {
        (acked_len() >= at_kill + 300).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.await.expect("sender");
    }
    p.stop_ingester();
    let acked = acked.lock().expect("lock").clone();
    let sent = next.load(Ordering::Relaxed);
    let counts = published_bodies(&p).await;
    eprintln!(
        "acked {} exports of {sent}, {} records published",
        acked.len(),
        counts.len()
    );
    for (body, n) in &counts {
        assert_eq!(*n, 1, "{body} was published {n} times");
    }
    for req in &acked {
        for i in req * PER..(req + 1) * PER {
            assert!(
                counts.contains_key(&format!("rec-{i}")),
                "acknowledged record rec-{i} is missing"
            );
        }
    }
    assert!(counts.len() as u64 <= sent * PER);
    // Exports are whole: a published export has all its records.
    for n in 0..sent {
        let present = (n * PER..(n + 1) * PER)
            .filter(|i| counts.contains_key(&format!("rec-{i}")))
            .count();
        assert!(
            present == 0 || present == PER as usize,
            "export {n} is half published ({present})"
        );
    }
}

/// `n` zero bytes, gzipped (a few tens of KiB).
fn gzip_zeros(n: usize) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(&vec![0u8; n]).expect("gzip");
    e.finish().expect("gzip")
}

/// (name, headers, body, expected status, text the answer must contain)
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<u8>, u16, &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_exports_get_4xx_naming_the_problem_and_nothing_is_lost() {
    let mut p = Procs::new();
    p.start_ingester(&[]);
    wait_ready(&p.http).await;
    let good = request(0, 10);
    let pb_ct = ("Content-Type", "application/x-protobuf");
    let cases: Vec<Case<'_>> = vec![
        (
            "truncated protobuf",
            vec![pb_ct],
            good[..good.len() - 3].to_vec(),
            400,
            "",
        ),
        (
            "wrong content type",
            vec![("Content-Type", "text/plain")],
            good.clone(),
            415,
            "content type",
        ),
        (
            "invalid json",
            vec![("Content-Type", "application/json")],
            b"{\"resourceLogs\": [".to_vec(),
            400,
            "JSON",
        ),
        (
            "bad tenant",
            vec![pb_ct, ("X-Scope-OrgID", "../etc")],
            good.clone(),
            400,
            "X-Scope-OrgID",
        ),
        (
            "unknown encoding",
            vec![pb_ct, ("Content-Encoding", "br")],
            good.clone(),
            400,
            "encoding",
        ),
        (
            "bad gzip",
            vec![pb_ct, ("Content-Encoding", "gzip")],
            b"\x1f\x8bnot gzip".to_vec(),
            400,
            "gzip",
        ),
        (
            "gzip bomb",
            vec![pb_ct, ("Content-Encoding", "gzip")],
            gzip_zeros(64 << 20),
            413,
            "limit",
        ),
    ];
    for (name, headers, body, status, needle) in cases {
        let (got, body) = http(&p.http, "POST", "/v1/logs", &headers, &body).await.expect(name);
        let text = String::from_utf8_lossy(&body);
        assert_eq!(got, status, "{name}: {text}");
        assert!(text.contains(needle), "{name}: {text:?} should mention {needle:?}");
    }
    // OTLP/JSON with hex ids and string int64s is accepted.
    let json = r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"1796169600000000001","body":{"stringValue":"json-1"},"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174"}]}]}]}"#;
    let (got, body) = http(
        &p.http,
        "POST",
        "/v1/logs",
        &[("Content-Type", "application/json")],
        json.as_bytes(),
    )
    .await
    .expect("json");
    assert_eq!(got, 200, "{}", String::from_utf8_lossy(&body));
    let (got, _) = http(&p.http, "POST", "/v1/logs", &[pb_ct], &good).await.expect("good");
    assert_eq!(got, 200);
    // The probes count what happened.
    let (got, metrics) = http(&p.http, "GET", "/metrics", &[], b"").await.expect("metrics");
    assert_eq!(got, 200);
    let metrics = String::from_utf8_lossy(&metrics);
    for line in [
        "mira_ingester_requests_total{signal=\"logs\",outcome=\"invalid\"} 1",
        "mira_ingester_requests_total{signal=\"logs\",outcome=\"ok\"} 2",
        "mira_ingester_records_total{signal=\"logs\"} 11",
        "mira_ingester_wal_write_seconds_count 2",
    ] {
        assert!(metrics.contains(line), "/metrics lacks {line}:\n{metrics}");
    }
    for name in [
        "mira_ingester_admission_wait_seconds_count",
        "mira_ingester_decode_append_seconds_count",
        "mira_ingester_runtime_lag_seconds_count",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}");
    }
    p.stop_ingester();
    let counts = published_bodies(&p).await;
    assert_eq!(
        counts.len(),
        11,
        "the ten good records and the JSON one, nothing from the bad requests"
    );
    assert_eq!(counts.get("json-1"), Some(&1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_loadgen_runs_keeps_every_acknowledged_request_once() {
    let mut p = Procs::new();
    p.start_ingester(&[]);
    wait_ready(&p.http).await;
    let acked_file = p.root.path().join("acked.txt");
    let loadgen = Command::new(env!("CARGO_BIN_EXE_mira"))
        .args([
            "loadgen",
            "--protocol",
            "grpc",
            "--target",
            &p.grpc,
            "--conns",
            "4",
            "--batch",
            "200",
            "--for",
            "8",
            "--rate",
            "100",
        ])
        .arg("--acked-file")
        .arg(&acked_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn loadgen");
    // Let it run, kill -9 the ingester mid-stream, bring it back.
    let wal = p.root.path().join("ingester/wal");
    wait_for("WAL frames", Duration::from_secs(30), || async {
        let size: u64 = std::fs::read_dir(&wal)
            .ok()?
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum();
        (size > 1 << 20).then_some(())
    })
    .await;
    p.kill_ingester();
    p.start_ingester(&[]);
    wait_ready(&p.http).await;
    let status = tokio::task::spawn_blocking(move || loadgen.wait_with_output())
        .await
        .expect("join")
        .expect("loadgen");
    assert!(status.status.success());
    let report = String::from_utf8_lossy(&status.stdout).to_string();
    p.stop_ingester();
    let acked: Vec<u64> = std::fs::read_to_string(&acked_file)
        .expect("acked file")
        .lines()
        .map(|l| l.parse().expect("number"))
        .collect();
    assert!(
        acked.len() > 10,
        "loadgen acknowledged too little to mean anything: {report}"
    );
    let counts = published_bodies(&p).await;
    for (body, n) in counts.iter().filter(|(b, _)| b.starts_with("loadgen-")) {
        assert_eq!(*n, 1, "{body} published {n} times");
    }
    for n in &acked {
        assert_eq!(
            counts.get(&format!("loadgen-{n}")),
            Some(&1),
            "acknowledged request {n} is missing"
        );
    }
}
