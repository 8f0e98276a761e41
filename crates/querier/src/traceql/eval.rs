//! Evaluating a TraceQL query over one whole trace.
//!
//! A trace starts as one span set holding all its spans. A filter `{c}`
//! keeps, in each span set, the spans where `c` holds (a span set left
//! empty is dropped); `a && b` keeps the spans of both when both match,
//! `a || b` those of either; the structural operators keep the right-hand
//! spans related to a left-hand one (`>` child, `<` parent, `>>`
//! descendant, `<<` ancestor, `~` sibling; `!` negates the relation, `&`
//! keeps both sides). Pipeline stages then filter span sets by an
//! aggregate (`| count() > 2`, `| avg(duration) > 1s`), group them
//! (`by`), merge them (`coalesce`) or name attributes to return
//! (`select`). Comparisons are typed: a string never equals a number, and
//! a missing attribute (`nil`) only satisfies `= nil`. Regexes are RE2,
//! anchored.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use regex::Regex;

use super::ast::{
    Aggregate, ArithOp, Attribute, BinOp, CmpOp, FieldExpr, Intrinsic, Kind, Query, ScalarExpr, Scope, SpansetExpr,
    Stage, Static, Status, StructOp,
};
use crate::QueryError;

fn unsupported(what: &str) -> QueryError {
    QueryError::BadRequest(format!("{what} is not supported by Mira's TraceQL evaluator"))
}

/// One span of a trace, with what its conditions read.
#[derive(Debug)]
pub struct Span<'a> {
    pub span: &'a opentelemetry_proto::tonic::trace::v1::Span,
    pub resource: &'a [KeyValue],
    pub scope_name: &'a str,
    pub scope_version: &'a str,
    pub scope_attrs: &'a [KeyValue],
    pub service: &'a str,
    pub parent: Option<usize>,
}

impl Span<'_> {
    pub fn duration(&self) -> i64 {
        self.span
            .end_time_unix_nano
            .saturating_sub(self.span.start_time_unix_nano) as i64
    }
}

/// A trace ready to evaluate.
#[derive(Debug)]
pub struct TraceView<'a> {
    pub spans: Vec<Span<'a>>,
    pub trace_id: Vec<u8>,
    pub root: Option<usize>,
    pub start: u64,
    pub end: u64,
    pub children: Vec<Vec<usize>>,
    /// Every span once, parents before their children (a depth-first
    /// walk from the spans without a parent; a parent cycle, which only
    /// damaged data has, is cut where the walk first enters it).
    order: Vec<usize>,
    /// Each span's parent in that walk (its parent, unless the cut).
    tree_parent: Vec<Option<usize>>,
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn service_of(attrs: &[KeyValue]) -> &str {
    attrs
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => Some(s.as_str()),
            _ => None,
        })
        .unwrap_or("")
}

