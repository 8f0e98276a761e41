//! Section bytes to Arrow batches, by codec. Shared by [`super::Block`] and
//! [`super::RemoteBlock`].
//!
//! A section that passed its CRC check can still be hostile (a crafted
//! block with correct checksums), and the Arrow IPC reader slices and
//! allocates by the lengths it is given. So every IPC message is checked
//! here first: blocks, buffers and array lengths inside the section,
//! buffers of zero-copy sections aligned, declared decompressed sizes under
//! the section's [`super::decode_budget`]. The Parquet reader gets no such
//! pre-check (its metadata is Thrift, its pages are not checksummed by our
//! writer), and the property tests show it panics on some crafted pages;
//! hence the `catch_unwind` in [`decode_section`].

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::buffer::Buffer;
use arrow::record_batch::RecordBatch;
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::{MessageHeader, root_as_footer, root_as_message};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};

use super::{BlockError, Codec, MAX_ROWS, SectionEntry};
use crate::ids::BlockId;

const ARROW_MAGIC: &[u8; 6] = b"ARROW1";
/// Leading magic plus padding, trailing footer length plus magic.
const IPC_FILE_OVERHEAD: usize = 8 + 10;
/// Rows per batch when decoding Parquet.
const PARQUET_BATCH_ROWS: usize = 64 * 1024;

/// Decodes a verified section of block `block` into record batches.
///
/// [`Codec::Ipc`] is zero-copy: every array buffer points into `bytes`.
/// That needs `bytes` to start 16-byte aligned in memory, as it does for a
/// memory-mapped block (page-aligned map, 64-byte aligned sections) or a
/// heap allocation; otherwise the section is copied once into an aligned
/// buffer and then decoded without further copies.
/// [`Codec::IpcZstd`] and [`Codec::Parquet`] allocate decoded buffers.
/// [`Codec::Raw`] holds no batches and is an error. The rows decoded must
/// match the manifest's count.
///
/// The Arrow and Parquet readers can still panic on crafted input that
/// passes every check made here (see the module docs); such a panic is
/// caught and returned as [`BlockError::DecoderPanicked`]. The decoders
/// share no state with the caller, so nothing is left half-updated.
pub fn decode_section(block: BlockId, entry: &SectionEntry, bytes: Bytes) -> Result<Vec<RecordBatch>, BlockError> {
    let decode = AssertUnwindSafe(|| match entry.codec {
        Codec::Ipc => decode_ipc(block, entry, bytes, true),
        Codec::IpcZstd => decode_ipc(block, entry, bytes, false),
        Codec::Parquet => decode_parquet(block, entry, bytes),
        Codec::Raw => Err(BlockError::NotBatches {
            block,
            section: entry.name.clone(),
            codec: entry.codec,
        }),
    });
    let batches = match std::panic::catch_unwind(decode) {
        Ok(decoded) => decoded?,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            return Err(BlockError::DecoderPanicked {
                block,
                section: entry.name.clone(),
                codec: entry.codec,
                message,
            });
        }
    };
    let actual: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    if actual != entry.rows {
        return Err(BlockError::RowCountMismatch {
            block,
            section: entry.name.clone(),
            expected: entry.rows,
            actual,
        });
    }
    Ok(batches)
}

/// In zero-copy sections every buffer must start at a multiple of this
/// within the section (the widest Arrow native type, i128/i256, needs 16;
/// the writer aligns to 64). Arrow's own check panics on misaligned
/// dictionary keys instead of returning an error.
const ZERO_COPY_BUFFER_ALIGN: usize = 16;

