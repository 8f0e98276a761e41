//! Small OTLP exports written by hand for tests that name each record
//! (the [`corpus`](crate::corpus) generates realistic ones in bulk).

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

/// An OTLP/protobuf log export: one record per `(n, body)`, at
/// [`recent_base_time`](crate::recent_base_time) + `n` ns with string body
/// `body`, under one resource with the string attributes `resource` (none
/// when empty) and one scope.
pub fn log_export(resource: &[(&str, &str)], records: impl IntoIterator<Item = (u64, String)>) -> Vec<u8> {
    let log_records = records
        .into_iter()
        .map(|(n, body)| LogRecord {
            time_unix_nano: crate::recent_base_time() + n,
            body: Some(string(body)),
            ..Default::default()
        })
        .collect();
    let resource = (!resource.is_empty()).then(|| Resource {
        attributes: resource
            .iter()
            .map(|(k, v)| KeyValue {
                key: (*k).into(),
                value: Some(string((*v).into())),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource,
            scope_logs: vec![ScopeLogs {
                log_records,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn string(s: String) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(s)),
    }
}