impl<'a> TraceView<'a> {
    pub fn new(t: &'a ExportTraceServiceRequest) -> TraceView<'a> {
        let mut spans = Vec::new();
        for rs in &t.resource_spans {
            let resource: &[KeyValue] = rs.resource.as_ref().map_or(&[], |r| &r.attributes);
            for ss in &rs.scope_spans {
                let (name, version, attrs): (&str, &str, &[KeyValue]) = match &ss.scope {
                    Some(s) => (&s.name, &s.version, &s.attributes),
                    None => ("", "", &[]),
                };
                for span in &ss.spans {
                    spans.push(Span {
                        span,
                        resource,
                        scope_name: name,
                        scope_version: version,
                        scope_attrs: attrs,
                        service: service_of(resource),
                        parent: None,
                    });
                }
            }
        }
        let by_id: HashMap<&[u8], usize> = spans
            .iter()
            .enumerate()
            .map(|(i, s)| (s.span.span_id.as_slice(), i))
            .collect();
        let mut children = vec![Vec::new(); spans.len()];
        for (i, s) in spans.iter_mut().enumerate() {
            let p = &s.span.parent_span_id;
            if !p.is_empty()
                && let Some(&pi) = by_id.get(p.as_slice())
                && pi != i
            {
                s.parent = Some(pi);
                children[pi].push(i);
            }
        }
        // The root: a span without a parent id, else the earliest.
        let root = (0..spans.len()).min_by_key(|&i| {
            (
                !spans[i].span.parent_span_id.is_empty(),
                spans[i].span.start_time_unix_nano,
            )
        });
        let start = spans.iter().map(|s| s.span.start_time_unix_nano).min().unwrap_or(0);
        let end = spans.iter().map(|s| s.span.end_time_unix_nano).max().unwrap_or(0);
        let trace_id = spans.first().map(|s| s.span.trace_id.clone()).unwrap_or_default();
        let (order, tree_parent) = walk(&spans, &children);
        TraceView {
            spans,
            trace_id,
            root,
            start,
            end,
            children,
            order,
            tree_parent,
        }
    }

    pub fn root_name(&self) -> &str {
        self.root.map_or("", |r| self.spans[r].span.name.as_str())
    }

    pub fn root_service(&self) -> &str {
        self.root.map_or("", |r| self.spans[r].service)
    }

    /// Which spans have a strict ancestor in `set`: one pass, parents
    /// first.
    fn below(&self, set: &[bool]) -> Vec<bool> {
        let mut out = vec![false; self.spans.len()];
        for &j in &self.order {
            if let Some(p) = self.tree_parent[j] {
                out[j] = set[p] || out[p];
            }
        }
        out
    }

    /// Which spans have a strict descendant in `set`: one pass, children
    /// first.
    fn above(&self, set: &[bool]) -> Vec<bool> {
        let mut out = vec![false; self.spans.len()];
        for &j in self.order.iter().rev() {
            if let Some(p) = self.tree_parent[j]
                && (set[j] || out[j])
            {
                out[p] = true;
            }
        }
        out
    }

    /// How many spans of `set` each span parents.
    fn parented(&self, set: &[bool]) -> Vec<u32> {
        let mut out = vec![0u32; self.spans.len()];
        for (i, s) in self.spans.iter().enumerate() {
            if set[i]
                && let Some(p) = s.parent
            {
                out[p] += 1;
            }
        }
        out
    }
}

/// The depth-first order of `spans` (parents first) and each span's
/// parent in it, iteratively: no recursion however deep the trace.
fn walk(spans: &[Span<'_>], children: &[Vec<usize>]) -> (Vec<usize>, Vec<Option<usize>>) {
    let n = spans.len();
    let mut seen = vec![false; n];
    let mut order = Vec::with_capacity(n);
    let mut tree_parent = vec![None; n];
    let mut stack = Vec::new();
    let roots = (0..n).filter(|&i| spans[i].parent.is_none()).chain(0..n);
    for r in roots {
        if seen[r] {
            continue;
        }
        seen[r] = true;
        stack.push(r);
        while let Some(i) = stack.pop() {
            order.push(i);
            for &c in children[i].iter().rev() {
                if !seen[c] {
                    seen[c] = true;
                    tree_parent[c] = Some(i);
                    stack.push(c);
                }
            }
        }
    }
    (order, tree_parent)
}

/// A value a condition reads or compares.
#[derive(Debug, Clone, PartialEq)]
pub enum V {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Dur(i64),
    Status(Status),
    Kind(Kind),
    Nil,
}

impl V {
    fn num(&self) -> Option<f64> {
        match self {
            V::Int(i) => Some(*i as f64),
            V::Float(f) => Some(*f),
            V::Dur(d) => Some(*d as f64),
            _ => None,
        }
    }

    /// OTLP/JSON of the value, as Tempo's search answers carry it.
    pub fn json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            V::Str(s) => json!({"stringValue": s}),
            V::Int(i) => json!({"intValue": i.to_string()}),
            V::Float(f) => json!({"doubleValue": f}),
            V::Bool(b) => json!({"boolValue": b}),
            V::Dur(d) => {
                json!({"stringValue": format!("{}", humantime::format_duration(std::time::Duration::from_nanos((*d).max(0) as u64)))})
            }
            V::Status(s) => json!({"stringValue": status_word(*s)}),
            V::Kind(k) => json!({"stringValue": kind_word(*k)}),
            V::Nil => json!({}),
        }
    }
}

pub fn status_word(s: Status) -> &'static str {
    match s {
        Status::Error => "error",
        Status::Ok => "ok",
        Status::Unset => "unset",
    }
}

pub fn kind_word(k: Kind) -> &'static str {
    match k {
        Kind::Unspecified => "unspecified",
        Kind::Internal => "internal",
        Kind::Server => "server",
        Kind::Client => "client",
        Kind::Producer => "producer",
        Kind::Consumer => "consumer",
    }
}

fn of_any(v: &AnyValue) -> V {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => V::Str(s.clone()),
        Some(any_value::Value::IntValue(i)) => V::Int(*i),
        Some(any_value::Value::DoubleValue(d)) => V::Float(*d),
        Some(any_value::Value::BoolValue(b)) => V::Bool(*b),
        None => V::Nil,
        // Arrays, maps and bytes compare as nothing.
        Some(_) => V::Nil,
    }
}

fn find(attrs: &[KeyValue], key: &str) -> Option<V> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| kv.value.as_ref().map_or(V::Nil, of_any))
}

fn status_of(code: i32) -> Status {
    match code {
        1 => Status::Ok,
        2 => Status::Error,
        _ => Status::Unset,
    }
}

fn kind_of(k: i32) -> Kind {
    match k {
        1 => Kind::Internal,
        2 => Kind::Server,
        3 => Kind::Client,
        4 => Kind::Producer,
        5 => Kind::Consumer,
        _ => Kind::Unspecified,
    }
}

/// A compiled query: regexes compiled once, unsupported parts refused.
#[derive(Debug)]
pub struct Compiled {
    query: Query,
    regexes: HashMap<String, Regex>,
}

