//! Typed column access with errors that name the table and column.

use arrow::array::{Array, DictionaryArray, FixedSizeBinaryArray, StringArray};
use arrow::datatypes::UInt32Type;
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

/// A `Dictionary(UInt32, Utf8)` column.
#[derive(Debug, Clone, Copy)]
pub struct DictStr<'a> {
    keys: &'a arrow::array::UInt32Array,
    values: &'a StringArray,
}

impl<'a> DictStr<'a> {
    pub fn new(batch: &'a RecordBatch, table: &'static str, column: &'static str) -> Result<Self, ConvertError> {
        Self::from_array(col::<DictionaryArray<UInt32Type>>(batch, table, column)?, table, column)
    }

    pub fn from_array(
        arr: &'a DictionaryArray<UInt32Type>,
        table: &'static str,
        column: &'static str,
    ) -> Result<Self, ConvertError> {
        let values = arr
            .values()
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or(ConvertError::WrongType { table, column })?;
        let keys = arr.keys();
        // Keys index the values; a block whose keys point past them is corrupt.
        if keys.iter().flatten().any(|k| k as usize >= values.len()) {
            return Err(ConvertError::WrongType { table, column });
        }
        Ok(DictStr { keys, values })
    }

    /// The string at `row`, or `None` when null.
    pub fn get(&self, row: usize) -> Option<&'a str> {
        if self.keys.is_null(row) {
            return None;
        }
        Some(self.values.value(self.keys.value(row) as usize))
    }

    pub fn values(&self) -> &'a StringArray {
        self.values
    }

    pub fn keys(&self) -> &'a arrow::array::UInt32Array {
        self.keys
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
