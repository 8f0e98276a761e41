//! Rendering a restore's [`Event`]s for a person or a program
//! (compactor-design.md §9.4):
//!
//! - [`Mode::Tty`] (stderr is a terminal): one progress line on stderr,
//!   redrawn in place with `\r` at every [`Progress::tick`]:
//!   `[########..............]  412/1,337 blocks  3.1/10.2 GiB  212 MiB/s  ETA 0:34  skipped 12  failed 0  waiting-lease 1`;
//! - [`Mode::Log`] (stderr is a file or a pipe): the same numbers as a log
//!   line every 5 s;
//! - [`Mode::Json`]: every event as one JSON object per line on stdout
//!   (NDJSON), the last one `{"event":"summary",...}`, and nothing else.
//!
//! In both text modes the plan is the first line on stdout
//! (`restore acme logs,traces 2026-11-01T00:00Z..2026-11-08T00:00Z: 1,337 blocks, 10.2 GiB`)
//! and the summary the last
//! (`done: 1,325 restored (10.1 GiB), 12 already live, 0 failed, 48.2 s, 214 MiB/s; verified 1,325 primary objects`);
//! a lease wait, a failed block and a repair by the verification are each
//! a line on stderr.
//!
//! The rate is an exponentially weighted moving average of the bytes
//! copied, with a 5 s time constant ([`Ewma`]); the ETA is the bytes left
//! divided by it. The formatting functions are pure (fixed inputs give
//! fixed strings); [`Progress`] holds the counters and writes.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant, UNIX_EPOCH};

use crate::restore::{BlockEvent, BlockResult, Event, PlanInfo, Summary, VerifyResult};

/// How often [`Mode::Log`] writes a progress line.
pub const LOG_EVERY: Duration = Duration::from_secs(5);
/// The rate's time constant, seconds.
pub const RATE_WINDOW_S: f64 = 5.0;
/// Characters inside the progress bar's brackets.
const BAR_WIDTH: usize = 22;

/// Where and how events are shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Tty,
    Log,
    Json,
}

impl Mode {
    /// `Json` when asked for, else `Tty` when stderr is a terminal, else
    /// `Log`.
    pub fn detect(json: bool) -> Mode {
        if json {
            Mode::Json
        } else if std::io::stderr().is_terminal() {
            Mode::Tty
        } else {
            Mode::Log
        }
    }
}

/// A byte rate smoothed exponentially over [`RATE_WINDOW_S`]. Until the
/// first bytes arrive it has no value; the first value is the average
/// since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ewma {
    rate: Option<f64>,
    /// Seconds before the first bytes.
    idle_s: f64,
}

impl Ewma {
    /// Adds `bytes` moved over the last `dt_s` seconds; returns the rate.
    pub fn update(&mut self, bytes: u64, dt_s: f64) -> Option<f64> {
        if dt_s <= 0.0 {
            return self.rate;
        }
        let instant = bytes as f64 / dt_s;
        self.rate = match self.rate {
            None if bytes == 0 => {
                self.idle_s += dt_s;
                None
            }
            None => Some(bytes as f64 / (self.idle_s + dt_s)),
            Some(r) => {
                let alpha = 1.0 - (-dt_s / RATE_WINDOW_S).exp();
                Some(r + alpha * (instant - r))
            }
        };
        self.rate
    }

    pub fn get(&self) -> Option<f64> {
        self.rate
    }
}

/// The numbers a progress line shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub total_blocks: u64,
    /// Blocks with a result (restored, skipped or failed).
    pub done_blocks: u64,
    pub total_bytes: u64,
    /// Bytes copied, plus the bytes of blocks done without a copy.
    pub done_bytes: u64,
    /// Bytes per second (`None`: nothing copied yet).
    pub rate: Option<f64>,
    pub skipped: u64,
    pub failed: u64,
    /// Partitions waiting for a lease another holder has.
    pub waiting_lease: u64,
}

