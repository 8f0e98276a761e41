//! Test support for merges: each row of a block as the record `flatten`
//! makes of it, and the Arrow merge held against the OTLP path.

use mira_core::Signal;
use mira_core::block::Block;
use mira_core::compact::{merge_on_arrow, merge_via_otlp};
use mira_core::convert::{TableSet, log_rows, points_to_otlp_in_row_order, spans_to_otlp_rows};
use mira_core::tables::read_tables;
use mira_testkit::flatten;
use proptest::prelude::*;

/// Each root row of a block as the encoded one-record request `flatten`
/// makes of it (record, resource and scope), in row order.
pub fn row_leaves(b: &Block) -> Vec<Vec<u8>> {
    let t = read_tables(b, None).expect("read");
    let n = b.meta().rows as u32;
    match b.meta().signal {
        Signal::Logs => log_rows(&t, &(0..n).collect::<Vec<_>>())
            .expect("rows")
            .into_iter()
            .map(|r| {
                use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
                use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};
                let one = ExportLogsServiceRequest {
                    resource_logs: vec![ResourceLogs {
                        resource: r.resource,
                        schema_url: r.resource_schema_url,
                        scope_logs: vec![ScopeLogs {
                            scope: r.scope,
                            schema_url: r.scope_schema_url,
                            log_records: vec![r.record],
                        }],
                    }],
                };
                flatten::logs(&one).remove(0)
            })
            .collect(),
        Signal::Traces => (0..n)
            .map(|k| flatten::traces(&spans_to_otlp_rows(&t, Some(&[k])).expect("span")).remove(0))
            .collect(),
        Signal::Metrics => {
            // Points in the order the in-row-order OTLP lists them; the
            // root columns below check that this is the table's order.
            use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
            let req = points_to_otlp_in_row_order(&t).expect("otlp");
            let mut out = Vec::new();
            for rm in &req.resource_metrics {
                for sm in &rm.scope_metrics {
                    for m in &sm.metrics {
                        let one = |m| ExportMetricsServiceRequest {
                            resource_metrics: vec![opentelemetry_proto::tonic::metrics::v1::ResourceMetrics {
                                scope_metrics: vec![opentelemetry_proto::tonic::metrics::v1::ScopeMetrics {
                                    metrics: vec![m],
                                    ..sm.clone()
                                }],
                                ..rm.clone()
                            }],
                        };
                        out.extend(flatten::metrics(&one(m.clone())));
                    }
                }
            }
            out
        }
    }
}

/// The Arrow merge gives table for table what the OTLP path gives: the
/// same rows in the same order, resources and scopes numbered alike,
/// dictionaries interned alike (same values, keys and key widths).
pub fn check_same_as_otlp(signal: Signal, inputs: &[TableSet]) -> Result<(), TestCaseError> {
    let arrow = merge_on_arrow(signal, inputs)
        .expect("arrow merge")
        .expect("the builders' layout is taken");
    let otlp = merge_via_otlp(signal, inputs).expect("otlp merge");
    prop_assert_eq!(arrow.rows, otlp.rows);
    prop_assert_eq!((arrow.min_time, arrow.max_time), (otlp.min_time, otlp.max_time));
    let names = |t: &TableSet| t.tables.iter().map(|(n, _)| *n).collect::<Vec<_>>();
    prop_assert_eq!(names(&arrow), names(&otlp));
    for ((name, a), (_, o)) in arrow.tables.iter().zip(&otlp.tables) {
        prop_assert_eq!(a.schema(), o.schema(), "{} schema", name);
        for (i, (x, y)) in a.columns().iter().zip(o.columns()).enumerate() {
            prop_assert_eq!(
                x.to_data(),
                y.to_data(),
                "{} column {}",
                name,
                a.schema().field(i).name()
            );
        }
    }
    Ok(())
}
