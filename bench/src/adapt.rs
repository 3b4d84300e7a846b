//! `aware bench adapt` (paper §5.2, Fig. 8): how fast a policy adapts to a workload it has never
//! seen — AWARE's meta-learned base-learner against FIRM's transfer learning (TL) and TL with
//! extra temporal and spatial state features (TL+).
//!
//! In this process on the simulator. `repeats` repetitions (the paper repeats its A/B test with
//! random source and target workloads); repetition r has its own TL source app (the
//! `source_index + r`-th of the pool's training side) and its own held-out apps,
//! `generate_apps(apps, seed + 1000·r)` with a seed other than the meta-training pool's (default
//! 1001, the pool's is `train-meta --seed`, 0 by default; checked): apps never seen in
//! meta-training nor by the TL source agents. Per app and arm,
//! `episodes` episodes of `steps_per_episode` steps; episode k of an app runs on a fresh
//! simulator reset with the same seed in every arm (the same trace, the same noise), and every
//! learning arm takes `gradient_steps` DDPG updates (minibatch 64) per transition. Arms:
//!
//! - `aware`: the meta-trained base-learner and meta-learner of an `aware train-meta` output
//!   (or a short meta-training first). The first `fallback_episodes` episodes of the budget are
//!   driven by the fallback rule meta-training used (`train_meta::fallback_action`); their
//!   top-M form the app's bundle, which the frozen meta-learner embeds. Then the base-learner
//!   (DDPG over `state ‖ embedding`) acts and is fine-tuned online; the embedding is recomputed
//!   from the app's top-M episodes every `embedding_refresh` episodes (as the trainer does). The
//!   fallback episodes' transitions get their gradient steps when the first embedding exists
//!   (the same number per transition as every other arm).
//! - `tl`: a DDPG agent (64-64, Table 2) trained online to convergence on one source app of the
//!   meta-training pool's training side ([`tl::train_source`]), copied into each app's agent
//!   ([`tl::transfer`]) and fine-tuned online.
//! - `tl_plus`: the same with the extended state `state ‖ TL+ features` ([`features`]), source
//!   agent included.
//! - `scratch`: a fresh DDPG agent learning online (reference).
//! - `fallback`: the recommender's HPA + VPA (`Fallback`, default settings, a fresh instance per
//!   episode since every episode restarts the simulator's clock), no learning (reference).
//!
//! Measures, per arm and app: the episodes until the moving average (over `window` episodes;
//! partial windows at the start) of the learned policy's per-step episode reward first reaches
//! `threshold` (95%) of the app's converged reward, counting every episode of the budget up to
//! there, the fallback episodes of `aware` included — but only episodes the learned policy drove
//! can reach it. Censored at the budget when never reached (counted as the budget and reported
//! as censored). The converged reward of an app is the best final-`window` mean among the
//! learning arms (the plateau the best of them reached within the budget). Also the thread CPU
//! time of the agent's work until then (acting, TL+ features, embeddings, gradient steps; not
//! the simulator), the SLO violations until then and over the whole budget, and the CPU/memory
//! utilization deficit against the converged policy (that best arm's final-window utilization)
//! over the adaptation episodes. Not counted per app: meta-training and the source agents'
//! training (one-off costs, reported separately).

pub mod features;
pub mod shared;
pub mod tl;

use std::path::PathBuf;
use std::time::Duration;

use aware_bus_schemas::Target;
use aware_loadgen::app::{generate_apps, GeneratorOptions};
use aware_loadgen::{AppSpec, Observation, SimConfig, SimEnv, TargetAction};
use aware_recommender::fallback::{Fallback, FallbackConfig};
use aware_shared_model::{
    Ddpg, EpisodeBundle, MetaDdpg, MetaLearner, ReplayBuffer, Transition, ACTION_DIM,
};
use cpu_time::ThreadTime;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use self::features::TlPlusFeatures;
use super::{fail, first, median, BenchError};
use aware_harness::train_meta::{
    self, bundle_of, fallback_action, keep_top, MetaObjective, TrainLog, TrainMetaOptions,
    STATE_DIM,
};

/// The arms, in report order.
pub const ARMS: [&str; 6] = [
    "aware",
    "tl",
    "tl_plus",
    "scratch",
    "fallback",
    "aware_shared",
];
/// The arms that learn (the converged reward is the best of them).
pub const LEARNING_ARMS: [&str; 5] = ["aware", "tl", "tl_plus", "scratch", "aware_shared"];

/// Minibatch of every gradient step.
const BATCH: usize = 64;
/// Replay capacity per agent (more than any budget's transitions).
const REPLAY_CAPACITY: usize = 100_000;

#[derive(Debug, Clone, clap::Args)]
pub struct AdaptBenchOptions {
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// An `aware train-meta` output (or the shipped `models/meta-default`); None: a short
    /// meta-training (`train`) into `<out>/adapt-meta` first.
    #[arg(
        long,
        help = "An `aware train-meta` output directory, or models/meta-default (default: a short meta-training first)"
    )]
    pub meta: Option<PathBuf>,
    /// Held-out apps.
    #[arg(long, default_value_t = AdaptBenchOptions::default().apps, help = "Held-out apps (generated from --seed, which must differ from the pool's)")]
    pub apps: usize,
    /// Generator and noise seed of the held-out apps (must differ from the pool's).
    #[arg(long, default_value_t = AdaptBenchOptions::default().seed)]
    pub seed: u64,
    /// Episode budget per app and arm.
    #[arg(long, default_value_t = AdaptBenchOptions::default().episodes)]
    pub episodes: usize,
    #[arg(long, default_value_t = AdaptBenchOptions::default().steps_per_episode)]
    pub steps_per_episode: usize,
    /// Gradient steps per transition (every learning arm).
    #[arg(long, default_value_t = AdaptBenchOptions::default().gradient_steps, hide = true)]
    pub gradient_steps: u32,
    /// `aware`: fallback episodes before the first embedding (counted in the budget). 1 by
    /// default, as in the services: the trainer embeds a target after its first recorded episode.
    #[arg(long, default_value_t = AdaptBenchOptions::default().fallback_episodes, hide = true, help = "AWARE: fallback episodes before the first embedding (counted in the budget; 1, as the trainer, which embeds a target after its first recorded episode)")]
    pub fallback_episodes: usize,
    /// `aware`: agent episodes between embedding refreshes.
    #[arg(long, default_value_t = AdaptBenchOptions::default().embedding_refresh, hide = true, help = "AWARE: recompute the embedding from the app's top-M episodes every this many episodes")]
    pub embedding_refresh: usize,
    /// Moving-average window (episodes).
    #[arg(skip = AdaptBenchOptions::default().window)]
    pub window: usize,
    /// Share of the converged reward to reach.
    #[arg(skip = AdaptBenchOptions::default().threshold)]
    pub threshold: f64,
    #[arg(skip = AdaptBenchOptions::default().hidden)]
    pub hidden: usize,
    /// Exploration σ of the TL source agents and of `scratch`.
    #[arg(skip = AdaptBenchOptions::default().exploration_sigma)]
    pub exploration_sigma: f32,
    /// Exploration σ of every arm that fine-tunes a pre-trained policy (`aware`, `tl`,
    /// `tl_plus`; the same for the three, so no arm gets an advantage the others lack).
    #[arg(long, default_value_t = AdaptBenchOptions::default().fine_tune_sigma, hide = true, help = "Exploration σ while fine-tuning a pre-trained policy: AWARE's meta-trained base-learner and TL's / TL+'s transferred agents alike (`aware train-meta`'s default; scratch and the TL sources explore with 0.2, Table 2)")]
    pub fine_tune_sigma: f32,
    /// Exploration σ of TL and TL+ only, when it should differ from `fine_tune_sigma` (None:
    /// the same). TL's transferred policy starts further from the app's optimum than AWARE's and
    /// may need more exploration: this lets each arm run at the σ it does best with.
    #[arg(
        long,
        hide = true,
        help = "TL's and TL+'s own fine-tuning σ (default: --fine-tune-sigma), to compare every arm at the σ it does best with"
    )]
    pub tl_fine_tune_sigma: Option<f32>,
    /// Critic warm-up of every arm that fine-tunes a pre-trained policy (`aware`, `tl`,
    /// `tl_plus`, the same for the three): the gradient steps of the first this many episodes'
    /// transitions train the critic only ([`Ddpg::train_critic_step`]), so the actor does not
    /// follow a critic that has not yet seen the new app's returns. 0: none. `scratch` has
    /// nothing to keep and never warms up.
    #[arg(long = "critic-warmup", default_value_t = AdaptBenchOptions::default().critic_warmup_episodes, hide = true, help = "Critic warm-up of AWARE, TL and TL+ alike: the gradient steps of the first this many episodes' transitions train the critic only (0: none)")]
    pub critic_warmup_episodes: usize,
    /// Index into the pool's training side of the TL source app (repetition r uses
    /// `source_index + r`).
    #[arg(long, default_value_t = AdaptBenchOptions::default().source_index, hide = true, help = "TL/TL+ source app: index into the meta-training pool's training side (repetition r uses the next r-th)")]
    pub source_index: usize,
    /// Repetitions: each with its own source app (the next one of the training side) and its
    /// own held-out apps (seed `seed + 1000·r`), as the paper's repeated A/B tests.
    #[arg(long, default_value_t = AdaptBenchOptions::default().repeats, help = "Repetitions, each with another source app and other held-out apps (seed + 1000·r); the TL source draw moves the speed-ups more than anything else, so the default averages over ten sources")]
    pub repeats: usize,
    #[arg(skip = AdaptBenchOptions::default().source_min_episodes)]
    pub source_min_episodes: u32,
    #[arg(long, default_value_t = AdaptBenchOptions::default().source_max_episodes, hide = true, help = "Most episodes the TL/TL+ source agents train (they stop earlier on a plateau)")]
    pub source_max_episodes: u32,
    /// Run the `scratch` arm.
    #[arg(long = "no-scratch", action = clap::ArgAction::SetFalse, help = "Skip the learning-from-scratch reference arm")]
    pub scratch: bool,
    /// Run the `aware_shared` arm: one base-learner shared by a repetition's apps, each
    /// conditioned on its own embedding ([`shared`]).
    #[arg(
        long,
        help = "Also run aware_shared: one base-learner per kind (a repetition's apps), trained on all of them and conditioned on each app's embedding"
    )]
    pub shared: bool,
    /// `aware_shared`: which apps share a network.
    #[arg(long, value_enum, default_value_t = shared::Kinds::All, hide = true, help = "aware_shared: the apps that share one network, all of a repetition's or those of one SLO class")]
    pub shared_kinds: shared::Kinds,
    /// The short meta-training used without `meta`.
    #[arg(skip = AdaptBenchOptions::default().train)]
    pub train: TrainMetaOptions,
}

