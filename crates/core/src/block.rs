//! The block container: one immutable object per (tenant, signal, hour)
//! holding named sections (Arrow IPC files, Parquet files or opaque sidecar
//! bytes) behind a CRC-checked manifest (DESIGN §4).
//!
//! This module owns the byte layout, the writer, the manifest parser and its
//! validation, section verification (CRC32 on first read, remembered in a
//! bounded [`VerifyCache`]), the readers ([`Block`] for bytes in memory or a
//! memory-mapped file, [`RemoteBlock`] for range GETs against an object
//! store), section decoding ([`decode_section`]) and object paths
//! ([`path`]). What goes *in* the sections (the tables, the sidecars) is
//! produced and interpreted elsewhere.
//!
//! ```text
//! offset 0      "MIRA" u32-LE format version, zero padding to 64 bytes
//! offset 64     section 0        each section starts 64-byte aligned,
//!               …                zero padding (< 64 bytes) between sections
//!               section n
//!               footer           protobuf: block meta + one entry per section
//!                                (name, offset, length, CRC32, codec, rows)
//! end - 12      u32-LE footer length, u32-LE footer CRC32, "MIRA"
//! ```
//!
//! Every parse of outside bytes is bounded: lengths are checked against the
//! object before anything is sliced or allocated, and the limits below cap
//! what a manifest may claim.

mod decode;
mod footer;
pub mod path;
mod reader;
mod writer;

#[cfg(test)]
mod tests;

use std::fmt;

pub use decode::decode_section;
pub use footer::{Manifest, SectionEntry, TAIL_FETCH_LEN, initial_tail_len};
pub use path::{BlockLocation, block_path, parse_block_path, partition_prefix};
pub use reader::{Block, RemoteBlock, VerifyCache, get_range};
pub use writer::BlockWriter;

use crate::ids::{BlockId, Signal, TenantId};

/// First and last four bytes of every block.
pub const MAGIC: [u8; 4] = *b"MIRA";
/// The format version this build writes and the only one it reads.
pub const FORMAT_VERSION: u32 = 1;
/// Sections start at multiples of this, so a memory-mapped block yields
/// Arrow buffers aligned for every Arrow type.
pub const ALIGNMENT: u64 = 64;
/// Magic, version, zero padding.
pub const HEADER_LEN: u64 = 64;
/// Footer length, footer CRC32, magic.
pub const TRAILER_LEN: u64 = 12;
/// Smallest possible block: a header, an empty footer and a trailer.
pub const MIN_BLOCK_LEN: u64 = HEADER_LEN + TRAILER_LEN;
/// Longest footer accepted. 1024 sections with long names fit comfortably.
pub const MAX_FOOTER_LEN: u64 = 1 << 20;
/// Most sections a block may have.
pub const MAX_SECTIONS: usize = 1024;
/// Longest section name, in bytes.
pub const MAX_SECTION_NAME_LEN: usize = 128;
/// Most rows a block or a section (or one Arrow array inside it) may claim.
pub const MAX_ROWS: u64 = 1 << 32;
/// Most bytes that decompressing one IPC section may allocate; a manifest
/// or IPC message claiming more is rejected before anything is allocated.
pub const MAX_DECODED_SECTION_BYTES: u64 = 4 << 30;
/// A compressed section may decode to at most this many times its own
/// length (or [`MIN_DECODE_BUDGET`], whichever is larger): sections this
/// build writes stay far below it, while a small crafted section that
/// claims gigabytes (a zstd or RLE bomb) is refused.
pub const MAX_DECODE_RATIO: u64 = 256;
/// The decode budget of a small section.
pub const MIN_DECODE_BUDGET: u64 = 64 << 20;

/// Bytes that decoding `entry` may produce.
pub fn decode_budget(entry: &SectionEntry) -> u64 {
    entry
        .length
        .saturating_mul(MAX_DECODE_RATIO)
        .clamp(MIN_DECODE_BUDGET, MAX_DECODED_SECTION_BYTES)
}

/// How a section's bytes are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Arrow IPC file, uncompressed, 64-byte aligned: read zero-copy.
    Ipc,
    /// Arrow IPC file with zstd buffer compression.
    IpcZstd,
    /// Parquet file.
    Parquet,
    /// Opaque bytes (sidecars such as Bloom filters); not Arrow batches.
    Raw,
}

impl Codec {
    pub const ALL: [Codec; 4] = [Codec::Ipc, Codec::IpcZstd, Codec::Parquet, Codec::Raw];

