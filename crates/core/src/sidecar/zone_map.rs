//! [`ZoneMap`]: the smallest and largest value of every numeric column of a
//! block's root table (and of the span duration), for range pruning.

use std::sync::{Arc, OnceLock};

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, PrimitiveArray, StringArray, UInt64Array};
use arrow::compute::{binary, cast, max, min};
use arrow::datatypes::{
    ArrowNumericType, DataType, Field, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, Schema,
    SchemaRef, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow::record_batch::RecordBatch;

use super::ZONE_MAP_SECTION;
use super::error::SidecarError;
use crate::ids::Signal;
use crate::schema;

/// Name of the derived span duration (`end - start`, saturating at 0) in a
/// spans block's zone map.
pub const DURATION: &str = "duration";

/// The values one column takes in a block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ZoneRange {
    /// No value: the block has no rows, or every value is null (or NaN).
    Empty,
    /// A signed integer column.
    Int { min: i64, max: i64 },
    /// An unsigned integer column.
    UInt { min: u64, max: u64 },
    /// A floating-point column; NaN is not counted.
    Float { min: f64, max: f64 },
}

impl ZoneRange {
    /// Whether a value in `lo..=hi` may occur. An empty range (`lo > hi`)
    /// never matches.
    pub fn may_overlap(&self, lo: i128, hi: i128) -> bool {
        if lo > hi {
            return false;
        }
        match *self {
            ZoneRange::Empty => false,
            ZoneRange::Int { min, max } => lo <= i128::from(max) && hi >= i128::from(min),
            ZoneRange::UInt { min, max } => lo <= i128::from(max) && hi >= i128::from(min),
            ZoneRange::Float { min, max } => float_below(lo) <= max && float_above(hi) >= min,
        }
    }

    /// Whether a value in `lo..=hi` may occur, for float bounds. NaN bounds
    /// say nothing, so they never prune.
    pub fn may_overlap_f64(&self, lo: f64, hi: f64) -> bool {
        if lo.is_nan() || hi.is_nan() {
            return !matches!(self, ZoneRange::Empty);
        }
        if lo > hi {
            return false;
        }
        let (min, max) = match *self {
            ZoneRange::Empty => return false,
            ZoneRange::Int { min, max } => (float_below(i128::from(min)), float_above(i128::from(max))),
            ZoneRange::UInt { min, max } => (float_below(i128::from(min)), float_above(i128::from(max))),
            ZoneRange::Float { min, max } => (min, max),
        };
        lo <= max && hi >= min
    }
}

/// The largest f64 that is at most `v`.
fn float_below(v: i128) -> f64 {
    let f = v as f64;
    if f as i128 > v { f.next_down() } else { f }
}

/// The smallest f64 that is at least `v`.
fn float_above(v: i128) -> f64 {
    let f = v as f64;
    if (f as i128) < v { f.next_up() } else { f }
}

/// Min/max per numeric column of one block's root table, in table order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ZoneMap {
    columns: Vec<(String, ZoneRange)>,
}

fn bounds<T: ArrowNumericType>(a: &PrimitiveArray<T>) -> Option<(T::Native, T::Native)> {
    Some((min(a)?, max(a)?))
}

fn column_range(column: &ArrayRef) -> Option<ZoneRange> {
    fn int<T: ArrowNumericType>(a: &ArrayRef) -> Option<ZoneRange>
    where
        T::Native: Into<i64>,
    {
        let r = a.as_primitive_opt::<T>().and_then(bounds);
        Some(r.map_or(ZoneRange::Empty, |(min, max)| ZoneRange::Int {
            min: min.into(),
            max: max.into(),
        }))
    }
    fn uint<T: ArrowNumericType>(a: &ArrayRef) -> Option<ZoneRange>
    where
        T::Native: Into<u64>,
    {
        let r = a.as_primitive_opt::<T>().and_then(bounds);
        Some(r.map_or(ZoneRange::Empty, |(min, max)| ZoneRange::UInt {
            min: min.into(),
            max: max.into(),
        }))
    }
    fn float<T: ArrowNumericType>(a: &ArrayRef) -> Option<ZoneRange>
    where
        T::Native: Into<f64>,
    {
        let a = a.as_primitive_opt::<T>()?;
        // min/max order NaN above every number; NaN carries no range, so
        // drop it (as null) first when there is any.
        let r = if a.values().iter().any(|v| (*v).into().is_nan()) {
            let no_nan: Float64Array = a.unary_opt(|v| Some(v.into()).filter(|f: &f64| !f.is_nan()));
            bounds(&no_nan)
        } else {
            bounds(a).map(|(min, max)| (min.into(), max.into()))
        };
        Some(r.map_or(ZoneRange::Empty, |(min, max)| ZoneRange::Float { min, max }))
    }
    match column.data_type() {
        DataType::Int8 => int::<Int8Type>(column),
        DataType::Int16 => int::<Int16Type>(column),
        DataType::Int32 => int::<Int32Type>(column),
        DataType::Int64 => int::<Int64Type>(column),
        DataType::UInt8 => uint::<UInt8Type>(column),
        DataType::UInt16 => uint::<UInt16Type>(column),
        DataType::UInt32 => uint::<UInt32Type>(column),
        DataType::UInt64 => uint::<UInt64Type>(column),
        DataType::Float32 => float::<Float32Type>(column),
        DataType::Float64 => float::<Float64Type>(column),
        _ => None,
    }
}

