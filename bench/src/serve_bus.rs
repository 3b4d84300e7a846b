//! `aware bench serve --bus`: the serve protocol run by the six services on the embedded bus,
//! after the in-process arms, with the agents those arms were trained with.
//!
//! Each bus arm starts the services on a fresh embedded bus in the state a previous run of the
//! services would have left after converging, and lets them meet the same scenarios:
//! - the model store holds each agent's checkpoint as the target's version 1 (what the trainer
//!   resumes from, what the recommenders load);
//! - the trajectory store (SQLite) holds the agent's training transitions, numbered as the
//!   services would have recorded them (episodes 0 … `train_episodes` − 1, RL rows, ONLINE);
//! - the bus retains, per target, a registration carrying the Algorithm 1 profile the in-process
//!   `with_retraining` arm uses (`t_serving`, `t_var`, window), the `model` of version 1 and the
//!   `lifecycle` SERVING (from ONLINE), as on a restart from the JetStream capture;
//! - the simulated cluster (`collector.simulator`, the same apps and seed) fast-forwards to the
//!   end of training (`start_step`, allocations held) and injects the arm's scenarios
//!   (`injections`) at the serve steps the in-process arms use.
//!
//! Arms: `bus_with_retraining` (the services' defaults: Algorithm 1 sends a degraded target back
//! to ONLINE, the trainer retrains from the stored history, the recommenders explore) and
//! `bus_without_retraining` (the same, but the registered profile can never leave SERVING:
//! `t_serving` −10⁹, `t_var` 10⁹). The loop is paced like `bench bootstrap`: a subscriber to
//! `obs` sleeps `pace_ms` after every round of the apps' observations and the in-process bus's
//! back-pressure reaches the lock-step collector, so the trainer's rounds keep up.
//!
//! Differences from the in-process arms, stated: the simulator's noise streams are the
//! collector's (one seed for the cluster) rather than one per app, and the allocation at the
//! start of the window is the one held through the fast-forward rather than the agent's last;
//! actions pass the actuator's guardrails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aware_bus_schemas::{
    encode_event, subject, DecisionSource, Event, Lifecycle, Model, ModelKind, Registration,
    Resources, Schema, Stage, Target,
};
use aware_loadgen::app::AppSpec;
use aware_loadgen::Scenario;
use aware_metrics_collector::config::{CollectorConfig, SimInjection, SourceKind};
use aware_shared::bus::Bus;
use aware_shared::config::{AppConfig, LifecycleProfile};
use aware_shared::model_store::{model_key, LocalDirStore, ModelStore};
use aware_shared::registry::to_registered;
use aware_stores::trajectory::{self as tstore, SqliteStore, TrajectoryStore};
use bytes::Bytes;
use serde::Serialize;

use super::{fail, BenchError};

/// One transition of an agent's training, as the services would have recorded it.
#[derive(Debug, Clone)]
pub struct TrainRow {
    pub state: Vec<f32>,
    pub action: [f32; aware_shared_model::ACTION_DIM],
    pub reward: f64,
    pub next_state: Vec<f32>,
    /// The allocation in force after the action.
    pub applied: Resources,
    pub slo_violation: bool,
    pub cpu_util: f64,
    pub memory_util: f64,
}

/// What the in-process part hands to the bus arms for one app.
#[derive(Debug, Clone)]
pub struct Handoff {
    pub app: AppSpec,
    /// The converged agent's checkpoint (`Ddpg::to_bytes`).
    pub checkpoint: Vec<u8>,
    pub trained_steps: u64,
    pub rows: Vec<TrainRow>,
    /// The `with_retraining` arm's Algorithm 1 profile.
    pub profile: LifecycleProfile,
    /// Scenarios at serve steps (0 = the first step of the serve window).
    pub injections: Vec<(u64, Scenario)>,
    /// First serve episode with every scenario in force.
    pub final_regime_from: usize,
}

