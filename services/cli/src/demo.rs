//! `aware demo`: the main job on the embedded bus — a simulated cluster of apps (generated ones
//! plus hand-written ones on real traces) managed end to end by the six services: every app
//! starts OFFLINE behind the HPA/VPA fallback while the trainer learns from its transitions,
//! goes ONLINE when the off-policy estimate allows, and SERVING when its rewards settle. Live
//! per-app progress and stage changes, then a summary (JSON) and plots of every app's reward,
//! SLO violations, requested resources and stage per episode.
//!
//! What a user decides on leads the table and the summary ([`summarize`]): the SLO attainment
//! (the share of control intervals meeting the app's SLO, against the objective) and the cost
//! (requested cores and GiB, their means and core-/GiB-hours, against HPA/VPA alone on the same
//! apps and traces); the paper's reward follows as a secondary column.
//!
//! The apps bootstrap from the meta-learner shipped in the binary
//! ([`aware_harness::default_meta`]) unless it is stale for this build or another one is asked
//! for ([`plan_meta`]).
//!
//! The simulation is lock-step and would run the whole demo in a fraction of a second, before
//! the trainer's first round; the demo paces it the bus's own way ([`PacedServices`]: a pause
//! after every simulated step, back-pressure from small buffers), as in production, where a
//! step lasts 10–30 s and training is never behind.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aware_bus_schemas::{Event, RawMetrics, Stage, Target};
use aware_metrics_collector::config::{CollectorConfig, SourceKind};
use aware_shared::bus::Bus;
use aware_shared::config::AppConfig;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use aware_harness::chart::{line_chart, Chart, Series};
use aware_harness::default_meta::{self, FingerprintInputs, Freshness, Manifest, MANIFEST_FILE};
use aware_harness::train_meta::TrainMetaOptions;
use aware_harness::{PacedServices, ServicesError};

/// The hand-written apps (two of them on excerpts of real traces), embedded so the demo runs from
/// any directory.
const APPS_YAML: &str = include_str!("../../../loadgen/examples/apps.yaml");
const TRACES: [(&str, &str); 2] = [
    (
        "worldcup98-rate-excerpt.csv",
        include_str!("../../../loadgen/testdata/worldcup98-rate-excerpt.csv"),
    ),
    (
        "azure-llm-2023-conv-excerpt.csv",
        include_str!("../../../loadgen/testdata/azure-llm-2023-conv-excerpt.csv"),
    ),
];

#[derive(Debug, Clone, clap::Args)]
pub struct DemoOptions {
    /// Generated apps, in addition to the hand-written ones.
    #[arg(long = "apps", value_name = "APPS", default_value_t = DemoOptions::default().generated_apps, help = "Generated apps in addition to the hand-written ones (two on real traces)")]
    pub generated_apps: usize,
    #[arg(long, default_value_t = DemoOptions::default().seed)]
    pub seed: u64,
    #[arg(long, default_value_t = DemoOptions::default().episodes)]
    pub episodes: u64,
    #[arg(long, default_value_t = DemoOptions::default().steps_per_episode)]
    pub steps_per_episode: u32,
    /// Print the progress table every this many steps.
    #[arg(long, default_value_t = DemoOptions::default().print_every)]
    pub print_every: u32,
    #[arg(
        long = "out",
        value_name = "OUT",
        default_value = "demo-out",
        help = "Output directory (the apps, the stores under data/, the summary and the plots)"
    )]
    pub out_dir: PathBuf,
    /// Wall-clock pause after every simulated step: the lock-step simulation would otherwise run
    /// the whole demo in a fraction of a second, before the trainer's first round.
    #[arg(long = "pace-ms", value_name = "PACE_MS", default_value = "20", value_parser = parse_millis, help = "Wall-clock pause after every simulated step, ms (time for the trainer)")]
    pub pace: Duration,
    /// The base-learner the apps bootstrap: meta-learned (`trainer.meta_dir`) or plain.
    #[arg(skip)]
    pub meta: DemoMeta,
    /// Settings of the services other than the demo's, `(section.key[.key…], JSON value)`.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = aware_harness::parse_setting, help = "A setting of the services other than the demo's, SECTION.KEY=VALUE with a JSON value (repeatable), e.g. --set lifecycle_monitor.probation_episodes=2")]
    pub settings: Vec<(String, serde_json::Value)>,
    /// Stop reading after this long even if episodes are missing (the summary covers what ran).
    #[arg(skip = DemoOptions::default().timeout)]
    pub timeout: Duration,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            generated_apps: 3,
            seed: 7,
            episodes: 30,
            steps_per_episode: 50,
            print_every: 250,
            out_dir: PathBuf::from("demo-out"),
            pace: Duration::from_millis(20),
            meta: DemoMeta::default(),
            settings: Vec::new(),
            timeout: Duration::from_secs(1800),
        }
    }
}

/// A duration given in milliseconds (`--pace-ms`).
fn parse_millis(s: &str) -> Result<Duration, std::num::ParseIntError> {
    s.parse().map(Duration::from_millis)
}

/// The command line of `aware demo`: [`DemoOptions`] and where its meta-learned base-learner
/// comes from.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    #[command(flatten)]
    pub options: DemoOptions,
    /// An `aware train-meta` output to bootstrap from (trainer.meta_dir). Without it the demo
    /// bootstraps from the default meta-learner shipped in this binary (`models/meta-default`
    /// in the repository, `aware train-meta`'s defaults). When that one does not match what
    /// this build would train (other options, app generator or simulator: the demo names what
    /// differs), or with another --meta-iterations, the demo meta-trains its own into OUT/meta
    /// the first time (minutes) and reuses it afterwards.
    #[arg(long, conflicts_with = "no_meta")]
    pub meta: Option<PathBuf>,
    /// The plain base-learner: every app learns from nothing (no meta-learning).
    #[arg(long)]
    pub no_meta: bool,
    /// Iterations of the meta-training (the shipped default's unless changed; another count
    /// meta-trains into OUT/meta).
    #[arg(long, default_value_t = default_meta::default_options().iterations)]
    pub meta_iterations: u64,
}

impl DemoArgs {
    pub fn options(self) -> DemoOptions {
        DemoOptions {
            meta: match (self.meta, self.no_meta) {
                (Some(dir), _) => DemoMeta::Dir(dir),
                (None, true) => DemoMeta::Off,
                (None, false) => DemoMeta::trained(self.meta_iterations),
            },
            ..self.options
        }
    }
}

/// Where under the output directory the demo's own meta-training goes.
const META_DIR: &str = "meta";
/// Where under the output directory the shipped default is written for the trainer.
const SHIPPED_DIR: &str = "meta-default";

/// Where the demo's meta-learned base-learner comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum DemoMeta {
    /// The plain base-learner, learning each app from nothing.
    Off,
    /// An `aware train-meta` output directory.
    Dir(PathBuf),
    /// A meta-training with these options (on a generated pool: never the demo's apps, another
    /// seed): the shipped default when it was trained with them by this build's code, else
    /// meta-trained by the demo into `<out_dir>/meta` once and reused while it matches.
    Train(Box<TrainMetaOptions>),
}

impl DemoMeta {
    /// `aware train-meta`'s defaults (those of the shipped default) with `iterations`.
    pub fn trained(iterations: u64) -> Self {
        DemoMeta::Train(Box::new(TrainMetaOptions {
            iterations,
            ..default_meta::default_options()
        }))
    }
}

impl Default for DemoMeta {
    fn default() -> Self {
        DemoMeta::trained(default_meta::default_options().iterations)
    }
}

