//! The component adapter: binds the core to the WIT world `nodeipam`. The only file that
//! knows about wasm; everything else builds and tests natively.

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cell::RefCell;

use crate::host;
use crate::sync::Controller;
use crate::types::{self, HostError, Node, SyncError};

#[expect(clippy::too_many_arguments, reason = "generated import shims")]
mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "nodeipam",
        // The hot types are the core's own (same fields and variants): nodes and errors cross
        // the boundary without a copy into a look-alike type.
        with: {
            "nodeipam:sync/types@0.1.0/node": crate::types::Node,
            "nodeipam:sync/types@0.1.0/host-error": crate::types::HostError,
            "nodeipam:sync/types@0.1.0/sync-error": crate::types::SyncError,
        },
    });
}

use bindings::nodeipam::sync::types as wit;
use bindings::nodeipam::sync::{cloud_alias, events, kube_api, log};

struct Component;

bindings::export!(Component with_types_in bindings);

/// The controller between calls. The component is single-threaded: a call runs to completion
/// before the next one starts.
struct State(RefCell<Option<Controller>>);

// SAFETY: wasm32 components have one thread; nothing else can see this static.
unsafe impl Sync for State {}

static STATE: State = State(RefCell::new(None));

impl bindings::Guest for Component {
    fn init(config: wit::Config, nodes: Vec<Node>, now_ms: u64) -> Result<(), SyncError> {
        let config = from_wit_config(config);
        let mut state = STATE.0.borrow_mut();
        // Starting over: a failed init leaves the component uninitialised.
        *state = None;
        *state = Some(Controller::init(&config, &nodes, now_ms, &mut Imports)?);
        Ok(())
    }

    fn update(node: Node, now_ms: u64) -> Result<(), SyncError> {
        with_controller(|c| c.update(&mut Imports, &node, now_ms))
    }

    fn delete(node: Node, now_ms: u64) -> Result<(), SyncError> {
        with_controller(|c| c.delete(&mut Imports, &node, now_ms))
    }

    fn tick(now_ms: u64, max_resyncs: u32) -> wit::TickReport {
        let report = match STATE.0.borrow_mut().as_mut() {
            Some(c) => c.tick(&mut Imports, now_ms, max_resyncs),
            None => types::TickReport::default(),
        };
        wit::TickReport {
            resynced: report.resynced,
            failed: report.failed,
            next_due_ms: report.next_due_ms,
        }
    }

    fn stats() -> wit::Stats {
        let stats = STATE
            .0
            .borrow()
            .as_ref()
            .map(Controller::stats)
            .unwrap_or_default();
        wit::Stats {
            nodes: stats.nodes,
            sets: stats
                .sets
                .into_iter()
                .map(|u| wit::Usage {
                    cidr: u.cidr,
                    node_mask_size: u.node_mask_size,
                    max: u.max,
                    used: u.used,
                })
                .collect(),
            allocations: stats.allocations,
            releases: stats.releases,
            allocation_tries: stats.allocation_tries,
        }
    }
}

fn with_controller(
    f: impl FnOnce(&mut Controller) -> Result<(), SyncError>,
) -> Result<(), SyncError> {
    match STATE.0.borrow_mut().as_mut() {
        Some(controller) => f(controller),
        None => Err(SyncError::NotInitialized),
    }
}

/// The host, through the WIT imports.
struct Imports;

impl host::KubeApi for Imports {
    fn get_node(&mut self, name: &str) -> Result<Node, HostError> {
        kube_api::get_node(name)
    }

    fn update_node_pod_cidrs(&mut self, node: &Node, cidrs: &[String]) -> Result<(), HostError> {
        kube_api::update_node_pod_cidrs(node, cidrs)
    }

    fn update_node_network_unavailable(
        &mut self,
        name: &str,
        unavailable: bool,
    ) -> Result<(), HostError> {
        kube_api::update_node_network_unavailable(name, unavailable)
    }
}

impl host::CloudAlias for Imports {
    fn alias(&mut self, node: &Node) -> Result<Vec<String>, HostError> {
        cloud_alias::alias(node)
    }

    fn add_alias(&mut self, node: &Node, cidrs: &[String]) -> Result<(), HostError> {
        cloud_alias::add_alias(node, cidrs)
    }
}

impl host::Events for Imports {
    fn emit_node_warning(&mut self, name: &str, reason: &str, message: &str) {
        events::emit_node_warning(name, reason, message);
    }

    fn log(&mut self, level: types::Level, message: &str, fields: &[(&str, &str)]) {
        let level = match level {
            types::Level::Debug => wit::Level::Debug,
            types::Level::Info => wit::Level::Info,
            types::Level::Warn => wit::Level::Warn,
            types::Level::Error => wit::Level::Error,
        };
        let fields: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        log::log(level, message, &fields);
    }
}

fn from_wit_config(config: wit::Config) -> types::Config {
    types::Config {
        mode: match config.mode {
            wit::SyncMode::SyncFromCloud => types::SyncMode::SyncFromCloud,
            wit::SyncMode::SyncFromCluster => types::SyncMode::SyncFromCluster,
        },
        cluster_cidrs: config
            .cluster_cidrs
            .into_iter()
            .map(|c| types::ClusterCidr {
                cidr: c.cidr,
                node_mask_size: c.node_mask_size,
            })
            .collect(),
        resync_ms: config.resync_ms,
        initial_retry_ms: config.initial_retry_ms,
        max_backoff_ms: config.max_backoff_ms,
    }
}
