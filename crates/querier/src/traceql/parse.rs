//! The TraceQL parser, in two passes built with `winnow`: a lexer turns
//! the query into tokens (it knows attribute names, strings, numbers and
//! durations as Tempo's lexer does), then a recursive-descent parser over
//! the tokens builds the [`Query`] with Tempo's precedences
//! (`pkg/traceql/expr.y`).
//!
//! Errors name the byte position, line and column, and either a specific
//! reason or what the parser expected at the furthest token it reached
//! and what it found there. Queries over [`MAX_QUERY_BYTES`] are refused
//! before lexing; parentheses, braces and prefix operators nest at most
//! [`MAX_NESTING`] deep, and no expression tree grows deeper than
//! [`MAX_TREE_DEPTH`] (a long `a && b && ...` chain), so neither the parser
//! nor the evaluator's recursion over the tree can exhaust the stack.

use std::cell::{Cell, RefCell};

use winnow::combinator::{delimited, separated};
use winnow::error::{ErrMode, ParserError};
use winnow::stream::{Stateful, Stream, TokenSlice};
use winnow::token::{any, literal, take_while};
use winnow::{ModalResult, Parser};

use super::ast::{
    Aggregate, ArithOp, Attribute, BinOp, CmpOp, FieldExpr, Hint, Intrinsic, Kind, MetricsFn, MetricsStage, Query,
    ScalarExpr, Scope, SecondStage, SpansetExpr, Stage, Static, Status, StructOp,
};

/// The longest query accepted, in bytes.
pub const MAX_QUERY_BYTES: usize = 64 * 1024;
/// How deep parentheses, braces and prefix operators (`!`, `-`) may nest.
pub const MAX_NESTING: usize = 64;
/// How deep the syntax tree may grow (binary operators chain: `a && b &&
/// c` is three levels).
pub const MAX_TREE_DEPTH: usize = 512;

pub use crate::parse_error::ParseError;

/// Parses a TraceQL query.
pub fn parse(query: &str) -> Result<Query, ParseError> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(ParseError::at(
            query,
            0,
            format!(
                "query is {} bytes long, more than the limit of {MAX_QUERY_BYTES}",
                query.len()
            ),
        ));
    }
    let tokens = lex(query).map_err(|e| ParseError::at(query, query.len() - e.remaining, e.reason))?;
    let state = State {
        tokens: tokens.len(),
        nesting: Cell::new(0),
        furthest: RefCell::new(Expected::default()),
    };
    let mut input = In {
        input: TokenSlice::new(&tokens),
        state: &state,
    };
    match root(&mut input) {
        Ok(q) => Ok(q),
        Err(ErrMode::Backtrack(Fail(Some(c))) | ErrMode::Cut(Fail(Some(c)))) => {
            Err(ParseError::at(query, c.pos, c.reason))
        }
        Err(_) => {
            let expected = state.furthest.into_inner();
            let tok = &tokens[expected.at.min(tokens.len() - 1)];
            let found = describe(query, tok);
            let reason = match expected.what.as_slice() {
                [] => format!("unexpected {found}"),
                what => format!("expected {}, found {found}", one_of(what)),
            };
            Err(ParseError::at(query, tok.start, reason))
        }
    }
}

/// `a`, `a or b`, `a, b or c`.
fn one_of(what: &[&str]) -> String {
    match what {
        [] => String::new(),
        [one] => (*one).to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// How an error message shows a token: its text, or "end of query".
fn describe(query: &str, tok: &Tok) -> String {
    if tok.kind == T::Eof {
        return "end of query".to_string();
    }
    let text = &query[tok.start..tok.end];
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("`{}...`", &text[..cut]),
        None => format!("`{text}`"),
    }
}

// ---------------------------------------------------------------------------
// Lexer

/// One token and its byte range in the query.
#[derive(Debug, Clone, PartialEq)]
struct Tok {
    kind: T,
    start: usize,
    end: usize,
}

#[derive(Debug, Clone, PartialEq)]
enum T {
    LBrace,
    RBrace,
    LParen,
    RParen,
    Comma,
    Op(Op),
    /// Identifiers and keywords; the parser tells them apart.
    Word(String),
    Int(i64),
    Float(f64),
    /// Nanoseconds.
    Duration(i64),
    Str(String),
    /// `.a`, `span.a`, `parent.resource.a`, ...
    Attr(Attribute),
    /// `span:name`, `trace:id`, ...
    Intrinsic(Intrinsic),
    /// Always the last token.
    Eof,
}

/// Operator tokens; `>`, `<`, `~` and `!~` are both field and structural
/// operators, the parser decides by position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    And,
    Or,
    Pipe,
    Not,
    Eq,
    Ne,
    Re,
    NotRe,
    Lt,
    Le,
    Gt,
    Ge,
    Desc,
    Anc,
    Tilde,
    NotChild,
    NotParent,
    NotDesc,
    NotAnc,
    UnionChild,
    UnionParent,
    UnionDesc,
    UnionAnc,
    UnionSibl,
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
}

/// Operators, longest first so that `&>>` is not read as `&>` `>`.
const OPS: &[(&str, Op)] = &[
    ("&>>", Op::UnionDesc),
    ("&<<", Op::UnionAnc),
    ("!>>", Op::NotDesc),
    ("!<<", Op::NotAnc),
    ("&&", Op::And),
    ("||", Op::Or),
    ("&>", Op::UnionChild),
    ("&<", Op::UnionParent),
    ("&~", Op::UnionSibl),
    ("!>", Op::NotChild),
    ("!<", Op::NotParent),
    ("!=", Op::Ne),
    ("!~", Op::NotRe),
    (">>", Op::Desc),
    ("<<", Op::Anc),
    (">=", Op::Ge),
    ("<=", Op::Le),
    ("=~", Op::Re),
    ("!", Op::Not),
    ("|", Op::Pipe),
    ("=", Op::Eq),
    (">", Op::Gt),
    ("<", Op::Lt),
    ("~", Op::Tilde),
    ("+", Op::Add),
    ("-", Op::Sub),
    ("*", Op::Mul),
    ("/", Op::Div),
    ("%", Op::Mod),
    ("^", Op::Pow),
];

/// A lexer error: the input left where it happened, and why.
#[derive(Debug)]
struct LexError {
    remaining: usize,
    reason: String,
}

impl LexError {
    fn new(at: &str, reason: impl Into<String>) -> LexError {
        LexError {
            remaining: at.len(),
            reason: reason.into(),
        }
    }
}

