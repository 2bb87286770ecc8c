//! The `nodeipam` binary end to end: the sample cluster, bad input, watching, and kill -9.
//!
//! These run the real binary on the real component (`target/nodeipam.wasm`, built by
//! `make component`; `NODEIPAM_COMPONENT` overrides) against temporary stores.

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use nodeipam_host::store::{NodeState, Store};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn component() -> PathBuf {
    let path = std::env::var_os("NODEIPAM_COMPONENT")
        .map_or_else(|| root().join("target/nodeipam.wasm"), PathBuf::from);
    assert!(
        path.is_file(),
        "component {} missing: run `make component` first",
        path.display()
    );
    path
}

/// The binary with the component and a store in `dir`.
fn nodeipam(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodeipam"));
    cmd.current_dir(dir)
        .env_remove("NODEIPAM_CONFIG")
        .env_remove("RUST_LOG")
        .env("NODEIPAM_COMPONENT", component())
        .env("NODEIPAM_STORE", dir.join("store.db"))
        .arg("--cache-dir")
        .arg(root().join("target/nodeipam-cache"));
    cmd
}

fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?} failed:\n{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run a command that must fail; its stderr.
fn fails(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        !out.status.success(),
        "{cmd:?} should have failed:\n{}",
        text(&out)
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The number on the summary line `label`.
fn count(summary: &str, label: &str) -> usize {
    summary
        .lines()
        .find_map(|l| {
            l.trim_start()
                .strip_prefix(label)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {label:?} line in\n{summary}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Everything a command could change, logically: nodes (with aliases) and events.
fn contents(dir: &Path) -> String {
    let nodes = ok(nodeipam(dir).args(["nodes", "list", "-o", "json"]));
    let events = ok(nodeipam(dir).args(["events", "--limit", "0", "-o", "json"]));
    nodes + &events
}

/// Every node has a range, equal to its alias, network available; no two ranges overlap.
fn assert_converged(store: &Path) {
    let records = Store::open(store).unwrap().records().unwrap();
    let mut ranges: Vec<(IpNet, String)> = Vec::new();
    for r in &records {
        assert_eq!(
            r.state(),
            NodeState::InSync,
            "node {} did not converge: {r:?}",
            r.node.name
        );
        for c in &r.node.pod_cidrs {
            ranges.push((c.parse().unwrap(), r.node.name.clone()));
        }
    }
    ranges.sort();
    for pair in ranges.windows(2) {
        let ((a, na), (b, nb)) = (&pair[0], &pair[1]);
        assert!(
            !a.contains(&b.network()),
            "{na} has {a} and {nb} has {b}: they overlap"
        );
    }
}

#[test]
fn sample_cluster_converges_and_a_second_run_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = root().join("examples/sync-from-cluster.toml");
    let with = |cmd: &mut Command| {
        cmd.arg("--config")
            .arg(&config)
            .arg("--store")
            .arg(dir.path().join("sample.db"));
    };
    let mut import = nodeipam(dir.path());
    with(&mut import);
    let out = ok(import
        .args(["import", "--if-empty"])
        .arg(root().join("examples/cluster.yaml")));
    assert!(out.contains("300 added"), "{out}");

    let mut run = nodeipam(dir.path());
    with(&mut run);
    let first = ok(run.args(["run", "--once"]));
    let counts = [
        "allocated",
        "copied from cloud",
        "pushed to cloud",
        "in sync",
        "mismatches",
        "failures",
    ]
    .map(|label| count(&first, label));
    assert_eq!(counts, [150, 28, 40, 298, 1, 1], "{first}");
    for line in [
        "malformed-1: invalid cidr",
        "changed 218 of 300 nodes",
        "10.0.0.0/14",
    ] {
        assert!(first.contains(line), "missing {line:?} in\n{first}");
    }
    let mut again = nodeipam(dir.path());
    with(&mut again);
    assert!(
        ok(again
            .args(["import", "--if-empty"])
            .arg(root().join("examples/cluster.yaml")))
        .contains("not importing")
    );
    let mut run = nodeipam(dir.path());
    with(&mut run);
    let second = ok(run.args(["run", "--once"]));
    assert!(
        second.contains("nothing changed: in sync: 298, mismatches: 1, failures: 1"),
        "{second}"
    );

    let mut events = nodeipam(dir.path());
    with(&mut events);
    let events = ok(events.args(["events", "--node", "mismatch-1"]));
    assert!(events.contains("CloudCIDRAllocatorMismatch"), "{events}");
}

#[test]
fn nodes_commands_and_status() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(nodeipam(d).args([
        "nodes",
        "add",
        "a",
        "--pod-cidr",
        "10.0.5.0/24",
        "--alias",
        "10.0.5.0/24",
    ]));
    ok(nodeipam(d).args(["nodes", "add", "b"]));
    assert!(fails(nodeipam(d).args(["nodes", "add", "b"])).contains("node b already exists"));
    assert!(
        ok(nodeipam(d).args(["generate", "--nodes", "3"])).contains("gen-000001 to gen-000003")
    );
    let run = ok(nodeipam(d).args(["run", "--once"]));
    assert_eq!(count(&run, "allocated"), 4, "{run}");
    ok(nodeipam(d).args(["nodes", "remove", "b"]));
    assert!(fails(nodeipam(d).args(["nodes", "remove", "b"])).contains("node b not found"));
    let status: serde_json::Value =
        serde_json::from_str(&ok(nodeipam(d).args(["status", "-o", "json"]))).unwrap();
    assert_eq!(status["nodes"], 4);
    assert_eq!(status["states"]["in sync"], 4);
    assert_eq!(status["clusterCIDRs"][0]["used"], 4);
    let list = ok(nodeipam(d).args(["nodes", "list"]));
    assert!(list.lines().next().unwrap().starts_with("NAME"), "{list}");
    assert!(list.contains("gen-000003"), "{list}");
    assert_converged(&d.join("store.db"));
}

#[test]
fn unreadable_config_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = fails(nodeipam(dir.path()).args(["--config", "missing.toml", "status"]));
    assert!(
        err.contains("cannot read config file missing.toml"),
        "{err}"
    );
}

#[test]
fn invalid_config_names_file_line_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(nodeipam(d).args(["nodes", "add", "a"]));
    let before = contents(d);
    for (case, toml, needles) in [
        (
            "syntax",
            "mode = \"sync-from-cluster\"\nresync-ms = \n",
            &["bad.toml", "line 2"][..],
        ),
        (
            "mode",
            "mode = \"sync-from-nowhere\"\n",
            &["bad.toml", "line 1", "sync-from-nowhere"],
        ),
        (
            "mask",
            "[[cluster-cidr]]\ncidr = \"10.0.0.0/16\"\nnode-mask-size = 8\n",
            &["bad.toml", "line", "node mask size 8", "10.0.0.0/16"],
        ),
        ("key", "\n\nresync = 5\n", &["bad.toml", "line 3", "resync"]),
    ] {
        std::fs::write(d.join("bad.toml"), toml).unwrap();
        let err = fails(nodeipam(d).args(["--config", "bad.toml", "run", "--once"]));
        for needle in needles {
            assert!(err.contains(needle), "{case}: missing {needle:?} in {err}");
        }
    }
    assert_eq!(contents(d), before);
}

#[test]
fn invalid_flag_value_names_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let err =
        fails(nodeipam(dir.path()).args(["--cluster-cidr", "10.0.0.0/8,11.0.0.0/8", "status"]));
    assert!(
        err.contains("10.0.0.0/8") && err.contains("11.0.0.0/8"),
        "{err}"
    );
}

