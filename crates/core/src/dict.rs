//! A string dictionary builder that emits the narrowest key type that fits
//! (`UInt8`, `UInt16` or `UInt32`): most dictionary columns (severity text,
//! attribute keys, metric names) hold a handful of values, and a 1-byte key
//! instead of 4 is most of the difference between the hot layout's bytes
//! per wire byte and the 0.9 target (docs/perf.md). A small direct-mapped
//! cache in front of the hash table answers repeats without hashing.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanBufferBuilder, DictionaryArray, PrimitiveArray, StringArray};
use arrow::buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{ArrowDictionaryKeyType, UInt8Type, UInt16Type, UInt32Type};
use arrow::error::ArrowError;
use hashbrown::HashTable;
use std::hash::BuildHasher;

const CACHE_SLOTS: usize = 256;
const EMPTY: u32 = u32::MAX;

/// Appends strings, deduplicated; [`DictBuilder::finish`] returns a
/// `Dictionary(UInt8|UInt16|UInt32, Utf8)` array.
pub struct DictBuilder {
    table: HashTable<u32>,
    state: foldhash::fast::RandomState,
    offsets: Vec<i32>,
    data: Vec<u8>,
    keys: Keys,
    nulls: Option<BooleanBufferBuilder>,
    cache: Box<[u32; CACHE_SLOTS]>,
}

impl Default for DictBuilder {
    fn default() -> Self {
        DictBuilder {
            table: HashTable::new(),
            // Seeded per builder: colliding strings cannot be prepared offline.
            // Keys follow first appearance, so the output does not depend on it.
            state: foldhash::fast::RandomState::default(),
            offsets: vec![0],
            data: Vec::new(),
            keys: Keys::U8(Vec::new()),
            nulls: None,
            cache: Box::new([EMPTY; CACHE_SLOTS]),
        }
    }
}

impl std::fmt::Debug for DictBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DictBuilder")
            .field("rows", &self.keys.len())
            .field("values", &self.distinct())
            .finish()
    }
}

/// Row keys, stored at the width [`DictBuilder::finish`] will emit (the
/// narrowest that holds every key so far), so rows take 1 byte each while
/// the dictionary holds at most 256 values and `finish` needs no narrowing
/// pass. Widened, once, when a value past the width's range is added.
#[derive(Debug)]
enum Keys {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
}

impl Keys {
    fn len(&self) -> usize {
        match self {
            Keys::U8(k) => k.len(),
            Keys::U16(k) => k.len(),
            Keys::U32(k) => k.len(),
        }
    }

    /// Appends `k`, which the current width holds (keys are below the
    /// number of distinct values, and the width follows that number).
    #[inline(always)]
    fn push(&mut self, k: u32) {
        match self {
            Keys::U8(v) => v.push(k as u8),
            Keys::U16(v) => v.push(k as u16),
            Keys::U32(v) => v.push(k),
        }
    }

    /// Makes room for key `k`.
    fn widen_for(&mut self, k: u32) {
        match self {
            Keys::U8(v) if k > u32::from(u8::MAX) => {
                *self = Keys::U16(v.iter().map(|&k| u16::from(k)).collect());
                self.widen_for(k);
            }
            Keys::U16(v) if k > u32::from(u16::MAX) => {
                *self = Keys::U32(v.iter().map(|&k| u32::from(k)).collect());
            }
            _ => {}
        }
    }
}

#[inline(always)]
fn value<'a>(offsets: &[i32], data: &'a [u8], k: u32) -> &'a [u8] {
    let k = k as usize;
    &data[offsets[k] as usize..offsets[k + 1] as usize]
}

/// Equality for the short strings dictionaries hold, without a `memcmp`
/// call: word-sized loads, the last one overlapping.
#[inline(always)]
fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    let word = |s: &[u8], i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[i..i + 8]);
        u64::from_ne_bytes(w)
    };
    let mut i = 0;
    while i + 8 < n {
        if word(a, i) != word(b, i) {
            return false;
        }
        i += 8;
    }
    word(a, n - 8) == word(b, n - 8)
}

#[inline(always)]
fn slot(v: &[u8]) -> usize {
    match v.len() {
        0 => 0,
        n => {
            (n.wrapping_mul(31) ^ usize::from(v[0]) ^ usize::from(v[n / 2]) << 3 ^ usize::from(v[n - 1]) << 5)
                % CACHE_SLOTS
        }
    }
}

