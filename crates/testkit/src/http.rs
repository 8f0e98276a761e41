//! HTTP for tests: one client for the requests a real client sends (a
//! maintained crate, `reqwest`, over plain HTTP/1.1), waiting for `/ready`,
//! and a raw socket writer for the requests no real client sends (a body
//! that stalls, a body far past the server's limits, a head too large to
//! read), whose answers the tests assert.
//!
//! Every request opens its own connection and is sent once: no pooled
//! connection survives a server's restart, and no retry sends an export
//! twice behind a test's back.

use std::fmt::Display;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub use reqwest::header::HeaderMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::net::wait_for;

/// One client for the process: without pooled connections it holds
/// nothing of a runtime, so every test's runtime may use it.
static CLIENT: LazyLock<reqwest::Client> = LazyLock::new(|| {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .retry(reqwest::retry::never())
        .build()
        .expect("HTTP client")
});

/// An answer: its status, headers and whole body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Response {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, or as a JSON string of its text when it is not
    /// JSON (so an assertion can print whatever came).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| serde_json::Value::String(self.text()))
    }

    /// The value of header `name`, when present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// `GET http://{addr}{path}`; `None` when no whole answer came (nothing
/// listening, or the connection closed first).
pub async fn get(addr: impl Display, path: &str) -> Option<Response> {
    request("GET", addr, path, &[], Vec::new()).await
}

/// `POST http://{addr}{path}` with `headers` and `body`; `None` when no
/// whole answer came.
pub async fn post(
    addr: impl Display,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Vec<u8>>,
) -> Option<Response> {
    request("POST", addr, path, headers, body).await
}

/// `{method} http://{addr}{path}` with `headers` and `body`; `None` when
/// no whole answer came.
pub async fn request(
    method: &str,
    addr: impl Display,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Vec<u8>>,
) -> Option<Response> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
    let mut req = CLIENT.request(method, format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.body(body.into()).send().await.ok()?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.bytes().await.ok()?.to_vec();
    Some(Response { status, headers, body })
}

/// Waits (a minute at most) until `GET /ready` on `addr` answers 200.
pub async fn wait_ready(addr: impl Display) {
    let addr = addr.to_string();
    wait_for(&format!("{addr} to be ready"), Duration::from_secs(60), || async {
        get(&addr, "/ready").await.filter(|r| r.status == 200).map(|_| ())
    })
    .await;
}

/// What came back on a raw connection: the status of its first line (0
/// when there was none) and the whole answer as text, head and body.
#[derive(Debug, Clone)]
pub struct RawAnswer {
    pub status: u16,
    pub text: String,
}

impl RawAnswer {
    fn new(bytes: &[u8]) -> RawAnswer {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        RawAnswer { status, text }
    }
}

/// Writes `request` to `addr` as raw bytes, as much of it as the server
/// takes (a server may answer and close before it read an oversized
/// request, or wait on a body that never comes), and reads the answer
/// until the server closes the connection. For requests no real client
/// sends; panics when nothing listens.
pub async fn raw_request(addr: impl Display, request: &[u8]) -> RawAnswer {
    let mut s = tokio::net::TcpStream::connect(addr.to_string()).await.expect("connect");
    let _ = s.write_all(request).await;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    RawAnswer::new(&out)
}

/// Writes `head` (which declares a body of `body_len` bytes) and then
/// zeros, 1 MiB at a time, while reading the answer; returns the answer
/// and how many body bytes were written when the whole of it had come.
/// For a server that must refuse a body on its declared length, before
/// it is sent.
pub async fn raw_request_with_body(addr: impl Display, head: &str, body_len: usize) -> (RawAnswer, usize) {
    let s = tokio::net::TcpStream::connect(addr.to_string()).await.expect("connect");
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(head.as_bytes()).await.expect("head");
    let written = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = written.clone();
    let writer = tokio::spawn(async move {
        let chunk = vec![0u8; 1 << 20];
        let mut n = 0;
        while n < body_len {
            let len = chunk.len().min(body_len - n);
            if wr.write_all(&chunk[..len]).await.is_err() {
                break;
            }
            n += len;
            counter.store(n, Ordering::SeqCst);
        }
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !whole_answer(&out) {
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    let at = written.load(Ordering::SeqCst);
    writer.abort();
    (RawAnswer::new(&out), at)
}

/// Whether `out` holds a response head and the `Content-Length` bytes of
/// body it declares (without one, the answer ends when the server closes).
fn whole_answer(out: &[u8]) -> bool {
    let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
    head.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|len| out.len() >= end + 4 + len)
}
