//! The base-learner's training (issue [rl-agent] items 2–4, the learner half of the actor–learner
//! split): one [`Learner`] per target trains a DDPG from minibatches drawn from the trajectory
//! store and writes versioned checkpoints to the model store. While the target is OFFLINE a round
//! is *offline* (TD3+BC on the fallback's transitions, then the off-policy estimate of the policy
//! on the target's recent fallback episodes); while ONLINE it is plain DDPG (with a BC term that
//! decays over the first `online_bc_rounds` rounds after a promotion, none while retraining);
//! SERVING does not train. One network per
//! target runs through every stage, so checkpoints and versions continue across stage changes.
//! Everything here is synchronous (store I/O and gradient steps); the service runs it on the
//! blocking pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aware_bus_schemas::{DecisionSource, Stage, Target};
use aware_shared::config::stable_hash;
use aware_shared::model_store::{
    model_key, model_prefix, version_of_key, ModelStore, ModelStoreError, StoredObject,
};
use aware_shared::spec::Bounds;
use aware_shared_model::{
    Batch, BcConfig, Ddpg, DdpgConfig, ModelError, PolicyEstimate, Transition, ACTION_DIM,
};
use aware_stores::trajectory::{self as tstore, StoreError, TrajectoryStore};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// The model kind in keys and `model` messages.
pub const BASE_LEARNER: &str = "base_learner";

/// The `[trainer]` configuration section.
///
/// The default network is 64-64 (the AWARE artifact's size): on a CPU it trains about ten times
/// faster than 256-256, so the trainer keeps up with many targets
/// (docs/adr/0005-network-width-64.md, docs/benchmarks/model.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerConfig {
    /// Hidden layer widths of the actor and the critic.
    pub hidden: Vec<usize>,
    /// Train when this many transitions arrived since the last round …
    pub train_every_transitions: u64,
    /// … or when this much time passed since the last round and some arrived (0: never by time);
    /// such a round makes steps in proportion to what arrived ([`Learner::round_steps`]).
    pub train_every_ms: u64,
    /// Gradient steps per full round.
    pub gradient_steps: usize,
    /// Rounds that run at once (0: one per core of the machine); the others wait their turn
    /// (`aware_trainer_rounds_waiting`).
    pub workers: usize,
    /// Gradient steps per ONLINE round while the target retrains (ONLINE entered from SERVING:
    /// Algorithm 1's trigger), so a converged policy catches up with a changed workload sooner.
    /// Default 200: 4 per transition at the default `retrain_every_transitions`
    /// (docs/adr/0006-retraining-defaults.md).
    pub retrain_gradient_steps: usize,
    /// While the target retrains, train when this many transitions arrived since the last round
    /// (instead of `train_every_transitions`): the recommenders act with weights at most this
    /// many transitions old while the workload they learn has changed. Default 50
    /// (docs/adr/0006-retraining-defaults.md; first learning keeps `train_every_transitions`).
    pub retrain_every_transitions: u64,
    /// Minibatch size (paper Table 2: 64).
    pub batch_size: usize,
    /// No training before the target has this many transitions.
    pub min_transitions: u64,
    /// How soon after an event a target's actor looks whether it should check the store (events
    /// in between are looked at together): it does when the recorder announced a stored episode
    /// (`episode`), the stage changed or a round failed since the last check. Without events it
    /// looks only when the last check is `recheck_ms` old.
    pub poll_ms: u64,
    /// A store check at least this often without any event (rows stored without an `episode`,
    /// a lost message, the `train_every_ms` time trigger).
    pub recheck_ms: u64,
    /// Seed of weight initialisation and minibatch sampling (mixed with the target's hash).
    pub seed: u64,
    /// OFFLINE: gradient steps per offline (TD3+BC) round.
    pub offline_gradient_steps: usize,
    /// OFFLINE: no offline round before the target has this many fallback transitions.
    pub offline_min_transitions: u64,
    /// TD3+BC λ: weight of the normalised Q term against the BC term (Fujimoto & Gu: 2.5).
    pub bc_alpha: f32,
    /// TD3+BC target policy smoothing σ (0: off) and its clip.
    pub bc_policy_noise: f32,
    pub bc_noise_clip: f32,
    /// ONLINE: the BC term's weight falls linearly from 1 to 0 over this many online rounds
    /// after each OFFLINE → ONLINE (0: plain DDPG from the first online round). Retraining
    /// (ONLINE entered from SERVING) is plain DDPG whatever this says: the policy left the
    /// fallback's data long ago, and cloning its own past actions would hold it in the old regime.
    pub online_bc_rounds: u32,
    /// The off-policy estimate is computed on the fallback transitions of the target's last
    /// `eval_episodes` recorded episodes (at most `eval_max_rows` of them, the newest).
    pub eval_episodes: usize,
    pub eval_max_rows: usize,
    /// σ of the Gaussian exploration noise the recommenders add while ONLINE (paper Table 2:
    /// 0.2); stored in the checkpoint, so it applies to networks created after a change.
    pub exploration_sigma: f32,
    /// Meta-learning: an `aware train-meta` output directory (`meta.ckpt`, `base.ckpt`); every
    /// target's base-learner starts from `base.ckpt` and is conditioned on the target's
    /// embedding (see [`crate::embedding`]). Empty: no meta-learning. With it, `hidden` and
    /// `exploration_sigma` are `base.ckpt`'s.
    pub meta_dir: String,
    /// Meta-learning: the embedding is recomputed after this many new recorded episodes.
    pub embedding_refresh_episodes: usize,
    /// ONLINE: share of each round's minibatch rows drawn from the target's last
    /// `recent_episodes` episodes (recency-mixed replay, so after a workload change the new
    /// regime's transitions are not drowned by the old ones); the rest uniformly from its whole
    /// history. 0: uniform only (the paper's replay). OFFLINE rounds always sample uniformly.
    /// Default 0.5 of the last 20 episodes.
    pub recent_fraction: f32,
    pub recent_episodes: usize,
    /// Which action a recorded row trains with ([`LearnAction`]): what was asked for (`intent`:
    /// an RL row's raw action, a fallback row's desired allocation; the paper's replay) or the
    /// allocation the actuator applied, expressed in the policy's action space (`applied`). They
    /// differ when a guardrail held or limited the request (a cooldown, a step limit, the minimum
    /// change, recommend-only).
    pub learn_action: LearnAction,
    /// Retention: base-learner versions kept per target in the model store, the newest ones
    /// (0: keep every version). Older versions are deleted after each round and rollback, and
    /// when the target goes SERVING; never while it retrains, so the version a rollback returns
    /// to (the one in force at the trigger) survives however long the retraining lasts and a
    /// trainer restart during it.
    pub keep_versions: u64,
    /// How long a deleted target's checkpoints are kept after its deregistration (its
    /// `AwareAutoscaler` deleted and not created again), in seconds (0: for ever); then they are
    /// deleted from the model store and the target's actor stops.
    pub forget_after_secs: u64,
    /// A failed round (a full or unreachable model store, a store error, non-finite training)
    /// is tried again after `poll_ms` × 2^failures in a row, at most this long (ms); the first
    /// round that succeeds resets it.
    pub retry_max_delay_ms: u64,
    /// Networks kept in memory between their targets' rounds, across the process; a target
    /// beyond them drops its network after each round and reads it back from its checkpoint at
    /// the next (the same training, one checkpoint read more per round). Bounds the trainer's
    /// memory at this many networks plus one per worker; 0: none kept
    /// (docs/benchmarks/scale.md#learning).
    pub held_networks: usize,
}

/// The action a recorded row trains with (`trainer.learn_action`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LearnAction {
    /// An RL row's raw action, a fallback row's desired allocation: what the policy asked for.
    #[default]
    Intent,
    /// The allocation in force after the step (`applied`) for every row: what the workload ran
    /// with, so Q(s, a) is fitted to the action that produced the reward and the next state.
    Applied,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            hidden: vec![64, 64],
            train_every_transitions: 200,
            train_every_ms: 30_000,
            gradient_steps: 200,
            workers: 0,
            retrain_gradient_steps: 200,
            retrain_every_transitions: 50,
            batch_size: 64,
            min_transitions: 64,
            poll_ms: 500,
            recheck_ms: 30_000,
            seed: 0,
            offline_gradient_steps: 500,
            offline_min_transitions: 300,
            bc_alpha: 2.5,
            bc_policy_noise: 0.2,
            bc_noise_clip: 0.5,
            online_bc_rounds: 20,
            eval_episodes: 5,
            eval_max_rows: 4_000,
            exploration_sigma: 0.2,
            meta_dir: String::new(),
            embedding_refresh_episodes: 5,
            recent_fraction: 0.5,
            recent_episodes: 20,
            learn_action: LearnAction::Intent,
            keep_versions: 10,
            forget_after_secs: 7 * 24 * 3600,
            retry_max_delay_ms: 300_000,
            held_networks: 2_000,
        }
    }
}

/// Errors of the trainer; each names the target or the setting.
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    #[error("trainer.{key}: {reason}")]
    Config { key: &'static str, reason: String },
    #[error("{target}: trajectory store: {source}")]
    Store {
        target: Target,
        #[source]
        source: Box<StoreError>,
    },
    #[error("{target}: model store: {source}")]
    ModelStore {
        target: Target,
        #[source]
        source: ModelStoreError,
    },
    #[error("{target}: model: {source}")]
    Model {
        target: Target,
        #[source]
        source: ModelError,
    },
    /// A stored checkpoint has another state width than the learner's inputs.
    #[error("{target}: model version {version} has {has} inputs, the learner {want}")]
    Width {
        target: Target,
        version: u64,
        has: usize,
        want: usize,
    },
    /// The service is shutting down: the round stopped between two gradient steps.
    #[error("{target}: round cancelled (shutting down)")]
    Cancelled { target: Target },
}

impl TrainerConfig {
    /// The base-learner configuration for `state_dim` inputs and a target's seed.
    pub fn ddpg_config(&self, state_dim: usize, target: &Target) -> DdpgConfig {
        let mut c = DdpgConfig::with_hidden(state_dim, &self.hidden);
        c.seed = self.seed ^ stable_hash(&target.key());
        c.noise.sigma = self.exploration_sigma;
        c
    }

    /// The TD3+BC settings with BC weight `w`.
    pub fn bc(&self, w: f32) -> BcConfig {
        BcConfig {
            alpha: self.bc_alpha,
            bc_weight: w,
            policy_noise: self.bc_policy_noise,
            noise_clip: self.bc_noise_clip,
        }
    }

    /// Checks ranges; errors name the key.
    pub fn validate(&self) -> Result<(), TrainerError> {
        let bad = |key, reason: &str| {
            Err(TrainerError::Config {
                key,
                reason: reason.to_string(),
            })
        };
        if let Err(e) = self
            .ddpg_config(aware_mdp::STATE_DIM, &Target::new("a", "b"))
            .validate()
        {
            return bad("hidden", &e.to_string());
        }
        if self.train_every_transitions == 0 {
            return bad("train_every_transitions", "must be at least 1");
        }
        if self.retrain_every_transitions == 0 {
            return bad("retrain_every_transitions", "must be at least 1");
        }
        if !(1..=1_000_000).contains(&self.gradient_steps) {
            return bad("gradient_steps", "must be in 1..=1000000");
        }
        if !(1..=1_000_000).contains(&self.retrain_gradient_steps) {
            return bad("retrain_gradient_steps", "must be in 1..=1000000");
        }
        if !(1..=65_536).contains(&self.batch_size) {
            return bad("batch_size", "must be in 1..=65536");
        }
        if self.poll_ms < 10 {
            return bad("poll_ms", "must be at least 10");
        }
        if self.retry_max_delay_ms < self.poll_ms {
            return bad("retry_max_delay_ms", "must be at least poll_ms");
        }
        if self.recheck_ms < self.poll_ms {
            return bad("recheck_ms", "must be at least poll_ms");
        }
        if !(1..=1_000_000).contains(&self.offline_gradient_steps) {
            return bad("offline_gradient_steps", "must be in 1..=1000000");
        }
        for (key, v) in [
            ("bc_alpha", self.bc_alpha),
            ("bc_policy_noise", self.bc_policy_noise),
            ("bc_noise_clip", self.bc_noise_clip),
        ] {
            if !(v.is_finite() && (0.0..=100.0).contains(&v)) {
                return bad(key, "must be finite and in [0, 100]");
            }
        }
        if self.bc_policy_noise > 0.0 && self.bc_noise_clip == 0.0 {
            return bad("bc_noise_clip", "must be > 0 when bc_policy_noise > 0");
        }
        if !(1..=1_000).contains(&self.eval_episodes) {
            return bad("eval_episodes", "must be in 1..=1000");
        }
        if !(self.exploration_sigma.is_finite() && (0.0..=2.0).contains(&self.exploration_sigma)) {
            return bad("exploration_sigma", "must be in [0, 2]");
        }
        if !(1..=1_000_000).contains(&self.eval_max_rows) {
            return bad("eval_max_rows", "must be in 1..=1000000");
        }
        if !(1..=1_000_000).contains(&self.embedding_refresh_episodes) {
            return bad("embedding_refresh_episodes", "must be in 1..=1000000");
        }
        if !(self.recent_fraction.is_finite() && (0.0..=1.0).contains(&self.recent_fraction)) {
            return bad("recent_fraction", "must be in [0, 1]");
        }
        if !(1..=100_000).contains(&self.recent_episodes) {
            return bad("recent_episodes", "must be in 1..=100000");
        }
        if self.held_networks > 10_000_000 {
            return bad("held_networks", "must be in 0..=10000000");
        }
        if self.keep_versions > 1_000_000 {
            return bad(
                "keep_versions",
                "must be in 0..=1000000 (0: keep every version)",
            );
        }
        Ok(())
    }
}

