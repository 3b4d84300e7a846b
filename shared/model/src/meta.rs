//! The meta-learner (paper §3.2, §4.3): a workload embedding from a bundle of the target's best
//! episodes, and a base-learner conditioned on it, trained jointly.
//!
//! # Input layout
//! One episode is a sequence of per-step vectors of width `state_dim + 4`:
//!
//! ```text
//! [ s_0 … s_{d−1} | a_replicas a_cpu a_memory | r ]
//! ```
//!
//! `s` is the raw (unnormalized) simulator/collector state of the step (`loadgen::env`'s 9
//! features, each O(1)), `a` the action in the policy's space [−1, 1]³ that was applied at that
//! step (for fallback steps the behaviour action: the applied allocation expressed as a policy
//! action), and `r` the reward that followed (r_{t+1}, in [0, 2]). An [`EpisodeBundle`] holds M
//! such episodes of equal length T (the top-M of a target by reward; paper M = 20).
//!
//! # Network
//! A stacked bidirectional GRU (`layers` × `hidden`, PyTorch's cell) runs over every episode of
//! the bundle from a zero hidden state (the state resets at every workload switch: no state is
//! carried between bundles or episodes). The final states of the top layer, `[h_fwd(T−1) |
//! h_bwd(0)]` (2H), are averaged over the M episodes, then `FC(2H → fc_hidden) → ReLU →
//! FC(fc_hidden → embed_dim) → output activation` gives the embedding (paper: two FC layers of
//! 256 and 64 with ReLU).
//!
//! # Joint training
//! [`MetaDdpg`] is a DDPG base-learner whose actor sees `state ‖ embedding` and whose critic sees
//! `[action, state ‖ embedding]`. The actor loss −mean Q(s, μ(s ‖ e), e) backpropagates through
//! the actor into the embedding, the FC head and the GRU (BPTT); the critic gets the embedding
//! detached (it is trained on its TD error only). The base-learner is a plain [`Ddpg`] with
//! `state_dim = d + E` whose normalizer leaves the embedding features as they are (mean 0, std 1),
//! so `Ddpg::act(state ‖ embedding)` on the saved base checkpoint is exactly the trained policy.

mod gru;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{fnv1a, put_f32s, Cursor};
use crate::config::{DdpgConfig, MAX_STATE_DIM, MAX_WIDTH};
use crate::ddpg::Ddpg;
use crate::error::{check_dim, check_finite, ModelError};
use crate::net::{self, Adam, Dev, Mat, Mlp};
use crate::replay::Batch;
use crate::ACTION_DIM;

use gru::SeqShape;

/// Extra per-step features after the state: the action (3) and the reward (1).
pub const STEP_EXTRA: usize = ACTION_DIM + 1;
/// Magic bytes of a meta-learner checkpoint.
pub const META_MAGIC: [u8; 8] = *b"AWAREMTA";
/// Meta-learner checkpoint format version.
pub const META_FORMAT_VERSION: u32 = 1;
/// Longest episode accepted in a bundle.
pub const MAX_EPISODE_LEN: usize = 100_000;

/// Output activation of the embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EmbedActivation {
    /// ReLU (the paper's FC layers).
    Relu,
    /// tanh (a signed embedding in [−1, 1]).
    Tanh,
}

/// Meta-learner shape and optimizer settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaConfig {
    /// State width d of the per-step vectors (9 for `loadgen` states).
    pub state_dim: usize,
    /// GRU hidden width H per direction (paper 256; default 64, see [`MetaConfig::default`]).
    pub hidden: usize,
    /// Stacked bidirectional layers (paper 2).
    pub layers: usize,
    /// Width of the first FC layer (paper 256; 0: a single FC layer 2H → embed_dim).
    pub fc_hidden: usize,
    /// Embedding width E (paper 64).
    pub embed_dim: usize,
    /// Output activation of the embedding.
    pub activation: EmbedActivation,
    /// Episodes per bundle M (paper 20): how many episodes callers should select.
    pub bundle_size: usize,
    /// Adam learning rate of the meta-learner's parameters.
    pub lr: f64,
    /// Global gradient-norm clip of the meta-learner's gradients (GRU and head separately).
    pub max_grad_norm: Option<f32>,
    /// Initialisation seed.
    pub seed: u64,
}

