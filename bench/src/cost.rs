//! `aware bench cost`: what the SLO costs under each policy a user would actually run, on the same
//! apps, traces, seeds and bounds:
//!
//! - `hpa_vpa_default`: the HPA at a 70 % CPU target plus the VPA — the recommender's own
//!   fallback ([`aware_recommender::fallback::Fallback`], the ports checked against upstream's
//!   code), with its default configuration;
//! - `hpa_vpa_tuned`: the same code with, per app, the HPA target a platform engineer would pick:
//!   swept over `--hpa-targets` on a separate tuning window (the same apps under another
//!   simulator seed, `--tuning-seed`: other Poisson arrivals, other bursts), the cheapest target
//!   whose share of steps meeting the SLO reaches `--objective`, else the one with the highest
//!   share ([`choose_target`]);
//! - `vpa`: the same code with the replica count held where it starts (the VPA alone);
//! - `oracle`: per step, the cheapest allocation under `--core-price` / `--gib-price` that meets
//!   the SLO given the step's true load, or the closest the bounds allow
//!   ([`aware_loadgen::oracle::cheapest_step`]);
//! - `aware`: the six services on the embedded bus in lock-step with the simulator, bootstrapping
//!   from `--meta` like `aware demo`, every step of the window counted, learning included.
//!
//! The baselines run the simulator directly, each step exactly as the collector's simulator
//! source runs it: one warm-up step at the initial allocation is the window's first step, then a
//! decision from each step's metrics (as the collector publishes them in `obs`) for the next.
//! They act without AWARE's actuator guardrails (a user's HPA and VPA have none); `aware` goes
//! through them.
//!
//! Per policy and per app: the share of app-steps meeting the SLO (over apps with one), the
//! requested core-hours and GiB-hours (the allocation the simulator applies is the requests; the
//! limits follow the limits policy), their price, and the disruptions the simulator can count ([`Figures`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aware_bus_schemas::{DecisionSource, Event, RawMetrics, Stage, Target};
use aware_loadgen::app::{Allocation, AppSpec, Slo, VerticalMode, MIB};
use aware_loadgen::cluster::AppModel;
use aware_loadgen::env::{Observation, Presence, SimConfig, SimEnv, TargetAction};
use aware_loadgen::load::LoadPattern;
use aware_loadgen::oracle::{
    candidates_by_cost, cheapest_step, step_meets_slo, OracleGrid, Prices,
};
use aware_metrics_collector::config::{CollectorConfig, SimClusterConfig, SourceKind};
use aware_recommender::fallback::{Fallback, FallbackConfig, HpaConfig};
use aware_shared::bus::Bus;
use aware_shared::config::AppConfig;
use serde::Serialize;

use super::{fail, BenchError};

/// The policies, as `--policies` and the report name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CostPolicy {
    Aware,
    HpaVpaTuned,
    HpaVpaDefault,
    Vpa,
    Oracle,
}

impl CostPolicy {
    pub const ALL: [CostPolicy; 5] = [
        CostPolicy::Aware,
        CostPolicy::HpaVpaTuned,
        CostPolicy::HpaVpaDefault,
        CostPolicy::Vpa,
        CostPolicy::Oracle,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CostPolicy::Aware => "aware",
            CostPolicy::HpaVpaTuned => "hpa_vpa_tuned",
            CostPolicy::HpaVpaDefault => "hpa_vpa_default",
            CostPolicy::Vpa => "vpa",
            CostPolicy::Oracle => "oracle",
        }
    }
}

/// A policy's name on the command line.
pub fn parse_policy(s: &str) -> Result<CostPolicy, String> {
    CostPolicy::ALL
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| {
            format!(
                "unknown policy {s:?} (one of {})",
                CostPolicy::ALL.map(CostPolicy::name).join(", ")
            )
        })
}

/// The HPA targets of the default sweep: 20 % to 90 % CPU in steps of 5 points.
pub fn default_hpa_targets() -> Vec<u32> {
    (20..=90).step_by(5).collect()
}

/// The aware policy's fallback HPA target (`--aware-fallback`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum AwareFallback {
    /// Each app's tuned HPA target.
    Tuned,
    /// The recommender's global default (70%).
    Default,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CostBenchOptions {
    /// Generated apps (default: 20, or none with --app-file).
    #[arg(long)]
    pub apps: Option<usize>,
    /// Generator seed of the apps and simulator seed of the evaluation window (held out: the
    /// default meta-training uses seed 0, the tests small seeds).
    #[arg(long, default_value_t = CostBenchOptions::default().seed)]
    pub seed: u64,
    /// App definitions (YAML, or JSON if the name ends in .json; see loadgen/README.md) to
    /// evaluate, besides the --apps generated ones.
    #[arg(long = "app-file", value_name = "FILE")]
    pub app_file: Option<PathBuf>,
    /// The evaluation window: episodes per app.
    #[arg(long, default_value_t = CostBenchOptions::default().episodes)]
    pub episodes: u32,
    #[arg(long, default_value_t = CostBenchOptions::default().steps_per_episode)]
    pub steps_per_episode: u32,
    /// Simulator seed of the tuning window (default: --seed + 1): the same apps under other
    /// arrivals and bursts.
    #[arg(long)]
    pub tuning_seed: Option<u64>,
    /// The SLO objective: the share of control intervals that must meet the SLO.
    #[arg(long, default_value_t = CostBenchOptions::default().objective)]
    pub objective: f64,
    /// HPA targets (% CPU) of hpa_vpa_tuned's sweep.
    #[arg(long, value_delimiter = ',', default_values_t = default_hpa_targets())]
    pub hpa_targets: Vec<u32>,
    /// Price of a core-hour (default: AWS Fargate on-demand, us-east-1).
    #[arg(long, default_value_t = Prices::default().core_hour)]
    pub core_price: f64,
    /// Price of a GiB-hour (default: AWS Fargate on-demand, us-east-1).
    #[arg(long, default_value_t = Prices::default().gib_hour)]
    pub gib_price: f64,
    /// The policies to run, comma-separated (default: all): aware, hpa_vpa_tuned,
    /// hpa_vpa_default, vpa, oracle.
    #[arg(long, value_delimiter = ',', value_parser = parse_policy)]
    pub policies: Vec<CostPolicy>,
    /// The oracle's CPU grid step, millicores.
    #[arg(long, default_value_t = CostBenchOptions::default().oracle_cpu_step)]
    pub oracle_cpu_step: u32,
    /// The oracle's memory grid step, MiB.
    #[arg(long, default_value_t = CostBenchOptions::default().oracle_memory_step_mib)]
    pub oracle_memory_step_mib: u64,
    /// An `aware train-meta` output the aware policy bootstraps from (trainer.meta_dir), as
    /// `aware demo --meta` does; without it, the plain base-learner.
    #[arg(long)]
    pub meta: Option<PathBuf>,
    /// Wall-clock pause after every simulated step of the aware policy, ms (time for the
    /// trainer, as in `aware demo`).
    #[arg(long, default_value_t = CostBenchOptions::default().pace_ms)]
    pub pace_ms: u64,
    /// The HPA target of the aware policy's fallback, which drives while the agent learns:
    /// `tuned`, each app's tuned target (the one hpa_vpa_tuned uses, from the same tuning
    /// window), as a team migrating from its tuned HPA sets the AwareAutoscaler's
    /// `spec.fallback.hpa`; `default`, the recommender's global 70%.
    #[arg(long, value_enum, default_value_t = AwareFallback::Tuned)]
    pub aware_fallback: AwareFallback,
    /// Settings of the services of the aware policy other than their defaults.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = aware_harness::parse_setting, help = "A setting of the aware policy's services other than its default, SECTION.KEY=VALUE with a JSON value (repeatable)")]
    pub settings: Vec<(String, serde_json::Value)>,
    /// Output directory: cost.json, the plots, and the aware policy's stores under cost-work/.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// The aware policy's wall-clock limit.
    #[arg(skip = CostBenchOptions::default().timeout)]
    pub timeout: Duration,
    /// A cluster the apps share (`collector.simulator.cluster`), for every policy; none: each
    /// app alone on an unlimited cluster. Set by `aware bench cluster`.
    #[arg(skip)]
    pub cluster: Option<SimClusterConfig>,
    /// `collector.simulator.burst_headroom` for every policy. Set by `aware bench cluster`.
    #[arg(skip)]
    pub burst_headroom: f64,
    /// `collector.simulator.presence` for every policy: apps that join or leave during the
    /// window; each app's figures count only the steps it is there. Set by `aware bench
    /// cluster`.
    #[arg(skip)]
    pub presence: Vec<Presence>,
}

impl Default for CostBenchOptions {
    fn default() -> Self {
        CostBenchOptions {
            apps: None,
            seed: 4242,
            app_file: None,
            episodes: 12,
            steps_per_episode: 50,
            tuning_seed: None,
            objective: 0.99,
            hpa_targets: default_hpa_targets(),
            core_price: Prices::default().core_hour,
            gib_price: Prices::default().gib_hour,
            policies: Vec::new(),
            oracle_cpu_step: 128,
            oracle_memory_step_mib: 256,
            meta: None,
            pace_ms: 20,
            aware_fallback: AwareFallback::Tuned,
            settings: Vec::new(),
            out: PathBuf::from("bench-out"),
            timeout: Duration::from_secs(3600),
            cluster: None,
            burst_headroom: 0.0,
            presence: Vec::new(),
        }
    }
}

impl CostBenchOptions {
    /// Generated apps: `--apps`, else 20 without an app file and none with one.
    pub fn generated_apps(&self) -> usize {
        self.apps
            .unwrap_or(if self.app_file.is_some() { 0 } else { 20 })
    }

    pub fn tuning_seed(&self) -> u64 {
        self.tuning_seed.unwrap_or(self.seed.wrapping_add(1))
    }

    /// Steps of the evaluation window.
    pub fn steps(&self) -> u64 {
        u64::from(self.episodes) * u64::from(self.steps_per_episode)
    }

    pub fn prices(&self) -> Prices {
        Prices {
            core_hour: self.core_price,
            gib_hour: self.gib_price,
        }
    }

    /// The policies to run, in the report's order.
    pub fn selected(&self) -> Vec<CostPolicy> {
        if self.policies.is_empty() {
            return CostPolicy::ALL.to_vec();
        }
        let set: BTreeSet<CostPolicy> = self.policies.iter().copied().collect();
        set.into_iter().collect()
    }

    fn grid(&self) -> OracleGrid {
        OracleGrid {
            replica_step: 1,
            cpu_step_millicores: self.oracle_cpu_step.max(1),
            memory_step_bytes: self.oracle_memory_step_mib.max(1) * MIB,
        }
    }

