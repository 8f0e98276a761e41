//! A catalog cluster of real `mira catalog` processes on loopback, for
//! tests that kill members with SIGKILL and restart them from disk.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientConfig};
pub use mira_testkit::net::{free_port, wait_for};

pub const HOUR: i64 = 3_600_000_000_000;
/// 2026-12-02T00:00:00Z.
pub const BASE: i64 = 1_796_169_600_000_000_000;

pub struct Member {
    pub id: u64,
    pub addr: String,
    pub dir: PathBuf,
    child: Option<Child>,
    starts: u32,
}

pub struct Cluster {
    pub members: Vec<Member>,
    pub peers: String,
    pub root: tempfile::TempDir,
    pub snapshot_every: u64,
    pub keep_logs: u64,
}

impl Cluster {
    pub fn new(n: u64, snapshot_every: u64, keep_logs: u64) -> Cluster {
        let root = tempfile::tempdir().expect("tempdir");
        let members: Vec<Member> = (0..n)
            .map(|id| Member {
                id,
                addr: format!("127.0.0.1:{}", free_port()),
                dir: root.path().join(format!("member-{id}")),
                child: None,
                starts: 0,
            })
            .collect();
        let peers = members
            .iter()
            .map(|m| format!("{}={}", m.id, m.addr))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster {
            members,
            peers,
            root,
            snapshot_every,
            keep_logs,
        };
        for i in 0..n as usize {
            c.start(i);
        }
        c
    }

    /// Adds a member (not started) and includes it in the peer list given
    /// to members started from now on.
    pub fn add_member(&mut self) -> usize {
        let id = self.members.len() as u64;
        self.members.push(Member {
            id,
            addr: format!("127.0.0.1:{}", free_port()),
            dir: self.root.path().join(format!("member-{id}")),
            child: None,
            starts: 0,
        });
        self.peers = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.id, m.addr))
            .collect::<Vec<_>>()
            .join(",");
        self.members.len() - 1
    }

    pub fn start(&mut self, i: usize) {
        let m = &mut self.members[i];
        assert!(m.child.is_none(), "member {i} already running");
        m.starts += 1;
        let log =
            std::fs::File::create(self.root.path().join(format!("member-{}.{}.log", m.id, m.starts))).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_mira"))
            .args([
                "catalog",
                "--node-id",
                &m.id.to_string(),
                "--listen",
                &m.addr,
                "--peers",
                &self.peers,
            ])
            .arg("--data-dir")
            .arg(&m.dir)
            .args(["--snapshot-every", &self.snapshot_every.to_string()])
            .args(["--keep-logs", &self.keep_logs.to_string()])
            .args(["--heartbeat-ms", "50", "--election-ms", "300"])
            .env("MIRA_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn mira catalog");
        m.child = Some(child);
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn client(&self) -> Arc<CatalogClient> {
        Arc::new(CatalogClient::new(
            self.members.iter().map(|m| m.addr.clone()).collect(),
            ClientConfig {
                timeout: Duration::from_secs(30),
                ..ClientConfig::default()
            },
        ))
    }

    /// A client of member `i` alone (reads are served by that member).
    pub fn member_client(&self, i: usize) -> CatalogClient {
        CatalogClient::new(
            vec![self.members[i].addr.clone()],
            ClientConfig {
                timeout: Duration::from_secs(2),
                attempt_timeout: Duration::from_secs(1),
                ..ClientConfig::default()
            },
        )
    }

    /// Waits until a running member reports a leader that is running, and
    /// returns the leader's index.
    pub async fn leader(&self) -> usize {
        wait_for("a leader", Duration::from_secs(30), || async {
            for (i, m) in self.members.iter().enumerate() {
                if m.child.is_none() {
                    continue;
                }
                if let Ok(s) = self.member_client(i).status_of_first().await
                    && let Some(l) = s.leader_id
                    && let Some(li) = self.members.iter().position(|m| m.id == l)
                    && self.members[li].child.is_some()
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

    /// Every block (any state) member `i` has applied, as served by it.
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
            })
            .await
            .ok()
            .map(|r| r.blocks)
    }

    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(entries) = std::fs::read_dir(self.root.path()) {
            let mut paths: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
            paths.sort();
            for p in paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == "log")) {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                out.push_str(&format!("== {}\n", p.display()));
                for l in tail.into_iter().rev() {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A publishable block of tenant `tenant` with a fresh id, `seq` seconds
/// after [`BASE`].
pub fn block(tenant: &str, seq: i64) -> pb::Block {
    mira_catalog::testing::block(tenant, BASE + seq * 1_000_000_000, 500_000_000)
}
