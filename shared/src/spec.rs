//! What AWARE needs to know about a managed target: allocation bounds, SLO, reward weight,
//! update mode, limits policy and its own fallback settings (the CRD of the [kubernetes] issue
//! carries the same fields).

use aware_bus_schemas::{Resources, Target};
use serde::{Deserialize, Serialize};

/// The allocation in force that an `obs` reports (the spec's replica count, and the CPU and
/// memory per replica, `cpu_limit_cores` / `memory_limit_bytes`, rounded to millicores and
/// bytes), or `None` when either is not a positive finite number: a NaN or a missing value must
/// never read as a zero allocation.
pub fn allocation_in_force(m: &aware_bus_schemas::RawMetrics) -> Option<Resources> {
    let known = |x: f64| x.is_finite() && x > 0.0;
    if !(known(m.cpu_limit_cores) && known(m.memory_limit_bytes)) {
        return None;
    }
    Some(Resources {
        replicas: m.replicas_in_force(),
        // `as` saturates: an absurdly large limit stays absurdly large, never wraps to 0.
        cpu_millicores: ((m.cpu_limit_cores * 1000.0).round() as u32).max(1),
        memory_bytes: (m.memory_limit_bytes.round() as u64).max(1),
    })
}

/// Allocation bounds, the service-level objective and the limits policy of a target: the
/// learning problem's own types.
pub use aware_mdp::{Bounds, ControlledValues, CpuLimit, LimitsPolicy, Slo};

/// `Auto` applies actions; `Off` only records them (recommend-only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateMode {
    #[default]
    Auto,
    Off,
}

/// A managed target and its settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub bounds: Bounds,
    #[serde(default)]
    pub slo: Slo,
    /// Reward weight of SLO preservation against utilization, in [0, 1].
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    #[serde(default)]
    pub update_mode: UpdateMode,
    /// The container of the Deployment's pods whose CPU and memory the actuator sizes (a
    /// registration carries the one the AwareAutoscaler's `containerPolicies` names); unset =
    /// the actuator's `kubernetes` `container` setting, else the pod template's first container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// How the limits follow the requested allocation (the agent sets requests): VPA's
    /// `controlledValues` and the CPU limit's rule.
    #[serde(default, deserialize_with = "LimitsPolicy::deserialize_strict")]
    pub limits: LimitsPolicy,
    /// The target's own settings for the HPA/VPA fallback that drives it while its agent
    /// learns; what is unset follows `recommender.fallback`.
    #[serde(default, skip_serializing_if = "FallbackOverride::is_empty")]
    pub fallback: FallbackOverride,
}

/// A target's overrides of the recommender's fallback settings (`[[targets]] fallback.…`, the
/// AwareAutoscaler's `spec.fallback`): a platform team that tuned an HPA per workload keeps that
/// tuning while AWARE learns, instead of one target utilization for every workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FallbackOverride {
    /// The HPA's target average CPU utilization (a fraction, rounded to a whole percent as
    /// upstream works in percent), in place of `recommender.fallback.hpa.target_cpu_utilization`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hpa_target_cpu_utilization: Option<f64>,
}

impl FallbackOverride {
    /// True when nothing is overridden.
    pub fn is_empty(&self) -> bool {
        self.hpa_target_cpu_utilization.is_none()
    }

    /// Whether `u` is a target utilization an override may set: finite, and a whole percent
    /// from 1 to 100 once rounded as the HPA rounds it (the lower bound is the global setting's
    /// rule; the upper one is the AwareAutoscaler's `targetCPUUtilizationPercentage` range).
    pub fn valid_hpa_target(u: f64) -> bool {
        u.is_finite() && (1..=100).contains(&hpa_target_percent(u))
    }
}

/// A target CPU utilization (a fraction) as the HPA's whole percentage: rounded, as upstream's
/// integer percent (`as` saturates, so an absurd value stays out of range instead of wrapping).
pub fn hpa_target_percent(u: f64) -> i64 {
    (u * 100.0).round() as i64
}

fn default_alpha() -> f64 {
    0.5
}

impl TargetSpec {
    pub fn new(target: &Target) -> Self {
        TargetSpec {
            namespace: target.namespace.clone(),
            name: target.name.clone(),
            bounds: Bounds::default(),
            slo: Slo::default(),
            alpha: default_alpha(),
            update_mode: UpdateMode::Auto,
            container: None,
            limits: LimitsPolicy::default(),
            fallback: FallbackOverride::default(),
        }
    }

    pub fn target(&self) -> Target {
        Target::new(self.namespace.clone(), self.name.clone())
    }
}