/// What the demo does for its meta-learner, decided before anything is written or trained.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaPlan {
    /// No meta-learning.
    Off,
    /// A user's `--meta` directory.
    Dir(PathBuf),
    /// The shipped default, written into this directory.
    Shipped {
        dir: PathBuf,
        manifest: Box<Manifest>,
    },
    /// An earlier demo's meta-training in this directory, trained by this build's code with
    /// these options.
    Reuse {
        dir: PathBuf,
        manifest: Box<Manifest>,
    },
    /// Meta-train with these options (`out` set) because `why`.
    Train {
        opts: Box<TrainMetaOptions>,
        why: Vec<String>,
        /// Whether the shipped default was trained with these options (so it is stale for this
        /// build, not merely another training than the one asked for).
        shipped_stale: bool,
    },
}

impl MetaPlan {
    /// The `trainer.meta_dir` this gives.
    pub fn dir(&self) -> Option<PathBuf> {
        match self {
            MetaPlan::Off => None,
            MetaPlan::Dir(d)
            | MetaPlan::Shipped { dir: d, .. }
            | MetaPlan::Reuse { dir: d, .. } => Some(d.clone()),
            MetaPlan::Train { opts, .. } => Some(opts.out.clone()),
        }
    }

    /// `off`, `dir`, `shipped`, `reused` or `trained` (the report's `meta_source`).
    pub fn source(&self) -> &'static str {
        match self {
            MetaPlan::Off => "off",
            MetaPlan::Dir(_) => "dir",
            MetaPlan::Shipped { .. } => "shipped",
            MetaPlan::Reuse { .. } => "reused",
            MetaPlan::Train { .. } => "trained",
        }
    }
}

/// The manifest of an earlier demo's meta-training in `dir`, when it is current for `now`.
fn current_training(dir: &Path, now: &FingerprintInputs) -> Option<Manifest> {
    let m: Manifest = aware_harness::train_meta::read_json(&dir.join(MANIFEST_FILE)).ok()?;
    let base = std::fs::read(dir.join("base.ckpt")).ok()?;
    let meta = std::fs::read(dir.join("meta.ckpt")).ok()?;
    (default_meta::check(&m, &base, &meta, now) == Freshness::Current).then_some(m)
}

/// Decides where the meta-learner comes from: `shipped` is the embedded default's manifest
/// (when it parses) and its freshness against `opts` ([`default_meta::shipped_freshness`]).
pub fn plan_meta(
    meta: &DemoMeta,
    out_dir: &Path,
    shipped: (Option<Manifest>, Freshness),
) -> Result<MetaPlan, DemoError> {
    let o = match meta {
        DemoMeta::Off => return Ok(MetaPlan::Off),
        DemoMeta::Dir(d) => {
            // The trainer would log the failure and go on without meta-learning.
            return match ["base.ckpt", "meta.ckpt"]
                .iter()
                .find(|f| !d.join(f).is_file())
            {
                Some(f) => Err(DemoError::Config(format!(
                    "--meta {}: no {f} (expected an `aware train-meta` output)",
                    d.display()
                ))),
                None => Ok(MetaPlan::Dir(d.clone())),
            };
        }
        DemoMeta::Train(o) => o,
    };
    let (manifest, freshness) = shipped;
    let why = match (manifest, freshness) {
        (Some(m), Freshness::Current) => {
            return Ok(MetaPlan::Shipped {
                dir: out_dir.join(SHIPPED_DIR),
                manifest: Box::new(m),
            })
        }
        (_, Freshness::Stale(why)) => why,
        (None, Freshness::Current) => vec!["the shipped manifest (unreadable)".into()],
    };
    let opts = TrainMetaOptions {
        out: out_dir.join(META_DIR),
        ..(**o).clone()
    };
    let now = FingerprintInputs::of(&opts).map_err(|e| DemoError::Config(e.to_string()))?;
    if let Some(manifest) = current_training(&opts.out, &now) {
        return Ok(MetaPlan::Reuse {
            dir: opts.out,
            manifest: Box::new(manifest),
        });
    }
    // The options are the shipped default's: then it is the build that moved on.
    let shipped_stale = !why.iter().any(|w| w.starts_with("the options"));
    Ok(MetaPlan::Train {
        opts: Box::new(opts),
        why,
        shipped_stale,
    })
}

