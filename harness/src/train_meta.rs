//! `aware train-meta`: meta-training of the shared base-learner and the meta-learner (paper
//! §3.2 "Meta-learner Training") on a pool of generated apps, in-process on the simulator.
//!
//! The pool (`loadgen::app::generate_apps(apps, seed)`) is split 8:2 by a seeded shuffle into
//! training and held-out apps (`split.json`); only training apps are seen. Every iteration:
//!
//! 1. `apps_per_iteration` training apps are drawn; each runs one episode of
//!    `steps_per_episode` steps on its own simulator (a fresh noise seed per episode), driven
//!    either by the fallback rule or by the current agent with Gaussian noise, conditioned on the
//!    embedding of the app's current top-M bundle. The share of fallback episodes falls from 1
//!    to `min_fallback` over the first half of training (an app without any episode yet always
//!    starts with the fallback).
//! 2. The episode's transitions go into the app's replay buffer and the episode into its top-M
//!    store (by mean reward; paper: the top-M trajectories are the representative ones).
//! 3. `updates_per_iteration` joint updates ([`MetaDdpg::train_step`]) over the drawn apps: one
//!    bundle (the top-m episodes of each app, m = the smallest count among them, ≤ M) and
//!    `batch` sampled transitions per app. The actor loss trains the GRU and the FC head.
//! 4. `base_updates_per_iteration` base-learner updates ([`MetaDdpg::train_base_step`]) with the
//!    drawn apps' embeddings computed once and held fixed: `batch` transitions per app, no GRU
//!    pass. Four joint updates per iteration alone leave the base-learner far behind a per-app
//!    DDPG (800 updates over a 200-iteration run); on a 40-app pool, 32 more per iteration lift
//!    the held-out evaluation's zero-shot reward from 1.37 to 1.49 per step (fallback rule 1.33)
//!    at little extra cost (200 iterations: 106 s wall here, under load), and 128 overfit (1.46,
//!    and slower adaptation in `aware bench adapt`).
//!
//! The fallback here is a rule in the policy's action space — the HPA rule on replicas (70% CPU,
//! ±10% tolerance, as `aware sim --policy hpa`) plus threshold steps on the CPU and memory limits
//! — not the recommender's full HPA/VPA port, which needs its histories and the bus.
//!
//! The critic's bootstrapped target is clamped to the range of the discounted return,
//! `[0, 2/(1−γ)]` (rewards lie in [`aware_loadgen::env::REWARD_RANGE`]; `DdpgConfig::target_bounds`,
//! stored in `base.ckpt`, so fine-tuning keeps it): without it the joint training's Q ran past
//! that bound (actor loss −386 against a ceiling of 200) after ~300 iterations on a 100-app pool
//! and the embedding's tanh saturated (meta-gradient norm 0.01).
//!
//! Every `checkpoint_every` iterations (and at the end) a checkpoint saves the latest agent for
//! `--resume` and validates it on the held-out apps ([`validate`]: one fallback episode, as the
//! services, then two deterministic episodes of the agent with that embedding, no gradient step).
//! The output agent is the best-validated one, not the last: joint training is not monotone
//! (validations of one 200-app run ranged from 0.26 to 1.43 reward/step between checkpoints).
//! The held-out apps thereby act as a validation set; `aware bench adapt` evaluates on apps from
//! other generator seeds, never seen here.
//!
//! With `--restarts K` (K > 1), K such trainings run on the same pool, split and validation
//! episodes, each with its own networks, exploration and iteration draws
//! ([`TrainMetaOptions::train_seed`]; restart 0 is the single training), in
//! `out/restart-<r>/`, as many at once as there are cores; `out` receives the best-validated
//! agent of them all ([`run`]).
//!
//! Outputs in `--out`: `meta.ckpt` (the meta-learner) and `base.ckpt` (the base-learner: a DDPG
//! checkpoint over `state ‖ embedding`) of the kept agent, `split.json`, `apps.json` (the pool),
//! `train-log.json` (per-iteration rewards and losses, every validation, the kept iteration and
//! its held-out evaluation), `last/` (the latest agent) and `resume.json` (the iteration and
//! every app's top-M episodes; with `--resume` training continues from `last/`, replay buffers
//! rebuilt from those episodes).

use std::path::{Path, PathBuf};
use std::time::Instant;

use aware_loadgen::app::{generate_apps, GeneratorOptions};
use aware_loadgen::env::ActionMap;
use aware_loadgen::{AppSet, AppSpec, Observation, SimConfig, SimEnv, SimError, TargetAction};
use aware_shared_model::{
    DdpgConfig, EpisodeBundle, MetaConfig, MetaDdpg, MetaGroup, MetaLearner, ModelError,
    ReplayBuffer, Transition, ACTION_DIM,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// State width of the simulator.
pub const STATE_DIM: usize = aware_loadgen::STATE_DIM;

#[derive(Debug, thiserror::Error)]
pub enum TrainMetaError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainMetaError + '_ {
    move |source| TrainMetaError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Options of `aware train-meta`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, clap::Args)]
