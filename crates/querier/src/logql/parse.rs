//! The LogQL parser, written with `winnow`: [`super::lex`] cuts the query
//! into tokens, and the functions here read the tokens into
//! [`super::ast`].
//!
//! It accepts what Grafana's own grammar (`@grafana/lezer-logql`) accepts,
//! and refuses at parse time what Loki's parser refuses after its grammar:
//! a parameter where the function takes none (or none where it needs
//! one), `by`/`without` on a range aggregation that does not group, a
//! missing or a forbidden `unwrap`, a log query as an operand of a binary
//! operation or an aggregation, a set operator with a number on one side,
//! an escape Go does not know. The corpus
//! `tests/fixtures/logql-{valid,invalid}.txt` is checked against both
//! parsers (`tests/grammar/check.mjs` for Grafana's).
//!
//! Binary operators bind as in PromQL (`^` right-associative, then
//! `* / %`, `+ -`, comparisons, `and unless`, `or`) and are read with an
//! explicit operator stack, so a long chain does not recurse. Only
//! parentheses and calls recurse, at most [`MAX_DEPTH`] deep; the tree is
//! at most [`MAX_HEIGHT`] tall; a query is at most [`MAX_QUERY_BYTES`]
//! long.

use winnow::combinator::separated;
use winnow::error::{ErrMode, ParserError};
use winnow::stream::{Stateful, Stream};
use winnow::token::one_of;
use winnow::{ModalResult, Parser};

use super::ast::{
    BinOp, Binary, CmpOp, Expr, GroupSide, Grouping, LabelFilter, LabelFmt, LabelFmtValue, LabelReplace, LineFilter,
    LineOp, LineValue, LogExpr, MatchOp, Matcher, MetricExpr, NamedMatcher, ParserParam, RangeAgg, RangeOp, Stage,
    Unwrap, UnwrapConv, VectorAgg, VectorMatching, VectorOp,
};
use super::lex::{self, Fail, Kind, P, Tok};

/// The longest query accepted, in bytes.
pub const MAX_QUERY_BYTES: usize = 64 * 1024;

/// How deeply parentheses, aggregations and calls may nest.
pub const MAX_DEPTH: usize = 64;

/// How tall a syntax tree may grow: every binary operation, `and`/`or`
/// of label filters, parenthesis and aggregation is one level (over
/// leaves of height zero). Chains of operators are read without
/// recursion, but whatever walks the tree afterwards (dropping it too)
/// recurses once per level.
pub const MAX_HEIGHT: usize = 256;

pub use crate::parse_error::ParseError;

/// Parses a LogQL query.
pub fn parse(query: &str) -> Result<Expr, ParseError> {
    if query.len() > MAX_QUERY_BYTES {
        let reason = format!(
            "query is too long: {} bytes, at most {MAX_QUERY_BYTES} are accepted",
            query.len()
        );
        return Err(ParseError::at(query, 0, reason));
    }
    let lexed = lex::lex(query).map_err(|f| ParseError::at(query, f.pos, f.reason))?;
    let mut input = In {
        input: &lexed.toks,
        state: State {
            depth: 0,
            strings: &lexed.strings,
            len: query.len(),
        },
    };
    top(&mut input).map_err(|e| {
        let f = e.into_inner().unwrap_or_else(|_| Fail {
            pos: query.len(),
            reason: "unexpected end of query".into(),
        });
        ParseError::at(query, f.pos, f.reason)
    })
}

#[derive(Debug)]
struct State<'a> {
    /// Parentheses and calls open around the current token.
    depth: usize,
    /// The decoded strings, by [`Kind::Str`] index.
    strings: &'a [String],
    /// The query's length (where the end is).
    len: usize,
}

/// The tokens not read yet; the last is always [`Kind::Eof`] and is never
/// consumed.
type In<'a> = Stateful<&'a [Tok<'a>], State<'a>>;

type PResult<T> = ModalResult<T, Fail>;

impl<'a> ParserError<In<'a>> for Fail {
    type Inner = Self;

    fn from_input(i: &In<'a>) -> Self {
        let t = peek(i);
        Self {
            pos: t.start,
            reason: format!("unexpected {}", describe(t)),
        }
    }

    fn into_inner(self) -> Result<Self, Self> {
        Ok(self)
    }
}

// ---------------------------------------------------------------------------
// Token helpers

fn peek<'a>(i: &In<'a>) -> Tok<'a> {
    nth(i, 0).unwrap_or(Tok {
        kind: Kind::Eof,
        text: "",
        start: i.state.len,
    })
}

fn nth<'a>(i: &In<'a>, n: usize) -> Option<Tok<'a>> {
    i.input.get(n).copied()
}

/// Consumes the next token (never the end).
fn bump<'a>(i: &mut In<'a>) -> Tok<'a> {
    let t = peek(i);
    if t.kind != Kind::Eof {
        i.next_token();
    }
    t
}

fn is_p(t: Option<Tok<'_>>, p: P) -> bool {
    t.is_some_and(|t| t.kind == Kind::P(p))
}

fn at(i: &In<'_>, p: P) -> bool {
    is_p(nth(i, 0), p)
}

fn is_kw(t: Option<Tok<'_>>, word: &str) -> bool {
    t.is_some_and(|t| t.kind == Kind::Ident && t.text.eq_ignore_ascii_case(word))
}

fn at_kw(i: &In<'_>, word: &str) -> bool {
    is_kw(nth(i, 0), word)
}

/// A token as error messages show it.
fn describe(t: Tok<'_>) -> String {
    const MAX: usize = 40;
    let text = match t.text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &t.text[..cut]),
        None => t.text.to_string(),
    };
    match t.kind {
        Kind::Eof => "end of query".into(),
        Kind::Str(_) => format!("string {text}"),
        _ => format!("\"{text}\""),
    }
}

/// `unexpected <next token>, expected <what>`, not to be backtracked.
fn unexpected(i: &In<'_>, what: &str) -> ErrMode<Fail> {
    let t = peek(i);
    Fail::at(t.start, format!("unexpected {}, expected {what}", describe(t)))
}

