//! A compiled LogQL pipeline: the stages of a log query run over one
//! [`Entry`] at a time. Evaluated: line filters (with `or`), `json`,
//! `logfmt`, `regexp`, `unpack`, label filters (string, number, duration,
//! bytes; `and`/`or`), `line_format` and `label_format` (field
//! substitution `{{.name}}`), `decolorize`, `drop`, `keep`, `unwrap`.
//! Not evaluated (a 400 naming them): `pattern`, `ip()`, pattern line
//! filters, and templates beyond field substitution.

use mira_core::scan::{MatchOp as Test, compile_regex};
use regex::Regex;

use super::ast::{
    CmpOp, LabelFilter, LabelFmtValue, LineOp, LineValue, MatchOp, NamedMatcher, ParserParam, Stage, Unwrap, UnwrapConv,
};
use super::model::{Cat, Entry, label_name};
use crate::QueryError;

/// `__error__` values, as Loki names them.
pub const ERROR: &str = "__error__";
pub const ERROR_DETAILS: &str = "__error_details__";

fn unsupported(what: &str) -> QueryError {
    QueryError::BadRequest(format!("{what} is not supported by Mira's LogQL evaluator"))
}

fn regex(pattern: &str, anchored: bool) -> Result<Regex, QueryError> {
    compile_regex(pattern, anchored).map_err(|e| QueryError::BadRequest(format!("regex {pattern:?}: {e}")))
}

/// A string matcher (label filters, selector matchers, `drop`/`keep`):
/// the scan's own, regexes anchored.
pub fn str_test(op: MatchOp, value: &str) -> Result<Test, QueryError> {
    Ok(match op {
        MatchOp::Eq => Test::Eq(value.to_owned()),
        MatchOp::Ne => Test::Ne(value.to_owned()),
        MatchOp::Re => Test::Re(regex(value, true)?),
        MatchOp::NotRe => Test::NotRe(regex(value, true)?),
    })
}

#[derive(Debug)]
enum LineTest {
    Contains(Vec<String>),
    NotContains(Vec<String>),
    Re(Vec<Regex>),
    NotRe(Vec<Regex>),
}

#[derive(Debug)]
enum Filter {
    And(Box<Filter>, Box<Filter>),
    Or(Box<Filter>, Box<Filter>),
    Str(String, Test),
    /// name, op, value, how the label's text is read.
    Num(String, CmpOp, f64, UnwrapConv),
}

#[derive(Debug)]
enum Template {
    Text(String),
    Field(String),
}

#[derive(Debug)]
enum Step {
    Line(LineTest),
    Json(Vec<(String, Vec<PathPart>)>),
    Logfmt {
        strict: bool,
        keep_empty: bool,
        params: Vec<(String, String)>,
    },
    Regexp(Regex),
    Unpack,
    Filter(Filter),
    LineFormat(Vec<Template>),
    LabelFormat(Vec<(String, Result<String, Vec<Template>>)>),
    Decolorize,
    Drop(Vec<(String, Option<Test>)>),
    Keep(Vec<(String, Option<Test>)>),
    Unwrap(Unwrap),
}

#[derive(Debug, Clone, PartialEq)]
enum PathPart {
    Key(String),
    Index(usize),
}

/// A pipeline ready to run.
#[derive(Debug, Default)]
pub struct Pipeline {
    steps: Vec<Step>,
}

