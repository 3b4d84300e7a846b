//! The whole loop on the real control plane: three workloads (Deployments with pods on kwok
//! nodes, each with an AwareAutoscaler) driven by every service as a process on a real
//! nats-server, with the chart's RBAC identities for the controller and the actuator.
//!
//! * The simulator plays the workloads' performance in wall-clock time. It takes each target's
//!   allocation from the API server — `aware_tests::kube_sim::DeploymentBridge` watches the
//!   Deployments and submits their `spec.replicas` and container requests — never from the bus's
//!   `applied`, and exports what a cluster's cAdvisor, kube-state-metrics and the application
//!   export. A real `prometheus` scrapes it.
//! * The collector (Prometheus source, targets from the controller's registrations), the
//!   recommender, the actuator (Kubernetes sink), the recorder, the trainer and the lifecycle
//!   monitor run against it; the controller registers the AwareAutoscalers.
//! * Vertical changes are written as template patches (`vertical_mode = "template_patch"`): the
//!   decision is then on the Deployment itself, where the bridge reads it, and the pods roll onto
//!   new ReplicaSets as on a cluster without in-place resize. In-place resizes would leave the
//!   template alone and need the kubelet's resize status for every new pod, which kwok does not
//!   write (`actuator_with_the_charts_rbac_scales_resizes_and_rolls` covers that path); the
//!   simulated apps roll too (`VerticalMode::Restart`).
//!
//! The learning thresholds are low (the AwareAutoscalers' `lifecycle.tOnline`, which overrides
//! the services' `[lifecycle]`; no behaviour or probation rule; never SERVING):
//! the test is about the loop's plumbing on a real cluster — the trainer must train on what the
//! recorder stored from the Prometheus observations and the actuator's decisions, and the
//! monitor must promote on the trainer's model — not about the policy's quality.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aware_bus_schemas::{subject, DecisionSource, Event, Outcome, Resources, Stage, Target};
use aware_loadgen::app::{generate_apps, AppSpec, GeneratorOptions, VerticalMode};
use aware_loadgen::env::{SimConfig, SimEnv};
use aware_loadgen::wallclock::{serve_wall_clock, Clock, SimHandle};
use aware_shared::bus::Bus;
use aware_shared::config::BusConfig;
use aware_shared::quantity::{format_cpu, format_memory};
use aware_shared::testkit::PrometheusServer;
use aware_stores::trajectory::{SqliteStore, TrajectoryStore};
use aware_tests::kube::{KubeCluster, KubeOptions};
use aware_tests::kube_sim::{allocation_of, DeploymentBridge, Reading};
use aware_tests::{scrape, wait_ready, NatsServer, Proc};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

use super::{
    aas_resource, actuator_identity, assert_controller_calls_succeeded, assert_no_refusal_logged,
    autoscaler, controller_config, controller_identity, create_namespace, from_json,
    install_chart_identities, running_pods, start_controller, APP_NS,
};

/// The workloads.
const WORKLOADS: [&str; 3] = ["web", "api", "db"];
/// Real (and simulated) seconds per control step.
const STEP_S: f64 = 1.5;
const STEPS_PER_EPISODE: u32 = 5;
/// Episodes every target must complete.
const EPISODES: usize = 10;
/// RL decisions applied per target after its promotion.
const RL_APPLIED: usize = 3;
/// The AwareAutoscalers' `maxReplicas`.
const MAX_REPLICAS: u32 = 6;
const MIB: u64 = 1024 * 1024;

/// Three generated apps renamed after the workloads, in [`APP_NS`], bounded as their
/// AwareAutoscalers are (1–6 replicas, 100m–2 CPU, 64Mi–2Gi), rolling on vertical changes.
fn apps() -> Vec<AppSpec> {
    let opts = GeneratorOptions {
        latency_slo_fraction: 1.0,
        ..GeneratorOptions::default()
    };
    generate_apps(WORKLOADS.len(), 11, &opts)
        .into_iter()
        .zip(WORKLOADS)
        .map(|(mut a, name)| {
            a.name = name.to_string();
            a.namespace = APP_NS.to_string();
            a.vertical = VerticalMode::Restart;
            a.bounds = aware_loadgen::Bounds {
                min_replicas: 1,
                max_replicas: MAX_REPLICAS,
                min_cpu_millicores: 100,
                max_cpu_millicores: 2000,
                min_memory_bytes: 64 * MIB,
                max_memory_bytes: 2048 * MIB,
            };
            a.initial = a.bounds.clamp(a.initial).0;
            a
        })
        .collect()
}

