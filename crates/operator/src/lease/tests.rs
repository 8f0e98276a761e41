//! Leader election: the pure decision table, then electors against one
//! Lease kept by a small fake API server (`tower_test` mocks, one per
//! replica, sharing the Lease), under paused tokio time: requests are
//! checked by method, path and body, and the handover between two
//! replicas follows the lease's timings, not the wall clock.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use k8s_openapi::api::coordination::v1::Lease;
use kube::client::Body;
use kube::{Api, Client};
use serde_json::{Value, json};

use super::*;
use crate::fixtures::json_response;

fn spec(holder: &str, seconds: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: (!holder.is_empty()).then(|| holder.to_owned()),
        lease_duration_seconds: Some(seconds),
        ..LeaseSpec::default()
    }
}

#[test]
fn decide_covers_every_case() {
    let t0 = Instant::now();
    let d = Duration::from_secs(15);
    let other = spec("b", 15);
    let cases: Vec<(Option<LeaseSpec>, Duration, Decision)> = vec![
        (None, Duration::ZERO, Decision::Create),
        (Some(spec("a", 15)), Duration::ZERO, Decision::Renew),
        (Some(spec("", 15)), Duration::ZERO, Decision::Acquire),
        (
            Some(other.clone()),
            Duration::from_secs(14),
            Decision::Follow { holder: "b".into() },
        ),
        (Some(other.clone()), Duration::from_secs(15), Decision::Acquire),
        // The record's own duration counts, not ours.
        (
            Some(spec("b", 60)),
            Duration::from_secs(30),
            Decision::Follow { holder: "b".into() },
        ),
        // A zero or missing duration falls back to ours.
        (Some(spec("b", 0)), Duration::from_secs(16), Decision::Acquire),
    ];
    for (s, elapsed, want) in cases {
        assert_eq!(
            decide(s.as_ref(), "a", t0, t0 + elapsed, d),
            want,
            "{s:?} after {elapsed:?}"
        );
    }
}

/// One request the fake saw.
#[derive(Clone, Debug)]
struct Call {
    who: &'static str,
    method: http::Method,
    path: String,
    body: Value,
}

/// The fake API server's state: one Lease (with a resourceVersion) and
/// replicas whose calls fail.
#[derive(Default)]
struct Server {
    lease: Option<Lease>,
    version: u64,
    failing: Vec<&'static str>,
    calls: Vec<Call>,
}

const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/mira/leases/mira-operator";

fn status(code: u16, reason: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": reason, "reason": reason, "code": code});
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string().into_bytes()))
        .expect("response")
}

/// A client of the fake for replica `who`.
fn client(server: &Arc<Mutex<Server>>, who: &'static str) -> Client {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = server.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.expect("body");
            let body: Value = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).expect("json")
            };
            let mut s = server.lock().expect("lock");
            s.calls.push(Call {
                who,
                method: parts.method.clone(),
                path: parts.uri.path().to_owned(),
                body: body.clone(),
            });
            if s.failing.contains(&who) {
                send.send_response(status(500, "InternalError"));
                continue;
            }
            let answer = match parts.method {
                http::Method::GET => match &s.lease {
                    Some(l) => json_response(l),
                    None => status(404, "NotFound"),
                },
                http::Method::POST if s.lease.is_some() => status(409, "AlreadyExists"),
                http::Method::PUT if body["metadata"]["resourceVersion"].as_str() != Some(&s.version.to_string()) => {
                    status(409, "Conflict")
                }
                http::Method::POST | http::Method::PUT => {
                    s.version += 1;
                    let mut lease: Lease = serde_json::from_value(body).expect("a Lease");
                    lease.metadata.resource_version = Some(s.version.to_string());
                    lease.metadata.namespace = Some("mira".into());
                    s.lease = Some(lease.clone());
                    json_response(&lease)
                }
                _ => status(405, "MethodNotAllowed"),
            };
            send.send_response(answer);
        }
    });
    Client::new(service, "mira")
}

fn elector(server: &Arc<Mutex<Server>>, who: &'static str) -> LeaderElector {
    LeaderElector::new(
        Api::namespaced(client(server, who), "mira"),
        LeaseConfig::new("mira-operator", who),
        Clock::system(),
    )
}

fn calls(server: &Arc<Mutex<Server>>) -> Vec<Call> {
    std::mem::take(&mut server.lock().expect("lock").calls)
}

fn holder(server: &Arc<Mutex<Server>>) -> Option<String> {
    let s = server.lock().expect("lock");
    s.lease.as_ref()?.spec.as_ref()?.holder_identity.clone()
}

