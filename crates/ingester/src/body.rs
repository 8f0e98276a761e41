//! Request bodies before decoding: the `Content-Encoding` (gzip, zstd or
//! none) undone with a hard limit on the decompressed size, so a
//! compression bomb is refused without being inflated past the limit.

use std::io::Read;

/// How a request body is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
    Zstd,
}

/// Why a body was refused; each maps to HTTP 400/413/415 or
/// INVALID_ARGUMENT / RESOURCE_EXHAUSTED.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("unsupported content encoding {0:?}: expected gzip, zstd or identity")]
    UnsupportedEncoding(String),
    #[error("request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("request body decompresses to more than {limit} bytes")]
    DecompressedTooLarge { limit: usize },
    #[error("malformed {encoding} body: {reason}")]
    Malformed { encoding: &'static str, reason: String },
}

/// Parses a `Content-Encoding` (or `grpc-encoding`) header value.
pub fn parse_encoding(value: Option<&str>) -> Result<Encoding, BodyError> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("identity") => Ok(Encoding::Identity),
        Some("gzip") | Some("x-gzip") => Ok(Encoding::Gzip),
        Some("zstd") => Ok(Encoding::Zstd),
        Some(other) => Err(BodyError::UnsupportedEncoding(other.chars().take(64).collect())),
    }
}

/// The largest zstd window (log2 bytes) a body may ask the decoder to
/// allocate: the smallest power of two holding `max_decoded`, at least
/// 8 MiB (what common encoders use) and at most zstd's default of 128 MiB.
/// A frame asking for more is refused before anything is allocated.
pub fn zstd_window_log(max_decoded: usize) -> u32 {
    (usize::BITS - max_decoded.saturating_sub(1).leading_zeros()).clamp(23, 27)
}

/// Undoes `encoding`, refusing bodies whose compressed size exceeds
/// `max_wire` or whose decompressed size exceeds `max_decoded`. Never
/// holds more than `max_decoded + 1` decompressed bytes.
pub fn decode_body(
    body: bytes::Bytes,
    encoding: Encoding,
    max_wire: usize,
    max_decoded: usize,
) -> Result<bytes::Bytes, BodyError> {
    if body.len() > max_wire {
        return Err(BodyError::TooLarge { limit: max_wire });
    }
    let (name, reader): (&'static str, Box<dyn Read + '_>) = match encoding {
        Encoding::Identity => {
            if body.len() > max_decoded {
                return Err(BodyError::DecompressedTooLarge { limit: max_decoded });
            }
            return Ok(body);
        }
        Encoding::Gzip => ("gzip", Box::new(flate2::read::MultiGzDecoder::new(&body[..]))),
        Encoding::Zstd => match zstd::stream::read::Decoder::new(&body[..]).and_then(|mut d| {
            d.window_log_max(zstd_window_log(max_decoded))?;
            Ok(d)
        }) {
            Ok(d) => ("zstd", Box::new(d)),
            Err(e) => {
                return Err(BodyError::Malformed {
                    encoding: "zstd",
                    reason: e.to_string(),
                });
            }
        },
    };
    let mut out = Vec::with_capacity((body.len() * 4).min(max_decoded));
    let limit = u64::try_from(max_decoded).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|e| BodyError::Malformed {
            encoding: name,
            reason: e.to_string(),
        })?;
    if out.len() > max_decoded {
        return Err(BodyError::DecompressedTooLarge { limit: max_decoded });
    }
    Ok(bytes::Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(data: &[u8]) -> bytes::Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("gzip");
        bytes::Bytes::from(e.finish().expect("finish"))
    }

    #[test]
    fn encodings_round_trip() {
        let data = b"hello otlp".repeat(100);
        let z = bytes::Bytes::from(zstd::encode_all(&data[..], 3).expect("zstd"));
        assert_eq!(
            &decode_body(gzip(&data), Encoding::Gzip, 1 << 20, 1 << 20).expect("gzip")[..],
            &data[..]
        );
        assert_eq!(
            &decode_body(z, Encoding::Zstd, 1 << 20, 1 << 20).expect("zstd")[..],
            &data[..]
        );
        let plain = bytes::Bytes::from(data.clone());
        assert_eq!(
            decode_body(plain.clone(), Encoding::Identity, 1 << 20, 1 << 20).expect("plain"),
            plain
        );
    }

    #[test]
    fn bombs_are_refused_at_the_limit() {
        // 64 MiB of zeros compress to a few tens of KiB.
        let zeros = vec![0u8; 64 << 20];
        let limit = 1 << 20;
        let g = gzip(&zeros);
        assert!(g.len() < 1 << 20);
        assert_eq!(
            decode_body(g, Encoding::Gzip, 16 << 20, limit),
            Err(BodyError::DecompressedTooLarge { limit })
        );
        let z = bytes::Bytes::from(zstd::encode_all(&zeros[..], 1).expect("zstd"));
        assert_eq!(
            decode_body(z, Encoding::Zstd, 16 << 20, limit),
            Err(BodyError::DecompressedTooLarge { limit })
        );
    }

    #[test]
    fn a_zstd_frame_asking_for_a_larger_window_is_refused() {
        assert_eq!(zstd_window_log(16 << 20), 24);
        assert_eq!(zstd_window_log(1 << 10), 23);
        assert_eq!(zstd_window_log(usize::MAX), 27);
        // A frame compressed with a 128 MiB window (long-distance mode)
        // and no content size: the decoder would allocate the window.
        let data = vec![7u8; 1 << 20];
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).expect("encoder");
        e.window_log(27).expect("window");
        e.long_distance_matching(true).expect("ldm");
        e.include_contentsize(false).expect("no size");
        e.write_all(&data).expect("write");
        let z = bytes::Bytes::from(e.finish().expect("finish"));
        let err = decode_body(z.clone(), Encoding::Zstd, 16 << 20, 16 << 20).expect_err("window refused");
        assert!(err.to_string().contains("malformed zstd"), "{err}");
        // The same frame is read when the limit allows its window.
        assert_eq!(
            decode_body(z, Encoding::Zstd, 16 << 20, 1 << 30).expect("read").len(),
            data.len()
        );
    }

    #[test]
    fn oversized_and_malformed_bodies_name_the_problem() {
        let big = bytes::Bytes::from(vec![1u8; 2048]);
        assert_eq!(
            decode_body(big.clone(), Encoding::Identity, 1024, 1 << 20),
            Err(BodyError::TooLarge { limit: 1024 })
        );
        assert_eq!(
            decode_body(big, Encoding::Identity, 1 << 20, 1024),
            Err(BodyError::DecompressedTooLarge { limit: 1024 })
        );
        let junk = bytes::Bytes::from_static(b"\x1f\x8b\x08\x00garbage that is not deflate");
        let err = decode_body(junk.clone(), Encoding::Gzip, 1 << 20, 1 << 20).expect_err("gzip junk");
        assert!(err.to_string().contains("malformed gzip"), "{err}");
        let err = decode_body(junk, Encoding::Zstd, 1 << 20, 1 << 20).expect_err("zstd junk");
        assert!(err.to_string().contains("malformed zstd"), "{err}");
        let err = parse_encoding(Some("br")).expect_err("brotli");
        assert!(err.to_string().contains("\"br\""), "{err}");
        assert_eq!(parse_encoding(Some(" GZIP ")), Ok(Encoding::Gzip));
        assert_eq!(parse_encoding(None), Ok(Encoding::Identity));
    }
}
