//! TraceQL: the syntax tree ([`ast`]), the parser ([`parse`]), the
//! evaluator that runs a query over one whole trace ([`eval`]) and search
//! over the stored traces ([`search`]).
//!
//! The parser follows Tempo's own grammar (`pkg/traceql/expr.y` and its
//! lexer) rather than the looser grammar of Grafana's editor
//! (`@grafana/lezer-traceql`); `tests/fixtures/traceql-valid.txt` and
//! `traceql-invalid.txt` hold queries that both Mira and the editor's
//! grammar accept or refuse (`tests/grammar/check.mjs` checks the editor's
//! side).

pub mod ast;
pub mod eval;
pub mod parse;
pub mod search;

pub use ast::Query;
pub use parse::{ParseError, parse};
