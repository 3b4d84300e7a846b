//! The Kubernetes Horizontal Pod Autoscaler algorithm for the replica count.
//!
//! Two upstream pieces (kubernetes/kubernetes):
//! - `pkg/controller/podautoscaler/replica_calculator.go` (`GetResourceReplicas`,
//!   `groupPods`) and `metrics/utilization.go` (`GetResourceUtilizationRatio`): the desired
//!   count from per-pod CPU usage against the per-pod CPU request, with the tolerance band and
//!   the treatment of unready and missing pods;
//! - `pkg/controller/podautoscaler/horizontal.go` (`reconcileAutoscaler`,
//!   `normalizeDesiredReplicasWithBehaviors`, `stabilizeRecommendationWithBehaviors`,
//!   `convertDesiredReplicasWithBehaviorRate`, `calculateScaleUpLimitWithScalingRules`,
//!   `calculateScaleDownLimitWithBehaviors`): stabilization windows, scaling policies and the
//!   min/max clamp, with the `autoscaling/v2` behavior defaults of
//!   `pkg/apis/autoscaling/v2/defaults.go`.
//!
//! **AWARE mapping.** AWARE scales CPU *limits* and does not set requests separately, so the
//! per-replica CPU limit plays the role of the pod's CPU request: utilization is CPU usage over
//! the CPU limit. Pod readiness, start time and the CPU initialization period are not observable
//! from aggregate metrics: a pod is either ready (its usage counts) or not (upstream `unreadyPods`:
//! pending, not Ready, or Ready within the CPU initialization period but measured before a full
//! metric window). One upstream route is out of reach: a running pod that has *no* metric is
//! `missingPods` whatever its readiness, so an unready pod the metrics server has not measured yet
//! counts at 100 % of its request on a scale-down upstream, and is ignored here.

use serde::{Deserialize, Serialize};

use super::Rule;
use aware_bus_schemas::RawMetrics;

/// Upstream caps replica counts at `math.MaxInt32`.
const MAX_REPLICAS: f64 = i32::MAX as f64;
/// Per-pod usage is capped (millicores) so that sums over `u32::MAX` pods fit an `i128`.
const MAX_POD_MILLI: f64 = 1e15;

/// One pod as the HPA sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PodSample {
    /// Running and Ready. Unready pods never contribute their usage (upstream removes their
    /// metrics); they count as 0 % when the ratio says scale up.
    pub ready: bool,
    /// CPU used by the pod, cores. `None` = no metric for the pod (upstream `missingPods`);
    /// NaN, infinite and negative values are treated as `None`.
    pub cpu_usage_cores: Option<f64>,
}

/// `count` identical pods (how aggregate metrics are represented without one entry per pod).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PodGroup {
    pub count: u32,
    pub pod: PodSample,
}

impl From<PodSample> for PodGroup {
    fn from(pod: PodSample) -> Self {
        PodGroup { count: 1, pod }
    }
}

/// Splits aggregate metrics into pods: `ready_replicas` ready pods (capped at `replicas`) sharing
/// `cpu_usage_cores` evenly, and the remaining `replicas − ready` pods unready. An invalid
/// (NaN, infinite, negative) usage leaves the ready pods without a metric (missing).
pub fn pods_from_metrics(m: &RawMetrics) -> [PodGroup; 2] {
    let ready = m.ready_replicas.min(m.replicas);
    let usage = valid_nonneg(m.cpu_usage_cores)
        .filter(|_| ready > 0)
        .map(|total| total / f64::from(ready));
    [
        PodGroup {
            count: ready,
            pod: PodSample {
                ready: true,
                cpu_usage_cores: usage,
            },
        },
        PodGroup {
            count: m.replicas - ready,
            pod: PodSample {
                ready: false,
                cpu_usage_cores: None,
            },
        },
    ]
}

/// Whole millicores as upstream reads a pod's usage: the resource metrics API reports nanocores
/// and `Quantity.MilliValue()` rounds up. Rounding to nanocores first keeps an exact number of
/// millicores exact (2.007 cores × 1000 is 2007.0000000000002 in floating point, which a plain
/// ceil would read as 2008 m). Capped at [`MAX_POD_MILLI`].
fn milli_value(cores: f64) -> f64 {
    let nanocores = (cores * 1e9).round();
    (nanocores / 1e6).ceil().min(MAX_POD_MILLI)
}

pub(crate) fn valid_nonneg(v: f64) -> Option<f64> {
    (v.is_finite() && v >= 0.0).then_some(v)
}

/// How several scaling policies combine (`selectPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectPolicy {
    /// The policy allowing the largest change (the default).
    Max,
    /// The policy allowing the smallest change.
    Min,
    /// No scaling in this direction.
    Disabled,
}

/// `Pods`: change by at most `value` pods per period; `Percent`: by `value` % of the replicas
/// at the start of the period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyKind {
    Pods,
    Percent,
}

/// One `HPAScalingPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalingPolicy {
    pub kind: PolicyKind,
    pub value: u32,
    pub period_s: u32,
}

