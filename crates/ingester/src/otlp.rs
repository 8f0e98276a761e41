//! The OTLP receivers: gRPC (`/opentelemetry.proto.collector.*.v1.*Service/Export`)
//! and HTTP (`POST /v1/logs`, `/v1/traces`, `/v1/metrics`, protobuf or
//! JSON). Both authenticate the request first ([`mira_common::auth`]: the
//! tenant it writes to comes from there), before it takes an in-flight slot
//! or a byte of its body is read, then charge the tenant's ingest rates
//! ([`mira_common::limits`]): bytes from `Content-Length` before the body
//! is read (gRPC, and HTTP without it: right after the body is read,
//! before it is decoded), records counted on the wire
//! ([`crate::records`]) before the request reaches a shard, so a refused
//! request writes nothing and holds its in-flight slot only for the check;
//! then hand it to the [`Pipeline`] as OTLP protobuf bytes:
//! gRPC bodies are never decoded into structs here (the shard's builder
//! reads them straight from the wire), JSON bodies are decoded and
//! re-encoded once.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BufMut, Bytes};
use mira_common::auth::{Authenticator, Principal, Scope};
use mira_common::limits::Limiter;
use mira_common::tls::PeerInfo;
use mira_core::convert::{Appended, Limits};
use mira_core::ids::{Signal, TenantId};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};

use crate::body::{BodyError, decode_body, parse_encoding};
use crate::error::{IngestError, ServiceError};
use crate::metrics::Phase;
use crate::pipeline::Pipeline;

/// The tenant header (Loki/Mimir/Tempo convention).
pub use mira_common::auth::TENANT_HEADER;

/// Receiver settings.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    /// Largest request body on the wire (compressed), bytes.
    pub max_wire_bytes: usize,
    /// Largest request after decompression, bytes.
    pub max_message_bytes: usize,
    /// Refuse requests without `X-Scope-OrgID` instead of using the default tenant.
    pub require_tenant: bool,
    /// Export requests (gRPC and HTTP together) being read, decoded or
    /// waiting for their ack at once; more wait for a slot (up to the
    /// admission wait) before their body is read, so memory is bounded by
    /// configuration, not by the number of connections.
    pub max_inflight: usize,
    /// Longest time to receive an HTTP request's body once it holds a
    /// slot (a client that stalls mid-body gets 408 and frees the slot).
    pub body_timeout: std::time::Duration,
    /// Most memory one request may take to decode, estimated from what it
    /// holds on the wire before anything is decoded
    /// ([`crate::records::Census::decoded_bytes`]); past it, 413 /
    /// RESOURCE_EXHAUSTED naming the counts.
    pub max_decoded_bytes: u64,
    /// Most decoded memory all requests being decoded or awaiting their
    /// ack may take at once; a request waits for room (up to the admission
    /// wait, then 429 / RESOURCE_EXHAUSTED), so memory is bounded by
    /// configuration whatever the requests' shape.
    pub max_inflight_decoded_bytes: u64,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            max_wire_bytes: 16 << 20,
            max_message_bytes: 16 << 20,
            require_tenant: false,
            max_inflight: 8,
            body_timeout: std::time::Duration::from_secs(30),
            max_decoded_bytes: 256 << 20,
            max_inflight_decoded_bytes: 1 << 30,
        }
    }
}

/// The in-flight decoded budget counts KiB (a semaphore takes at most
/// `u32::MAX` permits at once).
const BUDGET_UNIT: u64 = 1024;

fn budget_units(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(BUDGET_UNIT).max(1)).unwrap_or(u32::MAX)
}

/// What a request holds of the in-flight decoded budget, until it is
/// answered.
#[derive(Default)]
pub(crate) struct Budget {
    permit: Option<OwnedSemaphorePermit>,
    units: u32,
}

impl Budget {
    /// The bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        u64::from(self.units) * BUDGET_UNIT
    }
}

