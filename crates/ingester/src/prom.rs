//! Prometheus remote write, 1.0 (`prometheus.WriteRequest`) and 2.0
//! (`io.prometheus.write.v2.Request`, chosen by `Content-Type`), read with
//! Mira's protobuf wire reader ([`mira_core::convert::WireReader`]) and
//! written as one OTLP metrics export request ([`crate::pbwrite`]), which
//! then takes the OTLP path: the same limits, WAL and acknowledgement.
//!
//! The mapping (docs/api.md, "Prometheus remote write"), as the OTel
//! Prometheus compatibility specification maps a scrape:
//! - each Prometheus series is one OTLP metric of its `__name__`, kept
//!   as it is: its points' attributes are its other labels, except `job`
//!   and `instance`, which make its resource (`service.namespace` /
//!   `service.name` from `job` split at its first `/`, and
//!   `service.instance.id`), marked [`SOURCE_ATTR`] =
//!   [`SOURCE_REMOTE_WRITE`] so that PromQL shows such a resource as
//!   exactly `job` and `instance` and the metric under its own name;
//! - the metadata's type makes a counter (and a histogram's or summary's
//!   `_bucket`, `_sum` and `_count`) a cumulative monotonic sum, anything
//!   else a gauge; its help and unit are the metric's description and
//!   unit; `target_info` stays a series;
//! - a 2.0 created timestamp is the points' start time;
//! - a native histogram is an exponential histogram (schemas -4 to 8) or
//!   an explicit-bucket one (custom buckets, schema -53);
//! - exemplars go with the point of their series and time in the same
//!   request, or else with a point that holds no value
//!   (`FLAG_NO_RECORDED_VALUE`, which PromQL never reads as a sample).
//!
//! A series that breaks the rules (an empty label name, label names out of
//! order or repeated, no metric name) is refused whole, as are samples
//! outside the accepted time window and a second, different value at the
//! same time; the rest of the request is written and the answer is 400
//! naming the first refusal, as Mimir answers. A request that is not
//! valid protobuf, or a 2.0 symbol reference out of range, is refused
//! whole.

use std::collections::HashMap;
use std::ops::Range;

use mira_core::convert::{TimeWindow, WireReader as Reader, utf8};
use mira_core::ids::TenantId;

use crate::pbwrite::{Writer, kv_str_len};
use crate::records::{Census, Meter, ReadError};

/// The resource attribute that marks a remote-written resource.
pub use mira_core::convert::metrics::{SOURCE_ATTR, SOURCE_REMOTE_WRITE};

/// Prometheus' staleness marker, a NaN with this bit pattern.
pub const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;

/// OTLP's `DataPointFlags.FLAG_NO_RECORDED_VALUE`.
const NO_RECORDED_VALUE: u64 = 1;

/// Most buckets a native histogram may span, first to last (Prometheus
/// limits a histogram to 160 populated buckets by default).
pub const MAX_HISTOGRAM_SPAN: usize = 4096;

/// The remote-write protocol version of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The version a `Content-Type` asks for, or why it is refused (415):
/// `application/x-protobuf` with `proto=prometheus.WriteRequest` (or
/// none, 1.0) or `proto=io.prometheus.write.v2.Request`.
pub fn version_of(content_type: Option<&str>) -> Result<Version, String> {
    let Some(ct) = content_type.map(str::trim).filter(|c| !c.is_empty()) else {
        return Ok(Version::V1);
    };
    let mut parts = ct.split(';');
    let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    if media != "application/x-protobuf" {
        return Err(format!(
            "unsupported content type {:?}: remote write is application/x-protobuf",
            ct.chars().take(100).collect::<String>()
        ));
    }
    let mut version = Version::V1;
    for p in parts {
        let Some((k, v)) = p.split_once('=') else { continue };
        if k.trim().eq_ignore_ascii_case("proto") {
            version = match v.trim().trim_matches('"') {
                "prometheus.WriteRequest" => Version::V1,
                "io.prometheus.write.v2.Request" => Version::V2,
                other => {
                    return Err(format!(
                        "unsupported remote write message {:?}: use prometheus.WriteRequest or io.prometheus.write.v2.Request",
                        other.chars().take(100).collect::<String>()
                    ));
                }
            };
        }
    }
    Ok(version)
}

/// A metric family's type, as both versions number it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Kind {
    #[default]
    Unknown,
    Counter,
    Gauge,
    Histogram,
    GaugeHistogram,
    Summary,
    Info,
    StateSet,
}

fn kind_of(v: u64) -> Kind {
    match v {
        1 => Kind::Counter,
        2 => Kind::Gauge,
        3 => Kind::Histogram,
        4 => Kind::GaugeHistogram,
        5 => Kind::Summary,
        6 => Kind::Info,
        7 => Kind::StateSet,
        _ => Kind::Unknown,
    }
}

/// Whether two series, by name and (type, help, unit), are points of one
/// OTLP metric. The strings of one family's metadata (1.0) or of one
/// symbol (2.0) are one slice of the request, so equal slices are told
/// without comparing their bytes.
fn same_metric(a: (&str, (Kind, &str, &str)), b: (&str, (Kind, &str, &str))) -> bool {
    fn same(a: &str, b: &str) -> bool {
        (a.as_ptr() == b.as_ptr() && a.len() == b.len()) || a == b
    }
    let ((na, (ka, ha, ua)), (nb, (kb, hb, ub))) = (a, b);
    ka == kb && same(na, nb) && same(ha, hb) && same(ua, ub)
}

/// A map keyed by a request's strings, with a fast seeded hash.
type Fast<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The suffixes Prometheus adds to a family's name for its series.
const FAMILY_SUFFIXES: [&str; 6] = ["_total", "_bucket", "_sum", "_count", "_created", "_info"];

/// `members` (increasing indices) ordered by `name` and, within a name,
/// as they came: a stable sort by name. Series of one name mostly come
/// together (an exporter writes a family's series one after another), so
/// the runs of one name are sorted, each name compared with its
/// neighbour's and the runs' names with each other; when runs are short,
/// each distinct name is compared a few times, not each series' name
/// every time.
fn by_name<'a>(members: &[usize], name: impl Fn(usize) -> &'a str) -> Vec<usize> {
    let mut runs: Vec<(&'a str, usize, usize)> = Vec::new();
    for (j, &i) in members.iter().enumerate() {
        let n = name(i);
        match runs.last_mut() {
            Some(run) if run.0 == n => run.2 = j + 1,
            _ => runs.push((n, j, j + 1)),
        }
    }
    if runs.len() * 4 <= members.len() {
        // Stable: runs of one name keep their order.
        runs.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = Vec::with_capacity(members.len());
        for (_, from, to) in runs {
            out.extend_from_slice(&members[from..to]);
        }
        return out;
    }
    let mut first: Fast<&'a str, u32> = Fast::default();
    let buckets: Vec<u32> = members
        .iter()
        .map(|&i| {
            let n = first.len() as u32;
            *first.entry(name(i)).or_insert(n)
        })
        .collect();
    let mut names: Vec<(&'a str, u32)> = first.into_iter().collect();
    names.sort_unstable();
    let mut rank = vec![0u32; names.len()];
    for (at, (_, bucket)) in names.iter().enumerate() {
        rank[*bucket as usize] = at as u32;
    }
    let mut keyed: Vec<(u32, usize)> = buckets
        .iter()
        .zip(members)
        .map(|(b, &i)| (rank[*b as usize], i))
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, i)| i).collect()
}

