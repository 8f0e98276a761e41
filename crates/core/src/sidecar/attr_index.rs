//! [`AttrIndex`]: which attribute keys occur in a block and, while there are
//! few, which string values each takes. Also indexes the root table's
//! dictionary string columns that queries filter on (span name, severity
//! text, metric name) as pseudo-keys of the [`AttrScope::Field`] scope.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, OnceLock};

use crate::convert::columns::DictStr;
use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, StringArray, StringBuilder, StringDictionaryBuilder, UnionArray,
};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type, UnionMode};
use arrow::record_batch::RecordBatch;

use super::ATTR_INDEX_SECTION;
use super::error::SidecarError;
use crate::convert::{TableSet, root_table};
use crate::ids::Signal;
use crate::schema::{self, attr_type};

/// Most distinct string values listed for one attribute key; a key with
/// more is marked "too many" and any value may occur.
pub const MAX_VALUES_PER_KEY: usize = 256;

/// Most distinct values listed for one [`AttrScope::Field`] pseudo-key.
/// Higher than [`MAX_VALUES_PER_KEY`] because metric and span names are what
/// most queries select on, and their count per block is bounded by the
/// instrumented code, not by traffic.
pub const MAX_VALUES_PER_FIELD: usize = 4096;

/// Longest string value listed, in bytes. A key with a longer value is
/// marked "too many": long values (SQL statements, stack traces) would bloat
/// the index and are rarely matched by equality.
pub const MAX_VALUE_LEN: usize = 256;

/// Names of the [`AttrScope::Field`] pseudo-keys: the root columns indexed.
pub mod field {
    /// Logs: `severity_text`.
    pub const SEVERITY_TEXT: &str = "severity_text";
    /// Spans: the span name.
    pub const SPAN_NAME: &str = "name";
    /// Metrics: the metric name.
    pub const METRIC_NAME: &str = "metric_name";
}

/// Where an indexed key lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttrScope {
    /// Resource attributes (`resource_attrs`).
    Resource,
    /// Attributes of the root rows: `log_attrs`, `span_attrs` or `point_attrs`.
    Record,
    /// Indexed root-table columns, keyed by the names in [`field`].
    Field,
}

impl AttrScope {
    pub const ALL: [AttrScope; 3] = [AttrScope::Resource, AttrScope::Record, AttrScope::Field];

