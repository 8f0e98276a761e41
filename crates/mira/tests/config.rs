//! Configuration of every role through the real binary: `--check-config`
//! prints the effective settings and starts nothing, defaults < file <
//! variables < flags, bad values are refused naming the field (never
//! clamped), the flags of earlier releases keep their units.

use std::path::Path;
use std::process::{Command, Output};

fn mira(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mira"));
    c.args(args);
    // Only what the test sets: none of the caller's MIRA_* settings.
    for (k, _) in std::env::vars() {
        if k.starts_with("MIRA_") {
            c.env_remove(k);
        }
    }
    // Members need a cluster credential (tests/security.rs covers it);
    // these tests are about the other settings.
    c.env("MIRA_INSECURE_CLUSTER", "true");
    c.envs(env.iter().copied());
    c.output().expect("run mira")
}

fn ok(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = mira(args, env);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Runs a command that must fail; its stderr.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = mira(args, env);
    assert!(
        !out.status.success(),
        "{args:?} was accepted:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The value of `key` in the `[table]` of `--check-config` output.
fn value(toml: &str, table: &str, key: &str) -> String {
    let mut in_table = false;
    for line in toml.lines() {
        if let Some(t) = line.strip_prefix('[') {
            in_table = t.trim_end_matches(']') == table;
        } else if in_table
            && let Some((k, v)) = line.split_once(" = ")
            && k == key
        {
            return v.trim_matches('"').to_owned();
        }
    }
    panic!("no {table}.{key} in:\n{toml}");
}

#[test]
fn check_config_prints_the_defaults_of_every_role_and_starts_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let d = data.to_str().expect("path");
    let ingester = ok(&["ingester", "--check-config", "--data-dir", d], &[]);
    assert_eq!(value(&ingester, "ingester", "seal_age"), "5m");
    assert_eq!(value(&ingester, "ingester", "seal_size"), "32MiB");
    assert_eq!(value(&ingester, "ingester", "wal"), "page-cache");
    assert_eq!(value(&ingester, "store", "data_dir"), d);
    let querier = ok(&["querier", "--check-config", "--data-dir", d], &[]);
    assert_eq!(value(&querier, "querier", "max_query_range"), "31d");
    assert_eq!(value(&querier, "querier", "cache_size"), "10GiB");
    assert_eq!(value(&querier, "querier", "query_timeout"), "2m");
    assert_eq!(value(&querier, "querier", "catalog_max_staleness"), "15s");
    let catalog = ok(&["catalog", "--check-config", "--data-dir", d], &[]);
    assert_eq!(value(&catalog, "catalog", "election_timeout"), "400ms");
    let compactor = ok(&["compactor", "--check-config", "--data-dir", d], &[]);
    assert_eq!(value(&compactor, "compactor", "cold_after"), "1h");
    assert_eq!(value(&compactor, "compactor", "deletion_grace"), "1h");
    assert_eq!(value(&compactor, "compactor", "memory_limit"), "2GiB");
    let serve = ok(&["serve", "--check-config", "--data-dir", d], &[]);
    assert_eq!(value(&serve, "serve", "catalog_listen"), "127.0.0.1:7400");
    assert_eq!(value(&serve, "serve", "compactor"), "true");
    assert_eq!(value(&serve, "compactor", "settle"), "10m");
    assert_eq!(value(&serve, "ingester", "id"), "serve");
    assert!(!serve.contains("[catalog]"), "{serve}");
    // Nothing was created, no port was bound.
    assert!(!data.exists());
}

#[test]
fn flags_beat_variables_beat_the_file_beat_the_defaults() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("mira.toml");
    std::fs::write(&file, "[ingester]\nseal_age = \"1m\"\nmax_attributes = 10\n").expect("write");
    let f = file.to_str().expect("path");
    let run = |flags: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["ingester", "--check-config"];
        args.extend_from_slice(flags);
        value(&ok(&args, env), "ingester", "seal_age")
    };
    assert_eq!(run(&[], &[]), "5m");
    assert_eq!(run(&["--config", f], &[]), "1m");
    assert_eq!(run(&["--config", f], &[("MIRA_SEAL_AGE", "2m")]), "2m");
    assert_eq!(
        run(&["--config", f, "--seal-age", "3m"], &[("MIRA_SEAL_AGE", "2m")]),
        "3m"
    );
    // The file is found through MIRA_CONFIG too; what it does not set
    // stays the default.
    let out = ok(&["ingester", "--check-config"], &[("MIRA_CONFIG", f)]);
    assert_eq!(value(&out, "ingester", "max_attributes"), "10");
    assert_eq!(value(&out, "ingester", "max_inflight_requests"), "8");
}

