//! Compile once, reuse after: a directory of precompiled components.
//!
//! Compiling the component takes tens of milliseconds; deserializing a precompiled artifact
//! takes tens of microseconds. Each entry's file name is a BLAKE3 hash over the component's
//! bytes and the engine's [`Engine::precompile_compatibility_hash`] (which covers the wasmtime
//! version, the target, the compiler flags and the wasm features), so an engine only ever
//! looks at artifacts it could have produced itself. An entry holds a BLAKE3 hash of the
//! artifact in its header; it is checked before the (unsafe) [`Component::deserialize`], and an entry
//! that is truncated, corrupt or rejected by wasmtime is compiled again and rewritten (temp
//! file + rename), never trusted. A cache that cannot be written is logged and skipped: the
//! component is still compiled and returned.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::error::Error;

/// First bytes of every cache entry, and part of every key: format version 2 (BLAKE3).
/// Version 1 (sha256) entries have other names and another magic: never read, rebuilt.
const MAGIC: &[u8; 8] = b"NIPCWSM2";
/// Header: [`MAGIC`], then the BLAKE3 hash of the artifact that follows.
const HEADER_LEN: usize = MAGIC.len() + blake3::OUT_LEN;

/// Where the component came from: a cache hit, a miss, or an entry that had to be replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// A valid entry was found and loaded.
    Hit,
    /// No entry: the component was compiled (and the entry written, if possible).
    Miss,
    /// An entry was found but truncated, corrupt or rejected by wasmtime: the component was
    /// compiled again and the entry rewritten.
    Rebuilt,
    /// No cache: the component was compiled in memory.
    Uncached,
}

/// A directory of precompiled components, keyed by component and engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentCache {
    dir: PathBuf,
}

impl ComponentCache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The default cache: `$XDG_CACHE_HOME/nodeipam`, else `$HOME/.cache/nodeipam`; none
    /// when neither variable is set.
    pub fn default_location() -> Option<Self> {
        let non_empty = |name| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let base = non_empty("XDG_CACHE_HOME")
            .or_else(|| non_empty("HOME").map(|home| home.join(".cache")))?;
        Some(Self::new(base.join("nodeipam")))
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache key of a component for an engine: hex BLAKE3 over the format's magic, the
    /// component's length and bytes, and the engine's compatibility hash.
    pub fn key(engine: &Engine, wasm: &[u8]) -> String {
        let mut hasher = KeyHasher(blake3::Hasher::new());
        hasher.0.update(MAGIC);
        // Length first: the component's bytes and the compatibility hash that follows them
        // cannot be shifted into one another.
        hasher.0.update(&(wasm.len() as u64).to_le_bytes());
        hasher.0.update(wasm);
        engine.precompile_compatibility_hash().hash(&mut hasher);
        hex(hasher.0.finalize().as_bytes())
    }

    /// The file that holds (or would hold) the entry for this component and engine.
    pub fn entry_path(&self, engine: &Engine, wasm: &[u8]) -> PathBuf {
        self.dir.join(format!("{}.cwasm", Self::key(engine, wasm)))
    }

    /// Load the component from the cache, or compile it and write the entry.
    pub fn load(&self, engine: &Engine, wasm: &[u8]) -> Result<(Component, CacheOutcome), Error> {
        let path = self.entry_path(engine, wasm);
        let outcome = match fs::read(&path) {
            Ok(entry) => match deserialize_entry(engine, &entry) {
                Ok(component) => {
                    tracing::debug!(path = %path.display(), "precompiled component loaded from cache");
                    return Ok((component, CacheOutcome::Hit));
                }
                Err(reason) => {
                    tracing::warn!(path = %path.display(), reason, "cache entry rejected: compiling again");
                    CacheOutcome::Rebuilt
                }
            },
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                CacheOutcome::Miss
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read cache entry: compiling");
                CacheOutcome::Miss
            }
        };
        let artifact = precompile(engine, wasm)?;
        if let Err(e) = write_entry(&self.dir, &path, &artifact) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write cache entry");
        }
        Ok((deserialize_own(engine, &artifact, wasm.len())?, outcome))
    }
}

/// Compile without a cache.
pub(crate) fn compile_uncached(
    engine: &Engine,
    wasm: &[u8],
) -> Result<(Component, CacheOutcome), Error> {
    let component = Component::new(engine, wasm).map_err(|e| Error::Compile {
        size: wasm.len(),
        source: e.into_boxed_dyn_error(),
    })?;
    Ok((component, CacheOutcome::Uncached))
}

