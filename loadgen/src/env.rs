//! Gym-like environment: state (paper Table 1), action map and reward (DESIGN §3), lock-step
//! virtual time.
//!
//! # State
//! A fixed-order `f32` vector of [`STATE_DIM`] features, each O(1), named by [`STATE_NAMES`]:
//!
//! | # | name | definition |
//! |---|---|---|
//! | 0 | `cpu_limit` | CPU limit per replica / max CPU bound |
//! | 1 | `memory_limit` | memory limit per replica / max memory bound |
//! | 2 | `cpu_util` | CPU usage / Σ CPU limits, in \[0, 1\] |
//! | 3 | `memory_util` | working set / Σ memory limits, in \[0, 1\] |
//! | 4 | `io_util` | disk bandwidth used / available, in \[0, 1\] |
//! | 5 | `network_util` | network bandwidth used / available, in \[0, 1\] |
//! | 6 | `slo_preservation` | SP = min(SLO/measured, 1); with no SLO, min(served/offered, 1) |
//! | 7 | `load_change` | (λ_t − λ_{t−1}) / max(λ_t, λ_{t−1}, 1), in [−1, 1] |
//! | 8 | `replicas` | replicas / max replicas |
//!
//! # Action
//! Three values in [−1, 1]: `[replicas, cpu, memory]` — the paper's action space (Table 1): the
//! number of replicas and the per-replica CPU and memory limits. In the default
//! [`ActionMode::Absolute`] each value names a point of its bound range, and the change from the
//! current allocation is bounded per step (see [`ActionMap`]):
//!
//! * target `x = lo + (a + 1)/2 · (hi − lo)` for replicas, CPU millicores and memory bytes
//! * replicas: `n' = n + clamp(round(x − n), ±max_replica_delta)`
//! * CPU: `c' = c + clamp(x − c, ±cpu_delta_fraction · (max_cpu − min_cpu))`, rounded to a millicore
//! * memory: `m' = m + clamp(x − m, ±memory_delta_fraction · (max_mem − min_mem))`, rounded to a MiB
//!
//! A policy holds an allocation by naming it (an interior action), not by producing exactly 0, so
//! a saturated actor does not walk the workload into a corner of the bounds (measured: DDPG on the
//! delta map ends at 1 or 20 replicas on most apps; ARCHITECTURE.md, *Action space*).
//! [`ActionMode::Delta`] keeps the older map: `n' = n + round(a₀ · max_replica_delta)`,
//! `c' = c + a₁ · cpu_delta_fraction · (max_cpu − min_cpu)`, likewise memory.
//! [`action_for`] is the inverse: the raw action that asks for a given allocation.
//!
//! The result is clamped to the bounds. NaN inputs mean "no change" for that dimension; values
//! outside [−1, 1] are clamped. Every clamp is reported in [`ClampReport`]. Concrete allocations
//! ([`TargetAction::Desired`]) are clamped to the bounds as well.
//!
//! # Reward
//! `r_t = α·SP_t·|R| + (1−α)·(RU_cpu + RU_mem)` with |R| = 2 ([`reward`]), in [0, 2].

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::app::{Allocation, AppSpec, Bounds, MIB};
use crate::cluster::{NodeShare, RawMetrics, TargetSim};
use crate::error::SimError;
use crate::load::LoadModel;
use crate::scenario::Injection;

/// Number of state features.
pub const STATE_DIM: usize = 9;
/// Names of the state features, in vector order.
pub const STATE_NAMES: [&str; STATE_DIM] = [
    "cpu_limit",
    "memory_limit",
    "cpu_util",
    "memory_util",
    "io_util",
    "network_util",
    "slo_preservation",
    "load_change",
    "replicas",
];
/// Number of action dimensions.
pub const ACTION_DIM: usize = 3;

/// How a raw action value is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionMode {
    /// A point of the bound range (the paper's action space); the change per step is bounded.
    #[default]
    Absolute,
    /// A change of the current allocation.
    Delta,
}

/// Mode and per-step scale of the action map.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ActionMap {
    /// How raw values are read.
    #[serde(default)]
    pub mode: ActionMode,
    /// Replicas added/removed at |a₀| = 1.
    pub max_replica_delta: u32,
    /// CPU change at |a₁| = 1, as a fraction of the CPU bound range.
    pub cpu_delta_fraction: f64,
    /// Memory change at |a₂| = 1, as a fraction of the memory bound range.
    pub memory_delta_fraction: f64,
}

impl Default for ActionMap {
    fn default() -> Self {
        ActionMap {
            mode: ActionMode::Absolute,
            max_replica_delta: 4,
            cpu_delta_fraction: 0.25,
            memory_delta_fraction: 0.25,
        }
    }
}

