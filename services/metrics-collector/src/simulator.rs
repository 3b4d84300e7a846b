//! Source `simulator`: the collector owns a simulated cluster (`aware-loadgen`), publishes one
//! `obs` per target and step, and applies every `applied` decision to the simulated Deployment.
//!
//! Works the same in one process and across processes: the actuator's decisions reach the
//! simulator as `applied` messages on the bus. Lock-step clock: the cluster advances as soon as
//! every target's `applied` for the current step has arrived, or after `step_timeout_ms` with the
//! allocation of the late targets unchanged (counted). Wall-clock: one step per `step_seconds`.
//! Timestamps are simulated time (start-up wall clock + simulated seconds), so the recommender's
//! time-based rules (HPA stabilization, VPA decay) run on simulated time. One warm-up step runs
//! before the first `obs`, so no state is ever built from a cluster that has not run yet.
//!
//! A restarted collector resumes after the newest `obs` in the JetStream capture
//! ([`crate::resume_points`]): the cluster is fast-forwarded to that step (the traces and
//! scheduled scenarios stay aligned with the step numbers) and its last step restores the
//! allocations reported in those `obs`, so the loop continues where it stopped.

use std::collections::HashMap;
use std::time::Duration;

use crate::config::{ClockMode, SimulatorSourceConfig};
use aware_bus_schemas::{Applied, Event, EventKind, Obs, Schema, Target};
use aware_loadgen::app::{generate_apps, AppSet, AppSpec, GeneratorOptions};
use aware_loadgen::env::{Observation, SimConfig, SimEnv, TargetAction};
use aware_loadgen::{Injection, Scenario};
use aware_mdp::Allocation;
use aware_shared::service::{ServiceContext, ServiceError};

use crate::metrics::CollectorMetrics;

/// Builds the simulated apps: `apps` generated from `seed`, then the app files.
pub fn build_apps(cfg: &SimulatorSourceConfig) -> Result<Vec<AppSpec>, ServiceError> {
    let mut apps = generate_apps(cfg.apps, cfg.seed, &GeneratorOptions::default());
    for path in &cfg.app_files {
        let set = AppSet::read(path)
            .map_err(|e| ServiceError::resource(format!("app file {}", path.display()), e))?;
        apps.extend(set.apps);
    }
    Ok(apps)
}

/// The simulation settings of the collector's cluster: step length, seed and the scheduled
/// `collector.simulator.injections`, each checked against the apps (a scenario name `loadgen`
/// does not know, an unknown app, or a payload scenario that changes nothing for its app is an
/// error naming the entry).
pub fn sim_config(
    cfg: &SimulatorSourceConfig,
    apps: &[AppSpec],
) -> Result<SimConfig, ServiceError> {
    let mut injections = Vec::with_capacity(cfg.injections.len());
    for (i, inj) in cfg.injections.iter().enumerate() {
        let bad = |why: String| {
            ServiceError::Config(aware_shared::config::ConfigError::Invalid {
                key: format!("collector.simulator.injections[{i}]"),
                reason: why,
            })
        };
        let scenario: Scenario = serde_json::from_value(serde_json::Value::String(
            inj.scenario.clone(),
        ))
        .map_err(|_| {
            let known: Vec<String> = Scenario::ALL
                .iter()
                .filter_map(|s| serde_json::to_value(s).ok())
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            bad(format!(
                "unknown scenario {:?} (one of {})",
                inj.scenario,
                known.join(", ")
            ))
        })?;
        let Some(app) = apps.iter().find(|a| a.name == inj.target) else {
            return Err(bad(format!("no simulated app named {:?}", inj.target)));
        };
        if !scenario.applies_to_app(app) {
            return Err(bad(format!(
                "{} changes nothing for {:?} (none of its segments has that payload)",
                inj.scenario, inj.target
            )));
        }
        injections.push(Injection {
            target: inj.target.clone(),
            step: inj.step,
            scenario,
        });
    }
    for (i, p) in cfg.presence.iter().enumerate() {
        let bad = |why: String| {
            ServiceError::Config(aware_shared::config::ConfigError::Invalid {
                key: format!("collector.simulator.presence[{i}]"),
                reason: why,
            })
        };
        if !apps.iter().any(|a| a.name == p.target) {
            return Err(bad(format!("no simulated app named {:?}", p.target)));
        }
        if cfg.presence[..i].iter().any(|q| q.target == p.target) {
            return Err(bad(format!("{:?} is listed twice", p.target)));
        }
        if let Some(l) = p.leave_step.filter(|l| *l <= p.join_step) {
            return Err(bad(format!(
                "leave_step {l} must be after join_step {}",
                p.join_step
            )));
        }
    }
    Ok(SimConfig {
        step_seconds: cfg.step_seconds,
        seed: cfg.seed,
        injections,
        presence: cfg
            .presence
            .iter()
            .map(|p| aware_loadgen::Presence {
                target: p.target.clone(),
                join_step: p.join_step,
                leave_step: p.leave_step,
            })
            .collect(),
        cluster: cfg.cluster.map(|c| aware_loadgen::nodes::ClusterConfig {
            lend_idle: c.lend_idle,
            ..aware_loadgen::nodes::ClusterConfig::uniform(
                c.nodes,
                c.node_cpu_millicores,
                c.node_memory_bytes,
            )
        }),
        node_share: aware_loadgen::cluster::NodeShare {
            burst_headroom: cfg.burst_headroom,
            ..aware_loadgen::cluster::NodeShare::default()
        },
        ..SimConfig::default()
    })
}