impl AdaptBenchOptions {
    /// Critic-only gradient steps at the start of a pre-trained arm's fine-tuning.
    pub fn critic_warmup_updates(&self) -> u64 {
        (self.critic_warmup_episodes * self.steps_per_episode) as u64
            * u64::from(self.gradient_steps)
    }

    /// TL's and TL+'s fine-tuning σ: `tl_fine_tune_sigma`, else `fine_tune_sigma`.
    pub fn tl_sigma(&self) -> f32 {
        self.tl_fine_tune_sigma.unwrap_or(self.fine_tune_sigma)
    }
}

impl Default for AdaptBenchOptions {
    fn default() -> Self {
        AdaptBenchOptions {
            out: PathBuf::from("bench-out"),
            meta: None,
            apps: 10,
            seed: 1001,
            episodes: 100,
            steps_per_episode: 50,
            gradient_steps: 1,
            fallback_episodes: 1,
            embedding_refresh: 5,
            window: 10,
            threshold: 0.95,
            hidden: 64,
            exploration_sigma: 0.2,
            fine_tune_sigma: 0.05,
            tl_fine_tune_sigma: None,
            critic_warmup_episodes: 0,
            source_index: 0,
            repeats: 10,
            source_min_episodes: 150,
            source_max_episodes: 300,
            scratch: true,
            shared: false,
            shared_kinds: shared::Kinds::All,
            train: TrainMetaOptions {
                apps: 20,
                iterations: 60,
                progress_every: 0,
                // The paper's reward, which this benchmark measures in.
                objective: MetaObjective::Weighted,
                ..TrainMetaOptions::default()
            },
        }
    }
}

impl From<aware_loadgen::SimError> for BenchError {
    fn from(e: aware_loadgen::SimError) -> Self {
        fail(e)
    }
}

/// The noise/trace seed of episode `k` of the app with seed `app_seed` (the same in every arm).
pub(crate) fn episode_seed(app_seed: u64, k: u64) -> u64 {
    app_seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (k << 24) ^ 0xada7
}

/// Who drives an episode of a [`Learner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunEpisode {
    /// The agent explores and trains every step.
    Agent,
    /// `train_meta::fallback_action` drives; transitions are stored, not trained on yet.
    FallbackRule,
}

/// What one episode did.
#[derive(Debug, Clone, Default)]
pub(crate) struct EpisodeOut {
    /// Mean per-step reward.
    pub reward: f64,
    pub slo_violations: u64,
    pub cpu_util: f64,
    pub memory_util: f64,
    /// Thread CPU time of the agent's work.
    pub cpu_seconds: f64,
    /// `[state ‖ action ‖ reward]` rows (the meta-learner's bundle format).
    pub rows: Vec<f32>,
    pub last_state: Vec<f32>,
}

impl EpisodeOut {
    fn as_meta_episode(&self, fallback: bool) -> train_meta::Episode {
        train_meta::Episode {
            reward: self.reward,
            fallback,
            steps: self.rows.clone(),
            last_state: self.last_state.clone(),
            // Used for the bundle (the embedding reads the paper's reward), not trained on.
            constrained: Vec::new(),
        }
    }
}

/// One online-learning DDPG agent on one app: its replay buffer (states without the
/// embedding), TL+ features (when `extended`) and, for AWARE, the embedding appended to every
/// state it acts or trains on.
pub(crate) struct Learner {
    agent: Ddpg,
    replay: ReplayBuffer,
    extended: bool,
    embed_dim: usize,
    embedding: Option<Vec<f32>>,
    features: TlPlusFeatures,
    rng: ChaCha8Rng,
    gradient_steps: u32,
    updates: u64,
    /// The first this many gradient steps train the critic only.
    critic_warmup: u64,
}

impl Learner {
    pub(crate) fn new(
        mut agent: Ddpg,
        extended: bool,
        embed_dim: usize,
        gradient_steps: u32,
        seed: u64,
    ) -> Result<Self, BenchError> {
        let base = tl::state_dim(extended);
        if agent.config().state_dim != base + embed_dim {
            return Err(fail(format!(
                "agent state width {} is not {base} + {embed_dim}",
                agent.config().state_dim
            )));
        }
        agent.normalizer_mut().unfreeze();
        agent.reset_noise();
        Ok(Learner {
            agent,
            replay: ReplayBuffer::new(REPLAY_CAPACITY, base, seed ^ 0x4e91)?,
            extended,
            embed_dim,
            embedding: None,
            features: TlPlusFeatures::default(),
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5e7e),
            gradient_steps,
            updates: 0,
            critic_warmup: 0,
        })
    }

    /// The first `updates` gradient steps train the critic only.
    pub(crate) fn with_critic_warmup(mut self, updates: u64) -> Self {
        self.critic_warmup = updates;
        self
    }

    pub(crate) fn into_agent(self) -> Ddpg {
        self.agent
    }

    /// The state the agent stores: the simulator's, plus TL+'s features.
    fn base_state(&self, obs: &Observation) -> Vec<f32> {
        let mut s = obs.state.to_vec();
        if self.extended {
            s.extend_from_slice(&self.features.features(obs));
        }
        s
    }

    /// The agent's input: the base state, plus the embedding.
    fn input(&self, s: &[f32]) -> Result<Vec<f32>, BenchError> {
        if self.embed_dim == 0 {
            return Ok(s.to_vec());
        }
        let e = self
            .embedding
            .as_ref()
            .ok_or_else(|| fail("the agent needs an embedding before it acts"))?;
        Ok(s.iter().chain(e).copied().collect())
    }

    /// Sets the embedding; the first time, folds the stored states into the normalizer.
    fn set_embedding(&mut self, e: Vec<f32>) -> Result<(), BenchError> {
        if e.len() != self.embed_dim {
            return Err(fail(format!(
                "embedding of width {} for a policy expecting {}",
                e.len(),
                self.embed_dim
            )));
        }
        let first = self.embedding.is_none();
        self.embedding = Some(e);
        if first {
            for i in 0..self.replay.len() {
                if let Some(t) = self.replay.get(i) {
                    let x = self.input(&t.state)?;
                    self.agent.observe(&x)?;
                }
            }
            self.agent
                .normalizer_mut()
                .pin_identity(tl::state_dim(self.extended));
        }
        Ok(())
    }

    /// `n` gradient steps (none before a minibatch's worth of transitions, or without the
    /// embedding a policy needs).
    fn train(&mut self, n: usize) -> Result<(), BenchError> {
        if self.replay.len() < BATCH || (self.embed_dim > 0 && self.embedding.is_none()) {
            return Ok(());
        }
        for _ in 0..n {
            let b = self.replay.sample(BATCH)?;
            let b = match &self.embedding {
                Some(e) => b.with_suffix(e),
                None => b,
            };
            if self.updates < self.critic_warmup {
                self.agent.train_critic_step(&b)?;
            } else {
                self.agent.train_step(&b)?;
            }
            self.updates += 1;
        }
        Ok(())
    }

    /// Runs one episode of `steps` steps on a fresh simulator reset with `seed` (one warm-up
    /// step with the initial allocation first, as `train_meta::run_episode`).
    pub(crate) fn run_episode(
        &mut self,
        app: &AppSpec,
        steps: usize,
        seed: u64,
        mode: RunEpisode,
    ) -> Result<EpisodeOut, BenchError> {
        self.run_episode_with(app, steps, seed, mode, |l| {
            let n = l.gradient_steps as usize;
            l.train(n)
        })
    }

    /// [`Learner::run_episode`], with `train` making the gradient steps after each of the
    /// agent's transitions (the shared arm samples every app of its kind there).
    pub(crate) fn run_episode_with(
        &mut self,
        app: &AppSpec,
        steps: usize,
        seed: u64,
        mode: RunEpisode,
        mut train: impl FnMut(&mut Learner) -> Result<(), BenchError>,
    ) -> Result<EpisodeOut, BenchError> {
        let cfg = SimConfig {
            seed,
            ..SimConfig::default()
        };
        let map = cfg.action_map;
        let mut env = SimEnv::new(vec![app.clone()], cfg)?;
        env.reset(seed)?;
        let mut obs = first(env.step(&[TargetAction::Hold])?)?;
        let mut cpu = Duration::ZERO;
        let t = ThreadTime::now();
        self.features.reset_episode();
        if self.extended {
            self.features.observe(&obs);
        }
        let mut s = self.base_state(&obs);
        cpu += t.elapsed();
        let mut out = EpisodeOut {
            rows: Vec::with_capacity(steps * (STATE_DIM + ACTION_DIM + 1)),
            ..EpisodeOut::default()
        };
        let mut total = 0.0;
        for _ in 0..steps {
            let t = ThreadTime::now();
            let a = match mode {
                RunEpisode::Agent => {
                    let x = self.input(&s)?;
                    let a = self.agent.act_explore(&x, &mut self.rng)?;
                    if self.embed_dim > 0 {
                        self.agent
                            .normalizer_mut()
                            .pin_identity(tl::state_dim(self.extended));
                    }
                    a
                }
                RunEpisode::FallbackRule => fallback_action(&obs, &app.bounds, &map),
            };
            cpu += t.elapsed();
            let next = first(env.step(&[TargetAction::Raw(a)])?)?;
            let t = ThreadTime::now();
            if self.extended {
                self.features.observe(&next);
            }
            let s2 = self.base_state(&next);
            let r = next.reward;
            out.rows
                .extend_from_slice(&EpisodeBundle::step_vector(&obs.state, &a, r as f32));
            self.replay.push(Transition {
                state: std::mem::take(&mut s),
                action: a,
                reward: r as f32,
                next_state: s2.clone(),
                done: false,
            })?;
            if mode == RunEpisode::Agent {
                train(self)?;
            }
            cpu += t.elapsed();
            total += r;
            out.slo_violations += u64::from(next.metrics.slo_violation);
            out.cpu_util += next.metrics.cpu_util;
            out.memory_util += next.metrics.memory_util;
            obs = next;
            s = s2;
        }
        let n = steps.max(1) as f64;
        out.reward = total / n;
        out.cpu_util /= n;
        out.memory_util /= n;
        out.cpu_seconds = cpu.as_secs_f64();
        out.last_state = obs.state.to_vec();
        Ok(out)
    }
}