impl ZoneMap {
    /// Min/max of every integer and float column of `root` (the block's root
    /// table), plus [`DURATION`] for spans.
    pub fn build(root: &RecordBatch, signal: Signal) -> Result<Self, SidecarError> {
        let mut columns = Vec::new();
        for (field, column) in root.schema().fields().iter().zip(root.columns()) {
            if let Some(range) = column_range(column) {
                columns.push((field.name().clone(), range));
            }
        }
        if signal == Signal::Traces {
            let start = u64_column(root, "start_time_unix_nano")?;
            let end = u64_column(root, "end_time_unix_nano")?;
            let duration: UInt64Array = binary(end, start, u64::saturating_sub)?;
            let range = bounds(&duration).map_or(ZoneRange::Empty, |(min, max)| ZoneRange::UInt { min, max });
            columns.push((DURATION.to_owned(), range));
        }
        Ok(ZoneMap { columns })
    }

    /// The range of `column`, if the zone map covers it.
    pub fn get(&self, column: &str) -> Option<ZoneRange> {
        self.columns.iter().find(|(c, _)| c == column).map(|(_, r)| *r)
    }

    /// Every column covered, in root-table order ([`DURATION`] last).
    pub fn columns(&self) -> impl Iterator<Item = (&str, ZoneRange)> {
        self.columns.iter().map(|(c, r)| (c.as_str(), *r))
    }

    /// Whether `column` may take a value in `lo..=hi`; true when the zone map
    /// does not cover `column`.
    pub fn may_overlap(&self, column: &str, lo: i128, hi: i128) -> bool {
        self.get(column).is_none_or(|r| r.may_overlap(lo, hi))
    }

    /// Float version of [`ZoneMap::may_overlap`].
    pub fn may_overlap_f64(&self, column: &str, lo: f64, hi: f64) -> bool {
        self.get(column).is_none_or(|r| r.may_overlap_f64(lo, hi))
    }

    /// Schema of the `zone_map` section: one row per column; the pair of
    /// min/max columns matching the column's kind is set, the others are
    /// null (all six are null for [`ZoneRange::Empty`]).
    pub fn schema() -> SchemaRef {
        static S: OnceLock<SchemaRef> = OnceLock::new();
        S.get_or_init(|| {
            Arc::new(Schema::new(vec![
                Field::new("column", DataType::Utf8, false),
                Field::new("min_i", DataType::Int64, true),
                Field::new("max_i", DataType::Int64, true),
                Field::new("min_u", DataType::UInt64, true),
                Field::new("max_u", DataType::UInt64, true),
                Field::new("min_f", DataType::Float64, true),
                Field::new("max_f", DataType::Float64, true),
            ]))
        })
        .clone()
    }

