//! The embedded local store: one SQLite file that stands in for both the cluster and the cloud.
//!
//! It holds the nodes (name, provider id, pod ranges, `NetworkUnavailable` condition), the cloud
//! aliases of their VMs, the warning events the component emitted, and a change log of what
//! operators did (`nodes add`/`remove`, `import`, `generate`), which `nodeipam run` polls to
//! feed added, changed and deleted nodes to the component. What the controller writes itself
//! (ranges, aliases, conditions, events) is not logged: it already knows.
//!
//! Crash safety: every write is one SQLite transaction (WAL journal, `synchronous=NORMAL`, which
//! survives a killed process; a power loss may drop the last transactions, never half of one).
//! A run killed at any instant therefore leaves a store that is some prefix of its writes, and
//! the component converges from any such prefix: `init` occupies the ranges already on nodes and
//! the aliases of nodes without one before anything is allocated.
//!
//! Semantics follow the real backends where they matter: a node's pod ranges can be set once
//! (the API server refuses to change them), and an alias can be added to a VM that has none
//! (the cloud refuses a second one). Both refusals are `Conflict`s naming node and ranges.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

use crate::backend::{BackendError, CloudAlias, Events, KubeApi, Node};

/// The schema this build reads and writes. A store with a larger version is refused.
pub const SCHEMA_VERSION: u32 = 1;

/// How long a call waits for another process's write transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SCHEMA: &str = "
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    provider_id TEXT,
    pod_cidrs TEXT NOT NULL,            -- JSON array of strings, spec.podCIDRs
    network_unavailable INTEGER NOT NULL
) STRICT;
CREATE TABLE aliases (
    node TEXT PRIMARY KEY,              -- the node whose VM carries the alias
    cidrs TEXT NOT NULL                 -- JSON array of strings
) STRICT;
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time_ms INTEGER NOT NULL,
    node TEXT NOT NULL,
    reason TEXT NOT NULL,
    message TEXT NOT NULL
) STRICT;
CREATE TABLE changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    deleted INTEGER NOT NULL,
    object TEXT                         -- deleted: the node as it was, JSON
) STRICT;
";

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file does not exist and the command does not create one.
    #[error("store {} does not exist (create it with `nodeipam import` or `nodeipam nodes add`)", .0.display())]
    Missing(PathBuf),
    /// The file was written by a newer nodeipam.
    #[error(
        "store {} has schema version {found}, newer than the {supported} this nodeipam supports; use a newer nodeipam",
        path.display()
    )]
    NewerSchema {
        /// The store file.
        path: PathBuf,
        /// The version found in the file.
        found: u32,
        /// [`SCHEMA_VERSION`].
        supported: u32,
    },
    /// The file is not a nodeipam store.
    #[error("{} is not a nodeipam store: {reason}", path.display())]
    NotAStore {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// SQLite failed.
    #[error("store {}: {op}", path.display())]
    Sql {
        /// The store file.
        path: PathBuf,
        /// What was being done.
        op: String,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// A value in the file does not decode.
    #[error("store {}: bad {what} of node {node}: {value:?}", path.display())]
    Corrupt {
        /// The store file.
        path: PathBuf,
        /// Which column.
        what: &'static str,
        /// Which node.
        node: String,
        /// The value found.
        value: String,
    },
    /// `nodes add` of a name that exists.
    #[error("node {0} already exists")]
    NodeExists(String),
    /// A node that does not exist.
    #[error("node {0} not found")]
    NodeNotFound(String),
    /// Another `nodeipam run` holds the store.
    #[error("another nodeipam run is using store {} (lock {})", store.display(), lock.display())]
    Locked {
        /// The store file.
        store: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// The store's directory cannot be created.
    #[error("cannot create directory {}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The run lock file cannot be opened or locked.
    #[error("cannot lock {}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// A node as the store keeps it: the cluster's object plus the cloud's alias and condition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRecord {
    /// Name, provider id and pod ranges.
    pub node: Node,
    /// The `NetworkUnavailable` condition.
    pub network_unavailable: bool,
    /// The alias ranges of the node's VM: empty when it has none.
    pub alias: Vec<String>,
}

/// Where a node stands, from its range, alias and condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeState {
    /// No range, no alias.
    New,
    /// An alias but no range.
    AliasOnly,
    /// A range but no alias.
    NoAlias,
    /// Range and alias differ.
    Mismatch,
    /// Range equals alias, but the network is marked unavailable.
    NetworkUnavailable,
    /// Range equals alias and the network is available: nothing to do.
    InSync,
}

impl NodeState {
    /// Lower-case words, for tables.
    pub fn label(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::AliasOnly => "alias only",
            Self::NoAlias => "no alias",
            Self::Mismatch => "mismatch",
            Self::NetworkUnavailable => "network unavailable",
            Self::InSync => "in sync",
        }
    }
}

impl NodeRecord {
    /// Where the node stands.
    pub fn state(&self) -> NodeState {
        match (self.node.pod_cidrs.is_empty(), self.alias.is_empty()) {
            (true, true) => NodeState::New,
            (true, false) => NodeState::AliasOnly,
            (false, true) => NodeState::NoAlias,
            (false, false) if !same_set(&self.node.pod_cidrs, &self.alias) => NodeState::Mismatch,
            (false, false) if self.network_unavailable => NodeState::NetworkUnavailable,
            (false, false) => NodeState::InSync,
        }
    }
}

