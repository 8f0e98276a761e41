//! One request's memory is bounded by configuration, whatever its shape
//! (issue 29, docs/security.md "What one request can cost"): a real
//! `mira serve` with small limits is sent the worst-shaped OTLP requests
//! we know of — millions of empty spans, log records, data points or
//! attributes in 16 MiB (a few KiB gzip- or zstd-compressed), the same as
//! JSON, over HTTP and gRPC, several at once; remote write and Loki push
//! bodies of millions of empty labels, samples, symbols, references,
//! entries or metadata pairs — and the heaviest requests
//! it must accept, concurrently. The refused ones are answered 413 /
//! RESOURCE_EXHAUSTED naming the limit and what they hold; the process's
//! peak resident memory (VmHWM from /proc) stays under the bound the
//! configuration implies; afterwards it still accepts and serves another
//! tenant's rows.
//!
//! On the code before the census, one of these requests (16 MiB of empty
//! spans, 16 KiB gzip) raised the peak from about 70 MB to 3.85 GB.

#[path = "support/procs.rs"]
mod procs;

use std::io::Write;
use std::time::Duration;

use mira_testkit::http::{self, wait_ready};
use mira_testkit::net::wait_for;
use mira_testkit::otlp::log_export;
use mira_testkit::recent_base_time as t0;
use procs::{Procs, Role};

const MIB: u64 = 1 << 20;
const MAX_MESSAGE: u64 = 16 * MIB;
const MAX_DECODED: u64 = 48 * MIB;
const INFLIGHT_DECODED: u64 = 96 * MIB;
const SEAL: u64 = 8 * MIB;
const SLOTS: u64 = 4;

/// `field` (length-delimited) holding `inner`.
fn wrap(field: u8, inner: &[u8]) -> Vec<u8> {
    let mut out = vec![field << 3 | 2];
    prost::encoding::encode_varint(inner.len() as u64, &mut out);
    out.extend_from_slice(inner);
    out
}

/// `n` empty length-delimited fields `field`: two bytes each.
fn empties(field: u8, n: usize) -> Vec<u8> {
    [field << 3 | 2, 0].repeat(n)
}

/// Export requests of `n` empty items, each two bytes on the wire.
fn empty_spans(n: usize) -> Vec<u8> {
    wrap(1, &wrap(2, &empties(2, n)))
}

fn empty_logs(n: usize) -> Vec<u8> {
    wrap(1, &wrap(2, &empties(2, n)))
}

fn empty_points(n: usize) -> Vec<u8> {
    let metric = [wrap(1, b"m"), wrap(5, &empties(1, n))].concat();
    wrap(1, &wrap(2, &wrap(2, &metric)))
}

/// One log record with `n` empty attributes.
fn empty_attributes(n: usize) -> Vec<u8> {
    wrap(1, &wrap(2, &wrap(2, &empties(6, n))))
}

fn json_spans(n: usize) -> Vec<u8> {
    format!(
        r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{}]}}]}}]}}"#,
        vec!["{}"; n].join(",")
    )
    .into_bytes()
}

fn snappy(body: &[u8]) -> Vec<u8> {
    snap::raw::Encoder::new().compress_vec(body).expect("snappy")
}

/// A remote write 1.0 series: `__name__="m"`, then `rest`.
fn rw_series(rest: &[u8]) -> Vec<u8> {
    let name = [wrap(1, b"__name__"), wrap(2, b"m")].concat();
    wrap(1, &[wrap(1, &name), rest.to_vec()].concat())
}

/// A Loki push stream with labels text `labels`, then `rest`.
fn loki_stream(labels: &[u8], rest: &[u8]) -> Vec<u8> {
    wrap(1, &[wrap(1, labels), rest.to_vec()].concat())
}

fn gzip(body: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(body).expect("gzip");
    e.finish().expect("gzip")
}

fn zstd(body: &[u8]) -> Vec<u8> {
    zstd::encode_all(body, 3).expect("zstd")
}

