//! What an operator configures for a compactor ([`Settings`]): the
//! `[compactor]` table of the TOML file, the `mira compactor` flags and
//! their `MIRA_*` variables. [`Settings::validate`] names the bad field and
//! rejects (never clamps); [`Settings::build`] makes the
//! [`CompactorConfig`] the compactor runs with.

use std::net::SocketAddr;

use mira_common::config::{ByteSize, ConfigError, Duration, positive};
use serde::{Deserialize, Serialize};

use crate::CompactorConfig;
use crate::planner::Rules;

/// A compactor's settings (see the module doc; defaults in `Default`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// HTTP listen address: /metrics, /ready, /live and the status API.
    pub listen: SocketAddr,
    /// Catalog members, comma separated host:port.
    pub catalog: String,
    /// Lease holder name; default: the host name. A process adds a fresh
    /// incarnation id, so a restarted compactor never reuses a lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compactor_id: Option<String>,
    /// Leased jobs at once.
    pub jobs: usize,
    /// Threads decoding, merging and encoding; default: the number of cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// Memory reserved across running jobs (a job reserves its estimate
    /// before it fetches anything).
    pub memory_limit: ByteSize,
    /// How often the compactor plans.
    pub plan_interval: Duration,
    /// Partition lease time to live (renewed every third of it).
    pub lease_ttl: Duration,
    /// Hot merges ignore blocks younger than this.
    pub min_block_age: Duration,
    /// Fewest blocks of one size level merged together.
    pub merge_factor: usize,
    /// Most input blocks of one job.
    pub max_inputs: usize,
    /// Hot blocks at least this big wait for the cold rewrite.
    pub mature_hot_bytes: ByteSize,
    /// Largest hot merge output.
    pub target_hot_bytes: ByteSize,
    /// Cold output aimed at.
    pub target_cold_bytes: ByteSize,
    /// Most hot-equivalent input of one job.
    pub max_job_bytes: ByteSize,
    /// An hour is rewritten cold this long after it ends...
    pub cold_after: Duration,
    /// ...and once nothing was published into it for this long.
    pub settle: Duration,
    /// Replaced blocks' objects are deleted this long after the swap
    /// (longer than the longest query: the querier's timeout).
    pub deletion_grace: Duration,
    /// Objects no catalog entry names are deleted once older than this
    /// (longer than an ingester keeps retrying a publish).
    pub orphan_grace: Duration,
    /// How often the orphan sweep lists the whole store.
    pub orphan_sweep_interval: Duration,
    /// Offload targets, `NAME=URL` (file:///abs/dir, s3://bucket/prefix,
    /// ...): the names offload policies use.
    pub offload_targets: Vec<String>,
    /// object_store options for the offload targets, `key=value`.
    pub offload_target_options: Vec<String>,
    /// Blocks created less than this long ago are never offloaded (a
    /// backfill stays in the primary store a while).
    pub offload_min_age: Duration,
    /// Blocks copied to a target at once.
    pub offload_concurrency: usize,
    /// Most bytes per second copied to targets (0: no limit).
    pub offload_rate: ByteSize,
    /// Most of the catalog's time that retention tombstones, offload and
    /// freed-primary marks and purges may take, in percent (1 to 100):
    /// after a command that took `d` the next waits `d × (100 − p) / p`.
    pub catalog_share_percent: u32,
    /// The CPU priority (nice, 0 to 19) `mira compactor` runs at, so its
    /// merges and copies yield the CPU to ingest on a shared machine;
    /// `mira serve`, where every role shares one process, leaves it alone.
    pub nice: i32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: SocketAddr::from(([0, 0, 0, 0], 7600)),
            catalog: "127.0.0.1:7400".to_owned(),
            compactor_id: None,
            jobs: 2,
            threads: None,
            memory_limit: ByteSize::gib(2),
            plan_interval: Duration::from_secs(30),
            lease_ttl: Duration::from_secs(60),
            min_block_age: Duration::from_secs(60),
            merge_factor: 8,
            max_inputs: 1000,
            mature_hot_bytes: ByteSize::mib(32),
            target_hot_bytes: ByteSize::mib(128),
            target_cold_bytes: ByteSize::mib(64),
            max_job_bytes: ByteSize::gib(1),
            cold_after: Duration::from_secs(3600),
            settle: Duration::from_secs(600),
            deletion_grace: Duration::from_secs(3600),
            orphan_grace: Duration::from_secs(24 * 3600),
            orphan_sweep_interval: Duration::from_secs(24 * 3600),
            offload_targets: Vec::new(),
            offload_target_options: Vec::new(),
            offload_min_age: Duration::from_secs(3600),
            offload_concurrency: 4,
            offload_rate: ByteSize::kib(0),
            catalog_share_percent: 10,
            nice: 10,
        }
    }
}

