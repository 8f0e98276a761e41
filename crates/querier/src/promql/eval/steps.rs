//! Range queries evaluated over every step at once, for the shapes
//! dashboards ask most: selectors, range functions over a range selector,
//! aggregations of them, `histogram_quantile`, and arithmetic or
//! comparison with a number. A series' labels are built, its group found
//! and its window walked once per query instead of once per step: the
//! window of each step is found by moving two cursors forward over the
//! series' sorted samples, and no labels are cloned per step. Any other
//! shape gives `None` and is evaluated step by step ([`Engine::eval`]).
//!
//! Answers equal the step-by-step path's, value for value: the same
//! series in the same order at every step, aggregated in the same order
//! by the same functions (`tests` compares the two on many expressions).

use std::collections::BTreeMap;

use promql_parser::parser::{AggregateExpr, BinaryExpr, Call, Expr, MatrixSelector, VectorSelector};
use rayon::prelude::*;

use super::{
    CANCELLED, Engine, EvalError, Labels, T_BOTTOMK, T_TOPK, Value, WindowFn, aggregate_values, apply, at_ms,
    bucket_of, k_order, match_key, offset_ms, range_function, sorted_bucket_quantile, without_name,
};

/// One series of a range evaluation: its labels and its value at each
/// step (`None`: no sample at that step).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub labels: Labels,
    pub vals: Vec<Option<f64>>,
}

type Rows = Option<Result<Vec<Row>, EvalError>>;

/// Called with each step's window, its start and its end.
type EachWindow<'a> = dyn FnMut(&[(i64, f64)], i64, i64) + 'a;

/// A range query's answer: each series' (time, value) points, by labels.
pub type Matrix = BTreeMap<Labels, Vec<(i64, f64)>>;

impl Engine {
    /// `expr` at every time of `steps` (ascending, ms): over all steps at
    /// once where the shape allows, else step by step.
    pub fn eval_range(&self, expr: &Expr, steps: &[i64]) -> Result<Matrix, EvalError> {
        if let Some(rows) = self.eval_steps(expr, steps) {
            let rows = rows?;
            // Series skipped by a cancellation leave a partial answer.
            if self.stopped() {
                return Err(EvalError(CANCELLED.into()));
            }
            if let Some(m) = matrix(rows, steps) {
                return Ok(m);
            }
        }
        self.eval_range_by_step(expr, steps)
    }

