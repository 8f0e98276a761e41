//! A PromQL evaluator over series held in memory, step by step, with
//! Prometheus semantics: a 5 minute lookback for instant selectors,
//! left-open range windows, extrapolated `rate`/`increase`/`delta`,
//! aggregation `by`/`without`, vector matching `on`/`ignoring` with
//! `group_left`/`group_right`, comparison filters and `bool`, set operators,
//! and `histogram_quantile` over `le` buckets. The AST comes from the
//! `promql-parser` crate.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use promql_parser::label::{MatchOp as PMatchOp, Matchers};
use promql_parser::parser::token::{
    T_ADD, T_ATAN2, T_AVG, T_BOTTOMK, T_COUNT, T_DIV, T_EQLC, T_GROUP, T_GTE, T_GTR, T_LAND, T_LOR, T_LSS, T_LTE,
    T_LUNLESS, T_MAX, T_MIN, T_MOD, T_MUL, T_NEQ, T_POW, T_QUANTILE, T_STDDEV, T_STDVAR, T_SUB, T_SUM, T_TOPK,
};
use promql_parser::parser::{
    AggregateExpr, AtModifier, BinaryExpr, Call, Expr, LabelModifier, MatrixSelector, Offset, VectorMatchCardinality,
    VectorSelector,
};

mod steps;

pub use steps::{Matrix, Row};

/// A function of a range window's samples, its start and its end.
type RangeFn = dyn Fn(&[(i64, f64)], i64, i64) -> Option<f64>;

/// A range function as [`range_function`] names it.
type WindowFn = fn(&[(i64, f64)], i64, i64) -> Option<f64>;

/// Sorted (name, value) pairs; `__name__` included for raw series.
pub type Labels = Vec<(String, String)>;

pub const NAME: &str = "__name__";

/// One stored series: labels and samples sorted by time (ms).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: Labels,
    pub samples: Vec<(i64, f64)>,
}

impl Series {
    /// A series of `samples` in any order: sorted by time, keeping the
    /// first of samples with the same time.
    pub fn sorted(labels: Labels, mut samples: Vec<(i64, f64)>) -> Series {
        samples.sort_by_key(|s| s.0);
        samples.dedup_by_key(|s| s.0);
        Series { labels, samples }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Labels,
    pub v: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RangeSeries {
    pub labels: Labels,
    pub points: Vec<(i64, f64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Scalar(f64),
    Str(String),
    Vector(Vec<Sample>),
    Matrix(Vec<RangeSeries>),
}

/// A query that cannot be evaluated (the caller's fault).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct EvalError(pub String);

/// What evaluation stopped by its request's cancellation answers (read by
/// nobody: the request is gone).
pub(crate) const CANCELLED: &str = "the query was cancelled";

fn err<T>(s: impl Into<String>) -> Result<T, EvalError> {
    Err(EvalError(s.into()))
}

/// Evaluation settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub lookback_ms: i64,
    /// Query start and end (for `@ start()` / `@ end()`), ms.
    pub start_ms: i64,
    pub end_ms: i64,
    /// Most samples one evaluation step may hold (vector size cap).
    pub max_samples: usize,
}

/// The series a query reads, and the evaluator over them.
#[derive(Debug)]
pub struct Engine {
    series: Vec<Arc<Series>>,
    settings: Settings,
    /// Selector (display form) -> indexes of matching series.
    selected: std::sync::Mutex<HashMap<String, Arc<Vec<usize>>>>,
    /// The flag of the request this evaluation is for ([`crate::pool`]):
    /// checked at every node, step and series.
    cancel: crate::pool::Cancel,
}

pub fn label<'a>(labels: &'a Labels, name: &str) -> Option<&'a str> {
    labels
        .binary_search_by(|(k, _)| k.as_str().cmp(name))
        .ok()
        .map(|i| labels[i].1.as_str())
}

fn without_name(labels: &Labels) -> Labels {
    labels.iter().filter(|(k, _)| k != NAME).cloned().collect()
}

/// Whether `labels` satisfy every matcher (and one `or` group, if any).
pub fn matches(m: &Matchers, name: Option<&str>, labels: &dyn LabelLookup) -> bool {
    may_match(m, name, labels, &[])
}

/// Labels read by name: a series' [`Labels`], or a view of labels not
/// built yet. A label with an empty value reads as absent does.
pub trait LabelLookup {
    fn get(&self, name: &str) -> Option<&str>;
}

impl LabelLookup for Labels {
    fn get(&self, name: &str) -> Option<&str> {
        label(self, name)
    }
}

