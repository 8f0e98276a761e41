//! Placeholder: being written.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("corrupt")]
    Corrupt,
}
impl BlockError {
    pub fn is_corrupt(&self) -> bool {
        true
    }
}