    pub(crate) fn check(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::Failed(m));
        if self.steps() == 0 {
            return bad("--episodes and --steps-per-episode must be at least 1".into());
        }
        if !(self.objective.is_finite() && self.objective > 0.0 && self.objective <= 1.0) {
            return bad(format!("--objective {} must be in (0, 1]", self.objective));
        }
        if let Some(t) = self.hpa_targets.iter().find(|t| !(1..=100).contains(*t)) {
            return bad(format!("--hpa-targets: {t} is not a percentage in 1..=100"));
        }
        if self.hpa_targets.is_empty() && self.selected().contains(&CostPolicy::HpaVpaTuned) {
            return bad("--hpa-targets is empty".into());
        }
        for (flag, p) in [
            ("--core-price", self.core_price),
            ("--gib-price", self.gib_price),
        ] {
            if !(p.is_finite() && p >= 0.0) {
                return bad(format!("{flag} {p} must be a price ≥ 0"));
            }
        }
        if self.generated_apps() == 0 && self.app_file.is_none() {
            return bad("no apps: --apps 0 and no --app-file".into());
        }
        // The trainer runs on without meta-learning when its meta_dir cannot be loaded (a
        // service keeps working); a benchmark asked to bootstrap from one must not measure the
        // plain base-learner under its name.
        if let Some(dir) = &self.meta {
            if self.selected().contains(&CostPolicy::Aware) {
                aware_meta_learner_trainer::embedding::load_meta_dir(dir, aware_mdp::STATE_DIM)
                    .map_err(|e| BenchError::Failed(format!("--meta: {e}")))?;
            }
        }
        Ok(())
    }
}

/// One step of one app as a policy left it: the allocation in force, whether it met the SLO
/// ([`step_meets_slo`]), whether it violated it, and the OOM kills.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StepRow {
    allocation: Allocation,
    violation: bool,
    pub(crate) met: bool,
    /// The reward of the action that led to the step (none on an episode's first `obs`).
    pub(crate) reward: Option<f64>,
    /// The step's decision came from the RL policy (an agents' run only).
    pub(crate) rl: bool,
    oom_kills: u32,
    /// Replicas Pending through the step (0 when the source does not read it).
    pending_replicas: u32,
    /// CPU used, summed over replicas, cores.
    cpu_used_cores: f64,
}

impl StepRow {
    /// From a step's measurements as `obs` carries them (the allocation in force from the
    /// limits and the Deployment's replica count).
    fn of(slo: &Slo, m: &RawMetrics, violation: bool, reward: Option<f64>) -> Option<StepRow> {
        Some(StepRow {
            allocation: aware_shared::spec::allocation_in_force(m)?,
            violation,
            reward: reward.filter(|r| r.is_finite()),
            rl: false,
            met: step_meets_slo(slo, violation, m.throughput_rps, m.request_rate_rps),
            oom_kills: m.oom_kills,
            pending_replicas: m.pending_replicas.unwrap_or(0),
            cpu_used_cores: if m.cpu_usage_cores.is_finite() {
                m.cpu_usage_cores.max(0.0)
            } else {
                0.0
            },
        })
    }
}

/// A step's metrics as the collector's simulator source publishes them in `obs` (with a shared
/// cluster, the Pending replicas too).
fn obs_metrics(o: &Observation, shared_cluster: bool) -> RawMetrics {
    RawMetrics {
        spec_replicas: Some(o.allocation.replicas),
        pending_replicas: shared_cluster.then_some(o.metrics.pending_replicas),
        ..o.metrics.raw()
    }
}

pub(crate) fn has_slo(slo: &Slo) -> bool {
    slo.latency_p99_ms.is_some() || slo.throughput_rps.is_some()
}

/// A policy's figures over a window, for one app or summed over apps.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Figures {
    /// App-steps counted.
    pub steps: u64,
    /// Share of the app-steps of apps with an SLO that met it (none: no app has one).
    pub slo_attainment: Option<f64>,
    pub slo_steps: u64,
    pub slo_met_steps: u64,
    pub slo_violations: u64,
    /// Share of the app-steps of best-effort apps (no SLO) that served ≥ 99 % of their offered
    /// load (none: no such app).
    pub best_effort_served: Option<f64>,
    pub best_effort_steps: u64,
    pub best_effort_served_steps: u64,
    /// Requested core-hours and GiB-hours: replicas × per-replica allocation × step length,
    /// plus `surge_*`.
    pub core_hours: f64,
    pub gib_hours: f64,
    /// Of those, the old pods a rolling restart keeps running beside their replacements until
    /// these are ready (the app's cold start after each vertical change of an app whose vertical
    /// changes restart pods; a change during a restart keeps the original pods longer, as in the
    /// simulator).
    pub surge_core_hours: f64,
    pub surge_gib_hours: f64,
    /// Their price (`prices` of the report).
    pub cost: f64,
    /// `replica_changes + pod_restarts + oom_kills`.
    pub disruptions: u64,
    /// Steps whose replica count differs from the step before.
    pub replica_changes: u64,
    /// Steps whose per-replica CPU or memory differs from the step before.
    pub vertical_changes: u64,
    /// Pods replaced by a rolling restart (apps whose vertical changes restart pods: every pod
    /// kept through the change; in-place resizes restart none). The simulator's evictions.
    pub pod_restarts: u64,
    /// Containers OOM-killed (each restarts).
    pub oom_kills: u64,
    /// Replica-seconds spent Pending (no node with room; only with a shared cluster).
    pub pending_replica_seconds: f64,
    /// Core-hours of CPU actually used (what the apps consumed, a burst above the requests
    /// included).
    pub used_core_hours: f64,
}

impl Figures {
    /// The figures of one app's steps, in order.
    pub(crate) fn of_app(
        app: &AppSpec,
        rows: &[StepRow],
        step_seconds: f64,
        prices: &Prices,
    ) -> Figures {
        let mut f = Figures::default();
        let slo = has_slo(&app.slo);
        let step_hours = step_seconds / 3600.0;
        let cold = AppModel::from_app(app).cold_start_seconds;
        let mut met = 0u64;
        let mut prev: Option<&StepRow> = None;
        // The pods a rolling restart keeps (count and per-pod limits), until when.
        let mut surge: Option<(Allocation, f64)> = None;
        for (g, r) in rows.iter().enumerate() {
            let t0 = g as f64 * step_seconds;
            f.steps += 1;
            met += u64::from(r.met);
            f.slo_violations += u64::from(slo && r.violation);
            f.core_hours += Prices::cores(&r.allocation) * step_hours;
            f.gib_hours += Prices::gib(&r.allocation) * step_hours;
            f.oom_kills += u64::from(r.oom_kills);
            f.pending_replica_seconds += f64::from(r.pending_replicas) * step_seconds;
            f.used_core_hours += r.cpu_used_cores * step_hours;
            if let Some(p) = prev {
                let (a, b) = (p.allocation, r.allocation);
                f.replica_changes += u64::from(a.replicas != b.replicas);
                let vertical =
                    a.cpu_millicores != b.cpu_millicores || a.memory_bytes != b.memory_bytes;
                f.vertical_changes += u64::from(vertical);
                if vertical && app.vertical == VerticalMode::Restart {
                    f.pod_restarts += u64::from(a.replicas.min(b.replicas));
                    let old = match surge {
                        // still restarting: the original pods go on running
                        Some((old, until)) if until > t0 => old,
                        _ => a,
                    };
                    surge = Some((old, t0 + cold));
                }
            }
            if let Some((old, until)) = surge.as_mut() {
                old.replicas = old.replicas.min(r.allocation.replicas);
                let share = ((*until).min(t0 + step_seconds) - t0).max(0.0) / step_seconds;
                f.surge_core_hours += Prices::cores(old) * step_hours * share;
                f.surge_gib_hours += Prices::gib(old) * step_hours * share;
            }
            prev = Some(r);
        }
        f.core_hours += f.surge_core_hours;
        f.gib_hours += f.surge_gib_hours;
        if slo {
            (f.slo_steps, f.slo_met_steps) = (f.steps, met);
        } else {
            (f.best_effort_steps, f.best_effort_served_steps) = (f.steps, met);
        }
        f.finish(prices)
    }

    /// Shares, price and disruptions from the counts.
    fn finish(mut self, prices: &Prices) -> Figures {
        let ratio = |n: u64, d: u64| (d > 0).then(|| n as f64 / d as f64);
        self.slo_attainment = ratio(self.slo_met_steps, self.slo_steps);
        self.best_effort_served = ratio(self.best_effort_served_steps, self.best_effort_steps);
        self.cost = self.core_hours * prices.core_hour + self.gib_hours * prices.gib_hour;
        self.disruptions = self.replica_changes + self.pod_restarts + self.oom_kills;
        self
    }

    /// Steps meeting the SLO (or serving the load, for best-effort apps).
    pub fn met_steps(&self) -> u64 {
        self.slo_met_steps + self.best_effort_served_steps
    }

    /// The sum over apps.
    pub(crate) fn sum<'a>(all: impl IntoIterator<Item = &'a Figures>, prices: &Prices) -> Figures {
        let mut s = Figures::default();
        for f in all {
            s.steps += f.steps;
            s.slo_steps += f.slo_steps;
            s.slo_met_steps += f.slo_met_steps;
            s.slo_violations += f.slo_violations;
            s.best_effort_steps += f.best_effort_steps;
            s.best_effort_served_steps += f.best_effort_served_steps;
            s.core_hours += f.core_hours;
            s.gib_hours += f.gib_hours;
            s.surge_core_hours += f.surge_core_hours;
            s.surge_gib_hours += f.surge_gib_hours;
            s.replica_changes += f.replica_changes;
            s.vertical_changes += f.vertical_changes;
            s.pod_restarts += f.pod_restarts;
            s.oom_kills += f.oom_kills;
            s.pending_replica_seconds += f.pending_replica_seconds;
            s.used_core_hours += f.used_core_hours;
        }
        s.finish(prices)
    }

    /// The share of steps that met the SLO, for an app with one; of steps that served the load,
    /// for a best-effort app.
    pub fn attainment(&self) -> f64 {
        self.slo_attainment
            .or(self.best_effort_served)
            .unwrap_or(1.0)
    }
}

/// One HPA target of the sweep: what it gave over a window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SweepPoint {
    pub target_percent: u32,
    /// [`Figures::attainment`].
    pub attainment: f64,
    pub core_hours: f64,
    pub gib_hours: f64,
    pub cost: f64,
}

