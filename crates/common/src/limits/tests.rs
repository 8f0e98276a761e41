use std::time::{Duration, UNIX_EPOCH};

use super::*;

fn tenant(s: &str) -> TenantId {
    TenantId::new(s).expect("tenant")
}

const FILE: &str = r#"
[defaults]
ingest_records_per_second = 100
ingest_bytes_per_second = "1KiB"
ingest_bytes_burst = 4096
max_query_range = "1d"

[tenants.acme]
ingest_records_per_second = 10
ingest_records_burst = 20
max_query_concurrency = 2

[tenants.free]
ingest_records_per_second = 0
"#;

#[test]
fn overrides_fall_back_to_the_defaults_key_by_key() {
    let f = LimitsFile::parse(FILE).expect("parse");
    let acme = f.get(&tenant("acme"));
    assert_eq!(acme.records_per_second, 10);
    assert_eq!(acme.records_burst, 20);
    // Not set for acme: the defaults'.
    assert_eq!(acme.bytes_per_second, 1024);
    assert_eq!(acme.bytes_burst, 4096);
    assert_eq!(acme.max_query_range, Duration::from_secs(86_400));
    assert_eq!(acme.max_query_concurrency, 2);
    // An explicit 0 overrides a default rate: unlimited.
    assert_eq!(f.get(&tenant("free")).records_per_second, 0);
    // Unlisted tenants get the defaults; no burst given = 1 s of the rate.
    let other = f.get(&tenant("other"));
    assert_eq!((other.records_per_second, other.records_burst), (100, 100));
    assert_eq!(other.max_query_concurrency, 0);
    // An empty file is unlimited.
    assert_eq!(
        LimitsFile::parse("").expect("empty").get(&tenant("x")),
        TenantLimits::default()
    );
}

#[test]
fn loki_rules_default_to_lokis_and_zero_lifts_them() {
    // No file, an empty file, a file without the keys: Loki's defaults.
    for f in [
        LimitsFile::default(),
        LimitsFile::parse("").expect("empty"),
        LimitsFile::parse(FILE).expect("parse"),
    ] {
        let l = f.get(&tenant("acme"));
        assert_eq!((l.loki_max_label_names, l.loki_max_line_bytes), (15, 256 * 1024));
    }
    let f = LimitsFile::parse(
        "[defaults]\nloki_max_label_names_per_series = 30\nloki_max_line_size = \"1MiB\"\n\
         [tenants.big]\nloki_max_label_names_per_series = 0\nloki_max_line_size = 0\n\
         [tenants.small]\nloki_max_line_size = \"1KiB\"\n",
    )
    .expect("parse");
    let got = |t: &str| {
        let l = f.get(&tenant(t));
        (l.loki_max_label_names, l.loki_max_line_bytes)
    };
    assert_eq!(got("other"), (30, 1 << 20));
    assert_eq!(got("big"), (0, 0));
    assert_eq!(got("small"), (30, 1024));
}

#[test]
fn bad_files_are_refused_naming_the_key() {
    for (text, word) in [
        ("[defaults]\ningest_record_per_second = 5\n", "ingest_record_per_second"),
        ("[tenants.a]\nmax_series = 1\nspeed = 2\n", "speed"),
        ("[default]\nmax_series = 1\n", "default"),
        (
            "[defaults]\ningest_records_per_second = -5\n",
            "ingest_records_per_second",
        ),
        (
            "[defaults]\ningest_records_per_second = \"fast\"\n",
            "ingest_records_per_second",
        ),
        ("[defaults]\ningest_bytes_per_second = \"lots\"\n", "lots"),
        ("[defaults]\nmax_query_range = \"a while\"\n", "a while"),
        (
            "[defaults]\ningest_records_burst = 5\n",
            "defaults.ingest_records_burst",
        ),
        ("[tenants.a]\ningest_bytes_burst = 5\n", "tenants.a.ingest_bytes_burst"),
        ("[tenants.\"../etc\"]\nmax_series = 1\n", "tenants.../etc"),
        ("[defaults\n", "limits file"),
        ("[defaults]\nmax_series = 99999999999999999999999\n", "max_series"),
        ("[defaults]\nloki_max_line_size = \"long\"\n", "long"),
        (
            "[defaults]\nloki_max_label_names_per_series = -1\n",
            "loki_max_label_names_per_series",
        ),
    ] {
        let e = LimitsFile::parse(text).expect_err(text);
        assert!(e.to_string().contains(word), "{text}: {e}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let big = dir.path().join("big.toml");
    std::fs::write(&big, vec![b'#'; (MAX_LIMITS_FILE + 1) as usize]).expect("write");
    let e = LimitsFile::load(&big).expect_err("oversized");
    assert!(e.to_string().contains("more than"), "{e}");
    let e = LimitsFile::load(&dir.path().join("missing.toml")).expect_err("missing");
    assert!(e.to_string().contains("missing.toml"), "{e}");
}

#[test]
fn a_bucket_refuses_all_or_nothing_and_refills_with_the_clock() {
    let (clock, hand) = Clock::manual(UNIX_EPOCH + Duration::from_secs(1_000));
    let l = Limiter::with_file(None, LimitsFile::parse(FILE).expect("parse"), clock);
    let acme = tenant("acme");
    // The burst (20) at once.
    l.take_records(&acme, 15).expect("within the burst");
    let e = l.take_records(&acme, 10).expect_err("5 left");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(1)));
    assert!(e.to_string().contains("10 records/s (burst 20)"), "{e}");
    // The refusal took nothing: the 5 left are still there.
    l.take_records(&acme, 5).expect("the rest");
    l.take_records(&acme, 1).expect_err("empty");
    // 10 records/s: half a second gives 5.
    hand.advance(Duration::from_millis(500));
    l.take_records(&acme, 5).expect("refilled");
    l.take_records(&acme, 1).expect_err("empty again");
    // Never above the burst, however long the pause.
    hand.advance(Duration::from_secs(3600));
    l.take_records(&acme, 20).expect("full");
    let e = l.take_records(&acme, 20).expect_err("empty");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
    // A request larger than the burst passes only from a full bucket and
    // leaves a debt.
    hand.advance(Duration::from_secs(2));
    l.take_records(&acme, 50).expect("from a full bucket");
    hand.advance(Duration::from_secs(2));
    l.take_records(&acme, 1)
        .expect_err("still paying back the 30 of debt at 10/s");
    // A clock moved back refills nothing and does not panic.
    hand.set(UNIX_EPOCH);
    l.take_records(&acme, 1).expect_err("no refill backwards");
}