fn precompile(engine: &Engine, wasm: &[u8]) -> Result<Vec<u8>, Error> {
    engine
        .precompile_component(wasm)
        .map_err(|e| Error::Compile {
            size: wasm.len(),
            source: e.into_boxed_dyn_error(),
        })
}

/// Load an artifact this process has just produced with the same engine.
fn deserialize_own(engine: &Engine, artifact: &[u8], size: usize) -> Result<Component, Error> {
    // SAFETY: `artifact` was produced by `Engine::precompile_component` on this very engine a
    // moment ago and never left memory.
    unsafe { Component::deserialize(engine, artifact) }.map_err(|e| Error::Compile {
        size,
        source: e.into_boxed_dyn_error(),
    })
}

/// Check an entry's header and checksum, then deserialize it; the reason when rejected.
fn deserialize_entry(engine: &Engine, entry: &[u8]) -> Result<Component, String> {
    if entry.len() < HEADER_LEN {
        return Err(format!(
            "truncated: {} bytes, header needs {HEADER_LEN}",
            entry.len()
        ));
    }
    let (header, artifact) = entry.split_at(HEADER_LEN);
    if &header[..MAGIC.len()] != MAGIC {
        return Err("not a nodeipam cache entry (bad magic)".to_owned());
    }
    // `blake3::Hash` compares in constant time; the speed is what matters here.
    if blake3::hash(artifact) != header[MAGIC.len()..] {
        return Err(format!(
            "checksum mismatch over {} bytes of artifact",
            artifact.len()
        ));
    }
    // SAFETY: the artifact is byte for byte what `Engine::precompile_component` wrote for an
    // engine with the same compatibility hash (the file name) and the same checksum (the
    // header, checked above); wasmtime checks its own version and configuration header too.
    unsafe { Component::deserialize(engine, artifact) }
        .map_err(|e| format!("wasmtime rejected it: {e}"))
}

