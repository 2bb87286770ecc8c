//! `nodeipam import`: nodes from a YAML or JSON file into the store.
//!
//! Accepted shapes (YAML, or JSON for a `.json` file):
//! - what `kubectl get nodes -o yaml` prints: a `kind: List` (or `NodeList`) with `items`, each a
//!   `kind: Node` with `metadata.name`, `spec.providerID`, `spec.podCIDR`, `spec.podCIDRs` and
//!   `status.conditions` (`NetworkUnavailable`); every other field is ignored;
//! - a single `kind: Node` object;
//! - a plain list (or `items`) of flat nodes: `name`, `providerID`, `podCIDR`, `podCIDRs`,
//!   `networkUnavailable`, `alias`.
//!
//! The cloud side, which Kubernetes objects do not carry, is an extension: the VM's alias ranges
//! as `alias: [..]` on a flat node, or as the annotation `nodeipam.io/alias` (comma-separated
//! ranges) on a Kubernetes object. Without a `NetworkUnavailable` condition a node with pod
//! ranges is taken to have a working network and one without is not.
//!
//! Range strings are stored as given, even malformed ones: they are data the component reports
//! on. A malformed file (syntax, wrong types, unknown keys on a node, a node without a name, a
//! name twice) is refused whole, with the file and line.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::backend::Node;
use crate::store::NodeSpec;

/// The annotation carrying a node's cloud alias ranges (comma-separated).
pub const ALIAS_ANNOTATION: &str = "nodeipam.io/alias";

/// Why a file cannot be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file cannot be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse or has a bad node (the message has the line).
    #[error("{}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong and where.
        message: String,
    },
    /// A node name appears twice.
    #[error("{}: node {name} appears twice (entries {first} and {second})", path.display())]
    Duplicate {
        /// The file.
        path: PathBuf,
        /// The node.
        name: String,
        /// 1-based position of its first entry.
        first: usize,
        /// 1-based position of its second entry.
        second: usize,
    },
}

/// Read and parse `path` (`-`: standard input).
pub fn read_file(path: &Path) -> Result<Vec<NodeSpec>, ImportError> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
    .map_err(|source| ImportError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &text)
}

/// Parse `text`, as the file `path`: JSON for a `.json` name, YAML otherwise.
pub fn parse(path: &Path, text: &str) -> Result<Vec<NodeSpec>, ImportError> {
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let parse_err = |message: String| ImportError::Parse {
        path: path.to_path_buf(),
        message,
    };
    let doc: Doc = if is_json {
        serde_json::from_str(text).map_err(|e| parse_err(e.to_string()))?
    } else {
        if text.trim().is_empty() {
            return Ok(Vec::new());
        }
        serde_norway::from_str(text).map_err(|e| parse_err(e.to_string()))?
    };
    let specs = match doc {
        Doc::Seq(entries) => entries
            .into_iter()
            .map(|e| match e {
                Entry::Node(spec) => Ok(spec),
                Entry::List(_) => Err(parse_err("a list of nodes cannot hold a List".into())),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Doc::One(Entry::List(specs)) => specs,
        Doc::One(Entry::Node(spec)) => vec![spec],
    };
    let mut seen = HashMap::new();
    for (i, spec) in specs.iter().enumerate() {
        if let Some(first) = seen.insert(spec.node.name.as_str(), i + 1) {
            return Err(ImportError::Duplicate {
                path: path.to_path_buf(),
                name: spec.node.name.clone(),
                first,
                second: i + 1,
            });
        }
    }
    Ok(specs)
}

/// A file: a sequence of nodes, or one mapping (a List or a Node).
enum Doc {
    Seq(Vec<Entry>),
    One(Entry),
}

impl<'de> Deserialize<'de> for Doc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct DocVisitor;
        impl<'de> Visitor<'de> for DocVisitor {
            type Value = Doc;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of nodes, a List with items, or a Node")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Doc, A::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(Doc::Seq)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Doc, A::Error> {
                Entry::deserialize(MapAccessDeserializer::new(map)).map(Doc::One)
            }
        }
        d.deserialize_any(DocVisitor)
    }
}

/// One mapping of the file, checked.
enum Entry {
    Node(NodeSpec),
    List(Vec<NodeSpec>),
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Checked inside `visit_map`, so the YAML parser tags the error with the mapping's line.
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = Entry;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a node or a List")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Entry, A::Error> {
                let raw = RawEntry::deserialize(MapAccessDeserializer::new(map))?;
                Entry::try_from(raw).map_err(de::Error::custom)
            }
        }
        d.deserialize_map(EntryVisitor)
    }
}

