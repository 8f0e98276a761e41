//! The internal ports are not open doors (docs/security.md): real
//! processes whose catalog (Raft and client API) and ingester (recent
//! data) refuse a forged Raft message, an admin call and a recent-data
//! request without the cluster credential, counted in
//! `mira_cluster_refused_total`; the cluster's own traffic (ingester →
//! catalog, querier → catalog and ingesters, the CLI) sends it; members
//! that speak TLS and recognise each other by certificate alone (mutual
//! TLS, no secret).

#[path = "support/procs.rs"]
mod procs;

use std::time::Duration;

use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientConfig};
use mira_common::security::{Exposure, SecuritySettings};
use mira_proto::ingester as ipb;
use mira_testkit::certs::Ca;
use mira_testkit::http::{self, wait_ready};
use mira_testkit::net::wait_for;
use mira_testkit::otlp::log_export;
use mira_testkit::recent_base_time as t0;
use procs::{INGESTER, Procs, Role, SECRET_ENV, bin};
use tonic::Code;

const PB: (&str, &str) = ("content-type", "application/x-protobuf");

fn with_secret<T>(msg: T, secret: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert(mira_common::cluster::SECRET_HEADER, secret.parse().expect("ascii"));
    r
}

async fn metrics(addr: &str) -> String {
    http::get(addr, "/metrics").await.map(|r| r.text()).unwrap_or_default()
}

/// `name{service="s"} N` of a Prometheus text.
fn counter(text: &str, name: &str, service: &str) -> u64 {
    let prefix = format!("{name}{{service=\"{service}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_ports_refuse_callers_without_the_cluster_secret_and_count_them() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    let q = p.add(Role::Querier, &["--query-threads", "2"]);
    p.start(q);
    let query = p[q].addr.clone();
    wait_ready(&query).await;

    // The cluster's own traffic carries the secret: an export is
    // acknowledged (the ingester holds its lease in the catalog) and the
    // querier answers it (catalog and recent data).
    let body = log_export(&[("service.name", "svc")], [(1, "guarded".to_owned())]);
    let status = http::post(p.http(), "/v1/logs", &[PB], body).await.map(|r| r.status);
    assert_eq!(status, Some(200));
    let path = format!("/api/mira/v1/logs?start={}&end={}&limit=10", t0(), t0() + 1_000_000_000);
    wait_for("the querier to answer the line", Duration::from_secs(60), || async {
        let r = http::get(&query, &path).await?;
        (r.status == 200 && r.text().contains("guarded")).then_some(())
    })
    .await;

    let catalog = format!("http://{}", p.catalog_addr());
    let grpc = format!("http://{}", p[INGESTER].grpc);
    let forged = pb::RaftRequest {
        cluster_id: "mira".to_owned(),
        payload: vec![0xde, 0xad, 0xbe, 0xef],
    };
    let mut raft = pb::raft_client::RaftClient::connect(catalog.clone())
        .await
        .expect("connect");
    let mut admin = pb::catalog_client::CatalogClient::connect(catalog.clone())
        .await
        .expect("connect");
    let mut recent = ipb::recent_client::RecentClient::connect(grpc.clone())
        .await
        .expect("connect");
    let ask = ipb::RecentRequest {
        tenant: "default".to_owned(),
        signal: pb::Signal::Logs as i32,
        min_time_ns: 0,
        max_time_ns: i64::MAX,
    };
    // A forged Raft message, with no secret and with a wrong one.
    for r in [
        tonic::Request::new(forged.clone()),
        with_secret(forged.clone(), "harness-cluster-secret-0123456780"),
        with_secret(forged.clone(), "harness-cluster-secret-0123456789 "),
    ] {
        let e = raft.append_entries(r).await.expect_err("forged Raft message");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    }
    let e = raft.vote(tonic::Request::new(forged.clone())).await.expect_err("vote");
    assert_eq!(e.code(), Code::Unauthenticated);
    // Admin calls and writes.
    let e = admin
        .change_membership(pb::ChangeMembershipRequest {
            members: vec![pb::Member {
                id: 9,
                address: "10.0.0.9:7400".to_owned(),
                voter: true,
                incarnation: String::new(),
            }],
        })
        .await
        .expect_err("membership change");
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("cluster"), "{}", e.message());
    let e = admin
        .trigger_snapshot(pb::TriggerSnapshotRequest {})
        .await
        .expect_err("snapshot");
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = admin
        .list_blocks(pb::ListBlocksRequest {
            tenant: "default".to_owned(),
            max_time_ns: i64::MAX,
            ..Default::default()
        })
        .await
        .expect_err("a read");
    assert_eq!(e.code(), Code::Unauthenticated);
    // Recent data of any tenant.
    let e = recent.query(ask.clone()).await.expect_err("recent data");
    assert_eq!(e.code(), Code::Unauthenticated);
    recent
        .query(with_secret(ask, "harness-cluster-secret-0123456789"))
        .await
        .expect("with the secret");
    // The secret lets the same calls through.
    admin
        .status(with_secret(pb::StatusRequest {}, "harness-cluster-secret-0123456789"))
        .await
        .expect("status with the secret");

    // Counted, by service.
    let m = metrics(p.catalog_addr()).await;
    assert!(counter(&m, "mira_cluster_refused_total", "raft") >= 4, "{m}");
    assert!(counter(&m, "mira_cluster_refused_total", "catalog") >= 3, "{m}");
    let m = metrics(p.http()).await;
    assert!(counter(&m, "mira_cluster_refused_total", "recent") >= 1, "{m}");

    // The CLI: refused without the secret, served with it.
    let out = std::process::Command::new(bin())
        .args(["catalog-admin", "--catalog", p.catalog_addr(), "status"])
        .env_remove(SECRET_ENV)
        .output()
        .expect("catalog-admin");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cluster"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = p
        .cli()
        .args(["catalog-admin", "--catalog", p.catalog_addr(), "status"])
        .output()
        .expect("catalog-admin");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn members_without_a_cluster_credential_refuse_to_start() {
    let dir = tempfile::tempdir().expect("test setup");
    for role in ["catalog", "ingester"] {
        let out = std::process::Command::new(bin())
            .args([role, "--check-config", "--data-dir"])
            .arg(dir.path())
            .env_remove(SECRET_ENV)
            .output()
            .expect("mira");
        assert!(!out.status.success(), "{role} started without a credential");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--cluster-secret-file") && err.contains("--insecure-cluster"),
            "{role}: {err}"
        );
    }
    let short = dir.path().join("short");
    std::fs::write(&short, "tiny").expect("test setup");
    let out = std::process::Command::new(bin())
        .args(["catalog", "--data-dir"])
        .arg(dir.path())
        .arg("--cluster-secret-file")
        .arg(&short)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .expect("mira");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 16") && err.contains("short"), "{err}");
}

