//! Scan layouts (docs/perf.md): the same log records as many sealed
//! blocks, as one merged hot block (arrival order, and clustered by
//! resource), and as one cold block, scanned the way the querier scans
//! them (one pool task per block, each block's row ranges in parallel on
//! the same pool, pruned by the `row_ranges` sidecar), for the queries of
//! `scripts/measure/layouts.py`, which runs ClickHouse (chdb) on the same
//! records and prints the ratios.
//!
//! Usage: `layouts <out-dir> [records] [threads]`. Writes
//! `<out-dir>/logs.jsonl` (the records in the OpenTelemetry Collector
//! ClickHouse exporter's shape) and prints one `RESULT` line per
//! (layout, mode, query) and one `BYTES` line per layout. Modes: `ranges`,
//! the querier's range scan with its decoded cache warm; `first`, the same
//! with an empty cache (a block's first query decodes what it reads);
//! `whole`, one task per block, cache warm.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use mira_core::block::{Block, VerifyCache};
use mira_core::cluster::cluster_by_resource;
use mira_core::cold::rewrite_cold;
use mira_core::compact::merge_tables;
use mira_core::convert::{LogsBuilder, SignalBuilder, TableSet};
use mira_core::decoded::{DecodedCache, decoded_weight};
use mira_core::scan::{
    AttrMatcher, AttrScope, LineFilter, MatchOp, Order, Predicate, ScanInput, ScanOutput, ScanRequest, probe,
    tables_needed,
};
use mira_core::sidecar::Sidecars;
use mira_core::tables::{read_sidecars, write_hot};
use mira_core::{BlockId, Signal, TenantId};
use mira_testkit::corpus::{Cardinality, Corpus};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use rayon::prelude::*;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const PER_EXPORT: usize = 1000;
/// The querier's default `--decoded-cache-size`.
const DECODED_CACHE_BYTES: u64 = 1 << 30;
/// Records given the rare attribute value.
const RARE: usize = 26;

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        _ => String::new(),
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn map(kvs: &[KeyValue]) -> String {
    let body: Vec<String> = kvs
        .iter()
        .map(|kv| format!("{}:{}", json_str(&kv.key), json_str(&text(&kv.value))))
        .collect();
    format!("{{{}}}", body.join(","))
}

/// The corpus exports, with `http.method` set to "PATCH" on [`RARE`]
/// records spread over them; each export's rows written for ClickHouse.
fn corpus(records: usize, out: &mut impl Write) -> Res<Vec<ExportLogsServiceRequest>> {
    let mut c = Corpus::new(42, Cardinality::Low);
    let mut exports = Vec::new();
    let mut n = 0usize;
    let every = records / RARE;
    while n < records {
        let mut req = c.logs(PER_EXPORT.min(records - n));
        for rl in &mut req.resource_logs {
            let resource = rl.resource.as_ref().map(|r| r.attributes.clone()).unwrap_or_default();
            let service = resource
                .iter()
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(&kv.value))
                .unwrap_or_default();
            for sl in &mut rl.scope_logs {
                for r in &mut sl.log_records {
                    if n % every == every / 2 {
                        for kv in &mut r.attributes {
                            if kv.key == "http.method" {
                                kv.value = Some(AnyValue {
                                    value: Some(Value::StringValue("PATCH".into())),
                                });
                            }
                        }
                    }
                    n += 1;
                    let time = if r.time_unix_nano != 0 {
                        r.time_unix_nano
                    } else {
                        r.observed_time_unix_nano
                    };
                    writeln!(
                        out,
                        "{{\"Timestamp\":{time},\"TraceId\":{},\"SpanId\":{},\"SeverityNumber\":{},\"ServiceName\":{},\"Body\":{},\"ResourceAttributes\":{},\"LogAttributes\":{}}}",
                        json_str(&hex(&r.trace_id)),
                        json_str(&hex(&r.span_id)),
                        r.severity_number,
                        json_str(&service),
                        json_str(&text(&r.body)),
                        map(&resource),
                        map(&r.attributes),
                    )?;
                }
            }
        }
        exports.push(req);
    }
    Ok(exports)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn open(bytes: bytes::Bytes) -> Res<Block> {
    Ok(Block::from_bytes(bytes, Arc::new(VerifyCache::new(4096)))?)
}

fn hot(tables: &TableSet) -> Res<Block> {
    open(write_hot(tables, BlockId::new(), TenantId::default_tenant())?)
}

/// `exports` appended into blocks of `per_block` exports each.
fn sealed(exports: &[ExportLogsServiceRequest], per_block: usize) -> Res<Vec<Block>> {
    exports
        .chunks(per_block)
        .map(|chunk| {
            let mut b = LogsBuilder::default();
            for e in chunk {
                b.append(e)?;
            }
            hot(&b.finish()?)
        })
        .collect()
}

