//! Decodes arbitrary bytes as each OTLP export request and, when they
//! decode, appends them to a block's tables and converts back: no panic,
//! and whatever was accepted comes back equal (up to grouping order). For
//! logs the bytes also go through the wire reader (`append_encoded`), which
//! must accept exactly what prost accepts and build the same tables.
//!
//! Run with `cargo fuzz run otlp_decode` from the repository root.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mira_core::convert::{LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, logs_to_otlp, points_to_otlp, spans_to_otlp};
use mira_testkit::flatten;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let mut wire = LogsBuilder::default();
    let wire_ok = wire.append_encoded(data).is_ok();
    let mut reference = LogsBuilder::default();
    let reference_ok = ExportLogsServiceRequest::decode(data).map(|req| (reference.append(&req).is_ok(), req));
    assert_eq!(wire_ok, matches!(reference_ok, Ok((true, _))), "wire reader and prost disagree on acceptance");
    if let Ok((true, req)) = reference_ok {
        let (a, b) = (wire.finish().expect("finish"), reference.finish().expect("finish"));
        assert_eq!(a.tables.len(), b.tables.len());
        for ((na, ta), (nb, tb)) in a.tables.iter().zip(&b.tables) {
            assert!(na == nb && ta == tb, "wire reader and prost built different {na} tables");
        }
        let back = logs_to_otlp(&b).expect("to otlp");
        assert_eq!(flatten::logs(&back), flatten::logs(&req));
    }
    if let Ok(req) = ExportTraceServiceRequest::decode(data) {
        let mut b = SpansBuilder::default();
        if b.append(&req).is_ok() {
            let back = spans_to_otlp(&b.finish().expect("finish")).expect("to otlp");
            assert_eq!(flatten::traces(&back), flatten::traces(&req));
        }
    }
    if let Ok(req) = ExportMetricsServiceRequest::decode(data) {
        let mut b = PointsBuilder::default();
        if b.append(&req).is_ok() {
            let back = points_to_otlp(&b.finish().expect("finish")).expect("to otlp");
            assert_eq!(flatten::metrics(&back), flatten::metrics(&req));
        }
    }
});
