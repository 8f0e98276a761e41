//! Per-tenant limits (`--limits-file`, docs/security.md "Per-tenant
//! limits"): ingest records/s and bytes/s with bursts, active metric
//! series per tenant (per ingester), query concurrency and query range,
//! and Loki push's stream and line rules.
//! One file gives `[defaults]` and `[tenants.<id>]` overrides; a key a
//! tenant does not set falls back to `[defaults]`, and a key nobody sets is
//! 0 = unlimited (the Loki rules: Loki's defaults). Without a file
//! everything is unlimited but the Loki rules, at Loki's defaults.
//!
//! The file is read again when it changes ([`crate::watch`], like the
//! tokens file); a file that no longer parses keeps the limits in use,
//! logs why and counts `mira_limits_reload_errors_total`. At start a bad
//! file refuses to start, naming the field.
//!
//! Ingest rates are token buckets on the process [`Clock`] (so tests move
//! time): the bucket holds `burst` tokens (1 s of the rate when no burst is
//! given) and refills at the rate. A request takes all its tokens or none;
//! a request larger than the whole burst is let through only when the
//! bucket is full and leaves it in debt, so the long-run rate holds and a
//! large request is not refused forever. A refusal says when enough
//! tokens will be there ([`Refusal::retry_after`]).
//!
//! Each tenant's state has its own lock: a tenant at its limit is refused
//! after one short critical section and never waits for another tenant.
//! Refusals are counted in `mira_limits_refusals_total{kind}` without a
//! tenant label (no metric has one, see docs/security.md).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use mira_core::ids::TenantId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Deserialize;

use crate::clock::Clock;
use crate::config::{ByteSize, Duration};
use crate::error::{ErrorCode, ServiceError};

/// Largest limits file read.
pub const MAX_LIMITS_FILE: u64 = 4 << 20;

/// One table of the file: `[defaults]` or `[tenants.<id>]`. Keys left out
/// fall back (a tenant's to `[defaults]`, the defaults' to 0).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitTable {
    pub ingest_records_per_second: Option<u64>,
    pub ingest_records_burst: Option<u64>,
    pub ingest_bytes_per_second: Option<ByteSize>,
    pub ingest_bytes_burst: Option<ByteSize>,
    pub max_series: Option<u64>,
    pub max_query_concurrency: Option<u64>,
    pub max_query_range: Option<Duration>,
    /// Loki push: most labels a stream may have (Loki's
    /// `max_label_names_per_series`); unset is Loki's 15, 0 is no limit.
    pub loki_max_label_names_per_series: Option<u64>,
    /// Loki push: longest line (Loki's `max_line_size`); unset is Loki's
    /// 256 KiB, 0 is no limit beyond the request's.
    pub loki_max_line_size: Option<ByteSize>,
}

/// Loki's `max_label_names_per_series` default.
pub const LOKI_MAX_LABEL_NAMES: u64 = 15;
/// Loki's `max_line_size` default (256 KiB).
pub const LOKI_MAX_LINE_BYTES: u64 = 256 * 1024;

/// The file's shape.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FileShape {
    defaults: LimitTable,
    tenants: BTreeMap<String, LimitTable>,
}

/// One tenant's effective limits; 0 is unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantLimits {
    pub records_per_second: u64,
    /// Bucket size; never 0 when the rate is set.
    pub records_burst: u64,
    pub bytes_per_second: u64,
    pub bytes_burst: u64,
    pub max_series: u64,
    pub max_query_concurrency: u64,
    pub max_query_range: std::time::Duration,
    pub loki_max_label_names: u64,
    pub loki_max_line_bytes: u64,
}

/// Unlimited, but for Loki's stream and line rules at Loki's defaults.
impl Default for TenantLimits {
    fn default() -> TenantLimits {
        TenantLimits {
            records_per_second: 0,
            records_burst: 0,
            bytes_per_second: 0,
            bytes_burst: 0,
            max_series: 0,
            max_query_concurrency: 0,
            max_query_range: std::time::Duration::ZERO,
            loki_max_label_names: LOKI_MAX_LABEL_NAMES,
            loki_max_line_bytes: LOKI_MAX_LINE_BYTES,
        }
    }
}

