//! `mira smoke` (the Helm chart's `helm test`) against a real `mira
//! serve`: it finds what it wrote through all three query APIs, only for
//! its tenant; it fails with a message naming the signal and the answer
//! when the records cannot be read back or the export is refused; bad
//! flags are refused before anything is sent.

#[path = "support/procs.rs"]
mod procs;

use std::process::Command;

use mira_testkit::http::{self, wait_ready};
use procs::{Procs, Role, bin};

fn serve() -> Procs {
    let mut p = Procs::new();
    let i = p.add(Role::Serve, &[]);
    p.start(i);
    p
}

fn smoke(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .arg("smoke")
        .args(args)
        .output()
        .expect("run mira smoke");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn loki_lines(body: &[u8]) -> usize {
    let v: serde_json::Value = serde_json::from_slice(body).expect("json");
    v["data"]["result"]
        .as_array()
        .expect("result")
        .iter()
        .map(|s| s["values"].as_array().map_or(0, Vec::len))
        .sum()
}

#[tokio::test]
async fn smoke_writes_and_reads_back_every_signal_for_its_tenant_only() {
    let p = serve();
    wait_ready(&p[0].addr).await;
    let otlp = format!("http://{}", p[0].http);
    let query = format!("http://{}", p[0].addr);
    let (code, out, err) = smoke(&[
        "--otlp",
        &otlp,
        "--query",
        &query,
        "--tenant",
        "smoke-a",
        "--timeout",
        "60s",
    ]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}\n{}", p.logs());
    for s in [
        "logs: found",
        "traces: found",
        "metrics: found",
        "ok: logs, traces and metrics",
    ] {
        assert!(out.contains(s), "{out}");
    }
    // What it wrote is really there, for its tenant and no other.
    let path = "/loki/api/v1/query_range?query=%7Bservice_name%3D%22mira-smoke%22%7D&limit=100&since=2h";
    let mine = http::request("GET", &p[0].addr, path, &[("X-Scope-OrgID", "smoke-a")], Vec::new())
        .await
        .expect("query");
    assert_eq!(mine.status, 200);
    assert_eq!(loki_lines(&mine.body), 1, "{}", String::from_utf8_lossy(&mine.body));
    let other = http::request("GET", &p[0].addr, path, &[("X-Scope-OrgID", "smoke-b")], Vec::new())
        .await
        .expect("query");
    assert_eq!(loki_lines(&other.body), 0);
    // A second run marks its own records: it passes again, finding its own.
    let (code, out2, _) = smoke(&[
        "--otlp",
        &otlp,
        "--query",
        &query,
        "--tenant",
        "smoke-a",
        "--timeout",
        "60s",
    ]);
    assert_eq!(code, 0);
    assert_ne!(out.lines().next(), out2.lines().next(), "each run has its own id");
}

#[tokio::test]
async fn smoke_fails_naming_each_signal_when_nothing_can_be_read_back() {
    let p = serve();
    wait_ready(&p[0].addr).await;
    let otlp = format!("http://{}", p[0].http);
    // The OTLP/HTTP port answers 404 to the query APIs' paths.
    let (code, out, err) = smoke(&["--otlp", &otlp, "--query", &otlp, "--timeout", "2s"]);
    assert_eq!(code, 1, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("sent: 1 log record, 1 span, 1 gauge point"), "{out}");
    for s in [
        "logs: the marked record was not found",
        "traces: the marked",
        "metrics: the marked",
        "HTTP 404",
    ] {
        assert!(err.contains(s), "{s:?} not in {err}");
    }
}

#[tokio::test]
async fn smoke_fails_at_once_when_the_export_is_refused() {
    let p = serve();
    wait_ready(&p[0].addr).await;
    let query = format!("http://{}", p[0].addr);
    // The query port has no /v1/logs: a 4xx other than 429 is not retried.
    let (code, _, err) = smoke(&["--otlp", &query, "--query", &query, "--timeout", "60s"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("export to {query}/v1/logs refused: HTTP 4")),
        "{err}"
    );
}

/// `mira serve --auth tokens` over TLS, with a tokens file granting
/// `smoke-a` to the returned token.
fn serve_with_tokens_and_tls() -> (Procs, String, std::path::PathBuf) {
    use mira_testkit::certs::Ca;
    let mut p = Procs::new();
    let dir = p.root.path().join("secrets");
    std::fs::create_dir_all(&dir).expect("test setup");
    let ca = Ca::new("smoke CA");
    let ca_file = ca.write(&dir, "ca.crt");
    let (cert, key) = ca.leaf("mira").write(&dir, "server");
    let token = "smoke-token-5f1c0e9a7b3d4c2e8a6f";
    let tokens = dir.join("tokens.toml");
    procs::write_tokens(&tokens, "smoke", token, "smoke-a");
    let s = |p: &std::path::Path| p.display().to_string();
    let flags = [
        "--auth".to_owned(),
        "tokens".to_owned(),
        "--auth-tokens-file".to_owned(),
        s(&tokens),
        "--tls-cert".to_owned(),
        s(&cert),
        "--tls-key".to_owned(),
        s(&key),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let i = p.add(Role::Serve, &flags);
    p.start(i);
    (p, token.to_owned(), ca_file)
}

#[tokio::test]
async fn smoke_sends_its_token_and_trusts_its_ca_over_tls() {
    let (p, token, ca) = serve_with_tokens_and_tls();
    wait_ready(&p[0].addr).await;
    let dir = p.root.path().join("secrets");
    let token_file = dir.join("smoke-token");
    std::fs::write(&token_file, format!("{token}\n")).expect("test setup");
    let otlp = format!("https://{}", p[0].http);
    let query = format!("https://{}", p[0].addr);
    let ca = ca.display().to_string();
    let tf = token_file.display().to_string();
    let base = [
        "--otlp",
        &otlp,
        "--query",
        &query,
        "--tenant",
        "smoke-a",
        "--timeout",
        "60s",
    ];
    let with = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        smoke(&a)
    };
    let (code, out, err) = with(&["--token-file", &tf, "--ca", &ca]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}\n{}", p.logs());
    assert!(out.contains("ok: logs, traces and metrics"), "{out}");
    // Without the token: the ingester's 401 fails the export at once.
    let (code, _, err) = with(&["--ca", &ca]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("refused: HTTP 401"), "{err}");
    // A tenant the token does not grant: 403.
    let mut a = base.to_vec();
    a[5] = "smoke-b";
    a.extend_from_slice(&["--token-file", &tf, "--ca", &ca]);
    let (code, _, err) = smoke(&a);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("refused: HTTP 403"), "{err}");
    // Without the CA the server's certificate is not trusted: nothing is
    // accepted before the timeout, and the answer names the TLS failure.
    let (code, _, err) = smoke(&[
        "--otlp",
        &otlp,
        "--query",
        &query,
        "--tenant",
        "smoke-a",
        "--timeout",
        "2s",
        "--token-file",
        &tf,
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("did not succeed before the timeout"), "{err}");
}

#[test]
fn bad_token_and_ca_files_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).expect("test setup");
        p.display().to_string()
    };
    let empty = write("empty", b"  \n");
    let two = write("two", b"one two\n");
    let huge = write("huge", &vec![b'a'; 10_000]);
    let not_pem = write("ca.txt", b"not a certificate");
    let missing = dir.path().join("missing").display().to_string();
    let base = ["--otlp", "http://h:1", "--query", "http://h:1"];
    for (flag, file) in [
        ("--token-file", &empty),
        ("--token-file", &two),
        ("--token-file", &huge),
        ("--token-file", &missing),
        ("--ca", &not_pem),
        ("--ca", &missing),
    ] {
        let mut a = base.to_vec();
        a.extend_from_slice(&[flag, file]);
        let (code, out, err) = smoke(&a);
        assert_eq!(code, 2, "{flag} {file}: {out} {err}");
        assert!(err.contains(flag), "{flag} {file}: {err}");
        assert!(!out.contains("sent:"));
    }
}

