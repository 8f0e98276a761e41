//! LogQL's tokens: the first half of [`super::parse`].
//!
//! Whitespace and `#` comments (to the end of the line, as Loki's lexer
//! and Grafana's grammar skip them) separate tokens. Strings are decoded
//! here, with Go's escapes, so the parser only sees their values. A run
//! that starts with a digit (`5`, `1.5e3`, `0x1f`, `250ms`, `1h30m`,
//! `20MB`, also a wrong `5x`) is one [`Kind::Num`] token: what it means
//! (number, duration or byte size) depends on where it stands, and the
//! parser decides it there.

use winnow::combinator::{alt, repeat};
use winnow::error::{ErrMode, ParserError};
use winnow::stream::{LocatingSlice, Location, Stream};
use winnow::token::{any, literal, take_till, take_while};
use winnow::{ModalResult, Parser};

/// Operators and brackets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum P {
    LBrace,
    RBrace,
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    /// `=`
    Eq,
    /// `==`
    EqEq,
    /// `!=`
    Ne,
    /// `=~`
    Re,
    /// `!~`
    NotRe,
    /// `|=`
    PipeEq,
    /// `|~`
    PipeRe,
    /// `|>`
    PipeGt,
    /// `!>`
    NotGt,
    Pipe,
    Lt,
    Le,
    Gt,
    Ge,
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
}

/// Operators by their text, longest first so that `|=` wins over `|`.
const PUNCT: [(&str, P); 27] = [
    ("|=", P::PipeEq),
    ("|~", P::PipeRe),
    ("|>", P::PipeGt),
    ("!=", P::Ne),
    ("!~", P::NotRe),
    ("!>", P::NotGt),
    ("=~", P::Re),
    ("==", P::EqEq),
    ("<=", P::Le),
    (">=", P::Ge),
    ("|", P::Pipe),
    ("=", P::Eq),
    ("<", P::Lt),
    (">", P::Gt),
    ("{", P::LBrace),
    ("}", P::RBrace),
    ("(", P::LParen),
    (")", P::RParen),
    ("[", P::LBracket),
    ("]", P::RBracket),
    (",", P::Comma),
    ("+", P::Add),
    ("-", P::Sub),
    ("*", P::Mul),
    ("/", P::Div),
    ("%", P::Mod),
    ("^", P::Pow),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `[A-Za-z_:][A-Za-z0-9_:]*`: a label name or a keyword (keywords
    /// are told apart by the parser, case-insensitively as Loki does).
    Ident,
    /// A run starting with a digit (or `.` and a digit).
    Num,
    /// A string; the value is `Lexed::strings[n]`.
    Str(u32),
    /// `--strict`, `--keep-empty` (any `--word`; the parser checks it).
    Flag,
    P(P),
    /// After the last token; its `start` is the query's length.
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tok<'a> {
    pub kind: Kind,
    /// The token's source text (a string's, quotes and all).
    pub text: &'a str,
    /// Byte offset in the query.
    pub start: usize,
}

/// Why lexing or parsing stopped, and where (byte offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fail {
    pub pos: usize,
    pub reason: String,
}

impl Fail {
    pub(super) fn at(pos: usize, reason: impl Into<String>) -> ErrMode<Self> {
        ErrMode::Cut(Self {
            pos,
            reason: reason.into(),
        })
    }
}

type Src<'a> = LocatingSlice<&'a str>;

/// What is left of the query.
fn remaining<'a>(i: &Src<'a>) -> &'a str {
    **i
}

impl<'a> ParserError<Src<'a>> for Fail {
    type Inner = Self;

    fn from_input(input: &Src<'a>) -> Self {
        let pos = input.current_token_start();
        match input.peek_token() {
            Some(c) => Self {
                pos,
                reason: format!("unexpected character \"{c}\""),
            },
            None => Self {
                pos,
                reason: "unexpected end of query".into(),
            },
        }
    }

    fn into_inner(self) -> Result<Self, Self> {
        Ok(self)
    }
}

type LResult<T> = ModalResult<T, Fail>;

/// A query's tokens, ending with one [`Kind::Eof`], and its decoded strings.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Lexed<'a> {
    pub toks: Vec<Tok<'a>>,
    pub strings: Vec<String>,
}

