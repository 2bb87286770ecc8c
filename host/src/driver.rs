//! Time and events around a [`Plugin`]: the only place that reads a clock.
//!
//! The component has no clock: every export takes `now_ms`, and `tick` says when it wants to
//! be called next. A [`Driver`] owns a plugin and a [`Clock`], turns node events into
//! `update` / `delete`, and calls `tick` when the next resync is due. [`SystemClock`] is
//! monotonic real time for the CLI; [`ManualClock`] is virtual time for tests, which advance
//! it to the next deadline instead of sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use crate::backend::{Backends, Node};
use crate::error::Error;
use crate::plugin::Plugin;
use crate::types::{Config, TickReport};

/// Milliseconds, and a way to wait for them.
pub trait Clock {
    /// Now, in milliseconds since an arbitrary fixed origin. Never goes back.
    fn now_ms(&self) -> u64;

    /// Wait until `deadline_ms` or until an event arrives, whichever comes first; the event,
    /// if one came. Returns at once when an event is already queued.
    fn wait(&self, deadline_ms: u64, events: &Receiver<NodeEvent>) -> Option<NodeEvent>;
}

/// Real monotonic time, in milliseconds since the clock was made.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl SystemClock {
    /// A clock starting at 0 now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn wait(&self, deadline_ms: u64, events: &Receiver<NodeEvent>) -> Option<NodeEvent> {
        let timeout = Duration::from_millis(deadline_ms.saturating_sub(self.now_ms()));
        match events.recv_timeout(timeout) {
            Ok(event) => Some(event),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                // No more events will come: just let the time pass.
                std::thread::sleep(Duration::from_millis(
                    deadline_ms.saturating_sub(self.now_ms()),
                ));
                None
            }
        }
    }
}

/// Virtual time: moves only when told, or when a driver waits on it (it jumps to the
/// deadline). Clones share the same time, so a test keeps one and gives one to the driver.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self {
            now_ms: Arc::new(AtomicU64::new(now_ms)),
        }
    }

    /// Move time forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Move time forward to `ms` (never back).
    pub fn advance_to(&self, ms: u64) {
        self.now_ms.fetch_max(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn wait(&self, deadline_ms: u64, events: &Receiver<NodeEvent>) -> Option<NodeEvent> {
        match events.try_recv() {
            Ok(event) => Some(event),
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => {
                self.advance_to(deadline_ms);
                None
            }
        }
    }
}

/// A change to a node, as a watch reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeEvent {
    /// A node appeared.
    Added(Node),
    /// A node changed.
    Changed(Node),
    /// A node was deleted (its last known state).
    Deleted(Node),
}

/// What a [`Driver::run_for`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Events handled.
    pub events: u64,
    /// `tick` calls made.
    pub ticks: u64,
    /// Resyncs that succeeded.
    pub resynced: u64,
    /// Resyncs that failed (retried with backoff by the component).
    pub failed: u64,
    /// Export calls that returned an error (sync errors and traps).
    pub errors: u64,
}

/// Delay before looking at the schedule again after a failed `tick`, or after a trap whose
/// rebuild failed.
const RETRY_AFTER_ERROR_MS: u64 = 1_000;

/// Owns a [`Plugin`] and a [`Clock`]; feeds it events and calls `tick` when resyncs are due.
pub struct Driver<B: Backends, C: Clock = SystemClock> {
    plugin: Plugin<B>,
    clock: C,
    /// When `tick` must next be called; `None`: nothing scheduled.
    next_due_ms: Option<u64>,
    /// Resyncs per `tick` call (0: no limit), so events are not starved by a long resync.
    max_resyncs: u32,
}

impl<B: Backends, C: Clock> Driver<B, C> {
    /// A driver for `plugin`, reading time from `clock`, running at most 1024 resyncs per
    /// `tick` call.
    pub fn new(plugin: Plugin<B>, clock: C) -> Self {
        Self {
            plugin,
            clock,
            next_due_ms: None,
            max_resyncs: 1024,
        }
    }

    /// At most `max` resyncs per `tick` call (0: no limit).
    pub fn with_max_resyncs(mut self, max: u32) -> Self {
        self.max_resyncs = max;
        self
    }

    /// Initialise the plugin from the cluster with `config`, then learn the first deadline.
    pub fn init(&mut self, config: &Config) -> Result<(), Error> {
        let now = self.clock.now_ms();
        let result = self.plugin.init(config, now);
        self.after_call(now);
        result
    }

    /// Handle one node event now: `update` for added or changed, `delete` for deleted.
    pub fn handle(&mut self, event: &NodeEvent) -> Result<(), Error> {
        let now = self.clock.now_ms();
        let result = match event {
            NodeEvent::Added(node) | NodeEvent::Changed(node) => self.plugin.update(node, now),
            NodeEvent::Deleted(node) => self.plugin.delete(node, now),
        };
        self.after_call(now);
        result
    }

