//! The merge on Arrow (compactor design §6.1): the inputs' tables are
//! concatenated instead of being turned back into OTLP and rebuilt.
//!
//! - Resources and scopes are deduplicated across inputs by their full
//!   content (the same key the builders use), numbered by first use in
//!   the merged root's row order, and the root's `resource_id` /
//!   `scope_id` are remapped.
//! - Root tables are concatenated in input order: row `k` of the output is
//!   row `k - n` of input `i`, `n` the rows of the inputs before `i`.
//! - Metric series are deduplicated across inputs by their full identity
//!   (resource, scope, name, description, unit, metadata, type,
//!   temporality, monotonicity and attributes: the builders' key, never
//!   the `series_id` hash alone), numbered by first use, and
//!   `points.series` is remapped.
//! - Child tables (`*_attrs`, `span_events`, `span_links`, `point_dists`)
//!   are concatenated with `parent` re-based by the rows of the owning
//!   table before them; `series_attrs` follow the deduplicated series.
//! - Dictionary columns are re-interned in row order, so every value is
//!   stored once and keys take the narrowest width that fits.
//!
//! The output equals, table for table, what appending the inputs' records
//! in row order to a fresh builder gives (the OTLP path, kept as the
//! reference and for what this module does not take). Inputs this module
//! does not take: tables not in the layout the builders write (attributes
//! or children out of parent order, union children with unused values);
//! for those [`concat`] answers `None`.

use std::sync::Arc;

use std::collections::HashMap;

use arrow::array::{
    Array, ArrayRef, BinaryArray, BinaryBuilder, BooleanArray, DictionaryArray, Int32Array, RunArray, StringArray,
    UInt8Array, UInt32Array, UInt64Array, UnionArray,
};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::{DataType, Int32Type, SchemaRef, UInt32Type, UnionMode};
use arrow::record_batch::RecordBatch;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use rayon::prelude::*;

use crate::Signal;
use crate::attrs::{AttrBuilder, AttrReader};
use crate::convert::columns::{DictStr, col};
use crate::convert::context::{ContextBuilder, Contexts};
use crate::convert::logs::effective_time;
use crate::convert::{ConvertError, TableSet, TimeRange};
use crate::dict::DictBuilder;
use crate::schema::{self, attr_type};

/// The merged tables of `inputs` (one signal, in merge order), or `None`
/// when an input is not in the layout this module takes.
pub(crate) fn concat(signal: Signal, inputs: &[TableSet]) -> Result<Option<TableSet>, ConvertError> {
    match signal {
        Signal::Logs => logs(inputs),
        Signal::Traces => spans(inputs),
        Signal::Metrics => points(inputs),
    }
}

fn logs(inputs: &[TableSet]) -> Result<Option<TableSet>, ConvertError> {
    let roots = tables(inputs, schema::LOGS)?;
    let mut ctx = ContextBuilder::default();
    let (rid, sid) = remap_contexts(&mut ctx, inputs, schema::LOGS)?;
    let (mut rid, mut sid) = (Some(rid), Some(sid));
    let mut times = TimeRange::default();
    for r in &roots {
        let time: &UInt64Array = col(r, schema::LOGS, "time_unix_nano")?;
        let observed: &UInt64Array = col(r, schema::LOGS, "observed_time_unix_nano")?;
        for (&t, &o) in time.values().iter().zip(observed.values()) {
            times.add(effective_time(t, o));
        }
    }
    // The root and its attributes are independent: side by side.
    let (root, attrs) = rayon::join(
        || {
            concat_table(&schema::logs(), schema::LOGS, &roots, |name| match name {
                "resource_id" => rid.take().map(u32_column),
                "scope_id" => sid.take().map(u32_column),
                _ => None,
            })
        },
        || concat_attrs(schema::LOG_ATTRS, &owned(inputs, schema::LOG_ATTRS, &roots)?),
    );
    let root = root?;
    let Some(attrs) = attrs? else {
        return Ok(None);
    };
    let rows = root.num_rows();
    let mut out = vec![(schema::LOGS, root), (schema::LOG_ATTRS, attrs)];
    ctx.finish(&mut out)?;
    let (min_time, max_time) = times.bounds();
    Ok(Some(TableSet {
        signal: Signal::Logs,
        tables: out,
        rows,
        min_time,
        max_time,
    }))
}

