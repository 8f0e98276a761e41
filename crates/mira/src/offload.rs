//! `mira offload list` and `mira offload restore` (compactor-design.md
//! §9.4; docs/operations.md, "Restoring offloaded blocks").
//!
//! `list` is a catalog read: the offloaded blocks by partition (or one by
//! one with `--blocks`), as a table or JSON. `restore` runs
//! [`mira_compactor::restore`] with its progress on stderr (or NDJSON on
//! stdout) and exits 0 when everything selected is live, 1 when some block
//! failed (re-run to resume), 2 on a usage error and 130 when interrupted
//! (Ctrl-C: copies in flight finish, leases are released, the summary is
//! printed).

use std::io::{BufWriter, IsTerminal, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use mira_catalog::proto as pb;
use mira_common::config::{ByteSize, Duration, TimeArg};
use mira_compactor::progress::{self, Mode, Progress};
use mira_compactor::restore::{self, Event, Options, Restorer, Selection};
use mira_compactor::targets::Targets;
use mira_core::ids::{BlockId, Signal, TenantId};
use serde::Serialize;

use crate::flags::{ClusterFlags, DataDirFlag, StoreFlags, StoreSettings, catalog_client};

/// Exit codes of `mira offload restore`.
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_INTERRUPTED: i32 = 130;

/// Flags of `mira offload`.
#[derive(Debug, Args)]
pub struct OffloadArgs {
    #[command(subcommand)]
    pub command: OffloadCommand,
}

#[derive(Debug, Subcommand)]
pub enum OffloadCommand {
    /// List offloaded blocks by partition (a catalog read).
    List(ListArgs),
    /// Copy offloaded blocks back to the primary store, verified against their SHA-256, and make them live again, pinned.
    Restore(Box<RestoreArgs>),
}

/// What both commands select by, besides the tenant.
#[derive(Debug, Args)]
pub struct Filters {
    /// Only this signal: logs, traces or metrics (repeatable, or comma separated) [default: all].
    #[arg(long = "signal", value_name = "SIGNAL", value_delimiter = ',')]
    pub signals: Vec<Signal>,
    /// Blocks overlapping the range from this time: RFC 3339 (2026-11-01T00:00:00Z, 2026-11-01) or before now (-7d, -36h).
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub from: Option<TimeArg>,
    /// ...to this time (inclusive), written like --from [default: no end].
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub to: Option<TimeArg>,
}

/// `table` or `json` (`list`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ListOutput {
    Table,
    Json,
}

/// `text` or `json` (`restore`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RestoreOutput {
    Text,
    Json,
}

/// Flags of `mira offload list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Catalog members, comma separated host:port.
    #[arg(long, env = "MIRA_CATALOG", default_value = "127.0.0.1:7400")]
    pub catalog: String,
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// Only this tenant [default: every tenant].
    #[arg(long, value_parser = parse_tenant, conflicts_with = "all_tenants")]
    pub tenant: Option<TenantId>,
    /// Every tenant (the default).
    #[arg(long)]
    pub all_tenants: bool,
    #[command(flatten)]
    pub filters: Filters,
    /// One line per block (id, rows, bytes, SHA-256, location, whether the primary copy is freed) instead of one per partition.
    #[arg(long)]
    pub blocks: bool,
    /// `table` (with a totals line) or `json` (an array of objects with the same fields).
    #[arg(long, value_enum, default_value = "table")]
    pub output: ListOutput,
}

