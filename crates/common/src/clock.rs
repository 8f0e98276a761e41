//! The one clock. Everything that decides by wall time (when a generation
//! is old enough to seal, whether a lease has lapsed, which records are
//! outside the accepted window, what retention drops, the compactor's
//! grace) asks a [`Clock`] passed to it instead of `SystemTime::now()`.
//! Tests use [`Clock::manual`] and move it; a real process can be moved
//! too, through `MIRA_TEST_CLOCK_FILE` in builds with the `fault-hooks`
//! feature (see [`Clock::from_env`]).
//!
//! Durations measured for metrics and deadlines of network calls stay on
//! `Instant`: they time what the machine did, they decide nothing about
//! data.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable naming the test clock's offset file.
pub const TEST_CLOCK_ENV: &str = "MIRA_TEST_CLOCK_FILE";

/// Where a clock's time comes from.
trait TimeSource: Send + Sync + fmt::Debug + 'static {
    fn now(&self) -> SystemTime;
}

/// A clock shared by everything in a role (cheap to clone).
#[derive(Clone, Debug)]
pub struct Clock(Arc<dyn TimeSource>);

#[derive(Debug)]
struct System;

impl TimeSource for System {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// The handle that moves a [`Clock::manual`] clock.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<Mutex<SystemTime>>);

impl TimeSource for ManualClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ManualClock {
    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let mut t = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *t += d;
    }

    /// Sets the clock to `t` (backwards too).
    pub fn set(&self, t: SystemTime) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = t;
    }
}

/// The system clock plus an offset read from a file at each reading (test
/// builds only).
#[cfg(feature = "fault-hooks")]
#[derive(Debug)]
struct OffsetFile(std::path::PathBuf);

#[cfg(feature = "fault-hooks")]
impl TimeSource for OffsetFile {
    fn now(&self) -> SystemTime {
        let offset = std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|s| parse_offset(s.trim()).ok())
            .unwrap_or(Duration::ZERO);
        SystemTime::now() + offset
    }
}

/// An offset in the test clock file: a duration (`36h`, `3d 2h`); empty
/// means none.
pub fn parse_offset(s: &str) -> Result<Duration, String> {
    if s.is_empty() {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))
}

/// Why the clock could not be set up from the environment.
#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    #[error("{TEST_CLOCK_ENV} is set, but this build has no test hooks (it needs the fault-hooks feature)")]
    NotATestBuild,
    #[error("{TEST_CLOCK_ENV}: {0}")]
    BadOffset(String),
}

impl Clock {
    /// The machine's clock.
    pub fn system() -> Clock {
        Clock(Arc::new(System))
    }

    /// A clock standing at `start` that moves only when told.
    pub fn manual(start: SystemTime) -> (Clock, ManualClock) {
        let m = ManualClock(Arc::new(Mutex::new(start)));
        (Clock(Arc::new(m.clone())), m)
    }

    /// The process clock: the system clock, unless `MIRA_TEST_CLOCK_FILE`
    /// names a file holding an offset (a duration such as `36h`, re-read
    /// at every reading, so a test moves a running process by rewriting
    /// it). That variable is refused by builds without `fault-hooks`.
    pub fn from_env() -> Result<Clock, ClockError> {
        let Some(path) = std::env::var_os(TEST_CLOCK_ENV).filter(|p| !p.is_empty()) else {
            return Ok(Clock::system());
        };
        #[cfg(feature = "fault-hooks")]
        {
            if let Ok(s) = std::fs::read_to_string(&path) {
                parse_offset(s.trim()).map_err(ClockError::BadOffset)?;
            }
            tracing::warn!(target: "mira::clock", file = %std::path::Path::new(&path).display(), "test clock: wall time is moved by the offset in this file");
            Ok(Clock(Arc::new(OffsetFile(path.into()))))
        }
        #[cfg(not(feature = "fault-hooks"))]
        {
            let _ = path;
            Err(ClockError::NotATestBuild)
        }
    }

    pub fn now(&self) -> SystemTime {
        self.0.now()
    }

    /// Nanoseconds since the Unix epoch (0 before it, saturating far after).
    pub fn now_ns(&self) -> i64 {
        self.now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }

    /// How long ago `then_ns` was (zero if it is in the future).
    pub fn since_ns(&self, then_ns: i64) -> Duration {
        Duration::from_nanos(u64::try_from(self.now_ns().saturating_sub(then_ns)).unwrap_or(0))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let start = UNIX_EPOCH + Duration::from_secs(1_000);
        let (clock, hand) = Clock::manual(start);
        assert_eq!(clock.now(), start);
        assert_eq!(clock.now_ns(), 1_000_000_000_000);
        hand.advance(Duration::from_secs(86_400 * 3));
        assert_eq!(clock.now_ns(), (1_000 + 86_400 * 3) * 1_000_000_000);
        assert_eq!(clock.since_ns(1_000_000_000_000), Duration::from_secs(86_400 * 3));
        // A time in the future is zero ago, not a panic.
        assert_eq!(clock.since_ns(i64::MAX), Duration::ZERO);
        hand.set(UNIX_EPOCH);
        assert_eq!(clock.now_ns(), 0);
    }

    #[test]
    fn offsets_parse_as_durations() {
        assert_eq!(parse_offset(""), Ok(Duration::ZERO));
        assert_eq!(parse_offset("36h"), Ok(Duration::from_secs(36 * 3600)));
        assert_eq!(parse_offset("3d 2h"), Ok(Duration::from_secs(3 * 86_400 + 7_200)));
        assert!(parse_offset("soon").expect_err("must be refused").contains("soon"));
    }

    #[cfg(feature = "fault-hooks")]
    #[test]
    fn the_offset_file_moves_the_clock_at_the_next_reading() {
        let dir = tempfile::tempdir().expect("test setup");
        let file = dir.path().join("clock");
        let clock = Clock(Arc::new(OffsetFile(file.clone())));
        // Each reading lies between two system readings, moved by the offset.
        let reads_as = |offset: Duration| {
            let before = SystemTime::now();
            let t = clock.now();
            let after = SystemTime::now();
            before + offset <= t && t <= after + offset
        };
        // No file: the system clock.
        assert!(reads_as(Duration::ZERO));
        std::fs::write(&file, "30d").expect("test setup");
        assert!(reads_as(Duration::from_secs(30 * 86_400)));
        std::fs::write(&file, "").expect("test setup");
        assert!(reads_as(Duration::ZERO));
    }
}
