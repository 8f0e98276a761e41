//! Loki push (`POST /loki/api/v1/push`): `logproto.PushRequest` protobuf
//! (snappy, what every agent sends; read with Mira's wire reader) or
//! Loki's JSON (`{"streams":[{"stream":{…},"values":[[ns, line, {…}]]}]}`),
//! written as one OTLP logs export request ([`crate::pbwrite`]) that then
//! takes the OTLP path: the same limits, WAL and acknowledgement.
//!
//! Each stream is one resource whose attributes are its labels mapped back
//! through Mira's Loki label model (`service_name` → `service.name` and
//! the other stream labels of [`LOKI_INDEX`]; any other label keeps its
//! name), so LogQL reads a pushed line with the labels Loki shows. As
//! Loki 3 does, a stream without `service_name` takes it from the first
//! label of [`DISCOVER_SERVICE_NAME`] it has. An entry is a log record:
//! its time, its line as a string body, its structured metadata as
//! attributes.
//!
//! Loki's rules, with Loki's messages: a stream needs a label; label
//! names are `[a-zA-Z_][a-zA-Z0-9_]*` and not repeated; at most
//! [`Rules::max_label_names`] labels; lines up to
//! [`Rules::max_line_bytes`] (per tenant, from the limits file; Loki's
//! defaults otherwise); times inside the accepted window. A stream that
//! breaks a label rule is refused whole, an entry that breaks a line or
//! time rule alone; the rest
//! is written and the answer is 400 with the first reason, as Loki answers.

use std::borrow::Cow;
use std::ops::Range;

use mira_core::convert::logs::LOKI_INDEX;
use mira_core::convert::{TimeWindow, WireReader as Reader};

use crate::pbwrite::{Writer, kv_str_len};
use crate::records::{Census, Meter, ReadError};

/// Loki's `validation.discover-service-name` default: the labels a stream
/// without `service_name` takes it from, first found first.
pub const DISCOVER_SERVICE_NAME: [&str; 13] = [
    "service",
    "app",
    "application",
    "app_name",
    "name",
    "app_kubernetes_io_name",
    "container",
    "container_name",
    "k8s_container_name",
    "component",
    "workload",
    "job",
    "k8s_job_name",
];

/// A tenant's stream and line rules (`loki_max_label_names_per_series`,
/// `loki_max_line_size` in the limits file); 0 is no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    pub max_label_names: u64,
    pub max_line_bytes: u64,
}

/// Loki's defaults.
impl Default for Rules {
    fn default() -> Rules {
        Rules::of(&mira_common::limits::TenantLimits::default())
    }
}

impl Rules {
    /// The rules of a tenant's limits.
    pub fn of(l: &mira_common::limits::TenantLimits) -> Rules {
        Rules {
            max_label_names: l.loki_max_label_names,
            max_line_bytes: l.loki_max_line_bytes,
        }
    }

    fn too_many_labels(&self, n: usize) -> bool {
        self.max_label_names > 0 && n as u64 > self.max_label_names
    }

    fn too_long(&self, n: usize) -> bool {
        self.max_line_bytes > 0 && n as u64 > self.max_line_bytes
    }
}

type Text<'a> = Cow<'a, str>;

#[derive(Debug)]
struct Stream<'a> {
    /// Sorted by name.
    labels: Vec<(Text<'a>, Text<'a>)>,
    /// As sent, for messages.
    text: Text<'a>,
    entries: Range<usize>,
}

#[derive(Debug)]
struct Entry<'a> {
    /// Unix nanoseconds; negative is before 1970.
    ts: i128,
    line: Text<'a>,
    meta: Range<usize>,
}

/// A push request read.
#[derive(Debug)]
pub struct Parsed<'a> {
    streams: Vec<Stream<'a>>,
    entries: Vec<Entry<'a>>,
    meta: Vec<(Text<'a>, Text<'a>)>,
    /// Entries refused, and the first reason.
    pub refused: u64,
    pub first: Option<String>,
    wire_bytes: usize,
    /// The views' memory, against what the receiver reserved for them.
    meter: Meter,
    rules: Rules,
}

