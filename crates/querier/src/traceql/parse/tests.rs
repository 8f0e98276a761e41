use super::*;
use crate::traceql::ast::*;

fn ok(q: &str) -> Query {
    match parse(q) {
        Ok(query) => query,
        Err(e) => panic!("{q:?}: {e}"),
    }
}

fn err(q: &str) -> ParseError {
    match parse(q) {
        Ok(query) => panic!("{q:?} parsed: {query:?}"),
        Err(e) => e,
    }
}

/// The expression of a query without hints.
fn expr(q: &str) -> SpansetExpr {
    let query = ok(q);
    assert!(query.hints.is_empty(), "{q:?}");
    query.expr
}

/// The condition of a query that is one spanset filter.
fn cond(q: &str) -> FieldExpr {
    match expr(q) {
        SpansetExpr::Filter(f) => f,
        other => panic!("{q:?} is not one filter: {other:?}"),
    }
}

fn attr(scope: Scope, name: &str) -> FieldExpr {
    FieldExpr::Attr(Attribute::named(scope, name))
}

fn dot(name: &str) -> FieldExpr {
    attr(Scope::Unscoped, name)
}

fn intrinsic(i: Intrinsic) -> FieldExpr {
    FieldExpr::Attr(Attribute::Intrinsic(i))
}

fn int(n: i64) -> FieldExpr {
    FieldExpr::Static(Static::Int(n))
}

fn s(v: &str) -> FieldExpr {
    FieldExpr::Static(Static::Str(v.to_string()))
}

fn bin(op: BinOp, lhs: FieldExpr, rhs: FieldExpr) -> FieldExpr {
    FieldExpr::Binary {
        op,
        lhs: Box::new(lhs),
        rhs: Box::new(rhs),
    }
}

fn eq(lhs: FieldExpr, rhs: FieldExpr) -> FieldExpr {
    bin(BinOp::Cmp(CmpOp::Eq), lhs, rhs)
}

fn and(lhs: FieldExpr, rhs: FieldExpr) -> FieldExpr {
    bin(BinOp::And, lhs, rhs)
}

fn or(lhs: FieldExpr, rhs: FieldExpr) -> FieldExpr {
    bin(BinOp::Or, lhs, rhs)
}

fn filter(f: FieldExpr) -> SpansetExpr {
    SpansetExpr::Filter(f)
}

/// `{ .name = n }`
fn dot_is(name: &str, n: i64) -> SpansetExpr {
    filter(eq(dot(name), int(n)))
}

fn all() -> SpansetExpr {
    filter(FieldExpr::Static(Static::Bool(true)))
}

fn pipeline(input: SpansetExpr, stages: Vec<Stage>) -> SpansetExpr {
    SpansetExpr::Pipeline(Box::new(input), stages)
}

fn structural(op: StructOp, lhs: SpansetExpr, rhs: SpansetExpr) -> SpansetExpr {
    SpansetExpr::Structural {
        op,
        lhs: Box::new(lhs),
        rhs: Box::new(rhs),
    }
}

const MS: i64 = 1_000_000;
const SEC: i64 = 1_000_000_000;

#[test]
fn traceql_empty_filter_is_true() {
    assert_eq!(
        ok("{}"),
        Query {
            expr: all(),
            hints: vec![]
        }
    );
    assert_eq!(
        ok(" { } "),
        Query {
            expr: all(),
            hints: vec![]
        }
    );
}

#[test]
fn traceql_builder_default_output() {
    let q = r#"{resource.service.name="checkout" && name="POST /pay" && status=error && duration>100ms && span.http.status_code=500}"#;
    let want = and(
        and(
            and(
                and(
                    eq(attr(Scope::Resource, "service.name"), s("checkout")),
                    eq(intrinsic(Intrinsic::Name), s("POST /pay")),
                ),
                eq(
                    intrinsic(Intrinsic::Status),
                    FieldExpr::Static(Static::Status(Status::Error)),
                ),
            ),
            bin(
                BinOp::Cmp(CmpOp::Gt),
                intrinsic(Intrinsic::Duration),
                FieldExpr::Static(Static::Duration(100 * MS)),
            ),
        ),
        eq(attr(Scope::Span, "http.status_code"), int(500)),
    );
    assert_eq!(cond(q), want);
}

