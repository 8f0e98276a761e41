//! Acknowledged means durable, with real processes (`mira catalog`,
//! `mira ingester`, `mira querier`): each test drives one path that used to
//! lose or duplicate acknowledged rows (the sequence restarting below the
//! catalog's watermarks, a change of `--shards`, a refused publish, a WAL
//! on a full disk, a second process under the same id, a lapsed lease,
//! `--wal off` after a crash, many tenants in one publish, replay under
//! other limits, metrics points reordered by series at seal, remote-written
//! samples across a crash and a shard change) and compares
//! the exact acknowledged set with what the published objects hold.

#[path = "support/procs.rs"]
mod procs;

use std::collections::HashMap;
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientConfig};
use mira_testkit::http::{self, wait_ready};
use mira_testkit::net::wait_for;
use mira_testkit::recent_base_time;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use procs::{
    INGESTER, Procs, Role, child_exit, published_blocks, published_bodies, published_bodies_of, published_tables,
    request, terminate,
};

const PB: (&str, &str) = ("Content-Type", "application/x-protobuf");

/// Sends `rec-{first}..` (`n` records) for `tenant`; returns the status and
/// the answer's text.
async fn export(addr: &str, tenant: &str, first: u64, n: u64) -> (u16, String) {
    let answer = http::post(addr, "/v1/logs", &[PB, ("X-Scope-OrgID", tenant)], request(first, n))
        .await
        .expect("the ingester answers");
    (answer.status, answer.text())
}

/// Asserts the published `rec-*` bodies of `tenant` are exactly `want`,
/// each once.
async fn assert_published_exactly(p: &Procs, tenant: &str, want: impl IntoIterator<Item = u64>) {
    let counts = published_bodies_of(p, tenant).await;
    let want: HashMap<String, usize> = want.into_iter().map(|i| (format!("rec-{i}"), 1)).collect();
    let dup: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dup.is_empty(), "{tenant}: published more than once: {dup:?}");
    let missing: Vec<_> = want.keys().filter(|k| !counts.contains_key(*k)).take(10).collect();
    assert!(
        missing.is_empty(),
        "{tenant}: acknowledged but not published: {missing:?}"
    );
    let extra: Vec<_> = counts.keys().filter(|k| !want.contains_key(*k)).take(10).collect();
    assert!(
        extra.is_empty(),
        "{tenant}: published but never acknowledged: {extra:?}"
    );
}

/// Waits until `/ready` answers something other than 200.
async fn wait_not_ready(addr: &str, what: &str) {
    wait_for(what, Duration::from_secs(60), || async {
        http::get(addr, "/ready").await.filter(|r| r.status != 200).map(|_| ())
    })
    .await;
}

/// Item 1: a WAL volume lost under the same ingester id (or a WAL the sweep
/// emptied) starts its sequence above the catalog's watermarks, so the
/// next publish is not refused as a watermark going back. Before the fix,
/// the last export was acknowledged and then dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_wal_volume_under_the_same_id_continues_above_the_watermarks() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    for i in 0..10 {
        assert_eq!(export(p.http(), "default", i * 5, 5).await.0, 200);
    }
    p.stop_ingester();
    std::fs::remove_dir_all(p[INGESTER].dir.join("wal")).expect("lose the WAL volume");
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    assert_eq!(export(p.http(), "default", 1000, 5).await.0, 200);
    p.stop_ingester();
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    p.stop_ingester();
    assert_published_exactly(&p, "default", (0..50).chain(1000..1005)).await;
    assert!(
        !p.logs().contains("would go back"),
        "a publish was refused as a watermark going back"
    );
}

/// Item 2: kill -9 with `--shards 4`, restart with 1, stop, restart with 2:
/// every acknowledged record once. Before the fix, 150 of 200 appeared
/// twice after the second restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_another_shard_count_publishes_every_record_once() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&["--shards", "4", "--seal-age", "3600s"]);
    wait_ready(p.http()).await;
    for i in 0..200 {
        assert_eq!(export(p.http(), "default", i, 1).await.0, 200);
    }
    p.kill_ingester();
    p.start_ingester(&["--shards", "1", "--seal-age", "3600s"]);
    wait_ready(p.http()).await;
    p.stop_ingester();
    assert_published_exactly(&p, "default", 0..200).await;
    p.start_ingester(&["--shards", "2", "--seal-age", "3600s"]);
    wait_ready(p.http()).await;
    assert_eq!(export(p.http(), "default", 500, 1).await.0, 200);
    p.stop_ingester();
    assert_published_exactly(&p, "default", (0..200).chain([500])).await;
}

