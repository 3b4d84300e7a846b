//! `aware bench trainer`: what the trainer costs while its targets wait for data, and with
//! `--learning` while they learn ([`run_learning`]: targets with their data stored get one more
//! transition per control interval; the trainer's cores, each target's gaps between models, and
//! the time from a target's data to its first model).
//!
//! A real `nats-server`; every one of `--targets` targets has a `lifecycle` state message at
//! ONLINE, and the trajectory store (SQLite) holds nothing, as for targets whose collector has
//! not started or whose workload is quiet. The trainer runs as its own process
//! (`aware-meta-learner-trainer`, next to this binary), once per arm:
//! - `every_look`: `trainer.recheck_ms` = `trainer.poll_ms`, so every look of every actor reads
//!   the store, as the trainer did before it followed `episode`;
//! - `event_driven`: the defaults: the store is read after an `episode` (none comes here), a
//!   stage change or a failed round, and every `recheck_ms` otherwise.
//!
//! Per arm it waits until the trainer has an actor for every target, lets it settle, then reads
//! the process's CPU time (`/proc/<pid>/stat`, user + system) over `--seconds` and its resident
//! memory. Cores = CPU seconds / wall seconds.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use aware_bus_schemas::{encode_event, subject, Event, EventKind, Stage, Target};
use aware_shared::bus::Bus;
use aware_shared::config::BusConfig;
use aware_shared::testkit::NatsServer;
use bytes::Bytes;
use serde::Serialize;

use super::process::{cpu_seconds, rss_bytes, service_bin, start_service};
use super::{fail, median, sample, BenchError};

#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct TrainerBenchOptions {
    /// Targets at ONLINE with an empty store.
    #[arg(long, default_value_t = TrainerBenchOptions::default().targets)]
    pub targets: usize,
    /// Wall-clock seconds over which the CPU time is measured, per run.
    #[arg(long, default_value_t = TrainerBenchOptions::default().seconds)]
    pub seconds: u64,
    /// Runs per arm (medians reported).
    #[arg(long, default_value_t = TrainerBenchOptions::default().runs)]
    pub runs: usize,
    /// Output directory (trainer.json; trainer-learning.json with --learning).
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Targets that learn instead of waiting: each starts with `trainer.min_transitions` rows
    /// stored and gets one more every --interval-ms; measures the first models, then the
    /// trainer's cores and each target's gaps between models over --seconds.
    #[arg(long)]
    pub learning: bool,
    /// --learning: each target's control interval (one transition stored per interval).
    #[arg(long, default_value_t = TrainerBenchOptions::default().interval_ms)]
    pub interval_ms: u64,
    /// --learning: the trainer's `trainer.train_every_ms` (default: the services' default).
    #[arg(long)]
    pub train_every_ms: Option<u64>,
    /// --learning: the trainer's `trainer.recheck_ms` (default: the services' default).
    #[arg(long)]
    pub recheck_ms: Option<u64>,
    /// --learning: the trainer's `trainer.held_networks` (default: the services' default).
    #[arg(long)]
    pub held_networks: Option<usize>,
    /// Where the trainer binary is (default: next to the running executable).
    #[arg(skip)]
    pub bin_dir: Option<PathBuf>,
}

impl Default for TrainerBenchOptions {
    fn default() -> Self {
        TrainerBenchOptions {
            targets: 5_000,
            seconds: 20,
            runs: 3,
            out: PathBuf::from("bench-out"),
            learning: false,
            interval_ms: 15_000,
            train_every_ms: None,
            recheck_ms: None,
            held_networks: None,
            bin_dir: None,
        }
    }
}

