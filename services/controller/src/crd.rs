//! The `AwareAutoscaler` custom resource (`aware.dev/v1alpha1`), shaped after the
//! multidimensional pod autoscaler API (docs/design.md §4).
//!
//! What the API server can check alone is in the schema (ranges, enums, CEL rules with the
//! Kubernetes quantity library); what needs the target's current allocation is
//! [`AwareAutoscaler::validate_against`], and [`AwareAutoscaler::target_spec`] repeats every check
//! so an object admitted by an older CRD still cannot reach the services.

use aware_bus_schemas::{Resources, Stage};
use aware_shared::config::LifecycleProfile;
use aware_shared::spec::{
    Bounds, ControlledValues as SpecControlledValues, CpuLimit as SpecCpuLimit, FallbackOverride,
    LimitsPolicy, Slo, TargetSpec, UpdateMode as SpecUpdateMode,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::quantity::{parse_cpu_millicores, parse_memory_bytes, QuantityError};

/// The container name of a policy that applies to every container (as in the VPA API).
pub const ALL_CONTAINERS: &str = "*";

/// Why an `AwareAutoscaler` cannot be used.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CrdError {
    #[error("the AwareAutoscaler has no namespace")]
    MissingNamespace,
    #[error("spec.scaleTargetRef.name is empty")]
    MissingTargetName,
    #[error("spec.scaleTargetRef.kind `{0}` is not supported (expected Deployment)")]
    UnsupportedTargetKind(String),
    #[error("{field}: {source}")]
    Quantity {
        field: String,
        #[source]
        source: QuantityError,
    },
    #[error(
        "spec.resourcePolicy.containerPolicies names several containers ({0}); \
         AWARE sizes one container: keep one policy or add a `*` policy"
    )]
    AmbiguousContainerPolicy(String),
    #[error("invalid bounds: {0}")]
    InvalidBounds(String),
    #[error("spec.objective.alpha must be in [0, 1], got {0}")]
    AlphaOutOfRange(f64),
    #[error("spec.slo.{field} must be positive, got {value}")]
    NonPositiveSlo { field: &'static str, value: f64 },
    #[error("spec.slo.objective must be in (0, 1), got {0}")]
    ObjectiveOutOfRange(f64),
    #[error("spec.fallback.hpa.targetCPUUtilizationPercentage must be from 1 to 100, got {0}")]
    FallbackHpaTargetOutOfRange(u32),
    #[error("spec.lifecycle: {0}")]
    InvalidLifecycle(String),
    #[error("the bounds exclude the current allocation: {0}")]
    ExcludesCurrent(String),
    #[error("cannot render the CRD as YAML: {0}")]
    Yaml(String),
}

/// The `AwareAutoscaler` spec: which workload, how it may be scaled, and what AWARE optimizes.
// Each `printcolumn(...)` repeats `type_ = "string"` etc., which the lint takes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "aware.dev",
    version = "v1alpha1",
    kind = "AwareAutoscaler",
    shortname = "aas",
    namespaced,
    status = "AwareAutoscalerStatus",
    derive = "PartialEq",
    doc = "An RL autoscaler (AWARE) for one workload: replicas, CPU and memory.",
    printcolumn(
        name = "Stage",
        type_ = "string",
        json_path = ".status.stage",
        description = "Lifecycle stage of the agent"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.desiredReplicas",
        description = "Desired replicas"
    ),
    printcolumn(
        name = "CPU",
        type_ = "string",
        json_path = ".status.recommendation.cpu",
        description = "Recommended CPU request per replica"
    ),
    printcolumn(
        name = "Memory",
        type_ = "string",
        json_path = ".status.recommendation.memory",
        description = "Recommended memory request per replica"
    ),
    printcolumn(
        name = "Reward",
        type_ = "number",
        json_path = ".status.rewardMean",
        description = "Mean reward of the recent episodes"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AwareAutoscalerSpec {
    /// The scaled workload.
    pub scale_target_ref: ScaleTargetRef,
    #[serde(default)]
    pub update_policy: UpdatePolicy,
    #[serde(default)]
    pub constraints: Constraints,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_policy: Option<ResourcePolicy>,
    #[serde(default)]
    pub slo: SloSpec,
    #[serde(default)]
    pub objective: Objective,
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// The HPA/VPA fallback that drives the workload while AWARE learns (and whenever the
    /// lifecycle hands it back): the workload's own settings, in place of the recommender's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackSpec>,
}

/// The workload's own settings for the HPA/VPA fallback.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FallbackSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hpa: Option<HpaFallbackSpec>,
}

/// The fallback HPA's settings, named as `autoscaling/v1`'s.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HpaFallbackSpec {
    /// The target average CPU utilization, in percent of the CPU request (1–100), as the HPA
    /// this workload was tuned with; unset = the recommender's
    /// `fallback.hpa.target_cpu_utilization`.
    #[serde(
        rename = "targetCPUUtilizationPercentage",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 100))]
    pub target_cpu_utilization_percentage: Option<u32>,
}

/// The workload to scale (as `autoscaling/v1` `CrossVersionObjectReference`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleTargetRef {
    #[serde(default = "default_api_version")]
    pub api_version: String,
    #[serde(default = "default_kind")]
    #[x_kube(validation = Rule::new("self == 'Deployment'").message("only Deployments are supported"))]
    pub kind: String,
    #[x_kube(validation = Rule::new("size(self) > 0").message("scaleTargetRef.name must not be empty"))]
    #[schemars(length(max = 253))]
    pub name: String,
}

fn default_api_version() -> String {
    "apps/v1".to_string()
}

fn default_kind() -> String {
    "Deployment".to_string()
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpdatePolicy {
    #[serde(default)]
    pub update_mode: UpdateMode,
}

/// `Off` only records recommendations; `Auto` applies them.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UpdateMode {
    Off,
    #[default]
    Auto,
}

