//! The WAL on disk: acknowledged frames come back in order after a reopen,
//! a torn tail is cut, replay skips what is at or below the watermarks, and
//! the sweep deletes only fully published segments.

use std::collections::BTreeMap;

use bytes::Bytes;
use mira_core::ids::{Signal, TenantId};
use mira_ingester::{Wal, WalConfig, WalMode};

fn tenant() -> TenantId {
    TenantId::new("acme").expect("tenant")
}

fn replay_all(dir: &std::path::Path, wm: &BTreeMap<u16, u64>) -> Vec<(u64, u16, Vec<u8>)> {
    let mut out = Vec::new();
    Wal::replay(
        dir,
        mira_core::convert::Limits::NONE,
        false,
        |s| wm.get(&s).copied().unwrap_or(0),
        |f, _| {
            out.push((f.seq, f.shard, f.payload.to_vec()));
            Ok(())
        },
    )
    .expect("replay");
    out
}

fn only_segment(dir: &std::path::Path) -> std::path::PathBuf {
    let segs = Wal::segment_paths(dir).expect("ls");
    assert_eq!(segs.len(), 1, "{segs:?}");
    segs[0].clone()
}

/// A page-cache WAL holding ten 32-byte frames in one segment: its
/// directory, config, segment path and bytes.
async fn ten_frames() -> (tempfile::TempDir, WalConfig, std::path::PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = WalConfig::new(dir.path().to_path_buf(), WalMode::PageCache);
    let (wal, _, _) = Wal::open(&config).expect("open");
    fill(&wal, 10).await;
    drop(wal);
    let seg = only_segment(dir.path());
    let bytes = std::fs::read(&seg).expect("read");
    (dir, config, seg, bytes)
}

async fn fill(wal: &Wal, n: u64) -> Vec<u64> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let wal = wal.clone();
        tasks.push(tokio::spawn(async move {
            wal.append(
                Signal::Logs,
                (i % 3) as u16,
                tenant(),
                Bytes::from(i.to_le_bytes().to_vec()),
            )
            .await
            .expect("append")
        }));
    }
    let mut seqs = Vec::new();
    for t in tasks {
        seqs.push(t.await.expect("task"));
    }
    seqs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_frames_replay_in_order_in_both_modes() {
    for mode in [WalMode::PageCache, WalMode::Fsync] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = WalConfig::new(dir.path().to_path_buf(), mode);
        config.segment_bytes = 4096;
        let (wal, last, _) = Wal::open(&config).expect("open");
        assert_eq!(last, 0);
        let mut seqs = fill(&wal, 500).await;
        seqs.sort_unstable();
        assert_eq!(
            seqs,
            (1..=500).collect::<Vec<_>>(),
            "{mode:?}: every append gets a distinct sequence"
        );
        drop(wal);
        let frames = replay_all(dir.path(), &BTreeMap::new());
        assert_eq!(frames.len(), 500);
        // Concurrent submitters: every frame once (file order is per
        // submitter; the sequential test below checks it).
        let mut replayed: Vec<u64> = frames.iter().map(|f| f.0).collect();
        replayed.sort_unstable();
        assert_eq!(replayed, (1..=500).collect::<Vec<_>>());
        // Reopen continues the sequence.
        let (wal, last, stats) = Wal::open(&config).expect("reopen");
        assert_eq!(last, 500);
        assert_eq!(stats.torn_bytes, 0);
        let s = wal
            .append(Signal::Logs, 0, tenant(), Bytes::from_static(b"x"))
            .await
            .expect("append");
        assert_eq!(s, 501);
    }
}

