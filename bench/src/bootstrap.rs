//! `aware bench bootstrap` (paper §5.4, Fig. 10): the early-training window of three arms on the
//! same held-out generated apps (same seed, so the same traces), each the six services on the
//! embedded bus in lock-step:
//! - `fallback`: HPA/VPA throughout (bootstrapping on, `t_online` out of reach);
//! - `bootstrap`: AWARE — OFFLINE behind the fallback while the trainer trains TD3+BC from the
//!   fallback's first `offline_episodes` episodes, then ONLINE when the off-policy estimate
//!   allows (and back to OFFLINE if the probation fails);
//! - `no_bootstrap`: the same agent ONLINE from the first step, learning from scratch (the
//!   fallback acts only until its first model exists).
//!
//! Per arm, over the first `episodes` episodes of every app: SLO violations, mean CPU and memory
//! utilization, mean per-step reward, and the reward as % of the oracle's (`loadgen`'s per-step
//! oracle run on the same apps for the same number of steps).
//!
//! Pacing: lock-step simulation runs a step of 20 apps in well under a millisecond, far faster
//! than the trainer (in production a step is 10–30 s and training is never behind). The bench
//! paces the loop the bus's own way: a subscriber to `obs` that sleeps `pace_ms` after every
//! full step, on a bus with small per-subscription buffers, so the collector's publishes wait
//! (the in-process bus applies back-pressure). Every arm gets the same pace; the JSON records
//! the gradient steps each arm got.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use aware_bus_schemas::{Event, Stage, Target};
use aware_loadgen::env::SimConfig;
use aware_loadgen::run::{run_sim, AppSource, PolicySpec, RunSimOptions};
use aware_metrics_collector::config::{CollectorConfig, SourceKind};
use aware_shared::bus::Bus;
use aware_shared::config::AppConfig;
use serde::Serialize;

use super::BenchError;

#[derive(Debug, Clone, clap::Args)]
pub struct BootstrapBenchOptions {
    #[arg(long, default_value_t = BootstrapBenchOptions::default().apps)]
    pub apps: usize,
    /// Generator and noise seed (held out: the tests use small seeds).
    #[arg(long, default_value_t = BootstrapBenchOptions::default().seed)]
    pub seed: u64,
    /// The early window: episodes per app.
    #[arg(long, default_value_t = BootstrapBenchOptions::default().episodes)]
    pub episodes: u32,
    #[arg(long, default_value_t = BootstrapBenchOptions::default().steps_per_episode)]
    pub steps_per_episode: u32,
    /// Fallback episodes the bootstrap arm trains offline from before it may go ONLINE.
    #[arg(long, default_value_t = BootstrapBenchOptions::default().offline_episodes)]
    pub offline_episodes: u32,
    /// Work directory (trajectory stores and model stores of the arms).
    #[arg(skip = BootstrapBenchOptions::default().work)]
    pub work: PathBuf,
    /// Per-arm wall-clock limit.
    #[arg(skip = BootstrapBenchOptions::default().timeout)]
    pub timeout: Duration,
    /// Wall-clock pause after every simulated step (gives the trainer time).
    #[arg(long, default_value_t = BootstrapBenchOptions::default().pace_ms, hide = true, help = "Wall-clock pause after every simulated step, ms (time for the trainer)")]
    pub pace_ms: u64,
    /// `trainer.train_every_transitions` of the RL arms.
    #[arg(long, default_value_t = BootstrapBenchOptions::default().train_every_transitions, hide = true)]
    pub train_every_transitions: u64,
    /// `trainer.exploration_sigma` of the RL arms.
    #[arg(long, default_value_t = BootstrapBenchOptions::default().exploration_sigma, hide = true, help = "σ of the RL arms' exploration noise")]
    pub exploration_sigma: f32,
    /// `trainer.bc_alpha` (TD3+BC λ) of the RL arms.
    #[arg(long, default_value_t = BootstrapBenchOptions::default().bc_alpha, hide = true, help = "TD3+BC λ of the RL arms")]
    pub bc_alpha: f32,
    /// `lifecycle_monitor.probation_margin` / `behaviour_margin` of the bootstrap arm (the
    /// service defaults: 0.10 / 0.05).
    #[arg(long, default_value_t = BootstrapBenchOptions::default().probation_margin, hide = true, help = "`lifecycle_monitor.probation_margin` of the bootstrap arm")]
    pub probation_margin: f64,
    #[arg(long, default_value_t = BootstrapBenchOptions::default().behaviour_margin, hide = true, help = "`lifecycle_monitor.behaviour_margin` of the bootstrap arm")]
    pub behaviour_margin: f64,
    /// `trainer.meta_dir` of the bootstrap arm (an `aware train-meta` output): AWARE with
    /// meta-learning, its base-learner conditioned on the workload embedding of the fallback's
    /// episodes. `None`: the plain base-learner. The other arms never use it.
    #[arg(
        long,
        help = "`trainer.meta_dir` of the bootstrap arm (an `aware train-meta` output): bootstrapping with the meta-trained, embedding-conditioned base-learner"
    )]
    pub meta: Option<PathBuf>,
    /// `trainer.recent_fraction` of both RL arms (recency-mixed replay while ONLINE; 0: off;
    /// default: the services').
    #[arg(long, default_value_t = BootstrapBenchOptions::default().recent_fraction, hide = true, help = "`trainer.recent_fraction` of both RL arms (recency-mixed replay while ONLINE; 0: off)")]
    pub recent_fraction: f32,
    /// `lifecycle_monitor.rebaseline_after_episodes` of both RL arms (0: off; default: the
    /// services').
    #[arg(long, default_value_t = BootstrapBenchOptions::default().rebaseline_after, hide = true, help = "`lifecycle_monitor.rebaseline_after_episodes` of both RL arms (0: off)")]
    pub rebaseline_after: usize,
    /// `recommender.eval_every_episodes` of both RL arms, with
    /// `lifecycle_monitor.online_noise_free_only` (0: off; default: the services').
    #[arg(long, default_value_t = BootstrapBenchOptions::default().eval_every, hide = true, help = "`recommender.eval_every_episodes` of both RL arms, with `lifecycle_monitor.online_noise_free_only` (0: off)")]
    pub eval_every: u32,
    /// Settings of the services other than their defaults in every arm, `(section.key[.key…],
    /// JSON value)`, applied after the bench's own (`--set`).
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = aware_harness::parse_setting, help = "A setting of the services other than its default in every arm, SECTION.KEY=VALUE with a JSON value (repeatable), e.g. --set trainer.learn_action=applied")]
    pub settings: Vec<(String, serde_json::Value)>,
    /// Settings of one arm only, `(arm, section.key[.key…], JSON value)`, applied after
    /// `settings` (`--set-arm`): e.g. each RL arm at its own best `trainer.bc_alpha`.
    #[arg(long = "set-arm", value_name = "ARM:KEY=VALUE", value_parser = crate::cli::parse_arm_setting, help = "A setting of one arm only, ARM:SECTION.KEY=VALUE (ARM: fallback, bootstrap or no_bootstrap; repeatable), applied after --set, e.g. each RL arm at its own best λ: --bc-alpha 100 --set-arm no_bootstrap:trainer.bc_alpha=25")]
    pub arm_settings: Vec<(String, String, serde_json::Value)>,
}