fn spans(inputs: &[TableSet]) -> Result<Option<TableSet>, ConvertError> {
    let roots = tables(inputs, schema::SPANS)?;
    let mut ctx = ContextBuilder::default();
    let (rid, sid) = remap_contexts(&mut ctx, inputs, schema::SPANS)?;
    let (mut rid, mut sid) = (Some(rid), Some(sid));
    let mut times = TimeRange::default();
    for r in &roots {
        let start: &UInt64Array = col(r, schema::SPANS, "start_time_unix_nano")?;
        for &t in start.values() {
            times.add(t);
        }
    }
    let root = concat_table(&schema::spans(), schema::SPANS, &roots, |name| match name {
        "resource_id" => rid.take().map(u32_column),
        "scope_id" => sid.take().map(u32_column),
        _ => None,
    })?;
    let Some(span_attrs) = concat_attrs(schema::SPAN_ATTRS, &owned(inputs, schema::SPAN_ATTRS, &roots)?)? else {
        return Ok(None);
    };
    let Some(events) = concat_children(&schema::span_events(), schema::SPAN_EVENTS, inputs, &roots, false)? else {
        return Ok(None);
    };
    let event_parts = tables(inputs, schema::SPAN_EVENTS)?;
    let Some(event_attrs) = concat_attrs(schema::EVENT_ATTRS, &owned(inputs, schema::EVENT_ATTRS, &event_parts)?)?
    else {
        return Ok(None);
    };
    let Some(links) = concat_children(&schema::span_links(), schema::SPAN_LINKS, inputs, &roots, false)? else {
        return Ok(None);
    };
    let link_parts = tables(inputs, schema::SPAN_LINKS)?;
    let Some(link_attrs) = concat_attrs(schema::LINK_ATTRS, &owned(inputs, schema::LINK_ATTRS, &link_parts)?)? else {
        return Ok(None);
    };
    let rows = root.num_rows();
    let mut out = vec![
        (schema::SPANS, root),
        (schema::SPAN_ATTRS, span_attrs),
        (schema::SPAN_EVENTS, events),
        (schema::EVENT_ATTRS, event_attrs),
        (schema::SPAN_LINKS, links),
        (schema::LINK_ATTRS, link_attrs),
    ];
    ctx.finish(&mut out)?;
    let (min_time, max_time) = times.bounds();
    Ok(Some(TableSet {
        signal: Signal::Traces,
        tables: out,
        rows,
        min_time,
        max_time,
    }))
}

fn points(inputs: &[TableSet]) -> Result<Option<TableSet>, ConvertError> {
    let roots = tables(inputs, schema::POINTS)?;
    let mut ctx = ContextBuilder::default();
    let mut series = SeriesBuilder::default();
    let mut series_of = Vec::with_capacity(roots.iter().map(|r| r.num_rows()).sum());
    let mut times = TimeRange::default();
    for (t, root) in inputs.iter().zip(&roots) {
        series.append(&mut ctx, t, root, &mut series_of)?;
        let time: &UInt64Array = col(root, schema::POINTS, "time_unix_nano")?;
        for &x in time.values() {
            times.add(x);
        }
    }
    let mut series_of = Some(series_of);
    let points = concat_table(&schema::points(), schema::POINTS, &roots, |name| {
        if name == "series" {
            series_of.take().map(u32_column)
        } else {
            None
        }
    })?;
    let Some(dists) = concat_children(&schema::point_dists(), schema::POINT_DISTS, inputs, &roots, true)? else {
        return Ok(None);
    };
    let rows = points.num_rows();
    let (series, series_attrs) = series.finish()?;
    let mut out = vec![
        (schema::POINTS, points),
        (schema::POINT_DISTS, dists),
        (schema::SERIES, series),
        (schema::SERIES_ATTRS, series_attrs),
    ];
    ctx.finish(&mut out)?;
    let (min_time, max_time) = times.bounds();
    Ok(Some(TableSet {
        signal: Signal::Metrics,
        tables: out,
        rows,
        min_time,
        max_time,
    }))
}