impl<'s> ParserError<&'s str> for LexError {
    type Inner = Self;

    fn from_input(input: &&'s str) -> Self {
        let reason = match input.chars().next() {
            Some(c) => format!("unexpected character `{c}`"),
            None => "unexpected end of query".to_string(),
        };
        LexError::new(input, reason)
    }

    fn into_inner(self) -> Result<Self, Self> {
        Ok(self)
    }
}

type LexResult<O> = Result<O, LexError>;

fn lex(query: &str) -> LexResult<Vec<Tok>> {
    let mut rest = query;
    let mut tokens = Vec::new();
    loop {
        skip_trivia(&mut rest)?;
        let start = query.len() - rest.len();
        if rest.is_empty() {
            tokens.push(Tok {
                kind: T::Eof,
                start,
                end: start,
            });
            return Ok(tokens);
        }
        let kind = token(&mut rest)?;
        tokens.push(Tok {
            kind,
            start,
            end: query.len() - rest.len(),
        });
    }
}

/// Skips whitespace, `// line` and `/* block */` comments.
fn skip_trivia(i: &mut &str) -> LexResult<()> {
    loop {
        let _: &str = take_while(0.., char::is_whitespace).parse_next(i)?;
        if i.starts_with("//") {
            let _: &str = take_while(0.., |c| c != '\n').parse_next(i)?;
        } else if i.starts_with("/*") {
            let Some(end) = i[2..].find("*/") else {
                return Err(LexError::new(i, "unterminated `/*` comment"));
            };
            *i = &i[end + 4..];
        } else {
            return Ok(());
        }
    }
}

fn token(i: &mut &str) -> LexResult<T> {
    let Some(c) = i.chars().next() else {
        return Err(LexError::from_input(i));
    };
    let single = match c {
        '{' => Some(T::LBrace),
        '}' => Some(T::RBrace),
        '(' => Some(T::LParen),
        ')' => Some(T::RParen),
        ',' => Some(T::Comma),
        _ => None,
    };
    if let Some(t) = single {
        let _: char = any.parse_next(i)?;
        return Ok(t);
    }
    let digit_after_dot = c == '.' && i[1..].starts_with(|c: char| c.is_ascii_digit());
    if c.is_ascii_digit() || digit_after_dot {
        return number(i);
    }
    if c == '.' {
        let _: &str = literal(".").parse_next(i)?;
        let name = attribute_name(i, ".")?;
        return Ok(T::Attr(Attribute::named(Scope::Unscoped, name)));
    }
    if c == '"' {
        return quoted(i).map(T::Str);
    }
    if c == '`' {
        let start = *i;
        let _: &str = literal("`").parse_next(i)?;
        let Some(end) = i.find('`') else {
            return Err(LexError::new(start, "unterminated string"));
        };
        let s = i[..end].to_string();
        *i = &i[end + 1..];
        return Ok(T::Str(s));
    }
    if c.is_ascii_alphabetic() || c == '_' {
        return word(i);
    }
    for (text, op) in OPS {
        if i.starts_with(text) {
            *i = &i[text.len()..];
            return Ok(T::Op(*op));
        }
    }
    Err(LexError::from_input(i))
}

/// A word: a keyword, an identifier, a scope before `.` (`span.a`) or
/// before `:` (`span:name`).
fn word(i: &mut &str) -> LexResult<T> {
    let start = *i;
    let w: &str = take_while(1.., |c: char| c.is_ascii_alphanumeric() || c == '_').parse_next(i)?;
    if i.starts_with('.') {
        let scope = match w {
            "resource" => Some(Scope::Resource),
            "span" => Some(Scope::Span),
            "event" => Some(Scope::Event),
            "link" => Some(Scope::Link),
            "instrumentation" => Some(Scope::Instrumentation),
            "parent" => Some(Scope::Unscoped),
            _ => None,
        };
        if let Some(mut scope) = scope {
            *i = &i[1..];
            let parent = w == "parent";
            if parent {
                // As Tempo: `parent.resource.a` and `parent.span.a` are
                // scoped, anything else after `parent.` is the name.
                for (prefix, s) in [("resource.", Scope::Resource), ("span.", Scope::Span)] {
                    if i.starts_with(prefix) {
                        *i = &i[prefix.len()..];
                        scope = s;
                        break;
                    }
                }
            }
            let name = attribute_name(i, &start[..start.len() - i.len()])?;
            return Ok(T::Attr(Attribute::Named { scope, parent, name }));
        }
    }
    if i.starts_with(':') && matches!(w, "span" | "trace" | "event" | "link" | "instrumentation") {
        *i = &i[1..];
        let field: &str = take_while(0.., |c: char| c.is_ascii_alphanumeric() || c == '_').parse_next(i)?;
        return match Intrinsic::from_colon(w, field) {
            Some(intrinsic) => Ok(T::Intrinsic(intrinsic)),
            None if field.is_empty() => Err(LexError::new(i, format!("expected an intrinsic after `{w}:`"))),
            None => Err(LexError::new(start, format!("unknown intrinsic `{w}:{field}`"))),
        };
    }
    Ok(T::Word(w.to_string()))
}

/// Tempo's attribute characters: anything but whitespace and
/// `{ } ( ) = ~ ! < > & | ^ ,`; `"` opens a quoted part.
fn is_attribute_char(c: char) -> bool {
    !c.is_whitespace()
        && !matches!(
            c,
            '{' | '}' | '(' | ')' | '=' | '~' | '!' | '<' | '>' | '&' | '|' | '^' | ',' | '"'
        )
}

/// An attribute name after `prefix` (`.`, `span.`, ...): runs of
/// attribute characters and quoted parts (`span."a b"`, escapes `\"` and
/// `\\` only).
fn attribute_name(i: &mut &str, prefix: &str) -> LexResult<String> {
    let mut name = String::new();
    loop {
        if i.starts_with('"') {
            let start = *i;
            *i = &i[1..];
            loop {
                let Some(c) = i.chars().next() else {
                    return Err(LexError::new(start, "unterminated quoted attribute name"));
                };
                *i = &i[c.len_utf8()..];
                match c {
                    '"' => break,
                    '\\' => match i.chars().next() {
                        Some(e @ ('"' | '\\')) => {
                            name.push(e);
                            *i = &i[1..];
                        }
                        _ => {
                            let at = &start[start.len() - i.len() - 1..];
                            return Err(LexError::new(
                                at,
                                "invalid escape in attribute name: only `\\\"` and `\\\\`",
                            ));
                        }
                    },
                    c => name.push(c),
                }
            }
        } else {
            let part: &str = take_while(0.., is_attribute_char).parse_next(i)?;
            if part.is_empty() {
                break;
            }
            name.push_str(part);
        }
    }
    if name.is_empty() {
        return Err(LexError::new(i, format!("expected an attribute name after `{prefix}`")));
    }
    Ok(name)
}