/// [`matches`] for labels whose `unknown` labels are not known yet: a
/// matcher on one of those is taken as met, so the answer is false only
/// when no value of them could match.
pub fn may_match(m: &Matchers, name: Option<&str>, labels: &dyn LabelLookup, unknown: &[&str]) -> bool {
    let one = |matcher: &promql_parser::label::Matcher| {
        if unknown.contains(&matcher.name.as_str()) {
            return true;
        }
        let v = labels.get(&matcher.name).unwrap_or("");
        match &matcher.op {
            PMatchOp::Equal => v == matcher.value,
            PMatchOp::NotEqual => v != matcher.value,
            PMatchOp::Re(re) => re.is_match(v) && full_match(re, v),
            PMatchOp::NotRe(re) => !(re.is_match(v) && full_match(re, v)),
        }
    };
    if let Some(n) = name
        && labels.get(NAME) != Some(n)
    {
        return false;
    }
    if !m.matchers.iter().all(one) {
        return false;
    }
    m.or_matchers.is_empty() || m.or_matchers.iter().any(|group| group.iter().all(one))
}

/// The parser's regexes are anchored already (`^(?:...)$`); this guards
/// against one that is not.
fn full_match(re: &regex::Regex, v: &str) -> bool {
    re.find(v).is_some_and(|m| m.start() == 0 && m.end() == v.len())
}

/// A duration in ms, saturated at `i64::MAX` (the query's windows are
/// checked to be representable before evaluation: [`crate::promql`]).
fn millis(d: &std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A selector's offset in ms (negative: it reads later samples).
pub(crate) fn offset_ms(o: &Option<Offset>) -> i64 {
    match o {
        Some(Offset::Pos(d)) => millis(d),
        Some(Offset::Neg(d)) => -millis(d),
        None => 0,
    }
}

/// A range selector's range in ms.
pub(crate) fn range_ms(ms: &MatrixSelector) -> i64 {
    millis(&ms.range)
}

/// The time a selector's `@` fixes, ms (None: the step's time).
pub(crate) fn at_ms(at: &Option<AtModifier>, s: &Settings) -> Option<i64> {
    match at {
        Some(AtModifier::Start) => Some(s.start_ms),
        Some(AtModifier::End) => Some(s.end_ms),
        Some(AtModifier::At(t)) => Some(match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => millis(&d),
            Err(e) => -millis(&e.duration()),
        }),
        None => None,
    }
}

/// Samples with time in `(from, to]`.
fn window(samples: &[(i64, f64)], from: i64, to: i64) -> &[(i64, f64)] {
    let lo = samples.partition_point(|(t, _)| *t <= from);
    let hi = samples.partition_point(|(t, _)| *t <= to);
    &samples[lo..hi.max(lo)]
}

impl Engine {
    pub fn new(series: Vec<Series>, settings: Settings) -> Engine {
        Engine::shared(series.into_iter().map(Arc::new).collect(), settings)
    }

    /// An engine over series sorted by time (as [`Series::sorted`] makes
    /// them), shared with whoever else holds them.
    pub fn shared(series: Vec<Arc<Series>>, settings: Settings) -> Engine {
        Engine {
            series,
            settings,
            selected: std::sync::Mutex::new(HashMap::new()),
            cancel: crate::pool::current(),
        }
    }

    /// True once the request was dropped: stop evaluating.
    pub(crate) fn stopped(&self) -> bool {
        self.cancel.is_set()
    }