/// An in-flight slot; counted on `/metrics` while held.
struct Slot {
    _permit: OwnedSemaphorePermit,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// When a request arrived, took its in-flight slot and had its body
/// (the phase probes, `mira_ingester_phase_seconds`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arrival {
    at: Instant,
    slot: Instant,
}

impl Arrival {
    /// Observes the receiver's phases of an accepted request whose body
    /// was read by `body` (the pipeline observes the ones in between).
    pub(crate) fn accepted(&self, metrics: &crate::metrics::Metrics, signal: Signal, body: Instant) {
        metrics.observe_phase(signal, Phase::Slot, self.slot.saturating_duration_since(self.at));
        metrics.observe_phase(signal, Phase::Body, body.saturating_duration_since(self.slot));
        metrics.observe_phase(signal, Phase::Total, self.at.elapsed());
    }
}

/// What the receivers share.
#[derive(Clone)]
pub struct Receivers {
    pub pipeline: Arc<Pipeline>,
    pub config: ReceiverConfig,
    auth: Arc<Authenticator>,
    pub(crate) limits: Arc<Limiter>,
    inflight: Arc<Semaphore>,
    /// The in-flight decoded budget, in [`BUDGET_UNIT`]s.
    decoded: Arc<Semaphore>,
    /// Remote write 1.0 metric family types, by tenant.
    pub(crate) kinds: Arc<crate::prom::KindCache>,
    /// Buffers snappy push bodies are undone into.
    pub(crate) buffers: Arc<crate::push::BufferPool>,
}

impl std::fmt::Debug for Receivers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receivers").field("config", &self.config).finish()
    }
}

impl Receivers {
    pub fn new(
        pipeline: Arc<Pipeline>,
        config: ReceiverConfig,
        auth: Arc<Authenticator>,
        limits: Arc<Limiter>,
    ) -> Receivers {
        Receivers {
            kinds: Arc::default(),
            buffers: Arc::default(),
            inflight: Arc::new(Semaphore::new(config.max_inflight.max(1))),
            decoded: Arc::new(Semaphore::new(
                (budget_units(config.max_inflight_decoded_bytes) as usize).min(Semaphore::MAX_PERMITS),
            )),
            pipeline,
            config,
            auth,
            limits,
        }
    }

    /// Counts what `payload` holds on the wire, takes what decoding it
    /// will cost from the in-flight decoded budget (into `held`), charges
    /// `tenant`'s records rate and submits it; the records are given back
    /// when the request is not accepted, so a refused request costs its
    /// tenant nothing. Counts the outcome, a refusal before submitting
    /// (a malformed body, the decoded budget, the rate) included.
    pub(crate) async fn submit(
        &self,
        signal: Signal,
        tenant: TenantId,
        payload: Bytes,
        held: &mut Budget,
    ) -> Result<Appended, IngestError> {
        match crate::records::census(signal, &payload) {
            Ok(census) => self.submit_counted(signal, tenant, payload, held, &census).await,
            Err(m) => {
                let refused = Err(IngestError::Invalid(format!(
                    "malformed OTLP protobuf request: {}",
                    m.0
                )));
                self.pipeline.count(signal, &refused);
                refused
            }
        }
    }

    /// [`Receivers::submit`] with `census` already counted: for an OTLP
    /// request Mira wrote itself from another protocol's request, counted
    /// on that request (its records as the OTLP census counts them, its
    /// memory at least the OTLP's), so our own output is not counted a
    /// second time.
    pub(crate) async fn submit_counted(
        &self,
        signal: Signal,
        tenant: TenantId,
        payload: Bytes,
        held: &mut Budget,
        census: &crate::records::Census,
    ) -> Result<Appended, IngestError> {
        let result = async {
            self.reserve(held, census.decoded_bytes(signal), || census.describe(signal))
                .await?;
            if !self.limits.enabled() {
                return self.pipeline.submit(signal, tenant, payload).await;
            }
            let records = census.records;
            self.limits.take_records(&tenant, records)?;
            let result = self.pipeline.submit(signal, tenant.clone(), payload).await;
            if result.is_err() {
                self.limits.give_back_records(&tenant, records);
            }
            result
        }
        .await;
        self.pipeline.count(signal, &result);
        result
    }

