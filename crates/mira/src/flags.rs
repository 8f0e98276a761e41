//! Configuration of every role command, one way: defaults < the TOML file
//! (`--config`) < `MIRA_*` variables < flags. Each role's settings type
//! lives in its crate (`mira_catalog::Settings`, `mira_ingester::Settings`,
//! `mira_querier::settings::Settings`, `mira_compactor::settings::Settings`)
//! with its `validate()`; this module
//! holds the file's shape ([`FileConfig`]), the flags that override it, the
//! `[store]` table every role shares, `--check-config`, and the catalog
//! client.
//!
//! Durations and sizes are written one way (`30s`, `5m`, `64MiB`). The
//! flags with unit suffixes of earlier releases (`--seal-age-s 300`) are
//! kept, hidden, with their old units, for one release.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use mira_catalog::{CatalogClient, ClientConfig};
use mira_common::Process;
use mira_common::auth::AuthMode;
use mira_common::cluster::Dialer;
use mira_common::config::{ConfigError, Duration, read_toml, to_toml};
use mira_common::security::{Exposure, SecuritySettings};
use serde::{Deserialize, Serialize};

/// Overwrites each `$s.$field` with `$f.$field` where the flag (or its
/// variable) was given.
macro_rules! set_given {
    ($f:expr, $s:expr, $($field:ident),+ $(,)?) => {
        $(if let Some(v) = &$f.$field { $s.$field = v.clone(); })+
    };
}
pub(crate) use set_given;

/// Like [`set_given`], for settings that are themselves optional.
macro_rules! set_some {
    ($f:expr, $s:expr, $($field:ident),+ $(,)?) => {
        $(if $f.$field.is_some() { $s.$field.clone_from(&$f.$field); })+
    };
}

/// `--config` and `--check-config`, on every role command.
#[derive(Debug, Args)]
pub struct ConfigFlags {
    /// A TOML file of settings (tables [store], [catalog], [ingester],
    /// [querier], [compactor], [serve], [operator], [security]); variables and flags override it.
    #[arg(long, env = "MIRA_CONFIG")]
    pub config: Option<PathBuf>,
    /// Parse and validate everything, print the effective configuration as
    /// TOML and exit (non-zero on a bad value) without starting.
    #[arg(long)]
    pub check_config: bool,
}

impl ConfigFlags {
    /// The file's settings, or the defaults without a file.
    pub fn load(&self) -> Result<FileConfig, ConfigError> {
        match &self.config {
            Some(path) => read_toml(path),
            None => Ok(FileConfig::default()),
        }
    }
}

/// The `[serve]` table: what only `mira serve` has.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeSettings {
    /// Listen address of the embedded catalog member (local traffic only).
    pub catalog_listen: std::net::SocketAddr,
    /// Run the compactor in the process (off: blocks stay as sealed, e.g.
    /// to measure before and after a separate `mira compactor --once`).
    pub compactor: bool,
}

impl Default for ServeSettings {
    fn default() -> Self {
        ServeSettings {
            catalog_listen: std::net::SocketAddr::from(([127, 0, 0, 1], 7400)),
            compactor: true,
        }
    }
}

/// The configuration file: one table per role, all optional.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    pub store: StoreSettings,
    pub catalog: mira_catalog::Settings,
    pub ingester: mira_ingester::Settings,
    pub querier: mira_querier::settings::Settings,
    pub compactor: mira_compactor::settings::Settings,
    pub serve: ServeSettings,
    pub security: SecuritySettings,
    pub operator: mira_operator::Settings,
}

/// What a command prints for `--check-config`: the tables it uses.
#[derive(Debug, Default, Serialize)]
pub struct Effective<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<&'a StoreSettings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catalog: Option<&'a mira_catalog::Settings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingester: Option<&'a mira_ingester::Settings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub querier: Option<&'a mira_querier::settings::Settings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compactor: Option<&'a mira_compactor::settings::Settings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serve: Option<&'a ServeSettings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security: Option<&'a SecuritySettings>,
    pub operator: Option<&'a mira_operator::Settings>,
}

impl Effective<'_> {
    /// Prints the configuration (it reads back with `--config`).
    pub fn print(&self) {
        print!("{}", to_toml(self));
    }
}

/// The `[store]` table: where data lives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// The process's local data directory; each role keeps its files in a
    /// subdirectory: `catalog/`, `wal/` and `quarantine/` (ingester),
    /// `cache/` (querier), `objects/` (the default file object store).
    pub data_dir: PathBuf,
    /// Object store URL (file:///abs/dir, memory://, s3://bucket,
    /// gs://bucket, az://container); default: file://<data_dir>/objects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_store: Option<String>,
    /// object_store's configuration keys, e.g. aws_endpoint.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub object_store_options: BTreeMap<String, String>,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            data_dir: PathBuf::from("./data"),
            object_store: None,
            object_store_options: BTreeMap::new(),
        }
    }
}

