//! metrics-collector: reads metrics, computes each target's state and reward, publishes `obs`.
//!
//! Sources (`collector.source`): `simulator` (the simulated cluster, see `simulator`; cargo
//! feature `simulator`, on by default); `prometheus` (the Prometheus HTTP API, see
//! [`prometheus`]); `none` (idle). Built with `--no-default-features` the collector leaves the
//! simulator (`aware-loadgen`) out and refuses `collector.source: simulator`.

pub mod config;
pub mod metrics;
pub mod prometheus;
#[cfg(feature = "simulator")]
pub mod simulator;

use aware_bus_schemas::EventKind;
use aware_shared::launcher::ServiceEntry;
use aware_shared::service::{ServiceContext, ServiceError};
use config::{CollectorConfig, SourceKind};

pub const NAME: &str = "metrics-collector";
/// The simulator source consumes `applied` (the actuator's decisions).
pub const CONSUMES: &[EventKind] = &[EventKind::Applied];

/// `obs` a collector publishes at once: with acknowledged publishes (ADR 0022) each waits for
/// the stream's acknowledgement, and one at a time would wait a round trip per target.
pub const PUBLISHING: usize = 256;

/// Where in a window of `over` the `obs` of `target` goes: a fixed offset from a hash of its
/// name, so each target keeps its period from step to step and the targets spread evenly.
pub fn spread_offset(
    target: &aware_bus_schemas::Target,
    over: std::time::Duration,
) -> std::time::Duration {
    let h = aware_bus_schemas::subject::mixed_hash(&target.key());
    let unit = (h >> 11) as f64 / (1u64 << 53) as f64;
    over.mul_f64(unit)
}

/// Publishes a step's `obs`, up to [`PUBLISHING`] at once; with a non-zero `over` each at its
/// [`spread_offset`] from now instead of all at once. One `obs` per target, so no target's
/// messages are reordered. Failures are counted and logged by `publish`.
pub async fn publish_spread(
    ctx: &ServiceContext,
    obs: Vec<aware_bus_schemas::Obs>,
    over: std::time::Duration,
) {
    use futures::StreamExt;
    if over.is_zero() {
        // At once: no offsets to compute or sort, every step of every target.
        futures::stream::iter(&obs)
            .for_each_concurrent(PUBLISHING, |o| async move {
                let _ = ctx.publish(o).await;
            })
            .await;
        return;
    }
    let start = tokio::time::Instant::now();
    let mut timed: Vec<(std::time::Duration, aware_bus_schemas::Obs)> = obs
        .into_iter()
        .map(|o| (spread_offset(&o.target, over), o))
        .collect();
    timed.sort_by_key(|(at, _)| *at);
    futures::stream::iter(timed)
        .for_each_concurrent(PUBLISHING, |(at, obs)| async move {
            tokio::time::sleep_until(start + at).await;
            let _ = ctx.publish(&obs).await;
        })
        .await;
}

pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
    notice: Some(config::nothing_to_manage),
    sharded: true,
};

