//! Flags and helpers every role command shares: where data lives (the
//! data directory and the object store) and the catalog client.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use mira_catalog::{CatalogClient, ClientConfig};

/// Where data lives: the local data directory and the object store.
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
    /// Local data directory: the WAL, the query cache and (by default) the file object store.
    #[arg(long, env = "MIRA_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
}

impl StoreFlags {
    /// The absolute data directory and the opened object store.
    pub fn open(&self) -> anyhow::Result<(PathBuf, Arc<dyn object_store::ObjectStore>)> {
        let data_dir = std::path::absolute(&self.data_dir)?;
        let url = match &self.object_store {
            Some(u) => u.clone(),
            None => format!("file://{}", data_dir.join("objects").display()),
        };
        let store = mira_core::store::from_url(&url, &options(&self.object_store_options)?)?;
        Ok((data_dir, store.store))
    }
}

fn options(raw: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    raw.iter()
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .ok_or_else(|| anyhow::anyhow!("object-store-option {s:?} is not key=value"))
        })
        .collect()
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
