//! The per-app cluster model: replicas with CPU and memory requests and limits serving a chain of
//! segments.
//!
//! The allocation is the requests (what the scheduler packs and the user pays for); the limits
//! follow from them by the target's [`LimitsPolicy`] (`aware_mdp`), from the app's initial
//! allocation as the pod template's requests and limits (a Guaranteed container: ratio 1:1). A
//! replica may use, in CPU, its CPU limit when it has one (the CFS quota throttles it there),
//! else its request plus the node's burst headroom ([`NodeShare::burst_headroom`], a share of
//! the request; docs/adr/0013-requests-limits-and-burst.md); in memory, its memory limit (else
//! the same headroom) before it is OOM-killed. With the default policy limits equal requests.
//!
//! One control step of Δt seconds is computed in closed form (no per-request events):
//!
//! 1. **Capacity.** Replica i contributes `f_i · c_i` cores, where `f_i` is the fraction of the
//!    step it is ready (new and restarting replicas become ready after the app's cold start) and
//!    `c_i` the CPU it may use (time-averaged over a pending rolling restart). With per-request CPU
//!    demand `D` core-seconds (segment sum × a per-step log-normal noise factor), the service
//!    rate is `μ = Σ f_i c_i / D` requests/s.
//! 2. **Fluid queue.** Arrivals `A` (from the load) join the backlog `B₀` carried over from the
//!    previous step; `min(B₀ + A, μΔt)` are served, the rest is the new backlog `B₁`. Requests that
//!    would wait longer than the app's timeout are dropped (failed).
//! 3. **Latency.** Per replica, an M/M/m processor-sharing approximation (Sakasegawa) with
//!    `m = c / parallelism` servers: service time `s = Σ D_seg / min(c, par_seg)`, waiting
//!    `W = s·ρ^(√(2(m+1))−1) / (m(1−ρ))`, ρ capped at 0.98 (overload shows up as backlog), plus
//!    off-CPU time (disk/network/sleep, inflated by I/O contention) and the backlog delay, which
//!    for requests of this step ranges from `B₀/μ` to `B₁/μ`. p50 = s + w + 0.69·W + median
//!    backlog delay; p99 = (s + w)(1 + 2.33·cv) + 4.6·W + 99th-percentile backlog delay; capped at
//!    the timeout; if more than 1% of the step's requests failed p99 is the timeout.
//! 4. **Memory.** Working set per ready replica = base + per-request × in-flight requests
//!    (Little's law: throughput × mean latency / ready replicas) with 3% noise. A replica whose
//!    working set exceeds its limit is OOM-killed: its in-flight requests fail and it restarts,
//!    ready again after the cold start (plus Kubernetes' CrashLoopBackOff of 10 s, 20 s, … 300 s
//!    from the second consecutive crash). A replica whose base alone exceeds its limit crash-loops.
//! 5. **Utilization.** CPU = usage / Σ requests of all replicas (ready or not), as the HPA reads
//!    it; memory = working set / Σ requests; I/O and network = bytes moved / per-replica
//!    bandwidth. All in [0, 1] (usage above the requests, which a burst allows, counts as 1).
//!
//! Noise comes from a ChaCha8 stream per target that is re-positioned at every step, so the
//! noise of step t depends only on (seed, target, t), not on the actions taken: two allocations
//! can be compared on identical randomness (common random numbers), which the oracle relies on.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

pub use aware_mdp::{slo_preservation, utilization};
use aware_mdp::{ContainerResources, LimitsPolicy, RawMetrics};

use crate::app::{Allocation, AppSpec, VerticalMode};
use crate::error::SimError;
use crate::load::{sample_arrivals, LoadModel};

const RHO_MAX: f64 = 0.98;
/// Memory held by a request waiting in a replica's accept queue, bytes.
const QUEUED_REQUEST_BYTES: f64 = 64.0 * 1024.0;
/// Seconds a replica keeps serving after its working set crosses the limit before the kill.
const OOM_FILL_S: f64 = 1.0;
const RUNTIME_BASE_BYTES: f64 = 48.0 * 1024.0 * 1024.0;
const CONTAINER_START_S: f64 = 1.0;
/// Words of the ChaCha stream reserved per step (draws beyond wrap into the next step's words,
/// which is harmless but never happens with the current model).
const WORDS_PER_STEP: u128 = 256;

/// What a replica gets of its node beyond its own allocation: per-replica bandwidths (I/O and
/// network utilization) and the burst headroom of a replica without a limit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NodeShare {
    /// Disk bandwidth per replica, bytes/s.
    pub io_bytes_per_s: f64,
    /// Network bandwidth per replica, bytes/s.
    pub net_bytes_per_s: f64,
    /// What a replica without a CPU (memory) limit may use above its request, as a share of the
    /// request: it can use `request × (1 + burst_headroom)` cores (bytes before an OOM kill).
    /// The default 0 credits nothing beyond the request: a node packed by requests — what an
    /// autoscaler that cuts requests produces — has no idle CPU to lend, and the simulator has
    /// no neighbours to measure it from; set it to the idle share your nodes keep
    /// (docs/adr/0013-requests-limits-and-burst.md). Finite, at least 0.
    #[serde(default)]
    pub burst_headroom: f64,
}

impl Default for NodeShare {
    fn default() -> Self {
        NodeShare {
            io_bytes_per_s: 100.0e6,
            net_bytes_per_s: 125.0e6,
            burst_headroom: 0.0,
        }
    }
}

/// What one replica runs with: its requests, and what it may use (its limits, or without one
/// its request plus the node's burst headroom).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizing {
    /// CPU request, cores.
    pub cpu_request: f64,
    /// CPU it may use, cores: its CPU limit, else `cpu_request × (1 + burst_headroom)`.
    pub cpu: f64,
    /// Memory request, bytes.
    pub mem_request: f64,
    /// Working set at which it is OOM-killed, bytes: its memory limit, else
    /// `mem_request × (1 + burst_headroom)`.
    pub mem: f64,
    /// `cpu` is a CPU limit (the container has one).
    pub cpu_limited: bool,
    /// `mem` is a memory limit (the container has one).
    pub mem_limited: bool,
}

/// Aggregated per-request costs of an app's segment chain.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AppModel {
    /// CPU demand per request, core-seconds.
    pub cpu_seconds: f64,
    seg_cpu: [f64; 3],
    seg_par: [f64; 3],
    /// Effective parallelism of one request (D / Σ D_i/par_i).
    pub parallelism: f64,
    /// Off-CPU time per request at no contention, seconds.
    pub wait_seconds: f64,
    /// Base memory per replica, bytes.
    pub mem_base_bytes: f64,
    /// Memory per in-flight request, bytes.
    pub mem_per_request_bytes: f64,
    /// Disk bytes per request.
    pub io_bytes: f64,
    /// Network bytes per request (incl. 2 KiB request/response).
    pub net_bytes: f64,
    /// Time from (re)start to ready, seconds.
    pub cold_start_seconds: f64,
    /// Coefficient of variation of per-request latency.
    pub cv: f64,
}

impl AppModel {
    /// Aggregate the segments of an app.
    pub fn from_app(app: &AppSpec) -> Self {
        let mut m = AppModel {
            cpu_seconds: 0.0,
            seg_cpu: [0.0; 3],
            seg_par: [1.0; 3],
            parallelism: 1.0,
            wait_seconds: 0.0,
            mem_base_bytes: RUNTIME_BASE_BYTES,
            mem_per_request_bytes: 0.0,
            io_bytes: 0.0,
            net_bytes: 2048.0,
            cold_start_seconds: CONTAINER_START_S,
            cv: 0.0,
        };
        let mut var = 0.0;
        let mut cold: f64 = 0.0;
        let mut par_den = 0.0;
        for (i, s) in app.segments.iter().take(3).enumerate() {
            let c = s.kind.cost(s.payload);
            m.seg_cpu[i] = c.cpu_seconds;
            m.seg_par[i] = c.parallelism;
            m.cpu_seconds += c.cpu_seconds;
            par_den += c.cpu_seconds / c.parallelism;
            m.wait_seconds += c.wait_seconds;
            m.mem_base_bytes += c.mem_base_bytes;
            m.mem_per_request_bytes += c.mem_per_request_bytes;
            m.io_bytes += c.io_bytes;
            m.net_bytes += c.net_bytes;
            cold = cold.max(c.cold_start_seconds);
            var += (c.noise_cv * (c.cpu_seconds + c.wait_seconds)).powi(2);
        }
        m.parallelism = if par_den > 0.0 {
            m.cpu_seconds / par_den
        } else {
            1.0
        };
        m.cold_start_seconds += cold;
        let total = m.cpu_seconds + m.wait_seconds;
        m.cv = if total > 0.0 { var.sqrt() / total } else { 0.0 };
        m
    }

