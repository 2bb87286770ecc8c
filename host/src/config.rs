//! The `nodeipam` configuration: a TOML file, flags overriding it, and documented defaults.
//!
//! ```toml
//! # Every key is optional; the values shown are the defaults.
//! mode = "sync-from-cluster"      # or "sync-from-cloud"
//! resync-ms = 30000               # re-check each node this often after a success
//! initial-retry-ms = 250          # first retry after a failure; doubles per failure
//! max-backoff-ms = 10000          # upper bound of the retry delay
//! store = "nodeipam.db"           # the embedded store (SQLite file)
//! # component = "target/nodeipam.wasm"  # default: nodeipam.wasm beside the binary or in
//! #                                      # its parent directory (target/), then ./target/
//! # cache-dir = "..."             # compiled-component cache; default: the host library's
//! # metrics-addr = "127.0.0.1:9090"  # serve Prometheus text on /metrics; default: off
//! watch-interval-ms = 1000        # `run` without --once: how often to poll the store
//!
//! [[cluster-cidr]]                # one, or two of different IP families (dual-stack)
//! cidr = "10.0.0.0/8"
//! node-mask-size = 24             # default: 24 for IPv4, 64 for IPv6
//!
//! [sandbox]                       # defaults: the host library's
//! # memory-bytes = 1073741824     # linear-memory cap of the component
//! # call-timeout-ms = 60000       # deadline of one export call
//! ```
//!
//! Relative paths in a file are relative to the file's directory; on the command line, to the
//! working directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::Deserialize;

/// Default `resync-ms`.
pub const DEFAULT_RESYNC_MS: u64 = 30_000;
/// Default `initial-retry-ms`.
pub const DEFAULT_INITIAL_RETRY_MS: u64 = 250;
/// Default `max-backoff-ms`.
pub const DEFAULT_MAX_BACKOFF_MS: u64 = 10_000;
/// Default `watch-interval-ms`.
pub const DEFAULT_WATCH_INTERVAL_MS: u64 = 1_000;
/// Default store file.
pub const DEFAULT_STORE: &str = "nodeipam.db";
/// Default cluster CIDR.
pub const DEFAULT_CLUSTER_CIDR: &str = "10.0.0.0/8";
/// Default node mask size for IPv4 cluster CIDRs (Kubernetes' default).
pub const DEFAULT_NODE_MASK_V4: u8 = 24;
/// Default node mask size for IPv6 cluster CIDRs (Kubernetes' default).
pub const DEFAULT_NODE_MASK_V6: u8 = 64;
/// The component's file name, looked for beside the binary.
pub const COMPONENT_FILE: &str = "nodeipam.wasm";

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or has a bad value (the message has line and column).
    #[error("config file {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line, column and the offending text.
        message: String,
    },
    /// The merged configuration is not usable.
    #[error("{origin}: {message}")]
    Invalid {
        /// Where the bad value came from: the file or the flags.
        origin: String,
        /// What is wrong, naming the value.
        message: String,
    },
    /// No component file was found.
    #[error(
        "component not found (looked for {}); build it with `make build` or pass --component",
        tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    ComponentNotFound {
        /// Every path looked at.
        tried: Vec<PathBuf>,
    },
}

/// Which side allocates ranges (the WIT `sync-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The component allocates and pushes each range to the cloud.
    #[default]
    SyncFromCluster,
    /// The cloud allocates; the component copies aliases onto nodes.
    SyncFromCloud,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::SyncFromCluster => "sync-from-cluster",
            Self::SyncFromCloud => "sync-from-cloud",
        })
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sync-from-cluster" => Ok(Self::SyncFromCluster),
            "sync-from-cloud" => Ok(Self::SyncFromCloud),
            other => Err(format!(
                "unknown mode {other:?} (expected sync-from-cluster or sync-from-cloud)"
            )),
        }
    }
}

/// One cluster CIDR and the size of the node ranges carved from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterCidr {
    /// The cluster range (network address, no host bits).
    pub cidr: IpNet,
    /// Prefix length of each node range.
    pub node_mask_size: u8,
}