fn expect<'a>(i: &mut In<'a>, p: P, what: &str) -> PResult<Tok<'a>> {
    if at(i, p) {
        Ok(bump(i))
    } else {
        Err(unexpected(i, what))
    }
}

/// A token of kind `p`; backtracks otherwise (for winnow's combinators).
fn punct<'a>(p: P) -> impl Parser<In<'a>, Tok<'a>, ErrMode<Fail>> {
    one_of(move |t: Tok<'a>| t.kind == Kind::P(p))
}

fn ident<'a>(i: &mut In<'a>, what: &str) -> PResult<&'a str> {
    if peek(i).kind == Kind::Ident {
        Ok(bump(i).text)
    } else {
        Err(unexpected(i, what))
    }
}

fn string(i: &mut In<'_>, what: &str) -> PResult<String> {
    match peek(i).kind {
        Kind::Str(n) => {
            let value = i.state.strings.get(n as usize).cloned().unwrap_or_default();
            bump(i);
            Ok(value)
        }
        _ => Err(unexpected(i, what)),
    }
}

/// Runs `f` one level deeper, refusing to go past [`MAX_DEPTH`].
fn nested<'a, T>(i: &mut In<'a>, f: impl FnOnce(&mut In<'a>) -> PResult<T>) -> PResult<T> {
    if i.state.depth >= MAX_DEPTH {
        let reason =
            format!("query is nested too deeply: more than {MAX_DEPTH} levels of parentheses and aggregations");
        return Err(Fail::at(peek(i).start, reason));
    }
    i.state.depth += 1;
    let result = f(i);
    i.state.depth -= 1;
    result
}

/// The height of a node over subtrees of heights `a` and `b`, refused
/// past [`MAX_HEIGHT`] (at `pos`).
fn grow(pos: usize, a: usize, b: usize) -> PResult<usize> {
    let height = a.max(b) + 1;
    if height > MAX_HEIGHT {
        let reason = format!(
            "query is too complex: its syntax tree would be more than {MAX_HEIGHT} levels deep (each binary operator, and, or, parenthesis and aggregation is one level)"
        );
        return Err(Fail::at(pos, reason));
    }
    Ok(height)
}

// ---------------------------------------------------------------------------
// Numbers, durations, byte sizes

/// `12`, `1.5`, `.5`, `1e3`, `0x1f`.
fn parse_number(text: &str) -> Option<f64> {
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        return u64::from_str_radix(hex, 16).ok().map(|v| v as f64);
    }
    let plain = text
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
    if plain { text.parse().ok() } else { None }
}

/// `250ms`, `1h30m`, `1.5s`, `2d`, in nanoseconds: number-and-unit pairs
/// with `ns us µs ms s m h d w y` (a day is 24h, a week 7d, a year 365d).
fn parse_duration(text: &str) -> Option<i64> {
    let mut rest = text;
    let mut total: i128 = 0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_ns: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "w" => 7 * 86_400_000_000_000,
            "y" => 365 * 86_400_000_000_000,
            _ => return None,
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if int.is_empty() && frac.is_empty() {
            return None;
        }
        let int: i128 = if int.is_empty() { 0 } else { int.parse().ok()? };
        total = total.checked_add(int.checked_mul(unit_ns)?)?;
        if !frac.is_empty() {
            // Nanoseconds are the precision: 18 decimals are plenty.
            let frac = &frac[..frac.len().min(18)];
            let scale = 10_i128.checked_pow(u32::try_from(frac.len()).ok()?)?;
            total = total.checked_add(frac.parse::<i128>().ok()? * unit_ns / scale)?;
        }
        rest = next;
    }
    i64::try_from(total).ok()
}

