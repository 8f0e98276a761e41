//! The one shape every query answers with ([`Answer`]): what was asked
//! for, whether some data may be missing and why, and the query's
//! counters. While a query runs, what may be missing gathers in [`Gaps`].

use serde::Serialize;

use crate::stats::{Stats, StatsJson};

/// A query's answer. `body`'s fields come first in the JSON, then
/// `partial`, `warnings` and `stats`.
#[derive(Debug, Serialize)]
pub struct Answer<T> {
    #[serde(flatten)]
    pub body: T,
    /// Some data may be missing (an ingester did not answer, the catalog
    /// copy lagged); `warnings` says why.
    pub partial: bool,
    pub warnings: Vec<String>,
    pub stats: StatsJson,
}

impl<T> Answer<T> {
    /// The answer with `gaps` and the counters as they are now.
    pub fn new(body: T, gaps: Gaps, stats: &Stats) -> Answer<T> {
        Answer {
            body,
            partial: gaps.partial,
            warnings: gaps.warnings,
            stats: stats.snapshot(),
        }
    }
}

/// Why an answer may lack data, or is shorter than it could be.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Gaps {
    pub partial: bool,
    pub warnings: Vec<String>,
}

impl Gaps {
    /// Some data may be missing, because `why`.
    pub fn missing(&mut self, why: String) {
        self.partial = true;
        self.warnings.push(why);
    }

    /// A warning about a complete answer (a list cut at a limit).
    pub fn note(&mut self, what: String) {
        self.warnings.push(what);
    }
}

/// Serializes a `u64` as a JSON string (nanosecond times exceed what a
/// JavaScript number holds exactly).
pub(crate) fn u64_as_string<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Body {
        lines: Vec<u32>,
        cursor: Option<String>,
    }

    #[test]
    fn the_body_comes_first_then_partial_warnings_and_stats() {
        let stats = Stats::default();
        let mut gaps = Gaps::default();
        gaps.note("cut at 10".into());
        let a = Answer::new(
            Body {
                lines: vec![1],
                cursor: None,
            },
            gaps.clone(),
            &stats,
        );
        let json = serde_json::to_string(&a).expect("json");
        let prefix = r#"{"lines":[1],"cursor":null,"partial":false,"warnings":["cut at 10"],"stats":{"#;
        assert!(json.starts_with(prefix), "{json}");
        gaps.missing("ingester i-1 did not answer".into());
        assert!(gaps.partial);
        assert_eq!(gaps.warnings.len(), 2);
    }
}
