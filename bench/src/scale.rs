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
//!   end of the run, divided by the targets (and the same per service,
//!   `resident_bytes_per_target_by_service`);
//! - `trainer_cpu_s_per_target_hour`: the trainers' CPU seconds per target and simulated hour;
//!   per run, `cpu_us_per_target_step_by_service`: every service's CPU per target-step;
//! - `first_model_after_s_p50`: from a target's data being ready (the `episode` whose rows reach
//!   the trainer's `offline_min_transitions`: the targets start OFFLINE) to its first `model`,
//!   median over the targets that got one (`null` without `--rl` or when none did);
//! - `store_bytes_per_transition`: the trajectory stores' files (one SQLite file per shard)
//!   over the transitions stored in them;
//! - `capture_bytes_per_target_step`: the capture's bytes (all `--partitions`) per target-step;
//! - `replay_read_per_captured`: what the recorders' replays read over what the capture holds
//!   (the read amplification of sharding: 1 when each shard reads only its own slots' streams).
//!
//! With `--restart`, the bench registers every target first (as the controller does) and, once
//! the run is over, restarts each service in turn: every shard's process killed (SIGKILL) and
//! started again at once. Per service: the time from starting the new processes to the last of
//! them ready (ready comes after the start-up read of the targets' current state), and per event
//! kind it read, the targets it found (`aware_state_restored_targets`) against those the bus
//! carried (registered, with a stage, a model, an embedding, an `obs`); for the recommender,
//! also the time until every model it read back is loaded into its target's policy.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aware_bus_schemas::{encode_event, subject, Event, EventKind, Target};
use aware_shared::config::BusConfig;
use aware_shared::spec::TargetSpec;
use aware_shared::testkit::NatsServer;
use aware_stores::trajectory::{SqliteStore, TrajectoryStore};
use futures::StreamExt;
use serde::Serialize;

use super::observer::{latency_histogram, record_since, step_of, target_of, Observer};
use super::process::{cpu_seconds, rss_bytes, service_bin, start_service, Child};
use super::scrape;
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
    /// The capture's partitions (`bus.jetstream.partitions`, 1 to 256): each
    /// shard replays and reads at start-up only the partitions holding its slots (ADR 0024).
    #[arg(long, default_value_t = ScaleBenchOptions::default().partitions)]
    pub partitions: u32,
    /// Paced: one step every this many milliseconds of wall-clock time (also the simulated
    /// step), the offered load being targets / step; 0 runs in lock-step, as fast as the
    /// services go.
    #[arg(long, default_value_t = ScaleBenchOptions::default().step_ms)]
    pub step_ms: u64,
    /// Paced: the fraction of a step over which the collectors spread its `obs`
    /// (`collector.spread_fraction`; 0 publishes them at once).
    #[arg(long, default_value_t = ScaleBenchOptions::default().spread)]
    pub spread: f64,
    /// Register every target first and, after the run, restart each service (all its shards
    /// killed and started again at once), checking that it reads back every target's
    /// registration, stage, model and embedding. With `--rl`, the trainers make small rounds
    /// (10 updates once half the run is stored) and the restarts wait for every target's model
    /// (or 30 s without a new one).
    #[arg(long)]
    pub restart: bool,
    /// With `--rl`: the trainers' `trainer.held_networks` (networks kept in memory between
    /// rounds; the others are read back from their checkpoint each round). Default: the
    /// trainer's.
    #[arg(long)]
    pub held_networks: Option<usize>,
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
            partitions: 1,
            step_ms: 0,
            spread: 0.5,
            restart: false,
            held_networks: None,
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
    /// The same per service (all its shards), by binary.
    pub resident_bytes_per_target_by_service: BTreeMap<String, f64>,
    pub trainer_cpu_s: f64,
    pub trainer_cpu_s_per_target_hour: f64,
    /// Each service's CPU, all its shards, from start to every transition stored, in
    /// microseconds per target-step: where a step's CPU goes.
    pub cpu_us_per_target_step_by_service: BTreeMap<String, f64>,
    pub first_model_after_s_p50: Option<f64>,
    pub targets_with_a_model: usize,
    pub transitions_stored: u64,
    pub store_bytes: u64,
    pub store_bytes_per_transition: f64,
    /// Messages the capture's streams hold after the run, summed over its partitions.
    pub captured_messages: u64,
    /// The capture's bytes per target-step (an `obs`, an `action`, an `applied`, and the
    /// state messages): what `bus.jetstream.max_bytes` must hold per target and step.
    pub capture_bytes_per_target_step: f64,
    /// Messages the recorders' replays read, summed over the shards, over the messages
    /// captured: 1 when each shard reads only its own slots' streams, the shard count when
    /// every shard reads the whole capture.
    pub replay_read_per_captured: f64,
    /// `--restart`: each service's restart, in restart order.
    pub restarts: Vec<RestartRun>,
}

