//! Typed column access with errors that name the table and column.

use arrow::array::{Array, DictionaryArray, FixedSizeBinaryArray, StringArray};
use arrow::datatypes::{DataType, UInt8Type, UInt16Type, UInt32Type};
use arrow::record_batch::RecordBatch;

use super::ConvertError;

pub fn col<'a, T: 'static>(
    batch: &'a RecordBatch,
    table: &'static str,
    column: &'static str,
) -> Result<&'a T, ConvertError> {
    batch
        .column_by_name(column)
        .ok_or(ConvertError::MissingColumn { table, column })?
        .as_any()
        .downcast_ref::<T>()
        .ok_or(ConvertError::WrongType { table, column })
}

/// Keys of a dictionary column, at the width the writer chose.
#[derive(Debug, Clone, Copy)]
enum Keys<'a> {
    U8(&'a [u8]),
    U16(&'a [u16]),
    U32(&'a [u32]),
}

/// A `Dictionary(UInt8|UInt16|UInt32, Utf8)` column. Keys are checked
/// against the values once, on construction.
#[derive(Debug, Clone, Copy)]
pub struct DictStr<'a> {
    keys: Keys<'a>,
    nulls: Option<&'a arrow::buffer::NullBuffer>,
    values: &'a StringArray,
}

fn typed_dict<K: arrow::datatypes::ArrowDictionaryKeyType>(arr: &dyn Array) -> Option<&DictionaryArray<K>> {
    arr.as_any().downcast_ref::<DictionaryArray<K>>()
}

impl<'a> DictStr<'a> {
    pub fn new(batch: &'a RecordBatch, table: &'static str, column: &'static str) -> Result<Self, ConvertError> {
        let arr = batch
            .column_by_name(column)
            .ok_or(ConvertError::MissingColumn { table, column })?;
        Self::from_dyn(arr.as_ref(), table, column)
    }

    pub fn from_dyn(arr: &'a dyn Array, table: &'static str, column: &'static str) -> Result<Self, ConvertError> {
        let wrong = ConvertError::WrongType { table, column };
        let DataType::Dictionary(k, _) = arr.data_type() else {
            return Err(wrong);
        };
        let (keys, nulls, values) = match k.as_ref() {
            DataType::UInt8 => {
                let d = typed_dict::<UInt8Type>(arr).ok_or(wrong)?;
                (Keys::U8(d.keys().values()), d.keys().nulls(), d.values())
            }
            DataType::UInt16 => {
                let d = typed_dict::<UInt16Type>(arr).ok_or(wrong)?;
                (Keys::U16(d.keys().values()), d.keys().nulls(), d.values())
            }
            DataType::UInt32 => {
                let d = typed_dict::<UInt32Type>(arr).ok_or(wrong)?;
                (Keys::U32(d.keys().values()), d.keys().nulls(), d.values())
            }
            _ => return Err(wrong),
        };
        let values = values
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or(ConvertError::WrongType { table, column })?;
        let d = DictStr { keys, nulls, values };
        // Keys index the values; a block whose keys point past them is
        // corrupt. Null slots may hold anything.
        if (0..d.len()).any(|r| !d.is_null(r) && d.key(r) >= values.len()) {
            return Err(ConvertError::WrongType { table, column });
        }
        Ok(d)
    }

    /// Rows.
    pub fn len(&self) -> usize {
        match self.keys {
            Keys::U8(k) => k.len(),
            Keys::U16(k) => k.len(),
            Keys::U32(k) => k.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The dictionary index of `row` (meaningless when the row is null).
    pub fn key(&self, row: usize) -> usize {
        match self.keys {
            Keys::U8(k) => usize::from(k[row]),
            Keys::U16(k) => usize::from(k[row]),
            Keys::U32(k) => k[row] as usize,
        }
    }

    pub fn is_null(&self, row: usize) -> bool {
        self.nulls.is_some_and(|n| n.is_null(row))
    }

    /// The string at `row`, or `None` when null.
    pub fn get(&self, row: usize) -> Option<&'a str> {
        if row >= self.len() || self.is_null(row) {
            return None;
        }
        Some(self.values.value(self.key(row)))
    }

    /// The distinct values.
    pub fn values(&self) -> &'a StringArray {
        self.values
    }

    /// For each row, `per_value[key]` (rows that are null read `false`).
    pub fn map_values(&self, per_value: &[bool]) -> Vec<bool> {
        (0..self.len())
            .map(|r| !self.is_null(r) && per_value[self.key(r)])
            .collect()
    }
}

/// Bytes of a nullable fixed-size id column; null gives an empty vector
/// (OTLP's "no id").
pub fn id_bytes(arr: &FixedSizeBinaryArray, row: usize) -> Vec<u8> {
    if arr.is_null(row) {
        Vec::new()
    } else {
        arr.value(row).to_vec()
    }
}

/// Checks an OTLP id is empty or exactly `expected` bytes.
pub fn check_id(field: &'static str, id: &[u8], expected: usize) -> Result<(), ConvertError> {
    if id.is_empty() || id.len() == expected {
        Ok(())
    } else {
        Err(ConvertError::InvalidId {
            field,
            expected,
            len: id.len(),
        })
    }
}

/// Appends an OTLP id (empty = null) to a fixed-size binary builder whose
/// width the caller has already checked with [`check_id`].
pub fn append_id(b: &mut arrow::array::FixedSizeBinaryBuilder, id: &[u8]) -> Result<(), ConvertError> {
    if id.is_empty() {
        b.append_null();
        Ok(())
    } else {
        Ok(b.append_value(id)?)
    }
}

/// A nullable fixed-size id column (OTLP trace and span ids; empty = null)
/// in a plain vector. Each id is one `[u8; N]` store (no `memcpy` call per
/// id), and the vector grows with `realloc`, which moves large blocks
/// without copying; Arrow's builders keep 64-byte-aligned buffers, which
/// the system allocator grows by allocating, copying and freeing. The
/// array is the one `FixedSizeBinaryBuilder` builds: null slots hold zeros.
#[derive(Debug)]
pub struct IdColumn<const N: usize> {
    values: Vec<[u8; N]>,
    nulls: arrow::array::builder::NullBufferBuilder,
}

impl<const N: usize> Default for IdColumn<N> {
    fn default() -> Self {
        IdColumn {
            values: Vec::new(),
            nulls: arrow::array::builder::NullBufferBuilder::new(0),
        }
    }
}

impl<const N: usize> IdColumn<N> {
    pub fn reserve(&mut self, additional: usize) {
        self.values.reserve(additional);
    }

    /// Appends an OTLP id, empty meaning null; an id of another length is
    /// refused (callers check ids with [`check_id`] before appending
    /// anything, so this only guards the invariant).
    #[inline(always)]
    pub fn append(&mut self, field: &'static str, id: &[u8]) -> Result<(), ConvertError> {
        if id.is_empty() {
            self.values.push([0; N]);
            self.nulls.append_null();
            return Ok(());
        }
        let v: [u8; N] = id.try_into().map_err(|_| ConvertError::InvalidId {
            field,
            expected: N,
            len: id.len(),
        })?;
        self.values.push(v);
        self.nulls.append_non_null();
        Ok(())
    }

    /// The array of everything appended; resets the column.
    pub fn finish(&mut self) -> Result<FixedSizeBinaryArray, ConvertError> {
        let values = std::mem::take(&mut self.values).into_flattened();
        Ok(FixedSizeBinaryArray::try_new(
            N as i32,
            arrow::buffer::Buffer::from_vec(values),
            self.nulls.finish(),
        )?)
    }
}

/// A non-null UTF-8 column in plain vectors (see [`IdColumn`] for why not
/// Arrow's builder); builds the array `StringBuilder` builds.
#[derive(Debug)]
pub struct TextColumn {
    offsets: Vec<i32>,
    data: Vec<u8>,
}

impl Default for TextColumn {
    fn default() -> Self {
        TextColumn {
            offsets: vec![0],
            data: Vec::new(),
        }
    }
}

impl TextColumn {
    pub fn reserve(&mut self, additional: usize) {
        self.offsets.reserve(additional);
    }

    /// Bytes of text held.
    pub fn value_bytes(&self) -> usize {
        self.data.len()
    }

    #[inline]
    pub fn append(&mut self, v: &str) {
        if !v.is_empty() {
            self.data.extend_from_slice(v.as_bytes());
        }
        // As `StringBuilder`, which panics past i32 offsets; blocks seal
        // long before (the text counts toward the builders' size target).
        let end = i32::try_from(self.data.len()).expect("a block's text column stays under 2 GiB");
        self.offsets.push(end);
    }

    /// The array of everything appended; resets the column.
    pub fn finish(&mut self) -> Result<StringArray, ConvertError> {
        let offsets = std::mem::replace(&mut self.offsets, vec![0]);
        let data = std::mem::take(&mut self.data);
        Ok(StringArray::try_new(
            arrow::buffer::OffsetBuffer::new(arrow::buffer::ScalarBuffer::from(offsets)),
            arrow::buffer::Buffer::from_vec(data),
            None,
        )?)
    }
}
