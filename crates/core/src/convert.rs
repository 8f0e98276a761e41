//! OTLP ↔ Arrow. Builders append decoded OTLP export requests to the Arrow
//! tables of an open block ([`LogsBuilder`], [`SpansBuilder`],
//! [`PointsBuilder`]); `*_to_otlp` turn a block's tables back into an equal
//! OTLP request (equal up to how records are grouped under resources and
//! scopes; `*_to_otlp_in_row_order` keep the rows' order instead). Every
//! OTLP field is kept.

use arrow::record_batch::RecordBatch;

use crate::ids::Signal;

pub mod columns;
pub(crate) mod context;
pub mod limits;
pub mod logs;
pub mod metrics;
pub mod traces;
pub(crate) mod wire;

pub(crate) use context::Grouper;
pub use limits::{Appended, Limits, TimeWindow, gate_series};
pub use logs::{LogRow, LogsBuilder, log_rows, logs_to_otlp, logs_to_otlp_in_row_order};
pub use metrics::{PointsBuilder, points_by_series, points_to_otlp, points_to_otlp_in_row_order};
pub use traces::{SpansBuilder, spans_to_otlp, spans_to_otlp_in_row_order, spans_to_otlp_rows};
pub use wire::{Reader as WireReader, utf8};

/// What went wrong converting between OTLP and Arrow. Errors on the OTLP
/// side are the sender's fault (400 / INVALID_ARGUMENT); errors on the Arrow
/// side mean a block's tables are not what this version writes.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{field} must be {expected} bytes or empty, got {len} bytes")]
    InvalidId {
        field: &'static str,
        expected: usize,
        len: usize,
    },
    #[error("malformed protobuf: {0}")]
    Protobuf(String),
    #[error("block has no {0} table")]
    MissingTable(&'static str),
    #[error("table {table} has no column {column}")]
    MissingColumn { table: &'static str, column: &'static str },
    #[error("table {table} column {column} has an unexpected type or value")]
    WrongType { table: &'static str, column: &'static str },
    #[error("table {table} row {row} refers to a row that does not exist")]
    BadReference { table: &'static str, row: usize },
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

/// What every signal's builder does, so callers (an ingester's shards, the
/// benchmarks) can be generic over the signal.
pub trait SignalBuilder: Default + Send + std::fmt::Debug {
    /// The OTLP export request this builder takes.
    type Request: prost::Message + Default;
    const SIGNAL: Signal;

    /// Root rows appended so far.
    fn rows(&self) -> usize;

    /// Approximate Arrow bytes held, for the seal-size target.
    fn approx_bytes(&self) -> usize;

    /// Appends every record of `req`; returns how many. A request that
    /// cannot be appended whole (an id of the wrong length) is refused
    /// whole.
    fn append(&mut self, req: &Self::Request) -> Result<usize, ConvertError>;

    /// Applies `limits` to a decoded request (see [`limits`]); `rows` of
    /// the answer is left 0.
    fn apply_limits(limits: &Limits, req: &mut Self::Request) -> Appended;

    /// Appends an encoded request (an OTLP protobuf body) under `limits`.
    fn append_limited(&mut self, buf: &[u8], limits: &Limits) -> Result<Appended, ConvertError> {
        let mut req =
            <Self::Request as prost::Message>::decode(buf).map_err(|e| ConvertError::Protobuf(e.to_string()))?;
        let mut out = Self::apply_limits(limits, &mut req);
        out.rows = self.append(&req)?;
        if out.too_old + out.too_new > 0 {
            out.kept = Some(prost::Message::encode_to_vec(&req));
        }
        Ok(out)
    }

    /// Appends an encoded request (an OTLP protobuf body).
    fn append_encoded(&mut self, buf: &[u8]) -> Result<usize, ConvertError> {
        self.append_limited(buf, &Limits::NONE).map(|a| a.rows)
    }

    /// Takes the accumulated rows as a block's tables and resets the builder.
    fn finish(&mut self) -> Result<TableSet, ConvertError>;
}

impl ConvertError {
    /// True for faults of an OTLP request (the sender's); false for tables
    /// that are not what this version writes (a damaged block).
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, ConvertError::InvalidId { .. } | ConvertError::Protobuf(_))
    }
}

/// The Arrow tables of one block (or one open block's snapshot), by name.
#[derive(Debug, Clone)]
pub struct TableSet {
    pub signal: Signal,
    pub tables: Vec<(&'static str, RecordBatch)>,
    /// Root rows.
    pub rows: usize,
    /// Smallest and largest record time (nanoseconds since the epoch); both
    /// 0 when there are no rows.
    pub min_time: u64,
    pub max_time: u64,
}

impl TableSet {
    pub fn get(&self, name: &'static str) -> Result<&RecordBatch, ConvertError> {
        self.tables
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| b)
            .ok_or(ConvertError::MissingTable(name))
    }

    /// Builds a set from tables read back from a block; rows and times are
    /// taken from the caller (the block's manifest).
    pub fn from_tables(signal: Signal, tables: Vec<(&'static str, RecordBatch)>, min_time: u64, max_time: u64) -> Self {
        let root = root_table(signal);
        let rows = tables.iter().find(|(n, _)| *n == root).map_or(0, |(_, b)| b.num_rows());
        TableSet {
            signal,
            tables,
            rows,
            min_time,
            max_time,
        }
    }
}

/// The root table of a signal: one row per log record, span or data point.
pub fn root_table(signal: Signal) -> &'static str {
    match signal {
        Signal::Logs => crate::schema::LOGS,
        Signal::Traces => crate::schema::SPANS,
        Signal::Metrics => crate::schema::POINTS,
    }
}

/// Every table a block of `signal` holds, root first.
pub fn table_names(signal: Signal) -> &'static [&'static str] {
    use crate::schema::*;
    match signal {
        Signal::Logs => &[LOGS, LOG_ATTRS, RESOURCES, RESOURCE_ATTRS, SCOPES, SCOPE_ATTRS],
        Signal::Traces => &[
            SPANS,
            SPAN_ATTRS,
            SPAN_EVENTS,
            EVENT_ATTRS,
            SPAN_LINKS,
            LINK_ATTRS,
            RESOURCES,
            RESOURCE_ATTRS,
            SCOPES,
            SCOPE_ATTRS,
        ],
        Signal::Metrics => &[
            POINTS,
            POINT_DISTS,
            SERIES,
            SERIES_ATTRS,
            RESOURCES,
            RESOURCE_ATTRS,
            SCOPES,
            SCOPE_ATTRS,
        ],
    }
}

/// Tracks the smallest and largest time seen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TimeRange {
    pub min: u64,
    pub max: u64,
}

impl Default for TimeRange {
    fn default() -> Self {
        TimeRange { min: u64::MAX, max: 0 }
    }
}

impl TimeRange {
    pub fn add(&mut self, t: u64) {
        self.min = self.min.min(t);
        self.max = self.max.max(t);
    }

    /// (min, max), or (0, 0) when nothing was added.
    pub fn bounds(&self) -> (u64, u64) {
        if self.min > self.max {
            (0, 0)
        } else {
            (self.min, self.max)
        }
    }
}
