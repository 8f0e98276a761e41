//! Spans (with events and links) ↔ the `spans`, `span_events` and
//! `span_links` tables.

use std::sync::Arc;

use arrow::array::builder::NullBufferBuilder;
use arrow::array::{Array, ArrayRef, FixedSizeBinaryArray, Int32Array, StringArray, UInt32Array, UInt64Array};
use arrow::buffer::ScalarBuffer;
use arrow::record_batch::RecordBatch;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};

use super::columns::{DictStr, IdColumn, TextColumn, check_id, col, id_bytes};
use super::context::{ContextBuilder, Contexts, Grouper};
use super::wire::{self, Fast, Text};
use super::{Appended, ConvertError, Limits, SignalBuilder, TableSet, TimeRange};
use crate::attrs::{AttrBuilder, AttrReader};
use crate::dict::DictBuilder;
use crate::ids::Signal;
use crate::schema;

/// Appends OTLP trace requests to the tables of one open block.
pub struct SpansBuilder {
    ctx: ContextBuilder,
    trace_id: IdColumn<16>,
    span_id: IdColumn<8>,
    parent_span_id: IdColumn<8>,
    trace_state: TextColumn,
    flags: Vec<u32>,
    name: DictBuilder,
    kind: Vec<i32>,
    start: Vec<u64>,
    end: Vec<u64>,
    /// Status codes; null (and 0 in the values) for spans without a status.
    status_code: Vec<i32>,
    status_nulls: NullBufferBuilder,
    status_message: TextColumn,
    dropped_attrs: Vec<u32>,
    dropped_events: Vec<u32>,
    dropped_links: Vec<u32>,
    resource_id: Vec<u32>,
    scope_id: Vec<u32>,
    attrs: AttrBuilder,
    ev_parent: Vec<u32>,
    ev_time: Vec<u64>,
    ev_name: DictBuilder,
    ev_dropped: Vec<u32>,
    ev_attrs: AttrBuilder,
    ln_parent: Vec<u32>,
    ln_trace_id: IdColumn<16>,
    ln_span_id: IdColumn<8>,
    ln_trace_state: TextColumn,
    ln_flags: Vec<u32>,
    ln_dropped: Vec<u32>,
    ln_attrs: AttrBuilder,
    times: TimeRange,
    /// The wire reader's views, kept between requests.
    scratch: wire::TracesScratch,
}

impl Default for SpansBuilder {
    fn default() -> Self {
        SpansBuilder {
            ctx: ContextBuilder::default(),
            trace_id: IdColumn::default(),
            span_id: IdColumn::default(),
            parent_span_id: IdColumn::default(),
            trace_state: TextColumn::default(),
            flags: Vec::new(),
            name: DictBuilder::default(),
            kind: Vec::new(),
            start: Vec::new(),
            end: Vec::new(),
            status_code: Vec::new(),
            status_nulls: NullBufferBuilder::new(0),
            status_message: TextColumn::default(),
            dropped_attrs: Vec::new(),
            dropped_events: Vec::new(),
            dropped_links: Vec::new(),
            resource_id: Vec::new(),
            scope_id: Vec::new(),
            attrs: AttrBuilder::default(),
            ev_parent: Vec::new(),
            ev_time: Vec::new(),
            ev_name: DictBuilder::default(),
            ev_dropped: Vec::new(),
            ev_attrs: AttrBuilder::default(),
            ln_parent: Vec::new(),
            ln_trace_id: IdColumn::default(),
            ln_span_id: IdColumn::default(),
            ln_trace_state: TextColumn::default(),
            ln_flags: Vec::new(),
            ln_dropped: Vec::new(),
            ln_attrs: AttrBuilder::default(),
            times: TimeRange::default(),
            scratch: wire::TracesScratch::default(),
        }
    }
}

/// Checks a request can be appended whole.
pub fn validate(req: &ExportTraceServiceRequest) -> Result<usize, ConvertError> {
    let mut n = 0;
    for rs in &req.resource_spans {
        for ss in &rs.scope_spans {
            for s in &ss.spans {
                check_id("trace_id", &s.trace_id, 16)?;
                check_id("span_id", &s.span_id, 8)?;
                check_id("parent_span_id", &s.parent_span_id, 8)?;
                for l in &s.links {
                    check_id("link trace_id", &l.trace_id, 16)?;
                    check_id("link span_id", &l.span_id, 8)?;
                }
                n += 1;
            }
        }
    }
    Ok(n)
}

