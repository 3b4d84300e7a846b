//! The rule-based fallback policy: the Kubernetes HPA algorithm for the replica count and the
//! VPA recommender for the per-replica CPU and memory limits, faithful to upstream.
//!
//! It drives a target while its RL agent bootstraps (OFFLINE) and whenever the RL path fails.
//! A pure library: no bus, no async; one [`Fallback`] per target keeps the history both
//! algorithms need (HPA stabilization windows and scale events, VPA decaying histograms).
//!
//! - [`hpa`]: `pkg/controller/podautoscaler/{replica_calculator,horizontal}.go` of
//!   kubernetes/kubernetes. Utilization = CPU usage / CPU **limit** (AWARE sets limits; the limit
//!   plays the role of the request).
//! - [`vpa`] (+ [`histogram`]): `vertical-pod-autoscaler/pkg/recommender/{logic,model,util}` of
//!   kubernetes/autoscaler. The recommendation is applied to the per-replica CPU and memory
//!   **limits**.
//!
//! **Checked against upstream's own code.** `tests/upstream_diff.rs` feeds the same seeded cases
//! to these ports and to a driver built from the Go module proxy (`tests/upstream/`: Kubernetes
//! v1.37.2 `ReplicaCalculator.GetResourceReplicas` behind a metrics client and a pod lister
//! holding the case's pods; VPA v1.8.1's recommender `model` and `logic` packages with its default
//! configuration) and requires, case by case, the same replica count and utilization (400 random
//! cases — tolerance band, unready pods by every upstream route, missing metrics, scale-up with
//! unready pods at 0 %, requests of 0 — plus one pod at every whole millicore up to 20 cores) and
//! the same target, lower and upper bounds to the millicore and byte (120 series of up to a week,
//! idle, bursty, diurnal and ramping, with OOM kills, some reported late). The HPA's
//! stabilization windows and scaling policies (`horizontal.go`) are not compared: upstream keeps
//! them in unexported methods of the controller that read the wall clock (`time.Now()`), reachable
//! only through the whole controller against API clients in real time (a 300 s window takes
//! 300 s), and copying them would compare upstream's code with a copy of itself; `hpa.rs` unit
//! tests cover them.
//!
//! Aggregate metrics ([`RawMetrics`]) are split evenly over ready pods
//! ([`hpa::pods_from_metrics`]); memory is split the same way (conservative: starting pods'
//! small working sets raise the per-ready-pod average instead of lowering the peak).
//!
//! Invalid inputs (NaN, infinite or negative measurements or time) are treated as missing
//! metrics: the dimensions that depend on them keep the current allocation (an invalid limit is
//! replaced by the current one), and the [`Recommendation`] says so. The output is always inside
//! the bounds (inverted bounds are read with min and max swapped).
//!
//! Note that, as in any cluster running both, the HPA and the VPA act on CPU together: the HPA
//! measures utilization against the limit the VPA sets. Upstream advises against combining them
//! on CPU; the bootstrap fallback does it because AWARE's action space has both dimensions, and
//! the VPA's confidence-scaled bounds keep its changes rare once history has built up.

pub mod histogram;
pub mod hpa;
pub mod vpa;

use std::fmt;

use aware_bus_schemas::{RawMetrics, Resources};
use aware_shared::spec::Bounds;
use serde::{Deserialize, Serialize};

pub use hpa::{HpaConfig, PodGroup, PodSample};
pub use vpa::{VpaConfig, VpaEstimate};

/// Fallback settings (HPA + VPA), ready to sit in the service configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FallbackConfig {
    pub hpa: HpaConfig,
    pub vpa: VpaConfig,
}

impl FallbackConfig {
    /// Invalid settings as (key, reason); empty when valid.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = self.hpa.problems();
        out.extend(self.vpa.problems());
        out
    }
}