/// The services' defaults of the retraining settings: `trainer.recent_fraction`,
/// `lifecycle_monitor.rebaseline_after_episodes`, `recommender.eval_every_episodes`.
pub fn services_retraining_defaults() -> (f32, usize, u32) {
    (
        aware_meta_learner_trainer::learner::TrainerConfig::default().recent_fraction,
        aware_lifecycle_monitor::MonitorConfig::default().rebaseline_after_episodes,
        aware_recommender::RecommenderConfig::default().eval_every_episodes,
    )
}

impl Default for BootstrapBenchOptions {
    fn default() -> Self {
        let services = services_retraining_defaults();
        BootstrapBenchOptions {
            apps: 20,
            seed: 1001,
            episodes: 20,
            steps_per_episode: 50,
            offline_episodes: 4,
            work: PathBuf::from("bench-out/bootstrap-work"),
            timeout: Duration::from_secs(1800),
            pace_ms: 40,
            train_every_transitions: 100,
            exploration_sigma: 0.2,
            bc_alpha: 2.5,
            probation_margin: 0.10,
            behaviour_margin: 0.05,
            meta: None,
            recent_fraction: services.0,
            rebaseline_after: services.1,
            eval_every: services.2,
            settings: Vec::new(),
            arm_settings: Vec::new(),
        }
    }
}

/// The arms' names, as `--set-arm` and the report spell them.
pub const ARM_NAMES: [&str; 3] = ["fallback", "bootstrap", "no_bootstrap"];

/// One arm's figures over the window.
#[derive(Debug, Clone, Serialize)]
pub struct ArmReport {
    pub arm: String,
    pub episodes: usize,
    pub steps: u64,
    pub slo_violations: u64,
    pub slo_violation_rate: f64,
    pub cpu_util_mean: f64,
    pub memory_util_mean: f64,
    pub mean_reward: f64,
    pub total_reward: f64,
    /// Σ reward / Σ oracle reward over the same apps and steps, in %.
    pub oracle_pct: f64,
    pub rl_steps: u64,
    pub fallback_steps: u64,
    /// Episodes that ran mostly ONLINE.
    pub online_episodes: usize,
    /// Apps that reached ONLINE, and returns to OFFLINE (probation failures).
    pub apps_online: usize,
    pub returns_to_offline: usize,
    /// First episode each app ran ONLINE (bootstrap arm), median.
    pub median_first_online_episode: Option<f64>,
    pub models_published: u64,
    pub max_trained_steps: u64,
    /// Mean per-step reward by episode index (mean over apps): the learning curve.
    pub curve: Vec<f64>,
    /// SLO violations per episode by episode index (mean over apps).
    pub slo_curve: Vec<f64>,
    /// Mean CPU / memory utilization by episode index (mean over apps).
    pub cpu_curve: Vec<f64>,
    pub memory_curve: Vec<f64>,
    pub wall_seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BootstrapReport {
    pub apps: usize,
    pub seed: u64,
    pub episodes: u32,
    pub steps_per_episode: u32,
    pub offline_episodes: u32,
    pub pace_ms: u64,
    pub train_every_transitions: u64,
    pub exploration_sigma: f32,
    pub bc_alpha: f32,
    pub probation_margin: f64,
    pub behaviour_margin: f64,
    /// The bootstrap arm's `trainer.meta_dir`, if any.
    pub meta: Option<String>,
    /// The RL arms' retraining settings (see [`BootstrapBenchOptions`]).
    pub recent_fraction: f32,
    pub rebaseline_after: usize,
    pub eval_every: u32,
    /// `--set` (every arm) and `--set-arm` (`arm:key=value`) settings, as given.
    pub settings: Vec<String>,
    pub arm_settings: Vec<String>,
    pub oracle_total_reward: f64,
    /// The oracle's SLO violations and mean utilization over the same apps and steps
    /// ([`OracleFigures`]).
    pub oracle_slo_violations: u64,
    pub oracle_cpu_util_mean: f64,
    pub oracle_memory_util_mean: f64,
    pub arms: Vec<ArmReport>,
    /// no_bootstrap SLO violations / bootstrap SLO violations.
    pub slo_violation_ratio_no_bootstrap_vs_bootstrap: f64,
    /// no_bootstrap SLO violations / the oracle's: the ratio a bootstrapped agent reaches by
    /// violating as often as the reward-maximizing policy.
    pub slo_violation_ratio_no_bootstrap_vs_oracle: f64,
    /// bootstrap utilization / no_bootstrap utilization − 1, in %.
    pub cpu_util_gain_pct: f64,
    pub memory_util_gain_pct: f64,
    /// bootstrap SLO violations / fallback SLO violations − 1, in %.
    pub slo_violations_vs_fallback_pct: f64,
}

impl BootstrapReport {
    /// Steps of the window over all apps (episodes × steps per episode × apps).
    pub fn window_steps(&self) -> f64 {
        f64::from(self.episodes) * f64::from(self.steps_per_episode) * self.apps as f64
    }

