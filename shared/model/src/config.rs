//! DDPG configuration (defaults: AWARE paper, Table 2).

use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// Exploration noise process.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NoiseKind {
    /// Independent N(μ, σ²) per step (paper Table 2).
    Gaussian,
    /// Ornstein–Uhlenbeck: x ← x + θ(μ − x) + σ·N(0, 1), reset per episode.
    OrnsteinUhlenbeck {
        /// Mean reversion rate.
        theta: f32,
    },
}

/// Exploration noise: `a = clamp(μ_θ(s) + ε·noise, −1, 1)`, ε decaying linearly per explored
/// step (paper Table 2: μ 0, σ 0.2, ε 1.0, ε-decay 10⁻⁶).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NoiseConfig {
    /// Noise process.
    pub kind: NoiseKind,
    /// Noise mean μ.
    pub mu: f32,
    /// Noise standard deviation σ.
    pub sigma: f32,
    /// Initial scale ε.
    pub epsilon_start: f32,
    /// ε decrease per explored step.
    pub epsilon_decay: f32,
    /// Floor of ε.
    pub epsilon_min: f32,
}

impl Default for NoiseConfig {
    fn default() -> Self {
        Self {
            kind: NoiseKind::Gaussian,
            mu: 0.0,
            sigma: 0.2,
            epsilon_start: 1.0,
            epsilon_decay: 1e-6,
            epsilon_min: 0.0,
        }
    }
}

/// DDPG hyperparameters and network shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DdpgConfig {
    /// State width (9 simulator features; 9 + 64 with the meta-learner embedding).
    pub state_dim: usize,
    /// Actor hidden layer widths.
    pub actor_hidden: Vec<usize>,
    /// Critic hidden layer widths.
    pub critic_hidden: Vec<usize>,
    /// Actor Adam learning rate (Table 2: 3e-4).
    pub actor_lr: f64,
    /// Critic Adam learning rate (Table 2: 3e-3).
    pub critic_lr: f64,
    /// Discount γ (Table 2: 0.99).
    pub gamma: f32,
    /// Soft update coefficient τ (Table 2: 3e-3).
    pub tau: f32,
    /// Global gradient-norm clip per network (None: no clipping).
    pub max_grad_norm: Option<f32>,
    /// Normalized states are clipped to ±this.
    pub state_clip: f32,
    /// Exploration noise.
    pub noise: NoiseConfig,
    /// Seed for weight initialisation.
    pub seed: u64,
    /// Weight of `mean(z²)` in the actor's loss, z the input of its tanh output layer: keeps the
    /// actor out of tanh saturation, where the critic's gradient vanishes and a policy stays at a
    /// corner of the action space whatever the critic learns (without it, DDPG on the simulator
    /// saturates on most apps). 0 turns it off.
    #[serde(default = "default_preactivation_penalty")]
    pub actor_preactivation_penalty: f32,
    /// Bounds `[lo, hi]` the critic's bootstrapped target `r + γ(1−done)·Q'` is clamped to.
    /// With rewards bounded in `[r_min, r_max]` the true value lies in
    /// `[r_min/(1−γ), r_max/(1−γ)]` ([`DdpgConfig::value_bounds_for_rewards`]); clamping the
    /// target there stops the overestimation feedback (Q' too high ⇒ target too high ⇒ Q' higher)
    /// from running away. None: no clamp.
    #[serde(default)]
    pub target_bounds: Option<[f32; 2]>,
}

fn default_preactivation_penalty() -> f32 {
    1e-2
}

/// Widest layer accepted (guards checkpoint headers against absurd allocations).
pub const MAX_WIDTH: usize = 8192;
/// Deepest net accepted.
pub const MAX_HIDDEN_LAYERS: usize = 16;
/// Widest state accepted.
pub const MAX_STATE_DIM: usize = 65_536;

impl Default for DdpgConfig {
    fn default() -> Self {
        Self {
            state_dim: 9,
            actor_hidden: vec![256, 256],
            critic_hidden: vec![256, 256],
            actor_lr: 3e-4,
            critic_lr: 3e-3,
            gamma: 0.99,
            tau: 3e-3,
            max_grad_norm: Some(10.0),
            state_clip: 5.0,
            noise: NoiseConfig::default(),
            seed: 0,
            actor_preactivation_penalty: default_preactivation_penalty(),
            target_bounds: None,
        }
    }
}

impl DdpgConfig {
    /// Default config with the given hidden widths for both nets.
    pub fn with_hidden(state_dim: usize, hidden: &[usize]) -> Self {
        Self {
            state_dim,
            actor_hidden: hidden.to_vec(),
            critic_hidden: hidden.to_vec(),
            ..Self::default()
        }
    }

