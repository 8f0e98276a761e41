//! Lineage: where each row of a merged block came from (compactor design
//! §6.1, §6.3). A merge concatenates its inputs' rows in input order, so
//! the origins of a merged block are a few runs: "the next `rows` rows are
//! rows `first_row..` of block `block`". Runs are stored as the sidecar
//! section `lineage` (Arrow IPC, one batch; columns `src_block`
//! FixedSizeBinary(16), `src_first_row` u32, `rows` u32), and a row's
//! offset is the prefix sum of the runs before it.
//!
//! A block written by the ingester has no `lineage` section: each of its
//! rows is its own origin ([`Lineage::identity`]). A merge of merged
//! blocks composes their runs, so a row's origin is always the row of the
//! block it was first sealed in, however often it was rewritten. Queriers
//! order tied log lines by origin, so a cursor survives a merge.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, FixedSizeBinaryArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

use crate::block::Block;
use crate::error::Error;
use crate::ids::BlockId;
use crate::sidecar::SidecarError;

/// Section name of the lineage runs.
pub const LINEAGE_SECTION: &str = "lineage";

/// `rows` consecutive rows that are rows `first_row..first_row + rows` of
/// block `block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub block: BlockId,
    pub first_row: u32,
    pub rows: u32,
}

/// The origin of every row of one block, as runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lineage {
    runs: Vec<Run>,
    /// `starts[i]` is the block row where run `i` starts (prefix sums).
    starts: Vec<u64>,
    rows: u64,
}

/// The section's schema.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("src_block", DataType::FixedSizeBinary(16), false),
        Field::new("src_first_row", DataType::UInt32, false),
        Field::new("rows", DataType::UInt32, false),
    ]))
}

impl Lineage {
    /// Rows `0..rows` of block `id` are their own origin.
    pub fn identity(id: BlockId, rows: u32) -> Lineage {
        let mut l = Lineage::default();
        l.push(Run {
            block: id,
            first_row: 0,
            rows,
        });
        l
    }

    /// Appends a run after the last row; joins it to the last run when it
    /// continues it. Empty runs are skipped.
    pub fn push(&mut self, run: Run) {
        if run.rows == 0 {
            return;
        }
        self.rows += u64::from(run.rows);
        if let Some(last) = self.runs.last_mut()
            && last.block == run.block
            && u64::from(last.first_row) + u64::from(last.rows) == u64::from(run.first_row)
            && let Some(rows) = last.rows.checked_add(run.rows)
        {
            last.rows = rows;
            return;
        }
        self.starts.push(self.rows - u64::from(run.rows));
        self.runs.push(run);
    }

    /// Appends every run of `other` after the last row.
    pub fn extend(&mut self, other: &Lineage) {
        for r in &other.runs {
            self.push(*r);
        }
    }

    /// The lineage of the rows `keep` flags, in order: what a merge that
    /// drops the other rows (a retention rewrite) carries. Runs split where
    /// rows are dropped, so every kept row keeps its origin. `keep` has one
    /// flag per row; rows past its end are dropped.
    pub fn filter(&self, keep: &[bool]) -> Lineage {
        let mut out = Lineage::default();
        for (run, &start) in self.runs.iter().zip(&self.starts) {
            let flags = usize::try_from(start)
                .ok()
                .and_then(|s| keep.get(s..))
                .unwrap_or_default();
            let flags = &flags[..flags.len().min(run.rows as usize)];
            let mut i = 0;
            while i < flags.len() {
                let n = flags[i..].iter().take_while(|&&k| k).count();
                if n > 0 {
                    out.push(Run {
                        block: run.block,
                        first_row: run.first_row + i as u32,
                        rows: n as u32,
                    });
                }
                i += n;
                i += flags[i..].iter().take_while(|&&k| !k).count();
            }
        }
        out
    }

    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// Rows covered.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The origin of `row`: (block, row in that block). A row past the end
    /// is answered as if the last run went on (callers pass rows of the
    /// block, which [`Block::lineage`] checks the runs cover).
    pub fn origin(&self, row: u32) -> (BlockId, u32) {
        let row64 = u64::from(row);
        let i = self.starts.partition_point(|&s| s <= row64).saturating_sub(1);
        match (self.runs.get(i), self.starts.get(i)) {
            (Some(run), Some(&start)) => (run.block, run.first_row.wrapping_add((row64 - start) as u32)),
            _ => (BlockId::from_u128(0), row),
        }
    }

