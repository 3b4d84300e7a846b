//! `aware bench kube`: the controller and the actuator at scale on a real API server.
//!
//! A real control plane (`aware-kube-testkit`: etcd, kube-apiserver with RBAC and its default
//! priority and fairness, controller manager, scheduler, kwok), a real `nats-server`, and
//! `aware-controller` and `aware-actuator` as processes with the tokens of the chart's
//! ServiceAccounts (the chart's CRD, ClusterRoles and bindings, rendered by `helm template`).
//!
//! 1. `--targets` Deployments are created (paused, 1 replica: the Deployment controller makes no
//!    ReplicaSet of a paused Deployment, so there are no pods; the controller and the actuator
//!    only read and scale the Deployment), then as many AwareAutoscalers. Measured: the time
//!    from the first create until the registration of every target has arrived on the bus, each
//!    object's create → registration latency, the controller's reconcile durations (its own
//!    histogram), and the API calls of the phase.
//! 2. Steady state: nothing changes for `--duration` seconds after the first resync; measured:
//!    the controller's API requests per target per minute (the API server's priority-and-fairness
//!    counters of the ServiceAccounts' flow, which only the two processes use), its writes, its
//!    RSS.
//! 3. Acting: `--act-rounds` control intervals; in each, every target gets its collector `obs`
//!    and an `action` (replicas 1 → 2 → 1 …), spread evenly over `--interval-s`. Measured: the
//!    time from publishing the action to the actuator's `applied` (which it publishes after the
//!    scale call returned), the actuator's and the controller's API writes per target per control
//!    interval (scale patches, status patches), and whether the Deployments have the replicas.
//!
//! Throughout: 429s and requests the server's priority and fairness rejected, and the RSS of the
//! controller, the actuator, kube-apiserver and etcd.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use aware_bus_schemas::{Event, EventKind, Outcome, Resources, Target};
use aware_kube_testkit::{KubeCluster, KubeOptions};
use aware_shared::bus::Bus;
use aware_shared::config::BusConfig;
use aware_shared::testkit::{free_port, NatsServer};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde::Serialize;

use super::scrape::{parse, sum};
use super::{fail, BenchError};

/// The namespace of the chart's identities (as `helm install -n` would).
const RELEASE_NS: &str = "aware-system";
/// The namespace of the Deployments and AwareAutoscalers.
const APP_NS: &str = "bench";
/// The ServiceAccounts' flow schema of the API server's default priority and fairness
/// configuration: every request of the controller and the actuator (and only theirs: the
/// control plane's own components are in `system-*`/`kube-*` schemas or exempt, the bench's
/// administrator is exempt).
const SA_FLOW: &str = "service-accounts";
const MIB: u64 = 1024 * 1024;

/// What to run.
#[derive(Debug, Clone, Serialize, clap::Args)]
pub struct KubeBenchOptions {
    #[serde(skip)]
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Deployments, each with an AwareAutoscaler.
    #[arg(long, default_value_t = KubeBenchOptions::default().targets, help = "Deployments, each with an AwareAutoscaler")]
    pub targets: usize,
    /// Seconds of the steady-state window.
    #[arg(long = "duration", default_value_t = KubeBenchOptions::default().duration_s, help = "Seconds of the steady-state window")]
    pub duration_s: u64,
    /// Control intervals of the acting phase (0: no actuator phase).
    #[arg(long, default_value_t = KubeBenchOptions::default().act_rounds, help = "Control intervals of the acting phase, one action per target each (0: none)")]
    pub act_rounds: u32,
    /// The control interval (the collector's `interval_s`) the actions of a round are spread
    /// over.
    #[arg(long, default_value_t = KubeBenchOptions::default().interval_s, help = "Seconds per control interval (the collector's interval_s)")]
    pub interval_s: f64,
    /// `controller.resync_seconds`.
    #[arg(long, default_value_t = KubeBenchOptions::default().resync_seconds, help = "controller.resync_seconds")]
    pub resync_seconds: u64,
    /// Give up waiting for the registrations after this many seconds (what was registered is
    /// reported).
    #[arg(long, default_value_t = KubeBenchOptions::default().register_timeout_s, help = "Seconds to wait for every registration (what arrived is reported)")]
    pub register_timeout_s: u64,
    /// Concurrent create calls of the bench's own client.
    #[arg(long, default_value_t = KubeBenchOptions::default().create_concurrency, help = "Concurrent create calls of the bench's client")]
    pub create_concurrency: usize,
}

impl Default for KubeBenchOptions {
    fn default() -> Self {
        KubeBenchOptions {
            out: PathBuf::from("bench-out"),
            targets: 1000,
            duration_s: 120,
            act_rounds: 3,
            interval_s: 10.0,
            resync_seconds: 30,
            register_timeout_s: 900,
            create_concurrency: 32,
        }
    }
}

