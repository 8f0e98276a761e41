//! Proptest strategies for arbitrary but valid OTLP export requests, for round-trip property tests.
//!
//! "Valid" means what the OTLP schema requires of a sender: trace ids are empty or 16 bytes and
//! span ids empty or 8 bytes; enum fields hold defined values and aggregation temporality is never
//! `UNSPECIFIED`; attribute keys are unique within each list (kvlists included) and non-empty,
//! except that a pair with a nonzero `key_strindex` has an empty key; entity references name keys
//! present in the resource's attributes; histogram bucket counts are empty (and then so are the
//! bounds) or one longer than the strictly increasing finite bounds and add up to the count;
//! exponential histogram counts add up; summary quantiles are strictly increasing in `[0, 1]` with
//! values that are not negative.
//!
//! Within that, the strategies lean on edge cases: empty strings and lists; `None` wherever the
//! schema allows it (resource, scope, log body, `AnyValue.value`, `KeyValue.value`, span status,
//! metric data, point values, histogram sum/min/max, exponential buckets); arrays and kvlists
//! nested to depth 3; bytes; NaN (the canonical `f64::NAN` bit pattern only), ±inf, -0.0,
//! subnormals; `i64::MIN`/`MAX`; timestamps 0 and `u64::MAX`; awkward code points (NUL, BOM,
//! combining marks, U+10FFFF); non-string log bodies; a rare nonzero `key_strindex`; resource
//! `entity_refs`; metric `metadata`; exemplars with filtered attributes; and the same resource (or
//! scope) appearing in two groups of one request.
//!
//! Sizes stay small (0–4 resource groups, 0–3 scope groups each, 0–5 leaves each) so 256 cases
//! take well under a second in debug builds. Compare round-tripped requests with
//! [`crate::flatten`], not `==`: NaN is not equal to itself under `PartialEq`.

use crate::corpus::mix;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, EntityRef, InstrumentationScope, KeyValue, KeyValueList, any_value,
};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint, exemplar,
    exponential_histogram_data_point, metric, number_data_point, summary_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};
use proptest::collection::vec;
use proptest::prelude::*;

/// Resource groups per request: 0..=4.
const RESOURCES: std::ops::RangeInclusive<usize> = 0..=4;
/// Scope groups per resource group: 0..=3.
const SCOPES: std::ops::RangeInclusive<usize> = 0..=3;
/// Leaves (records, spans, metrics, points) per parent: 0..=5.
const LEAVES: std::ops::RangeInclusive<usize> = 0..=5;

/// Arbitrary valid logs export requests. See the module doc for what they stress.
pub fn logs_request() -> impl Strategy<Value = ExportLogsServiceRequest> {
    (vec(resource_logs(), RESOURCES), prop::bool::weighted(0.3)).prop_map(|(mut groups, duplicate)| {
        if duplicate && groups.len() >= 2 {
            groups[1].resource = groups[0].resource.clone();
            groups[1].schema_url = groups[0].schema_url.clone();
        }
        ExportLogsServiceRequest { resource_logs: groups }
    })
}

/// Arbitrary valid trace export requests. See the module doc for what they stress.
pub fn traces_request() -> impl Strategy<Value = ExportTraceServiceRequest> {
    (vec(resource_spans(), RESOURCES), prop::bool::weighted(0.3)).prop_map(|(mut groups, duplicate)| {
        if duplicate && groups.len() >= 2 {
            groups[1].resource = groups[0].resource.clone();
            groups[1].schema_url = groups[0].schema_url.clone();
        }
        ExportTraceServiceRequest { resource_spans: groups }
    })
}