#[test]
fn the_printed_configuration_reads_back_as_the_same_configuration() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = ok(
        &[
            "serve",
            "--check-config",
            "--seal-age",
            "90s",
            "--max-message-size",
            "4MiB",
            "--object-store-option",
            "aws_region=eu-west-1",
            "--shards",
            "3",
            "--require-tenant",
        ],
        &[],
    );
    assert_eq!(value(&first, "ingester", "seal_age"), "1m 30s");
    assert_eq!(value(&first, "ingester", "require_tenant"), "true");
    let file = dir.path().join("effective.toml");
    std::fs::write(&file, &first).expect("write");
    let again = ok(
        &["serve", "--check-config", "--config", file.to_str().expect("path")],
        &[],
    );
    assert_eq!(again, first);
}

#[test]
fn bad_values_are_refused_naming_the_field_instead_of_clamped() {
    for (args, field) in [
        (&["ingester", "--seal-age", "0s"][..], "ingester.seal_age"),
        (&["ingester", "--seal-age-s", "0"][..], "ingester.seal_age"),
        (&["ingester", "--body-timeout", "0s"][..], "ingester.body_timeout"),
        (&["ingester", "--shards", "0"][..], "ingester.shards"),
        (&["ingester", "--lease-ttl", "20ms"][..], "ingester.lease_ttl"),
        (&["querier", "--recent-timeout", "0ms"][..], "querier.recent_timeout"),
        (&["querier", "--recent-timeout-ms", "0"][..], "querier.recent_timeout"),
        (&["querier", "--object-store", "ftp://x/y"][..], "store.object_store"),
        (
            &["catalog", "--election-timeout", "50ms"][..],
            "catalog.election_timeout",
        ),
        (&["catalog", "--node-id", "4"][..], "catalog.peers"),
        (&["serve", "--max-query-limit", "0"][..], "querier.max_query_limit"),
        (&["compactor", "--merge-factor", "1"][..], "compactor.merge_factor"),
        (&["compactor", "--partition-lease-ttl", "1s"][..], "compactor.lease_ttl"),
        (&["compactor", "--memory-limit", "64MiB"][..], "compactor.memory_limit"),
        (&["compactor", "--nice", "20"][..], "compactor.nice"),
        (
            &["compactor", "--catalog-share-percent", "0"][..],
            "compactor.catalog_share_percent",
        ),
        (&["serve", "--compactor-jobs", "0"][..], "compactor.jobs"),
        (&["querier", "--query-timeout", "0s"][..], "querier.query_timeout"),
        (
            &["serve", "--catalog-max-staleness", "0s"][..],
            "querier.catalog_max_staleness",
        ),
        (&["querier", "--auth", "tokens"][..], "security.tokens_file"),
        (&["serve", "--auth", "trusted-header"][..], "security.trusted_proxies"),
        (
            &[
                "ingester",
                "--auth",
                "trusted-header",
                "--auth-trusted-proxies",
                "gateway",
            ][..],
            "security.trusted_proxies",
        ),
        (&["querier", "--tls-cert", "/tls/tls.crt"][..], "security.tls_key"),
        (
            &["catalog", "--tls-client-ca", "/tls/ca.crt"][..],
            "security.tls_client_ca",
        ),
        (&["serve", "--reload-interval", "0s"][..], "security.reload_interval"),
    ] {
        let mut with_check = args.to_vec();
        with_check.push("--check-config");
        let err = refused(&with_check, &[]);
        assert!(err.contains(&format!("invalid {field}")), "{args:?}: {err}");
    }
    // The accepted time window is bounded, so every accepted record is
    // publishable (issue 29 item 7: a record past i64::MAX ns got in with a
    // large --max-future); the limits themselves are accepted.
    for (args, flag) in [
        (&["ingester", "--max-future", "7d 1s"][..], "--max-future"),
        (&["serve", "--max-future", "1000000d"][..], "--max-future"),
        (&["ingester", "--max-past", "3651d"][..], "--max-past"),
    ] {
        let mut with_check = args.to_vec();
        with_check.push("--check-config");
        let err = refused(&with_check, &[]);
        let field = flag.trim_start_matches("--").replace('-', "_");
        assert!(
            err.contains(&format!("invalid ingester.{field}")) && err.contains(flag),
            "{args:?}: {err}"
        );
    }
    ok(
        &[
            "ingester",
            "--check-config",
            "--max-future",
            "7d",
            "--max-past",
            "3650d",
        ],
        &[],
    );
    // Values clap cannot parse name the flag and the expected form.
    let err = refused(&["ingester", "--check-config", "--seal-size", "lots"], &[]);
    assert!(err.contains("--seal-size") && err.contains("64MiB"), "{err}");
    let err = refused(&["ingester", "--check-config"], &[("MIRA_SEAL_AGE", "soon")]);
    assert!(err.contains("30s, 5m or 168h"), "{err}");
}