/// The merged `series` table: each input series looked up by its full
/// identity (the builders' key, over the merged resource, scope and
/// dictionary keys, and the encoded attributes), added when new.
#[derive(Default)]
struct SeriesBuilder {
    index: HashMap<Vec<u8>, u32>,
    key: Vec<u8>,
    name: DictBuilder,
    description: DictBuilder,
    unit: DictBuilder,
    metadata: Vec<Option<u32>>,
    metadata_values: BinaryBuilder,
    metadata_index: HashMap<Vec<u8>, u32>,
    kind: Vec<u8>,
    temporality: Vec<i32>,
    monotonic: Vec<bool>,
    series_id: Vec<u64>,
    resource_id: Vec<u32>,
    scope_id: Vec<u32>,
    attrs: AttrBuilder,
}

impl SeriesBuilder {
    /// Adds the series `root`'s points (of input `t`) use, in first use,
    /// the resources and scopes they name to `ctx`, and each point's
    /// merged series to `series_of`.
    fn append(
        &mut self,
        ctx: &mut ContextBuilder,
        t: &TableSet,
        root: &RecordBatch,
        series_of: &mut Vec<u32>,
    ) -> Result<(), ConvertError> {
        let st = schema::SERIES;
        let sr = t.get(st)?;
        let contexts = Contexts::read(t)?;
        let name = DictStr::new(sr, st, "metric_name")?;
        let description = DictStr::new(sr, st, "metric_description")?;
        let unit = DictStr::new(sr, st, "metric_unit")?;
        let metadata: &DictionaryArray<UInt32Type> = col(sr, st, "metric_metadata")?;
        let bad_metadata = || ConvertError::WrongType {
            table: st,
            column: "metric_metadata",
        };
        let metadata_values = metadata
            .values()
            .as_any()
            .downcast_ref::<BinaryArray>()
            .ok_or_else(bad_metadata)?;
        let kind: &UInt8Array = col(sr, st, "metric_type")?;
        let temporality: &Int32Array = col(sr, st, "temporality")?;
        let monotonic: &BooleanArray = col(sr, st, "is_monotonic")?;
        let series_id: &UInt64Array = col(sr, st, "series_id")?;
        let rid: &UInt32Array = col(sr, st, "resource_id")?;
        let sid: &UInt32Array = col(sr, st, "scope_id")?;
        let attrs = AttrReader::new(t.get(schema::SERIES_ATTRS)?, schema::SERIES_ATTRS)?.grouped(sr.num_rows())?;
        let (mut rmap, mut smap) = (
            vec![u32::MAX; contexts.resources.len()],
            vec![u32::MAX; contexts.scopes.len()],
        );
        let mut map = vec![u32::MAX; sr.num_rows()];
        let points: &UInt32Array = col(root, schema::POINTS, "series")?;
        for (row, &s) in points.values().iter().enumerate() {
            let bad = ConvertError::BadReference {
                table: schema::POINTS,
                row,
            };
            let slot = map.get_mut(s as usize).ok_or(bad)?;
            if *slot == u32::MAX {
                let s = s as usize;
                let bad = || ConvertError::BadReference { table: st, row: s };
                let r = rid.value(s) as usize;
                let r_out = rmap.get_mut(r).ok_or_else(bad)?;
                if *r_out == u32::MAX {
                    let (resource, url) = &contexts.resources[r];
                    *r_out = ctx.resource(resource.as_ref(), url);
                }
                let c = sid.value(s) as usize;
                let s_out = smap.get_mut(c).ok_or_else(bad)?;
                if *s_out == u32::MAX {
                    let (scope, url) = &contexts.scopes[c];
                    *s_out = ctx.scope(scope.as_ref(), url);
                }
                let md = match metadata.key(s) {
                    None => None,
                    Some(k) if k < metadata_values.len() => Some(self.metadata_key(metadata_values.value(k))),
                    Some(_) => return Err(bad_metadata()),
                };
                let identity = SeriesIdentity {
                    resource: *r_out,
                    scope: *s_out,
                    name: self.name.intern(name.get(s).unwrap_or("")),
                    description: self.description.intern(description.get(s).unwrap_or("")),
                    unit: self.unit.intern(unit.get(s).unwrap_or("")),
                    metadata: md,
                    kind: kind.value(s),
                    temporality: temporality.value(s),
                    monotonic: monotonic.value(s),
                    series_id: series_id.value(s),
                };
                *slot = self.series(&identity, &attrs[s]);
            }
            series_of.push(*slot);
        }
        Ok(())
    }