/// `20MB`, `1.5KiB`, `5B` (the units Loki's lexer and Grafana's grammar
/// know), in bytes.
fn parse_bytes(text: &str) -> Option<f64> {
    let num_len = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = text.split_at(num_len);
    let scale: f64 = match unit {
        "B" => 1.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "PB" => 1e15,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "PiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let value: f64 = num.parse().ok()?;
    Some(value * scale)
}

/// An unsigned number token.
fn number(i: &mut In<'_>, what: &str) -> PResult<f64> {
    let t = peek(i);
    if t.kind != Kind::Num {
        return Err(unexpected(i, what));
    }
    let value = parse_number(t.text).ok_or_else(|| Fail::at(t.start, format!("invalid number \"{}\"", t.text)))?;
    bump(i);
    Ok(value)
}

/// `5`, `-5`, `+5`: a literal in a metric query.
fn signed_number(i: &mut In<'_>) -> PResult<f64> {
    let negative = match peek(i).kind {
        Kind::P(P::Sub) => {
            bump(i);
            true
        }
        Kind::P(P::Add) => {
            bump(i);
            false
        }
        _ => return number(i, "a number"),
    };
    let value = number(i, "a number (a sign only goes before a number)")?;
    Ok(if negative { -value } else { value })
}

/// `5m`, `-1h`: a duration in nanoseconds, and where it started.
fn duration(i: &mut In<'_>) -> PResult<(i64, usize)> {
    let start = peek(i).start;
    let negative = at(i, P::Sub);
    if negative {
        bump(i);
    }
    let t = peek(i);
    if t.kind != Kind::Num {
        return Err(unexpected(i, "a duration like 5m"));
    }
    let ns = parse_duration(t.text).ok_or_else(|| Fail::at(t.start, format!("invalid duration \"{}\"", t.text)))?;
    bump(i);
    Ok((if negative { -ns } else { ns }, start))
}

// ---------------------------------------------------------------------------
// Queries and binary operations

/// What an operand turned out to be.
enum Operand {
    /// A log query, where it starts, and whether it was parenthesized
    /// (then no stage may follow).
    Log(LogExpr, usize, bool),
    Metric(MetricExpr),
}

fn top(i: &mut In<'_>) -> PResult<Expr> {
    if peek(i).kind == Kind::Eof {
        return Err(Fail::at(0, "empty query"));
    }
    let (e, _) = expr(i)?;
    if peek(i).kind != Kind::Eof {
        let what = match e {
            Operand::Log(_, _, false) => "a pipeline stage or the end of the query",
            Operand::Log(_, _, true) => "the end of the query",
            Operand::Metric(_) => "a binary operator or the end of the query",
        };
        return Err(unexpected(i, what));
    }
    Ok(match e {
        Operand::Log(log, _, _) => Expr::Log(log),
        Operand::Metric(m) => Expr::Metric(m),
    })
}

/// A binary operator read, with its modifiers, before its right operand.
struct PendingOp {
    op: BinOp,
    pos: usize,
    return_bool: bool,
    matching: Option<VectorMatching>,
}

fn precedence(op: BinOp) -> u8 {
    match op {
        BinOp::Or => 1,
        BinOp::And | BinOp::Unless => 2,
        BinOp::Eq | BinOp::Ne | BinOp::Gt | BinOp::Ge | BinOp::Lt | BinOp::Le => 3,
        BinOp::Add | BinOp::Sub => 4,
        BinOp::Mul | BinOp::Div | BinOp::Mod => 5,
        BinOp::Pow => 6,
    }
}

/// Operands joined by binary operators (precedence climbing over two
/// stacks), and the height of the tree.
fn expr(i: &mut In<'_>) -> PResult<(Operand, usize)> {
    let mut operands = vec![operand(i)?];
    let mut ops: Vec<PendingOp> = Vec::new();
    while let Some(next) = bin_op(i)? {
        while let Some(top) = ops.last() {
            let (a, b) = (precedence(top.op), precedence(next.op));
            if a > b || (a == b && next.op != BinOp::Pow) {
                reduce(&mut operands, &mut ops)?;
            } else {
                break;
            }
        }
        ops.push(next);
        operands.push(operand(i)?);
    }
    while !ops.is_empty() {
        reduce(&mut operands, &mut ops)?;
    }
    operands
        .pop()
        .ok_or_else(|| Fail::at(peek(i).start, "expected an expression"))
}

fn reduce(operands: &mut Vec<(Operand, usize)>, ops: &mut Vec<PendingOp>) -> PResult<()> {
    let (Some(op), Some((rhs, rh)), Some((lhs, lh))) = (ops.pop(), operands.pop(), operands.pop()) else {
        return Err(Fail::at(0, "internal error: unbalanced binary operation"));
    };
    let height = grow(op.pos, lh, rh)?;
    let name = op.op.symbol();
    let mut legs = [lhs, rhs].into_iter().map(|leg| match leg {
        Operand::Metric(m) => Ok(m),
        Operand::Log(_, pos, _) => Err(Fail::at(
            pos,
            format!("a log query cannot be an operand of \"{name}\": make it a metric query with a range aggregation such as count_over_time(... [5m])"),
        )),
    });
    let (Some(lhs), Some(rhs)) = (legs.next(), legs.next()) else {
        return Err(Fail::at(op.pos, "internal error: missing operand"));
    };
    let (lhs, rhs) = (lhs?, rhs?);
    if matches!(op.op, BinOp::And | BinOp::Or | BinOp::Unless) && (is_literal(&lhs) || is_literal(&rhs)) {
        return Err(Fail::at(
            op.pos,
            format!("\"{name}\" is a set operation and needs vectors on both sides, not a number"),
        ));
    }
    let binary = Binary {
        op: op.op,
        lhs,
        rhs,
        return_bool: op.return_bool,
        matching: op.matching,
    };
    operands.push((Operand::Metric(MetricExpr::Binary(Box::new(binary))), height));
    Ok(())
}

/// A number, also in parentheses or computed from numbers only (Loki
/// folds those into one number).
fn is_literal(m: &MetricExpr) -> bool {
    match m {
        MetricExpr::Literal(_) => true,
        MetricExpr::Paren(inner) => is_literal(inner),
        MetricExpr::Binary(b) => is_literal(&b.lhs) && is_literal(&b.rhs),
        _ => false,
    }
}

/// `op [bool] [on|ignoring (labels) [group_left|group_right [(labels)]]]`
fn bin_op(i: &mut In<'_>) -> PResult<Option<PendingOp>> {
    let t = peek(i);
    let op = match t.kind {
        Kind::P(P::Add) => BinOp::Add,
        Kind::P(P::Sub) => BinOp::Sub,
        Kind::P(P::Mul) => BinOp::Mul,
        Kind::P(P::Div) => BinOp::Div,
        Kind::P(P::Mod) => BinOp::Mod,
        Kind::P(P::Pow) => BinOp::Pow,
        Kind::P(P::EqEq) => BinOp::Eq,
        Kind::P(P::Ne) => BinOp::Ne,
        Kind::P(P::Gt) => BinOp::Gt,
        Kind::P(P::Ge) => BinOp::Ge,
        Kind::P(P::Lt) => BinOp::Lt,
        Kind::P(P::Le) => BinOp::Le,
        Kind::Ident if t.text.eq_ignore_ascii_case("and") => BinOp::And,
        Kind::Ident if t.text.eq_ignore_ascii_case("or") => BinOp::Or,
        Kind::Ident if t.text.eq_ignore_ascii_case("unless") => BinOp::Unless,
        _ => return Ok(None),
    };
    bump(i);
    let return_bool = at_kw(i, "bool");
    if return_bool {
        bump(i);
    }
    let mut matching = None;
    if at_kw(i, "on") || at_kw(i, "ignoring") {
        let on = bump(i).text.eq_ignore_ascii_case("on");
        let labels = matching_labels(i)?;
        let mut group = None;
        if at_kw(i, "group_left") || at_kw(i, "group_right") {
            let left = bump(i).text.eq_ignore_ascii_case("group_left");
            let labels = if at(i, P::LParen) {
                matching_labels(i)?
            } else {
                Vec::new()
            };
            group = Some(GroupSide { left, labels });
        }
        matching = Some(VectorMatching { on, labels, group });
    }
    Ok(Some(PendingOp {
        op,
        pos: t.start,
        return_bool,
        matching,
    }))
}

/// `(a, b)` after `on`, `ignoring`, `group_left`, `group_right`: may be
/// empty, may end with a comma.
fn matching_labels(i: &mut In<'_>) -> PResult<Vec<String>> {
    expect(i, P::LParen, "\"(\" and label names")?;
    let mut labels = Vec::new();
    while !at(i, P::RParen) {
        labels.push(ident(i, "a label name or \")\"")?.to_string());
        if !at(i, P::RParen) {
            expect(i, P::Comma, "\",\" or \")\"")?;
        }
    }
    bump(i);
    Ok(labels)
}

/// `by (a, b)` / `without (a)`, if there.
fn grouping(i: &mut In<'_>) -> PResult<Option<Grouping>> {
    if !(at_kw(i, "by") || at_kw(i, "without")) {
        return Ok(None);
    }
    let without = bump(i).text.eq_ignore_ascii_case("without");
    expect(i, P::LParen, "\"(\" and label names")?;
    let mut labels = Vec::new();
    if !at(i, P::RParen) {
        labels = separated(
            1..,
            |i: &mut In<'_>| ident(i, "a label name").map(str::to_string),
            punct(P::Comma),
        )
        .parse_next(i)?;
    }
    expect(i, P::RParen, "\",\" or \")\"")?;
    Ok(Some(Grouping { without, labels }))
}

/// One operand (parentheses, a log query, a number or a call) and its
/// height.
fn operand(i: &mut In<'_>) -> PResult<(Operand, usize)> {
    const WHAT: &str = "a stream selector, an aggregation or a number";
    let t = peek(i);
    match t.kind {
        Kind::P(P::LParen) => nested(i, |i| {
            bump(i);
            let (inner, height) = expr(i)?;
            let height = grow(t.start, height, 0)?;
            let inner = match inner {
                Operand::Log(log, pos, parenthesized) => {
                    let what = if parenthesized {
                        "\")\""
                    } else {
                        "a pipeline stage or \")\""
                    };
                    expect(i, P::RParen, what)?;
                    Operand::Log(log, pos, true)
                }
                Operand::Metric(m) => {
                    expect(i, P::RParen, "a binary operator or \")\"")?;
                    Operand::Metric(MetricExpr::Paren(Box::new(m)))
                }
            };
            Ok((inner, height))
        }),
        Kind::P(P::LBrace) => {
            let selector = selector(i)?;
            let stages = stages(i, false)?;
            Ok((Operand::Log(LogExpr { selector, stages }, t.start, false), 0))
        }
        Kind::P(P::Add | P::Sub) | Kind::Num => Ok((Operand::Metric(MetricExpr::Literal(signed_number(i)?)), 0)),
        Kind::Ident => call(i).map(|(m, height)| (Operand::Metric(m), height)),
        _ => Err(unexpected(i, WHAT)),
    }
}

const RANGE_OPS: [(&str, RangeOp); 15] = [
    ("count_over_time", RangeOp::CountOverTime),
    ("rate", RangeOp::Rate),
    ("rate_counter", RangeOp::RateCounter),
    ("bytes_over_time", RangeOp::BytesOverTime),
    ("bytes_rate", RangeOp::BytesRate),
    ("absent_over_time", RangeOp::AbsentOverTime),
    ("sum_over_time", RangeOp::SumOverTime),
    ("avg_over_time", RangeOp::AvgOverTime),
    ("min_over_time", RangeOp::MinOverTime),
    ("max_over_time", RangeOp::MaxOverTime),
    ("stddev_over_time", RangeOp::StddevOverTime),
    ("stdvar_over_time", RangeOp::StdvarOverTime),
    ("quantile_over_time", RangeOp::QuantileOverTime),
    ("first_over_time", RangeOp::FirstOverTime),
    ("last_over_time", RangeOp::LastOverTime),
];

const VECTOR_OPS: [(&str, VectorOp); 12] = [
    ("sum", VectorOp::Sum),
    ("avg", VectorOp::Avg),
    ("min", VectorOp::Min),
    ("max", VectorOp::Max),
    ("count", VectorOp::Count),
    ("stddev", VectorOp::Stddev),
    ("stdvar", VectorOp::Stdvar),
    ("topk", VectorOp::Topk),
    ("bottomk", VectorOp::Bottomk),
    ("sort", VectorOp::Sort),
    ("sort_desc", VectorOp::SortDesc),
    ("approx_topk", VectorOp::ApproxTopk),
];

fn range_name(op: RangeOp) -> &'static str {
    RANGE_OPS.iter().find(|(_, o)| *o == op).map_or("?", |(n, _)| n)
}

