//! Object stores built from a URL, for every role: `file:///abs/dir`,
//! `memory://`, and (when the cloud features are enabled) `s3://bucket`,
//! `gs://bucket`, `az://container`. Options are object_store's configuration
//! keys (`aws_endpoint`, `aws_region`, `aws_allow_http`, ...); for the cloud
//! schemes the standard environment variables (`AWS_*`, `GOOGLE_*`,
//! `AZURE_*`) are read first and options override them.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;

/// Why a store could not be built; names the URL.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid object store URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("object store {url:?}: {source}")]
    Build {
        url: String,
        #[source]
        source: object_store::Error,
    },
}

/// A store and the key prefix inside it that the URL names.
#[derive(Debug, Clone)]
pub struct Store {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: Path,
}

/// Builds the store `url` names. `file://` directories are created.
pub fn from_url(url: &str, options: &[(String, String)]) -> Result<Store, StoreError> {
    open_url(url, options, true)
}

/// Checks that `url` and `options` make a store, without creating
/// anything or connecting (what `--check-config` runs).
pub fn check_url(url: &str, options: &[(String, String)]) -> Result<(), StoreError> {
    open_url(url, options, false).map(|_| ())
}

fn open_url(url: &str, options: &[(String, String)], create: bool) -> Result<Store, StoreError> {
    let bad = |reason: String| StoreError::Url {
        url: url.chars().take(256).collect(),
        reason,
    };
    let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    if parsed.scheme() == "file" {
        let dir = parsed
            .to_file_path()
            .map_err(|()| bad("not an absolute file path".to_owned()))?;
        if !create {
            return Ok(Store {
                store: Arc::new(object_store::memory::InMemory::new()),
                prefix: Path::default(),
            });
        }
        std::fs::create_dir_all(&dir).map_err(|e| bad(format!("create {}: {e}", dir.display())))?;
        let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir).map_err(|source| StoreError::Build {
            url: url.to_owned(),
            source,
        })?;
        return Ok(Store {
            store: Arc::new(fs),
            prefix: Path::default(),
        });
    }
    let mut opts: Vec<(String, String)> = Vec::new();
    let env_prefix = match parsed.scheme() {
        "s3" | "s3a" => Some("AWS_"),
        "gs" => Some("GOOGLE_"),
        "az" | "abfs" | "abfss" | "azure" => Some("AZURE_"),
        "memory" => None,
        other => {
            return Err(bad(format!(
                "unsupported scheme {other:?}: use file, memory, s3, gs or az"
            )));
        }
    };
    if let Some(prefix) = env_prefix {
        for (k, v) in std::env::vars() {
            if k.starts_with(prefix) {
                opts.push((k.to_ascii_lowercase(), v));
            }
        }
    }
    opts.extend(options.iter().cloned());
    let (store, prefix) = object_store::parse_url_opts(&parsed, opts).map_err(|source| StoreError::Build {
        url: url.to_owned(),
        source,
    })?;
    Ok(Store {
        store: Arc::from(store),
        prefix,
    })
}

/// Part size of multipart uploads (S3's minimum is 5 MiB).
pub const PART_BYTES: usize = 8 << 20;

/// Writes `bytes` to `path` in one attempt: a single put, or a multipart
/// upload (parts of [`PART_BYTES`]) when larger than `multipart_above`,
/// completed only when every part is written (aborted otherwise). Either
/// way the object appears whole or not at all.
pub async fn put_whole(
    store: &dyn ObjectStore,
    path: &Path,
    bytes: &bytes::Bytes,
    multipart_above: usize,
) -> object_store::Result<()> {
    use object_store::ObjectStoreExt;
    if bytes.len() <= multipart_above {
        return store
            .put(path, object_store::PutPayload::from(bytes.clone()))
            .await
            .map(|_| ());
    }
    let upload = store.put_multipart(path).await?;
    let mut w = object_store::WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
    w.put(bytes.clone());
    w.finish().await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;

    use super::*;

    #[tokio::test]
    async fn file_and_memory_stores_work() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("file://{}/objects", dir.path().display());
        let s = from_url(&url, &[]).expect("file store");
        let p = Path::from("a/b.mira");
        s.store
            .put(&p, bytes::Bytes::from_static(b"x").into())
            .await
            .expect("put");
        assert!(dir.path().join("objects/a/b.mira").exists());
        let m = from_url("memory://", &[]).expect("memory store");
        m.store
            .put(&p, bytes::Bytes::from_static(b"y").into())
            .await
            .expect("put");
        let got = m.store.get(&p).await.expect("get").bytes().await.expect("bytes");
        assert_eq!(&got[..], b"y");
    }

    #[test]
    fn bad_urls_are_named() {
        for (url, needle) in [
            ("not a url", "invalid object store URL"),
            ("ftp://x/y", "unsupported scheme"),
            ("file://relative/path", "absolute"),
        ] {
            let err = from_url(url, &[]).expect_err(url).to_string();
            assert!(err.contains(needle), "{url}: {err}");
        }
    }
}