    fn select(&self, vs: &VectorSelector) -> Arc<Vec<usize>> {
        let key = format!("{}{{{}}}", vs.name.as_deref().unwrap_or(""), vs.matchers);
        let mut cache = self.selected.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(key)
            .or_insert_with(|| {
                Arc::new(
                    self.series
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| matches(&vs.matchers, vs.name.as_deref(), &s.labels))
                        .map(|(i, _)| i)
                        .collect(),
                )
            })
            .clone()
    }

    fn check_size(&self, n: usize) -> Result<(), EvalError> {
        if n > self.settings.max_samples {
            return err(format!(
                "the query holds more than {} samples in one step",
                self.settings.max_samples
            ));
        }
        Ok(())
    }

    /// Evaluates `expr` at time `t` (ms).
    pub fn eval(&self, expr: &Expr, t: i64) -> Result<Value, EvalError> {
        if self.stopped() {
            return err(CANCELLED);
        }
        match expr {
            Expr::NumberLiteral(n) => Ok(Value::Scalar(n.val)),
            Expr::StringLiteral(s) => Ok(Value::Str(s.val.clone())),
            Expr::Paren(p) => self.eval(&p.expr, t),
            Expr::Unary(u) => match self.eval(&u.expr, t)? {
                Value::Scalar(v) => Ok(Value::Scalar(-v)),
                Value::Vector(vs) => Ok(Value::Vector(
                    vs.into_iter()
                        .map(|s| Sample {
                            labels: without_name(&s.labels),
                            v: -s.v,
                        })
                        .collect(),
                )),
                _ => err("unary minus applies to scalars and instant vectors"),
            },
            Expr::VectorSelector(vs) => self.instant(vs, t),
            Expr::MatrixSelector(ms) => self.range(ms, t).map(Value::Matrix),
            Expr::Call(c) => self.call(c, t),
            Expr::Aggregate(a) => self.aggregate(a, t),
            Expr::Binary(b) => self.binary(b, t),
            Expr::Subquery(_) => err("subqueries are not supported"),
            Expr::Extension(_) => err("extension expressions are not supported"),
        }
    }

    fn instant(&self, vs: &VectorSelector, t: i64) -> Result<Value, EvalError> {
        let at = at_ms(&vs.at, &self.settings).unwrap_or(t) - offset_ms(&vs.offset);
        let ids = self.select(vs);
        let mut out = Vec::new();
        for &i in ids.iter() {
            let s = &self.series[i];
            if let Some(&(_, v)) = window(&s.samples, at - self.settings.lookback_ms, at).last() {
                out.push(Sample {
                    labels: s.labels.clone(),
                    v,
                });
            }
        }
        self.check_size(out.len())?;
        Ok(Value::Vector(out))
    }

    fn range(&self, ms: &MatrixSelector, t: i64) -> Result<Vec<RangeSeries>, EvalError> {
        let vs = &ms.vs;
        let at = at_ms(&vs.at, &self.settings).unwrap_or(t) - offset_ms(&vs.offset);
        let range = range_ms(ms);
        let ids = self.select(vs);
        let mut out = Vec::new();
        let mut total = 0;
        for &i in ids.iter() {
            let s = &self.series[i];
            let w = window(&s.samples, at - range, at);
            if !w.is_empty() {
                total += w.len();
                out.push(RangeSeries {
                    labels: s.labels.clone(),
                    points: w.to_vec(),
                });
            }
        }
        self.check_size(total)?;
        Ok(out)
    }

    fn vector_arg(&self, c: &Call, i: usize, t: i64) -> Result<Vec<Sample>, EvalError> {
        match c.args.args.get(i).map(|a| self.eval(a, t)).transpose()? {
            Some(Value::Vector(v)) => Ok(v),
            _ => err(format!("{}: argument {} must be an instant vector", c.func.name, i + 1)),
        }
    }

    fn scalar_arg(&self, c: &Call, i: usize, t: i64) -> Result<f64, EvalError> {
        match c.args.args.get(i).map(|a| self.eval(a, t)).transpose()? {
            Some(Value::Scalar(v)) => Ok(v),
            _ => err(format!("{}: argument {} must be a scalar", c.func.name, i + 1)),
        }
    }

    fn call(&self, c: &Call, t: i64) -> Result<Value, EvalError> {
        let name = c.func.name;
        // A range function reads each selected series' window in place (no
        // copy of its points or labels) and clones the labels of the
        // samples it gives, once.
        let over_range = |f: &RangeFn, keep_name: bool| -> Result<Value, EvalError> {
            let Some(Expr::MatrixSelector(ms)) = c.args.args.first().map(|a| a.as_ref()) else {
                return err(format!(
                    "{}: the argument must be a range selector such as x[5m]",
                    c.func.name
                ));
            };
            let at = at_ms(&ms.vs.at, &self.settings).unwrap_or(t) - offset_ms(&ms.vs.offset);
            let range = range_ms(ms);
            let ids = self.select(&ms.vs);
            let mut total = 0;
            let mut out = Vec::new();
            for &i in ids.iter() {
                let s = &self.series[i];
                let w = window(&s.samples, at - range, at);
                if w.is_empty() {
                    continue;
                }
                total += w.len();
                if let Some(v) = f(w, at - range, at) {
                    out.push(Sample {
                        labels: if keep_name {
                            s.labels.clone()
                        } else {
                            without_name(&s.labels)
                        },
                        v,
                    });
                }
            }
            self.check_size(total)?;
            Ok(Value::Vector(out))
        };
        let map = |f: &dyn Fn(f64) -> f64| -> Result<Value, EvalError> {
            Ok(Value::Vector(
                self.vector_arg(c, 0, t)?
                    .into_iter()
                    .map(|s| Sample {
                        labels: without_name(&s.labels),
                        v: f(s.v),
                    })
                    .collect(),
            ))
        };
        if let Some((f, keep_name)) = range_function(name) {
            return over_range(&f, keep_name);
        }
        match name {
            "abs" => map(&f64::abs),
            "ceil" => map(&f64::ceil),
            "floor" => map(&f64::floor),
            "round" => {
                let to = if c.args.args.len() > 1 {
                    self.scalar_arg(c, 1, t)?
                } else {
                    1.0
                };
                map(&|v| (v / to + 0.5).floor() * to)
            }
            "sqrt" => map(&f64::sqrt),
            "exp" => map(&f64::exp),
            "ln" => map(&f64::ln),
            "log2" => map(&f64::log2),
            "log10" => map(&f64::log10),
            "clamp_min" => {
                let lo = self.scalar_arg(c, 1, t)?;
                map(&|v| v.max(lo))
            }
            "clamp_max" => {
                let hi = self.scalar_arg(c, 1, t)?;
                map(&|v| v.min(hi))
            }
            "time" => Ok(Value::Scalar(t as f64 / 1000.0)),
            "vector" => Ok(Value::Vector(vec![Sample {
                labels: Vec::new(),
                v: self.scalar_arg(c, 0, t)?,
            }])),
            "scalar" => {
                let v = self.vector_arg(c, 0, t)?;
                Ok(Value::Scalar(if v.len() == 1 { v[0].v } else { f64::NAN }))
            }
            "histogram_quantile" => {
                let q = self.scalar_arg(c, 0, t)?;
                Ok(Value::Vector(histogram_quantile(q, self.vector_arg(c, 1, t)?)))
            }
            other => err(format!("function {other} is not supported")),
        }
    }

    fn aggregate(&self, a: &AggregateExpr, t: i64) -> Result<Value, EvalError> {
        let Value::Vector(input) = self.eval(&a.expr, t)? else {
            return err("aggregations apply to instant vectors");
        };
        let op = a.op.id();
        let param = match &a.param {
            Some(p) => match self.eval(p, t)? {
                Value::Scalar(v) => Some(v),
                _ => return err(format!("{}: the parameter must be a scalar", a.op)),
            },
            None => None,
        };
        let key = |labels: &Labels| -> Labels {
            match &a.modifier {
                None => Vec::new(),
                m => match_key(labels, m.as_ref()),
            }
        };
        let mut groups: BTreeMap<Labels, Vec<Sample>> = BTreeMap::new();
        for s in input {
            groups.entry(key(&s.labels)).or_default().push(s);
        }
        let mut out = Vec::new();
        for (labels, members) in groups {
            if op == T_TOPK || op == T_BOTTOMK {
                let k = param.unwrap_or(0.0).max(0.0) as usize;
                let mut members = members;
                members.sort_by(|x, y| k_order(op, x.v, y.v));
                out.extend(members.into_iter().take(k));
                continue;
            }
            let vals: Vec<f64> = members.iter().map(|s| s.v).collect();
            let Some(v) = aggregate_values(op, param, &vals) else {
                return err(format!("aggregation {} is not supported", a.op));
            };
            out.push(Sample { labels, v });
        }
        Ok(Value::Vector(out))
    }

    fn binary(&self, b: &BinaryExpr, t: i64) -> Result<Value, EvalError> {
        let op = b.op.id();
        let lhs = self.eval(&b.lhs, t)?;
        let rhs = self.eval(&b.rhs, t)?;
        let return_bool = b.modifier.as_ref().is_some_and(|m| m.return_bool);
        let comparison = b.op.is_comparison_operator();
        match (lhs, rhs) {
            (Value::Scalar(l), Value::Scalar(r)) => {
                let v = apply(op, l, r)?;
                Ok(Value::Scalar(if comparison {
                    f64::from(u8::from(v != 0.0))
                } else {
                    v
                }))
            }
            (Value::Vector(l), Value::Scalar(r)) => {
                Ok(Value::Vector(vector_scalar(op, l, r, false, comparison, return_bool)?))
            }
            (Value::Scalar(l), Value::Vector(r)) => {
                Ok(Value::Vector(vector_scalar(op, r, l, true, comparison, return_bool)?))
            }
            (Value::Vector(l), Value::Vector(r)) => {
                if b.op.is_set_operator() {
                    return Ok(Value::Vector(set_op(
                        op,
                        l,
                        r,
                        b.modifier.as_ref().and_then(|m| m.matching.as_ref()),
                    )));
                }
                self.vector_vector(b, l, r, comparison, return_bool).map(Value::Vector)
            }
            _ => err(format!("operator {} does not apply to these operands", b.op)),
        }
    }

    fn vector_vector(
        &self,
        b: &BinaryExpr,
        l: Vec<Sample>,
        r: Vec<Sample>,
        comparison: bool,
        return_bool: bool,
    ) -> Result<Vec<Sample>, EvalError> {
        let op = b.op.id();
        let matching = b.modifier.as_ref().and_then(|m| m.matching.as_ref());
        let card = b
            .modifier
            .as_ref()
            .map_or(&VectorMatchCardinality::OneToOne, |m| &m.card);
        let sig = |labels: &Labels| match_key(labels, matching);
        let (many, one, swapped, include) = match card {
            VectorMatchCardinality::OneToMany(ls) => (r, l, true, ls.labels.clone()),
            VectorMatchCardinality::ManyToOne(ls) => (l, r, false, ls.labels.clone()),
            _ => (l, r, false, Vec::new()),
        };
        let grouped = !matches!(card, VectorMatchCardinality::OneToOne);
        let mut ones: HashMap<Labels, &Sample> = HashMap::new();
        for s in &one {
            if ones.insert(sig(&s.labels), s).is_some() {
                return err(format!(
                    "many-to-many matching not allowed: found duplicate series for the match group {:?} on the {} side",
                    sig(&s.labels),
                    if swapped { "left" } else { "right" }
                ));
            }
        }
        let mut out = Vec::new();
        let mut seen: HashMap<Labels, ()> = HashMap::new();
        let drop_name = !comparison || return_bool;
        for s in &many {
            let k = sig(&s.labels);
            let Some(o) = ones.get(&k) else { continue };
            let (lv, rv) = if swapped { (o.v, s.v) } else { (s.v, o.v) };
            let res = apply(op, lv, rv)?;
            if comparison && !return_bool && res == 0.0 {
                continue;
            }
            let mut labels: Labels = if grouped {
                s.labels.clone()
            } else {
                match matching {
                    Some(LabelModifier::Include(_)) => k.clone(),
                    Some(LabelModifier::Exclude(ls)) => s
                        .labels
                        .iter()
                        .filter(|(n, _)| !ls.labels.iter().any(|l| l == n))
                        .cloned()
                        .collect(),
                    None => s.labels.clone(),
                }
            };
            if drop_name {
                labels.retain(|(n, _)| n != NAME);
            }
            for name in &include {
                labels.retain(|(n, _)| n != name);
                if let Some(v) = label(&o.labels, name) {
                    labels.push((name.clone(), v.to_owned()));
                }
            }
            labels.sort();
            if !grouped && seen.insert(labels.clone(), ()).is_some() {
                return err("many-to-many matching not allowed: use group_left or group_right");
            }
            let v = if comparison && !return_bool { lv } else { res };
            out.push(Sample { labels, v });
        }
        Ok(out)
    }
}