#[tokio::test(start_paused = true)]
async fn create_then_held_by_other_then_takeover_after_expiry() {
    let server = Arc::new(Mutex::new(Server::default()));
    let mut a = elector(&server, "a");
    let mut b = elector(&server, "b");

    // LeaseCreate: no Lease yet, a POSTs one naming itself.
    assert!(a.try_acquire_or_renew().await.expect("a"));
    let c = calls(&server);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!((c[0].method.clone(), c[0].path.as_str()), (http::Method::GET, PATH));
    assert_eq!(c[1].method, http::Method::POST);
    assert_eq!(c[1].path, "/apis/coordination.k8s.io/v1/namespaces/mira/leases");
    assert_eq!(c[1].body["metadata"]["name"], "mira-operator");
    assert_eq!(c[1].body["spec"]["holderIdentity"], "a");
    assert_eq!(c[1].body["spec"]["leaseDurationSeconds"], 15);
    assert_eq!(c[1].body["spec"]["leaseTransitions"], 0);

    // LeaseHeldByOther: b reads and writes nothing.
    assert!(!b.try_acquire_or_renew().await.expect("b"));
    let c = calls(&server);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].method, http::Method::GET);
    assert_eq!(c[0].who, "b");

    // a stops renewing; 15 s after b first saw the record unchanged, b
    // takes over (LeaseTakeover: PUT with the resourceVersion read).
    tokio::time::advance(Duration::from_secs(14)).await;
    assert!(!b.try_acquire_or_renew().await.expect("b"));
    tokio::time::advance(Duration::from_secs(1)).await;
    calls(&server);
    assert!(b.try_acquire_or_renew().await.expect("b"));
    let c = calls(&server);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!((c[1].method.clone(), c[1].path.as_str()), (http::Method::PUT, PATH));
    assert_eq!(c[1].body["metadata"]["resourceVersion"], "1");
    assert_eq!(c[1].body["spec"]["holderIdentity"], "b");
    assert_eq!(c[1].body["spec"]["leaseTransitions"], 1);
    assert_eq!(holder(&server).as_deref(), Some("b"));

    // LeaseConflict: a, still believing it holds the lease, renews with
    // the version it last saw... after reading, it follows b instead; a
    // write racing another (stale resourceVersion) is a 409 and a follows.
    assert!(!a.try_acquire_or_renew().await.expect("a"));
    let stale: Lease = {
        let s = server.lock().expect("lock");
        let mut l = s.lease.clone().expect("lease");
        l.metadata.resource_version = Some("1".into());
        l
    };
    let api: Api<Lease> = Api::namespaced(client(&server, "a"), "mira");
    let e = api
        .replace("mira-operator", &PostParams::default(), &stale)
        .await
        .expect_err("stale");
    assert!(conflict(&e), "{e}");
}

#[tokio::test(start_paused = true)]
async fn two_operators_hand_over_when_the_leader_cannot_renew_and_when_it_releases() {
    let server = Arc::new(Mutex::new(Server::default()));
    let mut a = elector(&server, "a");
    let never = std::future::pending::<()>();
    let mut never = std::pin::pin!(never);
    assert!(a.acquire(&mut never).await);
    let a_led_at = Instant::now();

    // b waits to lead while a holds the lease and renews it.
    let b_task = {
        let server = server.clone();
        tokio::spawn(async move {
            let mut b = elector(&server, "b");
            let mut never = std::pin::pin!(std::future::pending::<()>());
            assert!(b.acquire(&mut never).await);
            (Instant::now(), b)
        })
    };
    // a renews fine for a while...
    let a_hold = tokio::spawn(async move {
        let mut stop = std::pin::pin!(std::future::pending::<()>());
        let held = a.hold(&mut stop).await;
        (held, Instant::now(), a)
    });
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(holder(&server).as_deref(), Some("a"), "a renews, b follows");
    assert!(!b_task.is_finished());
    // ...then its API calls fail: it gives up at the renew deadline,
    // before the lease expires, and b takes over only after that.
    let failing_since = Instant::now();
    server.lock().expect("lock").failing.push("a");
    let (held, a_stopped_at, mut a) = a_hold.await.expect("a");
    assert_eq!(held, Held::Lost);
    let (b_led_at, mut b) = b_task.await.expect("b");
    assert!(a_stopped_at > failing_since);
    assert!(
        a_stopped_at - failing_since <= Duration::from_secs(10),
        "a stops within the renew deadline"
    );
    assert!(b_led_at > a_stopped_at, "b leads only after a stopped");
    assert!(
        b_led_at - failing_since >= Duration::from_secs(13),
        "b waits out the lease"
    );
    assert!(a_led_at < failing_since);
    assert_eq!(holder(&server).as_deref(), Some("b"));

    // b releases on shutdown; a (working again) takes over at its next
    // try instead of waiting out a lease duration.
    server.lock().expect("lock").failing.clear();
    let a_task = tokio::spawn(async move {
        let mut never = std::pin::pin!(std::future::pending::<()>());
        assert!(a.acquire(&mut never).await);
        Instant::now()
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!a_task.is_finished(), "a follows while b holds the lease");
    let released_at = Instant::now();
    b.release().await.expect("release");
    assert_eq!(holder(&server), None);
    let a_again = a_task.await.expect("a");
    assert!(
        a_again - released_at <= Duration::from_secs(2),
        "a takes a released lease at its next retry"
    );
    assert_eq!(holder(&server).as_deref(), Some("a"));
}