/// The Deployment of `app`: container `app` with the app's initial allocation as requests and
/// twice it as limits.
fn workload(app: &AppSpec) -> Deployment {
    let i = app.initial;
    from_json(serde_json::json!({
        "metadata": { "name": app.name, "labels": { "app": app.name } },
        "spec": {
            "replicas": i.replicas,
            "selector": { "matchLabels": { "app": app.name } },
            "template": {
                "metadata": { "labels": { "app": app.name } },
                "spec": { "containers": [{
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {
                        "limits": {
                            "cpu": format_cpu(i.cpu_millicores * 2),
                            "memory": format_memory(i.memory_bytes * 2)
                        },
                        "requests": {
                            "cpu": format_cpu(i.cpu_millicores),
                            "memory": format_memory(i.memory_bytes)
                        }
                    }
                }] }
            }
        }
    }))
}

/// The AwareAutoscaler of `app`, with the app's SLO and reward weight.
fn workload_autoscaler(app: &AppSpec) -> kube::api::DynamicObject {
    let mut a = autoscaler(&app.name, "Auto", MAX_REPLICAS);
    let mut slo = serde_json::Map::new();
    if let Some(l) = app.slo.latency_p99_ms {
        slo.insert("latencyP99Ms".into(), l.into());
    }
    if let Some(t) = app.slo.throughput_rps {
        slo.insert("throughputRps".into(), t.into());
    }
    a.data["spec"]["slo"] = slo.into();
    a.data["spec"]["objective"] = serde_json::json!({ "alpha": app.alpha });
    // Bootstrapping behind the fallback; ONLINE on any finite estimate of a trained model,
    // never SERVING (which would stop the training the test watches).
    a.data["spec"]["lifecycle"] = serde_json::json!({
        "bootstrap": true, "tOnline": 0.05, "tServing": 1000.0, "tVar": 0.15, "window": 10
    });
    a
}

/// The services' configuration (one file for all of them, as the chart renders it).
fn services_config(
    dir: &std::path::Path,
    data: &std::path::Path,
    bus_url: &str,
    prometheus_url: &str,
) -> std::path::PathBuf {
    let path = dir.join("aware.toml");
    std::fs::write(
        &path,
        format!(
            r#"[bus]
url = "{bus_url}"
[http]
listen = "127.0.0.1:0"
[learning]
steps_per_episode = {STEPS_PER_EPISODE}
[lifecycle_monitor]
require_behaviour = false
probation_episodes = 0
rebaseline_after_episodes = 0
[collector]
source = "prometheus"
[collector.prometheus]
url = "{prometheus_url}"
interval_s = {STEP_S}
staleness_s = 5.0
[trainer]
train_every_transitions = 10
gradient_steps = 20
batch_size = 16
min_transitions = 15
poll_ms = 100
offline_min_transitions = 15
offline_gradient_steps = 100
eval_episodes = 2
[recorder]
batch = 4
[trajectory_store]
sqlite_path = "{db}"
[model_store]
dir = "{models}"
[actuator]
sink = "kubernetes"
[actuator.guardrails]
cpu_min_change_ratio = 0.1
memory_min_change_ratio = 0.1
[actuator.kubernetes.defaults]
vertical_mode = "template_patch"
"#,
            db = data.join("trajectories.db").display(),
            models = data.join("models").display(),
        ),
    )
    .unwrap();
    path
}

/// Every event on the bus, with when it arrived, collected in the background.
type Seen = Arc<Mutex<Vec<(Instant, Event)>>>;

async fn collect_events(bus: &Bus) -> (Seen, tokio::task::JoinHandle<()>) {
    let mut sub = bus.subscribe(subject::ALL).await.unwrap();
    let seen: Seen = Arc::default();
    let into = seen.clone();
    let task = tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            let Ok(parsed) = subject::parse(&m.subject) else {
                continue;
            };
            if let Ok(ev) = aware_bus_schemas::decode_event(parsed.kind, &m.payload) {
                into.lock().unwrap().push((Instant::now(), ev));
            }
        }
    });
    (seen, task)
}

/// A model the trainer announced: (version, estimate, behaviour's reward).
type ModelSeen = (u64, Option<f64>, Option<f64>);

