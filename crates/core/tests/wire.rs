//! The wire readers for spans and data points against prost, the
//! reference: for generated requests full of edge cases, for encodings
//! prost's encoder never writes (unpacked and split repeated fields,
//! unknown fields at every level, repeated singular fields) and for damaged
//! bytes, `append_encoded` (the wire reader, falling back to prost for
//! shapes it does not take) builds exactly the tables that prost decode +
//! `append` builds, or both refuse.

use mira_core::convert::{PointsBuilder, SignalBuilder, SpansBuilder, TableSet};
use mira_testkit::arb;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint, exponential_histogram_data_point, metric,
    number_data_point, summary_data_point,
};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};
use proptest::prelude::*;
use prost::Message;

/// Builds tables from encoded bytes both ways: `append_encoded` (the wire
/// reader) and prost decode + `append`. Errors as text.
fn both_ways<B: SignalBuilder>(bytes: &[u8]) -> (Result<TableSet, String>, Result<TableSet, String>) {
    let mut fast = B::default();
    let a = fast.append_encoded(bytes).map_err(|e| e.to_string()).and_then(|n| {
        assert_eq!(n, fast.rows(), "row count answered");
        fast.finish().map_err(|e| e.to_string())
    });
    let mut slow = B::default();
    let b = <B::Request as Message>::decode(bytes)
        .map_err(|e| format!("malformed protobuf: {e}"))
        .and_then(|r| slow.append(&r).map_err(|e| e.to_string()))
        .and_then(|_| slow.finish().map_err(|e| e.to_string()));
    (a, b)
}

/// Every table (schema, columns, dictionaries, row counts) and the time
/// range are equal.
fn same_tables(a: &TableSet, b: &TableSet) -> Result<(), String> {
    if (a.rows, a.min_time, a.max_time) != (b.rows, b.min_time, b.max_time) {
        return Err(format!(
            "rows/times differ: {:?} vs {:?}",
            (a.rows, a.min_time, a.max_time),
            (b.rows, b.min_time, b.max_time)
        ));
    }
    if a.tables.len() != b.tables.len() {
        return Err("table count differs".into());
    }
    for ((na, ta), (nb, tb)) in a.tables.iter().zip(&b.tables) {
        if na != nb || ta != tb {
            return Err(format!("table {na} differs:\nwire  {ta:?}\nprost {tb:?}"));
        }
    }
    Ok(())
}

/// Both paths succeed with equal tables; returns the row count.
fn agree<B: SignalBuilder>(bytes: &[u8]) -> usize {
    match both_ways::<B>(bytes) {
        (Ok(a), Ok(b)) => {
            if let Err(e) = same_tables(&a, &b) {
                panic!("{e}");
            }
            a.rows
        }
        (a, b) => panic!("wire {:?} prost {:?}", a.map(|t| t.rows).err(), b.map(|t| t.rows).err()),
    }
}

/// Both paths refuse; returns the wire path's error.
fn both_refuse<B: SignalBuilder>(bytes: &[u8]) -> String {
    match both_ways::<B>(bytes) {
        (Err(a), Err(_)) => a,
        (a, b) => panic!("wire {:?} prost {:?}", a.map(|t| t.rows), b.map(|t| t.rows)),
    }
}

fn damage(mut bytes: Vec<u8>, edits: &[(usize, u8)], cut: usize) -> Vec<u8> {
    if !bytes.is_empty() {
        for &(at, v) in edits {
            let i = at % bytes.len();
            bytes[i] = v;
        }
        bytes.truncate(cut % (bytes.len() + 1));
    }
    bytes
}

