//! `aware demo`: the main job on the embedded bus — a simulated cluster of apps (generated ones
//! plus hand-written ones on real traces) managed end to end by the six services: every app
//! starts OFFLINE behind the HPA/VPA fallback while the trainer learns from its transitions,
//! goes ONLINE when the off-policy estimate allows, and SERVING when its rewards settle. Live
//! per-app progress and stage changes, then a summary (JSON) and plots of every app's reward,
//! SLO violations and stage per episode.
//!
//! The simulation is lock-step and would run the whole demo in a fraction of a second, before
//! the trainer's first round; the demo paces it the bus's own way ([`PacedServices`]: a pause
//! after every simulated step, back-pressure from small buffers), as in production, where a
//! step lasts 10–30 s and training is never behind.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aware_bus_schemas::{Event, Stage, Target};
use aware_metrics_collector::config::{CollectorConfig, SourceKind};
use aware_shared::bus::Bus;
use aware_shared::config::AppConfig;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use aware_harness::chart::{line_chart, Chart, Series};
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
    /// An `aware train-meta` output to bootstrap from (trainer.meta_dir). Without it the
    /// demo meta-trains one into OUT/meta the first time (`aware train-meta` with two
    /// restarts, about 1.5 min) and reuses it afterwards.
    #[arg(long, conflicts_with = "no_meta")]
    pub meta: Option<PathBuf>,
    /// The plain base-learner: every app learns from nothing (no meta-learning).
    #[arg(long)]
    pub no_meta: bool,
    /// Iterations of the demo's own meta-training.
    #[arg(long, default_value_t = TrainMetaOptions::default().iterations)]
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

/// Where the demo's meta-learned base-learner comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum DemoMeta {
    /// The plain base-learner, learning each app from nothing.
    Off,
    /// An `aware train-meta` output directory.
    Dir(PathBuf),
    /// Meta-trained by the demo into `<out_dir>/meta` on a generated pool (never the demo's
    /// apps: another seed), once; later demos reuse it while these options match.
    Train(Box<TrainMetaOptions>),
}

impl DemoMeta {
    /// The `trainer.meta_dir` this gives (known before any training).
    fn dir(&self, out_dir: &Path) -> Option<PathBuf> {
        match self {
            DemoMeta::Off => None,
            DemoMeta::Dir(d) => Some(d.clone()),
            DemoMeta::Train(_) => Some(out_dir.join(META_DIR)),
        }
    }

    /// The demo's own meta-training: `aware train-meta`'s defaults with `iterations` and two
    /// restarts (one per core: the wall time of one).
    pub fn trained(iterations: u64) -> Self {
        DemoMeta::Train(Box::new(TrainMetaOptions {
            iterations,
            restarts: 2,
            progress_every: 50,
            ..TrainMetaOptions::default()
        }))
    }
}

impl Default for DemoMeta {
    fn default() -> Self {
        DemoMeta::trained(TrainMetaOptions::default().iterations)
    }
}

/// The options a cached meta-training is compared on (where it was written and how often it
/// reported progress do not matter).
fn comparable(o: &TrainMetaOptions) -> TrainMetaOptions {
    TrainMetaOptions {
        out: PathBuf::new(),
        progress_every: 0,
        resume: false,
        ..o.clone()
    }
}