/// A range function by name: its function of a window's samples (and
/// the window's start and end), and whether its samples keep `__name__`.
fn range_function(name: &str) -> Option<(WindowFn, bool)> {
    Some(match name {
        "rate" => (|p, from, to| extrapolated(p, from, to, true, true), false),
        "increase" => (|p, from, to| extrapolated(p, from, to, true, false), false),
        "delta" => (|p, from, to| extrapolated(p, from, to, false, false), false),
        "irate" => (|p, _, _| instant_rate(p, true), false),
        "idelta" => (|p, _, _| instant_rate(p, false), false),
        "avg_over_time" => (
            |p, _, _| Some(p.iter().map(|x| x.1).sum::<f64>() / p.len() as f64),
            false,
        ),
        "sum_over_time" => (|p, _, _| Some(p.iter().map(|x| x.1).sum()), false),
        "count_over_time" => (|p, _, _| Some(p.len() as f64), false),
        "min_over_time" => (|p, _, _| p.iter().map(|x| x.1).reduce(f64::min), false),
        "max_over_time" => (|p, _, _| p.iter().map(|x| x.1).reduce(f64::max), false),
        "last_over_time" => (|p, _, _| p.last().map(|x| x.1), true),
        "resets" => (
            |p, _, _| Some(p.windows(2).filter(|w| w[1].1 < w[0].1).count() as f64),
            false,
        ),
        "changes" => (
            |p, _, _| Some(p.windows(2).filter(|w| w[1].1 != w[0].1).count() as f64),
            false,
        ),
        _ => return None,
    })
}

