//! `nodeipam run`: the component, wired to the embedded store, until converged or forever.
//!
//! `--once` drives the component on a virtual clock: `init`, one `update` per node, then `tick`
//! at each next due time until nothing is due before one resync interval has passed (every
//! node either succeeded, or failed through its whole backoff), then a summary. Without it, the
//! clock is real: the same start, then the store's change log is polled (on its own thread and
//! connection) and each added, changed or deleted node goes to `update` or `delete`, and due
//! resyncs are ticked.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nodeipam_host::backend::Node;
use nodeipam_host::config::{Config, Mode};
use nodeipam_host::driver::{Clock, Driver, ManualClock, NodeEvent, SystemClock};
use nodeipam_host::metrics::{self, Counters, Export, Metered, Op, Snapshot};
use nodeipam_host::plugin::{Limits, PluginBuilder};
use nodeipam_host::store::{Change, NodeRecord, NodeState, Store};
use nodeipam_host::types::{self, Stats};

use super::inspect::percent;
use super::table;

/// Change-log entries read per poll.
const CHANGES_PER_POLL: usize = 10_000;
/// How often `run` (watching) copies the component's counters for the metrics endpoint.
const PUBLISH_EVERY_MS: u64 = 1_000;
/// Progress is drawn only for runs at least this long (nodes).
const PROGRESS_MIN_NODES: usize = 2_000;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Reconcile until converged, print a summary and exit; without it, keep watching.
    #[arg(long)]
    once: bool,
    /// Run even when node ranges lie outside every configured cluster CIDR (the component
    /// then reports and skips those ranges).
    #[arg(long)]
    allow_orphans: bool,
    /// With --once: also print calls and time per export and per backend operation.
    #[arg(long)]
    timings: bool,
}

type Backend = Metered<Store>;

pub fn run(config: &Config, args: &RunArgs) -> Result<()> {
    let started = Instant::now();
    let mut store = Store::open(&config.store)?;
    let _lock = store.lock_for_run()?;
    let (nodes, seq) = store.snapshot()?;
    if !args.allow_orphans {
        refuse_orphans(config, &nodes)?;
    }
    let component = config.component_path()?;
    let before: HashMap<String, NodeRecord> = store
        .records()?
        .into_iter()
        .map(|r| (r.node.name.clone(), r))
        .collect();

    let counters = Arc::new(Counters::default());
    let snapshot = Arc::new(Snapshot {
        counters: counters.clone(),
        ..Snapshot::default()
    });
    if let Some(addr) = config.metrics_addr {
        let bound = metrics::serve(addr, snapshot.clone())?;
        eprintln!("metrics: http://{bound}/metrics");
    }
    let mut builder = PluginBuilder::new().limits(limits(config));
    if let Some(dir) = &config.cache_dir {
        builder = builder.cache_dir(dir);
    }
    let plugin = builder
        .load_file(&component, Metered::new(store, counters.clone()))
        .with_context(|| format!("cannot load component {}", component.display()))?;
    let loaded = started.elapsed();

    if args.once {
        // Virtual time: nothing waits, resyncs and retries run at their due times at once.
        let driver = Driver::new(plugin, ManualClock::new(0)).with_max_resyncs(0);
        let mut runner = Runner {
            driver,
            counters,
            snapshot,
            errors: HashMap::new(),
        };
        runner.start(config, &nodes)?;
        runner.converge(config)?;
        runner.publish();
        summarise(config, &mut runner, &before, started.elapsed(), loaded)?;
        if args.timings {
            print_timings(&runner.counters);
        }
        Ok(())
    } else {
        let driver = Driver::new(plugin, SystemClock::new());
        let mut runner = Runner {
            driver,
            counters,
            snapshot,
            errors: HashMap::new(),
        };
        runner.start(config, &nodes)?;
        println!(
            "watching {} ({} nodes, {}), polling every {} ms",
            config.store.display(),
            nodes.len(),
            config.mode,
            config.watch_interval_ms
        );
        let events = watch_store(config, seq)?;
        runner.watch(&events)
    }
}

struct Runner<C: Clock> {
    driver: Driver<Backend, C>,
    counters: Arc<Counters>,
    snapshot: Arc<Snapshot>,
    /// The last error of each node's `update`, for the summary.
    errors: HashMap<String, String>,
}