impl Snapshot {
    /// Seconds left at the current rate.
    pub fn eta_s(&self) -> Option<f64> {
        let left = self.total_bytes.saturating_sub(self.done_bytes) as f64;
        match self.rate {
            _ if left == 0.0 => Some(0.0),
            Some(r) if r > 0.0 => Some(left / r),
            _ => None,
        }
    }
}

/// `1337` → `1,337`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];

/// The binary unit `n` is shown in (its index in [`UNITS`]).
fn unit_of(n: f64) -> usize {
    let mut k = 0;
    while k + 1 < UNITS.len() && n >= 1024f64.powi(k as i32 + 1) {
        k += 1;
    }
    k
}

/// `v` in unit `k`: bytes whole, else one decimal below 100, none above.
fn in_unit(v: f64, k: usize, decimals_of: f64) -> String {
    let x = v / 1024f64.powi(k as i32);
    if k == 0 {
        format!("{x:.0}")
    } else if decimals_of / 1024f64.powi(k as i32) < 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.0}")
    }
}

/// `10952166604` → `10.2 GiB`.
pub fn bytes(n: u64) -> String {
    let v = n as f64;
    let k = unit_of(v);
    format!("{} {}", in_unit(v, k, v), UNITS[k])
}

/// `done` of `total` in the total's unit: `3.1/10.2 GiB`.
pub fn bytes_of(done: u64, total: u64) -> String {
    let t = total as f64;
    let k = unit_of(t);
    format!("{}/{} {}", in_unit(done as f64, k, t), in_unit(t, k, t), UNITS[k])
}

/// Bytes per second: `212 MiB/s` (`- B/s` unknown).
pub fn rate(bytes_per_s: Option<f64>) -> String {
    match bytes_per_s {
        Some(r) if r.is_finite() && r >= 0.0 => {
            let k = unit_of(r);
            format!("{} {}/s", in_unit(r, k, r), UNITS[k])
        }
        _ => "- B/s".to_owned(),
    }
}

/// Seconds as `m:ss` or `h:mm:ss` (`-:--` unknown).
pub fn eta(secs: Option<f64>) -> String {
    let Some(s) = secs.filter(|s| s.is_finite() && *s >= 0.0) else {
        return "-:--".to_owned();
    };
    let s = s.ceil() as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

fn rfc3339(ns: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns).unwrap_or(0));
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Unix ns as `2026-11-01T00:00Z`.
pub fn minute(ns: i64) -> String {
    let s = rfc3339(ns);
    format!("{}Z", &s[..16])
}

/// Unix ns as `2026-11-01T00Z` (an hour partition).
pub fn hour(ns: i64) -> String {
    let s = rfc3339(ns);
    format!("{}Z", &s[..13])
}

/// `[########..............]`: `done` of `total` in [`BAR_WIDTH`] cells.
pub fn bar(done: u64, total: u64) -> String {
    let filled = if total == 0 {
        BAR_WIDTH
    } else {
        ((done.min(total) as u128 * BAR_WIDTH as u128) / total as u128) as usize
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(BAR_WIDTH - filled))
}

/// The redrawn line of [`Mode::Tty`].
pub fn progress_line(s: &Snapshot) -> String {
    format!(
        "{}  {}/{} blocks  {}  {}  ETA {}  skipped {}  failed {}  waiting-lease {}",
        bar(s.done_bytes, s.total_bytes),
        count(s.done_blocks),
        count(s.total_blocks),
        bytes_of(s.done_bytes, s.total_bytes),
        rate(s.rate),
        eta(s.eta_s()),
        count(s.skipped),
        count(s.failed),
        count(s.waiting_lease),
    )
}

/// The periodic line of [`Mode::Log`].
pub fn log_line(s: &Snapshot) -> String {
    format!(
        "restore: {}/{} blocks, {}, {}, ETA {}, skipped {}, failed {}, waiting-lease {}",
        count(s.done_blocks),
        count(s.total_blocks),
        bytes_of(s.done_bytes, s.total_bytes),
        rate(s.rate),
        eta(s.eta_s()),
        count(s.skipped),
        count(s.failed),
        count(s.waiting_lease),
    )
}