#[test]
fn bytes_given_back_are_available_again_and_tenants_are_independent() {
    let (clock, _hand) = Clock::manual(UNIX_EPOCH + Duration::from_secs(1_000));
    let l = Limiter::with_file(None, LimitsFile::parse(FILE).expect("parse"), clock);
    let (a, b) = (tenant("a"), tenant("b"));
    l.take_bytes(&a, 4096).expect("the burst");
    l.take_bytes(&a, 1).expect_err("empty");
    l.give_back_bytes(&a, 100);
    l.take_bytes(&a, 100).expect("given back");
    // b has its own bucket.
    l.take_bytes(&b, 4096).expect("b's burst");
    // Unlimited tenants and kinds take nothing.
    let free = tenant("free");
    for _ in 0..1000 {
        l.take_records(&free, 1_000_000).expect("unlimited");
    }
}

#[test]
fn query_slots_and_ranges() {
    let l = Limiter::with_file(None, LimitsFile::parse(FILE).expect("parse"), Clock::system());
    let acme = tenant("acme");
    let one = l.enter_query(&acme).expect("one");
    let two = l.enter_query(&acme).expect("two");
    let e = l.enter_query(&acme).expect_err("three");
    assert!(e.to_string().contains("limit of 2 concurrent queries"), "{e}");
    assert_eq!(e.error_code(), ErrorCode::Overloaded);
    // Another tenant (no concurrency limit) is not affected.
    let _other = l.enter_query(&tenant("other")).expect("other");
    drop(one);
    let _three = l.enter_query(&acme).expect("a slot came back");
    drop(two);
    l.check_range(&acme, Duration::from_secs(3600)).expect("an hour");
    let e = l
        .check_range(&acme, Duration::from_secs(2 * 86_400))
        .expect_err("two days");
    assert_eq!(e.error_code(), ErrorCode::BadRequest);
    assert!(e.to_string().contains("query length: 2days, limit: 1day"), "{e}");
    assert_eq!(e.retry_after(), None);
}

#[tokio::test]
async fn a_reload_takes_a_good_file_and_keeps_the_last_good_on_a_bad_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, "[defaults]\nmax_query_concurrency = 1\n").expect("write");
    let t = crate::telemetry::Telemetry::new();
    let l = Limiter::load(&path, Clock::system(), &t).expect("load");
    let x = tenant("x");
    assert_eq!(l.get(&x).max_query_concurrency, 1);
    std::fs::write(&path, "[defaults]\nmax_query_concurrency = 3\n").expect("write");
    assert!(l.reload());
    assert_eq!(l.get(&x).max_query_concurrency, 3);
    std::fs::write(&path, "[defaults]\nmax_query_concurency = 5\n").expect("write");
    assert!(!l.reload());
    assert_eq!(l.get(&x).max_query_concurrency, 3, "the last good limits stay");
    assert_eq!(l.metrics.reload_errors.get(), 1);
    std::fs::remove_file(&path).expect("remove");
    assert!(!l.reload());
    assert_eq!(l.get(&x).max_query_concurrency, 3);
    assert_eq!(l.metrics.reload_errors.get(), 2);
    // At start a bad file is refused naming the key.
    std::fs::write(&path, "[tenants.a]\nmax_seriess = 5\n").expect("write");
    let e = Limiter::load(&path, Clock::system(), &t).expect_err("bad at start");
    assert!(e.to_string().contains("max_seriess"), "{e}");
}
