//! `mira querier` as a real process behind a real `mira catalog` and
//! `mira ingester`: the merge of published and recent data across seals
//! (every acknowledged row exactly once), pruning by trace-id Bloom filters
//! seen in `stats`, corrupted cache files and objects, and hostile queries.

#[path = "support/procs.rs"]
mod procs;

use std::collections::{HashMap, HashSet};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mira_catalog::{CatalogClient, ClientConfig};
use mira_testkit::http::{self, wait_ready};
use mira_testkit::net::wait_for;
use mira_testkit::otlp::log_export;
use mira_testkit::{EPOCH_NS, EPOCH_S, recent_base_time as t0};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use procs::{Procs, Role};
use prost::Message;
use serde_json::Value;

const PB: (&str, &str) = ("Content-Type", "application/x-protobuf");

fn str_kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        key_strindex: 0,
    }
}

/// One trace of three spans, id derived from `n`.
fn trace_export(n: u8) -> (Vec<u8>, String) {
    let trace_id = vec![n; 16];
    let spans = (0..3u8)
        .map(|i| Span {
            trace_id: trace_id.clone(),
            span_id: vec![n, i, 1, 1, 1, 1, 1, 1],
            parent_span_id: if i == 0 { vec![] } else { vec![n, 0, 1, 1, 1, 1, 1, 1] },
            name: format!("op-{i}"),
            start_time_unix_nano: t0() + u64::from(n) * 1000 + u64::from(i),
            end_time_unix_nano: t0() + u64::from(n) * 1000 + 500,
            ..Default::default()
        })
        .collect();
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![str_kv("service.name", "checkout")],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    (req.encode_to_vec(), format!("{n:02x}").repeat(16))
}

/// GETs `path`; the status and the answer as JSON (status 0 when none came).
async fn get(addr: &str, path: &str) -> (u16, Value) {
    http::get(addr, path)
        .await
        .map_or((0, Value::String(String::new())), |r| (r.status, r.json()))
}

/// A catalog member and an ingester (started with `flags`) as processes.
async fn stack(flags: &[&str]) -> Procs {
    let mut p = Procs::with_ingester();
    p.start_ingester(flags);
    wait_ready(p.http()).await;
    p
}

/// POSTs the one-record export `n` (body `r-{n}`, service `svc`, at
/// `t0() + n`) to the ingester at `addr`; the status (0 when no answer).
async fn post_log(addr: &str, n: u64) -> u16 {
    let body = log_export(&[("service.name", "svc")], [(n, format!("r-{n}"))]);
    http::post(addr, "/v1/logs", &[PB], body).await.map_or(0, |r| r.status)
}

/// Adds and starts a querier (two query threads, and `flags`); its index
/// in the harness and its address, once it is ready.
async fn querier(p: &mut Procs, flags: &[&str]) -> (usize, String) {
    let q = p.add(Role::Querier, &[&["--query-threads", "2"], flags].concat());
    p.start(q);
    let addr = p[q].addr.clone();
    wait_ready(&addr).await;
    (q, addr)
}

fn bodies(answer: &Value) -> Vec<String> {
    answer["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .map(|l| {
            l["record"]["body"]["stringValue"]
                .as_str()
                .expect("string body")
                .to_owned()
        })
        .collect()
}