/// The process's peak resident memory, bytes.
fn vm_hwm(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

struct Shot {
    path: &'static str,
    content_type: &'static str,
    encoding: &'static str,
    body: Vec<u8>,
}

async fn send(addr: &str, shot: &Shot) -> http::Response {
    http::post(
        addr,
        shot.path,
        &[
            ("content-type", shot.content_type),
            ("content-encoding", shot.encoding),
            ("X-Scope-OrgID", "hostile"),
        ],
        shot.body.clone(),
    )
    .await
    .expect("an answer")
}

async fn grpc_send(addr: &str, path: &'static str, body: Vec<u8>) -> tonic::Status {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = tonic::client::Grpc::new(channel)
        .send_compressed(tonic::codec::CompressionEncoding::Gzip)
        .max_encoding_message_size(64 << 20);
    client.ready().await.expect("ready");
    let mut req = tonic::Request::new(bytes::Bytes::from(body));
    req.metadata_mut()
        .insert("x-scope-orgid", "hostile".parse().expect("ascii"));
    client
        .unary::<_, bytes::Bytes, _>(
            req,
            tonic::codegen::http::uri::PathAndQuery::from_static(path),
            mira_ingester::otlp::RawCodec,
        )
        .await
        .expect_err("refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worst_shaped_requests_stay_within_the_configured_memory() {
    let mut p = Procs::new();
    let (message, decoded, inflight, seal, slots) = (
        format!("{}B", MAX_MESSAGE),
        format!("{}B", MAX_DECODED),
        format!("{}B", INFLIGHT_DECODED),
        format!("{}B", SEAL),
        SLOTS.to_string(),
    );
    let i = p.add(
        Role::Serve,
        &[
            "--shards",
            "1",
            "--max-message-size",
            &message,
            "--max-decoded-size",
            &decoded,
            "--max-inflight-decoded-size",
            &inflight,
            "--seal-size",
            &seal,
            "--max-inflight-requests",
            &slots,
            "--no-compactor",
        ],
    );
    p.start(i);
    let (query, otlp, grpc) = (p[i].addr.clone(), p[i].http.clone(), p[i].grpc.clone());
    wait_ready(&query).await;
    let pid = p.pid(i).expect("running");
    let base = vm_hwm(pid);

    // 16 MiB of items each: 8 M empty spans, log records, points or
    // attributes, 5.6 M empty JSON objects.
    let n = (MAX_MESSAGE as usize - 64) / 2;
    let pb = "application/x-protobuf";
    let shots = [
        ("/v1/traces", pb, "gzip", gzip(&empty_spans(n)), "spans"),
        ("/v1/traces", pb, "zstd", zstd(&empty_spans(n)), "spans"),
        ("/v1/logs", pb, "gzip", gzip(&empty_logs(n)), "log records"),
        ("/v1/metrics", pb, "gzip", gzip(&empty_points(n - 8)), "data points"),
        ("/v1/logs", pb, "gzip", gzip(&empty_attributes(n - 8)), "attributes"),
        (
            "/v1/traces",
            "application/json",
            "gzip",
            gzip(&json_spans((MAX_MESSAGE as usize - 64) / 3)),
            "JSON objects",
        ),
    ]
    .map(|(path, content_type, encoding, body, holds)| {
        assert!(
            body.len() < 64 << 10,
            "{path} {encoding}: {} bytes compressed",
            body.len()
        );
        (
            Shot {
                path,
                content_type,
                encoding,
                body,
            },
            holds,
        )
    });
    // Three at a time, twice over.
    for _ in 0..2 {
        for chunk in shots.chunks(3) {
            let answers = futures::future::join_all(chunk.iter().map(|(s, _)| send(&otlp, s))).await;
            for ((shot, holds), r) in chunk.iter().zip(answers) {
                let text = r.text();
                assert_eq!(r.status, 413, "{} {}: {text}", shot.path, shot.encoding);
                assert!(
                    text.contains("--max-decoded-size") && text.contains(holds),
                    "{} {}: {text}",
                    shot.path,
                    shot.encoding
                );
            }
        }
    }
    // Remote write and Loki push, snappy-compressed (what their agents
    // send): views of many times their wire size (millions of empty
    // labels, samples, symbols, label references, entries, metadata, `=`
    // in a label text). Each is read within memory reserved for its views
    // and refused 413 naming the limit once they pass it.
    let v2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request";
    let refs = vec![0u8; n - 16];
    let push_shots = [
        (
            "/api/v1/write",
            pb,
            rw_series(&empties(1, n - 16)),
            "labels, samples or entries",
        ),
        (
            "/api/v1/push",
            pb,
            rw_series(&empties(2, n - 16)),
            "labels, samples or entries",
        ),
        (
            // Many small series, each with a point attribute: the series
            // views, their labels and their encoded attributes.
            "/api/v1/write",
            pb,
            rw_series(&wrap(1, &[wrap(1, b"a"), wrap(2, b"b")].concat())).repeat((2 * n - 32) / 26),
            "labels, samples or entries",
        ),
        (
            "/api/v1/write",
            v2,
            [wrap(4, b""), empties(4, n - 16)].concat(),
            "labels, samples or entries",
        ),
        (
            "/api/v1/write",
            v2,
            [wrap(4, b""), wrap(5, &wrap(1, &refs))].concat(),
            "labels, samples or entries",
        ),
        (
            "/loki/api/v1/push",
            pb,
            loki_stream(b"{a=\"b\"}", &empties(2, n - 16)),
            "labels, samples or entries",
        ),
        (
            "/loki/api/v1/push",
            pb,
            loki_stream(b"{a=\"b\"}", &wrap(2, &empties(3, n - 16))),
            "labels, samples or entries",
        ),
        (
            "/loki/api/v1/push",
            pb,
            loki_stream(&vec![b'='; 2 * n - 32], b""),
            "labels, samples or entries",
        ),
    ];
    let target = &otlp;
    for chunk in push_shots.chunks(3) {
        let answers = futures::future::join_all(chunk.iter().map(|(path, content_type, body, _)| {
            let shot = Shot {
                path,
                content_type,
                encoding: "snappy",
                body: snappy(body),
            };
            async move { (send(target, &shot).await, shot.body.len()) }
        }))
        .await;
        for ((path, _, _, holds), (r, len)) in chunk.iter().zip(answers) {
            assert!(len < 1 << 20, "{path}: {len} bytes compressed");
            let text = r.text();
            assert_eq!(r.status, 413, "{path}: {text}");
            assert!(
                text.contains("--max-decoded-size") && text.contains(holds),
                "{path}: {text}"
            );
        }
    }

    // gRPC, gzip-compressed: RESOURCE_EXHAUSTED naming the limit.
    for (path, body) in [
        (mira_ingester::otlp::GRPC_TRACES, empty_spans(n)),
        (mira_ingester::otlp::GRPC_LOGS, empty_attributes(n - 8)),
    ] {
        let status = grpc_send(&grpc, path, body).await;
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("--max-decoded-size"), "{}", status.message());
    }

    // The heaviest requests it must take: just under the per-request
    // limit, eight at once against four slots and room for two in the
    // decoded budget. Each is decoded whole (the window then rejects the
    // empty spans' zero times), and waits for room rather than adding up.
    let heavy = (MAX_DECODED as usize / 520).min(n);
    let shot = Shot {
        path: "/v1/traces",
        content_type: pb,
        encoding: "gzip",
        body: gzip(&empty_spans(heavy)),
    };
    let answers = futures::future::join_all((0..8).map(|_| send(&otlp, &shot))).await;
    let accepted = answers.iter().filter(|r| r.status == 200).count();
    for r in &answers {
        assert!(matches!(r.status, 200 | 429), "{}: {}", r.status, r.text());
    }
    assert!(accepted >= 1, "none of the heavy requests was taken");

    // The bound the configuration implies: request bodies in the slots
    // (compressed and decompressed), the in-flight decoded budget, and the
    // open generation of each signal, which one request can take past the
    // seal size by at most its own size, twice while it seals.
    let bound = SLOTS * 2 * MAX_MESSAGE + INFLIGHT_DECODED + 3 * 2 * (SEAL + MAX_DECODED);
    let peak = vm_hwm(pid);
    eprintln!(
        "peak {} MiB, base {} MiB, bound {} MiB, heavy requests accepted {accepted} of 8",
        peak / MIB,
        base / MIB,
        bound / MIB
    );
    assert!(
        peak <= base + bound,
        "peak {} MiB over a base of {} MiB, bound {} MiB",
        peak / MIB,
        base / MIB,
        bound / MIB
    );

    // Still serving: another tenant's rows are taken and read back.
    let r = http::post(
        &otlp,
        "/v1/logs",
        &[("content-type", pb), ("X-Scope-OrgID", "calm")],
        log_export(&[("service.name", "calm")], (0..10).map(|i| (i, format!("calm-{i}")))),
    )
    .await
    .expect("an answer");
    assert_eq!(r.status, 200, "{}", r.text());
    let path = format!(
        "/api/mira/v1/logs?start={}&end={}&limit=100",
        t0(),
        t0() + 3_600_000_000_000
    );
    let lines = wait_for("calm's rows", Duration::from_secs(60), || async {
        let r = http::request("GET", &query, &path, &[("X-Scope-OrgID", "calm")], Vec::new()).await?;
        let n = r.json()["lines"].as_array().map_or(0, Vec::len);
        (n == 10).then_some(n)
    })
    .await;
    assert_eq!(lines, 10);
    assert!(p.is_running(i), "the process exited");
}