/// One span's `spans` columns, from either decode path.
struct SpanRow<'a> {
    trace_id: &'a [u8],
    span_id: &'a [u8],
    parent_span_id: &'a [u8],
    trace_state: &'a str,
    flags: u32,
    name: Text<'a>,
    kind: i32,
    start: u64,
    end: u64,
    status: Option<(i32, &'a str)>,
    dropped_attrs: u32,
    dropped_events: u32,
    dropped_links: u32,
}

/// True when the limits change nothing in a parsed request.
fn view_fits(view: &wire::TracesView<'_>, limits: &Limits) -> bool {
    view.spans.iter().all(|s| {
        limits.time_fits(s.start)
            && limits.time_fits(s.end)
            && limits.wire_attrs_fit(&view.attrs[s.attrs.clone()])
            && view.events[s.events.clone()]
                .iter()
                .all(|e| limits.wire_attrs_fit(&view.ev_attrs[e.attrs.clone()]))
            && view.links[s.links.clone()]
                .iter()
                .all(|l| limits.wire_attrs_fit(&view.ln_attrs[l.attrs.clone()]))
    }) && view
        .resources
        .iter()
        .all(|r| r.resource.as_ref().is_none_or(|r| limits.fits(&r.attributes)))
        && view
            .scopes
            .iter()
            .all(|s| s.scope.as_ref().is_none_or(|s| limits.fits(&s.attributes)))
}

impl std::fmt::Debug for SpansBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpansBuilder")
            .field("rows", &self.start.len())
            .finish_non_exhaustive()
    }
}

impl SignalBuilder for SpansBuilder {
    type Request = ExportTraceServiceRequest;
    const SIGNAL: Signal = Signal::Traces;

    fn apply_limits(limits: &Limits, req: &mut ExportTraceServiceRequest) -> Appended {
        limits.apply_traces(req)
    }

    fn rows(&self) -> usize {
        self.start.len()
    }

    fn approx_bytes(&self) -> usize {
        self.start.len() * 100
            + self.ev_time.len() * 24
            + self.ln_parent.len() * 40
            + self.attrs.approx_bytes()
            + self.ev_attrs.approx_bytes()
            + self.ln_attrs.approx_bytes()
            + self.ctx.approx_bytes()
            + self.trace_state.value_bytes()
            + self.status_message.value_bytes()
            + self.ln_trace_state.value_bytes()
            + self.name.value_bytes()
            + self.ev_name.value_bytes()
    }

    fn append(&mut self, req: &ExportTraceServiceRequest) -> Result<usize, ConvertError> {
        let n = validate(req)?;
        for rs in &req.resource_spans {
            let rid = self.ctx.resource(rs.resource.as_ref(), &rs.schema_url);
            for ss in &rs.scope_spans {
                let sid = self.ctx.scope(ss.scope.as_ref(), &ss.schema_url);
                for s in &ss.spans {
                    self.append_span(rid, sid, s)?;
                }
            }
        }
        Ok(n)
    }

    /// Appends an encoded `ExportTraceServiceRequest`. Common shapes are
    /// read straight from the wire; anything else (and requests the limits
    /// change) is decoded by prost first. Either way the request is checked
    /// whole before anything is appended.
    fn append_limited(&mut self, buf: &[u8], limits: &Limits) -> Result<Appended, ConvertError> {
        let dicts = wire::TracesDicts {
            name: &self.name,
            ev_name: &self.ev_name,
            attrs: self.attrs.dicts(),
            ev_attrs: self.ev_attrs.dicts(),
            ln_attrs: self.ln_attrs.dicts(),
        };
        let view = match wire::parse_traces(buf, &mut self.scratch, dicts) {
            Fast::Done(view) if limits.is_none() || view_fits(&view, limits) => view,
            other => {
                if let Fast::Done(view) = other {
                    self.scratch.keep(view);
                }
                return super::limits::append_via_prost::<ExportTraceServiceRequest>(
                    buf,
                    |req| limits.apply_traces(req),
                    |req| self.append(req),
                );
            }
        };
        let appended = self.append_view(&view);
        self.scratch.keep(view);
        appended
    }