/// A double-quoted string with Go's escapes, as Tempo reads it.
fn quoted(i: &mut &str) -> LexResult<String> {
    let start = *i;
    *i = &i[1..];
    let mut s = String::new();
    loop {
        let at = *i;
        let Some(c) = i.chars().next() else {
            return Err(LexError::new(start, "unterminated string"));
        };
        *i = &i[c.len_utf8()..];
        match c {
            '"' => return Ok(s),
            '\n' => return Err(LexError::new(at, "newline in string")),
            '\\' => s.push(escape(i, at)?),
            c => s.push(c),
        }
    }
}

/// The character of an escape after its `\` (`at` is the `\`).
fn escape<'s>(i: &mut &'s str, at: &'s str) -> LexResult<char> {
    let Some(c) = i.chars().next() else {
        return Err(LexError::new(at, "unterminated string"));
    };
    *i = &i[c.len_utf8()..];
    let (digits, radix) = match c {
        'a' => return Ok('\u{7}'),
        'b' => return Ok('\u{8}'),
        'f' => return Ok('\u{c}'),
        'n' => return Ok('\n'),
        'r' => return Ok('\r'),
        't' => return Ok('\t'),
        'v' => return Ok('\u{b}'),
        '\\' => return Ok('\\'),
        '"' => return Ok('"'),
        'x' => (2, 16),
        'u' => (4, 16),
        'U' => (8, 16),
        '0'..='7' => {
            *i = &at[1..];
            (3, 8)
        }
        c => return Err(LexError::new(at, format!("invalid escape `\\{c}` in string"))),
    };
    let text = i.get(..digits).unwrap_or(i);
    let code = (text.len() == digits && text.chars().all(|c| c.is_digit(radix)))
        .then(|| u32::from_str_radix(text, radix).ok())
        .flatten();
    let ch = code
        .and_then(char::from_u32)
        .filter(|ch| radix == 16 && c != 'x' || ch.is_ascii());
    match ch {
        Some(ch) => {
            *i = &i[digits..];
            Ok(ch)
        }
        // `\x` and octal escapes are bytes in Go; only ASCII ones make
        // valid UTF-8 on their own.
        None => Err(LexError::new(at, format!("invalid escape `\\{c}...` in string"))),
    }
}

/// A number, or a duration when a unit follows (`5`, `1.5`, `.9`, `1e3`,
/// `100ms`, `1h30m`, `2d`).
fn number(i: &mut &str) -> LexResult<T> {
    let start = *i;
    let _: &str = take_while(0.., |c: char| c.is_ascii_digit()).parse_next(i)?;
    let mut float = false;
    if i.starts_with('.') && i[1..].starts_with(|c: char| c.is_ascii_digit()) {
        float = true;
        *i = &i[1..];
        let _: &str = take_while(0.., |c: char| c.is_ascii_digit()).parse_next(i)?;
    }
    let mut exp = i.strip_prefix(['e', 'E']).unwrap_or("");
    exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
    if (i.starts_with(['e', 'E'])) && exp.starts_with(|c: char| c.is_ascii_digit()) {
        float = true;
        *i = exp.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    if i.starts_with(is_unit_char) {
        let _: &str = take_while(0.., |c: char| c.is_ascii_digit() || c == '.' || is_unit_char(c)).parse_next(i)?;
        let text = &start[..start.len() - i.len()];
        return match duration(text) {
            Some(ns) => Ok(T::Duration(ns)),
            None => Err(LexError::new(start, format!("invalid duration `{text}`"))),
        };
    }
    let text = &start[..start.len() - i.len()];
    if float {
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(T::Float(f)),
            _ => Err(LexError::new(start, format!("number `{text}` out of range"))),
        }
    } else {
        match text.parse::<i64>() {
            Ok(n) => Ok(T::Int(n)),
            Err(_) => Err(LexError::new(start, format!("integer `{text}` out of range"))),
        }
    }
}

fn is_unit_char(c: char) -> bool {
    matches!(c, 'n' | 'u' | 'µ' | 'm' | 's' | 'h' | 'd' | 'w' | 'y')
}

const NS_PER_SEC: i128 = 1_000_000_000;

/// A duration in nanoseconds, as Tempo reads one: Go's form (`1.5h`,
/// `1h30m`, units `ns us µs ms s m h`) or Prometheus' (`1d12h`, integer
/// amounts of `y w d h m s ms` in that order).
fn duration(text: &str) -> Option<i64> {
    go_duration(text).or_else(|| prometheus_duration(text))
}

fn go_duration(text: &str) -> Option<i64> {
    const UNITS: &[(&str, i128)] = &[
        ("ns", 1),
        ("us", 1_000),
        ("µs", 1_000),
        ("ms", 1_000_000),
        ("s", NS_PER_SEC),
        ("m", 60 * NS_PER_SEC),
        ("h", 3600 * NS_PER_SEC),
    ];
    let mut rest = text;
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let whole_len = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let whole = &rest[..whole_len];
        rest = &rest[whole_len..];
        let mut frac = "";
        if let Some(r) = rest.strip_prefix('.') {
            let len = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            frac = &r[..len];
            rest = &r[len..];
        }
        if whole.is_empty() && frac.is_empty() {
            return None;
        }
        let (unit, ns) = UNITS.iter().find(|(u, _)| rest.starts_with(u))?;
        rest = &rest[unit.len()..];
        let whole: i128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
        total = total.checked_add(whole.checked_mul(*ns)?)?;
        if !frac.is_empty() {
            // Go keeps what fits in nanoseconds and truncates the rest.
            let frac = &frac[..frac.len().min(18)];
            let scale = 10i128.pow(frac.len() as u32);
            total = total.checked_add(frac.parse::<i128>().ok()? * ns / scale)?;
        }
        if total > i64::MAX as i128 {
            return None;
        }
    }
    i64::try_from(total).ok()
}

