//! Attribute tables: one row per attribute, `parent` pointing at the row of
//! the owning table. Hot blocks hold values in a dense union (see
//! [`crate::schema::attr_type`]); the cold tier uses one nullable column per
//! type ([`crate::schema::attrs_typed`]). Both convert losslessly.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayBuilder, ArrayRef, BinaryArray, BinaryBuilder, BooleanArray, BooleanBuilder, Float64Array,
    Float64Builder, Int8Array, Int32Array, Int64Array, Int64Builder, RunArray, UInt32Array, UnionArray,
};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::Int32Type;
use arrow::record_batch::RecordBatch;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use prost::Message;

use crate::convert::ConvertError;
use crate::convert::columns::{DictStr, col};
use crate::convert::wire::{AttrDicts, AttrView, Text, Val};
use crate::dict::DictBuilder;
use crate::schema::{self, attr_type};

/// Appends attributes of many parents; parents must be appended in
/// non-decreasing order so a parent's attributes are contiguous.
#[derive(Default)]
pub struct AttrBuilder {
    /// Parent of each row, run-length encoded: a parent's attributes are
    /// contiguous, so one run per parent instead of one value per row.
    run_ends: Vec<i32>,
    run_parents: Vec<u32>,
    key: DictBuilder,
    type_ids: Vec<i8>,
    offsets: Vec<i32>,
    str: DictBuilder,
    int: Vec<i64>,
    double: Vec<f64>,
    boolean: BooleanBuilder,
    bytes: BinaryBuilder,
    any: BinaryBuilder,
    kv: BinaryBuilder,
}

impl std::fmt::Debug for AttrBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttrBuilder")
            .field("rows", &self.type_ids.len())
            .finish_non_exhaustive()
    }
}

impl AttrBuilder {
    pub fn len(&self) -> usize {
        self.type_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.type_ids.is_empty()
    }

    /// Approximate bytes held, for seal-size accounting.
    pub fn approx_bytes(&self) -> usize {
        self.type_ids.len() * 9
            + self.run_parents.len() * 8
            + self.int.len() * 8
            + self.double.len() * 8
            + self.bytes.values_slice().len()
            + self.any.values_slice().len()
            + self.kv.values_slice().len()
            + self.key.value_bytes()
            + self.str.value_bytes()
    }

    /// Room for `additional` more attributes (their keys, types and
    /// offsets; the value columns grow as values arrive).
    pub fn reserve(&mut self, additional: usize) {
        self.key.reserve(additional);
        self.type_ids.reserve(additional);
        self.offsets.reserve(additional);
    }

    pub fn append_all(&mut self, parent: u32, kvs: &[KeyValue]) {
        for kv in kvs {
            self.append(parent, kv);
        }
    }

    pub fn append(&mut self, parent: u32, kv: &KeyValue) {
        self.kv_row(kv);
        self.extend_run(parent);
    }

    /// [`AttrBuilder::append`] without the parent's run.
    fn kv_row(&mut self, kv: &KeyValue) {
        let key = Text::Str(&kv.key);
        match (&kv.value, kv.key_strindex) {
            (Some(AnyValue { value: Some(v) }), 0) => match v {
                Value::StringValue(s) => self.val_row(key, &Val::Str(Text::Str(s))),
                Value::IntValue(i) => self.val_row(key, &Val::Int(*i)),
                Value::DoubleValue(d) => self.val_row(key, &Val::Double(*d)),
                Value::BoolValue(b) => self.val_row(key, &Val::Bool(*b)),
                Value::BytesValue(b) => self.val_row(key, &Val::Bytes(b)),
                Value::ArrayValue(_) | Value::KvlistValue(_) | Value::StringValueStrindex(_) => {
                    let encoded = kv.value.as_ref().map(Message::encode_to_vec).unwrap_or_default();
                    self.push_value(key, attr_type::ANY, |b| b.any.append_value(encoded));
                }
            },
            (Some(AnyValue { value: None }), 0) => self.push_value(key, attr_type::ANY, |b| b.any.append_value([])),
            _ => self.push_value(key, attr_type::KV, |b| b.kv.append_value(kv.encode_to_vec())),
        }
    }

