//! Shared helpers for the component tests in `tests/tests/`.

use std::path::PathBuf;

/// The component `make component` builds: `target/nodeipam.wasm`, or `NODEIPAM_COMPONENT`.
pub fn component_path() -> PathBuf {
    std::env::var_os("NODEIPAM_COMPONENT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/nodeipam.wasm"),
        PathBuf::from,
    )
}
