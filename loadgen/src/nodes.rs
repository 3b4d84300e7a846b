//! A shared cluster: nodes with allocatable CPU and memory that the replicas of every app are
//! placed on (docs/adr/0018-shared-cluster-in-the-simulator.md).
//!
//! Without one ([`crate::env::SimConfig::cluster`] `None`, the default) every app has the whole
//! cluster to itself, as before: capacity is unlimited and nothing is ever Pending. With one, at
//! the start of every step, after every app's action is applied:
//!
//! 1. **Node events** due at the step (`drain`, `add`) happen: a drained node is cordoned and its
//!    replicas are evicted (each becomes a new, Pending pod); an added node is schedulable.
//! 2. **Vertical changes** of bound replicas must fit their node: shrinking ones first, then
//!    growing ones in (app, replica) order; one that does not fit is deferred (Kubernetes'
//!    Deferred in-place resize; in `restart` mode the rolling update's new pod waits) and retried
//!    at every step until it fits or the next vertical change replaces it.
//! 3. **Scheduling.** Unbound replicas (new, evicted, or still Pending), oldest first (the time
//!    they became Pending, then app index, then pod ordinal), are each placed on a node by
//!    kube-scheduler's NodeResourcesFit: the filter keeps the schedulable nodes where the
//!    replica's requests fit the unrequested allocatable CPU and memory; the LeastAllocated
//!    score, in integers as upstream, is `Σ_r w_r · ((alloc_r − req_r) · 100 / alloc_r) / Σ_r w_r`
//!    over r ∈ {cpu (millicores), memory (bytes)}, weights 1, with `req_r` the node's requests
//!    including the replica's; the highest score wins, ties to the lowest node index (upstream
//!    picks among ties at random). A replica that fits nowhere is Pending: not ready, serving
//!    nothing, and it accrues the step's length in pending replica-seconds. A Pending replica
//!    that is bound starts then and is ready after the app's cold start.
//! 4. **CPU contention.** A replica may use more CPU than it requests when its limit (or the
//!    burst headroom, without a limit) allows. On a node, that extra comes out of the node's
//!    unrequested CPU, `allocatable − Σ requests`. When that pool covers every replica's possible
//!    burst, each gets all of it (the single-app model exactly). Otherwise it is split by
//!    weighted water-filling, the weight being the CPU request (the kernel's `cpu.weight` is
//!    proportional to it): first among the bursting replicas (whose app needs more CPU per
//!    serving replica in this step than the replica requests, from the step's arrivals and
//!    backlog), each capped at its possible burst, then what is left among the others. The
//!    split is deterministic (ties by app index and pod order). By default requested but idle
//!    CPU is not lent (the conservative side for the SLO). With [`ClusterConfig::lend_idle`] it
//!    is, as CFS gives any idle cycle to a runnable task: every bound replica whose app needs
//!    less CPU per serving replica in the step than the replica requests adds the difference
//!    to its node's pool. Memory above the request is not contended (no node-pressure
//!    eviction).
//!
//! The occupancy of every step ([`ClusterOccupancy`]: requested shares of the schedulable nodes'
//! allocatable CPU and memory, Pending replicas, pending replica-seconds, per-node allocation) is
//! [`crate::env::SimEnv::cluster_occupancy`]; each app's Pending replicas are also in its
//! [`crate::cluster::SimMetrics::pending_replicas`].

use serde::{Deserialize, Serialize};

use crate::cluster::TargetSim;
use crate::error::SimError;

/// kube-scheduler's `framework.MaxNodeScore`.
pub const MAX_NODE_SCORE: u128 = 100;

/// The shared cluster's settings (`SimConfig::cluster`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Identical nodes at the start, named `node-0`, `node-1`, …
    pub nodes: u32,
    /// Allocatable CPU per node, millicores (> 0).
    pub node_cpu_millicores: u64,
    /// Allocatable memory per node, bytes (> 0).
    pub node_memory_bytes: u64,
    /// Node events at the start of a step.
    #[serde(default)]
    pub events: Vec<NodeEvent>,
    /// Lend requested but idle CPU to the replicas that burst (module docs, 4); default off:
    /// only unrequested CPU is lent.
    #[serde(default)]
    pub lend_idle: bool,
}

impl ClusterConfig {
    /// `nodes` nodes of `cpu_millicores` and `memory_bytes` each, no events.
    pub fn uniform(nodes: u32, cpu_millicores: u64, memory_bytes: u64) -> Self {
        ClusterConfig {
            nodes,
            node_cpu_millicores: cpu_millicores,
            node_memory_bytes: memory_bytes,
            events: Vec::new(),
            lend_idle: false,
        }
    }

    /// Node sizes must be positive; a drain must name a node that exists at its step (the
    /// initial ones, and those added at an earlier step or earlier in the list).
    pub fn validate(&self) -> Result<(), SimError> {
        let mut events: Vec<&NodeEvent> = self.events.iter().collect();
        events.sort_by_key(|e| e.step());
        let mut count = u64::from(self.nodes);
        for e in events {
            match e {
                NodeEvent::Add { .. } => count += 1,
                NodeEvent::Drain { step, node } => {
                    let known = node
                        .strip_prefix("node-")
                        .and_then(|i| i.parse::<u64>().ok())
                        .is_some_and(|i| i < count && node == &format!("node-{i}"));
                    if !known {
                        return Err(SimError::Config(format!(
                            "cluster: no node `{node}` to drain at step {step}"
                        )));
                    }
                }
            }
        }
        let bad = |what: &str| Err(SimError::Config(format!("cluster: {what} must be > 0")));
        if self.node_cpu_millicores == 0 {
            return bad("node_cpu_millicores");
        }
        if self.node_memory_bytes == 0 {
            return bad("node_memory_bytes");
        }
        for e in &self.events {
            if let NodeEvent::Add {
                cpu_millicores,
                memory_bytes,
                ..
            } = e
            {
                if *cpu_millicores == 0 || *memory_bytes == 0 {
                    return bad("an added node's cpu_millicores and memory_bytes");
                }
            }
        }
        Ok(())
    }
}

/// A node event, at the start of `step` (before that step's scheduling).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum NodeEvent {
    /// Cordon the node and evict its replicas (rescheduled elsewhere, Pending if nothing fits).
    Drain {
        /// Step.
        step: u64,
        /// Node name (`node-<i>`).
        node: String,
    },
    /// Add a schedulable node (named `node-<number of nodes so far>`).
    Add {
        /// Step.
        step: u64,
        /// Allocatable CPU, millicores.
        cpu_millicores: u64,
        /// Allocatable memory, bytes.
        memory_bytes: u64,
    },
}

impl NodeEvent {
    /// The step it happens at.
    pub fn step(&self) -> u64 {
        match self {
            NodeEvent::Drain { step, .. } | NodeEvent::Add { step, .. } => *step,
        }
    }
}

/// One node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Name.
    pub name: String,
    /// Allocatable [CPU millicores, memory bytes].
    pub allocatable: [u64; 2],
    /// Not cordoned (drained nodes are not).
    pub schedulable: bool,
}

