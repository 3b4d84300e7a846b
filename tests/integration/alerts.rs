//! The alerting rules of `deploy/prometheus/aware-alerts.yaml`: valid for `promtool`, their unit
//! tests pass, every metric they read is one the services export, and a real Prometheus scraping
//! the real services loads them all and fires `AwareMalformedMessages` when a service drops
//! malformed messages. The Grafana dashboard `deploy/grafana/aware-dashboard.json`: every query
//! reads exported metrics and runs on that Prometheus.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aware_shared::bus::Bus;
use aware_shared::config::AppConfig;
use aware_shared::testkit::{find_binary, PrometheusServer};
use bytes::Bytes;

fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

fn promtool(args: &[&str]) -> String {
    let bin = find_binary("PROMTOOL_BIN", "promtool");
    let out = std::process::Command::new(&bin)
        .args(args)
        .current_dir(rules_dir())
        .output()
        .unwrap_or_else(|e| panic!("{bin}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// The `aware_…` metric names in `text` (a histogram's `_bucket`, `_sum`, `_count` series named
/// by their family).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("aware_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        names.insert(family.to_string());
    }
    names
}

/// The dashboard's queries.
fn dashboard_queries() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/aware-dashboard.json");
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect()
}

/// `s` percent-encoded for a URL's query string.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The `aware_…` metric names the rule file reads (outside comments; annotations name none).
fn metrics_read_by_rules() -> BTreeSet<String> {
    let text = std::fs::read_to_string(rules_dir().join("aware-alerts.yaml")).unwrap();
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        names.extend(metric_names(line));
    }
    names
}