/// Item 9: `--wal off` after a crash in page-cache mode still publishes
/// the frames the crashed process acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_off_after_a_crash_still_replays_the_acknowledged_frames() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&["--seal-age", "3600s"]);
    wait_ready(p.http()).await;
    for i in 0..20 {
        assert_eq!(export(p.http(), "default", i * 3, 3).await.0, 200);
    }
    p.kill_ingester();
    p.start_ingester(&["--seal-age", "1s", "--wal", "off"]);
    wait_ready(p.http()).await;
    // In off mode an export is answered once its generation is published;
    // one with no records still is (at the generation's seal age).
    let empty = opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest::default();
    let answered = tokio::time::timeout(
        Duration::from_secs(60),
        http::post(p.http(), "/v1/logs", &[PB], prost::Message::encode_to_vec(&empty)),
    )
    .await
    .expect("an empty export in off mode is answered");
    assert_eq!(answered.map(|r| r.status), Some(200));
    p.stop_ingester();
    assert_published_exactly(&p, "default", 0..60).await;
}

/// Item 9: recovery seals as it reads: a WAL holding more than
/// `--seal-size` of rows comes back as several published generations
/// (not one held in memory), each record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_seals_as_it_reads_the_wal() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&["--shards", "1", "--seal-age", "3600s"]);
    wait_ready(p.http()).await;
    for i in 0..40 {
        assert_eq!(export_big(p.http(), i).await.0, 200);
    }
    p.kill_ingester();
    p.start_ingester(&["--shards", "1", "--seal-age", "3600s", "--seal-size", "65536"]);
    wait_ready(p.http()).await;
    let blocks = published_blocks(&p, "default", pb::Signal::Logs).await;
    assert!(
        blocks.len() >= 4,
        "320 KiB of rows over a 64 KiB seal target: {} blocks published by the recovery",
        blocks.len()
    );
    p.stop_ingester();
    let counts = published_bodies(&p).await;
    for i in 0..40 {
        assert_eq!(counts.get(&format!("big-{i}")), Some(&1), "big-{i}");
    }
    assert!(p.logs().contains("WAL recovered"));
}

/// Item 9: a replay rebuilds rows under the limits they were acknowledged
/// with, not the restarted process's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_keeps_rows_as_acknowledged_whatever_the_new_limits() {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use prost::Message;
    let mut p = Procs::with_ingester();
    p.start_ingester(&["--seal-age", "3600s", "--max-attributes", "8"]);
    wait_ready(p.http()).await;
    let mut req = ExportLogsServiceRequest::decode(request(0, 1).as_slice()).expect("decode");
    req.resource_logs[0].scope_logs[0].log_records[0].attributes = (0..12)
        .map(|i| KeyValue {
            key: format!("k{i}"),
            value: Some(AnyValue {
                value: Some(any_value::Value::IntValue(i)),
            }),
            ..Default::default()
        })
        .collect();
    let answer = http::post(p.http(), "/v1/logs", &[PB], req.encode_to_vec())
        .await
        .expect("answer");
    assert_eq!(answer.status, 200);
    p.kill_ingester();
    p.start_ingester(&["--seal-age", "3600s", "--max-attributes", "2"]);
    wait_ready(p.http()).await;
    p.stop_ingester();
    let tables = published_tables(&p, pb::Signal::Logs).await;
    assert_eq!(tables.len(), 1);
    let otlp = mira_core::convert::logs_to_otlp(&tables[0]).expect("otlp");
    let rec = &otlp.resource_logs[0].scope_logs[0].log_records[0];
    assert_eq!(
        (rec.attributes.len(), rec.dropped_attributes_count),
        (8, 4),
        "the row as acknowledged under --max-attributes 8"
    );
}