#[test]
fn malformed_import_names_file_and_line_and_leaves_the_store_alone() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("bad.yaml"),
        "- name: x\n  podCIDRs: [10.0.0.0/24]\n- podCIDR: 10.0.1.0/24\n",
    )
    .unwrap();
    // No store yet: none is created.
    let err = fails(nodeipam(d).args(["import", "bad.yaml"]));
    assert!(
        err.contains("bad.yaml") && err.contains("line 3") && err.contains("without a name"),
        "{err}"
    );
    assert!(!d.join("store.db").exists());

    ok(nodeipam(d).args(["nodes", "add", "a"]));
    let before = contents(d);
    std::fs::write(
        d.join("bad.json"),
        "[{\"name\": \"b\"},\n {\"name\": \"c\", \"podCIDRs\": 5}]",
    )
    .unwrap();
    let err = fails(nodeipam(d).args(["import", "bad.json"]));
    assert!(err.contains("bad.json") && err.contains("line 2"), "{err}");
    std::fs::write(d.join("dup.yaml"), "- name: b\n- name: b\n").unwrap();
    assert!(fails(nodeipam(d).args(["import", "dup.yaml"])).contains("node b appears twice"));
    assert_eq!(contents(d), before);

    std::fs::write(d.join("good.yaml"), "- name: b\n- name: a\n").unwrap();
    let out = ok(nodeipam(d).args(["import", "good.yaml"]));
    assert!(out.contains("1 added, 0 changed, 1 unchanged"), "{out}");
}

