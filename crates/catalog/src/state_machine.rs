//! The replicated state machine: [`State`] in memory, made durable by
//! snapshots on disk plus the Raft log after them.
//!
//! On start the last snapshot is loaded; openraft then re-applies the
//! committed log entries after it (the log store keeps the committed index).
//! Applied changes are also kept in a bounded history, numbered by log index
//! (the catalog *version*), which watch streams serve from.

use std::collections::VecDeque;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use openraft::storage::RaftStateMachine;
use openraft::{AnyError, EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, StorageIOError};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::state::{Applied, Change, State, StateImage, image};
use crate::types::{
    Accepted, CommandResult, Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

/// Changes kept for watchers (counted as single changes, so a few huge
/// commands cannot hold much); an older `after_version` gets a full reset.
pub const HISTORY_CHANGES: usize = 200_000;
const SNAPSHOT_FILE: &str = "snapshot.bin";
const SNAPSHOT_MAGIC: &[u8; 8] = b"MIRACAT1";
/// Leads a state image of version 2 (inside the snapshot file, after its
/// header). An image of version 1 has no magic: it starts with zstd's
/// frame magic (`28 b5 2f fd`), so the two never mix up.
pub const IMAGE_MAGIC_V2: &[u8; 8] = b"MIRAIMG2";

/// One applied command's changes.
#[derive(Clone, Debug)]
pub struct Event {
    pub version: u64,
    pub changes: Arc<Vec<Change>>,
}

struct Inner {
    state: State,
    applied: Option<LogId>,
    membership: StoredMembership,
    history: VecDeque<Event>,
    /// Changes held in `history`.
    history_changes: usize,
    /// `history` holds every change with version > `floor`.
    floor: u64,
}

/// The catalog as this member has applied it; shared by the state machine
/// (writer) and the gRPC service (readers).
pub struct Catalog {
    inner: RwLock<Inner>,
    version: watch::Sender<u64>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("version", &*self.version.borrow())
            .finish()
    }
}

/// Returned by [`Catalog::events_after`] when the history no longer reaches
/// back to the requested version.
#[derive(Debug)]
pub struct HistoryGone;

