//! The label model: how an OTel log record becomes a Loki entry (labels
//! and a line), the way Loki 3 maps OTLP.
//!
//! - Attribute names become label names with every character outside
//!   `[A-Za-z0-9_]` replaced by `_` (and a leading digit prefixed by `_`).
//! - Stream (index) labels are the resource attributes of [`INDEX`];
//!   `service_name` is `unknown_service` when the resource has none.
//! - Everything else is structured metadata, in this order: the other
//!   resource attributes, `scope_name`, `scope_version`, the scope's
//!   attributes, the record's attributes, `severity_text`,
//!   `severity_number`, `trace_id`, `span_id` (lowercase hex), `flags`,
//!   `observed_timestamp`, `detected_level`. On a name collision the first
//!   wins (stream labels before metadata).
//! - Values are text: strings as they are, numbers and booleans printed,
//!   bytes as lowercase hex, arrays as JSON, maps flattened with `_`.
//! - The line is a string body as it is; any other body is its JSON. Line
//!   filters see a non-string body as the empty string (as the native
//!   API's filters do), until `line_format` sets a line.

use mira_core::convert::LogRow;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};

/// Stream labels: (Loki label, OTel resource attribute); the one table
/// the ingester's Loki push maps back through.
pub use mira_core::convert::logs::LOKI_INDEX as INDEX;

/// `service_name` of a resource without `service.name`.
pub const UNKNOWN_SERVICE: &str = "unknown_service";

/// Structured-metadata labels every record may carry besides its
/// attributes (listed by `/labels` when present in the window).
pub const FIELDS: [&str; 9] = [
    "scope_name",
    "scope_version",
    "severity_text",
    "severity_number",
    "trace_id",
    "span_id",
    "flags",
    "observed_timestamp",
    "detected_level",
];

/// Where a label comes from (Loki's `categorize-labels` kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cat {
    Stream,
    Meta,
    Parsed,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    pub name: String,
    pub value: String,
    pub cat: Cat,
}

/// One log entry on its way through a pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Unix nanoseconds.
    pub ts: u64,
    pub line: String,
    /// False for a non-string body: line filters then read "".
    pub line_is_text: bool,
    pub labels: Vec<Label>,
}

impl Entry {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|l| l.name == name).map(|l| l.value.as_str())
    }

    /// Sets `name`, replacing its value (and keeping its kind) when it
    /// exists.
    pub fn set(&mut self, name: &str, value: String, cat: Cat) {
        match self.labels.iter_mut().find(|l| l.name == name) {
            Some(l) => l.value = value,
            None => self.labels.push(Label {
                name: name.to_owned(),
                value,
                cat,
            }),
        }
    }

    /// Adds a label unless one of that name exists (first wins).
    fn add(&mut self, name: String, value: String, cat: Cat) {
        if !self.labels.iter().any(|l| l.name == name) {
            self.labels.push(Label { name, value, cat });
        }
    }

    pub fn remove(&mut self, name: &str) {
        self.labels.retain(|l| l.name != name);
    }

    /// The text line filters test.
    pub fn filter_text(&self) -> &str {
        if self.line_is_text { &self.line } else { "" }
    }

    /// All labels as sorted (name, value) pairs.
    pub fn sorted(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self.labels.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
        v.sort();
        v
    }

    /// The labels of one kind, sorted.
    pub fn of(&self, cat: Cat) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .labels
            .iter()
            .filter(|l| l.cat == cat)
            .map(|l| (l.name.clone(), l.value.clone()))
            .collect();
        v.sort();
        v
    }
}

/// A Loki label name for an attribute key.
pub fn label_name(key: &str) -> String {
    let mut out: String = key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// The OTel resource attribute behind a stream label.
pub fn index_key(label: &str) -> Option<&'static str> {
    INDEX.iter().find(|(l, _)| *l == label).map(|(_, k)| *k)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn json_of(v: &AnyValue) -> serde_json::Value {
    use serde_json::Value as J;
    match &v.value {
        None => J::Null,
        Some(Value::StringValue(s)) => J::String(s.clone()),
        Some(Value::BoolValue(b)) => J::Bool(*b),
        Some(Value::IntValue(i)) => J::from(*i),
        Some(Value::DoubleValue(d)) => serde_json::Number::from_f64(*d).map_or(J::Null, J::Number),
        Some(Value::BytesValue(b)) => J::String(hex(b)),
        Some(Value::ArrayValue(a)) => J::Array(a.values.iter().map(json_of).collect()),
        Some(Value::StringValueStrindex(i)) => J::from(*i),
        Some(Value::KvlistValue(kv)) => J::Object(
            kv.values
                .iter()
                .map(|e| (e.key.clone(), e.value.as_ref().map_or(J::Null, json_of)))
                .collect(),
        ),
    }
}

/// A scalar value's text (None for maps, which are flattened).
fn text_of(v: &AnyValue) -> Option<String> {
    Some(match &v.value {
        None => String::new(),
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BytesValue(b)) => hex(b),
        Some(Value::ArrayValue(_)) => json_of(v).to_string(),
        Some(Value::StringValueStrindex(i)) => i.to_string(),
        Some(Value::KvlistValue(_)) => return None,
    })
}

/// Adds `prefix` = value, maps flattened with `_`.
fn add_attr(e: &mut Entry, prefix: &str, v: &AnyValue, cat: Cat) {
    match (&v.value, text_of(v)) {
        (_, Some(t)) => e.add(label_name(prefix), t, cat),
        (Some(Value::KvlistValue(kv)), None) => {
            for inner in &kv.values {
                if let Some(iv) = &inner.value {
                    add_attr(e, &format!("{prefix}_{}", inner.key), iv, cat);
                }
            }
        }
        _ => {}
    }
}