    /// The dictionaries of keys and string values, for the wire reader to
    /// look strings up in while parsing.
    pub(crate) fn dicts(&self) -> AttrDicts<'_> {
        AttrDicts {
            keys: &self.key,
            strs: &self.str,
        }
    }

    /// Appends a value the wire reader decoded without prost.
    pub(crate) fn append_val(&mut self, parent: u32, key: Text<'_>, v: &Val<'_>) {
        self.val_row(key, v);
        self.extend_run(parent);
    }

    /// Appends the attributes of one parent the wire reader parsed; the
    /// parent's run is extended once for the list, not checked per row.
    pub(crate) fn append_views(&mut self, parent: u32, attrs: &[AttrView<'_>]) {
        if attrs.is_empty() {
            return;
        }
        for a in attrs {
            self.val_row(a.key, &a.value);
        }
        self.extend_run(parent);
    }

    /// [`AttrBuilder::append_val`] without the parent's run.
    #[inline(always)]
    fn val_row(&mut self, key: Text<'_>, v: &Val<'_>) {
        match v {
            // Forced inline: the compiler kept this one out of line.
            Val::Str(s) => self.push_value(
                key,
                attr_type::STR,
                #[inline(always)]
                |b| s.append_to(&mut b.str),
            ),
            Val::Int(i) => self.push_value(key, attr_type::INT, |b| b.int.push(*i)),
            Val::Double(d) => self.push_value(key, attr_type::DOUBLE, |b| b.double.push(*d)),
            Val::Bool(x) => self.push_value(key, attr_type::BOOL, |b| b.boolean.append_value(*x)),
            Val::Bytes(x) => self.push_value(key, attr_type::BYTES, |b| b.bytes.append_value(x)),
            Val::Other(kv) => self.kv_row(kv),
        }
    }

    /// Appends one row but for its parent's run: the key, the type, and
    /// the value, which `write` appends to the child of `type_id`.
    #[inline(always)]
    fn push_value(&mut self, key: Text<'_>, type_id: i8, write: impl FnOnce(&mut Self)) {
        key.append_to(&mut self.key);
        self.type_and_value(type_id, write);
    }

    /// Appends one row for a key already appended to `self.key`.
    fn push_row(&mut self, parent: u32, type_id: i8, write: impl FnOnce(&mut Self)) {
        self.type_and_value(type_id, write);
        self.extend_run(parent);
    }

    /// The type and value of a row whose key is appended.
    #[inline(always)]
    fn type_and_value(&mut self, type_id: i8, write: impl FnOnce(&mut Self)) {
        let offset = self.child_len(type_id);
        write(self);
        self.type_ids.push(type_id);
        // A block holds far fewer than 2^31 attributes of one type: the
        // seal size bounds it.
        self.offsets.push(offset as i32);
    }

    /// Ends `parent`'s run at the rows appended so far: extends it if it is
    /// the last run, else starts it.
    #[inline(always)]
    fn extend_run(&mut self, parent: u32) {
        // Rows stay far below 2^31 per block: the seal size bounds them.
        let rows = self.type_ids.len() as i32;
        match (self.run_parents.last(), self.run_ends.last_mut()) {
            (Some(&p), Some(end)) if p == parent => *end = rows,
            _ => {
                self.run_parents.push(parent);
                self.run_ends.push(rows);
            }
        }
    }

    fn child_len(&self, type_id: i8) -> usize {
        match type_id {
            attr_type::STR => self.str.len(),
            attr_type::INT => self.int.len(),
            attr_type::DOUBLE => self.double.len(),
            attr_type::BOOL => self.boolean.len(),
            attr_type::BYTES => self.bytes.len(),
            attr_type::ANY => self.any.len(),
            _ => self.kv.len(),
        }
    }

    pub fn finish(&mut self) -> Result<RecordBatch, ConvertError> {
        let run_ends = Int32Array::from(std::mem::take(&mut self.run_ends));
        let parent =
            RunArray::<Int32Type>::try_new(&run_ends, &UInt32Array::from(std::mem::take(&mut self.run_parents)))?;
        let key = self.key.finish()?;
        let str_child = self.str.finish()?;
        let fields = schema::attr_value_fields_with(str_child.data_type().clone());
        let children: Vec<ArrayRef> = vec![
            str_child,
            Arc::new(Int64Array::from(std::mem::take(&mut self.int))),
            Arc::new(Float64Array::from(std::mem::take(&mut self.double))),
            Arc::new(self.boolean.finish()),
            Arc::new(self.bytes.finish()),
            Arc::new(self.any.finish()),
            Arc::new(self.kv.finish()),
        ];
        let value = UnionArray::try_new(
            fields,
            ScalarBuffer::from(std::mem::take(&mut self.type_ids)),
            Some(ScalarBuffer::from(std::mem::take(&mut self.offsets))),
            children,
        )?;
        Ok(schema::batch(
            &schema::attrs(),
            vec![Arc::new(parent), key, Arc::new(value)],
        )?)
    }
}

