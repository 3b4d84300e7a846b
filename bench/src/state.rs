//! `aware bench state`: how a restarted service recovers its targets' current state on NATS.
//!
//! A real `nats-server` with JetStream; the capture stream at `--capture-mib` (its size limit).
//! Every one of `--targets` targets gets a `target` registration, a `model` and a `lifecycle`
//! message, then `--telemetry-mib` of `obs` (the telemetry of a busy cluster) fill the capture,
//! which discards its oldest messages: the state among them. Each run then starts a service
//! context on a new connection, as a restarted service does, and reads the current state of the
//! three kinds (`ServiceContext::current_state`: the state bucket, filled in from the capture).
//! It reports, per kind, the targets recovered and the read time, and what the capture alone
//! still holds (what a service recovered before the state bucket).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aware_bus_schemas::{encode_event, subject, Event, EventKind, Target};
use aware_shared::bus::Bus;
use aware_shared::config::{AppConfig, BusConfig};
use aware_shared::service::ServiceContext;
use bytes::Bytes;
use serde::Serialize;

use super::{median, sample, BenchError};

/// The state kinds a restarted per-target service reads.
const KINDS: [EventKind; 3] = [EventKind::Target, EventKind::Model, EventKind::Lifecycle];

#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct StateBenchOptions {
    /// Targets whose state is published.
    #[arg(long, default_value_t = StateBenchOptions::default().targets)]
    pub targets: usize,
    /// Restarts timed (the median is reported).
    #[arg(long, default_value_t = StateBenchOptions::default().runs)]
    pub runs: usize,
    /// The capture stream's size limit, MiB (`bus.jetstream.max_bytes`).
    #[arg(long, default_value_t = StateBenchOptions::default().capture_mib)]
    pub capture_mib: u64,
    /// `obs` published after the state, MiB: more than the capture holds pushes the state out
    /// of it.
    #[arg(long, default_value_t = StateBenchOptions::default().telemetry_mib)]
    pub telemetry_mib: u64,
}

impl Default for StateBenchOptions {
    fn default() -> Self {
        StateBenchOptions {
            targets: 10_000,
            runs: 3,
            capture_mib: 64,
            telemetry_mib: 128,
        }
    }
}

