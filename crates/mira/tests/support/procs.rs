//! Mira's roles as real processes on loopback: any number of `mira
//! catalog`, `mira ingester`, `mira querier`, `mira compactor` and `mira
//! serve` processes of
//! the binary under test, each with its ports and data directory fixed for
//! its life, so one killed (-9) or stopped (SIGTERM) starts again on its
//! data and its peers still find it. Every ingester and querier shares one
//! file object store and the harness's catalog members. Every process
//! gets the harness's cluster secret (`MIRA_CLUSTER_SECRET_FILE`), and the
//! harness's own catalog clients send it ([`Procs::dialer`]). Helpers read
//! back what was published, from the catalog and the object store itself.

#![allow(dead_code)]

use std::collections::HashMap;
use std::ops::{Index, IndexMut};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientConfig};
use mira_common::cluster::{ClusterSecret, Dialer};
use mira_testkit::net::{free_port, wait_for};

/// The `mira` binary under test: this build's, or `MIRA_TEST_BIN` (to run
/// the same tests against another build, e.g. an earlier release).
pub fn bin() -> String {
    std::env::var("MIRA_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_mira").to_owned())
}

/// The subcommand a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Catalog,
    Ingester,
    Querier,
    Serve,
    Compactor,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Catalog => "catalog",
            Role::Ingester => "ingester",
            Role::Querier => "querier",
            Role::Serve => "serve",
            Role::Compactor => "compactor",
        }
    }
}

/// One process of the harness (running or not).
pub struct Proc {
    pub role: Role,
    /// `{role}-{k}` for the k-th of its role: its data directory under the
    /// root and its log files' names.
    pub name: String,
    /// Its node id, for a catalog member: k.
    pub id: u64,
    pub dir: PathBuf,
    /// Where its `/ready` and `/metrics` answer: the catalog's gRPC and
    /// HTTP listener, the ingester's OTLP/HTTP one, the query API of a
    /// querier or `serve`, a compactor's HTTP port.
    pub addr: String,
    /// OTLP/gRPC (ingester, serve).
    pub grpc: String,
    /// OTLP/HTTP (ingester: `addr`; serve).
    pub http: String,
    /// The embedded catalog member (serve).
    pub member: String,
    /// Flags after the role's own, and environment, of every start.
    pub flags: Vec<String>,
    pub env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Proc {
    /// The command line: the role's own flags, then `flags`.
    fn command(&self, catalogs: &str, peers: &str, objects: &str) -> Command {
        let mut cmd = Command::new(bin());
        cmd.arg(self.role.name());
        let (id, dir) = (self.id.to_string(), self.dir.display().to_string());
        let own: Vec<&str> = match self.role {
            Role::Catalog => vec![
                "--node-id",
                &id,
                "--listen",
                &self.addr,
                "--peers",
                peers,
                "--data-dir",
                &dir,
            ],
            Role::Ingester => {
                let mut own = vec![
                    "--catalog",
                    catalogs,
                    "--http-listen",
                    &self.addr,
                    "--grpc-listen",
                    &self.grpc,
                    "--data-dir",
                    &dir,
                    "--object-store",
                    objects,
                ];
                // Defaults of these tests unless the flags set them.
                for (flag, value) in [("--shards", "2"), ("--seal-age", "1s")] {
                    if !self.flags.iter().any(|f| f == flag) {
                        own.extend([flag, value]);
                    }
                }
                own
            }
            Role::Querier => vec![
                "--listen",
                &self.addr,
                "--catalog",
                catalogs,
                "--data-dir",
                &dir,
                "--object-store",
                objects,
            ],
            Role::Compactor => vec![
                "--compactor-listen",
                &self.addr,
                "--catalog",
                catalogs,
                "--data-dir",
                &dir,
                "--object-store",
                objects,
            ],
            Role::Serve => vec![
                "--listen",
                &self.addr,
                "--grpc-listen",
                &self.grpc,
                "--http-listen",
                &self.http,
                "--catalog-listen",
                &self.member,
                "--data-dir",
                &dir,
                "--object-store",
                objects,
            ],
        };
        cmd.args(own)
            .args(&self.flags)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }
}

/// Processes of any roles under one temporary root.
pub struct Procs {
    pub root: tempfile::TempDir,
    procs: Vec<Proc>,
    starts: u32,
}

impl Index<usize> for Procs {
    type Output = Proc;
    fn index(&self, i: usize) -> &Proc {
        &self.procs[i]
    }
}

impl IndexMut<usize> for Procs {
    fn index_mut(&mut self, i: usize) -> &mut Proc {
        &mut self.procs[i]
    }
}

/// The cluster secret's file under the root, and its variable.
const SECRET_FILE: &str = "cluster-secret";
pub const SECRET_ENV: &str = "MIRA_CLUSTER_SECRET_FILE";

/// In [`Procs::with_ingester`]: the catalog member and the ingester.
pub const CATALOG: usize = 0;
pub const INGESTER: usize = 1;

impl Procs {
    /// No process yet.
    pub fn new() -> Procs {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::write(root.path().join(SECRET_FILE), "harness-cluster-secret-0123456789\n").expect("secret");
        Procs {
            root,
            procs: Vec::new(),
            starts: 0,
        }
    }

