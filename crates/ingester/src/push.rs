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
use mira_core::ids::TenantId;

use crate::otlp::{Arrival, Budget, Receivers, body_error, media_type, receive};
use crate::records::{Census, Meter, ReadError};

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
    let mut buf = Vec::new();
    unsnappy_into(body, max, &mut buf)?;
    Ok(buf)
}

/// [`unsnappy`] into `buf`, whose old bytes are written over, not zeroed
/// first (a pooled buffer).
fn unsnappy_into(body: &[u8], max: usize, buf: &mut Vec<u8>) -> Result<(), IngestError> {
    let bad = |e: snap::Error| IngestError::Invalid(format!("malformed snappy body: {e}"));
    let len = snap::raw::decompress_len(body).map_err(bad)?;
    if len > max {
        return Err(IngestError::TooLarge { bytes: len, limit: max });
    }
    if buf.len() < len {
        buf.resize(len, 0);
    } else {
        buf.truncate(len);
    }
    let n = snap::raw::Decoder::new().decompress(body, buf).map_err(bad)?;
    buf.truncate(n);
    Ok(())
}

/// Buffers that snappy bodies are undone into, kept between requests so
/// that a body is written into memory already mapped (a fresh buffer of
/// a megabyte costs its page faults and zeroing every time). At most
/// [`POOL_BUFFERS`] of at most [`POOL_BUFFER_BYTES`] each are kept: a
/// fixed bound on the memory held between requests.
#[derive(Debug, Default)]
pub struct BufferPool(std::sync::Mutex<Vec<Vec<u8>>>);

const POOL_BUFFERS: usize = 8;
const POOL_BUFFER_BYTES: usize = 4 << 20;

impl BufferPool {
    fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
            .unwrap_or_default()
    }

    fn give(&self, buf: Vec<u8>) {
        if buf.capacity() <= POOL_BUFFER_BYTES {
            let mut bufs = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if bufs.len() < POOL_BUFFERS {
                bufs.push(buf);
            }
        }
    }
}

/// A decoded push body: in a pooled buffer (snappy) or as decoded.
enum Raw<'p> {
    Pooled(Vec<u8>, &'p BufferPool),
    Bytes(Bytes),
}

impl std::ops::Deref for Raw<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Raw::Pooled(b, _) => b,
            Raw::Bytes(b) => b,
        }
    }
}

impl Drop for Raw<'_> {
    fn drop(&mut self) {
        if let Raw::Pooled(b, pool) = self {
            pool.give(std::mem::take(b));
        }
    }
}

/// [`unsnappy`] into a buffer of `pool`, which it goes back to when the
/// body is dropped (or at once, when the body is refused).
fn unsnappy_pooled<'p>(body: &[u8], max: usize, pool: &'p BufferPool) -> Result<Raw<'p>, IngestError> {
    let mut buf = pool.take();
    match unsnappy_into(body, max, &mut buf) {
        Ok(()) => Ok(Raw::Pooled(buf, pool)),
        Err(e) => {
            pool.give(buf);
            Err(e)
        }
    }
}

/// The body of a protobuf push: snappy unless `Content-Encoding` names
/// gzip or zstd (undone within the limits) or identity.
fn protobuf_body<'p>(receivers: &'p Receivers, headers: &HeaderMap, body: Bytes) -> Result<Raw<'p>, IngestError> {
    let max = receivers.config.max_message_bytes;
    match header_str(headers, header::CONTENT_ENCODING).map(|v| v.trim().to_ascii_lowercase()) {
        None => unsnappy_pooled(&body, max, &receivers.buffers),
        Some(e) if e.is_empty() || e == "snappy" => unsnappy_pooled(&body, max, &receivers.buffers),
        Some(other) => {
            let encoding = crate::body::parse_encoding(Some(&other)).map_err(body_error)?;
            crate::body::decode_body(body, encoding, receivers.config.max_wire_bytes, max)
                .map(Raw::Bytes)
                .map_err(body_error)
        }
    }
}

/// Memory reserved for a protobuf push's views (label pairs, samples,
/// entries, symbol references) per wire byte on its first reading: real
/// requests take one to two.
const VIEWS_PER_BYTE: u64 = 8;
/// The least reserved for a first reading, so a small request is never
/// read twice.
const VIEWS_FLOOR: u64 = 64 << 10;

/// Reads a decompressed protobuf push with `read`, its views metered
/// against memory taken from the in-flight budget before reading: first
/// [`VIEWS_PER_BYTE`] per wire byte, and for a request that needs more
/// (millions of empty labels or entries, many times their wire size) the
/// whole per-request limit, past which it is refused 413 naming `what`.
async fn read_metered<P>(
    receivers: &Receivers,
    held: &mut Budget,
    wire: usize,
    what: &str,
    read: impl Fn(Meter) -> Result<P, ReadError>,
) -> Result<P, IngestError> {
    let (limit, flag) = receivers.decoded_limit();
    let mut views = (VIEWS_PER_BYTE * wire as u64).max(VIEWS_FLOOR).min(limit);
    loop {
        receivers
            .reserve(held, views, || format!("{wire} bytes of {what}"))
            .await?;
        match read(Meter::new(views as usize)) {
            Ok(p) => return Ok(p),
            Err(ReadError::Invalid(m)) => return Err(IngestError::Invalid(m)),
            Err(ReadError::OverBudget { .. }) if views < limit => views = limit,
            Err(ReadError::OverBudget { used }) => {
                return Err(IngestError::DecodedTooLarge {
                    what: format!("{what} of {wire} bytes with more labels, samples or entries than fit"),
                    estimate: Meter::held(used),
                    limit,
                    flag,
                });
            }
        }
    }
}

