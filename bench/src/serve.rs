//! `aware bench serve` (paper §5.3, Fig. 9): a converged agent meets the instability scenarios
//! of §2.3, with and without the retraining trigger of Algorithm 1, against HPA/VPA and against
//! the converged policy on the undisturbed workload.
//!
//! Runs in this process on the simulator (not over the bus): per held-out app, one DDPG agent
//! (the trainer's 64-64 networks, Table 2 otherwise) learns online from scratch for
//! `train_episodes` episodes of `steps_per_episode` steps (one gradient step of 64 per
//! transition after the first 64). That agent, its replay buffer and the simulator at that
//! moment are cloned into every arm, so every arm continues the same traces from the same
//! state for `serve_episodes` episodes:
//! - `converged`: the frozen policy (no noise, normalizer frozen), no scenario;
//! - `without_retraining`: the frozen policy with the scenarios (lifecycle stays SERVING);
//! - `with_retraining`: the scenarios, the lifecycle monitor's own `LifecycleMachine` (Algorithm 1)
//!   fed with every episode, starting at SERVING: when it moves the target back to ONLINE the
//!   agent explores (σ `retrain_sigma`) and trains again (replay buffer kept;
//!   `retrain_gradient_steps` per transition, each minibatch drawing `retrain_recent_fraction`
//!   of its rows from the newest `retrain_recent` transitions, so the new regime's data is not
//!   drowned by the old one's) until it returns to SERVING (with `rebaseline_after` > 0 also
//!   when its rewards settle below `t_serving`: the monitor's re-baselining; a retraining that
//!   settled below what the policy earned before it restores the agent cloned at the trigger,
//!   as the services' trainer republishes the version in force then (`rebaseline_rollback`); with
//!   `retrain_shrink` < 1 every trigger first shrinks and perturbs the networks; with
//!   `retrain_eval_every` k the services' evaluation episodes: ONLINE episodes numbered k − 1
//!   modulo k act without noise and only those reach Algorithm 1 while ONLINE);
//! - `fallback` / `fallback_undisturbed`: the recommender's HPA + VPA (`Fallback`, default
//!   settings) with and without the scenarios, both taking over the allocation the agent left at
//!   the end of training;
//! - `fallback_throughout`: HPA + VPA managing the app from its first step instead of the agent
//!   (the same traces; its VPA history is its own), measured over the same serve window without
//!   scenarios — what the workload gets without AWARE, the baseline of the converged-vs-HPA/VPA
//!   comparison;
//! - `oracle` / `oracle_undisturbed`: `loadgen`'s per-step greedy oracle (true next-step load);
//! - `max_allocation`: every resource at its upper bound, with the scenarios. The simulator's
//!   p99 latency does not increase with replicas, CPU or memory (`loadgen`'s property tests), so
//!   this arm's SLO violations are the fewest any policy can have on the disturbed workload, and
//!   `without_retraining`'s violations ÷ this arm's bound the ratio any retraining scheme can show
//!   (`slo_ratio_bound`).
//!
//! Scenarios: every scenario of `loadgen::scenario` that changes something for the app, in a
//! seeded random order, one every `inject_every` episodes from serve episode 1 on (the same
//! schedule and payload seeds in every arm). With `servable_only` a scenario is scheduled only
//! when the app's bounds can serve the workload it leaves (max_allocation's SLO-violation rate
//! after it rises by at most `servable_tolerance`); the others are skipped and counted, so the
//! ratio targets are measured where a policy can make a difference. SERVING thresholds per app: `t_serving` = the
//! converged arm's mean episode reward − `serving_margin` (relative), `t_var` = twice its episode
//! std + 0.02, window `window` episodes (Algorithm 1's thresholds set to what the converged policy
//! achieves on the app, as an operator would).
//!
//! Differences from the services' loop, stated: no actuator guardrails (the action map's
//! per-step limits apply to RL actions, the fallback's desired allocation is applied as is) and
//! no bus; the SLO violation count is the simulator's per-step `slo_violation`.

use std::path::PathBuf;

use aware_bus_schemas::{Episode, Model, ModelKind, Schema, Stage, Target};
use aware_lifecycle_monitor::LifecycleMachine;
use aware_loadgen::app::{generate_apps, Allocation, AppSpec, GeneratorOptions};
use aware_loadgen::env::{Observation, SimConfig, SimEnv, TargetAction};
use aware_loadgen::oracle::{oracle_step, OracleGrid};
use aware_loadgen::Scenario;
use aware_recommender::fallback::{Fallback, FallbackConfig};
use aware_recommender::is_eval_episode;
use aware_shared::config::LifecycleProfile;
use aware_shared_model::{Ddpg, DdpgConfig, ReplayBuffer, Transition, ACTION_DIM};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{fail, first, BenchError};

#[derive(Debug, Clone, clap::Args)]
pub struct ServeBenchOptions {
    #[arg(long, default_value_t = ServeBenchOptions::default().apps)]
    pub apps: usize,
    /// Generator and noise seed (held out: ≥ 1000).
    #[arg(long, default_value_t = ServeBenchOptions::default().seed)]
    pub seed: u64,
    #[arg(long, default_value_t = ServeBenchOptions::default().train_episodes, help = "Online-RL episodes per app before serving")]
    pub train_episodes: u32,
    #[arg(long, default_value_t = ServeBenchOptions::default().serve_episodes)]
    pub serve_episodes: u32,
    #[arg(long, default_value_t = ServeBenchOptions::default().steps_per_episode)]
    pub steps_per_episode: u32,
    /// Episodes between two scenario injections.
    #[arg(long, default_value_t = ServeBenchOptions::default().inject_every, help = "Episodes between scenario injections")]
    pub inject_every: u32,
    /// Algorithm 1's decision window (episodes).
    #[arg(long, default_value_t = ServeBenchOptions::default().window, hide = true, help = "Algorithm 1's decision window, episodes")]
    pub window: usize,
    /// `t_serving` = converged mean × (1 − margin).
    #[arg(skip = ServeBenchOptions::default().serving_margin)]
    pub serving_margin: f64,
    #[arg(skip = ServeBenchOptions::default().hidden)]
    pub hidden: usize,
    #[arg(skip = ServeBenchOptions::default().exploration_sigma)]
    pub exploration_sigma: f32,
    /// Gradient steps (minibatch 64) per transition while learning (training and ONLINE).
    #[arg(long, default_value_t = ServeBenchOptions::default().gradient_steps, hide = true, help = "Gradient steps per transition while learning")]
    pub gradient_steps: u32,
    /// Retraining (`with_retraining` while ONLINE): gradient steps per transition.
    #[arg(long, default_value_t = ServeBenchOptions::default().retrain_gradient_steps, hide = true, help = "Gradient steps per transition while retraining (with_retraining, ONLINE; default: the services' trainer.retrain_gradient_steps ÷ trainer.train_every_transitions, 4)")]
    pub retrain_gradient_steps: u32,
    /// Retraining: share of each minibatch drawn from the newest `retrain_recent` transitions
    /// (recency-mixed replay; 0: uniform over the whole buffer, as in training). Default: the
    /// services' `trainer.recent_fraction` 0.5 of 20 episodes (1,000 transitions).
    #[arg(long, default_value_t = ServeBenchOptions::default().retrain_recent_fraction, hide = true, help = "Share of each retraining minibatch drawn from the newest --retrain-recent transitions (default: the services' trainer.recent_fraction; 0: uniform, the paper's replay)")]
    pub retrain_recent_fraction: f32,
    #[arg(long, default_value_t = ServeBenchOptions::default().retrain_recent, hide = true, help = "Newest transitions that share is drawn from (0: uniform over the whole buffer; default: the services' 20 episodes of 50 steps)")]
    pub retrain_recent: usize,
    /// Retraining: exploration σ while ONLINE.
    #[arg(long, default_value_t = ServeBenchOptions::default().retrain_sigma, hide = true, help = "Exploration σ while retraining (default: the services' trainer.exploration_sigma × recommender.retrain_noise_scale, 0.1)")]
    pub retrain_sigma: f32,
    /// Retraining: transitions per training round (each round takes `retrain_gradient_steps`
    /// per transition). 1: after every transition; the services' trainer trains in rounds every
    /// `trainer.retrain_every_transitions` (50), the recommenders acting meanwhile with the
    /// weights of the last round.
    #[arg(long, default_value_t = ServeBenchOptions::default().retrain_every, hide = true, help = "Transitions per retraining round, each round taking --retrain-gradient-steps per transition (1: after every transition; the services train every trainer.retrain_every_transitions, 50)")]
    pub retrain_every: u32,
    /// `lifecycle_monitor.rebaseline_after_episodes` / `_tolerance` / `_margin` of the
    /// `with_retraining` arm's Algorithm 1 (0: off; default 10, the services').
    #[arg(long, default_value_t = ServeBenchOptions::default().rebaseline_after, hide = true, help = "Re-baselining of with_retraining's Algorithm 1 (lifecycle_monitor. rebaseline_after_episodes; 0: off): ONLINE episodes whose rewards no longer improve before it serves at the level they settled at (default: the services')")]
    pub rebaseline_after: usize,
    #[arg(long, default_value_t = ServeBenchOptions::default().rebaseline_tolerance, hide = true, help = "lifecycle_monitor.rebaseline_tolerance: relative improvement that still counts as settled")]
    pub rebaseline_tolerance: f64,
    #[arg(long, default_value_t = ServeBenchOptions::default().rebaseline_margin, hide = true, help = "lifecycle_monitor.rebaseline_margin: relative drop below the settled level that retrains")]
    pub rebaseline_margin: f64,
    /// `lifecycle_monitor.rebaseline_rollback`: a retraining that settled below what the
    /// policy earned before it restores the agent in force at the trigger.
    #[arg(long = "no-rollback", action = clap::ArgAction::SetFalse, hide = true, help = "lifecycle_monitor.rebaseline_rollback off: a retraining that settled below what the policy earned before it keeps learning instead of rolling back to the policy in force at the trigger")]
    pub rebaseline_rollback: bool,
    /// `lifecycle_monitor.reprobe_after_episodes`: a target SERVING at a re-baselined or
    /// rolled-back level retrains again after this many episodes there (0: off).
    #[arg(long, default_value_t = ServeBenchOptions::default().reprobe_after, hide = true, help = "lifecycle_monitor.reprobe_after_episodes: a target serving at a re-baselined or rolled-back level retrains again after this many episodes there (0: off)")]
    pub reprobe_after: usize,
    /// `lifecycle_monitor.serving_hysteresis`: SERVING on `t_serving` retrains below
    /// `t_serving` less this fraction.
    #[arg(long, default_value_t = ServeBenchOptions::default().serving_hysteresis, hide = true, help = "lifecycle_monitor.serving_hysteresis: a target serving on t_serving retrains below t_serving less this fraction of it")]
    pub serving_hysteresis: f64,
    /// Retraining: shrink and perturb the agent's networks by this α at every trigger (1: off;
    /// [`Ddpg::shrink_perturb`]).
    #[arg(long, default_value_t = ServeBenchOptions::default().retrain_shrink, hide = true, help = "Shrink and perturb α applied to with_retraining's networks at every trigger (θ ← α·θ + (1 − α)·fresh; 1: off)")]
    pub retrain_shrink: f32,
    /// Retraining: the services' evaluation episodes. ONLINE serve episodes whose number is
    /// k − 1 modulo k run without exploration noise (still training:
    /// `recommender.eval_every_episodes`), and while ONLINE only those reach Algorithm 1
    /// (`lifecycle_monitor.online_noise_free_only`), so its return to SERVING judges the policy
    /// rather than the policy plus noise (0: off, every ONLINE episode explores and is fed;
    /// default 2, the services').
    #[arg(long, default_value_t = ServeBenchOptions::default().retrain_eval_every, hide = true, help = "The services' evaluation episodes in with_retraining (recommender.eval_every_episodes with lifecycle_monitor.online_noise_free_only): ONLINE episodes numbered k − 1 modulo k run without exploration noise and only those reach its Algorithm 1 (0: off; default: the services')")]
    pub retrain_eval_every: u32,
    /// Run the oracle arms (≈ 4,000 simulated candidates per step).
    #[arg(long = "no-oracle", action = clap::ArgAction::SetFalse, help = "Skip the oracle arms (slow: thousands of candidates per step)")]
    pub oracle: bool,
    /// Also train a reference agent on the fully disturbed app (`converged_disturbed`).
    #[arg(
        long,
        hide = true,
        help = "Also train a reference agent on the fully disturbed app (converged_disturbed)"
    )]
    pub disturbed_reference: bool,
    /// Schedule only scenarios whose changed workload the app's bounds can serve
    /// ([`servable`] within `servable_tolerance`).
    #[arg(
        long,
        hide = true,
        help = "Schedule only scenarios whose changed workload the app's bounds can serve: with every resource at its maximum, the share of steps violating the SLO after the injection rises by at most --servable-tolerance; the others are skipped"
    )]
    pub servable_only: bool,
    #[arg(long, default_value_t = ServeBenchOptions::default().servable_tolerance, hide = true, help = "The rise in max_allocation's SLO-violation rate a servable scenario may cause")]
    pub servable_tolerance: f64,
    /// After the in-process arms, run the protocol on the six services over the embedded bus
    /// with the same agents ([`super::serve_bus`]).
    #[arg(
        long,
        help = "Then run the protocol on the six services over the embedded bus, starting from the same converged agents (bus_with_retraining, bus_without_retraining)"
    )]
    pub bus: bool,
    /// `bus`: the pacer's sleep per round of observations.
    #[arg(long, default_value_t = ServeBenchOptions::default().bus_pace_ms, hide = true, help = "--bus: the pacer's sleep after every round of the apps' observations, ms")]
    pub bus_pace_ms: u64,
    /// `bus`: settings other than the services' defaults ([`super::serve_bus::BusOptions::settings`]).
    #[arg(long = "bus-set", value_name = "KEY=VALUE", value_parser = aware_harness::parse_setting, help = "--bus: a setting of the services other than its default, SECTION.KEY=VALUE with a JSON value (repeatable), e.g. --bus-set trainer.train_every_transitions=50 or --bus-set actuator.guardrails.cpu_cooldown_ms=0")]
    pub bus_settings: Vec<(String, serde_json::Value)>,
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

