//! Test doubles of the controller (the controller-rs `fixtures.rs`
//! pattern): object builders, a real single-member catalog in process,
//! a [`Context`] whose Kubernetes client is a `tower_test` mock, and an
//! [`ApiServerVerifier`] that plays the API server: it takes each request
//! in order, asserts its method, path, query parameters (as a set) and
//! body, and answers.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use kube::{Client, Resource, ResourceExt};
use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, CatalogNode, ClientConfig, NodeConfig};
use mira_common::Process;
use mira_common::clock::Clock;
use serde_json::{Value, json};

use crate::controller::Context;
use crate::crd::{MiraRetentionPolicy, MiraRetentionPolicySpec, MiraRetentionPolicyStatus, OffloadSpec};
use crate::metrics::Metrics;
use crate::tenancy::{TENANTS_ANNOTATION, Tenancy};

pub type ApiServerHandle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

impl MiraRetentionPolicy {
    /// `default/test`: tenant acme, retain 30d, generation 1, no
    /// finalizer yet.
    pub fn test() -> MiraRetentionPolicy {
        let mut o = MiraRetentionPolicy::new(
            "test",
            MiraRetentionPolicySpec {
                tenant: "acme".into(),
                signals: vec![],
                resource_selector: None,
                retain: "30d".into(),
                offload: None,
                priority: 0,
                dry_run: false,
            },
        );
        o.meta_mut().namespace = Some("default".into());
        o.meta_mut().uid = Some("uid-1".into());
        o.meta_mut().generation = Some(1);
        o.meta_mut().resource_version = Some("100".into());
        o
    }

    pub fn finalized(mut self) -> Self {
        self.finalizers_mut().push(crate::crd::FINALIZER.to_owned());
        self
    }

    pub fn with_offload(mut self, after: &str, target: &str) -> Self {
        self.spec.offload = Some(OffloadSpec {
            after: after.into(),
            target: target.into(),
        });
        self
    }

    pub fn needs_delete(mut self) -> Self {
        self.meta_mut().deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        self
    }

    pub fn with_status(mut self, status: MiraRetentionPolicyStatus) -> Self {
        self.status = Some(status);
        self
    }

    pub fn generation(mut self, n: i64) -> Self {
        self.meta_mut().generation = Some(n);
        self
    }

    /// The same object in namespace `ns`, naming `tenant`.
    pub fn in_namespace(mut self, ns: &str, tenant: &str) -> Self {
        self.meta_mut().namespace = Some(ns.into());
        self.spec.tenant = tenant.into();
        self
    }
}

fn ns(obj: &MiraRetentionPolicy) -> String {
    obj.namespace().expect("a namespaced object")
}

/// A single-member catalog in this process, on its own port and directory.
pub struct TestCatalog {
    pub addr: String,
    pub node: Option<CatalogNode>,
    dir: tempfile::TempDir,
}

impl TestCatalog {
    pub async fn start() -> TestCatalog {
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = mira_testkit::net::free_addr();
        let mut c = TestCatalog {
            addr: addr.to_string(),
            node: None,
            dir,
        };
        c.restart().await;
        c
    }

