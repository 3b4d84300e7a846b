//! The learning problem AWARE solves, defined once for the simulator, the services and the
//! benchmarks: what the agent observes ([`State`], built from [`RawMetrics`]), what it may do
//! ([`map_action`] of a raw action within [`Bounds`] to an [`Allocation`]), and what it is paid
//! ([`reward`] from [`slo_preservation`] and [`utilization`]). With `learning.mean_field` the
//! state gains the others on the cluster ([`mean_fields`], SIMPPO's virtual agent). An
//! [`Allocation`] is the requested allocation (what the scheduler packs and the user pays for);
//! the limits follow from it by the target's [`LimitsPolicy`].
//!
//! This crate is pure (no I/O, no async runtime, no tensor library): the collector, recommender
//! and trainer use it in production; the simulator (`aware-loadgen`) builds its environment on
//! it. Types that travel on the bus ([`Allocation`] as `Resources`, [`RawMetrics`]) keep their
//! wire form; their JSON Schemas are derived behind the `schema` feature.

mod action;
mod allocation;
mod limits;
mod mean_field;
mod metrics;
mod objective;
mod reward;
mod state;

pub use action::{action_for, map_action, ActionMap, ActionMode, ClampReport, ACTION_DIM};
pub use allocation::{Allocation, Bounds, Resources, MIB};
pub use limits::{ContainerResources, ControlledValues, CpuLimit, Limits, LimitsPolicy, Resolved};
pub use mean_field::{
    mean_fields, state_width, ClusterShare, Member, MEAN_FIELD_DIM, MEAN_FIELD_NAMES,
};
pub use metrics::{burn_rate, slo_preservation, utilization, RawMetrics, Slo, DEFAULT_OBJECTIVE};
pub use objective::{
    constrained_reward, Multiplier, MultiplierConfig, Objective, ObjectiveMode, Prices, GIB,
};
pub use reward::{reward, REWARD_RANGE};
pub use state::{State, STATE_DIM, STATE_NAMES};

/// Errors of the learning problem's definitions.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MdpError {
    /// A minimum above its maximum, or a zero minimum.
    #[error("invalid bounds {0:?}")]
    InvalidBounds(Bounds),
    /// A state vector of another width than [`STATE_DIM`].
    #[error("state vector has {got} features, expected {expected}")]
    StateWidth { expected: usize, got: usize },
}