impl Pipeline {
    pub fn compile(stages: &[Stage]) -> Result<Pipeline, QueryError> {
        let mut steps = Vec::with_capacity(stages.len());
        for s in stages {
            steps.push(match s {
                Stage::Line(f) => Step::Line(line_test(f.op, &f.values)?),
                Stage::Json(params) => Step::Json(
                    params
                        .iter()
                        .map(|p| Ok((p.label.clone(), json_path(p)?)))
                        .collect::<Result<_, QueryError>>()?,
                ),
                Stage::Logfmt {
                    strict,
                    keep_empty,
                    params,
                } => Step::Logfmt {
                    strict: *strict,
                    keep_empty: *keep_empty,
                    params: params
                        .iter()
                        .map(|p| (p.label.clone(), p.expr.clone().unwrap_or_else(|| p.label.clone())))
                        .collect(),
                },
                Stage::Regexp(re) => {
                    let re = regex(re, false)?;
                    if re.capture_names().flatten().next().is_none() {
                        return Err(QueryError::BadRequest(
                            "regexp stage: the expression has no named capture group".into(),
                        ));
                    }
                    Step::Regexp(re)
                }
                Stage::Pattern(_) => return Err(unsupported("the pattern parser")),
                Stage::Unpack => Step::Unpack,
                Stage::LabelFilter(f) => Step::Filter(filter(f)?),
                Stage::LineFormat(t) => Step::LineFormat(template(t)?),
                Stage::LabelFormat(items) => Step::LabelFormat(
                    items
                        .iter()
                        .map(|i| {
                            Ok((
                                i.dst.clone(),
                                match &i.value {
                                    LabelFmtValue::Rename(src) => Ok(src.clone()),
                                    LabelFmtValue::Template(t) => Err(template(t)?),
                                },
                            ))
                        })
                        .collect::<Result<_, QueryError>>()?,
                ),
                Stage::Decolorize => Step::Decolorize,
                Stage::Drop(m) => Step::Drop(named(m)?),
                Stage::Keep(m) => Step::Keep(named(m)?),
                Stage::Unwrap(u) => Step::Unwrap(u.clone()),
            });
        }
        Ok(Pipeline { steps })
    }

    /// Runs the stages; false when the entry is filtered out. With an
    /// `unwrap`, the sample value is returned in `value` (None when the
    /// label did not convert: the entry then carries `__error__`).
    pub fn run(&self, e: &mut Entry, value: &mut Option<f64>) -> bool {
        for step in &self.steps {
            match step {
                Step::Line(t) => {
                    if !line_ok(t, e.filter_text()) {
                        return false;
                    }
                }
                Step::Json(params) => json_stage(e, params),
                Step::Logfmt {
                    strict,
                    keep_empty,
                    params,
                } => logfmt_stage(e, *strict, *keep_empty, params),
                Step::Regexp(re) => {
                    if let Some(c) = re.captures(&e.line.clone()) {
                        for name in re.capture_names().flatten() {
                            if let Some(m) = c.name(name) {
                                add_parsed(e, name, m.as_str().to_owned());
                            }
                        }
                    }
                }
                Step::Unpack => unpack_stage(e),
                Step::Filter(f) => {
                    if !filter_ok(f, e) {
                        return false;
                    }
                }
                Step::LineFormat(t) => {
                    e.line = render(t, e);
                    e.line_is_text = true;
                }
                Step::LabelFormat(items) => {
                    for (dst, v) in items {
                        match v {
                            Ok(src) => {
                                let val = e.get(src).unwrap_or("").to_owned();
                                e.remove(src);
                                e.set(dst, val, Cat::Parsed);
                            }
                            Err(t) => {
                                let val = render(t, e);
                                e.set(dst, val, Cat::Parsed);
                            }
                        }
                    }
                }
                Step::Decolorize => {
                    e.line = decolorize(&e.line);
                }
                Step::Drop(items) => e
                    .labels
                    .retain(|l| !items.iter().any(|(n, t)| named_hit(n, t, &l.name, &l.value))),
                Step::Keep(items) => e
                    .labels
                    .retain(|l| items.iter().any(|(n, t)| named_hit(n, t, &l.name, &l.value))),
                Step::Unwrap(u) => {
                    let raw = e.get(&u.label).map(str::to_owned);
                    *value = raw.as_deref().and_then(|v| convert(v, u.conv));
                    if value.is_none() {
                        e.set(ERROR, "SampleExtractionErr".into(), Cat::Parsed);
                    }
                    // The unwrapped label leaves the series' labels (as Loki).
                    e.remove(&u.label);
                }
            }
        }
        true
    }

    /// True when the pipeline holds an `unwrap`.
    pub fn unwraps(&self) -> bool {
        self.steps.iter().any(|s| matches!(s, Step::Unwrap(_)))
    }
}

fn named(m: &[NamedMatcher]) -> Result<Vec<(String, Option<Test>)>, QueryError> {
    m.iter()
        .map(|m| {
            Ok((
                m.name.clone(),
                m.matcher.as_ref().map(|(op, v)| str_test(*op, v)).transpose()?,
            ))
        })
        .collect()
}

