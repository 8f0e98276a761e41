use super::*;

fn ok(query: &str) -> Expr {
    match parse(query) {
        Ok(e) => e,
        Err(e) => panic!("{query:?} does not parse: {e}"),
    }
}

fn metric(query: &str) -> MetricExpr {
    match ok(query) {
        Expr::Metric(m) => m,
        Expr::Log(l) => panic!("{query:?} is a log query: {l:?}"),
    }
}

fn log(query: &str) -> LogExpr {
    match ok(query) {
        Expr::Log(l) => l,
        Expr::Metric(m) => panic!("{query:?} is a metric query: {m:?}"),
    }
}

fn err(query: &str) -> ParseError {
    match parse(query) {
        Ok(e) => panic!("{query:?} parses: {e:?}"),
        Err(e) => e,
    }
}

fn m(name: &str, op: MatchOp, value: &str) -> Matcher {
    Matcher {
        name: name.into(),
        op,
        value: value.into(),
    }
}

fn bin(op: BinOp, lhs: MetricExpr, rhs: MetricExpr) -> MetricExpr {
    MetricExpr::Binary(Box::new(Binary {
        op,
        lhs,
        rhs,
        return_bool: false,
        matching: None,
    }))
}

fn lit(v: f64) -> MetricExpr {
    MetricExpr::Literal(v)
}

fn s(name: &str, value: &str) -> LabelFilter {
    LabelFilter::Str {
        name: name.into(),
        op: MatchOp::Eq,
        value: value.into(),
    }
}

fn and(a: LabelFilter, b: LabelFilter) -> LabelFilter {
    LabelFilter::And(Box::new(a), Box::new(b))
}

fn or(a: LabelFilter, b: LabelFilter) -> LabelFilter {
    LabelFilter::Or(Box::new(a), Box::new(b))
}

const MINUTE: i64 = 60_000_000_000;

#[test]
fn precedence_is_promql() {
    let v1 = MetricExpr::VectorOf(1.0);
    // ^ is right-associative and binds tightest; then * / %, + -,
    // comparisons, and/unless, or.
    let got = metric("vector(1) + 2 * 3 ^ 2 ^ 1 > bool 4 and vector(1) or vector(0)");
    let pow = bin(BinOp::Pow, lit(3.0), bin(BinOp::Pow, lit(2.0), lit(1.0)));
    let sum = bin(BinOp::Add, v1.clone(), bin(BinOp::Mul, lit(2.0), pow));
    let cmp = MetricExpr::Binary(Box::new(Binary {
        op: BinOp::Gt,
        lhs: sum,
        rhs: lit(4.0),
        return_bool: true,
        matching: None,
    }));
    let want = bin(BinOp::Or, bin(BinOp::And, cmp, v1), MetricExpr::VectorOf(0.0));
    assert_eq!(got, want);

    // Left-associative at one level; parentheses are kept.
    assert_eq!(
        metric("1 - 2 - 3"),
        bin(BinOp::Sub, bin(BinOp::Sub, lit(1.0), lit(2.0)), lit(3.0))
    );
    assert_eq!(
        metric("1 / (2 % 3)"),
        bin(
            BinOp::Div,
            lit(1.0),
            MetricExpr::Paren(Box::new(bin(BinOp::Mod, lit(2.0), lit(3.0))))
        )
    );
    // Unary minus only on numbers, and a binary minus before it.
    assert_eq!(metric("1 --2"), bin(BinOp::Sub, lit(1.0), lit(-2.0)));
    assert_eq!(
        metric("vector(1)+vector(1)"),
        bin(BinOp::Add, MetricExpr::VectorOf(1.0), MetricExpr::VectorOf(1.0))
    );
}

