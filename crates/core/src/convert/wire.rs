//! A protobuf wire-format reader for OTLP export requests (logs here; spans
//! in [`traces`], data points in [`metrics`]) that appends straight into the
//! Arrow builders, skipping prost's per-string
//! allocations (prost decode alone runs below the 2 M records/s/core target;
//! see docs/perf.md).
//!
//! It handles the shapes real exporters send. Anything else — a singular
//! message field repeated (protobuf would merge it), a group, an AnyValue
//! with several members, a known field with an unexpected wire type — makes
//! it answer [`Fast::Fallback`], and the caller decodes with prost, the
//! reference. A differential property test checks that both paths build
//! identical tables for every request the fast path accepts.

use std::ops::Range;

use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use crate::dict::DictBuilder;

mod metrics;
mod traces;

pub(crate) use metrics::{MetricsScratch, MetricsView, parse_metrics};
pub(crate) use traces::{TracesDicts, TracesScratch, TracesView, parse_traces};

/// Empties `v` and returns its allocation for items of another lifetime.
/// The view types differ only in lifetime, so `collect` reuses the buffer
/// in place: builders keep a request's views between requests and the next
/// request's views land in memory that is already paged in.
pub(crate) fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// Outcome of the fast path.
#[derive(Debug)]
pub(crate) enum Fast<T> {
    Done(T),
    /// Not a shape this reader handles; decode with prost instead.
    Fallback,
}

/// `b` as UTF-8, or `None`. Attribute keys, label names and most values
/// are short ASCII, where `std::str::from_utf8` walks byte by byte: up to
/// 64 bytes are tested a word at a time here, and only a string with a
/// byte of 0x80 or more (or a longer one) goes to the full validation.
#[inline(always)]
pub fn utf8(b: &[u8]) -> Option<&str> {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let at = |i: usize| -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(w)
    };
    // Fixed-size loads only: a short copy into a zeroed word is a call to
    // `memcpy` whose byte stores the word's load then waits for.
    let at4 = |i: usize| -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&b[i..i + 4]);
        u32::from_le_bytes(w)
    };
    let ascii = match b.len() {
        0 => true,
        n @ 1..=3 => (b[0] | b[n / 2] | b[n - 1]) & 0x80 == 0,
        n @ 4..=7 => (at4(0) | at4(n - 4)) & 0x8080_8080 == 0,
        n @ 8..=16 => (at(0) | at(n - 8)) & HIGH == 0,
        n @ 17..=64 => {
            // Whole words, then the last eight bytes (overlapping).
            let mut acc = at(n - 8);
            let mut i = 0;
            while i + 8 <= n {
                acc |= at(i);
                i += 8;
            }
            acc & HIGH == 0
        }
        _ => false,
    };
    if ascii {
        // SAFETY: every byte of `b` is below 0x80 (tested just above, a
        // word at a time), and a run of ASCII bytes is valid UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(b) })
    } else {
        std::str::from_utf8(b).ok()
    }
}

/// A protobuf wire reader over one message's bytes: every read answers
/// `None` for input it cannot read (a truncated field, an overlong
/// varint, a bad wire type), never panics.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// `None` means "fall back" (malformed or unusual input; prost decides).
type W<T> = Option<T>;

// `#[inline]` on the small methods too: the remote-write and Loki-push
// readers call them from another crate, where a call per field showed in
// their profiles.
impl<'a> Reader<'a> {
    #[inline(always)]
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    #[inline(always)]
    pub fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// Bytes read so far (for error messages).
    #[inline(always)]
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// A varint; the one-byte case (most tags and lengths) inline.
    #[inline(always)]
    pub fn varint(&mut self) -> W<u64> {
        match self.buf.get(self.pos) {
            Some(&b) if b < 0x80 => {
                self.pos += 1;
                Some(u64::from(b))
            }
            _ => self.varint_long(),
        }
    }

    #[inline(never)]
    fn varint_long(&mut self) -> W<u64> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = *self.buf.get(self.pos)?;
            self.pos += 1;
            // The tenth byte may only carry the 64th bit, as prost insists.
            if i == 9 && b > 1 {
                return None;
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }

    /// A field's tag; one- and two-byte tags (fields up to 2047, such as
    /// a span's `flags`, field 16) inline.
    #[inline(always)]
    pub fn key(&mut self) -> W<(u32, u8)> {
        let k = match *self.buf.get(self.pos..)? {
            [b, ..] if b < 0x80 => {
                self.pos += 1;
                u32::from(b)
            }
            [b0, b1, ..] if b1 < 0x80 => {
                self.pos += 2;
                u32::from(b0 & 0x7f) | u32::from(b1) << 7
            }
            _ => u32::try_from(self.varint_long()?).ok()?,
        };
        let field = k >> 3;
        if field == 0 {
            return None;
        }
        Some((field, (k & 7) as u8))
    }

    #[inline(always)]
    pub fn bytes(&mut self) -> W<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        let end = self.pos.checked_add(len)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    #[inline]
    pub fn str(&mut self) -> W<&'a str> {
        utf8(self.bytes()?)
    }

    #[inline]
    pub fn fixed64(&mut self) -> W<u64> {
        let end = self.pos.checked_add(8)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(u64::from_le_bytes(s.try_into().ok()?))
    }

    #[inline]
    pub fn fixed32(&mut self) -> W<u32> {
        let end = self.pos.checked_add(4)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(u32::from_le_bytes(s.try_into().ok()?))
    }

    /// Skips an unknown field, as prost does.
    pub fn skip(&mut self, wire: u8) -> W<()> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.fixed64().map(|_| ()),
            2 => self.bytes().map(|_| ()),
            5 => self.fixed32().map(|_| ()),
            _ => None,
        }
    }
}

/// A string bound for a dictionary. `Known` is its key there, found while
/// parsing because the dictionary's cache already held these bytes: they
/// are then neither checked for UTF-8 (a dictionary holds only text that
/// was checked) nor looked up again when appended. `Str` is checked text.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Text<'a> {
    Str(&'a str),
    Known(u32, &'a [u8]),
}

impl<'a> Text<'a> {
    pub(crate) fn as_bytes(self) -> &'a [u8] {
        match self {
            Text::Str(s) => s.as_bytes(),
            Text::Known(_, b) => b,
        }
    }

    pub(crate) fn len(self) -> usize {
        self.as_bytes().len()
    }

    pub(crate) fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// Appends a row holding this text to `dict`.
    #[inline(always)]
    pub(crate) fn append_to(self, dict: &mut DictBuilder) {
        match self {
            Text::Str(s) => {
                dict.append(s);
            }
            Text::Known(k, _) => dict.push_key(k),
        }
    }
}

/// `b` as [`Text`]: its key if `dict`'s cache holds it, else checked text.
#[inline(always)]
fn text<'a>(b: &'a [u8], dict: Option<&DictBuilder>) -> W<Text<'a>> {
    if let Some(k) = dict.and_then(|d| d.peek(b)) {
        return Some(Text::Known(k, b));
    }
    utf8(b).map(Text::Str)
}

/// The dictionaries an attribute list's keys and string values go to,
/// looked up (read-only: the request may still fall back to prost) while
/// the attributes are parsed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttrDicts<'d> {
    pub keys: &'d DictBuilder,
    pub strs: &'d DictBuilder,
}

/// An attribute value the builders take without prost.
#[derive(Debug)]
pub(crate) enum Val<'a> {
    Str(Text<'a>),
    Int(i64),
    Double(f64),
    Bool(bool),
    Bytes(&'a [u8]),
    /// Anything else, decoded by prost (arrays, key-value lists, empty
    /// values, string-table indices).
    Other(Box<KeyValue>),
}

#[derive(Debug)]
pub(crate) struct AttrView<'a> {
    pub key: Text<'a>,
    pub value: Val<'a>,
}

#[derive(Debug)]
pub(crate) enum Body<'a> {
    None,
    Str(&'a str),
    Other(AnyValue),
}

#[derive(Debug)]
pub(crate) struct LogView<'a> {
    pub time: u64,
    pub observed: u64,
    pub severity: i32,
    pub severity_text: &'a str,
    pub body: Body<'a>,
    pub attrs: Range<usize>,
    pub dropped: u32,
    pub flags: u32,
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    pub event_name: &'a str,
}