pub struct TrainMetaOptions {
    /// Apps in the generated pool (80% train, 20% held out).
    #[arg(long, default_value_t = TrainMetaOptions::default().apps, help = "Apps in the generated pool")]
    pub apps: usize,
    /// Meta-training iterations.
    #[arg(long, default_value_t = TrainMetaOptions::default().iterations, help = "Meta-training iterations")]
    pub iterations: u64,
    /// Seed of the pool, the split, the networks and every episode.
    #[arg(long, default_value_t = TrainMetaOptions::default().seed)]
    pub seed: u64,
    /// Output directory.
    #[arg(long, default_value = "meta-out")]
    pub out: PathBuf,
    /// Continue from the checkpoint in `out`.
    #[arg(long, help = "Continue from the checkpoint in --out")]
    pub resume: bool,
    /// Write checkpoints every this many iterations (and at the end).
    #[arg(long, default_value_t = TrainMetaOptions::default().checkpoint_every)]
    pub checkpoint_every: u64,
    /// Steps per episode T.
    #[arg(long, default_value_t = TrainMetaOptions::default().steps_per_episode)]
    pub steps_per_episode: usize,
    /// Training apps drawn per iteration.
    #[arg(long, default_value_t = TrainMetaOptions::default().apps_per_iteration)]
    pub apps_per_iteration: usize,
    /// Joint updates per iteration.
    #[arg(long, default_value_t = TrainMetaOptions::default().updates_per_iteration)]
    pub updates_per_iteration: usize,
    /// Base-learner updates per iteration with the drawn apps' embeddings held fixed
    /// ([`MetaDdpg::train_base_step`]; no GRU pass, so far cheaper than a joint update).
    #[arg(long, default_value_t = TrainMetaOptions::default().base_updates_per_iteration, help = "Base-learner updates per iteration with the embeddings held fixed (cheap: no GRU pass)")]
    pub base_updates_per_iteration: usize,
    /// Transitions per app in one update.
    #[arg(skip = TrainMetaOptions::default().batch)]
    pub batch: usize,
    /// Final share of fallback episodes.
    #[arg(skip = TrainMetaOptions::default().min_fallback)]
    pub min_fallback: f64,
    /// Exploration noise σ of agent episodes.
    #[arg(skip = TrainMetaOptions::default().sigma)]
    pub sigma: f32,
    /// The exploration σ stored in `base.ckpt`: what the recommenders explore with while the
    /// services fine-tune this base-learner for a new target (`trainer.meta_dir`). Lower than
    /// learning from scratch (Table 2: 0.2): the policy starts near a good one, and noise costs
    /// it more reward than it finds (docs/adr/0012-meta-learner.md).
    #[arg(long, default_value_t = TrainMetaOptions::default().fine_tune_sigma, help = "Exploration σ stored in base.ckpt: what the services explore with while they fine-tune the base-learner for a new target")]
    pub fine_tune_sigma: f32,
    /// Meta-learner shape (state_dim is fixed to the simulator's).
    #[arg(skip = TrainMetaOptions::default().meta)]
    pub meta: MetaConfig,
    /// Base-learner hidden widths.
    #[arg(skip = TrainMetaOptions::default().base_hidden)]
    pub base_hidden: Vec<usize>,
    /// Progress line every this many iterations (0: none).
    #[arg(skip = TrainMetaOptions::default().progress_every)]
    pub progress_every: u64,
    /// Independent trainings on the same pool, split and validation episodes (networks,
    /// exploration and the iteration draws seeded apart); the output is the best-validated agent
    /// of all. Joint training varies a lot from one initialization to the next (see
    /// [`run`]); 1: a single training straight into `out`.
    #[serde(default = "one")]
    #[arg(long, default_value_t = DEFAULT_RESTARTS, help = "Independent trainings on the same pool (in --out/restart-N, as many at once as there are cores); --out gets the best-validated agent of all")]
    pub restarts: u64,
    /// Which restart this training is (0: the seeds of a single training).
    #[serde(default)]
    #[arg(skip = TrainMetaOptions::default().restart)]
    pub restart: u64,
    /// The reward the base-learner learns ([`MetaObjective`]). A manifest or resume file
    /// written before the option existed was trained on the paper's.
    #[serde(default, skip_serializing_if = "MetaObjective::is_weighted")]
    #[arg(long, value_enum, default_value_t = TrainMetaOptions::default().objective, help = "The reward the base-learner learns: weighted (the paper's) or constrained (the services' default objective, at the multiplier's initial λ; docs/adr/0020-meta-training-on-the-objective.md)")]
    pub objective: MetaObjective,
}

/// The reward the base-learner is trained on. The embedding reads the paper's reward in
/// either case, as it does in the services (the recorder stores the paper's reward; the
/// constrained objective is recomputed by the trainer, ADR 0016).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum MetaObjective {
    /// The paper's reward (`learning.objective.mode: weighted`).
    #[default]
    Weighted,
    /// The constrained objective's reward at the multiplier's initial λ, from the requested
    /// cost and the SLO violation: what a target adapting this base-learner starts from
    /// (`learning.objective.mode: constrained`).
    Constrained,
}

impl MetaObjective {
    /// Weighted: left out of a manifest, so that one trained before the option keeps its
    /// fingerprint.
    pub fn is_weighted(&self) -> bool {
        *self == MetaObjective::Weighted
    }
}

fn one() -> u64 {
    1
}

/// `aware train-meta`'s default `--restarts` (the library's [`TrainMetaOptions::default`] stays
/// at one training, for the short trainings of the benches and tests). Four reseeded trainings,
/// the best-validated kept: one initialization can land far from another, and the best of four
/// adapts faster in `aware bench adapt` (docs/adr/0012-meta-learner.md), for a few times the
/// wall time of one training.
pub const DEFAULT_RESTARTS: u64 = 4;

impl TrainMetaOptions {
    /// Seed of the networks, the replay buffers, the iteration draws and the training episodes:
    /// `seed` for restart 0, mixed with the restart index otherwise. The pool, the split and the
    /// validation episodes always follow `seed`.
    pub fn train_seed(&self) -> u64 {
        if self.restart == 0 {
            self.seed
        } else {
            self.seed ^ self.restart.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        }
    }
}

impl Default for TrainMetaOptions {
    fn default() -> Self {
        TrainMetaOptions {
            apps: 100,
            iterations: 300,
            seed: 0,
            out: PathBuf::from("meta-out"),
            resume: false,
            checkpoint_every: 25,
            steps_per_episode: 50,
            apps_per_iteration: 4,
            updates_per_iteration: 4,
            base_updates_per_iteration: 32,
            batch: 64,
            min_fallback: 0.2,
            sigma: 0.2,
            fine_tune_sigma: 0.05,
            meta: MetaConfig::default(),
            base_hidden: vec![64, 64],
            progress_every: 10,
            restarts: 1,
            restart: 0,
            objective: MetaObjective::default(),
        }
    }
}

/// The command line of `aware train-meta`: [`TrainMetaOptions`] (at `aware train-meta`'s
/// defaults, which train [`DEFAULT_RESTARTS`] restarts) plus the meta-learner's shape.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainMetaArgs {
    #[command(flatten)]
    pub options: TrainMetaOptions,
    /// GRU hidden width per direction (FC width follows it).
    #[arg(long, default_value_t = MetaConfig::default().hidden)]
    pub hidden: usize,
    /// Episodes per bundle (top-M).
    #[arg(long, default_value_t = MetaConfig::default().bundle_size)]
    pub bundle: usize,
    /// Regenerate the default meta-learner the binaries ship (what `aware demo` bootstraps
    /// from): train at the defaults, from scratch, into --out, then copy the kept agent and its
    /// manifest (the options and the fingerprint of the training) into DIR. Run it from the
    /// repository's root and commit DIR; other training options are refused.
    #[arg(
        long,
        value_name = "DIR",
        num_args = 0..=1,
        default_missing_value = crate::default_meta::DIR_IN_REPO,
        conflicts_with = "resume",
        help = "Regenerate the shipped default meta-learner into DIR (default models/meta-default; run from the repository's root): trains at the defaults into --out, then writes the checkpoints and manifest.json"
    )]
    pub write_default: Option<PathBuf>,
}

impl TrainMetaArgs {
    /// The options with the meta-learner's shape set from `hidden` and `bundle`.
    pub fn into_options(self) -> TrainMetaOptions {
        TrainMetaOptions {
            meta: MetaConfig {
                hidden: self.hidden,
                fc_hidden: self.hidden,
                bundle_size: self.bundle,
                ..self.options.meta
            },
            ..self.options
        }
    }
}

/// The seeded 8:2 split.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Split {
    pub seed: u64,
    pub apps: usize,
    /// Generator seed of the pool (`generate_apps(apps, pool_seed)`).
    pub pool_seed: u64,
    pub train: Vec<String>,
    pub held_out: Vec<String>,
}

/// The 8:2 split of `n` apps' indices: a seeded shuffle, the first ⌈0.8 n⌉ train.
pub fn split_indices(n: usize, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut idx: Vec<usize> = (0..n).collect();
    idx.shuffle(&mut ChaCha8Rng::seed_from_u64(seed ^ SPLIT_SALT));
    let n_train = (n * 8).div_ceil(10).min(n);
    let held = idx.split_off(n_train);
    (idx, held)
}

/// Folded into the split seed (keeps the split's shuffle apart from the pool generator's RNG).
const SPLIT_SALT: u64 = 0x5eed_0008_0002;

