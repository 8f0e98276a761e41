//! Write-ahead-log frames: the byte format of one logged OTLP request, and
//! a reader that walks a segment and stops cleanly at a torn tail.
//!
//! Frame layout (little endian):
//!
//! ```text
//! u32 body_len   length of everything after the CRC
//! u32 crc32      CRC32 (IEEE) of the body
//! body:
//!   u64 seq      WAL sequence number, strictly increasing per ingester
//!   u8  signal   Signal::code
//!   u16 shard
//!   u8  tenant_len
//!   [tenant_len] tenant bytes
//!   [..] payload (the request as OTLP protobuf)
//! ```
//!
//! The ingester owns segment files and the writer thread; this module owns
//! only the bytes.

use crate::ids::{Signal, TenantId};

/// Bytes before the body.
pub const FRAME_HEADER: usize = 8;
/// Fixed part of the body before the tenant.
const BODY_FIXED: usize = 8 + 1 + 2 + 1;
/// Largest body accepted when reading (guards against a corrupt length).
pub const MAX_FRAME_BODY: usize = 256 * 1024 * 1024;

/// A decoded frame borrowing its payload from the segment bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    pub seq: u64,
    pub signal: Signal,
    pub shard: u16,
    pub tenant: TenantId,
    pub payload: &'a [u8],
}