/// A node to write with [`Store::apply`]: `alias: None` leaves the VM's alias as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSpec {
    /// Name, provider id and pod ranges.
    pub node: Node,
    /// The `NetworkUnavailable` condition.
    pub network_unavailable: bool,
    /// The alias ranges to give the VM; `None`: keep whatever it has.
    pub alias: Option<Vec<String>>,
}

/// What [`Store::apply`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Nodes that did not exist.
    pub added: usize,
    /// Nodes whose object or alias differed.
    pub changed: usize,
    /// Nodes already exactly as given.
    pub unchanged: usize,
}

/// A warning event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventRecord {
    /// Position in the store (increasing).
    pub id: i64,
    /// Wall-clock time, ms since the Unix epoch.
    pub time_ms: i64,
    /// The node concerned.
    pub node: String,
    /// CamelCase reason, e.g. `CloudCIDRAllocatorMismatch`.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

/// One entry of the change log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The node was added or its object changed: read it and update.
    Upserted {
        /// Position in the log.
        seq: i64,
        /// The node's name.
        name: String,
    },
    /// The node was deleted: this is the object as it was.
    Deleted {
        /// Position in the log.
        seq: i64,
        /// The deleted node.
        node: Node,
    },
}

impl Change {
    /// Position in the log.
    pub fn seq(&self) -> i64 {
        match self {
            Self::Upserted { seq, .. } | Self::Deleted { seq, .. } => *seq,
        }
    }
}

/// Held by `nodeipam run` while it drives a store: at most one allocator per store. The lock is
/// the OS's, so a killed process releases it.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