#[derive(Debug, Clone)]
pub struct BusOptions {
    pub apps: usize,
    pub seed: u64,
    pub train_episodes: u32,
    pub serve_episodes: u32,
    pub steps_per_episode: u32,
    pub pace_ms: u64,
    pub timeout: Duration,
    pub work: PathBuf,
    /// Settings other than the services' defaults, as (dotted path `section.key[.key…]`,
    /// value): tests make the trainer's rounds small; the bench uses the defaults.
    pub settings: Vec<(String, serde_json::Value)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusArm {
    WithRetraining,
    WithoutRetraining,
}

impl BusArm {
    pub fn name(self) -> &'static str {
        match self {
            BusArm::WithRetraining => "bus_with_retraining",
            BusArm::WithoutRetraining => "bus_without_retraining",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct BusArmReport {
    pub arm: String,
    pub apps: usize,
    pub episodes: usize,
    pub steps: u64,
    pub total_reward: f64,
    pub mean_reward: f64,
    pub slo_violations: u64,
    pub slo_violation_rate: f64,
    /// Σ reward and SLO violations of the episodes with every scenario in force.
    pub final_regime_reward: f64,
    pub final_regime_slo_violations: u64,
    /// Steps of those episodes.
    pub final_regime_steps: u64,
    /// With the in-process `converged_disturbed` arm (`--disturbed-reference`): the final
    /// regime's reward per step against RL converged on the changed workload over the same apps
    /// and episodes, % (see [`against_reference`]).
    pub final_regime_vs_reference_pct: Option<f64>,
    /// The final regime per app (by target name, in name order).
    pub final_regime_per_app: Vec<BusAppFinal>,
    /// SERVING → ONLINE (Algorithm 1's retraining trigger).
    pub retrain_triggers: usize,
    /// ONLINE → SERVING.
    pub returns_to_serving: usize,
    /// Of those, rollbacks to the version in force at the trigger (`Lifecycle::rollback_to`).
    pub rollbacks: usize,
    /// Episodes recorded ONLINE.
    pub online_episodes: usize,
    /// Steps the agent decided and steps the HPA/VPA fallback decided (none: the adopted
    /// agents drive from the first step).
    pub rl_steps: u64,
    pub fallback_steps: u64,
    /// `model` versions the trainer published (beyond the adopted version 1).
    pub models_published: u64,
    /// Gradient steps of the published models, fewest and most (above the adopted agent's:
    /// the trainer resumed from it).
    pub min_trained_steps: Option<u64>,
    pub max_trained_steps: u64,
    /// Scenarios the collector injected (`aware_collector_scenarios_injected_total`).
    pub scenarios_injected: u64,
    /// Mean per-step reward by serve episode (mean over apps).
    pub curve: Vec<f64>,
    pub wall_seconds: f64,
}

/// One app's final regime on one bus arm.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BusAppFinal {
    pub app: String,
    /// Mean per-step reward.
    pub reward: f64,
    pub slo_violations: u64,
    pub steps: u64,
    /// Against the in-process reference on the same app, % (see [`against_reference`]).
    pub vs_reference_pct: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BusReport {
    pub pace_ms: u64,
    /// The first serve episode's number on the bus (= `train_episodes`).
    pub first_episode: u64,
    pub arms: Vec<BusArmReport>,
    /// bus_without_retraining SLO violations ÷ bus_with_retraining's.
    pub slo_ratio_without_vs_with: f64,
    /// bus_with_retraining reward ÷ bus_without_retraining's − 1, %.
    pub with_vs_without_reward_pct: f64,
    /// The same over the final regime.
    pub final_regime_with_vs_without_pct: f64,
}

/// `loadgen`'s name of a scenario (`collector.simulator.injections[].scenario`).
pub fn scenario_name(s: Scenario) -> Result<String, BenchError> {
    match serde_json::to_value(s).map_err(fail)? {
        serde_json::Value::String(n) => Ok(n),
        other => Err(fail(format!("scenario {s:?} serializes as {other}"))),
    }
}

fn target_of(app: &AppSpec) -> Target {
    Target::new(app.namespace.clone(), app.name.clone())
}

/// The services' configuration of an arm (everything at the services' defaults but the
/// simulated cluster, the stores, the trainer's poll interval and `opts.settings`).
pub fn arm_config(
    opts: &BusOptions,
    handoffs: &[Handoff],
    dir: &Path,
) -> Result<AppConfig, BenchError> {
    let spe = u64::from(opts.steps_per_episode);
    let start = u64::from(opts.train_episodes) * spe;
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.learning.steps_per_episode = opts.steps_per_episode;
    // The paper's measures, in the paper's reward: its weighted objective (ADR 0016).
    cfg.learning.objective.mode = aware_mdp::ObjectiveMode::Weighted;
    let mut collector = CollectorConfig {
        source: SourceKind::Simulator,
        ..CollectorConfig::default()
    };
    collector.simulator.apps = opts.apps;
    collector.simulator.seed = opts.seed;
    collector.simulator.step_timeout_ms = 60_000;
    collector.simulator.start_step = start;
    collector.simulator.max_steps = start + (u64::from(opts.serve_episodes) + 1) * spe + 1;
    let mut injections = Vec::new();
    for h in handoffs {
        for (at, sc) in &h.injections {
            // In process the scenario is injected before the step's action is taken, so the
            // step after it is the first to show it.
            injections.push(SimInjection {
                target: h.app.name.clone(),
                step: start + at + 1,
                scenario: scenario_name(*sc)?,
            });
        }
    }
    collector.simulator.injections = injections;
    let apps = aware_metrics_collector::simulator::build_apps(&collector.simulator)?;
    cfg.set_section("collector", &collector)?;
    for (a, h) in apps.iter().zip(handoffs) {
        if a.name != h.app.name {
            return Err(fail(format!(
                "the collector's app {} is not the bench's {}",
                a.name, h.app.name
            )));
        }
    }
    cfg.targets = aware_metrics_collector::simulator::target_specs(&apps);
    cfg.sections.insert(
        "trajectory_store".into(),
        serde_json::json!({ "sqlite_path": dir.join("t.db").display().to_string() }),
    );
    cfg.sections
        .insert("recorder".into(), serde_json::json!({ "batch": 64 }));
    cfg.sections.insert(
        "model_store".into(),
        serde_json::json!({ "dir": dir.join("models").display().to_string() }),
    );
    cfg.sections
        .insert("trainer".into(), serde_json::json!({ "poll_ms": 50 }));
    // The in-process arms' Algorithm 1 knows no SLO, so it has no error-budget guard (ADR 0014):
    // neither have these, so the arms compare the retraining trigger alone (`--set
    // lifecycle_monitor.error_budget=true` measures the guard on the bus).
    cfg.sections.insert(
        "lifecycle_monitor".into(),
        serde_json::json!({ "error_budget": false }),
    );
    // The paper's agent has no capacity shield (ADR 0029) either.
    cfg.sections.insert(
        "recommender".into(),
        serde_json::json!({ "capacity_shield_steps": 0 }),
    );
    for (path, value) in &opts.settings {
        aware_harness::set_path(&mut cfg.sections, path, value.clone())?;
    }
    Ok(cfg)
}

/// The Algorithm 1 profile registered for a target in `arm`.
pub fn arm_profile(arm: BusArm, p: &LifecycleProfile) -> LifecycleProfile {
    match arm {
        BusArm::WithRetraining => p.clone(),
        // Never leaves SERVING: no window mean is below −10⁹, no std above 10⁹.
        BusArm::WithoutRetraining => LifecycleProfile {
            t_serving: -1e9,
            t_var: 1e9,
            ..p.clone()
        },
    }
}

/// Writes the stores: each agent's checkpoint as version 1 and its training transitions.
/// Returns the `model` message of every target.
fn seed_stores(
    opts: &BusOptions,
    handoffs: &[Handoff],
    dir: &Path,
) -> Result<Vec<Model>, BenchError> {
    let models = LocalDirStore::open(dir.join("models")).map_err(fail)?;
    let store = SqliteStore::open_path(dir.join("t.db")).map_err(fail)?;
    let spe = u64::from(opts.steps_per_episode.max(1));
    let base_ms = aware_bus_schemas::now_ms()
        - 10_000 * (handoffs.first().map_or(0, |h| h.rows.len()) as i64 + 1);
    let mut out = Vec::with_capacity(handoffs.len());
    for h in handoffs {
        let target = target_of(&h.app);
        let object = models
            .put(
                &model_key(
                    &target,
                    aware_meta_learner_trainer::learner::BASE_LEARNER,
                    1,
                ),
                &h.checkpoint,
            )
            .map_err(fail)?;
        let rows: Vec<tstore::Transition> = h
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| tstore::Transition {
                target: target.clone(),
                episode: i as u64 / spe,
                step: u32::try_from(i as u64 % spe).unwrap_or(0),
                ts_ms: base_ms + 10_000 * i as i64,
                state: r.state.clone(),
                action_raw: r.action.to_vec(),
                desired: r.applied,
                applied: r.applied,
                source: DecisionSource::Rl,
                stage: Stage::Online,
                reward: r.reward,
                next_state: r.next_state.clone(),
                slo_violation: r.slo_violation,
                cpu_util: r.cpu_util,
                memory_util: r.memory_util,
            })
            .collect();
        for chunk in rows.chunks(4096) {
            store.append(chunk).map_err(fail)?;
        }
        let last = h.rows.len().saturating_sub(1) as u64;
        out.push(Model {
            schema: Schema::new(),
            target,
            episode: last / spe,
            step: u32::try_from(last % spe).unwrap_or(0),
            ts_ms: aware_bus_schemas::now_ms(),
            kind: ModelKind::BaseLearner,
            version: 1,
            uri: object.uri,
            sha256: object.sha256,
            size_bytes: object.size_bytes,
            trained_steps: h.trained_steps,
            policy_estimate: None,
            behaviour_reward: None,
        });
    }
    Ok(out)
}

async fn publish(bus: &Bus, ev: Event) -> Result<(), BenchError> {
    let subj = subject::subject(ev.kind(), ev.target()).map_err(fail)?;
    let payload = encode_event(&ev).map_err(fail)?;
    bus.publish(&subj, Bytes::from(payload)).await?;
    Ok(())
}

/// Publishes (and so retains) every target's registration, model and SERVING stage.
async fn seed_bus(
    bus: &Bus,
    arm: BusArm,
    cfg: &AppConfig,
    handoffs: &[Handoff],
    models: Vec<Model>,
) -> Result<(), BenchError> {
    for ((h, spec), model) in handoffs.iter().zip(&cfg.targets).zip(models) {
        let target = target_of(&h.app);
        let (episode, step, ts_ms) = (model.episode, model.step, model.ts_ms);
        publish(
            bus,
            Event::Registration(Registration {
                schema: Schema::new(),
                target: target.clone(),
                episode,
                step,
                ts_ms,
                generation: 1,
                source: format!("{}/{}", target.namespace, target.name),
                spec: Some(to_registered(spec, Some(&arm_profile(arm, &h.profile)))),
            }),
        )
        .await?;
        publish(bus, Event::Model(model)).await?;
        publish(
            bus,
            Event::Lifecycle(Lifecycle {
                schema: Schema::new(),
                target,
                episode,
                step,
                ts_ms,
                stage: Stage::Serving,
                previous: Some(Stage::Online),
                reason: "converged in `bench serve` (adopted)".into(),
                reward_mean: None,
                reward_std: None,
                window: u32::try_from(h.profile.window).unwrap_or(u32::MAX),
                rollback_to: None,
            }),
        )
        .await?;
    }
    Ok(())
}

#[derive(Default)]
struct Row {
    reward: f64,
    slo: u64,
    steps: u64,
    online: bool,
    rl: u64,
    fallback: u64,
}

/// Runs one bus arm to the end of the serve window.
pub async fn run_arm(
    opts: &BusOptions,
    handoffs: &[Handoff],
    arm: BusArm,
) -> Result<BusArmReport, BenchError> {
    let dir = opts.work.join(arm.name());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let cfg = arm_config(opts, handoffs, &dir)?;
    let models = seed_stores(opts, handoffs, &dir)?;
    let bus = Bus::in_process((4 * opts.apps).max(64));
    seed_bus(&bus, arm, &cfg, handoffs, models).await?;
    let first = u64::from(opts.train_episodes);
    let want = opts.serve_episodes as usize;
    let from: BTreeMap<Target, u64> = handoffs
        .iter()
        .map(|h| (target_of(&h.app), first + h.final_regime_from as u64))
        .collect();
    let started = Instant::now();
    let mut services = aware_harness::PacedServices::start(
        bus,
        cfg,
        opts.apps,
        Duration::from_millis(opts.pace_ms),
        opts.timeout,
    )
    .await?;
    let mut eps: BTreeMap<Target, BTreeMap<u64, Row>> = BTreeMap::new();
    let (mut triggers, mut returns, mut models, mut max_trained) = (0usize, 0usize, 0u64, 0u64);
    let mut min_trained: Option<u64> = None;
    let mut rollbacks = 0usize;
    let done = |eps: &BTreeMap<Target, BTreeMap<u64, Row>>| {
        eps.len() >= opts.apps && eps.values().all(|e| e.len() >= want)
    };
    while !done(&eps) {
        let Some(ev) = services.next_event().await else {
            break;
        };
        match ev {
            Event::Episode(e) if e.episode >= first => {
                let m = eps.entry(e.target).or_default();
                if m.len() < want {
                    m.insert(
                        e.episode,
                        Row {
                            reward: e.total_reward,
                            slo: u64::from(e.slo_violations),
                            steps: u64::from(e.steps),
                            online: e.stage == Stage::Online,
                            rl: u64::from(e.rl_steps),
                            fallback: u64::from(e.fallback_steps),
                        },
                    );
                }
            }
            Event::Lifecycle(l) => match (l.previous, l.stage) {
                (Some(Stage::Serving), Stage::Online) => {
                    triggers += 1;
                    tracing::info!(arm = arm.name(), target = %l.target, reason = %l.reason, "retraining");
                }
                (Some(Stage::Online), Stage::Serving) => {
                    returns += 1;
                    if let Some(v) = l.rollback_to {
                        rollbacks += 1;
                        tracing::info!(arm = arm.name(), target = %l.target, to = v, reason = %l.reason, "rolled back");
                    }
                }
                _ => {}
            },
            Event::Model(md) if md.version > 1 => {
                models += 1;
                max_trained = max_trained.max(md.trained_steps);
                min_trained =
                    Some(min_trained.map_or(md.trained_steps, |m| m.min(md.trained_steps)));
            }
            _ => {}
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let injected = services.counter("aware_collector_scenarios_injected_total") as u64;
    services.stop().await?;
    if !done(&eps) {
        return Err(BenchError::Failed(format!(
            "bus arm {}: only {} apps / {:?} serve episodes within {:?}",
            arm.name(),
            eps.len(),
            eps.values().map(BTreeMap::len).min(),
            opts.timeout
        )));
    }
    let rows: Vec<&Row> = eps.values().flat_map(BTreeMap::values).collect();
    let steps: u64 = rows.iter().map(|r| r.steps).sum();
    let total_reward: f64 = rows.iter().map(|r| r.reward).sum();
    let slo: u64 = rows.iter().map(|r| r.slo).sum();
    let mut per_app = Vec::with_capacity(eps.len());
    for (t, e) in &eps {
        let f = from.get(t).copied().unwrap_or(first);
        let mut app = BusAppFinal {
            app: t.name.clone(),
            ..BusAppFinal::default()
        };
        for r in e.range(f..).map(|(_, r)| r) {
            app.reward += r.reward;
            app.slo_violations += r.slo;
            app.steps += r.steps;
        }
        per_app.push(app);
    }
    let final_reward: f64 = per_app.iter().map(|a| a.reward).sum();
    let final_slo: u64 = per_app.iter().map(|a| a.slo_violations).sum();
    let final_steps: u64 = per_app.iter().map(|a| a.steps).sum();
    for a in &mut per_app {
        a.reward /= a.steps.max(1) as f64;
    }
    let mut curve = vec![0.0; want];
    for e in eps.values() {
        for (c, r) in curve.iter_mut().zip(e.values()) {
            *c += r.reward / r.steps.max(1) as f64 / eps.len() as f64;
        }
    }
    Ok(BusArmReport {
        arm: arm.name().into(),
        apps: eps.len(),
        episodes: rows.len(),
        steps,
        total_reward,
        mean_reward: total_reward / steps.max(1) as f64,
        slo_violations: slo,
        slo_violation_rate: slo as f64 / steps.max(1) as f64,
        final_regime_reward: final_reward,
        final_regime_slo_violations: final_slo,
        final_regime_steps: final_steps,
        final_regime_vs_reference_pct: None,
        final_regime_per_app: per_app,
        retrain_triggers: triggers,
        returns_to_serving: returns,
        rollbacks,
        online_episodes: rows.iter().filter(|r| r.online).count(),
        rl_steps: rows.iter().map(|r| r.rl).sum(),
        fallback_steps: rows.iter().map(|r| r.fallback).sum(),
        models_published: models,
        min_trained_steps: min_trained,
        max_trained_steps: max_trained,
        scenarios_injected: injected,
        curve,
        wall_seconds: wall,
    })
}

/// Sets each arm's `final_regime_vs_reference_pct` from the in-process reference's reward per
/// step over the final regime (`FinalRegime::converged_disturbed_reward`): the issue's "within
/// x% of the converged policy" measured on the services; and each app's
/// `final_regime_per_app[].vs_reference_pct` from `per_app` (app name → the reference's reward
/// per step on it, `FinalRegime::per_app`). Arms or apps without a final-regime step, or a
/// reference that is not a positive finite number, get `None`.
pub fn against_reference(
    report: &mut BusReport,
    reference_per_step: f64,
    per_app: &BTreeMap<String, f64>,
) {
    let vs = |per_step: f64, steps: u64, reference: f64| {
        (steps > 0 && reference.is_finite() && reference > 0.0)
            .then(|| 100.0 * (per_step / reference - 1.0))
    };
    for a in &mut report.arms {
        a.final_regime_vs_reference_pct = vs(
            a.final_regime_reward / a.final_regime_steps.max(1) as f64,
            a.final_regime_steps,
            reference_per_step,
        );
        for app in &mut a.final_regime_per_app {
            app.vs_reference_pct = per_app
                .get(&app.app)
                .and_then(|r| vs(app.reward, app.steps, *r));
        }
    }
}

/// Both bus arms, with and without retraining.
pub async fn run(opts: &BusOptions, handoffs: &[Handoff]) -> Result<BusReport, BenchError> {
    let with = run_arm(opts, handoffs, BusArm::WithRetraining).await?;
    tracing::info!(wall_s = with.wall_seconds, "bus arm with retraining done");
    let without = run_arm(opts, handoffs, BusArm::WithoutRetraining).await?;
    tracing::info!(
        wall_s = without.wall_seconds,
        "bus arm without retraining done"
    );
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    let pct = |a: f64, b: f64| 100.0 * (a / b - 1.0);
    Ok(BusReport {
        pace_ms: opts.pace_ms,
        first_episode: u64::from(opts.train_episodes),
        slo_ratio_without_vs_with: ratio(without.slo_violations as f64, with.slo_violations as f64),
        with_vs_without_reward_pct: pct(with.total_reward, without.total_reward),
        final_regime_with_vs_without_pct: pct(
            with.final_regime_reward,
            without.final_regime_reward,
        ),
        arms: vec![with, without],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_regime_is_compared_per_step_with_the_reference() {
        let app = |name: &str, reward: f64, steps: u64| BusAppFinal {
            app: name.into(),
            reward,
            steps,
            ..BusAppFinal::default()
        };
        let arm = |name: &str, reward: f64, steps: u64| BusArmReport {
            arm: name.into(),
            final_regime_reward: reward,
            final_regime_steps: steps,
            final_regime_per_app: vec![
                app("app-a", 1.1, steps / 2),
                app("app-b", 0.5, steps / 2),
                app("app-c", 1.0, steps),
            ],
            ..BusArmReport::default()
        };
        let mut r = BusReport {
            pace_ms: 40,
            first_episode: 360,
            arms: vec![
                arm("bus_with_retraining", 96.0, 100),
                arm("bus_without_retraining", 180.0, 200),
                arm("empty", 0.0, 0),
            ],
            slo_ratio_without_vs_with: 1.0,
            with_vs_without_reward_pct: 0.0,
            final_regime_with_vs_without_pct: 0.0,
        };
        let reference: BTreeMap<String, f64> =
            [("app-a".to_string(), 1.0), ("app-b".to_string(), 0.8)].into();
        against_reference(&mut r, 1.2, &reference);
        let pct: Vec<Option<f64>> = r
            .arms
            .iter()
            .map(|a| a.final_regime_vs_reference_pct)
            .collect();
        // 0.96 / 1.2 − 1 = −20%; 0.9 / 1.2 − 1 = −25%; no steps, no figure.
        assert!((pct[0].unwrap() + 20.0).abs() < 1e-9, "{pct:?}");
        assert!((pct[1].unwrap() + 25.0).abs() < 1e-9, "{pct:?}");
        assert_eq!(pct[2], None);
        // Per app: 1.1 / 1.0 − 1 = +10%, 0.5 / 0.8 − 1 = −37.5%; app-c has no reference, and
        // the empty arm's apps no steps.
        let apps = &r.arms[0].final_regime_per_app;
        assert!((apps[0].vs_reference_pct.unwrap() - 10.0).abs() < 1e-9);
        assert!((apps[1].vs_reference_pct.unwrap() + 37.5).abs() < 1e-9);
        assert_eq!(apps[2].vs_reference_pct, None);
        assert!(r.arms[2]
            .final_regime_per_app
            .iter()
            .all(|a| a.vs_reference_pct.is_none()));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let reference: BTreeMap<String, f64> = [("app-a".to_string(), bad)].into();
            against_reference(&mut r, bad, &reference);
            assert!(r
                .arms
                .iter()
                .all(|a| a.final_regime_vs_reference_pct.is_none()
                    && a.final_regime_per_app
                        .iter()
                        .all(|p| p.vs_reference_pct.is_none())));
        }
    }
}
