//! [`IdFilter`]: split-block Bloom filters of the trace ids (and, for logs,
//! span ids) a block holds, so "find trace X" and "logs of trace X" skip
//! blocks without it.
//!
//! The filter is written by hand rather than with `fastbloom`: a block
//! keeps its filter for as long as it is retained, so the bit layout and
//! hashing are part of the storage format and must never change under a
//! dependency upgrade (fastbloom 0.17 changed its algorithm and says its
//! filters do not read back in earlier versions). The layout is the
//! split-block Bloom filter of Parquet's specification: 256-bit blocks of
//! eight 32-bit words; an id sets one bit in each word of one block, so a
//! lookup touches one cache line.
//!
//! Hashing is fixed: an id's bytes are read as little-endian u64s and mixed
//! with the MurmurHash3 finalizer (trace ids are mostly random, but some
//! systems zero their upper half, so both halves are mixed).
//!
//! Section bytes (format version 1, integers little-endian):
//!
//! ```text
//! "MIBF" u8 version=1  u8 filter count (0..=2)  u16 zero
//! per filter:  u8 kind (1 trace ids, 2 span ids)  [u8; 3] zero
//!              u32 block count (>= 1)  u64 distinct ids inserted
//!              block count × 8 × u32 words
//! ```

use arrow::array::{Array, AsArray, FixedSizeBinaryArray};
use arrow::record_batch::RecordBatch;

use super::error::SidecarError;
use crate::convert::TableSet;
use crate::ids::Signal;
use crate::schema;

/// Bits of filter per distinct id. Eleven gives about 0.8% false positives
/// for a split-block filter (ten gives about 1.3%).
pub const BITS_PER_ID: u64 = 11;

const MAGIC: [u8; 4] = *b"MIBF";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 8;
const FILTER_HEADER_LEN: usize = 16;
const BLOCK_BYTES: usize = 32;
const KIND_TRACE: u8 = 1;
const KIND_SPAN: u8 = 2;

/// Parquet's split-block Bloom filter salts.
const SALT: [u32; 8] = [
    0x47b6_137b,
    0x4497_4d91,
    0x8824_ad5b,
    0xa2b7_289d,
    0x7054_95c7,
    0x2df1_424b,
    0x9efc_4947,
    0x5c6b_fb31,
];

/// MurmurHash3's 64-bit finalizer: a fixed bijective mixer.
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// The filter hash of a trace id (part of the format: never change it).
pub fn trace_hash(id: &[u8; 16]) -> u64 {
    fmix64(le_u64(&id[..8]) ^ fmix64(le_u64(&id[8..]) ^ 0x7472_6163_655f_6964))
}

/// The filter hash of a span id (part of the format: never change it).
pub fn span_hash(id: &[u8; 8]) -> u64 {
    fmix64(u64::from_le_bytes(*id) ^ 0x7370_616e_5f69_6400)
}

/// A split-block Bloom filter over 64-bit hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitBlockBloom {
    blocks: Vec<[u32; 8]>,
    /// Distinct hashes inserted when built (informational).
    items: u64,
}

impl SplitBlockBloom {
    /// A filter holding exactly the distinct values of `hashes` (which it
    /// sorts and deduplicates), sized at [`BITS_PER_ID`] bits per value.
    pub fn from_hashes(hashes: &mut Vec<u64>) -> Self {
        hashes.sort_unstable();
        hashes.dedup();
        let items = hashes.len() as u64;
        let blocks = (items * BITS_PER_ID).div_ceil(256).clamp(1, u64::from(u32::MAX));
        let mut filter = SplitBlockBloom {
            blocks: vec![[0; 8]; blocks as usize],
            items,
        };
        for &h in hashes.iter() {
            filter.insert_hash(h);
        }
        filter
    }

    fn block_index(&self, hash: u64) -> usize {
        // Multiply-shift maps the upper 32 bits onto the block count.
        (((hash >> 32) * self.blocks.len() as u64) >> 32) as usize
    }

    fn masks(hash: u64) -> [u32; 8] {
        let key = hash as u32;
        SALT.map(|s| 1u32 << (key.wrapping_mul(s) >> 27))
    }

