//! The README's configuration table against the settings the services read: every key it names
//! exists, every setting is named, and every default it states is the built-in one.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(path).unwrap()
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

fn config_table(readme: &str) -> Vec<Row> {
    let start = readme.find("## Configuration").unwrap();
    let end = start + readme[start..].find("## Operations").unwrap();
    readme[start..end]
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
fn the_readme_configuration_table_names_every_setting_and_its_default() {
    let defaults = defaults();
    let rows = config_table(&readme());
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
                    "{key}: README says {want}, the default is {actual}"
                ));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "README names settings that do not exist: {unknown:?}"
    );
    assert!(
        wrong.is_empty(),
        "README states wrong defaults:\n{}",
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
        "settings missing from the README's configuration table: {undocumented:?}"
    );
    // Most rows state a value that is checked, so the check cannot pass by reading nothing.
    assert!(compared >= 80, "only {compared} defaults compared");
}

#[test]
fn the_table_reader_sees_shorthand_keys_prefixes_and_remarks() {
    let table = "## Configuration\n\n| key | default | meaning |\n|---|---|---|\n\
        | `a.b.c`, `.d` | 1, `[1, 2]` | x |\n\
        | `a.q.*` | built in | y |\n\
        | `a.f` | 604800 (7 days) | z |\n\n## Operations\n";
    let rows = config_table(table);
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