#[derive(Debug)]
pub(crate) struct ScopeView<'a> {
    pub scope: Option<InstrumentationScope>,
    pub schema_url: &'a str,
    pub records: Range<usize>,
}

#[derive(Debug)]
pub(crate) struct ResourceView<'a> {
    pub resource: Option<Resource>,
    pub schema_url: &'a str,
    pub scopes: Range<usize>,
}

/// A whole export request, parsed and checked, borrowing from the bytes.
#[derive(Debug, Default)]
pub(crate) struct LogsView<'a> {
    pub resources: Vec<ResourceView<'a>>,
    pub scopes: Vec<ScopeView<'a>>,
    pub records: Vec<LogView<'a>>,
    pub attrs: Vec<AttrView<'a>>,
}

/// Parses an `ExportLogsServiceRequest`.
pub(crate) fn parse_logs(buf: &[u8]) -> Fast<LogsView<'_>> {
    // Sized from the body so the views do not grow (and copy) as they fill:
    // typical records take 100+ wire bytes and attributes 20+. Pages of
    // an over-estimate are never touched.
    let mut v = LogsView {
        records: Vec::with_capacity(buf.len() / 64),
        attrs: Vec::with_capacity(buf.len() / 16),
        ..LogsView::default()
    };
    match parse_request(buf, &mut v) {
        Some(()) => Fast::Done(v),
        None => Fast::Fallback,
    }
}

fn parse_request<'a>(buf: &'a [u8], v: &mut LogsView<'a>) -> W<()> {
    let mut r = Reader::new(buf);
    while !r.done() {
        match r.key()? {
            (1, 2) => parse_resource_logs(r.bytes()?, v)?,
            (1, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    Some(())
}

/// `ResourceLogs` and `ScopeLogs` (and their trace and metric twins) share
/// one shape: 1 = a singular message
/// (resource or scope), 2 = repeated children, 3 = schema url. Parses it,
/// handing each child to `child`; returns the decoded message and the url.
fn parse_group<'a, M: Message + Default, V>(
    buf: &'a [u8],
    v: &mut V,
    child: fn(&'a [u8], &mut V) -> W<()>,
) -> W<(Option<M>, &'a str)> {
    let mut r = Reader::new(buf);
    let mut message: Option<&[u8]> = None;
    let mut schema_url = "";
    while !r.done() {
        match r.key()? {
            (1, 2) => {
                if message.replace(r.bytes()?).is_some() {
                    return None; // protobuf would merge the two
                }
            }
            (2, 2) => child(r.bytes()?, v)?,
            (3, 2) => schema_url = r.str()?,
            (1..=3, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    let message = match message {
        Some(b) => Some(M::decode(b).ok()?),
        None => None,
    };
    Some((message, schema_url))
}

fn parse_resource_logs<'a>(buf: &'a [u8], v: &mut LogsView<'a>) -> W<()> {
    let first = v.scopes.len();
    let (resource, schema_url) = parse_group::<Resource, _>(buf, v, parse_scope_logs)?;
    v.resources.push(ResourceView {
        resource,
        schema_url,
        scopes: first..v.scopes.len(),
    });
    Some(())
}

fn parse_scope_logs<'a>(buf: &'a [u8], v: &mut LogsView<'a>) -> W<()> {
    let first = v.records.len();
    let (scope, schema_url) = parse_group::<InstrumentationScope, _>(buf, v, parse_record)?;
    v.scopes.push(ScopeView {
        scope,
        schema_url,
        records: first..v.records.len(),
    });
    Some(())
}

fn parse_record<'a>(buf: &'a [u8], v: &mut LogsView<'a>) -> W<()> {
    let mut r = Reader::new(buf);
    let first = v.attrs.len();
    let mut rec = LogView {
        time: 0,
        observed: 0,
        severity: 0,
        severity_text: "",
        body: Body::None,
        attrs: 0..0,
        dropped: 0,
        flags: 0,
        trace_id: &[],
        span_id: &[],
        event_name: "",
    };
    let mut body_seen = false;
    while !r.done() {
        match r.key()? {
            (1, 1) => rec.time = r.fixed64()?,
            (11, 1) => rec.observed = r.fixed64()?,
            (2, 0) => rec.severity = r.varint()? as i32,
            (3, 2) => rec.severity_text = r.str()?,
            (5, 2) => {
                if std::mem::replace(&mut body_seen, true) {
                    return None;
                }
                rec.body = parse_body(r.bytes()?)?;
            }
            (6, 2) => {
                let kv = r.bytes()?;
                v.attrs.push(parse_attr(kv, None)?);
            }
            (7, 0) => rec.dropped = r.varint()? as u32,
            (8, 5) => rec.flags = r.fixed32()?,
            (9, 2) => rec.trace_id = r.bytes()?,
            (10, 2) => rec.span_id = r.bytes()?,
            (12, 2) => rec.event_name = r.str()?,
            (1..=12, _) => return None,
            (_, wire) => r.skip(wire)?,
        }
    }
    rec.attrs = first..v.attrs.len();
    v.records.push(rec);
    Some(())
}

/// A simple AnyValue: exactly one member of a scalar type.
fn simple_value(buf: &[u8]) -> W<Option<Val<'_>>> {
    let mut r = Reader::new(buf);
    let mut out = None;
    while !r.done() {
        let val = match r.key()? {
            (1, 2) => Val::Str(Text::Str(r.str()?)),
            (2, 0) => Val::Bool(r.varint()? != 0),
            (3, 0) => Val::Int(r.varint()? as i64),
            (4, 1) => Val::Double(f64::from_bits(r.fixed64()?)),
            (7, 2) => Val::Bytes(r.bytes()?),
            // Arrays, lists, string indices, unknown fields: prost.
            _ => return Some(None),
        };
        if out.replace(val).is_some() {
            return Some(None);
        }
    }
    Some(out)
}

fn parse_body(buf: &[u8]) -> W<Body<'_>> {
    if let Some(Val::Str(Text::Str(s))) = simple_value(buf)? {
        return Some(Body::Str(s));
    }
    Some(Body::Other(AnyValue::decode(buf).ok()?))
}