/// What a target is told to do at a step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum TargetAction {
    /// Keep the current allocation.
    Hold,
    /// Raw policy output in [−1, 1]³: `[replicas, cpu, memory]`.
    Raw([f32; ACTION_DIM]),
    /// A concrete desired allocation (fallback HPA/VPA, actuator).
    Desired(Allocation),
}

/// What was clamped while mapping an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ClampReport {
    /// Some raw component was NaN (treated as no change).
    pub nan: bool,
    /// Some raw component was outside [−1, 1] (clamped).
    pub out_of_range: bool,
    /// The resulting allocation was outside the bounds (clamped).
    pub bounded: bool,
}

impl ClampReport {
    /// Whether anything was clamped.
    pub fn any(&self) -> bool {
        self.nan || self.out_of_range || self.bounded
    }
}

/// Map a raw action to a concrete allocation (see the module docs).
pub fn map_action(
    raw: [f32; ACTION_DIM],
    current: Allocation,
    bounds: &Bounds,
    map: &ActionMap,
) -> (Allocation, ClampReport) {
    let mut rep = ClampReport::default();
    let mut a = [0.0f64; ACTION_DIM];
    for (dst, &v) in a.iter_mut().zip(raw.iter()) {
        if v.is_nan() {
            rep.nan = true;
            *dst = 0.0;
        } else if !(-1.0..=1.0).contains(&v) {
            rep.out_of_range = true;
            *dst = f64::from(v.clamp(-1.0, 1.0));
        } else {
            *dst = f64::from(v);
        }
    }
    let cpu_range = (bounds.max_cpu_millicores - bounds.min_cpu_millicores) as f64;
    let mem_range = (bounds.max_memory_bytes - bounds.min_memory_bytes) as f64;
    let max_cpu_step = map.cpu_delta_fraction * cpu_range;
    let max_mem_step = map.memory_delta_fraction * mem_range;
    let (cur_r, cur_c, cur_m) = (
        current.replicas as f64,
        current.cpu_millicores as f64,
        current.memory_bytes as f64,
    );
    let (replicas, cpu, mem_bytes) = match map.mode {
        ActionMode::Delta => (
            cur_r + (a[0] * map.max_replica_delta as f64).round(),
            cur_c + (a[1] * max_cpu_step).round(),
            cur_m + a[2] * max_mem_step,
        ),
        ActionMode::Absolute => {
            // NaN (a = 0 above) means "no change", not the middle of the range
            let point = |i: usize, lo: f64, hi: f64, cur: f64| {
                if raw[i].is_nan() {
                    cur
                } else {
                    lo + (a[i] + 1.0) / 2.0 * (hi - lo)
                }
            };
            let step = |x: f64, cur: f64, max: f64| cur + (x - cur).clamp(-max, max);
            let r = point(
                0,
                f64::from(bounds.min_replicas),
                f64::from(bounds.max_replicas),
                cur_r,
            );
            let c = point(
                1,
                f64::from(bounds.min_cpu_millicores),
                f64::from(bounds.max_cpu_millicores),
                cur_c,
            );
            let m = point(
                2,
                bounds.min_memory_bytes as f64,
                bounds.max_memory_bytes as f64,
                cur_m,
            );
            let dr = map.max_replica_delta as f64;
            (
                step(r.round(), cur_r, dr),
                step(c, cur_c, max_cpu_step).round(),
                step(m, cur_m, max_mem_step),
            )
        }
    };
    let mem_mib = mem_bytes / MIB as f64;
    let unclamped = Allocation {
        replicas: replicas.clamp(0.0, u32::MAX as f64) as u32,
        cpu_millicores: cpu.clamp(0.0, u32::MAX as f64) as u32,
        memory_bytes: (mem_mib.round().max(0.0) as u64) * MIB,
    };
    let (alloc, bounded) = bounds.clamp(unclamped);
    // memory rounding to a MiB alone is not a bounds clamp
    rep.bounded = bounded
        && (unclamped.replicas != alloc.replicas
            || unclamped.cpu_millicores != alloc.cpu_millicores
            || unclamped.memory_bytes != alloc.memory_bytes);
    (alloc, rep)
}