    fn finish(&mut self) -> Result<TableSet, ConvertError> {
        let rows = self.start.len();
        let take32 = |v: &mut Vec<u32>| Arc::new(UInt32Array::from(std::mem::take(v))) as ArrayRef;
        let spans: Vec<ArrayRef> = vec![
            Arc::new(self.trace_id.finish()?),
            Arc::new(self.span_id.finish()?),
            Arc::new(self.parent_span_id.finish()?),
            Arc::new(self.trace_state.finish()?),
            take32(&mut self.flags),
            self.name.finish()?,
            Arc::new(Int32Array::from(std::mem::take(&mut self.kind))),
            Arc::new(UInt64Array::from(std::mem::take(&mut self.start))),
            Arc::new(UInt64Array::from(std::mem::take(&mut self.end))),
            Arc::new(Int32Array::new(
                ScalarBuffer::from(std::mem::take(&mut self.status_code)),
                self.status_nulls.finish(),
            )),
            Arc::new(self.status_message.finish()?),
            take32(&mut self.dropped_attrs),
            take32(&mut self.dropped_events),
            take32(&mut self.dropped_links),
            take32(&mut self.resource_id),
            take32(&mut self.scope_id),
        ];
        let events: Vec<ArrayRef> = vec![
            take32(&mut self.ev_parent),
            Arc::new(UInt64Array::from(std::mem::take(&mut self.ev_time))),
            self.ev_name.finish()?,
            take32(&mut self.ev_dropped),
        ];
        let links: Vec<ArrayRef> = vec![
            take32(&mut self.ln_parent),
            Arc::new(self.ln_trace_id.finish()?),
            Arc::new(self.ln_span_id.finish()?),
            Arc::new(self.ln_trace_state.finish()?),
            take32(&mut self.ln_flags),
            take32(&mut self.ln_dropped),
        ];
        let mut tables = vec![
            (schema::SPANS, schema::batch(&schema::spans(), spans)?),
            (schema::SPAN_ATTRS, self.attrs.finish()?),
            (schema::SPAN_EVENTS, schema::batch(&schema::span_events(), events)?),
            (schema::EVENT_ATTRS, self.ev_attrs.finish()?),
            (schema::SPAN_LINKS, RecordBatch::try_new(schema::span_links(), links)?),
            (schema::LINK_ATTRS, self.ln_attrs.finish()?),
        ];
        self.ctx.finish(&mut tables)?;
        self.scratch = wire::TracesScratch::default();
        let (min_time, max_time) = std::mem::take(&mut self.times).bounds();
        Ok(TableSet {
            signal: Signal::Traces,
            tables,
            rows,
            min_time,
            max_time,
        })
    }
}

impl SpansBuilder {
    /// Room for `spans` more spans (and the events, links and attributes
    /// given), so a request's rows do not grow the columns step by step.
    fn reserve(&mut self, spans: usize, attrs: usize, events: usize, links: usize) {
        self.trace_id.reserve(spans);
        self.span_id.reserve(spans);
        self.parent_span_id.reserve(spans);
        self.trace_state.reserve(spans);
        self.flags.reserve(spans);
        self.name.reserve(spans);
        self.kind.reserve(spans);
        self.start.reserve(spans);
        self.end.reserve(spans);
        self.status_code.reserve(spans);
        self.status_message.reserve(spans);
        self.dropped_attrs.reserve(spans);
        self.dropped_events.reserve(spans);
        self.dropped_links.reserve(spans);
        self.resource_id.reserve(spans);
        self.scope_id.reserve(spans);
        self.attrs.reserve(attrs);
        if events > 0 {
            self.ev_parent.reserve(events);
            self.ev_time.reserve(events);
            self.ev_name.reserve(events);
            self.ev_dropped.reserve(events);
        }
        if links > 0 {
            self.ln_parent.reserve(links);
            self.ln_trace_id.reserve(links);
            self.ln_span_id.reserve(links);
            self.ln_trace_state.reserve(links);
            self.ln_flags.reserve(links);
            self.ln_dropped.reserve(links);
        }
    }

