//! Data for `scripts/measure/offload-cycle.sh` (docs/perf.md, "Retention
//! and offload"): catalog blocks made directly, without ingesting them.
//!
//! - `blocks`: real cold log blocks (testkit corpus → `LogsBuilder` →
//!   `write_cold`, each with its own id and records) written as files into
//!   a `file://` primary store at their `block_path` keys and published to
//!   the catalog, up to `--bytes`, about `--block-bytes` each, four blocks
//!   per UTC hour going back from `--days-back` days ago (fewer than the
//!   planner's 8 small cold blocks, so no compaction is due).
//! - `rows`: catalog rows only, no objects (retention drops and `offload
//!   list` read nothing else): `--blocks` cold blocks of `--bytes` each
//!   (what the row claims), one per (tenant, signal, hour) over
//!   `--tenants` tenants `{--tenant-prefix}{i}`, going back from
//!   `--days-back` days ago; with `--offloaded-to URL` each is also marked
//!   offloaded to `URL/{object key}` (a placeholder SHA-256: these copies
//!   are listed, never restored).
//!
//! Prints one JSON line: blocks, bytes, seconds, first and last hour.
//!
//! ```sh
//! offload_cycle blocks --catalog 127.0.0.1:7400 --store /data/objects --tenant cycle --bytes 3200MiB
//! offload_cycle rows --catalog 127.0.0.1:7400 --blocks 100000 --tenants 10 --days-back 30
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientConfig};
use mira_common::config::{ByteSize, Duration};
use mira_core::block::Level;
use mira_core::block::path::block_path;
use mira_core::cold::write_cold;
use mira_core::convert::{LogsBuilder, SignalBuilder};
use mira_core::ids::{BlockId, Signal, TenantId};
use mira_core::tables::block_meta;
use mira_testkit::corpus::{Cardinality, Corpus};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const H: i64 = 3_600_000_000_000;
const MIN: i64 = 60_000_000_000;
/// Blocks per hour partition in `blocks` mode.
const PER_HOUR: usize = 4;
/// Rows per publish or mark command.
const BATCH: usize = 1000;

/// `--name value` pairs after the mode.
struct Flags(HashMap<String, String>);

impl Flags {
    fn parse(args: &[String]) -> Result<Flags> {
        let mut m = HashMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let name = k
                .strip_prefix("--")
                .ok_or_else(|| format!("expected --flag, got {k:?}"))?;
            let v = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
            m.insert(name.to_owned(), v.clone());
        }
        Ok(Flags(m))
    }

    fn get<T: std::str::FromStr>(&self, name: &str, default: Option<&str>) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        let v = self
            .0
            .get(name)
            .map(String::as_str)
            .or(default)
            .ok_or_else(|| format!("--{name} is required"))?;
        v.parse().map_err(|e| format!("--{name} {v:?}: {e}").into())
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The hour partition `days_back` days ago.
fn first_hour(days_back: Duration) -> i64 {
    let back = i64::try_from(days_back.get().as_nanos()).unwrap_or(i64::MAX);
    (now_ns() - back).div_euclid(H) * H
}

