//! Opens arbitrary bytes as a block (a file in the object store or the
//! block cache) and reads it the ways the querier and the compactor do:
//! the footer from the tail (`Manifest::from_tail`, and `RemoteBlock::open`
//! against an in-memory object store, which fetches a longer tail when the
//! footer needs one), every section (`read_batches`), the signal's tables
//! (`read_tables`, attribute tables included) converted back to OTLP, the
//! sidecars (`read_sidecars`), pruning (`prune`) and a scan. Every check
//! between outside bytes and an allocation or slice is exercised.
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
//! Run with `scripts/fuzz.sh 600 block`.

#![no_main]

#[path = "../common/seeds.rs"]
mod seeds;

use std::sync::{Arc, Once, OnceLock};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use mira_core::block::{Block, Codec, Manifest, RemoteBlock, SectionEntry, VerifyCache, decode_section};
use mira_core::cold::write_cold;
use mira_core::convert::{LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, TableSet};
use mira_core::convert::{logs_to_otlp, points_to_otlp, spans_to_otlp};
use mira_core::scan::{Predicate, ScanRequest, prune, scan};
use mira_core::tables::{read_sidecars, read_tables, write_hot};
use mira_core::{BlockId, Signal, TenantId};
use mira_testkit::corpus::{Cardinality, Corpus};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

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

/// `RemoteBlock::open` of the bytes as an object, then one section.
fn remote_open(data: &[u8], verify: Arc<VerifyCache>) {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let rt = RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime")
    });
    rt.block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("t/logs/block");
        if store.put(&path, PutPayload::from(data.to_vec())).await.is_err() {
            return;
        }
        if let Ok(block) = RemoteBlock::open(store, &path, verify).await {
            let first = block.manifest().sections.first().map(|s| s.name.clone());
            if let Some(name) = first {
                let _ = block.read_batches(&name).await;
            }
        }
    });
}

/// A hot and a cold block of each signal, a few rows each.
fn make_seeds() -> Vec<(String, Vec<u8>)> {
    fn tables<B: SignalBuilder>(req: &B::Request) -> TableSet {
        let mut b = B::default();
        b.append(req).expect("corpus rows append");
        b.finish().expect("tables")
    }
    let mut c = Corpus::new(5, Cardinality::Low);
    let sets = [
        ("logs", tables::<LogsBuilder>(&c.logs(4))),
        ("traces", tables::<SpansBuilder>(&c.traces(4))),
        ("metrics", tables::<PointsBuilder>(&c.metrics(4))),
    ];
    let tenant = TenantId::new("team-a").expect("a tenant");
    let mut out = Vec::new();
    for (i, (name, t)) in sets.iter().enumerate() {
        let id = BlockId::from_u128(0x0190_0000_0000_0000_0000_0000_0000_0000 + i as u128);
        let hot = write_hot(t, id, tenant.clone()).expect("a hot block");
        let cold = write_cold(t, id, tenant.clone(), &[]).expect("a cold block");
        out.push((format!("{name}-hot"), hot.to_vec()));
        out.push((format!("{name}-cold"), cold.to_vec()));
    }
    out
}

fuzz_target!(init: seeds::write_if_asked(make_seeds), |data: &[u8]| {
    tolerate_upstream_decoder_panics();
    let len = data.len() as u64;
    let _ = Manifest::from_tail(data, len);
    let _ = Manifest::from_tail(&data[data.len() / 2..], len);

    let verify = Arc::new(VerifyCache::new(64));
    if let Ok(block) = Block::from_bytes(Bytes::copy_from_slice(data), verify.clone()) {
        let names: Vec<String> = block.manifest().sections.iter().map(|s| s.name.clone()).collect();
        for name in &names {
            let _ = block.section_bytes(name);
            let _ = block.read_batches(name);
        }
        if let Ok(tables) = read_tables(&block, None) {
            let _ = match tables.signal {
                Signal::Logs => logs_to_otlp(&tables).map(drop),
                Signal::Traces => spans_to_otlp(&tables).map(drop),
                Signal::Metrics => points_to_otlp(&tables).map(drop),
            };
        }
        let _ = read_sidecars(&block);
        let _ = prune(&block, &Predicate::default());
        let _ = scan(&block, &ScanRequest::default());
    }
    remote_open(data, verify);

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