/// `HPAScalingRules` for one direction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScalingRules {
    pub stabilization_window_s: u32,
    pub select_policy: SelectPolicy,
    pub policies: Vec<ScalingPolicy>,
}

impl ScalingRules {
    /// Upstream scale-up default: no stabilization, max(4 pods, 100 %) per 15 s.
    pub fn default_scale_up() -> Self {
        ScalingRules {
            stabilization_window_s: 0,
            select_policy: SelectPolicy::Max,
            policies: vec![
                ScalingPolicy {
                    kind: PolicyKind::Pods,
                    value: 4,
                    period_s: 15,
                },
                ScalingPolicy {
                    kind: PolicyKind::Percent,
                    value: 100,
                    period_s: 15,
                },
            ],
        }
    }

    /// Upstream scale-down default: 300 s stabilization (the controller's
    /// `--horizontal-pod-autoscaler-downscale-stabilization`), 100 % per 15 s.
    pub fn default_scale_down() -> Self {
        ScalingRules {
            stabilization_window_s: 300,
            select_policy: SelectPolicy::Max,
            policies: vec![ScalingPolicy {
                kind: PolicyKind::Percent,
                value: 100,
                period_s: 15,
            }],
        }
    }

    fn longest_period_s(&self) -> u32 {
        self.policies.iter().map(|p| p.period_s).max().unwrap_or(0)
    }
}

impl Default for ScalingRules {
    fn default() -> Self {
        Self::default_scale_up()
    }
}

/// HPA settings. Defaults are upstream's, except the target utilization (see the field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HpaConfig {
    /// Target average CPU utilization (usage / CPU limit), as a fraction. The HPA object must
    /// state its own target; when an `autoscaling/v2` object lists no metric at all the API
    /// server defaults it to 80 % (`DefaultCPUUtilization`). AWARE defaults to 0.7, leaving
    /// headroom for queueing latency. Upstream works in whole percent: the value is rounded to
    /// a percentage.
    pub target_cpu_utilization: f64,
    /// `--horizontal-pod-autoscaler-tolerance`: no change while |ratio − 1| ≤ tolerance.
    pub tolerance: f64,
    /// `--horizontal-pod-autoscaler-sync-period`: the HPA re-evaluates at most this often;
    /// calls in between keep the replica count.
    pub sync_period_s: f64,
    pub scale_up: ScalingRules,
    pub scale_down: ScalingRules,
}

impl Default for HpaConfig {
    fn default() -> Self {
        HpaConfig {
            target_cpu_utilization: 0.7,
            tolerance: 0.1,
            sync_period_s: 15.0,
            scale_up: ScalingRules::default_scale_up(),
            scale_down: ScalingRules::default_scale_down(),
        }
    }
}

impl HpaConfig {
    /// Target as upstream's integer percentage.
    pub fn target_percent(&self) -> i64 {
        aware_shared::spec::hpa_target_percent(self.target_cpu_utilization)
    }

    pub(crate) fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if !(self.target_cpu_utilization.is_finite() && self.target_percent() >= 1) {
            out.push((
                "hpa.target_cpu_utilization",
                format!(
                    "{} must be at least 0.01 (1 %)",
                    self.target_cpu_utilization
                ),
            ));
        }
        if !(self.tolerance.is_finite() && self.tolerance >= 0.0) {
            out.push(("hpa.tolerance", format!("{} must be ≥ 0", self.tolerance)));
        }
        if !(self.sync_period_s.is_finite() && self.sync_period_s >= 0.0) {
            out.push((
                "hpa.sync_period_s",
                format!("{} must be ≥ 0", self.sync_period_s),
            ));
        }
        out
    }
}

/// Outcome of the replica calculation (`GetResourceReplicas`).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaCalc {
    pub replicas: u32,
    /// Current utilization of the pods with metrics, whole percent (truncated, as upstream).
    pub utilization_percent: i64,
    pub usage_ratio: f64,
    pub rules: Vec<Rule>,
}

/// Why no replica count could be computed (upstream returns an error and leaves the scale alone).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplicaCalcError {
    #[error("no pods")]
    NoPods,
    #[error("did not receive metrics for targeted pods (pods might be unready)")]
    NoMetrics,
    #[error("missing CPU request (limit) for the pods")]
    NoRequest,
}

fn within(tolerance: f64, ratio: f64) -> bool {
    (1.0 - tolerance) <= ratio && ratio <= (1.0 + tolerance)
}

fn ceil_replicas(x: f64) -> u32 {
    if x.is_nan() {
        return 0;
    }
    x.ceil().clamp(0.0, MAX_REPLICAS) as u32
}