fn prometheus_duration(text: &str) -> Option<i64> {
    const UNITS: &[(&str, i128)] = &[
        ("y", 365 * 24 * 3600 * NS_PER_SEC),
        ("w", 7 * 24 * 3600 * NS_PER_SEC),
        ("d", 24 * 3600 * NS_PER_SEC),
        ("h", 3600 * NS_PER_SEC),
        ("ms", 1_000_000),
        ("m", 60 * NS_PER_SEC),
        ("s", NS_PER_SEC),
    ];
    // Prometheus' order: y w d h m s ms.
    let rank = |u: &str| ["y", "w", "d", "h", "m", "s", "ms"].iter().position(|x| *x == u);
    let mut rest = text;
    let mut total: i128 = 0;
    let mut last = None;
    while !rest.is_empty() {
        let len = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if len == 0 {
            return None;
        }
        let n: i128 = rest[..len].parse().ok()?;
        rest = &rest[len..];
        let (unit, ns) = UNITS.iter().find(|(u, _)| rest.starts_with(u))?;
        rest = &rest[unit.len()..];
        let r = rank(unit);
        if r <= last {
            return None;
        }
        last = r;
        total = total.checked_add(n.checked_mul(*ns)?)?;
        if total > i64::MAX as i128 {
            return None;
        }
    }
    i64::try_from(total).ok()
}

// ---------------------------------------------------------------------------
// Parser

/// The parser's input: the tokens, and the state shared by every branch.
type In<'t> = Stateful<TokenSlice<'t, Tok>, &'t State>;

/// A failure. `None`: the next token was not one the parser could use;
/// what it expected is in [`State::furthest`]. `Some`: a specific reason,
/// always reported as is (and raised as a cut).
#[derive(Debug)]
struct Fail(Option<Custom>);

#[derive(Debug)]
struct Custom {
    pos: usize,
    reason: String,
}

impl<I: Stream> ParserError<I> for Fail {
    type Inner = Self;

    fn from_input(_: &I) -> Self {
        Fail(None)
    }

    fn into_inner(self) -> Result<Self, Self> {
        Ok(self)
    }
}

type PResult<O> = ModalResult<O, Fail>;

#[derive(Debug)]
struct State {
    /// How many tokens, to turn what is left into an index.
    tokens: usize,
    nesting: Cell<usize>,
    furthest: RefCell<Expected>,
}

/// What the parser expected at the furthest token it reached.
#[derive(Debug, Default)]
struct Expected {
    at: usize,
    what: Vec<&'static str>,
}

/// A node and the depth of its tree.
type Deep<T> = (T, usize);

fn custom<O>(pos: usize, reason: impl Into<String>) -> PResult<O> {
    Err(ErrMode::Cut(Fail(Some(Custom {
        pos,
        reason: reason.into(),
    }))))
}

fn mismatch<O>() -> PResult<O> {
    Err(ErrMode::Backtrack(Fail(None)))
}

/// Stands in for the `Eof` token, which ends every token list and is never
/// consumed, so that [`peek`] needs no `unwrap`.
static EOF: Tok = Tok {
    kind: T::Eof,
    start: 0,
    end: 0,
};

fn peek<'t>(i: &In<'t>) -> &'t Tok {
    i.peek_token().unwrap_or(&EOF)
}

fn peek_nth<'t>(i: &In<'t>, n: usize) -> &'t Tok {
    i.iter_offsets().nth(n).map_or(&EOF, |(_, t)| t)
}

fn bump(i: &mut In<'_>) {
    if peek(i).kind != T::Eof {
        let _ = i.next_token();
    }
}

/// Notes that `what` would have been accepted at the current token.
fn expected(i: &In<'_>, what: &'static str) {
    let at = i.state.tokens - i.eof_offset();
    let mut e = i.state.furthest.borrow_mut();
    if at > e.at {
        e.at = at;
        e.what.clear();
    }
    if at == e.at && !e.what.contains(&what) {
        e.what.push(what);
    }
}

/// Consumes the token if it is `kind`, else notes `what` as expected.
fn eat(i: &mut In<'_>, kind: &T, what: &'static str) -> bool {
    if peek(i).kind == *kind {
        bump(i);
        true
    } else {
        expected(i, what);
        false
    }
}

fn expect(i: &mut In<'_>, kind: &T, what: &'static str) -> PResult<()> {
    if eat(i, kind, what) { Ok(()) } else { mismatch() }
}

/// [`expect`] as a winnow parser.
fn sym<'t>(kind: T, what: &'static str) -> impl Parser<In<'t>, (), ErrMode<Fail>> {
    move |i: &mut In<'t>| expect(i, &kind, what)
}

/// `( item, item, ... )`, at least one item.
fn list<'t, O>(item: impl Parser<In<'t>, O, ErrMode<Fail>>) -> impl Parser<In<'t>, Vec<O>, ErrMode<Fail>> {
    delimited(
        sym(T::LParen, "`(`"),
        separated(1.., item, sym(T::Comma, "`,`")),
        sym(T::RParen, "`)`"),
    )
}

fn is_word(tok: &Tok, w: &str) -> bool {
    matches!(&tok.kind, T::Word(x) if x == w)
}

/// Runs `f` one nesting level deeper (`pos` is the opening token).
fn nested<'t, O>(i: &mut In<'t>, pos: usize, f: impl FnOnce(&mut In<'t>) -> PResult<O>) -> PResult<O> {
    let depth = i.state.nesting.get() + 1;
    if depth > MAX_NESTING {
        return custom(pos, format!("query nests deeper than {MAX_NESTING} levels"));
    }
    i.state.nesting.set(depth);
    let out = f(i);
    i.state.nesting.set(depth - 1);
    out
}

fn check_depth(depth: usize, pos: usize) -> PResult<usize> {
    if depth > MAX_TREE_DEPTH {
        return custom(pos, format!("expression is more than {MAX_TREE_DEPTH} operators deep"));
    }
    Ok(depth)
}

fn root(i: &mut In<'_>) -> PResult<Query> {
    let (expr, _) = pipeline(i, true)?;
    let hints = hints(i)?;
    if peek(i).kind != T::Eof {
        expected(i, "end of query");
        return mismatch();
    }
    Ok(Query { expr, hints })
}

/// What starts a pipeline: a spanset expression or a stage.
enum Element {
    Spanset(Deep<SpansetExpr>),
    Stage(Deep<Stage>),
}

