//! `mira policy set|list|delete`: retention and offload policies in the
//! catalog, from the command line (the operator's `MiraRetentionPolicy` is
//! the Kubernetes way). A body is given whole (`--body`, `--body-file`) or
//! built from flags (`--retain`, `--after` and `--target`, `--signal`,
//! `--match`, `--priority`, `--tenant-glob`); the catalog validates it and
//! names the field it refuses. `list` shows each policy with what the
//! compactor last reported enforcing it.

use std::io::Write;

use clap::{Args, Subcommand, ValueEnum};
use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientError};
use mira_common::config::Duration;
use serde_json::{Map, Value, json};

use crate::flags::{ClusterFlags, catalog_client};

/// `mira policy`.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// Catalog members, comma separated host:port.
    #[arg(long, env = "MIRA_CATALOG", default_value = "127.0.0.1:7400", global = true)]
    pub catalog: String,
    #[command(flatten)]
    pub cluster: ClusterFlags,
    #[command(subcommand)]
    pub command: PolicyCommand,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Create or replace a policy.
    Set(Box<SetArgs>),
    /// List policies and what enforcing them did last.
    List(ListArgs),
    /// Delete a policy (deleting one that does not exist succeeds).
    Delete(DeleteArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    Retention,
    Offload,
}

impl Kind {
    fn pb(self) -> pb::PolicyKind {
        match self {
            Kind::Retention => pb::PolicyKind::Retention,
            Kind::Offload => pb::PolicyKind::Offload,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct SetArgs {
    /// The policy's name (1-253 of A-Z a-z 0-9 . _ / -).
    pub name: String,
    #[arg(long, value_enum, default_value_t = Kind::Retention)]
    pub kind: Kind,
    /// The tenant it applies to; empty: every tenant (see --tenant-glob).
    #[arg(long, default_value = "")]
    pub tenant: String,
    /// The whole body as JSON (see docs/operations.md); excludes the
    /// body flags below.
    #[arg(long, conflicts_with_all = ["body_file", "retain", "after", "target", "signal", "matchers", "priority", "tenant_glob", "dry_run"])]
    pub body: Option<String>,
    /// Read the body from this file.
    #[arg(long, conflicts_with_all = ["retain", "after", "target", "signal", "matchers", "priority", "tenant_glob", "dry_run"])]
    pub body_file: Option<std::path::PathBuf>,
    /// Retention: keep rows this long (at least 1h), e.g. 7d.
    #[arg(long)]
    pub retain: Option<Duration>,
    /// Offload: move blocks this long after their newest row, e.g. 2d.
    #[arg(long)]
    pub after: Option<Duration>,
    /// Offload: the target's name (a compactor's --offload-target).
    #[arg(long)]
    pub target: Option<String>,
    /// Signals it applies to (logs, traces, metrics); none: all. Repeatable.
    #[arg(long)]
    pub signal: Vec<String>,
    /// A resource attribute matcher: key=value, key!=value, key=~regex,
    /// key!~regex, key (exists) or !key (absent). Repeatable; all must hold.
    #[arg(long = "match", id = "matchers")]
    pub matchers: Vec<String>,
    /// Higher wins among rules of one resolution step.
    #[arg(long)]
    pub priority: Option<i32>,
    /// With an empty --tenant: only tenants matching this glob (* and ?).
    #[arg(long)]
    pub tenant_glob: Option<String>,
    /// Report what the policy would drop or move, and do nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this kind.
    #[arg(long, value_enum)]
    pub kind: Option<Kind>,
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    pub name: String,
    #[arg(long, value_enum, default_value_t = Kind::Retention)]
    pub kind: Kind,
}

/// A `--match` expression as a selector matcher.
pub fn matcher(expr: &str) -> Result<Value, String> {
    if let Some(key) = expr.strip_prefix('!')
        && !key.contains(['=', '~'])
    {
        return Ok(json!({"key": key, "op": "!exists"}));
    }
    for op in ["!=", "=~", "!~", "="] {
        if let Some((key, value)) = expr.split_once(op) {
            return Ok(json!({"key": key, "op": op, "value": value}));
        }
    }
    if expr.is_empty() {
        return Err("an empty --match".to_owned());
    }
    Ok(json!({"key": expr, "op": "exists"}))
}

/// The body the flags describe.
pub fn body_from_flags(a: &SetArgs) -> Result<String, String> {
    let mut body = Map::new();
    body.insert("v".into(), json!(1));
    if !a.signal.is_empty() {
        body.insert("signals".into(), json!(a.signal));
    }
    if let Some(g) = &a.tenant_glob {
        body.insert("tenant_glob".into(), json!(g));
    }
    if !a.matchers.is_empty() {
        let m: Vec<Value> = a.matchers.iter().map(|e| matcher(e)).collect::<Result<_, _>>()?;
        body.insert("selector".into(), Value::Array(m));
    }
    if let Some(p) = a.priority {
        body.insert("priority".into(), json!(p));
    }
    if let Some(r) = a.retain {
        body.insert("retain_s".into(), json!(r.get().as_secs()));
    }
    if let Some(r) = a.after {
        body.insert("after_s".into(), json!(r.get().as_secs()));
    }
    if let Some(t) = &a.target {
        body.insert("target".into(), json!(t));
    }
    if a.dry_run {
        body.insert("dry_run".into(), json!(true));
    }
    Ok(Value::Object(body).to_string())
}

/// Runs a policy command; returns the exit code (2: refused or usage).
pub async fn run(args: PolicyArgs) -> anyhow::Result<i32> {
    let client = catalog_client(&args.catalog, &args.cluster.dialer()?);
    match args.command {
        PolicyCommand::Set(a) => set(&client, *a).await,
        PolicyCommand::List(a) => list(&client, a).await,
        PolicyCommand::Delete(a) => {
            client.delete_policy(a.kind.pb(), &a.name).await?;
            println!("deleted {} policy {}", kind_name(a.kind.pb() as i32), a.name);
            Ok(0)
        }
    }
}

async fn set(client: &CatalogClient, a: SetArgs) -> anyhow::Result<i32> {
    let body = match (&a.body, &a.body_file) {
        (Some(b), _) => b.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).map_err(|e| anyhow::anyhow!("--body-file {}: {e}", f.display()))?
        }
        (None, None) => match body_from_flags(&a) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(2);
            }
        },
    };
    let policy = pb::Policy {
        kind: a.kind.pb() as i32,
        name: a.name.clone(),
        tenant: a.tenant.clone(),
        body_json: body,
        ..Default::default()
    };
    match client.set_policy(policy).await {
        Ok(_) => {
            println!("set {} policy {}", kind_name(a.kind.pb() as i32), a.name);
            Ok(0)
        }
        Err(ClientError::Rejected(s)) => {
            eprintln!("error: the catalog refused the policy: {}", s.message());
            Ok(2)
        }
        Err(e) => Err(e.into()),
    }
}

