//! Log records ↔ the `logs` table.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, BinaryBuilder, FixedSizeBinaryArray, FixedSizeBinaryBuilder, Int32Array, StringArray,
    StringBuilder, UInt32Array, UInt64Array,
};
use arrow::record_batch::RecordBatch;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value::Value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use prost::Message;

use super::columns::{DictStr, append_id, check_id, col, id_bytes};
use super::context::{ContextBuilder, Contexts, Grouper};
use super::wire::{self, Fast};
use super::{Appended, ConvertError, Limits, SignalBuilder, TableSet, TimeRange};
use crate::attrs::{AttrBuilder, AttrReader};
use crate::dict::DictBuilder;
use crate::ids::Signal;
use crate::schema;

/// Loki's stream labels of OTLP logs: (Loki label, OTel resource
/// attribute), the way Loki 3 maps OTLP (the querier's label model; the
/// ingester's Loki push maps stream labels back through it).
pub const LOKI_INDEX: [(&str, &str); 18] = [
    ("service_name", "service.name"),
    ("service_namespace", "service.namespace"),
    ("service_instance_id", "service.instance.id"),
    ("deployment_environment", "deployment.environment"),
    ("deployment_environment_name", "deployment.environment.name"),
    ("cloud_region", "cloud.region"),
    ("cloud_availability_zone", "cloud.availability_zone"),
    ("container_name", "container.name"),
    ("k8s_cluster_name", "k8s.cluster.name"),
    ("k8s_namespace_name", "k8s.namespace.name"),
    ("k8s_pod_name", "k8s.pod.name"),
    ("k8s_container_name", "k8s.container.name"),
    ("k8s_deployment_name", "k8s.deployment.name"),
    ("k8s_statefulset_name", "k8s.statefulset.name"),
    ("k8s_daemonset_name", "k8s.daemonset.name"),
    ("k8s_replicaset_name", "k8s.replicaset.name"),
    ("k8s_job_name", "k8s.job.name"),
    ("k8s_cronjob_name", "k8s.cronjob.name"),
];

/// The time a log record is filed under: its event time, or the observed
/// time when the event time is unset (as the OTLP data model says).
pub fn effective_time(time: u64, observed: u64) -> u64 {
    if time != 0 { time } else { observed }
}

/// A log body as the row writer takes it.
#[derive(Clone, Copy)]
enum BodyRef<'a> {
    None,
    Str(&'a str),
    Other(&'a AnyValue),
}

/// One record's root columns, from either decode path.
struct Row<'a> {
    time: u64,
    observed: u64,
    severity: i32,
    severity_text: &'a str,
    body: BodyRef<'a>,
    trace_id: &'a [u8],
    span_id: &'a [u8],
    flags: u32,
    event_name: &'a str,
    dropped: u32,
}

/// Appends OTLP log requests to the tables of one open block.
pub struct LogsBuilder {
    ctx: ContextBuilder,
    time: Vec<u64>,
    observed: Vec<u64>,
    severity: Vec<i32>,
    severity_text: DictBuilder,
    body: StringBuilder,
    body_any: BinaryBuilder,
    trace_id: FixedSizeBinaryBuilder,
    span_id: FixedSizeBinaryBuilder,
    flags: Vec<u32>,
    event_name: DictBuilder,
    dropped: Vec<u32>,
    resource_id: Vec<u32>,
    scope_id: Vec<u32>,
    attrs: AttrBuilder,
    times: TimeRange,
}

impl Default for LogsBuilder {
    fn default() -> Self {
        LogsBuilder {
            ctx: ContextBuilder::default(),
            time: Vec::new(),
            observed: Vec::new(),
            severity: Vec::new(),
            severity_text: DictBuilder::default(),
            body: StringBuilder::new(),
            body_any: BinaryBuilder::new(),
            trace_id: FixedSizeBinaryBuilder::new(16),
            span_id: FixedSizeBinaryBuilder::new(8),
            flags: Vec::new(),
            event_name: DictBuilder::default(),
            dropped: Vec::new(),
            resource_id: Vec::new(),
            scope_id: Vec::new(),
            attrs: AttrBuilder::default(),
            times: TimeRange::default(),
        }
    }
}

