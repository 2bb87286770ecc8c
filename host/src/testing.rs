//! Helpers for the host's own tests that run the real component.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::backend::Backends;
use crate::plugin::{Limits, Plugin, PluginBuilder};
use crate::types::{ClusterCidr, Config, SyncMode};

/// `target/nodeipam.wasm` (built by `make component`), or `$NODEIPAM_COMPONENT`.
pub(crate) fn component_path() -> PathBuf {
    std::env::var_os("NODEIPAM_COMPONENT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/nodeipam.wasm"),
        PathBuf::from,
    )
}

/// The component's bytes, read once.
pub(crate) fn component() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let path = component_path();
        std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read {}: {e} (run `make component` first)",
                path.display()
            )
        })
    })
}

/// A cache shared by the tests of this process, so the component compiles once.
pub(crate) fn cache_dir() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
        .path()
        .to_owned()
}

/// The real component with these limits and backends.
pub(crate) fn plugin_with<B: Backends>(limits: Limits, backends: B) -> Plugin<B> {
    PluginBuilder::new()
        .limits(limits)
        .cache_dir(cache_dir())
        .load_bytes(component(), backends)
        .expect("the component loads")
}

/// The real component with default limits.
pub(crate) fn plugin<B: Backends>(backends: B) -> Plugin<B> {
    plugin_with(Limits::default(), backends)
}

/// `sync-from-cluster` over `10.0.0.0/16`, /24 per node, default intervals.
pub(crate) fn cluster_config() -> Config {
    Config::new(
        SyncMode::SyncFromCluster,
        vec![ClusterCidr::new("10.0.0.0/16", 24)],
    )
}

/// The real component with these limits and backends, or why it did not load.
pub(crate) fn try_plugin_with<B: Backends>(
    limits: Limits,
    backends: B,
) -> Result<Plugin<B>, crate::Error> {
    PluginBuilder::new()
        .limits(limits)
        .cache_dir(cache_dir())
        .load_bytes(component(), backends)
}
