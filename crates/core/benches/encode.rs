//! Decode + append throughput per core (records/s), with append and seal
//! priced separately, for logs, spans and data points.
//!
//! `cargo bench -p mira-core --bench encode`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mira_core::convert::{
    ConvertError, Limits, LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, TableSet, points_by_series,
};
use mira_core::{BlockId, TenantId, tables};
use mira_testkit::corpus::{Cardinality, Corpus};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

/// Records per export request, as the Collector's batch processor sends.
const BATCH: usize = 8192;
/// Requests per measured iteration.
const REQUESTS: usize = 8;

fn encoded<T: Message>(mut make: impl FnMut() -> T) -> Vec<Vec<u8>> {
    (0..REQUESTS).map(|_| make().encode_to_vec()).collect()
}

fn bench_append<B: SignalBuilder>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    signal: &str,
    corpus: &str,
    reqs: &[Vec<u8>],
) {
    g.bench_with_input(BenchmarkId::new(signal, corpus), reqs, |b, reqs| {
        b.iter(|| {
            let mut builder = B::default();
            for r in reqs {
                builder.append_encoded(r).expect("append");
            }
            black_box(builder.rows())
        })
    });
}

/// The reference path: prost decode, then append.
fn bench_prost<B: SignalBuilder>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    signal: &str,
    corpus: &str,
    reqs: &[Vec<u8>],
) {
    g.bench_with_input(BenchmarkId::new(format!("{signal}_prost"), corpus), reqs, |b, reqs| {
        b.iter(|| {
            let mut builder = B::default();
            for r in reqs {
                let req = <B::Request as Message>::decode(r.as_slice()).expect("decode");
                builder.append(&req).expect("append");
            }
            black_box(builder.rows())
        })
    });
}

/// prost decode alone, the baseline the other rows are read against.
fn bench_decode_only<T: Message + Default>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    signal: &str,
    corpus: &str,
    reqs: &[Vec<u8>],
) {
    g.bench_with_input(
        BenchmarkId::new(format!("{signal}_decode_only"), corpus),
        reqs,
        |b, reqs| {
            b.iter(|| {
                let mut n = 0;
                for r in reqs {
                    let req = T::decode(r.as_slice()).expect("decode");
                    black_box(&req);
                    n += 1;
                }
                black_box(n)
            })
        },
    );
}

/// Finishing a builder holding `reqs`, `then`, and writing the hot block.
fn bench_seal<B: SignalBuilder>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    reqs: &[B::Request],
    then: fn(TableSet) -> Result<TableSet, ConvertError>,
) {
    g.bench_function(name, |b| {
        b.iter_batched(
            || {
                let mut builder = B::default();
                for r in reqs {
                    builder.append(r).expect("append");
                }
                builder
            },
            |mut builder| {
                let t = then(builder.finish().expect("finish")).expect("then");
                black_box(
                    tables::write_hot(&t, BlockId::new(), TenantId::default_tenant())
                        .expect("write")
                        .len(),
                )
            },
            criterion::BatchSize::LargeInput,
        )
    });
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_append");
    g.throughput(Throughput::Elements((BATCH * REQUESTS) as u64));
    g.sample_size(20);
    for card in [Cardinality::Low, Cardinality::High] {
        let name = format!("{card:?}").to_lowercase();
        let mut corpus = Corpus::new(1, card);
        let logs = encoded(|| corpus.logs(BATCH));
        let spans = encoded(|| corpus.traces(BATCH));
        let points = encoded(|| corpus.metrics(BATCH));
        // What the ingester runs: the encoded body straight into the builders
        // (the wire readers).
        bench_append::<LogsBuilder>(&mut g, "logs", &name, &logs);
        bench_append::<SpansBuilder>(&mut g, "spans", &name, &spans);
        bench_append::<PointsBuilder>(&mut g, "points", &name, &points);
        // The same with the ingester's default attribute limits (128
        // attributes, 64 KiB values), which the corpus never exceeds: the
        // price of checking them, against `logs` above.
        g.bench_with_input(BenchmarkId::new("logs_limited", &name), &logs, |b, reqs| {
            let limits = Limits {
                max_attrs: 128,
                max_value_bytes: 64 << 10,
                window: None,
            };
            b.iter(|| {
                let mut builder = LogsBuilder::default();
                for r in reqs {
                    builder.append_limited(r, &limits).expect("append");
                }
                black_box(builder.rows())
            })
        });
        // The reference paths: prost decode, then append.
        bench_prost::<LogsBuilder>(&mut g, "logs", &name, &logs);
        bench_prost::<SpansBuilder>(&mut g, "spans", &name, &spans);
        bench_prost::<PointsBuilder>(&mut g, "points", &name, &points);
        // Decode alone: the baselines the append cost is read against.
        bench_decode_only::<ExportLogsServiceRequest>(&mut g, "logs", &name, &logs);
        bench_decode_only::<ExportTraceServiceRequest>(&mut g, "spans", &name, &spans);
        bench_decode_only::<ExportMetricsServiceRequest>(&mut g, "points", &name, &points);
    }
    g.finish();

    let mut g = c.benchmark_group("seal");
    g.throughput(Throughput::Elements((BATCH * REQUESTS) as u64));
    g.sample_size(10);
    let mut corpus = Corpus::new(1, Cardinality::Low);
    let logs: Vec<_> = (0..REQUESTS).map(|_| corpus.logs(BATCH)).collect();
    bench_seal::<LogsBuilder>(&mut g, "logs_finish_and_write_hot", &logs, Ok);
    // A metrics block as the ingester seals it (points ordered by series)
    // against the builder's arrival order: the price of the ordering.
    let points: Vec<_> = (0..REQUESTS).map(|_| corpus.metrics(BATCH)).collect();
    bench_seal::<PointsBuilder>(&mut g, "points_finish_and_write_hot", &points, Ok);
    bench_seal::<PointsBuilder>(
        &mut g,
        "points_by_series_finish_and_write_hot",
        &points,
        points_by_series,
    );
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
