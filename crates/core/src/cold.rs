//! The cold tier: a block's tables rewritten into Parquet (zstd level 3,
//! dictionary and delta encodings), which `docs/perf.md` shows is the
//! smallest of the layouts measured at an acceptable rewrite and scan cost.
//! Attribute tables switch from the hot dense union to one nullable column
//! per value type, which Parquet stores almost for free. [`rewrite_cold`]
//! copies a block's sidecars unchanged, so pruning answers the same;
//! [`write_cold`] writes a table set (a merge's output) straight into the
//! cold codec and builds its sidecars. The root table is written in row
//! groups of one `row_ranges` range each, so a range is a row group.

use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::compute_leaves;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use rayon::prelude::*;

use crate::attrs;
use crate::block::{Block, BlockMeta, BlockWriter, Codec, Level};
use crate::convert::{TableSet, root_table, table_names};
use crate::error::Error;
use crate::ids::{BlockId, Signal, TenantId};
use crate::sidecar::{RANGE_ROWS, SidecarSection, Sidecars};
use crate::tables::{add_sidecars_and, block_meta, is_attr_table, read_table};

/// Rows per Parquet row group of the tables other than the root: a whole
/// section is usually one group.
const ROW_GROUP_ROWS: usize = 1 << 20;
/// Rows per Parquet row group of the root table: one `row_ranges` range
/// ([`RANGE_ROWS`]), so a range is a row group.
pub const ROOT_ROW_GROUP_ROWS: usize = RANGE_ROWS;

/// Writer settings for one table (its cold layout): zstd(3), dictionaries where they pay,
/// delta encoding for the u64 nanosecond timestamps (dictionary off there,
/// or the delta encoding would never be used).
pub fn writer_properties(batch: &RecordBatch, row_group_rows: usize) -> WriterProperties {
    let mut p = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap_or_default()))
        .set_max_row_group_row_count(Some(row_group_rows.max(1)))
        .set_statistics_enabled(EnabledStatistics::None)
        .set_dictionary_enabled(true);
    for f in batch.schema().fields() {
        let path = ColumnPath::from(f.name().as_str());
        let delta = match f.data_type() {
            DataType::UInt64 | DataType::Int64 => f.name().contains("time"),
            // Attribute rows point at their parent in ascending order: the
            // deltas are mostly 0 and 1.
            DataType::UInt32 => f.name() == "parent",
            _ => false,
        };
        if delta {
            p = p
                .set_column_dictionary_enabled(path.clone(), false)
                .set_column_encoding(path, Encoding::DELTA_BINARY_PACKED);
        } else if matches!(f.data_type(), DataType::FixedSizeBinary(_)) {
            // Trace and span ids are random: a dictionary never pays.
            p = p.set_column_dictionary_enabled(path, false);
        }
    }
    p.build()
}

/// Encodes one table as a Parquet file (row groups of up to 2^20 rows).
pub fn encode_parquet(batch: &RecordBatch) -> Result<Vec<u8>, Error> {
    encode_parquet_grouped(batch, ROW_GROUP_ROWS)
}

