//! `mira-compactor`: rewrites the blocks ingesters publish so the object
//! count per partition stays bounded and old hours reach the cold tier.
//!
//! - [`planner`]: pure; from the catalog's blocks and the time, which
//!   partitions to merge (hot tiering), rewrite cold, or purge.
pub mod planner;
