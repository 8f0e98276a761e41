//! TraceQL's syntax tree: what [`super::parse`] builds and the evaluator
//! reads. The evaluator runs a query over one whole trace (its spans and
//! their parent ids); the tree keeps what the query says, not how to run
//! it.
//!
//! A query is one [`SpansetExpr`]: spanset filters `{ ... }` combined with
//! `&&`, `||` and the structural operators, and pipelines
//! `expr | stage | stage` whose stages filter, aggregate, group, select or
//! (last, and only at the top) compute metrics. Everything Tempo parses is
//! here, including what the evaluator will refuse (metrics, `parent.`
//! attributes, `coalesce()`): it answers 400 "unsupported" for those
//! rather than a parse error.

/// A whole query: `expr` then optional `with(name=value, ...)` hints.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub expr: SpansetExpr,
    pub hints: Vec<Hint>,
}

impl Query {
    /// The metrics stage, when the query is a metrics query
    /// (`{...} | rate() by (...)`): always the last stage of the
    /// top-level pipeline.
    pub fn metrics(&self) -> Option<&MetricsStage> {
        match &self.expr {
            SpansetExpr::Pipeline(_, stages) => match stages.last() {
                Some(Stage::Metrics(m)) => Some(m),
                _ => None,
            },
            _ => None,
        }
    }
}

/// A query hint: `with(most_recent=true)`, `with(sample=0.1)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Hint {
    pub name: String,
    pub value: Static,
}

/// An expression whose value is a set of spansets (for one trace).
#[derive(Debug, Clone, PartialEq)]
pub enum SpansetExpr {
    /// `{ cond }`: the spans for which `cond` is true. `{}` is
    /// `Filter(FieldExpr::Static(Static::Bool(true)))`.
    Filter(FieldExpr),
    /// `lhs && rhs`: both sides match; the spans of both.
    And(Box<SpansetExpr>, Box<SpansetExpr>),
    /// `lhs || rhs`: either side matches; the spans of either.
    Or(Box<SpansetExpr>, Box<SpansetExpr>),
    /// `lhs > rhs` and the other structural operators, see [`StructOp`].
    Structural {
        op: StructOp,
        lhs: Box<SpansetExpr>,
        rhs: Box<SpansetExpr>,
    },
    /// `input | stage | stage ...`, stages in query order (never empty).
    /// A query or a parenthesised pipeline that starts with a stage
    /// (`count() > 2`, `by(.a) | ...`, `select(...)`) gets
    /// `{}` as its input: the stage sees every span of the trace.
    Pipeline(Box<SpansetExpr>, Vec<Stage>),
}

/// Structural operators between two spanset expressions. `L op R`
/// returns the spans of `R` related to a span of `L` as named (the
/// `Union*` forms return the matching spans of both sides, the `Not*`
/// forms the spans of `R` that have no such relation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StructOp {
    /// `>`: R's parent is in L.
    Child,
    /// `<`: R is the parent of a span in L.
    Parent,
    /// `>>`: R descends from a span in L.
    Descendant,
    /// `<<`: R is an ancestor of a span in L.
    Ancestor,
    /// `~`: R shares its parent with a span in L (and is not that span).
    Sibling,
    /// `!>`
    NotChild,
    /// `!<`
    NotParent,
    /// `!>>`
    NotDescendant,
    /// `!<<`
    NotAncestor,
    /// `!~`
    NotSibling,
    /// `&>`
    UnionChild,
    /// `&<`
    UnionParent,
    /// `&>>`
    UnionDescendant,
    /// `&<<`
    UnionAncestor,
    /// `&~`
    UnionSibling,
}

/// One stage of a pipeline, applied to each spanset in turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// `| { cond }` or `| {a} && {b}`: keeps the spans of the spanset
    /// that the expression returns.
    Filter(SpansetExpr),
    /// `| count() > 2`, `| avg(duration) > 1s`, `| max(.a) - min(.a) > 3`:
    /// keeps the spansets for which the comparison holds. At least one
    /// side holds an aggregate.
    Scalar {
        lhs: ScalarExpr,
        op: CmpOp,
        rhs: ScalarExpr,
    },
    /// `| select(span.a, resource.b)`: adds these attributes to the
    /// returned spans.
    Select(Vec<Attribute>),
    /// `| coalesce()`: merges all spansets into one.
    Coalesce,
    /// `| by(expr)`: splits each spanset by the value of `expr`.
    By(FieldExpr),
    /// `| rate() by (...)` and the other metrics functions: always the
    /// last stage of the top-level pipeline.
    Metrics(MetricsStage),
}

/// An arithmetic expression over aggregates of a spanset and constants.
#[derive(Debug, Clone, PartialEq)]
pub enum ScalarExpr {
    Aggregate(Aggregate),
    /// An `Int`, `Float` or `Duration` (negative literals folded in).
    Static(Static),
    /// `-(expr)` where `expr` is not a single literal.
    Neg(Box<ScalarExpr>),
    Binary {
        op: ArithOp,
        lhs: Box<ScalarExpr>,
        rhs: Box<ScalarExpr>,
    },
}