    fn metadata_key(&mut self, bytes: &[u8]) -> u32 {
        let next = self.metadata_index.len() as u32;
        *self.metadata_index.entry(bytes.to_vec()).or_insert_with(|| {
            self.metadata_values.append_value(bytes);
            next
        })
    }

    /// The merged row of a series, added when new (the key is the one
    /// `PointsBuilder` uses, so both paths number series alike).
    fn series(&mut self, m: &SeriesIdentity, attributes: &[KeyValue]) -> u32 {
        self.key.clear();
        crate::convert::metrics::SeriesKey {
            resource: m.resource,
            scope: m.scope,
            name: m.name,
            description: m.description,
            unit: m.unit,
            metadata: m.metadata,
            kind: m.kind,
            temporality: m.temporality,
            monotonic: m.monotonic,
        }
        .write(attributes, &mut self.key);
        if let Some(&s) = self.index.get(self.key.as_slice()) {
            return s;
        }
        let s = self.series_id.len() as u32;
        self.index.insert(self.key.clone(), s);
        self.name.push_key(m.name);
        self.description.push_key(m.description);
        self.unit.push_key(m.unit);
        self.metadata.push(m.metadata);
        self.kind.push(m.kind);
        self.temporality.push(m.temporality);
        self.monotonic.push(m.monotonic);
        self.series_id.push(m.series_id);
        self.resource_id.push(m.resource);
        self.scope_id.push(m.scope);
        self.attrs.append_all(s, attributes);
        s
    }

    fn finish(mut self) -> Result<(RecordBatch, RecordBatch), ConvertError> {
        let metadata = DictionaryArray::<UInt32Type>::try_new(
            UInt32Array::from(self.metadata),
            Arc::new(self.metadata_values.finish()),
        )?;
        let columns: Vec<ArrayRef> = vec![
            self.name.finish()?,
            self.description.finish()?,
            self.unit.finish()?,
            Arc::new(metadata),
            Arc::new(UInt8Array::from(self.kind)),
            Arc::new(Int32Array::from(self.temporality)),
            Arc::new(BooleanArray::from(self.monotonic)),
            Arc::new(UInt64Array::from(self.series_id)),
            u32_column(self.resource_id),
            u32_column(self.scope_id),
        ];
        Ok((schema::batch(&schema::series(), columns)?, self.attrs.finish()?))
    }
}

/// One input series with its merged resource, scope and dictionary keys.
struct SeriesIdentity {
    resource: u32,
    scope: u32,
    name: u32,
    description: u32,
    unit: u32,
    metadata: Option<u32>,
    kind: u8,
    temporality: i32,
    monotonic: bool,
    series_id: u64,
}

/// Table `name` of every input.
fn tables<'a>(inputs: &'a [TableSet], name: &'static str) -> Result<Vec<&'a RecordBatch>, ConvertError> {
    inputs.iter().map(|t| t.get(name)).collect()
}