impl SweepPoint {
    fn of(target_percent: u32, f: &Figures) -> SweepPoint {
        SweepPoint {
            target_percent,
            attainment: f.attainment(),
            core_hours: f.core_hours,
            gib_hours: f.gib_hours,
            cost: f.cost,
        }
    }
}

/// The target a platform engineer keeps after the sweep: the cheapest that meets the objective;
/// if none does, the one with the highest attainment (the cheapest of those). Points with a
/// non-finite attainment or cost are never chosen.
pub fn choose_target(points: &[SweepPoint], objective: f64) -> Option<SweepPoint> {
    let valid = || {
        points
            .iter()
            .filter(|p| p.attainment.is_finite() && p.cost.is_finite())
    };
    let meeting = valid()
        .filter(|p| p.attainment >= objective)
        .min_by(|a, b| {
            a.cost
                .total_cmp(&b.cost)
                .then(b.attainment.total_cmp(&a.attainment))
        });
    meeting
        .or_else(|| {
            valid().max_by(|a, b| {
                a.attainment
                    .total_cmp(&b.attainment)
                    .then(b.cost.total_cmp(&a.cost))
            })
        })
        .copied()
}

/// What drives the targets of a baseline run.
pub(crate) enum Baseline {
    /// One HPA + VPA fallback per app (the recommender's own); `hold_replicas`: the VPA alone.
    Fallbacks {
        fallbacks: Vec<Fallback>,
        hold_replicas: bool,
    },
    /// The SLO-constrained oracle: each app's grid in price order; per app, the decisions for
    /// which no candidate met the SLO.
    Oracle {
        sorted: Vec<Vec<Allocation>>,
        prices: Prices,
        unreachable: Vec<u64>,
    },
}

impl Baseline {
    pub(crate) fn fallbacks(targets: &[u32], hold_replicas: bool) -> Result<Baseline, BenchError> {
        let fallbacks = targets
            .iter()
            .map(|&t| {
                Fallback::new(FallbackConfig {
                    hpa: HpaConfig {
                        target_cpu_utilization: f64::from(t) / 100.0,
                        ..HpaConfig::default()
                    },
                    ..FallbackConfig::default()
                })
                .map_err(fail)
            })
            .collect::<Result<_, _>>()?;
        Ok(Baseline::Fallbacks {
            fallbacks,
            hold_replicas,
        })
    }

    /// The recommender's default fallback for every app.
    fn default_fallbacks(apps: usize, hold_replicas: bool) -> Result<Baseline, BenchError> {
        let fallbacks = (0..apps)
            .map(|_| Fallback::new(FallbackConfig::default()).map_err(fail))
            .collect::<Result<_, _>>()?;
        Ok(Baseline::Fallbacks {
            fallbacks,
            hold_replicas,
        })
    }

    /// The actions for the next step, from each app's latest observation.
    fn decide(
        &mut self,
        env: &SimEnv,
        last: &[Observation],
    ) -> Result<Vec<TargetAction>, BenchError> {
        match self {
            Baseline::Fallbacks {
                fallbacks,
                hold_replicas,
            } => last
                .iter()
                .zip(fallbacks.iter_mut())
                .enumerate()
                .map(|(i, (o, f))| {
                    // An app off the cluster has no `obs`: the recommender sees nothing.
                    if !env.is_present(i, env.step_index().saturating_sub(1)) {
                        return Ok(TargetAction::Hold);
                    }
                    // What the recommender does with the step's `obs`.
                    let raw = obs_metrics(o, env.cluster_occupancy().is_some());
                    let current =
                        aware_shared::spec::allocation_in_force(&raw).unwrap_or(o.allocation);
                    let bounds = env.target(i).map_err(fail)?.app().bounds;
                    let mut desired = f
                        .recommend(o.metrics.time_s, &raw, current, &bounds)
                        .desired;
                    if *hold_replicas {
                        desired.replicas = current.replicas;
                    }
                    Ok(TargetAction::Desired(desired))
                })
                .collect(),
            Baseline::Oracle {
                sorted,
                prices,
                unreachable,
            } => (0..env.len())
                .map(|i| {
                    if !env.is_present(i, env.step_index()) {
                        return Ok(TargetAction::Hold);
                    }
                    let t = env.target_at_next_step(i).map_err(fail)?;
                    let grid = sorted.get(i).map_or(&[][..], Vec::as_slice);
                    let c = cheapest_step(&t, grid, prices, &[]);
                    if let Some(u) = unreachable.get_mut(i) {
                        *u += u64::from(!c.meets_slo);
                    }
                    Ok(TargetAction::Desired(c.allocation))
                })
                .collect(),
        }
    }
}

/// Runs `apps` under a baseline for `steps` steps as the collector's simulator source does (a
/// warm-up step at the initial allocation is the window's first step); the rows per app and
/// window step (none while the app is not on the cluster, `SimConfig::presence`).
pub(crate) fn simulate(
    apps: &[AppSpec],
    sim: &SimConfig,
    steps: u64,
    policy: &mut Baseline,
) -> Result<WindowRows, BenchError> {
    let mut env = SimEnv::new(apps.to_vec(), sim.clone()).map_err(fail)?;
    env.reset(sim.seed).map_err(fail)?;
    let n = env.len();
    let mut last = env.step(&vec![TargetAction::Hold; n]).map_err(fail)?;
    let shared = env.cluster_occupancy().is_some();
    let mut rows: Vec<Vec<Option<StepRow>>> = vec![Vec::with_capacity(steps as usize); n];
    for g in 0..steps {
        for (i, ((r, o), app)) in rows.iter_mut().zip(&last).zip(apps).enumerate() {
            if !env.is_present(i, g) {
                r.push(None);
                continue;
            }
            let reward = (g > 0).then_some(o.reward);
            let row = StepRow::of(
                &app.slo,
                &obs_metrics(o, shared),
                o.metrics.slo_violation,
                reward,
            )
            .ok_or_else(|| fail(format!("{}: no allocation in force", app.name)))?;
            r.push(Some(row));
        }
        if g + 1 == steps {
            break;
        }
        let actions = policy.decide(&env, &last)?;
        last = env.step(&actions).map_err(fail)?;
    }
    Ok(rows)
}

/// Per app figures of a baseline run.
pub(crate) fn run_baseline(
    apps: &[AppSpec],
    sim: &SimConfig,
    steps: u64,
    policy: &mut Baseline,
    prices: &Prices,
) -> Result<Vec<Figures>, BenchError> {
    let rows = simulate(apps, sim, steps, policy)?;
    Ok(figures_of(apps, &rows, sim.step_seconds, prices))
}

/// Each app's rows by window step (none while the app is off the cluster).
pub(crate) type WindowRows = Vec<Vec<Option<StepRow>>>;

/// The rows of the steps an app was on the cluster.
fn present_rows(rows: &[Option<StepRow>]) -> Vec<StepRow> {
    rows.iter().flatten().copied().collect()
}

/// The sweep of HPA targets over a window: per app, one point per target.
pub(crate) fn sweep(
    apps: &[AppSpec],
    sim: &SimConfig,
    steps: u64,
    targets: &[u32],
    prices: &Prices,
) -> Result<Vec<Vec<SweepPoint>>, BenchError> {
    let mut out = vec![Vec::with_capacity(targets.len()); apps.len()];
    for &t in targets {
        let mut b = Baseline::fallbacks(&vec![t; apps.len()], false)?;
        let figs = run_baseline(apps, sim, steps, &mut b, prices)?;
        for (o, f) in out.iter_mut().zip(&figs) {
            o.push(SweepPoint::of(t, f));
        }
    }
    Ok(out)
}

/// The aware policy's learning, as the services reported it over the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AwareLearning {
    /// Decisions of the window by source.
    pub rl_decisions: u64,
    pub fallback_decisions: u64,
    /// Apps that went ONLINE at least once, and the apps' stages at the end of the window.
    pub apps_ever_online: usize,
    pub stages_at_end: BTreeMap<String, usize>,
    pub models_published: u64,
    /// The widest state the agents observed: 9 features, 15 with `learning.mean_field`.
    pub state_width: usize,
    /// `trainer.meta_dir` (none: the plain base-learner).
    pub meta: Option<String>,
    /// The app-steps the agent's own decisions were in force, against `hpa_vpa_tuned` on the
    /// same app-steps (when both ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_steps: Option<AgentSteps>,
}

/// The app-steps whose allocation in force the RL policy decided (a step after the agent's
/// decision), priced for `aware` and for `hpa_vpa_tuned` on the same app-steps: whether the
/// agent's own decisions are cheaper than the tuned HPA's, apart from the steps behind the
/// fallback. Requested core-hours and GiB-hours, without the restarts' surge.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AgentSteps {
    pub app_steps: u64,
    /// Of them, the steps of apps with an SLO, and those meeting it under each policy.
    pub slo_steps: u64,
    pub aware_met: u64,
    pub tuned_met: u64,
    pub aware_core_hours: f64,
    pub tuned_core_hours: f64,
    pub aware_gib_hours: f64,
    pub tuned_gib_hours: f64,
    /// The oracle on the same app-steps (when it ran): what the agent's steps could cost at
    /// best, and the whole window's core-hours and GiB-hours had the agent's steps cost that
    /// (the fallback's steps as they were).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oracle: Option<OracleBound>,
}

/// The oracle's requests on the agent's app-steps, and the window's bound they set.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OracleBound {
    pub core_hours: f64,
    pub gib_hours: f64,
    pub met: u64,
    /// `aware`'s window with its own steps at the oracle's requests.
    pub window_core_hours: f64,
    pub window_gib_hours: f64,
}

impl AgentSteps {
    /// Over every app and window step `g > 0` whose previous step's decision came from the RL
    /// policy, with both policies' rows present.
    pub(crate) fn of(
        apps: &[AppSpec],
        aware: &WindowRows,
        tuned: &WindowRows,
        oracle: Option<&WindowRows>,
        step_seconds: f64,
    ) -> AgentSteps {
        let h = step_seconds / 3600.0;
        let mut s = AgentSteps::default();
        let mut bound = OracleBound::default();
        for (i, ((app, a), t)) in apps.iter().zip(aware).zip(tuned).enumerate() {
            let slo = has_slo(&app.slo);
            let o = oracle.and_then(|o| o.get(i));
            for (g, (ar, tr)) in a.iter().zip(t).enumerate().skip(1) {
                let decided = a[g - 1].as_ref().is_some_and(|p| p.rl);
                let (Some(ar), Some(tr), true) = (ar, tr, decided) else {
                    continue;
                };
                if let Some(Some(or)) = o.and_then(|o| o.get(g)) {
                    bound.core_hours += Prices::cores(&or.allocation) * h;
                    bound.gib_hours += Prices::gib(&or.allocation) * h;
                    bound.met += u64::from(slo && or.met);
                }
                s.app_steps += 1;
                s.slo_steps += u64::from(slo);
                s.aware_met += u64::from(slo && ar.met);
                s.tuned_met += u64::from(slo && tr.met);
                s.aware_core_hours += Prices::cores(&ar.allocation) * h;
                s.tuned_core_hours += Prices::cores(&tr.allocation) * h;
                s.aware_gib_hours += Prices::gib(&ar.allocation) * h;
                s.tuned_gib_hours += Prices::gib(&tr.allocation) * h;
            }
        }
        if oracle.is_some() {
            let requested = |f: fn(&Allocation) -> f64| -> f64 {
                aware
                    .iter()
                    .flatten()
                    .flatten()
                    .map(|r| f(&r.allocation) * h)
                    .sum()
            };
            bound.window_core_hours =
                requested(Prices::cores) - s.aware_core_hours + bound.core_hours;
            bound.window_gib_hours = requested(Prices::gib) - s.aware_gib_hours + bound.gib_hours;
            s.oracle = Some(bound);
        }
        s
    }
}

