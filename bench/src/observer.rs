//! The observer of the loop benchmarks: a client on the bus that sees every `obs` and `action`
//! (and any other kind asked for) and times a step from its `obs` to its `action`.

use std::sync::Arc;
use std::time::Instant;

use aware_bus_schemas::{subject, EventKind};
use aware_shared::bus::{Bus, Subscription};
use aware_shared::config::BusConfig;

use super::{fail, BenchError};

/// Subscriptions on a bus whose buffer holds a whole step of each kind (each step publishes one
/// message per target at once): a message it dropped would leave a run waiting for it.
pub struct Observer {
    pub bus: Bus,
    pub subs: Vec<Subscription>,
}

impl Observer {
    /// Connects to `bus` and subscribes to every target's `kinds`, in that order.
    pub async fn connect(
        bus: &BusConfig,
        targets: usize,
        kinds: &[EventKind],
    ) -> Result<Self, BenchError> {
        let mut cfg = bus.clone();
        cfg.channel_capacity = cfg.channel_capacity.max(2 * targets);
        let bus = Bus::connect(&cfg, "aware-bench-observer").await?;
        let mut subs = Vec::with_capacity(kinds.len());
        for &kind in kinds {
            subs.push(bus.subscribe(&subject::kind_filter(kind)).await?);
        }
        bus.flush().await?;
        Ok(Observer { bus, subs })
    }
}

/// The target of a subject, as its namespace and name tokens.
pub fn target_of(subject: &str) -> Arc<str> {
    Arc::from(
        subject
            .rsplitn(3, '.')
            .take(2)
            .collect::<Vec<_>>()
            .join("."),
    )
}

/// (target, global step) of a message, `steps_per_episode` steps to an episode.
pub fn step_of(subject: &str, payload: &[u8], steps_per_episode: u64) -> Option<(Arc<str>, u64)> {
    let ev = aware_bus_schemas::decode_any(payload).ok()?;
    Some((
        target_of(subject),
        ev.episode() * steps_per_episode + u64::from(ev.step()),
    ))
}

/// A histogram of nanoseconds from 1 ns to 10 minutes.
pub fn latency_histogram() -> Result<hdrhistogram::Histogram<u64>, BenchError> {
    hdrhistogram::Histogram::new_with_bounds(1, 600_000_000_000, 3).map_err(|e| fail(e.to_string()))
}

/// Records the time since `t0` in `h`, nanoseconds.
pub fn record_since(h: &mut hdrhistogram::Histogram<u64>, t0: Instant) {
    h.saturating_record(
        u64::try_from(t0.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1),
    );
}