/// The services' retraining pace and noise in this bench's terms: gradient steps per transition
/// (`trainer.retrain_gradient_steps` ÷ `trainer.retrain_every_transitions`: 200 ÷ 50 = 4) and the
/// exploration σ (`trainer.exploration_sigma` × `recommender.retrain_noise_scale`: 0.2 × 0.5).
pub fn services_retraining_pace() -> (u32, f32) {
    let t = aware_meta_learner_trainer::learner::TrainerConfig::default();
    let r = aware_recommender::RecommenderConfig::default();
    let per_transition =
        (t.retrain_gradient_steps as u64 / t.retrain_every_transitions.max(1)).max(1);
    (
        u32::try_from(per_transition).unwrap_or(u32::MAX),
        t.exploration_sigma * r.retrain_noise_scale,
    )
}

impl Default for ServeBenchOptions {
    fn default() -> Self {
        let (retrain_gradient_steps, retrain_sigma) = services_retraining_pace();
        ServeBenchOptions {
            apps: 20,
            seed: 1001,
            train_episodes: 40,
            serve_episodes: 24,
            steps_per_episode: 50,
            inject_every: 3,
            window: 3,
            serving_margin: 0.05,
            hidden: 64,
            exploration_sigma: 0.2,
            gradient_steps: 1,
            // the services' defaults: trainer.retrain_gradient_steps and
            // recommender.retrain_noise_scale (4 steps per transition, σ 0.1),
            // trainer.recent_fraction 0.5 of the last 20 episodes (of 50 steps),
            // lifecycle_monitor.rebaseline_after_episodes 10, recommender.eval_every_episodes 2
            // with lifecycle_monitor.online_noise_free_only
            retrain_gradient_steps,
            retrain_recent_fraction: 0.5,
            retrain_recent: 1000,
            retrain_sigma,
            retrain_every: 1,
            rebaseline_after: 10,
            rebaseline_tolerance: 0.02,
            rebaseline_margin: 0.05,
            rebaseline_rollback: true,
            reprobe_after: aware_lifecycle_monitor::MonitorConfig::default().reprobe_after_episodes,
            serving_hysteresis: aware_lifecycle_monitor::MonitorConfig::default()
                .serving_hysteresis,
            retrain_shrink: 1.0,
            retrain_eval_every: 2,
            oracle: true,
            disturbed_reference: false,
            servable_only: false,
            servable_tolerance: 0.02,
            bus: false,
            bus_pace_ms: 40,
            bus_settings: Vec::new(),
            out: PathBuf::from("bench-out"),
        }
    }
}

/// The arms, in report order.
pub const ARMS: [&str; 10] = [
    "converged",
    "with_retraining",
    "without_retraining",
    "fallback",
    "oracle",
    "fallback_undisturbed",
    "fallback_throughout",
    "oracle_undisturbed",
    "max_allocation",
    "converged_disturbed",
];

/// One arm on one app: per-episode totals.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ArmRun {
    pub episode_rewards: Vec<f64>,
    pub episode_slo_violations: Vec<u64>,
    pub steps: u64,
    /// Episodes that ran ONLINE (retraining), `with_retraining` only.
    pub online_episodes: u32,
    pub retrain_triggers: u32,
    /// ONLINE → SERVING at a re-baselined level, `with_retraining` only.
    pub rebaselines: u32,
    /// ONLINE → SERVING rolled back to the policy in force at the trigger.
    pub rollbacks: u32,
    /// Of the retrain triggers, re-probes (`reprobe_after`).
    pub reprobes: u32,
    /// ONLINE episodes run without exploration noise (`retrain_eval_every`).
    pub eval_episodes: u32,
    /// Gradient steps taken while ONLINE (retraining), `with_retraining` only.
    pub gradient_steps: u64,
}