#[test]
fn traceql_multi_value_filter() {
    let q = r#"{(resource.service.name="a" || resource.service.name="b") && kind=server}"#;
    let svc = || attr(Scope::Resource, "service.name");
    assert_eq!(
        cond(q),
        and(
            or(eq(svc(), s("a")), eq(svc(), s("b"))),
            eq(
                intrinsic(Intrinsic::Kind),
                FieldExpr::Static(Static::Kind(Kind::Server))
            )
        )
    );
}

#[test]
fn traceql_regex_with_escaped_metacharacters() {
    // What Grafana sends for the values `api.example.com` and `web+1`.
    let q = r#"{resource.service.name=~"api\\.example\\.com|web\\+1"}"#;
    assert_eq!(
        cond(q),
        bin(
            BinOp::Re,
            attr(Scope::Resource, "service.name"),
            s(r"api\.example\.com|web\+1")
        )
    );
    assert_eq!(cond(r#"{ .a !~ "x" }"#), bin(BinOp::NotRe, dot("a"), s("x")));
}

#[test]
fn traceql_and_or_are_one_level_left_to_right() {
    // As in Tempo's grammar: `&&` does not bind tighter than `||`.
    assert_eq!(
        cond("{ .a = 1 || .b = 2 && .c = 3 }"),
        and(or(eq(dot("a"), int(1)), eq(dot("b"), int(2))), eq(dot("c"), int(3)))
    );
    assert_eq!(
        cond("{ .a = 1 && .b = 2 || .c = 3 }"),
        or(and(eq(dot("a"), int(1)), eq(dot("b"), int(2))), eq(dot("c"), int(3)))
    );
    assert_eq!(
        cond("{ .a = 1 && (.b = 2 || .c = 3) }"),
        and(eq(dot("a"), int(1)), or(eq(dot("b"), int(2)), eq(dot("c"), int(3))))
    );
}

#[test]
fn traceql_arithmetic_precedence() {
    let add = |l, r| bin(BinOp::Arith(ArithOp::Add), l, r);
    let mul = |l, r| bin(BinOp::Arith(ArithOp::Mul), l, r);
    let pow = |l, r| bin(BinOp::Arith(ArithOp::Pow), l, r);
    assert_eq!(
        cond("{ .a + .b * .c = 1 }"),
        eq(add(dot("a"), mul(dot("b"), dot("c"))), int(1))
    );
    assert_eq!(
        cond("{ .a * .b + .c = 1 }"),
        eq(add(mul(dot("a"), dot("b")), dot("c")), int(1))
    );
    // `^` is right-associative.
    assert_eq!(
        cond("{ .a ^ .b ^ .c = 1 }"),
        eq(pow(dot("a"), pow(dot("b"), dot("c"))), int(1))
    );
    // Prefix `-` binds like `+`, prefix `!` between `+` and `*`.
    let neg = |e| FieldExpr::Neg(Box::new(e));
    let not = |e| FieldExpr::Not(Box::new(e));
    assert_eq!(cond("{ -.a * 2 = 1 }"), eq(neg(mul(dot("a"), int(2))), int(1)));
    assert_eq!(cond("{ -.a + 2 = 1 }"), eq(add(neg(dot("a")), int(2)), int(1)));
    assert_eq!(cond("{ !.a = .b }"), eq(not(dot("a")), dot("b")));
    assert_eq!(cond("{ !.a * 2 = 1 }"), eq(not(mul(dot("a"), int(2))), int(1)));
    assert_eq!(cond("{ .a = !.b && .c }"), and(eq(dot("a"), not(dot("b"))), dot("c")));
    // Negative literals fold.
    assert_eq!(cond("{ .a = -1 }"), eq(dot("a"), int(-1)));
    assert_eq!(
        cond("{ .a = -1.5 }"),
        eq(dot("a"), FieldExpr::Static(Static::Float(-1.5)))
    );
    assert_eq!(
        cond("{ duration > -1s }").clone(),
        bin(
            BinOp::Cmp(CmpOp::Gt),
            intrinsic(Intrinsic::Duration),
            FieldExpr::Static(Static::Duration(-SEC))
        )
    );
    assert_eq!(cond("{ .a = -2 ^ 2 }"), eq(dot("a"), neg(pow(int(2), int(2)))));
}

#[test]
fn traceql_spanset_operators() {
    assert_eq!(
        expr("{ .a = 1 } && { .b = 2 }"),
        SpansetExpr::And(Box::new(dot_is("a", 1)), Box::new(dot_is("b", 2)))
    );
    assert_eq!(
        expr("{ .a = 1 } || { .b = 2 }"),
        SpansetExpr::Or(Box::new(dot_is("a", 1)), Box::new(dot_is("b", 2)))
    );
    assert_eq!(
        expr("{ .a = 1 } >> { .b = 2 }"),
        structural(StructOp::Descendant, dot_is("a", 1), dot_is("b", 2))
    );
    // Structural operators bind tighter than `&&` and `||`, and are one
    // level among themselves.
    assert_eq!(
        expr("{ .a = 1 } && { .b = 2 } >> { .c = 3 }"),
        SpansetExpr::And(
            Box::new(dot_is("a", 1)),
            Box::new(structural(StructOp::Descendant, dot_is("b", 2), dot_is("c", 3)))
        )
    );
    assert_eq!(
        expr("{ .a = 1 } ~ { .b = 2 } >> { .c = 3 }"),
        structural(
            StructOp::Descendant,
            structural(StructOp::Sibling, dot_is("a", 1), dot_is("b", 2)),
            dot_is("c", 3)
        )
    );
    let ops = [
        (">", StructOp::Child),
        ("<", StructOp::Parent),
        (">>", StructOp::Descendant),
        ("<<", StructOp::Ancestor),
        ("~", StructOp::Sibling),
        ("!>", StructOp::NotChild),
        ("!<", StructOp::NotParent),
        ("!>>", StructOp::NotDescendant),
        ("!<<", StructOp::NotAncestor),
        ("!~", StructOp::NotSibling),
        ("&>", StructOp::UnionChild),
        ("&<", StructOp::UnionParent),
        ("&>>", StructOp::UnionDescendant),
        ("&<<", StructOp::UnionAncestor),
        ("&~", StructOp::UnionSibling),
    ];
    for (text, op) in ops {
        assert_eq!(
            expr(&format!("{{.a=1}}{text}{{.b=2}}")),
            structural(op, dot_is("a", 1), dot_is("b", 2)),
            "{text}"
        );
    }
}

#[test]
fn traceql_pipelines_and_scalar_filters() {
    let count_gt = |n| Stage::Scalar {
        lhs: ScalarExpr::Aggregate(Aggregate::Count),
        op: CmpOp::Gt,
        rhs: ScalarExpr::Static(Static::Int(n)),
    };
    assert_eq!(
        expr("{ .a = 1 } | count() > 2"),
        pipeline(dot_is("a", 1), vec![count_gt(2)])
    );
    assert_eq!(
        expr("{ .a = 1 } | avg(duration) > 1s"),
        pipeline(
            dot_is("a", 1),
            vec![Stage::Scalar {
                lhs: ScalarExpr::Aggregate(Aggregate::Avg(intrinsic(Intrinsic::Duration))),
                op: CmpOp::Gt,
                rhs: ScalarExpr::Static(Static::Duration(SEC)),
            }]
        )
    );
    assert_eq!(
        expr("{ .a = 1 } | select(span.a, resource.b)"),
        pipeline(
            dot_is("a", 1),
            vec![Stage::Select(vec![
                Attribute::named(Scope::Span, "a"),
                Attribute::named(Scope::Resource, "b")
            ])]
        )
    );
    // A pipeline that starts with a stage works on every span.
    assert_eq!(expr("count() > 2"), pipeline(all(), vec![count_gt(2)]));
    assert_eq!(
        expr("by(.b) | count() > 2 | coalesce()"),
        pipeline(all(), vec![Stage::By(dot("b")), count_gt(2), Stage::Coalesce])
    );
    // `|` binds loosest: the stage is `{b} && {c}`.
    assert_eq!(
        expr("{ .a = 1 } | { .b = 2 } && { .c = 3 }"),
        pipeline(
            dot_is("a", 1),
            vec![Stage::Filter(SpansetExpr::And(
                Box::new(dot_is("b", 2)),
                Box::new(dot_is("c", 3))
            ))]
        )
    );
    assert_eq!(
        expr("({ .a = 1 } | count() > 2) && ({ .b = 2 })"),
        SpansetExpr::And(
            Box::new(pipeline(dot_is("a", 1), vec![count_gt(2)])),
            Box::new(dot_is("b", 2))
        )
    );
    // Scalar arithmetic: `*` before `+`, unary minus on numbers.
    let Stage::Scalar { lhs, rhs, .. } = &stage("{} | max(duration) - min(duration) > 2 * -1s") else {
        panic!("not a scalar filter")
    };
    assert_eq!(
        *lhs,
        ScalarExpr::Binary {
            op: ArithOp::Sub,
            lhs: Box::new(ScalarExpr::Aggregate(Aggregate::Max(intrinsic(Intrinsic::Duration)))),
            rhs: Box::new(ScalarExpr::Aggregate(Aggregate::Min(intrinsic(Intrinsic::Duration)))),
        }
    );
    assert_eq!(
        *rhs,
        ScalarExpr::Binary {
            op: ArithOp::Mul,
            lhs: Box::new(ScalarExpr::Static(Static::Int(2))),
            rhs: Box::new(ScalarExpr::Static(Static::Duration(-SEC))),
        }
    );
}

/// The only stage of `{} | stage`.
fn stage(q: &str) -> Stage {
    match expr(q) {
        SpansetExpr::Pipeline(_, mut stages) if stages.len() == 1 => stages.remove(0),
        other => panic!("{q:?}: {other:?}"),
    }
}

#[test]
fn traceql_metrics_are_parsed() {
    let q = ok(
        "{ status = error } | quantile_over_time(duration, .5, 0.9, 1) by (resource.service.name, span:name) | topk(5) > 1",
    );
    assert_eq!(
        q.metrics(),
        Some(&MetricsStage {
            func: MetricsFn::QuantileOverTime {
                attr: Attribute::Intrinsic(Intrinsic::Duration),
                quantiles: vec![0.5, 0.9, 1.0]
            },
            by: vec![
                Attribute::named(Scope::Resource, "service.name"),
                Attribute::Intrinsic(Intrinsic::Name)
            ],
            second: vec![
                SecondStage::TopK(5),
                SecondStage::Filter {
                    op: CmpOp::Gt,
                    value: ScalarExpr::Static(Static::Int(1))
                }
            ],
        })
    );
    assert_eq!(
        ok("{} | compare({status=error})").metrics().map(|m| &m.func),
        Some(&MetricsFn::Compare {
            filter: eq(
                intrinsic(Intrinsic::Status),
                FieldExpr::Static(Static::Status(Status::Error))
            ),
            topn: 10,
            start: 0,
            end: 0
        })
    );
    assert_eq!(ok("{} | rate()").metrics().map(|m| &m.func), Some(&MetricsFn::Rate));
    assert_eq!(ok("{} | count() > 1").metrics(), None);
    // Only at the end of the whole query.
    assert!(
        err("({} | rate()) > 1").reason.contains("last stage"),
        "{}",
        err("({} | rate()) > 1")
    );
    assert!(err("rate()").reason.contains("needs spans"));
    assert!(err("{} | rate() | {}").reason.contains("topk"));
    assert!(err("{} | topk(1)").reason.contains("metrics function"));
}

#[test]
fn traceql_hints() {
    let q = ok("{} | rate() with(most_recent=true, sample=0.1)");
    assert_eq!(
        q.hints,
        vec![
            Hint {
                name: "most_recent".into(),
                value: Static::Bool(true)
            },
            Hint {
                name: "sample".into(),
                value: Static::Float(0.1)
            },
        ]
    );
}

#[test]
fn traceql_intrinsics_and_scopes() {
    let cases = [
        ("name", Intrinsic::Name),
        ("span:name", Intrinsic::Name),
        ("status", Intrinsic::Status),
        ("span:status", Intrinsic::Status),
        ("statusMessage", Intrinsic::StatusMessage),
        ("span:statusMessage", Intrinsic::StatusMessage),
        ("duration", Intrinsic::Duration),
        ("span:duration", Intrinsic::Duration),
        ("kind", Intrinsic::Kind),
        ("span:kind", Intrinsic::Kind),
        ("span:id", Intrinsic::SpanId),
        ("span:parentID", Intrinsic::ParentId),
        ("span:childCount", Intrinsic::ChildCount),
        ("parent", Intrinsic::Parent),
        ("traceDuration", Intrinsic::TraceDuration),
        ("trace:duration", Intrinsic::TraceDuration),
        ("rootName", Intrinsic::RootName),
        ("trace:rootName", Intrinsic::RootName),
        ("rootServiceName", Intrinsic::RootServiceName),
        ("trace:rootService", Intrinsic::RootServiceName),
        ("trace:id", Intrinsic::TraceId),
        ("event:name", Intrinsic::EventName),
        ("event:timeSinceStart", Intrinsic::EventTimeSinceStart),
        ("link:spanID", Intrinsic::LinkSpanId),
        ("link:traceID", Intrinsic::LinkTraceId),
        ("instrumentation:name", Intrinsic::InstrumentationName),
        ("instrumentation:version", Intrinsic::InstrumentationVersion),
    ];
    for (text, i) in cases {
        assert_eq!(
            cond(&format!("{{ {text} != nil }}")),
            bin(BinOp::Cmp(CmpOp::Ne), intrinsic(i), FieldExpr::Static(Static::Nil))
        );
    }
    let named = |q: &str| match cond(q) {
        FieldExpr::Binary { lhs, .. } => *lhs,
        other => panic!("{other:?}"),
    };
    let n = |scope, parent, name: &str| {
        FieldExpr::Attr(Attribute::Named {
            scope,
            parent,
            name: name.into(),
        })
    };
    assert_eq!(named("{ .a.b = 1 }"), n(Scope::Unscoped, false, "a.b"));
    assert_eq!(
        named("{ span.http.status_code = 1 }"),
        n(Scope::Span, false, "http.status_code")
    );
    assert_eq!(
        named("{ resource.service.name = 1 }"),
        n(Scope::Resource, false, "service.name")
    );
    assert_eq!(
        named("{ event.exception.type = 1 }"),
        n(Scope::Event, false, "exception.type")
    );
    assert_eq!(named("{ link.x = 1 }"), n(Scope::Link, false, "x"));
    assert_eq!(
        named("{ instrumentation.x = 1 }"),
        n(Scope::Instrumentation, false, "x")
    );
    assert_eq!(named("{ parent.x = 1 }"), n(Scope::Unscoped, true, "x"));
    assert_eq!(named("{ parent.span.x = 1 }"), n(Scope::Span, true, "x"));
    assert_eq!(named("{ parent.resource.x = 1 }"), n(Scope::Resource, true, "x"));
    // Names run over Tempo's attribute characters; quoted parts hold any.
    assert_eq!(named("{ .name = 1 }"), n(Scope::Unscoped, false, "name"));
    assert_eq!(named("{ span.a-b/c:d = 1 }"), n(Scope::Span, false, "a-b/c:d"));
    assert_eq!(named("{ .a+1 = 1 }"), n(Scope::Unscoped, false, "a+1"));
    assert_eq!(named(r#"{ span."a b" = 1 }"#), n(Scope::Span, false, "a b"));
    assert_eq!(named(r#"{ ."a\"b\\c"d = 1 }"#), n(Scope::Unscoped, false, r#"a"b\cd"#));
    assert_eq!(named("{ resource.span.x = 1 }"), n(Scope::Resource, false, "span.x"));
    assert_eq!(named("{ span.spanner = 1 }"), n(Scope::Span, false, "spanner"));
}

#[test]
fn traceql_literals() {
    let value = |q: &str| match cond(q) {
        FieldExpr::Binary { rhs, .. } => match *rhs {
            FieldExpr::Static(s) => s,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(
        value(r#"{ .a = "x\ny\t\"\\z\u00e9\x41\101" }"#),
        Static::Str("x\ny\t\"\\z\u{e9}AA".into())
    );
    assert_eq!(value(r#"{ .a = `raw \n "x"` }"#), Static::Str(r#"raw \n "x""#.into()));
    assert_eq!(value("{ .a = `multi\nline` }"), Static::Str("multi\nline".into()));
    assert_eq!(value("{ .a = 42 }"), Static::Int(42));
    assert_eq!(value("{ .a = 1.25 }"), Static::Float(1.25));
    assert_eq!(value("{ .a = .5 }"), Static::Float(0.5));
    assert_eq!(value("{ .a = 1e3 }"), Static::Float(1000.0));
    assert_eq!(value("{ .a = maxInt }"), Static::Int(i64::MAX));
    assert_eq!(value("{ .a = minInt }"), Static::Int(i64::MIN));
    assert_eq!(value("{ .a = true }"), Static::Bool(true));
    assert_eq!(value("{ .a = nil }"), Static::Nil);
    assert_eq!(value("{ status = unset }"), Static::Status(Status::Unset));
    assert_eq!(value("{ kind = unspecified }"), Static::Kind(Kind::Unspecified));
    let durations = [
        ("1ns", 1),
        ("2us", 2_000),
        ("2µs", 2_000),
        ("3ms", 3 * MS),
        ("1.5s", 1_500 * MS),
        (".5s", 500 * MS),
        ("2m", 120 * SEC),
        ("1h", 3600 * SEC),
        ("1h30m", 5400 * SEC),
        ("1m30s500ms", 90 * SEC + 500 * MS),
        ("1d", 86_400 * SEC),
        ("1d12h", 129_600 * SEC),
        ("1w", 7 * 86_400 * SEC),
    ];
    for (text, ns) in durations {
        assert_eq!(
            value(&format!("{{ duration > {text} }}")),
            Static::Duration(ns),
            "{text}"
        );
    }
}

#[test]
fn traceql_whitespace_and_comments() {
    let want = cond("{ .a = 1 && .b = 2 }");
    assert_eq!(cond("{.a=1&&.b=2}"), want);
    assert_eq!(cond("{\n  .a = 1 // first\n  && .b = 2 /* second */\n}"), want);
    assert_eq!(cond("\t{ .a = 1\r\n&& .b = 2 }\n"), want);
}

#[test]
fn traceql_error_positions() {
    let e = err("{ .a = 1 ");
    assert_eq!((e.pos, e.line, e.col), (9, 1, 10));
    assert_eq!(e.reason, "expected an operator or `}`, found end of query");
    assert_eq!(
        e.to_string(),
        "parse error at line 1, col 10: expected an operator or `}`, found end of query"
    );

    let e = err("{ 2 <> 3}");
    assert_eq!(
        (e.pos, e.reason.as_str()),
        (5, "expected an operand (attribute or value), found `>`")
    );

    let e = err("{ .a = 1 }\n| count() >\n");
    assert_eq!((e.pos, e.line, e.col), (23, 3, 1));
    assert!(e.reason.starts_with("expected a number or an aggregate"), "{e}");

    let e = err("{ .a = 1 } | count()");
    assert!(e.reason.starts_with("expected a comparison"), "{e}");

    let e = err("wharblgarbl");
    assert_eq!(
        (e.pos, e.reason.as_str()),
        (0, "expected `{` or `(`, found `wharblgarbl`")
    );

    let e = err("{ foo = 1 }");
    assert_eq!(e.pos, 2);
    assert!(e.reason.starts_with("unknown identifier `foo`"), "{e}");

    let e = err("{ .a = 1 } { .b = 2 }");
    assert_eq!(
        (e.pos, e.reason.as_str()),
        (11, "expected an operator, `|`, `with` or end of query, found `{`")
    );

    let e = err(r#"{ .a = "x\qy" }"#);
    assert_eq!((e.pos, e.reason.as_str()), (9, r"invalid escape `\q` in string"));

    let e = err("{ .a = \"open }");
    assert_eq!((e.pos, e.reason.as_str()), (7, "unterminated string"));

    let e = err("{ span:nope = 1 }");
    assert_eq!((e.pos, e.reason.as_str()), (2, "unknown intrinsic `span:nope`"));

    let e = err("{ .a = 1 } | select(.a,)");
    assert_eq!((e.pos, e.reason.as_str()), (23, "expected an attribute, found `)`"));

    // Columns count characters, positions bytes.
    let e = err("{ .a = \"é\" x }");
    assert_eq!((e.pos, e.col), (12, 12));

    assert!(err("").reason.starts_with("expected `{`"));
    assert!(err("{ nil }").reason.contains("nil"));
    assert!(err("{ .a > nil }").reason.contains("nil"));
    assert!(err("{ !nil = .a }").reason.contains("nil"));
    assert!(err("1 > 2").reason.contains("aggregate"));
    assert!(err("coalesce()").reason.contains("cannot start"));
    assert!(err("{ nestedSetLeft > 1 }").reason.contains("not supported"));
    assert!(err("{ duration > 1hh }").reason.contains("invalid duration"));
    assert!(err("{ .a = 99999999999999999999 }").reason.contains("out of range"));
}

#[test]
fn traceql_limits() {
    // Too long: refused before lexing.
    let e = err(&"{(".repeat(100_000));
    assert_eq!(e.pos, 0);
    assert!(e.reason.contains("more than the limit"), "{e}");

    // Too deeply nested, each way there is to nest.
    for deep in [
        "(".repeat(30_000),
        format!("{{ {}", "(".repeat(30_000)),
        format!("{{ {}.a }}", "!".repeat(30_000)),
        format!("{{ .a = {}1 }}", "-".repeat(30_000)),
        format!("{{}} | {}count()", "(".repeat(30_000)),
        format!("{}{{}}", "({} && ".repeat(5_000)),
    ] {
        let e = err(&deep);
        assert!(e.reason.contains("nests deeper than 64"), "{e}");
    }
    let at_limit = format!("{}{{}}{}", "(".repeat(MAX_NESTING - 1), ")".repeat(MAX_NESTING - 1));
    assert_eq!(ok(&at_limit).expr, all());

    // Long operator chains make deep trees.
    for long in [
        format!("{{ 1{} }}", "+1".repeat(30_000)),
        format!("{{}}{}", "&&{}".repeat(10_000)),
        format!("count() > 1{}", "+1".repeat(30_000)),
    ] {
        let e = err(&long);
        assert!(e.reason.contains("operators deep"), "{e}");
    }
    // `.a = 1` is two levels, each `||` one more.
    ok(&format!("{{ .a = 1{} }}", " || .a = 1".repeat(MAX_TREE_DEPTH - 2)));
    let e = err(&format!("{{ .a = 1{} }}", " || .a = 1".repeat(MAX_TREE_DEPTH - 1)));
    assert!(e.reason.contains("operators deep"), "{e}");
}

#[test]
fn traceql_refused_though_grafana_grammar_accepts() {
    // Grafana's editor grammar is looser than Tempo's; Mira follows Tempo
    // (and refuses template variables, which Grafana replaces before it
    // sends a query).
    for (q, why) in [
        ("{ nil }", "nil"),
        ("{ .a > nil }", "nil"),
        ("{ .a = 1 } | max(nil) > 1", "nil"),
        ("{ .a ~ 1 }", "found `~`"),
        ("1 > 2", "aggregate"),
        ("{ .a = 1 } | 1 > 2", "aggregate"),
        ("count() > 1 && { .a = 1 }", "found `&&`"),
        ("{ .a = 1 } || count() > 1", "found `count`"),
        ("{} > count() > 1", "found `count`"),
        ("coalesce()", "cannot start"),
        ("rate()", "needs spans"),
        ("topk(10)", "metrics function"),
        ("{} | topk(10)", "metrics function"),
        ("{} | rate() | { .a = 1 }", "topk"),
        ("{} | rate() | count() > 1", "topk"),
        ("{} | rate() | topk(10) | rate()", "topk"),
        ("({} | rate())", "last stage"),
        ("{ resource . foo = 1 }", "attribute name after `.`"),
        ("{ . foo = 1 }", "attribute name after `.`"),
        ("{ .a = $var }", "`$`"),
        ("{} | by(.a, .b)", "found `,`"),
        ("{} | select(.a + 1)", "found `+`"),
        ("{} | rate() by (.a + 1)", "found `+`"),
        ("{ .a = \"multi\nline\" }", "newline in string"),
    ] {
        let e = err(q);
        assert!(e.reason.contains(why), "{q:?}: {e}");
    }
}

#[test]
fn traceql_mutated_corpus_never_panics() {
    // Every query of the corpus with one character dropped or one
    // troublesome character put in, at every position: an answer either
    // way, never a panic.
    let valid = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/traceql-valid.txt"
    ));
    let mut parsed = 0;
    for (_, q) in corpus(valid) {
        for (at, c) in q.char_indices() {
            let dropped = format!("{}{}", &q[..at], &q[at + c.len_utf8()..]);
            let _ = parse(&dropped);
            for extra in ['"', '\\', '(', '.', 'µ', '`'] {
                let _ = parse(&format!("{}{extra}{}", &q[..at], &q[at..]));
            }
            parsed += 7;
        }
    }
    assert!(parsed > 10_000);
}

/// The non-comment lines of a corpus file.
fn corpus(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(n, line)| (n + 1, line.strip_suffix('\r').unwrap_or(line)))
        .filter(|(_, line)| !line.trim().is_empty() && !line.starts_with('#'))
}

#[test]
fn traceql_corpus_agrees_with_grafana_grammar() {
    let valid = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/traceql-valid.txt"
    ));
    let invalid = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/traceql-invalid.txt"
    ));
    let mut failures = Vec::new();
    for (line, q) in corpus(valid) {
        if let Err(e) = parse(q) {
            failures.push(format!("traceql-valid.txt:{line}: refused {q:?}: {e}"));
        }
    }
    for (line, q) in corpus(invalid) {
        if let Ok(parsed) = parse(q) {
            failures.push(format!("traceql-invalid.txt:{line}: accepted {q:?} as {parsed:?}"));
        }
    }
    assert!(corpus(valid).count() >= 230 && corpus(invalid).count() >= 60);
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