/// The embedded store (one SQLite connection).
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Open the store at `path`, creating an empty one when the file does not exist.
    pub fn open_or_create(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, true)
    }

    /// Open an existing store; [`StoreError::Missing`] when there is no file.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, false)
    }

    fn open_with(path: &Path, create: bool) -> Result<Self, StoreError> {
        let path = path.to_path_buf();
        if !create && !path.exists() {
            return Err(StoreError::Missing(path));
        }
        if let Some(dir) = path
            .parent()
            .filter(|d| create && !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        let conn = Connection::open_with_flags(&path, flags).map_err(|source| StoreError::Sql {
            path: path.clone(),
            op: "open".into(),
            source,
        })?;
        let mut store = Self { conn, path };
        store
            .conn
            .busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| store.sql("set busy timeout", e))?;
        store.check_or_init_schema()?;
        // Only now that the file is known to be ours and not newer: switch it to WAL.
        store
            .conn
            .pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| store.sql("enable WAL", e))?;
        store
            .conn
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| store.sql("set synchronous", e))?;
        Ok(store)
    }

    /// Refuse a newer or foreign file; lay the schema down in an empty one.
    fn check_or_init_schema(&mut self) -> Result<(), StoreError> {
        let tables: Vec<String> = {
            let mut stmt = self
                .conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
                .map_err(|e| self.not_a_store_or_sql("read schema", e))?;
            stmt.query_map([], |row| row.get(0))
                .and_then(|rows| rows.collect::<Result<_, _>>())
                .map_err(|e| self.not_a_store_or_sql("read schema", e))?
        };
        if tables.iter().any(|t| t == "meta") {
            return self.check_version();
        }
        if !tables.is_empty() {
            return Err(StoreError::NotAStore {
                path: self.path.clone(),
                reason: format!("it has tables {tables:?} but no nodeipam meta table"),
            });
        }
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|source| sql_err(&path, "create schema", source))?;
        // Another process may have created it between our look and our lock.
        let exists: bool = tx
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                [],
                |row| row.get(0),
            )
            .map_err(|source| sql_err(&path, "create schema", source))?;
        if !exists {
            tx.execute_batch(SCHEMA)
                .and_then(|()| {
                    tx.execute(
                        "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)",
                        [SCHEMA_VERSION.to_string()],
                    )
                })
                .map_err(|source| sql_err(&path, "create schema", source))?;
        }
        tx.commit()
            .map_err(|source| sql_err(&path, "create schema", source))?;
        if exists { self.check_version() } else { Ok(()) }
    }

    fn check_version(&self) -> Result<(), StoreError> {
        let value: Option<String> = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| self.sql("read schema version", e))?;
        let value = value.ok_or_else(|| StoreError::NotAStore {
            path: self.path.clone(),
            reason: "its meta table has no schema_version".into(),
        })?;
        let found: u32 = value.parse().map_err(|_| StoreError::NotAStore {
            path: self.path.clone(),
            reason: format!("schema_version {value:?} is not a number"),
        })?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path: self.path.clone(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        Ok(())
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Take the run lock (`<store>.lock` beside the file); fails when another run holds it.
    pub fn lock_for_run(&self) -> Result<RunLock, StoreError> {
        let mut lock = self.path.clone().into_os_string();
        lock.push(".lock");
        let lock = PathBuf::from(lock);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(|source| StoreError::Lock {
                path: lock.clone(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => Ok(RunLock { _file: file }),
            Err(TryLockError::WouldBlock) => Err(StoreError::Locked {
                store: self.path.clone(),
                lock,
            }),
            Err(TryLockError::Error(source)) => Err(StoreError::Lock { path: lock, source }),
        }
    }

    // ---- operator writes (logged in the change log) ----

    /// Add one node; [`StoreError::NodeExists`] when the name is taken.
    pub fn add_node(&mut self, spec: &NodeSpec) -> Result<(), StoreError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sql_err(&path, "add node", e))?;
        if read_record(&tx, &path, &spec.node.name)?.is_some() {
            return Err(StoreError::NodeExists(spec.node.name.clone()));
        }
        write_spec(&tx, &path, spec, None)?;
        tx.commit().map_err(|e| sql_err(&path, "add node", e))
    }

    /// Add or replace many nodes in one transaction: all or nothing. Nodes whose object and
    /// alias are already as given are left alone (and not logged).
    pub fn apply(&mut self, specs: &[NodeSpec]) -> Result<ApplyReport, StoreError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sql_err(&path, "apply nodes", e))?;
        let mut report = ApplyReport::default();
        for spec in specs {
            let old = read_record(&tx, &path, &spec.node.name)?;
            match &old {
                None => report.added += 1,
                Some(old) if spec_matches(spec, old) => {
                    report.unchanged += 1;
                    continue;
                }
                Some(_) => report.changed += 1,
            }
            write_spec(&tx, &path, spec, old.as_ref())?;
        }
        tx.commit().map_err(|e| sql_err(&path, "apply nodes", e))?;
        Ok(report)
    }

    /// Delete a node and its VM's alias (the VM goes with the node); returns what was deleted.
    pub fn remove_node(&mut self, name: &str) -> Result<NodeRecord, StoreError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sql_err(&path, "remove node", e))?;
        let old = read_record(&tx, &path, name)?
            .ok_or_else(|| StoreError::NodeNotFound(name.to_owned()))?;
        let object = serde_json::to_string(&NodeJson::from(&old.node)).unwrap_or_default();
        tx.execute("DELETE FROM nodes WHERE name = ?1", [name])
            .and_then(|_| tx.execute("DELETE FROM aliases WHERE node = ?1", [name]))
            .and_then(|_| {
                tx.execute(
                    "INSERT INTO changes (node, deleted, object) VALUES (?1, 1, ?2)",
                    params![name, object],
                )
            })
            .map_err(|e| sql_err(&path, &format!("remove node {name}"), e))?;
        tx.commit().map_err(|e| sql_err(&path, "remove node", e))?;
        Ok(old)
    }

    /// The first free index `i` such that no node is named `{prefix}{i:06}` or above.
    pub fn next_generated_index(&self, prefix: &str) -> Result<u64, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name FROM nodes WHERE substr(name, 1, length(?1)) = ?1")
            .map_err(|e| self.sql("read node names", e))?;
        let names: Vec<String> = stmt
            .query_map([prefix], |row| row.get(0))
            .and_then(|rows| rows.collect())
            .map_err(|e| self.sql("read node names", e))?;
        Ok(names
            .iter()
            .filter_map(|n| n.strip_prefix(prefix)?.parse::<u64>().ok())
            .max()
            .map_or(1, |m| m + 1))
    }

    // ---- reads ----

    /// Every node with its alias and condition, ordered by name.
    pub fn records(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT n.name, n.provider_id, n.pod_cidrs, n.network_unavailable, a.cidrs
                 FROM nodes n LEFT JOIN aliases a ON a.node = n.name ORDER BY n.name",
            )
            .map_err(|e| self.sql("list nodes", e))?;
        let rows = stmt
            .query_map([], raw_record)
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.sql("list nodes", e))?;
        rows.into_iter().map(|raw| raw.decode(&self.path)).collect()
    }

    /// One node with its alias and condition.
    pub fn record(&self, name: &str) -> Result<Option<NodeRecord>, StoreError> {
        read_record(&self.conn, &self.path, name)
    }

    /// Every node and the change-log position they reflect, read in one snapshot: changes after
    /// that position are news to whoever holds this list.
    pub fn snapshot(&mut self) -> Result<(Vec<Node>, i64), StoreError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction()
            .map_err(|e| sql_err(&path, "read snapshot", e))?;
        let seq = last_seq(&tx, &path)?;
        let mut stmt = tx
            .prepare("SELECT name, provider_id, pod_cidrs FROM nodes ORDER BY name")
            .map_err(|e| sql_err(&path, "list nodes", e))?;
        let rows = stmt
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .and_then(|rows| rows.collect::<Result<Vec<(String, Option<String>, String)>, _>>())
            .map_err(|e| sql_err(&path, "list nodes", e))?;
        drop(stmt);
        tx.finish()
            .map_err(|e| sql_err(&path, "read snapshot", e))?;
        let nodes = rows
            .into_iter()
            .map(|(name, provider_id, cidrs)| {
                let pod_cidrs = decode_list(&path, "pod_cidrs", &name, &cidrs)?;
                Ok(Node {
                    name,
                    provider_id,
                    pod_cidrs,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok((nodes, seq))
    }

    /// The change log after position `after`, oldest first, at most `limit` entries.
    pub fn changes_since(&self, after: i64, limit: usize) -> Result<Vec<Change>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT seq, node, deleted, object FROM changes WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )
            .map_err(|e| self.sql("read changes", e))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = stmt
            .query_map(params![after, limit], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .and_then(|rows| rows.collect::<Result<Vec<(i64, String, bool, Option<String>)>, _>>())
            .map_err(|e| self.sql("read changes", e))?;
        rows.into_iter()
            .map(|(seq, name, deleted, object)| {
                if !deleted {
                    return Ok(Change::Upserted { seq, name });
                }
                let object = object.unwrap_or_default();
                let node: NodeJson =
                    serde_json::from_str(&object).map_err(|_| StoreError::Corrupt {
                        path: self.path.clone(),
                        what: "deleted object",
                        node: name.clone(),
                        value: object.clone(),
                    })?;
                Ok(Change::Deleted {
                    seq,
                    node: node.into(),
                })
            })
            .collect()
    }

    /// Forget change-log entries up to and including `seq` (done by the run that consumed them).
    pub fn prune_changes(&mut self, upto: i64) -> Result<(), StoreError> {
        self.conn
            .execute("DELETE FROM changes WHERE seq <= ?1", [upto])
            .map(drop)
            .map_err(|e| self.sql("prune changes", e))
    }

    /// Events, newest last; `node` filters, `limit` keeps the newest `limit` (0: all).
    pub fn events(&self, node: Option<&str>, limit: usize) -> Result<Vec<EventRecord>, StoreError> {
        let limit = if limit == 0 {
            i64::MAX
        } else {
            i64::try_from(limit).unwrap_or(i64::MAX)
        };
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, time_ms, node, reason, message FROM (
                   SELECT * FROM events WHERE ?1 IS NULL OR node = ?1 ORDER BY id DESC LIMIT ?2
                 ) ORDER BY id",
            )
            .map_err(|e| self.sql("read events", e))?;
        stmt.query_map(params![node, limit], |row| {
            Ok(EventRecord {
                id: row.get(0)?,
                time_ms: row.get(1)?,
                node: row.get(2)?,
                reason: row.get(3)?,
                message: row.get(4)?,
            })
        })
        .and_then(|rows| rows.collect())
        .map_err(|e| self.sql("read events", e))
    }

    /// How many events the store holds.
    pub fn event_count(&self) -> Result<u64, StoreError> {
        self.conn
            .query_row("SELECT count(*) FROM events", [], |row| {
                row.get::<_, i64>(0)
            })
            .map(|n| n.unsigned_abs())
            .map_err(|e| self.sql("count events", e))
    }

    fn sql(&self, op: &str, source: rusqlite::Error) -> StoreError {
        sql_err(&self.path, op, source)
    }

    fn not_a_store_or_sql(&self, op: &str, source: rusqlite::Error) -> StoreError {
        if source.sqlite_error_code() == Some(ErrorCode::NotADatabase) {
            return StoreError::NotAStore {
                path: self.path.clone(),
                reason: "not an SQLite database".into(),
            };
        }
        self.sql(op, source)
    }

    // ---- controller writes, for the backend traits ----

    fn backend_err(&self, op: &str, name: &str, e: &StoreError) -> BackendError {
        let message = format!("{op} node {name}: {e}");
        let busy = matches!(
            e,
            StoreError::Sql { source, .. }
                if matches!(source.sqlite_error_code(), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
        );
        if busy {
            BackendError::Unavailable(message)
        } else {
            BackendError::Other(message)
        }
    }

    fn set_pod_cidrs(&mut self, name: &str, cidrs: &[String]) -> Result<(), SetError> {
        // The common case in one statement (one transaction): the node exists with no range.
        let set = self
            .conn
            .prepare_cached("UPDATE nodes SET pod_cidrs = ?2 WHERE name = ?1 AND pod_cidrs = '[]'")
            .and_then(|mut s| s.execute(params![name, encode_list(cidrs)]))
            .map_err(|e| self.sql("write node", e))?;
        if set == 1 {
            return Ok(());
        }
        // Otherwise find out why, in one transaction: missing, the same, or different ranges.
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sql_err(&path, "begin", e))?;
        let current: Option<String> = tx
            .prepare_cached("SELECT pod_cidrs FROM nodes WHERE name = ?1")
            .and_then(|mut s| s.query_row([name], |row| row.get(0)).optional())
            .map_err(|e| sql_err(&path, "read node", e))?;
        let current = current.ok_or(SetError::NotFound)?;
        let current = decode_list(&path, "pod_cidrs", name, &current)?;
        if !current.is_empty() {
            return already_set(current, cidrs);
        }
        tx.prepare_cached("UPDATE nodes SET pod_cidrs = ?2 WHERE name = ?1")
            .and_then(|mut s| s.execute(params![name, encode_list(cidrs)]))
            .map_err(|e| sql_err(&path, "write node", e))?;
        tx.commit().map_err(|e| sql_err(&path, "commit", e))?;
        Ok(())
    }

    fn set_alias(&mut self, name: &str, cidrs: &[String]) -> Result<(), SetError> {
        // The common case in one statement (one transaction): the VM exists, with no alias.
        let set = self
            .conn
            .prepare_cached(
                "INSERT INTO aliases (node, cidrs)
                 SELECT ?1, ?2 WHERE EXISTS (SELECT 1 FROM nodes WHERE name = ?1)
                 ON CONFLICT (node) DO UPDATE SET cidrs = excluded.cidrs WHERE cidrs = '[]'",
            )
            .and_then(|mut s| s.execute(params![name, encode_list(cidrs)]))
            .map_err(|e| self.sql("write alias", e))?;
        if set == 1 {
            return Ok(());
        }
        // Otherwise find out why, in one transaction: no VM, the same, or a different alias.
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sql_err(&path, "begin", e))?;
        let exists = tx
            .prepare_cached("SELECT 1 FROM nodes WHERE name = ?1")
            .and_then(|mut s| s.exists([name]))
            .map_err(|e| sql_err(&path, "read node", e))?;
        if !exists {
            return Err(SetError::NotFound);
        }
        let current: Option<String> = tx
            .prepare_cached("SELECT cidrs FROM aliases WHERE node = ?1")
            .and_then(|mut s| s.query_row([name], |row| row.get(0)).optional())
            .map_err(|e| sql_err(&path, "read alias", e))?;
        if let Some(current) = current {
            let current = decode_list(&path, "alias", name, &current)?;
            if !current.is_empty() {
                return already_set(current, cidrs);
            }
        }
        tx.prepare_cached("INSERT OR REPLACE INTO aliases (node, cidrs) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute(params![name, encode_list(cidrs)]))
            .map_err(|e| sql_err(&path, "write alias", e))?;
        tx.commit().map_err(|e| sql_err(&path, "commit", e))?;
        Ok(())
    }
}