fn vector_name(op: VectorOp) -> &'static str {
    VECTOR_OPS.iter().find(|(_, o)| *o == op).map_or("?", |(n, _)| n)
}

/// A function call (range and vector aggregations, `vector`,
/// `label_replace`) and its height. Names are matched
/// case-insensitively, as Loki does.
fn call(i: &mut In<'_>) -> PResult<(MetricExpr, usize)> {
    let t = peek(i);
    let name = t.text.to_ascii_lowercase();
    let paren = is_p(nth(i, 1), P::LParen);
    if let Some(&(_, op)) = RANGE_OPS.iter().find(|(n, _)| *n == name) {
        if !paren {
            bump(i);
            return Err(unexpected(i, &format!("\"(\" after {name}")));
        }
        return Ok((range_agg(i, op)?, 1));
    }
    if let Some(&(_, op)) = VECTOR_OPS.iter().find(|(n, _)| *n == name) {
        if !(paren || is_kw(nth(i, 1), "by") || is_kw(nth(i, 1), "without")) {
            bump(i);
            return Err(unexpected(i, &format!("\"(\", \"by\" or \"without\" after {name}")));
        }
        return vector_agg(i, op);
    }
    match name.as_str() {
        "vector" => {
            bump(i);
            expect(i, P::LParen, "\"(\" after vector")?;
            let value = number(i, "a number")?;
            expect(i, P::RParen, "\")\"")?;
            Ok((MetricExpr::VectorOf(value), 0))
        }
        "label_replace" => label_replace(i),
        "approx_count_distinct" => Err(Fail::at(t.start, "approx_count_distinct is not supported")),
        _ => Err(unexpected(i, "a stream selector, an aggregation or a number")),
    }
}