fn is_label_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Parses a Prometheus label set, `{a="b", c="d"}`, its values in Go's
/// string escapes; sorted by name. Refuses duplicate names.
pub fn parse_labels(s: &str) -> Result<Vec<(Text<'_>, Text<'_>)>, String> {
    let bad = |why: &str| {
        format!(
            "error parsing labels '{}': {why}",
            s.chars().take(200).collect::<String>()
        )
    };
    let t = s.trim();
    let inner = t
        .strip_prefix('{')
        .and_then(|x| x.strip_suffix('}'))
        .ok_or_else(|| bad("a label set is written {name=\"value\", …}"))?;
    let mut out: Vec<(Text<'_>, Text<'_>)> = Vec::new();
    let mut rest = inner.trim_start();
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let name = &rest[..end];
        if !is_label_name(name) {
            return Err(bad(&format!(
                "invalid label name {:?}",
                name.chars().take(100).collect::<String>()
            )));
        }
        rest = rest[end..].trim_start();
        rest = rest
            .strip_prefix('=')
            .ok_or_else(|| bad("expected = after a label name"))?
            .trim_start();
        let (value, after) = quoted(rest).ok_or_else(|| bad("a label value is a double-quoted string"))?;
        out.push((Cow::Borrowed(name), value));
        rest = after.trim_start();
        if let Some(r) = rest.strip_prefix(',') {
            rest = r.trim_start();
        } else if !rest.is_empty() {
            return Err(bad("expected , between labels"));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// A double-quoted Go string at the start of `s`: (value, rest).
fn quoted(s: &str) -> Option<(Text<'_>, &str)> {
    let body = s.strip_prefix('"')?;
    let mut owned: Option<String> = None;
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => {
                let v = match owned {
                    Some(o) => Cow::Owned(o),
                    None => Cow::Borrowed(&body[..i]),
                };
                return Some((v, &body[i + 1..]));
            }
            '\\' => {
                let o = owned.get_or_insert_with(|| body[..i].to_owned());
                let (_, e) = chars.next()?;
                match e {
                    'n' => o.push('\n'),
                    't' => o.push('\t'),
                    'r' => o.push('\r'),
                    '\\' => o.push('\\'),
                    '"' => o.push('"'),
                    '\'' => o.push('\''),
                    'u' => {
                        let hex: String = (0..4).filter_map(|_| chars.next().map(|(_, c)| c)).collect();
                        o.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                    }
                    _ => return None,
                }
            }
            c => {
                if let Some(o) = owned.as_mut() {
                    o.push(c);
                }
            }
        }
    }
    None
}

fn malformed(at: usize) -> String {
    format!("malformed Loki push request: a truncated or invalid protobuf field at byte {at}")
}

/// A `google.protobuf.Timestamp` as Unix nanoseconds.
fn timestamp(buf: &[u8]) -> Option<i128> {
    let mut r = Reader::new(buf);
    let (mut s, mut n) = (0i64, 0i32);
    while !r.done() {
        match r.key()? {
            (1, 0) => s = r.varint()? as i64,
            (2, 0) => n = r.varint()? as i32,
            (_, w) => r.skip(w)?,
        }
    }
    Some(i128::from(s) * 1_000_000_000 + i128::from(n))
}