    /// The cluster secret file every process is given.
    pub fn secret_file(&self) -> PathBuf {
        self.root.path().join(SECRET_FILE)
    }

    /// How the harness's own clients connect: with the cluster secret.
    pub fn dialer(&self) -> Dialer {
        Dialer::new(None, Some(ClusterSecret::load(&self.secret_file()).expect("secret")))
    }

    /// `mira ARGS...` (a CLI tool against this harness's processes), with
    /// the cluster secret.
    pub fn cli(&self) -> Command {
        let mut c = Command::new(bin());
        c.env(SECRET_ENV, self.secret_file());
        c
    }

    /// A catalog member ([`CATALOG`], started) and an ingester
    /// ([`INGESTER`], not started).
    pub fn with_ingester() -> Procs {
        let mut p = Procs::new();
        assert_eq!(p.add(Role::Catalog, &[]), CATALOG);
        assert_eq!(p.add(Role::Ingester, &[]), INGESTER);
        p.start(CATALOG);
        p
    }

    /// `n` catalog members started with `flags`.
    pub fn catalogs(n: usize, flags: &[&str], env: &[(&str, &str)]) -> Procs {
        let mut p = Procs::new();
        for _ in 0..n {
            let i = p.add(Role::Catalog, flags);
            p[i].env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        }
        for i in 0..n {
            p.start(i);
        }
        p
    }

    /// Adds a process of `role` that starts with `flags` (not started);
    /// a catalog member joins the peer list of members started from now on.
    pub fn add(&mut self, role: Role, flags: &[&str]) -> usize {
        let k = self.procs.iter().filter(|p| p.role == role).count();
        let name = format!("{}-{k}", role.name());
        let addr = format!("127.0.0.1:{}", free_port());
        let http = if role == Role::Ingester {
            addr.clone()
        } else {
            format!("127.0.0.1:{}", free_port())
        };
        self.procs.push(Proc {
            role,
            id: k as u64,
            dir: self.root.path().join(&name),
            name,
            addr,
            grpc: format!("127.0.0.1:{}", free_port()),
            http,
            member: format!("127.0.0.1:{}", free_port()),
            flags: flags.iter().map(|f| (*f).to_owned()).collect(),
            env: Vec::new(),
            child: None,
        });
        self.procs.len() - 1
    }