/// `op([param,] log-range) [by|without (labels)]`
fn range_agg(i: &mut In<'_>, op: RangeOp) -> PResult<MetricExpr> {
    let name = bump(i);
    let (param, (log, range_ns, offset_ns)) = nested(i, |i| {
        bump(i);
        let param = if peek(i).kind == Kind::Num && is_p(nth(i, 1), P::Comma) {
            let value = number(i, "a number")?;
            bump(i);
            Some(value)
        } else {
            None
        };
        let log_range = log_range(i)?;
        expect(i, P::RParen, "\")\"")?;
        Ok((param, log_range))
    })?;
    let grouping = grouping(i)?;
    check_range(name, op, param, &log, grouping.as_ref())?;
    Ok(MetricExpr::Range(RangeAgg {
        op,
        param,
        log,
        range_ns,
        offset_ns,
        grouping,
    }))
}

/// What Loki checks on a range aggregation after its grammar.
fn check_range(
    name: Tok<'_>,
    op: RangeOp,
    param: Option<f64>,
    log: &LogExpr,
    grouping: Option<&Grouping>,
) -> PResult<()> {
    use RangeOp::*;
    let fname = range_name(op);
    let refuse = |reason: String| Err(Fail::at(name.start, reason));
    match (op, param) {
        (QuantileOverTime, None) => return refuse(format!("{fname} needs a parameter: {fname}(0.99, ...)")),
        (QuantileOverTime, Some(_)) | (_, None) => {}
        (_, Some(p)) => return refuse(format!("{fname} takes no parameter, but was given {p}")),
    }
    let groups = matches!(
        op,
        AvgOverTime
            | StddevOverTime
            | StdvarOverTime
            | QuantileOverTime
            | MaxOverTime
            | MinOverTime
            | FirstOverTime
            | LastOverTime
    );
    if grouping.is_some() && !groups {
        return refuse(format!("grouping (by or without) is not allowed for {fname}"));
    }
    let unwrap = log.stages.iter().any(|s| matches!(s, Stage::Unwrap(_)));
    if unwrap && matches!(op, CountOverTime | BytesOverTime | BytesRate) {
        return refuse(format!("{fname} cannot be used with unwrap"));
    }
    let needs_unwrap = matches!(
        op,
        SumOverTime
            | AvgOverTime
            | MaxOverTime
            | MinOverTime
            | StddevOverTime
            | StdvarOverTime
            | QuantileOverTime
            | FirstOverTime
            | LastOverTime
            | RateCounter
    );
    if needs_unwrap && !unwrap {
        return refuse(format!(
            "{fname} needs an unwrap stage: {fname}({{...}} | unwrap label [5m])"
        ));
    }
    Ok(())
}

/// The argument of a range aggregation: a log query with a range, in
/// the places Loki allows (`{..} | .. [5m]`, `{..}[5m] | ..`,
/// `({..} | ..)[5m]`, `({..} | .. [5m])`), and an optional offset.
fn log_range(i: &mut In<'_>) -> PResult<(LogExpr, i64, i64)> {
    if at(i, P::LParen) {
        return nested(i, |i| {
            bump(i);
            if at(i, P::LParen) {
                let inner = log_range(i)?;
                expect(i, P::RParen, "\")\"")?;
                return Ok(inner);
            }
            let selector = selector(i)?;
            let stages = stages(i, true)?;
            if at(i, P::LBracket) {
                let inner = range_tail(i, selector, stages)?;
                expect(i, P::RParen, "\")\"")?;
                return Ok(inner);
            }
            expect(i, P::RParen, "a pipeline stage, a range like [5m] or \")\"")?;
            let range_ns = range(i, "a range like [5m]")?;
            let offset_ns = offset(i)?;
            Ok((LogExpr { selector, stages }, range_ns, offset_ns))
        });
    }
    let selector = selector(i)?;
    let stages = stages(i, true)?;
    range_tail(i, selector, stages)
}

/// `[5m] [offset 1h]`, then the stages if none came before the range.
fn range_tail(i: &mut In<'_>, selector: Vec<Matcher>, mut stages: Vec<Stage>) -> PResult<(LogExpr, i64, i64)> {
    let range_ns = range(i, "a pipeline stage or a range like [5m]")?;
    let offset_ns = offset(i)?;
    if stages.is_empty() {
        stages = self::stages(i, true)?;
    }
    Ok((LogExpr { selector, stages }, range_ns, offset_ns))
}

/// `[5m]`, in nanoseconds.
fn range(i: &mut In<'_>, what: &str) -> PResult<i64> {
    expect(i, P::LBracket, what)?;
    let (ns, start) = duration(i)?;
    if ns <= 0 {
        return Err(Fail::at(start, "a range must be longer than zero"));
    }
    expect(i, P::RBracket, "\"]\"")?;
    Ok(ns)
}

/// `offset 1h`, if there, in nanoseconds.
fn offset(i: &mut In<'_>) -> PResult<i64> {
    if !at_kw(i, "offset") {
        return Ok(0);
    }
    bump(i);
    Ok(duration(i)?.0)
}

