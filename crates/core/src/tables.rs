//! A signal's [`TableSet`] written as a block, and read back.
//!
//! Hot blocks hold each table as a plain Arrow IPC section (read zero-copy)
//! plus the pruning sidecars. Cold blocks ([`crate::cold`]) hold the same
//! tables in the cold codec; [`read_tables`] hides the difference.

use arrow::record_batch::RecordBatch;
use bytes::Bytes;

use crate::attrs;
use crate::block::{Block, BlockMeta, BlockWriter, Codec, Level};
use crate::convert::{TableSet, table_names};
use crate::error::Error;
use crate::ids::{BlockId, TenantId};
use crate::schema::{self, SCHEMA_VERSION};
use crate::sidecar::{SidecarSection, Sidecars};

/// True for the attribute tables (their cold layout differs from the hot).
pub fn is_attr_table(name: &str) -> bool {
    name.ends_with("_attrs")
}

/// The block meta a table set is written under.
pub fn block_meta(tables: &TableSet, block_id: BlockId, tenant: TenantId, level: Level) -> BlockMeta {
    BlockMeta {
        block_id,
        tenant,
        signal: tables.signal,
        min_time: tables.min_time,
        max_time: tables.max_time,
        rows: tables.rows as u64,
        schema_version: SCHEMA_VERSION,
        level,
    }
}

/// Adds the sidecar sections to a block being written.
pub(crate) fn add_sidecars(w: &mut BlockWriter, sidecars: &Sidecars) -> Result<(), Error> {
    for (name, section) in sidecars.sections()? {
        match section {
            SidecarSection::Batch(b) => w.add_batches(name, Codec::Ipc, &[b])?,
            SidecarSection::Bytes(bytes) => w.add_bytes(name, Codec::Raw, 0, &bytes)?,
        }
    }
    Ok(())
}

/// Adds the sidecar sections to a block being written, then `extra`
/// sections (such as [`crate::lineage`]) in the sidecar encodings.
pub(crate) fn add_sidecars_and(
    w: &mut BlockWriter,
    sidecars: &Sidecars,
    extra: &[(&str, SidecarSection)],
) -> Result<(), Error> {
    add_sidecars(w, sidecars)?;
    for (name, section) in extra {
        match section {
            SidecarSection::Batch(b) => w.add_batches(name, Codec::Ipc, std::slice::from_ref(b))?,
            SidecarSection::Bytes(bytes) => w.add_bytes(name, Codec::Raw, 0, bytes)?,
        }
    }
    Ok(())
}

/// Writes a hot block: every table as a plain IPC section, then the
/// sidecars. Returns the whole object, ready for one PUT.
pub fn write_hot(tables: &TableSet, block_id: BlockId, tenant: TenantId) -> Result<Bytes, Error> {
    write_hot_with(tables, block_id, tenant, &[])
}

/// [`write_hot`] with `extra` sidecar sections after the built ones (a
/// merge adds its `lineage`).
pub fn write_hot_with(
    tables: &TableSet,
    block_id: BlockId,
    tenant: TenantId,
    extra: &[(&str, SidecarSection)],
) -> Result<Bytes, Error> {
    let mut w = BlockWriter::new(block_meta(tables, block_id, tenant, Level::Hot));
    for name in table_names(tables.signal) {
        w.add_batches(name, Codec::Ipc, std::slice::from_ref(tables.get(name)?))?;
    }
    add_sidecars_and(&mut w, &Sidecars::build(tables)?, extra)?;
    Ok(w.finish()?)
}

/// One table of a block as a single batch in the hot layout, whatever the
/// section's codec.
pub fn read_table(block: &Block, name: &'static str) -> Result<RecordBatch, Error> {
    let batches = block.read_batches(name)?;
    table_from_batches(name, batches)
}

/// Joins a section's batches into one and rebuilds the hot layout of cold
/// attribute tables. Hot sections hold exactly one batch, so nothing is
/// copied for them.
pub fn table_from_batches(name: &'static str, mut batches: Vec<RecordBatch>) -> Result<RecordBatch, Error> {
    // Cold attribute tables: rebuilt batch by batch, never joined typed.
    if is_attr_table(name)
        && batches
            .first()
            .is_some_and(|b| b.schema().column_with_name("type").is_some())
    {
        return Ok(attrs::from_typed_batches(&batches, name)?);
    }
    let batch = if batches.len() == 1 {
        batches.pop().ok_or(crate::convert::ConvertError::MissingTable(name))?
    } else if batches.is_empty() {
        // An empty Parquet section decodes to no batches at all.
        let schema = schema::of(name).ok_or(crate::convert::ConvertError::MissingTable(name))?;
        return Ok(RecordBatch::new_empty(schema));
    } else {
        let schema = batches
            .first()
            .map(RecordBatch::schema)
            .ok_or(crate::convert::ConvertError::MissingTable(name))?;
        arrow::compute::concat_batches(&schema, &batches)?
    };
    if is_attr_table(name) && batch.schema().column_with_name("type").is_some() {
        return Ok(attrs::from_typed(&batch, name)?);
    }
    Ok(batch)
}

/// Reads the named tables of a block (all of its signal's tables when
/// `names` is `None`). Only the sections named are fetched and verified.
pub fn read_tables(block: &Block, names: Option<&[&'static str]>) -> Result<TableSet, Error> {
    let meta = block.manifest().meta().clone();
    let names = names.unwrap_or(table_names(meta.signal));
    let mut tables = Vec::with_capacity(names.len());
    for name in names {
        tables.push((*name, read_table(block, name)?));
    }
    Ok(TableSet::from_tables(meta.signal, tables, meta.min_time, meta.max_time))
}

/// The block's pruning sidecars, reading only their sections.
pub fn read_sidecars(block: &Block) -> Result<Sidecars, Error> {
    use crate::sidecar::{ATTR_INDEX_SECTION, ID_BLOOM_SECTION, ROW_RANGES_SECTION, ZONE_MAP_SECTION};
    let raw = |name: &str| -> Result<Option<Bytes>, Error> {
        match block.manifest().section(name) {
            Some(_) => Ok(Some(block.section_bytes(name)?)),
            None => Ok(None),
        }
    };
    let (ids, ranges) = (raw(ID_BLOOM_SECTION)?, raw(ROW_RANGES_SECTION)?);
    sidecars_from(
        block.read_batches(ZONE_MAP_SECTION)?,
        block.read_batches(ATTR_INDEX_SECTION)?,
        ids.as_deref(),
        ranges.as_deref(),
    )
}

/// Sidecars from their decoded sections (zone map and attribute index, one
/// batch each) and the raw id filter and row range sections (absent in
/// some blocks), however they were fetched.
pub fn sidecars_from(
    zone: Vec<RecordBatch>,
    attrs: Vec<RecordBatch>,
    ids: Option<&[u8]>,
    ranges: Option<&[u8]>,
) -> Result<Sidecars, Error> {
    use crate::sidecar::{ATTR_INDEX_SECTION, ZONE_MAP_SECTION};
    let one = |name: &'static str, mut batches: Vec<RecordBatch>| -> Result<RecordBatch, Error> {
        if batches.len() != 1 {
            let reason = format!("holds {} batches, expected 1", batches.len());
            return Err(crate::sidecar::SidecarError::InvalidEntry {
                section: name,
                row: 0,
                reason,
            }
            .into());
        }
        Ok(batches.remove(0))
    };
    let zone = one(ZONE_MAP_SECTION, zone)?;
    let attrs = one(ATTR_INDEX_SECTION, attrs)?;
    Ok(Sidecars::from_sections(&zone, &attrs, ids, ranges)?)
}
