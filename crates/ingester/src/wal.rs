//! The write-ahead log: segmented files in one directory, owned by a
//! dedicated writer thread (no lock is held across I/O on a runtime
//! worker). Appends queue on a bounded channel; the thread takes everything
//! queued, writes it with one `write(2)`, in `fsync` mode syncs once for the
//! whole group, and then acknowledges each append with its sequence number.
//!
//! Ack contracts:
//! - `page-cache`: acknowledged after `write(2)`: survives a process kill,
//!   not a power cut.
//! - `fsync`: acknowledged after `fdatasync` covering the frame: survives
//!   both.
//! - `off`: nothing is written; [`Wal::append`] returns the next sequence at
//!   once, and the caller acknowledges only after the block is published.
//!
//! Segments are named by the first sequence they hold; each process run
//! starts a new one and writes beside it the attribute limits it applied
//! (`{first}.limits`), so a replay rebuilds exactly the rows that were
//! acknowledged whatever limits the restarted process has. On open, the
//! newest segment's torn tail (a frame cut by a crash) is cut off; a corrupt
//! frame anywhere else stops the start with the segment and offset named
//! (or is skipped and counted with `skip_corrupt`).
//!
//! A failed group write answers every append in it with an error, cuts the
//! segment back to where the group began (so no half frame is left before
//! later ones), and the next group tries again: the WAL is unhealthy until
//! a write succeeds. Each append can carry a [`Ticket`] of its generation's
//! [`Acks`], so a shard learns which of its frames were written before it
//! publishes anything.
//!
//! [`Wal::sweep`] deletes segments whose every frame is at or below its
//! shard's published watermark.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mira_core::convert::Limits;
use mira_core::ids::{Signal, TenantId};
use mira_core::wal::{Frame, FrameError, FrameReader, encode_frame};
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::WalError;

const SUFFIX: &str = ".wal";
const LIMITS_SUFFIX: &str = ".limits";

/// When an append is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalMode {
    /// After `write(2)` (default).
    PageCache,
    /// After a group `fdatasync`.
    Fsync,
    /// No WAL: acknowledge after the block is published.
    Off,
}

impl WalMode {
    pub const ALL: [WalMode; 3] = [WalMode::PageCache, WalMode::Fsync, WalMode::Off];

    pub fn as_str(self) -> &'static str {
        match self {
            WalMode::PageCache => "page-cache",
            WalMode::Fsync => "fsync",
            WalMode::Off => "off",
        }
    }
}

impl std::str::FromStr for WalMode {
    type Err = String;

    fn from_str(s: &str) -> Result<WalMode, String> {
        WalMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| format!("unknown WAL mode {s:?}: page-cache, fsync or off"))
    }
}

impl std::fmt::Display for WalMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for WalMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for WalMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[derive(Clone, Debug)]
pub struct WalConfig {
    pub dir: PathBuf,
    pub mode: WalMode,
    /// Start a new segment once the current one passes this size.
    pub segment_bytes: u64,
    /// Appends queued for the writer thread before senders wait.
    pub queue: usize,
    /// The attribute limits the frames written by this process were
    /// acknowledged under (recorded beside each new segment).
    pub limits: Limits,
    /// Skip (and count) corrupt frames inside segments instead of refusing
    /// to start.
    pub skip_corrupt: bool,
}

impl WalConfig {
    pub fn new(dir: PathBuf, mode: WalMode) -> WalConfig {
        WalConfig {
            dir,
            mode,
            segment_bytes: 64 * 1024 * 1024,
            queue: 4096,
            limits: Limits::NONE,
            skip_corrupt: false,
        }
    }
}

/// The WAL outcome of every frame of one generation: how many are not yet
/// settled (written or failed) and which failed.
#[derive(Debug)]
pub struct Acks {
    pending: watch::Sender<usize>,
    failed: Mutex<Vec<u64>>,
}

impl Acks {
    pub fn new() -> Arc<Acks> {
        Arc::new(Acks {
            pending: watch::channel(0).0,
            failed: Mutex::new(Vec::new()),
        })
    }

    /// A ticket for one more frame; it settles when the writer is done
    /// with the frame (failed unless written).
    pub fn ticket(self: &Arc<Self>) -> Ticket {
        self.pending.send_modify(|n| *n += 1);
        Ticket {
            acks: self.clone(),
            seq: 0,
            ok: false,
        }
    }