#[test]
fn vector_matching() {
    let got = metric(r#"sum by (a) (rate({x="y"}[1m])) / ignoring(b, c) group_left(d) sum by (a) (rate({x="z"}[1m]))"#);
    let MetricExpr::Binary(b) = got else { panic!("{got:?}") };
    assert_eq!(b.op, BinOp::Div);
    assert_eq!(
        b.matching,
        Some(VectorMatching {
            on: false,
            labels: vec!["b".into(), "c".into()],
            group: Some(GroupSide {
                left: true,
                labels: vec!["d".into()]
            })
        })
    );
    let got = metric(r#"rate({x="y"}[1m]) > bool on() group_right rate({x="z"}[1m])"#);
    let MetricExpr::Binary(b) = got else { panic!("{got:?}") };
    assert!(b.return_bool);
    assert_eq!(
        b.matching,
        Some(VectorMatching {
            on: true,
            labels: vec![],
            group: Some(GroupSide {
                left: false,
                labels: vec![]
            })
        })
    );
}

#[test]
fn line_filters_with_or_backticks_and_ip() {
    let got = log(r#"{app="x", env=~"a|b"} |= `a` or `b` != "c" |~ `(?i)d` or "(?i)e" |= ip(`10.0.0.0/8`) !> "<_> x""#);
    assert_eq!(
        got.selector,
        vec![m("app", MatchOp::Eq, "x"), m("env", MatchOp::Re, "a|b")]
    );
    let lf = |op, values: Vec<LineValue>| Stage::Line(LineFilter { op, values });
    let st = |v: &str| LineValue::Str(v.into());
    assert_eq!(
        got.stages,
        vec![
            lf(LineOp::Contains, vec![st("a"), st("b")]),
            lf(LineOp::NotContains, vec![st("c")]),
            lf(LineOp::Re, vec![st("(?i)d"), st("(?i)e")]),
            lf(LineOp::Contains, vec![LineValue::Ip("10.0.0.0/8".into())]),
            lf(LineOp::NotPattern, vec![st("<_> x")]),
        ]
    );
}

#[test]
fn strings_escapes_and_unicode() {
    let got = log(r#"{a="q\"uote\\d \u00e9\t", b=`raw \n ü`} |= "ü\x41""#);
    assert_eq!(
        got.selector,
        vec![m("a", MatchOp::Eq, "q\"uote\\d é\t"), m("b", MatchOp::Eq, "raw \\n ü")]
    );
    assert_eq!(
        got.stages,
        vec![Stage::Line(LineFilter {
            op: LineOp::Contains,
            values: vec![LineValue::Str("üA".into())]
        })]
    );
    assert_eq!(log("{}").selector, vec![]);
}

#[test]
fn log_volume_query() {
    let got = metric(r#"sum by(level, detected_level) (count_over_time({a="b"} | drop __error__[1m]))"#);
    let want = MetricExpr::Vector(VectorAgg {
        op: VectorOp::Sum,
        grouping: Some(Grouping {
            without: false,
            labels: vec!["level".into(), "detected_level".into()],
        }),
        param: None,
        inner: Box::new(MetricExpr::Range(RangeAgg {
            op: RangeOp::CountOverTime,
            param: None,
            log: LogExpr {
                selector: vec![m("a", MatchOp::Eq, "b")],
                stages: vec![Stage::Drop(vec![NamedMatcher {
                    name: "__error__".into(),
                    matcher: None,
                }])],
            },
            range_ns: MINUTE,
            offset_ns: 0,
            grouping: None,
        })),
    });
    assert_eq!(got, want);
    // Grouping after the parentheses is the same tree.
    assert_eq!(
        metric(r#"sum(count_over_time({a="b"} | drop __error__[1m])) by (level, detected_level)"#),
        want
    );
}

#[test]
fn unwrap_with_grouping_after_the_call() {
    let got = metric(r#"avg_over_time({a="b"} | logfmt | unwrap duration(d) | __error__="" [5m] offset 1h30m) by (a)"#);
    let want = MetricExpr::Range(RangeAgg {
        op: RangeOp::AvgOverTime,
        param: None,
        log: LogExpr {
            selector: vec![m("a", MatchOp::Eq, "b")],
            stages: vec![
                Stage::Logfmt {
                    strict: false,
                    keep_empty: false,
                    params: vec![],
                },
                Stage::Unwrap(Unwrap {
                    label: "d".into(),
                    conv: UnwrapConv::Duration,
                }),
                Stage::LabelFilter(s("__error__", "")),
            ],
        },
        range_ns: 5 * MINUTE,
        offset_ns: 90 * MINUTE,
        grouping: Some(Grouping {
            without: false,
            labels: vec!["a".into()],
        }),
    });
    assert_eq!(got, want);
}

#[test]
fn range_in_the_places_loki_allows() {
    let base = || LogExpr {
        selector: vec![m("a", MatchOp::Eq, "b")],
        stages: vec![Stage::Json(vec![])],
    };
    for q in [
        r#"count_over_time({a="b"} | json [5m])"#,
        r#"count_over_time({a="b"} | json[5m])"#,
        r#"count_over_time({a="b"}[5m] | json)"#,
        r#"count_over_time(({a="b"} | json)[5m])"#,
        r#"count_over_time(({a="b"} | json [5m]))"#,
        r#"count_over_time((({a="b"}[5m] | json)))"#,
    ] {
        let MetricExpr::Range(r) = metric(q) else { panic!("{q}") };
        assert_eq!((r.log, r.range_ns), (base(), 5 * MINUTE), "{q}");
    }
    let MetricExpr::Range(r) =
        metric(r#"quantile_over_time(0.99, {a="b"}[1h] offset -5m | unwrap bytes(size)) by (x)"#)
    else {
        panic!()
    };
    assert_eq!(
        (r.param, r.range_ns, r.offset_ns),
        (Some(0.99), 60 * MINUTE, -5 * MINUTE)
    );
    assert_eq!(
        r.log.stages,
        vec![Stage::Unwrap(Unwrap {
            label: "size".into(),
            conv: UnwrapConv::Bytes
        })]
    );
}

#[test]
fn durations() {
    for (text, ns) in [
        ("250ms", 250_000_000),
        ("1h30m", 90 * MINUTE),
        ("1.5s", 1_500_000_000),
        ("1d", 24 * 60 * MINUTE),
        ("1w", 7 * 24 * 60 * MINUTE),
        ("1y", 365 * 24 * 60 * MINUTE),
        ("5µs", 5_000),
        ("5us", 5_000),
        ("7ns", 7),
        ("1y2w3d4h5m6s7ms8us9ns", 0),
    ] {
        let MetricExpr::Range(r) = metric(&format!(r#"rate({{a="b"}}[{text}])"#)) else {
            panic!()
        };
        if ns != 0 {
            assert_eq!(r.range_ns, ns, "{text}");
        }
    }
}

#[test]
fn label_filters_and_or_comma_parens() {
    let got = log(r#"{a="b"} | x="1" and y="2" or z="3", w="4" | (p="5" or q="6") , r!="7""#);
    assert_eq!(
        got.stages,
        vec![
            Stage::LabelFilter(or(and(s("x", "1"), s("y", "2")), and(s("z", "3"), s("w", "4")))),
            Stage::LabelFilter(and(
                or(s("p", "5"), s("q", "6")),
                LabelFilter::Str {
                    name: "r".into(),
                    op: MatchOp::Ne,
                    value: "7".into()
                }
            )),
        ]
    );
    let got = log(
        r#"{a="b"} | status >= 400 | latency > 250ms | size <= 20MB | n == -1.5 | d = -5s | k = 1KiB | ip != ip("10.0.0.0/8") | re =~ `a.*`"#,
    );
    let f = |stage: &Stage| match stage {
        Stage::LabelFilter(f) => f.clone(),
        other => panic!("{other:?}"),
    };
    let filters: Vec<LabelFilter> = got.stages.iter().map(f).collect();
    assert_eq!(
        filters,
        vec![
            LabelFilter::Number {
                name: "status".into(),
                op: CmpOp::Ge,
                value: 400.0
            },
            LabelFilter::Duration {
                name: "latency".into(),
                op: CmpOp::Gt,
                seconds: 0.25
            },
            LabelFilter::Bytes {
                name: "size".into(),
                op: CmpOp::Le,
                bytes: 20e6
            },
            LabelFilter::Number {
                name: "n".into(),
                op: CmpOp::Eq,
                value: -1.5
            },
            LabelFilter::Duration {
                name: "d".into(),
                op: CmpOp::Eq,
                seconds: -5.0
            },
            LabelFilter::Bytes {
                name: "k".into(),
                op: CmpOp::Eq,
                bytes: 1024.0
            },
            LabelFilter::Ip {
                name: "ip".into(),
                eq: false,
                cidr: "10.0.0.0/8".into()
            },
            LabelFilter::Str {
                name: "re".into(),
                op: MatchOp::Re,
                value: "a.*".into()
            },
        ]
    );
}

#[test]
fn parsers_and_formatting_stages() {
    let got = log(
        r#"{a="b"} | json | json a, b="x.y" | logfmt --strict --keep-empty c, d="e" | regexp `(?P<x>\w+)` | pattern "<_> <y>" | unpack | line_format "{{.x}}" | label_format new=old, t="{{.y}}" | decolorize | drop a, b="v" | keep c, d=~"w""#,
    );
    let p = |label: &str, expr: Option<&str>| ParserParam {
        label: label.into(),
        expr: expr.map(Into::into),
    };
    assert_eq!(
        got.stages,
        vec![
            Stage::Json(vec![]),
            Stage::Json(vec![p("a", None), p("b", Some("x.y"))]),
            Stage::Logfmt {
                strict: true,
                keep_empty: true,
                params: vec![p("c", None), p("d", Some("e"))]
            },
            Stage::Regexp(r"(?P<x>\w+)".into()),
            Stage::Pattern("<_> <y>".into()),
            Stage::Unpack,
            Stage::LineFormat("{{.x}}".into()),
            Stage::LabelFormat(vec![
                LabelFmt {
                    dst: "new".into(),
                    value: LabelFmtValue::Rename("old".into())
                },
                LabelFmt {
                    dst: "t".into(),
                    value: LabelFmtValue::Template("{{.y}}".into())
                },
            ]),
            Stage::Decolorize,
            Stage::Drop(vec![
                NamedMatcher {
                    name: "a".into(),
                    matcher: None
                },
                NamedMatcher {
                    name: "b".into(),
                    matcher: Some((MatchOp::Eq, "v".into()))
                },
            ]),
            Stage::Keep(vec![
                NamedMatcher {
                    name: "c".into(),
                    matcher: None
                },
                NamedMatcher {
                    name: "d".into(),
                    matcher: Some((MatchOp::Re, "w".into()))
                },
            ]),
        ]
    );
}

#[test]
fn aggregations_params_and_label_replace() {
    let got = metric(r#"topk by(a) (5, sum(rate({x="y"}[1m])) without (b))"#);
    let MetricExpr::Vector(v) = got else { panic!("{got:?}") };
    assert_eq!((v.op, v.param), (VectorOp::Topk, Some(5.0)));
    assert_eq!(
        v.grouping,
        Some(Grouping {
            without: false,
            labels: vec!["a".into()]
        })
    );
    let MetricExpr::Vector(inner) = *v.inner else { panic!() };
    assert_eq!(
        inner.grouping,
        Some(Grouping {
            without: true,
            labels: vec!["b".into()]
        })
    );

    let got = metric(r#"label_replace(rate({x="y"}[1m]), "dst", "$1", "src", "(.*)")"#);
    let MetricExpr::LabelReplace(lr) = got else {
        panic!("{got:?}")
    };
    assert_eq!(
        (
            lr.dst.as_str(),
            lr.replacement.as_str(),
            lr.src.as_str(),
            lr.regex.as_str()
        ),
        ("dst", "$1", "src", "(.*)")
    );
    // Keywords are case-insensitive, as in Loki.
    assert!(matches!(
        metric(r#"SUM BY (a) (Count_Over_Time({x="y"}[1m]))"#),
        MetricExpr::Vector(_)
    ));
}

#[track_caller]
fn assert_err(query: &str, line: usize, col: usize, reason: &str) {
    let e = err(query);
    assert_eq!((e.line, e.col, e.reason.as_str()), (line, col, reason), "{query:?}");
}

#[test]
fn errors_name_what_was_expected_and_where() {
    assert_err(r#"{a="b",}"#, 1, 8, r#"unexpected "}", expected a label matcher"#);
    assert_err(r#"{a="b""#, 1, 7, r#"unexpected end of query, expected "," or "}""#);
    assert_err(r#"{a="b"} |= "abc"#, 1, 12, "unterminated string");
    assert_err(r#"{a="b\q"}"#, 1, 6, r"unknown escape \q");
    assert_err(r#"rate({a="b"}[5x])"#, 1, 14, r#"invalid duration "5x""#);
    assert_err(
        r#"count_over_time({a="b"})"#,
        1,
        24,
        r#"unexpected ")", expected a pipeline stage or a range like [5m]"#,
    );
    assert_err("", 1, 1, "empty query");
    assert_err("  # only a comment", 1, 1, "empty query");
    assert_err(
        "{a=\"b\"}\n  | unknownstage",
        2,
        17,
        r#"unexpected end of query, expected a comparison: = != =~ !~ == > >= < <="#,
    );
    assert_err(
        r#"{a="b"} | json | x > 5x"#,
        1,
        22,
        r#"invalid value "5x": expected a number, a duration like 250ms or a byte size like 20MB"#,
    );
    assert_err(
        r#"{a="b"} + 1"#,
        1,
        1,
        r#"a log query cannot be an operand of "+": make it a metric query with a range aggregation such as count_over_time(... [5m])"#,
    );
    assert_err(
        r#"sum({a="b"})"#,
        1,
        5,
        "sum needs a metric query, not a log query: make it one with a range aggregation such as count_over_time(... [5m])",
    );
    assert_err(
        r#"{a="b"} | unwrap x"#,
        1,
        11,
        "unwrap is only allowed inside a range aggregation, such as sum_over_time({...} | unwrap label [5m])",
    );
    assert_err(
        r#"rate({a="b"} | unwrap x | json [1m])"#,
        1,
        27,
        "only label filters may follow unwrap",
    );
    assert_err(
        r#"count_over_time({a="b"}[1m]) by (x)"#,
        1,
        1,
        "grouping (by or without) is not allowed for count_over_time",
    );
    assert_err(
        r#"sum_over_time({a="b"}[1m])"#,
        1,
        1,
        "sum_over_time needs an unwrap stage: sum_over_time({...} | unwrap label [5m])",
    );
    assert_err(
        r#"topk(rate({a="b"}[1m]))"#,
        1,
        1,
        "topk needs a parameter: topk(5, ...)",
    );
    assert_err(
        r#"sum(5, rate({a="b"}[1m]))"#,
        1,
        1,
        "sum takes no parameter, but was given 5",
    );
    assert_err(
        r#"rate({a="b"}[1m]) and 1"#,
        1,
        19,
        r#""and" is a set operation and needs vectors on both sides, not a number"#,
    );
    assert_err(r#"rate({a="b"}[0s])"#, 1, 14, "a range must be longer than zero");
    assert_err("é {", 1, 1, r#"unexpected character "é""#);
    assert_err(
        "1 +\n\t\"x\"",
        2,
        2,
        r#"unexpected string "x", expected a stream selector, an aggregation or a number"#,
    );
    let e = err(r#"{a="b"} | logfmt --loose"#);
    assert_eq!(
        e.to_string(),
        r#"parse error at line 1, col 18: unknown logfmt flag "--loose": expected --strict or --keep-empty"#
    );
    assert_eq!(e.pos, 17);
}

#[test]
fn limits() {
    let long = format!(r#"{{a="{}"}}"#, "x".repeat(MAX_QUERY_BYTES));
    assert_eq!(
        err(&long).reason,
        format!(
            "query is too long: {} bytes, at most {MAX_QUERY_BYTES} are accepted",
            long.len()
        )
    );

    // Far too deep: refused, not a stack overflow.
    assert!(err(&"(".repeat(100_000)).reason.starts_with("query is too long"));
    let deep = [
        "(".repeat(60_000),
        "sum(".repeat(16_000),
        "label_replace(".repeat(4_000),
        format!("count_over_time({}", "(".repeat(60_000)),
    ];
    for q in deep {
        let e = err(&q);
        assert!(e.reason.starts_with("query is nested too deeply"), "{}: {e}", &q[..20]);
    }
    let deep = format!(r#"{{a="b"}} | {}x="1"{}"#, "(".repeat(30_000), ")".repeat(30_000));
    assert!(err(&deep).reason.starts_with("query is nested too deeply"));
    // Long chains of operators are read without recursion, but the tree
    // they make is only so tall.
    for op in [" ^ 1", " + 1"] {
        let chain = format!("1{}", op.repeat(MAX_HEIGHT));
        assert!(matches!(metric(&chain), MetricExpr::Binary(_)));
        let chain = format!("1{}", op.repeat(16_000));
        assert!(err(&chain).reason.starts_with("query is too complex"));
    }
    let chain = format!(r#"{{a="b"}} | x="1"{}"#, r#" and y="2""#.repeat(MAX_HEIGHT));
    assert!(matches!(log(&chain).stages[..], [Stage::LabelFilter(_)]));
    let chain = format!(r#"{{a="b"}} | x="1"{}"#, r#", y="2" or z="3""#.repeat(4_000));
    assert!(err(&chain).reason.starts_with("query is too complex"));
    let e = err(
        &format!("{}vector(1){}", "(".repeat(MAX_DEPTH), " + 1)".repeat(MAX_DEPTH)).replace("+ 1)", "+ 1 + 1 + 1 + 1)"),
    );
    assert!(e.reason.starts_with("query is too complex"), "{e}");

    // Exactly at the limit is fine.
    let at_limit = format!("{}vector(1){}", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
    assert!(matches!(metric(&at_limit), MetricExpr::Paren(_)));
    let over = format!("{}vector(1){}", "(".repeat(MAX_DEPTH + 1), ")".repeat(MAX_DEPTH + 1));
    assert!(err(&over).reason.starts_with("query is nested too deeply"));
    let aggs = format!(
        r#"{}count_over_time({{a="b"}}[1m]){}"#,
        "sum(".repeat(MAX_DEPTH - 1),
        ")".repeat(MAX_DEPTH - 1)
    );
    assert!(matches!(metric(&aggs), MetricExpr::Vector(_)));
}

/// The deepest queries accepted, of every kind of nesting, fit in half a
/// runtime worker's stack (2 MiB), in a debug build too.
#[test]
fn deepest_queries_fit_a_small_stack() {
    let d = MAX_DEPTH;
    let queries = [
        format!("{}vector(1){}", "(".repeat(d), ")".repeat(d)),
        format!("{}vector(1){}", "sum(".repeat(d), ")".repeat(d)),
        format!(
            r#"{}rate({{a="b"}}[1m]){}"#,
            "label_replace(".repeat(d - 1),
            r#", "a", "b", "c", "d")"#.repeat(d - 1)
        ),
        format!(
            r#"count_over_time({}{{a="b"}}[1m]{})"#,
            "(".repeat(d - 1),
            ")".repeat(d - 1)
        ),
        format!(r#"{{a="b"}} | {}x="1"{}"#, "(".repeat(d), ")".repeat(d)),
        format!(
            r#"{}sum(count_over_time({{a="b"}} | {}x="1"{} [1m])){}"#,
            "(".repeat(d / 2 - 2),
            "(".repeat(d / 2),
            ")".repeat(d / 2),
            ")".repeat(d / 2 - 2)
        ),
    ];
    let parsed = std::thread::Builder::new()
        .stack_size(1024 * 1024)
        .spawn(move || {
            queries
                .iter()
                .map(|q| parse(q).map(|_| ()).map_err(|e| format!("{q}: {e}")))
                .collect::<Vec<_>>()
        })
        .expect("spawns")
        .join()
        .expect("no stack overflow");
    for result in parsed {
        assert_eq!(result, Ok(()));
    }
}

/// The lines of a corpus file: no blank lines, no `#` comment lines.
fn corpus(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(n, l)| (n + 1, l.trim_end_matches('\r')))
        .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'))
}

/// The corpus also checked against Grafana's grammar
/// (`tests/grammar/check.mjs`, run by `tests/e2e/test_grammars.py`).
#[test]
fn corpus_agrees_with_grafanas_grammar() {
    let valid = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/logql-valid.txt"
    ));
    let invalid = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/logql-invalid.txt"
    ));
    let mut failures = Vec::new();
    let (mut n_valid, mut n_invalid) = (0, 0);
    for (n, q) in corpus(valid) {
        n_valid += 1;
        if let Err(e) = parse(q) {
            failures.push(format!("logql-valid.txt:{n}: refused: {q}\n    {e}"));
        }
    }
    for (n, q) in corpus(invalid) {
        n_invalid += 1;
        if let Ok(e) = parse(q) {
            failures.push(format!("logql-invalid.txt:{n}: accepted: {q}\n    {e:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        n_valid >= 230 && n_invalid >= 60,
        "corpus too small: {n_valid} valid, {n_invalid} invalid"
    );
}
