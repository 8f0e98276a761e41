//! `mira operator`: the Kubernetes operator that reconciles
//! `MiraRetentionPolicy` objects into catalog policies (see
//! `mira_operator`), and `mira crd`, which prints the CRD.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use mira_common::config::ConfigError;
use mira_common::security::{Exposure, SecuritySettings};
use mira_operator::Settings;

use crate::flags::{ConfigFlags, Effective, SecurityFlags, secured, set_given};

/// Flags of `mira operator`.
#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// Catalog members, comma separated host:port [default: 127.0.0.1:7400].
    #[arg(long, env = "MIRA_CATALOG")]
    pub catalog: Option<String>,
    /// HTTP listen address: /metrics, /ready, /live [default: 0.0.0.0:8080].
    #[arg(long, env = "MIRA_OPERATOR_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Reconcile objects of this namespace only; empty: every namespace.
    #[arg(long, env = "MIRA_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,
    /// Reconcile only while holding the leader Lease [default: true].
    #[arg(long, env = "MIRA_OPERATOR_LEADER_ELECT", num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: Option<bool>,
    /// The leader Lease's name [default: mira-operator].
    #[arg(long, env = "MIRA_OPERATOR_LEASE_NAME")]
    pub lease_name: Option<String>,
    /// The leader Lease's namespace [default: the client's namespace].
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// This replica's name in the Lease and its events [default: the host name].
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Reconcile every object again this often, seconds [default: 300].
    #[arg(long, env = "MIRA_OPERATOR_REQUEUE_S")]
    pub requeue_s: Option<u64>,
    /// Longest catalog call, milliseconds [default: 5000].
    #[arg(long, env = "MIRA_OPERATOR_CATALOG_TIMEOUT_MS")]
    pub catalog_timeout_ms: Option<u64>,
    /// A kubeconfig file [default: in-cluster, else KUBECONFIG or ~/.kube/config].
    #[arg(long, env = "MIRA_OPERATOR_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// NAMESPACE=TENANT[,TENANT...]: tenants the objects of a namespace may
    /// govern (besides its mira.dev/tenants annotation); repeat the flag or
    /// separate entries with ';'. Objects of the operator's namespace (the
    /// lease namespace) may govern every tenant and "*".
    #[arg(
        long = "namespace-tenants",
        env = "MIRA_OPERATOR_NAMESPACE_TENANTS",
        value_delimiter = ';'
    )]
    pub namespace_tenants: Vec<String>,
    /// Whether a Namespace's mira.dev/tenants annotation grants tenants to
    /// its objects [default: true].
    #[arg(long, env = "MIRA_OPERATOR_NAMESPACE_ANNOTATION", num_args = 0..=1, default_missing_value = "true")]
    pub namespace_annotation: Option<bool>,
    #[command(flatten)]
    pub security: SecurityFlags,
    #[command(flatten)]
    pub config: ConfigFlags,
}

impl OperatorArgs {
    /// The effective operator and security settings, validated.
    pub fn settings(&self) -> Result<(Settings, SecuritySettings), ConfigError> {
        let file = self.config.load()?;
        let (mut s, mut sec) = (file.operator, file.security);
        self.security.apply(&mut sec);
        sec.validate(Exposure::Client)?;
        set_given!(
            self,
            s,
            catalog,
            listen,
            namespace,
            leader_elect,
            lease_name,
            lease_namespace,
            identity,
            requeue_s,
            catalog_timeout_ms,
            namespace_annotation,
        );
        if !self.namespace_tenants.is_empty() {
            s.namespace_tenants.clone_from(&self.namespace_tenants);
        }
        if self.kubeconfig.is_some() {
            s.kubeconfig.clone_from(&self.kubeconfig);
        }
        s.validate()?;
        Ok((s, sec))
    }
}

pub async fn run(args: OperatorArgs) -> anyhow::Result<()> {
    let (settings, security) = args.settings()?;
    if args.config.check_config {
        Effective {
            operator: Some(&settings),
            security: Some(&security),
            ..Effective::default()
        }
        .print();
        return Ok(());
    }
    let process = secured(crate::process()?, &security, Exposure::Client)?;
    mira_operator::run::run(settings, &process, crate::shutdown_signal()).await?;
    Ok(())
}

/// `mira crd`: the CRD YAML.
pub fn print_crd() -> anyhow::Result<()> {
    print!("{}", mira_operator::crd::crd_yaml()?);
    Ok(())
}
