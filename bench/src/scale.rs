//! `aware bench scale`: every per-target service in `--shards` shards, each shard of each service
//! its own process, on one real `nats-server` (JetStream capture on), driving `--targets`
//! simulated targets in lock-step on the fallback policy (with `--rl`, the lifecycle's default
//! bootstrapping and a trainer per shard). Each shard's collector simulates the targets of its
//! shard, so the targets are split as they would be on a cluster.
//!
//! Figures per run, seen by an observer on the bus:
//! - `target_steps_per_s`: targets × steps / (time between the first and the last `obs`); paced
//!   (`--step-ms`), about the offered load, targets / step;
//! - `obs_to_action_p99_ms`: from the observer receiving a step's `obs` to it receiving the
//!   step's `action` (bus hops and the queueing behind a step's burst of `obs` included; paced,
//!   the collectors spread a step's `obs` over `--spread` of it);
//! - `decided_exactly_once`: every `obs` got exactly one `action`, none arrived twice;
//! - `resident_bytes_per_target`: the resident memory of every process, summed, grown from
//!   ready-and-idle (the collectors, which make their targets at start, counted whole) to the
//!   end of the run, divided by the targets;
//! - `trainer_cpu_s_per_target_hour`: the trainers' CPU seconds per target and simulated hour;
//! - `first_model_after_s_p50`: from a target's first `episode` (its first data stored) to its
//!   first `model`, median over the targets that got one (`null` without `--rl` or when none did);
//! - `store_bytes_per_transition`: the trajectory stores' files (one SQLite file per shard)
//!   over the transitions stored in them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aware_bus_schemas::{subject, EventKind};
use aware_shared::config::BusConfig;
use aware_shared::probe::http_get;
use aware_shared::testkit::NatsServer;
use aware_stores::trajectory::{SqliteStore, TrajectoryStore};
use serde::Serialize;

use super::observer::{latency_histogram, record_since, step_of, target_of, Observer};
use super::process::{cpu_seconds, rss_bytes, service_bin, start_service, Child};
use super::{fail, median, BenchError};

#[derive(Debug, Clone, clap::Args)]
pub struct ScaleBenchOptions {
    #[arg(long, default_value_t = ScaleBenchOptions::default().targets)]
    pub targets: usize,
    /// Shards of every per-target service (1–256).
    #[arg(long, default_value_t = ScaleBenchOptions::default().shards)]
    pub shards: u32,
    #[arg(long, default_value_t = ScaleBenchOptions::default().steps)]
    pub steps: u64,
    #[arg(long, default_value_t = ScaleBenchOptions::default().runs)]
    pub runs: usize,
    /// The RL path on: a trainer per shard and the lifecycle's default bootstrapping (without,
    /// no trainer runs and the fallback decides throughout).
    #[arg(long)]
    pub rl: bool,
    /// Every service with `bus.jetstream.ack_publishes` (each publish waits until the stream has
    /// stored it; what a NATS cluster across machines runs with, ADR 0022).
    #[arg(long)]
    pub ack_publishes: bool,
    /// Paced: one step every this many milliseconds of wall-clock time (also the simulated
    /// step), the offered load being targets / step; 0 runs in lock-step, as fast as the
    /// services go.
    #[arg(long, default_value_t = ScaleBenchOptions::default().step_ms)]
    pub step_ms: u64,
    /// Paced: the fraction of a step over which the collectors spread its `obs`
    /// (`collector.spread_fraction`; 0 publishes them at once).
    #[arg(long, default_value_t = ScaleBenchOptions::default().spread)]
    pub spread: f64,
    /// How long a run may take, seconds.
    #[arg(long, default_value_t = ScaleBenchOptions::default().timeout_secs)]
    pub timeout_secs: u64,
    /// Where the service binaries are (default: next to the running executable).
    #[arg(skip)]
    pub bin_dir: Option<PathBuf>,
}

