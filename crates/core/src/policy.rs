//! Retention and offload policies (compactor design §8.1, §8.2, §8.5): the
//! versioned policy body, its validation, selector matching on resource
//! attributes, and rule resolution. Shared by the catalog (which runs
//! [`validate`] at `SetPolicy`, so a typo is refused there instead of
//! silently keeping data forever), the compactor (which enforces what
//! [`RuleSet::resolve`] decides) and the operator (which writes bodies).
//! Pure code, no I/O.
//!
//! # Body v1
//!
//! A JSON object: `v` (must be 1), `signals` (absent or `[]` = all),
//! `tenant_glob` (only for a policy of all tenants, tenant `""`),
//! `selector` (matchers on resource attributes, all of which must hold),
//! `priority` (i32, default 0), `retain_s` (Retention only, required),
//! `after_s` and `target` (Offload only, required), `dry_run` and `source`
//! (informational, written by the operator). Unknown fields anywhere, a
//! field of the other kind, a wrong type or an out-of-range value are
//! refused with a [`PolicyError`] naming the field by its JSON path
//! (`selector[1].op`). `null` reads as absent. [`PolicyBody::to_json`] is
//! the canonical form: fixed field order, defaults left out, signals sorted.
//!
//! Matchers compare the attribute's text. A missing attribute reads as ""
//! for `=`, `!=`, `=~`, `!~` (Prometheus: `k != "x"` and `k =~ ".*"` hold
//! when `k` is absent); `in` fails and `notin` holds when it is absent;
//! `exists` means present. Regexes are anchored at both ends.
//!
//! # Resolution
//!
//! For a resource of tenant T and signal S, among the rules of one kind
//! whose `signals` is empty or holds S, the rule that decides is:
//!
//! 1. the best tenant-specific rule (tenant T) with a selector that matches;
//! 2. else the best global rule (tenant `""`, whose `tenant_glob`, if any,
//!    matches T) with a selector that matches;
//! 3. else the best tenant-specific rule without a selector;
//! 4. else the best global rule without a selector;
//! 5. else none: the data is kept forever. There is no hidden default.
//!
//! "Best" is the highest priority, then the most matchers, then the
//! smallest name (then the canonical body, so even duplicate names order
//! the same whatever order the rules came in).
//!
//! Example: `acme-checkout` (tenant acme, `service.name = checkout`, 7 d),
//! `dev` (all tenants, `deployment.environment = dev`, 1 d), `acme`
//! (tenant acme, 30 d) and `default` (all tenants, 90 d). For acme,
//! checkout in dev keeps 7 d (step 1 before 2), another service in dev
//! 1 d (step 2 before 3), anything else 30 d (step 3). For tenant globex,
//! dev keeps 1 d and the rest 90 d (step 4); without `default`, globex's
//! non-dev data is kept forever.
//!
//! Unlike Loki, where a tenant's override list replaces the global stream
//! rules and equal priorities pick the shortest period, a global selector
//! rule here beats a tenant's rule without a selector (step 2 before 3),
//! and ties are broken by matcher count and name.

use std::fmt;

use regex::Regex;
use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::ids::{Signal, TenantId};
use crate::scan::{ScanError, compile_regex};

mod resolve;

pub use resolve::{Attributes, Rule, RuleSet};

/// The only body version this build reads and writes.
pub const BODY_VERSION: u64 = 1;
/// Largest body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most matchers in one selector.
pub const MAX_MATCHERS: usize = 32;
/// Most values of one `in` / `notin` matcher.
pub const MAX_SET_VALUES: usize = 256;
/// Longest attribute key or value (and `source` string), in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Longest policy name, in bytes (a Kubernetes name fits).
pub const MAX_NAME_BYTES: usize = 253;
/// Most entries of `signals`.
pub const MAX_SIGNALS: usize = 16;
/// Longest `tenant_glob`, in bytes.
pub const MAX_GLOB_BYTES: usize = 256;
/// Shortest `retain_s` / `after_s`: one hour.
pub const MIN_DURATION_S: u64 = 3600;
/// Longest `retain_s` / `after_s`: 100 years of 365.25 days, so that
/// humantime's `100y` is accepted.
pub const MAX_DURATION_S: u64 = 100 * 31_557_600;