/// One kind's recovery, medians over the runs.
#[derive(Debug, Clone, Serialize)]
pub struct KindRecovery {
    pub kind: String,
    /// Targets whose state the restarted service read (the smallest over the runs).
    pub recovered: usize,
    /// Targets whose newest message of the kind the capture alone still holds.
    pub in_capture: usize,
    pub read_s_median: f64,
    pub read_s_runs: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StateReport {
    pub targets: usize,
    pub runs: usize,
    pub capture_bytes: u64,
    pub telemetry_bytes: u64,
    /// Messages the capture held after the telemetry (it discards the oldest beyond its size).
    pub capture_messages: u64,
    pub kinds: Vec<KindRecovery>,
    /// All three kinds read, per restart: the median.
    pub restart_read_s_median: f64,
    /// Every target's state recovered in every run.
    pub all_recovered: bool,
}

/// `ev` (a sample) for `target`.
fn for_target(ev: &Event, target: &Target) -> Option<Event> {
    let mut ev = ev.clone();
    match &mut ev {
        Event::Registration(r) => r.target = target.clone(),
        Event::Model(m) => m.target = target.clone(),
        Event::Lifecycle(l) => l.target = target.clone(),
        Event::Obs(o) => o.target = target.clone(),
        _ => return None,
    }
    Some(ev)
}

async fn publish(bus: &Bus, ev: &Event) -> Result<(), BenchError> {
    let subj = subject::subject(ev.kind(), ev.target()).map_err(super::fail)?;
    let payload = encode_event(ev).map_err(super::fail)?;
    bus.publish(&subj, Bytes::from(payload)).await?;
    Ok(())
}

/// Targets whose newest `kind` message the capture `stream` holds.
async fn in_capture(url: &str, stream: &str, kind: EventKind) -> Result<usize, BenchError> {
    let client = async_nats::connect(url).await.map_err(super::fail)?;
    let js = async_nats::jetstream::new(client);
    let last =
        aware_shared::service::read_last_per_subject(&js, stream, &subject::kind_filter(kind))
            .await
            .map_err(super::fail)?;
    Ok(last
        .into_iter()
        .map(|(s, _)| s)
        .collect::<HashSet<_>>()
        .len())
}

pub async fn run(opts: &StateBenchOptions) -> Result<StateReport, BenchError> {
    if opts.targets == 0 || opts.runs == 0 {
        return Err(BenchError::Failed(
            "--targets and --runs must be at least 1".into(),
        ));
    }
    let server = aware_shared::testkit::NatsServer::start()?;
    let mut cfg = BusConfig {
        url: server.url(),
        channel_capacity: 65_536,
        ..BusConfig::default()
    };
    cfg.jetstream.max_bytes = i64::try_from(opts.capture_mib << 20).map_err(super::fail)?;
    let bus = Bus::connect(&cfg, "aware-bench-state").await?;
    let targets: Vec<Target> = (0..opts.targets)
        .map(|i| Target::new("bench", format!("app-{i:06}")))
        .collect();
    for kind in KINDS {
        let s = sample(kind)?;
        for t in &targets {
            if let Some(ev) = for_target(&s, t) {
                publish(&bus, &ev).await?;
            }
        }
    }
    let obs = sample(EventKind::Obs)?;
    let obs_bytes = encode_event(&obs).map_err(super::fail)?.len().max(1) as u64;
    let n_obs = (opts.telemetry_mib << 20) / obs_bytes;
    for i in 0..n_obs {
        let t = &targets[usize::try_from(i).unwrap_or(0) % targets.len()];
        if let Some(ev) = for_target(&obs, t) {
            publish(&bus, &ev).await?;
        }
    }
    bus.flush().await?;
    // Let the server store the last publishes before the capture is measured.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let capture_messages = {
        let client = async_nats::connect(server.url())
            .await
            .map_err(super::fail)?;
        let js = async_nats::jetstream::new(client);
        let mut s = js
            .get_stream(&cfg.jetstream.stream)
            .await
            .map_err(super::fail)?;
        s.info().await.map_err(super::fail)?.state.messages
    };
    let app = Arc::new(AppConfig {
        bus: cfg.clone(),
        ..AppConfig::default()
    });
    let mut reads: Vec<Vec<f64>> = vec![Vec::new(); KINDS.len()];
    let mut recovered = vec![usize::MAX; KINDS.len()];
    let mut totals = Vec::new();
    for run in 0..opts.runs {
        let restarted = Bus::connect(&cfg, &format!("aware-bench-state-{run}")).await?;
        let ctx = ServiceContext::new(
            "bench-state",
            restarted,
            app.clone(),
            tokio_util::sync::CancellationToken::new(),
        )?;
        let start = Instant::now();
        for (k, kind) in KINDS.into_iter().enumerate() {
            let t0 = Instant::now();
            let state = ctx.current_state(kind).await;
            reads[k].push(t0.elapsed().as_secs_f64());
            let distinct: HashSet<Target> = state.iter().map(|e| e.target().clone()).collect();
            recovered[k] = recovered[k].min(distinct.len());
        }
        totals.push(start.elapsed().as_secs_f64());
    }
    let mut kinds = Vec::new();
    for (k, kind) in KINDS.into_iter().enumerate() {
        kinds.push(KindRecovery {
            kind: kind.as_str().to_string(),
            recovered: recovered[k],
            in_capture: in_capture(&server.url(), &cfg.jetstream.stream, kind).await?,
            read_s_median: median(&reads[k]),
            read_s_runs: reads[k].clone(),
        });
    }
    Ok(StateReport {
        targets: opts.targets,
        runs: opts.runs,
        capture_bytes: opts.capture_mib << 20,
        telemetry_bytes: n_obs * obs_bytes,
        capture_messages,
        all_recovered: kinds.iter().all(|k| k.recovered == opts.targets),
        kinds,
        restart_read_s_median: median(&totals),
    })
}

/// The lines `aware bench state` prints.
pub fn summary(r: &StateReport) -> Vec<String> {
    let mut out = vec![format!(
        "{} targets; capture {} MiB holding {} messages after {} MiB of obs",
        r.targets,
        r.capture_bytes >> 20,
        r.capture_messages,
        r.telemetry_bytes >> 20
    )];
    for k in &r.kinds {
        out.push(format!(
            "{:>10}: recovered {} of {} (the capture alone holds {}); read median {:.2} s (runs {})",
            k.kind,
            k.recovered,
            r.targets,
            k.in_capture,
            k.read_s_median,
            k.read_s_runs
                .iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    out.push(format!(
        "restart: all three kinds read in {:.2} s (median); every target recovered: {}",
        r.restart_read_s_median, r.all_recovered
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small run on a real nats-server: the telemetry pushes the state out of a 1 MiB capture,
    /// and the restarted service still recovers every target's state from the state bucket.
    #[test]
    fn a_small_run_recovers_every_target_the_capture_lost() {
        let opts = StateBenchOptions {
            targets: 200,
            runs: 1,
            capture_mib: 1,
            telemetry_mib: 3,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let r = rt.block_on(run(&opts)).unwrap();
        assert!(r.all_recovered, "{r:?}");
        for k in &r.kinds {
            assert_eq!(k.recovered, 200, "{k:?}");
            assert!(k.in_capture < 200, "the capture kept everything: {k:?}");
        }
        assert_eq!(summary(&r).len(), 5);
    }
}