/// The replica count for `pods` against `target_percent` of `request_milli` per pod, exactly as
/// `GetResourceReplicas`: utilization over ready pods with metrics; when scaling up, unready pods
/// count as 0 %; missing pods count as `max(100 %, target)` of the request when scaling down and
/// 0 % when scaling up; after such a rebalance no change if the new ratio is within tolerance, or
/// would reverse the direction, or the new count moves against the ratio.
pub fn calculate_replicas(
    current: u32,
    pods: &[PodGroup],
    request_milli: i64,
    target_percent: i64,
    tolerance: f64,
) -> Result<ReplicaCalc, ReplicaCalcError> {
    let mut ready_with_metrics: i128 = 0;
    let mut metrics_total: i128 = 0;
    let mut missing: i128 = 0;
    let mut unready: i128 = 0;
    for g in pods {
        let n = i128::from(g.count);
        if !g.pod.ready {
            unready += n;
            continue;
        }
        match g.pod.cpu_usage_cores.and_then(valid_nonneg) {
            Some(cores) => {
                let milli = milli_value(cores) as i128;
                ready_with_metrics += n;
                metrics_total += n * milli;
            }
            None => missing += n,
        }
    }
    if ready_with_metrics + missing + unready == 0 {
        return Err(ReplicaCalcError::NoPods);
    }
    if ready_with_metrics == 0 {
        return Err(ReplicaCalcError::NoMetrics);
    }
    if request_milli <= 0 {
        return Err(ReplicaCalcError::NoRequest);
    }
    let request = i128::from(request_milli);
    let target = i128::from(target_percent.max(1));
    let utilization = |total: i128, pods: i128| (total * 100) / (request * pods);
    let util = utilization(metrics_total, ready_with_metrics);
    let ratio = util as f64 / target as f64;
    let mut rules = vec![Rule::HpaUtilization {
        utilization_percent: util as i64,
        target_percent: target as i64,
        usage_ratio: ratio,
    }];
    let done = |replicas: u32, rules: Vec<Rule>| ReplicaCalc {
        replicas,
        utilization_percent: util as i64,
        usage_ratio: ratio,
        rules,
    };

    let scale_up_with_unready = unready > 0 && ratio > 1.0;
    if !scale_up_with_unready && missing == 0 {
        if within(tolerance, ratio) {
            rules.push(Rule::HpaWithinTolerance {
                usage_ratio: ratio,
                tolerance,
            });
            return Ok(done(current, rules));
        }
        let replicas = ceil_replicas(ratio * ready_with_metrics as f64);
        return Ok(done(replicas, rules));
    }

    let mut total = metrics_total;
    let mut counted = ready_with_metrics;
    if missing > 0 {
        if ratio < 1.0 {
            let pct = target.max(100);
            total += missing * (request * pct / 100);
            counted += missing;
            rules.push(Rule::HpaMissingPods {
                pods: missing as u64,
                assumed_percent: pct as i64,
            });
        } else if ratio > 1.0 {
            counted += missing;
            rules.push(Rule::HpaMissingPods {
                pods: missing as u64,
                assumed_percent: 0,
            });
        }
    }
    if scale_up_with_unready {
        counted += unready;
        rules.push(Rule::HpaUnreadyPods {
            pods: unready as u64,
        });
    }
    let new_ratio = utilization(total, counted) as f64 / target as f64;
    if within(tolerance, new_ratio) {
        rules.push(Rule::HpaWithinTolerance {
            usage_ratio: new_ratio,
            tolerance,
        });
        return Ok(done(current, rules));
    }
    if (ratio < 1.0 && new_ratio > 1.0) || (ratio > 1.0 && new_ratio < 1.0) {
        rules.push(Rule::HpaDirectionReversed {
            usage_ratio: ratio,
            new_usage_ratio: new_ratio,
        });
        return Ok(done(current, rules));
    }
    let replicas = ceil_replicas(new_ratio * counted as f64);
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        rules.push(Rule::HpaDirectionReversed {
            usage_ratio: ratio,
            new_usage_ratio: new_ratio,
        });
        return Ok(done(current, rules));
    }
    Ok(done(replicas, rules))
}

/// One HPA decision.
#[derive(Debug, Clone, PartialEq)]
pub struct HpaDecision {
    pub replicas: u32,
    pub rules: Vec<Rule>,
    /// The replica calculator's count at the latest sync, before stabilization, rate limits
    /// and min/max: what the utilization asks for. `None` when the latest sync computed none
    /// (no metrics, or the current count outside [min, max]).
    pub proposed: Option<u32>,
}

/// The HPA controller's per-target memory: past recommendations (stabilization windows) and
/// scale events (policy periods), pruned once older than every window that could use them.
#[derive(Debug, Clone, PartialEq)]
pub struct Hpa {
    config: HpaConfig,
    recommendations: Vec<(f64, u32)>,
    scale_up_events: Vec<(f64, u32)>,
    scale_down_events: Vec<(f64, u32)>,
    last_sync_s: Option<f64>,
    /// The replica count the last sync asked for, while it is still the instruction in force.
    /// Between syncs upstream's controller writes nothing, so its last decision stands; the
    /// allocation a step reports may still lag that decision (the scrape after a scale), and
    /// answering with it would scale back and forth. `None` once another policy has acted.
    held: Option<u32>,
    /// The replica calculator's count at the latest sync ([`HpaDecision::proposed`]).
    proposed: Option<u32>,
}

/// Slack on the sync period so a caller ticking exactly every period is never skipped by
/// floating-point jitter.
const SYNC_SLACK_S: f64 = 1e-3;