#[test]
fn newer_schema_store_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(nodeipam(d).args(["nodes", "add", "a"]));
    {
        let conn = rusqlite::Connection::open(d.join("store.db")).unwrap();
        conn.execute(
            "UPDATE meta SET value = '99' WHERE key = 'schema_version'",
            [],
        )
        .unwrap();
    }
    let bytes = std::fs::read(d.join("store.db")).unwrap();
    for args in [
        &["run", "--once"][..],
        &["status"],
        &["nodes", "add", "b"],
        &["import", "-"],
    ] {
        let err = fails(nodeipam(d).args(args).stdin(Stdio::null()));
        assert!(
            err.contains("store.db")
                && err.contains("schema version 99")
                && err.contains("the 1 this"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(
        std::fs::read(d.join("store.db")).unwrap(),
        bytes,
        "the store changed"
    );
}

#[test]
fn a_cluster_cidr_change_that_orphans_ranges_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(nodeipam(d).args(["nodes", "add", "inside", "--pod-cidr", "10.0.1.0/24"]));
    ok(nodeipam(d).args(["nodes", "add", "outside", "--pod-cidr", "10.9.1.0/24"]));
    ok(nodeipam(d).args(["nodes", "add", "new"]));
    let before = contents(d);
    let err = fails(nodeipam(d).args(["--cluster-cidr", "10.0.0.0/16", "run", "--once"]));
    assert!(
        err.contains("node outside has 10.9.1.0/24")
            && err.contains("10.0.0.0/16")
            && err.contains("--allow-orphans"),
        "{err}"
    );
    assert!(!err.contains("node inside"), "{err}");
    assert_eq!(contents(d), before);

    let out = ok(nodeipam(d).args([
        "--cluster-cidr",
        "10.0.0.0/16",
        "run",
        "--once",
        "--allow-orphans",
    ]));
    assert_eq!(count(&out, "allocated"), 1, "{out}");
}

#[test]
fn missing_store_and_component_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let err = fails(nodeipam(d).args(["run", "--once"]));
    assert!(err.contains("store.db does not exist"), "{err}");
    ok(nodeipam(d).args(["nodes", "add", "a"]));
    let err = fails(nodeipam(d).args(["run", "--once", "--component", "nope.wasm"]));
    assert!(
        err.contains("nope.wasm") && err.contains("make build"),
        "{err}"
    );
}

/// Lines of a child's stdout, as they come.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_for(rx: &mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    panic!("no line with {needle:?} within 30 s");
}

