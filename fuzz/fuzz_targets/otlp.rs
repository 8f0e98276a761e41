//! OTLP export request bodies, through the ingester's own entry points:
//! the HTTP body's `Content-Encoding` (`decode_body`, with the default
//! size limits), OTLP JSON (`json_to_protobuf`), then the shard's append
//! (`AnyBuilder::append`, with the default attribute limits and a time
//! window) into Arrow tables.
//!
//! Input: the first byte picks the case (`sel % 36`): signal = `sel % 3`
//! (logs, traces, metrics), JSON = `(sel / 3) % 2`, encoding =
//! `(sel / 6) % 3` (identity, gzip, zstd), time window = `(sel / 18) % 2`;
//! the rest is the body.
//!
//! Checked beyond "no panic":
//! - a replay (what the WAL keeps, `Appended::kept` or the request, with
//!   the same attribute limits and no window) builds exactly the tables
//!   the append built;
//! - the logs wire reader builds the same tables as prost + the generic
//!   limit code, with and without limits, and accepts exactly what prost
//!   accepts;
//! - without limits, what was accepted converts back to an equal request
//!   (up to grouping).

#![no_main]

#[path = "../common/seeds.rs"]
mod seeds;

use std::io::Write;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use mira_core::Signal;
use mira_core::convert::{
    Limits, LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, TableSet, TimeWindow, logs_to_otlp,
    points_to_otlp, spans_to_otlp,
};
use mira_ingester::body::{Encoding, decode_body};
use mira_ingester::otlp::json_to_protobuf;
use mira_ingester::shard::AnyBuilder;
use mira_testkit::corpus::{Cardinality, Corpus};
use mira_testkit::flatten;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

/// 2023-11-14 .. 2027-01-15 (ns): seeds' times fall inside, mutated ones
/// often do not.
const WINDOW: TimeWindow = TimeWindow {
    min_ns: 1_700_000_000_000_000_000,
    max_ns: 1_800_000_000_000_000_000,
};

fn same_tables(a: &TableSet, b: &TableSet, what: &str) {
    assert_eq!(a.rows, b.rows, "{what}: row counts differ");
    assert_eq!(a.tables.len(), b.tables.len(), "{what}: table counts differ");
    for ((na, ta), (nb, tb)) in a.tables.iter().zip(&b.tables) {
        assert!(na == nb && ta == tb, "{what}: {na} tables differ");
    }
}

/// The logs wire reader against prost and the generic limit code.
fn logs_reader_agrees(buf: &[u8], limits: &Limits) {
    let mut wire = LogsBuilder::default();
    let wire_out = wire.append_limited(buf, limits);
    let reference = ExportLogsServiceRequest::decode(buf).map(|mut req| {
        let mut b = LogsBuilder::default();
        let out = <LogsBuilder as SignalBuilder>::apply_limits(limits, &mut req);
        (b.append(&req).map(|rows| (rows, out)), b, req)
    });
    let reference_ok = matches!(&reference, Ok((Ok(_), _, _)));
    assert_eq!(
        wire_out.is_ok(),
        reference_ok,
        "wire reader and prost disagree on acceptance"
    );
    if let (Ok(w), Ok((Ok((rows, r)), mut b, req))) = (wire_out, reference) {
        assert_eq!(w.rows, rows, "wire reader and prost appended different row counts");
        assert_eq!(
            (w.dropped_attrs, w.truncated_values, w.too_old, w.too_new),
            (r.dropped_attrs, r.truncated_values, r.too_old, r.too_new),
            "wire reader and prost applied the limits differently"
        );
        let (a, b) = match (wire.finish(), b.finish()) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => panic!("finish failed: {:?} {:?}", a.err(), b.err()),
        };
        same_tables(&a, &b, "wire reader vs prost");
        if limits.is_none() {
            let back = logs_to_otlp(&b).expect("accepted logs convert back");
            assert_eq!(flatten::logs(&back), flatten::logs(&req));
        }
    }
}