impl Compiled {
    pub fn new(query: Query) -> Result<Compiled, QueryError> {
        if query.metrics().is_some() {
            return Err(unsupported("a metrics query (rate(), count_over_time(), ...)"));
        }
        let mut c = Compiled {
            query,
            regexes: HashMap::new(),
        };
        let mut pats = Vec::new();
        check_spanset(&c.query.expr, &mut pats)?;
        for p in pats {
            let re = mira_core::scan::compile_regex(&p, true)
                .map_err(|e| QueryError::BadRequest(format!("regex {p:?}: {e}")))?;
            c.regexes.insert(p, re);
        }
        Ok(c)
    }

    pub fn query(&self) -> &Query {
        &self.query
    }

    /// The span sets of the trace that the query keeps.
    pub fn run(&self, t: &TraceView<'_>) -> Vec<Vec<usize>> {
        let all: Vec<usize> = (0..t.spans.len()).collect();
        self.spanset(&self.query.expr, t, vec![all])
    }

    fn spanset(&self, e: &SpansetExpr, t: &TraceView<'_>, input: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
        match e {
            SpansetExpr::Filter(f) => input
                .into_iter()
                .map(|set| set.into_iter().filter(|&i| self.truthy(f, t, i)).collect::<Vec<_>>())
                .filter(|s| !s.is_empty())
                .collect(),
            SpansetExpr::And(a, b) => {
                let l = self.spanset(a, t, input.clone());
                let r = self.spanset(b, t, input);
                if l.is_empty() || r.is_empty() {
                    return Vec::new();
                }
                vec![union(l.into_iter().chain(r))]
            }
            SpansetExpr::Or(a, b) => {
                let l = self.spanset(a, t, input.clone());
                let r = self.spanset(b, t, input);
                if l.is_empty() && r.is_empty() {
                    return Vec::new();
                }
                vec![union(l.into_iter().chain(r))]
            }
            SpansetExpr::Structural { op, lhs, rhs } => {
                let l = union(self.spanset(lhs, t, input.clone()));
                let r = union(self.spanset(rhs, t, input));
                let out = structural(*op, t, &l, &r);
                if out.is_empty() { Vec::new() } else { vec![out] }
            }
            SpansetExpr::Pipeline(first, stages) => {
                let mut sets = self.spanset(first, t, input);
                for s in stages {
                    sets = self.stage(s, t, sets);
                    if sets.is_empty() {
                        break;
                    }
                }
                sets
            }
        }
    }

    fn stage(&self, s: &Stage, t: &TraceView<'_>, sets: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
        match s {
            Stage::Filter(e) => sets.into_iter().flat_map(|set| self.spanset(e, t, vec![set])).collect(),
            Stage::Scalar { lhs, op, rhs } => sets
                .into_iter()
                .filter(|set| match (self.scalar(lhs, t, set), self.scalar(rhs, t, set)) {
                    (Some(a), Some(b)) => compare_num(*op, a, b),
                    _ => false,
                })
                .collect(),
            // Select only names what to return; coalesce merges.
            Stage::Select(_) => sets,
            Stage::Coalesce => vec![union(sets)],
            Stage::By(f) => {
                let mut groups: Vec<(V, Vec<usize>)> = Vec::new();
                for set in sets {
                    for i in set {
                        let v = self.value(f, t, i);
                        match groups.iter_mut().find(|(g, _)| *g == v) {
                            Some((_, m)) => m.push(i),
                            None => groups.push((v, vec![i])),
                        }
                    }
                }
                groups.into_iter().map(|(_, m)| m).collect()
            }
            Stage::Metrics(_) => Vec::new(),
        }
    }

    fn scalar(&self, e: &ScalarExpr, t: &TraceView<'_>, set: &[usize]) -> Option<f64> {
        match e {
            ScalarExpr::Static(s) => static_value(s).num(),
            ScalarExpr::Neg(x) => self.scalar(x, t, set).map(|v| -v),
            ScalarExpr::Binary { op, lhs, rhs } => arith(*op, self.scalar(lhs, t, set)?, self.scalar(rhs, t, set)?),
            ScalarExpr::Aggregate(a) => {
                let vals =
                    |f: &FieldExpr| -> Vec<f64> { set.iter().filter_map(|&i| self.value(f, t, i).num()).collect() };
                match a {
                    Aggregate::Count => Some(set.len() as f64),
                    Aggregate::Sum(f) => Some(vals(f).iter().sum()),
                    Aggregate::Avg(f) => {
                        let v = vals(f);
                        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
                    }
                    Aggregate::Min(f) => vals(f).into_iter().reduce(f64::min),
                    Aggregate::Max(f) => vals(f).into_iter().reduce(f64::max),
                }
            }
        }
    }

    fn truthy(&self, f: &FieldExpr, t: &TraceView<'_>, i: usize) -> bool {
        self.value(f, t, i) == V::Bool(true)
    }

