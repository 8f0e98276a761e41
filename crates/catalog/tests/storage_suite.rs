//! openraft's own storage test suite against the redb log store and the
//! snapshot-backed state machine.

use mira_catalog::log_store::LogStore;
use mira_catalog::state_machine::StateMachine;
use mira_catalog::types::{StorageError, TypeConfig};

use openraft::testing::{StoreBuilder, Suite};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir()
            .map_err(|e| StorageError::from_io_error(openraft::ErrorSubject::Store, openraft::ErrorVerb::Write, e))?;
        let log = LogStore::open(&dir.path().join("log.redb")).map_err(|e| {
            StorageError::from_io_error(
                openraft::ErrorSubject::Store,
                openraft::ErrorVerb::Write,
                std::io::Error::other(e.to_string()),
            )
        })?;
        let sm = StateMachine::open(&dir.path().join("state")).map_err(|e| {
            StorageError::from_io_error(
                openraft::ErrorSubject::Store,
                openraft::ErrorVerb::Write,
                std::io::Error::other(e.to_string()),
            )
        })?;
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    if let Err(e) = Suite::test_all(Builder) {
        panic!("openraft storage suite: {e}");
    }
}