/// `element | element ...`; `top` for the query's own pipeline, the only
/// one a metrics function may end.
fn pipeline(i: &mut In<'_>, top: bool) -> PResult<Deep<SpansetExpr>> {
    let mut stages = Vec::new();
    let (input, mut depth) = match element(i, true, top)? {
        Element::Spanset(e) => e,
        Element::Stage((stage, d)) => {
            stages.push(stage);
            (SpansetExpr::Filter(FieldExpr::Static(Static::Bool(true))), d)
        }
    };
    while !matches!(stages.last(), Some(Stage::Metrics(_))) && eat(i, &T::Op(Op::Pipe), "`|`") {
        let (stage, d) = match element(i, false, top)? {
            Element::Spanset((e, d)) => (Stage::Filter(e), d),
            Element::Stage(s) => s,
        };
        stages.push(stage);
        depth = depth.max(d);
    }
    if stages.is_empty() {
        return Ok((input, depth));
    }
    Ok((SpansetExpr::Pipeline(Box::new(input), stages), depth + 1))
}

const METRICS_FNS: &[&str] = &[
    "rate",
    "count_over_time",
    "min_over_time",
    "max_over_time",
    "avg_over_time",
    "sum_over_time",
    "quantile_over_time",
    "histogram_over_time",
    "compare",
];

fn element(i: &mut In<'_>, first: bool, top: bool) -> PResult<Element> {
    let tok = peek(i);
    let pos = tok.start;
    match &tok.kind {
        T::Word(w) if w == "by" => return by_stage(i).map(Element::Stage),
        T::Word(w) if w == "select" => return select_stage(i).map(Element::Stage),
        T::Word(w) if w == "coalesce" => {
            if first {
                return custom(pos, "a pipeline cannot start with coalesce()");
            }
            bump(i);
            expect(i, &T::LParen, "`(`")?;
            expect(i, &T::RParen, "`)`")?;
            return Ok(Element::Stage((Stage::Coalesce, 1)));
        }
        T::Word(w) if METRICS_FNS.contains(&w.as_str()) => {
            if first {
                return custom(
                    pos,
                    format!("{w}() needs spans to work on: write `{{ ... }} | {w}(...)`"),
                );
            }
            if !top {
                return custom(
                    pos,
                    format!("{w}() must be the last stage of the whole query (metrics arithmetic is not supported)"),
                );
            }
            return metrics_stage(i).map(|m| Element::Stage((Stage::Metrics(m), 1)));
        }
        T::Word(w) if w == "topk" || w == "bottomk" => {
            return custom(pos, format!("{w}() can only follow a metrics function such as rate()"));
        }
        _ => {}
    }
    if starts_scalar(i) {
        return scalar_filter(i).map(Element::Stage);
    }
    match &tok.kind {
        T::LBrace | T::LParen => spanset_expr(i).map(Element::Spanset),
        T::Word(w) if peek_nth(i, 1).kind == T::LParen => custom(pos, format!("unknown function `{w}`")),
        _ => {
            if first {
                expected(i, "`{`");
                expected(i, "`(`");
            } else {
                expected(i, "`{`, `(`, an aggregate or a pipeline function");
            }
            mismatch()
        }
    }
}

/// Whether a scalar filter starts here (after any `(`): an aggregate, a
/// number or a `-`.
fn starts_scalar(i: &In<'_>) -> bool {
    let mut tokens = i.iter_offsets().map(|(_, t)| t);
    match tokens.find(|t| t.kind != T::LParen).map(|t| &t.kind) {
        Some(T::Word(w)) => matches!(w.as_str(), "count" | "avg" | "min" | "max" | "sum"),
        Some(T::Int(_) | T::Float(_) | T::Duration(_) | T::Op(Op::Sub)) => true,
        _ => false,
    }
}

// -- spanset expressions

/// `&&` and `||` (one level, left to right) over structural expressions.
fn spanset_expr(i: &mut In<'_>) -> PResult<Deep<SpansetExpr>> {
    let (mut lhs, mut depth) = spanset_structural(i)?;
    loop {
        let tok = peek(i);
        let or = match tok.kind {
            T::Op(Op::And) => false,
            T::Op(Op::Or) => true,
            _ => {
                expected(i, "an operator");
                return Ok((lhs, depth));
            }
        };
        bump(i);
        let (rhs, d) = spanset_structural(i)?;
        depth = check_depth(1 + depth.max(d), tok.start)?;
        let (l, r) = (Box::new(lhs), Box::new(rhs));
        lhs = if or {
            SpansetExpr::Or(l, r)
        } else {
            SpansetExpr::And(l, r)
        };
    }
}

fn struct_op(op: Op) -> Option<StructOp> {
    Some(match op {
        Op::Gt => StructOp::Child,
        Op::Lt => StructOp::Parent,
        Op::Desc => StructOp::Descendant,
        Op::Anc => StructOp::Ancestor,
        Op::Tilde => StructOp::Sibling,
        Op::NotChild => StructOp::NotChild,
        Op::NotParent => StructOp::NotParent,
        Op::NotDesc => StructOp::NotDescendant,
        Op::NotAnc => StructOp::NotAncestor,
        Op::NotRe => StructOp::NotSibling,
        Op::UnionChild => StructOp::UnionChild,
        Op::UnionParent => StructOp::UnionParent,
        Op::UnionDesc => StructOp::UnionDescendant,
        Op::UnionAnc => StructOp::UnionAncestor,
        Op::UnionSibl => StructOp::UnionSibling,
        _ => return None,
    })
}

/// Structural operators, all one level, left to right.
fn spanset_structural(i: &mut In<'_>) -> PResult<Deep<SpansetExpr>> {
    let (mut lhs, mut depth) = spanset_operand(i)?;
    loop {
        let tok = peek(i);
        let Some(op) = (match tok.kind {
            T::Op(op) => struct_op(op),
            _ => None,
        }) else {
            expected(i, "an operator");
            return Ok((lhs, depth));
        };
        bump(i);
        let (rhs, d) = spanset_operand(i)?;
        depth = check_depth(1 + depth.max(d), tok.start)?;
        lhs = SpansetExpr::Structural {
            op,
            lhs: Box::new(lhs),
            rhs: Box::new(rhs),
        };
    }
}

/// `{ ... }` or `( pipeline )`.
fn spanset_operand(i: &mut In<'_>) -> PResult<Deep<SpansetExpr>> {
    let tok = peek(i);
    match tok.kind {
        T::LBrace => spanset_filter(i).map(|(f, d)| (SpansetExpr::Filter(f), d + 1)),
        T::LParen => {
            bump(i);
            nested(i, tok.start, |i| {
                let inner = pipeline(i, false)?;
                expect(i, &T::RParen, "`)`")?;
                Ok(inner)
            })
        }
        _ => {
            expected(i, "`{`");
            expected(i, "`(`");
            mismatch()
        }
    }
}

