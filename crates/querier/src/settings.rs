//! What an operator configures for a querier ([`Settings`]): the
//! `[querier]` table of the TOML file, the `mira querier` flags and their
//! `MIRA_*` variables. [`Settings::validate`] names the bad field and
//! rejects (never clamps); [`Settings::build`] makes the
//! [`QuerierConfig`] the querier runs with.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use mira_common::config::{ByteSize, ConfigError, Duration, positive};
use serde::{Deserialize, Serialize};

use crate::QuerierConfig;

/// A querier's settings (see the module doc; defaults in `Default`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Query API listen address (also the probes).
    pub listen: SocketAddr,
    /// Catalog members, comma separated host:port.
    pub catalog: String,
    /// Block cache directory; default: `<data_dir>/cache`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<PathBuf>,
    /// Most bytes the block cache holds on disk.
    pub cache_size: ByteSize,
    /// Most bytes of decoded tables kept in memory, so repeated scans of a
    /// block skip decoding (0: none kept).
    pub decoded_cache_size: ByteSize,
    /// Most bytes of per-block query results kept in memory, so a repeated
    /// query skips evaluating its predicate on unchanged blocks (0: none).
    pub result_cache_size: ByteSize,
    /// Most concurrent range GETs to the object store.
    pub max_fetches: usize,
    /// Threads scanning blocks; default: the number of cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query_threads: Option<usize>,
    /// Most scan threads one tenant's queries hold at once; default: half
    /// of the query threads, rounded up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_query_threads: Option<usize>,
    /// Most blocks one query may read after pruning by time (then 422).
    pub max_query_blocks: usize,
    /// Longest time range one query may cover (then 422).
    pub max_query_range: Duration,
    /// Largest `limit` a query may ask for (then 422).
    pub max_query_limit: usize,
    /// Most series one PromQL query may select (then 422).
    pub max_query_series: usize,
    /// Most samples one PromQL query may load, over all its series, in
    /// the window it reads (then 422).
    pub max_query_samples: usize,
    /// Most spans of one trace a TraceQL search evaluates (then 422).
    pub max_spans_per_trace: usize,
    /// Most live tails (Loki `tail` WebSockets) at once, all tenants
    /// together (then 429).
    pub max_tails: usize,
    /// Longest a live tail runs before it is closed (1000, with the reason).
    pub tail_max_duration: Duration,
    /// Longest a live tail runs without a new line to send before it is
    /// closed (1000, with the reason).
    pub tail_idle_timeout: Duration,
    /// How long an ingester may take to return its recent data before the
    /// answer is marked partial.
    pub recent_timeout: Duration,
    /// Longest a query may run before it is cancelled and answered 504.
    pub query_timeout: Duration,
    /// Oldest the catalog copy's last update may be when a query is
    /// planned; older, the query waits for a fresh one, then answers 503.
    pub catalog_max_staleness: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: SocketAddr::from(([0, 0, 0, 0], 3100)),
            catalog: "127.0.0.1:7400".to_owned(),
            cache_dir: None,
            cache_size: ByteSize::gib(10),
            decoded_cache_size: ByteSize::gib(1),
            result_cache_size: ByteSize::mib(256),
            max_fetches: 32,
            query_threads: None,
            tenant_query_threads: None,
            max_query_blocks: 20_000,
            max_query_range: Duration::from_secs(744 * 3600),
            max_query_limit: 10_000,
            max_query_series: 500_000,
            max_query_samples: 50_000_000,
            max_spans_per_trace: 100_000,
            max_tails: 100,
            tail_max_duration: Duration::from_secs(3600),
            tail_idle_timeout: Duration::from_secs(600),
            recent_timeout: Duration::from_secs(2),
            query_timeout: Duration::from_secs(120),
            catalog_max_staleness: Duration::from_secs(15),
        }
    }
}