/// Item 3: a generation whose publish the catalog refuses whole (not one
/// tenant's block: see the next test) is quarantined whole, its frames
/// stay in the WAL, no watermark passes it, and a restart stops naming the
/// quarantine instead of serving without those rows. Before the fix the
/// refused generation's rows were dropped and the next watermark covered
/// them. (The refusal is a fault hook: every path that reaches the catalog
/// with an invalid command is a bug.)
#[cfg(feature = "fault-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_publish_is_quarantined_and_nothing_acknowledged_is_dropped() {
    let mut p = Procs::with_ingester();
    let flags = ["--shards", "1", "--seal-age", "3600s"];
    let hook = [("MIRA_FAULT_REFUSE_PUBLISH", "bad")];
    p.start_ingester_env(&flags, &hook);
    wait_ready(p.http()).await;
    assert_eq!(export(p.http(), "good", 0, 3).await.0, 200);
    assert_eq!(export(p.http(), "bad", 10, 1).await.0, 200);
    // Seal now: SIGTERM seals and publishes; the publish is refused.
    let mut child = p.take(INGESTER);
    terminate(&child);
    // The quarantine is written before anything else happens.
    let qdir = p[INGESTER].dir.join("quarantine");
    let entry = wait_for("a quarantined generation", Duration::from_secs(60), || {
        let qdir = qdir.clone();
        async move {
            std::fs::read_dir(&qdir)
                .ok()?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|d| d.join("reason.txt").exists())
        }
    })
    .await;
    let frames = std::fs::read(entry.join("frames.wal")).expect("frames");
    let mut r = mira_core::wal::FrameReader::new(&frames, 0);
    let mut tenants = Vec::new();
    while let Some(f) = r.next_frame() {
        tenants.push(f.expect("frame").tenant.as_str().to_owned());
    }
    tenants.sort();
    assert_eq!(tenants, vec!["bad", "good"], "the whole generation is kept");
    let reason = std::fs::read_to_string(entry.join("reason.txt")).expect("reason");
    assert!(reason.contains("refused"), "{reason}");
    let _ = child.kill();
    let _ = child.wait();
    // Nothing of it was published and no watermark moved past its frames.
    assert!(published_bodies_of(&p, "good").await.is_empty());
    let client = CatalogClient::new(
        vec![p.catalog_addr().to_owned()],
        ClientConfig {
            dialer: p.dialer(),
            ..ClientConfig::default()
        },
    );
    let marks = client
        .get_watermarks(pb::GetWatermarksRequest {
            ingester_id: "ingester-0".into(),
            linearizable: true,
        })
        .await
        .expect("watermarks");
    assert!(
        marks.watermarks.iter().all(|w| w.wal_seq == 0),
        "{:?}",
        marks.watermarks
    );
    // A restart recovers the frames again (the WAL kept them), finds the
    // generation still refused, quarantines it again and stops with an
    // error naming the quarantine instead of serving without those rows.
    p.start_ingester_env(&flags, &hook);
    let mut child = p.take(INGESTER);
    let exit = child_exit(&mut child, "the restarted ingester");
    assert!(!exit.success());
    assert!(p.logs().contains("cannot be published"), "{}", p.logs());
    assert_eq!(std::fs::read_dir(&qdir).expect("ls").count(), 2);
    assert!(published_bodies_of(&p, "good").await.is_empty());
    // Once the cause is gone, the same frames publish, each once.
    p.start_ingester(&flags);
    wait_ready(p.http()).await;
    p.stop_ingester();
    assert_published_exactly(&p, "good", 0..3).await;
    assert_published_exactly(&p, "bad", [10]).await;
}

/// Item 3 in `--wal off`: a generation the catalog refuses is answered
/// with an error, never an ack (there is no WAL to keep it: the client's
/// retry is the copy), and is not published later. Before the fix the
/// waiting clients were acknowledged and the rows dropped.
#[cfg(feature = "fault-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_off_answers_a_refused_generation_with_an_error() {
    let mut p = Procs::with_ingester();
    let flags = ["--shards", "1", "--seal-age", "1s", "--wal", "off"];
    p.start_ingester_env(&flags, &[("MIRA_FAULT_REFUSE_PUBLISH", "bad")]);
    wait_ready(p.http()).await;
    let (status, text) = export(p.http(), "bad", 0, 2).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("cannot publish"), "{text}");
    wait_not_ready(p.http(), "/ready to report the quarantine").await;
    p.stop_ingester();
    // The client retries against a fixed ingester: stored once.
    p.start_ingester(&flags);
    wait_ready(p.http()).await;
    assert_eq!(export(p.http(), "bad", 0, 2).await.0, 200);
    p.stop_ingester();
    assert_published_exactly(&p, "bad", [0, 1]).await;
}