/// Carries out `plan`: writes the shipped default or meta-trains; the `trainer.meta_dir`.
async fn carry_out(
    plan: &MetaPlan,
    out: &mut (impl Write + Send),
) -> Result<Option<PathBuf>, DemoError> {
    let held_out = |m: &Manifest| {
        format!(
            "held-out apps: {:.3} per step against the fallback's {:.3}",
            m.held_out_agent_mean, m.held_out_fallback_mean
        )
    };
    match plan {
        MetaPlan::Off | MetaPlan::Dir(_) => {}
        MetaPlan::Shipped { dir, manifest } => {
            default_meta::write_shipped(dir).map_err(|e| DemoError::Config(e.to_string()))?;
            let _ = writeln!(
                out,
                "meta-learner: the shipped default ({}, `{}`; {}); --meta-iterations N trains another, --no-meta learns without one",
                default_meta::DIR_IN_REPO,
                manifest.command,
                held_out(manifest)
            );
        }
        MetaPlan::Reuse { dir, manifest } => {
            let _ = writeln!(
                out,
                "meta-learner: reusing {} ({})",
                dir.display(),
                held_out(manifest)
            );
        }
        MetaPlan::Train {
            opts,
            why,
            shipped_stale,
        } => {
            if *shipped_stale {
                let _ = writeln!(
                    out,
                    "warning: the shipped meta-learner ({}) is not what this build trains: {} differ; the demo trains its own (regenerate the default with `aware train-meta --write-default`)",
                    default_meta::DIR_IN_REPO,
                    why.join(", ")
                );
            }
            let dir = opts.out.clone();
            let other = if *shipped_stale {
                String::new()
            } else {
                format!(" (not the shipped default: {})", why.join(", "))
            };
            let _ = writeln!(
                out,
                "meta-learner: training it once into {}{other} ({} apps of another seed, {} iterations, {} restarts; progress on stderr); later demos reuse it, --no-meta skips it",
                dir.display(),
                opts.apps,
                opts.iterations,
                opts.restarts
            );
            let _ = out.flush();
            let o = (**opts).clone();
            let manifest = tokio::task::spawn_blocking(move || default_meta::train(&o))
                .await
                .map_err(|e| DemoError::Config(format!("meta-training stopped: {e}")))?
                .map_err(|e| DemoError::Config(format!("meta-training: {e}")))?;
            let _ = writeln!(
                out,
                "meta-learner: trained in {:.0} s; {}\n",
                manifest.train_seconds,
                held_out(&manifest)
            );
        }
    }
    Ok(plan.dir())
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("demo files in {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Service(#[from] aware_shared::service::ServiceError),
    #[error(transparent)]
    Bus(#[from] aware_shared::bus::BusError),
    #[error(transparent)]
    Run(#[from] ServicesError),
    #[error("{0}")]
    Config(String),
}

/// One recorded episode of an app (from its `episode` summary, and the demo's own count of the
/// resources requested during it).
#[derive(Debug, Clone, Serialize)]
pub struct EpisodeRow {
    pub episode: u64,
    pub stage: Stage,
    pub mean_reward: f64,
    pub slo_violations: u32,
    pub steps: u32,
    pub rl_steps: u32,
    pub cpu_util_mean: f64,
    pub memory_util_mean: f64,
    /// Mean requested cores and GiB over the episode's counted intervals (none counted: absent).
    pub requested_cores_mean: Option<f64>,
    pub requested_gib_mean: Option<f64>,
}

/// A lifecycle change of an app.
#[derive(Debug, Clone, Serialize)]
pub struct StageChange {
    /// The episode in which it was decided.
    pub episode: u64,
    pub from: Option<Stage>,
    pub to: Stage,
    pub reason: String,
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The resources an interval's pods request: (cores, GiB), summed over the pods running (created
/// and not yet deleted: each holds its request, ready or not).
///
/// The per-pod allocation the collector reports is the request (`RawMetrics::cpu_limit_cores`
/// keeps its wire name), what the user pays for; the limits follow the target's limits policy.
pub fn requested(m: &RawMetrics) -> (f64, f64) {
    let pods = f64::from(m.replicas);
    (pods * m.cpu_limit_cores, pods * m.memory_limit_bytes / GIB)
}

/// Per-app state shown live and summarised.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AppProgress {
    pub stage: Option<Stage>,
    pub step: u64,
    pub replicas: u32,
    pub cpu_millicores: u32,
    pub memory_mib: u64,
    /// Requested now ([`requested`]).
    pub requested_cores: f64,
    pub requested_gib: f64,
    pub p99_ms: Option<f64>,
    pub slo_p99_ms: Option<f64>,
    pub slo_throughput_rps: Option<f64>,
    pub last_reward: Option<f64>,
    /// Sums over the counted intervals ([`AppProgress::count_interval`]), `observations` of them.
    pub reward_sum: f64,
    pub rewards: u64,
    pub slo_violations: u64,
    pub cpu_util_sum: f64,
    pub memory_util_sum: f64,
    pub requested_cores_sum: f64,
    pub requested_gib_sum: f64,
    pub observations: u64,
    pub actions_fallback: u64,
    pub actions_rl: u64,
    pub episodes_recorded: u64,
    pub models: u64,
    /// Workload embeddings the trainer published (meta-learning only).
    pub embeddings: u64,
    pub stage_changes: Vec<StageChange>,
    pub episodes: Vec<EpisodeRow>,
    /// Per episode not yet summarised: requested cores and GiB summed, intervals.
    #[serde(skip)]
    episode_cost: BTreeMap<u64, (f64, f64, u64)>,
}

impl AppProgress {
    fn mean_reward(&self) -> f64 {
        if self.rewards == 0 {
            0.0
        } else {
            self.reward_sum / self.rewards as f64
        }
    }

    /// Whether the app has an SLO to meet (a p99 latency or a throughput).
    pub fn has_slo(&self) -> bool {
        self.slo_p99_ms.is_some() || self.slo_throughput_rps.is_some()
    }

    /// The share of counted intervals that met the SLO (none without an SLO or an interval).
    pub fn slo_attainment(&self) -> Option<f64> {
        (self.has_slo() && self.observations > 0)
            .then(|| 1.0 - self.slo_violations as f64 / self.observations as f64)
    }

    /// Folds in one control interval of `episode` that counts: complete (it has a reward) and
    /// within the episodes summarised, so that the AWARE run and the HPA/VPA run count the same
    /// intervals.
    pub fn count_interval(
        &mut self,
        episode: u64,
        m: &RawMetrics,
        slo_violation: bool,
        reward: f64,
    ) {
        let (cores, gib) = requested(m);
        self.reward_sum += reward;
        self.rewards += 1;
        self.observations += 1;
        self.slo_violations += u64::from(slo_violation);
        self.cpu_util_sum += m.cpu_util;
        self.memory_util_sum += m.memory_util;
        self.requested_cores_sum += cores;
        self.requested_gib_sum += gib;
        let e = self.episode_cost.entry(episode).or_default();
        e.0 += cores;
        e.1 += gib;
        e.2 += 1;
    }

    /// The mean requested cores and GiB of `episode`'s counted intervals, forgotten after.
    fn take_episode_cost(&mut self, episode: u64) -> (Option<f64>, Option<f64>) {
        match self.episode_cost.remove(&episode) {
            Some((c, g, n)) if n > 0 => (Some(c / n as f64), Some(g / n as f64)),
            _ => (None, None),
        }
    }

    /// The stages the app went through, in order ("offline → online"; the changes are
    /// recorded without repeats).
    pub fn stage_path(&self) -> String {
        if self.stage_changes.is_empty() {
            return "-".into();
        }
        let path: Vec<&str> = self.stage_changes.iter().map(|c| c.to.as_str()).collect();
        path.join(" → ")
    }

    /// Share of the decisions the RL policy took.
    fn rl_share(&self) -> f64 {
        self.actions_rl as f64 / (self.actions_fallback + self.actions_rl).max(1) as f64
    }
}

/// The fraction of control intervals that must meet an app's SLO: its error budget is the rest.
/// The SLO has no configurable objective yet (issue 40 item 1 adds `slo.objective`); this is the
/// default the issue gives it.
pub const DEFAULT_SLO_OBJECTIVE: f64 = 0.99;

/// One run (AWARE, or HPA/VPA alone) of one app or of all apps, as the summary shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunFigures {
    /// Counted control intervals (summed over apps for all apps).
    pub intervals: u64,
    /// Share of intervals meeting the SLO (all apps: of the app-intervals of apps with an SLO);
    /// none without an SLO.
    pub slo_attainment: Option<f64>,
    /// Whether the attainment reaches the objective (none without an SLO; none for all apps).
    pub meets_objective: Option<bool>,
    /// Mean requested cores and GiB (all apps: the sum of the apps' means, the cluster's).
    pub requested_cores_mean: f64,
    pub requested_gib_mean: f64,
    /// Requested cores and GiB integrated over the intervals.
    pub core_hours: f64,
    pub gib_hours: f64,
    /// The paper's reward per step (all apps: per app-step).
    pub mean_reward: f64,
}

/// AWARE against HPA/VPA alone for one app or for all apps; changes are relative, (AWARE −
/// HPA/VPA) / HPA/VPA, none without the HPA/VPA run or on a zero base.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// The app's name, or "all apps".
    pub app: String,
    /// The app's SLO in words ("p99 ≤ 200 ms", "≥ 50 rps", "-").
    pub slo: String,
    pub aware: RunFigures,
    pub hpa_vpa: Option<RunFigures>,
    pub core_hours_change: Option<f64>,
    pub gib_hours_change: Option<f64>,
    pub reward_change: Option<f64>,
    /// Share of AWARE's decisions taken by the RL policy.
    pub rl_share: f64,
    pub stages: String,
}

/// The demo's summary: per app and over all apps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DemoSummary {
    /// [`DEFAULT_SLO_OBJECTIVE`].
    pub slo_objective: f64,
    /// Simulated seconds per control interval.
    pub step_seconds: f64,
    pub apps: Vec<Comparison>,
    pub all: Comparison,
    /// Apps with an SLO, and how many of them meet the objective in each run.
    pub apps_with_slo: usize,
    pub apps_meeting_objective_aware: usize,
    pub apps_meeting_objective_hpa_vpa: Option<usize>,
}

fn change(new: f64, base: f64) -> Option<f64> {
    (base.abs() > 1e-12).then(|| (new - base) / base.abs())
}

fn run_figures(a: &AppProgress, step_seconds: f64, objective: f64) -> RunFigures {
    let n = a.observations.max(1) as f64;
    let attainment = a.slo_attainment();
    RunFigures {
        intervals: a.observations,
        slo_attainment: attainment,
        meets_objective: attainment.map(|x| x >= objective),
        requested_cores_mean: a.requested_cores_sum / n,
        requested_gib_mean: a.requested_gib_sum / n,
        core_hours: a.requested_cores_sum * step_seconds / 3600.0,
        gib_hours: a.requested_gib_sum * step_seconds / 3600.0,
        mean_reward: a.mean_reward(),
    }
}