/// What the learner keeps in its network's checkpoint ([`Ddpg::set_learner_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct LearnerState {
    /// The constrained objective's multiplier.
    multiplier: aware_mdp::Multiplier,
}

/// A checkpoint written to the model store.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    pub version: u64,
    pub object: StoredObject,
    pub trained_steps: u64,
    /// Gradient steps of this round.
    pub steps: usize,
    /// The latest (episode, step) among the round's minibatches.
    pub latest: (u64, u32),
    pub critic_loss: f32,
    /// Rows skipped because they could not be turned into a training transition (or, in an
    /// offline round, were not the fallback's).
    pub skipped: usize,
    /// Of `skipped`: rows refused for a non-finite value (state, next state, reward, action).
    pub non_finite: usize,
    /// Which kind of round produced it.
    pub mode: RoundMode,
    /// Offline rounds: the off-policy estimate of the policy on the target's recent fallback
    /// transitions (`None` when there were none to evaluate on).
    pub estimate: Option<PolicyEstimate>,
    /// The BC weight used (1 offline, decaying online, 0 for plain DDPG).
    pub bc_weight: f32,
}

/// What a round trains with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundMode {
    /// TD3+BC on the fallback's transitions (OFFLINE).
    Offline,
    /// DDPG on every transition, with a decaying BC term (ONLINE).
    Online,
}

impl RoundMode {
    /// The round kind of a stage; `None`: no training.
    pub fn of(stage: Stage) -> Option<Self> {
        match stage {
            Stage::Offline => Some(RoundMode::Offline),
            Stage::Online => Some(RoundMode::Online),
            Stage::Initialized | Stage::Serving => None,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            RoundMode::Offline => "offline",
            RoundMode::Online => "online",
        }
    }
}

/// The networks a trainer keeps in memory between rounds (`trainer.held_networks`), shared by
/// its learners: a learner takes a place after a round while there is one and keeps it until
/// it releases its network. Targets beyond the bound train the same, reading their network
/// back from its checkpoint each round.
#[derive(Debug, Clone)]
pub struct NetworkBudget {
    held: Arc<AtomicUsize>,
    cap: usize,
}

impl NetworkBudget {
    pub fn new(cap: usize) -> Self {
        NetworkBudget {
            held: Arc::new(AtomicUsize::new(0)),
            cap,
        }
    }

    /// Networks kept now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    fn try_hold(&self) -> Option<HeldNetwork> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()
            .map(|_| HeldNetwork(self.held.clone()))
    }
}

/// A learner's place in its [`NetworkBudget`], given back when dropped.
#[derive(Debug)]
struct HeldNetwork(Arc<AtomicUsize>);

impl Drop for HeldNetwork {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The training state of one target.
pub struct Learner {
    target: Target,
    bounds: Bounds,
    cfg: TrainerConfig,
    ddpg: Option<Ddpg>,
    /// Last published (or found in the model store) version.
    version: u64,
    trained_at: u64,
    /// Rows recorded for the target as this learner counted them (see [`Learner::poll_rows`]),
    /// and the position of the newest.
    polled: u64,
    polled_through: Option<(u64, u32)>,
    last_round: Option<Instant>,
    rounds: u64,
    /// The mode of the last round and the online rounds since the last OFFLINE → ONLINE.
    last_mode: Option<RoundMode>,
    online_rounds: u32,
    /// Meta-learning: the starting point and the embedding appended to every state.
    conditioning: Option<crate::embedding::Conditioning>,
    /// The recorded states' width ([`aware_mdp::state_width`]): rows of another width (recorded
    /// before `learning.mean_field` changed) are not trained on.
    width: usize,
    /// Cancelled at shutdown: a running round stops between two gradient steps, so the process
    /// exits promptly instead of waiting for the blocking pool.
    cancel: Option<tokio_util::sync::CancellationToken>,
    /// ONLINE entered from SERVING: online rounds come every `retrain_every_transitions` and
    /// take `retrain_gradient_steps`.
    retraining: bool,
    /// The newest recorded row whose state the normalizer has seen (`None`: none yet).
    observed: Option<(u64, u32)>,
    /// The network was resumed from the target's checkpoint, whose normalizer has seen the
    /// history recorded so far: the next read only marks it as seen.
    history_seen: bool,
    /// The network was dropped from memory ([`Learner::release_network`]); the next round
    /// resumes it from its newest checkpoint.
    released: bool,
    /// The process's networks kept between rounds (`trainer.held_networks`; `None`: no bound),
    /// and this learner's place among them while it keeps its network.
    budget: Option<NetworkBudget>,
    held: Option<HeldNetwork>,
    /// Counts networks read back from their checkpoint after a release.
    reloads: Option<prometheus::IntCounter>,
    /// Retention: every base-learner version below this one is deleted (`None`: not known
    /// yet; the first pass lists the store, later passes delete by version without listing).
    pruned_below: Option<u64>,
    /// Rounds failed in a row, and when the next may start (see `retry_max_delay_ms`).
    failures: u32,
    retry_at: Option<Instant>,
    /// Counts stored checkpoints that cannot be read (corrupt or truncated) when resuming.
    corrupt: Option<prometheus::IntCounter>,
    /// What the rounds maximize (`learning.objective`) and the target's SLO, whose objective is
    /// the constrained mode's budget.
    objective: aware_mdp::Objective,
    slo: aware_mdp::Slo,
}

impl Learner {
    pub fn new(target: Target, bounds: Bounds, cfg: TrainerConfig) -> Self {
        Learner {
            target,
            bounds,
            cfg,
            ddpg: None,
            version: 0,
            trained_at: 0,
            polled: 0,
            polled_through: None,
            last_round: None,
            rounds: 0,
            last_mode: None,
            online_rounds: 0,
            conditioning: None,
            width: aware_mdp::STATE_DIM,
            cancel: None,
            retraining: false,
            observed: None,
            history_seen: false,
            released: false,
            budget: None,
            held: None,
            reloads: None,
            pruned_below: None,
            failures: 0,
            retry_at: None,
            corrupt: None,
            objective: aware_mdp::Objective::default(),
            slo: aware_mdp::Slo::default(),
        }
    }

    /// Sets what the rounds maximize and the target's SLO (default: the default objective and
    /// no SLO, so the recorded reward).
    pub fn set_objective(&mut self, objective: aware_mdp::Objective, slo: aware_mdp::Slo) {
        self.objective = objective;
        self.slo = slo;
    }

    /// Sets the recorded states' width (default [`aware_mdp::STATE_DIM`]; wider with
    /// `learning.mean_field`).
    pub fn set_state_width(&mut self, width: usize) {
        self.width = width;
    }

    /// Whether rounds train on the constrained objective's reward: its mode is set and the
    /// target has an SLO to keep (a best-effort target has no budget to spend: it keeps the
    /// recorded weighted reward).
    fn constrained(&self) -> bool {
        self.objective.mode == aware_mdp::ObjectiveMode::Constrained && self.slo.is_set()
    }

    /// The constrained objective's multiplier λ, advanced by the target's finished episodes
    /// recorded since the network's checkpoint last saw one (the last `recent_episodes`), and
    /// kept in the network, so that it is saved, resumed and rolled back with the checkpoint
    /// whose critic learned under it. `None` in weighted mode.
    fn advance_multiplier(
        &mut self,
        store: &dyn TrajectoryStore,
        models: &dyn ModelStore,
    ) -> Result<Option<f64>, TrainerError> {
        if !self.constrained() {
            return Ok(None);
        }
        let cfg = self.objective.multiplier;
        let objective = self.slo.objective();
        let episodes = store
            .episodes(&self.target, self.cfg.recent_episodes)
            .map_err(|e| self.store_err(e))?;
        let target = self.target.clone();
        let ddpg = self.ddpg(models)?;
        let mut m = ddpg
            .learner_state()
            .and_then(|v| serde_json::from_value::<LearnerState>(v.clone()).ok())
            .map_or_else(|| aware_mdp::Multiplier::new(&cfg), |s| s.multiplier);
        let before = m.lambda;
        for e in &episodes {
            m.observe(&cfg, e.episode, e.slo_violations, e.steps, objective);
        }
        let state = serde_json::to_value(LearnerState { multiplier: m }).ok();
        ddpg.set_learner_state(state);
        if m.lambda != before {
            tracing::debug!(target = %target, from = before, to = m.lambda, through_episode = ?m.through_episode, "multiplier moved");
        }
        Ok(Some(m.lambda))
    }

    /// A stored row as a training transition ([`to_training`]), conditioned on the embedding;
    /// with a multiplier (constrained mode), its reward is [`aware_mdp::constrained_reward`] of
    /// the row's requested cost and violation instead of the recorded one.
    fn training_row(&self, r: &tstore::Transition, lambda: Option<f64>) -> Option<Transition> {
        let mut t = to_training(r, &self.bounds, self.cfg.learn_action, self.width)?;
        if let (Some(l), true) = (lambda, self.constrained()) {
            let cost = self
                .objective
                .prices
                .cost_fraction(&r.applied, &self.bounds)?;
            t.reward = aware_mdp::constrained_reward(l, cost, r.slo_violation) as f32;
        }
        Some(self.conditioned(t))
    }

    /// Where unreadable checkpoints met while resuming are counted.
    pub fn set_corrupt_counter(&mut self, c: prometheus::IntCounter) {
        self.corrupt = Some(c);
    }

    /// How long after the `failures`-th failed round in a row the next may start:
    /// `poll_ms` × 2^failures, at most `retry_max_delay_ms`.
    pub fn retry_delay(&self, failures: u32) -> Duration {
        let exp = failures.min(30);
        Duration::from_millis(
            self.cfg
                .poll_ms
                .saturating_mul(1u64 << exp)
                .min(self.cfg.retry_max_delay_ms),
        )
    }

    /// Rounds failed in a row (0 after a round that succeeded).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Whether the target retrains (ONLINE entered from SERVING, see
    /// `aware_bus_schemas::Lifecycle::retraining`): its online rounds then come every
    /// `retrain_every_transitions` instead of `train_every_transitions` and take
    /// `retrain_gradient_steps` instead of `gradient_steps`, without a BC term.
    pub fn set_retraining(&mut self, on: bool) {
        self.retraining = on;
    }

    /// Rounds stop early once `token` is cancelled (the service's shutdown token).
    pub fn set_cancel(&mut self, token: tokio_util::sync::CancellationToken) {
        self.cancel = Some(token);
    }

    /// Meta-learning: the network starts from `c.base` (unless the model store holds a
    /// checkpoint of the same width) and every transition gets `c.embedding` appended to its
    /// state and next state, held fixed for a round.
    pub fn set_conditioning(&mut self, c: crate::embedding::Conditioning) {
        self.conditioning = Some(c);
    }

    /// The conditioning in force.
    pub fn conditioning(&self) -> Option<&crate::embedding::Conditioning> {
        self.conditioning.as_ref()
    }

    /// Whether the network exists yet, in memory or released to the model store (its width is
    /// fixed from then on).
    pub fn has_network(&self) -> bool {
        self.ddpg.is_some() || self.released
    }

    /// Drops the network from memory, and its place in the budget (a SERVING target, which
    /// does not train; a target beyond `held_networks` after each round): every round's
    /// checkpoint holds all of it (weights, optimizer, normalizer, multiplier), so the next
    /// round resumes from the newest one and goes on as if it had been kept.
    pub fn release_network(&mut self) {
        self.held = None;
        if self.ddpg.take().is_some() {
            self.released = true;
        }
    }

    /// Bounds the networks kept between rounds by `budget`: after each round a network without a
    /// place in it is released.
    pub fn set_budget(&mut self, budget: NetworkBudget) {
        self.budget = Some(budget);
    }

    /// Networks kept now across the learners of the budget (`None`: no budget).
    pub fn networks_held(&self) -> Option<usize> {
        self.budget.as_ref().map(NetworkBudget::held)
    }

    /// Where reads of a released network's checkpoint are counted.
    pub fn set_reload_counter(&mut self, c: prometheus::IntCounter) {
        self.reloads = Some(c);
    }

    /// After every round and rollback, published or failed: the network stays in memory while
    /// the budget has room for it, else it is released and the next round reads back its newest
    /// checkpoint (after a published round, the whole network; after a failed one, the network
    /// before it, from which the round is redone, so an outage of the model store does not keep
    /// every target's network in memory).
    fn settle(&mut self) {
        let Some(budget) = &self.budget else {
            return;
        };
        if self.ddpg.is_none() {
            self.held = None;
            return;
        }
        if self.held.is_none() {
            self.held = budget.try_hold();
        }
        if self.held.is_none() {
            self.release_network();
        }
    }

