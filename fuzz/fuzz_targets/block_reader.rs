//! Opens arbitrary bytes as a block and reads every section, so every
//! check between outside bytes and an allocation or slice is exercised.
//! libFuzzer's comparison tracing learns CRC32 values, so inputs do get
//! past the checksums into the IPC and Parquet decoders; `decode_section`
//! is also driven directly for each codec with the raw input.
//!
//! `decode_section` turns panics inside the Arrow and Parquet readers into
//! errors (crafted, CRC-valid sections can trigger them; see
//! `crates/core/src/block/decode.rs`). libFuzzer's panic hook aborts even on
//! caught panics, so panics raised in those crates are let through here and
//! every other panic (ours) is still a finding.
//!
//! Run with `cargo fuzz run block_reader -- -malloc_limit_mb=512` from the
//! repository root so large allocations count as findings.

#![no_main]

use std::sync::{Arc, Once};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use mira_core::BlockId;
use mira_core::block::{Block, Codec, Manifest, SectionEntry, VerifyCache, decode_section};

/// Chains to libFuzzer's hook except for panics located in the Arrow and
/// Parquet crates, which `decode_section` catches.
fn tolerate_upstream_decoder_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let fuzzer_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let upstream = info
                .location()
                .is_some_and(|l| ["/arrow-", "/parquet-"].iter().any(|c| l.file().contains(c)));
            if !upstream {
                fuzzer_hook(info);
            }
        }));
    });
}

fuzz_target!(|data: &[u8]| {
    tolerate_upstream_decoder_panics();
    let len = data.len() as u64;
    let _ = Manifest::from_tail(data, len);
    let _ = Manifest::from_tail(&data[data.len() / 2..], len);

    let verify = Arc::new(VerifyCache::new(64));
    if let Ok(block) = Block::from_bytes(Bytes::copy_from_slice(data), verify) {
        let names: Vec<String> = block.manifest().sections.iter().map(|s| s.name.clone()).collect();
        for name in &names {
            let _ = block.section_bytes(name);
            let _ = block.read_batches(name);
        }
    }

    // The decoders alone, as if the bytes had passed a CRC check.
    if let Some((&selector, rest)) = data.split_first() {
        let codec = Codec::ALL[usize::from(selector) % Codec::ALL.len()];
        let entry = SectionEntry {
            name: "fuzz".to_owned(),
            offset: 64,
            length: rest.len() as u64,
            crc32: 0,
            codec,
            rows: u64::from(selector),
        };
        let _ = decode_section(BlockId::from_u128(1), &entry, Bytes::copy_from_slice(rest));
    }
});
