//! Push requests built with prost from `logproto`'s field numbers and as
//! Loki's JSON, read and written as OTLP, and the OTLP decoded with prost.

use prost::Message;

use super::*;

#[derive(Clone, PartialEq, Message)]
struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    streams: Vec<StreamAdapter>,
}

#[derive(Clone, PartialEq, Message)]
struct StreamAdapter {
    #[prost(string, tag = "1")]
    labels: String,
    #[prost(message, repeated, tag = "2")]
    entries: Vec<EntryAdapter>,
    #[prost(uint64, tag = "3")]
    hash: u64,
}

#[derive(Clone, PartialEq, Message)]
struct EntryAdapter {
    #[prost(message, optional, tag = "1")]
    timestamp: Option<prost_types_timestamp::Timestamp>,
    #[prost(string, tag = "2")]
    line: String,
    #[prost(message, repeated, tag = "3")]
    structured_metadata: Vec<LabelPair>,
}

#[derive(Clone, PartialEq, Message)]
struct LabelPair {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    value: String,
}

mod prost_types_timestamp {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Timestamp {
        #[prost(int64, tag = "1")]
        pub seconds: i64,
        #[prost(int32, tag = "2")]
        pub nanos: i32,
    }
}

const NOW_NS: u64 = 1_800_000_000_000_000_000;

fn window() -> TimeWindow {
    TimeWindow {
        min_ns: NOW_NS - 3_600_000_000_000,
        max_ns: NOW_NS + 600_000_000_000,
    }
}

fn entry(ns: u64, line: &str, meta: &[(&str, &str)]) -> EntryAdapter {
    EntryAdapter {
        timestamp: Some(prost_types_timestamp::Timestamp {
            seconds: (ns / 1_000_000_000) as i64,
            nanos: (ns % 1_000_000_000) as i32,
        }),
        line: line.into(),
        structured_metadata: meta
            .iter()
            .map(|(n, v)| LabelPair {
                name: n.to_string(),
                value: v.to_string(),
            })
            .collect(),
    }
}