/// GETs a Prometheus API path and returns its `data`.
async fn prom_api(port: u16, path: &str) -> serde_json::Value {
    let path = path.to_string();
    let (code, body) = tokio::task::spawn_blocking(move || {
        aware_shared::probe::http_get(([127, 0, 0, 1], port).into(), &path).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "success", "{body}");
    v["data"].clone()
}

/// Polls the Prometheus API `path` until `ready` accepts its `data` (30 s at most; failing with
/// `what`, the last answer and Prometheus' log).
async fn poll<T>(
    prom: &PrometheusServer,
    path: &str,
    what: &str,
    ready: impl Fn(&serde_json::Value) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let data = prom_api(prom.port(), path).await;
        if let Some(t) = ready(&data) {
            return t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {data}\n{}",
            prom.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[test]
fn the_rules_pass_promtool_and_their_unit_tests() {
    let checked = promtool(&["check", "rules", "aware-alerts.yaml"]);
    assert!(checked.contains("SUCCESS: 26 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "aware-alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// `(alert, severity)` of every rule in a rule file (or the chart's template of one).
fn alert_severities(text: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut alert = None;
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert: ") {
            alert = Some(name.trim().to_string());
        } else if let (Some(sev), Some(name)) = (line.strip_prefix("severity: "), &alert) {
            out.insert((name.clone(), sev.trim().to_string()));
            alert = None;
        }
    }
    out
}

#[test]
fn the_readme_lists_every_alert_with_its_severity() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let mut rules = alert_severities(&read("deploy/prometheus/aware-alerts.yaml"));
    assert_eq!(rules.len(), 26, "{rules:?}");
    // The chart's own rule (it needs the release's replica counts).
    let chart = alert_severities(&read("helm/aware/templates/monitoring.yaml"));
    assert_eq!(chart.len(), 1, "{chart:?}");
    rules.extend(chart);
    let readme = read("README.md");
    let listed: BTreeSet<(String, String)> = readme
        .lines()
        .filter_map(|l| l.trim().strip_prefix("| `Aware"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            (
                format!("Aware{}", cells[0].trim_end_matches('`')),
                cells[1].trim().to_string(),
            )
        })
        .collect();
    let missing: Vec<_> = rules.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "rules missing from the README's alert table (or with another severity): {missing:?}"
    );
    let stale: Vec<_> = listed.difference(&rules).collect();
    assert!(stale.is_empty(), "README alerts no rule has: {stale:?}");
}

#[actix_rt::test]
async fn a_real_prometheus_loads_the_rules_and_alerts_on_the_services_metrics() {
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    let data = tempfile::tempdir().unwrap();
    crate::set_recorder(
        &mut cfg,
        serde_json::json!({ "sqlite_path": data.path().join("t.db").display().to_string() }),
    );
    let bus = Bus::in_process(1024);
    let (_all, running, shutdown) =
        crate::start_services(bus.clone(), cfg, "aware.v1.lifecycle.*.*.*").await;
    crate::wait_ready(&running).await;
    let addr = running.http_addr;

    // Every metric the rules read is exported: by the six services (one /metrics for all of
    // them here) or by the controller, which runs only on Kubernetes.
    let (code, body) = tokio::task::spawn_blocking(move || {
        aware_shared::probe::http_get(addr, "/metrics").unwrap()
    })
    .await
    .unwrap();
    assert_eq!(code, 200);
    let mut exported: BTreeSet<String> = aware_tests::parse_metrics(&body)
        .samples
        .into_iter()
        .map(|s| s.metric)
        .collect();
    let controller = aware_shared::telemetry::ServiceMetrics::new("controller").unwrap();
    aware_controller::controller::ControllerMetrics::new(&controller).unwrap();
    let text = aware_shared::telemetry::render_metrics(&[controller]);
    exported.extend(
        aware_tests::parse_metrics(&text)
            .samples
            .into_iter()
            .map(|s| s.metric),
    );
    let exported: BTreeSet<String> = exported.iter().flat_map(|n| metric_names(n)).collect();
    let read = metrics_read_by_rules();
    assert!(read.len() >= 10, "{read:?}");
    let missing: Vec<_> = read.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "read by the rules, exported by no service: {missing:?}"
    );
    let queries = dashboard_queries();
    assert!(queries.len() >= 16, "{queries:?}");
    let read: BTreeSet<String> = queries.iter().flat_map(|q| metric_names(q)).collect();
    let missing: Vec<_> = read.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "read by the dashboard, exported by no service: {missing:?}"
    );
    // The metric table of docs/operations.md names every metric the services export, and no
    // other.
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let start = doc.find("\n## Metrics\n").unwrap();
    let end = start + 1 + doc[start + 1..].find("\n## ").unwrap();
    let listed = metric_names(&doc[start..end]);
    let unlisted: Vec<_> = exported.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "exported, missing from the metric table of docs/operations.md: {unlisted:?}"
    );
    let stale: Vec<_> = listed.difference(&exported).collect();
    assert!(
        stale.is_empty(),
        "in the metric table of docs/operations.md, exported by no service: {stale:?}"
    );

    // A real Prometheus scraping the services with the rules loaded.
    let rules = rules_dir().join("aware-alerts.yaml");
    let target = addr.to_string();
    let prom = tokio::task::spawn_blocking(move || {
        PrometheusServer::start_with_rules(&[target], Duration::from_millis(250), &[rules])
    })
    .await
    .unwrap()
    .unwrap();
    let port = prom.port();
    let rules = poll(&prom, "/api/v1/rules", "rules not all healthy", |groups| {
        let rules: Vec<_> = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect();
        assert_eq!(rules.len(), 26, "{groups}");
        rules.iter().all(|r| r["health"] == "ok").then_some(rules)
    })
    .await;
    assert_eq!(rules.len(), 26);
    // Scraped at least once before anything goes wrong (an increase needs the 0 before it).
    let path = "/api/v1/query?query=aware_decode_errors_total";
    poll(&prom, path, "never scraped", |q| {
        q["result"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["metric"]["event"] == "episode")
            .then_some(())
    })
    .await;
    // Every dashboard query runs (Grafana's $__rate_interval as a minute).
    for q in &queries {
        let q = q.replace("$__rate_interval", "1m");
        prom_api(port, &format!("/api/v1/query?query={}", url_encode(&q))).await;
    }
    // Nothing is wrong: no alert, once the rules have seen a scrape (before it, every service is
    // absent and `AwareServiceAbsent` is pending).
    poll(&prom, "/api/v1/alerts", "alerts with nothing wrong", |a| {
        (a["alerts"] == serde_json::json!([])).then_some(())
    })
    .await;

    // Malformed `episode` messages: dropped and counted by the services that consume episodes,
    // and the alert fires for them.
    for _ in 0..3 {
        bus.publish(
            "aware.v1.episode.184.shop.cart",
            Bytes::from_static(b"\xc1garbage"),
        )
        .await
        .unwrap();
    }
    let firing = poll(&prom, "/api/v1/alerts", "no alert fired", |alerts| {
        let firing: Vec<serde_json::Value> = alerts["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["state"] == "firing")
            .cloned()
            .collect();
        (!firing.is_empty()).then_some(firing)
    })
    .await;
    for a in &firing {
        let l = &a["labels"];
        assert_eq!(l["alertname"], "AwareMalformedMessages", "{a}");
        assert_eq!(l["event"], "episode", "{a}");
        assert_eq!(l["severity"], "warning", "{a}");
        let service = l["service"].as_str().unwrap();
        assert!(aware_cli::SERVICES.iter().any(|s| s.name == service), "{a}");
        assert!(
            a["annotations"]["summary"]
                .as_str()
                .unwrap()
                .contains(&format!("{service} dropped malformed episode messages")),
            "{a}"
        );
    }
    shutdown.cancel();
    running.join().await.unwrap();
}

