//! The RL path of an agent: the base-learner's weights loaded from the model store, and the
//! mapping of its raw output in [−1, 1]³ to a concrete allocation.
//!
//! Safety (issue [rl-agent] item 5): every RL action is bounded (the raw output is clamped to
//! [−1, 1] by the model and mapped to an allocation inside the target's bounds by
//! [`aware_loadgen::env::map_action`], the same map the simulator uses); a NaN or infinite value in
//! the state or in the network's output, a state of the wrong width or a missing model gives a
//! [`FallbackReason`] instead of an action, and the agent acts with the fallback for that step. A
//! model that cannot be loaded (missing, corrupt, wrong checksum) is a [`LoadError`]: the agent
//! keeps what it had.

use aware_bus_schemas::{Model, ModelKind, Resources};
use aware_loadgen::app::{Allocation, Bounds as SimBounds};
use aware_loadgen::env::{map_action, ActionMap};
use aware_shared::model_store::{get_verified, ModelStore, ModelStoreError};
use aware_shared::spec::Bounds;
use aware_shared_model::{Ddpg, ModelError, ACTION_DIM};
use rand::Rng;

/// A loaded base-learner.
#[derive(Debug, Clone)]
pub struct RlPolicy {
    pub ddpg: Ddpg,
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
    let ddpg = Ddpg::from_bytes(&bytes)?;
    Ok(RlPolicy {
        version: m.version,
        trained_steps: ddpg.train_steps(),
        ddpg,
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
        }
    }

    pub const ALL: [FallbackReason; 5] = [
        FallbackReason::NoModel,
        FallbackReason::NonFiniteState,
        FallbackReason::NonFiniteOutput,
        FallbackReason::StateDim,
        FallbackReason::ModelError,
    ];
}

/// What the RL path decided for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RlDecision {
    pub raw: [f32; ACTION_DIM],
    pub desired: Resources,
    pub exploration: bool,
}

/// The policy's action for `state`: with exploration noise (and the state folded into the
/// normalizer) when `explore`, else deterministic with the normalizer frozen.
pub fn rl_decide<R: Rng + ?Sized>(
    policy: &mut RlPolicy,
    state: &[f32],
    current: Resources,
    bounds: &Bounds,
    explore: bool,
    rng: &mut R,
) -> Result<RlDecision, FallbackReason> {
    if state.iter().any(|x| !x.is_finite()) {
        return Err(FallbackReason::NonFiniteState);
    }
    let raw = if explore {
        policy.ddpg.normalizer_mut().unfreeze();
        policy.ddpg.act_explore(state, rng)
    } else {
        policy.ddpg.normalizer_mut().freeze();
        policy.ddpg.act(state)
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
        exploration: explore,
    })
}

/// The concrete allocation a raw action asks for: `loadgen`'s action map (default scale) applied
/// to the allocation in force, clamped to the target's bounds.
pub fn map_raw(raw: [f32; ACTION_DIM], current: Resources, bounds: &Bounds) -> Resources {
    let (a, _) = map_action(
        raw,
        Allocation {
            replicas: current.replicas,
            cpu_millicores: current.cpu_millicores,
            memory_bytes: current.memory_bytes,
        },
        &sim_bounds(bounds),
        &ActionMap::default(),
    );
    Resources {
        replicas: a.replicas,
        cpu_millicores: a.cpu_millicores,
        memory_bytes: a.memory_bytes,
    }
}

fn sim_bounds(b: &Bounds) -> SimBounds {
    SimBounds {
        min_replicas: b.min_replicas,
        max_replicas: b.max_replicas,
        min_cpu_millicores: b.min_cpu_millicores,
        max_cpu_millicores: b.max_cpu_millicores,
        min_memory_bytes: b.min_memory_bytes,
        max_memory_bytes: b.max_memory_bytes,
    }
}
