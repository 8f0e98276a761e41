//! [`Watermark`] ↔ `pb::Watermark`.

use mira_proto::catalog as pb;

use crate::model::Watermark;

impl From<&Watermark> for pb::Watermark {
    fn from(w: &Watermark) -> pb::Watermark {
        pb::Watermark {
            ingester_id: w.ingester_id.clone(),
            shard: w.shard,
            wal_seq: w.wal_seq,
        }
    }
}

impl From<&pb::Watermark> for Watermark {
    fn from(w: &pb::Watermark) -> Watermark {
        Watermark {
            ingester_id: w.ingester_id.clone(),
            shard: w.shard,
            wal_seq: w.wal_seq,
        }
    }
}