fn logs_path(limit: usize) -> String {
    format!(
        "/api/mira/v1/logs?start={}&end={}&limit={limit}",
        t0(),
        t0() + 1_000_000_000
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_in_a_tight_loop_see_every_acknowledged_row_once_across_seals() {
    // Seals every few exports.
    let mut p = stack(&["--seal-size", "4000"]).await;
    let (_, q) = querier(&mut p, &[]).await;
    let http_addr = p.http().to_owned();
    let acked = Arc::new(Mutex::new(HashSet::new()));
    let sender = {
        let acked = acked.clone();
        tokio::spawn(async move {
            for n in 0..400u64 {
                if post_log(&http_addr, n).await == 200 {
                    acked.lock().expect("lock").insert(n);
                }
            }
        })
    };
    let mut rounds = 0;
    let mut last_seen = 0;
    let mut done = false;
    let (mut saw_recent, mut saw_published) = (false, false);
    // Rounds while the sender runs, then one after it finished.
    while !done {
        done = sender.is_finished();
        rounds += 1;
        let must_have: HashSet<u64> = acked.lock().expect("lock").clone();
        let (status, answer) = get(&q, &logs_path(10_000)).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["partial"], false, "{answer}");
        saw_recent |= answer["stats"]["recent_blocks"].as_u64() > Some(0);
        saw_published |= answer["stats"]["blocks_considered"].as_u64() > Some(0);
        let seen = bodies(&answer);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for b in &seen {
            *counts.entry(b.as_str()).or_default() += 1;
        }
        if let Some((b, c)) = counts.iter().find(|(_, c)| **c > 1) {
            panic!("round {rounds}: {b} seen {c} times");
        }
        for n in &must_have {
            assert!(
                counts.contains_key(format!("r-{n}").as_str()),
                "round {rounds}: r-{n} missing; saw {} rows: {}",
                seen.len(),
                answer["stats"]
            );
        }
        // Newest first: r-N has time t0() + N.
        let nums: Vec<u64> = seen.iter().map(|b| b[2..].parse().expect("number")).collect();
        assert!(nums.windows(2).all(|w| w[0] > w[1]), "round {rounds}: not newest first");
        last_seen = seen.len();
    }
    sender.await.expect("sender");
    assert_eq!(acked.lock().expect("lock").len(), 400);
    assert!(rounds > 3, "the loop ran alongside the sender");
    assert_eq!(last_seen, 400, "the round after the sender saw everything");
    assert!(saw_recent && saw_published, "rounds merged open and published blocks");

    // Pages of 7 through the cursor give every row once, in order.
    let mut cursor: Option<String> = None;
    let mut paged = Vec::new();
    loop {
        let mut path = logs_path(7);
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (status, answer) = get(&q, &path).await;
        assert_eq!(status, 200, "{answer}");
        paged.extend(bodies(&answer));
        match answer["cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
        assert!(paged.len() <= 400, "the cursor loops");
    }
    let expected: Vec<String> = (0..400u64).rev().map(|n| format!("r-{n}")).collect();
    assert_eq!(paged, expected);
    // Oldest first with a selector and a line filter.
    let path = format!(
        "{}&direction=forward&selector=%7Bresource.service.name%3D%22svc%22%7D&regex=r-1[0-9]$",
        logs_path(5)
    );
    let (status, answer) = get(&q, &path).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(bodies(&answer), ["r-10", "r-11", "r-12", "r-13", "r-14"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_lookup_reads_only_blocks_whose_bloom_filter_matches() {
    // Every export seals its own block.
    let mut p = stack(&["--seal-size", "1"]).await;
    let (_, q) = querier(&mut p, &[]).await;
    let mut ids = Vec::new();
    for n in 1..=12u8 {
        let (body, id) = trace_export(n);
        let answer = http::post(p.http(), "/v1/traces", &[PB], body).await.expect("answer");
        assert_eq!(answer.status, 200, "{}", answer.text());
        ids.push(id);
    }
    let range = format!("start={}&end={}", t0(), t0() + 1_000_000_000);
    wait_for("all twelve published", Duration::from_secs(60), || async {
        let (_, a) = get(&q, &format!("/api/mira/v1/traces/{}?{range}", ids[0])).await;
        (a["stats"]["blocks_considered"].as_u64() == Some(12) && a["stats"]["recent_blocks"] == 0).then_some(())
    })
    .await;
    let (status, a) = get(&q, &format!("/api/mira/v1/traces/{}?{range}", ids[5])).await;
    assert_eq!(status, 200, "{a}");
    let stats = &a["stats"];
    assert_eq!(stats["blocks_considered"], 12, "{stats}");
    assert_eq!(
        stats["blocks_fetched"], 1,
        "only the matching block's rows are read: {stats}"
    );
    assert_eq!(stats["blocks_pruned"]["bloom"], 11, "{stats}");
    assert_eq!(a["span_count"], 3);
    let spans = &a["trace"]["resourceSpans"][0]["scopeSpans"][0]["spans"];
    assert_eq!(spans[0]["traceId"], ids[5].as_str());
    assert_eq!(
        a["trace"]["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
        "checkout"
    );
    // OTLP form, and search summaries.
    let (status, otlp) = get(&q, &format!("/api/mira/v1/traces/{}?{range}&format=otlp", ids[5])).await;
    assert_eq!(status, 200);
    assert_eq!(otlp, a["trace"]);
    let (status, found) = get(
        &q,
        &format!("/api/mira/v1/traces/search?{range}&service=checkout&name=op-0&limit=3"),
    )
    .await;
    assert_eq!(status, 200, "{found}");
    let traces = found["traces"].as_array().expect("traces");
    assert_eq!(traces.len(), 3);
    assert_eq!(traces[0]["traceId"], ids[11].as_str(), "newest first");
    assert_eq!(traces[0]["rootServiceName"], "checkout");
    assert_eq!(traces[0]["rootSpanName"], "op-0");
    assert_eq!(traces[0]["spanCount"], 3);
    assert_eq!(traces[0]["durationNano"], "500");
    // An unknown trace is a 404.
    let (status, _) = get(&q, &format!("/api/mira/v1/traces/{}?{range}", "ab".repeat(16))).await;
    assert_eq!(status, 404);
    // Labels and values for pickers.
    let (status, labels) = get(&q, &format!("/api/mira/v1/labels?signal=traces&{range}")).await;
    assert_eq!(status, 200, "{labels}");
    assert!(
        labels["data"]
            .as_array()
            .expect("data")
            .contains(&Value::from("resource.service.name"))
    );
    let (_, values) = get(
        &q,
        &format!("/api/mira/v1/label/resource.service.name/values?signal=traces&{range}"),
    )
    .await;
    assert_eq!(values["data"], serde_json::json!(["checkout"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_cache_files_are_refetched_and_corrupted_objects_are_errors_not_rows() {
    // Every export seals its own block.
    let mut p = stack(&["--seal-size", "1"]).await;
    for n in 0..3 {
        let status = post_log(p.http(), n).await;
        assert_eq!(status, 200);
    }
    let (qi, q) = querier(&mut p, &[]).await;
    let cache = p[qi].dir.join("cache");
    let expected = wait_for("three published rows", Duration::from_secs(60), || async {
        let (_, a) = get(&q, &logs_path(10)).await;
        (a["stats"]["recent_blocks"] == 0 && a["lines"].as_array().is_some_and(|l| l.len() == 3)).then(|| bodies(&a))
    })
    .await;
    assert_eq!(expected, ["r-2", "r-1", "r-0"]);
    p.stop(qi);

    // Flip a byte in every cached section; a new querier (a restart) over
    // the same cache answers the same rows, fetching each section again.
    let mut flipped = 0;
    for entry in std::fs::read_dir(&cache).expect("cache dir") {
        let path = entry.expect("entry").path();
        let mut bytes = std::fs::read(&path).expect("read");
        if let Some(b) = bytes.get_mut(0) {
            *b ^= 0xff;
            std::fs::write(&path, &bytes).expect("write");
            flipped += 1;
        }
    }
    assert!(flipped > 3, "the first queries filled the cache ({flipped} files)");
    p.start(qi);
    wait_ready(&q).await;
    let (status, a) = get(&q, &logs_path(10)).await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(bodies(&a), expected);
    assert!(a["stats"]["bytes_from_store"].as_u64() > Some(0), "{a}");
    let metrics = http::get(&q, "/metrics").await.expect("metrics").text();
    let corrupt: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("mira_querier_cache_corrupt_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("corrupt counter");
    assert!(corrupt >= 3, "{metrics}");
    p.stop(qi);

    // Corrupt the objects themselves: a fresh querier with an empty cache
    // answers an error naming the block, never rows.
    let mut damaged = 0;
    for path in files_under(&p.objects()) {
        let mut bytes = std::fs::read(&path).expect("read");
        // Inside the first section (after the 8-byte header and padding).
        bytes[70] ^= 0x55;
        std::fs::write(&path, bytes).expect("write");
        damaged += 1;
    }
    assert_eq!(damaged, 3);
    let (_, q) = querier(&mut p, &[]).await;
    let (status, a) = get(&q, &logs_path(10)).await;
    assert_eq!(status, 500, "{a}");
    assert_eq!(a["errorType"], "corrupt_block", "{a}");
    assert!(a.get("lines").is_none());
    // A 500 names its kind only: the detail (which object, which check)
    // is in the querier's log, not sent to the client.
    assert!(!a.to_string().contains(".mira"), "{a}");
}

/// Every file under `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("ls") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_queries_get_a_clear_4xx_and_the_querier_keeps_serving() {
    let mut p = stack(&["--seal-size", "1048576"]).await;
    let status = post_log(p.http(), 1).await;
    assert_eq!(status, 200);
    let (_, q) = querier(&mut p, &[]).await;
    let base = "/api/mira/v1/logs";
    let cases: Vec<(String, u16, &str)> = vec![
        (format!("{base}?selector=%7Ba%3D%22b%22"), 400, "expected ',' or '}'"),
        (format!("{base}?selector=a%3D%22b%22%7D"), 400, "expected '{'"),
        (format!("{base}?regex=(a"), 400, "regex"),
        (format!("{base}?limit=1000000000"), 422, "--max-query-limit"),
        (format!("{base}?limit=-1"), 400, "limit="),
        (format!("{base}?start=200&end=100"), 400, "after end"),
        (format!("{base}?start=0&end={EPOCH_NS}"), 422, "--max-query-range"),
        (format!("{base}?direction=sideways"), 400, "direction="),
        (format!("{base}?cursor=garbage"), 400, "cursor"),
        ("/api/mira/v1/traces/xyz".to_owned(), 400, "32 hex digits"),
        ("/api/mira/v1/labels?signal=metricz".to_owned(), 400, "signal="),
        (
            "/api/mira/v1/traces/search?min_duration=5parsecs".to_owned(),
            400,
            "min_duration=",
        ),
        ("/api/mira/v1/traces/search?status=maybe".to_owned(), 400, "status="),
        (
            "/api/mira/v1/metrics/query?query=sum(rate(x%5B5m%5D)".to_owned(),
            400,
            "parse error at byte 15",
        ),
        (
            "/api/mira/v1/metrics/query?query=x%7Ba%3D%22b%22".to_owned(),
            400,
            "inside braces",
        ),
        (
            "/api/mira/v1/metrics/query?query=sort(x)".to_owned(),
            400,
            "not supported",
        ),
        (
            format!(
                "/api/mira/v1/metrics/query_range?query=x&start={EPOCH_S}&end={}&step=0.1",
                EPOCH_S + 86_400
            ),
            422,
            "steps",
        ),
        (
            format!(
                "/api/mira/v1/metrics/query_range?query=x&start={EPOCH_S}&end={}&step=15",
                EPOCH_S - 100
            ),
            400,
            "after end",
        ),
        ("/api/mira/v1/metrics/query".to_owned(), 400, "query is required"),
    ];
    for (path, want, says) in &cases {
        let (status, body) = get(&q, path).await;
        assert_eq!(status, *want, "{path}: {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(says)),
            "{path}: {body}"
        );
    }
    // A catastrophic regex for a backtracking engine runs in linear time.
    let (status, body) = get(&q, &format!("{}&regex=%5E(a%2B)%2B%24", logs_path(10))).await;
    assert_eq!(status, 200, "{body}");
    // A tenant header with characters a tenant id cannot hold.
    let answer = http::request(
        "GET",
        &q,
        "/api/mira/v1/logs",
        &[("X-Scope-OrgID", "../etc")],
        Vec::new(),
    )
    .await
    .expect("answer");
    let body = answer.text();
    assert_eq!(answer.status, 400, "{body}");
    assert!(body.contains("X-Scope-OrgID"), "{body}");
    // A 10 MB query string is refused before it reaches a handler (a head
    // that size is written raw: the server answers before reading it all).
    let huge = format!(
        "GET {base}?selector={} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(10 << 20)
    );
    let status = http::raw_request(&q, huge.as_bytes()).await.status;
    assert!((400..500).contains(&status), "10 MB query string: {status}");
    // Still serving, with the right answer.
    let (status, body) = get(&q, &logs_path(10)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(bodies(&body), ["r-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingester_that_does_not_answer_makes_the_answer_partial_not_an_error() {
    let mut p = stack(&["--seal-size", "1048576", "--seal-age", "300s"]).await;
    let status = post_log(p.http(), 1).await;
    assert_eq!(status, 200);
    // A registered ingester that takes connections and never answers.
    let ghost = TcpListener::bind("127.0.0.1:0").expect("bind");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as i64;
    CatalogClient::new(
        vec![p.catalog_addr().to_owned()],
        ClientConfig {
            dialer: p.dialer(),
            ..ClientConfig::default()
        },
    )
    .heartbeat("ghost", &ghost.local_addr().expect("addr").to_string(), now, 600_000)
    .await
    .expect("lease");
    let (_, q) = querier(&mut p, &["--recent-timeout", "300ms"]).await;
    let (status, a) = get(&q, &logs_path(10)).await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["partial"], true, "{a}");
    assert!(
        a["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("ingester ghost did not answer")),
        "{a}"
    );
    assert_eq!(bodies(&a), ["r-1"], "the live ingester's rows are still there");
    assert_eq!(a["stats"]["ingesters_asked"], 2);
    drop(ghost);
}