/// One arm on one app: per-episode figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ArmRun {
    pub episode_rewards: Vec<f64>,
    pub episode_slo_violations: Vec<u64>,
    pub episode_cpu_util: Vec<f64>,
    pub episode_memory_util: Vec<f64>,
    pub episode_cpu_seconds: Vec<f64>,
    /// First episode the learned policy drove (aware: the fallback episodes before).
    pub policy_from: usize,
    /// Whether the arm learns (fallback: no).
    pub learns: bool,
}

impl ArmRun {
    fn push(&mut self, e: &EpisodeOut) {
        self.episode_rewards.push(e.reward);
        self.episode_slo_violations.push(e.slo_violations);
        self.episode_cpu_util.push(e.cpu_util);
        self.episode_memory_util.push(e.memory_util);
        self.episode_cpu_seconds.push(e.cpu_seconds);
    }

    /// Mean of the last `window` episodes of `xs`.
    fn tail_mean(xs: &[f64], window: usize) -> f64 {
        let w = window.clamp(1, xs.len().max(1));
        xs.iter().rev().take(w).sum::<f64>() / w as f64
    }
}

/// The number of episodes (1-based count, from the first of the budget) until the moving
/// average of `rewards` over `window` episodes — partial windows at the start, only episodes from
/// `policy_from` on — first reaches `target`; None when it never does (censored).
pub fn episodes_to_target(
    rewards: &[f64],
    policy_from: usize,
    window: usize,
    target: f64,
) -> Option<usize> {
    let w = window.max(1);
    (policy_from..rewards.len()).find_map(|e| {
        let lo = policy_from.max((e + 1).saturating_sub(w));
        let xs = &rewards[lo..=e];
        let ma = xs.iter().sum::<f64>() / xs.len() as f64;
        (ma >= target).then_some(e + 1)
    })
}

/// How one arm adapted to one app.
#[derive(Debug, Clone, Serialize)]
pub struct Adaptation {
    pub arm: String,
    /// Episodes to the threshold (None: not within the budget).
    pub episodes_to_target: Option<usize>,
    /// `episodes_to_target`, or the budget when censored.
    pub episodes: usize,
    pub censored: bool,
    /// Thread CPU seconds of the agent's work over those episodes.
    pub cpu_seconds: f64,
    /// Over the whole budget.
    pub cpu_seconds_total: f64,
    pub slo_violations_adapting: u64,
    pub slo_violations_total: u64,
    /// Converged policy's CPU utilization − this arm's, over the adaptation episodes, in
    /// percentage points (positive: this arm used its CPU less).
    pub cpu_util_deficit_pp: f64,
    pub memory_util_deficit_pp: f64,
    /// Mean per-step reward over the budget.
    pub mean_reward: f64,
    /// First policy episode's reward.
    pub first_policy_reward: f64,
    /// The last window's mean, % of the converged reward.
    pub final_pct_of_converged: f64,
}

/// One app's result.
#[derive(Debug, Clone, Serialize)]
pub struct AppResult {
    pub app: String,
    /// The repetition the app belongs to (its TL source and generator seed).
    pub repeat: usize,
    /// The app's kind of SLO (None only for an app evaluated without its spec).
    pub slo_class: Option<SloClass>,
    /// The best learning arm's final-window mean per-step reward.
    pub converged_reward: f64,
    pub converged_arm: String,
    pub converged_cpu_util: f64,
    pub converged_memory_util: f64,
    pub target_reward: f64,
    pub adaptations: Vec<Adaptation>,
    /// Every arm's per-episode figures.
    pub runs: Vec<(String, ArmRun)>,
}

/// Evaluates every arm of one app against its converged reward (pure).
pub fn evaluate_app(
    app: &str,
    runs: Vec<(String, ArmRun)>,
    window: usize,
    threshold: f64,
) -> AppResult {
    let best = runs
        .iter()
        .filter(|(_, r)| r.learns && !r.episode_rewards.is_empty())
        .max_by(|a, b| {
            ArmRun::tail_mean(&a.1.episode_rewards, window)
                .total_cmp(&ArmRun::tail_mean(&b.1.episode_rewards, window))
        });
    let (conv_arm, conv, cu, mu) = best.map_or((String::new(), f64::NAN, 0.0, 0.0), |(n, r)| {
        (
            n.clone(),
            ArmRun::tail_mean(&r.episode_rewards, window),
            ArmRun::tail_mean(&r.episode_cpu_util, window),
            ArmRun::tail_mean(&r.episode_memory_util, window),
        )
    });
    let target = threshold * conv;
    let adaptations = runs
        .iter()
        .map(|(name, r)| {
            let n = r.episode_rewards.len();
            let hit = if r.learns {
                episodes_to_target(&r.episode_rewards, r.policy_from, window, target)
            } else {
                None
            };
            let k = hit.unwrap_or(n);
            let mean_of = |xs: &[f64]| xs[..k].iter().sum::<f64>() / k.max(1) as f64;
            Adaptation {
                arm: name.clone(),
                episodes_to_target: hit,
                episodes: k,
                censored: hit.is_none(),
                cpu_seconds: r.episode_cpu_seconds[..k].iter().sum(),
                cpu_seconds_total: r.episode_cpu_seconds.iter().sum(),
                slo_violations_adapting: r.episode_slo_violations[..k].iter().sum(),
                slo_violations_total: r.episode_slo_violations.iter().sum(),
                cpu_util_deficit_pp: 100.0 * (cu - mean_of(&r.episode_cpu_util)),
                memory_util_deficit_pp: 100.0 * (mu - mean_of(&r.episode_memory_util)),
                mean_reward: r.episode_rewards.iter().sum::<f64>() / n.max(1) as f64,
                first_policy_reward: r
                    .episode_rewards
                    .get(r.policy_from)
                    .copied()
                    .unwrap_or(f64::NAN),
                final_pct_of_converged: 100.0 * ArmRun::tail_mean(&r.episode_rewards, window)
                    / conv,
            }
        })
        .collect();
    AppResult {
        app: app.to_string(),
        repeat: 0,
        slo_class: None,
        converged_reward: conv,
        converged_arm: conv_arm,
        converged_cpu_util: cu,
        converged_memory_util: mu,
        target_reward: target,
        adaptations,
        runs,
    }
}

/// One arm over every app.
#[derive(Debug, Clone, Serialize)]
pub struct ArmSummary {
    pub arm: String,
    pub apps: usize,
    /// Apps where the threshold was reached within the budget.
    pub reached: usize,
    pub censored: usize,
    /// Episodes to the threshold (censored apps count as the budget).
    pub median_episodes: f64,
    pub mean_episodes: f64,
    pub median_cpu_seconds: f64,
    pub mean_cpu_seconds: f64,
    pub total_cpu_seconds: f64,
    pub slo_violations_adapting: u64,
    pub slo_violations_total: u64,
    pub steps_total: u64,
    pub mean_cpu_util_deficit_pp: f64,
    pub mean_memory_util_deficit_pp: f64,
    /// Mean per-step reward over every budget episode.
    pub mean_reward: f64,
    pub mean_final_pct_of_converged: f64,
    /// Apps where this arm set the converged reward.
    pub best_arm_on: usize,
    /// Mean per-step reward by episode (mean over apps).
    pub curve: Vec<f64>,
}

/// `other` against `aware`, per app ratios `other / aware`.
#[derive(Debug, Clone, Serialize)]
pub struct SpeedUp {
    pub vs: String,
    pub median_episodes_ratio: f64,
    pub mean_episodes_ratio: f64,
    /// median episodes of `other` / median episodes of `aware`.
    pub ratio_of_median_episodes: f64,
    /// mean episodes of `other` / mean episodes of `aware` (censored apps at the budget): the
    /// statistic most sensitive to each arm's slowest apps.
    pub ratio_of_mean_episodes: f64,
    pub median_cpu_ratio: f64,
    pub mean_cpu_ratio: f64,
    pub ratio_of_median_cpu: f64,
    pub ratio_of_mean_cpu: f64,
    /// `other`'s SLO violations / aware's, during adaptation and over the budget.
    pub slo_ratio_adapting: f64,
    pub slo_ratio_total: f64,
    /// Apps where `other` was censored (its ratio is a lower bound) and where `aware` was
    /// (an upper bound).
    pub other_censored: usize,
    pub aware_censored: usize,
    /// `ratio_of_mean_episodes` within each repetition (one TL source and its apps each): how
    /// much the headline figure moves with the source draw.
    pub per_repeat_ratio_of_mean_episodes: Vec<f64>,
    /// 95% interval of `ratio_of_mean_episodes` from a cluster bootstrap over the repetitions
    /// (whole repetitions resampled with replacement, [`BOOTSTRAP_RESAMPLES`] times, fixed
    /// seed; the source draw is the largest shared factor between an arm's apps). None with
    /// one repetition.
    pub ratio_of_mean_episodes_ci95: Option<[f64; 2]>,
}

