//! The benchmark component (feature `bench`): exports the allocator and sync workloads so a
//! host can time them inside one call. Built separately from the plugin; never shipped as it.

use core::cell::RefCell;

use crate::cidrset::CidrSet;
use crate::workload;

mod bindings {
    wit_bindgen::generate!({
        path: "bench-wit",
        world: "bench",
    });
}

use bindings::exports::nodeipam::bench::workload::{Guest, Kind};

struct Component;

bindings::export!(Component with_types_in bindings);

struct Prepared {
    kind: Kind,
    set: CidrSet,
}

struct State(RefCell<Option<Prepared>>);

// SAFETY: wasm32 components have one thread; nothing else can see this static.
unsafe impl Sync for State {}

static STATE: State = State(RefCell::new(None));

struct SyncState(RefCell<Option<workload::SyncWorkload>>);

// SAFETY: as `State`.
unsafe impl Sync for SyncState {}

static SYNC: SyncState = SyncState(RefCell::new(None));

struct InitState(RefCell<Option<workload::InitWorkload>>);

// SAFETY: as `State`.
unsafe impl Sync for InitState {}

static INIT: InitState = InitState(RefCell::new(None));

impl Guest for Component {
    fn prepare(kind: Kind, extra_bits: u8, seed: u64) -> u32 {
        let (set, count) = match kind {
            Kind::Fill => {
                let set = workload::fill_prepare();
                let max = set.max();
                (set, max)
            }
            Kind::Fragmented => workload::fragmented_prepare(seed),
            Kind::LastFree => (workload::last_free_prepare(extra_bits, seed), 1),
        };
        *STATE.0.borrow_mut() = Some(Prepared { kind, set });
        count
    }

    fn run(rounds: u32) -> u64 {
        let mut state = STATE.0.borrow_mut();
        let Some(prepared) = state.as_mut() else {
            return 0;
        };
        match prepared.kind {
            Kind::Fill => u64::from(workload::fill_run(&mut prepared.set)),
            Kind::Fragmented => u64::from(workload::fragmented_run(&mut prepared.set)),
            Kind::LastFree => workload::last_free_run(&mut prepared.set, rounds),
        }
    }

    fn prepare_sync(nodes: u32, in_sync: bool, dual_stack: bool) -> bool {
        let prepared = workload::sync_prepare(nodes, in_sync, dual_stack).ok();
        let ok = prepared.is_some();
        *SYNC.0.borrow_mut() = prepared;
        ok
    }

    fn run_sync() -> u32 {
        SYNC.0.borrow_mut().as_mut().map_or(0, workload::sync_run)
    }

    fn prepare_init(nodes: u32) {
        *INIT.0.borrow_mut() = Some(workload::init_prepare(nodes));
    }

    fn run_init() -> u32 {
        INIT.0.borrow().as_ref().map_or(0, workload::init_run)
    }
}