/// What `get` holds for a series name: under the name itself, or under
/// the name without a suffix Prometheus adds.
fn family_lookup<T>(name: &str, get: impl Fn(&str) -> Option<T>) -> Option<T> {
    get(name).or_else(|| {
        FAMILY_SUFFIXES
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).and_then(&get))
    })
}

/// Most families [`KindCache`] remembers for one tenant, and for all.
pub const MAX_CACHED_FAMILIES_PER_TENANT: usize = 10_000;
pub const MAX_CACHED_FAMILIES: usize = 100_000;
/// Longest family name it remembers, bytes.
const MAX_CACHED_NAME: usize = 256;

/// Each tenant's metric family types, as remote write 1.0 requests'
/// metadata said them. Prometheus sends 1.0 metadata in requests of its
/// own (every `metadata_config.send_interval`, a minute by default), so a
/// sample's request rarely says its family is a counter: the ingester
/// remembers what earlier requests said, as Mimir keeps metadata apart
/// from samples. Bounded: [`MAX_CACHED_FAMILIES_PER_TENANT`] families of
/// a tenant and [`MAX_CACHED_FAMILIES`] in all, names up to 256 bytes
/// (at most about 30 MB); a family past a bound is not remembered, and its
/// series stay gauges unless their own request types them. Lost on
/// restart, until Prometheus next sends its metadata.
#[derive(Debug, Default)]
pub struct KindCache {
    families: std::sync::Mutex<HashMap<TenantId, HashMap<Box<str>, Kind>>>,
}

/// One series of the request, its parts in the [`Parsed`] arenas.
#[derive(Debug)]
struct Series<'a> {
    /// Into [`Parsed::labels`]: sorted, checked, empty values dropped,
    /// `__name__` included.
    labels: Range<usize>,
    name: &'a str,
    /// The resource's labels (`job`, `instance`).
    job: Option<&'a str>,
    instance: Option<&'a str>,
    /// Into [`Parsed::point_attrs`].
    point_attrs: Range<usize>,
    samples: Range<usize>,
    exemplars: Range<usize>,
    histograms: Range<usize>,
    /// 2.0's own metadata (1.0's is looked up by family).
    kind: Kind,
    help: &'a str,
    unit: &'a str,
    created_ms: i64,
}

#[derive(Debug)]
struct Exemplar {
    /// Into [`Parsed::exemplar_labels`].
    labels: Range<usize>,
    value: f64,
    ts_ms: i64,
}

/// What a request lost to the rules, and why (the first reason).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Refused {
    pub samples: u64,
    pub histograms: u64,
    pub exemplars: u64,
    pub first: Option<String>,
}

impl Refused {
    fn add(&mut self, samples: u64, histograms: u64, exemplars: u64, reason: impl FnOnce() -> String) {
        self.samples += samples;
        self.histograms += histograms;
        self.exemplars += exemplars;
        if self.first.is_none() {
            self.first = Some(reason());
        }
    }

    pub fn any(&self) -> bool {
        self.first.is_some()
    }

    /// The 400 message: the first reason, and how much was refused.
    pub fn message(&self) -> Option<String> {
        let first = self.first.as_ref()?;
        Some(format!(
            "{first} ({} samples, {} histograms and {} exemplars of the request were refused; the rest was written)",
            self.samples, self.histograms, self.exemplars
        ))
    }
}

/// What was written (the `X-Prometheus-Remote-Write-*-Written` headers).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub samples: u64,
    pub histograms: u64,
    pub exemplars: u64,
    /// Data points of exemplars without a sample at their time (no
    /// recorded value): with the samples and histograms, the records the
    /// OTLP request holds.
    pub lone: u64,
}

impl Written {
    /// The data points written: the records as the OTLP census counts them.
    pub fn points(&self) -> u64 {
        self.samples + self.histograms + self.lone
    }
}

/// A request read: borrowed views of its series, checked.
#[derive(Debug)]
pub struct Parsed<'a> {
    labels: Vec<(&'a str, &'a str)>,
    exemplar_labels: Vec<(&'a str, &'a str)>,
    samples: Vec<(i64, f64)>,
    exemplars: Vec<Exemplar>,
    histograms: Vec<&'a [u8]>,
    series: Vec<Series<'a>>,
    /// 1.0: metadata by metric family name: (type, help, unit).
    metadata: Fast<&'a str, (Kind, &'a str, &'a str)>,
    /// Series, samples and exemplars refused while reading.
    pub refused: Refused,
    /// An upper estimate of the OTLP request's size, bytes.
    out_bytes: usize,
    /// Attributes the OTLP request will hold.
    out_attrs: u64,
    /// Each series' point attributes, encoded as a `NumberDataPoint`'s
    /// (field 7) while its labels are at hand, copied into each of its
    /// number points when written.
    point_attrs: Writer,
    /// The views' memory, against what the receiver reserved for them.
    meter: Meter,
}

fn malformed(what: &str, at: usize) -> String {
    format!("malformed remote write request: {what} at byte {at}")
}

/// `{__name__="x", a="b"}` of a label set, cut to 200 characters.
fn describe(labels: &[(&str, &str)]) -> String {
    let mut s = String::from("{");
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(k);
        s.push_str("=\"");
        s.push_str(v);
        s.push('"');
        if s.len() > 200 {
            break;
        }
    }
    let mut s: String = s.chars().take(200).collect();
    s.push('}');
    s
}

/// Why a label set is refused, or its metric name.
fn check_labels<'a>(labels: &[(&'a str, &'a str)]) -> Result<&'a str, String> {
    let mut metric = None;
    for (i, &(name, value)) in labels.iter().enumerate() {
        if name == "__name__" {
            metric = Some(value);
        }
        if name.is_empty() {
            return Err(format!(
                "received a series with an empty label name: {}",
                describe(labels)
            ));
        }
        if i > 0 {
            let prev = labels[i - 1].0;
            // Neighbouring names mostly differ in their first byte: told
            // there, without a call to `memcmp` per label.
            let order = match prev.as_bytes().first().cmp(&name.as_bytes().first()) {
                std::cmp::Ordering::Equal => prev.cmp(name),
                other => other,
            };
            match order {
                std::cmp::Ordering::Equal => {
                    return Err(format!(
                        "received a series with duplicate label name {name:?}: {}",
                        describe(labels)
                    ));
                }
                std::cmp::Ordering::Greater => {
                    return Err(format!(
                        "received a series whose label names are not sorted ({prev:?} before {name:?}): {}",
                        describe(labels)
                    ));
                }
                std::cmp::Ordering::Less => {}
            }
        }
    }
    match metric {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(format!("received a series without a metric name: {}", describe(labels))),
    }
}

/// The label names that are not point attributes (the resource's, and
/// the name).
fn is_point_label(name: &str) -> bool {
    !matches!(name, "__name__" | "job" | "instance")
}