    /// CPU part of the service time of one request on a replica with `cores` cores.
    #[inline]
    pub fn cpu_service_time(&self, cores: f64) -> f64 {
        let mut s = 0.0;
        for i in 0..3 {
            if self.seg_cpu[i] > 0.0 {
                s += self.seg_cpu[i] / cores.min(self.seg_par[i]).max(1e-6);
            }
        }
        s
    }

    /// Requests/s one replica with `cores` cores can serve.
    pub fn replica_capacity_rps(&self, cores: f64) -> f64 {
        cores / self.cpu_seconds.max(1e-12)
    }
}

/// One replica (pod).
#[derive(Debug, Clone, PartialEq)]
pub struct Replica {
    /// Pod ordinal (unique per target; a rolling restart creates a new ordinal).
    pub id: u64,
    /// Time at which it is (or was) ready.
    pub ready_at: f64,
    /// CPU it may use, cores (its CPU limit, or its request plus the burst headroom).
    pub cpu: f64,
    /// Working set at which it is OOM-killed, bytes (its memory limit, or its request plus the
    /// burst headroom).
    pub mem: f64,
    /// CPU request, cores.
    pub cpu_request: f64,
    /// Memory request, bytes.
    pub mem_request: f64,
    /// `cpu` is a CPU limit (the container has one); else the request plus the headroom.
    pub cpu_limited: bool,
    /// `mem` is a memory limit (the container has one).
    pub mem_limited: bool,
    /// Pending rolling restart: (the new pod's sizing, time it is ready).
    pub pending: Option<(Sizing, f64)>,
    /// Cumulative CPU seconds used (for `container_cpu_usage_seconds_total`).
    pub cpu_seconds_total: f64,
    /// Last working set, bytes.
    pub working_set: f64,
    /// Container restarts (OOM kills).
    pub restarts: u32,
    /// Consecutive crashes without a clean step in between (drives CrashLoopBackOff).
    pub crash_streak: u32,
    /// Node it is bound to in a shared cluster ([`crate::nodes`], index into its nodes); `None`
    /// without a shared cluster, and while Pending.
    pub node: Option<usize>,
    /// In a shared cluster, when it became Pending (no node fitted its requests); `None` when
    /// bound, and without a shared cluster. A Pending replica is not ready and serves nothing;
    /// its `ready_at` is +∞ until it is bound (then ready after the cold start).
    pub pending_since: Option<f64>,
    /// CPU above its request it may use in this step, cores: its share of its node's
    /// unrequested CPU ([`crate::nodes`]); +∞ without a shared cluster or without contention
    /// (then only its limit, or the burst headroom, bounds it).
    pub burst_cap: f64,
    /// A vertical change its node had no room for: the sizing it waits for (Kubernetes'
    /// Deferred in-place resize; in `restart` mode the rolling update's new pod waits). Retried
    /// at every step, cleared by the next vertical change.
    pub deferred: Option<Sizing>,
    /// What it holds on its node: [CPU millicores, memory bytes] (its requests, or during a
    /// rolling restart the larger of the old and the new pod's).
    pub(crate) reserved: [u64; 2],
    /// The sizing its node admitted (what a deferred in-place resize reverts to).
    pub(crate) admitted: Option<Sizing>,
}

/// What the simulator reports for one target and step: the measurements a metrics collector
/// would read ([`SimMetrics::raw`]) plus what only a simulator knows (backlog, failed requests,
/// the step's SLO preservation and violation). Its fields, names and order are the `metrics` of
/// `aware sim`'s JSON lines; latencies are plain numbers (+∞ when nothing was served).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct SimMetrics {
    /// Step index (the step these metrics describe).
    pub step: u64,
    /// Simulated time at the end of the step, seconds.
    pub time_s: f64,
    /// CPU per replica of the current allocation (the request), cores. (Named after the
    /// `obs` field it fills, where the allocation in force was the limit before requests were.)
    pub cpu_limit_cores: f64,
    /// Memory per replica of the current allocation (the request), bytes.
    pub memory_limit_bytes: f64,
    /// CPU used, cores (all replicas).
    pub cpu_usage_cores: f64,
    /// Working set, bytes (all replicas).
    pub memory_working_set_bytes: f64,
    /// CPU usage / Σ CPU requests.
    pub cpu_util: f64,
    /// Working set / Σ memory requests.
    pub memory_util: f64,
    /// Disk bandwidth used / available.
    pub io_util: f64,
    /// Network bandwidth used / available.
    pub network_util: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th-percentile latency, ms.
    pub p99_ms: f64,
    /// Successfully served requests/s.
    pub throughput_rps: f64,
    /// Arrivals/s offered by the load.
    pub offered_rps: f64,
    /// Replicas (desired).
    pub replicas: u32,
    /// Replicas ready at the end of the step.
    pub ready_replicas: u32,
    /// OOM kills in this step.
    pub oom_kills: u32,
    /// Requests failed (OOM, timeout) in this step.
    pub failed_requests: f64,
    /// Requests queued at the end of the step.
    pub backlog: f64,
    /// SLO preservation SP = min(SLO/measured, 1) (with no SLO: the share of the offered load
    /// served).
    pub slo_preservation: f64,
    /// p99 > latency SLO, or throughput < min(throughput SLO, offered).
    pub slo_violation: bool,
    /// Replicas Pending through the step in a shared cluster (no node fitted their requests):
    /// counted in `replicas`, never ready. Absent from the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pending_replicas: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl SimMetrics {
    /// The measurements as a metrics collector reads them (the `obs` message's `metrics`):
    /// latencies that are not finite (nothing served) are unknown.
    pub fn raw(&self) -> RawMetrics {
        let finite = |x: f64| x.is_finite().then_some(x);
        RawMetrics {
            replicas: self.replicas,
            ready_replicas: self.ready_replicas,
            cpu_limit_cores: self.cpu_limit_cores,
            memory_limit_bytes: self.memory_limit_bytes,
            cpu_usage_cores: self.cpu_usage_cores,
            memory_working_set_bytes: self.memory_working_set_bytes,
            cpu_util: self.cpu_util,
            memory_util: self.memory_util,
            io_util: self.io_util,
            network_util: self.network_util,
            request_rate_rps: self.offered_rps,
            throughput_rps: self.throughput_rps,
            latency_p50_ms: finite(self.p50_ms),
            latency_p99_ms: finite(self.p99_ms),
            oom_kills: self.oom_kills,
            // The count in force is the allocation's, which the caller knows
            // (`env::Observation::allocation`); these metrics are the pods'.
            spec_replicas: None,
            // Pending is only read with a shared cluster, which the caller knows
            // (`SimEnv::cluster_occupancy`); `pending_replicas` here is 0 without one.
            pending_replicas: None,
        }
    }
}

/// Cumulative counters for the Prometheus exposition.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Counters {
    /// Histogram bucket upper bounds, seconds.
    pub bucket_bounds: Vec<f64>,
    /// Cumulative counts per bucket (same length as bounds), + the +Inf count in `count`.
    pub buckets: Vec<f64>,
    /// Number of requests observed.
    pub count: f64,
    /// Sum of latencies, seconds.
    pub sum: f64,
    /// Failed requests.
    pub failed: f64,
    /// Requests received (the offered arrivals, served or not).
    pub received: f64,
}

/// Standard bucket bounds of the request-latency histogram, seconds.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// The simulated Deployment of one app.
#[derive(Debug, Clone)]
pub struct TargetSim {
    app: Arc<AppSpec>,
    model: AppModel,
    load: Arc<LoadModel>,
    load_seed: u64,
    load_multiplier: f64,
    share: NodeShare,
    rng: ChaCha8Rng,
    load_rng: ChaCha8Rng,
    dt: f64,
    now: f64,
    step: u64,
    alloc: Allocation,
    /// How the limits follow the allocation, and the pod template's requests and limits they
    /// follow from (the initial allocation, requests equal to limits).
    limits: LimitsPolicy,
    template: ContainerResources,
    replicas: Vec<Replica>,
    backlog: f64,
    next_id: u64,
    last: SimMetrics,
    prev_offered: Option<f64>,
    histogram: Option<Box<Counters>>,
    scratch: Vec<ReplicaStep>,
}