/// The `trainer.meta_dir` for `meta`: meta-trains into `out_dir/meta` first when asked and no
/// matching earlier training is there.
async fn meta_dir(
    meta: &DemoMeta,
    out_dir: &Path,
    out: &mut (impl Write + Send),
) -> Result<Option<PathBuf>, DemoError> {
    let opts = match meta {
        DemoMeta::Off => return Ok(None),
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
                None => Ok(Some(d.clone())),
            };
        }
        DemoMeta::Train(o) => TrainMetaOptions {
            out: out_dir.join(META_DIR),
            ..(**o).clone()
        },
    };
    let dir = opts.out.clone();
    let cached = aware_harness::train_meta::read_json::<aware_harness::train_meta::TrainLog>(
        &dir.join("train-log.json"),
    )
    .ok()
    .filter(|log| {
        comparable(&log.options) == comparable(&opts)
            && dir.join("base.ckpt").is_file()
            && dir.join("meta.ckpt").is_file()
    });
    if let Some(log) = cached {
        let _ = writeln!(
            out,
            "meta-learner: reusing {} (held-out apps: {:.3} per step against the fallback's {:.3})",
            dir.display(),
            log.held_out_agent_mean,
            log.held_out_fallback_mean
        );
        return Ok(Some(dir));
    }
    let _ = writeln!(
        out,
        "meta-learner: training it once into {} ({} apps of another seed, {} iterations, {} restarts; progress on stderr); later demos reuse it, --no-meta skips it",
        dir.display(),
        opts.apps,
        opts.iterations,
        opts.restarts
    );
    let _ = out.flush();
    let log = tokio::task::spawn_blocking(move || aware_harness::train_meta::run(&opts))
        .await
        .map_err(|e| DemoError::Config(format!("meta-training stopped: {e}")))?
        .map_err(|e| DemoError::Config(format!("meta-training: {e}")))?;
    let _ = writeln!(
        out,
        "meta-learner: trained in {:.0} s; held-out apps: {:.3} per step against the fallback's {:.3}\n",
        log.train_seconds, log.held_out_agent_mean, log.held_out_fallback_mean
    );
    Ok(Some(dir))
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

/// One recorded episode of an app (from its `episode` summary).
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

/// Per-app state shown live and summarised.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AppProgress {
    pub stage: Option<Stage>,
    pub step: u64,
    pub replicas: u32,
    pub cpu_millicores: u32,
    pub memory_mib: u64,
    pub p99_ms: Option<f64>,
    pub slo_p99_ms: Option<f64>,
    pub slo_throughput_rps: Option<f64>,
    pub last_reward: Option<f64>,
    pub reward_sum: f64,
    pub rewards: u64,
    pub slo_violations: u64,
    pub cpu_util_sum: f64,
    pub memory_util_sum: f64,
    pub observations: u64,
    pub actions_fallback: u64,
    pub actions_rl: u64,
    pub episodes_recorded: u64,
    pub models: u64,
    /// Workload embeddings the trainer published (meta-learning only).
    pub embeddings: u64,
    pub stage_changes: Vec<StageChange>,
    pub episodes: Vec<EpisodeRow>,
}