    /// The network's input width: the state, plus the embedding when conditioned.
    pub fn state_dim(&self) -> usize {
        self.width + self.conditioning.as_ref().map_or(0, |c| c.embedding.len())
    }

    fn conditioned(&self, t: Transition) -> Transition {
        match &self.conditioning {
            Some(c) => crate::embedding::append_embedding(t, &c.embedding),
            None => t,
        }
    }

    /// The last version published or found.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether a round is due with `count` transitions in the store at `now` (online rounds).
    pub fn due(&self, count: u64, now: Instant) -> bool {
        self.due_with(count, self.cfg.min_transitions, now)
    }

    fn due_with(&self, count: u64, min: u64, now: Instant) -> bool {
        if count < min.max(1) || count <= self.trained_at {
            return false;
        }
        let every = if self.retraining {
            self.cfg.retrain_every_transitions
        } else {
            self.cfg.train_every_transitions
        };
        // The first round comes as soon as the data is there ("data ready"); later ones after
        // `every` new transitions or, with some, `train_every_ms` after the last round.
        if self.last_round.is_none() || count - self.trained_at >= every {
            return true;
        }
        self.cfg.train_every_ms > 0
            && self.last_round.is_some_and(|t| {
                now.duration_since(t) >= Duration::from_millis(self.cfg.train_every_ms)
            })
    }

    /// Runs one online round if one is due (see [`Learner::maybe_train_in`]).
    pub fn maybe_train(
        &mut self,
        store: &dyn TrajectoryStore,
        models: &dyn ModelStore,
    ) -> Result<Option<Published>, TrainerError> {
        self.maybe_train_in(Stage::Online, store, models)
    }

    /// Runs one round of the kind `stage` calls for, if one is due: samples minibatches,
    /// trains, (offline) evaluates, writes the checkpoint. INITIALIZED and SERVING: nothing.
    ///
    /// After a failed round the next waits [`Learner::retry_delay`] (growing with the failures
    /// in a row), so a model store that stays full or unreachable is not hammered with rounds
    /// whose gradient steps are thrown away.
    pub fn maybe_train_in(
        &mut self,
        stage: Stage,
        store: &dyn TrajectoryStore,
        models: &dyn ModelStore,
    ) -> Result<Option<Published>, TrainerError> {
        let Some(mode) = RoundMode::of(stage) else {
            return Ok(None);
        };
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return Ok(None);
        }
        let res = self.round_if_due(mode, store, models);
        if !matches!(res, Ok(None)) {
            self.settle();
        }
        match res {
            Err(TrainerError::Cancelled { target }) => Err(TrainerError::Cancelled { target }),
            Err(e) => {
                self.failures = self.failures.saturating_add(1);
                let wait = self.retry_delay(self.failures);
                self.retry_at = Some(Instant::now() + wait);
                tracing::debug!(target = %self.target, failures = self.failures, wait_ms = wait.as_millis() as u64, "round failed: backing off");
                Err(e)
            }
            Ok(p) => {
                if p.is_some() {
                    self.failures = 0;
                    self.retry_at = None;
                }
                Ok(p)
            }
        }
    }

    fn round_if_due(
        &mut self,
        mode: RoundMode,
        store: &dyn TrajectoryStore,
        models: &dyn ModelStore,
    ) -> Result<Option<Published>, TrainerError> {
        let count = self.poll_rows(store)?;
        let now = Instant::now();
        let min = match mode {
            RoundMode::Offline => self.cfg.offline_min_transitions,
            RoundMode::Online => self.cfg.min_transitions,
        };
        // The first round after a change of mode does not wait for new transitions.
        let switched = self.last_mode.is_some_and(|m| m != mode) && count >= min.max(1);
        if !switched && !self.due_with(count, min, now) {
            return Ok(None);
        }
        if mode == RoundMode::Online && self.last_mode != Some(RoundMode::Online) {
            self.online_rounds = 0;
        }
        let first = switched || self.last_round.is_none();
        let steps = self.round_steps(mode, count.saturating_sub(self.trained_at), first);
        let published = self.train_round(mode, steps, store, models)?;
        self.last_mode = Some(mode);
        if mode == RoundMode::Online {
            self.online_rounds = self.online_rounds.saturating_add(1);
        }
        self.trained_at = count;
        self.last_round = Some(now);
        Ok(Some(published))
    }

    /// Gradient steps of a round of `mode` with `new` transitions since the last one. A full
    /// round (`gradient_steps`, `retrain_gradient_steps`, `offline_gradient_steps`) after
    /// `every` new transitions, and for the first round of a mode; a round the time trigger
    /// (`train_every_ms`) brings earlier makes as many steps per new transition as a full round
    /// does, at least one (ADR 0023). Without this a slow target (a 15 s control interval: 2
    /// transitions per 30 s) took a full round every 30 s, 100 gradient steps per transition
    /// against the full round's rate (1 at the defaults) that the transition trigger, and so
    /// every learning benchmark, uses.
    pub fn round_steps(&self, mode: RoundMode, new: u64, first: bool) -> usize {
        let (full, every) = match mode {
            RoundMode::Offline => (
                self.cfg.offline_gradient_steps,
                self.cfg.train_every_transitions,
            ),
            RoundMode::Online if self.retraining => (
                self.cfg.retrain_gradient_steps,
                self.cfg.retrain_every_transitions,
            ),
            RoundMode::Online => (self.cfg.gradient_steps, self.cfg.train_every_transitions),
        };
        if first || new >= every {
            return full;
        }
        let per = (full as u128 * u128::from(new)).div_ceil(u128::from(every.max(1)));
        usize::try_from(per).unwrap_or(full).clamp(1, full.max(1))
    }

    /// The target's recorded rows as this learner has counted them: the first poll counts what
    /// is stored, each later one adds the rows after the newest it saw
    /// ([`TrajectoryStore::rows_after`]: the new rows, not the history, so a poll stays cheap at
    /// the retention bound), and retention deleting old rows never lowers it.
    fn poll_rows(&mut self, store: &dyn TrajectoryStore) -> Result<u64, TrainerError> {
        let (n, newest) = store
            .rows_after(&self.target, self.polled_through)
            .map_err(|e| self.store_err(e))?;
        self.polled = self.polled.saturating_add(n);
        self.polled_through = self.polled_through.max(newest);
        Ok(self.polled)
    }

    fn ddpg(&mut self, models: &dyn ModelStore) -> Result<&mut Ddpg, TrainerError> {
        if self.ddpg.is_none() {
            self.ddpg = Some(self.resume(models)?);
        }
        match self.ddpg.as_mut() {
            Some(d) => Ok(d),
            None => unreachable!("set just above"),
        }
    }

    /// The newest checkpoint of the target in the model store that reads and verifies (versions
    /// continue after the newest stored), or a fresh network when there is none.
    fn resume(&mut self, models: &dyn ModelStore) -> Result<Ddpg, TrainerError> {
        let prefix = format!("{}/{BASE_LEARNER}/", model_prefix(&self.target));
        let latest = models
            .keys(&prefix)
            .map_err(|source| TrainerError::ModelStore {
                target: self.target.clone(),
                source,
            })?
            .into_iter()
            .filter_map(|k| version_of_key(&k).map(|v| (v, k)))
            .collect::<Vec<_>>();
        let width = self.state_dim();
        let start = self.conditioning.as_ref().map(|c| c.base.clone());
        let fresh = |t: &Target| match &start {
            Some(base) => Ok(base.as_ref().clone()),
            None => {
                Ddpg::new(self.cfg.ddpg_config(width, t)).map_err(|source| TrainerError::Model {
                    target: t.clone(),
                    source,
                })
            }
        };
        // Versions continue after the newest stored, readable or not.
        if let Some((v, _)) = latest.iter().max() {
            self.version = self.version.max(*v);
        }
        let mut versions = latest;
        versions.sort_unstable_by_key(|v| std::cmp::Reverse(v.0));
        // The newest version that reads and verifies: a corrupt or truncated newest checkpoint
        // (a crash or a full disk mid-write on a store without atomic puts, a damaged object)
        // falls back to the one before, rather than throwing the training away.
        for (v, key) in versions {
            match self.read_checkpoint(models, &key, v) {
                Ok((d, _)) => {
                    if self.released {
                        // Every round of a target beyond `held_networks`: not worth a line each.
                        if let Some(c) = &self.reloads {
                            c.inc();
                        }
                        tracing::debug!(target = %self.target, version = v, trained_steps = d.train_steps(), "network read back from the model store");
                    } else {
                        tracing::info!(target = %self.target, version = v, trained_steps = d.train_steps(), "resuming from the model store");
                    }
                    // After a release this learner knows the rows the normalizer saw; a new
                    // one (a restart) takes the checkpoint as having seen the whole history.
                    self.history_seen = self.observed.is_none();
                    return Ok(d);
                }
                Err(TrainerError::Width { .. }) => {
                    tracing::warn!(target = %self.target, version = v, "stored model has another state width; starting afresh");
                    return fresh(&self.target);
                }
                Err(error @ TrainerError::Model { .. }) => {
                    if let Some(c) = &self.corrupt {
                        c.inc();
                    }
                    tracing::warn!(target = %self.target, version = v, %error, "stored checkpoint is corrupt; trying the version before");
                }
                Err(error) => {
                    tracing::warn!(target = %self.target, version = v, %error, "cannot resume from the stored model; starting afresh");
                    return fresh(&self.target);
                }
            }
        }
        fresh(&self.target)
    }

    /// The checkpoint stored at `key` (version `version`) as a network of the learner's state
    /// width, with its bytes: read from the model store, decoded, and its width checked.
    fn read_checkpoint(
        &self,
        models: &dyn ModelStore,
        key: &str,
        version: u64,
    ) -> Result<(Ddpg, Vec<u8>), TrainerError> {
        let bytes = models.get(key).map_err(|source| TrainerError::ModelStore {
            target: self.target.clone(),
            source,
        })?;
        let d = Ddpg::from_bytes(&bytes).map_err(|source| TrainerError::Model {
            target: self.target.clone(),
            source,
        })?;
        let want = self.state_dim();
        match d.config().state_dim {
            has if has == want => Ok((d, bytes)),
            has => Err(TrainerError::Width {
                target: self.target.clone(),
                version,
                has,
                want,
            }),
        }
    }

    /// Rollback (`Lifecycle::rollback_to`): the network becomes the checkpoint of version `to`
    /// — its weights, optimizer state and normalizer — and is published again as the next
    /// version, so the recommenders, which only take newer versions, serve it and a later
    /// retraining resumes from it. `at` is the (episode, step) of the lifecycle message. The
    /// normalizer is the checkpoint's, the one the policy acted with; the rows recorded since
    /// are not observed again. The learner is unchanged when the checkpoint cannot be read or
    /// has another state width.
    pub fn roll_back(
        &mut self,
        to: u64,
        at: (u64, u32),
        models: &dyn ModelStore,
    ) -> Result<Published, TrainerError> {
        let res = self.roll_back_to(to, at, models);
        self.settle();
        res
    }

    fn roll_back_to(
        &mut self,
        to: u64,
        at: (u64, u32),
        models: &dyn ModelStore,
    ) -> Result<Published, TrainerError> {
        let target = self.target.clone();
        let store_err = |source| TrainerError::ModelStore {
            target: target.clone(),
            source,
        };
        // Resumed first, so the versions continue after the newest stored.
        self.ddpg(models)?;
        let (restored, bytes) =
            self.read_checkpoint(models, &model_key(&target, BASE_LEARNER, to), to)?;
        let version = self.version + 1;
        let object = models
            .put(&model_key(&target, BASE_LEARNER, version), &bytes)
            .map_err(store_err)?;
        let trained_steps = restored.train_steps();
        self.ddpg = Some(restored);
        self.version = version;
        Ok(Published {
            version,
            object,
            trained_steps,
            steps: 0,
            latest: at,
            critic_loss: f32::NAN,
            skipped: 0,
            non_finite: 0,
            mode: RoundMode::Online,
            estimate: None,
            bc_weight: 0.0,
        })
    }

    /// Retention (`keep_versions`): deletes the target's base-learner versions older than the
    /// newest `keep_versions` from the model store; returns how many fell out of the window
    /// (deleting one already gone is not an error). Nothing while the target retrains (a
    /// rollback may return to the version in force at the trigger), nor before the learner
    /// knows its newest version. The learner's first pass lists the store; later ones delete
    /// by key the versions that fell out of the window since (versions only grow, and only this
    /// learner writes them), so a round does not list the store (on JetStream, the bucket).
    pub fn prune(&mut self, models: &dyn ModelStore) -> Result<usize, TrainerError> {
        let keep = self.cfg.keep_versions;
        if keep == 0 || self.retraining || !self.has_network() || self.version <= keep {
            return Ok(0);
        }
        let oldest_kept = self.version - keep + 1;
        let store_err = |source| TrainerError::ModelStore {
            target: self.target.clone(),
            source,
        };
        let old: Vec<String> = match self.pruned_below {
            Some(from) => (from..oldest_kept)
                .map(|v| model_key(&self.target, BASE_LEARNER, v))
                .collect(),
            None => models
                .keys(&format!("{}/{BASE_LEARNER}/", model_prefix(&self.target)))
                .map_err(store_err)?
                .into_iter()
                .filter(|k| version_of_key(k).is_some_and(|v| v < oldest_kept))
                .collect(),
        };
        for key in &old {
            models.delete(key).map_err(store_err)?;
        }
        self.pruned_below = Some(oldest_kept);
        Ok(old.len())
    }

