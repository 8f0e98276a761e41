//! Cross-cutting tests of the block container: round trips through every
//! reader, zero-copy, verification caching, corruption and hostile input.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use arrow::array::{
    ArrayData, ArrayRef, BooleanArray, Decimal128Array, DictionaryArray, Int32Array, ListArray, StringArray,
    UInt64Array,
};
use arrow::compute::concat_batches;
use arrow::datatypes::{Int32Type, Int64Type};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{GetRange, ObjectStore, ObjectStoreExt};
use proptest::prelude::*;

use super::footer::{FooterProto, SectionProto, encode_tail, header};
use super::*;
use crate::ids::{BlockId, Signal, TenantId};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SECTIONS: [(&str, Codec); 4] = [
    ("root", Codec::Ipc),
    ("resources", Codec::IpcZstd),
    ("attrs", Codec::Parquet),
    ("bloom", Codec::Raw),
];

fn meta(level: Level) -> BlockMeta {
    BlockMeta {
        block_id: BlockId::from_u128(0x0191_2345_6789_abcd_ef01_2345_6789_abcd),
        tenant: TenantId::new("acme").expect("valid tenant"),
        signal: Signal::Logs,
        min_time: 1_709_251_199_000_000_000,
        max_time: 1_709_251_260_000_000_000,
        rows: 300,
        schema_version: 3,
        level,
    }
}

/// A batch with fixed-width, variable-width, dictionary, nested, boolean
/// and 16-byte (decimal) columns, nulls included.
fn batch(start: u64, rows: usize) -> RecordBatch {
    let n = rows as u64;
    let time = UInt64Array::from_iter_values(start..start + n);
    let severity = Int32Array::from_iter((0..rows).map(|i| (i % 5 != 0).then_some(i as i32 % 24)));
    let body = StringArray::from_iter((0..rows).map(|i| (i % 7 != 0).then(|| format!("message {i} from {start}"))));
    let service: DictionaryArray<Int32Type> = (0..rows).map(|i| ["api", "db", "web"][i % 3]).collect();
    let values = ListArray::from_iter_primitive::<Int64Type, _, _>(
        (0..rows).map(|i| (i % 4 != 0).then(|| (0..i % 3).map(|j| Some((i * j) as i64)).collect::<Vec<_>>())),
    );
    let flag = BooleanArray::from_iter((0..rows).map(|i| Some(i % 2 == 0)));
    let big = Decimal128Array::from_iter_values((0..rows).map(|i| i as i128 * 1_000_000_007))
        .with_precision_and_scale(38, 2)
        .expect("valid decimal");
    RecordBatch::try_from_iter([
        ("time", Arc::new(time) as ArrayRef),
        ("severity", Arc::new(severity)),
        ("body", Arc::new(body)),
        ("service", Arc::new(service)),
        ("values", Arc::new(values)),
        ("flag", Arc::new(flag)),
        ("big", Arc::new(big)),
    ])
    .expect("valid batch")
}

fn root_batches() -> Vec<RecordBatch> {
    vec![batch(0, 200), batch(1_000, 100)]
}

fn resource_batches() -> Vec<RecordBatch> {
    vec![batch(5_000, 150)]
}

fn parquet_batch() -> RecordBatch {
    batch(9_000, 120)
}

fn parquet_bytes(b: &RecordBatch) -> Vec<u8> {
    use parquet::basic::{Compression, ZstdLevel};
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).expect("valid level")))
        .build();
    let mut out = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, b.schema(), Some(props)).expect("parquet writer");
    w.write(b).expect("parquet write");
    w.close().expect("parquet close");
    out
}

fn bloom_bytes() -> Vec<u8> {
    (0..1_000u32).map(|i| (i * 31 % 251) as u8).collect()
}

fn build(level: Level) -> Bytes {
    let mut w = BlockWriter::new(meta(level));
    w.add_batches("root", Codec::Ipc, &root_batches()).expect("root");
    w.add_batches("resources", Codec::IpcZstd, &resource_batches())
        .expect("resources");
    w.add_bytes("attrs", Codec::Parquet, 120, &parquet_bytes(&parquet_batch()))
        .expect("attrs");
    w.add_bytes("bloom", Codec::Raw, 0, &bloom_bytes()).expect("bloom");
    w.finish().expect("finish")
}

/// The standard test block, built once.
fn sample() -> Bytes {
    static SAMPLE: OnceLock<Bytes> = OnceLock::new();
    SAMPLE.get_or_init(|| build(Level::Hot)).clone()
}

fn cache() -> Arc<VerifyCache> {
    Arc::new(VerifyCache::new(1_024))
}

fn concat(batches: &[RecordBatch]) -> RecordBatch {
    concat_batches(&batches[0].schema(), batches).expect("same schema")
}

