//! Copying a block object between stores, hashed on the way: the offload
//! (primary → target) and the restore (target → primary) are the same
//! copy. The object is read whole (blocks are at most a few hundred MiB and
//! copies run a few at a time), hashed with SHA-256, and written with one
//! put (multipart above 8 MiB), so the destination holds all of it or
//! nothing. Retries follow the compactor's one policy
//! ([`crate::job::with_retries`]). A [`RateLimit`] spreads copies over
//! time.
//!
//! [`verify_object`] proves a copy's content: it reads the object back
//! (streamed, so it holds one chunk at a time) and compares its length
//! and SHA-256 with what the catalog records (the hash of the bytes read
//! from the source at offload). A SHA-256 and not the block's own
//! per-section CRC32s: the hash is already recorded for every copy (no
//! format change), it proves the copy is *this* block and not just some
//! well-formed one, it streams where a block check needs the whole object
//! in memory, and either way the cost is the GET (SHA-256 hashes faster
//! than an object store serves bytes).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::job::with_retries;

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    let mut out = String::with_capacity(2 * digest.len());
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

/// Why a copy failed its content check ([`verify_object`]); the `reason`
/// label of `mira_compactor_offload_verify_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unproven {
    /// No object at the path.
    Missing,
    /// An object of another length (truncated, or something else).
    Size,
    /// The right length, another SHA-256 (bytes changed).
    Content,
    /// The store did not serve it (after the retries).
    Unreadable,
}

impl Unproven {
    pub fn as_str(self) -> &'static str {
        match self {
            Unproven::Missing => "missing",
            Unproven::Size => "size",
            Unproven::Content => "content",
            Unproven::Unreadable => "unreadable",
        }
    }
}

/// A copy that failed its content check: why, and the detail for logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckFailed {
    pub reason: Unproven,
    pub detail: String,
}

impl CheckFailed {
    /// The failure as a copy mismatch of `key`.
    pub fn into_error(self, key: &str) -> Error {
        Error::CopyMismatch {
            key: key.to_owned(),
            reason: self.detail,
        }
    }
}

impl std::fmt::Display for CheckFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

/// Reads `path` back from `store` and checks that it is `expect` (its
/// length in bytes and SHA-256, lowercase hex): the content proof of a
/// copy (see the module doc). Reading stops at the first byte past the
/// expected length. Transient store errors are retried as every request
/// is.
pub async fn verify_object(store: &Arc<dyn ObjectStore>, path: &Path, expect: (u64, &str)) -> Result<(), CheckFailed> {
    let (bytes, want_sha) = expect;
    // `Some(n)`: a length other than expected (reading stopped there).
    let read = with_retries("GET", path, || async {
        let got = store.get(path).await?;
        if got.meta.size != bytes {
            return Ok((Some(got.meta.size), String::new()));
        }
        let mut stream = got.into_stream();
        let mut hasher = Sha256::new();
        let mut len = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            len += chunk.len() as u64;
            if len > bytes {
                return Ok((Some(len), String::new()));
            }
            hasher.update(&chunk);
        }
        if len != bytes {
            return Ok((Some(len), String::new()));
        }
        Ok((None, hex(&hasher.finalize())))
    })
    .await;
    let failed = |reason, detail: String| Err(CheckFailed { reason, detail });
    match read {
        Ok((None, sha)) if sha == want_sha => Ok(()),
        Ok((None, sha)) => failed(
            Unproven::Content,
            format!("{path}: {bytes} bytes as recorded, but SHA-256 {sha} where {want_sha} is recorded"),
        ),
        Ok((Some(n), _)) => failed(
            Unproven::Size,
            format!(
                "{path}: {n}{} bytes where {bytes} are recorded",
                if n > bytes { "+" } else { "" }
            ),
        ),
        Err(Error::Store {
            source: object_store::Error::NotFound { .. },
            ..
        }) => failed(Unproven::Missing, format!("{path}: no such object")),
        Err(e) => failed(Unproven::Unreadable, format!("{path}: {e}")),
    }
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

    #[tokio::test]
    async fn a_copy_is_proven_by_its_length_and_sha256_and_each_failure_is_named() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let p = Path::from("t/logs/x.mira");
        let data = b"block bytes, many of them".to_vec();
        let want = (data.len() as u64, sha256_hex(&data));
        let check = || async { verify_object(&store, &p, (want.0, &want.1)).await.map_err(|f| f.reason) };
        assert_eq!(check().await, Err(Unproven::Missing));
        store.put(&p, Bytes::from(data.clone()).into()).await.expect("put");
        assert_eq!(check().await, Ok(()));
        // One bit flipped, same length: only the hash tells.
        let mut flipped = data.clone();
        flipped[7] ^= 0x01;
        store.put(&p, Bytes::from(flipped).into()).await.expect("put");
        assert_eq!(check().await, Err(Unproven::Content));
        store
            .put(&p, Bytes::from(data[..data.len() - 1].to_vec()).into())
            .await
            .expect("put");
        assert_eq!(check().await, Err(Unproven::Size));
        let mut longer = data.clone();
        longer.push(0);
        store.put(&p, Bytes::from(longer).into()).await.expect("put");
        assert_eq!(check().await, Err(Unproven::Size));
    }
}