/// The first line: what is restored.
pub fn plan_line(p: &PlanInfo) -> String {
    let tenant = p.tenant.as_deref().unwrap_or("all tenants");
    let signals = if p.signals.is_empty() {
        "all signals".to_owned()
    } else {
        p.signals.join(",")
    };
    let range = match (p.from_ns, p.to_ns) {
        (None, None) => "all time".to_owned(),
        (from, to) => format!(
            "{}..{}",
            from.map(minute).unwrap_or_default(),
            to.map(minute).unwrap_or_default()
        ),
    };
    let mut line = format!("restore {tenant} {signals} {range}");
    if p.named_blocks > 0 {
        line.push_str(&format!(" ({} named blocks)", count(p.named_blocks)));
    }
    line.push_str(&format!(": {} blocks, {}", count(p.blocks), bytes(p.bytes)));
    if p.already_live > 0 {
        line.push_str(&format!(", {} already live", count(p.already_live)));
    }
    if p.refused > 0 {
        line.push_str(&format!(", {} cannot be restored", count(p.refused)));
    }
    line
}

/// What the copies cost (the dry run's and the confirmation's second
/// line).
pub fn estimate_line(p: &PlanInfo, rate_bytes: u64) -> String {
    let what = format!(
        "to copy: {} blocks ({}) in {} partitions",
        count(p.to_restore),
        bytes(p.to_restore_bytes),
        count(p.partitions)
    );
    match p.estimated_s {
        Some(s) if rate_bytes > 0 => format!("{what}, about {} at {}", eta(Some(s)), rate(Some(rate_bytes as f64))),
        _ => format!("{what}, no rate limit"),
    }
}

/// The last line.
pub fn summary_line(s: &Summary) -> String {
    let mut line = format!(
        "{}: {} restored ({}), {} already live, {} failed",
        if s.interrupted { "interrupted" } else { "done" },
        count(s.restored),
        bytes(s.restored_bytes),
        count(s.already_live),
        count(s.failed),
    );
    if s.not_started > 0 {
        line.push_str(&format!(", {} not started", count(s.not_started)));
    }
    line.push_str(&format!(
        ", {:.1} s, {}; verified {} primary objects",
        s.seconds,
        rate(Some(s.rate_bytes_per_s)),
        count(s.verified)
    ));
    if s.copied_again > 0 {
        line.push_str(&format!(" ({} copied again)", count(s.copied_again)));
    }
    line
}

/// The stderr line of a failed block (`None` for the others).
pub fn block_line(b: &BlockEvent) -> Option<String> {
    if b.result != BlockResult::Failed {
        return None;
    }
    let reason = b.reason.as_deref().unwrap_or("unknown reason");
    Some(if b.tenant.is_empty() {
        format!("failed: block {}: {reason}", b.id)
    } else {
        format!(
            "failed: block {} ({}/{}/{}): {reason}",
            b.id,
            b.tenant,
            b.signal,
            hour(b.partition_start_ns)
        )
    })
}

/// The stderr line of a lease wait; a partition lease's hour is spelled
/// out.
pub fn waiting_line(lease: &str, holder: &str) -> String {
    let hour_of = lease
        .strip_prefix("part/")
        .and_then(|k| k.rsplit('/').next())
        .and_then(|ns| ns.parse::<i64>().ok())
        .map(|ns| format!(" ({})", hour(ns)))
        .unwrap_or_default();
    format!("waiting for lease {lease}{hour_of} held by {holder}")
}

/// Counters and output of one restore (see the module doc).
pub struct Progress {
    mode: Mode,
    out: Box<dyn Write + Send>,
    err: Box<dyn Write + Send>,
    snap: Snapshot,
    ewma: Ewma,
    copied_since_tick: u64,
    last_tick: Instant,
    last_log: Instant,
    waiting: HashSet<String>,
    /// A progress line is on the terminal (cleared before other output).
    drawn: bool,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("mode", &self.mode)
            .field("snap", &self.snap)
            .finish()
    }
}

