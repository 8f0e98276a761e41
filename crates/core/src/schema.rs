//! Arrow schemas of the tables a block holds, one set per signal.
//!
//! Every signal has a root table (`logs`, `spans`, `points`), a `resources`
//! and a `scopes` table (deduplicated per block; root rows point at them by
//! `resource_id` / `scope_id`, which are row numbers), and attribute tables
//! (`*_attrs`) whose rows are one attribute each: `parent` (row number in the
//! owning table), `key` (dictionary) and `value` (see [`attr_value_type`]).

use std::sync::{Arc, OnceLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UnionFields, UnionMode};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;

/// Bumped whenever a table's layout changes incompatibly.
pub const SCHEMA_VERSION: u32 = 1;

// Table (section) names.
pub const RESOURCES: &str = "resources";
pub const RESOURCE_ATTRS: &str = "resource_attrs";
pub const SCOPES: &str = "scopes";
pub const SCOPE_ATTRS: &str = "scope_attrs";
pub const LOGS: &str = "logs";
pub const LOG_ATTRS: &str = "log_attrs";
pub const SPANS: &str = "spans";
pub const SPAN_ATTRS: &str = "span_attrs";
pub const SPAN_EVENTS: &str = "span_events";
pub const EVENT_ATTRS: &str = "event_attrs";
pub const SPAN_LINKS: &str = "span_links";
pub const LINK_ATTRS: &str = "link_attrs";
pub const POINTS: &str = "points";
pub const SERIES: &str = "series";
pub const SERIES_ATTRS: &str = "series_attrs";
pub const POINT_DISTS: &str = "point_dists";

/// Type ids of the attribute value union. The children hold only their own
/// values (dense union), so a row costs its type id, an offset and its value.
pub mod attr_type {
    pub const STR: i8 = 0;
    pub const INT: i8 = 1;
    pub const DOUBLE: i8 = 2;
    pub const BOOL: i8 = 3;
    pub const BYTES: i8 = 4;
    /// An array, a key-value list or an empty `AnyValue`, protobuf-encoded.
    pub const ANY: i8 = 5;
    /// A whole `KeyValue`, protobuf-encoded: used for the rare shapes the
    /// other children cannot say (no value at all, a `key_strindex`).
    pub const KV: i8 = 6;
}

fn dict_str() -> DataType {
    DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8))
}

fn u64_list() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::UInt64, false)))
}

fn f64_list() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Float64, false)))
}

pub fn attr_value_fields() -> UnionFields {
    attr_value_fields_with(dict_str())
}

/// The union's fields with the `str` child of the given (dictionary) type.
pub fn attr_value_fields_with(str_type: DataType) -> UnionFields {
    UnionFields::try_new(
        vec![
            attr_type::STR,
            attr_type::INT,
            attr_type::DOUBLE,
            attr_type::BOOL,
            attr_type::BYTES,
            attr_type::ANY,
            attr_type::KV,
        ],
        vec![
            Field::new("str", str_type, false),
            Field::new("int", DataType::Int64, false),
            Field::new("double", DataType::Float64, false),
            Field::new("bool", DataType::Boolean, false),
            Field::new("bytes", DataType::Binary, false),
            Field::new("any", DataType::Binary, false),
            Field::new("kv", DataType::Binary, false),
        ],
    )
    .expect("static union fields are valid")
}

/// The hot attribute value type: a dense union of typed children.
pub fn attr_value_type() -> DataType {
    DataType::Union(attr_value_fields(), UnionMode::Dense)
}

/// The hot attribute tables' `parent` column: run-end encoded, since a
/// parent's attributes are contiguous (one run per parent, not one value
/// per attribute).
pub fn parent_runs() -> DataType {
    DataType::RunEndEncoded(
        Arc::new(Field::new("run_ends", DataType::Int32, false)),
        Arc::new(Field::new("values", DataType::UInt32, true)),
    )
}

/// Schema of every attribute table.
pub fn attrs() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("parent", parent_runs(), false),
            Field::new("key", dict_str(), false),
            Field::new("value", attr_value_type(), false),
        ]))
    })
    .clone()
}

