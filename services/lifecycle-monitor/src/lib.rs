//! lifecycle-monitor: runs Algorithm 1 of the paper (bootstrapping and the retraining trigger)
//! for every target and publishes `lifecycle` on every change of stage.
//!
//! Rewards are the per-step means of episodes (`episode.mean_reward`), so the profile's
//! thresholds do not depend on the episode length. The decision window holds the rewards of the
//! last `window` episodes *of the current stage*; it is cleared on every transition and a decision
//! needs a full window:
//! - OFFLINE uses the trainer's off-policy estimate of the RL policy: the latest `model`'s
//!   `policy_estimate` decides on its own (it already averages the recent fallback episodes), or
//!   a full window of `episode.policy_estimate`; episodes without an estimate do not count
//!   (there is no RL policy to judge yet). With `require_behaviour` (default) a model's estimate
//!   must also not fall below the behaviour's reward (the model's `behaviour_reward`, else the
//!   mean reward of the recent OFFLINE episodes) by more than `behaviour_margin` (relative); the
//!   episode-estimate window decides on `t_online` alone;
//! - ONLINE and SERVING use the rewards of episodes that ran in that stage.
//!
//! Probation (issue [rl-agent] item 3): after OFFLINE → ONLINE, if the mean reward of the first
//! `probation_episodes` ONLINE episodes falls below the fallback's reward (the mean of the last
//! `fallback_episodes` OFFLINE episodes, which the fallback earned) by more than
//! `probation_margin` (relative), the monitor sends the target back to OFFLINE with a reason, and
//! the recommender's fallback drives from the next step. It then waits for a model trained after
//! the return and `readmit_after_episodes` more OFFLINE episodes before it promotes again.
//!
//! The error budget (docs/adr/0014-error-budget.md): for a target with an SLO, the policy's burn
//! rate (its share of SLO-violating intervals over `1 - slo.objective`) is watched at every
//! RL-driven stage; burning faster than allowed (the budget, or the fallback's rate when higher)
//! on two windows sends the target back to OFFLINE as a failed probation does, and probation
//! fails on the budget before the reward ([`MonitorConfig::error_budget`]).
//! Settings: the `[lifecycle_monitor]` section ([`MonitorConfig`]).

mod config;
mod machine;
mod service;

use aware_bus_schemas::EventKind;
use aware_shared::launcher::ServiceEntry;

pub use config::*;
pub use machine::*;
pub use service::*;

pub const NAME: &str = "lifecycle-monitor";
/// `obs` only registers targets: the first one starts the target's agent, which announces its
/// initial stage. `model` carries the trainer's off-policy estimate.
pub const CONSUMES: &[EventKind] = &[
    EventKind::Episode,
    EventKind::Model,
    EventKind::Obs,
    EventKind::Target,
];
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
    notice: None,
    sharded: true,
};
