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
        let r = m.registry();
        let steps = IntCounter::new("collector_sim_steps_total", "Simulated control steps taken")?;
        let late_targets = IntCounter::new(
            "collector_late_targets_total",
            "Targets stepped without their applied decision (kept their allocation)",
        )?;
        let scenarios_injected = IntCounter::new(
            "collector_scenarios_injected_total",
            "Scheduled instability scenarios that took effect in the simulated cluster",
        )?;
        let stale_applied = IntCounter::new(
            "collector_stale_applied_total",
            "applied messages for a step that was already over",
        )?;
        let targets = IntGauge::new("collector_source_targets", "Targets read by this collector")?;
        let prom_queries = IntCounter::new(
            "collector_prometheus_queries_total",
            "Prometheus instant queries sent",
        )?;
        let prom_query_errors = IntCounter::new(
            "collector_prometheus_query_errors_total",
            "Prometheus queries that failed (HTTP, timeout, API error, bad answer)",
        )?;
        let incomplete_obs = IntCounter::new(
            "collector_incomplete_obs_total",
            "obs published incomplete because metrics were missing or stale",
        )?;
        r.register(Box::new(prom_queries.clone()))?;
        r.register(Box::new(prom_query_errors.clone()))?;
        r.register(Box::new(incomplete_obs.clone()))?;
        r.register(Box::new(steps.clone()))?;
        r.register(Box::new(late_targets.clone()))?;
        r.register(Box::new(stale_applied.clone()))?;
        r.register(Box::new(scenarios_injected.clone()))?;
        r.register(Box::new(targets.clone()))?;
        Ok(CollectorMetrics {
            steps,
            late_targets,
            stale_applied,
            scenarios_injected,
            targets,
            prom_queries,
            prom_query_errors,
            incomplete_obs,
        })
    }
}
