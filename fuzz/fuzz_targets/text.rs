//! Small text formats from outside the process, each through the function
//! the code uses for it. Byte 0 picks one (`% 16`); the rest is the text:
//!
//! - 0 log cursor (`LineKey::decode_for`, the native logs API)
//! - 1 catalog listing page token (`parse_page_token`)
//! - 2 time, duration and step parameters of the query APIs
//! - 3 trace id parameter (`parse_trace_id`)
//! - 4 duration flag or config value (`config::Duration`)
//! - 5 size flag or config value (`config::ByteSize`)
//! - 6 point in time of the CLI (`config::TimeArg`) and the test clock
//!   offset (`clock::parse_offset`)
//! - 7 the configuration file: every table it holds, as TOML
//!   (`[catalog]`, `[ingester]`, `[querier]`, `[compactor]`, `[operator]`,
//!   `[security]`), each validated
//! - 8 the tokens file (`TokenSet::parse`)
//! - 9 retention and offload policy bodies (`policy::validate`)
//! - 10 the `MiraRetentionPolicy` object as the operator reads it (JSON,
//!   then `to_catalog`) and its duration fields (`parse_duration`)
//! - 11 credentials and tenant headers (`presented_token`, `header_tenant`)
//! - 12 catalog peers, offload target specs, compactor job manifests
//! - 13 block object paths (`parse_block_path`) and tenant names
//! - 14, 15: as 9 and 7 (the larger formats get more of the time)
//!
//! Checked beyond "no panic": what parses prints back to text that parses
//! to the same value (cursors, page tokens, durations, sizes, the config
//! tables, policy bodies, block paths).

#![no_main]

#[path = "../common/seeds.rs"]
mod seeds;

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use mira_common::config::{ByteSize, Duration, TimeArg, to_toml};
use mira_core::ids::TenantId;
use mira_core::policy::{PolicyKind, validate};
use serde::Serialize;
use serde::de::DeserializeOwned;

fn cursor(s: &str) {
    use mira_querier::logs::LineKey;
    if let Ok(k) = LineKey::decode_for(s, "team-a") {
        let again = LineKey::decode_for(&k.encode_for("team-a"), "team-a").expect("an encoded cursor decodes");
        assert_eq!(again, k);
    }
}

fn page_token(s: &str) {
    use mira_catalog::pb_impl::block::{page_token, parse_page_token};
    if let Ok(c) = parse_page_token(s) {
        let again = parse_page_token(&page_token(&c)).expect("a printed page token parses");
        assert_eq!(again, c);
    }
}

fn api_params(s: &str) {
    use mira_querier::api::{parse_duration, parse_step, parse_time};
    let _ = parse_time("start", s);
    let _ = parse_duration("minDuration", s);
    let _ = parse_step(s);
}

fn duration(s: &str) {
    if let Ok(d) = s.parse::<Duration>() {
        assert_eq!(
            d.to_string().parse::<Duration>(),
            Ok(d),
            "duration {s:?} does not print back"
        );
    }
}

fn size(s: &str) {
    if let Ok(b) = s.parse::<ByteSize>() {
        assert_eq!(
            b.to_string().parse::<ByteSize>(),
            Ok(b),
            "size {s:?} does not print back"
        );
    }
}

fn time_arg(s: &str) {
    if let Ok(t) = s.parse::<TimeArg>() {
        let _ = t.resolve(1_750_000_000_000_000_000);
        let _ = t.resolve(i64::MIN);
    }
    let _ = mira_common::clock::parse_offset(s);
}

/// A table of the configuration file: parses, validates, and prints back
/// to TOML that parses to the same value.
fn table<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(s: &str, validate: impl Fn(&T) -> bool) {
    if let Ok(v) = toml::from_str::<T>(s) {
        let _ = validate(&v);
        let printed = to_toml(&v);
        let again: T =
            toml::from_str(&printed).unwrap_or_else(|e| panic!("printed config does not parse: {e}\n{printed}"));
        assert_eq!(again, v, "config does not print back:\n{printed}");
    }
}

fn config(s: &str) {
    use mira_common::security::{Exposure, SecuritySettings};
    table::<mira_catalog::Settings>(s, |v| v.validate().is_ok());
    table::<mira_ingester::Settings>(s, |v| v.validate().is_ok());
    table::<mira_querier::settings::Settings>(s, |v| v.validate().is_ok());
    table::<mira_compactor::settings::Settings>(s, |v| v.build().is_ok());
    table::<mira_operator::Settings>(s, |v| v.validate().is_ok());
    table::<SecuritySettings>(s, |v| {
        [Exposure::Member, Exposure::Client, Exposure::AllInOne]
            .iter()
            .all(|e| v.validate(*e).is_ok())
    });
}