#[test]
fn bad_flags_are_refused_by_name_before_anything_is_sent() {
    let long_tenant = "t".repeat(200);
    for (args, word) in [
        (vec!["--otlp", "ftp://h:1", "--query", "http://h:1"], "--otlp"),
        (vec!["--otlp", "h:4318", "--query", "http://h:1"], "--otlp"),
        (vec!["--otlp", "http://h:1", "--query", "http://h:1/?x=1"], "--query"),
        (vec!["--otlp", "http://h:1", "--query", "http://"], "--query"),
        (
            vec!["--otlp", "http://h:1", "--query", "http://h:1", "--tenant", "../etc"],
            "--tenant",
        ),
        (
            vec![
                "--otlp",
                "http://h:1",
                "--query",
                "http://h:1",
                "--tenant",
                &long_tenant,
            ],
            "--tenant",
        ),
        (
            vec!["--otlp", "http://h:1", "--query", "http://h:1", "--timeout", "0s"],
            "--timeout",
        ),
    ] {
        let (code, out, err) = smoke(&args);
        assert_eq!(code, 2, "{args:?}: {out} {err}");
        assert!(err.contains(word), "{args:?}: {err}");
        assert!(!out.contains("sent:"), "{args:?}");
    }
    let (code, _, err) = smoke(&["--otlp", "http://h:1", "--query", "http://h:1", "--timeout", "soon"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--timeout"), "{err}");
}