    /// The oracle's share of the window's steps that violate the SLO.
    pub fn oracle_slo_violation_rate(&self) -> f64 {
        self.oracle_slo_violations as f64 / self.window_steps().max(1.0)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Arm {
    Fallback,
    Bootstrap,
    NoBootstrap,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Fallback => "fallback",
            Arm::Bootstrap => "bootstrap",
            Arm::NoBootstrap => "no_bootstrap",
        }
    }
}

fn arm_config(
    opts: &BootstrapBenchOptions,
    arm: Arm,
    dir: &std::path::Path,
) -> Result<AppConfig, BenchError> {
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
    // One warm-up margin: the window is read from the episodes, the run stops after it.
    collector.simulator.max_steps =
        u64::from(opts.episodes + 1) * u64::from(opts.steps_per_episode) + 1;
    collector.simulator.step_timeout_ms = 60_000;
    if let Ok(apps) = aware_metrics_collector::simulator::build_apps(&collector.simulator) {
        cfg.targets = aware_metrics_collector::simulator::target_specs(&apps);
    }
    cfg.set_section("collector", &collector)?;
    // The early window: nobody reaches SERVING (it would freeze exploration by timing).
    cfg.lifecycle.t_serving = 1e9;
    match arm {
        Arm::Fallback => cfg.lifecycle.t_online = 1e9,
        Arm::Bootstrap => {}
        Arm::NoBootstrap => cfg.lifecycle.bootstrap = false,
    }
    cfg.sections.insert(
        "trajectory_store".into(),
        serde_json::json!({ "sqlite_path": dir.join("t.db").display().to_string() }),
    );
    cfg.sections
        .insert("recorder".into(), serde_json::json!({ "batch": 64 }));
    // The retraining settings are the agent's, so both RL arms get them; the fallback arm never
    // leaves OFFLINE, where none of them acts.
    let rl = arm != Arm::Fallback;
    let rebaseline = if rl { opts.rebaseline_after } else { 0 };
    let eval_every = if rl { opts.eval_every } else { 0 };
    cfg.sections.insert(
        "lifecycle_monitor".into(),
        serde_json::json!({
            "probation_margin": opts.probation_margin,
            "behaviour_margin": opts.behaviour_margin,
            "rebaseline_after_episodes": rebaseline,
            "online_noise_free_only": eval_every > 0,
        }),
    );
    // The paper's agent, without the capacity shield (ADR 0029).
    cfg.sections.insert(
        "recommender".into(),
        serde_json::json!({ "eval_every_episodes": eval_every, "capacity_shield_steps": 0 }),
    );
    cfg.sections.insert(
        "model_store".into(),
        serde_json::json!({ "dir": dir.join("models").display().to_string() }),
    );
    let mut trainer = serde_json::json!({
        "poll_ms": 50,
        "train_every_transitions": opts.train_every_transitions,
        "exploration_sigma": opts.exploration_sigma,
        "bc_alpha": opts.bc_alpha,
        "offline_min_transitions": u64::from(opts.offline_episodes) * u64::from(opts.steps_per_episode),
        "eval_episodes": opts.offline_episodes.max(1),
        "recent_fraction": if rl { opts.recent_fraction } else { 0.0 },
    });
    if let (Arm::Bootstrap, Some(meta), Some(t)) = (arm, &opts.meta, trainer.as_object_mut()) {
        t.insert("meta_dir".into(), meta.display().to_string().into());
    }
    cfg.sections.insert("trainer".into(), trainer);
    for (path, value) in &opts.settings {
        aware_harness::set_path(&mut cfg.sections, path, value.clone())?;
    }
    for (_, path, value) in opts.arm_settings.iter().filter(|s| s.0 == arm.name()) {
        aware_harness::set_path(&mut cfg.sections, path, value.clone())?;
    }
    Ok(cfg)
}

/// Refuses settings a service would refuse at start, before the (slow) oracle runs.
fn validate_arms(opts: &BootstrapBenchOptions) -> Result<(), BenchError> {
    let dir = opts.work.as_path();
    for arm in [Arm::Fallback, Arm::Bootstrap, Arm::NoBootstrap] {
        let cfg = arm_config(opts, arm, dir)?;
        cfg.section::<aware_recommender::RecommenderConfig>("recommender")
            .map_err(super::fail)?
            .validate()?;
        cfg.section::<aware_lifecycle_monitor::MonitorConfig>("lifecycle_monitor")
            .map_err(super::fail)?
            .validate()
            .map_err(super::fail)?;
        cfg.section::<aware_meta_learner_trainer::learner::TrainerConfig>("trainer")
            .map_err(super::fail)?
            .validate()
            .map_err(super::fail)?;
    }
    Ok(())
}

#[derive(Default)]
struct EpisodeRow {
    steps: u64,
    total_reward: f64,
    slo_violations: u64,
    cpu: f64,
    mem: f64,
    rl_steps: u64,
    fallback_steps: u64,
    stage: Option<Stage>,
}

async fn run_arm(
    opts: &BootstrapBenchOptions,
    arm: Arm,
    oracle_total: f64,
) -> Result<ArmReport, BenchError> {
    let dir = opts.work.join(arm.name());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let cfg = arm_config(opts, arm, &dir)?;
    // Small buffers: the pacer's back-pressure reaches the collector within a few steps.
    let bus = Bus::in_process((4 * opts.apps).max(64));
    let started = Instant::now();
    let mut services = aware_harness::PacedServices::start(
        bus,
        cfg,
        opts.apps,
        Duration::from_millis(opts.pace_ms),
        opts.timeout,
    )
    .await?;
    let want = opts.episodes as usize;
    let mut eps: BTreeMap<Target, BTreeMap<u64, EpisodeRow>> = BTreeMap::new();
    let mut online: BTreeSet<Target> = BTreeSet::new();
    let mut first_online: BTreeMap<Target, u64> = BTreeMap::new();
    let mut returns = 0usize;
    let mut models = 0u64;
    let mut max_trained = 0u64;
    let done = |eps: &BTreeMap<Target, BTreeMap<u64, EpisodeRow>>| {
        eps.len() >= opts.apps && eps.values().all(|e| e.len() >= want)
    };
    while !done(&eps) {
        let Some(ev) = services.next_event().await else {
            break;
        };
        match ev {
            Event::Episode(e) => {
                let row = EpisodeRow {
                    steps: u64::from(e.steps),
                    total_reward: e.total_reward,
                    slo_violations: u64::from(e.slo_violations),
                    cpu: e.cpu_util_mean,
                    mem: e.memory_util_mean,
                    rl_steps: u64::from(e.rl_steps),
                    fallback_steps: u64::from(e.fallback_steps),
                    stage: Some(e.stage),
                };
                if e.stage == Stage::Online {
                    first_online.entry(e.target.clone()).or_insert(e.episode);
                }
                let m = eps.entry(e.target).or_default();
                if m.len() < want {
                    m.insert(e.episode, row);
                }
            }
            Event::Lifecycle(l) => {
                if l.stage == Stage::Online {
                    online.insert(l.target.clone());
                }
                if l.stage == Stage::Offline && l.previous == Some(Stage::Online) {
                    returns += 1;
                    tracing::info!(arm = arm.name(), target = %l.target, reason = %l.reason, "returned to OFFLINE");
                }
            }
            Event::Model(md) => {
                models += 1;
                max_trained = max_trained.max(md.trained_steps);
            }
            _ => {}
        }
    }
    let wall = started.elapsed().as_secs_f64();
    services.stop().await?;
    if !done(&eps) {
        return Err(BenchError::Failed(format!(
            "arm {}: only {} apps / {:?} episodes within {:?}",
            arm.name(),
            eps.len(),
            eps.values().map(|e| e.len()).min(),
            opts.timeout
        )));
    }
    let rows: Vec<&EpisodeRow> = eps.values().flat_map(|e| e.values()).collect();
    let steps: u64 = rows.iter().map(|r| r.steps).sum();
    let w = |f: fn(&EpisodeRow) -> f64| {
        rows.iter().map(|r| f(r) * r.steps as f64).sum::<f64>() / steps.max(1) as f64
    };
    let total_reward: f64 = rows.iter().map(|r| r.total_reward).sum();
    let slo: u64 = rows.iter().map(|r| r.slo_violations).sum();
    let by_episode = |f: fn(&EpisodeRow) -> f64| {
        let mut c = vec![0.0; want];
        for e in eps.values() {
            for (i, r) in e.values().enumerate().take(want) {
                c[i] += f(r) / eps.len() as f64;
            }
        }
        c
    };
    let curve = by_episode(|r| r.total_reward / r.steps.max(1) as f64);
    let slo_curve = by_episode(|r| r.slo_violations as f64);
    let cpu_curve = by_episode(|r| r.cpu);
    let memory_curve = by_episode(|r| r.mem);
    let mut firsts: Vec<f64> = eps
        .iter()
        .filter_map(|(t, e)| {
            let first = *first_online.get(t)?;
            let base = *e.keys().next()?;
            Some(first.saturating_sub(base) as f64)
        })
        .collect();
    firsts.sort_by(f64::total_cmp);
    Ok(ArmReport {
        arm: arm.name().into(),
        episodes: rows.len(),
        steps,
        slo_violations: slo,
        slo_violation_rate: slo as f64 / steps.max(1) as f64,
        cpu_util_mean: w(|r| r.cpu),
        memory_util_mean: w(|r| r.mem),
        mean_reward: total_reward / steps.max(1) as f64,
        total_reward,
        oracle_pct: 100.0 * total_reward / oracle_total,
        rl_steps: rows.iter().map(|r| r.rl_steps).sum(),
        fallback_steps: rows.iter().map(|r| r.fallback_steps).sum(),
        online_episodes: rows
            .iter()
            .filter(|r| r.stage == Some(Stage::Online))
            .count(),
        apps_online: online.len(),
        returns_to_offline: returns,
        median_first_online_episode: (!firsts.is_empty()).then(|| super::median(&firsts)),
        models_published: models,
        max_trained_steps: max_trained,
        curve,
        slo_curve,
        cpu_curve,
        memory_curve,
        wall_seconds: wall,
    })
}

/// The learning-curve plots of a report (paper Fig. 10): file name and SVG for the reward per
/// step, SLO violations per episode, CPU and memory utilization, each by episode of the window,
/// one line per arm (mean over apps), and the oracle's mean over the window as a level line.
pub fn plots(r: &BootstrapReport) -> Vec<(&'static str, String)> {
    use aware_harness::chart::{line_chart, Chart, Series};
    let oracle = r.oracle_total_reward / r.window_steps().max(1.0);
    let app_episodes = f64::from(r.episodes) * r.apps as f64;
    let oracle_slo = r.oracle_slo_violations as f64 / app_episodes.max(1.0);
    let level = |v: f64| vec![(v, "oracle (mean)".to_string())];
    let chart = |f: fn(&ArmReport) -> &Vec<f64>, y: &'static str, hlines: Vec<(f64, String)>| {
        line_chart(&Chart {
            series: r
                .arms
                .iter()
                .map(|a| Series {
                    name: a.arm.as_str(),
                    offset: 0,
                    values: f(a),
                })
                .collect(),
            vlines: vec![r.offline_episodes as usize],
            vline_dash: "2,3",
            hlines,
            x_label: "episode of the early window (dotted: offline episodes end)",
            y_label: y,
        })
    };
    vec![
        (
            "bootstrap-reward.svg",
            chart(
                |a| &a.curve,
                "reward per step (mean over apps)",
                level(oracle),
            ),
        ),
        (
            "bootstrap-slo.svg",
            chart(
                |a| &a.slo_curve,
                "SLO violations per episode (mean over apps)",
                level(oracle_slo),
            ),
        ),
        (
            "bootstrap-cpu.svg",
            chart(
                |a| &a.cpu_curve,
                "CPU utilization (mean over apps)",
                level(r.oracle_cpu_util_mean),
            ),
        ),
        (
            "bootstrap-memory.svg",
            chart(
                |a| &a.memory_curve,
                "memory utilization (mean over apps)",
                level(r.oracle_memory_util_mean),
            ),
        ),
    ]
}