impl<C: Clock> Runner<C> {
    /// `init` from the store, then `update` every node.
    fn start(&mut self, config: &Config, nodes: &[Node]) -> Result<()> {
        let t = Instant::now();
        let result = self.driver.init(&plugin_config(config));
        self.counters
            .record_export(Export::Init, t.elapsed(), result.is_err());
        result
            .with_context(|| format!("cannot initialise the component with {}", config.origin()))?;

        let progress = progress(nodes.len() as u64, "sync");
        for node in nodes {
            self.handle(&NodeEvent::Added(node.clone()));
            progress.inc(1);
        }
        progress.finish_and_clear();
        Ok(())
    }

    /// `update` or `delete` one node now; failures are kept for the summary.
    fn handle(&mut self, event: &NodeEvent) {
        let (export, node) = match event {
            NodeEvent::Added(n) | NodeEvent::Changed(n) => (Export::Update, n),
            NodeEvent::Deleted(n) => (Export::Delete, n),
        };
        let t = Instant::now();
        let result = self.driver.handle(event);
        self.counters
            .record_export(export, t.elapsed(), result.is_err());
        match result {
            Ok(()) => {
                self.errors.remove(&node.name);
            }
            Err(e) => {
                tracing::debug!(node = node.name, error = %e, "{} failed", export.name());
                self.errors.insert(node.name.clone(), e.to_string());
            }
        }
    }

    /// Call `tick` if a resync is due.
    fn run_due(&mut self) {
        let t = Instant::now();
        let result = self.driver.run_due();
        match result {
            Ok(None) => {}
            Ok(Some(report)) => {
                self.counters
                    .record_export(Export::Tick, t.elapsed(), false);
                if report.failed > 0 {
                    tracing::debug!(
                        failed = report.failed,
                        "resyncs failed; retried with backoff"
                    );
                }
            }
            Err(e) => {
                self.counters.record_export(Export::Tick, t.elapsed(), true);
                tracing::warn!(error = %e, "tick failed");
            }
        }
    }