    /// The name stored in the `attr_index` section.
    pub fn as_str(self) -> &'static str {
        match self {
            AttrScope::Resource => "resource",
            AttrScope::Record => "record",
            AttrScope::Field => "field",
        }
    }

    pub fn parse(name: &str) -> Option<AttrScope> {
        AttrScope::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Most values listed per key in this scope.
    pub fn max_values(self) -> usize {
        match self {
            AttrScope::Resource | AttrScope::Record => MAX_VALUES_PER_KEY,
            AttrScope::Field => MAX_VALUES_PER_FIELD,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What the index knows about one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// Distinct string values, sorted; `None` when there were too many (or
    /// one was too long) and any value may occur.
    values: Option<Vec<String>>,
    /// Some row has a non-string value (int, double, bool, bytes, array,
    /// map) for this key.
    non_string: bool,
}

impl KeyEntry {
    /// The distinct string values, sorted; `None` when there are too many
    /// to list.
    pub fn string_values(&self) -> Option<&[String]> {
        self.values.as_deref()
    }

    /// Whether some row holds a non-string value for this key.
    pub fn has_non_string(&self) -> bool {
        self.non_string
    }

    /// Whether a row may hold `value` for this key. A key with non-string
    /// values may match any value (a query may compare an int's rendering).
    pub fn may_contain(&self, value: &str) -> bool {
        self.non_string
            || self
                .values
                .as_ref()
                .is_none_or(|v| v.binary_search_by(|x| x.as_str().cmp(value)).is_ok())
    }
}

/// Keys and values per scope of one block.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AttrIndex {
    scopes: [BTreeMap<String, KeyEntry>; 3],
}

impl AttrIndex {
    /// Indexes the resource attributes, the root's attributes and the root's
    /// indexed string columns of a block.
    pub fn build(tables: &TableSet) -> Result<Self, SidecarError> {
        let mut index = AttrIndex::default();
        // Metrics keep names and attributes per series, not per point.
        let (record_table, field_table, field_name) = match tables.signal {
            Signal::Logs => (schema::LOG_ATTRS, root_table(tables.signal), field::SEVERITY_TEXT),
            Signal::Traces => (schema::SPAN_ATTRS, root_table(tables.signal), field::SPAN_NAME),
            Signal::Metrics => (schema::SERIES_ATTRS, schema::SERIES, field::METRIC_NAME),
        };
        let resource = &mut index.scopes[AttrScope::Resource.index()];
        index_attrs(resource, tables.get(schema::RESOURCE_ATTRS)?, schema::RESOURCE_ATTRS)?;
        let record = &mut index.scopes[AttrScope::Record.index()];
        index_attrs(record, tables.get(record_table)?, record_table)?;
        let entry = index_dict_column(tables.get(field_table)?, field_table, field_name)?;
        index.scopes[AttrScope::Field.index()].insert(field_name.to_owned(), entry);
        Ok(index)
    }

    /// What the index knows about `key`; `None` when no row has it (or, in
    /// the [`AttrScope::Field`] scope, when the field is not indexed).
    pub fn entry(&self, scope: AttrScope, key: &str) -> Option<&KeyEntry> {
        self.scopes[scope.index()].get(key)
    }

    /// Whether some row has `key`.
    pub fn has_key(&self, scope: AttrScope, key: &str) -> bool {
        self.scopes[scope.index()].contains_key(key)
    }

    /// Whether some row may have `key` equal to `value`. False only when the
    /// index proves no row has it: the key is absent, or all its values are
    /// listed strings and `value` is not one of them. A field the index
    /// does not cover may hold anything.
    pub fn may_contain(&self, scope: AttrScope, key: &str, value: &str) -> bool {
        match self.entry(scope, key) {
            Some(e) => e.may_contain(value),
            None => scope == AttrScope::Field,
        }
    }

    /// Every value `key` takes in the block, when the index knows them all:
    /// the sorted list (empty when no row has the key), or `None` when
    /// there are too many, some are not strings, or (for
    /// [`AttrScope::Field`]) the field is not indexed.
    pub fn values(&self, scope: AttrScope, key: &str) -> Option<&[String]> {
        match self.entry(scope, key) {
            Some(e) if e.non_string => None,
            Some(e) => e.string_values(),
            None if scope == AttrScope::Field => None,
            None => Some(&[]),
        }
    }

    /// Keys present in `scope`, sorted.
    pub fn keys(&self, scope: AttrScope) -> impl Iterator<Item = &str> {
        self.scopes[scope.index()].keys().map(String::as_str)
    }

    /// Schema of the `attr_index` section. Each key has one header row
    /// (`value` null) carrying its flags, followed by one row per listed
    /// string value (flags false).
    pub fn schema() -> SchemaRef {
        static S: OnceLock<SchemaRef> = OnceLock::new();
        S.get_or_init(|| {
            let dict = DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8));
            Arc::new(Schema::new(vec![
                Field::new("scope", dict.clone(), false),
                Field::new("key", dict, false),
                Field::new("value", DataType::Utf8, true),
                Field::new("overflow", DataType::Boolean, false),
                Field::new("non_string", DataType::Boolean, false),
            ]))
        })
        .clone()
    }

    /// Encodes the index as the `attr_index` section's batch.
    pub fn to_batch(&self) -> Result<RecordBatch, SidecarError> {
        let mut scope_col = StringDictionaryBuilder::<UInt32Type>::new();
        let mut key_col = StringDictionaryBuilder::<UInt32Type>::new();
        let mut value_col = StringBuilder::new();
        let mut overflow = Vec::new();
        let mut non_string = Vec::new();
        for scope in AttrScope::ALL {
            for (key, entry) in &self.scopes[scope.index()] {
                let values = entry.values.as_deref().unwrap_or_default();
                for value in std::iter::once(None).chain(values.iter().map(Some)) {
                    scope_col.append_value(scope.as_str());
                    key_col.append_value(key);
                    value_col.append_option(value);
                    let header = value.is_none();
                    overflow.push(header && entry.values.is_none());
                    non_string.push(header && entry.non_string);
                }
            }
        }
        let cols: Vec<ArrayRef> = vec![
            Arc::new(scope_col.finish()),
            Arc::new(key_col.finish()),
            Arc::new(value_col.finish()),
            Arc::new(BooleanArray::from(overflow)),
            Arc::new(BooleanArray::from(non_string)),
        ];
        Ok(RecordBatch::try_new(Self::schema(), cols)?)
    }

    /// Decodes an `attr_index` section's batch, checking every row. String
    /// columns may be plain or dictionary-encoded.
    pub fn from_batch(batch: &RecordBatch) -> Result<Self, SidecarError> {
        const S: &str = ATTR_INDEX_SECTION;
        let scope_col = utf8_column(batch, "scope")?;
        let key_col = utf8_column(batch, "key")?;
        let value_col = utf8_column(batch, "value")?;
        let overflow = bool_column(batch, "overflow")?;
        let non_string = bool_column(batch, "non_string")?;
        let scope_col = as_string(&scope_col, "scope")?;
        let key_col = as_string(&key_col, "key")?;
        let value_col = as_string(&value_col, "value")?;
        let invalid = |row, reason: String| SidecarError::InvalidEntry {
            section: S,
            row,
            reason,
        };

        /// A key being decoded: its header (once seen) and its values.
        struct Partial {
            header: Option<(bool, bool)>,
            values: Vec<String>,
            first_row: usize,
        }
        let mut partial: BTreeMap<(AttrScope, &str), Partial> = BTreeMap::new();
        for row in 0..batch.num_rows() {
            if scope_col.is_null(row) || key_col.is_null(row) || overflow.is_null(row) || non_string.is_null(row) {
                return Err(invalid(row, "null scope, key or flag".into()));
            }
            let scope_name = scope_col.value(row);
            let scope =
                AttrScope::parse(scope_name).ok_or_else(|| invalid(row, format!("unknown scope {scope_name:?}")))?;
            let key = key_col.value(row);
            let p = partial.entry((scope, key)).or_insert(Partial {
                header: None,
                values: Vec::new(),
                first_row: row,
            });
            let flags = (overflow.value(row), non_string.value(row));
            if value_col.is_null(row) {
                if p.header.replace(flags).is_some() {
                    return Err(invalid(row, format!("key {key:?} has two header rows")));
                }
                continue;
            }
            let value = value_col.value(row);
            if flags != (false, false) {
                return Err(invalid(row, "a value row has flags set".into()));
            }
            if value.len() > MAX_VALUE_LEN {
                return Err(invalid(
                    row,
                    format!("value of {} bytes, over the {MAX_VALUE_LEN} limit", value.len()),
                ));
            }
            p.values.push(value.to_owned());
        }

        let mut index = AttrIndex::default();
        for ((scope, key), p) in partial {
            let row = p.first_row;
            let Some((overflow, non_string)) = p.header else {
                return Err(invalid(row, format!("key {key:?} has values but no header row")));
            };
            let values = if overflow {
                if !p.values.is_empty() {
                    return Err(invalid(row, format!("key {key:?} is marked too many but lists values")));
                }
                None
            } else {
                let mut values = p.values;
                if values.len() > scope.max_values() {
                    return Err(invalid(row, format!("key {key:?} lists {} values", values.len())));
                }
                values.sort_unstable();
                if values.windows(2).any(|w| w[0] == w[1]) {
                    return Err(invalid(row, format!("key {key:?} lists a value twice")));
                }
                Some(values)
            };
            index.scopes[scope.index()].insert(key.to_owned(), KeyEntry { values, non_string });
        }
        Ok(index)
    }
}