fn agree_or_both_refuse<B: SignalBuilder>(bytes: &[u8]) -> Result<(), TestCaseError> {
    match both_ways::<B>(bytes) {
        (Ok(a), Ok(b)) => same_tables(&a, &b).map_err(TestCaseError::fail),
        (Err(_), Err(_)) => Ok(()),
        (a, b) => Err(TestCaseError::fail(format!(
            "paths disagree: wire {:?} prost {:?}",
            a.map(|t| t.rows),
            b.map(|t| t.rows)
        ))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The span wire reader builds exactly what prost + append builds.
    #[test]
    fn span_wire_reader_matches_prost(req in arb::traces_request()) {
        let bytes = req.encode_to_vec();
        let n = agree::<SpansBuilder>(&bytes);
        let spans: usize = req.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
        prop_assert_eq!(n, spans);
    }

    /// The data point wire reader builds exactly what prost + append
    /// builds, series table and dictionaries included.
    #[test]
    fn point_wire_reader_matches_prost(req in arb::metrics_request()) {
        agree::<PointsBuilder>(&req.encode_to_vec());
    }

    /// Two requests into one builder: series and dictionaries shared
    /// across requests number the same way on both paths.
    #[test]
    fn point_wire_reader_matches_prost_across_requests(a in arb::metrics_request(), b in arb::metrics_request()) {
        let mut fast = PointsBuilder::default();
        let mut slow = PointsBuilder::default();
        for r in [&a, &b, &a] {
            let bytes = r.encode_to_vec();
            fast.append_encoded(&bytes).expect("wire");
            // From the bytes, not `r`: encoding drops what proto3 cannot
            // carry (a -0.0 summary sum is written as nothing).
            let decoded = ExportMetricsServiceRequest::decode(bytes.as_slice()).expect("decode");
            slow.append(&decoded).expect("prost");
        }
        let (x, y) = (fast.finish().expect("finish"), slow.finish().expect("finish"));
        same_tables(&x, &y).map_err(TestCaseError::fail)?;
    }

    /// On damaged bytes both span paths fail, or both succeed with equal
    /// tables.
    #[test]
    fn span_wire_reader_agrees_on_damaged_bytes(
        req in arb::traces_request(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        agree_or_both_refuse::<SpansBuilder>(&damage(req.encode_to_vec(), &edits, cut))?;
    }

    /// The same for data points.
    #[test]
    fn point_wire_reader_agrees_on_damaged_bytes(
        req in arb::metrics_request(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        agree_or_both_refuse::<PointsBuilder>(&damage(req.encode_to_vec(), &edits, cut))?;
    }
}

// Hand-made encodings prost's encoder never writes.

fn key(field: u32, wire: u8) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_varint(u64::from(field << 3 | u32::from(wire)), &mut out);
    out
}

/// A length-delimited field.
fn ld(field: u32, body: &[u8]) -> Vec<u8> {
    let mut out = key(field, 2);
    prost::encoding::encode_varint(body.len() as u64, &mut out);
    out.extend_from_slice(body);
    out
}

fn fixed64(field: u32, v: u64) -> Vec<u8> {
    let mut out = key(field, 1);
    out.extend_from_slice(&v.to_le_bytes());
    out
}

fn varint(field: u32, v: u64) -> Vec<u8> {
    let mut out = key(field, 0);
    prost::encoding::encode_varint(v, &mut out);
    out
}

/// One of each unknown wire type, with field numbers no OTLP message uses.
fn unknown() -> Vec<u8> {
    let mut out = varint(90, 7);
    out.extend(fixed64(91, 9));
    out.extend(ld(92, b"??"));
    out.extend(key(93, 5));
    out.extend([1, 2, 3, 4]);
    out
}

/// `msg`'s encoding with every unknown wire type appended.
fn with_unknown<M: Message>(msg: &M) -> Vec<u8> {
    let mut out = msg.encode_to_vec();
    out.extend(unknown());
    out
}

fn kv(k: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

fn attrs() -> Vec<KeyValue> {
    vec![
        kv("s", any_value::Value::StringValue("x".into())),
        kv("i", any_value::Value::IntValue(-3)),
        kv("d", any_value::Value::DoubleValue(-0.0)),
        kv("b", any_value::Value::BoolValue(true)),
        kv("y", any_value::Value::BytesValue(vec![0, 1])),
        kv("e", any_value::Value::StringValue(String::new())),
    ]
}

/// Wraps the encoded leaves in scope and resource groups, with unknown
/// fields at both levels and at the top.
fn request(leaves: &[Vec<u8>]) -> Vec<u8> {
    let mut scope = Vec::new();
    for l in leaves {
        scope.extend(ld(2, l));
    }
    scope.extend(unknown());
    let mut resource = ld(2, &scope);
    resource.extend(unknown());
    let mut req = ld(1, &resource);
    req.extend(unknown());
    req
}

#[test]
fn spans_with_unknown_fields_everywhere_agree() {
    let event = span::Event {
        time_unix_nano: 5,
        name: "ev".into(),
        attributes: attrs(),
        dropped_attributes_count: 1,
    };
    let link = span::Link {
        trace_id: vec![1; 16],
        span_id: vec![2; 8],
        trace_state: "a=b".into(),
        attributes: attrs(),
        dropped_attributes_count: 2,
        flags: 0x301,
    };
    let status = Status {
        message: "boom".into(),
        code: 2,
    };
    let mut bytes = Span {
        trace_id: vec![3; 16],
        span_id: vec![4; 8],
        name: "op".into(),
        kind: 3,
        start_time_unix_nano: 10,
        end_time_unix_nano: 20,
        attributes: attrs(),
        flags: 0x101,
        ..Default::default()
    }
    .encode_to_vec();
    // Unknown fields inside each attribute value, event, link and status;
    // span attributes after the events (not where prost writes them).
    bytes.extend(ld(11, &with_unknown(&event)));
    bytes.extend(ld(13, &with_unknown(&link)));
    bytes.extend(ld(15, &with_unknown(&status)));
    bytes.extend(ld(9, &with_unknown(&kv("late", any_value::Value::IntValue(1)))));
    bytes.extend(unknown());
    // A span whose scalars appear twice: the last one wins, as in prost.
    let mut twice = Span::default().encode_to_vec();
    twice.extend(ld(5, b"first"));
    twice.extend(ld(5, b"second"));
    twice.extend(fixed64(7, 1));
    twice.extend(fixed64(7, 2));
    assert_eq!(agree::<SpansBuilder>(&request(&[bytes, twice])), 2);
}

#[test]
fn a_repeated_status_is_merged_as_prost_merges_it() {
    let mut bytes = Span::default().encode_to_vec();
    bytes.extend(ld(
        15,
        &Status {
            message: "m".into(),
            code: 0,
        }
        .encode_to_vec(),
    ));
    bytes.extend(ld(
        15,
        &Status {
            message: String::new(),
            code: 2,
        }
        .encode_to_vec(),
    ));
    let req = request(&[bytes]);
    assert_eq!(agree::<SpansBuilder>(&req), 1);
    let decoded = ExportTraceServiceRequest::decode(req.as_slice()).expect("decode");
    let status = decoded.resource_spans[0].scope_spans[0].spans[0].status.clone();
    assert_eq!(
        status,
        Some(Status {
            message: "m".into(),
            code: 2
        })
    );
}

fn metric_with(name: &str, data: (u32, Vec<u8>)) -> Vec<u8> {
    let mut out = Metric {
        name: name.into(),
        unit: "1".into(),
        ..Default::default()
    }
    .encode_to_vec();
    out.extend(ld(data.0, &data.1));
    out.extend(unknown());
    out
}

#[test]
fn unpacked_and_split_repeated_fields_agree() {
    // A histogram point whose bucket counts and bounds are unpacked,
    // interleaved, and partly packed in two runs.
    let mut point = HistogramDataPoint {
        attributes: attrs(),
        time_unix_nano: 7,
        count: 6,
        sum: Some(1.5),
        min: Some(0.5),
        ..Default::default()
    }
    .encode_to_vec();
    point.extend(fixed64(6, 1));
    point.extend(fixed64(7, 1.0f64.to_bits()));
    point.extend(fixed64(6, 2));
    point.extend(ld(7, &2.0f64.to_bits().to_le_bytes()));
    let mut packed = Vec::new();
    packed.extend(3u64.to_le_bytes());
    point.extend(ld(6, &packed));
    point.extend(unknown());
    let mut hist = ld(1, &point);
    hist.extend(varint(2, 2));
    hist.extend(unknown());

    // Exponential buckets unpacked, then packed, with unknown fields.
    let mut buckets = varint(1, 3); // zigzag: offset -2
    buckets.extend(varint(2, 4));
    let mut run = Vec::new();
    prost::encoding::encode_varint(5, &mut run);
    prost::encoding::encode_varint(u64::MAX, &mut run);
    buckets.extend(ld(2, &run));
    buckets.extend(unknown());
    let mut exp = ExponentialHistogramDataPoint {
        time_unix_nano: 8,
        count: 9,
        scale: -3,
        zero_threshold: 0.25,
        ..Default::default()
    }
    .encode_to_vec();
    exp.extend(ld(8, &buckets));
    exp.extend(ld(
        9,
        &exponential_histogram_data_point::Buckets::default().encode_to_vec(),
    ));
    exp.extend(unknown());
    let mut exph = ld(1, &exp);
    exph.extend(varint(2, 1));

    // A summary with unknown fields in each quantile.
    let q = summary_data_point::ValueAtQuantile {
        quantile: 0.5,
        value: 3.0,
    };
    let mut summary_point = SummaryDataPoint {
        count: 2,
        sum: 6.0,
        ..Default::default()
    }
    .encode_to_vec();
    summary_point.extend(ld(6, &with_unknown(&q)));
    let summary = ld(1, &summary_point);

    // Number points whose value oneof appears twice (the last wins).
    let mut number = NumberDataPoint {
        attributes: attrs(),
        value: Some(number_data_point::Value::AsInt(4)),
        ..Default::default()
    }
    .encode_to_vec();
    number.extend(fixed64(4, 2.5f64.to_bits()));
    number.extend(unknown());
    let mut sum = ld(1, &number);
    sum.extend(varint(2, 2));
    sum.extend(varint(3, 1));
    sum.extend(unknown());

    let req = request(&[
        metric_with("h", (9, hist)),
        metric_with("e", (10, exph)),
        metric_with("s", (11, summary)),
        metric_with("n", (7, sum)),
        metric_with("g", (5, ld(1, &with_unknown(&NumberDataPoint::default())))),
    ]);
    assert_eq!(agree::<PointsBuilder>(&req), 5);
    // The shapes were read as prost reads them.
    let decoded = ExportMetricsServiceRequest::decode(req.as_slice()).expect("decode");
    let metrics = &decoded.resource_metrics[0].scope_metrics[0].metrics;
    match &metrics[0].data {
        Some(metric::Data::Histogram(Histogram { data_points, .. })) => {
            assert_eq!(data_points[0].bucket_counts, [1, 2, 3]);
            assert_eq!(data_points[0].explicit_bounds, [1.0, 2.0]);
        }
        other => panic!("{other:?}"),
    }
    match &metrics[1].data {
        Some(metric::Data::ExponentialHistogram(ExponentialHistogram { data_points, .. })) => {
            let pos = data_points[0].positive.as_ref().expect("positive");
            assert_eq!((pos.offset, pos.bucket_counts.as_slice()), (-2, &[4, 5, u64::MAX][..]));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_metric_kind_and_empty_metrics_agree() {
    let metrics = vec![
        Metric {
            name: "empty".into(),
            ..Default::default()
        },
        Metric {
            name: "g".into(),
            metadata: attrs(),
            data: Some(metric::Data::Gauge(Gauge {
                data_points: vec![NumberDataPoint::default(); 3],
            })),
            ..Default::default()
        },
        Metric {
            name: "sum-empty".into(),
            data: Some(metric::Data::Summary(Summary { data_points: vec![] })),
            ..Default::default()
        },
    ];
    let req = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    assert_eq!(agree::<PointsBuilder>(&req.encode_to_vec()), 3);
}

/// A span request with one span whose encoding is `span`.
fn one_span(span: &[u8]) -> Vec<u8> {
    ld(1, &ld(2, &ld(2, span)))
}

/// A metrics request with one gauge whose single point's encoding is `point`.
fn one_point(point: &[u8]) -> Vec<u8> {
    ld(1, &ld(2, &ld(2, &ld(5, &ld(1, point)))))
}

#[test]
fn malformed_bytes_are_refused_by_both_paths_with_a_named_problem() {
    let good_span = Span {
        trace_id: vec![1; 16],
        span_id: vec![2; 8],
        name: "op".into(),
        ..Default::default()
    }
    .encode_to_vec();
    let good = one_span(&good_span);
    assert_eq!(agree::<SpansBuilder>(&good), 1);
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() - 1].to_vec()),
        // name (5) as a varint
        ("wrong wire type", one_span(&varint(5, 1))),
        // start time (fixed64) as a length-delimited field
        ("wrong wire type", one_span(&ld(7, b"12345678"))),
        // a length past the end of the buffer
        ("oversized length", {
            let mut b = key(5, 2);
            prost::encoding::encode_varint(1 << 40, &mut b);
            b.extend(b"op");
            one_span(&b)
        }),
        ("invalid utf-8", one_span(&ld(5, &[0xff, 0xfe]))),
        ("group wire type", one_span(&key(5, 3))),
        ("field number 0", one_span(&varint(0, 1))),
        (
            "overlong varint",
            one_span(&[0x50, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]),
        ),
    ];
    for (what, bytes) in cases.drain(..) {
        let err = both_refuse::<SpansBuilder>(&bytes);
        assert!(err.contains("malformed protobuf"), "{what}: {err}");
    }

    let good_point = NumberDataPoint {
        time_unix_nano: 1,
        value: Some(number_data_point::Value::AsDouble(1.0)),
        ..Default::default()
    }
    .encode_to_vec();
    assert_eq!(agree::<PointsBuilder>(&one_point(&good_point)), 1);
    let histogram = |point: Vec<u8>| ld(1, &ld(2, &ld(2, &ld(9, &ld(1, &point)))));
    let exp = |buckets: Vec<u8>| ld(1, &ld(2, &ld(2, &ld(10, &ld(1, &ld(8, &buckets))))));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", one_point(&good_point[..good_point.len() - 1])),
        ("wrong wire type", one_point(&varint(3, 1))),
        ("oversized length", {
            let mut b = key(7, 2);
            prost::encoding::encode_varint(u64::MAX >> 1, &mut b);
            one_point(&b)
        }),
        ("packed fixed64 not a multiple of 8", histogram(ld(6, &[0; 12]))),
        ("packed varint cut short", exp(ld(2, &[0x80]))),
        ("wrong wire type for bounds", histogram(varint(7, 1))),
        ("gauge given as a varint", ld(1, &ld(2, &ld(2, &varint(5, 1))))),
    ];
    for (what, bytes) in cases {
        let err = both_refuse::<PointsBuilder>(&bytes);
        assert!(err.contains("malformed protobuf"), "{what}: {err}");
    }
}

#[test]
fn a_bad_id_refuses_the_whole_request_on_both_paths() {
    let mut corpus = mira_testkit::corpus::Corpus::new(7, mira_testkit::corpus::Cardinality::Low);
    let mut req = corpus.traces(50);
    let last = req
        .resource_spans
        .last_mut()
        .and_then(|r| r.scope_spans.last_mut())
        .and_then(|s| s.spans.last_mut())
        .expect("a span");
    last.links.push(span::Link {
        span_id: vec![1, 2],
        ..Default::default()
    });
    let mut b = SpansBuilder::default();
    let err = b
        .append_encoded(&req.encode_to_vec())
        .expect_err("2-byte span id accepted");
    assert!(err.to_string().contains("link span_id must be 8 bytes"), "{err}");
    assert_eq!(b.rows(), 0, "a refused request left rows behind");
    assert_eq!(both_refuse::<SpansBuilder>(&req.encode_to_vec()), err.to_string());

    let mut req = corpus.metrics(50);
    let m = &mut req.resource_metrics[0].scope_metrics[0].metrics[0];
    let exemplar = opentelemetry_proto::tonic::metrics::v1::Exemplar {
        trace_id: vec![9; 15],
        ..Default::default()
    };
    match &mut m.data {
        Some(metric::Data::Gauge(Gauge { data_points })) | Some(metric::Data::Sum(Sum { data_points, .. })) => {
            data_points[0].exemplars.push(exemplar)
        }
        Some(metric::Data::Histogram(h)) => h.data_points[0].exemplars.push(exemplar),
        Some(metric::Data::ExponentialHistogram(h)) => h.data_points[0].exemplars.push(exemplar),
        other => panic!("unexpected first metric {other:?}"),
    }
    let mut b = PointsBuilder::default();
    let err = b
        .append_encoded(&req.encode_to_vec())
        .expect_err("15-byte trace id accepted");
    assert!(err.to_string().contains("exemplar trace_id must be 16 bytes"), "{err}");
    assert_eq!(b.rows(), 0, "a refused request left rows behind");
    assert_eq!(both_refuse::<PointsBuilder>(&req.encode_to_vec()), err.to_string());
}

#[test]
fn corpus_requests_agree() {
    for card in [
        mira_testkit::corpus::Cardinality::Low,
        mira_testkit::corpus::Cardinality::High,
    ] {
        let mut corpus = mira_testkit::corpus::Corpus::new(3, card);
        assert_eq!(agree::<SpansBuilder>(&corpus.traces(3000).encode_to_vec()), 3000);
        assert_eq!(agree::<PointsBuilder>(&corpus.metrics(3000).encode_to_vec()), 3000);
    }
}

#[test]
fn a_span_with_every_field_round_trips_through_the_wire_reader() {
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id: vec![1; 16],
                    span_id: vec![2; 8],
                    parent_span_id: vec![3; 8],
                    trace_state: "k=v".into(),
                    flags: 0x301,
                    name: "n".into(),
                    kind: 5,
                    start_time_unix_nano: 1,
                    end_time_unix_nano: u64::MAX,
                    attributes: attrs(),
                    dropped_attributes_count: 1,
                    events: vec![span::Event::default()],
                    dropped_events_count: 2,
                    links: vec![span::Link::default()],
                    dropped_links_count: 3,
                    status: Some(Status::default()),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let bytes = req.encode_to_vec();
    assert_eq!(agree::<SpansBuilder>(&bytes), 1);
    let mut b = SpansBuilder::default();
    b.append_encoded(&bytes).expect("append");
    let back = mira_core::convert::spans_to_otlp(&b.finish().expect("finish")).expect("otlp");
    assert_eq!(
        mira_testkit::flatten::traces(&back),
        mira_testkit::flatten::traces(&req)
    );
}

/// A span (field 9) or data point (field 7) attribute whose `KeyValue`
/// encoding is `kv`, hand-made so the edges of the straight-line attribute
/// reader (lengths of 127 and 128 bytes, non-ASCII and invalid UTF-8,
/// multi-byte and non-minimal varints, an empty value, fields in another
/// order) are all exercised.
fn attr_cases() -> Vec<(&'static str, Vec<u8>)> {
    let value = |member: Vec<u8>| ld(2, &member);
    let pair = |k: &[u8], member: Vec<u8>| {
        let mut b = ld(1, k);
        b.extend(value(member));
        b
    };
    let long = |n: usize| "k".repeat(n);
    vec![
        ("string", pair(b"k", ld(1, b"v"))),
        (
            "non-ascii string",
            pair("clé".as_bytes(), ld(1, "ünïcødé ✓ 🚀".as_bytes())),
        ),
        ("key of 127 bytes", pair(long(127).as_bytes(), ld(1, b"v"))),
        ("key of 128 bytes", pair(long(128).as_bytes(), ld(1, b"v"))),
        ("value of 124 bytes", pair(b"k", ld(1, long(124).as_bytes()))),
        ("value of 126 bytes", pair(b"k", ld(1, long(126).as_bytes()))),
        ("value of 200 bytes", pair(b"k", ld(1, long(200).as_bytes()))),
        ("empty string", pair(b"k", ld(1, b""))),
        ("int", pair(b"k", varint(3, 5432))),
        ("negative int", pair(b"k", varint(3, (-3i64) as u64))),
        ("int, non-minimal varint", pair(b"k", vec![0x18, 0x85, 0x00])),
        ("bool false", pair(b"k", varint(2, 0))),
        ("bool of 2", pair(b"k", varint(2, 2))),
        ("bool, two-byte varint", pair(b"k", vec![0x10, 0x81, 0x00])),
        ("double", pair(b"k", fixed64(4, 1.5f64.to_bits()))),
        ("bytes", pair(b"k", ld(7, &[0xff, 0x00, 0x80]))),
        ("empty value", pair(b"k", Vec::new())),
        ("two members", pair(b"k", [ld(1, b"a"), varint(3, 1)].concat())),
        ("value before key", [value(ld(1, b"v")), ld(1, b"k")].concat()),
        ("no key", value(ld(1, b"v"))),
        ("no value", ld(1, b"k")),
        ("key twice", [ld(1, b"a"), pair(b"k", ld(1, b"v"))].concat()),
        (
            "trailing unknown field",
            [pair(b"k", ld(1, b"v")), varint(9, 1)].concat(),
        ),
    ]
}

/// Attributes the wire reader refuses to read itself or that neither path
/// takes: invalid UTF-8 in a key or a string value.
fn bad_attr_cases() -> Vec<(&'static str, Vec<u8>)> {
    let pair = |k: &[u8], member: Vec<u8>| [ld(1, k), ld(2, &member)].concat();
    vec![
        ("invalid utf-8 key", pair(&[0xff, b'k'], ld(1, b"v"))),
        ("invalid utf-8 value", pair(b"k", ld(1, &[b'v', 0xc3]))),
        ("invalid utf-8 key, int value", pair(&[0xc3], varint(3, 1))),
        (
            "value length past the end",
            [ld(1, b"k"), vec![0x12, 0x05, 0x0a, 0x01, b'v']].concat(),
        ),
    ]
}

#[test]
fn attribute_edge_cases_agree_with_prost() {
    let span = |attr: &[u8]| {
        let mut s = Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: "op".into(),
            ..Default::default()
        }
        .encode_to_vec();
        s.extend(ld(9, attr));
        one_span(&s)
    };
    let point = |attr: &[u8]| {
        let mut p = NumberDataPoint {
            time_unix_nano: 1,
            value: Some(number_data_point::Value::AsInt(1)),
            ..Default::default()
        }
        .encode_to_vec();
        p.extend(ld(7, attr));
        one_point(&p)
    };
    for (what, attr) in attr_cases() {
        assert_eq!(agree::<SpansBuilder>(&span(&attr)), 1, "{what}");
        assert_eq!(agree::<PointsBuilder>(&point(&attr)), 1, "{what}");
    }
    for (what, attr) in bad_attr_cases() {
        let err = both_refuse::<SpansBuilder>(&span(&attr));
        assert!(err.contains("malformed protobuf"), "{what}: {err}");
        let err = both_refuse::<PointsBuilder>(&point(&attr));
        assert!(err.contains("malformed protobuf"), "{what}: {err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Several requests into one span builder, one of them of a shape the
    /// wire reader leaves to prost: the views the builder keeps between
    /// requests carry nothing over, and both paths build the same tables.
    #[test]
    fn span_wire_reader_matches_prost_across_requests(a in arb::traces_request(), b in arb::traces_request()) {
        // A request whose only span holds its status twice: prost merges,
        // the wire reader falls back.
        let status = ld(15, &varint(3, 2));
        let odd = one_span(&[ld(5, b"op"), status.clone(), status].concat());
        let mut fast = SpansBuilder::default();
        let mut slow = SpansBuilder::default();
        for bytes in [a.encode_to_vec(), odd, b.encode_to_vec(), a.encode_to_vec()] {
            fast.append_encoded(&bytes).expect("wire");
            let decoded = ExportTraceServiceRequest::decode(bytes.as_slice()).expect("decode");
            slow.append(&decoded).expect("prost");
        }
        let (x, y) = (fast.finish().expect("finish"), slow.finish().expect("finish"));
        same_tables(&x, &y).map_err(TestCaseError::fail)?;
    }
}
