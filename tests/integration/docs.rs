//! The docs against the code: the configuration reference (`docs/configuration.md`) against the
//! settings the services read (every key it names exists, every setting is named, and every
//! default it states is the built-in one), and every relative link of the Markdown docs against
//! the files of the repository.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn configuration_reference() -> String {
    std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap()
}

/// Every setting with its built-in default: `AppConfig` and each service's section (what
/// `aware config` prints without a file).
fn defaults() -> Value {
    let v =
        aware_cli::config_check::effective(&aware_shared::config::AppConfig::default()).unwrap();
    for name in aware_shared::config::SERVICE_SECTIONS {
        assert!(v[name].is_object(), "no section {name} in {v}");
    }
    v
}

/// The dotted paths of every leaf (a value that is not an object) below `v`.
fn leaves(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(x, &p, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

fn get<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// A row of the table: its keys (a trailing `.*` or `.<name>` makes a prefix) and its defaults.
#[derive(Debug)]
struct Row {
    keys: Vec<String>,
    defaults: Vec<String>,
}

/// The code spans of `cell`, in order.
fn code_spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_string())
        .collect()
}

/// `cell` split at the commas outside code spans and brackets.
fn split_top(cell: &str) -> Vec<String> {
    let (mut out, mut cur, mut code, mut depth) = (Vec::new(), String::new(), false, 0i32);
    for c in cell.chars() {
        match c {
            '`' => code = !code,
            '[' | '(' if !code => depth += 1,
            ']' | ')' if !code => depth -= 1,
            ',' if !code && depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// The rows of the table under `## Settings` (up to the next `## ` heading or the end).
fn config_table(doc: &str) -> Vec<Row> {
    let start = doc.find("\n## Settings\n").unwrap() + 1;
    let end = doc[start + 3..]
        .find("\n## ")
        .map_or(doc.len(), |i| start + 3 + i);
    doc[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let mut keys = Vec::new();
            let mut base = String::new();
            for k in code_spans(cells[0].trim_start_matches("| ")) {
                let full = if let Some(rel) = k.strip_prefix('.') {
                    format!("{base}.{rel}")
                } else {
                    base = k
                        .rsplit_once('.')
                        .map_or(String::new(), |(b, _)| b.to_string());
                    k
                };
                keys.push(full);
            }
            Row {
                keys,
                defaults: split_top(cells.get(1).copied().unwrap_or("")),
            }
        })
        .collect()
}

/// A stated default as JSON: a code span or a bare JSON value, a trailing `(…)` remark dropped;
/// prose (`built in`, `VPA defaults`) is `None`.
fn stated(s: &str) -> Option<Value> {
    let s = match s.find(" (") {
        Some(i) if s.ends_with(')') => &s[..i],
        _ => s,
    };
    if let Some(code) = s.strip_prefix('`').and_then(|s| s.strip_suffix('`')) {
        return Some(serde_json::from_str(code).unwrap_or_else(|_| Value::String(code.into())));
    }
    serde_json::from_str(s).ok()
}

fn same(stated: &Value, actual: &Value) -> bool {
    match (stated, actual) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            (a - b).abs() <= 1e-6 * a.abs().max(1.0)
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same(a, b))
        }
        (a, b) => a == b,
    }
}

