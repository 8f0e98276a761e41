//! `mira block-dump FILE...`: prints each block's records as OTLP/JSON
//! (one export request per block, one per line), for debugging and for
//! tests that compare what was sent with what was stored.

use std::sync::Arc;

use mira_core::block::{Block, VerifyCache};
use mira_core::ids::Signal;

pub fn run(files: &[std::path::PathBuf]) -> anyhow::Result<()> {
    let cache = Arc::new(VerifyCache::new(1024));
    for f in files {
        let bytes = std::fs::read(f)?;
        let block = Block::from_bytes(bytes.into(), cache.clone())?;
        let tables = mira_core::tables::read_tables(&block, None)?;
        let line = match block.meta().signal {
            Signal::Logs => serde_json::to_string(&mira_core::convert::logs_to_otlp(&tables)?)?,
            Signal::Traces => serde_json::to_string(&mira_core::convert::spans_to_otlp(&tables)?)?,
            Signal::Metrics => serde_json::to_string(&mira_core::convert::points_to_otlp(&tables)?)?,
        };
        println!("{line}");
    }
    Ok(())
}