/// The target specs of simulated apps (bounds, SLO, alpha), for the services' configuration.
pub fn target_specs(apps: &[AppSpec]) -> Vec<aware_shared::spec::TargetSpec> {
    apps.iter()
        .map(|a| aware_shared::spec::TargetSpec {
            namespace: a.namespace.clone(),
            name: a.name.clone(),
            bounds: a.bounds,
            slo: a.slo,
            alpha: a.alpha,
            update_mode: aware_shared::spec::UpdateMode::Auto,
            container: None,
            limits: aware_shared::spec::LimitsPolicy::default(),
            fallback: aware_shared::spec::FallbackOverride::default(),
        })
        .collect()
}

/// The `obs` of global step `g` for one target; with `shared_cluster` (a configured
/// `collector.simulator.cluster`) it carries the target's Pending replicas, and with a
/// `mean_field` (`learning.mean_field`) its state ends with it.
pub fn to_obs(
    o: &Observation,
    target: &Target,
    g: u64,
    steps_per_episode: u32,
    base_ms: i64,
    shared_cluster: bool,
    mean_field: Option<&[f32; aware_mdp::MEAN_FIELD_DIM]>,
) -> Obs {
    let m = &o.metrics;
    let spe = u64::from(steps_per_episode.max(1));
    let mut obs = Obs {
        schema: Schema::new(),
        target: target.clone(),
        episode: g / spe,
        step: u32::try_from(g % spe).unwrap_or(0),
        ts_ms: base_ms.saturating_add((m.time_s * 1000.0) as i64),
        state: o
            .state
            .iter()
            .chain(mean_field.into_iter().flatten())
            .copied()
            .collect(),
        // The replica count in force is the allocation's (the Deployment's spec), as the
        // Prometheus source reads it from kube-state-metrics.
        metrics: aware_bus_schemas::RawMetrics {
            spec_replicas: Some(o.allocation.replicas),
            pending_replicas: shared_cluster.then_some(m.pending_replicas),
            ..m.raw()
        },
        reward: (g > 0).then_some(o.reward),
        slo_violation: m.slo_violation,
        complete: true,
        missing: Vec::new(),
    };
    let unusable = crate::unusable_metrics(&obs.metrics);
    let bad_state = obs.state.iter().any(|x| !x.is_finite());
    let bad_reward = obs.reward.is_some_and(|r| !r.is_finite());
    if !unusable.is_empty() || bad_state || bad_reward {
        tracing::warn!(%target, step = g, unusable = ?unusable, bad_state, bad_reward, "unusable measurements: incomplete obs");
        obs.missing = unusable;
        if bad_state {
            obs.missing.push("state".to_string());
        }
        if bad_reward {
            obs.missing.push("reward".to_string());
        }
        obs.complete = false;
        obs.state = Vec::new();
        obs.reward = None;
    }
    obs
}

/// The decisions received for the step awaited, one slot per target, and how many slots are
/// filled: whether the step is complete is known in O(1) per `applied`.
#[derive(Debug)]
struct Pending {
    slots: Vec<Option<TargetAction>>,
    filled: usize,
}

impl Pending {
    fn new(n: usize) -> Self {
        Pending {
            slots: vec![None; n],
            filled: 0,
        }
    }

    fn is_filled(&self, i: usize) -> bool {
        self.slots[i].is_some()
    }

    /// Sets target `i`'s decision (a repeat replaces it); whether every slot is now filled.
    fn fill(&mut self, i: usize, action: TargetAction) -> bool {
        if self.slots[i].replace(action).is_none() {
            self.filled += 1;
        }
        self.is_complete()
    }

    fn is_complete(&self) -> bool {
        self.filled == self.slots.len()
    }

    /// Target `i` gets no `obs` for this step (its app is not on the cluster): none is awaited.
    fn skip(&mut self, i: usize) {
        if !self.is_filled(i) {
            self.fill(i, TargetAction::Hold);
        }
    }

    /// The targets without a decision.
    fn missing(&self) -> usize {
        self.slots.len() - self.filled
    }

    /// Every slot's decision (`Hold` for the missing), emptying them for the next step.
    fn take(&mut self) -> Vec<TargetAction> {
        self.filled = 0;
        self.slots
            .iter_mut()
            .map(|p| p.take().unwrap_or(TargetAction::Hold))
            .collect()
    }
}

struct Sim {
    env: SimEnv,
    targets: Vec<Target>,
    index: HashMap<Target, usize>,
    pending: Pending,
    last: Vec<Observation>,
    /// Each target's requested cores before the last step (`learning.mean_field`'s allocation
    /// change); empty before the first step.
    previous_cores: Vec<f64>,
    mean_field: bool,
    spe: u32,
    base_ms: i64,
}