/// The union of every accepted shape's keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    #[serde(rename = "apiVersion")]
    _api_version: Option<String>,
    kind: Option<String>,
    metadata: Option<Metadata>,
    spec: Option<Spec>,
    status: Option<Status>,
    name: Option<String>,
    #[serde(rename = "providerID")]
    provider_id: Option<String>,
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    #[serde(rename = "podCIDRs")]
    pod_cidrs: Option<Vec<String>>,
    #[serde(rename = "networkUnavailable")]
    network_unavailable: Option<bool>,
    alias: Option<Vec<String>>,
    items: Option<Vec<Entry>>,
}

#[derive(Deserialize)]
struct Metadata {
    name: Option<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Default, Deserialize)]
struct Spec {
    #[serde(rename = "providerID")]
    provider_id: Option<String>,
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    #[serde(rename = "podCIDRs")]
    pod_cidrs: Option<Vec<String>>,
}

#[derive(Default, Deserialize)]
struct Status {
    #[serde(default)]
    conditions: Vec<Condition>,
}

#[derive(Deserialize)]
struct Condition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
}

impl TryFrom<RawEntry> for Entry {
    type Error = String;

    fn try_from(raw: RawEntry) -> Result<Self, String> {
        if let Some(items) = raw.items {
            if let Some(kind) = raw
                .kind
                .as_deref()
                .filter(|k| !matches!(*k, "List" | "NodeList"))
            {
                return Err(format!("kind {kind} with items: expected List or NodeList"));
            }
            return items
                .into_iter()
                .map(|e| match e {
                    Entry::Node(spec) => Ok(spec),
                    Entry::List(_) => Err("a List cannot hold another List".to_owned()),
                })
                .collect::<Result<_, _>>()
                .map(Entry::List);
        }
        if let Some(kind) = raw.kind.as_deref().filter(|k| *k != "Node") {
            return Err(format!("kind {kind}: expected Node (or a List of them)"));
        }
        let metadata = raw.metadata;
        let spec = raw.spec.unwrap_or_default();
        let name = one_of(
            "name",
            metadata.as_ref().and_then(|m| m.name.clone()),
            raw.name,
            None,
        )?
        .filter(|n| !n.is_empty())
        .ok_or("a node without a name (metadata.name or name)")?;
        let provider_id = one_of("providerID", spec.provider_id, raw.provider_id, Some(&name))?
            .filter(|p| !p.is_empty());
        let list = one_of("podCIDRs", spec.pod_cidrs, raw.pod_cidrs, Some(&name))?;
        let single =
            one_of("podCIDR", spec.pod_cidr, raw.pod_cidr, Some(&name))?.filter(|c| !c.is_empty());
        let pod_cidrs = match (single, list) {
            (None, list) => list.unwrap_or_default(),
            (Some(single), None) => vec![single],
            (Some(single), Some(list)) => {
                if list.first() != Some(&single) {
                    return Err(format!(
                        "node {name}: podCIDR {single} is not the first entry of podCIDRs {list:?}"
                    ));
                }
                list
            }
        };
        let annotated = metadata
            .as_ref()
            .and_then(|m| m.annotations.get(ALIAS_ANNOTATION))
            .map(|a| {
                a.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            });
        let alias = one_of("alias", annotated, raw.alias, Some(&name))?;
        let condition = raw.status.and_then(|s| {
            s.conditions
                .into_iter()
                .find(|c| c.kind == "NetworkUnavailable")
                .map(|c| c.status != "False")
        });
        let network_unavailable = one_of(
            "networkUnavailable",
            condition,
            raw.network_unavailable,
            Some(&name),
        )?
        .unwrap_or(pod_cidrs.is_empty());
        Ok(Entry::Node(NodeSpec {
            node: Node {
                name,
                provider_id,
                pod_cidrs,
            },
            network_unavailable,
            alias,
        }))
    }
}