/// Reads every section through `read` and compares with what was written.
fn assert_contents(mut read: impl FnMut(&str) -> Result<Vec<RecordBatch>, BlockError>, raw: &[u8]) {
    assert_eq!(read("root").expect("root"), root_batches());
    assert_eq!(read("resources").expect("resources"), resource_batches());
    let attrs = read("attrs").expect("attrs");
    assert_eq!(concat(&attrs), parquet_batch());
    assert_eq!(raw, bloom_bytes().as_slice());
    assert!(matches!(read("bloom"), Err(BlockError::NotBatches { .. })));
    assert!(matches!(read("nope"), Err(BlockError::NoSuchSection { .. })));
}

#[test]
fn round_trip_from_bytes() {
    let block = Block::from_bytes(sample(), cache()).expect("opens");
    assert_eq!(block.meta(), &meta(Level::Hot));
    let names: Vec<_> = block
        .manifest()
        .sections
        .iter()
        .map(|s| (s.name.as_str(), s.codec))
        .collect();
    assert_eq!(names, SECTIONS);
    let rows: Vec<_> = block.manifest().sections.iter().map(|s| s.rows).collect();
    assert_eq!(rows, [300, 150, 120, 0]);
    for s in &block.manifest().sections {
        assert_eq!(s.offset % ALIGNMENT, 0, "{}", s.name);
    }
    assert_contents(|n| block.read_batches(n), &block.section_bytes("bloom").expect("bloom"));
}

#[test]
fn round_trip_open_file() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("b.mira");
    std::fs::write(&path, sample())?;
    let block = Block::open_file(&path, cache())?;
    assert_eq!(block.meta(), &meta(Level::Hot));
    assert_contents(|n| block.read_batches(n), &block.section_bytes("bloom")?);
    Ok(())
}

#[test]
fn open_file_errors_are_typed() -> TestResult {
    let dir = tempfile::tempdir()?;
    let missing = Block::open_file(&dir.path().join("missing.mira"), cache());
    assert!(
        matches!(&missing, Err(e @ BlockError::Io { .. }) if !e.is_corrupt()),
        "{missing:?}"
    );
    let empty = dir.path().join("empty.mira");
    std::fs::write(&empty, b"")?;
    assert!(matches!(
        Block::open_file(&empty, cache()),
        Err(BlockError::TooShort { len: 0 })
    ));
    Ok(())
}

fn remote_round_trip(store: Arc<dyn ObjectStore>) -> TestResult {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let m = meta(Level::Cold);
        let path = block_path(&m.tenant, m.signal, m.min_time, m.block_id);
        assert_eq!(path.as_ref(), format!("acme/logs/2024-02-29/23/{}.mira", m.block_id));
        store.put(&path, build(Level::Cold).into()).await?;
        let block = RemoteBlock::open(store, &path, cache()).await?;
        assert_eq!(block.meta(), &m);
        let mut read = std::collections::HashMap::new();
        for (name, _) in SECTIONS.iter().chain([&("nope", Codec::Raw)]) {
            read.insert(*name, block.read_batches(name).await);
        }
        let bloom = block.section_bytes("bloom").await?;
        assert_contents(|n| read.remove(n).expect("read above"), &bloom);
        Ok(())
    })
}

#[test]
fn round_trip_remote_in_memory() -> TestResult {
    remote_round_trip(Arc::new(InMemory::new()))
}

#[test]
fn round_trip_remote_local_file_system() -> TestResult {
    let dir = tempfile::tempdir()?;
    remote_round_trip(Arc::new(object_store::local::LocalFileSystem::new_with_prefix(
        dir.path(),
    )?))
}

/// Calls `f` on every buffer (values, offsets, nulls) of `data` and its
/// children.
fn for_each_buffer(data: &ArrayData, f: &mut impl FnMut(*const u8, usize)) {
    for b in data.buffers() {
        f(b.as_ptr(), b.len());
    }
    if let Some(nulls) = data.nulls() {
        f(nulls.buffer().as_ptr(), nulls.buffer().len());
    }
    for child in data.child_data() {
        for_each_buffer(child, f);
    }
}

/// Asserts that every buffer of every column (dictionary values included)
/// lies inside `within`; returns how many buffers were checked.
fn assert_buffers_within(batches: &[RecordBatch], within: Range<usize>) -> usize {
    let mut checked = 0;
    let mut check = |ptr: *const u8, len: usize| {
        let ptr = ptr as usize;
        assert!(
            within.contains(&ptr) && ptr + len <= within.end,
            "buffer {ptr:#x}+{len} outside {within:x?}"
        );
        checked += 1;
    };
    for b in batches {
        for column in b.columns() {
            for_each_buffer(&column.to_data(), &mut check);
            // Dictionary values live in the dictionary message, also inside.
            if let Some(dict) = column.as_any().downcast_ref::<DictionaryArray<Int32Type>>() {
                for_each_buffer(&dict.values().to_data(), &mut check);
            }
        }
    }
    checked
}