    fn store_err(&self, source: StoreError) -> TrainerError {
        TrainerError::Store {
            target: self.target.clone(),
            source: Box::new(source),
        }
    }

    /// The states of the target's recorded rows the normalizer has not seen yet, oldest first:
    /// every row once, as an agent observes each state it visits (rows are re-drawn by many
    /// minibatches, and the recency share draws the newest far more often, so observing the
    /// minibatches would weight the statistics by how often a row is drawn). A network resumed
    /// from the target's checkpoint has seen the history up to now.
    fn unobserved_states(
        &mut self,
        store: &dyn TrajectoryStore,
    ) -> Result<Vec<Vec<f32>>, TrainerError> {
        let seen = self.observed;
        let from = match seen {
            Some((episode, _)) => episode,
            // Only the head is needed to mark the history as seen: start at the last
            // recorded episode rather than reading the whole history.
            None if self.history_seen => store
                .episodes(&self.target, 1)
                .map_err(|e| self.store_err(e))?
                .first()
                .map_or(0, |e| e.episode),
            None => 0,
        };
        let rows = store
            .transitions(&self.target, from..u64::MAX)
            .map_err(|e| self.store_err(e))?;
        let mut out = Vec::new();
        for r in &rows {
            let at = (r.episode, r.step);
            if seen.is_some_and(|o| at <= o) {
                continue;
            }
            self.observed = Some(self.observed.map_or(at, |o| o.max(at)));
            if self.history_seen {
                continue;
            }
            if let Some(t) = to_training(r, &self.bounds, self.cfg.learn_action, self.width) {
                out.push(self.conditioned(t).state);
            }
        }
        self.history_seen = false;
        Ok(out)
    }

    /// The BC weight of the next round of `mode`.
    fn bc_weight(&self, mode: RoundMode) -> f32 {
        match mode {
            RoundMode::Offline => 1.0,
            RoundMode::Online if self.cfg.online_bc_rounds == 0 || self.retraining => 0.0,
            RoundMode::Online => {
                (1.0 - self.online_rounds as f32 / self.cfg.online_bc_rounds as f32).max(0.0)
            }
        }
    }

    /// The evaluation data of the off-policy estimate: the fallback transitions of the target's
    /// last `eval_episodes` recorded episodes (the newest `eval_max_rows`).
    fn eval_rows(
        &self,
        store: &dyn TrajectoryStore,
        lambda: Option<f64>,
    ) -> Result<Vec<Transition>, TrainerError> {
        let eps = store
            .episodes(&self.target, self.cfg.eval_episodes)
            .map_err(|e| self.store_err(e))?;
        let (Some(first), Some(last)) = (eps.first(), eps.last()) else {
            return Ok(Vec::new());
        };
        let rows = store
            .transitions(&self.target, first.episode..last.episode.saturating_add(1))
            .map_err(|e| self.store_err(e))?;
        let mut ts: Vec<Transition> = rows
            .iter()
            .filter(|r| r.source == DecisionSource::Fallback)
            .filter_map(|r| self.training_row(r, lambda))
            .collect();
        if ts.len() > self.cfg.eval_max_rows {
            ts.drain(..ts.len() - self.cfg.eval_max_rows);
        }
        Ok(ts)
    }

    /// `n` rows for an ONLINE round: `recent_fraction` of them drawn uniformly with replacement
    /// from the target's last `recent_episodes` episodes (the one in progress included), the
    /// rest from [`TrajectoryStore::sample`] over its whole history, shuffled together so every
    /// minibatch mixes both; seeded. Without recent episodes: uniform only.
    fn recency_mixed_rows(
        &self,
        store: &dyn TrajectoryStore,
        n: usize,
        seed: u64,
    ) -> Result<tstore::Sample, TrainerError> {
        let eps = store
            .episodes(&self.target, self.cfg.recent_episodes)
            .map_err(|e| self.store_err(e))?;
        let recent = match eps.first() {
            Some(first) => store
                .transitions(&self.target, first.episode..u64::MAX)
                .map_err(|e| self.store_err(e))?,
            None => Vec::new(),
        };
        let n_recent = if recent.is_empty() {
            0
        } else {
            (((n as f64) * f64::from(self.cfg.recent_fraction)).round() as usize).min(n)
        };
        let mut sample = store
            .sample_rows(Some(&self.target), n - n_recent, seed)
            .map_err(|e| self.store_err(e))?;
        // The recent rows join the sample's rows once; their draws index them.
        let base = sample.rows.len();
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x2ece_0e7a);
        for _ in 0..n_recent {
            sample.draws.push(base + rng.random_range(0..recent.len()));
        }
        sample.rows.extend(recent);
        sample.draws.shuffle(&mut rng);
        Ok(sample)
    }

    fn train_round(
        &mut self,
        mode: RoundMode,
        steps: usize,
        store: &dyn TrajectoryStore,
        models: &dyn ModelStore,
    ) -> Result<Published, TrainerError> {
        let target = self.target.clone();
        let batch_size = self.cfg.batch_size;
        let seed = self.cfg.seed ^ stable_hash(&target.key()) ^ self.rounds.rotate_left(32);
        self.rounds += 1;
        // One draw for the whole round: the store scans the target's keys once per call. The
        // draw holds each row once (a round draws `steps` × `batch_size` times from a few
        // hundred rows), and each row becomes a training transition once: the round's memory is
        // bounded by the target's rows, not by its gradient steps.
        let sample = match mode {
            RoundMode::Online if self.cfg.recent_fraction > 0.0 => {
                self.recency_mixed_rows(store, steps * batch_size, seed)?
            }
            _ => store
                .sample_rows(Some(&target), steps * batch_size, seed)
                .map_err(|e| self.store_err(e))?,
        };
        let lambda = self.advance_multiplier(store, models)?;
        // Per distinct row: its training transition, or why it is skipped (non-finite or not).
        let converted: Vec<Result<Transition, bool>> = sample
            .rows
            .iter()
            .map(|r| {
                if !is_finite_row(r) {
                    return Err(true);
                }
                // Offline rounds learn from the fallback only: rows of an RL policy that was
                // sent back to OFFLINE are not behaviour to stay close to.
                if mode == RoundMode::Offline && r.source != DecisionSource::Fallback {
                    return Err(false);
                }
                self.training_row(r, lambda).ok_or(false)
            })
            .collect();
        let (mut skipped, mut non_finite) = (0, 0);
        let mut latest = (0u64, 0u32);
        // The training transitions in draw order, as indices into `converted`.
        let mut ts: Vec<usize> = Vec::with_capacity(sample.len());
        for &i in &sample.draws {
            let (Some(r), Some(c)) = (sample.rows.get(i), converted.get(i)) else {
                continue;
            };
            latest = latest.max((r.episode, r.step));
            match c {
                Ok(_) => ts.push(i),
                Err(nf) => {
                    skipped += 1;
                    non_finite += usize::from(*nf);
                }
            }
        }
        drop(sample);
        let eval = match mode {
            RoundMode::Offline => self.eval_rows(store, lambda)?,
            RoundMode::Online => Vec::new(),
        };
        let bc_weight = self.bc_weight(mode);
        let bc = self.cfg.bc(bc_weight);
        let pinned = self.conditioning.is_some();
        let width = self.width;
        let cancel = self.cancel.clone();
        self.ddpg(models)?;
        let unseen = self.unobserved_states(store)?;
        let ddpg = self.ddpg(models)?;
        let model_err = |source| TrainerError::Model {
            target: target.clone(),
            source,
        };
        // The normalizer follows the data: every recorded state once.
        for state in &unseen {
            ddpg.observe(state).map_err(model_err)?;
        }
        if pinned {
            // The embedding features keep the meta-learner's scale (mean 0, std 1).
            ddpg.normalizer_mut().pin_identity(width);
        }
        let mut critic_loss = f32::NAN;
        let mut done = 0;
        for chunk in ts.chunks(batch_size) {
            if chunk.len() < batch_size.min(ts.len()) {
                break;
            }
            if cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
                return Err(TrainerError::Cancelled {
                    target: target.clone(),
                });
            }
            let mut batch = Batch::with_capacity(ddpg.config().state_dim, chunk.len());
            for t in chunk
                .iter()
                .filter_map(|&i| converted.get(i)?.as_ref().ok())
            {
                batch.push(t).map_err(model_err)?;
            }
            let st = if bc_weight > 0.0 {
                ddpg.train_step_bc(&batch, &bc)
            } else {
                ddpg.train_step(&batch)
            };
            critic_loss = st.map_err(model_err)?.critic_loss;
            done += 1;
        }
        let estimate = if eval.is_empty() {
            None
        } else {
            let batch =
                Batch::from_transitions(ddpg.config().state_dim, &eval).map_err(model_err)?;
            Some(ddpg.estimate_policy(&batch).map_err(model_err)?)
        };
        let trained_steps = ddpg.train_steps();
        let bytes = ddpg.to_bytes().map_err(model_err)?;
        let version = self.version + 1;
        let object = models
            .put(&model_key(&target, BASE_LEARNER, version), &bytes)
            .map_err(|source| TrainerError::ModelStore {
                target: target.clone(),
                source,
            })?;
        self.version = version;
        Ok(Published {
            version,
            object,
            trained_steps,
            steps: done,
            latest,
            critic_loss,
            skipped,
            non_finite,
            mode,
            estimate,
            bc_weight,
        })
    }
}

/// A stored transition as a training transition: the recommender's raw action when it acted
/// (`source: rl`), else the *behaviour action* — the fallback's desired allocation expressed in
/// the policy's action space, the inverse of `loadgen::env::map_action` (default map) from the
/// allocation in force, which the state carries (features 0, 1 and 8 scaled by the bounds),
/// clamped to [−1, 1] ([`behaviour_action`]). With [`LearnAction::Intent`], `desired` rather than
/// `applied`: an RL row's raw action is also the intent before the actuator's guardrails, so both
/// kinds of row mean the same thing to Q. With [`LearnAction::Applied`], every row is the behaviour
/// action of `applied`, the allocation the reward and the next state came from.
/// Whether every number a row trains with is finite (a store that does not check, such as a
/// QuestDB table written by something else, may hold NaN).
pub fn is_finite_row(r: &tstore::Transition) -> bool {
    r.reward.is_finite()
        && [&r.state, &r.next_state, &r.action_raw]
            .iter()
            .all(|v| v.iter().all(|x| x.is_finite()))
}

/// `None` for rows that do not fit (a state of another width than `dim`, non-finite values).
pub fn to_training(
    r: &tstore::Transition,
    bounds: &Bounds,
    learn: LearnAction,
    dim: usize,
) -> Option<Transition> {
    if r.state.len() != dim || r.next_state.len() != dim || !r.reward.is_finite() {
        return None;
    }
    let action = match (learn, r.source, r.action_raw.as_slice()) {
        (LearnAction::Applied, _, _) => behaviour_action(&r.state, r.applied, bounds)?,
        (LearnAction::Intent, DecisionSource::Rl, [a, b, c]) => [*a, *b, *c],
        (LearnAction::Intent, _, _) => behaviour_action(&r.state, r.desired, bounds)?,
    };
    if action.iter().any(|x| !x.is_finite()) {
        return None;
    }
    Some(Transition {
        state: r.state.clone(),
        action: action.map(|x| x.clamp(-1.0, 1.0)),
        reward: r.reward as f32,
        next_state: r.next_state.clone(),
        done: false,
    })
}