/// `{ field }`; `{}` is `true`.
fn spanset_filter(i: &mut In<'_>) -> PResult<Deep<FieldExpr>> {
    let tok = peek(i);
    expect(i, &T::LBrace, "`{`")?;
    nested(i, tok.start, |i| {
        if eat(i, &T::RBrace, "`}`") {
            return Ok((FieldExpr::Static(Static::Bool(true)), 1));
        }
        let inner = field_expr(i)?;
        expect(i, &T::RBrace, "`}`")?;
        Ok(inner)
    })
}

// -- field expressions

const PREC_ADD: u8 = 3;
const PREC_NOT: u8 = 4;

/// The binary operators of field expressions: precedence (higher binds
/// tighter) and right-associativity, per Tempo's `expr.y`.
fn field_op(kind: &T) -> Option<(BinOp, u8, bool)> {
    let T::Op(op) = kind else { return None };
    Some(match op {
        Op::And => (BinOp::And, 1, false),
        Op::Or => (BinOp::Or, 1, false),
        Op::Eq => (BinOp::Cmp(CmpOp::Eq), 2, false),
        Op::Ne => (BinOp::Cmp(CmpOp::Ne), 2, false),
        Op::Lt => (BinOp::Cmp(CmpOp::Lt), 2, false),
        Op::Le => (BinOp::Cmp(CmpOp::Le), 2, false),
        Op::Gt => (BinOp::Cmp(CmpOp::Gt), 2, false),
        Op::Ge => (BinOp::Cmp(CmpOp::Ge), 2, false),
        Op::Re => (BinOp::Re, 2, false),
        Op::NotRe => (BinOp::NotRe, 2, false),
        Op::Add => (BinOp::Arith(ArithOp::Add), PREC_ADD, false),
        Op::Sub => (BinOp::Arith(ArithOp::Sub), PREC_ADD, false),
        Op::Mul => (BinOp::Arith(ArithOp::Mul), 5, false),
        Op::Div => (BinOp::Arith(ArithOp::Div), 5, false),
        Op::Mod => (BinOp::Arith(ArithOp::Mod), 5, false),
        Op::Pow => (BinOp::Arith(ArithOp::Pow), 6, true),
        _ => return None,
    })
}

/// What may stand on either side of a field operator.
const OPERAND: &str = "an operand (attribute or value)";

const NIL_ONLY_COMPARED: &str = "`nil` can only be compared with `=` or `!=`";

fn is_nil(e: &FieldExpr) -> bool {
    *e == FieldExpr::Static(Static::Nil)
}

/// A whole field expression (not a bare `nil`).
fn field_expr(i: &mut In<'_>) -> PResult<Deep<FieldExpr>> {
    let pos = peek(i).start;
    let e = field_prec(i, 0)?;
    if is_nil(&e.0) {
        return custom(pos, NIL_ONLY_COMPARED);
    }
    Ok(e)
}

/// Precedence climbing: operators binding at least as tight as `min`.
fn field_prec(i: &mut In<'_>, min: u8) -> PResult<Deep<FieldExpr>> {
    let (mut lhs, mut depth) = field_prefix(i)?;
    loop {
        let tok = peek(i);
        let Some((op, prec, right)) = field_op(&tok.kind) else {
            expected(i, "an operator");
            return Ok((lhs, depth));
        };
        if prec < min {
            return Ok((lhs, depth));
        }
        bump(i);
        let rhs_pos = peek(i).start;
        let (rhs, d) = field_prec(i, if right { prec } else { prec + 1 })?;
        if !matches!(op, BinOp::Cmp(CmpOp::Eq | CmpOp::Ne)) {
            if is_nil(&lhs) {
                return custom(tok.start, NIL_ONLY_COMPARED);
            }
            if is_nil(&rhs) {
                return custom(rhs_pos, NIL_ONLY_COMPARED);
            }
        }
        depth = check_depth(1 + depth.max(d), tok.start)?;
        lhs = FieldExpr::Binary {
            op,
            lhs: Box::new(lhs),
            rhs: Box::new(rhs),
        };
    }
}

/// Prefix operators, parentheses and operands. `!x` takes in `*`, `/`,
/// `%` and `^` (`!.a * 2` is `!(.a * 2)`), `-x` those and nothing else
/// (`-.a + 1` is `(-.a) + 1`), as in Tempo.
fn field_prefix(i: &mut In<'_>) -> PResult<Deep<FieldExpr>> {
    let tok = peek(i);
    match tok.kind {
        T::Op(Op::Not) | T::Op(Op::Sub) => {
            bump(i);
            let not = tok.kind == T::Op(Op::Not);
            let min = if not { PREC_NOT + 1 } else { PREC_ADD + 1 };
            let (e, d) = nested(i, tok.start, |i| field_prec(i, min))?;
            if is_nil(&e) {
                return custom(tok.start, NIL_ONLY_COMPARED);
            }
            let depth = check_depth(d + 1, tok.start)?;
            if not {
                return Ok((FieldExpr::Not(Box::new(e)), depth));
            }
            Ok(match e {
                FieldExpr::Static(s) => match negate(s) {
                    Ok(s) => (FieldExpr::Static(s), d),
                    Err(s) => (FieldExpr::Neg(Box::new(FieldExpr::Static(s))), depth),
                },
                e => (FieldExpr::Neg(Box::new(e)), depth),
            })
        }
        T::LParen => {
            bump(i);
            nested(i, tok.start, |i| {
                let inner = field_expr(i)?;
                expect(i, &T::RParen, "`)`")?;
                Ok(inner)
            })
        }
        _ => field_operand(i).map(|e| (e, 1)),
    }
}

/// `-literal` folded into a negative literal; `Err` gives back what does
/// not fold.
fn negate(s: Static) -> Result<Static, Static> {
    match s {
        Static::Int(n) => n.checked_neg().map(Static::Int).ok_or(Static::Int(n)),
        Static::Float(f) => Ok(Static::Float(-f)),
        Static::Duration(d) => d.checked_neg().map(Static::Duration).ok_or(Static::Duration(d)),
        s => Err(s),
    }
}

fn field_operand(i: &mut In<'_>) -> PResult<FieldExpr> {
    let tok = peek(i);
    let e = match &tok.kind {
        T::Word(w) => match word_operand(w) {
            Some(e) => e,
            None if w.starts_with("nestedSet") => {
                return custom(tok.start, format!("`{w}` is internal to Tempo and not supported"));
            }
            None => {
                return custom(
                    tok.start,
                    format!("unknown identifier `{w}`: attributes are written `.{w}`, `span.{w}` or `resource.{w}`"),
                );
            }
        },
        T::Attr(a) => FieldExpr::Attr(a.clone()),
        T::Intrinsic(x) => FieldExpr::Attr(Attribute::Intrinsic(*x)),
        kind => match literal_static(kind) {
            Some(s) => FieldExpr::Static(s),
            None => {
                expected(i, OPERAND);
                return mismatch();
            }
        },
    };
    bump(i);
    Ok(e)
}