/// Replica bounds.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("constraints.minReplicas must not exceed constraints.maxReplicas"))]
pub struct Constraints {
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 1))]
    pub min_replicas: u32,
    #[serde(default = "default_max_replicas")]
    #[schemars(range(min = 1))]
    pub max_replicas: u32,
}

fn default_min_replicas() -> u32 {
    Bounds::default().min_replicas
}

fn default_max_replicas() -> u32 {
    Bounds::default().max_replicas
}

impl Default for Constraints {
    fn default() -> Self {
        Constraints {
            min_replicas: default_min_replicas(),
            max_replicas: default_max_replicas(),
        }
    }
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePolicy {
    /// Bounded so the API server can bound the cost of the CEL rules.
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub container_policies: Vec<ContainerPolicy>,
}

/// Per-replica CPU and memory bounds of one container (`*`: every container).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.minAllowed) || !has(self.maxAllowed) || !has(self.minAllowed.cpu) || !has(self.maxAllowed.cpu) || quantity(self.minAllowed.cpu).compareTo(quantity(self.maxAllowed.cpu)) <= 0").message("minAllowed.cpu must not exceed maxAllowed.cpu"),
    validation = Rule::new("!has(self.minAllowed) || !has(self.maxAllowed) || !has(self.minAllowed.memory) || !has(self.maxAllowed.memory) || quantity(self.minAllowed.memory).compareTo(quantity(self.maxAllowed.memory)) <= 0").message("minAllowed.memory must not exceed maxAllowed.memory"),
)]
pub struct ContainerPolicy {
    #[x_kube(validation = Rule::new("size(self) > 0").message("containerName must not be empty"))]
    #[schemars(length(max = 253))]
    pub container_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_allowed: Option<ResourceAmounts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_allowed: Option<ResourceAmounts>,
    /// Which values AWARE controls, as the VPA's: `RequestsAndLimits` (default) sets the requests
    /// and scales each limit with its request at the container's limit:request ratio (no limit
    /// stays no limit); `RequestsOnly` sets the requests and leaves the limits as they are (a
    /// request is then capped at its limit).
    #[serde(default)]
    pub controlled_values: ControlledValues,
    /// The CPU limit: `Controlled` as `controlledValues` says; `UnsetIfLatencySensitive`
    /// (default) removes it when `spec.slo` has `latencyP99Ms` (the CFS quota throttles bursts
    /// into the tail latency); `Unset` always removes it.
    #[serde(default)]
    pub cpu_limit: CpuLimit,
}

/// Which values AWARE controls (VPA's `controlledValues`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ControlledValues {
    #[default]
    RequestsAndLimits,
    RequestsOnly,
}

/// What happens to the CPU limit.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuLimit {
    Controlled,
    #[default]
    UnsetIfLatencySensitive,
    Unset,
}

/// CPU and memory as Kubernetes quantities (`500m`, `1Gi`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ResourceAmounts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isQuantity(self) && sign(quantity(self)) > 0").message("cpu must be a positive quantity such as 500m or 1"))]
    #[schemars(length(max = 64))]
    pub cpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isQuantity(self) && sign(quantity(self)) > 0").message("memory must be a positive quantity such as 512Mi or 1Gi"))]
    #[schemars(length(max = 64))]
    pub memory: Option<String>,
}

/// The service-level objective.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SloSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0.0").message("slo.latencyP99Ms must be positive"))]
    pub latency_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0.0").message("slo.throughputRps must be positive"))]
    pub throughput_rps: Option<f64>,
    /// The fraction of control intervals that must meet the SLO (the error budget is the rest),
    /// in (0, 1); unset = 0.99. A policy that burns the budget faster than allowed returns the
    /// target to the HPA/VPA fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0.0 && self < 1.0").message("slo.objective must be in (0, 1)"))]
    pub objective: Option<f64>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Objective {
    /// Weight of SLO preservation against utilization in the reward, in [0, 1].
    #[serde(default = "default_alpha")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub alpha: f64,
}

fn default_alpha() -> f64 {
    TargetSpec::new(&aware_bus_schemas::Target::new("", "")).alpha
}

impl Default for Objective {
    fn default() -> Self {
        Objective {
            alpha: default_alpha(),
        }
    }
}

/// The lifecycle profile of Algorithm 1.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Start OFFLINE behind the HPA/VPA fallback, or ONLINE at once.
    #[serde(default = "default_bootstrap")]
    pub bootstrap: bool,
    /// OFFLINE → ONLINE when the mean estimated reward reaches this.
    #[serde(default = "default_t_online")]
    pub t_online: f64,
    /// ONLINE → SERVING when the mean reward ≥ tServing and its std ≤ tVar.
    #[serde(default = "default_t_serving")]
    pub t_serving: f64,
    #[serde(default = "default_t_var")]
    #[schemars(range(min = 0.0))]
    pub t_var: f64,
    /// Number of recent episodes the decision looks at.
    #[serde(default = "default_window")]
    #[schemars(range(min = 1))]
    pub window: u32,
}

fn default_bootstrap() -> bool {
    LifecycleProfile::default().bootstrap
}
fn default_t_online() -> f64 {
    LifecycleProfile::default().t_online
}
fn default_t_serving() -> f64 {
    LifecycleProfile::default().t_serving
}
fn default_t_var() -> f64 {
    LifecycleProfile::default().t_var
}
fn default_window() -> u32 {
    u32::try_from(LifecycleProfile::default().window).unwrap_or(u32::MAX)
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            bootstrap: default_bootstrap(),
            t_online: default_t_online(),
            t_serving: default_t_serving(),
            t_var: default_t_var(),
            window: default_window(),
        }
    }
}

/// What the controller reports.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AwareAutoscalerStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommendation: Option<Recommendation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<u32>,
    /// Mean reward of the recent episodes (the lifecycle window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_std: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The current recommendation, per replica: replicas and the CPU and memory requests.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Recommendation {
    pub replicas: u32,
    pub cpu: String,
    pub memory: String,
}

