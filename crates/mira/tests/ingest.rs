//! `mira ingester` as a real process behind a real `mira catalog`: every
//! acknowledged OTLP export is in the published blocks exactly once, across
//! a kill -9 and restart, and bad requests get a 4xx naming the problem.

#[path = "support/procs.rs"]
mod procs;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_testkit::http::{self, wait_ready};
use mira_testkit::net::wait_for;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use procs::{INGESTER, Procs, published_bodies, published_tables, request};
use prost::Message;

/// `recent_base_time() + n`, as OTLP/JSON writes a time.
fn at(n: u64) -> String {
    (mira_testkit::recent_base_time() + n).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_record_and_duplicates_none() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let mut p = Procs::with_ingester();
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    const PER: u64 = 50;
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let http_addr = p.http().to_owned();
    // Four senders run through the kill: exports in flight when the process
    // dies are not acknowledged and may or may not be published (once).
    let senders: Vec<_> = (0..4)
        .map(|_| {
            let (next, stop, acked, addr) = (next.clone(), stop.clone(), acked.clone(), http_addr.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let body = request(n * PER, PER);
                    match http::post(&addr, "/v1/logs", &[("Content-Type", "application/x-protobuf")], body)
                        .await
                        .map(|r| r.status)
                    {
                        Some(200) => acked.lock().expect("lock").push(n),
                        Some(_) => {}
                        None => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            })
        })
        .collect();
    let acked_len = || acked.lock().expect("lock").len();
    wait_for("300 acknowledged exports", Duration::from_secs(60), || async {
        (acked_len() >= 300).then_some(())
    })
    .await;
    p.kill_ingester();
    let at_kill = acked_len();
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    wait_for("300 more acknowledged exports", Duration::from_secs(60), || async {
        (acked_len() >= at_kill + 300).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.await.expect("sender");
    }
    p.stop_ingester();
    let acked = acked.lock().expect("lock").clone();
    let sent = next.load(Ordering::Relaxed);
    let counts = published_bodies(&p).await;
    eprintln!(
        "acked {} exports of {sent}, {} records published",
        acked.len(),
        counts.len()
    );
    for (body, n) in &counts {
        assert_eq!(*n, 1, "{body} was published {n} times");
    }
    for req in &acked {
        for i in req * PER..(req + 1) * PER {
            assert!(
                counts.contains_key(&format!("rec-{i}")),
                "acknowledged record rec-{i} is missing"
            );
        }
    }
    assert!(counts.len() as u64 <= sent * PER);
    // Exports are whole: a published export has all its records.
    for n in 0..sent {
        let present = (n * PER..(n + 1) * PER)
            .filter(|i| counts.contains_key(&format!("rec-{i}")))
            .count();
        assert!(
            present == 0 || present == PER as usize,
            "export {n} is half published ({present})"
        );
    }
}

/// `n` zero bytes, gzipped (a few tens of KiB).
fn gzip_zeros(n: usize) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(&vec![0u8; n]).expect("gzip");
    e.finish().expect("gzip")
}

/// A log export whose body string is not UTF-8.
fn invalid_utf8() -> Vec<u8> {
    let mut bytes = request(0, 1);
    let at = bytes.windows(5).position(|w| w == b"rec-0").expect("body");
    bytes[at..at + 2].copy_from_slice(&[0xff, 0xfe]);
    bytes
}

/// A log export with a 5-byte trace id.
fn short_trace_id() -> Vec<u8> {
    let mut req = ExportLogsServiceRequest::decode(request(0, 1).as_slice()).expect("decode");
    req.resource_logs[0].scope_logs[0].log_records[0].trace_id = vec![1; 5];
    req.encode_to_vec()
}

