//! Requests built with prost from the remote-write protos' field numbers
//! (an encoder independent of the reader), read and written as OTLP, and
//! the OTLP decoded with prost.

use mira_core::ids::Signal;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point;
use prost::Message;

use super::*;

#[derive(Clone, PartialEq, Message)]
struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    timeseries: Vec<TimeSeries>,
    #[prost(message, repeated, tag = "3")]
    metadata: Vec<MetricMetadata>,
}

#[derive(Clone, PartialEq, Message)]
struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    samples: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    exemplars: Vec<ExemplarV1>,
    #[prost(message, repeated, tag = "4")]
    histograms: Vec<Histogram>,
}

#[derive(Clone, PartialEq, Message)]
struct Label {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    value: String,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(double, tag = "1")]
    value: f64,
    #[prost(int64, tag = "2")]
    timestamp: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ExemplarV1 {
    #[prost(message, repeated, tag = "1")]
    labels: Vec<Label>,
    #[prost(double, tag = "2")]
    value: f64,
    #[prost(int64, tag = "3")]
    timestamp: i64,
}

#[derive(Clone, PartialEq, Message)]
struct MetricMetadata {
    #[prost(int32, tag = "1")]
    r#type: i32,
    #[prost(string, tag = "2")]
    family: String,
    #[prost(string, tag = "4")]
    help: String,
    #[prost(string, tag = "5")]
    unit: String,
}

#[derive(Clone, PartialEq, Message)]
struct Histogram {
    #[prost(uint64, tag = "1")]
    count_int: u64,
    #[prost(double, tag = "3")]
    sum: f64,
    #[prost(sint32, tag = "4")]
    schema: i32,
    #[prost(double, tag = "5")]
    zero_threshold: f64,
    #[prost(uint64, tag = "6")]
    zero_count_int: u64,
    #[prost(message, repeated, tag = "11")]
    positive_spans: Vec<Span>,
    #[prost(sint64, repeated, tag = "12")]
    positive_deltas: Vec<i64>,
    #[prost(int64, tag = "15")]
    timestamp: i64,
    #[prost(double, repeated, tag = "16")]
    custom_values: Vec<f64>,
}

#[derive(Clone, PartialEq, Message)]
struct Span {
    #[prost(sint32, tag = "1")]
    offset: i32,
    #[prost(uint32, tag = "2")]
    length: u32,
}

#[derive(Clone, PartialEq, Message)]
struct RequestV2 {
    #[prost(string, repeated, tag = "4")]
    symbols: Vec<String>,
    #[prost(message, repeated, tag = "5")]
    timeseries: Vec<TimeSeriesV2>,
}

