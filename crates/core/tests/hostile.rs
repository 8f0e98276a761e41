//! Hostile inputs found in review: each is refused with an error or handled
//! within bounded memory, never a panic or a blow-up.

use std::sync::Arc;

use arrow::array::{ArrayRef, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use mira_core::block::{Block, BlockError, BlockMeta, BlockWriter, Codec, Level, VerifyCache};
use mira_core::convert::{LogsBuilder, PointsBuilder, SignalBuilder, points_to_otlp};
use mira_core::scan::compile_regex;
use mira_core::{BlockId, Signal, TenantId};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::metrics::v1::{Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric};

/// One metric with 1 MiB of metadata and a long description over 20,000
/// empty points: stored once, not once per point.
#[test]
fn large_metric_fields_are_stored_once_per_metric() {
    let big = "x".repeat(1 << 20);
    let metric = Metric {
        name: "m".into(),
        description: big.clone(),
        unit: "1".into(),
        metadata: vec![KeyValue {
            key: "k".into(),
            value: Some(AnyValue {
                value: Some(Value::StringValue(big)),
            }),
            key_strindex: 0,
        }],
        data: Some(metric::Data::Gauge(Gauge {
            data_points: vec![NumberDataPoint::default(); 20_000],
        })),
    };
    let req = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![metric],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let mut b = PointsBuilder::default();
    assert_eq!(b.append(&req).expect("append"), 20_000);
    assert!(
        b.approx_bytes() < 8 << 20,
        "held {} bytes for 2 MiB of distinct data",
        b.approx_bytes()
    );
    let tables = b.finish().expect("finish");
    assert!(tables.get("points").expect("points").get_array_memory_size() < 8 << 20);
    // The metric comes back once, holding every point (flattening would
    // copy the 2 MiB metric per point).
    let back = points_to_otlp(&tables).expect("otlp");
    let metrics = &back.resource_metrics[0].scope_metrics[0].metrics;
    assert_eq!(metrics.len(), 1);
    let original = &req.resource_metrics[0].scope_metrics[0].metrics[0];
    assert_eq!(metrics[0], *original);
}

/// A Parquet section of a few kilobytes that decodes to ~72 MB is refused
/// by the section's decode budget.
#[test]
fn a_decompression_bomb_section_is_refused() {
    let rows = 9_000_000;
    let col: ArrayRef = Arc::new(UInt64Array::from(vec![0u64; rows]));
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("z", DataType::UInt64, false)])),
        vec![col],
    )
    .expect("batch");
    let bytes = mira_core::cold::encode_parquet(&batch).expect("parquet");
    assert!(bytes.len() < 200_000, "the bomb is {} bytes", bytes.len());
    let meta = BlockMeta {
        block_id: BlockId::new(),
        tenant: TenantId::default_tenant(),
        signal: Signal::Logs,
        min_time: 0,
        max_time: 0,
        rows: rows as u64,
        schema_version: 1,
        level: Level::Cold,
    };
    let mut w = BlockWriter::new(meta);
    w.add_bytes("logs", Codec::Parquet, rows as u64, &bytes).expect("add");
    let block = Block::from_bytes(w.finish().expect("finish"), Arc::new(VerifyCache::new(4))).expect("open");
    match block.read_batches("logs") {
        Err(BlockError::DecodedTooLarge { limit, .. }) => assert!(limit < 72_000_000),
        other => panic!("bomb decoded: {:?}", other.map(|b| b.len())),
    }
}

#[test]
fn a_regex_cannot_escape_its_anchors() {
    assert!(compile_regex("a)|(b", true).is_err());
    assert!(compile_regex("x)|.*|(?:y", true).is_err());
    let r = compile_regex("a|b", true).expect("regex");
    assert!(r.is_match("a") && !r.is_match("ab"));
}

/// Builds the protobuf bytes of a logs request holding one record with the
/// given encoded body `AnyValue`.
fn request_with_body(any: &[u8]) -> Vec<u8> {
    fn field(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag, body.len() as u8];
        v.extend_from_slice(body);
        v
    }
    let record = field(0x2a, any); // LogRecord.body
    let scope = field(0x12, &record); // ScopeLogs.log_records
    let resource = field(0x12, &scope); // ResourceLogs.scope_logs
    field(0x0a, &resource) // request.resource_logs
}

#[test]
fn a_non_canonical_string_body_is_stored_as_a_string() {
    // AnyValue{string "x"} then AnyValue{string "y"}: protobuf keeps "y".
    let bytes = request_with_body(&[0x0a, 0x01, b'x', 0x0a, 0x01, b'y']);
    let mut fast = LogsBuilder::default();
    fast.append_encoded(&bytes).expect("append");
    let t = fast.finish().expect("finish");
    let body = t
        .get("logs")
        .expect("logs")
        .column_by_name("body")
        .expect("body")
        .clone();
    let body = body
        .as_any()
        .downcast_ref::<arrow::array::StringArray>()
        .expect("strings");
    assert_eq!(body.value(0), "y");
}

#[test]
fn an_overlong_varint_is_refused_like_prost_does() {
    // An unknown varint field (number 2) whose tenth byte carries more than
    // the 64th bit.
    let mut bytes = vec![0x10];
    bytes.extend_from_slice(&[0xff; 9]);
    bytes.push(0x02);
    assert!(LogsBuilder::default().append_encoded(&bytes).is_err());
}