/// Table `name` of every input with the rows of its owner (`owners[i]`).
fn owned<'a>(
    inputs: &'a [TableSet],
    name: &'static str,
    owners: &[&RecordBatch],
) -> Result<Vec<(&'a RecordBatch, usize)>, ConvertError> {
    inputs
        .iter()
        .zip(owners)
        .map(|(t, o)| Ok((t.get(name)?, o.num_rows())))
        .collect()
}

fn u32_column(v: Vec<u32>) -> ArrayRef {
    Arc::new(UInt32Array::from(v))
}

/// Adds the resources and scopes the inputs' root rows use to `ctx`, in
/// first use over the concatenated rows; returns the root's new
/// `resource_id` and `scope_id` columns.
fn remap_contexts(
    ctx: &mut ContextBuilder,
    inputs: &[TableSet],
    root: &'static str,
) -> Result<(Vec<u32>, Vec<u32>), ConvertError> {
    let rows: usize = inputs.iter().map(|t| t.rows).sum();
    let (mut rids, mut sids) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    let mut memo = ContextMemo::default();
    for t in inputs {
        let mut input = memo.input(t)?;
        let rb = t.get(root)?;
        let rid: &UInt32Array = col(rb, root, "resource_id")?;
        let sid: &UInt32Array = col(rb, root, "scope_id")?;
        for (row, (&r, &s)) in rid.values().iter().zip(sid.values()).enumerate() {
            let bad = || ConvertError::BadReference { table: root, row };
            rids.push(input.resource(&mut memo, ctx, r as usize).ok_or_else(bad)??);
            sids.push(input.scope(&mut memo, ctx, s as usize).ok_or_else(bad)??);
        }
    }
    Ok((rids, sids))
}

/// Resources and scopes already added to the merged [`ContextBuilder`],
/// by the content of their table rows: an input whose resources and
/// scopes were all seen before (the common case: one service's blocks)
/// is never decoded into OTLP.
#[derive(Default)]
struct ContextMemo {
    resources: HashMap<Vec<u8>, u32, foldhash::fast::RandomState>,
    scopes: HashMap<Vec<u8>, u32, foldhash::fast::RandomState>,
    key: Vec<u8>,
}

/// One input's resources and scopes while its rows are remapped.
struct InputContexts<'a> {
    t: &'a TableSet,
    resources: &'a RecordBatch,
    resource_attrs: AttrReader<'a>,
    scopes: &'a RecordBatch,
    scope_attrs: AttrReader<'a>,
    /// Merged id of each resource and scope row, once known.
    resource_ids: Vec<u32>,
    scope_ids: Vec<u32>,
    /// Decoded on the first row not in the memo.
    decoded: Option<Contexts>,
}

fn put(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

impl ContextMemo {
    fn input<'a>(&self, t: &'a TableSet) -> Result<InputContexts<'a>, ConvertError> {
        let resources = t.get(schema::RESOURCES)?;
        let scopes = t.get(schema::SCOPES)?;
        Ok(InputContexts {
            t,
            resources,
            resource_attrs: AttrReader::new(t.get(schema::RESOURCE_ATTRS)?, schema::RESOURCE_ATTRS)?,
            scopes,
            scope_attrs: AttrReader::new(t.get(schema::SCOPE_ATTRS)?, schema::SCOPE_ATTRS)?,
            resource_ids: vec![u32::MAX; resources.num_rows()],
            scope_ids: vec![u32::MAX; scopes.num_rows()],
            decoded: None,
        })
    }
}