fn kind_name(kind: i32) -> &'static str {
    if kind == pb::PolicyKind::Offload as i32 {
        "offload"
    } else {
        "retention"
    }
}

async fn list(client: &CatalogClient, a: ListArgs) -> anyhow::Result<i32> {
    let reply = client
        .list_policies(pb::ListPoliciesRequest {
            kind: a.kind.map_or(0, |k| k.pb() as i32),
            linearizable: false,
        })
        .await?;
    let mut out = std::io::stdout().lock();
    match a.output {
        Output::Json => {
            let rows: Vec<Value> = reply
                .policies
                .iter()
                .map(|p| {
                    json!({
                        "kind": kind_name(p.kind),
                        "name": p.name,
                        "tenant": p.tenant,
                        "body": serde_json::from_str::<Value>(&p.body_json).unwrap_or(Value::Null),
                        "status": serde_json::from_str::<Value>(&p.status_json).unwrap_or(Value::Null),
                    })
                })
                .collect();
            writeln!(
                out,
                "{}",
                json!({
                    "policies": rows,
                    "offload_targets": reply.offload_targets,
                    "offload_target_checks": reply.offload_target_checks.iter().map(|c| json!({
                        "name": c.name,
                        "reachable": c.reachable,
                        "checked_at_ns": c.checked_at_ns,
                        "error": c.error,
                    })).collect::<Vec<_>>(),
                })
            )?;
        }
        Output::Table => {
            writeln!(out, "{}", table(&reply))?;
        }
    }
    Ok(0)
}

