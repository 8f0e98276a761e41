//! `ExportTraceServiceRequest` read from the wire: spans, their events and
//! links, and the attributes of each, as views borrowing the request bytes.

use std::ops::Range;

use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::{
    AttrDicts, AttrView, Fast, Reader, ResourceView, ScopeView, Text, W, parse_group, push_attr, recycle, text,
};
use crate::dict::DictBuilder;

#[derive(Debug)]
pub(crate) struct SpanView<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    pub trace_state: &'a str,
    pub parent_span_id: &'a [u8],
    pub flags: u32,
    pub name: Text<'a>,
    pub kind: i32,
    pub start: u64,
    pub end: u64,
    /// Into [`TracesView::attrs`].
    pub attrs: Range<usize>,
    pub dropped_attrs: u32,
    /// Into [`TracesView::events`].
    pub events: Range<usize>,
    pub dropped_events: u32,
    /// Into [`TracesView::links`].
    pub links: Range<usize>,
    pub dropped_links: u32,
    /// (code, message) when the span has a status.
    pub status: Option<(i32, &'a str)>,
}

#[derive(Debug)]
pub(crate) struct EventView<'a> {
    pub time: u64,
    pub name: Text<'a>,
    /// Into [`TracesView::ev_attrs`].
    pub attrs: Range<usize>,
    pub dropped: u32,
}

#[derive(Debug)]
pub(crate) struct LinkView<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    pub trace_state: &'a str,
    /// Into [`TracesView::ln_attrs`].
    pub attrs: Range<usize>,
    pub dropped: u32,
    pub flags: u32,
}

/// A whole trace export request, parsed and checked, borrowing from the
/// bytes. Span, event and link attributes are kept apart so each item's
/// attributes stay contiguous however the fields are ordered on the wire.
#[derive(Debug, Default)]
pub(crate) struct TracesView<'a> {
    pub resources: Vec<ResourceView<'a>>,
    /// `records` of each scope index [`TracesView::spans`].
    pub scopes: Vec<ScopeView<'a>>,
    pub spans: Vec<SpanView<'a>>,
    pub events: Vec<EventView<'a>>,
    pub links: Vec<LinkView<'a>>,
    pub attrs: Vec<AttrView<'a>>,
    pub ev_attrs: Vec<AttrView<'a>>,
    pub ln_attrs: Vec<AttrView<'a>>,
}

/// The allocations of a [`TracesView`], kept by the builder between
/// requests (and dropped when it seals).
#[derive(Debug, Default)]
pub(crate) struct TracesScratch {
    resources: Vec<ResourceView<'static>>,
    scopes: Vec<ScopeView<'static>>,
    spans: Vec<SpanView<'static>>,
    events: Vec<EventView<'static>>,
    links: Vec<LinkView<'static>>,
    attrs: Vec<AttrView<'static>>,
    ev_attrs: Vec<AttrView<'static>>,
    ln_attrs: Vec<AttrView<'static>>,
}

impl TracesScratch {
    fn take<'a>(&mut self) -> TracesView<'a> {
        TracesView {
            resources: recycle(std::mem::take(&mut self.resources)),
            scopes: recycle(std::mem::take(&mut self.scopes)),
            spans: recycle(std::mem::take(&mut self.spans)),
            events: recycle(std::mem::take(&mut self.events)),
            links: recycle(std::mem::take(&mut self.links)),
            attrs: recycle(std::mem::take(&mut self.attrs)),
            ev_attrs: recycle(std::mem::take(&mut self.ev_attrs)),
            ln_attrs: recycle(std::mem::take(&mut self.ln_attrs)),
        }
    }

    /// Keeps the allocations of a view that is no longer needed.
    pub(crate) fn keep(&mut self, v: TracesView<'_>) {
        self.resources = recycle(v.resources);
        self.scopes = recycle(v.scopes);
        self.spans = recycle(v.spans);
        self.events = recycle(v.events);
        self.links = recycle(v.links);
        self.attrs = recycle(v.attrs);
        self.ev_attrs = recycle(v.ev_attrs);
        self.ln_attrs = recycle(v.ln_attrs);
    }
}

