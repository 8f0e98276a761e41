//! How configuration values are written and checked, once for every role:
//! durations as `30s`, `5m`, `168h` ([`Duration`]), sizes as `64MiB`,
//! `10GiB` or plain bytes ([`ByteSize`]), points in time on a command line
//! as RFC 3339 or relative to now ([`TimeArg`]), a [`ConfigError`] that names the
//! field, range checks that reject instead of clamping, and the TOML file
//! reader (unknown keys are errors).
//!
//! Each role's config type lives in its own crate, derives
//! `Deserialize`/`Serialize` with these value types, and has a
//! `validate()` built from [`positive`] and [`in_range`].

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A configuration value that is not acceptable, naming the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// `value` must be above zero.
pub fn positive<T: PartialOrd + Default + fmt::Display>(field: &str, value: T) -> Result<(), ConfigError> {
    if value > T::default() {
        Ok(())
    } else {
        Err(ConfigError::new(field, format!("{value} must be above zero")))
    }
}

/// `value` must lie in `lo..=hi`.
pub fn in_range<T: PartialOrd + fmt::Display>(field: &str, value: T, lo: T, hi: T) -> Result<(), ConfigError> {
    if value >= lo && value <= hi {
        Ok(())
    } else {
        Err(ConfigError::new(field, format!("{value} is outside {lo}..={hi}")))
    }
}

/// Reads a TOML file into `T` (whose structs deny unknown fields).
pub fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let field = format!("config file {}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::new(&field, e.to_string()))?;
    toml::from_str(&text).map_err(|e| ConfigError::new(&field, e.to_string().trim_end().to_owned()))
}

/// Renders `value` as TOML (what `--check-config` prints; reads back with
/// [`read_toml`]).
pub fn to_toml<T: Serialize>(value: &T) -> String {
    toml::to_string(value).unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
}

/// A duration written the human way: `250ms`, `30s`, `5m`, `168h`, `7d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

impl Duration {
    pub const fn from_secs(s: u64) -> Duration {
        Duration(std::time::Duration::from_secs(s))
    }

    pub const fn from_millis(ms: u64) -> Duration {
        Duration(std::time::Duration::from_millis(ms))
    }

    pub fn get(self) -> std::time::Duration {
        self.0
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

impl FromStr for Duration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        humantime::parse_duration(s.trim())
            .map(Duration)
            .map_err(|e| format!("{s:?} is not a duration like 30s, 5m or 168h: {e}"))
    }
}

impl fmt::Display for Duration {
    /// Days down to nanoseconds, largest first (`31d`, `1m 30s`, `250ms`):
    /// no months or years, whose length is a convention.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_zero() {
            return f.write_str("0s");
        }
        let secs = self.0.as_secs();
        let nanos = u64::from(self.0.subsec_nanos());
        let parts = [
            (secs / 86_400, "d"),
            (secs / 3_600 % 24, "h"),
            (secs / 60 % 60, "m"),
            (secs % 60, "s"),
            (nanos / 1_000_000, "ms"),
            (nanos / 1_000 % 1_000, "us"),
            (nanos % 1_000, "ns"),
        ];
        let mut first = true;
        for (n, unit) in parts {
            if n > 0 {
                if !first {
                    f.write_str(" ")?;
                }
                write!(f, "{n}{unit}")?;
                first = false;
            }
        }
        Ok(())
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A size in bytes written the human way: `64MiB`, `10GiB`, `512KiB`,
/// `1GB`, or a plain number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const fn mib(n: u64) -> ByteSize {
        ByteSize(n << 20)
    }

    pub const fn kib(n: u64) -> ByteSize {
        ByteSize(n << 10)
    }

    pub const fn gib(n: u64) -> ByteSize {
        ByteSize(n << 30)
    }

    pub fn bytes(self) -> u64 {
        self.0
    }

    /// The size as a `usize` (saturating on 32-bit targets).
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Ok(n) = t.parse::<u64>() {
            return Ok(ByteSize(n));
        }
        t.parse::<bytesize::ByteSize>()
            .map(|b| ByteSize(b.as_u64()))
            .map_err(|_| format!("{s:?} is not a size like 64MiB, 10GiB or a number of bytes"))
    }
}

impl fmt::Display for ByteSize {
    /// The largest binary unit that divides it exactly, so it reads back
    /// as the same number of bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if n != 0 && n.is_multiple_of(1u64 << shift) {
                return write!(f, "{}{unit}", n >> shift);
            }
        }
        write!(f, "{n}")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// A point in time given on a command line: RFC 3339 (`2026-11-01T00:00:00Z`,