/// (name, headers, body, expected status, text the answer must contain)
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<u8>, u16, &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_exports_get_4xx_naming_the_problem_and_nothing_is_lost() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    let good = request(0, 10);
    let pb_ct = ("Content-Type", "application/x-protobuf");
    let cases: Vec<Case<'_>> = vec![
        (
            "truncated protobuf",
            vec![pb_ct],
            good[..good.len() - 3].to_vec(),
            400,
            "",
        ),
        (
            "wrong content type",
            vec![("Content-Type", "text/plain")],
            good.clone(),
            415,
            "content type",
        ),
        (
            "invalid json",
            vec![("Content-Type", "application/json")],
            b"{\"resourceLogs\": [".to_vec(),
            400,
            "JSON",
        ),
        (
            "bad tenant",
            vec![pb_ct, ("X-Scope-OrgID", "../etc")],
            good.clone(),
            400,
            "X-Scope-OrgID",
        ),
        (
            "unknown encoding",
            vec![pb_ct, ("Content-Encoding", "br")],
            good.clone(),
            400,
            "encoding",
        ),
        (
            "bad gzip",
            vec![pb_ct, ("Content-Encoding", "gzip")],
            b"\x1f\x8bnot gzip".to_vec(),
            400,
            "gzip",
        ),
        ("invalid UTF-8 in a string", vec![pb_ct], invalid_utf8(), 400, "UTF-8"),
        (
            "trace id of the wrong length",
            vec![pb_ct],
            short_trace_id(),
            400,
            "trace_id must be 16 bytes",
        ),
        (
            "gzip bomb",
            vec![pb_ct, ("Content-Encoding", "gzip")],
            gzip_zeros(64 << 20),
            413,
            "limit",
        ),
    ];
    for (name, headers, body, status, needle) in cases {
        let answer = http::post(p.http(), "/v1/logs", &headers, body).await.expect(name);
        let text = answer.text();
        assert_eq!(answer.status, status, "{name}: {text}");
        assert!(text.contains(needle), "{name}: {text:?} should mention {needle:?}");
    }
    // A 1 GiB body is refused on its declared length, before it is sent.
    let len = 1 << 30;
    let head =
        format!("POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n");
    let (answer, sent) = http::raw_request_with_body(p.http(), &head, len).await;
    let (status, answer) = (answer.status, answer.text);
    assert_eq!(status, 413, "{answer}");
    assert!(answer.contains("limit"), "{answer}");
    assert!(
        sent < 1 << 30,
        "the answer came before the body was sent ({sent} bytes written)"
    );
    // OTLP/JSON with hex ids and string int64s is accepted.
    let json = r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"{t1}","body":{"stringValue":"json-1"},"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174"}]}]}]}"#
        .replace("{t1}", &at(1));
    let answer = http::post(p.http(), "/v1/logs", &[("Content-Type", "application/json")], json)
        .await
        .expect("json");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let answer = http::post(p.http(), "/v1/logs", &[pb_ct], good).await.expect("good");
    assert_eq!(answer.status, 200);
    // The probes count what happened.
    let answer = http::get(p.http(), "/metrics").await.expect("metrics");
    assert_eq!(answer.status, 200);
    let metrics = answer.text();
    for line in [
        "mira_ingester_requests_total{signal=\"logs\",outcome=\"invalid\"} 3",
        "mira_ingester_requests_total{signal=\"logs\",outcome=\"ok\"} 2",
        "mira_ingester_records_total{signal=\"logs\"} 11",
        "mira_ingester_wal_write_seconds_count 2",
    ] {
        assert!(metrics.contains(line), "/metrics lacks {line}:\n{metrics}");
    }
    for name in [
        "mira_ingester_admission_wait_seconds_count",
        "mira_ingester_decode_append_seconds_count",
        "mira_ingester_runtime_lag_seconds_count",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}");
    }
    p.stop_ingester();
    let counts = published_bodies(&p).await;
    assert_eq!(
        counts.len(),
        11,
        "the ten good records and the JSON one, nothing from the bad requests"
    );
    assert_eq!(counts.get("json-1"), Some(&1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_loadgen_runs_keeps_every_acknowledged_request_once() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    let acked_file = p.root.path().join("acked.txt");
    let loadgen = Command::new(env!("CARGO_BIN_EXE_mira"))
        .args([
            "loadgen",
            "--protocol",
            "grpc",
            "--target",
            p.grpc(),
            "--conns",
            "4",
            "--batch",
            "200",
            "--for",
            "8",
            "--rate",
            "100",
        ])
        .arg("--acked-file")
        .arg(&acked_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn loadgen");
    // Let it run, kill -9 the ingester mid-stream, bring it back.
    let wal = p[INGESTER].dir.join("wal");
    wait_for("WAL frames", Duration::from_secs(30), || async {
        let size: u64 = std::fs::read_dir(&wal)
            .ok()?
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum();
        (size > 1 << 20).then_some(())
    })
    .await;
    p.kill_ingester();
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    let status = tokio::task::spawn_blocking(move || loadgen.wait_with_output())
        .await
        .expect("join")
        .expect("loadgen");
    assert!(status.status.success());
    let report = String::from_utf8_lossy(&status.stdout).to_string();
    p.stop_ingester();
    let acked: Vec<u64> = std::fs::read_to_string(&acked_file)
        .expect("acked file")
        .lines()
        .map(|l| l.parse().expect("number"))
        .collect();
    assert!(
        acked.len() > 10,
        "loadgen acknowledged too little to mean anything: {report}"
    );
    let counts = published_bodies(&p).await;
    for (body, n) in counts.iter().filter(|(b, _)| b.starts_with("loadgen-")) {
        assert_eq!(*n, 1, "{body} published {n} times");
    }
    for n in &acked {
        assert_eq!(
            counts.get(&format!("loadgen-{n}")),
            Some(&1),
            "acknowledged request {n} is missing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attribute_limits_cut_logs_and_reject_metric_points_as_partial_success() {
    use opentelemetry_proto::tonic::collector::metrics::v1::{
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
    };
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let mut p = Procs::with_ingester();
    p.start_ingester(&["--max-attributes", "3", "--max-attribute-value-size", "8"]);
    wait_ready(p.http()).await;
    // Five attributes, one value of 20 bytes, one already dropped by the sender.
    let log = r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"{t1}",
        "body":{"stringValue":"limited-1"},"droppedAttributesCount":1,"attributes":[
        {"key":"a","value":{"stringValue":"0123456789abcdefghij"}},{"key":"b","value":{"intValue":"2"}},
        {"key":"c","value":{"boolValue":true}},{"key":"d","value":{"stringValue":"x"}},
        {"key":"e","value":{"stringValue":"y"}}]}]}]}]}"#
        .replace("{t1}", &at(1));
    let answer = http::post(p.http(), "/v1/logs", &[("Content-Type", "application/json")], log)
        .await
        .expect("logs");
    let status = answer.status;
    let answer: serde_json::Value = serde_json::from_slice(&answer.body).expect("json answer");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["partialSuccess"]["rejectedLogRecords"], "0", "{answer}");
    let message = answer["partialSuccess"]["errorMessage"].as_str().expect("message");
    assert!(message.contains("2 attributes dropped"), "{message}");
    assert!(message.contains("1 attribute values truncated to 8 bytes"), "{message}");

    // Two gauge points; the second has four attributes and is rejected.
    let metrics = r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"g","gauge":{"dataPoints":[
        {"timeUnixNano":"{t1}","asDouble":1.5,"attributes":[{"key":"k","value":{"stringValue":"v"}}]},
        {"timeUnixNano":"{t2}","asDouble":2.5,"attributes":[
          {"key":"k1","value":{"stringValue":"v"}},{"key":"k2","value":{"stringValue":"v"}},
          {"key":"k3","value":{"stringValue":"v"}},{"key":"k4","value":{"stringValue":"v"}}]}]}}]}]}]}"#;
    let metrics = metrics.replace("{t1}", &at(1)).replace("{t2}", &at(2));
    let protobuf = serde_json::from_str::<ExportMetricsServiceRequest>(&metrics)
        .expect("metrics json")
        .encode_to_vec();
    let answer = http::post(
        p.http(),
        "/v1/metrics",
        &[("Content-Type", "application/x-protobuf")],
        protobuf,
    )
    .await
    .expect("metrics");
    assert_eq!(answer.status, 200);
    let answer = ExportMetricsServiceResponse::decode(answer.body.as_slice()).expect("protobuf answer");
    let partial = answer.partial_success.expect("a partial success");
    assert_eq!(partial.rejected_data_points, 1);
    assert!(
        partial.error_message.contains("more than 3 attributes"),
        "{}",
        partial.error_message
    );
    let text = http::get(p.http(), "/metrics").await.expect("/metrics").text();
    for line in [
        "mira_ingester_limited_total{signal=\"metrics\",outcome=\"rejected_point\"} 1",
        "mira_ingester_limited_total{signal=\"logs\",outcome=\"dropped_attribute\"} 2",
        "mira_ingester_limited_total{signal=\"logs\",outcome=\"truncated_value\"} 1",
    ] {
        assert!(text.contains(line), "/metrics lacks {line}");
    }

    p.stop_ingester();
    let logs: Vec<_> = published_tables(&p, pb::Signal::Logs)
        .await
        .iter()
        .flat_map(|t| {
            let req = mira_core::convert::logs_to_otlp(t).expect("otlp");
            req.resource_logs
                .into_iter()
                .flat_map(|r| r.scope_logs)
                .flat_map(|s| s.log_records)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(logs.len(), 1);
    let kept: Vec<(String, String)> = logs[0]
        .attributes
        .iter()
        .map(|kv| {
            (
                kv.key.clone(),
                format!("{:?}", kv.value.as_ref().and_then(|v| v.value.as_ref())),
            )
        })
        .collect();
    assert_eq!(
        kept,
        vec![
            ("a".to_owned(), "Some(StringValue(\"01234567\"))".to_owned()),
            ("b".to_owned(), "Some(IntValue(2))".to_owned()),
            ("c".to_owned(), "Some(BoolValue(true))".to_owned()),
        ]
    );
    assert_eq!(
        logs[0].dropped_attributes_count, 3,
        "one from the sender, two over the limit"
    );
    let points: Vec<f64> = published_tables(&p, pb::Signal::Metrics)
        .await
        .iter()
        .flat_map(|t| {
            let req = mira_core::convert::points_to_otlp(t).expect("otlp");
            req.resource_metrics
                .into_iter()
                .flat_map(|r| r.scope_metrics)
                .flat_map(|s| s.metrics)
                .flat_map(|m| match m.data {
                    Some(Data::Gauge(g)) => g.data_points,
                    _ => Vec::new(),
                })
                .map(|p| match p.value {
                    Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(v)) => v,
                    other => panic!("unexpected value {other:?}"),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        points,
        vec![1.5],
        "the point within the limits is kept, the other is not"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_slots_bound_requests_and_a_stalled_body_gets_408() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&[
        "--max-inflight-requests",
        "1",
        "--admit-wait",
        "300ms",
        "--body-timeout",
        "2s",
    ]);
    wait_ready(p.http()).await;
    let json_ct = ("Content-Type", "application/json");
    let good = r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"{t1}","body":{"stringValue":"slot-1"}}]}]}]}"#
        .replace("{t1}", &at(1));
    // A client declares 1000 bytes, sends 11 and stalls: it holds the only slot.
    let stalled = tokio::spawn(http::raw_request(
        p.http().to_owned(),
        b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"resource",
    ));
    let inflight = |n: u32| {
        let addr = p.http().to_owned();
        move || {
            let addr = addr.clone();
            async move {
                http::get(&addr, "/metrics")
                    .await?
                    .text()
                    .contains(&format!("mira_ingester_inflight_requests {n}\n"))
                    .then_some(())
            }
        }
    };
    wait_for(
        "the stalled request to hold the slot",
        Duration::from_secs(30),
        inflight(1),
    )
    .await;
    // Another export waits for the slot, then is told to come back.
    let answer = http::post(p.http(), "/v1/logs", &[json_ct], good.clone())
        .await
        .expect("post");
    let text = answer.text();
    assert_eq!(answer.status, 429, "{text}");
    assert!(text.contains("in-flight request slots"), "{text}");
    // The staller gets 408 when its body time is up, and frees the slot.
    let answer = stalled.await.expect("the stalled client").text;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive"), "{answer}");
    wait_for("the slot to be free", Duration::from_secs(30), inflight(0)).await;
    let answer = http::post(p.http(), "/v1/logs", &[json_ct], good).await.expect("post");
    assert_eq!(answer.status, 200);
    p.stop_ingester();
    let bodies = published_bodies(&p).await;
    assert_eq!(bodies.get("slot-1"), Some(&1), "{bodies:?}");
    assert_eq!(bodies.len(), 1);
}

