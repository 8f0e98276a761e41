//! What an operator configures for a catalog member ([`Settings`]): the
//! `[catalog]` table of the TOML file, the `mira catalog` flags and their
//! `MIRA_*` variables. [`Settings::validate`] names the bad field and
//! rejects; [`Settings::build`] makes the [`NodeConfig`] the member runs
//! with, its files in `<data_dir>/catalog` like every role's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use mira_common::config::{ConfigError, Duration, positive};
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::node::{NodeConfig, parse_peers};

/// A catalog member's settings (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// This member's id; must appear in `peers`.
    pub node_id: u64,
    /// gRPC (Raft and client API) and probes listen address.
    pub listen: SocketAddr,
    /// Every member as id=host:port, comma separated (this one included).
    pub peers: String,
    /// Members refuse Raft traffic carrying another cluster id.
    pub cluster_id: String,
    /// Build a snapshot after this many log entries.
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot for followers that lag.
    pub keep_logs: u64,
    /// Leader heartbeat interval.
    pub heartbeat: Duration,
    /// Election timeout (the upper end of the random range is twice it).
    pub election_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            node_id: 0,
            listen: SocketAddr::from(([0, 0, 0, 0], 7400)),
            peers: "0=127.0.0.1:7400".to_owned(),
            cluster_id: "mira".to_owned(),
            snapshot_every: 10_000,
            keep_logs: 1_000,
            heartbeat: Duration::from_millis(100),
            election_timeout: Duration::from_millis(400),
        }
    }
}

fn millis(field: &str, d: Duration) -> Result<u64, ConfigError> {
    positive(field, d)?;
    let ms = u64::try_from(d.get().as_millis()).unwrap_or(u64::MAX);
    if ms == 0 || !d.get().subsec_nanos().is_multiple_of(1_000_000) {
        return Err(ConfigError::new(
            field,
            format!("{d} must be a whole number of milliseconds"),
        ));
    }
    Ok(ms)
}

fn config_error(e: Error) -> ConfigError {
    match e {
        Error::Config(c) => c,
        other => ConfigError::new("catalog", other.to_string()),
    }
}

impl Settings {
    /// Checks every field; the first bad one is named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.build(Path::new(".")).map(|_| ())
    }

    /// The member's configuration; its files go in `<data_dir>/catalog`.
    pub fn build(&self, data_dir: &Path) -> Result<NodeConfig, ConfigError> {
        let heartbeat_ms = millis("catalog.heartbeat", self.heartbeat)?;
        let election_ms = millis("catalog.election_timeout", self.election_timeout)?;
        let config = NodeConfig {
            node_id: self.node_id,
            listen: self.listen,
            peers: parse_peers(&self.peers).map_err(config_error)?,
            data_dir: catalog_dir(data_dir),
            cluster_id: self.cluster_id.clone(),
            snapshot_every: self.snapshot_every,
            keep_logs: self.keep_logs,
            heartbeat_ms,
            election_timeout_ms: (election_ms, election_ms.saturating_mul(2)),
        };
        config.validate().map_err(config_error)?;
        Ok(config)
    }
}

/// Where a catalog member keeps its Raft log and snapshots under a data
/// directory: `<data_dir>/catalog`. A directory an earlier release used
/// directly (its `raft-log.redb` or `state/snapshot.bin` in `data_dir`
/// itself, from `mira catalog --data-dir`, or restored that way) is kept
/// where it is.
pub fn catalog_dir(data_dir: &Path) -> PathBuf {
    let nested = data_dir.join("catalog");
    let flat = data_dir.join("raft-log.redb").exists() || data_dir.join("state").join("snapshot.bin").exists();
    if !nested.exists() && flat {
        return data_dir.to_path_buf();
    }
    nested
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_build_a_single_member_under_the_data_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Settings::default().build(dir.path()).expect("defaults");
        assert_eq!(c.data_dir, dir.path().join("catalog"));
        assert_eq!((c.heartbeat_ms, c.election_timeout_ms), (100, (400, 800)));
    }

    #[test]
    fn an_earlier_releases_directory_is_opened_in_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(catalog_dir(dir.path()), dir.path().join("catalog"));
        std::fs::write(dir.path().join("raft-log.redb"), b"").expect("write");
        assert_eq!(catalog_dir(dir.path()), dir.path());
        // A restore into the old layout: only the snapshot.
        let restored = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(restored.path().join("state")).expect("mkdir");
        std::fs::write(restored.path().join("state/snapshot.bin"), b"").expect("write");
        assert_eq!(catalog_dir(restored.path()), restored.path());
        // Once the nested directory exists it wins.
        std::fs::create_dir_all(restored.path().join("catalog")).expect("mkdir");
        assert_eq!(catalog_dir(restored.path()), restored.path().join("catalog"));
    }

    #[test]
    fn bad_values_name_the_field() {
        for (field, change) in [
            (
                "catalog.peers",
                (|s: &mut Settings| s.peers = "zero=a:1".to_owned()) as fn(&mut Settings),
            ),
            ("catalog.peers", |s| s.node_id = 7),
            ("catalog.heartbeat", |s| s.heartbeat = Duration::default()),
            ("catalog.election_timeout", |s| {
                s.election_timeout = Duration::from_millis(50)
            }),
            ("catalog.cluster_id", |s| s.cluster_id = String::new()),
            ("catalog.snapshot_every", |s| s.snapshot_every = 0),
        ] {
            let mut s = Settings::default();
            change(&mut s);
            assert_eq!(s.validate().expect_err(field).field, field, "{field}");
        }
    }
}