fn tokens(s: &str) {
    let _ = mira_common::auth::TokenSet::parse(Path::new("tokens.toml"), s);
}

fn policy(s: &str, sel: u8) {
    let kind = PolicyKind::ALL[usize::from(sel / 16) % 2];
    let tenant = if sel & 0x40 == 0 { "" } else { "team-a" };
    let targets = ["archive".to_owned(), "cold".to_owned()];
    let targets = (sel & 0x80 != 0).then_some(&targets[..]);
    if let Ok(body) = validate(kind, "fuzz", tenant, s, targets) {
        let json = body.to_json();
        let again = validate(kind, "fuzz", tenant, &json, targets).unwrap_or_else(|e| panic!("{json} is refused: {e}"));
        assert_eq!(again, body, "policy body does not print back: {json}");
    }
}

fn crd(s: &str) {
    use mira_operator::policy::{parse_duration, to_catalog};
    let _ = parse_duration("spec.retention", s);
    if let Ok(obj) = serde_json::from_str::<mira_operator::MiraRetentionPolicy>(s) {
        let _ = to_catalog(&obj);
    }
}

fn headers(s: &[u8]) {
    use http::{HeaderMap, HeaderValue, header};
    let Ok(v) = HeaderValue::from_bytes(s) else {
        return;
    };
    let mut h = HeaderMap::new();
    h.insert(header::AUTHORIZATION, v.clone());
    h.insert("x-scope-orgid", v);
    let _ = mira_common::auth::presented_token(&h);
    let _ = mira_common::auth::header_tenant(&h);
}

fn specs(s: &str) {
    let _ = mira_catalog::parse_peers(s);
    let _ = mira_compactor::targets::parse_spec(s);
    let _ = mira_compactor::job::Manifest::parse(s);
}

fn paths(s: &str) {
    use mira_core::block::{block_path, parse_block_path};
    let _ = TenantId::new(s);
    let path = object_store::path::Path::from(s);
    if let Ok(loc) = parse_block_path(&path) {
        assert_eq!(
            block_path(&loc.tenant, loc.signal, loc.hour_start, loc.block_id),
            path,
            "a block path does not print back"
        );
    }
}

