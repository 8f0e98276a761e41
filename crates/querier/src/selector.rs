//! The native API's attribute selector: `{name op "value", ...}` with `op`
//! one of `=`, `!=`, `=~`, `!~` (regexes are anchored, linear-time).
//! `resource.<key>` names a resource attribute, any other name a record
//! attribute (`attr.<key>` also names a record attribute, for keys that
//! start with `resource.`). Names are unquoted (`[A-Za-z0-9_./-]`) or
//! double-quoted; values are double-quoted with `\"` and `\\` escapes.

use mira_core::scan::{AttrMatcher, AttrScope, MatchOp, compile_regex};

use crate::QueryError;

/// Longest selector accepted, bytes.
pub const MAX_SELECTOR: usize = 64 * 1024;
/// Most matchers in one selector.
pub const MAX_MATCHERS: usize = 64;

/// Splits a selector name into its scope and attribute key.
pub fn scope_of(name: &str) -> (AttrScope, &str) {
    if let Some(k) = name.strip_prefix("resource.") {
        (AttrScope::Resource, k)
    } else if let Some(k) = name.strip_prefix("attr.") {
        (AttrScope::Record, k)
    } else {
        (AttrScope::Record, name)
    }
}

/// The selector name of an attribute key in a scope (inverse of
/// [`scope_of`]).
pub fn name_of(scope: AttrScope, key: &str) -> String {
    match scope {
        AttrScope::Resource => format!("resource.{key}"),
        _ if key.starts_with("resource.") || key.starts_with("attr.") => format!("attr.{key}"),
        _ => key.to_owned(),
    }
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, what: impl std::fmt::Display) -> QueryError {
        QueryError::BadRequest(format!("selector: {what} at byte {}", self.pos))
    }

    fn skip_ws(&mut self) {
        while self.s[self.pos..].starts_with(|c: char| c.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, tok: &str) -> bool {
        self.skip_ws();
        if self.s[self.pos..].starts_with(tok) {
            self.pos += tok.len();
            true
        } else {
            false
        }
    }

    fn quoted(&mut self) -> Result<String, QueryError> {
        self.skip_ws();
        if !self.s[self.pos..].starts_with('"') {
            return Err(self.err("expected a double-quoted string"));
        }
        self.pos += 1;
        let mut out = String::new();
        let mut chars = self.s[self.pos..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.pos += i + 1;
                    return Ok(out);
                }
                '\\' => match chars.next() {
                    Some((_, '"')) => out.push('"'),
                    Some((_, '\\')) => out.push('\\'),
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, 't')) => out.push('\t'),
                    Some((j, other)) => {
                        self.pos += j;
                        return Err(self.err(format!("unknown escape \\{other}")));
                    }
                    None => break,
                },
                c => out.push(c),
            }
        }
        self.pos = self.s.len();
        Err(self.err("unterminated string"))
    }

    fn name(&mut self) -> Result<String, QueryError> {
        self.skip_ws();
        if self.s[self.pos..].starts_with('"') {
            return self.quoted();
        }
        let rest = &self.s[self.pos..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')))
            .unwrap_or(rest.len());
        if len == 0 {
            return Err(self.err("expected an attribute name"));
        }
        self.pos += len;
        Ok(rest[..len].to_owned())
    }
}

/// Parses a selector; an empty string or `{}` selects everything.
pub fn parse(s: &str) -> Result<Vec<AttrMatcher>, QueryError> {
    if s.len() > MAX_SELECTOR {
        return Err(QueryError::BadRequest(format!(
            "selector is {} bytes; the limit is {MAX_SELECTOR}",
            s.len()
        )));
    }
    let mut p = Parser { s, pos: 0 };
    p.skip_ws();
    if p.pos == s.len() {
        return Ok(Vec::new());
    }
    if !p.eat("{") {
        return Err(p.err("expected '{'"));
    }
    let mut out = Vec::new();
    if p.eat("}") {
        return finish(p, out);
    }
    loop {
        let name = p.name()?;
        let op = if p.eat("=~") {
            "=~"
        } else if p.eat("!~") {
            "!~"
        } else if p.eat("!=") {
            "!="
        } else if p.eat("=") {
            "="
        } else {
            return Err(p.err("expected one of = != =~ !~"));
        };
        let value = p.quoted()?;
        let op = match op {
            "=" => MatchOp::Eq(value),
            "!=" => MatchOp::Ne(value),
            "=~" => MatchOp::Re(compile_regex(&value, true)?),
            _ => MatchOp::NotRe(compile_regex(&value, true)?),
        };
        let (scope, key) = scope_of(&name);
        out.push(AttrMatcher {
            scope,
            key: key.to_owned(),
            op,
        });
        if out.len() > MAX_MATCHERS {
            return Err(p.err(format!("more than {MAX_MATCHERS} matchers")));
        }
        if p.eat(",") {
            continue;
        }
        if p.eat("}") {
            return finish(p, out);
        }
        return Err(p.err("expected ',' or '}'"));
    }
}

fn finish(mut p: Parser<'_>, out: Vec<AttrMatcher>) -> Result<Vec<AttrMatcher>, QueryError> {
    p.skip_ws();
    if p.pos != p.s.len() {
        return Err(p.err("unexpected text after '}'"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_scopes_ops_and_escapes() {
        let m = parse(
            r#"{resource.service.name="api", http.method=~"GET|POST", "odd key"!="a\"b", attr.resource.x!~"z.*"}"#,
        )
        .expect("parse");
        assert_eq!(m.len(), 4);
        assert_eq!((m[0].scope, m[0].key.as_str()), (AttrScope::Resource, "service.name"));
        assert!(matches!(&m[0].op, MatchOp::Eq(v) if v == "api"));
        assert!(matches!(&m[1].op, MatchOp::Re(r) if r.is_match("GET") && !r.is_match("GETX")));
        assert!(matches!(&m[2].op, MatchOp::Ne(v) if v == "a\"b"));
        assert_eq!((m[3].scope, m[3].key.as_str()), (AttrScope::Record, "resource.x"));
        assert_eq!(name_of(AttrScope::Record, "resource.x"), "attr.resource.x");
        assert!(parse("").expect("empty").is_empty());
        assert!(parse(" { } ").expect("empty braces").is_empty());
    }

    #[test]
    fn malformed_selectors_name_the_position() {
        for (s, want) in [
            ("{a=\"b\"", "expected ',' or '}' at byte 6"),
            ("{a=b}", "expected a double-quoted string at byte 3"),
            ("a=\"b\"", "expected '{' at byte 0"),
            ("{a~\"b\"}", "expected one of = != =~ !~ at byte 2"),
            ("{a=\"b}", "unterminated string at byte 6"),
            ("{a=\"b\"} x", "unexpected text after '}' at byte 8"),
            ("{=\"b\"}", "expected an attribute name at byte 1"),
        ] {
            let e = parse(s).expect_err(s).to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
        let e = parse("{a=~\"(a\"}").expect_err("bad regex").to_string();
        assert!(e.contains("regex"), "{e}");
        let huge = format!("{{a=\"{}\"}}", "x".repeat(MAX_SELECTOR));
        assert!(parse(&huge).expect_err("huge").to_string().contains("limit"));
        let many = format!("{{{}}}", vec!["a=\"b\""; MAX_MATCHERS + 1].join(","));
        assert!(parse(&many).expect_err("many").to_string().contains("matchers"));
    }
}
