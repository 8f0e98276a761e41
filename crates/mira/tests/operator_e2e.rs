//! The operator end to end, every part a real process but Kubernetes:
//! `mira serve` (catalog, ingester, querier and the embedded compactor on a
//! test clock) and `mira operator --kubeconfig` against a fake Kubernetes
//! API served over HTTP by the test (`support/fake_kube.rs`), with leader
//! election on (the operator takes the Lease from the fake first).
//!
//! An object applied → the operator adds its finalizer and writes catalog
//! policy `k8s/<ns>/<name>` (`mira policy list` shows it) → records
//! ingested, the test clock moved past `retain` → the compactor tombstones
//! them → the object's status (read back from the fake) is Ready=True with
//! the dropped counts → the object deleted → the operator deletes the
//! catalog policy and removes its finalizer, and the object is gone.

#![cfg(feature = "fault-hooks")]

#[path = "support/fake_kube.rs"]
mod fake_kube;
#[path = "support/procs.rs"]
mod procs;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fake_kube::FakeKube;
use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientConfig};
use mira_testkit::http::{self, wait_ready};
use mira_testkit::net::{free_port, wait_for};
use procs::{Procs, Role, request, terminate};
use serde_json::{Value, json};

const NS: &str = "team-a";
const NAME: &str = "logs-1d";
const POLICY: &str = "k8s/team-a/logs-1d";
/// An object offloading to a target no compactor can reach.
const ARCHIVE: &str = "archive-30d";
const LIMIT: Duration = Duration::from_secs(30);

/// The operator process; killed when dropped.
struct Operator(Option<Child>);

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `mira policy list --output json`.
fn policy_list(catalog: &str) -> Value {
    let out = Command::new(procs::bin())
        .args(["policy", "list", "--catalog", catalog, "--output", "json"])
        .output()
        .expect("mira policy list");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("json")
}