/// The quarantine directory's copies: `(dir, tenants of its frames)`.
fn quarantine_copies(p: &Procs) -> Vec<(std::path::PathBuf, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir(p[INGESTER].dir.join("quarantine")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for d in entries.filter_map(Result::ok).map(|e| e.path()) {
        let Ok(frames) = std::fs::read(d.join("frames.wal")) else {
            continue;
        };
        if !d.join("reason.txt").exists() {
            continue;
        }
        let mut r = mira_core::wal::FrameReader::new(&frames, 0);
        let mut tenants = Vec::new();
        while let Some(f) = r.next_frame() {
            tenants.push(f.expect("frame").tenant.as_str().to_owned());
        }
        out.push((d, tenants));
    }
    out
}

/// Issue 29 item 7: one tenant's block the catalog would refuse is set
/// aside alone: its rows go to the quarantine directory, the other
/// tenants' rows of the same generation are published, every tenant keeps
/// ingesting (no 503), `/ready` stays 200 naming the copy, and after a
/// kill -9 the process starts (with the poison still there), names the
/// copy again and serves; nothing acknowledged of the good tenant is lost
/// or duplicated. Before the fix the whole generation was quarantined,
/// every tenant got 503 and the restart refused to run.
#[cfg(feature = "fault-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_tenant_is_quarantined_alone_and_the_others_keep_going() {
    let mut p = Procs::with_ingester();
    let flags = ["--shards", "1", "--seal-age", "1s"];
    let hook = [("MIRA_FAULT_REFUSE_TENANT", "bad")];
    p.start_ingester_env(&flags, &hook);
    wait_ready(p.http()).await;
    // One generation holding both tenants' rows.
    assert_eq!(export(p.http(), "good", 0, 3).await.0, 200);
    assert_eq!(export(p.http(), "bad", 10, 1).await.0, 200);
    let copies = wait_for("bad's block quarantined", Duration::from_secs(60), || async {
        let c = quarantine_copies(&p);
        (!c.is_empty()).then_some(c)
    })
    .await;
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(
        copies[0].1,
        vec!["bad"],
        "only the poisoned tenant's rows are set aside"
    );
    let copy = copies[0]
        .0
        .file_name()
        .and_then(|n| n.to_str())
        .expect("name")
        .to_owned();
    // The others keep ingesting, and /ready stays 200 naming the copy.
    let ready = http::get(p.http(), "/ready").await.expect("ready");
    assert_eq!(ready.status, 200, "{}", ready.text());
    assert!(ready.text().contains(&copy), "{}", ready.text());
    for i in 0..3 {
        let (status, text) = export(p.http(), "good", 3 + i * 2, 2).await;
        assert_eq!(status, 200, "{text}");
    }
    let metrics = http::get(p.http(), "/metrics").await.expect("metrics").text();
    assert!(metrics.contains("mira_ingester_quarantined 1"), "{metrics}");
    assert!(
        metrics.contains("mira_ingester_refusing_writes{reason=\"quarantine\"} 0"),
        "{metrics}"
    );
    // The generation's good rows were published with it.
    wait_for("good's first rows published", Duration::from_secs(60), || async {
        let c = published_bodies_of(&p, "good").await;
        (0..3).all(|i| c.contains_key(&format!("rec-{i}"))).then_some(())
    })
    .await;
    // kill -9 with rows still open, then restart with the poison still
    // there: the process starts and names the copy.
    assert_eq!(export(p.http(), "bad", 20, 1).await.0, 200);
    assert_eq!(export(p.http(), "good", 9, 1).await.0, 200);
    p.kill_ingester();
    p.start_ingester_env(&flags, &hook);
    wait_ready(p.http()).await;
    let ready = http::get(p.http(), "/ready").await.expect("ready").text();
    assert!(ready.contains(&copy), "{ready}");
    let querier = p.add(Role::Querier, &["--recent-timeout", "2s"]);
    p.start(querier);
    assert_eq!(export(p.http(), "good", 100, 2).await.0, 200);
    let query_addr = p[querier].addr.clone();
    let start = recent_base_time() - 60_000_000_000;
    let end = recent_base_time() + 600_000_000_000;
    let path = format!("/api/mira/v1/logs?start={start}&end={end}&limit=100");
    wait_for("the querier to answer good's rows", Duration::from_secs(60), || async {
        let r = http::request("GET", &query_addr, &path, &[("X-Scope-OrgID", "good")], Vec::new()).await?;
        let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
        (r.status == 200 && v["lines"].as_array().map(Vec::len) == Some(12)).then_some(())
    })
    .await;
    p.stop_ingester();
    assert_published_exactly(&p, "good", (0..10).chain(100..102)).await;
    assert!(published_bodies_of(&p, "bad").await.is_empty());
    // Each of bad's exports is kept in a copy (the second may be copied
    // twice: by the killed process and by the replay).
    let bad: Vec<_> = quarantine_copies(&p).into_iter().flat_map(|(_, t)| t).collect();
    assert!(bad.len() >= 2 && bad.iter().all(|t| t == "bad"), "{bad:?}");
}

/// Item 5: records outside the time window are refused as an OTLP partial
/// success naming the reason and counted, while the other tenants' and
/// the good records of the same request are published, and a replay does
/// not bring the refused ones back. Before the fix one record at 2^63 ns
/// made the catalog refuse every co-located tenant's block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_timestamps_are_refused_and_never_poison_other_tenants() {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use prost::Message;
    let mut p = Procs::with_ingester();
    let flags = ["--shards", "1", "--seal-age", "3600s"];
    p.start_ingester(&flags);
    wait_ready(p.http()).await;
    assert_eq!(export(p.http(), "neighbour", 0, 2).await.0, 200);
    let mut req = ExportLogsServiceRequest::decode(request(10, 5).as_slice()).expect("decode");
    let now = recent_base_time() + 600_000_000_000;
    let records = &mut req.resource_logs[0].scope_logs[0].log_records;
    records[0].time_unix_nano = 1 << 63;
    records[1].time_unix_nano = u64::MAX;
    records[2].time_unix_nano = 1;
    records[3].time_unix_nano = now + 3_600_000_000_000;
    let answer = http::post(
        p.http(),
        "/v1/logs",
        &[PB, ("X-Scope-OrgID", "hostile")],
        req.encode_to_vec(),
    )
    .await
    .expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let partial = ExportLogsServiceResponse::decode(answer.body.as_slice()).expect("response");
    let ps = partial.partial_success.expect("a partial success");
    assert_eq!(ps.rejected_log_records, 4, "{ps:?}");
    assert!(
        ps.error_message.contains("older than") && ps.error_message.contains("newer than"),
        "{}",
        ps.error_message
    );
    let metrics = http::get(p.http(), "/metrics").await.expect("metrics").text();
    assert!(
        metrics.contains("mira_ingester_out_of_window_total{signal=\"logs\",outcome=\"too_new\"} 3"),
        "{metrics}"
    );
    // kill -9: the replay rebuilds the accepted record only.
    p.kill_ingester();
    p.start_ingester(&flags);
    wait_ready(p.http()).await;
    p.stop_ingester();
    assert_published_exactly(&p, "neighbour", [0, 1]).await;
    assert_published_exactly(&p, "hostile", [14]).await;
}