impl TargetSim {
    /// Build a target; `seed` and `index` select its noise streams. All replicas start ready.
    pub fn new(
        app: Arc<AppSpec>,
        load: Arc<LoadModel>,
        dt: f64,
        seed: u64,
        index: u64,
        share: NodeShare,
    ) -> Result<Self, SimError> {
        app.validate()?;
        if !(dt.is_finite() && dt > 0.0) {
            return Err(SimError::Config(format!(
                "step length must be > 0 s, got {dt}"
            )));
        }
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&index.to_le_bytes());
        let mut rng = ChaCha8Rng::from_seed(key);
        rng.set_stream(0);
        let mut load_rng = ChaCha8Rng::from_seed(key);
        load_rng.set_stream(1);
        let model = AppModel::from_app(&app);
        let (alloc, _) = app.bounds.clamp(app.initial);
        let mut t = TargetSim {
            model,
            load,
            load_seed: seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            load_multiplier: 1.0,
            share,
            rng,
            load_rng,
            dt,
            now: 0.0,
            step: 0,
            alloc,
            limits: LimitsPolicy::default(),
            template: ContainerResources::guaranteed(&alloc),
            replicas: Vec::with_capacity(alloc.replicas as usize),
            backlog: 0.0,
            next_id: 0,
            last: SimMetrics::default(),
            prev_offered: None,
            histogram: None,
            scratch: Vec::with_capacity(alloc.replicas as usize),
            app,
        };
        if !(share.burst_headroom.is_finite() && share.burst_headroom >= 0.0) {
            return Err(SimError::Config(format!(
                "burst_headroom must be finite and at least 0, got {}",
                share.burst_headroom
            )));
        }
        let (alloc, sizing) = t.sized(alloc);
        t.alloc = alloc;
        for _ in 0..alloc.replicas {
            let r = t.new_replica(f64::NEG_INFINITY, sizing);
            t.replicas.push(r);
        }
        t.last = t.idle_metrics();
        Ok(t)
    }

    /// The limits policy of the target (before its first step: the default until then, limits
    /// equal to requests). Resizes the replicas in place to the current allocation under it.
    pub fn set_limits_policy(&mut self, policy: LimitsPolicy) {
        self.limits = policy;
        let (alloc, sizing) = self.sized(self.alloc);
        self.alloc = alloc;
        for r in &mut self.replicas {
            r.resize(sizing);
        }
        if self.step == 0 {
            self.last = self.idle_metrics();
        }
    }

    /// The limits policy of the target.
    pub fn limits_policy(&self) -> LimitsPolicy {
        self.limits
    }

    /// The requests `a` resolves to under the limits policy (each request at most the limit the
    /// policy keeps), and the sizing of a replica running them.
    pub fn sized(&self, a: Allocation) -> (Allocation, Sizing) {
        let r = self
            .limits
            .resolve(a, &self.template, self.app.slo.latency_sensitive());
        let req = r.requests;
        let burst = 1.0 + self.share.burst_headroom;
        let cpu_request = req.cpu_millicores as f64 / 1000.0;
        let mem_request = req.memory_bytes as f64;
        let sizing = Sizing {
            cpu_request,
            cpu: match r.limits.cpu_millicores {
                Some(l) => l as f64 / 1000.0,
                None => cpu_request * burst,
            },
            mem_request,
            mem: match r.limits.memory_bytes {
                Some(l) => l as f64,
                None => mem_request * burst,
            },
            cpu_limited: r.limits.cpu_millicores.is_some(),
            mem_limited: r.limits.memory_bytes.is_some(),
        };
        (req, sizing)
    }

    fn new_replica(&mut self, ready_at: f64, s: Sizing) -> Replica {
        self.next_id += 1;
        Replica {
            id: self.next_id,
            ready_at,
            cpu: s.cpu,
            mem: s.mem,
            cpu_request: s.cpu_request,
            mem_request: s.mem_request,
            cpu_limited: s.cpu_limited,
            mem_limited: s.mem_limited,
            pending: None,
            cpu_seconds_total: 0.0,
            working_set: 0.0,
            restarts: 0,
            crash_streak: 0,
            node: None,
            pending_since: None,
            burst_cap: f64::INFINITY,
            deferred: None,
            reserved: [0, 0],
            admitted: None,
        }
    }

    fn idle_metrics(&self) -> SimMetrics {
        SimMetrics {
            step: 0,
            time_s: self.now,
            cpu_limit_cores: self.alloc.cpu_millicores as f64 / 1000.0,
            memory_limit_bytes: self.alloc.memory_bytes as f64,
            replicas: self.replicas.len() as u32,
            ready_replicas: self
                .replicas
                .iter()
                .filter(|r| r.ready_at <= self.now)
                .count() as u32,
            slo_preservation: 1.0,
            pending_replicas: self
                .replicas
                .iter()
                .filter(|r| r.pending_since.is_some())
                .count() as u32,
            ..SimMetrics::default()
        }
    }

    /// The Deployment is deleted (an app leaving the cluster, or not yet created): no replica
    /// is left, the queue is dropped, and nothing is placed or served until [`Self::arrive`].
    pub fn vacate(&mut self) {
        self.replicas.clear();
        self.backlog = 0.0;
        self.prev_offered = None;
        self.last = SimMetrics {
            step: self.last.step,
            time_s: self.now,
            ..self.idle_metrics()
        };
    }

    /// Whether the Deployment has no replica ([`Self::vacate`]d).
    pub fn is_vacant(&self) -> bool {
        self.replicas.is_empty()
    }

    /// A step without the Deployment: its clock and noise streams move on (they are keyed by
    /// the step), nothing is simulated.
    pub fn tick_vacant(&mut self) {
        self.now += self.dt;
        self.last.step = self.step;
        self.last.time_s = self.now;
        self.step += 1;
    }

    /// The Deployment is created now with the app's initial allocation: every replica is new,
    /// ready after the cold start (on a shared cluster: once it is bound), the queue empty.
    pub fn arrive(&mut self) {
        let (alloc, _) = self.app.bounds.clamp(self.app.initial);
        let (alloc, sizing) = self.sized(alloc);
        self.alloc = alloc;
        self.backlog = 0.0;
        self.prev_offered = None;
        let ready = self.now + self.model.cold_start_seconds;
        self.replicas.clear();
        for _ in 0..alloc.replicas {
            let r = self.new_replica(ready, sizing);
            self.replicas.push(r);
        }
        self.last = SimMetrics {
            step: self.last.step,
            ..self.idle_metrics()
        };
    }

    /// Before the first step: recompute the idle metrics (after a shared cluster's initial
    /// placement left some replicas Pending).
    pub(crate) fn refresh_idle_metrics(&mut self) {
        if self.step == 0 {
            self.last = self.idle_metrics();
        }
    }

    /// Record the latency histogram (wall-clock mode; costs ~0.3 µs per step).
    pub fn enable_histogram(&mut self) {
        self.histogram = Some(Box::new(Counters {
            bucket_bounds: LATENCY_BUCKETS.to_vec(),
            buckets: vec![0.0; LATENCY_BUCKETS.len()],
            ..Counters::default()
        }));
    }

    /// The app.
    pub fn app(&self) -> &AppSpec {
        &self.app
    }
    /// The aggregated cost model.
    pub fn model(&self) -> &AppModel {
        &self.model
    }
    /// Current allocation.
    pub fn allocation(&self) -> Allocation {
        self.alloc
    }
    /// Replicas.
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }
    /// Next step index.
    pub fn step_index(&self) -> u64 {
        self.step
    }
    /// Simulated time, seconds.
    pub fn now(&self) -> f64 {
        self.now
    }
    /// Step length, seconds.
    pub fn dt(&self) -> f64 {
        self.dt
    }
    /// Metrics of the last step.
    pub fn last_metrics(&self) -> &SimMetrics {
        &self.last
    }
    /// Offered rate of the previous step (for the load-change state feature).
    pub fn prev_offered(&self) -> Option<f64> {
        self.prev_offered
    }
    /// Histogram counters, when enabled.
    pub fn counters(&self) -> Option<&Counters> {
        self.histogram.as_deref()
    }
    /// Current load multiplier (instability scenarios).
    pub fn load_multiplier(&self) -> f64 {
        self.load_multiplier
    }
    /// Set the load multiplier.
    pub fn set_load_multiplier(&mut self, m: f64) {
        self.load_multiplier = if m.is_finite() && m >= 0.0 { m } else { 1.0 };
    }
    /// Replace the app's segment payloads (instability scenarios); rebuilds the cost model.
    pub fn set_app(&mut self, app: AppSpec) -> Result<(), SimError> {
        app.validate()?;
        self.model = AppModel::from_app(&app);
        self.app = Arc::new(app);
        Ok(())
    }

    /// Capacity of the app at its largest allocation, requests/s.
    pub fn max_capacity_rps(&self) -> f64 {
        let b = self.app.bounds;
        b.max_replicas as f64
            * self
                .model
                .replica_capacity_rps(b.max_cpu_millicores as f64 / 1000.0)
    }

    /// Apply a desired allocation (the requests, already within bounds) at the start of the next
    /// step, with the limits the policy derives from it; a request above a limit the policy keeps
    /// is lowered to it, as the actuator does.
    pub fn apply(&mut self, desired: Allocation) {
        let t0 = self.now;
        let cold = self.model.cold_start_seconds;
        let (desired, sizing) = self.sized(desired);
        let vertical_changed = desired.cpu_millicores != self.alloc.cpu_millicores
            || desired.memory_bytes != self.alloc.memory_bytes;
        // horizontal
        let want = desired.replicas as usize;
        if want < self.replicas.len() {
            // delete the least-ready pods first (Kubernetes prefers unready pods)
            self.replicas
                .sort_by(|a, b| a.ready_at.total_cmp(&b.ready_at).then(a.id.cmp(&b.id)));
            self.replicas.truncate(want);
        }
        if vertical_changed {
            for r in &mut self.replicas {
                r.deferred = None;
            }
            match self.app.vertical {
                VerticalMode::InPlace => {
                    for r in &mut self.replicas {
                        r.resize(sizing);
                        r.pending = None;
                    }
                }
                VerticalMode::Restart => {
                    for r in &mut self.replicas {
                        if r.pending_since.is_some() {
                            // Pending (not started): its pod is simply created with the new spec
                            r.resize(sizing);
                            r.pending = None;
                        } else if r.ready_at > t0 {
                            // not serving yet: just restart it with the new spec
                            r.resize(sizing);
                            r.ready_at = t0 + cold;
                            r.pending = None;
                        } else {
                            r.pending = Some((sizing, t0 + cold));
                        }
                    }
                }
            }
        }
        while self.replicas.len() < want {
            let r = self.new_replica(t0 + cold, sizing);
            self.replicas.push(r);
        }
        self.alloc = desired;
    }

    /// Offered arrivals for the coming step: (arrivals, mean offered rps). Depends only on
    /// (seed, target, step), never on actions.
    pub fn arrivals_for_step(&mut self) -> (f64, f64) {
        let rate = self.load.mean_rate(self.now, self.dt, self.load_seed) * self.load_multiplier;
        self.load_rng
            .set_word_pos(self.step as u128 * WORDS_PER_STEP);
        let a = sample_arrivals(rate, self.dt, self.app.load.poisson, &mut self.load_rng);
        (a, rate)
    }

    /// Advance one step with the current allocation and the load's arrivals.
    pub fn advance(&mut self) -> SimMetrics {
        let (arrivals, _) = self.arrivals_for_step();
        self.advance_with(arrivals)
    }

    /// Advance one step with an explicit number of arrivals in the step.
    pub fn advance_with(&mut self, arrivals: f64) -> SimMetrics {
        let arrivals = if arrivals.is_finite() {
            arrivals.max(0.0)
        } else {
            0.0
        };
        let dt = self.dt;
        let t0 = self.now;
        let t1 = t0 + dt;
        let m = self.model;

        self.rng.set_word_pos(self.step as u128 * WORDS_PER_STEP);
        let z_demand: f64 = self.rng.sample(StandardNormal);
        let z_mem: f64 = self.rng.sample(StandardNormal);
        let sigma = 0.3 * m.cv + 0.02;
        let eta = (sigma * z_demand - 0.5 * sigma * sigma).exp();
        let demand = m.cpu_seconds * eta;
        let mem_noise = (1.0 + 0.03 * z_mem).max(0.5);

        // 1. capacity of every replica over the step
        self.scratch.clear();
        let mut alloc_cores = 0.0;
        let mut alloc_mem = 0.0;
        for r in &mut self.replicas {
            if let Some((sizing, at)) = r.pending {
                if at <= t0 {
                    // the rolling restart finished: the new pod replaced the old one
                    self.next_id += 1;
                    r.id = self.next_id;
                    r.resize(sizing);
                    r.pending = None;
                    r.cpu_seconds_total = 0.0;
                    r.restarts = 0;
                    r.crash_streak = 0;
                }
            }
            let start = r.ready_at.max(t0);
            let f = ((t1 - start) / dt).clamp(0.0, 1.0);
            // what it may use: its limit (or burst headroom), within its share of the node's
            // unrequested CPU in a shared cluster (+∞ otherwise: exactly `cpu`)
            let cpu_old = r.cpu.min(r.cpu_request + r.burst_cap);
            let (c_avg, c_end, mem_end, req_avg, mem_req_end) = match r.pending {
                Some((n, at)) if at < t1 => {
                    let w = (t1 - at) / dt;
                    let cpu_new = n.cpu.min(n.cpu_request + r.burst_cap);
                    (
                        cpu_old * (1.0 - w) + cpu_new * w,
                        cpu_new,
                        n.mem,
                        r.cpu_request * (1.0 - w) + n.cpu_request * w,
                        n.mem_request,
                    )
                }
                _ => (cpu_old, cpu_old, r.mem, r.cpu_request, r.mem_request),
            };
            alloc_cores += req_avg;
            alloc_mem += mem_req_end;
            self.scratch.push(ReplicaStep {
                f,
                c_avg,
                c_end,
                mem: mem_end,
                serving: r.ready_at < t1,
                running: r.pending_since.is_none(),
                killed: false,
            });
        }

        // 2.–3. queue and latency with every replica serving
        let b0 = self.backlog;
        let mut pass = self.serve(arrivals, b0, demand, eta);

        // 4. memory: OOM kills are decided on the first pass; killed replicas stop serving
        //    OOM_FILL_S after they start serving in this step and restart with the cold start
        let ws_ready = (m.mem_base_bytes
            + m.mem_per_request_bytes * pass.inflight_per_replica
            + QUEUED_REQUEST_BYTES * pass.queued_per_replica)
            * mem_noise;
        let ws_starting = m.mem_base_bytes * 0.6 * mem_noise;
        let base_now = m.mem_base_bytes * mem_noise;
        let mut any_serving_killed = 0u32;
        for s in &mut self.scratch {
            if (s.serving && ws_ready > s.mem) || (!s.serving && s.running && base_now > s.mem) {
                s.killed = true;
                if s.serving {
                    any_serving_killed += 1;
                    s.f = s.f.min(OOM_FILL_S / dt);
                }
            }
        }
        let mut failed = 0.0;
        if any_serving_killed > 0 {
            let inflight = pass.inflight_per_replica;
            pass = self.serve(arrivals, b0, demand, eta);
            failed = inflight * any_serving_killed as f64;
        }
        let cold = m.cold_start_seconds;
        let mut oom = 0u32;
        let mut ws_total = 0.0;
        let mut ready_end = 0u32;
        let usage_cores = pass.served * demand / dt;
        let cap_cores = pass.cap_cores;
        for (r, s) in self.replicas.iter_mut().zip(self.scratch.iter()) {
            if s.killed {
                oom += 1;
                r.restarts += 1;
                r.crash_streak += 1;
                r.ready_at = t1 + cold + crash_backoff(r.crash_streak);
                // the restarted container is loading again: cAdvisor sees its small working set
                r.working_set = ws_starting.min(s.mem);
            } else {
                if s.serving && s.f >= 1.0 {
                    // a clean full step: the kubelet's back-off is forgotten (simplified from
                    // Kubernetes' 10 minutes of running)
                    r.crash_streak = 0;
                }
                r.working_set = if s.serving {
                    ws_ready
                } else if s.running {
                    ws_starting
                } else {
                    // Pending: no container
                    0.0
                }
                .min(s.mem);
            }
            ws_total += r.working_set;
            if cap_cores > 0.0 {
                r.cpu_seconds_total += usage_cores * dt * (s.f * s.c_avg) / cap_cores;
            }
            if r.ready_at <= t1 {
                ready_end += 1;
            }
        }
        let served = pass.served;
        let failed = failed.min(served);
        let good = served - failed;
        let total = b0 + arrivals;
        let fail_frac = (failed + pass.dropped) / total.max(1.0);
        let timeout_ms = self.app.timeout_s * 1000.0;
        let mut p50 = pass.p50_ms;
        let mut p99 = pass.p99_ms;
        if fail_frac > 0.01 {
            p99 = timeout_ms;
        }
        if fail_frac > 0.5 {
            p50 = timeout_ms;
        }
        p50 = p50.min(timeout_ms);
        p99 = p99.min(timeout_ms).max(p50);

        // 5. utilization
        let n_alloc = self.replicas.len().max(1) as f64;
        let cpu_util = utilization(usage_cores, alloc_cores);
        let memory_util = utilization(ws_total, alloc_mem);
        let offered_rps = arrivals / dt;
        let throughput = good / dt;
        let io_util = (served / dt * m.io_bytes / (self.share.io_bytes_per_s * n_alloc)).min(1.0);
        let network_util =
            (served / dt * m.net_bytes / (self.share.net_bytes_per_s * n_alloc)).min(1.0);

        let (sp, violation) = slo_preservation(&self.app.slo, p99, throughput, offered_rps);

        if let Some(h) = self.histogram.as_deref_mut() {
            record_histogram(h, good, p50 / 1000.0, p99 / 1000.0);
            h.failed += failed + pass.dropped;
            h.received += arrivals;
        }

        self.backlog = pass.b1;
        self.now = t1;
        let metrics = SimMetrics {
            step: self.step,
            time_s: t1,
            cpu_limit_cores: self.alloc.cpu_millicores as f64 / 1000.0,
            memory_limit_bytes: self.alloc.memory_bytes as f64,
            cpu_usage_cores: usage_cores,
            memory_working_set_bytes: ws_total,
            cpu_util,
            memory_util,
            io_util,
            network_util,
            p50_ms: p50,
            p99_ms: p99,
            throughput_rps: throughput,
            offered_rps,
            replicas: self.replicas.len() as u32,
            ready_replicas: ready_end,
            oom_kills: oom,
            failed_requests: failed + pass.dropped,
            backlog: pass.b1,
            slo_preservation: sp,
            slo_violation: violation,
            pending_replicas: self
                .replicas
                .iter()
                .filter(|r| r.pending_since.is_some())
                .count() as u32,
        };
        self.prev_offered = (self.step > 0).then_some(self.last.offered_rps);
        self.step += 1;
        self.last = metrics;
        metrics
    }

    /// Fluid queue and latency for the current per-replica capacities in `scratch`.
    fn serve(&self, arrivals: f64, b0: f64, demand: f64, eta: f64) -> ServePass {
        let m = &self.model;
        let dt = self.dt;
        let mut cap_cores = 0.0;
        let mut end_cores = 0.0;
        let mut n_eff = 0.0;
        for s in &self.scratch {
            cap_cores += s.f * s.c_avg;
            n_eff += s.f;
            if s.serving && !s.killed {
                end_cores += s.c_end;
            }
        }
        let mu = cap_cores / demand;
        let mu_end = end_cores / demand;
        let total = b0 + arrivals;
        let served = total.min(mu * dt);
        let mut b1 = total - served;
        let dropped = (b1 - mu_end * self.app.timeout_s).max(0.0);
        b1 -= dropped;

        let offered_rps = arrivals / dt;
        let n_alloc = self.scratch.len().max(1) as f64;
        let io_rho = (offered_rps * m.io_bytes / (self.share.io_bytes_per_s * n_alloc)).min(0.9);
        let net_rho = (offered_rps * m.net_bytes / (self.share.net_bytes_per_s * n_alloc)).min(0.9);
        let wait = m.wait_seconds / (1.0 - io_rho.max(net_rho));
        let timeout_ms = self.app.timeout_s * 1000.0;
        if !(n_eff > 0.0 && mu > 0.0) {
            return ServePass {
                served,
                b1,
                dropped,
                p50_ms: timeout_ms,
                p99_ms: timeout_ms,
                inflight_per_replica: 0.0,
                queued_per_replica: 0.0,
                cap_cores,
            };
        }
        let c_avg = cap_cores / n_eff;
        let s = m.cpu_service_time(c_avg) * eta;
        let rho = (offered_rps / mu).min(RHO_MAX);
        let servers = (c_avg / m.parallelism).max(1.0);
        let k = (2.0 * (servers + 1.0)).sqrt() - 1.0;
        let wq = s * rho.powf(k) / (servers * (1.0 - rho));
        let (lo, hi) = (b0.min(b1) / mu, b0.max(b1) / mu);
        let d50 = lo + 0.5 * (hi - lo);
        let d99 = lo + 0.99 * (hi - lo);
        let base = s + wait;
        // in service: offered rate × time in service (Little's law), computed from the offered
        // rate so that more CPU or replicas never raise it; queued: time-averaged backlog
        ServePass {
            served,
            b1,
            dropped,
            p50_ms: (base + 0.69 * wq + d50) * 1000.0,
            p99_ms: (base * (1.0 + 2.33 * m.cv) + 4.6 * wq + d99) * 1000.0,
            inflight_per_replica: offered_rps * (base + wq) / n_eff,
            queued_per_replica: 0.5 * (b0 + b1) / n_eff,
            cap_cores,
        }
    }
}