/// [`parse_attr`] for the layout exporters write: the key, then a value
/// with one scalar member, every length under 128 bytes. One straight pass.
/// With `dicts`, a key or string value their caches hold is taken as its
/// key there, unchecked (see [`Text`]); the rest is checked, a string
/// attribute's key and value with **one** UTF-8 check when neither is
/// known: the bytes between them are ASCII, so the whole attribute is valid
/// exactly when both are. `None` sends the attribute down the general
/// path, which decides (malformed input included).
#[inline(always)]
fn parse_attr_common<'a>(buf: &'a [u8], dicts: Option<AttrDicts<'_>>) -> Option<AttrView<'a>> {
    attr_common(buf, dicts, |a| a)
}

/// [`parse_attr_common`], handing the view to `emit` where it is built:
/// with `emit` pushing onto the views, each layout's view is written
/// straight into the vector instead of being assembled on the stack and
/// copied (a store-forwarding stall per attribute).
#[inline(always)]
fn attr_common<'a, R>(buf: &'a [u8], dicts: Option<AttrDicts<'_>>, emit: impl FnOnce(AttrView<'a>) -> R) -> Option<R> {
    let &[0x0a, kl, ref rest @ ..] = buf else {
        return None;
    };
    if kl >= 0x80 {
        return None;
    }
    let key_at = 2..2 + usize::from(kl);
    let &[0x12, vl, ref value @ ..] = rest.get(usize::from(kl)..)? else {
        return None;
    };
    if vl >= 0x80 || usize::from(vl) != value.len() {
        return None;
    }
    let key_bytes = buf.get(key_at)?;
    let known_key = dicts.and_then(|d| d.keys.peek(key_bytes));
    let value = match *value {
        [0x0a, sl, ref s @ ..] if sl < 0x80 && usize::from(sl) == s.len() => {
            let known_value = dicts.and_then(|d| d.strs.peek(s));
            let view = |key, value| AttrView {
                key,
                value: Val::Str(value),
            };
            return Some(match (known_key, known_value) {
                (Some(k), Some(v)) => emit(view(Text::Known(k, key_bytes), Text::Known(v, s))),
                (Some(k), None) => emit(view(Text::Known(k, key_bytes), Text::Str(utf8(s)?))),
                (None, Some(v)) => emit(view(Text::Str(utf8(key_bytes)?), Text::Known(v, s))),
                (None, None) => emit(view(Text::Str(utf8(key_bytes)?), Text::Str(utf8(s)?))),
            });
        }
        [0x10, b] if b < 0x80 => Val::Bool(b != 0),
        [0x18, ref v @ ..] => {
            let mut r = Reader::new(v);
            let i = r.varint()?;
            if !r.done() {
                return None;
            }
            Val::Int(i as i64)
        }
        [0x21, ref d @ ..] => Val::Double(f64::from_bits(u64::from_le_bytes(d.try_into().ok()?))),
        [0x3a, bl, ref b @ ..] if bl < 0x80 && usize::from(bl) == b.len() => Val::Bytes(b),
        _ => return None,
    };
    let key = match known_key {
        Some(k) => Text::Known(k, key_bytes),
        None => Text::Str(utf8(key_bytes)?),
    };
    Some(emit(AttrView { key, value }))
}