impl Settings {
    /// Checks every field; the first bad one is named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.catalog.split(',').all(|s| s.trim().is_empty()) {
            return Err(ConfigError::new("compactor.catalog", "no catalog member given"));
        }
        if let Some(id) = &self.compactor_id
            && (id.is_empty() || id.len() > 128 || id.contains('/') || id.chars().any(char::is_control))
        {
            return Err(ConfigError::new(
                "compactor.compactor_id",
                "1 to 128 characters, no '/' or control characters",
            ));
        }
        positive("compactor.jobs", self.jobs)?;
        if let Some(t) = self.threads {
            positive("compactor.threads", t)?;
        }
        positive("compactor.memory_limit", self.memory_limit.bytes())?;
        positive("compactor.plan_interval", self.plan_interval)?;
        if self.lease_ttl.get() < std::time::Duration::from_secs(3) {
            return Err(ConfigError::new("compactor.lease_ttl", "at least 3s"));
        }
        if self.merge_factor < 2 {
            return Err(ConfigError::new("compactor.merge_factor", "at least 2"));
        }
        if self.max_inputs < 2 || self.max_inputs > 10_000 {
            return Err(ConfigError::new(
                "compactor.max_inputs",
                "2 to 10000 (one catalog command)",
            ));
        }
        positive("compactor.mature_hot_bytes", self.mature_hot_bytes.bytes())?;
        if self.target_hot_bytes.bytes() < self.mature_hot_bytes.bytes() {
            return Err(ConfigError::new(
                "compactor.target_hot_bytes",
                "must be at least mature_hot_bytes",
            ));
        }
        positive("compactor.target_cold_bytes", self.target_cold_bytes.bytes())?;
        if self.max_job_bytes.bytes() < self.target_hot_bytes.bytes() {
            return Err(ConfigError::new(
                "compactor.max_job_bytes",
                "must be at least target_hot_bytes",
            ));
        }
        if self.memory_limit.bytes() < self.max_job_bytes.bytes() {
            return Err(ConfigError::new(
                "compactor.memory_limit",
                "must be at least max_job_bytes (one job must fit)",
            ));
        }
        positive("compactor.orphan_grace", self.orphan_grace)?;
        positive("compactor.orphan_sweep_interval", self.orphan_sweep_interval)?;
        positive("compactor.offload_concurrency", self.offload_concurrency)?;
        if !(1..=100).contains(&self.catalog_share_percent) {
            return Err(ConfigError::new("compactor.catalog_share_percent", "1 to 100"));
        }
        if !(0..=19).contains(&self.nice) {
            return Err(ConfigError::new("compactor.nice", "0 to 19"));
        }
        let options = self.target_options()?;
        let mut names = std::collections::BTreeSet::new();
        for spec in &self.offload_targets {
            let (name, url) =
                crate::targets::parse_spec(spec).map_err(|e| ConfigError::new("compactor.offload_targets", e))?;
            if !names.insert(name.clone()) {
                return Err(ConfigError::new(
                    "compactor.offload_targets",
                    format!("target {name:?} is named twice"),
                ));
            }
            mira_core::store::check_url(&url, &options)
                .map_err(|e| ConfigError::new("compactor.offload_targets", e.to_string()))?;
        }
        Ok(())
    }

    fn target_options(&self) -> Result<Vec<(String, String)>, ConfigError> {
        self.offload_target_options
            .iter()
            .map(|o| {
                o.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .ok_or_else(|| {
                        ConfigError::new("compactor.offload_target_options", format!("{o:?} is not key=value"))
                    })
            })
            .collect()
    }

    /// The compactor's configuration (validated first).
    pub fn build(&self) -> Result<CompactorConfig, ConfigError> {
        self.validate()?;
        let ns = |d: Duration| i64::try_from(d.get().as_nanos()).unwrap_or(i64::MAX);
        let id = self
            .compactor_id
            .clone()
            .unwrap_or_else(|| host_name().unwrap_or_else(|| "compactor".to_owned()));
        Ok(CompactorConfig {
            holder: format!("{id}/{}", mira_core::ids::BlockId::new()),
            jobs: self.jobs,
            threads: self
                .threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)),
            memory_limit: self.memory_limit.bytes(),
            plan_interval: self.plan_interval.get(),
            lease_ttl: self.lease_ttl.get(),
            orphan_grace_ns: ns(self.orphan_grace),
            orphan_sweep_interval: self.orphan_sweep_interval.get(),
            rules: Rules {
                min_block_age_ns: ns(self.min_block_age),
                merge_factor: self.merge_factor,
                max_inputs: self.max_inputs,
                mature_hot_bytes: self.mature_hot_bytes.bytes(),
                target_hot_bytes: self.target_hot_bytes.bytes(),
                target_cold_bytes: self.target_cold_bytes.bytes(),
                max_job_bytes: self.max_job_bytes.bytes(),
                cold_after_ns: ns(self.cold_after),
                settle_ns: ns(self.settle),
                deletion_grace_ns: ns(self.deletion_grace),
            },
            offload: crate::OffloadConfig {
                target_specs: self.offload_targets.clone(),
                target_options: self.target_options()?,
                min_age_ns: ns(self.offload_min_age),
                concurrency: self.offload_concurrency,
                rate_bytes: self.offload_rate.bytes(),
            },
            catalog_share_percent: self.catalog_share_percent,
            once: false,
            dry_run: false,
        })
    }
}

