//! LogQL: the syntax tree ([`ast`]) and its parser ([`parse`], over a
//! lexer), the label model that turns an OTel log record into a Loki entry
//! ([`model`]), the pipeline stages ([`pipeline`]) and the evaluator
//! ([`eval`]: log queries over the native logs scan, metric queries on the
//! PromQL engine).

pub mod ast;
pub mod eval;
mod lex;
pub mod model;
pub mod parse;
pub mod pipeline;