/// What a shared cluster ([`crate::nodes`]) does to a target's replicas.
impl TargetSim {
    pub(crate) fn replicas_mut(&mut self) -> &mut [Replica] {
        &mut self.replicas
    }

    /// Evict replica `j` at time `t` (its node was drained): its ReplicaSet creates a new pod
    /// with the latest spec (a pending rolling restart's or deferred resize's), which is Pending
    /// until it is bound.
    pub(crate) fn evict(&mut self, j: usize, t: f64) {
        self.next_id += 1;
        let id = self.next_id;
        if let Some(r) = self.replicas.get_mut(j) {
            if let Some((n, _)) = r.pending.take() {
                r.resize(n);
            }
            if let Some(d) = r.deferred.take() {
                r.resize(d);
            }
            r.id = id;
            r.cpu_seconds_total = 0.0;
            r.working_set = 0.0;
            r.restarts = 0;
            r.crash_streak = 0;
            r.node = None;
            r.reserved = [0, 0];
            r.admitted = None;
            r.burst_cap = f64::INFINITY;
            r.pending_since = Some(t);
            r.ready_at = f64::INFINITY;
        }
    }

    /// Bind replica `j` to `node` at time `t`, holding `reserved`: a replica that was Pending
    /// starts now and is ready after the cold start; a new one already starts now.
    pub(crate) fn bind(&mut self, j: usize, node: usize, reserved: [u64; 2], t: f64) {
        let cold = self.model.cold_start_seconds;
        if let Some(r) = self.replicas.get_mut(j) {
            if r.pending_since.take().is_some() {
                r.ready_at = t + cold;
            }
            r.node = Some(node);
            r.reserved = reserved;
            r.admitted = Some(r.sizing_at(t));
        }
    }