    /// The range of the discounted return when every reward lies in `[r_min, r_max]`:
    /// `[r_min/(1−γ), r_max/(1−γ)]` (for γ = 1 none, the return is unbounded).
    pub fn value_bounds_for_rewards(&self, r_min: f32, r_max: f32) -> Option<[f32; 2]> {
        (self.gamma < 1.0).then(|| {
            let k = 1.0 / (1.0 - self.gamma);
            [r_min * k, r_max * k]
        })
    }

    /// A critic target clamped to `target_bounds` (as is without them; NaN stays NaN, for the
    /// caller's finiteness check).
    pub fn clamp_target(&self, y: f32) -> f32 {
        match self.target_bounds {
            Some([lo, hi]) => y.clamp(lo, hi),
            None => y,
        }
    }

    /// Checks ranges; every constructor calls it.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::InvalidConfig(m));
        if self.state_dim == 0 || self.state_dim > MAX_STATE_DIM {
            return bad(format!(
                "state_dim {} not in 1..={MAX_STATE_DIM}",
                self.state_dim
            ));
        }
        for (name, h) in [
            ("actor", &self.actor_hidden),
            ("critic", &self.critic_hidden),
        ] {
            if h.is_empty() || h.len() > MAX_HIDDEN_LAYERS {
                return bad(format!(
                    "{name}_hidden must have 1..={MAX_HIDDEN_LAYERS} layers"
                ));
            }
            if h.iter().any(|&w| w == 0 || w > MAX_WIDTH) {
                return bad(format!("{name}_hidden widths must be in 1..={MAX_WIDTH}"));
            }
        }
        let pos = |x: f64| x.is_finite() && x > 0.0;
        if !pos(self.actor_lr) || !pos(self.critic_lr) {
            return bad("learning rates must be finite and > 0".into());
        }
        if !(self.actor_preactivation_penalty.is_finite()
            && self.actor_preactivation_penalty >= 0.0)
        {
            return bad("actor_preactivation_penalty must be finite and >= 0".into());
        }
        if !(self.gamma.is_finite() && (0.0..=1.0).contains(&self.gamma)) {
            return bad("gamma must be in [0, 1]".into());
        }
        if !(self.tau.is_finite() && self.tau > 0.0 && self.tau <= 1.0) {
            return bad("tau must be in (0, 1]".into());
        }
        if let Some(c) = self.max_grad_norm {
            if !(c.is_finite() && c > 0.0) {
                return bad("max_grad_norm must be finite and > 0".into());
            }
        }
        if !(self.state_clip.is_finite() && self.state_clip > 0.0) {
            return bad("state_clip must be finite and > 0".into());
        }
        if let Some([lo, hi]) = self.target_bounds {
            if !(lo.is_finite() && hi.is_finite() && lo < hi) {
                return bad(format!(
                    "target_bounds [{lo}, {hi}] must be finite with lo < hi"
                ));
            }
        }
        let n = &self.noise;
        let fin = [
            n.mu,
            n.sigma,
            n.epsilon_start,
            n.epsilon_decay,
            n.epsilon_min,
        ];
        if fin.iter().any(|x| !x.is_finite())
            || n.sigma < 0.0
            || n.epsilon_decay < 0.0
            || n.epsilon_min < 0.0
        {
            return bad("noise parameters must be finite, σ/decay/min ≥ 0".into());
        }
        if let NoiseKind::OrnsteinUhlenbeck { theta } = n.kind {
            if !(theta.is_finite() && theta > 0.0 && theta <= 1.0) {
                return bad("OU theta must be in (0, 1]".into());
            }
        }
        Ok(())
    }
}

/// Behaviour regularisation for offline training (TD3+BC, Fujimoto & Gu 2021): the actor
/// minimises `−λ·Q(s, μ(s)) / mean|Q| + w·mean((μ(s) − a)²)` over recorded `(s, a)`, so it
/// improves on the behaviour policy only where the critic has data; the critic's target uses
/// target policy smoothing `μ'(s') + clip(N(0, σ²), ±c)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BcConfig {
    /// λ: weight of the normalised Q term (paper: 2.5).
    pub alpha: f32,
    /// w: weight of the behaviour-cloning term (1 offline; decays to 0 online).
    pub bc_weight: f32,
    /// σ of the target policy smoothing noise (paper: 0.2; 0 switches it off).
    pub policy_noise: f32,
    /// c: the smoothing noise is clipped to ±c (paper: 0.5).
    pub noise_clip: f32,
}

impl Default for BcConfig {
    fn default() -> Self {
        Self {
            alpha: 2.5,
            bc_weight: 1.0,
            policy_noise: 0.2,
            noise_clip: 0.5,
        }
    }
}

impl BcConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ModelError> {
        let ok = |x: f32| x.is_finite() && x >= 0.0;
        if !ok(self.alpha) || !ok(self.bc_weight) || !ok(self.policy_noise) || !ok(self.noise_clip)
        {
            return Err(ModelError::InvalidConfig(
                "BC parameters (alpha, bc_weight, policy_noise, noise_clip) must be finite and >= 0"
                    .into(),
            ));
        }
        Ok(())
    }
}