    fn value(&self, f: &FieldExpr, t: &TraceView<'_>, i: usize) -> V {
        match f {
            FieldExpr::Static(s) => static_value(s),
            FieldExpr::Attr(a) => attr(a, t, i),
            FieldExpr::Not(x) => match self.value(x, t, i) {
                V::Bool(b) => V::Bool(!b),
                _ => V::Nil,
            },
            FieldExpr::Neg(x) => match self.value(x, t, i) {
                V::Int(v) => V::Int(-v),
                V::Float(v) => V::Float(-v),
                V::Dur(v) => V::Dur(-v),
                _ => V::Nil,
            },
            FieldExpr::Binary { op, lhs, rhs } => match op {
                BinOp::And => V::Bool(self.truthy(lhs, t, i) && self.truthy(rhs, t, i)),
                BinOp::Or => V::Bool(self.truthy(lhs, t, i) || self.truthy(rhs, t, i)),
                BinOp::Cmp(c) => V::Bool(compare(*c, &self.value(lhs, t, i), &self.value(rhs, t, i))),
                BinOp::Re | BinOp::NotRe => {
                    let (V::Str(s), Some(re)) = (self.value(lhs, t, i), self.regex_of(rhs)) else {
                        return V::Bool(false);
                    };
                    V::Bool(re.is_match(&s) == (*op == BinOp::Re))
                }
                BinOp::Arith(a) => {
                    let (l, r) = (self.value(lhs, t, i), self.value(rhs, t, i));
                    match (&l, &r) {
                        (V::Int(x), V::Int(y)) if *a != ArithOp::Div && *a != ArithOp::Pow => {
                            arith(*a, *x as f64, *y as f64).map_or(V::Nil, |v| V::Int(v as i64))
                        }
                        (V::Dur(_), _) | (_, V::Dur(_)) => match (l.num(), r.num()) {
                            (Some(x), Some(y)) => arith(*a, x, y).map_or(V::Nil, |v| V::Dur(v as i64)),
                            _ => V::Nil,
                        },
                        _ => match (l.num(), r.num()) {
                            (Some(x), Some(y)) => arith(*a, x, y).map_or(V::Nil, V::Float),
                            _ => V::Nil,
                        },
                    }
                }
            },
        }
    }

    fn regex_of(&self, e: &FieldExpr) -> Option<&Regex> {
        match e {
            FieldExpr::Static(Static::Str(p)) => self.regexes.get(p),
            _ => None,
        }
    }
}

/// Refuses what is not evaluated; gathers the regex patterns.
fn check_spanset(e: &SpansetExpr, pats: &mut Vec<String>) -> Result<(), QueryError> {
    match e {
        SpansetExpr::Filter(f) => check_field(f, pats),
        SpansetExpr::And(a, b) | SpansetExpr::Or(a, b) => {
            check_spanset(a, pats)?;
            check_spanset(b, pats)
        }
        SpansetExpr::Structural { lhs, rhs, .. } => {
            check_spanset(lhs, pats)?;
            check_spanset(rhs, pats)
        }
        SpansetExpr::Pipeline(first, stages) => {
            check_spanset(first, pats)?;
            for s in stages {
                match s {
                    Stage::Filter(e) => check_spanset(e, pats)?,
                    Stage::By(f) => check_field(f, pats)?,
                    Stage::Select(attrs) => {
                        for a in attrs {
                            check_attr(a)?;
                        }
                    }
                    Stage::Scalar { lhs, rhs, .. } => {
                        check_scalar(lhs, pats)?;
                        check_scalar(rhs, pats)?;
                    }
                    Stage::Coalesce => {}
                    Stage::Metrics(_) => return Err(unsupported("a metrics stage")),
                }
            }
            Ok(())
        }
    }
}

fn check_scalar(e: &ScalarExpr, pats: &mut Vec<String>) -> Result<(), QueryError> {
    match e {
        ScalarExpr::Static(_) => Ok(()),
        ScalarExpr::Neg(x) => check_scalar(x, pats),
        ScalarExpr::Binary { lhs, rhs, .. } => {
            check_scalar(lhs, pats)?;
            check_scalar(rhs, pats)
        }
        ScalarExpr::Aggregate(Aggregate::Count) => Ok(()),
        ScalarExpr::Aggregate(Aggregate::Avg(f) | Aggregate::Min(f) | Aggregate::Max(f) | Aggregate::Sum(f)) => {
            check_field(f, pats)
        }
    }
}

fn check_field(f: &FieldExpr, pats: &mut Vec<String>) -> Result<(), QueryError> {
    match f {
        FieldExpr::Static(_) => Ok(()),
        FieldExpr::Attr(a) => check_attr(a),
        FieldExpr::Not(x) | FieldExpr::Neg(x) => check_field(x, pats),
        FieldExpr::Binary { op, lhs, rhs } => {
            if matches!(op, BinOp::Re | BinOp::NotRe) {
                match &**rhs {
                    FieldExpr::Static(Static::Str(p)) => pats.push(p.clone()),
                    _ => {
                        return Err(QueryError::BadRequest(
                            "the right side of =~ and !~ must be a string".into(),
                        ));
                    }
                }
            }
            check_field(lhs, pats)?;
            check_field(rhs, pats)
        }
    }
}

fn check_attr(a: &Attribute) -> Result<(), QueryError> {
    match a {
        Attribute::Intrinsic(
            i @ (Intrinsic::EventName
            | Intrinsic::EventTimeSinceStart
            | Intrinsic::LinkSpanId
            | Intrinsic::LinkTraceId
            | Intrinsic::Parent),
        ) => Err(unsupported(&format!("the intrinsic {}", i.as_str()))),
        Attribute::Named { parent: true, .. } => Err(unsupported("parent. attributes")),
        Attribute::Named {
            scope: Scope::Event | Scope::Link,
            ..
        } => Err(unsupported("event. and link. attributes")),
        _ => Ok(()),
    }
}