impl Hpa {
    pub fn new(config: HpaConfig) -> Self {
        Hpa {
            config,
            recommendations: Vec::new(),
            scale_up_events: Vec::new(),
            scale_down_events: Vec::new(),
            last_sync_s: None,
            held: None,
            proposed: None,
        }
    }

    pub fn config(&self) -> &HpaConfig {
        &self.config
    }

    /// A new target utilization, as an edit of the HPA object's target: upstream's controller
    /// reads the target at each reconcile and keeps its stabilization history and scale events
    /// (kept per HPA, not per target value), so they are kept here too, and the next sync (not
    /// an earlier one) computes with the new target. The caller checks the value
    /// ([`HpaConfig::problems`]).
    pub fn set_target_cpu_utilization(&mut self, target: f64) {
        self.config.target_cpu_utilization = target;
    }

    /// Another policy set the replicas: until its next sync the HPA keeps what is in force
    /// instead of its own earlier decision.
    pub fn release(&mut self) {
        self.held = None;
    }

    /// One reconcile (`reconcileAutoscaler`) at `now_s`: `current` replicas (the scale's spec),
    /// the pods, the per-pod CPU request (limit) in millicores and the min/max replicas. Between
    /// syncs the answer is the last sync's decision (unless [`Hpa::release`]d), within min/max.
    pub fn reconcile(
        &mut self,
        now_s: f64,
        current: u32,
        pods: &[PodGroup],
        request_milli: i64,
        min_replicas: u32,
        max_replicas: u32,
    ) -> HpaDecision {
        if let Some(last) = self.last_sync_s {
            let next = last + self.config.sync_period_s;
            if now_s >= last && now_s < next - SYNC_SLACK_S {
                let lo = min_replicas.min(max_replicas);
                let hi = min_replicas.max(max_replicas);
                return HpaDecision {
                    replicas: self.held.map_or(current, |h| h.clamp(lo, hi)),
                    rules: vec![Rule::HpaNotDue {
                        next_sync_in_s: next - now_s,
                    }],
                    proposed: self.proposed,
                };
            }
        }
        self.last_sync_s = Some(now_s);
        self.proposed = None;
        let mut rules = Vec::new();
        let desired = if current > max_replicas {
            rules.push(Rule::HpaCurrentOutsideRange {
                current,
                to: max_replicas,
            });
            max_replicas
        } else if current < min_replicas {
            rules.push(Rule::HpaCurrentOutsideRange {
                current,
                to: min_replicas,
            });
            min_replicas
        } else {
            match calculate_replicas(
                current,
                pods,
                request_milli,
                self.config.target_percent(),
                self.config.tolerance,
            ) {
                Ok(calc) => {
                    self.proposed = Some(calc.replicas);
                    rules.extend(calc.rules);
                    self.normalize(
                        now_s,
                        current,
                        calc.replicas,
                        min_replicas,
                        max_replicas,
                        &mut rules,
                    )
                }
                Err(e) => {
                    rules.push(Rule::HpaNoRecommendation {
                        reason: e.to_string(),
                    });
                    self.held = None;
                    return HpaDecision {
                        replicas: current,
                        rules,
                        proposed: None,
                    };
                }
            }
        };
        if desired != current {
            self.store_scale_event(now_s, current, desired);
        }
        self.held = Some(desired);
        HpaDecision {
            replicas: desired,
            rules,
            proposed: self.proposed,
        }
    }

    /// `normalizeDesiredReplicasWithBehaviors`: stabilize, then apply the rate policies and the
    /// min/max clamp.
    fn normalize(
        &mut self,
        now_s: f64,
        current: u32,
        proposed: u32,
        min_replicas: u32,
        max_replicas: u32,
        rules: &mut Vec<Rule>,
    ) -> u32 {
        let stabilized = self.stabilize(now_s, current, proposed);
        if stabilized != proposed {
            rules.push(Rule::HpaStabilized {
                proposed,
                stabilized,
            });
        }
        let cur = i64::from(current);
        if stabilized > current {
            let limit = self.scale_up_limit(now_s, cur).max(cur);
            let (allowed, rule) = if i64::from(max_replicas) > limit {
                (
                    limit,
                    Rule::HpaScaleUpLimit {
                        limit: limit as u32,
                    },
                )
            } else {
                (
                    i64::from(max_replicas),
                    Rule::HpaTooManyReplicas { max: max_replicas },
                )
            };
            if i64::from(stabilized) > allowed {
                rules.push(rule);
                return allowed as u32;
            }
        } else if stabilized < current {
            let limit = self.scale_down_limit(now_s, cur).min(cur);
            let (allowed, rule) = if i64::from(min_replicas) < limit {
                (
                    limit,
                    Rule::HpaScaleDownLimit {
                        limit: limit as u32,
                    },
                )
            } else {
                (
                    i64::from(min_replicas),
                    Rule::HpaTooFewReplicas { min: min_replicas },
                )
            };
            if i64::from(stabilized) < allowed {
                rules.push(rule);
                return allowed as u32;
            }
        }
        stabilized
    }