/// A policy over all apps.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyReport {
    #[serde(flatten)]
    pub figures: Figures,
    pub apps_with_slo: usize,
    /// Apps with an SLO whose attainment reached the objective.
    pub apps_meeting_objective: usize,
    pub wall_seconds: f64,
    /// The oracle: its decisions for which no candidate met the SLO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreachable_steps: Option<u64>,
    /// The aware policy's learning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learning: Option<AwareLearning>,
}

/// One app.
#[derive(Debug, Clone, Serialize)]
pub struct AppReport {
    /// `namespace/name`.
    pub name: String,
    /// Its class in the plots: the kind of its load pattern.
    pub class: String,
    pub slo: Slo,
    pub vertical: VerticalMode,
    pub initial: Allocation,
    /// hpa_vpa_tuned's HPA target (% CPU) and whether it met the objective on the tuning window.
    pub hpa_target_tuned: Option<u32>,
    pub tuned_met_objective_on_tuning_window: Option<bool>,
    /// The oracle's decisions for which no allocation within the bounds met the SLO.
    pub oracle_unreachable_steps: Option<u64>,
    /// The sweep on the tuning window, and the same targets on the evaluation window (the
    /// trade-off HPA offers this app, for the plots).
    pub tuning_sweep: Vec<SweepPoint>,
    pub evaluation_sweep: Vec<SweepPoint>,
    pub policies: BTreeMap<String, Figures>,
}

/// `policy` against `against`, over all apps.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub policy: String,
    pub against: String,
    /// `policy ÷ against − 1`, %.
    pub core_hours_pct: f64,
    pub gib_hours_pct: f64,
    pub cost_pct: f64,
    /// Attainment difference, percentage points.
    pub slo_attainment_pp: Option<f64>,
    /// Apps on which `against` meets the objective and `policy` does not.
    pub apps_missed: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CostReport {
    pub seed: u64,
    pub tuning_seed: u64,
    pub generated_apps: usize,
    pub app_file: Option<String>,
    pub episodes: u32,
    pub steps_per_episode: u32,
    /// Steps of the evaluation window (and of the tuning window).
    pub steps: u64,
    pub step_seconds: f64,
    pub objective: f64,
    pub prices: Prices,
    pub hpa_targets: Vec<u32>,
    pub oracle_cpu_step_millicores: u32,
    pub oracle_memory_step_mib: u64,
    /// The aware policy's fallback HPA target: each app's tuned one, or the default.
    pub aware_fallback: AwareFallback,
    pub policies: BTreeMap<String, PolicyReport>,
    /// Per app class ([`class_of`]), each policy's figures summed over the class's apps.
    pub classes: BTreeMap<String, BTreeMap<String, Figures>>,
    pub apps: Vec<AppReport>,
    pub comparisons: Vec<Comparison>,
    /// The Pareto plots written (file names in the output directory).
    pub plots: Vec<String>,
}

fn collector_config(opts: &CostBenchOptions) -> CollectorConfig {
    let mut c = CollectorConfig {
        source: SourceKind::Simulator,
        ..CollectorConfig::default()
    };
    let sim = &mut c.simulator;
    sim.apps = opts.generated_apps();
    sim.seed = opts.seed;
    sim.app_files = opts.app_file.iter().cloned().collect();
    // The window's last `obs` is global step steps − 1; one more as a margin.
    sim.max_steps = opts.steps() + 1;
    // Paced: a decision may wait for the trainer's round on the same cores.
    sim.step_timeout_ms = 60_000;
    sim.cluster = opts.cluster;
    sim.burst_headroom = opts.burst_headroom;
    sim.presence = opts
        .presence
        .iter()
        .map(|p| aware_metrics_collector::config::SimPresence {
            target: p.target.clone(),
            join_step: p.join_step,
            leave_step: p.leave_step,
        })
        .collect();
    c
}

/// Whether `app` is on the cluster at window step `g` (`presence`).
pub(crate) fn is_present(presence: &[Presence], app: &AppSpec, g: u64) -> bool {
    presence
        .iter()
        .find(|p| p.target == app.name)
        .is_none_or(|p| p.covers(g))
}

/// The apps and the evaluation window's simulation settings, as the collector builds them.
pub(crate) fn apps_and_sim(
    opts: &CostBenchOptions,
) -> Result<(Vec<AppSpec>, SimConfig), BenchError> {
    let c = collector_config(opts);
    let apps = aware_metrics_collector::simulator::build_apps(&c.simulator)?;
    let sim = aware_metrics_collector::simulator::sim_config(&c.simulator, &apps)?;
    Ok((apps, sim))
}

/// The services' configuration of the aware policy: `aware demo`'s (the simulated cluster, the
/// stores under `dir`, a trainer that polls often enough for a paced run, the meta-learned
/// base-learner with its imitation weight), every other setting the services' default, then
/// `--set`.
fn aware_config(
    opts: &CostBenchOptions,
    apps: &[AppSpec],
    fallback_targets: Option<&[u32]>,
    dir: &Path,
) -> Result<AppConfig, BenchError> {
    let mut cfg = aware_harness::paced_sim_config(
        &collector_config(opts),
        opts.steps_per_episode,
        dir,
        opts.meta.as_deref(),
        &opts.settings,
    )?;
    cfg.targets = aware_metrics_collector::simulator::target_specs(apps);
    if let Some(targets) = fallback_targets {
        for (spec, t) in cfg.targets.iter_mut().zip(targets) {
            spec.fallback.hpa_target_cpu_utilization = Some(f64::from(*t) / 100.0);
        }
    }
    cfg.validate()?;
    cfg.section::<aware_recommender::RecommenderConfig>("recommender")
        .map_err(fail)?
        .validate()?;
    cfg.section::<aware_lifecycle_monitor::MonitorConfig>("lifecycle_monitor")
        .map_err(fail)?
        .validate()
        .map_err(fail)?;
    cfg.section::<aware_meta_learner_trainer::learner::TrainerConfig>("trainer")
        .map_err(fail)?
        .validate()
        .map_err(fail)?;
    Ok(cfg)
}

/// The aware policy: the six services on the embedded bus, paced; every `obs` of the window
/// becomes a row.
async fn run_aware(
    opts: &CostBenchOptions,
    apps: &[AppSpec],
    fallback_targets: Option<&[u32]>,
) -> Result<(WindowRows, AwareLearning), BenchError> {
    let dir = opts.out.join("cost-work").join("aware");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let cfg = aware_config(opts, apps, fallback_targets, &dir)?;
    let index: HashMap<Target, usize> = apps
        .iter()
        .enumerate()
        .map(|(i, a)| (Target::new(a.namespace.clone(), a.name.clone()), i))
        .collect();
    let steps = opts.steps();
    let spe = u64::from(opts.steps_per_episode.max(1));
    let n = apps.len();
    let bus = Bus::in_process((4 * n).max(64));
    let mut services = aware_harness::PacedServices::start(
        bus,
        cfg,
        n,
        Duration::from_millis(opts.pace_ms),
        opts.timeout,
    )
    .await?;
    let mut rows: Vec<Vec<Option<StepRow>>> = vec![vec![None; steps as usize]; n];
    // Every app-step of the window on the cluster gets one `obs`.
    let expected: usize = apps
        .iter()
        .map(|a| {
            (0..steps)
                .filter(|g| is_present(&opts.presence, a, *g))
                .count()
        })
        .sum();
    let mut decisions: Vec<Vec<Option<DecisionSource>>> = vec![vec![None; steps as usize]; n];
    let mut filled = 0usize;
    let mut stage: Vec<Option<Stage>> = vec![None; n];
    let mut ever_online = BTreeSet::new();
    let mut models = 0u64;
    let mut state_width = 0usize;
    let slot = |t: &Target, episode: u64, step: u32| -> Option<(usize, usize)> {
        let g = episode.checked_mul(spe)?.checked_add(u64::from(step))?;
        let i = *index.get(t)?;
        (g < steps).then_some((i, usize::try_from(g).ok()?))
    };
    while filled < expected {
        let Some(ev) = services.next_event().await else {
            break;
        };
        match ev {
            Event::Obs(o) => {
                state_width = state_width.max(o.state.len());
                if let Some((i, g)) = slot(&o.target, o.episode, o.step) {
                    if rows[i][g].is_none() {
                        let row = StepRow::of(&apps[i].slo, &o.metrics, o.slo_violation, o.reward)
                            .ok_or_else(|| fail(format!("{}: obs without limits", o.target)))?;
                        rows[i][g] = Some(row);
                        filled += 1;
                    }
                }
            }
            Event::Action(a) => {
                if let Some((i, g)) = slot(&a.target, a.episode, a.step) {
                    decisions[i][g] = Some(a.source);
                }
            }
            Event::Lifecycle(l) => {
                if let Some(&i) = index.get(&l.target) {
                    stage[i] = Some(l.stage);
                    if l.stage == Stage::Online {
                        ever_online.insert(i);
                    }
                }
            }
            Event::Model(_) => models += 1,
            _ => {}
        }
    }
    services.stop().await?;
    if filled < expected {
        return Err(BenchError::Failed(format!(
            "aware: {filled} of {expected} app-steps within {:?}",
            opts.timeout
        )));
    }
    for (r, d) in rows.iter_mut().zip(&decisions) {
        for (row, d) in r.iter_mut().zip(d) {
            if let Some(row) = row {
                row.rl = *d == Some(DecisionSource::Rl);
            }
        }
    }
    let count = |s: DecisionSource| {
        decisions
            .iter()
            .flatten()
            .filter(|d| **d == Some(s))
            .count() as u64
    };
    let mut stages_at_end = BTreeMap::new();
    for s in &stage {
        *stages_at_end
            .entry(s.map_or("none", Stage::as_str).to_string())
            .or_insert(0) += 1;
    }
    Ok((
        rows,
        AwareLearning {
            rl_decisions: count(DecisionSource::Rl),
            fallback_decisions: count(DecisionSource::Fallback),
            apps_ever_online: ever_online.len(),
            stages_at_end,
            models_published: models,
            state_width,
            meta: opts.meta.as_ref().map(|m| m.display().to_string()),
            agent_steps: None,
        },
    ))
}