    pub fn insert_hash(&mut self, hash: u64) {
        let i = self.block_index(hash);
        let masks = Self::masks(hash);
        if let Some(block) = self.blocks.get_mut(i) {
            for (w, m) in block.iter_mut().zip(masks) {
                *w |= m;
            }
        }
    }

    pub fn contains_hash(&self, hash: u64) -> bool {
        let masks = Self::masks(hash);
        self.blocks
            .get(self.block_index(hash))
            .is_some_and(|b| b.iter().zip(masks).all(|(w, m)| w & m != 0))
    }

    /// Distinct ids inserted when the filter was built.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// Size of the bit array in bytes.
    pub fn num_bytes(&self) -> usize {
        self.blocks.len() * BLOCK_BYTES
    }
}

impl SplitBlockBloom {
    /// Appends the filter as `u32 block count, u64 items, block count × 8 ×
    /// u32 words` (little-endian), the layout of one `id_bloom` filter after
    /// its kind.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.blocks.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.items.to_le_bytes());
        for w in self.blocks.iter().flatten() {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// Reads a filter written by [`SplitBlockBloom::write`] from the start
    /// of `bytes`: the filter and the bytes it took, or `None` when `bytes`
    /// is too short or the filter has no block.
    pub(crate) fn read(bytes: &[u8]) -> Option<(Self, usize)> {
        let h = bytes.get(..12)?;
        let blocks = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let items = le_u64(&h[4..12]);
        if blocks == 0 {
            return None;
        }
        let end = blocks.checked_mul(BLOCK_BYTES)?.checked_add(12)?;
        let words = bytes.get(12..end)?;
        let blocks = words
            .chunks_exact(BLOCK_BYTES)
            .map(|b| std::array::from_fn(|i| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])))
            .collect();
        Some((SplitBlockBloom { blocks, items }, end))
    }
}

/// The filter hash of an attribute `key` with value text `value` (part of
/// the `row_ranges` format: never change it). FNV-1a over the key, a 0xFF
/// byte (never in UTF-8, so pairs cannot collide by concatenation) and the
/// value, then the MurmurHash3 finalizer.
pub fn pair_hash(key: &str, value: &str) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key.as_bytes().iter().chain(&[0xff]).chain(value.as_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(PRIME);
    }
    fmix64(h)
}

/// The id filters of one block.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdFilter {
    trace: Option<SplitBlockBloom>,
    span: Option<SplitBlockBloom>,
}

impl IdFilter {
    /// Filters for a block's tables: trace ids for spans; trace ids and span
    /// ids for logs. Metrics blocks get an empty `IdFilter` (no filter, so
    /// no id lookup prunes).
    pub fn build(tables: &TableSet) -> Result<Self, SidecarError> {
        match tables.signal {
            Signal::Traces => {
                let spans = tables.get(schema::SPANS)?;
                Ok(IdFilter::default().with_trace_ids(ids::<16>(spans, schema::SPANS, "trace_id")?))
            }
            Signal::Logs => {
                let logs = tables.get(schema::LOGS)?;
                Ok(IdFilter::default()
                    .with_trace_ids(ids::<16>(logs, schema::LOGS, "trace_id")?)
                    .with_span_ids(ids::<8>(logs, schema::LOGS, "span_id")?))
            }
            Signal::Metrics => Ok(IdFilter::default()),
        }
    }

    /// Adds a trace-id filter holding exactly `ids`, replacing any.
    pub fn with_trace_ids(mut self, ids: impl IntoIterator<Item = [u8; 16]>) -> Self {
        let mut hashes: Vec<u64> = ids.into_iter().map(|id| trace_hash(&id)).collect();
        self.trace = Some(SplitBlockBloom::from_hashes(&mut hashes));
        self
    }

    /// Adds a span-id filter holding exactly `ids`, replacing any.
    pub fn with_span_ids(mut self, ids: impl IntoIterator<Item = [u8; 8]>) -> Self {
        let mut hashes: Vec<u64> = ids.into_iter().map(|id| span_hash(&id)).collect();
        self.span = Some(SplitBlockBloom::from_hashes(&mut hashes));
        self
    }

