//! Bytes on disk per OTLP wire byte, hot and cold, for both corpora and all
//! three signals; the attribute-layout × codec comparison behind the cold
//! tier's choice; cold rewrite speed; and the scan cost of each codec for a
//! predicate that prunes nothing, as a ratio to plain IPC measured in the
//! same run; and merge throughput (the compactor's rewrite), hot and cold.
//!
//! `cargo bench -p mira-core --bench block` (env `MIRA_BENCH_RECORDS`,
//! default 2,000,000 log records per corpus; spans and points use a quarter).
//! `cargo bench -p mira-core --bench block -- merge` runs only the merge
//! section (env `MIRA_BENCH_MERGE_BLOCKS`, default 1,000 blocks of 1,000
//! log records).

use std::time::Instant;

use bytes::Bytes;
use std::sync::Arc;

use mira_core::block::{Block, BlockMeta, BlockWriter, Codec, Level, VerifyCache};
use mira_core::cold::{cold_layout, encode_parquet, rewrite_cold};
use mira_core::compact::{merge_blocks, merge_blocks_cold, merge_on_arrow, merge_tables, merge_via_otlp};
use mira_core::convert::{LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, TableSet, table_names};
use mira_core::scan::{LineFilter, Predicate, ScanRequest, scan};
use mira_core::sidecar::Sidecars;
use mira_core::tables::{block_meta, read_tables, write_hot};
use mira_core::{BlockId, Signal, TenantId};
use mira_testkit::corpus::{Cardinality, Corpus};
use prost::Message;

fn cache() -> Arc<VerifyCache> {
    Arc::new(VerifyCache::new(1024))
}

/// The ingester's default seal target.
const SEAL_BYTES: usize = 32 << 20;
const BATCH: usize = 8192;

struct Sealed {
    wire: usize,
    blocks: Vec<TableSet>,
}

/// Appends corpus requests until `records`, sealing at the ingester's target.
fn build_with<B: SignalBuilder>(records: usize, mut next: impl FnMut(usize) -> B::Request) -> Sealed {
    let mut b = B::default();
    let (mut wire, mut done, mut blocks) = (0, 0, Vec::new());
    while done < records {
        let r = next(BATCH.min(records - done));
        wire += r.encoded_len();
        done += b.append(&r).expect("append");
        if b.approx_bytes() >= SEAL_BYTES {
            blocks.push(b.finish().expect("finish"));
        }
    }
    if b.rows() > 0 {
        blocks.push(b.finish().expect("finish"));
    }
    Sealed { wire, blocks }
}

fn build(signal: Signal, card: Cardinality, records: usize) -> Sealed {
    let mut corpus = Corpus::new(42, card);
    match signal {
        Signal::Logs => build_with::<LogsBuilder>(records, |n| corpus.logs(n)),
        Signal::Traces => build_with::<SpansBuilder>(records, |n| corpus.traces(n)),
        Signal::Metrics => build_with::<PointsBuilder>(records, |n| corpus.metrics(n)),
    }
}

/// A block holding only the tables, in the given codec and attribute layout.
fn variant(t: &TableSet, codec: Codec, typed_attrs: bool) -> Bytes {
    let meta: BlockMeta = block_meta(t, BlockId::new(), TenantId::default_tenant(), Level::Cold);
    let mut w = BlockWriter::new(meta);
    for name in table_names(t.signal) {
        let batch = t.get(name).expect("table");
        let batch = if typed_attrs {
            cold_layout(name, batch).expect("typed")
        } else {
            batch.clone()
        };
        match codec {
            Codec::Parquet => w
                .add_bytes(
                    name,
                    codec,
                    batch.num_rows() as u64,
                    &encode_parquet(&batch).expect("parquet"),
                )
                .expect("add"),
            _ => w.add_batches(name, codec, &[batch]).expect("add"),
        }
    }
    w.finish().expect("finish")
}