#[test]
fn hot_block_from_file_is_zero_copy() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("hot.mira");
    std::fs::write(&path, sample())?;
    let block = Block::open_file(&path, cache())?;
    let map = block.data().as_ptr_range();
    let checked = assert_buffers_within(&block.read_batches("root")?, map.start as usize..map.end as usize);
    assert!(checked >= 2 * 7, "only {checked} buffers checked");
    Ok(())
}

#[test]
fn hot_block_in_heap_memory_is_zero_copy() {
    // Heap allocations are 16-byte aligned, which is all the decoder needs.
    let bytes = sample();
    assert!((bytes.as_ptr() as usize).is_multiple_of(16));
    let block = Block::from_bytes(bytes.clone(), cache()).expect("opens");
    let range = bytes.as_ptr_range();
    assert!(
        assert_buffers_within(
            &block.read_batches("root").expect("root"),
            range.start as usize..range.end as usize
        ) > 0
    );
}

#[test]
fn unaligned_bytes_still_decode() {
    // A block at an odd address: the hot section is copied once into an
    // aligned buffer, then decoded.
    let mut v = vec![0u8];
    v.extend_from_slice(&sample());
    let bytes = Bytes::from(v).slice(1..);
    let block = Block::from_bytes(bytes, cache()).expect("opens");
    assert_eq!(block.read_batches("root").expect("root"), root_batches());
}

#[test]
fn verification_is_lazy_and_remembered() {
    let verify = cache();
    let block = Block::from_bytes(sample(), verify.clone()).expect("opens");
    assert_eq!(verify.verifications(), 0, "opening verifies no section");
    block.section_bytes("resources").expect("resources");
    assert_eq!(verify.verifications(), 1);
    block.read_batches("resources").expect("resources again");
    assert_eq!(verify.verifications(), 1, "second read does not re-verify");
    // Section A's verification says nothing about section B.
    block.section_bytes("bloom").expect("bloom");
    assert_eq!(verify.verifications(), 2);
    // Another reader of the same block shares the cache.
    let again = Block::from_bytes(sample(), verify.clone()).expect("opens");
    again.section_bytes("bloom").expect("bloom");
    assert_eq!(verify.verifications(), 2);
    assert_eq!(verify.mismatches(), 0);
}

#[test]
fn crc_mismatch_is_counted_and_not_remembered() {
    let verify = cache();
    let mut bad = sample().to_vec();
    let block = Block::from_bytes(sample(), cache()).expect("opens");
    let (_, root) = block.manifest().section("root").expect("root");
    bad[(root.offset + root.length / 2) as usize] ^= 1;
    let bad = Block::from_bytes(Bytes::from(bad), verify.clone()).expect("opens");
    for _ in 0..2 {
        assert!(matches!(
            bad.read_batches("root"),
            Err(BlockError::SectionCrcMismatch { .. })
        ));
    }
    assert_eq!((verify.verifications(), verify.mismatches()), (2, 2));
}