/// API requests counted by the API server over a phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ApiCalls {
    /// Requests of the ServiceAccounts' flow (the controller and the actuator) dispatched.
    pub controller_and_actuator_requests: f64,
    /// By `VERB resource[/subresource] code` for AwareAutoscalers, Deployments, Pods and Leases
    /// (all clients: the bench's own creates and the controller manager's Deployment status
    /// updates are listed too).
    pub by_call: BTreeMap<String, f64>,
    /// Requests rejected by priority and fairness (all flows), and 429 answers (all clients).
    pub apf_rejected: f64,
    pub http_429: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Registration {
    pub aas_created_s: f64,
    pub registered: usize,
    /// First AwareAutoscaler create → the last target's registration on the bus.
    pub all_registered_s: Option<f64>,
    /// The last create → the last registration.
    pub after_last_create_s: Option<f64>,
    pub create_to_registration_p50_ms: f64,
    pub create_to_registration_p99_ms: f64,
    pub create_to_registration_max_ms: f64,
    /// Objects whose `Registered` condition is True at the end of the phase.
    pub status_registered: usize,
    pub reconciles: f64,
    pub reconcile_p50_ms: Option<f64>,
    pub reconcile_p99_ms: Option<f64>,
    /// The controller's writes (PATCH of AwareAutoscalers: finalizer, status) per target.
    pub controller_writes_per_target: f64,
    pub api: ApiCalls,
}

#[derive(Debug, Clone, Serialize)]
pub struct Steady {
    pub window_s: f64,
    pub requests_per_target_per_min: f64,
    pub writes: f64,
    pub writes_per_target_per_interval: f64,
    pub reconciles: f64,
    pub reconciles_per_target_per_min: f64,
    pub reconcile_p50_ms: Option<f64>,
    pub reconcile_p99_ms: Option<f64>,
    pub status_writes: f64,
    pub api: ApiCalls,
}

#[derive(Debug, Clone, Serialize)]
pub struct Acting {
    pub rounds: u32,
    pub actions: usize,
    pub applied: usize,
    pub rejected: usize,
    /// Actions with no `applied` within the phase.
    pub unanswered: usize,
    pub decision_to_api_p50_ms: f64,
    pub decision_to_api_p99_ms: f64,
    pub decision_to_api_max_ms: f64,
    /// Deployments with the replicas of the last round at the end.
    pub deployments_as_decided: usize,
    /// The actuator's PATCHes (Deployments and their scale, pods' resize) per target per control
    /// interval, attempts (429s included).
    pub actuator_writes_per_target_per_interval: f64,
    /// The controller's status PATCHes per target per control interval, attempts.
    pub status_writes_per_target_per_interval: f64,
    /// The end of the last round → the controller's status writes stop (its flushes caught up).
    pub status_settled_after_s: f64,
    pub requests_per_target_per_interval: f64,
    pub api: ApiCalls,
}