    /// `stabilizeRecommendationWithBehaviors`: the recommendation is kept between the minimum of
    /// the recommendations within the scale-up window and the maximum of those within the
    /// scale-down window (both including this one), starting from `current`.
    fn stabilize(&mut self, now_s: f64, current: u32, proposed: u32) -> u32 {
        let up_cutoff = now_s - f64::from(self.config.scale_up.stabilization_window_s);
        let down_cutoff = now_s - f64::from(self.config.scale_down.stabilization_window_s);
        let mut up = proposed;
        let mut down = proposed;
        for &(t, r) in &self.recommendations {
            if t > up_cutoff {
                up = up.min(r);
            }
            if t > down_cutoff {
                down = down.max(r);
            }
        }
        let mut rec = current;
        if rec < up {
            rec = up;
        }
        if rec > down {
            rec = down;
        }
        // Record the unstabilized recommendation; forget those older than both windows.
        let oldest = up_cutoff.min(down_cutoff);
        self.recommendations.retain(|&(t, _)| t >= oldest);
        self.recommendations.push((now_s, proposed));
        rec
    }

    fn change_in_period(events: &[(f64, u32)], now_s: f64, period_s: u32) -> i64 {
        let cutoff = now_s - f64::from(period_s);
        events
            .iter()
            .filter(|(t, _)| *t > cutoff)
            .map(|&(_, c)| i64::from(c))
            .sum()
    }

    fn period_start(&self, now_s: f64, current: i64, period_s: u32) -> i64 {
        current - Self::change_in_period(&self.scale_up_events, now_s, period_s)
            + Self::change_in_period(&self.scale_down_events, now_s, period_s)
    }

    /// `calculateScaleUpLimitWithScalingRules`.
    fn scale_up_limit(&self, now_s: f64, current: i64) -> i64 {
        let rules = &self.config.scale_up;
        let (mut result, pick): (i64, fn(i64, i64) -> i64) = match rules.select_policy {
            SelectPolicy::Disabled => return current,
            SelectPolicy::Min => (i64::MAX, i64::min),
            SelectPolicy::Max => (i64::MIN, i64::max),
        };
        for p in &rules.policies {
            let start = self.period_start(now_s, current, p.period_s);
            let proposed = match p.kind {
                PolicyKind::Pods => start + i64::from(p.value),
                // Rounded up so that a small percentage still adds a pod.
                PolicyKind::Percent => {
                    (start as f64 * (1.0 + f64::from(p.value) / 100.0)).ceil() as i64
                }
            };
            result = pick(result, proposed);
        }
        result
    }

    /// `calculateScaleDownLimitWithBehaviors`.
    fn scale_down_limit(&self, now_s: f64, current: i64) -> i64 {
        let rules = &self.config.scale_down;
        let (mut result, pick): (i64, fn(i64, i64) -> i64) = match rules.select_policy {
            SelectPolicy::Disabled => return current,
            SelectPolicy::Min => (i64::MIN, i64::max),
            SelectPolicy::Max => (i64::MAX, i64::min),
        };
        for p in &rules.policies {
            let start = self.period_start(now_s, current, p.period_s);
            let proposed = match p.kind {
                PolicyKind::Pods => start - i64::from(p.value),
                // Truncated toward zero (Go's int32 conversion).
                PolicyKind::Percent => (start as f64 * (1.0 - f64::from(p.value) / 100.0)) as i64,
            };
            result = pick(result, proposed);
        }
        result
    }