#[test]
fn the_configuration_reference_names_every_setting_and_its_default() {
    let defaults = defaults();
    let rows = config_table(&configuration_reference());
    assert!(rows.len() >= 80, "{rows:?}");
    let mut exact = BTreeSet::new();
    let mut prefixes = BTreeSet::new();
    let mut unknown = Vec::new();
    let mut wrong = Vec::new();
    let mut compared = 0;
    for row in &rows {
        for key in &row.keys {
            if key.starts_with("targets[]") {
                // Per-target settings (`TargetSpec`): no built-in targets to read them from.
                continue;
            }
            let prefix = key
                .strip_suffix(".*")
                .or_else(|| key.strip_suffix(".<name>"));
            match prefix {
                Some(p) if get(&defaults, p).is_some() => {
                    prefixes.insert(p.to_string());
                }
                None if get(&defaults, key).is_some() => {
                    exact.insert(key.clone());
                }
                _ => unknown.push(key.clone()),
            }
        }
        if row.keys.len() != row.defaults.len() || row.keys[0].starts_with("targets[]") {
            continue;
        }
        for (key, d) in row.keys.iter().zip(&row.defaults) {
            let (Some(want), Some(actual)) = (stated(d), get(&defaults, key)) else {
                continue;
            };
            // An unset option whose default is derived from another setting.
            if actual.is_null() {
                continue;
            }
            compared += 1;
            if !same(&want, actual) {
                wrong.push(format!(
                    "{key}: docs/configuration.md says {want}, the default is {actual}"
                ));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "docs/configuration.md names settings that do not exist: {unknown:?}"
    );
    assert!(
        wrong.is_empty(),
        "docs/configuration.md states wrong defaults:\n{}",
        wrong.join("\n")
    );
    let mut all = Vec::new();
    leaves(&defaults, "", &mut all);
    let undocumented: Vec<_> = all
        .iter()
        .filter(|p| !exact.contains(*p))
        .filter(|p| {
            !prefixes
                .iter()
                .any(|x| p.as_str() == x || p.starts_with(&format!("{x}.")))
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "settings missing from docs/configuration.md: {undocumented:?}"
    );
    // Most rows state a value that is checked, so the check cannot pass by reading nothing.
    assert!(compared >= 80, "only {compared} defaults compared");
}

#[test]
fn the_table_reader_sees_shorthand_keys_prefixes_and_remarks() {
    let table = "# T\n\n## Settings\n\n| key | default | meaning |\n|---|---|---|\n\
        | `a.b.c`, `.d` | 1, `[1, 2]` | x |\n\
        | `a.q.*` | built in | y |\n\
        | `a.f` | 604800 (7 days) | z |\n\n## Notes\n\n| `x.y` | 1 | not a setting |\n";
    let rows = config_table(table);
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(rows[0].keys, ["a.b.c", "a.b.d"]);
    assert_eq!(rows[0].defaults, ["1", "`[1, 2]`"]);
    assert_eq!(
        stated(&rows[0].defaults[1]),
        Some(serde_json::json!([1, 2]))
    );
    assert_eq!(rows[1].keys, ["a.q.*"]);
    assert_eq!(stated(&rows[1].defaults[0]), None);
    assert_eq!(
        stated(&rows[2].defaults[0]),
        Some(serde_json::json!(604800))
    );
    assert!(same(
        &serde_json::json!(0.2),
        &serde_json::json!(0.200_000_002_98)
    ));
    assert!(!same(&serde_json::json!(0.2), &serde_json::json!(0.3)));
}

/// The relative link targets of the Markdown `text`: `[…](target)` outside code blocks and code
/// spans, without a URL scheme or a pure `#anchor`, the `#anchor` part dropped.
fn relative_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans cannot hold links: keep the text between them.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            rest = &rest[end..];
            if target.is_empty() || target.starts_with('#') || target.contains("://") {
                continue;
            }
            if target.starts_with("mailto:") {
                continue;
            }
            out.push(target.split('#').next().unwrap_or("").to_string());
        }
    }
    out
}

/// README.md, ARCHITECTURE.md and every Markdown file under docs/.
fn markdown_docs() -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = repo();
    let mut out = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    walk(&root.join("docs"), &mut out);
    out
}

#[test]
fn every_relative_link_in_the_docs_points_to_an_existing_file() {
    let docs = markdown_docs();
    assert!(docs.len() >= 10, "{docs:?}");
    let mut checked = 0;
    let mut broken = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let dir = doc.parent().unwrap();
        for target in relative_links(&text) {
            checked += 1;
            if !dir.join(&target).exists() {
                broken.push(format!("{}: {target}", doc.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    // The docs link to each other: a reader that found no link would pass on anything.
    assert!(checked >= 30, "only {checked} links checked");
}

#[test]
fn the_link_reader_skips_urls_anchors_and_code() {
    let text = "See [a](docs/a.md), [b](../b.md#part) and [c](https://x.org/c.md).\n\
        [d](#anchor) `[e](e.md)`\n```\n[f](f.md)\n```\n[g](g/ \"title\")\n";
    assert_eq!(relative_links(text), ["docs/a.md", "../b.md", "g/"]);
}

/// The README and ARCHITECTURE.md stay readable in one sitting: what grows goes to docs/.
#[test]
fn the_readme_and_the_architecture_stay_short() {
    for (file, max) in [("README.md", 250), ("ARCHITECTURE.md", 500)] {
        let lines = std::fs::read_to_string(repo().join(file))
            .unwrap()
            .lines()
            .count();
        assert!(
            lines <= max,
            "{file} has {lines} lines (at most {max}): move references to docs/, measurements to docs/benchmarks/"
        );
    }
}