/// An aggregation's value over one group's values (every operator but
/// `topk`/`bottomk`, which select samples instead).
fn aggregate_values(op: u16, param: Option<f64>, vals: &[f64]) -> Option<f64> {
    let n = vals.len() as f64;
    Some(match op {
        T_SUM => vals.iter().sum(),
        T_AVG => vals.iter().sum::<f64>() / n,
        T_COUNT => n,
        T_GROUP => 1.0,
        T_MIN => vals
            .iter()
            .copied()
            .fold(f64::NAN, |a, b| if a.is_nan() || b < a { b } else { a }),
        T_MAX => vals
            .iter()
            .copied()
            .fold(f64::NAN, |a, b| if a.is_nan() || b > a { b } else { a }),
        T_STDDEV | T_STDVAR => {
            let mean = vals.iter().sum::<f64>() / n;
            let var = vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
            if op == T_STDDEV { var.sqrt() } else { var }
        }
        T_QUANTILE => quantile(param.unwrap_or(f64::NAN), vals.to_vec()),
        _ => return None,
    })
}

/// `topk`'s and `bottomk`'s order of two values.
fn k_order(op: u16, x: f64, y: f64) -> std::cmp::Ordering {
    let o = x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal);
    if op == T_TOPK { o.reverse() } else { o }
}

