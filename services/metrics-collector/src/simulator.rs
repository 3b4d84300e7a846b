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

use std::collections::HashMap;
use std::time::Duration;

use aware_bus_schemas::{Applied, Event, EventKind, Obs, RawMetrics, Schema, Target};
use aware_loadgen::app::{generate_apps, AppSet, AppSpec, GeneratorOptions};
use aware_loadgen::env::{Observation, SimConfig, SimEnv, TargetAction};
use aware_shared::config::{ClockMode, SimulatorSourceConfig};
use aware_shared::service::{ServiceContext, ServiceError};

use crate::metrics::CollectorMetrics;

/// Builds the simulated apps: `apps` generated from `seed`, then the app files.
pub fn build_apps(cfg: &SimulatorSourceConfig) -> Result<Vec<AppSpec>, ServiceError> {
    let mut apps = generate_apps(cfg.apps, cfg.seed, &GeneratorOptions::default());
    for path in &cfg.app_files {
        let set = AppSet::read(path)
            .map_err(|e| ServiceError::Other(format!("app file {}: {e}", path.display())))?;
        apps.extend(set.apps);
    }
    Ok(apps)
}

/// The target specs of simulated apps (bounds, SLO, alpha), for the services' configuration.
pub fn target_specs(apps: &[AppSpec]) -> Vec<aware_shared::spec::TargetSpec> {
    apps.iter()
        .map(|a| {
            let b = a.bounds;
            aware_shared::spec::TargetSpec {
                namespace: a.namespace.clone(),
                name: a.name.clone(),
                bounds: aware_shared::spec::Bounds {
                    min_replicas: b.min_replicas,
                    max_replicas: b.max_replicas,
                    min_cpu_millicores: b.min_cpu_millicores,
                    max_cpu_millicores: b.max_cpu_millicores,
                    min_memory_bytes: b.min_memory_bytes,
                    max_memory_bytes: b.max_memory_bytes,
                },
                slo: aware_shared::spec::Slo {
                    latency_p99_ms: a.slo.latency_p99_ms,
                    throughput_rps: a.slo.throughput_rps,
                },
                alpha: a.alpha,
                update_mode: aware_shared::spec::UpdateMode::Auto,
            }
        })
        .collect()
}

/// The `obs` of global step `g` for one target.
pub fn to_obs(
    o: &Observation,
    target: &Target,
    g: u64,
    steps_per_episode: u32,
    base_ms: i64,
) -> Obs {
    let m = &o.metrics;
    let finite = |x: f64| x.is_finite().then_some(x);
    let spe = u64::from(steps_per_episode.max(1));
    Obs {
        schema: Schema::new(),
        target: target.clone(),
        episode: g / spe,
        step: u32::try_from(g % spe).unwrap_or(0),
        ts_ms: base_ms.saturating_add((m.time_s * 1000.0) as i64),
        state: o.state.to_vec(),
        metrics: RawMetrics {
            replicas: m.replicas,
            ready_replicas: m.ready_replicas,
            cpu_limit_cores: m.cpu_limit_cores,
            memory_limit_bytes: m.memory_limit_bytes,
            cpu_usage_cores: m.cpu_usage_cores,
            memory_working_set_bytes: m.memory_working_set_bytes,
            cpu_util: m.cpu_util,
            memory_util: m.memory_util,
            io_util: m.io_util,
            network_util: m.network_util,
            request_rate_rps: m.offered_rps,
            throughput_rps: m.throughput_rps,
            latency_p50_ms: finite(m.p50_ms),
            latency_p99_ms: finite(m.p99_ms),
            oom_kills: m.oom_kills,
        },
        reward: (g > 0).then_some(o.reward),
        slo_violation: m.slo_violation,
        complete: true,
        missing: Vec::new(),
    }
}

struct Sim {
    env: SimEnv,
    targets: Vec<Target>,
    index: HashMap<Target, usize>,
    pending: Vec<Option<TargetAction>>,
    last: Vec<Observation>,
    spe: u32,
    base_ms: i64,
}

