//! LogQL: the syntax tree ([`ast`]), the parser ([`parse`]), the label
//! model that turns an OTel log record into Loki labels, and the
//! evaluator (pipelines over lines; metric queries on the PromQL engine).

pub mod ast;
mod lex;
pub mod parse;