/// Which part of the standard block a byte offset falls in.
#[derive(Debug, PartialEq)]
enum Part {
    Header,
    Section(&'static str),
    Padding,
    Footer,
    Trailer,
}

fn part_of(m: &Manifest, offset: u64) -> Part {
    if offset < HEADER_LEN {
        return Part::Header;
    }
    if offset >= m.object_len() - TRAILER_LEN {
        return Part::Trailer;
    }
    if offset >= m.footer_start() {
        return Part::Footer;
    }
    for (name, _) in SECTIONS {
        let (_, s) = m.section(name).expect("standard section");
        if s.range().contains(&offset) {
            return Part::Section(name);
        }
    }
    Part::Padding
}

fn flipped(offset: usize) -> Bytes {
    let mut v = sample().to_vec();
    v[offset] ^= 0x5a;
    Bytes::from(v)
}

/// Flipping any byte either fails the open (header, padding, footer,
/// trailer) or fails reading exactly the section it is in.
#[test]
fn corruption_anywhere_is_detected() {
    let good = Block::from_bytes(sample(), cache()).expect("opens");
    let m = good.manifest().clone();
    let mut seen = std::collections::HashSet::new();
    for offset in (0..sample().len()).step_by(7) {
        let part = part_of(&m, offset as u64);
        let opened = Block::from_bytes(flipped(offset), cache());
        match &part {
            Part::Section(hit) => {
                let block = opened.unwrap_or_else(|e| panic!("offset {offset} in {hit}: open failed: {e}"));
                for (name, _) in SECTIONS {
                    let read = block.section_bytes(name);
                    if name == *hit {
                        assert!(
                            matches!(read, Err(BlockError::SectionCrcMismatch { .. })),
                            "offset {offset} in {hit}: {read:?}"
                        );
                        assert!(block.read_batches(name).is_err());
                    } else {
                        assert!(read.is_ok(), "offset {offset} in {hit} broke {name}");
                    }
                }
            }
            _ => {
                let err = opened.expect_err(&format!("offset {offset} in {part:?} opened"));
                assert!(err.is_corrupt(), "offset {offset}: {err}");
            }
        }
        seen.insert(format!("{part:?}"));
    }
    assert_eq!(seen.len(), 8, "every part was hit: {seen:?}");
}

/// The same through a remote reader, for a block small enough that the
/// first GET returns all of it.
#[test]
fn corruption_is_detected_remotely() -> TestResult {
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let good = Block::from_bytes(sample(), cache())?;
    let m = good.manifest().clone();
    assert!(m.object_len() < TAIL_FETCH_LEN);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let path = Path::from("b.mira");
    rt.block_on(async {
        for offset in (0..sample().len()).step_by(13) {
            store.put(&path, flipped(offset).into()).await?;
            let opened = RemoteBlock::open(store.clone(), &path, cache()).await;
            match part_of(&m, offset as u64) {
                Part::Section(hit) => {
                    let block = opened?;
                    for (name, _) in SECTIONS {
                        let read = block.section_bytes(name).await;
                        assert_eq!(read.is_err(), name == hit, "offset {offset} in {hit}, reading {name}");
                    }
                }
                part => assert!(opened.is_err(), "offset {offset} in {part:?} opened"),
            }
        }
        Ok(())
    })
}

/// Assembles a block around a hand-made footer: header, `body_len` zero
/// bytes, footer, trailer.
fn craft(proto: &FooterProto, body_len: usize) -> Bytes {
    let mut v = header().to_vec();
    v.resize(HEADER_LEN as usize + body_len, 0);
    v.extend_from_slice(&encode_tail(proto));
    Bytes::from(v)
}

/// A valid footer for a block with one raw section of `len` zero bytes.
fn proto_one_section(len: u64) -> FooterProto {
    let mut p = Manifest::new_unchecked(meta(Level::Hot), Vec::new()).to_proto();
    p.sections.push(SectionProto {
        name: "s".into(),
        offset: HEADER_LEN,
        length: len,
        crc32: crc32fast::hash(&vec![0; len as usize]),
        codec: "raw".into(),
        rows: 1,
    });
    p
}

fn open_err(bytes: Bytes) -> BlockError {
    let err = Block::from_bytes(bytes, cache()).expect_err("hostile input opened");
    assert!(err.is_corrupt(), "{err}");
    err
}

fn with_trailer(mut v: Vec<u8>, footer_len: u32) -> Bytes {
    let at = v.len() - 12;
    v[at..at + 4].copy_from_slice(&footer_len.to_le_bytes());
    Bytes::from(v)
}

#[test]
fn crafted_block_is_valid() {
    // The hostile cases below start from this and change one thing.
    let block = Block::from_bytes(craft(&proto_one_section(100), 100), cache()).expect("valid");
    assert_eq!(block.section_bytes("s").expect("s").len(), 100);
}

#[test]
fn hostile_inputs_get_typed_errors() {
    assert!(matches!(open_err(Bytes::new()), BlockError::TooShort { len: 0 }));
    assert!(matches!(
        open_err(Bytes::from_static(b"MIRA\x01\0\0\0MIR")),
        BlockError::TooShort { len: 11 }
    ));

    let mut v = sample().to_vec();
    v[3] = b'B';
    assert!(matches!(open_err(Bytes::from(v)), BlockError::BadLeadingMagic { found } if &found == b"MIRB"));
    let mut v = sample().to_vec();
    let n = v.len();
    v[n - 1] = b'B';
    assert!(matches!(open_err(Bytes::from(v)), BlockError::BadTrailingMagic { .. }));
    let mut v = sample().to_vec();
    v[4] = 2;
    assert!(matches!(
        open_err(Bytes::from(v)),
        BlockError::UnsupportedVersion { version: 2 }
    ));

    assert!(matches!(
        open_err(with_trailer(sample().to_vec(), u32::MAX)),
        BlockError::FooterPastStart { .. }
    ));
    // A footer reaching back into the header.
    let len = sample().len() as u32;
    assert!(matches!(
        open_err(with_trailer(sample().to_vec(), len - 12 - 10)),
        BlockError::FooterPastStart { .. }
    ));
    assert!(matches!(
        open_err(with_trailer(sample().to_vec(), 3)),
        BlockError::FooterCrcMismatch { .. }
    ));

    // Garbage with a matching CRC.
    let mut garbage = header().to_vec();
    let junk = [0xffu8; 40];
    garbage.extend_from_slice(&junk);
    garbage.extend_from_slice(&40u32.to_le_bytes());
    garbage.extend_from_slice(&crc32fast::hash(&junk).to_le_bytes());
    garbage.extend_from_slice(&MAGIC);
    assert!(matches!(
        open_err(Bytes::from(garbage)),
        BlockError::FooterMalformed { .. }
    ));
    let mut p = proto_one_section(10);
    p.tenant = String::from_utf8_lossy(&[0xff]).into_owned();
    let mut bytes = craft(&p, 10).to_vec();
    // Replace the U+FFFD with invalid UTF-8 of the same length, fix the CRC.
    let at = bytes
        .windows(3)
        .position(|w| w == "\u{fffd}".as_bytes())
        .expect("tenant");
    bytes[at..at + 3].copy_from_slice(&[0xff, 0xfe, 0xfd]);
    let footer_len = u32::from_le_bytes(bytes[bytes.len() - 12..bytes.len() - 8].try_into().expect("4 bytes")) as usize;
    let footer = bytes[bytes.len() - 12 - footer_len..bytes.len() - 12].to_vec();
    let n = bytes.len();
    bytes[n - 8..n - 4].copy_from_slice(&crc32fast::hash(&footer).to_le_bytes());
    assert!(matches!(open_err(Bytes::from(bytes)), BlockError::FooterDecode(_)));

    let mut p = proto_one_section(10);
    p.format_version = 2;
    assert!(matches!(
        open_err(craft(&p, 10)),
        BlockError::UnsupportedVersion { version: 2 }
    ));

    // Overlapping sections.
    let mut p = proto_one_section(128);
    p.sections.push(SectionProto {
        name: "t".into(),
        offset: 128,
        length: 64,
        ..p.sections[0].clone()
    });
    assert!(matches!(
        open_err(craft(&p, 128)),
        BlockError::OverlappingSections { .. }
    ));
    // A section over the header.
    let mut p = proto_one_section(128);
    p.sections[0].offset = 0;
    assert!(matches!(open_err(craft(&p, 64)), BlockError::SectionOutOfBounds { .. }));
    // Unknown codec.
    let mut p = proto_one_section(10);
    p.sections[0].codec = "lz5".into();
    assert!(matches!(open_err(craft(&p, 10)), BlockError::UnknownCodec { codec, .. } if codec == "lz5"));
    // Absurd rows, in a section and in the meta.
    let mut p = proto_one_section(10);
    p.sections[0].rows = u64::MAX;
    assert!(matches!(
        open_err(craft(&p, 10)),
        BlockError::AbsurdRows {
            section: Some(_),
            rows: u64::MAX,
            ..
        }
    ));
    let mut p = proto_one_section(10);
    p.rows = u64::MAX;
    assert!(matches!(
        open_err(craft(&p, 10)),
        BlockError::AbsurdRows { section: None, .. }
    ));
    // A 1 GiB section claimed in a 1 KiB file.
    let mut p = proto_one_section(10);
    p.sections[0].length = 1 << 30;
    let bytes = craft(&p, 1_024 - 64 - 200);
    assert!(bytes.len() <= 1_024);
    assert!(matches!(
        open_err(bytes),
        BlockError::SectionOutOfBounds {
            length: 0x4000_0000,
            ..
        }
    ));
    let mut p = proto_one_section(10);
    p.sections[0].length = u64::MAX;
    assert!(matches!(open_err(craft(&p, 10)), BlockError::SectionOutOfBounds { .. }));
    // Unaligned, gap, trailing bytes.
    let mut p = proto_one_section(10);
    p.sections[0].offset = 65;
    assert!(matches!(
        open_err(craft(&p, 11)),
        BlockError::UnalignedSection { offset: 65, .. }
    ));
    let mut p = proto_one_section(10);
    p.sections[0].offset = 128;
    assert!(matches!(
        open_err(craft(&p, 74)),
        BlockError::UnexpectedGap {
            offset: 64,
            len: 64,
            ..
        }
    ));
    assert!(matches!(
        open_err(craft(&proto_one_section(10), 20)),
        BlockError::UnexpectedGap { offset: 74, .. }
    ));
    // Duplicate names.
    let mut p = proto_one_section(10);
    p.sections.push(SectionProto {
        offset: 128,
        ..p.sections[0].clone()
    });
    assert!(matches!(open_err(craft(&p, 74)), BlockError::DuplicateSection { .. }));
    let mut p = proto_one_section(10);
    p.sections[0].name = String::new();
    assert!(matches!(open_err(craft(&p, 10)), BlockError::InvalidSectionName { .. }));
    // Bad meta.
    for change in [
        (|p: &mut FooterProto| p.signal = 9) as fn(&mut FooterProto),
        |p| p.level = 0,
        |p| p.tenant = "../x".into(),
        |p| p.min_time = p.max_time + 1,
    ] {
        let mut p = proto_one_section(10);
        change(&mut p);
        assert!(matches!(open_err(craft(&p, 10)), BlockError::InvalidMeta { .. }));
    }
    // Many tiny section entries are refused before they are decoded.
    let mut p = proto_one_section(10);
    p.sections
        .extend(std::iter::repeat_n(SectionProto::default(), MAX_SECTIONS));
    assert!(matches!(
        open_err(craft(&p, 10)),
        BlockError::TooManySections { count: 1_025 }
    ));
    // Non-zero padding and header padding.
    let mut v = craft(&proto_one_section(10), 10).to_vec();
    v[HEADER_LEN as usize - 1] = 1;
    assert!(matches!(
        open_err(Bytes::from(v)),
        BlockError::BadHeaderPadding { offset: 63 }
    ));
    let block = Block::from_bytes(sample(), cache()).expect("opens");
    let pad = block.manifest().padding_ranges()[0].clone();
    let mut v = sample().to_vec();
    v[pad.start as usize] = 1;
    assert!(matches!(open_err(Bytes::from(v)), BlockError::NonZeroPadding { .. }));
}

#[test]
fn short_tail_reports_exact_need() {
    let bytes = sample();
    let full = Manifest::from_tail(&bytes, bytes.len() as u64).expect("valid");
    let need = full.tail_len();
    let short = &bytes[bytes.len() - need as usize + 1..];
    match Manifest::from_tail(short, bytes.len() as u64) {
        Err(e @ BlockError::TailTooShort { .. }) => {
            assert!(!e.is_corrupt());
            assert!(matches!(e, BlockError::TailTooShort { need: n, .. } if n == need));
        }
        other => panic!("expected TailTooShort, got {other:?}"),
    }
    let tail = &bytes[bytes.len() - need as usize..];
    assert_eq!(Manifest::from_tail(tail, bytes.len() as u64).expect("exact tail"), full);
    assert!(matches!(
        Manifest::from_tail(&bytes, 10),
        Err(BlockError::TooShort { len: 10 })
    ));
    assert!(matches!(
        Manifest::from_tail(&bytes, 100),
        Err(BlockError::TailLongerThanObject { .. })
    ));
}

#[test]
fn writer_rejects_misuse() {
    let mut w = BlockWriter::new(meta(Level::Hot));
    w.add_bytes("a", Codec::Raw, 0, b"x").expect("a");
    assert!(matches!(
        w.add_bytes("a", Codec::Raw, 0, b"y"),
        Err(BlockError::WriteDuplicateSection { .. })
    ));
    assert!(matches!(
        w.add_batches("a", Codec::Ipc, &root_batches()),
        Err(BlockError::WriteDuplicateSection { .. })
    ));
    for codec in [Codec::Parquet, Codec::Raw] {
        assert!(matches!(
            w.add_batches("b", codec, &root_batches()),
            Err(BlockError::WriteInvalidSection { .. })
        ));
    }
    assert!(matches!(
        w.add_batches("b", Codec::Ipc, &[]),
        Err(BlockError::WriteInvalidSection { .. })
    ));
    assert!(matches!(
        w.add_bytes("", Codec::Raw, 0, b""),
        Err(BlockError::WriteInvalidSection { .. })
    ));
    assert!(matches!(
        w.add_bytes("b", Codec::Raw, u64::MAX, b""),
        Err(BlockError::WriteInvalidSection { .. })
    ));
    let mixed = [
        batch(0, 3),
        RecordBatch::new_empty(Arc::new(arrow::datatypes::Schema::empty())),
    ];
    let before = w.bytes_written();
    assert!(matches!(
        w.add_batches("b", Codec::Ipc, &mixed),
        Err(BlockError::WriteInvalidSection { .. })
    ));
    assert_eq!(w.bytes_written(), before, "a failed section leaves nothing behind");
    let err = w.add_bytes("a", Codec::Raw, 0, b"").expect_err("duplicate");
    assert!(!err.is_corrupt());
    // Failed adds left the block consistent.
    let block = Block::from_bytes(w.finish().expect("finish"), cache()).expect("opens");
    assert_eq!(block.manifest().sections.len(), 1);

    let mut m = meta(Level::Hot);
    m.min_time = m.max_time + 1;
    assert!(matches!(
        BlockWriter::new(m).finish(),
        Err(BlockError::WriteInvalidBlock { .. })
    ));
}

#[test]
fn empty_and_zero_length_sections() -> TestResult {
    let mut w = BlockWriter::new(meta(Level::Hot));
    let empty = RecordBatch::new_empty(batch(0, 1).schema());
    w.add_batches("empty", Codec::Ipc, std::slice::from_ref(&empty))?;
    w.add_bytes("nothing", Codec::Raw, 0, b"")?;
    w.add_bytes("after", Codec::Raw, 0, b"z")?;
    let bytes = w.finish()?;
    let block = Block::from_bytes(bytes.clone(), cache())?;
    assert_eq!(
        block.read_batches("empty")?.iter().map(|b| b.num_rows()).sum::<usize>(),
        0
    );
    assert!(block.section_bytes("nothing")?.is_empty());
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    rt.block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("e.mira");
        store.put(&path, bytes.into()).await?;
        let remote = RemoteBlock::open(store, &path, cache()).await?;
        assert!(remote.section_bytes("nothing").await?.is_empty());
        assert_eq!(remote.section_bytes("after").await?.as_ref(), b"z");
        Ok(())
    })
}

