//! One `mira catalog` and one `mira ingester` as real processes on
//! loopback, with the ingester killed (-9) or stopped (SIGTERM) and started
//! again with other flags; helpers to send OTLP/HTTP exports and to read
//! back every published block from the object store itself.

#![allow(dead_code)]

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientConfig};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cluster::{free_port, wait_for};

/// The `mira` binary under test: this build's, or `MIRA_TEST_BIN` (to run
/// the same tests against another build, e.g. an earlier release).
pub fn bin() -> String {
    std::env::var("MIRA_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_mira").to_owned())
}

/// `--shards 2 --seal-age-s 1` unless `extra` sets them.
fn defaults(extra: &[&str]) -> Vec<&'static str> {
    let mut out = Vec::new();
    if !extra.contains(&"--shards") {
        out.extend(["--shards", "2"]);
    }
    if !extra.contains(&"--seal-age-s") {
        out.extend(["--seal-age-s", "1"]);
    }
    out
}

pub struct Procs {
    pub root: tempfile::TempDir,
    pub catalog: Option<Child>,
    pub ingester: Option<Child>,
    pub catalog_addr: String,
    pub http: String,
    pub grpc: String,
    pub starts: u32,
}

impl Procs {
    pub fn new() -> Procs {
        let root = tempfile::tempdir().expect("tempdir");
        let catalog_addr = format!("127.0.0.1:{}", free_port());
        let mut p = Procs {
            catalog: None,
            ingester: None,
            catalog_addr,
            http: format!("127.0.0.1:{}", free_port()),
            grpc: format!("127.0.0.1:{}", free_port()),
            root,
            starts: 0,
        };
        p.start_catalog();
        p
    }

    /// Starts (or restarts, from its data directory) the catalog member.
    pub fn start_catalog(&mut self) {
        self.starts += 1;
        let log = std::fs::File::create(self.root.path().join(format!("catalog.{}.log", self.starts))).expect("log");
        let catalog = Command::new(bin())
            .args([
                "catalog",
                "--listen",
                &self.catalog_addr,
                "--peers",
                &format!("0={}", self.catalog_addr),
            ])
            .arg("--data-dir")
            .arg(self.root.path().join("catalog"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn catalog");
        self.catalog = Some(catalog);
    }

    pub fn kill_catalog(&mut self) {
        if let Some(mut c) = self.catalog.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn start_ingester(&mut self, extra: &[&str]) {
        self.start_ingester_env(extra, &[]);
    }

    /// Starts the ingester (data in `ingester/`) with extra flags and
    /// environment variables.
    pub fn start_ingester_env(&mut self, extra: &[&str], env: &[(&str, &str)]) {
        let (http, grpc) = (self.http.clone(), self.grpc.clone());
        let child = self.spawn_ingester("ingester", &http, &grpc, extra, env);
        self.ingester = Some(child);
    }

    /// Spawns a `mira ingester` with its data in `dir` under the root; its
    /// stderr goes to `{dir}.{n}.log`.
    pub fn spawn_ingester(&mut self, dir: &str, http: &str, grpc: &str, extra: &[&str], env: &[(&str, &str)]) -> Child {
        self.starts += 1;
        let log = std::fs::File::create(self.root.path().join(format!("{dir}.{}.log", self.starts))).expect("log");
        Command::new(bin())
            .args([
                "ingester",
                "--catalog",
                &self.catalog_addr,
                "--http-listen",
                http,
                "--grpc-listen",
                grpc,
            ])
            .arg("--data-dir")
            .arg(self.root.path().join(dir))
            .arg("--object-store")
            .arg(format!("file://{}", self.objects().display()))
            .args(defaults(extra))
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn ingester")
    }

    /// The text of every log file of the run (for assertions on what a
    /// process said).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let mut files: Vec<_> = std::fs::read_dir(self.root.path())
            .expect("ls")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        files.sort();
        for f in files {
            out.push_str(&std::fs::read_to_string(&f).unwrap_or_default());
        }
        out
    }

    pub fn kill_ingester(&mut self) {
        if let Some(mut c) = self.ingester.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait: the ingester seals and publishes what is open.
    pub fn stop_ingester(&mut self) {
        if let Some(mut c) = self.ingester.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let _ = c.wait();
        }
    }

    pub fn objects(&self) -> std::path::PathBuf {
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
pub async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<(u16, Vec<u8>)> {
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

/// Record times of these tests (ten minutes before the test started).
pub fn base_time() -> u64 {
    mira_testkit::recent_base_time()
}

/// A log export of records `rec-{first}` .. `rec-{first + n - 1}`.
pub fn request(first: u64, n: u64) -> Vec<u8> {
    let records = (first..first + n)
        .map(|i| LogRecord {
            time_unix_nano: base_time() + i,
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

pub async fn wait_ready(addr: &str) {
    wait_for("the ingester to be ready", Duration::from_secs(60), || async {
        http(addr, "GET", "/ready", &[], b"")
            .await
            .filter(|(s, _)| *s == 200)
            .map(|_| ())
    })
    .await;
}

/// The tables of every published block of `signal` (default tenant).
pub async fn published_tables(p: &Procs, signal: pb::Signal) -> Vec<mira_core::convert::TableSet> {
    published_tables_of(p, "default", signal).await
}

/// Every live block of `tenant`'s `signal` the catalog lists (linearizable).
pub async fn published_blocks(p: &Procs, tenant: &str, signal: pb::Signal) -> Vec<pb::Block> {
    let client = CatalogClient::new(vec![p.catalog_addr.clone()], ClientConfig::default());
    client
        .list_blocks(pb::ListBlocksRequest {
            tenant: tenant.into(),
            signal: signal as i32,
            min_time_ns: 0,
            max_time_ns: i64::MAX,
            states: vec![],
            linearizable: true,
        })
        .await
        .expect("list")
        .blocks
}

/// The tables of every published block of `tenant`'s `signal`, read from
/// the object store.
pub async fn published_tables_of(p: &Procs, tenant: &str, signal: pb::Signal) -> Vec<mira_core::convert::TableSet> {
    let blocks = published_blocks(p, tenant, signal).await;
    let cache = Arc::new(mira_core::block::VerifyCache::new(1024));
    blocks
        .iter()
        .map(|b| {
            let bytes = std::fs::read(p.objects().join(&b.object_key)).expect("published object exists");
            let block = mira_core::block::Block::from_bytes(bytes.into(), cache.clone()).expect("block");
            mira_core::tables::read_tables(&block, None).expect("tables")
        })
        .collect()
}

/// Every `rec-N` body in the published blocks, with its count.
pub async fn published_bodies(p: &Procs) -> HashMap<String, usize> {
    published_bodies_of(p, "default").await
}

/// Every log body in `tenant`'s published blocks, with its count.
pub async fn published_bodies_of(p: &Procs, tenant: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for tables in published_tables_of(p, tenant, pb::Signal::Logs).await {
        let req = mira_core::convert::logs_to_otlp(&tables).expect("otlp");
        for body in mira_testkit::flatten::log_bodies(&req) {
            *counts.entry(body).or_insert(0) += 1;
        }
    }
    counts
}