impl ClusterCidr {
    /// Check the rules of DESIGN.md: a network address, node mask at least the cluster mask and
    /// at most 24 bits longer, within the family's width.
    pub fn new(cidr: IpNet, node_mask_size: Option<u8>) -> Result<Self, String> {
        if cidr.trunc() != cidr {
            return Err(format!(
                "cluster CIDR {cidr} has host bits set (did you mean {}?)",
                cidr.trunc()
            ));
        }
        let node_mask_size = node_mask_size.unwrap_or(match cidr {
            IpNet::V4(_) => DEFAULT_NODE_MASK_V4,
            IpNet::V6(_) => DEFAULT_NODE_MASK_V6,
        });
        let prefix = cidr.prefix_len();
        if node_mask_size < prefix
            || node_mask_size > cidr.max_prefix_len()
            || node_mask_size - prefix > 24
        {
            return Err(format!(
                "node mask size {node_mask_size} does not fit cluster CIDR {cidr} (it must be \
                 between {prefix} and {}, at most 24 bits longer)",
                (prefix + 24).min(cidr.max_prefix_len())
            ));
        }
        Ok(Self {
            cidr,
            node_mask_size,
        })
    }

    /// Whether `range` (a parsed node range) lies inside this cluster CIDR.
    pub fn contains(&self, range: &IpNet) -> bool {
        self.cidr.contains(range)
    }
}

/// A resolved configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The file it was read from, if any.
    pub file: Option<PathBuf>,
    /// Who allocates.
    pub mode: Mode,
    /// One, or two of different families.
    pub cluster_cidrs: Vec<ClusterCidr>,
    /// Delay before a node is re-checked after a success.
    pub resync_ms: u64,
    /// Delay before the first retry after a failure.
    pub initial_retry_ms: u64,
    /// Upper bound of the retry delay.
    pub max_backoff_ms: u64,
    /// The embedded store.
    pub store: PathBuf,
    /// The component; `None`: look in the default places ([`Config::component_path`]).
    pub component: Option<PathBuf>,
    /// Compiled-component cache; `None`: the host library's default.
    pub cache_dir: Option<PathBuf>,
    /// Where to serve metrics; `None`: off.
    pub metrics_addr: Option<SocketAddr>,
    /// How often `run` polls the store for changes.
    pub watch_interval_ms: u64,
    /// Component limits; `None`: the host library's defaults.
    pub memory_bytes: Option<u64>,
    /// Deadline of one export call, ms; `None`: the host library's default.
    pub call_timeout_ms: Option<u64>,
}

/// Values given on the command line; each one set overrides the file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--mode`.
    pub mode: Option<Mode>,
    /// `--cluster-cidr` (repeated or comma-separated); replaces the file's list.
    pub cluster_cidrs: Vec<IpNet>,
    /// `--node-cidr-mask-size-ipv4`.
    pub node_mask_v4: Option<u8>,
    /// `--node-cidr-mask-size-ipv6`.
    pub node_mask_v6: Option<u8>,
    /// `--resync-ms`.
    pub resync_ms: Option<u64>,
    /// `--initial-retry-ms`.
    pub initial_retry_ms: Option<u64>,
    /// `--max-backoff-ms`.
    pub max_backoff_ms: Option<u64>,
    /// `--store`.
    pub store: Option<PathBuf>,
    /// `--component`.
    pub component: Option<PathBuf>,
    /// `--cache-dir`.
    pub cache_dir: Option<PathBuf>,
    /// `--metrics-addr`.
    pub metrics_addr: Option<SocketAddr>,
    /// `--watch-interval-ms`.
    pub watch_interval_ms: Option<u64>,
    /// `--memory-bytes`.
    pub memory_bytes: Option<u64>,
    /// `--call-timeout-ms`.
    pub call_timeout_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct FileConfig {
    mode: Option<Mode>,
    #[serde(rename = "cluster-cidr")]
    cluster_cidrs: Option<Vec<FileClusterCidr>>,
    resync_ms: Option<u64>,
    initial_retry_ms: Option<u64>,
    max_backoff_ms: Option<u64>,
    store: Option<PathBuf>,
    component: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
    metrics_addr: Option<SocketAddr>,
    watch_interval_ms: Option<u64>,
    sandbox: Option<FileSandbox>,
}