#[test]
fn row_count_mismatch_is_corrupt() {
    let mut w = BlockWriter::new(meta(Level::Cold));
    w.add_bytes("attrs", Codec::Parquet, 7, &parquet_bytes(&parquet_batch()))
        .expect("attrs");
    let block = Block::from_bytes(w.finish().expect("finish"), cache()).expect("opens");
    let err = block.read_batches("attrs").expect_err("rows differ");
    assert!(
        matches!(
            err,
            BlockError::RowCountMismatch {
                expected: 7,
                actual: 120,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_corrupt());
}

use mira_testkit::store::TestStore as CountingStore;

fn bounded(r: Range<u64>) -> Option<GetRange> {
    Some(GetRange::Bounded(r))
}

#[test]
fn remote_fetches_only_tail_and_the_section_read() -> TestResult {
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    // Big enough that the tail is not the whole object.
    let mut w = BlockWriter::new(meta(Level::Cold));
    w.add_batches("root", Codec::IpcZstd, &root_batches())?;
    w.add_bytes("big", Codec::Raw, 0, &vec![7u8; 200_000])?;
    w.add_bytes("bloom", Codec::Raw, 0, &bloom_bytes())?;
    let bytes = w.finish()?;
    rt.block_on(async {
        let counting = Arc::new(CountingStore::new());
        let store: Arc<dyn ObjectStore> = counting.clone();
        let path = Path::from("b.mira");
        store.put(&path, bytes.clone().into()).await?;
        let verify = cache();
        let block = RemoteBlock::open(store, &path, verify.clone()).await?;
        assert_eq!(counting.take_gets(), [Some(GetRange::Suffix(TAIL_FETCH_LEN))]);
        assert_eq!(verify.verifications(), 0);

        let (_, root) = block.manifest().section("root").expect("root");
        assert_eq!(block.read_batches("root").await?, root_batches());
        assert_eq!(counting.take_gets(), [bounded(root.range())]);
        let (_, bloom) = block.manifest().section("bloom").expect("bloom");
        block.section_bytes("bloom").await?;
        block.section_bytes("bloom").await?;
        assert_eq!(counting.take_gets(), [bounded(bloom.range()), bounded(bloom.range())]);
        assert_eq!(verify.verifications(), 2, "big was never verified, bloom once");
        Ok(())
    })
}

#[test]
fn remote_fetches_a_long_footer_in_a_second_get() -> TestResult {
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let mut w = BlockWriter::new(meta(Level::Cold));
    w.add_bytes("body", Codec::Raw, 0, &vec![1u8; 100_000])?;
    for i in 0..700 {
        w.add_bytes(&format!("{i:0>120}"), Codec::Raw, 0, b"s")?;
    }
    let bytes = w.finish()?;
    let need = Manifest::from_tail(&bytes, bytes.len() as u64)?.tail_len();
    assert!(need > TAIL_FETCH_LEN, "footer of {need} bytes");
    rt.block_on(async {
        let counting = Arc::new(CountingStore::new());
        let store: Arc<dyn ObjectStore> = counting.clone();
        let path = Path::from("wide.mira");
        store.put(&path, bytes.clone().into()).await?;
        let block = RemoteBlock::open(store, &path, cache()).await?;
        let len = bytes.len() as u64;
        assert_eq!(
            counting.take_gets(),
            [
                Some(GetRange::Suffix(TAIL_FETCH_LEN)),
                bounded(len - need..len - TAIL_FETCH_LEN)
            ]
        );
        assert_eq!(block.manifest().sections.len(), 701);
        assert_eq!(block.section_bytes(&format!("{:0>120}", 699)).await?.as_ref(), b"s");
        Ok(())
    })
}

#[test]
fn remote_errors_are_typed() -> TestResult {
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    rt.block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let missing = RemoteBlock::open(store.clone(), &Path::from("missing.mira"), cache()).await;
        assert!(
            matches!(&missing, Err(e @ BlockError::ObjectStore { .. }) if !e.is_corrupt()),
            "{missing:?}"
        );
        for (name, bytes) in [
            ("empty", Bytes::new()),
            ("short", Bytes::from_static(b"MIRA\x01\0\0\0MIR")),
        ] {
            let path = Path::from(name);
            store.put(&path, bytes.into()).await?;
            let err = RemoteBlock::open(store.clone(), &path, cache()).await.expect_err(name);
            assert!(matches!(err, BlockError::TooShort { .. }), "{name}: {err}");
        }
        Ok(())
    })
}