/// The labels two samples are matched on.
fn match_key(labels: &Labels, matching: Option<&LabelModifier>) -> Labels {
    match matching {
        Some(LabelModifier::Include(ls)) => labels
            .iter()
            .filter(|(k, _)| ls.labels.iter().any(|l| l == k))
            .cloned()
            .collect(),
        Some(LabelModifier::Exclude(ls)) => labels
            .iter()
            .filter(|(k, _)| k != NAME && !ls.labels.iter().any(|l| l == k))
            .cloned()
            .collect(),
        None => without_name(labels),
    }
}

fn set_op(op: u16, l: Vec<Sample>, r: Vec<Sample>, matching: Option<&LabelModifier>) -> Vec<Sample> {
    let rkeys: std::collections::HashSet<Labels> = r.iter().map(|s| match_key(&s.labels, matching)).collect();
    match op {
        T_LAND => l
            .into_iter()
            .filter(|s| rkeys.contains(&match_key(&s.labels, matching)))
            .collect(),
        T_LUNLESS => l
            .into_iter()
            .filter(|s| !rkeys.contains(&match_key(&s.labels, matching)))
            .collect(),
        _ => {
            let lkeys: std::collections::HashSet<Labels> = l.iter().map(|s| match_key(&s.labels, matching)).collect();
            let mut out = l;
            out.extend(
                r.into_iter()
                    .filter(|s| !lkeys.contains(&match_key(&s.labels, matching))),
            );
            out
        }
    }
}

fn vector_scalar(
    op: u16,
    v: Vec<Sample>,
    s: f64,
    scalar_left: bool,
    comparison: bool,
    return_bool: bool,
) -> Result<Vec<Sample>, EvalError> {
    let mut out = Vec::with_capacity(v.len());
    for x in v {
        let (l, r) = if scalar_left { (s, x.v) } else { (x.v, s) };
        let res = apply(op, l, r)?;
        if comparison {
            if return_bool {
                out.push(Sample {
                    labels: without_name(&x.labels),
                    v: res,
                });
            } else if res != 0.0 {
                out.push(x);
            }
        } else {
            out.push(Sample {
                labels: without_name(&x.labels),
                v: res,
            });
        }
    }
    Ok(out)
}

/// Arithmetic, or a comparison as 1/0.
fn apply(op: u16, l: f64, r: f64) -> Result<f64, EvalError> {
    let b = |x: bool| f64::from(u8::from(x));
    Ok(match op {
        T_ADD => l + r,
        T_SUB => l - r,
        T_MUL => l * r,
        T_DIV => l / r,
        T_MOD => l % r,
        T_POW => l.powf(r),
        T_ATAN2 => l.atan2(r),
        T_EQLC => b(l == r),
        T_NEQ => b(l != r),
        T_GTR => b(l > r),
        T_LSS => b(l < r),
        T_GTE => b(l >= r),
        T_LTE => b(l <= r),
        T_LAND | T_LOR | T_LUNLESS => return err("set operators apply to two instant vectors"),
        _ => return err("unsupported operator"),
    })
}

