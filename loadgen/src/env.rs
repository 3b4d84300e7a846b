//! Gym-like environment on the learning problem of `aware-mdp` (docs/design.md §3): lock-step virtual
//! time over [`TargetSim`]s.
//!
//! The state ([`State`], named features, [`STATE_NAMES`]), the action map ([`map_action`],
//! [`ActionMap`]) and the reward ([`reward`]) are defined once in `aware-mdp` and re-exported
//! here. A [`TargetAction::Raw`] goes through the action map; a [`TargetAction::Desired`]
//! allocation is clamped to the bounds; every clamp is reported in [`ClampReport`].

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use aware_mdp::{
    action_for, map_action, reward, ActionMap, ActionMode, ClampReport, State, ACTION_DIM,
    REWARD_RANGE, STATE_DIM, STATE_NAMES,
};

use aware_mdp::LimitsPolicy;

use crate::app::{Allocation, AppSpec};
use crate::cluster::{NodeShare, SimMetrics, TargetSim};
use crate::error::SimError;
use crate::load::LoadModel;
use crate::nodes::{Cluster, ClusterConfig, ClusterOccupancy, Node};
use crate::scenario::Injection;

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

/// The state vector of a step's metrics ([`State::observe`] of its measurements and SLO
/// preservation), given the previous step's offered load.
pub fn state_vector(
    m: &SimMetrics,
    prev_offered: Option<f64>,
    bounds: &aware_mdp::Bounds,
) -> [f32; STATE_DIM] {
    State::observe(&m.raw(), m.slo_preservation, prev_offered, bounds).to_array()
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
    pub metrics: SimMetrics,
    /// Reward of the action applied for this step.
    pub reward: f64,
    /// Allocation in force during the step.
    pub allocation: Allocation,
    /// What was clamped when mapping the action.
    pub clamp: ClampReport,
}

/// When an app's Deployment exists ([`SimConfig::presence`]): during the steps `join_step ≤ s <
/// leave_step`. Before it joins and once it has left, the app has no replica (nothing placed,
/// served or Pending); it joins with its initial allocation, every replica new.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Presence {
    /// The app's name (its Deployment name, without the namespace).
    pub target: String,
    /// The first step it is there (0: from the start).
    #[serde(default)]
    pub join_step: u64,
    /// The first step it is gone (none: until the end); after `join_step`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leave_step: Option<u64>,
}

