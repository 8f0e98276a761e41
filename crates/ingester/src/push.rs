//! The HTTP routes of the Prometheus and Loki ingest protocols, on the
//! ingester's HTTP port beside OTLP/HTTP: remote write (`POST
//! /api/v1/push`, Mimir's path, and `/api/v1/write`, [`crate::prom`]) and
//! Loki push (`POST /loki/api/v1/push`, [`crate::loki`]). Both share the
//! OTLP receivers' contract ([`crate::otlp::receive`]): the credential
//! and tenant, the byte, record and memory limits, the in-flight slots,
//! the WAL's acknowledgement; 429 or 503 with `Retry-After` when retrying
//! can cure a refusal, 4xx naming the problem when it cannot. Bodies are
//! answered in plain text, as Prometheus, Mimir and Loki answer.

use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use mira_core::ids::Signal;

use crate::error::{IngestError, ServiceError};
use crate::otlp::{Budget, Receivers, body_error, receive};

/// A plain-text error answer with its status and, for refusals retrying
/// can cure, `Retry-After`.
fn text_error(e: &IngestError) -> Response {
    let status = StatusCode::from_u16(e.error_code().http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status.is_server_error() {
        tracing::warn!(target: "mira::ingester", error = %e, "push failed");
    }
    let mut r = (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{e}\n"),
    )
        .into_response();
    if let Some(after) = e.retry_after() {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(after.as_secs().max(1)));
    }
    r
}