pub(super) fn lex(query: &str) -> Result<Lexed<'_>, Fail> {
    let mut input = LocatingSlice::new(query);
    let mut out = Lexed {
        toks: Vec::new(),
        strings: Vec::new(),
    };
    let result = (|| -> LResult<()> {
        loop {
            trivia(&mut input)?;
            let start = input.current_token_start();
            if input.is_empty() {
                out.toks.push(Tok {
                    kind: Kind::Eof,
                    text: "",
                    start,
                });
                return Ok(());
            }
            let kind = token(&mut input, &mut out.strings)?;
            let end = input.current_token_start();
            out.toks.push(Tok {
                kind,
                text: &query[start..end],
                start,
            });
        }
    })();
    match result {
        Ok(()) => Ok(out),
        Err(e) => Err(e.into_inner().unwrap_or_else(|_| Fail {
            pos: query.len(),
            reason: "unexpected end of query".into(),
        })),
    }
}

/// Whitespace and `#` comments.
fn trivia(i: &mut Src<'_>) -> LResult<()> {
    repeat(
        0..,
        alt((
            take_while(1.., char::is_whitespace).void(),
            ('#', take_till(0.., '\n')).void(),
        )),
    )
    .parse_next(i)
}

fn token(i: &mut Src<'_>, strings: &mut Vec<String>) -> LResult<Kind> {
    let start = i.current_token_start();
    let rest = remaining(i);
    let mut chars = rest.chars();
    let (c0, c1, c2) = (chars.next(), chars.next(), chars.next());
    match c0 {
        Some('"') => {
            let s = quoted(i)?;
            strings.push(s);
            Ok(Kind::Str(index(strings.len() - 1, start)?))
        }
        Some('`') => {
            let s = raw(i)?;
            strings.push(s);
            Ok(Kind::Str(index(strings.len() - 1, start)?))
        }
        Some(c) if c.is_ascii_digit() => number(i).map(|()| Kind::Num),
        Some('.') if c1.is_some_and(|c| c.is_ascii_digit()) => number(i).map(|()| Kind::Num),
        Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
            take_while(1.., |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                .void()
                .parse_next(i)?;
            Ok(Kind::Ident)
        }
        Some('-') if c1 == Some('-') && c2.is_some_and(|c| c.is_ascii_alphabetic()) => {
            (
                "--",
                take_while(1.., |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            )
                .void()
                .parse_next(i)?;
            Ok(Kind::Flag)
        }
        _ => {
            for (text, p) in PUNCT {
                if rest.starts_with(text) {
                    literal(text).void().parse_next(i)?;
                    return Ok(Kind::P(p));
                }
            }
            Err(ParserError::from_input(i))
        }
    }
}

fn index(n: usize, pos: usize) -> LResult<u32> {
    u32::try_from(n).map_err(|_| Fail::at(pos, "too many strings"))
}

/// Digits, letters, `.`, `_` and `µ` glued together, with an exponent's
/// sign (`1e-3`).
fn number(i: &mut Src<'_>) -> LResult<()> {
    let glued = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == 'µ' || c == 'μ';
    loop {
        let run: &str = take_while(0.., glued).parse_next(i)?;
        let rest = remaining(i);
        let mut next = rest.chars();
        let exponent = run.ends_with(['e', 'E'])
            && run[..run.len() - 1].chars().all(|c| c.is_ascii_digit() || c == '.')
            && matches!(next.next(), Some('+' | '-'))
            && next.next().is_some_and(|c| c.is_ascii_digit());
        if !exponent {
            return Ok(());
        }
        any.void().parse_next(i)?;
    }
}

/// A double-quoted string with Go's escapes (as `strconv.Unquote`).
fn quoted(i: &mut Src<'_>) -> LResult<String> {
    let open = i.current_token_start();
    '"'.parse_next(i)?;
    let mut bytes = Vec::new();
    loop {
        let plain: &str = take_till(0.., ['"', '\\', '\n']).parse_next(i)?;
        bytes.extend_from_slice(plain.as_bytes());
        let at = i.current_token_start();
        match i.next_token() {
            None => return Err(Fail::at(open, "unterminated string")),
            Some('"') => break,
            Some('\n') => return Err(Fail::at(at, "newline in string (use \\n, or a `raw string`)")),
            Some(_) => escape(i, at, &mut bytes)?,
        }
    }
    String::from_utf8(bytes).map_err(|_| Fail::at(open, "string is not valid UTF-8"))
}

/// After a `\` at `at`.
fn escape(i: &mut Src<'_>, at: usize, out: &mut Vec<u8>) -> LResult<()> {
    let Some(c) = i.next_token() else {
        return Err(Fail::at(at, "unterminated string"));
    };
    let simple = match c {
        'a' => Some(0x07),
        'b' => Some(0x08),
        'f' => Some(0x0c),
        'n' => Some(b'\n'),
        'r' => Some(b'\r'),
        't' => Some(b'\t'),
        'v' => Some(0x0b),
        '\\' => Some(b'\\'),
        '"' => Some(b'"'),
        _ => None,
    };
    if let Some(b) = simple {
        out.push(b);
        return Ok(());
    }
    let digits = |n: usize, radix: u32, i: &mut Src<'_>| -> LResult<u32> {
        let rest = remaining(i);
        let text = rest.get(..n).filter(|t| t.chars().all(|c| c.is_digit(radix)));
        match text.and_then(|t| u32::from_str_radix(t, radix).ok()) {
            Some(v) => {
                winnow::token::take(n).void().parse_next(i)?;
                Ok(v)
            }
            None => Err(Fail::at(
                at,
                format!(
                    "invalid escape \\{c}: expected {n} {} digits",
                    if radix == 8 { "octal" } else { "hex" }
                ),
            )),
        }
    };
    match c {
        'x' => out.push(low_byte(digits(2, 16, i)?)),
        '0'..='7' => {
            let rest = remaining(i);
            let text: String = std::iter::once(c).chain(rest.chars().take(2)).collect();
            match u8::from_str_radix(&text, 8) {
                Ok(v) if text.len() == 3 => {
                    winnow::token::take(2usize).void().parse_next(i)?;
                    out.push(v);
                }
                _ => {
                    return Err(Fail::at(
                        at,
                        format!("invalid escape \\{text}: expected 3 octal digits up to \\377"),
                    ));
                }
            }
        }
        'u' | 'U' => {
            let v = digits(if c == 'u' { 4 } else { 8 }, 16, i)?;
            let ch = char::from_u32(v)
                .ok_or_else(|| Fail::at(at, format!("invalid escape \\{c}{v:x}: not a Unicode scalar value")))?;
            let mut buf = [0; 4];
            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        }
        other => return Err(Fail::at(at, format!("unknown escape \\{other}"))),
    }
    Ok(())
}