/// The aware policy's rows per app and window step (none while the app is off the cluster),
/// and its learning: [`run_aware`] on an actix system of its own.
pub(crate) fn aware_rows(
    opts: &CostBenchOptions,
    apps: &[AppSpec],
    fallback_targets: Option<&[u32]>,
) -> Result<(WindowRows, AwareLearning), BenchError> {
    let system = actix_rt::System::new();
    system.block_on(run_aware(opts, apps, fallback_targets))
}

/// Per app figures of a window's rows.
pub(crate) fn figures_of(
    apps: &[AppSpec],
    rows: &WindowRows,
    step_seconds: f64,
    prices: &Prices,
) -> Vec<Figures> {
    apps.iter()
        .zip(rows)
        .map(|(a, r)| Figures::of_app(a, &present_rows(r), step_seconds, prices))
        .collect()
}

/// The apps with an SLO whose attainment reached `objective`.
pub(crate) fn apps_meeting(figs: &[Figures], objective: f64) -> usize {
    figs.iter()
        .filter(|f| f.slo_attainment.is_some_and(|a| a >= objective))
        .count()
}

/// The kind of an app's load pattern: its class in the plots.
pub fn class_of(app: &AppSpec) -> &'static str {
    match app.load.pattern {
        LoadPattern::Constant { .. } => "constant",
        LoadPattern::Diurnal { .. } => "diurnal",
        LoadPattern::Bursty { .. } => "bursty",
        LoadPattern::OnOff { .. } => "on_off",
        LoadPattern::Trace { .. } => "trace",
    }
}

fn pct(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        100.0 * (a / b - 1.0)
    } else {
        f64::NAN
    }
}

/// Runs the selected policies, writes `cost.json` and the Pareto plots into `opts.out`, and
/// returns the report.
pub fn run(opts: &CostBenchOptions) -> Result<CostReport, BenchError> {
    opts.check()?;
    let selected = opts.selected();
    let (apps, sim) = apps_and_sim(opts)?;
    let tuning = SimConfig {
        seed: opts.tuning_seed(),
        ..sim.clone()
    };
    let steps = opts.steps();
    let prices = opts.prices();
    let n = apps.len();
    let mut per_app: Vec<BTreeMap<String, Figures>> = vec![BTreeMap::new(); n];
    let mut policies: BTreeMap<String, PolicyReport> = BTreeMap::new();
    let mut tuned: Vec<Option<SweepPoint>> = vec![None; n];
    let mut tuning_sweep = vec![Vec::new(); n];
    let mut evaluation_sweep = vec![Vec::new(); n];
    let mut oracle_unreachable: Vec<Option<u64>> = vec![None; n];
    let mut record = |p: CostPolicy,
                      figs: Vec<Figures>,
                      started: Instant,
                      unreachable: Option<u64>,
                      learning: Option<AwareLearning>,
                      per_app: &mut Vec<BTreeMap<String, Figures>>| {
        let apps_with_slo = apps.iter().filter(|a| has_slo(&a.slo)).count();
        let apps_meeting_objective = apps_meeting(&figs, opts.objective);
        let report = PolicyReport {
            figures: Figures::sum(&figs, &prices),
            apps_with_slo,
            apps_meeting_objective,
            wall_seconds: started.elapsed().as_secs_f64(),
            unreachable_steps: unreachable,
            learning,
        };
        tracing::info!(
            policy = p.name(),
            slo_attainment = ?report.figures.slo_attainment,
            core_hours = report.figures.core_hours,
            gib_hours = report.figures.gib_hours,
            wall_s = report.wall_seconds,
            "policy done"
        );
        for (m, f) in per_app.iter_mut().zip(figs) {
            m.insert(p.name().to_string(), f);
        }
        policies.insert(p.name().to_string(), report);
    };
    // The tuning sweep, once: hpa_vpa_tuned runs with its choice, and so does the aware
    // policy's fallback with `--aware-fallback tuned`.
    let tune = selected.contains(&CostPolicy::HpaVpaTuned)
        || (selected.contains(&CostPolicy::Aware) && opts.aware_fallback == AwareFallback::Tuned);
    if tune {
        tuning_sweep = sweep(&apps, &tuning, steps, &opts.hpa_targets, &prices)?;
        tuned = tuning_sweep
            .iter()
            .map(|pts| choose_target(pts, opts.objective))
            .collect();
    }
    let mut tuned_rows: Option<WindowRows> = None;
    let mut aware_window: Option<WindowRows> = None;
    let mut oracle_rows: Option<WindowRows> = None;
    let tuned_targets: Vec<u32> = tuned
        .iter()
        .map(|c| c.map_or(70, |c| c.target_percent))
        .collect();
    for &p in &selected {
        let started = Instant::now();
        match p {
            CostPolicy::HpaVpaDefault | CostPolicy::Vpa => {
                let mut b = Baseline::default_fallbacks(n, p == CostPolicy::Vpa)?;
                let figs = run_baseline(&apps, &sim, steps, &mut b, &prices)?;
                record(p, figs, started, None, None, &mut per_app);
            }
            CostPolicy::HpaVpaTuned => {
                let mut b = Baseline::fallbacks(&tuned_targets, false)?;
                let rows = simulate(&apps, &sim, steps, &mut b)?;
                let figs = figures_of(&apps, &rows, sim.step_seconds, &prices);
                tuned_rows = Some(rows);
                record(p, figs, started, None, None, &mut per_app);
                evaluation_sweep = sweep(&apps, &sim, steps, &opts.hpa_targets, &prices)?;
            }
            CostPolicy::Oracle => {
                let sorted = apps
                    .iter()
                    .map(|a| candidates_by_cost(&a.bounds, &opts.grid(), &prices))
                    .collect();
                let mut b = Baseline::Oracle {
                    sorted,
                    prices,
                    unreachable: vec![0; n],
                };
                let rows = simulate(&apps, &sim, steps, &mut b)?;
                let figs = figures_of(&apps, &rows, sim.step_seconds, &prices);
                oracle_rows = Some(rows);
                if let Baseline::Oracle { unreachable, .. } = b {
                    oracle_unreachable = unreachable.into_iter().map(Some).collect();
                }
                let total: u64 = oracle_unreachable.iter().flatten().sum();
                record(p, figs, started, Some(total), None, &mut per_app);
            }
            CostPolicy::Aware => {
                let targets = (opts.aware_fallback == AwareFallback::Tuned)
                    .then_some(tuned_targets.as_slice());
                let (rows, learning) = aware_rows(opts, &apps, targets)?;
                let figs = figures_of(&apps, &rows, sim.step_seconds, &prices);
                aware_window = Some(rows);
                record(p, figs, started, None, Some(learning), &mut per_app);
            }
        }
    }
    if let (Some(a), Some(t), Some(report)) = (
        &aware_window,
        &tuned_rows,
        policies.get_mut(CostPolicy::Aware.name()),
    ) {
        if let Some(l) = report.learning.as_mut() {
            l.agent_steps = Some(AgentSteps::of(
                &apps,
                a,
                t,
                oracle_rows.as_ref(),
                sim.step_seconds,
            ));
        }
    }
    let objective = opts.objective;
    let app_reports: Vec<AppReport> = apps
        .iter()
        .enumerate()
        .map(|(i, a)| AppReport {
            name: format!("{}/{}", a.namespace, a.name),
            class: class_of(a).to_string(),
            slo: a.slo,
            vertical: a.vertical,
            initial: a.initial,
            hpa_target_tuned: tuned[i].map(|c| c.target_percent),
            tuned_met_objective_on_tuning_window: tuned[i].map(|c| c.attainment >= objective),
            oracle_unreachable_steps: oracle_unreachable[i],
            tuning_sweep: tuning_sweep.get(i).cloned().unwrap_or_default(),
            evaluation_sweep: evaluation_sweep.get(i).cloned().unwrap_or_default(),
            policies: per_app[i].clone(),
        })
        .collect();
    let comparisons = comparisons(&policies, &app_reports, objective);
    let mut classes: BTreeMap<String, BTreeMap<String, Figures>> = BTreeMap::new();
    let names: BTreeSet<String> = app_reports.iter().map(|a| a.class.clone()).collect();
    for class in names {
        let members: Vec<&AppReport> = app_reports.iter().filter(|a| a.class == class).collect();
        let by_policy = policies
            .keys()
            .map(|p| {
                let f = Figures::sum(members.iter().filter_map(|a| a.policies.get(p)), &prices);
                (p.clone(), f)
            })
            .collect();
        classes.insert(class, by_policy);
    }
    let mut report = CostReport {
        seed: opts.seed,
        tuning_seed: opts.tuning_seed(),
        generated_apps: opts.generated_apps(),
        app_file: opts.app_file.as_ref().map(|p| p.display().to_string()),
        episodes: opts.episodes,
        steps_per_episode: opts.steps_per_episode,
        steps,
        step_seconds: sim.step_seconds,
        objective,
        prices,
        hpa_targets: opts.hpa_targets.clone(),
        oracle_cpu_step_millicores: opts.oracle_cpu_step,
        oracle_memory_step_mib: opts.oracle_memory_step_mib,
        aware_fallback: opts.aware_fallback,
        policies,
        classes,
        apps: app_reports,
        comparisons,
        plots: Vec::new(),
    };
    for (name, svg) in plots(&report) {
        let p = opts.out.join(&name);
        std::fs::create_dir_all(&opts.out)
            .and_then(|()| std::fs::write(&p, svg))
            .map_err(|source| BenchError::Io {
                path: p.display().to_string(),
                source,
            })?;
        report.plots.push(name);
    }
    crate::write_json(&opts.out, "cost.json", &serde_json::to_value(&report)?)?;
    Ok(report)
}