/// 204, or 400 with what was refused (the rest was written).
fn answer(refused: Option<String>) -> Response {
    match refused {
        Some(m) => (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{m}\n"),
        )
            .into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// Takes what the OTLP request will cost to decode (`census`, counted on
/// the other protocol's request, an upper bound of the OTLP's) from the
/// in-flight budget, beside what `held` already holds for the request
/// read, has `write` write it (payload, the records it holds, what it
/// holds) and submits it, counted as `census` with those records, when it
/// holds any; returns what it holds and the shards' account of rows they
/// refused, if any.
async fn submit_written<W>(
    receivers: &Receivers,
    signal: Signal,
    tenant: TenantId,
    census: Census,
    held: &mut Budget,
    arrival: Arrival,
    write: impl FnOnce() -> (Vec<u8>, u64, W),
) -> Result<(W, Option<String>), IngestError> {
    receivers
        .reserve(held, census.decoded_bytes(signal) + held.bytes(), || {
            census.describe(signal)
        })
        .await?;
    let (payload, records, written) = write();
    if records == 0 {
        return Ok((written, None));
    }
    let read = Instant::now();
    let census = Census { records, ..census };
    let appended = receivers
        .submit_counted(signal, tenant, Bytes::from(payload), held, &census)
        .await?;
    arrival.accepted(receivers.pipeline.metrics(), signal, read);
    let refused = (appended.rejected_total() > 0)
        .then(|| appended.message(&receivers.pipeline.limits()))
        .flatten();
    Ok((written, refused))
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
        let mut held = Budget::default();
        let mut parsed = read_metered(receivers, &mut held, raw.len(), "remote write request", |meter| {
            crate::prom::Parsed::read_within(version, &raw, meter)
        })
        .await?;
        parsed.apply_kinds(&receivers.kinds, &tenant);
        let census = parsed.census();
        let window = receivers.pipeline.window();
        let (written, shards) = submit_written(receivers, Signal::Metrics, tenant, census, &mut held, arrival, || {
            let (payload, written) = parsed.write(window);
            (payload, written.points(), written)
        })
        .await?;
        Ok((parsed.refused.message().or(shards), written))
    })
    .await;
    match result {
        Ok((message, written)) => {
            let mut r = answer(message);
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
    let media = media_type(headers);
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
            Raw::Bytes(
                crate::body::decode_body(
                    body,
                    encoding,
                    receivers.config.max_wire_bytes,
                    receivers.config.max_message_bytes,
                )
                .map_err(body_error)?,
            )
        } else {
            protobuf_body(receivers, headers, body)?
        };
        let mut held = Budget::default();
        let rules = crate::loki::Rules::of(&receivers.limits.get(&tenant));
        let mut parsed = if json {
            // serde builds the streams and entries: bounded before it does.
            let objects = crate::records::json_objects(&raw);
            let estimate = crate::records::json_decoded_bytes(objects, raw.len());
            receivers
                .reserve(&mut held, estimate, || format!("{objects} JSON objects"))
                .await?;
            crate::loki::Parsed::json_under(&raw, rules).map_err(IngestError::Invalid)?
        } else {
            read_metered(receivers, &mut held, raw.len(), "Loki push request", |meter| {
                crate::loki::Parsed::protobuf_within(&raw, meter, rules)
            })
            .await?
        };
        let census = parsed.census();
        let window = receivers.pipeline.window();
        let (_, shards) = submit_written(receivers, Signal::Logs, tenant, census, &mut held, arrival, || {
            let (payload, written) = parsed.write(window);
            (payload, written, written)
        })
        .await?;
        Ok(parsed.message().or(shards))
    })
    .await;
    match result {
        Ok(message) => answer(message),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Bodies undone one after another into the same pooled buffer, larger
    /// and smaller, each come out as they went in (no byte of an earlier
    /// body left), and a malformed or oversized one is refused.
    #[test]
    fn pooled_snappy_buffers_hold_only_their_own_body() {
        let pool = BufferPool::default();
        let snappy = |b: &[u8]| snap::raw::Encoder::new().compress_vec(b).expect("compress");
        let bodies: Vec<Vec<u8>> = [1000usize, 50, 200_000, 3, 0, 70_000]
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (i * 31 + j * 7) as u8).collect())
            .collect();
        for b in &bodies {
            let raw = unsnappy_pooled(&snappy(b), 1 << 20, &pool).expect("undone");
            assert_eq!(&raw[..], &b[..]);
            drop(raw);
            assert_eq!(pool.0.lock().expect("pool").len(), 1, "the one buffer came back");
        }
        let e = unsnappy_pooled(b"\x10garbage", 1 << 20, &pool)
            .err()
            .expect("malformed");
        assert!(e.to_string().contains("malformed snappy body"), "{e}");
        let e = unsnappy_pooled(&snappy(&bodies[2]), 1000, &pool).err().expect("over");
        assert!(
            matches!(
                e,
                IngestError::TooLarge {
                    bytes: 200_000,
                    limit: 1000
                }
            ),
            "{e:?}"
        );
        assert_eq!(unsnappy(&snappy(&bodies[0]), 1 << 20).expect("undone"), bodies[0]);
    }
}