    /// The most decoded memory one request may take, and the flag that
    /// sets it: the per-request limit, or the whole budget when smaller.
    pub(crate) fn decoded_limit(&self) -> (u64, &'static str) {
        let (per_request, budget) = (self.config.max_decoded_bytes, self.config.max_inflight_decoded_bytes);
        if per_request <= budget {
            (per_request, "--max-decoded-size")
        } else {
            (budget, "--max-inflight-decoded-size")
        }
    }

    /// Grows `held` to `estimate` bytes of the in-flight decoded budget,
    /// waiting up to the admission wait; refuses an estimate over the
    /// per-request limit (or the whole budget) at once, naming `what` the
    /// request holds.
    pub(crate) async fn reserve(
        &self,
        held: &mut Budget,
        estimate: u64,
        what: impl FnOnce() -> String,
    ) -> Result<(), IngestError> {
        let (limit, flag) = self.decoded_limit();
        let budget = self.config.max_inflight_decoded_bytes;
        if estimate > limit {
            return Err(IngestError::DecodedTooLarge {
                what: what(),
                estimate,
                limit,
                flag,
            });
        }
        let want = budget_units(estimate);
        let Some(more) = want.checked_sub(held.units).filter(|m| *m > 0) else {
            return Ok(());
        };
        let permit = match self.decoded.clone().try_acquire_many_owned(more) {
            Ok(p) => p,
            Err(_) => {
                let wait = self.pipeline.admit_wait();
                match tokio::time::timeout(wait, self.decoded.clone().acquire_many_owned(more)).await {
                    Ok(Ok(p)) => p,
                    Ok(Err(_)) => return Err(IngestError::Unavailable("the ingester is stopping".to_owned())),
                    Err(_) => {
                        return Err(IngestError::Overloaded {
                            what: format!(
                                "the {budget}-byte in-flight decoded budget (--max-inflight-decoded-size) had no room for {estimate} bytes"
                            ),
                            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        });
                    }
                }
            }
        };
        match &mut held.permit {
            Some(p) => p.merge(permit),
            None => held.permit = Some(permit),
        }
        held.units = want;
        Ok(())
    }

    /// Takes an in-flight slot, waiting up to the admission wait; held
    /// until the request is answered.
    async fn enter(&self) -> Result<Slot, IngestError> {
        let slot = |permit| {
            let gauge = self.pipeline.metrics().inflight.clone();
            gauge.inc();
            Slot { _permit: permit, gauge }
        };
        if let Ok(p) = self.inflight.clone().try_acquire_owned() {
            return Ok(slot(p));
        }
        let wait = self.pipeline.admit_wait();
        match tokio::time::timeout(wait, self.inflight.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(slot(p)),
            Ok(Err(_)) => Err(IngestError::Unavailable("the ingester is stopping".to_owned())),
            Err(_) => Err(IngestError::Overloaded {
                what: format!("all {} in-flight request slots stayed taken", self.config.max_inflight),
                wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            }),
        }
    }

    /// The tenant a request writes to (or why it may not): the one check
    /// of both receivers, made on the headers alone.
    fn authorize(&self, parts: &axum::http::request::Parts) -> Result<TenantId, IngestError> {
        let peer = PeerInfo::of(&parts.extensions).map(|p| p.addr.ip());
        Ok(self
            .auth
            .authorize(&parts.headers, peer, Scope::Write, self.config.require_tenant)?
            .tenant)
    }
}