/// Encodes one table as a Parquet file with row groups of up to
/// `row_group_rows` rows. Every (row group, column) is encoded as its own
/// task on the current rayon pool, then the chunks are laid out in order:
/// the bytes are those `ArrowWriter` writes for the same table in one call
/// (a unit test holds them equal), in a fraction of the time on many cores.
pub fn encode_parquet_grouped(batch: &RecordBatch, row_group_rows: usize) -> Result<Vec<u8>, Error> {
    let rows = row_group_rows.max(1);
    let n = batch.num_rows();
    let mut out = Vec::with_capacity(batch.get_array_memory_size() / 4);
    let writer =
        ArrowWriter::try_new(&mut out, batch.schema(), Some(writer_properties(batch, rows))).map_err(parquet_error)?;
    let (mut file, factory) = writer.into_serialized_writer().map_err(parquet_error)?;
    let schema = batch.schema();
    let mut tasks = Vec::new();
    for (g, start) in (0..n).step_by(rows).enumerate() {
        let len = rows.min(n - start);
        let writers = factory.create_column_writers(g).map_err(parquet_error)?;
        let mut leaves = Vec::with_capacity(writers.len());
        for (field, column) in schema.fields().iter().zip(batch.columns()) {
            leaves.extend(compute_leaves(field, &column.slice(start, len)).map_err(parquet_error)?);
        }
        tasks.push(writers.into_iter().zip(leaves).collect::<Vec<_>>());
    }
    let groups = tasks
        .into_par_iter()
        .map(|columns| {
            columns
                .into_par_iter()
                .map(|(mut w, leaf)| {
                    w.write(&leaf)?;
                    w.close()
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(parquet_error)?;
    for chunks in groups {
        let mut group = file.next_row_group().map_err(parquet_error)?;
        for chunk in chunks {
            chunk.append_to_row_group(&mut group).map_err(parquet_error)?;
        }
        group.close().map_err(parquet_error)?;
    }
    file.close().map_err(parquet_error)?;
    Ok(out)
}

fn parquet_error(e: parquet::errors::ParquetError) -> arrow::error::ArrowError {
    arrow::error::ArrowError::ExternalError(Box::new(e))
}

/// The table in its cold layout (attribute tables as typed columns).
pub fn cold_layout(name: &'static str, batch: &RecordBatch) -> Result<RecordBatch, Error> {
    if is_attr_table(name) {
        Ok(attrs::to_typed(batch, name)?)
    } else {
        Ok(batch.clone())
    }
}

/// One table encoded for a cold block: cold layout, Parquet. Returns its
/// rows and bytes.
fn encode_cold_table(signal: Signal, name: &'static str, batch: &RecordBatch) -> Result<(u64, Vec<u8>), Error> {
    let cold = cold_layout(name, batch)?;
    let groups = if name == root_table(signal) {
        ROOT_ROW_GROUP_ROWS
    } else {
        ROW_GROUP_ROWS
    };
    Ok((cold.num_rows() as u64, encode_parquet_grouped(&cold, groups)?))
}

/// Writes a table set straight into a cold block (no hot block in
/// between): every table in Parquet, sidecars built from the tables, then
/// `extra` sidecar sections (a merge adds its `lineage`). Returns the whole
/// object, ready for one PUT.
pub fn write_cold(
    tables: &TableSet,
    block_id: BlockId,
    tenant: TenantId,
    extra: &[(&str, SidecarSection)],
) -> Result<Bytes, Error> {
    let mut w = BlockWriter::new(block_meta(tables, block_id, tenant, Level::Cold));
    let signal = tables.signal;
    // Tables and sidecars are built side by side on the current rayon pool.
    let (encoded, sidecars) = rayon::join(
        || {
            table_names(signal)
                .par_iter()
                .map(|&name| Ok((name, encode_cold_table(signal, name, tables.get(name)?)?)))
                .collect::<Result<Vec<_>, Error>>()
        },
        || Sidecars::build(tables),
    );
    for (name, (rows, bytes)) in encoded? {
        w.add_bytes(name, Codec::Parquet, rows, &bytes)?;
    }
    add_sidecars_and(&mut w, &sidecars?, extra)?;
    Ok(w.finish()?)
}

/// Rewrites a block into the cold tier under a new id. Every table is read
/// (and so verified), re-encoded, and written with the original sidecars
/// (its `lineage`, if any, included).
pub fn rewrite_cold(src: &Block, new_id: BlockId) -> Result<Bytes, Error> {
    let manifest = src.manifest();
    let meta = manifest.meta();
    let mut w = BlockWriter::new(BlockMeta {
        block_id: new_id,
        level: Level::Cold,
        ..meta.clone()
    });
    let tables = table_names(meta.signal);
    for name in tables {
        let (rows, bytes) = encode_cold_table(meta.signal, name, &read_table(src, name)?)?;
        w.add_bytes(name, Codec::Parquet, rows, &bytes)?;
    }
    for entry in &manifest.sections {
        if !tables.contains(&entry.name.as_str()) {
            let bytes = src.section_bytes(&entry.name)?;
            w.add_bytes(&entry.name, entry.codec, entry.rows, &bytes)?;
        }
    }
    Ok(w.finish()?)
}
