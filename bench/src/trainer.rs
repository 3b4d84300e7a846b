//! `aware bench trainer`: what the trainer costs while its targets wait for data.
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

use aware_bus_schemas::{
    encode_event, generated::samples, subject, Event, EventKind, Stage, Target,
};
use aware_shared::bus::Bus;
use aware_shared::config::BusConfig;
use aware_shared::probe::http_get;
use aware_shared::testkit::NatsServer;
use bytes::Bytes;
use serde::Serialize;

use super::process::{cpu_seconds, rss_bytes, sibling_bin, start_service};
use super::{fail, median, BenchError};

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
    /// Output directory (trainer.json).
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

impl Default for TrainerBenchOptions {
    fn default() -> Self {
        TrainerBenchOptions {
            targets: 5_000,
            seconds: 20,
            runs: 3,
            out: PathBuf::from("bench-out"),
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

/// The value of metric `name` (its first series, labelled or not) in a Prometheus text
/// exposition.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            return None;
        }
        rest.rsplit(' ').next()?.trim().parse().ok()
    })
}

/// Publishes an ONLINE `lifecycle` for each target (the state the trainer reads at start-up).
async fn online(bus: &Bus, targets: &[Target]) -> Result<(), BenchError> {
    let Some(Event::Lifecycle(sample)) = samples()
        .into_iter()
        .find(|e| e.kind() == EventKind::Lifecycle)
    else {
        return Err(fail("no lifecycle sample"));
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

/// One run of one arm: (cores, resident bytes).
async fn one_run(
    opts: &TrainerBenchOptions,
    recheck_ms: u64,
    bin: &std::path::Path,
) -> Result<(f64, u64), BenchError> {
    let server = NatsServer::start()?;
    let cfg = BusConfig {
        url: server.url(),
        channel_capacity: 65_536,
        ..BusConfig::default()
    };
    let bus = Bus::connect(&cfg, "aware-bench-trainer").await?;
    let targets: Vec<Target> = (0..opts.targets)
        .map(|i| Target::new("bench", format!("app-{i:06}")))
        .collect();
    online(&bus, &targets).await?;
    let dir = std::env::temp_dir().join(format!(
        "aware-bench-trainer-{}-{recheck_ms}",
        std::process::id()
    ));
    let _cleanup = aware_shared::testkit::TempDirGuard(dir.clone());
    let max_targets = opts
        .targets
        .max(aware_shared::config::ActorsConfig::default().max_targets);
    let (child, addr) = start_service(
        bin,
        &server.url(),
        &[
            ("AWARE_ACTORS__MAX_TARGETS", max_targets.to_string()),
            ("AWARE_TRAINER__RECHECK_MS", recheck_ms.to_string()),
            (
                "AWARE_TRAJECTORY_STORE__SQLITE_PATH",
                dir.join("t.db").display().to_string(),
            ),
            (
                "AWARE_MODEL_STORE__DIR",
                dir.join("models").display().to_string(),
            ),
        ],
        Duration::from_secs(60),
    )
    .await?;
    // Every target's actor started.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = tokio::task::spawn_blocking(move || http_get(addr, "/metrics"))
            .await
            .map_err(fail)?
            .map_err(fail)?
            .1;
        let n = metric(&text, "aware_targets").unwrap_or(0.0);
        if n >= opts.targets as f64 {
            break;
        }
        if Instant::now() > deadline {
            let seen: Vec<&str> = text.lines().filter(|l| l.contains("target")).collect();
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
    let bin = sibling_bin("aware-meta-learner-trainer")?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_metric_labelled_or_not() {
        let text = "# HELP aware_targets x\naware_targets_retired 1\naware_targets 42\n";
        assert_eq!(metric(text, "aware_targets"), Some(42.0));
        let labelled = "aware_targets_retired{service=\"t\"} 1\naware_targets{service=\"t\"} 7\n";
        assert_eq!(metric(labelled, "aware_targets"), Some(7.0));
        assert_eq!(metric(text, "aware_missing"), None);
        let me = std::process::id();
        let c = cpu_seconds(me).unwrap();
        assert!(c >= 0.0 && c.is_finite());
        assert!(rss_bytes(me).unwrap() > 0);
    }
}
