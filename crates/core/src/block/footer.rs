//! The footer (a protobuf message defined here with prost derives), the
//! [`Manifest`] decoded from it, and every structural check a reader makes
//! before it trusts an offset.

use super::{
    ALIGNMENT, BlockError, BlockMeta, Codec, FORMAT_VERSION, HEADER_LEN, Level, MAGIC, MAX_FOOTER_LEN, MAX_ROWS,
    MAX_SECTION_NAME_LEN, MAX_SECTIONS, MIN_BLOCK_LEN, TRAILER_LEN, align_up,
};
use crate::ids::{BlockId, Signal, TenantId};

/// Bytes a reader fetches from the end of an object before it knows the
/// footer length. Most footers are a few hundred bytes.
pub const TAIL_FETCH_LEN: u64 = 64 * 1024;

/// How many bytes from the end of an `object_len`-byte object to fetch
/// first: [`TAIL_FETCH_LEN`], or the whole object if it is smaller. If the
/// footer turns out to be longer, [`Manifest::from_tail`] answers
/// [`BlockError::TailTooShort`] with the exact length needed.
pub fn initial_tail_len(object_len: u64) -> u64 {
    object_len.min(TAIL_FETCH_LEN)
}

/// The footer as stored. Field numbers are the format; never reuse one.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct FooterProto {
    #[prost(uint32, tag = "1")]
    pub format_version: u32,
    #[prost(fixed64, tag = "2")]
    pub block_id_hi: u64,
    #[prost(fixed64, tag = "3")]
    pub block_id_lo: u64,
    #[prost(string, tag = "4")]
    pub tenant: String,
    #[prost(uint32, tag = "5")]
    pub signal: u32,
    #[prost(uint64, tag = "6")]
    pub min_time: u64,
    #[prost(uint64, tag = "7")]
    pub max_time: u64,
    #[prost(uint64, tag = "8")]
    pub rows: u64,
    #[prost(uint32, tag = "9")]
    pub schema_version: u32,
    #[prost(uint32, tag = "10")]
    pub level: u32,
    #[prost(message, repeated, tag = "11")]
    pub sections: Vec<SectionProto>,
}

/// Field number of `FooterProto::sections`, counted before decoding.
const SECTIONS_FIELD: u64 = 11;

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SectionProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint64, tag = "2")]
    pub offset: u64,
    #[prost(uint64, tag = "3")]
    pub length: u64,
    #[prost(fixed32, tag = "4")]
    pub crc32: u32,
    #[prost(string, tag = "5")]
    pub codec: String,
    #[prost(uint64, tag = "6")]
    pub rows: u64,
}

/// One section as listed in the manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionEntry {
    pub name: String,
    /// Byte offset from the start of the object; a multiple of 64.
    pub offset: u64,
    pub length: u64,
    /// CRC32 (IEEE) of the section's bytes.
    pub crc32: u32,
    pub codec: Codec,
    /// Rows the section decodes to (for `Raw`, whatever the writer said).
    pub rows: u64,
}

impl SectionEntry {
    /// The section's byte range in the object.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.length
    }
}

/// A block's footer, decoded and validated: every section lies inside the
/// data area, aligned, without overlaps, names unique, codecs known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub meta: BlockMeta,
    /// In manifest order; a section's index here is its identity in the
    /// [`super::VerifyCache`].
    pub sections: Vec<SectionEntry>,
    object_len: u64,
    footer_len: u64,
}

