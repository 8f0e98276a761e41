//! No query crashes the process (issue 29, item 2): a real `mira serve` is
//! sent PromQL nested 3,000 deep (15 KB of `abs(`, which overflowed a scan
//! thread's stack and aborted the whole process before), a 5,000-term
//! operator chain and 20,000 nested parentheses, on the instant and the
//! range API: each is a 400 `bad_data` naming the depth limit, and the
//! same process answers a plain query afterwards.

#[path = "support/procs.rs"]
mod procs;

use mira_testkit::http::{self, wait_ready};
use procs::{Procs, Role};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_promql_is_refused_and_the_process_keeps_serving() {
    let mut p = Procs::new();
    let i = p.add(Role::Serve, &["--no-compactor"]);
    p.start(i);
    let query = p[i].addr.clone();
    wait_ready(&query).await;
    let pid = p.pid(i).expect("running");
    let deep = format!("{}up{}", "abs(".repeat(3_000), ")".repeat(3_000));
    let chain = vec!["up"; 5_000].join(" + ");
    let parens = format!("{}up{}", "(".repeat(20_000), ")".repeat(20_000));
    for q in [&deep, &chain, &parens] {
        for path in ["/api/v1/query", "/api/v1/query_range"] {
            let body = format!(
                "query={}&time=1700000000&start=1700000000&end=1700000600&step=60",
                urlencode(q)
            );
            let r = http::post(
                &query,
                path,
                &[("content-type", "application/x-www-form-urlencoded")],
                body.into_bytes(),
            )
            .await
            .unwrap_or_else(|| panic!("no answer to {path}: the process died"));
            let text = r.text();
            assert_eq!(r.status, 400, "{path}: {text}");
            assert!(
                text.contains("bad_data") && text.contains("the limit is 100"),
                "{path}: {text}"
            );
        }
    }
    let r = http::get(&query, "/api/v1/query?query=vector(1)&time=1700000000")
        .await
        .expect("an answer");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["data"]["result"][0]["value"][1], "1");
    assert!(p.is_running(i) && p.pid(i) == Some(pid), "the process exited");
}

const PB: (&str, &str) = ("Content-Type", "application/x-protobuf");

/// A query past its timeout stops its work and frees the scan pool for
/// another tenant (issue 29, item 3). With one scan thread and a 2 s
/// timeout, tenant `a` runs three range queries whose evaluation takes
/// many seconds each (`count_over_time` over an hour of 60,000 lines at
/// 10,000 steps); they answer 504, and tenant `b`'s query, sent right
/// after, answers 200 under the same timeout. Before, each of a's jobs
/// ran to its end after its 504, and b's query waited behind them past
/// its own timeout. The querier counts the jobs it stopped running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_query_stops_its_work_and_another_tenant_is_answered() {
    let timeout = std::env::var("MIRA_TEST_QUERY_TIMEOUT").unwrap_or_else(|_| "2s".to_owned());
    let mut p = Procs::new();
    let i = p.add(
        Role::Serve,
        &[
            "--no-compactor",
            "--query-threads",
            "1",
            "--query-timeout",
            &timeout,
            // The lines run 40 minutes past the clock.
            "--max-future",
            "1h",
        ],
    );
    p.start(i);
    let (query, otlp) = (p[i].addr.clone(), p[i].http.clone());
    wait_ready(&query).await;
    let pid = p.pid(i).expect("running");
    // Tenant a: 60,000 lines 50 ms apart (50 minutes); tenant b: one.
    const STEP_NS: u64 = 50_000_000;
    for part in 0..6u64 {
        let body = mira_testkit::otlp::log_export(
            &[("service.name", "heavy")],
            (0..10_000u64).map(|k| {
                let n = part * 10_000 + k;
                (n * STEP_NS, format!("line {n}"))
            }),
        );
        let r = http::post(&otlp, "/v1/logs", &[PB, ("X-Scope-OrgID", "a")], body)
            .await
            .expect("an answer");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let body = mira_testkit::otlp::log_export(&[("service.name", "light")], [(0, "b's line".to_owned())]);
    let r = http::post(&otlp, "/v1/logs", &[PB, ("X-Scope-OrgID", "b")], body)
        .await
        .expect("an answer");
    assert_eq!(r.status, 200, "{}", r.text());
    let base = mira_testkit::recent_base_time();
    let end = base + 60_000 * STEP_NS;
    // Both tenants' lines are readable (cheap instant queries).
    let count = |tenant: &'static str, selector: &'static str| {
        let query = query.clone();
        async move {
            let path = format!(
                "/loki/api/v1/query?query={}&time={end}",
                urlencode(&format!("sum(count_over_time({selector}[1h]))"))
            );
            let r = http::request("GET", &query, &path, &[("X-Scope-OrgID", tenant)], Vec::new())
                .await
                .expect("an answer");
            (
                r.status,
                r.json()["data"]["result"][0]["value"][1].as_str().map(str::to_owned),
            )
        }
    };
    mira_testkit::net::wait_for("a's and b's lines", std::time::Duration::from_secs(60), || async {
        (count("a", r#"{service_name="heavy"}"#).await == (200, Some("60000".to_owned()))
            && count("b", r#"{service_name="light"}"#).await == (200, Some("1".to_owned())))
            .then_some(())
    })
    .await;
    let heavy = format!(
        "/loki/api/v1/query_range?query={}&start={base}&end={end}&step=0.3",
        urlencode(r#"count_over_time({service_name="heavy"}[1h])"#)
    );
    let started = std::time::Instant::now();
    let runs = (0..3).map(|_| {
        let (query, heavy) = (query.clone(), heavy.clone());
        async move {
            http::request("GET", &query, &heavy, &[("X-Scope-OrgID", "a")], Vec::new())
                .await
                .expect("an answer")
        }
    });
    for r in futures::future::join_all(runs).await {
        assert_eq!(r.status, 504, "{:.300}", r.text());
    }
    eprintln!("a's three queries answered after {:?}", started.elapsed());
    assert_eq!(
        count("b", r#"{service_name="light"}"#).await,
        (200, Some("1".to_owned()))
    );
    let metrics = http::get(&query, "/metrics").await.expect("metrics").text();
    let stopped = metric(&metrics, r#"mira_querier_cancelled_jobs_total{stage="running"}"#);
    assert!(stopped >= 1.0, "no running job was stopped:\n{metrics}");
    eprintln!(
        "stopped {stopped} running jobs, released in {} s in all",
        metric(&metrics, "mira_querier_cancel_release_seconds_sum")
    );
    assert!(p.is_running(i) && p.pid(i) == Some(pid), "the process exited");
}

/// The value of the sample named exactly `name` (labels included).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