/// One service restarted after a run (`--restart`): all its shards at once.
#[derive(Debug, Clone, Serialize)]
pub struct RestartRun {
    pub service: String,
    /// From starting the new processes to the last of them ready, seconds.
    pub ready_s: f64,
    /// Per event kind read at start-up (`aware_state_restored_targets{event}`): the targets
    /// found and those expected.
    pub kinds: BTreeMap<String, KindRestored>,
    /// Every kind read found every target expected.
    pub recovered_all: bool,
    /// The recommender: from starting its processes to every model read back loaded into its
    /// target's policy (`aware_recommender_models_loaded_total`), seconds; `None` for the other
    /// services, or when that did not happen within 60 s.
    pub weights_loaded_s: Option<f64>,
    /// The recommender: models loaded, and models that failed to load
    /// (`aware_recommender_model_load_errors_total`), by then.
    pub models_loaded: u64,
    pub model_load_errors: u64,
}

/// One event kind a restarted service read at start-up, summed over its shards.
#[derive(Debug, Clone, Serialize)]
pub struct KindRestored {
    /// Targets whose newest message of the kind the read found
    /// (`aware_state_restored_targets`).
    pub restored: u64,
    /// Targets the bus carried a message of the kind for (registered: all).
    pub expected: u64,
    /// The slowest shard's read (`aware_state_read_seconds`), seconds.
    pub read_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    pub targets: usize,
    pub shards: u32,
    pub steps: u64,
    pub rl: bool,
    pub ack_publishes: bool,
    /// The capture's partitions.
    pub partitions: u32,
    /// Wall-clock milliseconds per step (0: lock-step).
    pub step_ms: u64,
    /// The fraction of a paced step over which its `obs` are spread.
    pub spread: f64,
    /// `--held-networks` (`None`: the trainer's default).
    pub held_networks: Option<usize>,
    pub processes: usize,
    pub runs: Vec<ScaleRun>,
    pub target_steps_per_s: f64,
    pub obs_to_action_p99_ms: f64,
    pub resident_bytes_per_target: f64,
    /// Median over the runs, per service.
    pub resident_bytes_per_target_by_service: BTreeMap<String, f64>,
    pub decided_exactly_once: bool,
    pub trainer_cpu_s_per_target_hour: f64,
    pub first_model_after_s_p50: Option<f64>,
    pub store_bytes_per_transition: f64,
    pub capture_bytes_per_target_step: f64,
    pub replay_read_per_captured: f64,
    /// `--restart`: per service, from starting its processes again to all of them ready
    /// (median over the runs), seconds.
    pub restart_ready_s: BTreeMap<String, f64>,
    /// `--restart`: every restart of every run read back every target's state.
    pub restart_recovered_all: Option<bool>,
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
    shard: u32,
    child: Child,
    addr: std::net::SocketAddr,
}

fn bin(opts: &ScaleBenchOptions, name: &str) -> Result<PathBuf, BenchError> {
    service_bin(opts.bin_dir.as_deref(), name)
}

/// Sum over the processes of service `bin` of the samples of each of `names` (one scrape of
/// each process; a process that does not answer counts nothing).
fn sum_metrics<const N: usize>(procs: &[Process], bin: &str, names: [&str; N]) -> [f64; N] {
    let mut out = [0.0; N];
    for s in procs
        .iter()
        .filter(|p| p.bin == bin)
        .filter_map(|p| scrape::get(p.addr).ok())
    {
        for (o, name) in out.iter_mut().zip(names) {
            *o += scrape::sum(&s, name, |_| true);
        }
    }
    out
}