/// A configuration the fallback cannot run with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid fallback configuration: {}", .problems.iter().map(|(k, r)| format!("{k}: {r}")).collect::<Vec<_>>().join("; "))]
pub struct FallbackConfigError {
    pub problems: Vec<(&'static str, String)>,
}

/// One rule that fired while computing a recommendation (for logs and the `action` message).
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// An input was NaN, infinite or negative: treated as missing; `kept` says what that meant
    /// (which dimensions keep their current value, or what stood in for the input).
    InvalidInput {
        field: &'static str,
        value: f64,
        kept: &'static str,
    },
    /// The HPA synced less than a sync period ago.
    HpaNotDue {
        next_sync_in_s: f64,
    },
    /// The replica count is outside [min, max]: it goes straight to the range.
    HpaCurrentOutsideRange {
        current: u32,
        to: u32,
    },
    /// No replica count could be computed (upstream: an error, the scale is left alone).
    HpaNoRecommendation {
        reason: String,
    },
    /// Utilization of the ready pods with metrics against the target.
    HpaUtilization {
        utilization_percent: i64,
        target_percent: i64,
        usage_ratio: f64,
    },
    /// |ratio − 1| ≤ tolerance: no change.
    HpaWithinTolerance {
        usage_ratio: f64,
        tolerance: f64,
    },
    /// Unready pods counted at 0 % (scale-up).
    HpaUnreadyPods {
        pods: u64,
    },
    /// Pods without metrics counted at `assumed_percent` of the request.
    HpaMissingPods {
        pods: u64,
        assumed_percent: i64,
    },
    /// Counting unready/missing pods would reverse the scaling direction: no change.
    HpaDirectionReversed {
        usage_ratio: f64,
        new_usage_ratio: f64,
    },
    /// The stabilization window changed the proposal.
    HpaStabilized {
        proposed: u32,
        stabilized: u32,
    },
    HpaScaleUpLimit {
        limit: u32,
    },
    HpaScaleDownLimit {
        limit: u32,
    },
    HpaTooManyReplicas {
        max: u32,
    },
    HpaTooFewReplicas {
        min: u32,
    },
    /// No CPU sample yet: the limits stay.
    VpaNoHistory,
    /// History older than the aggregation window was forgotten.
    VpaHistoryExpired,
    /// An OOM kill was recorded as a memory sample of `bumped_to_bytes`.
    VpaOom {
        bumped_to_bytes: f64,
    },
    /// The updater's quick-OOM rule: a container was OOM-killed within `EVICT_AFTER_OOM_S`, so
    /// a higher memory target is applied although the allocation is within the bounds.
    VpaQuickOom,
    VpaEstimate {
        target_cpu_millicores: f64,
        target_memory_bytes: f64,
        lower_cpu_millicores: f64,
        upper_cpu_millicores: f64,
        lower_memory_bytes: f64,
        upper_memory_bytes: f64,
        confidence_days: f64,
    },
    /// The current limits are within [lower, upper]: no update.
    VpaWithinBounds,
    /// `outside` resources left [lower, upper]: all limits move to the target.
    VpaApplyTarget {
        outside: Vec<&'static str>,
    },
    /// The target's bounds clamped these dimensions.
    Clamped {
        dims: Vec<&'static str>,
    },
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::InvalidInput { field, value, kept } => {
                write!(f, "invalid {field}={value}: treated as missing; {kept}")
            }
            Rule::HpaNotDue { next_sync_in_s } => {
                write!(f, "hpa: next sync in {next_sync_in_s:.1}s, its last decision stands")
            }
            Rule::HpaCurrentOutsideRange { current, to } => {
                write!(f, "hpa: {current} replicas outside [min, max] → {to}")
            }
            Rule::HpaNoRecommendation { reason } => {
                write!(f, "hpa: no recommendation ({reason}), replicas kept")
            }
            Rule::HpaUtilization {
                utilization_percent,
                target_percent,
                usage_ratio,
            } => write!(
                f,
                "hpa: cpu utilization {utilization_percent}% / target {target_percent}% = {usage_ratio:.3}"
            ),
            Rule::HpaWithinTolerance {
                usage_ratio,
                tolerance,
            } => write!(
                f,
                "hpa: ratio {usage_ratio:.3} within tolerance {tolerance}, no change"
            ),
            Rule::HpaUnreadyPods { pods } => {
                write!(f, "hpa: {pods} unready pods counted at 0% (scale-up)")
            }
            Rule::HpaMissingPods {
                pods,
                assumed_percent,
            } => write!(
                f,
                "hpa: {pods} pods without metrics counted at {assumed_percent}%"
            ),
            Rule::HpaDirectionReversed {
                usage_ratio,
                new_usage_ratio,
            } => write!(
                f,
                "hpa: ratio {usage_ratio:.3} → {new_usage_ratio:.3} with unready/missing pods reverses direction, no change"
            ),
            Rule::HpaStabilized {
                proposed,
                stabilized,
            } => write!(f, "hpa: stabilization window: {proposed} → {stabilized}"),
            Rule::HpaScaleUpLimit { limit } => write!(f, "hpa: scale-up rate limit {limit}"),
            Rule::HpaScaleDownLimit { limit } => write!(f, "hpa: scale-down rate limit {limit}"),
            Rule::HpaTooManyReplicas { max } => write!(f, "hpa: max replicas {max}"),
            Rule::HpaTooFewReplicas { min } => write!(f, "hpa: min replicas {min}"),
            Rule::VpaNoHistory => write!(f, "vpa: no usage history yet, limits kept"),
            Rule::VpaHistoryExpired => write!(f, "vpa: history expired and was reset"),
            Rule::VpaOom { bumped_to_bytes } => {
                write!(f, "vpa: OOM kill recorded as {bumped_to_bytes:.0} bytes")
            }
            Rule::VpaQuickOom => write!(
                f,
                "vpa: recent OOM kill and a higher memory target: target applied (quick-OOM rule)"
            ),
            Rule::VpaEstimate {
                target_cpu_millicores,
                target_memory_bytes,
                lower_cpu_millicores,
                upper_cpu_millicores,
                lower_memory_bytes,
                upper_memory_bytes,
                confidence_days,
            } => write!(
                f,
                "vpa: target {target_cpu_millicores:.0}m/{target_memory_bytes:.0}B, cpu [{lower_cpu_millicores:.0}m, {upper_cpu_millicores:.0}m], memory [{lower_memory_bytes:.0}B, {upper_memory_bytes:.0}B], confidence {confidence_days:.3}d"
            ),
            Rule::VpaWithinBounds => write!(f, "vpa: limits within bounds, kept"),
            Rule::VpaApplyTarget { outside } => {
                write!(f, "vpa: {} outside bounds, applying target", outside.join("+"))
            }
            Rule::Clamped { dims } => write!(f, "clamped to target bounds: {}", dims.join(", ")),
        }
    }
}