/// A write of `cidrs` where `current` is set already: set once, like a node's pod ranges and
/// a VM's alias. The same ranges again succeed; different ones are refused.
fn already_set(current: Vec<String>, cidrs: &[String]) -> Result<(), SetError> {
    if same_set(&current, cidrs) {
        Ok(())
    } else {
        Err(SetError::Taken(current))
    }
}

/// Why a controller write was refused.
enum SetError {
    NotFound,
    /// Already set to these, different, ranges.
    Taken(Vec<String>),
    Store(StoreError),
}

impl From<StoreError> for SetError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl KubeApi for Store {
    fn get_node(&mut self, name: &str) -> Result<Node, BackendError> {
        let row: Option<(Option<String>, String)> = self
            .conn
            .prepare_cached("SELECT provider_id, pod_cidrs FROM nodes WHERE name = ?1")
            .and_then(|mut s| {
                s.query_row([name], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()
            })
            .map_err(|e| self.backend_err("get", name, &self.sql("read node", e)))?;
        let (provider_id, cidrs) =
            row.ok_or_else(|| BackendError::NotFound(format!("node {name}")))?;
        let pod_cidrs = decode_list(&self.path, "pod_cidrs", name, &cidrs)
            .map_err(|e| self.backend_err("get", name, &e))?;
        Ok(Node {
            name: name.to_owned(),
            provider_id,
            pod_cidrs,
        })
    }

    fn list_nodes(&mut self) -> Result<Vec<Node>, BackendError> {
        self.snapshot()
            .map(|(nodes, _)| nodes)
            .map_err(|e| BackendError::Other(format!("list nodes: {e}")))
    }

    fn update_node_pod_cidrs(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError> {
        let name = node.name.as_str();
        self.set_pod_cidrs(name, cidrs).map_err(|e| match e {
            SetError::NotFound => BackendError::NotFound(format!("node {name}")),
            SetError::Taken(current) => BackendError::Conflict(format!(
                "node {name} already has pod ranges {current:?}; refusing to set {cidrs:?}"
            )),
            SetError::Store(e) => self.backend_err("update pod ranges of", name, &e),
        })
    }

    fn update_node_network_unavailable(
        &mut self,
        name: &str,
        unavailable: bool,
    ) -> Result<(), BackendError> {
        let updated = self
            .conn
            .prepare_cached("UPDATE nodes SET network_unavailable = ?2 WHERE name = ?1")
            .and_then(|mut s| s.execute(params![name, unavailable]))
            .map_err(|e| {
                self.backend_err(
                    "update network condition of",
                    name,
                    &self.sql("write node", e),
                )
            })?;
        if updated == 0 {
            return Err(BackendError::NotFound(format!("node {name}")));
        }
        Ok(())
    }
}

impl CloudAlias for Store {
    fn alias(&mut self, node: &Node) -> Result<Vec<String>, BackendError> {
        let name = node.name.as_str();
        let row: Option<String> = self
            .conn
            .prepare_cached("SELECT cidrs FROM aliases WHERE node = ?1")
            .and_then(|mut s| s.query_row([name], |row| row.get(0)).optional())
            .map_err(|e| self.backend_err("read alias of", name, &self.sql("read alias", e)))?;
        match row {
            None => Ok(Vec::new()),
            Some(cidrs) => decode_list(&self.path, "alias", name, &cidrs)
                .map_err(|e| self.backend_err("read alias of", name, &e)),
        }
    }

    fn add_alias(&mut self, node: &Node, cidrs: &[String]) -> Result<(), BackendError> {
        let name = node.name.as_str();
        self.set_alias(name, cidrs).map_err(|e| match e {
            SetError::NotFound => BackendError::NotFound(format!("node {name} has no VM")),
            SetError::Taken(current) => BackendError::Conflict(format!(
                "VM of node {name} already has alias {current:?}; refusing to add {cidrs:?}"
            )),
            SetError::Store(e) => self.backend_err("add alias to", name, &e),
        })
    }
}

impl Events for Store {
    fn emit_node_warning(&mut self, name: &str, reason: &str, message: &str) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let result = self
            .conn
            .prepare_cached(
                "INSERT INTO events (time_ms, node, reason, message) VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut s| s.execute(params![now, name, reason, message]));
        if let Err(e) = result {
            // Events are best effort, as in Kubernetes' recorder.
            tracing::warn!(node = name, reason, error = %e, "cannot record event");
        }
    }
}

fn sql_err(path: &Path, op: &str, source: rusqlite::Error) -> StoreError {
    StoreError::Sql {
        path: path.to_path_buf(),
        op: op.to_owned(),
        source,
    }
}

fn last_seq(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    // The AUTOINCREMENT high-water mark survives pruning, unlike max(seq).
    conn.query_row(
        "SELECT seq FROM sqlite_sequence WHERE name = 'changes'",
        [],
        |row| row.get(0),
    )
    .optional()
    .map(Option::unwrap_or_default)
    .map_err(|e| sql_err(path, "read change log position", e))
}

struct RawRecord {
    name: String,
    provider_id: Option<String>,
    pod_cidrs: String,
    network_unavailable: bool,
    alias: Option<String>,
}

fn raw_record(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawRecord> {
    Ok(RawRecord {
        name: row.get(0)?,
        provider_id: row.get(1)?,
        pod_cidrs: row.get(2)?,
        network_unavailable: row.get(3)?,
        alias: row.get(4)?,
    })
}

impl RawRecord {
    fn decode(self, path: &Path) -> Result<NodeRecord, StoreError> {
        let pod_cidrs = decode_list(path, "pod_cidrs", &self.name, &self.pod_cidrs)?;
        let alias = match &self.alias {
            Some(a) => decode_list(path, "alias", &self.name, a)?,
            None => Vec::new(),
        };
        Ok(NodeRecord {
            node: Node {
                name: self.name,
                provider_id: self.provider_id,
                pod_cidrs,
            },
            network_unavailable: self.network_unavailable,
            alias,
        })
    }
}

fn read_record(
    conn: &Connection,
    path: &Path,
    name: &str,
) -> Result<Option<NodeRecord>, StoreError> {
    conn.prepare_cached(
        "SELECT n.name, n.provider_id, n.pod_cidrs, n.network_unavailable, a.cidrs
         FROM nodes n LEFT JOIN aliases a ON a.node = n.name WHERE n.name = ?1",
    )
    .and_then(|mut s| s.query_row([name], raw_record).optional())
    .map_err(|e| sql_err(path, &format!("read node {name}"), e))?
    .map(|raw| raw.decode(path))
    .transpose()
}

/// Write a node (and its alias, when given) and log the change.
fn write_spec(
    conn: &Connection,
    path: &Path,
    spec: &NodeSpec,
    old: Option<&NodeRecord>,
) -> Result<(), StoreError> {
    let name = spec.node.name.as_str();
    let object_changed = old
        .is_none_or(|o| o.node != spec.node || o.network_unavailable != spec.network_unavailable);
    let result = (|| {
        if object_changed {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO nodes (name, provider_id, pod_cidrs, network_unavailable)
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                name,
                spec.node.provider_id,
                encode_list(&spec.node.pod_cidrs),
                spec.network_unavailable
            ])?;
        }
        match &spec.alias {
            Some(alias) if alias.is_empty() => {
                conn.prepare_cached("DELETE FROM aliases WHERE node = ?1")?
                    .execute([name])?;
            }
            Some(alias) => {
                conn.prepare_cached(
                    "INSERT OR REPLACE INTO aliases (node, cidrs) VALUES (?1, ?2)",
                )?
                .execute(params![name, encode_list(alias)])?;
            }
            None => {}
        }
        conn.prepare_cached("INSERT INTO changes (node, deleted) VALUES (?1, 0)")?
            .execute([name])?;
        Ok(())
    })();
    result.map_err(|e| sql_err(path, &format!("write node {name}"), e))
}

fn spec_matches(spec: &NodeSpec, old: &NodeRecord) -> bool {
    old.node == spec.node
        && old.network_unavailable == spec.network_unavailable
        && spec.alias.as_ref().is_none_or(|a| *a == old.alias)
}

fn encode_list(list: &[String]) -> String {
    serde_json::to_string(list).unwrap_or_else(|_| "[]".into())
}

fn decode_list(
    path: &Path,
    what: &'static str,
    node: &str,
    value: &str,
) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(value).map_err(|_| StoreError::Corrupt {
        path: path.to_path_buf(),
        what,
        node: node.to_owned(),
        value: value.to_owned(),
    })
}