/// `zero_copy` (hot, uncompressed): require aligned buffers so nothing is
/// silently copied. Compressed sections allocate on decompression anyway,
/// and buffers the writer left uncompressed sit 8 bytes past an aligned
/// offset, so there the decoder may realign.
fn decode_ipc(
    block: BlockId,
    entry: &SectionEntry,
    bytes: Bytes,
    zero_copy: bool,
) -> Result<Vec<RecordBatch>, BlockError> {
    let malformed = |reason: String| BlockError::MalformedIpc {
        block,
        section: entry.name.clone(),
        reason,
    };
    let arrow = |source| BlockError::Ipc {
        block,
        section: entry.name.clone(),
        source,
    };

    let buffer = if zero_copy && !(bytes.as_ptr() as usize).is_multiple_of(ZERO_COPY_BUFFER_ALIGN) {
        Buffer::from_slice_ref(&bytes)
    } else {
        Buffer::from(bytes)
    };
    let len = buffer.len();
    if len < IPC_FILE_OVERHEAD || &buffer[..6] != ARROW_MAGIC || &buffer[len - 6..] != ARROW_MAGIC {
        return Err(malformed("missing ARROW1 magic".into()));
    }
    let footer_end = len - 10;
    let footer_len = i32::from_le_bytes([
        buffer[footer_end],
        buffer[footer_end + 1],
        buffer[footer_end + 2],
        buffer[footer_end + 3],
    ]);
    let footer_len = usize::try_from(footer_len)
        .ok()
        .filter(|&n| n <= footer_end - 8)
        .ok_or_else(|| malformed(format!("footer length {footer_len} out of bounds")))?;
    let data_end = footer_end - footer_len;
    let footer = root_as_footer(&buffer[data_end..footer_end]).map_err(|e| malformed(format!("footer: {e}")))?;
    let fb_schema = footer
        .schema()
        .ok_or_else(|| malformed("footer has no schema".into()))?;
    if !fb_schema.endianness().equals_to_target_endianness() {
        return Err(malformed("written with the other endianness".into()));
    }
    let schema = Arc::new(arrow_ipc::convert::try_fb_to_schema(fb_schema).map_err(arrow)?);
    let mut decoder = FileDecoder::new(schema, footer.version()).with_require_alignment(zero_copy);
    let mut budget = super::decode_budget(entry);

    for dict in footer.dictionaries().iter().flatten() {
        let data = message_slice(&buffer, dict, data_end, zero_copy, &mut budget).map_err(malformed)?;
        decoder.read_dictionary(dict, &data).map_err(arrow)?;
    }
    let blocks = footer
        .recordBatches()
        .ok_or_else(|| malformed("footer lists no record batches".into()))?;
    let mut batches = Vec::with_capacity(blocks.len());
    for b in blocks {
        let data = message_slice(&buffer, b, data_end, zero_copy, &mut budget).map_err(malformed)?;
        if let Some(batch) = decoder.read_record_batch(b, &data).map_err(arrow)? {
            batches.push(batch);
        }
    }
    Ok(batches)
}

/// The bytes of one IPC message (metadata then body) named by a footer
/// block, after checking that the block and everything its metadata points
/// at lie inside the section and within the decode budget.
fn message_slice(
    buffer: &Buffer,
    block: &arrow_ipc::Block,
    data_end: usize,
    zero_copy: bool,
    budget: &mut u64,
) -> Result<Buffer, String> {
    let offset = usize::try_from(block.offset()).ok();
    let meta_len = usize::try_from(block.metaDataLength()).ok().filter(|&n| n >= 8);
    let body_len = usize::try_from(block.bodyLength()).ok();
    let (Some(offset), Some(meta_len), Some(body_len)) = (offset, meta_len, body_len) else {
        return Err(format!(
            "bad message block: offset {}, metadata {}, body {}",
            block.offset(),
            block.metaDataLength(),
            block.bodyLength()
        ));
    };
    let end = offset.checked_add(meta_len).and_then(|n| n.checked_add(body_len));
    if end.is_none_or(|end| end > data_end) {
        return Err(format!(
            "message at {offset} ({meta_len}+{body_len} bytes) runs past the data"
        ));
    }
    let meta = &buffer[offset..offset + meta_len];
    let body = &buffer[offset + meta_len..offset + meta_len + body_len];
    // Where the body starts within the section, for alignment checks.
    let body_align = if zero_copy { Some(offset + meta_len) } else { None };
    check_message(meta, body, body_align, budget)?;
    Ok(buffer.slice_with_length(offset, meta_len + body_len))
}