/// An aggregate over the spans of a spanset.
#[derive(Debug, Clone, PartialEq)]
pub enum Aggregate {
    /// `count()`
    Count,
    /// `avg(expr)`
    Avg(FieldExpr),
    /// `min(expr)`
    Min(FieldExpr),
    /// `max(expr)`
    Max(FieldExpr),
    /// `sum(expr)`
    Sum(FieldExpr),
}

/// A metrics function, its `by (...)` attributes and what follows it.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsStage {
    pub func: MetricsFn,
    /// `by (a, b)`; empty without `by`.
    pub by: Vec<Attribute>,
    /// `| topk(n)`, `| bottomk(n)` and `> 10` after the function, in order.
    pub second: Vec<SecondStage>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum MetricsFn {
    /// `rate()`
    Rate,
    /// `count_over_time()`
    CountOverTime,
    /// `min_over_time(attr)`
    MinOverTime(Attribute),
    /// `max_over_time(attr)`
    MaxOverTime(Attribute),
    /// `avg_over_time(attr)`
    AvgOverTime(Attribute),
    /// `sum_over_time(attr)`
    SumOverTime(Attribute),
    /// `quantile_over_time(attr, 0.5, 0.9, ...)`
    QuantileOverTime { attr: Attribute, quantiles: Vec<f64> },
    /// `histogram_over_time(attr)`
    HistogramOverTime(Attribute),
    /// `compare({filter}[, topn[, start, end]])`; Tempo's defaults when
    /// left out: `topn` 10, `start` and `end` 0.
    Compare {
        filter: FieldExpr,
        topn: i64,
        start: i64,
        end: i64,
    },
}

/// What may follow a metrics function.
#[derive(Debug, Clone, PartialEq)]
pub enum SecondStage {
    /// `| topk(n)`
    TopK(i64),
    /// `| bottomk(n)`
    BottomK(i64),
    /// `> 10`, `<= 0.5`: keeps series whose values compare so; `value` is
    /// constant (no aggregates).
    Filter { op: CmpOp, value: ScalarExpr },
}

/// An expression over one span (and its trace): the inside of `{ ... }`,
/// the argument of `by(...)` and of the aggregates.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldExpr {
    Binary {
        op: BinOp,
        lhs: Box<FieldExpr>,
        rhs: Box<FieldExpr>,
    },
    /// `!expr`
    Not(Box<FieldExpr>),
    /// `-expr` where `expr` is not a single number or duration (those are
    /// folded into a negative [`Static`]).
    Neg(Box<FieldExpr>),
    Static(Static),
    Attr(Attribute),
}