/// One recorded episode.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Episode {
    /// Mean per-step reward.
    pub reward: f64,
    /// Whether the fallback drove it.
    pub fallback: bool,
    /// Row-major `T × (STATE_DIM + 4)` step vectors `[state ‖ action ‖ reward]`.
    pub steps: Vec<f32>,
    /// The state after the last step (to rebuild the last transition).
    pub last_state: Vec<f32>,
    /// Per step, the constrained objective's reward at the multiplier's initial λ (empty in an
    /// episode recorded before it was kept: the paper's reward stands in).
    #[serde(default)]
    pub constrained: Vec<f32>,
}

impl Episode {
    /// The episode's transitions, rewarded by `objective`.
    pub fn transitions_for(&self, objective: MetaObjective) -> Vec<Transition> {
        let mut ts = self.transitions();
        if objective == MetaObjective::Constrained && self.constrained.len() == ts.len() {
            for (t, r) in ts.iter_mut().zip(&self.constrained) {
                t.reward = *r;
            }
        }
        ts
    }

    /// The mean per-step reward under `objective`.
    pub fn score(&self, objective: MetaObjective) -> f64 {
        match objective {
            MetaObjective::Constrained if !self.constrained.is_empty() => {
                self.constrained.iter().map(|r| f64::from(*r)).sum::<f64>()
                    / self.constrained.len() as f64
            }
            _ => self.reward,
        }
    }

    /// The episode's transitions with the paper's reward.
    pub fn transitions(&self) -> Vec<Transition> {
        let w = STATE_DIM + ACTION_DIM + 1;
        let rows: Vec<&[f32]> = self.steps.chunks(w).collect();
        rows.iter()
            .enumerate()
            .map(|(i, r)| {
                let next = match rows.get(i + 1) {
                    Some(n) => n[..STATE_DIM].to_vec(),
                    None => self.last_state.clone(),
                };
                let mut action = [0.0; ACTION_DIM];
                action.copy_from_slice(&r[STATE_DIM..STATE_DIM + ACTION_DIM]);
                Transition {
                    state: r[..STATE_DIM].to_vec(),
                    action,
                    reward: r[w - 1],
                    next_state: next,
                    done: false,
                }
            })
            .collect()
    }
}

/// Who drives an episode.
pub enum Driver<'a> {
    /// The fallback rule.
    Fallback,
    /// The agent with this embedding and noise σ (0: deterministic).
    Agent {
        agent: &'a mut MetaDdpg,
        embedding: &'a [f32],
        sigma: f32,
    },
}

/// The fallback rule in the policy's action space: HPA on replicas (70% CPU target, ±10%
/// tolerance), threshold steps on the CPU (util > 0.9: +0.25, < 0.3: −0.1) and memory
/// (util > 0.85: +0.25, < 0.3: −0.1) limits, in units of the map's per-step change; the
/// allocation it asks for is expressed under `map` ([`aware_loadgen::env::action_for`]) for an
/// app with these bounds.
pub fn fallback_action(
    o: &Observation,
    bounds: &aware_loadgen::Bounds,
    map: &ActionMap,
) -> [f32; ACTION_DIM] {
    let m = &o.metrics;
    let mut a = [0.0f32; ACTION_DIM];
    let ratio = m.cpu_util / 0.7;
    if (ratio - 1.0).abs() > 0.1 && m.time_s > 0.0 {
        let desired = (f64::from(o.allocation.replicas) * ratio).ceil().max(1.0);
        let delta = desired - f64::from(o.allocation.replicas);
        a[0] = (delta / f64::from(map.max_replica_delta.max(1))).clamp(-1.0, 1.0) as f32;
    }
    a[1] = if m.cpu_util > 0.9 {
        0.25
    } else if m.cpu_util < 0.3 {
        -0.1
    } else {
        0.0
    };
    a[2] = if m.memory_util > 0.85 {
        0.25
    } else if m.memory_util < 0.3 {
        -0.1
    } else {
        0.0
    };
    let delta = ActionMap {
        mode: aware_loadgen::env::ActionMode::Delta,
        ..*map
    };
    let (desired, _) = aware_loadgen::env::map_action(a, o.allocation, bounds, &delta);
    aware_loadgen::env::action_for(desired, o.allocation, bounds, map)
}

/// Runs one episode of `steps` steps of `app` from a reset with `seed` (one warm-up step with
/// the initial allocation first, as the collector does).
pub fn run_episode(
    app: &AppSpec,
    steps: usize,
    seed: u64,
    driver: Driver<'_>,
    rng: &mut ChaCha8Rng,
) -> Result<Episode, TrainMetaError> {
    let cfg = SimConfig {
        seed,
        ..SimConfig::default()
    };
    let map = cfg.action_map;
    let mut env = SimEnv::new(vec![app.clone()], cfg)?;
    env.reset(seed)?;
    let mut obs = first(env.step(&[TargetAction::Hold])?)?;
    let mut out = Vec::with_capacity(steps * (STATE_DIM + ACTION_DIM + 1));
    let mut constrained = Vec::with_capacity(steps);
    let prices = aware_mdp::Prices::default();
    let lambda = aware_mdp::MultiplierConfig::default().initial;
    let mut total = 0.0;
    let mut driver = driver;
    for _ in 0..steps {
        let s = obs.state;
        let a = match &mut driver {
            Driver::Fallback => fallback_action(&obs, &app.bounds, &map),
            Driver::Agent {
                agent,
                embedding,
                sigma,
            } => {
                if *sigma > 0.0 {
                    agent.act_noisy(&s, embedding, *sigma, rng)?
                } else {
                    agent.act(&s, embedding)?
                }
            }
        };
        let next = first(env.step(&[TargetAction::Raw(a)])?)?;
        let r = next.reward as f32;
        total += next.reward;
        // As the trainer recomputes a stored row (ADR 0016): the allocation in force during
        // the step, and whether it missed the app's SLO.
        let cost = prices
            .cost_fraction(&next.allocation, &app.bounds)
            .unwrap_or(1.0);
        constrained
            .push(aware_mdp::constrained_reward(lambda, cost, next.metrics.slo_violation) as f32);
        out.extend_from_slice(&EpisodeBundle::step_vector(&s, &a, r));
        obs = next;
    }
    Ok(Episode {
        reward: total / steps.max(1) as f64,
        fallback: matches!(driver, Driver::Fallback),
        steps: out,
        last_state: obs.state.to_vec(),
        constrained,
    })
}

fn first(v: Vec<Observation>) -> Result<Observation, TrainMetaError> {
    v.into_iter()
        .next()
        .ok_or_else(|| TrainMetaError::Invalid("simulator returned no observation".into()))
}

/// Keeps the best `m` episodes by mean reward.
pub fn keep_top(store: &mut Vec<Episode>, ep: Episode, m: usize) {
    store.push(ep);
    store.sort_by(|a, b| b.reward.total_cmp(&a.reward));
    store.truncate(m);
}

/// The bundle of the best `m` episodes.
pub fn bundle_of(store: &[Episode], m: usize) -> Result<EpisodeBundle, ModelError> {
    EpisodeBundle::truncated(
        STATE_DIM,
        store
            .iter()
            .take(m.max(1))
            .map(|e| e.steps.clone())
            .collect(),
    )
}