/// The run ends and parents of an attribute table's run-end encoded
/// `parent` column, checked: ends strictly increase and the last is `rows`.
fn parent_runs<'a>(
    batch: &'a RecordBatch,
    table: &'static str,
    rows: usize,
) -> Result<(&'a [i32], &'a [u32]), ConvertError> {
    let bad = ConvertError::WrongType {
        table,
        column: "parent",
    };
    let runs: &RunArray<Int32Type> = col(batch, table, "parent")?;
    let values = runs.values().as_any().downcast_ref::<UInt32Array>().ok_or(bad)?;
    let ends = runs.run_ends().values();
    let increasing = ends.windows(2).all(|w| w[0] < w[1]) && ends.first().is_none_or(|&e| e > 0);
    if !increasing
        || ends.last().map_or(0, |&e| e as usize) != rows
        || values.len() != ends.len()
        || runs.run_ends().offset() != 0
    {
        return Err(ConvertError::WrongType {
            table,
            column: "parent",
        });
    }
    Ok((ends, values.values()))
}

/// Typed access to a hot attribute table.
#[derive(Debug)]
pub struct AttrReader<'a> {
    table: &'static str,
    run_ends: &'a [i32],
    run_parents: &'a [u32],
    /// Whether parents strictly ascend run by run (so runs can be found by
    /// binary search).
    ascending: bool,
    key: DictStr<'a>,
    value: &'a UnionArray,
    str: DictStr<'a>,
    int: &'a Int64Array,
    double: &'a Float64Array,
    boolean: &'a BooleanArray,
    bytes: &'a BinaryArray,
    any: &'a BinaryArray,
    kv: &'a BinaryArray,
}

fn child<'a, T: 'static>(u: &'a UnionArray, id: i8, table: &'static str) -> Result<&'a T, ConvertError> {
    u.child(id)
        .as_any()
        .downcast_ref::<T>()
        .ok_or(ConvertError::WrongType { table, column: "value" })
}

impl<'a> AttrReader<'a> {
    pub fn new(batch: &'a RecordBatch, table: &'static str) -> Result<Self, ConvertError> {
        let value: &UnionArray = col(batch, table, "value")?;
        // A hostile block may hold any union the IPC reader accepts: insist
        // on a dense union with every child before asking for children.
        let complete = match value.data_type() {
            arrow::datatypes::DataType::Union(fields, arrow::datatypes::UnionMode::Dense) => {
                (attr_type::STR..=attr_type::KV).all(|id| fields.iter().any(|(f, _)| f == id))
            }
            _ => false,
        };
        if !complete {
            return Err(ConvertError::WrongType { table, column: "value" });
        }
        let ids = value.type_ids();
        if ids.iter().any(|&t| !(attr_type::STR..=attr_type::KV).contains(&t)) {
            return Err(ConvertError::WrongType { table, column: "value" });
        }
        let (run_ends, run_parents) = parent_runs(batch, table, value.len())?;
        Ok(AttrReader {
            table,
            run_ends,
            run_parents,
            ascending: run_parents.windows(2).all(|w| w[0] < w[1]),
            key: DictStr::new(batch, table, "key")?,
            str: DictStr::from_dyn(value.child(attr_type::STR).as_ref(), table, "value")?,
            int: child(value, attr_type::INT, table)?,
            double: child(value, attr_type::DOUBLE, table)?,
            boolean: child(value, attr_type::BOOL, table)?,
            bytes: child(value, attr_type::BYTES, table)?,
            any: child(value, attr_type::ANY, table)?,
            kv: child(value, attr_type::KV, table)?,
            value,
        })
    }

    pub fn len(&self) -> usize {
        self.value.len()
    }

    pub fn is_empty(&self) -> bool {
        self.value.is_empty()
    }

