//! Partial failures converge, through the component boundary.
//!
//! Every writing branch of the update table is interrupted at each of its steps by each kind
//! of host failure, first from an `update` and then from a scheduled resync (which adds the
//! `get-node` step). Then the failure goes away and the node is re-checked, either by the same
//! instance (the clock advanced to the retry deadline and `tick`) or by a fresh instance
//! initialised from the mock's state (a restart). Meanwhile another node `b` is allocated a
//! range. Every case must end converged: each node's range equals its alias and its network is
//! marked available, no two nodes share an address, and the allocator holds exactly the
//! nodes' ranges.
//!
//! The mock cannot apply a write and then fail it, so an `unavailable` that was applied is
//! simulated by replaying the failed write on the mock right after the call
//! ([`nodeipam_tests::apply`]); the component makes no call after a failed one, so the state
//! it could observe is the same.
//!
//! Set-up (10.0.0.0/16 by /24): `x` holds 10.0.0.0/24 (in sync), `a` is the node under test,
//! in the state its branch starts from, with 10.0.1.0/24 as the range in play.

use nodeipam_host::mock::{Call, Failure, MockCluster, Op};
use nodeipam_host::{BackendError, Config, Node, Plugin, SyncError, SyncMode};
use nodeipam_tests::call::{add_alias, alias, get_node, network_available, set_pod_cidrs};
use nodeipam_tests::{
    apply, assert_converged, assert_disjoint, capture_logs, config, node, restart, start,
    sync_error, take_calls, used,
};

/// The writing branches of the update table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Branch {
    /// none/none in sync-from-cluster: allocate, add the alias, set the node, network.
    Allocate,
    /// none/some in sync-from-cluster, a half-finished allocation: set the node, network.
    Complete,
    /// some/none in sync-from-cluster: add the node's range as alias, network.
    Push,
    /// none/some in sync-from-cloud: copy the alias to the node, network.
    Copy,
}

/// The host call that fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    GetNode,
    Alias,
    AddAlias,
    SetPodCidrs,
    Network,
}

/// How it fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// `unavailable`, but the write took effect.
    UnavailableApplied,
    /// `unavailable`, and the write did not take effect.
    Unavailable,
    Other,
    Conflict,
}

/// What runs into the failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    /// `update` of `a` at 1000.
    Update,
    /// `a`'s first scheduled resync, at 30000.
    Resync,
}

/// How `a` is re-checked once the failure is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resume {
    /// The same instance, at the retry deadline.
    Resync,
    /// A fresh instance initialised from the mock's state, at the first resync.
    Restart,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    branch: Branch,
    step: Step,
    fault: Fault,
    entry: Entry,
    resume: Resume,
}

const RANGE: &str = "10.0.1.0/24";

impl Branch {
    fn mode(self) -> SyncMode {
        match self {
            Self::Copy => SyncMode::SyncFromCloud,
            _ => SyncMode::SyncFromCluster,
        }
    }

    fn config(self) -> Config {
        config(self.mode())
    }

    /// `a` as the branch finds it.
    fn cluster(self) -> MockCluster {
        let cluster = MockCluster::new()
            .with_node(Node::new("x", &["10.0.0.0/24"]))
            .with_alias("x", &["10.0.0.0/24"]);
        match self {
            Self::Allocate => cluster.with_node(Node::new("a", &[])),
            Self::Complete | Self::Copy => cluster
                .with_node(Node::new("a", &[]))
                .with_alias("a", &[RANGE]),
            Self::Push => cluster.with_node(Node::new("a", &[RANGE])),
        }
    }

    /// The calls about `a` of one successful update (without the resync's get-node).
    fn calls(self) -> Vec<Call> {
        match self {
            Self::Allocate => vec![
                alias("a"),
                add_alias("a", &[RANGE]),
                set_pod_cidrs("a", &[RANGE]),
                network_available("a"),
            ],
            Self::Complete | Self::Copy => vec![
                alias("a"),
                set_pod_cidrs("a", &[RANGE]),
                network_available("a"),
            ],
            Self::Push => vec![alias("a"), add_alias("a", &[RANGE]), network_available("a")],
        }
    }
}

impl Step {
    fn op(self) -> Op {
        match self {
            Self::GetNode => Op::GetNode,
            Self::Alias => Op::Alias,
            Self::AddAlias => Op::AddAlias,
            Self::SetPodCidrs => Op::UpdateNodePodCidrs,
            Self::Network => Op::UpdateNodeNetworkUnavailable,
        }
    }
}

impl Fault {
    fn error(self) -> BackendError {
        match self {
            Self::UnavailableApplied | Self::Unavailable => {
                BackendError::Unavailable("timed out".into())
            }
            Self::Other => BackendError::Other("quota exceeded".into()),
            Self::Conflict => BackendError::Conflict("resource version changed".into()),
        }
    }
}