pub(crate) fn body_error(e: BodyError) -> IngestError {
    match e {
        BodyError::TooLarge { limit } | BodyError::DecompressedTooLarge { limit } => IngestError::TooLarge {
            bytes: limit.saturating_add(1),
            limit,
        },
        other => IngestError::Invalid(other.to_string()),
    }
}

/// OTLP JSON → OTLP protobuf for `signal`.
pub fn json_to_protobuf(signal: Signal, body: &[u8]) -> Result<Bytes, IngestError> {
    let bad = |e: serde_json::Error| IngestError::Invalid(format!("invalid OTLP JSON: {e}"));
    let bytes = match signal {
        Signal::Logs => serde_json::from_slice::<ExportLogsServiceRequest>(body)
            .map_err(bad)?
            .encode_to_vec(),
        Signal::Traces => serde_json::from_slice::<ExportTraceServiceRequest>(body)
            .map_err(bad)?
            .encode_to_vec(),
        Signal::Metrics => serde_json::from_slice::<ExportMetricsServiceRequest>(body)
            .map_err(bad)?
            .encode_to_vec(),
    };
    Ok(Bytes::from(bytes))
}

/// The Export*ServiceResponse for an accepted request: empty, or a
/// partial success naming rows the limits rejected (`rejected` > 0) or,
/// with `rejected` = 0, a warning about what they cut, as OTLP allows.
fn partial_success(appended: &Appended, limits: &Limits) -> Option<(i64, String)> {
    appended
        .message(limits)
        .map(|m| (i64::try_from(appended.rejected_total()).unwrap_or(i64::MAX), m))
}

fn response_protobuf(signal: Signal, partial: Option<(i64, String)>) -> Bytes {
    let Some((rejected, error_message)) = partial else {
        return Bytes::new();
    };
    let bytes = match signal {
        Signal::Logs => ExportLogsServiceResponse {
            partial_success: Some(ExportLogsPartialSuccess {
                rejected_log_records: rejected,
                error_message,
            }),
        }
        .encode_to_vec(),
        Signal::Traces => ExportTraceServiceResponse {
            partial_success: Some(ExportTracePartialSuccess {
                rejected_spans: rejected,
                error_message,
            }),
        }
        .encode_to_vec(),
        Signal::Metrics => ExportMetricsServiceResponse {
            partial_success: Some(ExportMetricsPartialSuccess {
                rejected_data_points: rejected,
                error_message,
            }),
        }
        .encode_to_vec(),
    };
    Bytes::from(bytes)
}

fn response_json(signal: Signal, partial: Option<(i64, String)>) -> String {
    let Some((rejected, message)) = partial else {
        return "{}".to_owned();
    };
    let field = match signal {
        Signal::Logs => "rejectedLogRecords",
        Signal::Traces => "rejectedSpans",
        Signal::Metrics => "rejectedDataPoints",
    };
    // OTLP/JSON writes int64 as a string.
    serde_json::json!({ "partialSuccess": { field: rejected.to_string(), "errorMessage": message } }).to_string()
}

// ---- HTTP ----

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Protobuf,
    Json,
}

fn http_error(e: &IngestError, format: Format) -> Response {
    let status = StatusCode::from_u16(e.error_code().http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let message = e.to_string();
    // OTLP/HTTP: the body is a google.rpc.Status in the request's format.
    let mut response = match format {
        Format::Json => (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::json!({ "code": e.error_code().grpc_code() as i32, "message": message }).to_string(),
        )
            .into_response(),
        Format::Protobuf => {
            let mut buf = Vec::new();
            // google.rpc.Status { int32 code = 1; string message = 2; }
            prost::encoding::int32::encode(1, &(e.error_code().grpc_code() as i32), &mut buf);
            prost::encoding::string::encode(2, &message, &mut buf);
            (status, [(header::CONTENT_TYPE, "application/x-protobuf")], buf).into_response()
        }
    };
    if let Some(after) = e.retry_after() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(after.as_secs().max(1)));
    }
    response
}