fn check_message(meta: &[u8], body: &[u8], body_start: Option<usize>, budget: &mut u64) -> Result<(), String> {
    let fb = if meta[..4] == [0xff; 4] { &meta[8..] } else { &meta[4..] };
    let message = root_as_message(fb).map_err(|e| format!("message: {e}"))?;
    let batch = match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => message.header_as_dictionary_batch().and_then(|d| d.data()),
        // The decoder rejects anything else without reading buffers.
        _ => return Ok(()),
    };
    let batch = batch.ok_or("message header has no record batch")?;
    let in_rows = |n: i64| u64::try_from(n).is_ok_and(|n| n <= MAX_ROWS);
    if !in_rows(batch.length()) {
        return Err(format!("batch claims {} rows", batch.length()));
    }
    for node in batch.nodes().iter().flatten() {
        if !in_rows(node.length()) || !in_rows(node.null_count()) {
            return Err(format!(
                "array claims {} values, {} nulls",
                node.length(),
                node.null_count()
            ));
        }
    }
    let compressed = batch.compression().is_some();
    for buf in batch.buffers().iter().flatten() {
        let range = usize::try_from(buf.offset())
            .ok()
            .zip(usize::try_from(buf.length()).ok())
            .and_then(|(o, l)| Some(o..o.checked_add(l)?))
            .filter(|r| r.end <= body.len())
            .ok_or_else(|| {
                format!(
                    "buffer at {} of {} bytes outside a {}-byte body",
                    buf.offset(),
                    buf.length(),
                    body.len()
                )
            })?;
        if let Some(start) = body_start
            && !range.is_empty()
            && !(start + range.start).is_multiple_of(ZERO_COPY_BUFFER_ALIGN)
        {
            return Err(format!(
                "buffer at {} not {ZERO_COPY_BUFFER_ALIGN}-byte aligned",
                start + range.start
            ));
        }
        if !compressed || range.is_empty() {
            continue;
        }
        // Compressed buffers start with the i64 decompressed length
        // (-1: stored uncompressed, 0: empty).
        let prefix: [u8; 8] = body
            .get(range.start..range.start + 8)
            .and_then(|p| p.try_into().ok())
            .ok_or("compressed buffer shorter than its length prefix")?;
        match i64::from_le_bytes(prefix) {
            -1 | 0 => {}
            n if n > 0 => {
                *budget = budget
                    .checked_sub(n as u64)
                    .ok_or("decompressed size exceeds the section's decode budget")?;
            }
            n => return Err(format!("bad decompressed length {n}")),
        }
    }
    Ok(())
}

/// Decodes a Parquet section row group by row group, the groups in
/// parallel on the current rayon pool (a cold root table is one group per
/// 64k-row range), then in order.
fn decode_parquet(block: BlockId, entry: &SectionEntry, bytes: Bytes) -> Result<Vec<RecordBatch>, BlockError> {
    use rayon::prelude::*;
    let parquet = |source| BlockError::Parquet {
        block,
        section: entry.name.clone(),
        source,
    };
    let metadata = ArrowReaderMetadata::load(&bytes, ArrowReaderOptions::default()).map_err(parquet)?;
    let rows = metadata.metadata().file_metadata().num_rows();
    if u64::try_from(rows).ok() != Some(entry.rows) {
        return Err(BlockError::RowCountMismatch {
            block,
            section: entry.name.clone(),
            expected: entry.rows,
            actual: rows.max(0) as u64,
        });
    }
    let groups = metadata.metadata().num_row_groups();
    // Decode batch by batch against the section's budget (shared by the
    // groups), so a few pages of run-length-encoded values cannot expand
    // into gigabytes.
    let limit = super::decode_budget(entry);
    let used = AtomicU64::new(0);
    let group = |g: usize| -> Result<Vec<RecordBatch>, BlockError> {
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(bytes.clone(), metadata.clone())
            .with_row_groups(vec![g])
            .with_batch_size(PARQUET_BATCH_ROWS)
            .build()
            .map_err(parquet)?;
        let mut batches = Vec::new();
        for batch in reader {
            let batch = batch.map_err(|e| parquet(e.into()))?;
            let size = batch.get_array_memory_size() as u64;
            if used.fetch_add(size, Ordering::Relaxed).saturating_add(size) > limit {
                return Err(BlockError::DecodedTooLarge {
                    block,
                    section: entry.name.clone(),
                    limit,
                });
            }
            batches.push(batch);
        }
        Ok(batches)
    };
    let parts: Vec<Vec<RecordBatch>> = if groups > 1 {
        (0..groups).into_par_iter().map(group).collect::<Result<_, _>>()?
    } else {
        (0..groups).map(group).collect::<Result<_, _>>()?
    };
    Ok(parts.into_iter().flatten().collect())
}