impl<'a> Parsed<'a> {
    fn new(wire_bytes: usize, meter: Meter, rules: Rules) -> Parsed<'a> {
        Parsed {
            rules,
            streams: Vec::new(),
            entries: Vec::new(),
            meta: Vec::new(),
            refused: 0,
            first: None,
            wire_bytes,
            meter,
        }
    }

    fn refuse(&mut self, n: u64, reason: impl FnOnce() -> String) {
        self.refused += n;
        if self.first.is_none() {
            self.first = Some(reason());
        }
    }

    /// The 400 message when anything was refused.
    pub fn message(&self) -> Option<String> {
        let first = self.first.as_ref()?;
        Some(format!(
            "{first} ({} entries of the request were refused; the rest was written)",
            self.refused
        ))
    }

    /// Entries kept.
    pub fn entries(&self) -> usize {
        self.streams.iter().map(|s| s.entries.len()).sum()
    }

    /// Reads a decompressed `logproto.PushRequest`, its views within
    /// `meter`, under `rules`.
    pub fn protobuf_within(buf: &'a [u8], meter: Meter, rules: Rules) -> Result<Parsed<'a>, ReadError> {
        let mut p = Parsed::new(buf.len(), meter, rules);
        let mut r = Reader::new(buf);
        while !r.done() {
            let at = r.pos();
            match r.key().ok_or_else(|| malformed(at))? {
                (1, 2) => {
                    let s = r.bytes().ok_or_else(|| malformed(at))?;
                    p.stream_protobuf(s, at)?;
                }
                (_, w) => r.skip(w).ok_or_else(|| malformed(at))?,
            }
        }
        Ok(p)
    }

    /// [`Parsed::protobuf_within`] without a memory bound, under Loki's
    /// defaults (tests, fuzzing).
    pub fn protobuf(buf: &'a [u8]) -> Result<Parsed<'a>, String> {
        Parsed::protobuf_within(buf, Meter::unlimited(), Rules::default()).map_err(|e| e.to_string())
    }

    fn stream_protobuf(&mut self, buf: &'a [u8], at: usize) -> Result<(), ReadError> {
        let e0 = self.entries.len();
        let m0 = self.meta.len();
        let mut labels_text: &'a str = "";
        let mut r = Reader::new(buf);
        let bad = || malformed(at);
        while !r.done() {
            match r.key().ok_or_else(bad)? {
                (1, 2) => labels_text = r.str().ok_or_else(bad)?,
                (2, 2) => {
                    let mut er = Reader::new(r.bytes().ok_or_else(bad)?);
                    let (mut ts, mut line) = (0i128, "");
                    let mm = self.meta.len();
                    while !er.done() {
                        match er.key().ok_or_else(bad)? {
                            (1, 2) => ts = timestamp(er.bytes().ok_or_else(bad)?).ok_or_else(bad)?,
                            (2, 2) => line = er.str().ok_or_else(bad)?,
                            (3, 2) => {
                                let mut lr = Reader::new(er.bytes().ok_or_else(bad)?);
                                let (mut name, mut value) = ("", "");
                                while !lr.done() {
                                    match lr.key().ok_or_else(bad)? {
                                        (1, 2) => name = lr.str().ok_or_else(bad)?,
                                        (2, 2) => value = lr.str().ok_or_else(bad)?,
                                        (_, w) => lr.skip(w).ok_or_else(bad)?,
                                    }
                                }
                                self.meter.take::<(Text<'a>, Text<'a>)>(1)?;
                                self.meta.push((Cow::Borrowed(name), Cow::Borrowed(value)));
                            }
                            (_, w) => er.skip(w).ok_or_else(bad)?,
                        }
                    }
                    self.meter.take::<Entry<'a>>(1)?;
                    self.entries.push(Entry {
                        ts,
                        line: Cow::Borrowed(line),
                        meta: mm..self.meta.len(),
                    });
                }
                (_, w) => r.skip(w).ok_or_else(bad)?,
            }
        }
        // At most one label per `=` in the text, and the stream itself.
        let most = labels_text.bytes().filter(|b| *b == b'=').count();
        self.meter.take::<(Text<'a>, Text<'a>)>(most)?;
        self.meter.take::<Stream<'a>>(1)?;
        let labels = match parse_labels(labels_text) {
            Ok(l) => l,
            Err(reason) => {
                let n = (self.entries.len() - e0) as u64;
                self.refuse(n, || reason);
                self.entries.truncate(e0);
                self.meta.truncate(m0);
                return Ok(());
            }
        };
        self.add_stream(labels, Cow::Borrowed(labels_text), e0);
        Ok(())
    }

    /// Reads Loki's JSON push body under Loki's defaults.
    pub fn json(buf: &'a [u8]) -> Result<Parsed<'a>, String> {
        Parsed::json_under(buf, Rules::default())
    }

    /// Reads Loki's JSON push body under `rules`.
    pub fn json_under(buf: &'a [u8], rules: Rules) -> Result<Parsed<'a>, String> {
        #[derive(serde::Deserialize)]
        struct Push<'a> {
            #[serde(borrow, default)]
            streams: Vec<JStream<'a>>,
        }
        #[derive(serde::Deserialize)]
        struct JStream<'a> {
            #[serde(borrow, default)]
            stream: Pairs<'a>,
            #[serde(borrow, default)]
            values: Vec<JEntry<'a>>,
        }
        #[derive(serde::Deserialize)]
        struct JEntry<'a>(
            #[serde(borrow)] Text<'a>,
            #[serde(borrow)] Text<'a>,
            #[serde(borrow, default)] Option<Pairs<'a>>,
        );
        let push: Push<'a> = serde_json::from_slice(buf).map_err(|e| format!("invalid Loki push JSON: {e}"))?;
        // Bounded before serde built it (the receiver's JSON estimate).
        let mut p = Parsed::new(buf.len(), Meter::unlimited(), rules);
        for s in push.streams {
            let e0 = p.entries.len();
            let mut labels = s.stream.0;
            labels.sort_by(|a, b| a.0.cmp(&b.0));
            let text: String = {
                let mut t = String::from("{");
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        t.push_str(", ");
                    }
                    t.push_str(&format!("{k}={v:?}"));
                }
                t.push('}');
                t
            };
            let mut bad_label = None;
            for (k, _) in &labels {
                if !is_label_name(k) {
                    bad_label = Some(format!(
                        "error parsing labels '{text}': invalid label name {:?}",
                        k.chars().take(100).collect::<String>()
                    ));
                    break;
                }
            }
            for JEntry(ts, line, meta) in s.values {
                let Ok(ts) = ts.trim().parse::<i128>() else {
                    p.refuse(1, || {
                        format!("invalid Loki push JSON: timestamp {ts:?} is not Unix nanoseconds")
                    });
                    continue;
                };
                let m0 = p.meta.len();
                p.meta.extend(meta.map(|m| m.0).unwrap_or_default());
                p.entries.push(Entry {
                    ts,
                    line,
                    meta: m0..p.meta.len(),
                });
            }
            if let Some(reason) = bad_label {
                let n = (p.entries.len() - e0) as u64;
                p.refuse(n, || reason);
                p.entries.truncate(e0);
                continue;
            }
            p.add_stream(labels, Cow::Owned(text), e0);
        }
        Ok(p)
    }

    /// Applies the stream rules to labels whose entries start at `e0`.
    fn add_stream(&mut self, labels: Vec<(Text<'a>, Text<'a>)>, text: Text<'a>, e0: usize) {
        let n = (self.entries.len() - e0) as u64;
        let reason = if labels.is_empty() {
            Some("error at least one label pair is required per stream".to_owned())
        } else if let Some(w) = labels.windows(2).find(|w| w[0].0 == w[1].0) {
            Some(format!("stream '{text}' has duplicate label name: '{}'", w[0].0))
        } else if self.rules.too_many_labels(labels.len()) {
            Some(format!(
                "stream '{text}' has {} label names; limit {}",
                labels.len(),
                self.rules.max_label_names
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            self.refuse(n, || reason);
            self.entries.truncate(e0);
            return;
        }
        // Empty values are no label (Loki drops them).
        let labels: Vec<_> = labels.into_iter().filter(|(_, v)| !v.is_empty()).collect();
        self.streams.push(Stream {
            labels,
            text,
            entries: e0..self.entries.len(),
        });
    }

    /// What the OTLP request will hold, for the receivers' memory bound.
    pub fn census(&self) -> Census {
        let labels: u64 = self.streams.iter().map(|s| s.labels.len() as u64 + 1).sum();
        let label_bytes: usize = self
            .streams
            .iter()
            .map(|s| s.labels.iter().map(|(k, v)| kv_str_len(k, v) + 24).sum::<usize>() + 16)
            .sum();
        Census {
            records: self.entries.len() as u64,
            attributes: labels + self.meta.len() as u64,
            others: self.streams.len() as u64,
            buckets: 0,
            bytes: (self.wire_bytes + label_bytes + self.entries.len() * 64 + self.meta.len() * 16) as u64,
        }
    }

    /// The OTLP logs export request of the entries kept, without those
    /// refused for their line or time, and how many it holds.
    pub fn write(&mut self, window: TimeWindow) -> (Vec<u8>, u64) {
        let mut w = Writer::with_capacity(self.census().bytes as usize);
        let mut written = 0;
        let streams = std::mem::take(&mut self.streams);
        for s in &streams {
            let mut open = false;
            for e in s.entries.clone() {
                let entry = &self.entries[e];
                if self.rules.too_long(entry.line.len()) {
                    let (len, text, max) = (entry.line.len(), &s.text, self.rules.max_line_bytes);
                    self.refuse(1, || {
                        format!(
                            "Max entry size '{max}' bytes exceeded for stream '{text}' while adding an entry with length '{len}' bytes"
                        )
                    });
                    continue;
                }
                let ts = entry.ts;
                let ns = match u64::try_from(ts) {
                    Ok(ns) if ns >= window.min_ns && ns <= window.max_ns => ns,
                    Ok(ns) if ns > window.max_ns => {
                        let text = &s.text;
                        self.refuse(1, || {
                            format!("entry for stream '{text}' has timestamp too new: {}", rfc3339(ts))
                        });
                        continue;
                    }
                    _ => {
                        let text = &s.text;
                        self.refuse(1, || {
                            format!(
                                "entry for stream '{text}' has timestamp too old: {}, oldest acceptable timestamp is: {}",
                                rfc3339(ts),
                                rfc3339(i128::from(window.min_ns))
                            )
                        });
                        continue;
                    }
                };
                let entry = &self.entries[e];
                if !open {
                    open = true;
                    w.begin(1); // ResourceLogs
                    w.begin(1); // Resource
                    write_resource(&mut w, &s.labels);
                    w.end();
                    w.begin(2); // ScopeLogs
                }
                w.begin(2); // LogRecord
                w.fixed64(1, ns);
                w.begin(5);
                w.string(1, &entry.line);
                w.end();
                let meta = &self.meta[entry.meta.clone()];
                for (k, v) in meta {
                    w.kv_str(6, k, v);
                }
                if !meta.iter().any(|(k, _)| k == "detected_level")
                    && let Some(level) = detected_level(&s.labels, meta, &entry.line)
                {
                    w.kv_str(6, "detected_level", level);
                }
                w.end();
                written += 1;
            }
            if open {
                w.end();
                w.end();
            }
        }
        self.streams = streams;
        (w.finish(), written)
    }
}

/// The level fields Loki reads a level from (stream labels first, then
/// structured metadata).
const LEVEL_FIELDS: [&str; 9] = [
    "level", "LEVEL", "Level", "severity", "SEVERITY", "Severity", "lvl", "LVL", "Lvl",
];

/// A level's name as `detected_level` writes it.
fn normal_level(v: &str) -> Option<&'static str> {
    Some(match v.trim().to_ascii_lowercase().as_str() {
        "trace" | "trc" => "trace",
        "debug" | "dbg" | "dbug" => "debug",
        "info" | "inf" | "information" | "informational" | "notice" => "info",
        "warn" | "wrn" | "warning" => "warn",
        "error" | "err" | "eror" => "error",
        "critical" | "crit" => "critical",
        "fatal" | "emerg" | "emergency" | "alert" | "panic" => "fatal",
        _ => return None,
    })
}