/// Re-computes every section CRC and the footer of a block whose section
/// bytes were changed, so the change reaches the decoders.
fn reseal(bytes: &[u8]) -> Bytes {
    let m = Manifest::from_tail(bytes, bytes.len() as u64).ok();
    let Some(m) = m else {
        return Bytes::copy_from_slice(bytes);
    };
    let mut sections = m.sections.clone();
    for s in &mut sections {
        s.crc32 = crc32fast::hash(&bytes[s.range().start as usize..s.range().end as usize]);
    }
    let mut v = bytes[..m.footer_start() as usize].to_vec();
    v.extend_from_slice(&encode_tail(
        &Manifest::new_unchecked(m.meta.clone(), sections).to_proto(),
    ));
    Bytes::from(v)
}

/// Opens `bytes` and reads every section every way; returns the sections
/// that read successfully with their bytes.
fn read_everything(bytes: Bytes) -> Vec<(String, Bytes)> {
    let mut ok = Vec::new();
    let Ok(block) = Block::from_bytes(bytes, cache()) else {
        return ok;
    };
    for s in &block.manifest().sections {
        let _ = block.read_batches(&s.name);
        if let Ok(b) = block.section_bytes(&s.name) {
            ok.push((s.name.clone(), b));
        }
    }
    ok
}

