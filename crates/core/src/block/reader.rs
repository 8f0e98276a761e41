//! Readers: [`Block`] over bytes in memory or a memory-mapped file,
//! [`RemoteBlock`] over range GETs, and the [`VerifyCache`] they share.
//! Both go through [`Manifest::from_tail`] to open and
//! [`VerifyCache::check`] + [`decode_section`] to read.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::record_batch::RecordBatch;
use bytes::{Bytes, BytesMut};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};

use super::footer::{Manifest, SectionEntry, TAIL_FETCH_LEN};
use super::{BlockError, BlockMeta, MIN_BLOCK_LEN, decode_section};
use crate::ids::BlockId;

/// Remembers which sections passed their CRC check, keyed by (block id,
/// section index). Blocks are immutable and ids never reused, so a section
/// verified once need not be hashed again. Bounded; shared by all readers
/// of a process.
pub struct VerifyCache {
    /// Value: the CRC the section was verified against, so a different
    /// manifest claiming the same id is checked afresh.
    verified: quick_cache::sync::Cache<(BlockId, u32), u32>,
    verifications: AtomicU64,
    mismatches: AtomicU64,
}

impl VerifyCache {
    /// A cache remembering up to `capacity` verified sections.
    pub fn new(capacity: usize) -> VerifyCache {
        VerifyCache {
            verified: quick_cache::sync::Cache::new(capacity.max(1)),
            verifications: AtomicU64::new(0),
            mismatches: AtomicU64::new(0),
        }
    }

    /// Sections hashed so far (cache misses).
    pub fn verifications(&self) -> u64 {
        self.verifications.load(Ordering::Relaxed)
    }

    /// CRC mismatches seen so far (for the corruption metric).
    pub fn mismatches(&self) -> u64 {
        self.mismatches.load(Ordering::Relaxed)
    }

    /// Checks `bytes` against section `index` of block `block` unless that
    /// section was verified before.
    pub fn check(&self, block: BlockId, index: usize, entry: &SectionEntry, bytes: &[u8]) -> Result<(), BlockError> {
        self.check_hashed(block, index, entry, bytes).map(|_| ())
    }

    /// [`VerifyCache::check`], telling whether the bytes were hashed (true)
    /// or the section was already verified (false).
    pub fn check_hashed(
        &self,
        block: BlockId,
        index: usize,
        entry: &SectionEntry,
        bytes: &[u8],
    ) -> Result<bool, BlockError> {
        if bytes.len() as u64 != entry.length {
            return Err(BlockError::SectionTruncated {
                block,
                section: entry.name.clone(),
                expected: entry.length,
                actual: bytes.len() as u64,
            });
        }
        // Manifests hold at most MAX_SECTIONS entries.
        let key = (block, index as u32);
        if self.verified.get(&key) == Some(entry.crc32) {
            return Ok(false);
        }
        self.verifications.fetch_add(1, Ordering::Relaxed);
        let actual = crc32fast::hash(bytes);
        if actual != entry.crc32 {
            self.mismatches.fetch_add(1, Ordering::Relaxed);
            return Err(BlockError::SectionCrcMismatch {
                block,
                section: entry.name.clone(),
                expected: entry.crc32,
                actual,
            });
        }
        self.verified.insert(key, entry.crc32);
        Ok(true)
    }
}

impl fmt::Debug for VerifyCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifyCache")
            .field("len", &self.verified.len())
            .field("capacity", &self.verified.capacity())
            .field("verifications", &self.verifications())
            .field("mismatches", &self.mismatches())
            .finish()
    }
}

/// Checks that the padding of a whole object is zero, so no byte of a block
/// read in full goes unchecked. Each range is under 64 bytes (the manifest
/// tiles the data area).
fn check_padding(manifest: &Manifest, object: &[u8]) -> Result<(), BlockError> {
    for range in manifest.padding_ranges() {
        let pad = &object[range.start as usize..range.end as usize];
        if let Some(i) = pad.iter().position(|&b| b != 0) {
            return Err(BlockError::NonZeroPadding {
                block: manifest.meta.block_id,
                offset: range.start + i as u64,
            });
        }
    }
    Ok(())
}

