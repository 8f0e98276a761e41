//! [`Change`] → `pb::Change`, as a watch delivers it.

use mira_proto::catalog as pb;

use crate::state::Change;

impl From<&Change> for pb::Change {
    fn from(change: &Change) -> pb::Change {
        use pb::change::Change as C;
        let c = match change {
            Change::Block(b) => C::Block(b.into()),
            Change::Purged(id) => C::PurgedBlockId(id.to_string()),
            Change::Watermark(w) => C::Watermark(w.into()),
            Change::Ingester(i) => C::Ingester(i.into()),
            Change::LeaseSet(l) => C::LeaseSet(l.into()),
            Change::LeaseReleased(k) => C::LeaseReleased(k.clone()),
            Change::PolicySet(p) => C::PolicySet(p.into()),
            Change::PolicyDeleted(p) => C::PolicyDeleted(p.into()),
        };
        pb::Change { change: Some(c) }
    }
}