fn push(streams: Vec<(&str, Vec<EntryAdapter>)>) -> Vec<u8> {
    PushRequest {
        streams: streams
            .into_iter()
            .map(|(labels, entries)| StreamAdapter {
                labels: labels.into(),
                entries,
                hash: 0,
            })
            .collect(),
    }
    .encode_to_vec()
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Stream labels become resource attributes by the label model backwards,
/// `service_name` found as Loki 3 finds it; lines are string bodies and
/// structured metadata attributes.
#[test]
fn pushed_streams_become_resources_and_entries_records() {
    let body = push(vec![
        (
            r#"{service_name="checkout", k8s_namespace_name="shop", team="a"}"#,
            vec![entry(NOW_NS, "line one", &[("trace_id", "abc"), ("user", "u1")])],
        ),
        (r#"{app="web", job="ns/web"}"#, vec![entry(NOW_NS + 1, "line two", &[])]),
        (r#"{job="batch"}"#, vec![entry(NOW_NS + 2, "line three", &[])]),
        (r#"{env="x"}"#, vec![entry(NOW_NS + 3, "line four", &[])]),
    ]);
    let mut p = Parsed::protobuf(&body).expect("reads");
    assert_eq!(p.message(), None);
    let (otlp, written) = p.write(window());
    assert_eq!(written, 4);
    let by_line = resources_of(&otlp);
    assert_eq!(
        by_line["line one"],
        owned(&[
            ("k8s.namespace.name", "shop"),
            ("service.name", "checkout"),
            ("team", "a")
        ])
    );
    assert_eq!(
        by_line["line two"],
        owned(&[("app", "web"), ("job", "ns/web"), ("service.name", "web")])
    );
    assert_eq!(
        by_line["line three"],
        owned(&[("job", "batch"), ("service.name", "batch")])
    );
    // No label to take it from: the model's unknown_service.
    assert_eq!(by_line["line four"], owned(&[("env", "x")]));

    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    let req = ExportLogsServiceRequest::decode(otlp.as_slice()).expect("decodes");
    let first = &req.resource_logs[0].scope_logs[0].log_records[0];
    assert_eq!(first.time_unix_nano, NOW_NS);
    let attrs: Vec<&str> = first.attributes.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(attrs, vec!["trace_id", "user"]);
}

/// The JSON body gives the same request as the protobuf one.
#[test]
fn json_and_protobuf_pushes_write_the_same_request() {
    let proto = push(vec![(
        r#"{app="web", level="info"}"#,
        vec![
            entry(NOW_NS, "a \"quoted\" line", &[("user", "u1")]),
            entry(NOW_NS + 5, "second", &[]),
        ],
    )]);
    let json = format!(
        r#"{{"streams":[{{"stream":{{"level":"info","app":"web"}},"values":[["{}","a \"quoted\" line",{{"user":"u1"}}],["{}","second"]]}}]}}"#,
        NOW_NS,
        NOW_NS + 5
    );
    let (a, na) = Parsed::protobuf(&proto).expect("reads").write(window());
    let (b, nb) = Parsed::json(json.as_bytes()).expect("reads").write(window());
    assert_eq!((na, nb), (2, 2));
    assert_eq!(a, b);
}

#[test]
fn label_sets_parse_as_prometheus_writes_them() {
    let l = parse_labels(r#"{b="2", a="x\"y\\z\n", c="\u00e9"}"#).expect("parses");
    assert_eq!(
        l.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>(),
        owned(&[("a", "x\"y\\z\n"), ("b", "2"), ("c", "é")])
    );
    assert!(parse_labels("{}").expect("empty").is_empty());
    for bad in [
        "a=\"b\"",
        "{a=b}",
        "{a=\"b\"",
        "{1a=\"b\"}",
        "{a-b=\"c\"}",
        "{a=\"b\" c=\"d\"}",
        "{a=\"\\q\"}",
        "{a=\"b\",,}",
    ] {
        let e = parse_labels(bad).expect_err("refused");
        assert!(e.starts_with("error parsing labels"), "{bad}: {e}");
    }
}

/// A tenant's own rules move both limits, and 0 lifts them, in both
/// encodings.
#[test]
fn a_tenants_rules_move_the_label_and_line_limits() {
    let labels = |n: usize| {
        format!(
            "{{{}}}",
            (0..n).map(|i| format!("l{i:02}=\"v\"")).collect::<Vec<_>>().join(", ")
        )
    };
    let (l20, l21) = (labels(20), labels(21));
    let line = "y".repeat(2000);
    let body = push(vec![
        (l20.as_str(), vec![entry(NOW_NS, "twenty", &[])]),
        (l21.as_str(), vec![entry(NOW_NS, "twenty-one", &[])]),
        (
            r#"{app="x"}"#,
            vec![entry(NOW_NS, &line, &[]), entry(NOW_NS, "short", &[])],
        ),
    ]);
    let json = format!(
        r#"{{"streams":[{}]}}"#,
        [(20, "twenty"), (21, "twenty-one")]
            .iter()
            .map(|(n, l)| {
                let stream = (0..*n)
                    .map(|i| format!("\"l{i:02}\":\"v\""))
                    .collect::<Vec<_>>()
                    .join(",");
                format!(r#"{{"stream":{{{stream}}},"values":[["{NOW_NS}","{l}"]]}}"#)
            })
            .chain([format!(
                r#"{{"stream":{{"app":"x"}},"values":[["{NOW_NS}","{line}"],["{NOW_NS}","short"]]}}"#
            )])
            .collect::<Vec<_>>()
            .join(",")
    );
    let run = |rules: Rules| {
        let mut out = Vec::new();
        for mut p in [
            Parsed::protobuf_within(&body, Meter::unlimited(), rules).expect("reads"),
            Parsed::json_under(json.as_bytes(), rules).expect("reads"),
        ] {
            let (_, written) = p.write(window());
            out.push((written, p.refused, p.message().unwrap_or_default()));
        }
        assert_eq!((out[0].0, out[0].1), (out[1].0, out[1].1), "protobuf and JSON agree");
        let (n, _, m) = out.swap_remove(0);
        (n, m)
    };
    // Loki's defaults: both label streams are over 15.
    let (n, m) = run(Rules::default());
    assert_eq!(n, 2, "{m}");
    assert!(m.contains("has 20 label names; limit 15"), "{m}");
    let (n, m) = run(Rules {
        max_label_names: 20,
        max_line_bytes: 1000,
    });
    assert_eq!(n, 2, "{m}");
    assert!(m.contains("has 21 label names; limit 20"), "{m}");
    assert!(m.contains("2 entries of the request were refused"), "{m}");
    // Up to the limit is kept.
    let (n, m) = run(Rules {
        max_label_names: 21,
        max_line_bytes: 2000,
    });
    assert_eq!((n, m.as_str()), (4, ""));
    let (n, m) = run(Rules {
        max_label_names: 0,
        max_line_bytes: 1000,
    });
    assert_eq!(n, 3, "{m}");
    assert!(m.contains("Max entry size '1000' bytes exceeded"), "{m}");
    let (n, m) = run(Rules {
        max_label_names: 0,
        max_line_bytes: 0,
    });
    assert_eq!((n, m.as_str()), (4, ""));
}

/// Each of Loki's rules refuses what breaks it, with Loki's words, and the
/// rest of the request is written.
#[test]
fn entries_breaking_lokis_rules_are_refused_and_the_rest_written() {
    let good = (r#"{app="ok"}"#, vec![entry(NOW_NS, "kept", &[])]);
    let many: String = format!(
        "{{{}}}",
        (0..16).map(|i| format!("l{i:02}=\"v\"")).collect::<Vec<_>>().join(", ")
    );
    let long = "x".repeat(256 * 1024 + 1);
    let cases: Vec<((&str, Vec<EntryAdapter>), &str)> = vec![
        (
            ("{}", vec![entry(NOW_NS, "a", &[])]),
            "at least one label pair is required per stream",
        ),
        (
            (r#"{a="1", a="2"}"#, vec![entry(NOW_NS, "a", &[])]),
            "has duplicate label name: 'a'",
        ),
        ((r#"{a.b="1"}"#, vec![entry(NOW_NS, "a", &[])]), "error parsing labels"),
        (
            (many.as_str(), vec![entry(NOW_NS, "a", &[])]),
            "has 16 label names; limit 15",
        ),
        (
            (r#"{app="x"}"#, vec![entry(NOW_NS, &long, &[])]),
            "Max entry size '262144' bytes exceeded for stream",
        ),
        (
            (r#"{app="x"}"#, vec![entry(NOW_NS - 7_200_000_000_000, "a", &[])]),
            "has timestamp too old: 2027-01-15T06:00:00Z, oldest acceptable timestamp is: 2027-01-15T07:00:00Z",
        ),
        (
            (r#"{app="x"}"#, vec![entry(NOW_NS + 7_200_000_000_000, "a", &[])]),
            "has timestamp too new",
        ),
    ];
    for (bad, want) in cases {
        let body = push(vec![bad.clone(), good.clone()]);
        let mut p = Parsed::protobuf(&body).expect("reads");
        let (otlp, written) = p.write(window());
        let message = p.message().unwrap_or_default();
        assert!(message.contains(want), "{}: {message}", bad.0);
        assert!(message.contains("1 entries of the request were refused"), "{message}");
        assert_eq!(written, 1, "{}", bad.0);
        assert!(resources_of(&otlp).contains_key("kept"));
    }
}

#[test]
fn malformed_pushes_are_refused_whole() {
    let good = push(vec![(r#"{app="x"}"#, vec![entry(NOW_NS, "line", &[])])]);
    for cut in 1..good.len() {
        if let Err(e) = Parsed::protobuf(&good[..cut]) {
            assert!(e.contains("malformed Loki push request"), "{e}");
        }
    }
    for bad in [
        r#"{"streams":[{"stream":{"a":1},"values":[]}]}"#,
        r#"{"streams":[{"stream":{"a":"b"},"values":[["1"]]}]}"#,
        r#"{"streams":"#,
    ] {
        let e = Parsed::json(bad.as_bytes()).expect_err("refused");
        assert!(e.starts_with("invalid Loki push JSON"), "{bad}: {e}");
    }
    let mut p = Parsed::json(br#"{"streams":[{"stream":{"a":"b"},"values":[["soon","x"]]}]}"#).expect("reads");
    assert!(p.message().unwrap_or_default().contains("is not Unix nanoseconds"));
    assert_eq!(p.write(window()).1, 0);
}

#[test]
fn times_in_messages_are_rfc3339() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_700_000_000_123_000_000), "2023-11-14T22:13:20.123Z");
    assert_eq!(rfc3339(-1_000_000_000), "1969-12-31T23:59:59Z");
    assert_eq!(rfc3339(951_782_400_000_000_000), "2000-02-29T00:00:00Z");
}

/// `detected_level` as Loki 3 stores it: a level label or metadata field,
/// else a level word standing alone in the line.
#[test]
fn the_level_is_detected_as_loki_detects_it() {
    let l = |pairs: &[(&'static str, &'static str)]| -> Vec<(Text<'static>, Text<'static>)> {
        pairs
            .iter()
            .map(|(k, v)| (Cow::Borrowed(*k), Cow::Borrowed(*v)))
            .collect()
    };
    assert_eq!(
        detected_level(&l(&[("severity", "WARNING")]), &[], "error here"),
        Some("warn")
    );
    assert_eq!(detected_level(&[], &l(&[("level", "dbg")]), ""), Some("debug"));
    assert_eq!(detected_level(&[], &[], "level=error msg=x"), Some("error"));
    assert_eq!(detected_level(&[], &[], "GET /cart 500"), None);
    assert_eq!(detected_level(&[], &[], "an errand, information"), None);
    assert_eq!(detected_level(&[], &[], "[WARN] disk"), Some("warn"));
    assert_eq!(detected_level(&[], &[], "info then Error"), Some("error"));
}

/// Views are metered: a stream of a million empty entries, or a label
/// text of a million `=`, stops at the memory it was given; with enough
/// it reads whole.
#[test]
fn views_stop_at_the_memory_reserved_for_them() {
    let stream = |labels: &[u8], rest: &[u8]| {
        let mut inner = vec![0x0a];
        prost::encoding::encode_varint(labels.len() as u64, &mut inner);
        inner.extend_from_slice(labels);
        inner.extend_from_slice(rest);
        let mut out = vec![0x0a];
        prost::encoding::encode_varint(inner.len() as u64, &mut out);
        out.extend_from_slice(&inner);
        out
    };
    let entries = stream(br#"{a="b"}"#, &[0x12, 0x00].repeat(1_000_000));
    let equals = stream(&[b'='; 1_000_000], b"");
    for body in [&entries, &equals] {
        let e = Parsed::protobuf_within(body, Meter::new(8 * body.len()), Rules::default()).expect_err("over");
        assert!(matches!(e, ReadError::OverBudget { .. }), "{e:?}");
    }
    let p = Parsed::protobuf_within(&entries, Meter::new(200 * entries.len()), Rules::default()).expect("reads");
    assert_eq!(p.entries(), 1_000_000);
}
