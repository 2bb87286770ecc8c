//! The host library's error type.
//!
//! One enum, [`Error`], for everything a [`Plugin`](crate::plugin::Plugin) or a
//! [`Driver`](crate::driver::Driver) can fail with. It separates the component's expected
//! failures ([`Error::Sync`], a value the component returned; the instance is fine) from traps
//! ([`Error::Trapped`], [`Error::MemoryLimit`], [`Error::Deadline`], [`Error::Fatal`]: the
//! instance was dropped and rebuilt) and from loading errors.

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::BackendError;

/// A boxed error from wasmtime (whose own error type does not implement `std::error::Error`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a call into the host library failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The component file could not be read.
    #[error("cannot read component {path}")]
    ReadComponent {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The engine could not be configured, or its epoch ticker thread not started.
    #[error("cannot set up the wasm engine")]
    Engine(#[source] BoxError),
    /// The bytes are not a valid component, or compiling it failed.
    #[error("cannot compile component ({size} bytes)")]
    Compile {
        /// Size of the component in bytes.
        size: usize,
        /// What wasmtime said.
        #[source]
        source: BoxError,
    },
    /// The component does not fit the host: it imports something the host does not provide,
    /// or lacks an export of the `nodeipam` world.
    #[error("component does not match the world nodeipam")]
    Link(#[source] BoxError),
    /// A fresh instance could not be created (for example, its initial memory exceeds
    /// [`Limits::max_memory_bytes`](crate::plugin::Limits::max_memory_bytes)).
    #[error("cannot instantiate component")]
    Instantiate(#[source] BoxError),
    /// Listing the cluster's nodes failed, so the instance could not be (re)initialised.
    #[error("cannot list nodes to initialise the component")]
    ListNodes(#[source] BackendError),
    /// The component returned an error: expected, per node; the instance is unaffected.
    #[error(transparent)]
    Sync(#[from] SyncError),
    /// The component trapped (a bug in the guest). The instance was dropped and rebuilt.
    #[error("export {export} trapped: {reason}")]
    Trapped {
        /// The export that was running.
        export: &'static str,
        /// What the trap was, as wasmtime names it.
        reason: String,
    },
    /// The component tried to grow its memory past the limit. The instance was dropped and
    /// rebuilt.
    #[error(
        "export {export} exceeded the memory limit of {limit} bytes (it asked for {requested})"
    )]
    MemoryLimit {
        /// The export that was running, or `instantiate`.
        export: &'static str,
        /// [`Limits::max_memory_bytes`](crate::plugin::Limits::max_memory_bytes).
        limit: usize,
        /// The memory size the component asked for.
        requested: usize,
    },
    /// The call ran past its deadline. The instance was dropped and rebuilt.
    #[error("export {export} ran past its deadline of {timeout:?}")]
    Deadline {
        /// The export that was running.
        export: &'static str,
        /// [`Limits::call_timeout`](crate::plugin::Limits::call_timeout).
        timeout: Duration,
    },
    /// A backend failed with [`BackendError::Fatal`], which aborts the call. The instance was
    /// dropped and rebuilt.
    #[error("export {export} aborted: backend call {call} failed")]
    Fatal {
        /// The export that was running.
        export: &'static str,
        /// The import that failed, e.g. `add-alias`.
        call: &'static str,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
    /// After a trap, rebuilding the instance from the cluster failed; the next call tries
    /// again before serving.
    #[error("cannot rebuild the instance after a trap")]
    Recovery(#[source] Box<Error>),
}

impl Error {
    /// Whether this error came from a trap, after which the instance was dropped and rebuilt
    /// (or will be, before the next call is served).
    pub fn is_trap(&self) -> bool {
        matches!(
            self,
            Self::Trapped { .. }
                | Self::MemoryLimit { .. }
                | Self::Deadline { .. }
                | Self::Fatal { .. }
        )
    }

    /// The component's own error, if that is what this is.
    pub fn as_sync(&self) -> Option<&SyncError> {
        match self {
            Self::Sync(e) => Some(e),
            _ => None,
        }
    }
}

/// The component's `sync-error`: an expected failure of one export call. Every message
/// names the node and the value concerned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    /// The configuration given to `init` is not usable.
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// A range does not parse, or has the wrong IP family or size.
    #[error("invalid cidr: {0}")]
    InvalidCidr(String),
    /// A range lies outside every cluster CIDR of its family.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// No free range is left in a cluster CIDR.
    #[error("exhausted: {0}")]
    Exhausted(String),
    /// The action the node needs is not allowed in the configured mode.
    #[error("invalid mode: {0}")]
    InvalidMode(String),
    /// A host call failed with an expected error (never [`BackendError::Fatal`]: that traps).
    #[error("host call failed: {0}")]
    Host(BackendError),
    /// An export other than `init`, `tick` or `stats` was called before `init`.
    #[error("not initialized: call init first")]
    NotInitialized,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_errors_display_their_message() {
        let cases = [
            (
                SyncError::InvalidConfig("mask 7 < 8".into()),
                "invalid config: mask 7 < 8",
            ),
            (
                SyncError::Host(BackendError::Unavailable("node a".into())),
                "host call failed: unavailable: node a",
            ),
            (
                SyncError::NotInitialized,
                "not initialized: call init first",
            ),
        ];
        for (error, message) in cases {
            assert_eq!(error.to_string(), message);
        }
    }

    #[test]
    fn traps_are_told_apart_from_sync_errors() {
        let trap = Error::Deadline {
            export: "tick",
            timeout: Duration::from_secs(1),
        };
        let sync = Error::Sync(SyncError::NotInitialized);
        assert!(trap.is_trap());
        assert!(!sync.is_trap());
        assert_eq!(sync.as_sync(), Some(&SyncError::NotInitialized));
        assert_eq!(trap.to_string(), "export tick ran past its deadline of 1s");
    }
}