fn scrape(addr: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

#[test]
fn run_watches_the_store_and_serves_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(nodeipam(d).args(["nodes", "add", "first"]));
    let mut child = nodeipam(d)
        .args([
            "run",
            "--watch-interval-ms",
            "20",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let out = lines(&mut child);
    wait_for(&out, "watching");
    let addr = stderr
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix("metrics: http://")
                .map(|a| a.trim_end_matches("/metrics").to_owned())
        })
        .unwrap();

    // One allocator per store.
    let err = fails(nodeipam(d).args(["run", "--once"]));
    assert!(err.contains("another nodeipam run is using store"), "{err}");

    ok(nodeipam(d).args(["nodes", "add", "second"]));
    wait_for(&out, "node second added: synced");
    ok(nodeipam(d).args(["nodes", "remove", "first"]));
    wait_for(&out, "node first deleted: synced");
    std::fs::write(d.join("more.yaml"), "- name: third\n- name: fourth\n").unwrap();
    ok(nodeipam(d).args(["import", "more.yaml"]));
    wait_for(&out, "node fourth added: synced");

    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let body = scrape(&addr);
        if body.contains(
            "node_ipam_controller_cidrset_cidrs_allocations_total{clusterCIDR=\"10.0.0.0/8\"} 4",
        ) || Instant::now() > deadline
        {
            break body;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    for line in [
        "node_ipam_controller_cidrset_cidrs_allocations_total{clusterCIDR=\"10.0.0.0/8\"} 4",
        "node_ipam_controller_cidrset_cidrs_releases_total{clusterCIDR=\"10.0.0.0/8\"} 1",
        "node_ipam_controller_cirdset_max_cidrs{clusterCIDR=\"10.0.0.0/8\"} 65536",
        "nodeipam_plugin_calls_total{export=\"delete\"} 1",
        "nodeipam_backend_calls_total{op=\"add-alias\"} 4",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
    let records = Store::open(&d.join("store.db")).unwrap().records().unwrap();
    let names: Vec<_> = records.iter().map(|r| r.node.name.as_str()).collect();
    assert_eq!(names, ["fourth", "second", "third"]);
    assert_converged(&d.join("store.db"));
}

/// A small deterministic generator (no dependency): xorshift64*.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

#[test]
fn a_run_killed_at_any_point_converges_on_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Sync-from-cluster with a mix: new nodes, nodes with ranges, nodes with aliases only.
    ok(nodeipam(d).args(["generate", "--nodes", "6000"]));
    let mut yaml = String::new();
    for i in 0..200 {
        yaml += &format!("- name: ranged-{i}\n  podCIDR: 10.200.{i}.0/24\n");
        yaml += &format!("- name: aliased-{i}\n  alias: [10.201.{i}.0/24]\n");
    }
    std::fs::write(d.join("mix.yaml"), yaml).unwrap();
    ok(nodeipam(d).args(["import", "mix.yaml"]));

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut rng = Rng(seed);
    // Each round adds work, starts a run and kills it (SIGKILL) at a random point: loading,
    // init, allocating, or already done.
    let mut kills = Vec::new();
    for _ in 0..8 {
        ok(nodeipam(d).args(["generate", "--nodes", "3000"]));
        let mut child = nodeipam(d)
            .args(["run", "--once"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let at = 5 + rng.below(200);
        std::thread::sleep(Duration::from_millis(at));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        kills.push((at, status.success()));
    }
    eprintln!("seed {seed}: killed at (ms, had finished): {kills:?}");
    let out = ok(nodeipam(d).args(["run", "--once"]));
    assert_eq!(
        (count(&out, "failures"), count(&out, "mismatches")),
        (0, 0),
        "seed {seed}, kills {kills:?}:\n{out}"
    );
    assert_converged(&d.join("store.db"));
    // The ranges already there before any run were kept, and aliases were adopted, not replaced.
    let records: HashMap<_, _> = Store::open(&d.join("store.db"))
        .unwrap()
        .records()
        .unwrap()
        .into_iter()
        .map(|r| (r.node.name.clone(), r))
        .collect();
    for i in 0..200 {
        assert_eq!(
            records[&format!("ranged-{i}")].node.pod_cidrs,
            [format!("10.200.{i}.0/24")],
            "seed {seed}"
        );
        assert_eq!(
            records[&format!("aliased-{i}")].node.pod_cidrs,
            [format!("10.201.{i}.0/24")],
            "seed {seed}"
        );
    }
}