fn named_hit(name: &str, test: &Option<Test>, label: &str, value: &str) -> bool {
    name == label && test.as_ref().is_none_or(|t| t.matches(value))
}

fn line_test(op: LineOp, values: &[LineValue]) -> Result<LineTest, QueryError> {
    let strs = values
        .iter()
        .map(|v| match v {
            LineValue::Str(s) => Ok(s.clone()),
            LineValue::Ip(_) => Err(unsupported("the ip() line filter")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(match op {
        LineOp::Contains => LineTest::Contains(strs),
        LineOp::NotContains => LineTest::NotContains(strs),
        LineOp::Re => LineTest::Re(strs.iter().map(|s| regex(s, false)).collect::<Result<_, _>>()?),
        LineOp::NotRe => LineTest::NotRe(strs.iter().map(|s| regex(s, false)).collect::<Result<_, _>>()?),
        LineOp::Pattern | LineOp::NotPattern => return Err(unsupported("the pattern line filter (|> and !>)")),
    })
}

/// `or` alternatives: a positive filter passes when any alternative
/// matches; a negative one when none does.
fn line_ok(t: &LineTest, line: &str) -> bool {
    match t {
        LineTest::Contains(v) => v.iter().any(|s| line.contains(s.as_str())),
        LineTest::NotContains(v) => !v.iter().any(|s| line.contains(s.as_str())),
        LineTest::Re(v) => v.iter().any(|r| r.is_match(line)),
        LineTest::NotRe(v) => !v.iter().any(|r| r.is_match(line)),
    }
}

fn filter(f: &LabelFilter) -> Result<Filter, QueryError> {
    Ok(match f {
        LabelFilter::And(a, b) => Filter::And(Box::new(filter(a)?), Box::new(filter(b)?)),
        LabelFilter::Or(a, b) => Filter::Or(Box::new(filter(a)?), Box::new(filter(b)?)),
        LabelFilter::Str { name, op, value } => Filter::Str(name.clone(), str_test(*op, value)?),
        LabelFilter::Number { name, op, value } => Filter::Num(name.clone(), *op, *value, UnwrapConv::None),
        LabelFilter::Duration { name, op, seconds } => Filter::Num(name.clone(), *op, *seconds, UnwrapConv::Duration),
        LabelFilter::Bytes { name, op, bytes } => Filter::Num(name.clone(), *op, *bytes, UnwrapConv::Bytes),
        LabelFilter::Ip { .. } => return Err(unsupported("the ip() label filter")),
    })
}

fn cmp(op: CmpOp, a: f64, b: f64) -> bool {
    match op {
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
    }
}

/// A label filter. A missing label reads as "" for string tests and
/// fails a numeric test; a label that does not convert fails the test and
/// marks the entry with `__error__="LabelFilterErr"` (as Loki).
fn filter_ok(f: &Filter, e: &mut Entry) -> bool {
    match f {
        Filter::And(a, b) => filter_ok(a, e) && filter_ok(b, e),
        Filter::Or(a, b) => filter_ok(a, e) || filter_ok(b, e),
        Filter::Str(name, t) => t.matches(e.get(name).unwrap_or("")),
        Filter::Num(name, op, want, conv) => {
            let Some(v) = e.get(name) else { return false };
            match convert(v, *conv) {
                Some(got) => cmp(*op, got, *want),
                None => {
                    e.set(ERROR, "LabelFilterErr".into(), Cat::Parsed);
                    true
                }
            }
        }
    }
}

/// A label's number: a float, a Go duration in seconds, or a byte size.
pub fn convert(v: &str, conv: UnwrapConv) -> Option<f64> {
    let v = v.trim();
    match conv {
        UnwrapConv::None => v.parse::<f64>().ok(),
        UnwrapConv::Duration => duration_seconds(v),
        UnwrapConv::Bytes => bytes(v),
    }
}

/// A Go duration (`1h30m`, `250ms`, `1.5s`, `-2s`) in seconds.
pub fn duration_seconds(v: &str) -> Option<f64> {
    let (neg, mut rest) = match v.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, v.strip_prefix('+').unwrap_or(v)),
    };
    if rest == "0" {
        return Some(0.0);
    }
    let mut total = 0.0;
    let mut any = false;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            "w" => 604800.0,
            "y" => 31_536_000.0,
            _ => return None,
        };
        rest = &rest[u..];
        total += num * scale;
        any = true;
    }
    any.then_some(if neg { -total } else { total })
}