fn lookup<'m>(manifest: &'m Manifest, name: &str) -> Result<(usize, &'m SectionEntry), BlockError> {
    manifest.section(name).ok_or_else(|| BlockError::NoSuchSection {
        block: manifest.meta.block_id,
        section: name.to_owned(),
    })
}

/// A whole block in memory: owned bytes, or a memory-mapped file whose
/// sections are sliced (and, for [`super::Codec::Ipc`], decoded) zero-copy.
pub struct Block {
    data: Bytes,
    manifest: Manifest,
    verify: Arc<VerifyCache>,
}

impl Block {
    /// Validates the header, manifest and padding of a whole object.
    /// Sections are verified when first read.
    pub fn from_bytes(data: Bytes, verify: Arc<VerifyCache>) -> Result<Block, BlockError> {
        let manifest = Manifest::from_tail(&data, data.len() as u64)?;
        check_padding(&manifest, &data)?;
        Ok(Block { data, manifest, verify })
    }

    /// Memory-maps a block file. Blocking (open + mmap); call from a
    /// blocking context.
    ///
    /// Contract: the file must stay unmodified and untruncated while this
    /// `Block` or any `Bytes`/batch taken from it lives (write block files
    /// under a temporary name and rename them into place; delete by
    /// unlinking). A file truncated under a mapping makes reads fault.
    pub fn open_file(path: &std::path::Path, verify: Arc<VerifyCache>) -> Result<Block, BlockError> {
        let io = |source| BlockError::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < MIN_BLOCK_LEN {
            return Err(BlockError::TooShort { len });
        }
        // SAFETY: a mapping is sound only while the file is neither modified
        // nor truncated. Block files are immutable (written in full, renamed
        // into place, removed by unlinking, which keeps a mapping valid) and
        // `open_file`'s contract forbids opening anything else, so the bytes
        // behind the `&[u8]` handed out cannot change.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Block::from_bytes(Bytes::from_owner(mmap), verify)
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn meta(&self) -> &BlockMeta {
        &self.manifest.meta
    }

    /// The whole object (for copying it elsewhere byte for byte).
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// The section's bytes, zero-copy, CRC-verified on first read.
    pub fn section_bytes(&self, name: &str) -> Result<Bytes, BlockError> {
        let (index, entry) = lookup(&self.manifest, name)?;
        // The manifest keeps sections inside the object.
        let bytes = self
            .data
            .slice(entry.offset as usize..(entry.offset + entry.length) as usize);
        self.verify.check(self.manifest.meta.block_id, index, entry, &bytes)?;
        Ok(bytes)
    }

    /// The section decoded into batches (see [`decode_section`]).
    pub fn read_batches(&self, name: &str) -> Result<Vec<RecordBatch>, BlockError> {
        let bytes = self.section_bytes(name)?;
        let (_, entry) = lookup(&self.manifest, name)?;
        decode_section(self.manifest.meta.block_id, entry, bytes)
    }
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("len", &self.data.len())
            .field("manifest", &self.manifest)
            .finish()
    }
}

/// A block in an object store, read by range: opening fetches the tail
/// (one suffix GET, a second only if the footer is over
/// [`TAIL_FETCH_LEN`]), each section read fetches exactly that section.
/// When the first GET returned the whole object (small blocks), header and
/// padding are checked as [`Block::from_bytes`] does; otherwise those bytes
/// are never fetched and so never trusted or checked.
///
/// Cancel safety: every async method is cancel safe; dropping one loses
/// only the bytes in flight (a section is marked verified only after its
/// bytes were hashed).
pub struct RemoteBlock {
    store: Arc<dyn ObjectStore>,
    path: Path,
    manifest: Manifest,
    verify: Arc<VerifyCache>,
}

