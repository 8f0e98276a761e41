//! [`IngesterLease`] → `pb::IngesterLease`.

use mira_proto::catalog as pb;

use crate::model::IngesterLease;

impl From<&IngesterLease> for pb::IngesterLease {
    fn from(i: &IngesterLease) -> pb::IngesterLease {
        pb::IngesterLease {
            ingester_id: i.ingester_id.clone(),
            address: i.address.clone(),
            expires_at_ns: i.expires_at_ns,
        }
    }
}
