//! Prometheus remote write and Loki push bodies, through the ingester's own
//! readers (`prom::Parsed`, `loki::Parsed`) and writers, then the shard's
//! append (`AnyBuilder::append`) of the OTLP request they write.
//!
//! Input: the first byte picks the case (`sel % 5`): remote write 1.0,
//! remote write 2.0, Loki protobuf, Loki JSON, or the body snappy-decoded
//! first (`push::unsnappy`, 1 MiB limit) and read as remote write 1.0; the
//! rest is the body.
//!
//! Checked beyond "no panic":
//! - what a reader accepts is written as OTLP that prost decodes and the
//!   shard appends, with as many points / records as the reader says it
//!   wrote;
//! - the census the receivers reserve memory by is at least the size of
//!   the OTLP request written.

#![no_main]

#[path = "../common/seeds.rs"]
mod seeds;

use libfuzzer_sys::fuzz_target;
use mira_core::Signal;
use mira_core::convert::{Limits, TimeWindow};
use mira_ingester::shard::AnyBuilder;
use mira_ingester::{loki, prom, push};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use prost::Message;

const WINDOW: TimeWindow = TimeWindow {
    min_ns: 1_700_000_000_000_000_000,
    max_ns: 1_800_000_000_000_000_000,
};

fn points(req: &ExportMetricsServiceRequest) -> u64 {
    let mut n = 0;
    for m in req.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics) {
        n += match &m.data {
            Some(Data::Gauge(g)) => g.data_points.iter().filter(|p| p.flags & 1 == 0).count(),
            Some(Data::Sum(s)) => s.data_points.iter().filter(|p| p.flags & 1 == 0).count(),
            Some(Data::Histogram(h)) => h.data_points.len(),
            Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
            _ => 0,
        } as u64;
    }
    n
}

fn metrics(version: prom::Version, body: &[u8]) {
    let Ok(mut parsed) = prom::Parsed::read(version, body) else {
        return;
    };
    let census = parsed.census();
    let (otlp, written) = parsed.write(WINDOW);
    assert!(census.bytes >= otlp.len() as u64, "census {} < written {}", census.bytes, otlp.len());
    let req = ExportMetricsServiceRequest::decode(otlp.as_slice()).expect("the OTLP written decodes");
    assert_eq!(points(&req), written.samples + written.histograms, "points written");
    let mut shard = AnyBuilder::new(Signal::Metrics);
    shard
        .append(&otlp, &Limits::default())
        .expect("the shard appends the OTLP written");
}

fn logs(json: bool, body: &[u8]) {
    let parsed = if json {
        loki::Parsed::json(body)
    } else {
        loki::Parsed::protobuf(body)
    };
    let Ok(mut parsed) = parsed else {
        return;
    };
    let census = parsed.census();
    let (otlp, written) = parsed.write(WINDOW);
    assert!(census.bytes >= otlp.len() as u64, "census {} < written {}", census.bytes, otlp.len());
    let req = ExportLogsServiceRequest::decode(otlp.as_slice()).expect("the OTLP written decodes");
    let records: usize = req
        .resource_logs
        .iter()
        .flat_map(|r| &r.scope_logs)
        .map(|s| s.log_records.len())
        .sum();
    assert_eq!(records as u64, written, "records written");
    let mut shard = AnyBuilder::new(Signal::Logs);
    shard.append(&otlp, &Limits::default()).expect("the shard appends the OTLP written");
}

fn make_seeds() -> Vec<(String, Vec<u8>)> {
    // A remote write 1.0 request: one series, one sample, one label.
    let mut rw = Vec::new();
    let mut series = Vec::new();
    let label = |k: &str, v: &str| {
        let mut l = Vec::new();
        prost::encoding::string::encode(1, &k.to_owned(), &mut l);
        prost::encoding::string::encode(2, &v.to_owned(), &mut l);
        l
    };
    prost::encoding::bytes::encode(1, &label("__name__", "up"), &mut series);
    prost::encoding::bytes::encode(1, &label("job", "a"), &mut series);
    let mut sample = Vec::new();
    prost::encoding::double::encode(1, &1.0, &mut sample);
    prost::encoding::int64::encode(2, &1_750_000_000_000, &mut sample);
    prost::encoding::bytes::encode(2, &sample, &mut series);
    prost::encoding::bytes::encode(1, &series, &mut rw);
    // Loki protobuf: one stream, one entry with metadata.
    let mut stream = Vec::new();
    prost::encoding::string::encode(1, &"{app=\"x\", level=\"info\"}".to_owned(), &mut stream);
    let mut entry = Vec::new();
    let mut ts = Vec::new();
    prost::encoding::int64::encode(1, &1_750_000_000, &mut ts);
    prost::encoding::bytes::encode(1, &ts, &mut entry);
    prost::encoding::string::encode(2, &"a line".to_owned(), &mut entry);
    prost::encoding::bytes::encode(3, &label("user", "u1"), &mut entry);
    prost::encoding::bytes::encode(2, &entry, &mut stream);
    let mut lp = Vec::new();
    prost::encoding::bytes::encode(1, &stream, &mut lp);
    let json = br#"{"streams":[{"stream":{"app":"x"},"values":[["1750000000000000000","line",{"k":"v"}]]}]}"#;
    let snappy = snap::raw::Encoder::new().compress_vec(&rw).expect("compresses");
    vec![
        ("rw1".into(), seeds::with_selector(0, &rw)),
        ("loki-pb".into(), seeds::with_selector(2, &lp)),
        ("loki-json".into(), seeds::with_selector(3, json)),
        ("rw1-snappy".into(), seeds::with_selector(4, &snappy)),
    ]
}

fuzz_target!(init: seeds::write_if_asked(make_seeds), |data: &[u8]| {
    let [sel, body @ ..] = data else {
        return;
    };
    match sel % 5 {
        0 => metrics(prom::Version::V1, body),
        1 => metrics(prom::Version::V2, body),
        2 => logs(false, body),
        3 => logs(true, body),
        _ => {
            if let Ok(raw) = push::unsnappy(body, 1 << 20) {
                metrics(prom::Version::V1, &raw);
            }
        }
    }
});