/// Messages and bytes the capture's streams hold, summed over its `partitions`.
async fn capture_size(url: &str, partitions: u32) -> Result<(u64, u64), BenchError> {
    let client = async_nats::connect(url)
        .await
        .map_err(|e| fail(format!("connect to {url}: {e}")))?;
    let js = async_nats::jetstream::new(client);
    let cfg = aware_shared::config::JetStreamConfig {
        partitions,
        ..Default::default()
    };
    let (mut messages, mut bytes) = (0, 0);
    for name in cfg.capture_streams() {
        let mut stream = js
            .get_stream(&name)
            .await
            .map_err(|e| fail(format!("stream {name}: {e}")))?;
        let info = stream
            .info()
            .await
            .map_err(|e| fail(format!("stream {name}: {e}")))?;
        messages += info.state.messages;
        bytes += info.state.bytes;
    }
    Ok((messages, bytes))
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
    let dir = super::scratch_dir("scale");
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
    // `--rl --restart`: the trainers' minimum rows, half the run.
    let restart_rows = (opts.steps / 2).max(1);
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
        } else if opts.restart {
            // Small rounds as soon as half the run is stored, so that the targets have models
            // to read back: what a restart recovers, not how well they learnt.
            let rows = restart_rows.to_string();
            for (key, v) in [
                ("AWARE_TRAINER__MIN_TRANSITIONS", rows.clone()),
                ("AWARE_TRAINER__OFFLINE_MIN_TRANSITIONS", rows.clone()),
                ("AWARE_TRAINER__GRADIENT_STEPS", "10".to_string()),
                ("AWARE_TRAINER__OFFLINE_GRADIENT_STEPS", "10".to_string()),
            ] {
                env.push((key, v));
            }
        }
        if let (true, Some(n)) = (opts.rl, opts.held_networks) {
            env.push(("AWARE_TRAINER__HELD_NETWORKS", n.to_string()));
        }
        if opts.ack_publishes {
            env.push(("AWARE_BUS__JETSTREAM__ACK_PUBLISHES", "true".into()));
        }
        env.push((
            "AWARE_BUS__JETSTREAM__PARTITIONS",
            opts.partitions.to_string(),
        ));
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
                shard,
                child,
                addr,
            });
        }
    }
    // Resident bytes per binary (all its shards); the totals are their sums.
    let rss_by = |procs: &[Process]| -> Result<BTreeMap<String, u64>, BenchError> {
        let mut by = BTreeMap::new();
        for p in procs {
            *by.entry(p.bin.to_string()).or_default() += rss_bytes(p.child.0.id())?;
        }
        Ok(by)
    };
    let rss_idle_by = rss_by(&procs)?;
    let rss_idle: u64 = rss_idle_by.values().sum();

    let mut observer_cfg = BusConfig {
        url: url.clone(),
        ..BusConfig::default()
    };
    observer_cfg.jetstream.partitions = opts.partitions;
    let observer = Observer::connect(
        &observer_cfg,
        opts.targets,
        &[
            EventKind::Obs,
            EventKind::Action,
            EventKind::Episode,
            EventKind::Model,
            EventKind::Lifecycle,
            EventKind::Embedding,
        ],
    )
    .await?;
    let [mut obs_sub, mut act_sub, mut ep_sub, mut model_sub, stage_sub, emb_sub]: [_; 6] =
        observer
            .subs
            .try_into()
            .map_err(|_| fail("six subscriptions"))?;
    // The other state kinds, for what a restart should read back (`--restart`).
    let mut states = futures::stream::select(stage_sub.into_stream(), emb_sub.into_stream());
    if opts.restart {
        register_all(&observer.bus, opts.targets).await?;
    }
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
            shard,
            child,
            addr,
        });
    }

    let want = opts.targets as u64 * (opts.steps + 1);
    // A target's data is ready for its first (OFFLINE) round once this many episodes are stored.
    let offline_rows = if opts.restart {
        restart_rows
    } else {
        aware_meta_learner_trainer::learner::TrainerConfig::default().offline_min_transitions
    };
    let ready_after_episodes = offline_rows.div_ceil(spe.max(1)).max(1);
    let mut episodes: HashMap<Arc<str>, u64> = HashMap::new();
    // (target, global step) → when its `obs` arrived, and its `action`s.
    let mut sent: HashMap<(Arc<str>, u64), Instant> = HashMap::new();
    let mut actions: HashMap<(Arc<str>, u64), u32> = HashMap::new();
    let mut data_ready: HashMap<Arc<str>, Instant> = HashMap::new();
    let mut first_model: HashMap<Arc<str>, Duration> = HashMap::new();
    // The targets the bus carried a state message of each kind for.
    let mut seen: HashMap<EventKind, HashSet<Arc<str>>> = HashMap::new();
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
                let t = target_of(&m.subject);
                let n = episodes.entry(t.clone()).or_default();
                *n += 1;
                if *n >= ready_after_episodes {
                    data_ready.entry(t).or_insert_with(Instant::now);
                }
            }
            m = model_sub.next() => {
                let Some(m) = m else { break };
                let t = target_of(&m.subject);
                if let Some(ready) = data_ready.get(&t) {
                    first_model.entry(t).or_insert_with(|| ready.elapsed());
                }
                note(&mut seen, &m.subject);
            }
            m = states.next() => {
                let Some(m) = m else { break };
                note(&mut seen, &m.subject);
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
    let rss_loaded_by = rss_by(&procs)?;
    let rss_loaded: u64 = rss_loaded_by.values().sum();
    let resident_bytes_per_target_by_service: BTreeMap<String, f64> = rss_loaded_by
        .into_iter()
        .map(|(bin, loaded)| {
            let idle = rss_idle_by.get(&bin).copied().unwrap_or(0);
            let per = loaded.saturating_sub(idle) as f64 / opts.targets as f64;
            (bin, per)
        })
        .collect();
    let undecided_or_repeated = sent.keys().filter(|k| actions.get(*k) != Some(&1)).count() as u64
        + actions.keys().filter(|k| !sent.contains_key(*k)).count() as u64;

    // The recorders store every step of every target (each target's last `obs` has no next
    // one, so its transition waits): wait for them before reading the stores.
    let stored_want = opts.targets as u64 * opts.steps;
    let stored_deadline = Instant::now() + Duration::from_secs(120);
    let stored = |procs: &[Process]| {
        let [n] = sum_metrics(
            procs,
            "aware-trajectory-recorder",
            ["aware_recorder_transitions_stored_total"],
        );
        n as u64
    };
    while stored(&procs) < stored_want && Instant::now() < stored_deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let [replay_read] = sum_metrics(
        &procs,
        "aware-trajectory-recorder",
        ["aware_replay_messages_read_total"],
    );
    let (captured_messages, captured_bytes) = capture_size(&url, opts.partitions).await?;
    let mut cpu_s_by_service: BTreeMap<String, f64> = BTreeMap::new();
    for p in &procs {
        *cpu_s_by_service.entry(p.bin.to_string()).or_insert(0.0) += cpu_seconds(p.child.0.id())?;
    }
    let trainer_cpu_s = cpu_s_by_service
        .get("aware-meta-learner-trainer")
        .copied()
        .unwrap_or(0.0);
    let target_steps = (opts.targets as f64 * opts.steps as f64).max(1.0);
    let cpu_us_per_target_step_by_service = cpu_s_by_service
        .into_iter()
        .map(|(bin, s)| (bin, s * 1e6 / target_steps))
        .collect();
    let restarts = if opts.restart {
        if opts.rl {
            // The trainers' models: until every target has one, or none came for 30 s.
            let quiet = Duration::from_secs(30);
            loop {
                let have = seen.get(&EventKind::Model).map_or(0, HashSet::len);
                if have >= opts.targets {
                    break;
                }
                let m = tokio::select! {
                    m = model_sub.next() => m,
                    m = states.next() => m,
                    _ = tokio::time::sleep(quiet) => None,
                };
                let Some(m) = m else { break };
                note(&mut seen, &m.subject);
            }
            tracing::info!(
                models = seen.get(&EventKind::Model).map_or(0, HashSet::len),
                "restarting every service"
            );
        }
        let mut expected: HashMap<&str, u64> = seen
            .iter()
            .map(|(k, ts)| (k.as_str(), ts.len() as u64))
            .collect();
        expected.insert(EventKind::Target.as_str(), opts.targets as u64);
        expected.insert(EventKind::Obs.as_str(), opts.targets as u64);
        bins.push("aware-metrics-collector");
        let mut out = Vec::new();
        for &name in &bins {
            out.push(restart(opts, &mut procs, name, &url, &env, &expected).await?);
        }
        out
    } else {
        Vec::new()
    };
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
        resident_bytes_per_target_by_service,
        trainer_cpu_s,
        trainer_cpu_s_per_target_hour: trainer_cpu_s / (opts.targets as f64 * hours.max(1e-9)),
        cpu_us_per_target_step_by_service,
        first_model_after_s_p50: (!to_model.is_empty()).then(|| median(&to_model)),
        targets_with_a_model: to_model.len(),
        transitions_stored: transitions,
        store_bytes,
        store_bytes_per_transition: store_bytes as f64 / transitions.max(1) as f64,
        captured_messages,
        capture_bytes_per_target_step: captured_bytes as f64
            / (opts.targets as f64 * (opts.steps + 1) as f64).max(1.0),
        replay_read_per_captured: replay_read / captured_messages.max(1) as f64,
        restarts,
    })
}