/// `detected_level` as Loki 3 stores it with a pushed entry: from a level
/// label or metadata field, else the first level word standing alone in
/// the line (`trace`, `debug`, `fatal`, `critical`, `error`, `err`,
/// `warning`, `warn`, `info`, in that order, any case). None when there is
/// none (the label model then says `unknown`, as Loki does).
fn detected_level(labels: &[(Text<'_>, Text<'_>)], meta: &[(Text<'_>, Text<'_>)], line: &str) -> Option<&'static str> {
    for f in LEVEL_FIELDS {
        if let Some((_, v)) = labels.iter().chain(meta).find(|(k, _)| k == f) {
            return normal_level(v);
        }
    }
    let lower = line.to_ascii_lowercase();
    let bounded = |word: &str| {
        let Some(pos) = lower.find(word) else { return false };
        let boundary = |i: Option<u8>| i.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80));
        boundary(pos.checked_sub(1).map(|i| lower.as_bytes()[i]))
            && boundary(lower.as_bytes().get(pos + word.len()).copied())
    };
    [
        ("trace", "trace"),
        ("debug", "debug"),
        ("fatal", "fatal"),
        ("critical", "critical"),
        ("error", "error"),
        ("err", "error"),
        ("warning", "warn"),
        ("warn", "warn"),
        ("info", "info"),
    ]
    .into_iter()
    .find(|(word, _)| bounded(word))
    .map(|(_, level)| level)
}