const FIELDS: [&str; 10] = [
    "v",
    "signals",
    "tenant_glob",
    "selector",
    "priority",
    "retain_s",
    "after_s",
    "target",
    "dry_run",
    "source",
];
const MATCHER_FIELDS: [&str; 4] = ["key", "op", "value", "values"];
const SOURCE_FIELDS: [&str; 5] = ["kind", "namespace", "name", "uid", "generation"];
/// Hostile strings are echoed in errors at most this long.
const ECHO_CHARS: usize = 64;

/// What a policy decides: when data is deleted, or when it moves to an
/// offload target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyKind {
    Retention,
    Offload,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 2] = [PolicyKind::Retention, PolicyKind::Offload];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Retention => "retention",
            PolicyKind::Offload => "offload",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused policy: which field (a JSON path such as `selector[1].op`, or
/// `body`, `name`, `tenant`) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("policy field `{field}`: {reason}")]
pub struct PolicyError {
    pub field: String,
    pub reason: String,
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> PolicyError {
    PolicyError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A selector operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SelectorOp {
    Eq,
    Ne,
    Re,
    NotRe,
    In,
    NotIn,
    Exists,
    NotExists,
}

impl SelectorOp {
    pub const ALL: [SelectorOp; 8] = [
        SelectorOp::Eq,
        SelectorOp::Ne,
        SelectorOp::Re,
        SelectorOp::NotRe,
        SelectorOp::In,
        SelectorOp::NotIn,
        SelectorOp::Exists,
        SelectorOp::NotExists,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SelectorOp::Eq => "=",
            SelectorOp::Ne => "!=",
            SelectorOp::Re => "=~",
            SelectorOp::NotRe => "!~",
            SelectorOp::In => "in",
            SelectorOp::NotIn => "notin",
            SelectorOp::Exists => "exists",
            SelectorOp::NotExists => "!exists",
        }
    }

    pub fn parse(s: &str) -> Option<SelectorOp> {
        SelectorOp::ALL.into_iter().find(|op| op.as_str() == s)
    }

    fn arity(self) -> Arity {
        match self {
            SelectorOp::Eq | SelectorOp::Ne | SelectorOp::Re | SelectorOp::NotRe => Arity::One,
            SelectorOp::In | SelectorOp::NotIn => Arity::Many,
            SelectorOp::Exists | SelectorOp::NotExists => Arity::None,
        }
    }
}

impl fmt::Display for SelectorOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Arity {
    None,
    One,
    Many,
}

/// One checked selector matcher on a resource attribute. Built only by
/// validation or [`Matcher::new`], so its regex is always compiled and
/// anchored.
#[derive(Clone, Debug)]
pub struct Matcher {
    key: String,
    test: Test,
}

#[derive(Clone, Debug)]
enum Test {
    Eq(String),
    Ne(String),
    Re(String, Regex),
    NotRe(String, Regex),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

impl Matcher {
    /// A matcher on `key`: `=`, `!=`, `=~`, `!~` take exactly one value,
    /// `in` / `notin` one or more, `exists` / `!exists` none. Errors name
    /// the field `selector`.
    pub fn new(key: &str, op: SelectorOp, mut values: Vec<String>) -> Result<Matcher, PolicyError> {
        let mut obj = Map::new();
        obj.insert("key".into(), key.into());
        obj.insert("op".into(), op.as_str().into());
        match (op.arity(), values.len()) {
            (Arity::None, 0) => {}
            (Arity::One, 1) => {
                obj.insert("value".into(), values.pop().into());
            }
            (Arity::Many, n) if n > 0 => {
                obj.insert("values".into(), values.into());
            }
            (_, n) => {
                return Err(err(
                    "selector",
                    format!("operator {:?} does not take {n} values", op.as_str()),
                ));
            }
        }
        parse_matcher("selector", &obj)
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn op(&self) -> SelectorOp {
        match self.test {
            Test::Eq(_) => SelectorOp::Eq,
            Test::Ne(_) => SelectorOp::Ne,
            Test::Re(..) => SelectorOp::Re,
            Test::NotRe(..) => SelectorOp::NotRe,
            Test::In(_) => SelectorOp::In,
            Test::NotIn(_) => SelectorOp::NotIn,
            Test::Exists => SelectorOp::Exists,
            Test::NotExists => SelectorOp::NotExists,
        }
    }

    /// The operand of `=`, `!=`, `=~`, `!~` (the regex as written).
    pub fn value(&self) -> Option<&str> {
        match &self.test {
            Test::Eq(v) | Test::Ne(v) | Test::Re(v, _) | Test::NotRe(v, _) => Some(v),
            _ => None,
        }
    }

    /// The operands of `in` / `notin`; empty for the other operators.
    pub fn values(&self) -> &[String] {
        match &self.test {
            Test::In(v) | Test::NotIn(v) => v,
            _ => &[],
        }
    }

    /// Whether the matcher holds for the attribute's value (`None` = the
    /// resource has no such attribute).
    pub fn matches(&self, value: Option<&str>) -> bool {
        let text = value.unwrap_or("");
        match &self.test {
            Test::Eq(want) => text == want,
            Test::Ne(want) => text != want,
            Test::Re(_, re) => re.is_match(text),
            Test::NotRe(_, re) => !re.is_match(text),
            Test::In(set) => value.is_some_and(|v| set.iter().any(|s| s == v)),
            Test::NotIn(set) => !value.is_some_and(|v| set.iter().any(|s| s == v)),
            Test::Exists => value.is_some(),
            Test::NotExists => value.is_none(),
        }
    }
}

impl PartialEq for Matcher {
    fn eq(&self, other: &Matcher) -> bool {
        self.key == other.key
            && self.op() == other.op()
            && self.value() == other.value()
            && self.values() == other.values()
    }
}

impl Eq for Matcher {}

/// The Kubernetes object a policy was written from (informational).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Source {
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uid: Option<String>,
    pub generation: Option<u64>,
}

/// A validated policy body v1.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyBody {
    /// Empty: every signal. Sorted, without duplicates.
    pub signals: Vec<Signal>,
    /// Only on a policy of all tenants: the tenants it applies to.
    pub tenant_glob: Option<String>,
    /// All must hold; empty: every resource.
    pub selector: Vec<Matcher>,
    pub priority: i32,
    /// Retention: seconds data is kept.
    pub retain_s: Option<u64>,
    /// Offload: seconds before data moves to `target`.
    pub after_s: Option<u64>,
    pub target: Option<String>,
    pub dry_run: bool,
    pub source: Option<Source>,
}

impl PolicyBody {
    /// Whether the body applies to `signal`.
    pub fn applies_to_signal(&self, signal: Signal) -> bool {
        self.signals.is_empty() || self.signals.contains(&signal)
    }

    /// Whether every matcher of the selector holds for `resource`.
    pub fn matches<A: Attributes + ?Sized>(&self, resource: &A) -> bool {
        self.selector
            .iter()
            .all(|m| m.matches(resource.attr(&m.key).as_deref()))
    }

    /// The canonical JSON: fields in the order of the schema (not
    /// depending on serde_json's map order), defaults left out, no spaces.
    /// [`validate`] reads it back to an equal body.
    pub fn to_json(&self) -> String {
        let mut o = JsonObject::new();
        o.field("v", BODY_VERSION);
        if !self.signals.is_empty() {
            o.field("signals", self.signals.iter().map(|s| s.as_str()).collect::<Value>());
        }
        if let Some(g) = &self.tenant_glob {
            o.field("tenant_glob", g.as_str());
        }
        if !self.selector.is_empty() {
            let matchers: Vec<String> = (self.selector.iter())
                .map(|m| {
                    let mut mo = JsonObject::new();
                    mo.field("key", m.key.as_str());
                    mo.field("op", m.op().as_str());
                    if let Some(v) = m.value() {
                        mo.field("value", v);
                    }
                    if !m.values().is_empty() {
                        mo.field("values", m.values());
                    }
                    mo.finish()
                })
                .collect();
            o.raw("selector", &format!("[{}]", matchers.join(",")));
        }
        if self.priority != 0 {
            o.field("priority", self.priority);
        }
        if let Some(v) = self.retain_s {
            o.field("retain_s", v);
        }
        if let Some(v) = self.after_s {
            o.field("after_s", v);
        }
        if let Some(t) = &self.target {
            o.field("target", t.as_str());
        }
        if self.dry_run {
            o.field("dry_run", true);
        }
        if let Some(s) = &self.source {
            let mut so = JsonObject::new();
            let strings = [
                ("kind", &s.kind),
                ("namespace", &s.namespace),
                ("name", &s.name),
                ("uid", &s.uid),
            ];
            for (k, v) in strings {
                if let Some(v) = v {
                    so.field(k, v.as_str());
                }
            }
            if let Some(g) = s.generation {
                so.field("generation", g);
            }
            o.raw("source", &so.finish());
        }
        o.finish()
    }
}

/// What enforcing one policy did, as `SetPolicyStatus` stores it (JSON).
/// Counts of blocks dropped and offloaded add up over the policy's life;
/// `blocks_matched` is the blocks it decides for at the last run. Written
/// by the compactor, read by the operator (a custom resource's status).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PolicyStatus {
    /// The `source.generation` of the body the run enforced, if any.
    pub generation: Option<u64>,
    pub last_run_ns: i64,
    pub blocks_matched: u64,
    pub blocks_dropped: u64,
    pub rows_dropped: u64,
    pub bytes_dropped: u64,
    pub blocks_offloaded: u64,
    pub bytes_offloaded: u64,
    /// `dry_run` policies: what the last run would have dropped.
    pub would_drop_blocks: u64,
    pub would_drop_rows: u64,
    /// The last run's errors (at most 5).
    pub errors: Vec<String>,
}

/// Writes a JSON object with fields in the order they are added.
struct JsonObject(String);

impl JsonObject {
    fn new() -> JsonObject {
        JsonObject("{".to_owned())
    }

    fn field(&mut self, key: &str, value: impl Into<Value>) {
        self.raw(key, &value.into().to_string());
    }

    fn raw(&mut self, key: &str, json: &str) {
        if self.0.len() > 1 {
            self.0.push(',');
        }
        self.0.push_str(&Value::from(key).to_string());
        self.0.push(':');
        self.0.push_str(json);
    }

    fn finish(mut self) -> String {
        self.0.push('}');
        self.0
    }
}

/// Parses and validates the body of a policy of `kind` named `name` for
/// `tenant` (`""` = all tenants). When `targets` is given, an offload
/// target must be one of them.
pub fn validate(
    kind: PolicyKind,
    name: &str,
    tenant: &str,
    body_json: &str,
    targets: Option<&[String]>,
) -> Result<PolicyBody, PolicyError> {
    let name_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-');
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.chars().all(name_ok) {
        return Err(err(
            "name",
            format!("{} is not 1-{MAX_NAME_BYTES} bytes of [A-Za-z0-9._/-]", echo(name)),
        ));
    }
    if !tenant.is_empty() {
        TenantId::new(tenant).map_err(|e| err("tenant", e.to_string()))?;
    }
    if body_json.len() > MAX_BODY_BYTES {
        let n = body_json.len();
        return Err(err(
            "body",
            format!("{n} bytes, more than the {MAX_BODY_BYTES} allowed"),
        ));
    }
    let StrictJson(value) = serde_json::from_str(body_json).map_err(|e| err("body", format!("not valid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(err(
            "body",
            format!("expected a JSON object, got {}", type_name(&value)),
        ));
    };
    match obj.get("v") {
        None => return Err(err("v", format!("missing; expected {BODY_VERSION}"))),
        Some(v) if v.as_u64() == Some(BODY_VERSION) => {}
        Some(v) => {
            let reason = format!(
                "unsupported version {}; this build reads version {BODY_VERSION}",
                echo_value(v)
            );
            return Err(err("v", reason));
        }
    }
    unknown_fields("", &obj, &FIELDS)?;
    let field = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let mut body = PolicyBody::default();

    if let Some(v) = field("signals") {
        let list = as_array("signals", v)?;
        if list.len() > MAX_SIGNALS {
            let reason = format!("{} entries, more than the {MAX_SIGNALS} allowed", list.len());
            return Err(err("signals", reason));
        }
        for (i, s) in list.iter().enumerate() {
            let path = format!("signals[{i}]");
            let text = as_str(&path, s)?;
            let signal = text.parse::<Signal>().map_err(|_| {
                err(
                    &path,
                    format!("unknown signal {} (expected logs, traces or metrics)", echo(text)),
                )
            })?;
            if body.signals.contains(&signal) {
                return Err(err(path, format!("duplicate signal {:?}", signal.as_str())));
            }
            body.signals.push(signal);
        }
        body.signals.sort();
    }
    if let Some(v) = field("tenant_glob") {
        let glob = as_str("tenant_glob", v)?;
        if !tenant.is_empty() {
            let reason = format!("only allowed on a policy for all tenants (tenant \"\"), not tenant {tenant:?}");
            return Err(err("tenant_glob", reason));
        }
        let glob_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '*' | '?' | '-');
        if glob.is_empty() || glob.len() > MAX_GLOB_BYTES || !glob.chars().all(glob_ok) {
            let reason = format!("{} is not 1-{MAX_GLOB_BYTES} bytes of [A-Za-z0-9._*?-]", echo(glob));
            return Err(err("tenant_glob", reason));
        }
        body.tenant_glob = Some(glob.to_owned());
    }
    if let Some(v) = field("selector") {
        let list = as_array("selector", v)?;
        if list.len() > MAX_MATCHERS {
            let reason = format!("{} matchers, more than the {MAX_MATCHERS} allowed", list.len());
            return Err(err("selector", reason));
        }
        for (i, m) in list.iter().enumerate() {
            let path = format!("selector[{i}]");
            let Value::Object(mo) = m else {
                return Err(err(path, format!("expected an object, got {}", type_name(m))));
            };
            body.selector.push(parse_matcher(&path, mo)?);
        }
    }
    if let Some(v) = field("priority") {
        let p = v.as_i64().and_then(|p| i32::try_from(p).ok());
        body.priority =
            p.ok_or_else(|| err("priority", format!("expected a 32-bit integer, got {}", echo_value(v))))?;
    }
    let a_kind = match kind {
        PolicyKind::Retention => "a retention",
        PolicyKind::Offload => "an offload",
    };
    let wrong_kind = |k: &str| err(k, format!("not allowed in {a_kind} policy"));
    match (kind, field("retain_s")) {
        (PolicyKind::Retention, Some(v)) => body.retain_s = Some(duration("retain_s", v)?),
        (PolicyKind::Retention, None) => return Err(err("retain_s", "required in a retention policy")),
        (PolicyKind::Offload, Some(_)) => return Err(wrong_kind("retain_s")),
        (PolicyKind::Offload, None) => {}
    }
    match (kind, field("after_s")) {
        (PolicyKind::Offload, Some(v)) => body.after_s = Some(duration("after_s", v)?),
        (PolicyKind::Offload, None) => return Err(err("after_s", "required in an offload policy")),
        (PolicyKind::Retention, Some(_)) => return Err(wrong_kind("after_s")),
        (PolicyKind::Retention, None) => {}
    }
    match (kind, field("target")) {
        (PolicyKind::Offload, Some(v)) => body.target = Some(target("target", v, targets)?),
        (PolicyKind::Offload, None) => return Err(err("target", "required in an offload policy")),
        (PolicyKind::Retention, Some(_)) => return Err(wrong_kind("target")),
        (PolicyKind::Retention, None) => {}
    }
    if let Some(v) = field("dry_run") {
        body.dry_run = v
            .as_bool()
            .ok_or_else(|| err("dry_run", format!("expected true or false, got {}", type_name(v))))?;
    }
    if let Some(v) = field("source") {
        body.source = Some(parse_source(v)?);
    }
    Ok(body)
}

