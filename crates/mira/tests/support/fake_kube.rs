//! A fake Kubernetes API server over HTTP on loopback, enough of it for
//! `mira operator --kubeconfig` as a real process: list and watch of
//! `miraretentionpolicies` (all namespaces or one; the watch is a
//! long-poll streaming JSON lines of watch events after the
//! `resourceVersion` asked for, until `timeoutSeconds`), GET of one object,
//! JSON patch and merge patch of an object (the finalizer), server-side
//! apply of the status subresource (the whole status is the operator's),
//! events (events.k8s.io/v1 create and merge patch, recorded) and
//! coordination.k8s.io/v1 Leases (GET, POST, PUT with a resourceVersion
//! check). An object whose `deletionTimestamp` is set and whose finalizers
//! are gone is deleted, as the API server does. The test reads the stored
//! objects, events and Leases back, and changes objects as `kubectl` would.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

const GROUP_VERSION: &str = "mira.dev/v1alpha1";
const PLURAL: &str = "miraretentionpolicies";

#[derive(Default)]
struct Inner {
    /// The last resourceVersion handed out (one counter for everything).
    rv: u64,
    /// `miraretentionpolicies` by (namespace, name).
    objects: BTreeMap<(String, String), Value>,
    /// Every change of an object: (resourceVersion, type, object).
    changes: Vec<(u64, &'static str, Value)>,
    /// Events created or patched, in order.
    events: Vec<Value>,
    /// Leases by (namespace, name).
    leases: BTreeMap<(String, String), Value>,
    /// `METHOD path?query` of every request, in order.
    requests: Vec<String>,
}

struct Shared {
    inner: Mutex<Inner>,
    /// The last change's resourceVersion (watches wait on it).
    changed: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The fake API server (stops when dropped).
pub struct FakeKube {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn status_error(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (code, [("content-type", "application/json")], body.to_string()).into_response()
}

fn ok_json(code: StatusCode, v: &Value) -> Response {
    (code, [("content-type", "application/json")], v.to_string()).into_response()
}

fn query_param(uri: &Uri, key: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then(|| v.to_owned())
    })
}

impl FakeKube {
    /// Serves on a free loopback port.
    pub async fn start() -> FakeKube {
        let (changed, _) = tokio::sync::watch::channel(0);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner::default()),
            changed,
        });
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeKube { addr, shared, task }
    }

    /// A kubeconfig naming this server, no auth, namespace `default`.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
             users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\n",
            self.addr
        )
    }

    /// Creates or replaces an object as `kubectl apply` would: `spec`
    /// set, `generation` bumped when the spec changed, status and
    /// finalizers kept.
    pub fn apply(&self, namespace: &str, name: &str, spec: Value) {
        let mut inner = self.shared.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let obj = match inner.objects.get(&key) {
            Some(old) => {
                let mut obj = old.clone();
                if obj["spec"] != spec {
                    let generation = obj["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
                    obj["metadata"]["generation"] = json!(generation);
                    obj["spec"] = spec;
                }
                obj
            }
            None => json!({
                "apiVersion": GROUP_VERSION,
                "kind": "MiraRetentionPolicy",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": format!("uid-{namespace}-{name}"),
                    "generation": 1,
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "finalizers": null,
                },
                "spec": spec,
            }),
        };
        self.store(&mut inner, obj);
    }

    /// Changes an annotation (a MODIFIED event, generation unchanged).
    pub fn annotate(&self, namespace: &str, name: &str, key: &str, value: &str) {
        let mut inner = self.shared.lock();
        let mut obj = inner
            .objects
            .get(&(namespace.to_owned(), name.to_owned()))
            .expect("the object")
            .clone();
        obj["metadata"]["annotations"][key] = json!(value);
        self.store(&mut inner, obj);
    }

    /// `kubectl delete`: sets `deletionTimestamp` (the object stays until
    /// its finalizers are gone; without any it goes at once).
    pub fn delete(&self, namespace: &str, name: &str) {
        let mut inner = self.shared.lock();
        let mut obj = inner
            .objects
            .get(&(namespace.to_owned(), name.to_owned()))
            .expect("the object")
            .clone();
        obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:01Z");
        self.store(&mut inner, obj);
    }

    /// The stored object, if it exists.
    pub fn object(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .objects
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every event recorded.
    pub fn events(&self) -> Vec<Value> {
        self.shared.lock().events.clone()
    }

    /// The stored Lease, if any.
    pub fn lease(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .leases
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// `METHOD path?query` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().requests.clone()
    }

    /// Stores `obj` with a new resourceVersion and records the change
    /// (DELETED when it is being deleted and has no finalizer left).
    fn store(&self, inner: &mut Inner, obj: Value) {
        store(&self.shared, inner, obj);
    }
}