/// Item 6: with the WAL on a full filesystem an export is answered 503
/// and none of its rows are published; once space is back the retries
/// are acknowledged and every acknowledged record is published once.
/// Before the fix the refused export's rows were published anyway and
/// every retry added a copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_wal_disk_acknowledges_nothing_and_publishes_nothing_unacknowledged() {
    let mut p = Procs::with_ingester();
    let wal = p[INGESTER].dir.join("wal");
    std::fs::create_dir_all(&wal).expect("wal dir");
    let mount = Tmpfs::mount(&wal, 1 << 20);
    // Most of the filesystem taken by a file we can delete later.
    let filler = wal.join("filler");
    let fill = |room: usize| {
        let free = mount.as_ref().map_or(0, |m| m.free_bytes());
        std::fs::write(&filler, vec![0u8; free.saturating_sub(room)]).expect("filler");
    };
    if mount.is_some() {
        fill(96 << 10);
    }
    p.start_ingester(&["--shards", "1", "--seal-age", "3600s"]);
    wait_ready(p.http()).await;
    let mut acked = Vec::new();
    let mut refused = Vec::new();
    // 8 KiB records: the WAL fills after a few exports.
    for i in 0..400u64 {
        if mount.is_none() && i == 5 {
            // No tmpfs here: the fault hook fails writes as a full disk does.
            std::fs::write(wal.join("FAIL_WRITES"), b"").expect("hook");
        }
        let (status, text) = export_big(p.http(), i).await;
        match status {
            200 => acked.push(i),
            503 => {
                assert!(
                    text.contains("No space left") || text.contains("write-ahead log"),
                    "{text}"
                );
                refused.push(i);
                if refused.len() == 3 {
                    break;
                }
            }
            other => panic!("unexpected {other}: {text}"),
        }
    }
    assert!(
        !acked.is_empty() && refused.len() == 3,
        "acked {acked:?} refused {refused:?}"
    );
    wait_not_ready(p.http(), "/ready to report the WAL failure").await;
    // Space is back: the next write succeeds and the client's retries of
    // the refused exports are acknowledged.
    let _ = std::fs::remove_file(&filler);
    let _ = std::fs::remove_file(wal.join("FAIL_WRITES"));
    for i in refused.clone() {
        let (status, text) = export_big(p.http(), i).await;
        assert_eq!(status, 200, "retry of {i}: {text}");
        acked.push(i);
    }
    wait_ready(p.http()).await;
    p.stop_ingester();
    let counts = published_bodies(&p).await;
    let want: Vec<String> = acked.iter().map(|i| format!("big-{i}")).collect();
    for w in &want {
        assert_eq!(counts.get(w), Some(&1), "{w}: {:?}", counts.get(w));
    }
    assert_eq!(counts.len(), want.len(), "only acknowledged exports are published");
    drop(mount);
}

/// One log export of one 8 KiB record `big-{i}` padded after the name.
async fn export_big(addr: &str, i: u64) -> (u16, String) {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use prost::Message;
    let mut req = ExportLogsServiceRequest::decode(request(i, 1).as_slice()).expect("decode");
    let rec = &mut req.resource_logs[0].scope_logs[0].log_records[0];
    rec.body = Some(AnyValue {
        value: Some(any_value::Value::StringValue(format!("big-{i}"))),
    });
    rec.attributes = vec![KeyValue {
        key: "pad".into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(format!("{i:08}{}", "x".repeat(8 << 10)))),
        }),
        ..Default::default()
    }];
    let answer = http::post(addr, "/v1/logs", &[PB], req.encode_to_vec())
        .await
        .expect("answer");
    (answer.status, answer.text())
}

/// A small tmpfs mounted over a directory for the length of a test.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// `None` when this machine does not let the test mount one (then the
    /// test uses the WAL's fault hook instead).
    fn mount(dir: &std::path::Path, bytes: u64) -> Option<Tmpfs> {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok && !cfg!(feature = "fault-hooks") {
            panic!("no tmpfs could be mounted and the fault hooks are not built in");
        }
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }

    fn free_bytes(&self) -> usize {
        let out = std::process::Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&self.0)
            .output()
            .expect("df");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .expect("df output")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Item 7: a second process under the same ingester id fences the first:
/// the first can no longer publish, refuses writes and says why. Before
/// the fix both published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_under_the_same_id_fences_the_first() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&["--shards", "1"]);
    wait_ready(p.http()).await;
    assert_eq!(export(p.http(), "default", 0, 2).await.0, 200);
    wait_for("the first export published", Duration::from_secs(60), || async {
        (published_bodies(&p).await.len() == 2).then_some(())
    })
    .await;
    // A second ingester process: its own ports and data, the same id.
    let b = p.add(Role::Ingester, &["--shards", "1"]);
    p.start(b);
    let http_b = p[b].addr.clone();
    wait_ready(&http_b).await;
    // The old process does not know yet: it takes this export, then its
    // publish is refused as fenced.
    assert_eq!(export(p.http(), "default", 10, 2).await.0, 200);
    wait_not_ready(p.http(), "the fenced ingester to stop being ready").await;
    let (status, text) = export(p.http(), "default", 20, 2).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("took over"), "{text}");
    assert!(p.logs().contains("fenced"));
    // The new process publishes.
    assert_eq!(export(&http_b, "default", 30, 2).await.0, 200);
    let mut child = p.take(b);
    terminate(&child);
    child_exit(&mut child, "ingester b");
    p.kill_ingester();
    // rec-10/11 were acknowledged by the fenced process: they stay in its
    // WAL (published when that volume's id starts again), never by it now.
    assert_published_exactly(&p, "default", [0, 1, 30, 31]).await;
}

/// Item 8: an ingester that cannot renew its lease stops acknowledging
/// until it can. Before the fix it kept acknowledging with the catalog
/// gone and its lease lapsed (so queriers stopped asking it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingester_without_a_lease_refuses_writes_until_it_has_one_again() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&["--lease-ttl", "2s"]);
    wait_ready(p.http()).await;
    assert_eq!(export(p.http(), "default", 0, 1).await.0, 200);
    p.kill_catalog();
    wait_not_ready(p.http(), "the ingester to notice the catalog gone").await;
    // Until the lease runs out exports may still be acknowledged (and so
    // must be published); from then on they are refused.
    let acked = std::sync::Arc::new(std::sync::Mutex::new(vec![0]));
    let next = std::sync::atomic::AtomicU64::new(1000);
    let (status, text) = wait_for("a refused export", Duration::from_secs(60), || async {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let r = export(p.http(), "default", n, 1).await;
        if r.0 == 200 {
            acked.lock().expect("lock").push(n);
            return None;
        }
        Some(r)
    })
    .await;
    let mut acked = acked.lock().expect("lock").clone();
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("lease"), "{text}");
    p.start_catalog();
    wait_ready(p.http()).await;
    // Readiness can still drop for a moment while a renewal that was sent
    // before the catalog came back is replaced: an export is acknowledged
    // within the deadline, and the refused tries are not.
    wait_for("an acknowledged export", Duration::from_secs(60), || async {
        (export(p.http(), "default", 2, 1).await.0 == 200).then_some(())
    })
    .await;
    acked.push(2);
    p.stop_ingester();
    assert_published_exactly(&p, "default", acked).await;
}

/// Item 8: a querier answering while an ingester that holds open rows is
/// down (its lease lapsed) says `partial`, instead of answering without
/// those rows. Before the fix the ingester dropped out of the live list
/// and the answer was silently short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_missing_a_crashed_ingesters_open_rows_is_partial() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&["--lease-ttl", "2s", "--seal-age", "3600s"]);
    wait_ready(p.http()).await;
    let querier = p.add(Role::Querier, &["--recent-timeout", "500ms"]);
    p.start(querier);
    let query_addr = p[querier].addr.clone();
    assert_eq!(export(p.http(), "default", 0, 3).await.0, 200);
    let start = recent_base_time() - 60_000_000_000;
    let end = recent_base_time() + 60_000_000_000;
    let path = format!("/api/mira/v1/logs?start={start}&end={end}&limit=100");
    let body = wait_for("the querier to answer", Duration::from_secs(60), || async {
        http::get(&query_addr, &path)
            .await
            .filter(|r| r.status == 200)
            .map(|r| r.text())
    })
    .await;
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["partial"], false, "{body}");
    assert_eq!(v["lines"].as_array().map(Vec::len), Some(3), "{body}");
    p.kill_ingester();
    // Wait until the catalog no longer counts the ingester live.
    let client = CatalogClient::new(
        vec![p.catalog_addr().to_owned()],
        ClientConfig {
            dialer: p.dialer(),
            ..ClientConfig::default()
        },
    );
    wait_for(
        "the crashed ingester's lease to lapse",
        Duration::from_secs(60),
        || async {
            let live = client
                .list_ingesters(pb::ListIngestersRequest {
                    now_ns: 0,
                    linearizable: true,
                    include_expired: false,
                })
                .await
                .ok()?;
            live.ingesters.is_empty().then_some(())
        },
    )
    .await;
    let answer = http::get(&query_addr, &path).await.expect("answer");
    let body = answer.text();
    assert_eq!(answer.status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["partial"], true, "{body}");
    assert!(body.contains("ingester-0"), "the warning names the ingester: {body}");
    // An operator who knows the ingester is gone for good forgets it: the
    // answers are whole again (without its unpublished rows, by choice).
    let out = p
        .cli()
        .args([
            "catalog-admin",
            "--catalog",
            p.catalog_addr(),
            "forget-ingester",
            "ingester-0",
        ])
        .output()
        .expect("catalog-admin");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let body = http::get(&query_addr, &path).await.expect("answer").text();
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["partial"], false, "{body}");
}