/// Per-key state while scanning an attribute table, indexed by the key's
/// dictionary index.
#[derive(Default)]
struct KeyScan {
    present: bool,
    non_string: bool,
    overflow: bool,
    /// Dictionary indices of the string values seen.
    values: HashSet<u32>,
    last: Option<u32>,
}

/// Adds the keys and string values of one attribute table to `out`.
///
/// Works on dictionary indices rather than strings: a block's attribute
/// table has millions of rows but few distinct keys and values.
fn index_attrs(
    out: &mut BTreeMap<String, KeyEntry>,
    batch: &RecordBatch,
    table: &'static str,
) -> Result<(), SidecarError> {
    let corrupt = |row, reason| SidecarError::CorruptTable { table, row, reason };
    let keys = DictStr::new(batch, table, "key")?;
    let key_names = keys.values();
    let value = batch
        .column_by_name("value")
        .ok_or(SidecarError::MissingColumn { table, column: "value" })?
        .as_any()
        .downcast_ref::<UnionArray>()
        .ok_or(SidecarError::WrongType { table, column: "value" })?;
    let wrong_value = SidecarError::WrongType { table, column: "value" };
    let DataType::Union(fields, UnionMode::Dense) = value.data_type() else {
        return Err(wrong_value);
    };
    if !fields.iter().any(|(id, _)| id == attr_type::STR) {
        return Err(wrong_value);
    }
    let offsets = value
        .offsets()
        .ok_or(SidecarError::WrongType { table, column: "value" })?;
    let str_keys = DictStr::from_dyn(value.child(attr_type::STR).as_ref(), table, "value")?;
    let str_names = str_keys.values();

    let mut scan: Vec<KeyScan> = Vec::new();
    scan.resize_with(key_names.len(), KeyScan::default);
    let type_ids = value.type_ids();
    for row in 0..batch.num_rows() {
        if keys.is_null(row) {
            return Err(corrupt(row, "null attribute key"));
        }
        let k = scan
            .get_mut(keys.key(row))
            .ok_or(corrupt(row, "key index past its dictionary"))?;
        k.present = true;
        if type_ids[row] != attr_type::STR {
            k.non_string = true;
            continue;
        }
        if k.overflow {
            continue;
        }
        let o = usize::try_from(offsets[row]).map_err(|_| corrupt(row, "negative union offset"))?;
        if o >= str_keys.len() {
            return Err(corrupt(row, "union offset past the string child"));
        }
        if str_keys.is_null(o) {
            // Not a listable string: say nothing about this key's values.
            k.non_string = true;
            continue;
        }
        let v = str_keys.key(o) as u32;
        if v as usize >= str_names.len() {
            return Err(corrupt(row, "string value index past its dictionary"));
        }
        if k.last == Some(v) {
            continue;
        }
        k.last = Some(v);
        k.values.insert(v);
        if k.values.len() > MAX_VALUES_PER_KEY {
            k.overflow = true;
            k.values = HashSet::new();
        }
    }

    for (k, s) in scan.into_iter().enumerate().filter(|(_, s)| s.present) {
        let name = key_names.value(k);
        let strings = (!s.overflow).then(|| s.values.iter().map(|&v| str_names.value(v as usize)));
        merge(out, name, strings, s.non_string, MAX_VALUES_PER_KEY);
    }
    Ok(())
}

