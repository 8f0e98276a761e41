//! The compactor as a real process beside a real catalog and ingester,
//! killed: at every step of a job (the `fault-hooks` build aborts it there,
//! as kill -9 would), and with kill -9 at random points while it works
//! under load. After each run the live blocks hold exactly the acknowledged
//! records, once each, and once a final `mira compactor --once` has run the
//! store holds only objects the catalog names.

#[path = "support/procs.rs"]
mod procs;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_testkit::http::{self, wait_ready};
use mira_testkit::net::wait_for;
use procs::{Procs, Role, child_exit, published_blocks, published_bodies, request};

const PB: (&str, &str) = ("Content-Type", "application/x-protobuf");

/// Flags of the compactors of these tests: merge any two blocks at once,
/// plan every second, short leases, delete replaced objects at once and
/// unknown ones after a second.
const FLAGS: &[&str] = &[
    "--min-block-age",
    "0s",
    "--merge-factor",
    "2",
    "--plan-interval",
    "1s",
    "--partition-lease-ttl",
    "3s",
    "--deletion-grace",
    "0s",
    "--orphan-grace",
    "1s",
];

async fn export(p: &Procs, first: u64, n: u64) {
    let answer = http::post(p.http(), "/v1/logs", &[PB], request(first, n))
        .await
        .expect("the ingester answers");
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// Sends `batches` batches of `per` records, each published (sealed)
/// before the next, so the partition gains that many blocks. Returns the
/// next record number.
async fn load(p: &Procs, mut next: u64, batches: usize, per: u64) -> u64 {
    for _ in 0..batches {
        let before = live_rows(p).await;
        export(p, next, per).await;
        next += per;
        wait_for("the batch to be published", Duration::from_secs(60), || async {
            (live_rows(p).await >= before + per).then_some(())
        })
        .await;
    }
    next
}

async fn live_rows(p: &Procs) -> u64 {
    published_blocks(p, "default", pb::Signal::Logs)
        .await
        .iter()
        .map(|b| b.rows)
        .sum()
}

/// The acknowledged records `rec-0 .. rec-{n-1}` are in the live blocks,
/// each exactly once.
async fn assert_exactly_once(p: &Procs, n: u64, when: &str) {
    let counts = published_bodies(p).await;
    let want: HashMap<String, usize> = (0..n).map(|i| (format!("rec-{i}"), 1)).collect();
    let dup: Vec<_> = counts.iter().filter(|(_, c)| **c > 1).take(10).collect();
    assert!(dup.is_empty(), "{when}: live more than once: {dup:?}");
    let missing: Vec<_> = want.keys().filter(|k| !counts.contains_key(*k)).take(10).collect();
    assert!(missing.is_empty(), "{when}: acknowledged but not live: {missing:?}");
    assert_eq!(counts.len(), want.len(), "{when}: live records never acknowledged");
}

/// Every block object under the store.
fn object_keys(p: &Procs) -> BTreeSet<String> {
    fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|x| x == "mira") {
                out.insert(path.strip_prefix(root).expect("test step").display().to_string());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&p.objects(), &p.objects(), &mut out);
    out
}

/// Stops the ingester (it seals and publishes what is open), runs one
/// `mira compactor --once` to the end, and checks exactness and that the
/// store holds only the live objects.
async fn finish_and_check(p: &mut Procs, c: usize, sent: u64) {
    p.stop_ingester();
    assert_exactly_once(p, sent, "before the final run").await;
    let mut flags = FLAGS.to_vec();
    flags.push("--once");
    p.start_with(c, &flags, &[]);
    let mut child = p.take(c);
    // The last orphans must be older than --orphan-grace (1s) when the
    // final sweep lists them: the run itself waits out takeovers first.
    let status = child_exit(&mut child, "compactor --once");
    assert!(status.success(), "compactor --once failed: {status:?}");
    assert_exactly_once(p, sent, "after the final run").await;
    let live: BTreeSet<String> = published_blocks(p, "default", pb::Signal::Logs)
        .await
        .into_iter()
        .map(|b| b.object_key)
        .collect();
    let stored = object_keys(p);
    let stray: Vec<_> = stored.difference(&live).collect();
    assert!(stray.is_empty(), "objects no live block names: {stray:?}");
    let gone: Vec<_> = live.difference(&stored).collect();
    assert!(gone.is_empty(), "live blocks without an object: {gone:?}");
}