#[derive(Clone, PartialEq, Message)]
struct TimeSeriesV2 {
    #[prost(uint32, repeated, tag = "1")]
    labels_refs: Vec<u32>,
    #[prost(message, repeated, tag = "2")]
    samples: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    exemplars: Vec<ExemplarV2>,
    #[prost(message, optional, tag = "5")]
    metadata: Option<MetadataV2>,
    #[prost(int64, tag = "6")]
    created_timestamp: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ExemplarV2 {
    #[prost(uint32, repeated, tag = "1")]
    labels_refs: Vec<u32>,
    #[prost(double, tag = "2")]
    value: f64,
    #[prost(int64, tag = "3")]
    timestamp: i64,
}

#[derive(Clone, PartialEq, Message)]
struct MetadataV2 {
    #[prost(int32, tag = "1")]
    r#type: i32,
    #[prost(uint32, tag = "3")]
    help_ref: u32,
    #[prost(uint32, tag = "4")]
    unit_ref: u32,
}

const NOW_MS: i64 = 1_800_000_000_000;

fn window() -> TimeWindow {
    TimeWindow {
        min_ns: (NOW_MS as u64 - 3_600_000) * 1_000_000,
        max_ns: (NOW_MS as u64 + 600_000) * 1_000_000,
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<Label> {
    pairs
        .iter()
        .map(|(n, v)| Label {
            name: n.to_string(),
            value: v.to_string(),
        })
        .collect()
}

fn series(pairs: &[(&str, &str)], samples: &[(i64, f64)]) -> TimeSeries {
    TimeSeries {
        labels: labels(pairs),
        samples: samples
            .iter()
            .map(|(t, v)| Sample {
                value: *v,
                timestamp: *t,
            })
            .collect(),
        ..Default::default()
    }
}

fn convert(version: Version, body: &[u8]) -> (ExportMetricsServiceRequest, Written, Refused) {
    let mut p = Parsed::read(version, body).expect("reads");
    let (otlp, written) = p.write(window());
    (
        ExportMetricsServiceRequest::decode(otlp.as_slice()).expect("the OTLP written decodes"),
        written,
        p.refused,
    )
}

fn text(kvs: &[KeyValue]) -> Vec<(String, String)> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// Every (resource attributes, metric name, kind, point attributes,
/// time ms, value) the request holds.
type Row = (
    Vec<(String, String)>,
    String,
    &'static str,
    Vec<(String, String)>,
    i64,
    f64,
);

fn rows(req: &ExportMetricsServiceRequest) -> Vec<Row> {
    let mut out = Vec::new();
    for rm in &req.resource_metrics {
        let res = text(&rm.resource.as_ref().expect("a resource").attributes);
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                let (kind, points) = match m.data.as_ref() {
                    Some(Data::Gauge(g)) => ("gauge", &g.data_points),
                    Some(Data::Sum(s)) if s.is_monotonic && s.aggregation_temporality == 2 => {
                        ("counter", &s.data_points)
                    }
                    Some(Data::Sum(s)) => ("sum", &s.data_points),
                    _ => continue,
                };
                for p in points {
                    let v = match p.value {
                        Some(number_data_point::Value::AsDouble(d)) => d,
                        _ => f64::NAN,
                    };
                    out.push((
                        res.clone(),
                        m.name.clone(),
                        kind,
                        text(&p.attributes),
                        (p.time_unix_nano / 1_000_000) as i64,
                        v,
                    ));
                }
            }
        }
    }
    out
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A 1.0 request's series become metrics of their own names, `job` and
/// `instance` their resource (marked remote written), metadata their
/// types, help and unit; empty label values are no label.
#[test]
fn remote_write_1_maps_series_onto_otlp() {
    let req = WriteRequest {
        timeseries: vec![
            series(
                &[
                    ("__name__", "http_requests_total"),
                    ("code", "200"),
                    ("empty", ""),
                    ("instance", "h:9100"),
                    ("job", "team/api"),
                ],
                &[(NOW_MS, 5.0), (NOW_MS + 15_000, 7.0)],
            ),
            series(&[("__name__", "temperature"), ("job", "node")], &[(NOW_MS, -1.5)]),
            series(
                &[("__name__", "rpc_seconds_bucket"), ("job", "node"), ("le", "0.5")],
                &[(NOW_MS, 3.0)],
            ),
            series(&[("__name__", "no_job")], &[(NOW_MS, 1.0)]),
        ],
        metadata: vec![
            MetricMetadata {
                r#type: 1,
                family: "http_requests_total".into(),
                help: "Requests.".into(),
                unit: String::new(),
            },
            MetricMetadata {
                r#type: 3,
                family: "rpc_seconds".into(),
                help: String::new(),
                unit: "seconds".into(),
            },
        ],
    };
    let (otlp, written, refused) = convert(Version::V1, &req.encode_to_vec());
    assert_eq!(refused, Refused::default());
    assert_eq!(written.samples, 5);
    let got = rows(&otlp);
    let api = owned(&[
        ("service.namespace", "team"),
        ("service.name", "api"),
        ("service.instance.id", "h:9100"),
        (SOURCE_ATTR, SOURCE_REMOTE_WRITE),
    ]);
    let node = owned(&[("service.name", "node"), (SOURCE_ATTR, SOURCE_REMOTE_WRITE)]);
    let bare = owned(&[(SOURCE_ATTR, SOURCE_REMOTE_WRITE)]);
    assert_eq!(
        got,
        vec![
            (
                api.clone(),
                "http_requests_total".into(),
                "counter",
                owned(&[("code", "200")]),
                NOW_MS,
                5.0
            ),
            (
                api,
                "http_requests_total".into(),
                "counter",
                owned(&[("code", "200")]),
                NOW_MS + 15_000,
                7.0
            ),
            // A resource's series in name order.
            (
                node.clone(),
                "rpc_seconds_bucket".into(),
                "counter",
                owned(&[("le", "0.5")]),
                NOW_MS,
                3.0
            ),
            (node, "temperature".into(), "gauge", vec![], NOW_MS, -1.5),
            (bare, "no_job".into(), "gauge", vec![], NOW_MS, 1.0),
        ]
    );
    let metric = |name: &str| {
        otlp.resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .find(|m| m.name == name)
            .cloned()
            .expect("metric")
    };
    assert_eq!(metric("http_requests_total").description, "Requests.");
    assert_eq!(metric("rpc_seconds_bucket").unit, "seconds");
}

/// A series that breaks a rule is refused whole with the reason; the
/// others are written.
#[test]
fn series_breaking_the_rules_are_refused_and_the_rest_written() {
    let good = series(&[("__name__", "up"), ("job", "a")], &[(NOW_MS, 1.0)]);
    let cases: Vec<(TimeSeries, &str)> = vec![
        (
            series(&[("__name__", "up"), ("", "x")], &[(NOW_MS, 1.0)]),
            "empty label name",
        ),
        (
            series(&[("__name__", "up"), ("b", "1"), ("a", "2")], &[(NOW_MS, 1.0)]),
            "not sorted",
        ),
        (
            series(&[("__name__", "up"), ("a", "1"), ("a", "2")], &[(NOW_MS, 1.0)]),
            "duplicate label name \"a\"",
        ),
        (series(&[("job", "a")], &[(NOW_MS, 1.0)]), "without a metric name"),
        (
            series(&[("__name__", ""), ("job", "a")], &[(NOW_MS, 1.0)]),
            "without a metric name",
        ),
        (series(&[("__name__", "old")], &[(NOW_MS - 7_200_000, 1.0)]), "too old"),
        (
            series(&[("__name__", "new")], &[(NOW_MS + 7_200_000, 1.0)]),
            "too far in the future",
        ),
        (series(&[("__name__", "neg")], &[(-5, 1.0)]), "too old"),
        (
            series(&[("__name__", "huge")], &[(i64::MAX, 1.0)]),
            "too far in the future",
        ),
        (
            series(&[("__name__", "dup")], &[(NOW_MS, 1.0), (NOW_MS, 2.0)]),
            "duplicate timestamp",
        ),
    ];
    for (bad, want) in cases {
        let req = WriteRequest {
            timeseries: vec![bad.clone(), good.clone()],
            metadata: vec![],
        };
        let (otlp, written, refused) = convert(Version::V1, &req.encode_to_vec());
        let message = refused.message().unwrap_or_default();
        assert!(message.contains(want), "{bad:?}: {message}");
        let names: Vec<String> = rows(&otlp).into_iter().map(|r| r.1).collect();
        assert!(names.contains(&"up".to_string()), "{bad:?}: the good series is written");
        let expected = if want == "duplicate timestamp" { 2 } else { 1 };
        assert_eq!(written.samples, expected, "{bad:?}");
    }
    // The same sample twice is one sample, and no refusal.
    let req = WriteRequest {
        timeseries: vec![series(&[("__name__", "x")], &[(NOW_MS, 1.0), (NOW_MS, 1.0)])],
        metadata: vec![],
    };
    let (_, written, refused) = convert(Version::V1, &req.encode_to_vec());
    assert_eq!((written.samples, refused.any()), (1, false));
}

/// Bytes that are not a request are refused whole, naming where.
#[test]
fn malformed_requests_are_refused_whole() {
    let good = WriteRequest {
        timeseries: vec![series(&[("__name__", "up")], &[(NOW_MS, 1.0)])],
        metadata: vec![],
    }
    .encode_to_vec();
    for cut in 1..good.len() {
        if let Err(e) = Parsed::read(Version::V1, &good[..cut]) {
            assert!(e.contains("malformed remote write request"), "{e}");
        }
    }
    let mut bad_length = good.clone();
    bad_length[1] = 0x7f;
    let e = Parsed::read(Version::V1, &bad_length).expect_err("refused");
    assert!(e.contains("at byte 0"), "{e}");
    // A label that is not UTF-8.
    let mut w = Writer::default();
    w.begin(1);
    w.begin(1);
    w.bytes(1, b"__name__");
    w.bytes(2, &[0xff, 0xfe]);
    w.end();
    w.end();
    assert!(Parsed::read(Version::V1, &w.finish()).is_err());
}

/// 2.0: labels through the symbol table, inline metadata, created
/// timestamps; references out of range and odd reference lists are
/// refused whole.
#[test]
fn remote_write_2_reads_symbols_metadata_and_created_timestamps() {
    let symbols: Vec<String> = [
        "",
        "__name__",
        "jobs_total",
        "job",
        "batch",
        "Jobs run.",
        "trace_id",
        "0af7651916cd43dd8448eb211c80319c",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let req = RequestV2 {
        symbols: symbols.clone(),
        timeseries: vec![TimeSeriesV2 {
            labels_refs: vec![1, 2, 3, 4],
            samples: vec![Sample {
                value: 3.0,
                timestamp: NOW_MS,
            }],
            exemplars: vec![ExemplarV2 {
                labels_refs: vec![6, 7],
                value: 0.25,
                timestamp: NOW_MS,
            }],
            metadata: Some(MetadataV2 {
                r#type: 1,
                help_ref: 5,
                unit_ref: 0,
            }),
            created_timestamp: NOW_MS - 60_000,
        }],
    };
    let (otlp, written, refused) = convert(Version::V2, &req.encode_to_vec());
    assert!(!refused.any(), "{refused:?}");
    assert_eq!((written.samples, written.exemplars), (1, 1));
    let m = &otlp.resource_metrics[0].scope_metrics[0].metrics[0];
    assert_eq!((m.name.as_str(), m.description.as_str()), ("jobs_total", "Jobs run."));
    let Some(Data::Sum(sum)) = &m.data else {
        panic!("a counter is a sum: {m:?}")
    };
    assert!(sum.is_monotonic);
    let p = &sum.data_points[0];
    assert_eq!(p.start_time_unix_nano, (NOW_MS as u64 - 60_000) * 1_000_000);
    assert_eq!(p.exemplars.len(), 1);
    assert_eq!(
        p.exemplars[0].trace_id,
        vec![
            0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c
        ]
    );

    let mut out_of_range = req.clone();
    out_of_range.timeseries[0].labels_refs = vec![1, 99];
    let e = Parsed::read(Version::V2, &out_of_range.encode_to_vec()).expect_err("refused");
    assert!(
        e.contains("symbol reference 99 is out of range") && e.contains("8 symbols"),
        "{e}"
    );
    let mut ex_out = req.clone();
    ex_out.timeseries[0].exemplars[0].labels_refs = vec![6, 1000];
    assert!(
        Parsed::read(Version::V2, &ex_out.encode_to_vec())
            .expect_err("refused")
            .contains("1000")
    );
    let mut help_out = req.clone();
    help_out.timeseries[0].metadata = Some(MetadataV2 {
        r#type: 1,
        help_ref: 4000,
        unit_ref: 0,
    });
    assert!(
        Parsed::read(Version::V2, &help_out.encode_to_vec())
            .expect_err("refused")
            .contains("4000")
    );
    let mut odd = req.clone();
    odd.timeseries[0].labels_refs = vec![1, 2, 3];
    assert!(
        Parsed::read(Version::V2, &odd.encode_to_vec())
            .expect_err("refused")
            .contains("odd number")
    );
    let mut first = req;
    first.symbols[0] = "x".into();
    assert!(
        Parsed::read(Version::V2, &first.encode_to_vec())
            .expect_err("refused")
            .contains("first symbol")
    );
}

/// An exemplar sent apart from its sample (as Prometheus sends them) is
/// kept on a point that holds no value.
#[test]
fn a_lone_exemplar_is_kept_on_a_point_without_a_value() {
    let req = WriteRequest {
        timeseries: vec![TimeSeries {
            labels: labels(&[("__name__", "rpc_total"), ("job", "a")]),
            exemplars: vec![ExemplarV1 {
                labels: labels(&[("span_id", "00f067aa0ba902b7"), ("user", "u1")]),
                value: 2.0,
                timestamp: NOW_MS,
            }],
            ..Default::default()
        }],
        metadata: vec![],
    };
    let (otlp, written, _) = convert(Version::V1, &req.encode_to_vec());
    assert_eq!((written.samples, written.exemplars), (0, 1));
    let m = &otlp.resource_metrics[0].scope_metrics[0].metrics[0];
    let Some(Data::Gauge(g)) = &m.data else { panic!("{m:?}") };
    let p = &g.data_points[0];
    assert_eq!((p.value, p.flags), (None, 1));
    assert_eq!(
        p.exemplars[0].span_id,
        vec![0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
    );
    assert_eq!(text(&p.exemplars[0].filtered_attributes), owned(&[("user", "u1")]));
}

/// A native histogram is an exponential histogram, Prometheus' bucket
/// index shifted by one; a custom-bucket one is an explicit histogram; a
/// histogram spanning too many buckets is refused.
#[test]
fn native_histograms_become_otlp_histograms() {
    let hist = Histogram {
        count_int: 7,
        sum: 12.5,
        schema: 0,
        zero_threshold: 1e-128,
        zero_count_int: 1,
        // Buckets 1, 2 and 5 (offset 2 past the first span's end).
        positive_spans: vec![Span { offset: 1, length: 2 }, Span { offset: 2, length: 1 }],
        positive_deltas: vec![2, 1, -2],
        timestamp: NOW_MS,
        ..Default::default()
    };
    let custom = Histogram {
        count_int: 3,
        sum: 1.0,
        schema: -53,
        positive_spans: vec![Span { offset: 0, length: 2 }],
        positive_deltas: vec![1, 1],
        custom_values: vec![0.1, 1.0],
        timestamp: NOW_MS,
        ..Default::default()
    };
    let req = WriteRequest {
        timeseries: vec![TimeSeries {
            labels: labels(&[("__name__", "latency_seconds")]),
            histograms: vec![hist.clone(), custom],
            ..Default::default()
        }],
        metadata: vec![],
    };
    let (otlp, written, refused) = convert(Version::V1, &req.encode_to_vec());
    assert!(!refused.any(), "{refused:?}");
    assert_eq!(written.histograms, 2);
    let metrics = &otlp.resource_metrics[0].scope_metrics[0].metrics;
    let Some(Data::ExponentialHistogram(e)) = &metrics[0].data else {
        panic!("{metrics:?}")
    };
    let p = &e.data_points[0];
    assert_eq!((p.count, p.sum, p.scale, p.zero_count), (7, Some(12.5), 0, 1));
    let pos = p.positive.as_ref().expect("positive buckets");
    assert_eq!((pos.offset, pos.bucket_counts.clone()), (0, vec![2, 3, 0, 0, 1]));
    let Some(Data::Histogram(h)) = &metrics[1].data else {
        panic!("{metrics:?}")
    };
    assert_eq!(h.data_points[0].bucket_counts, vec![1, 2, 0]);
    assert_eq!(h.data_points[0].explicit_bounds, vec![0.1, 1.0]);

    let mut wide = hist.clone();
    wide.positive_spans = vec![
        Span { offset: 0, length: 1 },
        Span {
            offset: 1_000_000,
            length: 1,
        },
    ];
    wide.positive_deltas = vec![1, 0];
    let mut mismatched = hist;
    mismatched.positive_deltas = vec![1];
    for (bad, want) in [(wide, "span more than"), (mismatched, "spans list 3 buckets")] {
        let req = WriteRequest {
            timeseries: vec![TimeSeries {
                labels: labels(&[("__name__", "h")]),
                histograms: vec![bad],
                ..Default::default()
            }],
            metadata: vec![],
        };
        let (_, written, refused) = convert(Version::V1, &req.encode_to_vec());
        assert_eq!(written.histograms, 0);
        assert!(refused.message().unwrap_or_default().contains(want), "{refused:?}");
    }
}

#[test]
fn the_content_type_chooses_the_version() {
    assert_eq!(version_of(None), Ok(Version::V1));
    assert_eq!(version_of(Some("application/x-protobuf")), Ok(Version::V1));
    assert_eq!(
        version_of(Some("application/x-protobuf;proto=io.prometheus.write.v2.Request")),
        Ok(Version::V2)
    );
    assert_eq!(
        version_of(Some("application/x-protobuf; proto=prometheus.WriteRequest")),
        Ok(Version::V1)
    );
    assert!(
        version_of(Some("application/x-protobuf;proto=x.Y"))
            .expect_err("refused")
            .contains("x.Y")
    );
    assert!(version_of(Some("application/json")).is_err());
}

/// The census is an upper bound of what the OTLP request holds.
#[test]
fn the_census_bounds_the_request_written() {
    let many: Vec<(String, String)> = (0..40).map(|i| (format!("label_{i:02}"), "v".repeat(30))).collect();
    let mut pairs: Vec<(&str, &str)> = vec![("__name__", "wide")];
    pairs.extend(many.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let samples: Vec<(i64, f64)> = (0..500).map(|i| (NOW_MS + i, i as f64)).collect();
    let req = WriteRequest {
        timeseries: vec![series(&pairs, &samples)],
        metadata: vec![],
    };
    let body = req.encode_to_vec();
    let mut p = Parsed::read(Version::V1, &body).expect("reads");
    let census = p.census();
    let (otlp, _) = p.write(window());
    assert!(census.bytes >= otlp.len() as u64, "{} < {}", census.bytes, otlp.len());
    assert!(
        census.bytes < otlp.len() as u64 * 2,
        "{} vs {}",
        census.bytes,
        otlp.len()
    );
    assert_eq!(census.records, 500);
    assert_eq!(census.attributes, 500 * 40);
}

/// Prometheus sends 1.0 metadata in requests of its own: a later
/// request's samples take the type an earlier one said, for their tenant
/// only, and a request's own metadata still comes first.
#[test]
fn metadata_sent_apart_types_later_samples_of_its_tenant() {
    let kinds = KindCache::default();
    let (a, b) = (TenantId::new("a").expect("tenant"), TenantId::new("b").expect("tenant"));
    let metadata_only = WriteRequest {
        timeseries: Vec::new(),
        metadata: vec![MetricMetadata {
            r#type: 1,
            family: "jobs".into(),
            help: "Jobs.".into(),
            unit: String::new(),
        }],
    }
    .encode_to_vec();
    let mut p = Parsed::read(Version::V1, &metadata_only).expect("reads");
    p.apply_kinds(&kinds, &a);
    let samples = WriteRequest {
        timeseries: vec![
            series(&[("__name__", "jobs_total"), ("job", "j")], &[(NOW_MS, 3.0)]),
            series(&[("__name__", "other"), ("job", "j")], &[(NOW_MS, 1.0)]),
        ],
        metadata: Vec::new(),
    }
    .encode_to_vec();
    let kind_of = |tenant: &TenantId, body: &[u8]| {
        let mut p = Parsed::read(Version::V1, body).expect("reads");
        p.apply_kinds(&kinds, tenant);
        let (otlp, _) = p.write(window());
        let req = ExportMetricsServiceRequest::decode(otlp.as_slice()).expect("decodes");
        rows(&req).into_iter().map(|r| (r.1, r.2)).collect::<Vec<_>>()
    };
    assert_eq!(
        kind_of(&a, &samples),
        [("jobs_total".to_owned(), "counter"), ("other".to_owned(), "gauge")]
    );
    assert_eq!(
        kind_of(&b, &samples),
        [("jobs_total".to_owned(), "gauge"), ("other".to_owned(), "gauge")]
    );
    // A tenant that never sent metadata holds nothing (no entry grows
    // per tenant seen).
    assert!(!kinds.families.lock().expect("lock").contains_key(&b));
    // The request's own metadata wins over what was remembered.
    let typed = WriteRequest {
        timeseries: vec![series(&[("__name__", "jobs_total"), ("job", "j")], &[(NOW_MS, 3.0)])],
        metadata: vec![MetricMetadata {
            r#type: 2,
            family: "jobs".into(),
            help: String::new(),
            unit: String::new(),
        }],
    }
    .encode_to_vec();
    assert_eq!(kind_of(&a, &typed), [("jobs_total".to_owned(), "gauge")]);
    // And it is remembered in turn.
    assert_eq!(kind_of(&a, &samples)[0], ("jobs_total".to_owned(), "gauge"));
}

/// A tenant remembers at most its share of families.
#[test]
fn the_kind_cache_is_bounded_per_tenant() {
    let kinds = KindCache::default();
    let tenant = TenantId::new("many").expect("tenant");
    let metadata = (0..MAX_CACHED_FAMILIES_PER_TENANT + 50)
        .map(|i| MetricMetadata {
            r#type: 1,
            family: format!("f{i}"),
            help: String::new(),
            unit: String::new(),
        })
        .collect();
    let body = WriteRequest {
        timeseries: Vec::new(),
        metadata,
    }
    .encode_to_vec();
    Parsed::read(Version::V1, &body)
        .expect("reads")
        .apply_kinds(&kinds, &tenant);
    let held = kinds.families.lock().expect("lock")[&tenant].len();
    assert_eq!(held, MAX_CACHED_FAMILIES_PER_TENANT);
}

/// Views are metered: a request of a million empty labels stops at the
/// memory it was given, and reads whole with enough.
#[test]
fn views_stop_at_the_memory_reserved_for_them() {
    let big = TimeSeries {
        labels: vec![Label::default(); 1_000_000],
        ..Default::default()
    };
    let body = WriteRequest {
        timeseries: vec![big],
        metadata: Vec::new(),
    }
    .encode_to_vec();
    let e = Parsed::read_within(Version::V1, &body, Meter::new(8 * body.len())).expect_err("over");
    assert!(matches!(e, ReadError::OverBudget { .. }), "{e:?}");
    // 32 bytes a label, three times over for growth.
    let p = Parsed::read_within(Version::V1, &body, Meter::new(100 * body.len())).expect("reads");
    assert_eq!(p.refused.samples, 0);
    assert!(
        p.refused
            .first
            .as_deref()
            .is_some_and(|m| m.contains("empty label name"))
    );
}

/// The series of one name and resource are one OTLP metric of all their
/// points, as an OTLP exporter sends them; another name or resource is
/// another metric.
#[test]
fn series_of_one_name_share_one_metric() {
    let req = WriteRequest {
        timeseries: vec![
            series(&[("__name__", "up"), ("instance", "a"), ("job", "j")], &[(NOW_MS, 1.0)]),
            series(&[("__name__", "cpu"), ("job", "j"), ("mode", "user")], &[(NOW_MS, 2.0)]),
            series(&[("__name__", "cpu"), ("job", "j"), ("mode", "idle")], &[(NOW_MS, 3.0)]),
            series(&[("__name__", "up"), ("instance", "b"), ("job", "j")], &[(NOW_MS, 0.0)]),
            series(&[("__name__", "cpu"), ("job", "j"), ("mode", "nice")], &[(NOW_MS, 4.0)]),
        ],
        metadata: Vec::new(),
    };
    let (otlp, written, _) = convert(Version::V1, &req.encode_to_vec());
    assert_eq!(written.samples, 5);
    let metrics: Vec<(String, usize)> = otlp
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .map(|m| {
            let n = match &m.data {
                Some(Data::Gauge(g)) => g.data_points.len(),
                other => panic!("not a gauge: {other:?}"),
            };
            (m.name.clone(), n)
        })
        .collect();
    // Resources in the order met: (j, a), (j, none), (j, b).
    assert_eq!(
        metrics,
        [("up".to_owned(), 1), ("cpu".to_owned(), 3), ("up".to_owned(), 1)]
    );
    let modes: Vec<f64> = rows(&otlp).iter().filter(|r| r.1 == "cpu").map(|r| r.5).collect();
    assert_eq!(modes, [2.0, 3.0, 4.0], "a name's series keep their request order");
}

/// The census the receivers take for a remote-write request (they do not
/// count the OTLP Mira writes from it) holds at least the memory the OTLP
/// request's own census would, and its records are the points written:
/// for series each a resource of its own, for exemplars with labels (each
/// alone and on a sample) and for wide label sets.
#[test]
fn the_census_holds_what_the_otlp_census_would() {
    let one_resource_each: Vec<TimeSeries> = (0..2000)
        .map(|i| {
            let (job, instance) = (format!("ns/job-{i}"), format!("host-{i}:9100"));
            series(
                &[("__name__", "up"), ("job", &job), ("instance", &instance)],
                &[(NOW_MS, 1.0)],
            )
        })
        .collect();
    let exemplar = |t: i64| ExemplarV1 {
        labels: labels(&[
            ("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"),
            ("user", "u1"),
            ("region", "eu"),
        ]),
        value: 2.0,
        timestamp: t,
    };
    let with_exemplars: Vec<TimeSeries> = (0..500)
        .map(|i| TimeSeries {
            labels: labels(&[("__name__", "rpc_total"), ("job", "a"), ("path", &format!("/p{i}"))]),
            samples: vec![Sample {
                value: 1.0,
                timestamp: NOW_MS,
            }],
            exemplars: vec![exemplar(NOW_MS), exemplar(NOW_MS + 1)],
            ..Default::default()
        })
        .collect();
    let many: Vec<(String, String)> = (0..40).map(|i| (format!("label_{i:02}"), "v".repeat(30))).collect();
    let mut wide: Vec<(&str, &str)> = vec![("__name__", "wide")];
    wide.extend(many.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let samples: Vec<(i64, f64)> = (0..500).map(|i| (NOW_MS + i, i as f64)).collect();
    for (what, timeseries) in [
        ("a resource per series", one_resource_each),
        ("exemplars", with_exemplars),
        ("wide labels", vec![series(&wide, &samples)]),
    ] {
        let body = WriteRequest {
            timeseries,
            metadata: vec![],
        }
        .encode_to_vec();
        let mut p = Parsed::read(Version::V1, &body).expect("reads");
        let ours = p.census();
        let (otlp, written) = p.write(window());
        let theirs = crate::records::census(Signal::Metrics, &otlp).expect("our OTLP reads");
        assert_eq!(written.points(), theirs.records, "{what}");
        assert!(
            ours.decoded_bytes(Signal::Metrics) >= theirs.decoded_bytes(Signal::Metrics),
            "{what}: {} < {} ({ours:?} against {theirs:?})",
            ours.decoded_bytes(Signal::Metrics),
            theirs.decoded_bytes(Signal::Metrics)
        );
    }
}

/// `by_name` is a stable sort by name whether the names come in runs
/// (sorted run by run) or mixed (grouped by hashing), over member lists
/// that skip indices.
#[test]
fn by_name_is_a_stable_sort_by_name() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let (mut runs_taken, mut mixed_taken) = (0, 0);
    for _ in 0..2000 {
        let run = 1 + next(8) as usize;
        let names: Vec<String> = (0..next(40))
            .flat_map(|_| {
                let name = format!("m{}", next(5));
                std::iter::repeat_n(name, run)
            })
            .collect();
        let members: Vec<usize> = (0..names.len()).filter(|_| next(4) > 0).collect();
        let mut want = members.clone();
        want.sort_by(|a, b| names[*a].cmp(&names[*b]));
        assert_eq!(by_name(&members, |i| names[i].as_str()), want, "{names:?} {members:?}");
        let runs = members.windows(2).filter(|w| names[w[0]] != names[w[1]]).count() + 1;
        if runs * 4 <= members.len() {
            runs_taken += 1;
        } else {
            mixed_taken += 1;
        }
    }
    assert!(runs_taken > 100 && mixed_taken > 100, "{runs_taken} {mixed_taken}");
}

/// The count a 1.0 request's views are reserved by is exact, and a body
/// that does not parse is not counted (the reading says why).
#[test]
fn a_1_0_request_is_counted_before_reading() {
    let req = WriteRequest {
        timeseries: vec![
            series(&[("__name__", "a"), ("job", "j")], &[(1, 1.0), (2, 2.0)]),
            series(&[("__name__", "b")], &[(3, 3.0)]),
            series(&[("__name__", "c"), ("x", "1"), ("y", "2")], &[]),
        ],
        ..Default::default()
    };
    let body = req.encode_to_vec();
    assert_eq!(count_v1(&body), Some((3, 6, 3)));
    let p = Parsed::read(Version::V1, &body).expect("reads");
    assert_eq!((p.series.len(), p.labels.len(), p.samples.len()), (3, 6, 3));
    assert_eq!(count_v1(&body[..body.len() - 1]), None);
    assert_eq!(count_v1(b""), Some((0, 0, 0)));
}