    /// False only when the block holds no row with this trace id.
    pub fn may_contain_trace(&self, id: &[u8; 16]) -> bool {
        self.trace.as_ref().is_none_or(|f| f.contains_hash(trace_hash(id)))
    }

    /// False only when the block holds no row with this span id.
    pub fn may_contain_span(&self, id: &[u8; 8]) -> bool {
        self.span.as_ref().is_none_or(|f| f.contains_hash(span_hash(id)))
    }

    /// The trace-id filter, if the block has one.
    pub fn trace_filter(&self) -> Option<&SplitBlockBloom> {
        self.trace.as_ref()
    }

    /// The span-id filter, if the block has one.
    pub fn span_filter(&self) -> Option<&SplitBlockBloom> {
        self.span.as_ref()
    }

    /// The `id_bloom` section bytes (see the module docs for the layout).
    pub fn to_bytes(&self) -> Vec<u8> {
        let filters: Vec<(u8, &SplitBlockBloom)> = [(KIND_TRACE, &self.trace), (KIND_SPAN, &self.span)]
            .into_iter()
            .filter_map(|(k, f)| Some((k, f.as_ref()?)))
            .collect();
        let len = HEADER_LEN
            + filters
                .iter()
                .map(|(_, f)| FILTER_HEADER_LEN + f.num_bytes())
                .sum::<usize>();
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(filters.len() as u8);
        out.extend_from_slice(&[0, 0]);
        for (kind, f) in filters {
            out.push(kind);
            out.extend_from_slice(&[0, 0, 0]);
            // from_hashes caps the block count at u32::MAX.
            out.extend_from_slice(&(f.blocks.len() as u32).to_le_bytes());
            out.extend_from_slice(&f.items.to_le_bytes());
            for w in f.blocks.iter().flatten() {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        out
    }

    /// Parses `id_bloom` section bytes. Every length is checked against the
    /// input before use, so hostile bytes give an error and allocate at most
    /// the input's size.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SidecarError> {
        let truncated = |needed: usize| SidecarError::BloomTruncated {
            needed: needed as u64,
            len: bytes.len(),
        };
        let invalid = |offset, reason| SidecarError::InvalidBloom { offset, reason };
        let header = bytes.get(..HEADER_LEN).ok_or(truncated(HEADER_LEN))?;
        if header[..4] != MAGIC {
            return Err(SidecarError::BloomMagic);
        }
        if header[4] != VERSION {
            return Err(SidecarError::BloomVersion(header[4]));
        }
        let count = header[5];
        if count > 2 {
            return Err(invalid(5, "more than two filters"));
        }
        if header[6..8] != [0, 0] {
            return Err(invalid(6, "reserved bytes are not zero"));
        }
        let mut out = IdFilter::default();
        let mut at = HEADER_LEN;
        for _ in 0..count {
            let h = bytes
                .get(at..at + FILTER_HEADER_LEN)
                .ok_or(truncated(at + FILTER_HEADER_LEN))?;
            let kind = h[0];
            if h[1..4] != [0, 0, 0] {
                return Err(invalid(at + 1, "reserved bytes are not zero"));
            }
            let blocks = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
            let items = le_u64(&h[8..16]);
            if blocks == 0 {
                return Err(invalid(at + 4, "a filter needs at least one block"));
            }
            let start = at + FILTER_HEADER_LEN;
            // blocks < 2^32 and BLOCK_BYTES = 32, so this fits a u64; on
            // 32-bit targets the checked ops catch overflow.
            let end = blocks.checked_mul(BLOCK_BYTES).and_then(|n| n.checked_add(start));
            let words = end
                .and_then(|end| bytes.get(start..end))
                .ok_or_else(|| SidecarError::BloomTruncated {
                    needed: start as u64 + blocks as u64 * BLOCK_BYTES as u64,
                    len: bytes.len(),
                })?;
            let filter = SplitBlockBloom {
                blocks: words
                    .chunks_exact(BLOCK_BYTES)
                    .map(|b| {
                        std::array::from_fn(|i| {
                            u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
                        })
                    })
                    .collect(),
                items,
            };
            let slot = match kind {
                KIND_TRACE => &mut out.trace,
                KIND_SPAN => &mut out.span,
                _ => return Err(invalid(at, "unknown filter kind")),
            };
            if slot.replace(filter).is_some() {
                return Err(invalid(at, "filter kind appears twice"));
            }
            at = start + words.len();
        }
        if at != bytes.len() {
            return Err(invalid(at, "trailing bytes after the last filter"));
        }
        Ok(out)
    }
}

/// The non-null ids of a `FixedSizeBinary(N)` column.
fn ids<'a, const N: usize>(
    batch: &'a RecordBatch,
    table: &'static str,
    column: &'static str,
) -> Result<impl Iterator<Item = [u8; N]> + 'a, SidecarError> {
    let arr: &FixedSizeBinaryArray = batch
        .column_by_name(column)
        .ok_or(SidecarError::MissingColumn { table, column })?
        .as_fixed_size_binary_opt()
        .ok_or(SidecarError::WrongType { table, column })?;
    if arr.value_length() as usize != N {
        return Err(SidecarError::WrongType { table, column });
    }
    Ok((0..arr.len())
        .filter(|&i| arr.is_valid(i))
        .filter_map(|i| arr.value(i).try_into().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// splitmix64, for reproducible random ids.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn trace_id(&mut self) -> [u8; 16] {
            let mut id = [0; 16];
            id[..8].copy_from_slice(&self.next().to_le_bytes());
            id[8..].copy_from_slice(&self.next().to_le_bytes());
            id
        }
    }

    fn trace_only(ids: &[[u8; 16]]) -> IdFilter {
        IdFilter::default().with_trace_ids(ids.iter().copied())
    }

    proptest! {
        #[test]
        fn no_false_negatives(
            traces in proptest::collection::vec(any::<[u8; 16]>(), 0..2000),
            spans in proptest::collection::vec(any::<[u8; 8]>(), 0..2000),
        ) {
            let f = IdFilter::default().with_trace_ids(traces.iter().copied()).with_span_ids(spans.iter().copied());
            let back = IdFilter::from_bytes(&f.to_bytes()).expect("round trip");
            prop_assert_eq!(&back, &f);
            for id in &traces {
                prop_assert!(back.may_contain_trace(id));
            }
            for id in &spans {
                prop_assert!(back.may_contain_span(id));
            }
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = IdFilter::from_bytes(&bytes);
            let mut framed = b"MIBF\x01".to_vec();
            framed.extend_from_slice(&bytes);
            let _ = IdFilter::from_bytes(&framed);
        }
    }

    /// Measured false-positive rate of a filter over `n` random trace ids,
    /// probed with 100k other random ids.
    fn measured_fp(n: usize, seed: u64) -> (f64, usize) {
        let mut rng = Rng(seed);
        let ids: Vec<[u8; 16]> = (0..n).map(|_| rng.trace_id()).collect();
        let f = trace_only(&ids);
        let set: std::collections::HashSet<[u8; 16]> = ids.into_iter().collect();
        let probes = 100_000;
        let mut hits = 0;
        for _ in 0..probes {
            let id = rng.trace_id();
            if !set.contains(&id) && f.may_contain_trace(&id) {
                hits += 1;
            }
        }
        let bytes = f.trace_filter().map_or(0, SplitBlockBloom::num_bytes);
        (hits as f64 / probes as f64, bytes)
    }

    #[test]
    fn false_positive_rate_is_low() {
        for (n, seed) in [(1_000, 1), (10_000, 2), (100_000, 3)] {
            let (fp, bytes) = measured_fp(n, seed);
            println!(
                "{n} ids: {bytes} bytes ({:.2} bits/id), false positives {:.3}%",
                bytes as f64 * 8.0 / n as f64,
                fp * 100.0
            );
            assert!(fp < 0.03, "{n} ids: false-positive rate {fp}");
        }
    }

    #[test]
    fn ids_with_a_zero_half_spread_well() {
        // 64-bit trace ids padded to 128 bits (upper half zero).
        let mut rng = Rng(9);
        let ids: Vec<[u8; 16]> = (0..10_000)
            .map(|_| {
                let mut id = [0; 16];
                id[8..].copy_from_slice(&rng.next().to_le_bytes());
                id
            })
            .collect();
        let f = trace_only(&ids);
        let absent = (0..100_000)
            .filter(|_| {
                let mut id = [0; 16];
                id[8..].copy_from_slice(&rng.next().to_le_bytes());
                f.may_contain_trace(&id)
            })
            .count();
        assert!(absent < 3_000, "{absent} false positives in 100k");
    }

    #[test]
    fn empty_filter_contains_nothing_and_missing_filter_everything() {
        let f = trace_only(&[]);
        assert!(!f.may_contain_trace(&[7; 16]));
        assert!(f.may_contain_span(&[7; 8]), "no span filter: cannot prune by span id");
        assert_eq!(IdFilter::from_bytes(&f.to_bytes()).expect("decode"), f);
        let none = IdFilter::default();
        assert!(none.may_contain_trace(&[7; 16]));
        assert_eq!(IdFilter::from_bytes(&none.to_bytes()).expect("decode"), none);
    }

    #[test]
    fn format_is_stable() {
        // Pinned bytes: a change here breaks every stored block's filter.
        let f = IdFilter::default()
            .with_trace_ids([[1u8; 16]])
            .with_span_ids([[2u8; 8]]);
        let hex: String = f.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "4d4942460102000001000000010000000100000000000000000100000000020000000008000002000002000000080000\
             0000100008000000020000000100000001000000000000000001000008000000200000004000000000008000000000800000\
             080000004000"
        );
        // A multi-block filter pins the block selection too.
        let mut rng = Rng(11);
        let ids: Vec<[u8; 16]> = (0..1_000).map(|_| rng.trace_id()).collect();
        let bytes = IdFilter::default().with_trace_ids(ids).to_bytes();
        assert_eq!((bytes.len(), crc32fast::hash(&bytes)), (1_400, 2_835_956_370));
    }

    #[test]
    fn hostile_bytes_are_errors() {
        let mut rng = Rng(5);
        let ids: Vec<[u8; 16]> = (0..100).map(|_| rng.trace_id()).collect();
        let spans: Vec<[u8; 8]> = (0..100).map(|_| rng.next().to_le_bytes()).collect();
        let good = IdFilter::default()
            .with_trace_ids(ids.iter().copied())
            .with_span_ids(spans.iter().copied())
            .to_bytes();
        for len in 0..good.len() {
            assert!(IdFilter::from_bytes(&good[..len]).is_err(), "truncated to {len} bytes");
        }
        let patched = |at: usize, v: &[u8]| {
            let mut b = good.clone();
            b[at..at + v.len()].copy_from_slice(v);
            b
        };
        let second = HEADER_LEN + FILTER_HEADER_LEN + (good.len() - HEADER_LEN - 2 * FILTER_HEADER_LEN) / 2;
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("magic", patched(0, b"MIBX")),
            ("version", patched(4, &[2])),
            ("count", patched(5, &[3])),
            ("reserved", patched(6, &[1])),
            ("kind", patched(HEADER_LEN, &[9])),
            ("filter reserved", patched(HEADER_LEN + 2, &[1])),
            ("zero blocks", patched(HEADER_LEN + 4, &0u32.to_le_bytes())),
            ("huge block count", patched(HEADER_LEN + 4, &u32::MAX.to_le_bytes())),
            ("duplicate kind", patched(second, &[KIND_TRACE])),
            ("trailing", [good.clone(), vec![0]].concat()),
        ];
        for (what, b) in cases {
            assert!(IdFilter::from_bytes(&b).is_err(), "{what} must be rejected");
        }
        assert!(matches!(
            IdFilter::from_bytes(b"MIBX\x01\0\0\0"),
            Err(SidecarError::BloomMagic)
        ));
        assert!(matches!(
            IdFilter::from_bytes(b"MIBF\x02\0\0\0"),
            Err(SidecarError::BloomVersion(2))
        ));
        assert!(matches!(
            IdFilter::from_bytes(&patched(HEADER_LEN + 4, &u32::MAX.to_le_bytes())),
            Err(SidecarError::BloomTruncated { .. })
        ));
    }
}