/// Reads packed or unpacked repeated varints of one field occurrence.
fn varints(
    r: &mut Reader<'_>,
    wire: u8,
    mut f: impl FnMut(u64) -> Result<(), ReadError>,
) -> Option<Result<(), ReadError>> {
    match wire {
        0 => Some(f(r.varint()?)),
        2 => {
            let mut inner = Reader::new(r.bytes()?);
            while !inner.done() {
                if let Err(e) = f(inner.varint()?) {
                    return Some(Err(e));
                }
            }
            Some(Ok(()))
        }
        _ => None,
    }
}

/// 2.0 label references resolved, as (name, value) pairs; `what` holds
/// them, for the message when their number is odd.
fn ref_pairs<'a, 'r>(refs: &'r [&'a str], what: &str) -> Result<impl Iterator<Item = (&'a str, &'a str)> + 'r, String> {
    if !refs.len().is_multiple_of(2) {
        return Err(format!(
            "invalid remote write 2.0 request: {what} has an odd number ({}) of label references",
            refs.len()
        ));
    }
    Ok(refs.chunks(2).map(|c| (c[0], c[1])))
}

/// The series, labels and samples of a 1.0 request, by its keys and
/// lengths; `None` when it does not parse (the reading says why).
fn count_v1(buf: &[u8]) -> Option<(usize, usize, usize)> {
    let (mut series, mut labels, mut samples) = (0, 0, 0);
    let mut r = Reader::new(buf);
    while !r.done() {
        match r.key()? {
            (1, 2) => {
                series += 1;
                let mut t = Reader::new(r.bytes()?);
                while !t.done() {
                    match t.key()? {
                        (1, 2) => {
                            labels += 1;
                            t.bytes()?;
                        }
                        (2, 2) => {
                            samples += 1;
                            t.bytes()?;
                        }
                        (_, w) => t.skip(w)?,
                    }
                }
            }
            (_, w) => r.skip(w)?,
        }
    }
    Some((series, labels, samples))
}

/// Reads a 1.0 `Label` onto `out`. Inlined into the series loop and
/// pushing the pair itself, so that it goes from registers to the vector
/// (returned as an `Option` through memory, it was stored a word at a
/// time and loaded back two words at once: a stall per label).
#[inline(always)]
fn push_label<'a>(out: &mut Vec<(&'a str, &'a str)>, buf: &'a [u8]) -> Option<()> {
    // The shape every encoder writes, name then value, each shorter
    // than 128 bytes, read without the general loop.
    if let [0x0a, nl, ref rest @ ..] = *buf
        && nl < 0x80
        && let Some((name, rest)) = rest.split_at_checked(usize::from(nl))
        && let [0x12, vl, ref value @ ..] = *rest
        && vl < 0x80
        && usize::from(vl) == value.len()
    {
        out.push((utf8(name)?, utf8(value)?));
        return Some(());
    }
    out.push(label_fields(buf)?);
    Some(())
}

/// [`push_label`]'s pair of any other shape: fields in any order, long or
/// repeated.
#[inline(never)]
fn label_fields(buf: &[u8]) -> Option<(&str, &str)> {
    let mut r = Reader::new(buf);
    let (mut name, mut value) = ("", "");
    while !r.done() {
        match r.key()? {
            (1, 2) => name = r.str()?,
            (2, 2) => value = r.str()?,
            (_, w) => r.skip(w)?,
        }
    }
    Some((name, value))
}

/// A `Sample { double value = 1; int64 timestamp = 2; }`.
fn sample(buf: &[u8]) -> Option<(i64, f64)> {
    let mut r = Reader::new(buf);
    let (mut ts, mut v) = (0i64, 0f64);
    while !r.done() {
        match r.key()? {
            (1, 1) => v = f64::from_bits(r.fixed64()?),
            (2, 0) => ts = r.varint()? as i64,
            (_, w) => r.skip(w)?,
        }
    }
    Some((ts, v))
}

