//! Query languages through the querier's own parsers, then as far towards
//! an answer as works without a cluster:
//!
//! - 0: LogQL (`logql::eval::parse_query`); every log expression's
//!   selector matchers compiled (`str_test`), its pipeline compiled and run
//!   on a log line (the bytes after the first NUL), which exercises the
//!   `json`, `logfmt`, `regexp`, `pattern`, `unwrap` and label filter code
//!   on outside text;
//! - 1: TraceQL (`traceql::parse`), compiled and run over a generated trace;
//! - 2: PromQL (`promql::parse`), evaluated at two instants and over a
//!   range on a few generated series through `promql::evaluate_in_memory`
//!   (the querier's checks and evaluation after loading);
//! - 3: attribute selectors of the native API (`selector::parse`).
//!
//! Input: byte 0 picks the language (`% 4`); then the query, up to the
//! first NUL; for LogQL the rest is the log line.
//!
//! Checked beyond "no panic": parsing is deterministic (a second parse
//! gives an equal tree); PromQL's printed form of an accepted query parses
//! again.

#![no_main]

#[path = "../common/seeds.rs"]
mod seeds;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mira_querier::logql::ast::{Expr, LogExpr, MetricExpr};
use mira_querier::logql::eval::parse_query;
use mira_querier::logql::model::{Cat, Entry, Label};
use mira_querier::logql::pipeline::{Pipeline, str_test};
use mira_querier::promql::eval::Series;
use mira_querier::promql::{PromQuery, evaluate_in_memory};
use mira_querier::traceql::eval::{Compiled, TraceView};
use mira_testkit::corpus::{Cardinality, Corpus};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

fn log_exprs<'a>(m: &'a MetricExpr, out: &mut Vec<&'a LogExpr>) {
    match m {
        MetricExpr::Range(r) => out.push(&r.log),
        MetricExpr::Vector(v) => log_exprs(&v.inner, out),
        MetricExpr::Binary(b) => {
            log_exprs(&b.lhs, out);
            log_exprs(&b.rhs, out);
        }
        MetricExpr::LabelReplace(l) => log_exprs(&l.inner, out),
        MetricExpr::Paren(p) => log_exprs(p, out),
        MetricExpr::Literal(_) | MetricExpr::VectorOf(_) => {}
    }
}

fn logql(query: &str, line: &[u8]) {
    let Ok(expr) = parse_query(query) else {
        return;
    };
    // Debug form, so a NaN literal compares equal to itself.
    assert_eq!(
        format!("{:?}", parse_query(query).ok()),
        format!("{:?}", Some(&expr)),
        "LogQL parsing is not deterministic"
    );
    let mut logs = Vec::new();
    match &expr {
        Expr::Log(l) => logs.push(l),
        Expr::Metric(m) => log_exprs(m, &mut logs),
    }
    let line = String::from_utf8_lossy(line).into_owned();
    for log in logs {
        for m in &log.selector {
            let _ = str_test(m.op, &m.value);
        }
        let Ok(pipeline) = Pipeline::compile(&log.stages) else {
            continue;
        };
        let label = |name: &str, value: &str, cat| Label {
            name: name.to_owned(),
            value: value.to_owned(),
            cat,
        };
        let mut entry = Entry {
            ts: 1_750_000_000_000_000_000,
            line: line.clone(),
            line_is_text: true,
            labels: vec![
                label("service_name", "checkout", Cat::Stream),
                label("level", "info", Cat::Meta),
                label("trace_id", "0af7651916cd43dd8448eb211c80319c", Cat::Meta),
            ],
        };
        let mut value = None;
        let _ = pipeline.run(&mut entry, &mut value);
    }
}

fn trace() -> &'static ExportTraceServiceRequest {
    static TRACE: OnceLock<ExportTraceServiceRequest> = OnceLock::new();
    TRACE.get_or_init(|| Corpus::new(7, Cardinality::Low).traces(24))
}

fn traceql(query: &str) {
    let Ok(q) = mira_querier::traceql::parse(query) else {
        return;
    };
    assert_eq!(
        format!("{:?}", mira_querier::traceql::parse(query).ok()),
        format!("{:?}", Some(&q)),
        "TraceQL parsing is not deterministic"
    );
    if let Ok(c) = Compiled::new(q) {
        let _ = c.run(&TraceView::new(trace()));
    }
}

fn series() -> Vec<Series> {
    let labels = |name: &str, job: &str| {
        let mut l = vec![
            ("__name__".to_owned(), name.to_owned()),
            ("job".to_owned(), job.to_owned()),
            ("le".to_owned(), "0.5".to_owned()),
        ];
        l.sort();
        l
    };
    let samples = |k: f64| (0..20).map(|i| (i * 15_000, k * i as f64)).collect::<Vec<_>>();
    vec![
        Series {
            labels: labels("http_requests_total", "api"),
            samples: samples(1.0),
        },
        Series {
            labels: labels("http_requests_total", "web"),
            samples: samples(2.5),
        },
        Series {
            labels: labels("latency_seconds_bucket", "api"),
            samples: samples(0.5),
        },
    ]
}

fn promql(query: &str) {
    let Ok(expr) = mira_querier::promql::parse(query) else {
        return;
    };
    let printed = expr.to_string();
    assert!(
        mira_querier::promql::parse(&printed).is_ok(),
        "the printed form {printed:?} of an accepted query does not parse"
    );
    // As the querier answers it once its series are loaded: the same
    // checks (depth, times, the windows `@`, offsets and ranges read), the
    // series cut to those windows, an instant and a range evaluation with
    // the step sample limit on.
    let at = |start_ms, end_ms, instant| PromQuery {
        tenant: "fuzz".to_owned(),
        query: query.to_owned(),
        start_ms,
        end_ms,
        step_ms: 15_000,
        instant,
    };
    for q in [at(150_000, 150_000, true), at(300_000, 300_000, true), at(0, 300_000, false)] {
        let _ = evaluate_in_memory(&q, series());
    }
}

