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

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
