//! Errors of the ingester.

use std::path::Path;

/// Why a WAL operation failed. Clonable so one failed group write can fail
/// every append in it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum WalError {
    #[error("WAL I/O on {path}: {message}")]
    Io { path: String, message: String },
    #[error("the WAL writer has stopped")]
    Stopped,
}

impl WalError {
    pub(crate) fn io(path: &Path, e: std::io::Error) -> WalError {
        WalError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }
}