/// Over all apps: attainment over the app-intervals of apps with an SLO, the cluster's mean
/// requests (the apps' means summed), hours summed, reward per app-step.
fn all_figures<'a>(
    apps: impl Iterator<Item = &'a AppProgress> + Clone,
    step_seconds: f64,
) -> RunFigures {
    let slo_apps = apps.clone().filter(|a| a.has_slo());
    let (slo_n, slo_viol) = slo_apps.fold((0u64, 0u64), |(n, v), a| {
        (n + a.observations, v + a.slo_violations)
    });
    let intervals: u64 = apps.clone().map(|a| a.observations).sum();
    let rewards: u64 = apps.clone().map(|a| a.rewards).sum();
    let per_app = |f: fn(&AppProgress) -> f64| -> f64 {
        apps.clone()
            .map(|a| f(a) / a.observations.max(1) as f64)
            .sum()
    };
    let cores_sum: f64 = apps.clone().map(|a| a.requested_cores_sum).sum();
    let gib_sum: f64 = apps.clone().map(|a| a.requested_gib_sum).sum();
    RunFigures {
        intervals,
        slo_attainment: (slo_n > 0).then(|| 1.0 - slo_viol as f64 / slo_n as f64),
        meets_objective: None,
        requested_cores_mean: per_app(|a| a.requested_cores_sum),
        requested_gib_mean: per_app(|a| a.requested_gib_sum),
        core_hours: cores_sum * step_seconds / 3600.0,
        gib_hours: gib_sum * step_seconds / 3600.0,
        mean_reward: if rewards == 0 {
            0.0
        } else {
            apps.map(|a| a.reward_sum).sum::<f64>() / rewards as f64
        },
    }
}

fn slo_words(a: &AppProgress) -> String {
    match (a.slo_p99_ms, a.slo_throughput_rps) {
        (Some(l), Some(r)) => format!("p99 ≤ {l:.0} ms, ≥ {r:.0} rps"),
        (Some(l), None) => format!("p99 ≤ {l:.0} ms"),
        (None, Some(r)) => format!("≥ {r:.0} rps"),
        (None, None) => "-".into(),
    }
}

fn compare(
    app: String,
    slo: String,
    aware: RunFigures,
    hpa_vpa: Option<RunFigures>,
    rl_share: f64,
    stages: String,
) -> Comparison {
    let ch = |f: fn(&RunFigures) -> f64| hpa_vpa.as_ref().and_then(|b| change(f(&aware), f(b)));
    Comparison {
        core_hours_change: ch(|r| r.core_hours),
        gib_hours_change: ch(|r| r.gib_hours),
        reward_change: ch(|r| r.mean_reward),
        app,
        slo,
        aware,
        hpa_vpa,
        rl_share,
        stages,
    }
}

/// The summary of a run against the HPA/VPA baseline (when it ran to the end): per app, SLO
/// attainment against `objective` and the cost in requested resources, then the reward.
pub fn summarize(
    progress: &BTreeMap<Target, AppProgress>,
    baseline: Option<&BTreeMap<Target, AppProgress>>,
    step_seconds: f64,
    objective: f64,
) -> DemoSummary {
    let apps: Vec<Comparison> = progress
        .iter()
        .map(|(t, a)| {
            let b = baseline.and_then(|m| m.get(t));
            compare(
                t.name.clone(),
                slo_words(a),
                run_figures(a, step_seconds, objective),
                b.map(|b| run_figures(b, step_seconds, objective)),
                a.rl_share(),
                a.stage_path(),
            )
        })
        .collect();
    let all_rl = {
        let (rl, all) = progress.values().fold((0u64, 0u64), |(r, n), a| {
            (r + a.actions_rl, n + a.actions_rl + a.actions_fallback)
        });
        rl as f64 / all.max(1) as f64
    };
    let all = compare(
        "all apps".into(),
        "-".into(),
        all_figures(progress.values(), step_seconds),
        baseline.map(|m| all_figures(m.values(), step_seconds)),
        all_rl,
        String::new(),
    );
    let meeting = |pick: fn(&Comparison) -> Option<&RunFigures>| {
        apps.iter()
            .filter(|c| pick(c).and_then(|r| r.meets_objective) == Some(true))
            .count()
    };
    DemoSummary {
        slo_objective: objective,
        step_seconds,
        apps_with_slo: progress.values().filter(|a| a.has_slo()).count(),
        apps_meeting_objective_aware: meeting(|c| Some(&c.aware)),
        apps_meeting_objective_hpa_vpa: baseline.map(|_| meeting(|c| c.hpa_vpa.as_ref())),
        apps,
        all,
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DemoError + '_ {
    move |source| DemoError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes the hand-written apps and their traces under `dir` and empties `dir/data` (the
/// trajectory and model stores: every demo starts from nothing). Returns the app file.
fn write_demo_files(dir: &Path) -> Result<PathBuf, DemoError> {
    let apps_dir = dir.join("apps");
    let data_dir = dir.join("testdata");
    let stores = dir.join("data");
    std::fs::create_dir_all(&apps_dir).map_err(io_err(&apps_dir))?;
    std::fs::create_dir_all(&data_dir).map_err(io_err(&data_dir))?;
    match std::fs::remove_dir_all(&stores) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&stores)(e)),
    }
    std::fs::create_dir_all(&stores).map_err(io_err(&stores))?;
    for (name, text) in TRACES {
        let p = data_dir.join(name);
        std::fs::write(&p, text).map_err(io_err(&p))?;
    }
    let p = apps_dir.join("apps.yaml");
    std::fs::write(&p, APPS_YAML).map_err(io_err(&p))?;
    Ok(p)
}

/// The configuration the demo runs the services with: the simulated cluster, the stores under
/// `out_dir/data`, and a trainer that polls often enough for a paced demo (every setting not
/// named here is the services' default, so what the demo shows is what they do).
pub fn demo_config(
    opts: &DemoOptions,
    app_file: PathBuf,
    meta: Option<&Path>,
) -> Result<AppConfig, DemoError> {
    let mut collector = CollectorConfig {
        source: SourceKind::Simulator,
        ..CollectorConfig::default()
    };
    let sim = &mut collector.simulator;
    sim.apps = opts.generated_apps;
    sim.seed = opts.seed;
    sim.app_files = vec![app_file];
    // One episode beyond the last one summarised: an episode's summary follows its last step.
    sim.max_steps = (opts.episodes + 1) * u64::from(opts.steps_per_episode) + 1;
    // Paced: a decision may wait for the trainer's round on the same cores.
    sim.step_timeout_ms = 60_000;
    Ok(aware_harness::paced_sim_config(
        &collector,
        opts.steps_per_episode,
        &opts.out_dir.join("data"),
        meta,
        &opts.settings,
    )?)
}

/// The live table: SLO attainment so far and the resources requested now lead; the reward (the
/// paper's, last step) and the RL policy's share of the decisions follow.
fn print_table(out: &mut impl Write, apps: &BTreeMap<Target, AppProgress>) {
    let _ = writeln!(
        out,
        "{:<22} {:<9} {:>6} {:>8} {:>6} {:>6} {:>17} {:>4} {:>6} {:>7} {:>7} {:>5}",
        "app",
        "stage",
        "step",
        "SLO met",
        "cores",
        "GiB",
        "p99 / SLO (ms)",
        "rep",
        "cpu(m)",
        "mem(Mi)",
        "reward",
        "rl%"
    );
    for (t, a) in apps {
        let slo = match (a.slo_p99_ms, a.slo_throughput_rps) {
            (Some(l), _) => format!("{l:.0}"),
            (None, Some(r)) => format!("≥{r:.0}rps"),
            (None, None) => "-".into(),
        };
        let p99 = a.p99_ms.map_or("-".to_string(), |p| format!("{p:.0}"));
        let met = a
            .slo_attainment()
            .map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x));
        let _ = writeln!(
            out,
            "{:<22} {:<9} {:>6} {:>8} {:>6.2} {:>6.2} {:>17} {:>4} {:>6} {:>7} {:>7.3} {:>4.0}%",
            t.name,
            a.stage.map_or("-", Stage::as_str),
            a.step,
            met,
            a.requested_cores,
            a.requested_gib,
            format!("{p99} / {slo}"),
            a.replicas,
            a.cpu_millicores,
            a.memory_mib,
            a.last_reward.unwrap_or(0.0),
            100.0 * a.rl_share(),
        );
    }
    let _ = writeln!(out);
}

