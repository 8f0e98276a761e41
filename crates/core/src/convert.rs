//! Placeholder: being written.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("bad")]
    Bad,
}
