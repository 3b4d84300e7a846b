//! `aware bench loop`: the control loop end to end over NATS (a real `nats-server`, JetStream
//! capture on), lock-step, on the fallback policy.
//!
//! The recommender runs as its own process (`aware-recommender`, next to this binary) so its
//! resident memory can be read from `/proc`; the other five services run in this process on
//! their own NATS connection. Figures per run:
//! - target-steps/s: targets × steps / (time between the first and the last `obs`), as seen by an
//!   observer subscribed to the bus;
//! - obs→action latency: from the observer receiving a step's `obs` to it receiving the `action`
//!   (bus hops and queueing behind the step's burst of `obs` included);
//! - decision time: the recommender's own histogram (`obs` reaching the actor → `action` queued);
//! - resident memory per target: the recommender's RSS growth from ready-and-idle to managing
//!   every target, divided by the number of targets.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aware_bus_schemas::EventKind;
use aware_metrics_collector::config::{CollectorConfig, SourceKind};
use aware_shared::config::AppConfig;
use aware_shared::probe::{bucket_quantile, histogram_buckets, http_get};
use aware_shared::testkit::NatsServer;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::observer::{latency_histogram, record_since, step_of, Observer};
use super::process::{rss_bytes, sibling_bin, start_service};
use super::{median, BenchError};

#[derive(Debug, Clone, clap::Args)]
pub struct LoopBenchOptions {
    #[arg(long, default_value_t = LoopBenchOptions::default().targets)]
    pub targets: usize,
    #[arg(long, default_value_t = LoopBenchOptions::default().steps)]
    pub steps: u64,
    #[arg(long, default_value_t = LoopBenchOptions::default().runs)]
    pub runs: usize,
    /// The recommender binary (default: `aware-recommender` next to the running executable).
    #[arg(skip)]
    pub recommender_bin: Option<PathBuf>,
}

