//! The RL path of an agent: the base-learner's weights loaded from the model store, and the
//! mapping of its raw output in [−1, 1]³ to a concrete allocation.
//!
//! Safety (issue [rl-agent] item 5): every RL action is bounded (the raw output is clamped to
//! [−1, 1] by the model and mapped to an allocation inside the target's bounds by
//! [`aware_mdp::map_action`], the same map the simulator uses); a NaN or infinite value in
//! the state or in the network's output, a state of the wrong width or a missing model gives a
//! [`FallbackReason`] instead of an action, and the agent acts with the fallback for that step. A
//! model that cannot be loaded (missing, corrupt, wrong checksum) is a [`LoadError`]: the agent
//! keeps what it had.
//!
//! Meta-learning (issue [meta-learner] item 3): a policy whose input is wider than the state
//! (9 + 64 for a base-learner trained by a trainer with `meta_dir`, 15 + 64 with
//! `learning.mean_field`) is conditioned on the target's
//! workload embedding: the actor gets `state ‖ embedding`, the latest `embedding` received for the
//! target. Without one, or with one of another width, the fallback acts
//! ([`FallbackReason::NoEmbedding`]). While exploring, the normalizer folds in the state but keeps
//! the embedding features at mean 0, std 1, as the trainer does. A 9-d policy ignores embeddings.

use aware_bus_schemas::{Model, ModelKind, Resources};
use aware_mdp::{map_action, ActionMap, STATE_DIM};
use aware_shared::model_store::{get_verified, ModelStore, ModelStoreError};
use aware_shared::spec::Bounds;
use aware_shared_model::{ModelError, Policy, ACTION_DIM};
use rand::Rng;

/// A loaded base-learner: its acting half only (the critic, target networks and optimizer state
/// of the checkpoint are dropped on load, [`Policy`]).
#[derive(Debug, Clone)]
pub struct RlPolicy {
    pub policy: Policy,
    pub version: u64,
    pub trained_steps: u64,
}

/// Why a `model` could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("model kind {0:?} is not a base-learner")]
    Kind(ModelKind),
    #[error(transparent)]
    Store(#[from] ModelStoreError),
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] ModelError),
}

/// Reads, verifies (size, SHA-256, the checkpoint's own checksum) and decodes the weights a
/// `model` message announces.
pub fn load_policy(store: &dyn ModelStore, m: &Model) -> Result<RlPolicy, LoadError> {
    if m.kind != ModelKind::BaseLearner {
        return Err(LoadError::Kind(m.kind));
    }
    let bytes = get_verified(store, &m.uri, &m.sha256, m.size_bytes)?;
    let policy = Policy::from_bytes(&bytes)?;
    Ok(RlPolicy {
        version: m.version,
        trained_steps: policy.train_steps(),
        policy,
    })
}

/// Why the fallback acted while the stage is RL-driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// No weights loaded yet.
    NoModel,
    /// NaN or infinite value in the state.
    NonFiniteState,
    /// NaN or infinite network output.
    NonFiniteOutput,
    /// The state's width differs from the model's input.
    StateDim,
    /// Any other model error.
    ModelError,
    /// The policy is conditioned on an embedding and none (of its width) has arrived.
    NoEmbedding,
}

impl FallbackReason {
    /// Label value of `recommender_rl_fallbacks_total{reason}`.
    pub fn label(self) -> &'static str {
        match self {
            FallbackReason::NoModel => "no_model",
            FallbackReason::NonFiniteState => "non_finite_state",
            FallbackReason::NonFiniteOutput => "non_finite_output",
            FallbackReason::StateDim => "state_dim",
            FallbackReason::ModelError => "model_error",
            FallbackReason::NoEmbedding => "no_embedding",
        }
    }

    /// Text of `action.fallback_reason`.
    pub fn describe(self) -> &'static str {
        match self {
            FallbackReason::NoModel => "no RL policy is loaded",
            FallbackReason::NonFiniteState => "NaN or infinite value in the state",
            FallbackReason::NonFiniteOutput => "NaN or infinite policy output",
            FallbackReason::StateDim => "state width differs from the model's input",
            FallbackReason::ModelError => "the RL policy failed",
            FallbackReason::NoEmbedding => {
                "no workload embedding of the policy's width has arrived"
            }
        }
    }

    pub const ALL: [FallbackReason; 6] = [
        FallbackReason::NoModel,
        FallbackReason::NonFiniteState,
        FallbackReason::NonFiniteOutput,
        FallbackReason::StateDim,
        FallbackReason::ModelError,
        FallbackReason::NoEmbedding,
    ];
}