    /// Replica `j` found no node at time `t`: Pending (since its first failed attempt).
    pub(crate) fn mark_pending(&mut self, j: usize, t: f64) {
        if let Some(r) = self.replicas.get_mut(j) {
            r.node = None;
            r.reserved = [0, 0];
            r.admitted = None;
            r.burst_cap = f64::INFINITY;
            r.ready_at = f64::INFINITY;
            r.pending_since.get_or_insert(t);
        }
    }

    /// The vertical change of bound replica `j` does not fit its node: it waits, and the
    /// replica keeps what its node admitted.
    pub(crate) fn defer(&mut self, j: usize) {
        if let Some(r) = self.replicas.get_mut(j) {
            if let Some((n, _)) = r.pending.take() {
                r.deferred = Some(n);
            } else if let Some(a) = r.admitted {
                r.deferred = Some(r.sizing());
                r.resize(a);
            }
        }
    }

    /// What replica `j` would hold on its node with its deferred sizing applied.
    pub(crate) fn deferred_reservation(&self, j: usize) -> Option<[u64; 2]> {
        let r = self.replicas.get(j)?;
        let d = r.deferred?;
        Some(
            if self.app.vertical == VerticalMode::Restart && r.ready_at <= self.now {
                // the new pod runs beside the old one until it is ready
                reservation_of(
                    r.cpu_request.max(d.cpu_request),
                    r.mem_request.max(d.mem_request),
                )
            } else {
                reservation_of(d.cpu_request, d.mem_request)
            },
        )
    }

    /// Apply the deferred sizing of replica `j` at time `t` (its node has room now).
    pub(crate) fn admit_deferred(&mut self, j: usize, t: f64) {
        let cold = self.model.cold_start_seconds;
        let restart = self.app.vertical == VerticalMode::Restart;
        if let Some(r) = self.replicas.get_mut(j) {
            if let Some(d) = r.deferred.take() {
                if restart && r.ready_at <= t {
                    r.pending = Some((d, t + cold));
                } else {
                    r.resize(d);
                }
                r.reserved = r.reservation(t);
                r.admitted = Some(r.sizing_at(t));
            }
        }
    }

