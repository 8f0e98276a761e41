//! The `mira` binary: one subcommand per role. For now it carries the
//! shell every role will hang from; `mira version` prints what this build
//! is and the block format it reads and writes.

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
    /// Print the version, the block format version and the table schema version.
    Version,
}

fn version_text() -> String {
    format!(
        "mira {}\nblock format {}\ntable schema {}",
        env!("CARGO_PKG_VERSION"),
        mira_core::block::FORMAT_VERSION,
        mira_core::schema::SCHEMA_VERSION
    )
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => println!("{}", version_text()),
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
    fn unknown_subcommand_is_an_error() {
        assert!(Cli::try_parse_from(["mira", "frobnicate"]).is_err());
        assert!(matches!(
            Cli::try_parse_from(["mira", "version"]).map(|c| c.command),
            Ok(Command::Version)
        ));
    }
}