impl Catalog {
    fn read_inner(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` over the state and its version (the last applied log index).
    pub fn read<T>(&self, f: impl FnOnce(&State, u64) -> T) -> T {
        let inner = self.read_inner();
        f(&inner.state, inner.applied.map_or(0, |l| l.index))
    }

    /// The last applied log index.
    pub fn version(&self) -> u64 {
        *self.version.borrow()
    }

    /// Notified whenever the applied version moves.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Up to `max` events with version > `after`.
    pub fn events_after(&self, after: u64, max: usize) -> Result<Vec<Event>, HistoryGone> {
        let inner = self.read_inner();
        if after < inner.floor {
            return Err(HistoryGone);
        }
        let start = inner.history.partition_point(|e| e.version <= after);
        Ok(inner.history.iter().skip(start).take(max).cloned().collect())
    }

    /// The whole state as changes, with its version (for a watch reset).
    pub fn full_state(&self) -> (u64, Vec<Change>) {
        let inner = self.read_inner();
        (inner.applied.map_or(0, |l| l.index), inner.state.as_changes())
    }
}

/// The [`RaftStateMachine`] over a [`Catalog`].
pub struct StateMachine {
    catalog: Arc<Catalog>,
    dir: PathBuf,
}

impl std::fmt::Debug for StateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMachine").field("dir", &self.dir).finish()
    }
}

#[derive(Serialize, Deserialize)]
struct SnapshotHeader {
    meta: SnapshotMeta,
}

fn sm_err(verb: ErrorVerb, e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::new(ErrorSubject::StateMachine, verb, AnyError::new(&e)).into()
}

fn snap_err(verb: ErrorVerb, e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::new(ErrorSubject::Snapshot(None), verb, AnyError::new(&e)).into()
}

/// Serializes a state image (version 2): [`IMAGE_MAGIC_V2`], then the
/// postcard image compressed by zstd with a content checksum.
pub fn encode_image(image: &StateImage) -> std::io::Result<Vec<u8>> {
    let mut raw = postcard::to_stdvec(image).map_err(std::io::Error::other)?;
    raw.extend(postcard::to_stdvec(&image.ext).map_err(std::io::Error::other)?);
    raw.extend(postcard::to_stdvec(&image.members).map_err(std::io::Error::other)?);
    raw.extend(postcard::to_stdvec(&image.ext2).map_err(std::io::Error::other)?);
    let mut out = Vec::with_capacity(raw.len() / 4 + IMAGE_MAGIC_V2.len());
    out.extend_from_slice(IMAGE_MAGIC_V2);
    let mut enc = zstd::Encoder::new(out, 1)?;
    enc.include_checksum(true)?;
    std::io::Write::write_all(&mut enc, &raw)?;
    enc.finish()
}

/// Inverse of [`encode_image`]; also reads version 1 images (zstd of the
/// first-release image, optionally followed by its extension), migrated.
pub fn decode_image(bytes: &[u8]) -> std::io::Result<StateImage> {
    if let Some(body) = bytes.strip_prefix(IMAGE_MAGIC_V2.as_slice()) {
        let raw = zstd::decode_all(body)?;
        let (mut image, rest): (StateImage, &[u8]) = postcard::take_from_bytes(&raw).map_err(std::io::Error::other)?;
        // Images written before the extension end here, and those written
        // before member registrations after the extension.
        if !rest.is_empty() {
            let (ext, rest) = postcard::take_from_bytes(rest).map_err(std::io::Error::other)?;
            image.ext = ext;
            if !rest.is_empty() {
                let (members, rest) = postcard::take_from_bytes(rest).map_err(std::io::Error::other)?;
                image.members = members;
                // ...and those written before the second extension here.
                if !rest.is_empty() {
                    image.ext2 = postcard::from_bytes(rest).map_err(std::io::Error::other)?;
                }
            }
        }
        return Ok(image);
    }
    let raw = zstd::decode_all(bytes)?;
    let (image, rest): (image::v1::StateImage, &[u8]) =
        postcard::take_from_bytes(&raw).map_err(std::io::Error::other)?;
    let ext = if rest.is_empty() {
        image::v1::StateImageExt::default()
    } else {
        postcard::from_bytes(rest).map_err(std::io::Error::other)?
    };
    Ok(image::v1::migrate(image, ext))
}

/// Writes `[magic][u32 header len][header][data]` to `dir/snapshot.bin`
/// atomically (temp file, fsync, rename, fsync dir).
fn write_snapshot_file(dir: &Path, meta: &SnapshotMeta, data: &[u8]) -> std::io::Result<()> {
    // Builds run beside installs: never replace a newer snapshot file.
    static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = WRITING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((existing, _)) = read_snapshot_header(dir)?
        && existing.last_log_id > meta.last_log_id
    {
        return Ok(());
    }
    let header = postcard::to_stdvec(&SnapshotHeader { meta: meta.clone() }).map_err(std::io::Error::other)?;
    let header_len = u32::try_from(header.len()).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.{}.tmp", mira_core::ids::BlockId::new()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        use std::io::Write;
        f.write_all(SNAPSHOT_MAGIC)?;
        f.write_all(&header_len.to_le_bytes())?;
        f.write_all(&header)?;
        f.write_all(data)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

fn read_snapshot_header(dir: &Path) -> std::io::Result<Option<(SnapshotMeta, ())>> {
    Ok(read_snapshot_file(dir)?.map(|(m, _)| (m, ())))
}

fn read_snapshot_file(dir: &Path) -> std::io::Result<Option<(SnapshotMeta, Vec<u8>)>> {
    let bytes = match std::fs::read(dir.join(SNAPSHOT_FILE)) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("snapshot file: {what}"));
    if bytes.len() < 12 || &bytes[..8] != SNAPSHOT_MAGIC {
        return Err(bad("bad magic"));
    }
    let len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    let header_end = 12usize
        .checked_add(len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad("truncated header"))?;
    let header: SnapshotHeader = postcard::from_bytes(&bytes[12..header_end]).map_err(|_| bad("bad header"))?;
    Ok(Some((header.meta, bytes[header_end..].to_vec())))
}

impl StateMachine {
    /// Opens the state machine in `dir`, loading the last snapshot if any.
    pub fn open(dir: &Path) -> Result<StateMachine, crate::error::Error> {
        let storage = |e: std::io::Error| crate::error::Error::Storage {
            path: dir.display().to_string(),
            source: e.into(),
        };
        std::fs::create_dir_all(dir).map_err(storage)?;
        // A crash during a snapshot write leaves a temp file behind.
        for entry in std::fs::read_dir(dir).map_err(storage)?.flatten() {
            let name = entry.file_name();
            if name
                .to_str()
                .is_some_and(|n| n.starts_with(SNAPSHOT_FILE) && n.ends_with(".tmp"))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let (state, applied, membership) = match read_snapshot_file(dir).map_err(storage)? {
            Some((meta, data)) => {
                let image = decode_image(&data).map_err(storage)?;
                (State::from_image(image), meta.last_log_id, meta.last_membership)
            }
            None => (State::new(), None, StoredMembership::default()),
        };
        let version = applied.map_or(0, |l| l.index);
        let catalog = Arc::new(Catalog {
            inner: RwLock::new(Inner {
                state,
                applied,
                membership,
                history: VecDeque::new(),
                history_changes: 0,
                floor: version,
            }),
            version: watch::channel(version).0,
        });
        Ok(StateMachine {
            catalog,
            dir: dir.to_path_buf(),
        })
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.clone()
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let inner = self.catalog.read_inner();
        Ok((inner.applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut out = Vec::new();
        let version = {
            let mut inner = self
                .catalog
                .inner
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for entry in entries {
                let index = entry.log_id.index;
                inner.applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => out.push(Ok(Accepted::default())),
                    EntryPayload::Membership(m) => {
                        inner.membership = StoredMembership::new(Some(entry.log_id), m);
                        out.push(Ok(Accepted::default()));
                    }
                    EntryPayload::Normal(cmd) => match inner.state.apply(&cmd) {
                        Ok(Applied { changes, lease, epoch }) => {
                            if !changes.is_empty() {
                                inner.history_changes += changes.len();
                                inner.history.push_back(Event {
                                    version: index,
                                    changes: Arc::new(changes),
                                });
                                while inner.history_changes > HISTORY_CHANGES
                                    && let Some(old) = inner.history.pop_front()
                                {
                                    inner.history_changes -= old.changes.len();
                                    inner.floor = old.version;
                                }
                            }
                            out.push(Ok(Accepted { lease, epoch }));
                        }
                        Err(e) => out.push(Err(e)),
                    },
                }
            }
            inner.applied.map_or(0, |l| l.index)
        };
        self.catalog.version.send_replace(version);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            catalog: self.catalog.clone(),
            dir: self.dir.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let dir = self.dir.clone();
        let meta2 = meta.clone();
        let state = tokio::task::spawn_blocking(move || -> std::io::Result<State> {
            let image = decode_image(&data)?;
            write_snapshot_file(&dir, &meta2, &data)?;
            Ok(State::from_image(image))
        })
        .await
        .map_err(|e| snap_err(ErrorVerb::Write, e))?
        .map_err(|e| snap_err(ErrorVerb::Write, e))?;
        let version = meta.last_log_id.map_or(0, |l| l.index);
        {
            let mut inner = self
                .catalog
                .inner
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            inner.state = state;
            inner.applied = meta.last_log_id;
            inner.membership = meta.last_membership.clone();
            inner.history.clear();
            inner.history_changes = 0;
            inner.floor = version;
        }
        self.catalog.version.send_replace(version);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let dir = self.dir.clone();
        let found = tokio::task::spawn_blocking(move || read_snapshot_file(&dir))
            .await
            .map_err(|e| snap_err(ErrorVerb::Read, e))?
            .map_err(|e| snap_err(ErrorVerb::Read, e))?;
        Ok(found.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Builds a snapshot from a copy of the state taken under the read lock.
pub struct SnapshotBuilder {
    catalog: Arc<Catalog>,
    dir: PathBuf,
}

impl std::fmt::Debug for SnapshotBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotBuilder").field("dir", &self.dir).finish()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let (image, applied, membership) = {
            let inner = self.catalog.read_inner();
            (inner.state.to_image(), inner.applied, inner.membership.clone())
        };
        let snapshot_id = match applied {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, mira_core::ids::BlockId::new()),
            None => format!("empty-{}", mira_core::ids::BlockId::new()),
        };
        let meta = SnapshotMeta {
            last_log_id: applied,
            last_membership: membership,
            snapshot_id,
        };
        let dir = self.dir.clone();
        let meta2 = meta.clone();
        let data = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let data = encode_image(&image)?;
            write_snapshot_file(&dir, &meta2, &data)?;
            Ok(data)
        })
        .await
        .map_err(|e| sm_err(ErrorVerb::Write, e))?
        .map_err(|e| snap_err(ErrorVerb::Write, e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}