fn parse_matcher(path: &str, obj: &Map<String, Value>) -> Result<Matcher, PolicyError> {
    unknown_fields(path, obj, &MATCHER_FIELDS)?;
    let field = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let key_path = format!("{path}.key");
    let key = field("key").ok_or_else(|| err(&key_path, "required"))?;
    let key = text(&key_path, key)?;
    if key.is_empty() {
        return Err(err(key_path, "must not be empty"));
    }
    let op_path = format!("{path}.op");
    let op_text = as_str(&op_path, field("op").ok_or_else(|| err(&op_path, "required"))?)?;
    let op = SelectorOp::parse(op_text).ok_or_else(|| {
        let all: Vec<&str> = SelectorOp::ALL.iter().map(|o| o.as_str()).collect();
        let reason = format!(
            "unknown operator {} (expected one of {})",
            echo(op_text),
            all.join(", ")
        );
        err(&op_path, reason)
    })?;
    let (value_path, values_path) = (format!("{path}.value"), format!("{path}.values"));
    let value = field("value").map(|v| text(&value_path, v)).transpose()?;
    let values = match field("values") {
        None => None,
        Some(v) => {
            let list = as_array(&values_path, v)?;
            if list.len() > MAX_SET_VALUES {
                let reason = format!("{} values, more than the {MAX_SET_VALUES} allowed", list.len());
                return Err(err(values_path, reason));
            }
            let texts = list
                .iter()
                .enumerate()
                .map(|(j, s)| text(&format!("{values_path}[{j}]"), s));
            Some(texts.collect::<Result<Vec<_>, _>>()?)
        }
    };
    let not_with = |p: &str, hint: &str| err(p, format!("not allowed with operator {:?}{hint}", op.as_str()));
    let needs = |p: &str| err(p, format!("required by operator {:?}", op.as_str()));
    let test = match op.arity() {
        Arity::One => {
            if values.is_some() {
                return Err(not_with(&values_path, "; use value"));
            }
            let v = value.ok_or_else(|| needs(&value_path))?;
            match op {
                SelectorOp::Eq => Test::Eq(v),
                SelectorOp::Ne => Test::Ne(v),
                _ => {
                    let re = compile_regex(&v, true).map_err(|e| match e {
                        ScanError::BadRegex { reason, .. } => {
                            // The regex crate's message spans lines; keep one.
                            let lines: Vec<&str> = reason.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
                            err(&value_path, format!("invalid regex: {}", lines.join(" ")))
                        }
                        other => err(&value_path, other.to_string()),
                    })?;
                    if op == SelectorOp::Re {
                        Test::Re(v, re)
                    } else {
                        Test::NotRe(v, re)
                    }
                }
            }
        }
        Arity::Many => {
            if value.is_some() {
                return Err(not_with(&value_path, "; use values"));
            }
            let vs = values.ok_or_else(|| needs(&values_path))?;
            if vs.is_empty() {
                return Err(err(values_path, "must not be empty"));
            }
            if op == SelectorOp::In {
                Test::In(vs)
            } else {
                Test::NotIn(vs)
            }
        }
        Arity::None => {
            if value.is_some() {
                return Err(not_with(&value_path, ""));
            }
            if values.is_some() {
                return Err(not_with(&values_path, ""));
            }
            if op == SelectorOp::Exists {
                Test::Exists
            } else {
                Test::NotExists
            }
        }
    };
    Ok(Matcher { key, test })
}