/// The raw action that asks for `desired` from `current` under `map`: the inverse of
/// [`map_action`] (exact up to rounding while `desired` is inside the bounds and, for
/// [`ActionMode::Delta`], within one step's reach), clamped to [−1, 1]. Used to express a
/// fallback's decisions as behaviour actions in the policy's action space.
pub fn action_for(
    desired: Allocation,
    current: Allocation,
    bounds: &Bounds,
    map: &ActionMap,
) -> [f32; ACTION_DIM] {
    let unit = |x: f64| {
        if x.is_finite() {
            x.clamp(-1.0, 1.0) as f32
        } else {
            0.0
        }
    };
    let cpu_range = (bounds
        .max_cpu_millicores
        .saturating_sub(bounds.min_cpu_millicores) as f64)
        .max(1.0);
    let mem_range = (bounds
        .max_memory_bytes
        .saturating_sub(bounds.min_memory_bytes) as f64)
        .max(1.0);
    match map.mode {
        ActionMode::Absolute => {
            let rep_range =
                (bounds.max_replicas.saturating_sub(bounds.min_replicas) as f64).max(1.0);
            let point = |x: f64, lo: f64, range: f64| unit(2.0 * (x - lo) / range - 1.0);
            [
                point(
                    f64::from(desired.replicas),
                    f64::from(bounds.min_replicas),
                    rep_range,
                ),
                point(
                    f64::from(desired.cpu_millicores),
                    f64::from(bounds.min_cpu_millicores),
                    cpu_range,
                ),
                point(
                    desired.memory_bytes as f64,
                    bounds.min_memory_bytes as f64,
                    mem_range,
                ),
            ]
        }
        ActionMode::Delta => [
            unit(
                (f64::from(desired.replicas) - f64::from(current.replicas))
                    / f64::from(map.max_replica_delta.max(1)),
            ),
            unit(
                (f64::from(desired.cpu_millicores) - f64::from(current.cpu_millicores))
                    / (map.cpu_delta_fraction * cpu_range),
            ),
            unit(
                (desired.memory_bytes as f64 - current.memory_bytes as f64)
                    / (map.memory_delta_fraction * mem_range),
            ),
        ],
    }
}

/// The range of [`reward`]: `[0, 2]` (SP, RU_cpu, RU_mem each in [0, 1], α in [0, 1]).
pub const REWARD_RANGE: [f64; 2] = [0.0, 2.0];

/// The paper's reward: `α·SP·|R| + (1−α)·(RU_cpu + RU_mem)`, |R| = 2.
pub fn reward(alpha: f64, slo_preservation: f64, cpu_util: f64, memory_util: f64) -> f64 {
    alpha * slo_preservation * 2.0 + (1.0 - alpha) * (cpu_util + memory_util)
}

/// Build the state vector from the metrics of a step.
pub fn state_vector(
    m: &RawMetrics,
    prev_offered: Option<f64>,
    bounds: &Bounds,
) -> [f32; STATE_DIM] {
    let load_change = match prev_offered {
        Some(p) => {
            let d = (m.offered_rps - p) / m.offered_rps.max(p).max(1.0);
            d.clamp(-1.0, 1.0)
        }
        None => 0.0,
    };
    [
        (m.cpu_limit_cores * 1000.0 / bounds.max_cpu_millicores as f64) as f32,
        (m.memory_limit_bytes / bounds.max_memory_bytes as f64) as f32,
        m.cpu_util as f32,
        m.memory_util as f32,
        m.io_util as f32,
        m.network_util as f32,
        m.slo_preservation as f32,
        load_change as f32,
        (m.replicas as f64 / bounds.max_replicas as f64) as f32,
    ]
}

/// Identity of a target.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TargetRef {
    /// Namespace.
    pub namespace: String,
    /// Deployment name.
    pub name: String,
}

/// What the environment reports for one target after a step (or at reset).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Target.
    pub target: TargetRef,
    /// Step these metrics describe (0-based; at reset: 0 with idle metrics).
    pub step: u64,
    /// State vector, see [`STATE_NAMES`].
    pub state: [f32; STATE_DIM],
    /// Raw metrics behind the state.
    pub metrics: RawMetrics,
    /// Reward of the action applied for this step.
    pub reward: f64,
    /// Allocation in force during the step.
    pub allocation: Allocation,
    /// What was clamped when mapping the action.
    pub clamp: ClampReport,
}

/// Simulation configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// Control step length, simulated seconds.
    pub step_seconds: f64,
    /// Seed of all noise.
    pub seed: u64,
    /// Action map.
    pub action_map: ActionMap,
    /// Per-replica disk/network bandwidth.
    pub node_share: NodeShare,
    /// Scheduled instability scenarios.
    pub injections: Vec<Injection>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            step_seconds: 10.0,
            seed: 0,
            action_map: ActionMap::default(),
            node_share: NodeShare::default(),
            injections: Vec::new(),
        }
    }
}

/// The environment: one [`TargetSim`] per app, stepped together.
#[derive(Debug, Clone)]
pub struct SimEnv {
    apps: Vec<Arc<AppSpec>>,
    loads: Vec<Arc<LoadModel>>,
    targets: Vec<TargetSim>,
    refs: Vec<TargetRef>,
    cfg: SimConfig,
    step: u64,
}

