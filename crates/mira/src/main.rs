//! The `mira` binary: one subcommand per role. `mira serve` runs every role
//! in one process; `mira catalog`, `mira ingester`, `mira querier`,
//! `mira compactor` and `mira operator` run one role each, `mira crd` prints
//! the operator's CRD, `mira catalog-admin` manages a running catalog,
//! `mira offload list|restore` lists and restores offloaded blocks,
//! `mira smoke` writes marked logs, spans and points and reads them back
//! (the Helm chart's `helm test`), and `mira version` prints what this
//! build is and the block format it reads and writes.

mod block_dump;
mod catalog;
mod compactor;
mod flags;
mod ingester;
mod loadgen;
mod offload;
mod operator;
mod policy;
mod querier;
mod serve;
mod smoke;

use clap::{Parser, Subcommand};

/// Mira: an OpenTelemetry store for logs, traces and metrics.
#[derive(Debug, Parser)]
#[command(name = "mira", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run catalog, ingester, querier and compactor in one process (OTLP on 4317/4318, queries on 3100, data in ./data).
    Serve(Box<serve::ServeArgs>),
    /// Print the version, the block format version and the table schema version.
    Version,
    /// Run a catalog member (Raft-replicated block catalog).
    Catalog(catalog::CatalogArgs),
    /// Inspect or change a running catalog: status, members, snapshot.
    CatalogAdmin(catalog::AdminArgs),
    /// Run an ingester: OTLP in, WAL, blocks out to the object store and catalog.
    Ingester(ingester::IngesterArgs),
    /// Run a querier: the query API over the catalog, object store and ingesters.
    Querier(querier::QuerierArgs),
    /// Run a compactor: merge small blocks, rewrite settled hours cold, delete replaced blocks after a grace.
    Compactor(compactor::CompactorArgs),
    /// Run the Kubernetes operator: MiraRetentionPolicy objects to catalog policies, with status.
    Operator(operator::OperatorArgs),
    /// Print the MiraRetentionPolicy CustomResourceDefinition (YAML).
    Crd,
    /// Set, list or delete retention and offload policies in the catalog.
    Policy(policy::PolicyArgs),
    /// List offloaded blocks, or restore them to the primary store (exit 0 done, 1 some failed, 2 usage, 130 interrupted).
    Offload(offload::OffloadArgs),
    /// Send OTLP load (pre-encoded testkit corpus) and report records/s and ack latency.
    Loadgen(loadgen::LoadgenArgs),
    /// Send one marked OTLP export of each signal and read it back through the Loki, Tempo and Prometheus APIs (exit 0 found, 1 not found in time, 2 usage).
    Smoke(smoke::SmokeArgs),
    /// Print the records of block files as OTLP/JSON, one line per block.
    BlockDump {
        /// `.mira` block files.
        files: Vec<std::path::PathBuf>,
    },
}

fn version_text() -> String {
    format!(
        "mira {}\nblock format {}\ntable schema {}",
        env!("CARGO_PKG_VERSION"),
        mira_core::block::FORMAT_VERSION,
        mira_core::schema::SCHEMA_VERSION
    )
}

/// The process's clock (the system's, or the test clock file's in a
/// fault-hooks build) and its one telemetry.
pub(crate) fn process() -> anyhow::Result<mira_common::Process> {
    Ok(mira_common::Process::new(mira_common::clock::Clock::from_env()?))
}

/// Resolves on SIGINT or SIGTERM. On Unix the handlers are installed when
/// this is called (not when first polled), so a signal arriving after the
/// call is never missed, even by a task that has not run yet. Call it
/// inside a runtime.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let int = signal(SignalKind::interrupt()).ok();
        let term = signal(SignalKind::terminate()).ok();
        async move {
            let recv = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = recv(int) => {}
                () = recv(term) => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Logs to stderr, filtered by `MIRA_LOG` (else `default`).
fn init_tracing_with(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MIRA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn init_tracing() {
    init_tracing_with("info,openraft=warn");
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => println!("{}", version_text()),
        Command::Catalog(args) => {
            init_tracing();
            tokio::runtime::Runtime::new()?.block_on(catalog::run(args))?;
        }
        Command::CatalogAdmin(args) => tokio::runtime::Runtime::new()?.block_on(catalog::admin(args))?,
        Command::BlockDump { files } => block_dump::run(&files)?,
        Command::Policy(args) => {
            let code = tokio::runtime::Runtime::new()?.block_on(policy::run(args))?;
            if code != 0 {
                std::process::exit(code);
            }
        }
        Command::Offload(args) => {
            // Warnings only: the progress display is the output.
            init_tracing_with("warn");
            let code = tokio::runtime::Runtime::new()?.block_on(offload::run(args))?;
            if code != 0 {
                std::process::exit(code);
            }
        }
        Command::Smoke(args) => {
            init_tracing_with("warn");
            let code = tokio::runtime::Runtime::new()?.block_on(smoke::run(args))?;
            if code != 0 {
                std::process::exit(code);
            }
        }
        Command::Loadgen(args) => tokio::runtime::Runtime::new()?.block_on(loadgen::run(args))?,
        Command::Ingester(args) => {
            init_tracing();
            tokio::runtime::Runtime::new()?.block_on(ingester::run(args))?;
        }
        Command::Querier(args) => {
            init_tracing();
            tokio::runtime::Runtime::new()?.block_on(querier::run(args))?;
        }
        Command::Compactor(args) => {
            init_tracing();
            tokio::runtime::Runtime::new()?.block_on(compactor::run(args))?;
        }
        Command::Operator(args) => {
            init_tracing();
            tokio::runtime::Runtime::new()?.block_on(operator::run(args))?;
        }
        Command::Crd => operator::print_crd()?,
        Command::Serve(args) => {
            init_tracing();
            tokio::runtime::Runtime::new()?.block_on(serve::run(*args))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn version_names_the_formats() {
        let v = version_text();
        assert!(v.starts_with(&format!("mira {}", env!("CARGO_PKG_VERSION"))));
        assert!(v.contains("block format 1"), "{v}");
    }

    #[test]
    fn the_restore_command_queries_suggest_parses() {
        // What the querier's offloaded-blocks warning tells users to run.
        let cli = Cli::try_parse_from([
            "mira",
            "offload",
            "restore",
            "--tenant",
            "acme",
            "--signal",
            "logs",
            "--from",
            "2026-11-01T00:00:00Z",
            "--to",
            "2026-11-01T01:00:01Z",
            "--object-store",
            "file:///data/objects",
        ]);
        assert!(matches!(cli.map(|c| c.command), Ok(Command::Offload(_))));
    }

    #[test]
    fn unknown_subcommand_is_an_error() {
        assert!(Cli::try_parse_from(["mira", "frobnicate"]).is_err());
        assert!(matches!(
            Cli::try_parse_from(["mira", "version"]).map(|c| c.command),
            Ok(Command::Version)
        ));
    }
}