/// What the RL path decided for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RlDecision {
    pub raw: [f32; ACTION_DIM],
    pub desired: Resources,
    pub exploration: bool,
}

/// The actor's input: `state` itself for a policy of the state's width, `state ‖ embedding`
/// for a policy conditioned on an embedding of the remaining width. The state is the target's
/// own features, or those and the mean field (`learning.mean_field`); a policy trained on the
/// other of the two widths (the setting changed since) falls back for `state_dim`.
pub fn policy_input(
    input_dim: usize,
    state: &[f32],
    embedding: Option<&[f32]>,
) -> Result<Vec<f32>, FallbackReason> {
    let widths = [STATE_DIM, aware_mdp::state_width(true)];
    if input_dim == state.len() || !widths.contains(&state.len()) {
        // A plain policy, or a state of neither width (the model's error, as without
        // meta-learning).
        return Ok(state.to_vec());
    }
    if widths.contains(&input_dim) {
        // A plain policy of the other state width.
        return Err(FallbackReason::StateDim);
    }
    match embedding.filter(|e| e.iter().all(|x| x.is_finite())) {
        Some(e) if state.len() + e.len() == input_dim => {
            let mut x = Vec::with_capacity(input_dim);
            x.extend_from_slice(state);
            x.extend_from_slice(e);
            Ok(x)
        }
        // A conditioned policy of the other state width.
        Some(e) if widths.iter().any(|w| w + e.len() == input_dim) => Err(FallbackReason::StateDim),
        _ => Err(FallbackReason::NoEmbedding),
    }
}

/// The policy's action for `state` (and, for a conditioned policy, the target's `embedding`):
/// with exploration noise scaled by `explore`'s factor (and the state folded into the
/// normalizer) when `Some`, else deterministic with the normalizer frozen.
pub fn rl_decide<R: Rng + ?Sized>(
    policy: &mut RlPolicy,
    state: &[f32],
    embedding: Option<&[f32]>,
    current: Resources,
    bounds: &Bounds,
    explore: Option<f32>,
    rng: &mut R,
) -> Result<RlDecision, FallbackReason> {
    if state.iter().any(|x| !x.is_finite()) {
        return Err(FallbackReason::NonFiniteState);
    }
    let input = policy_input(policy.policy.config().state_dim, state, embedding)?;
    let conditioned = input.len() > state.len();
    let raw = if let (Some(scale), true) = (explore, conditioned) {
        // Fold the state in, keep the embedding features at mean 0, std 1, then act on them.
        let d = &mut policy.policy;
        d.normalizer_mut().unfreeze();
        d.observe(&input).and_then(|()| {
            d.normalizer_mut().pin_identity(state.len());
            d.normalizer_mut().freeze();
            d.act_explore_scaled(&input, rng, scale)
        })
    } else if let Some(scale) = explore {
        policy.policy.normalizer_mut().unfreeze();
        policy.policy.act_explore_scaled(&input, rng, scale)
    } else {
        policy.policy.normalizer_mut().freeze();
        policy.policy.act(&input)
    }
    .map_err(|e| match e {
        ModelError::NonFinite { .. } => FallbackReason::NonFiniteOutput,
        ModelError::Dimension { .. } => FallbackReason::StateDim,
        _ => FallbackReason::ModelError,
    })?;
    if raw.iter().any(|x| !x.is_finite()) {
        return Err(FallbackReason::NonFiniteOutput);
    }
    Ok(RlDecision {
        raw,
        desired: map_raw(raw, current, bounds),
        exploration: explore.is_some(),
    })
}