/// Checks a request can be appended whole; run before appending anything so
/// a bad request is never half-applied.
pub fn validate(req: &ExportLogsServiceRequest) -> Result<usize, ConvertError> {
    let mut n = 0;
    for rl in &req.resource_logs {
        for sl in &rl.scope_logs {
            for r in &sl.log_records {
                check_id("trace_id", &r.trace_id, 16)?;
                check_id("span_id", &r.span_id, 8)?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// True when the limits change nothing in a parsed request.
fn view_fits(view: &wire::LogsView<'_>, limits: &Limits) -> bool {
    view.records.iter().all(|r| {
        limits.wire_attrs_fit(&view.attrs[r.attrs.clone()])
            && limits.time_fits(super::limits::log_time(r.time, r.observed))
    }) && view
        .resources
        .iter()
        .all(|r| r.resource.as_ref().is_none_or(|r| limits.fits(&r.attributes)))
        && view
            .scopes
            .iter()
            .all(|s| s.scope.as_ref().is_none_or(|s| limits.fits(&s.attributes)))
}

impl std::fmt::Debug for LogsBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogsBuilder")
            .field("rows", &self.time.len())
            .finish_non_exhaustive()
    }
}

impl SignalBuilder for LogsBuilder {
    type Request = ExportLogsServiceRequest;
    const SIGNAL: Signal = Signal::Logs;

    fn rows(&self) -> usize {
        self.time.len()
    }

    /// Approximate Arrow bytes held, for the seal-size target.
    fn approx_bytes(&self) -> usize {
        // Every variable-length buffer counts: the seal-size target is what
        // keeps each below the 2 GiB an Arrow offset can address.
        self.time.len() * 60
            + self.body.values_slice().len()
            + self.body_any.values_slice().len()
            + self.severity_text.value_bytes()
            + self.event_name.value_bytes()
            + self.attrs.approx_bytes()
            + self.ctx.approx_bytes()
    }

    /// Appends every record of `req`; returns the number appended. A request
    /// with an invalid id is refused whole.
    fn append(&mut self, req: &ExportLogsServiceRequest) -> Result<usize, ConvertError> {
        let n = validate(req)?;
        for rl in &req.resource_logs {
            let rid = self.ctx.resource(rl.resource.as_ref(), &rl.schema_url);
            for sl in &rl.scope_logs {
                let sid = self.ctx.scope(sl.scope.as_ref(), &sl.schema_url);
                for r in &sl.log_records {
                    self.append_record(rid, sid, r)?;
                }
            }
        }
        Ok(n)
    }

    /// Appends an encoded `ExportLogsServiceRequest` (the OTLP/gRPC and
    /// OTLP/HTTP protobuf body). Common shapes are read straight from the
    /// wire; anything else is decoded by prost first. Either way the request
    /// is checked whole before anything is appended.
    fn append_limited(&mut self, buf: &[u8], limits: &Limits) -> Result<Appended, ConvertError> {
        let view = match wire::parse_logs(buf) {
            Fast::Done(view) if limits.is_none() || view_fits(&view, limits) => view,
            _ => {
                // Unusual shapes, and requests the limits change, go
                // through prost.
                return super::limits::append_via_prost::<ExportLogsServiceRequest>(
                    buf,
                    |req| limits.apply_logs(req),
                    |req| self.append(req),
                );
            }
        };
        for r in &view.records {
            check_id("trace_id", r.trace_id, 16)?;
            check_id("span_id", r.span_id, 8)?;
        }
        for res in &view.resources {
            let rid = self.ctx.resource(res.resource.as_ref(), res.schema_url);
            for scope in &view.scopes[res.scopes.clone()] {
                let sid = self.ctx.scope(scope.scope.as_ref(), scope.schema_url);
                for r in &view.records[scope.records.clone()] {
                    let body = match &r.body {
                        wire::Body::None => BodyRef::None,
                        wire::Body::Str(s) => BodyRef::Str(s),
                        wire::Body::Other(v) => BodyRef::Other(v),
                    };
                    let row = self.push_row(
                        rid,
                        sid,
                        &Row {
                            time: r.time,
                            observed: r.observed,
                            severity: r.severity,
                            severity_text: r.severity_text,
                            body,
                            trace_id: r.trace_id,
                            span_id: r.span_id,
                            flags: r.flags,
                            event_name: r.event_name,
                            dropped: r.dropped,
                        },
                    )?;
                    for a in &view.attrs[r.attrs.clone()] {
                        self.attrs.append_val(row, a.key, &a.value);
                    }
                }
            }
        }
        Ok(Appended {
            rows: view.records.len(),
            ..Appended::default()
        })
    }

    fn apply_limits(limits: &Limits, req: &mut ExportLogsServiceRequest) -> Appended {
        limits.apply_logs(req)
    }

    /// Takes the accumulated rows as a block's tables and resets the builder.
    fn finish(&mut self) -> Result<TableSet, ConvertError> {
        let rows = self.time.len();
        let cols: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(std::mem::take(&mut self.time))),
            Arc::new(UInt64Array::from(std::mem::take(&mut self.observed))),
            Arc::new(Int32Array::from(std::mem::take(&mut self.severity))),
            self.severity_text.finish()?,
            Arc::new(self.body.finish()),
            Arc::new(self.body_any.finish()),
            Arc::new(self.trace_id.finish()),
            Arc::new(self.span_id.finish()),
            Arc::new(UInt32Array::from(std::mem::take(&mut self.flags))),
            self.event_name.finish()?,
            Arc::new(UInt32Array::from(std::mem::take(&mut self.dropped))),
            Arc::new(UInt32Array::from(std::mem::take(&mut self.resource_id))),
            Arc::new(UInt32Array::from(std::mem::take(&mut self.scope_id))),
        ];
        let mut tables = vec![(schema::LOGS, schema::batch(&schema::logs(), cols)?)];
        tables.push((schema::LOG_ATTRS, self.attrs.finish()?));
        self.ctx.finish(&mut tables)?;
        let (min_time, max_time) = std::mem::take(&mut self.times).bounds();
        Ok(TableSet {
            signal: Signal::Logs,
            tables,
            rows,
            min_time,
            max_time,
        })
    }
}