/// An attribute (a `KeyValue`'s bytes); `dicts` as for [`parse_attr_common`].
fn parse_attr<'a>(buf: &'a [u8], dicts: Option<AttrDicts<'_>>) -> W<AttrView<'a>> {
    match parse_attr_common(buf, dicts) {
        Some(a) => Some(a),
        None => parse_attr_general(buf),
    }
}

/// Parses an attribute onto `out`, inlined into the caller (the span
/// reader): a call returning the view through memory, then copied into
/// the vector, cost more than the parse. Only the straight-line path is
/// inlined.
#[inline(always)]
fn push_attr<'a>(out: &mut Vec<AttrView<'a>>, buf: &'a [u8], dicts: Option<AttrDicts<'_>>) -> W<()> {
    // The pushing closure is forced inline too: called from five places,
    // the compiler kept it out of line (8.8% of the spans profile).
    if attr_common(
        buf,
        dicts,
        #[inline(always)]
        |a| out.push(a),
    )
    .is_none()
    {
        out.push(parse_attr_general(buf)?);
    }
    Some(())
}

/// [`parse_attr`] for any layout.
#[inline(never)]
fn parse_attr_general(buf: &[u8]) -> W<AttrView<'_>> {
    let mut r = Reader::new(buf);
    let mut key = "";
    let mut value: Option<&[u8]> = None;
    let mut plain = true;
    while !r.done() {
        match r.key()? {
            (1, 2) => key = r.str()?,
            (2, 2) => {
                if value.replace(r.bytes()?).is_some() {
                    return None;
                }
            }
            (_, wire) => {
                // key_strindex or unknown fields: let prost build the value.
                plain = false;
                r.skip(wire)?;
            }
        }
    }
    if plain
        && let Some(b) = value
        && let Some(val) = simple_value(b)?
    {
        return Some(AttrView {
            key: Text::Str(key),
            value: val,
        });
    }
    Some(AttrView {
        key: Text::Str(key),
        value: Val::Other(Box::new(KeyValue::decode(buf).ok()?)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mira_testkit::corpus::{Cardinality, Corpus};

    /// Dictionaries for parsing traces: all one (empty unless filled).
    fn dicts(d: &DictBuilder) -> TracesDicts<'_> {
        let a = AttrDicts { keys: d, strs: d };
        TracesDicts {
            name: d,
            ev_name: d,
            attrs: a,
            ev_attrs: a,
            ln_attrs: a,
        }
    }

    #[test]
    fn exporter_shaped_requests_take_the_fast_path() {
        for card in [Cardinality::Low, Cardinality::High] {
            let req = Corpus::new(5, card).logs(2000);
            match parse_logs(&req.encode_to_vec()) {
                Fast::Done(v) => assert_eq!(v.records.len(), 2000),
                Fast::Fallback => panic!("corpus request fell back to prost"),
            }
        }
    }

    #[test]
    fn exporter_shaped_spans_and_points_take_the_fast_path() {
        for card in [Cardinality::Low, Cardinality::High] {
            let mut corpus = Corpus::new(5, card);
            let d = DictBuilder::default();
            match parse_traces(
                &corpus.traces(2000).encode_to_vec(),
                &mut TracesScratch::default(),
                dicts(&d),
            ) {
                Fast::Done(v) => assert_eq!(v.spans.len(), 2000),
                Fast::Fallback => panic!("corpus trace request fell back to prost"),
            }
            match parse_metrics(&corpus.metrics(2000).encode_to_vec(), &mut MetricsScratch::default()) {
                Fast::Done(v) => assert_eq!(v.points.len(), 2000),
                Fast::Fallback => panic!("corpus metrics request fell back to prost"),
            }
        }
    }

    /// The fast check answers as `std::str::from_utf8` for every byte
    /// value at every place of strings around its word lengths, and for
    /// every multi-byte character cut at every place.
    #[test]
    fn utf8_answers_as_std() {
        for n in 0..=66usize {
            for at in 0..n {
                for byte in 0..=255u8 {
                    let mut b = vec![b'a'; n];
                    b[at] = byte;
                    assert_eq!(utf8(&b), std::str::from_utf8(&b).ok(), "{b:?}");
                }
                for ch in ["é", "€", "😀"] {
                    let mut b = vec![b'a'; n];
                    b.splice(at..at, ch.bytes());
                    for cut in 0..=b.len() {
                        assert_eq!(
                            utf8(&b[..cut]),
                            std::str::from_utf8(&b[..cut]).ok(),
                            "{b:?} cut at {cut}"
                        );
                    }
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 128, ..Default::default() })]

        #[test]
        fn utf8_answers_as_std_for_any_bytes(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            proptest::prop_assert_eq!(utf8(&b), std::str::from_utf8(&b).ok());
        }

        /// Every request prost encodes is read by the wire readers (so the
        /// differential tests in tests/wire.rs compare the two paths, not
        /// prost with itself).
        #[test]
        fn prost_encoded_requests_take_the_fast_path(
            t in mira_testkit::arb::traces_request(),
            m in mira_testkit::arb::metrics_request(),
        ) {
            let d = DictBuilder::default();
            proptest::prop_assert!(matches!(parse_traces(&t.encode_to_vec(), &mut TracesScratch::default(), dicts(&d)), Fast::Done(_)));
            proptest::prop_assert!(matches!(parse_metrics(&m.encode_to_vec(), &mut MetricsScratch::default()), Fast::Done(_)));
        }
    }

    #[test]
    fn the_straight_line_attribute_reader_takes_exporter_shapes_only() {
        let string = [0x0a, 0x01, b'k', 0x12, 0x03, 0x0a, 0x01, b'v'];
        let a = parse_attr_common(&string, None).expect("common layout");
        assert!(matches!(a.key, Text::Str("k")));
        assert!(matches!(a.value, Val::Str(Text::Str("v"))));
        let int = [0x0a, 0x01, b'k', 0x12, 0x03, 0x18, 0xb8, 0x2a];
        assert!(matches!(
            parse_attr_common(&int, None).map(|a| a.value),
            Some(Val::Int(5432))
        ));
        // Value before key, a 128-byte key, an empty value: the general path.
        let swapped = [0x12, 0x03, 0x0a, 0x01, b'v', 0x0a, 0x01, b'k'];
        assert!(parse_attr_common(&swapped, None).is_none());
        assert!(matches!(
            parse_attr(&swapped, None).map(|a| a.key),
            Some(Text::Str("k"))
        ));
        let mut long = vec![0x0a, 0x80, 0x01];
        long.extend([b'k'; 128]);
        long.extend([0x12, 0x03, 0x0a, 0x01, b'v']);
        assert!(parse_attr_common(&long, None).is_none());
        assert!(matches!(
            parse_attr(&long, None).map(|a| a.value),
            Some(Val::Str(Text::Str("v")))
        ));
        assert!(parse_attr_common(&[0x0a, 0x01, b'k', 0x12, 0x00], None).is_none());
        // Invalid UTF-8 is refused on both paths.
        let bad = [0x0a, 0x01, 0xff, 0x12, 0x03, 0x0a, 0x01, b'v'];
        assert!(parse_attr_common(&bad, None).is_none());
        assert!(parse_attr(&bad, None).is_none());
    }

    #[test]
    fn strings_the_dictionaries_hold_are_parsed_as_their_keys() {
        let (mut keys, mut strs) = (DictBuilder::default(), DictBuilder::default());
        keys.append("k");
        strs.append("x");
        strs.append("v");
        let d = Some(AttrDicts {
            keys: &keys,
            strs: &strs,
        });
        let string = [0x0a, 0x01, b'k', 0x12, 0x03, 0x0a, 0x01, b'v'];
        let a = parse_attr(&string, d).expect("common layout");
        assert!(matches!(a.key, Text::Known(0, b"k")));
        assert!(matches!(a.value, Val::Str(Text::Known(1, b"v"))));
        // One side known, the other checked text.
        let other = [0x0a, 0x01, b'j', 0x12, 0x03, 0x0a, 0x01, b'v'];
        let a = parse_attr(&other, d).expect("common layout");
        assert!(matches!(
            (a.key, a.value),
            (Text::Str("j"), Val::Str(Text::Known(1, _)))
        ));
        let int = [0x0a, 0x01, b'k', 0x12, 0x02, 0x18, 0x05];
        let a = parse_attr(&int, d).expect("common layout");
        assert!(matches!((a.key, a.value), (Text::Known(0, _), Val::Int(5))));
        // Unknown and invalid UTF-8 is still refused.
        let bad = [0x0a, 0x01, b'k', 0x12, 0x03, 0x0a, 0x01, 0xff];
        assert!(parse_attr(&bad, d).is_none());
        // The dictionaries are only read.
        assert_eq!((keys.len(), strs.len()), (1, 2));
        assert!(matches!(text(b"q", Some(&keys)), Some(Text::Str("q"))));
        assert!(matches!(text(b"k", Some(&keys)), Some(Text::Known(0, _))));
    }

    #[test]
    fn recycled_views_keep_their_allocation() {
        let buf = b"abcdef".to_vec();
        let mut v: Vec<AttrView<'_>> = Vec::with_capacity(100);
        v.push(AttrView {
            key: Text::Str(std::str::from_utf8(&buf[..3]).unwrap_or_default()),
            value: Val::Int(1),
        });
        let kept: Vec<AttrView<'static>> = recycle(v);
        assert!(kept.is_empty());
        assert!(kept.capacity() >= 100);
    }

    #[test]
    fn a_scratch_serves_request_after_request() {
        let mut corpus = Corpus::new(7, Cardinality::Low);
        let mut scratch = TracesScratch::default();
        let d = DictBuilder::default();
        for n in [500, 50, 900] {
            match parse_traces(&corpus.traces(n).encode_to_vec(), &mut scratch, dicts(&d)) {
                Fast::Done(v) => {
                    assert_eq!(v.spans.len(), n);
                    scratch.keep(v);
                }
                Fast::Fallback => panic!("corpus trace request fell back to prost"),
            }
        }
        let mut scratch = MetricsScratch::default();
        for n in [500, 50, 900] {
            match parse_metrics(&corpus.metrics(n).encode_to_vec(), &mut scratch) {
                Fast::Done(v) => {
                    assert_eq!(v.points.len(), n);
                    scratch.keep(v);
                }
                Fast::Fallback => panic!("corpus metrics request fell back to prost"),
            }
        }
    }

    #[test]
    fn unusual_shapes_fall_back() {
        // A record whose body appears twice: protobuf merges, we defer.
        let mut rec = Vec::new();
        for _ in 0..2 {
            rec.extend_from_slice(&[0x2a, 0x03, 0x0a, 0x01, b'x']); // body = AnyValue{string "x"}
        }
        let mut scope = vec![0x12, rec.len() as u8];
        scope.extend_from_slice(&rec);
        let mut res = vec![0x12, scope.len() as u8];
        res.extend_from_slice(&scope);
        let mut req = vec![0x0a, res.len() as u8];
        req.extend_from_slice(&res);
        assert!(matches!(parse_logs(&req), Fast::Fallback));
        // Truncated input.
        assert!(matches!(parse_logs(&req[..req.len() - 1]), Fast::Fallback));
        // A group wire type.
        assert!(matches!(parse_logs(&[0x0b]), Fast::Fallback));
    }
}