    /// Copy the component's counters where the metrics endpoint reads them.
    fn publish(&mut self) {
        match self.driver.plugin_mut().stats() {
            Ok(stats) => {
                if let Ok(mut slot) = self.snapshot.stats.lock() {
                    *slot = stats;
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the component's counters"),
        }
    }
}

impl Runner<ManualClock> {
    /// Virtual time: tick at each next due time until none is due before one resync interval
    /// from the start (every node succeeded, or failed through its whole backoff).
    fn converge(&mut self, config: &Config) -> Result<()> {
        let horizon = self
            .driver
            .clock()
            .now_ms()
            .saturating_add(config.resync_ms);
        let progress = if self.errors.len() >= PROGRESS_MIN_NODES {
            spinner("retrying failed nodes")
        } else {
            ProgressBar::hidden()
        };
        while let Some(due) = self.driver.next_deadline().filter(|&due| due < horizon) {
            self.driver.clock().advance_to(due);
            self.run_due();
            progress.inc(1);
        }
        progress.finish_and_clear();
        Ok(())
    }
}

impl Runner<SystemClock> {
    /// Real time, forever: node events from the store's change log, resyncs when due.
    fn watch(&mut self, events: &Receiver<NodeEvent>) -> Result<()> {
        let mut next_publish = 0;
        loop {
            self.run_due();
            let now = self.driver.clock().now_ms();
            if now >= next_publish {
                self.publish();
                next_publish = now + PUBLISH_EVERY_MS;
            }
            let wake = self
                .driver
                .next_deadline()
                .map_or(next_publish, |d| d.min(next_publish));
            if let Some(event) = self.driver.clock().wait(wake, events) {
                self.handle(&event);
                let (verb, node) = match &event {
                    NodeEvent::Added(n) => ("added", n),
                    NodeEvent::Changed(n) => ("changed", n),
                    NodeEvent::Deleted(n) => ("deleted", n),
                };
                match self.errors.get(&node.name) {
                    None => println!("node {} {verb}: synced", node.name),
                    Some(e) => println!("node {} {verb}: failed: {e}", node.name),
                }
            }
        }
    }
}

/// Poll the store's change log from `seq` on its own connection and thread; send each change
/// as a node event. Consumed entries are pruned (a restarted run re-reads every node anyway).
fn watch_store(config: &Config, mut seq: i64) -> Result<Receiver<NodeEvent>> {
    let mut store = Store::open(&config.store)?;
    store.prune_changes(seq)?;
    let interval = Duration::from_millis(config.watch_interval_ms);
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new().name("store-watch".into()).spawn(move || {
        let mut known: HashSet<String> = match store.snapshot() {
            Ok((nodes, _)) => nodes.into_iter().map(|n| n.name).collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the store: not watching it");
                return;
            }
        };
        loop {
            let changes = match store.changes_since(seq, CHANGES_PER_POLL) {
                Ok(changes) => changes,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the change log; retrying");
                    std::thread::sleep(interval);
                    continue;
                }
            };
            for change in &changes {
                let event = match change {
                    Change::Upserted { name, .. } => match store.record(name) {
                        Ok(Some(r)) if known.insert(name.clone()) => NodeEvent::Added(r.node),
                        Ok(Some(r)) => NodeEvent::Changed(r.node),
                        // Deleted since: its deletion follows in the log.
                        Ok(None) => continue,
                        Err(e) => {
                            tracing::warn!(node = name, error = %e, "cannot read a changed node");
                            continue;
                        }
                    },
                    Change::Deleted { node, .. } => {
                        known.remove(&node.name);
                        NodeEvent::Deleted(node.clone())
                    }
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
            if let Some(last) = changes.last() {
                seq = last.seq();
                if let Err(e) = store.prune_changes(seq) {
                    tracing::warn!(error = %e, "cannot prune the change log");
                }
            }
            if changes.len() < CHANGES_PER_POLL {
                std::thread::sleep(interval);
            }
        }
    })?;
    Ok(rx)
}

/// Refuse to start when node ranges lie outside every cluster CIDR: a cluster CIDR change
/// would otherwise orphan them. Nothing has been written yet.
fn refuse_orphans(config: &Config, nodes: &[Node]) -> Result<()> {
    let orphans = config.orphans(nodes);
    if orphans.is_empty() {
        return Ok(());
    }
    let cidrs: Vec<String> = config
        .cluster_cidrs
        .iter()
        .map(|c| c.cidr.to_string())
        .collect();
    let shown: Vec<String> = orphans
        .iter()
        .take(5)
        .map(|o| format!("node {} has {}", o.node, o.range))
        .collect();
    let more = if orphans.len() > 5 {
        format!(" and {} more", orphans.len() - 5)
    } else {
        String::new()
    };
    bail!(
        "{} node range(s) lie outside every cluster CIDR of {} ({}): {}{more}; \
         did the cluster CIDRs change? Fix them, or pass --allow-orphans to run anyway \
         (those ranges are then reported and skipped); the store is untouched",
        orphans.len(),
        config.origin(),
        cidrs.join(", "),
        shown.join(", "),
    )
}

fn plugin_config(config: &Config) -> types::Config {
    types::Config {
        mode: match config.mode {
            Mode::SyncFromCluster => types::SyncMode::SyncFromCluster,
            Mode::SyncFromCloud => types::SyncMode::SyncFromCloud,
        },
        cluster_cidrs: config
            .cluster_cidrs
            .iter()
            .map(|c| types::ClusterCidr::new(c.cidr.to_string(), c.node_mask_size))
            .collect(),
        resync_ms: config.resync_ms,
        initial_retry_ms: config.initial_retry_ms,
        max_backoff_ms: config.max_backoff_ms,
    }
}

fn limits(config: &Config) -> Limits {
    let default = Limits::default();
    Limits {
        max_memory_bytes: config.memory_bytes.map_or(default.max_memory_bytes, |b| {
            usize::try_from(b).unwrap_or(usize::MAX)
        }),
        call_timeout: config
            .call_timeout_ms
            .map_or(default.call_timeout, Duration::from_millis),
    }
}

fn progress(len: u64, what: &'static str) -> ProgressBar {
    if len < PROGRESS_MIN_NODES as u64 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>6} [{bar:40}] {pos}/{len} nodes ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(what);
    bar
}

fn spinner(what: &'static str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {pos} resyncs")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(what);
    bar
}

fn print_timings(counters: &Counters) {
    let row = |name: &str, (calls, errors, time): (u64, u64, Duration)| {
        let mean = if calls == 0 {
            0.0
        } else {
            time.as_secs_f64() * 1e6 / calls as f64
        };
        vec![
            name.to_owned(),
            calls.to_string(),
            errors.to_string(),
            format!("{:.3}", time.as_secs_f64()),
            format!("{mean:.1}"),
        ]
    };
    let mut rows: Vec<Vec<String>> = Export::ALL
        .iter()
        .map(|&e| row(e.name(), counters.export(e)))
        .collect();
    rows.extend(Op::ALL.iter().map(|&op| row(op.name(), counters.op(op))));
    println!();
    table::print(&["CALL", "CALLS", "ERRORS", "TOTAL S", "MEAN US"], &rows);
}

/// What one `run --once` did, from the store before and after.
#[derive(Debug, Default)]
struct Outcome {
    allocated: usize,
    copied: usize,
    pushed: usize,
    network: usize,
    in_sync: usize,
    mismatches: Vec<String>,
    failures: Vec<String>,
    changed: usize,
}

/// `errors`: the nodes whose last `update` failed (a malformed range can look like a mismatch).
fn outcome(
    before: &HashMap<String, NodeRecord>,
    after: &[NodeRecord],
    errors: &HashMap<String, String>,
) -> Outcome {
    let mut o = Outcome::default();
    for now in after {
        let name = &now.node.name;
        let Some(was) = before.get(name) else {
            continue;
        };
        if was != now {
            o.changed += 1;
        }
        let had_range = !was.node.pod_cidrs.is_empty();
        let has_range = !now.node.pod_cidrs.is_empty();
        let had_alias = !was.alias.is_empty();
        let has_alias = !now.alias.is_empty();
        match (had_range, had_alias) {
            (false, false) if has_range => o.allocated += 1,
            (false, true) if has_range => o.copied += 1,
            (true, false) if has_alias => o.pushed += 1,
            (true, true) if was.network_unavailable && !now.network_unavailable => o.network += 1,
            _ => {}
        }
        match now.state() {
            NodeState::InSync => o.in_sync += 1,
            NodeState::Mismatch if !errors.contains_key(name) => o.mismatches.push(name.clone()),
            _ => o.failures.push(name.clone()),
        }
    }
    o
}

fn summarise(
    config: &Config,
    runner: &mut Runner<ManualClock>,
    before: &HashMap<String, NodeRecord>,
    elapsed: Duration,
    loaded: Duration,
) -> Result<()> {
    let stats: Stats = runner.driver.plugin_mut().stats()?;
    let after = runner.driver.plugin().backends().inner().records()?;
    let o = outcome(before, &after, &runner.errors);
    let store_time = runner.counters.backend_time();
    let component_time = runner.counters.export_time().saturating_sub(store_time);
    println!(
        "nodeipam run --once: {} nodes in {}, {} ({})",
        after.len(),
        config.store.display(),
        config.mode,
        config.origin()
    );
    let rows = [
        (
            "allocated",
            o.allocated,
            "new ranges, set on the node and pushed to the cloud",
        ),
        (
            "copied from cloud",
            o.copied,
            "cloud alias set as the node's range",
        ),
        (
            "pushed to cloud",
            o.pushed,
            "node range added as the VM's alias",
        ),
        (
            "network available",
            o.network,
            "only the NetworkUnavailable condition cleared",
        ),
        (
            "in sync",
            o.in_sync,
            "range equals alias, network available",
        ),
        (
            "mismatches",
            o.mismatches.len(),
            "range differs from alias: left alone, see `nodeipam events`",
        ),
        (
            "failures",
            o.failures.len(),
            "not converged: see below and `nodeipam events`",
        ),
    ];
    for (what, n, note) in rows {
        println!("  {what:<18} {n:>7}   {note}");
    }
    for name in o.failures.iter().take(10) {
        let reason = runner
            .errors
            .get(name)
            .map_or("no error reported", String::as_str);
        println!("    {name}: {reason}");
    }
    if o.failures.len() > 10 {
        println!("    ... and {} more", o.failures.len() - 10);
    }
    println!();
    let usage: Vec<Vec<String>> = stats
        .sets
        .iter()
        .map(|s| {
            vec![
                s.cidr.clone(),
                format!("/{}", s.node_mask_size),
                s.used.to_string(),
                s.max.to_string(),
                percent(u64::from(s.used), u64::from(s.max)),
            ]
        })
        .collect();
    table::print(
        &["CLUSTER CIDR", "NODE MASK", "USED", "MAX", "USAGE"],
        &usage,
    );
    println!();
    println!(
        "time: {:.3} s (component load {:.3} s, in the component {:.3} s, in the store {:.3} s)",
        elapsed.as_secs_f64(),
        loaded.as_secs_f64(),
        component_time.as_secs_f64(),
        store_time.as_secs_f64()
    );
    if o.changed == 0 {
        println!(
            "nothing changed: in sync: {}, mismatches: {}, failures: {}",
            o.in_sync,
            o.mismatches.len(),
            o.failures.len()
        );
    } else {
        println!("changed {} of {} nodes", o.changed, after.len());
    }
    Ok(())
}