impl Case {
    /// Ranges in use right after the failure: x's, plus a's unless a holds none yet (nothing
    /// read) or a definite alias failure released its allocation.
    fn used_after_failure(self) -> u32 {
        let a_holds = match (self.branch, self.step) {
            // Init occupied a's range (push) or alias (half-finished allocation).
            (Branch::Complete | Branch::Push, _) => true,
            (_, Step::GetNode | Step::Alias) => false,
            (Branch::Allocate, Step::AddAlias) => {
                matches!(self.fault, Fault::Unavailable | Fault::UnavailableApplied)
            }
            _ => true,
        };
        1 + u32::from(a_holds)
    }

    /// Whether `a` must end with the range in play (rather than any free one): whenever the
    /// branch does not allocate, and when an allocation reached the cloud or the node, or is
    /// still pending in the same instance.
    fn keeps_range(self) -> bool {
        if self.branch != Branch::Allocate {
            return true;
        }
        match (self.step, self.fault) {
            (Step::GetNode | Step::Alias, _) => false,
            (Step::AddAlias, Fault::UnavailableApplied) => true,
            (Step::AddAlias, Fault::Unavailable) => self.resume == Resume::Resync,
            (Step::AddAlias, Fault::Other | Fault::Conflict) => false,
            (Step::SetPodCidrs | Step::Network, _) => true,
        }
    }
}

/// Add `b` without a range (with an alias of its own in sync-from-cloud) and update it.
fn add_bystander(plugin: &mut Plugin<MockCluster>, mode: SyncMode, now: u64) {
    let cluster = plugin.backends_mut();
    cluster.add_node(Node::new("b", &[]));
    if mode == SyncMode::SyncFromCloud {
        cluster.set_alias("b", nodeipam_tests::cidrs(&["10.0.9.0/24"]));
    }
    plugin
        .update(&node(plugin, "b"), now)
        .unwrap_or_else(|e| panic!("bystander b: {e}"));
}

fn run(case: Case) {
    let config = case.branch.config();
    let mut plugin = start(case.branch.cluster(), &config, 0);
    plugin.update(&node(&plugin, "x"), 0).expect("x syncs");
    take_calls(&mut plugin);
    let error = case.fault.error();
    plugin
        .backends_mut()
        .fail(Failure::new(case.step.op(), error.clone()).node("a"));

    // Run into the failure.
    let (failed_at, mut expected) = match case.entry {
        Entry::Update => {
            let result = plugin.update(&node(&plugin, "a"), 1_000);
            assert_eq!(sync_error(result), SyncError::Host(error.clone()), "update");
            (1_000, case.branch.calls())
        }
        Entry::Resync => {
            let (report, logs) = capture_logs(|| plugin.tick(30_000, 0).expect("tick"));
            assert_eq!(
                (report.resynced, report.failed),
                (1, 1),
                "x resyncs, a fails"
            );
            assert_eq!(report.next_due_ms, Some(30_250), "a retries after 250 ms");
            assert!(
                logs.iter().any(|l| l.message == "resync failed"
                    && l.fields.starts_with("node=\"a\"")
                    && l.fields.contains(&error.to_string())),
                "the failed resync is logged naming a and the error: {logs:?}"
            );
            let mut calls = vec![get_node("a")];
            calls.extend(case.branch.calls());
            (30_000, calls)
        }
    };
    let position = expected
        .iter()
        .position(|c| c.op() == case.step.op())
        .expect("the failing step is one of the branch's calls");
    expected.truncate(position + 1);
    let calls: Vec<Call> = take_calls(&mut plugin)
        .into_iter()
        .filter(|c| c.node() == Some("a"))
        .collect();
    assert_eq!(calls, expected, "calls up to and including the failing one");
    if case.fault == Fault::UnavailableApplied {
        apply(plugin.backends_mut(), calls.last().expect("a failed write"));
    }
    assert_eq!(
        used(&plugin.stats().unwrap()),
        case.used_after_failure(),
        "ranges in use right after the failure"
    );

    // The failure goes away; a is re-checked while b is allocated.
    let mode = case.branch.mode();
    match case.resume {
        Resume::Resync => {
            plugin.backends_mut().clear_failures();
            add_bystander(&mut plugin, mode, failed_at + 1);
            assert_disjoint(plugin.backends());
            let due = failed_at + 250;
            let report = plugin.tick(due - 1, 0).unwrap();
            assert_eq!((report.resynced, report.failed), (0, 0), "nothing early");
            assert_eq!(report.next_due_ms, Some(due), "a's retry is next");
            let report = plugin.tick(due, 0).unwrap();
            assert_eq!((report.resynced, report.failed), (1, 0), "a's retry");
        }
        Resume::Restart => {
            let restarted_at = failed_at + 1_000;
            plugin = restart(plugin, &config, restarted_at);
            add_bystander(&mut plugin, mode, restarted_at + 1);
            assert_disjoint(plugin.backends());
            let report = plugin.tick(restarted_at + 30_001, 0).unwrap();
            assert_eq!(
                (report.resynced, report.failed),
                (3, 0),
                "x, a and b resync"
            );
        }
    }

    assert_converged(&mut plugin);
    if case.keeps_range() {
        assert_eq!(
            plugin.backends().pod_cidrs("a"),
            [RANGE],
            "a keeps the range in play"
        );
    }
    assert_eq!(plugin.backends().pod_cidrs("b").len(), 1, "b has a range");
}

