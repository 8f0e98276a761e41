//! Decodes arbitrary bytes as each OTLP export request and, when they
//! decode, appends them to a block's tables and converts back: no panic,
//! and whatever was accepted comes back equal (up to grouping order).
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
    if let Ok(req) = ExportLogsServiceRequest::decode(data) {
        let mut b = LogsBuilder::default();
        if b.append(&req).is_ok() {
            let back = logs_to_otlp(&b.finish().expect("finish")).expect("to otlp");
            assert_eq!(flatten::logs(&back), flatten::logs(&req));
        }
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