fn unsupported(message: String) -> Response {
    (
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Undoes snappy's block format, refusing a body whose declared length is
/// over `max` before anything is allocated.
pub fn unsnappy(body: &[u8], max: usize) -> Result<Vec<u8>, IngestError> {
    let len =
        snap::raw::decompress_len(body).map_err(|e| IngestError::Invalid(format!("malformed snappy body: {e}")))?;
    if len > max {
        return Err(IngestError::TooLarge { bytes: len, limit: max });
    }
    snap::raw::Decoder::new()
        .decompress_vec(body)
        .map_err(|e| IngestError::Invalid(format!("malformed snappy body: {e}")))
}

/// The body of a protobuf push: snappy unless `Content-Encoding` names
/// gzip or zstd (undone within the limits) or identity.
fn protobuf_body(receivers: &Receivers, headers: &HeaderMap, body: Bytes) -> Result<Bytes, IngestError> {
    let max = receivers.config.max_message_bytes;
    match header_str(headers, header::CONTENT_ENCODING).map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(Bytes::from(unsnappy(&body, max)?)),
        Some(e) if e.is_empty() || e == "snappy" => Ok(Bytes::from(unsnappy(&body, max)?)),
        Some(other) => {
            let encoding = crate::body::parse_encoding(Some(&other)).map_err(body_error)?;
            crate::body::decode_body(body, encoding, receivers.config.max_wire_bytes, max).map_err(body_error)
        }
    }
}

async fn remote_write(receivers: &Receivers, request: axum::extract::Request) -> Response {
    let arrived = Instant::now();
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let version = match crate::prom::version_of(header_str(headers, header::CONTENT_TYPE)) {
        Ok(v) => v,
        Err(m) => return unsupported(m),
    };
    let result = receive(receivers, &parts, body, arrived, async |tenant, body, arrival| {
        let raw = protobuf_body(receivers, headers, body)?;
        let mut parsed = crate::prom::Parsed::read(version, &raw).map_err(IngestError::Invalid)?;
        let mut held = Budget::default();
        let census = parsed.census();
        receivers
            .reserve(&mut held, census.decoded_bytes(Signal::Metrics), || {
                census.describe(Signal::Metrics)
            })
            .await?;
        let (payload, written) = parsed.write(receivers.pipeline.window());
        let read = Instant::now();
        let appended = if written.samples + written.histograms + written.exemplars > 0 {
            let a = receivers
                .submit(Signal::Metrics, tenant, Bytes::from(payload), &mut held)
                .await?;
            arrival.accepted(receivers.pipeline.metrics(), Signal::Metrics, read);
            Some(a)
        } else {
            None
        };
        Ok((parsed.refused, written, appended))
    })
    .await;
    match result {
        Ok((refused, written, appended)) => {
            let mut message = refused.message();
            if message.is_none()
                && let Some(a) = appended.as_ref().filter(|a| a.rejected_total() > 0)
            {
                message = a.message(&receivers.pipeline.limits());
            }
            let mut r = match message {
                Some(m) => (
                    StatusCode::BAD_REQUEST,
                    [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                    format!("{m}\n"),
                )
                    .into_response(),
                None => StatusCode::NO_CONTENT.into_response(),
            };
            for (name, n) in [
                ("x-prometheus-remote-write-samples-written", written.samples),
                ("x-prometheus-remote-write-histograms-written", written.histograms),
                ("x-prometheus-remote-write-exemplars-written", written.exemplars),
            ] {
                r.headers_mut().insert(name, HeaderValue::from(n));
            }
            r
        }
        Err(e) => text_error(&e),
    }
}

async fn loki_push(receivers: &Receivers, request: axum::extract::Request) -> Response {
    let arrived = Instant::now();
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let media = header_str(headers, header::CONTENT_TYPE)
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let json = match media.as_str() {
        "application/json" => true,
        "application/x-protobuf" | "" => false,
        other => {
            return unsupported(format!(
                "unsupported content type {:?}: Loki push is application/x-protobuf (snappy) or application/json",
                other.chars().take(64).collect::<String>()
            ));
        }
    };
    let result = receive(receivers, &parts, body, arrived, async |tenant, body, arrival| {
        let raw = if json {
            let encoding =
                crate::body::parse_encoding(header_str(headers, header::CONTENT_ENCODING)).map_err(body_error)?;
            crate::body::decode_body(
                body,
                encoding,
                receivers.config.max_wire_bytes,
                receivers.config.max_message_bytes,
            )
            .map_err(body_error)?
        } else {
            protobuf_body(receivers, headers, body)?
        };
        let mut held = Budget::default();
        if json {
            // serde builds the streams and entries: bounded before it does.
            let objects = crate::records::json_objects(&raw);
            let estimate = crate::records::json_decoded_bytes(objects, raw.len());
            receivers
                .reserve(&mut held, estimate, || format!("{objects} JSON objects"))
                .await?;
        }
        let mut parsed = if json {
            crate::loki::Parsed::json(&raw)
        } else {
            crate::loki::Parsed::protobuf(&raw)
        }
        .map_err(IngestError::Invalid)?;
        let census = parsed.census();
        receivers
            .reserve(&mut held, census.decoded_bytes(Signal::Logs), || {
                census.describe(Signal::Logs)
            })
            .await?;
        let (payload, written) = parsed.write(receivers.pipeline.window());
        let read = Instant::now();
        let appended = if written > 0 {
            let a = receivers
                .submit(Signal::Logs, tenant, Bytes::from(payload), &mut held)
                .await?;
            arrival.accepted(receivers.pipeline.metrics(), Signal::Logs, read);
            Some(a)
        } else {
            None
        };
        Ok((parsed.message(), appended))
    })
    .await;
    match result {
        Ok((message, appended)) => {
            let message = message.or_else(|| {
                appended
                    .as_ref()
                    .filter(|a| a.rejected_total() > 0)
                    .and_then(|a| a.message(&receivers.pipeline.limits()))
            });
            match message {
                Some(m) => (
                    StatusCode::BAD_REQUEST,
                    [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                    format!("{m}\n"),
                )
                    .into_response(),
                None => StatusCode::NO_CONTENT.into_response(),
            }
        }
        Err(e) => text_error(&e),
    }
}

/// The remote-write and Loki-push routes.
pub fn http_router(receivers: Receivers) -> axum::Router {
    use axum::extract::Request;
    use axum::routing::post;
    let rw = post(|State(r): State<Receivers>, req: Request| async move { remote_write(&r, req).await });
    axum::Router::new()
        .route("/api/v1/push", rw.clone())
        .route("/api/v1/write", rw)
        .route(
            "/loki/api/v1/push",
            post(|State(r): State<Receivers>, req: Request| async move { loki_push(&r, req).await }),
        )
        .with_state(receivers)
}
