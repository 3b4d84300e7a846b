//! The simulator as a service: a shared handle usable by the services as metrics source and
//! scaling sink, in lock-step virtual time or in wall-clock time, and the Prometheus text
//! exposition of the simulated pods (cAdvisor / kube-state-metrics names) over HTTP.
//!
//! * [`Clock::LockStep`]: the simulation advances as soon as every target's action for the
//!   current step has arrived ([`SimHandle::submit`]).
//! * [`Clock::WallClock`]: [`run_wall_clock`] advances one step every interval; actions submitted
//!   in between replace each other (the latest wins); targets without an action hold.
//!
//! [`serve_metrics`] exposes `GET /metrics` in the Prometheus text format with
//! `container_cpu_usage_seconds_total`, `container_memory_working_set_bytes`,
//! `container_spec_cpu_quota`, `container_spec_cpu_period`, `container_spec_memory_limit_bytes`,
//! `kube_pod_container_status_restarts_total`, `kube_pod_container_resource_requests`,
//! `kube_pod_container_resource_limits` (per pod; the limit series only for limits the container
//! has), `kube_deployment_status_replicas`,
//! `kube_deployment_status_replicas_available`, `kube_deployment_spec_replicas` (per Deployment)
//! and, per Deployment, the application's request metrics under the names the Prometheus client
//! libraries give them, which the collector's Prometheus source reads: the counter
//! `http_requests_total` (requests received) and the histogram `http_request_duration_seconds`
//! (requests served).

use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::env::{LockStep, Observation, SimEnv, TargetAction, TargetRef};
use crate::error::SimError;

/// How simulated time advances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// Advance when every target's action for the step has arrived.
    LockStep,
    /// Advance every `interval` of real time ([`run_wall_clock`]).
    WallClock {
        /// Real time per step.
        interval: Duration,
    },
}

#[derive(Debug)]
struct Shared {
    lock: LockStep,
    latest: Vec<Option<TargetAction>>,
    clock: Clock,
}

/// Thread-safe handle to a running simulation (clone freely).
#[derive(Debug, Clone)]
pub struct SimHandle {
    inner: Arc<Mutex<Shared>>,
    steps: Arc<watch::Sender<u64>>,
}