#[tokio::test]
async fn a_torn_tail_is_cut_and_later_frames_are_kept() {
    let (dir, config, seg, mut bytes) = ten_frames().await;
    // Simulate a crash mid-write: half a frame at the end of the segment.
    let len = bytes.len();
    // Each frame here is 32 bytes; 20 is part of one.
    let head = bytes[..20].to_vec();
    bytes.extend_from_slice(&head);
    std::fs::write(&seg, &bytes).expect("write");
    let (wal, last, stats) = Wal::open(&config).expect("reopen");
    assert_eq!(last, 10);
    assert!(stats.torn_bytes > 0);
    assert_eq!(
        std::fs::metadata(&seg).expect("meta").len() as usize,
        len,
        "torn tail cut"
    );
    wal.append(Signal::Traces, 1, tenant(), Bytes::from_static(b"after"))
        .await
        .expect("append");
    drop(wal);
    let frames = replay_all(dir.path(), &BTreeMap::new());
    assert_eq!(frames.len(), 11);
    assert_eq!(frames[10], (11, 1, b"after".to_vec()));
}

#[tokio::test]
async fn replay_skips_published_frames_and_sweep_deletes_only_published_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = WalConfig::new(dir.path().to_path_buf(), WalMode::PageCache);
    config.segment_bytes = 256;
    let (wal, _, _) = Wal::open(&config).expect("open");
    // Sequential appends: shard = seq % 3 after the first.
    for i in 0..60u64 {
        wal.append(Signal::Logs, (i % 3) as u16, tenant(), Bytes::from(vec![0u8; 40]))
            .await
            .expect("append");
    }
    let before = wal.segment_count();
    assert!(before > 5);
    // Shard 0 published up to 30, shard 1 up to 59, shard 2 nothing.
    let wm = BTreeMap::from([(0u16, 30u64), (1, 59)]);
    let frames = replay_all(dir.path(), &wm);
    assert!(
        frames.windows(2).all(|w| w[0].0 < w[1].0),
        "one submitter: replay is in sequence order"
    );
    for (seq, shard, _) in &frames {
        assert!(
            *seq > wm.get(shard).copied().unwrap_or(0),
            "frame {seq} of shard {shard} is published"
        );
    }
    let expect = (1..=60u64)
        .filter(|s| {
            let shard = ((s - 1) % 3) as u16;
            *s > wm.get(&shard).copied().unwrap_or(0)
        })
        .count();
    assert_eq!(frames.len(), expect);
    // Shard 2 holds frames in every segment: nothing can go.
    assert_eq!(wal.sweep(|s| wm.get(&s).copied().unwrap_or(0)).expect("sweep"), 0);
    // Everything published up to 45: the segments wholly below go, the rest stay.
    let deleted = wal.sweep(|_| 45).expect("sweep");
    assert!(deleted > 0);
    let left = replay_all(dir.path(), &BTreeMap::new());
    assert!(
        left.iter().all(|(seq, ..)| *seq > 30),
        "a segment with unpublished frames was deleted"
    );
    assert!(
        left.iter().any(|(seq, ..)| *seq == 46),
        "frame 46 is unpublished and must stay"
    );
    assert_eq!(left.last().map(|f| f.0), Some(60));
}

#[tokio::test]
async fn off_mode_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = WalConfig::new(dir.path().join("wal"), WalMode::Off);
    let (wal, _, _) = Wal::open(&config).expect("open");
    let a = wal
        .append(Signal::Logs, 0, tenant(), Bytes::from_static(b"x"))
        .await
        .expect("append");
    let b = wal
        .append(Signal::Logs, 0, tenant(), Bytes::from_static(b"y"))
        .await
        .expect("append");
    assert!(b > a);
    assert!(!dir.path().join("wal").exists());
}