pub fn static_value(s: &Static) -> V {
    match s {
        Static::Str(x) => V::Str(x.clone()),
        Static::Int(i) => V::Int(*i),
        Static::Float(f) => V::Float(*f),
        Static::Bool(b) => V::Bool(*b),
        Static::Duration(d) => V::Dur(*d),
        Static::Status(s) => V::Status(*s),
        Static::Kind(k) => V::Kind(*k),
        Static::Nil => V::Nil,
    }
}

/// The value of an attribute on span `i`.
pub fn attr(a: &Attribute, t: &TraceView<'_>, i: usize) -> V {
    let s = &t.spans[i];
    match a {
        Attribute::Intrinsic(x) => match x {
            Intrinsic::Name => V::Str(s.span.name.clone()),
            Intrinsic::Status => V::Status(status_of(s.span.status.as_ref().map_or(0, |st| st.code))),
            Intrinsic::StatusMessage => V::Str(s.span.status.as_ref().map_or(String::new(), |st| st.message.clone())),
            Intrinsic::Duration => V::Dur(s.duration()),
            Intrinsic::Kind => V::Kind(kind_of(s.span.kind)),
            Intrinsic::SpanId => V::Str(hex(&s.span.span_id)),
            Intrinsic::ParentId => V::Str(hex(&s.span.parent_span_id)),
            Intrinsic::ChildCount => V::Int(t.children[i].len() as i64),
            Intrinsic::TraceDuration => V::Dur(t.end.saturating_sub(t.start) as i64),
            Intrinsic::RootName => V::Str(t.root_name().to_owned()),
            Intrinsic::RootServiceName => V::Str(t.root_service().to_owned()),
            Intrinsic::TraceId => V::Str(hex(&t.trace_id)),
            Intrinsic::InstrumentationName => V::Str(s.scope_name.to_owned()),
            Intrinsic::InstrumentationVersion => V::Str(s.scope_version.to_owned()),
            Intrinsic::EventName
            | Intrinsic::EventTimeSinceStart
            | Intrinsic::LinkSpanId
            | Intrinsic::LinkTraceId
            | Intrinsic::Parent => V::Nil,
        },
        Attribute::Named { scope, name, .. } => match scope {
            Scope::Span => find(&s.span.attributes, name).unwrap_or(V::Nil),
            Scope::Resource => find(s.resource, name).unwrap_or(V::Nil),
            Scope::Instrumentation => find(s.scope_attrs, name).unwrap_or(V::Nil),
            Scope::Unscoped => find(&s.span.attributes, name)
                .or_else(|| find(s.resource, name))
                .unwrap_or(V::Nil),
            Scope::Event | Scope::Link => V::Nil,
        },
    }
}

fn compare_num(op: CmpOp, a: f64, b: f64) -> bool {
    match op {
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
    }
}

/// Typed comparison: numbers with numbers (ints and floats mix),
/// durations with durations (or numbers), strings with strings, keywords
/// with their kind; `nil` only equals a missing value. Anything else is
/// false, `!=` included.
pub fn compare(op: CmpOp, a: &V, b: &V) -> bool {
    use std::cmp::Ordering;
    let ord: Option<Ordering> = match (a, b) {
        (V::Nil, V::Nil) => Some(Ordering::Equal),
        // `x != nil`: x exists. A missing attribute satisfies nothing
        // else (`span.a != "b"` needs an `a`).
        (_, V::Nil) => return op == CmpOp::Ne,
        (V::Nil, _) => return false,
        (V::Str(x), V::Str(y)) => Some(x.cmp(y)),
        (V::Bool(x), V::Bool(y)) => {
            return match op {
                CmpOp::Eq => x == y,
                CmpOp::Ne => x != y,
                _ => false,
            };
        }
        (V::Status(x), V::Status(y)) => {
            return match op {
                CmpOp::Eq => x == y,
                CmpOp::Ne => x != y,
                _ => false,
            };
        }
        (V::Kind(x), V::Kind(y)) => {
            return match op {
                CmpOp::Eq => x == y,
                CmpOp::Ne => x != y,
                _ => false,
            };
        }
        (V::Int(_) | V::Float(_) | V::Dur(_), V::Int(_) | V::Float(_) | V::Dur(_)) => {
            a.num().and_then(|x| b.num().and_then(|y| x.partial_cmp(&y)))
        }
        _ => None,
    };
    let Some(o) = ord else { return false };
    match op {
        CmpOp::Eq => o == Ordering::Equal,
        CmpOp::Ne => o != Ordering::Equal,
        CmpOp::Lt => o == Ordering::Less,
        CmpOp::Le => o != Ordering::Greater,
        CmpOp::Gt => o == Ordering::Greater,
        CmpOp::Ge => o != Ordering::Less,
    }
}