    /// Encodes the zone map as the `zone_map` section's batch.
    pub fn to_batch(&self) -> Result<RecordBatch, SidecarError> {
        let n = self.columns.len();
        let names = StringArray::from_iter_values(self.columns.iter().map(|(c, _)| c));
        let (mut min_i, mut max_i) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut min_u, mut max_u) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut min_f, mut max_f) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for (_, range) in &self.columns {
            let (i, u, f) = match *range {
                ZoneRange::Empty => (None, None, None),
                ZoneRange::Int { min, max } => (Some((min, max)), None, None),
                ZoneRange::UInt { min, max } => (None, Some((min, max)), None),
                ZoneRange::Float { min, max } => (None, None, Some((min, max))),
            };
            min_i.push(i.map(|p| p.0));
            max_i.push(i.map(|p| p.1));
            min_u.push(u.map(|p| p.0));
            max_u.push(u.map(|p| p.1));
            min_f.push(f.map(|p| p.0));
            max_f.push(f.map(|p| p.1));
        }
        let cols: Vec<ArrayRef> = vec![
            Arc::new(names),
            Arc::new(Int64Array::from(min_i)),
            Arc::new(Int64Array::from(max_i)),
            Arc::new(UInt64Array::from(min_u)),
            Arc::new(UInt64Array::from(max_u)),
            Arc::new(Float64Array::from(min_f)),
            Arc::new(Float64Array::from(max_f)),
        ];
        Ok(RecordBatch::try_new(Self::schema(), cols)?)
    }

    /// Decodes a `zone_map` section's batch, checking every row.
    pub fn from_batch(batch: &RecordBatch) -> Result<Self, SidecarError> {
        const S: &str = ZONE_MAP_SECTION;
        let names = cast(section_column(batch, "column")?, &DataType::Utf8)?;
        let names = names.as_string_opt::<i32>().ok_or(SidecarError::WrongType {
            table: S,
            column: "column",
        })?;
        let min_i = typed::<Int64Type>(batch, "min_i")?;
        let max_i = typed::<Int64Type>(batch, "max_i")?;
        let min_u = typed::<UInt64Type>(batch, "min_u")?;
        let max_u = typed::<UInt64Type>(batch, "max_u")?;
        let min_f = typed::<Float64Type>(batch, "min_f")?;
        let max_f = typed::<Float64Type>(batch, "max_f")?;
        let invalid = |row, reason: &str| SidecarError::InvalidEntry {
            section: S,
            row,
            reason: reason.to_owned(),
        };
        // Root tables have a few dozen numeric columns; more rows than this
        // is not a zone map this build wrote.
        const MAX_COLUMNS: usize = 1024;
        if batch.num_rows() > MAX_COLUMNS {
            return Err(invalid(MAX_COLUMNS, "more columns than any root table has"));
        }
        let mut seen = std::collections::HashSet::with_capacity(batch.num_rows());
        let mut columns: Vec<(String, ZoneRange)> = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            if names.is_null(row) {
                return Err(invalid(row, "column name is null"));
            }
            let name = names.value(row);
            if !seen.insert(name) {
                return Err(invalid(row, &format!("column {name:?} appears twice")));
            }
            let i = pair(min_i, max_i, row);
            let u = pair(min_u, max_u, row);
            let f = pair(min_f, max_f, row);
            let range = match (i, u, f) {
                (Pair::Null, Pair::Null, Pair::Null) => ZoneRange::Empty,
                (Pair::Both(min, max), Pair::Null, Pair::Null) => ZoneRange::Int { min, max },
                (Pair::Null, Pair::Both(min, max), Pair::Null) => ZoneRange::UInt { min, max },
                (Pair::Null, Pair::Null, Pair::Both(min, max)) => {
                    if min.is_nan() || max.is_nan() {
                        return Err(invalid(row, "float bound is NaN"));
                    }
                    ZoneRange::Float { min, max }
                }
                _ => {
                    return Err(invalid(
                        row,
                        "exactly one min/max pair must be set, both ends or neither",
                    ));
                }
            };
            let ordered = match range {
                ZoneRange::Empty => true,
                ZoneRange::Int { min, max } => min <= max,
                ZoneRange::UInt { min, max } => min <= max,
                ZoneRange::Float { min, max } => min <= max,
            };
            if !ordered {
                return Err(invalid(row, "min is greater than max"));
            }
            columns.push((name.to_owned(), range));
        }
        Ok(ZoneMap { columns })
    }
}

enum Pair<T> {
    Null,
    Both(T, T),
    Half,
}

fn pair<T: ArrowNumericType>(min: &PrimitiveArray<T>, max: &PrimitiveArray<T>, row: usize) -> Pair<T::Native> {
    match (min.is_valid(row), max.is_valid(row)) {
        (false, false) => Pair::Null,
        (true, true) => Pair::Both(min.value(row), max.value(row)),
        _ => Pair::Half,
    }
}