impl StoreSettings {
    fn url(&self) -> Result<String, ConfigError> {
        let data_dir =
            std::path::absolute(&self.data_dir).map_err(|e| ConfigError::new("store.data_dir", e.to_string()))?;
        Ok(match &self.object_store {
            Some(u) => u.clone(),
            None => format!("file://{}", data_dir.join("objects").display()),
        })
    }

    fn options(&self) -> Vec<(String, String)> {
        self.object_store_options
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Checks the data directory and the object store URL and options
    /// (nothing is created or contacted).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::new("store.data_dir", "must not be empty"));
        }
        mira_core::store::check_url(&self.url()?, &self.options())
            .map_err(|e| ConfigError::new("store.object_store", e.to_string()))
    }

    /// The absolute data directory and the opened object store.
    pub fn open(&self) -> anyhow::Result<(PathBuf, Arc<dyn object_store::ObjectStore>)> {
        let data_dir = std::path::absolute(&self.data_dir)?;
        let store = mira_core::store::from_url(&self.url()?, &self.options())?;
        Ok((data_dir, store.store))
    }
}

/// Flags of the `[store]` table.
#[derive(Debug, Args)]
pub struct StoreFlags {
    /// Object store URL (file:///abs/dir, memory://, s3://bucket, gs://bucket, az://container); default: file://<data-dir>/objects.
    #[arg(long, env = "MIRA_OBJECT_STORE")]
    pub object_store: Option<String>,
    /// Object store option key=value (object_store's config keys, e.g. aws_endpoint=http://127.0.0.1:5000); repeatable.
    #[arg(
        long = "object-store-option",
        env = "MIRA_OBJECT_STORE_OPTIONS",
        value_delimiter = ','
    )]
    pub object_store_options: Vec<String>,
    #[command(flatten)]
    pub data: DataDirFlag,
}

/// `--data-dir`, which every role has.
#[derive(Debug, Args)]
pub struct DataDirFlag {
    /// Local data directory of the process (default ./data): catalog/,
    /// wal/, quarantine/, cache/ and, by default, objects/ live in it.
    #[arg(long, env = "MIRA_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

impl StoreFlags {
    pub fn apply(&self, s: &mut StoreSettings) -> Result<(), ConfigError> {
        if self.object_store.is_some() {
            s.object_store.clone_from(&self.object_store);
        }
        self.data.apply(s);
        for kv in self.object_store_options.iter().filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| ConfigError::new("store.object_store_options", format!("{kv:?} is not key=value")))?;
            s.object_store_options.insert(k.trim().to_owned(), v.trim().to_owned());
        }
        Ok(())
    }
}

impl DataDirFlag {
    pub fn apply(&self, s: &mut StoreSettings) {
        set_given!(self, s, data_dir);
    }
}

/// A catalog client for comma-separated member addresses, connecting
/// with `dialer` (TLS and the cluster credential).
pub fn catalog_client(members: &str, dialer: &Dialer) -> Arc<CatalogClient> {
    catalog_client_with(members, dialer, ClientConfig::default())
}

/// [`catalog_client`] with its own timeouts.
pub fn catalog_client_with(members: &str, dialer: &Dialer, config: ClientConfig) -> Arc<CatalogClient> {
    Arc::new(CatalogClient::new(
        members
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
        ClientConfig {
            dialer: dialer.clone(),
            ..config
        },
    ))
}

fn parse_auth(s: &str) -> Result<AuthMode, String> {
    s.parse()
}

/// How an internal client connects to the catalog and the ingesters:
/// every role, and the CLI tools that talk to the catalog.
#[derive(Debug, Args)]
pub struct ClusterFlags {
    /// The cluster secret, a file of at least 16 visible ASCII characters
    /// (e.g. `openssl rand -hex 32`): sent on every internal call, and
    /// required by the internal services (catalog, Raft, recent data).
    #[arg(long, env = "MIRA_CLUSTER_SECRET_FILE", global = true)]
    pub cluster_secret_file: Option<PathBuf>,
    /// CA of the internal servers' certificates: set, internal calls use TLS.
    #[arg(long, env = "MIRA_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// TLS certificate (PEM) of this process's ports, also presented as
    /// the client certificate of its internal calls; reloaded on change.
    #[arg(long, env = "MIRA_TLS_CERT", global = true)]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert; reloaded on change.
    #[arg(long, env = "MIRA_TLS_KEY", global = true)]
    pub tls_key: Option<PathBuf>,
}

impl ClusterFlags {
    pub fn apply(&self, s: &mut SecuritySettings) {
        set_some!(self, s, cluster_secret_file, tls_ca, tls_cert, tls_key);
    }

    /// The dialer of a CLI tool (no server of its own).
    pub fn dialer(&self) -> anyhow::Result<Dialer> {
        let mut s = SecuritySettings::default();
        self.apply(&mut s);
        let t = mira_common::telemetry::Telemetry::new();
        Ok(s.build(Exposure::Client, mira_common::clock::Clock::system(), &t)?
            .dialer)
    }
}