/// A value given in the Kubernetes place, the flat place, or both (then equal).
fn one_of<T: PartialEq + std::fmt::Debug>(
    what: &str,
    kube: Option<T>,
    flat: Option<T>,
    node: Option<&str>,
) -> Result<Option<T>, String> {
    match (kube, flat) {
        (Some(a), Some(b)) if a != b => Err(format!(
            "{}{what} given twice with different values: {a:?} and {b:?}",
            node.map(|n| format!("node {n}: ")).unwrap_or_default()
        )),
        (a, b) => Ok(a.or(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Result<Vec<NodeSpec>, ImportError> {
        parse(Path::new("nodes.yaml"), text)
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    const KUBECTL: &str = r#"
apiVersion: v1
kind: List
metadata:
  resourceVersion: ""
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: node-a
    labels: {kubernetes.io/os: linux}
    annotations:
      nodeipam.io/alias: "10.0.1.0/24, fd00:0:0:1::/64"
  spec:
    providerID: gce://p/z/node-a
    podCIDR: 10.0.1.0/24
    podCIDRs: [10.0.1.0/24, "fd00:0:0:1::/64"]
    taints: []
  status:
    addresses: [{type: InternalIP, address: 10.128.0.2}]
    conditions:
    - {type: Ready, status: "True"}
    - {type: NetworkUnavailable, status: "False"}
- apiVersion: v1
  kind: Node
  metadata: {name: node-b}
  spec: {}
"#;

    #[test]
    fn kubectl_list_shape() {
        let specs = yaml(KUBECTL).unwrap();
        assert_eq!(specs.len(), 2);
        let a = &specs[0];
        assert_eq!(a.node.name, "node-a");
        assert_eq!(a.node.provider_id.as_deref(), Some("gce://p/z/node-a"));
        assert_eq!(
            a.node.pod_cidrs,
            strings(&["10.0.1.0/24", "fd00:0:0:1::/64"])
        );
        assert_eq!(a.alias, Some(strings(&["10.0.1.0/24", "fd00:0:0:1::/64"])));
        assert!(!a.network_unavailable);
        let b = &specs[1];
        assert_eq!(
            (
                b.node.pod_cidrs.len(),
                b.alias.clone(),
                b.network_unavailable
            ),
            (0, None, true)
        );
    }

    #[test]
    fn flat_list_and_json() {
        let specs =
            yaml("- name: a\n  podCIDR: 10.0.0.0/24\n  alias: [10.0.0.0/24]\n- {name: b}\n")
                .unwrap();
        assert_eq!(specs[0].node.pod_cidrs, strings(&["10.0.0.0/24"]));
        assert_eq!(specs[0].alias, Some(strings(&["10.0.0.0/24"])));
        let json = parse(
            Path::new("n.json"),
            r#"{"kind": "NodeList", "items": [{"metadata": {"name": "x"}, "spec": {"podCIDRs": ["10.1.0.0/24"]}}]}"#,
        )
        .unwrap();
        assert_eq!(json[0].node, Node::new("x", &["10.1.0.0/24"]));
    }

    #[test]
    fn single_node_object() {
        let specs =
            yaml("kind: Node\nmetadata: {name: solo}\nspec: {podCIDR: 10.0.0.0/24}\n").unwrap();
        assert_eq!(specs[0].node, Node::new("solo", &["10.0.0.0/24"]));
    }

    #[test]
    fn malformed_ranges_are_data_not_errors() {
        let specs = yaml("- name: a\n  podCIDRs: [10.0.300.0/24]\n").unwrap();
        assert_eq!(specs[0].node.pod_cidrs, strings(&["10.0.300.0/24"]));
    }

    #[test]
    fn bad_files_name_the_file_and_line() {
        for (case, text, needle) in [
            ("syntax", "- name: a\n  podCIDRs: [10.0.0.0/24\n", "line"),
            ("wrong type", "- name: a\n  podCIDRs: 7\n", "line 2"),
            (
                "unknown key",
                "- name: a\n- name: b\n  podCIRDs: [x]\n",
                "podCIRDs",
            ),
            (
                "no name",
                "- name: a\n- podCIDR: 10.0.0.0/24\n",
                "without a name",
            ),
            ("kind", "kind: Pod\nmetadata: {name: a}\n", "kind Pod"),
            (
                "podCIDR mismatch",
                "- name: a\n  podCIDR: 10.0.0.0/24\n  podCIDRs: [10.0.1.0/24]\n",
                "not the first",
            ),
            ("scalar", "just text\n", "expected a list of nodes"),
        ] {
            let err = yaml(text).map(drop).unwrap_err().to_string();
            assert!(
                err.starts_with("nodes.yaml") && err.contains(needle),
                "{case}: {err}"
            );
        }
    }

    #[test]
    fn entry_errors_carry_a_line() {
        let err = yaml("- name: a\n- name: b\n- podCIDR: 10.0.0.0/24\n")
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3"), "{err}");
    }

    #[test]
    fn json_error_has_line_and_column() {
        let err = parse(Path::new("n.json"), "[\n{\"name\": \"a\",}\n]")
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("n.json") && err.contains("line 2"), "{err}");
    }

    #[test]
    fn duplicate_names_are_refused() {
        let err = yaml("- name: a\n- name: b\n- name: a\n")
            .map(drop)
            .unwrap_err();
        assert!(
            matches!(
                err,
                ImportError::Duplicate {
                    first: 1,
                    second: 3,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn empty_file_imports_nothing() {
        assert!(yaml("\n").unwrap().is_empty());
    }
}