/// `2026-11-01T00:00Z`, `2026-11-01T00Z`, `2026-11-01`, an offset such as
/// `+02:00`; without a zone it is UTC) or relative to now (`-7d`, `-36h`,
/// `-90m`, `now`). [`TimeArg::resolve`] turns it into Unix nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeArg {
    /// Unix nanoseconds.
    At(i64),
    /// This long before now.
    Ago(std::time::Duration),
}

impl TimeArg {
    /// Unix nanoseconds, relative times counted back from `now_ns`.
    pub fn resolve(self, now_ns: i64) -> i64 {
        match self {
            TimeArg::At(ns) => ns,
            TimeArg::Ago(d) => now_ns.saturating_sub(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
        }
    }
}

impl FromStr for TimeArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let bad = |why: &str| {
            format!(
                "{s:?} is not a time ({why}): use RFC 3339 (2026-11-01T00:00:00Z, 2026-11-01) or a time before now (-7d, -36h, now)"
            )
        };
        if t == "now" {
            return Ok(TimeArg::Ago(std::time::Duration::ZERO));
        }
        if let Some(ago) = t.strip_prefix('-') {
            return humantime::parse_duration(ago)
                .map(TimeArg::Ago)
                .map_err(|e| bad(&e.to_string()));
        }
        // The zone: Z, or an offset east (+) or west (-) of UTC.
        let (base, offset_s) = if let Some(b) = t.strip_suffix(['Z', 'z']) {
            (b, 0i64)
        } else if t.len() > 16 && t.is_char_boundary(t.len() - 6) && {
            let z = &t.as_bytes()[t.len() - 6..];
            (z[0] == b'+' || z[0] == b'-') && z[3] == b':'
        } {
            let (b, z) = t.split_at(t.len() - 6);
            let hh: i64 = z[1..3].parse().map_err(|_| bad("offset"))?;
            let mm: i64 = z[4..6].parse().map_err(|_| bad("offset"))?;
            let sign = if z.starts_with('-') { -1 } else { 1 };
            (b, sign * (hh * 3600 + mm * 60))
        } else {
            (t, 0)
        };
        let full = match base.len() {
            10 => format!("{base}T00:00:00"),
            13 => format!("{base}:00:00"),
            16 => format!("{base}:00"),
            _ => base.to_owned(),
        };
        let at = humantime::parse_rfc3339_weak(&full).map_err(|e| bad(&e.to_string()))?;
        let ns = at
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|d| i64::try_from(d.as_nanos()).ok())
            .ok_or_else(|| bad("out of range"))?;
        // A time just inside the range with an offset west of UTC lands
        // past it.
        ns.checked_sub(offset_s * 1_000_000_000)
            .map(TimeArg::At)
            .ok_or_else(|| bad("out of range"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found while writing the `text` fuzz target: the last second before
    /// i64 nanoseconds run out, west of UTC, overflowed (a panic in debug
    /// builds, a time in 1677 in release ones).
    #[test]
    fn a_time_past_the_range_after_its_offset_is_refused() {
        let e = "2262-04-11T23:47:16-23:59"
            .parse::<TimeArg>()
            .expect_err("past i64 nanoseconds");
        assert!(e.contains("out of range"), "{e}");
        assert!("2262-04-11T23:47:16+23:59".parse::<TimeArg>().is_ok());
        assert!("2262-04-11T00:00:00-01:00".parse::<TimeArg>().is_ok());
    }

    #[test]
    fn durations_parse_one_way_and_print_back() {
        assert_eq!("30s".parse::<Duration>(), Ok(Duration::from_secs(30)));
        assert_eq!("5m".parse::<Duration>(), Ok(Duration::from_secs(300)));
        assert_eq!("250ms".parse::<Duration>(), Ok(Duration::from_millis(250)));
        assert_eq!("168h".parse::<Duration>(), Ok(Duration::from_secs(168 * 3600)));
        for d in ["30s", "5m", "250ms", "7days", "1h 30m"] {
            let v: Duration = d.parse().expect("test setup");
            assert_eq!(v.to_string().parse::<Duration>(), Ok(v), "{d}");
        }
        assert_eq!(Duration::default().to_string(), "0s");
        assert_eq!(Duration::from_secs(744 * 3600).to_string(), "31d");
        assert_eq!(Duration::from_secs(90).to_string(), "1m 30s");
        assert_eq!(Duration::from_millis(1_500).to_string(), "1s 500ms");
        let e = "300".parse::<Duration>().expect_err("must be refused");
        assert!(e.contains("\"300\"") && e.contains("30s"), "{e}");
        assert!("-5s".parse::<Duration>().is_err());
    }

    #[test]
    fn sizes_parse_units_and_plain_bytes_and_print_back_exactly() {
        assert_eq!("64MiB".parse::<ByteSize>(), Ok(ByteSize::mib(64)));
        assert_eq!("64 MiB".parse::<ByteSize>(), Ok(ByteSize::mib(64)));
        assert_eq!("10GiB".parse::<ByteSize>(), Ok(ByteSize::gib(10)));
        assert_eq!("1GB".parse::<ByteSize>(), Ok(ByteSize(1_000_000_000)));
        assert_eq!("4096".parse::<ByteSize>(), Ok(ByteSize(4096)));
        for n in [0, 1, 1000, 1 << 10, 3 << 20, (1 << 30) + 1, 10 << 30] {
            let b = ByteSize(n);
            assert_eq!(b.to_string().parse::<ByteSize>(), Ok(b), "{n}");
        }
        assert_eq!(ByteSize::mib(64).to_string(), "64MiB");
        for bad in ["-1", "lots", "12 parsecs", ""] {
            let e = bad.parse::<ByteSize>().expect_err("must be refused");
            assert!(e.contains("64MiB"), "{bad}: {e}");
        }
    }

    #[test]
    fn checks_name_the_field_and_reject() {
        assert_eq!(positive("seal_age", 1u64), Ok(()));
        let e = positive("seal_age", 0u64).expect_err("must be refused");
        assert_eq!(e.field, "seal_age");
        assert_eq!(e.to_string(), "invalid seal_age: 0 must be above zero");
        assert!(in_range("shards", 3usize, 1, 256).is_ok());
        assert_eq!(
            in_range("shards", 300usize, 1, 256)
                .expect_err("must be refused")
                .to_string(),
            "invalid shards: 300 is outside 1..=256"
        );
    }

    #[test]
    fn times_are_rfc3339_or_before_now() {
        const NOV_1: i64 = 1_761_955_200_000_000_000; // 2025-11-01T00:00:00Z
        const H: i64 = 3_600_000_000_000;
        for (s, ns) in [
            ("2025-11-01T00:00:00Z", NOV_1),
            ("2025-11-01T00:00:00.5Z", NOV_1 + 500_000_000),
            ("2025-11-01T01:30Z", NOV_1 + H + H / 2),
            ("2025-11-01T01Z", NOV_1 + H),
            ("2025-11-01", NOV_1),
            ("2025-11-01 00:00:00", NOV_1),
            ("2025-11-01T02:00:00+02:00", NOV_1),
            ("2025-10-31T22:00:00-02:00", NOV_1),
        ] {
            assert_eq!(s.parse::<TimeArg>(), Ok(TimeArg::At(ns)), "{s}");
        }
        let now = NOV_1 + 7 * 24 * H;
        assert_eq!("-7d".parse::<TimeArg>().map(|t| t.resolve(now)), Ok(NOV_1));
        assert_eq!("-36h".parse::<TimeArg>().map(|t| t.resolve(now)), Ok(now - 36 * H));
        assert_eq!("now".parse::<TimeArg>().map(|t| t.resolve(now)), Ok(now));
        for bad in [
            "yesterday",
            "-7 fortnights",
            "2025-13-01",
            "2025-11-01T25Z",
            "1761955200",
            "",
        ] {
            let e = bad.parse::<TimeArg>().expect_err(bad);
            assert!(e.contains("RFC 3339") && e.contains("-7d"), "{bad}: {e}");
        }
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        seal_age: Duration,
        seal_size: ByteSize,
    }

    #[test]
    fn toml_round_trips_and_refuses_unknown_keys() {
        let dir = tempfile::tempdir().expect("test setup");
        let p = dir.path().join("mira.toml");
        let v = Sample {
            seal_age: Duration::from_secs(300),
            seal_size: ByteSize::mib(32),
        };
        std::fs::write(&p, to_toml(&v)).expect("test setup");
        assert_eq!(read_toml::<Sample>(&p), Ok(v));
        std::fs::write(&p, "seal_age = \"5m\"\nseal_size = 1024\nseal_sise = 1\n").expect("test setup");
        let e = read_toml::<Sample>(&p).expect_err("must be refused");
        assert!(e.reason.contains("seal_sise"), "{e}");
        std::fs::write(&p, "seal_age = \"soon\"\nseal_size = 1024\n").expect("test setup");
        let e = read_toml::<Sample>(&p).expect_err("must be refused");
        assert!(e.reason.contains("soon"), "{e}");
        let e = read_toml::<Sample>(&dir.path().join("missing.toml")).expect_err("must be refused");
        assert!(e.field.contains("missing.toml"), "{e}");
    }
}