    /// The origins of `rows`, in the same order. Runs of ascending rows
    /// (what a scan returns) cost one step each, not a binary search.
    pub fn origins(&self, rows: &[u32]) -> Vec<(BlockId, u32)> {
        let mut out = Vec::with_capacity(rows.len());
        let mut i = 0usize;
        for &row in rows {
            let row64 = u64::from(row);
            let inside = |i: usize| {
                self.starts
                    .get(i)
                    .zip(self.runs.get(i))
                    .is_some_and(|(&s, r)| s <= row64 && row64 < s + u64::from(r.rows))
            };
            if !inside(i) {
                i = self.starts.partition_point(|&s| s <= row64).saturating_sub(1);
            }
            out.push(match (self.runs.get(i), self.starts.get(i)) {
                (Some(run), Some(&start)) => (run.block, run.first_row.wrapping_add((row64 - start) as u32)),
                _ => (BlockId::from_u128(0), row),
            });
        }
        out
    }

    /// The section batch.
    pub fn to_batch(&self) -> Result<RecordBatch, SidecarError> {
        let ids = FixedSizeBinaryArray::try_from_iter(self.runs.iter().map(|r| r.block.as_u128().to_be_bytes()))
            .or_else(|e| {
                // No runs: an empty column of the right width.
                if self.runs.is_empty() {
                    Ok(FixedSizeBinaryArray::new_null(16, 0))
                } else {
                    Err(e)
                }
            })?;
        let first: UInt32Array = self.runs.iter().map(|r| r.first_row).collect();
        let rows: UInt32Array = self.runs.iter().map(|r| r.rows).collect();
        let cols: Vec<ArrayRef> = vec![Arc::new(ids), Arc::new(first), Arc::new(rows)];
        Ok(RecordBatch::try_new(schema(), cols)?)
    }

    /// Reads the section batch back. Every run must be non-empty and stay
    /// within u32 rows of its source block.
    pub fn from_batch(batch: &RecordBatch) -> Result<Lineage, SidecarError> {
        let column = |name: &'static str| {
            batch.column_by_name(name).ok_or(SidecarError::MissingColumn {
                table: LINEAGE_SECTION,
                column: name,
            })
        };
        let wrong = |column: &'static str| SidecarError::WrongType {
            table: LINEAGE_SECTION,
            column,
        };
        let ids = column("src_block")?
            .as_any()
            .downcast_ref::<FixedSizeBinaryArray>()
            .filter(|a| a.value_length() == 16 && a.null_count() == 0)
            .ok_or_else(|| wrong("src_block"))?;
        let u32s = |name: &'static str| {
            column(name)?
                .as_any()
                .downcast_ref::<UInt32Array>()
                .filter(|a| a.null_count() == 0)
                .ok_or_else(|| wrong(name))
        };
        let (first, rows) = (u32s("src_first_row")?, u32s("rows")?);
        let mut l = Lineage::default();
        for i in 0..batch.num_rows() {
            let invalid = |reason: &str| SidecarError::InvalidEntry {
                section: LINEAGE_SECTION,
                row: i,
                reason: reason.to_owned(),
            };
            let id: [u8; 16] = ids.value(i).try_into().map_err(|_| wrong("src_block"))?;
            let (first_row, n) = (first.value(i), rows.value(i));
            if n == 0 {
                return Err(invalid("empty run"));
            }
            if first_row.checked_add(n - 1).is_none() {
                return Err(invalid("run ends past row 2^32"));
            }
            l.push(Run {
                block: BlockId::from_u128(u128::from_be_bytes(id)),
                first_row,
                rows: n,
            });
        }
        Ok(l)
    }
}

impl Block {
    /// The block's lineage, `None` for a block that has no `lineage`
    /// section (every row is its own origin; see
    /// [`Block::lineage_or_identity`]). The runs must cover exactly the
    /// block's rows.
    pub fn lineage(&self) -> Result<Option<Lineage>, Error> {
        if self.manifest().section(LINEAGE_SECTION).is_none() {
            return Ok(None);
        }
        let batches = self.read_batches(LINEAGE_SECTION)?;
        lineage_from(self.meta().rows, &batches).map(Some)
    }

    /// The block's lineage, or the identity for a block without one.
    pub fn lineage_or_identity(&self) -> Result<Lineage, Error> {
        match self.lineage()? {
            Some(l) => Ok(l),
            None => {
                let rows = u32::try_from(self.meta().rows).map_err(|_| SidecarError::InvalidEntry {
                    section: LINEAGE_SECTION,
                    row: 0,
                    reason: format!(
                        "block {} has {} rows, over 2^32",
                        self.meta().block_id,
                        self.meta().rows
                    ),
                })?;
                Ok(Lineage::identity(self.meta().block_id, rows))
            }
        }
    }
}