    /// Each row's parent, in row order.
    pub fn parents(&self) -> impl Iterator<Item = u32> + '_ {
        let mut start = 0usize;
        self.run_ends.iter().zip(self.run_parents).flat_map(move |(&end, &p)| {
            let n = end as usize - start;
            start = end as usize;
            std::iter::repeat_n(p, n)
        })
    }

    pub fn key(&self, row: usize) -> &'a str {
        self.key.get(row).unwrap_or("")
    }

    pub fn type_id(&self, row: usize) -> i8 {
        self.value.type_id(row)
    }

    /// The string value of `row`, if it is a string.
    pub fn str_value(&self, row: usize) -> Option<&'a str> {
        (self.value.type_id(row) == attr_type::STR).then(|| self.str.get(self.offset(row)).unwrap_or(""))
    }

    fn offset(&self, row: usize) -> usize {
        self.value.value_offset(row)
    }

    /// Appends the attribute at `row` to `out` in a self-delimiting form:
    /// two rows append the same bytes exactly when they hold the same key
    /// and the same typed value (a content key, cheaper than decoding).
    pub fn content_key(&self, row: usize, out: &mut Vec<u8>) -> Result<(), ConvertError> {
        let put = |out: &mut Vec<u8>, b: &[u8]| {
            out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend_from_slice(b);
        };
        put(out, self.key(row).as_bytes());
        let t = self.value.type_id(row);
        out.push(t as u8);
        let o = self.offset(row);
        match t {
            attr_type::STR => put(out, self.str.get(o).unwrap_or("").as_bytes()),
            attr_type::INT => out.extend_from_slice(&self.int.value(self.checked(self.int, o)?).to_le_bytes()),
            attr_type::DOUBLE => {
                out.extend_from_slice(&self.double.value(self.checked(self.double, o)?).to_bits().to_le_bytes())
            }
            attr_type::BOOL => out.push(u8::from(self.boolean.value(self.checked(self.boolean, o)?))),
            attr_type::BYTES => put(out, self.bytes.value(self.checked(self.bytes, o)?)),
            attr_type::ANY => put(out, self.any.value(self.checked(self.any, o)?)),
            _ => put(out, self.kv.value(self.checked(self.kv, o)?)),
        }
        Ok(())
    }

    /// For a row holding a string, the dictionary indices of its key and
    /// of its value: rows with equal indices hold equal strings, so callers
    /// can work out something per distinct pair once. `None` for other
    /// values (and for null keys or values).
    pub fn str_pair_index(&self, row: usize) -> Option<(usize, usize)> {
        if self.value.type_id(row) != attr_type::STR || self.key.is_null(row) {
            return None;
        }
        let o = self.offset(row);
        (o < self.str.len() && !self.str.is_null(o)).then(|| (self.key.key(row), self.str.key(o)))
    }

    fn bad(&self, column: &'static str) -> ConvertError {
        ConvertError::WrongType {
            table: self.table,
            column,
        }
    }

    fn checked<T: Array>(&self, arr: &T, o: usize) -> Result<usize, ConvertError> {
        if o < arr.len() { Ok(o) } else { Err(self.bad("value")) }
    }

    /// The attribute at `row` as OTLP.
    pub fn key_value(&self, row: usize) -> Result<KeyValue, ConvertError> {
        let o = self.offset(row);
        let value = match self.value.type_id(row) {
            attr_type::STR => Value::StringValue(self.str.get(o).unwrap_or("").to_owned()),
            attr_type::INT => Value::IntValue(self.int.value(self.checked(self.int, o)?)),
            attr_type::DOUBLE => Value::DoubleValue(self.double.value(self.checked(self.double, o)?)),
            attr_type::BOOL => Value::BoolValue(self.boolean.value(self.checked(self.boolean, o)?)),
            attr_type::BYTES => Value::BytesValue(self.bytes.value(self.checked(self.bytes, o)?).to_vec()),
            attr_type::ANY => {
                let raw = self.any.value(self.checked(self.any, o)?);
                let v = AnyValue::decode(raw).map_err(|_| self.bad("value"))?;
                return Ok(KeyValue {
                    key: self.key(row).to_owned(),
                    value: Some(v),
                    key_strindex: 0,
                });
            }
            _ => {
                let raw = self.kv.value(self.checked(self.kv, o)?);
                return KeyValue::decode(raw).map_err(|_| self.bad("value"));
            }
        };
        Ok(KeyValue {
            key: self.key(row).to_owned(),
            value: Some(AnyValue { value: Some(value) }),
            key_strindex: 0,
        })
    }

    /// The value of `row` as matchers compare it: strings as they are,
    /// ints, doubles and bools as text; other types (bytes, arrays, maps,
    /// no value) have none.
    pub fn text(&self, row: usize) -> Option<std::borrow::Cow<'a, str>> {
        use std::borrow::Cow;
        let o = self.offset(row);
        let at = |len: usize| (o < len).then_some(o);
        match self.value.type_id(row) {
            attr_type::STR => Some(Cow::Borrowed(self.str.get(o).unwrap_or(""))),
            attr_type::INT => at(self.int.len()).map(|o| Cow::Owned(self.int.value(o).to_string())),
            attr_type::DOUBLE => at(self.double.len()).map(|o| Cow::Owned(self.double.value(o).to_string())),
            attr_type::BOOL => at(self.boolean.len()).map(|o| Cow::Owned(self.boolean.value(o).to_string())),
            _ => None,
        }
    }

    /// The rows of parents `parents.start..parents.end` with their parent,
    /// in row order. Parents ascend in the tables this crate writes, so
    /// the runs are found by binary search; otherwise every run is checked.
    pub fn rows_of(&self, parents: std::ops::Range<u32>) -> impl Iterator<Item = (usize, u32)> + '_ {
        let (first, last) = if self.ascending {
            (
                self.run_parents.partition_point(|&p| p < parents.start),
                self.run_parents.partition_point(|&p| p < parents.end),
            )
        } else {
            (0, self.run_parents.len())
        };
        (first..last).flat_map(move |i| {
            let start = if i == 0 { 0 } else { self.run_ends[i - 1] as usize };
            let p = self.run_parents[i];
            let keep = parents.contains(&p);
            (start..self.run_ends[i] as usize)
                .filter(move |_| keep)
                .map(move |row| (row, p))
        })
    }

    /// All attributes grouped by parent, for parents `0..n_parents`.
    pub fn grouped(&self, n_parents: usize) -> Result<Vec<Vec<KeyValue>>, ConvertError> {
        let mut out: Vec<Vec<KeyValue>> = Vec::new();
        out.resize_with(n_parents, Vec::new);
        for (row, p) in self.parents().enumerate() {
            let p = p as usize;
            let slot = out
                .get_mut(p)
                .ok_or(ConvertError::BadReference { table: self.table, row })?;
            slot.push(self.key_value(row)?);
        }
        Ok(out)
    }

    /// The attributes of the given parents only (missing parents have
    /// none); rows of other parents are skipped run by run, not decoded.
    pub fn grouped_for(&self, parents: &[u32]) -> Result<std::collections::HashMap<u32, Vec<KeyValue>>, ConvertError> {
        let wanted: std::collections::HashSet<u32> = parents.iter().copied().collect();
        let mut out: std::collections::HashMap<u32, Vec<KeyValue>> = std::collections::HashMap::new();
        let mut start = 0usize;
        for (&end, &p) in self.run_ends.iter().zip(self.run_parents) {
            let end = end as usize;
            if wanted.contains(&p) {
                let slot = out.entry(p).or_default();
                for row in start..end {
                    slot.push(self.key_value(row)?);
                }
            }
            start = end;
        }
        Ok(out)
    }
}