/// The policies as a table, one line each.
pub fn table(reply: &pb::ListPoliciesReply) -> String {
    let mut rows = vec![
        [
            "KIND",
            "NAME",
            "TENANT",
            "SIGNALS",
            "SELECTOR",
            "KEEP/AFTER",
            "TARGET",
            "PRIO",
            "LAST RUN",
            "DROPPED",
            "OFFLOADED",
        ]
        .map(str::to_owned),
    ];
    for p in &reply.policies {
        let body: Value = serde_json::from_str(&p.body_json).unwrap_or(Value::Null);
        let status: Value = serde_json::from_str(&p.status_json).unwrap_or(Value::Null);
        let secs = body["retain_s"].as_u64().or(body["after_s"].as_u64());
        let selector = body["selector"]
            .as_array()
            .map(|m| {
                m.iter()
                    .map(|m| {
                        let value = m["value"]
                            .as_str()
                            .map(str::to_owned)
                            .or_else(|| m["values"].as_array().map(|v| format!("{v:?}")))
                            .unwrap_or_default();
                        format!(
                            "{}{}{value}",
                            m["key"].as_str().unwrap_or(""),
                            m["op"].as_str().unwrap_or("")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let tenant = match (p.tenant.as_str(), body["tenant_glob"].as_str()) {
            ("", Some(g)) => g.to_owned(),
            ("", None) => "*".to_owned(),
            (t, _) => t.to_owned(),
        };
        let last_run = status["last_run_ns"]
            .as_i64()
            .filter(|&n| n > 0)
            .map(|n| {
                humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(n as u64))
                    .to_string()
            })
            .unwrap_or_else(|| "-".to_owned());
        rows.push([
            kind_name(p.kind).to_owned(),
            p.name.clone(),
            tenant,
            body["signals"]
                .as_array()
                .map(|s| s.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(","))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "all".to_owned()),
            if selector.is_empty() { "-".to_owned() } else { selector },
            secs.map(|s| Duration::from_secs(s).to_string()).unwrap_or_default(),
            body["target"].as_str().unwrap_or("-").to_owned(),
            body["priority"].as_i64().unwrap_or(0).to_string(),
            last_run,
            format!("{} blocks", status["blocks_dropped"].as_u64().unwrap_or(0)),
            format!("{} blocks", status["blocks_offloaded"].as_u64().unwrap_or(0)),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&format!(
        "{} policies; offload targets registered by compactors: {}",
        reply.policies.len(),
        if reply.offload_targets.is_empty() {
            "none".to_owned()
        } else {
            reply.offload_targets.join(", ")
        }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matchers_parse_every_operator() {
        assert_eq!(matcher("service.name=checkout").expect("eq")["op"], "=");
        assert_eq!(matcher("env!=prod").expect("ne")["value"], "prod");
        assert_eq!(matcher("k=~a.*").expect("re")["op"], "=~");
        assert_eq!(matcher("k!~a").expect("nre")["op"], "!~");
        assert_eq!(matcher("k").expect("exists")["op"], "exists");
        assert_eq!(matcher("!k").expect("absent")["op"], "!exists");
        assert!(matcher("").is_err());
    }

    #[test]
    fn the_table_shows_bodies_and_statuses() {
        let reply = pb::ListPoliciesReply {
            policies: vec![pb::Policy {
                kind: pb::PolicyKind::Retention as i32,
                name: "short".into(),
                tenant: "acme".into(),
                body_json:
                    r#"{"v":1,"retain_s":86400,"selector":[{"key":"service.name","op":"=","value":"checkout"}]}"#.into(),
                status_json: r#"{"last_run_ns":1764547200000000000,"blocks_dropped":3}"#.into(),
            }],
            version: 1,
            offload_targets: vec!["archive".into()],
            offload_target_checks: Vec::new(),
        };
        let t = table(&reply);
        let line = t.lines().nth(1).expect("a row");
        for want in [
            "retention",
            "short",
            "acme",
            "service.name=checkout",
            "1d",
            "2025-12-01T00:00:00Z",
            "3 blocks",
        ] {
            assert!(line.contains(want), "{want:?} missing from {line:?}");
        }
        assert!(t.ends_with("offload targets registered by compactors: archive"));
    }
}
