//! Decoded tables kept in memory: a block's section decoded once (Arrow
//! IPC validated, Parquet decompressed and rebuilt in the hot layout) and
//! reused by every later scan, bounded by bytes, least recently used
//! evicted first.
//!
//! Blocks are immutable and their ids never reused, so an entry never goes
//! stale: eviction is the only removal. Concurrent misses on one section
//! may both decode it; the second insert replaces the first (same rows).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::Array;
use arrow::record_batch::RecordBatch;

use crate::block::{Codec, SectionEntry};
use crate::ids::BlockId;

/// A decoded table: block and table name.
pub type DecodedKey = (BlockId, &'static str);

/// What one decoded table costs the cache, in bytes. Zero-copy IPC tables
/// point into their section's bytes (a memory map or one allocation that
/// every column shares), so they cost the section's length; Arrow's own
/// per-array sizes would count the shared allocation once per column.
/// Decoded codecs allocate their buffers: [`RecordBatch::get_array_memory_size`].
pub fn decoded_weight(entry: &SectionEntry, batch: &RecordBatch) -> u64 {
    match entry.codec {
        Codec::Ipc => entry.length,
        _ => batch.get_array_memory_size() as u64,
    }
}

/// Weight of a table without its section entry: the bytes its arrays
/// reference (slices counted by what they cover).
pub fn batch_weight(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(c.get_array_memory_size()) as u64)
        .sum()
}

/// Counters of a [`DecodedCache`].
#[derive(Debug, Default)]
pub struct DecodedCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Tables inserted (one per decode that was kept).
    pub inserts: AtomicU64,
    pub evictions: AtomicU64,
}

#[derive(Debug)]
struct Slot {
    batch: RecordBatch,
    weight: u64,
    tick: u64,
}

#[derive(Debug, Default)]
struct Lru {
    slots: HashMap<DecodedKey, Slot>,
    by_tick: BTreeMap<u64, DecodedKey>,
    total: u64,
    tick: u64,
}

impl Lru {
    fn remove(&mut self, key: &DecodedKey) {
        if let Some(s) = self.slots.remove(key) {
            self.by_tick.remove(&s.tick);
            self.total -= s.weight;
        }
    }
}

/// See the module doc.
#[derive(Debug)]
pub struct DecodedCache {
    capacity: u64,
    lru: Mutex<Lru>,
    pub counters: DecodedCounters,
}

impl DecodedCache {
    /// A cache holding at most `capacity` bytes of decoded tables (0: holds
    /// nothing).
    pub fn new(capacity: u64) -> DecodedCache {
        DecodedCache {
            capacity,
            lru: Mutex::new(Lru::default()),
            counters: DecodedCounters::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.lru.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most bytes held.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.lock().total
    }

    /// Tables held now.
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The decoded table, marked as just used.
    pub fn get(&self, block: BlockId, table: &'static str) -> Option<RecordBatch> {
        let mut lru = self.lock();
        lru.tick += 1;
        let tick = lru.tick;
        let key = (block, table);
        let Some(slot) = lru.slots.get_mut(&key) else {
            drop(lru);
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let old = std::mem::replace(&mut slot.tick, tick);
        let batch = slot.batch.clone();
        lru.by_tick.remove(&old);
        lru.by_tick.insert(tick, key);
        drop(lru);
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        Some(batch)
    }

    /// Keeps a decoded table of `weight` bytes (see [`decoded_weight`]),
    /// evicting the least recently used down to the capacity. A table
    /// larger than the whole cache is not kept.
    pub fn insert(&self, block: BlockId, table: &'static str, batch: RecordBatch, weight: u64) {
        if weight > self.capacity {
            return;
        }
        let key = (block, table);
        let mut evicted = 0u64;
        {
            let mut lru = self.lock();
            lru.remove(&key);
            lru.tick += 1;
            let tick = lru.tick;
            lru.by_tick.insert(tick, key);
            lru.slots.insert(key, Slot { batch, weight, tick });
            lru.total += weight;
            while lru.total > self.capacity {
                let Some((_, oldest)) = lru.by_tick.pop_first() else {
                    break;
                };
                if let Some(s) = lru.slots.remove(&oldest) {
                    lru.total -= s.weight;
                    evicted += 1;
                }
            }
        }
        self.counters.inserts.fetch_add(1, Ordering::Relaxed);
        self.counters.evictions.fetch_add(evicted, Ordering::Relaxed);
    }

    /// The table from the cache, or `decode`d and kept.
    pub fn get_or_decode<E>(
        &self,
        block: BlockId,
        table: &'static str,
        decode: impl FnOnce() -> Result<(RecordBatch, u64), E>,
    ) -> Result<RecordBatch, E> {
        if let Some(b) = self.get(block, table) {
            return Ok(b);
        }
        let (batch, weight) = decode()?;
        self.insert(block, table, batch.clone(), weight);
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::UInt64Array;

    use super::*;

    fn batch(n: u64) -> RecordBatch {
        let values: Arc<dyn Array> = Arc::new(UInt64Array::from_iter_values(0..n));
        RecordBatch::try_from_iter([("v", values)]).expect("batch")
    }

    #[test]
    fn a_table_is_decoded_once_then_reused() {
        let cache = DecodedCache::new(1 << 20);
        let id = BlockId::new();
        let decodes = AtomicU64::new(0);
        for _ in 0..3 {
            let b = cache
                .get_or_decode::<()>(id, "logs", || {
                    decodes.fetch_add(1, Ordering::Relaxed);
                    let b = batch(100);
                    let w = batch_weight(&b);
                    Ok((b, w))
                })
                .expect("decoded");
            assert_eq!(b.num_rows(), 100);
        }
        assert_eq!(decodes.load(Ordering::Relaxed), 1);
        assert_eq!(cache.counters.hits.load(Ordering::Relaxed), 2);
        assert_eq!(cache.counters.misses.load(Ordering::Relaxed), 1);
        assert_eq!(cache.bytes(), 800);
        // Another table of the same block, and the same table of another
        // block, are other entries.
        assert!(cache.get(id, "log_attrs").is_none());
        assert!(cache.get(BlockId::new(), "logs").is_none());
    }

    #[test]
    fn eviction_keeps_the_byte_bound_least_recently_used_first() {
        let cache = DecodedCache::new(2000);
        let ids: Vec<BlockId> = (0..10).map(|_| BlockId::new()).collect();
        for (i, id) in ids.iter().enumerate() {
            cache.insert(*id, "logs", batch(100), 800);
            assert!(cache.bytes() <= 2000, "after insert {i}: {} bytes", cache.bytes());
            // Keep the first block in use: it must survive.
            assert!(cache.get(ids[0], "logs").is_some(), "first evicted at insert {i}");
        }
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.bytes(), 1600);
        assert!(cache.get(ids[9], "logs").is_some());
        assert!(cache.get(ids[8], "logs").is_none());
        assert_eq!(cache.counters.evictions.load(Ordering::Relaxed), 8);
        // Larger than the whole cache: not kept, nothing evicted.
        cache.insert(BlockId::new(), "logs", batch(1000), 8000);
        assert_eq!(cache.len(), 2);
        // Re-inserting replaces the old weight.
        cache.insert(ids[9], "logs", batch(10), 80);
        assert_eq!(cache.bytes(), 880);
    }

    #[test]
    fn zero_capacity_holds_nothing() {
        let cache = DecodedCache::new(0);
        let id = BlockId::new();
        cache.insert(id, "logs", batch(1), 8);
        assert!(cache.get(id, "logs").is_none());
        assert_eq!(cache.bytes(), 0);
    }
}