impl SimEnv {
    /// Build from apps (loads resolved, traces read) and a config; targets start at reset state
    /// with `cfg.seed`.
    pub fn new(apps: Vec<AppSpec>, cfg: SimConfig) -> Result<Self, SimError> {
        let mut loads = Vec::with_capacity(apps.len());
        let mut arcs = Vec::with_capacity(apps.len());
        for app in apps {
            app.validate()?;
            let model = crate::cluster::AppModel::from_app(&app);
            let b = app.bounds;
            let cap = b.max_replicas as f64
                * model.replica_capacity_rps(b.max_cpu_millicores as f64 / 1000.0);
            loads.push(Arc::new(LoadModel::resolve(&app.load.pattern, cap)?));
            arcs.push(Arc::new(app));
        }
        Self::with_loads(arcs, loads, cfg)
    }

    /// Build from apps with already resolved loads (e.g. a shared in-memory trace).
    pub fn with_loads(
        apps: Vec<Arc<AppSpec>>,
        loads: Vec<Arc<LoadModel>>,
        cfg: SimConfig,
    ) -> Result<Self, SimError> {
        if apps.len() != loads.len() {
            return Err(SimError::Config(format!(
                "{} apps but {} loads",
                apps.len(),
                loads.len()
            )));
        }
        for inj in &cfg.injections {
            if !apps.iter().any(|a| a.name == inj.target) {
                return Err(SimError::UnknownTarget(inj.target.clone()));
            }
        }
        let refs = apps
            .iter()
            .map(|a| TargetRef {
                namespace: a.namespace.clone(),
                name: a.name.clone(),
            })
            .collect();
        let mut env = SimEnv {
            apps,
            loads,
            targets: Vec::new(),
            refs,
            step: 0,
            cfg,
        };
        env.reset(env.cfg.seed)?;
        Ok(env)
    }

    /// Reset every target to its initial allocation with a new seed; returns the initial
    /// observations (idle metrics, reward 0).
    pub fn reset(&mut self, seed: u64) -> Result<Vec<Observation>, SimError> {
        self.cfg.seed = seed;
        self.step = 0;
        self.targets = self
            .apps
            .iter()
            .zip(self.loads.iter())
            .enumerate()
            .map(|(i, (a, l))| {
                TargetSim::new(
                    a.clone(),
                    l.clone(),
                    self.cfg.step_seconds,
                    seed,
                    i as u64,
                    self.cfg.node_share,
                )
            })
            .collect::<Result<_, _>>()?;
        (0..self.targets.len()).map(|i| self.observe(i)).collect()
    }

    /// Number of targets.
    pub fn len(&self) -> usize {
        self.targets.len()
    }
    /// Whether there are no targets.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }
    /// Config.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }
    /// Index of the next step.
    pub fn step_index(&self) -> u64 {
        self.step
    }
    /// Target references in index order.
    pub fn target_refs(&self) -> &[TargetRef] {
        &self.refs
    }
    /// Index of a target by name.
    pub fn index_of(&self, name: &str) -> Result<usize, SimError> {
        self.refs
            .iter()
            .position(|r| r.name == name || format!("{}/{}", r.namespace, r.name) == name)
            .ok_or_else(|| SimError::UnknownTarget(name.into()))
    }
    /// A target.
    pub fn target(&self, i: usize) -> Result<&TargetSim, SimError> {
        self.targets
            .get(i)
            .ok_or_else(|| SimError::UnknownTarget(format!("#{i}")))
    }
    /// A target, mutably (e.g. to enable the histogram).
    pub fn target_mut(&mut self, i: usize) -> Result<&mut TargetSim, SimError> {
        self.targets
            .get_mut(i)
            .ok_or_else(|| SimError::UnknownTarget(format!("#{i}")))
    }
    /// All targets.
    pub fn targets(&self) -> &[TargetSim] {
        &self.targets
    }

    /// The latest observation of target `i` (reward recomputed from its last metrics; at reset
    /// idle metrics and reward 0).
    pub fn observe(&self, i: usize) -> Result<Observation, SimError> {
        let t = self.target(i)?;
        let r = self
            .refs
            .get(i)
            .ok_or_else(|| SimError::UnknownTarget(format!("#{i}")))?;
        Ok(observation(r, t, ClampReport::default()))
    }

    /// Resolve an action for target `i` to a concrete allocation.
    pub fn resolve_action(
        &self,
        i: usize,
        action: &TargetAction,
    ) -> Result<(Allocation, ClampReport), SimError> {
        let t = self.target(i)?;
        Ok(resolve(t, action, &self.cfg.action_map))
    }