/// What the loop has done so far, per target.
#[derive(Debug, Default)]
struct Progress {
    /// Lifecycle transitions (previous, stage) in order.
    lifecycle: BTreeMap<Target, Vec<(Option<Stage>, Stage)>>,
    episodes: BTreeMap<Target, BTreeSet<u64>>,
    /// The actuator's decisions in arrival order.
    applied: BTreeMap<Target, Vec<aware_bus_schemas::Applied>>,
    /// The trainer's models, for failure messages.
    models: BTreeMap<String, Vec<ModelSeen>>,
    /// Episodes' mean rewards, for failure messages.
    rewards: BTreeMap<String, Vec<f64>>,
}

impl Progress {
    fn of(seen: &Seen) -> Progress {
        let mut p = Progress::default();
        for (_, ev) in seen.lock().unwrap().iter() {
            match ev {
                Event::Lifecycle(l) => p
                    .lifecycle
                    .entry(l.target.clone())
                    .or_default()
                    .push((l.previous, l.stage)),
                Event::Episode(e) => {
                    p.episodes
                        .entry(e.target.clone())
                        .or_default()
                        .insert(e.episode);
                    p.rewards
                        .entry(e.target.key())
                        .or_default()
                        .push((e.mean_reward * 100.0).round() / 100.0);
                }
                Event::Applied(a) => p
                    .applied
                    .entry(a.target.clone())
                    .or_default()
                    .push(a.clone()),
                Event::Model(m) => p.models.entry(m.target.key()).or_default().push((
                    m.version,
                    m.policy_estimate,
                    m.behaviour_reward,
                )),
                _ => {}
            }
        }
        p
    }

    fn promoted(&self, t: &Target) -> bool {
        self.lifecycle
            .get(t)
            .is_some_and(|v| v.contains(&(Some(Stage::Offline), Stage::Online)))
    }

    fn rl_applied(&self, t: &Target) -> usize {
        self.applied.get(t).map_or(0, |v| {
            v.iter()
                .filter(|a| a.source == DecisionSource::Rl && a.outcome == Outcome::Applied)
                .count()
        })
    }

    fn done(&self, targets: &[Target]) -> bool {
        targets.iter().all(|t| {
            self.promoted(t)
                && self.episodes.get(t).map_or(0, BTreeSet::len) >= EPISODES
                && self.rl_applied(t) >= RL_APPLIED
        })
    }
}

/// Every allocation the actuator reported applied for `target` is a version of its Deployment the
/// API server held, in the order decided (the actuator's scale and template patch are two
/// writes, so the server may also have held the new replicas with the old resources in between);
/// and every version the server held is the initial one or made of what the actuator applied.
fn assert_applied_visible(target: &str, applied: &[aware_bus_schemas::Applied], held: &[Reading]) {
    let decided: Vec<Resources> = applied
        .iter()
        .filter(|a| a.outcome == Outcome::Applied)
        .map(|a| a.applied)
        .collect();
    let versions: Vec<Resources> = held.iter().map(|r| r.allocation).collect();
    let mut at = 0;
    for (i, want) in decided.iter().enumerate() {
        match versions[at..].iter().position(|v| v == want) {
            Some(j) => at += j,
            None => panic!(
                "{target}: decision {i} of {} ({want:?}, step {} of episode {}) was never on the \
                 Deployment after the previous one; the server held, in order:\n{versions:#?}",
                decided.len(),
                applied[i].step,
                applied[i].episode
            ),
        }
    }
    let initial = versions[0];
    for v in &versions {
        let replicas_ok =
            v.replicas == initial.replicas || decided.iter().any(|d| d.replicas == v.replicas);
        let vertical_ok = (v.cpu_millicores, v.memory_bytes)
            == (initial.cpu_millicores, initial.memory_bytes)
            || decided
                .iter()
                .any(|d| (d.cpu_millicores, d.memory_bytes) == (v.cpu_millicores, v.memory_bytes));
        assert!(
            replicas_ok && vertical_ok,
            "{target}: the server held {v:?}, which no decision of the actuator explains"
        );
    }
    let generations: Vec<i64> = held.iter().filter_map(|r| r.generation).collect();
    assert!(
        generations.windows(2).all(|w| w[0] <= w[1]),
        "{target}: generations out of order: {generations:?}"
    );
}