impl Default for ScaleBenchOptions {
    fn default() -> Self {
        ScaleBenchOptions {
            targets: 1000,
            shards: 3,
            steps: 20,
            runs: 3,
            rl: false,
            ack_publishes: false,
            step_ms: 0,
            spread: 0.5,
            timeout_secs: 900,
            bin_dir: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ScaleRun {
    pub target_steps_per_s: f64,
    pub obs_to_action_p50_ms: f64,
    pub obs_to_action_p99_ms: f64,
    pub decided_exactly_once: bool,
    /// `obs` without exactly one `action` (0 when decided exactly once).
    pub undecided_or_repeated: u64,
    pub resident_bytes_idle: u64,
    pub resident_bytes_loaded: u64,
    pub resident_bytes_per_target: f64,
    pub trainer_cpu_s: f64,
    pub trainer_cpu_s_per_target_hour: f64,
    pub first_model_after_s_p50: Option<f64>,
    pub targets_with_a_model: usize,
    pub transitions_stored: u64,
    pub store_bytes: u64,
    pub store_bytes_per_transition: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    pub targets: usize,
    pub shards: u32,
    pub steps: u64,
    pub rl: bool,
    pub ack_publishes: bool,
    /// Wall-clock milliseconds per step (0: lock-step).
    pub step_ms: u64,
    /// The fraction of a paced step over which its `obs` are spread.
    pub spread: f64,
    pub processes: usize,
    pub runs: Vec<ScaleRun>,
    pub target_steps_per_s: f64,
    pub obs_to_action_p99_ms: f64,
    pub resident_bytes_per_target: f64,
    pub decided_exactly_once: bool,
    pub trainer_cpu_s_per_target_hour: f64,
    pub first_model_after_s_p50: Option<f64>,
    pub store_bytes_per_transition: f64,
}

/// The per-target services other than the collector, in start order.
const SERVICES: [&str; 4] = [
    "aware-recommender",
    "aware-actuator",
    "aware-trajectory-recorder",
    "aware-lifecycle-monitor",
];

struct Process {
    bin: &'static str,
    child: Child,
    addr: std::net::SocketAddr,
}

fn bin(opts: &ScaleBenchOptions, name: &str) -> Result<PathBuf, BenchError> {
    service_bin(opts.bin_dir.as_deref(), name)
}

fn sum_metric(procs: &[Process], bin: &str, name: &str) -> f64 {
    procs
        .iter()
        .filter(|p| p.bin == bin)
        .filter_map(|p| http_get(p.addr, "/metrics").ok())
        .map(|(_, text)| {
            text.lines()
                .filter(|l| l.starts_with(name) && !l.starts_with('#'))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum()
}

fn file_bytes(db: &Path) -> u64 {
    ["", "-wal", "-shm"]
        .iter()
        .filter_map(|suffix| {
            let mut p = db.as_os_str().to_owned();
            p.push(suffix);
            std::fs::metadata(PathBuf::from(p)).ok()
        })
        .map(|m| m.len())
        .sum()
}

async fn one_run(opts: &ScaleBenchOptions) -> Result<ScaleRun, BenchError> {
    let server = NatsServer::start()?;
    let url = server.url();
    let dir = std::env::temp_dir().join(format!("aware-bench-scale-{}", std::process::id()));
    let _cleanup = aware_shared::testkit::TempDirGuard(dir.clone());
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let max_targets = opts
        .targets
        .max(aware_shared::config::ActorsConfig::default().max_targets);
    let sim = aware_metrics_collector::config::SimulatorSourceConfig::default();
    let spe = u64::from(aware_shared::config::LearningConfig::default().steps_per_episode);
    let db = |shard: u32| dir.join(format!("t-{shard}.db"));
    let env = |shard: u32| -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("AWARE_SHARD__INDEX", shard.to_string()),
            ("AWARE_SHARD__COUNT", opts.shards.to_string()),
            ("AWARE_ACTORS__MAX_TARGETS", max_targets.to_string()),
            // The recorder and the trainer of a shard share its store.
            (
                "AWARE_TRAJECTORY_STORE__SQLITE_PATH",
                db(shard).display().to_string(),
            ),
            (
                "AWARE_MODEL_STORE__DIR",
                dir.join("models").display().to_string(),
            ),
            ("AWARE_COLLECTOR__SOURCE", "simulator".into()),
            ("AWARE_COLLECTOR__SIMULATOR__APPS", opts.targets.to_string()),
            (
                "AWARE_COLLECTOR__SIMULATOR__MAX_STEPS",
                opts.steps.to_string(),
            ),
            (
                "AWARE_COLLECTOR__SIMULATOR__STEP_TIMEOUT_MS",
                "30000".into(),
            ),
        ];
        if !opts.rl {
            env.push(("AWARE_LIFECYCLE__T_ONLINE", "1e9".into()));
        }
        if opts.ack_publishes {
            env.push(("AWARE_BUS__JETSTREAM__ACK_PUBLISHES", "true".into()));
        }
        if opts.step_ms > 0 {
            env.push(("AWARE_COLLECTOR__SIMULATOR__CLOCK", "wallclock".into()));
            env.push((
                "AWARE_COLLECTOR__SIMULATOR__STEP_SECONDS",
                (opts.step_ms as f64 / 1000.0).to_string(),
            ));
            env.push(("AWARE_COLLECTOR__SPREAD_FRACTION", opts.spread.to_string()));
        }
        env
    };
    let ready_within = Duration::from_secs(60);
    let mut procs: Vec<Process> = Vec::new();
    let mut bins: Vec<&'static str> = SERVICES.to_vec();
    if opts.rl {
        bins.push("aware-meta-learner-trainer");
    }
    for shard in 0..opts.shards {
        for &name in &bins {
            let (child, addr) =
                start_service(&bin(opts, name)?, &url, &env(shard), ready_within).await?;
            procs.push(Process {
                bin: name,
                child,
                addr,
            });
        }
    }
    let rss_all = |procs: &[Process]| -> Result<u64, BenchError> {
        procs.iter().map(|p| rss_bytes(p.child.0.id())).sum()
    };
    let rss_idle = rss_all(&procs)?;

    let observer_cfg = BusConfig {
        url: url.clone(),
        ..BusConfig::default()
    };
    let observer = Observer::connect(
        &observer_cfg,
        opts.targets,
        &[
            EventKind::Obs,
            EventKind::Action,
            EventKind::Episode,
            EventKind::Model,
        ],
    )
    .await?;
    let [mut obs_sub, mut act_sub, mut ep_sub, mut model_sub]: [_; 4] = observer
        .subs
        .try_into()
        .map_err(|_| fail("four subscriptions"))?;
    for shard in 0..opts.shards {
        let (child, addr) = start_service(
            &bin(opts, "aware-metrics-collector")?,
            &url,
            &env(shard),
            ready_within,
        )
        .await?;
        procs.push(Process {
            bin: "aware-metrics-collector",
            child,
            addr,
        });
    }

    let want = opts.targets as u64 * (opts.steps + 1);
    // (target, global step) → when its `obs` arrived, and its `action`s.
    let mut sent: HashMap<(Arc<str>, u64), Instant> = HashMap::new();
    let mut actions: HashMap<(Arc<str>, u64), u32> = HashMap::new();
    let mut data_ready: HashMap<Arc<str>, Instant> = HashMap::new();
    let mut first_model: HashMap<Arc<str>, Duration> = HashMap::new();
    let mut lat = latency_histogram()?;
    let (mut n_obs, mut decided) = (0u64, 0u64);
    let (mut first, mut last) = (None, Instant::now());
    let key = |subj: &str, payload: &[u8]| step_of(subj, payload, spe);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(opts.timeout_secs);
    let mut grace: Option<tokio::time::Instant> = None;
    loop {
        if grace.is_none() && n_obs >= want && decided >= want {
            // Anything more would be an action repeated: wait a moment for it.
            grace = Some(tokio::time::Instant::now() + Duration::from_millis(500));
        }
        let until = grace.unwrap_or(deadline);
        tokio::select! {
            m = obs_sub.next() => {
                let Some(m) = m else { break };
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                n_obs += 1;
                if let Some(k) = key(&m.subject, &m.payload) {
                    sent.entry(k).or_insert(now);
                }
            }
            m = act_sub.next() => {
                let Some(m) = m else { break };
                if let Some(k) = key(&m.subject, &m.payload) {
                    let n = actions.entry(k.clone()).or_default();
                    *n += 1;
                    if *n == 1 {
                        decided += 1;
                        if let Some(t0) = sent.get(&k) {
                            record_since(&mut lat, *t0);
                        }
                    }
                }
            }
            m = ep_sub.next() => {
                let Some(m) = m else { break };
                data_ready.entry(target_of(&m.subject)).or_insert_with(Instant::now);
            }
            m = model_sub.next() => {
                let Some(m) = m else { break };
                let t = target_of(&m.subject);
                if let Some(ready) = data_ready.get(&t) {
                    first_model.entry(t).or_insert_with(|| ready.elapsed());
                }
            }
            _ = tokio::time::sleep_until(until) => {
                if grace.is_some() {
                    break;
                }
                return Err(fail(format!("timed out: {n_obs}/{want} obs, {decided}/{want} decided")));
            }
        }
    }
    let elapsed = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let rss_loaded = rss_all(&procs)?;
    let undecided_or_repeated = sent.keys().filter(|k| actions.get(*k) != Some(&1)).count() as u64
        + actions.keys().filter(|k| !sent.contains_key(*k)).count() as u64;

    // The recorders store every step of every target (each target's last `obs` has no next
    // one, so its transition waits): wait for them before reading the stores.
    let stored_want = opts.targets as u64 * opts.steps;
    let stored_deadline = Instant::now() + Duration::from_secs(120);
    let stored = |procs: &[Process]| {
        sum_metric(
            procs,
            "aware-trajectory-recorder",
            "aware_recorder_transitions_stored_total",
        ) as u64
    };
    while stored(&procs) < stored_want && Instant::now() < stored_deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let trainer_cpu_s: f64 = procs
        .iter()
        .filter(|p| p.bin == "aware-meta-learner-trainer")
        .map(|p| cpu_seconds(p.child.0.id()))
        .try_fold(0.0, |sum, s| s.map(|s| sum + s))?;
    drop(procs);
    let (mut transitions, mut store_bytes) = (0u64, 0u64);
    for shard in 0..opts.shards {
        let path = db(shard);
        if path.exists() {
            let store = SqliteStore::open_path(&path).map_err(|e| fail(e.to_string()))?;
            transitions += store.count_all().map_err(|e| fail(e.to_string()))?;
            drop(store);
            store_bytes += file_bytes(&path);
        }
    }
    drop(server);
    let step_seconds = if opts.step_ms > 0 {
        opts.step_ms as f64 / 1000.0
    } else {
        sim.step_seconds
    };
    let hours = opts.steps as f64 * step_seconds / 3600.0;
    let mut to_model: Vec<f64> = first_model.values().map(Duration::as_secs_f64).collect();
    to_model.sort_by(f64::total_cmp);
    Ok(ScaleRun {
        target_steps_per_s: opts.targets as f64 * opts.steps as f64 / elapsed.max(1e-9),
        obs_to_action_p50_ms: lat.value_at_quantile(0.5) as f64 / 1e6,
        obs_to_action_p99_ms: lat.value_at_quantile(0.99) as f64 / 1e6,
        decided_exactly_once: undecided_or_repeated == 0 && sent.len() as u64 == want,
        undecided_or_repeated,
        resident_bytes_idle: rss_idle,
        resident_bytes_loaded: rss_loaded,
        resident_bytes_per_target: rss_loaded.saturating_sub(rss_idle) as f64 / opts.targets as f64,
        trainer_cpu_s,
        trainer_cpu_s_per_target_hour: trainer_cpu_s / (opts.targets as f64 * hours.max(1e-9)),
        first_model_after_s_p50: (!to_model.is_empty()).then(|| median(&to_model)),
        targets_with_a_model: to_model.len(),
        transitions_stored: transitions,
        store_bytes,
        store_bytes_per_transition: store_bytes as f64 / transitions.max(1) as f64,
    })
}

/// Runs the benchmark `opts.runs` times and reports medians.
pub async fn run(opts: &ScaleBenchOptions) -> Result<ScaleReport, BenchError> {
    if opts.shards == 0 || opts.shards > subject::SLOTS {
        return Err(fail(format!(
            "--shards {} is not between 1 and {}",
            opts.shards,
            subject::SLOTS
        )));
    }
    if !(opts.spread.is_finite() && (0.0..1.0).contains(&opts.spread)) {
        return Err(fail(format!(
            "--spread {} is not at least 0 and below 1",
            opts.spread
        )));
    }
    let mut runs = Vec::new();
    for i in 0..opts.runs.max(1) {
        let r = one_run(opts).await?;
        tracing::info!(
            run = i,
            steps_per_s = r.target_steps_per_s,
            "scale bench run"
        );
        runs.push(r);
    }
    let m = |f: fn(&ScaleRun) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let models: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.first_model_after_s_p50)
        .collect();
    let per_shard = SERVICES.len() + 1 + usize::from(opts.rl);
    Ok(ScaleReport {
        targets: opts.targets,
        shards: opts.shards,
        steps: opts.steps,
        rl: opts.rl,
        ack_publishes: opts.ack_publishes,
        step_ms: opts.step_ms,
        spread: opts.spread,
        processes: per_shard * opts.shards as usize,
        target_steps_per_s: m(|r| r.target_steps_per_s),
        obs_to_action_p99_ms: m(|r| r.obs_to_action_p99_ms),
        resident_bytes_per_target: m(|r| r.resident_bytes_per_target),
        decided_exactly_once: runs.iter().all(|r| r.decided_exactly_once),
        trainer_cpu_s_per_target_hour: m(|r| r.trainer_cpu_s_per_target_hour),
        first_model_after_s_p50: (!models.is_empty()).then(|| median(&models)),
        store_bytes_per_transition: m(|r| r.store_bytes_per_transition),
        runs,
    })
}