    /// Step every target with one action each (lock-step). Returns one observation per target.
    pub fn step(&mut self, actions: &[TargetAction]) -> Result<Vec<Observation>, SimError> {
        if actions.len() != self.targets.len() {
            return Err(SimError::ActionCount {
                expected: self.targets.len(),
                got: actions.len(),
            });
        }
        self.inject_due()?;
        let map = self.cfg.action_map;
        let mut out = Vec::with_capacity(self.targets.len());
        for ((t, a), r) in self.targets.iter_mut().zip(actions).zip(&self.refs) {
            out.push(step_target(t, r, a, &map));
        }
        self.step += 1;
        Ok(out)
    }

    /// Step every target, writing only rewards into `rewards` (allocation-free hot path for
    /// benchmarks and training loops that read state via [`SimEnv::observe`]).
    pub fn step_rewards(
        &mut self,
        actions: &[TargetAction],
        rewards: &mut Vec<f64>,
    ) -> Result<(), SimError> {
        if actions.len() != self.targets.len() {
            return Err(SimError::ActionCount {
                expected: self.targets.len(),
                got: actions.len(),
            });
        }
        self.inject_due()?;
        let map = self.cfg.action_map;
        rewards.clear();
        for (t, a) in self.targets.iter_mut().zip(actions) {
            let (alloc, _) = resolve(t, a, &map);
            if alloc != t.allocation() {
                t.apply(alloc);
            }
            let m = t.advance();
            rewards.push(reward(
                t.app().alpha,
                m.slo_preservation,
                m.cpu_util,
                m.memory_util,
            ));
        }
        self.step += 1;
        Ok(())
    }

    fn inject_due(&mut self) -> Result<(), SimError> {
        for i in 0..self.targets.len() {
            let (cfg, refs, targets) = (&self.cfg, &self.refs, &mut self.targets);
            inject_due_into(cfg, self.step, &refs[i].name, i, &mut targets[i])?;
        }
        Ok(())
    }

    /// The state of target `i` as the next step will see it: a clone with the injections due
    /// at the next step applied (used by the oracle).
    pub fn target_at_next_step(&self, i: usize) -> Result<TargetSim, SimError> {
        let mut t = self.target(i)?.clone();
        inject_due_into(&self.cfg, self.step, &self.refs[i].name, i, &mut t)?;
        Ok(t)
    }
}

fn inject_due_into(
    cfg: &SimConfig,
    step: u64,
    name: &str,
    index: usize,
    t: &mut TargetSim,
) -> Result<(), SimError> {
    for inj in cfg
        .injections
        .iter()
        .filter(|inj| inj.step == step && inj.target == name)
    {
        let s = cfg.seed ^ step.rotate_left(17) ^ index as u64;
        inj.scenario.inject(t, s)?;
    }
    Ok(())
}

fn resolve(t: &TargetSim, action: &TargetAction, map: &ActionMap) -> (Allocation, ClampReport) {
    let bounds = t.app().bounds;
    match action {
        TargetAction::Hold => (t.allocation(), ClampReport::default()),
        TargetAction::Raw(raw) => map_action(*raw, t.allocation(), &bounds, map),
        TargetAction::Desired(d) => {
            let (a, bounded) = bounds.clamp(*d);
            (
                a,
                ClampReport {
                    bounded,
                    ..ClampReport::default()
                },
            )
        }
    }
}

/// Apply an action to a target and advance it one step.
pub fn step_target(
    t: &mut TargetSim,
    r: &TargetRef,
    action: &TargetAction,
    map: &ActionMap,
) -> Observation {
    let (alloc, clamp) = resolve(t, action, map);
    if alloc != t.allocation() {
        t.apply(alloc);
    }
    t.advance();
    observation(r, t, clamp)
}

fn observation(r: &TargetRef, t: &TargetSim, clamp: ClampReport) -> Observation {
    let m = *t.last_metrics();
    let app = t.app();
    Observation {
        target: r.clone(),
        step: m.step,
        state: state_vector(&m, t.prev_offered(), &app.bounds),
        reward: if t.step_index() == 0 {
            0.0
        } else {
            reward(app.alpha, m.slo_preservation, m.cpu_util, m.memory_util)
        },
        metrics: m,
        allocation: t.allocation(),
        clamp,
    }
}

/// Lock-step virtual time: the environment advances as soon as every target's action for the
/// current step has arrived (in any order, from any producer).
#[derive(Debug)]
pub struct LockStep {
    env: SimEnv,
    pending: Vec<Option<TargetAction>>,
    arrived: usize,
}

