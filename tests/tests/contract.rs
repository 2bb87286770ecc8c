//! The built component honours the contract: it imports the world's interfaces and nothing
//! else (no WASI filesystem, sockets, clocks or random), and exports the world's functions.

use std::collections::BTreeSet;

use wasmtime::Engine;
use wasmtime::component::Component;

fn names(iter: impl Iterator<Item = String>) -> BTreeSet<String> {
    iter.collect()
}

#[test]
fn component_imports_only_the_worlds_interfaces() {
    let engine = Engine::default();
    let path = nodeipam_tests::component_path();
    let component = Component::from_file(&engine, &path).unwrap_or_else(|e| {
        panic!(
            "loading {}: {e:#} (run `make component` first)",
            path.display()
        )
    });
    let ty = component.component_type();
    let imports = names(ty.imports(&engine).map(|(name, _)| name.to_owned()));
    let expected = names(
        ["types", "kube-api", "cloud-alias", "events", "log"]
            .iter()
            .map(|i| format!("nodeipam:sync/{i}@0.1.0")),
    );
    assert_eq!(imports, expected);
    assert!(
        !imports.iter().any(|i| i.starts_with("wasi:")),
        "{imports:?}"
    );
}

#[test]
fn component_exports_the_worlds_functions() {
    let engine = Engine::default();
    let component = Component::from_file(&engine, nodeipam_tests::component_path()).unwrap();
    let ty = component.component_type();
    let exports = names(ty.exports(&engine).map(|(name, _)| name.to_owned()));
    let expected = names(
        ["init", "update", "delete", "tick", "stats"]
            .iter()
            .map(|s| (*s).to_owned()),
    );
    assert!(
        expected.is_subset(&exports),
        "missing exports: {:?}",
        expected.difference(&exports).collect::<Vec<_>>()
    );
}