    /// `expr` evaluated at each step on its own (in parallel), the
    /// samples gathered by labels in step order.
    pub fn eval_range_by_step(&self, expr: &Expr, steps: &[i64]) -> Result<Matrix, EvalError> {
        let values = steps
            .par_iter()
            .map(|&t| self.eval(expr, t).map(|v| (t, v)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut out = Matrix::new();
        for (t, value) in values {
            match value {
                Value::Scalar(v) => out.entry(Vec::new()).or_default().push((t, v)),
                Value::Vector(v) => {
                    for s in v {
                        out.entry(s.labels).or_default().push((t, s.v));
                    }
                }
                _ => {
                    return Err(EvalError(
                        "a range query must give a scalar or an instant vector".into(),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// `expr` at every time of `steps` (ascending, ms), or `None` when it
    /// has a shape this path does not evaluate.
    pub fn eval_steps(&self, expr: &Expr, steps: &[i64]) -> Rows {
        if steps.windows(2).any(|w| w[1] < w[0]) {
            return None;
        }
        self.rows(expr, steps, true)
    }

    /// `top`: the rows go straight to the answer, whose series are
    /// ordered by labels; below that, the order of samples within a step
    /// matters (an aggregation adds them in it) and `topk`'s per-step
    /// order is not a row order, so `topk` is taken at the top only.
    fn rows(&self, expr: &Expr, steps: &[i64], top: bool) -> Rows {
        if self.stopped() {
            return Some(Err(EvalError(CANCELLED.into())));
        }
        match expr {
            Expr::Paren(p) => self.rows(&p.expr, steps, top),
            Expr::VectorSelector(vs) => Some(self.instant_rows(vs, steps)),
            Expr::Call(c) => self.call_rows(c, steps),
            Expr::Aggregate(a) => self.aggregate_rows(a, steps, top),
            Expr::Binary(b) => self.scalar_binary_rows(b, steps, top),
            _ => None,
        }
    }

    fn instant_rows(&self, vs: &VectorSelector, steps: &[i64]) -> Result<Vec<Row>, EvalError> {
        let fixed = at_ms(&vs.at, &self.settings);
        let off = offset_ms(&vs.offset);
        let lookback = self.settings.lookback_ms;
        let ids = self.select(vs);
        let rows: Vec<Row> = ids
            .par_iter()
            .filter_map(|&i| {
                if self.stopped() {
                    return None;
                }
                let s = &self.series[i].samples;
                // Steps ascend, so each step's end does too: `hi` (samples
                // at or before it) only moves forward.
                let mut hi = 0;
                let vals: Vec<Option<f64>> = steps
                    .iter()
                    .map(|&t| {
                        let at = fixed.unwrap_or(t) - off;
                        while hi < s.len() && s[hi].0 <= at {
                            hi += 1;
                        }
                        (hi > 0 && s[hi - 1].0 > at - lookback).then(|| s[hi - 1].1)
                    })
                    .collect();
                vals.iter().any(Option::is_some).then(|| Row {
                    labels: self.series[i].labels.clone(),
                    vals,
                })
            })
            .collect();
        if rows.len() > self.settings.max_samples {
            (0..steps.len()).try_for_each(|k| self.check_size(rows.iter().filter(|r| r.vals[k].is_some()).count()))?;
        }
        Ok(rows)
    }

    fn call_rows(&self, c: &Call, steps: &[i64]) -> Rows {
        if let Some((f, keep_name)) = range_function(c.func.name) {
            let Some(Expr::MatrixSelector(ms)) = c.args.args.first().map(|a| a.as_ref()) else {
                return None;
            };
            return Some(self.range_rows(ms, f, keep_name, steps));
        }
        if c.func.name != "histogram_quantile" {
            return None;
        }
        let Some(Expr::NumberLiteral(q)) = c.args.args.first().map(|a| a.as_ref()) else {
            return None;
        };
        let rows = match self.rows(c.args.args.get(1)?, steps, false)? {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        Some(Ok(histogram_quantile_rows(q.val, &rows, steps.len())))
    }

    fn range_rows(
        &self,
        ms: &MatrixSelector,
        f: WindowFn,
        keep_name: bool,
        steps: &[i64],
    ) -> Result<Vec<Row>, EvalError> {
        let fixed = at_ms(&ms.vs.at, &self.settings);
        let off = offset_ms(&ms.vs.offset);
        let range = super::range_ms(ms);
        let ids = self.select(&ms.vs);
        let windows = |s: &[(i64, f64)], each: &mut EachWindow| each_window(s, steps, fixed, off, range, each);
        let bound: usize = ids.iter().map(|&i| self.series[i].samples.len()).sum();
        if bound > self.settings.max_samples {
            let mut totals = vec![0; steps.len()];
            for &i in ids.iter() {
                let mut k = 0;
                windows(&self.series[i].samples, &mut |w, _, _| {
                    totals[k] += w.len();
                    k += 1;
                });
            }
            totals.iter().try_for_each(|&n| self.check_size(n))?;
        }
        Ok(ids
            .par_iter()
            .filter_map(|&i| {
                if self.stopped() {
                    return None;
                }
                let s = &self.series[i];
                let mut vals = Vec::with_capacity(steps.len());
                windows(&s.samples, &mut |w, from, to| {
                    vals.push(if w.is_empty() { None } else { f(w, from, to) })
                });
                vals.iter().any(Option::is_some).then(|| Row {
                    labels: if keep_name {
                        s.labels.clone()
                    } else {
                        without_name(&s.labels)
                    },
                    vals,
                })
            })
            .collect())
    }

    fn aggregate_rows(&self, a: &AggregateExpr, steps: &[i64], top: bool) -> Rows {
        let op = a.op.id();
        let param = match a.param.as_deref() {
            None => None,
            Some(Expr::NumberLiteral(n)) => Some(n.val),
            Some(_) => return None,
        };
        let select_k = op == T_TOPK || op == T_BOTTOMK;
        // An operator `aggregate_values` does not know is left to the
        // step-by-step path, which names it in its error.
        if (select_k && !top) || (!select_k && aggregate_values(op, param, &[]).is_none()) {
            return None;
        }
        let rows = match self.rows(&a.expr, steps, false)? {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let mut groups: BTreeMap<Labels, Vec<usize>> = BTreeMap::new();
        for (i, r) in rows.iter().enumerate() {
            let key = match &a.modifier {
                None => Vec::new(),
                m => match_key(&r.labels, m.as_ref()),
            };
            groups.entry(key).or_default().push(i);
        }
        if select_k {
            let k = param.unwrap_or(0.0).max(0.0) as usize;
            let mut picked: Vec<Vec<Option<f64>>> = vec![Vec::new(); rows.len()];
            let mut order = Vec::new();
            let mut present: Vec<(usize, f64)> = Vec::new();
            for members in groups.values() {
                for s in 0..steps.len() {
                    present.clear();
                    present.extend(members.iter().filter_map(|&m| rows[m].vals[s].map(|v| (m, v))));
                    present.sort_by(|x, y| k_order(op, x.1, y.1));
                    for &(m, v) in present.iter().take(k) {
                        if picked[m].is_empty() {
                            picked[m] = vec![None; steps.len()];
                            order.push(m);
                        }
                        picked[m][s] = Some(v);
                    }
                }
            }
            let mut rows: Vec<Option<Row>> = rows.into_iter().map(Some).collect();
            return Some(Ok(order
                .into_iter()
                .filter_map(|m| {
                    rows[m].take().map(|r| Row {
                        labels: r.labels,
                        vals: std::mem::take(&mut picked[m]),
                    })
                })
                .collect()));
        }
        let groups: Vec<(Labels, Vec<usize>)> = groups.into_iter().collect();
        Some(Ok(groups
            .into_par_iter()
            .map_init(Vec::new, |buf: &mut Vec<f64>, (labels, members)| {
                let vals = (0..steps.len())
                    .map(|s| {
                        buf.clear();
                        buf.extend(members.iter().filter_map(|&m| rows[m].vals[s]));
                        if buf.is_empty() {
                            None
                        } else {
                            aggregate_values(op, param, buf)
                        }
                    })
                    .collect();
                Row { labels, vals }
            })
            .collect()))
    }

    /// A vector and a number: arithmetic, or a comparison (a filter, or
    /// 1/0 with `bool`), as `vector_scalar` does it per step.
    fn scalar_binary_rows(&self, b: &BinaryExpr, steps: &[i64], top: bool) -> Rows {
        let op = b.op.id();
        let (vector, scalar, scalar_left) = match (b.lhs.as_ref(), b.rhs.as_ref()) {
            (v, Expr::NumberLiteral(n)) => (v, n.val, false),
            (Expr::NumberLiteral(n), v) => (v, n.val, true),
            _ => return None,
        };
        if b.op.is_set_operator() || apply(op, 1.0, 1.0).is_err() {
            return None;
        }
        let comparison = b.op.is_comparison_operator();
        let return_bool = b.modifier.as_ref().is_some_and(|m| m.return_bool);
        let rows = match self.rows(vector, steps, top)? {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let keep = comparison && !return_bool;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let mut vals = Vec::with_capacity(r.vals.len());
            for v in r.vals {
                vals.push(match v {
                    None => None,
                    Some(x) => {
                        let (l, rv) = if scalar_left { (scalar, x) } else { (x, scalar) };
                        let res = match apply(op, l, rv) {
                            Ok(res) => res,
                            Err(e) => return Some(Err(e)),
                        };
                        if keep { (res != 0.0).then_some(x) } else { Some(res) }
                    }
                });
            }
            if vals.iter().any(Option::is_some) {
                let labels = if keep { r.labels } else { without_name(&r.labels) };
                out.push(Row { labels, vals });
            }
        }
        Some(Ok(out))
    }
}

/// The answer of rows; `None` when two rows have the same labels (the
/// step-by-step path then decides how their samples interleave).
fn matrix(rows: Vec<Row>, steps: &[i64]) -> Option<Matrix> {
    let mut out = Matrix::new();
    for r in rows {
        let points: Vec<(i64, f64)> = steps
            .iter()
            .zip(r.vals)
            .filter_map(|(t, v)| v.map(|v| (*t, v)))
            .collect();
        if points.is_empty() {
            continue;
        }
        if out.insert(r.labels, points).is_some() {
            return None;
        }
    }
    Some(out)
}

/// Calls `each` with the window `(at - range, at]` of every step (`at`
/// the step's time, or the fixed `@` time, less the offset), found by two
/// cursors over the sorted samples that only move forward.
fn each_window(s: &[(i64, f64)], steps: &[i64], fixed: Option<i64>, off: i64, range: i64, each: &mut EachWindow) {
    let (mut lo, mut hi) = (0, 0);
    for &t in steps {
        let at = fixed.unwrap_or(t) - off;
        while hi < s.len() && s[hi].0 <= at {
            hi += 1;
        }
        while lo < s.len() && s[lo].0 <= at - range {
            lo += 1;
        }
        each(&s[lo..hi.max(lo)], at - range, at);
    }
}

/// `histogram_quantile` at every step: rows grouped by every label but
/// `le` (and the name), each step's buckets sorted by bound.
fn histogram_quantile_rows(q: f64, rows: &[Row], steps: usize) -> Vec<Row> {
    let mut groups: BTreeMap<Labels, Vec<(usize, f64)>> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        if let Some((key, le)) = bucket_of(&r.labels) {
            groups.entry(key).or_default().push((i, le));
        }
    }
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    groups
        .into_iter()
        .map(|(labels, members)| {
            let vals = (0..steps)
                .map(|s| {
                    buckets.clear();
                    buckets.extend(members.iter().filter_map(|&(m, le)| rows[m].vals[s].map(|v| (le, v))));
                    if buckets.is_empty() {
                        return None;
                    }
                    Some(sorted_bucket_quantile(q, &mut buckets))
                })
                .collect();
            Row { labels, vals }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::{NAME, Series, Settings};
    use super::*;

    /// Expressions the all-steps path takes (it must not give `None`).
    const TAKEN: &[&str] = &[
        "a",
        "a{job=\"x\"}",
        "a offset 1m",
        "a @ 300",
        "rate(a[1m])",
        "rate({__name__=~\"a|b\"}[1m])",
        "increase(a[2m])",
        "delta(b[1m])",
        "irate(a[1m])",
        "idelta(b[30s])",
        "avg_over_time(b[1m])",
        "sum_over_time(b[2m])",
        "count_over_time(a[1m])",
        "min_over_time(b[1m])",
        "max_over_time(b[1m])",
        "last_over_time(a[1m])",
        "resets(a[3m])",
        "changes(b[3m])",
        "sum(rate(a[1m]))",
        "sum by (job) (rate(a[1m]))",
        "sum without (inst) (rate(a[1m]))",
        "avg by (inst) (b)",
        "count(a)",
        "group by (job) (b)",
        "min by (job) (b)",
        "max by (job) (a)",
        "stddev(b)",
        "stdvar by (job) (b)",
        "quantile(0.7, b)",
        "topk(2, increase(a[2m]))",
        "bottomk(1, b)",
        "topk by (job) (1, a)",
        "histogram_quantile(0.9, sum by (le, job) (rate(c_bucket[1m])))",
        "histogram_quantile(0.5, c_bucket)",
        "sum(rate(a[1m])) * 60",
        "100 - b",
        "b > 5",
        "b > bool 5",
        "5 < a",
        "(sum by (job) (b))",
        "max(sum by (job) (rate(a[1m])))",
    ];

    /// Shapes left to the step-by-step path.
    const LEFT: &[&str] = &[
        "a + b",
        "sum(topk(1, a))",
        "abs(b)",
        "a and b",
        "quantile(scalar(a), b)",
    ];

    fn labels(name: &str, pairs: &[(&str, String)]) -> Labels {
        let mut l: Labels = pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        l.push((NAME.to_owned(), name.to_owned()));
        l.sort();
        l
    }

    /// Series `a` (counters with resets), `b` (gauges, some NaN) and
    /// `c_bucket` (cumulative buckets), over jobs and instances; `a` and
    /// `b` share label sets, so dropping the name makes duplicates.
    fn dataset() -> impl Strategy<Value = Vec<Series>> {
        let samples = prop::collection::vec((1i64..40, 0u8..20, -50.0f64..50.0), 0..30);
        prop::collection::vec((0u8..3, 0u8..3, 0u8..3, samples), 1..12).prop_map(|specs| {
            let mut out: Vec<Series> = Vec::new();
            for (kind, job, inst, raw) in specs {
                let (mut t, mut counter) = (0i64, 0.0f64);
                let mut samples = Vec::new();
                for (gap, roll, v) in raw {
                    t += gap * 5_000;
                    counter = if roll == 0 { v.abs() } else { counter + v.abs() };
                    let value = match kind {
                        0 => counter,
                        _ if roll == 1 => f64::NAN,
                        _ => v,
                    };
                    samples.push((t, value));
                }
                let pairs = vec![("job", format!("j{job}")), ("inst", format!("i{inst}"))];
                let mut push = |l: Labels, samples: Vec<(i64, f64)>| {
                    if !out.iter().any(|s| s.labels == l) {
                        out.push(Series { labels: l, samples });
                    }
                };
                match kind {
                    0 => push(labels("a", &pairs), samples),
                    1 => push(labels("b", &pairs), samples),
                    _ => {
                        for (i, le) in ["0.1", "1", "+Inf"].iter().enumerate() {
                            let mut p = pairs.clone();
                            p.push(("le", (*le).to_owned()));
                            let scaled = samples.iter().map(|(t, v)| (*t, v.abs() * (i + 1) as f64)).collect();
                            push(labels("c_bucket", &p), scaled);
                        }
                    }
                }
            }
            out
        })
    }

    fn engine(series: Vec<Series>, max_samples: usize) -> Engine {
        Engine::new(
            series,
            Settings {
                lookback_ms: 60_000,
                start_ms: 0,
                end_ms: 0,
                max_samples,
            },
        )
    }

    fn same(a: &Matrix, b: &Matrix) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|((la, pa), (lb, pb))| {
                la == lb
                    && pa.len() == pb.len()
                    && pa
                        .iter()
                        .zip(pb)
                        .all(|(x, y)| x.0 == y.0 && (x.1.to_bits() == y.1.to_bits() || (x.1.is_nan() && y.1.is_nan())))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn all_steps_at_once_answer_as_step_by_step(
            series in dataset(),
            start in 0i64..200,
            step in 1i64..90,
            n in 1usize..40,
        ) {
            let e = engine(series, 1_000_000);
            let steps: Vec<i64> = (0..n as i64).map(|k| (start + k * step) * 1_000).collect();
            for q in TAKEN.iter().chain(LEFT) {
                let expr = promql_parser::parser::parse(q).expect("parse");
                let by_step = e.eval_range_by_step(&expr, &steps).expect("by step");
                let at_once = e.eval_range(&expr, &steps).expect("at once");
                prop_assert!(same(&at_once, &by_step), "{q}: {at_once:?} != {by_step:?}");
                let taken = e.eval_steps(&expr, &steps).is_some();
                prop_assert_eq!(taken, TAKEN.contains(q), "{}", q);
            }
        }
    }

    #[test]
    fn a_step_over_the_sample_limit_is_refused_as_step_by_step() {
        let series = (0..4)
            .map(|i| Series {
                labels: labels("a", &[("i", i.to_string())]),
                samples: (0..20).map(|k| (k * 10_000, k as f64)).collect(),
            })
            .collect();
        let e = engine(series, 10);
        let steps: Vec<i64> = (0..10).map(|k| k * 30_000).collect();
        for q in ["sum(rate(a[1m]))", "sum(a)"] {
            let expr = promql_parser::parser::parse(q).expect("parse");
            let by_step = e.eval_range_by_step(&expr, &steps);
            let at_once = e.eval_steps(&expr, &steps).expect("taken");
            assert!(by_step.is_err() == at_once.is_err(), "{q}");
            if let (Err(a), Err(b)) = (by_step, at_once) {
                assert_eq!(a, b);
            }
        }
        // 4 series × 6 samples in a 1 minute window is over 10; 4 series
        // at one step is not.
        assert!(
            e.eval_steps(
                &promql_parser::parser::parse("sum(rate(a[1m]))").expect("parse"),
                &steps
            )
            .expect("taken")
            .is_err()
        );
        assert!(
            e.eval_steps(&promql_parser::parser::parse("sum(a)").expect("parse"), &steps)
                .expect("taken")
                .is_ok()
        );
    }
}
