//! Reading a candidate block: its manifest, its sidecars and the sections
//! of the tables a query needs, fetched through the block cache (published
//! blocks) or taken from memory (recent ones), then decoded and scanned on
//! the scan pool. A published block's decoded tables are kept in the
//! decoded cache ([`mira_core::decoded`], `--decoded-cache-size`), so a
//! later query over the block reads and decodes nothing it already has. A
//! block's row ranges (those its `row_ranges` sidecar says may match, or
//! fixed ranges without one) are scanned in parallel on the pool and
//! merged, so one large merged block keeps every thread busy. What a
//! scan of a published block found is kept in the result cache
//! ([`crate::results`]) and a repeated scan is answered from it. Logs,
//! traces, labels and PromQL all read blocks here.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use futures::future::try_join_all;
use mira_core::block::{Block, Manifest, decode_section};
use mira_core::convert::TableSet;
use mira_core::decoded::{DecodedCache, decoded_weight};
use mira_core::scan::{ScanInput, ScanOutput, ScanRequest, tables_needed};
use mira_core::sidecar::{ATTR_INDEX_SECTION, ID_BLOOM_SECTION, ROW_RANGES_SECTION, Sidecars, ZONE_MAP_SECTION};
use mira_core::tables::{read_sidecars, read_tables, sidecars_from, table_from_batches};
use mira_core::{BlockId, Signal};
use rayon::iter::{IntoParallelRefIterator, ParallelIterator};

use crate::plan::{Candidate, Src};
use crate::stats::Stats;
use crate::{Querier, QueryError};

impl Querier {
    async fn manifest(&self, key: &str, stats: &Stats) -> Result<Arc<Manifest>, QueryError> {
        self.cache
            .manifest(&self.store, key, stats)
            .await
            .map_err(|e| QueryError::block(key, e))
    }

    /// The manifest and sidecars of a published block (both cached).
    pub(crate) async fn published_sidecars(
        &self,
        key: &str,
        stats: &Stats,
    ) -> Result<(Arc<Manifest>, Arc<Sidecars>), QueryError> {
        let manifest = self.manifest(key, stats).await?;
        let sidecars = self.sidecars(key, &manifest, stats).await?;
        Ok((manifest, sidecars))
    }

    /// The sidecars of any candidate: a published block's as above, a
    /// recent block's built from its tables.
    pub(crate) async fn block_sidecars(&self, c: &Candidate, stats: &Stats) -> Result<Arc<Sidecars>, QueryError> {
        match &c.src {
            Src::Recent(block) => {
                let block = block.clone();
                let id = c.id;
                self.on_pool(move || read_sidecars(&block))
                    .await
                    .map(Arc::new)
                    .map_err(|e| QueryError::corrupt(&format!("recent block {id}"), e))
            }
            Src::Published { key } => Ok(self.published_sidecars(key, stats).await?.1),
        }
    }