/// Binary operators inside a spanset filter, loosest first: `&&` and `||`
/// (one level, left to right, as in Tempo: `a || b && c` is
/// `(a || b) && c`), comparisons and regex matches, `+ -`, `* / %`, `^`
/// (right-associative). Prefix `!` binds tighter than `+` and looser than
/// `*`; prefix `-` as tight as `+` (so `-.a * 2` is `-(.a * 2)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `&&`
    And,
    /// `||`
    Or,
    Cmp(CmpOp),
    /// `=~`: the whole value matches the RE2 regex (anchored).
    Re,
    /// `!~`
    NotRe,
    Arith(ArithOp),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`
    Mod,
    /// `^`
    Pow,
}

/// A literal value.
#[derive(Debug, Clone, PartialEq)]
pub enum Static {
    /// `"..."` (escapes resolved) or `` `...` `` (raw).
    Str(String),
    /// `42`, `-1`; also `minInt` and `maxInt`.
    Int(i64),
    /// `1.5`, `.9`, `1e3`
    Float(f64),
    /// `true`, `false`
    Bool(bool),
    /// `100ms`, `1.5s`, `1h30m`, `1d`, in nanoseconds.
    Duration(i64),
    /// `error`, `ok`, `unset`
    Status(Status),
    /// `unspecified`, `internal`, `server`, `client`, `producer`,
    /// `consumer`
    Kind(Kind),
    /// `nil`: only ever a direct operand of `=` or `!=` (`.a != nil` is
    /// "the attribute exists").
    Nil,
}

/// A span's status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Error,
    Ok,
    Unset,
}

/// A span's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Unspecified,
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

/// What a query reads from a span: an intrinsic or a named attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum Attribute {
    /// `name`, `span:name`, `trace:duration`, `event:name`, ...: both
    /// spellings of one intrinsic give the same [`Intrinsic`].
    Intrinsic(Intrinsic),
    /// `.a.b` (`Unscoped`: a span attribute, else a resource attribute),
    /// `span.a`, `resource.a`, `event.a`, `link.a`, `instrumentation.a`,
    /// `span."a b"`. `parent` is set for `parent.a`, `parent.span.a` and
    /// `parent.resource.a` (the attribute of the span's parent).
    Named { scope: Scope, parent: bool, name: String },
}

impl Attribute {
    /// A named attribute with no `parent.`.
    pub fn named(scope: Scope, name: impl Into<String>) -> Attribute {
        Attribute::Named {
            scope,
            parent: false,
            name: name.into(),
        }
    }
}

/// Where a named attribute is looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `.a`: the span's attribute, else its resource's.
    Unscoped,
    Resource,
    Span,
    /// Attributes of the span's events.
    Event,
    /// Attributes of the span's links.
    Link,
    /// Attributes of the span's instrumentation scope.
    Instrumentation,
}

/// The intrinsics: fields of a span, its trace, its events, links and
/// instrumentation scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intrinsic {
    /// `name`, `span:name`
    Name,
    /// `status`, `span:status`
    Status,
    /// `statusMessage`, `span:statusMessage`
    StatusMessage,
    /// `duration`, `span:duration`
    Duration,
    /// `kind`, `span:kind`
    Kind,
    /// `span:id`
    SpanId,
    /// `span:parentID`
    ParentId,
    /// `span:childCount`
    ChildCount,
    /// `parent`: the parent span (only compared with `nil`, to find roots).
    Parent,
    /// `traceDuration`, `trace:duration`
    TraceDuration,
    /// `rootName`, `trace:rootName`
    RootName,
    /// `rootServiceName`, `trace:rootService`
    RootServiceName,
    /// `trace:id`
    TraceId,
    /// `event:name`
    EventName,
    /// `event:timeSinceStart`
    EventTimeSinceStart,
    /// `link:spanID`
    LinkSpanId,
    /// `link:traceID`
    LinkTraceId,
    /// `instrumentation:name`
    InstrumentationName,
    /// `instrumentation:version`
    InstrumentationVersion,
}

impl Intrinsic {
    /// The intrinsic as Tempo's tag API names it (the bare word where
    /// there is one, else the colon form).
    pub fn as_str(self) -> &'static str {
        match self {
            Intrinsic::Name => "name",
            Intrinsic::Status => "status",
            Intrinsic::StatusMessage => "statusMessage",
            Intrinsic::Duration => "duration",
            Intrinsic::Kind => "kind",
            Intrinsic::SpanId => "span:id",
            Intrinsic::ParentId => "span:parentID",
            Intrinsic::ChildCount => "span:childCount",
            Intrinsic::Parent => "parent",
            Intrinsic::TraceDuration => "traceDuration",
            Intrinsic::RootName => "rootName",
            Intrinsic::RootServiceName => "rootServiceName",
            Intrinsic::TraceId => "trace:id",
            Intrinsic::EventName => "event:name",
            Intrinsic::EventTimeSinceStart => "event:timeSinceStart",
            Intrinsic::LinkSpanId => "link:spanID",
            Intrinsic::LinkTraceId => "link:traceID",
            Intrinsic::InstrumentationName => "instrumentation:name",
            Intrinsic::InstrumentationVersion => "instrumentation:version",
        }
    }

    /// The intrinsic written as a bare word (`name`, `traceDuration`).
    pub fn from_word(word: &str) -> Option<Intrinsic> {
        Some(match word {
            "name" => Intrinsic::Name,
            "status" => Intrinsic::Status,
            "statusMessage" => Intrinsic::StatusMessage,
            "duration" => Intrinsic::Duration,
            "kind" => Intrinsic::Kind,
            "parent" => Intrinsic::Parent,
            "traceDuration" => Intrinsic::TraceDuration,
            "rootName" => Intrinsic::RootName,
            "rootServiceName" => Intrinsic::RootServiceName,
            _ => return None,
        })
    }

    /// The intrinsic written `scope:field` (`span:id`, `trace:rootService`).
    pub fn from_colon(scope: &str, field: &str) -> Option<Intrinsic> {
        Some(match (scope, field) {
            ("span", "name") => Intrinsic::Name,
            ("span", "status") => Intrinsic::Status,
            ("span", "statusMessage") => Intrinsic::StatusMessage,
            ("span", "duration") => Intrinsic::Duration,
            ("span", "kind") => Intrinsic::Kind,
            ("span", "id") => Intrinsic::SpanId,
            ("span", "parentID") => Intrinsic::ParentId,
            ("span", "childCount") => Intrinsic::ChildCount,
            ("trace", "duration") => Intrinsic::TraceDuration,
            ("trace", "rootName") => Intrinsic::RootName,
            ("trace", "rootService") => Intrinsic::RootServiceName,
            ("trace", "id") => Intrinsic::TraceId,
            ("event", "name") => Intrinsic::EventName,
            ("event", "timeSinceStart") => Intrinsic::EventTimeSinceStart,
            ("link", "spanID") => Intrinsic::LinkSpanId,
            ("link", "traceID") => Intrinsic::LinkTraceId,
            ("instrumentation", "name") => Intrinsic::InstrumentationName,
            ("instrumentation", "version") => Intrinsic::InstrumentationVersion,
            _ => return None,
        })
    }
}