    /// Appends a request the wire reader parsed, ids checked first.
    fn append_view(&mut self, view: &wire::TracesView<'_>) -> Result<Appended, ConvertError> {
        // In the order `validate` checks, so both paths name the same id.
        for s in &view.spans {
            check_id("trace_id", s.trace_id, 16)?;
            check_id("span_id", s.span_id, 8)?;
            check_id("parent_span_id", s.parent_span_id, 8)?;
            for l in &view.links[s.links.clone()] {
                check_id("link trace_id", l.trace_id, 16)?;
                check_id("link span_id", l.span_id, 8)?;
            }
        }
        self.reserve(view.spans.len(), view.attrs.len(), view.events.len(), view.links.len());
        for res in &view.resources {
            let rid = self.ctx.resource(res.resource.as_ref(), res.schema_url);
            for scope in &view.scopes[res.scopes.clone()] {
                let sid = self.ctx.scope(scope.scope.as_ref(), scope.schema_url);
                for s in &view.spans[scope.records.clone()] {
                    let row = self.push_span(
                        rid,
                        sid,
                        &SpanRow {
                            trace_id: s.trace_id,
                            span_id: s.span_id,
                            parent_span_id: s.parent_span_id,
                            trace_state: s.trace_state,
                            flags: s.flags,
                            name: s.name,
                            kind: s.kind,
                            start: s.start,
                            end: s.end,
                            status: s.status,
                            dropped_attrs: s.dropped_attrs,
                            dropped_events: s.dropped_events,
                            dropped_links: s.dropped_links,
                        },
                    )?;
                    self.attrs.append_views(row, &view.attrs[s.attrs.clone()]);
                    for e in &view.events[s.events.clone()] {
                        let erow = self.push_event(row, e.time, e.name, e.dropped);
                        self.ev_attrs.append_views(erow, &view.ev_attrs[e.attrs.clone()]);
                    }
                    for l in &view.links[s.links.clone()] {
                        let lrow = self.push_link(row, l.trace_id, l.span_id, l.trace_state, l.flags, l.dropped)?;
                        self.ln_attrs.append_views(lrow, &view.ln_attrs[l.attrs.clone()]);
                    }
                }
            }
        }
        Ok(Appended {
            rows: view.spans.len(),
            ..Appended::default()
        })
    }

    fn append_span(&mut self, rid: u32, sid: u32, s: &Span) -> Result<(), ConvertError> {
        let row = self.push_span(
            rid,
            sid,
            &SpanRow {
                trace_id: &s.trace_id,
                span_id: &s.span_id,
                parent_span_id: &s.parent_span_id,
                trace_state: &s.trace_state,
                flags: s.flags,
                name: Text::Str(&s.name),
                kind: s.kind,
                start: s.start_time_unix_nano,
                end: s.end_time_unix_nano,
                status: s.status.as_ref().map(|st| (st.code, st.message.as_str())),
                dropped_attrs: s.dropped_attributes_count,
                dropped_events: s.dropped_events_count,
                dropped_links: s.dropped_links_count,
            },
        )?;
        self.attrs.append_all(row, &s.attributes);
        for e in &s.events {
            let erow = self.push_event(row, e.time_unix_nano, Text::Str(&e.name), e.dropped_attributes_count);
            self.ev_attrs.append_all(erow, &e.attributes);
        }
        for l in &s.links {
            let lrow = self.push_link(
                row,
                &l.trace_id,
                &l.span_id,
                &l.trace_state,
                l.flags,
                l.dropped_attributes_count,
            )?;
            self.ln_attrs.append_all(lrow, &l.attributes);
        }
        Ok(())
    }