/// One line of the training log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IterationLog {
    pub iteration: u64,
    /// Mean per-step reward of this iteration's agent episodes (None: all fallback).
    pub agent_reward: Option<f64>,
    /// Mean per-step reward of this iteration's fallback episodes.
    pub fallback_reward: Option<f64>,
    pub critic_loss: f32,
    pub actor_loss: f32,
    pub meta_grad_norm: f32,
    pub elapsed_s: f64,
}

/// Held-out evaluation of one app: the fallback's reward and the meta-trained agent's, with the
/// embedding of a bundle of fallback episodes (no training on the app).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HeldOutEval {
    pub app: String,
    pub fallback_reward: f64,
    pub agent_reward: f64,
}

/// `train-log.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrainLog {
    pub options: TrainMetaOptions,
    pub iterations: Vec<IterationLog>,
    /// Wall-clock seconds of meta-training (all runs of a resumed training).
    pub train_seconds: f64,
    pub meta_params: usize,
    pub held_out: Vec<HeldOutEval>,
    pub held_out_fallback_mean: f64,
    pub held_out_agent_mean: f64,
    /// The held-out evaluation at every checkpoint (the validation that picks the kept one).
    #[serde(default)]
    pub validations: Vec<ValidationLog>,
    /// The iteration count of the kept (best-validated) checkpoint: `base.ckpt`, `meta.ckpt`.
    #[serde(default)]
    pub best_iteration: u64,
    /// With `restarts` > 1: every restart's kept validation (this log is the kept restart's).
    #[serde(default)]
    pub restarts: Vec<RestartLog>,
    /// With `restarts` > 1: the restart whose agent is in `out`.
    #[serde(default)]
    pub kept_restart: u64,
}

/// One restart's kept (best-validated) checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RestartLog {
    pub restart: u64,
    pub best_iteration: u64,
    pub held_out_agent_mean: f64,
    pub held_out_fallback_mean: f64,
    pub train_seconds: f64,
}

/// One validation: the held-out apps' mean zero-shot reward after `iteration` iterations.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ValidationLog {
    pub iteration: u64,
    pub agent_mean: f64,
    pub fallback_mean: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ResumeState {
    iteration: u64,
    episodes: Vec<Vec<Episode>>,
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrainMetaError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<(), TrainMetaError> {
    let text = serde_json::to_vec_pretty(v).map_err(|source| TrainMetaError::Json {
        path: path.display().to_string(),
        source,
    })?;
    write_atomic(path, &text)
}

pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, TrainMetaError> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    serde_json::from_slice(&bytes).map_err(|source| TrainMetaError::Json {
        path: path.display().to_string(),
        source,
    })
}

/// The pool of `opts` and its split.
pub fn pool(opts: &TrainMetaOptions) -> (Vec<AppSpec>, Split) {
    let apps = generate_apps(opts.apps, opts.seed, &GeneratorOptions::default());
    let (train, held) = split_indices(apps.len(), opts.seed);
    let names = |ix: &[usize]| ix.iter().map(|&i| apps[i].name.clone()).collect();
    let split = Split {
        seed: opts.seed,
        apps: opts.apps,
        pool_seed: opts.seed,
        train: names(&train),
        held_out: names(&held),
    };
    (apps, split)
}

fn new_agent(opts: &TrainMetaOptions) -> Result<MetaDdpg, ModelError> {
    let mut base = DdpgConfig {
        seed: opts.train_seed(),
        ..DdpgConfig::with_hidden(STATE_DIM, &opts.base_hidden)
    };
    base.noise.sigma = opts.fine_tune_sigma;
    // The simulator's rewards are bounded, so is the true value: clamping the critic's target to
    // that range keeps the joint training's overestimation from running away (without it, the
    // critic's Q passed the bound 2/(1−γ) = 200 after ~300 iterations of a 100-app pool and the
    // embedding saturated).
    let [r_lo, r_hi] = aware_loadgen::env::REWARD_RANGE;
    base.target_bounds = base.value_bounds_for_rewards(r_lo as f32, r_hi as f32);
    MetaDdpg::new(
        base,
        MetaConfig {
            state_dim: STATE_DIM,
            seed: opts.train_seed(),
            ..opts.meta.clone()
        },
    )
}

/// The latest state, for `--resume`: `last/` (the agent) and `resume.json`.
fn save_last(out: &Path, agent: &MetaDdpg, state: &ResumeState) -> Result<(), TrainMetaError> {
    let last = out.join(LAST_DIR);
    std::fs::create_dir_all(&last).map_err(io_err(&last))?;
    save_agent(&last, agent)?;
    write_json(&out.join("resume.json"), state)
}

fn save_agent(dir: &Path, agent: &MetaDdpg) -> Result<(), TrainMetaError> {
    write_atomic(&dir.join("meta.ckpt"), &agent.meta().to_bytes()?)?;
    write_atomic(&dir.join("base.ckpt"), &agent.base().to_bytes()?)
}

/// Where the latest (not necessarily the kept) agent is saved for `--resume`.
pub const LAST_DIR: &str = "last";