/// Who may use the process's ports (docs/security.md); every role.
#[derive(Debug, Args)]
pub struct SecurityFlags {
    /// Authentication of the external ports (OTLP, query APIs, compactor
    /// status): none, tokens (bearer tokens or basic auth with the token as
    /// password, from --auth-tokens-file) or trusted-header (X-Scope-OrgID
    /// only from --auth-trusted-proxies) [default: none].
    #[arg(long, env = "MIRA_AUTH", value_parser = parse_auth)]
    pub auth: Option<AuthMode>,
    /// The tokens file (TOML; SHA-256 of each token, its tenants and
    /// scopes); reloaded on change.
    #[arg(long, env = "MIRA_AUTH_TOKENS_FILE")]
    pub auth_tokens_file: Option<PathBuf>,
    /// Addresses or networks of the gateway whose X-Scope-OrgID is
    /// believed (--auth trusted-header), comma separated.
    #[arg(long, env = "MIRA_AUTH_TRUSTED_PROXIES", value_delimiter = ',')]
    pub auth_trusted_proxies: Vec<String>,
    /// Per-tenant limits (TOML: [defaults] and [tenants.<id>] with ingest
    /// rates and bursts, max_series, query concurrency and range; see
    /// docs/security.md); reloaded on change. None: unlimited.
    #[arg(long, env = "MIRA_LIMITS_FILE")]
    pub limits_file: Option<PathBuf>,
    /// How often the tokens, limits and TLS files are checked for changes [default: 5s].
    #[arg(long, env = "MIRA_RELOAD_INTERVAL")]
    pub reload_interval: Option<Duration>,
    /// Require client certificates signed by this CA (PEM) on every port.
    #[arg(long, env = "MIRA_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Client certificates signed by this CA (PEM) make the caller a
    /// cluster member on the internal services (mutual TLS instead of, or
    /// besides, the cluster secret).
    #[arg(long, env = "MIRA_CLUSTER_CA")]
    pub cluster_ca: Option<PathBuf>,
    /// Accept internal calls (catalog, Raft, recent data) without a
    /// cluster credential: anyone who reaches the ports is a member.
    #[arg(long, env = "MIRA_INSECURE_CLUSTER", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub insecure_cluster: Option<bool>,
    #[command(flatten)]
    pub cluster: ClusterFlags,
}

impl SecurityFlags {
    pub fn apply(&self, s: &mut SecuritySettings) {
        set_given!(self, s, reload_interval, insecure_cluster, auth);
        set_some!(self, s, tls_client_ca, cluster_ca, limits_file);
        if self.auth_tokens_file.is_some() {
            s.tokens_file.clone_from(&self.auth_tokens_file);
        }
        if !self.auth_trusted_proxies.is_empty() {
            s.trusted_proxies = self
                .auth_trusted_proxies
                .iter()
                .filter(|p| !p.trim().is_empty())
                .cloned()
                .collect();
        }
        self.cluster.apply(s);
    }
}

/// The process with its security built from `settings` (reading the
/// tokens, TLS and secret files, and following their changes).
pub fn secured(process: Process, settings: &SecuritySettings, exposure: Exposure) -> anyhow::Result<Process> {
    let security = settings.build(exposure, process.clock.clone(), &process.telemetry)?;
    Ok(process.with_security(security))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_is_the_defaults_and_the_defaults_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("mira.toml");
        std::fs::write(&p, "").expect("write");
        assert_eq!(read_toml::<FileConfig>(&p), Ok(FileConfig::default()));
        let all = FileConfig::default();
        std::fs::write(&p, to_toml(&all)).expect("write");
        assert_eq!(read_toml::<FileConfig>(&p), Ok(all));
    }

    #[test]
    fn unknown_tables_and_keys_are_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("mira.toml");
        for (text, word) in [
            ("[ingestor]\nseal_age = \"1m\"\n", "ingestor"),
            ("[ingester]\nseal_age_s = 300\n", "seal_age_s"),
            ("[querier]\nmax_query_range = \"a while\"\n", "a while"),
            ("[store]\ndata_dir = 3\n", "data_dir"),
        ] {
            std::fs::write(&p, text).expect("write");
            let e = read_toml::<FileConfig>(&p).expect_err(text);
            assert!(e.to_string().contains(word), "{text}: {e}");
        }
    }

    #[test]
    fn a_bad_object_store_is_named_without_creating_anything() {
        let mut s = StoreSettings {
            object_store: Some("ftp://host/x".to_owned()),
            ..StoreSettings::default()
        };
        let e = s.validate().expect_err("ftp");
        assert_eq!(e.field, "store.object_store");
        assert!(e.reason.contains("ftp"), "{e}");
        let dir = tempfile::tempdir().expect("tempdir");
        s.object_store = Some(format!("file://{}/objects", dir.path().display()));
        s.validate().expect("file store");
        assert!(!dir.path().join("objects").exists());
    }
}