/// Notes that the bus carried a message of its kind for the target of `subject`.
fn note(seen: &mut HashMap<EventKind, HashSet<Arc<str>>>, subject: &str) {
    if let Ok(p) = subject::parse(subject) {
        seen.entry(p.kind).or_default().insert(target_of(subject));
    }
}

/// Registers every simulated target (`opts.targets` apps, as the collectors make them) with the
/// default spec, as the controller does.
async fn register_all(bus: &aware_shared::bus::Bus, targets: usize) -> Result<(), BenchError> {
    let sim = aware_metrics_collector::config::SimulatorSourceConfig {
        apps: targets,
        ..Default::default()
    };
    let apps =
        aware_metrics_collector::simulator::build_apps(&sim).map_err(|e| fail(e.to_string()))?;
    let now = aware_bus_schemas::now_ms();
    for a in apps {
        let t = Target::new(a.namespace, a.name);
        // The spec a target known only from the bus gets: the run decides as without them.
        let spec = aware_shared::registry::to_registered(&TargetSpec::new(&t), None);
        let ev = Event::Registration(aware_shared::testkit::registration(&t, now, Some(spec)));
        let subj = subject::subject(EventKind::Target, &t).map_err(fail)?;
        let payload = encode_event(&ev).map_err(fail)?;
        bus.publish(&subj, bytes::Bytes::from(payload)).await?;
    }
    bus.flush().await?;
    Ok(())
}