/// Loads a trained agent from `dir` (`base.ckpt` + `meta.ckpt`).
pub fn load_agent(dir: &Path) -> Result<MetaDdpg, TrainMetaError> {
    let base = std::fs::read(dir.join("base.ckpt")).map_err(io_err(&dir.join("base.ckpt")))?;
    let meta = std::fs::read(dir.join("meta.ckpt")).map_err(io_err(&dir.join("meta.ckpt")))?;
    Ok(MetaDdpg::from_parts(
        aware_shared_model::Ddpg::from_bytes(&base)?,
        MetaLearner::from_bytes(&meta)?,
    )?)
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

/// Refuses to resume `out` with another pool or seed than its `split.json`'s.
fn resumes_split(out: &Path, split: &Split) -> Result<(), TrainMetaError> {
    let old: Split = read_json(&out.join("split.json"))?;
    if &old != split {
        return Err(TrainMetaError::Invalid(
            "--resume with a different pool or seed than the checkpoint's split.json".into(),
        ));
    }
    Ok(())
}

/// The directory of restart `r` under `out` (with `restarts` > 1).
pub fn restart_dir(out: &Path, r: u64) -> PathBuf {
    out.join(format!("restart-{r}"))
}

/// Meta-training; returns the log (also written to `out`).
///
/// With `restarts` = K > 1, K trainings on the same pool, split and validation episodes run in
/// `out/restart-<r>/` (as many at once as there are cores; each one resumable on its own), and
/// `out` receives the best-validated agent of all of them, with the winner's log plus every
/// restart's kept validation (`TrainLog::restarts`, `kept_restart`). One initialization can
/// land far from another ([`DEFAULT_RESTARTS`]).
pub fn run(opts: &TrainMetaOptions) -> Result<TrainLog, TrainMetaError> {
    if opts.apps < 2 || opts.apps_per_iteration == 0 || opts.steps_per_episode < 2 {
        return Err(TrainMetaError::Invalid(
            "need ≥ 2 apps, ≥ 1 app per iteration and ≥ 2 steps per episode".into(),
        ));
    }
    if opts.restarts <= 1 {
        return run_one(opts);
    }
    let out = &opts.out;
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let (apps, split) = pool(opts);
    if opts.resume && out.join("split.json").is_file() {
        resumes_split(out, &split)?;
    }
    write_json(&out.join("split.json"), &split)?;
    AppSet { apps }
        .write(&out.join("apps.json"))
        .map_err(TrainMetaError::Sim)?;
    let start = Instant::now();
    let earlier_seconds = if opts.resume {
        read_json::<TrainLog>(&out.join("train-log.json")).map_or(0.0, |l| l.train_seconds)
    } else {
        0.0
    };
    let each: Vec<TrainMetaOptions> = (0..opts.restarts)
        .map(|r| {
            let dir = restart_dir(out, r);
            TrainMetaOptions {
                out: dir.clone(),
                resume: opts.resume && dir.join("resume.json").is_file(),
                restart: r,
                ..opts.clone()
            }
        })
        .collect();
    let at_once = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut logs: Vec<TrainLog> = Vec::with_capacity(each.len());
    for chunk in each.chunks(at_once) {
        let results: Vec<Result<TrainLog, TrainMetaError>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk.iter().map(|o| s.spawn(move || run_one(o))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(TrainMetaError::Invalid(
                            "a restart's thread panicked".into(),
                        ))
                    })
                })
                .collect()
        });
        for r in results {
            logs.push(r?);
        }
    }
    let summary: Vec<RestartLog> = logs
        .iter()
        .enumerate()
        .map(|(r, l)| RestartLog {
            restart: r as u64,
            best_iteration: l.best_iteration,
            held_out_agent_mean: l.held_out_agent_mean,
            held_out_fallback_mean: l.held_out_fallback_mean,
            train_seconds: l.train_seconds,
        })
        .collect();
    let kept = summary
        .iter()
        .max_by(|a, b| a.held_out_agent_mean.total_cmp(&b.held_out_agent_mean))
        .map_or(0, |r| r.restart);
    let from = restart_dir(out, kept);
    for f in ["base.ckpt", "meta.ckpt"] {
        let bytes = std::fs::read(from.join(f)).map_err(io_err(&from.join(f)))?;
        write_atomic(&out.join(f), &bytes)?;
    }
    let mut log = logs.swap_remove(kept as usize);
    log.options = opts.clone();
    log.train_seconds = earlier_seconds + start.elapsed().as_secs_f64();
    log.restarts = summary;
    log.kept_restart = kept;
    tracing::info!(
        kept_restart = kept,
        held_out_agent_mean = log.held_out_agent_mean,
        "meta-training restarts done"
    );
    write_json(&out.join("train-log.json"), &log)?;
    Ok(log)
}

/// One meta-training into `opts.out`.
fn run_one(opts: &TrainMetaOptions) -> Result<TrainLog, TrainMetaError> {
    let out = &opts.out;
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let (apps, split) = pool(opts);
    let train: Vec<&AppSpec> = apps
        .iter()
        .filter(|a| split.train.contains(&a.name))
        .collect();
    let held: Vec<&AppSpec> = apps
        .iter()
        .filter(|a| split.held_out.contains(&a.name))
        .collect();
    let m_max = opts.meta.bundle_size;

    let (mut agent, mut state, mut log) = if opts.resume {
        resumes_split(out, &split)?;
        let last = out.join(LAST_DIR);
        let agent = load_agent(if last.is_dir() { &last } else { out })?;
        let state: ResumeState = read_json(&out.join("resume.json"))?;
        let mut log: TrainLog = read_json(&out.join("train-log.json"))?;
        if state.episodes.len() != train.len() {
            return Err(TrainMetaError::Invalid(
                "resume.json does not match the pool".into(),
            ));
        }
        log.iterations.retain(|l| l.iteration < state.iteration);
        log.validations.retain(|v| v.iteration <= state.iteration);
        log.options.iterations = opts.iterations;
        tracing::info!(iteration = state.iteration, "resuming meta-training");
        (agent, state, log)
    } else {
        write_json(&out.join("split.json"), &split)?;
        AppSet { apps: apps.clone() }
            .write(&out.join("apps.json"))
            .map_err(TrainMetaError::Sim)?;
        let agent = new_agent(opts)?;
        let (g, h) = agent.meta().num_params();
        let log = TrainLog {
            options: opts.clone(),
            iterations: Vec::new(),
            train_seconds: 0.0,
            meta_params: g + h,
            held_out: Vec::new(),
            held_out_fallback_mean: 0.0,
            held_out_agent_mean: 0.0,
            validations: Vec::new(),
            best_iteration: 0,
            restarts: Vec::new(),
            kept_restart: 0,
        };
        let state = ResumeState {
            iteration: 0,
            episodes: vec![Vec::new(); train.len()],
        };
        (agent, state, log)
    };

    // Replay buffers (rebuilt from the kept episodes on resume).
    let train_seed = opts.train_seed();
    let mut replay: Vec<ReplayBuffer> = (0..train.len())
        .map(|i| ReplayBuffer::new(20_000, STATE_DIM, train_seed ^ ((i as u64) << 20)))
        .collect::<Result<_, _>>()?;
    for (buf, eps) in replay.iter_mut().zip(&state.episodes) {
        for e in eps {
            for t in e.transitions_for(opts.objective) {
                buf.push(t)?;
            }
        }
    }

    let start = Instant::now();
    let base_seconds = log.train_seconds;
    let half = (opts.iterations / 2).max(1) as f64;
    while state.iteration < opts.iterations {
        let it = state.iteration;
        let mut rng = ChaCha8Rng::seed_from_u64(train_seed.wrapping_mul(0x9e37_79b9) ^ it);
        let mut drawn: Vec<usize> = (0..train.len()).collect();
        drawn.shuffle(&mut rng);
        drawn.truncate(opts.apps_per_iteration.min(train.len()));
        let p_fallback = (1.0 - it as f64 / half).max(opts.min_fallback);
        let (mut agent_r, mut fb_r) = (Vec::new(), Vec::new());
        for &i in &drawn {
            let ep_seed = train_seed ^ (it << 16) ^ i as u64;
            let use_fallback = state.episodes[i].is_empty() || rng.random_bool(p_fallback);
            let ep = if use_fallback {
                let ep = run_episode(
                    train[i],
                    opts.steps_per_episode,
                    ep_seed,
                    Driver::Fallback,
                    &mut rng,
                )?;
                for row in ep.steps.chunks(STATE_DIM + ACTION_DIM + 1) {
                    agent.observe(&row[..STATE_DIM])?;
                }
                fb_r.push(ep.score(opts.objective));
                ep
            } else {
                let e = agent.embed(&bundle_of(&state.episodes[i], m_max)?)?;
                let ep = run_episode(
                    train[i],
                    opts.steps_per_episode,
                    ep_seed,
                    Driver::Agent {
                        agent: &mut agent,
                        embedding: &e,
                        sigma: opts.sigma,
                    },
                    &mut rng,
                )?;
                agent_r.push(ep.score(opts.objective));
                ep
            };
            for t in ep.transitions_for(opts.objective) {
                replay[i].push(t)?;
            }
            keep_top(&mut state.episodes[i], ep, m_max);
        }
        let m = drawn
            .iter()
            .map(|&i| state.episodes[i].len())
            .min()
            .unwrap_or(1)
            .clamp(1, m_max);
        let bundles: Vec<EpisodeBundle> = drawn
            .iter()
            .map(|&i| bundle_of(&state.episodes[i], m))
            .collect::<Result<_, _>>()?;
        let mut last = None;
        for _ in 0..opts.updates_per_iteration {
            let batches = drawn
                .iter()
                .map(|&i| replay[i].sample(opts.batch))
                .collect::<Result<Vec<_>, _>>()?;
            let groups: Vec<MetaGroup<'_>> = bundles
                .iter()
                .zip(&batches)
                .map(|(bundle, batch)| MetaGroup { bundle, batch })
                .collect();
            last = Some(agent.train_step(&groups)?);
        }
        if opts.base_updates_per_iteration > 0 {
            let embeddings: Vec<Vec<f32>> = bundles
                .iter()
                .map(|b| agent.embed(b))
                .collect::<Result<_, _>>()?;
            for _ in 0..opts.base_updates_per_iteration {
                let batches = drawn
                    .iter()
                    .map(|&i| replay[i].sample(opts.batch))
                    .collect::<Result<Vec<_>, _>>()?;
                agent.train_base_step(&embeddings, &batches)?;
            }
        }
        state.iteration += 1;
        let elapsed = base_seconds + start.elapsed().as_secs_f64();
        let entry = IterationLog {
            iteration: it,
            agent_reward: mean(&agent_r),
            fallback_reward: mean(&fb_r),
            critic_loss: last.map_or(f32::NAN, |s| s.critic_loss),
            actor_loss: last.map_or(f32::NAN, |s| s.actor_loss),
            meta_grad_norm: last.map_or(f32::NAN, |s| s.meta_grad_norm),
            elapsed_s: elapsed,
        };
        tracing::debug!(?entry, "meta-training iteration");
        log.iterations.push(entry);
        log.train_seconds = elapsed;
        if opts.progress_every > 0
            && (state.iteration % opts.progress_every == 0 || state.iteration == opts.iterations)
        {
            let recent: Vec<f64> = log
                .iterations
                .iter()
                .rev()
                .take(opts.progress_every as usize)
                .filter_map(|l| l.agent_reward)
                .collect();
            let done = state.iteration as f64 / opts.iterations.max(1) as f64;
            let eta = if done > 0.0 {
                (start.elapsed().as_secs_f64() / done) * (1.0 - done)
            } else {
                0.0
            };
            let label = if opts.restarts > 1 {
                format!("restart {} ", opts.restart)
            } else {
                String::new()
            };
            eprintln!(
                "{label}[{:<30}] {:>5}/{} {:>5.1}s  ETA {:>5.0}s  agent reward {}  fallback share {:.2}",
                "#".repeat((done * 30.0) as usize),
                state.iteration,
                opts.iterations,
                elapsed,
                eta,
                mean(&recent).map_or("-".into(), |r| format!("{r:.3}")),
                p_fallback,
            );
        }
        if state.iteration % opts.checkpoint_every.max(1) == 0 || state.iteration == opts.iterations
        {
            checkpoint(out, &mut agent, &state, &mut log, &held, opts)?;
        }
    }
    if log.validations.is_empty() {
        // Resumed at or past the requested iterations: validate what is there.
        checkpoint(out, &mut agent, &state, &mut log, &held, opts)?;
    }
    // `log.held_out` is the kept agent's evaluation: the validation that chose it.
    Ok(log)
}