/// The names of the measurements of `m` that cannot be used: non-finite or negative values, and
/// limits that are not positive. An `obs` with any of them is published incomplete (no action is
/// taken on it), so a NaN never turns into a zero allocation downstream.
pub fn unusable_metrics(m: &aware_bus_schemas::RawMetrics) -> Vec<String> {
    let limits = [
        ("cpu_limit_cores", m.cpu_limit_cores),
        ("memory_limit_bytes", m.memory_limit_bytes),
    ];
    let values = [
        ("cpu_usage_cores", m.cpu_usage_cores),
        ("memory_working_set_bytes", m.memory_working_set_bytes),
        ("cpu_util", m.cpu_util),
        ("memory_util", m.memory_util),
        ("io_util", m.io_util),
        ("network_util", m.network_util),
        ("request_rate_rps", m.request_rate_rps),
        ("throughput_rps", m.throughput_rps),
        ("latency_p50_ms", m.latency_p50_ms.unwrap_or(0.0)),
        ("latency_p99_ms", m.latency_p99_ms.unwrap_or(0.0)),
    ];
    let bad_limit = limits
        .into_iter()
        .filter(|(_, v)| !(v.is_finite() && *v > 0.0));
    let bad_value = values
        .into_iter()
        .filter(|(_, v)| !(v.is_finite() && *v >= 0.0));
    bad_limit
        .chain(bad_value)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// The newest `obs` of every target in the JetStream capture (empty on the embedded bus, with
/// the capture off, or when nothing was captured yet).
pub async fn captured_obs(ctx: &ServiceContext) -> Vec<aware_bus_schemas::Obs> {
    ctx.current_state(EventKind::Obs)
        .await
        .into_iter()
        .filter_map(|ev| match ev {
            aware_bus_schemas::Event::Obs(o) => Some(o),
            _ => None,
        })
        .collect()
}

/// Where each target's numbering resumes: the global step after its newest captured `obs`
/// (`episode × steps_per_episode + step + 1`). A restarted collector continues its own sequence
/// from there instead of publishing episode 0 again, so the actuator (which decides only for the
/// step the collector reported last) keeps acting and no transition is recorded twice under one
/// key. Without a capture the numbering starts at 0.
pub fn resume_points(
    captured: &[aware_bus_schemas::Obs],
    steps_per_episode: u32,
) -> std::collections::HashMap<aware_bus_schemas::Target, u64> {
    let spe = u64::from(steps_per_episode.max(1));
    let mut out = std::collections::HashMap::new();
    for o in captured {
        let next = o
            .episode
            .saturating_mul(spe)
            .saturating_add(u64::from(o.step))
            .saturating_add(1);
        let e = out.entry(o.target.clone()).or_insert(0);
        *e = next.max(*e);
    }
    if !out.is_empty() {
        tracing::info!(
            targets = out.len(),
            "numbering resumed from the captured obs"
        );
    }
    out
}

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let cfg = CollectorConfig::read(&ctx.config)?;
    let metrics = metrics::CollectorMetrics::new(&ctx.metrics)?;
    match cfg.source {
        SourceKind::None => aware_shared::agents::run_intake(&ctx, &[]).await,
        #[cfg(feature = "simulator")]
        SourceKind::Simulator => {
            simulator::run(ctx, cfg.simulator, cfg.spread_fraction, metrics).await
        }
        #[cfg(not(feature = "simulator"))]
        SourceKind::Simulator => Err(aware_shared::config::ConfigError::Invalid {
            key: "collector.source".to_string(),
            reason: "this collector was built without the simulator source (cargo feature \
                     `simulator`)"
                .to_string(),
        }
        .into()),
        SourceKind::Prometheus => {
            prometheus::run(ctx, cfg.prometheus, cfg.spread_fraction, metrics).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_bus_schemas::generated::samples;
    use aware_bus_schemas::{Event, Obs, Target};

    fn obs(target: &Target, episode: u64, step: u32) -> Obs {
        let Some(Event::Obs(mut o)) = samples().into_iter().find(|e| e.kind() == EventKind::Obs)
        else {
            unreachable!()
        };
        (o.target, o.episode, o.step) = (target.clone(), episode, step);
        o
    }

    /// Offsets are fixed per target, inside the window, and spread evenly: each tenth of the
    /// window holds a tenth of 10,000 targets, give or take a fifth.
    #[test]
    fn spread_offsets_are_fixed_and_even() {
        let over = std::time::Duration::from_secs(10);
        let mut tenths = [0u32; 10];
        for i in 0..10_000 {
            let t = Target::new("sim", format!("app-{i:05}"));
            let at = spread_offset(&t, over);
            assert!(at < over);
            assert_eq!(at, spread_offset(&t, over));
            tenths[(at.as_secs_f64() / over.as_secs_f64() * 10.0) as usize] += 1;
        }
        assert!(
            tenths.iter().all(|&n| (800..=1200).contains(&n)),
            "{tenths:?}"
        );
        assert_eq!(
            spread_offset(&Target::new("sim", "a"), std::time::Duration::ZERO),
            std::time::Duration::ZERO
        );
    }

    /// Spread over 400 ms, a step's `obs` go out in the order of their offsets and take at
    /// least the span of their offsets (sleeps never end early).
    #[test]
    fn a_spread_step_publishes_in_offset_order_over_the_window() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let bus = aware_shared::bus::Bus::in_process(1024);
            let ctx = ServiceContext::new(
                NAME,
                bus.clone(),
                std::sync::Arc::new(aware_shared::config::AppConfig::default()),
                tokio_util::sync::CancellationToken::new(),
            )
            .unwrap();
            let mut sub = bus.subscribe("aware.v1.obs.>").await.unwrap();
            let targets: Vec<Target> = (0..200)
                .map(|i| Target::new("sim", format!("app-{i}")))
                .collect();
            let over = std::time::Duration::from_millis(400);
            let mut offsets: Vec<_> = targets.iter().map(|t| spread_offset(t, over)).collect();
            offsets.sort();
            let start = std::time::Instant::now();
            publish_spread(&ctx, targets.iter().map(|t| obs(t, 0, 0)).collect(), over).await;
            let took = start.elapsed();
            let mut got = Vec::new();
            while got.len() < targets.len() {
                let m = sub.next().await.unwrap();
                let parsed = aware_bus_schemas::subject::parse(&m.subject).unwrap();
                got.push(spread_offset(&parsed.target, over));
            }
            assert_eq!(got, offsets, "published in offset order");
            assert!(took >= offsets[offsets.len() - 1], "{took:?}");
            assert!(offsets[offsets.len() - 1] - offsets[0] > over / 2);
        });
    }

    /// Each target resumes right after its newest captured step (the newest per target wins),
    /// and a number near the top of the range saturates instead of wrapping to 0.
    #[test]
    fn numbering_resumes_after_the_newest_captured_step() {
        let (a, b, c) = (
            Target::new("sim", "a"),
            Target::new("sim", "b"),
            Target::new("sim", "c"),
        );
        let captured = [
            obs(&a, 38, 12),
            obs(&b, 0, 0),
            obs(&a, 37, 49),
            obs(&c, u64::MAX, 3),
        ];
        let r = resume_points(&captured, 50);
        assert_eq!(r[&a], 38 * 50 + 13);
        assert_eq!(r[&b], 1);
        assert_eq!(r[&c], u64::MAX);
        assert!(resume_points(&[], 50).is_empty());
    }
}