#[test]
fn query_timeout_and_catalog_staleness_come_from_the_file_variables_and_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("mira.toml");
    std::fs::write(
        &file,
        "[querier]\nquery_timeout = \"30s\"\ncatalog_max_staleness = \"1m\"\n",
    )
    .expect("write");
    let f = file.to_str().expect("path");
    let from_file = ok(&["querier", "--check-config", "--config", f], &[]);
    assert_eq!(value(&from_file, "querier", "query_timeout"), "30s");
    assert_eq!(value(&from_file, "querier", "catalog_max_staleness"), "1m");
    let from_env = ok(
        &["querier", "--check-config", "--config", f],
        &[("MIRA_QUERY_TIMEOUT", "45s"), ("MIRA_CATALOG_MAX_STALENESS", "20s")],
    );
    assert_eq!(value(&from_env, "querier", "query_timeout"), "45s");
    assert_eq!(value(&from_env, "querier", "catalog_max_staleness"), "20s");
    let from_flags = ok(
        &[
            "serve",
            "--check-config",
            "--config",
            f,
            "--query-timeout",
            "5m",
            "--catalog-max-staleness",
            "5s",
        ],
        &[("MIRA_QUERY_TIMEOUT", "45s")],
    );
    assert_eq!(value(&from_flags, "querier", "query_timeout"), "5m");
    assert_eq!(value(&from_flags, "querier", "catalog_max_staleness"), "5s");
}

#[test]
fn a_file_with_an_unknown_or_malformed_key_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("mira.toml");
    let f = file.to_str().expect("path");
    for (text, word) in [
        ("[ingester]\nseal_age_s = 300\n", "seal_age_s"),
        ("[ingestr]\n", "ingestr"),
        ("[ingester]\nseal_size = \"big\"\n", "big"),
        ("[ingester\n", "mira.toml"),
    ] {
        std::fs::write(&file, text).expect("write");
        let err = refused(&["ingester", "--check-config", "--config", f], &[]);
        assert!(err.contains(word), "{text}: {err}");
    }
    let err = refused(&["ingester", "--check-config", "--config", "/no/such/mira.toml"], &[]);
    assert!(err.contains("/no/such/mira.toml"), "{err}");
}