impl InputContexts<'_> {
    fn contexts(&mut self) -> Result<&Contexts, ConvertError> {
        if self.decoded.is_none() {
            self.decoded = Some(Contexts::read(self.t)?);
        }
        self.decoded
            .as_ref()
            .ok_or(ConvertError::MissingTable(schema::RESOURCES))
    }

    /// The merged id of resource row `r`; `None` when there is no such row.
    fn resource(
        &mut self,
        memo: &mut ContextMemo,
        ctx: &mut ContextBuilder,
        r: usize,
    ) -> Option<Result<u32, ConvertError>> {
        let id = *self.resource_ids.get(r)?;
        if id != u32::MAX {
            return Some(Ok(id));
        }
        Some(self.new_resource(memo, ctx, r))
    }

    fn new_resource(
        &mut self,
        memo: &mut ContextMemo,
        ctx: &mut ContextBuilder,
        r: usize,
    ) -> Result<u32, ConvertError> {
        let t = schema::RESOURCES;
        let url: &StringArray = col(self.resources, t, "schema_url")?;
        let dropped: &UInt32Array = col(self.resources, t, "dropped_attributes_count")?;
        let refs: &BinaryArray = col(self.resources, t, "entity_refs")?;
        let key = &mut memo.key;
        key.clear();
        put(key, url.value(r).as_bytes());
        key.push(u8::from(dropped.is_valid(r)));
        key.extend_from_slice(&dropped.value(r).to_le_bytes());
        key.push(u8::from(refs.is_valid(r)));
        put(key, if refs.is_valid(r) { refs.value(r) } else { &[] });
        for (row, _) in self.resource_attrs.rows_of(r as u32..r as u32 + 1) {
            self.resource_attrs.content_key(row, key)?;
        }
        let id = match memo.resources.get(key.as_slice()) {
            Some(&id) => id,
            None => {
                let (resource, url) = &self.contexts()?.resources[r];
                let id = ctx.resource(resource.as_ref(), url);
                memo.resources.insert(memo.key.clone(), id);
                id
            }
        };
        self.resource_ids[r] = id;
        Ok(id)
    }

    /// The merged id of scope row `s`; `None` when there is no such row.
    fn scope(
        &mut self,
        memo: &mut ContextMemo,
        ctx: &mut ContextBuilder,
        s: usize,
    ) -> Option<Result<u32, ConvertError>> {
        let id = *self.scope_ids.get(s)?;
        if id != u32::MAX {
            return Some(Ok(id));
        }
        Some(self.new_scope(memo, ctx, s))
    }

    fn new_scope(&mut self, memo: &mut ContextMemo, ctx: &mut ContextBuilder, s: usize) -> Result<u32, ConvertError> {
        let t = schema::SCOPES;
        let name: &StringArray = col(self.scopes, t, "name")?;
        let version: &StringArray = col(self.scopes, t, "version")?;
        let dropped: &UInt32Array = col(self.scopes, t, "dropped_attributes_count")?;
        let url: &StringArray = col(self.scopes, t, "schema_url")?;
        let key = &mut memo.key;
        key.clear();
        key.push(u8::from(name.is_valid(s)));
        put(key, name.value(s).as_bytes());
        put(key, version.value(s).as_bytes());
        key.extend_from_slice(&dropped.value(s).to_le_bytes());
        put(key, url.value(s).as_bytes());
        for (row, _) in self.scope_attrs.rows_of(s as u32..s as u32 + 1) {
            self.scope_attrs.content_key(row, key)?;
        }
        let id = match memo.scopes.get(key.as_slice()) {
            Some(&id) => id,
            None => {
                let (scope, url) = &self.contexts()?.scopes[s];
                let id = ctx.scope(scope.as_ref(), url);
                memo.scopes.insert(memo.key.clone(), id);
                id
            }
        };
        self.scope_ids[s] = id;
        Ok(id)
    }
}

/// Appends every row of `d` to `out` (a null as the empty string, as the
/// OTLP path reads it), interning each distinct value once.
fn reintern(out: &mut DictBuilder, d: &DictStr<'_>) {
    let values = d.values();
    let mut remap = vec![u32::MAX; values.len()];
    for row in 0..d.len() {
        let k = if d.is_null(row) {
            out.intern("")
        } else {
            let key = d.key(row);
            let slot = &mut remap[key];
            if *slot == u32::MAX {
                *slot = out.intern(values.value(key));
            }
            *slot
        };
        out.push_key(k);
    }
}