/// Prometheus' extrapolated rate/increase/delta over the samples of the
/// window `(from, to]`.
fn extrapolated(p: &[(i64, f64)], from: i64, to: i64, counter: bool, per_second: bool) -> Option<f64> {
    if p.len() < 2 {
        return None;
    }
    let (first, last) = (p[0], p[p.len() - 1]);
    let mut result = last.1 - first.1;
    if counter {
        for w in p.windows(2) {
            if w[1].1 < w[0].1 {
                result += w[0].1;
            }
        }
    }
    let sampled = (last.0 - first.0) as f64 / 1000.0;
    let mut to_start = (first.0 - from) as f64 / 1000.0;
    let to_end = (to - last.0) as f64 / 1000.0;
    let avg_step = sampled / (p.len() - 1) as f64;
    if counter && result > 0.0 && first.1 >= 0.0 {
        let to_zero = sampled * (first.1 / result);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    let threshold = avg_step * 1.1;
    let mut interval = sampled;
    interval += if to_start < threshold { to_start } else { avg_step / 2.0 };
    interval += if to_end < threshold { to_end } else { avg_step / 2.0 };
    let mut factor = interval / sampled;
    if per_second {
        factor /= (to - from) as f64 / 1000.0;
    }
    Some(result * factor)
}

fn instant_rate(p: &[(i64, f64)], per_second: bool) -> Option<f64> {
    if p.len() < 2 {
        return None;
    }
    let (a, b) = (p[p.len() - 2], p[p.len() - 1]);
    let diff = if per_second && b.1 < a.1 { b.1 } else { b.1 - a.1 };
    if !per_second {
        return Some(diff);
    }
    let dt = (b.0 - a.0) as f64 / 1000.0;
    (dt > 0.0).then(|| diff / dt)
}

/// φ-quantile with linear interpolation (Prometheus' rule; LogQL's too).
pub(crate) fn quantile(q: f64, mut vals: Vec<f64>) -> f64 {
    if vals.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    vals.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let rank = q * (vals.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = (lo + 1).min(vals.len() - 1);
    let w = rank - lo as f64;
    vals[lo] * (1.0 - w) + vals[hi] * w
}

/// `histogram_quantile` over classic `le` buckets, grouped by every label
/// but `le` (and the metric name).
fn histogram_quantile(q: f64, input: Vec<Sample>) -> Vec<Sample> {
    let mut groups: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
    for s in input {
        if let Some((key, le)) = bucket_of(&s.labels) {
            groups.entry(key).or_default().push((le, s.v));
        }
    }
    groups
        .into_iter()
        .map(|(labels, mut buckets)| Sample {
            labels,
            v: sorted_bucket_quantile(q, &mut buckets),
        })
        .collect()
}

/// A bucket series' group (every label but `le` and the name) and bound;
/// `None` without a readable `le`.
fn bucket_of(labels: &Labels) -> Option<(Labels, f64)> {
    let le = label(labels, "le").and_then(parse_le)?;
    let key = labels.iter().filter(|(k, _)| k != "le" && k != NAME).cloned().collect();
    Some((key, le))
}

/// The quantile of (bound, count) buckets in any order (sorted by bound
/// here, stably).
fn sorted_bucket_quantile(q: f64, buckets: &mut [(f64, f64)]) -> f64 {
    buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    bucket_quantile(q, buckets)
}

fn parse_le(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" | "inf" => Some(f64::INFINITY),
        _ => v.parse().ok(),
    }
}

fn bucket_quantile(q: f64, buckets: &mut [(f64, f64)]) -> f64 {
    if q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    if buckets.len() < 2 || buckets.last().map(|b| b.0) != Some(f64::INFINITY) {
        return f64::NAN;
    }
    // Counts must not decrease with le (float noise in rates).
    for i in 1..buckets.len() {
        if buckets[i].1 < buckets[i - 1].1 {
            buckets[i].1 = buckets[i - 1].1;
        }
    }
    let total = buckets[buckets.len() - 1].1;
    if total == 0.0 || total.is_nan() {
        return f64::NAN;
    }
    let mut rank = q * total;
    let b = buckets[..buckets.len() - 1]
        .iter()
        .position(|x| x.1 >= rank)
        .unwrap_or(buckets.len() - 1);
    if b == buckets.len() - 1 {
        return buckets[buckets.len() - 2].0;
    }
    if b == 0 && buckets[0].0 <= 0.0 {
        return buckets[0].0;
    }
    let (mut start, end, mut count) = (0.0, buckets[b].0, buckets[b].1);
    if b > 0 {
        start = buckets[b - 1].0;
        count -= buckets[b - 1].1;
        rank -= buckets[b - 1].1;
    }
    start + (end - start) * (rank / count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, extra: &[(&str, &str)], samples: Vec<(i64, f64)>) -> Series {
        let mut labels: Labels = extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        labels.push((NAME.to_owned(), name.to_owned()));
        labels.sort();
        Series { labels, samples }
    }

    fn engine(series: Vec<Series>) -> Engine {
        Engine::new(
            series,
            Settings {
                lookback_ms: 300_000,
                start_ms: 0,
                end_ms: 0,
                max_samples: 1_000_000,
            },
        )
    }

    fn run(e: &Engine, q: &str, t: i64) -> Value {
        e.eval(&promql_parser::parser::parse(q).expect("parse"), t)
            .expect("eval")
    }

    fn vector(v: Value) -> Vec<(Labels, f64)> {
        match v {
            Value::Vector(mut v) => {
                v.sort_by(|a, b| a.labels.cmp(&b.labels));
                v.into_iter().map(|s| (s.labels, s.v)).collect()
            }
            other => panic!("not a vector: {other:?}"),
        }
    }

    #[test]
    fn rate_of_a_steady_counter_is_its_slope_and_aggregation_groups() {
        // Two counters sampled every 15 s, +3/s and +1/s.
        let a = series(
            "req_total",
            &[("job", "a"), ("code", "200")],
            (0..100).map(|i| (i * 15_000, 1000.0 + 45.0 * i as f64)).collect(),
        );
        let b = series(
            "req_total",
            &[("job", "b"), ("code", "200")],
            (0..100).map(|i| (i * 15_000, 500.0 + 15.0 * i as f64)).collect(),
        );
        let e = engine(vec![a, b]);
        let t = 60 * 15_000;
        let r = vector(run(&e, "rate(req_total[5m])", t));
        assert_eq!(r.len(), 2);
        assert!((r[0].1 - 3.0).abs() < 1e-9, "{r:?}");
        assert!((r[1].1 - 1.0).abs() < 1e-9);
        assert!(label(&r[0].0, NAME).is_none(), "rate drops the name");
        let s = vector(run(&e, "sum by (code) (increase(req_total[5m]))", t));
        assert_eq!(s.len(), 1);
        assert!((s[0].1 - 1200.0).abs() < 1e-6, "{s:?}");
        let m = vector(run(&e, "max(req_total) - min(req_total)", t));
        assert!((m[0].1 - (1000.0 + 45.0 * 60.0 - 500.0 - 15.0 * 60.0)).abs() < 1e-9);
        let f = vector(run(&e, r#"req_total{job=~"a|c"} > 100"#, t));
        assert_eq!(f.len(), 1);
        assert_eq!(label(&f[0].0, NAME), Some("req_total"), "a filter keeps the name");
        // Nothing in the lookback window: no sample.
        assert!(vector(run(&e, "req_total", 10_000_000)).is_empty());
    }

    #[test]
    fn histogram_quantile_interpolates_within_the_bucket() {
        let mk = |le: &str, v: f64| series("lat_bucket", &[("le", le)], vec![(0, v)]);
        let e = engine(vec![mk("0.1", 10.0), mk("0.5", 60.0), mk("1", 90.0), mk("+Inf", 100.0)]);
        let r = vector(run(&e, "histogram_quantile(0.5, lat_bucket)", 1000));
        // rank 50: bucket (0.1, 0.5] holds 50 of which 40 are needed.
        assert!((r[0].1 - (0.1 + 0.4 * 40.0 / 50.0)).abs() < 1e-12, "{r:?}");
        let top = vector(run(&e, "histogram_quantile(0.99, lat_bucket)", 1000));
        assert!(
            (top[0].1 - 1.0).abs() < 1e-12,
            "the +Inf bucket answers the highest finite bound"
        );
    }

    #[test]
    fn vector_matching_and_errors() {
        let a = series("a", &[("i", "1"), ("x", "p")], vec![(0, 10.0)]);
        let b = series("b", &[("i", "1")], vec![(0, 2.0)]);
        let e = engine(vec![a, b]);
        let r = vector(run(&e, "a / on(i) b", 0));
        assert_eq!(r[0].1, 5.0);
        let g = vector(run(&e, "a * on(i) group_left b", 0));
        assert_eq!(
            g[0].0,
            vec![("i".to_owned(), "1".to_owned()), ("x".to_owned(), "p".to_owned())]
        );
        assert!(
            promql_parser::parser::parse("rate(a)").is_err(),
            "the parser checks argument types"
        );
        let unsupported = e.eval(&promql_parser::parser::parse("sort(a)").expect("parse"), 0);
        assert!(unsupported.expect_err("sort").0.contains("not supported"));
    }
}