    /// An address where no catalog runs yet ([`TestCatalog::restart`]
    /// starts one there).
    pub fn not_started() -> TestCatalog {
        TestCatalog {
            addr: mira_testkit::net::free_addr().to_string(),
            node: None,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub async fn restart(&mut self) {
        let addr = self.addr.parse().expect("addr");
        let node = CatalogNode::start(
            NodeConfig::single(addr, self.dir.path().join("catalog")),
            &Process::default(),
        )
        .await
        .expect("start the catalog");
        node.wait_for_leader(Duration::from_secs(20)).await.expect("a leader");
        self.node = Some(node);
    }

    /// A client that gives up quickly (for the operator under test).
    pub fn client(&self) -> Arc<CatalogClient> {
        Arc::new(CatalogClient::new(
            vec![self.addr.clone()],
            ClientConfig {
                timeout: Duration::from_millis(600),
                attempt_timeout: Duration::from_millis(300),
                connect_timeout: Duration::from_millis(200),
                ..ClientConfig::default()
            },
        ))
    }

    /// The catalog's policies (read back by the tests).
    pub async fn policies(&self) -> pb::ListPoliciesReply {
        self.client()
            .list_policies(pb::ListPoliciesRequest {
                linearizable: true,
                ..Default::default()
            })
            .await
            .expect("list policies")
    }

    /// The policy of `kind` named `name`.
    pub async fn policy(&self, kind: pb::PolicyKind, name: &str) -> Option<pb::Policy> {
        (self.policies().await.policies)
            .into_iter()
            .find(|p| p.kind == kind as i32 && p.name == name)
    }
}

impl Context {
    /// A context on a mocked API server and `catalog`; the operator's
    /// namespace is `default`, so objects there may govern every tenant.
    pub fn test(catalog: Arc<CatalogClient>) -> (Arc<Context>, ApiServerVerifier, Metrics) {
        let tenancy = Tenancy::new("default", &[], true, "test").expect("tenancy");
        Context::test_with(catalog, tenancy)
    }

    /// [`Context::test`] with `tenancy`.
    pub fn test_with(catalog: Arc<CatalogClient>, tenancy: Tenancy) -> (Arc<Context>, ApiServerVerifier, Metrics) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let metrics = Metrics::register(&mira_common::telemetry::Telemetry::new());
        let ctx = Context::new(
            client,
            catalog,
            metrics.clone(),
            Clock::system(),
            "test-pod",
            Duration::from_secs(300),
            tenancy,
        );
        (Arc::new(ctx), ApiServerVerifier(handle), metrics)
    }
}

/// One request as the verifier saw it.
#[derive(Debug)]
pub struct Seen {
    pub method: http::Method,
    pub path: String,
    pub query: BTreeSet<(String, String)>,
    pub content_type: String,
    pub body: Value,
}

/// The query string as a set of pairs (order does not matter).
pub fn query_set(query: Option<&str>) -> BTreeSet<(String, String)> {
    (query.unwrap_or("").split('&'))
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

pub fn pairs(p: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    p.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// Plays the Kubernetes API server for one test.
pub struct ApiServerVerifier(pub ApiServerHandle);

impl std::fmt::Debug for ApiServerVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiServerVerifier")
    }
}

impl ApiServerVerifier {
    /// The next request, and the way to answer it.
    pub async fn next(&mut self) -> (Seen, tower_test::mock::SendResponse<Response<Body>>) {
        let (req, send) = self
            .0
            .next_request()
            .await
            .expect("the operator made no further request");
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.expect("request body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON body")
        };
        let seen = Seen {
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            query: query_set(parts.uri.query()),
            content_type: (parts.headers.get("content-type"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned(),
            body,
        };
        (seen, send)
    }

    /// Asserts no further request: the test drops the context first.
    pub async fn silence(mut self) {
        if let Some((req, _)) = self.0.next_request().await {
            panic!("unexpected request {} {}", req.method(), req.uri());
        }
    }

    /// The finalizer is added with a guarded JSON patch; answers with the
    /// object carrying it.
    pub async fn finalizer_creation(&mut self, obj: &MiraRetentionPolicy) {
        let (seen, send) = self.next().await;
        assert_eq!(seen.method, http::Method::PATCH);
        assert_eq!(
            seen.path,
            format!(
                "/apis/mira.dev/v1alpha1/namespaces/{}/miraretentionpolicies/{}",
                ns(obj),
                obj.name_any()
            )
        );
        assert_eq!(seen.query, pairs(&[]));
        assert_eq!(seen.content_type, "application/json-patch+json");
        assert_eq!(
            seen.body,
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["mira.dev/catalog-policy"]}
            ])
        );
        let answer = obj.clone().finalized();
        send.send_response(json_response(&answer));
    }

    /// A server-side apply of the status by `mira-operator`; returns the
    /// status sent.
    pub async fn status_patch(&mut self, obj: &MiraRetentionPolicy) -> MiraRetentionPolicyStatus {
        let (seen, send) = self.next().await;
        assert_eq!(seen.method, http::Method::PATCH);
        assert_eq!(
            seen.path,
            format!(
                "/apis/mira.dev/v1alpha1/namespaces/{}/miraretentionpolicies/{}/status",
                ns(obj),
                obj.name_any()
            )
        );
        assert_eq!(
            seen.query,
            pairs(&[("fieldManager", "mira-operator"), ("force", "true")])
        );
        assert_eq!(seen.content_type, "application/apply-patch+yaml");
        assert_eq!(seen.body["apiVersion"], "mira.dev/v1alpha1");
        assert_eq!(seen.body["kind"], "MiraRetentionPolicy");
        let keys: Vec<&String> = seen.body.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["apiVersion", "kind", "status"], "only the status is applied");
        let status: MiraRetentionPolicyStatus = serde_json::from_value(seen.body["status"].clone()).expect("a status");
        let answer = obj.clone().with_status(status.clone());
        send.send_response(json_response(&answer));
        status
    }

    /// An events.k8s.io/v1 event about `obj`; returns its body.
    pub async fn event(&mut self, obj: &MiraRetentionPolicy, type_: &str, reason: &str, action: &str) -> Value {
        let (seen, send) = self.next().await;
        assert_eq!(seen.method, http::Method::POST);
        assert_eq!(
            seen.path,
            format!("/apis/events.k8s.io/v1/namespaces/{}/events", ns(obj))
        );
        assert_eq!(seen.body["type"], type_, "{}", seen.body);
        assert_eq!(seen.body["reason"], reason, "{}", seen.body);
        assert_eq!(seen.body["action"], action, "{}", seen.body);
        assert_eq!(seen.body["reportingController"], "mira-operator");
        assert_eq!(seen.body["reportingInstance"], "test-pod");
        assert_eq!(seen.body["regarding"]["kind"], "MiraRetentionPolicy");
        assert_eq!(seen.body["regarding"]["name"], obj.name_any());
        assert_eq!(seen.body["regarding"]["namespace"], ns(obj));
        let mut response = Response::builder().status(201);
        response = response.header("content-type", "application/json");
        send.send_response(
            response
                .body(Body::from(seen.body.to_string().into_bytes()))
                .expect("response"),
        );
        seen.body
    }

    /// A GET of Namespace `name`; answers with one whose
    /// `mira.dev/tenants` annotation is `tenants` (absent: `None`).
    pub async fn namespace_get(&mut self, name: &str, tenants: Option<&str>) {
        let (seen, send) = self.next().await;
        assert_eq!(seen.method, http::Method::GET);
        assert_eq!(seen.path, format!("/api/v1/namespaces/{name}"));
        let mut ns = k8s_openapi::api::core::v1::Namespace::default();
        ns.metadata.name = Some(name.to_owned());
        ns.metadata.annotations = tenants.map(|t| [(TENANTS_ANNOTATION.to_owned(), t.to_owned())].into());
        let mut v = serde_json::to_value(&ns).expect("json");
        v["apiVersion"] = json!("v1");
        v["kind"] = json!("Namespace");
        send.send_response(json_response(&v));
    }

    /// The finalizer is removed with `test` + `remove` at its index.
    pub async fn finalizer_removal(&mut self, obj: &MiraRetentionPolicy) {
        let (seen, send) = self.next().await;
        assert_eq!(seen.method, http::Method::PATCH);
        assert_eq!(
            seen.path,
            format!(
                "/apis/mira.dev/v1alpha1/namespaces/{}/miraretentionpolicies/{}",
                ns(obj),
                obj.name_any()
            )
        );
        assert_eq!(seen.content_type, "application/json-patch+json");
        assert_eq!(
            seen.body,
            json!([
                {"op": "test", "path": "/metadata/finalizers/0", "value": "mira.dev/catalog-policy"},
                {"op": "remove", "path": "/metadata/finalizers/0"}
            ])
        );
        let mut answer = obj.clone();
        answer.finalizers_mut().clear();
        send.send_response(json_response(&answer));
    }
}

pub fn json_response(v: &impl serde::Serialize) -> Response<Body> {
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(v).expect("json")))
        .expect("response")
}

/// Runs `scenario` against the verifier while `work` runs, then checks
/// that nothing else was asked (the context must be dropped by `work`).
pub async fn verify<T, S, F, W>(verifier: ApiServerVerifier, scenario: S, work: W) -> T
where
    S: FnOnce(ApiServerVerifier) -> F,
    F: Future<Output = ApiServerVerifier> + Send + 'static,
    W: Future<Output = T>,
{
    let script = scenario(verifier);
    let guard = tokio::spawn(async move { script.await.silence().await });
    let out = work.await;
    tokio::time::timeout(Duration::from_secs(30), guard)
        .await
        .expect("the scenario did not finish")
        .expect("the scenario's assertions");
    out
}