/// A keyword operand: a value, an intrinsic, `minInt`/`maxInt`.
fn word_operand(w: &str) -> Option<FieldExpr> {
    if let Some(intrinsic) = Intrinsic::from_word(w) {
        return Some(FieldExpr::Attr(Attribute::Intrinsic(intrinsic)));
    }
    keyword_static(w).map(FieldExpr::Static)
}

fn keyword_static(w: &str) -> Option<Static> {
    Some(match w {
        "true" => Static::Bool(true),
        "false" => Static::Bool(false),
        "nil" => Static::Nil,
        "error" => Static::Status(Status::Error),
        "ok" => Static::Status(Status::Ok),
        "unset" => Static::Status(Status::Unset),
        "unspecified" => Static::Kind(Kind::Unspecified),
        "internal" => Static::Kind(Kind::Internal),
        "server" => Static::Kind(Kind::Server),
        "client" => Static::Kind(Kind::Client),
        "producer" => Static::Kind(Kind::Producer),
        "consumer" => Static::Kind(Kind::Consumer),
        "minInt" => Static::Int(i64::MIN),
        "maxInt" => Static::Int(i64::MAX),
        _ => return None,
    })
}

fn literal_static(kind: &T) -> Option<Static> {
    Some(match kind {
        T::Str(s) => Static::Str(s.clone()),
        T::Int(n) => Static::Int(*n),
        T::Float(f) => Static::Float(*f),
        T::Duration(d) => Static::Duration(*d),
        _ => return None,
    })
}

/// An attribute or intrinsic, as `select(...)`, `by (...)` and the
/// metrics functions take them.
fn attribute(i: &mut In<'_>) -> PResult<Attribute> {
    let tok = peek(i);
    let a = match &tok.kind {
        T::Attr(a) => a.clone(),
        T::Intrinsic(x) => Attribute::Intrinsic(*x),
        T::Word(w) if let Some(x) = Intrinsic::from_word(w) => Attribute::Intrinsic(x),
        _ => {
            expected(i, "an attribute");
            return mismatch();
        }
    };
    bump(i);
    Ok(a)
}

// -- stages

fn by_stage(i: &mut In<'_>) -> PResult<Deep<Stage>> {
    bump(i);
    let tok = peek(i);
    expect(i, &T::LParen, "`(`")?;
    let (e, d) = nested(i, tok.start, field_expr)?;
    expect(i, &T::RParen, "`)`")?;
    Ok((Stage::By(e), d + 1))
}

fn select_stage(i: &mut In<'_>) -> PResult<Deep<Stage>> {
    bump(i);
    Ok((Stage::Select(list(attribute).parse_next(i)?), 1))
}

fn cmp_op(kind: &T) -> Option<CmpOp> {
    Some(match kind {
        T::Op(Op::Eq) => CmpOp::Eq,
        T::Op(Op::Ne) => CmpOp::Ne,
        T::Op(Op::Lt) => CmpOp::Lt,
        T::Op(Op::Le) => CmpOp::Le,
        T::Op(Op::Gt) => CmpOp::Gt,
        T::Op(Op::Ge) => CmpOp::Ge,
        _ => None?,
    })
}

const COMPARISON: &str = "a comparison (`=`, `!=`, `<`, `<=`, `>`, `>=`)";

/// `scalar cmp scalar` with an aggregate on at least one side.
fn scalar_filter(i: &mut In<'_>) -> PResult<Deep<Stage>> {
    let pos = peek(i).start;
    let (lhs, ld, lagg) = scalar_expr(i, 0)?;
    let Some(op) = cmp_op(&peek(i).kind) else {
        expected(i, COMPARISON);
        return mismatch();
    };
    bump(i);
    let (rhs, rd, ragg) = scalar_expr(i, 0)?;
    if !lagg && !ragg {
        return custom(
            pos,
            "a scalar filter compares an aggregate: count(), avg(x), min(x), max(x) or sum(x)",
        );
    }
    Ok((Stage::Scalar { lhs, op, rhs }, 1 + ld.max(rd)))
}

fn scalar_op(kind: &T) -> Option<(ArithOp, u8, bool)> {
    Some(match kind {
        T::Op(Op::Add) => (ArithOp::Add, 1, false),
        T::Op(Op::Sub) => (ArithOp::Sub, 1, false),
        T::Op(Op::Mul) => (ArithOp::Mul, 2, false),
        T::Op(Op::Div) => (ArithOp::Div, 2, false),
        T::Op(Op::Mod) => (ArithOp::Mod, 2, false),
        T::Op(Op::Pow) => (ArithOp::Pow, 3, true),
        _ => None?,
    })
}

/// An arithmetic expression over aggregates and numbers; the flag says
/// whether it holds an aggregate. Unary `-` applies to numbers only and
/// binds tightest (`-2 ^ 2` is 4), as in Tempo.
fn scalar_expr(i: &mut In<'_>, min: u8) -> PResult<(ScalarExpr, usize, bool)> {
    let (mut lhs, mut depth, mut agg) = scalar_prefix(i)?;
    loop {
        let tok = peek(i);
        let Some((op, prec, right)) = scalar_op(&tok.kind) else {
            return Ok((lhs, depth, agg));
        };
        if prec < min {
            return Ok((lhs, depth, agg));
        }
        bump(i);
        let (rhs, d, ragg) = scalar_expr(i, if right { prec } else { prec + 1 })?;
        depth = check_depth(1 + depth.max(d), tok.start)?;
        agg |= ragg;
        lhs = ScalarExpr::Binary {
            op,
            lhs: Box::new(lhs),
            rhs: Box::new(rhs),
        };
    }
}