/// The fallback's answer for one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Recommendation {
    /// The allocation to apply, inside the bounds.
    pub desired: Resources,
    /// What the rules ask for before the bounds: the HPA replica calculator's count (before
    /// stabilization, rate limits and min/max; the count in force when it computed none) and the
    /// VPA's CPU and memory before the clamp. May lie outside the bounds; what judges whether
    /// the bounds leave the SLO reachable (`crate::reach`).
    pub unclamped: Resources,
    /// The rules that fired, in order.
    pub rules: Vec<Rule>,
    /// The VPA's estimate, once there is history.
    pub vpa_estimate: Option<VpaEstimate>,
}

impl Recommendation {
    /// Whether any input was treated as missing.
    pub fn had_invalid_input(&self) -> bool {
        self.rules
            .iter()
            .any(|r| matches!(r, Rule::InvalidInput { .. }))
    }

    /// The fired rules as one line.
    pub fn explanation(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Recommendation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.rules.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// Bounds with min ≤ max in every dimension (an inverted pair is swapped).
fn ordered(b: &Bounds) -> Bounds {
    Bounds {
        min_replicas: b.min_replicas.min(b.max_replicas),
        max_replicas: b.min_replicas.max(b.max_replicas),
        min_cpu_millicores: b.min_cpu_millicores.min(b.max_cpu_millicores),
        max_cpu_millicores: b.min_cpu_millicores.max(b.max_cpu_millicores),
        min_memory_bytes: b.min_memory_bytes.min(b.max_memory_bytes),
        max_memory_bytes: b.min_memory_bytes.max(b.max_memory_bytes),
    }
}

fn check(field: &'static str, value: f64, kept: &'static str, rules: &mut Vec<Rule>) -> bool {
    let ok = value.is_finite() && value >= 0.0;
    if !ok {
        rules.push(Rule::InvalidInput { field, value, kept });
    }
    ok
}

/// The HPA + VPA fallback of one target.
#[derive(Debug, Clone, PartialEq)]
pub struct Fallback {
    hpa: hpa::Hpa,
    vpa: vpa::Vpa,
    /// When a container was last OOM-killed (for the updater's quick-OOM rule).
    last_oom_s: Option<f64>,
}

/// The VPA updater's `--evict-after-oom-threshold` (10 min, `pkg/updater/priority`): a container
/// OOM-killed this soon is updated to the target even when its allocation is within the
/// recommended bounds. Upstream measures the container's run time before the kill; with step
/// metrics the time since the last kill stands in for it (a crash-looping pod satisfies both).
pub const EVICT_AFTER_OOM_S: f64 = 600.0;

impl Fallback {
    pub fn new(config: FallbackConfig) -> Result<Self, FallbackConfigError> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(FallbackConfigError { problems });
        }
        Ok(Fallback {
            hpa: hpa::Hpa::new(config.hpa),
            vpa: vpa::Vpa::new(config.vpa)?,
            last_oom_s: None,
        })
    }

    pub fn hpa(&self) -> &hpa::Hpa {
        &self.hpa
    }

    pub fn vpa(&self) -> &vpa::Vpa {
        &self.vpa
    }