impl Manifest {
    /// Parses and validates the manifest from the last `tail.len()` bytes of
    /// an `object_len`-byte block. When the tail is the whole object the
    /// header is checked too. A tail too short to hold the footer yields
    /// [`BlockError::TailTooShort`] naming the exact suffix length needed.
    pub fn from_tail(tail: &[u8], object_len: u64) -> Result<Manifest, BlockError> {
        if object_len < MIN_BLOCK_LEN {
            return Err(BlockError::TooShort { len: object_len });
        }
        let tail_len = tail.len() as u64;
        if tail_len > object_len {
            return Err(BlockError::TailLongerThanObject { tail_len, object_len });
        }
        if tail_len == object_len {
            check_header(tail)?;
        }
        if tail_len < TRAILER_LEN {
            return Err(BlockError::TailTooShort {
                have: tail_len,
                need: TRAILER_LEN,
            });
        }
        let trailer = &tail[tail.len() - TRAILER_LEN as usize..];
        let found = word(trailer, 8);
        if found != MAGIC {
            return Err(BlockError::BadTrailingMagic { found });
        }
        let footer_len = u64::from(u32::from_le_bytes(word(trailer, 0)));
        let footer_crc = u32::from_le_bytes(word(trailer, 4));
        // `footer_len` < 2^32 and `object_len` >= MIN_BLOCK_LEN: no overflow.
        if footer_len > object_len - MIN_BLOCK_LEN {
            return Err(BlockError::FooterPastStart { footer_len, object_len });
        }
        if footer_len > MAX_FOOTER_LEN {
            return Err(BlockError::FooterTooLong { footer_len });
        }
        let need = footer_len + TRAILER_LEN;
        if tail_len < need {
            return Err(BlockError::TailTooShort { have: tail_len, need });
        }
        let footer = &tail[tail.len() - need as usize..tail.len() - TRAILER_LEN as usize];
        let actual = crc32fast::hash(footer);
        if actual != footer_crc {
            return Err(BlockError::FooterCrcMismatch {
                expected: footer_crc,
                actual,
            });
        }
        let count = count_field(footer, SECTIONS_FIELD)?;
        if count > MAX_SECTIONS {
            return Err(BlockError::TooManySections { count });
        }
        let proto = <FooterProto as prost::Message>::decode(footer).map_err(BlockError::FooterDecode)?;
        Manifest::from_proto(proto, object_len, footer_len)
    }

    /// The block's meta.
    pub fn meta(&self) -> &BlockMeta {
        &self.meta
    }

    /// The section called `name` and its index.
    pub fn section(&self, name: &str) -> Option<(usize, &SectionEntry)> {
        self.sections.iter().enumerate().find(|(_, s)| s.name == name)
    }

    /// Size of the whole object.
    pub fn object_len(&self) -> u64 {
        self.object_len
    }

    /// Where the footer starts (the end of the data area).
    pub fn footer_start(&self) -> u64 {
        self.object_len - self.footer_len - TRAILER_LEN
    }

    /// Footer plus trailer: the suffix a reader must fetch.
    pub fn tail_len(&self) -> u64 {
        self.footer_len + TRAILER_LEN
    }

    /// Ranges of zero padding: after the header up to the first section,
    /// between sections, and after the last section up to the footer
    /// (empty ranges omitted). Valid only for validated manifests.
    pub(crate) fn padding_ranges(&self) -> Vec<std::ops::Range<u64>> {
        let mut by_offset: Vec<&SectionEntry> = self.sections.iter().collect();
        by_offset.sort_by_key(|s| s.offset);
        let mut pos = HEADER_LEN;
        let mut out = Vec::new();
        for s in by_offset {
            if s.offset > pos {
                out.push(pos..s.offset);
            }
            pos = s.offset + s.length;
        }
        if self.footer_start() > pos {
            out.push(pos..self.footer_start());
        }
        out
    }

