//! What a metrics collector measures, the SLO, and the two ratios the reward is made of: SLO
//! preservation and utilization.

use serde::{Deserialize, Serialize};

/// The raw measurements behind a state vector, in physical units.
//
// The `obs` message's `metrics`: field names, order and docs are its wire form and JSON Schema.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RawMetrics {
    /// Pods running (created and not yet deleted): what utilization is shared over. After a
    /// scale this lags the Deployment's `spec.replicas` until the pods are created or removed.
    pub replicas: u32,
    pub ready_replicas: u32,
    /// CPU per replica of the allocation in force, cores: what the agent sets, the request (the
    /// simulator reports it; the collector's Prometheus source reads kube-state-metrics'
    /// `kube_pod_container_resource_requests`). The name is the wire field's, from when the
    /// allocation was the limit.
    pub cpu_limit_cores: f64,
    /// Memory per replica of the allocation in force, bytes (as `cpu_limit_cores`).
    pub memory_limit_bytes: f64,
    /// CPU used, summed over replicas, cores.
    pub cpu_usage_cores: f64,
    /// Memory working set, summed over replicas, bytes.
    pub memory_working_set_bytes: f64,
    /// Utilizations of the allocated resources, in [0, 1].
    pub cpu_util: f64,
    pub memory_util: f64,
    pub io_util: f64,
    pub network_util: f64,
    /// Offered load, requests per second.
    pub request_rate_rps: f64,
    /// Completed requests per second.
    pub throughput_rps: f64,
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    /// Containers killed for exceeding their memory limit during the step.
    pub oom_kills: u32,
    /// The replica count in force: the Deployment's `spec.replicas` (what the last scale
    /// set), which `replicas` reaches only once the pods exist. Absent = not read (`replicas`
    /// stands in). Added to `obs/1` without a version bump: a message without it reads as
    /// absent, a reader that does not know it ignores it, and it is left out of the encoding
    /// when absent (such an observation encodes as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_replicas: Option<u32>,
    /// Replicas of the Deployment that no node has room for (Pending), when the source reads
    /// it: the simulator with a shared cluster does. Absent = not read. Added to `obs/1` like
    /// `spec_replicas`: absent, the observation encodes as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_replicas: Option<u32>,
}

impl RawMetrics {
    /// The replica count in force: `spec_replicas`, else (not read) the pods running.
    pub fn replicas_in_force(&self) -> u32 {
        self.spec_replicas.unwrap_or(self.replicas)
    }
}

/// Service-level objective used for SLO preservation and violations. Both may be set; none
/// means best-effort (nothing to violate; SP is the share of the offered load served).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Slo {
    /// p99 latency objective, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_p99_ms: Option<f64>,
    /// Throughput objective, requests/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput_rps: Option<f64>,
    /// The error budget's objective: the fraction of control intervals that must meet the SLO,
    /// in (0, 1); unset = [`DEFAULT_OBJECTIVE`]. Only meaningful with a latency or throughput
    /// objective. `1 - objective` is the error budget ([`burn_rate`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objective: Option<f64>,
}

/// The SLO objective when none is set: 99% of control intervals meet the SLO.
pub const DEFAULT_OBJECTIVE: f64 = 0.99;

impl Slo {
    /// True when there is something to violate: a latency or a throughput objective.
    pub fn is_set(&self) -> bool {
        self.latency_p99_ms.is_some() || self.throughput_rps.is_some()
    }

    /// The objective in force: the one set, else [`DEFAULT_OBJECTIVE`].
    pub fn objective(&self) -> f64 {
        self.objective.unwrap_or(DEFAULT_OBJECTIVE)
    }

    /// Whether `objective` is a valid SLO objective: a fraction strictly between 0 and 1 (1 would
    /// leave no error budget, 0 no objective).
    pub fn valid_objective(objective: f64) -> bool {
        objective.is_finite() && objective > 0.0 && objective < 1.0
    }
}

/// The error budget's burn rate: the fraction of control intervals that violated the SLO
/// (`violations` of `intervals`) over the fraction the objective allows (`1 - objective`). 1.0
/// spends the budget exactly; above it, faster than the objective allows. `None` without
/// intervals or with an objective outside (0, 1).
pub fn burn_rate(violations: u64, intervals: u64, objective: f64) -> Option<f64> {
    (intervals > 0 && Slo::valid_objective(objective))
        .then(|| violations as f64 / intervals as f64 / (1.0 - objective))
}

/// Utilization `used / capacity` in \[0, 1\] (0 without capacity).
pub fn utilization(used: f64, capacity: f64) -> f64 {
    if capacity > 0.0 {
        (used / capacity).min(1.0)
    } else {
        0.0
    }
}

