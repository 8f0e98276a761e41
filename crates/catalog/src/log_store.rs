//! The Raft log and vote, durable in a redb database.
//!
//! Every write (append, truncate, purge, vote, committed) is one redb write
//! transaction committed with `Durability::Immediate` on a blocking thread;
//! an append reports flushed only after that commit returned. Writes are
//! serialized by openraft (it awaits each call), as the trait requires.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, ErrorSubject, ErrorVerb, RaftLogReader, StorageIOError};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_PURGED: &str = "last_purged";

/// The log store; clones share one database.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

fn io_err(subject: ErrorSubject<u64>, verb: ErrorVerb, e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::new(subject, verb, AnyError::new(&e)).into()
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError {
    io_err(ErrorSubject::Logs, ErrorVerb::Write, e)
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError {
    io_err(ErrorSubject::Logs, ErrorVerb::Read, e)
}

impl LogStore {
    /// Opens (or creates) the log at `path`.
    pub fn open(path: &Path) -> Result<LogStore, crate::error::Error> {
        let storage = |e: Box<dyn std::error::Error + Send + Sync>| crate::error::Error::Storage {
            path: path.display().to_string(),
            source: e,
        };
        let db = Database::create(path).map_err(|e| storage(e.into()))?;
        let txn = db.begin_write().map_err(|e| storage(e.into()))?;
        txn.open_table(LOG).map_err(|e| storage(e.into()))?;
        txn.open_table(META).map_err(|e| storage(e.into()))?;
        txn.commit().map_err(|e| storage(e.into()))?;
        Ok(LogStore { db: Arc::new(db) })
    }

    /// Runs one durable write transaction on a blocking thread.
    async fn write<F>(&self, f: F) -> Result<(), StorageError>
    where
        F: FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error> + Send + 'static,
    {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || -> Result<(), redb::Error> {
            let mut txn = db.begin_write()?;
            txn.set_durability(Durability::Immediate)
                .map_err(|e| redb::Error::Io(std::io::Error::other(e.to_string())))?;
            f(&txn)?;
            txn.commit()?;
            Ok(())
        })
        .await
        .map_err(write_err)?
        .map_err(write_err)
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StorageError> {
        let txn = self.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(META).map_err(read_err)?;
        let Some(v) = table.get(key).map_err(read_err)? else {
            return Ok(None);
        };
        postcard::from_bytes(v.value()).map(Some).map_err(read_err)
    }

    async fn put_meta<T: serde::Serialize>(&self, key: &'static str, value: &T) -> Result<(), StorageError> {
        let bytes = postcard::to_stdvec(value).map_err(write_err)?;
        self.write(move |txn| {
            txn.open_table(META)?.insert(key, bytes.as_slice())?;
            Ok(())
        })
        .await
    }

    /// Entries in `range`, in order.
    fn read_range(&self, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<Entry>, StorageError> {
        let txn = self.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(LOG).map_err(read_err)?;
        let mut out = Vec::new();
        for item in table.range::<u64>(range).map_err(read_err)? {
            let (_, v) = item.map_err(read_err)?;
            out.push(postcard::from_bytes(v.value()).map_err(read_err)?);
        }
        Ok(out)
    }

    /// Number of entries in the log (for metrics).
    pub fn len(&self) -> u64 {
        self.db
            .begin_read()
            .ok()
            .and_then(|t| t.open_table(LOG).ok())
            .and_then(|t| t.len().ok())
            .unwrap_or(0)
    }

    /// Whether the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let bounds = (range.start_bound().cloned(), range.end_bound().cloned());
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.read_range(bounds))
            .await
            .map_err(read_err)?
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.get_meta(KEY_PURGED)?;
        let last = {
            let txn = self.db.begin_read().map_err(read_err)?;
            let table = txn.open_table(LOG).map_err(read_err)?;
            match table.last().map_err(read_err)? {
                Some((_, v)) => Some(postcard::from_bytes::<Entry>(v.value()).map_err(read_err)?.log_id),
                None => None,
            }
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last.or(last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.put_meta(KEY_VOTE, vote).await.map_err(|e| {
            io_err(
                ErrorSubject::Vote,
                ErrorVerb::Write,
                std::io::Error::other(e.to_string()),
            )
        })
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(KEY_VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.put_meta(KEY_COMMITTED, &committed).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.get_meta::<Option<LogId>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut encoded = Vec::new();
        for e in entries {
            encoded.push((e.log_id.index, postcard::to_stdvec(&e).map_err(write_err)?));
        }
        let res = self
            .write(move |txn| {
                let mut table = txn.open_table(LOG)?;
                for (index, bytes) in &encoded {
                    table.insert(*index, bytes.as_slice())?;
                }
                Ok(())
            })
            .await;
        match res {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let from = log_id.index;
        self.write(move |txn| {
            txn.open_table(LOG)?.retain_in(from.., |_, _| false)?;
            Ok(())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let upto = log_id.index;
        let bytes = postcard::to_stdvec(&log_id).map_err(write_err)?;
        self.write(move |txn| {
            txn.open_table(META)?.insert(KEY_PURGED, bytes.as_slice())?;
            txn.open_table(LOG)?.retain_in(..=upto, |_, _| false)?;
            Ok(())
        })
        .await
    }
}