    /// Sets the HPA's target CPU utilization (a target's own, from its spec) in place, keeping
    /// the HPA's stabilization history and the VPA's histograms; refused, changing nothing,
    /// when the HPA could not run with it (the same check as the configuration's).
    pub fn set_hpa_target_cpu_utilization(
        &mut self,
        target: f64,
    ) -> Result<(), FallbackConfigError> {
        let config = HpaConfig {
            target_cpu_utilization: target,
            ..self.hpa.config().clone()
        };
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(FallbackConfigError { problems });
        }
        self.hpa.set_target_cpu_utilization(target);
        Ok(())
    }

    /// Another policy decided this step: the HPA's earlier decision no longer stands.
    pub fn release(&mut self) {
        self.hpa.release();
    }

    /// One step at `now_s` (seconds, monotone): folds the metrics into the VPA history, runs the
    /// HPA (if a sync is due) and the VPA updater rule, and returns the allocation clamped into
    /// `bounds` with the rules that fired. `current` is the allocation in force.
    pub fn recommend(
        &mut self,
        now_s: f64,
        metrics: &RawMetrics,
        current: Resources,
        bounds: &Bounds,
    ) -> Recommendation {
        let b = ordered(bounds);
        let mut rules = Vec::new();
        let mut vpa_estimate = None;
        let mut desired = current;
        let mut proposed_replicas = None;

        if now_s.is_finite() {
            let cpu_ok = check(
                "cpu_usage_cores",
                metrics.cpu_usage_cores,
                "replicas and cpu kept",
                &mut rules,
            );
            let mem_ok = check(
                "memory_working_set_bytes",
                metrics.memory_working_set_bytes,
                "memory kept",
                &mut rules,
            );
            if self.vpa.expire(now_s) {
                rules.push(Rule::VpaHistoryExpired);
            }
            // The per-pod CPU request: the limit the pods ran with, else (0 = unknown, or
            // invalid) the current one; the same for the memory limit (the OOM bump base).
            let limit_cores = if check(
                "cpu_limit_cores",
                metrics.cpu_limit_cores,
                "the current cpu limit stands in",
                &mut rules,
            ) && metrics.cpu_limit_cores > 0.0
            {
                metrics.cpu_limit_cores
            } else {
                f64::from(current.cpu_millicores) / 1000.0
            };
            let memory_limit = if check(
                "memory_limit_bytes",
                metrics.memory_limit_bytes,
                "the current memory limit stands in",
                &mut rules,
            ) && metrics.memory_limit_bytes > 0.0
            {
                metrics.memory_limit_bytes
            } else {
                current.memory_bytes as f64
            };
            // The VPA samples every running container, ready or not (unlike the HPA): a pod
            // that crash-loops still feeds its usage and its OOM kills to the recommendation.
            let ready = metrics.ready_replicas.min(metrics.replicas);
            let cpu_pods = metrics.replicas;
            if cpu_ok && cpu_pods > 0 {
                self.vpa.add_cpu_samples(
                    now_s,
                    metrics.cpu_usage_cores / f64::from(cpu_pods),
                    cpu_pods,
                );
            }
            let mem_pods = if ready > 0 { ready } else { metrics.replicas };
            if mem_ok && mem_pods > 0 {
                self.vpa.add_memory_sample(
                    now_s,
                    metrics.memory_working_set_bytes / f64::from(mem_pods),
                    false,
                );
            }
            if metrics.oom_kills > 0 {
                self.last_oom_s = Some(now_s);
                if let Some(bumped) = self.vpa.record_oom(now_s, memory_limit) {
                    rules.push(Rule::VpaOom {
                        bumped_to_bytes: bumped,
                    });
                }
            }

            if cpu_ok {
                let pods = hpa::pods_from_metrics(metrics);
                let request_milli = (limit_cores * 1000.0).round().min(1e15) as i64;
                let d = self.hpa.reconcile(
                    now_s,
                    current.replicas,
                    &pods,
                    request_milli,
                    b.min_replicas,
                    b.max_replicas,
                );
                desired.replicas = d.replicas;
                proposed_replicas = d.proposed;
                rules.extend(d.rules);
            }

            let mut v = self
                .vpa
                .decide(current.cpu_millicores, current.memory_bytes);
            let quick_oom = self
                .last_oom_s
                .is_some_and(|t| now_s >= t && now_s - t <= EVICT_AFTER_OOM_S);
            if quick_oom && v.rules.iter().any(|r| matches!(r, Rule::VpaWithinBounds)) {
                if let Some(est) = &v.estimate {
                    if est.target.memory_bytes > current.memory_bytes as f64 {
                        v.cpu_millicores =
                            est.target.cpu_millicores.clamp(0.0, f64::from(u32::MAX)) as u32;
                        v.memory_bytes = est.target.memory_bytes.clamp(0.0, u64::MAX as f64) as u64;
                        v.rules.push(Rule::VpaQuickOom);
                    }
                }
            }
            vpa_estimate = v.estimate;
            rules.extend(v.rules);
            if cpu_ok {
                desired.cpu_millicores = v.cpu_millicores;
            }
            if mem_ok {
                desired.memory_bytes = v.memory_bytes;
            }
        } else {
            rules.push(Rule::InvalidInput {
                field: "now_s",
                value: now_s,
                kept: "all kept",
            });
        }

        let unclamped = Resources {
            replicas: proposed_replicas.unwrap_or(desired.replicas),
            ..desired
        };
        let (clamped, dims) = b.clamp_dimensions(desired);
        if !dims.is_empty() {
            rules.push(Rule::Clamped { dims });
        }
        let rec = Recommendation {
            desired: clamped,
            unclamped,
            rules,
            vpa_estimate,
        };
        tracing::debug!(
            replicas = rec.desired.replicas,
            cpu_millicores = rec.desired.cpu_millicores,
            memory_bytes = rec.desired.memory_bytes,
            rules = %rec,
            "fallback recommendation"
        );
        rec
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1024 * 1024;

    fn metrics(replicas: u32, ready: u32, cpu: f64, mem: f64, limit_cores: f64) -> RawMetrics {
        RawMetrics {
            replicas,
            ready_replicas: ready,
            cpu_usage_cores: cpu,
            memory_working_set_bytes: mem,
            cpu_limit_cores: limit_cores,
            memory_limit_bytes: (512 * MIB) as f64,
            ..RawMetrics::default()
        }
    }

    fn res(replicas: u32, cpu: u32, mem: u64) -> Resources {
        Resources {
            replicas,
            cpu_millicores: cpu,
            memory_bytes: mem,
        }
    }

    fn fallback() -> Fallback {
        Fallback::new(FallbackConfig::default()).unwrap()
    }

    #[test]
    fn defaults_are_upstreams() {
        let c = FallbackConfig::default();
        assert_eq!(c.hpa.tolerance, 0.1);
        assert_eq!(c.hpa.sync_period_s, 15.0);
        assert_eq!(c.hpa.target_cpu_utilization, 0.7);
        assert_eq!(c.hpa.scale_down.stabilization_window_s, 300);
        assert_eq!(c.hpa.scale_up.stabilization_window_s, 0);
        assert_eq!(c.vpa.target_percentile, 0.9);
        assert_eq!(c.vpa.safety_margin_fraction, 0.15);
        assert_eq!(c.vpa.cpu_half_life_s, 86_400.0);
        assert_eq!(c.vpa.memory_aggregation_interval_count, 8);
        assert!(c.problems().is_empty());
    }

    #[test]
    fn config_deserializes_partially_and_rejects_nonsense() {
        let c: FallbackConfig =
            serde_json::from_str(r#"{"hpa": {"target_cpu_utilization": 0.5}}"#).unwrap();
        assert_eq!(c.hpa.target_cpu_utilization, 0.5);
        assert_eq!(c.hpa.tolerance, 0.1);
        assert_eq!(c.vpa, VpaConfig::default());
        let c: FallbackConfig = serde_json::from_str(
            r#"{"hpa": {"scale_up": {"policies": [{"kind": "Pods", "value": 2, "period_s": 60}]}}}"#,
        )
        .unwrap();
        assert_eq!(c.hpa.scale_up.policies.len(), 1);
        assert_eq!(c.hpa.scale_up.select_policy, hpa::SelectPolicy::Max);
        let bad = FallbackConfig {
            hpa: HpaConfig {
                target_cpu_utilization: f64::NAN,
                ..HpaConfig::default()
            },
            vpa: VpaConfig {
                bucket_size_growth: 0.0,
                ..VpaConfig::default()
            },
        };
        let err = Fallback::new(bad).unwrap_err();
        let keys: Vec<_> = err.problems.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            ["hpa.target_cpu_utilization", "vpa.bucket_size_growth"]
        );
    }

    /// A target's own HPA target set in place: the next sync computes with it and the
    /// explanation says so, while the VPA's histograms and the HPA's stabilization history stay
    /// (a scale-down stays held by the recommendation made under the earlier target, as an edit
    /// of an HPA object's target leaves upstream's controller's history alone); an unusable
    /// target is refused and changes nothing.
    #[test]
    fn the_hpa_target_is_set_in_place_keeping_the_history() {
        let mut f = fallback();
        f.set_hpa_target_cpu_utilization(0.35).unwrap();
        assert_eq!(f.hpa().config().target_percent(), 35);
        // 2 ready replicas at 70 % of their 1-core limits: 70 % / 35 % = 2 → 4 replicas.
        let r = f.recommend(
            0.0,
            &metrics(2, 2, 1.4, 400e6, 1.0),
            res(2, 1000, 512 * MIB),
            &Bounds::default(),
        );
        assert_eq!(r.desired.replicas, 4, "{}", r.explanation());
        assert!(
            r.explanation().contains("target 35%"),
            "{}",
            r.explanation()
        );
        let vpa_before = f.vpa().clone();
        assert!(vpa_before.total_samples() > 0);

        for bad in [0.0, 0.004, f64::NAN, f64::INFINITY, -0.5] {
            let e = f.set_hpa_target_cpu_utilization(bad).unwrap_err();
            assert_eq!(e.problems[0].0, "hpa.target_cpu_utilization", "{bad}");
            assert_eq!(f.hpa().config().target_percent(), 35, "{bad} changed it");
        }

        // Back to 70 %: the 4 replicas at 35 % each read 35 % / 70 % = 0.5 → 2, but the
        // recommendation of 4 a sync ago is within the 300 s scale-down window.
        let mut kept = f.clone();
        kept.set_hpa_target_cpu_utilization(0.7).unwrap();
        assert_eq!(kept.vpa(), &vpa_before, "the VPA's histograms stay");
        let load = metrics(4, 4, 1.4, 400e6, 1.0);
        let r = kept.recommend(15.0, &load, res(4, 1000, 512 * MIB), &Bounds::default());
        assert!(
            r.explanation().contains("target 70%"),
            "{}",
            r.explanation()
        );
        assert_eq!(r.desired.replicas, 4, "{}", r.explanation());
        // A fallback made afresh at 70 % has no such history and scales down at once.
        let mut fresh = fallback();
        let r = fresh.recommend(15.0, &load, res(4, 1000, 512 * MIB), &Bounds::default());
        assert_eq!(r.desired.replicas, 2, "{}", r.explanation());
    }

    #[test]
    fn scales_out_under_load_and_explains_why() {
        let mut f = fallback();
        // 2 ready replicas using 1.9 cores of 2 × 1 core: 95 % / 70 % = 1.357 → ceil(2.71) = 3.
        let r = f.recommend(
            0.0,
            &metrics(2, 2, 1.9, 400e6, 1.0),
            res(2, 1000, 512 * MIB),
            &Bounds::default(),
        );
        assert_eq!(r.desired.replicas, 3);
        assert!(r.rules.contains(&Rule::HpaUtilization {
            utilization_percent: 95,
            target_percent: 70,
            usage_ratio: 95.0 / 70.0
        }));
        let text = r.explanation();
        assert!(text.contains("utilization 95%"), "{text}");
        assert!(!r.had_invalid_input());
        // The first VPA sample has no history span: bounds are [25 m-ish, ∞) → limits kept.
        assert_eq!(r.desired.cpu_millicores, 1000);
        assert_eq!(r.desired.memory_bytes, 512 * MIB);
    }

    #[test]
    fn vpa_raises_a_starved_cpu_limit() {
        let mut f = fallback();
        let current = res(2, 200, 512 * MIB);
        let mut last = None;
        // An hour of 2 pods at 0.2 core each (100 % of a 200 m limit): P90 of 0.2 core + 15 %.
        for step in 0..240 {
            let r = f.recommend(
                f64::from(step) * 15.0,
                &metrics(2, 2, 0.4, 600e6, 0.2),
                current,
                &Bounds::default(),
            );
            last = Some(r);
        }
        let r = last.unwrap();
        let e = r.vpa_estimate.unwrap();
        // 0.2 core → bucket 14, end = start(15) = 0.2 × (1.05^15 − 1) = 0.215786 → 215 m + 32.
        assert_eq!(e.target.cpu_millicores, 247.0);
        // 200 m is below the lower bound (≈ 247 × (1 + 0.024)^−2 ≈ 235): apply the target.
        assert!(r
            .rules
            .iter()
            .any(|x| matches!(x, Rule::VpaApplyTarget { .. })));
        assert_eq!(r.desired.cpu_millicores, 247);
        // Memory: 300 MB per pod → bucket 18, end 305 390 039 + 15 % → within [256, 3072] MiB.
        assert_eq!(r.desired.memory_bytes, 305_390_039 + 45_808_505);
    }

    #[test]
    fn nan_and_negative_inputs_keep_the_allocation_and_say_so() {
        let mut f = fallback();
        let current = res(4, 500, 1024 * MIB);
        let r = f.recommend(
            0.0,
            &metrics(4, 4, f64::NAN, -5.0, 0.5),
            current,
            &Bounds::default(),
        );
        assert_eq!(r.desired, current);
        assert!(r.had_invalid_input());
        let fields: Vec<_> = r
            .rules
            .iter()
            .filter_map(|x| match x {
                Rule::InvalidInput { field, .. } => Some(*field),
                _ => None,
            })
            .collect();
        assert_eq!(fields, ["cpu_usage_cores", "memory_working_set_bytes"]);
        assert!(r.explanation().contains("invalid cpu_usage_cores=NaN"));
        // No sample entered the history.
        assert_eq!(f.vpa().total_samples(), 0);
        // A NaN clock keeps everything too.
        let r = f.recommend(
            f64::NAN,
            &metrics(4, 4, 1.0, 1e8, 0.5),
            current,
            &Bounds::default(),
        );
        assert_eq!(r.desired, current);
        assert!(r.had_invalid_input());
        // Infinite usage.
        let r = f.recommend(
            15.0,
            &metrics(4, 4, f64::INFINITY, 1e8, 0.5),
            current,
            &Bounds::default(),
        );
        assert_eq!(r.desired.replicas, 4);
        assert!(r.had_invalid_input());
    }

    #[test]
    fn invalid_limit_falls_back_to_the_current_one() {
        let mut f = fallback();
        // 2 pods using 1.9 cores; the metrics' limit is NaN, the current limit of 1 core stands
        // in: 95 % → 3 replicas, as with a valid 1-core limit.
        let r = f.recommend(
            0.0,
            &metrics(2, 2, 1.9, 4e8, f64::NAN),
            res(2, 1000, 512 * MIB),
            &Bounds::default(),
        );
        assert_eq!(r.desired.replicas, 3);
        assert!(r.had_invalid_input());
        assert!(r.explanation().contains("the current cpu limit stands in"));
    }

    #[test]
    fn no_ready_pods_keeps_replicas() {
        let mut f = fallback();
        let r = f.recommend(
            0.0,
            &metrics(3, 0, 0.0, 0.0, 1.0),
            res(3, 1000, 512 * MIB),
            &Bounds::default(),
        );
        assert_eq!(r.desired.replicas, 3);
        assert!(r
            .rules
            .iter()
            .any(|x| matches!(x, Rule::HpaNoRecommendation { .. })));
    }

    #[test]
    fn output_is_clamped_into_bounds() {
        let mut f = fallback();
        // A CPU limit above the bounds (and inside the VPA's still-wide bounds): clamped.
        let r = f.recommend(
            0.0,
            &metrics(2, 2, 0.2, 1e8, 1.0),
            res(2, 5000, 512 * MIB),
            &Bounds::default(),
        );
        assert_eq!(r.desired.cpu_millicores, 2048);
        assert_eq!(r.desired.memory_bytes, 512 * MIB);
        assert!(r.rules.contains(&Rule::Clamped { dims: vec!["cpu"] }));
        // 10 MiB is below the VPA's lower bound (the 250 MiB minimum): the targets apply —
        // 0.1 core/pod → 110 m + 16 = 126 m and 250 MiB — and are raised to the bounds'
        // minimums 128 m and 256 MiB.
        let mut f = fallback();
        let r = f.recommend(
            0.0,
            &metrics(2, 2, 0.2, 1e8, 1.0),
            res(2, 1000, 10 * MIB),
            &Bounds::default(),
        );
        let e = r.vpa_estimate.unwrap();
        assert_eq!(e.target.cpu_millicores, 126.0);
        assert_eq!(e.target.memory_bytes, (250 * MIB) as f64);
        assert_eq!(r.desired.cpu_millicores, 128);
        assert_eq!(r.desired.memory_bytes, 256 * MIB);
        assert!(r.rules.contains(&Rule::Clamped {
            dims: vec!["cpu", "memory"]
        }));
        // Inverted bounds are read swapped instead of panicking.
        let inverted = Bounds {
            min_replicas: 5,
            max_replicas: 2,
            ..Bounds::default()
        };
        let r = f.recommend(
            15.0,
            &metrics(9, 9, 9.0, 1e8, 1.0),
            res(9, 1000, 512 * MIB),
            &inverted,
        );
        assert!((2..=5).contains(&r.desired.replicas));
    }

    #[test]
    fn oom_kill_raises_memory() {
        let mut f = fallback();
        let current = res(2, 500, 256 * MIB);
        let mut m = metrics(2, 2, 0.5, 500e6, 0.5);
        m.memory_limit_bytes = (256 * MIB) as f64;
        for step in 0..20 {
            m.oom_kills = u32::from(step == 10);
            let r = f.recommend(f64::from(step) * 15.0, &m, current, &Bounds::default());
            if step == 10 {
                assert!(r.rules.iter().any(|x| matches!(x, Rule::VpaOom { .. })));
            }
        }
        // The per-pod peak was 250 MB; the OOM sample max(256 MiB + 100 MiB, 1.2 × 256 MiB) is
        // now the peak of the interval.
        let h = f.vpa().memory_histogram().histogram();
        assert!(h.bucket_weight_at((356 * MIB) as f64) > 0.0);
        assert_eq!(h.bucket_weight_at(250e6), 0.0);
    }

    #[test]
    fn crash_looping_pods_still_feed_the_vpa() {
        // Every pod is unready (OOM crash loop): the HPA has nothing to go on, but the VPA samples
        // all containers, so the OOM kills raise the memory limit.
        let mut f = fallback();
        let current = res(3, 500, 512 * MIB);
        let mut m = metrics(3, 0, 0.05, 300e6, 0.5);
        let mut last = None;
        for step in 0..20u32 {
            m.oom_kills = 1;
            last = Some(f.recommend(f64::from(step) * 15.0, &m, current, &Bounds::default()));
        }
        let r = last.unwrap();
        assert!(r.vpa_estimate.is_some(), "{r}");
        assert!(r.rules.contains(&Rule::VpaQuickOom), "{r}");
        assert!(r.desired.memory_bytes > 512 * MIB, "{r}");
        assert_eq!(r.desired.replicas, 3, "{r}");
        // Without recent OOM kills the same history keeps the limits (within the bounds).
        let mut g = fallback();
        m.oom_kills = 0;
        let mut last = None;
        for step in 0..20u32 {
            last = Some(g.recommend(f64::from(step) * 15.0, &m, current, &Bounds::default()));
        }
        let r = last.unwrap();
        assert!(!r.rules.contains(&Rule::VpaQuickOom), "{r}");
    }

    fn arb_f64() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(-1.0),
            Just(0.0),
            Just(f64::MAX),
            0.0..1e3f64,
            0.0..1e12f64,
            any::<f64>(),
        ]
    }

    fn arb_metrics() -> impl Strategy<Value = RawMetrics> {
        (
            any::<u32>(),
            any::<u32>(),
            0u32..50,
            0u32..50,
            arb_f64(),
            arb_f64(),
            arb_f64(),
            arb_f64(),
            0u32..3,
        )
            .prop_map(|(r, rd, small_r, small_rd, cpu, mem, lim, mlim, oom)| {
                // Mix huge and small replica counts.
                let (replicas, ready) = if r % 2 == 0 {
                    (small_r, small_rd)
                } else {
                    (r, rd)
                };
                RawMetrics {
                    replicas,
                    ready_replicas: ready,
                    cpu_usage_cores: cpu,
                    memory_working_set_bytes: mem,
                    cpu_limit_cores: lim,
                    memory_limit_bytes: mlim,
                    oom_kills: oom,
                    ..RawMetrics::default()
                }
            })
    }

    fn arb_bounds() -> impl Strategy<Value = Bounds> {
        (
            1u32..30,
            0u32..30,
            1u32..4000,
            0u32..4000,
            1u64..(8u64 << 30),
            0u64..(8u64 << 30),
        )
            .prop_map(|(r, dr, c, dc, m, dm)| Bounds {
                min_replicas: r,
                max_replicas: r + dr,
                min_cpu_millicores: c,
                max_cpu_millicores: c + dc,
                min_memory_bytes: m,
                max_memory_bytes: m + dm,
            })
    }

    fn arb_resources() -> impl Strategy<Value = Resources> {
        (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(replicas, cpu, mem)| Resources {
            replicas,
            cpu_millicores: cpu,
            memory_bytes: mem,
        })
    }

    fn in_bounds(r: &Resources, b: &Bounds) -> bool {
        (b.min_replicas..=b.max_replicas).contains(&r.replicas)
            && (b.min_cpu_millicores..=b.max_cpu_millicores).contains(&r.cpu_millicores)
            && (b.min_memory_bytes..=b.max_memory_bytes).contains(&r.memory_bytes)
    }

    fn finite_rules(rules: &[Rule]) -> bool {
        rules.iter().all(|r| match r {
            Rule::VpaEstimate {
                target_cpu_millicores,
                target_memory_bytes,
                lower_cpu_millicores,
                upper_cpu_millicores,
                lower_memory_bytes,
                upper_memory_bytes,
                confidence_days,
            } => [
                target_cpu_millicores,
                target_memory_bytes,
                lower_cpu_millicores,
                upper_cpu_millicores,
                lower_memory_bytes,
                upper_memory_bytes,
                confidence_days,
            ]
            .iter()
            .all(|v| v.is_finite() && **v >= 0.0),
            _ => true,
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn output_always_within_bounds_and_finite(
            steps in prop::collection::vec((arb_metrics(), 0.0..120.0f64), 1..12),
            bounds in arb_bounds(),
            start in arb_resources(),
            clock in prop_oneof![Just(0.0), Just(1e9), Just(f64::NAN)],
        ) {
            let mut f = fallback();
            let mut now = if clock.is_nan() { 0.0 } else { clock };
            let mut current = start;
            for (i, (m, dt)) in steps.iter().enumerate() {
                now += dt;
                // Occasionally a broken clock.
                let t = if clock.is_nan() && i % 3 == 1 { f64::NAN } else { now };
                let r = f.recommend(t, m, current, &bounds);
                prop_assert!(in_bounds(&r.desired, &bounds), "{:?} not in {:?}", r.desired, bounds);
                prop_assert!(finite_rules(&r.rules), "{}", r);
                if let Some(e) = r.vpa_estimate {
                    prop_assert!(e.target.cpu_millicores.is_finite());
                    prop_assert!(e.target.memory_bytes.is_finite());
                }
                current = r.desired;
            }
        }

        #[test]
        fn inverted_bounds_never_panic(
            m in arb_metrics(),
            start in arb_resources(),
            a in any::<u32>(), b in any::<u32>(),
        ) {
            let mut f = fallback();
            let bounds = Bounds { min_replicas: a, max_replicas: b, ..Bounds::default() };
            let r = f.recommend(0.0, &m, start, &bounds);
            prop_assert!(r.desired.replicas >= a.min(b) && r.desired.replicas <= a.max(b));
        }
    }
}