/// A stream's labels as resource attributes.
fn write_resource(w: &mut Writer, labels: &[(Text<'_>, Text<'_>)]) {
    let mut has_service = false;
    for (k, v) in labels {
        let key = LOKI_INDEX
            .iter()
            .find(|(l, _)| *l == k.as_ref())
            .map_or(k.as_ref(), |(_, key)| *key);
        has_service |= key == "service.name";
        w.kv_str(1, key, v);
    }
    if !has_service {
        let found = DISCOVER_SERVICE_NAME
            .iter()
            .find_map(|d| labels.iter().find(|(k, _)| k == d).map(|(_, v)| v));
        if let Some(v) = found {
            w.kv_str(1, "service.name", v);
        }
    }
}

/// Unix nanoseconds in RFC 3339 (UTC), as Loki writes times in messages.
fn rfc3339(ns: i128) -> String {
    let secs = ns.div_euclid(1_000_000_000) as i64;
    let nanos = ns.rem_euclid(1_000_000_000) as u32;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let frac = if nanos == 0 {
        String::new()
    } else {
        format!(".{nanos:09}").trim_end_matches('0').to_owned()
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{frac}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A JSON object of strings (`{"k": "v"}`) as (key, value) pairs in
/// their order, borrowed from the body where they hold no escapes.
#[derive(Debug, Default)]
struct Pairs<'a>(Vec<(Text<'a>, Text<'a>)>);

#[derive(serde::Deserialize)]
struct Borrowed<'a>(#[serde(borrow)] Text<'a>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Pairs<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Pairs<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of string values")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, mut m: M) -> Result<Pairs<'a>, M::Error> {
                let mut out = Vec::new();
                while let Some((Borrowed(k), Borrowed(v))) = m.next_entry::<Borrowed<'a>, Borrowed<'a>>()? {
                    out.push((k, v));
                }
                Ok(Pairs(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// Streams by their labels, to tell the tests which resource a stream got.
#[cfg(test)]
fn resources_of(otlp: &[u8]) -> std::collections::HashMap<String, Vec<(String, String)>> {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use prost::Message;
    let req = ExportLogsServiceRequest::decode(otlp).expect("decodes");
    let mut out = std::collections::HashMap::new();
    for rl in req.resource_logs {
        let attrs: Vec<(String, String)> = rl
            .resource
            .unwrap_or_default()
            .attributes
            .into_iter()
            .map(|kv| {
                let v = match kv.value.and_then(|v| v.value) {
                    Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => s,
                    _ => String::new(),
                };
                (kv.key, v)
            })
            .collect();
        for sl in rl.scope_logs {
            for r in sl.log_records {
                if let Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(line)) =
                    r.body.and_then(|b| b.value)
                {
                    out.insert(line, attrs.clone());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
