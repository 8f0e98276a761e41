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
use mira_common::config::{ConfigError, read_toml, to_toml};
use serde::{Deserialize, Serialize};

/// Overwrites each `$s.$field` with `$f.$field` where the flag (or its
/// variable) was given.
macro_rules! set_given {
    ($f:expr, $s:expr, $($field:ident),+ $(,)?) => {
        $(if let Some(v) = &$f.$field { $s.$field = v.clone(); })+
    };
}
pub(crate) use set_given;

/// `--config` and `--check-config`, on every role command.
#[derive(Debug, Args)]
pub struct ConfigFlags {
    /// A TOML file of settings (tables [store], [catalog], [ingester],
    /// [querier], [compactor], [serve], [operator]); variables and flags override it.
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

/// A catalog client for comma-separated member addresses.
pub fn catalog_client(members: &str) -> Arc<CatalogClient> {
    Arc::new(CatalogClient::new(
        members
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
        ClientConfig::default(),
    ))
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