fn low_byte(v: u32) -> u8 {
    v.to_le_bytes()[0]
}

/// A backtick string: no escapes; carriage returns dropped, as Go does.
fn raw(i: &mut Src<'_>) -> LResult<String> {
    let open = i.current_token_start();
    '`'.parse_next(i)?;
    let body: &str = take_till(0.., '`').parse_next(i)?;
    if i.is_empty() {
        return Err(Fail::at(open, "unterminated string"));
    }
    '`'.parse_next(i)?;
    Ok(body.replace('\r', ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(q: &str) -> Vec<(Kind, &str)> {
        lex(q).expect("lexes").toks.iter().map(|t| (t.kind, t.text)).collect()
    }

    #[test]
    fn numbers_glue_units_and_exponents() {
        let toks = kinds("1h30m 1.5e-3 0x1F 20MB 5x .5");
        let texts: Vec<&str> = toks.iter().map(|t| t.1).collect();
        assert_eq!(texts, ["1h30m", "1.5e-3", "0x1F", "20MB", "5x", ".5", ""]);
        assert!(toks[..6].iter().all(|t| t.0 == Kind::Num));
    }

    #[test]
    fn operators_longest_first() {
        let toks = kinds("|= |~ |> | != !~ !> =~ == = <= < >= >");
        let ps: Vec<Kind> = toks.iter().map(|t| t.0).collect();
        use P::*;
        let want = [
            PipeEq, PipeRe, PipeGt, Pipe, Ne, NotRe, NotGt, Re, EqEq, Eq, Le, Lt, Ge, Gt,
        ];
        assert_eq!(ps[..want.len()], want.map(Kind::P));
    }

    #[test]
    fn strings_decode_go_escapes() {
        let lexed = lex(r#""a\"b\\c\n\t\u00e9\x41\101" `raw\n`"#).expect("lexes");
        assert_eq!(lexed.strings, ["a\"b\\c\n\té\x41A", "raw\\n"]);
        assert_eq!(
            lex(r#""\q""#).map_err(|e| e.reason),
            Err("unknown escape \\q".to_string())
        );
        assert_eq!(
            lex(r#"  "abc"#),
            Err(Fail {
                pos: 2,
                reason: "unterminated string".into()
            })
        );
        assert_eq!(
            lex("`abc"),
            Err(Fail {
                pos: 0,
                reason: "unterminated string".into()
            })
        );
        assert_eq!(
            lex(r#""\xff""#).map_err(|e| e.reason),
            Err("string is not valid UTF-8".to_string())
        );
    }

    #[test]
    fn comments_and_flags() {
        let toks = kinds("--strict # a comment\n--keep-empty 1 --5");
        let texts: Vec<&str> = toks.iter().map(|t| t.1).collect();
        assert_eq!(texts, ["--strict", "--keep-empty", "1", "-", "-", "5", ""]);
    }
}
