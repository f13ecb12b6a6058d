//! No crate of the workspace has a cycle among its top-level modules: message types live in
//! modules of their own so that actors never import each other in a circle. Reads the
//! sources as text: an edge is a `crate::name` path (comments aside) from one top-level
//! module to another.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a source file belongs to (`None` for the crate root).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib" && name != "main").then_some(name)
}

/// The first path segments after each `crate::` in `code`, including those of a braced
/// group (`crate::{a::X, b}` names `a` and `b`).
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `starling_crate::`, not ours
        }
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut token, mut expect_name) = (1, String::new(), true);
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if depth == 1 && expect_name && (c.is_alphanumeric() || c == '_') {
                    token.push(c);
                    continue;
                }
                if !token.is_empty() {
                    out.push(std::mem::take(&mut token));
                    expect_name = false;
                }
                if depth == 1 && c == ',' {
                    expect_name = true;
                }
            }
            if !token.is_empty() {
                out.push(token);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

/// A cycle in `edges`, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_owned(), 1);
        path.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let start = path.iter().position(|p| p == next).unwrap_or(0);
                    let mut cycle = path[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(next, edges, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(node.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        if state.get(node.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(node, edges, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_crate_has_a_cycle_among_its_top_level_modules() {
    let mut checked = 0;
    let mut entries: Vec<_> = std::fs::read_dir(crates_dir())
        .expect("crates/")
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for krate in entries {
        let src = krate.join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(&src, f)).collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in &files {
            let Some(from) = module_of(&src, f) else {
                continue;
            };
            let text = std::fs::read_to_string(f).expect("read source");
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            for to in crate_paths(&code) {
                if to != from && modules.contains(&to) {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
        assert_eq!(
            find_cycle(&edges),
            None,
            "module cycle in {}",
            krate.display()
        );
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} crates found under crates/");
}

#[test]
fn the_reader_sees_grouped_and_plain_paths_and_finds_a_cycle() {
    assert_eq!(
        crate_paths("use crate::{a::X, b, c::{d, e}};\nlet x = crate::f::g();"),
        ["a", "b", "c", "f"]
    );
    let mut edges = BTreeMap::new();
    edges.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    edges.insert("b".to_owned(), BTreeSet::from(["a".to_owned()]));
    assert_eq!(
        find_cycle(&edges),
        Some(vec!["a".to_owned(), "b".to_owned(), "a".to_owned()])
    );
}