impl TenantLimits {
    /// `over` on top of `base`, checked; `at` names the table for errors.
    fn resolve(base: &LimitTable, over: &LimitTable, at: &str) -> Result<TenantLimits, LimitsFileError> {
        macro_rules! pick {
            ($f:ident) => {
                over.$f.or(base.$f)
            };
        }
        let records_per_second = pick!(ingest_records_per_second).unwrap_or(0);
        let records_burst = pick!(ingest_records_burst).unwrap_or(0);
        let bytes_per_second = pick!(ingest_bytes_per_second).map_or(0, ByteSize::bytes);
        let bytes_burst = pick!(ingest_bytes_burst).map_or(0, ByteSize::bytes);
        for (set, rate, field) in [
            (records_burst, records_per_second, "ingest_records_burst"),
            (bytes_burst, bytes_per_second, "ingest_bytes_burst"),
        ] {
            if set > 0 && rate == 0 {
                return Err(LimitsFileError::Invalid {
                    field: format!("{at}.{field}"),
                    reason: "a burst needs a rate (the matching _per_second key)".to_owned(),
                });
            }
        }
        Ok(TenantLimits {
            records_per_second,
            records_burst: if records_burst == 0 {
                records_per_second
            } else {
                records_burst
            },
            bytes_per_second,
            bytes_burst: if bytes_burst == 0 {
                bytes_per_second
            } else {
                bytes_burst
            },
            max_series: pick!(max_series).unwrap_or(0),
            max_query_concurrency: pick!(max_query_concurrency).unwrap_or(0),
            max_query_range: pick!(max_query_range).map_or(std::time::Duration::ZERO, Duration::get),
            loki_max_label_names: pick!(loki_max_label_names_per_series).unwrap_or(LOKI_MAX_LABEL_NAMES),
            loki_max_line_bytes: pick!(loki_max_line_size).map_or(LOKI_MAX_LINE_BYTES, ByteSize::bytes),
        })
    }
}

/// Why a limits file was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitsFileError {
    #[error("limits file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("limits file: {0}")]
    Parse(String),
    #[error("limits file: {field}: {reason}")]
    Invalid { field: String, reason: String },
}

/// A parsed limits file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LimitsFile {
    defaults: TenantLimits,
    tenants: HashMap<TenantId, TenantLimits>,
}

impl LimitsFile {
    /// Parses the TOML text of a limits file.
    pub fn parse(text: &str) -> Result<LimitsFile, LimitsFileError> {
        let shape: FileShape = toml::from_str(text).map_err(|e| LimitsFileError::Parse(e.to_string()))?;
        let defaults = TenantLimits::resolve(&LimitTable::default(), &shape.defaults, "defaults")?;
        let mut tenants = HashMap::new();
        for (name, table) in &shape.tenants {
            let at = format!("tenants.{name}");
            let id = TenantId::new(name).map_err(|e| LimitsFileError::Invalid {
                field: at.clone(),
                reason: e.to_string(),
            })?;
            tenants.insert(id, TenantLimits::resolve(&shape.defaults, table, &at)?);
        }
        Ok(LimitsFile { defaults, tenants })
    }