struct Layout {
    name: String,
    blocks: Vec<(Block, Sidecars)>,
}

impl Layout {
    fn new(name: &str, blocks: Vec<Block>) -> Res<Layout> {
        let blocks = blocks
            .into_iter()
            .map(|b| {
                let s = read_sidecars(&b)?;
                Ok((b, s))
            })
            .collect::<Res<Vec<_>>>()?;
        let bytes: u64 = blocks
            .iter()
            .flat_map(|(b, _)| b.manifest().sections.iter().map(|e| e.length))
            .sum();
        let root: u64 = blocks
            .iter()
            .filter_map(|(b, _)| b.manifest().section("logs").map(|(_, e)| e.length))
            .sum();
        let ranges: u64 = blocks
            .iter()
            .filter_map(|(b, _)| b.manifest().section("row_ranges").map(|(_, e)| e.length))
            .sum();
        println!(
            "BYTES {name} blocks={} sections={bytes} logs_section={root} row_ranges={ranges}",
            blocks.len()
        );
        Ok(Layout {
            name: name.to_owned(),
            blocks,
        })
    }
}

/// The tables `names` of `block`, from `cache` or decoded (and kept), as
/// the querier's scan reads them.
fn tables(block: &Block, names: &[&'static str], cache: &DecodedCache) -> Result<TableSet, String> {
    let meta = block.meta();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let table = cache.get_or_decode(meta.block_id, name, || {
            let (_, entry) = block.manifest().section(name).ok_or(format!("no section {name}"))?;
            let t0 = Instant::now();
            let batches = block.read_batches(name).map_err(|e| e.to_string())?;
            let t1 = Instant::now();
            let table = mira_core::tables::table_from_batches(name, batches).map_err(|e| e.to_string())?;
            if std::env::var_os("LAYOUTS_TRACE").is_some() {
                eprintln!(
                    "TRACE {:?} {name} decode {:.1} ms join {:.1} ms",
                    entry.codec,
                    (t1 - t0).as_secs_f64() * 1e3,
                    t1.elapsed().as_secs_f64() * 1e3
                );
            }
            let weight = decoded_weight(entry, &table);
            Ok::<_, String>((table, weight))
        })?;
        out.push((*name, table));
    }
    Ok(TableSet::from_tables(meta.signal, out, meta.min_time, meta.max_time))
}