/// The rows of a hot attribute table whose owner row is kept, in row
/// order, re-parented: `new_parent[p]` is the new row of owner row `p`,
/// `None` when that row is dropped. The union children hold only the kept
/// rows' values, in row order (the layout the builders write), and the
/// key dictionary is left as it is (a merge re-interns it). A parent past
/// `new_parent` is an error.
pub fn filter_by_parent(
    batch: &RecordBatch,
    table: &'static str,
    new_parent: &[Option<u32>],
) -> Result<RecordBatch, ConvertError> {
    let r = AttrReader::new(batch, table)?;
    let mut rows = Vec::<u32>::new();
    let (mut run_ends, mut run_parents) = (Vec::<i32>::new(), Vec::<u32>::new());
    let mut start = 0usize;
    for (&end, &p) in r.run_ends.iter().zip(r.run_parents) {
        let end = end as usize;
        let to = new_parent
            .get(p as usize)
            .ok_or(ConvertError::BadReference { table, row: start })?;
        if let Some(to) = *to {
            rows.extend(start as u32..end as u32);
            // At most the table's rows, which `parent_runs` bounds by i32.
            let n = rows.len() as i32;
            match (run_parents.last(), run_ends.last_mut()) {
                (Some(&q), Some(e)) if q == to => *e = n,
                _ => {
                    run_parents.push(to);
                    run_ends.push(n);
                }
            }
        }
        start = end;
    }
    let arrow::datatypes::DataType::Union(fields, _) = r.value.data_type() else {
        return Err(r.bad("value"));
    };
    // Each child's kept values in row order, and each row's new offset.
    let mut taken: Vec<Vec<u32>> = vec![Vec::new(); (attr_type::KV + 1) as usize];
    let (mut type_ids, mut offsets) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
    for &row in &rows {
        let t = r.type_id(row as usize);
        let o = r.offset(row as usize);
        let child = &mut taken[t as usize];
        if o >= r.value.child(t).len() {
            return Err(r.bad("value"));
        }
        type_ids.push(t);
        offsets.push(child.len() as i32);
        child.push(o as u32);
    }
    let children = fields
        .iter()
        .map(|(id, _)| {
            let idx = UInt32Array::from(taken.get_mut(id as usize).map(std::mem::take).unwrap_or_default());
            arrow::compute::take(r.value.child(id).as_ref(), &idx, None)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let value = UnionArray::try_new(
        fields.clone(),
        ScalarBuffer::from(type_ids),
        Some(ScalarBuffer::from(offsets)),
        children,
    )?;
    let parent = RunArray::<Int32Type>::try_new(&Int32Array::from(run_ends), &UInt32Array::from(run_parents))?;
    let (mut parent, mut value) = (Some(Arc::new(parent) as ArrayRef), Some(Arc::new(value) as ArrayRef));
    let rows = UInt32Array::from(rows);
    let schema = batch.schema();
    let columns = schema
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, c)| match f.name().as_str() {
            "parent" => parent.take().ok_or(r.bad("parent")),
            "value" => value.take().ok_or(r.bad("value")),
            _ => Ok(arrow::compute::take(c.as_ref(), &rows, None)?),
        })
        .collect::<Result<Vec<_>, ConvertError>>()?;
    Ok(schema::batch(&schema, columns)?)
}

