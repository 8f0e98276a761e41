//! [`Lease`] → `pb::Lease`.

use mira_proto::catalog as pb;

use crate::model::Lease;

impl From<&Lease> for pb::Lease {
    fn from(l: &Lease) -> pb::Lease {
        pb::Lease {
            key: l.key.clone(),
            holder: l.holder.clone(),
            expires_at_ns: l.expires_at_ns,
            job: l.job.clone(),
        }
    }
}