/// The oracle's figures on the same apps over the window's steps: what the reward-maximizing
/// policy (`loadgen`'s per-step oracle) earns, and the SLO violations and utilization it accepts
/// for it. The reward the RL arms maximize accepts frequent small violations, so the oracle's
/// violations are the level a converged agent tends to, not zero.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct OracleFigures {
    pub total_reward: f64,
    pub slo_violations: u64,
    pub cpu_util_mean: f64,
    pub memory_util_mean: f64,
}

impl OracleFigures {
    /// Totals, and means over the apps (each ran the same steps), of a simulator run.
    pub fn of(r: &aware_loadgen::run::RunSimReport) -> OracleFigures {
        let n = r.apps.len().max(1) as f64;
        OracleFigures {
            total_reward: r.apps.iter().map(|a| a.total_reward).sum(),
            slo_violations: r.apps.iter().map(|a| a.slo_violations).sum(),
            cpu_util_mean: r.apps.iter().map(|a| a.mean_cpu_util).sum::<f64>() / n,
            memory_util_mean: r.apps.iter().map(|a| a.mean_memory_util).sum::<f64>() / n,
        }
    }
}

/// Runs the oracle on the same apps over the window's steps.
fn oracle_figures(opts: &BootstrapBenchOptions) -> Result<OracleFigures, BenchError> {
    let ro = RunSimOptions {
        apps: AppSource::Generate {
            count: opts.apps,
            seed: opts.seed,
        },
        steps: u64::from(opts.episodes) * u64::from(opts.steps_per_episode),
        policy: PolicySpec::Oracle,
        config: SimConfig {
            seed: opts.seed,
            ..SimConfig::default()
        },
        ..RunSimOptions::default()
    };
    let r = run_sim(&ro, &mut std::io::sink()).map_err(|e| BenchError::Failed(e.to_string()))?;
    Ok(OracleFigures::of(&r))
}

