//! DDPG (Lillicrap et al., as in FIRM/AWARE): deterministic actor, Q critic, target nets with
//! soft updates, Adam, gradient-norm clipping, exploration noise and state normalization.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use crate::config::{BcConfig, DdpgConfig, NoiseKind};
use crate::error::{check_dim, check_finite, ModelError};
use crate::net::{self, Adam, Dev, Mlp, OutAct};
use crate::normalizer::Normalizer;
use crate::replay::Batch;
use crate::ACTION_DIM;

/// What one gradient step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainStats {
    /// Gradient steps taken so far (including this one).
    pub step: u64,
    /// Critic MSE against the bootstrapped target.
    pub critic_loss: f32,
    /// Actor loss −mean Q(s, μ(s)).
    pub actor_loss: f32,
    /// Mean Q(s, a) over the batch (before the update).
    pub mean_q: f32,
    /// Critic gradient norm before clipping.
    pub critic_grad_norm: f32,
    /// Actor gradient norm before clipping.
    pub actor_grad_norm: f32,
    /// Behaviour-cloning term mean((μ(s) − a)²) of the actor loss (0 without BC).
    pub bc_loss: f32,
}

/// The off-policy estimate of a policy's mean per-step reward on recorded data
/// ([`Ddpg::estimate_policy`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyEstimate {
    /// ρ̂(π) = ρ̂(β) + mean over the data of Q(s, μ(s)) − Q(s, a): the policy's estimated mean
    /// per-step reward.
    pub estimate: f64,
    /// ρ̂(β): the mean recorded reward (what the behaviour policy earned on the data).
    pub behaviour_reward: f64,
    /// mean Q(s, μ(s)) − Q(s, a): the estimated per-step advantage of the policy.
    pub advantage: f64,
    /// (1 − γ)·mean Q(s, μ(s)): the direct estimate (biased by the critic's level error).
    pub direct: f64,
    /// mean |μ(s) − a| over the data and the action dimensions.
    pub action_gap: f64,
    /// Rows used.
    pub rows: usize,
}

/// Exploration noise state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NoiseState {
    pub(crate) epsilon: f32,
    pub(crate) ou: [f32; ACTION_DIM],
}

/// A DDPG agent. All tensors are private; the API speaks `&[f32]` and `[f32; 3]`.
#[derive(Debug, Clone)]
pub struct Ddpg {
    /// The acting half (actor, normalizer, exploration state, configuration, steps taken).
    pub(crate) policy: Policy,
    pub(crate) actor_target: Mlp,
    pub(crate) critic: Mlp,
    pub(crate) critic_target: Mlp,
    pub(crate) actor_opt: Adam,
    pub(crate) critic_opt: Adam,
    /// What the learner training this agent keeps with its checkpoint (the trainer's Lagrange
    /// multiplier: the critic's rewards depend on it); opaque here.
    pub(crate) learner_state: Option<serde_json::Value>,
}