/// Appends the frame for (`seq`, `signal`, `shard`, `tenant`, `payload`)
/// to `out`.
pub fn encode_frame(out: &mut Vec<u8>, seq: u64, signal: Signal, shard: u16, tenant: &TenantId, payload: &[u8]) {
    let t = tenant.as_str().as_bytes();
    // TenantId is at most 128 bytes.
    let tenant_len = u8::try_from(t.len()).unwrap_or(u8::MAX);
    let body_len = BODY_FIXED + t.len() + payload.len();
    out.reserve(FRAME_HEADER + body_len);
    out.extend_from_slice(&u32::try_from(body_len).unwrap_or(u32::MAX).to_le_bytes());
    let crc_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let body_at = out.len();
    out.extend_from_slice(&seq.to_le_bytes());
    out.push(signal.code());
    out.extend_from_slice(&shard.to_le_bytes());
    out.push(tenant_len);
    out.extend_from_slice(t);
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out[body_at..]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Why reading stopped before the end of the bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The bytes end inside a frame: a write that never completed. Everything
    /// before `offset` is good.
    #[error("torn frame at offset {offset}")]
    Torn { offset: usize },
    /// A complete frame whose CRC or fields are wrong.
    #[error("corrupt frame at offset {offset}: {reason}")]
    Corrupt { offset: usize, reason: &'static str },
}

impl FrameError {
    pub fn offset(&self) -> usize {
        match self {
            FrameError::Torn { offset } | FrameError::Corrupt { offset, .. } => *offset,
        }
    }
}

/// Walks the frames in `bytes` (starting at `offset`).
#[derive(Debug)]
pub struct FrameReader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> FrameReader<'a> {
    pub fn new(bytes: &'a [u8], offset: usize) -> Self {
        FrameReader { bytes, offset }
    }

    /// Offset of the next unread byte (the end of the last good frame).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The next frame; `None` at a clean end; an error at a torn or corrupt
    /// frame (the reader does not advance past it).
    pub fn next_frame(&mut self) -> Option<Result<Frame<'a>, FrameError>> {
        let rest = &self.bytes[self.offset.min(self.bytes.len())..];
        if rest.is_empty() {
            return None;
        }
        let offset = self.offset;
        let torn = FrameError::Torn { offset };
        if rest.len() < FRAME_HEADER {
            return Some(Err(torn));
        }
        let body_len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if body_len == 0 && crc == 0 && rest.iter().all(|&b| b == 0) {
            // Preallocated or zero-filled tail: a clean end.
            return None;
        }
        if !(BODY_FIXED..=MAX_FRAME_BODY).contains(&body_len) {
            return Some(Err(FrameError::Corrupt {
                offset,
                reason: "frame length out of range",
            }));
        }
        let Some(body) = rest.get(FRAME_HEADER..FRAME_HEADER + body_len) else {
            return Some(Err(torn));
        };
        if crc32fast::hash(body) != crc {
            return Some(Err(FrameError::Corrupt {
                offset,
                reason: "CRC mismatch",
            }));
        }
        let corrupt = |reason| Some(Err(FrameError::Corrupt { offset, reason }));
        let seq = u64::from_le_bytes(body[0..8].try_into().unwrap_or([0; 8]));
        if seq == u64::MAX {
            // No writer gets here (sequences start at 1 and count up by
            // one), and the WAL's next sequence would wrap to 0, at or
            // below every published watermark.
            return corrupt("sequence number out of range");
        }
        let Some(signal) = Signal::from_code(body[8]) else {
            return corrupt("unknown signal");
        };
        let shard = u16::from_le_bytes([body[9], body[10]]);
        let tenant_len = body[11] as usize;
        let Some(tenant) = body.get(BODY_FIXED..BODY_FIXED + tenant_len) else {
            return corrupt("tenant past the frame");
        };
        let Some(tenant) = std::str::from_utf8(tenant).ok().and_then(|t| TenantId::new(t).ok()) else {
            return corrupt("invalid tenant");
        };
        let payload = &body[BODY_FIXED + tenant_len..];
        self.offset += FRAME_HEADER + body_len;
        Some(Ok(Frame {
            seq,
            signal,
            shard,
            tenant,
            payload,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(n: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n {
            let payload = vec![i as u8; i as usize * 3];
            encode_frame(
                &mut out,
                100 + i,
                Signal::Traces,
                (i % 4) as u16,
                &TenantId::new("acme").expect("t"),
                &payload,
            );
        }
        out
    }

    #[test]
    fn roundtrip() {
        let bytes = frames(10);
        let mut r = FrameReader::new(&bytes, 0);
        for i in 0..10u64 {
            let f = r.next_frame().expect("frame").expect("ok");
            assert_eq!(f.seq, 100 + i);
            assert_eq!(f.signal, Signal::Traces);
            assert_eq!(f.shard, (i % 4) as u16);
            assert_eq!(f.tenant.as_str(), "acme");
            assert_eq!(f.payload, vec![i as u8; i as usize * 3].as_slice());
        }
        assert!(r.next_frame().is_none());
        assert_eq!(r.offset(), bytes.len());
    }

    #[test]
    fn every_truncation_is_torn_at_the_last_whole_frame() {
        let bytes = frames(5);
        let mut ends = vec![0];
        let mut r = FrameReader::new(&bytes, 0);
        while let Some(Ok(_)) = r.next_frame() {
            ends.push(r.offset());
        }
        for cut in 1..bytes.len() {
            let mut r = FrameReader::new(&bytes[..cut], 0);
            let mut good = 0;
            let end = loop {
                match r.next_frame() {
                    Some(Ok(_)) => good += 1,
                    Some(Err(e)) => break e.offset(),
                    None => break r.offset(),
                }
            };
            assert_eq!(end, ends[good], "cut at {cut}");
            assert!(ends[good] <= cut);
        }
    }

    #[test]
    fn flipped_bits_are_corrupt_never_data() {
        let bytes = frames(3);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            let mut r = FrameReader::new(&b, 0);
            let mut n = 0;
            while let Some(res) = r.next_frame() {
                match res {
                    Ok(_) => n += 1,
                    Err(_) => break,
                }
            }
            assert!(n < 3, "a flipped bit at {i} went unnoticed");
        }
    }

    /// Found by the `wal` fuzz target: a CRC-valid frame with sequence
    /// `u64::MAX` made `Wal::open` overflow computing the next sequence.
    #[test]
    fn the_highest_sequence_is_corrupt() {
        let bytes = [
            0x0f, 0x00, 0x00, 0x00, 0x16, 0x1b, 0x82, 0xae, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00,
            0x00, 0x03, 0x74, 0x65, 0x61,
        ];
        let mut r = FrameReader::new(&bytes, 0);
        assert_eq!(
            r.next_frame(),
            Some(Err(FrameError::Corrupt {
                offset: 0,
                reason: "sequence number out of range"
            }))
        );
        assert_eq!(r.offset(), 0);
        let mut below = Vec::new();
        encode_frame(
            &mut below,
            u64::MAX - 1,
            Signal::Logs,
            0,
            &TenantId::new("tea").expect("t"),
            b"",
        );
        assert_eq!(
            FrameReader::new(&below, 0).next_frame().map(|f| f.map(|f| f.seq)),
            Some(Ok(u64::MAX - 1))
        );
    }

    #[test]
    fn zero_tail_is_a_clean_end() {
        let mut bytes = frames(2);
        bytes.extend_from_slice(&[0; 64]);
        let mut r = FrameReader::new(&bytes, 0);
        assert!(r.next_frame().expect("1").is_ok());
        assert!(r.next_frame().expect("2").is_ok());
        assert!(r.next_frame().is_none());
    }
}
