//! AWARE model crate: every line of tensor code in the project lives here, behind
//! project-owned types, so the tensor library (dfdx 0.13, CPU) can be swapped without touching
//! services.
//!
//! * [`Ddpg`] — the base-learner: actor (state → tanh action in [−1, 1]³), critic
//!   (state, action → Q), target nets with soft updates, Adam, gradient-norm clipping,
//!   Gaussian/OU exploration with ε-decay, running state normalization, checkpoints.
//! * Offline training: [`Ddpg::train_step_bc`] (TD3+BC behaviour regularisation) and
//!   [`Ddpg::estimate_policy`] (off-policy estimate of the policy's mean per-step reward).
//! * [`ReplayBuffer`], [`Transition`], [`Batch`] — experience replay (FIFO, seeded sampling).
//! * [`Normalizer`] — running mean/std, frozen while serving.
//! * [`MetaLearner`], [`MetaDdpg`] — the meta-learner (bidirectional GRU over a bundle of
//!   episodes → workload embedding) and the embedding-conditioned base-learner trained jointly
//!   with it (`meta.rs`).
//! * [`bench_training`] — throughput and latency benchmark.

mod bench;
mod checkpoint;
mod config;
mod ddpg;
mod error;
mod meta;
mod net;
mod normalizer;
mod replay;

pub use bench::{bench_training, BenchReport, BENCH_BATCH};
pub use checkpoint::{FORMAT_VERSION, MAGIC, MAX_CHECKPOINT_BYTES};
pub use config::{
    BcConfig, DdpgConfig, NoiseConfig, NoiseKind, MAX_HIDDEN_LAYERS, MAX_STATE_DIM, MAX_WIDTH,
};
pub use ddpg::{Ddpg, Policy, PolicyEstimate, TrainStats};
pub use error::ModelError;
pub use meta::{
    EmbedActivation, EpisodeBundle, MetaConfig, MetaDdpg, MetaGroup, MetaLearner, MetaTrainStats,
    MAX_EPISODE_LEN, META_FORMAT_VERSION, META_MAGIC, STEP_EXTRA,
};
pub use normalizer::{Normalizer, STD_FLOOR};
pub use replay::{Batch, ReplayBuffer, Transition};

/// Action width: replicas, CPU limit, memory limit (`loadgen::env::ACTION_DIM`).
pub const ACTION_DIM: usize = 3;