/// `dropped_attributes_count` is null when the resource was absent.
pub fn resources() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("schema_url", DataType::Utf8, false),
            Field::new("dropped_attributes_count", DataType::UInt32, true),
            Field::new("entity_refs", DataType::Binary, true),
        ]))
    })
    .clone()
}

/// `name` is null when the scope was absent.
pub fn scopes() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, true),
            Field::new("version", DataType::Utf8, false),
            Field::new("dropped_attributes_count", DataType::UInt32, false),
            Field::new("schema_url", DataType::Utf8, false),
        ]))
    })
    .clone()
}

pub fn logs() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("time_unix_nano", DataType::UInt64, false),
            Field::new("observed_time_unix_nano", DataType::UInt64, false),
            Field::new("severity_number", DataType::Int32, false),
            Field::new("severity_text", dict_str(), false),
            Field::new("body", DataType::Utf8, true),
            Field::new("body_any", DataType::Binary, true),
            Field::new("trace_id", DataType::FixedSizeBinary(16), true),
            Field::new("span_id", DataType::FixedSizeBinary(8), true),
            Field::new("flags", DataType::UInt32, false),
            Field::new("event_name", dict_str(), false),
            Field::new("dropped_attributes_count", DataType::UInt32, false),
            Field::new("resource_id", DataType::UInt32, false),
            Field::new("scope_id", DataType::UInt32, false),
        ]))
    })
    .clone()
}

/// `status_code` is null when the span had no status.
pub fn spans() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("trace_id", DataType::FixedSizeBinary(16), true),
            Field::new("span_id", DataType::FixedSizeBinary(8), true),
            Field::new("parent_span_id", DataType::FixedSizeBinary(8), true),
            Field::new("trace_state", DataType::Utf8, false),
            Field::new("flags", DataType::UInt32, false),
            Field::new("name", dict_str(), false),
            Field::new("kind", DataType::Int32, false),
            Field::new("start_time_unix_nano", DataType::UInt64, false),
            Field::new("end_time_unix_nano", DataType::UInt64, false),
            Field::new("status_code", DataType::Int32, true),
            Field::new("status_message", DataType::Utf8, false),
            Field::new("dropped_attributes_count", DataType::UInt32, false),
            Field::new("dropped_events_count", DataType::UInt32, false),
            Field::new("dropped_links_count", DataType::UInt32, false),
            Field::new("resource_id", DataType::UInt32, false),
            Field::new("scope_id", DataType::UInt32, false),
        ]))
    })
    .clone()
}

pub fn span_events() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("parent", DataType::UInt32, false),
            Field::new("time_unix_nano", DataType::UInt64, false),
            Field::new("name", dict_str(), false),
            Field::new("dropped_attributes_count", DataType::UInt32, false),
        ]))
    })
    .clone()
}

pub fn span_links() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("parent", DataType::UInt32, false),
            Field::new("trace_id", DataType::FixedSizeBinary(16), true),
            Field::new("span_id", DataType::FixedSizeBinary(8), true),
            Field::new("trace_state", DataType::Utf8, false),
            Field::new("flags", DataType::UInt32, false),
            Field::new("dropped_attributes_count", DataType::UInt32, false),
        ]))
    })
    .clone()
}

/// Metric kinds in `points.metric_type`.
pub mod metric_type {
    pub const GAUGE: u8 = 1;
    pub const SUM: u8 = 2;
    pub const HISTOGRAM: u8 = 3;
    pub const EXP_HISTOGRAM: u8 = 4;
    pub const SUMMARY: u8 = 5;
}

/// One row per data point: its series, times, flags and value. What a
/// series shares (metric identity, attributes, resource, scope) is in
/// [`series`], once per series.
pub fn points() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("series", DataType::UInt32, false),
            Field::new("time_unix_nano", DataType::UInt64, false),
            Field::new("start_time_unix_nano", DataType::UInt64, false),
            Field::new("flags", DataType::UInt32, false),
            Field::new("value_int", DataType::Int64, true),
            Field::new("value_double", DataType::Float64, true),
            Field::new("exemplars", DataType::Binary, true),
        ]))
    })
    .clone()
}

