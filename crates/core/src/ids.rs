//! Typed identifiers that cross crate and process boundaries.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Longest tenant id accepted. Tenants become object-path components, so
/// they are short and drawn from a path-safe alphabet.
pub const MAX_TENANT_LEN: usize = 128;

/// A tenant, as sent in `X-Scope-OrgID`: 1..=128 of `[A-Za-z0-9_.-]`, not
/// `.` or `..`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(String);

impl TenantId {
    /// The tenant used when a request names none.
    pub fn default_tenant() -> Self {
        TenantId("default".to_owned())
    }

    pub fn new(s: &str) -> Result<Self, Error> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if s.is_empty() || s.len() > MAX_TENANT_LEN || !s.chars().all(ok_char) || s == "." || s == ".." {
            return Err(Error::InvalidTenant(s.chars().take(MAX_TENANT_LEN).collect()));
        }
        Ok(TenantId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for TenantId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        TenantId::new(s)
    }
}

/// A block's id: a ULID, never reused, so (block id, section) names
/// immutable bytes forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub ulid::Ulid);

impl BlockId {
    pub fn new() -> Self {
        BlockId(ulid::Ulid::generate())
    }

    pub fn from_u128(v: u128) -> Self {
        BlockId(ulid::Ulid(v))
    }

    pub fn as_u128(self) -> u128 {
        self.0.0
    }
}

impl Default for BlockId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for BlockId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        ulid::Ulid::from_string(s)
            .map(BlockId)
            .map_err(|_| Error::InvalidBlockId(s.chars().take(64).collect()))
    }
}

/// The three OpenTelemetry signals Mira stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    Logs,
    Traces,
    Metrics,
}

impl Signal {
    pub const ALL: [Signal; 3] = [Signal::Logs, Signal::Traces, Signal::Metrics];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Logs => "logs",
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
        }
    }

    /// Stable one-byte code used in binary formats (WAL frames, footers).
    pub fn code(self) -> u8 {
        match self {
            Signal::Logs => 1,
            Signal::Traces => 2,
            Signal::Metrics => 3,
        }
    }

    pub fn from_code(code: u8) -> Option<Signal> {
        match code {
            1 => Some(Signal::Logs),
            2 => Some(Signal::Traces),
            3 => Some(Signal::Metrics),
            _ => None,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Signal {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "logs" => Ok(Signal::Logs),
            "traces" => Ok(Signal::Traces),
            "metrics" => Ok(Signal::Metrics),
            other => Err(Error::InvalidSignal(other.chars().take(32).collect())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_rejects_path_tricks() {
        for bad in ["", ".", "..", "a/b", "a b", "é", &"x".repeat(129)] {
            assert!(TenantId::new(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            TenantId::new("team-a.prod_1").map(|t| t.to_string()).ok(),
            Some("team-a.prod_1".to_owned())
        );
    }

    #[test]
    fn block_id_round_trips_through_text() {
        let id = BlockId::new();
        assert_eq!(id.to_string().parse::<BlockId>().ok(), Some(id));
        assert!("not-a-ulid".parse::<BlockId>().is_err());
    }

    #[test]
    fn signal_codes_round_trip() {
        for s in Signal::ALL {
            assert_eq!(Signal::from_code(s.code()), Some(s));
            assert_eq!(s.as_str().parse::<Signal>().ok(), Some(s));
        }
        assert_eq!(Signal::from_code(0), None);
    }
}