#[tokio::test]
async fn a_corrupt_frame_inside_a_segment_stops_the_open_naming_segment_and_offset() {
    let (dir, config, seg, mut bytes) = ten_frames().await;
    // Flip a payload byte of the fourth frame (32 bytes each): its CRC fails
    // while six good frames follow it.
    bytes[3 * 32 + 30] ^= 0xff;
    std::fs::write(&seg, &bytes).expect("write");
    let err = Wal::open(&config).expect_err("a corrupt middle frame is no torn tail");
    let msg = err.to_string();
    assert!(
        msg.contains(&seg.display().to_string()) && msg.contains("offset 96"),
        "{msg}"
    );
    assert_eq!(
        std::fs::read(&seg).expect("read").len(),
        bytes.len(),
        "nothing was cut off the segment"
    );
    // The replay refuses too, and with skip_corrupt counts it and keeps the
    // frames before it.
    let strict = Wal::replay(
        dir.path(),
        mira_core::convert::Limits::NONE,
        false,
        |_| 0,
        |_, _| Ok(()),
    );
    assert!(strict.is_err());
    let mut seen = Vec::new();
    let stats = Wal::replay(
        dir.path(),
        mira_core::convert::Limits::NONE,
        true,
        |_| 0,
        |f, _| {
            seen.push(f.seq);
            Ok(())
        },
    )
    .expect("skip");
    assert_eq!(stats.corrupt_segments, 1);
    assert_eq!(seen, vec![1, 2, 3]);
    let mut skipping = config.clone();
    skipping.skip_corrupt = true;
    let (_, last, stats) = Wal::open(&skipping).expect("open with skip");
    assert_eq!((last, stats.corrupt_segments), (3, 1));
}

#[tokio::test]
async fn the_sequence_starts_above_a_raised_floor() {
    let dir = tempfile::tempdir().expect("tempdir");
    for mode in [WalMode::PageCache, WalMode::Off] {
        let config = WalConfig::new(dir.path().join(format!("{mode:?}")), mode);
        let (wal, last, _) = Wal::open(&config).expect("open");
        assert_eq!(last, 0);
        // The catalog holds watermark 9 for this id (the WAL was swept empty).
        wal.raise_floor(9);
        let seq = wal
            .append(Signal::Logs, 0, tenant(), Bytes::from_static(b"x"))
            .await
            .expect("append");
        assert_eq!(seq, 10, "{mode:?}");
        // A floor below what is already handed out changes nothing.
        wal.raise_floor(3);
        let seq = wal
            .append(Signal::Logs, 0, tenant(), Bytes::from_static(b"y"))
            .await
            .expect("append");
        assert_eq!(seq, 11, "{mode:?}");
    }
}

#[tokio::test]
async fn segments_record_the_limits_their_frames_were_acknowledged_under() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = WalConfig::new(dir.path().to_path_buf(), WalMode::PageCache);
    config.limits = mira_core::convert::Limits {
        max_attrs: 3,
        max_value_bytes: 17,
        window: None,
    };
    let (wal, _, _) = Wal::open(&config).expect("open");
    fill(&wal, 2).await;
    drop(wal);
    let mut limits = Vec::new();
    Wal::replay(
        dir.path(),
        mira_core::convert::Limits::NONE,
        false,
        |_| 0,
        |_, l| {
            limits.push(*l);
            Ok(())
        },
    )
    .expect("replay");
    assert_eq!(limits, vec![config.limits; 2]);
}

/// Found by the `wal` fuzz target (its crashing input, cut to the frame
/// that mattered): a CRC-valid frame with sequence `u64::MAX` made the
/// open overflow computing the next sequence (a panic in debug builds, a
/// wrap to sequence 0 in release ones). It is a corrupt frame now.
#[test]
fn a_frame_with_the_highest_sequence_is_corrupt_not_an_overflow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal_dir = dir.path().join("wal");
    std::fs::create_dir_all(&wal_dir).expect("mkdir");
    let seg = wal_dir.join(format!("{:020}.wal", 1));
    let frame: [u8; 23] = [
        0x0f, 0x00, 0x00, 0x00, 0x16, 0x1b, 0x82, 0xae, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00,
        0x00, 0x03, 0x74, 0x65, 0x61,
    ];
    std::fs::write(&seg, frame).expect("write");
    let mut config = WalConfig::new(wal_dir.clone(), WalMode::Off);
    let err = Wal::open(&config).expect_err("the frame is corrupt").to_string();
    assert!(
        err.contains(&seg.display().to_string())
            && err.contains("offset 0")
            && err.contains("sequence number out of range"),
        "{err}"
    );
    config.skip_corrupt = true;
    let (_, last_seq, stats) = Wal::open(&config).expect("skipped");
    assert_eq!((last_seq, stats.corrupt_segments), (0, 1));
}