/// Fallback episodes before a held-out app's embedding in [`validate`]: one, as the services do
/// (the trainer embeds a target after its first recorded episode).
pub const VALIDATION_FALLBACK_EPISODES: u64 = 1;
/// Deterministic agent episodes per held-out app in [`validate`].
pub const VALIDATION_AGENT_EPISODES: u64 = 2;

/// The zero-shot evaluation on the held-out apps: per app, the embedding of
/// [`VALIDATION_FALLBACK_EPISODES`] fallback episodes, then [`VALIDATION_AGENT_EPISODES`]
/// deterministic episodes of the agent (no gradient step on the app). Seeds depend only on
/// `opts.seed` and the app, so every checkpoint meets the same episodes.
pub fn validate(
    agent: &mut MetaDdpg,
    held: &[&AppSpec],
    opts: &TrainMetaOptions,
) -> Result<Vec<HeldOutEval>, TrainMetaError> {
    let m_max = opts.meta.bundle_size;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed ^ 0xe7a1);
    let mut out = Vec::with_capacity(held.len());
    for (j, app) in held.iter().enumerate() {
        let mut store = Vec::new();
        for k in 0..VALIDATION_FALLBACK_EPISODES {
            let ep = run_episode(
                app,
                opts.steps_per_episode,
                opts.seed ^ (1 << 40) ^ ((j as u64) << 8) ^ k,
                Driver::Fallback,
                &mut rng,
            )?;
            keep_top(&mut store, ep, m_max);
        }
        let fb = mean(
            &store
                .iter()
                .map(|e| e.score(opts.objective))
                .collect::<Vec<_>>(),
        )
        .unwrap_or(0.0);
        let e = agent.embed(&bundle_of(&store, m_max)?)?;
        let mut rewards = Vec::new();
        for k in 0..VALIDATION_AGENT_EPISODES {
            let ep = run_episode(
                app,
                opts.steps_per_episode,
                opts.seed ^ (1 << 41) ^ ((j as u64) << 8) ^ k,
                Driver::Agent {
                    agent,
                    embedding: &e,
                    sigma: 0.0,
                },
                &mut rng,
            )?;
            rewards.push(ep.score(opts.objective));
        }
        out.push(HeldOutEval {
            app: app.name.clone(),
            fallback_reward: fb,
            agent_reward: mean(&rewards).unwrap_or(0.0),
        });
    }
    Ok(out)
}

/// Mean fallback and agent rewards of an evaluation (0 when empty).
fn held_out_means(evals: &[HeldOutEval]) -> (f64, f64) {
    let fb: Vec<f64> = evals.iter().map(|h| h.fallback_reward).collect();
    let ag: Vec<f64> = evals.iter().map(|h| h.agent_reward).collect();
    (mean(&fb).unwrap_or(0.0), mean(&ag).unwrap_or(0.0))
}

/// A checkpoint: the latest agent and state for `--resume` (`last/`, `resume.json`), then the
/// held-out validation; the agent becomes the kept one (`base.ckpt`, `meta.ckpt` in `out`, its
/// evaluation `log.held_out`) when it beats every earlier validation (always, without held-out
/// apps). Joint DDPG training
/// of the meta-learner is not monotone (on a 100-app pool the critic's Q ran away after ~300
/// iterations and the embedding saturated), so the output is the best-validated agent, not
/// the last.
fn checkpoint(
    out: &Path,
    agent: &mut MetaDdpg,
    state: &ResumeState,
    log: &mut TrainLog,
    held: &[&AppSpec],
    opts: &TrainMetaOptions,
) -> Result<(), TrainMetaError> {
    save_last(out, agent, state)?;
    let evals = validate(agent, held, opts)?;
    let (fallback_mean, agent_mean) = held_out_means(&evals);
    let best = log
        .validations
        .iter()
        .find(|v| v.iteration == log.best_iteration)
        .map(|v| v.agent_mean);
    let improves = held.is_empty() || best.is_none_or(|b| agent_mean > b);
    log.validations.retain(|v| v.iteration != state.iteration);
    log.validations.push(ValidationLog {
        iteration: state.iteration,
        agent_mean,
        fallback_mean,
    });
    if improves {
        save_agent(out, agent)?;
        log.best_iteration = state.iteration;
        log.held_out = evals;
        log.held_out_fallback_mean = fallback_mean;
        log.held_out_agent_mean = agent_mean;
    }
    tracing::debug!(
        iteration = state.iteration,
        agent_mean,
        fallback_mean,
        kept = improves,
        "meta-training validation"
    );
    write_json(&out.join("train-log.json"), log)
}