impl DictBuilder {
    /// Rows appended.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.len() == 0
    }

    /// Distinct values so far.
    pub fn distinct(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Bytes held by the distinct values.
    pub fn value_bytes(&self) -> usize {
        self.data.len()
    }

    /// Room for `additional` more rows.
    pub fn reserve(&mut self, additional: usize) {
        match &mut self.keys {
            Keys::U8(k) => k.reserve(additional),
            Keys::U16(k) => k.reserve(additional),
            Keys::U32(k) => k.reserve(additional),
        }
    }

    /// Appends `v`; returns its key.
    #[inline]
    pub fn append(&mut self, v: &str) -> u32 {
        let k = self.intern(v);
        self.push_key(k);
        k
    }

    /// The key of `v`, adding it to the dictionary if new, without
    /// appending a row: callers that repeat one value over many rows intern
    /// it once and [`DictBuilder::push_key`] per row.
    #[inline]
    pub fn intern(&mut self, v: &str) -> u32 {
        let b = v.as_bytes();
        let s = slot(b);
        let cached = self.cache[s];
        if cached != EMPTY && bytes_eq(value(&self.offsets, &self.data, cached), b) {
            return cached;
        }
        self.intern_uncached(b, s)
    }

    /// The key of `v` if the cache holds it, without changing anything.
    /// Keys stay valid until [`DictBuilder::finish`], so a reader can look
    /// strings up before deciding to append them.
    #[inline(always)]
    pub fn peek(&self, v: &[u8]) -> Option<u32> {
        let cached = self.cache[slot(v)];
        (cached != EMPTY && bytes_eq(value(&self.offsets, &self.data, cached), v)).then_some(cached)
    }

    /// [`DictBuilder::intern`] past the cache: the hash table, or a new value.
    #[inline(never)]
    fn intern_uncached(&mut self, b: &[u8], s: usize) -> u32 {
        let hash = self.state.hash_one(b);
        let (offsets, data) = (&self.offsets, &self.data);
        let k = match self.table.find(hash, |&k| bytes_eq(value(offsets, data, k), b)) {
            Some(&k) => k,
            None => {
                let k = self.distinct() as u32;
                self.keys.widen_for(k);
                self.data.extend_from_slice(b);
                // Callers seal long before 2 GiB of values (`value_bytes`
                // counts toward their size target).
                self.offsets.push(self.data.len() as i32);
                let (offsets, data, state) = (&self.offsets, &self.data, &self.state);
                self.table
                    .insert_unique(hash, k, |&k| state.hash_one(value(offsets, data, k)));
                k
            }
        };
        self.cache[s] = k;
        k
    }

    pub fn append_null(&mut self) {
        let n = self.keys.len();
        let nulls = self.nulls.get_or_insert_with(|| {
            let mut b = BooleanBufferBuilder::new(n + 1);
            b.append_n(n, true);
            b
        });
        nulls.append(false);
        self.keys.push(0);
    }

    /// Appends a row holding key `k`, which [`DictBuilder::intern`] returned.
    #[inline(always)]
    pub fn push_key(&mut self, k: u32) {
        self.keys.push(k);
        if let Some(n) = &mut self.nulls {
            n.append(true);
        }
    }

    /// The dictionary array of everything appended; resets the builder.
    pub fn finish(&mut self) -> Result<ArrayRef, ArrowError> {
        let offsets = std::mem::replace(&mut self.offsets, vec![0]);
        let data = std::mem::take(&mut self.data);
        let keys = std::mem::replace(&mut self.keys, Keys::U8(Vec::new()));
        let nulls = self.nulls.take().map(|mut b| NullBuffer::new(b.finish()));
        self.table.clear();
        self.cache.fill(EMPTY);
        let values = StringArray::try_new(
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            Buffer::from_vec(data),
            None,
        )?;
        // The width is the narrowest that holds every key: u8 up to 256
        // distinct values, u16 up to 65,536.
        match keys {
            Keys::U8(k) => dict::<UInt8Type>(k, nulls, values),
            Keys::U16(k) => dict::<UInt16Type>(k, nulls, values),
            Keys::U32(k) => dict::<UInt32Type>(k, nulls, values),
        }
    }
}

fn dict<K: ArrowDictionaryKeyType>(
    keys: Vec<K::Native>,
    nulls: Option<NullBuffer>,
    values: StringArray,
) -> Result<ArrayRef, ArrowError> {
    let keys = PrimitiveArray::<K>::new(ScalarBuffer::from(keys), nulls);
    Ok(Arc::new(DictionaryArray::<K>::try_new(keys, Arc::new(values))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::columns::DictStr;
    use arrow::datatypes::DataType;
    use proptest::prelude::*;

    fn read(arr: &ArrayRef) -> Vec<Option<String>> {
        let d = DictStr::from_dyn(arr.as_ref(), "t", "c").expect("dict");
        (0..arr.len()).map(|i| d.get(i).map(str::to_owned)).collect()
    }

    #[test]
    fn key_width_follows_distinct_values() {
        for (n, want) in [
            (1usize, DataType::UInt8),
            (256, DataType::UInt8),
            (257, DataType::UInt16),
            (70_000, DataType::UInt32),
        ] {
            let mut b = DictBuilder::default();
            for i in 0..n {
                b.append(&i.to_string());
            }
            let arr = b.finish().expect("finish");
            assert_eq!(
                arr.data_type(),
                &DataType::Dictionary(Box::new(want), Box::new(DataType::Utf8)),
                "{n}"
            );
            assert_eq!(read(&arr).last().cloned().flatten(), Some((n - 1).to_string()));
        }
    }

    proptest! {
        #[test]
        fn reads_back_what_was_appended(vals in proptest::collection::vec(proptest::option::of("[a-c]{0,3}|[a-z0-9]{0,12}"), 0..300)) {
            let mut b = DictBuilder::default();
            for v in &vals {
                match v {
                    Some(s) => { b.append(s); }
                    None => b.append_null(),
                }
            }
            let arr = b.finish().expect("finish");
            prop_assert_eq!(read(&arr), vals);
            // The builder is reusable after finish.
            b.append("x");
            prop_assert_eq!(read(&b.finish().expect("finish")), vec![Some("x".to_owned())]);
        }
    }
}
