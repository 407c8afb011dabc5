//! `dlq`: dead-letter triage and safe replay.
//!
//! The library holds everything that must behave the same whoever calls it: the model of
//! a dead letter ([`model`]), the two stores and their SQL ([`store`]), the broker side
//! ([`broker`]: connecting, publishing with confirms, the header codec), capture from a
//! dead-letter queue ([`capture`]), and the replay protocol itself ([`replay`]), which is
//! the only place that moves a row from pending to replayed. The `dlq` binary is a thin command layer.

pub mod broker;
pub mod capture;
pub mod error;
pub mod exit;
pub mod import;
pub mod model;
pub mod plan;
pub mod publisher;
pub mod rate;
pub mod replay;
pub mod revise;
pub mod sanitize;
pub mod secret;
pub mod spell;
pub mod store;
pub mod timeparse;
pub mod topology;

pub use error::{DlqError, Result};
pub use model::Outcome;

/// The layering of the library's top-level modules, read from the source.
#[cfg(test)]
mod layering {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// Each top-level module → the other top-level modules its code names (`crate::m`),
    /// comments left out.
    fn uses() -> BTreeMap<String, BTreeSet<String>> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("src is readable") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let rel = path.strip_prefix(&src).expect("under src");
                let top = rel
                    .iter()
                    .next()
                    .and_then(|c| c.to_str())
                    .unwrap_or_default();
                let top = top.trim_end_matches(".rs").to_string();
                if matches!(top.as_str(), "cli" | "main" | "lib" | "bin") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("readable");
                let deps = graph.entry(top.clone()).or_default();
                for line in text.lines().map(str::trim_start) {
                    if line.starts_with("//") {
                        continue;
                    }
                    for part in line.split("crate::").skip(1) {
                        let m: String = part
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        if !m.is_empty() && m != top {
                            deps.insert(m);
                        }
                    }
                }
            }
        }
        graph
    }

    /// A module never uses one that uses it back, through any path: each can be read
    /// (and changed) knowing only the ones below it.
    /// Once broke: `model` used `store` (for how a BLOB id is shown), which uses `model`.
    #[test]
    fn no_module_imports_one_that_imports_it_back() {
        let graph = uses();
        assert!(graph.len() > 10, "{graph:?}");
        fn reach(g: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
            let (mut seen, mut todo) = (BTreeSet::new(), vec![from.to_string()]);
            while let Some(m) = todo.pop() {
                for d in g.get(&m).into_iter().flatten() {
                    if d == to {
                        return true;
                    }
                    if seen.insert(d.clone()) {
                        todo.push(d.clone());
                    }
                }
            }
            false
        }
        let circles: Vec<String> = graph
            .iter()
            .flat_map(|(m, deps)| deps.iter().map(move |d| (m, d)))
            .filter(|(m, d)| reach(&graph, d, m))
            .map(|(m, d)| format!("{m} uses {d}, which leads back to {m}"))
            .collect();
        assert!(circles.is_empty(), "{}", circles.join("\n"));
    }
}