impl LogsBuilder {
    fn append_record(&mut self, rid: u32, sid: u32, r: &LogRecord) -> Result<(), ConvertError> {
        let body = match &r.body {
            Some(AnyValue {
                value: Some(Value::StringValue(s)),
            }) => BodyRef::Str(s),
            Some(other) => BodyRef::Other(other),
            None => BodyRef::None,
        };
        let row = self.push_row(
            rid,
            sid,
            &Row {
                time: r.time_unix_nano,
                observed: r.observed_time_unix_nano,
                severity: r.severity_number,
                severity_text: &r.severity_text,
                body,
                trace_id: &r.trace_id,
                span_id: &r.span_id,
                flags: r.flags,
                event_name: &r.event_name,
                dropped: r.dropped_attributes_count,
            },
        )?;
        self.attrs.append_all(row, &r.attributes);
        Ok(())
    }

    /// Appends one record's root columns; returns its row number. Ids must
    /// have been checked.
    fn push_row(&mut self, rid: u32, sid: u32, r: &Row<'_>) -> Result<u32, ConvertError> {
        let row = self.time.len() as u32;
        self.time.push(r.time);
        self.observed.push(r.observed);
        self.times.add(effective_time(r.time, r.observed));
        self.severity.push(r.severity);
        self.severity_text.append(r.severity_text);
        // A string body is a string body however it was encoded (the wire
        // reader hands non-canonical encodings to prost as `Other`).
        let body = match r.body {
            BodyRef::Other(AnyValue {
                value: Some(Value::StringValue(s)),
            }) => BodyRef::Str(s),
            other => other,
        };
        match body {
            BodyRef::Str(s) => {
                self.body.append_value(s);
                self.body_any.append_null();
            }
            BodyRef::Other(v) => {
                self.body.append_null();
                self.body_any.append_value(v.encode_to_vec());
            }
            BodyRef::None => {
                self.body.append_null();
                self.body_any.append_null();
            }
        }
        append_id(&mut self.trace_id, r.trace_id)?;
        append_id(&mut self.span_id, r.span_id)?;
        self.flags.push(r.flags);
        self.event_name.append(r.event_name);
        self.dropped.push(r.dropped);
        self.resource_id.push(rid);
        self.scope_id.push(sid);
        Ok(row)
    }
}

/// Typed view of the `logs` table.
#[derive(Debug)]
pub struct LogColumns<'a> {
    pub time: &'a UInt64Array,
    pub observed: &'a UInt64Array,
    pub severity: &'a Int32Array,
    pub severity_text: DictStr<'a>,
    pub body: &'a StringArray,
    pub body_any: &'a BinaryArray,
    pub trace_id: &'a FixedSizeBinaryArray,
    pub span_id: &'a FixedSizeBinaryArray,
    pub flags: &'a UInt32Array,
    pub event_name: DictStr<'a>,
    pub dropped: &'a UInt32Array,
    pub resource_id: &'a UInt32Array,
    pub scope_id: &'a UInt32Array,
}

impl<'a> LogColumns<'a> {
    pub fn new(b: &'a RecordBatch) -> Result<Self, ConvertError> {
        let t = schema::LOGS;
        Ok(LogColumns {
            time: col(b, t, "time_unix_nano")?,
            observed: col(b, t, "observed_time_unix_nano")?,
            severity: col(b, t, "severity_number")?,
            severity_text: DictStr::new(b, t, "severity_text")?,
            body: col(b, t, "body")?,
            body_any: col(b, t, "body_any")?,
            trace_id: col(b, t, "trace_id")?,
            span_id: col(b, t, "span_id")?,
            flags: col(b, t, "flags")?,
            event_name: DictStr::new(b, t, "event_name")?,
            dropped: col(b, t, "dropped_attributes_count")?,
            resource_id: col(b, t, "resource_id")?,
            scope_id: col(b, t, "scope_id")?,
        })
    }