fn scalar_prefix(i: &mut In<'_>) -> PResult<(ScalarExpr, usize, bool)> {
    let tok = peek(i);
    let aggregate = |i: &mut In<'_>, make: fn(FieldExpr) -> Aggregate| -> PResult<(ScalarExpr, usize, bool)> {
        bump(i);
        let open = peek(i);
        expect(i, &T::LParen, "`(`")?;
        let (e, d) = nested(i, open.start, field_expr)?;
        expect(i, &T::RParen, "`)`")?;
        Ok((ScalarExpr::Aggregate(make(e)), d + 1, true))
    };
    match &tok.kind {
        T::Op(Op::Sub) => {
            bump(i);
            let (e, d, agg) = nested(i, tok.start, |i| scalar_prefix(i))?;
            if agg {
                return custom(tok.start, "`-` applies to numbers, not to aggregates");
            }
            let depth = check_depth(d + 1, tok.start)?;
            Ok(match e {
                ScalarExpr::Static(s) => match negate(s) {
                    Ok(s) => (ScalarExpr::Static(s), d, false),
                    Err(s) => (ScalarExpr::Neg(Box::new(ScalarExpr::Static(s))), depth, false),
                },
                e => (ScalarExpr::Neg(Box::new(e)), depth, false),
            })
        }
        T::LParen => {
            bump(i);
            nested(i, tok.start, |i| {
                let inner = scalar_expr(i, 0)?;
                expect(i, &T::RParen, "`)`")?;
                Ok(inner)
            })
        }
        T::Int(n) => {
            bump(i);
            Ok((ScalarExpr::Static(Static::Int(*n)), 1, false))
        }
        T::Float(f) => {
            bump(i);
            Ok((ScalarExpr::Static(Static::Float(*f)), 1, false))
        }
        T::Duration(d) => {
            bump(i);
            Ok((ScalarExpr::Static(Static::Duration(*d)), 1, false))
        }
        T::Word(w) if w == "count" => {
            bump(i);
            expect(i, &T::LParen, "`(`")?;
            expect(i, &T::RParen, "`)`")?;
            Ok((ScalarExpr::Aggregate(Aggregate::Count), 1, true))
        }
        T::Word(w) if w == "avg" => aggregate(i, Aggregate::Avg),
        T::Word(w) if w == "min" => aggregate(i, Aggregate::Min),
        T::Word(w) if w == "max" => aggregate(i, Aggregate::Max),
        T::Word(w) if w == "sum" => aggregate(i, Aggregate::Sum),
        _ => {
            expected(i, "a number or an aggregate such as count()");
            mismatch()
        }
    }
}

// -- metrics

fn metrics_stage(i: &mut In<'_>) -> PResult<MetricsStage> {
    let tok = peek(i);
    let T::Word(name) = &tok.kind else { return mismatch() };
    bump(i);
    expect(i, &T::LParen, "`(`")?;
    let func = match name.as_str() {
        "rate" => MetricsFn::Rate,
        "count_over_time" => MetricsFn::CountOverTime,
        "min_over_time" => MetricsFn::MinOverTime(attribute(i)?),
        "max_over_time" => MetricsFn::MaxOverTime(attribute(i)?),
        "avg_over_time" => MetricsFn::AvgOverTime(attribute(i)?),
        "sum_over_time" => MetricsFn::SumOverTime(attribute(i)?),
        "histogram_over_time" => MetricsFn::HistogramOverTime(attribute(i)?),
        "quantile_over_time" => {
            let attr = attribute(i)?;
            expect(i, &T::Comma, "`,`")?;
            let quantiles = separated(1.., quantile, sym(T::Comma, "`,`")).parse_next(i)?;
            MetricsFn::QuantileOverTime { attr, quantiles }
        }
        "compare" => {
            let (filter, _) = spanset_filter(i)?;
            let (mut topn, mut start, mut end) = (10, 0, 0);
            if eat(i, &T::Comma, "`,`") {
                topn = integer(i)?;
                if eat(i, &T::Comma, "`,`") {
                    start = integer(i)?;
                    expect(i, &T::Comma, "`,`")?;
                    end = integer(i)?;
                }
            }
            MetricsFn::Compare {
                filter,
                topn,
                start,
                end,
            }
        }
        _ => return mismatch(),
    };
    expect(i, &T::RParen, "`)`")?;
    let mut by = Vec::new();
    if is_word(peek(i), "by") && !matches!(func, MetricsFn::Compare { .. }) {
        bump(i);
        by = list(attribute).parse_next(i)?;
    }
    let mut second = Vec::new();
    loop {
        let tok = peek(i);
        if let Some(op) = cmp_op(&tok.kind) {
            bump(i);
            let (value, _, agg) = scalar_expr(i, 0)?;
            if agg {
                return custom(tok.start, "a metrics filter compares with a number, not an aggregate");
            }
            second.push(SecondStage::Filter { op, value });
        } else if eat(i, &T::Op(Op::Pipe), "`|`") {
            let f = peek(i);
            let top = is_word(f, "topk");
            if !top && !is_word(f, "bottomk") {
                return custom(f.start, "only topk() or bottomk() can follow a metrics function");
            }
            bump(i);
            expect(i, &T::LParen, "`(`")?;
            let n = integer(i)?;
            expect(i, &T::RParen, "`)`")?;
            second.push(if top {
                SecondStage::TopK(n)
            } else {
                SecondStage::BottomK(n)
            });
        } else {
            expected(i, COMPARISON);
            return Ok(MetricsStage { func, by, second });
        }
    }
}

fn integer(i: &mut In<'_>) -> PResult<i64> {
    match peek(i).kind {
        T::Int(n) => {
            bump(i);
            Ok(n)
        }
        _ => {
            expected(i, "an integer");
            mismatch()
        }
    }
}

fn quantile(i: &mut In<'_>) -> PResult<f64> {
    let q = match peek(i).kind {
        T::Int(n) => n as f64,
        T::Float(f) => f,
        _ => {
            expected(i, "a number");
            return mismatch();
        }
    };
    bump(i);
    Ok(q)
}

// -- hints

/// `with(name=value, ...)`
fn hints(i: &mut In<'_>) -> PResult<Vec<Hint>> {
    if !is_word(peek(i), "with") {
        expected(i, "`with`");
        return Ok(Vec::new());
    }
    bump(i);
    list(hint).parse_next(i)
}

fn hint(i: &mut In<'_>) -> PResult<Hint> {
    let T::Word(name) = &peek(i).kind else {
        expected(i, "a hint name");
        return mismatch();
    };
    bump(i);
    expect(i, &T::Op(Op::Eq), "`=`")?;
    let tok = peek(i);
    let value = match &tok.kind {
        T::Word(w) => keyword_static(w).filter(|s| *s != Static::Nil),
        kind => literal_static(kind),
    };
    let Some(value) = value else {
        expected(i, "a value");
        return mismatch();
    };
    bump(i);
    Ok(Hint {
        name: name.clone(),
        value,
    })
}

#[cfg(test)]
mod tests;