/// The dictionary column `column` of `parts`, concatenated and re-interned.
fn dict_column(parts: &[&RecordBatch], table: &'static str, column: &str) -> Result<ArrayRef, ConvertError> {
    let mut out = DictBuilder::default();
    for p in parts {
        let arr = p.column_by_name(column).ok_or(ConvertError::WrongType {
            table,
            column: "dictionary",
        })?;
        reintern(&mut out, &DictStr::from_dyn(arr.as_ref(), table, "dictionary")?);
    }
    Ok(out.finish()?)
}

/// `parts` concatenated column by column in `schema`'s order: dictionary
/// columns re-interned, the columns `special` answers taken from it, the
/// others concatenated as they are.
fn concat_table(
    schema: &SchemaRef,
    table: &'static str,
    parts: &[&RecordBatch],
    mut special: impl FnMut(&str) -> Option<ArrayRef>,
) -> Result<RecordBatch, ConvertError> {
    let specials: Vec<Option<ArrayRef>> = schema.fields().iter().map(|f| special(f.name())).collect();
    // Columns are independent: each is concatenated as its own task.
    let columns = schema
        .fields()
        .par_iter()
        .zip(specials)
        .map(|(f, given)| {
            let name = f.name().as_str();
            if let Some(c) = given {
                Ok(c)
            } else if matches!(f.data_type(), DataType::Dictionary(_, v) if **v == DataType::Utf8) {
                dict_column(parts, table, name)
            } else {
                let arrays = parts
                    .iter()
                    .map(|p| {
                        p.column_by_name(name)
                            .map(|c| c.as_ref())
                            .ok_or(ConvertError::WrongType { table, column: "?" })
                    })
                    .collect::<Result<Vec<&dyn Array>, _>>()?;
                Ok(arrow::compute::concat(&arrays)?)
            }
        })
        .collect::<Result<Vec<_>, ConvertError>>()?;
    Ok(schema::batch(schema, columns)?)
}

/// A child table with a plain `parent` column (`span_events`,
/// `span_links`) of every input, concatenated with `parent` re-based by
/// the owners' rows before it; `None` unless every input's parents ascend
/// (as the builders write them) and point at an owner row.
fn concat_children(
    schema: &SchemaRef,
    table: &'static str,
    inputs: &[TableSet],
    owners: &[&RecordBatch],
    one_per_owner: bool,
) -> Result<Option<RecordBatch>, ConvertError> {
    let parts = tables(inputs, table)?;
    let mut parent = Vec::with_capacity(parts.iter().map(|p| p.num_rows()).sum());
    let mut base = 0u64;
    for (p, owner) in parts.iter().zip(owners) {
        let ps: &UInt32Array = col(p, table, "parent")?;
        let n = owner.num_rows() as u64;
        let ordered = ps
            .values()
            .windows(2)
            .all(|w| w[0] < w[1] || (!one_per_owner && w[0] == w[1]));
        if !ordered || ps.null_count() > 0 || ps.values().last().is_some_and(|&l| u64::from(l) >= n) {
            return Ok(None);
        }
        let Ok(b) = u32::try_from(base) else {
            return Ok(None);
        };
        parent.extend(ps.values().iter().map(|&x| x + b));
        base += n;
    }
    let mut parent = Some(Arc::new(UInt32Array::from(parent)) as ArrayRef);
    Ok(Some(concat_table(schema, table, &parts, |name| {
        if name == "parent" { parent.take() } else { None }
    })?))
}