/// One module per branch, step and fault; one test per entry and resume:
/// `branch::step::fault::on_update::then_resync`, and so on.
macro_rules! cases {
    (@faults $entries:tt $($fault_mod:ident $fault:ident),*) => {
        $(cases!(@fault $fault_mod $fault $entries);)*
    };
    (@fault $fault_mod:ident $fault:ident [$($entry_mod:ident $entry:ident),*]) => {
        mod $fault_mod {
            use super::*;
            $(
                mod $entry_mod {
                    use super::*;
                    const CASE: Case = Case {
                        fault: Fault::$fault,
                        entry: Entry::$entry,
                        ..STEP
                    };

                    #[test]
                    fn then_resync() {
                        run(Case { resume: Resume::Resync, ..CASE });
                    }

                    #[test]
                    fn then_restart() {
                        run(Case { resume: Resume::Restart, ..CASE });
                    }
                }
            )*
        }
    };
    ($($branch_mod:ident $branch:ident {
        $($step_mod:ident $step:ident [$($entry_mod:ident $entry:ident),*]
            => [$($fault_mod:ident $fault:ident),*];)*
    })*) => {
        $(
            mod $branch_mod {
                use super::*;
                $(
                    mod $step_mod {
                        use super::*;
                        const STEP: Case = Case {
                            branch: Branch::$branch,
                            step: Step::$step,
                            fault: Fault::Other,
                            entry: Entry::Update,
                            resume: Resume::Resync,
                        };
                        cases!(@faults [$($entry_mod $entry),*] $($fault_mod $fault),*);
                    }
                )*
            }
        )*
    };
}

cases! {
    allocate Allocate {
        get_node GetNode [on_resync Resync] => [unavailable Unavailable, other Other, conflict Conflict];
        alias Alias [on_update Update, on_resync Resync]
            => [unavailable Unavailable, other Other, conflict Conflict];
        add_alias AddAlias [on_update Update, on_resync Resync]
            => [unavailable_applied UnavailableApplied, unavailable Unavailable, other Other, conflict Conflict];
        set_pod_cidrs SetPodCidrs [on_update Update, on_resync Resync]
            => [unavailable_applied UnavailableApplied, unavailable Unavailable, other Other, conflict Conflict];
        network Network [on_update Update, on_resync Resync]
            => [unavailable_applied UnavailableApplied, unavailable Unavailable, other Other, conflict Conflict];
    }
    complete_half_finished Complete {
        get_node GetNode [on_resync Resync] => [unavailable Unavailable, other Other, conflict Conflict];
        alias Alias [on_update Update, on_resync Resync]
            => [unavailable Unavailable, other Other, conflict Conflict];
        set_pod_cidrs SetPodCidrs [on_update Update, on_resync Resync]
            => [unavailable_applied UnavailableApplied, unavailable Unavailable, other Other, conflict Conflict];
        network Network [on_update Update, on_resync Resync]
            => [unavailable_applied UnavailableApplied, unavailable Unavailable, other Other, conflict Conflict];
    }
    push_node_range Push {
        get_node GetNode [on_resync Resync] => [unavailable Unavailable, other Other, conflict Conflict];
        alias Alias [on_update Update, on_resync Resync]
            => [unavailable Unavailable, other Other, conflict Conflict];
        add_alias AddAlias [on_update Update, on_resync Resync]
            => [unavailable_applied UnavailableApplied, unavailable Unavailable, other Other, conflict Conflict];
        network Network [on_update Update, on_resync Resync]
            => [unavailable_applied UnavailableApplied, unavailable Unavailable, other Other, conflict Conflict];
    }
    copy_alias Copy {
        get_node GetNode [on_resync Resync] => [unavailable Unavailable, other Other, conflict Conflict];
        alias Alias [on_update Update, on_resync Resync]
            => [unavailable Unavailable, other Other, conflict Conflict];
        set_pod_cidrs SetPodCidrs [on_update Update, on_resync Resync]
            => [unavailable_applied UnavailableApplied, unavailable Unavailable, other Other, conflict Conflict];
        network Network [on_update Update, on_resync Resync]
            => [unavailable_applied UnavailableApplied, unavailable Unavailable, other Other, conflict Conflict];
    }
}