fn section_column<'a>(batch: &'a RecordBatch, column: &'static str) -> Result<&'a ArrayRef, SidecarError> {
    batch.column_by_name(column).ok_or(SidecarError::MissingColumn {
        table: ZONE_MAP_SECTION,
        column,
    })
}

fn typed<'a, T: ArrowNumericType>(
    batch: &'a RecordBatch,
    column: &'static str,
) -> Result<&'a PrimitiveArray<T>, SidecarError> {
    section_column(batch, column)?
        .as_primitive_opt::<T>()
        .ok_or(SidecarError::WrongType {
            table: ZONE_MAP_SECTION,
            column,
        })
}

fn u64_column<'a>(root: &'a RecordBatch, column: &'static str) -> Result<&'a UInt64Array, SidecarError> {
    root.column_by_name(column)
        .ok_or(SidecarError::MissingColumn {
            table: schema::SPANS,
            column,
        })?
        .as_primitive_opt::<UInt64Type>()
        .ok_or(SidecarError::WrongType {
            table: schema::SPANS,
            column,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(cols).expect("batch")
    }

    #[test]
    fn min_max_per_kind_ignoring_nulls_and_nan() {
        let root = batch(vec![
            (
                "u",
                Arc::new(UInt64Array::from(vec![Some(5), None, Some(2), Some(u64::MAX)])) as ArrayRef,
            ),
            (
                "i",
                Arc::new(arrow::array::Int32Array::from(vec![Some(-3), Some(7), None, Some(0)])),
            ),
            (
                "f",
                Arc::new(Float64Array::from(vec![Some(f64::NAN), Some(1.5), Some(-0.25), None])),
            ),
            (
                "nan",
                Arc::new(Float64Array::from(vec![Some(f64::NAN), None, Some(f64::NAN), None])),
            ),
            ("s", Arc::new(StringArray::from(vec!["a", "b", "c", "d"]))),
        ]);
        let z = ZoneMap::build(&root, Signal::Logs).expect("build");
        assert_eq!(z.get("u"), Some(ZoneRange::UInt { min: 2, max: u64::MAX }));
        assert_eq!(z.get("i"), Some(ZoneRange::Int { min: -3, max: 7 }));
        assert_eq!(z.get("f"), Some(ZoneRange::Float { min: -0.25, max: 1.5 }));
        assert_eq!(z.get("nan"), Some(ZoneRange::Empty));
        assert_eq!(z.get("s"), None, "strings are not zone-mapped");
        assert_eq!(z.columns().count(), 4);

        assert!(z.may_overlap("u", 0, 2));
        assert!(!z.may_overlap("u", 0, 1));
        assert!(z.may_overlap("u", i128::from(u64::MAX), i128::MAX));
        assert!(!z.may_overlap("i", 8, 100));
        assert!(!z.may_overlap("i", -100, -4));
        assert!(z.may_overlap("i", -100, -3));
        assert!(!z.may_overlap("i", 5, 4), "empty query range");
        assert!(z.may_overlap("f", 1, 1));
        assert!(!z.may_overlap("f", 2, 10));
        assert!(
            !z.may_overlap("nan", i128::MIN, i128::MAX),
            "no values, nothing can match"
        );
        assert!(z.may_overlap("unknown", 0, 0), "unknown columns never prune");
        assert!(z.may_overlap_f64("f", 1.5, 3.0));
        assert!(!z.may_overlap_f64("f", 1.5000001, 3.0));
        assert!(z.may_overlap_f64("f", f64::NAN, 0.0));
        assert!(
            z.may_overlap_f64("i", 6.5, 6.9),
            "an int range covers the floats between its bounds"
        );
        assert!(!z.may_overlap_f64("i", 7.5, 9.0));
    }

    #[test]
    fn float_bounds_are_conservative_for_large_integers() {
        // 2^53 + 1 is not an f64; the float range [2^53, 2^53] must still
        // overlap a query for exactly 2^53 and not prune [2^53+1, 2^53+1]
        // wrongly in the other direction.
        let big = 1i128 << 53;
        let r = ZoneRange::Float {
            min: big as f64,
            max: big as f64,
        };
        assert!(r.may_overlap(big, big));
        assert!(r.may_overlap(big + 1, big + 1), "inexact bounds widen, never narrow");
        assert!(!r.may_overlap(big + 4, big + 8));
        let r = ZoneRange::UInt {
            min: u64::MAX,
            max: u64::MAX,
        };
        assert!(r.may_overlap_f64(u64::MAX as f64, f64::INFINITY));
    }

    #[test]
    fn empty_root_gives_empty_ranges() {
        let root = RecordBatch::new_empty(schema::spans());
        let z = ZoneMap::build(&root, Signal::Traces).expect("build");
        assert_eq!(z.get(DURATION), Some(ZoneRange::Empty));
        assert_eq!(z.get("start_time_unix_nano"), Some(ZoneRange::Empty));
        assert!(!z.may_overlap(DURATION, 0, i128::MAX));
    }

    #[test]
    fn batch_round_trip() {
        let z = ZoneMap {
            columns: vec![
                (
                    "a".into(),
                    ZoneRange::Int {
                        min: i64::MIN,
                        max: i64::MAX,
                    },
                ),
                ("b".into(), ZoneRange::UInt { min: 0, max: u64::MAX }),
                (
                    "c".into(),
                    ZoneRange::Float {
                        min: f64::NEG_INFINITY,
                        max: -0.0,
                    },
                ),
                ("d".into(), ZoneRange::Empty),
            ],
        };
        let b = z.to_batch().expect("encode");
        assert_eq!(ZoneMap::from_batch(&b).expect("decode"), z);
        assert_eq!(
            ZoneMap::from_batch(&ZoneMap::default().to_batch().expect("encode")).expect("decode"),
            ZoneMap::default()
        );
    }

    fn with_column(b: &RecordBatch, name: &str, col: ArrayRef) -> RecordBatch {
        let mut cols = b.columns().to_vec();
        let i = b.schema().index_of(name).expect("column");
        cols[i] = col;
        let fields: Vec<Field> = b
            .schema()
            .fields()
            .iter()
            .enumerate()
            .map(|(j, f)| {
                if j == i {
                    Field::new(f.name(), cols[i].data_type().clone(), true)
                } else {
                    f.as_ref().clone()
                }
            })
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).expect("batch")
    }

    #[test]
    fn malformed_batches_are_errors() {
        let z = ZoneMap {
            columns: vec![
                ("a".into(), ZoneRange::Int { min: 1, max: 2 }),
                ("b".into(), ZoneRange::Empty),
            ],
        };
        let good = z.to_batch().expect("encode");
        let cases: Vec<(&str, RecordBatch)> = vec![
            (
                "half pair",
                with_column(&good, "max_i", Arc::new(Int64Array::from(vec![None, None]))),
            ),
            (
                "two kinds",
                with_column(&good, "min_u", Arc::new(UInt64Array::from(vec![Some(1), None]))),
            ),
            (
                "inverted",
                with_column(&good, "min_i", Arc::new(Int64Array::from(vec![Some(3), None]))),
            ),
            (
                "duplicate",
                with_column(&good, "column", Arc::new(StringArray::from(vec!["a", "a"]))),
            ),
            (
                "null name",
                with_column(&good, "column", Arc::new(StringArray::from(vec![Some("a"), None]))),
            ),
            (
                "wrong type",
                with_column(&good, "min_i", Arc::new(UInt64Array::from(vec![Some(1), None]))),
            ),
            ("missing", good.project(&[0, 1, 2, 3, 4, 5]).expect("project")),
        ];
        for (what, b) in cases {
            assert!(ZoneMap::from_batch(&b).is_err(), "{what} must be rejected");
        }
        let nan = batch(vec![
            ("column", Arc::new(StringArray::from(vec!["f"])) as ArrayRef),
            ("min_i", Arc::new(Int64Array::from(vec![None::<i64>]))),
            ("max_i", Arc::new(Int64Array::from(vec![None::<i64>]))),
            ("min_u", Arc::new(UInt64Array::from(vec![None::<u64>]))),
            ("max_u", Arc::new(UInt64Array::from(vec![None::<u64>]))),
            ("min_f", Arc::new(Float64Array::from(vec![f64::NAN]))),
            ("max_f", Arc::new(Float64Array::from(vec![1.0]))),
        ]);
        assert!(ZoneMap::from_batch(&nan).is_err());
    }
}