    fn from_proto(p: FooterProto, object_len: u64, footer_len: u64) -> Result<Manifest, BlockError> {
        if p.format_version != FORMAT_VERSION {
            return Err(BlockError::UnsupportedVersion {
                version: p.format_version,
            });
        }
        let block = BlockId::from_u128((u128::from(p.block_id_hi) << 64) | u128::from(p.block_id_lo));
        let invalid = |reason: String| BlockError::InvalidMeta { block, reason };
        let tenant = TenantId::new(&p.tenant).map_err(|e| invalid(e.to_string()))?;
        let signal = u8::try_from(p.signal)
            .ok()
            .and_then(Signal::from_code)
            .ok_or_else(|| invalid(format!("unknown signal code {}", p.signal)))?;
        let level = Level::from_code(p.level).ok_or_else(|| invalid(format!("unknown level code {}", p.level)))?;
        if p.min_time > p.max_time {
            return Err(invalid(format!(
                "min time {} after max time {}",
                p.min_time, p.max_time
            )));
        }
        if p.rows > MAX_ROWS {
            return Err(BlockError::AbsurdRows {
                block,
                section: None,
                rows: p.rows,
            });
        }
        let meta = BlockMeta {
            block_id: block,
            tenant,
            signal,
            min_time: p.min_time,
            max_time: p.max_time,
            rows: p.rows,
            schema_version: p.schema_version,
            level,
        };
        let footer_start = object_len - footer_len - TRAILER_LEN;
        let mut sections = Vec::with_capacity(p.sections.len());
        for s in p.sections {
            if s.name.is_empty() || s.name.len() > MAX_SECTION_NAME_LEN {
                return Err(BlockError::InvalidSectionName { block, section: s.name });
            }
            if sections.iter().any(|e: &SectionEntry| e.name == s.name) {
                return Err(BlockError::DuplicateSection { block, section: s.name });
            }
            let Some(codec) = Codec::parse(&s.codec) else {
                return Err(BlockError::UnknownCodec {
                    block,
                    section: s.name,
                    codec: s.codec,
                });
            };
            if s.rows > MAX_ROWS {
                return Err(BlockError::AbsurdRows {
                    block,
                    section: Some(s.name),
                    rows: s.rows,
                });
            }
            if s.offset % ALIGNMENT != 0 {
                return Err(BlockError::UnalignedSection {
                    block,
                    section: s.name,
                    offset: s.offset,
                });
            }
            let in_bounds =
                s.offset >= HEADER_LEN && s.offset.checked_add(s.length).is_some_and(|end| end <= footer_start);
            if !in_bounds {
                return Err(BlockError::SectionOutOfBounds {
                    block,
                    section: s.name,
                    offset: s.offset,
                    length: s.length,
                    data_end: footer_start,
                });
            }
            sections.push(SectionEntry {
                name: s.name,
                offset: s.offset,
                length: s.length,
                crc32: s.crc32,
                codec,
                rows: s.rows,
            });
        }
        check_tiling(block, &sections, footer_start)?;
        Ok(Manifest {
            meta,
            sections,
            object_len,
            footer_len,
        })
    }

    /// The footer bytes for this manifest.
    pub(crate) fn to_proto(&self) -> FooterProto {
        let id = self.meta.block_id.as_u128();
        FooterProto {
            format_version: FORMAT_VERSION,
            block_id_hi: (id >> 64) as u64,
            block_id_lo: id as u64,
            tenant: self.meta.tenant.as_str().to_owned(),
            signal: u32::from(self.meta.signal.code()),
            min_time: self.meta.min_time,
            max_time: self.meta.max_time,
            rows: self.meta.rows,
            schema_version: self.meta.schema_version,
            level: self.meta.level.code(),
            sections: self
                .sections
                .iter()
                .map(|s| SectionProto {
                    name: s.name.clone(),
                    offset: s.offset,
                    length: s.length,
                    crc32: s.crc32,
                    codec: s.codec.as_str().to_owned(),
                    rows: s.rows,
                })
                .collect(),
        }
    }

    /// Builds a manifest for the writer (not validated; the writer checks
    /// its inputs as they arrive).
    pub(crate) fn new_unchecked(meta: BlockMeta, sections: Vec<SectionEntry>) -> Manifest {
        Manifest {
            meta,
            sections,
            object_len: 0,
            footer_len: 0,
        }
    }
}

/// Sections, sorted by offset, must tile the data area: the first starts at
/// the first aligned offset after the header, each next one at the first
/// aligned offset after its predecessor, and the footer right after the
/// last. Anything else is an overlap or an unexplained gap.
fn check_tiling(block: BlockId, sections: &[SectionEntry], footer_start: u64) -> Result<(), BlockError> {
    let mut by_offset: Vec<&SectionEntry> = sections.iter().collect();
    by_offset.sort_by_key(|s| s.offset);
    let mut prev: Option<&SectionEntry> = None;
    let mut pos = HEADER_LEN;
    for s in by_offset {
        if s.offset < pos {
            let first = prev.map_or_else(|| "(header)".to_owned(), |p| p.name.clone());
            return Err(BlockError::OverlappingSections {
                block,
                first,
                second: s.name.clone(),
            });
        }
        if s.offset != align_up(pos) {
            return Err(BlockError::UnexpectedGap {
                block,
                offset: pos,
                len: s.offset - pos,
            });
        }
        pos = s.offset + s.length;
        prev = Some(s);
    }
    if footer_start != pos {
        return Err(BlockError::UnexpectedGap {
            block,
            offset: pos,
            len: footer_start - pos,
        });
    }
    Ok(())
}