    /// The record at `row` as OTLP, with the given attributes.
    pub fn record(
        &self,
        row: usize,
        attributes: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
    ) -> Result<LogRecord, ConvertError> {
        let body = if self.body.is_valid(row) {
            Some(AnyValue {
                value: Some(Value::StringValue(self.body.value(row).to_owned())),
            })
        } else if self.body_any.is_valid(row) {
            Some(
                AnyValue::decode(self.body_any.value(row)).map_err(|_| ConvertError::WrongType {
                    table: schema::LOGS,
                    column: "body_any",
                })?,
            )
        } else {
            None
        };
        Ok(LogRecord {
            time_unix_nano: self.time.value(row),
            observed_time_unix_nano: self.observed.value(row),
            severity_number: self.severity.value(row),
            severity_text: self.severity_text.get(row).unwrap_or("").to_owned(),
            body,
            attributes,
            dropped_attributes_count: self.dropped.value(row),
            flags: self.flags.value(row),
            trace_id: id_bytes(self.trace_id, row),
            span_id: id_bytes(self.span_id, row),
            event_name: self.event_name.get(row).unwrap_or("").to_owned(),
        })
    }
}

/// A block's log tables back as one OTLP request.
pub fn logs_to_otlp(tables: &TableSet) -> Result<ExportLogsServiceRequest, ConvertError> {
    logs_to_otlp_grouped(tables, Grouper::default())
}

/// A block's log tables back as one OTLP request whose records, read in
/// order, are the table's rows in order: a resource or scope that recurs
/// after another one is repeated rather than regrouped. Appending the
/// answer to a builder reproduces the rows in the same order (the merge
/// relies on it).
pub fn logs_to_otlp_in_row_order(tables: &TableSet) -> Result<ExportLogsServiceRequest, ConvertError> {
    logs_to_otlp_grouped(tables, Grouper::in_row_order())
}

fn logs_to_otlp_grouped(
    tables: &TableSet,
    mut groups: Grouper<LogRecord>,
) -> Result<ExportLogsServiceRequest, ConvertError> {
    let root = tables.get(schema::LOGS)?;
    let cols = LogColumns::new(root)?;
    let ctx = Contexts::read(tables)?;
    let mut attrs = AttrReader::new(tables.get(schema::LOG_ATTRS)?, schema::LOG_ATTRS)?
        .grouped(root.num_rows())?
        .into_iter();
    for row in 0..root.num_rows() {
        let record = cols.record(row, attrs.next().unwrap_or_default())?;
        groups.push(cols.resource_id.value(row), cols.scope_id.value(row), record);
    }
    let mut resource_logs = Vec::with_capacity(groups.groups.len());
    for (rid, scopes) in groups.groups {
        let (resource, schema_url) = ctx.resource(rid, 0, schema::LOGS)?.clone();
        let mut scope_logs = Vec::with_capacity(scopes.len());
        for (sid, log_records) in scopes {
            let (scope, schema_url) = ctx.scope(sid, 0, schema::LOGS)?.clone();
            scope_logs.push(ScopeLogs {
                scope,
                log_records,
                schema_url,
            });
        }
        resource_logs.push(ResourceLogs {
            resource,
            scope_logs,
            schema_url,
        });
    }
    Ok(ExportLogsServiceRequest { resource_logs })
}

/// One log record with the resource and scope it was sent under.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRow {
    pub resource: Option<opentelemetry_proto::tonic::resource::v1::Resource>,
    pub resource_schema_url: String,
    pub scope: Option<opentelemetry_proto::tonic::common::v1::InstrumentationScope>,
    pub scope_schema_url: String,
    pub record: LogRecord,
}

/// The records at `rows` of a block's log tables, in that order; only
/// their attributes are decoded.
pub fn log_rows(tables: &TableSet, rows: &[u32]) -> Result<Vec<LogRow>, ConvertError> {
    let root = tables.get(schema::LOGS)?;
    let n = root.num_rows();
    if let Some(&bad) = rows.iter().find(|&&r| r as usize >= n) {
        return Err(ConvertError::BadReference {
            table: schema::LOGS,
            row: bad as usize,
        });
    }
    let cols = LogColumns::new(root)?;
    let ctx = Contexts::read(tables)?;
    let mut attrs = AttrReader::new(tables.get(schema::LOG_ATTRS)?, schema::LOG_ATTRS)?.grouped_for(rows)?;
    let mut out = Vec::with_capacity(rows.len());
    for &r in rows {
        let row = r as usize;
        let record = cols.record(row, attrs.remove(&r).unwrap_or_default())?;
        let (resource, resource_schema_url) = ctx.resource(cols.resource_id.value(row), row, schema::LOGS)?.clone();
        let (scope, scope_schema_url) = ctx.scope(cols.scope_id.value(row), row, schema::LOGS)?.clone();
        out.push(LogRow {
            resource,
            resource_schema_url,
            scope,
            scope_schema_url,
            record,
        });
    }
    Ok(out)
}