    /// Waits until every ticket settled; returns the sequences that failed.
    pub async fn settled(&self) -> Vec<u64> {
        let mut rx = self.pending.subscribe();
        // The sender lives in `self`, so the channel cannot close here.
        let _ = rx.wait_for(|n| *n == 0).await;
        std::mem::take(&mut *self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// One frame's share of an [`Acks`]: settles on drop.
#[derive(Debug)]
pub struct Ticket {
    acks: Arc<Acks>,
    seq: u64,
    ok: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.ok {
            self.acks
                .failed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(self.seq);
        }
        self.acks.pending.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A frame the writer wrote, with where its time went (the ingester's
/// phase probes).
#[derive(Clone, Copy, Debug)]
pub struct Written {
    pub seq: u64,
    /// From the submit until the writer took the frame into a group (the
    /// group commit wait).
    pub queued: std::time::Duration,
    /// The group's encoding, write(2) and, in fsync mode, fdatasync.
    pub write: std::time::Duration,
    /// When the writer finished the group (to time the wake-up of the
    /// request waiting for it).
    pub at: std::time::Instant,
}

struct Append {
    seq: u64,
    /// When it was submitted.
    queued: std::time::Instant,
    signal: Signal,
    shard: u16,
    tenant: TenantId,
    payload: bytes::Bytes,
    ack: oneshot::Sender<Result<Written, WalError>>,
    ticket: Option<Ticket>,
}

/// What each segment holds: highest sequence per shard.
#[derive(Debug, Default)]
struct Segments {
    /// first seq → (path, shard → max seq)
    by_first: BTreeMap<u64, (PathBuf, BTreeMap<u16, u64>)>,
    /// The segment being written (never swept).
    current: Option<u64>,
}

/// Where group timings go (the ingester's probes).
type StatsHook = Arc<Mutex<Option<Box<dyn Fn(GroupStats) + Send + Sync>>>>;

/// Timings of one group write, for the probes.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupStats {
    pub frames: usize,
    pub bytes: usize,
    pub write: std::time::Duration,
    pub fsync: std::time::Duration,
}

/// The write-ahead log handle; cheap to clone.
#[derive(Clone)]
pub struct Wal {
    tx: Option<mpsc::Sender<Append>>,
    segments: Arc<Mutex<Segments>>,
    mode: WalMode,
    next_off: Arc<AtomicU64>,
    stats: StatsHook,
    healthy: Arc<AtomicBool>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").field("mode", &self.mode).finish_non_exhaustive()
    }
}

fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("{first_seq:020}{SUFFIX}"))
}

fn limits_path(segment: &Path) -> PathBuf {
    segment.with_extension(&LIMITS_SUFFIX[1..])
}

fn encode_limits(l: &Limits) -> String {
    format!("max_attrs={}\nmax_value_bytes={}\n", l.max_attrs, l.max_value_bytes)
}

/// The limits a segment's frames were acknowledged under; `None` for a
/// segment written before they were recorded.
fn read_limits(segment: &Path) -> Result<Option<Limits>, WalError> {
    let path = limits_path(segment);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(WalError::io(&path, e)),
    };
    let mut limits = Limits::NONE;
    for line in text.lines().filter(|l| !l.is_empty()) {
        let parsed = line
            .split_once('=')
            .and_then(|(k, v)| Some((k, v.parse::<usize>().ok()?)));
        match parsed {
            Some(("max_attrs", v)) => limits.max_attrs = v,
            Some(("max_value_bytes", v)) => limits.max_value_bytes = v,
            _ => {
                return Err(WalError::Corrupt {
                    path: path.display().to_string(),
                    offset: 0,
                    reason: format!("unreadable limits line {line:?}"),
                });
            }
        }
    }
    Ok(Some(limits))
}

fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, WalError> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| WalError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| WalError::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(SUFFIX) else {
            continue;
        };
        if let Ok(first) = stem.parse::<u64>() {
            out.push((first, entry.path()));
        }
    }
    out.sort_unstable_by_key(|(first, _)| *first);
    Ok(out)
}