/// Rewrites a hot attribute table into the cold typed-column layout.
pub fn to_typed(batch: &RecordBatch, table: &'static str) -> Result<RecordBatch, ConvertError> {
    let r = AttrReader::new(batch, table)?;
    let n = r.len();
    let mut ty = Vec::with_capacity(n);
    let mut s = DictBuilder::default();
    let mut i = Int64Builder::with_capacity(n);
    let mut d = Float64Builder::with_capacity(n);
    let mut b = BooleanBuilder::with_capacity(n);
    let mut by = BinaryBuilder::new();
    for row in 0..n {
        let t = r.type_id(row);
        let o = r.offset(row);
        ty.push(t);
        match t {
            attr_type::STR => {
                s.append(r.str.get(o).unwrap_or(""));
            }
            _ => s.append_null(),
        }
        match t {
            attr_type::INT => i.append_value(r.int.value(r.checked(r.int, o)?)),
            _ => i.append_null(),
        }
        match t {
            attr_type::DOUBLE => d.append_value(r.double.value(r.checked(r.double, o)?)),
            _ => d.append_null(),
        }
        match t {
            attr_type::BOOL => b.append_value(r.boolean.value(r.checked(r.boolean, o)?)),
            _ => b.append_null(),
        }
        match t {
            attr_type::BYTES => by.append_value(r.bytes.value(r.checked(r.bytes, o)?)),
            attr_type::ANY => by.append_value(r.any.value(r.checked(r.any, o)?)),
            attr_type::KV => by.append_value(r.kv.value(r.checked(r.kv, o)?)),
            _ => by.append_null(),
        }
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from_iter_values(r.parents())),
        batch
            .column_by_name("key")
            .cloned()
            .ok_or(ConvertError::MissingColumn { table, column: "key" })?,
        Arc::new(Int8Array::from(ty)),
        s.finish()?,
        Arc::new(i.finish()),
        Arc::new(d.finish()),
        Arc::new(b.finish()),
        Arc::new(by.finish()),
    ];
    Ok(schema::batch(&schema::attrs_typed(), cols)?)
}

/// Rebuilds the hot layout from the cold typed-column layout.
pub fn from_typed(batch: &RecordBatch, table: &'static str) -> Result<RecordBatch, ConvertError> {
    from_typed_batches(std::slice::from_ref(batch), table)
}

/// Per value of a source dictionary, its key in a [`DictBuilder`], interned
/// on first use (so keys still follow first appearance); reused while the
/// next batch shares the dictionary.
#[derive(Default)]
struct KeyMemo {
    /// The dictionary values' data pointer and length it was built for.
    of: (usize, usize),
    ids: Vec<u32>,
}

impl KeyMemo {
    const UNSET: u32 = u32::MAX;

    fn reset_for(&mut self, d: &DictStr<'_>) {
        let v = d.values();
        let of = (v.values().as_ptr() as usize, v.len());
        if of != self.of || self.ids.len() != v.len() {
            self.of = of;
            self.ids.clear();
            self.ids.resize(v.len(), Self::UNSET);
        }
    }

    /// The builder key of row `row` of `d` (a null row reads as "").
    fn key(&mut self, d: &DictStr<'_>, row: usize, b: &mut DictBuilder) -> u32 {
        if d.is_null(row) {
            return b.intern("");
        }
        let k = d.key(row);
        match self.ids[k] {
            Self::UNSET => {
                let id = b.intern(d.values().value(k));
                self.ids[k] = id;
                id
            }
            id => id,
        }
    }
}