impl Sim {
    /// A simulated cluster over `env` after its warm-up step (`last`), one target per app in
    /// `targets`' order.
    fn new(
        env: SimEnv,
        targets: Vec<Target>,
        last: Vec<Observation>,
        spe: u32,
        base_ms: i64,
    ) -> Self {
        let n = targets.len();
        Self {
            env,
            index: targets
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, t)| (t, i))
                .collect(),
            targets,
            pending: Pending::new(n),
            last,
            previous_cores: Vec::new(),
            mean_field: false,
            spe,
            base_ms,
        }
    }

    /// The step whose action is awaited. The cluster runs one warm-up step (allocation
    /// unchanged) before the first `obs`, so every published state comes from real metrics.
    fn global_step(&self) -> u64 {
        self.env.step_index().saturating_sub(1)
    }

    /// Each target's mean field of the last step ([`aware_mdp::mean_fields`]): the others of
    /// this collector's cluster, from the simulator's own accounting.
    fn mean_fields(&self) -> Vec<[f32; aware_mdp::MEAN_FIELD_DIM]> {
        let members: Vec<aware_mdp::Member> = self
            .last
            .iter()
            .enumerate()
            .filter(|(i, _)| self.is_present(*i))
            .map(|(i, o)| aware_mdp::Member {
                requested_cores: aware_mdp::Prices::cores(&o.allocation),
                previous_requested_cores: self.previous_cores.get(i).copied(),
                replicas: o.allocation.replicas,
                slo_preservation: o.metrics.slo_preservation,
                cpu_util: o.metrics.cpu_util,
            })
            .collect();
        let share = self
            .env
            .cluster_occupancy()
            .map(|c| aware_mdp::ClusterShare {
                cpu_requested: c.cpu_requested_share,
                memory_requested: c.memory_requested_share,
                pending_replicas: c.pending_replicas,
            });
        aware_mdp::mean_fields(&members, share.as_ref())
    }

    /// Whether target `i`'s app is on the cluster during the step just taken
    /// (`collector.simulator.presence`).
    fn is_present(&self, i: usize) -> bool {
        self.env.is_present(i, self.global_step())
    }

    /// Marks the targets whose app is not on the cluster in the step just taken: they get no
    /// `obs`, so no `applied` is awaited from them.
    fn skip_absent(&mut self) {
        for i in 0..self.targets.len() {
            if !self.is_present(i) {
                self.pending.skip(i);
            }
        }
    }

    /// The step's `obs` (one per target whose app is on the cluster), counting the incomplete
    /// ones.
    fn step_obs(&self, metrics: &CollectorMetrics) -> Vec<Obs> {
        let g = self.global_step();
        let shared = self.env.cluster_occupancy().is_some();
        let mut fields = if self.mean_field {
            self.mean_fields()
        } else {
            Vec::new()
        }
        .into_iter();
        let all: Vec<Obs> = self
            .last
            .iter()
            .zip(&self.targets)
            .enumerate()
            .filter(|(i, _)| self.is_present(*i))
            .map(|(_, (o, t))| {
                let field = fields.next();
                to_obs(o, t, g, self.spe, self.base_ms, shared, field.as_ref())
            })
            .collect();
        metrics
            .incomplete_obs
            .inc_by(all.iter().filter(|o| !o.complete).count() as u64);
        all
    }

    /// Publishes the step's `obs` (up to PUBLISHING at once: with acknowledged publishes, ADR
    /// 0022, each waits for the stream), spread over `spread`, in a task of its own so the
    /// `applied` of the targets already published are taken meanwhile. The previous step's
    /// publishing is awaited first, so no target's `obs` overtake each other; with `wait` (lock
    /// step) this one's too.
    async fn publish_all(
        &self,
        ctx: &ServiceContext,
        metrics: &CollectorMetrics,
        spread: Duration,
        previous: &mut Option<tokio::task::JoinHandle<()>>,
        wait: bool,
    ) {
        if let Some(p) = previous.take() {
            let _ = p.await;
        }
        let all = self.step_obs(metrics);
        let ctx = ctx.clone();
        let task = tokio::spawn(async move {
            crate::publish_spread(&ctx, all, spread).await;
        });
        if wait {
            let _ = task.await;
        } else {
            *previous = Some(task);
        }
    }

    /// Records an `applied`; returns whether every target of the step has one.
    fn accept(&mut self, a: &Applied, metrics: &CollectorMetrics) -> bool {
        let Some(&i) = self.index.get(&a.target) else {
            tracing::debug!(target = %a.target, "applied for a target the simulator does not run");
            return false;
        };
        let g = a.episode * u64::from(self.spe.max(1)) + u64::from(a.step);
        if g != self.global_step() {
            metrics.stale_applied.inc();
            tracing::debug!(target = %a.target, step = g, current = self.global_step(), "stale applied ignored");
            return false;
        }
        if a.outcome == aware_bus_schemas::Outcome::Rejected && self.pending.is_filled(i) {
            // A rejected duplicate must not undo the decision already taken for this step.
            return false;
        }
        // Only an applied decision changes the cluster: a rejection or a recommendation keeps
        // the allocation in force whatever allocation it reports.
        self.pending.fill(
            i,
            match a.outcome {
                aware_bus_schemas::Outcome::Applied => TargetAction::Desired(a.applied),
                _ => TargetAction::Hold,
            },
        )
    }

    fn step(&mut self, metrics: &CollectorMetrics) -> Result<(), ServiceError> {
        let late = self.pending.missing();
        if late > 0 {
            metrics.late_targets.inc_by(late as u64);
        }
        let actions = self.pending.take();
        self.advance(&actions, metrics)?;
        self.skip_absent();
        Ok(())
    }

    /// One simulator step with `actions`, counted, its scenarios logged.
    fn advance(
        &mut self,
        actions: &[TargetAction],
        metrics: &CollectorMetrics,
    ) -> Result<(), ServiceError> {
        if self.mean_field {
            self.previous_cores = self
                .last
                .iter()
                .map(|o| aware_mdp::Prices::cores(&o.allocation))
                .collect();
        }
        self.last = self
            .env
            .step(actions)
            .map_err(|e| ServiceError::resource("simulator step", e))?;
        metrics.steps.inc();
        self.note_injections(metrics);
        Ok(())
    }

    /// Steps with every allocation held until the step awaited is `to` (no `obs` published).
    fn fast_forward(&mut self, to: u64, metrics: &CollectorMetrics) -> Result<(), ServiceError> {
        let hold = vec![TargetAction::Hold; self.targets.len()];
        while self.global_step() < to {
            self.advance(&hold, metrics)?;
        }
        Ok(())
    }

    /// Logs and counts the scenarios that took effect in the step just taken.
    fn note_injections(&self, metrics: &CollectorMetrics) {
        let g = self.global_step();
        // The environment applies its scheduled scenarios; they are logged and counted here.
        for inj in self.env.config().injections.iter().filter(|i| i.step == g) {
            metrics.scenarios_injected.inc();
            tracing::info!(target = %inj.target, step = g, scenario = ?inj.scenario, "instability scenario injected");
        }
    }
}