    /// Starts process `i` (again) with its flags; its stderr goes to
    /// `{name}.{n}.log` under the root.
    pub fn start(&mut self, i: usize) {
        assert!(self.procs[i].child.is_none(), "{} already running", self.procs[i].name);
        self.starts += 1;
        let catalogs = self.catalog_addrs().join(",");
        let peers = self
            .procs
            .iter()
            .filter(|p| p.role == Role::Catalog)
            .map(|p| format!("{}={}", p.id, p.addr))
            .collect::<Vec<_>>()
            .join(",");
        let objects = format!("file://{}", self.objects().display());
        let p = &self.procs[i];
        let log = std::fs::File::create(self.root.path().join(format!("{}.{}.log", p.name, self.starts))).expect("log");
        let mut cmd = p.command(&catalogs, &peers, &objects);
        // The harness's secret unless the process's environment names
        // another (an empty value: none at all).
        match p.env.iter().find(|(k, _)| k == SECRET_ENV) {
            None => {
                cmd.env(SECRET_ENV, self.root.path().join(SECRET_FILE));
            }
            Some((_, v)) if v.is_empty() => {
                cmd.env_remove(SECRET_ENV);
            }
            Some(_) => {}
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", p.name));
        self.procs[i].child = Some(child);
    }

    /// Starts process `i` with other flags and environment, kept for its
    /// next starts.
    pub fn start_with(&mut self, i: usize, flags: &[&str], env: &[(&str, &str)]) {
        self.procs[i].flags = flags.iter().map(|f| (*f).to_owned()).collect();
        self.procs[i].env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        self.start(i);
    }

    /// Every process, by index.
    pub fn iter(&self) -> impl Iterator<Item = &Proc> {
        self.procs.iter()
    }

    /// Process `i`'s pid while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.procs[i].child.as_ref().map(Child::id)
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.procs[i].child.is_some()
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait: an ingester seals and publishes what is open.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].child.take() {
            terminate(&c);
            let _ = c.wait();
        }
    }

    /// The running process `i`, no longer the harness's to stop.
    pub fn take(&mut self, i: usize) -> Child {
        self.procs[i].child.take().expect("a running process")
    }

    pub fn objects(&self) -> PathBuf {
        self.root.path().join("objects")
    }

    /// The addresses of the catalog members.
    pub fn catalog_addrs(&self) -> Vec<String> {
        self.procs
            .iter()
            .filter(|p| p.role == Role::Catalog)
            .map(|p| p.addr.clone())
            .collect()
    }

    /// A client of every catalog member.
    pub fn client(&self) -> Arc<CatalogClient> {
        Arc::new(CatalogClient::new(
            self.catalog_addrs(),
            ClientConfig {
                timeout: Duration::from_secs(30),
                dialer: self.dialer(),
                ..ClientConfig::default()
            },
        ))
    }

    /// A client of catalog member `i` alone (reads are served by that
    /// member).
    pub fn member_client(&self, i: usize) -> CatalogClient {
        CatalogClient::new(
            vec![self.procs[i].addr.clone()],
            ClientConfig {
                timeout: Duration::from_secs(2),
                attempt_timeout: Duration::from_secs(1),
                dialer: self.dialer(),
                ..ClientConfig::default()
            },
        )
    }

    /// Waits until a running catalog member reports a leader that is
    /// running, and returns the leader's index.
    pub async fn leader(&self) -> usize {
        wait_for("a leader", Duration::from_secs(30), || async {
            for (i, m) in self.procs.iter().enumerate() {
                if m.role != Role::Catalog || m.child.is_none() {
                    continue;
                }
                if let Ok(s) = self.member_client(i).status_of_first().await
                    && let Some(l) = s.leader_id
                    && let Some(li) = self.procs.iter().position(|m| m.role == Role::Catalog && m.id == l)
                    && self.procs[li].child.is_some()
                    && self
                        .member_client(li)
                        .status_of_first()
                        .await
                        .is_ok_and(|ls| ls.leader_id == Some(l))
                {
                    return Some(li);
                }
            }
            None
        })
        .await
    }

    pub async fn status(&self, i: usize) -> Option<pb::StatusReply> {
        self.member_client(i).status_of_first().await.ok()
    }