fn pb_signal(s: Signal) -> i32 {
    match s {
        Signal::Logs => pb::Signal::Logs as i32,
        Signal::Traces => pb::Signal::Traces as i32,
        Signal::Metrics => pb::Signal::Metrics as i32,
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(mode) = args.first() else {
        return Err("usage: offload_cycle blocks|rows --flag value ... (see the example's doc)".into());
    };
    let flags = Flags::parse(&args[1..])?;
    let catalog_addr: String = flags.get("catalog", Some("127.0.0.1:7400"))?;
    let catalog = Arc::new(CatalogClient::new(vec![catalog_addr], ClientConfig::default()));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let started = Instant::now();
    let (blocks, bytes, hours) = match mode.as_str() {
        "blocks" => blocks(&flags, &catalog, &rt)?,
        "rows" => rt.block_on(rows(&flags, &catalog))?,
        other => return Err(format!("unknown mode {other:?}: blocks or rows").into()),
    };
    println!(
        "{{\"mode\":\"{mode}\",\"blocks\":{blocks},\"bytes\":{bytes},\"seconds\":{:.3},\"first_hour_ns\":{},\"last_hour_ns\":{}}}",
        started.elapsed().as_secs_f64(),
        hours.0,
        hours.1
    );
    Ok(())
}

/// One cold block built and written by a worker, to publish.
struct Made {
    row: pb::Block,
}

/// Real cold blocks, built on `--threads` workers and published in batches.
fn blocks(
    flags: &Flags,
    catalog: &Arc<CatalogClient>,
    rt: &tokio::runtime::Runtime,
) -> Result<(usize, u64, (i64, i64))> {
    let store: PathBuf = flags.get("store", None)?;
    let tenant = TenantId::new(&flags.get::<String>("tenant", Some("cycle"))?).map_err(|e| e.to_string())?;
    let target: u64 = flags.get::<ByteSize>("bytes", None)?.bytes();
    let block_bytes: u64 = flags.get::<ByteSize>("block-bytes", Some("24MiB"))?.bytes();
    let first = first_hour(flags.get("days-back", Some("3d"))?);
    let threads: usize = flags.get("threads", Some("2"))?;
    let high = flags.get::<String>("cardinality", Some("low"))? == "high";
    let card = if high { Cardinality::High } else { Cardinality::Low };

    let next = AtomicUsize::new(0);
    let written = AtomicU64::new(0);
    let (tx, rx) = mpsc::sync_channel::<Result<Made>>(2 * threads.max(1));
    let mut published = 0usize;
    let mut hours = (i64::MAX, i64::MIN);
    std::thread::scope(|scope| -> Result<()> {
        for _ in 0..threads.max(1) {
            let tx = tx.clone();
            let (next, written, tenant, store) = (&next, &written, tenant.clone(), store.clone());
            scope.spawn(move || {
                // Records per block, corrected after each block to hit block_bytes.
                let mut records = (block_bytes / 28).max(1000) as usize;
                while written.load(Ordering::Acquire) < target {
                    let i = next.fetch_add(1, Ordering::AcqRel);
                    let hour = first - (i / PER_HOUR) as i64 * H;
                    let start = hour + MIN + (i % PER_HOUR) as i64 * 14 * MIN;
                    let made = make_block(i as u64, card, start, records, &tenant, &store);
                    if let Ok((_, actual)) = &made {
                        written.fetch_add(*actual, Ordering::AcqRel);
                        let scale = block_bytes as f64 / (*actual).max(1) as f64;
                        records = ((records as f64 * scale) as usize).max(1000);
                    }
                    let stop = made.is_err();
                    if tx.send(made.map(|(row, _)| Made { row })).is_err() || stop {
                        return;
                    }
                }
            });
        }
        drop(tx);
        let mut batch = Vec::new();
        for made in rx {
            let row = made?.row;
            hours = (hours.0.min(row.min_time_ns), hours.1.max(row.min_time_ns));
            batch.push(row);
            if batch.len() >= 16 {
                published += batch.len();
                rt.block_on(catalog.publish(std::mem::take(&mut batch), None))?;
            }
        }
        published += batch.len();
        if !batch.is_empty() {
            rt.block_on(catalog.publish(batch, None))?;
        }
        Ok(())
    })?;
    Ok((
        published,
        written.load(Ordering::Acquire),
        (hours.0.div_euclid(H) * H, hours.1.div_euclid(H) * H),
    ))
}

/// Builds block `seed` of `records` corpus records from `start_ns`, writes
/// it under `store` and returns its catalog row and size.
fn make_block(
    seed: u64,
    card: Cardinality,
    start_ns: i64,
    records: usize,
    tenant: &TenantId,
    store: &std::path::Path,
) -> Result<(pb::Block, u64)> {
    let mut corpus = Corpus::starting_at(seed, card, u64::try_from(start_ns)?);
    let mut b = LogsBuilder::default();
    let mut done = 0;
    while done < records {
        done += b.append(&corpus.logs((records - done).min(8192)))?;
    }
    let tables = b.finish()?;
    let id = BlockId::new();
    let meta = block_meta(&tables, id, tenant.clone(), Level::Cold);
    let bytes = write_cold(&tables, id, tenant.clone(), &[])?;
    let key = block_path(tenant, Signal::Logs, meta.min_time, id);
    let path = store.join(key.as_ref());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, &bytes)?;
    let hour_end = (start_ns.div_euclid(H) + 1) * H;
    let row = pb::Block {
        id: id.to_string(),
        tenant: tenant.as_str().to_owned(),
        signal: pb_signal(Signal::Logs),
        min_time_ns: i64::try_from(meta.min_time)?,
        max_time_ns: i64::try_from(meta.max_time)?,
        rows: meta.rows,
        bytes: bytes.len() as u64,
        level: pb::Level::Cold as i32,
        object_key: key.to_string(),
        // As if the cold rewrite ran two hours after the hour.
        created_at_ns: hour_end + 2 * H,
        ..Default::default()
    };
    Ok((row, bytes.len() as u64))
}