/// A node's allocation in a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeAllocation {
    /// Name.
    pub name: String,
    /// Not cordoned.
    pub schedulable: bool,
    /// Allocatable CPU, millicores.
    pub cpu_allocatable_millicores: u64,
    /// Allocatable memory, bytes.
    pub memory_allocatable_bytes: u64,
    /// Σ CPU requests of its replicas, millicores.
    pub cpu_requested_millicores: u64,
    /// Σ memory requests of its replicas, bytes.
    pub memory_requested_bytes: u64,
    /// Replicas bound to it.
    pub replicas: u32,
}

/// The shared cluster's occupancy during a step (after that step's scheduling).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ClusterOccupancy {
    /// The step (0 at reset, before any step).
    pub step: u64,
    /// Σ CPU requests of bound replicas / Σ allocatable CPU of the schedulable nodes (0 without
    /// any); at most 1 (a drained node holds no replicas).
    pub cpu_requested_share: f64,
    /// Σ memory requests of bound replicas / Σ allocatable memory of the schedulable nodes.
    pub memory_requested_share: f64,
    /// Replicas Pending through the step.
    pub pending_replicas: u32,
    /// Pending replicas per app (app index order).
    pub pending_by_target: Vec<u32>,
    /// Pending replica-seconds since reset, cluster-wide (each Pending replica accrues the
    /// step's length at every step it waits through).
    pub pending_replica_seconds: f64,
    /// Pending replica-seconds since reset per app.
    pub pending_replica_seconds_by_target: Vec<f64>,
    /// Vertical changes waiting for room on their node.
    pub deferred_resizes: u32,
    /// Per node.
    pub nodes: Vec<NodeAllocation>,
}

/// The nodes and what is placed on them.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    events: Vec<NodeEvent>,
    nodes: Vec<Node>,
    /// Requested [millicores, bytes] per node.
    used: Vec<[u64; 2]>,
    pending_s: Vec<f64>,
    occupancy: ClusterOccupancy,
    lend_idle: bool,
}

impl Cluster {
    /// The cluster of `cfg` for `targets` apps, nothing placed yet.
    pub fn new(cfg: &ClusterConfig, targets: usize) -> Result<Self, SimError> {
        cfg.validate()?;
        let nodes: Vec<Node> = (0..cfg.nodes)
            .map(|i| Node {
                name: format!("node-{i}"),
                allocatable: [cfg.node_cpu_millicores, cfg.node_memory_bytes],
                schedulable: true,
            })
            .collect();
        Ok(Cluster {
            events: cfg.events.clone(),
            used: vec![[0, 0]; nodes.len()],
            nodes,
            pending_s: vec![0.0; targets],
            occupancy: ClusterOccupancy::default(),
            lend_idle: cfg.lend_idle,
        })
    }

    /// The nodes.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The occupancy of the last step (or of the initial placement).
    pub fn occupancy(&self) -> &ClusterOccupancy {
        &self.occupancy
    }

    /// Place the initial replicas at reset (time 0).
    pub(crate) fn place_initial(&mut self, targets: &mut [TargetSim]) {
        self.schedule(targets, 0.0);
        self.refresh(targets, 0);
    }

    /// The start of step `step` at time `t0`, after the apps' actions were applied: node events,
    /// vertical admissions, scheduling, CPU shares, pending accrual and occupancy.
    pub(crate) fn begin_step(
        &mut self,
        targets: &mut [TargetSim],
        step: u64,
        t0: f64,
        dt: f64,
    ) -> Result<(), SimError> {
        let due: Vec<NodeEvent> = self
            .events
            .iter()
            .filter(|e| e.step() == step)
            .cloned()
            .collect();
        for e in due {
            match e {
                NodeEvent::Drain { node, .. } => self.cordon_and_evict(targets, &node, t0)?,
                NodeEvent::Add {
                    cpu_millicores,
                    memory_bytes,
                    ..
                } => {
                    self.push_node(cpu_millicores, memory_bytes);
                }
            }
        }
        self.admit_vertical(targets, t0);
        self.schedule(targets, t0);
        self.share_cpu(targets);
        for (i, t) in targets.iter().enumerate() {
            let pending = t
                .replicas()
                .iter()
                .filter(|r| r.pending_since.is_some())
                .count();
            if let Some(p) = self.pending_s.get_mut(i) {
                *p += pending as f64 * dt;
            }
        }
        self.refresh(targets, step);
        Ok(())
    }

    /// Drain `name` now (time `t`): cordon it, evict its replicas and reschedule them.
    pub(crate) fn drain(
        &mut self,
        targets: &mut [TargetSim],
        name: &str,
        t: f64,
        step: u64,
    ) -> Result<(), SimError> {
        self.cordon_and_evict(targets, name, t)?;
        self.schedule(targets, t);
        self.refresh(targets, step);
        Ok(())
    }

    /// Add a node now (time `t`) and schedule what is Pending; returns its name.
    pub(crate) fn add(
        &mut self,
        targets: &mut [TargetSim],
        cpu_millicores: u64,
        memory_bytes: u64,
        t: f64,
        step: u64,
    ) -> Result<String, SimError> {
        if cpu_millicores == 0 || memory_bytes == 0 {
            return Err(SimError::Config(
                "cluster: an added node's cpu_millicores and memory_bytes must be > 0".into(),
            ));
        }
        let name = self.push_node(cpu_millicores, memory_bytes);
        self.schedule(targets, t);
        self.refresh(targets, step);
        Ok(name)
    }

    fn push_node(&mut self, cpu_millicores: u64, memory_bytes: u64) -> String {
        let name = format!("node-{}", self.nodes.len());
        self.nodes.push(Node {
            name: name.clone(),
            allocatable: [cpu_millicores, memory_bytes],
            schedulable: true,
        });
        self.used.push([0, 0]);
        name
    }

