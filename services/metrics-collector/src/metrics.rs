//! The collector's own metrics (registered in the service's registry).

use aware_shared::telemetry::{ServiceMetrics, TelemetryError};
use prometheus::{IntCounter, IntGauge};

#[derive(Clone)]
pub struct CollectorMetrics {
    /// Control steps taken (simulated steps, or Prometheus evaluations).
    pub steps: IntCounter,
    /// Targets stepped without their `applied` (lock-step timeout or wall-clock tick).
    pub late_targets: IntCounter,
    /// `applied` messages for a step that is already over.
    pub stale_applied: IntCounter,
    /// Scheduled instability scenarios that took effect (`collector.simulator.injections`).
    pub scenarios_injected: IntCounter,
    /// Targets this collector reads.
    pub targets: IntGauge,
    /// Prometheus instant queries sent (source `prometheus`).
    pub prom_queries: IntCounter,
    /// Prometheus queries that failed (HTTP error, timeout, API error, undecodable answer).
    pub prom_query_errors: IntCounter,
    /// `obs` published incomplete (metrics missing or stale).
    pub incomplete_obs: IntCounter,
}

impl CollectorMetrics {
    pub fn new(m: &ServiceMetrics) -> Result<Self, TelemetryError> {
        Ok(CollectorMetrics {
            steps: m.counter("collector_sim_steps_total", "Simulated control steps taken")?,
            late_targets: m.counter(
                "collector_late_targets_total",
                "Targets stepped without their applied decision (kept their allocation)",
            )?,
            stale_applied: m.counter(
                "collector_stale_applied_total",
                "applied messages for a step that was already over",
            )?,
            scenarios_injected: m.counter(
                "collector_scenarios_injected_total",
                "Scheduled instability scenarios that took effect in the simulated cluster",
            )?,
            targets: m.gauge("collector_source_targets", "Targets read by this collector")?,
            prom_queries: m.counter(
                "collector_prometheus_queries_total",
                "Prometheus instant queries sent",
            )?,
            prom_query_errors: m.counter(
                "collector_prometheus_query_errors_total",
                "Prometheus queries that failed (HTTP, timeout, API error, bad answer)",
            )?,
            incomplete_obs: m.counter(
                "collector_incomplete_obs_total",
                "obs published incomplete because metrics were missing or stale",
            )?,
        })
    }
}