/// Item 4: more tenants in one generation than one catalog command may
/// carry are staged in chunks; a kill -9 between two chunks duplicates
/// nothing and loses nothing.
#[cfg(feature = "fault-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tenants_publish_in_chunks_and_a_crash_between_chunks_duplicates_nothing() {
    let mut p = Procs::with_ingester();
    let flags = ["--shards", "1", "--seal-age", "3600s", "--publish-chunk-blocks", "3"];
    p.start_ingester_env(&flags, &[("MIRA_FAULT_ABORT_AFTER_STAGE", "1")]);
    wait_ready(p.http()).await;
    for t in 0..10u64 {
        assert_eq!(export(p.http(), &format!("t{t}"), t * 10, 2).await.0, 200);
    }
    // SIGTERM seals the generation: 10 blocks, the first chunk of 3 is
    // staged, then the process dies (the hook aborts, as kill -9 would).
    let mut child = p.take(INGESTER);
    terminate(&child);
    let exit = child_exit(&mut child, "the ingester");
    assert!(!exit.success(), "the process died between two chunks: {exit:?}");
    for t in 0..10u64 {
        assert!(
            published_bodies_of(&p, &format!("t{t}")).await.is_empty(),
            "t{t}: a staged chunk became visible without its commit"
        );
    }
    p.start_ingester(&flags);
    wait_ready(p.http()).await;
    p.stop_ingester();
    for t in 0..10u64 {
        assert_published_exactly(&p, &format!("t{t}"), [t * 10, t * 10 + 1]).await;
    }
    assert!(p.logs().contains("WAL recovered"));
}

/// Request `i` of the metrics test: one gauge point for each of three
/// series (`s` = 0, 1, 2) at `base + i` seconds with value `i`, so every
/// request interleaves the series and a sealed block must reorder them.
fn metrics_request(base: u64, i: u64) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric, number_data_point,
    };
    use prost::Message;
    let points = (0..3)
        .map(|s| NumberDataPoint {
            attributes: vec![KeyValue {
                key: "s".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(s)),
                }),
                ..Default::default()
            }],
            time_unix_nano: base + i * 1_000_000_000,
            value: Some(number_data_point::Value::AsDouble(i as f64)),
            ..Default::default()
        })
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "soak".into(),
                    data: Some(metric::Data::Gauge(Gauge { data_points: points })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// How many times each published gauge point (its attributes and time)
/// is in the published metrics blocks; asserts every block's points are
/// ordered by series.
async fn published_points(p: &Procs) -> HashMap<(String, u64), usize> {
    let mut seen: HashMap<(String, u64), usize> = HashMap::new();
    let tables = published_tables(p, pb::Signal::Metrics).await;
    assert!(!tables.is_empty(), "nothing published");
    for t in &tables {
        let points = t.get(mira_core::schema::POINTS).expect("points");
        let of = points
            .column_by_name("series")
            .expect("series")
            .as_any()
            .downcast_ref::<arrow::array::UInt32Array>()
            .expect("u32");
        assert!(
            of.values().windows(2).all(|w| w[0] <= w[1]),
            "a published block's points are not ordered by series"
        );
        let req = mira_core::convert::points_to_otlp(t).expect("otlp");
        for rm in &req.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    let Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Gauge(g)) = &m.data else {
                        panic!("not a gauge: {m:?}");
                    };
                    for dp in &g.data_points {
                        let s = format!("{:?}", dp.attributes);
                        *seen.entry((s, dp.time_unix_nano)).or_insert(0) += 1;
                    }
                }
            }
        }
    }
    seen
}

/// The crash of the metrics tests: requests 0..60 to an ingester with
/// `--shards 4` in page-cache mode, kill -9, requests 60..90 after a
/// restart with `--shards 1 --wal fsync`, then a restart with `--shards 2`
/// and a stop. `send(addr, i)` sends request `i` and asserts it was
/// acknowledged.
async fn crash_and_reshard<F, Fut>(p: &mut Procs, send: F)
where
    F: Fn(String, u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    p.start_ingester(&["--shards", "4", "--wal", "page-cache", "--seal-age", "3600s"]);
    wait_ready(p.http()).await;
    for i in 0..60 {
        send(p.http().to_owned(), i).await;
    }
    p.kill_ingester();
    p.start_ingester(&["--shards", "1", "--wal", "fsync", "--seal-age", "3600s"]);
    wait_ready(p.http()).await;
    for i in 60..90 {
        send(p.http().to_owned(), i).await;
    }
    p.stop_ingester();
    p.start_ingester(&["--shards", "2", "--seal-age", "3600s"]);
    wait_ready(p.http()).await;
    p.stop_ingester();
}