/// Arbitrary valid metrics export requests. See the module doc for what they stress.
pub fn metrics_request() -> impl Strategy<Value = ExportMetricsServiceRequest> {
    (vec(resource_metrics(), RESOURCES), prop::bool::weighted(0.3)).prop_map(|(mut groups, duplicate)| {
        if duplicate && groups.len() >= 2 {
            groups[1].resource = groups[0].resource.clone();
            groups[1].schema_url = groups[0].schema_url.clone();
        }
        ExportMetricsServiceRequest {
            resource_metrics: groups,
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Scalars
//
// A note on speed. In debug builds a proptest union costs about 1 µs to pick plus about 9 µs for
// every arm before the one picked (each gets a clone of the runner), so unions dominate the
// generation time. Leaf values are therefore drawn from one `u64` seed and mapped to a value by
// the `*_from` functions below (about 0.5 µs each); seed 0 maps to the simplest value (empty,
// zero, `None`), so shrinking, which moves seeds towards 0, still ends at simple values. Unions
// that remain put their likeliest arm first, and `maybe` puts `Some` first.

/// `Some` with weight `some`, `None` with weight `none`.
fn maybe<T: Clone + std::fmt::Debug + 'static>(
    some: u32,
    none: u32,
    strategy: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<Option<T>> {
    prop_oneof![some => strategy.prop_map(Some), none => Just(None)].boxed()
}

/// Hands out a 64-bit word a few bits at a time, drawing a fresh word when it runs out.
struct Bits {
    state: u64,
    h: u64,
    left: u32,
}

impl Bits {
    fn new(seed: u64) -> Self {
        Bits {
            state: seed,
            h: mix(seed),
            left: 64,
        }
    }

    /// A number in `0..n`, `n <= 2^bits`, `bits <= 16`.
    fn take(&mut self, bits: u32, n: u64) -> u64 {
        if self.left < bits {
            self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            self.h = mix(self.state);
            self.left = 64;
        }
        let v = self.h & ((1 << bits) - 1);
        self.h >>= bits;
        self.left -= bits;
        v % n
    }
}

/// Identifier-like: letters, digits, dots, underscores.
const IDENT: &[char] = &[
    'a', 'b', 'e', 'h', 'i', 'k', 'o', 'r', 's', 't', 'x', 'z', '0', '9', '.', '_',
];

/// Code points that trip up text handling: NUL, DEL, combining mark, zero-width space, BOM,
/// the last code point, astral emoji, replacement character, quotes and escapes, ligature.
const AWKWARD: &[char] = &[
    '\0',
    '\u{7f}',
    'é',
    '\u{301}',
    '\u{200b}',
    '\u{feff}',
    '\u{10ffff}',
    '😀',
    'ß',
    '\u{fffd}',
    'Ω',
    '\n',
    '"',
    '\\',
    '\u{1F3F3}',
    'ﬀ',
];

fn string_from(seed: u64) -> String {
    if seed == 0 {
        return String::new();
    }
    let h = mix(seed);
    let mut bits = Bits::new(h);
    match h % 16 {
        0..=4 => String::new(),
        5..=11 => {
            let len = 1 + bits.take(4, 10);
            (0..len).map(|_| IDENT[bits.take(4, 16) as usize]).collect()
        }
        12 => "ünïcødé ✓ 🚀".to_owned(),
        13 => "nul\0 tab\t newline\n".to_owned(),
        _ => {
            let len = 1 + bits.take(4, 6);
            (0..len).map(|_| AWKWARD[bits.take(4, 16) as usize]).collect()
        }
    }
}

fn string() -> BoxedStrategy<String> {
    any::<u64>().prop_map(string_from).boxed()
}

/// Mostly `common[..]` (the first entries repeated for weight), sometimes any string.
fn string_or(common: &'static [&'static str]) -> BoxedStrategy<String> {
    any::<u64>()
        .prop_map(move |seed| {
            let h = mix(seed);
            if seed == 0 || !h.is_multiple_of(5) {
                common[(h >> 8) as usize % common.len()].to_owned()
            } else {
                string_from(mix(h))
            }
        })
        .boxed()
}

fn schema_url() -> BoxedStrategy<String> {
    string_or(&["", "", "", "https://opentelemetry.io/schemas/1.26.0"])
}

fn int64_from(seed: u64) -> i64 {
    const SPECIAL: [i64; 4] = [i64::MIN, i64::MAX, 0, -1];
    let h = mix(seed);
    match (seed, h % 5) {
        (0, _) => 0,
        (_, 4) => SPECIAL[(h >> 8) as usize % SPECIAL.len()],
        _ => mix(h) as i64,
    }
}

fn int64() -> BoxedStrategy<i64> {
    any::<u64>().prop_map(int64_from).boxed()
}

/// Any double, with the awkward ones often: NaN (canonical bits only), ±inf, -0.0, extremes.
fn double_from(seed: u64) -> f64 {
    const SPECIAL: [f64; 8] = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
        f64::MIN_POSITIVE,
        f64::MAX,
        f64::MIN,
    ];
    if seed == 0 {
        return 0.0;
    }
    let h = mix(seed);
    match h % 8 {
        // Every exponent, subnormals included; any NaN payload becomes the canonical NaN.
        0..=2 => {
            let d = f64::from_bits(mix(h));
            if d.is_nan() { f64::NAN } else { d }
        }
        // Everyday magnitudes, three decimals.
        3 | 4 => ((mix(h) % 2_000_000_000) as i64 - 1_000_000_000) as f64 / 1000.0,
        _ => SPECIAL[(h >> 8) as usize % SPECIAL.len()],
    }
}

fn double() -> BoxedStrategy<f64> {
    any::<u64>().prop_map(double_from).boxed()
}

/// `None` or `Some` with equal odds; seed 0 is `None`.
fn maybe_double() -> BoxedStrategy<Option<f64>> {
    any::<u64>()
        .prop_map(|seed| {
            let h = mix(seed);
            (seed != 0 && h % 2 == 1).then(|| double_from(mix(h)))
        })
        .boxed()
}

fn timestamp_from(seed: u64) -> u64 {
    // 2026-11-30T00:00:00Z, give or take a day.
    const BASE: u64 = crate::corpus::BASE_TIME_UNIX_NANO;
    const DAY: u64 = 86_400_000_000_000;
    const SPECIAL: [u64; 3] = [0, 1, u64::MAX];
    let h = mix(seed);
    match (seed, h % 8) {
        (0, _) => 0,
        (_, 0..=4) => BASE - DAY + mix(h) % (2 * DAY),
        (_, 5 | 6) => mix(h),
        _ => SPECIAL[(h >> 8) as usize % SPECIAL.len()],
    }
}

fn timestamp() -> BoxedStrategy<u64> {
    any::<u64>().prop_map(timestamp_from).boxed()
}

/// Dropped-attribute counts and the like: mostly 0, sometimes small, `u32::MAX` or anything.
fn count32() -> BoxedStrategy<u32> {
    any::<u64>()
        .prop_map(|seed| {
            let h = mix(seed);
            match (seed, h % 8) {
                (0, _) | (_, 0..=4) => 0,
                (_, 5) => 1 + (h >> 8) as u32 % 9,
                (_, 6) => u32::MAX,
                _ => (h >> 32) as u32,
            }
        })
        .boxed()
}

/// Flags: mostly 0 or 1 (sampled), sometimes the remote-context bits, sometimes anything.
fn flags32() -> BoxedStrategy<u32> {
    any::<u64>()
        .prop_map(|seed| {
            let h = mix(seed);
            match (seed, h % 8) {
                (0, _) | (_, 0..=3) => 0,
                (_, 4 | 5) => 1,
                (_, 6) => 0x301,
                _ => (h >> 32) as u32,
            }
        })
        .boxed()
}

fn bytes_from(seed: u64) -> Vec<u8> {
    let h = mix(seed);
    let len = if seed == 0 { 0 } else { (h % 9) as usize };
    mix(h).to_le_bytes()[..len].to_vec()
}

/// Empty or exactly 16 bytes.
fn trace_id() -> BoxedStrategy<Vec<u8>> {
    (any::<bool>(), any::<u128>())
        .prop_map(|(present, id)| if present { id.to_be_bytes().to_vec() } else { Vec::new() })
        .boxed()
}

/// Empty or exactly 8 bytes.
fn span_id() -> BoxedStrategy<Vec<u8>> {
    (any::<bool>(), any::<u64>())
        .prop_map(|(present, id)| if present { id.to_be_bytes().to_vec() } else { Vec::new() })
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Common

/// Mostly 0; one in 31 is a nonzero string-table index (meaningful only in profiles).
fn key_strindex() -> BoxedStrategy<i32> {
    any::<u64>()
        .prop_map(|seed| {
            let h = mix(seed);
            if seed != 0 && h.is_multiple_of(31) {
                1 + (h >> 8) as i32 % 1000
            } else {
                0
            }
        })
        .boxed()
}

/// A non-nested `AnyValue`: string, int, double, bool, bytes, or `value: None`. Seed 0 is the
/// empty string.
fn scalar_from(kind: u64, payload: u64) -> AnyValue {
    use any_value::Value;
    let class = if kind == 0 { 0 } else { mix(kind) % 11 };
    let value = match class {
        0..=3 => Some(Value::StringValue(string_from(payload))),
        4 | 5 => Some(Value::IntValue(int64_from(payload))),
        6 | 7 => Some(Value::DoubleValue(double_from(payload))),
        8 => Some(Value::BoolValue(payload % 2 == 1)),
        9 => Some(Value::BytesValue(bytes_from(payload))),
        _ => None,
    };
    AnyValue { value }
}

fn scalar_value() -> BoxedStrategy<AnyValue> {
    (any::<u64>(), any::<u64>())
        .prop_map(|(kind, payload)| scalar_from(kind, payload))
        .boxed()
}

/// Any `AnyValue`, arrays and kvlists nested up to depth 3, `value: None` included.
fn any_value() -> BoxedStrategy<AnyValue> {
    nested_value(3)
}

/// A scalar, or (when `depth > 0`) an array or kvlist of values nested at most `depth - 1` deeper.
///
/// Built level by level rather than with `prop_recursive`, which rebuilds its strategy on every
/// draw and made 256 cases take seconds in debug builds.
fn nested_value(depth: u32) -> BoxedStrategy<AnyValue> {
    if depth == 0 {
        return scalar_value();
    }
    let inner = nested_value(depth - 1);
    let array = vec(inner.clone(), 0..=3).prop_map(|values| AnyValue {
        value: Some(any_value::Value::ArrayValue(ArrayValue { values })),
    });
    let pair = (key(), maybe(9, 1, inner), key_strindex()).prop_map(|(key, value, key_strindex)| KeyValue {
        key: if key_strindex == 0 { key } else { String::new() },
        value,
        key_strindex,
    });
    let kvlist = vec(pair, 0..=3).prop_map(|kvs| AnyValue {
        value: Some(any_value::Value::KvlistValue(KeyValueList {
            values: unique_keys(kvs),
        })),
    });
    prop_oneof![6 => scalar_value(), 1 => array, 1 => kvlist].boxed()
}

/// An attribute key: never empty (the data model forbids empty keys), often awkward.
fn key_from(seed: u64) -> String {
    const PLAIN: [&str; 4] = ["k", "service.name", "http.method", "a.b.c"];
    let key = string_from(seed);
    if key.is_empty() {
        PLAIN[(mix(seed) >> 8) as usize % PLAIN.len()].to_owned()
    } else {
        key
    }
}

fn key() -> BoxedStrategy<String> {
    any::<u64>().prop_map(key_from).boxed()
}

/// A key/value pair. With a nonzero `key_strindex` the key is empty, as the schema requires.
fn key_value() -> BoxedStrategy<KeyValue> {
    (key(), maybe(9, 1, any_value()), key_strindex())
        .prop_map(|(key, value, key_strindex)| KeyValue {
            key: if key_strindex == 0 { key } else { String::new() },
            value,
            key_strindex,
        })
        .boxed()
}

/// Keeps the first pair of each key: keys in one list must be unique.
fn unique_keys(mut kvs: Vec<KeyValue>) -> Vec<KeyValue> {
    let mut seen = std::collections::HashSet::new();
    kvs.retain(|kv| seen.insert((kv.key.clone(), kv.key_strindex)));
    kvs
}

/// 0–4 pairs with unique keys.
fn attributes() -> BoxedStrategy<Vec<KeyValue>> {
    vec(key_value(), 0..=4).prop_map(unique_keys).boxed()
}

/// 0–2 pairs with unique keys, for nested things (events, links, exemplars, metadata), to keep
/// generation quick.
fn small_attributes() -> BoxedStrategy<Vec<KeyValue>> {
    vec(key_value(), 0..=2).prop_map(unique_keys).boxed()
}

/// An entity reference before its keys are chosen: schema URL, type, and seeds that pick the
/// id and description keys among the resource's attribute keys.
type EntityDraft = (String, String, Vec<u64>, Vec<u64>);

/// Entity references whose keys are drawn from `attributes`, as the schema requires; none when no
/// attribute has a string key.
fn entity_refs(attributes: &[KeyValue], drafts: Vec<EntityDraft>) -> Vec<EntityRef> {
    let keys: Vec<&str> = attributes
        .iter()
        .map(|kv| kv.key.as_str())
        .filter(|k| !k.is_empty())
        .collect();
    if keys.is_empty() {
        return Vec::new();
    }
    let pick = |picks: Vec<u64>| {
        let mut chosen: Vec<String> = Vec::new();
        for p in picks {
            let key = keys[p as usize % keys.len()];
            if !chosen.iter().any(|c| c == key) {
                chosen.push(key.to_owned());
            }
        }
        chosen
    };
    drafts
        .into_iter()
        .map(|(schema_url, r#type, id_picks, description_picks)| EntityRef {
            schema_url,
            r#type,
            id_keys: pick(id_picks),
            description_keys: pick(description_picks),
        })
        .collect()
}

fn resource() -> BoxedStrategy<Option<Resource>> {
    let draft = (schema_url(), key(), vec(any::<u64>(), 1..=2), vec(any::<u64>(), 0..=2));
    let drafts = prop_oneof![2 => Just(Vec::new()), 1 => vec(draft, 1..=2)];
    maybe(
        9,
        1,
        (attributes(), count32(), drafts).prop_map(|(attributes, dropped_attributes_count, drafts)| Resource {
            entity_refs: entity_refs(&attributes, drafts),
            attributes,
            dropped_attributes_count,
        }),
    )
    .boxed()
}

fn scope() -> BoxedStrategy<Option<InstrumentationScope>> {
    maybe(
        9,
        1,
        (string(), string(), attributes(), count32()).prop_map(
            |(name, version, attributes, dropped_attributes_count)| InstrumentationScope {
                name,
                version,
                attributes,
                dropped_attributes_count,
            },
        ),
    )
    .boxed()
}

/// Sometimes gives the second scope group the first one's scope and schema URL.
fn duplicate_scope<T>(groups: &mut [T], duplicate: bool, copy: impl Fn(&T, &mut T)) {
    if duplicate && groups.len() >= 2 {
        let (first, rest) = groups.split_at_mut(1);
        copy(&first[0], &mut rest[0]);
    }
}

// ---------------------------------------------------------------------------------------------
// Logs

fn resource_logs() -> BoxedStrategy<ResourceLogs> {
    (
        resource(),
        vec(scope_logs(), SCOPES),
        schema_url(),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(resource, mut scope_logs, schema_url, duplicate)| {
            duplicate_scope(&mut scope_logs, duplicate, |a, b| {
                b.scope = a.scope.clone();
                b.schema_url = a.schema_url.clone();
            });
            ResourceLogs {
                resource,
                scope_logs,
                schema_url,
            }
        })
        .boxed()
}

fn scope_logs() -> BoxedStrategy<ScopeLogs> {
    (scope(), vec(log_record(), LEAVES), schema_url())
        .prop_map(|(scope, log_records, schema_url)| ScopeLogs {
            scope,
            log_records,
            schema_url,
        })
        .boxed()
}

fn severity_text() -> BoxedStrategy<String> {
    string_or(&["", "", "INFO", "ERROR"])
}

fn log_record() -> BoxedStrategy<LogRecord> {
    (
        (timestamp(), timestamp(), 0..=24i32, severity_text()),
        (maybe(6, 1, any_value()), attributes(), count32(), flags32()),
        (trace_id(), span_id(), string()),
    )
        .prop_map(
            |(
                (time_unix_nano, observed_time_unix_nano, severity_number, severity_text),
                (body, attributes, dropped_attributes_count, flags),
                (trace_id, span_id, event_name),
            )| LogRecord {
                time_unix_nano,
                observed_time_unix_nano,
                severity_number,
                severity_text,
                body,
                attributes,
                dropped_attributes_count,
                flags,
                trace_id,
                span_id,
                event_name,
            },
        )
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Traces

fn resource_spans() -> BoxedStrategy<ResourceSpans> {
    (
        resource(),
        vec(scope_spans(), SCOPES),
        schema_url(),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(resource, mut scope_spans, schema_url, duplicate)| {
            duplicate_scope(&mut scope_spans, duplicate, |a, b| {
                b.scope = a.scope.clone();
                b.schema_url = a.schema_url.clone();
            });
            ResourceSpans {
                resource,
                scope_spans,
                schema_url,
            }
        })
        .boxed()
}

fn scope_spans() -> BoxedStrategy<ScopeSpans> {
    (scope(), vec(span(), LEAVES), schema_url())
        .prop_map(|(scope, spans, schema_url)| ScopeSpans {
            scope,
            spans,
            schema_url,
        })
        .boxed()
}

fn trace_state() -> BoxedStrategy<String> {
    string_or(&["", "", "", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"])
}

fn event() -> BoxedStrategy<span::Event> {
    (timestamp(), string(), small_attributes(), count32())
        .prop_map(
            |(time_unix_nano, name, attributes, dropped_attributes_count)| span::Event {
                time_unix_nano,
                name,
                attributes,
                dropped_attributes_count,
            },
        )
        .boxed()
}

fn link() -> BoxedStrategy<span::Link> {
    (
        trace_id(),
        span_id(),
        trace_state(),
        small_attributes(),
        count32(),
        flags32(),
    )
        .prop_map(
            |(trace_id, span_id, trace_state, attributes, dropped_attributes_count, flags)| span::Link {
                trace_id,
                span_id,
                trace_state,
                attributes,
                dropped_attributes_count,
                flags,
            },
        )
        .boxed()
}

fn status() -> BoxedStrategy<Option<Status>> {
    maybe(
        7,
        3,
        (string(), 0..=2i32).prop_map(|(message, code)| Status { message, code }),
    )
    .boxed()
}

fn span() -> BoxedStrategy<Span> {
    (
        (trace_id(), span_id(), trace_state(), span_id(), flags32()),
        (string(), 0..=5i32, timestamp(), timestamp()),
        (attributes(), count32(), vec(event(), 0..=2), count32()),
        (vec(link(), 0..=2), count32(), status()),
    )
        .prop_map(
            |(
                (trace_id, span_id, trace_state, parent_span_id, flags),
                (name, kind, start_time_unix_nano, end_time_unix_nano),
                (attributes, dropped_attributes_count, events, dropped_events_count),
                (links, dropped_links_count, status),
            )| Span {
                trace_id,
                span_id,
                trace_state,
                parent_span_id,
                flags,
                name,
                kind,
                start_time_unix_nano,
                end_time_unix_nano,
                attributes,
                dropped_attributes_count,
                events,
                dropped_events_count,
                links,
                dropped_links_count,
                status,
            },
        )
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Metrics

fn resource_metrics() -> BoxedStrategy<ResourceMetrics> {
    (
        resource(),
        vec(scope_metrics(), SCOPES),
        schema_url(),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(resource, mut scope_metrics, schema_url, duplicate)| {
            duplicate_scope(&mut scope_metrics, duplicate, |a, b| {
                b.scope = a.scope.clone();
                b.schema_url = a.schema_url.clone();
            });
            ResourceMetrics {
                resource,
                scope_metrics,
                schema_url,
            }
        })
        .boxed()
}

fn scope_metrics() -> BoxedStrategy<ScopeMetrics> {
    (scope(), vec(metric(), 0..=3), schema_url())
        .prop_map(|(scope, metrics, schema_url)| ScopeMetrics {
            scope,
            metrics,
            schema_url,
        })
        .boxed()
}

fn metric() -> BoxedStrategy<Metric> {
    let metadata = prop_oneof![3 => Just(Vec::new()), 1 => vec(key_value(), 1..=2).prop_map(unique_keys)];
    (string(), string(), string(), metadata, maybe(19, 1, metric_data()))
        .prop_map(|(name, description, unit, metadata, data)| Metric {
            name,
            description,
            unit,
            metadata,
            data,
        })
        .boxed()
}

/// Delta or cumulative: the schema forbids `UNSPECIFIED`.
fn temporality() -> BoxedStrategy<i32> {
    (1..=2i32).boxed()
}

fn metric_data() -> BoxedStrategy<metric::Data> {
    prop_oneof![
        vec(number_point(), LEAVES).prop_map(|data_points| metric::Data::Gauge(Gauge { data_points })),
        (vec(number_point(), LEAVES), temporality(), any::<bool>()).prop_map(
            |(data_points, aggregation_temporality, is_monotonic)| metric::Data::Sum(Sum {
                data_points,
                aggregation_temporality,
                is_monotonic,
            })
        ),
        (vec(histogram_point(), LEAVES), temporality()).prop_map(|(data_points, aggregation_temporality)| {
            metric::Data::Histogram(Histogram {
                data_points,
                aggregation_temporality,
            })
        }),
        (vec(exp_histogram_point(), LEAVES), temporality()).prop_map(|(data_points, aggregation_temporality)| {
            metric::Data::ExponentialHistogram(ExponentialHistogram {
                data_points,
                aggregation_temporality,
            })
        }),
        vec(summary_point(), LEAVES).prop_map(|data_points| metric::Data::Summary(Summary { data_points })),
    ]
    .boxed()
}

fn exemplar() -> BoxedStrategy<Exemplar> {
    let value = prop_oneof![
        2 => double().prop_map(|d| Some(exemplar::Value::AsDouble(d))),
        2 => int64().prop_map(|i| Some(exemplar::Value::AsInt(i))),
        1 => Just(None),
    ];
    (small_attributes(), timestamp(), span_id(), trace_id(), value)
        .prop_map(
            |(filtered_attributes, time_unix_nano, span_id, trace_id, value)| Exemplar {
                filtered_attributes,
                time_unix_nano,
                span_id,
                trace_id,
                value,
            },
        )
        .boxed()
}

fn exemplars() -> BoxedStrategy<Vec<Exemplar>> {
    prop_oneof![2 => Just(Vec::new()), 1 => vec(exemplar(), 1..=2)].boxed()
}

fn number_point() -> BoxedStrategy<NumberDataPoint> {
    let value = prop_oneof![
        2 => double().prop_map(|d| Some(number_data_point::Value::AsDouble(d))),
        2 => int64().prop_map(|i| Some(number_data_point::Value::AsInt(i))),
        1 => Just(None),
    ];
    (attributes(), timestamp(), timestamp(), exemplars(), flags32(), value)
        .prop_map(
            |(attributes, start_time_unix_nano, time_unix_nano, exemplars, flags, value)| NumberDataPoint {
                attributes,
                start_time_unix_nano,
                time_unix_nano,
                exemplars,
                flags,
                value,
            },
        )
        .boxed()
}

/// Strictly increasing finite bounds (`-0.0` and `0.0` count as equal).
fn bounds() -> BoxedStrategy<Vec<f64>> {
    let bound = prop_oneof![
        2 => prop::sample::select(&[0.0, -0.0, 1.0, 5.0, 10.0, 100.0, -1.0, f64::MIN_POSITIVE][..]),
        1 => any::<u64>().prop_map(|seed| Some(double_from(seed)).filter(|d| d.is_finite()).unwrap_or(f64::MAX)),
    ];
    vec(bound, 0..=4)
        .prop_map(|mut bounds| {
            bounds.sort_by(f64::total_cmp);
            bounds.dedup_by(|a, b| a == b);
            bounds
        })
        .boxed()
}

fn histogram_point() -> BoxedStrategy<HistogramDataPoint> {
    let buckets = bounds().prop_flat_map(|bounds| {
        let n = bounds.len() + 1;
        (
            Just(bounds),
            prop_oneof![3 => vec(0..1_000u64, n).prop_map(Some), 1 => Just(None)],
            any::<u64>(),
        )
    });
    (
        (attributes(), timestamp(), timestamp(), buckets),
        (maybe_double(), exemplars(), flags32(), maybe_double(), maybe_double()),
    )
        .prop_map(
            |(
                (attributes, start_time_unix_nano, time_unix_nano, (explicit_bounds, bucket_counts, free_count)),
                (sum, exemplars, flags, min, max),
            )| {
                // With buckets the count is their sum; without, there are no bounds either and the
                // count is free.
                let (count, bucket_counts, explicit_bounds) = match bucket_counts {
                    Some(counts) => (counts.iter().sum(), counts, explicit_bounds),
                    None => (free_count, Vec::new(), Vec::new()),
                };
                HistogramDataPoint {
                    attributes,
                    start_time_unix_nano,
                    time_unix_nano,
                    count,
                    sum,
                    bucket_counts,
                    explicit_bounds,
                    exemplars,
                    flags,
                    min,
                    max,
                }
            },
        )
        .boxed()
}

fn exp_buckets() -> BoxedStrategy<Option<exponential_histogram_data_point::Buckets>> {
    maybe(
        1,
        1,
        (-1_000..=1_000i32, vec(0..1_000u64, 0..=4))
            .prop_map(|(offset, bucket_counts)| exponential_histogram_data_point::Buckets { offset, bucket_counts }),
    )
    .boxed()
}

fn exp_histogram_point() -> BoxedStrategy<ExponentialHistogramDataPoint> {
    let zero_threshold = prop_oneof![3 => prop::sample::select(&[0.0, 0.0, 1e-9][..]), 1 => 0.0..1e3f64];
    (
        (attributes(), timestamp(), timestamp(), maybe_double(), -10..=20i32),
        (0..1_000u64, exp_buckets(), exp_buckets(), flags32(), exemplars()),
        (maybe_double(), maybe_double(), zero_threshold),
    )
        .prop_map(
            |(
                (attributes, start_time_unix_nano, time_unix_nano, sum, scale),
                (zero_count, positive, negative, flags, exemplars),
                (min, max, zero_threshold),
            )| {
                let total = |b: &Option<exponential_histogram_data_point::Buckets>| {
                    b.as_ref().map_or(0, |b| b.bucket_counts.iter().sum::<u64>())
                };
                ExponentialHistogramDataPoint {
                    attributes,
                    start_time_unix_nano,
                    time_unix_nano,
                    count: zero_count + total(&positive) + total(&negative),
                    sum,
                    scale,
                    zero_count,
                    positive,
                    negative,
                    flags,
                    exemplars,
                    min,
                    max,
                    zero_threshold,
                }
            },
        )
        .boxed()
}

fn summary_point() -> BoxedStrategy<SummaryDataPoint> {
    let quantile = prop_oneof![prop::sample::select(&[0.0, 0.5, 0.99, 1.0][..]), 0.0..=1.0f64];
    // Quantiles strictly increasing, values not negative (NaN, +inf and -0.0 stay in).
    let quantile_values = vec((quantile, double()), 0..=4).prop_map(|mut pairs| {
        pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
        pairs.dedup_by(|a, b| a.0 == b.0);
        pairs
            .into_iter()
            .map(|(quantile, value)| summary_data_point::ValueAtQuantile {
                quantile,
                value: if value < 0.0 { -value } else { value },
            })
            .collect::<Vec<_>>()
    });
    (
        attributes(),
        timestamp(),
        timestamp(),
        any::<u64>(),
        double(),
        quantile_values,
        flags32(),
    )
        .prop_map(
            |(attributes, start_time_unix_nano, time_unix_nano, count, sum, quantile_values, flags)| SummaryDataPoint {
                attributes,
                start_time_unix_nano,
                time_unix_nano,
                count,
                sum,
                quantile_values,
                flags,
            },
        )
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flatten;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    use prost::Message;

    fn ids_ok(trace_id: &[u8], span_id: &[u8]) -> bool {
        matches!(trace_id.len(), 0 | 16) && matches!(span_id.len(), 0 | 8)
    }

    proptest! {
        #[test]
        fn logs_survive_encode_decode(req in logs_request()) {
            let decoded = ExportLogsServiceRequest::decode(req.encode_to_vec().as_slice())
                .expect("prost decodes what it encoded");
            prop_assert_eq!(flatten::logs(&req), flatten::logs(&decoded));
        }

        #[test]
        fn traces_survive_encode_decode(req in traces_request()) {
            let decoded = ExportTraceServiceRequest::decode(req.encode_to_vec().as_slice())
                .expect("prost decodes what it encoded");
            prop_assert_eq!(flatten::traces(&req), flatten::traces(&decoded));
        }

        #[test]
        fn metrics_survive_encode_decode(req in metrics_request()) {
            let decoded = ExportMetricsServiceRequest::decode(req.encode_to_vec().as_slice())
                .expect("prost decodes what it encoded");
            prop_assert_eq!(flatten::metrics(&req), flatten::metrics(&decoded));
        }

        #[test]
        fn logs_are_valid_and_small(req in logs_request()) {
            prop_assert!(req.resource_logs.len() <= 4);
            for rl in &req.resource_logs {
                prop_assert!(resource_ok(&rl.resource));
                prop_assert!(rl.scope_logs.len() <= 3);
                for sl in &rl.scope_logs {
                    prop_assert!(scope_ok(&sl.scope));
                    prop_assert!(sl.log_records.len() <= 5);
                    for r in &sl.log_records {
                        prop_assert!(ids_ok(&r.trace_id, &r.span_id));
                        prop_assert!((0..=24).contains(&r.severity_number));
                        prop_assert!(attributes_ok(&r.attributes));
                        prop_assert!(r.body.as_ref().is_none_or(value_ok));
                    }
                }
            }
        }

        #[test]
        fn traces_are_valid(req in traces_request()) {
            for rs in &req.resource_spans {
                prop_assert!(resource_ok(&rs.resource));
                for ss in &rs.scope_spans {
                    prop_assert!(scope_ok(&ss.scope));
                    for s in &ss.spans {
                        prop_assert!(ids_ok(&s.trace_id, &s.span_id));
                        prop_assert!(matches!(s.parent_span_id.len(), 0 | 8));
                        prop_assert!((0..=5).contains(&s.kind));
                        prop_assert!(s.status.as_ref().is_none_or(|st| (0..=2).contains(&st.code)));
                        prop_assert!(attributes_ok(&s.attributes));
                        prop_assert!(s.events.iter().all(|e| attributes_ok(&e.attributes)));
                        prop_assert!(s.links.iter().all(|l| ids_ok(&l.trace_id, &l.span_id) && attributes_ok(&l.attributes)));
                    }
                }
            }
        }

        #[test]
        fn metrics_are_valid(req in metrics_request()) {
            for rm in &req.resource_metrics {
                prop_assert!(resource_ok(&rm.resource));
                for sm in &rm.scope_metrics {
                    prop_assert!(scope_ok(&sm.scope));
                    for m in &sm.metrics {
                        prop_assert!(attributes_ok(&m.metadata));
                        metric_ok(m)?;
                    }
                }
            }
        }

        /// One resource group per scope group: same flattened form.
        #[test]
        fn splitting_groups_keeps_the_flattened_form(req in logs_request()) {
            let split: Vec<ResourceLogs> = req
                .resource_logs
                .iter()
                .flat_map(|rl| rl.scope_logs.iter().map(|sl| ResourceLogs { scope_logs: vec![sl.clone()], ..rl.clone() }))
                .collect();
            let split = ExportLogsServiceRequest { resource_logs: split };
            prop_assert_eq!(flatten::logs(&req), flatten::logs(&split));
        }
    }

    fn exemplars_ok(exemplars: &[Exemplar]) -> bool {
        exemplars
            .iter()
            .all(|e| ids_ok(&e.trace_id, &e.span_id) && attributes_ok(&e.filtered_attributes))
    }

    fn metric_ok(m: &Metric) -> Result<(), TestCaseError> {
        match &m.data {
            None => {}
            Some(metric::Data::Gauge(g)) => {
                for p in &g.data_points {
                    prop_assert!(attributes_ok(&p.attributes) && exemplars_ok(&p.exemplars));
                }
            }
            Some(metric::Data::Sum(s)) => {
                prop_assert!((1..=2).contains(&s.aggregation_temporality));
                for p in &s.data_points {
                    prop_assert!(attributes_ok(&p.attributes) && exemplars_ok(&p.exemplars));
                }
            }
            Some(metric::Data::Histogram(h)) => {
                prop_assert!((1..=2).contains(&h.aggregation_temporality));
                for p in &h.data_points {
                    prop_assert!(attributes_ok(&p.attributes) && exemplars_ok(&p.exemplars));
                    prop_assert!(p.explicit_bounds.windows(2).all(|w| w[0] < w[1]));
                    prop_assert!(p.explicit_bounds.iter().all(|b| b.is_finite()));
                    if p.bucket_counts.is_empty() {
                        prop_assert!(p.explicit_bounds.is_empty());
                    } else {
                        prop_assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
                        prop_assert_eq!(p.bucket_counts.iter().sum::<u64>(), p.count);
                    }
                }
            }
            Some(metric::Data::ExponentialHistogram(h)) => {
                prop_assert!((1..=2).contains(&h.aggregation_temporality));
                for p in &h.data_points {
                    prop_assert!(attributes_ok(&p.attributes) && exemplars_ok(&p.exemplars));
                    let total = |b: &Option<exponential_histogram_data_point::Buckets>| {
                        b.as_ref().map_or(0, |b| b.bucket_counts.iter().sum::<u64>())
                    };
                    prop_assert_eq!(p.zero_count + total(&p.positive) + total(&p.negative), p.count);
                    prop_assert!(p.zero_threshold >= 0.0);
                }
            }
            Some(metric::Data::Summary(s)) => {
                for p in &s.data_points {
                    prop_assert!(attributes_ok(&p.attributes));
                    let q = &p.quantile_values;
                    prop_assert!(
                        q.iter()
                            .all(|q| (0.0..=1.0).contains(&q.quantile) && (q.value.is_nan() || q.value >= 0.0))
                    );
                    prop_assert!(q.windows(2).all(|w| w[0].quantile < w[1].quantile));
                }
            }
        }
        Ok(())
    }

    /// Keys unique and non-empty (empty only when a string-table index stands in), recursively.
    fn attributes_ok(kvs: &[KeyValue]) -> bool {
        let mut seen = std::collections::HashSet::new();
        kvs.iter().all(|kv| {
            seen.insert((kv.key.as_str(), kv.key_strindex))
                && kv.key.is_empty() == (kv.key_strindex != 0)
                && kv.value.as_ref().is_none_or(value_ok)
        })
    }

    fn value_ok(v: &AnyValue) -> bool {
        match &v.value {
            Some(any_value::Value::KvlistValue(l)) => attributes_ok(&l.values),
            Some(any_value::Value::ArrayValue(a)) => a.values.iter().all(value_ok),
            _ => true,
        }
    }

    /// Attributes valid; entity references typed, with id keys, all keys among the attributes.
    fn resource_ok(resource: &Option<Resource>) -> bool {
        resource.as_ref().is_none_or(|r| {
            attributes_ok(&r.attributes)
                && r.entity_refs.iter().all(|e| {
                    !e.r#type.is_empty()
                        && !e.id_keys.is_empty()
                        && e.id_keys
                            .iter()
                            .chain(&e.description_keys)
                            .all(|k| r.attributes.iter().any(|kv| &kv.key == k))
                })
        })
    }

    fn scope_ok(scope: &Option<InstrumentationScope>) -> bool {
        scope.as_ref().is_none_or(|s| attributes_ok(&s.attributes))
    }

    /// Draws `n` values from `strategy` with a fixed seed.
    fn sample<S: Strategy>(strategy: S, n: usize) -> Vec<S::Value> {
        let mut runner = TestRunner::deterministic();
        (0..n)
            .map(|_| {
                strategy
                    .new_tree(&mut runner)
                    .expect("strategies here never reject")
                    .current()
            })
            .collect()
    }

    fn walk_value(v: &AnyValue, depth: usize, seen: &mut Seen) {
        seen.max_depth = seen.max_depth.max(depth);
        match &v.value {
            None => seen.value_none = true,
            Some(any_value::Value::DoubleValue(d)) => {
                seen.nan |= d.is_nan();
                seen.neg_zero |= *d == 0.0 && d.is_sign_negative();
                seen.inf |= d.is_infinite();
            }
            Some(any_value::Value::IntValue(i)) => seen.int_extreme |= *i == i64::MIN || *i == i64::MAX,
            Some(any_value::Value::BytesValue(_)) => seen.bytes = true,
            Some(any_value::Value::ArrayValue(a)) => a.values.iter().for_each(|v| walk_value(v, depth + 1, seen)),
            Some(any_value::Value::KvlistValue(l)) => l.values.iter().for_each(|kv| walk_kv(kv, depth + 1, seen)),
            Some(any_value::Value::StringValue(s)) => seen.empty_string |= s.is_empty(),
            _ => {}
        }
    }

    fn walk_kv(kv: &KeyValue, depth: usize, seen: &mut Seen) {
        seen.key_strindex |= kv.key_strindex != 0;
        match &kv.value {
            Some(v) => walk_value(v, depth, seen),
            None => seen.kv_none = true,
        }
    }

    #[derive(Debug, Default)]
    struct Seen {
        max_depth: usize,
        value_none: bool,
        kv_none: bool,
        nan: bool,
        neg_zero: bool,
        inf: bool,
        int_extreme: bool,
        bytes: bool,
        empty_string: bool,
        key_strindex: bool,
        body_none: bool,
        body_kinds: std::collections::HashSet<u8>,
        duplicate_resource: bool,
        entity_refs: bool,
        schema_url: bool,
        max_timestamp: bool,
    }

    #[test]
    fn logs_cover_the_edge_cases() {
        let mut seen = Seen::default();
        for req in sample(logs_request(), 256) {
            let groups = &req.resource_logs;
            seen.duplicate_resource |= groups.len() >= 2 && groups[0].resource == groups[1].resource;
            for rl in groups {
                seen.schema_url |= !rl.schema_url.is_empty();
                if let Some(r) = &rl.resource {
                    seen.entity_refs |= !r.entity_refs.is_empty();
                    r.attributes.iter().for_each(|kv| walk_kv(kv, 0, &mut seen));
                }
                for r in rl.scope_logs.iter().flat_map(|sl| &sl.log_records) {
                    seen.max_timestamp |= r.time_unix_nano == u64::MAX;
                    r.attributes.iter().for_each(|kv| walk_kv(kv, 0, &mut seen));
                    match &r.body {
                        None => seen.body_none = true,
                        Some(body) => {
                            // The oneof tag of the body, 0 for `value: None`.
                            let tag = body.encode_to_vec().first().map_or(0, |b| b >> 3);
                            seen.body_kinds.insert(tag);
                            walk_value(body, 0, &mut seen);
                        }
                    }
                }
            }
        }
        assert!(seen.max_depth >= 3, "{seen:?}");
        assert!(
            seen.value_none && seen.kv_none && seen.nan && seen.neg_zero && seen.inf,
            "{seen:?}"
        );
        assert!(
            seen.int_extreme && seen.bytes && seen.empty_string && seen.key_strindex,
            "{seen:?}"
        );
        assert!(
            seen.body_none && seen.duplicate_resource && seen.entity_refs && seen.schema_url,
            "{seen:?}"
        );
        assert!(seen.max_timestamp, "{seen:?}");
        // Empty, string, bool, int, double, array, kvlist, bytes.
        assert_eq!(seen.body_kinds.len(), 8, "{seen:?}");
    }

    #[test]
    fn metrics_cover_every_type_and_option() {
        let (mut kinds, mut metadata, mut no_sum, mut with_sum, mut empty_exp, mut filtered) =
            (std::collections::HashSet::new(), false, false, false, false, false);
        let mut point_values = std::collections::HashSet::new();
        for req in sample(metrics_request(), 256) {
            for m in req
                .resource_metrics
                .iter()
                .flat_map(|rm| &rm.scope_metrics)
                .flat_map(|sm| &sm.metrics)
            {
                metadata |= !m.metadata.is_empty();
                let Some(data) = &m.data else {
                    kinds.insert("none");
                    continue;
                };
                match data {
                    metric::Data::Gauge(g) => {
                        kinds.insert("gauge");
                        for p in &g.data_points {
                            point_values.insert(match p.value {
                                None => "none",
                                Some(number_data_point::Value::AsInt(_)) => "int",
                                Some(number_data_point::Value::AsDouble(_)) => "double",
                            });
                            filtered |= p.exemplars.iter().any(|e| !e.filtered_attributes.is_empty());
                        }
                    }
                    metric::Data::Sum(_) => {
                        kinds.insert("sum");
                    }
                    metric::Data::Histogram(h) => {
                        kinds.insert("histogram");
                        no_sum |= h.data_points.iter().any(|p| p.sum.is_none() && p.min.is_none());
                        with_sum |= h.data_points.iter().any(|p| p.sum.is_some() && p.max.is_some());
                    }
                    metric::Data::ExponentialHistogram(h) => {
                        kinds.insert("exp");
                        empty_exp |= h
                            .data_points
                            .iter()
                            .any(|p| p.positive.as_ref().is_some_and(|b| b.bucket_counts.is_empty()));
                    }
                    metric::Data::Summary(_) => {
                        kinds.insert("summary");
                    }
                }
            }
        }
        assert_eq!(kinds.len(), 6, "{kinds:?}");
        assert_eq!(point_values.len(), 3);
        assert!(metadata && no_sum && with_sum && empty_exp && filtered);
    }

    #[test]
    fn traces_cover_status_events_and_links() {
        let (mut no_status, mut status, mut parent, mut event_attrs, mut link_attrs, mut state) =
            (false, false, false, false, false, false);
        for req in sample(traces_request(), 256) {
            for s in req
                .resource_spans
                .iter()
                .flat_map(|rs| &rs.scope_spans)
                .flat_map(|ss| &ss.spans)
            {
                no_status |= s.status.is_none();
                status |= s.status.is_some();
                parent |= !s.parent_span_id.is_empty();
                state |= !s.trace_state.is_empty();
                event_attrs |= s.events.iter().any(|e| !e.attributes.is_empty());
                link_attrs |= s.links.iter().any(|l| !l.attributes.is_empty());
            }
        }
        assert!(no_status && status && parent && event_attrs && link_attrs && state);
    }
}