impl SimHandle {
    /// Wrap an environment. In wall-clock mode the latency histograms are enabled.
    pub fn new(mut env: SimEnv, clock: Clock) -> Result<Self, SimError> {
        if matches!(clock, Clock::WallClock { .. }) {
            for i in 0..env.len() {
                env.target_mut(i)?.enable_histogram();
            }
        }
        let n = env.len();
        let (tx, _) = watch::channel(env.step_index());
        Ok(SimHandle {
            inner: Arc::new(Mutex::new(Shared {
                lock: LockStep::new(env),
                latest: vec![None; n],
                clock,
            })),
            steps: Arc::new(tx),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Shared>, SimError> {
        self.inner.lock().map_err(|_| SimError::Poisoned)
    }

    /// The clock.
    pub fn clock(&self) -> Result<Clock, SimError> {
        Ok(self.lock()?.clock)
    }

    /// Targets in index order.
    pub fn target_refs(&self) -> Result<Vec<TargetRef>, SimError> {
        Ok(self.lock()?.lock.env().target_refs().to_vec())
    }

    /// Index of the next step.
    pub fn step_index(&self) -> Result<u64, SimError> {
        Ok(self.lock()?.lock.env().step_index())
    }

    /// Latest observation of a target (`name` or `namespace/name`).
    pub fn observe(&self, target: &str) -> Result<Observation, SimError> {
        let g = self.lock()?;
        let i = g.lock.env().index_of(target)?;
        g.lock.env().observe(i)
    }

    /// Latest observations of all targets.
    pub fn observe_all(&self) -> Result<Vec<Observation>, SimError> {
        let g = self.lock()?;
        let env = g.lock.env();
        (0..env.len()).map(|i| env.observe(i)).collect()
    }

    /// The shared cluster's occupancy after the latest step (`None` without a shared cluster).
    pub fn cluster_occupancy(&self) -> Result<Option<crate::nodes::ClusterOccupancy>, SimError> {
        Ok(self.lock()?.lock.env().cluster_occupancy().cloned())
    }

    /// Receive the step counter whenever the simulation advances.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.steps.subscribe()
    }

    /// Submit a target's action for `step` (the value of [`SimHandle::step_index`] when the
    /// decision was made). Lock-step: returns the observations when this was the last missing
    /// action. Wall-clock: records the action for the next tick and returns `None`; actions for
    /// a past step are rejected.
    pub fn submit(
        &self,
        target: &str,
        step: u64,
        action: TargetAction,
    ) -> Result<Option<Vec<Observation>>, SimError> {
        let mut g = self.lock()?;
        let i = g.lock.env().index_of(target)?;
        match g.clock {
            Clock::LockStep => {
                let out = g.lock.submit(i, step, action)?;
                if out.is_some() {
                    let s = g.lock.env().step_index();
                    drop(g);
                    self.steps.send_replace(s);
                }
                Ok(out)
            }
            Clock::WallClock { .. } => {
                let expected = g.lock.env().step_index();
                if step + 1 < expected {
                    return Err(SimError::StepMismatch {
                        target: target.into(),
                        expected,
                        got: step,
                    });
                }
                g.latest[i] = Some(action);
                Ok(None)
            }
        }
    }

    /// Advance one step with the latest submitted actions (missing ones hold).
    pub fn tick(&self) -> Result<Vec<Observation>, SimError> {
        let mut g = self.lock()?;
        let actions: Vec<TargetAction> = g
            .latest
            .iter_mut()
            .map(|a| a.take().unwrap_or(TargetAction::Hold))
            .collect();
        let obs = g.lock.env_mut().step(&actions)?;
        let s = g.lock.env().step_index();
        drop(g);
        self.steps.send_replace(s);
        Ok(obs)
    }

    /// The Prometheus text exposition of the current state.
    pub fn metrics_text(&self) -> Result<String, SimError> {
        Ok(render_metrics(self.lock()?.lock.env()))
    }
}

/// Advance the simulation every `interval` until `shutdown` completes.
pub async fn run_wall_clock(
    handle: SimHandle,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
) -> Result<(), SimError> {
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = ticker.tick() => { handle.tick()?; }
        }
    }
}

/// Serve `GET /metrics` on `listener` until `shutdown` completes.
pub async fn serve_metrics(
    handle: SimHandle,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), SimError> {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let h = handle.clone();
            async move {
                match h.metrics_text() {
                    Ok(body) => (
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        body,
                    )
                        .into_response(),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
                }
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| SimError::Server(e.to_string()))
}