/// Indexes the distinct values referenced by a root-table dictionary column.
fn index_dict_column(batch: &RecordBatch, table: &'static str, column: &'static str) -> Result<KeyEntry, SidecarError> {
    let keys = DictStr::new(batch, table, column)?;
    let names = keys.values();
    let mut used = vec![false; names.len()];
    let mut nulls = false;
    for row in 0..keys.len() {
        if keys.is_null(row) {
            nulls = true;
            continue;
        }
        *used.get_mut(keys.key(row)).ok_or(SidecarError::CorruptTable {
            table,
            row,
            reason: "dictionary index past its values",
        })? = true;
    }
    let strings = used
        .iter()
        .enumerate()
        .filter(|(_, u)| **u)
        .map(|(i, _)| names.value(i));
    let mut out = BTreeMap::new();
    merge(&mut out, column, Some(strings), nulls, MAX_VALUES_PER_FIELD);
    Ok(out.remove(column).unwrap_or(KeyEntry {
        values: Some(Vec::new()),
        non_string: false,
    }))
}

/// Adds what a scan learnt about `key` to `out`. A dictionary may hold the
/// same string twice, so entries merge by string.
fn merge<'a>(
    out: &mut BTreeMap<String, KeyEntry>,
    key: &str,
    strings: Option<impl Iterator<Item = &'a str>>,
    non_string: bool,
    limit: usize,
) {
    let entry = out.entry(key.to_owned()).or_insert(KeyEntry {
        values: Some(Vec::new()),
        non_string: false,
    });
    entry.non_string |= non_string;
    let (Some(listed), Some(strings)) = (entry.values.take(), strings) else {
        return;
    };
    let mut set: BTreeSet<String> = listed.into_iter().collect();
    for s in strings {
        if s.len() > MAX_VALUE_LEN {
            return;
        }
        set.insert(s.to_owned());
        if set.len() > limit {
            return;
        }
    }
    entry.values = Some(set.into_iter().collect());
}

