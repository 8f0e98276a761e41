//! [`BlockWriter`]: lays sections out 64-byte aligned behind the header and
//! appends the footer and trailer.

use arrow::record_batch::RecordBatch;
use arrow_ipc::writer::{FileWriter, IpcWriteOptions};
use arrow_ipc::{CompressionType, MetadataVersion};
use bytes::Bytes;

use super::footer::{Manifest, encode_tail, header};
use super::{
    ALIGNMENT, BlockError, BlockMeta, Codec, MAX_FOOTER_LEN, MAX_ROWS, MAX_SECTION_NAME_LEN, MAX_SECTIONS, TRAILER_LEN,
    align_up,
};

/// zstd level for [`Codec::IpcZstd`] buffers (DESIGN §4 measured level 3).
const IPC_ZSTD_LEVEL: i32 = 3;

/// Builds one block in memory. Sections are written in the order added;
/// [`BlockWriter::finish`] returns the complete object, ready for one PUT.
#[derive(Debug)]
pub struct BlockWriter {
    meta: BlockMeta,
    buf: Vec<u8>,
    sections: Vec<super::SectionEntry>,
}

impl BlockWriter {
    pub fn new(meta: BlockMeta) -> BlockWriter {
        BlockWriter {
            meta,
            buf: header().to_vec(),
            sections: Vec::new(),
        }
    }

    /// Bytes written so far (header and sections, without the footer).
    pub fn bytes_written(&self) -> u64 {
        self.buf.len() as u64
    }

    /// Encodes `batches` as one Arrow IPC file section. `codec` must be
    /// [`Codec::Ipc`] or [`Codec::IpcZstd`]; Parquet and raw sections are
    /// encoded by their producers and added with [`BlockWriter::add_bytes`].
    /// At least one batch is needed (it carries the schema; pass
    /// `RecordBatch::new_empty(schema)` for an empty table) and all must
    /// share its schema.
    pub fn add_batches(&mut self, name: &str, codec: Codec, batches: &[RecordBatch]) -> Result<(), BlockError> {
        let invalid = |reason: &str| BlockError::WriteInvalidSection {
            section: name.to_owned(),
            reason: reason.into(),
        };
        let compression = match codec {
            Codec::Ipc => None,
            Codec::IpcZstd => Some(CompressionType::ZSTD),
            Codec::Parquet | Codec::Raw => {
                return Err(invalid(
                    "add_batches encodes Arrow IPC only; add pre-encoded bytes with add_bytes",
                ));
            }
        };
        let Some(first) = batches.first() else {
            return Err(invalid("at least one batch is needed to carry the schema"));
        };
        // The IPC writer does not check this; a mixed section would not decode.
        if batches.iter().any(|b| b.schema_ref() != first.schema_ref()) {
            return Err(invalid("all batches of a section must share one schema"));
        }
        let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
        self.check_new_section(name, rows)?;
        let encode = |source| BlockError::WriteEncode {
            section: name.to_owned(),
            source,
        };
        let options = IpcWriteOptions::try_new(ALIGNMENT as usize, false, MetadataVersion::V5)
            .and_then(|o| o.try_with_compression(compression))
            .and_then(|o| o.try_with_compression_level(compression.map(|_| IPC_ZSTD_LEVEL)))
            .map_err(encode)?;
        let start = self.pad_to_alignment();
        // The IPC writer aligns relative to where it starts, which is
        // 64-byte aligned in the object, so its buffers are aligned there.
        let written = (|| {
            let mut w = FileWriter::try_new_with_options(&mut self.buf, &first.schema(), options)?;
            for b in batches {
                w.write(b)?;
            }
            w.finish()
        })();
        if let Err(e) = written {
            self.buf.truncate(start);
            return Err(encode(e));
        }
        self.push_entry(name, codec, rows, start);
        Ok(())
    }

    /// Adds a pre-encoded section (Parquet, a raw sidecar, or an IPC file
    /// copied from another block). `rows` is recorded as given.
    pub fn add_bytes(&mut self, name: &str, codec: Codec, rows: u64, bytes: &[u8]) -> Result<(), BlockError> {
        self.check_new_section(name, rows)?;
        let start = self.pad_to_alignment();
        self.buf.extend_from_slice(bytes);
        self.push_entry(name, codec, rows, start);
        Ok(())
    }

    /// Appends the footer and trailer and returns the block.
    pub fn finish(self) -> Result<Bytes, BlockError> {
        let block = self.meta.block_id;
        let invalid = |reason: String| BlockError::WriteInvalidBlock { block, reason };
        if self.meta.min_time > self.meta.max_time {
            return Err(invalid(format!(
                "min time {} after max time {}",
                self.meta.min_time, self.meta.max_time
            )));
        }
        if self.meta.rows > MAX_ROWS {
            return Err(invalid(format!("{} rows, over the {MAX_ROWS} limit", self.meta.rows)));
        }
        let manifest = Manifest::new_unchecked(self.meta, self.sections);
        let tail = encode_tail(&manifest.to_proto());
        let footer_len = tail.len() as u64 - TRAILER_LEN;
        if footer_len > MAX_FOOTER_LEN {
            return Err(invalid(format!(
                "footer of {footer_len} bytes, over the {MAX_FOOTER_LEN} limit"
            )));
        }
        let mut buf = self.buf;
        buf.extend_from_slice(&tail);
        Ok(Bytes::from(buf))
    }

    fn check_new_section(&self, name: &str, rows: u64) -> Result<(), BlockError> {
        let invalid = |reason: String| BlockError::WriteInvalidSection {
            section: name.to_owned(),
            reason,
        };
        if name.is_empty() || name.len() > MAX_SECTION_NAME_LEN {
            return Err(invalid(format!("names are 1 to {MAX_SECTION_NAME_LEN} bytes")));
        }
        if self.sections.iter().any(|s| s.name == name) {
            return Err(BlockError::WriteDuplicateSection {
                section: name.to_owned(),
            });
        }
        if self.sections.len() >= MAX_SECTIONS {
            return Err(invalid(format!("a block holds at most {MAX_SECTIONS} sections")));
        }
        if rows > MAX_ROWS {
            return Err(invalid(format!("{rows} rows, over the {MAX_ROWS} limit")));
        }
        Ok(())
    }

    /// Zero-pads to the next aligned offset and returns it.
    fn pad_to_alignment(&mut self) -> usize {
        let start = align_up(self.buf.len() as u64) as usize;
        self.buf.resize(start, 0);
        start
    }

    fn push_entry(&mut self, name: &str, codec: Codec, rows: u64, start: usize) {
        let bytes = &self.buf[start..];
        self.sections.push(super::SectionEntry {
            name: name.to_owned(),
            offset: start as u64,
            length: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
            codec,
            rows,
        });
    }
}