fn store(shared: &Shared, inner: &mut Inner, mut obj: Value) -> Value {
    inner.rv += 1;
    let rv = inner.rv;
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    let key = (
        obj["metadata"]["namespace"].as_str().unwrap_or_default().to_owned(),
        obj["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
    );
    let finalizers = obj["metadata"]["finalizers"].as_array().map_or(0, Vec::len);
    let kind = if !obj["metadata"]["deletionTimestamp"].is_null() && finalizers == 0 {
        inner.objects.remove(&key);
        "DELETED"
    } else if inner.objects.insert(key, obj.clone()).is_some() {
        "MODIFIED"
    } else {
        "ADDED"
    };
    inner.changes.push((rv, kind, obj.clone()));
    shared.changed.send_replace(rv);
    obj
}

/// The path's segments after `/apis/{group}/{version}/`, the namespace
/// taken out: (group/version, namespace, rest).
fn parse(path: &str) -> Option<(String, Option<String>, Vec<String>)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    if segs.len() < 4 || segs[0] != "apis" {
        return None;
    }
    let gv = format!("{}/{}", segs[1], segs[2]);
    let rest = &segs[3..];
    if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        Some((
            gv,
            Some(rest[1].to_owned()),
            rest[2..].iter().map(|s| (*s).to_owned()).collect(),
        ))
    } else {
        Some((gv, None, rest.iter().map(|s| (*s).to_owned()).collect()))
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    shared.lock().requests.push(format!("{method} {uri}"));
    let Some((gv, ns, rest)) = parse(uri.path()) else {
        return status_error(StatusCode::NOT_FOUND, "NotFound", &format!("no route {}", uri.path()));
    };
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return status_error(StatusCode::BAD_REQUEST, "BadRequest", &format!("body: {e}")),
        }
    };
    match (gv.as_str(), rest.as_slice()) {
        (GROUP_VERSION, [PLURAL]) if method == Method::GET => {
            if query_param(&uri, "watch").is_some_and(|w| w == "true" || w == "1") {
                watch(shared, ns, &uri)
            } else {
                list(&shared, ns.as_deref())
            }
        }
        (GROUP_VERSION, [PLURAL, name]) => {
            let key = (ns.unwrap_or_default(), (*name).to_owned());
            let mut inner = shared.lock();
            let Some(obj) = inner.objects.get(&key).cloned() else {
                return status_error(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("{PLURAL} {name:?} not found"),
                );
            };
            match method {
                Method::GET => ok_json(StatusCode::OK, &obj),
                Method::PATCH => {
                    let mut patched = obj.clone();
                    if content_type.starts_with("application/json-patch+json") {
                        let patch: json_patch::Patch = match serde_json::from_value(body) {
                            Ok(p) => p,
                            Err(e) => return status_error(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
                        };
                        if let Err(e) = json_patch::patch(&mut patched, &patch) {
                            return status_error(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &e.to_string());
                        }
                    } else if content_type.starts_with("application/merge-patch+json") {
                        json_patch::merge(&mut patched, &body);
                    } else {
                        return status_error(
                            StatusCode::UNSUPPORTED_MEDIA_TYPE,
                            "UnsupportedMediaType",
                            &content_type,
                        );
                    }
                    // Metadata the client may not change here.
                    patched["spec"] = obj["spec"].clone();
                    patched["status"] = obj["status"].clone();
                    let stored = store(&shared, &mut inner, patched);
                    ok_json(StatusCode::OK, &stored)
                }
                _ => status_error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", method.as_str()),
            }
        }
        (GROUP_VERSION, [PLURAL, name, "status"]) if method == Method::PATCH => {
            if !content_type.starts_with("application/apply-patch+yaml") {
                return status_error(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    &content_type,
                );
            }
            if query_param(&uri, "fieldManager").is_none() {
                return status_error(StatusCode::BAD_REQUEST, "BadRequest", "apply needs a fieldManager");
            }
            let key = (ns.unwrap_or_default(), (*name).to_owned());
            let mut inner = shared.lock();
            let Some(mut obj) = inner.objects.get(&key).cloned() else {
                return status_error(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("{PLURAL} {name:?} not found"),
                );
            };
            obj["status"] = body["status"].clone();
            let stored = store(&shared, &mut inner, obj);
            ok_json(StatusCode::OK, &stored)
        }
        ("events.k8s.io/v1", ["events"]) if method == Method::POST => {
            let mut inner = shared.lock();
            inner.rv += 1;
            let mut ev = body;
            ev["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
            inner.events.push(ev.clone());
            ok_json(StatusCode::CREATED, &ev)
        }
        ("events.k8s.io/v1", ["events", _name]) if method == Method::PATCH => {
            let mut inner = shared.lock();
            let mut ev = body;
            inner.rv += 1;
            ev["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
            inner.events.push(ev.clone());
            ok_json(StatusCode::OK, &ev)
        }
        ("coordination.k8s.io/v1", ["leases"]) if method == Method::POST => {
            let name = body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            let key = (ns.unwrap_or_default(), name.clone());
            let mut inner = shared.lock();
            if inner.leases.contains_key(&key) {
                return status_error(StatusCode::CONFLICT, "AlreadyExists", &format!("lease {name:?} exists"));
            }
            inner.rv += 1;
            let mut lease = body;
            lease["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
            lease["metadata"]["namespace"] = json!(key.0);
            inner.leases.insert(key, lease.clone());
            ok_json(StatusCode::CREATED, &lease)
        }
        ("coordination.k8s.io/v1", ["leases", name]) => {
            let key = (ns.unwrap_or_default(), (*name).to_owned());
            let mut inner = shared.lock();
            let current = inner.leases.get(&key).cloned();
            match (method, current) {
                (Method::GET, Some(lease)) => ok_json(StatusCode::OK, &lease),
                (Method::GET | Method::PUT, None) => {
                    status_error(StatusCode::NOT_FOUND, "NotFound", &format!("leases {name:?} not found"))
                }
                (Method::PUT, Some(lease)) => {
                    if body["metadata"]["resourceVersion"] != lease["metadata"]["resourceVersion"] {
                        return status_error(StatusCode::CONFLICT, "Conflict", "the lease was changed");
                    }
                    inner.rv += 1;
                    let mut lease = body;
                    lease["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
                    inner.leases.insert(key, lease.clone());
                    ok_json(StatusCode::OK, &lease)
                }
                (method, _) => status_error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", method.as_str()),
            }
        }
        _ => status_error(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("the fake serves no {method} {}", uri.path()),
        ),
    }
}

fn in_namespace(obj: &Value, ns: Option<&str>) -> bool {
    ns.is_none_or(|ns| obj["metadata"]["namespace"] == ns)
}

fn list(shared: &Shared, ns: Option<&str>) -> Response {
    let inner = shared.lock();
    let items: Vec<Value> = inner
        .objects
        .values()
        .filter(|o| in_namespace(o, ns))
        .cloned()
        .collect();
    ok_json(
        StatusCode::OK,
        &json!({
            "apiVersion": GROUP_VERSION,
            "kind": "MiraRetentionPolicyList",
            "metadata": {"resourceVersion": inner.rv.to_string()},
            "items": items,
        }),
    )
}

/// Watch events after the asked resourceVersion, one JSON line each, as
/// they happen, until `timeoutSeconds` (kube asks for 290 s).
fn watch(shared: Arc<Shared>, ns: Option<String>, uri: &Uri) -> Response {
    let since: u64 = query_param(uri, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = query_param(uri, "timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(290), Duration::from_secs);
    let deadline = tokio::time::Instant::now() + timeout;
    let rx = shared.changed.subscribe();
    let stream = futures::stream::unfold((since, rx), move |(mut since, mut rx)| {
        let (shared, ns) = (shared.clone(), ns.clone());
        async move {
            loop {
                let lines: String = {
                    let inner = shared.lock();
                    let mut out = String::new();
                    let from = since;
                    for (rv, kind, obj) in inner.changes.iter().filter(|(rv, ..)| *rv > from) {
                        since = *rv;
                        if in_namespace(obj, ns.as_deref()) {
                            out.push_str(&json!({"type": kind, "object": obj}).to_string());
                            out.push('\n');
                        }
                    }
                    out
                };
                if !lines.is_empty() {
                    return Some((Ok::<_, std::convert::Infallible>(lines), (since, rx)));
                }
                match tokio::time::timeout_at(deadline, rx.changed()).await {
                    Ok(Ok(())) => {}
                    _ => return None,
                }
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .expect("a response")
}