#[test]
fn the_flags_of_the_last_release_keep_their_units_and_cannot_be_mixed_with_the_new() {
    let out = ok(
        &[
            "ingester",
            "--check-config",
            "--seal-age-s",
            "300",
            "--seal-bytes",
            "1048576",
            "--admit-wait-ms",
            "250",
            "--lease-ttl-s",
            "20",
            "--body-timeout-s",
            "7",
            "--max-message-bytes",
            "2097152",
            "--multipart-above-bytes",
            "8388608",
            "--max-attribute-value-bytes",
            "1024",
            "--shard-queue-bytes",
            "4096",
        ],
        &[],
    );
    for (key, want) in [
        ("seal_age", "5m"),
        ("seal_size", "1MiB"),
        ("admit_wait", "250ms"),
        ("lease_ttl", "20s"),
        ("body_timeout", "7s"),
        ("max_message_size", "2MiB"),
        ("multipart_above", "8MiB"),
        ("max_attribute_value_size", "1KiB"),
        ("shard_queue_size", "4KiB"),
    ] {
        assert_eq!(value(&out, "ingester", key), want, "{key}");
    }
    let q = ok(
        &["querier", "--check-config", "--max-query-range-h", "48"],
        &[("MIRA_RECENT_TIMEOUT_MS", "1500")],
    );
    assert_eq!(value(&q, "querier", "max_query_range"), "2d");
    assert_eq!(value(&q, "querier", "recent_timeout"), "1s 500ms");
    let c = ok(
        &[
            "catalog",
            "--check-config",
            "--heartbeat-ms",
            "50",
            "--election-ms",
            "300",
        ],
        &[],
    );
    assert_eq!(value(&c, "catalog", "heartbeat"), "50ms");
    assert_eq!(value(&c, "catalog", "election_timeout"), "300ms");
    let err = refused(
        &["ingester", "--check-config", "--seal-age-s", "1", "--seal-age", "1s"],
        &[],
    );
    assert!(err.contains("--seal-age"), "{err}");
}

#[test]
fn the_data_dir_means_the_same_for_every_role() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("path");
    for role in ["catalog", "ingester", "querier", "compactor", "serve"] {
        let out = ok(&[role, "--check-config"], &[("MIRA_DATA_DIR", d)]);
        assert_eq!(value(&out, "store", "data_dir"), d, "{role}");
    }
    assert!(Path::new(d).read_dir().expect("dir").next().is_none());
}

#[test]
fn the_example_file_in_the_docs_is_valid_for_every_role() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md")).expect("docs");
    let start = doc.find("```toml\n").expect("an example file") + "```toml\n".len();
    let end = start + doc[start..].find("```").expect("its end");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("example.toml");
    std::fs::write(&file, &doc[start..end]).expect("write");
    let f = file.to_str().expect("path");
    for role in ["catalog", "ingester", "querier", "compactor", "serve"] {
        ok(&[role, "--check-config", "--config", f], &[]);
    }
    let out = ok(&["ingester", "--check-config", "--config", f], &[]);
    assert_eq!(value(&out, "ingester", "wal"), "fsync");
}

/// The nice value of every thread of `pid`, `None` once it has exited.
fn thread_nices(pid: u32) -> Option<Vec<i64>> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("stat")).ok()?;
        // Field 19 is the nice value; the command name (field 2) may hold spaces.
        let rest = stat.rsplit_once(')')?.1;
        out.push(rest.split_whitespace().nth(16)?.parse().ok()?);
    }
    Some(out)
}