/// AWARE against every other policy run, and the tuned HPA against the default one.
fn comparisons(
    policies: &BTreeMap<String, PolicyReport>,
    apps: &[AppReport],
    objective: f64,
) -> Vec<Comparison> {
    let mut pairs = Vec::new();
    for against in [
        CostPolicy::HpaVpaTuned,
        CostPolicy::HpaVpaDefault,
        CostPolicy::Vpa,
        CostPolicy::Oracle,
    ] {
        pairs.push((CostPolicy::Aware, against));
    }
    pairs.push((CostPolicy::HpaVpaTuned, CostPolicy::HpaVpaDefault));
    pairs
        .into_iter()
        .filter_map(|(p, a)| {
            let (x, y) = (
                &policies.get(p.name())?.figures,
                &policies.get(a.name())?.figures,
            );
            let meets = |app: &AppReport, q: CostPolicy| {
                app.policies
                    .get(q.name())
                    .and_then(|f| f.slo_attainment)
                    .is_some_and(|s| s >= objective)
            };
            Some(Comparison {
                policy: p.name().into(),
                against: a.name().into(),
                core_hours_pct: pct(x.core_hours, y.core_hours),
                gib_hours_pct: pct(x.gib_hours, y.gib_hours),
                cost_pct: pct(x.cost, y.cost),
                slo_attainment_pp: x
                    .slo_attainment
                    .zip(y.slo_attainment)
                    .map(|(u, v)| 100.0 * (u - v)),
                apps_missed: apps
                    .iter()
                    .filter(|app| meets(app, a) && !meets(app, p))
                    .map(|app| app.name.clone())
                    .collect(),
            })
        })
        .collect()
}

/// A point of a Pareto plot: cost per app-hour against SLO attainment.
#[derive(Debug, Clone, PartialEq)]
pub struct ParetoPoint {
    pub label: String,
    pub cost_per_app_hour: f64,
    pub attainment: f64,
}

/// The Pareto plots: per app class (and `all`), each policy's cost per app-hour against its SLO
/// attainment over the class's apps with an SLO, and the HPA sweep on the evaluation window as
/// the trade-off the HPA's target offers. A class without an app with an SLO has no plot.
pub fn plots(r: &CostReport) -> Vec<(String, String)> {
    let hours = r.steps as f64 * r.step_seconds / 3600.0;
    let mut classes: BTreeMap<&str, Vec<&AppReport>> = BTreeMap::new();
    for a in &r.apps {
        classes.entry("all").or_default().push(a);
        classes.entry(a.class.as_str()).or_default().push(a);
    }
    let mut out = Vec::new();
    for (class, apps) in classes {
        let with_slo: Vec<&AppReport> = apps.iter().copied().filter(|a| has_slo(&a.slo)).collect();
        if with_slo.is_empty() {
            continue;
        }
        let app_hours = hours * with_slo.len() as f64;
        let points: Vec<ParetoPoint> = r
            .policies
            .keys()
            .filter_map(|p| {
                let f = Figures::sum(with_slo.iter().filter_map(|a| a.policies.get(p)), &r.prices);
                Some(ParetoPoint {
                    label: p.clone(),
                    cost_per_app_hour: f.cost / app_hours,
                    attainment: f.slo_attainment?,
                })
            })
            .collect();
        let sweep: Vec<ParetoPoint> = r
            .hpa_targets
            .iter()
            .enumerate()
            .filter_map(|(k, t)| {
                let pts: Vec<&SweepPoint> = with_slo
                    .iter()
                    .filter_map(|a| a.evaluation_sweep.get(k))
                    .collect();
                if pts.len() != with_slo.len() {
                    return None;
                }
                let cost: f64 = pts.iter().map(|p| p.cost).sum();
                // every app of the window has the same number of steps
                let att = pts.iter().map(|p| p.attainment).sum::<f64>() / pts.len() as f64;
                Some(ParetoPoint {
                    label: format!("{t}%"),
                    cost_per_app_hour: cost / app_hours,
                    attainment: att,
                })
            })
            .collect();
        let title = format!(
            "{class}: {} apps with an SLO, {} steps, objective {:.0}%",
            with_slo.len(),
            r.steps,
            100.0 * r.objective
        );
        out.push((
            format!("cost-pareto-{class}.svg"),
            pareto_svg(&title, &points, &sweep, r.objective),
        ));
    }
    out
}

const POLICY_COLORS: [(&str, &str); 5] = [
    ("aware", "#d62728"),
    ("hpa_vpa_tuned", "#1f77b4"),
    ("hpa_vpa_default", "#7f7f7f"),
    ("vpa", "#9467bd"),
    ("oracle", "#2ca02c"),
];

