//! Writing OTLP protobuf straight from another protocol's fields (the
//! remote-write and Loki-push receivers, [`crate::prom`] and
//! [`crate::loki`]): the request the shards take is encoded field by
//! field, never built as prost structs first. A nested message is written
//! into the caller's buffer after a reserved length, which is filled in
//! when the message ends ([`Writer::end`]), so each byte is written once
//! and moved at most once per nesting level whose length needs more than
//! the one reserved byte.

use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

/// A protobuf message being written.
#[derive(Debug, Default)]
pub struct Writer {
    pub buf: Vec<u8>,
    /// Where each open nested message's content starts.
    open: Vec<usize>,
}

impl Writer {
    pub fn with_capacity(n: usize) -> Writer {
        Writer {
            buf: Vec::with_capacity(n),
            open: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Opens a nested message in field `field`; closed by [`Writer::end`].
    pub fn begin(&mut self, field: u32) {
        encode_key(field, WireType::LengthDelimited, &mut self.buf);
        // One byte reserved for the length: most leaf messages are short.
        self.buf.push(0);
        self.open.push(self.buf.len());
    }

    /// Closes the innermost open message, writing its length.
    pub fn end(&mut self) {
        let Some(start) = self.open.pop() else {
            return;
        };
        let len = self.buf.len() - start;
        let need = encoded_len_varint(len as u64);
        if need == 1 {
            self.buf[start - 1] = len as u8;
            return;
        }
        let mut prefix = [0u8; 10];
        let mut p = &mut prefix[..];
        encode_varint(len as u64, &mut p);
        self.buf.splice(start - 1..start, prefix[..need].iter().copied());
    }

    pub fn bytes(&mut self, field: u32, v: &[u8]) {
        encode_key(field, WireType::LengthDelimited, &mut self.buf);
        encode_varint(v.len() as u64, &mut self.buf);
        self.buf.extend_from_slice(v);
    }

    pub fn string(&mut self, field: u32, v: &str) {
        self.bytes(field, v.as_bytes());
    }

    pub fn varint(&mut self, field: u32, v: u64) {
        encode_key(field, WireType::Varint, &mut self.buf);
        encode_varint(v, &mut self.buf);
    }

    pub fn sint32(&mut self, field: u32, v: i32) {
        self.varint(field, u64::from(((v << 1) ^ (v >> 31)) as u32));
    }

    pub fn fixed64(&mut self, field: u32, v: u64) {
        encode_key(field, WireType::SixtyFourBit, &mut self.buf);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn fixed32(&mut self, field: u32, v: u32) {
        encode_key(field, WireType::ThirtyTwoBit, &mut self.buf);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn double(&mut self, field: u32, v: f64) {
        self.fixed64(field, v.to_bits());
    }

    /// A `KeyValue { key, value: AnyValue { string_value } }` in `field`,
    /// its lengths computed, not reserved.
    pub fn kv_str(&mut self, field: u32, key: &str, value: &str) {
        // Most attributes: every length in one byte, the field in one.
        let (kl, vl) = (key.len(), value.len());
        if field < 16 && kl + vl + 6 < 0x80 {
            let any = 2 + vl as u8;
            let kv = 2 + kl as u8 + 2 + any;
            self.buf.reserve(2 + usize::from(kv));
            self.buf
                .extend_from_slice(&[(field << 3) as u8 | 2, kv, 0x0a, kl as u8]);
            self.buf.extend_from_slice(key.as_bytes());
            self.buf.extend_from_slice(&[0x12, any, 0x0a, vl as u8]);
            self.buf.extend_from_slice(value.as_bytes());
            return;
        }
        let any = 1 + encoded_len_varint(value.len() as u64) + value.len();
        let kv = 1 + encoded_len_varint(key.len() as u64) + key.len() + 1 + encoded_len_varint(any as u64) + any;
        encode_key(field, WireType::LengthDelimited, &mut self.buf);
        encode_varint(kv as u64, &mut self.buf);
        self.string(1, key);
        encode_key(2, WireType::LengthDelimited, &mut self.buf);
        encode_varint(any as u64, &mut self.buf);
        self.string(1, value);
    }

    /// The finished message (every nested one closed).
    pub fn finish(mut self) -> Vec<u8> {
        while !self.open.is_empty() {
            self.end();
        }
        self.buf
    }
}

/// The encoded size of [`Writer::kv_str`]'s field, key and length included.
pub fn kv_str_len(key: &str, value: &str) -> usize {
    let any = 1 + encoded_len_varint(value.len() as u64) + value.len();
    let kv = 1 + encoded_len_varint(key.len() as u64) + key.len() + 1 + encoded_len_varint(any as u64) + any;
    1 + encoded_len_varint(kv as u64) + kv
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
    use opentelemetry_proto::tonic::resource::v1::Resource;

    /// Nested messages of every length class, and string attributes,
    /// decode with prost as what they were written from.
    #[test]
    fn written_messages_decode_as_prost_encodes_them() {
        for n in [1usize, 40, 80, 81, 100, 127, 128, 300, 20_000] {
            let key = "k".repeat(n);
            let value = "v".repeat(n / 2 + 1);
            let mut w = Writer::default();
            w.begin(1);
            w.kv_str(1, &key, &value);
            w.begin(1);
            w.string(1, "inner");
            w.end();
            if n > 0 {
                w.varint(2, n as u64);
            }
            let out = w.finish();
            let want = Resource {
                attributes: vec![
                    KeyValue {
                        key: key.clone(),
                        key_strindex: 0,
                        value: Some(AnyValue {
                            value: Some(Value::StringValue(value.clone())),
                        }),
                    },
                    KeyValue {
                        key: "inner".into(),
                        key_strindex: 0,
                        value: None,
                    },
                ],
                dropped_attributes_count: n as u32,
                entity_refs: vec![],
            };
            let mut wrapped = Vec::new();
            prost::encoding::message::encode(1, &want, &mut wrapped);
            assert_eq!(out, wrapped, "n = {n}");
            assert_eq!(kv_str_len(&key, &value), {
                let mut w = Writer::default();
                w.kv_str(1, &key, &value);
                w.len()
            });
        }
    }
}
