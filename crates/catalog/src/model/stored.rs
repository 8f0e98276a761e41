//! How typed ids are stored in the Raft log and in snapshots (postcard):
//! exactly as the plain fields they replaced, so every log entry and
//! snapshot an earlier release wrote reads back unchanged (see
//! `tests/compat.rs` and the layout test in `model`). A block id is its
//! `u128`, a signal its one-byte [`Signal::code`], a tenant its string.
//! Used with `#[serde(with = "...")]` on each persisted field; the id
//! types themselves carry no serde form.

use mira_core::ids::{BlockId, Signal, TenantId};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};

/// A [`BlockId`] as its `u128`.
pub mod block_id {
    use super::*;

    pub fn serialize<S: Serializer>(id: &BlockId, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u128(id.as_u128())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BlockId, D::Error> {
        u128::deserialize(d).map(BlockId::from_u128)
    }
}

/// A list of [`BlockId`]s as a list of `u128`s.
pub mod block_ids {
    use super::*;

    pub fn serialize<S: Serializer>(ids: &[BlockId], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(ids.iter().map(|id| id.as_u128()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<BlockId>, D::Error> {
        let raw = Vec::<u128>::deserialize(d)?;
        Ok(raw.into_iter().map(BlockId::from_u128).collect())
    }
}

/// A [`Signal`] as its one-byte code.
pub mod signal {
    use super::*;

    pub fn serialize<S: Serializer>(signal: &Signal, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(signal.code())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Signal, D::Error> {
        let code = u8::deserialize(d)?;
        Signal::from_code(code).ok_or_else(|| D::Error::custom(format!("unknown signal code {code}")))
    }
}

/// A [`TenantId`] as its string, checked again when read.
pub mod tenant {
    use super::*;

    pub fn serialize<S: Serializer>(tenant: &TenantId, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(tenant.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<TenantId, D::Error> {
        let raw = String::deserialize(d)?;
        TenantId::new(&raw).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    //! The typed records encode to exactly the bytes of the plain layout
    //! they replaced (mirrored here field by field, as the release before
    //! typed ids declared it), and those bytes decode to the typed records.

    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::model::{BlockRecord, BlockState, Command, IngesterLease, Level, Policy, PolicyKind, Watermark};
    use crate::state::image::v1::{Lease, StateImage};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct PlainBlockRecord {
        id: u128,
        tenant: String,
        signal: u8,
        partition_start_ns: i64,
        min_time_ns: i64,
        max_time_ns: i64,
        rows: u64,
        bytes: u64,
        level: Level,
        object_key: String,
        created_at_ns: i64,
        state: BlockState,
    }

    /// The first variants of `Command`, in order (the index is encoded).
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum PlainCommand {
        Publish {
            blocks: Vec<PlainBlockRecord>,
            watermark: Option<Watermark>,
        },
        Replace {
            add: Vec<PlainBlockRecord>,
            tombstone: Vec<u128>,
            now_ns: i64,
            lease: Option<(String, String)>,
        },
        Tombstone {
            ids: Vec<u128>,
            now_ns: i64,
        },
        Purge {
            ids: Vec<u128>,
        },
        MarkOffloaded {
            id: u128,
            location: String,
        },
        MarkRestored {
            id: u128,
        },
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct PlainStateImage {
        blocks: Vec<PlainBlockRecord>,
        watermarks: Vec<Watermark>,
        ingesters: Vec<IngesterLease>,
        leases: Vec<Lease>,
        policies: Vec<Policy>,
        purged: Vec<u128>,
    }

    /// A ULID whose `u128` needs the full varint width.
    const BIG: u128 = u128::MAX - 12_345;

    fn typed(id: u128, signal: Signal, state: BlockState) -> BlockRecord {
        BlockRecord {
            id: BlockId::from_u128(id),
            tenant: TenantId::new("team-a.prod_1").expect("tenant"),
            signal,
            partition_start_ns: 3_600_000_000_000,
            min_time_ns: 3_600_000_000_017,
            max_time_ns: 3_600_000_000_099,
            rows: 12,
            bytes: 3456,
            level: Level::Cold,
            object_key: "team-a.prod_1/traces/x.mira".into(),
            created_at_ns: 42,
            state,
            no_compact: None,
            offload: None,
        }
    }

    /// The plain record holding what `b` holds, field by field.
    fn plain_of(b: &BlockRecord) -> PlainBlockRecord {
        PlainBlockRecord {
            id: b.id.as_u128(),
            tenant: b.tenant.as_str().to_owned(),
            signal: b.signal.code(),
            partition_start_ns: b.partition_start_ns,
            min_time_ns: b.min_time_ns,
            max_time_ns: b.max_time_ns,
            rows: b.rows,
            bytes: b.bytes,
            level: b.level,
            object_key: b.object_key.clone(),
            created_at_ns: b.created_at_ns,
            state: b.state.clone(),
        }
    }

    fn same_bytes<T, P>(typed: &T, plain: &P)
    where
        T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
        P: Serialize,
    {
        let old = postcard::to_stdvec(plain).expect("encode plain");
        assert_eq!(postcard::to_stdvec(typed).expect("encode typed"), old);
        assert_eq!(&postcard::from_bytes::<T>(&old).expect("decode plain bytes"), typed);
    }

    #[test]
    fn typed_records_keep_the_plain_encoding() {
        for (id, signal) in [(1, Signal::Logs), (BIG, Signal::Traces), (1 << 100, Signal::Metrics)] {
            for state in [
                BlockState::Live,
                BlockState::Tombstoned { at_ns: 7 },
                BlockState::Offloaded {
                    location: "s3://cold/x".into(),
                },
            ] {
                let record = typed(id, signal, state);
                same_bytes(&record, &plain_of(&record));
                // The quarantine mark is kept beside the record, never in it.
                let marked = BlockRecord {
                    no_compact: Some("decode error".into()),
                    offload: None,
                    ..record.clone()
                };
                assert_eq!(
                    postcard::to_stdvec(&marked).expect("encode marked"),
                    postcard::to_stdvec(&plain_of(&record)).expect("encode plain")
                );
            }
        }
        let ids = [0, 1, 300, BIG];
        let typed_ids: Vec<BlockId> = ids.iter().copied().map(BlockId::from_u128).collect();
        let lease = Some(("compaction".to_owned(), "c-1".to_owned()));
        let (metrics, logs) = (
            typed(5, Signal::Metrics, BlockState::Live),
            typed(BIG, Signal::Logs, BlockState::Live),
        );
        let pairs = [
            (
                Command::Publish {
                    blocks: vec![metrics.clone()],
                    watermark: None,
                },
                PlainCommand::Publish {
                    blocks: vec![plain_of(&metrics)],
                    watermark: None,
                },
            ),
            (
                Command::Replace {
                    add: vec![logs.clone()],
                    tombstone: typed_ids.clone(),
                    now_ns: 9,
                    lease: lease.clone(),
                },
                PlainCommand::Replace {
                    add: vec![plain_of(&logs)],
                    tombstone: ids.to_vec(),
                    now_ns: 9,
                    lease,
                },
            ),
            (
                Command::Tombstone {
                    ids: typed_ids.clone(),
                    now_ns: 11,
                },
                PlainCommand::Tombstone {
                    ids: ids.to_vec(),
                    now_ns: 11,
                },
            ),
            (
                Command::Purge { ids: typed_ids.clone() },
                PlainCommand::Purge { ids: ids.to_vec() },
            ),
            (
                Command::MarkOffloaded {
                    id: BlockId::from_u128(BIG),
                    location: "s3://cold/y".into(),
                },
                PlainCommand::MarkOffloaded {
                    id: BIG,
                    location: "s3://cold/y".into(),
                },
            ),
            (
                Command::MarkRestored {
                    id: BlockId::from_u128(BIG),
                },
                PlainCommand::MarkRestored { id: BIG },
            ),
        ];
        for (typed, plain) in &pairs {
            same_bytes(typed, plain);
        }

        let image = StateImage {
            blocks: vec![typed(2, Signal::Traces, BlockState::Live)],
            policies: vec![Policy {
                kind: PolicyKind::Retention,
                name: "default".into(),
                tenant: String::new(),
                body_json: "{}".into(),
            }],
            purged: typed_ids,
            ..Default::default()
        };
        let old = postcard::to_stdvec(&PlainStateImage {
            blocks: image.blocks.iter().map(plain_of).collect(),
            watermarks: vec![],
            ingesters: vec![],
            leases: vec![],
            policies: image.policies.clone(),
            purged: ids.to_vec(),
        })
        .expect("encode plain image");
        assert_eq!(postcard::to_stdvec(&image).expect("encode image"), old);
        let back: StateImage = postcard::from_bytes(&old).expect("decode plain image");
        assert_eq!((back.blocks, back.purged), (image.blocks, image.purged));
    }

    #[test]
    fn stored_values_the_types_forbid_are_refused() {
        let good = typed(1, Signal::Logs, BlockState::Live);
        let bad_signal = PlainBlockRecord {
            signal: 4,
            ..plain_of(&good)
        };
        let bytes = postcard::to_stdvec(&bad_signal).expect("encode");
        assert!(postcard::from_bytes::<BlockRecord>(&bytes).is_err());
        let bad_tenant = PlainBlockRecord {
            tenant: "../etc".into(),
            ..plain_of(&good)
        };
        let bytes = postcard::to_stdvec(&bad_tenant).expect("encode");
        assert!(postcard::from_bytes::<BlockRecord>(&bytes).is_err());
    }
}