/// Wall-clock mode in one call: tick the simulation every `interval` and serve `GET /metrics` on
/// `listener` until `shutdown` completes.
pub async fn serve_wall_clock(
    handle: SimHandle,
    listener: tokio::net::TcpListener,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
) -> Result<(), SimError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, ?interval, "simulated cluster: serving /metrics in wall-clock mode");
    }
    let (tx, rx) = watch::channel(false);
    let mut rx_server = rx.clone();
    let mut rx_clock = rx;
    let server = serve_metrics(handle.clone(), listener, async move {
        let _ = rx_server.wait_for(|stop| *stop).await;
    });
    let clock = run_wall_clock(handle, interval, async move {
        let _ = rx_clock.wait_for(|stop| *stop).await;
    });
    let stopper = async move {
        shutdown.await;
        let _ = tx.send(true);
    };
    let (server, clock, ()) = tokio::join!(server, clock, stopper);
    server?;
    clock
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Render the Prometheus text exposition of every simulated pod and Deployment.
pub fn render_metrics(env: &SimEnv) -> String {
    let mut s = String::with_capacity(4096);
    let header = |s: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    // `None`: the series does not exist for that pod (cAdvisor has no quota for a container
    // without a CPU limit, no memory limit series without one).
    type PodFn = fn(&crate::cluster::Replica) -> Option<f64>;
    let pod_metrics: [(&str, &str, &str, PodFn); 6] = [
        (
            "container_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed in seconds.",
            |r| Some(r.cpu_seconds_total),
        ),
        (
            "container_memory_working_set_bytes",
            "gauge",
            "Current working set in bytes.",
            |r| Some(r.working_set),
        ),
        (
            "container_spec_cpu_quota",
            "gauge",
            "CPU quota of the container (microseconds per period).",
            |r| r.cpu_limited.then(|| (r.cpu * 100_000.0).round()),
        ),
        (
            "container_spec_cpu_period",
            "gauge",
            "CPU period of the container (microseconds).",
            |r| r.cpu_limited.then_some(100_000.0),
        ),
        (
            "container_spec_memory_limit_bytes",
            "gauge",
            "Memory limit for the container.",
            |r| r.mem_limited.then_some(r.mem),
        ),
        (
            "kube_pod_container_status_restarts_total",
            "counter",
            "The number of container restarts per container.",
            |r| Some(f64::from(r.restarts)),
        ),
    ];
    for (name, kind, help, f) in pod_metrics {
        header(&mut s, name, kind, help);
        for (t, r) in env.targets().iter().zip(env.target_refs()) {
            let (ns, dep) = (esc(&r.namespace), esc(&r.name));
            for p in t.replicas() {
                if let Some(v) = f(p) {
                    let _ = writeln!(
                        s,
                        "{name}{{namespace=\"{ns}\",pod=\"{dep}-{:05}\",container=\"{dep}\"}} {v}",
                        p.id,
                    );
                }
            }
        }
    }
    // kube-state-metrics' per-container requests and limits, with its `resource` and `unit`
    // labels; a limit the container does not have has no series.
    type ResourceFn =
        fn(&crate::cluster::Replica) -> [(&'static str, &'static str, Option<f64>); 2];
    let resource_metrics: [(&str, &str, ResourceFn); 2] = [
        (
            "kube_pod_container_resource_requests",
            "The number of requested request resource by a container.",
            |r| {
                [
                    ("cpu", "core", Some(r.cpu_request)),
                    ("memory", "byte", Some(r.mem_request)),
                ]
            },
        ),
        (
            "kube_pod_container_resource_limits",
            "The number of requested limit resource by a container.",
            |r| {
                [
                    ("cpu", "core", r.cpu_limited.then_some(r.cpu)),
                    ("memory", "byte", r.mem_limited.then_some(r.mem)),
                ]
            },
        ),
    ];
    for (name, help, f) in resource_metrics {
        header(&mut s, name, "gauge", help);
        for (t, r) in env.targets().iter().zip(env.target_refs()) {
            let (ns, dep) = (esc(&r.namespace), esc(&r.name));
            for p in t.replicas() {
                for (resource, unit, v) in f(p) {
                    if let Some(v) = v {
                        let _ = writeln!(
                            s,
                            "{name}{{namespace=\"{ns}\",pod=\"{dep}-{:05}\",container=\"{dep}\",resource=\"{resource}\",unit=\"{unit}\"}} {v}",
                            p.id,
                        );
                    }
                }
            }
        }
    }
    // kube-state-metrics' pod phase (Pending: no node has room; Running otherwise), one series
    // per phase with 1 for the pod's.
    let phase = "kube_pod_status_phase";
    header(&mut s, phase, "gauge", "The pods current phase.");
    for (t, r) in env.targets().iter().zip(env.target_refs()) {
        let (ns, dep) = (esc(&r.namespace), esc(&r.name));
        for p in t.replicas() {
            let pending = p.pending_since.is_some();
            for (name, on) in [("Pending", pending), ("Running", !pending)] {
                let _ = writeln!(
                    s,
                    "{phase}{{namespace=\"{ns}\",pod=\"{dep}-{:05}\",phase=\"{name}\"}} {}",
                    p.id,
                    u8::from(on),
                );
            }
        }
    }
    // The shared cluster's nodes (none without one), as kube-state-metrics has them.
    if !env.nodes().is_empty() {
        let alloc = "kube_node_status_allocatable";
        header(
            &mut s,
            alloc,
            "gauge",
            "The allocatable for different resources of a node that are available for scheduling.",
        );
        for n in env.nodes() {
            let node = esc(&n.name);
            let [cpu_m, mem] = n.allocatable;
            let _ = writeln!(
                s,
                "{alloc}{{node=\"{node}\",resource=\"cpu\",unit=\"core\"}} {}",
                cpu_m as f64 / 1000.0
            );
            let _ = writeln!(
                s,
                "{alloc}{{node=\"{node}\",resource=\"memory\",unit=\"byte\"}} {mem}"
            );
        }
        let cordon = "kube_node_spec_unschedulable";
        header(
            &mut s,
            cordon,
            "gauge",
            "Whether a node can schedule new pods.",
        );
        for n in env.nodes() {
            let _ = writeln!(
                s,
                "{cordon}{{node=\"{}\"}} {}",
                esc(&n.name),
                u8::from(!n.schedulable)
            );
        }
    }
    let now = |t: &crate::cluster::TargetSim| t.now();
    type DepFn = fn(&crate::cluster::TargetSim, f64) -> f64;
    let dep_metrics: [(&str, &str, &str, DepFn); 3] = [
        (
            "kube_deployment_spec_replicas",
            "gauge",
            "Number of desired pods for a deployment.",
            |t, _| f64::from(t.allocation().replicas),
        ),
        (
            "kube_deployment_status_replicas",
            "gauge",
            "The number of replicas per deployment.",
            |t, _| t.replicas().len() as f64,
        ),
        (
            "kube_deployment_status_replicas_available",
            "gauge",
            "The number of available replicas per deployment.",
            |t, now| t.replicas().iter().filter(|r| r.ready_at <= now).count() as f64,
        ),
    ];
    for (name, kind, help, f) in dep_metrics {
        header(&mut s, name, kind, help);
        for (t, r) in env.targets().iter().zip(env.target_refs()) {
            let _ = writeln!(
                s,
                "{name}{{namespace=\"{}\",deployment=\"{}\"}} {}",
                esc(&r.namespace),
                esc(&r.name),
                f(t, now(t))
            );
        }
    }
    let received = "http_requests_total";
    header(
        &mut s,
        received,
        "counter",
        "Requests received (served, failed or still queued).",
    );
    for (t, r) in env.targets().iter().zip(env.target_refs()) {
        if let Some(c) = t.counters() {
            let _ = writeln!(
                s,
                "{received}{{namespace=\"{}\",deployment=\"{}\"}} {}",
                esc(&r.namespace),
                esc(&r.name),
                c.received
            );
        }
    }
    let h = "http_request_duration_seconds";
    header(
        &mut s,
        h,
        "histogram",
        "Latency of successfully served requests.",
    );
    for (t, r) in env.targets().iter().zip(env.target_refs()) {
        let Some(c) = t.counters() else { continue };
        let labels = format!(
            "namespace=\"{}\",deployment=\"{}\"",
            esc(&r.namespace),
            esc(&r.name)
        );
        for (le, v) in c.bucket_bounds.iter().zip(&c.buckets) {
            let _ = writeln!(s, "{h}_bucket{{{labels},le=\"{le}\"}} {v}");
        }
        let _ = writeln!(s, "{h}_bucket{{{labels},le=\"+Inf\"}} {}", c.count);
        let _ = writeln!(s, "{h}_sum{{{labels}}} {}", c.sum);
        let _ = writeln!(s, "{h}_count{{{labels}}} {}", c.count);
    }
    let f = "aware_sim_requests_failed_total";
    header(
        &mut s,
        f,
        "counter",
        "Requests failed by OOM kills or timeouts.",
    );
    for (t, r) in env.targets().iter().zip(env.target_refs()) {
        if let Some(c) = t.counters() {
            let _ = writeln!(
                s,
                "{f}{{namespace=\"{}\",deployment=\"{}\"}} {}",
                esc(&r.namespace),
                esc(&r.name),
                c.failed
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{generate_apps, GeneratorOptions};
    use crate::env::SimConfig;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn env(n: usize) -> SimEnv {
        SimEnv::new(
            generate_apps(n, 5, &GeneratorOptions::default()),
            SimConfig::default(),
        )
        .unwrap()
    }

    #[test]
    fn lock_step_handle_advances_when_all_arrive() {
        let h = SimHandle::new(env(2), Clock::LockStep).unwrap();
        let names: Vec<String> = h
            .target_refs()
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        let mut rx = h.subscribe();
        assert!(h
            .submit(&names[0], 0, TargetAction::Hold)
            .unwrap()
            .is_none());
        assert!(!rx.has_changed().unwrap());
        let obs = h.submit(&names[1], 0, TargetAction::Hold).unwrap().unwrap();
        assert_eq!(obs.len(), 2);
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 1);
        assert_eq!(h.observe(&names[1]).unwrap().step, 0);
        assert!(matches!(h.observe("nope"), Err(SimError::UnknownTarget(_))));
    }

    /// On a shared cluster too small for every replica: each pod's phase (1 for its own, 0 for
    /// the other), the Pending ones those the cluster counts, and each node's allocatable.
    #[test]
    fn exposition_has_pod_phases_and_nodes() {
        let apps = generate_apps(4, 5, &GeneratorOptions::default());
        let cfg = SimConfig {
            cluster: Some(crate::nodes::ClusterConfig::uniform(1, 1_500, 8 << 30)),
            ..SimConfig::default()
        };
        let h = SimHandle::new(
            SimEnv::new(apps, cfg).unwrap(),
            Clock::WallClock {
                interval: Duration::from_secs(1),
            },
        )
        .unwrap();
        h.tick().unwrap();
        let text = h.metrics_text().unwrap();
        let sum = |prefix: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
                .sum()
        };
        let occupancy = h.cluster_occupancy().unwrap().unwrap();
        assert!(occupancy.pending_replicas > 0, "{occupancy:?}");
        let pending = text
            .lines()
            .filter(|l| {
                l.starts_with("kube_pod_status_phase{") && l.contains("phase=\"Pending\"} 1")
            })
            .count();
        assert_eq!(pending as u32, occupancy.pending_replicas);
        let pods = text
            .lines()
            .filter(|l| l.starts_with("container_memory_working_set_bytes{"))
            .count();
        assert_eq!(
            sum("kube_pod_status_phase{"),
            pods as f64,
            "one phase per pod"
        );
        assert_eq!(
            sum("kube_node_status_allocatable{node=\"node-0\",resource=\"cpu\""),
            1.5
        );
        assert_eq!(
            sum("kube_node_status_allocatable{node=\"node-0\",resource=\"memory\""),
            (8u64 << 30) as f64
        );
        assert_eq!(sum("kube_node_spec_unschedulable{node=\"node-0\"}"), 0.0);
        // Without a shared cluster there is no node.
        let h = SimHandle::new(env(1), Clock::LockStep).unwrap();
        assert!(!h.metrics_text().unwrap().contains("kube_node_"));
    }

    #[test]
    fn exposition_has_cadvisor_and_ksm_names() {
        let h = SimHandle::new(
            env(2),
            Clock::WallClock {
                interval: Duration::from_secs(1),
            },
        )
        .unwrap();
        let name = h.target_refs().unwrap()[0].name.clone();
        let r0 = h.observe(&name).unwrap().allocation.replicas;
        h.submit(&name, 0, TargetAction::Raw([1.0, 0.0, 0.0]))
            .unwrap();
        h.tick().unwrap();
        h.tick().unwrap();
        let text = h.metrics_text().unwrap();
        for m in [
            "container_cpu_usage_seconds_total{",
            "container_memory_working_set_bytes{",
            "container_spec_memory_limit_bytes{",
            "kube_deployment_status_replicas{",
            "http_requests_total{",
            "http_request_duration_seconds_bucket{",
            "http_request_duration_seconds_count{",
            "le=\"+Inf\"",
        ] {
            assert!(text.contains(m), "missing {m}");
        }
        // every pod has its requests; a CPU quota and limit only without a latency objective
        // (the default limits policy drops the CPU limit of a latency-sensitive app)
        let apps = generate_apps(2, 5, &GeneratorOptions::default());
        let mut kinds = std::collections::HashSet::new();
        for (app, r) in apps.iter().zip(h.target_refs().unwrap()) {
            let pod = format!("{{namespace=\"sim\",pod=\"{}-", r.name);
            let series = |metric: &str, extra: &str| {
                text.lines()
                    .filter(|l| l.starts_with(&format!("{metric}{pod}")) && l.contains(extra))
                    .count()
            };
            let pods = series("container_memory_working_set_bytes", "");
            assert!(pods > 0);
            for resource in [
                "resource=\"cpu\",unit=\"core\"",
                "resource=\"memory\",unit=\"byte\"",
            ] {
                assert_eq!(
                    series("kube_pod_container_resource_requests", resource),
                    pods
                );
            }
            let limited = !app.slo.latency_sensitive();
            kinds.insert(limited);
            let cpu_limits = if limited { pods } else { 0 };
            assert_eq!(
                series("container_spec_cpu_quota", ""),
                cpu_limits,
                "{}",
                r.name
            );
            assert_eq!(
                series("kube_pod_container_resource_limits", "resource=\"cpu\""),
                cpu_limits
            );
            assert_eq!(
                series("kube_pod_container_resource_limits", "resource=\"memory\""),
                pods
            );
        }
        assert!(
            kinds.contains(&false),
            "no latency-sensitive app in the sample"
        );
        // the first target scaled up by 4 replicas
        assert!(text.contains(&format!(
            "kube_deployment_spec_replicas{{namespace=\"sim\",deployment=\"{name}\"}} {}",
            (r0 + 4).min(20)
        )));
        // every sample line parses as `name{labels} value`
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "{line}");
        }
        assert_eq!(h.step_index().unwrap(), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn serve_wall_clock_ticks_and_stops() {
        let h = SimHandle::new(
            env(1),
            Clock::WallClock {
                interval: Duration::from_millis(5),
            },
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut rx = h.subscribe();
        let task = tokio::spawn(serve_wall_clock(
            h.clone(),
            listener,
            Duration::from_millis(5),
            async move {
                for _ in 0..3 {
                    let _ = rx.changed().await;
                }
            },
        ));
        task.await.unwrap().unwrap();
        assert!(h.step_index().unwrap() >= 3);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn http_metrics_endpoint_and_wall_clock() {
        let h = SimHandle::new(
            env(1),
            Clock::WallClock {
                interval: Duration::from_millis(10),
            },
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (stop2_tx, stop2_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_metrics(h.clone(), listener, async {
            let _ = stop_rx.await;
        }));
        let clock = tokio::spawn(run_wall_clock(
            h.clone(),
            Duration::from_millis(10),
            async {
                let _ = stop2_rx.await;
            },
        ));
        let mut rx = h.subscribe();
        rx.changed().await.unwrap();
        rx.changed().await.unwrap();
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        conn.read_to_string(&mut body).await.unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("container_cpu_usage_seconds_total"));
        let _ = stop_tx.send(());
        let _ = stop2_tx.send(());
        server.await.unwrap().unwrap();
        clock.await.unwrap().unwrap();
        assert!(h.step_index().unwrap() >= 2);
    }
}