    /// When `tick` is next due (already past when [`Driver::run_due`] has work); `None` when
    /// nothing is scheduled.
    pub fn next_deadline(&self) -> Option<u64> {
        self.next_due_ms
    }

    /// If a resync is due now, call `tick` once (at most `max_resyncs` resyncs) and learn the
    /// next deadline; `None` when nothing was due.
    pub fn run_due(&mut self) -> Result<Option<TickReport>, Error> {
        let now = self.clock.now_ms();
        if self.next_due_ms.is_none_or(|due| due > now) {
            return Ok(None);
        }
        match self.plugin.tick(now, self.max_resyncs) {
            Ok(report) => {
                self.next_due_ms = report.next_due_ms;
                Ok(Some(report))
            }
            Err(e) => {
                // Whatever went wrong, do not spin: look again a little later.
                self.next_due_ms = Some(now.saturating_add(RETRY_AFTER_ERROR_MS));
                Err(e)
            }
        }
    }

    /// Run for `duration` of this driver's clock: handle events as they arrive on `events`
    /// and resyncs as they fall due. Errors are logged and counted, not returned: the
    /// component retries failed nodes with backoff, and the plugin rebuilds after a trap.
    pub fn run_for(&mut self, duration: Duration, events: &Receiver<NodeEvent>) -> RunSummary {
        let mut summary = RunSummary::default();
        let end = self
            .clock
            .now_ms()
            .saturating_add(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX));
        loop {
            match self.run_due() {
                Ok(Some(report)) => {
                    summary.ticks += 1;
                    summary.resynced += u64::from(report.resynced);
                    summary.failed += u64::from(report.failed);
                }
                Ok(None) => {}
                Err(error) => {
                    summary.errors += 1;
                    tracing::warn!(%error, "tick failed");
                }
            }
            let now = self.clock.now_ms();
            if now >= end {
                return summary;
            }
            let wake = self.next_due_ms.map_or(end, |due| due.clamp(now, end));
            if let Some(event) = self.clock.wait(wake, events) {
                summary.events += 1;
                if let Err(error) = self.handle(&event) {
                    summary.errors += 1;
                    tracing::warn!(%error, ?event, "node event failed");
                }
            }
        }
    }

    /// The plugin.
    pub fn plugin(&self) -> &Plugin<B> {
        &self.plugin
    }

    /// The plugin, mutably.
    pub fn plugin_mut(&mut self) -> &mut Plugin<B> {
        &mut self.plugin
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The driver's plugin, back.
    pub fn into_plugin(self) -> Plugin<B> {
        self.plugin
    }

    /// After `update`, `delete` or `init` the schedule may have moved earlier (a new node, a
    /// failure's short retry), and after a trap the rebuilt instance has a new one: ask
    /// `tick` at once, which runs only what is due and reports the next deadline. If the
    /// plugin has no instance (rebuild failed), retry a little later.
    fn after_call(&mut self, now: u64) {
        self.next_due_ms = if self.plugin.is_ready() {
            Some(now)
        } else {
            Some(now.saturating_add(RETRY_AFTER_ERROR_MS))
        };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::backend::BackendError;
    use crate::mock::{Failure, MockCluster, Op};
    use crate::testing::{cluster_config, plugin};

    /// A driver on virtual time at 0, initialised with `resync` ms between resyncs.
    fn driver(
        cluster: MockCluster,
        resync: u64,
    ) -> (Driver<MockCluster, ManualClock>, ManualClock) {
        let clock = ManualClock::new(0);
        let mut driver = Driver::new(plugin(cluster), clock.clone());
        driver
            .init(&cluster_config().with_intervals(resync, 100, 1_000))
            .unwrap();
        (driver, clock)
    }

    #[test]
    fn after_init_the_first_tick_learns_the_resync_deadline() {
        let (mut driver, clock) = driver(
            MockCluster::new().with_node(Node::new("a", &["10.0.0.0/24"])),
            1_000,
        );
        assert_eq!(driver.next_deadline(), Some(0), "asks tick at once");
        assert_eq!(
            driver.run_due().unwrap(),
            Some(TickReport {
                resynced: 0,
                failed: 0,
                next_due_ms: Some(1_000)
            })
        );
        assert_eq!(driver.next_deadline(), Some(1_000));
        assert_eq!(
            driver.run_due().unwrap(),
            None,
            "nothing due before the deadline"
        );

        clock.advance_to(1_000);
        let report = driver.run_due().unwrap().expect("due");
        assert_eq!((report.resynced, report.next_due_ms), (1, Some(2_000)));
    }

    #[test]
    fn events_become_updates_and_deletes() {
        let (mut driver, _clock) = driver(MockCluster::new(), 30_000);
        let node = Node::new("a", &[]);
        driver.plugin_mut().backends_mut().add_node(node.clone());
        driver.handle(&NodeEvent::Added(node)).unwrap();
        let cidrs = driver.plugin().backends().pod_cidrs("a").to_vec();
        assert_eq!(cidrs.len(), 1);
        assert_eq!(driver.plugin_mut().stats().unwrap().sets[0].used, 1);

        let node = driver.plugin_mut().backends_mut().remove_node("a").unwrap();
        driver.handle(&NodeEvent::Deleted(node)).unwrap();
        let stats = driver.plugin_mut().stats().unwrap();
        assert_eq!((stats.nodes, stats.sets[0].used, stats.releases), (0, 0, 1));
    }

    #[test]
    fn run_for_handles_queued_events_and_due_resyncs_on_virtual_time() {
        let (mut driver, clock) = driver(
            MockCluster::new().with_node(Node::new("a", &["10.0.0.0/24"])),
            1_000,
        );
        let (tx, rx) = mpsc::channel();
        let b = Node::new("b", &[]);
        driver.plugin_mut().backends_mut().add_node(b.clone());
        tx.send(NodeEvent::Added(b)).unwrap();

        let summary = driver.run_for(Duration::from_millis(10_500), &rx);
        assert_eq!(
            clock.now_ms(),
            10_500,
            "virtual time ran to the end, no sleeping"
        );
        assert_eq!(summary.events, 1);
        assert_eq!(summary.errors, 0);
        // a: due at 1000, 2000, ..., 10000; b (added at 0): 1000, ..., 10000.
        assert_eq!(summary.resynced, 20, "{summary:?}");
        assert_eq!(driver.plugin().backends().pod_cidrs("b").len(), 1);
    }

    #[test]
    fn a_failing_node_is_retried_with_backoff() {
        let cluster = MockCluster::new()
            .with_node(Node::new("a", &[]))
            .with_failure(
                Failure::new(Op::AddAlias, BackendError::Unavailable("cloud down".into())).times(3),
            );
        let (mut driver, _clock) = driver(cluster, 30_000);
        let (_tx, rx) = mpsc::channel();
        driver
            .handle(&NodeEvent::Added(Node::new("a", &[])))
            .unwrap_err();
        // Retries after 100, 200 and 400 ms of backoff; the third retry succeeds.
        let summary = driver.run_for(Duration::from_millis(1_000), &rx);
        assert_eq!((summary.failed, summary.resynced), (2, 1), "{summary:?}");
        assert_eq!(driver.plugin().backends().pod_cidrs("a").len(), 1);
        assert_eq!(driver.next_deadline(), Some(100 + 200 + 400 + 30_000));
    }

    #[test]
    fn a_trap_is_survived_and_the_schedule_relearned() {
        let cluster = MockCluster::new()
            .with_node(Node::new("a", &["10.0.0.0/24"]))
            .with_node(Node::new("b", &[]))
            .with_failure(Failure::new(
                Op::AddAlias,
                BackendError::Fatal("boom".into()),
            ));
        let (mut driver, clock) = driver(cluster, 1_000);
        clock.advance(500);
        let error = driver
            .handle(&NodeEvent::Added(Node::new("b", &[])))
            .unwrap_err();
        assert!(error.is_trap(), "{error}");
        assert_eq!(driver.next_deadline(), Some(500));
        // The rebuilt instance was initialised at 500: its first resyncs are due at 1500.
        assert_eq!(
            driver.run_due().unwrap().and_then(|r| r.next_due_ms),
            Some(1_500)
        );
        clock.advance_to(1_500);
        assert_eq!(driver.run_due().unwrap().map(|r| r.resynced), Some(2));
        assert_eq!(driver.plugin().backends().pod_cidrs("b").len(), 1);
    }

    #[test]
    fn manual_clock_moves_only_forward_and_is_shared() {
        let clock = ManualClock::new(100);
        let handle = clock.clone();
        handle.advance(50);
        assert_eq!(clock.now_ms(), 150);
        handle.advance_to(120);
        assert_eq!(clock.now_ms(), 150, "never back");
        handle.advance_to(1_000);
        assert_eq!(clock.now_ms(), 1_000);
    }

    #[test]
    fn manual_clock_wait_returns_a_queued_event_without_moving() {
        let clock = ManualClock::new(0);
        let (tx, rx) = mpsc::channel();
        tx.send(NodeEvent::Added(Node::new("a", &[]))).unwrap();
        assert_eq!(
            clock.wait(500, &rx),
            Some(NodeEvent::Added(Node::new("a", &[])))
        );
        assert_eq!(clock.now_ms(), 0);
        assert_eq!(clock.wait(500, &rx), None);
        assert_eq!(clock.now_ms(), 500, "jumped to the deadline");
    }

    #[test]
    fn system_clock_wait_returns_a_queued_event_at_once() {
        let clock = SystemClock::new();
        let (tx, rx) = mpsc::channel();
        tx.send(NodeEvent::Deleted(Node::new("a", &[]))).unwrap();
        // A deadline an hour away: returns immediately because the event is queued.
        assert!(clock.wait(3_600_000, &rx).is_some());
        assert!(clock.now_ms() < 3_600_000);
    }
}
