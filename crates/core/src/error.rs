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
    #[error("cannot merge these blocks: {0}")]
    Merge(String),
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// The work's request was cancelled (timed out or abandoned) and the
    /// work stopped early; its partial result means nothing.
    #[error("cancelled: the request was dropped")]
    Cancelled,
}

impl Error {
    /// True when the error was caused by the caller's input (a bad OTLP
    /// request, a bad query); maps to 400 / INVALID_ARGUMENT. Damaged or
    /// foreign blocks are not the caller's fault and map to 500.
    pub fn is_invalid_input(&self) -> bool {
        match self {
            Error::InvalidTenant(_)
            | Error::InvalidBlockId(_)
            | Error::InvalidSignal(_)
            | Error::Scan(_)
            | Error::Policy(_) => true,
            Error::Convert(e) => e.is_invalid_input(),
            Error::Block(_) | Error::Sidecar(_) | Error::Arrow(_) | Error::Merge(_) | Error::Cancelled => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::ConvertError;

    #[test]
    fn input_faults_and_damaged_blocks_are_told_apart() {
        assert!(Error::InvalidTenant("a/b".into()).is_invalid_input());
        assert!(
            Error::Convert(ConvertError::InvalidId {
                field: "trace_id",
                expected: 16,
                len: 3
            })
            .is_invalid_input()
        );
        assert!(Error::Convert(ConvertError::Protobuf("truncated".into())).is_invalid_input());
        assert!(!Error::Convert(ConvertError::MissingTable("logs")).is_invalid_input());
        assert!(!Error::Block(crate::block::BlockError::TooShort { len: 3 }).is_invalid_input());
    }
}
