//! The block cache: block manifests in memory, sections fetched by range
//! GET into a bounded directory on local disk (least recently used evicted
//! first, by bytes) and read back through `mmap` without copying.
//!
//! Every section is CRC-checked once per process (the shared
//! [`VerifyCache`]). A cached file that fails the check is deleted and the
//! section fetched again from the store, once; if that copy fails too the
//! read is an error, never rows.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use mira_core::BlockId;
use mira_core::block::{BlockError, Manifest, RemoteBlock, SectionEntry, VerifyCache};
use object_store::ObjectStore;
use object_store::path::Path;
use tokio::sync::Semaphore;

use crate::stats::Stats;

/// Manifests and parsed sidecars kept in memory, per kind (each a few KiB).
const MEMO_ENTRIES: usize = 100_000;

/// Parsed per-block metadata kept in memory by object key; emptied when
/// full (blocks are immutable, so an entry never goes stale).
#[derive(Debug)]
pub struct Memo<T> {
    map: Mutex<HashMap<String, Arc<T>>>,
}

impl<T> Default for Memo<T> {
    fn default() -> Self {
        Memo {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Memo<T> {
    pub fn get(&self, key: &str) -> Option<Arc<T>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned()
    }

    pub fn insert(&self, key: &str, v: Arc<T>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MEMO_ENTRIES {
            map.clear();
        }
        map.insert(key.to_owned(), v);
    }
}

#[derive(Debug)]
struct Entry {
    bytes: u64,
    tick: u64,
}

/// LRU bookkeeping: entries by file name, and file names by last use.
#[derive(Debug, Default)]
struct Lru {
    entries: HashMap<String, Entry>,
    by_tick: BTreeMap<u64, String>,
    total: u64,
    tick: u64,
}

impl Lru {
    fn touch(&mut self, name: &str) -> bool {
        self.tick += 1;
        let tick = self.tick;
        match self.entries.get_mut(name) {
            Some(e) => {
                self.by_tick.remove(&e.tick);
                e.tick = tick;
                self.by_tick.insert(tick, name.to_owned());
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, name: String, bytes: u64) {
        self.remove(&name);
        self.tick += 1;
        self.by_tick.insert(self.tick, name.clone());
        self.entries.insert(name, Entry { bytes, tick: self.tick });
        self.total += bytes;
    }

    fn remove(&mut self, name: &str) -> bool {
        match self.entries.remove(name) {
            Some(e) => {
                self.by_tick.remove(&e.tick);
                self.total -= e.bytes;
                true
            }
            None => false,
        }
    }

    /// Names to delete so that `total <= capacity`, oldest first.
    fn evict_to(&mut self, capacity: u64) -> Vec<String> {
        let mut out = Vec::new();
        while self.total > capacity {
            let Some((_, name)) = self.by_tick.pop_first() else {
                break;
            };
            if let Some(e) = self.entries.remove(&name) {
                self.total -= e.bytes;
            }
            out.push(name);
        }
        out
    }
}

/// Cache counters for `/metrics`.
#[derive(Debug, Default)]
pub struct CacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    pub corrupt_evictions: AtomicU64,
}

/// See the module doc.
#[derive(Debug)]
pub struct SectionCache {
    dir: PathBuf,
    capacity: u64,
    verify: Arc<VerifyCache>,
    fetches: Semaphore,
    lru: Mutex<Lru>,
    manifests: Memo<Manifest>,
    /// Parsed sidecars of published blocks, by object key.
    pub sidecars: Memo<mira_core::sidecar::Sidecars>,
    pub counters: CacheCounters,
}

/// A block's footer must name the tenant and block id of its object key:
/// every cache below the manifest (sections on disk, decoded tables) is
/// keyed by block id, so this ties each entry to the tenant-prefixed key
/// a plan for that tenant listed, and a misplaced or forged object is an
/// error (corrupt), never another tenant's rows.
fn check_key(key: &str, manifest: &Manifest) -> Result<(), BlockError> {
    let loc = mira_core::block::parse_block_path(&Path::from(key))?;
    if loc.tenant != manifest.meta.tenant || loc.block_id != manifest.meta.block_id {
        return Err(BlockError::InvalidPath {
            path: key.chars().take(512).collect(),
            reason: "the block's footer names another tenant or block id than its object key",
        });
    }
    Ok(())
}

/// Where a section's bytes came from.
fn file_name(block: BlockId, index: usize) -> String {
    format!("{block}.{index}")
}

impl SectionCache {
    /// Opens (creating) the cache directory. Files left by an earlier run
    /// are indexed (oldest modification first) and verified on first use.
    pub fn open(dir: &FsPath, capacity: u64, max_fetches: usize) -> std::io::Result<SectionCache> {
        std::fs::create_dir_all(dir)?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let meta = entry.metadata()?;
            if !meta.is_file() {
                continue;
            }
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            found.push((modified, name, meta.len()));
        }
        found.sort();
        let mut lru = Lru::default();
        for (_, name, len) in found {
            lru.insert(name, len);
        }
        for name in lru.evict_to(capacity) {
            let _ = std::fs::remove_file(dir.join(name));
        }
        Ok(SectionCache {
            dir: dir.to_owned(),
            capacity,
            verify: Arc::new(VerifyCache::new(1 << 20)),
            fetches: Semaphore::new(max_fetches.max(1)),
            lru: Mutex::new(lru),
            manifests: Memo::default(),
            sidecars: Memo::default(),
            counters: CacheCounters::default(),
        })
    }

    pub fn verify(&self) -> &Arc<VerifyCache> {
        &self.verify
    }

    /// Bytes currently held on disk.
    pub fn bytes(&self) -> u64 {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.lru.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The block's manifest (one tail GET the first time).
    pub async fn manifest(
        &self,
        store: &Arc<dyn ObjectStore>,
        key: &str,
        stats: &Stats,
    ) -> Result<Arc<Manifest>, BlockError> {
        if let Some(m) = self.manifests.get(key) {
            return Ok(m);
        }
        let _permit = self.fetches.acquire().await;
        let block = RemoteBlock::open(store.clone(), &Path::from(key), self.verify.clone()).await?;
        check_key(key, block.manifest())?;
        let manifest = Arc::new(block.manifest().clone());
        stats.add_store_bytes(manifest.tail_len());
        self.manifests.insert(key, manifest.clone());
        Ok(manifest)
    }

    /// Section `name` of the block at `key`: from the disk cache when held
    /// there (mapped, not copied), else one range GET, stored for next time.
    pub async fn section(
        &self,
        store: &Arc<dyn ObjectStore>,
        key: &str,
        manifest: &Manifest,
        name: &str,
        stats: &Stats,
    ) -> Result<Bytes, BlockError> {
        let block = manifest.meta.block_id;
        let (index, entry) = manifest.section(name).ok_or_else(|| BlockError::NoSuchSection {
            block,
            section: name.to_owned(),
        })?;
        if entry.length == 0 {
            return Ok(Bytes::new());
        }
        let file = file_name(block, index);
        if self.lock().touch(&file) {
            match self.read_cached(&file) {
                Ok(bytes) => match self.verify.check_hashed(block, index, entry, &bytes) {
                    Ok(hashed) => {
                        self.counters.hits.fetch_add(1, Ordering::Relaxed);
                        stats.add_cache_bytes(bytes.len() as u64, hashed);
                        return Ok(bytes);
                    }
                    Err(e) => {
                        tracing::warn!(target: "mira::querier", %e, file, "cached section failed verification; fetching it again");
                        self.counters.corrupt_evictions.fetch_add(1, Ordering::Relaxed);
                        self.drop_file(&file);
                    }
                },
                Err(e) => {
                    tracing::warn!(target: "mira::querier", %e, file, "cached section unreadable; fetching it again");
                    self.drop_file(&file);
                }
            }
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        let bytes = self.fetch(store, key, entry).await?;
        let hashed = self.verify.check_hashed(block, index, entry, &bytes)?;
        stats.add_store_bytes(bytes.len() as u64);
        if hashed {
            stats.add_verified();
        }
        self.store_file(&file, &bytes);
        Ok(bytes)
    }

    async fn fetch(&self, store: &Arc<dyn ObjectStore>, key: &str, entry: &SectionEntry) -> Result<Bytes, BlockError> {
        let _permit = self.fetches.acquire().await;
        mira_core::block::get_range(store.as_ref(), &Path::from(key), entry.range()).await
    }

    fn read_cached(&self, file: &str) -> std::io::Result<Bytes> {
        let f = std::fs::File::open(self.dir.join(file))?;
        // SAFETY: cache files are written once (temp file + rename) and
        // never modified in place; eviction unlinks them, which leaves an
        // existing mapping valid. A file changed by another process is what
        // the CRC check after mapping catches.
        let map = unsafe { memmap2::Mmap::map(&f)? };
        Ok(Bytes::from_owner(map))
    }

    fn drop_file(&self, file: &str) {
        self.lock().remove(file);
        let _ = std::fs::remove_file(self.dir.join(file));
    }

    /// Writes a fetched section into the cache (best effort: a full disk
    /// costs only the cache) and evicts down to the capacity.
    fn store_file(&self, file: &str, bytes: &[u8]) {
        let len = bytes.len() as u64;
        if len > self.capacity {
            return;
        }
        let tmp = self.dir.join(format!("{file}.tmp"));
        let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, self.dir.join(file)));
        if let Err(e) = written {
            tracing::warn!(target: "mira::querier", %e, file, "could not write a cache file");
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        let evicted = {
            let mut lru = self.lock();
            lru.insert(file.to_owned(), len);
            lru.evict_to(self.capacity)
        };
        self.counters
            .evictions
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        for name in evicted {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_block_under_another_tenants_key_is_refused() {
        use mira_core::convert::{LogsBuilder, SignalBuilder};
        use mira_core::{Signal, TenantId};
        use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
        use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
        let req = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![LogRecord {
                        time_unix_nano: 1_800_000_000_000_000_000,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let mut b = LogsBuilder::default();
        b.append(&req).expect("test setup");
        let tables = b.finish().expect("test setup");
        let (acme, beta) = (TenantId::new("acme").expect("t"), TenantId::new("beta").expect("t"));
        let id = BlockId::new();
        let bytes = mira_core::tables::write_hot(&tables, id, acme.clone()).expect("test setup");
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let t = 1_800_000_000_000_000_000;
        let own = mira_core::block::block_path(&acme, Signal::Logs, t, id);
        let misplaced = mira_core::block::block_path(&beta, Signal::Logs, t, id);
        for p in [&own, &misplaced] {
            object_store::ObjectStoreExt::put(store.as_ref(), p, bytes.clone().into())
                .await
                .expect("test setup");
        }
        let dir = tempfile::tempdir().expect("test setup");
        let cache = SectionCache::open(dir.path(), 1 << 20, 4).expect("test setup");
        let stats = Stats::default();
        cache.manifest(&store, own.as_ref(), &stats).await.expect("its own key");
        let e = cache
            .manifest(&store, misplaced.as_ref(), &stats)
            .await
            .expect_err("another tenant's key");
        assert!(e.to_string().contains("another tenant"), "{e}");
    }

    #[test]
    fn lru_evicts_least_recently_used_first_by_bytes() {
        let mut lru = Lru::default();
        lru.insert("a".into(), 10);
        lru.insert("b".into(), 10);
        lru.insert("c".into(), 10);
        assert!(lru.touch("a"));
        assert_eq!(lru.evict_to(20), vec!["b".to_owned()]);
        assert_eq!(lru.evict_to(10), vec!["c".to_owned()]);
        assert_eq!(lru.total, 10);
        assert!(!lru.touch("b"));
        lru.insert("a".into(), 4);
        assert_eq!(lru.total, 4, "re-inserting replaces the old size");
    }
}