/// A scatter of policies (filled, labelled) and the HPA sweep (a line through small circles,
/// labelled with the target), cost on x, attainment on y, the objective as a dashed line.
pub fn pareto_svg(
    title: &str,
    points: &[ParetoPoint],
    sweep: &[ParetoPoint],
    objective: f64,
) -> String {
    let (w, h, l, r, t, b) = (760.0, 440.0, 70.0, 170.0, 40.0, 50.0);
    let all = || points.iter().chain(sweep.iter());
    let finite = |v: f64| v.is_finite();
    let (mut x0, mut x1) = all()
        .map(|p| p.cost_per_app_hour)
        .filter(|v| finite(*v))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    let (mut y0, mut y1) = all()
        .map(|p| p.attainment)
        .chain(std::iter::once(objective))
        .filter(|v| finite(*v))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !(x0.is_finite() && x1.is_finite()) {
        (x0, x1) = (0.0, 1.0);
    }
    if !(y0.is_finite() && y1.is_finite()) {
        (y0, y1) = (0.0, 1.0);
    }
    let pad = |lo: &mut f64, hi: &mut f64| {
        let span = (*hi - *lo).max(1e-9);
        *lo -= 0.05 * span;
        *hi += 0.05 * span;
    };
    pad(&mut x0, &mut x1);
    pad(&mut y0, &mut y1);
    y1 = y1.min(1.0 + 0.05 * (y1 - y0));
    let px = |x: f64| l + (w - l - r) * (x - x0) / (x1 - x0);
    let py = |y: f64| t + (h - t - b) * (1.0 - (y - y0) / (y1 - y0));
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r#"<text x="{l}" y="22" font-size="13">{title}</text>"#);
    let _ = write!(
        s,
        r##"<rect x="{l}" y="{t}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
        w - l - r,
        h - t - b
    );
    for k in 0..=4 {
        let f = f64::from(k) / 4.0;
        let (xv, yv) = (x0 + (x1 - x0) * f, y0 + (y1 - y0) * f);
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{xv:.3}</text><text x="{}" y="{:.1}" text-anchor="end">{:.1}%</text>"#,
            px(xv),
            h - b + 14.0,
            l - 4.0,
            py(yv) + 4.0,
            100.0 * yv
        );
    }
    if finite(objective) {
        let y = py(objective);
        let _ = write!(
            s,
            r##"<line x1="{l}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#999" stroke-dasharray="4,3"/><text x="{}" y="{:.1}">objective</text>"##,
            w - r,
            w - r + 6.0,
            y + 4.0
        );
    }
    let sweep_pts: Vec<&ParetoPoint> = sweep
        .iter()
        .filter(|p| finite(p.cost_per_app_hour) && finite(p.attainment))
        .collect();
    if !sweep_pts.is_empty() {
        let line: Vec<String> = sweep_pts
            .iter()
            .map(|p| format!("{:.1},{:.1}", px(p.cost_per_app_hour), py(p.attainment)))
            .collect();
        let _ = write!(
            s,
            r##"<polyline fill="none" stroke="#aec7e8" stroke-width="1.5" points="{}"/>"##,
            line.join(" ")
        );
        for p in &sweep_pts {
            let (x, y) = (px(p.cost_per_app_hour), py(p.attainment));
            let _ = write!(
                s,
                r##"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="#aec7e8"/><text x="{:.1}" y="{:.1}" font-size="9" fill="#6b8fb8">{}</text>"##,
                x + 3.0,
                y + 10.0,
                p.label
            );
        }
    }
    for (k, p) in points
        .iter()
        .filter(|p| finite(p.cost_per_app_hour) && finite(p.attainment))
        .enumerate()
    {
        let col = POLICY_COLORS
            .iter()
            .find(|(n, _)| *n == p.label)
            .map_or("#000", |(_, c)| *c);
        let (x, y) = (px(p.cost_per_app_hour), py(p.attainment));
        let _ = write!(s, r#"<circle cx="{x:.1}" cy="{y:.1}" r="5" fill="{col}"/>"#);
        let ly = t + 16.0 * k as f64 + 8.0;
        let _ = write!(
            s,
            r#"<circle cx="{}" cy="{ly}" r="5" fill="{col}"/><text x="{}" y="{}">{} ({:.1}%, {:.4}/h)</text>"#,
            w - r + 12.0,
            w - r + 20.0,
            ly + 4.0,
            p.label,
            100.0 * p.attainment,
            p.cost_per_app_hour
        );
    }
    if !sweep_pts.is_empty() {
        let ly = t + 16.0 * points.len() as f64 + 8.0;
        let _ = write!(
            s,
            r##"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="#aec7e8" stroke-width="2"/><text x="{}" y="{}">HPA target sweep</text>"##,
            w - r + 6.0,
            w - r + 18.0,
            w - r + 20.0,
            ly + 4.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">price of the requested cores and GiB per app-hour</text><text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">steps meeting the SLO</text></svg>"#,
        (l + w - r) / 2.0,
        h - 12.0,
        (t + h - b) / 2.0,
        (t + h - b) / 2.0
    );
    s
}

/// The summary lines `aware bench cost` prints.
pub fn summary(r: &CostReport) -> Vec<String> {
    let mut out = Vec::new();
    for (name, p) in &r.policies {
        let f = &p.figures;
        let mut line = format!(
            "{name:>16}: SLO attainment {} ({} of {} apps meet {:.0}%), {:.1} core-h, {:.1} GiB-h, {:.2} price; disruptions {} (replica changes {}, pod restarts {}, OOM kills {}); {:.1} s",
            f.slo_attainment
                .map_or("-".to_string(), |a| format!("{:.2}%", 100.0 * a)),
            p.apps_meeting_objective,
            p.apps_with_slo,
            100.0 * r.objective,
            f.core_hours,
            f.gib_hours,
            f.cost,
            f.disruptions,
            f.replica_changes,
            f.pod_restarts,
            f.oom_kills,
            p.wall_seconds
        );
        if let Some(u) = p.unreachable_steps {
            let _ = write!(line, "; SLO out of reach on {u} steps");
        }
        if let Some(l) = &p.learning {
            let _ = write!(
                line,
                "; RL decisions {} / fallback {}, apps ever ONLINE {}",
                l.rl_decisions, l.fallback_decisions, l.apps_ever_online
            );
        }
        out.push(line);
    }
    let mut targets: BTreeMap<u32, usize> = BTreeMap::new();
    for t in r.apps.iter().filter_map(|a| a.hpa_target_tuned) {
        *targets.entry(t).or_insert(0) += 1;
    }
    if !targets.is_empty() {
        let met = r
            .apps
            .iter()
            .filter(|a| a.tuned_met_objective_on_tuning_window == Some(true))
            .count();
        out.push(format!(
            "hpa_vpa_tuned targets (apps): {}; {met} of {} apps met the objective on the tuning window",
            targets
                .iter()
                .map(|(t, n)| format!("{t}% ×{n}"))
                .collect::<Vec<_>>()
                .join(", "),
            r.apps.len()
        ));
    }
    let agent = r
        .policies
        .get(CostPolicy::Aware.name())
        .and_then(|p| p.learning.as_ref()?.agent_steps.as_ref());
    if let Some(a) = agent {
        let share = |m: u64| 100.0 * m as f64 / a.slo_steps.max(1) as f64;
        out.push(format!(
            "aware's own decisions in force on {} app-steps: attainment {:.2}% against hpa_vpa_tuned's {:.2}% on the same steps, core-hours {:+.1}%, GiB-hours {:+.1}%",
            a.app_steps,
            share(a.aware_met),
            share(a.tuned_met),
            pct(a.aware_core_hours, a.tuned_core_hours),
            pct(a.aware_gib_hours, a.tuned_gib_hours),
        ));
        let tuned = r.policies.get(CostPolicy::HpaVpaTuned.name());
        if let (Some(b), Some(t)) = (&a.oracle, tuned) {
            out.push(format!(
                "the oracle on those app-steps: core-hours {:+.1}% against hpa_vpa_tuned's; the window at best, the agent's steps at the oracle's requests: core-hours {:+.1}%, GiB-hours {:+.1}% against hpa_vpa_tuned",
                pct(b.core_hours, a.tuned_core_hours),
                pct(b.window_core_hours, t.figures.core_hours),
                pct(b.window_gib_hours, t.figures.gib_hours),
            ));
        }
    }
    for c in &r.comparisons {
        out.push(format!(
            "{} vs {}: core-hours {:+.1}%, GiB-hours {:+.1}%, price {:+.1}%, attainment {} pp; {} apps meet the objective under {} only",
            c.policy,
            c.against,
            c.core_hours_pct,
            c.gib_hours_pct,
            c.cost_pct,
            c.slo_attainment_pp
                .map_or("-".to_string(), |d| format!("{d:+.2}")),
            c.apps_missed.len(),
            c.against
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(target_percent: u32, attainment: f64, cost: f64) -> SweepPoint {
        SweepPoint {
            target_percent,
            attainment,
            core_hours: cost,
            gib_hours: 0.0,
            cost,
        }
    }

    #[test]
    fn the_sweep_keeps_the_cheapest_target_that_meets_the_objective() {
        let pts = [
            point(20, 1.0, 10.0),
            point(30, 0.995, 8.0),
            point(40, 0.99, 6.5),
            point(50, 0.97, 5.0),
            point(70, 0.6, 3.0),
        ];
        assert_eq!(
            choose_target(&pts, 0.99).map(|p| p.target_percent),
            Some(40)
        );
        assert_eq!(
            choose_target(&pts, 0.999).map(|p| p.target_percent),
            Some(20)
        );
        assert_eq!(choose_target(&pts, 0.5).map(|p| p.target_percent), Some(70));
        // a cheaper lower target that meets it wins over a dearer higher one (costs need not
        // fall with the target: a crash-looping app costs little)
        let odd = [point(20, 0.995, 4.0), point(60, 0.999, 7.0)];
        assert_eq!(
            choose_target(&odd, 0.99).map(|p| p.target_percent),
            Some(20)
        );
    }

    #[test]
    fn without_a_target_meeting_it_the_sweep_keeps_the_highest_attainment() {
        let pts = [
            point(20, 0.9, 10.0),
            point(30, 0.95, 8.0),
            point(40, 0.95, 7.0),
            point(50, 0.8, 5.0),
        ];
        // highest attainment, the cheaper of the two
        assert_eq!(
            choose_target(&pts, 0.99).map(|p| p.target_percent),
            Some(40)
        );
        // non-finite points are never chosen
        let bad = [
            point(20, f64::NAN, 1.0),
            point(30, 0.5, f64::INFINITY),
            point(40, 0.4, 2.0),
        ];
        assert_eq!(
            choose_target(&bad, 0.99).map(|p| p.target_percent),
            Some(40)
        );
        assert_eq!(choose_target(&[], 0.99), None);
    }

    /// A generated app with a p99 latency SLO of 100 ms.
    fn app_with_a_latency_slo() -> AppSpec {
        let mut app = aware_loadgen::app::generate_apps(1, 3, &Default::default()).remove(0);
        app.slo = Slo {
            latency_p99_ms: Some(100.0),
            throughput_rps: None,
            objective: None,
        };
        app
    }

    /// A fallback step at `allocation` that met its SLO or violated it.
    fn step_row(allocation: Allocation, met: bool) -> StepRow {
        StepRow {
            allocation,
            violation: !met,
            met,
            oom_kills: 0,
            reward: None,
            rl: false,
            pending_replicas: 0,
            cpu_used_cores: 1.5,
        }
    }

    #[test]
    fn figures_count_cost_and_disruptions_per_step() {
        let mut app = app_with_a_latency_slo();
        app.vertical = VerticalMode::Restart;
        let a = |replicas, cpu_millicores, mib: u64| Allocation {
            replicas,
            cpu_millicores,
            memory_bytes: mib * 1024 * 1024,
        };
        let row = |allocation, violation: bool, oom_kills| StepRow {
            oom_kills,
            ..step_row(allocation, !violation)
        };
        let rows = [
            row(a(2, 1000, 1024), false, 0),
            StepRow {
                pending_replicas: 2,              // two of the four wait for room
                ..row(a(4, 1000, 1024), true, 0)  // scale out
            },
            row(a(3, 500, 1024), false, 1), // scale in + vertical: 3 pods restarted
            row(a(3, 500, 1024), false, 0),
        ];
        let prices = Prices {
            core_hour: 1.0,
            gib_hour: 0.1,
        };
        // half-hour steps; the restart at step 2 keeps 3 of the 4 old 1-core, 1-GiB pods for
        // the cold start
        let f = Figures::of_app(&app, &rows, 1800.0, &prices);
        let surge = 3.0 * 0.5 * AppModel::from_app(&app).cold_start_seconds / 1800.0;
        assert!(surge > 0.0);
        assert!((f.surge_core_hours - surge).abs() < 1e-12);
        assert!((f.surge_gib_hours - surge).abs() < 1e-12);
        assert_eq!(f.steps, 4);
        assert_eq!(f.slo_attainment, Some(0.75));
        assert_eq!(f.slo_violations, 1);
        assert_eq!(f.best_effort_served, None);
        // (2 + 4 + 1.5 + 1.5) cores × ½ h; (2 + 4 + 3 + 3) GiB × ½ h
        assert!((f.core_hours - (4.5 + surge)).abs() < 1e-12);
        assert!((f.gib_hours - (6.0 + surge)).abs() < 1e-12);
        assert!((f.cost - (4.5 + surge + 0.1 * (6.0 + surge))).abs() < 1e-12);
        assert_eq!(
            (
                f.replica_changes,
                f.vertical_changes,
                f.pod_restarts,
                f.oom_kills
            ),
            (2, 1, 3, 1)
        );
        assert_eq!(f.disruptions, 6);
        assert_eq!(f.pending_replica_seconds, 2.0 * 1800.0);
        assert_eq!(f.used_core_hours, 4.0 * 1.5 * 0.5);
        // in place: the resize restarts nothing
        app.vertical = VerticalMode::InPlace;
        let inplace = Figures::of_app(&app, &rows, 1800.0, &prices);
        assert_eq!((inplace.pod_restarts, inplace.surge_core_hours), (0, 0.0));
        // a best-effort app: no SLO attainment, the served share instead
        app.slo = Slo::default();
        let g = Figures::of_app(&app, &rows, 1800.0, &prices);
        assert_eq!(g.slo_attainment, None);
        assert_eq!(g.best_effort_served, Some(0.75));
        assert_eq!(g.slo_violations, 0);
        // sums keep the shares per kind of app
        let s = Figures::sum([&f, &g, &f], &prices);
        assert_eq!(s.steps, 12);
        assert_eq!(s.slo_attainment, Some(0.75));
        assert_eq!(s.best_effort_served, Some(0.75));
        assert!((s.core_hours - (13.5 + 2.0 * surge)).abs() < 1e-9);
        assert_eq!(s.met_steps(), 9);
        assert_eq!((s.slo_met_steps, s.best_effort_served_steps), (6, 3));
        assert_eq!(s.disruptions, 6 + 3 + 6);
        assert_eq!(s.pending_replica_seconds, 3.0 * 3600.0);
    }

    #[test]
    fn agent_steps_are_the_steps_after_an_rl_decision_on_both_policies() {
        let app = app_with_a_latency_slo();
        let row = |replicas: u32, met: bool, rl: bool| {
            let allocation = Allocation {
                replicas,
                cpu_millicores: 1000,
                memory_bytes: 512 * MIB,
            };
            Some(StepRow {
                rl,
                ..step_row(allocation, met)
            })
        };
        // decisions at steps 1 and 3 come from the agent: steps 2 and 4 are its own; step 4
        // has no tuned row (the app off the cluster there) and is not counted
        let aware = vec![vec![
            row(1, true, false),
            row(2, true, true),
            row(3, false, false),
            row(4, true, true),
            row(5, true, false),
        ]];
        let tuned = vec![vec![
            row(2, true, false),
            row(2, true, false),
            row(6, true, false),
            row(2, true, false),
            None,
        ]];
        let oracle = vec![vec![row(1, true, false); 5]];
        let s = AgentSteps::of(std::slice::from_ref(&app), &aware, &tuned, None, 1800.0);
        assert_eq!(s.oracle, None);
        let b = AgentSteps::of(&[app], &aware, &tuned, Some(&oracle), 1800.0)
            .oracle
            .unwrap();
        // the agent's one step at the oracle's 1 core instead of its 3; the window's other
        // steps (1 + 2 + 4 + 5 cores) as they were
        assert_eq!(b.met, 1);
        assert!((b.core_hours - 0.5).abs() < 1e-12);
        assert!((b.window_core_hours - (12.0 + 1.0) * 0.5).abs() < 1e-12);
        assert!((b.window_gib_hours - (12.0 + 1.0) * 0.25).abs() < 1e-12);
        assert_eq!((s.app_steps, s.slo_steps), (1, 1));
        assert_eq!((s.aware_met, s.tuned_met), (0, 1));
        assert!((s.aware_core_hours - 1.5).abs() < 1e-12);
        assert!((s.tuned_core_hours - 3.0).abs() < 1e-12);
        assert!((s.aware_gib_hours - 0.75).abs() < 1e-12);
        assert!((s.tuned_gib_hours - 1.5).abs() < 1e-12);
    }

    #[test]
    fn policies_parse_by_name_and_default_to_all() {
        assert_eq!(parse_policy("hpa_vpa_tuned"), Ok(CostPolicy::HpaVpaTuned));
        assert!(parse_policy("hpa").unwrap_err().contains("oracle"));
        let o = CostBenchOptions::default();
        assert_eq!(o.selected(), CostPolicy::ALL.to_vec());
        let some = CostBenchOptions {
            policies: vec![CostPolicy::Oracle, CostPolicy::Vpa, CostPolicy::Oracle],
            ..CostBenchOptions::default()
        };
        assert_eq!(some.selected(), [CostPolicy::Vpa, CostPolicy::Oracle]);
        assert_eq!(o.generated_apps(), 20);
        let file = CostBenchOptions {
            app_file: Some("apps.yaml".into()),
            ..CostBenchOptions::default()
        };
        assert_eq!(file.generated_apps(), 0);
        assert_eq!(o.tuning_seed(), 4243);
        assert_eq!(default_hpa_targets().len(), 15);
        assert!(CostBenchOptions {
            objective: 1.5,
            ..CostBenchOptions::default()
        }
        .check()
        .is_err());
    }

    /// A `--meta` that does not load is refused before anything runs (the trainer would run on
    /// without meta-learning, and the figures would be the plain base-learner's); the shipped
    /// default loads; without the aware policy the flag is not read.
    #[test]
    fn a_meta_dir_that_does_not_load_is_refused() {
        let (missing, _guard) = temp_out("no-meta");
        let with = |meta: PathBuf, policies: Vec<CostPolicy>| {
            CostBenchOptions {
                meta: Some(meta),
                policies,
                ..CostBenchOptions::default()
            }
            .check()
        };
        let e = with(missing.clone(), vec![]).unwrap_err().to_string();
        assert!(e.contains("--meta") && e.contains("meta_dir"), "{e}");
        let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/meta-default");
        with(shipped, vec![]).unwrap();
        with(missing, vec![CostPolicy::Vpa]).unwrap();
    }

    /// `--aware-fallback tuned`: each app's registration carries its tuned HPA target, which
    /// the recommender's fallback runs with; without targets, none (the global default).
    #[test]
    fn the_aware_policys_fallback_gets_each_apps_tuned_target() {
        let (dir, _guard) = temp_out("aware-fallback");
        let opts = CostBenchOptions {
            apps: Some(3),
            ..CostBenchOptions::default()
        };
        let (apps, _) = apps_and_sim(&opts).unwrap();
        let cfg = aware_config(&opts, &apps, Some(&[35, 20, 90]), &dir).unwrap();
        let got: Vec<Option<f64>> = cfg
            .targets
            .iter()
            .map(|t| t.fallback.hpa_target_cpu_utilization)
            .collect();
        assert_eq!(got, [Some(0.35), Some(0.2), Some(0.9)]);
        let cfg = aware_config(&opts, &apps, None, &dir).unwrap();
        assert!(cfg
            .targets
            .iter()
            .all(|t| t.fallback.hpa_target_cpu_utilization.is_none()));
        assert_eq!(
            CostBenchOptions::default().aware_fallback,
            AwareFallback::Tuned
        );
    }

    fn temp_out(name: &str) -> (PathBuf, aware_shared::testkit::TempDirGuard) {
        let dir =
            std::env::temp_dir().join(format!("aware-bench-cost-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (dir.clone(), aware_shared::testkit::TempDirGuard(dir))
    }

    /// A small run of every baseline: the report's shape, and what must hold between the
    /// policies.
    #[test]
    fn a_small_run_writes_the_report_and_keeps_its_invariants() {
        let (out, _guard) = temp_out("baselines");
        let opts = CostBenchOptions {
            apps: Some(3),
            seed: 11,
            episodes: 3,
            steps_per_episode: 10,
            hpa_targets: vec![20, 40, 70, 90],
            oracle_cpu_step: 512,
            oracle_memory_step_mib: 1024,
            policies: vec![
                CostPolicy::HpaVpaTuned,
                CostPolicy::HpaVpaDefault,
                CostPolicy::Vpa,
                CostPolicy::Oracle,
            ],
            out: out.clone(),
            ..CostBenchOptions::default()
        };
        let r = run(&opts).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("cost.json")).unwrap()).unwrap();
        let names = ["hpa_vpa_tuned", "hpa_vpa_default", "vpa", "oracle"];
        let policies = json["policies"].as_object().unwrap();
        assert_eq!(policies.len(), 4);
        for p in names {
            for key in [
                "slo_attainment",
                "core_hours",
                "gib_hours",
                "disruptions",
                "cost",
            ] {
                assert!(policies[p].get(key).is_some(), "{p}.{key}");
            }
            assert_eq!(policies[p]["steps"], 3 * 30);
        }
        let apps = json["apps"].as_array().unwrap();
        assert_eq!(apps.len(), 3);
        for a in apps {
            assert_eq!(a["policies"].as_object().unwrap().len(), 4);
            assert!(a["hpa_target_tuned"].is_u64(), "{a}");
            assert_eq!(a["tuning_sweep"].as_array().unwrap().len(), 4);
        }
        assert!(json["policies"]["oracle"]["unreachable_steps"].is_u64());
        assert_eq!(json["comparisons"].as_array().unwrap().len(), 1);

        let fig = |a: &AppReport, p: &str| a.policies[p].clone();
        for a in &r.apps {
            // the tuned choice on the tuning window: the cheapest that met the objective, or
            // the best attainment; never worse than the default target there
            let chosen = a.hpa_target_tuned.unwrap();
            let at = |t: u32| {
                a.tuning_sweep
                    .iter()
                    .find(|p| p.target_percent == t)
                    .copied()
                    .unwrap()
            };
            let c = at(chosen);
            let default = at(70);
            if a.tuning_sweep
                .iter()
                .any(|p| p.attainment >= opts.objective)
            {
                assert!(c.attainment >= opts.objective);
                assert!(a
                    .tuning_sweep
                    .iter()
                    .filter(|p| p.attainment >= opts.objective)
                    .all(|p| p.cost >= c.cost));
                if default.attainment >= opts.objective {
                    assert!(c.cost <= default.cost);
                }
            } else {
                assert!(c.attainment >= default.attainment);
            }
            // the apps are independent: the tuned and default runs are the sweep's points on
            // the evaluation window
            let e = |t: u32| {
                a.evaluation_sweep
                    .iter()
                    .find(|p| p.target_percent == t)
                    .copied()
                    .unwrap()
            };
            assert_eq!(SweepPoint::of(chosen, &fig(a, "hpa_vpa_tuned")), e(chosen));
            assert_eq!(SweepPoint::of(70, &fig(a, "hpa_vpa_default")), e(70));
            // the VPA alone never changes the replica count
            assert_eq!(fig(a, "vpa").replica_changes, 0);
            // per app: core-hours of the policy sum to the policy's total
        }
        for p in names {
            let total: f64 = r.apps.iter().map(|a| a.policies[p].core_hours).sum();
            assert!((total - r.policies[p].figures.core_hours).abs() < 1e-9);
        }
        // The oracle meets the SLO on every step it decided for which a candidate meets it:
        // its unmet steps are the first step of each app (the initial allocation) and the
        // steps out of reach.
        // (The same steps as the oracle predicted: its clone of the target is the target.) So
        // no other policy meets the SLO on more steps than the oracle plus its out-of-reach ones.
        let oracle = &r.policies["oracle"];
        let unreachable = oracle.unreachable_steps.unwrap();
        assert_eq!(
            unreachable,
            r.apps
                .iter()
                .map(|a| a.oracle_unreachable_steps.unwrap())
                .sum::<u64>()
        );
        for a in &r.apps {
            let o = fig(a, "oracle");
            let out = a.oracle_unreachable_steps.unwrap();
            let unmet = o.steps - o.met_steps();
            assert!(
                unmet >= out && unmet <= out + 1,
                "{}: {unmet} unmet, {out} out of reach",
                a.name
            );
            for p in ["hpa_vpa_tuned", "hpa_vpa_default", "vpa"] {
                assert!(
                    o.met_steps() + out >= fig(a, p).met_steps(),
                    "{}: oracle {} (+{out} out of reach) < {p} {}",
                    a.name,
                    o.met_steps(),
                    fig(a, p).met_steps()
                );
            }
        }
        // one plot per class with an SLO app, and the overall one, each with every policy
        assert!(r.plots.contains(&"cost-pareto-all.svg".to_string()));
        for name in &r.plots {
            let svg = std::fs::read_to_string(out.join(name)).unwrap();
            assert!(svg.starts_with("<svg"));
            for p in names {
                assert!(svg.contains(&format!(">{p} (")), "{name}: {p}");
            }
            assert!(svg.contains("HPA target sweep"));
        }
    }

    /// The aware policy on the services: every step of the window counted from their `obs`.
    #[test]
    fn the_aware_policy_is_counted_from_the_services_observations() {
        let (out, _guard) = temp_out("aware");
        let opts = CostBenchOptions {
            apps: Some(2),
            seed: 12,
            episodes: 2,
            steps_per_episode: 10,
            policies: vec![CostPolicy::Aware, CostPolicy::HpaVpaDefault],
            pace_ms: 0,
            timeout: Duration::from_secs(120),
            out: out.clone(),
            ..CostBenchOptions::default()
        };
        let r = run(&opts).unwrap();
        let aware = &r.policies["aware"];
        let default = &r.policies["hpa_vpa_default"];
        assert_eq!(aware.figures.steps, 2 * 20);
        assert!(aware.figures.core_hours > 0.0 && aware.figures.gib_hours > 0.0);
        let l = aware.learning.as_ref().unwrap();
        // too short to train: the fallback decided every step it was asked
        assert_eq!(l.rl_decisions, 0);
        assert!(l.fallback_decisions >= 2 * 19, "{l:?}");
        // without hpa_vpa_tuned there is nothing to price the agent's steps against
        assert_eq!(l.agent_steps, None);
        assert_eq!(default.figures.steps, aware.figures.steps);
        assert_eq!(aware.apps_with_slo, default.apps_with_slo);
        let c = &r.comparisons;
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].policy.as_str(), c[0].against.as_str()),
            ("aware", "hpa_vpa_default")
        );
    }
}
