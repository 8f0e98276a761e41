//! TraceQL: the syntax tree ([`ast`]) and the parser ([`parse`]). The
//! evaluator, which runs a query over one whole trace at a time, comes
//! later.
//!
//! The parser follows Tempo's own grammar (`pkg/traceql/expr.y` and its
//! lexer) rather than the looser grammar of Grafana's editor
//! (`@grafana/lezer-traceql`); `tests/fixtures/traceql-valid.txt` and
//! `traceql-invalid.txt` hold queries that both Mira and the editor's
//! grammar accept or refuse (`tests/grammar/check.mjs` checks the editor's
//! side).

pub mod ast;
pub mod parse;

pub use ast::Query;
pub use parse::{ParseError, parse};