impl Progress {
    /// Writes results to `out` and progress to `err`, from `now`.
    pub fn new(mode: Mode, out: Box<dyn Write + Send>, err: Box<dyn Write + Send>, now: Instant) -> Progress {
        Progress {
            mode,
            out,
            err,
            snap: Snapshot::default(),
            ewma: Ewma::default(),
            copied_since_tick: 0,
            last_tick: now,
            last_log: now,
            waiting: HashSet::new(),
            drawn: false,
        }
    }

    /// On the process's stdout and stderr.
    pub fn stdio(mode: Mode) -> Progress {
        Progress::new(
            mode,
            Box::new(std::io::stdout()),
            Box::new(std::io::stderr()),
            Instant::now(),
        )
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn snapshot(&self) -> &Snapshot {
        &self.snap
    }

    /// A line on stderr (above the progress line).
    pub fn note(&mut self, line: &str) {
        if self.mode == Mode::Json {
            return;
        }
        self.clear();
        let _ = writeln!(self.err, "{line}");
    }

    fn clear(&mut self) {
        if self.drawn {
            let _ = write!(self.err, "\r\x1b[K");
            let _ = self.err.flush();
            self.drawn = false;
        }
    }

    fn result(&mut self, line: &str) {
        self.clear();
        let _ = writeln!(self.out, "{line}");
        let _ = self.out.flush();
    }

    /// Counts `e` and writes what it says.
    pub fn event(&mut self, e: &Event, _now: Instant) {
        let s = &mut self.snap;
        match e {
            Event::Plan(p) => {
                s.total_blocks = p.blocks;
                s.total_bytes = p.bytes;
            }
            Event::Waiting { lease, .. } => {
                self.waiting.insert(lease.clone());
            }
            Event::Partition { lease, .. } => {
                self.waiting.remove(lease);
            }
            Event::Copied { bytes, .. } => {
                s.done_bytes += bytes;
                self.copied_since_tick += bytes;
            }
            Event::Block(b) => {
                s.done_blocks += 1;
                if !b.copied {
                    s.done_bytes += b.bytes;
                }
                match b.result {
                    BlockResult::Skipped => s.skipped += 1,
                    BlockResult::Failed => s.failed += 1,
                    BlockResult::Restored => {}
                }
            }
            Event::Verify { .. } | Event::Summary(_) => {}
        }
        self.snap.waiting_lease = self.waiting.len() as u64;
        if self.mode == Mode::Json {
            if let Ok(line) = serde_json::to_string(e) {
                let _ = writeln!(self.out, "{line}");
                let _ = self.out.flush();
            }
            return;
        }
        match e {
            Event::Plan(p) => self.result(&plan_line(p)),
            Event::Waiting { lease, holder } => self.note(&waiting_line(lease, holder)),
            Event::Block(b) => {
                if let Some(line) = block_line(b) {
                    self.note(&line);
                }
            }
            Event::Verify { id, result, reason } => {
                let line = match result {
                    VerifyResult::CopiedAgain => {
                        format!("verify: block {id}: its primary object was missing; copied again")
                    }
                    VerifyResult::Failed => format!(
                        "verify: block {id}: {}",
                        reason.as_deref().unwrap_or("its primary object is missing")
                    ),
                };
                self.note(&line);
            }
            Event::Summary(s) => self.result(&summary_line(s)),
            Event::Partition { .. } | Event::Copied { .. } => {}
        }
    }

    /// Updates the rate and redraws ([`Mode::Tty`]) or logs every
    /// [`LOG_EVERY`] ([`Mode::Log`]); call it a few times a second.
    pub fn tick(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last_tick).as_secs_f64();
        self.snap.rate = self.ewma.update(self.copied_since_tick, dt);
        self.copied_since_tick = 0;
        self.last_tick = now;
        match self.mode {
            Mode::Tty => {
                let _ = write!(self.err, "\r{}\x1b[K", progress_line(&self.snap));
                let _ = self.err.flush();
                self.drawn = true;
            }
            Mode::Log if now.saturating_duration_since(self.last_log) >= LOG_EVERY => {
                self.last_log = now;
                let _ = writeln!(self.err, "{}", log_line(&self.snap));
            }
            Mode::Log | Mode::Json => {}
        }
    }

