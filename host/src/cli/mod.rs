//! The `nodeipam` command line: arguments (clap derive) and one module per group of commands.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
use ipnet::IpNet;
use nodeipam_host::config::{Config, Mode, Overrides};
use nodeipam_host::store::Store;

mod edit;
mod inspect;
mod run;
mod table;

/// Node IPAM: keep every node's pod range and its cloud alias in agreement, through the
/// nodeipam WebAssembly component, on an embedded store (no cluster, no cloud needed).
#[derive(Debug, Parser)]
#[command(name = "nodeipam", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    config: ConfigArgs,
    /// Log more (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

/// Configuration: a file, and flags that override its values.
#[derive(Debug, Args)]
struct ConfigArgs {
    /// TOML configuration file (every key optional; see `nodeipam_host::config` or README).
    #[arg(
        long,
        short = 'c',
        global = true,
        env = "NODEIPAM_CONFIG",
        value_name = "FILE"
    )]
    config: Option<PathBuf>,
    /// The embedded store (SQLite file) [default: nodeipam.db].
    #[arg(long, global = true, env = "NODEIPAM_STORE", value_name = "FILE")]
    store: Option<PathBuf>,
    /// Who allocates ranges [default: sync-from-cluster].
    #[arg(long, global = true, value_parser = parse_mode)]
    mode: Option<Mode>,
    /// Cluster CIDR(s): one, or two of different IP families; replaces the file's list
    /// [default: 10.0.0.0/8].
    #[arg(long, global = true, value_delimiter = ',', value_name = "CIDR")]
    cluster_cidr: Vec<IpNet>,
    /// Node range prefix length for an IPv4 cluster CIDR given by --cluster-cidr [default: 24].
    #[arg(long, global = true, value_name = "BITS")]
    node_cidr_mask_size_ipv4: Option<u8>,
    /// Node range prefix length for an IPv6 cluster CIDR given by --cluster-cidr [default: 64].
    #[arg(long, global = true, value_name = "BITS")]
    node_cidr_mask_size_ipv6: Option<u8>,
    /// Re-check each node this often after a success [default: 30000].
    #[arg(long, global = true, value_name = "MS")]
    resync_ms: Option<u64>,
    /// First retry after a failure; doubles per failure [default: 250].
    #[arg(long, global = true, value_name = "MS")]
    initial_retry_ms: Option<u64>,
    /// Upper bound of the retry delay [default: 10000].
    #[arg(long, global = true, value_name = "MS")]
    max_backoff_ms: Option<u64>,
    /// The component [default: nodeipam.wasm beside the binary or in its parent directory].
    #[arg(long, global = true, env = "NODEIPAM_COMPONENT", value_name = "FILE")]
    component: Option<PathBuf>,
    /// Compiled-component cache directory [default: the host library's].
    #[arg(long, global = true, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (`run` only) [default: off].
    #[arg(long, global = true, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// `run` without --once: poll the store for changes this often [default: 1000].
    #[arg(long, global = true, value_name = "MS")]
    watch_interval_ms: Option<u64>,
    /// Memory cap of the component, bytes [default: the host library's].
    #[arg(long, global = true, value_name = "BYTES")]
    memory_bytes: Option<u64>,
    /// Deadline of one call into the component [default: the host library's].
    #[arg(long, global = true, value_name = "MS")]
    call_timeout_ms: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Reconcile every node in the store through the component: until converged (--once), or
    /// keep watching the store for added, changed and deleted nodes.
    Run(run::RunArgs),
    /// Add, remove or list nodes.
    #[command(subcommand)]
    Nodes(NodesCommand),
    /// Add or replace nodes from a YAML or JSON file (`-`: standard input): a list of nodes,
    /// a List/NodeList with items, or `kubectl get nodes -o yaml` output. All or nothing.
    Import(edit::ImportArgs),
    /// Write N new nodes (no range, no alias) into the store, e.g. for benchmarks.
    Generate(edit::GenerateArgs),
    /// Summarise the store: nodes by state, cluster CIDR usage, events.
    Status(inspect::OutputArgs),
    /// Show the warning events the component emitted.
    Events(inspect::EventsArgs),
}

#[derive(Debug, Subcommand)]
enum NodesCommand {
    /// Add a node (with its VM's alias, if any).
    Add(edit::AddArgs),
    /// Remove nodes (and their VMs' aliases).
    Remove {
        /// Node names.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// List nodes with their ranges, aliases and state.
    List(inspect::OutputArgs),
}

/// `--output`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns.
    #[default]
    Table,
    /// JSON.
    Json,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse()
}

impl Cli {
    /// The `-v` count.
    pub fn verbosity(&self) -> u8 {
        self.verbose
    }

    /// Run the command.
    pub fn execute(self) -> Result<()> {
        let config = self.config.load()?;
        match self.command {
            Command::Run(args) => run::run(&config, &args),
            Command::Nodes(NodesCommand::Add(args)) => edit::add(&config, &args),
            Command::Nodes(NodesCommand::Remove { names }) => edit::remove(&config, &names),
            Command::Nodes(NodesCommand::List(args)) => inspect::list(&config, &args),
            Command::Import(args) => edit::import(&config, &args),
            Command::Generate(args) => edit::generate(&config, &args),
            Command::Status(args) => inspect::status(&config, &args),
            Command::Events(args) => inspect::events(&config, &args),
        }
    }
}

impl ConfigArgs {
    fn load(&self) -> Result<Config> {
        let overrides = Overrides {
            mode: self.mode,
            cluster_cidrs: self.cluster_cidr.clone(),
            node_mask_v4: self.node_cidr_mask_size_ipv4,
            node_mask_v6: self.node_cidr_mask_size_ipv6,
            resync_ms: self.resync_ms,
            initial_retry_ms: self.initial_retry_ms,
            max_backoff_ms: self.max_backoff_ms,
            store: self.store.clone(),
            component: self.component.clone(),
            cache_dir: self.cache_dir.clone(),
            metrics_addr: self.metrics_addr,
            watch_interval_ms: self.watch_interval_ms,
            memory_bytes: self.memory_bytes,
            call_timeout_ms: self.call_timeout_ms,
        };
        Ok(Config::load(self.config.as_deref(), &overrides)?)
    }
}

/// Open the configured store, which must exist.
fn open_store(config: &Config) -> Result<Store> {
    Ok(Store::open(&config.store)?)
}

/// Open the configured store, creating it when missing.
fn create_store(config: &Config) -> Result<Store> {
    Ok(Store::open_or_create(&config.store)?)
}