    /// Appends one span's root columns; returns its row. Ids must have been
    /// checked.
    fn push_span(&mut self, rid: u32, sid: u32, s: &SpanRow<'_>) -> Result<u32, ConvertError> {
        let row = self.start.len() as u32;
        self.trace_id.append("trace_id", s.trace_id)?;
        self.span_id.append("span_id", s.span_id)?;
        self.parent_span_id.append("parent_span_id", s.parent_span_id)?;
        self.trace_state.append(s.trace_state);
        self.flags.push(s.flags);
        s.name.append_to(&mut self.name);
        self.kind.push(s.kind);
        self.start.push(s.start);
        self.end.push(s.end);
        self.times.add(s.start);
        match s.status {
            Some((code, message)) => {
                self.status_code.push(code);
                self.status_nulls.append_non_null();
                self.status_message.append(message);
            }
            None => {
                self.status_code.push(0);
                self.status_nulls.append_null();
                self.status_message.append("");
            }
        }
        self.dropped_attrs.push(s.dropped_attrs);
        self.dropped_events.push(s.dropped_events);
        self.dropped_links.push(s.dropped_links);
        self.resource_id.push(rid);
        self.scope_id.push(sid);
        Ok(row)
    }

    /// Appends one event of span `row`; returns the event's row.
    fn push_event(&mut self, row: u32, time: u64, name: Text<'_>, dropped: u32) -> u32 {
        let erow = self.ev_time.len() as u32;
        self.ev_parent.push(row);
        self.ev_time.push(time);
        name.append_to(&mut self.ev_name);
        self.ev_dropped.push(dropped);
        erow
    }

    /// Appends one link of span `row`; returns the link's row. Ids must have
    /// been checked.
    fn push_link(
        &mut self,
        row: u32,
        trace_id: &[u8],
        span_id: &[u8],
        trace_state: &str,
        flags: u32,
        dropped: u32,
    ) -> Result<u32, ConvertError> {
        let lrow = self.ln_parent.len() as u32;
        self.ln_parent.push(row);
        self.ln_trace_id.append("link trace_id", trace_id)?;
        self.ln_span_id.append("link span_id", span_id)?;
        self.ln_trace_state.append(trace_state);
        self.ln_flags.push(flags);
        self.ln_dropped.push(dropped);
        Ok(lrow)
    }
}

/// Typed view of the `spans` table.
#[derive(Debug)]
pub struct SpanColumns<'a> {
    pub trace_id: &'a FixedSizeBinaryArray,
    pub span_id: &'a FixedSizeBinaryArray,
    pub parent_span_id: &'a FixedSizeBinaryArray,
    pub trace_state: &'a StringArray,
    pub flags: &'a UInt32Array,
    pub name: DictStr<'a>,
    pub kind: &'a Int32Array,
    pub start: &'a UInt64Array,
    pub end: &'a UInt64Array,
    pub status_code: &'a Int32Array,
    pub status_message: &'a StringArray,
    pub dropped_attrs: &'a UInt32Array,
    pub dropped_events: &'a UInt32Array,
    pub dropped_links: &'a UInt32Array,
    pub resource_id: &'a UInt32Array,
    pub scope_id: &'a UInt32Array,
}

impl<'a> SpanColumns<'a> {
    pub fn new(b: &'a RecordBatch) -> Result<Self, ConvertError> {
        let t = schema::SPANS;
        Ok(SpanColumns {
            trace_id: col(b, t, "trace_id")?,
            span_id: col(b, t, "span_id")?,
            parent_span_id: col(b, t, "parent_span_id")?,
            trace_state: col(b, t, "trace_state")?,
            flags: col(b, t, "flags")?,
            name: DictStr::new(b, t, "name")?,
            kind: col(b, t, "kind")?,
            start: col(b, t, "start_time_unix_nano")?,
            end: col(b, t, "end_time_unix_nano")?,
            status_code: col(b, t, "status_code")?,
            status_message: col(b, t, "status_message")?,
            dropped_attrs: col(b, t, "dropped_attributes_count")?,
            dropped_events: col(b, t, "dropped_events_count")?,
            dropped_links: col(b, t, "dropped_links_count")?,
            resource_id: col(b, t, "resource_id")?,
            scope_id: col(b, t, "scope_id")?,
        })
    }
}

