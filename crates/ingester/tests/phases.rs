//! The phase probes (`mira_ingester_phase_seconds{signal,phase}`): every
//! accepted export, over HTTP or gRPC, is observed once in each phase;
//! a refused one in none. Exports past `DECODE_INLINE_MAX` (decoded on the
//! blocking pool) are stored or refused like small ones.

#[path = "support/common.rs"]
mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{post_log, published_bodies, start, status};
use mira_ingester::PipelineConfig;
use mira_ingester::metrics::Phase;
use mira_ingester::shard::{DECODE_INLINE_MAX, SealPolicy};
use mira_testkit::store::TestStore;

/// `mira_ingester_phase_seconds_{count,sum}` of logs, by phase.
fn phase_series(metrics: &str, kind: &str) -> HashMap<String, f64> {
    let prefix = format!("mira_ingester_phase_seconds_{kind}{{signal=\"logs\",phase=\"");
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (phase, value) = rest.split_once("\"} ")?;
            Some((phase.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

async fn grpc_export(
    client: &mut tonic::client::Grpc<tonic::transport::Channel>,
    body: Vec<u8>,
) -> Result<(), tonic::Status> {
    client.ready().await.expect("ready");
    client
        .unary(
            tonic::Request::new(bytes::Bytes::from(body)),
            tonic::codegen::http::uri::PathAndQuery::from_static(mira_ingester::otlp::GRPC_LOGS),
            mira_ingester::otlp::RawCodec,
        )
        .await
        .map(|_: tonic::Response<bytes::Bytes>| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_export_is_timed_once_in_every_phase() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = PipelineConfig {
        shards: 2,
        queue_bytes: 16 << 20,
        admit_wait: Duration::from_secs(5),
        seal: SealPolicy {
            max_bytes: 64 << 20,
            max_age: Duration::from_secs(3600),
        },
        upload_queue: 4,
        limits: Default::default(),
        max_past: Duration::from_secs(7 * 86_400),
        max_future: Duration::from_secs(600),
    };
    let store = Arc::new(TestStore::new());
    let running = start(dir.path(), pipeline, 16 << 20, store.clone()).await;
    let (http, grpc) = (running.node.http_addr(), running.node.grpc_addr());

    // Three over HTTP, three over gRPC (one large), two refused (one large).
    for n in 0..3u64 {
        assert_eq!(status(&post_log(http, n, format!("http-{n}")).await), 200);
    }
    let refused = mira_testkit::http::post(
        http,
        "/v1/logs",
        &[("Content-Type", "application/x-protobuf")],
        b"\xff\xff not protobuf".to_vec(),
    )
    .await;
    assert_eq!(status(&refused), 400);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = tonic::client::Grpc::new(channel);
    for n in 3..5u64 {
        let body = mira_testkit::otlp::log_export(&[], [(n, format!("grpc-{n}"))]);
        grpc_export(&mut client, body).await.expect("grpc export");
    }
    let large = mira_testkit::otlp::log_export(
        &[],
        (0..100u64).map(|i| (100 + i, format!("large-{i} {}", "x".repeat(1000)))),
    );
    assert!(large.len() >= DECODE_INLINE_MAX);
    grpc_export(&mut client, large).await.expect("large export");
    let refused = grpc_export(&mut client, vec![0xff; DECODE_INLINE_MAX + 1])
        .await
        .expect_err("garbage");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");

    let metrics = mira_testkit::http::get(http, "/metrics").await.expect("metrics").text();
    let counts = phase_series(&metrics, "count");
    let sums = phase_series(&metrics, "sum");
    for phase in Phase::ALL {
        assert_eq!(
            counts.get(phase.as_str()),
            Some(&6.0),
            "phase {} should count the six accepted exports:\n{metrics}",
            phase.as_str()
        );
    }
    // The work itself took time (the WAL is on, so its write is timed).
    for phase in [Phase::Decode, Phase::WalWrite, Phase::Total] {
        assert!(
            sums.get(phase.as_str()).is_some_and(|s| *s > 0.0),
            "phase {} has no time:\n{metrics}",
            phase.as_str()
        );
    }

    // What was accepted is published, once; nothing refused is.
    running.node.shutdown().await;
    let mut bodies = published_bodies(&running.client, &store).await;
    let large = bodies.iter().filter(|b| b.starts_with("large-")).count();
    bodies.retain(|b| !b.starts_with("large-"));
    bodies.sort_unstable();
    assert_eq!(large, 100, "the large export is stored whole");
    assert_eq!(bodies, ["grpc-3", "grpc-4", "http-0", "http-1", "http-2"]);
    running.catalog.shutdown().await;
}