fn add_attrs(e: &mut Entry, attrs: &[KeyValue], cat: Cat, skip: impl Fn(&str) -> bool) {
    for kv in attrs {
        if skip(&kv.key) {
            continue;
        }
        if let Some(v) = &kv.value {
            add_attr(e, &kv.key, v, cat);
        }
    }
}

/// `detected_level` from the severity text, else its number.
pub fn detected_level(text: &str, number: i32) -> &'static str {
    match text.trim().to_ascii_lowercase().as_str() {
        "trace" | "trc" => return "trace",
        "debug" | "dbug" | "dbg" => return "debug",
        "info" | "inf" | "information" | "informational" | "notice" => return "info",
        "warn" | "wrn" | "warning" => return "warn",
        "error" | "err" | "eror" => return "error",
        "fatal" | "critical" | "crit" | "emerg" | "emergency" | "alert" | "panic" => return "fatal",
        _ => {}
    }
    match number {
        1..=4 => "trace",
        5..=8 => "debug",
        9..=12 => "info",
        13..=16 => "warn",
        17..=20 => "error",
        21..=24 => "fatal",
        _ => "unknown",
    }
}

/// The Loki entry of a stored record at `ts`.
pub fn entry(row: &LogRow, ts: u64) -> Entry {
    let r = &row.record;
    let (line, line_is_text) = match r.body.as_ref().and_then(|b| b.value.as_ref()) {
        Some(Value::StringValue(s)) => (s.clone(), true),
        None => (String::new(), true),
        Some(_) => (r.body.as_ref().map(json_of).unwrap_or_default().to_string(), false),
    };
    let mut e = Entry {
        ts,
        line,
        line_is_text,
        labels: Vec::with_capacity(16),
    };
    let resource: &[KeyValue] = row.resource.as_ref().map_or(&[], |r| &r.attributes);
    for (label, key) in INDEX {
        if let Some(v) = resource
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            && let Some(t) = text_of(v)
        {
            e.add(label.to_owned(), t, Cat::Stream);
        }
    }
    e.add("service_name".into(), UNKNOWN_SERVICE.into(), Cat::Stream);
    add_attrs(&mut e, resource, Cat::Meta, |k| INDEX.iter().any(|(_, key)| *key == k));
    if let Some(s) = &row.scope {
        if !s.name.is_empty() {
            e.add("scope_name".into(), s.name.clone(), Cat::Meta);
        }
        if !s.version.is_empty() {
            e.add("scope_version".into(), s.version.clone(), Cat::Meta);
        }
        add_attrs(&mut e, &s.attributes, Cat::Meta, |_| false);
    }
    add_attrs(&mut e, &r.attributes, Cat::Meta, |_| false);
    if !r.severity_text.is_empty() {
        e.add("severity_text".into(), r.severity_text.clone(), Cat::Meta);
    }
    if r.severity_number != 0 {
        e.add("severity_number".into(), r.severity_number.to_string(), Cat::Meta);
    }
    if !r.trace_id.is_empty() {
        e.add("trace_id".into(), hex(&r.trace_id), Cat::Meta);
    }
    if !r.span_id.is_empty() {
        e.add("span_id".into(), hex(&r.span_id), Cat::Meta);
    }
    if r.flags != 0 {
        e.add("flags".into(), r.flags.to_string(), Cat::Meta);
    }
    if r.observed_time_unix_nano != 0 {
        e.add(
            "observed_timestamp".into(),
            r.observed_time_unix_nano.to_string(),
            Cat::Meta,
        );
    }
    e.add(
        "detected_level".into(),
        detected_level(&r.severity_text, r.severity_number).into(),
        Cat::Meta,
    );
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::logs::v1::LogRecord;
    use opentelemetry_proto::tonic::resource::v1::Resource;

    fn kv(k: &str, v: Value) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        }
    }

    #[test]
    fn a_record_maps_as_loki_maps_otlp() {
        let row = LogRow {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", Value::StringValue("shop".into())),
                    kv("k8s.pod.name", Value::StringValue("p-1".into())),
                    kv("host.name", Value::StringValue("h".into())),
                ],
                ..Default::default()
            }),
            resource_schema_url: String::new(),
            scope: None,
            scope_schema_url: String::new(),
            record: LogRecord {
                severity_text: "WARNING".into(),
                severity_number: 17,
                trace_id: vec![0xab; 16],
                body: Some(AnyValue {
                    value: Some(Value::StringValue("hello".into())),
                }),
                attributes: vec![
                    kv("http.status_code", Value::IntValue(500)),
                    kv("service.name", Value::StringValue("shadowed".into())),
                ],
                ..Default::default()
            },
        };
        let e = entry(&row, 7);
        assert_eq!(e.line, "hello");
        assert_eq!(
            e.of(Cat::Stream),
            vec![
                ("k8s_pod_name".to_owned(), "p-1".to_owned()),
                ("service_name".to_owned(), "shop".to_owned())
            ]
        );
        assert_eq!(e.get("host_name"), Some("h"));
        assert_eq!(e.get("http_status_code"), Some("500"));
        assert_eq!(e.get("trace_id"), Some("abababababababababababababababab"));
        // The text wins over the number (17 would be error).
        assert_eq!(e.get("detected_level"), Some("warn"));
        assert_eq!(e.get("service_name"), Some("shop"));
    }

    #[test]
    fn names_and_levels() {
        assert_eq!(label_name("service.name"), "service_name");
        assert_eq!(label_name("9lives"), "_9lives");
        assert_eq!(label_name("a-b/c"), "a_b_c");
        assert_eq!(detected_level("", 9), "info");
        assert_eq!(detected_level("", 0), "unknown");
        assert_eq!(detected_level("bogus", 21), "fatal");
        assert_eq!(detected_level("Err", 0), "error");
    }
}
