//! Files read again when they change, without a restart: the tokens file
//! ([`crate::auth`]) and the TLS certificate, key and CA files
//! ([`crate::tls`]). A background task compares each file's [`Stamp`]
//! (modification and change time, size, inode: a Kubernetes Secret volume
//! swaps a symlink, which changes the inode) every interval and calls the
//! reload when one differs. Polling a handful of `stat` calls is cheaper
//! and more portable than a watcher, and sees symlink swaps that inotify
//! on the old target would miss.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// What `stat` says about one file (following symlinks); `None` when it
/// cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp(Vec<Option<FileStamp>>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    #[cfg(unix)]
    ino: u64,
    #[cfg(unix)]
    ctime: (i64, i64),
}

impl Stamp {
    /// The stamps of `paths`, in order.
    pub fn of(paths: &[PathBuf]) -> Stamp {
        Stamp(paths.iter().map(|p| file_stamp(p)).collect())
    }
}

fn file_stamp(path: &Path) -> Option<FileStamp> {
    let m = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        modified: m.modified().ok(),
        len: m.len(),
        #[cfg(unix)]
        ino: std::os::unix::fs::MetadataExt::ino(&m),
        #[cfg(unix)]
        ctime: (
            std::os::unix::fs::MetadataExt::ctime(&m),
            std::os::unix::fs::MetadataExt::ctime_nsec(&m),
        ),
    })
}

/// Calls `reload` whenever the stamp of `paths` changes, checking every
/// `every`, until `reload` returns `false` (its owner is gone). Starts
/// from the stamp as it is now: the caller has just loaded the files.
/// Spawned on the current Tokio runtime.
pub fn spawn_poll(
    paths: Vec<PathBuf>,
    every: Duration,
    mut reload: impl FnMut() -> bool + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let mut last = Stamp::of(&paths);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let now = {
                let paths = paths.clone();
                match tokio::task::spawn_blocking(move || Stamp::of(&paths)).await {
                    Ok(s) => s,
                    Err(_) => return,
                }
            };
            if now != last {
                last = now;
                if !reload() {
                    return;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_changes_with_content_and_replacement() {
        let dir = tempfile::tempdir().expect("test setup");
        let p = dir.path().join("f");
        let paths = vec![p.clone()];
        let missing = Stamp::of(&paths);
        std::fs::write(&p, "one").expect("test setup");
        let one = Stamp::of(&paths);
        assert_ne!(missing, one);
        assert_eq!(one, Stamp::of(&paths));
        // Same size, replaced by a rename (how Secret volumes update).
        let q = dir.path().join("g");
        std::fs::write(&q, "two").expect("test setup");
        std::fs::rename(&q, &p).expect("test setup");
        assert_ne!(one, Stamp::of(&paths));
    }

    #[tokio::test]
    async fn the_poller_calls_reload_on_change_and_stops_when_told() {
        let dir = tempfile::tempdir().expect("test setup");
        let p = dir.path().join("f");
        std::fs::write(&p, "a").expect("test setup");
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        let task = spawn_poll(vec![p.clone()], Duration::from_millis(20), move || {
            // One reload, then stop.
            let _ = tx.try_send(());
            false
        });
        std::fs::write(&p, "bb").expect("test setup");
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a reload after the change")
            .expect("sent");
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the poller stops when reload says so")
            .expect("joined");
    }
}