/// The allocation each target had in its newest captured `obs` (by target index), restored
/// when the numbering resumes ([`crate::resume_points`]): the simulated cluster lives in the
/// collector, so a restart would otherwise put every target back to its initial allocation.
fn resume_allocations(captured: &[Obs], sim: &Sim) -> HashMap<usize, Allocation> {
    let mut out = HashMap::new();
    for o in captured {
        let (Some(&i), Some(r)) = (
            sim.index.get(&o.target),
            aware_shared::spec::allocation_in_force(&o.metrics),
        ) else {
            continue;
        };
        if o.complete {
            out.insert(i, r);
        }
    }
    out
}

/// Runs the simulator source until shutdown (or `max_steps`).
pub async fn run(
    ctx: ServiceContext,
    cfg: SimulatorSourceConfig,
    spread_fraction: f64,
    metrics: CollectorMetrics,
) -> Result<(), ServiceError> {
    let mut apps = build_apps(&cfg)?;
    let mut sim_cfg = sim_config(&cfg, &apps)?;
    // A sharded collector simulates the apps of its shard: their `applied` is all it receives.
    let shard = ctx.config.shard;
    apps.retain(|a| shard.owns(&Target::new(a.namespace.clone(), a.name.clone())));
    sim_cfg
        .injections
        .retain(|i| apps.iter().any(|a| a.name == i.target));
    let targets: Vec<Target> = apps
        .iter()
        .map(|a| Target::new(a.namespace.clone(), a.name.clone()))
        .collect();
    for t in &targets {
        aware_bus_schemas::subject::subject(EventKind::Obs, t)?;
    }
    for inj in &sim_cfg.injections {
        tracing::info!(target = %inj.target, step = inj.step, scenario = ?inj.scenario, "instability scenario scheduled");
    }
    let mut env = SimEnv::new(apps, sim_cfg).map_err(|e| ServiceError::resource("simulator", e))?;
    env.reset(cfg.seed)
        .map_err(|e| ServiceError::resource("simulator reset", e))?;
    let n = targets.len();
    let last = env
        .step(&vec![TargetAction::Hold; n])
        .map_err(|e| ServiceError::resource("simulator warm-up step", e))?;
    let mut sim = Sim::new(
        env,
        targets,
        last,
        ctx.config.learning.steps_per_episode,
        aware_bus_schemas::now_ms(),
    );
    sim.mean_field = ctx.config.learning.mean_field;
    metrics.targets.set(i64::try_from(n).unwrap_or(i64::MAX));
    sim.note_injections(&metrics); // the warm-up step is global step 0
    let captured = crate::captured_obs(&ctx).await;
    let resume = crate::resume_points(&captured, sim.spe);
    let resumed = resume_allocations(&captured, &sim);
    let resume_at = sim
        .targets
        .iter()
        .filter_map(|t| resume.get(t))
        .copied()
        .max()
        .unwrap_or(0);
    let start = cfg.start_step.max(resume_at);
    if start > 0 {
        tracing::info!(
            start_step = cfg.start_step,
            resumed_at = resume_at,
            "fast-forwarding the simulated cluster"
        );
        sim.fast_forward(start.saturating_sub(1), &metrics)?;
        // The last step restores the allocations in force when the previous collector stopped.
        let restore: Vec<TargetAction> = (0..n)
            .map(|i| match resumed.get(&i) {
                Some(a) if resume_at > 0 => TargetAction::Desired(*a),
                _ => TargetAction::Hold,
            })
            .collect();
        sim.advance(&restore, &metrics)?;
    }
    sim.skip_absent();
    let mut rx = ctx.subscribe_events(&[EventKind::Applied]).await?;
    ctx.ready.set(true);
    tracing::info!(targets = n, clock = ?cfg.clock, "simulated cluster started");
    let (period, spread) = match cfg.clock {
        ClockMode::Lockstep => (
            Duration::from_millis(cfg.step_timeout_ms.max(1)),
            Duration::ZERO,
        ),
        ClockMode::Wallclock => {
            let period = Duration::from_secs_f64(cfg.step_seconds);
            (period, period.mul_f64(spread_fraction))
        }
    };
    // Lock-step: the step's timeout runs from the end of its publishing, as the step advances
    // only once its `obs` are out. Wall-clock: steps start a period apart, and the `applied` of
    // the targets already published are taken while the others are.
    let lockstep = cfg.clock == ClockMode::Lockstep;
    let mut publishing = None;
    let mut deadline = tokio::time::Instant::now() + period;
    sim.publish_all(&ctx, &metrics, spread, &mut publishing, lockstep)
        .await;
    if lockstep {
        deadline = tokio::time::Instant::now() + period;
    }
    loop {
        if cfg.max_steps > 0 && sim.global_step() >= cfg.max_steps {
            tracing::info!(steps = cfg.max_steps, "simulation finished (max_steps)");
            ctx.shutdown.cancelled().await;
            break;
        }
        let advance = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            ev = rx.recv() => match ev {
                Some(Event::Applied(a)) => sim.accept(&a, &metrics) && cfg.clock == ClockMode::Lockstep,
                Some(_) => false,
                None => break,
            },
            _ = tokio::time::sleep_until(deadline) => {
                if cfg.clock == ClockMode::Lockstep && sim.pending.missing() > 0 {
                    tracing::warn!(step = sim.global_step(), missing = sim.pending.missing(), "step timeout: stepping with late targets unchanged");
                }
                true
            }
        };
        if advance {
            // A step that starts late (the previous publishing overran the period) does not
            // make the next ones catch up in a burst.
            deadline = (deadline + period).max(tokio::time::Instant::now());
            sim.step(&metrics)?;
            sim.publish_all(&ctx, &metrics, spread, &mut publishing, lockstep)
                .await;
            if lockstep {
                deadline = tokio::time::Instant::now() + period;
                if sim.pending.is_complete() {
                    // no app on the cluster: nothing to wait for
                    deadline = tokio::time::Instant::now();
                }
            }
        }
    }
    if let Some(p) = publishing {
        let _ = p.await;
    }
    ctx.ready.set(false);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::config::SimInjection;

    fn source(injections: Vec<SimInjection>) -> SimulatorSourceConfig {
        SimulatorSourceConfig {
            apps: 4,
            seed: 7,
            injections,
            ..SimulatorSourceConfig::default()
        }
    }

    fn inj(target: &str, step: u64, scenario: &str) -> SimInjection {
        SimInjection {
            target: target.into(),
            step,
            scenario: scenario.into(),
        }
    }

    #[test]
    fn injections_are_checked_against_loadgen_and_the_apps() {
        let apps = build_apps(&source(vec![])).unwrap();
        let name = apps[0].name.clone();
        let ok = sim_config(&source(vec![inj(&name, 6, "load_low_to_high")]), &apps).unwrap();
        assert_eq!(
            ok.injections,
            [Injection {
                target: name.clone(),
                step: 6,
                scenario: Scenario::LoadLowToHigh
            }]
        );
        assert_eq!((ok.seed, ok.step_seconds), (7, 10.0));
        let err = |cfg: SimulatorSourceConfig| sim_config(&cfg, &apps).unwrap_err().to_string();
        let e = err(source(vec![
            inj(&name, 1, "load_low_to_high"),
            inj(&name, 2, "load_up"),
        ]));
        assert!(e.contains("collector.simulator.injections[1]"), "{e}");
        assert!(
            e.contains("\"load_up\"") && e.contains("matrix_dimension"),
            "{e}"
        );
        let e = err(source(vec![inj("no-such-app", 1, "float_ops")]));
        assert!(
            e.contains("injections[0]") && e.contains("no-such-app"),
            "{e}"
        );
        // A payload scenario none of the app's segments has.
        let (app, sc) = apps
            .iter()
            .find_map(|a| {
                Scenario::ALL
                    .into_iter()
                    .find(|s| !s.applies_to_app(a))
                    .map(|s| (a.name.clone(), s))
            })
            .expect("a generated app without some payload family");
        let sc = serde_json::to_value(sc).unwrap();
        let e = err(source(vec![inj(&app, 1, sc.as_str().unwrap())]));
        assert!(e.contains("changes nothing"), "{e}");
        // The file form: unknown keys are refused.
        let parsed: SimulatorSourceConfig = serde_json::from_value(serde_json::json!({
            "injections": [{ "target": "a", "step": 5, "scenario": "float_ops" }]
        }))
        .unwrap();
        assert_eq!(parsed.injections, [inj("a", 5, "float_ops")]);
        assert!(
            serde_json::from_value::<SimulatorSourceConfig>(serde_json::json!({
                "injections": [{ "target": "a", "at": 5, "scenario": "float_ops" }]
            }))
            .is_err()
        );
    }

    /// The example configuration loads through the services' loader (defaults → file) with
    /// both injections, and the collector accepts them.
    #[test]
    fn the_instability_example_loads_and_its_injections_are_accepted() {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/examples/simulator-instability.toml");
        let cfg = aware_shared::config::load(&aware_shared::config::ConfigSources {
            file: Some(file),
            env: Some(Default::default()),
            ..Default::default()
        })
        .unwrap();
        let collector = crate::config::CollectorConfig::read(&cfg).unwrap();
        let sim = &collector.simulator;
        assert_eq!((sim.apps, sim.seed), (4, 1));
        assert!(!cfg.lifecycle.bootstrap);
        let apps = build_apps(sim).unwrap();
        let injections = sim_config(sim, &apps).unwrap().injections;
        assert_eq!(
            injections,
            [
                Injection {
                    target: "app-0001".into(),
                    step: 3000,
                    scenario: Scenario::LoadLowToHigh
                },
                Injection {
                    target: "app-0002".into(),
                    step: 4500,
                    scenario: Scenario::LoadHighToLow
                }
            ]
        );
    }

    /// A NaN, infinite or negative measurement makes the simulator's `obs` incomplete, naming
    /// it: no state, no reward, so no action is taken on a zero allocation.
    #[test]
    fn unusable_measurements_make_an_incomplete_obs() {
        let apps = build_apps(&source(vec![])).unwrap();
        let cfg = source(vec![]);
        let mut env = SimEnv::new(apps.clone(), sim_config(&cfg, &apps).unwrap()).unwrap();
        env.reset(cfg.seed).unwrap();
        env.step(&vec![TargetAction::Hold; apps.len()]).unwrap();
        let o = env.step(&vec![TargetAction::Hold; apps.len()]).unwrap()[0].clone();
        let t = Target::new(apps[0].namespace.clone(), apps[0].name.clone());
        let ok = to_obs(&o, &t, 1, 10, 0, false, None);
        assert!(ok.complete && ok.missing.is_empty() && ok.reward.is_some());
        type Set = fn(&mut aware_loadgen::cluster::SimMetrics, f64);
        let cases: [(&str, Set); 4] = [
            ("cpu_limit_cores", |m, v| m.cpu_limit_cores = v),
            ("memory_limit_bytes", |m, v| m.memory_limit_bytes = v),
            ("cpu_usage_cores", |m, v| m.cpu_usage_cores = v),
            ("cpu_util", |m, v| m.cpu_util = v),
        ];
        for (name, set) in cases {
            for v in [f64::NAN, f64::INFINITY, -1.0] {
                let mut bad = o.clone();
                set(&mut bad.metrics, v);
                let obs = to_obs(&bad, &t, 1, 10, 0, false, None);
                assert!(!obs.complete, "{name} = {v}");
                assert_eq!(obs.missing, vec![name.to_string()], "{name} = {v}");
                assert!(obs.state.is_empty() && obs.reward.is_none());
            }
        }
        let mut bad = o.clone();
        bad.metrics.memory_limit_bytes = 0.0;
        assert_eq!(
            to_obs(&bad, &t, 1, 10, 0, false, None).missing,
            ["memory_limit_bytes"]
        );
        let mut bad = o;
        bad.reward = f64::NAN;
        let obs = to_obs(&bad, &t, 1, 10, 0, false, None);
        assert!(!obs.complete && obs.missing == ["reward"]);
    }

    /// The slots of a step: a repeat replaces a decision without counting twice, the step is
    /// complete only once every target has one, and `take` empties them for the next step.
    #[test]
    fn pending_counts_each_target_once_and_resets_at_each_step() {
        let mut p = Pending::new(3);
        assert!(!p.fill(0, TargetAction::Hold));
        assert!(
            !p.fill(0, TargetAction::Raw([0.5; 3])),
            "a repeat is no new slot"
        );
        assert_eq!(p.missing(), 2);
        assert!(!p.fill(2, TargetAction::Hold));
        assert!(p.fill(1, TargetAction::Hold));
        assert!(p.fill(1, TargetAction::Hold), "still complete");
        assert_eq!(
            p.take(),
            vec![
                TargetAction::Raw([0.5; 3]),
                TargetAction::Hold,
                TargetAction::Hold
            ]
        );
        assert_eq!(p.missing(), 3);
        assert!(!p.fill(1, TargetAction::Hold), "the next step starts empty");
        assert_eq!(p.take()[0], TargetAction::Hold, "missing: held");
        assert!(Pending::new(0).is_complete());
    }

    /// With `collector.simulator.cluster`, the apps share its nodes: on a cluster with room for
    /// one replica, the others are Pending and the step's `obs` say how many, per target;
    /// without one, `obs` carry no Pending count (not read) and encode as before.
    #[test]
    fn a_shared_cluster_reaches_the_obs_as_pending_replicas() {
        let mut cfg = source(vec![]);
        let apps = build_apps(&cfg).unwrap();
        let wanted: u32 = apps.iter().map(|a| a.initial.replicas).sum();
        let cpu = apps.iter().map(|a| a.initial.cpu_millicores).max().unwrap();
        let memory = apps.iter().map(|a| a.initial.memory_bytes).max().unwrap();
        cfg.cluster = Some(crate::config::SimClusterConfig {
            nodes: 1,
            node_cpu_millicores: u64::from(cpu),
            node_memory_bytes: memory,
            lend_idle: false,
        });
        cfg.burst_headroom = 0.5;
        let sim = sim_config(&cfg, &apps).unwrap();
        assert!(sim.cluster.is_some());
        assert_eq!(sim.node_share.burst_headroom, 0.5);
        let targets: Vec<Target> = apps
            .iter()
            .map(|a| Target::new(a.namespace.clone(), a.name.clone()))
            .collect();
        let mut env = SimEnv::new(apps.clone(), sim).unwrap();
        env.reset(cfg.seed).unwrap();
        let last = env.step(&vec![TargetAction::Hold; apps.len()]).unwrap();
        let shared = env.cluster_occupancy().is_some();
        let pending: Vec<u32> = last
            .iter()
            .zip(&targets)
            .map(|(o, t)| {
                to_obs(o, t, 0, 10, 0, shared, None)
                    .metrics
                    .pending_replicas
                    .unwrap()
            })
            .collect();
        assert!(shared);
        let occupancy = env.cluster_occupancy().unwrap();
        assert_eq!(pending, occupancy.pending_by_target);
        let total: u32 = pending.iter().sum();
        assert!(
            total > 0 && total < wanted,
            "a node with room for the largest replica: {pending:?} of {wanted}"
        );
        cfg.cluster = None;
        let mut env = SimEnv::new(apps.clone(), sim_config(&cfg, &apps).unwrap()).unwrap();
        env.reset(cfg.seed).unwrap();
        let last = env.step(&vec![TargetAction::Hold; apps.len()]).unwrap();
        assert!(env.cluster_occupancy().is_none());
        let o = to_obs(&last[0], &targets[0], 0, 10, 0, false, None);
        assert_eq!(o.metrics.pending_replicas, None);
    }

    /// With `learning.mean_field`, every `obs` state ends with the target's mean field: on a
    /// crowded shared cluster, a scale-up of one target shows in the others' allocation change
    /// (not its own), and the cluster's Pending share is the simulator's own count.
    #[test]
    fn the_mean_field_ends_each_state_and_sees_the_others() {
        let mut cfg = source(vec![]);
        let apps = build_apps(&cfg).unwrap();
        let cpu: u64 = apps
            .iter()
            .map(|a| u64::from(a.initial.cpu_millicores) * u64::from(a.initial.replicas))
            .sum();
        let memory: u64 = apps
            .iter()
            .map(|a| a.initial.memory_bytes * u64::from(a.initial.replicas))
            .sum();
        cfg.cluster = Some(crate::config::SimClusterConfig {
            nodes: 1,
            node_cpu_millicores: cpu,
            node_memory_bytes: memory,
            lend_idle: false,
        });
        let mut sim = started(&cfg, &apps);
        let n = sim.targets.len();
        sim.mean_field = true;
        let sm = aware_shared::telemetry::ServiceMetrics::new("collector").unwrap();
        let metrics = CollectorMetrics::new(&sm).unwrap();
        let width = aware_mdp::state_width(true);
        let first = sim.step_obs(&metrics);
        assert!(first.iter().all(|o| o.complete && o.state.len() == width));
        let change = aware_mdp::STATE_DIM; // others_allocation_change
        assert!(first.iter().all(|o| o.state[change] == 0.0), "no step yet");
        // Target 0 doubles its replicas: the cluster had room for the initial ones only.
        let mut actions = vec![TargetAction::Hold; n];
        let a0 = apps[0].initial;
        actions[0] = TargetAction::Desired(Allocation {
            replicas: a0.replicas * 2,
            ..a0
        });
        sim.advance(&actions, &metrics).unwrap();
        let obs = sim.step_obs(&metrics);
        assert!(obs.iter().all(|o| o.state.len() == width));
        assert_eq!(obs[0].state[change], 0.0, "target 0 sees the others hold");
        let (before, after) = (
            aware_mdp::Prices::cores(&a0),
            aware_mdp::Prices::cores(&sim.last[0].allocation),
        );
        assert!(after > before, "target 0 scaled up");
        let others = ((after - before) / after / (n - 1) as f64) as f32;
        for o in &obs[1..] {
            assert!((o.state[change] - others).abs() < 1e-6, "{:?}", o.state);
        }
        let occupancy = sim.env.cluster_occupancy().unwrap();
        assert!(occupancy.pending_replicas > 0, "the extra replicas wait");
        let wanted: u32 = sim.last.iter().map(|o| o.allocation.replicas).sum();
        let pending = occupancy.pending_replicas as f32 / wanted as f32;
        for o in &obs {
            assert!((o.state[change + 3] - pending).abs() < 1e-6);
            assert!((o.state[change + 1] - occupancy.cpu_requested_share as f32).abs() < 1e-6);
            assert_eq!(
                &o.state[..aware_mdp::STATE_DIM],
                &obs_state(&sim, &o.target)
            );
        }
        sim.mean_field = false;
        assert!(sim
            .step_obs(&metrics)
            .iter()
            .all(|o| o.state.len() == aware_mdp::STATE_DIM));
    }

    /// An app that joins at step 2 and leaves at step 4: only then does it get an `obs` and is
    /// its `applied` awaited; the others' mean field counts it only then.
    #[test]
    fn an_app_gets_obs_and_is_awaited_only_while_on_the_cluster() {
        let late = |apps: &[AppSpec]| crate::config::SimPresence {
            target: apps[3].name.clone(),
            join_step: 2,
            leave_step: Some(4),
        };
        let mut cfg = source(vec![]);
        let apps = build_apps(&cfg).unwrap();
        cfg.presence = vec![late(&apps)];
        cfg.cluster = Some(crate::config::SimClusterConfig {
            nodes: 8,
            node_cpu_millicores: 64_000,
            node_memory_bytes: 512 << 30,
            lend_idle: false,
        });
        let mut sim = started(&cfg, &apps);
        sim.mean_field = true;
        sim.skip_absent();
        let sm = aware_shared::telemetry::ServiceMetrics::new("collector").unwrap();
        let metrics = CollectorMetrics::new(&sm).unwrap();
        let util = aware_mdp::STATE_DIM + 5; // others_cpu_util
        for g in 0..6u64 {
            assert_eq!(sim.global_step(), g);
            let obs = sim.step_obs(&metrics);
            let there = (2..4).contains(&g);
            let names: Vec<&str> = obs.iter().map(|o| o.target.name.as_str()).collect();
            assert_eq!(
                names.contains(&apps[3].name.as_str()),
                there,
                "{g}: {names:?}"
            );
            assert_eq!(obs.len(), if there { 4 } else { 3 }, "step {g}");
            assert_eq!(sim.pending.missing(), obs.len(), "step {g}");
            // target 0's others: the apps on the cluster but itself
            let others: Vec<f64> = (1..obs.len())
                .map(|i| sim.last[i].metrics.cpu_util.clamp(0.0, 1.0))
                .collect();
            let want = (others.iter().sum::<f64>() / others.len() as f64) as f32;
            assert!((obs[0].state[util] - want).abs() < 1e-5, "step {g}");
            sim.step(&metrics).unwrap();
        }
        assert_eq!(
            metrics.late_targets.get(),
            (4 * 3 + 2 * 4) as u64,
            "every awaited target was late (no applied), the absent never"
        );
        // the entries are checked, naming the key
        for (bad, why) in [
            (
                crate::config::SimPresence {
                    target: "nope".into(),
                    ..late(&apps)
                },
                "no simulated app",
            ),
            (
                crate::config::SimPresence {
                    leave_step: Some(2),
                    ..late(&apps)
                },
                "leave_step",
            ),
        ] {
            cfg.presence = vec![bad];
            let err = sim_config(&cfg, &apps).unwrap_err().to_string();
            assert!(
                err.contains("collector.simulator.presence[0]") && err.contains(why),
                "{err}"
            );
        }
        cfg.presence = vec![late(&apps), late(&apps)];
        let err = sim_config(&cfg, &apps).unwrap_err().to_string();
        assert!(
            err.contains("presence[1]") && err.contains("twice"),
            "{err}"
        );
    }

    /// The simulated cluster of `cfg`'s `apps` after its warm-up step, 10 steps per episode.
    fn started(cfg: &SimulatorSourceConfig, apps: &[AppSpec]) -> Sim {
        let targets: Vec<Target> = apps
            .iter()
            .map(|a| Target::new(a.namespace.clone(), a.name.clone()))
            .collect();
        let mut env = SimEnv::new(apps.to_vec(), sim_config(cfg, apps).unwrap()).unwrap();
        env.reset(cfg.seed).unwrap();
        let last = env.step(&vec![TargetAction::Hold; targets.len()]).unwrap();
        Sim::new(env, targets, last, 10, 0)
    }

    fn obs_state(sim: &Sim, t: &Target) -> Vec<f32> {
        sim.last[sim.index[t]].state.to_vec()
    }

    /// `accept` through a real simulated cluster: duplicates, a rejected duplicate, a stale
    /// `applied` and one for an unknown target do not complete a step; the last target's does;
    /// the next step counts again from zero, and a timed-out step counts its late targets.
    #[test]
    fn accept_completes_a_step_once_per_target_whatever_the_repeats() {
        let cfg = source(vec![]);
        let apps = build_apps(&cfg).unwrap();
        let mut sim = started(&cfg, &apps);
        let targets = sim.targets.clone();
        let n = targets.len();
        let sm = aware_shared::telemetry::ServiceMetrics::new("collector").unwrap();
        let metrics = CollectorMetrics::new(&sm).unwrap();
        let Some(Event::Applied(proto)) = aware_bus_schemas::generated::samples()
            .into_iter()
            .find(|e| e.kind() == EventKind::Applied)
        else {
            panic!("no applied sample")
        };
        let applied = |t: &Target, g: u64, outcome| Applied {
            target: t.clone(),
            episode: g / 10,
            step: u32::try_from(g % 10).unwrap(),
            outcome,
            ..proto.clone()
        };
        use aware_bus_schemas::Outcome::{Applied as Done, Rejected};
        for g in [0u64, 1] {
            assert_eq!(sim.global_step(), g);
            for t in &targets[..n - 1] {
                assert!(!sim.accept(&applied(t, g, Done), &metrics));
                assert!(!sim.accept(&applied(t, g, Done), &metrics), "duplicate");
                assert!(
                    !sim.accept(&applied(t, g, Rejected), &metrics),
                    "rejected duplicate"
                );
            }
            assert!(
                !sim.accept(&applied(&targets[n - 1], g + 1, Done), &metrics),
                "future"
            );
            assert!(!sim.accept(&applied(&Target::new("x", "y"), g, Done), &metrics));
            if g > 0 {
                assert!(
                    !sim.accept(&applied(&targets[n - 1], g - 1, Done), &metrics),
                    "stale"
                );
            }
            assert_eq!(sim.pending.missing(), 1);
            assert!(sim.accept(&applied(&targets[n - 1], g, Rejected), &metrics));
            // The rejected duplicates kept the applied decisions; the rejection holds.
            let kept = sim
                .pending
                .slots
                .iter()
                .filter(|s| matches!(s, Some(TargetAction::Desired(_))))
                .count();
            assert_eq!(kept, n - 1);
            sim.step(&metrics).unwrap();
            assert_eq!(sim.pending.missing(), n);
        }
        assert_eq!(
            metrics.stale_applied.get(),
            3,
            "a future one each step, a stale one in the second"
        );
        assert_eq!(metrics.late_targets.get(), 0);
        assert!(!sim.accept(&applied(&targets[0], 2, Done), &metrics));
        sim.step(&metrics).unwrap();
        assert_eq!(metrics.late_targets.get(), n as u64 - 1);
    }

    /// The collector's cluster shows a scheduled load rise in the observation of exactly the
    /// configured global step (the warm-up step is step 0), and only for that app.
    #[test]
    fn a_scheduled_scenario_shows_from_its_global_step() {
        let apps = build_apps(&source(vec![])).unwrap();
        let offered = |injections| {
            let cfg = source(injections);
            let mut env = SimEnv::new(apps.clone(), sim_config(&cfg, &apps).unwrap()).unwrap();
            env.reset(cfg.seed).unwrap();
            (0..10)
                .map(|_| {
                    env.step(&vec![TargetAction::Hold; apps.len()])
                        .unwrap()
                        .iter()
                        .map(|o| o.metrics.offered_rps)
                        .collect::<Vec<f64>>()
                })
                .collect::<Vec<_>>()
        };
        let base = offered(vec![]);
        let risen = offered(vec![inj(&apps[1].name, 6, "load_low_to_high")]);
        for g in 0..10 {
            for a in 0..apps.len() {
                if a == 1 && g >= 6 {
                    let r = risen[g][a] / base[g][a];
                    assert!((r - 3.0).abs() < 0.05, "step {g}: ×{r}");
                } else {
                    assert_eq!(risen[g][a], base[g][a], "app {a} step {g}");
                }
            }
        }
    }
}