    /// Clears the progress line (before the process prints anything else).
    pub fn finish(&mut self) {
        self.clear();
        let _ = self.out.flush();
        let _ = self.err.flush();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::restore::PartitionResult;

    const NOV_1: i64 = 1_761_955_200_000_000_000; // 2025-11-01T00:00:00Z

    #[test]
    fn numbers_read_the_human_way() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_337), "1,337");
        assert_eq!(count(352_101_222), "352,101,222");
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes((96.1 * (1u64 << 20) as f64) as u64), "96.1 MiB");
        assert_eq!(bytes((10.2 * (1u64 << 30) as f64) as u64), "10.2 GiB");
        assert_eq!(bytes(212 << 20), "212 MiB");
        assert_eq!(
            bytes_of((3.1 * (1u64 << 30) as f64) as u64, (10.2 * (1u64 << 30) as f64) as u64),
            "3.1/10.2 GiB"
        );
        assert_eq!(bytes_of(0, 0), "0/0 B");
        assert_eq!(rate(Some(212.0 * (1u64 << 20) as f64)), "212 MiB/s");
        assert_eq!(rate(Some(3.5 * (1u64 << 20) as f64)), "3.5 MiB/s");
        assert_eq!(rate(None), "- B/s");
        assert_eq!(eta(Some(34.0)), "0:34");
        assert_eq!(eta(Some(33.2)), "0:34");
        assert_eq!(eta(Some(3_723.0)), "1:02:03");
        assert_eq!(eta(None), "-:--");
        assert_eq!(eta(Some(f64::INFINITY)), "-:--");
        assert_eq!(minute(NOV_1), "2025-11-01T00:00Z");
        assert_eq!(minute(NOV_1 + 90 * 60_000_000_000), "2025-11-01T01:30Z");
        assert_eq!(hour(NOV_1 + 90 * 60_000_000_000), "2025-11-01T01Z");
        assert_eq!(bar(0, 10), "[......................]");
        assert_eq!(bar(5, 10), "[###########...........]");
        assert_eq!(bar(10, 10), "[######################]");
        assert_eq!(bar(0, 0), "[######################]");
    }

    fn gib(x: f64) -> u64 {
        (x * (1u64 << 30) as f64) as u64
    }

    #[test]
    fn the_progress_line_and_the_log_line() {
        let s = Snapshot {
            total_blocks: 1_337,
            done_blocks: 412,
            total_bytes: gib(10.2),
            done_bytes: gib(3.1),
            rate: Some(212.0 * (1u64 << 20) as f64),
            skipped: 12,
            failed: 0,
            waiting_lease: 1,
        };
        assert_eq!(
            progress_line(&s),
            "[######................]  412/1,337 blocks  3.1/10.2 GiB  212 MiB/s  ETA 0:35  skipped 12  failed 0  waiting-lease 1"
        );
        assert_eq!(
            log_line(&s),
            "restore: 412/1,337 blocks, 3.1/10.2 GiB, 212 MiB/s, ETA 0:35, skipped 12, failed 0, waiting-lease 1"
        );
        let idle = Snapshot {
            total_blocks: 3,
            total_bytes: 3 << 20,
            ..Snapshot::default()
        };
        assert_eq!(
            progress_line(&idle),
            "[......................]  0/3 blocks  0.0/3.0 MiB  - B/s  ETA -:--  skipped 0  failed 0  waiting-lease 0"
        );
    }

    #[test]
    fn the_plan_and_summary_lines() {
        let p = PlanInfo {
            tenant: Some("acme".to_owned()),
            signals: vec!["logs".to_owned(), "traces".to_owned()],
            from_ns: Some(NOV_1),
            to_ns: Some(NOV_1 + 7 * 24 * 3_600_000_000_000),
            blocks: 1_337,
            bytes: gib(10.2),
            to_restore: 1_325,
            to_restore_bytes: gib(10.1),
            already_live: 0,
            partitions: 168,
            estimated_s: Some(gib(10.1) as f64 / (200u64 << 20) as f64),
            ..PlanInfo::default()
        };
        assert_eq!(
            plan_line(&p),
            "restore acme logs,traces 2025-11-01T00:00Z..2025-11-08T00:00Z: 1,337 blocks, 10.2 GiB"
        );
        assert_eq!(
            estimate_line(&p, 200 << 20),
            "to copy: 1,325 blocks (10.1 GiB) in 168 partitions, about 0:52 at 200 MiB/s"
        );
        assert_eq!(
            estimate_line(
                &PlanInfo {
                    estimated_s: None,
                    ..p.clone()
                },
                0
            ),
            "to copy: 1,325 blocks (10.1 GiB) in 168 partitions, no rate limit"
        );
        let all = PlanInfo {
            named_blocks: 3,
            blocks: 3,
            bytes: 3 << 20,
            already_live: 1,
            refused: 1,
            ..PlanInfo::default()
        };
        assert_eq!(
            plan_line(&all),
            "restore all tenants all signals all time (3 named blocks): 3 blocks, 3.0 MiB, 1 already live, 1 cannot be restored"
        );
        let open = PlanInfo {
            from_ns: Some(NOV_1),
            ..PlanInfo::default()
        };
        assert_eq!(
            plan_line(&open),
            "restore all tenants all signals 2025-11-01T00:00Z..: 0 blocks, 0 B"
        );
        let s = Summary {
            restored: 1_325,
            restored_bytes: gib(10.1),
            already_live: 12,
            failed: 0,
            seconds: 48.2,
            rate_bytes_per_s: 214.0 * (1u64 << 20) as f64,
            verified: 1_325,
            ..Summary::default()
        };
        assert_eq!(
            summary_line(&s),
            "done: 1,325 restored (10.1 GiB), 12 already live, 0 failed, 48.2 s, 214 MiB/s; verified 1,325 primary objects"
        );
        let cut = Summary {
            interrupted: true,
            not_started: 7,
            copied_again: 1,
            ..s
        };
        assert_eq!(
            summary_line(&cut),
            "interrupted: 1,325 restored (10.1 GiB), 12 already live, 0 failed, 7 not started, 48.2 s, 214 MiB/s; verified 1,325 primary objects (1 copied again)"
        );
    }

    #[test]
    fn the_rate_is_an_average_then_smoothed_over_five_seconds() {
        let mut e = Ewma::default();
        assert_eq!(e.update(0, 1.0), None);
        // The first bytes: the average since the start (2 s).
        assert_eq!(e.update(100, 1.0), Some(50.0));
        let r = e.update(100, 5.0).expect("a rate");
        // One time constant: 1 - 1/e of the way from 50 to 20.
        let want = 50.0 + (1.0 - (-1.0f64).exp()) * (20.0 - 50.0);
        assert!((r - want).abs() < 1e-9, "{r} vs {want}");
        assert_eq!(e.update(100, 0.0), Some(r));
        let s = Snapshot {
            total_bytes: 1000,
            done_bytes: 400,
            rate: Some(100.0),
            ..Snapshot::default()
        };
        assert_eq!(s.eta_s(), Some(6.0));
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buf {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("buffer").clone()).expect("utf-8")
        }
    }

    fn block(id: &str, result: BlockResult, copied: bool) -> Event {
        Event::Block(BlockEvent {
            id: id.to_owned(),
            tenant: "acme".to_owned(),
            signal: "logs".to_owned(),
            partition_start_ns: NOV_1,
            result,
            bytes: 100,
            copied,
            reason: (result == BlockResult::Failed).then(|| "SHA-256 mismatch".to_owned()),
        })
    }

    #[test]
    fn a_terminal_gets_one_redrawn_line_and_results_on_stdout() {
        let (out, err) = (Buf::default(), Buf::default());
        let t0 = Instant::now();
        let mut p = Progress::new(Mode::Tty, Box::new(out.clone()), Box::new(err.clone()), t0);
        p.event(
            &Event::Plan(PlanInfo {
                tenant: Some("acme".to_owned()),
                blocks: 2,
                bytes: 200,
                ..PlanInfo::default()
            }),
            t0,
        );
        p.event(
            &Event::Waiting {
                lease: format!("part/acme/logs/{NOV_1}"),
                holder: "compactor-1/01J".to_owned(),
            },
            t0,
        );
        p.tick(t0 + Duration::from_secs(1));
        assert_eq!(p.snapshot().waiting_lease, 1);
        p.event(
            &Event::Partition {
                lease: format!("part/acme/logs/{NOV_1}"),
                result: PartitionResult::Started,
                blocks: 2,
                reason: None,
            },
            t0,
        );
        p.event(
            &Event::Copied {
                id: "A".to_owned(),
                bytes: 100,
            },
            t0,
        );
        p.event(&block("A", BlockResult::Restored, true), t0);
        p.event(&block("B", BlockResult::Failed, false), t0);
        p.tick(t0 + Duration::from_secs(2));
        p.event(
            &Event::Summary(Summary {
                restored: 1,
                restored_bytes: 100,
                failed: 1,
                seconds: 2.0,
                rate_bytes_per_s: 50.0,
                verified: 1,
                ..Summary::default()
            }),
            t0,
        );
        assert_eq!(
            out.text(),
            "restore acme all signals all time: 2 blocks, 200 B\n\
             done: 1 restored (100 B), 0 already live, 1 failed, 2.0 s, 50 B/s; verified 1 primary objects\n"
        );
        assert_eq!(
            err.text(),
            "waiting for lease part/acme/logs/1761955200000000000 (2025-11-01T00Z) held by compactor-1/01J\n\
             \r[......................]  0/2 blocks  0/200 B  - B/s  ETA -:--  skipped 0  failed 0  waiting-lease 1\x1b[K\
             \r\x1b[Kfailed: block B (acme/logs/2025-11-01T00Z): SHA-256 mismatch\n\
             \r[######################]  2/2 blocks  200/200 B  50 B/s  ETA 0:00  skipped 0  failed 1  waiting-lease 0\x1b[K\
             \r\x1b[K"
        );
    }

    #[test]
    fn json_mode_writes_every_event_as_one_line_and_nothing_else() {
        let (out, err) = (Buf::default(), Buf::default());
        let t0 = Instant::now();
        let mut p = Progress::new(Mode::Json, Box::new(out.clone()), Box::new(err.clone()), t0);
        p.event(&block("A", BlockResult::Restored, false), t0);
        p.event(&Event::Summary(Summary::default()), t0);
        p.tick(t0 + Duration::from_secs(10));
        let lines: Vec<serde_json::Value> = out
            .text()
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["event"], "block");
        assert_eq!(lines[0]["id"], "A");
        assert_eq!(lines[0]["result"], "restored");
        assert_eq!(lines[1]["event"], "summary");
        assert_eq!(lines[1]["interrupted"], false);
        assert_eq!(err.text(), "");
    }

    #[test]
    fn a_log_gets_a_line_every_five_seconds() {
        let (out, err) = (Buf::default(), Buf::default());
        let t0 = Instant::now();
        let mut p = Progress::new(Mode::Log, Box::new(out), Box::new(err.clone()), t0);
        for s in 1..=11 {
            p.tick(t0 + Duration::from_secs(s));
        }
        assert_eq!(err.text().lines().count(), 2, "{}", err.text());
    }
}