/// Kills every shard's process of service `name` (SIGKILL, as a crash), starts them again at
/// once, and reads what each read back at start-up.
async fn restart(
    opts: &ScaleBenchOptions,
    procs: &mut [Process],
    name: &'static str,
    url: &str,
    env: &dyn Fn(u32) -> Vec<(&'static str, String)>,
    expected: &HashMap<&str, u64>,
) -> Result<RestartRun, BenchError> {
    let path = bin(opts, name)?;
    let mut shards = Vec::new();
    for p in procs.iter_mut().filter(|p| p.bin == name) {
        let _ = p.child.0.kill();
        let _ = p.child.0.wait();
        shards.push(p.shard);
    }
    let t0 = Instant::now();
    let started = futures::future::try_join_all(shards.into_iter().map(|shard| {
        let env = env(shard);
        let path = path.clone();
        async move {
            let (child, addr) = start_service(&path, url, &env, Duration::from_secs(120)).await?;
            Ok::<_, BenchError>((shard, child, addr, t0.elapsed()))
        }
    }))
    .await?;
    let mut ready_s = 0.0f64;
    for (shard, child, addr, took) in started {
        ready_s = ready_s.max(took.as_secs_f64());
        if let Some(p) = procs.iter_mut().find(|p| p.bin == name && p.shard == shard) {
            p.child = child;
            p.addr = addr;
        }
    }
    let mut kinds: BTreeMap<String, KindRestored> = BTreeMap::new();
    // A kind first seen in a process's metrics, with what the bus carried of it.
    let fresh = |kind: &str| KindRestored {
        restored: 0,
        expected: expected.get(kind).copied().unwrap_or(0),
        read_s: 0.0,
    };
    for p in procs.iter().filter(|p| p.bin == name) {
        let s = scrape::get(p.addr)?;
        for (k, v) in scrape::by_label(&s, "aware_state_restored_targets", "event") {
            let e = kinds.entry(k.clone()).or_insert_with(|| fresh(&k));
            e.restored += v as u64;
        }
        for (k, v) in scrape::by_label(&s, "aware_state_read_seconds", "event") {
            let e = kinds.entry(k.clone()).or_insert_with(|| fresh(&k));
            e.read_s = e.read_s.max(v);
        }
    }
    let recovered_all = !kinds.is_empty() && kinds.values().all(|k| k.restored == k.expected);
    let models = kinds
        .get(EventKind::Model.as_str())
        .map_or(0, |k| k.restored);
    let (mut weights_loaded_s, mut loaded, mut load_errors) = (None, 0, 0);
    if name == "aware-recommender" {
        let deadline = t0 + Duration::from_secs(60);
        while Instant::now() < deadline {
            let [ok, failed] = sum_metrics(
                procs,
                name,
                [
                    "aware_recommender_models_loaded_total",
                    "aware_recommender_model_load_errors_total",
                ],
            );
            (loaded, load_errors) = (ok as u64, failed as u64);
            if loaded >= models {
                weights_loaded_s = Some(t0.elapsed().as_secs_f64());
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tracing::info!(
        service = name,
        ready_s,
        recovered_all,
        ?weights_loaded_s,
        "restarted"
    );
    Ok(RestartRun {
        service: name.trim_start_matches("aware-").to_string(),
        ready_s,
        kinds,
        recovered_all,
        weights_loaded_s,
        models_loaded: loaded,
        model_load_errors: load_errors,
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
    if opts.partitions == 0 || opts.partitions > subject::SLOTS {
        return Err(fail(format!(
            "--partitions {} is not from 1 to {}",
            opts.partitions,
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
    let mut restart_ready_s = BTreeMap::new();
    if let Some(first) = runs.first() {
        for (i, r) in first.restarts.iter().enumerate() {
            let each: Vec<f64> = runs
                .iter()
                .filter_map(|run| run.restarts.get(i).map(|r| r.ready_s))
                .collect();
            restart_ready_s.insert(r.service.clone(), median(&each));
        }
    }
    Ok(ScaleReport {
        targets: opts.targets,
        shards: opts.shards,
        steps: opts.steps,
        rl: opts.rl,
        ack_publishes: opts.ack_publishes,
        partitions: opts.partitions,
        step_ms: opts.step_ms,
        spread: opts.spread,
        held_networks: opts.held_networks,
        processes: per_shard * opts.shards as usize,
        target_steps_per_s: m(|r| r.target_steps_per_s),
        obs_to_action_p99_ms: m(|r| r.obs_to_action_p99_ms),
        resident_bytes_per_target: m(|r| r.resident_bytes_per_target),
        resident_bytes_per_target_by_service: runs
            .first()
            .map(|first| {
                first
                    .resident_bytes_per_target_by_service
                    .keys()
                    .map(|bin| {
                        let each: Vec<f64> = runs
                            .iter()
                            .filter_map(|r| r.resident_bytes_per_target_by_service.get(bin))
                            .copied()
                            .collect();
                        (bin.clone(), median(&each))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        decided_exactly_once: runs.iter().all(|r| r.decided_exactly_once),
        trainer_cpu_s_per_target_hour: m(|r| r.trainer_cpu_s_per_target_hour),
        first_model_after_s_p50: (!models.is_empty()).then(|| median(&models)),
        store_bytes_per_transition: m(|r| r.store_bytes_per_transition),
        capture_bytes_per_target_step: m(|r| r.capture_bytes_per_target_step),
        replay_read_per_captured: m(|r| r.replay_read_per_captured),
        restart_ready_s,
        restart_recovered_all: opts.restart.then(|| {
            runs.iter()
                .all(|r| r.restarts.iter().all(|x| x.recovered_all))
        }),
        runs,
    })
}
