//! Simulated cluster for AWARE (docs/design.md §6): the environment for training, tests and benchmarks
//! where there is no cluster.
//!
//! # Entry points for the CLI
//!
//! * `aware sim` → [`run::run_sim`]`(&`[`run::RunSimOptions`]`, &mut dyn Write) ->
//!   Result<`[`run::RunSimReport`]`, SimError>`: runs an app set (generated, from a YAML/JSON
//!   file, or inline) under a policy (hold, fixed, random, HPA rule, oracle) for N steps, writes
//!   one JSON line per target per step ([`run::StepRecord`]) and returns per-app totals, optionally
//!   with the oracle's per-step bound along the run.
//! * `aware bench sim` → [`bench::bench_sim`]`(&`[`bench::SimBenchOptions`]`) ->
//!   Result<`[`bench::SimBenchReport`]`, SimError>`: median simulated target-steps/s on one core
//!   over several runs, and p99 latency over a replicas × CPU grid for three segments, written to
//!   `bench-sim.json` and `bench-sim-p99-<segment>.svg` in the output directory.
//! * Apps: [`app::generate_apps`], [`app::AppSet::read`] / [`app::AppSet::write`].
//!
//! # In-process use (training, benchmarks)
//!
//! [`env::SimEnv`] is a Gym-like environment: [`env::SimEnv::reset`] and
//! [`env::SimEnv::step`] with one [`env::TargetAction`] per target (raw `[-1,1]³` policy output,
//! concrete allocation, or hold); observations carry the state vector ([`env::STATE_NAMES`]), the
//! simulator's metrics ([`cluster::SimMetrics`]), the reward ([`env::reward`]) and a clamp report.
//! The learning problem itself (state features, action map, reward, SLO preservation, bounds) is
//! `aware-mdp`, re-exported here where the simulator's modules used to define it.
//! [`env::LockStep`] advances virtual time as soon as every target's action has arrived.
//! [`oracle::oracle_step`] is the per-step upper bound.
//! With [`env::SimConfig::cluster`] the apps share a cluster of nodes ([`nodes`]): placement by
//! requests, Pending replicas, contention for the nodes' unrequested CPU, drains and additions,
//! and the occupancy of every step ([`env::SimEnv::cluster_occupancy`]).
//!
//! # As a service (metrics source and scaling sink)
//!
//! [`wallclock::SimHandle`] shares a simulation between tasks in lock-step or wall-clock time;
//! [`wallclock::run_wall_clock`] ticks it; [`wallclock::serve_metrics`] exposes the simulated
//! pods as Prometheus text with cAdvisor / kube-state-metrics names.
//!
//! The model (segments, queueing, oracle, trace formats) is documented in
//! `loadgen/README.md` and in each module.

pub mod app;
pub mod bench;
pub mod cluster;
pub mod env;
pub mod error;
pub mod load;
pub mod nodes;
pub mod oracle;
pub mod run;
pub mod scenario;
pub mod segments;
pub mod wallclock;

pub use app::{Allocation, AppSet, AppSpec, Bounds, Slo, VerticalMode};
pub use bench::{bench_sim, SimBenchOptions, SimBenchReport};
pub use env::{
    Observation, Presence, SimConfig, SimEnv, TargetAction, ACTION_DIM, STATE_DIM, STATE_NAMES,
};
pub use error::SimError;
pub use nodes::{ClusterConfig, ClusterOccupancy, NodeEvent};
pub use run::{run_sim, AppSource, ClusterSummary, PolicySpec, RunSimOptions, RunSimReport};
pub use scenario::{Injection, Scenario};
pub use segments::SegmentKind;