/// The lineage in a decoded `lineage` section of a block of `rows` rows
/// (for readers that fetch sections themselves, as the querier does).
pub fn lineage_from(rows: u64, batches: &[RecordBatch]) -> Result<Lineage, Error> {
    let mut l = Lineage::default();
    for b in batches {
        l.extend(&Lineage::from_batch(b)?);
    }
    if l.rows() != rows {
        return Err(SidecarError::InvalidEntry {
            section: LINEAGE_SECTION,
            row: 0,
            reason: format!("runs cover {} rows, the block holds {rows}", l.rows()),
        }
        .into());
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> BlockId {
        BlockId::from_u128(n)
    }

    #[test]
    fn origins_follow_the_runs_and_adjacent_runs_join() {
        let mut l = Lineage::default();
        l.push(Run {
            block: id(1),
            first_row: 0,
            rows: 3,
        });
        l.push(Run {
            block: id(1),
            first_row: 3,
            rows: 2,
        });
        l.push(Run {
            block: id(2),
            first_row: 0,
            rows: 0,
        });
        l.push(Run {
            block: id(2),
            first_row: 10,
            rows: 2,
        });
        assert_eq!(l.runs().len(), 2);
        assert_eq!(l.rows(), 7);
        let want = [
            (id(1), 0),
            (id(1), 1),
            (id(1), 2),
            (id(1), 3),
            (id(1), 4),
            (id(2), 10),
            (id(2), 11),
        ];
        for (row, w) in want.iter().enumerate() {
            assert_eq!(l.origin(row as u32), *w);
        }
        let rows = [6, 0, 5, 1, 2, 3];
        let got = l.origins(&rows);
        assert_eq!(got, rows.iter().map(|&r| l.origin(r)).collect::<Vec<_>>());
    }

    #[test]
    fn filter_keeps_the_origins_of_kept_rows_and_splits_runs() {
        let mut l = Lineage::identity(id(1), 4);
        l.push(Run {
            block: id(2),
            first_row: 10,
            rows: 3,
        });
        let keep = [true, false, true, true, true, true, false];
        let f = l.filter(&keep);
        let kept: Vec<u32> = (0..7u32).filter(|&r| keep[r as usize]).collect();
        assert_eq!(f.rows(), kept.len() as u64);
        assert_eq!(f.origins(&(0..f.rows() as u32).collect::<Vec<_>>()), l.origins(&kept));
        // Row 1 dropped splits block 1's run; block 2's run ends early.
        let runs: Vec<(u128, u32, u32)> = f
            .runs()
            .iter()
            .map(|r| (r.block.as_u128(), r.first_row, r.rows))
            .collect();
        assert_eq!(runs, vec![(1, 0, 1), (1, 2, 2), (2, 10, 2)]);
        assert_eq!(l.filter(&[true; 7]), l);
        assert_eq!(l.filter(&[false; 7]), Lineage::default());
        // Rows past the flags are dropped.
        assert_eq!(l.filter(&[true, true]), Lineage::identity(id(1), 2));
    }

    #[test]
    fn section_round_trips_and_bad_sections_are_refused() {
        let mut l = Lineage::identity(id(7), 5);
        l.extend(&Lineage::identity(id(9), 2));
        let batch = l.to_batch().expect("batch");
        assert_eq!(Lineage::from_batch(&batch).expect("read"), l);
        assert_eq!(lineage_from(7, std::slice::from_ref(&batch)).expect("covers"), l);
        assert!(lineage_from(8, &[batch]).is_err());
        let empty = Lineage::default().to_batch().expect("empty batch");
        assert_eq!(Lineage::from_batch(&empty).expect("read"), Lineage::default());

        let zero = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(FixedSizeBinaryArray::try_from_iter([[0u8; 16]].into_iter()).expect("ids")),
                Arc::new(UInt32Array::from(vec![0])),
                Arc::new(UInt32Array::from(vec![0])),
            ],
        )
        .expect("batch");
        assert!(Lineage::from_batch(&zero).is_err());
        let overflow = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(FixedSizeBinaryArray::try_from_iter([[0u8; 16]].into_iter()).expect("ids")),
                Arc::new(UInt32Array::from(vec![u32::MAX])),
                Arc::new(UInt32Array::from(vec![2])),
            ],
        )
        .expect("batch");
        assert!(Lineage::from_batch(&overflow).is_err());
    }
}
