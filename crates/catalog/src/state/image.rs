//! The serialized forms of [`super::State`] inside a snapshot, by version.
//!
//! Version 2 ([`StateImage`]) is one postcard struct holding everything.
//! Version 1 ([`v1`]) is what releases before quarantine marks and lease
//! jobs wrote: the first-release fields, then an extension struct
//! appended after them. Both are read; only version 2 is written. How the
//! versions are told apart on disk is
//! [`crate::state_machine::decode_image`]'s.

use mira_core::ids::BlockId;
use serde::{Deserialize, Serialize};

use super::StagedPublish;
use crate::model::{
    BlockRecord, IngesterLease, Lease, OffloadCopy, Policy, PolicyKind, TargetCheck, Watermark, stored,
};

/// The serialized form of [`super::State`] inside a snapshot (image
/// version 2). Persisted: fields are only ever appended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateImage {
    /// Ordered by id. Their quarantine marks are in `no_compact`.
    pub blocks: Vec<BlockRecord>,
    pub watermarks: Vec<Watermark>,
    pub ingesters: Vec<IngesterLease>,
    /// With their job manifests.
    pub leases: Vec<Lease>,
    pub policies: Vec<Policy>,
    /// Recently purged (and abandoned) ids, oldest first.
    #[serde(with = "stored::block_ids")]
    pub purged: Vec<BlockId>,
    pub epochs: Vec<(String, u64)>,
    pub staged: Vec<(u128, StagedPublish)>,
    /// Quarantined blocks, ordered by id.
    pub no_compact: Vec<NoCompactMark>,
    /// Serialized after the fields above (images written before it ended
    /// there): see [`StateImageExt`].
    #[serde(skip)]
    pub ext: StateImageExt,
    /// Serialized after `ext` (images written before it end there):
    /// registered catalog members, id → data-directory incarnation.
    #[serde(skip)]
    pub members: Vec<(u64, String)>,
    /// Serialized after `members` (images written before it ended there):
    /// see [`StateImageExt2`].
    #[serde(skip)]
    pub ext2: StateImageExt2,
}

/// What version 2 images gained after their first release, serialized
/// right after [`StateImage`]; absent (all empty) in images written before.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateImageExt {
    /// Blocks with an offload copy, ordered by id.
    pub offload: Vec<OffloadMark>,
    /// What enforcing each policy did last: (kind, name, status JSON).
    pub policy_status: Vec<(PolicyKind, String, String)>,
    /// Registered offload target names.
    pub offload_targets: Vec<String>,
}

/// What version 2 images gained after [`StateImageExt`] and the member
/// registrations were released, serialized right after those; absent (all empty) in images written before.
/// (Postcard is not self-describing: a field added to `StateImageExt`
/// would make the images written before unreadable, so each addition is a
/// struct of its own, appended.)
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateImageExt2 {
    /// The last reachability check of each offload target, by name.
    pub offload_target_checks: Vec<TargetCheck>,
}

/// One block's offload copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadMark {
    #[serde(with = "stored::block_id")]
    pub id: BlockId,
    pub copy: OffloadCopy,
}

/// One block quarantined from compaction, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoCompactMark {
    #[serde(with = "stored::block_id")]
    pub id: BlockId,
    pub reason: String,
}

/// Image version 1, exactly as it was encoded: kept to read snapshots
/// written before version 2, and never written.
pub mod v1 {
    use super::*;

    /// A lease before job manifests.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Lease {
        pub key: String,
        pub holder: String,
        pub expires_at_ns: i64,
    }

    /// The first release's image.
    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct StateImage {
        pub blocks: Vec<BlockRecord>,
        pub watermarks: Vec<Watermark>,
        pub ingesters: Vec<IngesterLease>,
        pub leases: Vec<Lease>,
        pub policies: Vec<Policy>,
        #[serde(with = "stored::block_ids")]
        pub purged: Vec<BlockId>,
    }

    /// Serialized right after [`StateImage`]; absent in the first
    /// release's snapshots.
    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct StateImageExt {
        pub epochs: Vec<(String, u64)>,
        pub staged: Vec<(u128, StagedPublish)>,
    }

    /// A version 1 image as version 2: no lease has a job and no block is
    /// quarantined.
    pub fn migrate(image: StateImage, ext: StateImageExt) -> super::StateImage {
        super::StateImage {
            blocks: image.blocks,
            watermarks: image.watermarks,
            ingesters: image.ingesters,
            leases: image
                .leases
                .into_iter()
                .map(|l| crate::model::Lease {
                    key: l.key,
                    holder: l.holder,
                    expires_at_ns: l.expires_at_ns,
                    job: String::new(),
                })
                .collect(),
            policies: image.policies,
            purged: image.purged,
            epochs: ext.epochs,
            staged: ext.staged,
            no_compact: Vec::new(),
            ext: super::StateImageExt::default(),
            members: Vec::new(),
            ext2: super::StateImageExt2::default(),
        }
    }
}