/// SLO preservation `SP = min(SLO / measured, 1)` and whether the SLO was violated: p99 above
/// the latency SLO, or throughput below `min(throughput SLO, offered)`. A p99 of +∞ (nothing
/// served) gives SP 0 for a latency SLO. A best-effort app (no SLO) has nothing to violate, but
/// its SP is the share of the offered load it served, `min(throughput / offered, 1)` (1 when
/// nothing is offered): otherwise the reward would pay for starving it (one replica at full
/// utilization dropping most requests earns the top reward).
pub fn slo_preservation(
    slo: &Slo,
    p99_ms: f64,
    throughput_rps: f64,
    offered_rps: f64,
) -> (f64, bool) {
    let mut sp: f64 = 1.0;
    let mut violation = false;
    if slo.latency_p99_ms.is_none() && slo.throughput_rps.is_none() {
        if offered_rps > 0.0 && throughput_rps.is_finite() {
            sp = (throughput_rps / offered_rps).clamp(0.0, 1.0);
        }
        return (sp, violation);
    }
    if let Some(l) = slo.latency_p99_ms {
        sp = sp.min((l / p99_ms.max(1e-9)).min(1.0));
        violation |= p99_ms > l;
    }
    if let Some(tp) = slo.throughput_rps {
        let target = tp.min(offered_rps);
        if target > 0.0 {
            sp = sp.min((throughput_rps / target).min(1.0));
            violation |= throughput_rps < target * 0.99;
        }
    }
    (sp, violation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burn_rate_is_the_violating_share_over_the_budget() {
        // 3 violating intervals of 100 at a 99% objective: three times the budget.
        assert!((burn_rate(3, 100, 0.99).unwrap() - 3.0).abs() < 1e-9);
        assert!((burn_rate(5, 100, 0.95).unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(burn_rate(0, 100, 0.99), Some(0.0));
        assert_eq!(burn_rate(1, 0, 0.99), None, "no intervals");
        for bad in [0.0, 1.0, -0.5, 1.5, f64::NAN] {
            assert_eq!(burn_rate(1, 10, bad), None, "{bad}");
            assert!(!Slo::valid_objective(bad), "{bad}");
        }
        let slo = Slo::default();
        assert!(!slo.is_set());
        assert_eq!(slo.objective(), DEFAULT_OBJECTIVE);
        let slo = Slo {
            latency_p99_ms: Some(200.0),
            objective: Some(0.999),
            ..Slo::default()
        };
        assert!(slo.is_set());
        assert_eq!(slo.objective(), 0.999);
        // The objective travels only when set, so an SLO without one serializes as before.
        let json = serde_json::to_string(&Slo {
            objective: None,
            ..slo
        })
        .unwrap();
        assert_eq!(json, r#"{"latency_p99_ms":200.0}"#);
    }

    #[test]
    fn best_effort_sp_is_the_served_share_and_never_a_violation() {
        let none = Slo::default();
        assert_eq!(
            slo_preservation(&none, 30_000.0, 60.0, 400.0),
            (0.15, false)
        );
        assert_eq!(slo_preservation(&none, 50.0, 420.0, 400.0), (1.0, false));
        assert_eq!(slo_preservation(&none, 0.0, 0.0, 0.0), (1.0, false));
        assert_eq!(slo_preservation(&none, 0.0, f64::NAN, 10.0), (1.0, false));
        // an SLO keeps its own definition: throughput above its target is SP 1
        let tp = Slo {
            latency_p99_ms: None,
            throughput_rps: Some(100.0),
            objective: None,
        };
        assert_eq!(slo_preservation(&tp, 30_000.0, 150.0, 400.0), (1.0, false));
    }

    #[test]
    fn latency_and_throughput_slos() {
        let lat = Slo {
            latency_p99_ms: Some(200.0),
            throughput_rps: None,
            objective: None,
        };
        assert_eq!(slo_preservation(&lat, 100.0, 10.0, 10.0), (1.0, false));
        assert_eq!(slo_preservation(&lat, 400.0, 10.0, 10.0), (0.5, true));
        // nothing served: p99 +∞
        assert_eq!(
            slo_preservation(&lat, f64::INFINITY, 0.0, 10.0),
            (0.0, true)
        );
        let tp = Slo {
            latency_p99_ms: None,
            throughput_rps: Some(100.0),
            objective: None,
        };
        // the target is capped by the offered load
        assert_eq!(slo_preservation(&tp, 1.0, 50.0, 50.0), (1.0, false));
        assert_eq!(slo_preservation(&tp, 1.0, 25.0, 400.0), (0.25, true));
    }

    #[test]
    fn utilization_is_a_capped_ratio() {
        assert_eq!(utilization(1.0, 4.0), 0.25);
        assert_eq!(utilization(8.0, 4.0), 1.0);
        assert_eq!(utilization(1.0, 0.0), 0.0);
    }

    #[test]
    fn slo_keys_are_optional_and_checked() {
        let s: Slo = serde_json::from_str(r#"{"latency_p99_ms": 100}"#).unwrap();
        assert_eq!(s.latency_p99_ms, Some(100.0));
        assert_eq!(s.throughput_rps, None);
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"latency_p99_ms":100.0}"#
        );
        let e = serde_json::from_str::<Slo>(r#"{"latency_p99": 100}"#).unwrap_err();
        assert!(e.to_string().contains("latency_p99"), "{e}");
    }
}
