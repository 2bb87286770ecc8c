//! Native allocator benchmark against DESIGN.md's targets ("Targets"): the median of several
//! timed runs of each `workload` function, next to the target and Kubernetes' figure.
//!
//! `cargo bench -p nodeipam-guest --bench alloc`

use std::hint::black_box;
use std::time::{Duration, Instant};

use nodeipam_guest::workload;

/// Timed runs per figure; the median is reported.
const RUNS: usize = 11;
/// Allocate-and-release rounds per timed run of the single-free-range workloads.
const ROUNDS: u32 = 100_000;

fn main() {
    println!("allocator, native: median of {RUNS} runs");
    println!(
        "{:<46} {:>10} {:>10} {:>12}  ok",
        "workload", "ours", "target", "kubernetes"
    );

    let fill = median(|_| {
        let mut set = workload::fill_prepare();
        let start = Instant::now();
        let count = black_box(workload::fill_run(black_box(&mut set)));
        per(start.elapsed(), u64::from(count))
    });
    row("fill 65,536 ranges, per allocation", fill, 15.0, "92 ns");

    let fragmented = median(|run| {
        let (mut set, free) = workload::fragmented_prepare(run as u64 + 1);
        let start = Instant::now();
        let count = black_box(workload::fragmented_run(black_box(&mut set)));
        assert_eq!(count, free, "fragmented run allocated every free range");
        per(start.elapsed(), u64::from(count))
    });
    row(
        "last 1% of fragmented 65,536, per allocation",
        fragmented,
        25.0,
        "870 ns",
    );

    for (extra_bits, label, kubernetes) in [
        (16, "single free of 65,536, per find + release", "0.5 ms"),
        (24, "single free of 16,777,216, per find + release", "-"),
    ] {
        let mut set = workload::last_free_prepare(extra_bits, 42);
        let ns = median(|_| {
            let start = Instant::now();
            black_box(workload::last_free_run(black_box(&mut set), ROUNDS));
            per(start.elapsed(), u64::from(ROUNDS))
        });
        row(label, ns, 1000.0, kubernetes);
    }
}

/// The median of `RUNS` results of `run(i)`.
fn median(mut run: impl FnMut(usize) -> f64) -> f64 {
    let mut results: Vec<f64> = (0..RUNS).map(&mut run).collect();
    results.sort_by(f64::total_cmp);
    results[RUNS / 2]
}

/// Nanoseconds per operation.
fn per(elapsed: Duration, ops: u64) -> f64 {
    elapsed.as_nanos() as f64 / ops as f64
}

fn row(label: &str, ns: f64, target_ns: f64, kubernetes: &str) {
    let ok = if ns < target_ns { "yes" } else { "NO" };
    let target = format!(
        "< {}",
        human(target_ns).replace(".0 ", " ").replace(".00 ", " ")
    );
    println!(
        "{label:<46} {:>10} {target:>10} {kubernetes:>12}  {ok}",
        human(ns)
    );
}

fn human(ns: f64) -> String {
    if ns < 1_000.0 {
        format!("{ns:.1} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2} µs", ns / 1_000.0)
    } else {
        format!("{:.2} ms", ns / 1_000_000.0)
    }
}