    /// The name stored in the manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            Codec::Ipc => "ipc",
            Codec::IpcZstd => "ipc-zstd",
            Codec::Parquet => "parquet",
            Codec::Raw => "raw",
        }
    }

    /// The codec named `name` in a manifest, if this build knows it.
    pub fn parse(name: &str) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Storage tier a block was written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// Freshly sealed, plain IPC, read zero-copy from a local cache file.
    Hot,
    /// Compacted, size-optimised codecs.
    Cold,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Hot => "hot",
            Level::Cold => "cold",
        }
    }

    /// Stable code used in the footer (0 is "missing").
    pub fn code(self) -> u32 {
        match self {
            Level::Hot => 1,
            Level::Cold => 2,
        }
    }

    pub fn from_code(code: u32) -> Option<Level> {
        match code {
            1 => Some(Level::Hot),
            2 => Some(Level::Cold),
            _ => None,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a block holds, as recorded in its footer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockMeta {
    pub block_id: BlockId,
    pub tenant: TenantId,
    pub signal: Signal,
    /// Earliest record time, Unix nanoseconds.
    pub min_time: u64,
    /// Latest record time, Unix nanoseconds (inclusive).
    pub max_time: u64,
    /// Records in the block (rows of the root table).
    pub rows: u64,
    /// Version of the table schemas inside the sections.
    pub schema_version: u32,
    pub level: Level,
}

/// Errors from writing, parsing, verifying and reading blocks. Variants
/// carry the block id and section name once the footer has been decoded.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("block is {len} bytes, shorter than the {MIN_BLOCK_LEN}-byte minimum")]
    TooShort { len: u64 },
    #[error("bad leading magic {found:02x?}, expected \"MIRA\"")]
    BadLeadingMagic { found: [u8; 4] },
    #[error("bad trailing magic {found:02x?}, expected \"MIRA\"")]
    BadTrailingMagic { found: [u8; 4] },
    #[error("unsupported block format version {version} (this build reads {FORMAT_VERSION})")]
    UnsupportedVersion { version: u32 },
    #[error("header padding byte at offset {offset} is not zero")]
    BadHeaderPadding { offset: u64 },
    #[error("footer length {footer_len} does not fit between the header and trailer of a {object_len}-byte block")]
    FooterPastStart { footer_len: u64, object_len: u64 },
    #[error("footer length {footer_len} exceeds the {MAX_FOOTER_LEN}-byte limit")]
    FooterTooLong { footer_len: u64 },
    #[error("the {have} tail bytes fetched do not hold the footer; fetch the last {need} bytes")]
    TailTooShort { have: u64, need: u64 },
    #[error("tail of {tail_len} bytes is longer than the {object_len}-byte object")]
    TailLongerThanObject { tail_len: u64, object_len: u64 },
    #[error("footer CRC32 mismatch: trailer says {expected:08x}, footer hashes to {actual:08x}")]
    FooterCrcMismatch { expected: u32, actual: u32 },
    #[error("footer does not decode: {reason}")]
    FooterMalformed { reason: String },
    #[error("footer does not decode")]
    FooterDecode(#[source] prost::DecodeError),
    #[error("footer lists {count} sections, more than the {MAX_SECTIONS} allowed")]
    TooManySections { count: usize },
    #[error("block {block}: invalid meta: {reason}")]
    InvalidMeta { block: BlockId, reason: String },
    #[error("block {block}: invalid section name {section:?}")]
    InvalidSectionName { block: BlockId, section: String },
    #[error("block {block}: section {section:?} appears more than once")]
    DuplicateSection { block: BlockId, section: String },
    #[error("block {block}: section {section:?} has unknown codec {codec:?}")]
    UnknownCodec {
        block: BlockId,
        section: String,
        codec: String,
    },
    #[error("block {block}: {rows} rows claimed by {}, over the {MAX_ROWS} limit", .section.as_deref().unwrap_or("the block meta"))]
    AbsurdRows {
        block: BlockId,
        section: Option<String>,
        rows: u64,
    },
    #[error("block {block}: section {section:?} at offset {offset} is not {ALIGNMENT}-byte aligned")]
    UnalignedSection {
        block: BlockId,
        section: String,
        offset: u64,
    },
    #[error(
        "block {block}: section {section:?} ({length} bytes at {offset}) lies outside the data area {HEADER_LEN}..{data_end}"
    )]
    SectionOutOfBounds {
        block: BlockId,
        section: String,
        offset: u64,
        length: u64,
        data_end: u64,
    },
    #[error("block {block}: sections {first:?} and {second:?} overlap")]
    OverlappingSections {
        block: BlockId,
        first: String,
        second: String,
    },
    #[error("block {block}: {len} unaccounted bytes at offset {offset} (more than alignment padding)")]
    UnexpectedGap { block: BlockId, offset: u64, len: u64 },
    #[error("block {block}: padding byte at offset {offset} is not zero")]
    NonZeroPadding { block: BlockId, offset: u64 },
    #[error(
        "block {block}: section {section:?} CRC32 mismatch: manifest says {expected:08x}, bytes hash to {actual:08x}"
    )]
    SectionCrcMismatch {
        block: BlockId,
        section: String,
        expected: u32,
        actual: u32,
    },
    #[error("block {block}: section {section:?} read returned {actual} bytes, manifest says {expected}")]
    SectionTruncated {
        block: BlockId,
        section: String,
        expected: u64,
        actual: u64,
    },
    #[error("block {block}: section {section:?} is not a valid Arrow IPC file: {reason}")]
    MalformedIpc {
        block: BlockId,
        section: String,
        reason: String,
    },
    #[error("block {block}: section {section:?} does not decode as Arrow IPC")]
    Ipc {
        block: BlockId,
        section: String,
        #[source]
        source: arrow::error::ArrowError,
    },
    #[error("block {block}: section {section:?} does not decode as Parquet")]
    Parquet {
        block: BlockId,
        section: String,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("block {block}: the {codec} decoder panicked on section {section:?}: {message}")]
    DecoderPanicked {
        block: BlockId,
        section: String,
        codec: Codec,
        message: String,
    },
    #[error("block {block}: section {section:?} decodes to more than {limit} bytes, its decode budget")]
    DecodedTooLarge {
        block: BlockId,
        section: String,
        limit: u64,
    },
    #[error("block {block}: section {section:?} holds {actual} rows, manifest says {expected}")]
    RowCountMismatch {
        block: BlockId,
        section: String,
        expected: u64,
        actual: u64,
    },
    #[error("invalid block path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },

    // Not corruption: the caller asked for something the block lacks, or
    // the writer was misused, or I/O failed.
    #[error("block {block} has no section {section:?}")]
    NoSuchSection { block: BlockId, section: String },
    #[error("block {block}: section {section:?} has codec {codec}, which holds no Arrow batches")]
    NotBatches {
        block: BlockId,
        section: String,
        codec: Codec,
    },
    #[error("cannot add section {section:?}: a section of that name was already added")]
    WriteDuplicateSection { section: String },
    #[error("cannot add section {section:?}: {reason}")]
    WriteInvalidSection { section: String, reason: String },
    #[error("cannot finish block {block}: {reason}")]
    WriteInvalidBlock { block: BlockId, reason: String },
    #[error("cannot encode section {section:?} as Arrow IPC")]
    WriteEncode {
        section: String,
        #[source]
        source: arrow::error::ArrowError,
    },
    #[error("reading block file {path}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("object store request for {path} failed")]
    ObjectStore {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error("object store returned bytes {got:?} of {path} for a request of {requested}")]
    UnexpectedRange {
        path: String,
        requested: String,
        got: std::ops::Range<u64>,
    },
}

