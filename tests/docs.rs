//! The documentation kept true to the code: docs/configuration.md names every flag each
//! command's `--help` prints, docs/api.md every route the proxy serves, every relative link of
//! the README and docs/ reaches a file (and a heading, when it names one), the Grafana
//! dashboard queries only metrics the proxy registers, and the README stays an entry page (at
//! most 300 lines).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

const README_MAX_LINES: usize = 300;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// What `rollout-proxy ARGS --help` prints.
fn help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_rollout-proxy"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run rollout-proxy");
    assert!(output.status.success(), "{args:?} --help: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// The commands the top-level help lists (clap's `help` aside).
fn commands(top: &str) -> Vec<String> {
    top.lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        // A command's line is indented by two spaces; a wrapped description by more.
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Every long flag an option line of `help` defines (`  -h, --help`, `      --port <PORT>`);
/// description lines, indented further, are not read.
fn long_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter(|line| {
            let indent = line.len() - line.trim_start().len();
            indent <= 6 && line.trim_start().starts_with('-')
        })
        .filter_map(|line| {
            line.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '<')
                .find(|word| word.starts_with("--") && word.len() > 2)
                .map(str::to_string)
        })
        .collect()
}

/// The part of `page` under the level-2 heading `heading`, up to the next level-2 heading.
fn section<'p>(page: &'p str, heading: &str) -> Option<&'p str> {
    let start = page
        .lines()
        .scan(0, |offset, line| {
            let at = *offset;
            *offset += line.len() + 1;
            Some((at, line))
        })
        .find(|(_, line)| line.trim_end() == heading)
        .map(|(at, _)| at)?;
    let body = &page[start + heading.len()..];
    let end = body.find("\n## ").map_or(body.len(), |end| end + 1);
    Some(&body[..end])
}

#[test]
fn the_configuration_page_names_every_flag_of_every_command() {
    let page = read(&root().join("docs/configuration.md"));
    let top = help(&[]);
    let mut checked = vec![(String::new(), top.clone())];
    for command in commands(&top) {
        let text = help(&[&command]);
        checked.push((command, text));
    }
    assert!(
        checked.iter().any(|(command, _)| command == "serve"),
        "the top-level help lists `serve`:\n{top}"
    );
    let mut missing = Vec::new();
    for (command, text) in &checked {
        let heading = match command.as_str() {
            "" => "## `rollout-proxy`".to_string(),
            command => format!("## `rollout-proxy {command}`"),
        };
        let Some(body) = section(&page, &heading) else {
            missing.push(format!("the section `{heading}`"));
            continue;
        };
        let flags = long_flags(text);
        assert!(!flags.is_empty(), "no flag read from:\n{text}");
        for flag in flags {
            if !body.contains(&format!("`{flag}`")) {
                missing.push(format!("`{flag}` under `{heading}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/configuration.md lacks {}",
        missing.join(", ")
    );
}

#[test]
fn the_api_page_names_every_route() {
    use rollout_proxy::http::routes::{Access, Verb, classes};
    let page = read(&root().join("docs/api.md"));
    let table = section(&page, "## All routes").expect("docs/api.md has `## All routes`");
    let mut missing = Vec::new();
    for class in classes() {
        let verb = match class.verb {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Delete => "DELETE",
        };
        // The page names a route's parameters for people: `{id}` for a model id, `{file}`.
        let pattern = class
            .pattern
            .replace("{model:.+}", "{id}")
            .replace("{name}", "{file}");
        let access = match class.access {
            Access::Public => "public",
            Access::Client => "client",
            Access::Operator => "operator",
        };
        // The route's row: its name, then its class.
        let row = table
            .lines()
            .find(|line| line.contains(&format!("`{verb} {pattern}`")));
        match row {
            Some(row) if row.contains(&format!("| {access} |")) => {}
            Some(row) => missing.push(format!("{verb} {pattern} as {access} (its row: {row})")),
            None => missing.push(format!("{verb} {pattern}")),
        }
    }
    assert!(
        missing.is_empty(),
        "docs/api.md's route table lacks: {}",
        missing.join("; ")
    );
}

/// The Markdown files whose links are checked.
fn documents() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = ["README.md", "BENCHMARKS.md", "CHANGELOG.md"]
        .iter()
        .map(|name| root().join(name))
        .collect();
    let docs = std::fs::read_dir(root().join("docs")).expect("docs/");
    for entry in docs {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    pages
}

/// `text` without its fenced code blocks (links and headings there are not Markdown's).
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut kept = String::with_capacity(text.len());
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// The anchor GitHub gives a heading: lower case, letters, digits, `-` and `_` kept, spaces
/// made `-`, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor of a page's headings (a repeated heading's later ones get `-1`, `-2`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    for line in prose(text).lines() {
        let title = line.trim_start_matches('#');
        if title.len() == line.len() || !title.starts_with(' ') {
            continue;
        }
        let base = slug(title);
        let count = seen.entry(base.clone()).or_default();
        anchors.insert(match *count {
            0 => base.clone(),
            n => format!("{base}-{n}"),
        });
        *count += 1;
    }
    anchors
}

/// The targets of the inline links and images of `text`: `[text](target)`.
fn link_targets(text: &str) -> Vec<String> {
    let text = prose(text);
    let mut targets = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            targets.push(rest[..end].trim().to_string());
        }
    }
    targets
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in documents() {
        let text = read(&page);
        let folder = page.parent().unwrap();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let path = match file {
                "" => page.clone(),
                file => folder.join(file),
            };
            let name = page.strip_prefix(root()).unwrap().display().to_string();
            if !path.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let is_markdown = path.extension().is_some_and(|e| e == "md");
            if !is_markdown || !anchors(&read(&path)).contains(anchor) {
                broken.push(format!("{name}: {target} (no such heading)"));
            }
        }
    }
    assert!(checked > 100, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The metric families `src/metrics.rs` registers, with the `rollout_` prefix.
fn registered_metrics() -> BTreeSet<String> {
    let source = read(&root().join("src/metrics.rs"));
    let mut names = BTreeSet::new();
    let mut rest = source.as_str();
    while let Some(at) = rest.find("register(") {
        rest = rest[at + "register(".len()..].trim_start();
        if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted.find('"').unwrap();
            names.insert(format!("rollout_{}", &quoted[..end]));
        }
    }
    names
}

/// The metric family a sample name belongs to (counters end in `_total`, histograms' series
/// in `_bucket`, `_sum`, `_count`).
fn family(sample: &str) -> &str {
    ["_total", "_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| sample.strip_suffix(suffix))
        .unwrap_or(sample)
}

#[test]
fn the_dashboard_queries_metrics_the_proxy_registers() {
    let registered = registered_metrics();
    assert!(
        registered.contains("rollout_turns") && registered.contains("rollout_sessions"),
        "{registered:?}"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(&root().join("docs/grafana-dashboard.json"))).unwrap();
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(at) = rest.find("rollout_") {
                rest = &rest[at..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                queried.insert(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    assert!(queried.len() > 10, "{queried:?}");
    let unknown: Vec<_> = queried
        .iter()
        .filter(|sample| !registered.contains(family(sample)))
        .collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics src/metrics.rs does not register: {unknown:?}"
    );
}

#[test]
fn the_readme_is_an_entry_page() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; the reference belongs in docs/ (at most {README_MAX_LINES})"
    );
    for page in documents() {
        let Ok(name) = page.strip_prefix(root().join("docs")) else {
            continue;
        };
        let link = format!("(docs/{})", name.display());
        assert!(
            readme.contains(&link),
            "the README's table of contents lacks docs/{}",
            name.display()
        );
    }
}