/// Flags of `mira offload restore`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("tenants").required(true).args(["tenant", "all_tenants"])))]
pub struct RestoreArgs {
    /// Catalog members, comma separated host:port.
    #[arg(long, env = "MIRA_CATALOG", default_value = "127.0.0.1:7400")]
    pub catalog: String,
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// The primary object store the blocks are restored to: the ingesters' and compactors' --object-store.
    #[arg(long, env = "MIRA_OBJECT_STORE", required_unless_present = "dry_run")]
    pub object_store: Option<String>,
    /// Object store option key=value (object_store's config keys, e.g. aws_endpoint=http://127.0.0.1:5000); repeatable.
    #[arg(
        long = "object-store-option",
        env = "MIRA_OBJECT_STORE_OPTIONS",
        value_delimiter = ','
    )]
    pub object_store_options: Vec<String>,
    /// Offload target NAME=URL the copies are read through (longest URL prefix of a block's location); a location under none is read with the environment's credentials. Repeatable.
    #[arg(long = "offload-target", env = "MIRA_OFFLOAD_TARGETS", value_delimiter = ',')]
    pub offload_targets: Vec<String>,
    /// object_store option key=value for the offload targets; repeatable.
    #[arg(
        long = "offload-target-option",
        env = "MIRA_OFFLOAD_TARGET_OPTIONS",
        value_delimiter = ','
    )]
    pub offload_target_options: Vec<String>,
    /// Restore this tenant's blocks.
    #[arg(long, value_parser = parse_tenant)]
    pub tenant: Option<TenantId>,
    /// Restore every tenant's blocks.
    #[arg(long)]
    pub all_tenants: bool,
    #[command(flatten)]
    pub filters: Filters,
    /// Only this block (a ULID; repeatable). A block already live is reported "already live"; one the catalog does not list is a failure.
    #[arg(long = "block", value_name = "ID", value_delimiter = ',')]
    pub blocks: Vec<BlockId>,
    /// Restored blocks are pinned this long: not offloaded or dropped by retention again before.
    #[arg(long, default_value = "7d")]
    pub keep_for: Duration,
    /// Partitions restored at once.
    #[arg(long, default_value = "8", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub concurrency: u16,
    /// Most bytes per second copied, across partitions (200MiB, 1GiB/s; 0: no limit).
    #[arg(long, default_value = "200MiB", value_parser = parse_rate)]
    pub rate: ByteSize,
    /// How long to wait for a partition lease a compactor holds before giving up on that partition (counted failed; re-run to resume).
    #[arg(long, default_value = "5m")]
    pub lease_wait: Duration,
    /// Time to live of the partition leases the restore takes (renewed between blocks once a third has passed); a killed restore's leases hold its partitions this long. At least 3s.
    #[arg(long, default_value = "60s", value_parser = parse_lease_ttl)]
    pub partition_lease_ttl: Duration,
    /// Print the plan (blocks, bytes, estimated time at --rate) and exit; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation (asked only when stdin is a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// `text`: the plan and the summary on stdout, progress on stderr; `json`: NDJSON events on stdout.
    #[arg(long, value_enum, default_value = "text")]
    pub output: RestoreOutput,
}

fn parse_tenant(s: &str) -> Result<TenantId, String> {
    TenantId::new(s).map_err(|e| e.to_string())
}

fn parse_lease_ttl(s: &str) -> Result<Duration, String> {
    let d: Duration = s.parse()?;
    if d.get() < std::time::Duration::from_secs(3) {
        return Err(format!("{s:?} is below the least lease time to live, 3s"));
    }
    Ok(d)
}

/// A byte rate: a size, optionally per second (`200MiB`, `1GiB/s`).
fn parse_rate(s: &str) -> Result<ByteSize, String> {
    s.trim().trim_end_matches("/s").parse()
}

/// The selection both commands make.
fn selection(tenant: Option<TenantId>, f: &Filters, blocks: Vec<BlockId>, now_ns: i64) -> Result<Selection, String> {
    let mut signals = f.signals.clone();
    signals.sort();
    signals.dedup();
    let from_ns = f.from.map(|t| t.resolve(now_ns));
    let to_ns = f.to.map(|t| t.resolve(now_ns));
    if let (Some(a), Some(b)) = (from_ns, to_ns)
        && a > b
    {
        return Err(format!(
            "--from ({}) is after --to ({})",
            progress::minute(a),
            progress::minute(b)
        ));
    }
    Ok(Selection {
        tenant,
        signals,
        from_ns,
        to_ns,
        block_ids: blocks,
    })
}

/// Prints a usage error naming the flag; the exit code.
fn usage(msg: &str) -> i32 {
    eprintln!("error: {msg}");
    EXIT_USAGE
}

/// Runs `mira offload ...`; returns the process's exit code.
pub async fn run(args: OffloadArgs) -> anyhow::Result<i32> {
    match args.command {
        OffloadCommand::List(a) => list(a).await,
        OffloadCommand::Restore(a) => restore(*a).await,
    }
}