impl<'a> Parsed<'a> {
    fn new(meter: Meter) -> Parsed<'a> {
        Parsed {
            meter,
            labels: Vec::new(),
            exemplar_labels: Vec::new(),
            samples: Vec::new(),
            exemplars: Vec::new(),
            histograms: Vec::new(),
            series: Vec::new(),
            metadata: Fast::default(),
            refused: Refused::default(),
            out_bytes: 16,
            out_attrs: 0,
            point_attrs: Writer::default(),
        }
    }

    /// Reads a decompressed request of `version`, its views within
    /// `meter`.
    pub fn read_within(version: Version, buf: &'a [u8], meter: Meter) -> Result<Parsed<'a>, ReadError> {
        let mut p = Parsed::new(meter);
        p.reserve(version, buf);
        match version {
            Version::V1 => p.read_v1(buf)?,
            Version::V2 => p.read_v2(buf)?,
        }
        Ok(p)
    }

    /// Reserves the views' vectors, so that they do not grow by copying
    /// (which was 3.5% of an ingester under remote write). A 1.0 request's
    /// series, labels and samples are counted first (a walk over their
    /// keys and lengths only); a 2.0 request's are estimated from its
    /// size. Together at most the meter's budget left (a third of what
    /// was reserved: the meter's margin for growth is not needed for what
    /// is reserved at once). A request the count says is over the budget
    /// is read without reservations, and stops at the meter.
    fn reserve(&mut self, version: Version, buf: &[u8]) {
        let (series, labels, samples) = match version {
            Version::V1 => count_v1(buf).unwrap_or((buf.len() / 64, buf.len() / 12, buf.len() / 64)),
            Version::V2 => (buf.len() / 64, buf.len() / 12, buf.len() / 64),
        };
        let (labels_b, samples_b, series_b) = (
            labels.saturating_mul(size_of::<(&str, &str)>()),
            samples.saturating_mul(size_of::<(i64, f64)>()),
            series.saturating_mul(size_of::<Series>()),
        );
        // The point attributes take about the labels' wire bytes.
        let attrs_b = buf.len() / 2;
        let total = labels_b
            .saturating_add(samples_b)
            .saturating_add(series_b)
            .saturating_add(attrs_b);
        if total <= self.meter.room() {
            self.labels.reserve(labels);
            self.samples.reserve(samples);
            self.series.reserve(series);
            self.point_attrs.buf.reserve(attrs_b);
        }
    }

    /// [`Parsed::read_within`] without a memory bound (tests, fuzzing).
    pub fn read(version: Version, buf: &'a [u8]) -> Result<Parsed<'a>, String> {
        Parsed::read_within(version, buf, Meter::unlimited()).map_err(|e| e.to_string())
    }

    fn read_v1(&mut self, buf: &'a [u8]) -> Result<(), ReadError> {
        let mut r = Reader::new(buf);
        while !r.done() {
            let at = r.pos();
            let bad = || malformed("a truncated or invalid field", at);
            match r.key().ok_or_else(bad)? {
                (1, 2) => {
                    let ts = r.bytes().ok_or_else(bad)?;
                    self.series_v1(ts, at)?;
                }
                (3, 2) => {
                    let m = r.bytes().ok_or_else(bad)?;
                    let mut mr = Reader::new(m);
                    let (mut kind, mut family, mut help, mut unit) = (Kind::Unknown, "", "", "");
                    while !mr.done() {
                        let bad = || malformed("a truncated or invalid metadata field", at);
                        match mr.key().ok_or_else(bad)? {
                            (1, 0) => kind = kind_of(mr.varint().ok_or_else(bad)?),
                            (2, 2) => family = mr.str().ok_or_else(bad)?,
                            (4, 2) => help = mr.str().ok_or_else(bad)?,
                            (5, 2) => unit = mr.str().ok_or_else(bad)?,
                            (_, w) => mr.skip(w).ok_or_else(bad)?,
                        }
                    }
                    // A map entry and its share of the table's slack.
                    self.meter.take::<(&str, (Kind, &str, &str))>(2)?;
                    self.metadata.insert(family, (kind, help, unit));
                }
                (_, w) => r.skip(w).ok_or_else(bad)?,
            }
        }
        Ok(())
    }

    fn series_v1(&mut self, buf: &'a [u8], at: usize) -> Result<(), ReadError> {
        let (l0, s0, e0, h0) = (
            self.labels.len(),
            self.samples.len(),
            self.exemplars.len(),
            self.histograms.len(),
        );
        let mut r = Reader::new(buf);
        let bad = || malformed("a truncated or invalid series", at);
        while !r.done() {
            match r.key().ok_or_else(bad)? {
                (1, 2) => {
                    self.meter.take::<(&str, &str)>(1)?;
                    push_label(&mut self.labels, r.bytes().ok_or_else(bad)?).ok_or_else(bad)?;
                }
                (2, 2) => {
                    let s = sample(r.bytes().ok_or_else(bad)?).ok_or_else(bad)?;
                    self.meter.take::<(i64, f64)>(1)?;
                    self.samples.push(s);
                }
                (3, 2) => {
                    let mut er = Reader::new(r.bytes().ok_or_else(bad)?);
                    let x0 = self.exemplar_labels.len();
                    let (mut value, mut ts_ms) = (0f64, 0i64);
                    while !er.done() {
                        match er.key().ok_or_else(bad)? {
                            (1, 2) => {
                                self.meter.take::<(&str, &str)>(1)?;
                                push_label(&mut self.exemplar_labels, er.bytes().ok_or_else(bad)?).ok_or_else(bad)?;
                            }
                            (2, 1) => value = f64::from_bits(er.fixed64().ok_or_else(bad)?),
                            (3, 0) => ts_ms = er.varint().ok_or_else(bad)? as i64,
                            (_, w) => er.skip(w).ok_or_else(bad)?,
                        }
                    }
                    self.meter.take::<Exemplar>(1)?;
                    self.exemplars.push(Exemplar {
                        labels: x0..self.exemplar_labels.len(),
                        value,
                        ts_ms,
                    });
                }
                (4, 2) => {
                    let h = r.bytes().ok_or_else(bad)?;
                    self.meter.take::<&[u8]>(1)?;
                    self.histograms.push(h);
                }
                (_, w) => r.skip(w).ok_or_else(bad)?,
            }
        }
        self.finish_series(l0, s0, e0, h0, Kind::Unknown, "", "", 0)
    }

    fn read_v2(&mut self, buf: &'a [u8]) -> Result<(), ReadError> {
        // Symbols first: the table may come after the series.
        let mut symbols: Vec<&'a str> = Vec::new();
        let mut r = Reader::new(buf);
        while !r.done() {
            let at = r.pos();
            let bad = || malformed("a truncated or invalid field", at);
            match r.key().ok_or_else(bad)? {
                (4, 2) => {
                    self.meter.take::<&str>(1)?;
                    symbols.push(r.str().ok_or_else(|| malformed("a symbol that is not UTF-8", at))?);
                }
                (_, w) => r.skip(w).ok_or_else(bad)?,
            }
        }
        if symbols.first().is_some_and(|s| !s.is_empty()) {
            return Err(ReadError::Invalid(
                "invalid remote write 2.0 request: the first symbol must be the empty string".to_owned(),
            ));
        }
        let sym = |i: u64| -> Result<&'a str, String> {
            usize::try_from(i)
                .ok()
                .and_then(|i| symbols.get(i).copied())
                .ok_or_else(|| {
                    format!(
                        "invalid remote write 2.0 request: symbol reference {i} is out of range (the request has {} symbols)",
                        symbols.len()
                    )
                })
        };
        let mut r = Reader::new(buf);
        while !r.done() {
            let at = r.pos();
            let bad = || malformed("a truncated or invalid field", at);
            match r.key().ok_or_else(bad)? {
                (5, 2) => {
                    let ts = r.bytes().ok_or_else(bad)?;
                    self.series_v2(ts, at, &sym)?;
                }
                (_, w) => r.skip(w).ok_or_else(bad)?,
            }
        }
        Ok(())
    }

    fn series_v2(
        &mut self,
        buf: &'a [u8],
        at: usize,
        sym: &dyn Fn(u64) -> Result<&'a str, String>,
    ) -> Result<(), ReadError> {
        let (l0, s0, e0, h0) = (
            self.labels.len(),
            self.samples.len(),
            self.exemplars.len(),
            self.histograms.len(),
        );
        let bad = || malformed("a truncated or invalid series", at);
        let mut refs: Vec<&'a str> = Vec::new();
        let (mut kind, mut help, mut unit, mut created) = (Kind::Unknown, "", "", 0i64);
        let mut r = Reader::new(buf);
        while !r.done() {
            match r.key().ok_or_else(bad)? {
                (1, w) => varints(&mut r, w, |i| {
                    refs.push(sym(i)?);
                    self.meter.take::<(&str, &str)>(1)
                })
                .ok_or_else(bad)??,
                (2, 2) => {
                    let s = sample(r.bytes().ok_or_else(bad)?).ok_or_else(bad)?;
                    self.meter.take::<(i64, f64)>(1)?;
                    self.samples.push(s);
                }
                (3, 2) => {
                    let h = r.bytes().ok_or_else(bad)?;
                    self.meter.take::<&[u8]>(1)?;
                    self.histograms.push(h);
                }
                (4, 2) => {
                    let mut er = Reader::new(r.bytes().ok_or_else(bad)?);
                    let mut erefs: Vec<&'a str> = Vec::new();
                    let (mut value, mut ts_ms) = (0f64, 0i64);
                    while !er.done() {
                        match er.key().ok_or_else(bad)? {
                            (1, w) => varints(&mut er, w, |i| {
                                erefs.push(sym(i)?);
                                self.meter.take::<(&str, &str)>(1)
                            })
                            .ok_or_else(bad)??,
                            (2, 1) => value = f64::from_bits(er.fixed64().ok_or_else(bad)?),
                            (3, 0) => ts_ms = er.varint().ok_or_else(bad)? as i64,
                            (_, w) => er.skip(w).ok_or_else(bad)?,
                        }
                    }
                    let x0 = self.exemplar_labels.len();
                    self.exemplar_labels.extend(ref_pairs(&erefs, "an exemplar")?);
                    self.meter.take::<Exemplar>(1)?;
                    self.exemplars.push(Exemplar {
                        labels: x0..self.exemplar_labels.len(),
                        value,
                        ts_ms,
                    });
                }
                (5, 2) => {
                    let mut mr = Reader::new(r.bytes().ok_or_else(bad)?);
                    while !mr.done() {
                        match mr.key().ok_or_else(bad)? {
                            (1, 0) => kind = kind_of(mr.varint().ok_or_else(bad)?),
                            (3, 0) => help = sym(mr.varint().ok_or_else(bad)?)?,
                            (4, 0) => unit = sym(mr.varint().ok_or_else(bad)?)?,
                            (_, w) => mr.skip(w).ok_or_else(bad)?,
                        }
                    }
                }
                (6, 0) => created = r.varint().ok_or_else(bad)? as i64,
                (_, w) => r.skip(w).ok_or_else(bad)?,
            }
        }
        self.labels.extend(ref_pairs(&refs, "a series")?);
        self.finish_series(l0, s0, e0, h0, kind, help, unit, created)
    }

    /// Checks the series just read (its parts from `l0`, `s0`, `e0`,
    /// `h0` on) and keeps it, or refuses it whole.
    #[allow(clippy::too_many_arguments)]
    fn finish_series(
        &mut self,
        l0: usize,
        s0: usize,
        e0: usize,
        h0: usize,
        kind: Kind,
        help: &'a str,
        unit: &'a str,
        created_ms: i64,
    ) -> Result<(), ReadError> {
        let name = match check_labels(&self.labels[l0..]) {
            Ok(name) => name,
            Err(reason) => {
                self.refused.add(
                    (self.samples.len() - s0) as u64,
                    (self.histograms.len() - h0) as u64,
                    (self.exemplars.len() - e0) as u64,
                    || reason,
                );
                self.labels.truncate(l0);
                self.samples.truncate(s0);
                self.exemplars.truncate(e0);
                self.histograms.truncate(h0);
                return Ok(());
            }
        };
        // One pass: an empty value is no label (Prometheus); the point
        // attributes sized; the resource's labels found.
        let (mut keep, mut n_attrs, mut label_bytes) = (l0, 0u64, 0);
        let (mut job, mut instance) = (None, None);
        let a0 = self.point_attrs.len();
        for i in l0..self.labels.len() {
            let (k, v) = self.labels[i];
            if v.is_empty() {
                continue;
            }
            self.labels[keep] = (k, v);
            keep += 1;
            label_bytes += k.len() + v.len() + 24;
            match k {
                "job" => job = Some(v),
                "instance" => instance = Some(v),
                _ if is_point_label(k) => {
                    n_attrs += 1;
                    self.point_attrs.kv_str(7, k, v);
                }
                _ => {}
            }
        }
        self.labels.truncate(keep);
        let attrs = self.point_attrs.len() - a0;
        self.meter.take::<u8>(attrs)?;
        // A repeated time: the same value is one sample, another value is
        // refused (Mimir's duplicate-timestamp rule).
        let mut keep = s0;
        let mut prev: Option<(i64, f64)> = None;
        for i in s0..self.samples.len() {
            let (t, v) = self.samples[i];
            if let Some((pt, pv)) = prev
                && pt == t
            {
                if pv.to_bits() != v.to_bits() {
                    let labels = &self.labels[l0..];
                    self.refused.add(1, 0, 0, || {
                        format!(
                            "received a sample with a duplicate timestamp {t} ms and another value for series {}",
                            describe(labels)
                        )
                    });
                }
                continue;
            }
            self.samples[keep] = (t, v);
            keep += 1;
            prev = Some((t, v));
        }
        self.samples.truncate(keep);
        let points = (self.samples.len() - s0 + self.histograms.len() - h0 + self.exemplars.len() - e0) as u64;
        // A histogram's dense buckets: at most MAX_HISTOGRAM_SPAN zero
        // counts a side, a byte each, and a count or bound for each on the
        // wire.
        let hist_bytes: usize = self.histograms[h0..]
            .iter()
            .map(|h| h.len() * 10 + 2 * MAX_HISTOGRAM_SPAN + 128)
            .sum();
        let ex_bytes: usize = self.exemplars[e0..]
            .iter()
            .map(|e| {
                48 + self.exemplar_labels[e.labels.clone()]
                    .iter()
                    .map(|(k, v)| kv_str_len(k, v))
                    .sum::<usize>()
            })
            .sum();
        // A series' metric and, at worst, a resource of its own.
        self.out_bytes += 160
            + name.len()
            + help.len()
            + unit.len()
            + points as usize * (attrs + 48)
            + hist_bytes
            + ex_bytes
            + label_bytes;
        self.out_attrs += points * n_attrs;
        self.meter.take::<Series>(1)?;
        self.series.push(Series {
            labels: l0..self.labels.len(),
            name,
            job,
            instance,
            point_attrs: a0..self.point_attrs.len(),
            samples: s0..self.samples.len(),
            exemplars: e0..self.exemplars.len(),
            histograms: h0..self.histograms.len(),
            kind,
            help,
            unit,
            created_ms,
        });
        Ok(())
    }

    /// What the OTLP request will hold, for the receivers' memory bound
    /// before it is written.
    pub fn census(&self) -> Census {
        let records = (self.samples.len() + self.histograms.len() + self.exemplars.len()) as u64;
        Census {
            records,
            attributes: self.out_attrs,
            others: self.exemplars.len() as u64 + self.series.len() as u64,
            buckets: self.histograms.iter().map(|h| h.len() as u64).sum(),
            bytes: self.out_bytes as u64,
        }
    }

    /// The (type, help, unit) of a series: its own (2.0), or its family's
    /// (1.0: the name, or the name without a suffix Prometheus adds).
    fn metadata_of(&self, s: &Series<'a>) -> (Kind, &'a str, &'a str) {
        if s.kind != Kind::Unknown || !s.help.is_empty() || !s.unit.is_empty() {
            return (s.kind, s.help, s.unit);
        }
        if self.metadata.is_empty() {
            return (Kind::Unknown, "", "");
        }
        family_lookup(s.name, |f| self.metadata.get(f).copied()).unwrap_or((Kind::Unknown, "", ""))
    }

    /// Learns the 1.0 metadata this request carries into `tenant`'s
    /// entries of `kinds`, and gives each series whose request says
    /// nothing of its family the type `kinds` remembers.
    pub fn apply_kinds(&mut self, kinds: &KindCache, tenant: &TenantId) {
        let Ok(mut all) = kinds.families.lock() else { return };
        let learned: Vec<(&'a str, Kind)> = self
            .metadata
            .iter()
            .filter(|(family, (kind, _, _))| *kind != Kind::Unknown && family.len() <= MAX_CACHED_NAME)
            .map(|(family, (kind, _, _))| (*family, *kind))
            .collect();
        if !learned.is_empty() {
            let total: usize = all.values().map(HashMap::len).sum();
            let mut room = MAX_CACHED_FAMILIES.saturating_sub(total);
            // A tenant has an entry only once it has a family in it.
            let known = all.entry(tenant.clone()).or_default();
            for (family, kind) in learned {
                if let Some(k) = known.get_mut(family) {
                    *k = kind;
                } else if room > 0 && known.len() < MAX_CACHED_FAMILIES_PER_TENANT {
                    known.insert(Box::from(family), kind);
                    room -= 1;
                }
            }
            if known.is_empty() {
                all.remove(tenant);
            }
        }
        let Some(known) = all.get(tenant) else { return };
        for i in 0..self.series.len() {
            if self.metadata_of(&self.series[i]).0 != Kind::Unknown {
                continue;
            }
            if let Some(kind) = family_lookup(self.series[i].name, |f| known.get(f).copied()) {
                self.series[i].kind = kind;
            }
        }
    }

    /// The OTLP metrics export request of the series kept, without the
    /// samples, histograms and exemplars outside `window` (refused), and
    /// what it holds.
    pub fn write(&mut self, window: TimeWindow) -> (Vec<u8>, Written) {
        let mut written = Written::default();
        // Series by resource (job, instance), in the order met: each
        // series' resource (the last one's when it is the same, as it
        // mostly is), then the series of each resource together.
        type Key<'a> = (Option<&'a str>, Option<&'a str>);
        let mut keys: Vec<Key<'a>> = Vec::new();
        let mut index: Fast<Key<'a>, usize> = Fast::default();
        let mut of: Vec<usize> = Vec::with_capacity(self.series.len());
        let mut last: Option<(Key<'a>, usize)> = None;
        for s in &self.series {
            let key = (s.job, s.instance);
            let at = match last {
                Some((k, at)) if k == key => at,
                _ => {
                    let at = *index.entry(key).or_insert_with(|| {
                        keys.push(key);
                        keys.len() - 1
                    });
                    last = Some((key, at));
                    at
                }
            };
            of.push(at);
        }
        let mut start = vec![0usize; keys.len() + 1];
        for &at in &of {
            start[at + 1] += 1;
        }
        for r in 0..keys.len() {
            start[r + 1] += start[r];
        }
        let mut flat = vec![0usize; of.len()];
        let mut fill = start.clone();
        for (i, &at) in of.iter().enumerate() {
            flat[fill[at]] = i;
            fill[at] += 1;
        }
        let resources = keys
            .iter()
            .enumerate()
            .map(|(r, &(job, instance))| (job, instance, &flat[start[r]..start[r + 1]]));
        let mut refused = std::mem::take(&mut self.refused);
        let mut w = Writer::with_capacity(self.out_bytes.min(64 << 20));
        // The samples of the group being written, each series' a range.
        let mut kept: Vec<(u64, f64)> = Vec::new();
        for (job, instance, members) in resources {
            w.begin(1); // ResourceMetrics
            w.begin(1); // Resource
            if let Some(job) = job {
                match job.split_once('/') {
                    Some((ns, name)) => {
                        w.kv_str(1, "service.namespace", ns);
                        w.kv_str(1, "service.name", name);
                    }
                    None => w.kv_str(1, "service.name", job),
                }
            }
            if let Some(instance) = instance {
                w.kv_str(1, "service.instance.id", instance);
            }
            w.kv_str(1, SOURCE_ATTR, SOURCE_REMOTE_WRITE);
            w.end();
            w.begin(2); // ScopeMetrics
            // Series of one name and metadata together, one metric each,
            // the names in order.
            let mut group: Vec<Prepared> = Vec::new();
            let mut last = None;
            for i in by_name(members, |i| self.series[i].name) {
                let this = (self.series[i].name, self.metadata_of(&self.series[i]));
                if let Some(last) = last
                    && !same_metric(last, this)
                {
                    self.write_group(&mut w, &group, &kept, &mut written);
                    group.clear();
                    kept.clear();
                }
                last = Some(this);
                group.push(self.prepare(i, window, &mut refused, &mut kept));
            }
            self.write_group(&mut w, &group, &kept, &mut written);
            group.clear();
            kept.clear();
            w.end();
            w.end();
        }
        self.refused = refused;
        (w.finish(), written)
    }

    /// What series `i` puts in the OTLP request: its samples, exemplars
    /// and histograms inside `window` (the rest refused).
    fn prepare(&self, i: usize, window: TimeWindow, refused: &mut Refused, kept: &mut Vec<(u64, f64)>) -> Prepared {
        let s = &self.series[i];
        let labels = &self.labels[s.labels.clone()];
        let in_window = |ts_ms: i64, refused: &mut Refused, what: (u64, u64, u64)| -> Option<u64> {
            let ns = u64::try_from(ts_ms).ok().and_then(|t| t.checked_mul(1_000_000));
            match ns {
                Some(ns) if ns >= window.min_ns && ns <= window.max_ns => Some(ns),
                Some(ns) if ns < window.min_ns => {
                    refused.add(what.0, what.1, what.2, || {
                        format!(
                            "received a sample whose timestamp is too old: {ts_ms} ms, the oldest accepted is {} ms (--max-past), for series {}",
                            window.min_ns / 1_000_000,
                            describe(labels)
                        )
                    });
                    None
                }
                None if ts_ms < 0 => {
                    refused.add(what.0, what.1, what.2, || {
                        format!(
                            "received a sample whose timestamp is too old: {ts_ms} ms, the oldest accepted is {} ms (--max-past), for series {}",
                            window.min_ns / 1_000_000,
                            describe(labels)
                        )
                    });
                    None
                }
                _ => {
                    refused.add(what.0, what.1, what.2, || {
                        format!(
                            "received a sample whose timestamp is too far in the future: {ts_ms} ms, the newest accepted is {} ms (--max-future), for series {}",
                            window.max_ns / 1_000_000,
                            describe(labels)
                        )
                    });
                    None
                }
            }
        };
        let created_ns = u64::try_from(s.created_ms)
            .ok()
            .and_then(|t| t.checked_mul(1_000_000))
            .unwrap_or(0);
        // Exemplars: with the sample of their time, else on a point of
        // their own that holds no value.
        let mut exemplars_at: Vec<(u64, usize)> = Vec::new();
        for e in s.exemplars.clone() {
            if let Some(ns) = in_window(self.exemplars[e].ts_ms, refused, (0, 0, 1)) {
                exemplars_at.push((ns, e));
            }
        }
        let k0 = kept.len();
        kept.extend(
            self.samples[s.samples.clone()]
                .iter()
                .filter_map(|(t, v)| in_window(*t, refused, (1, 0, 0)).map(|ns| (ns, *v))),
        );
        let mut by_time: Fast<u64, Vec<usize>> = Fast::default();
        for (ns, e) in &exemplars_at {
            by_time.entry(*ns).or_default().push(*e);
        }
        let mut lone: Vec<(u64, usize)> = Vec::new();
        if !by_time.is_empty() {
            let times: std::collections::HashSet<u64> = kept[k0..].iter().map(|(ns, _)| *ns).collect();
            lone = exemplars_at
                .iter()
                .copied()
                .filter(|(ns, _)| !times.contains(ns))
                .collect();
        }
        let mut hists: Vec<(u64, Hist)> = Vec::new();
        for h in s.histograms.clone() {
            let parsed = match Hist::read(self.histograms[h]) {
                Ok(x) => x,
                Err(reason) => {
                    refused.add(0, 1, 0, || format!("{reason} in series {}", describe(labels)));
                    continue;
                }
            };
            if let Some(ns) = in_window(parsed.ts_ms, refused, (0, 1, 0)) {
                hists.push((ns, parsed));
            }
        }
        let extra = (!lone.is_empty() || !by_time.is_empty() || !hists.is_empty())
            .then(|| Box::new(Extra { lone, by_time, hists }));
        Prepared {
            i,
            created_ns,
            kept: k0..kept.len(),
            extra,
        }
    }

    /// Series `group` (consecutive members of one resource with the same
    /// name and metadata) as one OTLP metric of their samples and one of
    /// each kind of their histograms, as an OTLP exporter groups points.
    fn write_group(&self, w: &mut Writer, group: &[Prepared], kept: &[(u64, f64)], written: &mut Written) {
        let Some(first) = group.first() else { return };
        let s = &self.series[first.i];
        let (kind, help, unit) = self.metadata_of(s);
        let header = |w: &mut Writer| {
            w.begin(2); // Metric
            w.string(1, s.name);
            if !help.is_empty() {
                w.string(2, help);
            }
            if !unit.is_empty() {
                w.string(3, unit);
            }
        };
        let attrs_of = |p: &Prepared| {
            let labels = &self.labels[self.series[p.i].labels.clone()];
            move |w: &mut Writer, field: u32| {
                for (k, v) in labels.iter().filter(|(k, _)| is_point_label(k)) {
                    w.kv_str(field, k, v);
                }
            }
        };
        let (monotonic, field) = match kind {
            Kind::Counter => (true, 7),
            Kind::Histogram | Kind::GaugeHistogram | Kind::Summary
                if ["_bucket", "_sum", "_count"].iter().any(|x| s.name.ends_with(x)) =>
            {
                (true, 7)
            }
            _ => (false, 5),
        };
        if group.iter().any(|p| !p.kept.is_empty() || !p.lone().is_empty()) {
            header(w);
            w.begin(field);
            for p in group {
                let attrs = &self.point_attrs.buf[self.series[p.i].point_attrs.clone()];
                for &(ns, v) in &kept[p.kept.clone()] {
                    w.begin(1); // NumberDataPoint
                    if p.created_ns > 0 {
                        w.fixed64(2, p.created_ns);
                    }
                    w.fixed64(3, ns);
                    w.double(4, v);
                    for &e in p.exemplars_at(ns) {
                        self.write_exemplar(w, 5, e, ns, written);
                    }
                    w.buf.extend_from_slice(attrs);
                    w.end();
                    written.samples += 1;
                }
                for &(ns, e) in p.lone() {
                    w.begin(1);
                    w.fixed64(3, ns);
                    self.write_exemplar(w, 5, e, ns, written);
                    w.buf.extend_from_slice(attrs);
                    w.varint(8, NO_RECORDED_VALUE);
                    w.end();
                    written.lone += 1;
                }
            }
            if field == 7 {
                w.varint(2, 2); // cumulative
                w.varint(3, u64::from(monotonic));
            }
            w.end();
            w.end();
        }
        for custom in [false, true] {
            fn of_kind(p: &Prepared, custom: bool) -> impl Iterator<Item = &(u64, Hist)> {
                p.hists()
                    .iter()
                    .filter(move |(_, h)| (h.schema == CUSTOM_BUCKETS) == custom)
            }
            if !group.iter().any(|p| of_kind(p, custom).next().is_some()) {
                continue;
            }
            header(w);
            w.begin(if custom { 9 } else { 10 });
            for p in group {
                let attrs = attrs_of(p);
                for (ns, h) in of_kind(p, custom) {
                    w.begin(1);
                    if custom {
                        h.write_explicit(w, *ns, p.created_ns, &attrs);
                    } else {
                        h.write_exponential(w, *ns, p.created_ns, &attrs);
                    }
                    w.end();
                    written.histograms += 1;
                }
            }
            w.varint(2, 2); // cumulative
            w.end();
            w.end();
        }
    }

    fn write_exemplar(&self, w: &mut Writer, field: u32, e: usize, ns: u64, written: &mut Written) {
        let x = &self.exemplars[e];
        w.begin(field);
        w.fixed64(2, ns);
        w.double(3, x.value);
        for (k, v) in &self.exemplar_labels[x.labels.clone()] {
            match (*k, hex_id(v)) {
                ("trace_id", Some(id)) if id.len() == 16 => w.bytes(5, &id),
                ("span_id", Some(id)) if id.len() == 8 => w.bytes(4, &id),
                _ => w.kv_str(7, k, v),
            }
        }
        w.end();
        written.exemplars += 1;
    }
}

/// Lowercase or uppercase hex as bytes.
fn hex_id(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 64 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The schema of a native histogram with custom bucket bounds.
const CUSTOM_BUCKETS: i32 = -53;

/// One series' part of the OTLP request, ready to write.
struct Prepared {
    /// Into [`Parsed::series`].
    i: usize,
    created_ns: u64,
    /// Samples (time ns, value) inside the window: a range of the
    /// group's samples.
    kept: Range<usize>,
    /// Exemplars and histograms, for the few series that have them.
    extra: Option<Box<Extra>>,
}

struct Extra {
    /// Exemplars (time ns, index) without a sample of their time.
    lone: Vec<(u64, usize)>,
    /// Exemplars by the time of their sample.
    by_time: Fast<u64, Vec<usize>>,
    hists: Vec<(u64, Hist)>,
}

impl Prepared {
    fn lone(&self) -> &[(u64, usize)] {
        self.extra.as_ref().map_or(&[], |x| &x.lone)
    }

    fn exemplars_at(&self, ns: u64) -> &[usize] {
        self.extra
            .as_ref()
            .and_then(|x| x.by_time.get(&ns))
            .map_or(&[], Vec::as_slice)
    }

    fn hists(&self) -> &[(u64, Hist)] {
        self.extra.as_ref().map_or(&[], |x| &x.hists)
    }
}

/// A native histogram, its buckets expanded to dense counts.
#[derive(Debug, Default)]
struct Hist {
    count: f64,
    sum: f64,
    schema: i32,
    zero_threshold: f64,
    zero_count: f64,
    /// (index of the first bucket, counts) for each side.
    positive: (i64, Vec<f64>),
    negative: (i64, Vec<f64>),
    custom_values: Vec<f64>,
    ts_ms: i64,
}

fn zigzag64(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Reads packed or unpacked doubles of one field occurrence.
fn doubles(r: &mut Reader<'_>, wire: u8, out: &mut Vec<f64>) -> Option<()> {
    match wire {
        1 => out.push(f64::from_bits(r.fixed64()?)),
        2 => {
            let b = r.bytes()?;
            if b.len() % 8 != 0 {
                return None;
            }
            out.extend(
                b.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))),
            );
        }
        _ => return None,
    }
    Some(())
}

impl Hist {
    fn read(buf: &[u8]) -> Result<Hist, String> {
        let bad = || "a malformed native histogram".to_owned();
        let mut h = Hist::default();
        let (mut pos_spans, mut neg_spans) = (Vec::new(), Vec::new());
        let (mut pos_deltas, mut neg_deltas) = (Vec::new(), Vec::new());
        let (mut pos_counts, mut neg_counts) = (Vec::new(), Vec::new());
        let mut r = Reader::new(buf);
        while !r.done() {
            match r.key().ok_or_else(bad)? {
                (1, 0) => h.count = r.varint().ok_or_else(bad)? as f64,
                (2, 1) => h.count = f64::from_bits(r.fixed64().ok_or_else(bad)?),
                (3, 1) => h.sum = f64::from_bits(r.fixed64().ok_or_else(bad)?),
                (4, 0) => h.schema = zigzag64(r.varint().ok_or_else(bad)?) as i32,
                (5, 1) => h.zero_threshold = f64::from_bits(r.fixed64().ok_or_else(bad)?),
                (6, 0) => h.zero_count = r.varint().ok_or_else(bad)? as f64,
                (7, 1) => h.zero_count = f64::from_bits(r.fixed64().ok_or_else(bad)?),
                (f @ (8 | 11), 2) => {
                    let mut sr = Reader::new(r.bytes().ok_or_else(bad)?);
                    let (mut offset, mut length) = (0i64, 0u64);
                    while !sr.done() {
                        match sr.key().ok_or_else(bad)? {
                            (1, 0) => offset = zigzag64(sr.varint().ok_or_else(bad)?),
                            (2, 0) => length = sr.varint().ok_or_else(bad)?,
                            (_, w) => sr.skip(w).ok_or_else(bad)?,
                        }
                    }
                    if f == 8 { &mut neg_spans } else { &mut pos_spans }.push((offset, length));
                }
                (f @ (9 | 12), w) => {
                    let out = if f == 9 { &mut neg_deltas } else { &mut pos_deltas };
                    varints(&mut r, w, |v| {
                        out.push(zigzag64(v));
                        Ok(())
                    })
                    .ok_or_else(bad)?
                    .map_err(|_| bad())?;
                }
                (f @ (10 | 13), w) => {
                    doubles(&mut r, w, if f == 10 { &mut neg_counts } else { &mut pos_counts }).ok_or_else(bad)?
                }
                (15, 0) => h.ts_ms = r.varint().ok_or_else(bad)? as i64,
                (16, w) => doubles(&mut r, w, &mut h.custom_values).ok_or_else(bad)?,
                (_, w) => r.skip(w).ok_or_else(bad)?,
            }
        }
        if !(-4..=8).contains(&h.schema) && h.schema != CUSTOM_BUCKETS {
            return Err(format!("a native histogram of unsupported schema {}", h.schema));
        }
        h.positive = expand(&pos_spans, &pos_deltas, pos_counts)?;
        h.negative = expand(&neg_spans, &neg_deltas, neg_counts)?;
        if h.schema == CUSTOM_BUCKETS {
            if !h.negative.1.is_empty() {
                return Err("a custom-bucket native histogram with negative buckets".to_owned());
            }
            let (first, counts) = &h.positive;
            if *first < 0 || (*first as usize + counts.len()) > h.custom_values.len() + 1 {
                return Err(format!(
                    "a custom-bucket native histogram with buckets past its {} bounds",
                    h.custom_values.len()
                ));
            }
        }
        Ok(h)
    }

    fn write_exponential(&self, w: &mut Writer, ns: u64, created_ns: u64, attrs: &dyn Fn(&mut Writer, u32)) {
        attrs(w, 1);
        if created_ns > 0 {
            w.fixed64(2, created_ns);
        }
        w.fixed64(3, ns);
        w.fixed64(4, round_count(self.count));
        w.double(5, self.sum);
        w.sint32(6, self.schema);
        w.fixed64(7, round_count(self.zero_count));
        // Prometheus' bucket i is (base^(i-1), base^i]; OTLP's k is
        // (base^k, base^(k+1)].
        for (field, (first, counts)) in [(8, &self.positive), (9, &self.negative)] {
            if counts.is_empty() {
                continue;
            }
            w.begin(field);
            w.sint32(1, (*first - 1) as i32);
            w.begin(2);
            for c in counts {
                prost::encoding::encode_varint(round_count(*c), &mut w.buf);
            }
            w.end();
            w.end();
        }
        if self.zero_threshold != 0.0 {
            w.double(14, self.zero_threshold);
        }
    }

    fn write_explicit(&self, w: &mut Writer, ns: u64, created_ns: u64, attrs: &dyn Fn(&mut Writer, u32)) {
        if created_ns > 0 {
            w.fixed64(2, created_ns);
        }
        w.fixed64(3, ns);
        w.fixed64(4, round_count(self.count));
        w.double(5, self.sum);
        let mut counts = vec![0u64; self.custom_values.len() + 1];
        let (first, dense) = &self.positive;
        for (i, c) in dense.iter().enumerate() {
            if let Some(slot) = counts.get_mut(*first as usize + i) {
                *slot = round_count(*c);
            }
        }
        w.begin(6);
        for c in counts {
            w.buf.extend_from_slice(&c.to_le_bytes());
        }
        w.end();
        w.begin(7);
        for b in &self.custom_values {
            w.buf.extend_from_slice(&b.to_le_bytes());
        }
        w.end();
        attrs(w, 9);
    }
}

fn round_count(c: f64) -> u64 {
    if c.is_finite() && c > 0.0 { c.round() as u64 } else { 0 }
}

/// Dense counts from spans and deltas (integer histograms) or counts
/// (float ones): (index of the first bucket, counts).
fn expand(spans: &[(i64, u64)], deltas: &[i64], counts: Vec<f64>) -> Result<(i64, Vec<f64>), String> {
    let listed: u64 = spans.iter().map(|(_, l)| *l).sum();
    let given = if deltas.is_empty() { counts.len() } else { deltas.len() } as u64;
    if listed != given {
        return Err(format!(
            "a native histogram whose spans list {listed} buckets but which has {given} counts"
        ));
    }
    if listed == 0 {
        return Ok((0, Vec::new()));
    }
    let mut values = counts;
    if !deltas.is_empty() {
        let mut c = 0i64;
        values = deltas
            .iter()
            .map(|d| {
                c = c.saturating_add(*d);
                c as f64
            })
            .collect();
    }
    if values.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return Err("a native histogram with a negative or non-finite bucket count".to_owned());
    }
    let mut index = 0i64;
    let mut first = None;
    let mut out: Vec<f64> = Vec::new();
    let mut at = 0usize;
    for (i, (offset, length)) in spans.iter().enumerate() {
        index = if i == 0 { *offset } else { index.saturating_add(*offset) };
        let start = *first.get_or_insert(index);
        for _ in 0..*length {
            let slot = usize::try_from(index - start)
                .ok()
                .filter(|s| *s < MAX_HISTOGRAM_SPAN)
                .ok_or_else(|| {
                    format!("a native histogram whose buckets span more than {MAX_HISTOGRAM_SPAN} (or go backwards)")
                })?;
            if out.len() <= slot {
                out.resize(slot + 1, 0.0);
            }
            out[slot] = values[at];
            at += 1;
            index += 1;
        }
    }
    Ok((first.unwrap_or(0), out))
}

#[cfg(test)]
mod tests;
