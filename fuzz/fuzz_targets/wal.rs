//! WAL segments from arbitrary bytes, read the way a restarting ingester
//! reads them: `Wal::open` (lists the segment, finds the last sequence,
//! cuts a torn tail) and `Wal::replay` (frames above the watermark, with
//! the limits recorded beside the segment), each frame's payload appended
//! to a builder of its signal as the recovery does.
//!
//! Input: byte 0 = flags (bit 0: recompute every frame's CRC so mutations
//! get past it; bit 1: `skip_corrupt`; bit 2: write a `.limits` file), byte
//! 1 = length of the `.limits` text that follows, then the segment bytes.
//!
//! Checked beyond "no panic": every frame the reader returns re-encodes to
//! exactly its bytes, the reader stops at the end of its last good frame,
//! and a replay sees exactly the frames the reader returned.

#![no_main]

#[path = "../common/seeds.rs"]
mod seeds;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mira_core::convert::Limits;
use mira_core::ids::{Signal, TenantId};
use mira_core::wal::{FRAME_HEADER, FrameReader, encode_frame};
use mira_ingester::shard::AnyBuilder;
use mira_ingester::{Wal, WalConfig, WalMode};
use mira_testkit::corpus::{Cardinality, Corpus};
use prost::Message;

/// A directory of this process under `$TMPDIR` (scripts/fuzz.sh points
/// it at the run's scratch directory, removed after the run).
fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("mira-fuzz-wal-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a scratch directory");
        d
    })
}

/// Recomputes the CRC of every frame whose length fits the bytes.
fn fix_crcs(bytes: &mut [u8]) {
    let mut at = 0;
    while at + FRAME_HEADER <= bytes.len() {
        let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        let Some(end) = (at + FRAME_HEADER).checked_add(len).filter(|&e| e <= bytes.len()) else {
            return;
        };
        if len == 0 {
            return;
        }
        let crc = crc32fast::hash(&bytes[at + FRAME_HEADER..end]);
        bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
}

/// Segments of a few frames as the writer lays them out, whole, torn and
/// with a limits file.
fn make_seeds() -> Vec<(String, Vec<u8>)> {
    let mut c = Corpus::new(3, Cardinality::Low);
    let tenant = TenantId::new("team-a").expect("a tenant");
    let mut seg = Vec::new();
    encode_frame(&mut seg, 1, Signal::Logs, 0, &tenant, &c.logs(2).encode_to_vec());
    encode_frame(&mut seg, 2, Signal::Logs, 1, &tenant, &c.logs(1).encode_to_vec());
    encode_frame(&mut seg, 3, Signal::Traces, 2, &tenant, &c.traces(2).encode_to_vec());
    encode_frame(&mut seg, 4, Signal::Metrics, 3, &tenant, &c.metrics(2).encode_to_vec());
    let limits = b"max_attrs=128\nmax_value_bytes=4096\n";
    let with = |flags: u8, limits: &[u8], seg: &[u8]| {
        let mut v = vec![flags, limits.len() as u8];
        v.extend_from_slice(limits);
        v.extend_from_slice(seg);
        v
    };
    vec![
        ("segment".into(), with(0, b"", &seg)),
        ("segment-limits".into(), with(4, limits, &seg)),
        ("segment-torn".into(), with(0, b"", &seg[..seg.len() - 7])),
        (
            "segment-zero-tail".into(),
            with(2, b"", &[&seg[..], &[0u8; 64][..]].concat()),
        ),
    ]
}

fuzz_target!(init: seeds::write_if_asked(make_seeds), |data: &[u8]| {
    let [flags, limits_len, rest @ ..] = data else {
        return;
    };
    let (limits_text, segment) = rest.split_at(usize::from(*limits_len).min(rest.len()));
    let mut segment = segment.to_vec();
    if flags & 1 == 1 {
        fix_crcs(&mut segment);
    }
    let skip_corrupt = flags & 2 == 2;

    // The reader alone: frames re-encode to their bytes.
    let mut reader = FrameReader::new(&segment, 0);
    let mut frames = 0u64;
    let mut end = 0;
    while let Some(Ok(f)) = reader.next_frame() {
        let mut again = Vec::new();
        encode_frame(&mut again, f.seq, f.signal, f.shard, &f.tenant, f.payload);
        assert_eq!(&segment[end..end + again.len()], &again[..], "a frame does not re-encode to its bytes");
        end += again.len();
        frames += 1;
    }
    assert_eq!(reader.offset(), end, "the reader stopped elsewhere than after its last frame");

    let dir = dir();
    for entry in std::fs::read_dir(dir).expect("scratch directory listing").flatten() {
        let _ = std::fs::remove_file(entry.path());
    }
    let path = dir.join(format!("{:020}.wal", 1));
    std::fs::write(&path, &segment).expect("write the segment");
    if flags & 4 == 4 {
        std::fs::write(path.with_extension("limits"), limits_text).expect("write the limits");
    }

    let mut config = WalConfig::new(dir.clone(), WalMode::Off);
    config.skip_corrupt = skip_corrupt;
    let opened = Wal::open(&config);
    if opened.is_err() {
        return;
    }
    let mut builders: HashMap<(u16, String, u8), AnyBuilder> = HashMap::new();
    let mut seen = 0u64;
    let replayed = Wal::replay(dir, Limits::NONE, skip_corrupt, |_| 0, |f, limits| {
        seen += 1;
        let b = builders
            .entry((f.shard, f.tenant.as_str().to_owned(), f.signal.code()))
            .or_insert_with(|| AnyBuilder::new(f.signal));
        let _ = b.append(f.payload, limits);
        Ok(())
    });
    if let Ok(stats) = replayed {
        // `open` cut a torn tail (or skipped past a corrupt frame): the
        // frames left are those the reader returned; seq 0 is at the
        // watermark (skipped).
        assert_eq!(seen, stats.frames, "replay called back for a different number of frames");
        assert_eq!(stats.frames + stats.skipped, frames, "replay saw other frames than the reader");
        for b in builders.values_mut() {
            let _ = b.finish();
        }
    }
});