impl BlockError {
    /// True when the bytes (or path) given to us are bad: a damaged or
    /// hostile block, never a caller's misuse or an I/O failure.
    pub fn is_corrupt(&self) -> bool {
        match self {
            BlockError::TooShort { .. }
            | BlockError::BadLeadingMagic { .. }
            | BlockError::BadTrailingMagic { .. }
            | BlockError::UnsupportedVersion { .. }
            | BlockError::BadHeaderPadding { .. }
            | BlockError::FooterPastStart { .. }
            | BlockError::FooterTooLong { .. }
            | BlockError::TailLongerThanObject { .. }
            | BlockError::FooterCrcMismatch { .. }
            | BlockError::FooterMalformed { .. }
            | BlockError::FooterDecode(_)
            | BlockError::TooManySections { .. }
            | BlockError::InvalidMeta { .. }
            | BlockError::InvalidSectionName { .. }
            | BlockError::DuplicateSection { .. }
            | BlockError::UnknownCodec { .. }
            | BlockError::AbsurdRows { .. }
            | BlockError::UnalignedSection { .. }
            | BlockError::SectionOutOfBounds { .. }
            | BlockError::OverlappingSections { .. }
            | BlockError::UnexpectedGap { .. }
            | BlockError::NonZeroPadding { .. }
            | BlockError::SectionCrcMismatch { .. }
            | BlockError::SectionTruncated { .. }
            | BlockError::MalformedIpc { .. }
            | BlockError::Ipc { .. }
            | BlockError::Parquet { .. }
            | BlockError::DecoderPanicked { .. }
            | BlockError::DecodedTooLarge { .. }
            | BlockError::RowCountMismatch { .. }
            | BlockError::InvalidPath { .. } => true,
            BlockError::TailTooShort { .. }
            | BlockError::NoSuchSection { .. }
            | BlockError::NotBatches { .. }
            | BlockError::WriteDuplicateSection { .. }
            | BlockError::WriteInvalidSection { .. }
            | BlockError::WriteInvalidBlock { .. }
            | BlockError::WriteEncode { .. }
            | BlockError::Io { .. }
            | BlockError::ObjectStore { .. }
            | BlockError::UnexpectedRange { .. } => false,
        }
    }
}

/// `v` rounded up to the next multiple of [`ALIGNMENT`] (saturating).
fn align_up(v: u64) -> u64 {
    v.div_ceil(ALIGNMENT).saturating_mul(ALIGNMENT)
}