/// Frames of one segment; `Err` carries where and why reading stopped early.
fn read_segment(path: &Path) -> Result<(Vec<u8>, Option<FrameError>), WalError> {
    let bytes = std::fs::read(path).map_err(|e| WalError::io(path, e))?;
    let mut r = FrameReader::new(&bytes, 0);
    let mut stop = None;
    while let Some(f) = r.next_frame() {
        if let Err(e) = f {
            stop = Some(e);
            break;
        }
    }
    Ok((bytes, stop))
}

/// Counts what a replay saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    pub frames: u64,
    pub skipped: u64,
    /// Bytes cut from a torn tail when the WAL was opened.
    pub torn_bytes: u64,
    /// Segments whose frames stopped at a corrupt frame before their end
    /// (skipped with `skip_corrupt`).
    pub corrupt_segments: u64,
}

fn corrupt(path: &Path, e: &FrameError) -> WalError {
    WalError::Corrupt {
        path: path.display().to_string(),
        offset: e.offset() as u64,
        reason: e.to_string(),
    }
}

impl Wal {
    /// Opens the WAL in `config.dir` (creating it), repairs a torn tail, and
    /// starts the writer thread. Returns the handle and the last sequence
    /// number found (0 when empty). In `off` mode nothing new is written,
    /// but segments left by an earlier run in another mode are read (their
    /// frames are replayed like any other).
    pub fn open(config: &WalConfig) -> Result<(Wal, u64, ReplayStats), WalError> {
        let segments = Arc::new(Mutex::new(Segments::default()));
        let mut stats = ReplayStats::default();
        if config.mode == WalMode::Off && !config.dir.exists() {
            let wal = Wal {
                tx: None,
                segments,
                mode: config.mode,
                next_off: Arc::new(AtomicU64::new(1)),
                stats: Arc::new(Mutex::new(None)),
                healthy: Arc::new(AtomicBool::new(true)),
            };
            return Ok((wal, 0, stats));
        }
        std::fs::create_dir_all(&config.dir).map_err(|e| WalError::io(&config.dir, e))?;
        let mut last_seq = 0;
        let listed = list_segments(&config.dir)?;
        let n = listed.len();
        for (i, (first, path)) in listed.into_iter().enumerate() {
            let (bytes, stop) = read_segment(&path)?;
            let good = stop.as_ref().map_or(bytes.len(), FrameError::offset);
            let mut shards = BTreeMap::new();
            let mut r = FrameReader::new(&bytes[..good], 0);
            while let Some(Ok(f)) = r.next_frame() {
                last_seq = last_seq.max(f.seq);
                let e = shards.entry(f.shard).or_insert(0);
                *e = (*e).max(f.seq);
            }
            if let Some(e) = &stop {
                if i + 1 == n && matches!(e, FrameError::Torn { .. }) {
                    // The tail of the newest segment: a write cut short.
                    let f = OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map_err(|e| WalError::io(&path, e))?;
                    f.set_len(good as u64).map_err(|e| WalError::io(&path, e))?;
                    f.sync_all().map_err(|e| WalError::io(&path, e))?;
                    stats.torn_bytes += (bytes.len() - good) as u64;
                } else if config.skip_corrupt {
                    stats.corrupt_segments += 1;
                    tracing::error!(target: "mira::ingester::wal", path = %path.display(), offset = good, error = %e, "corrupt WAL frame; the frames after it in this segment are skipped (--wal-skip-corrupt)");
                } else {
                    return Err(corrupt(&path, e));
                }
            }
            segments
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .by_first
                .insert(first, (path, shards));
        }
        let healthy = Arc::new(AtomicBool::new(true));
        if config.mode == WalMode::Off {
            let wal = Wal {
                tx: None,
                segments,
                mode: config.mode,
                next_off: Arc::new(AtomicU64::new(last_seq + 1)),
                stats: Arc::new(Mutex::new(None)),
                healthy,
            };
            return Ok((wal, last_seq, stats));
        }
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let wal = Wal {
            tx: Some(tx),
            segments: segments.clone(),
            mode: config.mode,
            next_off: Arc::new(AtomicU64::new(last_seq + 1)),
            stats: Arc::new(Mutex::new(None)),
            healthy: healthy.clone(),
        };
        let writer = Writer {
            dir: config.dir.clone(),
            fsync: config.mode == WalMode::Fsync,
            segment_bytes: config.segment_bytes,
            limits: encode_limits(&config.limits),
            file: None,
            file_len: 0,
            segments,
            stats: wal.stats.clone(),
            healthy,
        };
        std::thread::Builder::new()
            .name("mira-wal".to_owned())
            .spawn(move || writer.run(rx))
            .map_err(|e| WalError::io(&config.dir, e))?;
        Ok((wal, last_seq, stats))
    }