    fn cordon_and_evict(
        &mut self,
        targets: &mut [TargetSim],
        name: &str,
        t: f64,
    ) -> Result<(), SimError> {
        let n = self
            .nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| SimError::Config(format!("cluster: no node `{name}` to drain")))?;
        if let Some(node) = self.nodes.get_mut(n) {
            node.schedulable = false;
        }
        let mut evicted = 0u32;
        for tgt in targets.iter_mut() {
            let on: Vec<usize> = tgt
                .replicas()
                .iter()
                .enumerate()
                .filter(|(_, r)| r.node == Some(n))
                .map(|(j, _)| j)
                .collect();
            for j in on {
                tgt.evict(j, t);
                evicted += 1;
            }
        }
        tracing::debug!(node = name, evicted, "cluster: node drained");
        Ok(())
    }

    /// Requested [millicores, bytes] per node from the bound replicas' reservations.
    fn recount(&mut self, targets: &[TargetSim]) {
        self.used = vec![[0, 0]; self.nodes.len()];
        for t in targets {
            for r in t.replicas() {
                if let Some(u) = r.node.and_then(|n| self.used.get_mut(n)) {
                    u[0] += r.reserved[0];
                    u[1] += r.reserved[1];
                }
            }
        }
    }

    fn fits(&self, n: usize, used: [u64; 2]) -> bool {
        self.nodes
            .get(n)
            .is_some_and(|node| used[0] <= node.allocatable[0] && used[1] <= node.allocatable[1])
    }

    /// Vertical changes of bound replicas: shrinks, then growths if they fit, then deferred
    /// ones if they fit now.
    fn admit_vertical(&mut self, targets: &mut [TargetSim], t0: f64) {
        self.recount(targets);
        let mut growing = Vec::new();
        for (i, t) in targets.iter_mut().enumerate() {
            for (j, r) in t.replicas_mut().iter_mut().enumerate() {
                let Some(n) = r.node else { continue };
                let want = r.reservation(t0);
                if want == r.reserved {
                    continue;
                }
                if want[0] <= r.reserved[0] && want[1] <= r.reserved[1] {
                    if let Some(u) = self.used.get_mut(n) {
                        u[0] -= r.reserved[0] - want[0];
                        u[1] -= r.reserved[1] - want[1];
                    }
                    r.reserved = want;
                    r.admitted = Some(r.sizing_at(t0));
                } else {
                    growing.push((i, j, n));
                }
            }
        }
        for (i, j, n) in growing {
            let Some(t) = targets.get_mut(i) else {
                continue;
            };
            let Some(r) = t.replicas().get(j) else {
                continue;
            };
            let (old, want) = (r.reserved, r.reservation(t0));
            let Some(u) = self.used.get(n).copied() else {
                continue;
            };
            let after = [u[0] - old[0] + want[0], u[1] - old[1] + want[1]];
            if self.fits(n, after) {
                self.used[n] = after;
                if let Some(r) = t.replicas_mut().get_mut(j) {
                    r.reserved = want;
                    r.admitted = Some(r.sizing_at(t0));
                }
            } else {
                t.defer(j);
                // what it holds now (its admitted sizing, or the old pod alone)
                let now = t.replicas().get(j).map_or(old, |r| r.reservation(t0));
                self.used[n] = [u[0] - old[0] + now[0], u[1] - old[1] + now[1]];
                if let Some(r) = t.replicas_mut().get_mut(j) {
                    r.reserved = now;
                }
            }
        }
        for t in targets.iter_mut() {
            for j in 0..t.replicas().len() {
                let Some(n) = t.replicas().get(j).and_then(|r| r.node) else {
                    continue;
                };
                let Some(want) = t.deferred_reservation(j) else {
                    continue;
                };
                let old = t.replicas().get(j).map_or([0, 0], |r| r.reserved);
                let Some(u) = self.used.get(n).copied() else {
                    continue;
                };
                let after = [
                    (u[0] - old[0]).saturating_add(want[0]),
                    (u[1] - old[1]).saturating_add(want[1]),
                ];
                if self.fits(n, after) {
                    t.admit_deferred(j, t0);
                    let now = t.replicas().get(j).map_or(want, |r| r.reserved);
                    self.used[n] = [u[0] - old[0] + now[0], u[1] - old[1] + now[1]];
                }
            }
        }
    }

    /// Place every unbound replica, oldest first; what fits nowhere is Pending.
    fn schedule(&mut self, targets: &mut [TargetSim], t: f64) {
        self.recount(targets);
        let mut queue: Vec<(f64, usize, u64, usize)> = Vec::new();
        for (i, tgt) in targets.iter().enumerate() {
            for (j, r) in tgt.replicas().iter().enumerate() {
                if r.node.is_none() {
                    queue.push((r.pending_since.unwrap_or(t), i, r.id, j));
                }
            }
        }
        queue.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        for (_, i, _, j) in queue {
            let Some(tgt) = targets.get_mut(i) else {
                continue;
            };
            let Some(req) = tgt.replicas().get(j).map(|r| r.reservation(t)) else {
                continue;
            };
            match self.pick(req) {
                Some(n) => {
                    self.used[n][0] += req[0];
                    self.used[n][1] += req[1];
                    tgt.bind(j, n, req, t);
                }
                None => tgt.mark_pending(j, t),
            }
        }
    }

    /// NodeResourcesFit: the feasible node with the highest LeastAllocated score (ties to the
    /// lowest index), or none.
    pub fn pick(&self, req: [u64; 2]) -> Option<usize> {
        let mut best: Option<(u128, usize)> = None;
        for (n, node) in self.nodes.iter().enumerate() {
            if !node.schedulable {
                continue;
            }
            let Some(u) = self.used.get(n) else { continue };
            let requested = [u[0] + req[0], u[1] + req[1]];
            if !self.fits(n, requested) {
                continue;
            }
            let score = least_allocated_score(requested, node.allocatable);
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, n));
            }
        }
        best.map(|(_, n)| n)
    }

    /// Split each node's unrequested CPU among the replicas that may burst (module docs, 4).
    fn share_cpu(&mut self, targets: &mut [TargetSim]) {
        let need: Vec<f64> = targets
            .iter_mut()
            .map(|t| t.cpu_need_per_replica())
            .collect();
        let mut per_node: Vec<Vec<BurstClaim>> = vec![Vec::new(); self.nodes.len()];
        // Requested CPU the replicas on each node leave idle in the step, cores (lend_idle).
        let mut idle = vec![0.0; self.nodes.len()];
        for (i, t) in targets.iter_mut().enumerate() {
            let need_i = need.get(i).copied().unwrap_or(0.0);
            for (j, r) in t.replicas_mut().iter_mut().enumerate() {
                r.burst_cap = f64::INFINITY;
                let Some(n) = r.node else { continue };
                if self.lend_idle && need_i.is_finite() {
                    if let Some(x) = idle.get_mut(n) {
                        *x += (r.cpu_request - need_i).max(0.0);
                    }
                }
                let want = r.burst_want();
                if want > 0.0 {
                    if let Some(v) = per_node.get_mut(n) {
                        v.push((i, j, r.cpu_request, want, need_i > r.cpu_request));
                    }
                }
            }
        }
        for (n, claims) in per_node.iter().enumerate() {
            let (Some(node), Some(u)) = (self.nodes.get(n), self.used.get(n)) else {
                continue;
            };
            let pool = node.allocatable[0].saturating_sub(u[0]) as f64 / 1000.0
                + idle.get(n).copied().unwrap_or(0.0);
            let total: f64 = claims.iter().map(|c| c.3).sum();
            if total <= pool {
                continue;
            }
            let mut caps = vec![0.0; claims.len()];
            let mut left = pool;
            for stage in [true, false] {
                let idx: Vec<usize> = (0..claims.len())
                    .filter(|&k| claims[k].4 == stage)
                    .collect();
                let w: Vec<f64> = idx.iter().map(|&k| claims[k].2).collect();
                let c: Vec<f64> = idx.iter().map(|&k| claims[k].3).collect();
                let got = water_fill(left, &w, &c);
                for (&k, g) in idx.iter().zip(&got) {
                    caps[k] = *g;
                    left -= g;
                }
                left = left.max(0.0);
            }
            for (k, &(i, j, _, want, _)) in claims.iter().enumerate() {
                if let Some(r) = targets.get_mut(i).and_then(|t| t.replicas_mut().get_mut(j)) {
                    // a full share leaves the replica as the single-app model has it
                    r.burst_cap = if caps[k] >= want {
                        f64::INFINITY
                    } else {
                        caps[k]
                    };
                }
            }
        }
    }

    fn refresh(&mut self, targets: &[TargetSim], step: u64) {
        self.recount(targets);
        let mut nodes: Vec<NodeAllocation> = self
            .nodes
            .iter()
            .zip(&self.used)
            .map(|(n, u)| NodeAllocation {
                name: n.name.clone(),
                schedulable: n.schedulable,
                cpu_allocatable_millicores: n.allocatable[0],
                memory_allocatable_bytes: n.allocatable[1],
                cpu_requested_millicores: u[0],
                memory_requested_bytes: u[1],
                replicas: 0,
            })
            .collect();
        let mut pending_by_target = Vec::with_capacity(targets.len());
        let mut deferred = 0u32;
        for t in targets {
            let mut p = 0u32;
            for r in t.replicas() {
                match r.node.and_then(|n| nodes.get_mut(n)) {
                    Some(a) => a.replicas += 1,
                    None => p += u32::from(r.pending_since.is_some()),
                }
                deferred += u32::from(r.deferred.is_some());
            }
            pending_by_target.push(p);
        }
        let sum = |f: &dyn Fn(&NodeAllocation) -> u64| -> f64 {
            nodes.iter().filter(|n| n.schedulable).map(f).sum::<u64>() as f64
        };
        let share = |req: f64, alloc: f64| if alloc > 0.0 { req / alloc } else { 0.0 };
        let cpu_alloc = sum(&|n| n.cpu_allocatable_millicores);
        let mem_alloc = sum(&|n| n.memory_allocatable_bytes);
        let cpu_req = nodes
            .iter()
            .map(|n| n.cpu_requested_millicores)
            .sum::<u64>() as f64;
        let mem_req = nodes.iter().map(|n| n.memory_requested_bytes).sum::<u64>() as f64;
        self.occupancy = ClusterOccupancy {
            step,
            cpu_requested_share: share(cpu_req, cpu_alloc),
            memory_requested_share: share(mem_req, mem_alloc),
            pending_replicas: pending_by_target.iter().sum(),
            pending_by_target,
            pending_replica_seconds: self.pending_s.iter().sum(),
            pending_replica_seconds_by_target: self.pending_s.clone(),
            deferred_resizes: deferred,
            nodes,
        };
        tracing::trace!(
            step,
            cpu_requested_share = self.occupancy.cpu_requested_share,
            memory_requested_share = self.occupancy.memory_requested_share,
            pending = self.occupancy.pending_replicas,
            "cluster: occupancy"
        );
    }
}