/// The part of every HTTP receiver before its body is decoded: the
/// request is authorized (its tenant), refused on its declared length,
/// charged its bytes, given an in-flight slot and its body read within
/// the body timeout; then `handle` decodes and submits it, holding the
/// slot. A request not accepted gives its bytes back.
pub(crate) async fn receive<T>(
    receivers: &Receivers,
    parts: &axum::http::request::Parts,
    body: Body,
    arrived: Instant,
    handle: impl AsyncFnOnce(TenantId, Bytes, Arrival) -> Result<T, IngestError>,
) -> Result<T, IngestError> {
    let headers = &parts.headers;
    let tenant = receivers.authorize(parts)?;
    let limit = receivers.config.max_wire_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // Refused on its declared length before a byte of it is read.
    if let Some(n) = declared.filter(|n| *n > limit as u64) {
        return Err(IngestError::TooLarge {
            bytes: usize::try_from(n).unwrap_or(usize::MAX),
            limit,
        });
    }
    // The tenant's bytes rate, on the declared length: before the
    // request takes an in-flight slot or its body is read.
    if let Some(n) = declared {
        receivers.limits.take_bytes(&tenant, n)?;
    }
    let mut charged = declared.unwrap_or(0);
    let result = async {
        let _slot = receivers.enter().await?;
        let arrival = Arrival {
            at: arrived,
            slot: Instant::now(),
        };
        let timeout = receivers.config.body_timeout;
        let body = tokio::time::timeout(timeout, axum::body::to_bytes(body, limit))
            .await
            .map_err(|_| IngestError::Timeout(format!("the request body did not arrive within {timeout:?}")))?
            .map_err(|e| {
                let limited = e.into_inner();
                if limited.is::<http_body_util::LengthLimitError>() {
                    IngestError::TooLarge {
                        bytes: limit.saturating_add(1),
                        limit,
                    }
                } else {
                    IngestError::Invalid(format!("reading the request body: {limited}"))
                }
            })?;
        if declared.is_none() {
            // No Content-Length (chunked): charged once read, before
            // it is decoded.
            let n = body.len() as u64;
            receivers.limits.take_bytes(&tenant, n)?;
            charged = n;
        }
        handle(tenant.clone(), body, arrival).await
    }
    .await;
    if result.is_err() {
        // Not accepted: its bytes are not charged.
        receivers.limits.give_back_bytes(&tenant, charged);
    }
    result
}

/// A request's media type: `Content-Type` without parameters, lowercase
/// ("" when absent).
pub(crate) fn media_type(headers: &axum::http::HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

async fn http_export(receivers: &Receivers, signal: Signal, request: axum::extract::Request) -> Response {
    let arrived = Instant::now();
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let content_type = media_type(headers);
    let format = match content_type.as_str() {
        "application/x-protobuf" | "application/protobuf" => Format::Protobuf,
        "application/json" => Format::Json,
        other => {
            let e = IngestError::Invalid(format!(
                "unsupported content type {:?}: use application/x-protobuf or application/json",
                other.chars().take(64).collect::<String>()
            ));
            let mut r = http_error(&e, Format::Json);
            *r.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
            return r;
        }
    };
    let result = receive(receivers, &parts, body, arrived, async |tenant, body, arrival| {
        let encoding =
            parse_encoding(headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok())).map_err(body_error)?;
        let body = decode_body(
            body,
            encoding,
            receivers.config.max_wire_bytes,
            receivers.config.max_message_bytes,
        )
        .map_err(body_error)?;
        let mut held = Budget::default();
        let payload = match format {
            Format::Protobuf => body,
            Format::Json => {
                // serde builds every object as a prost message: bounded
                // before it does.
                let objects = crate::records::json_objects(&body);
                let estimate = crate::records::json_decoded_bytes(objects, body.len());
                receivers
                    .reserve(&mut held, estimate, || format!("{objects} JSON objects"))
                    .await?;
                json_to_protobuf(signal, &body)?
            }
        };
        let read = Instant::now();
        let appended = receivers.submit(signal, tenant, payload, &mut held).await?;
        arrival.accepted(receivers.pipeline.metrics(), signal, read);
        Ok(appended)
    })
    .await;
    match result {
        Ok(appended) => {
            let partial = partial_success(&appended, &receivers.pipeline.limits());
            match format {
                Format::Protobuf => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/x-protobuf")],
                    response_protobuf(signal, partial),
                )
                    .into_response(),
                Format::Json => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    response_json(signal, partial),
                )
                    .into_response(),
            }
        }
        Err(e) => {
            if e.error_code().http_status() >= 500 {
                tracing::warn!(target: "mira::ingester", error = %e, "export failed");
            }
            http_error(&e, format)
        }
    }
}