/// The concrete allocation a raw action asks for: the default action map (absolute, with
/// bounded steps) applied to the allocation in force, clamped to the target's bounds.
pub fn map_raw(raw: [f32; ACTION_DIM], current: Resources, bounds: &Bounds) -> Resources {
    map_action(raw, current, bounds, &ActionMap::default()).0
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_shared_model::{Ddpg, DdpgConfig};
    use rand::SeedableRng;

    fn policy(dim: usize) -> RlPolicy {
        let mut c = DdpgConfig::with_hidden(dim, &[16]);
        c.seed = 4;
        RlPolicy {
            policy: Ddpg::new(c).unwrap().into_policy(),
            version: 1,
            trained_steps: 0,
        }
    }

    #[test]
    fn conditioned_policies_get_state_and_embedding() {
        let s = vec![0.3f32; 9];
        let e: Vec<f32> = (0..64).map(|i| (i as f32 * 0.1).sin()).collect();
        // Plain 9-d policy: the state alone, embeddings ignored.
        assert_eq!(policy_input(9, &s, None).unwrap(), s);
        assert_eq!(policy_input(9, &s, Some(&e)).unwrap(), s);
        // 73-d policy: state ‖ embedding.
        let x = policy_input(73, &s, Some(&e)).unwrap();
        assert_eq!((&x[..9], &x[9..]), (s.as_slice(), e.as_slice()));
        // No embedding, one of another width, or a non-finite one: the fallback.
        for bad in [None, Some(&e[..32]), Some(&[f32::NAN; 64][..])] {
            assert_eq!(policy_input(73, &s, bad), Err(FallbackReason::NoEmbedding));
        }
        // A state of the wrong width stays the model's error.
        assert_eq!(policy_input(73, &s[..4], Some(&e)).unwrap(), &s[..4]);

        let mut p = policy(73);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let b = Bounds::default();
        let cur = Resources {
            replicas: 2,
            cpu_millicores: 500,
            memory_bytes: 512 << 20,
        };
        let d = rl_decide(&mut p, &s, Some(&e), cur, &b, None, &mut rng).unwrap();
        assert_eq!(
            d.raw,
            p.policy.act(&x).unwrap(),
            "the actor saw state ‖ embedding"
        );
        assert_eq!(
            rl_decide(&mut p, &s, None, cur, &b, None, &mut rng),
            Err(FallbackReason::NoEmbedding)
        );
        // Exploring folds the state in; the embedding features stay at mean 0, std 1.
        for i in 0..20 {
            let s: Vec<f32> = (0..9).map(|j| ((i * 9 + j) as f32).cos()).collect();
            rl_decide(&mut p, &s, Some(&e), cur, &b, Some(1.0), &mut rng).unwrap();
        }
        let n = p.policy.normalizer();
        assert_eq!(n.count(), 20);
        assert!(n.mean()[..9].iter().any(|&m| m != 0.0));
        assert!(n.mean()[9..].iter().all(|&m| m == 0.0));
        assert!(n.std()[9..].iter().all(|&s| s == 1.0));
        // A 9-d policy explores as before.
        let mut plain = policy(9);
        rl_decide(&mut plain, &s, Some(&e), cur, &b, Some(1.0), &mut rng).unwrap();
        assert_eq!(plain.policy.normalizer().count(), 1);
    }

    /// With `learning.mean_field` the state is wider: a model trained on it acts on it, and a
    /// model of the other width (trained before the switch) leaves the step to the fallback.
    #[test]
    fn a_mean_field_state_needs_a_model_of_its_width() {
        let wide = vec![0.3f32; aware_mdp::state_width(true)];
        let b = Bounds::default();
        let cur = Resources {
            replicas: 2,
            cpu_millicores: 500,
            memory_bytes: 512 << 20,
        };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut mf = policy(wide.len());
        let d = rl_decide(&mut mf, &wide, None, cur, &b, None, &mut rng).unwrap();
        assert_eq!(d.raw, mf.policy.act(&wide).unwrap());
        let mut narrow = policy(STATE_DIM);
        assert_eq!(
            rl_decide(&mut narrow, &wide, None, cur, &b, None, &mut rng),
            Err(FallbackReason::StateDim)
        );
        assert_eq!(
            rl_decide(&mut mf, &wide[..STATE_DIM], None, cur, &b, None, &mut rng),
            Err(FallbackReason::StateDim)
        );
        // Conditioned on an embedding (meta-learning): state ‖ mean field ‖ embedding, and a
        // conditioned policy of the other state width falls back for the state, not the
        // embedding.
        let e: Vec<f32> = (0..64).map(|i| (i as f32 * 0.1).sin()).collect();
        let x = policy_input(wide.len() + 64, &wide, Some(&e)).unwrap();
        assert_eq!(
            (&x[..wide.len()], &x[wide.len()..]),
            (wide.as_slice(), e.as_slice())
        );
        assert_eq!(
            policy_input(STATE_DIM + 64, &wide, Some(&e)),
            Err(FallbackReason::StateDim)
        );
        assert_eq!(
            policy_input(wide.len() + 64, &wide[..STATE_DIM], Some(&e)),
            Err(FallbackReason::StateDim)
        );
        assert_eq!(
            policy_input(wide.len() + 64, &wide, None),
            Err(FallbackReason::NoEmbedding)
        );
        let mut cond = policy(wide.len() + 64);
        let d = rl_decide(&mut cond, &wide, Some(&e), cur, &b, None, &mut rng).unwrap();
        assert_eq!(d.raw, cond.policy.act(&x).unwrap());
    }
}