/// [`from_typed`] over a table's batches in order (a decoded Parquet
/// section), without joining them first. Each distinct key and string is
/// interned once per source dictionary, not once per row.
pub fn from_typed_batches(batches: &[RecordBatch], table: &'static str) -> Result<RecordBatch, ConvertError> {
    let mut out = AttrBuilder::default();
    let (mut keys, mut strs) = (KeyMemo::default(), KeyMemo::default());
    let bad = |column| ConvertError::WrongType { table, column };
    for batch in batches {
        let parent: &UInt32Array = col(batch, table, "parent")?;
        let key = DictStr::new(batch, table, "key")?;
        let ty: &Int8Array = col(batch, table, "type")?;
        let s = DictStr::new(batch, table, "str")?;
        let i: &Int64Array = col(batch, table, "int")?;
        let d: &Float64Array = col(batch, table, "double")?;
        let b: &BooleanArray = col(batch, table, "bool")?;
        let by: &BinaryArray = col(batch, table, "bytes")?;
        keys.reset_for(&key);
        strs.reset_for(&s);
        for row in 0..batch.num_rows() {
            let p = parent.value(row);
            let t = ty.value(row);
            let valid = match t {
                attr_type::STR => !s.is_null(row),
                attr_type::INT => i.is_valid(row),
                attr_type::DOUBLE => d.is_valid(row),
                attr_type::BOOL => b.is_valid(row),
                attr_type::BYTES | attr_type::ANY | attr_type::KV => by.is_valid(row),
                _ => false,
            };
            if !valid {
                return Err(bad(if t == attr_type::STR { "str" } else { "type" }));
            }
            let k = keys.key(&key, row, &mut out.key);
            out.key.push_key(k);
            match t {
                attr_type::STR => {
                    let v = strs.key(&s, row, &mut out.str);
                    out.push_row(p, t, |o| o.str.push_key(v));
                }
                attr_type::INT => out.push_row(p, t, |o| o.int.push(i.value(row))),
                attr_type::DOUBLE => out.push_row(p, t, |o| o.double.push(d.value(row))),
                attr_type::BOOL => out.push_row(p, t, |o| o.boolean.append_value(b.value(row))),
                attr_type::BYTES => out.push_row(p, t, |o| o.bytes.append_value(by.value(row))),
                attr_type::ANY => out.push_row(p, t, |o| o.any.append_value(by.value(row))),
                _ => out.push_row(p, t, |o| o.kv.append_value(by.value(row))),
            }
        }
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList};

    fn kv(key: &str, v: Option<Value>) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: v }),
            key_strindex: 0,
        }
    }

    fn sample() -> Vec<Vec<KeyValue>> {
        vec![
            vec![
                kv("s", Some(Value::StringValue("x".into()))),
                kv("i", Some(Value::IntValue(i64::MIN))),
                kv("d", Some(Value::DoubleValue(f64::NAN))),
            ],
            vec![],
            vec![
                kv("b", Some(Value::BoolValue(true))),
                kv("y", Some(Value::BytesValue(vec![0, 255]))),
                kv(
                    "a",
                    Some(Value::ArrayValue(ArrayValue {
                        values: vec![AnyValue {
                            value: Some(Value::IntValue(1)),
                        }],
                    })),
                ),
                kv(
                    "l",
                    Some(Value::KvlistValue(KeyValueList {
                        values: vec![kv("n", None)],
                    })),
                ),
                kv("e", None),
                KeyValue {
                    key: "none".into(),
                    value: None,
                    key_strindex: 0,
                },
                KeyValue {
                    key: "idx".into(),
                    value: None,
                    key_strindex: 7,
                },
                kv("s", Some(Value::StringValue("x".into()))),
            ],
        ]
    }

    fn encoded(groups: &[Vec<KeyValue>]) -> Vec<Vec<Vec<u8>>> {
        groups
            .iter()
            .map(|g| g.iter().map(Message::encode_to_vec).collect())
            .collect()
    }

    #[test]
    fn union_and_typed_layouts_round_trip() {
        let groups = sample();
        let mut b = AttrBuilder::default();
        for (p, g) in groups.iter().enumerate() {
            b.append_all(p as u32, g);
        }
        let hot = b.finish().expect("finish");
        let back = AttrReader::new(&hot, "t").and_then(|r| r.grouped(3)).expect("read");
        assert_eq!(encoded(&back), encoded(&groups));

        let cold = to_typed(&hot, "t").expect("to typed");
        let hot2 = from_typed(&cold, "t").expect("from typed");
        let back2 = AttrReader::new(&hot2, "t").and_then(|r| r.grouped(3)).expect("read");
        assert_eq!(encoded(&back2), encoded(&groups));
    }

    #[test]
    fn typed_batches_rebuild_what_the_joined_table_does() {
        // Many parents, repeated keys and values, so dictionaries matter.
        let groups: Vec<Vec<KeyValue>> = (0..50)
            .map(|p| {
                let mut g = sample()[p % 3].clone();
                g.push(kv("k", Some(Value::StringValue(format!("v{}", p % 7)))));
                g
            })
            .collect();
        let mut b = AttrBuilder::default();
        for (p, g) in groups.iter().enumerate() {
            b.append_all(p as u32, g);
        }
        let cold = to_typed(&b.finish().expect("finish"), "t").expect("to typed");
        let whole = from_typed(&cold, "t").expect("whole");
        let n = cold.num_rows();
        // Slices share one dictionary (the memo is reused across them)...
        let slices: Vec<RecordBatch> = (0..n).step_by(17).map(|s| cold.slice(s, 17.min(n - s))).collect();
        // ...separately encoded batches each have their own.
        let separate: Vec<RecordBatch> = groups
            .chunks(9)
            .enumerate()
            .map(|(c, chunk)| {
                let mut b = AttrBuilder::default();
                for (i, g) in chunk.iter().enumerate() {
                    b.append_all((c * 9 + i) as u32, g);
                }
                to_typed(&b.finish().expect("finish"), "t").expect("to typed")
            })
            .collect();
        for batches in [slices, separate] {
            let rebuilt = from_typed_batches(&batches, "t").expect("batches");
            assert_eq!(rebuilt, whole);
        }
        let back = AttrReader::new(&whole, "t").and_then(|r| r.grouped(50)).expect("read");
        assert_eq!(encoded(&back), encoded(&groups));
    }

    #[test]
    fn filtering_by_parent_keeps_the_kept_owners_attributes_re_parented() {
        let groups = sample();
        let mut b = AttrBuilder::default();
        for (p, g) in groups.iter().enumerate() {
            b.append_all(p as u32, g);
        }
        let hot = b.finish().expect("finish");
        // Owner 0 dropped, 1 (no attributes) and 2 kept as rows 0 and 1.
        let out = filter_by_parent(&hot, "t", &[None, Some(0), Some(1)]).expect("filter");
        let back = AttrReader::new(&out, "t").and_then(|r| r.grouped(2)).expect("read");
        assert_eq!(encoded(&back), encoded(&[vec![], groups[2].clone()]));
        // Every union child holds only the kept values, in row order.
        let value: &UnionArray = col(&out, "t", "value").expect("value");
        let children: usize = (attr_type::STR..=attr_type::KV).map(|id| value.child(id).len()).sum();
        assert_eq!(children, groups[2].len());
        let none = filter_by_parent(&hot, "t", &[None, None, None]).expect("filter");
        assert_eq!(none.num_rows(), 0);
        assert!(matches!(
            filter_by_parent(&hot, "t", &[Some(0), Some(1)]),
            Err(ConvertError::BadReference { .. })
        ));
    }

    #[test]
    fn a_union_missing_children_is_an_error() {
        use arrow::datatypes::{DataType, Field, Schema, UnionFields};
        let hot = {
            let mut b = AttrBuilder::default();
            b.append(0, &kv("k", Some(Value::IntValue(1))));
            b.finish().expect("finish")
        };
        // The same parent and key columns, with a union of two children.
        let fields = UnionFields::try_new(
            vec![attr_type::STR, attr_type::INT],
            vec![
                Field::new(
                    "str",
                    DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8)),
                    false,
                ),
                Field::new("int", DataType::Int64, false),
            ],
        )
        .expect("fields");
        let value = UnionArray::try_new(
            fields.clone(),
            ScalarBuffer::from(vec![attr_type::INT]),
            Some(ScalarBuffer::from(vec![0i32])),
            vec![
                Arc::new(
                    arrow::array::DictionaryArray::<arrow::datatypes::UInt32Type>::try_new(
                        UInt32Array::from(Vec::<u32>::new()),
                        Arc::new(arrow::array::StringArray::from(Vec::<&str>::new())),
                    )
                    .expect("dict"),
                ),
                Arc::new(Int64Array::from(vec![1i64])),
            ],
        )
        .expect("union");
        let schema = Schema::new(vec![
            hot.schema().field(0).clone(),
            hot.schema().field(1).clone(),
            Field::new(
                "value",
                DataType::Union(fields, arrow::datatypes::UnionMode::Dense),
                false,
            ),
        ]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![hot.column(0).clone(), hot.column(1).clone(), Arc::new(value)],
        )
        .expect("batch");
        assert!(matches!(
            AttrReader::new(&batch, "t"),
            Err(ConvertError::WrongType { .. })
        ));
    }

    #[test]
    fn parent_out_of_range_is_an_error() {
        let mut b = AttrBuilder::default();
        b.append(5, &kv("k", Some(Value::IntValue(1))));
        let hot = b.finish().expect("finish");
        let r = AttrReader::new(&hot, "t").expect("reader");
        assert!(matches!(r.grouped(2), Err(ConvertError::BadReference { .. })));
    }
}