#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    pub controller_rss_idle_bytes: u64,
    pub controller_rss_registered_bytes: u64,
    pub controller_rss_steady_bytes: u64,
    pub controller_rss_peak_bytes: u64,
    pub actuator_rss_end_bytes: u64,
    pub actuator_rss_peak_bytes: u64,
    pub apiserver_rss_end_bytes: u64,
    pub etcd_rss_end_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Targets {
    /// Every object registered within 60 s of the first create.
    pub registered_within_60s: bool,
    /// Steady state: under one API write per target per control interval (the controller's
    /// idle writes and, while acting, every write of the controller and the actuator).
    pub steady_writes_under_one_per_interval: bool,
    pub acting_writes_under_one_per_interval: Option<bool>,
    pub decision_to_api_p99_under_1s: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct KubeBenchReport {
    pub options: KubeBenchOptions,
    pub control_plane_started_s: f64,
    pub deployments_created_s: f64,
    pub registration: Registration,
    /// `None` when not every target registered (the bound is the result).
    pub steady: Option<Steady>,
    pub acting: Option<Acting>,
    pub memory: Memory,
    /// Over the whole run.
    pub api_total: ApiCalls,
    pub targets: Targets,
}

/// A service binary (`aware-controller`, `aware-actuator`) next to the running executable (the
/// `aware` CLI), or one directory up (a test binary in `target/<profile>/deps`).
fn sibling_binary(name: &str) -> Result<PathBuf, BenchError> {
    let exe = std::env::current_exe().map_err(|e| fail(format!("current executable: {e}")))?;
    let mut dir = exe.parent();
    for _ in 0..2 {
        if let Some(d) = dir {
            let p = d.join(name);
            if p.is_file() {
                return Ok(p);
            }
            dir = d.parent();
        }
    }
    Err(fail(format!(
        "{name} not found next to {}: build the services first (`cargo build --workspace --bins`)",
        exe.display()
    )))
}

/// A service process, killed on drop; its output in `<dir>/<name>.log`.
struct Service {
    child: Child,
    log: PathBuf,
    http: std::net::SocketAddr,
}

impl Service {
    fn start(
        bin: &str,
        dir: &Path,
        config: &str,
        kubeconfig: &Path,
        port: u16,
    ) -> Result<Service, BenchError> {
        let io = |what: String| move |e: std::io::Error| fail(format!("{what}: {e}"));
        let config_path = dir.join(format!("{bin}.toml"));
        std::fs::write(&config_path, config).map_err(io(config_path.display().to_string()))?;
        let log = dir.join(format!("{bin}.log"));
        let out = std::fs::File::create(&log).map_err(io(log.display().to_string()))?;
        let err = out.try_clone().map_err(io("log file".into()))?;
        let child = Command::new(sibling_binary(bin)?)
            .arg("--config")
            .arg(&config_path)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io(format!("start {bin}")))?;
        let mut s = Service {
            child,
            log,
            http: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, _)) = aware_shared::probe::http_get(s.http, "/readyz") {
                return Ok(s);
            }
            if let Ok(Some(status)) = s.child.try_wait() {
                return Err(fail(format!("{bin} exited ({status}):\n{}", s.tail(30))));
            }
            if Instant::now() > deadline {
                return Err(fail(format!(
                    "{bin} not ready within 60 s:\n{}",
                    s.tail(30)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn metrics(&self) -> Result<prometheus_parse::Scrape, BenchError> {
        crate::scrape::get(self.http)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The cumulative buckets `(upper bound, count)` of histogram `name`.
fn buckets(s: &prometheus_parse::Scrape, name: &str) -> Vec<(f64, f64)> {
    s.samples
        .iter()
        .filter(|x| x.metric == name)
        .find_map(|x| match &x.value {
            prometheus_parse::Value::Histogram(b) => {
                Some(b.iter().map(|c| (c.less_than, c.count)).collect())
            }
            _ => None,
        })
        .unwrap_or_default()
}

/// Quantile `q` of the observations between two scrapes of a histogram, interpolated linearly
/// within its bucket (as `histogram_quantile`); `None` without observations.
fn histogram_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|&(le, n)| {
            let was = before
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |(_, c)| *c);
            (le, n - was)
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, n) in &delta {
        if n >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let within = n - lower.1;
            let frac = if within > 0.0 {
                (rank - lower.1) / within
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * frac);
        }
        lower = (le, n);
    }
    None
}

/// The API server's counters the bench compares between phases.
struct ApiScrape {
    sa_dispatched: f64,
    apf_rejected: f64,
    http_429: f64,
    by_call: BTreeMap<String, f64>,
}

async fn scrape_api(admin: &kube::Client) -> Result<ApiScrape, BenchError> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| fail(format!("request: {e}")))?;
    let text = admin
        .request_text(req)
        .await
        .map_err(|e| fail(format!("kube-apiserver /metrics: {e}")))?;
    let s = parse(&text)?;
    let mut by_call = BTreeMap::new();
    for x in s
        .samples
        .iter()
        .filter(|x| x.metric == "apiserver_request_total")
    {
        let resource = x.labels.get("resource").unwrap_or_default();
        if !matches!(
            resource,
            "awareautoscalers" | "deployments" | "leases" | "pods"
        ) {
            continue;
        }
        let sub = x.labels.get("subresource").unwrap_or_default();
        let key = format!(
            "{} {}{}{} {}",
            x.labels.get("verb").unwrap_or_default(),
            resource,
            if sub.is_empty() { "" } else { "/" },
            sub,
            x.labels.get("code").unwrap_or_default()
        );
        if let prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) = x.value {
            *by_call.entry(key).or_insert(0.0) += v;
        }
    }
    Ok(ApiScrape {
        sa_dispatched: sum(&s, "apiserver_flowcontrol_dispatched_requests_total", |l| {
            l.get("flow_schema") == Some(SA_FLOW)
        }),
        apf_rejected: sum(&s, "apiserver_flowcontrol_rejected_requests_total", |_| {
            true
        }),
        http_429: sum(&s, "apiserver_request_total", |l| {
            l.get("code") == Some("429")
        }),
        by_call,
    })
}

fn api_delta(a: &ApiScrape, b: &ApiScrape) -> ApiCalls {
    let by_call = b
        .by_call
        .iter()
        .map(|(k, v)| (k.clone(), v - a.by_call.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    ApiCalls {
        controller_and_actuator_requests: b.sa_dispatched - a.sa_dispatched,
        by_call,
        apf_rejected: b.apf_rejected - a.apf_rejected,
        http_429: b.http_429 - a.http_429,
    }
}

impl ApiCalls {
    /// Successful or failed calls with `verb` on `resource_prefix` (`awareautoscalers`,
    /// `awareautoscalers/status`, `deployments/scale`…; a prefix matches its subresources).
    fn count(&self, verb: &str, resource: &str, exact: bool) -> f64 {
        self.by_call
            .iter()
            .filter(|(k, _)| {
                let mut parts = k.split(' ');
                let (v, r) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                v == verb
                    && if exact {
                        r == resource
                    } else {
                        r == resource || r.starts_with(&format!("{resource}/"))
                    }
            })
            .map(|(_, v)| v)
            .sum()
    }
}

/// `VmRSS` and `VmHWM` (peak) of a process, bytes.
fn rss(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, BenchError> {
    Ok(serde_json::from_value(v)?)
}

fn deployment(name: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": { "name": name, "labels": { "app": name } },
        "spec": {
            "replicas": 1,
            "paused": true,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {
                        "requests": { "cpu": "250m", "memory": "128Mi" },
                        "limits": { "cpu": "500m", "memory": "256Mi" }
                    }
                }] }
            }
        }
    })
}

fn aas_resource() -> kube::discovery::ApiResource {
    kube::discovery::ApiResource {
        group: "aware.dev".into(),
        version: "v1alpha1".into(),
        api_version: "aware.dev/v1alpha1".into(),
        kind: "AwareAutoscaler".into(),
        plural: "awareautoscalers".into(),
    }
}

fn autoscaler(target: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "aware.dev/v1alpha1",
        "kind": "AwareAutoscaler",
        "metadata": { "name": format!("{target}-aware") },
        "spec": {
            "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": target },
            "updatePolicy": { "updateMode": "Auto" },
            "constraints": { "minReplicas": 1, "maxReplicas": 10 },
            "resourcePolicy": { "containerPolicies": [{
                "containerName": "app",
                "minAllowed": { "cpu": "100m", "memory": "64Mi" },
                "maxAllowed": { "cpu": "2", "memory": "2Gi" }
            }] }
        }
    })
}