/// A block's trace tables back as one OTLP request.
pub fn spans_to_otlp(tables: &TableSet) -> Result<ExportTraceServiceRequest, ConvertError> {
    spans_to_otlp_rows(tables, None)
}

/// A block's trace tables back as one OTLP request whose spans, read in
/// order, are the table's rows in order (see
/// [`super::logs_to_otlp_in_row_order`]).
pub fn spans_to_otlp_in_row_order(tables: &TableSet) -> Result<ExportTraceServiceRequest, ConvertError> {
    spans_to_otlp_grouped(tables, None, Grouper::in_row_order())
}

/// Attributes of the parents `rows` (all `0..n` when `None`), by parent.
fn attrs_of(
    reader: &AttrReader<'_>,
    n: usize,
    rows: Option<&[u32]>,
) -> Result<std::collections::HashMap<u32, Vec<opentelemetry_proto::tonic::common::v1::KeyValue>>, ConvertError> {
    match rows {
        Some(rows) => reader.grouped_for(rows),
        None => Ok(reader
            .grouped(n)?
            .into_iter()
            .enumerate()
            .filter(|(_, kv)| !kv.is_empty())
            .map(|(p, kv)| (p as u32, kv))
            .collect()),
    }
}

/// The spans at `rows` of a block's trace tables (every span when `None`)
/// as one OTLP request, with their events, links and attributes; only the
/// attributes of those spans are decoded.
pub fn spans_to_otlp_rows(tables: &TableSet, rows: Option<&[u32]>) -> Result<ExportTraceServiceRequest, ConvertError> {
    spans_to_otlp_grouped(tables, rows, Grouper::default())
}