/// Write an entry atomically: a temporary file in the same directory, then a rename.
fn write_entry(dir: &Path, path: &Path, artifact: &[u8]) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    fs::create_dir_all(dir)?;
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("entry");
    let temp = dir.join(format!(
        ".{file_name}.{}.{}.tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut file = fs::File::create_new(&temp)?;
        file.write_all(MAGIC)?;
        file.write_all(blake3::hash(artifact).as_bytes())?;
        file.write_all(artifact)?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written
}

/// Lower-case hex.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Feeds a [`Hash`] into BLAKE3, so the key is stable across processes and Rust versions
/// (unlike `DefaultHasher`).
struct KeyHasher(blake3::Hasher);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let digest = self.0.finalize();
        let bytes = digest.as_bytes();
        u64::from_le_bytes([
            bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
        ])
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::engine_config;

    /// The smallest component there is: a header and no sections.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";

    fn engine() -> Engine {
        Engine::new(&engine_config()).unwrap()
    }

    /// The component still instantiates and works the same.
    fn assert_usable(engine: &Engine, component: &Component) {
        let mut store = wasmtime::Store::new(engine, ());
        store.set_epoch_deadline(1);
        let linker = wasmtime::component::Linker::new(engine);
        linker
            .instantiate(&mut store, component)
            .expect("instantiates");
    }

    #[test]
    fn miss_then_hit() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, cache) = (engine(), ComponentCache::new(dir.path().join("cache")));
        let (component, outcome) = cache.load(&engine, EMPTY_COMPONENT).unwrap();
        assert_eq!(outcome, CacheOutcome::Miss);
        assert_usable(&engine, &component);
        assert!(cache.entry_path(&engine, EMPTY_COMPONENT).is_file());

        let (component, outcome) = cache.load(&engine, EMPTY_COMPONENT).unwrap();
        assert_eq!(outcome, CacheOutcome::Hit);
        assert_usable(&engine, &component);
    }

    #[test]
    fn flipped_byte_is_rebuilt_and_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, cache) = (engine(), ComponentCache::new(dir.path()));
        cache.load(&engine, EMPTY_COMPONENT).unwrap();
        let path = cache.entry_path(&engine, EMPTY_COMPONENT);
        let good = fs::read(&path).unwrap();
        for at in [0, MAGIC.len() + 3, HEADER_LEN + 100, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            fs::write(&path, &bad).unwrap();
            let (component, outcome) = cache.load(&engine, EMPTY_COMPONENT).unwrap();
            assert_eq!(outcome, CacheOutcome::Rebuilt, "byte {at} flipped");
            assert_usable(&engine, &component);
            assert_eq!(
                fs::read(&path).unwrap(),
                good,
                "entry rewritten after byte {at} flipped"
            );
            assert_eq!(
                cache.load(&engine, EMPTY_COMPONENT).unwrap().1,
                CacheOutcome::Hit
            );
        }
    }

    #[test]
    fn truncated_entry_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, cache) = (engine(), ComponentCache::new(dir.path()));
        cache.load(&engine, EMPTY_COMPONENT).unwrap();
        let path = cache.entry_path(&engine, EMPTY_COMPONENT);
        let good = fs::read(&path).unwrap();
        for len in [0, HEADER_LEN - 1, HEADER_LEN, good.len() / 2] {
            fs::write(&path, &good[..len]).unwrap();
            let (component, outcome) = cache.load(&engine, EMPTY_COMPONENT).unwrap();
            assert_eq!(outcome, CacheOutcome::Rebuilt, "truncated to {len}");
            assert_usable(&engine, &component);
        }
        assert_eq!(fs::read(&path).unwrap(), good);
    }

    #[test]
    fn entry_with_valid_checksum_but_foreign_artifact_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, cache) = (engine(), ComponentCache::new(dir.path()));
        let path = cache.entry_path(&engine, EMPTY_COMPONENT);
        write_entry(dir.path(), &path, b"not an artifact").unwrap();
        let (component, outcome) = cache.load(&engine, EMPTY_COMPONENT).unwrap();
        assert_eq!(outcome, CacheOutcome::Rebuilt);
        assert_usable(&engine, &component);
    }

    #[test]
    fn format_1_entry_is_never_read() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, cache) = (engine(), ComponentCache::new(dir.path()));
        cache.load(&engine, EMPTY_COMPONENT).unwrap();
        let path = cache.entry_path(&engine, EMPTY_COMPONENT);
        let good = fs::read(&path).unwrap();
        // A version 1 entry (sha256 header) at this entry's name: the magic rejects it.
        let mut old = b"NIPCWSM1".to_vec();
        old.extend_from_slice(&[0; 32]);
        old.extend_from_slice(&good[HEADER_LEN..]);
        fs::write(&path, &old).unwrap();
        let (component, outcome) = cache.load(&engine, EMPTY_COMPONENT).unwrap();
        assert_eq!(outcome, CacheOutcome::Rebuilt);
        assert_usable(&engine, &component);
        assert_eq!(fs::read(&path).unwrap(), good);
    }

    #[test]
    fn key_depends_on_engine_config_and_component() {
        let default = engine();
        let same = engine();
        let mut config = engine_config();
        config.cranelift_opt_level(wasmtime::OptLevel::None);
        let other = Engine::new(&config).unwrap();
        let other_component = b"\0asm\x0d\0\x01\0\x00\x00";

        let key = ComponentCache::key(&default, EMPTY_COMPONENT);
        assert_eq!(key.len(), 64);
        assert_eq!(key, ComponentCache::key(&same, EMPTY_COMPONENT));
        assert_ne!(key, ComponentCache::key(&other, EMPTY_COMPONENT));
        assert_ne!(key, ComponentCache::key(&default, other_component));
    }

    #[test]
    fn unwritable_cache_still_returns_the_component() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        fs::write(&blocker, b"").unwrap();
        let (engine, cache) = (engine(), ComponentCache::new(blocker.join("cache")));
        let (component, outcome) = cache.load(&engine, EMPTY_COMPONENT).unwrap();
        assert_eq!(outcome, CacheOutcome::Miss);
        assert_usable(&engine, &component);
    }

    #[test]
    fn invalid_component_is_a_compile_error() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, cache) = (engine(), ComponentCache::new(dir.path()));
        let error = cache.load(&engine, b"\0asm garbage").unwrap_err();
        assert!(
            matches!(error, Error::Compile { size: 12, .. }),
            "{error:?}"
        );
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "nothing written"
        );
    }

    #[test]
    fn hex_is_lower_case() {
        assert_eq!(hex(&[0x00, 0xab, 0x7f]), "00ab7f");
    }
}