impl LockStep {
    /// Wrap an environment.
    pub fn new(env: SimEnv) -> Self {
        let n = env.len();
        LockStep {
            env,
            pending: vec![None; n],
            arrived: 0,
        }
    }
    /// The environment.
    pub fn env(&self) -> &SimEnv {
        &self.env
    }
    /// The environment, mutably.
    pub fn env_mut(&mut self) -> &mut SimEnv {
        &mut self.env
    }
    /// Targets whose action for the current step is still missing.
    pub fn missing(&self) -> Vec<usize> {
        (0..self.pending.len())
            .filter(|&i| self.pending[i].is_none())
            .collect()
    }
    /// Submit the action of target `i` for `step`. A second action for the same target and step
    /// replaces the first. When the last missing action arrives the environment steps and the
    /// observations are returned.
    pub fn submit(
        &mut self,
        i: usize,
        step: u64,
        action: TargetAction,
    ) -> Result<Option<Vec<Observation>>, SimError> {
        let expected = self.env.step_index();
        let name = self.env.target(i)?.app().name.clone();
        if step != expected {
            return Err(SimError::StepMismatch {
                target: name,
                expected,
                got: step,
            });
        }
        if self.pending[i].replace(action).is_none() {
            self.arrived += 1;
        }
        if self.arrived < self.pending.len() {
            return Ok(None);
        }
        let actions: Vec<TargetAction> = self
            .pending
            .iter_mut()
            .map(|p| p.take().unwrap_or(TargetAction::Hold))
            .collect();
        self.arrived = 0;
        self.env.step(&actions).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{generate_apps, GeneratorOptions};
    use crate::scenario::Scenario;
    use proptest::prelude::*;

    fn env(n: usize, seed: u64) -> SimEnv {
        let apps = generate_apps(n, seed, &GeneratorOptions::default());
        SimEnv::new(
            apps,
            SimConfig {
                seed,
                ..SimConfig::default()
            },
        )
        .unwrap()
    }

    fn actions(n: usize, k: u64) -> Vec<TargetAction> {
        (0..n)
            .map(|i| {
                let x = ((k * 31 + i as u64 * 17) % 200) as f32 / 100.0 - 1.0;
                match (k + i as u64) % 3 {
                    0 => TargetAction::Raw([x, -x, x * 0.5]),
                    1 => TargetAction::Hold,
                    _ => TargetAction::Desired(Allocation {
                        replicas: 1 + (k % 20) as u32,
                        cpu_millicores: 128 + (k * 97 % 1900) as u32,
                        memory_bytes: (256 + k * 131 % 2800) * MIB,
                    }),
                }
            })
            .collect()
    }

    #[test]
    fn same_seed_gives_identical_trajectories() {
        let run = |seed| {
            let mut e = env(6, seed);
            (0..60)
                .map(|k| e.step(&actions(6, k)).unwrap())
                .collect::<Vec<_>>()
        };
        let a = run(11);
        let b = run(11);
        assert_eq!(a, b);
        // bit-identical, not just approximately equal
        let bits = |v: &Vec<Vec<Observation>>| {
            v.iter()
                .flatten()
                .map(|o| (o.reward.to_bits(), o.metrics.p99_ms.to_bits()))
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&a), bits(&b));
        assert_ne!(run(12), a);
        // reset reproduces from the start
        let mut e = env(6, 11);
        let _ = e.step(&actions(6, 0)).unwrap();
        e.reset(11).unwrap();
        assert_eq!(e.step(&actions(6, 0)).unwrap(), a[0]);
    }