/// A real process runs on a test clock when `MIRA_TEST_CLOCK_FILE` names
/// an offset file (fault-hooks builds): a record two hours ahead is
/// refused by the time window until the test moves the process's clock
/// three hours forward, then accepted, without a restart.
#[cfg(feature = "fault-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_on_the_test_clock_decides_by_the_moved_time() {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
    let mut p = Procs::with_ingester();
    let clock = p[INGESTER].dir.join("clock");
    std::fs::create_dir_all(&p[INGESTER].dir).expect("dir");
    let clock_env = clock.to_str().expect("path").to_owned();
    p.start_ingester_env(&[], &[("MIRA_TEST_CLOCK_FILE", &clock_env)]);
    wait_ready(p.http()).await;
    let ahead = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
        + 2 * 3_600_000_000_000;
    let export = || {
        let mut req = ExportLogsServiceRequest::decode(request(0, 1).as_slice()).expect("decode");
        req.resource_logs[0].scope_logs[0].log_records[0].time_unix_nano = u64::try_from(ahead).expect("u64");
        req.encode_to_vec()
    };
    let rejected = |body: &[u8]| {
        ExportLogsServiceResponse::decode(body)
            .expect("response")
            .partial_success
            .map_or(0, |ps| ps.rejected_log_records)
    };
    let pb = [("Content-Type", "application/x-protobuf")];
    let first = http::post(p.http(), "/v1/logs", &pb, export()).await.expect("answer");
    assert_eq!((first.status, rejected(&first.body)), (200, 1), "{}", first.text());
    std::fs::write(&clock, "3h").expect("move the clock");
    // The lease was renewed by the old time: the process refuses writes
    // until it renews it by the new one, then takes the record.
    wait_ready(p.http()).await;
    let second = http::post(p.http(), "/v1/logs", &pb, export()).await.expect("answer");
    assert_eq!((second.status, rejected(&second.body)), (200, 0), "{}", second.text());
    p.stop_ingester();
    let bodies = published_bodies(&p).await;
    assert_eq!(bodies.values().sum::<usize>(), 1, "{bodies:?}");
}
