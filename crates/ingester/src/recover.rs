//! Start-up recovery: every WAL frame above its shard's published
//! watermark is rebuilt into blocks and published before the ingester
//! takes traffic. Frames are grouped by the shard that wrote them (the
//! watermark's key), not by today's shard count, so a restart with another
//! `--shards` (or in `--wal off` after a crash in a WAL mode) publishes
//! each acknowledged row once; each shard's frames are sealed at the size
//! target as they are read and published in order after each segment (one
//! segment's rows in memory at a time), so a crash during recovery resumes
//! where the watermarks stopped. Rows are rebuilt under the attribute limits they
//! were acknowledged with, whatever this process is configured with.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use mira_core::convert::Limits;
use mira_core::ids::{BlockId, Signal, TenantId};

use crate::error::{StartError, WalError};
use crate::shard::{AnyBuilder, Sealed};
use crate::upload::{Destination, OnRefusal, Unpublished, publish_generation};
use crate::wal::Wal;

/// Counts of a start-up recovery.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Frames above their watermark, rebuilt and published.
    pub frames: u64,
    /// Frames at or below their watermark (already published) in the
    /// segments read (segments wholly published are not read again).
    pub skipped: u64,
    /// Generations published by the recovery.
    pub generations: u64,
    /// Segments with a corrupt frame (only with `skip_corrupt`).
    pub corrupt_segments: u64,
}

/// The frames of one writer shard being rebuilt.
#[derive(Debug)]
struct Pending {
    signal: Signal,
    builders: HashMap<TenantId, AnyBuilder>,
    requests: HashMap<TenantId, Vec<Bytes>>,
    max_seq: u64,
    number: u64,
}

impl Pending {
    fn bytes(&self) -> usize {
        self.builders.values().map(AnyBuilder::approx_bytes).sum()
    }

    fn seal(&mut self, shard: u16) -> Sealed {
        self.number += 1;
        let mut blocks = Vec::new();
        let mut requests = Vec::new();
        for (tenant, mut b) in std::mem::take(&mut self.builders) {
            let reqs = self.requests.remove(&tenant).unwrap_or_default();
            if b.rows() == 0 {
                continue;
            }
            blocks.push((tenant.clone(), BlockId::new(), b.finish().map_err(|e| e.to_string())));
            requests.push((tenant, reqs));
        }
        let sealed = Sealed {
            signal: self.signal,
            shard,
            number: self.number,
            max_seq: self.max_seq,
            blocks,
            requests,
        };
        self.max_seq = 0;
        sealed
    }
}

/// Publishes every frame of `wal` above `watermarks`; returns what it did.
pub async fn recover(
    dest: &Destination,
    wal: &Wal,
    current: Limits,
    skip_corrupt: bool,
    watermarks: &HashMap<u16, u64>,
    max_bytes: usize,
) -> Result<Replayed, StartError> {
    let mut out = Replayed::default();
    let mut pending: BTreeMap<u16, Pending> = BTreeMap::new();
    let watermark = |shard: u16| watermarks.get(&shard).copied().unwrap_or(0);
    for path in wal.unpublished_segments(watermark) {
        // Generations sealed while reading this segment, in order.
        let mut ready: Vec<Sealed> = Vec::new();
        let stats = Wal::replay_segment(&path, current, skip_corrupt, &watermark, &mut |f, limits| {
            let p = pending.entry(f.shard).or_insert_with(|| Pending {
                signal: f.signal,
                builders: HashMap::new(),
                requests: HashMap::new(),
                max_seq: 0,
                number: 0,
            });
            if p.signal != f.signal {
                return Err(WalError::Corrupt {
                    path: path.display().to_string(),
                    offset: 0,
                    reason: format!(
                        "frame {} of shard {} is {} but the shard's earlier frames are {}",
                        f.seq,
                        f.shard,
                        f.signal.as_str(),
                        p.signal.as_str()
                    ),
                });
            }
            let b = p
                .builders
                .entry(f.tenant.clone())
                .or_insert_with(|| AnyBuilder::new(f.signal));
            if let Err(e) = b.append(f.payload, limits) {
                // It decoded when it was acknowledged; the bytes are checked
                // by the frame CRC. Only a bug gets here.
                tracing::error!(target: "mira::ingester", seq = f.seq, shard = f.shard, error = %e, "a WAL frame that was acknowledged no longer decodes; skipped");
                return Ok(());
            }
            p.requests
                .entry(f.tenant.clone())
                .or_default()
                .push(Bytes::copy_from_slice(f.payload));
            p.max_seq = p.max_seq.max(f.seq);
            if p.bytes() >= max_bytes {
                ready.push(p.seal(f.shard));
            }
            Ok(())
        })?;
        out.frames += stats.frames;
        out.skipped += stats.skipped;
        out.corrupt_segments += stats.corrupt_segments;
        // Published in the order sealed, so each shard's watermark moves
        // forward; at most one segment's rows are held at a time.
        for g in ready {
            publish(dest, g).await?;
            out.generations += 1;
        }
    }
    for (shard, p) in pending.iter_mut() {
        if p.max_seq > 0 {
            publish(dest, p.seal(*shard)).await?;
            out.generations += 1;
        }
    }
    Ok(out)
}

async fn publish(dest: &Destination, g: Sealed) -> Result<(), StartError> {
    match publish_generation(dest, &g, OnRefusal::Stop).await {
        Ok(_) => Ok(()),
        Err(Unpublished::Fenced) => Err(StartError::Fenced(dest.ingester_id.clone())),
        Err(Unpublished::Quarantined) => Err(StartError::Quarantined(dest.quarantine_dir.display().to_string())),
    }
}