/// A replica's claim on its node's unrequested CPU: (app, replica, weight = CPU request,
/// possible burst in cores, bursting in this step).
type BurstClaim = (usize, usize, f64, f64, bool);

/// kube-scheduler's LeastAllocated score of a node with `requested` (its requests including the
/// pod's) out of `allocatable`, CPU and memory weighted 1 each, integer arithmetic as upstream:
/// per resource `(allocatable − requested) · 100 / allocatable` (0 when nothing is allocatable
/// or the request exceeds it), then the weighted mean, rounded down.
pub fn least_allocated_score(requested: [u64; 2], allocatable: [u64; 2]) -> u128 {
    let one = |req: u64, cap: u64| -> u128 {
        if cap == 0 || req > cap {
            0
        } else {
            u128::from(cap - req) * MAX_NODE_SCORE / u128::from(cap)
        }
    };
    (one(requested[0], allocatable[0]) + one(requested[1], allocatable[1])) / 2
}

/// Weighted water-filling of `pool` over claimants with weights `w` (> 0) and caps `cap` (≥ 0):
/// each gets `min(cap, w · level)` with the level set so the pool is used up or every cap met.
/// Deterministic: claimants are raised in order of `cap / w` (ties by index).
pub fn water_fill(pool: f64, w: &[f64], cap: &[f64]) -> Vec<f64> {
    let n = w.len().min(cap.len());
    let mut out = vec![0.0; n];
    let mut order: Vec<usize> = (0..n).collect();
    let ratio = |k: usize| cap[k] / w[k].max(1e-12);
    order.sort_by(|&a, &b| ratio(a).total_cmp(&ratio(b)).then(a.cmp(&b)));
    let mut left = pool.max(0.0);
    let mut weight: f64 = order.iter().map(|&k| w[k].max(1e-12)).sum();
    for (pos, &k) in order.iter().enumerate() {
        let wk = w[k].max(1e-12);
        let level = if weight > 0.0 { left / weight } else { 0.0 };
        if ratio(k) <= level {
            out[k] = cap[k];
            left -= cap[k];
            weight -= wk;
        } else {
            for &m in &order[pos..] {
                out[m] = w[m].max(1e-12) * level;
            }
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-computed LeastAllocated case: node A 4000 m / 8 GiB with 1000 m / 1 GiB
    /// requested, node B 4000 m / 8 GiB with 500 m / 6 GiB requested; a 1000 m / 1 GiB pod scores
    /// A: cpu (4000−2000)·100/4000 = 50, mem (8−2)·100/8 = 75 → 62; B: cpu (4000−1500)·100/4000 = 62,
    /// mem (8−7)·100/8 = 12 → 37. A wins though B has more free CPU.
    #[test]
    fn least_allocated_scores_as_upstream() {
        const GIB: u64 = 1 << 30;
        assert_eq!(least_allocated_score([2000, 2 * GIB], [4000, 8 * GIB]), 62);
        assert_eq!(least_allocated_score([1500, 7 * GIB], [4000, 8 * GIB]), 37);
        assert_eq!(least_allocated_score([5000, GIB], [4000, 8 * GIB]), 43);
        assert_eq!(least_allocated_score([0, 0], [0, 8 * GIB]), 50);
    }

    #[test]
    fn water_filling_meets_small_claims_and_splits_the_rest_by_weight() {
        // pool 3: claimant 0 (weight 1, cap 0.5) is met; 1 and 2 (weights 1 and 2, caps 5) share
        // the 2.5 left in proportion 1:2
        let got = water_fill(3.0, &[1.0, 1.0, 2.0], &[0.5, 5.0, 5.0]);
        assert!((got[0] - 0.5).abs() < 1e-12, "{got:?}");
        assert!((got[1] - 2.5 / 3.0).abs() < 1e-12, "{got:?}");
        assert!((got[2] - 5.0 / 3.0).abs() < 1e-12, "{got:?}");
        // enough for all: every cap
        assert_eq!(water_fill(20.0, &[1.0, 2.0], &[1.0, 3.0]), vec![1.0, 3.0]);
        assert_eq!(water_fill(0.0, &[1.0], &[1.0]), vec![0.0]);
    }

    #[test]
    fn the_config_refuses_unknown_fields_and_empty_nodes() {
        let ok: ClusterConfig = serde_norway::from_str(
            "nodes: 3\nnode_cpu_millicores: 4000\nnode_memory_bytes: 8589934592\nevents:\n- {kind: drain, step: 5, node: node-1}\n- {kind: add, step: 9, cpu_millicores: 8000, memory_bytes: 17179869184}\n",
        )
        .unwrap();
        assert_eq!(ok.events.len(), 2);
        assert_eq!(ok.events[1].step(), 9);
        assert!(serde_norway::from_str::<ClusterConfig>(
            "nodes: 3\nnode_cpu_millicores: 4000\nnode_memory_bytes: 1\nnode_gpus: 1\n"
        )
        .is_err());
        assert!(serde_norway::from_str::<ClusterConfig>(
            "nodes: 1\nnode_cpu_millicores: 1\nnode_memory_bytes: 1\nevents:\n- {kind: drain, step: 5, node: node-1, force: true}\n"
        )
        .is_err());
        let drain = |node: &str, step| NodeEvent::Drain {
            step,
            node: node.into(),
        };
        let mut c = ClusterConfig::uniform(2, 1, 1);
        c.events = vec![drain("node-2", 3)];
        assert!(c.validate().unwrap_err().to_string().contains("node-2"));
        c.events.push(NodeEvent::Add {
            step: 1,
            cpu_millicores: 1,
            memory_bytes: 1,
        });
        assert!(c.validate().is_ok(), "added before the drain");
        c.events.push(drain("node-02", 3));
        assert!(c.validate().is_err());
        assert!(ClusterConfig::uniform(2, 0, 1).validate().is_err());
        assert!(ClusterConfig::uniform(2, 1, 1).validate().is_ok());
    }
}

/// The shared cluster through the environment.
#[cfg(test)]
mod env_tests {
    use super::*;
    use crate::app::{Allocation, AppSpec, Bounds, SegmentSpec, Slo, VerticalMode, MIB};
    use crate::env::{Observation, SimConfig, SimEnv, TargetAction};
    use crate::load::LoadSpec;
    use crate::segments::SegmentKind;
    use aware_mdp::{ControlledValues, CpuLimit, LimitsPolicy};

    const GIB: u64 = 1024 * MIB;

    fn alloc(replicas: u32, cpu_millicores: u32, mem_mib: u64) -> Allocation {
        Allocation {
            replicas,
            cpu_millicores,
            memory_bytes: mem_mib * MIB,
        }
    }

    /// A float-ops app (0.101 core-s per request, one core per request) at `rps`.
    fn app(name: &str, initial: Allocation, rps: f64) -> AppSpec {
        AppSpec {
            name: name.into(),
            namespace: "sim".into(),
            segments: vec![SegmentSpec {
                kind: SegmentKind::FloatOps,
                payload: SegmentKind::FloatOps.default_payload(),
            }],
            slo: Slo {
                latency_p99_ms: Some(500.0),
                throughput_rps: None,
                objective: None,
            },
            alpha: 0.5,
            bounds: Bounds::default(),
            initial,
            vertical: VerticalMode::InPlace,
            timeout_s: 30.0,
            load: LoadSpec::constant(rps),
        }
    }

    fn env(apps: Vec<AppSpec>, cluster: Option<ClusterConfig>) -> SimEnv {
        SimEnv::new(
            apps,
            SimConfig {
                seed: 5,
                cluster,
                ..SimConfig::default()
            },
        )
        .unwrap()
    }

    fn nodes_of(e: &SimEnv, i: usize) -> Vec<Option<usize>> {
        e.target(i)
            .unwrap()
            .replicas()
            .iter()
            .map(|r| r.node)
            .collect()
    }

    /// Hand-computed (module `tests` above has the scores): A (1000 m, 512 MiB) goes to node-0
    /// (tie, lowest index); B (500 m, 3072 MiB) scores 37 on node-0 and 56 on node-1: node-1; C
    /// (1000 m, 512 MiB) scores 62 on node-0 and 37 on node-1: node-0, although node-1 has more
    /// free CPU (3500 m against 3000 m).
    #[test]
    fn placement_picks_the_least_allocated_node() {
        let e = env(
            vec![
                app("a", alloc(1, 1000, 512), 1.0),
                app("b", alloc(1, 500, 3072), 1.0),
                app("c", alloc(1, 1000, 512), 1.0),
            ],
            Some(ClusterConfig::uniform(2, 4000, 4 * GIB)),
        );
        assert_eq!(nodes_of(&e, 0), vec![Some(0)]);
        // nothing waits at reset
        assert!((0..3).all(|i| e.observe(i).unwrap().metrics.ready_replicas == 1));
        assert_eq!(nodes_of(&e, 1), vec![Some(1)]);
        assert_eq!(nodes_of(&e, 2), vec![Some(0)]);
        // node-0: [2000, 1024 MiB] → (50 + 75) / 2 = 62; node-1: [1500, 3584 MiB] → (62 + 12) / 2
        assert_eq!(
            least_allocated_score([2000, 1024 * MIB], [4000, 4 * GIB]),
            62
        );
        assert_eq!(
            least_allocated_score([1500, 3584 * MIB], [4000, 4 * GIB]),
            37
        );
        let o = e.cluster_occupancy().unwrap();
        assert_eq!(o.nodes[0].cpu_requested_millicores, 2000);
        assert_eq!(o.nodes[1].memory_requested_bytes, 3072 * MIB);
    }

    /// One 2-core node: scaled to 4 replicas of 1 core, 2 are Pending: never ready, serving
    /// nothing (the throughput of 2 replicas), and their wait grows by 2 × 10 s a step; a new
    /// node takes them, ready after the cold start.
    #[test]
    fn a_replica_that_fits_nowhere_is_pending_and_its_wait_grows() {
        let a = app("a", alloc(1, 1000, 512), 40.0);
        let mut e = env(
            vec![a.clone()],
            Some(ClusterConfig::uniform(1, 2000, 4 * GIB)),
        );
        let four = TargetAction::Desired(alloc(4, 1000, 512));
        let mut reference = env(vec![a], None);
        let two = TargetAction::Desired(alloc(2, 1000, 512));
        let mut last = None;
        for k in 1..=3u32 {
            let o = e.step(&[four]).unwrap().remove(0);
            let r = reference.step(&[two]).unwrap().remove(0);
            let occ = e.cluster_occupancy().unwrap();
            assert_eq!(o.metrics.replicas, 4);
            assert_eq!(o.metrics.pending_replicas, 2, "{o:?}");
            assert_eq!(occ.pending_replicas, 2);
            assert_eq!(occ.pending_by_target, vec![2]);
            assert!((occ.pending_replica_seconds - 20.0 * f64::from(k)).abs() < 1e-9);
            assert_eq!(
                occ.pending_replica_seconds_by_target,
                vec![20.0 * f64::from(k)]
            );
            assert!((occ.cpu_requested_share - 1.0).abs() < 1e-12);
            assert!(o.metrics.ready_replicas <= 2);
            // the 2 bound replicas serve what 2 replicas serve alone
            assert_eq!(o.metrics.throughput_rps, r.metrics.throughput_rps);
            assert_eq!(o.metrics.p99_ms, r.metrics.p99_ms);
            last = Some(o);
        }
        let pending_ids: Vec<u64> = e
            .target(0)
            .unwrap()
            .replicas()
            .iter()
            .filter(|r| r.pending_since.is_some())
            .map(|r| r.id)
            .collect();
        assert_eq!(pending_ids.len(), 2);
        // the longest-waiting first: a 1-core node takes one of them
        let name = e.add_node(1000, 4 * GIB).unwrap();
        assert_eq!(name, "node-1");
        let t = e.target(0).unwrap();
        assert_eq!(t.replicas().iter().filter(|r| r.node == Some(1)).count(), 1);
        assert_eq!(e.cluster_occupancy().unwrap().pending_replicas, 1);
        let o = e.step(&[four]).unwrap().remove(0);
        // bound at the start of the step: ready after the cold start (2 s of a 10 s step)
        assert_eq!(o.metrics.ready_replicas, 3);
        assert!(o.metrics.throughput_rps > last.unwrap().metrics.throughput_rps);
        assert!((e.cluster_occupancy().unwrap().pending_replica_seconds - 70.0).abs() < 1e-9);
        // scaling down deletes the Pending replica first
        let _ = e
            .step(&[TargetAction::Desired(alloc(3, 1000, 512))])
            .unwrap();
        assert!(e
            .target(0)
            .unwrap()
            .replicas()
            .iter()
            .all(|r| r.pending_since.is_none() && r.node.is_some()));
    }

    /// Draining node-0 (from the config at step 3, and from code) evicts its replicas: new
    /// pods, not ready for the cold start, on the nodes left; what fits nowhere is Pending.
    #[test]
    fn a_drain_evicts_and_reschedules() {
        let mut cfg = ClusterConfig::uniform(3, 4000, 8 * GIB);
        cfg.events.push(NodeEvent::Drain {
            step: 3,
            node: "node-0".into(),
        });
        let apps = vec![
            app("a", alloc(3, 1000, 512), 20.0),
            app("b", alloc(3, 1000, 512), 20.0),
        ];
        let mut e = env(apps, Some(cfg));
        // spread: 2 replicas per node
        let per_node = |e: &SimEnv| -> Vec<u32> {
            e.cluster_occupancy()
                .unwrap()
                .nodes
                .iter()
                .map(|n| n.replicas)
                .collect()
        };
        assert_eq!(per_node(&e), vec![2, 2, 2]);
        let hold = [TargetAction::Hold, TargetAction::Hold];
        for _ in 0..3 {
            let _ = e.step(&hold).unwrap();
        }
        let on0: Vec<(usize, u64)> = (0..2)
            .flat_map(|i| {
                e.target(i)
                    .unwrap()
                    .replicas()
                    .iter()
                    .filter(|r| r.node == Some(0))
                    .map(move |r| (i, r.id))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(on0.len(), 2);
        let obs = e.step(&hold).unwrap();
        assert_eq!(per_node(&e), vec![0, 3, 3]);
        let occ = e.cluster_occupancy().unwrap();
        assert!(!occ.nodes[0].schedulable);
        assert_eq!(occ.pending_replicas, 0);
        // requested share over the two schedulable nodes: 6 cores of 8
        assert!((occ.cpu_requested_share - 0.75).abs() < 1e-12);
        for (i, id) in &on0 {
            assert!(e.target(*i).unwrap().replicas().iter().all(|r| r.id != *id));
        }
        let ready: u32 = obs.iter().map(|o| o.metrics.ready_replicas).sum();
        assert_eq!(ready, 6, "restarted within the step");
        let started: f64 = (0..2)
            .flat_map(|i| e.target(i).unwrap().replicas().to_vec())
            .filter(|r| r.ready_at > 0.0)
            .map(|r| r.ready_at)
            .sum();
        // the two new pods started at 30 s, ready after the 2 s cold start
        assert!((started - 2.0 * 32.0).abs() < 1e-9, "{started}");
        // draining node-1 from code: its 3 replicas fit on node-2 only by 1 core: 2 Pending
        e.drain_node("node-1").unwrap();
        let occ = e.cluster_occupancy().unwrap();
        assert_eq!(per_node(&e), vec![0, 0, 4]);
        assert_eq!(occ.pending_replicas, 2);
        assert!(e.drain_node("node-9").is_err());
        let mut plain = env(vec![app("a", alloc(1, 1000, 512), 1.0)], None);
        assert!(plain.drain_node("node-0").is_err());
        assert!(plain.cluster_occupancy().is_none());
    }

    /// Apps without a CPU limit, each replica allowed twice its request (headroom 1), on
    /// `cluster`.
    fn bursting(cluster: Option<ClusterConfig>) -> SimConfig {
        SimConfig {
            seed: 9,
            cluster,
            node_share: crate::cluster::NodeShare {
                burst_headroom: 1.0,
                ..crate::cluster::NodeShare::default()
            },
            limits: LimitsPolicy {
                controlled_values: ControlledValues::RequestsAndLimits,
                cpu_limit: CpuLimit::Unset,
            },
            ..SimConfig::default()
        }
    }

    /// Two apps without a CPU limit (headroom 1: each may use 2 cores on a 1-core request) on
    /// one 3-core node share its 1 unrequested core: each gets 1.5 cores and serves less, at a
    /// higher p99, than alone on the same node, where it gets both cores (and exactly what it
    /// gets without a shared cluster).
    #[test]
    fn co_located_bursting_apps_get_less_cpu_than_each_alone() {
        let cfg = bursting;
        let node = || Some(ClusterConfig::uniform(1, 3000, 8 * GIB));
        let a = app("a", alloc(1, 1000, 1024), 25.0);
        let b = app("b", alloc(1, 1000, 1024), 25.0);
        let run = |apps: Vec<AppSpec>, cluster| {
            let mut e = SimEnv::new(apps.clone(), cfg(cluster)).unwrap();
            let hold = vec![TargetAction::Hold; apps.len()];
            let mut last = Vec::new();
            for _ in 0..5 {
                last = e.step(&hold).unwrap();
            }
            let caps: Vec<f64> = e
                .targets()
                .iter()
                .map(|t| t.replicas()[0].burst_cap)
                .collect();
            (last, caps)
        };
        let (alone, cap_alone) = run(vec![a.clone()], node());
        let (unlimited, _) = run(vec![a.clone()], None);
        let (shared, caps) = run(vec![a, b], node());
        assert_eq!(cap_alone, vec![f64::INFINITY]);
        assert_eq!(caps, vec![0.5, 0.5]);
        let m = |o: &Observation| o.metrics;
        assert_eq!(m(&alone[0]), m(&unlimited[0]), "alone = no shared cluster");
        for o in &shared {
            assert!(
                m(o).throughput_rps < 0.8 * m(&alone[0]).throughput_rps,
                "{:?} vs {:?}",
                m(o),
                m(&alone[0])
            );
            assert!(m(o).p99_ms > m(&alone[0]).p99_ms);
            assert!((m(o).cpu_usage_cores - 1.5).abs() < 0.05, "{:?}", m(o));
        }
        assert!((m(&alone[0]).cpu_usage_cores - 2.0).abs() < 0.05);
    }

    /// A bursting app takes the idle one's share: only when its need exceeds its request does a
    /// replica count as bursting; the pool goes to it first.
    #[test]
    fn an_idle_neighbour_leaves_the_burst_to_the_busy_one() {
        let cfg = bursting(Some(ClusterConfig::uniform(1, 3000, 8 * GIB)));
        let apps = vec![
            app("busy", alloc(1, 1000, 1024), 25.0),
            app("idle", alloc(1, 1000, 1024), 1.0),
        ];
        let mut e = SimEnv::new(apps, cfg).unwrap();
        let _ = e.step(&[TargetAction::Hold; 2]).unwrap();
        let caps: Vec<f64> = e
            .targets()
            .iter()
            .map(|t| t.replicas()[0].burst_cap)
            .collect();
        // the busy one's whole burst (1 core) is met: no cap; the idle one gets nothing
        assert_eq!(caps, vec![f64::INFINITY, 0.0]);
    }

    /// On a node whose CPU is all requested, nothing is unrequested to lend: the busy app gets
    /// no burst. With `lend_idle`, the idle neighbour's unused request is lent (CFS), and the
    /// busy one bursts into it and serves more.
    #[test]
    fn lending_idle_cpu_lets_the_busy_one_burst_on_a_fully_requested_node() {
        let run = |lend_idle: bool| {
            let cfg = bursting(Some(ClusterConfig {
                lend_idle,
                ..ClusterConfig::uniform(1, 2000, 8 * GIB)
            }));
            let apps = vec![
                app("busy", alloc(1, 1000, 1024), 25.0),
                app("idle", alloc(1, 1000, 1024), 1.0),
            ];
            let mut e = SimEnv::new(apps, cfg).unwrap();
            let mut last = Vec::new();
            for _ in 0..5 {
                last = e.step(&[TargetAction::Hold; 2]).unwrap();
            }
            let cap = e.targets()[0].replicas()[0].burst_cap;
            (cap, last[0].metrics.cpu_usage_cores)
        };
        let (cap, used) = run(false);
        assert_eq!(cap, 0.0, "a fully requested node has nothing unrequested");
        assert!(used <= 1.0 + 1e-9, "{used}");
        let (cap, lent) = run(true);
        assert!(cap > 0.5, "the idle request is lent: {cap}");
        assert!(lent > used + 0.4, "{lent} vs {used}");
    }

    /// Per-node and cluster figures are the sums of the replicas' requests.
    #[test]
    fn occupancy_matches_hand_sums() {
        let apps = vec![
            app("a", alloc(3, 700, 300), 5.0),
            app("b", alloc(5, 300, 1000), 5.0),
            app("c", alloc(2, 1500, 2000), 5.0),
        ];
        let mut e = env(apps, Some(ClusterConfig::uniform(3, 2000, 3 * GIB)));
        // at reset: 3 × 0.7 + 5 × 0.3 + 2 × 1.5 = 6.6 cores asked of 6; the reset observation
        // shows who waits
        let at_reset: u32 = (0..3)
            .map(|i| e.observe(i).unwrap().metrics.pending_replicas)
            .sum();
        assert_eq!(at_reset, e.cluster_occupancy().unwrap().pending_replicas);
        assert!(at_reset > 0);
        let ready: u32 = (0..3)
            .map(|i| e.observe(i).unwrap().metrics.ready_replicas)
            .sum();
        assert_eq!(ready + at_reset, 10);
        for k in 0..6u32 {
            let acts = [
                TargetAction::Desired(alloc(1 + k % 4, 700, 300)),
                TargetAction::Hold,
                TargetAction::Desired(alloc(2 + k % 3, 1500, 2000)),
            ];
            let obs = e.step(&acts).unwrap();
            let occ = e.cluster_occupancy().unwrap().clone();
            let mut cpu = [0u64; 3];
            let mut mem = [0u64; 3];
            let mut pending = 0u32;
            for i in 0..3 {
                for r in e.target(i).unwrap().replicas() {
                    match r.node {
                        Some(n) => {
                            cpu[n] += (r.cpu_request * 1000.0).round() as u64;
                            mem[n] += r.mem_request as u64;
                        }
                        None => pending += 1,
                    }
                }
            }
            for n in 0..3 {
                assert_eq!(occ.nodes[n].cpu_requested_millicores, cpu[n]);
                assert_eq!(occ.nodes[n].memory_requested_bytes, mem[n]);
                assert!(cpu[n] <= 2000 && mem[n] <= 3 * GIB);
            }
            let want_cpu = cpu.iter().sum::<u64>() as f64 / 6000.0;
            let want_mem = mem.iter().sum::<u64>() as f64 / (9 * GIB) as f64;
            assert!((occ.cpu_requested_share - want_cpu).abs() < 1e-12);
            assert!((occ.memory_requested_share - want_mem).abs() < 1e-12);
            assert_eq!(occ.pending_replicas, pending);
            let from_metrics: u32 = obs.iter().map(|o| o.metrics.pending_replicas).sum();
            assert_eq!(from_metrics, pending);
            assert_eq!(occ.step, u64::from(k));
        }
        // 3 of "c" at 1.5 cores need 3 nodes' worth of CPU with "a" and "b" there: some wait
        assert!(e.cluster_occupancy().unwrap().pending_replica_seconds > 0.0);
    }

    /// A vertical scale-up that does not fit its node is deferred (the replica keeps what was
    /// admitted) and applied once the node has room.
    #[test]
    fn a_resize_that_does_not_fit_waits_for_room() {
        let apps = vec![
            app("a", alloc(1, 1000, 512), 5.0),
            app("b", alloc(1, 1000, 512), 5.0),
        ];
        let mut e = env(apps, Some(ClusterConfig::uniform(1, 2500, 4 * GIB)));
        let big = TargetAction::Desired(alloc(1, 2000, 512));
        let _ = e.step(&[big, TargetAction::Hold]).unwrap();
        let r = &e.target(0).unwrap().replicas()[0];
        assert_eq!(r.cpu_request, 1.0, "deferred");
        assert!(r.deferred.is_some());
        assert_eq!(e.cluster_occupancy().unwrap().deferred_resizes, 1);
        // b shrinks: room for a's resize at the next step
        let _ = e
            .step(&[
                TargetAction::Hold,
                TargetAction::Desired(alloc(1, 500, 512)),
            ])
            .unwrap();
        let r = &e.target(0).unwrap().replicas()[0];
        assert_eq!(r.cpu_request, 2.0);
        assert!(r.deferred.is_none());
        assert_eq!(
            e.cluster_occupancy().unwrap().nodes[0].cpu_requested_millicores,
            2500
        );
    }

    /// `restart` mode: the rolling update's new pod is counted beside the old one on the node
    /// until it is ready, then alone; one that does not fit waits while the old pod serves.
    #[test]
    fn a_rolling_restart_holds_both_pods_and_waits_for_room() {
        let mut a = app("a", alloc(1, 1000, 512), 5.0);
        a.vertical = VerticalMode::Restart;
        let mut e = env(
            vec![a.clone(), app("b", alloc(1, 500, 512), 5.0)],
            Some(ClusterConfig::uniform(1, 2500, 4 * GIB)),
        );
        let cpu_on_node =
            |e: &SimEnv| e.cluster_occupancy().unwrap().nodes[0].cpu_requested_millicores;
        // 1000 → 1500 m: the node holds 1500 + 500 during the restart (cold start 2 s: ready
        // within the step), then 1500 + 500
        let _ = e
            .step(&[
                TargetAction::Desired(alloc(1, 1500, 512)),
                TargetAction::Hold,
            ])
            .unwrap();
        assert_eq!(cpu_on_node(&e), 2000);
        let r = &e.target(0).unwrap().replicas()[0];
        assert!(r.pending.is_some() && r.deferred.is_none());
        let _ = e.step(&[TargetAction::Hold; 2]).unwrap();
        assert_eq!(e.target(0).unwrap().replicas()[0].cpu_request, 1.5);
        assert_eq!(cpu_on_node(&e), 2000);
        // 1500 → 2048 m (the bound) does not fit beside b's 500 m: deferred, the old pod keeps
        // serving
        let o = e
            .step(&[
                TargetAction::Desired(alloc(1, 2048, 512)),
                TargetAction::Hold,
            ])
            .unwrap();
        let r = &e.target(0).unwrap().replicas()[0];
        assert!(r.pending.is_none());
        assert_eq!(r.deferred.map(|d| d.cpu_request), Some(2.048));
        assert_eq!(r.cpu_request, 1.5);
        assert_eq!(o[0].metrics.ready_replicas, 1);
        assert_eq!(cpu_on_node(&e), 2000);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Whatever the apps do and the nodes undergo: no node holds more than its allocatable,
        /// a Pending replica is unbound and never ready, the occupancy is the sum of the
        /// replicas, and the metrics stay in range.
        #[test]
        fn nodes_never_overcommit_and_pending_replicas_never_serve(
            seed in 0u64..500, n_apps in 1usize..5, nodes in 1u32..4,
            cpu in 1000u64..8000, mem_gib in 1u64..8, headroom in 0.0f64..1.0,
            acts in proptest::collection::vec((0u32..8, 128u32..2048, 256u64..3072, proptest::bool::ANY), 12),
            drain_at in 0u64..12, add_at in 0u64..12,
        ) {
            let apps = crate::app::generate_apps(n_apps, seed, &crate::app::GeneratorOptions::default());
            let mut cfg = ClusterConfig::uniform(nodes, cpu, mem_gib * GIB);
            cfg.events = vec![
                NodeEvent::Drain { step: drain_at, node: "node-0".into() },
                NodeEvent::Add { step: add_at, cpu_millicores: cpu, memory_bytes: mem_gib * GIB },
            ];
            let mut e = SimEnv::new(apps, SimConfig {
                seed,
                cluster: Some(cfg),
                node_share: crate::cluster::NodeShare { burst_headroom: headroom, ..crate::cluster::NodeShare::default() },
                ..SimConfig::default()
            }).unwrap();
            for (k, (r, c, m, hold)) in acts.into_iter().enumerate() {
                let a: Vec<TargetAction> = (0..n_apps).map(|i| if hold && i % 2 == 0 {
                    TargetAction::Hold
                } else {
                    TargetAction::Desired(alloc(1 + (r + i as u32 * 3) % 8, c, m))
                }).collect();
                let obs = e.step(&a).unwrap();
                let occ = e.cluster_occupancy().unwrap();
                let mut used = vec![[0u64; 2]; occ.nodes.len()];
                let mut pending = 0;
                for i in 0..n_apps {
                    for rep in e.target(i).unwrap().replicas() {
                        match rep.node {
                            Some(n) => {
                                used[n][0] += (rep.cpu_request * 1000.0).round() as u64;
                                used[n][1] += rep.mem_request as u64;
                                proptest::prop_assert!(rep.pending_since.is_none());
                            }
                            None => {
                                pending += 1;
                                proptest::prop_assert!(rep.pending_since.is_some());
                                proptest::prop_assert!(rep.ready_at.is_infinite() && rep.ready_at > 0.0);
                                proptest::prop_assert_eq!(rep.working_set, 0.0);
                            }
                        }
                    }
                }
                proptest::prop_assert_eq!(occ.pending_replicas, pending);
                for (n, a) in occ.nodes.iter().enumerate() {
                    // a rolling restart holds the larger of its two pods: at least the requests
                    proptest::prop_assert!(a.cpu_requested_millicores >= used[n][0]);
                    proptest::prop_assert!(a.cpu_requested_millicores <= a.cpu_allocatable_millicores, "{:?}", a);
                    proptest::prop_assert!(a.memory_requested_bytes <= a.memory_allocatable_bytes, "{:?}", a);
                    if !a.schedulable {
                        proptest::prop_assert_eq!(a.replicas, 0);
                    }
                }
                proptest::prop_assert!((0.0..=1.0).contains(&occ.cpu_requested_share));
                for o in &obs {
                    let m = o.metrics;
                    proptest::prop_assert!(m.ready_replicas + m.pending_replicas <= m.replicas, "{:?}", m);
                    for u in [m.cpu_util, m.memory_util, m.io_util, m.network_util, m.slo_preservation] {
                        proptest::prop_assert!((0.0..=1.0).contains(&u), "{:?}", m);
                    }
                }
                proptest::prop_assert_eq!(occ.step, k as u64);
            }
        }
    }

    /// Same seed, same cluster: the same trajectories and occupancy, bit for bit.
    #[test]
    fn the_shared_cluster_is_deterministic() {
        let run = || {
            let mut cfg = ClusterConfig::uniform(2, 3000, 4 * GIB);
            cfg.events = vec![
                NodeEvent::Drain {
                    step: 4,
                    node: "node-1".into(),
                },
                NodeEvent::Add {
                    step: 8,
                    cpu_millicores: 4000,
                    memory_bytes: 8 * GIB,
                },
            ];
            let apps = vec![
                app("a", alloc(2, 800, 512), 15.0),
                app("b", alloc(2, 800, 512), 15.0),
            ];
            let mut e = SimEnv::new(
                apps,
                SimConfig {
                    seed: 3,
                    cluster: Some(cfg),
                    node_share: crate::cluster::NodeShare {
                        burst_headroom: 0.5,
                        ..crate::cluster::NodeShare::default()
                    },
                    ..SimConfig::default()
                },
            )
            .unwrap();
            (0..12u32)
                .map(|k| {
                    let a = TargetAction::Desired(alloc(1 + k % 5, 800, 512));
                    let o = e.step(&[a, TargetAction::Hold]).unwrap();
                    (o, e.cluster_occupancy().unwrap().clone())
                })
                .collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        assert!(
            a.iter().any(|(_, o)| o.pending_replicas > 0),
            "the drain leaves some Pending"
        );
        assert_eq!(a.last().unwrap().1.nodes.len(), 3);
    }
}