/// The LogQL and TraceQL corpora of the grammar tests (valid and
/// invalid), the PromQL queries of the reference tests, a few selectors.
fn make_seeds() -> Vec<(String, Vec<u8>)> {
    const LOGQL_VALID: &str = include_str!("../../tests/fixtures/logql-valid.txt");
    const LOGQL_INVALID: &str = include_str!("../../tests/fixtures/logql-invalid.txt");
    const TRACEQL_VALID: &str = include_str!("../../tests/fixtures/traceql-valid.txt");
    const TRACEQL_INVALID: &str = include_str!("../../tests/fixtures/traceql-invalid.txt");
    const PROMQL: &[&str] = &[
        "http_server_requests_total",
        "rate(http_server_requests_total[5m])",
        "sum by (job) (rate(http_server_requests_total{job=~\"api|web\"}[5m]))",
        "histogram_quantile(0.9, sum by (le) (rate(http_server_duration_seconds_bucket[5m])))",
        "rate(http_server_duration_seconds_sum[5m]) / rate(http_server_duration_seconds_count[5m])",
        "max_over_time(process_memory_usage_bytes[10m:1m] offset 5m)",
        "topk(3, sum without (instance) (http_requests_total)) > bool 2",
        "label_replace(up, \"dst\", \"$1\", \"job\", \"(.*)\")",
        "absent(nonexistent{job=\"x\"}) or vector(1)",
        "http_requests_total @ 100 - http_requests_total offset 1m",
        "sum(rate(http_requests_total[1m])) by (job) / on (job) group_left count(up) by (job)",
        "quantile_over_time(0.5, http_requests_total[5m])",
        "{__name__=~\"http_.*\", job!=\"web\"}",
    ];
    const SELECTORS: &[&str] = &[
        "{}",
        "{service.name=\"checkout\"}",
        "{resource.k8s.namespace.name=~\"prod-.*\", span.http.status_code!=\"200\"}",
        "{log.level!~\"debug|trace\", scope.name=\"app\"}",
    ];
    let lines = |text: &'static str| {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect::<Vec<_>>()
    };
    let log_line =
        b"\0{\"level\":\"error\",\"status\":503,\"msg\":\"upstream timed out\",\"took\":\"1.5s\",\"size\":\"12KB\"}";
    let logfmt_line = b"\0level=warn status=404 took=250ms path=/api/v1/push msg=\"not found\"";
    let mut out = Vec::new();
    for (i, q) in lines(LOGQL_VALID).into_iter().chain(lines(LOGQL_INVALID)).enumerate() {
        let line: &[u8] = if i % 2 == 0 { log_line } else { logfmt_line };
        out.push((
            format!("logql-{i:03}"),
            seeds::with_selector(0, &[q.as_bytes(), line].concat()),
        ));
    }
    for (i, q) in lines(TRACEQL_VALID)
        .into_iter()
        .chain(lines(TRACEQL_INVALID))
        .enumerate()
    {
        out.push((format!("traceql-{i:03}"), seeds::with_selector(1, q.as_bytes())));
    }
    for (i, q) in PROMQL.iter().enumerate() {
        out.push((format!("promql-{i:03}"), seeds::with_selector(2, q.as_bytes())));
    }
    // Deep nesting in every language (issue 29): each must be refused at
    // its depth limit, never overflow a stack, in parsing or evaluation.
    let nest = |open: &str, inner: &str, close: &str, n: usize| format!("{}{inner}{}", open.repeat(n), close.repeat(n));
    let deep: [(u8, String); 13] = [
        (2, nest("abs(", "up", ")", 3_000)),
        (2, vec!["up"; 5_000].join(" + ")),
        (2, nest("(", "up", ")", 20_000)),
        (2, format!("{}up", "-".repeat(10_000))),
        (0, nest("(", "{app=\"a\"}", ")", 5_000)),
        (0, nest("sum(", "count_over_time({app=\"a\"}[1m])", ")", 3_000)),
        (1, nest("(", "{ }", ")", 5_000)),
        (1, vec!["{ }"; 3_000].join(" >> ")),
        // Within the runs' -max_len (4096, scripts/fuzz.sh), which cuts
        // the longer ones above.
        (2, nest("abs(", "up", ")", 700)),
        (2, nest("(", "up", ")", 2_000)),
        (2, vec!["up"; 800].join(" + ")),
        // At the PromQL limit: accepted and evaluated.
        (2, nest("abs(", "rate(http_requests_total[1m])", ")", 98)),
        (2, vec!["http_requests_total"; 100].join(" + ")),
    ];
    for (i, (sel, q)) in deep.iter().enumerate() {
        out.push((format!("deep-{i:03}"), seeds::with_selector(*sel, q.as_bytes())));
    }
    for (i, q) in SELECTORS.iter().enumerate() {
        out.push((format!("selector-{i:03}"), seeds::with_selector(3, q.as_bytes())));
    }
    out
}

fuzz_target!(init: seeds::write_if_asked(make_seeds), |data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let (query, line) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(query) = std::str::from_utf8(query) else {
        return;
    };
    match sel % 4 {
        0 => logql(query, line),
        1 => traceql(query),
        2 => promql(query),
        _ => {
            let _ = mira_querier::selector::parse(query);
        }
    }
});
