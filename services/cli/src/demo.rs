//! `aware demo`: the main job on the embedded bus — a simulated cluster of apps (generated ones
//! plus hand-written ones on real traces) managed end to end by the six services, with live
//! per-app progress and a summary (also written as JSON).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aware_bus_schemas::{subject, Event, Stage, Target};
use aware_shared::bus::Bus;
use aware_shared::config::{AppConfig, SourceKind};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

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

#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Generated apps, in addition to the hand-written ones.
    pub generated_apps: usize,
    pub seed: u64,
    pub episodes: u64,
    pub steps_per_episode: u32,
    /// Print the progress table every this many steps.
    pub print_every: u32,
    pub out_dir: PathBuf,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            generated_apps: 3,
            seed: 7,
            episodes: 3,
            steps_per_episode: 100,
            print_every: 25,
            out_dir: PathBuf::from("demo-out"),
        }
    }
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
}

impl AppProgress {
    fn mean_reward(&self) -> f64 {
        if self.rewards == 0 {
            0.0
        } else {
            self.reward_sum / self.rewards as f64
        }
    }
}

fn write_demo_files(dir: &Path) -> Result<PathBuf, DemoError> {
    let io = |source, path: &Path| DemoError::Io {
        path: path.display().to_string(),
        source,
    };
    let apps_dir = dir.join("apps");
    let data_dir = dir.join("testdata");
    std::fs::create_dir_all(&apps_dir).map_err(|e| io(e, &apps_dir))?;
    std::fs::create_dir_all(&data_dir).map_err(|e| io(e, &data_dir))?;
    for (name, text) in TRACES {
        let p = data_dir.join(name);
        std::fs::write(&p, text).map_err(|e| io(e, &p))?;
    }
    let p = apps_dir.join("apps.yaml");
    std::fs::write(&p, APPS_YAML).map_err(|e| io(e, &p))?;
    Ok(p)
}

/// The configuration the demo runs the services with.
pub fn demo_config(opts: &DemoOptions, app_file: PathBuf) -> AppConfig {
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.collector.source = SourceKind::Simulator;
    cfg.collector.steps_per_episode = opts.steps_per_episode;
    let sim = &mut cfg.collector.simulator;
    sim.apps = opts.generated_apps;
    sim.seed = opts.seed;
    sim.app_files = vec![app_file];
    sim.max_steps = opts.episodes * u64::from(opts.steps_per_episode);
    cfg
}

fn print_table(out: &mut impl Write, apps: &BTreeMap<Target, AppProgress>) {
    let _ = writeln!(
        out,
        "{:<22} {:<9} {:>6} {:>4} {:>6} {:>7} {:>17} {:>7} {:>7}",
        "app", "stage", "step", "rep", "cpu(m)", "mem(Mi)", "p99 / SLO (ms)", "reward", "viol%"
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
        let _ = writeln!(
            out,
            "{:<22} {:<9} {:>6} {:>4} {:>6} {:>7} {:>17} {:>7.3} {:>6.1}%",
            t.name,
            a.stage.map_or("-", Stage::as_str),
            a.step,
            a.replicas,
            a.cpu_millicores,
            a.memory_mib,
            format!("{p99} / {slo}"),
            a.last_reward.unwrap_or(0.0),
            viol,
        );
    }
    let _ = writeln!(out);
}

/// Runs the demo to the end and returns the per-app summary.
pub async fn run(
    opts: &DemoOptions,
    out: &mut (impl Write + Send),
) -> Result<BTreeMap<Target, AppProgress>, DemoError> {
    let app_file = write_demo_files(&opts.out_dir)?;
    let mut cfg = demo_config(opts, app_file);
    let apps = aware_metrics_collector::simulator::build_apps(&cfg.collector.simulator)?;
    cfg.targets = aware_metrics_collector::simulator::target_specs(&apps);
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
    let total_steps = cfg.collector.simulator.max_steps;
    let spe = u64::from(opts.steps_per_episode.max(1));
    let bus = Bus::in_process(cfg.bus.channel_capacity);
    let mut sub = bus.subscribe(subject::ALL).await?;
    let shutdown = CancellationToken::new();
    aware_shared::service::cancel_on_signal(shutdown.clone());
    let _ = writeln!(
        out,
        "aware demo: {} apps on a simulated cluster, {} episodes × {} steps, embedded bus",
        progress.len(),
        opts.episodes,
        spe
    );
    let running =
        aware_shared::launcher::start_on(bus, Arc::new(cfg), &crate::SERVICES, shutdown.clone())
            .await?;
    let mut finished = 0usize;
    let mut last_printed = u64::MAX;
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            m = sub.next() => match m { Some(m) => m, None => break },
        };
        let Ok(parsed) = subject::parse(&msg.subject) else {
            continue;
        };
        let Ok(ev) = aware_bus_schemas::decode_event(parsed.kind, &msg.payload) else {
            continue;
        };
        let Some(a) = progress.get_mut(ev.target()) else {
            continue;
        };
        match ev {
            Event::Obs(o) => {
                let g = o.episode * spe + u64::from(o.step);
                a.step = g;
                a.replicas = o.metrics.replicas;
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
                if g >= total_steps {
                    finished += 1;
                }
                let all_at = progress.values().map(|p| p.step).min().unwrap_or(0);
                if all_at % u64::from(opts.print_every.max(1)) == 0 && all_at != last_printed {
                    last_printed = all_at;
                    print_table(out, &progress);
                }
                if finished >= progress.len() {
                    break;
                }
            }
            Event::Action(act) => match act.source {
                aware_bus_schemas::DecisionSource::Fallback => a.actions_fallback += 1,
                aware_bus_schemas::DecisionSource::Rl => a.actions_rl += 1,
            },
            Event::Lifecycle(l) => a.stage = Some(l.stage),
            Event::Episode(_) => a.episodes_recorded += 1,
            _ => {}
        }
    }
    shutdown.cancel();
    running.join().await?;
    let _ = writeln!(out, "summary after {total_steps} steps per app:");
    let _ = writeln!(
        out,
        "{:<22} {:<9} {:>11} {:>9} {:>9} {:>9} {:>10}",
        "app", "stage", "mean reward", "SLO viol", "cpu util", "mem util", "fallback/rl"
    );
    for (t, a) in &progress {
        let n = a.observations.max(1) as f64;
        let _ = writeln!(
            out,
            "{:<22} {:<9} {:>11.3} {:>8.1}% {:>8.1}% {:>8.1}% {:>5}/{}",
            t.name,
            a.stage.map_or("-", Stage::as_str),
            a.mean_reward(),
            100.0 * a.slo_violations as f64 / n,
            100.0 * a.cpu_util_sum / n,
            100.0 * a.memory_util_sum / n,
            a.actions_fallback,
            a.actions_rl,
        );
    }
    let report: BTreeMap<String, &AppProgress> =
        progress.iter().map(|(t, a)| (t.key(), a)).collect();
    let path = opts.out_dir.join("demo-summary.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
    )
    .map_err(|source| DemoError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let _ = writeln!(out, "wrote {}", path.display());
    Ok(progress)
}