/// The OTLP/HTTP router (`/v1/logs`, `/v1/traces`, `/v1/metrics`).
pub fn http_router(receivers: Receivers) -> axum::Router {
    use axum::extract::Request;
    use axum::routing::post;
    axum::Router::new()
        .route(
            "/v1/logs",
            post(|State(r): State<Receivers>, req: Request| async move { http_export(&r, Signal::Logs, req).await }),
        )
        .route(
            "/v1/traces",
            post(|State(r): State<Receivers>, req: Request| async move { http_export(&r, Signal::Traces, req).await }),
        )
        .route(
            "/v1/metrics",
            post(|State(r): State<Receivers>, req: Request| async move { http_export(&r, Signal::Metrics, req).await }),
        )
        .with_state(receivers)
}

// ---- gRPC ----

/// Passes message bytes through untouched (the shard decodes them).
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

#[derive(Clone, Copy, Debug, Default)]
pub struct RawCoder;

impl Encoder for RawCoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCoder;
    type Decoder = RawCoder;
    fn encoder(&mut self) -> RawCoder {
        RawCoder
    }
    fn decoder(&mut self) -> RawCoder {
        RawCoder
    }
}

/// gRPC paths of the three export services.
pub const GRPC_LOGS: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";
pub const GRPC_TRACES: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
pub const GRPC_METRICS: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

#[derive(Clone)]
struct Export {
    receivers: Receivers,
    signal: Signal,
}

impl tonic::server::UnaryService<Bytes> for Export {
    type Response = Bytes;
    type Future = futures::future::BoxFuture<'static, Result<tonic::Response<Bytes>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let receivers = self.receivers.clone();
        let signal = self.signal;
        Box::pin(async move {
            let result = async {
                // Authorized before the body was read (GrpcExport).
                let tenant = request
                    .extensions()
                    .get::<Principal>()
                    .map(|p| p.tenant.clone())
                    .ok_or_else(|| IngestError::Unavailable("the request was not authorized".to_owned()))?;
                // The bytes rate on the message as received (tonic reads
                // it whole before this call), before it is decoded.
                let read = Instant::now();
                let arrival = request.extensions().get::<Arrival>().copied();
                let payload = request.into_inner();
                let bytes = payload.len() as u64;
                receivers.limits.take_bytes(&tenant, bytes)?;
                let mut held = Budget::default();
                let result = receivers.submit(signal, tenant.clone(), payload, &mut held).await;
                match (&result, arrival) {
                    (Err(_), _) => receivers.limits.give_back_bytes(&tenant, bytes),
                    (Ok(_), Some(arrival)) => arrival.accepted(receivers.pipeline.metrics(), signal, read),
                    (Ok(_), None) => {}
                }
                result
            }
            .await;
            match result {
                Ok(appended) => {
                    let partial = partial_success(&appended, &receivers.pipeline.limits());
                    Ok(tonic::Response::new(response_protobuf(signal, partial)))
                }
                Err(e) => Err(grpc_status(&e)),
            }
        })
    }
}