/// Resamples of the cluster bootstrap behind [`SpeedUp::ratio_of_mean_episodes_ci95`].
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// Ratio of the mean episodes (`other` / `aware`) over `pairs`, by repetition (pure): per
/// repetition, and the 95% percentile interval of a cluster bootstrap that resamples whole
/// repetitions (None with fewer than two).
pub fn repeat_spread(pairs: &[(usize, f64, f64)]) -> (Vec<f64>, Option<[f64; 2]>) {
    let mut reps: Vec<usize> = pairs.iter().map(|p| p.0).collect();
    reps.sort_unstable();
    reps.dedup();
    // Per repetition: (Σ aware, Σ other).
    let sums: Vec<(f64, f64)> = reps
        .iter()
        .map(|&r| {
            pairs
                .iter()
                .filter(|p| p.0 == r)
                .fold((0.0, 0.0), |(a, o), p| (a + p.1, o + p.2))
        })
        .collect();
    let per: Vec<f64> = sums.iter().map(|&(a, o)| ratio(o, a)).collect();
    if sums.len() < 2 {
        return (per, None);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(0xb007_5747);
    let mut stats: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            let (mut a, mut o) = (0.0, 0.0);
            for _ in 0..sums.len() {
                let (sa, so) = sums[rng.random_range(0..sums.len())];
                a += sa;
                o += so;
            }
            ratio(o, a)
        })
        .filter(|x| x.is_finite())
        .collect();
    if stats.is_empty() {
        return (per, None);
    }
    stats.sort_by(f64::total_cmp);
    let at = |q: f64| stats[((stats.len() - 1) as f64 * q).round() as usize];
    (per, Some([at(0.025), at(0.975)]))
}