    #[test]
    fn absolute_action_map_documented_behaviour() {
        let b = Bounds::default();
        let m = ActionMap::default();
        assert_eq!(m.mode, ActionMode::Absolute);
        let cur = Allocation {
            replicas: 5,
            cpu_millicores: 1000,
            memory_bytes: 1024 * MIB,
        };
        // the middle of every range: 10.5 → 11 replicas is 6 away, 4 per step
        let (a, r) = map_action([0.0, 0.0, 0.0], cur, &b, &m);
        assert_eq!(a.replicas, 9);
        assert_eq!(a.cpu_millicores, 1088);
        assert_eq!(a.memory_bytes, 1664 * MIB);
        assert!(!r.any());
        // a point within one step is reached exactly; holding = naming the current allocation
        let (a, _) = map_action(action_for(cur, cur, &b, &m), cur, &b, &m);
        assert_eq!(a, cur);
        let near = Allocation {
            replicas: 7,
            cpu_millicores: 1400,
            memory_bytes: 600 * MIB,
        };
        let (a, _) = map_action(action_for(near, cur, &b, &m), cur, &b, &m);
        assert_eq!(a, near);
        // far points are approached by at most one step per dimension
        let (a, _) = map_action([1.0, -1.0, 1.0], cur, &b, &m);
        assert_eq!(a.replicas, 9);
        assert_eq!(a.cpu_millicores, 1000 - 480);
        assert_eq!(a.memory_bytes, (1024 + 704) * MIB);
        // NaN keeps that dimension, out of range is clamped
        let (a, r) = map_action([f32::NAN, 5.0, f32::NAN], cur, &b, &m);
        assert_eq!(a.replicas, 5);
        assert_eq!(a.cpu_millicores, 1480);
        assert_eq!(a.memory_bytes, 1024 * MIB);
        assert!(r.nan && r.out_of_range && !r.bounded);
        // the ends of the ranges are the bounds
        let low = Allocation {
            replicas: 2,
            cpu_millicores: 200,
            memory_bytes: 300 * MIB,
        };
        let (a, r) = map_action([-1.0, -1.0, -1.0], low, &b, &m);
        assert_eq!(
            (a.replicas, a.cpu_millicores, a.memory_bytes),
            (1, 128, 256 * MIB)
        );
        assert!(!r.bounded);
        assert_eq!(action_for(a, low, &b, &m), [-1.0, -1.0, -1.0]);
    }

    #[test]
    fn delta_action_map_documented_behaviour() {
        let b = Bounds::default();
        let m = ActionMap {
            mode: ActionMode::Delta,
            ..ActionMap::default()
        };
        let cur = Allocation {
            replicas: 5,
            cpu_millicores: 1000,
            memory_bytes: 1024 * MIB,
        };
        let (a, r) = map_action([0.0, 0.0, 0.0], cur, &b, &m);
        assert_eq!(a, cur);
        assert!(!r.any());
        let (a, r) = map_action([1.0, 1.0, -1.0], cur, &b, &m);
        assert_eq!(a.replicas, 9);
        assert_eq!(a.cpu_millicores, 1000 + 480);
        assert_eq!(a.memory_bytes, (1024 - 704) * MIB);
        assert!(!r.any());
        let (a, r) = map_action([f32::NAN, 5.0, 0.0], cur, &b, &m);
        assert_eq!(a.replicas, 5);
        assert_eq!(a.cpu_millicores, 1480);
        assert!(r.nan && r.out_of_range && !r.bounded);
        let (a, r) = map_action(
            [-1.0, -1.0, -1.0],
            Allocation {
                replicas: 2,
                cpu_millicores: 200,
                memory_bytes: 300 * MIB,
            },
            &b,
            &m,
        );
        assert_eq!(a.replicas, 1);
        assert_eq!(a.cpu_millicores, 128);
        assert_eq!(a.memory_bytes, 256 * MIB);
        assert!(r.bounded);
        let up = Allocation {
            replicas: 7,
            cpu_millicores: 1200,
            memory_bytes: 1200 * MIB,
        };
        let (a, _) = map_action(action_for(up, cur, &b, &m), cur, &b, &m);
        assert_eq!(a, up);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn mapped_actions_stay_in_bounds(raw in prop::array::uniform3(prop_oneof![any::<f32>(), -1.0f32..1.0]),
            r in 1u32..=20, c in 128u32..=2048, m in 256u64..=3072) {
            let b = Bounds::default();
            let cur = Allocation { replicas: r, cpu_millicores: c, memory_bytes: m * MIB };
            for mode in [ActionMode::Absolute, ActionMode::Delta] {
                let map = ActionMap { mode, ..ActionMap::default() };
                let (a, rep) = map_action(raw, cur, &b, &map);
                prop_assert_eq!(b.clamp(a).1, false);
                if raw.iter().any(|v| v.is_nan()) { prop_assert!(rep.nan); }
                if raw.iter().any(|v| v.is_infinite()) { prop_assert!(rep.out_of_range); }
                // one step never moves further than the map's per-step limits
                prop_assert!(a.replicas.abs_diff(cur.replicas) <= map.max_replica_delta);
                prop_assert!(f64::from(a.cpu_millicores.abs_diff(cur.cpu_millicores)) <= 0.25 * 1920.0 + 1.0);
                prop_assert!(a.memory_bytes.abs_diff(cur.memory_bytes) as f64 <= 0.25 * 2816.0 * MIB as f64 + MIB as f64);
            }
        }

        #[test]
        fn action_for_inverts_the_absolute_map(r0 in 1u32..=20, c0 in 128u32..=2048, m0 in 256u64..=3072,
            r1 in 1u32..=20, c1 in 128u32..=2048, m1 in 256u64..=3072) {
            let b = Bounds::default();
            let map = ActionMap::default();
            let mut cur = Allocation { replicas: r0, cpu_millicores: c0, memory_bytes: m0 * MIB };
            let want = Allocation { replicas: r1, cpu_millicores: c1, memory_bytes: m1 * MIB };
            let raw = action_for(want, cur, &b, &map);
            prop_assert!(raw.iter().all(|v| (-1.0..=1.0).contains(v)));
            // repeating the same action reaches the allocation within a few steps and stays
            for _ in 0..6 {
                cur = map_action(raw, cur, &b, &map).0;
            }
            prop_assert_eq!(cur.replicas, want.replicas);
            prop_assert!(cur.cpu_millicores.abs_diff(want.cpu_millicores) <= 1);
            prop_assert!(cur.memory_bytes.abs_diff(want.memory_bytes) <= MIB);
        }

        #[test]
        fn state_and_reward_are_bounded(seed in 0u64..500, k in 0u64..1000) {
            let mut e = env(3, seed);
            for j in 0..5 {
                for o in e.step(&actions(3, k + j)).unwrap() {
                    prop_assert!(o.state.iter().all(|v| v.is_finite() && (-1.0..=1.0).contains(v)), "{:?}", o.state);
                    prop_assert!((0.0..=2.0).contains(&o.reward));
                }
            }
        }
    }