/// One partition of `list`.
#[derive(Debug, Serialize)]
struct PartitionRow {
    tenant: String,
    signal: &'static str,
    hour: String,
    partition_start_ns: i64,
    blocks: u64,
    rows: u64,
    bytes: u64,
    /// When the latest of its blocks was offloaded.
    offloaded: String,
    offloaded_at_ns: i64,
    /// The common prefix of its copies' locations, to the last '/'.
    location: String,
    primary_freed: u64,
}

/// One block of `list --blocks`.
#[derive(Debug, Serialize)]
struct BlockRow<'a> {
    id: &'a str,
    tenant: &'a str,
    signal: &'static str,
    hour: String,
    partition_start_ns: i64,
    rows: u64,
    bytes: u64,
    sha256: &'a str,
    offloaded: String,
    offloaded_at_ns: i64,
    location: &'a str,
    primary_freed: bool,
}

/// The longest common prefix of `locations`, cut after its last '/'.
fn common_dir<'a>(mut locations: impl Iterator<Item = &'a str>) -> String {
    let Some(first) = locations.next() else {
        return String::new();
    };
    let mut len = first.len();
    for l in locations {
        len = first
            .bytes()
            .zip(l.bytes())
            .take(len)
            .take_while(|(a, b)| a == b)
            .count();
    }
    let prefix = &first[..len];
    match prefix.rfind('/') {
        Some(i) => first[..=i].to_owned(),
        None => prefix.to_owned(),
    }
}

fn partition_rows(plan: &restore::Plan) -> Vec<PartitionRow> {
    plan.partitions
        .iter()
        .map(|p| {
            let offloaded_at_ns = p.blocks.iter().map(|b| b.offloaded_at_ns).max().unwrap_or(0);
            PartitionRow {
                tenant: p.partition.tenant.clone(),
                signal: p.partition.signal,
                hour: progress::hour(p.partition.start_ns),
                partition_start_ns: p.partition.start_ns,
                blocks: p.blocks.len() as u64,
                rows: p.blocks.iter().map(|b| b.rows).sum(),
                bytes: p.blocks.iter().map(|b| b.bytes).sum(),
                offloaded: progress::minute(offloaded_at_ns),
                offloaded_at_ns,
                location: common_dir(p.blocks.iter().map(|b| b.offload_location.as_str())),
                primary_freed: p.blocks.iter().filter(|b| b.primary_freed).count() as u64,
            }
        })
        .collect()
}

fn block_rows(plan: &restore::Plan) -> Vec<BlockRow<'_>> {
    plan.partitions
        .iter()
        .flat_map(|p| {
            p.blocks.iter().map(move |b: &pb::Block| BlockRow {
                id: &b.id,
                tenant: &b.tenant,
                signal: p.partition.signal,
                hour: progress::hour(p.partition.start_ns),
                partition_start_ns: p.partition.start_ns,
                rows: b.rows,
                bytes: b.bytes,
                sha256: &b.offload_sha256,
                offloaded: progress::minute(b.offloaded_at_ns),
                offloaded_at_ns: b.offloaded_at_ns,
                location: &b.offload_location,
                primary_freed: b.primary_freed,
            })
        })
        .collect()
}

/// `rows` under `headers`, columns padded to their widest cell (numbers
/// right-aligned), two spaces apart; the last column is not padded.
fn write_table(out: &mut impl Write, headers: &[&str], right: &[bool], rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut line = String::new();
    let mut emit = |out: &mut dyn Write, cells: &mut dyn Iterator<Item = &str>| -> std::io::Result<()> {
        line.clear();
        for (i, c) in cells.enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i].saturating_sub(c.chars().count());
            if i + 1 == widths.len() {
                line.push_str(c);
            } else if right[i] {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(c);
            } else {
                line.push_str(c);
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        writeln!(out, "{line}")
    };
    emit(out, &mut headers.iter().copied())?;
    for r in rows {
        emit(out, &mut r.iter().map(String::as_str))?;
    }
    Ok(())
}

/// `N partitions, M blocks, R rows, B offloaded (primary copies freed: F)`.
fn totals_line(rows: &[PartitionRow]) -> String {
    format!(
        "{} partitions, {} blocks, {} rows, {} offloaded (primary copies freed: {})",
        progress::count(rows.len() as u64),
        progress::count(rows.iter().map(|r| r.blocks).sum()),
        progress::count(rows.iter().map(|r| r.rows).sum()),
        progress::bytes(rows.iter().map(|r| r.bytes).sum()),
        progress::count(rows.iter().map(|r| r.primary_freed).sum()),
    )
}

