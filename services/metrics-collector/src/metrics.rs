//! The collector's own metrics (registered in the service's registry).

use aware_shared::telemetry::{ServiceMetrics, TelemetryError};
use prometheus::{IntCounter, IntGauge};

#[derive(Clone)]
pub struct CollectorMetrics {
    /// Simulated steps taken.
    pub steps: IntCounter,
    /// Targets stepped without their `applied` (lock-step timeout or wall-clock tick).
    pub late_targets: IntCounter,
    /// `applied` messages for a step that is already over.
    pub stale_applied: IntCounter,
    /// Targets this collector reads.
    pub targets: IntGauge,
}

impl CollectorMetrics {
    pub fn new(m: &ServiceMetrics) -> Result<Self, TelemetryError> {
        let r = m.registry();
        let steps = IntCounter::new("collector_sim_steps_total", "Simulated control steps taken")?;
        let late_targets = IntCounter::new(
            "collector_late_targets_total",
            "Targets stepped without their applied decision (kept their allocation)",
        )?;
        let stale_applied = IntCounter::new(
            "collector_stale_applied_total",
            "applied messages for a step that was already over",
        )?;
        let targets = IntGauge::new("collector_source_targets", "Targets read by this collector")?;
        r.register(Box::new(steps.clone()))?;
        r.register(Box::new(late_targets.clone()))?;
        r.register(Box::new(stale_applied.clone()))?;
        r.register(Box::new(targets.clone()))?;
        Ok(CollectorMetrics {
            steps,
            late_targets,
            stale_applied,
            targets,
        })
    }
}