#[derive(Debug, Deserialize)]
#[serde(try_from = "RawClusterCidr")]
struct FileClusterCidr(ClusterCidr);

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawClusterCidr {
    cidr: IpNet,
    node_mask_size: Option<u8>,
}

impl TryFrom<RawClusterCidr> for FileClusterCidr {
    type Error = String;

    fn try_from(raw: RawClusterCidr) -> Result<Self, String> {
        ClusterCidr::new(raw.cidr, raw.node_mask_size).map(Self)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct FileSandbox {
    memory_bytes: Option<u64>,
    call_timeout_ms: Option<u64>,
}

impl Config {
    /// Read `file` (when given), apply `overrides`, fill in defaults and check the result.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let parsed = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
                Self::parse_file(path, &text)?
            }
            None => FileConfig::default(),
        };
        Self::merge(file, parsed, overrides)
    }

    /// Parse TOML text as the file `path` (for messages and relative paths).
    pub fn parse(path: &Path, text: &str, overrides: &Overrides) -> Result<Self, ConfigError> {
        let parsed = Self::parse_file(path, text)?;
        Self::merge(Some(path), parsed, overrides)
    }

    fn parse_file(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_owned(),
        })
    }

    fn merge(file: Option<&Path>, parsed: FileConfig, o: &Overrides) -> Result<Self, ConfigError> {
        let base = file.and_then(Path::parent).unwrap_or(Path::new(""));
        let relative = |p: PathBuf| {
            if p.is_absolute() {
                p
            } else {
                normalize(&base.join(p))
            }
        };
        let file_origin = || match file {
            Some(f) => format!("config file {}", f.display()),
            None => "defaults".to_owned(),
        };

        let (cluster_cidrs, cidr_origin) = if o.cluster_cidrs.is_empty() {
            let list = match parsed.cluster_cidrs {
                Some(list) => list.into_iter().map(|c| c.0).collect(),
                None => vec![default_cluster_cidr()],
            };
            (list, file_origin())
        } else {
            let list = o
                .cluster_cidrs
                .iter()
                .map(|&cidr| {
                    let mask = match cidr {
                        IpNet::V4(_) => o.node_mask_v4,
                        IpNet::V6(_) => o.node_mask_v6,
                    };
                    ClusterCidr::new(cidr, mask).map_err(|message| ConfigError::Invalid {
                        origin: "--cluster-cidr".into(),
                        message,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            (list, "--cluster-cidr".to_owned())
        };
        check_families(&cluster_cidrs).map_err(|message| ConfigError::Invalid {
            origin: cidr_origin,
            message,
        })?;

        let sandbox = parsed.sandbox.unwrap_or_default();
        let config = Self {
            file: file.map(Path::to_path_buf),
            mode: o.mode.or(parsed.mode).unwrap_or_default(),
            cluster_cidrs,
            resync_ms: o
                .resync_ms
                .or(parsed.resync_ms)
                .unwrap_or(DEFAULT_RESYNC_MS),
            initial_retry_ms: o
                .initial_retry_ms
                .or(parsed.initial_retry_ms)
                .unwrap_or(DEFAULT_INITIAL_RETRY_MS),
            max_backoff_ms: o
                .max_backoff_ms
                .or(parsed.max_backoff_ms)
                .unwrap_or(DEFAULT_MAX_BACKOFF_MS),
            store: o
                .store
                .clone()
                .or_else(|| parsed.store.map(relative))
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STORE)),
            component: o
                .component
                .clone()
                .or_else(|| parsed.component.map(relative)),
            cache_dir: o
                .cache_dir
                .clone()
                .or_else(|| parsed.cache_dir.map(relative)),
            metrics_addr: o.metrics_addr.or(parsed.metrics_addr),
            watch_interval_ms: o
                .watch_interval_ms
                .or(parsed.watch_interval_ms)
                .unwrap_or(DEFAULT_WATCH_INTERVAL_MS),
            memory_bytes: o.memory_bytes.or(sandbox.memory_bytes),
            call_timeout_ms: o.call_timeout_ms.or(sandbox.call_timeout_ms),
        };
        for (name, value) in [
            ("resync-ms", config.resync_ms),
            ("initial-retry-ms", config.initial_retry_ms),
            ("max-backoff-ms", config.max_backoff_ms),
            ("watch-interval-ms", config.watch_interval_ms),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid {
                    origin: file_origin(),
                    message: format!("{name} must be positive, not 0"),
                });
            }
        }
        if config.initial_retry_ms > config.max_backoff_ms {
            return Err(ConfigError::Invalid {
                origin: file_origin(),
                message: format!(
                    "initial-retry-ms {} is larger than max-backoff-ms {}",
                    config.initial_retry_ms, config.max_backoff_ms
                ),
            });
        }
        Ok(config)
    }

    /// Where the configuration came from, for messages.
    pub fn origin(&self) -> String {
        match &self.file {
            Some(f) => format!("config file {}", f.display()),
            None => "the default configuration".into(),
        }
    }

    /// The component to load: the configured one, else `nodeipam.wasm` beside the running
    /// binary, in its parent directory (`target/` for `target/release/nodeipam`), or in
    /// `./target/`.
    pub fn component_path(&self) -> Result<PathBuf, ConfigError> {
        if let Some(path) = &self.component {
            return if path.is_file() {
                Ok(path.clone())
            } else {
                Err(ConfigError::ComponentNotFound {
                    tried: vec![path.clone()],
                })
            };
        }
        let mut tried = Vec::new();
        if let Some(dir) = std::env::current_exe()
            .ok()
            .as_deref()
            .and_then(Path::parent)
        {
            tried.push(dir.join(COMPONENT_FILE));
            if let Some(parent) = dir.parent() {
                tried.push(parent.join(COMPONENT_FILE));
            }
        }
        tried.push(Path::new("target").join(COMPONENT_FILE));
        match tried.iter().find(|p| p.is_file()) {
            Some(found) => Ok(found.clone()),
            None => Err(ConfigError::ComponentNotFound { tried }),
        }
    }

    /// The cluster CIDR of `range`'s family that contains it, if any.
    pub fn cluster_cidr_of(&self, range: &IpNet) -> Option<&ClusterCidr> {
        self.cluster_cidrs.iter().find(|c| c.contains(range))
    }
}