/// The raw action in [−1, 1]³ that asks for `applied` from the allocation the state encodes
/// ([`aware_mdp::State::allocation`]): [`aware_mdp::action_for`] under the default action map
/// (absolute: the allocation's point of the bound range), from the state's first
/// [`aware_mdp::STATE_DIM`] features (a mean field after them is not the target's). `None` for a
/// narrower state or a non-finite allocation feature.
pub fn behaviour_action(
    state: &[f32],
    applied: aware_bus_schemas::Resources,
    bounds: &Bounds,
) -> Option<[f32; ACTION_DIM]> {
    let current = aware_mdp::State::from_slice(state.get(..aware_mdp::STATE_DIM)?)
        .ok()?
        .allocation(bounds)?;
    Some(aware_mdp::action_for(
        applied,
        current,
        bounds,
        &aware_mdp::ActionMap::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_bus_schemas::{Resources, Stage};
    use aware_shared::model_store::{get_verified, LocalDirStore};
    use aware_stores::trajectory::SqliteStore;

    /// A trajectory store and a model store in a fresh directory (kept while the guard lives).
    fn stores() -> (tempfile::TempDir, SqliteStore, LocalDirStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_path(dir.path().join("t.db")).unwrap();
        let models = LocalDirStore::open(dir.path().join("models")).unwrap();
        (dir, store, models)
    }

    /// The states the normalizer of `t`'s stored version `v` has seen.
    fn normalizer_count(models: &LocalDirStore, t: &Target, v: u64) -> u64 {
        let bytes = models.get(&model_key(t, BASE_LEARNER, v)).unwrap();
        Ddpg::from_bytes(&bytes).unwrap().normalizer().count()
    }

    const MIB: u64 = 1024 * 1024;

    fn row(t: &Target, episode: u64, step: u32) -> tstore::Transition {
        let x = (episode * 100 + u64::from(step)) as f32;
        let state: Vec<f32> = (0..9)
            .map(|j| 0.5 + 0.4 * (x * 0.3 + j as f32).sin())
            .collect();
        let next: Vec<f32> = (0..9)
            .map(|j| 0.5 + 0.4 * (x * 0.3 + 0.3 + j as f32).sin())
            .collect();
        let r = Resources {
            replicas: 3,
            cpu_millicores: 500,
            memory_bytes: 512 * MIB,
        };
        tstore::Transition {
            target: t.clone(),
            episode,
            step,
            ts_ms: 1_700_000_000_000 + i64::from(step),
            state,
            action_raw: if step.is_multiple_of(2) {
                vec![0.2, -0.1, 0.0]
            } else {
                vec![]
            },
            desired: r,
            applied: r,
            source: if step.is_multiple_of(2) {
                DecisionSource::Rl
            } else {
                DecisionSource::Fallback
            },
            stage: Stage::Online,
            reward: 1.0 + f64::from(state_sum(x)),
            next_state: next,
            slo_violation: false,
            cpu_util: 0.5,
            memory_util: 0.5,
        }
    }

    fn state_sum(x: f32) -> f32 {
        (x * 0.1).cos() * 0.3
    }

    fn cfg() -> TrainerConfig {
        TrainerConfig {
            train_every_transitions: 50,
            train_every_ms: 0,
            gradient_steps: 5,
            batch_size: 16,
            min_transitions: 20,
            ..TrainerConfig::default()
        }
    }

    #[test]
    fn config_defaults_validate_and_nonsense_is_refused() {
        TrainerConfig::default().validate().unwrap();
        assert_eq!(TrainerConfig::default().hidden, vec![64, 64]);
        let bad = [
            TrainerConfig {
                hidden: vec![],
                ..TrainerConfig::default()
            },
            TrainerConfig {
                hidden: vec![0],
                ..TrainerConfig::default()
            },
            TrainerConfig {
                batch_size: 0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                gradient_steps: 0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                train_every_transitions: 0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                poll_ms: 1,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                offline_gradient_steps: 0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                retrain_gradient_steps: 0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                retrain_every_transitions: 0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                held_networks: 10_000_001,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                bc_alpha: f32::NAN,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                bc_policy_noise: -0.1,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                bc_noise_clip: 0.0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                eval_episodes: 0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                eval_max_rows: 0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                keep_versions: 1_000_001,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                exploration_sigma: -0.1,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                recent_fraction: 1.5,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                recent_fraction: f32::NAN,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                recent_episodes: 0,
                ..TrainerConfig::default()
            },
        ];
        for c in bad {
            assert!(
                matches!(c.validate(), Err(TrainerError::Config { .. })),
                "{c:?}"
            );
        }
        let parsed: Result<TrainerConfig, _> =
            serde_json::from_value(serde_json::json!({ "hidden": [32], "no_such_key": 1 }));
        assert!(parsed.is_err(), "unknown keys are refused");
    }

    #[test]
    fn trains_when_due_and_publishes_increasing_verified_versions() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "cart");
        let mut l = Learner::new(t.clone(), Bounds::default(), cfg());
        // Below min_transitions: nothing.
        store
            .append(&(0..10).map(|s| row(&t, 0, s)).collect::<Vec<_>>())
            .unwrap();
        assert_eq!(l.maybe_train(&store, &models).unwrap(), None);
        // 60 rows: due (≥ 50 new).
        store
            .append(&(10..60).map(|s| row(&t, 0, s)).collect::<Vec<_>>())
            .unwrap();
        let p1 = l.maybe_train(&store, &models).unwrap().expect("a round");
        assert_eq!((p1.version, p1.steps, p1.trained_steps), (1, 5, 5));
        assert_eq!(p1.skipped, 0);
        assert!(p1.critic_loss.is_finite());
        assert!(p1.latest.1 < 60);
        let d = published(&models, &p1);
        assert_eq!(d.train_steps(), 5);
        assert_eq!(d.config().actor_hidden, vec![64, 64]);
        assert!(d.normalizer().count() > 0, "the normalizer saw the data");
        // Not due again until 50 more transitions.
        assert_eq!(l.maybe_train(&store, &models).unwrap(), None);
        store
            .append(&(0..50).map(|s| row(&t, 1, s)).collect::<Vec<_>>())
            .unwrap();
        let p2 = l
            .maybe_train(&store, &models)
            .unwrap()
            .expect("a second round");
        assert_eq!((p2.version, p2.trained_steps), (2, 10));
        assert_ne!(p2.object.sha256, p1.object.sha256);
        // A restarted trainer resumes from the latest checkpoint and continues the versions.
        let mut again = Learner::new(t.clone(), Bounds::default(), cfg());
        store
            .append(&(0..50).map(|s| row(&t, 2, s)).collect::<Vec<_>>())
            .unwrap();
        let p3 = again
            .maybe_train(&store, &models)
            .unwrap()
            .expect("a round");
        assert_eq!((p3.version, p3.trained_steps), (3, 15));
        // Retraining (ONLINE entered from SERVING): retrain_gradient_steps per round and no BC
        // term — even for a trainer that (re)started while the target was SERVING, whose first
        // online round would otherwise count as the first after a promotion — until the flag is
        // cleared.
        let mut c = cfg();
        c.retrain_gradient_steps = 20;
        let mut r = Learner::new(t.clone(), Bounds::default(), c);
        r.set_retraining(true);
        store
            .append(&(0..50).map(|s| row(&t, 3, s)).collect::<Vec<_>>())
            .unwrap();
        let p4 = r.maybe_train(&store, &models).unwrap().expect("a round");
        assert_eq!((p4.version, p4.steps, p4.trained_steps), (4, 20, 35));
        assert_eq!(p4.bc_weight, 0.0);
        r.set_retraining(false);
        store
            .append(&(0..50).map(|s| row(&t, 4, s)).collect::<Vec<_>>())
            .unwrap();
        let p5 = r.maybe_train(&store, &models).unwrap().expect("a round");
        assert_eq!((p5.version, p5.steps, p5.trained_steps), (5, 5, 40));
        // Not retraining: the second online round of this learner, BC 1 − 1/20.
        assert!((p5.bc_weight - 0.95).abs() < 1e-6, "{}", p5.bc_weight);
    }

    /// With `learning.mean_field` the learner trains on the wider recorded states and publishes
    /// networks that take them; the rows recorded before (the target's own features only) are
    /// left out rather than padded.
    #[test]
    fn a_mean_field_learner_trains_on_the_wider_states_only() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "cart");
        let width = aware_mdp::state_width(true);
        let wide = |episode, step| {
            let mut r = row(&t, episode, step);
            for s in [&mut r.state, &mut r.next_state] {
                s.extend((0..aware_mdp::MEAN_FIELD_DIM).map(|j| 0.1 * j as f32));
            }
            r
        };
        let mut l = Learner::new(t.clone(), Bounds::default(), cfg());
        l.set_state_width(width);
        assert_eq!(l.state_dim(), width);
        // 60 narrow rows (before the switch): not enough wide ones to train on.
        store
            .append(&(0..60).map(|s| row(&t, 0, s)).collect::<Vec<_>>())
            .unwrap();
        let p = l.maybe_train(&store, &models).unwrap();
        assert!(p.as_ref().is_none_or(|p| p.trained_steps == 0), "{p:?}");
        store
            .append(&(0..60).map(|s| wide(1, s)).collect::<Vec<_>>())
            .unwrap();
        let p = l.maybe_train(&store, &models).unwrap().expect("a round");
        assert!(p.trained_steps > 0 && p.critic_loss.is_finite());
        assert_eq!(published(&models, &p).config().state_dim, width);
        // The behaviour action reads the target's own features, whatever follows them.
        let r = wide(1, 3);
        assert_eq!(
            to_training(&r, &Bounds::default(), LearnAction::Applied, width)
                .unwrap()
                .action,
            to_training(&row(&t, 1, 3), &Bounds::default(), LearnAction::Applied, 9)
                .unwrap()
                .action
        );
        assert!(to_training(&r, &Bounds::default(), LearnAction::Applied, 9).is_none());
    }

    /// The network a round published, read back verified.
    fn published(models: &LocalDirStore, p: &Published) -> Ddpg {
        let bytes =
            get_verified(models, &p.object.uri, &p.object.sha256, p.object.size_bytes).unwrap();
        Ddpg::from_bytes(&bytes).unwrap()
    }

    /// `state` with one feature changed by `f`.
    fn spoilt(state: &[f32], f: fn(&mut aware_mdp::State)) -> Vec<f32> {
        let mut s = aware_mdp::State::from_slice(state).unwrap();
        f(&mut s);
        s.to_vec()
    }

    /// A row with a non-finite number anywhere it trains with is refused (and counted).
    #[test]
    fn rows_with_non_finite_values_are_refused() {
        let t = Target::new("shop", "cart");
        assert!(is_finite_row(&row(&t, 0, 0)));
        for spoil in [
            (|r: &mut tstore::Transition| r.reward = f64::NAN) as fn(&mut tstore::Transition),
            |r| r.state = spoilt(&r.state, |s| s.memory_util = f32::INFINITY),
            |r| r.next_state = spoilt(&r.next_state, |s| s.cpu_limit = f32::NAN),
            |r| r.action_raw = vec![0.1, f32::NEG_INFINITY, 0.0],
        ] {
            let mut r = row(&t, 0, 0);
            spoil(&mut r);
            assert!(!is_finite_row(&r));
        }
    }

    /// A model store that fails every write (its directory replaced by a file: every put fails,
    /// as on a full disk) makes each round fail after its gradient steps. The learner waits
    /// `poll_ms` × 2^failures (capped) before the next round instead of retrying at every poll,
    /// and the first round that succeeds resets the wait.
    #[test]
    fn failed_rounds_back_off_exponentially_and_reset_on_success() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "cart");
        let c = TrainerConfig {
            poll_ms: 40,
            retry_max_delay_ms: 160,
            ..cfg()
        };
        let mut l = Learner::new(t.clone(), Bounds::default(), c);
        assert_eq!(
            (1..=4)
                .map(|n| l.retry_delay(n).as_millis())
                .collect::<Vec<_>>(),
            vec![80, 160, 160, 160],
            "doubling, capped"
        );
        store
            .append(&(0..60).map(|s| row(&t, 0, s)).collect::<Vec<_>>())
            .unwrap();
        let root = models.root().to_path_buf();
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::write(&root, b"not a directory").unwrap();
        let started = Instant::now();
        let (mut attempts, mut failures) = (0, 0);
        while started.elapsed() < Duration::from_millis(600) {
            attempts += 1;
            match l.maybe_train(&store, &models) {
                Err(TrainerError::ModelStore { .. }) => failures += 1,
                Ok(None) => {}
                other => panic!("{other:?}"),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Retrying at every call would fail ~100 times; backing off 80, 160, 160, … ms: ≤ 6.
        assert!(attempts > 50, "{attempts}");
        assert!((2..=6).contains(&failures), "{failures} failed rounds");
        assert_eq!(l.failures(), failures);
        // The store recovers: the next round after the wait succeeds and resets the count.
        std::fs::remove_file(&root).unwrap();
        std::fs::create_dir_all(&root).unwrap();
        std::thread::sleep(Duration::from_millis(170));
        let p = l.maybe_train(&store, &models).unwrap().expect("a round");
        assert_eq!(p.version, 1);
        assert_eq!(l.failures(), 0);
    }

    /// The newest checkpoint cut short (a crash mid-write on a store without atomic puts, a
    /// damaged object): a restarted learner resumes from the newest intact version before it,
    /// counts the corrupt one, and numbers its next version after the corrupt one. (It used to
    /// start afresh, throwing away every round trained.)
    #[test]
    fn a_truncated_newest_checkpoint_falls_back_to_the_newest_intact_version() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "cart");
        let mut l = Learner::new(t.clone(), Bounds::default(), cfg());
        let mut published = Vec::new();
        for episode in 0..3 {
            store
                .append(&(0..60).map(|s| row(&t, episode, s)).collect::<Vec<_>>())
                .unwrap();
            published.push(l.maybe_train(&store, &models).unwrap().expect("a round"));
        }
        assert_eq!(
            published
                .iter()
                .map(|p| (p.version, p.trained_steps))
                .collect::<Vec<_>>(),
            vec![(1, 5), (2, 10), (3, 15)]
        );
        let newest = published[2].object.uri.strip_prefix("file://").unwrap();
        let len = std::fs::metadata(newest).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(newest)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        let corrupt = prometheus::IntCounter::new("corrupt", "corrupt").unwrap();
        let mut again = Learner::new(t.clone(), Bounds::default(), cfg());
        again.set_corrupt_counter(corrupt.clone());
        store
            .append(&(0..60).map(|s| row(&t, 3, s)).collect::<Vec<_>>())
            .unwrap();
        let p = again
            .maybe_train(&store, &models)
            .unwrap()
            .expect("a round");
        assert_eq!(
            (p.version, p.trained_steps),
            (4, 15),
            "resumed from version 2 (10 steps), not afresh (5) nor the truncated 3"
        );
        assert_eq!(corrupt.get(), 1);
    }

    /// A rollback republishes the named version's checkpoint as the next version, the learner
    /// continues from it (a fresh learner first resumes, so versions never collide), and a
    /// version that cannot be read changes nothing.
    #[test]
    fn a_rollback_republishes_the_version_and_trains_on_from_it() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "cart");
        let mut l = Learner::new(t.clone(), Bounds::default(), cfg());
        for ep in 0..3 {
            store
                .append(&(0..60).map(|s| row(&t, ep, s)).collect::<Vec<_>>())
                .unwrap();
            l.maybe_train(&store, &models).unwrap().expect("a round");
        }
        assert_eq!(l.version(), 3);
        let stored = |v: u64| models.get(&model_key(&t, BASE_LEARNER, v)).unwrap();
        // A restarted trainer rolls back to version 1.
        let mut r = Learner::new(t.clone(), Bounds::default(), cfg());
        let p = r.roll_back(1, (9, 450), &models).unwrap();
        assert_eq!((p.version, p.trained_steps, p.steps), (4, 5, 0));
        assert_eq!(p.latest, (9, 450));
        assert_eq!(stored(4), stored(1), "version 4 is version 1's checkpoint");
        assert_ne!(stored(4), stored(3));
        assert_eq!(published(&models, &p).train_steps(), 5);
        // The next round trains on from version 1's network: 5 + 5 steps, version 5.
        store
            .append(&(0..60).map(|s| row(&t, 3, s)).collect::<Vec<_>>())
            .unwrap();
        let next = r.maybe_train(&store, &models).unwrap().expect("a round");
        assert_eq!((next.version, next.trained_steps), (5, 10));
        // A version the store does not hold: an error, nothing published, nothing changed.
        assert!(matches!(
            r.roll_back(42, (9, 500), &models),
            Err(TrainerError::ModelStore { .. })
        ));
        assert_eq!(r.version(), 5);
        assert!(models.get(&model_key(&t, BASE_LEARNER, 6)).is_err());
        // A version of another state width: an error naming both widths, nothing published.
        let width = r.state_dim();
        let other = Ddpg::new(cfg().ddpg_config(width + 1, &t)).unwrap();
        models
            .put(&model_key(&t, BASE_LEARNER, 6), &other.to_bytes().unwrap())
            .unwrap();
        match r.roll_back(6, (9, 550), &models) {
            Err(TrainerError::Width {
                version: 6,
                has,
                want,
                ..
            }) => assert_eq!((has, want), (width + 1, width)),
            other => panic!("expected a width error, got {other:?}"),
        }
        assert_eq!(r.version(), 5);
        assert!(models.get(&model_key(&t, BASE_LEARNER, 7)).is_err());
        // A restarted trainer whose newest version has another width starts afresh, and its
        // versions continue after it.
        let mut fresh = Learner::new(t.clone(), Bounds::default(), cfg());
        store
            .append(&(0..60).map(|s| row(&t, 4, s)).collect::<Vec<_>>())
            .unwrap();
        let p = fresh
            .maybe_train(&store, &models)
            .unwrap()
            .expect("a round");
        assert_eq!((p.version, p.trained_steps), (7, 5));
    }

    /// Retention keeps the newest `keep_versions` base-learner versions, deletes nothing while
    /// the target retrains (so a rollback still finds the version in force at the trigger),
    /// prunes again once the rollback made that version the newest, and leaves other targets'
    /// versions alone.
    #[test]
    fn retention_keeps_the_newest_versions_and_never_prunes_while_retraining() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "kept");
        let other = Target::new("shop", "other");
        models
            .put(&model_key(&other, BASE_LEARNER, 1), b"another target")
            .unwrap();
        let versions = || -> Vec<u64> {
            models
                .keys(&format!("{}/{BASE_LEARNER}/", model_prefix(&t)))
                .unwrap()
                .iter()
                .filter_map(|k| version_of_key(k))
                .collect()
        };
        let c = TrainerConfig {
            keep_versions: 2,
            retrain_every_transitions: 50,
            retrain_gradient_steps: 5,
            ..cfg()
        };
        let mut l = Learner::new(t.clone(), Bounds::default(), c.clone());
        // Before the learner knows its newest version: nothing.
        assert_eq!(l.prune(&models).unwrap(), 0);
        let mut ep = 0;
        let mut round = |l: &mut Learner| {
            store
                .append(&(0..60).map(|s| row(&t, ep, s)).collect::<Vec<_>>())
                .unwrap();
            ep += 1;
            l.maybe_train(&store, &models).unwrap().expect("a round");
            l.prune(&models).unwrap()
        };
        let deleted: Vec<usize> = (0..4).map(|_| round(&mut l)).collect();
        assert_eq!(deleted, vec![0, 0, 1, 1]);
        assert_eq!(versions(), vec![3, 4]);
        // Retraining from version 4: three rounds, nothing deleted.
        l.set_retraining(true);
        for _ in 0..3 {
            assert_eq!(round(&mut l), 0);
        }
        assert_eq!(versions(), vec![3, 4, 5, 6, 7]);
        // The retraining settles low: the rollback finds version 4 and republishes it as 8;
        // out of retraining, the pass keeps 7 and 8.
        l.set_retraining(false);
        let p = l.roll_back(4, (99, 0), &models).unwrap();
        assert_eq!(p.version, 8);
        assert_eq!(l.prune(&models).unwrap(), 4);
        assert_eq!(versions(), vec![7, 8]);
        assert_eq!(
            Ddpg::from_bytes(&models.get(&model_key(&t, BASE_LEARNER, 8)).unwrap())
                .unwrap()
                .train_steps(),
            20,
            "version 4's network: four rounds of 5 steps"
        );
        assert!(models.get(&model_key(&other, BASE_LEARNER, 1)).is_ok());
        // A restarted trainer resumes from the newest kept version and numbers on after it.
        let mut again = Learner::new(t.clone(), Bounds::default(), c.clone());
        assert_eq!(round(&mut again), 1);
        assert_eq!(versions(), vec![8, 9]);
        // keep_versions 0: every version stays.
        let mut all = Learner::new(
            t.clone(),
            Bounds::default(),
            TrainerConfig {
                keep_versions: 0,
                ..c
            },
        );
        assert_eq!(round(&mut all), 0);
        assert_eq!(versions(), vec![8, 9, 10]);
    }

    /// The normalizer sees every recorded state exactly once, however often minibatches draw
    /// it (recency share included); a learner resumed from the checkpoint counts only what was
    /// recorded after it resumed.
    #[test]
    fn the_normalizer_sees_every_recorded_state_once() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "norm");
        let mut c = cfg();
        c.recent_fraction = 0.5;
        c.recent_episodes = 1;
        c.offline_min_transitions = 20;
        let count = |v: u64| normalizer_count(&models, &t, v);
        let mut l = Learner::new(t.clone(), Bounds::default(), c.clone());
        store
            .append(&(0..60).map(|s| row(&t, 0, s)).collect::<Vec<_>>())
            .unwrap();
        let p1 = l.maybe_train(&store, &models).unwrap().expect("a round");
        // 5 steps × 16 rows drawn, 60 recorded.
        assert_eq!(count(p1.version), 60);
        store
            .append(&(0..50).map(|s| row(&t, 1, s)).collect::<Vec<_>>())
            .unwrap();
        let p2 = l.maybe_train(&store, &models).unwrap().expect("a round");
        assert_eq!(count(p2.version), 110);
        // Nothing new recorded: a round (forced by the mode switch) observes nothing.
        let p3 = l
            .maybe_train_in(Stage::Offline, &store, &models)
            .unwrap()
            .expect("the first round of a new mode");
        assert_eq!(count(p3.version), 110);
        // A restarted trainer resumes with the checkpoint's statistics and adds only the rows
        // recorded since.
        let mut again = Learner::new(t.clone(), Bounds::default(), c);
        store
            .append(&(0..50).map(|s| row(&t, 2, s)).collect::<Vec<_>>())
            .unwrap();
        let p4 = again
            .maybe_train(&store, &models)
            .unwrap()
            .expect("a round");
        assert_eq!(count(p4.version), 110);
        store
            .append(&(0..50).map(|s| row(&t, 3, s)).collect::<Vec<_>>())
            .unwrap();
        let p5 = again
            .maybe_train(&store, &models)
            .unwrap()
            .expect("a round");
        assert_eq!(count(p5.version), 160);
    }

    /// A released network (SERVING) resumes from its checkpoint: versions, gradient steps and
    /// the normalizer go on as if it had been kept, the rows recorded meanwhile included.
    #[test]
    fn a_released_network_resumes_where_it_was() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "release");
        let count = |v: u64| normalizer_count(&models, &t, v);
        let mut l = Learner::new(t.clone(), Bounds::default(), cfg());
        store
            .append(&(0..60).map(|s| row(&t, 0, s)).collect::<Vec<_>>())
            .unwrap();
        let p1 = l.maybe_train(&store, &models).unwrap().expect("a round");
        assert!(l.has_network());
        l.release_network();
        assert!(l.ddpg.is_none() && l.has_network(), "released, width kept");
        store
            .append(&(0..50).map(|s| row(&t, 1, s)).collect::<Vec<_>>())
            .unwrap();
        let p2 = l.maybe_train(&store, &models).unwrap().expect("a round");
        assert_eq!(p2.version, p1.version + 1);
        assert_eq!(p2.trained_steps, p1.trained_steps + p2.steps as u64);
        assert_eq!(
            count(p2.version),
            110,
            "the rows recorded while released observed once"
        );
    }

    /// `held_networks`: a target beyond the budget drops its network after every round and
    /// reads it back at the next, and trains exactly as a target that keeps it (the same
    /// checkpoints, byte for byte); a place freed by a release goes to the next target.
    #[test]
    fn a_network_beyond_the_budget_is_read_back_each_round_and_trains_the_same() {
        let (_dir, store, kept_models) = stores();
        let dir2 = tempfile::tempdir().unwrap();
        let released_models = LocalDirStore::open(dir2.path().join("models")).unwrap();
        let t = Target::new("shop", "budget");
        let other = Target::new("shop", "other");
        for target in [&t, &other] {
            store
                .append(&(0..60).map(|s| row(target, 0, s)).collect::<Vec<_>>())
                .unwrap();
        }
        // One place: `other` takes it first; `t` is beyond the budget.
        let budget = NetworkBudget::new(1);
        let mut o = Learner::new(other.clone(), Bounds::default(), cfg());
        o.set_budget(budget.clone());
        o.maybe_train(&store, &released_models)
            .unwrap()
            .expect("a round");
        assert!(o.ddpg.is_some(), "the first network takes the place");
        assert_eq!(budget.held(), 1);

        let mut kept = Learner::new(t.clone(), Bounds::default(), cfg());
        let mut released = Learner::new(t.clone(), Bounds::default(), cfg());
        released.set_budget(budget.clone());
        let reloads = prometheus::IntCounter::new("reloads", "reloads").unwrap();
        released.set_reload_counter(reloads.clone());
        for episode in 1..4u64 {
            let a = kept
                .maybe_train(&store, &kept_models)
                .unwrap()
                .expect("a round");
            let b = released
                .maybe_train(&store, &released_models)
                .unwrap()
                .expect("a round");
            assert!(kept.ddpg.is_some(), "no budget: kept");
            assert!(
                released.ddpg.is_none() && released.has_network(),
                "no place left: released"
            );
            assert_eq!((a.version, a.trained_steps), (b.version, b.trained_steps));
            let key = model_key(&t, BASE_LEARNER, a.version);
            assert!(
                kept_models.get(&key).unwrap() == released_models.get(&key).unwrap(),
                "version {} differs between the kept and the released network",
                a.version
            );
            store
                .append(&(0..50).map(|s| row(&t, episode, s)).collect::<Vec<_>>())
                .unwrap();
        }
        assert_eq!(reloads.get(), 2, "read back for rounds 2 and 3");
        assert_eq!(budget.held(), 1);
        // `other` lets its network go (SERVING): the place is free for `t`'s next round.
        o.release_network();
        assert_eq!(budget.held(), 0);
        released
            .maybe_train(&store, &released_models)
            .unwrap()
            .expect("a round");
        assert!(released.ddpg.is_some(), "the freed place");
        assert_eq!((budget.held(), reloads.get()), (1, 3));
    }

    /// A failed round releases a network without a place too, so an outage of the model store
    /// does not keep every target's network in memory; the round is redone from the last
    /// checkpoint.
    #[test]
    fn a_failed_round_releases_a_network_without_a_place() {
        let (dir, store, models) = stores();
        let t = Target::new("shop", "outage");
        let mut l = Learner::new(t.clone(), Bounds::default(), cfg());
        l.set_budget(NetworkBudget::new(0));
        let reloads = prometheus::IntCounter::new("reloads", "reloads").unwrap();
        l.set_reload_counter(reloads.clone());
        store
            .append(&(0..60).map(|s| row(&t, 0, s)).collect::<Vec<_>>())
            .unwrap();
        let p1 = l.maybe_train(&store, &models).unwrap().expect("a round");
        assert!(l.ddpg.is_none());
        store
            .append(&(0..50).map(|s| row(&t, 1, s)).collect::<Vec<_>>())
            .unwrap();
        // Version 2 cannot be written: a non-empty directory where its file goes.
        let blocker = dir
            .path()
            .join("models")
            .join(model_key(&t, BASE_LEARNER, 2));
        std::fs::create_dir_all(blocker.join("in-the-way")).unwrap();
        assert!(l.maybe_train(&store, &models).is_err());
        assert_eq!(reloads.get(), 1, "read back for the round that failed");
        assert!(l.ddpg.is_none(), "released after the failed round");
        std::fs::remove_dir_all(&blocker).unwrap();
        l.retry_at = None;
        let p2 = l
            .maybe_train(&store, &models)
            .unwrap()
            .expect("the round again");
        assert_eq!(p2.version, 2);
        assert_eq!(
            p2.trained_steps,
            p1.trained_steps + p2.steps as u64,
            "redone from version 1, the failed round's steps gone with its network"
        );
    }

    /// A network released after each round (beyond `held_networks`) still gets its retention
    /// pass when the target stops retraining: the learner knows its newest version without the
    /// network in memory.
    #[test]
    fn a_released_network_still_gets_its_retention_pass() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "released-kept");
        let c = TrainerConfig {
            keep_versions: 2,
            ..cfg()
        };
        let mut l = Learner::new(t.clone(), Bounds::default(), c);
        l.set_budget(NetworkBudget::new(0));
        l.set_retraining(true);
        for ep in 0..4u64 {
            store
                .append(&(0..60).map(|s| row(&t, ep, s)).collect::<Vec<_>>())
                .unwrap();
            l.maybe_train(&store, &models).unwrap().expect("a round");
            assert!(l.ddpg.is_none(), "no place: released");
            assert_eq!(l.prune(&models).unwrap(), 0, "retraining: nothing deleted");
        }
        l.set_retraining(false);
        assert_eq!(
            l.prune(&models).unwrap(),
            2,
            "versions 1 and 2 go, 3 and 4 stay"
        );
    }

    /// Retention deletes old rows under the trainer: rounds still come every
    /// `train_every_transitions` new rows, and the normalizer still sees each new state once.
    #[test]
    fn rounds_keep_coming_after_the_recorder_prunes() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "pruned");
        let normalized = |v: u64| normalizer_count(&models, &t, v);
        let episode = |e: u64, n: u32| (0..n).map(|s| row(&t, e, s)).collect::<Vec<_>>();
        let mut l = Learner::new(t.clone(), Bounds::default(), cfg());
        store.append(&episode(0, 60)).unwrap();
        l.maybe_train(&store, &models).unwrap().expect("a round");
        store.append(&episode(1, 50)).unwrap();
        l.maybe_train(&store, &models).unwrap().expect("a round");
        // The recorder keeps 50: episode 0 goes, 50 rows remain of 110 recorded.
        let p = store
            .prune(&t, std::num::NonZeroU64::new(50).unwrap())
            .unwrap();
        assert_eq!(p.transitions, 60);
        assert!(
            l.maybe_train(&store, &models).unwrap().is_none(),
            "nothing new"
        );
        store.append(&episode(2, 49)).unwrap();
        assert!(l.maybe_train(&store, &models).unwrap().is_none(), "49 new");
        store.append(&[row(&t, 2, 49)]).unwrap();
        let p3 = l
            .maybe_train(&store, &models)
            .unwrap()
            .expect("50 new rows make a round although fewer rows are stored than before");
        assert_eq!(store.count(&t).unwrap(), 100);
        assert_eq!(normalized(p3.version), 160, "every recorded state once");
    }

    #[test]
    fn time_trigger_needs_new_transitions() {
        let t = Target::new("a", "b");
        let mut c = cfg();
        c.train_every_ms = 1_000;
        let mut l = Learner::new(t, Bounds::default(), c);
        let now = Instant::now();
        assert!(!l.due(10, now), "below the minimum");
        assert!(l.due(50, now), "enough new transitions");
        l.trained_at = 50;
        l.last_round = Some(now);
        assert!(!l.due(60, now + Duration::from_millis(500)));
        assert!(l.due(60, now + Duration::from_millis(1_500)));
        assert!(
            !l.due(50, now + Duration::from_millis(1_500)),
            "nothing new"
        );
    }

    /// The first round comes once `min_transitions` are stored, without waiting for
    /// `train_every_transitions` or the time trigger.
    #[test]
    fn the_first_round_comes_when_the_data_is_ready() {
        let mut c = cfg();
        c.train_every_ms = 30_000;
        let mut l = Learner::new(Target::new("a", "b"), Bounds::default(), c);
        let now = Instant::now();
        assert!(!l.due(19, now), "below min_transitions");
        assert!(l.due(20, now), "min_transitions and no round yet");
        l.trained_at = 20;
        l.last_round = Some(now);
        assert!(!l.due(30, now + Duration::from_secs(29)));
        assert!(l.due(30, now + Duration::from_secs(30)), "time trigger");
        assert!(l.due(70, now), "train_every_transitions");
    }

    /// A round the time trigger brings before `every` new transitions makes as many gradient
    /// steps per new transition as a full round; the first round of a mode is full.
    #[test]
    fn early_rounds_make_steps_in_proportion_to_new_transitions() {
        let mut c = cfg();
        c.gradient_steps = 200;
        c.train_every_transitions = 200;
        c.retrain_gradient_steps = 200;
        c.retrain_every_transitions = 50;
        c.offline_gradient_steps = 500;
        let mut l = Learner::new(Target::new("a", "b"), Bounds::default(), c);
        let on = RoundMode::Online;
        assert_eq!(l.round_steps(on, 2, true), 200, "first round: full");
        assert_eq!(l.round_steps(on, 200, false), 200);
        assert_eq!(l.round_steps(on, 900, false), 200, "never more than full");
        assert_eq!(
            l.round_steps(on, 2, false),
            2,
            "15 s interval, 30 s trigger"
        );
        assert_eq!(l.round_steps(on, 0, false), 1, "at least one");
        assert_eq!(l.round_steps(RoundMode::Offline, 2, false), 5);
        assert_eq!(l.round_steps(RoundMode::Offline, 3, false), 8, "rounded up");
        l.set_retraining(true);
        assert_eq!(
            l.round_steps(on, 2, false),
            8,
            "retraining: 4 per transition"
        );
        assert_eq!(l.round_steps(on, 50, false), 200);
    }

    /// A learner trained by the time trigger makes the early round's steps, not a full round.
    #[test]
    fn a_time_triggered_round_trains_its_proportion() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "slow");
        let mut c = cfg();
        c.train_every_ms = 1;
        c.gradient_steps = 40;
        c.train_every_transitions = 40;
        let mut l = Learner::new(t.clone(), Bounds::default(), c);
        let rows: Vec<_> = (0..20).map(|s| row(&t, 0, s)).collect();
        store.append(&rows).unwrap();
        let p1 = l.maybe_train(&store, &models).unwrap().expect("data ready");
        assert_eq!(p1.steps, 40, "the first round is full");
        store.append(&[row(&t, 0, 20), row(&t, 0, 21)]).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let p2 = l
            .maybe_train(&store, &models)
            .unwrap()
            .expect("time trigger");
        assert_eq!(p2.steps, 2, "2 new transitions, 1 step each");
        assert_eq!(p2.trained_steps, 42);
    }

    /// While the target retrains, rounds come every `retrain_every_transitions`; first learning
    /// and after the flag is cleared, every `train_every_transitions`.
    #[test]
    fn retraining_rounds_come_at_their_own_cadence() {
        let mut c = cfg();
        c.train_every_transitions = 200;
        c.retrain_every_transitions = 30;
        let mut l = Learner::new(Target::new("a", "b"), Bounds::default(), c);
        let now = Instant::now();
        l.trained_at = 1_000;
        l.last_round = Some(now);
        assert!(!l.due(1_030, now), "first learning waits for 200");
        assert!(!l.due(1_199, now));
        assert!(l.due(1_200, now));
        l.set_retraining(true);
        assert!(!l.due(1_029, now), "retraining: fewer than 30 new");
        assert!(l.due(1_030, now), "retraining: 30 new");
        l.set_retraining(false);
        assert!(!l.due(1_030, now), "cleared: back to 200");
    }

    #[test]
    fn behaviour_action_inverts_the_action_map() {
        let b = Bounds::default();
        // The allocation in force, as the state encodes it.
        let cur = Resources {
            replicas: 4,
            cpu_millicores: 1024,
            memory_bytes: 1536 * MIB,
        };
        let state = aware_mdp::State {
            cpu_limit: (f64::from(cur.cpu_millicores) / f64::from(b.max_cpu_millicores)) as f32,
            memory_limit: (cur.memory_bytes as f64 / b.max_memory_bytes as f64) as f32,
            replicas: (f64::from(cur.replicas) / f64::from(b.max_replicas)) as f32,
            ..aware_mdp::State::default()
        }
        .to_vec();
        // The absolute map: the applied allocation's point of each bound range
        // (replicas 1..20, CPU 128..2048 m, memory 256..3072 MiB).
        let applied = Resources {
            replicas: 6,
            cpu_millicores: 1264,
            memory_bytes: 1360 * MIB,
        };
        let a = behaviour_action(&state, applied, &b).unwrap();
        let want = [
            2.0 * 5.0 / 19.0 - 1.0,
            2.0 * (1264.0 - 128.0) / 1920.0 - 1.0,
            2.0 * (1360.0 - 256.0) / 2816.0 - 1.0,
        ];
        for (got, want) in a.iter().zip(want) {
            assert!((f64::from(*got) - want).abs() < 1e-3, "{a:?}");
        }
        // and the action map takes the allocation in force there
        let (to, _) = aware_mdp::map_action(a, cur, &b, &aware_mdp::ActionMap::default());
        assert_eq!(
            (to.replicas, to.cpu_millicores, to.memory_bytes),
            (6, 1264, 1360 * MIB)
        );
        // The top of the range is +1.
        let far = Resources {
            replicas: 20,
            ..applied
        };
        assert_eq!(behaviour_action(&state, far, &b).unwrap()[0], 1.0);
        // Rows that do not fit are skipped.
        let t = Target::new("a", "b");
        let mut r = row(&t, 0, 1);
        r.state.truncate(4);
        assert!(to_training(&r, &b, LearnAction::Intent, aware_mdp::STATE_DIM).is_none());
        assert!(to_training(&r, &b, LearnAction::Applied, aware_mdp::STATE_DIM).is_none());
        let mut r = row(&t, 0, 2);
        r.reward = f64::NAN;
        assert!(to_training(&r, &b, LearnAction::Intent, aware_mdp::STATE_DIM).is_none());
        // RL rows keep the recommender's raw action …
        let mut r = row(&t, 0, 2);
        r.state.clone_from(&state);
        assert_eq!(
            to_training(&r, &b, LearnAction::Intent, aware_mdp::STATE_DIM)
                .unwrap()
                .action,
            [0.2, -0.1, 0.0]
        );
        // … unless they learn from what was applied: a guardrail held the allocation in force
        // (a cooldown), so the row trains with the action that asks for it.
        r.applied = cur;
        let held = behaviour_action(&state, cur, &b).unwrap();
        assert_eq!(
            to_training(&r, &b, LearnAction::Applied, aware_mdp::STATE_DIM)
                .unwrap()
                .action,
            held
        );
        assert_ne!(held, [0.2, -0.1, 0.0]);
        // A fallback row: its desired allocation as intent, its applied one otherwise.
        r.source = DecisionSource::Fallback;
        r.action_raw = vec![];
        r.desired = applied;
        assert_eq!(
            to_training(&r, &b, LearnAction::Intent, aware_mdp::STATE_DIM)
                .unwrap()
                .action,
            a
        );
        assert_eq!(
            to_training(&r, &b, LearnAction::Applied, aware_mdp::STATE_DIM)
                .unwrap()
                .action,
            held
        );
    }

    /// A fallback row of an OFFLINE episode: reward `reward`, desired = the allocation in force
    /// plus one replica.
    fn fallback_row(t: &Target, episode: u64, step: u32, reward: f64) -> tstore::Transition {
        let mut r = row(t, episode, step);
        r.source = DecisionSource::Fallback;
        r.action_raw = vec![];
        r.stage = Stage::Offline;
        r.reward = reward;
        r
    }

    fn summary(t: &Target, episode: u64, steps: u32) -> tstore::EpisodeSummary {
        let Some(aware_bus_schemas::Event::Episode(e)) = aware_bus_schemas::generated::samples()
            .into_iter()
            .find(|e| e.kind() == aware_bus_schemas::EventKind::Episode)
        else {
            unreachable!()
        };
        let mut s = tstore::EpisodeSummary::from(&e);
        s.target = t.clone();
        s.episode = episode;
        s.steps = steps;
        s.stage = Stage::Offline;
        s
    }

    fn constrained() -> aware_mdp::Objective {
        aware_mdp::Objective {
            mode: aware_mdp::ObjectiveMode::Constrained,
            ..aware_mdp::Objective::default()
        }
    }

    fn latency_slo() -> aware_mdp::Slo {
        aware_mdp::Slo {
            latency_p99_ms: Some(200.0),
            ..aware_mdp::Slo::default()
        }
    }

    fn lambda_of(models: &LocalDirStore, p: &Published) -> f64 {
        let bytes =
            get_verified(models, &p.object.uri, &p.object.sha256, p.object.size_bytes).unwrap();
        let d = Ddpg::from_bytes(&bytes).unwrap();
        let s: LearnerState = serde_json::from_value(d.learner_state().unwrap().clone()).unwrap();
        s.multiplier.lambda
    }

    /// Constrained mode: a row's reward is the Lagrangian of its requested cost and its
    /// violation at the multiplier, not the recorded weighted reward; a target without an SLO,
    /// or weighted mode, keeps the recorded one.
    #[test]
    fn constrained_rounds_pay_cost_and_violations_not_the_recorded_reward() {
        let t = Target::new("shop", "cart");
        let b = Bounds::default();
        let mut r = row(&t, 0, 1);
        r.applied = Resources {
            replicas: b.max_replicas,
            cpu_millicores: b.max_cpu_millicores,
            memory_bytes: b.max_memory_bytes,
        };
        r.slo_violation = true;
        let mut l = Learner::new(t.clone(), b, cfg());
        l.set_objective(
            aware_mdp::Objective {
                mode: aware_mdp::ObjectiveMode::Weighted,
                ..aware_mdp::Objective::default()
            },
            latency_slo(),
        );
        let recorded = l.training_row(&r, Some(1.0)).unwrap().reward;
        assert_eq!(
            recorded, r.reward as f32,
            "weighted mode keeps the recorded reward"
        );
        l.set_objective(constrained(), aware_mdp::Slo::default());
        assert_eq!(l.training_row(&r, None).unwrap().reward, r.reward as f32);
        l.set_objective(constrained(), latency_slo());
        // The whole bound range and a violation: the worst reward, whatever λ.
        assert_eq!(l.training_row(&r, Some(1.0)).unwrap().reward, 0.0);
        // Half the replicas, no violation, λ = 1: 2·(0.5·0.5 + 0.5·1) = 1.5.
        r.applied.replicas = b.max_replicas / 2;
        r.slo_violation = false;
        assert!((l.training_row(&r, Some(1.0)).unwrap().reward - 1.5).abs() < 1e-6);
    }

    /// The multiplier moves once per finished episode by its burn rate, is saved in the
    /// checkpoint, and a restarted trainer resumes it instead of starting over.
    #[test]
    fn the_multiplier_follows_the_burn_rate_and_survives_a_restart() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "cart");
        let new_learner = || {
            let mut l = Learner::new(t.clone(), Bounds::default(), cfg());
            l.set_objective(constrained(), latency_slo());
            l
        };
        let mut l = new_learner();
        let mut rows: Vec<_> = (0..60).map(|s| row(&t, 0, s)).collect();
        for r in rows.iter_mut().take(10) {
            r.slo_violation = true;
        }
        store.append(&rows).unwrap();
        let mut e0 = summary(&t, 0, 60);
        e0.slo_violations = 10;
        store.put_episode(&e0).unwrap();
        let p1 = l.maybe_train(&store, &models).unwrap().expect("a round");
        // 10 of 60 against a 1% budget: λ up by e^0.5 from 1.
        assert!((lambda_of(&models, &p1) - 0.5f64.exp()).abs() < 1e-9);
        // A restart: the next round resumes λ and moves it by the new episode only (no
        // violation: down by e^0.5, back to 1).
        let mut again = new_learner();
        store
            .append(&(0..60).map(|s| row(&t, 1, s)).collect::<Vec<_>>())
            .unwrap();
        let mut e1 = summary(&t, 1, 60);
        e1.slo_violations = 0;
        store.put_episode(&e1).unwrap();
        let p2 = again
            .maybe_train(&store, &models)
            .unwrap()
            .expect("a round");
        assert_eq!(p2.version, 2);
        assert!((lambda_of(&models, &p2) - 1.0).abs() < 1e-9);
    }

    fn offline_cfg() -> TrainerConfig {
        TrainerConfig {
            hidden: vec![16, 16],
            offline_gradient_steps: 20,
            offline_min_transitions: 40,
            eval_episodes: 2,
            online_bc_rounds: 2,
            ..cfg()
        }
    }

    #[test]
    fn online_rounds_draw_the_recent_share_from_the_last_episodes() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "cart");
        let c = TrainerConfig {
            hidden: vec![16, 16],
            recent_fraction: 0.5,
            recent_episodes: 2,
            ..cfg()
        };
        let l = Learner::new(t.clone(), Bounds::default(), c.clone());
        // No episode closed yet: uniform draws only, still n of them.
        store
            .append(&(0..50).map(|s| row(&t, 0, s)).collect::<Vec<_>>())
            .unwrap();
        assert_eq!(l.recency_mixed_rows(&store, 300, 1).unwrap().len(), 300);
        // Ten closed episodes of 50 rows and one in progress (20 rows, no summary yet).
        for ep in 1..10u64 {
            store
                .append(&(0..50).map(|s| row(&t, ep, s)).collect::<Vec<_>>())
                .unwrap();
        }
        for ep in 0..10u64 {
            store.put_episode(&summary(&t, ep, 50)).unwrap();
        }
        store
            .append(&(0..20).map(|s| row(&t, 10, s)).collect::<Vec<_>>())
            .unwrap();
        let n = 8_000;
        let sample = l.recency_mixed_rows(&store, n, 7).unwrap();
        // Held compactly: 8,000 draws hold at most the 520 stored rows and the 120 recent ones.
        assert!(sample.rows.len() <= 640, "{} rows held", sample.rows.len());
        let rows = sample.into_transitions();
        assert_eq!(rows.len(), n);
        // Recent = episodes 8, 9 and the one in progress: 120 of 520 rows, so their share is
        // 0.5 + 0.5 × 120 / 520 ≈ 0.615 (uniform alone: 0.23).
        let share = rows.iter().filter(|r| r.episode >= 8).count() as f64 / n as f64;
        assert!((share - 0.615).abs() < 0.025, "recent share {share}");
        assert!(
            rows.iter().any(|r| r.episode == 10),
            "the episode in progress counts"
        );
        assert!(
            rows.iter().any(|r| r.episode == 0),
            "the old history still appears"
        );
        // Shuffled: the recent draws are spread over the minibatches, not appended at the end.
        let first_half = rows[..n / 2].iter().filter(|r| r.episode >= 8).count() as f64;
        assert!((first_half / (n / 2) as f64 - share).abs() < 0.05);
        assert_eq!(
            rows,
            l.recency_mixed_rows(&store, n, 7)
                .unwrap()
                .into_transitions(),
            "seeded"
        );
        // An ONLINE round trains on them; an OFFLINE one stays uniform over fallback rows.
        let mut l = Learner::new(t.clone(), Bounds::default(), c);
        let p = l
            .maybe_train_in(Stage::Online, &store, &models)
            .unwrap()
            .expect("an online round");
        assert_eq!(p.steps, 5);
        assert!(p.critic_loss.is_finite());
    }

    #[test]
    fn a_cancelled_round_stops_and_publishes_nothing() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "cart");
        let mut l = Learner::new(t.clone(), Bounds::default(), offline_cfg());
        for ep in 0..3u64 {
            store
                .append(
                    &(0..30)
                        .map(|s| fallback_row(&t, ep, s, 1.0))
                        .collect::<Vec<_>>(),
                )
                .unwrap();
            store.put_episode(&summary(&t, ep, 30)).unwrap();
        }
        let token = tokio_util::sync::CancellationToken::new();
        l.set_cancel(token.clone());
        token.cancel();
        match l.maybe_train_in(Stage::Offline, &store, &models) {
            Err(TrainerError::Cancelled { target }) => assert_eq!(target, t),
            other => panic!("{other:?}"),
        }
        assert!(models.keys("").unwrap().is_empty(), "nothing published");
    }

    #[test]
    fn offline_rounds_train_td3bc_on_fallback_rows_and_estimate_the_policy() {
        let (_dir, store, models) = stores();
        let t = Target::new("shop", "cart");
        let mut l = Learner::new(t.clone(), Bounds::default(), offline_cfg());
        // Three fallback episodes of 30 steps; rewards 1.0, 1.2, 1.4 by episode.
        for ep in 0..3u64 {
            let reward = 1.0 + 0.2 * ep as f64;
            store
                .append(
                    &(0..30)
                        .map(|s| fallback_row(&t, ep, s, reward))
                        .collect::<Vec<_>>(),
                )
                .unwrap();
            store.put_episode(&summary(&t, ep, 30)).unwrap();
        }
        // SERVING and INITIALIZED never train.
        assert_eq!(
            l.maybe_train_in(Stage::Serving, &store, &models).unwrap(),
            None
        );
        assert_eq!(
            l.maybe_train_in(Stage::Initialized, &store, &models)
                .unwrap(),
            None
        );
        let p = l
            .maybe_train_in(Stage::Offline, &store, &models)
            .unwrap()
            .expect("an offline round");
        assert_eq!(p.mode, RoundMode::Offline);
        assert_eq!((p.version, p.steps, p.skipped), (1, 20, 0));
        assert_eq!(p.bc_weight, 1.0);
        let est = p.estimate.expect("an estimate");
        // Evaluated on the last two episodes (60 fallback rows, rewards 1.2 and 1.4).
        assert_eq!(est.rows, 60);
        assert!((est.behaviour_reward - 1.3).abs() < 1e-6, "{est:?}");
        assert!(est.estimate.is_finite() && est.direct.is_finite());

        // RL rows (of a policy sent back to OFFLINE) are not trained on offline.
        let mut rl: Vec<_> = (0..30).map(|s| row(&t, 3, s)).collect();
        for r in &mut rl {
            r.source = DecisionSource::Rl;
            r.action_raw = vec![0.9, 0.9, 0.9];
        }
        store.append(&rl).unwrap();
        store
            .append(
                &(30..80)
                    .map(|s| fallback_row(&t, 3, s, 1.0))
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let p2 = l
            .maybe_train_in(Stage::Offline, &store, &models)
            .unwrap()
            .expect("a second offline round");
        assert!(p2.skipped > 0, "RL rows skipped");
        assert_eq!(p2.version, 2);

        // ONLINE: the first online round runs at once (a change of mode), continues the same
        // network and versions, and its BC weight decays over `online_bc_rounds`.
        let on1 = l
            .maybe_train_in(Stage::Online, &store, &models)
            .unwrap()
            .expect("first online round");
        assert_eq!(on1.mode, RoundMode::Online);
        assert_eq!(on1.version, 3);
        assert_eq!(on1.trained_steps, p2.trained_steps + on1.steps as u64);
        assert_eq!(on1.bc_weight, 1.0);
        assert!(on1.estimate.is_none());
        store
            .append(&(0..50).map(|s| row(&t, 4, s)).collect::<Vec<_>>())
            .unwrap();
        let on2 = l
            .maybe_train_in(Stage::Online, &store, &models)
            .unwrap()
            .unwrap();
        assert_eq!(on2.bc_weight, 0.5);
        store
            .append(&(0..50).map(|s| row(&t, 5, s)).collect::<Vec<_>>())
            .unwrap();
        let on3 = l
            .maybe_train_in(Stage::Online, &store, &models)
            .unwrap()
            .unwrap();
        assert_eq!(on3.bc_weight, 0.0);
        // Back to OFFLINE: an offline round at once, from the same checkpoint.
        let off = l
            .maybe_train_in(Stage::Offline, &store, &models)
            .unwrap()
            .unwrap();
        assert_eq!((off.mode, off.version), (RoundMode::Offline, 6));
        assert_eq!(off.trained_steps, on3.trained_steps + off.steps as u64);
        // And ONLINE again restarts the BC decay.
        let again = l
            .maybe_train_in(Stage::Online, &store, &models)
            .unwrap()
            .unwrap();
        assert_eq!(again.bc_weight, 1.0);
    }

    #[test]
    fn offline_rounds_wait_for_enough_fallback_data() {
        let (_dir, store, models) = stores();
        let t = Target::new("a", "b");
        let mut l = Learner::new(t.clone(), Bounds::default(), offline_cfg());
        store
            .append(
                &(0..30)
                    .map(|s| fallback_row(&t, 0, s, 1.0))
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        assert_eq!(
            l.maybe_train_in(Stage::Offline, &store, &models).unwrap(),
            None
        );
        // No finished episode yet: the round trains but has nothing to evaluate on.
        store
            .append(
                &(30..60)
                    .map(|s| fallback_row(&t, 0, s, 1.0))
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let p = l
            .maybe_train_in(Stage::Offline, &store, &models)
            .unwrap()
            .unwrap();
        assert!(p.estimate.is_none());
    }
}