/// The dictionaries of the builder a request is parsed for: span and
/// event names, span, event and link attributes. Names, keys and string
/// values their caches hold are parsed as [`Text::Known`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct TracesDicts<'d> {
    pub name: &'d DictBuilder,
    pub ev_name: &'d DictBuilder,
    pub attrs: AttrDicts<'d>,
    pub ev_attrs: AttrDicts<'d>,
    pub ln_attrs: AttrDicts<'d>,
}

/// A request being parsed: the views so far and the dictionaries.
struct Parse<'a, 'd> {
    v: TracesView<'a>,
    d: TracesDicts<'d>,
}

/// Parses an `ExportTraceServiceRequest` into views built in `scratch`'s
/// allocations; [`Fast::Fallback`] for anything prost should decide
/// (malformed bytes included). `dicts` are only read.
pub(crate) fn parse_traces<'a>(
    buf: &'a [u8],
    scratch: &mut TracesScratch,
    dicts: TracesDicts<'_>,
) -> Fast<TracesView<'a>> {
    let mut p = Parse {
        v: scratch.take(),
        d: dicts,
    };
    // Sized from the body (spans take 150+ wire bytes, attributes 20+) so
    // the views do not grow as they fill.
    room(&mut p.v.spans, buf.len() / 128);
    room(&mut p.v.attrs, buf.len() / 24);
    match parse_request(buf, &mut p) {
        Some(()) => Fast::Done(p.v),
        None => {
            scratch.keep(p.v);
            Fast::Fallback
        }
    }
}

/// Room for `n` items in the empty `v`. A kept allocation too small for
/// this request is replaced, not grown: `reserve` would `realloc` it,
/// copying (and so paging in) all of its stale capacity.
fn room<T>(v: &mut Vec<T>, n: usize) {
    if v.is_empty() && v.capacity() < n {
        *v = Vec::with_capacity(n.max(v.capacity() * 2));
    }
    v.reserve(n);
}