/// A meta-learner small enough for unit tests (H 8, FC 8, E 4, M 3).
#[cfg(any(test, feature = "testing"))]
pub fn tiny_meta() -> MetaConfig {
    MetaConfig {
        hidden: 8,
        fc_hidden: 8,
        embed_dim: 4,
        bundle_size: 3,
        ..MetaConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiny networks, 6-step episodes, a checkpoint every 2 iterations, into `out`.
    fn short_training(out: PathBuf) -> TrainMetaOptions {
        TrainMetaOptions {
            out,
            checkpoint_every: 2,
            steps_per_episode: 6,
            apps_per_iteration: 2,
            updates_per_iteration: 1,
            batch: 8,
            meta: tiny_meta(),
            base_hidden: vec![8, 8],
            progress_every: 0,
            ..TrainMetaOptions::default()
        }
    }

    #[test]
    fn split_is_seeded_8_to_2_and_disjoint() {
        let (a, b) = split_indices(10, 3);
        assert_eq!((a.len(), b.len()), (8, 2));
        assert_eq!(split_indices(10, 3), (a.clone(), b.clone()));
        assert_ne!(split_indices(10, 4).0, a);
        let mut all: Vec<usize> = a.iter().chain(&b).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert_eq!(split_indices(5, 0).0.len(), 4);
    }

    /// Under the constrained objective the base-learner's transitions and the validation's
    /// score are the objective's reward (the cost of the allocation in force and the step's
    /// violation, at the initial λ); the bundle the embedding reads keeps the paper's reward.
    #[test]
    fn the_constrained_objective_rewards_cost_and_violations() {
        let app = &generate_apps(1, 3, &GeneratorOptions::default())[0];
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let ep = run_episode(app, 8, 1, Driver::Fallback, &mut rng).unwrap();
        let paper = ep.transitions();
        let ts = ep.transitions_for(MetaObjective::Constrained);
        assert_eq!(ts.len(), 8);
        assert_eq!(ep.transitions_for(MetaObjective::Weighted), paper);
        let prices = aware_mdp::Prices::default();
        for (t, p) in ts.iter().zip(&paper) {
            assert_eq!(
                (&t.state, &t.action, &t.next_state),
                (&p.state, &p.action, &p.next_state)
            );
            assert!((0.0..=2.0).contains(&t.reward), "{}", t.reward);
        }
        assert_ne!(
            ts.iter().map(|t| t.reward).collect::<Vec<_>>(),
            paper.iter().map(|t| t.reward).collect::<Vec<_>>()
        );
        let mean = ts.iter().map(|t| f64::from(t.reward)).sum::<f64>() / 8.0;
        assert!((ep.score(MetaObjective::Constrained) - mean).abs() < 1e-5);
        assert_eq!(ep.score(MetaObjective::Weighted), ep.reward);
        // The whole bound range and a violation: the lowest reward; nothing and no violation:
        // the highest.
        let max = aware_loadgen::Allocation {
            replicas: app.bounds.max_replicas,
            cpu_millicores: app.bounds.max_cpu_millicores,
            memory_bytes: app.bounds.max_memory_bytes,
        };
        let cost = prices.cost_fraction(&max, &app.bounds).unwrap();
        assert_eq!(aware_mdp::constrained_reward(1.0, cost, true), 0.0);
        // An episode kept before the objective existed: the paper's reward stands in.
        let mut old = serde_json::to_value(&ep).unwrap();
        old.as_object_mut().unwrap().remove("constrained");
        let old: Episode = serde_json::from_value(old).unwrap();
        assert_eq!(old.transitions_for(MetaObjective::Constrained), paper);
        assert_eq!(old.score(MetaObjective::Constrained), ep.reward);
        // A weighted training's options serialize as before the option existed.
        let w = TrainMetaOptions {
            objective: MetaObjective::Weighted,
            ..TrainMetaOptions::default()
        };
        let v = serde_json::to_value(&w).unwrap();
        assert!(v.get("objective").is_none());
        assert_eq!(serde_json::from_value::<TrainMetaOptions>(v).unwrap(), w);
        let c = serde_json::to_value(TrainMetaOptions {
            objective: MetaObjective::Constrained,
            ..TrainMetaOptions::default()
        })
        .unwrap();
        assert_eq!(c["objective"], "constrained");
    }

    #[test]
    fn episodes_rebuild_their_transitions() {
        let app = &generate_apps(1, 1, &GeneratorOptions::default())[0];
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let ep = run_episode(app, 5, 1, Driver::Fallback, &mut rng).unwrap();
        let ts = ep.transitions();
        assert_eq!(ts.len(), 5);
        assert_eq!(ts[0].next_state, ts[1].state);
        assert_eq!(ts[4].next_state, ep.last_state);
        let mean_r = ts.iter().map(|t| f64::from(t.reward)).sum::<f64>() / 5.0;
        assert!((mean_r - ep.reward).abs() < 1e-5);
        assert!(ep.fallback);
        let mut store = Vec::new();
        for r in [0.5, 0.9, 0.1] {
            keep_top(
                &mut store,
                Episode {
                    reward: r,
                    ..ep.clone()
                },
                2,
            );
        }
        assert_eq!(
            store.iter().map(|e| e.reward).collect::<Vec<_>>(),
            [0.9, 0.5]
        );
    }

    #[test]
    fn short_training_writes_outputs_and_resumes() {
        let dir = std::env::temp_dir().join(format!("aware-train-meta-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let opts = TrainMetaOptions {
            apps: 5,
            iterations: 3,
            seed: 2,
            ..short_training(dir.clone())
        };
        let log = run(&opts).unwrap();
        assert_eq!(log.iterations.len(), 3);
        assert_eq!(log.held_out.len(), 1);
        for f in [
            "meta.ckpt",
            "base.ckpt",
            "split.json",
            "train-log.json",
            "apps.json",
        ] {
            assert!(dir.join(f).exists(), "{f}");
        }
        assert!(dir.join(LAST_DIR).join("base.ckpt").exists());
        let vit = |l: &TrainLog| {
            l.validations
                .iter()
                .map(|v| v.iteration)
                .collect::<Vec<_>>()
        };
        assert_eq!(vit(&log), [2, 3]);
        let best_of = |l: &TrainLog| {
            l.validations
                .iter()
                .max_by(|a, b| a.agent_mean.total_cmp(&b.agent_mean))
                .unwrap()
                .clone()
        };
        assert_eq!(log.best_iteration, best_of(&log).iteration);
        assert_eq!(log.held_out_agent_mean, best_of(&log).agent_mean);
        let split: Split = read_json(&dir.join("split.json")).unwrap();
        assert_eq!((split.train.len(), split.held_out.len()), (4, 1));
        let agent = load_agent(&dir).unwrap();
        assert_eq!(agent.base().config().state_dim, STATE_DIM + 4);
        assert_eq!(agent.base().config().noise.sigma, opts.fine_tune_sigma);
        // Resume to 5 iterations.
        let more = TrainMetaOptions {
            iterations: 5,
            resume: true,
            ..opts.clone()
        };
        let log2 = run(&more).unwrap();
        assert_eq!(log2.iterations.len(), 5);
        let its = |l: &TrainLog| l.iterations.iter().map(|i| i.iteration).collect::<Vec<_>>();
        assert_eq!(its(&log2), [0, 1, 2, 3, 4]);
        assert_eq!(its(&log), [0, 1, 2]);
        assert_eq!(vit(&log2), [2, 3, 4, 5]);
        assert_eq!(log2.best_iteration, best_of(&log2).iteration);
        // Resuming with another seed is refused.
        let other = TrainMetaOptions { seed: 3, ..more };
        assert!(run(&other).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn restarts_share_the_pool_differ_in_training_and_keep_the_best_validated() {
        let root = std::env::temp_dir().join(format!("aware-train-meta-rs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let opts = TrainMetaOptions {
            apps: 10,
            iterations: 4,
            seed: 7,
            base_updates_per_iteration: 2,
            ..short_training(root.join("single"))
        };
        let single = run(&opts).unwrap();
        let multi_dir = root.join("multi");
        let multi = TrainMetaOptions {
            out: multi_dir.clone(),
            restarts: 3,
            ..opts.clone()
        };
        let log = run(&multi).unwrap();
        let bytes = |p: &Path| std::fs::read(p).unwrap();
        // Restart 0 is the single training, seed for seed.
        assert_eq!(
            bytes(&restart_dir(&multi_dir, 0).join("base.ckpt")),
            bytes(&opts.out.join("base.ckpt"))
        );
        assert_eq!(log.restarts.len(), 3);
        assert_eq!(
            log.restarts[0].held_out_agent_mean,
            single.held_out_agent_mean
        );
        // The others train differently on the same pool and split, validated on the same
        // episodes: the fallback's reward is the same, the agents' differ.
        let split = |d: &Path| read_json::<Split>(&d.join("split.json")).unwrap();
        for r in 1..3 {
            let d = restart_dir(&multi_dir, r);
            assert_eq!(split(&d), split(&opts.out));
            assert_ne!(
                bytes(&d.join("base.ckpt")),
                bytes(&opts.out.join("base.ckpt"))
            );
            assert_eq!(
                log.restarts[r as usize].held_out_fallback_mean,
                single.held_out_fallback_mean
            );
        }
        let means: Vec<f64> = log.restarts.iter().map(|r| r.held_out_agent_mean).collect();
        assert!(
            means.iter().any(|&m| m != means[0]),
            "restarts must differ: {means:?}"
        );
        // The output is the best-validated restart's agent, and the log says so.
        let best = (0..3)
            .max_by(|&a, &b| means[a].total_cmp(&means[b]))
            .unwrap();
        assert_eq!(log.kept_restart, best as u64);
        assert_eq!(log.held_out_agent_mean, means[best]);
        let kept = restart_dir(&multi_dir, best as u64);
        for f in ["base.ckpt", "meta.ckpt"] {
            assert_eq!(bytes(&multi_dir.join(f)), bytes(&kept.join(f)), "{f}");
        }
        assert_eq!(split(&multi_dir), split(&opts.out));
        let on_disk: TrainLog = read_json(&multi_dir.join("train-log.json")).unwrap();
        assert_eq!(on_disk.kept_restart, log.kept_restart);
        assert_eq!(on_disk.options.restarts, 3);
        load_agent(&multi_dir).unwrap();
        // Resuming every restart to 6 iterations continues each from its own checkpoint.
        let more = TrainMetaOptions {
            iterations: 6,
            resume: true,
            ..multi.clone()
        };
        let log2 = run(&more).unwrap();
        assert_eq!(log2.restarts.len(), 3);
        for r in 0..3 {
            let l: TrainLog =
                read_json(&restart_dir(&multi_dir, r).join("train-log.json")).unwrap();
            assert_eq!(l.iterations.len(), 6);
        }
        assert!(log2.held_out_agent_mean >= log.held_out_agent_mean);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_kept_agent_is_the_best_validated_and_last_holds_the_latest() {
        let dir =
            std::env::temp_dir().join(format!("aware-train-meta-keep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let opts = TrainMetaOptions {
            apps: 10,
            seed: 5,
            out: dir.clone(),
            steps_per_episode: 8,
            meta: tiny_meta(),
            base_hidden: vec![8, 8],
            progress_every: 0,
            ..TrainMetaOptions::default()
        };
        let (apps, split) = pool(&opts);
        let held: Vec<&AppSpec> = apps
            .iter()
            .filter(|a| split.held_out.contains(&a.name))
            .collect();
        assert_eq!(held.len(), 2);
        // Two differently initialised agents; the better-validated one goes first.
        let mut agents: Vec<(f64, MetaDdpg)> = [1u64, 2, 3]
            .iter()
            .map(|&seed| {
                let mut a = new_agent(&TrainMetaOptions {
                    seed,
                    ..opts.clone()
                })
                .unwrap();
                let score = held_out_means(&validate(&mut a, &held, &opts).unwrap()).1;
                (score, a)
            })
            .collect();
        agents.sort_by(|a, b| b.0.total_cmp(&a.0));
        assert!(
            agents[0].0 > agents[2].0,
            "the seeds must give different scores"
        );
        let (best_score, mut best) = agents.remove(0);
        let (worse_score, mut worse) = agents.pop().unwrap();
        let mut log = TrainLog {
            options: opts.clone(),
            iterations: Vec::new(),
            train_seconds: 0.0,
            meta_params: 0,
            held_out: Vec::new(),
            held_out_fallback_mean: 0.0,
            held_out_agent_mean: 0.0,
            validations: Vec::new(),
            best_iteration: 0,
            restarts: Vec::new(),
            kept_restart: 0,
        };
        let state = |iteration| ResumeState {
            iteration,
            episodes: Vec::new(),
        };
        checkpoint(&dir, &mut best, &state(25), &mut log, &held, &opts).unwrap();
        checkpoint(&dir, &mut worse, &state(50), &mut log, &held, &opts).unwrap();
        assert_eq!(log.best_iteration, 25);
        assert_eq!(
            log.validations
                .iter()
                .map(|v| (v.iteration, v.agent_mean))
                .collect::<Vec<_>>(),
            [(25, best_score), (50, worse_score)]
        );
        let score_of = |d: &Path| {
            let mut a = load_agent(d).unwrap();
            held_out_means(&validate(&mut a, &held, &opts).unwrap()).1
        };
        assert_eq!(
            score_of(&dir),
            best_score,
            "out/ must keep the best-validated agent"
        );
        assert_eq!(
            score_of(&dir.join(LAST_DIR)),
            worse_score,
            "last/ holds the latest"
        );
        let logged: TrainLog = read_json(&dir.join("train-log.json")).unwrap();
        assert_eq!(logged.best_iteration, 25);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