/// `op [by|without (labels)] ([param,] metric) [by|without (labels)]`
fn vector_agg(i: &mut In<'_>, op: VectorOp) -> PResult<(MetricExpr, usize)> {
    let name = bump(i);
    let fname = vector_name(op);
    let before = grouping(i)?;
    let (param, (inner, height)) = nested(i, |i| {
        expect(i, P::LParen, &format!("\"(\" after {fname}"))?;
        let param = if peek(i).kind == Kind::Num && is_p(nth(i, 1), P::Comma) {
            let value = number(i, "a number")?;
            bump(i);
            Some(value)
        } else {
            None
        };
        let inner = metric(i, fname)?;
        expect(i, P::RParen, "a binary operator or \")\"")?;
        Ok((param, inner))
    })?;
    let grouping = if before.is_some() { before } else { grouping(i)? };
    let refuse = |reason: String| Err(Fail::at(name.start, reason));
    match op {
        VectorOp::Topk | VectorOp::Bottomk | VectorOp::ApproxTopk => match param {
            None => return refuse(format!("{fname} needs a parameter: {fname}(5, ...)")),
            Some(k) if k < 1.0 || k.fract() != 0.0 => {
                return refuse(format!(
                    "{fname}'s parameter must be a whole number greater than zero, not {k}"
                ));
            }
            Some(_) => {}
        },
        _ => {
            if let Some(p) = param {
                return refuse(format!("{fname} takes no parameter, but was given {p}"));
            }
        }
    }
    if op == VectorOp::ApproxTopk && grouping.is_some() {
        return refuse(format!("grouping (by or without) is not allowed for {fname}"));
    }
    if matches!(op, VectorOp::Sort | VectorOp::SortDesc) && grouping.as_ref().is_some_and(|g| !g.labels.is_empty()) {
        return refuse(format!("{fname} does not group: it orders by value"));
    }
    let height = grow(name.start, height, 0)?;
    let agg = VectorAgg {
        op,
        grouping,
        param,
        inner: Box::new(inner),
    };
    Ok((MetricExpr::Vector(agg), height))
}

/// A metric query as an argument of `function`, and its height.
fn metric(i: &mut In<'_>, function: &str) -> PResult<(MetricExpr, usize)> {
    match expr(i)? {
        (Operand::Metric(m), height) => Ok((m, height)),
        (Operand::Log(_, pos, _), _) => Err(Fail::at(
            pos,
            format!(
                "{function} needs a metric query, not a log query: make it one with a range aggregation such as count_over_time(... [5m])"
            ),
        )),
    }
}

/// `label_replace(metric, "dst", "replacement", "src", "regex")`
fn label_replace(i: &mut In<'_>) -> PResult<(MetricExpr, usize)> {
    let name = bump(i);
    nested(i, |i| {
        expect(i, P::LParen, "\"(\" after label_replace")?;
        let (inner, height) = metric(i, "label_replace")?;
        let height = grow(name.start, height, 0)?;
        let mut args: [String; 4] = Default::default();
        for (arg, what) in
            args.iter_mut()
                .zip(["destination label", "replacement", "source label", "regular expression"])
        {
            expect(i, P::Comma, "\",\"")?;
            *arg = string(i, &format!("a string (the {what})"))?;
        }
        expect(i, P::RParen, "\")\"")?;
        let [dst, replacement, src, regex] = args;
        let replace = LabelReplace {
            inner,
            dst,
            replacement,
            src,
            regex,
        };
        Ok((MetricExpr::LabelReplace(Box::new(replace)), height))
    })
}

// ---------------------------------------------------------------------------
// Log queries

/// `{a="b", c=~"d"}`, also `{}`.
fn selector(i: &mut In<'_>) -> PResult<Vec<Matcher>> {
    expect(i, P::LBrace, "a stream selector like {app=\"x\"}")?;
    if at(i, P::RBrace) {
        bump(i);
        return Ok(Vec::new());
    }
    let matchers = separated(1.., matcher, punct(P::Comma)).parse_next(i)?;
    expect(i, P::RBrace, "\",\" or \"}\"")?;
    Ok(matchers)
}

fn matcher(i: &mut In<'_>) -> PResult<Matcher> {
    let name = ident(i, "a label matcher")?.to_string();
    let op = match_op(i).ok_or_else(|| unexpected(i, "=, !=, =~ or !~"))?;
    let value = string(i, "a string")?;
    Ok(Matcher { name, op, value })
}

fn match_op(i: &mut In<'_>) -> Option<MatchOp> {
    let op = match peek(i).kind {
        Kind::P(P::Eq) => MatchOp::Eq,
        Kind::P(P::Ne) => MatchOp::Ne,
        Kind::P(P::Re) => MatchOp::Re,
        Kind::P(P::NotRe) => MatchOp::NotRe,
        _ => return None,
    };
    bump(i);
    Some(op)
}

/// Pipeline stages, as many as follow. `unwrap` only where `unwrap` is
/// allowed (in a range aggregation), and then only label filters after it.
fn stages(i: &mut In<'_>, unwrap: bool) -> PResult<Vec<Stage>> {
    let mut out = Vec::new();
    let mut unwrapped = false;
    loop {
        let t = peek(i);
        let line_op = match t.kind {
            Kind::P(P::PipeEq) => LineOp::Contains,
            Kind::P(P::Ne) => LineOp::NotContains,
            Kind::P(P::PipeRe) => LineOp::Re,
            Kind::P(P::NotRe) => LineOp::NotRe,
            Kind::P(P::PipeGt) => LineOp::Pattern,
            Kind::P(P::NotGt) => LineOp::NotPattern,
            Kind::P(P::Pipe) => {
                bump(i);
                let stage = pipe_stage(i, unwrap, unwrapped)?;
                unwrapped |= matches!(stage, Stage::Unwrap(_));
                out.push(stage);
                continue;
            }
            _ => break,
        };
        if unwrapped {
            return Err(Fail::at(t.start, "only label filters may follow unwrap"));
        }
        bump(i);
        out.push(Stage::Line(line_filter(i, line_op)?));
    }
    Ok(out)
}

