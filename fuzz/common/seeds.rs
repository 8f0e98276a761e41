//! Seed corpora are made by the code itself: run a target binary with
//! `MIRA_FUZZ_WRITE_SEEDS=<dir>` and its init writes its seeds there and
//! exits (`scripts/fuzz.sh --seeds` does this for every target).

use std::path::PathBuf;

/// Writes `make()`'s seeds when asked to, then exits; otherwise returns.
pub fn write_if_asked(make: impl FnOnce() -> Vec<(String, Vec<u8>)>) {
    let Some(dir) = std::env::var_os("MIRA_FUZZ_WRITE_SEEDS").map(PathBuf::from) else {
        return;
    };
    std::fs::create_dir_all(&dir).expect("create the seed directory");
    for (name, bytes) in make() {
        std::fs::write(dir.join(name), bytes).expect("write a seed");
    }
    std::process::exit(0);
}

/// `sel` followed by `body`.
#[allow(dead_code)] // not every target has a selector byte
pub fn with_selector(sel: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(body.len() + 1);
    v.push(sel);
    v.extend_from_slice(body);
    v
}