    /// Every logs block (any state) member `i` has applied, as served by it.
    pub async fn blocks_on(&self, i: usize, tenant: &str) -> Option<Vec<pb::Block>> {
        self.member_client(i)
            .list_blocks(pb::ListBlocksRequest {
                tenant: tenant.to_owned(),
                signal: pb::Signal::Logs as i32,
                min_time_ns: 0,
                max_time_ns: i64::MAX,
                states: vec![
                    pb::BlockState::Live as i32,
                    pb::BlockState::Tombstoned as i32,
                    pb::BlockState::Offloaded as i32,
                ],
                linearizable: false,
                ..Default::default()
            })
            .await
            .ok()
            .map(|r| r.blocks)
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

    // The layout of `with_ingester`, by name.

    pub fn start_catalog(&mut self) {
        self.start(CATALOG);
    }

    pub fn kill_catalog(&mut self) {
        self.kill(CATALOG);
    }

    pub fn catalog_addr(&self) -> &str {
        &self.procs[CATALOG].addr
    }

    pub fn start_ingester(&mut self, flags: &[&str]) {
        self.start_with(INGESTER, flags, &[]);
    }

    pub fn start_ingester_env(&mut self, flags: &[&str], env: &[(&str, &str)]) {
        self.start_with(INGESTER, flags, env);
    }

    pub fn kill_ingester(&mut self) {
        self.kill(INGESTER);
    }

    pub fn stop_ingester(&mut self) {
        self.stop(INGESTER);
    }

    /// The ingester's OTLP/HTTP address.
    pub fn http(&self) -> &str {
        &self.procs[INGESTER].http
    }

    /// The ingester's OTLP/gRPC address.
    pub fn grpc(&self) -> &str {
        &self.procs[INGESTER].grpc
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for i in 0..self.procs.len() {
            self.kill(i);
        }
        // A failing test shows what its processes logged.
        if std::thread::panicking() {
            eprintln!("--- logs of the test's processes ---\n{}", self.logs());
        }
    }
}

/// SIGTERM to `child` (a graceful stop), without waiting.
pub fn terminate(child: &Child) {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
}

/// Waits (a minute at most) until `child` exits.
pub fn child_exit(c: &mut Child, what: &str) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(s) = c.try_wait().expect("wait") {
            return s;
        }
        assert!(std::time::Instant::now() < deadline, "{what} did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes a tokens file (`--auth-tokens-file`) at `path` in which `token`,
/// named `name`, may write and read `tenant`.
pub fn write_tokens(path: &std::path::Path, name: &str, token: &str, tenant: &str) {
    let digest = mira_common::auth::hash_token(token);
    std::fs::write(
        path,
        format!("[[token]]\nname = \"{name}\"\nsha256 = \"{digest}\"\ntenants = [\"{tenant}\"]\nscopes = [\"write\", \"read\"]\n"),
    )
    .expect("test setup: tokens file");
}

/// A log export of records `rec-{first}` .. `rec-{first + n - 1}`, record
/// `rec-i` at [`mira_testkit::recent_base_time`] + i.
pub fn request(first: u64, n: u64) -> Vec<u8> {
    mira_testkit::otlp::log_export(&[], (first..first + n).map(|i| (i, format!("rec-{i}"))))
}

/// The tables of every published block of `signal` (default tenant).
pub async fn published_tables(p: &Procs, signal: pb::Signal) -> Vec<mira_core::convert::TableSet> {
    published_tables_of(p, "default", signal).await
}

/// Every live block of `tenant`'s `signal` the catalog lists (linearizable).
pub async fn published_blocks(p: &Procs, tenant: &str, signal: pb::Signal) -> Vec<pb::Block> {
    let client = CatalogClient::new(
        p.catalog_addrs(),
        ClientConfig {
            dialer: p.dialer(),
            ..ClientConfig::default()
        },
    );
    client
        .list_blocks(pb::ListBlocksRequest {
            tenant: tenant.into(),
            signal: signal as i32,
            min_time_ns: 0,
            max_time_ns: i64::MAX,
            states: vec![],
            linearizable: true,
            ..Default::default()
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