/// The demo's report: per app, and the plots written.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub apps: BTreeMap<String, AppProgress>,
    /// The same apps, traces and services with HPA/VPA throughout (absent when interrupted).
    pub baseline: Option<BTreeMap<String, AppProgress>>,
    pub episodes: u64,
    pub steps_per_episode: u32,
    /// Whether every app recorded every episode before the timeout or an interrupt.
    pub complete: bool,
    /// The meta-learner the apps bootstrapped from (`trainer.meta_dir`); none: the plain
    /// base-learner.
    pub meta_dir: Option<String>,
    /// Where it came from: `shipped` (the default in the binary), `reused` (an earlier demo's
    /// meta-training), `trained` (this demo's), `dir` (`--meta`) or `off`.
    pub meta_source: String,
    /// SLO attainment and cost against HPA/VPA, then the reward: what the summary printed.
    pub summary: DemoSummary,
    pub wall_seconds: f64,
    pub plots: Vec<String>,
}

/// Runs the demo to the end and returns its report (also written to `out_dir`).
pub async fn run(
    opts: &DemoOptions,
    out: &mut (impl Write + Send),
) -> Result<DemoReport, DemoError> {
    let app_file = write_demo_files(&opts.out_dir)?;
    let shipped = match &opts.meta {
        DemoMeta::Train(o) => default_meta::shipped_freshness(o)
            .map_err(|e| DemoError::Config(format!("the shipped meta-learner: {e}")))?,
        DemoMeta::Off | DemoMeta::Dir(_) => (None, Freshness::Current),
    };
    let plan = plan_meta(&opts.meta, &opts.out_dir, shipped)?;
    let mut cfg = demo_config(opts, app_file, plan.dir().as_deref())?;
    let collector = CollectorConfig::read(&cfg).map_err(|e| DemoError::Config(e.to_string()))?;
    let apps = aware_metrics_collector::simulator::build_apps(&collector.simulator)?;
    cfg.targets = aware_metrics_collector::simulator::target_specs(&apps);
    // What `aware run` and `aware config` refuse, the demo refuses too, naming the key, before
    // it meta-trains (a service started on it would stop, or the demo wait for episodes that
    // never come).
    cfg.validate()
        .map_err(|e| DemoError::Config(e.to_string()))?;
    crate::config_check::effective(&cfg).map_err(|e| DemoError::Config(e.to_string()))?;
    let meta = carry_out(&plan, out).await?;
    let mut progress: BTreeMap<Target, AppProgress> = apps
        .iter()
        .map(|a| {
            (
                Target::new(a.namespace.clone(), a.name.clone()),
                AppProgress {
                    slo_p99_ms: a.slo.latency_p99_ms,
                    slo_throughput_rps: a.slo.throughput_rps,
                    ..Default::default()
                },
            )
        })
        .collect();
    let spe = u64::from(opts.steps_per_episode.max(1));
    let want = usize::try_from(opts.episodes).unwrap_or(usize::MAX);
    let _ = writeln!(
        out,
        "aware demo: {} apps on a simulated cluster, {} episodes × {} steps, embedded bus, {} ms per step{}",
        progress.len(),
        opts.episodes,
        spe,
        opts.pace.as_millis(),
        if meta.is_some() {
            ", meta-learned base-learner"
        } else {
            ", plain base-learner"
        }
    );
    let _ = writeln!(
        out,
        "every app starts OFFLINE behind HPA/VPA; the trainer learns from its transitions; ONLINE when the estimate allows, SERVING when rewards settle"
    );
    let _ = writeln!(
        out,
        "SLO met: share of the {} s control intervals so far meeting the app's SLO (objective {:.0}%); cores, GiB: requested now over the app's pods; reward: the paper's, last step\n",
        collector.simulator.step_seconds,
        100.0 * DEFAULT_SLO_OBJECTIVE
    );
    let interrupted = CancellationToken::new();
    aware_shared::service::cancel_on_signal(interrupted.clone());
    let started = std::time::Instant::now();
    let template = progress.clone();
    let live = Watch {
        pace: opts.pace,
        timeout: opts.timeout,
        spe,
        want,
        print_every: Some(u64::from(opts.print_every.max(1))),
    };
    let complete = watch(cfg.clone(), &mut progress, &live, &interrupted, out).await?;
    let wall_seconds = started.elapsed().as_secs_f64();
    print_table(out, &progress);
    if !complete {
        let _ = writeln!(
            out,
            "stopped before every app recorded {} episodes (interrupted or past {:?})",
            opts.episodes, opts.timeout
        );
    }
    // The baseline: the same apps, traces and services with HPA/VPA throughout (no target is
    // ever promoted), unpaced: nothing waits for training.
    let mut baseline = template;
    let baseline_complete = if interrupted.is_cancelled() {
        false
    } else {
        let _ = writeln!(
            out,
            "HPA/VPA alone on the same apps and traces, for comparison…"
        );
        let mut base_cfg = cfg;
        base_cfg.lifecycle.t_online = NEVER;
        aware_harness::set_stores(&mut base_cfg, &opts.out_dir.join("data").join("hpa-vpa"));
        let quiet = Watch {
            pace: Duration::ZERO,
            print_every: None,
            ..live
        };
        watch(base_cfg, &mut baseline, &quiet, &interrupted, out).await?
    };
    let summary = summarize(
        &progress,
        baseline_complete.then_some(&baseline),
        collector.simulator.step_seconds,
        DEFAULT_SLO_OBJECTIVE,
    );
    print_summary(out, &summary);
    let plots = write_plots(
        &opts.out_dir,
        &progress,
        baseline_complete.then_some(&baseline),
    )?;
    let key = |m: BTreeMap<Target, AppProgress>| -> BTreeMap<String, AppProgress> {
        m.into_iter().map(|(t, a)| (t.key(), a)).collect()
    };
    let report = DemoReport {
        apps: key(progress),
        baseline: baseline_complete.then(|| key(baseline)),
        episodes: opts.episodes,
        steps_per_episode: opts.steps_per_episode,
        complete,
        meta_dir: meta.as_ref().map(|d| d.display().to_string()),
        meta_source: plan.source().into(),
        summary,
        wall_seconds,
        plots,
    };
    let path = opts.out_dir.join("demo-summary.json");
    let text = serde_json::to_string_pretty(&report).unwrap_or_default() + "\n";
    std::fs::write(&path, text).map_err(io_err(&path))?;
    let _ = writeln!(out, "wrote {}", path.display());
    for p in &report.plots {
        let _ = writeln!(out, "wrote {p}");
    }
    Ok(report)
}

/// `lifecycle.t_online` of the HPA/VPA baseline: never reached.
const NEVER: f64 = 1e9;

/// How [`watch`] runs the services and reads their events.
#[derive(Debug, Clone, Copy)]
struct Watch {
    pace: Duration,
    timeout: Duration,
    spe: u64,
    /// Episodes per app to record.
    want: usize,
    /// Print the live table every this many steps, and stage changes (`None`: quiet).
    print_every: Option<u64>,
}

