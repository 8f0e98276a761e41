//! The crate's error type. Each large module has its own enum; this one
//! wraps them so callers of `mira-core` match on one type.

/// Errors from `mira-core`. Every variant says what was wrong and carries
/// the value or id involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid tenant id {0:?}: expected 1-128 characters of [A-Za-z0-9_.-]")]
    InvalidTenant(String),
    #[error("invalid block id {0:?}: expected a ULID")]
    InvalidBlockId(String),
    #[error("invalid signal {0:?}: expected logs, traces or metrics")]
    InvalidSignal(String),
    #[error(transparent)]
    Block(#[from] crate::block::BlockError),
    #[error(transparent)]
    Convert(#[from] crate::convert::ConvertError),
    #[error(transparent)]
    Sidecar(#[from] crate::sidecar::SidecarError),
    #[error(transparent)]
    Scan(#[from] crate::scan::ScanError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

impl Error {
    /// True when the error was caused by the input (bad request, bad file)
    /// rather than by this process; maps to 400 / INVALID_ARGUMENT.
    pub fn is_invalid_input(&self) -> bool {
        match self {
            Error::InvalidTenant(_) | Error::InvalidBlockId(_) | Error::InvalidSignal(_) | Error::Convert(_) => true,
            Error::Block(e) => e.is_corrupt(),
            Error::Sidecar(_) => true,
            Error::Scan(_) => true,
            Error::Arrow(_) => false,
        }
    }
}