    /// `storeScaleEvent`, dropping events older than the direction's longest policy period.
    fn store_scale_event(&mut self, now_s: f64, from: u32, to: u32) {
        if to > from {
            let keep = now_s - f64::from(self.config.scale_up.longest_period_s());
            self.scale_up_events.retain(|&(t, _)| t > keep);
            self.scale_up_events.push((now_s, to - from));
        } else {
            let keep = now_s - f64::from(self.config.scale_down.longest_period_s());
            self.scale_down_events.retain(|&(t, _)| t > keep);
            self.scale_down_events.push((now_s, from - to));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(cores: f64) -> PodGroup {
        PodSample {
            ready: true,
            cpu_usage_cores: Some(cores),
        }
        .into()
    }

    fn unready() -> PodGroup {
        PodSample {
            ready: false,
            cpu_usage_cores: None,
        }
        .into()
    }

    fn missing() -> PodGroup {
        PodSample {
            ready: true,
            cpu_usage_cores: None,
        }
        .into()
    }

    fn group(count: u32, cores: f64) -> PodGroup {
        PodGroup {
            count,
            pod: PodSample {
                ready: true,
                cpu_usage_cores: Some(cores),
            },
        }
    }

    #[test]
    fn tolerance_band_keeps_the_count() {
        // 4 pods at 0.75 of a 1-core request, target 70 %: ratio 75/70 = 1.071 ≤ 1.1.
        let c = calculate_replicas(4, &[group(4, 0.75)], 1000, 70, 0.1).unwrap();
        assert_eq!(c.utilization_percent, 75);
        assert_eq!(c.replicas, 4);
        assert!(matches!(
            c.rules.last(),
            Some(Rule::HpaWithinTolerance { .. })
        ));
        // 0.78: ratio 78/70 = 1.114 > 1.1 → ceil(1.114 × 4) = 5.
        let c = calculate_replicas(4, &[group(4, 0.78)], 1000, 70, 0.1).unwrap();
        assert_eq!(c.replicas, 5);
        // Below: 0.62 → ratio 62/70 = 0.886 < 0.9 → ceil(0.886 × 4) = 4; 0.5 → ceil(2.857) = 3.
        let c = calculate_replicas(4, &[group(4, 0.62)], 1000, 70, 0.1).unwrap();
        assert_eq!(c.replicas, 4);
        assert!(!matches!(
            c.rules.last(),
            Some(Rule::HpaWithinTolerance { .. })
        ));
        let c = calculate_replicas(4, &[group(4, 0.5)], 1000, 70, 0.1).unwrap();
        assert_eq!(c.replicas, 3);
    }

    #[test]
    fn upstream_case_scale_up_with_unready_pods() {
        // replica_calculator_test.go "ScaleUpUnreadyLessScale": requests 1 core, usage
        // 300m (unready), 500m, 700m, target 30 % → 4 replicas, utilization 60 %.
        let pods = [unready(), ready(0.5), ready(0.7)];
        let c = calculate_replicas(3, &pods, 1000, 30, 0.1).unwrap();
        assert_eq!(c.utilization_percent, 60);
        assert_eq!(c.replicas, 4);
        assert!(c.rules.contains(&Rule::HpaUnreadyPods { pods: 1 }));
    }

    #[test]
    fn unready_pods_as_zero_can_cancel_a_scale_up() {
        // 2 ready pods at 90 %, 2 unready, target 70: ratio 90/70 = 1.29 says scale up, but
        // with the unready pods at 0 % the utilization is 45 % (ratio 0.64): the direction
        // would reverse, so no change. Ignoring the rule would give ceil(1.29 × 2) = 3 < 4.
        let pods = [ready(0.9), ready(0.9), unready(), unready()];
        let c = calculate_replicas(4, &pods, 1000, 70, 0.1).unwrap();
        assert_eq!(c.replicas, 4);
        assert!(matches!(
            c.rules.last(),
            Some(Rule::HpaDirectionReversed { .. })
        ));
    }

    #[test]
    fn missing_pods_count_as_full_request_when_scaling_down() {
        // 3 pods at 100m of 1 core, 1 pod without metrics, target 50 %: utilization 10 %
        // (ratio 0.2); with the missing pod at 100 %: 1300/4000 = 32 % → ratio 0.64 →
        // ceil(0.64 × 4) = 3 (ignoring it would give ceil(0.2 × 3) = 1).
        let pods = [ready(0.1), ready(0.1), ready(0.1), missing()];
        let c = calculate_replicas(4, &pods, 1000, 50, 0.1).unwrap();
        assert_eq!(c.utilization_percent, 10);
        assert_eq!(c.replicas, 3);
        assert!(c.rules.contains(&Rule::HpaMissingPods {
            pods: 1,
            assumed_percent: 100
        }));
        // Target above 100 %: missing pods count at the target (max(100, target)).
        let c = calculate_replicas(4, &pods, 1000, 150, 0.1).unwrap();
        assert!(c.rules.contains(&Rule::HpaMissingPods {
            pods: 1,
            assumed_percent: 150
        }));
    }

    #[test]
    fn missing_pods_count_as_zero_when_scaling_up() {
        // 3 pods at 900m, 1 missing, target 50: 90 % → ratio 1.8; missing at 0 %:
        // 2700/4000 = 67 % → ratio 1.34 → ceil(5.36) = 6.
        let pods = [ready(0.9), ready(0.9), ready(0.9), missing()];
        let c = calculate_replicas(4, &pods, 1000, 50, 0.1).unwrap();
        assert_eq!(c.replicas, 6);
        assert!(c.rules.contains(&Rule::HpaMissingPods {
            pods: 1,
            assumed_percent: 0
        }));
    }

    #[test]
    fn no_metrics_and_no_request_are_errors() {
        assert_eq!(
            calculate_replicas(2, &[unready(), missing()], 1000, 70, 0.1),
            Err(ReplicaCalcError::NoMetrics)
        );
        assert_eq!(
            calculate_replicas(2, &[ready(0.5)], 0, 70, 0.1),
            Err(ReplicaCalcError::NoRequest)
        );
        assert_eq!(
            calculate_replicas(2, &[], 1000, 70, 0.1),
            Err(ReplicaCalcError::NoPods)
        );
        // NaN usage is a missing metric, not a number.
        let nan = PodGroup::from(PodSample {
            ready: true,
            cpu_usage_cores: Some(f64::NAN),
        });
        assert_eq!(
            calculate_replicas(2, &[nan], 1000, 70, 0.1),
            Err(ReplicaCalcError::NoMetrics)
        );
    }

    #[test]
    fn adapter_splits_usage_over_ready_pods() {
        let m = RawMetrics {
            replicas: 5,
            ready_replicas: 4,
            cpu_usage_cores: 2.0,
            ..RawMetrics::default()
        };
        let [r, u] = pods_from_metrics(&m);
        assert_eq!(r.count, 4);
        assert_eq!(r.pod.cpu_usage_cores, Some(0.5));
        assert!(r.pod.ready);
        assert_eq!(u.count, 1);
        assert!(!u.pod.ready);
        // More ready than replicas is capped; NaN usage leaves the ready pods missing.
        let m = RawMetrics {
            replicas: 2,
            ready_replicas: 9,
            cpu_usage_cores: f64::NAN,
            ..RawMetrics::default()
        };
        let [r, u] = pods_from_metrics(&m);
        assert_eq!((r.count, u.count), (2, 0));
        assert_eq!(r.pod.cpu_usage_cores, None);
    }

    fn hpa() -> Hpa {
        Hpa::new(HpaConfig::default())
    }

    /// Pods saturating `n` replicas: each at `util` of a 1-core request.
    fn at(n: u32, util: f64) -> [PodGroup; 1] {
        [group(n, util)]
    }

    #[test]
    fn scale_up_is_limited_to_max_of_4_pods_and_100_percent_per_period() {
        let mut h = hpa();
        // 2 pods at 100 % with a 10 % target: ratio 10 → proposal 20.
        h.config.target_cpu_utilization = 0.1;
        let d = h.reconcile(0.0, 2, &at(2, 1.0), 1000, 1, 100);
        // max(2 + 4, ceil(2 × 2)) = 6
        assert_eq!(d.replicas, 6);
        assert!(d.rules.contains(&Rule::HpaScaleUpLimit { limit: 6 }));
        // Next sync: the previous event is 15 s old, outside the period: max(6 + 4, 12) = 12.
        let d = h.reconcile(15.0, 6, &at(6, 1.0), 1000, 1, 100);
        assert_eq!(d.replicas, 12);
        let d = h.reconcile(30.0, 12, &at(12, 1.0), 1000, 1, 100);
        assert_eq!(d.replicas, 24);
    }

    #[test]
    fn scale_up_within_one_period_counts_earlier_events() {
        let mut h = Hpa::new(HpaConfig {
            sync_period_s: 5.0,
            target_cpu_utilization: 0.1,
            ..HpaConfig::default()
        });
        assert_eq!(h.reconcile(0.0, 2, &at(2, 1.0), 1000, 1, 100).replicas, 6);
        // 5 s later the +4 event is inside the 15 s period: start = 6 − 4 = 2 → limit 6.
        let d = h.reconcile(5.0, 6, &at(6, 1.0), 1000, 1, 100);
        assert_eq!(d.replicas, 6);
        assert!(d.rules.contains(&Rule::HpaScaleUpLimit { limit: 6 }));
        // At t = 15 the event (t = 0) is no longer after the cutoff 15 − 15 = 0: the limit is
        // max(6 + 4, 2 × 6) = 12.
        assert_eq!(h.reconcile(15.0, 6, &at(6, 1.0), 1000, 1, 100).replicas, 12);
    }

    #[test]
    fn scale_down_waits_for_the_300_s_stabilization_window() {
        let mut h = hpa();
        // t = 0: 10 pods at 70 % → stay at 10 (recorded recommendation 10).
        assert_eq!(h.reconcile(0.0, 10, &at(10, 0.7), 1000, 1, 20).replicas, 10);
        // The load drops to 14 %: ratio 0.2 → proposal 2, but 10 is within the window.
        let mut t = 15.0;
        while t < 300.0 {
            let d = h.reconcile(t, 10, &at(10, 0.14), 1000, 1, 20);
            assert_eq!(d.replicas, 10, "at t = {t}");
            assert!(d.rules.contains(&Rule::HpaStabilized {
                proposed: 2,
                stabilized: 10
            }));
            t += 15.0;
        }
        // t = 300: the recommendation of t = 0 is no longer after the cutoff → 2 (100 %/15 s
        // allows removing all pods; min 1).
        let d = h.reconcile(300.0, 10, &at(10, 0.14), 1000, 1, 20);
        assert_eq!(d.replicas, 2);
    }

    #[test]
    fn scale_down_uses_the_highest_recommendation_in_the_window() {
        let mut h = hpa();
        // Recommendations 10 (t=0), 6 (t=15), then 2 from t=30.
        assert_eq!(h.reconcile(0.0, 10, &at(10, 0.7), 1000, 1, 20).replicas, 10);
        // 10 pods at 42 % → ratio 0.6 → 6, stabilized to 10.
        assert_eq!(
            h.reconcile(15.0, 10, &at(10, 0.42), 1000, 1, 20).replicas,
            10
        );
        // At t = 300 the 10 has expired but the 6 of t = 15 has not.
        let d = h.reconcile(300.0, 10, &at(10, 0.14), 1000, 1, 20);
        assert_eq!(d.replicas, 6);
        assert_eq!(h.reconcile(315.0, 6, &at(6, 0.14), 1000, 1, 20).replicas, 2);
    }

    /// The replica calculator's count is reported before the clamp (what the utilization asks
    /// for, beyond max), held between syncs like the decision, and absent when no count was
    /// computed.
    #[test]
    fn the_proposal_before_the_clamp_is_reported() {
        let mut h = hpa();
        // 7 pods at 100 % of the request, target 70 % → ceil(7 × 100/70) = 10 > max 7.
        let d = h.reconcile(0.0, 7, &at(7, 1.0), 1000, 1, 7);
        assert_eq!(d.replicas, 7);
        assert_eq!(d.proposed, Some(10));
        let d = h.reconcile(5.0, 7, &at(7, 1.0), 1000, 1, 7);
        assert!(matches!(d.rules[..], [Rule::HpaNotDue { .. }]));
        assert_eq!(d.proposed, Some(10));
        // Current outside [min, max]: no count computed.
        let d = h.reconcile(15.0, 9, &at(9, 1.0), 1000, 1, 7);
        assert_eq!(d.proposed, None);
        // No metrics: none either.
        let d = h.reconcile(30.0, 7, &[], 1000, 1, 7);
        assert_eq!(d.proposed, None);
    }

    #[test]
    fn min_and_max_replicas_clamp() {
        let mut h = hpa();
        h.config.target_cpu_utilization = 0.1;
        // Limit max(9, 10) = 10 > max 7 → 7 (TooManyReplicas).
        let d = h.reconcile(0.0, 5, &at(5, 1.0), 1000, 1, 7);
        assert_eq!(d.replicas, 7);
        assert!(d.rules.contains(&Rule::HpaTooManyReplicas { max: 7 }));
        // Scale down below min → min (TooFewReplicas); no stabilization in this fresh HPA.
        let mut h = hpa();
        h.config.scale_down.stabilization_window_s = 0;
        let d = h.reconcile(0.0, 5, &at(5, 0.01), 1000, 3, 7);
        assert_eq!(d.replicas, 3);
        assert!(d.rules.contains(&Rule::HpaTooFewReplicas { min: 3 }));
        // Current outside the range goes straight to the range.
        let mut h = hpa();
        assert_eq!(h.reconcile(0.0, 12, &at(12, 0.7), 1000, 1, 7).replicas, 7);
        let mut h = hpa();
        assert_eq!(h.reconcile(0.0, 1, &at(1, 0.7), 1000, 2, 7).replicas, 2);
    }

    #[test]
    fn sync_period_gates_reconciles() {
        let mut h = hpa();
        h.config.target_cpu_utilization = 0.1;
        assert_eq!(h.reconcile(0.0, 2, &at(2, 1.0), 1000, 1, 100).replicas, 6);
        let d = h.reconcile(10.0, 6, &at(6, 1.0), 1000, 1, 100);
        assert_eq!(d.replicas, 6);
        assert!(matches!(d.rules[..], [Rule::HpaNotDue { .. }]));
        // Jitter just under the period still syncs; like upstream, the +4 event of t = 0 is then
        // still inside the 15 s policy period, so the limit stays at 6.
        let d = h.reconcile(14.9995, 6, &at(6, 1.0), 1000, 1, 100);
        assert!(!d.rules.iter().any(|r| matches!(r, Rule::HpaNotDue { .. })));
        assert!(d.rules.contains(&Rule::HpaScaleUpLimit { limit: 6 }));
        assert_eq!(h.reconcile(30.0, 6, &at(6, 1.0), 1000, 1, 100).replicas, 12);
    }

    #[test]
    fn between_syncs_the_last_decision_stands_until_released() {
        let mut h = hpa();
        h.config.target_cpu_utilization = 0.5;
        assert_eq!(h.reconcile(0.0, 4, &at(4, 0.75), 1000, 1, 100).replicas, 6);
        // The next step still reports the 4 replicas of before the scale: the HPA keeps asking
        // for 6 instead of scaling back to what the step reports.
        let d = h.reconcile(10.0, 4, &at(4, 0.75), 1000, 1, 100);
        assert!(matches!(d.rules[..], [Rule::HpaNotDue { .. }]));
        assert_eq!(d.replicas, 6);
        // Bounds that changed since still clamp the held decision.
        assert_eq!(h.reconcile(11.0, 4, &at(4, 0.75), 1000, 1, 5).replicas, 5);
        // Once another policy acted, what is in force stands until the next sync.
        h.release();
        assert_eq!(h.reconcile(12.0, 9, &at(9, 0.5), 1000, 1, 100).replicas, 9);
    }

    #[test]
    fn disabled_and_min_select_policies() {
        let mut cfg = HpaConfig {
            target_cpu_utilization: 0.1,
            ..HpaConfig::default()
        };
        cfg.scale_up.select_policy = SelectPolicy::Min;
        // min(2 + 4, 4) = 4
        assert_eq!(
            Hpa::new(cfg.clone())
                .reconcile(0.0, 2, &at(2, 1.0), 1000, 1, 100)
                .replicas,
            4
        );
        cfg.scale_up.select_policy = SelectPolicy::Disabled;
        assert_eq!(
            Hpa::new(cfg)
                .reconcile(0.0, 2, &at(2, 1.0), 1000, 1, 100)
                .replicas,
            2
        );
    }
}