impl RemoteBlock {
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        path: &Path,
        verify: Arc<VerifyCache>,
    ) -> Result<RemoteBlock, BlockError> {
        let (tail, object_len) = fetch_tail(store.as_ref(), path).await?;
        let manifest = match Manifest::from_tail(&tail, object_len) {
            Err(BlockError::TailTooShort { have, need }) if need <= object_len => {
                let more = get_range(store.as_ref(), path, object_len - need..object_len - have).await?;
                let mut whole = BytesMut::with_capacity(need as usize);
                whole.extend_from_slice(&more);
                whole.extend_from_slice(&tail);
                Manifest::from_tail(&whole, object_len)?
            }
            other => other?,
        };
        if tail.len() as u64 == object_len {
            check_padding(&manifest, &tail)?;
        }
        Ok(RemoteBlock {
            store,
            path: path.clone(),
            manifest,
            verify,
        })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn meta(&self) -> &BlockMeta {
        &self.manifest.meta
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fetches the section (one range GET), CRC-verified on first read.
    pub async fn section_bytes(&self, name: &str) -> Result<Bytes, BlockError> {
        let (index, entry) = lookup(&self.manifest, name)?;
        let bytes = if entry.length == 0 {
            Bytes::new()
        } else {
            get_range(self.store.as_ref(), &self.path, entry.range()).await?
        };
        self.verify.check(self.manifest.meta.block_id, index, entry, &bytes)?;
        Ok(bytes)
    }

    /// Fetches and decodes the section. Decoding runs on the calling task;
    /// for large compressed sections prefer [`RemoteBlock::section_bytes`]
    /// and [`decode_section`] on a CPU pool.
    pub async fn read_batches(&self, name: &str) -> Result<Vec<RecordBatch>, BlockError> {
        let bytes = self.section_bytes(name).await?;
        let (_, entry) = lookup(&self.manifest, name)?;
        decode_section(self.manifest.meta.block_id, entry, bytes)
    }
}

impl fmt::Debug for RemoteBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteBlock")
            .field("path", &self.path)
            .field("manifest", &self.manifest)
            .finish()
    }
}

fn store_error(path: &Path) -> impl Fn(object_store::Error) -> BlockError + '_ {
    move |source| BlockError::ObjectStore {
        path: path.to_string(),
        source,
    }
}

/// The last [`TAIL_FETCH_LEN`] bytes (or the whole object) and the object
/// length, in one suffix GET; stores without suffix ranges get a HEAD and a
/// bounded GET.
async fn fetch_tail(store: &dyn ObjectStore, path: &Path) -> Result<(Bytes, u64), BlockError> {
    let options = GetOptions::new().with_range(Some(GetRange::Suffix(TAIL_FETCH_LEN)));
    match store.get_opts(path, options).await {
        Ok(result) => {
            let object_len = result.meta.size;
            let range = result.range.clone();
            let bytes = result.bytes().await.map_err(store_error(path))?;
            let expected_start = object_len.saturating_sub(TAIL_FETCH_LEN);
            if range.start != expected_start || range.end != object_len || bytes.len() as u64 != range.end - range.start
            {
                return Err(BlockError::UnexpectedRange {
                    path: path.to_string(),
                    requested: format!("the last {TAIL_FETCH_LEN} bytes"),
                    got: range,
                });
            }
            Ok((bytes, object_len))
        }
        Err(object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. }) => {
            let object_len = store.head(path).await.map_err(store_error(path))?.size;
            if object_len < MIN_BLOCK_LEN {
                return Err(BlockError::TooShort { len: object_len });
            }
            let tail = get_range(store, path, object_len - TAIL_FETCH_LEN.min(object_len)..object_len).await?;
            Ok((tail, object_len))
        }
        Err(e) => Err(store_error(path)(e)),
    }
}

/// One bounded GET, checked to return exactly the bytes asked for.
pub async fn get_range(store: &dyn ObjectStore, path: &Path, range: Range<u64>) -> Result<Bytes, BlockError> {
    let bytes = store.get_range(path, range.clone()).await.map_err(store_error(path))?;
    if bytes.len() as u64 != range.end - range.start {
        return Err(BlockError::UnexpectedRange {
            path: path.to_string(),
            requested: format!("{range:?}"),
            got: range.start..range.start + bytes.len() as u64,
        });
    }
    Ok(bytes)
}