    pub fn mode(&self) -> WalMode {
        self.mode
    }

    /// Makes every sequence handed out from now on greater than `seq` (the
    /// highest watermark the catalog holds for this ingester: a WAL emptied
    /// by a sweep, or a new volume, must not count from 1 again). Call
    /// before the first append.
    pub fn raise_floor(&self, seq: u64) {
        self.next_off.fetch_max(seq.saturating_add(1), Ordering::SeqCst);
    }

    /// False from a failed write until the next one succeeds.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Installs a callback that receives the timings of every group write.
    pub fn on_group(&self, f: impl Fn(GroupStats) + Send + Sync + 'static) {
        *self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Box::new(f));
    }

    /// Logs one request; resolves with its sequence number once durable to
    /// the mode's promise. Cancel safe: dropping the future before it
    /// resolves may still log the frame (replay then holds a request that
    /// was never acknowledged, which the client retries: at-least-once).
    pub async fn append(
        &self,
        signal: Signal,
        shard: u16,
        tenant: TenantId,
        payload: bytes::Bytes,
    ) -> Result<u64, WalError> {
        let (seq, rx) = self.submit(signal, shard, tenant, payload, None).await?;
        rx.await.map_err(|_| WalError::Stopped)?.map(|_| seq)
    }

    /// Queues one request for the writer and returns its sequence number at
    /// once, with a receiver that resolves when it is durable. Sequences are
    /// assigned in submission order, so one caller (a shard) submitting in
    /// turn gets increasing sequences in the order its frames are written.
    /// In `off` mode the receiver resolves at once. A `ticket` settles
    /// when the writer is done with the frame.
    pub async fn submit(
        &self,
        signal: Signal,
        shard: u16,
        tenant: TenantId,
        payload: bytes::Bytes,
        ticket: Option<Ticket>,
    ) -> Result<(u64, oneshot::Receiver<Result<Written, WalError>>), WalError> {
        let queued = std::time::Instant::now();
        let (ack, rx) = oneshot::channel();
        let Some(tx) = &self.tx else {
            let seq = self.next_off.fetch_add(1, Ordering::Relaxed);
            if let Some(mut t) = ticket {
                t.ok = true;
            }
            let _ = ack.send(Ok(Written {
                seq,
                queued: std::time::Duration::ZERO,
                write: std::time::Duration::ZERO,
                at: queued,
            }));
            return Ok((seq, rx));
        };
        // Reserve the channel slot first so the sequence and the send
        // happen together for this caller.
        let permit = tx.reserve().await.map_err(|_| WalError::Stopped)?;
        let seq = self.next_off.fetch_add(1, Ordering::Relaxed);
        permit.send(Append {
            seq,
            queued,
            signal,
            shard,
            tenant,
            payload,
            ack,
            ticket: ticket.map(|mut t| {
                t.seq = seq;
                t
            }),
        });
        Ok((seq, rx))
    }

    /// Calls `f` for every frame whose sequence is above its shard's
    /// watermark (`watermark(shard)`), segment by segment (one segment in
    /// memory at a time), with the limits the frame was acknowledged under
    /// (`current` for segments that recorded none). A corrupt frame is an
    /// error naming the segment and offset unless `skip_corrupt`.
    pub fn replay(
        dir: &Path,
        current: Limits,
        skip_corrupt: bool,
        watermark: impl Fn(u16) -> u64,
        mut f: impl FnMut(Frame<'_>, &Limits) -> Result<(), WalError>,
    ) -> Result<ReplayStats, WalError> {
        let mut stats = ReplayStats::default();
        for path in Wal::segment_paths(dir)? {
            let s = Wal::replay_segment(&path, current, skip_corrupt, &watermark, &mut f)?;
            stats.frames += s.frames;
            stats.skipped += s.skipped;
            stats.corrupt_segments += s.corrupt_segments;
        }
        Ok(stats)
    }

    /// The segment files in `dir`, oldest first (none when it is absent).
    pub fn segment_paths(dir: &Path) -> Result<Vec<PathBuf>, WalError> {
        if !dir.exists() {
            return Ok(Vec::new());
        }
        Ok(list_segments(dir)?.into_iter().map(|(_, p)| p).collect())
    }

    /// [`Wal::replay`] of one segment file.
    pub fn replay_segment(
        path: &Path,
        current: Limits,
        skip_corrupt: bool,
        watermark: &impl Fn(u16) -> u64,
        f: &mut impl FnMut(Frame<'_>, &Limits) -> Result<(), WalError>,
    ) -> Result<ReplayStats, WalError> {
        let mut stats = ReplayStats::default();
        let (bytes, stop) = read_segment(path)?;
        if let Some(e) = &stop {
            if !skip_corrupt {
                return Err(corrupt(path, e));
            }
            stats.corrupt_segments += 1;
        }
        let limits = read_limits(path)?.unwrap_or(current);
        let mut r = FrameReader::new(&bytes, 0);
        while let Some(Ok(frame)) = r.next_frame() {
            if frame.seq <= watermark(frame.shard) {
                stats.skipped += 1;
                continue;
            }
            stats.frames += 1;
            f(frame, &limits)?;
        }
        Ok(stats)
    }

    /// Deletes segments (except the one being written) whose every frame is
    /// at or below its shard's watermark. Returns how many were deleted.
    pub fn sweep(&self, watermark: impl Fn(u16) -> u64) -> Result<usize, WalError> {
        let doomed: Vec<(u64, PathBuf)> = {
            let segs = self.segments.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let current = segs.current;
            segs.by_first
                .iter()
                .filter(|(first, _)| Some(**first) != current)
                .filter(|(_, (_, shards))| shards.iter().all(|(shard, max)| *max <= watermark(*shard)))
                .map(|(first, (path, _))| (*first, path.clone()))
                .collect()
        };
        for (first, path) in &doomed {
            for p in [path.clone(), limits_path(path)] {
                match std::fs::remove_file(&p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(WalError::io(&p, e)),
                }
            }
            self.segments
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .by_first
                .remove(first);
        }
        Ok(doomed.len())
    }

    /// The segments holding a frame above its shard's watermark, oldest
    /// first: what a recovery must read. (Opening the WAL already read every
    /// segment once and noted each shard's highest sequence in it, so the
    /// published ones are not read again.)
    pub fn unpublished_segments(&self, watermark: impl Fn(u16) -> u64) -> Vec<PathBuf> {
        self.segments
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .by_first
            .values()
            .filter(|(_, shards)| shards.iter().any(|(shard, max)| *max > watermark(*shard)))
            .map(|(path, _)| path.clone())
            .collect()
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.segments
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .by_first
            .len()
    }
}

struct Writer {
    dir: PathBuf,
    fsync: bool,
    segment_bytes: u64,
    /// The limits file written beside each new segment.
    limits: String,
    file: Option<File>,
    file_len: u64,
    segments: Arc<Mutex<Segments>>,
    stats: StatsHook,
    healthy: Arc<AtomicBool>,
}

/// Most frames written in one group.
const MAX_GROUP: usize = 1024;

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Append>) {
        let mut buf = Vec::new();
        let mut group: Vec<(Append, u64)> = Vec::new();
        // Set when a failed group could not be cut back off the segment: a
        // half frame may sit in the file, so nothing more is written to it.
        let mut broken: Option<WalError> = None;
        while let Some(first) = rx.blocking_recv() {
            let taken = std::time::Instant::now();
            group.clear();
            buf.clear();
            let mut push = |a: Append, group: &mut Vec<(Append, u64)>| {
                encode_frame(&mut buf, a.seq, a.signal, a.shard, &a.tenant, &a.payload);
                let seq = a.seq;
                group.push((a, seq));
            };
            push(first, &mut group);
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(a) => push(a, &mut group),
                    Err(_) => break,
                }
            }
            if let Some(e) = &broken {
                for (a, _) in group.drain(..) {
                    let _ = a.ack.send(Err(e.clone()));
                }
                continue;
            }
            match self.write_group(&buf, &group) {
                Ok(stats) => {
                    if let Some(cb) = self
                        .stats
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .as_ref()
                    {
                        cb(stats);
                    }
                    if !self.healthy.swap(true, Ordering::Relaxed) {
                        tracing::info!(target: "mira::ingester::wal", "WAL writes succeed again");
                    }
                    let at = std::time::Instant::now();
                    for (mut a, seq) in group.drain(..) {
                        if let Some(t) = a.ticket.as_mut() {
                            t.ok = true;
                        }
                        let _ = a.ack.send(Ok(Written {
                            seq,
                            queued: taken.saturating_duration_since(a.queued),
                            write: at.saturating_duration_since(taken),
                            at,
                        }));
                    }
                }
                Err(e) => {
                    self.healthy.store(false, Ordering::Relaxed);
                    let unrecoverable = self.rollback().err();
                    tracing::error!(target: "mira::ingester::wal", error = %e, frames = group.len(), "WAL write failed; these appends are refused, the next group tries again");
                    for (a, _) in group.drain(..) {
                        let _ = a.ack.send(Err(e.clone()));
                    }
                    if let Some(r) = unrecoverable {
                        tracing::error!(target: "mira::ingester::wal", error = %r, "could not cut a failed write off the WAL segment; refusing every append until restart");
                        broken = Some(r);
                    }
                }
            }
        }
    }

    /// Cuts the current segment back to its length before a failed group;
    /// drops a segment that could not be started.
    fn rollback(&mut self) -> Result<(), WalError> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        file.set_len(self.file_len).map_err(|e| WalError::io(&self.dir, e))?;
        Ok(())
    }

    fn write_group(&mut self, buf: &[u8], group: &[(Append, u64)]) -> Result<GroupStats, WalError> {
        #[cfg(feature = "fault-hooks")]
        if let Some(e) = fault::wal_write_error(&self.dir) {
            return Err(e);
        }
        let first_seq = group.iter().map(|(_, s)| *s).min().unwrap_or(0);
        if self.file.is_none() || self.file_len >= self.segment_bytes {
            let path = segment_path(&self.dir, first_seq);
            let limits = limits_path(&path);
            std::fs::write(&limits, &self.limits).map_err(|e| WalError::io(&limits, e))?;
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| WalError::io(&path, e))?;
            if let Ok(d) = File::open(&self.dir) {
                let _ = d.sync_all();
            }
            {
                let mut segs = self.segments.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                segs.by_first.insert(first_seq, (path, BTreeMap::new()));
                segs.current = Some(first_seq);
            }
            self.file = Some(file);
            self.file_len = 0;
        }
        let Some(file) = self.file.as_mut() else {
            return Err(WalError::Stopped);
        };
        let t = std::time::Instant::now();
        file.write_all(buf).map_err(|e| WalError::io(&self.dir, e))?;
        let write = t.elapsed();
        let t = std::time::Instant::now();
        if self.fsync {
            file.sync_data().map_err(|e| WalError::io(&self.dir, e))?;
        }
        let fsync = t.elapsed();
        self.file_len += buf.len() as u64;
        {
            let mut segs = self.segments.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let current = segs.current;
            if let Some((_, shards)) = current.and_then(|c| segs.by_first.get_mut(&c)) {
                for (a, seq) in group {
                    let e = shards.entry(a.shard).or_insert(0);
                    *e = (*e).max(*seq);
                }
            }
        }
        Ok(GroupStats {
            frames: group.len(),
            bytes: buf.len(),
            write,
            fsync,
        })
    }
}

/// Test-only faults (`--features fault-hooks`): a file `FAIL_WRITES` in
/// the WAL directory makes every group write fail as a full disk would,
/// until it is removed.
#[cfg(feature = "fault-hooks")]
mod fault {
    use super::WalError;

    pub(super) fn wal_write_error(dir: &std::path::Path) -> Option<WalError> {
        dir.join("FAIL_WRITES").exists().then(|| WalError::Io {
            path: dir.display().to_string(),
            message: "No space left on device (os error 28) [fault hook]".to_owned(),
        })
    }
}