fn parse_request<'a>(buf: &'a [u8], v: &mut Parse<'a, '_>) -> W<()> {
    let mut r = Reader::new(buf);
    while !r.done() {
        match r.key()? {
            (1, 2) => parse_resource_spans(r.bytes()?, v)?,
            (1, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    Some(())
}

fn parse_resource_spans<'a>(buf: &'a [u8], p: &mut Parse<'a, '_>) -> W<()> {
    let first = p.v.scopes.len();
    let (resource, schema_url) = parse_group::<Resource, _>(buf, p, parse_scope_spans)?;
    p.v.resources.push(ResourceView {
        resource,
        schema_url,
        scopes: first..p.v.scopes.len(),
    });
    Some(())
}

fn parse_scope_spans<'a>(buf: &'a [u8], p: &mut Parse<'a, '_>) -> W<()> {
    let first = p.v.spans.len();
    let (scope, schema_url) = parse_group::<InstrumentationScope, _>(buf, p, parse_span)?;
    p.v.scopes.push(ScopeView {
        scope,
        schema_url,
        records: first..p.v.spans.len(),
    });
    Some(())
}

fn parse_span<'a>(buf: &'a [u8], p: &mut Parse<'a, '_>) -> W<()> {
    let mut r = Reader::new(buf);
    let d = p.d;
    let v = &mut p.v;
    let (attrs, events, links) = (v.attrs.len(), v.events.len(), v.links.len());
    let mut s = SpanView {
        trace_id: &[],
        span_id: &[],
        trace_state: "",
        parent_span_id: &[],
        flags: 0,
        name: Text::Str(""),
        kind: 0,
        start: 0,
        end: 0,
        attrs: 0..0,
        dropped_attrs: 0,
        events: 0..0,
        dropped_events: 0,
        links: 0..0,
        dropped_links: 0,
        status: None,
    };
    while !r.done() {
        match r.key()? {
            (1, 2) => s.trace_id = r.bytes()?,
            (2, 2) => s.span_id = r.bytes()?,
            (3, 2) => s.trace_state = r.str()?,
            (4, 2) => s.parent_span_id = r.bytes()?,
            (16, 5) => s.flags = r.fixed32()?,
            (5, 2) => s.name = text(r.bytes()?, Some(d.name))?,
            (6, 0) => s.kind = r.varint()? as i32,
            (7, 1) => s.start = r.fixed64()?,
            (8, 1) => s.end = r.fixed64()?,
            (9, 2) => {
                let kv = r.bytes()?;
                push_attr(&mut v.attrs, kv, Some(d.attrs))?;
            }
            (10, 0) => s.dropped_attrs = r.varint()? as u32,
            (11, 2) => parse_event(r.bytes()?, v, &d)?,
            (12, 0) => s.dropped_events = r.varint()? as u32,
            (13, 2) => parse_link(r.bytes()?, v, &d)?,
            (14, 0) => s.dropped_links = r.varint()? as u32,
            (15, 2) => {
                if s.status.is_some() {
                    return None; // protobuf would merge the two
                }
                s.status = Some(parse_status(r.bytes()?)?);
            }
            (1..=16, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    s.attrs = attrs..v.attrs.len();
    s.events = events..v.events.len();
    s.links = links..v.links.len();
    v.spans.push(s);
    Some(())
}

fn parse_status(buf: &[u8]) -> W<(i32, &str)> {
    let mut r = Reader::new(buf);
    let (mut code, mut message) = (0, "");
    while !r.done() {
        match r.key()? {
            (2, 2) => message = r.str()?,
            (3, 0) => code = r.varint()? as i32,
            (2 | 3, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    Some((code, message))
}

fn parse_event<'a>(buf: &'a [u8], v: &mut TracesView<'a>, d: &TracesDicts<'_>) -> W<()> {
    let mut r = Reader::new(buf);
    let first = v.ev_attrs.len();
    let mut e = EventView {
        time: 0,
        name: Text::Str(""),
        attrs: 0..0,
        dropped: 0,
    };
    while !r.done() {
        match r.key()? {
            (1, 1) => e.time = r.fixed64()?,
            (2, 2) => e.name = text(r.bytes()?, Some(d.ev_name))?,
            (3, 2) => {
                let kv = r.bytes()?;
                push_attr(&mut v.ev_attrs, kv, Some(d.ev_attrs))?;
            }
            (4, 0) => e.dropped = r.varint()? as u32,
            (1..=4, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    e.attrs = first..v.ev_attrs.len();
    v.events.push(e);
    Some(())
}

fn parse_link<'a>(buf: &'a [u8], v: &mut TracesView<'a>, d: &TracesDicts<'_>) -> W<()> {
    let mut r = Reader::new(buf);
    let first = v.ln_attrs.len();
    let mut l = LinkView {
        trace_id: &[],
        span_id: &[],
        trace_state: "",
        attrs: 0..0,
        dropped: 0,
        flags: 0,
    };
    while !r.done() {
        match r.key()? {
            (1, 2) => l.trace_id = r.bytes()?,
            (2, 2) => l.span_id = r.bytes()?,
            (3, 2) => l.trace_state = r.str()?,
            (4, 2) => {
                let kv = r.bytes()?;
                push_attr(&mut v.ln_attrs, kv, Some(d.ln_attrs))?;
            }
            (5, 0) => l.dropped = r.varint()? as u32,
            (6, 5) => l.flags = r.fixed32()?,
            (1..=6, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    l.attrs = first..v.ln_attrs.len();
    v.links.push(l);
    Some(())
}