/// Writes `list`'s answer for `plan`.
fn render_list(out: &mut impl Write, plan: &restore::Plan, blocks: bool, output: ListOutput) -> anyhow::Result<()> {
    let parts = partition_rows(plan);
    match (output, blocks) {
        (ListOutput::Json, false) => {
            serde_json::to_writer(&mut *out, &parts)?;
            writeln!(out)?;
        }
        (ListOutput::Json, true) => {
            serde_json::to_writer(&mut *out, &block_rows(plan))?;
            writeln!(out)?;
        }
        (ListOutput::Table, false) => {
            let rows: Vec<Vec<String>> = parts
                .iter()
                .map(|r| {
                    vec![
                        r.tenant.clone(),
                        r.signal.to_owned(),
                        r.hour.clone(),
                        progress::count(r.blocks),
                        progress::count(r.rows),
                        progress::bytes(r.bytes),
                        r.offloaded.clone(),
                        r.location.clone(),
                    ]
                })
                .collect();
            write_table(
                out,
                &[
                    "TENANT",
                    "SIGNAL",
                    "HOUR",
                    "BLOCKS",
                    "ROWS",
                    "BYTES",
                    "OFFLOADED",
                    "LOCATION",
                ],
                &[false, false, false, true, true, true, false, false],
                &rows,
            )?;
            writeln!(out, "{}", totals_line(&parts))?;
        }
        (ListOutput::Table, true) => {
            let rows: Vec<Vec<String>> = block_rows(plan)
                .iter()
                .map(|b| {
                    vec![
                        b.id.to_owned(),
                        b.tenant.to_owned(),
                        b.signal.to_owned(),
                        b.hour.clone(),
                        progress::count(b.rows),
                        progress::bytes(b.bytes),
                        b.offloaded.clone(),
                        if b.primary_freed { "freed" } else { "present" }.to_owned(),
                        b.sha256.to_owned(),
                        b.location.to_owned(),
                    ]
                })
                .collect();
            write_table(
                out,
                &[
                    "ID",
                    "TENANT",
                    "SIGNAL",
                    "HOUR",
                    "ROWS",
                    "BYTES",
                    "OFFLOADED",
                    "PRIMARY",
                    "SHA256",
                    "LOCATION",
                ],
                &[false, false, false, false, true, true, false, false, false, false],
                &rows,
            )?;
            writeln!(out, "{}", totals_line(&parts))?;
        }
    }
    Ok(())
}

async fn list(args: ListArgs) -> anyhow::Result<i32> {
    let now = mira_common::clock::Clock::from_env()?.now_ns();
    let sel = match selection(args.tenant, &args.filters, Vec::new(), now) {
        Ok(s) => s,
        Err(e) => return Ok(usage(&e)),
    };
    let plan = restore::select(&catalog_client(&args.catalog, &args.cluster.dialer()?), &sel).await?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    render_list(&mut out, &plan, args.blocks, args.output)?;
    out.flush()?;
    Ok(0)
}