/// Runs the six services with `cfg` until every app in `progress` recorded `w.want` episodes
/// (or an interrupt, or the timeout), folding their events into `progress`; whether every
/// episode was recorded.
async fn watch(
    cfg: AppConfig,
    progress: &mut BTreeMap<Target, AppProgress>,
    w: &Watch,
    interrupted: &CancellationToken,
    out: &mut (impl Write + Send),
) -> Result<bool, DemoError> {
    // Small buffers: the pacer's back-pressure reaches the collector within a few steps.
    let bus = Bus::in_process((4 * progress.len()).max(64));
    let mut services = PacedServices::start(bus, cfg, progress.len(), w.pace, w.timeout).await?;
    let mut last_printed = u64::MAX;
    let done = |p: &BTreeMap<Target, AppProgress>| p.values().all(|a| a.episodes.len() >= w.want);
    let counted_steps = (w.want as u64).saturating_mul(w.spe);
    while !done(progress) {
        let ev = tokio::select! {
            _ = interrupted.cancelled() => break,
            ev = services.next_event() => match ev { Some(ev) => ev, None => break },
        };
        let Some(a) = progress.get_mut(ev.target()) else {
            continue;
        };
        match ev {
            Event::Obs(o) => {
                let g = o.episode * w.spe + u64::from(o.step);
                a.step = g;
                a.replicas = o.metrics.replicas_in_force();
                a.cpu_millicores = (o.metrics.cpu_limit_cores * 1000.0).round() as u32;
                a.memory_mib = (o.metrics.memory_limit_bytes / 1_048_576.0).round() as u64;
                (a.requested_cores, a.requested_gib) = requested(&o.metrics);
                a.p99_ms = o.metrics.latency_p99_ms;
                if let Some(r) = o.reward {
                    a.last_reward = Some(r);
                    // Only the episodes summarised count: the run and its baseline stop reading at
                    // different steps past them.
                    if g < counted_steps {
                        a.count_interval(o.episode, &o.metrics, o.slo_violation, r);
                    }
                }
                let all_at = progress.values().map(|p| p.step).min().unwrap_or(0);
                if let Some(every) = w.print_every {
                    if all_at > 0 && all_at % every == 0 && all_at != last_printed {
                        last_printed = all_at;
                        print_table(out, progress);
                    }
                }
            }
            Event::Action(act) => match act.source {
                aware_bus_schemas::DecisionSource::Fallback => a.actions_fallback += 1,
                aware_bus_schemas::DecisionSource::Rl => a.actions_rl += 1,
            },
            Event::Lifecycle(l) => {
                if w.print_every.is_some() && l.previous.is_some() && l.previous != Some(l.stage) {
                    let _ = writeln!(
                        out,
                        "episode {:>3}  {:<22} {} → {}: {}",
                        l.episode,
                        l.target.name,
                        l.previous.map_or("-", Stage::as_str),
                        l.stage.as_str(),
                        l.reason
                    );
                }
                if a.stage_changes.last().map(|c| c.to) != Some(l.stage) {
                    a.stage_changes.push(StageChange {
                        episode: l.episode,
                        from: l.previous,
                        to: l.stage,
                        reason: l.reason,
                    });
                }
                a.stage = Some(l.stage);
            }
            Event::Episode(e) => {
                a.episodes_recorded += 1;
                let (cores, gib) = a.take_episode_cost(e.episode);
                if a.episodes.len() < w.want {
                    a.episodes.push(EpisodeRow {
                        episode: e.episode,
                        stage: e.stage,
                        mean_reward: e.mean_reward,
                        slo_violations: e.slo_violations,
                        steps: e.steps,
                        rl_steps: e.rl_steps,
                        cpu_util_mean: e.cpu_util_mean,
                        memory_util_mean: e.memory_util_mean,
                        requested_cores_mean: cores,
                        requested_gib_mean: gib,
                    });
                }
            }
            Event::Model(_) => a.models += 1,
            Event::Embedding(_) => a.embeddings += 1,
            _ => {}
        }
    }
    let complete = done(progress);
    services.stop().await?;
    Ok(complete)
}

/// The summary: per app and over all apps, SLO attainment against the objective and the
/// requested resources first, then the reward, AWARE against HPA/VPA alone.
fn print_summary(out: &mut impl Write, s: &DemoSummary) {
    let intervals = s.apps.iter().map(|c| c.aware.intervals).max().unwrap_or(0);
    let hours = intervals as f64 * s.step_seconds / 3600.0;
    let _ = writeln!(
        out,
        "summary after {intervals} control intervals per app ({} s each, {hours:.1} h simulated), AWARE against HPA/VPA alone on the same apps and traces:",
        s.step_seconds
    );
    let _ = writeln!(
        out,
        "SLO attainment: share of the intervals meeting the app's SLO, objective {:.0}% (the default; \"meets\": which runs reach it); cost: requested cores and GiB, mean over the run, change in core-/GiB-hours; reward: the paper's",
        100.0 * s.slo_objective
    );
    let _ = writeln!(
        out,
        "{:<22} {:^24} {:^23} {:^23} {:^23} {:>5}",
        "", "SLO attainment", "cores (mean)", "GiB (mean)", "reward per step", "RL"
    );
    let _ = writeln!(
        out,
        "{:<22} {:>7} {:>7} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>5}  stages",
        "app",
        "AWARE",
        "HPA/VPA",
        "meets",
        "AWARE",
        "HPA/VPA",
        "change",
        "AWARE",
        "HPA/VPA",
        "change",
        "AWARE",
        "HPA/VPA",
        "change",
        "share"
    );
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v));
    let signed = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:+.1}%", 100.0 * v));
    let num =
        |x: Option<f64>, digits: usize| x.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    for c in s.apps.iter().chain(std::iter::once(&s.all)) {
        let b = c.hpa_vpa.as_ref();
        let meets = match (c.aware.meets_objective, b.and_then(|b| b.meets_objective)) {
            (Some(true), Some(true)) => "both",
            (Some(true), Some(false)) => "AWARE",
            (Some(false), Some(true)) => "HPA/VPA",
            (Some(false), Some(false)) => "neither",
            (Some(true), None) => "AWARE",
            _ => "-",
        };
        let _ = writeln!(
            out,
            "{:<22} {:>7} {:>7} {:>8} {:>7.2} {:>7} {:>7} {:>7.2} {:>7} {:>7} {:>7.3} {:>7} {:>7} {:>4.0}%  {}",
            c.app,
            pct(c.aware.slo_attainment),
            pct(b.and_then(|b| b.slo_attainment)),
            meets,
            c.aware.requested_cores_mean,
            num(b.map(|b| b.requested_cores_mean), 2),
            signed(c.core_hours_change),
            c.aware.requested_gib_mean,
            num(b.map(|b| b.requested_gib_mean), 2),
            signed(c.gib_hours_change),
            c.aware.mean_reward,
            num(b.map(|b| b.mean_reward), 3),
            signed(c.reward_change),
            100.0 * c.rl_share,
            c.stages,
        );
    }
    let (a, b) = (&s.all.aware, s.all.hpa_vpa.as_ref());
    let _ = writeln!(
        out,
        "core-hours: AWARE {:.2}, HPA/VPA {} ({}); GiB-hours: AWARE {:.2}, HPA/VPA {} ({})",
        a.core_hours,
        num(b.map(|b| b.core_hours), 2),
        signed(s.all.core_hours_change),
        a.gib_hours,
        num(b.map(|b| b.gib_hours), 2),
        signed(s.all.gib_hours_change),
    );
    let _ = writeln!(
        out,
        "apps meeting the SLO objective ({:.0}%): AWARE {} of the {} with an SLO, HPA/VPA {}",
        100.0 * s.slo_objective,
        s.apps_meeting_objective_aware,
        s.apps_with_slo,
        s.apps_meeting_objective_hpa_vpa
            .map_or("-".to_string(), |n| n.to_string()),
    );
}

