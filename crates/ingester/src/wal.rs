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
//! Segments are named by the first sequence they hold. On open, the last
//! segment is scanned and a torn tail (a frame cut by a crash) is cut off.
//! [`Wal::sweep`] deletes segments whose every frame is at or below its
//! shard's published watermark.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use mira_core::ids::{Signal, TenantId};
use mira_core::wal::{Frame, FrameError, FrameReader, encode_frame};
use tokio::sync::{mpsc, oneshot};

use crate::error::WalError;

const SUFFIX: &str = ".wal";

/// When an append is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WalMode {
    /// After `write(2)` (default).
    PageCache,
    /// After a group `fdatasync`.
    Fsync,
    /// No WAL: acknowledge after the block is published.
    Off,
}

#[derive(Clone, Debug)]
pub struct WalConfig {
    pub dir: PathBuf,
    pub mode: WalMode,
    /// Start a new segment once the current one passes this size.
    pub segment_bytes: u64,
    /// Appends queued for the writer thread before senders wait.
    pub queue: usize,
}

impl WalConfig {
    pub fn new(dir: PathBuf, mode: WalMode) -> WalConfig {
        WalConfig {
            dir,
            mode,
            segment_bytes: 64 * 1024 * 1024,
            queue: 4096,
        }
    }
}

struct Append {
    seq: u64,
    signal: Signal,
    shard: u16,
    tenant: TenantId,
    payload: bytes::Bytes,
    ack: oneshot::Sender<Result<u64, WalError>>,
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
    next_off: Arc<std::sync::atomic::AtomicU64>,
    stats: StatsHook,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").field("mode", &self.mode).finish_non_exhaustive()
    }
}

fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("{first_seq:020}{SUFFIX}"))
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
    /// Segments whose frames stopped at a corrupt frame before their end.
    pub corrupt_segments: u64,
}

impl Wal {
    /// Opens the WAL in `config.dir` (creating it), repairs a torn tail, and
    /// starts the writer thread. Returns the handle and the last sequence
    /// number found (0 when empty). In `off` mode no file is touched.
    pub fn open(config: &WalConfig) -> Result<(Wal, u64, ReplayStats), WalError> {
        let segments = Arc::new(Mutex::new(Segments::default()));
        let mut stats = ReplayStats::default();
        if config.mode == WalMode::Off {
            let wal = Wal {
                tx: None,
                segments,
                mode: config.mode,
                next_off: Arc::new(std::sync::atomic::AtomicU64::new(1)),
                stats: Arc::new(Mutex::new(None)),
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
            if stop.is_some() {
                if i + 1 == n {
                    // The tail of the newest segment: a write cut short.
                    let f = OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map_err(|e| WalError::io(&path, e))?;
                    f.set_len(good as u64).map_err(|e| WalError::io(&path, e))?;
                    f.sync_all().map_err(|e| WalError::io(&path, e))?;
                    stats.torn_bytes += (bytes.len() - good) as u64;
                } else {
                    stats.corrupt_segments += 1;
                    tracing::warn!(target: "mira::ingester::wal", path = %path.display(), offset = good, "corrupt frame inside a sealed WAL segment; frames after it are not replayed");
                }
            }
            segments
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .by_first
                .insert(first, (path, shards));
        }
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let wal = Wal {
            tx: Some(tx),
            segments: segments.clone(),
            mode: config.mode,
            next_off: Arc::new(std::sync::atomic::AtomicU64::new(last_seq + 1)),
            stats: Arc::new(Mutex::new(None)),
        };
        let writer = Writer {
            dir: config.dir.clone(),
            fsync: config.mode == WalMode::Fsync,
            segment_bytes: config.segment_bytes,
            file: None,
            file_len: 0,
            segments,
            stats: wal.stats.clone(),
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
        let (seq, rx) = self.submit(signal, shard, tenant, payload).await?;
        rx.await.map_err(|_| WalError::Stopped)?.map(|_| seq)
    }

    /// Queues one request for the writer and returns its sequence number at
    /// once, with a receiver that resolves when it is durable. Sequences are
    /// assigned in submission order, so one caller (a shard) submitting in
    /// turn gets increasing sequences in the order its frames are written.
    /// In `off` mode the receiver resolves at once.
    pub async fn submit(
        &self,
        signal: Signal,
        shard: u16,
        tenant: TenantId,
        payload: bytes::Bytes,
    ) -> Result<(u64, oneshot::Receiver<Result<u64, WalError>>), WalError> {
        let (ack, rx) = oneshot::channel();
        let Some(tx) = &self.tx else {
            let seq = self.next_off.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let _ = ack.send(Ok(seq));
            return Ok((seq, rx));
        };
        // Reserve the channel slot first so the sequence and the send
        // happen together for this caller.
        let permit = tx.reserve().await.map_err(|_| WalError::Stopped)?;
        let seq = self.next_off.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        permit.send(Append {
            seq,
            signal,
            shard,
            tenant,
            payload,
            ack,
        });
        Ok((seq, rx))
    }

    /// Calls `f` for every frame whose sequence is above its shard's
    /// watermark (`watermark(shard)`), in sequence order.
    pub fn replay(
        dir: &Path,
        watermark: impl Fn(u16) -> u64,
        mut f: impl FnMut(Frame<'_>) -> Result<(), WalError>,
    ) -> Result<ReplayStats, WalError> {
        let mut stats = ReplayStats::default();
        if !dir.exists() {
            return Ok(stats);
        }
        for (_, path) in list_segments(dir)? {
            let (bytes, stop) = read_segment(&path)?;
            if stop.is_some() {
                stats.corrupt_segments += 1;
            }
            let mut r = FrameReader::new(&bytes, 0);
            while let Some(Ok(frame)) = r.next_frame() {
                if frame.seq <= watermark(frame.shard) {
                    stats.skipped += 1;
                    continue;
                }
                stats.frames += 1;
                f(frame)?;
            }
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
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(WalError::io(path, e)),
            }
            self.segments
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .by_first
                .remove(first);
        }
        Ok(doomed.len())
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
    file: Option<File>,
    file_len: u64,
    segments: Arc<Mutex<Segments>>,
    stats: StatsHook,
}

/// Most frames written in one group.
const MAX_GROUP: usize = 1024;

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Append>) {
        let mut buf = Vec::new();
        let mut group: Vec<(Append, u64)> = Vec::new();
        let mut failed: Option<WalError> = None;
        while let Some(first) = rx.blocking_recv() {
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
            if let Some(e) = &failed {
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
                    for (a, seq) in group.drain(..) {
                        let _ = a.ack.send(Ok(seq));
                    }
                }
                Err(e) => {
                    tracing::error!(target: "mira::ingester::wal", error = %e, "WAL write failed; refusing appends");
                    for (a, _) in group.drain(..) {
                        let _ = a.ack.send(Err(e.clone()));
                    }
                    failed = Some(e);
                }
            }
        }
    }

    fn write_group(&mut self, buf: &[u8], group: &[(Append, u64)]) -> Result<GroupStats, WalError> {
        let first_seq = group.iter().map(|(_, s)| *s).min().unwrap_or(0);
        if self.file.is_none() || self.file_len >= self.segment_bytes {
            let path = segment_path(&self.dir, first_seq);
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