/// What follows a `|`: a stage named by its keyword, else a label filter.
fn pipe_stage(i: &mut In<'_>, unwrap: bool, unwrapped: bool) -> PResult<Stage> {
    const KEYWORDS: [&str; 11] = [
        "json",
        "logfmt",
        "regexp",
        "pattern",
        "unpack",
        "line_format",
        "label_format",
        "decolorize",
        "drop",
        "keep",
        "unwrap",
    ];
    let t = peek(i);
    let word = if t.kind == Kind::Ident {
        t.text.to_ascii_lowercase()
    } else {
        String::new()
    };
    if !KEYWORDS.contains(&word.as_str()) {
        if !(t.kind == Kind::Ident || t.kind == Kind::P(P::LParen)) {
            return Err(unexpected(i, "a pipeline stage or a label filter after \"|\""));
        }
        return Ok(Stage::LabelFilter(label_filter(i)?.0));
    }
    if unwrapped {
        return Err(Fail::at(t.start, "only label filters may follow unwrap"));
    }
    if word == "unwrap" && !unwrap {
        let reason =
            "unwrap is only allowed inside a range aggregation, such as sum_over_time({...} | unwrap label [5m])";
        return Err(Fail::at(t.start, reason));
    }
    bump(i);
    let comma = || punct(P::Comma);
    Ok(match word.as_str() {
        "json" => Stage::Json(parser_params(i)?),
        "logfmt" => logfmt(i)?,
        "regexp" => Stage::Regexp(string(i, "a string (the regular expression)")?),
        "pattern" => Stage::Pattern(string(i, "a string (the pattern)")?),
        "unpack" => Stage::Unpack,
        "line_format" => Stage::LineFormat(string(i, "a string (the template)")?),
        "label_format" => Stage::LabelFormat(separated(1.., label_fmt, comma()).parse_next(i)?),
        "decolorize" => Stage::Decolorize,
        "drop" => Stage::Drop(separated(1.., named_matcher, comma()).parse_next(i)?),
        "keep" => Stage::Keep(separated(1.., named_matcher, comma()).parse_next(i)?),
        _ => Stage::Unwrap(unwrap_stage(i)?),
    })
}

/// The values of a line filter: `"a"`, ``ip(`10.0.0.0/8`)``, joined by `or`.
fn line_filter(i: &mut In<'_>, op: LineOp) -> PResult<LineFilter> {
    let mut values = vec![line_value(i)?];
    while at_kw(i, "or") {
        bump(i);
        values.push(line_value(i)?);
    }
    Ok(LineFilter { op, values })
}

fn line_value(i: &mut In<'_>) -> PResult<LineValue> {
    if at_kw(i, "ip") && is_p(nth(i, 1), P::LParen) {
        return Ok(LineValue::Ip(ip_call(i)?));
    }
    Ok(LineValue::Str(string(i, "a string or ip(\"...\")")?))
}

/// ``ip(`cidr`)``
fn ip_call(i: &mut In<'_>) -> PResult<String> {
    bump(i);
    bump(i);
    let cidr = string(i, "a string (an address, a range or a CIDR)")?;
    expect(i, P::RParen, "\")\"")?;
    Ok(cidr)
}

/// `a, b="x.y"` after `json` or `logfmt`, if there.
fn parser_params(i: &mut In<'_>) -> PResult<Vec<ParserParam>> {
    if peek(i).kind != Kind::Ident {
        return Ok(Vec::new());
    }
    let param = |i: &mut In<'_>| -> PResult<ParserParam> {
        let label = ident(i, "a label name")?.to_string();
        let expr = if at(i, P::Eq) {
            bump(i);
            Some(string(i, "a string (the expression to extract)")?)
        } else {
            None
        };
        Ok(ParserParam { label, expr })
    };
    separated(1.., param, punct(P::Comma)).parse_next(i)
}

/// After `logfmt`: `[--strict] [--keep-empty] [params]`.
fn logfmt(i: &mut In<'_>) -> PResult<Stage> {
    let (mut strict, mut keep_empty) = (false, false);
    while peek(i).kind == Kind::Flag {
        let t = bump(i);
        match t.text {
            "--strict" => strict = true,
            "--keep-empty" => keep_empty = true,
            other => {
                return Err(Fail::at(
                    t.start,
                    format!("unknown logfmt flag \"{other}\": expected --strict or --keep-empty"),
                ));
            }
        }
    }
    let params = parser_params(i)?;
    Ok(Stage::Logfmt {
        strict,
        keep_empty,
        params,
    })
}

/// `dst=src` or `dst="template"`.
fn label_fmt(i: &mut In<'_>) -> PResult<LabelFmt> {
    let dst = ident(i, "a label name")?.to_string();
    expect(i, P::Eq, "\"=\"")?;
    let t = peek(i);
    let value = match t.kind {
        Kind::Ident => LabelFmtValue::Rename(bump(i).text.to_string()),
        _ => LabelFmtValue::Template(string(i, "a label name or a string (a template)")?),
    };
    Ok(LabelFmt { dst, value })
}

/// `name` or `name op "value"` after `drop` / `keep`.
fn named_matcher(i: &mut In<'_>) -> PResult<NamedMatcher> {
    let name = ident(i, "a label name")?.to_string();
    let matcher = match match_op(i) {
        Some(op) => Some((op, string(i, "a string")?)),
        None => None,
    };
    Ok(NamedMatcher { name, matcher })
}

/// After `unwrap`: `label`, `duration(label)`, `duration_seconds(label)`,
/// `bytes(label)`.
fn unwrap_stage(i: &mut In<'_>) -> PResult<Unwrap> {
    let t = peek(i);
    let conv = match t.text.to_ascii_lowercase().as_str() {
        _ if t.kind != Kind::Ident || !is_p(nth(i, 1), P::LParen) => UnwrapConv::None,
        "duration" | "duration_seconds" => UnwrapConv::Duration,
        "bytes" => UnwrapConv::Bytes,
        _ => UnwrapConv::None,
    };
    if conv == UnwrapConv::None {
        let label = ident(i, "a label name to unwrap")?.to_string();
        return Ok(Unwrap { label, conv });
    }
    bump(i);
    bump(i);
    let label = ident(i, "a label name")?.to_string();
    expect(i, P::RParen, "\")\"")?;
    Ok(Unwrap { label, conv })
}