impl AppProgress {
    fn mean_reward(&self) -> f64 {
        if self.rewards == 0 {
            0.0
        } else {
            self.reward_sum / self.rewards as f64
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
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.learning.steps_per_episode = opts.steps_per_episode;
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
    cfg.set_section("collector", &collector)
        .map_err(|e| DemoError::Config(e.to_string()))?;
    set_stores(&mut cfg, &opts.out_dir.join("data"));
    let offline_episodes = 4u64;
    let mut trainer = serde_json::json!({
        "poll_ms": 50,
        "train_every_transitions": 100,
        "offline_min_transitions": offline_episodes * u64::from(opts.steps_per_episode),
        "eval_episodes": offline_episodes,
    });
    if let (Some(meta), Some(t)) = (meta, trainer.as_object_mut()) {
        t.insert("meta_dir".into(), meta.display().to_string().into());
        // A light imitation term keeps more of the meta-trained policy (docs/adr/0004-td3-bc-bootstrapping.md).
        t.insert("bc_alpha".into(), 100.0.into());
    }
    cfg.sections.insert("trainer".into(), trainer);
    for (path, value) in &opts.settings {
        aware_harness::set_path(&mut cfg.sections, path, value.clone())
            .map_err(|e| DemoError::Config(e.to_string()))?;
    }
    Ok(cfg)
}

/// The trajectory store (SQLite) and the model store of a run, under `dir`.
fn set_stores(cfg: &mut AppConfig, dir: &Path) {
    cfg.sections.insert(
        "trajectory_store".into(),
        serde_json::json!({ "sqlite_path": dir.join("trajectories.db").display().to_string() }),
    );
    cfg.sections
        .insert("recorder".into(), serde_json::json!({ "batch": 64 }));
    cfg.sections.insert(
        "model_store".into(),
        serde_json::json!({ "dir": dir.join("models").display().to_string() }),
    );
}

fn print_table(out: &mut impl Write, apps: &BTreeMap<Target, AppProgress>) {
    let _ = writeln!(
        out,
        "{:<22} {:<9} {:>6} {:>4} {:>6} {:>7} {:>17} {:>7} {:>7} {:>5}",
        "app",
        "stage",
        "step",
        "rep",
        "cpu(m)",
        "mem(Mi)",
        "p99 / SLO (ms)",
        "reward",
        "viol%",
        "rl%"
    );
    for (t, a) in apps {
        let slo = match (a.slo_p99_ms, a.slo_throughput_rps) {
            (Some(l), _) => format!("{l:.0}"),
            (None, Some(r)) => format!("≥{r:.0}rps"),
            (None, None) => "-".into(),
        };
        let p99 = a.p99_ms.map_or("-".to_string(), |p| format!("{p:.0}"));
        let viol = if a.observations == 0 {
            0.0
        } else {
            100.0 * a.slo_violations as f64 / a.observations as f64
        };
        let decisions = (a.actions_fallback + a.actions_rl).max(1) as f64;
        let _ = writeln!(
            out,
            "{:<22} {:<9} {:>6} {:>4} {:>6} {:>7} {:>17} {:>7.3} {:>6.1}% {:>4.0}%",
            t.name,
            a.stage.map_or("-", Stage::as_str),
            a.step,
            a.replicas,
            a.cpu_millicores,
            a.memory_mib,
            format!("{p99} / {slo}"),
            a.last_reward.unwrap_or(0.0),
            viol,
            100.0 * a.actions_rl as f64 / decisions,
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
    pub wall_seconds: f64,
    pub plots: Vec<String>,
}

/// Runs the demo to the end and returns its report (also written to `out_dir`).
pub async fn run(
    opts: &DemoOptions,
    out: &mut (impl Write + Send),
) -> Result<DemoReport, DemoError> {
    let app_file = write_demo_files(&opts.out_dir)?;
    let mut cfg = demo_config(opts, app_file, opts.meta.dir(&opts.out_dir).as_deref())?;
    let collector = CollectorConfig::read(&cfg).map_err(|e| DemoError::Config(e.to_string()))?;
    let apps = aware_metrics_collector::simulator::build_apps(&collector.simulator)?;
    cfg.targets = aware_metrics_collector::simulator::target_specs(&apps);
    // What `aware run` and `aware config` refuse, the demo refuses too, naming the key, before
    // it meta-trains (a service started on it would stop, or the demo wait for episodes that
    // never come).
    cfg.validate()
        .map_err(|e| DemoError::Config(e.to_string()))?;
    crate::config_check::effective(&cfg).map_err(|e| DemoError::Config(e.to_string()))?;
    let meta = meta_dir(&opts.meta, &opts.out_dir, out).await?;
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
        "every app starts OFFLINE behind HPA/VPA; the trainer learns from its transitions; ONLINE when the estimate allows, SERVING when rewards settle\n"
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
        set_stores(&mut base_cfg, &opts.out_dir.join("data").join("hpa-vpa"));
        let quiet = Watch {
            pace: Duration::ZERO,
            print_every: None,
            ..live
        };
        watch(base_cfg, &mut baseline, &quiet, &interrupted, out).await?
    };
    print_summary(out, &progress, baseline_complete.then_some(&baseline));
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
                a.p99_ms = o.metrics.latency_p99_ms;
                if let Some(r) = o.reward {
                    a.last_reward = Some(r);
                    a.reward_sum += r;
                    a.rewards += 1;
                    a.observations += 1;
                    a.slo_violations += u64::from(o.slo_violation);
                    a.cpu_util_sum += o.metrics.cpu_util;
                    a.memory_util_sum += o.metrics.memory_util;
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

fn print_summary(
    out: &mut impl Write,
    progress: &BTreeMap<Target, AppProgress>,
    baseline: Option<&BTreeMap<Target, AppProgress>>,
) {
    let steps = progress.values().map(|a| a.observations).max().unwrap_or(0);
    let _ = writeln!(
        out,
        "summary after {steps} steps per app, AWARE against HPA/VPA alone on the same apps and traces:"
    );
    let _ = writeln!(
        out,
        "{:<22} {:^23} {:^16} {:^16} {:^16} {:>5}  stages",
        "", "mean reward per step", "SLO violations", "cpu util", "mem util", "RL"
    );
    let _ = writeln!(
        out,
        "{:<22} {:>7} {:>7} {:>7} {:>8} {:>7} {:>8} {:>7} {:>8} {:>7} {:>5}",
        "app",
        "AWARE",
        "HPA/VPA",
        "change",
        "AWARE",
        "HPA/VPA",
        "AWARE",
        "HPA/VPA",
        "AWARE",
        "HPA/VPA",
        "share"
    );
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v));
    let num = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
    for (t, a) in progress {
        let b = baseline.and_then(|m| m.get(t));
        let per_step = |a: &AppProgress, f: fn(&AppProgress) -> f64| {
            (a.observations > 0).then(|| f(a) / a.observations as f64)
        };
        let viol = |a: &AppProgress| per_step(a, |a| a.slo_violations as f64);
        let cpu = |a: &AppProgress| per_step(a, |a| a.cpu_util_sum);
        let mem = |a: &AppProgress| per_step(a, |a| a.memory_util_sum);
        let base_reward = b.map(AppProgress::mean_reward);
        let change = base_reward
            .filter(|r| r.abs() > 1e-12)
            .map_or("-".to_string(), |r| {
                format!("{:+.1}%", 100.0 * (a.mean_reward() - r) / r.abs())
            });
        let decisions = (a.actions_fallback + a.actions_rl).max(1) as f64;
        let _ = writeln!(
            out,
            "{:<22} {:>7.3} {:>7} {:>7} {:>8} {:>7} {:>8} {:>7} {:>8} {:>7} {:>4.0}%  {}",
            t.name,
            a.mean_reward(),
            num(base_reward),
            change,
            pct(viol(a)),
            pct(b.and_then(viol)),
            pct(cpu(a)),
            pct(b.and_then(cpu)),
            pct(mem(a)),
            pct(b.and_then(mem)),
            100.0 * a.actions_rl as f64 / decisions,
            a.stage_path(),
        );
    }
}

/// SVG charts over the episodes: every app's mean reward, its SLO violations (% of the
/// episode's steps), how many apps were in each stage, and (with the baseline) the mean reward
/// and violations over all apps against HPA/VPA alone.
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
        // Per episode, over every app: mean reward per step, and SLO violations in % of steps.
        let over_apps = |m: &BTreeMap<Target, AppProgress>, f: fn(&EpisodeRow) -> f64| {
            (0..n)
                .map(|i| {
                    let rows: Vec<&EpisodeRow> =
                        m.values().filter_map(|a| a.episodes.get(i)).collect();
                    if rows.is_empty() {
                        f64::NAN
                    } else {
                        rows.iter().map(|e| f(e)).sum::<f64>() / rows.len() as f64
                    }
                })
                .collect::<Vec<f64>>()
        };
        let reward = |e: &EpisodeRow| e.mean_reward;
        let viol = |e: &EpisodeRow| 100.0 * f64::from(e.slo_violations) / f64::from(e.steps.max(1));
        let (ar, br) = (over_apps(progress, reward), over_apps(base, reward));
        let (av, bv) = (over_apps(progress, viol), over_apps(base, viol));
        for (file, y_label, a, b) in [
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
