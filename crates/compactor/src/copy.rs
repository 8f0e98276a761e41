//! Copying a block object between stores, hashed on the way: the offload
//! (primary → target) and the restore (target → primary) are the same
//! copy. The object is read whole (blocks are at most a few hundred MiB and
//! copies run a few at a time), hashed with SHA-256, and written with one
//! put (multipart above 8 MiB), so the destination holds all of it or
//! nothing. Retries follow the compactor's one policy
//! ([`crate::job::with_retries`]). A [`RateLimit`] spreads copies over
//! time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::job::with_retries;

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// What one copy moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Copied {
    pub bytes: u64,
    pub sha256: String,
}

/// Reads `src` whole, hashes it, checks it against `expect` (bytes and,
/// when given, SHA-256) before writing anything, and writes it to `dst`.
/// A mismatch writes nothing and is [`Error::CopyMismatch`].
pub async fn copy_object(
    from: (&Arc<dyn ObjectStore>, &Path),
    to: (&Arc<dyn ObjectStore>, &Path),
    expect: (u64, Option<&str>),
    rate: &RateLimit,
) -> Result<Copied, Error> {
    let (src, src_path) = from;
    let (dst, dst_path) = to;
    let data: Bytes = with_retries("GET", src_path, || async { src.get(src_path).await?.bytes().await }).await?;
    let sha256 = sha256_hex(&data);
    let (bytes, want_sha) = expect;
    if data.len() as u64 != bytes || want_sha.is_some_and(|w| w != sha256) {
        return Err(Error::CopyMismatch {
            key: src_path.to_string(),
            reason: format!(
                "{} bytes with SHA-256 {sha256}, the catalog records {bytes} bytes{}",
                data.len(),
                want_sha.map(|w| format!(" with SHA-256 {w}")).unwrap_or_default()
            ),
        });
    }
    rate.take(data.len() as u64).await;
    with_retries("PUT", dst_path, || {
        mira_core::store::put_whole(dst.as_ref(), dst_path, &data, mira_core::store::PART_BYTES)
    })
    .await?;
    Ok(Copied {
        bytes: data.len() as u64,
        sha256,
    })
}

/// The size of `path` in `store`, `None` when absent.
pub async fn object_size(store: &Arc<dyn ObjectStore>, path: &Path) -> Result<Option<u64>, Error> {
    match store.head(path).await {
        Ok(meta) => Ok(Some(meta.size)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(source) => Err(Error::Store {
            op: "HEAD",
            key: path.to_string(),
            source,
        }),
    }
}

/// A shared byte-rate limit (0: none): each copy waits until the bytes
/// before it fit the rate.
#[derive(Debug)]
pub struct RateLimit {
    bytes_per_s: u64,
    next_free: tokio::sync::Mutex<Instant>,
}

impl RateLimit {
    pub fn new(bytes_per_s: u64) -> RateLimit {
        RateLimit {
            bytes_per_s,
            next_free: tokio::sync::Mutex::new(Instant::now()),
        }
    }

    /// Waits for `bytes` of the budget.
    pub async fn take(&self, bytes: u64) {
        if self.bytes_per_s == 0 {
            return;
        }
        let start = {
            let mut next = self.next_free.lock().await;
            let start = (*next).max(Instant::now());
            *next = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_s as f64);
            start
        };
        tokio::time::sleep_until(start.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_copy_is_hashed_checked_and_whole() {
        let a: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let b: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let p = Path::from("t/logs/x.mira");
        a.put(&p, Bytes::from_static(b"block bytes").into()).await.expect("put");
        let none = RateLimit::new(0);
        let c = copy_object((&a, &p), (&b, &p), (11, None), &none).await.expect("copy");
        assert_eq!(c.sha256, sha256_hex(b"block bytes"));
        assert_eq!(object_size(&b, &p).await.expect("head"), Some(11));
        // A wrong size or hash writes nothing.
        let q = Path::from("t/logs/y.mira");
        assert!(copy_object((&a, &p), (&b, &q), (12, None), &none).await.is_err());
        assert!(
            copy_object((&a, &p), (&b, &q), (11, Some(&sha256_hex(b"other"))), &none)
                .await
                .is_err()
        );
        assert_eq!(object_size(&b, &q).await.expect("head"), None);
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
