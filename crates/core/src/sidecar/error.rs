//! What can go wrong building or decoding a sidecar.

use crate::convert::ConvertError;

/// Errors building sidecars from a block's tables, or decoding a sidecar
/// section. Decoding errors mean the section is not what this version
/// writes (a corrupt or foreign block).
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    /// The block's tables lack a table the sidecars are built from.
    #[error("building sidecars: {0}")]
    Table(#[from] ConvertError),
    /// A table or sidecar section lacks a column.
    #[error("{table} has no column {column}")]
    MissingColumn { table: &'static str, column: &'static str },
    /// A table or sidecar section column has another type than expected.
    #[error("{table} column {column} has an unexpected type")]
    WrongType { table: &'static str, column: &'static str },
    /// A table row refers to a dictionary entry or union child slot that
    /// does not exist.
    #[error("table {table} row {row}: {reason}")]
    CorruptTable {
        table: &'static str,
        row: usize,
        reason: &'static str,
    },
    /// A row of a sidecar section breaks the section's rules.
    #[error("section {section} row {row}: {reason}")]
    InvalidEntry {
        section: &'static str,
        row: usize,
        reason: String,
    },
    /// The Bloom section ends before what its header announces.
    #[error("id_bloom section is {len} bytes, shorter than the {needed} bytes its header requires")]
    BloomTruncated { needed: u64, len: usize },
    /// The Bloom section does not start with the expected magic.
    #[error("id_bloom section does not start with the MIBF magic")]
    BloomMagic,
    /// The Bloom section was written by an unknown format version.
    #[error("id_bloom section has format version {0}, this build reads version 1 only")]
    BloomVersion(u8),
    /// The Bloom section's structure is invalid.
    #[error("id_bloom section at byte {offset}: {reason}")]
    InvalidBloom { offset: usize, reason: &'static str },
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}