/// A byte size (`20MB`, `1KiB`, `5b`, `42`) in bytes.
pub fn bytes(v: &str) -> Option<f64> {
    let n = v.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(v.len());
    let num: f64 = v[..n].parse().ok()?;
    let unit = v[n..].trim().to_ascii_lowercase();
    let scale: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "pb" | "p" => 1e15,
        "kib" | "ki" => 1024.0,
        "mib" | "mi" => 1024f64.powi(2),
        "gib" | "gi" => 1024f64.powi(3),
        "tib" | "ti" => 1024f64.powi(4),
        "pib" | "pi" => 1024f64.powi(5),
        _ => return None,
    };
    Some(num * scale)
}

/// Templates: text with `{{.name}}` / `{{ .name }}` fields. Anything else
/// between braces (functions, pipes, conditionals) is refused.
fn template(t: &str) -> Result<Vec<Template>, QueryError> {
    let mut out = Vec::new();
    let mut rest = t;
    while let Some(i) = rest.find("{{") {
        if i > 0 {
            out.push(Template::Text(rest[..i].to_owned()));
        }
        let after = &rest[i + 2..];
        let j = after
            .find("}}")
            .ok_or_else(|| QueryError::BadRequest(format!("template {t:?}: unclosed {{{{")))?;
        let inner = after[..j].trim().trim_start_matches('-').trim_end_matches('-').trim();
        let field = inner
            .strip_prefix('.')
            .filter(|f| !f.is_empty() && f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        match field {
            Some(f) => out.push(Template::Field(f.to_owned())),
            None if inner == "__line__" || inner == ".__line__" => out.push(Template::Field("__line__".into())),
            None => {
                return Err(QueryError::BadRequest(format!(
                    "template {t:?}: {{{{{inner}}}}} is not supported (Mira substitutes fields, {{{{.name}}}}, only)"
                )));
            }
        }
        rest = &after[j + 2..];
    }
    if !rest.is_empty() {
        out.push(Template::Text(rest.to_owned()));
    }
    Ok(out)
}

fn render(t: &[Template], e: &Entry) -> String {
    let mut s = String::new();
    for part in t {
        match part {
            Template::Text(x) => s.push_str(x),
            Template::Field(f) if f == "__line__" => s.push_str(&e.line),
            Template::Field(f) => s.push_str(e.get(f).unwrap_or("")),
        }
    }
    s
}

fn decolorize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A parsed label: a name that already exists gets `_extracted` (as Loki).
fn add_parsed(e: &mut Entry, name: &str, value: String) {
    let name = label_name(name);
    if e.get(&name).is_some() && !e.labels.iter().any(|l| l.name == name && l.cat == Cat::Parsed) {
        e.set(&format!("{name}_extracted"), value, Cat::Parsed);
    } else {
        e.set(&name, value, Cat::Parsed);
    }
}

fn json_path(p: &ParserParam) -> Result<Vec<PathPart>, QueryError> {
    let expr = p.expr.clone().unwrap_or_else(|| p.label.clone());
    let bad = || QueryError::BadRequest(format!("json expression {expr:?} is not a path like a.b[0] or [\"a\"]"));
    let mut parts = Vec::new();
    let mut rest = expr.as_str();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('[') {
            let j = r.find(']').ok_or_else(bad)?;
            let inner = r[..j].trim();
            if let Ok(i) = inner.parse::<usize>() {
                parts.push(PathPart::Index(i));
            } else {
                let k = inner.trim_matches('"').trim_matches('\'');
                parts.push(PathPart::Key(k.to_owned()));
            }
            rest = &r[j + 1..];
        } else {
            let r = rest.strip_prefix('.').unwrap_or(rest);
            let j = r.find(['.', '[']).unwrap_or(r.len());
            if j == 0 {
                return Err(bad());
            }
            parts.push(PathPart::Key(r[..j].to_owned()));
            rest = &r[j..];
        }
    }
    Ok(parts)
}

fn json_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        serde_json::Value::Null => Some(String::new()),
        _ => None,
    }
}