impl Presence {
    /// Whether the app is there during step `step`.
    pub fn covers(&self, step: u64) -> bool {
        step >= self.join_step && self.leave_step.is_none_or(|l| step < l)
    }
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
    /// Per-replica disk/network bandwidth, and the burst headroom of a replica without a limit
    /// (`node_share.burst_headroom`, default 0: nothing beyond the request).
    pub node_share: NodeShare,
    /// Scheduled instability scenarios.
    pub injections: Vec<Injection>,
    /// How every app's limits follow its allocation (the requests), from its initial allocation
    /// as requests and limits; latency-sensitivity is each app's own (an SLO with a latency
    /// objective). The default keeps limits equal to requests.
    #[serde(default)]
    pub limits: LimitsPolicy,
    /// A cluster the apps share ([`crate::nodes`]): nodes with allocatable CPU and memory,
    /// replicas placed by their requests, Pending when nothing fits, contention for the nodes'
    /// unrequested CPU, node events. `None` (the default): every app has an unlimited cluster to
    /// itself. Absent from the JSON when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterConfig>,
    /// Apps that join or leave during the run (at most one entry per app); the others are there
    /// throughout. Absent from the JSON when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub presence: Vec<Presence>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            step_seconds: 10.0,
            seed: 0,
            action_map: ActionMap::default(),
            node_share: NodeShare::default(),
            injections: Vec::new(),
            limits: LimitsPolicy::default(),
            cluster: None,
            presence: Vec::new(),
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
    cluster: Option<Cluster>,
    /// Each target's [`Presence`] (index order), `None` for one there throughout.
    presence: Vec<Option<Presence>>,
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
        for (k, p) in cfg.presence.iter().enumerate() {
            if !apps.iter().any(|a| a.name == p.target) {
                return Err(SimError::UnknownTarget(p.target.clone()));
            }
            if cfg.presence[..k].iter().any(|q| q.target == p.target) {
                return Err(SimError::Config(format!(
                    "presence: `{}` is listed twice",
                    p.target
                )));
            }
            if p.leave_step.is_some_and(|l| l <= p.join_step) {
                return Err(SimError::Config(format!(
                    "presence: `{}` leaves at step {} but joins at step {}: leave_step must be after join_step",
                    p.target,
                    p.leave_step.unwrap_or(0),
                    p.join_step
                )));
            }
        }
        let refs = apps
            .iter()
            .map(|a| TargetRef {
                namespace: a.namespace.clone(),
                name: a.name.clone(),
            })
            .collect();
        let presence = apps
            .iter()
            .map(|a| cfg.presence.iter().find(|p| p.target == a.name).cloned())
            .collect();
        let mut env = SimEnv {
            apps,
            loads,
            targets: Vec::new(),
            refs,
            step: 0,
            cfg,
            cluster: None,
            presence,
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
                let mut t = TargetSim::new(
                    a.clone(),
                    l.clone(),
                    self.cfg.step_seconds,
                    seed,
                    i as u64,
                    self.cfg.node_share,
                )?;
                t.set_limits_policy(self.cfg.limits);
                Ok(t)
            })
            .collect::<Result<_, SimError>>()?;
        for (t, p) in self.targets.iter_mut().zip(&self.presence) {
            if p.as_ref().is_some_and(|p| !p.covers(0)) {
                t.vacate();
            }
        }
        self.cluster = match &self.cfg.cluster {
            Some(c) => {
                let mut cluster = Cluster::new(c, self.targets.len())?;
                cluster.place_initial(&mut self.targets);
                for t in &mut self.targets {
                    t.refresh_idle_metrics();
                }
                Some(cluster)
            }
            None => None,
        };
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

    /// The shared cluster's occupancy during the last step (at reset: after the initial
    /// placement); `None` without a shared cluster.
    pub fn cluster_occupancy(&self) -> Option<&ClusterOccupancy> {
        self.cluster.as_ref().map(Cluster::occupancy)
    }

    /// The shared cluster's nodes (drained ones included, not schedulable); empty without one.
    pub fn nodes(&self) -> &[Node] {
        self.cluster.as_ref().map_or(&[], Cluster::nodes)
    }

    /// Drain node `name` now, between steps: cordon it, evict its replicas and reschedule them
    /// (Pending if nothing fits). Errors without a shared cluster or for an unknown node.
    pub fn drain_node(&mut self, name: &str) -> Result<(), SimError> {
        let t = self.now();
        let step = self.step;
        let cluster = self.cluster.as_mut().ok_or_else(no_cluster)?;
        cluster.drain(&mut self.targets, name, t, step)
    }

    /// Add a node now, between steps, and place what is Pending; returns its name. Errors
    /// without a shared cluster.
    pub fn add_node(&mut self, cpu_millicores: u64, memory_bytes: u64) -> Result<String, SimError> {
        let t = self.now();
        let step = self.step;
        let cluster = self.cluster.as_mut().ok_or_else(no_cluster)?;
        cluster.add(&mut self.targets, cpu_millicores, memory_bytes, t, step)
    }

    /// Whether target `i` is there during step `step` ([`SimConfig::presence`]); false for an
    /// unknown target.
    pub fn is_present(&self, i: usize, step: u64) -> bool {
        self.presence
            .get(i)
            .is_some_and(|p| p.as_ref().is_none_or(|p| p.covers(step)))
    }

    /// The joins and leaves of the coming step: an app joining is created with its initial
    /// allocation, one leaving loses its replicas.
    fn update_presence(&mut self) {
        let s = self.step;
        for (t, p) in self.targets.iter_mut().zip(&self.presence) {
            let Some(p) = p else { continue };
            if p.covers(s) {
                if t.is_vacant() {
                    t.arrive();
                }
            } else if !t.is_vacant() {
                t.vacate();
            }
        }
    }

    /// Simulated time (that of the targets, which advance together).
    fn now(&self) -> f64 {
        self.targets.first().map_or(0.0, TargetSim::now)
    }

    /// With a shared cluster: apply every target's action, then the cluster's step start
    /// (events, admission, scheduling, CPU shares), then advance every target; `each` sees
    /// every advanced target with its clamp report.
    fn step_shared(
        &mut self,
        actions: &[TargetAction],
        mut each: impl FnMut(usize, &TargetSim, ClampReport),
    ) -> Result<(), SimError> {
        let map = self.cfg.action_map;
        let mut clamps = Vec::with_capacity(self.targets.len());
        for (t, a) in self.targets.iter_mut().zip(actions) {
            if t.is_vacant() {
                clamps.push(ClampReport::default());
                continue;
            }
            let (alloc, clamp) = resolve(t, a, &map);
            if alloc != t.allocation() {
                t.apply(alloc);
            }
            clamps.push(clamp);
        }
        let t0 = self.now();
        if let Some(c) = self.cluster.as_mut() {
            c.begin_step(&mut self.targets, self.step, t0, self.cfg.step_seconds)?;
        }
        for (i, (t, clamp)) in self.targets.iter_mut().zip(clamps).enumerate() {
            if t.is_vacant() {
                t.tick_vacant();
            } else {
                t.advance();
            }
            each(i, t, clamp);
        }
        Ok(())
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
        self.update_presence();
        let mut out = Vec::with_capacity(self.targets.len());
        if self.cluster.is_some() {
            let refs = std::mem::take(&mut self.refs);
            let r = self.step_shared(actions, |i, t, clamp| {
                if let Some(r) = refs.get(i) {
                    out.push(observation(r, t, clamp));
                }
            });
            self.refs = refs;
            r?;
        } else {
            let map = self.cfg.action_map;
            for ((t, a), r) in self.targets.iter_mut().zip(actions).zip(&self.refs) {
                out.push(step_target(t, r, a, &map));
            }
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
        self.update_presence();
        rewards.clear();
        if self.cluster.is_some() {
            self.step_shared(actions, |_, t, _| {
                let m = t.last_metrics();
                if t.is_vacant() {
                    rewards.push(0.0);
                    return;
                }
                rewards.push(reward(
                    t.app().alpha,
                    m.slo_preservation,
                    m.cpu_util,
                    m.memory_util,
                ));
            })?;
            self.step += 1;
            return Ok(());
        }
        let map = self.cfg.action_map;
        for (t, a) in self.targets.iter_mut().zip(actions) {
            if t.is_vacant() {
                t.tick_vacant();
                rewards.push(0.0);
                continue;
            }
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

fn no_cluster() -> SimError {
    SimError::Config("no shared cluster (`SimConfig::cluster` is not set)".into())
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
    if t.is_vacant() {
        t.tick_vacant();
        return observation(r, t, ClampReport::default());
    }
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
    use crate::app::{generate_apps, GeneratorOptions, MIB};
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

    /// FNV-1a over 64-bit words.
    fn fnv(words: impl IntoIterator<Item = u64>) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for w in words {
            for b in w.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    }

    /// Every number of the observations, bit for bit.
    fn bits_of(obs: &[Vec<Observation>]) -> u64 {
        let mut w = Vec::new();
        for o in obs.iter().flatten() {
            let m = &o.metrics;
            w.push(o.step);
            w.extend(o.state.iter().map(|x| u64::from(x.to_bits())));
            w.push(o.reward.to_bits());
            w.extend([
                u64::from(o.allocation.replicas),
                u64::from(o.allocation.cpu_millicores),
                o.allocation.memory_bytes,
            ]);
            w.extend(
                [
                    m.time_s,
                    m.cpu_limit_cores,
                    m.memory_limit_bytes,
                    m.cpu_usage_cores,
                    m.memory_working_set_bytes,
                    m.cpu_util,
                    m.memory_util,
                    m.io_util,
                    m.network_util,
                    m.p50_ms,
                    m.p99_ms,
                    m.throughput_rps,
                    m.offered_rps,
                    m.failed_requests,
                    m.backlog,
                    m.slo_preservation,
                ]
                .map(f64::to_bits),
            );
            w.extend([
                m.step,
                u64::from(m.replicas),
                u64::from(m.ready_replicas),
                u64::from(m.oom_kills),
                u64::from(m.slo_violation),
            ]);
        }
        fnv(w)
    }

    /// The JSON of the observations (what `aware sim` writes), hashed.
    fn json_of(obs: &[Vec<Observation>]) -> u64 {
        let s = serde_json::to_string(obs).unwrap();
        fnv(s.bytes().map(u64::from))
    }

    /// A fixed run: 6 generated apps, 80 steps of mixed actions; `bursting` drops the CPU limit
    /// of every app with a node burst headroom of 0.5 (replicas use more than they request).
    fn golden_run(cfg: SimConfig) -> Vec<Vec<Observation>> {
        let apps = generate_apps(6, 21, &GeneratorOptions::default());
        let mut e = SimEnv::new(apps, cfg).unwrap();
        (0..80).map(|k| e.step(&actions(6, k)).unwrap()).collect()
    }

    fn golden_configs() -> [SimConfig; 2] {
        let plain = SimConfig {
            seed: 21,
            ..SimConfig::default()
        };
        let bursting = SimConfig {
            seed: 22,
            node_share: NodeShare {
                burst_headroom: 0.5,
                ..NodeShare::default()
            },
            limits: LimitsPolicy {
                controlled_values: aware_mdp::ControlledValues::RequestsAndLimits,
                cpu_limit: aware_mdp::CpuLimit::Unset,
            },
            ..SimConfig::default()
        };
        [plain, bursting]
    }

    /// The simulator's outputs without a shared cluster, recorded from the code before the
    /// shared cluster existed: any change to the single-app model shows here.
    #[test]
    fn outputs_without_a_shared_cluster_match_the_recorded_golden_values() {
        let got: Vec<(u64, u64)> = golden_configs()
            .into_iter()
            .map(|c| {
                let obs = golden_run(c);
                (bits_of(&obs), json_of(&obs))
            })
            .collect();
        assert_eq!(got, GOLDEN, "{got:#x?}");
        // the configuration's JSON (hashed into meta-training fingerprints) is unchanged too
        let json = serde_json::to_string(&SimConfig::default()).unwrap();
        assert!(!json.contains("cluster"), "{json}");
    }

    /// A shared cluster too large for anything to wait or contend (one huge node, or 60
    /// 32-core nodes the least-allocated scorer spreads the replicas over) reproduces the
    /// recorded outputs bit for bit, through `step` and `step_rewards`.
    #[test]
    fn a_cluster_nothing_contends_on_reproduces_the_golden_values() {
        use crate::nodes::ClusterConfig;
        for cluster in [
            ClusterConfig::uniform(1, 1 << 40, 1 << 60),
            ClusterConfig::uniform(60, 32_000, 128 << 30),
        ] {
            let got: Vec<(u64, u64)> = golden_configs()
                .into_iter()
                .map(|c| {
                    let obs = golden_run(SimConfig {
                        cluster: Some(cluster.clone()),
                        ..c
                    });
                    (bits_of(&obs), json_of(&obs))
                })
                .collect();
            assert_eq!(got, GOLDEN, "{cluster:?}");
        }
        // and the comparison sees a cluster that does contend: 2 nodes of 8 cores
        for c in golden_configs() {
            let seed = c.seed;
            let tight = golden_run(SimConfig {
                cluster: Some(ClusterConfig::uniform(2, 8000, 32 << 30)),
                ..c
            });
            let i = usize::from(seed == 22);
            assert_ne!(bits_of(&tight), GOLDEN[i].0);
            assert!(tight
                .iter()
                .flatten()
                .any(|o| o.metrics.pending_replicas > 0));
        }
        for c in golden_configs() {
            let apps = generate_apps(6, 21, &GeneratorOptions::default());
            let mut plain = SimEnv::new(apps.clone(), c.clone()).unwrap();
            let mut shared = SimEnv::new(
                apps,
                SimConfig {
                    cluster: Some(ClusterConfig::uniform(60, 32_000, 128 << 30)),
                    ..c
                },
            )
            .unwrap();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for k in 0..80 {
                plain.step_rewards(&actions(6, k), &mut a).unwrap();
                shared.step_rewards(&actions(6, k), &mut b).unwrap();
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "step {k}");
            }
            assert_eq!(
                shared.cluster_occupancy().unwrap().pending_replica_seconds,
                0.0
            );
        }
    }

    const GOLDEN: [(u64, u64); 2] = [
        (0x4291_7270_71e5_5843, 0xe881_f915_717a_9f3b),
        (0x6fb6_1467_07f9_5ae2, 0x6f6d_41b3_488d_30e0),
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
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

    /// `SimConfig::limits` reaches every target: with RequestsOnly the template's limits (the
    /// initial allocation) stay, so a request above them is lowered to them.
    #[test]
    fn the_configured_limits_policy_applies_to_every_target() {
        let apps = generate_apps(3, 5, &GeneratorOptions::default());
        let initial: Vec<Allocation> = apps.iter().map(|a| a.initial).collect();
        let cfg = SimConfig {
            // every limit kept as the template has it (the default would drop the CPU limit
            // of the latency-sensitive apps, and with it the cap on their CPU request)
            limits: LimitsPolicy {
                controlled_values: aware_mdp::ControlledValues::RequestsOnly,
                cpu_limit: aware_mdp::CpuLimit::Controlled,
            },
            ..SimConfig::default()
        };
        let mut e = SimEnv::new(apps, cfg).unwrap();
        let big = TargetAction::Desired(Allocation {
            replicas: 2,
            cpu_millicores: 2048,
            memory_bytes: 3072 * MIB,
        });
        for (o, init) in e.step(&[big; 3]).unwrap().iter().zip(&initial) {
            assert_eq!(o.allocation.cpu_millicores, init.cpu_millicores);
            assert_eq!(o.allocation.memory_bytes, init.memory_bytes);
            assert_eq!(o.allocation.replicas, 2);
        }
        // the default: the requests are applied as asked
        let mut d = env(3, 5);
        for o in d.step(&[big; 3]).unwrap() {
            assert_eq!(o.allocation.cpu_millicores, 2048);
        }
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

    fn joining(apps: &[AppSpec], i: usize, join_step: u64, leave_step: Option<u64>) -> Presence {
        Presence {
            target: apps[i].name.clone(),
            join_step,
            leave_step,
        }
    }

    fn cpu_requested(a: &AppSpec) -> u64 {
        u64::from(a.initial.replicas) * u64::from(a.initial.cpu_millicores)
    }

    /// An app joining is created with its initial allocation at its step and loses every
    /// replica when it leaves; meanwhile its clock keeps pace with the others, and on a cluster
    /// with room it changes nothing for them.
    #[test]
    fn an_app_joins_with_its_initial_replicas_and_leaves_with_none() {
        let apps = generate_apps(3, 5, &GeneratorOptions::default());
        let cfg = |presence: Vec<Presence>| SimConfig {
            seed: 5,
            cluster: Some(ClusterConfig::uniform(8, 64_000, 512 << 30)),
            presence,
            ..SimConfig::default()
        };
        let mut e = SimEnv::new(apps.clone(), cfg(vec![joining(&apps, 2, 4, Some(9))])).unwrap();
        let mut always = SimEnv::new(apps.clone(), cfg(Vec::new())).unwrap();
        assert!(e.target(2).unwrap().is_vacant());
        assert!(!e.is_present(2, 0) && !e.is_present(2, 3));
        assert!(e.is_present(2, 4) && e.is_present(2, 8) && !e.is_present(2, 9));
        assert!(e.is_present(0, 100) && !e.is_present(7, 0));
        let hold = vec![TargetAction::Hold; 3];
        let mut cpu_share = Vec::new();
        for s in 0..12u64 {
            let obs = e.step(&hold).unwrap();
            let reference = always.step(&hold).unwrap();
            cpu_share.push(e.cluster_occupancy().unwrap().cpu_requested_share);
            let replicas = obs[2].metrics.replicas;
            if (4..9).contains(&s) {
                assert_eq!(replicas, apps[2].initial.replicas, "step {s}");
            } else {
                assert_eq!(replicas, 0, "step {s}");
                assert_eq!(obs[2].metrics.throughput_rps, 0.0, "step {s}");
            }
            assert_eq!(obs[2].step, s);
            assert_eq!(
                e.target(2).unwrap().now(),
                e.target(0).unwrap().now(),
                "step {s}"
            );
            // the others run exactly as without the joining app (the cluster has room)
            assert_eq!(obs[..2], reference[..2], "step {s}");
        }
        let all: f64 = apps.iter().map(|a| cpu_requested(a) as f64).sum();
        let cluster_cpu = 8.0 * 64_000.0;
        let others = (all - cpu_requested(&apps[2]) as f64) / cluster_cpu;
        assert!((cpu_share[3] - others).abs() < 1e-9, "{cpu_share:?}");
        assert!(
            (cpu_share[5] - all / cluster_cpu).abs() < 1e-9,
            "{cpu_share:?}"
        );
        assert!((cpu_share[10] - others).abs() < 1e-9, "{cpu_share:?}");
        // the replicas it joins with are new: ready only after the app's cold start
        let mut again = SimEnv::new(apps.clone(), cfg(vec![joining(&apps, 2, 4, None)])).unwrap();
        for _ in 0..4 {
            again.step(&hold).unwrap();
        }
        let t = again.target(2).unwrap().clone();
        let joined = again.step(&hold).unwrap();
        let cold = t.model().cold_start_seconds;
        assert!(joined[2].metrics.replicas.eq(&apps[2].initial.replicas));
        assert!(
            again
                .target(2)
                .unwrap()
                .replicas()
                .iter()
                .all(|r| r.ready_at >= t.now() + cold - 1e-9),
            "{:?}",
            again.target(2).unwrap().replicas()
        );
    }

    /// On a full cluster a joining app's replicas wait Pending, and they are placed once
    /// another app leaves and frees its node.
    #[test]
    fn an_app_joining_a_full_cluster_waits_until_another_leaves() {
        let apps = generate_apps(2, 8, &GeneratorOptions::default());
        let node_cpu = cpu_requested(&apps[0]) + u64::from(apps[1].initial.cpu_millicores) / 2;
        let mut e = SimEnv::new(
            apps.clone(),
            SimConfig {
                seed: 8,
                cluster: Some(ClusterConfig::uniform(1, node_cpu, 512 << 30)),
                presence: vec![joining(&apps, 1, 3, None), joining(&apps, 0, 0, Some(6))],
                ..SimConfig::default()
            },
        )
        .unwrap();
        let hold = vec![TargetAction::Hold; 2];
        let mut pending = Vec::new();
        for _ in 0..8 {
            let obs = e.step(&hold).unwrap();
            pending.push((
                obs[0].metrics.pending_replicas,
                obs[1].metrics.pending_replicas,
            ));
        }
        assert_eq!(pending[2], (0, 0), "{pending:?}");
        assert_eq!(pending[3], (0, apps[1].initial.replicas), "{pending:?}");
        assert_eq!(pending[5], (0, apps[1].initial.replicas), "{pending:?}");
        assert_eq!(pending[6], (0, 0), "{pending:?}");
        let occ = e.cluster_occupancy().unwrap();
        assert_eq!(occ.pending_replicas, 0);
        assert!(occ.pending_replica_seconds_by_target[1] >= 3.0 * e.config().step_seconds);
        assert_eq!(occ.pending_replica_seconds_by_target[0], 0.0);
    }

    /// Without a shared cluster too: an app off the cluster has no replica and serves
    /// nothing, and the step-reward path skips it with 0.
    #[test]
    fn an_app_joins_and_leaves_an_unlimited_cluster() {
        let apps = generate_apps(2, 9, &GeneratorOptions::default());
        let mut e = SimEnv::new(
            apps.clone(),
            SimConfig {
                seed: 9,
                presence: vec![joining(&apps, 1, 2, Some(4))],
                ..SimConfig::default()
            },
        )
        .unwrap();
        let hold = vec![TargetAction::Hold; 2];
        let mut replicas = Vec::new();
        let mut rewards = Vec::new();
        for s in 0..6 {
            if s % 2 == 0 {
                replicas.push(e.step(&hold).unwrap()[1].metrics.replicas);
            } else {
                let mut r = Vec::new();
                e.step_rewards(&hold, &mut r).unwrap();
                replicas.push(e.target(1).unwrap().replicas().len() as u32);
                rewards.push(r[1]);
            }
        }
        let n = apps[1].initial.replicas;
        assert_eq!(replicas, [0, 0, n, n, 0, 0]);
        assert_eq!(rewards[0], 0.0);
        assert!(rewards[1] != 0.0);
        assert_eq!(rewards[2], 0.0);
        assert_eq!(e.target(1).unwrap().now(), e.target(0).unwrap().now());
    }

    #[test]
    fn presence_names_apps_once_and_leaves_after_joining() {
        let apps = generate_apps(2, 3, &GeneratorOptions::default());
        let with = |presence: Vec<Presence>| {
            SimEnv::new(
                apps.clone(),
                SimConfig {
                    presence,
                    ..SimConfig::default()
                },
            )
        };
        let unknown = Presence {
            target: "nope".into(),
            join_step: 1,
            leave_step: None,
        };
        assert!(matches!(
            with(vec![unknown]),
            Err(SimError::UnknownTarget(_))
        ));
        let twice = vec![joining(&apps, 0, 1, None), joining(&apps, 0, 2, None)];
        assert!(with(twice).unwrap_err().to_string().contains("twice"));
        let err = with(vec![joining(&apps, 1, 5, Some(5))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("leave_step"), "{err}");
        let json = serde_json::to_string(&SimConfig::default()).unwrap();
        assert!(!json.contains("presence"), "{json}");
        let p: Presence = serde_json::from_str(r#"{"target": "a", "join_step": 3}"#).unwrap();
        assert!(p.covers(3) && !p.covers(2) && p.covers(1000));
        assert!(serde_json::from_str::<Presence>(r#"{"target": "a", "joins": 3}"#).is_err());
    }
}