fn target_name(i: usize) -> String {
    format!("app-{i:05}")
}

/// Runs `cmd` (kubectl, helm), returns its stdout; its stderr in the error.
fn run_tool(mut cmd: Command, what: &str) -> Result<String, BenchError> {
    let out = cmd.output().map_err(|e| fail(format!("{what}: {e}")))?;
    if !out.status.success() {
        return Err(fail(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The chart's CRD, and the chart's ServiceAccounts, ClusterRoles, ClusterRoleBindings, Roles
/// and RoleBindings of the controller and the actuator (`helm template` into [`RELEASE_NS`]).
fn install_chart_identities(cluster: &KubeCluster) -> Result<(), BenchError> {
    use serde::Deserialize;
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/aware");
    let mut crd = cluster.command("kubectl");
    crd.arg("create")
        .arg("-f")
        .arg(chart.join("crds/awareautoscalers.aware.dev.yaml"));
    run_tool(crd, "kubectl create the CRD")?;
    let mut established = cluster.command("kubectl");
    established.args([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/awareautoscalers.aware.dev",
    ]);
    run_tool(established, "kubectl wait for the CRD")?;
    let mut template = cluster.command("helm");
    template
        .args(["template", "aware"])
        .arg(&chart)
        .args(["--namespace", RELEASE_NS]);
    let rendered = run_tool(template, "helm template")?;
    let mut items = vec![serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": RELEASE_NS }
    })];
    for doc in serde_norway::Deserializer::from_str(&rendered) {
        let v = serde_json::Value::deserialize(doc)
            .map_err(|e| fail(format!("helm template output: {e}")))?;
        let component = v["metadata"]["labels"]["app.kubernetes.io/component"].as_str();
        let kind = v["kind"].as_str().unwrap_or_default();
        if matches!(component, Some("controller" | "actuator"))
            && matches!(
                kind,
                "ServiceAccount" | "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding"
            )
        {
            items.push(v);
        }
    }
    if items.len() < 9 {
        return Err(fail(format!(
            "the chart rendered {} identities of the controller and the actuator, expected 8",
            items.len() - 1
        )));
    }
    let list = cluster.dir().join("bench-identities.json");
    std::fs::write(
        &list,
        serde_json::to_string(
            &serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": items }),
        )?,
    )
    .map_err(|e| fail(format!("write {}: {e}", list.display())))?;
    let mut create = cluster.command("kubectl");
    create.arg("create").arg("-f").arg(&list);
    run_tool(create, "kubectl create the chart's identities")?;
    Ok(())
}

/// A kubeconfig with a token of `aware-<component>`, once `probe` succeeds with it (the
/// authorizer has seen the binding).
async fn identity<F, Fut>(
    cluster: &KubeCluster,
    component: &str,
    probe: F,
) -> Result<PathBuf, BenchError>
where
    F: Fn(kube::Client) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let token = cluster
        .service_account_token(RELEASE_NS, &format!("aware-{component}"))
        .await?;
    let kubeconfig = cluster.token_kubeconfig(&format!("bench-{component}.kubeconfig"), &token)?;
    let client = cluster.token_client(&token).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !probe(client.clone()).await {
        if Instant::now() > deadline {
            return Err(fail(format!(
                "the {component}'s RBAC binding is not in effect after 60 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(kubeconfig)
}

/// Creates `n` objects with `make(i)` through `create`, `concurrency` at a time; returns when
/// each create returned.
async fn create_all<F, Fut>(
    n: usize,
    concurrency: usize,
    create: F,
) -> Result<Vec<Instant>, BenchError>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    let mut done: Vec<Option<Instant>> = vec![None; n];
    let mut results = futures::stream::iter(0..n)
        .map(|i| {
            let f = create(i);
            async move { (i, f.await) }
        })
        .buffer_unordered(concurrency.max(1));
    while let Some((i, r)) = results.next().await {
        r.map_err(|e| fail(format!("create #{i}: {e}")))?;
        done[i] = Some(Instant::now());
    }
    Ok(done
        .into_iter()
        .map(|t| t.unwrap_or_else(Instant::now))
        .collect())
}

/// Percentile `q` (0–1) of a sample, milliseconds; NaN when empty.
fn percentile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx].as_secs_f64() * 1e3
}

type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;
type AppliedLog = Arc<Mutex<HashMap<(String, u32), (Instant, Outcome)>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The sample `obs` and `action` of the schemas, for step `step` of `bench/<name>` asking for
/// `replicas` at the Deployment's per-replica requests (the action sets requests; the limits follow
/// the target's limits policy).
fn step_events(name: &str, step: u32, replicas: u32) -> Result<(Event, Event), BenchError> {
    let samples = aware_bus_schemas::generated::samples();
    let action = samples.iter().find(|e| e.kind() == EventKind::Action);
    let obs = samples.iter().find(|e| e.kind() == EventKind::Obs);
    let (Some(Event::Action(a)), Some(Event::Obs(o))) = (action.cloned(), obs.cloned()) else {
        return Err(fail("the schemas' samples have no action or obs"));
    };
    let t = Target::new(APP_NS, name);
    let ts = aware_bus_schemas::now_ms();
    let mut a = a;
    a.target = t.clone();
    a.episode = 0;
    a.step = step;
    a.ts_ms = ts;
    // An ordinary step: the sample's unreachable SLO would add a condition and an Event.
    a.slo_unreachable = None;
    a.desired = Resources {
        replicas,
        cpu_millicores: 250,
        memory_bytes: 128 * MIB,
    };
    let mut o = o;
    o.target = t;
    o.episode = 0;
    o.step = step;
    o.ts_ms = ts;
    Ok((Event::Obs(o), Event::Action(a)))
}

async fn publish(bus: &Bus, ev: &Event) -> Result<(), BenchError> {
    let subject = aware_bus_schemas::subject::subject(ev.kind(), ev.target())
        .map_err(|e| fail(format!("subject: {e}")))?;
    let bytes = aware_bus_schemas::encode_event(ev).map_err(|e| fail(format!("encode: {e}")))?;
    bus.publish(&subject, bytes.into()).await?;
    Ok(())
}

/// Runs the benchmark.
pub async fn run(opts: &KubeBenchOptions) -> Result<KubeBenchReport, BenchError> {
    let n = opts.targets;
    if n == 0 {
        return Err(fail("--targets must be at least 1"));
    }
    let cluster = KubeCluster::start(KubeOptions { nodes: 1 }).await?;
    let control_plane_started_s = cluster.started_in().as_secs_f64();
    tracing::info!(seconds = control_plane_started_s, "control plane ready");
    let admin = cluster.admin_client().await?;
    let apiserver_pid = cluster
        .pids()
        .iter()
        .find(|(c, _)| *c == "kube-apiserver")
        .map(|(_, p)| *p);
    let etcd_pid = cluster
        .pids()
        .iter()
        .find(|(c, _)| *c == "etcd")
        .map(|(_, p)| *p);
    install_chart_identities(&cluster)?;
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({ "metadata": { "name": APP_NS } }))?,
        )
        .await?;

    // The Deployments first: their number is not the controller's business.
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), APP_NS);
    let t = Instant::now();
    let made: Vec<Deployment> = (0..n)
        .map(|i| from_json(deployment(&target_name(i))))
        .collect::<Result<_, _>>()?;
    create_all(n, opts.create_concurrency, |i| {
        let api = deployments.clone();
        let d = made[i].clone();
        async move { api.create(&PostParams::default(), &d).await.map(|_| ()) }
    })
    .await?;
    let deployments_created_s = t.elapsed().as_secs_f64();
    tracing::info!(deployments = n, seconds = deployments_created_s, "created");

    let controller_kubeconfig = identity(&cluster, "controller", |c| async move {
        Api::<DynamicObject>::all_with(c, &aas_resource())
            .list(&ListParams::default().limit(1))
            .await
            .is_ok()
    })
    .await?;
    let actuator_kubeconfig = identity(&cluster, "actuator", |c| async move {
        Api::<Deployment>::namespaced(c, APP_NS)
            .get(&target_name(0))
            .await
            .is_ok()
    })
    .await?;

    let nats = NatsServer::start()?;
    let bus = Bus::connect(
        &BusConfig {
            url: nats.url(),
            ..BusConfig::default()
        },
        "bench-kube",
    )
    .await?;
    let registered: Arrivals = Arc::default();
    let mut registrations = bus.subscribe("aware.v1.target.>").await?;
    let reg_log = registered.clone();
    let reg_task = tokio::spawn(async move {
        while let Some(m) = registrations.next().await {
            if let Ok(Event::Registration(r)) =
                aware_bus_schemas::decode_event(EventKind::Target, &m.payload)
            {
                if r.spec.is_some() {
                    lock(&reg_log)
                        .entry(r.target.name.clone())
                        .or_insert_with(Instant::now);
                }
            }
        }
    });
    let applied_log: AppliedLog = Arc::default();
    let mut applied_sub = bus.subscribe("aware.v1.applied.>").await?;
    let app_log = applied_log.clone();
    let applied_task = tokio::spawn(async move {
        while let Some(m) = applied_sub.next().await {
            if let Ok(Event::Applied(a)) =
                aware_bus_schemas::decode_event(EventKind::Applied, &m.payload)
            {
                lock(&app_log)
                    .entry((a.target.name.clone(), a.step))
                    .or_insert((Instant::now(), a.outcome));
            }
        }
    });

    // The actuator first, so it hears every registration the controller publishes.
    let work = cluster.dir().to_path_buf();
    let actuator_port = free_port()?;
    let actuator = Service::start(
        "aware-actuator",
        &work,
        &format!(
            "[bus]\nurl = \"{}\"\n[http]\nlisten = \"127.0.0.1:{actuator_port}\"\n\
             [actuator]\nsink = \"kubernetes\"\n",
            nats.url()
        ),
        &actuator_kubeconfig,
        actuator_port,
    )?;
    let controller_port = free_port()?;
    let controller = Service::start(
        "aware-controller",
        &work,
        &format!(
            "[bus]\nurl = \"{}\"\n[http]\nlisten = \"127.0.0.1:{controller_port}\"\n\
             [controller]\nresync_seconds = {}\n\
             [controller.leader_election]\nmode = \"on\"\nlease_namespace = \"{RELEASE_NS}\"\n",
            nats.url(),
            opts.resync_seconds
        ),
        &controller_kubeconfig,
        controller_port,
    )?;
    // Leading (the Lease taken) and its first (empty) list done.
    let deadline = Instant::now() + Duration::from_secs(60);
    while sum(&controller.metrics()?, "aware_controller_leader", |_| true) < 1.0 {
        if Instant::now() > deadline {
            return Err(fail(format!(
                "the controller did not lead within 60 s:\n{}",
                controller.tail(30)
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let controller_rss_idle_bytes = rss(controller.pid()).0;

    // 1. Registration.
    let api0 = scrape_api(&admin).await?;
    let c0 = controller.metrics()?;
    let aas: Api<DynamicObject> = Api::namespaced_with(admin.clone(), APP_NS, &aas_resource());
    let objects: Vec<DynamicObject> = (0..n)
        .map(|i| from_json(autoscaler(&target_name(i))))
        .collect::<Result<_, _>>()?;
    let t_first = Instant::now();
    let created = create_all(n, opts.create_concurrency, |i| {
        let api = aas.clone();
        let o = objects[i].clone();
        async move { api.create(&PostParams::default(), &o).await.map(|_| ()) }
    })
    .await?;
    let t_last_create = Instant::now();
    let aas_created_s = (t_last_create - t_first).as_secs_f64();
    tracing::info!(
        objects = n,
        seconds = aas_created_s,
        "AwareAutoscalers created"
    );
    let deadline = t_first + Duration::from_secs(opts.register_timeout_s);
    let mut last_report = Instant::now();
    loop {
        let got = lock(&registered).len();
        if got >= n || Instant::now() > deadline {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            tracing::info!(
                registered = got,
                of = n,
                seconds = t_first.elapsed().as_secs_f64(),
                "waiting for registrations"
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let arrivals = lock(&registered).clone();
    let mut latencies: Vec<Duration> = (0..n)
        .filter_map(|i| {
            arrivals
                .get(&target_name(i))
                .map(|at| at.saturating_duration_since(created[i]))
        })
        .collect();
    latencies.sort();
    let last_arrival = arrivals.values().max().copied();
    let all = arrivals.len() >= n;
    // The controller writes the status right after publishing: give it a moment, then read.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let listed = aas.list(&ListParams::default()).await?;
    let status_registered = listed
        .items
        .iter()
        .filter(|o| {
            o.data["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Registered" && c["status"] == "True")
            })
        })
        .count();
    let api1 = scrape_api(&admin).await?;
    let c1 = controller.metrics()?;
    let reg_api = api_delta(&api0, &api1);
    let controller_rss_registered_bytes = rss(controller.pid()).0;
    let hist = "aware_controller_reconcile_duration_seconds";
    let reconciles =
        |s: &prometheus_parse::Scrape| sum(s, "aware_controller_reconciles_total", |_| true);
    let registration = Registration {
        aas_created_s,
        registered: arrivals.len(),
        all_registered_s: all
            .then(|| last_arrival.map(|t| (t - t_first).as_secs_f64()))
            .flatten(),
        after_last_create_s: all
            .then(|| last_arrival.map(|t| t.saturating_duration_since(t_last_create).as_secs_f64()))
            .flatten(),
        create_to_registration_p50_ms: percentile_ms(&latencies, 0.5),
        create_to_registration_p99_ms: percentile_ms(&latencies, 0.99),
        create_to_registration_max_ms: percentile_ms(&latencies, 1.0),
        status_registered,
        reconciles: reconciles(&c1) - reconciles(&c0),
        reconcile_p50_ms: histogram_quantile(&buckets(&c0, hist), &buckets(&c1, hist), 0.5)
            .map(|s| s * 1e3),
        reconcile_p99_ms: histogram_quantile(&buckets(&c0, hist), &buckets(&c1, hist), 0.99)
            .map(|s| s * 1e3),
        controller_writes_per_target: reg_api.count("PATCH", "awareautoscalers", false) / n as f64,
        api: reg_api,
    };
    tracing::info!(registered = registration.registered, all_registered_s = ?registration.all_registered_s, "registration phase done");

    let mut memory = Memory {
        controller_rss_idle_bytes,
        controller_rss_registered_bytes,
        controller_rss_steady_bytes: 0,
        controller_rss_peak_bytes: 0,
        actuator_rss_end_bytes: 0,
        actuator_rss_peak_bytes: 0,
        apiserver_rss_end_bytes: 0,
        etcd_rss_end_bytes: 0,
    };
    let (steady, acting) = if all {
        // 2. Steady state, after the first resync of every object.
        tokio::time::sleep(Duration::from_secs(opts.resync_seconds)).await;
        let api2 = scrape_api(&admin).await?;
        let c2 = controller.metrics()?;
        let t2 = Instant::now();
        tokio::time::sleep(Duration::from_secs(opts.duration_s)).await;
        let api3 = scrape_api(&admin).await?;
        let c3 = controller.metrics()?;
        let window_s = t2.elapsed().as_secs_f64();
        memory.controller_rss_steady_bytes = rss(controller.pid()).0;
        let api = api_delta(&api2, &api3);
        let writes = ["POST", "PUT", "PATCH", "DELETE"]
            .iter()
            .map(|v| api.count(v, "awareautoscalers", false) + api.count(v, "leases", false))
            .sum::<f64>();
        let status_writes =
            |s: &prometheus_parse::Scrape| sum(s, "aware_controller_status_writes_total", |_| true);
        let minutes = window_s / 60.0;
        let intervals = window_s / opts.interval_s;
        let steady = Steady {
            window_s,
            requests_per_target_per_min: api.controller_and_actuator_requests / n as f64 / minutes,
            writes,
            writes_per_target_per_interval: writes / n as f64 / intervals,
            reconciles: reconciles(&c3) - reconciles(&c2),
            reconciles_per_target_per_min: (reconciles(&c3) - reconciles(&c2)) / n as f64 / minutes,
            reconcile_p50_ms: histogram_quantile(&buckets(&c2, hist), &buckets(&c3, hist), 0.5)
                .map(|s| s * 1e3),
            reconcile_p99_ms: histogram_quantile(&buckets(&c2, hist), &buckets(&c3, hist), 0.99)
                .map(|s| s * 1e3),
            status_writes: status_writes(&c3) - status_writes(&c2),
            api,
        };
        tracing::info!(
            requests_per_target_per_min = steady.requests_per_target_per_min,
            writes = steady.writes,
            "steady state done"
        );

        // 3. Acting.
        let acting = if opts.act_rounds > 0 {
            let api4 = scrape_api(&admin).await?;
            let t4 = Instant::now();
            let gap = Duration::from_secs_f64(opts.interval_s / n as f64);
            let mut sent: HashMap<(String, u32), Instant> = HashMap::new();
            for round in 1..=opts.act_rounds {
                let replicas = if round % 2 == 1 { 2 } else { 1 };
                let start = tokio::time::Instant::now();
                for i in 0..n {
                    tokio::time::sleep_until(start + gap * i as u32).await;
                    let name = target_name(i);
                    let (obs, action) = step_events(&name, round, replicas)?;
                    publish(&bus, &obs).await?;
                    publish(&bus, &action).await?;
                    sent.insert((name, round), Instant::now());
                }
                bus.flush().await?;
                tokio::time::sleep_until(start + Duration::from_secs_f64(opts.interval_s)).await;
            }
            let acted_for_s = t4.elapsed().as_secs_f64();
            // The answers of the last round, then the controller's status flushes.
            let deadline = Instant::now() + Duration::from_secs(120);
            while lock(&applied_log).len() < sent.len() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let t_end = Instant::now();
            let writes_now = || -> Result<f64, BenchError> {
                Ok(sum(
                    &controller.metrics()?,
                    "aware_controller_status_writes_total",
                    |_| true,
                ))
            };
            let mut last = writes_now()?;
            let mut settled_at = Instant::now();
            let deadline = Instant::now() + Duration::from_secs(300);
            loop {
                tokio::time::sleep(Duration::from_secs(3)).await;
                let w = writes_now()?;
                if w == last || Instant::now() > deadline {
                    break;
                }
                last = w;
                settled_at = Instant::now();
            }
            let api5 = scrape_api(&admin).await?;
            let api = api_delta(&api4, &api5);
            let log = lock(&applied_log).clone();
            let mut lat: Vec<Duration> = Vec::new();
            let (mut applied, mut rejected) = (0, 0);
            for (key, at) in &sent {
                if let Some((got, outcome)) = log.get(key) {
                    lat.push(got.saturating_duration_since(*at));
                    match outcome {
                        Outcome::Applied => applied += 1,
                        _ => rejected += 1,
                    }
                }
            }
            lat.sort();
            let want = if opts.act_rounds % 2 == 1 { 2 } else { 1 };
            let as_decided = deployments
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|d| d.spec.as_ref().and_then(|s| s.replicas) == Some(want))
                .count();
            let rounds = f64::from(opts.act_rounds);
            let per = |x: f64| x / n as f64 / rounds;
            let actuator_writes =
                api.count("PATCH", "deployments", false) + api.count("PATCH", "pods", false);
            let status_writes = api.count("PATCH", "awareautoscalers/status", true);
            tracing::info!(acted_for_s, "acting phase done");
            Some(Acting {
                rounds: opts.act_rounds,
                actions: sent.len(),
                applied,
                rejected,
                unanswered: sent.len() - lat.len(),
                decision_to_api_p50_ms: percentile_ms(&lat, 0.5),
                decision_to_api_p99_ms: percentile_ms(&lat, 0.99),
                decision_to_api_max_ms: percentile_ms(&lat, 1.0),
                deployments_as_decided: as_decided,
                actuator_writes_per_target_per_interval: per(actuator_writes),
                status_writes_per_target_per_interval: per(status_writes),
                status_settled_after_s: settled_at.saturating_duration_since(t_end).as_secs_f64(),
                requests_per_target_per_interval: per(api.controller_and_actuator_requests),
                api,
            })
        } else {
            None
        };
        (Some(steady), acting)
    } else {
        (None, None)
    };

    let (_, controller_peak) = rss(controller.pid());
    let (actuator_now, actuator_peak) = rss(actuator.pid());
    memory.controller_rss_peak_bytes = controller_peak;
    memory.actuator_rss_end_bytes = actuator_now;
    memory.actuator_rss_peak_bytes = actuator_peak;
    memory.apiserver_rss_end_bytes = apiserver_pid.map_or(0, |p| rss(p).0);
    memory.etcd_rss_end_bytes = etcd_pid.map_or(0, |p| rss(p).0);
    let api_end = scrape_api(&admin).await?;
    let api_total = api_delta(&api0, &api_end);
    reg_task.abort();
    applied_task.abort();

    let targets = Targets {
        registered_within_60s: registration.all_registered_s.is_some_and(|s| s <= 60.0),
        steady_writes_under_one_per_interval: steady
            .as_ref()
            .is_some_and(|s| s.writes_per_target_per_interval < 1.0),
        acting_writes_under_one_per_interval: acting.as_ref().map(|a| {
            a.actuator_writes_per_target_per_interval + a.status_writes_per_target_per_interval
                < 1.0
        }),
        decision_to_api_p99_under_1s: acting.as_ref().map(|a| a.decision_to_api_p99_ms < 1000.0),
    };
    drop(controller);
    drop(actuator);
    Ok(KubeBenchReport {
        options: opts.clone(),
        control_plane_started_s,
        deployments_created_s,
        registration,
        steady,
        acting,
        memory,
        api_total,
        targets,
    })
}

/// The readable summary of a report, one line per phase.
pub fn summary(r: &KubeBenchReport) -> Vec<String> {
    let mib = |b: u64| b as f64 / MIB as f64;
    let opt = |x: Option<f64>, unit: &str| x.map_or("-".to_string(), |v| format!("{v:.1} {unit}"));
    let g = &r.registration;
    let mut out = vec![
        format!(
            "{} targets: control plane up in {:.1} s; {} paused Deployments created in {:.1} s",
            r.options.targets, r.control_plane_started_s, r.options.targets, r.deployments_created_s
        ),
        format!(
            "registration: {}/{} registered, all {} after the first create ({} after the last; creates took {:.1} s); create → registration p50 {:.0} ms p99 {:.0} ms max {:.0} ms; Registered=True {}; reconcile p50 {} p99 {}; controller writes {:.2}/target; 429s {}, APF rejections {}",
            g.registered,
            r.options.targets,
            opt(g.all_registered_s, "s"),
            opt(g.after_last_create_s, "s"),
            g.aas_created_s,
            g.create_to_registration_p50_ms,
            g.create_to_registration_p99_ms,
            g.create_to_registration_max_ms,
            g.status_registered,
            opt(g.reconcile_p50_ms, "ms"),
            opt(g.reconcile_p99_ms, "ms"),
            g.controller_writes_per_target,
            g.api.http_429,
            g.api.apf_rejected
        ),
    ];
    match &r.steady {
        Some(s) => out.push(format!(
            "steady state ({:.0} s): {:.2} API requests per target per minute, {} writes ({:.4} per target per {:.0} s interval), {:.2} reconciles per target per minute (p50 {} p99 {}), {} status writes; 429s {}",
            s.window_s,
            s.requests_per_target_per_min,
            s.writes,
            s.writes_per_target_per_interval,
            r.options.interval_s,
            s.reconciles_per_target_per_min,
            opt(s.reconcile_p50_ms, "ms"),
            opt(s.reconcile_p99_ms, "ms"),
            s.status_writes,
            s.api.http_429
        )),
        None => out.push("steady state: not measured (not every target registered)".into()),
    }
    if let Some(a) = &r.acting {
        out.push(format!(
            "acting ({} rounds of {:.0} s): {} actions, {} applied, {} rejected, {} unanswered; decision → API p50 {:.0} ms p99 {:.0} ms max {:.0} ms; per target per interval: {:.2} actuator writes, {:.2} status writes, {:.2} requests; status writes settled {:.1} s after the last answer; {} Deployments as decided; 429s {}, APF rejections {}",
            a.rounds,
            r.options.interval_s,
            a.actions,
            a.applied,
            a.rejected,
            a.unanswered,
            a.decision_to_api_p50_ms,
            a.decision_to_api_p99_ms,
            a.decision_to_api_max_ms,
            a.actuator_writes_per_target_per_interval,
            a.status_writes_per_target_per_interval,
            a.requests_per_target_per_interval,
            a.status_settled_after_s,
            a.deployments_as_decided,
            a.api.http_429,
            a.api.apf_rejected
        ));
    }
    let m = &r.memory;
    out.push(format!(
        "RSS: controller {:.1} MiB idle, {:.1} MiB registered, {:.1} MiB steady, peak {:.1} MiB; actuator {:.1} MiB (peak {:.1}); kube-apiserver {:.0} MiB; etcd {:.0} MiB",
        mib(m.controller_rss_idle_bytes),
        mib(m.controller_rss_registered_bytes),
        mib(m.controller_rss_steady_bytes),
        mib(m.controller_rss_peak_bytes),
        mib(m.actuator_rss_end_bytes),
        mib(m.actuator_rss_peak_bytes),
        mib(m.apiserver_rss_end_bytes),
        mib(m.etcd_rss_end_bytes)
    ));
    let t = &r.targets;
    let yn = |b: Option<bool>| b.map_or("-", |b| if b { "met" } else { "missed" });
    out.push(format!(
        "targets: registered within 60 s {}; steady writes < 1 per target per interval {}; acting writes < 1 per target per interval {}; decision → API p99 < 1 s {}",
        yn(Some(t.registered_within_60s)),
        yn(Some(t.steady_writes_under_one_per_interval)),
        yn(t.acting_writes_under_one_per_interval),
        yn(t.decision_to_api_p99_under_1s)
    ));
    out
}