/// Asks on the terminal whether to go on.
async fn confirm(question: String) -> bool {
    tokio::task::spawn_blocking(move || {
        eprint!("{question} [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer).is_ok() && matches!(answer.trim(), "y" | "Y" | "yes" | "YES")
    })
    .await
    .unwrap_or(false)
}

async fn restore(args: RestoreArgs) -> anyhow::Result<i32> {
    let clock = mira_common::clock::Clock::from_env()?;
    let tenant = if args.all_tenants { None } else { args.tenant.clone() };
    let sel = match selection(tenant, &args.filters, args.blocks.clone(), clock.now_ns()) {
        Ok(s) => s,
        Err(e) => return Ok(usage(&e)),
    };
    let rate = args.rate.bytes();
    let mode = Mode::detect(args.output == RestoreOutput::Json);
    let catalog = catalog_client(&args.catalog, &args.cluster.dialer()?);
    let progress = Arc::new(Mutex::new(Progress::stdio(mode)));
    let lock = || progress.lock().unwrap_or_else(PoisonError::into_inner);

    if args.dry_run {
        let plan = restore::select(&catalog, &sel).await?;
        let info = plan.info(rate);
        lock().event(&Event::Plan(info.clone()), Instant::now());
        if mode != Mode::Json {
            println!("{}", progress::estimate_line(&info, rate));
            for f in &plan.refused {
                eprintln!("cannot restore block {}: {}", f.id, f.reason);
            }
        }
        return Ok(if plan.refused.is_empty() { 0 } else { EXIT_FAILED });
    }

    // The stores: the primary (as every role opens it) and the targets.
    let Some(url) = args.object_store.clone() else {
        return Ok(usage("--object-store is required (the primary store to restore to)"));
    };
    let mut store = StoreSettings::default();
    let flags = StoreFlags {
        object_store: Some(url),
        object_store_options: args.object_store_options.clone(),
        data: DataDirFlag { data_dir: None },
    };
    if let Err(e) = flags.apply(&mut store).and_then(|()| store.validate()) {
        return Ok(usage(&format!("--object-store: {}", e.reason)));
    }
    let mut target_options = Vec::new();
    for o in args.offload_target_options.iter().filter(|o| !o.is_empty()) {
        let Some((k, v)) = o.split_once('=') else {
            return Ok(usage(&format!("--offload-target-option: {o:?} is not key=value")));
        };
        target_options.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    for spec in &args.offload_targets {
        let checked = mira_compactor::targets::parse_spec(spec)
            .and_then(|(_, url)| mira_core::store::check_url(&url, &target_options).map_err(|e| e.to_string()));
        if let Err(e) = checked {
            return Ok(usage(&format!("--offload-target: {e}")));
        }
    }
    let targets = match Targets::open(&args.offload_targets, &target_options) {
        Ok(t) => t,
        Err(e) => return Ok(usage(&format!("--offload-target: {e}"))),
    };
    let (_, primary) = store.open()?;

    let restorer = Restorer::new(catalog, primary, targets, clock);
    let plan = restorer.plan(&sel).await?;
    let info = plan.info(rate);
    lock().event(&Event::Plan(info.clone()), Instant::now());
    if !args.yes && info.to_restore > 0 && std::io::stdin().is_terminal() {
        eprintln!("{}", progress::estimate_line(&info, rate));
        let question = format!(
            "restore {} blocks ({}) to {}?",
            progress::count(info.to_restore),
            progress::bytes(info.to_restore_bytes),
            args.object_store.as_deref().unwrap_or_default()
        );
        if !confirm(question).await {
            eprintln!("not confirmed: nothing restored");
            return Ok(EXIT_FAILED);
        }
    }

    // Ctrl-C (or SIGTERM): finish the copies in flight, release the
    // leases, print the summary; a second one quits at once.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let signals = {
        let progress = progress.clone();
        // Installed now, before the restore starts.
        let first = crate::shutdown_signal();
        tokio::spawn(async move {
            first.await;
            let _ = stop.send(true);
            progress
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .note("interrupted: letting copies in flight finish and releasing leases (again to quit at once)");
            crate::shutdown_signal().await;
            std::process::exit(EXIT_INTERRUPTED);
        })
    };
    let ticker = {
        let progress = progress.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_millis(250));
            loop {
                every.tick().await;
                progress
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .tick(Instant::now());
            }
        })
    };
    let opts = Options {
        holder: restore::cli_holder(),
        keep_for: args.keep_for.get(),
        concurrency: usize::from(args.concurrency),
        rate_bytes: rate,
        lease_wait: args.lease_wait.get(),
        lease_ttl: args.partition_lease_ttl.get(),
    };
    let sink = |e: &Event| lock().event(e, Instant::now());
    let summary = restorer.run(&plan, &opts, &sink, stopped).await;
    ticker.abort();
    signals.abort();
    lock().finish();
    Ok(if summary.interrupted {
        EXIT_INTERRUPTED
    } else if summary.failed > 0 {
        EXIT_FAILED
    } else {
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(id: &str, start_ns: i64, location: &str, freed: bool) -> pb::Block {
        pb::Block {
            id: id.to_owned(),
            tenant: "acme".to_owned(),
            signal: pb::Signal::Logs as i32,
            partition_start_ns: start_ns,
            rows: 1_000,
            bytes: 3 << 20,
            offload_location: location.to_owned(),
            offload_sha256: "ab".repeat(32),
            offloaded_at_ns: start_ns + 8 * 24 * 3_600_000_000_000,
            primary_freed: freed,
            ..Default::default()
        }
    }

    const NOV_1: i64 = 1_761_955_200_000_000_000;

    fn plan() -> restore::Plan {
        let dir = "s3://mira-archive/mira/acme/logs/2025-11-01/00/";
        restore::Plan {
            partitions: vec![restore::PartitionPlan {
                partition: mira_compactor::planner::Partition {
                    tenant: "acme".to_owned(),
                    signal: "logs",
                    start_ns: NOV_1,
                },
                blocks: vec![
                    block("01A", NOV_1, &format!("{dir}01A.mira"), true),
                    block("01B", NOV_1, &format!("{dir}01B.mira"), false),
                ],
            }],
            ..restore::Plan::default()
        }
    }

    fn render(blocks: bool, output: ListOutput) -> String {
        let mut out = Vec::new();
        render_list(&mut out, &plan(), blocks, output).expect("render");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn the_list_table_groups_by_partition_with_totals() {
        assert_eq!(
            render(false, ListOutput::Table),
            "TENANT  SIGNAL  HOUR            BLOCKS   ROWS    BYTES  OFFLOADED          LOCATION\n\
             acme    logs    2025-11-01T00Z       2  2,000  6.0 MiB  2025-11-09T00:00Z  s3://mira-archive/mira/acme/logs/2025-11-01/00/\n\
             1 partitions, 2 blocks, 2,000 rows, 6.0 MiB offloaded (primary copies freed: 1)\n"
        );
        let blocks = render(true, ListOutput::Table);
        let lines: Vec<&str> = blocks.lines().collect();
        assert_eq!(lines.len(), 4, "{blocks}");
        assert!(lines[0].starts_with("ID   TENANT  SIGNAL  HOUR"), "{blocks}");
        assert!(
            lines[1]
                .starts_with("01A  acme    logs    2025-11-01T00Z  1,000  3.0 MiB  2025-11-09T00:00Z  freed    abab"),
            "{blocks}"
        );
        assert!(
            lines[2].contains("present") && lines[2].ends_with("/00/01B.mira"),
            "{blocks}"
        );
    }

    #[test]
    fn the_list_json_has_the_same_fields() {
        let v: serde_json::Value = serde_json::from_str(&render(false, ListOutput::Json)).expect("json");
        assert_eq!(v[0]["blocks"], 2);
        assert_eq!(v[0]["rows"], 2000);
        assert_eq!(v[0]["primary_freed"], 1);
        assert_eq!(v[0]["hour"], "2025-11-01T00Z");
        assert_eq!(v[0]["location"], "s3://mira-archive/mira/acme/logs/2025-11-01/00/");
        let v: serde_json::Value = serde_json::from_str(&render(true, ListOutput::Json)).expect("json");
        assert_eq!(v.as_array().map(Vec::len), Some(2));
        assert_eq!(v[0]["id"], "01A");
        assert_eq!(v[0]["primary_freed"], true);
        assert_eq!(v[1]["sha256"], "ab".repeat(32));
    }

    #[test]
    fn the_location_is_the_copies_common_directory() {
        assert_eq!(
            common_dir(["s3://b/p/a/x.mira", "s3://b/p/a/y.mira"].into_iter()),
            "s3://b/p/a/"
        );
        assert_eq!(common_dir(["s3://b/p/a/x.mira"].into_iter()), "s3://b/p/a/");
        assert_eq!(common_dir(["s3://b/p/ab/x", "s3://b/p/ac/x"].into_iter()), "s3://b/p/");
        assert_eq!(common_dir(std::iter::empty()), "");
    }

    #[test]
    fn rates_take_an_optional_per_second() {
        assert_eq!(parse_rate("200MiB"), Ok(ByteSize::mib(200)));
        assert_eq!(parse_rate("1GiB/s"), Ok(ByteSize::gib(1)));
        assert_eq!(parse_rate("0"), Ok(ByteSize(0)));
        assert!(parse_rate("fast").is_err());
    }
}