fn mean(xs: &[f64]) -> f64 {
    let v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// Per-arm summaries and AWARE's speed-ups (pure).
pub fn aggregate(
    results: &[AppResult],
    steps_per_episode: usize,
) -> (Vec<ArmSummary>, Vec<SpeedUp>) {
    let of = |arm: &str| -> Vec<(&AppResult, &Adaptation, &ArmRun)> {
        results
            .iter()
            .filter_map(|r| {
                let a = r.adaptations.iter().find(|a| a.arm == arm)?;
                let run = r.runs.iter().find(|(n, _)| n == arm).map(|(_, x)| x)?;
                Some((r, a, run))
            })
            .collect()
    };
    let mut arms = Vec::new();
    for arm in ARMS {
        let xs = of(arm);
        if xs.is_empty() {
            continue;
        }
        let eps: Vec<f64> = xs.iter().map(|(_, a, _)| a.episodes as f64).collect();
        let cpu: Vec<f64> = xs.iter().map(|(_, a, _)| a.cpu_seconds).collect();
        let n_ep = xs
            .iter()
            .map(|(_, _, r)| r.episode_rewards.len())
            .max()
            .unwrap_or(0);
        let mut curve = vec![0.0; n_ep];
        for (_, _, r) in &xs {
            for (c, v) in curve.iter_mut().zip(&r.episode_rewards) {
                *c += v / xs.len() as f64;
            }
        }
        let learns = xs.iter().any(|(_, _, r)| r.learns);
        arms.push(ArmSummary {
            arm: arm.to_string(),
            apps: xs.len(),
            reached: xs.iter().filter(|(_, a, _)| !a.censored).count(),
            censored: xs.iter().filter(|(_, a, _)| a.censored).count(),
            median_episodes: if learns { median(&eps) } else { f64::NAN },
            mean_episodes: if learns { mean(&eps) } else { f64::NAN },
            median_cpu_seconds: median(&cpu),
            mean_cpu_seconds: mean(&cpu),
            total_cpu_seconds: xs.iter().map(|(_, a, _)| a.cpu_seconds_total).sum(),
            slo_violations_adapting: xs.iter().map(|(_, a, _)| a.slo_violations_adapting).sum(),
            slo_violations_total: xs.iter().map(|(_, a, _)| a.slo_violations_total).sum(),
            steps_total: xs
                .iter()
                .map(|(_, _, r)| (r.episode_rewards.len() * steps_per_episode) as u64)
                .sum(),
            mean_cpu_util_deficit_pp: mean(
                &xs.iter()
                    .map(|(_, a, _)| a.cpu_util_deficit_pp)
                    .collect::<Vec<_>>(),
            ),
            mean_memory_util_deficit_pp: mean(
                &xs.iter()
                    .map(|(_, a, _)| a.memory_util_deficit_pp)
                    .collect::<Vec<_>>(),
            ),
            mean_reward: mean(&xs.iter().map(|(_, a, _)| a.mean_reward).collect::<Vec<_>>()),
            mean_final_pct_of_converged: mean(
                &xs.iter()
                    .map(|(_, a, _)| a.final_pct_of_converged)
                    .collect::<Vec<_>>(),
            ),
            best_arm_on: xs.iter().filter(|(r, _, _)| r.converged_arm == arm).count(),
            curve,
        });
    }
    let mut speed = Vec::new();
    for other in ["tl", "tl_plus", "scratch", "aware_shared"] {
        let with_repeat: Vec<(usize, &Adaptation, &Adaptation)> = results
            .iter()
            .filter_map(|r| {
                let a = r.adaptations.iter().find(|a| a.arm == "aware")?;
                let o = r.adaptations.iter().find(|a| a.arm == other)?;
                Some((r.repeat, a, o))
            })
            .collect();
        if with_repeat.is_empty() {
            continue;
        }
        let (per_repeat, ci) = repeat_spread(
            &with_repeat
                .iter()
                .map(|(r, a, o)| (*r, a.episodes as f64, o.episodes as f64))
                .collect::<Vec<_>>(),
        );
        let pairs: Vec<(&Adaptation, &Adaptation)> =
            with_repeat.iter().map(|(_, a, o)| (*a, *o)).collect();
        let er: Vec<f64> = pairs
            .iter()
            .map(|(a, o)| ratio(o.episodes as f64, a.episodes as f64))
            .collect();
        let cr: Vec<f64> = pairs
            .iter()
            .map(|(a, o)| ratio(o.cpu_seconds, a.cpu_seconds))
            .collect();
        let col = |f: &dyn Fn(&Adaptation) -> f64, first: bool| -> Vec<f64> {
            pairs
                .iter()
                .map(|(a, o)| if first { f(a) } else { f(o) })
                .collect()
        };
        let sum_u = |f: &dyn Fn(&Adaptation) -> u64, first: bool| -> f64 {
            pairs
                .iter()
                .map(|(a, o)| if first { f(a) } else { f(o) })
                .sum::<u64>() as f64
        };
        speed.push(SpeedUp {
            vs: other.to_string(),
            median_episodes_ratio: median(&er),
            mean_episodes_ratio: mean(&er),
            ratio_of_median_episodes: ratio(
                median(&col(&|x| x.episodes as f64, false)),
                median(&col(&|x| x.episodes as f64, true)),
            ),
            ratio_of_mean_episodes: ratio(
                mean(&col(&|x| x.episodes as f64, false)),
                mean(&col(&|x| x.episodes as f64, true)),
            ),
            median_cpu_ratio: median(&cr),
            mean_cpu_ratio: mean(&cr),
            ratio_of_mean_cpu: ratio(
                mean(&col(&|x| x.cpu_seconds, false)),
                mean(&col(&|x| x.cpu_seconds, true)),
            ),
            ratio_of_median_cpu: ratio(
                median(&col(&|x| x.cpu_seconds, false)),
                median(&col(&|x| x.cpu_seconds, true)),
            ),
            slo_ratio_adapting: ratio(
                sum_u(&|x| x.slo_violations_adapting, false),
                sum_u(&|x| x.slo_violations_adapting, true),
            ),
            slo_ratio_total: ratio(
                sum_u(&|x| x.slo_violations_total, false),
                sum_u(&|x| x.slo_violations_total, true),
            ),
            other_censored: pairs.iter().filter(|(_, o)| o.censored).count(),
            aware_censored: pairs.iter().filter(|(a, _)| a.censored).count(),
            per_repeat_ratio_of_mean_episodes: per_repeat,
            ratio_of_mean_episodes_ci95: ci,
        });
    }
    (arms, speed)
}

/// A TL source agent as reported.
#[derive(Debug, Clone, Serialize)]
pub struct SourceReport {
    pub arm: String,
    pub repeat: usize,
    pub app: String,
    pub state_dim: usize,
    pub episodes: u32,
    pub converged: bool,
    pub final_reward: f64,
    pub cpu_seconds: f64,
    pub curve: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MetaReport {
    pub source: String,
    pub pool_seed: u64,
    pub pool_apps: usize,
    pub iterations: u64,
    /// Wall-clock seconds of meta-training (from its log).
    pub train_seconds: f64,
    pub bundle_size: usize,
    pub embed_dim: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct AdaptReport {
    pub apps: usize,
    /// The apps that shared a network in `aware_shared` (None: the arm did not run).
    pub shared_kinds: Option<shared::Kinds>,
    pub seed: u64,
    pub repeats: usize,
    pub held_out: String,
    pub episodes: usize,
    pub steps_per_episode: usize,
    pub gradient_steps: u32,
    pub fallback_episodes: usize,
    pub embedding_refresh: usize,
    pub window: usize,
    pub threshold: f64,
    pub hidden: usize,
    pub exploration_sigma: f32,
    pub fine_tune_sigma: f32,
    /// TL's and TL+'s σ (`fine_tune_sigma` unless `--tl-fine-tune-sigma`).
    pub tl_fine_tune_sigma: f32,
    /// Critic-only episodes at the start of AWARE's, TL's and TL+'s fine-tuning.
    pub critic_warmup_episodes: usize,
    pub meta: MetaReport,
    pub sources: Vec<SourceReport>,
    pub arms: Vec<ArmSummary>,
    pub speed_ups: Vec<SpeedUp>,
    /// The same comparisons within each kind of SLO.
    pub by_slo_class: Vec<ClassSpeedUps>,
    pub per_app: Vec<AppResult>,
    pub wall_seconds: f64,
}

/// The speed-ups over the apps of one kind of SLO.
#[derive(Debug, Clone, Serialize)]
pub struct ClassSpeedUps {
    pub slo_class: SloClass,
    pub apps: usize,
    pub arms: Vec<ArmSummary>,
    pub speed_ups: Vec<SpeedUp>,
}

/// An app's kind of SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SloClass {
    /// A p99 objective, with or without a throughput one.
    Latency,
    /// A throughput objective only.
    Throughput,
    /// None.
    BestEffort,
}

impl SloClass {
    pub const ALL: [SloClass; 3] = [
        SloClass::Latency,
        SloClass::Throughput,
        SloClass::BestEffort,
    ];

    pub fn of(slo: &aware_loadgen::app::Slo) -> Self {
        match (slo.latency_p99_ms, slo.throughput_rps) {
            (Some(_), _) => SloClass::Latency,
            (None, Some(_)) => SloClass::Throughput,
            (None, None) => SloClass::BestEffort,
        }
    }
}

/// [`aggregate`] within each SLO class present, in [`SloClass::ALL`]'s order.
fn by_slo_class(results: &[AppResult], steps_per_episode: usize) -> Vec<ClassSpeedUps> {
    SloClass::ALL
        .into_iter()
        .filter_map(|class| {
            let rs: Vec<AppResult> = results
                .iter()
                .filter(|r| r.slo_class == Some(class))
                .cloned()
                .collect();
            if rs.is_empty() {
                return None;
            }
            let (arms, speed_ups) = aggregate(&rs, steps_per_episode);
            Some(ClassSpeedUps {
                slo_class: class,
                apps: rs.len(),
                arms,
                speed_ups,
            })
        })
        .collect()
}

/// What the bench reports of the meta-training it starts from.
struct MetaRun {
    options: TrainMetaOptions,
    iterations: u64,
    train_seconds: f64,
}

/// The meta-trained agent and what it was trained with: from `opts.meta` (its training log, or
/// a shipped default's manifest), or a short meta-training.
fn meta_agent(opts: &AdaptBenchOptions) -> Result<(MetaDdpg, MetaRun, String), BenchError> {
    let (dir, source) = match &opts.meta {
        Some(dir) => (dir.clone(), dir.display().to_string()),
        None => {
            let dir = opts.out.join("adapt-meta");
            let t = TrainMetaOptions {
                out: dir.clone(),
                steps_per_episode: opts.steps_per_episode,
                ..opts.train.clone()
            };
            tracing::info!(
                iterations = t.iterations,
                apps = t.apps,
                "short meta-training"
            );
            train_meta::run(&t)?;
            let s = format!(
                "short meta-training: {} apps, {} iterations ({})",
                t.apps,
                t.iterations,
                dir.display()
            );
            (dir, s)
        }
    };
    let agent = train_meta::load_agent(&dir)?;
    let log = dir.join("train-log.json");
    let run = if log.exists() || !dir.join("manifest.json").exists() {
        let log: TrainLog = train_meta::read_json(&log)?;
        MetaRun {
            iterations: log.iterations.len() as u64,
            train_seconds: log.train_seconds,
            options: log.options,
        }
    } else {
        // A shipped default (`models/meta-default`): its manifest has the options.
        let m: aware_harness::default_meta::Manifest =
            train_meta::read_json(&dir.join("manifest.json"))?;
        MetaRun {
            iterations: m.inputs.options.iterations,
            train_seconds: m.train_seconds,
            options: m.inputs.options,
        }
    };
    Ok((agent, run, source))
}

fn hpa_vpa_episode(app: &AppSpec, steps: usize, seed: u64) -> Result<EpisodeOut, BenchError> {
    let cfg = SimConfig {
        seed,
        ..SimConfig::default()
    };
    let mut env = SimEnv::new(vec![app.clone()], cfg)?;
    env.reset(seed)?;
    let mut obs = first(env.step(&[TargetAction::Hold])?)?;
    let target = Target::new(app.namespace.clone(), app.name.clone());
    let spec = aware_metrics_collector::simulator::target_specs(std::slice::from_ref(app));
    let bounds = spec.first().map(|s| s.bounds).unwrap_or_default();
    let mut fb = Fallback::new(FallbackConfig::default()).map_err(fail)?;
    let mut out = EpisodeOut::default();
    let mut cpu = Duration::ZERO;
    let mut total = 0.0;
    for k in 0..steps {
        let t = ThreadTime::now();
        let o = aware_metrics_collector::simulator::to_obs(
            &obs,
            &target,
            k as u64,
            u32::try_from(steps).unwrap_or(u32::MAX),
            0,
            false,
            None,
        );
        let current = aware_recommender::current_allocation(&o);
        let r = fb.recommend(obs.metrics.time_s, &o.metrics, current, &bounds);
        cpu += t.elapsed();
        let next = first(env.step(&[TargetAction::Desired(aware_loadgen::Allocation {
            replicas: r.desired.replicas,
            cpu_millicores: r.desired.cpu_millicores,
            memory_bytes: r.desired.memory_bytes,
        })])?)?;
        total += next.reward;
        out.slo_violations += u64::from(next.metrics.slo_violation);
        out.cpu_util += next.metrics.cpu_util;
        out.memory_util += next.metrics.memory_util;
        obs = next;
    }
    let n = steps.max(1) as f64;
    out.reward = total / n;
    out.cpu_util /= n;
    out.memory_util /= n;
    out.cpu_seconds = cpu.as_secs_f64();
    Ok(out)
}

/// A learning arm that starts from `agent` and learns for the whole budget.
fn run_learner(
    opts: &AdaptBenchOptions,
    app: &AppSpec,
    app_seed: u64,
    agent: Ddpg,
    extended: bool,
    critic_warmup: u64,
) -> Result<ArmRun, BenchError> {
    let mut l = Learner::new(agent, extended, 0, opts.gradient_steps, app_seed)?
        .with_critic_warmup(critic_warmup);
    let mut run = ArmRun {
        learns: true,
        ..ArmRun::default()
    };
    for k in 0..opts.episodes {
        let ep = l.run_episode(
            app,
            opts.steps_per_episode,
            episode_seed(app_seed, k as u64),
            RunEpisode::Agent,
        )?;
        run.push(&ep);
    }
    Ok(run)
}

/// The `aware` arm: fallback episodes, the embedding of their top-M, then the meta-trained
/// base-learner fine-tuned online (embedding refreshed every `embedding_refresh` episodes).
fn run_aware(
    opts: &AdaptBenchOptions,
    app: &AppSpec,
    app_seed: u64,
    base: Ddpg,
    learner: &MetaLearner,
) -> Result<ArmRun, BenchError> {
    let m = learner.config().bundle_size;
    let embed_dim = learner.config().embed_dim;
    let mut l = Learner::new(base, false, embed_dim, opts.gradient_steps, app_seed)?
        .with_critic_warmup(opts.critic_warmup_updates());
    let mut store: Vec<train_meta::Episode> = Vec::new();
    let mut run = ArmRun {
        learns: true,
        policy_from: opts.fallback_episodes,
        ..ArmRun::default()
    };
    let mut fallback_transitions = 0usize;
    for k in 0..opts.episodes {
        let seed = episode_seed(app_seed, k as u64);
        if k < opts.fallback_episodes {
            let ep = l.run_episode(app, opts.steps_per_episode, seed, RunEpisode::FallbackRule)?;
            fallback_transitions += opts.steps_per_episode;
            keep_top(&mut store, ep.as_meta_episode(true), m);
            run.push(&ep);
            continue;
        }
        let agent_k = k - opts.fallback_episodes;
        let t = ThreadTime::now();
        if agent_k.is_multiple_of(opts.embedding_refresh.max(1)) {
            let e = learner.embed(&bundle_of(&store, m)?)?;
            l.set_embedding(e)?;
            if agent_k == 0 {
                // The fallback transitions' gradient steps, now that the policy has its input.
                l.train(fallback_transitions * opts.gradient_steps as usize)?;
            }
        }
        let extra = t.elapsed().as_secs_f64();
        let mut ep = l.run_episode(app, opts.steps_per_episode, seed, RunEpisode::Agent)?;
        ep.cpu_seconds += extra;
        keep_top(&mut store, ep.as_meta_episode(false), m);
        run.push(&ep);
    }
    Ok(run)
}

/// The agents every learning arm starts one app from. The three that fine-tune a pre-trained
/// policy (AWARE's meta-trained base-learner, TL's and TL+'s transferred agents) explore with
/// the same `fine_tune_sigma`; scratch with `exploration_sigma`.
struct StartingAgents {
    aware: Ddpg,
    meta_learner: MetaLearner,
    tl: Ddpg,
    tl_plus: Ddpg,
    scratch: Option<Ddpg>,
}

impl StartingAgents {
    fn new(
        opts: &AdaptBenchOptions,
        meta: &MetaDdpg,
        tl_src: &tl::SourceAgent,
        tlp_src: &tl::SourceAgent,
        app_seed: u64,
    ) -> Result<Self, BenchError> {
        let (mut aware, meta_learner): (Ddpg, MetaLearner) = meta.clone().into_parts();
        aware.set_exploration_sigma(opts.fine_tune_sigma)?;
        let tl_sigma = opts.tl_sigma();
        let transfer = |src: &tl::SourceAgent| -> Result<Ddpg, BenchError> {
            let mut a = tl::transfer(&src.agent)?;
            a.set_exploration_sigma(tl_sigma)?;
            Ok(a)
        };
        let scratch = if opts.scratch {
            Some(tl::new_agent(
                false,
                opts.hidden,
                opts.exploration_sigma,
                app_seed ^ 0x5c7a,
            )?)
        } else {
            None
        };
        Ok(StartingAgents {
            aware,
            meta_learner,
            tl: transfer(tl_src)?,
            tl_plus: transfer(tlp_src)?,
            scratch,
        })
    }
}

/// Every arm on one held-out app, seeded with `app_seed` ([`app_seed`]).
fn run_app(
    opts: &AdaptBenchOptions,
    app: &AppSpec,
    app_seed: u64,
    meta: &MetaDdpg,
    tl_src: &tl::SourceAgent,
    tlp_src: &tl::SourceAgent,
    shared: Option<ArmRun>,
) -> Result<AppResult, BenchError> {
    let s = StartingAgents::new(opts, meta, tl_src, tlp_src, app_seed)?;
    let mut runs = vec![(
        "aware".to_string(),
        run_aware(opts, app, app_seed, s.aware, &s.meta_learner)?,
    )];
    let warmup = opts.critic_warmup_updates();
    runs.push((
        "tl".into(),
        run_learner(opts, app, app_seed, s.tl, false, warmup)?,
    ));
    runs.push((
        "tl_plus".into(),
        run_learner(opts, app, app_seed, s.tl_plus, true, warmup)?,
    ));
    if let Some(fresh) = s.scratch {
        runs.push((
            "scratch".into(),
            run_learner(opts, app, app_seed, fresh, false, 0)?,
        ));
    }
    let mut fb = ArmRun::default();
    for k in 0..opts.episodes {
        fb.push(&hpa_vpa_episode(
            app,
            opts.steps_per_episode,
            episode_seed(app_seed, k as u64),
        )?);
    }
    runs.push(("fallback".into(), fb));
    if let Some(run) = shared {
        runs.push(("aware_shared".into(), run));
    }
    Ok(evaluate_app(&app.name, runs, opts.window, opts.threshold))
}

/// The seed of app `i` of those generated from `held_seed`: its learners, exploration and
/// episodes, the same in every arm.
pub(crate) fn app_seed(held_seed: u64, i: usize) -> u64 {
    held_seed.wrapping_mul(1_000_003).wrapping_add(i as u64)
}

/// The held-out generator seed of repetition `rep`.
pub fn repeat_seed(seed: u64, rep: usize) -> u64 {
    seed.wrapping_add(1000 * rep as u64)
}

/// Runs the bench; writes `adapt.json` and `adapt-curve.svg` into `opts.out`.
pub fn run(opts: &AdaptBenchOptions) -> Result<AdaptReport, BenchError> {
    let started = std::time::Instant::now();
    if opts.fallback_episodes == 0 || opts.fallback_episodes >= opts.episodes {
        return Err(fail(
            "need 1 ≤ fallback episodes < episodes (the first embedding needs episodes of the app)",
        ));
    }
    if opts.apps == 0 || opts.steps_per_episode < 2 {
        return Err(fail("need ≥ 1 app and ≥ 2 steps per episode"));
    }
    let (meta, log, meta_source) = meta_agent(opts)?;
    let (pool, split) = train_meta::pool(&log.options);
    if split.train.is_empty() {
        return Err(fail("the meta-training split has no training app"));
    }
    let mut sources = Vec::new();
    let mut results = Vec::new();
    for rep in 0..opts.repeats.max(1) {
        let held_seed = repeat_seed(opts.seed, rep);
        if held_seed == log.options.seed {
            return Err(fail(format!(
                "held-out seed {held_seed} is the meta-training pool's seed: pick another (≥ 1000)"
            )));
        }
        let source_name = &split.train[(opts.source_index + rep) % split.train.len()];
        let source_app = pool
            .iter()
            .find(|a| &a.name == source_name)
            .ok_or_else(|| fail(format!("source app {source_name} not in the pool")))?;
        let source_opts = tl::SourceOptions {
            hidden: opts.hidden,
            exploration_sigma: opts.exploration_sigma,
            gradient_steps: opts.gradient_steps,
            steps_per_episode: opts.steps_per_episode,
            min_episodes: opts.source_min_episodes,
            max_episodes: opts.source_max_episodes,
            window: opts.window,
            patience: 30,
            tolerance: 0.01,
            seed: log
                .options
                .seed
                .wrapping_mul(31)
                .wrapping_add(0x7104 + rep as u64),
        };
        let tl_src = tl::train_source(source_app, false, &source_opts)?;
        let tlp_src = tl::train_source(source_app, true, &source_opts)?;
        for (arm, s) in [("tl", &tl_src), ("tl_plus", &tlp_src)] {
            sources.push(SourceReport {
                arm: arm.to_string(),
                repeat: rep,
                app: s.app.clone(),
                state_dim: s.agent.config().state_dim,
                episodes: s.episodes,
                converged: s.converged,
                final_reward: s.final_reward,
                cpu_seconds: s.cpu_seconds,
                curve: s.curve.clone(),
            });
        }
        let apps = generate_apps(opts.apps, held_seed, &GeneratorOptions::default());
        let mut shared = if opts.shared {
            let s = shared::run_kinds(opts, &apps, held_seed, &meta)?;
            tracing::info!(
                repeat = rep,
                updates = s.updates,
                rows_drawn_per_app = ?s.rows_drawn,
                wall_s = started.elapsed().as_secs_f64(),
                "shared arm done"
            );
            s.runs.into_iter().map(Some).collect()
        } else {
            vec![None; apps.len()]
        };
        for (i, app) in apps.iter().enumerate() {
            let r = run_app(
                opts,
                app,
                app_seed(held_seed, i),
                &meta,
                &tl_src,
                &tlp_src,
                shared.get_mut(i).and_then(Option::take),
            )?;
            let r = AppResult {
                app: format!("r{rep}/{}", app.name),
                repeat: rep,
                slo_class: Some(SloClass::of(&app.slo)),
                ..r
            };
            let eps = |arm: &str| {
                r.adaptations
                    .iter()
                    .find(|a| a.arm == arm)
                    .map_or("-".to_string(), |a| {
                        format!("{}{}", a.episodes, if a.censored { "+" } else { "" })
                    })
            };
            tracing::info!(
                app = %r.app,
                done = i + 1,
                of = apps.len(),
                converged = r.converged_reward,
                best = %r.converged_arm,
                aware = %eps("aware"),
                tl = %eps("tl"),
                tl_plus = %eps("tl_plus"),
                scratch = %eps("scratch"),
                aware_shared = %eps("aware_shared"),
                wall_s = started.elapsed().as_secs_f64(),
                "app done"
            );
            results.push(r);
        }
    }
    let (arms, speed_ups) = aggregate(&results, opts.steps_per_episode);
    let by_slo_class = by_slo_class(&results, opts.steps_per_episode);
    let cfg = meta.meta().config();
    let report = AdaptReport {
        apps: results.len(),
        shared_kinds: opts.shared.then_some(opts.shared_kinds),
        seed: opts.seed,
        repeats: opts.repeats.max(1),
        held_out: format!(
            "per repetition r: generate_apps({}, {} + 1000·r), generator seeds other than the meta-training pool's ({}): apps never seen in meta-training or by the TL source agents",
            opts.apps, opts.seed, log.options.seed
        ),
        episodes: opts.episodes,
        steps_per_episode: opts.steps_per_episode,
        gradient_steps: opts.gradient_steps,
        fallback_episodes: opts.fallback_episodes,
        embedding_refresh: opts.embedding_refresh,
        window: opts.window,
        threshold: opts.threshold,
        hidden: opts.hidden,
        exploration_sigma: opts.exploration_sigma,
        fine_tune_sigma: opts.fine_tune_sigma,
        tl_fine_tune_sigma: opts.tl_sigma(),
        critic_warmup_episodes: opts.critic_warmup_episodes,
        meta: MetaReport {
            source: meta_source,
            pool_seed: log.options.seed,
            pool_apps: log.options.apps,
            iterations: log.iterations,
            train_seconds: log.train_seconds,
            bundle_size: cfg.bundle_size,
            embed_dim: cfg.embed_dim,
        },
        sources,
        arms,
        speed_ups,
        by_slo_class,
        per_app: results,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    let target = mean(
        &report
            .per_app
            .iter()
            .map(|r| r.target_reward)
            .collect::<Vec<_>>(),
    );
    let svg = curve_svg(&report.arms, target, opts.fallback_episodes);
    let path = opts.out.join("adapt-curve.svg");
    std::fs::create_dir_all(&opts.out)
        .and_then(|()| std::fs::write(&path, svg))
        .map_err(|source| BenchError::Io {
            path: path.display().to_string(),
            source,
        })?;
    Ok(report)
}

/// The learning curves (mean over apps of the per-step reward by episode) as SVG, with the mean
/// 95% target dashed and AWARE's first policy episode marked.
pub fn curve_svg(arms: &[ArmSummary], target: f64, policy_from: usize) -> String {
    use aware_harness::chart::{line_chart, Chart, Series};
    line_chart(&Chart {
        series: arms
            .iter()
            .map(|a| Series {
                name: a.arm.as_str(),
                offset: 0,
                values: &a.curve,
            })
            .collect(),
        vlines: vec![policy_from],
        vline_dash: "2,3",
        hlines: vec![(target, "95% of converged (mean)".into())],
        x_label: "episode on the new app (dotted: AWARE's first policy episode)",
        y_label: "reward per step (mean over apps)",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_shared_model::{DdpgConfig, MetaConfig};

    #[test]
    fn episodes_to_target_counts_from_the_budget_start_and_censors() {
        let r = [0.5, 0.6, 0.9, 1.0, 1.0, 1.0];
        // Partial windows: the average of episodes 1..=3 is 0.667, of 2..=4 (window 3) 0.833.
        assert_eq!(episodes_to_target(&r, 0, 3, 0.8), Some(4));
        assert_eq!(episodes_to_target(&r, 0, 1, 0.9), Some(3));
        // Only policy episodes can reach it, but the fallback episodes before are counted.
        let f = [1.5, 1.5, 0.2, 0.9, 1.0];
        assert_eq!(episodes_to_target(&f, 0, 10, 0.95), Some(1));
        assert_eq!(episodes_to_target(&f, 2, 10, 0.95), None);
        assert_eq!(episodes_to_target(&f, 2, 1, 0.95), Some(5));
        assert_eq!(episodes_to_target(&f, 2, 2, 0.95), Some(5));
        assert_eq!(episodes_to_target(&f, 2, 2, 0.96), None);
        // Never reached: censored.
        assert_eq!(episodes_to_target(&r, 0, 10, 1.01), None);
        assert_eq!(episodes_to_target(&[], 0, 10, 0.0), None);
    }

    fn run_of(rewards: &[f64], policy_from: usize, learns: bool) -> ArmRun {
        ArmRun {
            episode_rewards: rewards.to_vec(),
            episode_slo_violations: rewards.iter().map(|r| u64::from(*r < 1.0)).collect(),
            episode_cpu_util: rewards.iter().map(|r| r / 2.0).collect(),
            episode_memory_util: rewards.iter().map(|r| r / 4.0).collect(),
            episode_cpu_seconds: vec![0.5; rewards.len()],
            policy_from,
            learns,
        }
    }

    #[test]
    fn speed_ups_split_by_slo_class_match_aggregates_over_each_class() {
        use aware_loadgen::app::Slo;
        assert_eq!(
            SloClass::of(&Slo {
                latency_p99_ms: Some(100.0),
                throughput_rps: Some(5.0),
                objective: None,
            }),
            SloClass::Latency
        );
        assert_eq!(
            SloClass::of(&Slo {
                latency_p99_ms: None,
                throughput_rps: Some(5.0),
                objective: None,
            }),
            SloClass::Throughput
        );
        assert_eq!(SloClass::of(&Slo::default()), SloClass::BestEffort);
        assert_eq!(
            serde_json::to_string(&SloClass::BestEffort).unwrap(),
            "\"best_effort\""
        );
        let app = |name: &str, class: SloClass, slow: &[f64]| AppResult {
            slo_class: Some(class),
            ..evaluate_app(
                name,
                vec![
                    ("aware".into(), run_of(&[2.0; 6], 0, true)),
                    ("tl".into(), run_of(slow, 0, true)),
                ],
                1,
                0.95,
            )
        };
        let results = vec![
            app("a", SloClass::Latency, &[0.5, 0.5, 0.5, 2.0, 2.0, 2.0]),
            app("b", SloClass::BestEffort, &[0.5, 2.0, 2.0, 2.0, 2.0, 2.0]),
            app("c", SloClass::Latency, &[0.5, 0.5, 2.0, 2.0, 2.0, 2.0]),
        ];
        let classes = by_slo_class(&results, 50);
        let names: Vec<(SloClass, usize)> = classes.iter().map(|c| (c.slo_class, c.apps)).collect();
        assert_eq!(names, [(SloClass::Latency, 2), (SloClass::BestEffort, 1)]);
        let ratio = |c: &ClassSpeedUps| c.speed_ups[0].ratio_of_mean_episodes;
        // latency: TL needs 4 and 3 episodes against AWARE's 1 and 1; best effort 2 against 1
        assert!((ratio(&classes[0]) - 3.5).abs() < 1e-12, "{:?}", classes[0]);
        assert!((ratio(&classes[1]) - 2.0).abs() < 1e-12, "{:?}", classes[1]);
        let (_, all) = aggregate(&results, 50);
        assert!((all[0].ratio_of_mean_episodes - 3.0).abs() < 1e-12);
    }

    #[test]
    fn evaluation_and_aggregate_relate_arms_to_the_converged_reward() {
        let app = |fast: &[f64], slow: &[f64]| {
            evaluate_app(
                "a",
                vec![
                    ("aware".into(), run_of(fast, 1, true)),
                    ("tl".into(), run_of(slow, 0, true)),
                    ("fallback".into(), run_of(&[2.0; 6], 0, false)),
                ],
                2,
                0.95,
            )
        };
        let a = app(
            &[0.5, 1.0, 2.0, 2.0, 2.0, 2.0],
            &[0.5, 0.5, 0.5, 0.5, 1.0, 2.0],
        );
        assert_eq!(a.converged_arm, "aware");
        assert!((a.converged_reward - 2.0).abs() < 1e-12);
        assert!((a.target_reward - 1.9).abs() < 1e-12);
        let get =
            |r: &AppResult, n: &str| r.adaptations.iter().find(|x| x.arm == n).unwrap().clone();
        let aw = get(&a, "aware");
        // Episodes 2..=3 average 1.5, 3..=4 average 2.0 → episode 4.
        assert_eq!(
            (aw.episodes_to_target, aw.episodes, aw.censored),
            (Some(4), 4, false)
        );
        assert!((aw.cpu_seconds - 2.0).abs() < 1e-12 && (aw.cpu_seconds_total - 3.0).abs() < 1e-12);
        assert_eq!(
            (aw.slo_violations_adapting, aw.slo_violations_total),
            (1, 1)
        );
        // Converged cpu util 1.0; adaptation mean (0.25 + 0.5 + 1 + 1) / 4 = 0.6875.
        assert!((aw.cpu_util_deficit_pp - 31.25).abs() < 1e-9);
        let tl = get(&a, "tl");
        assert_eq!(
            (tl.episodes_to_target, tl.episodes, tl.censored),
            (None, 6, true)
        );
        assert_eq!(tl.slo_violations_adapting, 4);
        let fb = get(&a, "fallback");
        assert!(fb.censored, "the fallback does not learn");
        let b = app(
            &[0.5, 2.0, 2.0, 2.0, 2.0, 2.0],
            &[2.0, 2.0, 2.0, 2.0, 2.0, 2.0],
        );
        // Episode 2 alone (the first policy episode) averages 2.0.
        assert_eq!(get(&b, "aware").episodes, 2);
        assert_eq!(get(&b, "tl").episodes, 1);
        let (arms, speed) = aggregate(&[a, b], 10);
        let aw = arms.iter().find(|s| s.arm == "aware").unwrap();
        assert_eq!((aw.apps, aw.reached, aw.censored), (2, 2, 0));
        assert!((aw.median_episodes - 3.0).abs() < 1e-12);
        assert_eq!(aw.steps_total, 120);
        assert_eq!(aw.curve.len(), 6);
        assert!((aw.curve[1] - 1.5).abs() < 1e-12);
        let tls = arms.iter().find(|s| s.arm == "tl").unwrap();
        assert_eq!((tls.reached, tls.censored), (1, 1));
        assert!(arms
            .iter()
            .find(|s| s.arm == "fallback")
            .unwrap()
            .median_episodes
            .is_nan());
        let s = speed.iter().find(|s| s.vs == "tl").unwrap();
        // Ratios tl/aware: 6/4 = 1.5 and 1/2.
        assert!((s.mean_episodes_ratio - 1.0).abs() < 1e-12);
        assert!((s.ratio_of_median_episodes - 3.5 / 3.0).abs() < 1e-12);
        assert!((s.ratio_of_mean_episodes - 3.5 / 3.0).abs() < 1e-12);
        assert!(s.ratio_of_mean_cpu.is_finite() && s.ratio_of_mean_cpu > 0.0);
        assert_eq!((s.other_censored, s.aware_censored), (1, 0));
        assert!(speed.iter().all(|s| s.vs != "tl_plus"));
        // Both apps in repetition 0: one repetition, no interval.
        assert_eq!(s.per_repeat_ratio_of_mean_episodes.len(), 1);
        assert!((s.per_repeat_ratio_of_mean_episodes[0] - 7.0 / 6.0).abs() < 1e-12);
        assert_eq!(s.ratio_of_mean_episodes_ci95, None);
    }

    #[test]
    fn repeat_spread_gives_each_repetition_and_a_bootstrap_interval_over_them() {
        // (repeat, aware episodes, other episodes): repetition 0 ×10, 1 ×2, 2 ×4.
        let pairs = [
            (0, 2.0, 20.0),
            (0, 4.0, 40.0),
            (1, 5.0, 10.0),
            (2, 3.0, 12.0),
            (2, 1.0, 4.0),
        ];
        let (per, ci) = repeat_spread(&pairs);
        assert_eq!(per.len(), 3);
        for (p, want) in per.iter().zip([10.0, 2.0, 4.0]) {
            assert!((p - want).abs() < 1e-12, "{per:?}");
        }
        // With three repetitions, all-repetition-1 and all-repetition-0 resamples each have
        // probability 1/27 > 2.5%: the interval spans the extremes.
        assert_eq!(ci, Some([2.0, 10.0]));
        // Eight repetitions (ratios 2..=9, 10 aware episodes each): strictly inside the extremes,
        // around the pooled ratio 5.5.
        let many: Vec<(usize, f64, f64)> =
            (0..8).map(|r| (r, 10.0, 10.0 * (r + 2) as f64)).collect();
        let [lo, hi] = repeat_spread(&many).1.expect("eight repetitions");
        assert!(2.0 < lo && lo < 5.5 && 5.5 < hi && hi < 9.0, "{lo} {hi}");
        // Fixed seed: the same interval every time.
        assert_eq!(repeat_spread(&pairs).1, ci);
        // One repetition: its ratio, no interval.
        let (per, ci) = repeat_spread(&pairs[..2]);
        assert_eq!((per, ci), (vec![10.0], None));
    }

    #[test]
    fn pretrained_arms_fine_tune_with_the_same_sigma_unless_tl_has_its_own_and_scratch_explores_more(
    ) {
        let src = |extended: bool| tl::SourceAgent {
            agent: tl::new_agent(extended, 8, 0.2, 3).unwrap(),
            app: "src".into(),
            extended,
            episodes: 0,
            converged: false,
            curve: Vec::new(),
            final_reward: 0.0,
            cpu_seconds: 0.0,
        };
        let mut base = DdpgConfig::with_hidden(STATE_DIM, &[8, 8]);
        base.noise.sigma = 0.3;
        let meta = MetaDdpg::new(
            base,
            MetaConfig {
                state_dim: STATE_DIM,
                ..aware_harness::train_meta::tiny_meta()
            },
        )
        .unwrap();
        let opts = AdaptBenchOptions {
            fine_tune_sigma: 0.07,
            exploration_sigma: 0.2,
            hidden: 8,
            ..AdaptBenchOptions::default()
        };
        let s = StartingAgents::new(&opts, &meta, &src(false), &src(true), 5).unwrap();
        for (arm, a) in [("aware", &s.aware), ("tl", &s.tl), ("tl_plus", &s.tl_plus)] {
            assert_eq!(a.config().noise.sigma, 0.07, "{arm}");
        }
        assert_eq!(s.aware.config().state_dim, STATE_DIM + 4);
        assert_eq!(s.tl_plus.config().state_dim, tl::state_dim(true));
        assert_eq!(s.scratch.unwrap().config().noise.sigma, 0.2);
        let none = StartingAgents::new(
            &AdaptBenchOptions {
                scratch: false,
                ..opts.clone()
            },
            &meta,
            &src(false),
            &src(true),
            5,
        )
        .unwrap();
        assert!(none.scratch.is_none());
        let own = StartingAgents::new(
            &AdaptBenchOptions {
                tl_fine_tune_sigma: Some(0.11),
                ..opts.clone()
            },
            &meta,
            &src(false),
            &src(true),
            5,
        )
        .unwrap();
        assert_eq!(own.aware.config().noise.sigma, 0.07);
        assert_eq!(own.tl.config().noise.sigma, 0.11);
        assert_eq!(own.tl_plus.config().noise.sigma, 0.11);
        let bad_tl = AdaptBenchOptions {
            tl_fine_tune_sigma: Some(-1.0),
            ..opts.clone()
        };
        assert!(StartingAgents::new(&bad_tl, &meta, &src(false), &src(true), 5).is_err());
        let bad = AdaptBenchOptions {
            fine_tune_sigma: f32::NAN,
            ..opts
        };
        assert!(StartingAgents::new(&bad, &meta, &src(false), &src(true), 5).is_err());
    }

    #[test]
    fn critic_warm_up_keeps_the_actor_for_its_gradient_steps_then_fine_tunes_it() {
        let app = generate_apps(1, 1001, &GeneratorOptions::default()).remove(0);
        let agent = tl::new_agent(false, 16, 0.05, 3).unwrap();
        let probe = vec![0.3; STATE_DIM];
        let before = agent.act(&probe).unwrap();
        // Two 50-step episodes: training starts at the 64th transition, 37 updates, all within
        // the 50 of the warm-up.
        let mut l = Learner::new(agent, false, 0, 1, 9)
            .unwrap()
            .with_critic_warmup(50);
        // A frozen normalizer: the probe's action changes only with the actor's weights.
        l.agent.normalizer_mut().freeze();
        for k in 0..2 {
            l.run_episode(&app, 50, k, RunEpisode::Agent).unwrap();
        }
        assert_eq!(l.updates, 37);
        assert_eq!(
            l.agent.act(&probe).unwrap(),
            before,
            "the actor is untouched"
        );
        // The third episode passes the warm-up: the actor moves.
        l.run_episode(&app, 50, 2, RunEpisode::Agent).unwrap();
        assert_eq!(l.updates, 87);
        assert_ne!(l.agent.act(&probe).unwrap(), before);
        // Options: warm-up episodes × steps × gradient steps; scratch never warms up.
        let opts = AdaptBenchOptions {
            critic_warmup_episodes: 2,
            gradient_steps: 3,
            ..AdaptBenchOptions::default()
        };
        assert_eq!(opts.critic_warmup_updates(), 300);
        assert_eq!(AdaptBenchOptions::default().critic_warmup_updates(), 0);
    }

    /// The shipped default has no training log: its manifest gives the options the report and
    /// the held-out check need.
    #[test]
    fn the_shipped_default_meta_learner_is_read_through_its_manifest() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/meta-default");
        let opts = AdaptBenchOptions {
            meta: Some(dir.clone()),
            ..AdaptBenchOptions::default()
        };
        let (agent, run, source) = meta_agent(&opts).unwrap();
        assert_eq!(source, dir.display().to_string());
        assert_eq!((run.options.apps, run.options.seed), (100, 0));
        assert_eq!(run.iterations, 300);
        assert!(run.train_seconds > 0.0);
        assert_eq!(agent.meta().config().embed_dim, 64);
        // Neither a log nor a manifest: the log's absence is the error.
        let empty = std::env::temp_dir().join(format!("aware-adapt-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        for f in ["base.ckpt", "meta.ckpt"] {
            std::fs::copy(dir.join(f), empty.join(f)).unwrap();
        }
        let err = meta_agent(&AdaptBenchOptions {
            meta: Some(empty.clone()),
            ..AdaptBenchOptions::default()
        })
        .err()
        .unwrap();
        assert!(err.to_string().contains("train-log.json"), "{err}");
        let _ = std::fs::remove_dir_all(&empty);
    }

    #[test]
    fn tiny_bench_runs_end_to_end_with_a_consistent_report() {
        let dir = std::env::temp_dir().join(format!("aware-bench-adapt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let opts = AdaptBenchOptions {
            out: dir.clone(),
            meta: None,
            apps: 2,
            seed: 1001,
            episodes: 4,
            steps_per_episode: 12,
            fallback_episodes: 1,
            embedding_refresh: 2,
            window: 2,
            hidden: 16,
            source_min_episodes: 2,
            source_max_episodes: 3,
            repeats: 1,
            shared: true,
            train: TrainMetaOptions {
                apps: 5,
                iterations: 2,
                seed: 2,
                apps_per_iteration: 2,
                updates_per_iteration: 1,
                batch: 8,
                meta: aware_harness::train_meta::tiny_meta(),
                base_hidden: vec![16, 16],
                progress_every: 0,
                // The paper's reward, which this benchmark measures in.
                objective: MetaObjective::Weighted,
                ..TrainMetaOptions::default()
            },
            ..AdaptBenchOptions::default()
        };
        let r = run(&opts).unwrap();
        assert_eq!(r.apps, 2);
        assert_eq!(r.per_app.len(), 2);
        assert_eq!(r.meta.embed_dim, 4);
        assert_eq!(r.sources.len(), 2);
        assert_eq!(r.sources[0].state_dim, STATE_DIM);
        assert_eq!(r.sources[1].state_dim, STATE_DIM + features::EXTRA_DIM);
        assert!(r.sources.iter().all(|s| s.episodes == 3 && !s.converged));
        let names: Vec<&str> = r.arms.iter().map(|a| a.arm.as_str()).collect();
        assert_eq!(names, ARMS);
        for app in &r.per_app {
            assert!(app.converged_reward.is_finite() && app.converged_reward > 0.0);
            assert!(LEARNING_ARMS.contains(&app.converged_arm.as_str()));
            assert_eq!(app.adaptations.len(), ARMS.len());
            for a in &app.adaptations {
                assert!((1..=4).contains(&a.episodes), "{a:?}");
                assert_eq!(a.censored, a.episodes_to_target.is_none());
                assert!(a.cpu_seconds.is_finite() && a.cpu_seconds >= 0.0);
                assert!(a.cpu_seconds <= a.cpu_seconds_total + 1e-12);
                assert!(a.slo_violations_adapting <= a.slo_violations_total);
                assert!(a.slo_violations_total <= 4 * 12);
                assert!(a.mean_reward.is_finite() && a.final_pct_of_converged.is_finite());
                assert!(a.cpu_util_deficit_pp.is_finite() && a.memory_util_deficit_pp.is_finite());
            }
            // The best arm's final mean is the converged reward.
            let best = app
                .adaptations
                .iter()
                .find(|a| a.arm == app.converged_arm)
                .unwrap();
            assert!((best.final_pct_of_converged - 100.0).abs() < 1e-9);
            assert!(app
                .adaptations
                .iter()
                .filter(|a| a.arm != "fallback")
                .all(|a| a.final_pct_of_converged <= 100.0 + 1e-9));
            // The learning arms did their work on the agent's thread.
            for a in app.adaptations.iter().filter(|a| a.arm != "fallback") {
                assert!(a.cpu_seconds_total > 0.0, "{a:?}");
            }
            // AWARE's first episode is a fallback episode and cannot reach the target.
            let aw = app.adaptations.iter().find(|a| a.arm == "aware").unwrap();
            assert!(aw.episodes >= 2);
        }
        for a in &r.arms {
            assert_eq!(a.apps, 2);
            assert_eq!(a.curve.len(), 4);
            assert!(a.curve.iter().all(|v| v.is_finite()));
            assert_eq!(a.reached + a.censored, 2);
            assert_eq!(a.steps_total, 2 * 4 * 12);
        }
        let vs: Vec<&str> = r.speed_ups.iter().map(|s| s.vs.as_str()).collect();
        assert_eq!(vs, ["tl", "tl_plus", "scratch", "aware_shared"]);
        for s in &r.speed_ups {
            assert!(s.median_episodes_ratio.is_finite() && s.median_episodes_ratio > 0.0);
            assert!(s.mean_episodes_ratio.is_finite());
        }
        let svg = std::fs::read_to_string(dir.join("adapt-curve.svg")).unwrap();
        assert_eq!(svg.matches("<polyline").count(), ARMS.len());
        let json = serde_json::to_value(&r).unwrap();
        assert!(json["per_app"][0]["adaptations"].is_array());
        // The held-out seed must differ from the pool's.
        let same = AdaptBenchOptions {
            meta: Some(dir.join("adapt-meta")),
            seed: 2,
            ..opts
        };
        assert!(run(&same).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