fn arith(op: ArithOp, a: f64, b: f64) -> Option<f64> {
    Some(match op {
        ArithOp::Add => a + b,
        ArithOp::Sub => a - b,
        ArithOp::Mul => a * b,
        ArithOp::Div => {
            if b == 0.0 {
                return None;
            }
            a / b
        }
        ArithOp::Mod => {
            if b == 0.0 {
                return None;
            }
            a % b
        }
        ArithOp::Pow => a.powf(b),
    })
}

fn union(sets: impl IntoIterator<Item = Vec<usize>>) -> Vec<usize> {
    let mut all: Vec<usize> = sets.into_iter().flatten().collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// `l >op> r` over one trace in time linear in its spans: membership as
/// flags, the transitive relations in one pass each over the walk
/// ([`TraceView::below`], [`TraceView::above`]), siblings by a count per
/// parent.
fn structural(op: StructOp, t: &TraceView<'_>, l: &[usize], r: &[usize]) -> Vec<usize> {
    let n = t.spans.len();
    let flags = |set: &[usize]| {
        let mut f = vec![false; n];
        for &i in set {
            f[i] = true;
        }
        f
    };
    let in_l = flags(l);
    // Whether span j relates to some span of `set` (flags `of`) by `op`'s
    // relation, read from R's side: j's parent in set, j parents one, j
    // below / above one, j shares a parent with one that is not j.
    let relate = |rel: StructOp, of: &[bool]| -> Vec<bool> {
        match rel {
            StructOp::Child => (0..n).map(|j| t.spans[j].parent.is_some_and(|p| of[p])).collect(),
            StructOp::Parent => (0..n).map(|j| t.children[j].iter().any(|&c| of[c])).collect(),
            StructOp::Descendant => t.below(of),
            StructOp::Ancestor => t.above(of),
            _ => {
                let per_parent = t.parented(of);
                (0..n)
                    .map(|j| t.spans[j].parent.is_some_and(|p| per_parent[p] > u32::from(of[j])))
                    .collect()
            }
        }
    };
    let base = match op {
        StructOp::Child | StructOp::NotChild | StructOp::UnionChild => StructOp::Child,
        StructOp::Parent | StructOp::NotParent | StructOp::UnionParent => StructOp::Parent,
        StructOp::Descendant | StructOp::NotDescendant | StructOp::UnionDescendant => StructOp::Descendant,
        StructOp::Ancestor | StructOp::NotAncestor | StructOp::UnionAncestor => StructOp::Ancestor,
        _ => StructOp::Sibling,
    };
    let related = relate(base, &in_l);
    match op {
        StructOp::NotChild
        | StructOp::NotParent
        | StructOp::NotDescendant
        | StructOp::NotAncestor
        | StructOp::NotSibling => r.iter().copied().filter(|&j| !related[j]).collect(),
        StructOp::UnionChild
        | StructOp::UnionParent
        | StructOp::UnionDescendant
        | StructOp::UnionAncestor
        | StructOp::UnionSibling => {
            let rs: Vec<usize> = r.iter().copied().filter(|&j| related[j]).collect();
            if rs.is_empty() {
                return Vec::new();
            }
            // The left spans that take part in a relation with one of
            // those right: the converse relation, read from L's side.
            let converse = match base {
                StructOp::Child => StructOp::Parent,
                StructOp::Parent => StructOp::Child,
                StructOp::Descendant => StructOp::Ancestor,
                StructOp::Ancestor => StructOp::Descendant,
                _ => StructOp::Sibling,
            };
            let back = relate(converse, &flags(&rs));
            let mut ls: Vec<usize> = l.iter().copied().filter(|&i| back[i]).collect();
            ls.extend(rs);
            union([ls])
        }
        _ => r.iter().copied().filter(|&j| related[j]).collect(),
    }
}

/// The attributes a query names (conditions, `by`, `select`), to return
/// with each matched span.
pub fn named_attributes(q: &Query) -> Vec<Attribute> {
    let mut out = Vec::new();
    fn field(f: &FieldExpr, out: &mut Vec<Attribute>) {
        match f {
            FieldExpr::Attr(a) => {
                if !out.contains(a) {
                    out.push(a.clone());
                }
            }
            FieldExpr::Not(x) | FieldExpr::Neg(x) => field(x, out),
            FieldExpr::Binary { lhs, rhs, .. } => {
                field(lhs, out);
                field(rhs, out);
            }
            FieldExpr::Static(_) => {}
        }
    }
    fn spanset(e: &SpansetExpr, out: &mut Vec<Attribute>) {
        match e {
            SpansetExpr::Filter(f) => field(f, out),
            SpansetExpr::And(a, b) | SpansetExpr::Or(a, b) => {
                spanset(a, out);
                spanset(b, out);
            }
            SpansetExpr::Structural { lhs, rhs, .. } => {
                spanset(lhs, out);
                spanset(rhs, out);
            }
            SpansetExpr::Pipeline(first, stages) => {
                spanset(first, out);
                for s in stages {
                    match s {
                        Stage::Filter(e) => spanset(e, out),
                        Stage::By(f) => field(f, out),
                        Stage::Select(attrs) => {
                            for a in attrs {
                                if !out.contains(a) {
                                    out.push(a.clone());
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    spanset(&q.expr, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as OtlpSpan, Status as OtlpStatus};

    fn kv(k: &str, v: any_value::Value) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        }
    }

    fn span(id: u8, parent: u8, name: &str, kind: i32, ms: u64, code: i32, attrs: Vec<KeyValue>) -> OtlpSpan {
        OtlpSpan {
            trace_id: vec![7; 16],
            span_id: vec![id; 8],
            parent_span_id: if parent == 0 { vec![] } else { vec![parent; 8] },
            name: name.into(),
            kind,
            start_time_unix_nano: 1_000_000_000 + u64::from(id),
            end_time_unix_nano: 1_000_000_000 + u64::from(id) + ms * 1_000_000,
            attributes: attrs,
            status: Some(OtlpStatus {
                code,
                message: String::new(),
            }),
            ..Default::default()
        }
    }

    /// shop: root(1, server, 300ms) > db(2, client, error) and cache(3,
    /// client) ; db > row(4, internal).
    fn trace() -> ExportTraceServiceRequest {
        let spans = vec![
            span(
                1,
                0,
                "GET /",
                2,
                300,
                0,
                vec![kv("http.status_code", any_value::Value::IntValue(500))],
            ),
            span(
                2,
                1,
                "db",
                3,
                50,
                2,
                vec![kv("db.system", any_value::Value::StringValue("pg".into()))],
            ),
            span(3, 1, "cache", 3, 5, 1, vec![]),
            span(4, 2, "row", 1, 1, 0, vec![]),
        ];
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", any_value::Value::StringValue("shop".into()))],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    /// The span ids of each kept span set.
    fn run(q: &str) -> Vec<Vec<u8>> {
        let t = trace();
        let view = TraceView::new(&t);
        let c = Compiled::new(super::super::parse(q).expect("parses")).expect("compiles");
        c.run(&view)
            .into_iter()
            .map(|set| set.into_iter().map(|i| view.spans[i].span.span_id[0]).collect())
            .collect()
    }

    #[test]
    fn filters_are_typed_and_nil_aware() {
        assert_eq!(run("{}"), vec![vec![1, 2, 3, 4]]);
        assert_eq!(run("{span.http.status_code = 500}"), vec![vec![1]]);
        // A string never equals a number.
        assert!(run(r#"{span.http.status_code = "500"}"#).is_empty());
        // A missing attribute satisfies no comparison but `= nil`.
        assert_eq!(run(r#"{span.db.system != "mysql"}"#), vec![vec![2]]);
        assert_eq!(run("{span.db.system != nil}"), vec![vec![2]]);
        assert_eq!(run("{span.db.system = nil}"), vec![vec![1, 3, 4]]);
        assert_eq!(run(r#"{.service.name = "shop" && status = error}"#), vec![vec![2]]);
        assert_eq!(run("{duration > 10ms && kind = client}"), vec![vec![2]]);
        assert_eq!(run(r#"{name =~ "c.*"}"#), vec![vec![3]]);
        // Anchored: "b" is inside "db" but is not all of it.
        assert!(run(r#"{name =~ "b"}"#).is_empty());
        assert_eq!(
            run(r#"{rootName = "GET /" && traceDuration >= 300ms && name = "row"}"#),
            vec![vec![4]]
        );
    }

    #[test]
    fn spanset_and_structural_operators() {
        assert_eq!(run("{kind = server} > {kind = client}"), vec![vec![2, 3]]);
        assert_eq!(run("{kind = server} >> {kind = internal}"), vec![vec![4]]);
        assert!(run("{kind = server} > {kind = internal}").is_empty());
        assert_eq!(run(r#"{name = "row"} < {}"#), vec![vec![2]]);
        assert_eq!(run(r#"{name = "row"} << {}"#), vec![vec![1, 2]]);
        assert_eq!(run(r#"{name = "db"} ~ {}"#), vec![vec![3]]);
        assert_eq!(run("{kind = server} !> {}"), vec![vec![1, 4]]);
        assert_eq!(run(r#"{name = "db"} && {name = "cache"}"#), vec![vec![2, 3]]);
        assert!(run(r#"{name = "db"} && {name = "nope"}"#).is_empty());
        assert_eq!(run(r#"{name = "db"} || {name = "nope"}"#), vec![vec![2]]);
    }

    #[test]
    fn pipelines_aggregate_group_and_refuse_metrics() {
        assert_eq!(run("{kind = client} | count() > 1"), vec![vec![2, 3]]);
        assert!(run("{kind = client} | count() > 2").is_empty());
        assert_eq!(run("{kind = client} | avg(duration) > 20ms"), vec![vec![2, 3]]);
        assert!(run("{kind = client} | max(duration) < 20ms").is_empty());
        assert_eq!(run("{} | by(kind)"), vec![vec![1], vec![2, 3], vec![4]]);
        assert_eq!(run("{} | by(kind) | coalesce()"), vec![vec![1, 2, 3, 4]]);
        let e = Compiled::new(super::super::parse("{} | rate()").expect("parses")).expect_err("metrics");
        assert!(e.to_string().contains("not supported"), "{e}");
        let e = Compiled::new(super::super::parse(r#"{name =~ "("}"#).expect("parses")).expect_err("regex");
        assert!(e.to_string().contains("regex"), "{e}");
    }

    /// The relations as their definitions read, by walking parent chains
    /// (quadratic and worse): what [`structural`] must equal.
    fn naive(op: StructOp, t: &TraceView<'_>, l: &[usize], r: &[usize]) -> Vec<usize> {
        let ancestors = |mut i: usize| {
            let mut out = Vec::new();
            while let Some(p) = t.spans[i].parent {
                out.push(p);
                i = p;
            }
            out
        };
        let rel = |base: StructOp, i: usize, j: usize| match base {
            StructOp::Child => t.spans[j].parent == Some(i),
            StructOp::Parent => t.spans[i].parent == Some(j),
            StructOp::Descendant => ancestors(j).contains(&i),
            StructOp::Ancestor => ancestors(i).contains(&j),
            _ => i != j && t.spans[i].parent.is_some() && t.spans[i].parent == t.spans[j].parent,
        };
        use StructOp::*;
        let (base, kind) = match op {
            Child | NotChild | UnionChild => (Child, op),
            Parent | NotParent | UnionParent => (Parent, op),
            Descendant | NotDescendant | UnionDescendant => (Descendant, op),
            Ancestor | NotAncestor | UnionAncestor => (Ancestor, op),
            _ => (Sibling, op),
        };
        let related = |j: usize| l.iter().any(|&i| rel(base, i, j));
        match kind {
            NotChild | NotParent | NotDescendant | NotAncestor | NotSibling => {
                r.iter().copied().filter(|&j| !related(j)).collect()
            }
            UnionChild | UnionParent | UnionDescendant | UnionAncestor | UnionSibling => {
                let rs: Vec<usize> = r.iter().copied().filter(|&j| related(j)).collect();
                if rs.is_empty() {
                    return Vec::new();
                }
                let mut ls: Vec<usize> = l
                    .iter()
                    .copied()
                    .filter(|&i| rs.iter().any(|&j| rel(base, i, j)))
                    .collect();
                ls.extend(rs);
                union([ls])
            }
            _ => r.iter().copied().filter(|&j| related(j)).collect(),
        }
    }

    /// A trace of `parents.len()` spans: span i's parent is span
    /// `parents[i]` when that is below i (a forest), else none.
    fn forest(parents: &[usize]) -> ExportTraceServiceRequest {
        let id = |i: usize| (i as u64 + 1).to_be_bytes().to_vec();
        let spans = parents
            .iter()
            .enumerate()
            .map(|(i, &p)| OtlpSpan {
                trace_id: vec![7; 16],
                span_id: id(i),
                parent_span_id: if p < i { id(p) } else { Vec::new() },
                name: format!("s{i}"),
                start_time_unix_nano: 1 + i as u64,
                end_time_unix_nano: 2 + i as u64,
                ..Default::default()
            })
            .collect();
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    const ALL_OPS: [StructOp; 15] = [
        StructOp::Child,
        StructOp::Parent,
        StructOp::Descendant,
        StructOp::Ancestor,
        StructOp::Sibling,
        StructOp::NotChild,
        StructOp::NotParent,
        StructOp::NotDescendant,
        StructOp::NotAncestor,
        StructOp::NotSibling,
        StructOp::UnionChild,
        StructOp::UnionParent,
        StructOp::UnionDescendant,
        StructOp::UnionAncestor,
        StructOp::UnionSibling,
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 96, ..Default::default() })]
        #[test]
        fn structural_operators_equal_their_definitions(
            parents in proptest::collection::vec(0usize..40, 1..40),
            picks in proptest::collection::vec(0u8..4, 40),
        ) {
            let t = forest(&parents);
            let view = TraceView::new(&t);
            let n = view.spans.len();
            let l: Vec<usize> = (0..n).filter(|&i| picks[i] & 1 == 1).collect();
            let r: Vec<usize> = (0..n).filter(|&i| picks[i] & 2 == 2).collect();
            for op in ALL_OPS {
                proptest::prop_assert_eq!(structural(op, &view, &l, &r), naive(op, &view, &l, &r), "{:?}", op);
            }
        }
    }

    #[test]
    fn a_chain_of_a_hundred_thousand_spans_is_walked_without_recursion() {
        // Each span the child of the one before: 100,000 deep.
        let parents: Vec<usize> = (0..100_000).map(|i: usize| i.saturating_sub(1)).collect();
        let t = forest(&parents);
        let view = TraceView::new(&t);
        let all: Vec<usize> = (0..view.spans.len()).collect();
        // Every span but the root descends from the root; every span but
        // the last is an ancestor of the last.
        assert_eq!(structural(StructOp::Descendant, &view, &[0], &all).len(), 99_999);
        assert_eq!(structural(StructOp::Ancestor, &view, &[99_999], &all).len(), 99_999);
        assert_eq!(structural(StructOp::Sibling, &view, &all, &all), Vec::<usize>::new());
    }
}