fn parse_source(v: &Value) -> Result<Source, PolicyError> {
    let Value::Object(obj) = v else {
        return Err(err("source", format!("expected an object, got {}", type_name(v))));
    };
    unknown_fields("source", obj, &SOURCE_FIELDS)?;
    let string = |k: &str| {
        let path = format!("source.{k}");
        obj.get(k).filter(|v| !v.is_null()).map(|v| text(&path, v)).transpose()
    };
    let generation = match obj.get("generation").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            err(
                "source.generation",
                format!("expected a non-negative integer, got {}", echo_value(v)),
            )
        })?),
    };
    Ok(Source {
        kind: string("kind")?,
        namespace: string("namespace")?,
        name: string("name")?,
        uid: string("uid")?,
        generation,
    })
}

fn duration(path: &str, v: &Value) -> Result<u64, PolicyError> {
    let s = v.as_u64().ok_or_else(|| {
        err(
            path,
            format!("expected a whole number of seconds, got {}", echo_value(v)),
        )
    })?;
    if s < MIN_DURATION_S {
        return Err(err(
            path,
            format!("{s} s is below the minimum of {MIN_DURATION_S} s (1 h)"),
        ));
    }
    if s > MAX_DURATION_S {
        return Err(err(
            path,
            format!("{s} s is above the maximum of {MAX_DURATION_S} s (100 years)"),
        ));
    }
    Ok(s)
}