/// One arm's medians.
#[derive(Debug, Clone, Serialize)]
pub struct ArmReport {
    pub arm: String,
    /// `trainer.recheck_ms` of the arm.
    pub recheck_ms: u64,
    pub cores_median: f64,
    pub cores_runs: Vec<f64>,
    pub cpu_s_per_target_hour_median: f64,
    pub resident_bytes_median: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrainerReport {
    pub targets: usize,
    pub seconds: u64,
    pub runs: usize,
    pub poll_ms: u64,
    pub arms: Vec<ArmReport>,
}

/// The trainer's `/metrics`, parsed.
async fn scrape(addr: std::net::SocketAddr) -> Result<prometheus_parse::Scrape, BenchError> {
    tokio::task::spawn_blocking(move || crate::scrape::get(addr))
        .await
        .map_err(fail)?
}

/// The value of counter or gauge `name` in `s` (0 when absent).
fn metric(s: &prometheus_parse::Scrape, name: &str) -> f64 {
    crate::scrape::sum(s, name, |_| true)
}

/// The trainer binary: in `bin_dir` when set (a test's build directory), else next to the
/// running executable.
fn trainer_bin(opts: &TrainerBenchOptions) -> Result<PathBuf, BenchError> {
    service_bin(opts.bin_dir.as_deref(), "aware-meta-learner-trainer")
}

/// Publishes an ONLINE `lifecycle` for each target (the state the trainer reads at start-up).
async fn online(bus: &Bus, targets: &[Target]) -> Result<(), BenchError> {
    let Event::Lifecycle(sample) = sample(EventKind::Lifecycle)? else {
        return Err(fail("the lifecycle sample is not a lifecycle"));
    };
    for t in targets {
        let mut l = sample.clone();
        l.target = t.clone();
        l.stage = Stage::Online;
        l.previous = Some(Stage::Offline);
        l.rollback_to = None;
        let ev = Event::Lifecycle(l);
        let subj = subject::subject(ev.kind(), t).map_err(fail)?;
        bus.publish(&subj, Bytes::from(encode_event(&ev).map_err(fail)?))
            .await?;
    }
    bus.flush().await?;
    Ok(())
}

/// A `nats-server`, a bus on it, and `n` targets, each with an ONLINE `lifecycle` published.
async fn online_fleet(n: usize) -> Result<(NatsServer, Bus, Vec<Target>), BenchError> {
    let server = NatsServer::start()?;
    let cfg = BusConfig {
        url: server.url(),
        channel_capacity: 65_536,
        ..BusConfig::default()
    };
    let bus = Bus::connect(&cfg, "aware-bench-trainer").await?;
    let targets: Vec<Target> = (0..n)
        .map(|i| Target::new("bench", format!("app-{i:06}")))
        .collect();
    online(&bus, &targets).await?;
    Ok((server, bus, targets))
}

/// The trainer as its own process on `server`, for `targets` targets, its trajectory store
/// (`t.db`) and model store (`models/`) in `dir`, with the settings `env` besides.
async fn start_trainer(
    bin: &std::path::Path,
    server: &NatsServer,
    targets: usize,
    dir: &std::path::Path,
    env: &[(&str, String)],
) -> Result<(super::process::Child, std::net::SocketAddr), BenchError> {
    let max_targets = targets.max(aware_shared::config::ActorsConfig::default().max_targets);
    let mut all = vec![
        ("AWARE_ACTORS__MAX_TARGETS", max_targets.to_string()),
        (
            "AWARE_TRAJECTORY_STORE__SQLITE_PATH",
            dir.join("t.db").display().to_string(),
        ),
        (
            "AWARE_MODEL_STORE__DIR",
            dir.join("models").display().to_string(),
        ),
    ];
    all.extend(env.iter().cloned());
    start_service(bin, &server.url(), &all, Duration::from_secs(60)).await
}

/// One run of one arm: (cores, resident bytes).
async fn one_run(
    opts: &TrainerBenchOptions,
    recheck_ms: u64,
    bin: &std::path::Path,
) -> Result<(f64, u64), BenchError> {
    let (server, _bus, _) = online_fleet(opts.targets).await?;
    let dir = crate::scratch_dir("trainer");
    let _cleanup = aware_shared::testkit::TempDirGuard(dir.clone());
    let (child, addr) = start_trainer(
        bin,
        &server,
        opts.targets,
        &dir,
        &[("AWARE_TRAINER__RECHECK_MS", recheck_ms.to_string())],
    )
    .await?;
    // Every target's actor started.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = scrape(addr).await?;
        let n = metric(&s, "aware_targets");
        if n >= opts.targets as f64 {
            break;
        }
        if Instant::now() > deadline {
            let seen: Vec<String> = s
                .samples
                .iter()
                .filter(|x| x.metric.contains("target"))
                .map(|x| format!("{} {:?}", x.metric, x.value))
                .collect();
            return Err(fail(format!(
                "the trainer has {n} of {} targets after 120 s: {seen:?}",
                opts.targets
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Past the first look of every actor (which reads the store in both arms).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = child.0.id();
    let (c0, t0) = (cpu_seconds(pid)?, Instant::now());
    tokio::time::sleep(Duration::from_secs(opts.seconds.max(1))).await;
    let (c1, wall) = (cpu_seconds(pid)?, t0.elapsed().as_secs_f64());
    let rss = rss_bytes(pid)?;
    drop(child);
    drop(server);
    Ok(((c1 - c0) / wall, rss))
}

pub async fn run(opts: &TrainerBenchOptions) -> Result<TrainerReport, BenchError> {
    if opts.targets == 0 || opts.runs == 0 {
        return Err(fail("--targets and --runs must be at least 1"));
    }
    let bin = trainer_bin(opts)?;
    let defaults = aware_meta_learner_trainer::learner::TrainerConfig::default();
    let mut arms = Vec::new();
    for (arm, recheck_ms) in [
        ("every_look", defaults.poll_ms),
        ("event_driven", defaults.recheck_ms),
    ] {
        let (mut cores, mut rss) = (Vec::new(), Vec::new());
        for run in 0..opts.runs {
            let (c, r) = one_run(opts, recheck_ms, &bin).await?;
            tracing::info!(arm, run, cores = c, resident_bytes = r, "trainer bench run");
            cores.push(c);
            rss.push(r as f64);
        }
        let m = median(&cores);
        arms.push(ArmReport {
            arm: arm.to_string(),
            recheck_ms,
            cores_median: m,
            cores_runs: cores,
            cpu_s_per_target_hour_median: m * 3600.0 / opts.targets as f64,
            resident_bytes_median: median(&rss),
        });
    }
    Ok(TrainerReport {
        targets: opts.targets,
        seconds: opts.seconds,
        runs: opts.runs,
        poll_ms: defaults.poll_ms,
        arms,
    })
}

/// The lines `aware bench trainer` prints.
pub fn summary(r: &TrainerReport) -> Vec<String> {
    let mut out = vec![format!(
        "{} targets at ONLINE with an empty store; CPU over {} s, medians of {} runs",
        r.targets, r.seconds, r.runs
    )];
    for a in &r.arms {
        out.push(format!(
            "{:>12} (recheck {} ms): {:.3} cores (runs {}), {:.2} CPU-s per target-hour, {:.0} MiB resident",
            a.arm,
            a.recheck_ms,
            a.cores_median,
            a.cores_runs
                .iter()
                .map(|x| format!("{x:.3}"))
                .collect::<Vec<_>>()
                .join(", "),
            a.cpu_s_per_target_hour_median,
            a.resident_bytes_median / f64::from(1u32 << 20),
        ));
    }
    out
}

/// One `--learning` run.
#[derive(Debug, Clone, Serialize)]
pub struct LearningRun {
    /// From the trainer's start to each target's first model (every target's data is stored
    /// before it starts): median and slowest.
    pub first_model_after_s_p50: f64,
    pub first_model_after_s_max: f64,
    /// The joiners (a twentieth of the targets, at least one), whose data is stored during the
    /// window while the others learn: how many got a model in it, and the time from their data
    /// to their first model, median and slowest.
    pub joiners: usize,
    pub joiners_with_a_model: usize,
    pub joiner_first_model_after_s_p50: f64,
    pub joiner_first_model_after_s_max: f64,
    /// Over the measured window: the trainer's cores, its rounds and gradient steps per second.
    pub cores: f64,
    pub rounds_per_s: f64,
    pub gradient_steps_per_s: f64,
    /// Networks read back from their checkpoint for a round (targets beyond `held_networks`).
    pub network_reloads_per_s: f64,
    /// The longest time any target went without a new model in the window (counting from the
    /// window's start and up to its end), and the 99th percentile over targets.
    pub model_gap_max_s: f64,
    pub model_gap_p99_s: f64,
    /// Targets that got at least one model in the window.
    pub targets_learning: usize,
    pub resident_bytes: u64,
}

/// `--learning`: medians over the runs and every run.
#[derive(Debug, Clone, Serialize)]
pub struct LearningReport {
    pub targets: usize,
    pub interval_ms: u64,
    pub seconds: u64,
    pub train_every_ms: u64,
    pub recheck_ms: u64,
    /// `trainer.held_networks`: the targets beyond it read their network back each round.
    pub held_networks: usize,
    /// The gap a target learning as designed stays within: a round is due `train_every_ms`
    /// after the last with a new transition, which comes within `interval_ms`, and is seen at
    /// the next check, at most `recheck_ms` later.
    pub gap_bound_s: f64,
    /// Every run: every target learned in the window and none waited longer than the bound.
    pub keeps_up: bool,
    pub cores_median: f64,
    pub rounds_per_s_median: f64,
    pub network_reloads_per_s_median: f64,
    pub gradient_steps_per_s_median: f64,
    pub model_gap_max_s_median: f64,
    pub first_model_after_s_p50_median: f64,
    pub first_model_after_s_max_median: f64,
    pub joiner_first_model_after_s_p50_median: f64,
    pub joiner_first_model_after_s_max_median: f64,
    pub runs: Vec<LearningRun>,
}

/// A stored transition of `t` at `step` (finite, in the state's ranges), as the recorder writes.
fn learning_row(t: &Target, step: u32) -> aware_stores::trajectory::Transition {
    use aware_bus_schemas::{DecisionSource, Resources};
    let x = step as f32 * 0.37 + (subject::stable_hash(&t.key()) % 97) as f32;
    let state = |o: f32| -> Vec<f32> {
        (0..aware_mdp::STATE_DIM)
            .map(|j| 0.5 + 0.4 * (x + o + j as f32).sin())
            .collect()
    };
    let r = Resources {
        replicas: 3,
        cpu_millicores: 500,
        memory_bytes: 512 << 20,
    };
    aware_stores::trajectory::Transition {
        target: t.clone(),
        episode: u64::from(step / 20),
        step: step % 20,
        ts_ms: 1_700_000_000_000 + i64::from(step) * 15_000,
        state: state(0.0),
        action_raw: vec![0.3 * x.sin(), -0.2 * x.cos(), 0.1],
        desired: r,
        applied: r,
        source: DecisionSource::Rl,
        stage: Stage::Online,
        reward: f64::from(0.5 + 0.3 * x.cos()),
        next_state: state(0.37),
        slo_violation: false,
        cpu_util: 0.5,
        memory_util: 0.5,
    }
}

/// The trainer's rounds, gradient steps and networks read back so far, from one read of its
/// `/metrics`.
async fn round_counters(addr: std::net::SocketAddr) -> Result<(f64, f64, f64), BenchError> {
    let s = scrape(addr).await?;
    Ok((
        metric(&s, "aware_trainer_rounds_total"),
        metric(&s, "aware_trainer_gradient_steps_total"),
        metric(&s, "aware_trainer_network_reloads_total"),
    ))
}

/// One `--learning` run.
async fn learning_run(
    opts: &TrainerBenchOptions,
    bin: &std::path::Path,
) -> Result<LearningRun, BenchError> {
    use aware_stores::trajectory::{SqliteStore, TrajectoryStore};
    use std::collections::HashMap;
    use std::sync::Arc;
    let defaults = aware_meta_learner_trainer::learner::TrainerConfig::default();
    let (train_every_ms, recheck_ms) = learning_cadence(opts);
    let held_networks = held_networks(opts);
    let (server, bus, targets) = online_fleet(opts.targets).await?;
    let dir = crate::scratch_dir("trainer-learning");
    let _cleanup = aware_shared::testkit::TempDirGuard(dir.clone());
    std::fs::create_dir_all(&dir).map_err(fail)?;
    let store = Arc::new(SqliteStore::open_path(dir.join("t.db")).map_err(fail)?);
    // Every target's data is ready before the trainer starts, but the joiners': theirs comes
    // during the window, one after the other.
    let prefill = u32::try_from(defaults.min_transitions).map_err(fail)?;
    let joiners = (targets.len() / 20).max(1).min(targets.len());
    let first_joiner = targets.len() - joiners;
    for chunk in targets[..first_joiner].chunks(500) {
        store.append(&prefilled(chunk, prefill)).map_err(fail)?;
    }
    let mut models = bus
        .subscribe(&subject::kind_filter(EventKind::Model))
        .await?;
    let started = Instant::now();
    let (child, addr) = start_trainer(
        bin,
        &server,
        opts.targets,
        &dir,
        &[
            ("AWARE_TRAINER__TRAIN_EVERY_MS", train_every_ms.to_string()),
            ("AWARE_TRAINER__RECHECK_MS", recheck_ms.to_string()),
            ("AWARE_TRAINER__HELD_NETWORKS", held_networks.to_string()),
        ],
    )
    .await?;
    // From the trainer's start, one transition per target with data and interval, spread over
    // the interval in ticks of 250 ms. The joiners' data comes at even times over the window's
    // first half, each announced by an `episode` as the recorder does when it stores an
    // episode's last row.
    let window = Duration::from_secs(opts.seconds.max(1));
    let (window_start, window_started) = tokio::sync::watch::channel(None::<Instant>);
    let join_offset: Vec<Duration> = (0..joiners)
        .map(|j| window.mul_f64((j + 1) as f64 / (2 * (joiners + 1)) as f64))
        .collect();
    let joined = Arc::new(std::sync::Mutex::new(vec![None::<Instant>; joiners]));
    let feeding = tokio_util::sync::CancellationToken::new();
    let feeder = {
        let (store, targets, stop) = (store.clone(), targets.clone(), feeding.clone());
        let (bus, joined) = (bus.clone(), joined.clone());
        let ticks = (opts.interval_ms / 250).max(1) as usize;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            let mut next_step: Vec<u32> = vec![prefill; targets.len()];
            let mut live = first_joiner;
            for k in 0usize.. {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let mut rows: Vec<_> = (k % ticks..live)
                    .step_by(ticks)
                    .map(|i| {
                        next_step[i] += 1;
                        learning_row(&targets[i], next_step[i] - 1)
                    })
                    .collect();
                let now = Instant::now();
                let mut newly = Vec::new();
                let start = *window_started.borrow();
                while live < targets.len()
                    && start.is_some_and(|t0| t0 + join_offset[live - first_joiner] <= now)
                {
                    rows.extend(prefilled(&targets[live..=live], prefill));
                    newly.push(live);
                    live += 1;
                }
                let store = store.clone();
                let wrote = tokio::task::spawn_blocking(move || store.append(&rows)).await;
                if !matches!(wrote, Ok(Ok(()))) {
                    tracing::warn!("the bench could not store a tick's transitions");
                }
                for i in newly {
                    if let Ok(mut j) = joined.lock() {
                        j[i - first_joiner] = Some(Instant::now());
                    }
                    if announce(&bus, &targets[i], prefill).await.is_err() {
                        tracing::warn!("the bench could not announce a joiner's episode");
                    }
                }
            }
        })
    };
    // The feeding stops with the run, also when it fails.
    let _stop_feeding = feeding.clone().drop_guard();
    let index: HashMap<Target, usize> = targets.iter().cloned().zip(0..).collect();
    let target_of = |m: &aware_shared::bus::Message| {
        let parsed = subject::parse(&m.subject).ok()?;
        index.get(&parsed.target).copied()
    };
    // The first models of the targets whose data was there at the start.
    let mut has_model = vec![false; targets.len()];
    let mut first_after: Vec<f64> = Vec::with_capacity(first_joiner);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(900);
    while first_after.len() < first_joiner {
        let m = tokio::time::timeout_at(deadline, models.next())
            .await
            .map_err(|_| {
                fail(format!(
                    "{} of {first_joiner} targets got a first model within 900 s",
                    first_after.len(),
                ))
            })?
            .ok_or_else(|| fail("the bus closed"))?;
        if let Some(i) = target_of(&m).filter(|&i| !has_model[i]) {
            has_model[i] = true;
            first_after.push(started.elapsed().as_secs_f64());
        }
    }
    // The window.
    let t0 = Instant::now();
    window_start.send_replace(Some(t0));
    let pid = child.0.id();
    let (c0, (r0, g0, n0)) = (cpu_seconds(pid)?, round_counters(addr).await?);
    let mut gap_max: Vec<f64> = vec![0.0; targets.len()];
    let mut last: Vec<Option<Instant>> = vec![None; targets.len()];
    let mut joiner_first: Vec<Option<Instant>> = vec![None; joiners];
    let end = tokio::time::Instant::now() + window;
    while let Ok(Some(m)) = tokio::time::timeout_at(end, models.next()).await {
        let Some(i) = target_of(&m) else {
            continue;
        };
        let now = Instant::now();
        if i >= first_joiner && joiner_first[i - first_joiner].is_none() {
            // A joiner's first model: its time from the data is the joiner's figure, not a gap.
            joiner_first[i - first_joiner] = Some(now);
        } else {
            let since = last[i].unwrap_or(t0);
            gap_max[i] = gap_max[i].max(now.duration_since(since).as_secs_f64());
        }
        last[i] = Some(now);
    }
    let wall = t0.elapsed().as_secs_f64();
    let (c1, (r1, g1, n1)) = (cpu_seconds(pid)?, round_counters(addr).await?);
    let rss = rss_bytes(pid)?;
    feeding.cancel();
    let _ = feeder.await;
    let now = Instant::now();
    let joined = joined.lock().map(|j| j.clone()).unwrap_or_default();
    // A joiner's gaps count from its data, the others' from the window's start.
    for (i, (g, l)) in gap_max.iter_mut().zip(&last).enumerate() {
        let from = match i.checked_sub(first_joiner) {
            Some(j) => joined.get(j).copied().flatten().unwrap_or(now),
            None => t0,
        };
        let since = l.map_or(from, |l| l.max(from));
        *g = g.max(now.duration_since(since).as_secs_f64());
    }
    let mut joiner_after: Vec<f64> = joined
        .iter()
        .zip(&joiner_first)
        .filter_map(|(d, m)| Some(m.as_ref()?.duration_since((*d)?).as_secs_f64()))
        .collect();
    let targets_learning = last.iter().filter(|l| l.is_some()).count();
    drop(child);
    drop(server);
    let pick = |xs: &mut Vec<f64>, q: f64| {
        xs.sort_by(f64::total_cmp);
        xs.get(((xs.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let mut gaps = gap_max;
    Ok(LearningRun {
        first_model_after_s_p50: pick(&mut first_after, 0.5),
        first_model_after_s_max: pick(&mut first_after, 1.0),
        joiners,
        joiners_with_a_model: joiner_after.len(),
        joiner_first_model_after_s_p50: pick(&mut joiner_after, 0.5),
        joiner_first_model_after_s_max: pick(&mut joiner_after, 1.0),
        cores: (c1 - c0) / wall,
        rounds_per_s: (r1 - r0) / wall,
        network_reloads_per_s: (n1 - n0) / wall,
        gradient_steps_per_s: (g1 - g0) / wall,
        model_gap_max_s: pick(&mut gaps, 1.0),
        model_gap_p99_s: pick(&mut gaps, 0.99),
        targets_learning,
        resident_bytes: rss,
    })
}

/// `min_transitions` rows of each of `targets`: its data ready.
fn prefilled(targets: &[Target], rows: u32) -> Vec<aware_stores::trajectory::Transition> {
    targets
        .iter()
        .flat_map(|t| (0..rows).map(move |s| learning_row(t, s)))
        .collect()
}

/// The `episode` the recorder publishes once it stored the episode ending before `step`.
async fn announce(bus: &Bus, t: &Target, step: u32) -> Result<(), BenchError> {
    let Event::Episode(mut e) = sample(EventKind::Episode)? else {
        return Err(fail("the episode sample is not an episode"));
    };
    let last = learning_row(t, step.saturating_sub(1));
    e.target = t.clone();
    e.episode = last.episode;
    e.step = last.step;
    e.stage = Stage::Online;
    let ev = Event::Episode(e);
    let subj = subject::subject(ev.kind(), t).map_err(fail)?;
    bus.publish(&subj, Bytes::from(encode_event(&ev).map_err(fail)?))
        .await?;
    Ok(())
}

/// `trainer.held_networks` of a `--learning` run.
fn held_networks(opts: &TrainerBenchOptions) -> usize {
    opts.held_networks
        .unwrap_or(aware_meta_learner_trainer::learner::TrainerConfig::default().held_networks)
}

/// `trainer.train_every_ms` and `trainer.recheck_ms` of a `--learning` run.
fn learning_cadence(opts: &TrainerBenchOptions) -> (u64, u64) {
    let d = aware_meta_learner_trainer::learner::TrainerConfig::default();
    (
        opts.train_every_ms.unwrap_or(d.train_every_ms),
        opts.recheck_ms.unwrap_or(d.recheck_ms),
    )
}

/// `aware bench trainer --learning`.
pub async fn run_learning(opts: &TrainerBenchOptions) -> Result<LearningReport, BenchError> {
    if opts.targets == 0 || opts.runs == 0 || opts.interval_ms == 0 {
        return Err(fail(
            "--targets, --runs and --interval-ms must be at least 1",
        ));
    }
    let bin = trainer_bin(opts)?;
    let (train_every_ms, recheck_ms) = learning_cadence(opts);
    let held_networks = held_networks(opts);
    let gap_bound_s = (train_every_ms + opts.interval_ms + recheck_ms) as f64 / 1000.0;
    let mut runs = Vec::new();
    for run in 0..opts.runs {
        let r = learning_run(opts, &bin).await?;
        tracing::info!(
            run,
            cores = r.cores,
            rounds_per_s = r.rounds_per_s,
            gap_max_s = r.model_gap_max_s,
            "trainer learning run"
        );
        runs.push(r);
    }
    let med = |f: fn(&LearningRun) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    Ok(LearningReport {
        targets: opts.targets,
        interval_ms: opts.interval_ms,
        seconds: opts.seconds,
        train_every_ms,
        held_networks,
        recheck_ms,
        gap_bound_s,
        keeps_up: runs.iter().all(|r| {
            r.targets_learning == opts.targets
                && r.model_gap_max_s <= gap_bound_s
                && r.joiners_with_a_model == r.joiners
        }),
        cores_median: med(|r| r.cores),
        rounds_per_s_median: med(|r| r.rounds_per_s),
        network_reloads_per_s_median: med(|r| r.network_reloads_per_s),
        gradient_steps_per_s_median: med(|r| r.gradient_steps_per_s),
        model_gap_max_s_median: med(|r| r.model_gap_max_s),
        first_model_after_s_p50_median: med(|r| r.first_model_after_s_p50),
        first_model_after_s_max_median: med(|r| r.first_model_after_s_max),
        joiner_first_model_after_s_p50_median: med(|r| r.joiner_first_model_after_s_p50),
        joiner_first_model_after_s_max_median: med(|r| r.joiner_first_model_after_s_max),
        runs,
    })
}

/// The lines `aware bench trainer --learning` prints.
pub fn learning_summary(r: &LearningReport) -> Vec<String> {
    let mut out = vec![format!(
        "{} ONLINE targets learning, one transition each per {} ms; window {} s; medians of {} runs",
        r.targets,
        r.interval_ms,
        r.seconds,
        r.runs.len()
    )];
    for (i, x) in r.runs.iter().enumerate() {
        out.push(format!(
            "run {i}: first model p50 {:.1} s, max {:.1} s; joiners' first model after their data p50 {:.1} s, max {:.1} s ({} of {}); {:.3} cores, {:.1} rounds/s, {:.0} gradient steps/s, {:.1} networks read back/s; longest gap between models {:.1} s (p99 {:.1} s); {} of {} targets learned; {:.0} MiB resident",
            x.first_model_after_s_p50,
            x.first_model_after_s_max,
            x.joiner_first_model_after_s_p50,
            x.joiner_first_model_after_s_max,
            x.joiners_with_a_model,
            x.joiners,
            x.cores,
            x.rounds_per_s,
            x.gradient_steps_per_s,
            x.network_reloads_per_s,
            x.model_gap_max_s,
            x.model_gap_p99_s,
            x.targets_learning,
            r.targets,
            x.resident_bytes as f64 / f64::from(1u32 << 20),
        ));
    }
    out.push(format!(
        "median: {:.3} cores; first model p50 {:.1} s (max {:.1} s), a joiner's after its data p50 {:.1} s (max {:.1} s); longest gap {:.1} s against a bound of {:.0} s: {}",
        r.cores_median,
        r.first_model_after_s_p50_median,
        r.first_model_after_s_max_median,
        r.joiner_first_model_after_s_p50_median,
        r.joiner_first_model_after_s_max_median,
        r.model_gap_max_s_median,
        r.gap_bound_s,
        if r.keeps_up { "keeps up" } else { "falls behind" }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_metric_labelled_or_not() {
        let parse = |text| crate::scrape::parse(text).unwrap();
        let text = parse("# HELP aware_targets x\naware_targets_retired 1\naware_targets 42\n");
        assert_eq!(metric(&text, "aware_targets"), 42.0);
        let labelled =
            parse("aware_targets_retired{service=\"t\"} 1\naware_targets{service=\"t\"} 7\n");
        assert_eq!(metric(&labelled, "aware_targets"), 7.0);
        assert_eq!(metric(&text, "aware_missing"), 0.0);
        let me = std::process::id();
        let c = cpu_seconds(me).unwrap();
        assert!(c >= 0.0 && c.is_finite());
        assert!(rss_bytes(me).unwrap() > 0);
    }
}