    /// CPU each serving replica needs in the coming step to serve the backlog and the step's
    /// arrivals at the mean demand, cores (action-independent arrivals; decides which replicas
    /// are bursting on a contended node).
    pub(crate) fn cpu_need_per_replica(&mut self) -> f64 {
        let (arrivals, _) = self.arrivals_for_step();
        let t1 = self.now + self.dt;
        let serving = self.replicas.iter().filter(|r| r.ready_at < t1).count();
        if serving == 0 {
            return 0.0;
        }
        (self.backlog + arrivals.max(0.0)) * self.model.cpu_seconds / self.dt / serving as f64
    }
}

/// A request in whole millicores and bytes, as the scheduler counts it.
pub(crate) fn reservation_of(cpu_cores: f64, mem_bytes: f64) -> [u64; 2] {
    [
        (cpu_cores * 1000.0).round().max(0.0) as u64,
        mem_bytes.round().max(0.0) as u64,
    ]
}

impl Replica {
    /// Its current sizing.
    pub fn sizing(&self) -> Sizing {
        Sizing {
            cpu_request: self.cpu_request,
            cpu: self.cpu,
            mem_request: self.mem_request,
            mem: self.mem,
            cpu_limited: self.cpu_limited,
            mem_limited: self.mem_limited,
        }
    }

    /// Its sizing at time `t`: a rolling restart's new pod's once that is ready (the swap
    /// itself happens when the step is computed), else its current one.
    pub(crate) fn sizing_at(&self, t: f64) -> Sizing {
        match self.pending {
            Some((n, at)) if at <= t => n,
            _ => self.sizing(),
        }
    }

    /// What it needs on its node at time `t`: its requests, or during a rolling restart the
    /// larger of the old and the new pod's (the new pod runs beside the old one until it is
    /// ready; from then on, the new pod's alone).
    pub(crate) fn reservation(&self, t: f64) -> [u64; 2] {
        match self.pending {
            Some((n, at)) if at <= t => reservation_of(n.cpu_request, n.mem_request),
            Some((n, _)) => reservation_of(
                self.cpu_request.max(n.cpu_request),
                self.mem_request.max(n.mem_request),
            ),
            None => reservation_of(self.cpu_request, self.mem_request),
        }
    }

    /// CPU above its request it could use (its limit or burst headroom), cores: the larger of
    /// the old and the new pod's during a rolling restart.
    pub(crate) fn burst_want(&self) -> f64 {
        let own = (self.cpu - self.cpu_request).max(0.0);
        match self.pending {
            Some((n, _)) => own.max(n.cpu - n.cpu_request),
            None => own,
        }
    }

    fn resize(&mut self, s: Sizing) {
        self.cpu = s.cpu;
        self.mem = s.mem;
        self.cpu_request = s.cpu_request;
        self.mem_request = s.mem_request;
        self.cpu_limited = s.cpu_limited;
        self.mem_limited = s.mem_limited;
    }
}

/// Per-replica quantities of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ReplicaStep {
    /// Fraction of the step the replica serves.
    f: f64,
    /// Time-averaged CPU it may use.
    c_avg: f64,
    /// CPU it may use at the end of the step.
    c_end: f64,
    /// Working set at which it is OOM-killed at the end of the step.
    mem: f64,
    /// Serving at some point in the step.
    serving: bool,
    /// Has a container (bound to a node, or no shared cluster): not Pending.
    running: bool,
    /// OOM-killed in this step.
    killed: bool,
}

/// Result of the fluid queue for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ServePass {
    served: f64,
    b1: f64,
    dropped: f64,
    p50_ms: f64,
    p99_ms: f64,
    inflight_per_replica: f64,
    queued_per_replica: f64,
    cap_cores: f64,
}

/// Kubernetes CrashLoopBackOff: no delay for the first crash, then 10 s doubling up to 300 s.
pub fn crash_backoff(streak: u32) -> f64 {
    if streak <= 1 {
        0.0
    } else {
        (10.0 * 2f64.powi(streak.min(16) as i32 - 2)).min(300.0)
    }
}

/// Add `n` requests with a log-normal latency fitted to (p50, p99) to the histogram.
fn record_histogram(h: &mut Counters, n: f64, p50: f64, p99: f64) {
    if n <= 0.0 {
        return;
    }
    let mu = p50.max(1e-6).ln();
    let sigma = ((p99.max(1e-6).ln() - mu) / 2.326).max(1e-6);
    for (b, le) in h.buckets.iter_mut().zip(h.bucket_bounds.iter()) {
        *b += n * normal_cdf((le.ln() - mu) / sigma);
    }
    h.count += n;
    h.sum += n * (mu + 0.5 * sigma * sigma).exp();
}