fn target(path: &str, v: &Value, targets: Option<&[String]>) -> Result<String, PolicyError> {
    let t = as_str(path, v)?;
    let mut bytes = t.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let rest_ok = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !first_ok || !rest_ok || t.len() > 63 {
        return Err(err(
            path,
            format!("{} is not a target name ([a-z0-9][a-z0-9-]{{0,62}})", echo(t)),
        ));
    }
    if let Some(known) = targets
        && !known.iter().any(|k| k == t)
    {
        let configured = if known.is_empty() {
            "none".to_owned()
        } else {
            known.join(", ")
        };
        return Err(err(
            path,
            format!("unknown offload target {t:?} (configured: {configured})"),
        ));
    }
    Ok(t.to_owned())
}

fn unknown_fields(prefix: &str, obj: &Map<String, Value>, allowed: &[&str]) -> Result<(), PolicyError> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => {
            let k: String = k.chars().take(ECHO_CHARS).collect();
            let path = if prefix.is_empty() { k } else { format!("{prefix}.{k}") };
            Err(err(
                path,
                format!("unknown field (expected one of {})", allowed.join(", ")),
            ))
        }
    }
}

fn as_str<'v>(path: &str, v: &'v Value) -> Result<&'v str, PolicyError> {
    v.as_str()
        .ok_or_else(|| err(path, format!("expected a string, got {}", type_name(v))))
}