impl Default for MetaConfig {
    /// H = 64, FC 64 → 64, 2 bidirectional layers, M = 20, E = 64. Measured on the 2-core
    /// development machine (`examples/meta_bench.rs`, release, one joint step over a 20 × 100
    /// bundle): H = 32 43 ms, H = 64 82 ms, H = 128 432 ms, H = 256 (the paper's) 1.1 s per
    /// BPTT iteration. H = 64 keeps meta-training of the default pool within minutes; the
    /// paper's sizes are [`MetaConfig::paper`].
    fn default() -> Self {
        Self {
            state_dim: 9,
            hidden: 64,
            layers: 2,
            fc_hidden: 64,
            embed_dim: 64,
            activation: EmbedActivation::Relu,
            bundle_size: 20,
            lr: 3e-4,
            max_grad_norm: Some(10.0),
            seed: 0,
        }
    }
}

impl MetaConfig {
    /// The paper's sizes (§4.3): H = 256, FC 256 → 64.
    pub fn paper() -> Self {
        Self {
            hidden: 256,
            fc_hidden: 256,
            ..Self::default()
        }
    }

    /// Width of one per-step vector: `state_dim + 4`.
    pub fn input_dim(&self) -> usize {
        self.state_dim + STEP_EXTRA
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::InvalidConfig(m));
        if self.state_dim == 0 || self.state_dim > MAX_STATE_DIM {
            return bad(format!(
                "meta state_dim {} not in 1..={MAX_STATE_DIM}",
                self.state_dim
            ));
        }
        for (name, v, min) in [
            ("hidden", self.hidden, 1),
            ("embed_dim", self.embed_dim, 1),
            ("fc_hidden", self.fc_hidden, 0),
            ("bundle_size", self.bundle_size, 1),
        ] {
            if v < min || v > MAX_WIDTH {
                return bad(format!("meta {name} {v} not in {min}..={MAX_WIDTH}"));
            }
        }
        if self.layers == 0 || self.layers > 8 {
            return bad(format!("meta layers {} not in 1..=8", self.layers));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("meta lr {} must be > 0", self.lr));
        }
        if let Some(c) = self.max_grad_norm {
            if !(c.is_finite() && c > 0.0) {
                return bad(format!("meta max_grad_norm {c} must be > 0"));
            }
        }
        Ok(())
    }

    fn head_sizes(&self) -> Vec<usize> {
        let mut s = vec![2 * self.hidden];
        if self.fc_hidden > 0 {
            s.push(self.fc_hidden);
        }
        s.push(self.embed_dim);
        s
    }
}

/// M episodes of one workload, each T per-step vectors `[state ‖ action ‖ reward]` (see the
/// module docs). Always non-empty, rectangular and finite.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeBundle {
    state_dim: usize,
    len: usize,
    episodes: Vec<Vec<f32>>,
}

impl EpisodeBundle {
    /// A bundle from episodes given as row-major `T × (state_dim + 4)` arrays; every episode must
    /// have the same length. Non-finite values are an error.
    pub fn new(state_dim: usize, episodes: Vec<Vec<f32>>) -> Result<Self, ModelError> {
        let w = state_dim + STEP_EXTRA;
        let first = episodes
            .first()
            .ok_or(ModelError::NotEnoughSamples { len: 0, need: 1 })?;
        let len = first.len() / w;
        if len == 0 || len > MAX_EPISODE_LEN {
            return Err(ModelError::Dimension {
                what: "episode steps (1..=MAX_EPISODE_LEN)",
                expected: w,
                got: first.len(),
            });
        }
        for e in &episodes {
            check_dim("episode length (equal in a bundle)", len * w, e.len())?;
            check_finite("episode", e)?;
        }
        Ok(Self {
            state_dim,
            len,
            episodes,
        })
    }

    /// Like [`EpisodeBundle::new`], cutting every episode to the shortest one (whole steps).
    pub fn truncated(state_dim: usize, mut episodes: Vec<Vec<f32>>) -> Result<Self, ModelError> {
        let w = state_dim + STEP_EXTRA;
        let min = episodes.iter().map(|e| e.len() / w).min().unwrap_or(0);
        for e in &mut episodes {
            e.truncate(min * w);
        }
        Self::new(state_dim, episodes)
    }

    /// One per-step vector `[state ‖ action ‖ reward]`.
    pub fn step_vector(state: &[f32], action: &[f32; ACTION_DIM], reward: f32) -> Vec<f32> {
        let mut v = Vec::with_capacity(state.len() + STEP_EXTRA);
        v.extend_from_slice(state);
        v.extend_from_slice(action);
        v.push(reward);
        v
    }