/// The oracle's figures, computed once per (apps, seed, steps) and cached in the work
/// directory (the oracle is deterministic and slow). A cache that does not parse is recomputed.
fn cached_oracle(opts: &BootstrapBenchOptions) -> Result<OracleFigures, BenchError> {
    let cache = opts.work.join(format!(
        "oracle-figures-{}-{}-{}.json",
        opts.apps,
        opts.seed,
        u64::from(opts.episodes) * u64::from(opts.steps_per_episode)
    ));
    if let Some(v) = std::fs::read_to_string(&cache)
        .ok()
        .and_then(|t| serde_json::from_str::<OracleFigures>(&t).ok())
    {
        return Ok(v);
    }
    let v = oracle_figures(opts)?;
    let _ = std::fs::create_dir_all(&opts.work);
    if let Ok(text) = serde_json::to_string(&v) {
        let _ = std::fs::write(&cache, text);
    }
    Ok(v)
}

/// Runs the three arms one after the other.
pub async fn run(opts: &BootstrapBenchOptions) -> Result<BootstrapReport, BenchError> {
    validate_arms(opts)?;
    let oracle = cached_oracle(opts)?;
    tracing::info!(
        oracle_total = oracle.total_reward,
        oracle_slo_violations = oracle.slo_violations,
        "oracle computed"
    );
    let mut arms = Vec::new();
    for arm in [Arm::Fallback, Arm::Bootstrap, Arm::NoBootstrap] {
        let r = run_arm(opts, arm, oracle.total_reward).await?;
        tracing::info!(
            arm = arm.name(),
            slo_violations = r.slo_violations,
            mean_reward = r.mean_reward,
            oracle_pct = r.oracle_pct,
            cpu = r.cpu_util_mean,
            mem = r.memory_util_mean,
            wall_s = r.wall_seconds,
            "arm done"
        );
        arms.push(r);
    }
    let (fb, bs, nb) = (&arms[0], &arms[1], &arms[2]);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    Ok(BootstrapReport {
        apps: opts.apps,
        seed: opts.seed,
        episodes: opts.episodes,
        steps_per_episode: opts.steps_per_episode,
        offline_episodes: opts.offline_episodes,
        pace_ms: opts.pace_ms,
        train_every_transitions: opts.train_every_transitions,
        exploration_sigma: opts.exploration_sigma,
        bc_alpha: opts.bc_alpha,
        probation_margin: opts.probation_margin,
        behaviour_margin: opts.behaviour_margin,
        meta: opts.meta.as_ref().map(|m| m.display().to_string()),
        recent_fraction: opts.recent_fraction,
        rebaseline_after: opts.rebaseline_after,
        eval_every: opts.eval_every,
        settings: opts
            .settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
        arm_settings: opts
            .arm_settings
            .iter()
            .map(|(a, k, v)| format!("{a}:{k}={v}"))
            .collect(),
        oracle_total_reward: oracle.total_reward,
        oracle_slo_violations: oracle.slo_violations,
        oracle_cpu_util_mean: oracle.cpu_util_mean,
        oracle_memory_util_mean: oracle.memory_util_mean,
        slo_violation_ratio_no_bootstrap_vs_oracle: ratio(
            nb.slo_violations as f64,
            oracle.slo_violations as f64,
        ),
        slo_violation_ratio_no_bootstrap_vs_bootstrap: ratio(
            nb.slo_violations as f64,
            bs.slo_violations as f64,
        ),
        cpu_util_gain_pct: 100.0 * (ratio(bs.cpu_util_mean, nb.cpu_util_mean) - 1.0),
        memory_util_gain_pct: 100.0 * (ratio(bs.memory_util_mean, nb.memory_util_mean) - 1.0),
        slo_violations_vs_fallback_pct: 100.0
            * (ratio(bs.slo_violations as f64, fb.slo_violations as f64) - 1.0),
        arms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arm(name: &str, level: f64) -> ArmReport {
        ArmReport {
            arm: name.into(),
            episodes: 6,
            steps: 300,
            slo_violations: 10,
            slo_violation_rate: 10.0 / 300.0,
            cpu_util_mean: level,
            memory_util_mean: level,
            mean_reward: level,
            total_reward: level * 300.0,
            oracle_pct: 50.0,
            rl_steps: 0,
            fallback_steps: 300,
            online_episodes: 0,
            apps_online: 0,
            returns_to_offline: 0,
            median_first_online_episode: None,
            models_published: 0,
            max_trained_steps: 0,
            curve: vec![level, level + 0.1, level + 0.2],
            slo_curve: vec![5.0, 3.0, 2.0],
            cpu_curve: vec![level; 3],
            memory_curve: vec![level; 3],
            wall_seconds: 1.0,
        }
    }

    #[test]
    fn arm_settings_reach_their_arm_only_and_after_the_common_ones() {
        let opts = BootstrapBenchOptions {
            apps: 2,
            bc_alpha: 100.0,
            settings: vec![("trainer.batch_size".into(), serde_json::json!(32))],
            arm_settings: vec![
                (
                    "no_bootstrap".into(),
                    "trainer.bc_alpha".into(),
                    serde_json::json!(25.0),
                ),
                (
                    "no_bootstrap".into(),
                    "trainer.batch_size".into(),
                    serde_json::json!(48),
                ),
            ],
            ..BootstrapBenchOptions::default()
        };
        let dir = std::path::Path::new("/tmp/x");
        let trainer = |arm, key: &str| {
            arm_config(&opts, arm, dir)
                .unwrap()
                .sections
                .get("trainer")
                .and_then(|t| t.get(key))
                .cloned()
        };
        assert_eq!(
            trainer(Arm::Bootstrap, "bc_alpha"),
            Some(serde_json::json!(100.0))
        );
        assert_eq!(
            trainer(Arm::Fallback, "bc_alpha"),
            Some(serde_json::json!(100.0))
        );
        assert_eq!(
            trainer(Arm::NoBootstrap, "bc_alpha"),
            Some(serde_json::json!(25.0))
        );
        assert_eq!(
            trainer(Arm::Bootstrap, "batch_size"),
            Some(serde_json::json!(32))
        );
        assert_eq!(
            trainer(Arm::NoBootstrap, "batch_size"),
            Some(serde_json::json!(48))
        );
        assert_eq!(
            ARM_NAMES,
            [Arm::Fallback, Arm::Bootstrap, Arm::NoBootstrap].map(Arm::name)
        );
        validate_arms(&opts).unwrap();
    }

    #[test]
    fn only_the_bootstrap_arm_gets_the_meta_dir() {
        let opts = BootstrapBenchOptions {
            apps: 2,
            meta: Some(PathBuf::from("/m/meta-out")),
            ..BootstrapBenchOptions::default()
        };
        let dir = std::path::Path::new("/tmp/x");
        let meta = |arm| {
            arm_config(&opts, arm, dir)
                .unwrap()
                .sections
                .get("trainer")
                .and_then(|t| t.get("meta_dir"))
                .cloned()
        };
        assert_eq!(meta(Arm::Bootstrap), Some("/m/meta-out".into()));
        assert_eq!(meta(Arm::NoBootstrap), None);
        assert_eq!(meta(Arm::Fallback), None);
        let plain = BootstrapBenchOptions {
            meta: None,
            ..opts.clone()
        };
        assert!(
            arm_config(&plain, Arm::Bootstrap, dir).unwrap().sections["trainer"]
                .get("meta_dir")
                .is_none()
        );
    }

    #[test]
    fn settings_reach_every_arm_after_the_benchs_own() {
        use serde_json::json;
        let dir = std::path::Path::new("/tmp/x");
        let opts = BootstrapBenchOptions {
            apps: 2,
            settings: vec![
                ("trainer.learn_action".into(), json!("applied")),
                ("trainer.train_every_transitions".into(), json!(25)),
                (
                    "actuator.guardrails.cpu_min_change_ratio".into(),
                    json!(0.1),
                ),
            ],
            ..BootstrapBenchOptions::default()
        };
        for arm in [Arm::Fallback, Arm::Bootstrap, Arm::NoBootstrap] {
            let c = arm_config(&opts, arm, dir).unwrap().sections;
            assert_eq!(c["trainer"]["learn_action"], json!("applied"));
            // the bench's own value (100) is overridden, its other keys kept
            assert_eq!(c["trainer"]["train_every_transitions"], json!(25));
            assert_eq!(c["trainer"]["poll_ms"], json!(50));
            assert_eq!(
                c["actuator"]["guardrails"]["cpu_min_change_ratio"],
                json!(0.1)
            );
        }
        // A setting a service refuses is refused before the run.
        let bad = BootstrapBenchOptions {
            settings: vec![("trainer.learn_action".into(), json!("sometimes"))],
            ..opts.clone()
        };
        assert!(validate_arms(&bad).is_err());
        let malformed = BootstrapBenchOptions {
            settings: vec![("trainer".into(), json!(1))],
            ..opts
        };
        assert!(arm_config(&malformed, Arm::Bootstrap, dir).is_err());
    }

    #[test]
    fn retraining_settings_reach_both_rl_arms_and_never_the_fallback() {
        use serde_json::json;
        let dir = std::path::Path::new("/tmp/x");
        // (trainer.recent_fraction, rebaseline_after_episodes, online_noise_free_only,
        // recommender.eval_every_episodes) as an arm's services read them
        let settings = |opts: &BootstrapBenchOptions, arm| {
            let c = arm_config(opts, arm, dir).unwrap().sections;
            let monitor = &c["lifecycle_monitor"];
            (
                c["trainer"]["recent_fraction"].clone(),
                monitor["rebaseline_after_episodes"].clone(),
                monitor["online_noise_free_only"].clone(),
                c["recommender"]["eval_every_episodes"].clone(),
            )
        };
        let on = BootstrapBenchOptions {
            apps: 2,
            recent_fraction: 0.5,
            rebaseline_after: 10,
            eval_every: 2,
            ..BootstrapBenchOptions::default()
        };
        let off = BootstrapBenchOptions {
            apps: 2,
            recent_fraction: 0.0,
            rebaseline_after: 0,
            eval_every: 0,
            ..BootstrapBenchOptions::default()
        };
        let set = (json!(0.5), json!(10), json!(true), json!(2));
        let unset = (json!(0.0), json!(0), json!(false), json!(0));
        for arm in [Arm::Bootstrap, Arm::NoBootstrap] {
            assert_eq!(settings(&on, arm), set);
            assert_eq!(settings(&off, arm), unset);
        }
        assert_eq!(settings(&on, Arm::Fallback), unset);
        // by default the bench runs the services' defaults
        let d = BootstrapBenchOptions::default();
        assert_eq!(
            (d.recent_fraction, d.rebaseline_after, d.eval_every),
            (0.5, 10, 2)
        );
        // the services accept the sections as written; what they would refuse is refused first
        validate_arms(&on).unwrap();
        validate_arms(&off).unwrap();
        for bad in [
            BootstrapBenchOptions {
                eval_every: 1,
                ..on.clone()
            },
            BootstrapBenchOptions {
                rebaseline_after: 1,
                ..on.clone()
            },
            BootstrapBenchOptions {
                recent_fraction: 1.5,
                ..on.clone()
            },
        ] {
            assert!(validate_arms(&bad).is_err());
        }
    }

    #[test]
    fn plots_have_one_curve_per_arm_and_the_oracle_line() {
        let r = BootstrapReport {
            apps: 2,
            seed: 1,
            episodes: 3,
            steps_per_episode: 50,
            offline_episodes: 1,
            pace_ms: 0,
            train_every_transitions: 100,
            exploration_sigma: 0.2,
            bc_alpha: 2.5,
            probation_margin: 0.1,
            behaviour_margin: 0.05,
            meta: None,
            recent_fraction: 0.0,
            rebaseline_after: 0,
            eval_every: 0,
            settings: Vec::new(),
            arm_settings: Vec::new(),
            oracle_total_reward: 1.5 * 300.0,
            // 10 violations per app-episode: above every arm's curve (≤ 5), so at the top;
            // CPU 0.2: below every arm's level (≥ 0.5), so at the bottom
            oracle_slo_violations: 10 * 3 * 2,
            oracle_cpu_util_mean: 0.2,
            oracle_memory_util_mean: 0.7,
            arms: vec![
                arm("fallback", 1.0),
                arm("bootstrap", 1.1),
                arm("no_bootstrap", 0.5),
            ],
            slo_violation_ratio_no_bootstrap_vs_bootstrap: 1.0,
            slo_violation_ratio_no_bootstrap_vs_oracle: 1.0 / 6.0,
            cpu_util_gain_pct: 0.0,
            memory_util_gain_pct: 0.0,
            slo_violations_vs_fallback_pct: 0.0,
        };
        // 3 episodes × 50 steps × 2 apps; 60 violations of them
        assert_eq!(r.window_steps(), 300.0);
        assert!((r.oracle_slo_violation_rate() - 0.2).abs() < 1e-12);
        let plots = plots(&r);
        let names: Vec<&str> = plots.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "bootstrap-reward.svg",
                "bootstrap-slo.svg",
                "bootstrap-cpu.svg",
                "bootstrap-memory.svg"
            ]
        );
        for (name, svg) in &plots {
            assert_eq!(svg.matches("<polyline").count(), 3, "{name}");
            for a in ["fallback", "bootstrap", "no_bootstrap"] {
                assert!(svg.contains(&format!(">{a}<")), "{name}: {a}");
            }
        }
        // the oracle's mean over the window is a level line on every plot, at its own value
        let level_y = |svg: &str| -> f64 {
            let at = svg.find("stroke-dasharray=\"4,3\"").expect("a level line");
            let line = &svg[svg[..at].rfind("<line").expect("line start")..at];
            let y1 = &line[line.find("y1=\"").expect("y1") + 4..];
            y1[..y1.find('"').expect("quote")].parse().expect("number")
        };
        for (name, svg) in &plots {
            assert!(svg.contains("oracle (mean)"), "{name}");
        }
        // chart area: top 20, bottom 420 − 40
        assert_eq!(
            level_y(&plots[1].1),
            20.0,
            "SLO: the oracle's 10 per episode on top"
        );
        assert_eq!(
            level_y(&plots[2].1),
            380.0,
            "CPU: the oracle's 0.2 at the bottom"
        );
        let memory = level_y(&plots[3].1);
        assert!(
            memory > 20.0 && memory < 380.0,
            "memory: 0.7 inside the range"
        );
    }

    #[test]
    fn the_oracles_figures_are_computed_once_and_cached() {
        let work = std::env::temp_dir().join(format!("aware-bench-oracle-{}", std::process::id()));
        let _cleanup = aware_shared::testkit::TempDirGuard(work.clone());
        let opts = BootstrapBenchOptions {
            apps: 2,
            seed: 7,
            episodes: 2,
            steps_per_episode: 5,
            work: work.clone(),
            ..BootstrapBenchOptions::default()
        };
        let first = cached_oracle(&opts).expect("oracle");
        assert!(first.total_reward.is_finite() && first.total_reward != 0.0);
        assert!(first.slo_violations <= 2 * 10);
        for u in [first.cpu_util_mean, first.memory_util_mean] {
            assert!(u > 0.0 && u <= 1.5, "utilization {u}");
        }
        // the same as the simulator's own per-app report
        let direct = oracle_figures(&opts).expect("oracle");
        assert_eq!(first, direct);
        // the cache is what a second run reads …
        let cache = work.join("oracle-figures-2-7-10.json");
        let marked = OracleFigures {
            slo_violations: 12_345,
            ..first
        };
        std::fs::write(&cache, serde_json::to_string(&marked).expect("json")).expect("write");
        assert_eq!(cached_oracle(&opts).expect("cached"), marked);
        // … a cache that does not parse (e.g. an older bench's bare number) is recomputed
        std::fs::write(&cache, "123.5").expect("write");
        assert_eq!(cached_oracle(&opts).expect("recomputed"), first);
        // … and another window is another cache
        let longer = BootstrapBenchOptions {
            episodes: 3,
            ..opts.clone()
        };
        assert_ne!(cached_oracle(&longer).expect("oracle"), first);
    }
}