fn quantity<T>(
    field: String,
    value: &str,
    parse: fn(&str) -> Result<T, QuantityError>,
) -> Result<T, CrdError> {
    parse(value).map_err(|source| CrdError::Quantity { field, source })
}

impl AwareAutoscaler {
    /// The container policy that gives the CPU/memory bounds: the only one, else the `*` one.
    fn container_policy(&self) -> Result<Option<(usize, &ContainerPolicy)>, CrdError> {
        let policies = match &self.spec.resource_policy {
            Some(p) => &p.container_policies,
            None => return Ok(None),
        };
        match policies.as_slice() {
            [] => Ok(None),
            [only] => Ok(Some((0, only))),
            many => many
                .iter()
                .enumerate()
                .find(|(_, p)| p.container_name == ALL_CONTAINERS)
                .map(Some)
                .ok_or_else(|| {
                    CrdError::AmbiguousContainerPolicy(
                        many.iter()
                            .map(|p| p.container_name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    )
                }),
        }
    }

    /// The container the actuator sizes, with the field that names it: the container policy's
    /// `containerName`, or `None` when there is no policy or it is the `*` one (the actuator
    /// then keeps its own choice: its `container` setting, else the first container).
    pub fn sized_container(&self) -> Result<Option<(String, &str)>, CrdError> {
        Ok(self.container_policy()?.and_then(|(i, p)| {
            (p.container_name != ALL_CONTAINERS).then(|| {
                (
                    format!("spec.resourcePolicy.containerPolicies[{i}].containerName"),
                    p.container_name.as_str(),
                )
            })
        }))
    }

    /// The allocation bounds: `constraints` and the container policy, the defaults of
    /// [`Bounds`] where the spec says nothing.
    pub fn bounds(&self) -> Result<Bounds, CrdError> {
        let mut b = Bounds {
            min_replicas: self.spec.constraints.min_replicas,
            max_replicas: self.spec.constraints.max_replicas,
            ..Bounds::default()
        };
        if let Some((i, p)) = self.container_policy()? {
            let base = format!("spec.resourcePolicy.containerPolicies[{i}]");
            for (which, amounts) in [
                ("minAllowed", &p.min_allowed),
                ("maxAllowed", &p.max_allowed),
            ] {
                let Some(a) = amounts else { continue };
                let min = which == "minAllowed";
                if let Some(cpu) = &a.cpu {
                    let v = quantity(format!("{base}.{which}.cpu"), cpu, parse_cpu_millicores)?;
                    if min {
                        b.min_cpu_millicores = v;
                    } else {
                        b.max_cpu_millicores = v;
                    }
                }
                if let Some(mem) = &a.memory {
                    let v = quantity(format!("{base}.{which}.memory"), mem, parse_memory_bytes)?;
                    if min {
                        b.min_memory_bytes = v;
                    } else {
                        b.max_memory_bytes = v;
                    }
                }
            }
        }
        let problems = b.problems();
        if !problems.is_empty() {
            return Err(CrdError::InvalidBounds(
                problems
                    .iter()
                    .map(|(k, why)| format!("{k} {why}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            ));
        }
        Ok(b)
    }

    /// The spec as the services see it.
    pub fn target_spec(&self) -> Result<TargetSpec, CrdError> {
        let namespace = self.namespace().ok_or(CrdError::MissingNamespace)?;
        let target = &self.spec.scale_target_ref;
        if target.kind != "Deployment" {
            return Err(CrdError::UnsupportedTargetKind(target.kind.clone()));
        }
        if target.name.is_empty() {
            return Err(CrdError::MissingTargetName);
        }
        let alpha = self.spec.objective.alpha;
        if !(0.0..=1.0).contains(&alpha) {
            return Err(CrdError::AlphaOutOfRange(alpha));
        }
        for (field, value) in [
            ("latencyP99Ms", self.spec.slo.latency_p99_ms),
            ("throughputRps", self.spec.slo.throughput_rps),
        ] {
            if let Some(v) = value {
                if v.is_nan() || v <= 0.0 {
                    return Err(CrdError::NonPositiveSlo { field, value: v });
                }
            }
        }
        if let Some(o) = self.spec.slo.objective {
            if !Slo::valid_objective(o) {
                return Err(CrdError::ObjectiveOutOfRange(o));
            }
        }
        self.lifecycle_profile()?;
        let fallback = self.fallback_override()?;
        Ok(TargetSpec {
            namespace,
            name: target.name.clone(),
            bounds: self.bounds()?,
            slo: Slo {
                latency_p99_ms: self.spec.slo.latency_p99_ms,
                throughput_rps: self.spec.slo.throughput_rps,
                objective: self.spec.slo.objective,
            },
            alpha,
            update_mode: match self.spec.update_policy.update_mode {
                UpdateMode::Auto => SpecUpdateMode::Auto,
                UpdateMode::Off => SpecUpdateMode::Off,
            },
            container: self.sized_container()?.map(|(_, name)| name.to_string()),
            limits: self.limits_policy()?,
            fallback,
        })
    }

    /// The fallback's settings of the workload's own (`spec.fallback`), as fractions.
    pub fn fallback_override(&self) -> Result<FallbackOverride, CrdError> {
        let percent = self
            .spec
            .fallback
            .as_ref()
            .and_then(|f| f.hpa.as_ref())
            .and_then(|h| h.target_cpu_utilization_percentage);
        if let Some(p) = percent.filter(|p| !(1..=100).contains(p)) {
            return Err(CrdError::FallbackHpaTargetOutOfRange(p));
        }
        Ok(FallbackOverride {
            hpa_target_cpu_utilization: percent.map(|p| f64::from(p) / 100.0),
        })
    }

    /// The limits policy: the container policy's `controlledValues` and `cpuLimit`, the defaults
    /// where it says nothing (or there is none).
    pub fn limits_policy(&self) -> Result<LimitsPolicy, CrdError> {
        let Some((_, p)) = self.container_policy()? else {
            return Ok(LimitsPolicy::default());
        };
        Ok(LimitsPolicy {
            controlled_values: match p.controlled_values {
                ControlledValues::RequestsAndLimits => SpecControlledValues::RequestsAndLimits,
                ControlledValues::RequestsOnly => SpecControlledValues::RequestsOnly,
            },
            cpu_limit: match p.cpu_limit {
                CpuLimit::Controlled => SpecCpuLimit::Controlled,
                CpuLimit::UnsetIfLatencySensitive => SpecCpuLimit::UnsetIfLatencySensitive,
                CpuLimit::Unset => SpecCpuLimit::Unset,
            },
        })
    }

    /// The lifecycle profile of Algorithm 1.
    pub fn lifecycle_profile(&self) -> Result<LifecycleProfile, CrdError> {
        let l = &self.spec.lifecycle;
        if l.window == 0 {
            return Err(CrdError::InvalidLifecycle(
                "window must be at least 1".into(),
            ));
        }
        if l.t_var.is_nan() || l.t_var < 0.0 {
            return Err(CrdError::InvalidLifecycle(format!(
                "tVar must be non-negative, got {}",
                l.t_var
            )));
        }
        if !l.t_online.is_finite() || !l.t_serving.is_finite() {
            return Err(CrdError::InvalidLifecycle(
                "tOnline and tServing must be finite".into(),
            ));
        }
        Ok(LifecycleProfile {
            bootstrap: l.bootstrap,
            t_online: l.t_online,
            t_serving: l.t_serving,
            t_var: l.t_var,
            window: usize::try_from(l.window).unwrap_or(usize::MAX),
        })
    }

    /// Rejects bounds that exclude the workload's current allocation (the API server cannot
    /// check this: it does not see the Deployment).
    pub fn validate_against(&self, current: Resources) -> Result<(), CrdError> {
        let b = self.bounds()?;
        let mut out = Vec::new();
        if !(b.min_replicas..=b.max_replicas).contains(&current.replicas) {
            out.push(format!(
                "replicas {} outside [{}, {}]",
                current.replicas, b.min_replicas, b.max_replicas
            ));
        }
        if !(b.min_cpu_millicores..=b.max_cpu_millicores).contains(&current.cpu_millicores) {
            out.push(format!(
                "cpu {}m outside [{}m, {}m]",
                current.cpu_millicores, b.min_cpu_millicores, b.max_cpu_millicores
            ));
        }
        if !(b.min_memory_bytes..=b.max_memory_bytes).contains(&current.memory_bytes) {
            out.push(format!(
                "memory {} bytes outside [{}, {}]",
                current.memory_bytes, b.min_memory_bytes, b.max_memory_bytes
            ));
        }
        if out.is_empty() {
            Ok(())
        } else {
            Err(CrdError::ExcludesCurrent(out.join("; ")))
        }
    }
}

/// Plain scalars that YAML 1.2 reads as strings but YAML 1.1 (kubectl's reader) as booleans.
const YAML11_BOOLEANS: [&str; 16] = [
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off",
    "OFF",
];

/// The CRD as YAML, exactly as `aware crd` prints it and `deploy/crd/` commits it.
///
/// The emitter writes YAML 1.2, where `Off` (an `updateMode` value) is a plain string; kubectl
/// reads YAML 1.1, where it is `false`. Such scalars are double-quoted.
pub fn crd_yaml() -> Result<String, CrdError> {
    let yaml = serde_norway::to_string(&AwareAutoscaler::crd())
        .map_err(|e| CrdError::Yaml(e.to_string()))?;
    let mut out = String::with_capacity(yaml.len() + 16);
    for line in yaml.lines() {
        let quoted = [": ", "- "].iter().find_map(|sep| {
            let (head, value) = line.rsplit_once(sep)?;
            let key = head.trim_start().trim_start_matches("- ");
            let structural = if *sep == "- " {
                key.is_empty()
            } else {
                !key.is_empty()
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            };
            (structural && YAML11_BOOLEANS.contains(&value))
                .then(|| format!("{head}{sep}\"{value}\""))
        });
        out.push_str(quoted.as_deref().unwrap_or(line));
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod cel_tests {
    //! The CRD's CEL validation rules (`x-kubernetes-validations`) executed the way the API server
    //! does: every rule of the generated schema is compiled with a CEL interpreter and evaluated with
    //! `self` bound to the value at the rule's place in an object (rules of absent fields do not
    //! run), with the Kubernetes quantity library (`isQuantity`, `quantity`, `sign`, `compareTo`)
    //! provided. Good objects pass every rule; each bad one fails with the rule's message.

    use std::sync::Arc;

    use cel_interpreter::extractors::This;
    use cel_interpreter::{Context, Program, Value as Cel};
    use serde_json::Value;

    use super::AwareAutoscaler;
    use kube::CustomResourceExt;

    /// A quantity in base units with its sign, or `None` when `s` is not a Kubernetes quantity.
    fn quantity_value(s: &str) -> Option<f64> {
        let (sign, body) = match s.strip_prefix('-') {
            Some(rest) => (-1.0, rest),
            None => (1.0, s.strip_prefix('+').unwrap_or(s)),
        };
        let end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (number, suffix) = body.split_at(end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let n: f64 = number.parse().ok()?;
        let factor = match suffix {
            "" => 1.0,
            "n" => 1e-9,
            "u" => 1e-6,
            "m" => 1e-3,
            "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            "P" => 1e15,
            "E" => 1e18,
            "Ki" => 1024.0,
            "Mi" => 1024f64.powi(2),
            "Gi" => 1024f64.powi(3),
            "Ti" => 1024f64.powi(4),
            "Pi" => 1024f64.powi(5),
            "Ei" => 1024f64.powi(6),
            e => {
                let exp: i32 = e.strip_prefix(['e', 'E'])?.parse().ok()?;
                10f64.powi(exp)
            }
        };
        Some(sign * n * factor)
    }

    fn context() -> Context<'static> {
        let mut ctx = Context::default();
        ctx.add_function("isQuantity", |s: Arc<String>| quantity_value(&s).is_some());
        // A quantity is represented by its value in base units. As in Kubernetes' quantity
        // library, `sign` is a function (`sign(q)`; the API server refuses `q.sign()`) and
        // `compareTo` a method.
        ctx.add_function("quantity", |s: Arc<String>| {
            quantity_value(&s).unwrap_or(f64::NAN)
        });
        ctx.add_function("sign", |q: f64| -> i64 {
            if q > 0.0 {
                1
            } else if q < 0.0 {
                -1
            } else {
                0
            }
        });
        ctx.add_function("compareTo", |This(a): This<f64>, b: f64| -> i64 {
            if a < b {
                -1
            } else if a > b {
                1
            } else {
                0
            }
        });
        ctx
    }

    /// Every (path, rule, message) of the schema; a path is the list of property names from the root.
    fn rules(schema: &Value, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, String, String)>) {
        if let Some(list) = schema
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
        {
            for r in list {
                out.push((
                    path.clone(),
                    r["rule"].as_str().unwrap().to_string(),
                    r["message"].as_str().unwrap_or("").to_string(),
                ));
            }
        }
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, sub) in props {
                path.push(name.clone());
                rules(sub, path, out);
                path.pop();
            }
        }
        if let Some(items) = schema.get("items") {
            path.push("[]".to_string());
            rules(items, path, out);
            path.pop();
        }
    }

    /// The values at `path` in `obj` (`[]` walks every element of a list).
    fn values_at<'a>(obj: &'a Value, path: &[String]) -> Vec<&'a Value> {
        match path.split_first() {
            None => vec![obj],
            Some((head, rest)) if head == "[]" => obj
                .as_array()
                .map(|a| a.iter().flat_map(|v| values_at(v, rest)).collect())
                .unwrap_or_default(),
            Some((head, rest)) => obj
                .get(head)
                .map(|v| values_at(v, rest))
                .unwrap_or_default(),
        }
    }

    /// The messages of every rule `obj` breaks.
    fn violations(obj: &Value) -> Vec<String> {
        let crd = serde_json::to_value(AwareAutoscaler::crd()).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let mut all = Vec::new();
        rules(schema, &mut Vec::new(), &mut all);
        assert!(all.len() >= 10, "the schema carries its CEL rules");
        let mut out = Vec::new();
        for (path, rule, message) in &all {
            let program = Program::compile(rule).unwrap_or_else(|e| panic!("`{rule}`: {e:?}"));
            for v in values_at(obj, path) {
                let mut ctx = context();
                ctx.add_variable("self", cel_interpreter::to_value(v).unwrap())
                    .unwrap();
                match program.execute(&ctx) {
                    Ok(Cel::Bool(true)) => {}
                    Ok(Cel::Bool(false)) => out.push(message.clone()),
                    other => panic!("rule `{rule}` at {path:?} on {v}: {other:?}"),
                }
            }
        }
        out
    }

    /// The table of `testdata/cel-cases.json`: a good object and `(pointer, value, message)`
    /// changes, each refused by one rule with its message (kube_e2e tries it on a real server).
    fn table() -> (Value, Vec<(String, Value, String)>) {
        let t: Value = serde_json::from_str(include_str!("../testdata/cel-cases.json")).unwrap();
        let bad = t["bad"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["pointer"].as_str().unwrap().to_string(),
                    c["value"].clone(),
                    c["message"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        (t["good"].clone(), bad)
    }

    fn good() -> Value {
        table().0
    }

    #[test]
    fn good_objects_pass_every_rule() {
        assert_eq!(violations(&good()), Vec::<String>::new());
        // The committed example too.
        let example: Value = serde_norway::from_str(include_str!(
            "../../../deploy/examples/awareautoscaler.yaml"
        ))
        .unwrap();
        assert_eq!(violations(&example), Vec::<String>::new());
    }

    #[test]
    fn bad_objects_fail_with_the_rule_message() {
        let (_, cases) = table();
        assert!(cases.len() >= 10, "the table covers every rule");
        for (pointer, value, message) in cases {
            let mut obj = good();
            *obj.pointer_mut(&pointer).unwrap() = value.clone();
            let v = violations(&obj);
            assert!(
                v.contains(&message),
                "{pointer} = {value}: expected `{message}`, got {v:?}"
            );
        }
    }

    #[test]
    fn the_quantity_library_stand_in_reads_kubernetes_quantities() {
        assert_eq!(quantity_value("500m"), Some(0.5));
        assert_eq!(quantity_value("2Gi"), Some(2.0 * 1024f64.powi(3)));
        assert_eq!(quantity_value("1.5G"), Some(1.5e9));
        assert_eq!(quantity_value("-1"), Some(-1.0));
        assert_eq!(quantity_value("1e3"), Some(1000.0));
        assert_eq!(quantity_value("lots"), None);
        assert_eq!(quantity_value("1Qi"), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const MI: u64 = 1024 * 1024;
    const CRD_PATH: &str = "deploy/crd/awareautoscalers.aware.dev.yaml";
    const EXAMPLE_PATH: &str = "deploy/examples/awareautoscaler.yaml";

    fn repo_file(path: &str) -> String {
        let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(path);
        std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
    }

    fn aas(spec: Value) -> AwareAutoscaler {
        serde_json::from_value(json!({
            "apiVersion": "aware.dev/v1alpha1",
            "kind": "AwareAutoscaler",
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn minimal() -> Value {
        json!({"scaleTargetRef": {"name": "web"}})
    }

    fn with(patch: Value) -> AwareAutoscaler {
        let mut spec = minimal();
        for (k, v) in patch.as_object().unwrap() {
            spec[k] = v.clone();
        }
        aas(spec)
    }

    #[test]
    fn committed_crd_matches_generated() {
        let generated = crd_yaml().unwrap();
        let committed = repo_file(CRD_PATH);
        if generated != committed {
            let line = generated
                .lines()
                .zip(committed.lines())
                .position(|(g, c)| g != c)
                .unwrap_or_else(|| generated.lines().count().min(committed.lines().count()));
            panic!(
                "{CRD_PATH} differs from the CRD generated from the Rust types (first at line {}: \
                 committed {:?}, generated {:?}); regenerate it with \
                 `cargo run --bin aware -- crd > {CRD_PATH}`",
                line + 1,
                committed.lines().nth(line),
                generated.lines().nth(line),
            );
        }
    }

    #[test]
    fn crd_yaml_is_the_crd_and_quotes_yaml11_booleans() {
        let yaml = crd_yaml().unwrap();
        let parsed: Value = serde_norway::from_str(&yaml).unwrap();
        assert_eq!(
            parsed,
            serde_json::to_value(AwareAutoscaler::crd()).unwrap()
        );
        assert!(yaml.contains("- \"Off\"\n"), "{yaml}");
        assert!(!yaml.lines().any(|l| l.trim() == "- Off"));
    }

    fn rules(v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Array(rs)) = m.get("x-kubernetes-validations") {
                    for r in rs {
                        out.push((
                            r["rule"].as_str().unwrap().to_string(),
                            r["message"].as_str().unwrap_or_default().to_string(),
                        ));
                    }
                }
                m.values().for_each(|x| rules(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| rules(x, out)),
            _ => {}
        }
    }

    #[test]
    fn crd_carries_validation_rules_and_printer_columns() {
        let crd = serde_json::to_value(AwareAutoscaler::crd()).unwrap();
        assert_eq!(crd["metadata"]["name"], "awareautoscalers.aware.dev");
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["aas"]));
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha1");
        assert_eq!(version["subresources"]["status"], json!({}));
        let columns: Vec<(&str, &str)> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
            .collect();
        assert_eq!(
            columns,
            [
                ("Stage", ".status.stage"),
                ("Replicas", ".status.desiredReplicas"),
                ("CPU", ".status.recommendation.cpu"),
                ("Memory", ".status.recommendation.memory"),
                ("Reward", ".status.rewardMean"),
                ("Age", ".metadata.creationTimestamp"),
            ]
        );

        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        let mut found = Vec::new();
        rules(spec, &mut found);
        let has = |rule: &str| found.iter().any(|(r, _)| r == rule);
        assert!(has("self.minReplicas <= self.maxReplicas"), "{found:?}");
        assert!(
            has("isQuantity(self) && sign(quantity(self)) > 0"),
            "{found:?}"
        );
        assert!(has("self == 'Deployment'"), "{found:?}");
        for dim in ["cpu", "memory"] {
            assert!(
                found.iter().any(|(r, m)| r.contains(&format!(
                    "quantity(self.minAllowed.{dim}).compareTo(quantity(self.maxAllowed.{dim})) <= 0"
                )) && m.contains(dim)),
                "{dim}: {found:?}"
            );
        }
        assert!(
            found.iter().all(|(_, m)| !m.is_empty()),
            "every rule has a message"
        );

        let c = &spec["constraints"]["properties"];
        assert_eq!(c["minReplicas"]["minimum"], json!(1.0));
        let alpha = &spec["objective"]["properties"]["alpha"];
        assert_eq!(
            (&alpha["minimum"], &alpha["maximum"]),
            (&json!(0.0), &json!(1.0))
        );
        let l = &spec["lifecycle"]["properties"];
        assert_eq!(l["window"]["minimum"], json!(1.0));
        assert_eq!(l["tVar"]["minimum"], json!(0.0));
        let slo = &spec["slo"]["properties"]["latencyP99Ms"]["x-kubernetes-validations"][0];
        assert_eq!(slo["rule"], "self > 0.0");
        let objective = &spec["slo"]["properties"]["objective"]["x-kubernetes-validations"][0];
        assert_eq!(objective["rule"], "self > 0.0 && self < 1.0");
        assert_eq!(objective["message"], "slo.objective must be in (0, 1)");
        let hpa =
            &spec["fallback"]["properties"]["hpa"]["properties"]["targetCPUUtilizationPercentage"];
        assert_eq!(
            (&hpa["type"], &hpa["minimum"], &hpa["maximum"]),
            (&json!("integer"), &json!(1.0), &json!(100.0))
        );
        assert_eq!(
            spec["updatePolicy"]["properties"]["updateMode"]["enum"],
            json!(["Off", "Auto"])
        );
        assert_eq!(
            spec["resourcePolicy"]["properties"]["containerPolicies"]["maxItems"],
            json!(32)
        );
    }

    #[test]
    fn example_deserializes_and_converts() {
        let a: AwareAutoscaler = serde_norway::from_str(&repo_file(EXAMPLE_PATH)).unwrap();
        assert_eq!(
            a.target_spec().unwrap(),
            TargetSpec {
                namespace: "shop".into(),
                name: "web".into(),
                bounds: Bounds {
                    min_replicas: 2,
                    max_replicas: 12,
                    min_cpu_millicores: 250,
                    max_cpu_millicores: 2000,
                    min_memory_bytes: 256 * MI,
                    max_memory_bytes: 2048 * MI,
                },
                slo: Slo {
                    latency_p99_ms: Some(250.0),
                    throughput_rps: None,
                    objective: Some(0.995),
                },
                alpha: 0.6,
                update_mode: SpecUpdateMode::Off,
                container: Some("web".into()),
                limits: LimitsPolicy {
                    controlled_values: SpecControlledValues::RequestsAndLimits,
                    cpu_limit: SpecCpuLimit::UnsetIfLatencySensitive,
                },
                fallback: FallbackOverride {
                    hpa_target_cpu_utilization: Some(0.5),
                },
            }
        );
        assert_eq!(a.lifecycle_profile().unwrap(), LifecycleProfile::default());
    }

    #[test]
    fn minimal_spec_gets_the_defaults() {
        let a = aas(minimal());
        let spec = a.target_spec().unwrap();
        let expected = TargetSpec {
            namespace: "ns".into(),
            ..TargetSpec::new(&aware_bus_schemas::Target::new("ns", "web"))
        };
        assert_eq!(spec, expected);
        assert_eq!(a.spec.scale_target_ref.kind, "Deployment");
        assert_eq!(a.spec.scale_target_ref.api_version, "apps/v1");
        assert_eq!(a.lifecycle_profile().unwrap(), LifecycleProfile::default());
    }

    #[test]
    fn container_policy_selection() {
        let one_sided = with(json!({"resourcePolicy": {"containerPolicies": [
            {"containerName": "app", "maxAllowed": {"memory": "1G"}},
        ]}}));
        let b = one_sided.bounds().unwrap();
        assert_eq!(b.max_memory_bytes, 1_000_000_000);
        assert_eq!(
            one_sided.target_spec().unwrap().container.as_deref(),
            Some("app")
        );
        assert_eq!(
            one_sided.sized_container().unwrap(),
            Some((
                "spec.resourcePolicy.containerPolicies[0].containerName".to_string(),
                "app"
            ))
        );
        assert_eq!(b.min_memory_bytes, Bounds::default().min_memory_bytes);
        assert_eq!(b.min_cpu_millicores, Bounds::default().min_cpu_millicores);

        let star = with(json!({"resourcePolicy": {"containerPolicies": [
            {"containerName": "sidecar", "maxAllowed": {"cpu": "100m"}},
            {"containerName": "*", "minAllowed": {"cpu": "0.5", "memory": "536870912"}},
        ]}}));
        let b = star.bounds().unwrap();
        assert_eq!((b.min_cpu_millicores, b.min_memory_bytes), (500, 512 * MI));
        // The `*` policy gives the bounds and names no container: the actuator's own choice.
        assert_eq!(star.target_spec().unwrap().container, None);
        let only_star = with(json!({"resourcePolicy": {"containerPolicies": [
            {"containerName": "*", "maxAllowed": {"cpu": "1"}},
        ]}}));
        assert_eq!(only_star.target_spec().unwrap().container, None);
        assert_eq!(b.max_cpu_millicores, Bounds::default().max_cpu_millicores);

        let ambiguous = with(json!({"resourcePolicy": {"containerPolicies": [
            {"containerName": "app"}, {"containerName": "sidecar"},
        ]}}));
        let err = ambiguous.target_spec().unwrap_err();
        assert_eq!(
            err,
            CrdError::AmbiguousContainerPolicy("app, sidecar".into())
        );
        assert!(err.to_string().contains("`*` policy"));
    }

    #[test]
    fn the_limits_policy_comes_from_the_container_policy() {
        assert_eq!(
            aas(minimal()).target_spec().unwrap().limits,
            LimitsPolicy::default()
        );
        let only = with(json!({"resourcePolicy": {"containerPolicies": [
            {"containerName": "app", "controlledValues": "RequestsOnly", "cpuLimit": "Unset"},
        ]}}));
        assert_eq!(
            only.target_spec().unwrap().limits,
            LimitsPolicy {
                controlled_values: SpecControlledValues::RequestsOnly,
                cpu_limit: SpecCpuLimit::Unset,
            }
        );
        // The `*` policy, like the bounds, when several name containers.
        let star = with(json!({"resourcePolicy": {"containerPolicies": [
            {"containerName": "sidecar", "controlledValues": "RequestsOnly"},
            {"containerName": "*", "cpuLimit": "UnsetIfLatencySensitive"},
        ]}}));
        assert_eq!(
            star.target_spec().unwrap().limits,
            LimitsPolicy {
                controlled_values: SpecControlledValues::RequestsAndLimits,
                cpu_limit: SpecCpuLimit::UnsetIfLatencySensitive,
            }
        );
        let crd = serde_json::to_value(AwareAutoscaler::crd()).unwrap();
        let policy = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["resourcePolicy"]["properties"]["containerPolicies"]["items"]
            ["properties"];
        assert_eq!(
            policy["controlledValues"]["enum"],
            json!(["RequestsAndLimits", "RequestsOnly"])
        );
        assert_eq!(
            policy["cpuLimit"]["enum"],
            json!(["Controlled", "UnsetIfLatencySensitive", "Unset"])
        );
        let bad: Result<AwareAutoscaler, _> = serde_json::from_value(json!({
            "apiVersion": "aware.dev/v1alpha1", "kind": "AwareAutoscaler",
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": {"scaleTargetRef": {"name": "web"}, "resourcePolicy": {"containerPolicies": [
                {"containerName": "app", "controlledValues": "LimitsOnly"}]}},
        }));
        assert!(bad.is_err());
    }

    #[test]
    fn bad_specs_are_rejected_with_clear_errors() {
        let bad_quantity = with(json!({"resourcePolicy": {"containerPolicies": [
            {"containerName": "app", "minAllowed": {"cpu": "lots"}},
        ]}}));
        let err = bad_quantity.target_spec().unwrap_err();
        assert!(
            matches!(&err, CrdError::Quantity { source: QuantityError::Syntax(q), .. } if q == "lots")
        );
        assert!(
            err.to_string()
                .starts_with("spec.resourcePolicy.containerPolicies[0].minAllowed.cpu: `lots`"),
            "{err}"
        );

        let inverted_cpu = with(json!({"resourcePolicy": {"containerPolicies": [
            {"containerName": "app", "minAllowed": {"cpu": "2"}, "maxAllowed": {"cpu": "500m"}},
        ]}}));
        let err = inverted_cpu.target_spec().unwrap_err();
        assert!(
            matches!(&err, CrdError::InvalidBounds(m) if m.contains("min_cpu_millicores")),
            "{err}"
        );

        let inverted_replicas = with(json!({"constraints": {"minReplicas": 5, "maxReplicas": 2}}));
        let err = inverted_replicas.target_spec().unwrap_err();
        assert!(
            matches!(&err, CrdError::InvalidBounds(m) if m.contains("min_replicas 5 above max_replicas 2")),
            "{err}"
        );
        let zero = with(json!({"constraints": {"minReplicas": 0}}));
        assert!(
            matches!(zero.target_spec(), Err(CrdError::InvalidBounds(m)) if m.contains("at least 1"))
        );

        for alpha in [-0.1, 1.5] {
            let a = with(json!({"objective": {"alpha": alpha}}));
            assert_eq!(a.target_spec(), Err(CrdError::AlphaOutOfRange(alpha)));
        }
        for edge in [0.0, 1.0] {
            assert!(with(json!({"objective": {"alpha": edge}}))
                .target_spec()
                .is_ok());
        }

        let slo = with(json!({"slo": {"latencyP99Ms": 0.0}}));
        assert_eq!(
            slo.target_spec(),
            Err(CrdError::NonPositiveSlo {
                field: "latencyP99Ms",
                value: 0.0
            })
        );
        for objective in [0.0, 1.0, -0.5, 1.5] {
            let o = with(json!({"slo": {"latencyP99Ms": 200.0, "objective": objective}}));
            let e = o.target_spec().unwrap_err();
            assert_eq!(e, CrdError::ObjectiveOutOfRange(objective));
            assert!(e.to_string().contains("spec.slo.objective"), "{e}");
        }
        let o = with(json!({"slo": {"latencyP99Ms": 200.0, "objective": 0.995}}))
            .target_spec()
            .unwrap();
        assert_eq!((o.slo.objective, o.slo.objective()), (Some(0.995), 0.995));
        let o = with(json!({"slo": {"latencyP99Ms": 200.0}}))
            .target_spec()
            .unwrap();
        assert_eq!((o.slo.objective, o.slo.objective()), (None, 0.99));
        for percent in [0u32, 101, 1000] {
            let o = with(json!({"fallback": {"hpa": {"targetCPUUtilizationPercentage": percent}}}));
            let e = o.target_spec().unwrap_err();
            assert_eq!(e, CrdError::FallbackHpaTargetOutOfRange(percent));
            assert!(
                e.to_string()
                    .contains("spec.fallback.hpa.targetCPUUtilizationPercentage"),
                "{e}"
            );
        }
        for (percent, fraction) in [(35u32, 0.35), (1, 0.01), (100, 1.0)] {
            let o = with(json!({"fallback": {"hpa": {"targetCPUUtilizationPercentage": percent}}}))
                .target_spec()
                .unwrap();
            assert_eq!(o.fallback.hpa_target_cpu_utilization, Some(fraction));
            // The registration carries it, and the services read it back as it was.
            let wire = aware_shared::registry::to_registered(&o, None);
            assert_eq!(wire.fallback_hpa_target_cpu_utilization, Some(fraction));
            let (back, _) = aware_shared::registry::from_registered(&o.target(), &wire).unwrap();
            assert_eq!(back.fallback, o.fallback);
        }
        for unset in [
            json!({}),
            json!({"fallback": {}}),
            json!({"fallback": {"hpa": {}}}),
        ] {
            let o = with(unset.clone()).target_spec().unwrap();
            assert_eq!(o.fallback, FallbackOverride::default(), "{unset}");
        }
        let window = with(json!({"lifecycle": {"window": 0}}));
        assert!(
            matches!(window.target_spec(), Err(CrdError::InvalidLifecycle(m)) if m.contains("window"))
        );
        let t_var = with(json!({"lifecycle": {"tVar": -0.1}}));
        assert!(
            matches!(t_var.target_spec(), Err(CrdError::InvalidLifecycle(m)) if m.contains("tVar"))
        );

        let kind = aas(json!({"scaleTargetRef": {"kind": "StatefulSet", "name": "db"}}));
        assert_eq!(
            kind.target_spec(),
            Err(CrdError::UnsupportedTargetKind("StatefulSet".into()))
        );
        let mut no_ns = aas(minimal());
        no_ns.metadata.namespace = None;
        assert_eq!(no_ns.target_spec(), Err(CrdError::MissingNamespace));

        let bad_mode: Result<AwareAutoscaler, _> = serde_json::from_value(json!({
            "apiVersion": "aware.dev/v1alpha1", "kind": "AwareAutoscaler",
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": {"scaleTargetRef": {"name": "web"}, "updatePolicy": {"updateMode": "Initial"}},
        }));
        assert!(bad_mode.is_err());
    }

    #[test]
    fn validate_against_the_current_allocation() {
        let a = with(json!({
            "constraints": {"minReplicas": 2, "maxReplicas": 10},
            "resourcePolicy": {"containerPolicies": [{"containerName": "app",
                "minAllowed": {"cpu": "250m", "memory": "256Mi"},
                "maxAllowed": {"cpu": "1", "memory": "1Gi"}}]},
        }));
        let inside = Resources {
            replicas: 2,
            cpu_millicores: 1000,
            memory_bytes: 256 * MI,
        };
        assert_eq!(a.validate_against(inside), Ok(()));

        let few = Resources {
            replicas: 1,
            ..inside
        };
        let err = a.validate_against(few).unwrap_err();
        assert_eq!(
            err,
            CrdError::ExcludesCurrent("replicas 1 outside [2, 10]".into())
        );
        assert!(err.to_string().contains("exclude the current allocation"));

        let big = Resources {
            replicas: 3,
            cpu_millicores: 1500,
            memory_bytes: 2048 * MI,
        };
        match a.validate_against(big) {
            Err(CrdError::ExcludesCurrent(m)) => {
                assert!(m.contains("cpu 1500m outside [250m, 1000m]"), "{m}");
                assert!(m.contains("memory"), "{m}");
                assert!(!m.contains("replicas"), "{m}");
            }
            other => panic!("{other:?}"),
        }

        let broken = with(json!({"constraints": {"minReplicas": 4, "maxReplicas": 3}}));
        assert!(matches!(
            broken.validate_against(inside),
            Err(CrdError::InvalidBounds(_))
        ));
    }
}