/// Equal as sets of ranges (order and duplicates do not matter).
fn same_set(a: &[String], b: &[String]) -> bool {
    a.iter().collect::<BTreeSet<_>>() == b.iter().collect::<BTreeSet<_>>()
}

/// A node as JSON (`name`, `providerID`, `podCIDRs`): the deleted object in the change log and
/// the `--output json` shape.
#[derive(Serialize, Deserialize)]
struct NodeJson {
    name: String,
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    provider_id: Option<String>,
    #[serde(rename = "podCIDRs", default)]
    pod_cidrs: Vec<String>,
}

impl From<&Node> for NodeJson {
    fn from(n: &Node) -> Self {
        Self {
            name: n.name.clone(),
            provider_id: n.provider_id.clone(),
            pod_cidrs: n.pod_cidrs.clone(),
        }
    }
}

impl From<NodeJson> for Node {
    fn from(n: NodeJson) -> Self {
        Self {
            name: n.name,
            provider_id: n.provider_id,
            pod_cidrs: n.pod_cidrs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(&dir.path().join("s.db")).unwrap();
        (dir, store)
    }

    fn spec(name: &str, cidrs: &[&str], alias: Option<&[&str]>) -> NodeSpec {
        NodeSpec {
            node: Node::new(name, cidrs),
            network_unavailable: cidrs.is_empty(),
            alias: alias.map(|a| a.iter().map(|s| (*s).to_owned()).collect()),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn open_missing_store_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.db");
        let err = Store::open(&path).unwrap_err();
        assert!(matches!(err, StoreError::Missing(_)));
        assert!(err.to_string().contains("nope.db"), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn newer_schema_is_refused_with_both_versions() {
        let (dir, store) = temp();
        store
            .conn
            .execute(
                "UPDATE meta SET value = '7' WHERE key = 'schema_version'",
                [],
            )
            .unwrap();
        drop(store);
        let err = Store::open(&dir.path().join("s.db")).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(
            err,
            StoreError::NewerSchema {
                found: 7,
                supported: SCHEMA_VERSION,
                ..
            }
        ));
        assert!(
            msg.contains("s.db") && msg.contains('7') && msg.contains(&SCHEMA_VERSION.to_string()),
            "{msg}"
        );
    }

    #[test]
    fn foreign_sqlite_file_is_not_a_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        assert!(matches!(
            Store::open(&path).unwrap_err(),
            StoreError::NotAStore { .. }
        ));
    }

    #[test]
    fn non_sqlite_file_is_not_a_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("text.db");
        std::fs::write(
            &path,
            "definitely not sqlite, but long enough to have a header........",
        )
        .unwrap();
        let err = Store::open(&path).unwrap_err();
        assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
    }

    #[test]
    fn add_get_and_list_nodes() {
        let (_dir, mut store) = temp();
        store
            .add_node(&spec("b", &["10.0.1.0/24"], Some(&["10.0.1.0/24"])))
            .unwrap();
        store.add_node(&spec("a", &[], None)).unwrap();
        assert!(matches!(
            store.add_node(&spec("a", &[], None)),
            Err(StoreError::NodeExists(_))
        ));
        assert_eq!(
            store.get_node("b").unwrap(),
            Node::new("b", &["10.0.1.0/24"])
        );
        assert!(matches!(
            store.get_node("c"),
            Err(BackendError::NotFound(_))
        ));
        let names: Vec<_> = store
            .list_nodes()
            .unwrap()
            .into_iter()
            .map(|n| n.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
        let records = store.records().unwrap();
        assert_eq!(records[1].alias, strings(&["10.0.1.0/24"]));
        assert!(records[0].network_unavailable);
    }

    #[test]
    fn pod_ranges_are_set_once() {
        let (_dir, mut store) = temp();
        store.add_node(&spec("a", &[], None)).unwrap();
        let a = Node::new("a", &[]);
        store
            .update_node_pod_cidrs(&a, &strings(&["10.0.0.0/24"]))
            .unwrap();
        store
            .update_node_pod_cidrs(&a, &strings(&["10.0.0.0/24"]))
            .unwrap();
        let err = store
            .update_node_pod_cidrs(&a, &strings(&["10.0.1.0/24"]))
            .unwrap_err();
        assert!(
            matches!(&err, BackendError::Conflict(m) if m.contains("10.0.0.0/24") && m.contains("10.0.1.0/24")),
            "{err}"
        );
        assert!(matches!(
            store.update_node_pod_cidrs(&Node::new("x", &[]), &strings(&["10.0.1.0/24"])),
            Err(BackendError::NotFound(_))
        ));
        assert_eq!(
            store.get_node("a").unwrap().pod_cidrs,
            strings(&["10.0.0.0/24"])
        );
    }

    #[test]
    fn an_alias_is_added_once_and_needs_a_vm() {
        let (_dir, mut store) = temp();
        store.add_node(&spec("a", &[], None)).unwrap();
        let a = Node::new("a", &[]);
        assert_eq!(store.alias(&a).unwrap(), Vec::<String>::new());
        store.add_alias(&a, &strings(&["10.0.0.0/24"])).unwrap();
        store.add_alias(&a, &strings(&["10.0.0.0/24"])).unwrap();
        assert!(matches!(
            store.add_alias(&a, &strings(&["10.0.9.0/24"])),
            Err(BackendError::Conflict(_))
        ));
        assert!(matches!(
            store.add_alias(&Node::new("x", &[]), &strings(&["10.0.9.0/24"])),
            Err(BackendError::NotFound(_))
        ));
        assert_eq!(store.alias(&a).unwrap(), strings(&["10.0.0.0/24"]));
    }

    #[test]
    fn network_condition_and_events() {
        let (_dir, mut store) = temp();
        store.add_node(&spec("a", &[], None)).unwrap();
        store.update_node_network_unavailable("a", false).unwrap();
        assert!(!store.record("a").unwrap().unwrap().network_unavailable);
        assert!(matches!(
            store.update_node_network_unavailable("x", false),
            Err(BackendError::NotFound(_))
        ));
        store.emit_node_warning("a", "CloudCIDRAllocatorMismatch", "one");
        store.emit_node_warning("b", "Other", "two");
        store.emit_node_warning("a", "Other", "three");
        let all = store.events(None, 0).unwrap();
        assert_eq!(
            all.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(),
            ["one", "two", "three"]
        );
        let last_a = store.events(Some("a"), 1).unwrap();
        assert_eq!(last_a.len(), 1);
        assert_eq!(last_a[0].message, "three");
        assert_eq!(store.event_count().unwrap(), 3);
    }

    #[test]
    fn apply_reports_and_logs_only_real_changes() {
        let (_dir, mut store) = temp();
        let (_, start) = store.snapshot().unwrap();
        let first = store
            .apply(&[spec("a", &[], None), spec("b", &[], Some(&["10.0.0.0/24"]))])
            .unwrap();
        assert_eq!(
            first,
            ApplyReport {
                added: 2,
                changed: 0,
                unchanged: 0
            }
        );
        let again = store
            .apply(&[
                spec("a", &[], None),
                spec("b", &[], Some(&["10.0.0.0/24"])),
                spec("c", &[], None),
            ])
            .unwrap();
        assert_eq!(
            again,
            ApplyReport {
                added: 1,
                changed: 0,
                unchanged: 2
            }
        );
        let changed = store.apply(&[spec("a", &["10.0.5.0/24"], None)]).unwrap();
        assert_eq!(changed.changed, 1);
        let names: Vec<_> = store
            .changes_since(start, 100)
            .unwrap()
            .into_iter()
            .map(|c| match c {
                Change::Upserted { name, .. } => name,
                Change::Deleted { node, .. } => format!("-{}", node.name),
            })
            .collect();
        assert_eq!(names, ["a", "b", "c", "a"]);
    }

    #[test]
    fn remove_logs_the_deleted_object_and_drops_the_alias() {
        let (_dir, mut store) = temp();
        store
            .add_node(&spec("a", &["10.0.0.0/24"], Some(&["10.0.0.0/24"])))
            .unwrap();
        let (_, seq) = store.snapshot().unwrap();
        store.remove_node("a").unwrap();
        assert!(matches!(
            store.remove_node("a"),
            Err(StoreError::NodeNotFound(_))
        ));
        let changes = store.changes_since(seq, 10).unwrap();
        assert!(
            matches!(&changes[..], [Change::Deleted { node, .. }] if *node == Node::new("a", &["10.0.0.0/24"]))
        );
        store.add_node(&spec("a", &[], None)).unwrap();
        assert!(store.alias(&Node::new("a", &[])).unwrap().is_empty());
    }

    #[test]
    fn pruning_keeps_the_log_position() {
        let (_dir, mut store) = temp();
        store
            .apply(&[spec("a", &[], None), spec("b", &[], None)])
            .unwrap();
        let (_, seq) = store.snapshot().unwrap();
        store.prune_changes(seq).unwrap();
        assert_eq!(store.snapshot().unwrap().1, seq);
        store.add_node(&spec("c", &[], None)).unwrap();
        assert!(
            matches!(&store.changes_since(seq, 10).unwrap()[..], [Change::Upserted { name, .. }] if name == "c")
        );
    }

    #[test]
    fn failed_apply_leaves_the_store_untouched() {
        let (_dir, mut store) = temp();
        store.add_node(&spec("a", &[], None)).unwrap();
        // A trigger makes the second write fail half-way through the transaction.
        store
            .conn
            .execute_batch(
                "CREATE TRIGGER boom BEFORE INSERT ON nodes WHEN NEW.name = 'bad'
                 BEGIN SELECT RAISE(ABORT, 'boom'); END",
            )
            .unwrap();
        assert!(
            store
                .apply(&[spec("b", &[], None), spec("bad", &[], None)])
                .is_err()
        );
        assert_eq!(store.records().unwrap().len(), 1);
    }

    #[test]
    fn one_run_lock_per_store() {
        let (_dir, store) = temp();
        let lock = store.lock_for_run().unwrap();
        assert!(matches!(
            store.lock_for_run(),
            Err(StoreError::Locked { .. })
        ));
        drop(lock);
        store.lock_for_run().unwrap();
    }

    #[test]
    fn generated_index_continues_after_the_highest() {
        let (_dir, mut store) = temp();
        assert_eq!(store.next_generated_index("gen-").unwrap(), 1);
        store
            .apply(&[
                spec("gen-000007", &[], None),
                spec("gen-x", &[], None),
                spec("other-9", &[], None),
            ])
            .unwrap();
        assert_eq!(store.next_generated_index("gen-").unwrap(), 8);
    }
}