impl Ddpg {
    /// A freshly initialised agent (targets equal the online nets).
    pub fn new(cfg: DdpgConfig) -> Result<Self, ModelError> {
        cfg.validate()?;
        let dev = Dev::default();
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let mut sizes = vec![cfg.state_dim];
        sizes.extend(&cfg.actor_hidden);
        sizes.push(ACTION_DIM);
        let actor = Mlp::new(&dev, &sizes, OutAct::Tanh, &mut rng);
        let mut sizes = vec![ACTION_DIM + cfg.state_dim];
        sizes.extend(&cfg.critic_hidden);
        sizes.push(1);
        let critic = Mlp::new(&dev, &sizes, OutAct::Identity, &mut rng);
        Ok(Self {
            actor_target: actor.clone(),
            critic_target: critic.clone(),
            critic,
            actor_opt: Adam::new(cfg.actor_lr),
            critic_opt: Adam::new(cfg.critic_lr),
            learner_state: None,
            policy: Policy {
                actor,
                normalizer: Normalizer::new(cfg.state_dim, cfg.state_clip),
                noise: NoiseState {
                    epsilon: cfg.noise.epsilon_start,
                    ou: [0.0; ACTION_DIM],
                },
                steps: 0,
                dev,
                cfg,
            },
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DdpgConfig {
        self.policy.config()
    }

    /// What the learner training this agent keeps with it, saved and loaded with the
    /// checkpoint (`None` for a new agent and for checkpoints written without it).
    pub fn learner_state(&self) -> Option<&serde_json::Value> {
        self.learner_state.as_ref()
    }

    /// Sets what [`Ddpg::learner_state`] returns.
    pub fn set_learner_state(&mut self, state: Option<serde_json::Value>) {
        self.learner_state = state;
    }

    /// Gradient steps taken.
    pub fn train_steps(&self) -> u64 {
        self.policy.train_steps()
    }

    /// Current exploration scale ε.
    pub fn epsilon(&self) -> f32 {
        self.policy.epsilon()
    }

    /// The state normalizer.
    pub fn normalizer(&self) -> &Normalizer {
        self.policy.normalizer()
    }

    /// Mutable normalizer (freeze for serving, fit on offline data).
    pub fn normalizer_mut(&mut self) -> &mut Normalizer {
        self.policy.normalizer_mut()
    }

    /// Folds a state into the normalizer (no-op while frozen).
    pub fn observe(&mut self, state: &[f32]) -> Result<(), ModelError> {
        self.policy.observe(state)
    }

    /// Sets the exploration noise σ (for fine-tuning a pre-trained policy, which needs less
    /// exploration than learning from scratch). Not finite or negative: an error, σ unchanged.
    pub fn set_exploration_sigma(&mut self, sigma: f32) -> Result<(), ModelError> {
        let mut cfg = self.policy.cfg.clone();
        cfg.noise.sigma = sigma;
        cfg.validate()?;
        self.policy.cfg = cfg;
        Ok(())
    }

    /// Resets per-episode exploration state (the OU process).
    pub fn reset_noise(&mut self) {
        self.policy.noise.ou = [0.0; ACTION_DIM];
    }

    /// The policy's action μ(s) in [−1, 1]³. A non-finite or wrongly sized state, or a
    /// non-finite network output, is an error: the caller uses its fallback.
    pub fn act(&self, state: &[f32]) -> Result<[f32; ACTION_DIM], ModelError> {
        self.policy.act(state)
    }

    /// Actions for many states at once (`states` row-major, `n × state_dim`).
    pub fn act_batch(&self, states: &[f32]) -> Result<Vec<[f32; ACTION_DIM]>, ModelError> {
        self.policy.act_batch(states)
    }

    /// Exploring action: folds the state into the normalizer (unless frozen), then
    /// `clamp(μ(s) + ε·noise, −1, 1)` and decays ε.
    pub fn act_explore<R: Rng + ?Sized>(
        &mut self,
        state: &[f32],
        rng: &mut R,
    ) -> Result<[f32; ACTION_DIM], ModelError> {
        self.act_explore_scaled(state, rng, 1.0)
    }

    /// [`Ddpg::act_explore`] with the noise scaled by `scale` (the checkpoint's σ unchanged):
    /// `clamp(μ(s) + scale·ε·noise, −1, 1)`. A scale that is not finite and ≥ 0 is refused.
    pub fn act_explore_scaled<R: Rng + ?Sized>(
        &mut self,
        state: &[f32],
        rng: &mut R,
        scale: f32,
    ) -> Result<[f32; ACTION_DIM], ModelError> {
        self.policy.act_explore_scaled(state, rng, scale)
    }

    /// The acting half of the agent ([`Policy`]): the actor, normalizer and exploration state;
    /// the critic, target networks and optimizer state are dropped.
    pub fn into_policy(self) -> Policy {
        self.policy
    }

    /// Q(s, a) of the online critic.
    pub fn q_value(&self, state: &[f32], action: &[f32; ACTION_DIM]) -> Result<f32, ModelError> {
        check_finite("action", action)?;
        let s = self.policy.normalizer.normalize(state)?;
        let mut x = action.to_vec();
        x.extend_from_slice(&s);
        let q = net::host(&self.critic.forward(net::mat(
            &self.policy.dev,
            x,
            1,
            ACTION_DIM + self.policy.cfg.state_dim,
        )));
        let q = q.first().copied().unwrap_or(f32::NAN);
        check_finite("critic output", &[q])?;
        Ok(q)
    }

    /// One DDPG update on `batch`: critic towards r + γ(1−done)Q'(s', μ'(s')), actor along
    /// ∇ₐQ, then soft target updates. A non-finite batch, loss or gradient is an error and
    /// leaves every weight unchanged.
    pub fn train_step(&mut self, batch: &Batch) -> Result<TrainStats, ModelError> {
        self.update(batch, None, true)
    }

    /// The critic half of [`Ddpg::train_step`] only: the critic moves towards the same
    /// bootstrapped target, the actor keeps its weights (`actor_loss` and `actor_grad_norm` are
    /// reported as 0), then the soft target updates. For fine-tuning a pre-trained policy on a
    /// new workload: its critic has never seen the workload's returns, and an actor that follows
    /// the gradient of such a critic can lose the reward it started with; a critic warm-up fits
    /// the critic to the new workload first. Same error guarantees as `train_step`.
    pub fn train_critic_step(&mut self, batch: &Batch) -> Result<TrainStats, ModelError> {
        self.update(batch, None, false)
    }

    /// One TD3+BC update (offline training without extrapolation error): the critic as in
    /// [`Ddpg::train_step`] (only recorded actions are scored; the bootstrap action gets target
    /// policy smoothing), the actor minimises
    /// `−λ·mean Q(s, μ(s)) / L + w·mean((μ(s) − a)²)` where `a` is the recorded (behaviour)
    /// action of each row and `L = max(mean|Q(s, μ(s))|, mean |r|/(1 − γ(1−done)))` (TD3+BC's
    /// mean|Q|, floored by the level Q converges to, so an immature critic cannot outweigh the
    /// BC term). Same error guarantees as `train_step`.
    pub fn train_step_bc(
        &mut self,
        batch: &Batch,
        bc: &BcConfig,
    ) -> Result<TrainStats, ModelError> {
        bc.validate()?;
        self.update(batch, Some(bc), true)
    }

    fn update(
        &mut self,
        batch: &Batch,
        bc: Option<&BcConfig>,
        train_actor: bool,
    ) -> Result<TrainStats, ModelError> {
        check_dim(
            "batch state_dim",
            self.policy.cfg.state_dim,
            batch.state_dim,
        )?;
        batch.validate()?;
        let n = batch.len();
        if n == 0 {
            return Err(ModelError::NotEnoughSamples { len: 0, need: 1 });
        }
        let d = self.policy.cfg.state_dim;
        let s = self.policy.normalizer.normalize_rows(&batch.states)?;
        let s2 = self.policy.normalizer.normalize_rows(&batch.next_states)?;

        // Bootstrapped target (no gradients).
        let s2_t = net::mat(&self.policy.dev, s2, n, d);
        let a2 = self.actor_target.forward(s2_t.clone());
        let a2 = match bc {
            Some(b) if b.policy_noise > 0.0 => {
                // Target policy smoothing, reproducible per step.
                let mut rng = ChaCha8Rng::seed_from_u64(
                    self.policy.cfg.seed ^ self.policy.steps.rotate_left(17),
                );
                let noisy: Vec<f32> = net::host(&a2)
                    .into_iter()
                    .map(|a| {
                        let z: f32 = rng.sample(StandardNormal);
                        (a + (b.policy_noise * z).clamp(-b.noise_clip, b.noise_clip))
                            .clamp(-1.0, 1.0)
                    })
                    .collect();
                net::mat(&self.policy.dev, noisy, n, ACTION_DIM)
            }
            _ => a2,
        };
        let q2 = net::host(&self.critic_target.forward(net::concat_cols(a2, s2_t)));
        let y: Vec<f32> = (0..n)
            .map(|i| {
                self.policy.cfg.clamp_target(
                    batch.rewards[i] + self.policy.cfg.gamma * (1.0 - batch.dones[i]) * q2[i],
                )
            })
            .collect();
        check_finite("critic target", &y)?;

        // Critic.
        let mut sa = Vec::with_capacity(n * (ACTION_DIM + d));
        for i in 0..n {
            sa.extend_from_slice(&batch.actions[i * ACTION_DIM..(i + 1) * ACTION_DIM]);
            sa.extend_from_slice(&s[i * d..(i + 1) * d]);
        }
        let q = self.critic.forward(net::traced(net::mat(
            &self.policy.dev,
            sa,
            n,
            ACTION_DIM + d,
        )));
        let mean_q = net::host(&q).iter().sum::<f32>() / n as f32;
        let critic_loss = net::mse(q, net::mat(&self.policy.dev, y, n, 1));
        let critic_loss_v = net::scalar(&critic_loss);
        check_finite("critic loss", &[critic_loss_v, mean_q])?;
        let mut cg = net::backward(critic_loss);
        let critic_grad_norm = self
            .critic
            .clip_grad_norm(&mut cg, self.policy.cfg.max_grad_norm)?;

        if !train_actor {
            self.critic_opt.step(&mut self.critic, &mut cg)?;
            self.soft_update();
            self.policy.steps += 1;
            return Ok(TrainStats {
                step: self.policy.steps,
                critic_loss: critic_loss_v,
                actor_loss: 0.0,
                mean_q,
                critic_grad_norm,
                actor_grad_norm: 0.0,
                bc_loss: 0.0,
            });
        }

        // Actor (through the critic as it was before this step's update).
        let s_t = net::mat(&self.policy.dev, s, n, d);
        let pre = self.policy.actor.forward_pre(net::traced(s_t.clone()));
        let (a, pre_copy) = net::tanh_and_pre(pre);
        let (actor_loss, bc_loss) = match bc {
            None => (
                net::neg_mean(self.critic.forward(net::concat_cols(a, s_t))),
                0.0,
            ),
            Some(b) => {
                // λ / mean|Q(s, μ(s))|, detached (computed without a tape).
                let q_pi = net::host(
                    &self
                        .critic
                        .forward(net::concat_cols(net::detached(&a), s_t.clone())),
                );
                let mean_abs = q_pi.iter().map(|q| q.abs()).sum::<f32>() / n as f32;
                // The scale Q will reach, Σ|r|/(1 − γ(1−done)): early in training the critic's
                // level is still far below it (its targets move at rate τ), and dividing by that
                // small level would let the critic's noise outweigh the BC term.
                let level = (0..n)
                    .map(|i| {
                        batch.rewards[i].abs()
                            / (1.0 - self.policy.cfg.gamma * (1.0 - batch.dones[i])).max(1e-3)
                    })
                    .sum::<f32>()
                    / n as f32;
                check_finite("mean |Q|", &[mean_abs, level])?;
                let scale = b.alpha / mean_abs.max(level).max(1e-6);
                let behaviour = net::mat(&self.policy.dev, batch.actions.clone(), n, ACTION_DIM);
                let (loss, _, bc_v) =
                    net::bc_actor_loss(a, s_t, &self.critic, behaviour, scale, b.bc_weight);
                (loss, bc_v)
            }
        };
        let actor_loss = net::with_preactivation_penalty(
            actor_loss,
            pre_copy,
            self.policy.cfg.actor_preactivation_penalty,
        );
        let actor_loss_v = net::scalar(&actor_loss);
        check_finite("actor loss", &[actor_loss_v, bc_loss])?;
        let mut ag = net::backward(actor_loss);
        let actor_grad_norm = self
            .policy
            .actor
            .clip_grad_norm(&mut ag, self.policy.cfg.max_grad_norm)?;

        // Everything checked: apply.
        self.critic_opt.step(&mut self.critic, &mut cg)?;
        self.actor_opt.step(&mut self.policy.actor, &mut ag)?;
        self.soft_update();
        self.policy.steps += 1;
        Ok(TrainStats {
            step: self.policy.steps,
            critic_loss: critic_loss_v,
            actor_loss: actor_loss_v,
            mean_q,
            critic_grad_norm,
            actor_grad_norm,
            bc_loss,
        })
    }

    /// Off-policy estimate of the policy's mean per-step reward on recorded data (`batch`: the
    /// behaviour policy's transitions). By the performance-difference lemma (Kakade & Langford
    /// 2002) taken over the *behaviour's* state–action distribution, where it is exact for the
    /// policy's own critic Q^π: ρ(π) − ρ(β) = E_{(s,a)∼d^β}[Q^π(s, π(s)) − Q^π(s, a)] in per-step
    /// units. So ρ̂(π) = mean recorded reward + mean[Q(s, μ(s)) − Q(s, a)]: the recorded rewards
    /// give the level exactly, and the critic contributes only a difference of two of its values
    /// at the same state, in which its (slowly converging, γ-amplified) level error cancels. The
    /// direct (1 − γ)·mean Q(s, μ(s)) is returned for comparison. Needs the normalizer fitted.
    pub fn estimate_policy(&self, batch: &Batch) -> Result<PolicyEstimate, ModelError> {
        check_dim(
            "batch state_dim",
            self.policy.cfg.state_dim,
            batch.state_dim,
        )?;
        batch.validate()?;
        let n = batch.len();
        if n == 0 {
            return Err(ModelError::NotEnoughSamples { len: 0, need: 1 });
        }
        let d = self.policy.cfg.state_dim;
        let s = self.policy.normalizer.normalize_rows(&batch.states)?;
        let s_t = net::mat(&self.policy.dev, s, n, d);
        let a_pi = self.policy.actor.forward(s_t.clone());
        let pi = net::host(&a_pi);
        check_finite("actor output", &pi)?;
        let q_pi = net::host(&self.critic.forward(net::concat_cols(a_pi, s_t.clone())));
        let a_b = net::mat(&self.policy.dev, batch.actions.clone(), n, ACTION_DIM);
        let q_b = net::host(&self.critic.forward(net::concat_cols(a_b, s_t)));
        check_finite("critic output", &q_pi)?;
        check_finite("critic output", &q_b)?;
        let nf = n as f64;
        let behaviour_reward = batch.rewards.iter().map(|&r| f64::from(r)).sum::<f64>() / nf;
        let advantage = q_pi
            .iter()
            .zip(&q_b)
            .map(|(p, b)| f64::from(*p) - f64::from(*b))
            .sum::<f64>()
            / nf;
        let direct = (1.0 - f64::from(self.policy.cfg.gamma))
            * q_pi.iter().map(|&q| f64::from(q)).sum::<f64>()
            / nf;
        let action_gap = pi
            .iter()
            .zip(&batch.actions)
            .map(|(p, a)| f64::from((p - a).abs()))
            .sum::<f64>()
            / (nf * ACTION_DIM as f64);
        Ok(PolicyEstimate {
            estimate: behaviour_reward + advantage,
            behaviour_reward,
            advantage,
            direct,
            action_gap,
            rows: n,
        })
    }

    /// target ← (1−τ)·target + τ·online for both nets.
    pub fn soft_update(&mut self) {
        let tau = self.policy.cfg.tau;
        self.actor_target.soft_update_from(&self.policy.actor, tau);
        self.critic_target.soft_update_from(&self.critic, tau);
    }

    /// Shrink and perturb (Ash & Adams 2020), against the primacy bias of a network trained long
    /// on one regime: θ ← α·θ + (1 − α)·θ₀ for the actor and the critic, θ₀ a fresh
    /// initialisation drawn with `seed`; the targets are set to the result and the Adam state is
    /// reset. α = 1 keeps the weights, α = 0 is a full reset. The normalizer, the step count and
    /// the exploration state are kept. α outside [0, 1]: an error, nothing changed.
    pub fn shrink_perturb(&mut self, alpha: f32, seed: u64) -> Result<(), ModelError> {
        if !(alpha.is_finite() && (0.0..=1.0).contains(&alpha)) {
            return Err(ModelError::InvalidConfig(format!(
                "shrink-and-perturb α must be in [0, 1], got {alpha}"
            )));
        }
        let fresh = Ddpg::new(DdpgConfig {
            seed,
            ..self.policy.cfg.clone()
        })?;
        // soft_update_from(x, τ): self ← (1 − τ)·self + τ·x.
        self.policy
            .actor
            .soft_update_from(&fresh.policy.actor, 1.0 - alpha);
        self.critic.soft_update_from(&fresh.critic, 1.0 - alpha);
        self.actor_target = self.policy.actor.clone();
        self.critic_target = self.critic.clone();
        self.actor_opt = Adam::new(self.policy.cfg.actor_lr);
        self.critic_opt = Adam::new(self.policy.cfg.critic_lr);
        Ok(())
    }

    /// This agent with `n` state inputs inserted before state input `at` (`at` ≤ the state
    /// width): their weights in the first layer of the actor and the critic (and of their
    /// targets) are zero and the normalizer holds them at mean 0, std 1, so the widened agent
    /// acts and values exactly as this one whatever the new inputs hold; training then learns
    /// their weights. The step count, exploration state, normalizer statistics and learner state
    /// are kept; the Adam moments restart (their shapes change).
    pub fn with_inputs_inserted(&self, at: usize, n: usize) -> Result<Ddpg, ModelError> {
        let d = self.policy.cfg.state_dim;
        if at > d {
            return Err(ModelError::InvalidConfig(format!(
                "inputs inserted at {at}, past the state's {d}"
            )));
        }
        let mut out = Ddpg::new(DdpgConfig {
            state_dim: d + n,
            ..self.policy.cfg.clone()
        })?;
        let widened = |net: &Mlp, row: usize| -> Vec<Vec<f32>> {
            let mut p = net.export();
            // The first layer's bias has one entry per output.
            let fan_out = net.param_sizes().get(1).copied().unwrap_or(0);
            if let Some(w) = p.first_mut() {
                let tail = w.split_off(row * fan_out);
                w.extend(std::iter::repeat_n(0.0, n * fan_out));
                w.extend(tail);
            }
            p
        };
        out.policy.actor.import(&widened(&self.policy.actor, at))?;
        out.actor_target.import(&widened(&self.actor_target, at))?;
        out.critic.import(&widened(&self.critic, ACTION_DIM + at))?;
        out.critic_target
            .import(&widened(&self.critic_target, ACTION_DIM + at))?;
        out.policy.normalizer = self.policy.normalizer.with_inserted(at, n);
        out.policy.noise = self.policy.noise.clone();
        out.policy.steps = self.policy.steps;
        out.learner_state = self.learner_state.clone();
        Ok(out)
    }

    /// Number of trainable parameters (actor, critic).
    pub fn num_params(&self) -> (usize, usize) {
        (
            self.policy.actor.param_sizes().iter().sum(),
            self.critic.param_sizes().iter().sum(),
        )
    }
}

/// The acting half of a DDPG agent: the actor network, the state normalizer and the exploration
/// state of a checkpoint, without the critic, the target networks and the optimizer's moments
/// (about an eighth of the agent's parameters at the default sizes). What a recommender holds
/// per target: it acts, explores and folds states into the normalizer exactly as the full
/// agent does ([`Ddpg::into_policy`]).
#[derive(Debug, Clone)]
pub struct Policy {
    pub(crate) cfg: DdpgConfig,
    pub(crate) dev: Dev,
    pub(crate) actor: Mlp,
    pub(crate) normalizer: Normalizer,
    pub(crate) noise: NoiseState,
    pub(crate) steps: u64,
}

impl Policy {
    /// The policy of a checkpoint ([`Ddpg::to_bytes`]): the whole checkpoint is verified and
    /// decoded, then everything but the acting half is dropped.
    pub fn from_bytes(buf: &[u8]) -> Result<Self, ModelError> {
        Ddpg::from_bytes(buf).map(Ddpg::into_policy)
    }

    /// The configuration of the agent it came from.
    pub fn config(&self) -> &DdpgConfig {
        &self.cfg
    }

    /// Gradient steps the agent had taken.
    pub fn train_steps(&self) -> u64 {
        self.steps
    }

    /// Current exploration scale ε.
    pub fn epsilon(&self) -> f32 {
        self.noise.epsilon
    }

    /// The state normalizer.
    pub fn normalizer(&self) -> &Normalizer {
        &self.normalizer
    }

    /// Mutable normalizer (freeze for serving).
    pub fn normalizer_mut(&mut self) -> &mut Normalizer {
        &mut self.normalizer
    }

    /// Folds a state into the normalizer (no-op while frozen).
    pub fn observe(&mut self, state: &[f32]) -> Result<(), ModelError> {
        self.normalizer.update(state).map(|_| ())
    }

    /// μ(s) in [−1, 1]³ ([`Ddpg::act`]). A non-finite or wrongly sized state, or a non-finite
    /// network output, is an error.
    pub fn act(&self, state: &[f32]) -> Result<[f32; ACTION_DIM], ModelError> {
        let s = self.normalizer.normalize(state)?;
        let x = net::mat(&self.dev, s, 1, self.cfg.state_dim);
        let out = net::host(&self.actor.forward(x));
        check_finite("actor output", &out)?;
        let mut a = [0.0; ACTION_DIM];
        for (d, v) in a.iter_mut().zip(&out) {
            *d = v.clamp(-1.0, 1.0);
        }
        Ok(a)
    }

    /// Actions for many states at once ([`Ddpg::act_batch`]).
    pub fn act_batch(&self, states: &[f32]) -> Result<Vec<[f32; ACTION_DIM]>, ModelError> {
        let d = self.cfg.state_dim;
        let n = states.len() / d;
        if n * d != states.len() {
            return Err(ModelError::Dimension {
                what: "state batch (multiple of state_dim)",
                expected: (n + 1) * d,
                got: states.len(),
            });
        }
        let s = self.normalizer.normalize_rows(states)?;
        let out = net::host(&self.actor.forward(net::mat(&self.dev, s, n, d)));
        check_finite("actor output", &out)?;
        Ok(out
            .chunks(ACTION_DIM)
            .map(|c| {
                let mut a = [0.0; ACTION_DIM];
                for (d, v) in a.iter_mut().zip(c) {
                    *d = v.clamp(-1.0, 1.0);
                }
                a
            })
            .collect())
    }

    /// The exploring action ([`Ddpg::act_explore_scaled`]): folds the state into the normalizer
    /// (unless frozen), then `clamp(μ(s) + scale·ε·noise, −1, 1)` and decays ε. A scale that is
    /// not finite and ≥ 0 is refused.
    pub fn act_explore_scaled<R: Rng + ?Sized>(
        &mut self,
        state: &[f32],
        rng: &mut R,
        scale: f32,
    ) -> Result<[f32; ACTION_DIM], ModelError> {
        if !(scale.is_finite() && scale >= 0.0) {
            return Err(ModelError::InvalidConfig(format!(
                "exploration noise scale must be finite and >= 0, got {scale}"
            )));
        }
        self.observe(state)?;
        let mut a = self.act(state)?;
        let n = self.cfg.noise;
        for (ai, ou) in a.iter_mut().zip(self.noise.ou.iter_mut()) {
            let z: f32 = rng.sample(StandardNormal);
            let noise = match n.kind {
                NoiseKind::Gaussian => n.mu + n.sigma * z,
                NoiseKind::OrnsteinUhlenbeck { theta } => {
                    *ou += theta * (n.mu - *ou) + n.sigma * z;
                    *ou
                }
            };
            *ai = (*ai + scale * self.noise.epsilon * noise).clamp(-1.0, 1.0);
        }
        self.noise.epsilon = (self.noise.epsilon - n.epsilon_decay).max(n.epsilon_min);
        Ok(a)
    }

    /// Parameters held (the actor's).
    pub fn num_params(&self) -> usize {
        self.actor.param_sizes().iter().sum()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn small(seed: u64) -> DdpgConfig {
        DdpgConfig {
            seed,
            ..DdpgConfig::with_hidden(3, &[16, 16])
        }
    }

    /// Inputs inserted with zero weights: the widened agent acts and values exactly as the
    /// trained one whatever they hold, and keeps its normalizer and step count; training then
    /// gives them weight. An insertion past the state is refused.
    #[test]
    fn inserted_inputs_change_nothing_until_trained() {
        let mut trained = Ddpg::new(small(1)).unwrap();
        let b = batch(64, 2);
        for _ in 0..20 {
            for row in b.states.chunks(3) {
                trained.observe(row).unwrap();
            }
            trained.train_step(&b).unwrap();
        }
        let mut wide = trained.with_inputs_inserted(2, 4).unwrap();
        assert_eq!(wide.config().state_dim, 7);
        assert_eq!(wide.train_steps(), trained.train_steps());
        assert_eq!(wide.normalizer().count(), trained.normalizer().count());
        assert_eq!(
            wide.normalizer().mean()[..2],
            trained.normalizer().mean()[..2]
        );
        assert_eq!(wide.normalizer().mean()[6], trained.normalizer().mean()[2]);
        assert_eq!(wide.normalizer().std()[2..6], [1.0; 4]);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..20 {
            let s: Vec<f32> = (0..3).map(|_| rng.random_range(-1.0..1.0)).collect();
            let extra: Vec<f32> = (0..4).map(|_| rng.random_range(-5.0..5.0)).collect();
            let w: Vec<f32> = [&s[..2], &extra, &s[2..]].concat();
            let (a, aw) = (trained.act(&s).unwrap(), wide.act(&w).unwrap());
            assert!(
                a.iter().zip(&aw).all(|(x, y)| (x - y).abs() < 1e-6),
                "{a:?} {aw:?}"
            );
            let (q, qw) = (
                trained.q_value(&s, &a).unwrap(),
                wide.q_value(&w, &a).unwrap(),
            );
            assert!((q - qw).abs() < 1e-5, "{q} {qw}");
        }
        // Trained on states whose new inputs carry the reward's signal, they get weight.
        let mut wb = Batch::with_capacity(7, 64);
        for (i, row) in b.states.chunks(3).enumerate() {
            let extra = [row[0], -row[0], 0.5, 1.0];
            let state: Vec<f32> = [&row[..2], &extra[..], &row[2..]].concat();
            let action = [b.actions[i * 3], b.actions[i * 3 + 1], b.actions[i * 3 + 2]];
            wb.push(&crate::Transition {
                reward: b.rewards[i],
                next_state: state.clone(),
                state,
                action,
                done: true,
            })
            .unwrap();
        }
        wide.train_step(&wb).unwrap();
        let first = wide.policy.actor.export()[0].clone();
        let fan_out = first.len() / 7;
        assert!(first[2 * fan_out..6 * fan_out].iter().any(|&x| x != 0.0));
        assert!(matches!(
            trained.with_inputs_inserted(4, 1),
            Err(ModelError::InvalidConfig(_))
        ));
    }

    #[test]
    fn shrink_perturb_mixes_the_weights_with_a_fresh_initialisation() {
        let mut trained = Ddpg::new(small(1)).unwrap();
        let b = batch(64, 2);
        for _ in 0..20 {
            trained.train_step(&b).unwrap();
        }
        let fresh = Ddpg::new(small(9)).unwrap();
        let mix = |alpha: f32| {
            let mut d = trained.clone();
            d.shrink_perturb(alpha, 9).unwrap();
            d
        };
        let close = |x: &[Vec<f32>], y: &[Vec<f32>]| {
            x.iter()
                .flatten()
                .zip(y.iter().flatten())
                .all(|(a, b)| (a - b).abs() < 1e-5)
        };
        // α = 1 keeps the weights; α = 0 is the fresh agent of that seed.
        assert!(close(
            &mix(1.0).policy.actor.export(),
            &trained.policy.actor.export()
        ));
        assert!(close(
            &mix(0.0).policy.actor.export(),
            &fresh.policy.actor.export()
        ));
        assert!(close(&mix(0.0).critic.export(), &fresh.critic.export()));
        // α = 0.25: a quarter of the trained weights, three quarters fresh, targets alike.
        let d = mix(0.25);
        let want: Vec<Vec<f32>> = trained
            .critic
            .export()
            .iter()
            .zip(fresh.critic.export())
            .map(|(t, f)| t.iter().zip(f).map(|(t, f)| 0.25 * t + 0.75 * f).collect())
            .collect();
        assert!(close(&d.critic.export(), &want));
        assert!(close(&d.critic_target.export(), &want));
        assert!(close(&d.actor_target.export(), &d.policy.actor.export()));
        assert!(!close(
            &d.policy.actor.export(),
            &trained.policy.actor.export()
        ));
        assert_eq!(
            d.train_steps(),
            trained.train_steps(),
            "the step count is kept"
        );
        // Out of range: refused, nothing changed.
        let mut e = trained.clone();
        assert!(e.shrink_perturb(1.5, 9).is_err());
        assert!(e.shrink_perturb(f32::NAN, 9).is_err());
        assert!(close(
            &e.policy.actor.export(),
            &trained.policy.actor.export()
        ));
    }

    #[test]
    fn a_policy_acts_and_explores_as_its_agent_and_holds_only_the_actor() {
        let mut agent = Ddpg::new(small(7)).unwrap();
        let b = batch(64, 3);
        for _ in 0..20 {
            agent.train_step(&b).unwrap();
        }
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for _ in 0..10 {
            let s: Vec<f32> = (0..3).map(|_| rng.random_range(-2.0..2.0)).collect();
            agent.act_explore(&s, &mut rng).unwrap();
        }
        let bytes = agent.to_bytes().unwrap();
        let mut full = Ddpg::from_bytes(&bytes).unwrap();
        let mut policy = Policy::from_bytes(&bytes).unwrap();
        assert_eq!(policy.train_steps(), 20);
        assert_eq!(policy.epsilon(), full.epsilon());
        assert_eq!(policy.config(), full.config());
        let (actor, critic) = full.num_params();
        assert_eq!(policy.num_params(), actor);
        assert!(critic > 0);
        // The same actions, deterministic and exploring (same noise draws), the same states folded
        // into the normalizer, the same ε decay.
        let (mut r1, mut r2) = (ChaCha8Rng::seed_from_u64(9), ChaCha8Rng::seed_from_u64(9));
        for i in 0..30 {
            let s = [0.1 * i as f32, -0.5, (i as f32).sin()];
            assert_eq!(policy.act(&s).unwrap(), full.act(&s).unwrap());
            assert_eq!(
                policy.act_explore_scaled(&s, &mut r1, 0.5).unwrap(),
                full.act_explore_scaled(&s, &mut r2, 0.5).unwrap()
            );
        }
        assert_eq!(policy.epsilon(), full.epsilon());
        assert_eq!(policy.normalizer().mean(), full.normalizer().mean());
        assert_eq!(policy.normalizer().count(), full.normalizer().count());
        policy.normalizer_mut().freeze();
        policy.observe(&[9.0, 9.0, 9.0]).unwrap();
        assert_eq!(policy.normalizer().count(), full.normalizer().count());
        // Bad input is refused as by the agent.
        assert!(policy.act(&[f32::NAN, 0.0, 0.0]).is_err());
        assert!(policy.act(&[0.0, 0.0]).is_err());
        assert!(policy
            .act_explore_scaled(&[0.0, 0.0, 0.0], &mut r1, f32::INFINITY)
            .is_err());
        // A corrupt checkpoint is an error, as for the agent.
        let mut bad = bytes.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0xff;
        assert!(Policy::from_bytes(&bad).is_err());
    }

    fn batch(n: usize, seed: u64) -> Batch {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut b = Batch::with_capacity(3, n);
        for _ in 0..n {
            let s: Vec<f32> = (0..3).map(|_| rng.random_range(-1.0..1.0)).collect();
            let a = [
                rng.random_range(-1.0..1.0),
                rng.random_range(-1.0..1.0),
                rng.random_range(-1.0..1.0),
            ];
            b.push(&crate::Transition {
                reward: -(a[0] - s[0]).powi(2),
                next_state: s.clone(),
                state: s,
                action: a,
                done: true,
            })
            .unwrap();
        }
        b
    }

    /// A constant, never-ending transition with reward 1 (state width 3): the true value is
    /// 1/(1−γ) = 100. Also used by the meta-learner's tests.
    pub(crate) fn endless_reward_one(n: usize) -> Batch {
        let mut b = Batch::with_capacity(3, n);
        for i in 0..n {
            let s = vec![0.1 * (i % 5) as f32, 0.2, -0.3];
            b.push(&crate::Transition {
                state: s.clone(),
                next_state: s,
                action: [0.0, 0.5, -0.5],
                reward: 1.0,
                done: false,
            })
            .unwrap();
        }
        b
    }

    #[test]
    fn target_bounds_cap_the_critic_and_bad_bounds_are_refused() {
        let cfg = small(11);
        let [lo, hi] = cfg.value_bounds_for_rewards(0.0, 2.0).unwrap();
        assert!(lo == 0.0 && (hi - 200.0).abs() < 1e-2, "[{lo}, {hi}]");
        assert_eq!(
            DdpgConfig {
                gamma: 1.0,
                ..small(11)
            }
            .value_bounds_for_rewards(0.0, 2.0),
            None
        );
        for bad in [
            [1.0, 1.0],
            [2.0, 1.0],
            [f32::NAN, 1.0],
            [0.0, f32::INFINITY],
        ] {
            let c = DdpgConfig {
                target_bounds: Some(bad),
                ..small(11)
            };
            assert!(Ddpg::new(c).is_err(), "{bad:?} accepted");
        }
        let b = endless_reward_one(64);
        let run = |bounds: Option<[f32; 2]>| {
            let mut agent = Ddpg::new(DdpgConfig {
                tau: 0.5,
                target_bounds: bounds,
                ..small(11)
            })
            .unwrap();
            let mut q = 0.0;
            for _ in 0..600 {
                q = agent.train_step(&b).unwrap().mean_q;
            }
            q
        };
        let free = run(None);
        let capped = run(Some([0.0, 10.0]));
        assert!(free > 20.0, "unclamped Q {free} should climb towards 100");
        assert!(capped <= 10.5, "clamped Q {capped} passed its bound 10");
        assert!(capped > 8.0, "clamped Q {capped} should reach its bound");
    }

    #[test]
    fn soft_update_moves_targets_by_exactly_tau() {
        let mut cfg = small(1);
        cfg.tau = 0.25;
        let mut agent = Ddpg::new(cfg).unwrap();
        // Make online and target differ: one training step (which itself soft-updates).
        agent.train_step(&batch(32, 2)).unwrap();
        let before_t = agent.actor_target.export();
        let before_ct = agent.critic_target.export();
        let online = agent.policy.actor.export();
        let online_c = agent.critic.export();
        assert_ne!(before_t, online, "targets must differ from online nets");
        agent.soft_update();
        for (net_before, net_online, net_after) in [
            (&before_t, &online, agent.actor_target.export()),
            (&before_ct, &online_c, agent.critic_target.export()),
        ] {
            let mut moved = 0;
            for ((t0, o), t1) in net_before.iter().zip(net_online).zip(&net_after) {
                for ((t0, o), t1) in t0.iter().zip(o).zip(t1) {
                    let expect = t0 + 0.25 * (o - t0);
                    assert!(
                        (t1 - expect).abs() <= 1e-6 * (1.0 + expect.abs()),
                        "{t1} vs {expect}"
                    );
                    if (t1 - t0).abs() > 0.0 {
                        moved += 1;
                    }
                }
            }
            assert!(moved > 0);
        }
        // Online nets are untouched by a soft update.
        assert_eq!(agent.policy.actor.export(), online);
    }

    #[test]
    fn train_step_changes_weights_and_reports_finite_stats() {
        let mut agent = Ddpg::new(small(3)).unwrap();
        let before = agent.policy.actor.export();
        let b = batch(64, 4);
        let st = agent.train_step(&b).unwrap();
        assert_eq!(st.step, 1);
        assert!(st.critic_loss.is_finite() && st.critic_loss > 0.0);
        assert!(st.critic_grad_norm > 0.0 && st.actor_grad_norm > 0.0);
        assert_ne!(agent.policy.actor.export(), before);
        // Critic loss falls on a fixed batch.
        let mut last = st.critic_loss;
        for _ in 0..50 {
            last = agent.train_step(&b).unwrap().critic_loss;
        }
        assert!(last < st.critic_loss * 0.5, "{last} vs {}", st.critic_loss);
    }

    #[test]
    fn critic_step_trains_the_critic_and_leaves_the_actor() {
        let mut agent = Ddpg::new(small(3)).unwrap();
        let actor = agent.policy.actor.export();
        let critic = agent.critic.export();
        let b = batch(64, 4);
        let first = agent.train_critic_step(&b).unwrap();
        assert_eq!(first.step, 1);
        assert_eq!((first.actor_loss, first.actor_grad_norm), (0.0, 0.0));
        assert!(first.critic_grad_norm > 0.0);
        assert_eq!(
            agent.policy.actor.export(),
            actor,
            "the actor keeps its weights"
        );
        assert_ne!(agent.critic.export(), critic);
        let mut last = first.critic_loss;
        for _ in 0..50 {
            last = agent.train_critic_step(&b).unwrap().critic_loss;
        }
        assert!(
            last < first.critic_loss * 0.5,
            "{last} vs {}",
            first.critic_loss
        );
        assert_eq!(agent.policy.actor.export(), actor);
        assert_eq!(agent.train_steps(), 51);
        // A full step afterwards moves the actor.
        agent.train_step(&b).unwrap();
        assert_ne!(agent.policy.actor.export(), actor);
    }

    #[test]
    fn gradient_clipping_scales_to_max_norm() {
        let agent = Ddpg::new(small(5)).unwrap();
        let b = batch(64, 6);
        let mut sa = Vec::new();
        for i in 0..b.len() {
            sa.extend_from_slice(&b.actions[i * 3..(i + 1) * 3]);
            sa.extend_from_slice(&b.states[i * 3..(i + 1) * 3]);
        }
        let y: Vec<f32> = b.rewards.iter().map(|r| r * 1000.0).collect();
        let q = agent
            .critic
            .forward(net::traced(net::mat(&agent.policy.dev, sa, 64, 6)));
        let mut g = net::backward(net::mse(q, net::mat(&agent.policy.dev, y, 64, 1)));
        let norm = agent.critic.clip_grad_norm(&mut g, Some(0.5)).unwrap();
        assert!(norm > 0.5, "unclipped norm {norm}");
        let after = agent.critic.clip_grad_norm(&mut g, None).unwrap();
        assert!((after - 0.5).abs() < 1e-4, "clipped norm {after}");
        // Below the limit nothing changes.
        let again = agent.critic.clip_grad_norm(&mut g, Some(10.0)).unwrap();
        assert!((again - after).abs() < 1e-6);
    }

    #[test]
    fn nan_inputs_are_typed_errors_and_leave_weights_alone() {
        let mut agent = Ddpg::new(small(7)).unwrap();
        assert!(matches!(
            agent.act(&[0.0, f32::NAN, 0.0]),
            Err(ModelError::NonFinite { .. })
        ));
        assert!(matches!(
            agent.act(&[0.0, f32::INFINITY, 0.0]),
            Err(ModelError::NonFinite { .. })
        ));
        assert!(matches!(
            agent.act(&[0.0, 0.0]),
            Err(ModelError::Dimension { .. })
        ));
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert!(agent.act_explore(&[f32::NAN, 0.0, 0.0], &mut rng).is_err());
        assert_eq!(agent.normalizer().count(), 0);
        let before = agent.policy.actor.export();
        let mut b = batch(8, 1);
        b.rewards[3] = f32::NAN;
        assert!(matches!(
            agent.train_step(&b),
            Err(ModelError::NonFinite { .. })
        ));
        assert_eq!(agent.policy.actor.export(), before);
        assert_eq!(agent.train_steps(), 0);
        let a = agent.act(&[0.1, 0.2, 0.3]).unwrap();
        assert!(a.iter().all(|x| x.is_finite() && x.abs() <= 1.0));
    }

    #[test]
    fn non_finite_network_output_is_an_error() {
        let mut agent = Ddpg::new(small(8)).unwrap();
        let mut p = agent.policy.actor.export();
        // The last bias: a NaN there reaches the output (ReLU maps NaN to 0 in hidden layers).
        let last = p.len() - 1;
        p[last][1] = f32::NAN;
        agent.policy.actor.import(&p).unwrap();
        assert!(matches!(
            agent.act(&[0.1, 0.2, 0.3]),
            Err(ModelError::NonFinite {
                what: "actor output"
            })
        ));
    }

    #[test]
    fn exploration_noise_decays_and_stays_in_bounds() {
        let mut cfg = small(9);
        cfg.noise.epsilon_decay = 0.1;
        cfg.noise.epsilon_min = 0.05;
        let mut agent = Ddpg::new(cfg.clone()).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let s = [0.3, -0.2, 0.1];
        let mut spread_first = 0.0;
        for i in 0..20 {
            let a = agent.act_explore(&s, &mut rng).unwrap();
            assert!(a.iter().all(|x| (-1.0..=1.0).contains(x)));
            let mu = agent.act(&s).unwrap();
            if i == 0 {
                spread_first = (a[0] - mu[0]).abs() + (a[1] - mu[1]).abs();
            }
        }
        assert!((agent.epsilon() - 0.05).abs() < 1e-6);
        assert!(spread_first > 0.0);
        cfg.noise.kind = NoiseKind::OrnsteinUhlenbeck { theta: 0.15 };
        let mut ou = Ddpg::new(cfg).unwrap();
        ou.act_explore(&s, &mut rng).unwrap();
        assert_ne!(ou.policy.noise.ou, [0.0; 3]);
        ou.reset_noise();
        assert_eq!(ou.policy.noise.ou, [0.0; 3]);
    }

    #[test]
    fn exploration_sigma_scales_the_noise_and_rejects_bad_values() {
        let mut agent = Ddpg::new(small(9)).unwrap();
        let s = [0.3, -0.2, 0.1];
        let spread = |agent: &mut Ddpg| {
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            let mu = agent.act(&s).unwrap();
            (0..200)
                .map(|_| {
                    let a = agent.act_explore(&s, &mut rng).unwrap();
                    a.iter().zip(&mu).map(|(x, m)| (x - m).abs()).sum::<f32>()
                })
                .sum::<f32>()
        };
        let at_default = spread(&mut agent);
        agent.set_exploration_sigma(0.05).unwrap();
        assert_eq!(agent.config().noise.sigma, 0.05);
        let at_low = spread(&mut agent);
        assert!(at_low < 0.5 * at_default, "{at_low} vs {at_default}");
        agent.set_exploration_sigma(0.0).unwrap();
        assert_eq!(spread(&mut agent), 0.0);
        for bad in [f32::NAN, -0.1, f32::INFINITY] {
            assert!(agent.set_exploration_sigma(bad).is_err());
            assert_eq!(agent.config().noise.sigma, 0.0);
        }
        // Saved with the checkpoint.
        agent.set_exploration_sigma(0.1).unwrap();
        let back = Ddpg::from_bytes(&agent.to_bytes().unwrap()).unwrap();
        assert_eq!(back.config().noise.sigma, 0.1);
    }

    #[test]
    fn scaled_exploration_multiplies_the_same_noise_draw() {
        let base = Ddpg::new(small(9)).unwrap();
        let s = [0.3, -0.2, 0.1];
        let draw = |scale: f32| {
            let mut agent = base.clone();
            let mut rng = ChaCha8Rng::seed_from_u64(11);
            let a = agent.act_explore_scaled(&s, &mut rng, scale).unwrap();
            (a, agent.act(&s).unwrap(), agent.epsilon())
        };
        let (full, mu, eps_full) = draw(1.0);
        let (half, mu_half, eps_half) = draw(0.5);
        let (none, mu_none, _) = draw(0.0);
        assert_eq!((mu, eps_full), (mu_half, eps_half));
        assert_eq!(none, mu_none);
        // The same draw, half as far from μ(s) (no clamping at these magnitudes).
        for i in 0..ACTION_DIM {
            assert!(full[i].abs() < 1.0, "{full:?}");
            assert!(
                (half[i] - mu[i] - 0.5 * (full[i] - mu[i])).abs() < 1e-5,
                "{i}"
            );
        }
        assert_ne!(full, mu);
        // act_explore is scale 1.
        let mut agent = base.clone();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        assert_eq!(agent.act_explore(&s, &mut rng).unwrap(), full);
        for bad in [f32::NAN, -0.5, f32::INFINITY] {
            let mut agent = base.clone();
            let mut rng = ChaCha8Rng::seed_from_u64(11);
            assert!(matches!(
                agent.act_explore_scaled(&s, &mut rng, bad),
                Err(ModelError::InvalidConfig(_))
            ));
        }
    }

    #[test]
    fn agent_is_send() {
        fn is_send<T: Send + 'static>() {}
        is_send::<Ddpg>();
    }
}
