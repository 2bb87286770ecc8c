//! The component adapter: binds the core to the WIT world `nodeipam`. The only file that
//! knows about wasm; everything else builds and tests natively.

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cell::RefCell;

use crate::host;
use crate::sync::Controller;
use crate::types;

#[expect(clippy::too_many_arguments, reason = "generated import shims")]
mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "nodeipam",
    });
}

use bindings::nodeipam::sync::{cloud_alias, events, kube_api, log};
use bindings::nodeipam::sync::types as wit;

struct Component;

bindings::export!(Component with_types_in bindings);

/// The controller between calls. The component is single-threaded: a call runs to completion
/// before the next one starts.
struct State(RefCell<Option<Controller>>);

// SAFETY: wasm32 components have one thread; nothing else can see this static.
unsafe impl Sync for State {}

static STATE: State = State(RefCell::new(None));

impl bindings::Guest for Component {
    fn init(config: wit::Config, nodes: Vec<wit::Node>, now_ms: u64) -> Result<(), wit::SyncError> {
        let config = from_wit_config(config);
        let nodes: Vec<types::Node> = nodes.into_iter().map(from_wit_node).collect();
        let mut state = STATE.0.borrow_mut();
        // Starting over: a failed init leaves the component uninitialised.
        *state = None;
        *state = Some(Controller::init(&config, &nodes, now_ms, &mut Imports).map_err(to_wit_error)?);
        Ok(())
    }

    fn update(node: wit::Node, now_ms: u64) -> Result<(), wit::SyncError> {
        with_controller(|c| c.update(&mut Imports, &from_wit_node(node), now_ms))
    }

    fn delete(node: wit::Node, now_ms: u64) -> Result<(), wit::SyncError> {
        with_controller(|c| c.delete(&mut Imports, &from_wit_node(node), now_ms))
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
        let stats = STATE.0.borrow().as_ref().map(Controller::stats).unwrap_or_default();
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
    f: impl FnOnce(&mut Controller) -> Result<(), types::SyncError>,
) -> Result<(), wit::SyncError> {
    match STATE.0.borrow_mut().as_mut() {
        Some(controller) => f(controller).map_err(to_wit_error),
        None => Err(wit::SyncError::NotInitialized),
    }
}

/// The host, through the WIT imports.
struct Imports;

impl host::KubeApi for Imports {
    fn get_node(&mut self, name: &str) -> Result<types::Node, types::HostError> {
        kube_api::get_node(name).map(from_wit_node).map_err(from_wit_host_error)
    }

    fn update_node_pod_cidrs(&mut self, node: &types::Node, cidrs: &[String]) -> Result<(), types::HostError> {
        kube_api::update_node_pod_cidrs(&to_wit_node(node), cidrs).map_err(from_wit_host_error)
    }

    fn update_node_network_unavailable(&mut self, name: &str, unavailable: bool) -> Result<(), types::HostError> {
        kube_api::update_node_network_unavailable(name, unavailable).map_err(from_wit_host_error)
    }
}

impl host::CloudAlias for Imports {
    fn alias(&mut self, node: &types::Node) -> Result<Vec<String>, types::HostError> {
        cloud_alias::alias(&to_wit_node(node)).map_err(from_wit_host_error)
    }

    fn add_alias(&mut self, node: &types::Node, cidrs: &[String]) -> Result<(), types::HostError> {
        cloud_alias::add_alias(&to_wit_node(node), cidrs).map_err(from_wit_host_error)
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
        let fields: Vec<(String, String)> =
            fields.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect();
        log::log(level, message, &fields);
    }
}

fn from_wit_node(node: wit::Node) -> types::Node {
    types::Node { name: node.name, provider_id: node.provider_id, pod_cidrs: node.pod_cidrs }
}

fn to_wit_node(node: &types::Node) -> wit::Node {
    wit::Node {
        name: node.name.clone(),
        provider_id: node.provider_id.clone(),
        pod_cidrs: node.pod_cidrs.clone(),
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
            .map(|c| types::ClusterCidr { cidr: c.cidr, node_mask_size: c.node_mask_size })
            .collect(),
        resync_ms: config.resync_ms,
        initial_retry_ms: config.initial_retry_ms,
        max_backoff_ms: config.max_backoff_ms,
    }
}

fn from_wit_host_error(e: wit::HostError) -> types::HostError {
    match e {
        wit::HostError::NotFound(m) => types::HostError::NotFound(m),
        wit::HostError::Conflict(m) => types::HostError::Conflict(m),
        wit::HostError::Unavailable(m) => types::HostError::Unavailable(m),
        wit::HostError::Other(m) => types::HostError::Other(m),
    }
}

fn to_wit_error(e: types::SyncError) -> wit::SyncError {
    match e {
        types::SyncError::InvalidConfig(m) => wit::SyncError::InvalidConfig(m),
        types::SyncError::InvalidCidr(m) => wit::SyncError::InvalidCidr(m),
        types::SyncError::OutOfRange(m) => wit::SyncError::OutOfRange(m),
        types::SyncError::Exhausted(m) => wit::SyncError::Exhausted(m),
        types::SyncError::InvalidMode(m) => wit::SyncError::InvalidMode(m),
        types::SyncError::Host(h) => wit::SyncError::Host(match h {
            types::HostError::NotFound(m) => wit::HostError::NotFound(m),
            types::HostError::Conflict(m) => wit::HostError::Conflict(m),
            types::HostError::Unavailable(m) => wit::HostError::Unavailable(m),
            types::HostError::Other(m) => wit::HostError::Other(m),
        }),
        types::SyncError::NotInitialized => wit::SyncError::NotInitialized,
    }
}