/// One row per series of a block: the metric (name, description, unit,
/// metadata, type, temporality, monotonicity), its resource and scope; its
/// attributes are in `series_attrs`.
pub fn series() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("metric_name", dict_str(), false),
            Field::new("metric_description", dict_str(), false),
            Field::new("metric_unit", dict_str(), false),
            Field::new(
                "metric_metadata",
                DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Binary)),
                true,
            ),
            Field::new("metric_type", DataType::UInt8, false),
            Field::new("temporality", DataType::Int32, false),
            Field::new("is_monotonic", DataType::Boolean, false),
            Field::new("series_id", DataType::UInt64, false),
            Field::new("resource_id", DataType::UInt32, false),
            Field::new("scope_id", DataType::UInt32, false),
        ]))
    })
    .clone()
}

/// Distribution fields of histogram, exponential histogram and summary
/// points, one row per such point (`parent` is its `points` row). Kept out
/// of `points` so gauges and sums, most points, do not pay for the null
/// fixed-width columns.
pub fn point_dists() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("parent", DataType::UInt32, false),
            Field::new("count", DataType::UInt64, false),
            Field::new("sum", DataType::Float64, true),
            Field::new("min", DataType::Float64, true),
            Field::new("max", DataType::Float64, true),
            Field::new("bucket_counts", u64_list(), true),
            Field::new("explicit_bounds", f64_list(), true),
            Field::new("exp_scale", DataType::Int32, true),
            Field::new("exp_zero_count", DataType::UInt64, true),
            Field::new("exp_zero_threshold", DataType::Float64, true),
            Field::new("exp_positive_offset", DataType::Int32, true),
            Field::new("exp_positive_counts", u64_list(), true),
            Field::new("exp_negative_offset", DataType::Int32, true),
            Field::new("exp_negative_counts", u64_list(), true),
            Field::new("quantiles", f64_list(), true),
            Field::new("quantile_values", f64_list(), true),
        ]))
    })
    .clone()
}

/// The cold-tier attribute layout: one nullable column per value type.
/// Parquet stores a null as a definition level, so the columns a row does
/// not use cost almost nothing there, unlike Arrow IPC where they cost their
/// full width.
pub fn attrs_typed() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("parent", DataType::UInt32, false),
            Field::new("key", dict_str(), false),
            Field::new("type", DataType::Int8, false),
            Field::new("str", dict_str(), true),
            Field::new("int", DataType::Int64, true),
            Field::new("double", DataType::Float64, true),
            Field::new("bool", DataType::Boolean, true),
            Field::new("bytes", DataType::Binary, true),
        ]))
    })
    .clone()
}

/// The hot schema of the table called `name`, if it is one.
pub fn of(name: &str) -> Option<SchemaRef> {
    Some(match name {
        RESOURCES => resources(),
        SCOPES => scopes(),
        LOGS => logs(),
        SPANS => spans(),
        SPAN_EVENTS => span_events(),
        SPAN_LINKS => span_links(),
        POINTS => points(),
        SERIES => series(),
        POINT_DISTS => point_dists(),
        RESOURCE_ATTRS | SCOPE_ATTRS | LOG_ATTRS | SPAN_ATTRS | EVENT_ATTRS | LINK_ATTRS | SERIES_ATTRS => attrs(),
        _ => return None,
    })
}

/// A batch of `schema`'s columns whose dictionary key widths (and the
/// union children holding dictionaries) are whatever the builders chose:
/// each field takes its column's data type, names and nullability stay.
pub fn batch(schema: &SchemaRef, columns: Vec<arrow::array::ArrayRef>) -> Result<RecordBatch, ArrowError> {
    if columns.len() != schema.fields().len() {
        return Err(ArrowError::InvalidArgumentError(format!(
            "{} columns for a {}-field schema",
            columns.len(),
            schema.fields().len()
        )));
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .zip(&columns)
        .map(|(f, c)| f.as_ref().clone().with_data_type(c.data_type().clone()))
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}
