//! Commands that populate the store: `nodes add|remove`, `import`, `generate`.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use nodeipam_host::backend::Node;
use nodeipam_host::config::Config;
use nodeipam_host::import;
use nodeipam_host::store::NodeSpec;

use super::create_store;

#[derive(Debug, Args)]
pub struct AddArgs {
    /// Node name (`metadata.name`).
    name: String,
    /// `spec.providerID`.
    #[arg(long)]
    provider_id: Option<String>,
    /// A pod range (`spec.podCIDRs`); repeat or comma-separate for dual-stack.
    #[arg(long, value_delimiter = ',', value_name = "CIDR")]
    pod_cidr: Vec<String>,
    /// An alias range of the node's VM; repeat or comma-separate for dual-stack.
    #[arg(long, value_delimiter = ',', value_name = "CIDR")]
    alias: Vec<String>,
    /// The `NetworkUnavailable` condition [default: true without a pod range, else false].
    #[arg(long, value_name = "BOOL")]
    network_unavailable: Option<bool>,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// YAML or JSON file (`.json`: JSON); `-` reads standard input.
    file: PathBuf,
    /// Import only when the store has no node yet (so a second `make run` keeps its state).
    #[arg(long)]
    if_empty: bool,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// How many nodes to write.
    #[arg(long, short = 'n')]
    nodes: u64,
    /// Name prefix; names continue after the highest `<prefix>NNNNNN` in the store.
    #[arg(long, default_value = "gen-")]
    prefix: String,
}

pub fn add(config: &Config, args: &AddArgs) -> Result<()> {
    if args.name.is_empty() {
        bail!("a node needs a name");
    }
    let mut store = create_store(config)?;
    let spec = NodeSpec {
        node: Node {
            name: args.name.clone(),
            provider_id: args.provider_id.clone(),
            pod_cidrs: args.pod_cidr.clone(),
        },
        network_unavailable: args.network_unavailable.unwrap_or(args.pod_cidr.is_empty()),
        alias: Some(args.alias.clone()),
    };
    store.add_node(&spec)?;
    println!("added node {}", args.name);
    Ok(())
}

pub fn remove(config: &Config, names: &[String]) -> Result<()> {
    let mut store = super::open_store(config)?;
    for name in names {
        store.remove_node(name)?;
        println!("removed node {name}");
    }
    Ok(())
}

pub fn import(config: &Config, args: &ImportArgs) -> Result<()> {
    // Parse first: a bad file leaves the store (and a missing one) untouched.
    let specs = import::read_file(&args.file)?;
    let mut store = create_store(config)?;
    if args.if_empty {
        let existing = store.records()?.len();
        if existing > 0 {
            println!(
                "store {} already has {existing} nodes: not importing {}",
                store.path().display(),
                args.file.display()
            );
            return Ok(());
        }
    }
    let report = store.apply(&specs)?;
    println!(
        "imported {} nodes from {} into {}: {} added, {} changed, {} unchanged",
        specs.len(),
        args.file.display(),
        store.path().display(),
        report.added,
        report.changed,
        report.unchanged
    );
    Ok(())
}

pub fn generate(config: &Config, args: &GenerateArgs) -> Result<()> {
    let mut store = create_store(config)?;
    let first = store.next_generated_index(&args.prefix)?;
    let specs: Vec<NodeSpec> = (first..first + args.nodes)
        .map(|i| {
            let name = format!("{}{i:06}", args.prefix);
            NodeSpec {
                node: Node {
                    provider_id: Some(format!("embedded://{name}")),
                    name,
                    pod_cidrs: Vec::new(),
                },
                network_unavailable: true,
                alias: None,
            }
        })
        .collect();
    let report = store.apply(&specs)?;
    println!(
        "generated {} new nodes in {} ({}{first:06} to {}{:06})",
        report.added,
        store.path().display(),
        args.prefix,
        args.prefix,
        first + args.nodes.saturating_sub(1)
    );
    Ok(())
}