/// A string of at most [`MAX_TEXT_BYTES`].
fn text(path: &str, v: &Value) -> Result<String, PolicyError> {
    let s = as_str(path, v)?;
    if s.len() > MAX_TEXT_BYTES {
        return Err(err(
            path,
            format!("{} bytes, more than the {MAX_TEXT_BYTES} allowed", s.len()),
        ));
    }
    Ok(s.to_owned())
}

fn as_array<'v>(path: &str, v: &'v Value) -> Result<&'v [Value], PolicyError> {
    v.as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| err(path, format!("expected an array, got {}", type_name(v))))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn echo(s: &str) -> String {
    format!("{:?}", s.chars().take(ECHO_CHARS).collect::<String>())
}

fn echo_value(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => echo(s),
        other => type_name(other).to_owned(),
    }
}

/// A JSON value whose objects have no duplicate keys: with duplicates,
/// which one counts would depend on the reader.
struct StrictJson(Value);

impl<'de> Deserialize<'de> for StrictJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = StrictJson;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<StrictJson, E> {
        Ok(StrictJson(Value::Null))
    }
    fn visit_bool<E>(self, v: bool) -> Result<StrictJson, E> {
        Ok(StrictJson(v.into()))
    }
    fn visit_i64<E>(self, v: i64) -> Result<StrictJson, E> {
        Ok(StrictJson(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<StrictJson, E> {
        Ok(StrictJson(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<StrictJson, E> {
        Ok(StrictJson(v.into()))
    }
    fn visit_str<E>(self, v: &str) -> Result<StrictJson, E> {
        Ok(StrictJson(v.into()))
    }
    fn visit_string<E>(self, v: String) -> Result<StrictJson, E> {
        Ok(StrictJson(v.into()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StrictJson, A::Error> {
        let mut out = Vec::new();
        while let Some(StrictJson(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(StrictJson(Value::Array(out)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StrictJson, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(A::Error::custom(format!("duplicate key {}", echo(&k))));
            }
            let StrictJson(v) = map.next_value()?;
            out.insert(k, v);
        }
        Ok(StrictJson(Value::Object(out)))
    }
}

#[cfg(test)]
mod tests;