fn utf8_column(batch: &RecordBatch, column: &'static str) -> Result<ArrayRef, SidecarError> {
    let col = batch.column_by_name(column).ok_or(SidecarError::MissingColumn {
        table: ATTR_INDEX_SECTION,
        column,
    })?;
    match col.data_type() {
        DataType::Utf8 => Ok(col.clone()),
        DataType::Dictionary(_, v) if v.as_ref() == &DataType::Utf8 => Ok(cast(col, &DataType::Utf8)?),
        _ => Err(SidecarError::WrongType {
            table: ATTR_INDEX_SECTION,
            column,
        }),
    }
}

fn as_string<'a>(col: &'a ArrayRef, column: &'static str) -> Result<&'a StringArray, SidecarError> {
    col.as_string_opt::<i32>().ok_or(SidecarError::WrongType {
        table: ATTR_INDEX_SECTION,
        column,
    })
}

fn bool_column<'a>(batch: &'a RecordBatch, column: &'static str) -> Result<&'a BooleanArray, SidecarError> {
    batch
        .column_by_name(column)
        .ok_or(SidecarError::MissingColumn {
            table: ATTR_INDEX_SECTION,
            column,
        })?
        .as_boolean_opt()
        .ok_or(SidecarError::WrongType {
            table: ATTR_INDEX_SECTION,
            column,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(values: Option<&[&str]>, non_string: bool) -> KeyEntry {
        KeyEntry {
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
            non_string,
        }
    }

    fn sample() -> AttrIndex {
        let mut index = AttrIndex::default();
        let r = &mut index.scopes[AttrScope::Resource.index()];
        r.insert("service.name".into(), entry(Some(&["api", "db"]), false));
        r.insert("pid".into(), entry(Some(&[]), true));
        let a = &mut index.scopes[AttrScope::Record.index()];
        a.insert("request.id".into(), entry(None, false));
        a.insert("mixed".into(), entry(Some(&["", "x"]), true));
        a.insert("huge".into(), entry(None, true));
        let f = &mut index.scopes[AttrScope::Field.index()];
        f.insert(field::SPAN_NAME.into(), entry(Some(&["GET /"]), false));
        index
    }

    #[test]
    fn queries() {
        let i = sample();
        assert!(i.may_contain(AttrScope::Resource, "service.name", "api"));
        assert!(!i.may_contain(AttrScope::Resource, "service.name", "web"));
        assert!(!i.may_contain(AttrScope::Resource, "absent", "api"));
        assert!(
            !i.may_contain(AttrScope::Record, "service.name", "api"),
            "scopes are separate"
        );
        assert!(
            i.may_contain(AttrScope::Resource, "pid", "42"),
            "non-string values may match any rendering"
        );
        assert!(i.may_contain(AttrScope::Record, "request.id", "anything"));
        assert!(i.may_contain(AttrScope::Field, field::SPAN_NAME, "GET /"));
        assert!(!i.may_contain(AttrScope::Field, field::SPAN_NAME, "POST /"));
        assert!(
            i.may_contain(AttrScope::Field, "not_indexed", "x"),
            "an unindexed field proves nothing"
        );

        assert!(i.has_key(AttrScope::Record, "mixed"));
        assert!(!i.has_key(AttrScope::Record, "absent"));
        assert_eq!(
            i.values(AttrScope::Resource, "service.name"),
            Some(&["api".to_owned(), "db".to_owned()][..])
        );
        assert_eq!(i.values(AttrScope::Resource, "absent"), Some(&[][..]));
        assert_eq!(i.values(AttrScope::Resource, "pid"), None);
        assert_eq!(i.values(AttrScope::Record, "request.id"), None);
        assert_eq!(i.values(AttrScope::Field, "not_indexed"), None);
        assert_eq!(
            i.keys(AttrScope::Record).collect::<Vec<_>>(),
            ["huge", "mixed", "request.id"]
        );
    }

    #[test]
    fn batch_round_trip() {
        let i = sample();
        let b = i.to_batch().expect("encode");
        assert_eq!(AttrIndex::from_batch(&b).expect("decode"), i);
        // A cold codec may hand the strings back plain rather than as dictionaries.
        let plain: Vec<ArrayRef> = b
            .columns()
            .iter()
            .map(|c| match c.data_type() {
                DataType::Dictionary(..) => cast(c, &DataType::Utf8).expect("cast"),
                _ => c.clone(),
            })
            .collect();
        let plain =
            RecordBatch::try_from_iter(b.schema().fields().iter().map(|f| f.name().clone()).zip(plain)).expect("batch");
        assert_eq!(AttrIndex::from_batch(&plain).expect("decode plain"), i);
        let empty = AttrIndex::default();
        assert_eq!(
            AttrIndex::from_batch(&empty.to_batch().expect("encode")).expect("decode"),
            empty
        );
    }

    /// scope, key, value, overflow, non_string
    type Row<'a> = (&'a str, &'a str, Option<&'a str>, bool, bool);

    fn rows(rows: &[Row<'_>]) -> RecordBatch {
        let col =
            |f: fn(&Row<'_>) -> Option<String>| -> ArrayRef { Arc::new(rows.iter().map(f).collect::<StringArray>()) };
        RecordBatch::try_from_iter(vec![
            ("scope", col(|r| Some(r.0.to_owned()))),
            ("key", col(|r| Some(r.1.to_owned()))),
            ("value", col(|r| r.2.map(str::to_owned))),
            (
                "overflow",
                Arc::new(rows.iter().map(|r| Some(r.3)).collect::<BooleanArray>()) as ArrayRef,
            ),
            (
                "non_string",
                Arc::new(rows.iter().map(|r| Some(r.4)).collect::<BooleanArray>()) as ArrayRef,
            ),
        ])
        .expect("batch")
    }

    #[test]
    fn malformed_batches_are_errors() {
        let long = "x".repeat(MAX_VALUE_LEN + 1);
        let cases: Vec<(&str, RecordBatch)> = vec![
            ("unknown scope", rows(&[("span", "k", None, false, false)])),
            ("no header", rows(&[("record", "k", Some("v"), false, false)])),
            (
                "two headers",
                rows(&[("record", "k", None, false, false), ("record", "k", None, true, false)]),
            ),
            (
                "overflow with values",
                rows(&[
                    ("record", "k", None, true, false),
                    ("record", "k", Some("v"), false, false),
                ]),
            ),
            (
                "flags on a value",
                rows(&[
                    ("record", "k", None, false, false),
                    ("record", "k", Some("v"), true, false),
                ]),
            ),
            (
                "duplicate value",
                rows(&[
                    ("record", "k", None, false, false),
                    ("record", "k", Some("v"), false, false),
                    ("record", "k", Some("v"), false, false),
                ]),
            ),
            (
                "long value",
                rows(&[
                    ("record", "k", None, false, false),
                    ("record", "k", Some(&long), false, false),
                ]),
            ),
        ];
        for (what, b) in cases {
            assert!(AttrIndex::from_batch(&b).is_err(), "{what} must be rejected");
        }
        let too_many: Vec<String> = (0..=MAX_VALUES_PER_KEY).map(|i| i.to_string()).collect();
        let mut r = vec![("record", "k", None, false, false)];
        r.extend(too_many.iter().map(|v| ("record", "k", Some(v.as_str()), false, false)));
        assert!(AttrIndex::from_batch(&rows(&r)).is_err());
        let good = rows(&[
            ("record", "k", None, false, true),
            ("record", "k", Some(""), false, false),
        ]);
        assert!(
            AttrIndex::from_batch(&good)
                .expect("decode")
                .may_contain(AttrScope::Record, "k", "1")
        );
        let missing = good.project(&[0, 1, 2, 3]).expect("project");
        assert!(matches!(
            AttrIndex::from_batch(&missing),
            Err(SidecarError::MissingColumn { .. })
        ));
    }
}