/// Standard normal CDF (Abramowitz–Stegun 7.1.26, |error| < 1.5e-7).
pub fn normal_cdf(x: f64) -> f64 {
    let z = x / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z.abs());
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-z * z).exp();
    let erf = if z >= 0.0 { y } else { -y };
    0.5 * (1.0 + erf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{Bounds, SegmentSpec, Slo, MIB};
    use crate::load::{LoadPattern, LoadSpec};
    use crate::segments::SegmentKind;
    use proptest::prelude::*;

    pub(crate) fn app_with(
        kinds: &[SegmentKind],
        alloc: Allocation,
        vertical: VerticalMode,
    ) -> AppSpec {
        AppSpec {
            name: "t".into(),
            namespace: "sim".into(),
            segments: kinds
                .iter()
                .map(|k| SegmentSpec {
                    kind: *k,
                    payload: k.default_payload(),
                })
                .collect(),
            slo: Slo {
                latency_p99_ms: Some(200.0),
                throughput_rps: None,
                objective: None,
            },
            alpha: 0.5,
            bounds: Bounds::default(),
            initial: alloc,
            vertical,
            timeout_s: 30.0,
            load: LoadSpec {
                pattern: LoadPattern::Constant { rps: 0.0 },
                poisson: false,
            },
        }
    }

    fn sim(kinds: &[SegmentKind], alloc: Allocation, seed: u64) -> TargetSim {
        sim_of(app_with(kinds, alloc, VerticalMode::InPlace), seed)
    }

    /// `app` on a 10 s step, its load given per step through `advance_with`.
    fn sim_of(app: AppSpec, seed: u64) -> TargetSim {
        TargetSim::new(
            Arc::new(app),
            Arc::new(LoadModel::Pattern(LoadPattern::Constant { rps: 0.0 })),
            10.0,
            seed,
            0,
            NodeShare::default(),
        )
        .unwrap()
    }

    fn alloc(r: u32, cpu: u32, mem_mib: u64) -> Allocation {
        Allocation {
            replicas: r,
            cpu_millicores: cpu,
            memory_bytes: mem_mib * MIB,
        }
    }

    fn kinds_strategy() -> impl Strategy<Value = Vec<SegmentKind>> {
        prop::collection::vec(0usize..16, 1..=3)
            .prop_map(|v| v.into_iter().map(|i| SegmentKind::ALL[i]).collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn p99_non_decreasing_in_load(
            kinds in kinds_strategy(), r in 1u32..=20, cpu in 128u32..=2048,
            mem in 256u64..=3072, l1 in 0.0f64..2000.0, dl in 0.0f64..2000.0, seed in 0u64..1000,
        ) {
            let a = alloc(r, cpu, mem);
            let m1 = sim(&kinds, a, seed).advance_with(l1 * 10.0);
            let m2 = sim(&kinds, a, seed).advance_with((l1 + dl) * 10.0);
            prop_assert!(m2.p99_ms >= m1.p99_ms - 1e-9, "{} < {}", m2.p99_ms, m1.p99_ms);
        }

        #[test]
        fn p99_non_increasing_in_cpu(
            kinds in kinds_strategy(), r in 1u32..=20, c1 in 128u32..=2048, dc in 0u32..2000,
            mem in 256u64..=3072, load in 0.0f64..2000.0, seed in 0u64..1000,
        ) {
            let c2 = (c1 + dc).min(2048);
            let m1 = sim(&kinds, alloc(r, c1, mem), seed).advance_with(load * 10.0);
            let m2 = sim(&kinds, alloc(r, c2, mem), seed).advance_with(load * 10.0);
            prop_assert!(m2.p99_ms <= m1.p99_ms + 1e-9, "{} > {}", m2.p99_ms, m1.p99_ms);
        }

        #[test]
        fn p99_non_increasing_in_replicas(
            kinds in kinds_strategy(), r1 in 1u32..=20, dr in 0u32..20, cpu in 128u32..=2048,
            mem in 256u64..=3072, load in 0.0f64..2000.0, seed in 0u64..1000,
        ) {
            let r2 = (r1 + dr).min(20);
            let m1 = sim(&kinds, alloc(r1, cpu, mem), seed).advance_with(load * 10.0);
            let m2 = sim(&kinds, alloc(r2, cpu, mem), seed).advance_with(load * 10.0);
            prop_assert!(m2.p99_ms <= m1.p99_ms + 1e-9, "{} > {}", m2.p99_ms, m1.p99_ms);
        }

        #[test]
        fn utilization_in_unit_interval_over_random_runs(
            kinds in kinds_strategy(), seed in 0u64..1000,
            steps in prop::collection::vec((1u32..=20, 128u32..=2048, 256u64..=3072, 0.0f64..3000.0), 1..12),
            restart in any::<bool>(),
        ) {
            let mut app = app_with(&kinds, alloc(2, 1000, 1024), VerticalMode::InPlace);
            if restart { app.vertical = VerticalMode::Restart; }
            let mut t = TargetSim::new(Arc::new(app), Arc::new(LoadModel::Pattern(LoadPattern::Constant { rps: 0.0 })), 10.0, seed, 0, NodeShare::default()).unwrap();
            for (r, c, m, l) in steps {
                t.apply(alloc(r, c, m));
                let x = t.advance_with(l * 10.0);
                for u in [x.cpu_util, x.memory_util, x.io_util, x.network_util, x.slo_preservation] {
                    prop_assert!((0.0..=1.0).contains(&u), "{:?}", x);
                }
                prop_assert!(x.throughput_rps >= 0.0 && x.backlog >= 0.0 && x.p99_ms >= x.p50_ms);
                prop_assert!(x.ready_replicas <= x.replicas);
            }
        }
    }

    fn policy(only: bool, cpu_limit: aware_mdp::CpuLimit) -> LimitsPolicy {
        LimitsPolicy {
            controlled_values: if only {
                aware_mdp::ControlledValues::RequestsOnly
            } else {
                aware_mdp::ControlledValues::RequestsAndLimits
            },
            cpu_limit,
        }
    }

    /// `app` with a limits policy and a burst headroom (10 s step).
    fn sim_with(app: AppSpec, seed: u64, limits: LimitsPolicy, burst_headroom: f64) -> TargetSim {
        let mut t = TargetSim::new(
            Arc::new(app),
            Arc::new(LoadModel::Pattern(LoadPattern::Constant { rps: 0.0 })),
            10.0,
            seed,
            0,
            NodeShare {
                burst_headroom,
                ..NodeShare::default()
            },
        )
        .unwrap();
        t.set_limits_policy(limits);
        t
    }

    /// Limits equal to requests (`RequestsAndLimits` with the CPU limit controlled, on the
    /// simulator's Guaranteed template) reproduce the model before requests and limits were told
    /// apart, bit for bit, whatever the burst headroom (it only matters without a limit); so
    /// does a replica without a CPU limit at the default headroom of 0, hence the default policy
    /// (no CPU limit for a latency-sensitive app).
    #[test]
    fn limits_equal_to_requests_reproduce_the_allocation_as_limits() {
        use aware_mdp::CpuLimit;
        let kinds = [SegmentKind::MatrixMultiply, SegmentKind::JsonToYaml];
        for vertical in [VerticalMode::InPlace, VerticalMode::Restart] {
            let run = |limits: LimitsPolicy, headroom: f64| {
                let app = app_with(&kinds, alloc(2, 1000, 1024), vertical);
                let mut t = sim_with(app, 7, limits, headroom);
                (0..40u32)
                    .map(|k| {
                        if k % 5 == 0 {
                            t.apply(alloc(
                                1 + k % 7,
                                200 + 97 * (k % 13),
                                256 + 211 * u64::from(k % 11),
                            ));
                        }
                        let m = t.advance_with(f64::from(30 + 17 * (k % 9)) * 10.0);
                        (m, t.allocation())
                    })
                    .collect::<Vec<_>>()
            };
            let default = run(policy(false, CpuLimit::Controlled), 0.0);
            assert_eq!(default, run(policy(false, CpuLimit::Controlled), 0.75));
            assert_eq!(default, run(LimitsPolicy::default(), 0.0));
            assert_eq!(default, run(policy(false, CpuLimit::Unset), 0.0));
            assert_eq!(
                default,
                run(policy(false, CpuLimit::UnsetIfLatencySensitive), 0.0)
            );
            // the same as the default without any policy set
            let app = app_with(&kinds, alloc(2, 1000, 1024), vertical);
            let mut t = sim_of(app, 7);
            let _ = t.advance_with(10.0);
            assert_eq!(t.limits_policy(), LimitsPolicy::default());
            assert_ne!(
                default,
                run(policy(false, CpuLimit::Unset), 0.5),
                "the headroom is used"
            );
        }
    }

    /// Without a CPU limit a replica uses its request plus the burst headroom: more is served at
    /// the same requested (paid-for) CPU; with the limit it is throttled at it.
    #[test]
    fn a_replica_without_a_cpu_limit_bursts_by_the_headroom_and_costs_its_request() {
        use aware_mdp::CpuLimit;
        let kinds = [SegmentKind::FloatOps];
        let load = 40.0 * 10.0; // 0.1 core-s per request: 4 cores needed
        let run = |cpu_limit, headroom| {
            let mut t = sim_with(
                app_with(&kinds, alloc(2, 1000, 1024), VerticalMode::InPlace),
                3,
                policy(false, cpu_limit),
                headroom,
            );
            let mut m = t.advance_with(load);
            for _ in 0..3 {
                m = t.advance_with(load);
            }
            (m, t.replicas()[0].cpu)
        };
        let (limited, c) = run(CpuLimit::Controlled, 0.5);
        assert_eq!(c, 1.0);
        let (bursting, c) = run(CpuLimit::Unset, 0.5);
        assert_eq!(c, 1.5);
        // the app's SLO has a latency objective: latency-sensitive
        let (unset_if, _) = run(CpuLimit::UnsetIfLatencySensitive, 0.5);
        assert_eq!(unset_if, bursting);
        assert!(
            bursting.throughput_rps > 1.4 * limited.throughput_rps,
            "{bursting:?} vs {limited:?}"
        );
        // the cost, the requests, is the same: 1 core per replica
        assert_eq!(bursting.cpu_limit_cores, 1.0);
        assert_eq!(limited.cpu_limit_cores, 1.0);
        assert!(bursting.cpu_usage_cores > 2.9, "{bursting:?}");
        assert_eq!(
            bursting.cpu_util, 1.0,
            "usage above the requests counts as full"
        );
    }

    /// RequestsOnly keeps the template's limits (the initial allocation): lowering the requests
    /// costs no capacity and raises no OOM kill, and a request above a kept limit is lowered to
    /// it.
    #[test]
    fn requests_only_keeps_the_templates_limits() {
        use aware_mdp::CpuLimit;
        let kinds = [SegmentKind::MatrixMultiply, SegmentKind::ImageCompress];
        let load = 100.0 * 10.0;
        let mk = |only| {
            sim_with(
                app_with(&kinds, alloc(2, 2000, 3072), VerticalMode::InPlace),
                1,
                policy(only, CpuLimit::Controlled),
                0.0,
            )
        };
        let (mut kept, mut scaled) = (mk(true), mk(false));
        for t in [&mut kept, &mut scaled] {
            let _ = t.advance_with(load);
            t.apply(alloc(2, 500, 256));
        }
        let k = kept.advance_with(load);
        let s = scaled.advance_with(load);
        assert_eq!(kept.allocation(), alloc(2, 500, 256));
        assert_eq!(kept.replicas()[0].cpu, 2.0);
        assert_eq!(kept.replicas()[0].mem, 3072.0 * MIB as f64);
        assert_eq!(k.oom_kills, 0, "{k:?}");
        assert!(s.oom_kills > 0, "{s:?}");
        assert!(k.throughput_rps > s.throughput_rps, "{k:?} vs {s:?}");
        assert_eq!(k.cpu_limit_cores, 0.5);
        // a request above the kept limit: lowered to it
        kept.apply(alloc(3, 4000, 4096));
        assert_eq!(kept.allocation(), alloc(3, 2000, 3072));
        assert!(kept
            .replicas()
            .iter()
            .all(|r| r.cpu_request == 2.0 && r.cpu == 2.0));
    }

    #[test]
    fn a_negative_or_nan_headroom_is_refused() {
        for bad in [-0.1, f64::NAN, f64::INFINITY] {
            let e = TargetSim::new(
                Arc::new(app_with(
                    &[SegmentKind::FloatOps],
                    alloc(1, 500, 512),
                    VerticalMode::InPlace,
                )),
                Arc::new(LoadModel::Pattern(LoadPattern::Constant { rps: 0.0 })),
                10.0,
                1,
                0,
                NodeShare {
                    burst_headroom: bad,
                    ..NodeShare::default()
                },
            )
            .unwrap_err();
            assert!(e.to_string().contains("burst_headroom"), "{e}");
        }
    }

    #[test]
    fn best_effort_sp_is_the_served_share_and_never_a_violation() {
        // (the formula is tested in `aware-mdp`) a starved best-effort app: SP falls with the dropped requests, so the reward does
        // not pay for one overloaded replica; provisioned, it serves everything
        let kinds = [SegmentKind::MatrixMultiply];
        let mut app = app_with(&kinds, alloc(1, 250, 3072), VerticalMode::InPlace);
        app.slo = Slo::default();
        let mut t = sim_of(app, 3);
        let mut starved = t.advance_with(200.0 * 10.0);
        for _ in 0..5 {
            starved = t.advance_with(200.0 * 10.0);
        }
        assert!(!starved.slo_violation, "{starved:?}");
        assert!(starved.slo_preservation < 0.5, "{starved:?}");
        t.apply(alloc(10, 4000, 3072));
        let mut fed = t.advance_with(20.0 * 10.0);
        for _ in 0..10 {
            fed = t.advance_with(20.0 * 10.0);
        }
        assert!(fed.slo_preservation > 0.95, "{fed:?}");
        assert!(!fed.slo_violation);
    }

    #[test]
    fn memory_below_working_set_oom_kills() {
        // matrix multiply: ~180 MiB base + ~1.2 MiB per request; 256 MiB limit under heavy load
        let kinds = [SegmentKind::MatrixMultiply, SegmentKind::ImageCompress];
        let mut t = sim(&kinds, alloc(2, 2000, 3072), 1);
        let ok = t.advance_with(100.0 * 10.0);
        assert_eq!(ok.oom_kills, 0, "{ok:?}");
        t.apply(alloc(2, 2000, 256));
        let m = t.advance_with(100.0 * 10.0);
        assert!(m.oom_kills > 0, "{m:?}");
        assert!(m.failed_requests > 0.0);
        // killed replicas restart with the cold start: not ready at the end of the step
        assert!(m.ready_replicas < 2);
        assert!(m.slo_violation);
        // restoring memory: the replicas come back after the cold start
        t.apply(alloc(2, 2000, 3072));
        let _ = t.advance_with(100.0 * 10.0);
        let back = t.advance_with(100.0 * 10.0);
        assert_eq!(back.oom_kills, 0);
        assert_eq!(back.ready_replicas, 2);
    }

    #[test]
    fn base_above_limit_crash_loops() {
        let mut t = sim(&[SegmentKind::MatrixMultiply], alloc(1, 1000, 3072), 2);
        t.apply(alloc(1, 1000, 200));
        for _ in 0..3 {
            let m = t.advance_with(10.0);
            assert_eq!(m.oom_kills, 1);
            assert_eq!(m.ready_replicas, 0);
        }
    }

    #[test]
    fn crash_loop_backs_off() {
        assert_eq!(crash_backoff(1), 0.0);
        assert_eq!(crash_backoff(2), 10.0);
        assert_eq!(crash_backoff(3), 20.0);
        assert_eq!(crash_backoff(30), 300.0);
        let mut t = sim(&[SegmentKind::MatrixMultiply], alloc(1, 1000, 3072), 2);
        t.apply(alloc(1, 1000, 200));
        let _ = t.advance_with(10.0);
        let _ = t.advance_with(10.0);
        let r = &t.replicas()[0];
        assert_eq!(r.crash_streak, 2);
        // second crash at t = 20 s: cold start 7 s + back-off 10 s
        assert!((r.ready_at - (20.0 + 7.0 + 10.0)).abs() < 1e-9, "{r:?}");
        // enough memory again: it comes back after the back-off and the streak resets
        t.apply(alloc(1, 1000, 3072));
        let mut ready = 0;
        for _ in 0..4 {
            ready = t.advance_with(10.0).ready_replicas;
        }
        assert_eq!(ready, 1);
        assert_eq!(t.replicas()[0].crash_streak, 0);
    }

    #[test]
    fn cold_start_delays_relief_after_scale_up() {
        // matrix multiply cold start = 1 + 6 s; step 10 s
        let kinds = [SegmentKind::MatrixMultiply];
        let load = 400.0 * 10.0;
        let mut t = sim(&kinds, alloc(1, 1000, 3072), 3);
        let before = t.advance_with(load);
        t.apply(alloc(10, 1000, 3072));
        let first = t.advance_with(load);
        let second = t.advance_with(load);
        // an identically seeded sim whose 10 replicas are ready from the start
        let mut warm = sim(&kinds, alloc(10, 1000, 3072), 3);
        let _ = warm.advance_with(load);
        let warm1 = warm.advance_with(load);
        assert!(
            first.ready_replicas == 10 && first.replicas == 10,
            "{first:?}"
        );
        // the new replicas serve only for the last 3 s of the step: the backlog built up during
        // the cold start keeps latency far above that of already-warm replicas
        assert!(first.p99_ms > 10.0 * warm1.p99_ms, "{first:?} vs {warm1:?}");
        assert!(before.backlog > 0.0);
        assert!(second.p99_ms < first.p99_ms / 10.0, "{second:?}");
        assert!((second.p99_ms - warm1.p99_ms).abs() < 0.5 * warm1.p99_ms);
    }

    #[test]
    fn restart_mode_keeps_old_limits_until_new_pods_ready() {
        let kinds = [SegmentKind::FloatOps];
        let mk = |mode| {
            let app = app_with(&kinds, alloc(2, 500, 1024), mode);
            TargetSim::new(
                Arc::new(app),
                Arc::new(LoadModel::Pattern(LoadPattern::Constant { rps: 0.0 })),
                4.0,
                9,
                0,
                NodeShare::default(),
            )
            .unwrap()
        };
        let load = 40.0 * 4.0; // 0.1 s/request → needs 4 cores
        let mut inplace = mk(VerticalMode::InPlace);
        let mut restart = mk(VerticalMode::Restart);
        for t in [&mut inplace, &mut restart] {
            let _ = t.advance_with(load);
            t.apply(alloc(2, 2000, 1024));
        }
        let a = inplace.advance_with(load);
        let b = restart.advance_with(load);
        assert!(b.throughput_rps < a.throughput_rps, "{a:?} {b:?}");
        // after the cold start (1 + 1 s) both serve with the new limits
        let _ = restart.advance_with(load);
        let a2 = inplace.advance_with(load);
        let b2 = restart.advance_with(load);
        assert!(restart
            .replicas()
            .iter()
            .all(|r| r.cpu == 2.0 && r.pending.is_none()));
        assert!(
            b2.throughput_rps >= a2.throughput_rps * 0.99,
            "{a2:?} {b2:?}"
        );
        // the rolling restart created new pods
        assert!(restart.replicas().iter().all(|r| r.id > 2));
    }

    #[test]
    fn backlog_persists_across_steps() {
        let kinds = [SegmentKind::FloatOps];
        let mut t = sim(&kinds, alloc(1, 1000, 3072), 4);
        // capacity ≈ 10 rps; offer 30 rps for one step, then nothing
        let m1 = t.advance_with(300.0);
        assert!(m1.backlog > 150.0, "{m1:?}");
        let m2 = t.advance_with(0.0);
        assert!(
            m2.throughput_rps > 5.0,
            "backlog must be served in the next step: {m2:?}"
        );
        assert!(m2.p99_ms > 1000.0);
    }

    #[test]
    fn same_seed_same_noise_different_seed_differs() {
        let kinds = [SegmentKind::ImageResize, SegmentKind::KeyValueRead];
        let run = |seed| {
            let mut t = sim(&kinds, alloc(3, 700, 1024), seed);
            (0..20)
                .map(|i| t.advance_with(100.0 + i as f64 * 50.0))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn histogram_counts_requests() {
        let mut t = sim(&[SegmentKind::JsonToYaml], alloc(2, 1000, 1024), 1);
        t.enable_histogram();
        let m = t.advance_with(1000.0);
        let h = t.counters().unwrap();
        assert!((h.count - m.throughput_rps * 10.0).abs() < 1e-6);
        assert!(h.buckets.windows(2).all(|w| w[0] <= w[1] + 1e-9));
        assert!(h.buckets.last().copied().unwrap_or(0.0) <= h.count + 1e-9);
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7 && (normal_cdf(2.326) - 0.99).abs() < 1e-3);
    }
}