/// Checks magic, version and zero padding of a whole object's header.
pub(crate) fn check_header(object: &[u8]) -> Result<(), BlockError> {
    if (object.len() as u64) < MIN_BLOCK_LEN {
        return Err(BlockError::TooShort {
            len: object.len() as u64,
        });
    }
    let found = word(object, 0);
    if found != MAGIC {
        return Err(BlockError::BadLeadingMagic { found });
    }
    let version = u32::from_le_bytes(word(object, 4));
    if version != FORMAT_VERSION {
        return Err(BlockError::UnsupportedVersion { version });
    }
    if let Some(i) = object[8..HEADER_LEN as usize].iter().position(|&b| b != 0) {
        return Err(BlockError::BadHeaderPadding { offset: 8 + i as u64 });
    }
    Ok(())
}

/// The header every block starts with.
pub(crate) fn header() -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..4].copy_from_slice(&MAGIC);
    h[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h
}

/// Footer bytes followed by the trailer.
pub(crate) fn encode_tail(proto: &FooterProto) -> Vec<u8> {
    let footer = prost::Message::encode_to_vec(proto);
    let mut out = Vec::with_capacity(footer.len() + TRAILER_LEN as usize);
    out.extend_from_slice(&footer);
    // The writer rejects footers over MAX_FOOTER_LEN, far below u32::MAX.
    out.extend_from_slice(&(footer.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&footer).to_le_bytes());
    out.extend_from_slice(&MAGIC);
    out
}

/// Four bytes at `at`; callers have checked the length.
fn word(b: &[u8], at: usize) -> [u8; 4] {
    [b[at], b[at + 1], b[at + 2], b[at + 3]]
}

/// Counts top-level occurrences of length-delimited field `field` in a
/// protobuf message without decoding it, so a footer of tiny empty section
/// entries cannot make the decoder allocate a huge `Vec`.
fn count_field(mut buf: &[u8], field: u64) -> Result<usize, BlockError> {
    let malformed = |reason: &str| BlockError::FooterMalformed {
        reason: reason.to_owned(),
    };
    let mut count = 0usize;
    while !buf.is_empty() {
        let key = read_varint(&mut buf).ok_or_else(|| malformed("truncated field key"))?;
        let skip = match key & 7 {
            0 => {
                read_varint(&mut buf).ok_or_else(|| malformed("truncated varint"))?;
                0
            }
            1 => 8,
            2 => {
                if key >> 3 == field {
                    count += 1;
                }
                read_varint(&mut buf).ok_or_else(|| malformed("truncated length"))?
            }
            5 => 4,
            _ => return Err(malformed("unsupported wire type")),
        };
        let skip = usize::try_from(skip)
            .ok()
            .filter(|&n| n <= buf.len())
            .ok_or_else(|| malformed("field past end"))?;
        buf = &buf[skip..];
    }
    Ok(count)
}

fn read_varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_field_counts_only_top_level_sections() {
        let proto = FooterProto {
            format_version: 1,
            tenant: "t".into(),
            sections: vec![
                SectionProto {
                    name: "a".into(),
                    ..Default::default()
                };
                3
            ],
            ..Default::default()
        };
        let bytes = prost::Message::encode_to_vec(&proto);
        assert_eq!(count_field(&bytes, SECTIONS_FIELD).ok(), Some(3));
        assert!(count_field(&bytes[..bytes.len() - 1], SECTIONS_FIELD).is_err());
        assert!(count_field(&[0x80; 11], SECTIONS_FIELD).is_err());
    }

    #[test]
    fn initial_tail_is_whole_small_object() {
        assert_eq!(initial_tail_len(100), 100);
        assert_eq!(initial_tail_len(10 << 20), TAIL_FETCH_LEN);
    }
}