/// The gRPC status for `e`; a refusal that retrying can cure (overload,
/// a tenant over its rate) carries a `google.rpc.RetryInfo` detail, as the
/// OTLP specification asks for throttling and the Collector honours.
pub fn grpc_status(e: &IngestError) -> tonic::Status {
    let code = e.error_code().grpc_code();
    let Some(after) = e.retry_after() else {
        return tonic::Status::new(code, e.to_string());
    };
    // google.rpc.RetryInfo { google.protobuf.Duration retry_delay = 1 }
    // (Duration { int64 seconds = 1 }) in a google.rpc.Status's details.
    let seconds = i64::try_from(after.as_secs().max(1)).unwrap_or(i64::MAX);
    let mut delay = Vec::new();
    prost::encoding::int64::encode(1, &seconds, &mut delay);
    let mut retry_info = Vec::new();
    prost::encoding::bytes::encode(1, &delay, &mut retry_info);
    let mut any = Vec::new();
    prost::encoding::string::encode(1, &"type.googleapis.com/google.rpc.RetryInfo".to_owned(), &mut any);
    prost::encoding::bytes::encode(2, &retry_info, &mut any);
    let mut details = Vec::new();
    prost::encoding::int32::encode(1, &(code as i32), &mut details);
    prost::encoding::string::encode(2, &e.to_string(), &mut details);
    prost::encoding::bytes::encode(3, &any, &mut details);
    tonic::Status::with_details(code, e.to_string(), Bytes::from(details))
}

/// A tower service answering one export path.
#[derive(Clone)]
pub struct GrpcExport {
    inner: Export,
}

impl std::fmt::Debug for GrpcExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcExport")
            .field("signal", &self.inner.signal)
            .finish()
    }
}

impl tower_service::Service<axum::http::Request<Body>> for GrpcExport {
    type Response = Response;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<Body>) -> Self::Future {
        let svc = self.inner.clone();
        let max = svc.receivers.config.max_message_bytes;
        Box::pin(async move {
            let arrived = Instant::now();
            // Who and which tenant, from the headers alone.
            let (mut parts, body) = req.into_parts();
            let peer = PeerInfo::of(&parts.extensions).map(|p| p.addr.ip());
            let principal = match svc.receivers.auth.authorize(
                &parts.headers,
                peer,
                Scope::Write,
                svc.receivers.config.require_tenant,
            ) {
                Ok(p) => p,
                Err(e) => return Ok(grpc_status(&IngestError::from(e)).into_http::<Body>()),
            };
            parts.extensions.insert(principal);
            // A slot before the body is read: waiting requests hold only
            // their headers (and what HTTP/2 flow control lets in).
            let _slot = match svc.receivers.enter().await {
                Ok(slot) => slot,
                Err(e) => return Ok(grpc_status(&e).into_http::<Body>()),
            };
            parts.extensions.insert(Arrival {
                at: arrived,
                slot: Instant::now(),
            });
            let req = axum::http::Request::from_parts(parts, body);
            let mut grpc = tonic::server::Grpc::new(RawCodec)
                .accept_compressed(CompressionEncoding::Gzip)
                .accept_compressed(CompressionEncoding::Zstd)
                .max_decoding_message_size(max)
                .max_encoding_message_size(1 << 20);
            let response = grpc.unary(svc, req).await;
            Ok(response.map(Body::new))
        })
    }
}

/// The OTLP/gRPC router (one route per export service).
pub fn grpc_router(receivers: Receivers) -> axum::Router {
    let svc = |signal| GrpcExport {
        inner: Export {
            receivers: receivers.clone(),
            signal,
        },
    };
    axum::Router::new()
        .route_service(GRPC_LOGS, svc(Signal::Logs))
        .route_service(GRPC_TRACES, svc(Signal::Traces))
        .route_service(GRPC_METRICS, svc(Signal::Metrics))
}
