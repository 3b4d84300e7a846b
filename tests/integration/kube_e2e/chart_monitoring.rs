//! `helm install` of the chart with its prometheus-operator objects (values `monitoring.*`) on
//! the real API server, with the operator's CRDs installed by the test (pinned, from the Go
//! module proxy: `tests/k8s/prometheus-operator-crds.sh`). The variant without them is
//! `helm_install_and_uninstall_of_the_chart`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use aware_tests::kube::{KubeCluster, KubeOptions};
use k8s_openapi::serde::Deserialize;

use super::{chart_dir, every_object, run};

/// The directory of the prometheus-operator CRDs: `$AWARE_PROMETHEUS_OPERATOR_CRDS` (the README's
/// test command exports it), else what `tests/k8s/prometheus-operator-crds.sh` prints.
fn crd_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("AWARE_PROMETHEUS_OPERATOR_CRDS") {
        return PathBuf::from(dir);
    }
    let mut script = Command::new("bash");
    script.arg(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/prometheus-operator-crds.sh"),
    );
    let out = run(script);
    PathBuf::from(
        out.lines()
            .last()
            .expect("the script prints its directory")
            .trim(),
    )
}

/// Whether `want` is contained in `have`: every field of an object with a contained value,
/// arrays element by element, scalars equal. (The API server prunes fields a CRD's schema does
/// not know and adds defaults: a rendered object that comes back contained lost nothing.)
fn contained(want: &serde_json::Value, have: &serde_json::Value, at: &str) -> Result<(), String> {
    use serde_json::Value;
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => {
            for (k, v) in w {
                let h = h.get(k).ok_or_else(|| format!("{at}.{k} missing"))?;
                contained(v, h, &format!("{at}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(w), Value::Array(h)) if w.len() == h.len() => {
            for (i, (w, h)) in w.iter().zip(h).enumerate() {
                contained(w, h, &format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        _ if want == have => Ok(()),
        _ => Err(format!("{at}: rendered {want}, the server has {have}")),
    }
}

const NS: &str = "aware-system";
/// The monitoring objects the chart renders (it renders no PodMonitor: one ServiceMonitor
/// selects every service).
const MONITORING: [(&str, &str); 3] = [
    ("servicemonitor", "monitoring.coreos.com/v1/ServiceMonitor"),
    ("prometheusrule", "monitoring.coreos.com/v1/PrometheusRule"),
    ("configmap", "v1/ConfigMap"),
];

fn install_args(cmd: &mut Command) {
    cmd.args(["install", "aware"]).arg(chart_dir()).args([
        "--namespace",
        NS,
        "--create-namespace",
        "--timeout",
        "120s",
        "--set",
        "monitoring.serviceMonitor.enabled=true",
        "--set",
        "monitoring.serviceMonitor.labels.release=kube-prometheus-stack",
        "--set",
        "monitoring.prometheusRule.enabled=true",
        "--set",
        "monitoring.grafanaDashboard.enabled=true",
        "--set",
        "nats.persistence.deleteOnUninstall=true",
        "--set",
        "questdb.persistence.deleteOnUninstall=true",
    ]);
}

/// Without the operator's CRDs the server cannot map a ServiceMonitor (helm says so); with them
/// the chart installs, its ServiceMonitor, PrometheusRule and dashboard ConfigMap are stored as
/// rendered (nothing pruned by the CRDs' schemas), and `helm uninstall` removes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_with_the_prometheus_operator_resources() {
    let t0 = Instant::now();
    let crds = crd_dir();
    let cluster = KubeCluster::start(KubeOptions { nodes: 1 }).await.unwrap();

    let mut refused = cluster.command("helm");
    install_args(&mut refused);
    refused.arg("--dry-run=server");
    let out = refused.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && ["ServiceMonitor", "PrometheusRule"]
                .iter()
                .all(|kind| stderr.contains(&format!(
                    "no matches for kind \"{kind}\" in version \"monitoring.coreos.com/v1\""
                ))),
        "installing the monitoring objects without the operator's CRDs: {:?}\n{stderr}",
        out.status
    );

    let mut create = cluster.command("kubectl");
    create.arg("create");
    for kind in ["servicemonitors", "podmonitors", "prometheusrules"] {
        create
            .arg("-f")
            .arg(crds.join(format!("monitoring.coreos.com_{kind}.yaml")));
    }
    run(create);
    let mut established = cluster.command("kubectl");
    established.args([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/podmonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
    ]);
    run(established);

    let mut install = cluster.command("helm");
    install_args(&mut install);
    run(install);
    let mut status = cluster.command("helm");
    status.args(["status", "aware", "-n", NS, "-o", "json"]);
    let status: serde_json::Value = serde_json::from_str(&run(status)).unwrap();
    assert_eq!(status["info"]["status"], "deployed", "{status}");

    // The release's rendered monitoring objects, each against what the server stored.
    let mut manifest = cluster.command("helm");
    manifest.args(["get", "manifest", "aware", "-n", NS]);
    let manifest = run(manifest);
    let rendered: Vec<serde_json::Value> = serde_norway::Deserializer::from_str(&manifest)
        .map(|doc| serde_json::Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect();
    let mut checked = Vec::new();
    for (resource, kind) in MONITORING {
        let mut matching = rendered.iter().filter(|v| {
            format!(
                "{}/{}",
                v["apiVersion"].as_str().unwrap_or_default(),
                v["kind"].as_str().unwrap_or_default()
            ) == kind
                && (resource != "configmap"
                    || v["metadata"]["labels"]["grafana_dashboard"].is_string())
        });
        let want = matching
            .next()
            .unwrap_or_else(|| panic!("the chart rendered no {kind}:\n{manifest}"));
        let name = want["metadata"]["name"].as_str().unwrap();
        let mut get = cluster.command("kubectl");
        get.args(["get", &format!("{resource}/{name}"), "-n", NS, "-o", "json"]);
        let have: serde_json::Value = serde_json::from_str(&run(get)).unwrap();
        for field in ["spec", "data"] {
            if !want[field].is_null() {
                if let Err(e) = contained(&want[field], &have[field], field) {
                    panic!("{kind} {name} not stored as rendered: {e}");
                }
            }
        }
        checked.push(format!("{resource}/{name}"));
    }
    assert_eq!(
        checked,
        [
            "servicemonitor/aware",
            "prometheusrule/aware",
            "configmap/aware-dashboard"
        ]
    );
    // Spot checks that the comparison compared something.
    let mut sm = cluster.command("kubectl");
    sm.args([
        "get",
        "servicemonitor/aware",
        "-n",
        NS,
        "-o",
        "jsonpath={.spec.endpoints[0].port} {.spec.endpoints[0].honorLabels} {.metadata.labels.release}",
    ]);
    assert_eq!(run(sm), "metrics true kube-prometheus-stack");
    let mut rule = cluster.command("kubectl");
    rule.args([
        "get",
        "prometheusrule/aware",
        "-n",
        NS,
        "-o",
        "jsonpath={.spec.groups[*].name}",
    ]);
    assert!(
        run(rule).split(' ').any(|g| g == "aware-release"),
        "the release's own alert group"
    );

    let mut uninstall = cluster.command("helm");
    uninstall.args([
        "uninstall",
        "aware",
        "-n",
        NS,
        "--wait",
        "--timeout",
        "120s",
    ]);
    run(uninstall);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = every_object(
            &cluster,
            Some(NS),
            &["-l", "app.kubernetes.io/instance=aware"],
        );
        let mut monitoring = cluster.command("kubectl");
        monitoring.args([
            "get",
            "servicemonitors,podmonitors,prometheusrules",
            "-A",
            "-o",
            "name",
        ]);
        let monitoring = run(monitoring);
        if left.is_empty() && monitoring.trim().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind after uninstall: {left:?} {monitoring}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "chart with monitoring e2e: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