/// `mira policy list --output json`: the policies' names.
fn policy_names(catalog: &str) -> Vec<String> {
    let v = policy_list(catalog);
    v["policies"]
        .as_array()
        .expect("policies")
        .iter()
        .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn condition(obj: &Value, type_: &str) -> Option<Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_object_becomes_a_catalog_policy_that_is_enforced_and_deleted_with_it() {
    let mut p = Procs::new();
    let root = p.root.path().to_path_buf();
    let clock = root.join("clock");
    std::fs::write(&clock, "0s").expect("clock");
    let clock_env = clock.to_str().expect("path").to_owned();
    // An offload target nothing answers for (a free port): registered by
    // the embedded compactor with a failed reachability check.
    let endpoint = format!("aws_endpoint=http://127.0.0.1:{}", free_port());
    let serve = p.add(
        Role::Serve,
        &[
            "--offload-target",
            "archive=s3://archive-bucket/mira",
            "--offload-target-option",
            &endpoint,
            "--offload-target-option",
            "aws_allow_http=true",
            "--offload-target-option",
            "aws_access_key_id=AKIDEXAMPLE",
            "--offload-target-option",
            "aws_secret_access_key=do-not-leak",
            "--offload-target-option",
            "aws_region=us-east-1",
            "--shards",
            "1",
            "--seal-age",
            "1s",
            "--plan-interval",
            "1s",
            "--min-block-age",
            "0s",
            "--deletion-grace",
            "0s",
            "--settle",
            "0s",
            "--catalog-share-percent",
            "100",
        ],
    );
    p[serve].env = vec![("MIRA_TEST_CLOCK_FILE".to_owned(), clock_env)];
    p.start(serve);
    let member = p[serve].member.clone();
    wait_ready(&p[serve].addr).await;

    let kube = FakeKube::start().await;
    let kubeconfig = root.join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).expect("kubeconfig");
    kube.apply(
        NS,
        NAME,
        json!({"tenant": "default", "signals": ["logs"], "retain": "1d"}),
    );
    // Another tenant's (no data), offloading to the unreachable target.
    kube.apply(
        NS,
        ARCHIVE,
        json!({"tenant": "other", "retain": "30d", "offload": {"after": "7d", "target": "archive"}}),
    );

    let http_addr = p[serve].http.clone();
    let answer = http::post(
        &http_addr,
        "/v1/logs",
        &[("Content-Type", "application/x-protobuf")],
        request(0, 50),
    )
    .await
    .expect("serve answers");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let catalog = CatalogClient::new(vec![member.clone()], ClientConfig::default());
    let live = |states: Vec<i32>| {
        let catalog = &catalog;
        async move {
            catalog
                .list_blocks(pb::ListBlocksRequest {
                    tenant: "default".into(),
                    signal: pb::Signal::Logs as i32,
                    min_time_ns: 0,
                    max_time_ns: i64::MAX,
                    states,
                    linearizable: false,
                    ..Default::default()
                })
                .await
                .map(|r| r.blocks)
                .unwrap_or_default()
        }
    };
    wait_for("a published block", LIMIT, || async {
        (!live(vec![pb::BlockState::Live as i32]).await.is_empty()).then_some(())
    })
    .await;

    let listen = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(root.join("operator.log")).expect("log");
    let mut operator = Operator(Some(
        Command::new(procs::bin())
            .args([
                "operator",
                "--kubeconfig",
                kubeconfig.to_str().expect("path"),
                "--catalog",
                &member,
                "--listen",
                &listen,
                "--identity",
                "op-e2e",
                "--requeue-s",
                "10",
                // The objects are in team-a, the operator's namespace is
                // `default`: team-a is granted the two tenants it names.
                "--namespace-tenants",
                "team-a=default,other",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn mira operator"),
    ));
    // Ready once it found the CRD (its list answered).
    wait_ready(&listen).await;

    // The finalizer first, then the policy, then the status.
    wait_for("the finalizer", LIMIT, || async {
        let obj = kube.object(NS, NAME)?;
        (obj["metadata"]["finalizers"] == json!(["mira.dev/catalog-policy"])).then_some(())
    })
    .await;
    wait_for("the policy in `mira policy list`", LIMIT, || async {
        policy_names(&member).iter().any(|n| n == POLICY).then_some(())
    })
    .await;
    let obj = wait_for("Ready=True", LIMIT, || async {
        let obj = kube.object(NS, NAME)?;
        (condition(&obj, "Ready")?["status"] == "True").then_some(obj)
    })
    .await;
    let ready = condition(&obj, "Ready").expect("Ready");
    assert_eq!(ready["reason"], "Applied", "{obj}");
    assert_eq!(obj["status"]["catalogPolicy"], POLICY, "{obj}");
    assert_eq!(obj["status"]["observedGeneration"], 1, "{obj}");
    assert!(obj["status"]["blocksDropped"].is_null(), "nothing enforced yet: {obj}");
    let lease = kube
        .lease("default", "mira-operator")
        .expect("the operator took the Lease");
    assert_eq!(lease["spec"]["holderIdentity"], "op-e2e", "{lease}");

    // The compactor's check of the target, as `mira policy list` shows it;
    // once it is in the catalog the object with offload says why.
    let check = wait_for("the target's check in the catalog", LIMIT, || async {
        policy_list(&member)["offload_target_checks"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == "archive")
            .cloned()
    })
    .await;
    assert_eq!(check["reachable"], false, "{check}");
    let error = check["error"].as_str().expect("an error").to_owned();
    assert!(!error.is_empty() && !error.contains("do-not-leak"), "{check}");
    kube.annotate(NS, ARCHIVE, "e2e/nudge", "1");
    let obj = wait_for("OffloadTargetReady=False, TargetUnreachable", LIMIT, || async {
        let obj = kube.object(NS, ARCHIVE)?;
        (condition(&obj, "OffloadTargetReady")?["reason"] == "TargetUnreachable").then_some(obj)
    })
    .await;
    let target = condition(&obj, "OffloadTargetReady").expect("OffloadTargetReady");
    assert_eq!(target["status"], "False", "{obj}");
    assert!(target["message"].as_str().is_some_and(|m| m.contains(&error)), "{obj}");
    assert_eq!(
        condition(&obj, "Ready").expect("Ready")["reason"],
        "OffloadTargetNotReady",
        "{obj}"
    );

    // Three days later (to serve) the records are past `retain`.
    std::fs::write(&clock, "3d").expect("move the clock");
    wait_for("the compactor to tombstone every block", LIMIT, || async {
        (live(vec![pb::BlockState::Live as i32]).await.is_empty()
            && !live(vec![pb::BlockState::Tombstoned as i32]).await.is_empty())
        .then_some(())
    })
    .await;
    wait_for("the compactor to report the policy's counts", LIMIT, || async {
        let reply = catalog.list_policies(pb::ListPoliciesRequest::default()).await.ok()?;
        let p = reply.policies.into_iter().find(|p| p.name == POLICY)?;
        let status: Value = serde_json::from_str(&p.status_json).ok()?;
        (status["blocks_dropped"].as_u64()? > 0).then_some(())
    })
    .await;
    // A change of the object has it reconciled now, not at its requeue.
    kube.annotate(NS, NAME, "e2e/nudge", "1");
    let obj = wait_for("the dropped counts in the status", LIMIT, || async {
        let obj = kube.object(NS, NAME)?;
        (obj["status"]["blocksDropped"].as_i64()? > 0).then_some(obj)
    })
    .await;
    assert!(obj["status"]["bytesDropped"].as_i64().is_some_and(|b| b > 0), "{obj}");
    assert!(obj["status"]["rowsDropped"].as_i64().is_some_and(|r| r > 0), "{obj}");
    assert!(obj["status"]["lastEnforced"].is_string(), "{obj}");
    assert_eq!(condition(&obj, "Ready").expect("Ready")["status"], "True", "{obj}");

    // Delete: the policy goes, then the finalizer, then the object.
    kube.delete(NS, NAME);
    wait_for("the object to be gone", LIMIT, || async {
        kube.object(NS, NAME).is_none().then_some(())
    })
    .await;
    assert!(
        !policy_names(&member).iter().any(|n| n == POLICY),
        "the catalog policy is deleted before the finalizer"
    );
    let reasons = |name: &str| -> Vec<String> {
        kube.events()
            .iter()
            .filter(|e| e["regarding"]["name"] == name)
            .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(reasons(NAME), ["Applied", "Deleted"], "events on transitions only");
    // OffloadTargetNotFound first when the operator got there before the
    // compactor's registration.
    let archive = reasons(ARCHIVE);
    assert_eq!(
        archive.last().map(String::as_str),
        Some("OffloadTargetUnreachable"),
        "{archive:?}"
    );

    // The operator watched (a long-poll after its list) and renewed the
    // Lease it created.
    let requests = kube.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("GET /apis/mira.dev/v1alpha1/miraretentionpolicies?") && r.contains("watch=true")),
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("POST /apis/coordination.k8s.io/v1/namespaces/default/leases")),
        "{requests:?}"
    );

    // A graceful stop releases the Lease.
    let mut child = operator.0.take().expect("running");
    terminate(&child);
    let status = procs::child_exit(&mut child, "mira operator");
    assert!(status.success(), "{status:?}");
    let lease = kube.lease("default", "mira-operator").expect("the Lease");
    assert_ne!(lease["spec"]["holderIdentity"], "op-e2e", "released: {lease}");
}