/// Examples of each format: from the docs, the tests, and what the code
/// prints (default config tables, encoded cursors and page tokens).
fn make_seeds() -> Vec<(String, Vec<u8>)> {
    use mira_querier::logs::LineKey;
    let id = mira_core::BlockId::from_u128(0x0190_1234_5678_9abc_def0_1234_5678_9abc);
    let key = LineKey {
        time: 1_750_000_000_123_456_789,
        block: id,
        row: 17,
    };
    let cursor = mira_catalog::state::BlockCursor {
        tenant: TenantId::new("team-a").expect("a tenant"),
        signal: mira_core::Signal::Traces,
        min_time_ns: 1_750_000_000_000_000_000,
        id,
    };
    let path = mira_core::block::block_path(
        &TenantId::new("team-a").expect("a tenant"),
        mira_core::Signal::Logs,
        1_750_000_000_000_000_000,
        id,
    );
    let tables: Vec<(&str, String)> = vec![
        ("catalog", to_toml(&mira_catalog::Settings::default())),
        ("ingester", to_toml(&mira_ingester::Settings::default())),
        ("querier", to_toml(&mira_querier::settings::Settings::default())),
        ("compactor", to_toml(&mira_compactor::settings::Settings::default())),
        ("operator", to_toml(&mira_operator::Settings::default())),
        ("security", to_toml(&mira_common::security::SecuritySettings::default())),
    ];
    let tokens = r#"[[token]]
name = "collector-team-a"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
tenants = ["team-a"]
scopes = ["write"]

[[token]]
name = "grafana"
sha256 = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"
tenants = ["team-a", "team-b"]
scopes = ["read", "admin"]
expires = "2027-06-30T00:00:00Z"
"#;
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add =
        |name: &str, sel: u8, text: &str| out.push((name.to_owned(), seeds::with_selector(sel, text.as_bytes())));
    add("cursor", 0, &key.encode_for("team-a"));
    add("cursor-untagged", 0, &key.encode());
    add("page-token", 1, &mira_catalog::pb_impl::block::page_token(&cursor));
    for (i, v) in [
        "1750000000",
        "1750000000.5",
        "1750000000123456789",
        "250ms",
        "1.5s",
        "15",
        "2h",
    ]
    .iter()
    .enumerate()
    {
        add(&format!("api-param-{i}"), 2, v);
    }
    add("trace-id", 3, "0af7651916cd43dd8448eb211c80319c");
    for (i, v) in ["30s", "5m", "250ms", "168h", "1h 30m", "3d"].iter().enumerate() {
        add(&format!("duration-{i}"), 4, v);
    }
    for (i, v) in ["64MiB", "64 MiB", "10GiB", "1GB", "1048576", "512KiB"]
        .iter()
        .enumerate()
    {
        add(&format!("size-{i}"), 5, v);
    }
    for (i, v) in [
        "2026-11-01T00:00:00Z",
        "2026-11-01",
        "2026-11-01T10:30+02:00",
        "-7d",
        "-36h",
        "now",
    ]
    .iter()
    .enumerate()
    {
        add(&format!("time-{i}"), 6, v);
    }
    for (name, t) in &tables {
        add(&format!("config-{name}"), 7, t);
    }
    add("tokens", 8, tokens);
    for (i, (sel, v)) in [
        (9u8, r#"{"v":1,"retain_s":3600}"#),
        (9, r#"{"v":1,"retain_s":3600,"signals":["logs"],"selector":[{"key":"service.name","op":"=","value":"checkout"},{"key":"deployment.environment","op":"!~","values":["prod(-.*)?"]}],"priority":10}"#),
        (9 + 16, r#"{"v":1,"target":"archive","after_s":1209600,"priority":2,"signals":["metrics"]}"#),
        (9 + 16 + 0x80, r#"{"v":1,"target":"cold","after_s":3600}"#),
        (9 + 0x40, r#"{"v":1,"retain_s":86400,"tenant_glob":"team-*","source":{"uid":"1b4e28ba-2fa1-11d2-883f-0016d3cca427"}}"#),
    ]
    .iter()
    .enumerate()
    {
        add(&format!("policy-{i}"), *sel, v);
    }
    for (i, v) in [
        r#"{"apiVersion":"mira.dev/v1alpha1","kind":"MiraRetentionPolicy","metadata":{"name":"default-90d","namespace":"observability","uid":"u1"},"spec":{"tenant":"*","retain":"90d"}}"#,
        r#"{"apiVersion":"mira.dev/v1alpha1","kind":"MiraRetentionPolicy","metadata":{"name":"checkout-short","namespace":"team-a"},"spec":{"tenant":"team-a","signals":["logs","traces"],"resourceSelector":{"matchAttributes":{"service.name":"checkout"},"matchExpressions":[{"key":"deployment.environment","operator":"NotMatches","values":["prod(-.*)?"]}]},"retain":"7d","priority":10}}"#,
        r#"{"apiVersion":"mira.dev/v1alpha1","kind":"MiraRetentionPolicy","metadata":{"name":"team-a-archive","namespace":"team-a"},"spec":{"tenant":"team-a","retain":"1y","offload":{"after":"14d","target":"archive"}}}"#,
        "1y2w3d",
    ]
    .iter()
    .enumerate()
    {
        add(&format!("crd-{i}"), 10, v);
    }
    for (i, v) in ["Bearer 0123456789abcdef", "Basic Z3JhZmFuYTpzZWNyZXQ=", "team-a"]
        .iter()
        .enumerate()
    {
        add(&format!("header-{i}"), 11, v);
    }
    for (i, v) in [
        "0=mira-catalog-0:7400,1=mira-catalog-1:7400,2=mira-catalog-2:7400",
        "archive=s3://archive-bucket/mira/",
        r#"{"v":1,"kind":"merge","started_ns":1750000000000000000,"inputs":3,"outputs":[{"id":"01J0000000000000000000000","key":"team-a/logs/2026-01-01/10/x.block"}]}"#,
    ]
    .iter()
    .enumerate()
    {
        add(&format!("spec-{i}"), 12, v);
    }
    add("block-path", 13, path.as_ref());
    out
}

fuzz_target!(init: seeds::write_if_asked(make_seeds), |data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    if sel % 16 == 11 {
        headers(rest);
        return;
    }
    let Ok(s) = std::str::from_utf8(rest) else {
        return;
    };
    match sel % 16 {
        0 => cursor(s),
        1 => page_token(s),
        2 => api_params(s),
        3 => {
            let _ = mira_querier::traces::parse_trace_id(s);
        }
        4 => duration(s),
        5 => size(s),
        6 => time_arg(s),
        7 | 15 => config(s),
        8 => tokens(s),
        9 | 14 => policy(s, sel),
        10 => crd(s),
        12 => specs(s),
        13 => paths(s),
        _ => {}
    }
});
