//! The source layout: no two modules import each other, directly or round a circle, so each
//! folder of `src/` can be read after the ones it uses (`request → render → tokenize → backend
//! → node → response`). Imports are read from the source (`crate::`, `super::`, `self::` paths
//! outside comments and test modules) and a module is a file; a file's imports of its own
//! submodules or of its parents do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every module of `src/` (`turn::plan`), with its file's text before its test module.
fn modules() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = BTreeMap::new();
    let mut folders = vec![root.clone()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(&root).unwrap().with_extension("");
            let mut parts: Vec<String> = relative
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let code: Vec<&str> = code
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect();
            found.insert(parts.join("::"), code.join("\n"));
        }
    }
    found
}

/// The module a path written in `module` names: the longest known prefix of it.
fn resolve(module: &str, path: &str, known: &BTreeMap<String, String>) -> Option<String> {
    let mut segments: Vec<&str> = path.split("::").collect();
    let mut base: Vec<&str> = match module {
        "" => Vec::new(),
        m => m.split("::").collect(),
    };
    match segments.first() {
        Some(&"crate") => base.clear(),
        Some(&"super") => {
            while segments.first() == Some(&"super") {
                base.pop();
                segments.remove(0);
            }
            segments.insert(0, "self");
        }
        Some(&"self") => {}
        _ => return None,
    }
    base.extend(segments.into_iter().skip(1));
    (1..=base.len())
        .rev()
        .map(|n| base[..n].join("::"))
        .find(|candidate| known.contains_key(candidate))
}

/// The paths (`crate::a::b`, `super::c`) written in `code`.
fn paths(code: &str) -> Vec<String> {
    let bytes = code.as_bytes();
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut found = Vec::new();
    for start in 0..bytes.len() {
        if !code.is_char_boundary(start)
            || (start > 0 && (is_word(bytes[start - 1]) || bytes[start - 1] == b':'))
        {
            continue;
        }
        let rest = &code[start..];
        if !["crate::", "super::", "self::"]
            .iter()
            .any(|p| rest.starts_with(p))
        {
            continue;
        }
        let mut end = 0;
        while end < rest.len() {
            let tail = &rest[end..];
            if tail.starts_with("::") {
                end += 2;
            } else if tail.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
                end += tail.chars().next().map_or(1, char::len_utf8);
            } else {
                break;
            }
        }
        found.push(rest[..end].trim_end_matches(':').to_string());
    }
    found
}

/// Which modules each module imports.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let known = modules();
    known
        .iter()
        .map(|(module, code)| {
            let related = |other: &String| {
                other == module
                    || module.starts_with(&format!("{other}::"))
                    || other.starts_with(&format!("{module}::"))
                    || other.is_empty()
            };
            let used = paths(code)
                .iter()
                .filter_map(|path| resolve(module, path, &known))
                .filter(|other| !related(other))
                .collect();
            (module.clone(), used)
        })
        .collect()
}

/// The modules that reach each other round a circle (strongly connected, more than one).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reaches = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut next = vec![from.clone()];
        while let Some(module) = next.pop() {
            for other in graph.get(&module).into_iter().flatten() {
                if seen.insert(other.clone()) {
                    next.push(other.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reaches(m))).collect();
    let mut circles: Vec<Vec<String>> = Vec::new();
    for module in graph.keys() {
        let circle: Vec<String> = graph
            .keys()
            .filter(|other| reach[module].contains(*other) && reach[other].contains(module))
            .cloned()
            .collect();
        if circle.len() > 1 && !circles.contains(&circle) {
            circles.push(circle);
        }
    }
    circles
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = imports();
    assert!(graph.len() > 100, "the modules of src/ are found");
    assert!(
        graph["turn::pipeline"].contains("backend"),
        "imports are read: {:?}",
        graph["turn::pipeline"]
    );
    let circles = circles(&graph);
    assert!(
        circles.is_empty(),
        "modules that import each other (move what both need to one of them, or below both): {circles:#?}"
    );
}

#[test]
fn a_circle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, uses)| (m.into(), uses.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
    let known: BTreeMap<String, String> = ["turn", "turn::plan", "turn::tail", "session"]
        .into_iter()
        .map(|m| (m.to_string(), String::new()))
        .collect();
    assert_eq!(
        resolve("turn::plan", "super::tail::remember", &known).as_deref(),
        Some("turn::tail")
    );
    assert_eq!(
        resolve("turn::plan", "crate::session::Session", &known).as_deref(),
        Some("session")
    );
    assert_eq!(
        paths("use crate::a::{b, c};\nlet x = super::d(1);"),
        ["crate::a", "super::d"]
    );
}