    /// Reads and parses `path` (at most [`MAX_LIMITS_FILE`] bytes).
    pub fn load(path: &Path) -> Result<LimitsFile, LimitsFileError> {
        let err = |reason: String| LimitsFileError::Read {
            path: path.display().to_string(),
            reason,
        };
        let len = std::fs::metadata(path).map_err(|e| err(e.to_string()))?.len();
        if len > MAX_LIMITS_FILE {
            return Err(err(format!("{len} bytes, more than the {MAX_LIMITS_FILE} allowed")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        LimitsFile::parse(&text)
    }

    /// `tenant`'s limits: its own table over the defaults.
    pub fn get(&self, tenant: &TenantId) -> TenantLimits {
        self.tenants.get(tenant).copied().unwrap_or(self.defaults)
    }
}

/// What a refusal is about (the `kind` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Records,
    Bytes,
    Series,
    QueryConcurrency,
    QueryRange,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Records => "records",
            Kind::Bytes => "bytes",
            Kind::Series => "series",
            Kind::QueryConcurrency => "query_concurrency",
            Kind::QueryRange => "query_range",
        }
    }
}

/// A request refused by its tenant's limits. Naming the limit tells the
/// caller only its own tenant's configuration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// 429 / RESOURCE_EXHAUSTED with a retry hint.
    #[error(
        "tenant {tenant} is over its ingest limit of {rate} {unit}/s (burst {burst}): this request needs {asked}; retry in {retry_after_s} s"
    )]
    Rate {
        tenant: String,
        unit: &'static str,
        rate: u64,
        burst: u64,
        asked: u64,
        retry_after_s: u64,
    },
    /// 429 with a retry hint.
    #[error(
        "tenant {tenant} already runs its limit of {limit} concurrent queries (max_query_concurrency); retry shortly"
    )]
    QueryConcurrency { tenant: String, limit: u64 },
    /// 400: the same query will never pass.
    #[error(
        "the query time range exceeds the limit of tenant {tenant} (query length: {}, limit: {}, max_query_range)",
        human(.asked),
        human(.limit)
    )]
    QueryRange {
        tenant: String,
        asked: std::time::Duration,
        limit: std::time::Duration,
    },
}

fn human(d: &std::time::Duration) -> humantime::FormattedDuration {
    humantime::format_duration(*d)
}

impl Refusal {
    /// When to try again (whole seconds, for `Retry-After` and RetryInfo);
    /// `None` when retrying cannot help.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Refusal::Rate { retry_after_s, .. } => Some(std::time::Duration::from_secs(*retry_after_s)),
            Refusal::QueryConcurrency { .. } => Some(std::time::Duration::from_secs(1)),
            Refusal::QueryRange { .. } => None,
        }
    }
}

impl ServiceError for Refusal {
    fn error_code(&self) -> ErrorCode {
        match self {
            Refusal::Rate { .. } | Refusal::QueryConcurrency { .. } => ErrorCode::Overloaded,
            Refusal::QueryRange { .. } => ErrorCode::BadRequest,
        }
    }
}

/// A token bucket; starts full.
#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    tokens: f64,
    last: Option<SystemTime>,
}

impl Bucket {
    fn refill(&mut self, rate: u64, burst: u64, now: SystemTime) {
        let cap = burst as f64;
        self.tokens = match self.last {
            None => cap,
            Some(last) => {
                let dt = now.duration_since(last).unwrap_or_default().as_secs_f64();
                (self.tokens + dt * rate as f64).min(cap)
            }
        };
        // A clock that went back refills nothing and keeps the later mark.
        if self.last.is_none_or(|l| now > l) {
            self.last = Some(now);
        }
    }

    /// Takes `n` tokens, or says in how many whole seconds it could.
    fn take(&mut self, n: u64, rate: u64, burst: u64, now: SystemTime) -> Result<(), u64> {
        self.refill(rate, burst, now);
        let (n, cap) = (n as f64, burst as f64);
        if n <= self.tokens || (n > cap && self.tokens >= cap) {
            self.tokens -= n;
            return Ok(());
        }
        let missing = n.min(cap) - self.tokens;
        Err(((missing / rate as f64).ceil() as u64).max(1))
    }

    fn give_back(&mut self, n: u64, burst: u64) {
        self.tokens = (self.tokens + n as f64).min(burst as f64);
    }
}