/// The shard rules against real recommenders: three instances deployed wrongly at once — shard 0
/// of 2 twice, and shard 1 of 3 — scraped by a real Prometheus put every shard rule in `pending`
/// (each waits its `for` before firing): a shard missing (2 distinct of 3), shard 0 on two
/// instances, and two shard counts. The first test has one recommender and no alert.
#[actix_rt::test]
async fn a_real_prometheus_finds_misdeployed_recommender_shards() {
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    let bus = Bus::in_process(1024);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut running = Vec::new();
    for (index, count) in [(0, 2), (0, 2), (1, 3)] {
        let mut c = cfg.clone();
        c.shard = aware_shared::config::ShardConfig { index, count };
        running.push(
            aware_shared::launcher::start_on(
                bus.clone(),
                std::sync::Arc::new(c),
                &[aware_recommender::ENTRY],
                shutdown.clone(),
            )
            .await
            .unwrap(),
        );
    }
    let targets: Vec<String> = running.iter().map(|r| r.http_addr.to_string()).collect();
    let rules = rules_dir().join("aware-alerts.yaml");
    let prom = tokio::task::spawn_blocking(move || {
        PrometheusServer::start_with_rules(&targets, Duration::from_millis(250), &[rules])
    })
    .await
    .unwrap()
    .unwrap();
    let want = [
        "AwareShardCountsDiffer",
        "AwareShardDuplicated",
        "AwareShardsMissing",
    ];
    let shard_alerts = poll(&prom, "/api/v1/alerts", "the shard rules pending", |a| {
        let mut shard: Vec<serde_json::Value> = a["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| {
                a["labels"]["alertname"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("AwareShard"))
            })
            .cloned()
            .collect();
        shard.sort_by_key(|a| a["labels"]["alertname"].as_str().unwrap().to_string());
        let names: Vec<&str> = shard
            .iter()
            .map(|a| a["labels"]["alertname"].as_str().unwrap())
            .collect();
        (names == want).then_some(shard)
    })
    .await;
    for a in &shard_alerts {
        assert_eq!(a["state"], "pending", "{a}");
        assert_eq!(a["labels"]["service"], "recommender", "{a}");
        assert_eq!(a["labels"]["severity"], "critical", "{a}");
    }
    assert_eq!(shard_alerts[1]["labels"]["shard"], "0");
    assert_eq!(
        shard_alerts[1]["annotations"]["summary"],
        "2 recommender instances run shard 0"
    );
    assert_eq!(
        shard_alerts[0]["annotations"]["description"]
            .as_str()
            .unwrap()
            .split(" different shard counts")
            .next(),
        Some("recommender instances have run with 2")
    );
    assert_eq!(
        shard_alerts[2]["annotations"]["summary"],
        "only 2 recommender shards report"
    );
    shutdown.cancel();
    for r in running {
        r.join().await.unwrap();
    }
}