/// A node range outside every configured cluster CIDR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    /// The node.
    pub node: String,
    /// The range, as the node has it.
    pub range: String,
}

impl Config {
    /// Node ranges that parse but lie outside every cluster CIDR: what a cluster CIDR change
    /// would orphan. Unparsable ranges are not orphans (the component reports them).
    pub fn orphans<'a>(
        &self,
        nodes: impl IntoIterator<Item = &'a crate::backend::Node>,
    ) -> Vec<Orphan> {
        nodes
            .into_iter()
            .flat_map(|n| n.pod_cidrs.iter().map(move |r| (n, r)))
            .filter(|(_, r)| {
                r.parse::<IpNet>()
                    .is_ok_and(|net| self.cluster_cidr_of(&net).is_none())
            })
            .map(|(n, r)| Orphan {
                node: n.name.clone(),
                range: r.clone(),
            })
            .collect()
    }

    /// Per cluster CIDR: node ranges in use by `nodes` (parsable ranges inside it, counted in
    /// node-mask units) and how many it holds.
    pub fn usage<'a>(
        &self,
        nodes: impl IntoIterator<Item = &'a crate::backend::Node>,
    ) -> Vec<(ClusterCidr, u64, u64)> {
        let mut used: Vec<(std::collections::HashSet<IpNet>, u64)> = self
            .cluster_cidrs
            .iter()
            .map(|_| Default::default())
            .collect();
        for range in nodes.into_iter().flat_map(|n| &n.pod_cidrs) {
            let Ok(net) = range.parse::<IpNet>() else {
                continue;
            };
            let Some(i) = self.cluster_cidrs.iter().position(|c| c.contains(&net)) else {
                continue;
            };
            let mask = self.cluster_cidrs[i].node_mask_size;
            if net.prefix_len() >= mask {
                let unit = IpNet::new(net.addr(), mask)
                    .map(|n| n.trunc())
                    .unwrap_or(net);
                used[i].0.insert(unit);
            } else {
                used[i].1 += 1u64
                    .checked_shl(u32::from(mask - net.prefix_len()))
                    .unwrap_or(u64::MAX);
            }
        }
        self.cluster_cidrs
            .iter()
            .zip(used)
            .map(|(c, (units, big))| {
                let max = 1u64
                    .checked_shl(u32::from(c.node_mask_size - c.cidr.prefix_len()))
                    .unwrap_or(u64::MAX);
                (*c, (units.len() as u64).saturating_add(big).min(max), max)
            })
            .collect()
    }
}