/// Catalog rows only: one cold block per (tenant, signal, hour).
async fn rows(flags: &Flags, catalog: &Arc<CatalogClient>) -> Result<(usize, u64, (i64, i64))> {
    let n: usize = flags.get("blocks", None)?;
    let tenants: usize = flags.get::<usize>("tenants", Some("10"))?.max(1);
    let prefix: String = flags.get("tenant-prefix", Some("t"))?;
    let claimed: u64 = flags.get::<ByteSize>("bytes", Some("48MiB"))?.bytes();
    let first = first_hour(flags.get("days-back", Some("30d"))?);
    let offloaded_to: Option<String> = flags
        .get::<String>("offloaded-to", Some(""))
        .ok()
        .filter(|s| !s.is_empty());
    let signals = [Signal::Logs, Signal::Traces, Signal::Metrics];
    let tenant_ids: Vec<TenantId> = (0..tenants)
        .map(|t| TenantId::new(&format!("{prefix}{t}")))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut hours = (i64::MAX, i64::MIN);
    for chunk_start in (0..n).step_by(BATCH) {
        let mut rows = Vec::with_capacity(BATCH);
        for i in chunk_start..(chunk_start + BATCH).min(n) {
            let tenant = &tenant_ids[i % tenants];
            let signal = signals[(i / tenants) % signals.len()];
            let hour = first - (i / (tenants * signals.len())) as i64 * H;
            hours = (hours.0.min(hour), hours.1.max(hour));
            let id = BlockId::new();
            let key = block_path(tenant, signal, u64::try_from(hour + MIN)?, id);
            rows.push(pb::Block {
                id: id.to_string(),
                tenant: tenant.as_str().to_owned(),
                signal: pb_signal(signal),
                min_time_ns: hour + MIN,
                max_time_ns: hour + 59 * MIN,
                rows: 1_000_000,
                bytes: claimed,
                level: pb::Level::Cold as i32,
                object_key: key.to_string(),
                created_at_ns: hour + 3 * H,
                ..Default::default()
            });
        }
        let items: Vec<pb::OffloadItem> = match &offloaded_to {
            Some(url) => rows
                .iter()
                .map(|r| pb::OffloadItem {
                    id: r.id.clone(),
                    location: format!("{}/{}", url.trim_end_matches('/'), r.object_key),
                    sha256: "0".repeat(64),
                    at_ns: now_ns(),
                })
                .collect(),
            None => Vec::new(),
        };
        catalog.publish(rows, None).await?;
        if !items.is_empty() {
            catalog.mark_offloaded_v2(items).await?;
        }
    }
    Ok((n, claimed * n as u64, hours))
}