impl Default for LoopBenchOptions {
    fn default() -> Self {
        LoopBenchOptions {
            targets: 1000,
            steps: 30,
            runs: 3,
            recommender_bin: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LoopRun {
    pub target_steps_per_s: f64,
    pub obs_to_action_p50_us: f64,
    pub obs_to_action_p99_us: f64,
    pub decision_p50_us: f64,
    pub decision_p99_us: f64,
    pub recommender_rss_idle_bytes: u64,
    pub recommender_rss_loaded_bytes: u64,
    pub rss_per_target_bytes: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoopReport {
    pub targets: usize,
    pub steps: u64,
    pub runs: Vec<LoopRun>,
    pub median_target_steps_per_s: f64,
    pub median_obs_to_action_p99_us: f64,
    pub median_decision_p50_us: f64,
    pub median_decision_p99_us: f64,
    pub median_rss_per_target_bytes: f64,
}

fn recommender_bin(opts: &LoopBenchOptions) -> Result<PathBuf, BenchError> {
    match &opts.recommender_bin {
        Some(b) => Ok(b.clone()),
        None => sibling_bin("aware-recommender"),
    }
}

async fn one_run(opts: &LoopBenchOptions) -> Result<LoopRun, BenchError> {
    let server = NatsServer::start()?;
    let bin = recommender_bin(opts)?;
    // Every service takes every target, however many the run has (`actors.max_targets`).
    let max_targets = opts
        .targets
        .max(aware_shared::config::ActorsConfig::default().max_targets);
    let (child, addr) = start_service(
        &bin,
        &server.url(),
        &[("AWARE_ACTORS__MAX_TARGETS", max_targets.to_string())],
        Duration::from_secs(20),
    )
    .await?;
    let pid = child.0.id();
    let rss_idle = rss_bytes(pid)?;

    let mut cfg = AppConfig::default();
    cfg.bus.url = server.url();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.actors.max_targets = max_targets;
    let mut collector = CollectorConfig {
        source: SourceKind::Simulator,
        ..CollectorConfig::default()
    };
    collector.simulator.apps = opts.targets;
    collector.simulator.max_steps = opts.steps;
    collector.simulator.step_timeout_ms = 30_000;
    cfg.set_section("collector", &collector)?;
    let dir = crate::scratch_dir("loop");
    let _cleanup = aware_shared::testkit::TempDirGuard(dir.clone());
    cfg.sections.insert(
        "trajectory_store".into(),
        serde_json::json!({ "sqlite_path": dir.join("t.db").display().to_string() }),
    );
    let observer =
        Observer::connect(&cfg.bus, opts.targets, &[EventKind::Obs, EventKind::Action]).await?;
    let [mut obs_sub, mut act_sub]: [_; 2] = observer
        .subs
        .try_into()
        .map_err(|_| BenchError::Failed("two subscriptions".into()))?;
    let shutdown = CancellationToken::new();
    let others: Vec<_> = aware_harness::SERVICES
        .iter()
        .copied()
        .filter(|e| e.name != aware_recommender::NAME)
        .collect();
    let running = aware_shared::launcher::start(Arc::new(cfg), &others, shutdown.clone()).await?;

    let want_obs = opts.targets as u64 * (opts.steps + 1);
    let want_actions = want_obs;
    let mut sent: HashMap<(Arc<str>, u64), Instant> = HashMap::new();
    let mut lat = latency_histogram()?;
    let (mut n_obs, mut n_act) = (0u64, 0u64);
    let (mut first, mut last) = (None, Instant::now());
    let spe = u64::from(aware_shared::config::LearningConfig::default().steps_per_episode);
    let key = |subj: &str, payload: &[u8]| step_of(subj, payload, spe);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while n_obs < want_obs || n_act < want_actions {
        tokio::select! {
            m = obs_sub.next() => {
                let Some(m) = m else { break };
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                n_obs += 1;
                if let Some(k) = key(&m.subject, &m.payload) {
                    sent.insert(k, now);
                }
            }
            m = act_sub.next() => {
                let Some(m) = m else { break };
                n_act += 1;
                if let Some(k) = key(&m.subject, &m.payload) {
                    if let Some(t0) = sent.remove(&k) {
                        record_since(&mut lat, t0);
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                return Err(BenchError::Failed(format!("timed out: {n_obs}/{want_obs} obs, {n_act}/{want_actions} actions")));
            }
        }
    }
    let elapsed = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let rss_loaded = rss_bytes(pid)?;
    let text = tokio::task::spawn_blocking(move || http_get(addr, "/metrics"))
        .await
        .map_err(|e| BenchError::Failed(e.to_string()))?
        .map_err(|source| BenchError::Io {
            path: format!("http://{addr}/metrics"),
            source,
        })?
        .1;
    let buckets = histogram_buckets(&text, "aware_recommender_decision_seconds");
    let q = |p| bucket_quantile(&buckets, p).map_or(f64::NAN, |s| s * 1e6);
    shutdown.cancel();
    running.join().await?;
    drop(child);
    drop(server);
    Ok(LoopRun {
        target_steps_per_s: opts.targets as f64 * opts.steps as f64 / elapsed.max(1e-9),
        obs_to_action_p50_us: lat.value_at_quantile(0.5) as f64 / 1000.0,
        obs_to_action_p99_us: lat.value_at_quantile(0.99) as f64 / 1000.0,
        decision_p50_us: q(0.5),
        decision_p99_us: q(0.99),
        recommender_rss_idle_bytes: rss_idle,
        recommender_rss_loaded_bytes: rss_loaded,
        rss_per_target_bytes: rss_loaded.saturating_sub(rss_idle) as f64 / opts.targets as f64,
    })
}

/// Runs the benchmark `opts.runs` times and reports medians.
pub async fn run(opts: &LoopBenchOptions) -> Result<LoopReport, BenchError> {
    let mut runs = Vec::new();
    for i in 0..opts.runs.max(1) {
        let r = one_run(opts).await?;
        tracing::info!(
            run = i,
            steps_per_s = r.target_steps_per_s,
            "loop bench run"
        );
        runs.push(r);
    }
    let m = |f: fn(&LoopRun) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    Ok(LoopReport {
        targets: opts.targets,
        steps: opts.steps,
        median_target_steps_per_s: m(|r| r.target_steps_per_s),
        median_obs_to_action_p99_us: m(|r| r.obs_to_action_p99_us),
        median_decision_p50_us: m(|r| r.decision_p50_us),
        median_decision_p99_us: m(|r| r.decision_p99_us),
        median_rss_per_target_bytes: m(|r| r.rss_per_target_bytes),
        runs,
    })
}