fn flatten(e: &mut Entry, prefix: &str, v: &serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let name = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}_{k}")
                };
                flatten(e, &name, v);
            }
        }
        // Arrays are skipped, as Loki does without an expression.
        serde_json::Value::Array(_) => {}
        other => {
            if let Some(t) = json_text(other) {
                add_parsed(e, prefix, t);
            }
        }
    }
}

fn parse_error(e: &mut Entry, kind: &str, detail: String) {
    e.set(ERROR, kind.into(), Cat::Parsed);
    e.set(ERROR_DETAILS, detail, Cat::Parsed);
}

fn json_stage(e: &mut Entry, params: &[(String, Vec<PathPart>)]) {
    let v: serde_json::Value = match serde_json::from_str(&e.line) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => return parse_error(e, "JSONParserErr", "the line is not a JSON object".into()),
        Err(err) => return parse_error(e, "JSONParserErr", err.to_string()),
    };
    if params.is_empty() {
        return flatten(e, "", &v);
    }
    for (label, path) in params {
        let mut cur = Some(&v);
        for p in path {
            cur = cur.and_then(|c| match p {
                PathPart::Key(k) => c.get(k),
                PathPart::Index(i) => c.get(i),
            });
        }
        let text = cur
            .map(|c| json_text(c).unwrap_or_else(|| c.to_string()))
            .unwrap_or_default();
        e.set(&label_name(label), text, Cat::Parsed);
    }
}

fn unpack_stage(e: &mut Entry) {
    let v: serde_json::Value = match serde_json::from_str(&e.line) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => return parse_error(e, "JSONParserErr", "the line is not a JSON object".into()),
        Err(err) => return parse_error(e, "JSONParserErr", err.to_string()),
    };
    if let serde_json::Value::Object(m) = v {
        for (k, v) in m {
            if k == "_entry" {
                if let Some(t) = json_text(&v) {
                    e.line = t;
                    e.line_is_text = true;
                }
            } else if let serde_json::Value::String(s) = v {
                add_parsed(e, &k, s);
            }
        }
    }
}

/// logfmt pairs `k=v`, `k="quoted \" v"`, bare `k` (empty value).
pub fn logfmt_pairs(line: &str) -> Result<Vec<(String, String)>, String> {
    let b = line.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        while i < b.len() && b[i] == b' ' {
            i += 1;
        }
        if i >= b.len() {
            break;
        }
        let ks = i;
        while i < b.len() && b[i] > b' ' && b[i] != b'=' && b[i] != b'"' {
            i += 1;
        }
        let key = &line[ks..i];
        if key.is_empty() {
            return Err(format!("unexpected {:?} at byte {i}", b[i] as char));
        }
        if i >= b.len() || b[i] != b'=' {
            out.push((key.to_owned(), String::new()));
            continue;
        }
        i += 1;
        if i < b.len() && b[i] == b'"' {
            i += 1;
            let mut v = String::new();
            let mut closed = false;
            let mut chars = line[i..].char_indices();
            while let Some((j, c)) = chars.next() {
                match c {
                    '"' => {
                        i += j + 1;
                        closed = true;
                        break;
                    }
                    '\\' => match chars.next() {
                        Some((_, 'n')) => v.push('\n'),
                        Some((_, 't')) => v.push('\t'),
                        Some((_, c)) => v.push(c),
                        None => {}
                    },
                    c => v.push(c),
                }
            }
            if !closed {
                return Err(format!("unterminated quoted value for key {key:?}"));
            }
            out.push((key.to_owned(), v));
        } else {
            let vs = i;
            while i < b.len() && b[i] != b' ' {
                i += 1;
            }
            out.push((key.to_owned(), line[vs..i].to_owned()));
        }
    }
    Ok(out)
}

fn logfmt_stage(e: &mut Entry, strict: bool, keep_empty: bool, params: &[(String, String)]) {
    let pairs = match logfmt_pairs(&e.line) {
        Ok(p) => p,
        Err(why) if strict => return parse_error(e, "LogfmtParserErr", why),
        // Not strict: what parsed before the error is kept, as Loki does.
        Err(_) => logfmt_prefix(&e.line),
    };
    if params.is_empty() {
        for (k, v) in pairs {
            if v.is_empty() && !keep_empty {
                continue;
            }
            add_parsed(e, &k, v);
        }
    } else {
        for (label, key) in params {
            let v = pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.clone());
            if let Some(v) = v {
                e.set(&label_name(label), v, Cat::Parsed);
            }
        }
    }
}