// ---------------------------------------------------------------------------
// Label filters: `or` binds loosest, then `and` / `,` / juxtaposition.

/// A label filter expression and its height.
fn label_filter(i: &mut In<'_>) -> PResult<(LabelFilter, usize)> {
    let (mut left, mut height) = label_filter_and(i)?;
    while at_kw(i, "or") {
        let pos = bump(i).start;
        let (right, h) = label_filter_and(i)?;
        height = grow(pos, height, h)?;
        left = LabelFilter::Or(Box::new(left), Box::new(right));
    }
    Ok((left, height))
}

fn label_filter_and(i: &mut In<'_>) -> PResult<(LabelFilter, usize)> {
    let (mut left, mut height) = label_filter_primary(i)?;
    loop {
        let pos = peek(i).start;
        if at_kw(i, "and") || at(i, P::Comma) {
            bump(i);
        } else if !juxtaposed(i) {
            break;
        }
        let (right, h) = label_filter_primary(i)?;
        height = grow(pos, height, h)?;
        left = LabelFilter::And(Box::new(left), Box::new(right));
    }
    Ok((left, height))
}

/// `a="b" c="d"` is `and` too in Loki's grammar.
fn juxtaposed(i: &In<'_>) -> bool {
    let next = nth(i, 0);
    let is_filter_start = next.is_some_and(|t| t.kind == Kind::Ident) && !is_kw(next, "or") && !is_kw(next, "and");
    let op = nth(i, 1).map(|t| t.kind);
    is_filter_start
        && matches!(
            op,
            Some(Kind::P(
                P::Eq | P::EqEq | P::Ne | P::Re | P::NotRe | P::Gt | P::Ge | P::Lt | P::Le
            ))
        )
}

fn label_filter_primary(i: &mut In<'_>) -> PResult<(LabelFilter, usize)> {
    if at(i, P::LParen) {
        return nested(i, |i| {
            let pos = bump(i).start;
            let (inner, height) = label_filter(i)?;
            expect(i, P::RParen, "and, or, \",\" or \")\"")?;
            Ok((inner, grow(pos, height, 0)?))
        });
    }
    Ok((comparison(i)?, 0))
}

/// `name op value`
fn comparison(i: &mut In<'_>) -> PResult<LabelFilter> {
    let name = ident(i, "a label filter like status=\"200\"")?.to_string();
    let op = peek(i);
    let cmp = match op.kind {
        Kind::P(P::Eq) => CmpOp::Eq,
        Kind::P(P::Ne) => CmpOp::Ne,
        Kind::P(P::EqEq) => CmpOp::Eq,
        Kind::P(P::Gt) => CmpOp::Gt,
        Kind::P(P::Ge) => CmpOp::Ge,
        Kind::P(P::Lt) => CmpOp::Lt,
        Kind::P(P::Le) => CmpOp::Le,
        Kind::P(p @ (P::Re | P::NotRe)) => {
            bump(i);
            let value = string(i, "a string (a regular expression)")?;
            let op = if p == P::Re { MatchOp::Re } else { MatchOp::NotRe };
            return Ok(LabelFilter::Str { name, op, value });
        }
        _ => return Err(unexpected(i, "a comparison: = != =~ !~ == > >= < <=")),
    };
    bump(i);
    let strings = matches!(op.kind, Kind::P(P::Eq | P::Ne));
    if strings {
        let eq = cmp == CmpOp::Eq;
        if let Kind::Str(_) = peek(i).kind {
            let value = string(i, "a string")?;
            return Ok(LabelFilter::Str {
                name,
                op: if eq { MatchOp::Eq } else { MatchOp::Ne },
                value,
            });
        }
        if at_kw(i, "ip") && is_p(nth(i, 1), P::LParen) {
            return Ok(LabelFilter::Ip {
                name,
                eq,
                cidr: ip_call(i)?,
            });
        }
    }
    let what = if strings {
        "a string, a number, a duration or a byte size"
    } else {
        "a number, a duration or a byte size"
    };
    filter_value(i, name, cmp, what)
}

/// `12`, `-1.5`, `250ms`, `-5s`, `20MB` after a comparison.
fn filter_value(i: &mut In<'_>, name: String, op: CmpOp, what: &str) -> PResult<LabelFilter> {
    let sign = match peek(i).kind {
        Kind::P(P::Sub) => Some(bump(i)),
        Kind::P(P::Add) => Some(bump(i)),
        _ => None,
    };
    let t = peek(i);
    if t.kind != Kind::Num {
        return Err(unexpected(i, what));
    }
    bump(i);
    let negative = sign.is_some_and(|s| s.kind == Kind::P(P::Sub));
    if let Some(value) = parse_number(t.text) {
        return Ok(LabelFilter::Number {
            name,
            op,
            value: if negative { -value } else { value },
        });
    }
    let start = sign.map_or(t.start, |s| s.start);
    if let Some(ns) = parse_duration(t.text) {
        if sign.is_some() && !negative {
            return Err(Fail::at(start, "a duration takes no \"+\""));
        }
        let seconds = ns as f64 / 1e9;
        return Ok(LabelFilter::Duration {
            name,
            op,
            seconds: if negative { -seconds } else { seconds },
        });
    }
    if let Some(bytes) = parse_bytes(t.text) {
        if sign.is_some() {
            return Err(Fail::at(start, "a byte size takes no sign"));
        }
        return Ok(LabelFilter::Bytes { name, op, bytes });
    }
    Err(Fail::at(
        t.start,
        format!(
            "invalid value \"{}\": expected a number, a duration like 250ms or a byte size like 20MB",
            t.text
        ),
    ))
}

#[cfg(test)]
mod tests;
