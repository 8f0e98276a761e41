//! LogQL's syntax tree: what [`super::parse`] builds and the evaluator
//! reads. It covers everything Grafana's own grammar
//! (`@grafana/lezer-logql`) accepts; which parts are evaluated is the
//! evaluator's business (it answers 400 naming an unsupported stage).

/// A whole query: a log query (lines) or a metric query (samples).
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Log(LogExpr),
    Metric(MetricExpr),
}

/// `{selector} | stage | stage ...`
#[derive(Debug, Clone, PartialEq)]
pub struct LogExpr {
    pub selector: Vec<Matcher>,
    pub stages: Vec<Stage>,
}

/// `name op "value"` in a stream selector (regexes anchored).
#[derive(Debug, Clone, PartialEq)]
pub struct Matcher {
    pub name: String,
    pub op: MatchOp,
    pub value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `=~`
    Re,
    /// `!~`
    NotRe,
}

/// A pipeline stage, in query order.
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// `|= "a" or "b"`, `!= ...`, `|~ ...`, `!~ ...`.
    Line(LineFilter),
    /// `| json` or `| json a, b="x.y"` (label, optional JSON path expression).
    Json(Vec<ParserParam>),
    /// `| logfmt [--strict] [--keep-empty] [a, b="c"]`.
    Logfmt {
        strict: bool,
        keep_empty: bool,
        params: Vec<ParserParam>,
    },
    /// ``| regexp `(?P<x>...)` ``
    Regexp(String),
    /// ``| pattern `<_> <x>` ``
    Pattern(String),
    /// `| unpack`
    Unpack,
    /// `| label op value` and boolean combinations of them.
    LabelFilter(LabelFilter),
    /// ``| line_format `{{.x}}` ``
    LineFormat(String),
    /// `| label_format a=b, c="{{.d}}"`
    LabelFormat(Vec<LabelFmt>),
    /// `| decolorize`
    Decolorize,
    /// `| drop a, b="v"`
    Drop(Vec<NamedMatcher>),
    /// `| keep a, b="v"`
    Keep(Vec<NamedMatcher>),
    /// `| unwrap x`, `| unwrap duration(x)`: only inside a range
    /// aggregation, last but for label filters after it.
    Unwrap(Unwrap),
}

/// One line filter stage: every alternative joined by `or`.
#[derive(Debug, Clone, PartialEq)]
pub struct LineFilter {
    pub op: LineOp,
    pub values: Vec<LineValue>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineOp {
    /// `|=`
    Contains,
    /// `!=`
    NotContains,
    /// `|~`
    Re,
    /// `!~`
    NotRe,
    /// `|>` (a pattern)
    Pattern,
    /// `!>`
    NotPattern,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LineValue {
    Str(String),
    /// ``ip(`10.0.0.0/8`)``
    Ip(String),
}

/// `name` or `name="expr"` after `json` / `logfmt`.
#[derive(Debug, Clone, PartialEq)]
pub struct ParserParam {
    pub label: String,
    pub expr: Option<String>,
}

/// `name` or `name op "value"` after `drop` / `keep`.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedMatcher {
    pub name: String,
    pub matcher: Option<(MatchOp, String)>,
}

/// `dst=src` (rename) or `dst="template"`.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelFmt {
    pub dst: String,
    pub value: LabelFmtValue,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LabelFmtValue {
    Rename(String),
    Template(String),
}

/// Comparison of a number, a duration or a byte size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `==` (also `=` in label filters)
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

/// A label filter expression.
#[derive(Debug, Clone, PartialEq)]
pub enum LabelFilter {
    /// `a and b`, `a , b`, `a | b` (a pipe between two filters is `and`).
    And(Box<LabelFilter>, Box<LabelFilter>),
    /// `a or b`
    Or(Box<LabelFilter>, Box<LabelFilter>),
    /// `name op "string"`
    Str { name: String, op: MatchOp, value: String },
    /// `name op 12.5` (also integers)
    Number { name: String, op: CmpOp, value: f64 },
    /// `name op 250ms`, in seconds
    Duration { name: String, op: CmpOp, seconds: f64 },
    /// `name op 20MB`, in bytes
    Bytes { name: String, op: CmpOp, bytes: f64 },
    /// ``name = ip(`cidr`)`` (`eq` false for `!=`)
    Ip { name: String, eq: bool, cidr: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnwrapConv {
    /// plain `unwrap x`: a float
    None,
    /// `duration(x)` / `duration_seconds(x)`: seconds
    Duration,
    /// `bytes(x)`
    Bytes,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Unwrap {
    pub label: String,
    pub conv: UnwrapConv,
}

/// A metric query.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricExpr {
    /// `count_over_time({..} | .. [5m] offset 1h)` and the rest.
    Range(RangeAgg),
    /// `sum by (a) (x)`, `topk(5, x)`, `quantile(0.9, x)`...
    Vector(VectorAgg),
    Binary(Box<Binary>),
    /// A number.
    Literal(f64),
    /// `vector(1)`
    VectorOf(f64),
    /// `label_replace(x, "dst", "replacement", "src", "regex")`
    LabelReplace(Box<LabelReplace>),
    /// `(x)`
    Paren(Box<MetricExpr>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct RangeAgg {
    pub op: RangeOp,
    /// `quantile_over_time`'s φ.
    pub param: Option<f64>,
    pub log: LogExpr,
    /// Window, nanoseconds.
    pub range_ns: i64,
    /// `offset`, nanoseconds.
    pub offset_ns: i64,
    /// `avg_over_time(...) by (a)`.
    pub grouping: Option<Grouping>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOp {
    CountOverTime,
    Rate,
    RateCounter,
    BytesOverTime,
    BytesRate,
    AbsentOverTime,
    SumOverTime,
    AvgOverTime,
    MinOverTime,
    MaxOverTime,
    StddevOverTime,
    StdvarOverTime,
    QuantileOverTime,
    FirstOverTime,
    LastOverTime,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Grouping {
    pub without: bool,
    pub labels: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VectorAgg {
    pub op: VectorOp,
    pub grouping: Option<Grouping>,
    /// `topk`/`bottomk`'s k, `quantile`'s φ.
    pub param: Option<f64>,
    pub inner: Box<MetricExpr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorOp {
    Sum,
    Avg,
    Min,
    Max,
    Count,
    Stddev,
    Stdvar,
    Topk,
    Bottomk,
    Sort,
    SortDesc,
    /// `approx_topk(5, x)`: Loki's probabilistic topk (no grouping).
    ApproxTopk,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Binary {
    pub op: BinOp,
    pub lhs: MetricExpr,
    pub rhs: MetricExpr,
    /// `> bool 1`
    pub return_bool: bool,
    pub matching: Option<VectorMatching>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    And,
    Or,
    Unless,
}

impl BinOp {
    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Mod => "%",
            BinOp::Pow => "^",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::And => "and",
            BinOp::Or => "or",
            BinOp::Unless => "unless",
        }
    }
}

/// `on (a)` / `ignoring (a)`, with an optional `group_left (b)` /
/// `group_right (b)`.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorMatching {
    pub on: bool,
    pub labels: Vec<String>,
    pub group: Option<GroupSide>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GroupSide {
    pub left: bool,
    pub labels: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LabelReplace {
    pub inner: MetricExpr,
    pub dst: String,
    pub replacement: String,
    pub src: String,
    pub regex: String,
}