    /// Episodes M.
    pub fn episodes(&self) -> usize {
        self.episodes.len()
    }

    /// Steps per episode T.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (a bundle has at least one step); for clippy's `len` convention.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// State width d.
    pub fn state_dim(&self) -> usize {
        self.state_dim
    }

    /// Time-major rows of several bundles of the same shape: row `t·B + b`, `B = K·M`.
    fn time_major(bundles: &[&EpisodeBundle]) -> Vec<f32> {
        let (t_len, w) = match bundles.first() {
            Some(b) => (b.len, b.state_dim + STEP_EXTRA),
            None => return Vec::new(),
        };
        let eps: Vec<&Vec<f32>> = bundles.iter().flat_map(|b| b.episodes.iter()).collect();
        let mut x = Vec::with_capacity(t_len * eps.len() * w);
        for t in 0..t_len {
            for e in &eps {
                x.extend_from_slice(&e[t * w..(t + 1) * w]);
            }
        }
        x
    }
}

/// The meta-learner: bundle → embedding.
#[derive(Debug, Clone)]
pub struct MetaLearner {
    cfg: MetaConfig,
    dev: Dev,
    gru: Mlp,
    head: Mlp,
    gru_opt: Adam,
    head_opt: Adam,
    steps: u64,
}

impl MetaLearner {
    /// A freshly initialised meta-learner (`cfg.seed`).
    pub fn new(cfg: MetaConfig) -> Result<Self, ModelError> {
        cfg.validate()?;
        let dev = Dev::default();
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x6d65_7461);
        let gru = gru::new_gru(&dev, cfg.input_dim(), cfg.hidden, cfg.layers, &mut rng);
        let head = gru::new_head(&dev, &cfg.head_sizes(), &mut rng);
        Ok(Self {
            gru_opt: Adam::new(cfg.lr),
            head_opt: Adam::new(cfg.lr),
            gru,
            head,
            dev,
            cfg,
            steps: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MetaConfig {
        &self.cfg
    }

    /// Optimizer steps taken on the meta-learner's parameters.
    pub fn train_steps(&self) -> u64 {
        self.steps
    }

    /// Trainable parameters (GRU, head).
    pub fn num_params(&self) -> (usize, usize) {
        (
            self.gru.param_sizes().iter().sum(),
            self.head.param_sizes().iter().sum(),
        )
    }

    /// The embedding of one bundle (`embed_dim` values). A bundle of another state width, or a
    /// non-finite output, is an error.
    pub fn embed(&self, bundle: &EpisodeBundle) -> Result<Vec<f32>, ModelError> {
        let out = self.forward::<gru::NoTape>(&[bundle])?;
        let e = net::host(&out);
        check_finite("embedding", &e)?;
        Ok(e)
    }

    /// Embeddings of several bundles of the same shape (M, T) in one pass.
    pub fn embed_many(&self, bundles: &[&EpisodeBundle]) -> Result<Vec<Vec<f32>>, ModelError> {
        if bundles.is_empty() {
            return Ok(Vec::new());
        }
        let out = net::host(&self.forward::<gru::NoTape>(bundles)?);
        check_finite("embedding", &out)?;
        Ok(out
            .chunks(self.cfg.embed_dim)
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// `(K, E)` embeddings of `K` bundles of one shape.
    fn forward<T: gru::AnyTape>(&self, bundles: &[&EpisodeBundle]) -> Result<Mat<T>, ModelError> {
        let first = bundles
            .first()
            .ok_or(ModelError::NotEnoughSamples { len: 0, need: 1 })?;
        let (m, t) = (first.episodes(), first.len());
        for b in bundles {
            check_dim("bundle state_dim", self.cfg.state_dim, b.state_dim)?;
            check_dim("bundle episodes (equal in a batch)", m, b.episodes())?;
            check_dim("bundle steps (equal in a batch)", t, b.len())?;
        }
        let k = bundles.len();
        let x = EpisodeBundle::time_major(bundles);
        let shape = SeqShape {
            t,
            b: k * m,
            input: self.cfg.input_dim(),
            hidden: self.cfg.hidden,
            layers: self.cfg.layers,
        };
        let h = gru::encode::<T>(&self.dev, &self.gru, &x, shape);
        let pooled = gru::group_mean(h, k, m);
        let z = self.head.forward(pooled);
        Ok(match self.cfg.activation {
            EmbedActivation::Relu => gru::relu(z),
            EmbedActivation::Tanh => gru::tanh(z),
        })
    }

    /// Clips the meta-learner's gradients in `grads` (GRU and head separately); returns their
    /// joint norm before clipping. A non-finite gradient is an error.
    fn clip_grads(&self, grads: &mut net::Grads) -> Result<f32, ModelError> {
        let g1 = self.gru.clip_grad_norm(grads, self.cfg.max_grad_norm)?;
        let g2 = self.head.clip_grad_norm(grads, self.cfg.max_grad_norm)?;
        Ok((g1 * g1 + g2 * g2).sqrt())
    }

    /// One Adam step of the meta-learner's parameters with `grads`.
    fn step(&mut self, grads: &mut net::Grads) -> Result<(), ModelError> {
        self.gru_opt.step(&mut self.gru, grads)?;
        self.head_opt.step(&mut self.head, grads)?;
        self.steps += 1;
        Ok(())
    }

    /// All parameters, flattened (tests, change detection).
    pub fn parameters(&self) -> Vec<f32> {
        self.gru
            .export()
            .into_iter()
            .chain(self.head.export())
            .flatten()
            .collect()
    }
}

/// One workload's share of a [`MetaDdpg`] update: its bundle (→ embedding) and transitions.
#[derive(Debug, Clone, Copy)]
pub struct MetaGroup<'a> {
    /// The workload's episode bundle.
    pub bundle: &'a EpisodeBundle,
    /// Transitions of the same workload (raw states of width d).
    pub batch: &'a Batch,
}

/// What one joint update did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetaTrainStats {
    /// Joint steps so far.
    pub step: u64,
    /// Critic MSE.
    pub critic_loss: f32,
    /// Actor loss −mean Q(s, μ(s ‖ e), e).
    pub actor_loss: f32,
    /// Mean Q(s, a) of the batch.
    pub mean_q: f32,
    /// Meta-learner gradient norm before clipping (0 when the embedding is detached).
    pub meta_grad_norm: f32,
    /// Actor gradient norm before clipping.
    pub actor_grad_norm: f32,
}

/// A DDPG base-learner conditioned on the meta-learner's embedding, trained jointly with it.
#[derive(Debug, Clone)]
pub struct MetaDdpg {
    base: Ddpg,
    meta: MetaLearner,
    state_dim: usize,
    meta_trainable: bool,
}

impl MetaDdpg {
    /// A new agent. `ddpg.state_dim` is the raw state width d (= `meta.state_dim`); the
    /// base-learner is built with `d + embed_dim` inputs.
    pub fn new(ddpg: DdpgConfig, meta: MetaConfig) -> Result<Self, ModelError> {
        check_dim(
            "meta state_dim vs ddpg state_dim",
            ddpg.state_dim,
            meta.state_dim,
        )?;
        let d = ddpg.state_dim;
        let base = Ddpg::new(DdpgConfig {
            state_dim: d + meta.embed_dim,
            ..ddpg
        })?;
        let meta = MetaLearner::new(meta)?;
        Ok(Self {
            base,
            meta,
            state_dim: d,
            meta_trainable: true,
        })
    }

    /// Joins a base-learner and a meta-learner (e.g. loaded from their checkpoints).
    pub fn from_parts(base: Ddpg, meta: MetaLearner) -> Result<Self, ModelError> {
        let d = meta.cfg.state_dim;
        check_dim(
            "base state_dim (state + embedding)",
            d + meta.cfg.embed_dim,
            base.config().state_dim,
        )?;
        Ok(Self {
            base,
            meta,
            state_dim: d,
            meta_trainable: true,
        })
    }

    /// Raw state width d.
    pub fn state_dim(&self) -> usize {
        self.state_dim
    }

    /// The base-learner (a [`Ddpg`] over `state ‖ embedding`).
    pub fn base(&self) -> &Ddpg {
        &self.base
    }

    /// The meta-learner.
    pub fn meta(&self) -> &MetaLearner {
        &self.meta
    }

    /// Splits into base-learner and meta-learner.
    pub fn into_parts(self) -> (Ddpg, MetaLearner) {
        (self.base, self.meta)
    }

    /// Whether updates train the meta-learner (true) or treat the embedding as a constant
    /// (false: the meta-learner is frozen, as at inference time for a new workload).
    pub fn set_meta_trainable(&mut self, on: bool) {
        self.meta_trainable = on;
    }

    /// The embedding of a bundle.
    pub fn embed(&self, bundle: &EpisodeBundle) -> Result<Vec<f32>, ModelError> {
        self.meta.embed(bundle)
    }

    /// Folds a raw state into the normalizer (the embedding features stay mean 0, std 1).
    pub fn observe(&mut self, state: &[f32]) -> Result<(), ModelError> {
        check_dim("state", self.state_dim, state.len())?;
        let mut full = state.to_vec();
        full.resize(self.base.config().state_dim, 0.0);
        let n = &mut self.base.normalizer;
        if n.update(&full)? {
            let count = n.count as f64;
            for i in self.state_dim..n.mean.len() {
                n.mean[i] = 0.0;
                n.m2[i] = count;
            }
        }
        Ok(())
    }

    fn joined(&self, state: &[f32], embedding: &[f32]) -> Result<Vec<f32>, ModelError> {
        check_dim("state", self.state_dim, state.len())?;
        check_dim("embedding", self.meta.cfg.embed_dim, embedding.len())?;
        let mut full = state.to_vec();
        full.extend_from_slice(embedding);
        Ok(full)
    }

    /// μ(state ‖ embedding) in [−1, 1]³ (same as `base().act(state ‖ embedding)`).
    pub fn act(&self, state: &[f32], embedding: &[f32]) -> Result<[f32; ACTION_DIM], ModelError> {
        self.base.act(&self.joined(state, embedding)?)
    }

    /// `clamp(μ(state ‖ embedding) + N(0, σ²), ±1)`; the state is folded into the normalizer.
    pub fn act_noisy<R: Rng + ?Sized>(
        &mut self,
        state: &[f32],
        embedding: &[f32],
        sigma: f32,
        rng: &mut R,
    ) -> Result<[f32; ACTION_DIM], ModelError> {
        self.observe(state)?;
        let mut a = self.act(state, embedding)?;
        for x in &mut a {
            let z: f32 = rng.sample(StandardNormal);
            *x = (*x + sigma * z).clamp(-1.0, 1.0);
        }
        Ok(a)
    }

    /// Q(state ‖ embedding, action).
    pub fn q_value(
        &self,
        state: &[f32],
        embedding: &[f32],
        action: &[f32; ACTION_DIM],
    ) -> Result<f32, ModelError> {
        self.base.q_value(&self.joined(state, embedding)?, action)
    }

    /// One joint update over several workloads: every group's bundle gives its embedding (one
    /// GRU pass for all bundles, which must share M and T), the critic trains towards
    /// `r + γ(1−done)·Q'(s' ‖ e, μ'(s' ‖ e))` with the embedding detached, the actor along
    /// ∇ₐQ with the embedding on the tape, so the actor loss also updates the GRU and the FC
    /// head (unless [`MetaDdpg::set_meta_trainable`] turned that off). Soft target updates
    /// follow. Non-finite inputs, losses or gradients are errors and change nothing.
    pub fn train_step(&mut self, groups: &[MetaGroup<'_>]) -> Result<MetaTrainStats, ModelError> {
        let d = self.state_dim;
        let e_dim = self.meta.cfg.embed_dim;
        let full = d + e_dim;
        if groups.is_empty() {
            return Err(ModelError::NotEnoughSamples { len: 0, need: 1 });
        }
        let mut rows = Vec::new();
        for (k, g) in groups.iter().enumerate() {
            check_dim("batch state_dim", d, g.batch.state_dim)?;
            g.batch.validate()?;
            rows.extend(std::iter::repeat_n(k, g.batch.len()));
        }
        let n = rows.len();
        if n == 0 {
            return Err(ModelError::NotEnoughSamples { len: 0, need: 1 });
        }
        let bundles: Vec<&EpisodeBundle> = groups.iter().map(|g| g.bundle).collect();

        // Embeddings with the GRU's tape (or none when the meta-learner is frozen).
        let (e_taped, e_host) = if self.meta_trainable {
            let e = self.meta.forward::<gru::Taped>(&bundles)?;
            let h = net::host(&e);
            (Some(e), h)
        } else {
            (
                None,
                net::host(&self.meta.forward::<gru::NoTape>(&bundles)?),
            )
        };
        check_finite("embedding", &e_host)?;

        // Rows [s ‖ e] and [s' ‖ e], normalized like `Ddpg::act` does.
        let join = |src: &dyn Fn(&Batch) -> &Vec<f32>| -> Vec<f32> {
            let mut out = Vec::with_capacity(n * full);
            for g in groups.iter().enumerate() {
                let (k, g) = g;
                for s in src(g.batch).chunks(d) {
                    out.extend_from_slice(s);
                    out.extend_from_slice(&e_host[k * e_dim..(k + 1) * e_dim]);
                }
            }
            out
        };
        let norm = &self.base.normalizer;
        let s = norm.normalize_rows(&join(&|b: &Batch| &b.states))?;
        let s2 = norm.normalize_rows(&join(&|b: &Batch| &b.next_states))?;
        let mut actions = Vec::with_capacity(n * ACTION_DIM);
        let mut rewards = Vec::with_capacity(n);
        let mut dones = Vec::with_capacity(n);
        for g in groups {
            actions.extend_from_slice(&g.batch.actions);
            rewards.extend_from_slice(&g.batch.rewards);
            dones.extend_from_slice(&g.batch.dones);
        }
        let (dev, cfg) = (&self.base.dev, &self.base.cfg);

        // Critic target (no gradients).
        let s2_t = net::mat(dev, s2, n, full);
        let a2 = self.base.actor_target.forward(s2_t.clone());
        let q2 = net::host(&self.base.critic_target.forward(net::concat_cols(a2, s2_t)));
        let y: Vec<f32> = (0..n)
            .map(|i| rewards[i] + cfg.gamma * (1.0 - dones[i]) * q2[i])
            .collect();
        check_finite("critic target", &y)?;

        // Critic.
        let mut sa = Vec::with_capacity(n * (ACTION_DIM + full));
        for i in 0..n {
            sa.extend_from_slice(&actions[i * ACTION_DIM..(i + 1) * ACTION_DIM]);
            sa.extend_from_slice(&s[i * full..(i + 1) * full]);
        }
        let q = self
            .base
            .critic
            .forward(net::traced(net::mat(dev, sa, n, ACTION_DIM + full)));
        let mean_q = net::host(&q).iter().sum::<f32>() / n as f32;
        let critic_loss = net::mse(q, net::mat(dev, y, n, 1));
        let critic_loss_v = net::scalar(&critic_loss);
        check_finite("critic loss", &[critic_loss_v, mean_q])?;
        let mut cg = net::backward(critic_loss);
        self.base
            .critic
            .clip_grad_norm(&mut cg, cfg.max_grad_norm)?;

        // Actor: input [normalized state ‖ e], e on the meta-learner's tape.
        let s_full = net::mat(dev, s.clone(), n, full);
        let a = match e_taped {
            Some(e) => {
                let s_only: Vec<f32> = s.chunks(full).flat_map(|r| r[..d].to_vec()).collect();
                let e_rows = gru::pick_rows(dev, e, &rows);
                let x = gru::concat_taped(gru::with_tape(net::mat(dev, s_only, n, d)), e_rows);
                self.base.actor.forward(x)
            }
            None => self.base.actor.forward(net::traced(s_full.clone())),
        };
        let actor_loss = net::neg_mean(self.base.critic.forward(net::concat_cols(a, s_full)));
        let actor_loss_v = net::scalar(&actor_loss);
        check_finite("actor loss", &[actor_loss_v])?;
        let mut ag = net::backward(actor_loss);
        let actor_grad_norm = self.base.actor.clip_grad_norm(&mut ag, cfg.max_grad_norm)?;
        // Checked before anything is applied: the meta-learner's gradients.
        let meta_grad_norm = self.meta.clip_grads(&mut ag)?;

        // Everything checked: apply.
        let base = &mut self.base;
        base.critic_opt.step(&mut base.critic, &mut cg)?;
        base.actor_opt.step(&mut base.actor, &mut ag)?;
        if self.meta_trainable {
            self.meta.step(&mut ag)?;
        }
        base.soft_update();
        base.steps += 1;
        Ok(MetaTrainStats {
            step: base.steps,
            critic_loss: critic_loss_v,
            actor_loss: actor_loss_v,
            mean_q,
            meta_grad_norm: if self.meta_trainable {
                meta_grad_norm
            } else {
                0.0
            },
            actor_grad_norm,
        })
    }
}

#[derive(Serialize, Deserialize)]
struct MetaHeader {
    config: MetaConfig,
    train_steps: u64,
    gru_adam_t: i32,
    head_adam_t: i32,
}

impl MetaLearner {
    /// The checkpoint as bytes. Format (little endian), in the style of the DDPG checkpoint:
    /// `"AWAREMTA" | u32 version | u32 header_len | header JSON (config, steps, Adam step
    /// counts) | u32 block_count | blocks (u64 n + n f32): GRU params, head params, GRU Adam
    /// m, v, head Adam m, v | u64 FNV-1a-64 of everything before`.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ModelError> {
        let mut gopt = self.gru_opt.clone();
        let mut hopt = self.head_opt.clone();
        let (gm, gv) = gopt.export(&self.gru)?;
        let (hm, hv) = hopt.export(&self.head)?;
        let header = MetaHeader {
            config: self.cfg.clone(),
            train_steps: self.steps,
            gru_adam_t: self.gru_opt.t,
            head_adam_t: self.head_opt.t,
        };
        let header = serde_json::to_vec(&header).map_err(|e| ModelError::Header(e.to_string()))?;
        let mut out = Vec::new();
        out.extend_from_slice(&META_MAGIC);
        out.extend_from_slice(&META_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        let blocks: Vec<Vec<f32>> = [self.gru.export(), self.head.export(), gm, gv, hm, hv]
            .into_iter()
            .flatten()
            .collect();
        out.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
        for b in &blocks {
            put_f32s(&mut out, b);
        }
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    /// Decodes [`MetaLearner::to_bytes`]: size, magic, version and checksum first, then every
    /// block against the sizes the header's config implies; errors, never panics.
    pub fn from_bytes(buf: &[u8]) -> Result<Self, ModelError> {
        if buf.len() < META_MAGIC.len() {
            return Err(ModelError::Truncated("magic"));
        }
        if buf[..META_MAGIC.len()] != META_MAGIC {
            return Err(ModelError::BadMagic);
        }
        if buf.len() < META_MAGIC.len() + 4 + 4 + 8 {
            return Err(ModelError::Truncated("header"));
        }
        let (body, sum) = buf.split_at(buf.len() - 8);
        let mut c = Cursor { buf: body, pos: 0 };
        c.take(META_MAGIC.len(), "magic")?;
        let version = c.u32("version")?;
        if version != META_FORMAT_VERSION {
            return Err(ModelError::UnsupportedVersion {
                found: version,
                supported: META_FORMAT_VERSION,
            });
        }
        let mut sb = [0u8; 8];
        sb.copy_from_slice(sum);
        if fnv1a(body) != u64::from_le_bytes(sb) {
            return Err(ModelError::Checksum);
        }
        let hlen = c.u32("header length")? as usize;
        let header: MetaHeader = serde_json::from_slice(c.take(hlen, "header")?)
            .map_err(|e| ModelError::Header(e.to_string()))?;
        let mut m = MetaLearner::new(header.config)?;
        let gs = m.gru.param_sizes();
        let hs = m.head.param_sizes();
        let expected = 3 * (gs.len() + hs.len());
        let blocks = c.u32("block count")? as usize;
        if blocks != expected {
            return Err(ModelError::ShapeMismatch {
                index: 0,
                expected,
                found: blocks,
            });
        }
        let mut index = 0;
        let mut read = |c: &mut Cursor, sizes: &[usize]| -> Result<Vec<Vec<f32>>, ModelError> {
            sizes
                .iter()
                .map(|&n| {
                    index += 1;
                    c.f32s(index - 1, n)
                })
                .collect()
        };
        let gru_p = read(&mut c, &gs)?;
        let head_p = read(&mut c, &hs)?;
        let gm = read(&mut c, &gs)?;
        let gv = read(&mut c, &gs)?;
        let hm = read(&mut c, &hs)?;
        let hv = read(&mut c, &hs)?;
        if c.pos != body.len() {
            return Err(ModelError::TrailingBytes(body.len() - c.pos));
        }
        m.gru.import(&gru_p)?;
        m.head.import(&head_p)?;
        m.gru_opt.import(&m.gru, header.gru_adam_t, &gm, &gv)?;
        m.head_opt.import(&m.head, header.head_adam_t, &hm, &hv)?;
        m.steps = header.train_steps;
        Ok(m)
    }
}

#[cfg(test)]
mod tests;