/// Drop `.` and fold `dir/..` lexically (`examples/../target/x` → `target/x`), for messages.
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            other => out.push(other),
        }
    }
    if out.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        out
    }
}

fn default_cluster_cidr() -> ClusterCidr {
    ClusterCidr {
        cidr: DEFAULT_CLUSTER_CIDR
            .parse()
            .unwrap_or(IpNet::V4(Default::default())),
        node_mask_size: DEFAULT_NODE_MASK_V4,
    }
}

fn check_families(list: &[ClusterCidr]) -> Result<(), String> {
    match list {
        [] => Err("at least one cluster CIDR is needed".into()),
        [_] => Ok(()),
        [a, b] if a.cidr.addr().is_ipv4() != b.cidr.addr().is_ipv4() => Ok(()),
        [a, b] => Err(format!(
            "dual-stack cluster CIDRs must be of different IP families, not {} and {}",
            a.cidr, b.cidr
        )),
        more => Err(format!(
            "at most two cluster CIDRs (one per IP family), not {}: {}",
            more.len(),
            more.iter()
                .map(|c| c.cidr.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(
            Path::new("/etc/nodeipam/n.toml"),
            text,
            &Overrides::default(),
        )
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn empty_file_gives_the_documented_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.mode, Mode::SyncFromCluster);
        assert_eq!(
            c.cluster_cidrs,
            [ClusterCidr {
                cidr: "10.0.0.0/8".parse().unwrap(),
                node_mask_size: 24
            }]
        );
        assert_eq!(
            (c.resync_ms, c.initial_retry_ms, c.max_backoff_ms),
            (30_000, 250, 10_000)
        );
        assert_eq!(c.store, PathBuf::from("nodeipam.db"));
        assert_eq!(
            (c.metrics_addr, c.memory_bytes, c.call_timeout_ms),
            (None, None, None)
        );
    }

    #[test]
    fn full_file_with_dual_stack_and_relative_paths() {
        let c = parse(
            r#"
mode = "sync-from-cloud"
resync-ms = 1000
store = "data/s.db"
metrics-addr = "127.0.0.1:9100"
[[cluster-cidr]]
cidr = "10.0.0.0/16"
node-mask-size = 26
[[cluster-cidr]]
cidr = "fd00::/48"
[sandbox]
memory-bytes = 1048576
"#,
        )
        .unwrap();
        assert_eq!(c.mode, Mode::SyncFromCloud);
        assert_eq!(c.cluster_cidrs[1].node_mask_size, 64);
        assert_eq!(c.cluster_cidrs[0].node_mask_size, 26);
        assert_eq!(c.store, PathBuf::from("/etc/nodeipam/data/s.db"));
        assert_eq!(c.memory_bytes, Some(1_048_576));
        assert_eq!(c.resync_ms, 1000);
    }

    #[test]
    fn relative_paths_are_folded() {
        assert_eq!(
            normalize(Path::new("examples/../target/x.db")),
            PathBuf::from("target/x.db")
        );
        assert_eq!(normalize(Path::new("../a/./b")), PathBuf::from("../a/b"));
    }

    #[test]
    fn flags_override_the_file() {
        let o = Overrides {
            mode: Some(Mode::SyncFromCloud),
            cluster_cidrs: vec!["192.168.0.0/16".parse().unwrap()],
            node_mask_v4: Some(20),
            store: Some("x.db".into()),
            ..Overrides::default()
        };
        let c = Config::parse(
            Path::new("n.toml"),
            "mode = \"sync-from-cluster\"\nstore = \"y.db\"\n",
            &o,
        )
        .unwrap();
        assert_eq!(c.mode, Mode::SyncFromCloud);
        assert_eq!(c.store, PathBuf::from("x.db"));
        assert_eq!(c.cluster_cidrs[0].node_mask_size, 20);
    }

    #[test]
    fn syntax_error_names_file_and_line() {
        let e = err("mode = \"sync-from-cluster\"\nresync-ms = = 3\n");
        assert!(
            e.contains("/etc/nodeipam/n.toml") && e.contains("line 2"),
            "{e}"
        );
    }

    #[test]
    fn unknown_mode_names_the_value_and_line() {
        let e = err("\n\nmode = \"sync-from-moon\"\n");
        assert!(e.contains("sync-from-moon") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn unknown_key_is_refused() {
        let e = err("resync = 3\n");
        assert!(e.contains("resync") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn bad_cluster_cidr_names_the_value_and_line() {
        let e = err("[[cluster-cidr]]\ncidr = \"10.0.0.0/33\"\n");
        assert!(e.contains("10.0.0.0/33") || e.contains("invalid IP"), "{e}");
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn node_mask_outside_the_rules_is_refused() {
        for (cidr, mask) in [("10.0.0.0/16", 8), ("10.0.0.0/8", 33), ("fd00::/48", 80)] {
            let e = err(&format!(
                "[[cluster-cidr]]\ncidr = \"{cidr}\"\nnode-mask-size = {mask}\n"
            ));
            assert!(
                e.contains(cidr) && e.contains(&mask.to_string()) && e.contains("line"),
                "{e}"
            );
        }
        assert!(parse("[[cluster-cidr]]\ncidr = \"fd00::/48\"\nnode-mask-size = 72\n").is_ok());
    }

    #[test]
    fn host_bits_are_refused() {
        let e = err("[[cluster-cidr]]\ncidr = \"10.1.0.0/8\"\n");
        assert!(e.contains("10.0.0.0/8"), "{e}");
    }

    #[test]
    fn two_cidrs_of_one_family_are_refused() {
        let e = err(
            "[[cluster-cidr]]\ncidr = \"10.0.0.0/8\"\n[[cluster-cidr]]\ncidr = \"11.0.0.0/8\"\n",
        );
        assert!(
            e.contains("10.0.0.0/8") && e.contains("11.0.0.0/8") && e.contains("n.toml"),
            "{e}"
        );
    }

    #[test]
    fn zero_interval_and_inverted_backoff_are_refused() {
        assert!(err("resync-ms = 0\n").contains("resync-ms"));
        assert!(
            err("initial-retry-ms = 500\nmax-backoff-ms = 100\n").contains("max-backoff-ms 100")
        );
    }

    #[test]
    fn unreadable_file_names_the_file() {
        let e =
            Config::load(Some(Path::new("/no/such/n.toml")), &Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("/no/such/n.toml"), "{e}");
    }

    #[test]
    fn orphans_are_parsable_ranges_outside_every_cluster_cidr() {
        use crate::backend::Node;
        let c = parse("[[cluster-cidr]]\ncidr = \"10.0.0.0/16\"\n").unwrap();
        let nodes = [
            Node::new("in", &["10.0.1.0/24"]),
            Node::new("out", &["10.1.1.0/24"]),
            Node::new("bad", &["10.0.300.0/24"]),
            Node::new("v6", &["fd00::/64"]),
        ];
        let names: Vec<_> = c
            .orphans(&nodes)
            .into_iter()
            .map(|o| (o.node, o.range))
            .collect();
        assert_eq!(
            names,
            [
                ("out".to_owned(), "10.1.1.0/24".to_owned()),
                ("v6".to_owned(), "fd00::/64".to_owned())
            ]
        );
        let usage = c.usage(&nodes);
        assert_eq!((usage[0].1, usage[0].2), (1, 256));
    }

    #[test]
    fn explicit_missing_component_is_named() {
        let c = Config {
            component: Some("/no/x.wasm".into()),
            ..parse("").unwrap()
        };
        assert!(
            c.component_path()
                .unwrap_err()
                .to_string()
                .contains("/no/x.wasm")
        );
    }
}