/// The machine's host name (`HOSTNAME`, else `/etc/hostname`), with no
/// '/' (it is part of a lease holder), if it has one.
pub(crate) fn host_name() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().replace('/', "-"))
        .filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_build_the_planner_defaults() {
        let c = Settings::default().build().expect("test step");
        assert_eq!(c.rules, Rules::default());
        assert_eq!(c.jobs, 2);
        assert!(c.holder.contains('/'));
        assert_ne!(
            c.holder,
            Settings::default().build().expect("test step").holder,
            "fresh incarnation"
        );
    }

    #[test]
    fn bad_values_name_their_field() {
        type Edit = fn(&mut Settings);
        let cases: [(&str, Edit); 12] = [
            ("compactor.catalog", |s| s.catalog = " , ".into()),
            ("compactor.compactor_id", |s| s.compactor_id = Some("a/b".into())),
            ("compactor.jobs", |s| s.jobs = 0),
            ("compactor.lease_ttl", |s| s.lease_ttl = Duration::from_secs(1)),
            ("compactor.merge_factor", |s| s.merge_factor = 1),
            ("compactor.max_inputs", |s| s.max_inputs = 20_000),
            ("compactor.target_hot_bytes", |s| s.target_hot_bytes = ByteSize::mib(1)),
            ("compactor.memory_limit", |s| s.memory_limit = ByteSize::mib(100)),
            ("compactor.catalog_share_percent", |s| s.catalog_share_percent = 0),
            ("compactor.catalog_share_percent", |s| s.catalog_share_percent = 101),
            ("compactor.nice", |s| s.nice = -1),
            ("compactor.nice", |s| s.nice = 20),
        ];
        for (field, edit) in cases {
            let mut s = Settings::default();
            edit(&mut s);
            assert_eq!(s.validate().expect_err(field).field, field);
        }
    }
}