#[test]
fn the_compactor_process_runs_at_its_nice_value() {
    for (flags, want) in [(&[][..], 10), (&["--nice", "3"][..], 3)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args = vec![
            "compactor",
            // Nothing answers here: the compactor keeps retrying, running.
            "--catalog",
            "127.0.0.1:9",
            "--compactor-listen",
            "127.0.0.1:0",
            "--data-dir",
        ];
        args.push(dir.path().to_str().expect("path"));
        args.extend_from_slice(flags);
        let mut child = Command::new(env!("CARGO_BIN_EXE_mira"))
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn mira compactor");
        // Wait (bounded) for every thread, the runtime's included, to be
        // at the wanted value.
        let mut last = None;
        for _ in 0..600 {
            last = thread_nices(child.id());
            if last
                .as_ref()
                .is_some_and(|n| n.len() > 1 && n.iter().all(|&v| v == want))
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let exited = child.try_wait().expect("try_wait");
        let _ = child.kill();
        let _ = child.wait();
        assert!(exited.is_none(), "{flags:?}: the compactor exited: {exited:?}");
        let nices = last.expect("threads");
        assert!(
            nices.len() > 1 && nices.iter().all(|&v| v == want),
            "{flags:?}: thread nice values {nices:?}, want {want}"
        );
    }
}

#[test]
fn the_operator_takes_the_flags_the_chart_passes_and_names_bad_ones() {
    let out = ok(&["operator", "--check-config"], &[]);
    assert_eq!(value(&out, "operator", "listen"), "0.0.0.0:8080");
    assert_eq!(value(&out, "operator", "leader_elect"), "true");
    assert_eq!(value(&out, "operator", "lease_name"), "mira-operator");
    assert_eq!(value(&out, "operator", "requeue_s"), "300");
    assert_eq!(value(&out, "operator", "catalog_timeout_ms"), "5000");
    assert_eq!(value(&out, "operator", "namespace_annotation"), "true");
    let out = ok(
        &[
            "operator",
            "--check-config",
            "--catalog",
            "c-0:7400,c-1:7400",
            "--listen",
            "127.0.0.1:9090",
            "--namespace",
            "team-a",
            "--leader-elect",
            "false",
            "--requeue-s",
            "60",
            "--catalog-timeout-ms",
            "800",
            "--kubeconfig",
            "/tmp/kubeconfig",
            "--namespace-tenants",
            "team-a=team-a,team-a-dev;team-b=team-b",
            "--namespace-tenants",
            "team-c=team-c",
            "--namespace-annotation",
            "false",
        ],
        &[("POD_NAMESPACE", "mira"), ("POD_NAME", "mira-operator-7d9")],
    );
    let grants = value(&out, "operator", "namespace_tenants");
    for entry in ["team-a=team-a,team-a-dev", "team-b=team-b", "team-c=team-c"] {
        assert!(grants.contains(&format!("\"{entry}\"")), "{grants}");
    }
    assert_eq!(value(&out, "operator", "namespace_annotation"), "false");
    assert_eq!(value(&out, "operator", "catalog"), "c-0:7400,c-1:7400");
    assert_eq!(value(&out, "operator", "namespace"), "team-a");
    assert_eq!(value(&out, "operator", "leader_elect"), "false");
    assert_eq!(value(&out, "operator", "lease_namespace"), "mira");
    assert_eq!(value(&out, "operator", "identity"), "mira-operator-7d9");
    assert_eq!(value(&out, "operator", "requeue_s"), "60");
    assert_eq!(value(&out, "operator", "kubeconfig"), "/tmp/kubeconfig");
    for (args, field) in [
        (&["operator", "--requeue-s", "0"][..], "operator.requeue_s"),
        (
            &["operator", "--catalog-timeout-ms", "5"][..],
            "operator.catalog_timeout_ms",
        ),
        (&["operator", "--namespace", "Team_A"][..], "operator.namespace"),
        (&["operator", "--catalog", ","][..], "operator.catalog"),
        (
            &["operator", "--namespace-tenants", "team-a=*"][..],
            "operator.namespace_tenants",
        ),
    ] {
        let err = refused(&[args, &["--check-config"]].concat(), &[]);
        assert!(err.contains(field), "{args:?}: {err}");
    }
}

#[test]
fn mira_crd_prints_the_committed_crd() {
    let out = ok(&["crd"], &[]);
    let committed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/mira/crds/miraretentionpolicies.mira.dev.yaml");
    assert_eq!(out, std::fs::read_to_string(committed).expect("the committed CRD"));
}