    #[test]
    fn reward_formula() {
        assert_eq!(reward(0.5, 1.0, 0.5, 0.5), 1.5);
        assert_eq!(reward(1.0, 0.25, 0.9, 0.9), 0.5);
        assert_eq!(reward(0.0, 0.0, 0.3, 0.2), 0.5);
    }

    #[test]
    fn lock_step_advances_when_all_actions_arrived() {
        let mut ls = LockStep::new(env(3, 1));
        let r0 = ls.env().target(0).unwrap().allocation().replicas;
        assert!(ls.submit(2, 0, TargetAction::Hold).unwrap().is_none());
        assert!(ls.submit(0, 0, TargetAction::Hold).unwrap().is_none());
        assert!(matches!(
            ls.submit(1, 5, TargetAction::Hold),
            Err(SimError::StepMismatch {
                expected: 0,
                got: 5,
                ..
            })
        ));
        // a replaced action does not count twice
        assert!(ls
            .submit(0, 0, TargetAction::Raw([1.0, 0.0, 0.0]))
            .unwrap()
            .is_none());
        assert_eq!(ls.missing(), vec![1]);
        let obs = ls.submit(1, 0, TargetAction::Hold).unwrap().unwrap();
        assert_eq!(obs.len(), 3);
        assert_eq!(ls.env().step_index(), 1);
        assert_eq!(obs[0].allocation.replicas, (r0 + 4).min(20));
        assert!(matches!(
            ls.submit(9, 1, TargetAction::Hold),
            Err(SimError::UnknownTarget(_))
        ));
    }

    #[test]
    fn scenario_injection_changes_demand_at_step() {
        let mut apps = generate_apps(1, 3, &GeneratorOptions::default());
        apps[0].segments = vec![crate::app::SegmentSpec {
            kind: crate::segments::SegmentKind::MatrixMultiply,
            payload: 50.0,
        }];
        apps[0].load = crate::load::LoadSpec::constant(100.0);
        let name = apps[0].name.clone();
        let cfg = SimConfig {
            injections: vec![
                Injection {
                    target: name.clone(),
                    step: 5,
                    scenario: Scenario::MatrixDimension,
                },
                Injection {
                    target: name,
                    step: 10,
                    scenario: Scenario::LoadHighToLow,
                },
            ],
            ..SimConfig::default()
        };
        let mut e = SimEnv::new(apps, cfg).unwrap();
        let mut cpu = Vec::new();
        let mut offered = Vec::new();
        for _ in 0..15 {
            let o = e.step(&[TargetAction::Hold]).unwrap().remove(0);
            cpu.push(o.metrics.cpu_usage_cores / o.metrics.throughput_rps.max(1e-9));
            offered.push(o.metrics.offered_rps);
        }
        assert!(cpu[5] > 10.0 * cpu[4], "{cpu:?}");
        assert!(offered[10] < 0.5 * offered[9], "{offered:?}");
        assert_eq!(e.target(0).unwrap().app().segments[0].payload, 150.0);
        let bad = SimConfig {
            injections: vec![Injection {
                target: "nope".into(),
                step: 1,
                scenario: Scenario::FileSize,
            }],
            ..SimConfig::default()
        };
        assert!(matches!(
            SimEnv::new(generate_apps(1, 3, &GeneratorOptions::default()), bad),
            Err(SimError::UnknownTarget(_))
        ));
    }
}