/// One query over a layout as the querier runs it: blocks pruned by their
/// sidecars, then per block the needed tables taken from the decoded
/// cache or decoded, and its ranges scanned in parallel (`morsels`), or
/// the whole block as one task.
fn run(layout: &Layout, req: &ScanRequest, morsels: bool, cache: &DecodedCache) -> Res<(usize, usize)> {
    let pr = probe(&req.predicate);
    let outs: Vec<Option<ScanOutput>> = layout
        .blocks
        .par_iter()
        .map(|(block, sidecars)| -> Result<Option<ScanOutput>, String> {
            let meta = block.meta();
            if sidecars.may_match(&pr, meta.min_time, meta.max_time).is_pruned() {
                return Ok(None);
            }
            let tables = tables(block, &tables_needed(Signal::Logs, &req.predicate), cache)?;
            let input = ScanInput::load(&tables, &req.predicate).map_err(|e| e.to_string())?;
            let prepared = input.prepare(req).map_err(|e| e.to_string())?;
            let ranges = if morsels {
                prepared.morsels(sidecars.ranges.as_ref())
            } else {
                std::iter::once(0..prepared.rows()).collect()
            };
            let parts = ranges
                .into_par_iter()
                .map(|r| prepared.scan_rows(r))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            prepared.merge(parts).map(Some).map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let scanned = outs.iter().flatten().map(|o| o.rows_scanned).sum();
    let mut times: Vec<u64> = outs.iter().flatten().flat_map(|o| o.times.iter().copied()).collect();
    times.sort_unstable_by(|a, b| b.cmp(a));
    times.truncate(req.limit.unwrap_or(usize::MAX));
    Ok((times.len(), scanned))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median of 7 runs after one warm-up. `first`: every run with an empty
/// decoded cache (a block's first query); else with the cache the warm-up
/// filled (later queries), as the querier keeps decoded tables.
fn measure(
    pool: &rayon::ThreadPool,
    layout: &Layout,
    query: &str,
    req: &ScanRequest,
    morsels: bool,
    first: bool,
) -> Res<()> {
    let cache = DecodedCache::new(DECODED_CACHE_BYTES);
    pool.install(|| run(layout, req, morsels, &cache))?;
    let mut ms = Vec::new();
    let mut last = (0, 0);
    for _ in 0..7 {
        let fresh;
        let cache = if first {
            fresh = DecodedCache::new(DECODED_CACHE_BYTES);
            &fresh
        } else {
            &cache
        };
        let t = Instant::now();
        last = pool.install(|| run(layout, req, morsels, cache))?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let mode = match (morsels, first) {
        (true, false) => "ranges",
        (true, true) => "first",
        (false, _) => "whole",
    };
    println!(
        "RESULT {} {mode} {query} {:.2} hits={} rows_scanned={}",
        layout.name,
        median(ms),
        last.0,
        last.1
    );
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).ok_or("usage: layouts <out-dir> [records] [threads]")?);
    let records: usize = args.get(2).map_or(Ok(2_000_000), |s| s.parse())?;
    let threads: usize = args.get(3).map_or(Ok(2), |s| s.parse())?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
    let mut jsonl = std::io::BufWriter::new(std::fs::File::create(dir.join("logs.jsonl"))?);
    let t = Instant::now();
    let exports = corpus(records, &mut jsonl)?;
    jsonl.flush()?;
    drop(jsonl);
    eprintln!("corpus of {records} records in {:.1} s", t.elapsed().as_secs_f64());

    let eq = |scope, key: &str, v: &str| AttrMatcher {
        scope,
        key: key.into(),
        op: MatchOp::Eq(v.into()),
    };
    let req = |predicate| ScanRequest {
        predicate,
        order: Order::NewestFirst,
        limit: Some(100),
    };
    let nothing = LineFilter::Contains("no-such-token".into());
    let queries = [
        (
            "service+body",
            req(Predicate {
                attrs: vec![eq(AttrScope::Resource, "service.name", "frontend")],
                lines: vec![nothing.clone()],
                ..Default::default()
            }),
        ),
        (
            "rare-attr",
            req(Predicate {
                attrs: vec![eq(AttrScope::Record, "http.method", "PATCH")],
                ..Default::default()
            }),
        ),
        (
            "body-nothing",
            req(Predicate {
                lines: vec![nothing.clone()],
                ..Default::default()
            }),
        ),
    ];

    // Ten sealed blocks, as the ingester seals them.
    let ten = sealed(&exports, exports.len().div_ceil(10))?;
    let t = Instant::now();
    let merged_tables = merge_tables(&ten)?;
    eprintln!("merge in {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let (clustered_tables, _) = cluster_by_resource(&merged_tables)?;
    eprintln!("cluster in {:.1} s", t.elapsed().as_secs_f64());
    let merged = hot(&merged_tables)?;
    let clustered = hot(&clustered_tables)?;
    drop((merged_tables, clustered_tables));
    let t = Instant::now();
    let cold = open(rewrite_cold(&merged, BlockId::new())?)?;
    eprintln!("cold rewrite in {:.1} s", t.elapsed().as_secs_f64());
    let cold_clustered = open(rewrite_cold(&clustered, BlockId::new())?)?;
    // The cold root table's bytes by row group size, and the OTLP wire
    // bytes, for bytes per wire byte.
    let wire: usize = exports.iter().map(prost::Message::encoded_len).sum();
    for (name, block) in [("arrival", &merged), ("clustered", &clustered)] {
        let root = mira_core::cold::cold_layout("logs", &mira_core::tables::read_table(block, "logs")?)?;
        let sizes: Vec<String> = [64 << 10, 128 << 10, 1 << 20]
            .iter()
            .map(|&g| {
                let n = mira_core::cold::encode_parquet_grouped(&root, g)
                    .map(|b| b.len())
                    .unwrap_or(0);
                format!("{}k={n}", g >> 10)
            })
            .collect();
        println!("COLD_ROOT {name} wire={wire} {}", sizes.join(" "));
    }
    let layouts = [
        Layout::new("10-sealed", ten)?,
        Layout::new("1-hot-merged", vec![merged])?,
        Layout::new("1-hot-clustered", vec![clustered])?,
        Layout::new("1-cold-merged", vec![cold])?,
        Layout::new("1-cold-clustered", vec![cold_clustered])?,
    ];
    for layout in &layouts {
        for (name, q) in &queries {
            measure(&pool, layout, name, q, true, false)?;
            measure(&pool, layout, name, q, true, true)?;
        }
        measure(&pool, layout, "body-nothing", &queries[2].1, false, false)?;
    }
    drop(layouts);

    // A full scan over 1,000 blocks of 1,000 records against the same
    // records merged.
    let first: Vec<_> = exports.into_iter().take(1000).collect();
    let small = sealed(&first, 1)?;
    let merged = hot(&merge_tables(&small)?)?;
    let small = Layout::new("1000x1000", small)?;
    let merged = Layout::new("1000x1000-merged", vec![merged])?;
    for layout in [&small, &merged] {
        measure(&pool, layout, "body-nothing-1M", &queries[2].1, true, false)?;
        measure(&pool, layout, "body-nothing-1M", &queries[2].1, true, true)?;
    }
    measure(&pool, &merged, "body-nothing-1M", &queries[2].1, false, false)?;
    Ok(())
}