/// The pairs before the first malformed one.
fn logfmt_prefix(line: &str) -> Vec<(String, String)> {
    let mut end = line.len();
    loop {
        match logfmt_pairs(&line[..end]) {
            Ok(p) => return p,
            Err(_) => match line[..end].rfind(' ') {
                Some(i) => end = i,
                None => return Vec::new(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logql::ast::LabelFmt;

    fn entry(line: &str) -> Entry {
        Entry {
            ts: 1,
            line: line.into(),
            line_is_text: true,
            labels: vec![super::super::model::Label {
                name: "service_name".into(),
                value: "shop".into(),
                cat: Cat::Stream,
            }],
        }
    }

    #[test]
    fn json_logfmt_filters_and_formats() {
        let p = Pipeline::compile(&[
            Stage::Json(vec![]),
            Stage::LabelFilter(LabelFilter::Duration {
                name: "took".into(),
                op: CmpOp::Gt,
                seconds: 0.1,
            }),
            Stage::LineFormat("{{.user_name}} took {{ .took }}".into()),
            Stage::LabelFormat(vec![LabelFmt {
                dst: "who".into(),
                value: LabelFmtValue::Rename("user_name".into()),
            }]),
        ])
        .expect("compile");
        let mut e = entry(r#"{"user":{"name":"ann"},"took":"250ms","tags":[1]}"#);
        assert!(p.run(&mut e, &mut None));
        assert_eq!(e.line, "ann took 250ms");
        assert_eq!(e.get("who"), Some("ann"));
        assert_eq!(e.get("user_name"), None);
        let mut fast = entry(r#"{"took":"50ms"}"#);
        assert!(!p.run(&mut fast, &mut None));
        let mut broken = entry("not json");
        // A failed parse marks the entry; the duration filter then lacks its label.
        assert!(!p.run(&mut broken, &mut None));
        assert_eq!(broken.get(ERROR), Some("JSONParserErr"));

        let lf = Pipeline::compile(&[Stage::Logfmt {
            strict: false,
            keep_empty: false,
            params: vec![],
        }])
        .expect("compile");
        let mut e = entry(r#"level=info msg="a \"quoted\" word" service_name=x empty="#);
        assert!(lf.run(&mut e, &mut None));
        assert_eq!(e.get("msg"), Some(r#"a "quoted" word"#));
        assert_eq!(e.get("service_name_extracted"), Some("x"));
        assert_eq!(e.get("empty"), None);
    }

    #[test]
    fn unwrap_converts_and_marks_failures() {
        let p = Pipeline::compile(&[
            Stage::Logfmt {
                strict: false,
                keep_empty: false,
                params: vec![],
            },
            Stage::Unwrap(Unwrap {
                label: "size".into(),
                conv: UnwrapConv::Bytes,
            }),
        ])
        .expect("compile");
        let mut v = None;
        let mut e = entry("size=2KiB");
        assert!(p.run(&mut e, &mut v));
        assert_eq!(v, Some(2048.0));
        assert_eq!(e.get("size"), None);
        let mut e = entry("size=lots");
        assert!(p.run(&mut e, &mut v));
        assert_eq!(v, None);
        assert_eq!(e.get(ERROR), Some("SampleExtractionErr"));
    }

    #[test]
    fn durations_bytes_and_unsupported_stages() {
        assert_eq!(duration_seconds("1h30m"), Some(5400.0));
        assert_eq!(duration_seconds("1.5s"), Some(1.5));
        assert_eq!(duration_seconds("5x"), None);
        assert_eq!(bytes("20MB"), Some(20e6));
        assert_eq!(bytes("1KiB"), Some(1024.0));
        let e = Pipeline::compile(&[Stage::Pattern("<_> <x>".into())]).expect_err("pattern");
        assert!(e.to_string().contains("pattern"), "{e}");
        let e = Pipeline::compile(&[Stage::LineFormat("{{ .a | upper }}".into())]).expect_err("func");
        assert!(e.to_string().contains("not supported"), "{e}");
    }
}