fn spans_to_otlp_grouped(
    tables: &TableSet,
    rows: Option<&[u32]>,
    mut groups: Grouper<Span>,
) -> Result<ExportTraceServiceRequest, ConvertError> {
    let root = tables.get(schema::SPANS)?;
    let n = root.num_rows();
    let c = SpanColumns::new(root)?;
    let ctx = Contexts::read(tables)?;
    let all: Vec<u32>;
    let rows: &[u32] = match rows {
        Some(r) => r,
        None => {
            all = (0..n as u32).collect();
            &all
        }
    };
    if let Some(&bad) = rows.iter().find(|&&r| r as usize >= n) {
        return Err(ConvertError::BadReference {
            table: schema::SPANS,
            row: bad as usize,
        });
    }
    let partial = rows.len() < n;
    let sel = |r: &[u32]| -> Option<Vec<u32>> { partial.then(|| r.to_vec()) };
    let mut attrs = attrs_of(
        &AttrReader::new(tables.get(schema::SPAN_ATTRS)?, schema::SPAN_ATTRS)?,
        n,
        sel(rows).as_deref(),
    )?;
    // Where each selected span goes in the output.
    let slot_of: std::collections::HashMap<u32, usize> = rows.iter().enumerate().map(|(i, &r)| (r, i)).collect();

    // Events and links of the selected spans, grouped by span.
    let mut events: Vec<Vec<span::Event>> = Vec::new();
    events.resize_with(rows.len(), Vec::new);
    let eb = tables.get(schema::SPAN_EVENTS)?;
    let t = schema::SPAN_EVENTS;
    let (ep, et, en, ed) = (
        col::<UInt32Array>(eb, t, "parent")?,
        col::<UInt64Array>(eb, t, "time_unix_nano")?,
        DictStr::new(eb, t, "name")?,
        col::<UInt32Array>(eb, t, "dropped_attributes_count")?,
    );
    let event_rows: Vec<u32> = (0..eb.num_rows() as u32)
        .filter(|&e| slot_of.contains_key(&ep.value(e as usize)))
        .collect();
    let mut eattrs = attrs_of(
        &AttrReader::new(tables.get(schema::EVENT_ATTRS)?, schema::EVENT_ATTRS)?,
        eb.num_rows(),
        sel(&event_rows).as_deref(),
    )?;
    for &e in &event_rows {
        let row = e as usize;
        let slot = slot_of
            .get(&ep.value(row))
            .and_then(|&i| events.get_mut(i))
            .ok_or(ConvertError::BadReference { table: t, row })?;
        slot.push(span::Event {
            time_unix_nano: et.value(row),
            name: en.get(row).unwrap_or("").to_owned(),
            attributes: eattrs.remove(&e).unwrap_or_default(),
            dropped_attributes_count: ed.value(row),
        });
    }
    if let Some(row) = (0..eb.num_rows()).find(|&r| ep.value(r) as usize >= n) {
        return Err(ConvertError::BadReference { table: t, row });
    }
    let mut links: Vec<Vec<span::Link>> = Vec::new();
    links.resize_with(rows.len(), Vec::new);
    let lb = tables.get(schema::SPAN_LINKS)?;
    let t = schema::SPAN_LINKS;
    let (lp, lt, ls, lst, lf, ld) = (
        col::<UInt32Array>(lb, t, "parent")?,
        col::<FixedSizeBinaryArray>(lb, t, "trace_id")?,
        col::<FixedSizeBinaryArray>(lb, t, "span_id")?,
        col::<StringArray>(lb, t, "trace_state")?,
        col::<UInt32Array>(lb, t, "flags")?,
        col::<UInt32Array>(lb, t, "dropped_attributes_count")?,
    );
    if let Some(row) = (0..lb.num_rows()).find(|&r| lp.value(r) as usize >= n) {
        return Err(ConvertError::BadReference { table: t, row });
    }
    let link_rows: Vec<u32> = (0..lb.num_rows() as u32)
        .filter(|&l| slot_of.contains_key(&lp.value(l as usize)))
        .collect();
    let mut lattrs = attrs_of(
        &AttrReader::new(tables.get(schema::LINK_ATTRS)?, schema::LINK_ATTRS)?,
        lb.num_rows(),
        sel(&link_rows).as_deref(),
    )?;
    for &l in &link_rows {
        let row = l as usize;
        let slot = slot_of
            .get(&lp.value(row))
            .and_then(|&i| links.get_mut(i))
            .ok_or(ConvertError::BadReference { table: t, row })?;
        slot.push(span::Link {
            trace_id: id_bytes(lt, row),
            span_id: id_bytes(ls, row),
            trace_state: lst.value(row).to_owned(),
            attributes: lattrs.remove(&l).unwrap_or_default(),
            dropped_attributes_count: ld.value(row),
            flags: lf.value(row),
        });
    }

    for ((&r, events), links) in rows.iter().zip(events).zip(links) {
        let row = r as usize;
        let status = c.status_code.is_valid(row).then(|| Status {
            message: c.status_message.value(row).to_owned(),
            code: c.status_code.value(row),
        });
        let span = Span {
            trace_id: id_bytes(c.trace_id, row),
            span_id: id_bytes(c.span_id, row),
            trace_state: c.trace_state.value(row).to_owned(),
            parent_span_id: id_bytes(c.parent_span_id, row),
            flags: c.flags.value(row),
            name: c.name.get(row).unwrap_or("").to_owned(),
            kind: c.kind.value(row),
            start_time_unix_nano: c.start.value(row),
            end_time_unix_nano: c.end.value(row),
            attributes: attrs.remove(&r).unwrap_or_default(),
            dropped_attributes_count: c.dropped_attrs.value(row),
            events,
            dropped_events_count: c.dropped_events.value(row),
            links,
            dropped_links_count: c.dropped_links.value(row),
            status,
        };
        groups.push(c.resource_id.value(row), c.scope_id.value(row), span);
    }
    let mut resource_spans = Vec::with_capacity(groups.groups.len());
    for (rid, scopes) in groups.groups {
        let (resource, schema_url) = ctx.resource(rid, 0, schema::SPANS)?.clone();
        let mut scope_spans = Vec::with_capacity(scopes.len());
        for (sid, spans) in scopes {
            let (scope, schema_url) = ctx.scope(sid, 0, schema::SPANS)?.clone();
            scope_spans.push(ScopeSpans {
                scope,
                spans,
                schema_url,
            });
        }
        resource_spans.push(ResourceSpans {
            resource,
            scope_spans,
            schema_url,
        });
    }
    Ok(ExportTraceServiceRequest { resource_spans })
}
