//! Keeps the agent's layers in order: a module may use only the modules
//! listed after it here (ARCHITECTURE.md draws them), so no store reaches
//! the metrics, and no layer reaches one above it.

use std::collections::BTreeSet;
use std::path::Path;

/// The top-level modules, highest first, as ARCHITECTURE.md draws them.
const LAYERS: &[&str] = &[
    "server",
    "connection",
    "config",
    "notify",
    "metrics",
    "meltano",
    "lease",
    "backend",
    "process",
    "shown",
    "handoff",
    "access",
    "limits",
    "listener",
    "telemetry",
    "exit_status",
    "unpoisoned",
];

/// The top-level modules each file of `dir` names as `crate::NAME`, with the
/// module the file belongs to (`top`, or the file's own at the top).
fn uses(dir: &Path, top: Option<&str>, found: &mut BTreeSet<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("readable sources") {
        let path = entry.expect("a directory entry").path();
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let module = top.unwrap_or(stem).to_string();
        if path.is_dir() {
            uses(&path, Some(&module), found);
            continue;
        }
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a readable source");
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (at, _) in line.match_indices("crate::") {
                let rest = &line[at + "crate::".len()..];
                // `crate::a::…`, or `crate::{a::…, b}`.
                let items: Vec<&str> = match rest.strip_prefix('{') {
                    Some(list) => list.split('}').next().unwrap_or("").split(',').collect(),
                    None => vec![rest],
                };
                for item in items {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != module {
                        found.insert((module.clone(), name));
                    }
                }
            }
        }
    }
}

#[test]
fn no_module_uses_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = BTreeSet::new();
    uses(&src, None, &mut found);
    let rank = |module: &str| LAYERS.iter().position(|layer| *layer == module);
    let mut wrong = BTreeSet::new();
    for (module, used) in &found {
        if ["main", "lib", "layers"].contains(&module.as_str()) {
            continue;
        }
        let problem = match (rank(module), rank(used)) {
            (Some(above), Some(below)) if above < below => continue,
            (None, _) => format!("{module} is in no layer"),
            _ => format!("{module} uses {used}, above it or in no layer"),
        };
        wrong.insert(problem);
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