#[cfg(feature = "fault-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compactor_killed_at_every_step_of_a_job_loses_and_doubles_nothing() {
    let mut p = Procs::with_ingester();
    let c = p.add(Role::Compactor, FLAGS);
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    let mut sent = 0;
    for step in [
        "after_lease",
        "after_manifest",
        "after_fetch",
        "after_put",
        "after_replace",
        "during_delete",
    ] {
        sent = load(&p, sent, 3, 40).await;
        p.start_with(c, FLAGS, &[("MIRA_FAULT_COMPACTOR", step)]);
        let mut child = p.take(c);
        let status = child_exit(&mut child, step);
        assert!(!status.success(), "{step}: the fault hook did not fire ({status:?})");
        assert_exactly_once(&p, sent, step).await;
    }
    finish_and_check(&mut p, c, sent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compactor_killed_at_random_under_load_loses_and_doubles_nothing() {
    let trials: usize = std::env::var("MIRA_CRASH_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let mut p = Procs::with_ingester();
    let c = p.add(Role::Compactor, FLAGS);
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    let mut sent = 0;
    // Kill points drawn from a fixed sequence (the same run every time):
    // 0 to 600 ms after the start, which falls before its first round, in
    // the middle of merging 9,000 records (fetch, merge, PUT, commit) or
    // after it.
    let mut rng: u64 = 0x5EED;
    for trial in 0..trials {
        sent = load(&p, sent, 3, 3000).await;
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let after = Duration::from_millis((rng >> 33) % 600);
        p.start_with(c, FLAGS, &[]);
        tokio::time::sleep(after).await; // the kill point itself, not a wait for a condition
        p.kill(c);
        assert_exactly_once(&p, sent, &format!("trial {trial}")).await;
        let live = published_blocks(&p, "default", pb::Signal::Logs).await.len();
        eprintln!(
            "trial {trial}: killed {} ms after the start; {sent} acknowledged records live exactly once in {live} blocks",
            after.as_millis()
        );
    }
    finish_and_check(&mut p, c, sent).await;
    eprintln!(
        "{trials} trials: {sent} acknowledged records, 0 lost, 0 duplicated; only live objects left after the final run"
    );
}

/// A logs export of records `r-{first}..` for `service`, four records per
/// timestamp (ties, as batch exporters stamp them), from `base_ns`.
fn logs_with_ties(base_ns: u64, first: u64, n: u64, service: &str) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use prost::Message;
    let kv = |k: &str, v: &str| KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        key_strindex: 0,
    };
    let log_records = (first..first + n)
        .map(|i| LogRecord {
            time_unix_nano: base_ns + (i / 4) * 1_000_000,
            severity_number: 9,
            body: Some(AnyValue {
                value: Some(any_value::Value::StringValue(format!("r-{i}"))),
            }),
            attributes: vec![kv("http.method", ["GET", "PUT", "POST"][(i % 3) as usize])],
            ..Default::default()
        })
        .collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![kv("service.name", service)],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                log_records,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// The answer without what depends on the layout (timings and read stats).
fn normalized(mut v: serde_json::Value) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("stats");
                m.remove("elapsed_us");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

/// Follows the native logs cursor at `limit` per page; `between` runs
/// after each page (a compaction, or nothing). The bodies in page order.
async fn walk<F, Fut>(q: &str, range: &str, limit: usize, mut between: F) -> Vec<String>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        let path = match &cursor {
            Some(c) => format!("/api/mira/v1/logs?{range}&limit={limit}&cursor={c}"),
            None => format!("/api/mira/v1/logs?{range}&limit={limit}"),
        };
        let a = http::get(q, &path).await.expect("querier answers");
        assert_eq!(a.status, 200, "{}", a.text());
        let v = a.json();
        for l in v["lines"].as_array().expect("lines") {
            out.push(l["record"]["body"]["stringValue"].as_str().expect("body").to_owned());
        }
        match v["cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
        between(page).await;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_query_answers_the_same_before_and_after_compaction_and_cursors_survive_it() {
    let mut p = Procs::with_ingester();
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    let q = p.add(Role::Querier, &["--query-threads", "2"]);
    p.start(q);
    let qa = p[q].addr.clone();
    wait_ready(&qa).await;
    // Two hours back: a closed hour the cold rewrite may take.
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("test step")
        .as_secs();
    let base_ns = (now_s / 3600 - 2) * 3600 * 1_000_000_000 + 60_000_000_000;
    let mut sent = 0u64;
    for round in 0..12u64 {
        let before = live_rows(&p).await;
        let service = format!("svc-{}", round % 3);
        let a = http::post(p.http(), "/v1/logs", &[PB], logs_with_ties(base_ns, sent, 30, &service))
            .await
            .expect("ingester answers");
        assert_eq!(a.status, 200, "{}", a.text());
        sent += 30;
        wait_for("published", Duration::from_secs(60), || async {
            (live_rows(&p).await >= before + 30).then_some(())
        })
        .await;
    }
    let (start, end) = (base_ns, base_ns + 3_000_000_000_000);
    let range = format!("start={start}&end={end}");
    let (s_s, e_s) = (start / 1_000_000_000, end / 1_000_000_000);
    let battery: Vec<String> = vec![
        format!("/api/mira/v1/logs?{range}&limit=1000"),
        format!("/api/mira/v1/logs?{range}&limit=1000&direction=forward"),
        format!("/api/mira/v1/logs?{range}&limit=25"),
        format!("/api/mira/v1/logs?{range}&limit=1000&contains=r-1"),
        format!("/api/mira/v1/logs?{range}&limit=1000&selector=%7Bservice.name%3D%22svc-1%22%7D"),
        format!("/api/mira/v1/logs?{range}&limit=1000&selector=%7Bhttp.method%3D%22PUT%22%7D"),
        format!("/api/mira/v1/labels?{range}"),
        format!("/api/mira/v1/label/service.name/values?{range}"),
        format!("/loki/api/v1/query_range?query=%7Bservice_name%3D~%22.%2B%22%7D&start={start}&end={end}&limit=1000"),
        format!(
            "/loki/api/v1/query_range?query=%7Bservice_name%3D%22svc-2%22%7D%20%7C%3D%20%22r-2%22&start={start}&end={end}&limit=1000&direction=forward"
        ),
        format!(
            "/loki/api/v1/query_range?query=sum%20by%20(service_name)%20(count_over_time(%7Bservice_name%3D~%22.%2B%22%7D%5B1m%5D))&start={s_s}&end={e_s}&step=60"
        ),
        format!("/loki/api/v1/labels?start={start}&end={end}"),
        format!("/loki/api/v1/series?match[]=%7Bservice_name%3D~%22.%2B%22%7D&start={start}&end={end}"),
        format!("/loki/api/v1/index/volume?query=%7Bservice_name%3D~%22.%2B%22%7D&start={start}&end={end}"),
    ];
    let answers = |battery: Vec<String>, qa: String| async move {
        let mut out = Vec::new();
        for path in &battery {
            let a = http::get(&qa, path).await.expect("querier answers");
            assert_eq!(a.status, 200, "{path}: {}", a.text());
            out.push(normalized(a.json()));
        }
        out
    };
    let before = answers(battery.clone(), qa.clone()).await;
    assert_eq!(
        before[0]["lines"].as_array().map(Vec::len),
        Some(sent as usize),
        "every record answered"
    );
    let blocks_before = published_blocks(&p, "default", pb::Signal::Logs).await.len();
    assert!(blocks_before >= 12, "{blocks_before} blocks");

    // A cursor walk at 7 lines per page with the hot merge run after page
    // 2 and the cold rewrite after page 5: every line once, in order.
    let unpaged: Vec<String> = walk(&qa, &range, 1000, |_| async {}).await;
    let c = p.add(Role::Compactor, FLAGS);
    let compactor_run = |flags: Vec<&'static str>| {
        let mut all = FLAGS.to_vec();
        all.extend(flags);
        all.push("--once");
        all
    };
    let hot = compactor_run(vec!["--cold-after", "1000h"]);
    let cold = compactor_run(vec!["--cold-after", "0s", "--settle", "0s"]);
    let p_ref = std::sync::Arc::new(std::sync::Mutex::new(p));
    let paged = {
        let p_ref = p_ref.clone();
        walk(&qa, &range, 7, move |page| {
            let p_ref = p_ref.clone();
            let (hot, cold) = (hot.clone(), cold.clone());
            async move {
                let flags = match page {
                    1 => hot,
                    4 => cold,
                    _ => return,
                };
                let mut child = {
                    let mut p = p_ref.lock().expect("test step");
                    p.start_with(c, &flags, &[]);
                    p.take(c)
                };
                let status = tokio::task::spawn_blocking(move || child_exit(&mut child, "compactor --once"))
                    .await
                    .expect("test step");
                assert!(status.success(), "{status:?}");
            }
        })
        .await
    };
    let p = std::sync::Arc::try_unwrap(p_ref)
        .ok()
        .expect("test step")
        .into_inner()
        .expect("test step");
    assert_eq!(paged.len(), unpaged.len(), "lines across compactions");
    assert_eq!(paged, unpaged, "cursor pages across a hot merge and a cold rewrite");
    let live = published_blocks(&p, "default", pb::Signal::Logs).await;
    assert_eq!(live.len(), 1, "one cold block for the hour");
    assert_eq!(live[0].level, pb::Level::Cold as i32);
    // The querier follows the swap (its copy of the catalog moves on).
    let after = answers(battery.clone(), qa.clone()).await;
    for (i, path) in battery.iter().enumerate() {
        assert_eq!(after[i], before[i], "{path} answers differently after compaction");
    }
}
