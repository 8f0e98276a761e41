//! Decode + append throughput per core (records/s), with append and seal
//! priced separately, for logs, spans and data points.
//!
//! `cargo bench -p mira-core --bench encode`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mira_core::convert::{Limits, LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder};
use mira_core::{BlockId, TenantId, tables};
use mira_testkit::corpus::{Cardinality, Corpus};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
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
        // (the wire reader for logs, prost for the others).
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
        // The reference path for logs: prost decode, then append.
        g.bench_with_input(BenchmarkId::new("logs_prost", &name), &logs, |b, reqs| {
            b.iter(|| {
                let mut builder = LogsBuilder::default();
                for r in reqs {
                    let req = ExportLogsServiceRequest::decode(r.as_slice()).expect("decode");
                    builder.append(&req).expect("append");
                }
                black_box(builder.rows())
            })
        });
        // Decode alone: the baseline the append cost is read against.
        g.bench_with_input(BenchmarkId::new("logs_decode_only", &name), &logs, |b, reqs| {
            b.iter(|| {
                let mut n = 0;
                for r in reqs {
                    n += ExportLogsServiceRequest::decode(r.as_slice())
                        .expect("decode")
                        .resource_logs
                        .len();
                }
                black_box(n)
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("seal");
    g.throughput(Throughput::Elements((BATCH * REQUESTS) as u64));
    g.sample_size(10);
    let mut corpus = Corpus::new(1, Cardinality::Low);
    let reqs: Vec<_> = (0..REQUESTS).map(|_| corpus.logs(BATCH)).collect();
    g.bench_function("logs_finish_and_write_hot", |b| {
        b.iter_batched(
            || {
                let mut builder = LogsBuilder::default();
                for r in &reqs {
                    builder.append(r).expect("append");
                }
                builder
            },
            |mut builder| {
                let t = builder.finish().expect("finish");
                black_box(
                    tables::write_hot(&t, BlockId::new(), TenantId::default_tenant())
                        .expect("write")
                        .len(),
                )
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