/// SVG charts over the episodes: every app's mean reward, its SLO violations (% of the
/// episode's steps), how many apps were in each stage, and (with the baseline) the requested
/// cores, the mean reward and violations over all apps against HPA/VPA alone.
fn write_plots(
    dir: &Path,
    progress: &BTreeMap<Target, AppProgress>,
    baseline: Option<&BTreeMap<Target, AppProgress>>,
) -> Result<Vec<String>, DemoError> {
    let names: Vec<&str> = progress.keys().map(|t| t.name.as_str()).collect();
    let rewards: Vec<Vec<f64>> = progress
        .values()
        .map(|a| a.episodes.iter().map(|e| e.mean_reward).collect())
        .collect();
    let violations: Vec<Vec<f64>> = progress
        .values()
        .map(|a| {
            a.episodes
                .iter()
                .map(|e| 100.0 * f64::from(e.slo_violations) / f64::from(e.steps.max(1)))
                .collect()
        })
        .collect();
    let n = progress
        .values()
        .map(|a| a.episodes.len())
        .max()
        .unwrap_or(0);
    let stages = [Stage::Offline, Stage::Online, Stage::Serving];
    let counts: Vec<Vec<f64>> = stages
        .iter()
        .map(|s| {
            (0..n)
                .map(|i| {
                    progress
                        .values()
                        .filter(|a| a.episodes.get(i).map(|e| e.stage) == Some(*s))
                        .count() as f64
                })
                .collect()
        })
        .collect();
    fn per_app<'a>(names: &[&'a str], values: &'a [Vec<f64>]) -> Vec<Series<'a>> {
        names
            .iter()
            .zip(values)
            .map(|(name, v)| Series {
                name,
                offset: 0,
                values: v,
            })
            .collect()
    }
    let charts = [
        (
            "demo-reward.svg",
            Chart {
                series: per_app(&names, &rewards),
                x_label: "episode",
                y_label: "mean reward per step",
                ..Chart::default()
            },
        ),
        (
            "demo-slo.svg",
            Chart {
                series: per_app(&names, &violations),
                x_label: "episode",
                y_label: "SLO violations, % of steps",
                ..Chart::default()
            },
        ),
        (
            "demo-stages.svg",
            Chart {
                series: stages
                    .iter()
                    .zip(&counts)
                    .map(|(s, v)| Series {
                        name: s.as_str(),
                        offset: 0,
                        values: v,
                    })
                    .collect(),
                x_label: "episode",
                y_label: "apps in the stage",
                ..Chart::default()
            },
        ),
    ];
    let mut written = Vec::new();
    for (file, chart) in &charts {
        let p = dir.join(file);
        std::fs::write(&p, line_chart(chart)).map_err(io_err(&p))?;
        written.push(p.display().to_string());
    }
    if let Some(base) = baseline {
        // Per episode, over every app: mean reward per step, SLO violations in % of steps (means
        // over the apps), and the requested cores (summed: the cluster's).
        let over_apps =
            |m: &BTreeMap<Target, AppProgress>, f: fn(&EpisodeRow) -> f64, sum: bool| {
                (0..n)
                    .map(|i| {
                        let rows: Vec<&EpisodeRow> =
                            m.values().filter_map(|a| a.episodes.get(i)).collect();
                        let total = rows.iter().map(|e| f(e)).sum::<f64>();
                        match (rows.len(), sum) {
                            (0, _) => f64::NAN,
                            (_, true) => total,
                            (k, false) => total / k as f64,
                        }
                    })
                    .collect::<Vec<f64>>()
            };
        let reward = |e: &EpisodeRow| e.mean_reward;
        let viol = |e: &EpisodeRow| 100.0 * f64::from(e.slo_violations) / f64::from(e.steps.max(1));
        let cores = |e: &EpisodeRow| e.requested_cores_mean.unwrap_or(f64::NAN);
        let (ar, br) = (
            over_apps(progress, reward, false),
            over_apps(base, reward, false),
        );
        let (av, bv) = (
            over_apps(progress, viol, false),
            over_apps(base, viol, false),
        );
        let (ac, bc) = (
            over_apps(progress, cores, true),
            over_apps(base, cores, true),
        );
        for (file, y_label, a, b) in [
            (
                "demo-vs-hpa-vpa-cost.svg",
                "requested cores, all apps",
                &ac,
                &bc,
            ),
            (
                "demo-vs-hpa-vpa-reward.svg",
                "mean reward per step, all apps",
                &ar,
                &br,
            ),
            (
                "demo-vs-hpa-vpa-slo.svg",
                "SLO violations, % of steps, all apps",
                &av,
                &bv,
            ),
        ] {
            let chart = Chart {
                series: vec![
                    Series {
                        name: "AWARE",
                        offset: 0,
                        values: a,
                    },
                    Series {
                        name: "HPA/VPA alone",
                        offset: 0,
                        values: b,
                    },
                ],
                x_label: "episode",
                y_label,
                ..Chart::default()
            };
            let p = dir.join(file);
            std::fs::write(&p, line_chart(&chart)).map_err(io_err(&p))?;
            written.push(p.display().to_string());
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval(replicas: u32, cores_per_pod: f64, gib_per_pod: f64) -> RawMetrics {
        RawMetrics {
            replicas,
            ready_replicas: replicas,
            // The spec may run ahead of the pods: the pods running hold the requests.
            spec_replicas: Some(replicas + 1),
            cpu_limit_cores: cores_per_pod,
            memory_limit_bytes: gib_per_pod * GIB,
            cpu_util: 0.5,
            memory_util: 0.25,
            ..RawMetrics::default()
        }
    }

    fn app(slo_p99_ms: Option<f64>, intervals: &[(u64, u32, f64, f64, bool, f64)]) -> AppProgress {
        let mut a = AppProgress {
            slo_p99_ms,
            ..AppProgress::default()
        };
        for &(episode, pods, cores, gib, violated, reward) in intervals {
            a.count_interval(episode, &interval(pods, cores, gib), violated, reward);
        }
        a
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// A tiny run worked out by hand: attainment over the intervals of apps with an SLO, the
    /// requested resources of the pods running, hours from the interval length, changes against
    /// HPA/VPA.
    #[test]
    fn the_summary_computes_attainment_and_cost_against_hpa_vpa() {
        let web = Target::new("sim", "web");
        let batch = Target::new("sim", "batch");
        // web, AWARE: 1, 1, 2, 1 cores (2, 2, 4, 2 GiB), one violation in four.
        let aware_web = app(
            Some(200.0),
            &[
                (0, 2, 0.5, 1.0, false, 1.0),
                (0, 2, 0.5, 1.0, false, 1.0),
                (1, 4, 0.5, 1.0, true, 0.5),
                (1, 1, 1.0, 2.0, false, 1.5),
            ],
        );
        // web, HPA/VPA: 2 cores and 4 GiB throughout, no violation.
        let base_web = app(Some(200.0), &[(0, 4, 0.5, 1.0, false, 0.8); 4]);
        // batch: no SLO, 0.25 cores and 0.5 GiB in both runs.
        let batch_run = app(None, &[(0, 1, 0.25, 0.5, false, 1.0); 4]);
        let aware = BTreeMap::from([(web.clone(), aware_web), (batch.clone(), batch_run.clone())]);
        let base = BTreeMap::from([(web, base_web), (batch, batch_run)]);

        let s = summarize(&aware, Some(&base), 10.0, DEFAULT_SLO_OBJECTIVE);
        assert_eq!(s.slo_objective, 0.99);
        let names: Vec<&str> = s.apps.iter().map(|c| c.app.as_str()).collect();
        assert_eq!(names, ["batch", "web"]);
        let w = &s.apps[1];
        assert_eq!(w.slo, "p99 ≤ 200 ms");
        assert_eq!(w.aware.intervals, 4);
        assert_eq!(w.aware.slo_attainment, Some(0.75));
        assert_eq!(w.aware.meets_objective, Some(false));
        assert!(close(w.aware.requested_cores_mean, 1.25));
        assert!(close(w.aware.requested_gib_mean, 2.5));
        assert!(close(w.aware.core_hours, 5.0 * 10.0 / 3600.0));
        assert!(close(w.aware.gib_hours, 10.0 * 10.0 / 3600.0));
        assert!(close(w.aware.mean_reward, 1.0));
        let wb = w.hpa_vpa.as_ref().unwrap();
        assert_eq!(wb.slo_attainment, Some(1.0));
        assert_eq!(wb.meets_objective, Some(true));
        assert!(close(wb.requested_cores_mean, 2.0));
        assert!(close(wb.core_hours, 8.0 * 10.0 / 3600.0));
        assert!(close(w.core_hours_change.unwrap(), -0.375));
        assert!(close(w.gib_hours_change.unwrap(), -0.375));
        assert!(close(w.reward_change.unwrap(), 0.25));

        let b = &s.apps[0];
        assert_eq!(b.slo, "-");
        assert_eq!(
            (b.aware.slo_attainment, b.aware.meets_objective),
            (None, None)
        );
        assert!(close(b.aware.requested_cores_mean, 0.25));
        assert_eq!(b.core_hours_change, Some(0.0));

        // All apps: attainment over the SLO app's intervals only; the cluster's mean requests.
        assert_eq!(s.all.aware.intervals, 8);
        assert_eq!(s.all.aware.slo_attainment, Some(0.75));
        assert_eq!(s.all.hpa_vpa.as_ref().unwrap().slo_attainment, Some(1.0));
        assert!(close(s.all.aware.requested_cores_mean, 1.5));
        assert!(close(s.all.aware.core_hours, 6.0 * 10.0 / 3600.0));
        assert!(close(s.all.core_hours_change.unwrap(), (6.0 - 9.0) / 9.0));
        assert!(close(s.all.gib_hours_change.unwrap(), (12.0 - 18.0) / 18.0));
        assert!(close(s.all.aware.mean_reward, 8.0 / 8.0));
        assert_eq!(s.apps_with_slo, 1);
        assert_eq!(s.apps_meeting_objective_aware, 0);
        assert_eq!(s.apps_meeting_objective_hpa_vpa, Some(1));

        // Without the HPA/VPA run: no comparison, the AWARE figures alone.
        let alone = summarize(&aware, None, 10.0, DEFAULT_SLO_OBJECTIVE);
        assert_eq!(alone.apps[1].aware, s.apps[1].aware);
        assert_eq!(alone.apps[1].core_hours_change, None);
        assert_eq!(alone.apps_meeting_objective_hpa_vpa, None);

        let mut text = Vec::new();
        print_summary(&mut text, &s);
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("objective 99%"), "{text}");
        assert!(text.contains("core-hours: AWARE 0.02, HPA/VPA "), "{text}");
        assert!(text.contains("(-33.3%); GiB-hours"), "{text}");
        let web_line = text.lines().find(|l| l.starts_with("web ")).unwrap();
        for cell in [
            "75.0%", "100.0%", "HPA/VPA", "1.25", "2.00", "-37.5%", "+25.0%",
        ] {
            assert!(web_line.contains(cell), "{cell} in {web_line}");
        }
    }

    /// Each episode's requested resources are its own intervals' mean.
    #[test]
    fn episode_cost_is_the_mean_of_its_intervals() {
        let mut a = app(
            None,
            &[
                (0, 2, 0.5, 1.0, false, 1.0),
                (0, 4, 0.5, 1.0, false, 1.0),
                (1, 1, 1.0, 1.0, false, 1.0),
            ],
        );
        assert_eq!(a.take_episode_cost(0), (Some(1.5), Some(3.0)));
        assert_eq!(a.take_episode_cost(0), (None, None), "forgotten once taken");
        assert_eq!(a.take_episode_cost(1), (Some(1.0), Some(1.0)));
        assert_eq!(requested(&interval(3, 0.25, 0.5)), (0.75, 1.5));
    }

    fn manifest_for(opts: &TrainMetaOptions, base: &[u8], meta: &[u8]) -> Manifest {
        let inputs = FingerprintInputs::of(opts).unwrap();
        Manifest {
            fingerprint: inputs.fingerprint(),
            inputs,
            command: "aware train-meta".into(),
            held_out_agent_mean: 1.4,
            held_out_fallback_mean: 1.3,
            best_iteration: 9,
            kept_restart: 0,
            train_seconds: 1.0,
            base_sha256: aware_shared::model_store::sha256_hex(base),
            meta_sha256: aware_shared::model_store::sha256_hex(meta),
        }
    }

    /// The shipped default when current; otherwise an earlier demo's training when it is current
    /// for the options asked, else a new training: a changed option, a changed build or other
    /// checkpoint files retrain.
    #[test]
    fn the_meta_plan_uses_the_shipped_default_or_retrains_when_anything_changed() {
        let dir = std::env::temp_dir().join(format!("aware-demo-plan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let asked = DemoMeta::trained(9);
        let DemoMeta::Train(o) = &asked else {
            unreachable!()
        };
        let shipped = manifest_for(o, b"b", b"m");
        let plan = plan_meta(&asked, &dir, (Some(shipped.clone()), Freshness::Current)).unwrap();
        assert_eq!(plan.dir(), Some(dir.join(SHIPPED_DIR)));
        assert_eq!(plan.source(), "shipped");

        // Stale because of the options asked: a training, no warning about the default.
        let other = Freshness::Stale(vec!["the options (iterations 300 → 9)".into()]);
        let plan = plan_meta(&asked, &dir, (Some(shipped.clone()), other.clone())).unwrap();
        let MetaPlan::Train {
            opts,
            shipped_stale,
            ..
        } = &plan
        else {
            panic!("{plan:?}")
        };
        assert!(!shipped_stale);
        assert_eq!(opts.out, dir.join(META_DIR));
        assert_eq!(opts.iterations, 9);
        // Stale because the build moved on: a training, and the default is called stale.
        let moved = Freshness::Stale(vec!["the simulator's dynamics or reward".into()]);
        let plan = plan_meta(&asked, &dir, (Some(shipped.clone()), moved)).unwrap();
        assert!(
            matches!(
                plan,
                MetaPlan::Train {
                    shipped_stale: true,
                    ..
                }
            ),
            "{plan:?}"
        );

        // An earlier demo's training for these options: reused.
        let trained = dir.join(META_DIR);
        std::fs::create_dir_all(&trained).unwrap();
        std::fs::write(trained.join("base.ckpt"), b"base").unwrap();
        std::fs::write(trained.join("meta.ckpt"), b"meta").unwrap();
        let m = manifest_for(
            &TrainMetaOptions {
                out: trained.clone(),
                ..(**o).clone()
            },
            b"base",
            b"meta",
        );
        std::fs::write(trained.join(MANIFEST_FILE), serde_json::to_vec(&m).unwrap()).unwrap();
        let plan = plan_meta(&asked, &dir, (Some(shipped.clone()), other.clone())).unwrap();
        assert_eq!(plan.source(), "reused", "{plan:?}");
        assert_eq!(plan.dir(), Some(trained.clone()));
        // Another option: not reused.
        let plan = plan_meta(
            &DemoMeta::trained(10),
            &dir,
            (Some(shipped.clone()), other.clone()),
        )
        .unwrap();
        assert_eq!(plan.source(), "trained", "{plan:?}");
        // Other checkpoint bytes than the manifest's: not reused.
        std::fs::write(trained.join("base.ckpt"), b"changed").unwrap();
        let plan = plan_meta(&asked, &dir, (Some(shipped), other)).unwrap();
        assert_eq!(plan.source(), "trained", "{plan:?}");

        assert_eq!(
            plan_meta(&DemoMeta::Off, &dir, (None, Freshness::Current)).unwrap(),
            MetaPlan::Off
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