/// `mira serve --auth tokens` without a secret file makes one and its own
/// querier sends it, so a line not yet published is answered; a caller on
/// loopback (any process in the pod, or a remote client a mesh sidecar
/// forwards from 127.0.0.6) gets UNAUTHENTICATED from the recent-data
/// service without it, even with a tenant's token. Before issue 29 item 6
/// serve trusted every loopback peer and answered every tenant's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_auth_trusts_no_loopback_peer_without_its_secret() {
    let mut p = Procs::new();
    let token = "serve-token-0c4e1f9a2b7d6e3f5a8c";
    let tokens = p.root.path().join("tokens.toml");
    procs::write_tokens(&tokens, "a", token, "team-a");
    let tokens = tokens.display().to_string();
    let i = p.add(Role::Serve, &[]);
    // No secret file: serve makes its own.
    p.start_with(
        i,
        &[
            "--no-compactor",
            "--auth",
            "tokens",
            "--auth-tokens-file",
            &tokens,
            "--seal-age",
            "1h",
        ],
        &[(SECRET_ENV, "")],
    );
    let query = p[i].addr.clone();
    wait_ready(&query).await;
    let bearer = format!("Bearer {token}");
    let auth = ("authorization", bearer.as_str());
    let org = ("X-Scope-OrgID", "team-a");
    let body = log_export(&[("service.name", "svc")], [(1, "unpublished".to_owned())]);
    let status = http::post(&p[i].http, "/v1/logs", &[PB, auth, org], body)
        .await
        .map(|r| r.status);
    assert_eq!(status, Some(200));
    let path = format!("/api/mira/v1/logs?start={}&end={}&limit=10", t0(), t0() + 1_000_000_000);
    wait_for(
        "serve's querier to answer the recent line",
        Duration::from_secs(60),
        || async {
            let r = http::request("GET", &query, &path, &[auth, org], Vec::new()).await?;
            (r.status == 200 && r.text().contains("unpublished")).then_some(())
        },
    )
    .await;

    let grpc = format!("http://{}", p[i].grpc);
    let mut recent = ipb::recent_client::RecentClient::connect(grpc).await.expect("connect");
    let ask = ipb::RecentRequest {
        tenant: "team-a".to_owned(),
        signal: pb::Signal::Logs as i32,
        min_time_ns: 0,
        max_time_ns: i64::MAX,
    };
    let e = recent.query(ask.clone()).await.expect_err("recent data from loopback");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("cluster"), "{}", e.message());
    let mut with_token = tonic::Request::new(ask.clone());
    with_token
        .metadata_mut()
        .insert("authorization", bearer.parse().expect("ascii"));
    let e = recent
        .query(with_token)
        .await
        .expect_err("a tenant token is no cluster credential");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = recent
        .query(with_secret(ask, "harness-cluster-secret-0123456789"))
        .await
        .expect_err("another cluster's secret");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let m = metrics(&p[i].http).await;
    assert!(counter(&m, "mira_cluster_refused_total", "recent") >= 3, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_over_tls_recognise_each_other_by_certificate_alone() {
    let mut p = Procs::new();
    let certs = p.root.path().join("certs");
    std::fs::create_dir_all(&certs).expect("test setup");
    let server_ca = Ca::new("server CA");
    let cluster_ca = Ca::new("cluster CA");
    let ca = server_ca.write(&certs, "ca.crt");
    let cluster = cluster_ca.write(&certs, "cluster-ca.crt");
    // One certificate per process, signed by both: it serves (server CA)
    // and is presented as a member's (cluster CA). Here the member
    // certificate doubles as the server's.
    let both = certs.join("both-ca.crt");
    std::fs::write(&both, format!("{}{}", server_ca.pem(), cluster_ca.pem())).expect("test setup");
    let (cert, key) = cluster_ca.leaf("member").write(&certs, "member");
    let s = |p: &std::path::Path| p.display().to_string();
    let flags = [
        "--tls-cert".to_owned(),
        s(&cert),
        "--tls-key".to_owned(),
        s(&key),
        "--tls-ca".to_owned(),
        s(&both),
        "--cluster-ca".to_owned(),
        s(&cluster),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let c = p.add(Role::Catalog, &flags);
    let i = p.add(Role::Ingester, &flags);
    for k in [c, i] {
        p[k].env = vec![(SECRET_ENV.to_owned(), String::new())];
    }
    p.start(c);
    p.start(i);
    let _ = ca;

    let client = |tls_cert: Option<(&std::path::Path, &std::path::Path)>| {
        let settings = SecuritySettings {
            tls_ca: Some(both.clone()),
            tls_cert: tls_cert.map(|(c, _)| c.to_path_buf()),
            tls_key: tls_cert.map(|(_, k)| k.to_path_buf()),
            ..SecuritySettings::default()
        };
        let dialer = settings
            .build(
                Exposure::Client,
                mira_common::clock::Clock::system(),
                &mira_common::telemetry::Telemetry::new(),
            )
            .expect("dialer")
            .dialer;
        CatalogClient::new(
            vec![p[c].addr.clone()],
            ClientConfig {
                timeout: Duration::from_secs(3),
                attempt_timeout: Duration::from_secs(1),
                dialer,
                ..ClientConfig::default()
            },
        )
    };
    // A member (certificate of the cluster CA): the ingester registered
    // itself over mutual TLS, with no secret anywhere.
    let member = client(Some((&cert, &key)));
    wait_for(
        "the ingester's lease over mutual TLS",
        Duration::from_secs(60),
        || async {
            let r = member.list_ingesters(pb::ListIngestersRequest::default()).await.ok()?;
            r.ingesters.iter().any(|l| l.ingester_id == "ingester-0").then_some(())
        },
    )
    .await;
    // TLS without a member certificate: refused as unauthenticated.
    match client(None).status_of_first().await {
        Err(mira_catalog::ClientError::Rejected(s)) => assert_eq!(s.code(), Code::Unauthenticated),
        other => panic!("a non-member was answered: {other:?}"),
    }
    // A certificate of another CA does not even complete the handshake.
    let stranger = server_ca.leaf("stranger").write(&certs, "stranger");
    assert!(
        client(Some((&stranger.0, &stranger.1)))
            .status_of_first()
            .await
            .is_err()
    );
    // The ingester's recent data over TLS, dialled the way the querier
    // dials it: a member certificate is answered, TLS alone is not.
    let dialer = |tls_cert: Option<(&std::path::Path, &std::path::Path)>| {
        SecuritySettings {
            tls_ca: Some(both.clone()),
            tls_cert: tls_cert.map(|(c, _)| c.to_path_buf()),
            tls_key: tls_cert.map(|(_, k)| k.to_path_buf()),
            ..SecuritySettings::default()
        }
        .build(
            Exposure::Client,
            mira_common::clock::Clock::system(),
            &mira_common::telemetry::Telemetry::new(),
        )
        .expect("dialer")
        .dialer
    };
    let ask = ipb::RecentRequest {
        tenant: "default".to_owned(),
        signal: pb::Signal::Logs as i32,
        min_time_ns: 0,
        max_time_ns: i64::MAX,
    };
    let grpc = p[i].grpc.clone();
    let member_dialer = dialer(Some((&cert, &key)));
    wait_for("recent data over mutual TLS", Duration::from_secs(60), || async {
        let channel = member_dialer.channel(&grpc, Duration::from_secs(1)).ok()?;
        ipb::recent_client::RecentClient::new(channel)
            .query(ask.clone())
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    let channel = dialer(None).channel(&grpc, Duration::from_secs(1)).expect("channel");
    let e = ipb::recent_client::RecentClient::new(channel)
        .query(ask)
        .await
        .expect_err("TLS without a member certificate");
    assert_eq!(e.code(), Code::Unauthenticated);
    // Plain TCP to a TLS port gets nowhere.
    let plain = CatalogClient::new(
        vec![p[c].addr.clone()],
        ClientConfig {
            timeout: Duration::from_secs(2),
            attempt_timeout: Duration::from_secs(1),
            ..ClientConfig::default()
        },
    );
    assert!(plain.status_of_first().await.is_err());
}