impl ArmRun {
    fn total_reward(&self) -> f64 {
        self.episode_rewards.iter().sum()
    }
    fn slo(&self) -> u64 {
        self.episode_slo_violations.iter().sum()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ArmReport {
    pub arm: String,
    pub apps: usize,
    pub steps: u64,
    pub total_reward: f64,
    pub mean_reward: f64,
    pub slo_violations: u64,
    pub slo_violation_rate: f64,
    /// Σ reward / Σ reward of `converged` (undisturbed), in %.
    pub pct_of_converged: f64,
    /// Σ reward / Σ reward of the oracle on the same workload (disturbed or not), in %.
    pub pct_of_oracle: Option<f64>,
    pub online_episodes: u32,
    pub retrain_triggers: u32,
    pub rebaselines: u32,
    pub rollbacks: u32,
    pub reprobes: u32,
    pub eval_episodes: u32,
    /// Gradient steps taken while retraining (`with_retraining`; the services' bus arm reports
    /// its trainer's `trained_steps` instead).
    pub gradient_steps: u64,
    /// Mean per-step reward by serve episode (mean over apps).
    pub curve: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConvergedVsFallback {
    /// Undisturbed workload, % of the oracle's reward.
    pub converged_pct_of_oracle: Option<f64>,
    /// HPA/VPA that managed the app from the first step (`fallback_throughout`): what the
    /// workload gets without AWARE.
    pub fallback_pct_of_oracle: Option<f64>,
    /// converged − fallback, percentage points of oracle (target ≥ 10).
    pub gap_pp: Option<f64>,
    pub converged_slo_violations: u64,
    pub fallback_slo_violations: u64,
    /// HPA/VPA taking over the allocation the agent left (`fallback_undisturbed`), for reference.
    pub fallback_from_agent_state_pct_of_oracle: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ServeReport {
    pub apps: usize,
    pub seed: u64,
    pub train_episodes: u32,
    pub serve_episodes: u32,
    pub steps_per_episode: u32,
    pub inject_every: u32,
    pub window: usize,
    pub serving_margin: f64,
    pub hidden: usize,
    pub exploration_sigma: f32,
    pub gradient_steps: u32,
    pub retrain_gradient_steps: u32,
    pub retrain_recent_fraction: f32,
    pub retrain_recent: usize,
    pub retrain_sigma: f32,
    pub retrain_every: u32,
    pub rebaseline_after: usize,
    pub rebaseline_tolerance: f64,
    pub rebaseline_margin: f64,
    pub rebaseline_rollback: bool,
    pub reprobe_after: usize,
    pub serving_hysteresis: f64,
    pub retrain_shrink: f32,
    pub retrain_eval_every: u32,
    pub scenarios_injected: usize,
    pub servable_only: bool,
    pub servable_tolerance: f64,
    /// Scenarios left out because the app's bounds cannot serve them (`servable_only`).
    pub scenarios_skipped: usize,
    /// Mean per-step reward by training episode (mean over apps; with exploration noise).
    pub train_curve: Vec<f64>,
    pub arms: Vec<ArmReport>,
    /// with_retraining reward / converged reward − 1, % (target: within −3.6%).
    pub with_retraining_vs_converged_pct: f64,
    /// without_retraining SLO violations / with_retraining SLO violations (target ≥ 3).
    pub slo_ratio_without_vs_with: f64,
    /// without_retraining SLO violations / max_allocation SLO violations: the largest
    /// `slo_ratio_without_vs_with` any policy can reach on these scenarios.
    pub slo_ratio_bound: f64,
    /// with_retraining's and converged's rewards each as % of the oracle on its own workload
    /// (disturbed, undisturbed): (with % / converged %) − 1, in %. The policy's degradation with
    /// the workload's own loss (what the oracle loses to the scenarios) taken out; for reference
    /// next to `with_retraining_vs_converged_pct`.
    pub with_retraining_vs_converged_oracle_relative_pct: Option<f64>,
    pub converged_vs_fallback: ConvergedVsFallback,
    /// With `disturbed_reference`: the final regime against RL converged on it.
    pub final_regime: Option<FinalRegime>,
    /// With `bus`: the services' arms on the embedded bus.
    pub bus: Option<super::serve_bus::BusReport>,
    pub wall_seconds: f64,
}

/// Per app: the training curve and every arm's run.
#[derive(Debug, Clone, Default)]
pub struct AppResult {
    /// The app's name (its target's name on the services).
    pub app: String,
    pub train_curve: Vec<f64>,
    pub arms: Vec<(String, ArmRun)>,
    pub injected: usize,
    /// Scenarios left out by `servable_only`.
    pub skipped: usize,
    /// First serve episode with every scheduled scenario in force (the episode of the last
    /// injection; 0 without injections).
    pub final_regime_from: usize,
    /// With `bus`: what the bus arms start from.
    pub handoff: Option<super::serve_bus::Handoff>,
}

/// The serve episodes in which every app's scenarios are all in force, compared with
/// `converged_disturbed` (RL trained as long as the main agent on that final workload): what
/// retraining recovers of what RL can reach on the changed workload.
#[derive(Debug, Clone, Serialize)]
pub struct FinalRegime {
    /// Episodes counted (Σ over apps).
    pub episodes: usize,
    /// Mean per-step reward per arm over those episodes.
    pub converged_disturbed_reward: f64,
    pub with_retraining_reward: f64,
    pub without_retraining_reward: f64,
    pub converged_undisturbed_reward: f64,
    /// with_retraining / converged_disturbed − 1, % (over the same episodes).
    pub with_retraining_vs_reference_pct: f64,
    pub without_retraining_vs_reference_pct: f64,
    /// converged_disturbed / converged (undisturbed) − 1, %: what the changed workload itself
    /// costs RL once converged on it.
    pub reference_vs_undisturbed_pct: f64,
    pub converged_disturbed_slo_violations: u64,
    pub with_retraining_slo_violations: u64,
    pub without_retraining_slo_violations: u64,
    /// The same per app, in the order the apps ran: where retraining falls short of the
    /// reference.
    pub per_app: Vec<FinalRegimeApp>,
}

/// One app's final regime (see [`FinalRegime`]): mean per-step reward and SLO violations per arm.
#[derive(Debug, Clone, Serialize)]
pub struct FinalRegimeApp {
    pub app: String,
    pub episodes: usize,
    pub converged_disturbed_reward: f64,
    pub with_retraining_reward: f64,
    pub without_retraining_reward: f64,
    /// with_retraining / converged_disturbed − 1, %.
    pub with_retraining_vs_reference_pct: f64,
    pub converged_disturbed_slo_violations: u64,
    pub with_retraining_slo_violations: u64,
    pub without_retraining_slo_violations: u64,
}

/// [`FinalRegime`] over `results` (pure); `None` without a `converged_disturbed` arm on every app.
pub fn final_regime(results: &[AppResult]) -> Option<FinalRegime> {
    let arms = [
        "converged_disturbed",
        "with_retraining",
        "without_retraining",
        "converged",
    ];
    let mut reward = [0.0f64; 4];
    let mut slo = [0u64; 4];
    let mut steps = 0u64;
    let mut episodes = 0usize;
    let mut per_app = Vec::with_capacity(results.len());
    let pct = |a: f64, b: f64| 100.0 * (a / b - 1.0);
    for r in results {
        let runs: Vec<&ArmRun> = arms
            .iter()
            .map(|n| r.arms.iter().find(|(a, _)| a == n).map(|(_, run)| run))
            .collect::<Option<_>>()?;
        let n = runs[0].episode_rewards.len();
        let spe = runs[0].steps / n.max(1) as u64;
        let from = r.final_regime_from.min(n);
        let mut app_reward = [0.0f64; 4];
        let mut app_slo = [0u64; 4];
        for (k, run) in runs.iter().enumerate() {
            app_reward[k] = run.episode_rewards.iter().skip(from).sum::<f64>();
            app_slo[k] = run.episode_slo_violations.iter().skip(from).sum::<u64>();
            reward[k] += app_reward[k];
            slo[k] += app_slo[k];
        }
        let app_steps = (n - from) as u64 * spe;
        if app_steps > 0 {
            let per = |x: f64| x / app_steps as f64;
            per_app.push(FinalRegimeApp {
                app: r.app.clone(),
                episodes: n - from,
                converged_disturbed_reward: per(app_reward[0]),
                with_retraining_reward: per(app_reward[1]),
                without_retraining_reward: per(app_reward[2]),
                with_retraining_vs_reference_pct: pct(app_reward[1], app_reward[0]),
                converged_disturbed_slo_violations: app_slo[0],
                with_retraining_slo_violations: app_slo[1],
                without_retraining_slo_violations: app_slo[2],
            });
        }
        episodes += n - from;
        steps += app_steps;
    }
    if steps == 0 {
        return None;
    }
    let per_step = |x: f64| x / steps as f64;
    Some(FinalRegime {
        episodes,
        converged_disturbed_reward: per_step(reward[0]),
        with_retraining_reward: per_step(reward[1]),
        without_retraining_reward: per_step(reward[2]),
        converged_undisturbed_reward: per_step(reward[3]),
        with_retraining_vs_reference_pct: pct(reward[1], reward[0]),
        without_retraining_vs_reference_pct: pct(reward[2], reward[0]),
        reference_vs_undisturbed_pct: pct(reward[0], reward[3]),
        converged_disturbed_slo_violations: slo[0],
        with_retraining_slo_violations: slo[1],
        without_retraining_slo_violations: slo[2],
        per_app,
    })
}

/// Every scenario that changes something for `app`, in a seeded order.
pub fn scenario_order(app: &AppSpec, seed: u64) -> Vec<Scenario> {
    let mut pool: Vec<Scenario> = Scenario::ALL
        .iter()
        .copied()
        .filter(|s| s.applies_to_app(app))
        .collect();
    pool.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    pool
}

/// `order` scheduled at serve steps `first_step`, `first_step + every_steps`, … (those before
/// `serve_steps`).
fn at_steps(
    order: impl IntoIterator<Item = Scenario>,
    first_step: u64,
    every_steps: u64,
    serve_steps: u64,
) -> Vec<(u64, Scenario)> {
    order
        .into_iter()
        .enumerate()
        .map(|(k, s)| (first_step + k as u64 * every_steps, s))
        .filter(|(st, _)| *st < serve_steps)
        .collect()
}

/// The scenarios injected into `app`: every applicable one, in a seeded order, at serve steps
/// `first_step`, `first_step + every_steps`, … (those before `serve_steps`).
pub fn schedule(
    app: &AppSpec,
    seed: u64,
    first_step: u64,
    every_steps: u64,
    serve_steps: u64,
) -> Vec<(u64, Scenario)> {
    at_steps(
        scenario_order(app, seed),
        first_step,
        every_steps,
        serve_steps,
    )
}

/// A schedule of servable scenarios and the scenarios left out of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServableSchedule {
    pub injections: Vec<(u64, Scenario)>,
    pub skipped: Vec<Scenario>,
}

/// `--servable-only`: walks `order` and schedules a scenario (at the next free slot
/// `first_step + k·every_steps`, on top of the ones already kept) only when the app's bounds can
/// serve the workload it leaves: with every resource at its maximum (`max`), the share of steps
/// violating the SLO from its injection to the end of the window rises by at most `tolerance`
/// over the same allocation on the undisturbed workload. A scenario that fails is skipped and
/// the next one is tried in its slot. Simulated from `env`/`obs` with the arms' payload seeds,
/// so the kept schedule is exactly what the arms then meet.
#[allow(clippy::too_many_arguments)]
fn servable_schedule(
    ctx: &Ctx<'_>,
    env: &SimEnv,
    obs: &Observation,
    max: Allocation,
    order: &[Scenario],
    first_step: u64,
    every_steps: u64,
    payload_seed: u64,
) -> Result<ServableSchedule, BenchError> {
    let spe = u64::from(ctx.opts.steps_per_episode).max(1);
    let serve_steps = u64::from(ctx.opts.serve_episodes) * spe;
    let probe = |injections: &[(u64, Scenario)]| {
        run_arm(
            ctx,
            env.clone(),
            obs.clone(),
            Driver::Fixed(max),
            injections,
            payload_seed,
        )
    };
    let baseline = probe(&[])?.episode_slo_violations;
    let mut out = ServableSchedule::default();
    for &sc in order {
        let at = first_step + out.injections.len() as u64 * every_steps;
        if at >= serve_steps {
            break;
        }
        let mut tentative = out.injections.clone();
        tentative.push((at, sc));
        let run = probe(&tentative)?;
        let from = usize::try_from(at / spe).unwrap_or(usize::MAX);
        if servable(
            &baseline,
            &run.episode_slo_violations,
            from,
            spe,
            ctx.opts.servable_tolerance,
        ) {
            out.injections = tentative;
        } else {
            out.skipped.push(sc);
        }
    }
    Ok(out)
}

/// Whether `disturbed`'s violations from episode `from` on exceed `baseline`'s over the same
/// episodes by at most `tolerance` of those steps (pure).
pub fn servable(
    baseline: &[u64],
    disturbed: &[u64],
    from: usize,
    steps_per_episode: u64,
    tolerance: f64,
) -> bool {
    let base: u64 = baseline.iter().skip(from).sum();
    let dist: u64 = disturbed.iter().skip(from).sum();
    let steps = disturbed.len().saturating_sub(from) as u64 * steps_per_episode;
    dist.saturating_sub(base) as f64 <= tolerance * steps as f64
}

enum Driver {
    Frozen(Box<Ddpg>),
    Retrain {
        agent: Box<Ddpg>,
        replay: Box<ReplayBuffer>,
        machine: Box<LifecycleMachine>,
        rng: Box<ChaCha8Rng>,
        /// The agent in force at the last retraining trigger (what a rollback restores).
        saved: Option<Box<Ddpg>>,
        /// The version the machine last saw: 1 (the adopted agent), then one per ONLINE
        /// episode, as the services' trainer publishes while the target learns.
        version: u64,
    },
    Fallback(Box<Fallback>, aware_shared::spec::Bounds),
    Oracle,
    /// A fixed allocation (the bounds' maximum).
    Fixed(Allocation),
}

struct Ctx<'a> {
    opts: &'a ServeBenchOptions,
    target: Target,
}

/// `steps` gradient steps (minibatch 64, recency-mixed) once the replay holds a minibatch;
/// returns the steps taken.
fn train_round(
    agent: &mut Ddpg,
    replay: &mut ReplayBuffer,
    steps: u32,
    recent: usize,
    fraction: f32,
) -> Result<u64, BenchError> {
    if replay.len() < 64 {
        return Ok(0);
    }
    for _ in 0..steps {
        let b = replay.sample_recent(64, recent, fraction).map_err(fail)?;
        agent.train_step(&b).map_err(fail)?;
    }
    Ok(u64::from(steps))
}

/// The recommender's HPA + VPA decision for `obs`.
fn fallback_step(
    ctx: &Ctx<'_>,
    fb: &mut Fallback,
    bounds: &aware_shared::spec::Bounds,
    obs: &Observation,
    step: u64,
) -> TargetAction {
    let o = aware_metrics_collector::simulator::to_obs(
        obs,
        &ctx.target,
        step,
        ctx.opts.steps_per_episode,
        0,
        false,
        None,
    );
    let current = aware_recommender::current_allocation(&o);
    let r = fb.recommend(obs.metrics.time_s, &o.metrics, current, bounds);
    TargetAction::Desired(Allocation {
        replicas: r.desired.replicas,
        cpu_millicores: r.desired.cpu_millicores,
        memory_bytes: r.desired.memory_bytes,
    })
}

/// The `model` the lifecycle monitor sees when the trainer publishes `version` (its
/// rollbacks name the version in force at the trigger).
fn model_seen(target: &Target, version: u64) -> Model {
    Model {
        schema: Schema::new(),
        target: target.clone(),
        episode: 0,
        step: 0,
        ts_ms: 0,
        kind: ModelKind::BaseLearner,
        version,
        uri: String::new(),
        sha256: String::new(),
        size_bytes: 0,
        trained_steps: 0,
        policy_estimate: None,
        behaviour_reward: None,
    }
}

/// Runs one arm from `env`/`obs` for the serve episodes.
fn run_arm(
    ctx: &Ctx<'_>,
    mut env: SimEnv,
    mut obs: Observation,
    mut driver: Driver,
    injections: &[(u64, Scenario)],
    payload_seed: u64,
) -> Result<ArmRun, BenchError> {
    let spe = u64::from(ctx.opts.steps_per_episode);
    let grid = OracleGrid::default();
    let mut run = ArmRun::default();
    // ONLINE transitions since the last retraining round (`retrain_every`).
    let mut pending = 0u32;
    let mut online =
        matches!(&driver, Driver::Retrain { machine, .. } if machine.stage() == Stage::Online);
    if let Driver::Retrain {
        machine, version, ..
    } = &mut driver
    {
        machine.observe_model(&model_seen(&ctx.target, *version));
    }
    for ep in 0..u64::from(ctx.opts.serve_episodes) {
        let (mut total, mut slo) = (0.0, 0u64);
        // the recommender's evaluation episodes (`recommender.eval_every_episodes`)
        let greedy = online && is_eval_episode(ep, ctx.opts.retrain_eval_every);
        if let Driver::Retrain { agent, .. } = &mut driver {
            if online {
                agent.normalizer_mut().unfreeze();
                agent.reset_noise();
            } else {
                agent.normalizer_mut().freeze();
            }
        }
        for k in 0..spe {
            let step = ep * spe + k;
            for (i, (at, sc)) in injections.iter().enumerate() {
                if *at == step {
                    let t = env.target_mut(0).map_err(fail)?;
                    sc.inject(t, payload_seed ^ i as u64).map_err(fail)?;
                }
            }
            let s = obs.state;
            let mut raw: Option<[f32; ACTION_DIM]> = None;
            let action = match &mut driver {
                Driver::Frozen(agent) => {
                    let a = agent.act(&s).map_err(fail)?;
                    raw = Some(a);
                    TargetAction::Raw(a)
                }
                Driver::Retrain { agent, rng, .. } => {
                    let a = if online && !greedy {
                        agent.act_explore(&s, rng).map_err(fail)?
                    } else {
                        agent.act(&s).map_err(fail)?
                    };
                    raw = Some(a);
                    TargetAction::Raw(a)
                }
                Driver::Fallback(fb, bounds) => fallback_step(ctx, fb, bounds, &obs, step),
                Driver::Oracle => {
                    let t = env.target_at_next_step(0).map_err(fail)?;
                    TargetAction::Desired(oracle_step(&t, &grid, &[]).allocation)
                }
                Driver::Fixed(a) => TargetAction::Desired(*a),
            };
            let next = first(env.step(&[action]).map_err(fail)?)?;
            total += next.reward;
            slo += u64::from(next.metrics.slo_violation);
            if let (Driver::Retrain { agent, replay, .. }, Some(a)) = (&mut driver, raw) {
                replay
                    .push(Transition {
                        state: s.to_vec(),
                        action: a,
                        reward: next.reward as f32,
                        next_state: next.state.to_vec(),
                        done: false,
                    })
                    .map_err(fail)?;
                if online {
                    let o = ctx.opts;
                    pending += 1;
                    if pending >= o.retrain_every.max(1) {
                        run.gradient_steps += train_round(
                            agent,
                            replay,
                            o.retrain_gradient_steps.saturating_mul(pending),
                            o.retrain_recent,
                            o.retrain_recent_fraction,
                        )?;
                        pending = 0;
                    }
                } else {
                    pending = 0;
                }
            }
            obs = next;
        }
        run.episode_rewards.push(total);
        run.episode_slo_violations.push(slo);
        run.steps += spe;
        if let Driver::Retrain {
            machine,
            agent,
            rng,
            saved,
            version,
            ..
        } = &mut driver
        {
            let stage = if online {
                Stage::Online
            } else {
                Stage::Serving
            };
            if online {
                run.online_episodes += 1;
                run.eval_episodes += u32::from(greedy);
                *version += 1;
                machine.observe_model(&model_seen(&ctx.target, *version));
            }
            let e = Episode {
                schema: Schema::new(),
                target: ctx.target.clone(),
                episode: ep,
                step: u32::try_from((ep + 1) * spe).unwrap_or(u32::MAX),
                ts_ms: 0,
                steps: ctx.opts.steps_per_episode,
                total_reward: total,
                mean_reward: total / spe.max(1) as f64,
                slo_violations: u32::try_from(slo).unwrap_or(u32::MAX),
                cpu_util_mean: 0.0,
                memory_util_mean: 0.0,
                rl_steps: ctx.opts.steps_per_episode,
                fallback_steps: 0,
                stage,
                policy_estimate: None,
                exploring_steps: Some(if online && !greedy {
                    ctx.opts.steps_per_episode
                } else {
                    0
                }),
                requested_cores_mean: None,
                requested_gib_mean: None,
            };
            if let Some(t) = machine.observe(&e) {
                tracing::debug!(target = %ctx.target, from = ?t.from, to = ?t.to, reason = %t.reason, "lifecycle");
                if t.to == Stage::Online {
                    run.retrain_triggers += 1;
                    run.reprobes += u32::from(machine.reprobing());
                    *saved = Some(agent.clone());
                    if ctx.opts.retrain_shrink < 1.0 {
                        let seed = rand::Rng::random::<u64>(rng.as_mut());
                        agent
                            .shrink_perturb(ctx.opts.retrain_shrink, seed)
                            .map_err(fail)?;
                    }
                }
                if t.rollback_to.is_some() {
                    // The services' trainer republishes the version in force at the trigger.
                    if let Some(a) = saved.take() {
                        **agent = *a;
                        run.rollbacks += 1;
                    }
                } else if machine.rebaselined() {
                    run.rebaselines += 1;
                }
            }
            online = machine.stage() == Stage::Online;
        }
    }
    Ok(run)
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len().max(1) as f64;
    let m = xs.iter().sum::<f64>() / n;
    let v = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n;
    (m, v.sqrt())
}

/// An agent after online training from scratch.
struct Trained {
    agent: Ddpg,
    replay: ReplayBuffer,
    obs: Observation,
    curve: Vec<f64>,
    /// With `record`: every transition, as the services would have recorded it.
    rows: Vec<super::serve_bus::TrainRow>,
}

/// Online DDPG from scratch on `env` for `train_episodes` (exploration σ, one round of
/// `gradient_steps` per transition); the normalizer is frozen at the end. With `record` the
/// transitions are also kept as [`super::serve_bus::TrainRow`]s.
fn train_agent(
    opts: &ServeBenchOptions,
    app_seed: u64,
    env: &mut SimEnv,
    mut obs: Observation,
    record: bool,
) -> Result<Trained, BenchError> {
    let spe = u64::from(opts.steps_per_episode);
    let mut dcfg =
        DdpgConfig::with_hidden(aware_loadgen::env::STATE_DIM, &[opts.hidden, opts.hidden]);
    dcfg.seed = app_seed;
    dcfg.noise.sigma = opts.exploration_sigma;
    let mut agent = Ddpg::new(dcfg).map_err(fail)?;
    let mut replay = ReplayBuffer::new(
        ReplayBuffer::DEFAULT_CAPACITY,
        aware_loadgen::env::STATE_DIM,
        app_seed,
    )
    .map_err(fail)?;
    let mut rng = ChaCha8Rng::seed_from_u64(app_seed ^ 0x5e7e);
    let mut curve = Vec::with_capacity(opts.train_episodes as usize);
    let mut rows = Vec::new();
    for _ in 0..opts.train_episodes {
        let mut total = 0.0;
        for _ in 0..spe {
            let s = obs.state;
            let a = agent.act_explore(&s, &mut rng).map_err(fail)?;
            let next = first(env.step(&[TargetAction::Raw(a)]).map_err(fail)?)?;
            total += next.reward;
            if record {
                let m = &next.metrics;
                rows.push(super::serve_bus::TrainRow {
                    state: s.to_vec(),
                    action: a,
                    reward: next.reward,
                    next_state: next.state.to_vec(),
                    applied: aware_bus_schemas::Resources {
                        replicas: m.replicas,
                        cpu_millicores: (m.cpu_limit_cores * 1000.0).round() as u32,
                        memory_bytes: m.memory_limit_bytes.round() as u64,
                    },
                    slo_violation: m.slo_violation,
                    cpu_util: m.cpu_util,
                    memory_util: m.memory_util,
                });
            }
            replay
                .push(Transition {
                    state: s.to_vec(),
                    action: a,
                    reward: next.reward as f32,
                    next_state: next.state.to_vec(),
                    done: false,
                })
                .map_err(fail)?;
            train_round(&mut agent, &mut replay, opts.gradient_steps, 0, 0.0)?;
            obs = next;
        }
        curve.push(total / spe.max(1) as f64);
    }
    agent.normalizer_mut().freeze();
    Ok(Trained {
        agent,
        replay,
        obs,
        curve,
        rows,
    })
}

/// Trains the agent on one app and runs every arm.
pub fn run_app(
    opts: &ServeBenchOptions,
    app: &AppSpec,
    index: usize,
) -> Result<AppResult, BenchError> {
    let spe = u64::from(opts.steps_per_episode);
    let app_seed = opts.seed.wrapping_mul(1_000_003).wrapping_add(index as u64);
    let cfg = SimConfig {
        seed: app_seed,
        ..SimConfig::default()
    };
    let mut env = SimEnv::new(vec![app.clone()], cfg).map_err(fail)?;
    env.reset(app_seed).map_err(fail)?;
    let obs = first(env.step(&[TargetAction::Hold]).map_err(fail)?)?;
    let mut result = AppResult {
        app: app.name.clone(),
        ..AppResult::default()
    };
    // The app before any training: HPA/VPA managing it from the first step instead of the agent
    // (same traces), and the disturbed reference's start.
    let (mut env_fb, mut obs_fb) = (env.clone(), obs.clone());
    let reference_start = opts.disturbed_reference.then(|| (env.clone(), obs.clone()));
    let trained = train_agent(opts, app_seed, &mut env, obs, opts.bus)?;
    let (agent, replay, obs) = (trained.agent, trained.replay, trained.obs);
    let train_rows = trained.rows;
    result.train_curve = trained.curve;
    let target = Target::new(app.namespace.clone(), app.name.clone());
    let ctx = Ctx { opts, target };
    let serve_steps = u64::from(opts.serve_episodes) * spe;
    let max = Allocation {
        replicas: app.bounds.max_replicas,
        cpu_millicores: app.bounds.max_cpu_millicores,
        memory_bytes: app.bounds.max_memory_bytes,
    };
    let payload_seed = app_seed ^ 0xfa70;
    let order = scenario_order(app, app_seed ^ 0x1a7e);
    let every_steps = u64::from(opts.inject_every) * spe;
    let injections = if opts.servable_only {
        let s = servable_schedule(
            &ctx,
            &env,
            &obs,
            max,
            &order,
            spe,
            every_steps,
            payload_seed,
        )?;
        result.skipped = s.skipped.len();
        s.injections
    } else {
        at_steps(order, spe, every_steps, serve_steps)
    };
    result.injected = injections.len();
    result.final_regime_from = injections.last().map_or(0, |(at, _)| {
        usize::try_from(at / spe.max(1)).unwrap_or(usize::MAX)
    });
    let spec = aware_metrics_collector::simulator::target_specs(std::slice::from_ref(app));
    let bounds = spec.first().map(|s| s.bounds).unwrap_or_default();
    let fallback = || -> Result<Driver, BenchError> {
        Ok(Driver::Fallback(
            Box::new(Fallback::new(FallbackConfig::default()).map_err(fail)?),
            bounds,
        ))
    };
    let mut fb_throughout = Fallback::new(FallbackConfig::default()).map_err(fail)?;
    for step in 0..u64::from(opts.train_episodes) * spe {
        let a = fallback_step(&ctx, &mut fb_throughout, &bounds, &obs_fb, step);
        obs_fb = first(env_fb.step(&[a]).map_err(fail)?)?;
    }
    let converged = run_arm(
        &ctx,
        env.clone(),
        obs.clone(),
        Driver::Frozen(Box::new(agent.clone())),
        &[],
        payload_seed,
    )?;
    let (m, sd) = mean_std(&converged.episode_rewards);
    let per_step = 1.0 / spe.max(1) as f64;
    let profile = LifecycleProfile {
        bootstrap: false,
        t_online: 0.0,
        t_serving: (m - opts.serving_margin * m.abs()) * per_step,
        t_var: 2.0 * sd * per_step + 0.02,
        window: opts.window,
    };
    let rules = aware_lifecycle_monitor::MonitorConfig {
        rebaseline_after_episodes: opts.rebaseline_after,
        rebaseline_tolerance: opts.rebaseline_tolerance,
        rebaseline_margin: opts.rebaseline_margin,
        rebaseline_rollback: opts.rebaseline_rollback,
        reprobe_after_episodes: opts.reprobe_after,
        serving_hysteresis: opts.serving_hysteresis,
        online_noise_free_only: opts.retrain_eval_every > 0,
        ..Default::default()
    };
    rules.validate().map_err(fail)?;
    if opts.bus {
        // The checkpoint the services' trainer would have stored: normalizer not frozen (the
        // recommenders only act; the trainer keeps updating it when it retrains).
        let mut stored = agent.clone();
        stored.normalizer_mut().unfreeze();
        result.handoff = Some(super::serve_bus::Handoff {
            app: app.clone(),
            checkpoint: stored.to_bytes().map_err(fail)?,
            trained_steps: stored.train_steps(),
            rows: train_rows,
            profile: profile.clone(),
            injections: injections.clone(),
            final_regime_from: result.final_regime_from,
        });
    }
    let mut machine = LifecycleMachine::with_rules(profile, rules);
    machine.restore(Stage::Serving);
    let mut retrain_agent = agent.clone();
    retrain_agent
        .set_exploration_sigma(opts.retrain_sigma)
        .map_err(fail)?;
    let retrain = Driver::Retrain {
        agent: Box::new(retrain_agent),
        replay: Box::new(replay),
        machine: Box::new(machine),
        rng: Box::new(ChaCha8Rng::seed_from_u64(app_seed ^ 0x7e7a)),
        saved: None,
        version: 1,
    };
    let mut arms = vec![("converged".to_string(), converged)];
    arms.push((
        "with_retraining".into(),
        run_arm(
            &ctx,
            env.clone(),
            obs.clone(),
            retrain,
            &injections,
            payload_seed,
        )?,
    ));
    arms.push((
        "without_retraining".into(),
        run_arm(
            &ctx,
            env.clone(),
            obs.clone(),
            Driver::Frozen(Box::new(agent)),
            &injections,
            payload_seed,
        )?,
    ));
    arms.push((
        "fallback".into(),
        run_arm(
            &ctx,
            env.clone(),
            obs.clone(),
            fallback()?,
            &injections,
            payload_seed,
        )?,
    ));
    if opts.oracle {
        arms.push((
            "oracle".into(),
            run_arm(
                &ctx,
                env.clone(),
                obs.clone(),
                Driver::Oracle,
                &injections,
                payload_seed,
            )?,
        ));
    }
    arms.push((
        "fallback_undisturbed".into(),
        run_arm(
            &ctx,
            env.clone(),
            obs.clone(),
            fallback()?,
            &[],
            payload_seed,
        )?,
    ));
    arms.push((
        "fallback_throughout".into(),
        run_arm(
            &ctx,
            env_fb,
            obs_fb,
            Driver::Fallback(Box::new(fb_throughout), bounds),
            &[],
            payload_seed,
        )?,
    ));
    if opts.oracle {
        arms.push((
            "oracle_undisturbed".into(),
            run_arm(
                &ctx,
                env.clone(),
                obs.clone(),
                Driver::Oracle,
                &[],
                payload_seed,
            )?,
        ));
    }
    arms.push((
        "max_allocation".into(),
        run_arm(
            &ctx,
            env,
            obs,
            Driver::Fixed(max),
            &injections,
            payload_seed,
        )?,
    ));
    if let Some((mut env_d, obs0)) = reference_start {
        // A fresh agent trained as long as the main one on the app with every scheduled
        // scenario in force from its first step, then frozen: what RL converges to on the
        // workload the scenarios leave behind.
        for (i, (_, sc)) in injections.iter().enumerate() {
            let t = env_d.target_mut(0).map_err(fail)?;
            sc.inject(t, payload_seed ^ i as u64).map_err(fail)?;
        }
        let t = train_agent(opts, app_seed, &mut env_d, obs0, false)?;
        arms.push((
            "converged_disturbed".into(),
            run_arm(
                &ctx,
                env_d,
                t.obs,
                Driver::Frozen(Box::new(t.agent)),
                &[],
                payload_seed,
            )?,
        ));
    }
    result.arms = arms;
    Ok(result)
}

/// Sums the per-app runs into one report per arm (pure).
pub fn aggregate(results: &[AppResult], serve_episodes: usize) -> Vec<ArmReport> {
    let total = |arm: &str| -> Option<f64> {
        let runs: Vec<&ArmRun> = results
            .iter()
            .filter_map(|r| r.arms.iter().find(|(n, _)| n == arm).map(|(_, a)| a))
            .collect();
        (!runs.is_empty() && runs.len() == results.len())
            .then(|| runs.iter().map(|a| a.total_reward()).sum())
    };
    let conv = total("converged");
    let mut out = Vec::new();
    for arm in ARMS {
        let runs: Vec<&ArmRun> = results
            .iter()
            .filter_map(|r| r.arms.iter().find(|(n, _)| n == arm).map(|(_, a)| a))
            .collect();
        if runs.is_empty() {
            continue;
        }
        let steps: u64 = runs.iter().map(|a| a.steps).sum();
        let tot: f64 = runs.iter().map(|a| a.total_reward()).sum();
        let slo: u64 = runs.iter().map(|a| a.slo()).sum();
        // The oracle on the same workload; none runs on the reference's (fully disturbed from
        // its first step).
        let oracle = match arm {
            "converged_disturbed" => None,
            "converged" | "fallback_throughout" => total("oracle_undisturbed"),
            a if a.ends_with("undisturbed") => total("oracle_undisturbed"),
            _ => total("oracle"),
        };
        let mut curve = vec![0.0; serve_episodes];
        for a in &runs {
            let spe = a.steps as f64 / a.episode_rewards.len().max(1) as f64;
            for (c, r) in curve.iter_mut().zip(&a.episode_rewards) {
                *c += r / spe.max(1.0) / runs.len() as f64;
            }
        }
        out.push(ArmReport {
            arm: arm.into(),
            apps: runs.len(),
            steps,
            total_reward: tot,
            mean_reward: tot / steps.max(1) as f64,
            slo_violations: slo,
            slo_violation_rate: slo as f64 / steps.max(1) as f64,
            pct_of_converged: conv.map_or(f64::NAN, |c| 100.0 * tot / c),
            pct_of_oracle: oracle.map(|o| 100.0 * tot / o),
            online_episodes: runs.iter().map(|a| a.online_episodes).sum(),
            retrain_triggers: runs.iter().map(|a| a.retrain_triggers).sum(),
            rebaselines: runs.iter().map(|a| a.rebaselines).sum(),
            rollbacks: runs.iter().map(|a| a.rollbacks).sum(),
            reprobes: runs.iter().map(|a| a.reprobes).sum(),
            eval_episodes: runs.iter().map(|a| a.eval_episodes).sum(),
            gradient_steps: runs.iter().map(|a| a.gradient_steps).sum(),
            curve,
        });
    }
    out
}

/// The learning curves as SVG: training (with noise), then every arm over the serve episodes;
/// dashed lines at the injection episodes.
pub fn curve_svg(train: &[f64], arms: &[ArmReport], inject_at: &[usize]) -> String {
    use aware_harness::chart::{line_chart, Chart, Series};
    let mut series = vec![Series {
        name: "training (noisy)",
        offset: 0,
        values: train,
    }];
    series.extend(arms.iter().map(|a| Series {
        name: a.arm.as_str(),
        offset: train.len(),
        values: &a.curve,
    }));
    line_chart(&Chart {
        series,
        vlines: inject_at.iter().map(|e| train.len() + e).collect(),
        vline_dash: "3,3",
        hlines: Vec::new(),
        x_label: "episode (training, then serving; dashed: scenario injections)",
        y_label: "reward per step",
    })
}

/// Runs the bench and writes `serve.json` and `serve-curve.svg` into `opts.out`.
pub fn run(opts: &ServeBenchOptions) -> Result<ServeReport, BenchError> {
    let started = std::time::Instant::now();
    let apps = generate_apps(opts.apps, opts.seed, &GeneratorOptions::default());
    let mut results = Vec::with_capacity(apps.len());
    for (i, app) in apps.iter().enumerate() {
        let r = run_app(opts, app, i)?;
        tracing::info!(
            app = %app.name,
            done = i + 1,
            of = apps.len(),
            injected = r.injected,
            skipped = r.skipped,
            train_last = r.train_curve.last().copied().unwrap_or(f64::NAN),
            wall_s = started.elapsed().as_secs_f64(),
            "app done"
        );
        results.push(r);
    }
    let serve = opts.serve_episodes as usize;
    let arms = aggregate(&results, serve);
    let mut train_curve = vec![0.0; opts.train_episodes as usize];
    for r in &results {
        for (c, v) in train_curve.iter_mut().zip(&r.train_curve) {
            *c += v / results.len().max(1) as f64;
        }
    }
    let find = |n: &str| arms.iter().find(|a| a.arm == n);
    let with = find("with_retraining");
    let without = find("without_retraining");
    let conv = find("converged");
    let fbu = find("fallback_throughout");
    let fb_same_state = find("fallback_undisturbed");
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    let cvf = ConvergedVsFallback {
        converged_pct_of_oracle: conv.and_then(|a| a.pct_of_oracle),
        fallback_pct_of_oracle: fbu.and_then(|a| a.pct_of_oracle),
        gap_pp: conv
            .and_then(|a| a.pct_of_oracle)
            .zip(fbu.and_then(|a| a.pct_of_oracle))
            .map(|(c, f)| c - f),
        converged_slo_violations: conv.map_or(0, |a| a.slo_violations),
        fallback_slo_violations: fbu.map_or(0, |a| a.slo_violations),
        fallback_from_agent_state_pct_of_oracle: fb_same_state.and_then(|a| a.pct_of_oracle),
    };
    let mut report = ServeReport {
        apps: results.len(),
        seed: opts.seed,
        train_episodes: opts.train_episodes,
        serve_episodes: opts.serve_episodes,
        steps_per_episode: opts.steps_per_episode,
        inject_every: opts.inject_every,
        window: opts.window,
        serving_margin: opts.serving_margin,
        hidden: opts.hidden,
        exploration_sigma: opts.exploration_sigma,
        gradient_steps: opts.gradient_steps,
        retrain_gradient_steps: opts.retrain_gradient_steps,
        retrain_recent_fraction: opts.retrain_recent_fraction,
        retrain_recent: opts.retrain_recent,
        retrain_sigma: opts.retrain_sigma,
        retrain_every: opts.retrain_every,
        rebaseline_after: opts.rebaseline_after,
        rebaseline_tolerance: opts.rebaseline_tolerance,
        rebaseline_margin: opts.rebaseline_margin,
        rebaseline_rollback: opts.rebaseline_rollback,
        reprobe_after: opts.reprobe_after,
        serving_hysteresis: opts.serving_hysteresis,
        retrain_shrink: opts.retrain_shrink,
        retrain_eval_every: opts.retrain_eval_every,
        scenarios_injected: results.iter().map(|r| r.injected).sum(),
        servable_only: opts.servable_only,
        servable_tolerance: opts.servable_tolerance,
        scenarios_skipped: results.iter().map(|r| r.skipped).sum(),
        train_curve: train_curve.clone(),
        with_retraining_vs_converged_pct: with.map_or(f64::NAN, |a| a.pct_of_converged - 100.0),
        slo_ratio_without_vs_with: ratio(
            without.map_or(0, |a| a.slo_violations) as f64,
            with.map_or(0, |a| a.slo_violations) as f64,
        ),
        slo_ratio_bound: ratio(
            without.map_or(0, |a| a.slo_violations) as f64,
            find("max_allocation").map_or(0, |a| a.slo_violations) as f64,
        ),
        with_retraining_vs_converged_oracle_relative_pct: with
            .and_then(|a| a.pct_of_oracle)
            .zip(conv.and_then(|a| a.pct_of_oracle))
            .map(|(w, c)| 100.0 * (w / c - 1.0)),
        converged_vs_fallback: cvf,
        final_regime: final_regime(&results),
        bus: None,
        wall_seconds: started.elapsed().as_secs_f64(),
        arms,
    };
    if opts.bus {
        let handoffs: Vec<super::serve_bus::Handoff> =
            results.into_iter().filter_map(|r| r.handoff).collect();
        let bus_opts = super::serve_bus::BusOptions {
            apps: opts.apps,
            seed: opts.seed,
            train_episodes: opts.train_episodes,
            serve_episodes: opts.serve_episodes,
            steps_per_episode: opts.steps_per_episode,
            pace_ms: opts.bus_pace_ms,
            timeout: std::time::Duration::from_secs(6 * 3600),
            work: opts.out.join("bus"),
            settings: opts.bus_settings.clone(),
        };
        let system = actix_rt::System::new();
        let mut bus =
            system.block_on(async move { super::serve_bus::run(&bus_opts, &handoffs).await })?;
        if let Some(f) = &report.final_regime {
            let per_app = f
                .per_app
                .iter()
                .map(|a| (a.app.clone(), a.converged_disturbed_reward))
                .collect();
            super::serve_bus::against_reference(&mut bus, f.converged_disturbed_reward, &per_app);
        }
        report.bus = Some(bus);
        report.wall_seconds = started.elapsed().as_secs_f64();
    }
    let inject_at: Vec<usize> = (0..8usize)
        .map(|k| 1 + k * opts.inject_every as usize)
        .filter(|e| *e < serve)
        .collect();
    let svg = curve_svg(&train_curve, &report.arms, &inject_at);
    let path = opts.out.join("serve-curve.svg");
    std::fs::create_dir_all(&opts.out)
        .and_then(|()| std::fs::write(&path, svg))
        .map_err(|source| BenchError::Io {
            path: path.display().to_string(),
            source,
        })?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(rewards: &[f64], slo: &[u64]) -> ArmRun {
        ArmRun {
            episode_rewards: rewards.to_vec(),
            episode_slo_violations: slo.to_vec(),
            steps: 10 * rewards.len() as u64,
            online_episodes: 0,
            retrain_triggers: 0,
            rebaselines: 0,
            rollbacks: 0,
            reprobes: 0,
            eval_episodes: 0,
            gradient_steps: 0,
        }
    }

    #[test]
    fn aggregate_sums_apps_and_relates_to_converged_and_oracle() {
        let app = |c: f64, o: f64| AppResult {
            app: "a".into(),
            train_curve: vec![1.0],
            arms: vec![
                ("converged".into(), run_of(&[c, c], &[0, 1])),
                (
                    "with_retraining".into(),
                    run_of(&[c / 2.0, c / 2.0], &[2, 2]),
                ),
                ("oracle".into(), run_of(&[o, o], &[0, 0])),
                ("oracle_undisturbed".into(), run_of(&[o, o], &[0, 0])),
                ("converged_disturbed".into(), run_of(&[c, c], &[0, 0])),
            ],
            injected: 1,
            skipped: 0,
            final_regime_from: 1,
            handoff: None,
        };
        let arms = aggregate(&[app(10.0, 20.0), app(30.0, 20.0)], 2);
        let conv = arms.iter().find(|a| a.arm == "converged").unwrap();
        assert_eq!(conv.total_reward, 80.0);
        assert_eq!(conv.slo_violations, 2);
        assert_eq!(conv.steps, 40);
        assert!((conv.pct_of_converged - 100.0).abs() < 1e-9);
        assert!((conv.pct_of_oracle.unwrap() - 100.0).abs() < 1e-9);
        // curve: mean over apps of per-step reward by episode
        assert!((conv.curve[0] - 2.0).abs() < 1e-9);
        let w = arms.iter().find(|a| a.arm == "with_retraining").unwrap();
        assert!((w.pct_of_converged - 50.0).abs() < 1e-9);
        assert!((w.pct_of_oracle.unwrap() - 50.0).abs() < 1e-9);
        assert_eq!(w.slo_violations, 8);
        assert!(arms.iter().all(|a| a.arm != "fallback"));
        // No oracle ran on the reference's workload: no % of oracle for it.
        let d = arms
            .iter()
            .find(|a| a.arm == "converged_disturbed")
            .unwrap();
        assert!(d.pct_of_oracle.is_none());
        assert!((d.pct_of_converged - 100.0).abs() < 1e-9);
    }

    #[test]
    fn final_regime_counts_only_episodes_after_the_last_injection() {
        // Episode rewards per 10-step episode; app A's last injection at episode 2, B's at 1.
        let app = |name: &str, from: usize, d: [f64; 3], w: [f64; 3], wo: [f64; 3], c: [f64; 3]| {
            AppResult {
                app: name.into(),
                train_curve: vec![],
                arms: vec![
                    ("converged".into(), run_of(&c, &[0, 0, 0])),
                    ("with_retraining".into(), run_of(&w, &[1, 2, 3])),
                    ("without_retraining".into(), run_of(&wo, &[4, 5, 6])),
                    ("converged_disturbed".into(), run_of(&d, &[7, 8, 9])),
                ],
                injected: 2,
                skipped: 0,
                final_regime_from: from,
                handoff: None,
            }
        };
        let a = app(
            "a",
            2,
            [0.0, 0.0, 10.0],
            [99.0, 99.0, 8.0],
            [99.0, 99.0, 5.0],
            [20.0; 3],
        );
        let b = app(
            "b",
            1,
            [0.0, 10.0, 10.0],
            [99.0, 6.0, 6.0],
            [99.0, 5.0, 5.0],
            [20.0; 3],
        );
        let f = final_regime(&[a.clone(), b]).unwrap();
        assert_eq!(f.episodes, 3);
        // Σ over episodes {A: 2; B: 1, 2} of 10 steps each.
        assert!((f.converged_disturbed_reward - 30.0 / 30.0).abs() < 1e-12);
        assert!((f.with_retraining_reward - 20.0 / 30.0).abs() < 1e-12);
        assert!((f.without_retraining_reward - 15.0 / 30.0).abs() < 1e-12);
        assert!((f.with_retraining_vs_reference_pct + 100.0 / 3.0).abs() < 1e-9);
        assert!((f.without_retraining_vs_reference_pct + 50.0).abs() < 1e-9);
        assert!((f.reference_vs_undisturbed_pct + 50.0).abs() < 1e-9);
        assert_eq!(f.converged_disturbed_slo_violations, 9 + 8 + 9);
        assert_eq!(f.with_retraining_slo_violations, 3 + 2 + 3);
        assert_eq!(f.without_retraining_slo_violations, 6 + 5 + 6);
        // Per app: A over its episode 2 only, B over 1 and 2.
        let names: Vec<&str> = f.per_app.iter().map(|p| p.app.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let (pa, pb) = (&f.per_app[0], &f.per_app[1]);
        assert_eq!((pa.episodes, pb.episodes), (1, 2));
        assert!((pa.converged_disturbed_reward - 1.0).abs() < 1e-12);
        assert!((pa.with_retraining_reward - 0.8).abs() < 1e-12);
        assert!((pa.without_retraining_reward - 0.5).abs() < 1e-12);
        assert!((pa.with_retraining_vs_reference_pct + 20.0).abs() < 1e-9);
        assert!((pb.with_retraining_reward - 0.6).abs() < 1e-12);
        assert!((pb.with_retraining_vs_reference_pct + 40.0).abs() < 1e-9);
        assert_eq!(
            (
                pb.converged_disturbed_slo_violations,
                pb.with_retraining_slo_violations,
                pb.without_retraining_slo_violations
            ),
            (8 + 9, 2 + 3, 5 + 6)
        );
        // No reference arm on an app: no comparison.
        let mut c = a;
        c.arms.retain(|(n, _)| n != "converged_disturbed");
        assert!(final_regime(&[c]).is_none());
    }

    #[test]
    fn disturbed_reference_is_trained_on_the_final_workload() {
        let opts = ServeBenchOptions {
            apps: 1,
            train_episodes: 2,
            serve_episodes: 4,
            steps_per_episode: 10,
            inject_every: 1,
            hidden: 8,
            oracle: false,
            disturbed_reference: true,
            ..ServeBenchOptions::default()
        };
        let app = generate_apps(1, opts.seed, &GeneratorOptions::default()).remove(0);
        let r = run_app(&opts, &app, 0).unwrap();
        let arm = |name: &str| {
            r.arms
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, a)| a.clone())
        };
        let d = arm("converged_disturbed").unwrap();
        assert_eq!(d.episode_rewards.len(), 4);
        assert_eq!(d.steps, 40);
        assert!(r.injected >= 1);
        // The last injection's serve episode (one every episode from episode 1).
        assert_eq!(r.final_regime_from, r.injected.min(3));
        // Its workload is the disturbed one from its first serve step: it differs from the
        // frozen main agent on the undisturbed workload.
        assert_ne!(d.episode_rewards, arm("converged").unwrap().episode_rewards);
        assert!(final_regime(std::slice::from_ref(&r)).is_some());
        let off = run_app(
            &ServeBenchOptions {
                disturbed_reference: false,
                ..opts
            },
            &app,
            0,
        )
        .unwrap();
        assert!(off.arms.iter().all(|(n, _)| n != "converged_disturbed"));
    }

    #[test]
    fn schedule_covers_applicable_scenarios_in_order_within_the_window() {
        let app = generate_apps(1, 1001, &GeneratorOptions::default()).remove(0);
        let s = schedule(&app, 7, 1, 150, 10_000);
        let applicable = Scenario::ALL
            .iter()
            .filter(|x| x.applies_to_app(&app))
            .count();
        assert_eq!(s.len(), applicable);
        assert_eq!(s[0].0, 1);
        assert!(s.windows(2).all(|w| w[1].0 == w[0].0 + 150));
        assert_eq!(s, schedule(&app, 7, 1, 150, 10_000));
        assert!(schedule(&app, 7, 1, 150, 200).len() <= 2);
    }

    #[test]
    fn max_allocation_has_the_fewest_slo_violations_under_the_scenarios() {
        let opts = ServeBenchOptions {
            apps: 1,
            train_episodes: 2,
            serve_episodes: 6,
            steps_per_episode: 20,
            inject_every: 1,
            hidden: 8,
            oracle: false,
            ..ServeBenchOptions::default()
        };
        for index in 0..3 {
            let app = generate_apps(3, opts.seed, &GeneratorOptions::default()).remove(index);
            let r = run_app(&opts, &app, index).unwrap();
            let slo = |name: &str| r.arms.iter().find(|(n, _)| n == name).unwrap().1.slo();
            let max = slo("max_allocation");
            assert_eq!(
                r.arms
                    .iter()
                    .find(|(n, _)| n == "max_allocation")
                    .unwrap()
                    .1
                    .steps,
                120
            );
            for arm in ["with_retraining", "without_retraining", "fallback"] {
                assert!(
                    max <= slo(arm),
                    "{}: max {max} > {arm} {}",
                    app.name,
                    slo(arm)
                );
            }
        }
    }

    #[test]
    fn servable_compares_the_violations_after_the_injection_with_the_undisturbed_ones() {
        // 2 episodes of 10 steps from episode 1: 20 steps, a 0.1 tolerance allows 2 more.
        assert!(servable(&[5, 1, 1], &[5, 2, 2], 1, 10, 0.1));
        assert!(!servable(&[5, 1, 1], &[5, 2, 3], 1, 10, 0.1));
        // episodes before the injection do not count; fewer violations are servable
        assert!(servable(&[0, 1, 1], &[9, 0, 0], 1, 10, 0.0));
        assert!(!servable(&[0, 0, 0], &[0, 0, 1], 0, 10, 0.0));
        // an injection at or after the end leaves nothing to compare: servable
        assert!(servable(&[0, 0], &[0, 9], 2, 10, 0.0));
    }

    #[test]
    fn servable_schedule_skips_a_load_rise_the_bounds_cannot_serve() {
        let opts = ServeBenchOptions {
            serve_episodes: 4,
            steps_per_episode: 20,
            ..ServeBenchOptions::default()
        };
        let mut app = generate_apps(1, opts.seed, &GeneratorOptions::default()).remove(0);
        let target = Target::new(app.namespace.clone(), app.name.clone());
        let ctx = Ctx {
            opts: &opts,
            target,
        };
        let order = [Scenario::LoadLowToHigh, Scenario::LoadHighToLow];
        let probe = |app: &AppSpec, tolerance: f64| {
            let mut env = SimEnv::new(vec![app.clone()], SimConfig::default()).unwrap();
            env.reset(7).unwrap();
            let obs = first(env.step(&[TargetAction::Hold]).unwrap()).unwrap();
            let max = Allocation {
                replicas: app.bounds.max_replicas,
                cpu_millicores: app.bounds.max_cpu_millicores,
                memory_bytes: app.bounds.max_memory_bytes,
            };
            let opts = ServeBenchOptions {
                servable_tolerance: tolerance,
                ..ctx.opts.clone()
            };
            let ctx = Ctx {
                opts: &opts,
                target: ctx.target.clone(),
            };
            let s = servable_schedule(&ctx, &env, &obs, max, &order, 20, 20, 3).unwrap();
            let base = run_arm(&ctx, env.clone(), obs.clone(), Driver::Fixed(max), &[], 3)
                .unwrap()
                .slo();
            let with = run_arm(&ctx, env, obs, Driver::Fixed(max), &s.injections, 3)
                .unwrap()
                .slo();
            (s, base, with)
        };
        // the generated bounds serve three times the load
        let (s, base, with) = probe(&app, 0.02);
        assert_eq!(s.injections, [(20, order[0]), (40, order[1])]);
        assert!(s.skipped.is_empty());
        assert_eq!((base, with), (0, 0));
        // four replicas serve the load but not three times it: 26 of the 60 steps after the
        // rise violate; the drop is tried in its slot instead
        app.bounds.max_replicas = 4;
        let (s, base, with) = probe(&app, 0.02);
        assert_eq!(s.injections, [(20, Scenario::LoadHighToLow)]);
        assert_eq!(s.skipped, [Scenario::LoadLowToHigh]);
        assert_eq!((base, with), (0, 0));
        let (s, base, with) = probe(&app, 1.0);
        assert_eq!(s.injections, [(20, order[0]), (40, order[1])]);
        assert!(with > base + 20, "{base} {with}");
    }

    /// One app's simulator after a first step, for the retraining arm's tests.
    fn one_app(app_seed: u64, seed: u64) -> (AppSpec, SimEnv, Observation) {
        let app = generate_apps(1, app_seed, &GeneratorOptions::default()).remove(0);
        let mut env = SimEnv::new(vec![app.clone()], SimConfig::default()).unwrap();
        env.reset(seed).unwrap();
        let obs = first(env.step(&[TargetAction::Hold]).unwrap()).unwrap();
        (app, env, obs)
    }

    /// A retraining driver (8-8 networks, seeded) whose Algorithm 1 starts ONLINE and serves
    /// once a window of one episode reaches `t_serving`.
    fn online_driver(
        seed: u64,
        t_serving: f64,
        rules: aware_lifecycle_monitor::MonitorConfig,
        replay: ReplayBuffer,
    ) -> Driver {
        let mut dcfg = DdpgConfig::with_hidden(aware_loadgen::env::STATE_DIM, &[8, 8]);
        dcfg.seed = seed;
        let profile = LifecycleProfile {
            bootstrap: false,
            t_online: 0.0,
            t_serving,
            t_var: 10.0,
            window: 1,
        };
        let mut machine = LifecycleMachine::with_rules(profile, rules);
        machine.restore(Stage::Online);
        Driver::Retrain {
            agent: Box::new(Ddpg::new(dcfg).unwrap()),
            replay: Box::new(replay),
            machine: Box::new(machine),
            rng: Box::new(ChaCha8Rng::seed_from_u64(seed)),
            saved: None,
            version: 1,
        }
    }

    /// `driver` over 7 serve episodes of 10 steps from `obs`.
    fn run_seven(
        app: &AppSpec,
        env: &SimEnv,
        obs: &Observation,
        opts: ServeBenchOptions,
        driver: Driver,
    ) -> ArmRun {
        let opts = ServeBenchOptions {
            serve_episodes: 7,
            steps_per_episode: 10,
            ..opts
        };
        let ctx = Ctx {
            opts: &opts,
            target: Target::new(app.namespace.clone(), app.name.clone()),
        };
        run_arm(&ctx, env.clone(), obs.clone(), driver, &[], 1).unwrap()
    }

    #[test]
    fn every_kth_online_episode_runs_without_noise_and_alone_reaches_the_monitor() {
        let (app, env, obs) = one_app(1001, 5);
        let run = |every: u32, t_serving: f64| {
            let rules = aware_lifecycle_monitor::MonitorConfig {
                online_noise_free_only: every > 0,
                ..Default::default()
            };
            let replay = ReplayBuffer::new(1000, aware_loadgen::env::STATE_DIM, 5).unwrap();
            let opts = ServeBenchOptions {
                retrain_eval_every: every,
                ..ServeBenchOptions::default()
            };
            run_seven(
                &app,
                &env,
                &obs,
                opts,
                online_driver(5, t_serving, rules, replay),
            )
        };
        // never good enough to serve: ONLINE throughout, episodes 2 and 5 (k − 1 modulo k)
        // without noise
        let r = run(3, 1e9);
        assert_eq!((r.online_episodes, r.eval_episodes), (7, 2));
        // any reward serves: the first episode fed decides. Without evaluation episodes that is
        // episode 0; with every third, the exploring episodes 0 and 1 are not fed to the
        // monitor and the agent serves from episode 3 on
        let r = run(0, -1e9);
        assert_eq!((r.online_episodes, r.eval_episodes), (1, 0));
        let r = run(3, -1e9);
        assert_eq!((r.online_episodes, r.eval_episodes), (3, 1));
    }

    /// `retrain_every`: the same gradient steps per ONLINE transition, taken in rounds (the
    /// services' cadence) instead of after every transition, so the agent acts with older
    /// weights in between and the rewards differ.
    #[test]
    fn retraining_rounds_take_the_same_steps_per_transition_at_their_own_cadence() {
        let (app, env, obs) = one_app(1002, 7);
        let run = |every: u32| {
            // A full minibatch from the start.
            let mut replay = ReplayBuffer::new(1000, aware_loadgen::env::STATE_DIM, 7).unwrap();
            for i in 0..64 {
                replay
                    .push(Transition {
                        state: obs.state.to_vec(),
                        action: [0.0; ACTION_DIM],
                        reward: i as f32 / 64.0,
                        next_state: obs.state.to_vec(),
                        done: false,
                    })
                    .unwrap();
            }
            let opts = ServeBenchOptions {
                retrain_eval_every: 0,
                retrain_gradient_steps: 4,
                retrain_every: every,
                ..ServeBenchOptions::default()
            };
            // t_serving 10⁹: never serves, ONLINE throughout.
            let driver = online_driver(7, 1e9, Default::default(), replay);
            run_seven(&app, &env, &obs, opts, driver)
        };
        let each = run(1);
        assert_eq!((each.online_episodes, each.gradient_steps), (7, 70 * 4));
        // Rounds of 10 transitions, one per episode: the same 280 steps.
        let tens = run(10);
        assert_eq!(tens.gradient_steps, 280);
        // Rounds of 4: 17 rounds by transition 68, the last 2 transitions still pending.
        assert_eq!(run(4).gradient_steps, 17 * 16);
        // The first episode acts with the initial weights throughout in rounds of 10, not
        // after every transition.
        assert_ne!(each.episode_rewards, tens.episode_rewards);
        assert_eq!(run(10).episode_rewards, tens.episode_rewards, "seeded");
    }

    #[test]
    fn fallback_throughout_is_hpa_vpa_from_the_first_step() {
        let opts = ServeBenchOptions {
            apps: 1,
            train_episodes: 2,
            serve_episodes: 2,
            steps_per_episode: 10,
            hidden: 8,
            oracle: false,
            ..ServeBenchOptions::default()
        };
        let app = generate_apps(1, opts.seed, &GeneratorOptions::default()).remove(0);
        let r = run_app(&opts, &app, 0).unwrap();
        let arm = |name: &str| r.arms.iter().find(|(n, _)| n == name).unwrap().1.clone();
        let got = arm("fallback_throughout");
        // Independently: the same simulator from its reset, HPA/VPA for 4 episodes; the last 2.
        let app_seed = opts.seed.wrapping_mul(1_000_003);
        let mut env = SimEnv::new(
            vec![app.clone()],
            SimConfig {
                seed: app_seed,
                ..SimConfig::default()
            },
        )
        .unwrap();
        env.reset(app_seed).unwrap();
        let mut obs = first(env.step(&[TargetAction::Hold]).unwrap()).unwrap();
        let ctx = Ctx {
            opts: &opts,
            target: Target::new(app.namespace.clone(), app.name.clone()),
        };
        let bounds = aware_metrics_collector::simulator::target_specs(std::slice::from_ref(&app))
            .remove(0)
            .bounds;
        let mut fb = Fallback::new(FallbackConfig::default()).unwrap();
        let mut rewards = vec![0.0; 4];
        for step in 0..40u64 {
            let a = fallback_step(&ctx, &mut fb, &bounds, &obs, step % 20);
            obs = first(env.step(&[a]).unwrap()).unwrap();
            rewards[(step / 10) as usize] += obs.reward;
        }
        assert_eq!(got.episode_rewards.len(), 2);
        for (g, w) in got.episode_rewards.iter().zip(&rewards[2..]) {
            assert!(
                (g - w).abs() < 1e-9,
                "{:?} vs {:?}",
                got.episode_rewards,
                rewards
            );
        }
        // not the arm that takes over the agent's allocation
        assert_ne!(
            arm("fallback_undisturbed").episode_rewards,
            got.episode_rewards
        );
    }

    #[test]
    fn svg_has_one_polyline_per_series() {
        let arms = aggregate(
            &[AppResult {
                app: "a".into(),
                train_curve: vec![1.0, 2.0],
                arms: vec![("converged".into(), run_of(&[10.0, 20.0], &[0, 0]))],
                injected: 0,
                skipped: 0,
                final_regime_from: 0,
                handoff: None,
            }],
            2,
        );
        let svg = curve_svg(&[1.0, 2.0], &arms, &[1]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
    }
}