/// Traces and metrics accepted without limits come back equal.
fn round_trip(signal: Signal, buf: &[u8]) {
    match signal {
        Signal::Logs => {}
        Signal::Traces => {
            if let Ok(req) = ExportTraceServiceRequest::decode(buf) {
                let mut b = SpansBuilder::default();
                if b.append(&req).is_ok() {
                    let back = spans_to_otlp(&b.finish().expect("finish")).expect("accepted spans convert back");
                    assert_eq!(flatten::traces(&back), flatten::traces(&req));
                }
            }
        }
        Signal::Metrics => {
            if let Ok(req) = ExportMetricsServiceRequest::decode(buf) {
                let mut b = PointsBuilder::default();
                if b.append(&req).is_ok() {
                    let back = points_to_otlp(&b.finish().expect("finish")).expect("accepted points convert back");
                    assert_eq!(flatten::metrics(&back), flatten::metrics(&req));
                }
            }
        }
    }
}

/// Small requests of each signal from the test corpus, as protobuf and
/// JSON, plain, gzip and zstd; with and without the time window.
fn make_seeds() -> Vec<(String, Vec<u8>)> {
    let mut c = Corpus::new(11, Cardinality::High);
    let bodies: [(u8, &str, Vec<u8>, Vec<u8>); 3] = {
        let (l, t, m) = (c.logs(6), c.traces(6), c.metrics(6));
        [
            (
                0,
                "logs",
                l.encode_to_vec(),
                serde_json::to_vec(&l).expect("logs as JSON"),
            ),
            (
                1,
                "traces",
                t.encode_to_vec(),
                serde_json::to_vec(&t).expect("traces as JSON"),
            ),
            (
                2,
                "metrics",
                m.encode_to_vec(),
                serde_json::to_vec(&m).expect("metrics as JSON"),
            ),
        ]
    };
    let gzip = |b: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(b).expect("gzip");
        e.finish().expect("gzip")
    };
    let zstd = |b: &[u8]| zstd::encode_all(b, 3).expect("zstd");
    let mut out = Vec::new();
    for (signal, name, pb, json) in &bodies {
        out.push((format!("{name}-pb"), seeds::with_selector(*signal, pb)));
        out.push((format!("{name}-json"), seeds::with_selector(3 + signal, json)));
        out.push((format!("{name}-pb-window"), seeds::with_selector(18 + signal, pb)));
    }
    let (_, _, pb, json) = &bodies[0];
    out.push(("logs-pb-gzip".into(), seeds::with_selector(6, &gzip(pb))));
    out.push(("logs-json-zstd".into(), seeds::with_selector(12 + 3, &zstd(json))));
    out
}

fuzz_target!(
    init: seeds::write_if_asked(make_seeds),
    |data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let sel = sel % 36;
    let signal = [Signal::Logs, Signal::Traces, Signal::Metrics][usize::from(sel % 3)];
    let json = (sel / 3) % 2 == 1;
    let encoding = [Encoding::Identity, Encoding::Gzip, Encoding::Zstd][usize::from((sel / 6) % 3)];
    let windowed = (sel / 18) % 2 == 1;

    let settings = mira_ingester::Settings::default();
    let max_wire = settings.max_message_size.as_usize();
    let Ok(body) = decode_body(Bytes::copy_from_slice(body), encoding, max_wire, max_wire) else {
        return;
    };
    let buf = if json {
        match json_to_protobuf(signal, &body) {
            Ok(b) => b,
            Err(_) => return,
        }
    } else {
        body
    };

    // The shard's append, then the replay of what the WAL would keep.
    let attrs = Limits {
        max_attrs: settings.max_attributes,
        max_value_bytes: settings.max_attribute_value_size.as_usize(),
        window: None,
    };
    let limits = Limits {
        window: windowed.then_some(WINDOW),
        ..attrs
    };
    let mut shard = AnyBuilder::new(signal);
    if let Ok(appended) = shard.append(&buf, &limits) {
        let logged = appended.kept.clone().unwrap_or_else(|| buf.to_vec());
        let mut replay = AnyBuilder::new(signal);
        let replayed = replay.append(&logged, &attrs).expect("the WAL's copy of an accepted request replays");
        assert_eq!(replayed.rows, appended.rows, "a replay appended a different row count");
        let (a, b) = match (shard.finish(), replay.finish()) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => panic!("finish failed: {:?} {:?}", a.err(), b.err()),
        };
        same_tables(&a, &b, "append vs replay");
    }

    if signal == Signal::Logs {
        logs_reader_agrees(&buf, &limits);
        logs_reader_agrees(&buf, &Limits::NONE);
    }
    round_trip(signal, &buf);
    }
);