fn section_of_sample(name: &str) -> Bytes {
    Block::from_bytes(sample(), cache())
        .expect("opens")
        .section_bytes(name)
        .expect("section")
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2_048), magic in any::<bool>()) {
        let mut bytes = bytes;
        if magic && bytes.len() >= 76 {
            // Get past the magic checks more often.
            bytes[..4].copy_from_slice(&MAGIC);
            let n = bytes.len();
            bytes[n - 4..].copy_from_slice(&MAGIC);
        }
        let len = bytes.len() as u64;
        let _ = Manifest::from_tail(&bytes, len);
        let _ = Manifest::from_tail(&bytes[bytes.len() / 2..], len);
        read_everything(Bytes::from(bytes));
    }

    #[test]
    fn mutated_blocks_never_yield_wrong_bytes(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut v = sample().to_vec();
        for (at, b) in &edits {
            let i = at.index(v.len());
            v[i] = *b;
        }
        for (name, bytes) in read_everything(Bytes::from(v)) {
            prop_assert_eq!(bytes, section_of_sample(&name), "section {} read with wrong bytes", name);
        }
    }

    #[test]
    fn resealed_garbage_sections_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
        section in 0..3usize,
    ) {
        // Edits confined to one decodable section, CRCs fixed up: this
        // exercises the IPC and Parquet decoders on hostile bytes.
        let block = Block::from_bytes(sample(), cache()).expect("opens");
        let s = block.manifest().sections[section].clone();
        let mut v = sample().to_vec();
        for (at, b) in &edits {
            let i = s.offset as usize + at.index(s.length as usize);
            v[i] = *b;
        }
        read_everything(reseal(&v));
    }
}

#[test]
fn resealing_reaches_the_decoder() {
    // Guard for the property above: a resealed edit is seen by the decoder,
    // not stopped by the CRC.
    let block = Block::from_bytes(sample(), cache()).expect("opens");
    let (_, root) = block.manifest().section("root").expect("root");
    let mut v = sample().to_vec();
    v[root.offset as usize] = b'X';
    let resealed = Block::from_bytes(reseal(&v), cache()).expect("opens");
    let err = resealed.read_batches("root").expect_err("bad magic");
    assert!(matches!(err, BlockError::MalformedIpc { .. }), "{err}");
}

#[test]
fn codec_and_level_names_round_trip() {
    for c in Codec::ALL {
        assert_eq!(Codec::parse(c.as_str()), Some(c));
    }
    assert_eq!(Codec::parse("IPC"), None);
    for l in [Level::Hot, Level::Cold] {
        assert_eq!(Level::from_code(l.code()), Some(l));
    }
}