    /// A published block's sidecars: from the memo, or its sidecar
    /// sections fetched and decoded on the pool (then kept).
    async fn sidecars(&self, key: &str, manifest: &Manifest, stats: &Stats) -> Result<Arc<Sidecars>, QueryError> {
        if let Some(s) = self.cache.sidecars.get(key) {
            return Ok(s);
        }
        let (zone, attrs) = futures::try_join!(
            self.cache.section(&self.store, key, manifest, ZONE_MAP_SECTION, stats),
            self.cache
                .section(&self.store, key, manifest, ATTR_INDEX_SECTION, stats),
        )
        .map_err(|e| QueryError::block(key, e))?;
        // Raw sections some blocks lack: the id filter (metrics), the row
        // ranges (small and older blocks).
        let optional = |name: &'static str| async move {
            match manifest.section(name) {
                Some(_) => self
                    .cache
                    .section(&self.store, key, manifest, name, stats)
                    .await
                    .map(Some)
                    .map_err(|e| QueryError::block(key, e)),
                None => Ok(None),
            }
        };
        let (ids, ranges) = futures::try_join!(optional(ID_BLOOM_SECTION), optional(ROW_RANGES_SECTION))?;
        let id = manifest.meta.block_id;
        let (zone_entry, attr_entry) = (
            section_entry(manifest, ZONE_MAP_SECTION)?,
            section_entry(manifest, ATTR_INDEX_SECTION)?,
        );
        let owned = key.to_owned();
        let sidecars = self
            .on_pool(move || {
                let zone = decode_section(id, &zone_entry, zone)?;
                let attrs = decode_section(id, &attr_entry, attrs)?;
                sidecars_from(zone, attrs, ids.as_deref(), ranges.as_deref())
            })
            .await
            .map_err(|e| QueryError::corrupt(&owned, e))?;
        let sidecars = Arc::new(sidecars);
        self.cache.sidecars.insert(key, sidecars.clone());
        Ok(sidecars)
    }

    /// Prunes `c` by its sidecars, then reads the tables `req` needs and
    /// scans them on the pool. `None` when the block was pruned.
    pub(crate) async fn scan_candidate(
        &self,
        c: &Candidate,
        signal: Signal,
        req: ScanRequest,
        stats: &Stats,
    ) -> Result<Option<ScanOutput>, QueryError> {
        if !self.may_match(c, &req.predicate, stats).await? {
            return Ok(None);
        }
        // A published block's result may be kept ([`crate::results`]);
        // the tenant and id come from its footer, which the block cache
        // checked against the object key the plan listed.
        let cache_key = match &c.src {
            Src::Published { key } if self.results.enabled() => {
                let manifest = self.manifest(key, stats).await?;
                let m = &manifest.meta;
                Some(crate::results::scan_key(
                    m.tenant.as_str(),
                    m.block_id,
                    signal,
                    &req,
                    m.min_time,
                    m.max_time,
                ))
            }
            _ => None,
        };
        let limit = req.limit;
        // A hit counts as fetched (its rows are read, from the cache).
        stats.add_fetched();
        if let Some(k) = &cache_key
            && let Some(out) = self.results.scan(k, limit, stats)
        {
            return Ok(Some(out));
        }
        // The row range summaries (cached with the other sidecars) of a
        // published block; recent blocks are small and scanned whole.
        let sidecars = match &c.src {
            Src::Published { key } => Some(self.published_sidecars(key, stats).await?.1),
            Src::Recent(_) => None,
        };
        let raw = self
            .raw_tables(c, &tables_needed(signal, &req.predicate), stats)
            .await?;
        let what = raw.what();
        // Decode in one task on the pool, then scan the block's row ranges
        // that may match in parallel on the same pool.
        let out = self
            .on_pool(move || {
                let tables = raw.decode()?;
                let input = ScanInput::load(&tables, &req.predicate)?;
                let prepared = input.prepare(&req)?;
                let ranges = sidecars.as_ref().and_then(|s| s.ranges.as_ref());
                // A wave per pool's worth of ranges: a limited scan ordered
                // by time stops after the waves that can make the cut.
                // Stopped at the next row range once the query is dropped.
                let cancel = crate::pool::current();
                prepared.scan_in_waves(ranges, rayon::current_num_threads(), |batch| {
                    batch
                        .par_iter()
                        .map(|rows| {
                            if cancel.is_set() {
                                return Err(mira_core::Error::Cancelled);
                            }
                            prepared.scan_rows(rows.clone())
                        })
                        .collect()
                })
            })
            .await
            .map_err(|e| match e {
                mira_core::Error::Scan(e) => QueryError::from(e),
                mira_core::Error::Cancelled => QueryError::Cancelled,
                other => QueryError::corrupt(&what, other),
            })?;
        stats.add_rows(out.rows_scanned as u64);
        if let Some(k) = cache_key {
            self.results.insert_scan(k, &out, limit);
        }
        Ok(Some(out))
    }

    /// The tables a scan of `c` reads; counts the block as fetched.
    pub(crate) async fn scan_tables(
        &self,
        c: &Candidate,
        names: &[&'static str],
        stats: &Stats,
    ) -> Result<TableSet, QueryError> {
        stats.add_fetched();
        self.tables(c, names, stats).await
    }

    /// The named tables of a block: sections fetched (or mapped from the
    /// cache) concurrently, decoded on the scan pool.
    pub(crate) async fn tables(
        &self,
        c: &Candidate,
        names: &[&'static str],
        stats: &Stats,
    ) -> Result<TableSet, QueryError> {
        let raw = self.raw_tables(c, names, stats).await?;
        let what = raw.what();
        self.on_pool(move || raw.decode())
            .await
            .map_err(|e| QueryError::corrupt(&what, e))
    }

    /// The named tables' sections, ready to decode: for a published
    /// block, the tables the decoded cache holds as they are, the others'
    /// bytes fetched (or mapped from the disk cache).
    async fn raw_tables(&self, c: &Candidate, names: &[&'static str], stats: &Stats) -> Result<Raw, QueryError> {
        match &c.src {
            Src::Recent(block) => Ok(Raw::Recent {
                id: c.id,
                block: block.clone(),
                names: names.to_vec(),
            }),
            Src::Published { key } => {
                let manifest = self.manifest(key, stats).await?;
                let id = manifest.meta.block_id;
                let cached: Vec<Option<RecordBatch>> = names.iter().map(|name| self.decoded.get(id, name)).collect();
                let m = &*manifest;
                let sections = try_join_all(names.iter().zip(&cached).map(|(name, hit)| async move {
                    match hit {
                        Some(_) => Ok(None),
                        None => self.cache.section(&self.store, key, m, name, stats).await.map(Some),
                    }
                }))
                .await
                .map_err(|e| QueryError::block(key, e))?;
                let mut parts = Vec::with_capacity(names.len());
                for ((name, hit), bytes) in names.iter().zip(cached).zip(sections) {
                    parts.push(match (hit, bytes) {
                        (Some(batch), _) => (*name, Part::Decoded(batch)),
                        (None, bytes) => (
                            *name,
                            Part::Bytes(section_entry(&manifest, name)?, bytes.unwrap_or_default()),
                        ),
                    });
                }
                Ok(Raw::Published {
                    key: key.clone(),
                    meta: manifest.meta.clone(),
                    parts,
                    decoded: self.decoded.clone(),
                })
            }
        }
    }
}

/// One table of a published block: already decoded (from the decoded
/// cache), or its section's bytes, fetched and verified.
#[derive(Debug)]
enum Part {
    Decoded(RecordBatch),
    Bytes(mira_core::block::SectionEntry, bytes::Bytes),
}

/// Some of a block's tables, fetched and verified but not all yet decoded
/// (decoding is CPU work for the scan pool).
#[derive(Debug)]
enum Raw {
    Published {
        key: String,
        meta: mira_core::block::BlockMeta,
        parts: Vec<(&'static str, Part)>,
        /// Where the tables decoded here are kept.
        decoded: Arc<DecodedCache>,
    },
    Recent {
        id: BlockId,
        block: Arc<Block>,
        names: Vec<&'static str>,
    },
}

impl Raw {
    /// The block, for error messages.
    fn what(&self) -> String {
        match self {
            Raw::Published { key, .. } => format!("block {key}"),
            Raw::Recent { id, .. } => format!("recent block {id}"),
        }
    }

    fn decode(self) -> Result<TableSet, mira_core::Error> {
        match self {
            Raw::Recent { block, names, .. } => read_tables(&block, Some(&names)),
            Raw::Published {
                meta, parts, decoded, ..
            } => {
                let mut tables = Vec::with_capacity(parts.len());
                for (name, part) in parts {
                    let table = match part {
                        Part::Decoded(batch) => batch,
                        Part::Bytes(entry, bytes) => {
                            let batches = decode_section(meta.block_id, &entry, bytes)?;
                            let table = table_from_batches(name, batches)?;
                            decoded.insert(meta.block_id, name, table.clone(), decoded_weight(&entry, &table));
                            table
                        }
                    };
                    tables.push((name, table));
                }
                Ok(TableSet::from_tables(meta.signal, tables, meta.min_time, meta.max_time))
            }
        }
    }
}

fn section_entry(manifest: &Manifest, name: &str) -> Result<mira_core::block::SectionEntry, QueryError> {
    manifest
        .section(name)
        .map(|(_, e)| e.clone())
        .ok_or_else(|| QueryError::Internal(format!("block {} has no section {name:?}", manifest.meta.block_id)))
}