fn nothing_matches() -> ScanRequest {
    ScanRequest {
        predicate: Predicate {
            lines: vec![LineFilter::Contains("no line holds this".into())],
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Seconds to scan every block with a predicate that prunes nothing.
fn scan_secs(blocks: &[Bytes]) -> f64 {
    let start = Instant::now();
    let mut n = 0;
    for b in blocks {
        let block = Block::from_bytes(b.clone(), cache()).expect("open");
        n += scan(&block, &nothing_matches()).expect("scan").rows_scanned;
    }
    assert!(n > 0);
    start.elapsed().as_secs_f64()
}

/// Merge throughput: `MIRA_BENCH_MERGE_BLOCKS` hot log blocks of 1,000
/// records each (high-cardinality corpus) merged into one block, hot then
/// cold, on one core. MiB/s are of the input hot blocks. Two more rows
/// split the hot merge: the merged tables alone, and the sidecars built
/// over them.
fn merge_section() {
    let blocks: usize = std::env::var("MIRA_BENCH_MERGE_BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let mut corpus = Corpus::new(7, Cardinality::High);
    let inputs: Vec<Block> = (0..blocks)
        .map(|_| {
            let mut b = LogsBuilder::default();
            b.append(&corpus.logs(1_000)).expect("append");
            let bytes =
                write_hot(&b.finish().expect("finish"), BlockId::new(), TenantId::default_tenant()).expect("hot");
            Block::from_bytes(bytes, cache()).expect("open")
        })
        .collect();
    let records: u64 = inputs.iter().map(|b| b.meta().rows).sum();
    let mib = inputs.iter().map(|b| b.data().len()).sum::<usize>() as f64 / (1 << 20) as f64;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("\n## Merge throughput: {blocks} log blocks of 1,000 records, on 1 to {cores} threads\n");
    println!("| output | threads | records | input MiB | output MiB | seconds | records/s | input MiB/s |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut secs_by = Vec::new();
    for threads in 1..=cores {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        for (name, merge) in [
            (
                "hot",
                merge_blocks as fn(&[Block], BlockId) -> Result<Bytes, mira_core::Error>,
            ),
            ("cold", merge_blocks_cold),
        ] {
            let start = Instant::now();
            let out = pool.install(|| merge(&inputs, BlockId::new())).expect("merge");
            let secs = start.elapsed().as_secs_f64();
            secs_by.push((name, threads, secs));
            println!(
                "| {name} | {threads} | {records} | {mib:.1} | {:.1} | {secs:.2} | {:.0} | {:.1} |",
                out.len() as f64 / (1 << 20) as f64,
                records as f64 / secs,
                mib / secs
            );
        }
    }
    // The machine's own ceiling, in the same run: independent zstd(3)
    // compressions of the input blocks, which share nothing.
    for threads in 1..=cores {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        let start = Instant::now();
        let out: usize = pool.install(|| {
            use rayon::prelude::*;
            inputs
                .par_iter()
                .map(|b| zstd::bulk::compress(b.data(), 3).expect("zstd").len())
                .sum()
        });
        let secs = start.elapsed().as_secs_f64();
        assert!(out > 0);
        secs_by.push(("independent zstd (the machine's ceiling)", threads, secs));
    }
    // Scaling: the speed-up over one thread, and what each added thread
    // gave (1.0 = linear).
    for &(name, threads, secs) in secs_by.iter().filter(|&&(_, t, _)| t > 1) {
        if let Some(&(_, _, one)) = secs_by.iter().find(|&&(n, t, _)| n == name && t == 1) {
            let speedup = one / secs;
            println!(
                "{name}: {threads} threads {speedup:.2}x one thread, {:.2} per added thread",
                (speedup - 1.0) / (threads - 1) as f64
            );
        }
    }
    println!("\nThe split below runs on one thread.\n");
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
    one.install(|| merge_split(&inputs, records, mib));
}

/// Where the merge's time goes, on the current pool.
fn merge_split(inputs: &[Block], records: u64, mib: f64) {
    // Where the hot merge's time goes: the merged tables alone (on Arrow,
    // and by the OTLP path it replaced, over the same tables read once, as
    // a baseline taken in the same run), then the sidecars built over them.
    let start = Instant::now();
    let tables = merge_tables(inputs).expect("merge tables");
    let secs = start.elapsed().as_secs_f64();
    println!(
        "| tables only | {records} | {mib:.1} | | {secs:.2} | {:.0} | {:.1} |",
        records as f64 / secs,
        mib / secs
    );
    let read: Vec<TableSet> = inputs.iter().map(|b| read_tables(b, None).expect("read")).collect();
    for (name, merge) in [
        (
            "tables only, read once: Arrow",
            (|s, t| Ok(merge_on_arrow(s, t)?.expect("taken")))
                as fn(Signal, &[TableSet]) -> Result<TableSet, mira_core::Error>,
        ),
        ("tables only, read once: OTLP path", merge_via_otlp),
    ] {
        let start = Instant::now();
        let out = merge(Signal::Logs, &read).expect("merge");
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(out.rows as u64, records);
        println!(
            "| {name} | {records} | {mib:.1} | | {secs:.2} | {:.0} | {:.1} |",
            records as f64 / secs,
            mib / secs
        );
    }
    let start = Instant::now();
    Sidecars::build(&tables).expect("sidecars");
    let secs = start.elapsed().as_secs_f64();
    println!(
        "| sidecars only | {records} | {mib:.1} | | {secs:.2} | {:.0} | {:.1} |",
        records as f64 / secs,
        mib / secs
    );
    {
        use mira_core::sidecar::{AttrIndex, IdFilter, RowRanges, ZoneMap};
        let root = tables.get(mira_core::convert::root_table(Signal::Logs)).expect("root");
        let timed = |name: &str, f: &dyn Fn()| {
            let start = Instant::now();
            f();
            let secs = start.elapsed().as_secs_f64();
            println!(
                "| sidecar: {name} | {records} | {mib:.1} | | {secs:.2} | {:.0} | {:.1} |",
                records as f64 / secs,
                mib / secs
            );
        };
        timed("zone_map", &|| drop(ZoneMap::build(root, Signal::Logs).expect("zone")));
        timed("attr_index", &|| drop(AttrIndex::build(&tables).expect("attrs")));
        timed("id_bloom", &|| drop(IdFilter::build(&tables).expect("ids")));
        timed("row_ranges", &|| drop(RowRanges::build(&tables).expect("ranges")));
    }
    let start = Instant::now();
    for &name in mira_core::convert::table_names(Signal::Logs) {
        let batch = cold_layout(name, tables.get(name).expect("table")).expect("cold layout");
        encode_parquet(&batch).expect("encode");
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "| cold encoding only | {records} | {mib:.1} | | {secs:.2} | {:.0} | {:.1} |",
        records as f64 / secs,
        mib / secs
    );
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument filters sections.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    if filter.as_deref().is_some_and(|f| "merge".contains(f)) {
        merge_section();
        return;
    }
    let records: usize = std::env::var("MIRA_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    println!("records per log corpus: {records}; spans and points: {}\n", records / 4);

    println!("## Bytes on disk per OTLP wire byte (protobuf, uncompressed)\n");
    println!("| corpus | signal | records | wire MiB | blocks | hot B/B | cold B/B |");
    println!("|---|---|---|---|---|---|---|");
    let mut log_corpora = Vec::new();
    for card in [Cardinality::Low, Cardinality::High] {
        for signal in Signal::ALL {
            let n = if signal == Signal::Logs { records } else { records / 4 };
            let sealed = build(signal, card, n);
            let hot: Vec<Bytes> = sealed
                .blocks
                .iter()
                .map(|t| write_hot(t, BlockId::new(), TenantId::default_tenant()).expect("hot"))
                .collect();
            let cold: Vec<Bytes> = hot
                .iter()
                .map(|b| {
                    rewrite_cold(&Block::from_bytes(b.clone(), cache()).expect("open"), BlockId::new()).expect("cold")
                })
                .collect();
            let hot_bytes: usize = hot.iter().map(Bytes::len).sum();
            let cold_bytes: usize = cold.iter().map(Bytes::len).sum();
            println!(
                "| {card:?} | {signal} | {n} | {:.1} | {} | {:.3} | {:.3} |",
                sealed.wire as f64 / (1 << 20) as f64,
                hot.len(),
                hot_bytes as f64 / sealed.wire as f64,
                cold_bytes as f64 / sealed.wire as f64
            );
            if signal == Signal::Logs {
                log_corpora.push((card, sealed, hot));
            }
        }
    }

    println!("\n## Where the bytes go: first log block of each corpus, bytes per record by section\n");
    println!("| corpus | section | hot B/rec | cold B/rec |");
    println!("|---|---|---|---|");
    for (card, _, hot) in &log_corpora {
        let h = Block::from_bytes(hot[0].clone(), cache()).expect("open");
        let c = Block::from_bytes(rewrite_cold(&h, BlockId::new()).expect("cold"), cache()).expect("open");
        let rows = h.meta().rows as f64;
        for e in &h.manifest().sections {
            let cold_len = c.manifest().section(&e.name).map_or(0, |(_, ce)| ce.length);
            println!(
                "| {card:?} | {} | {:.2} | {:.2} |",
                e.name,
                e.length as f64 / rows,
                cold_len as f64 / rows
            );
        }
    }

    println!("\n## Cold log columns: compressed bytes per record, first block of each corpus\n");
    println!("| corpus | table.column | B/rec |");
    println!("|---|---|---|");
    for (card, _, hot) in &log_corpora {
        let h = Block::from_bytes(hot[0].clone(), cache()).expect("open");
        let c = Block::from_bytes(rewrite_cold(&h, BlockId::new()).expect("cold"), cache()).expect("open");
        let rows = h.meta().rows as f64;
        for table in ["logs", "log_attrs"] {
            let bytes = c.section_bytes(table).expect("section");
            let meta = parquet::file::reader::SerializedFileReader::new(bytes).expect("parquet");
            let meta = parquet::file::reader::FileReader::metadata(&meta);
            let mut per_col: Vec<(String, i64)> = Vec::new();
            for rg in meta.row_groups() {
                for (i, cc) in rg.columns().iter().enumerate() {
                    if per_col.len() <= i {
                        per_col.push((cc.column_path().string(), 0));
                    }
                    per_col[i].1 += cc.compressed_size();
                }
            }
            for (name, size) in per_col {
                println!("| {card:?} | {table}.{name} | {:.2} |", size as f64 / rows);
            }
        }
    }

    println!("\n## Log tables only: attribute layout × codec (B/B), scan cost vs plain IPC\n");
    println!("| corpus | layout | codec | B/B | scan s | scan ratio vs ipc/union |");
    println!("|---|---|---|---|---|---|");
    for (card, sealed, _) in &log_corpora {
        let mut base = None;
        for (layout, typed) in [("union", false), ("typed columns", true)] {
            for codec in [Codec::Ipc, Codec::IpcZstd, Codec::Parquet] {
                if codec == Codec::Parquet && !typed {
                    continue; // Parquet has no union type.
                }
                let blocks: Vec<Bytes> = sealed.blocks.iter().map(|t| variant(t, codec, typed)).collect();
                let size: usize = blocks.iter().map(Bytes::len).sum();
                let secs = scan_secs(&blocks);
                let base = *base.get_or_insert(secs);
                println!(
                    "| {card:?} | {layout} | {codec} | {:.3} | {secs:.3} | {:.2} |",
                    size as f64 / sealed.wire as f64,
                    secs / base
                );
            }
        }
    }

    println!("\n## Cold rewrite speed (one core)\n");
    println!("| corpus | hot MiB | seconds | MiB/s of hot block |");
    println!("|---|---|---|---|");
    for (card, _, hot) in &log_corpora {
        let mib = hot.iter().map(Bytes::len).sum::<usize>() as f64 / (1 << 20) as f64;
        let start = Instant::now();
        for b in hot {
            rewrite_cold(&Block::from_bytes(b.clone(), cache()).expect("open"), BlockId::new()).expect("cold");
        }
        let secs = start.elapsed().as_secs_f64();
        println!("| {card:?} | {mib:.1} | {secs:.3} | {:.0} |", mib / secs);
    }

    merge_section();
}