#[derive(Debug, Default)]
struct TenantState {
    records: Mutex<Bucket>,
    bytes: Mutex<Bucket>,
    queries: AtomicU64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// `mira_limits_*`.
#[derive(Debug, Default)]
struct Metrics {
    refusals: Family<KindLabels, Counter>,
    reload_errors: Counter,
}

/// The process's per-tenant limits (share it as `Arc<Limiter>`).
#[derive(Debug)]
pub struct Limiter {
    /// False only for [`Limiter::unlimited`]: nothing is counted.
    enabled: bool,
    path: Option<PathBuf>,
    file: RwLock<Arc<LimitsFile>>,
    state: RwLock<HashMap<TenantId, Arc<TenantState>>>,
    clock: Clock,
    metrics: Metrics,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Limiter {
    /// No limits (no `--limits-file`; tests running roles in process).
    pub fn unlimited() -> Arc<Limiter> {
        Arc::new(Limiter {
            enabled: false,
            ..Limiter::with_file(None, LimitsFile::default(), Clock::system())
        })
    }

    /// Limits from `file` as given (tests).
    pub fn with_file(path: Option<PathBuf>, file: LimitsFile, clock: Clock) -> Limiter {
        Limiter {
            enabled: true,
            path,
            file: RwLock::new(Arc::new(file)),
            state: RwLock::new(HashMap::new()),
            clock,
            metrics: Metrics::default(),
        }
    }

    /// Reads `path` (a bad file refuses, naming the field) and registers
    /// `mira_limits_*` in `telemetry`. Call [`Limiter::watch`] to follow
    /// changes.
    pub fn load(
        path: &Path,
        clock: Clock,
        telemetry: &crate::telemetry::Telemetry,
    ) -> Result<Arc<Limiter>, LimitsFileError> {
        let file = LimitsFile::load(path)?;
        let limiter = Limiter::with_file(Some(path.to_owned()), file, clock);
        telemetry.register("limits", |r| {
            r.register(
                "refusals",
                "Requests refused by per-tenant limits, by kind",
                limiter.metrics.refusals.clone(),
            );
            r.register(
                "reload_errors",
                "Changes of the limits file that were not taken (the previous limits stay in use)",
                limiter.metrics.reload_errors.clone(),
            );
        });
        Ok(Arc::new(limiter))
    }

    /// Reads the file again when it changes (checked every `every`).
    pub fn watch(self: &Arc<Self>, every: std::time::Duration) -> Option<tokio::task::JoinHandle<()>> {
        let path = self.path.clone()?;
        let weak = Arc::downgrade(self);
        Some(crate::watch::spawn_poll(vec![path], every, move || {
            weak.upgrade().map(|l| l.reload()).is_some()
        }))
    }

    /// Reads the file now; `true` when the new limits are in use. A bad
    /// file keeps the previous limits, logs why and counts
    /// `mira_limits_reload_errors_total`.
    pub fn reload(&self) -> bool {
        let Some(path) = &self.path else {
            return true;
        };
        match LimitsFile::load(path) {
            Ok(new) => {
                *self.file.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(new);
                tracing::info!(target: "mira::limits", path = %path.display(), "limits file reloaded");
                true
            }
            Err(e) => {
                self.metrics.reload_errors.inc();
                tracing::error!(target: "mira::limits", error = %e, "limits file not reloaded; the previous limits stay in use");
                false
            }
        }
    }

    /// False without a limits file: nothing needs counting.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// `tenant`'s limits now.
    pub fn get(&self, tenant: &TenantId) -> TenantLimits {
        self.file
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(tenant)
    }

    fn state(&self, tenant: &TenantId) -> Arc<TenantState> {
        if let Some(s) = self
            .state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(tenant)
        {
            return s.clone();
        }
        self.state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(tenant.clone())
            .or_default()
            .clone()
    }

    fn refused(&self, kind: Kind) {
        self.metrics
            .refusals
            .get_or_create(&KindLabels { kind: kind.as_str() })
            .inc();
    }

    /// Counts a refusal decided elsewhere (the series limit).
    pub fn count_refusal(&self, kind: Kind, n: u64) {
        if n > 0 {
            self.metrics
                .refusals
                .get_or_create(&KindLabels { kind: kind.as_str() })
                .inc_by(n);
        }
    }

    fn take(&self, tenant: &TenantId, kind: Kind, n: u64) -> Result<(), Refusal> {
        let l = self.get(tenant);
        let (rate, burst, unit) = match kind {
            Kind::Records => (l.records_per_second, l.records_burst, "records"),
            Kind::Bytes => (l.bytes_per_second, l.bytes_burst, "bytes"),
            _ => return Ok(()),
        };
        if rate == 0 {
            return Ok(());
        }
        let state = self.state(tenant);
        let bucket = if kind == Kind::Records {
            &state.records
        } else {
            &state.bytes
        };
        let taken = lock(bucket).take(n, rate, burst, self.clock.now());
        taken.map_err(|retry_after_s| {
            self.refused(kind);
            Refusal::Rate {
                tenant: tenant.to_string(),
                unit,
                rate,
                burst,
                asked: n,
                retry_after_s,
            }
        })
    }

    /// Takes `n` bytes of `tenant`'s ingest rate (all or none).
    pub fn take_bytes(&self, tenant: &TenantId, n: u64) -> Result<(), Refusal> {
        self.take(tenant, Kind::Bytes, n)
    }

    /// Takes `n` records of `tenant`'s ingest rate (all or none).
    pub fn take_records(&self, tenant: &TenantId, n: u64) -> Result<(), Refusal> {
        self.take(tenant, Kind::Records, n)
    }

    /// Returns bytes taken for a request refused later (so a refused
    /// request consumes nothing).
    pub fn give_back_bytes(&self, tenant: &TenantId, n: u64) {
        let l = self.get(tenant);
        if l.bytes_per_second > 0 {
            lock(&self.state(tenant).bytes).give_back(n, l.bytes_burst);
        }
    }

    /// Returns records taken for a request that was then not accepted.
    pub fn give_back_records(&self, tenant: &TenantId, n: u64) {
        let l = self.get(tenant);
        if l.records_per_second > 0 {
            lock(&self.state(tenant).records).give_back(n, l.records_burst);
        }
    }

    /// A query slot of `tenant`, held until the guard drops, or the
    /// refusal when it already runs `max_query_concurrency` queries.
    pub fn enter_query(&self, tenant: &TenantId) -> Result<QueryGuard, Refusal> {
        let limit = self.get(tenant).max_query_concurrency;
        let state = self.state(tenant);
        let before = state.queries.fetch_add(1, Ordering::AcqRel);
        let guard = QueryGuard(state);
        if limit > 0 && before >= limit {
            drop(guard);
            self.refused(Kind::QueryConcurrency);
            return Err(Refusal::QueryConcurrency {
                tenant: tenant.to_string(),
                limit,
            });
        }
        Ok(guard)
    }

    /// Checks a query's time range against `tenant`'s `max_query_range`.
    /// The tenant's `max_query_range`, when it has one.
    pub fn max_query_range(&self, tenant: &TenantId) -> Option<std::time::Duration> {
        let limit = self.get(tenant).max_query_range;
        (!limit.is_zero()).then_some(limit)
    }

    pub fn check_range(&self, tenant: &TenantId, asked: std::time::Duration) -> Result<(), Refusal> {
        let limit = self.get(tenant).max_query_range;
        if !limit.is_zero() && asked > limit {
            self.refused(Kind::QueryRange);
            return Err(Refusal::QueryRange {
                tenant: tenant.to_string(),
                asked,
                limit,
            });
        }
        Ok(())
    }
}

/// A running query of a tenant; gives its slot back when dropped.
#[derive(Debug)]
pub struct QueryGuard(Arc<TenantState>);

impl Drop for QueryGuard {
    fn drop(&mut self) {
        self.0.queries.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests;