/// Three workloads on kwok nodes, ten episodes of the whole loop, bootstrapping → ONLINE, and
/// every decision the actuator applied found on the Deployments (see the module documentation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_loop_on_the_real_control_plane_bootstraps_to_online_and_applies_to_deployments() {
    let t0 = Instant::now();
    let cluster = KubeCluster::start(KubeOptions { nodes: 2 }).await.unwrap();
    let nats = NatsServer::start().unwrap();
    let bus = Bus::connect(
        &BusConfig {
            url: nats.url(),
            ..BusConfig::default()
        },
        "kube-e2e",
    )
    .await
    .unwrap();
    let (seen, _collecting) = collect_events(&bus).await;
    let data = tempfile::tempdir().unwrap();

    let admin = cluster.admin_client().await.unwrap();
    install_chart_identities(&cluster, &admin).await;
    create_namespace(&admin, APP_NS).await;
    let apps = apps();
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), APP_NS);
    for app in &apps {
        deployments
            .create(&PostParams::default(), &workload(app))
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), APP_NS);
    for app in &apps {
        running_pods(&pods, &app.name, app.initial.replicas as usize).await;
    }
    let targets: Vec<Target> = apps.iter().map(|a| Target::new(APP_NS, &a.name)).collect();

    // The simulated workloads, their /metrics scraped by Prometheus, their allocations read from
    // the API server.
    let env = SimEnv::new(
        apps.clone(),
        SimConfig {
            step_seconds: STEP_S,
            seed: 11,
            ..SimConfig::default()
        },
    )
    .unwrap();
    let interval = Duration::from_secs_f64(STEP_S);
    let sim = SimHandle::new(env, Clock::WallClock { interval }).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim_addr = listener.local_addr().unwrap().to_string();
    let prom = tokio::task::spawn_blocking(move || {
        PrometheusServer::start(&[sim_addr], Duration::from_millis(500))
    })
    .await
    .unwrap()
    .unwrap();
    let (stop_sim, mut sim_stopped) = tokio::sync::watch::channel(false);
    let sim_task = tokio::spawn(serve_wall_clock(
        sim.clone(),
        listener,
        interval,
        async move {
            let _ = sim_stopped.wait_for(|s| *s).await;
        },
    ));
    let bridge = DeploymentBridge::start(admin.clone(), sim.clone(), "app").unwrap();

    // The services.
    let (controller_kubeconfig, _) = controller_identity(&cluster).await;
    let (actuator_kubeconfig, _) = actuator_identity(&cluster, "web").await;
    let config = services_config(cluster.dir(), data.path(), &nats.url(), &prom.url());
    let cfg = config.to_str().unwrap();
    let start = |bin: &str, env: &[(&str, &str)]| {
        let p = Proc::spawn(bin, &["--config", cfg], env);
        let addr = p.http_addr();
        wait_ready(addr);
        (p, addr)
    };
    let mut services = Vec::new();
    for bin in [
        "aware-lifecycle-monitor",
        "aware-meta-learner-trainer",
        "aware-trajectory-recorder",
        "aware-recommender",
    ] {
        services.push(start(bin, &[]));
    }
    let (actuator, actuator_addr) = start(
        "aware-actuator",
        &[
            ("KUBECONFIG", actuator_kubeconfig.to_str().unwrap()),
            ("RUST_LOG", "info"),
        ],
    );
    // Ready only while Prometheus answers.
    let collector = start("aware-metrics-collector", &[]);
    let (controller, controller_addr) = start_controller(
        &controller_config(cluster.dir(), &nats.url()),
        &controller_kubeconfig,
    );
    let aas: Api<kube::api::DynamicObject> =
        Api::namespaced_with(admin.clone(), APP_NS, &aas_resource());
    for app in &apps {
        aas.create(&PostParams::default(), &workload_autoscaler(app))
            .await
            .unwrap();
    }
    let setup = t0.elapsed();

    // The loop runs until every target is ONLINE with RL decisions applied and has done its
    // episodes.
    let loop_start = Instant::now();
    let deadline = loop_start + Duration::from_secs(240);
    loop {
        let p = Progress::of(&seen);
        if p.done(&targets) {
            break;
        }
        if Instant::now() >= deadline {
            let store = SqliteStore::open_path(data.path().join("trajectories.db")).unwrap();
            let stored: Vec<_> = targets
                .iter()
                .map(|t| (t.key(), store.count(t).unwrap()))
                .collect();
            let warnings = |p: &Proc| -> String {
                p.stderr()
                    .lines()
                    .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                    .take(20)
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            panic!(
                "not done within 240 s: lifecycle {:?}, episodes {:?}, RL decisions applied {:?}; \
                 models {:?}; episode rewards {:?}; stored transitions {stored:?}; bridge errors \
                 {:?}\nthe trainer's warnings:\n{}\nthe collector's warnings:\n{}\n\
                 the lifecycle monitor's warnings:\n{}\nthe actuator's log:\n{}",
                p.lifecycle,
                p.episodes
                    .iter()
                    .map(|(t, e)| (t.key(), e.len()))
                    .collect::<Vec<_>>(),
                targets
                    .iter()
                    .map(|t| (t.key(), p.rl_applied(t)))
                    .collect::<Vec<_>>(),
                p.models,
                p.rewards,
                bridge.errors().unwrap(),
                warnings(&services[1].0),
                warnings(&collector.0),
                warnings(&services[0].0),
                actuator.stderr()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let looped = loop_start.elapsed();

    // Every call of the actuator and the controller succeeded with the chart's RBAC.
    let log = actuator.stderr();
    assert_eq!(
        scrape(
            actuator_addr,
            "aware_actuator_sink_errors_total",
            &[("sink", "kubernetes")]
        ),
        Some(0.0),
        "the actuator's log:\n{log}"
    );
    assert_no_refusal_logged("actuator", &log);
    assert_controller_calls_succeeded(&controller, controller_addr);
    assert_eq!(
        scrape(
            collector.1,
            "aware_collector_prometheus_query_errors_total",
            &[]
        ),
        Some(0.0),
        "Prometheus answered every query"
    );
    assert!(
        scrape(collector.1, "aware_collector_prometheus_queries_total", &[]).unwrap_or(0.0) > 0.0
    );

    // Stop deciding: the recommender stops, the actuator finishes what it was given (no new
    // `applied` for three steps), and its last decisions stand; the bridge and the simulator
    // catch up.
    let recommender = &mut services[3].0;
    assert!(recommender
        .terminate(Duration::from_secs(15))
        .is_some_and(|s| s.success()));
    let applied_count = || {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(_, e)| matches!(e, Event::Applied(_)))
            .count()
    };
    let mut last = (applied_count(), Instant::now());
    while last.1.elapsed() < Duration::from_secs_f64(3.0 * STEP_S) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let n = applied_count();
        if n != last.0 {
            last = (n, Instant::now());
        }
    }
    let mut actuator = actuator;
    assert!(actuator
        .terminate(Duration::from_secs(15))
        .is_some_and(|s| s.success()));
    let p = Progress::of(&seen);

    for t in &targets {
        let key = t.key();
        // Bootstrapping: OFFLINE behind the fallback, then ONLINE on the trainer's model.
        let stages = &p.lifecycle[t];
        assert_eq!(
            stages[..2],
            [
                (Some(Stage::Initialized), Stage::Offline),
                (Some(Stage::Offline), Stage::Online)
            ],
            "{key}: OFFLINE first, then ONLINE: {stages:?}"
        );
        let applied = &p.applied[t];
        let first_rl = applied
            .iter()
            .position(|a| a.source == DecisionSource::Rl)
            .unwrap();
        assert!(
            applied[..first_rl]
                .iter()
                .filter(|a| a.source == DecisionSource::Fallback && a.outcome == Outcome::Applied)
                .count()
                >= 10,
            "{key}: the fallback drove before the promotion: {:?}",
            &applied[..first_rl]
        );
        // The fallback never undoes its own scale-up: its scale-downs wait out the HPA's 300 s
        // stabilization window, longer than the loop runs, and between syncs its last decision
        // stands, whatever a step that lags the scale reports.
        let fallback: Vec<u32> = applied[..first_rl]
            .iter()
            .filter(|a| a.source == DecisionSource::Fallback && a.outcome == Outcome::Applied)
            .map(|a| a.applied.replicas)
            .collect();
        assert!(
            fallback.windows(2).all(|w| w[1] >= w[0]),
            "{key}: the fallback scaled down while OFFLINE: {fallback:?}"
        );
        // Once the actuator has the registration, every decision is applied (the guardrails may
        // have clamped it: `reason` says how), through the Kubernetes sink.
        let first = applied
            .iter()
            .position(|a| a.outcome == Outcome::Applied)
            .unwrap();
        let odd: Vec<_> = applied[first..]
            .iter()
            .filter(|a| a.outcome != Outcome::Applied || a.sink != "kubernetes")
            .collect();
        assert!(odd.is_empty(), "{key}: {odd:?}");

        // Every applied decision is on the Deployment, and nothing else wrote it.
        let held = bridge.history(&key).unwrap();
        assert_eq!(
            held[0].allocation,
            apps[targets.iter().position(|x| x == t).unwrap()].initial
        );
        assert_applied_visible(&key, applied, &held);
        let changes = held
            .windows(2)
            .filter(|w| w[0].allocation != w[1].allocation)
            .count();
        assert!(changes >= 1, "{key}: the Deployment never changed");
        let now = deployments.get(&t.name).await.unwrap();
        let (in_force, limits) = allocation_of(&now, "app").unwrap();
        assert_eq!(
            in_force,
            applied.last().unwrap().applied,
            "{key}: the Deployment holds the last decision; the last decisions {:?}, the last \
             versions {:?}",
            &applied[applied.len().saturating_sub(3)..]
                .iter()
                .map(|a| (a.episode, a.step, a.source, a.applied))
                .collect::<Vec<_>>(),
            &held[held.len().saturating_sub(5)..]
                .iter()
                .map(|r| (r.generation, r.allocation))
                .collect::<Vec<_>>()
        );
        // The actuator scales the memory limit with the request (the template's 2:1 ratio, up
        // to the rounding of each rescaling) and, by the default limits policy, removes the CPU
        // limit of these latency-sensitive apps.
        let double = |req: u64, lim: u64| lim.abs_diff(2 * req) <= lim / 100 + 1;
        assert!(
            limits.0.is_none()
                && limits
                    .1
                    .is_some_and(|mem_lim| double(in_force.memory_bytes, mem_lim)),
            "{key}: limits {limits:?} for requests {in_force:?}"
        );
        // The simulated workload runs with what the server holds.
        let deadline = Instant::now() + Duration::from_secs(10);
        while sim.observe(&key).unwrap().allocation != in_force {
            assert!(
                Instant::now() < deadline,
                "{key}: the simulator runs {:?}, the Deployment holds {in_force:?}",
                sim.observe(&key).unwrap().allocation
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "{key}: {} decisions applied ({} RL), {} Deployment versions, {changes} allocation \
             changes, lifecycle {stages:?}; the first decisions (source, replicas, CPU): {:?}",
            applied.len(),
            p.rl_applied(t),
            held.len(),
            applied
                .iter()
                .take(10)
                .map(|a| (a.source, a.applied.replicas, a.applied.cpu_millicores))
                .collect::<Vec<_>>()
        );
    }
    assert!(bridge.submitted().unwrap() >= 1);
    assert_eq!(bridge.errors().unwrap(), Vec::<String>::new());

    // The recorder stored the transitions: fallback ones while OFFLINE, RL ones while ONLINE,
    // each with an allocation the server held, and the episodes' summaries.
    let recorder_addr = services[2].1;
    let store = SqliteStore::open_path(data.path().join("trajectories.db")).unwrap();
    for t in &targets {
        let key = t.key();
        let rows = store.transitions(t, 0..u64::MAX).unwrap();
        let held: BTreeSet<(u32, u32, u64)> = bridge
            .history(&key)
            .unwrap()
            .iter()
            .map(|r| {
                let a = r.allocation;
                (a.replicas, a.cpu_millicores, a.memory_bytes)
            })
            .collect();
        for (stage, source) in [
            (Stage::Offline, DecisionSource::Fallback),
            (Stage::Online, DecisionSource::Rl),
        ] {
            assert!(
                rows.iter().any(|r| r.stage == stage && r.source == source),
                "{key}: no {stage:?} transition by {source:?} stored (of {})",
                rows.len()
            );
        }
        for r in &rows {
            let a = r.applied;
            assert!(
                held.contains(&(a.replicas, a.cpu_millicores, a.memory_bytes)),
                "{key}: stored step {}/{} applied {a:?}, never on the Deployment",
                r.episode,
                r.step
            );
        }
        let episodes = store.episodes(t, 1_000).unwrap();
        assert!(
            episodes.len() >= EPISODES - 1,
            "{key}: {} episode summaries stored",
            episodes.len()
        );
        assert!(episodes.iter().any(|e| e.stage == Stage::Online));
    }
    assert!(
        scrape(
            recorder_addr,
            "aware_recorder_transitions_stored_total",
            &[]
        )
        .unwrap()
            > 0.0
    );

    stop_sim.send(true).unwrap();
    sim_task.await.unwrap().unwrap();
    eprintln!(
        "whole loop: set up in {setup:.1?}, looped {looped:.1?}, total {:.1?}",
        t0.elapsed()
    );
}
