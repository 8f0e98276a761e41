//! The parse error of Mira's query languages (LogQL, TraceQL): where
//! (byte offset, 1-based line and column in characters) and why, printed
//! as Loki and Tempo print theirs.

/// A query that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub pos: usize,
    pub line: usize,
    pub col: usize,
    pub reason: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "parse error at line {}, col {}: {}",
            self.line, self.col, self.reason
        )
    }
}

impl std::error::Error for ParseError {}

impl ParseError {
    /// `reason` at byte `pos` of `query`.
    pub(crate) fn at(query: &str, pos: usize, reason: String) -> ParseError {
        let before = query.get(..pos).unwrap_or(query);
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        ParseError { pos, line, col, reason }
    }
}