/// Attribute tables (with their owners' rows) concatenated: runs re-based
/// by the owners' rows and the attribute rows before them, keys and
/// string values re-interned, union offsets re-based by the children's
/// lengths before them. `None` unless every input is in the builders'
/// layout: parents strictly ascending and in range, every union child
/// filled in row order with no unused values.
fn concat_attrs(table: &'static str, parts: &[(&RecordBatch, usize)]) -> Result<Option<RecordBatch>, ConvertError> {
    let rows: usize = parts.iter().map(|(p, _)| p.num_rows()).sum();
    let (mut run_ends, mut run_parents) = (Vec::<i32>::new(), Vec::<u32>::new());
    let mut key = DictBuilder::default();
    let mut str_values = DictBuilder::default();
    let mut type_ids = Vec::<i8>::with_capacity(rows);
    let mut offsets = Vec::<i32>::with_capacity(rows);
    let mut children: [Vec<ArrayRef>; 7] = Default::default();
    let mut child_base = [0i32; 7];
    let (mut rows_before, mut owners_before) = (0i64, 0u64);
    for &(batch, owner_rows) in parts {
        let value: &UnionArray = col(batch, table, "value")?;
        let complete = match value.data_type() {
            DataType::Union(fields, UnionMode::Dense) => {
                fields.iter().map(|(id, _)| id).eq(attr_type::STR..=attr_type::KV)
            }
            _ => false,
        };
        if !complete {
            return Ok(None);
        }
        let Some(in_offsets) = value.offsets() else {
            return Ok(None);
        };
        let runs: &RunArray<Int32Type> = col(batch, table, "parent")?;
        let ends = runs.run_ends().values();
        let Some(parents) = runs.values().as_any().downcast_ref::<UInt32Array>() else {
            return Err(ConvertError::WrongType {
                table,
                column: "parent",
            });
        };
        let n = value.len();
        let canonical = runs.run_ends().offset() == 0
            && parents.len() == ends.len()
            && parents.null_count() == 0
            && ends.windows(2).all(|w| w[0] < w[1])
            && ends.first().is_none_or(|&e| e > 0)
            && ends.last().map_or(0, |&e| e as usize) == n
            && parents.values().windows(2).all(|w| w[0] < w[1])
            && parents.values().last().is_none_or(|&p| (p as usize) < owner_rows);
        if !canonical {
            return Ok(None);
        }
        let (Ok(rb), Ok(ob)) = (i32::try_from(rows_before), u32::try_from(owners_before)) else {
            return Ok(None);
        };
        run_ends.extend(ends.iter().map(|&e| e + rb));
        run_parents.extend(parents.values().iter().map(|&p| p + ob));

        let mut counts = [0i32; 7];
        for (&t, &o) in value.type_ids().iter().zip(in_offsets.iter()) {
            let Some(c) = usize::try_from(t).ok().and_then(|t| counts.get_mut(t)) else {
                return Ok(None);
            };
            if o != *c {
                return Ok(None);
            }
            *c += 1;
            type_ids.push(t);
            offsets.push(o + child_base[t as usize]);
        }
        for id in attr_type::STR..=attr_type::KV {
            let i = id as usize;
            let child = value.child(id);
            if child.len() != counts[i] as usize {
                return Ok(None);
            }
            child_base[i] += counts[i];
            if id == attr_type::STR {
                reintern(&mut str_values, &DictStr::from_dyn(child.as_ref(), table, "value")?);
            } else {
                children[i].push(child.clone());
            }
        }
        reintern(&mut key, &DictStr::new(batch, table, "key")?);
        rows_before += n as i64;
        owners_before += owner_rows as u64;
    }
    let parent = RunArray::<Int32Type>::try_new(&Int32Array::from(run_ends), &UInt32Array::from(run_parents))?;
    let str_child = str_values.finish()?;
    let fields = schema::attr_value_fields_with(str_child.data_type().clone());
    let mut union_children = vec![str_child];
    for (id, (f, parts)) in fields.iter().zip(&children).enumerate().skip(1) {
        let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
        union_children.push(if refs.is_empty() {
            arrow::array::new_empty_array(f.1.data_type())
        } else {
            arrow::compute::concat(&refs)?
        });
        debug_assert_eq!(id, f.0 as usize);
    }
    let value = UnionArray::try_new(
        fields,
        ScalarBuffer::from(type_ids),
        Some(ScalarBuffer::from(offsets)),
        union_children,
    )?;
    Ok(Some(schema::batch(
        &schema::attrs(),
        vec![Arc::new(parent), key.finish()?, Arc::new(value)],
    )?))
}