impl Sim {
    /// The step whose action is awaited. The cluster runs one warm-up step (allocation
    /// unchanged) before the first `obs`, so every published state comes from real metrics.
    fn global_step(&self) -> u64 {
        self.env.step_index().saturating_sub(1)
    }

    async fn publish_all(&self, ctx: &ServiceContext) {
        let g = self.global_step();
        for (o, t) in self.last.iter().zip(&self.targets) {
            // Failures are counted and logged by `publish`.
            let _ = ctx.publish(&to_obs(o, t, g, self.spe, self.base_ms)).await;
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
        if a.outcome == aware_bus_schemas::Outcome::Rejected && self.pending[i].is_some() {
            // A rejected duplicate must not undo the decision already taken for this step.
            return false;
        }
        self.pending[i] = Some(TargetAction::Desired(aware_loadgen::app::Allocation {
            replicas: a.applied.replicas,
            cpu_millicores: a.applied.cpu_millicores,
            memory_bytes: a.applied.memory_bytes,
        }));
        self.pending.iter().all(Option::is_some)
    }

    fn step(&mut self, metrics: &CollectorMetrics) -> Result<(), ServiceError> {
        let late = self.pending.iter().filter(|p| p.is_none()).count();
        if late > 0 {
            metrics.late_targets.inc_by(late as u64);
        }
        let actions: Vec<TargetAction> = self
            .pending
            .iter_mut()
            .map(|p| p.take().unwrap_or(TargetAction::Hold))
            .collect();
        self.last = self
            .env
            .step(&actions)
            .map_err(|e| ServiceError::Other(format!("simulator step: {e}")))?;
        metrics.steps.inc();
        Ok(())
    }
}

/// Runs the simulator source until shutdown (or `max_steps`).
pub async fn run(ctx: ServiceContext, metrics: CollectorMetrics) -> Result<(), ServiceError> {
    let cfg = ctx.config.collector.simulator.clone();
    let apps = build_apps(&cfg)?;
    let targets: Vec<Target> = apps
        .iter()
        .map(|a| Target::new(a.namespace.clone(), a.name.clone()))
        .collect();
    for t in &targets {
        aware_bus_schemas::subject::subject(EventKind::Obs, t)?;
    }
    let sim_cfg = SimConfig {
        step_seconds: cfg.step_seconds,
        seed: cfg.seed,
        ..SimConfig::default()
    };
    let mut env =
        SimEnv::new(apps, sim_cfg).map_err(|e| ServiceError::Other(format!("simulator: {e}")))?;
    env.reset(cfg.seed)
        .map_err(|e| ServiceError::Other(format!("simulator reset: {e}")))?;
    let n = targets.len();
    let last = env
        .step(&vec![TargetAction::Hold; n])
        .map_err(|e| ServiceError::Other(format!("simulator warm-up step: {e}")))?;
    let mut sim = Sim {
        env,
        index: targets
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, t)| (t, i))
            .collect(),
        targets,
        pending: vec![None; n],
        last,
        spe: ctx.config.collector.steps_per_episode,
        base_ms: aware_bus_schemas::now_ms(),
    };
    metrics.targets.set(i64::try_from(n).unwrap_or(i64::MAX));
    let mut rx = ctx.subscribe_events(&[EventKind::Applied]).await?;
    ctx.ready.set(true);
    tracing::info!(targets = n, clock = ?cfg.clock, "simulated cluster started");
    sim.publish_all(&ctx).await;
    let period = match cfg.clock {
        ClockMode::Lockstep => Duration::from_millis(cfg.step_timeout_ms.max(1)),
        ClockMode::Wallclock => Duration::from_secs_f64(cfg.step_seconds),
    };
    let mut deadline = tokio::time::Instant::now() + period;
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
                if cfg.clock == ClockMode::Lockstep {
                    tracing::warn!(step = sim.global_step(), missing = sim.pending.iter().filter(|p| p.is_none()).count(), "step timeout: stepping with late targets unchanged");
                }
                true
            }
        };
        if advance {
            sim.step(&metrics)?;
            sim.publish_all(&ctx).await;
            deadline = tokio::time::Instant::now() + period;
        }
    }
    ctx.ready.set(false);
    Ok(())
}