impl Settings {
    /// Checks every field; the first bad one is named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.catalog.split(',').all(|s| s.trim().is_empty()) {
            return Err(ConfigError::new("querier.catalog", "no catalog member given"));
        }
        positive("querier.max_fetches", self.max_fetches)?;
        if let Some(t) = self.query_threads {
            positive("querier.query_threads", t)?;
        }
        if let Some(t) = self.tenant_query_threads {
            positive("querier.tenant_query_threads", t)?;
        }
        positive("querier.max_query_blocks", self.max_query_blocks)?;
        positive("querier.max_query_range", self.max_query_range)?;
        positive("querier.max_query_limit", self.max_query_limit)?;
        positive("querier.max_query_series", self.max_query_series)?;
        positive("querier.max_query_samples", self.max_query_samples)?;
        positive("querier.max_spans_per_trace", self.max_spans_per_trace)?;
        positive("querier.max_tails", self.max_tails)?;
        positive("querier.tail_max_duration", self.tail_max_duration)?;
        positive("querier.tail_idle_timeout", self.tail_idle_timeout)?;
        positive("querier.recent_timeout", self.recent_timeout)?;
        positive("querier.query_timeout", self.query_timeout)?;
        positive("querier.catalog_max_staleness", self.catalog_max_staleness)?;
        Ok(())
    }

    /// The querier's configuration (validated first).
    pub fn build(&self, data_dir: &Path) -> Result<QuerierConfig, ConfigError> {
        self.validate()?;
        let mut c = QuerierConfig::new(self.cache_dir.clone().unwrap_or_else(|| data_dir.join("cache")));
        c.cache_bytes = self.cache_size.bytes();
        c.decoded_cache_bytes = self.decoded_cache_size.bytes();
        c.result_cache_bytes = self.result_cache_size.bytes();
        c.max_fetches = self.max_fetches;
        if let Some(t) = self.query_threads {
            c.threads = t;
        }
        c.tenant_threads = self.tenant_query_threads;
        c.max_blocks = self.max_query_blocks;
        c.max_range = self.max_query_range.get();
        c.max_limit = self.max_query_limit;
        c.max_series = self.max_query_series;
        c.max_samples = self.max_query_samples;
        c.max_spans_per_trace = self.max_spans_per_trace;
        c.max_tails = self.max_tails;
        c.tail_max_duration = self.tail_max_duration.get();
        c.tail_idle_timeout = self.tail_idle_timeout.get();
        c.recent_timeout = self.recent_timeout.get();
        c.query_timeout = self.query_timeout.get();
        c.max_staleness = self.catalog_max_staleness.get();
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_build_what_the_flags_used_to() {
        let c = Settings::default().build(Path::new("/data")).expect("defaults");
        assert_eq!(c.cache_dir, PathBuf::from("/data/cache"));
        assert_eq!(c.cache_bytes, 10 << 30);
        assert_eq!(c.decoded_cache_bytes, 1 << 30);
        assert_eq!(c.result_cache_bytes, 256 << 20);
        assert_eq!(c.max_range, std::time::Duration::from_secs(744 * 3600));
        assert_eq!((c.max_series, c.max_samples), (500_000, 50_000_000));
        assert_eq!(c.recent_timeout, std::time::Duration::from_secs(2));
        assert_eq!(c.query_timeout, std::time::Duration::from_secs(120));
        assert_eq!(c.max_staleness, std::time::Duration::from_secs(15));
    }

    #[test]
    fn zero_is_rejected_naming_the_field_not_clamped() {
        for (field, change) in [
            (
                "querier.recent_timeout",
                (|s: &mut Settings| s.recent_timeout = Duration::default()) as fn(&mut Settings),
            ),
            ("querier.max_query_range", |s| s.max_query_range = Duration::default()),
            ("querier.max_fetches", |s| s.max_fetches = 0),
            ("querier.query_threads", |s| s.query_threads = Some(0)),
            ("querier.max_query_limit", |s| s.max_query_limit = 0),
            ("querier.max_query_series", |s| s.max_query_series = 0),
            ("querier.max_query_samples", |s| s.max_query_samples = 0),
            ("querier.query_timeout", |s| s.query_timeout = Duration::default()),
            ("querier.catalog_max_staleness", |s| {
                s.catalog_max_staleness = Duration::default()
            }),
        ] {
            let mut s = Settings::default();
            change(&mut s);
            assert_eq!(s.build(Path::new("/d")).expect_err(field).field, field);
        }
    }
}