/// [`published_points`], asserting none is published more than once.
async fn published_once(p: &Procs) -> HashMap<(String, u64), usize> {
    let seen = published_points(p).await;
    let dup: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(dup.is_empty(), "published more than once: {dup:?}");
    seen
}

/// Points are ordered by series when a block is sealed, including blocks
/// sealed from the WAL after a crash: kill -9 with `--shards 4` in
/// page-cache mode, restart with `--shards 1` and `--wal fsync`, then
/// `--shards 2`; every acknowledged point is published once, and every
/// published block's points are ordered by series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_points_are_published_once_and_ordered_by_series_across_a_crash() {
    let base = recent_base_time();
    let mut p = Procs::with_ingester();
    let send = |addr: String, i: u64| async move {
        http::post(&addr, "/v1/metrics", &[PB], metrics_request(base, i))
            .await
            .expect("the ingester answers")
            .status
    };
    crash_and_reshard(&mut p, |addr, i| async move { assert_eq!(send(addr, i).await, 200) }).await;
    let seen = published_once(&p).await;
    let per_time: HashMap<u64, usize> = seen.keys().fold(HashMap::new(), |mut m, (_, t)| {
        *m.entry(*t).or_insert(0) += 1;
        m
    });
    let want: Vec<u64> = (0..90).map(|i| base + i * 1_000_000_000).collect();
    let missing: Vec<_> = want.iter().filter(|t| per_time.get(t) != Some(&3)).take(10).collect();
    assert!(missing.is_empty(), "acknowledged points not all published: {missing:?}");
    assert_eq!(seen.len(), 270, "published points that were never acknowledged");
}

/// Request `i` of the remote-write test: one sample of each of three
/// series of `rw_once` (`s` = 0, 1, 2) at `base_ms` + `i` seconds with
/// value `i`, remote write 1.0, snappy-compressed as Prometheus sends it.
fn remote_write_request(base_ms: u64, i: u64) -> Vec<u8> {
    use mira_testkit::push::{Label, Sample, TimeSeries, WriteRequest};
    use prost::Message;
    let label = |name: &str, value: String| Label {
        name: name.into(),
        value,
    };
    let timeseries = (0..3)
        .map(|s| TimeSeries {
            labels: vec![
                label("__name__", "rw_once".into()),
                label("job", "durability".into()),
                label("s", s.to_string()),
            ],
            samples: vec![Sample {
                value: i as f64,
                timestamp: i64::try_from(base_ms + i * 1000).expect("ms"),
            }],
        })
        .collect();
    snap::raw::Encoder::new()
        .compress_vec(&WriteRequest { timeseries }.encode_to_vec())
        .expect("snappy")
}

/// Remote-written samples acknowledged (204) are published exactly once
/// across a kill -9 with `--shards 4` in page-cache mode, a restart with
/// `--shards 1` and `--wal fsync`, and another with `--shards 2`: the
/// exact acknowledged set, each sample once, nothing never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_written_samples_are_published_once_across_a_crash_and_a_shard_change() {
    let base_ms = recent_base_time() / 1_000_000;
    let mut p = Procs::with_ingester();
    let send = |addr: String, i: u64| async move {
        let r = http::post(
            &addr,
            "/api/v1/write",
            &[PB, ("Content-Encoding", "snappy")],
            remote_write_request(base_ms, i),
        )
        .await
        .expect("the ingester answers");
        (
            r.status,
            r.header("x-prometheus-remote-write-samples-written").map(str::to_owned),
        )
    };
    crash_and_reshard(&mut p, |addr, i| async move {
        assert_eq!(send(addr, i).await, (204, Some("3".to_owned())));
    })
    .await;
    let seen = published_once(&p).await;
    let mut want = HashMap::new();
    for i in 0..90 {
        for s in 0..3 {
            want.insert((s.to_string(), (base_ms + i * 1000) * 1_000_000), 1usize);
        }
    }
    // The published points keyed by their `s` attribute's value.
    let got: HashMap<(String, u64), usize> = seen
        .into_iter()
        .map(|((attrs, t), n)| {
            let s = ["0", "1", "2"]
                .into_iter()
                .find(|v| attrs.contains(&format!("StringValue(\"{v}\")")))
                .unwrap_or("?");
            ((s.to_owned(), t), n)
        })
        .collect();
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).take(10).collect();
    assert!(missing.is_empty(), "acknowledged but not published: {missing:?}");
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).take(10).collect();
    assert!(extra.is_empty(), "published but never acknowledged: {extra:?}");
}
