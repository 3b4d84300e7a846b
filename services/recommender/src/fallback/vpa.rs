//! The Vertical Pod Autoscaler recommender (and the updater's eviction rule) for the per-replica
//! CPU and memory.
//!
//! Ported from kubernetes/autoscaler `vertical-pod-autoscaler/pkg/recommender` (checked against
//! VPA 1.8.1 by the differential test `tests/upstream_diff.rs`, see below):
//! - `model/aggregations_config.go`: exponential histograms (buckets growing 5 %, first bucket
//!   0.01 core for CPU and 10 MB = 1e7 bytes for memory, up to 1000 cores / 1 TB), 24 h decay
//!   half life for both, memory aggregation interval 24 h × 8, OOM bump-up 1.2× / +100 MiB;
//! - `model/aggregate_container_state.go`: every CPU sample weighs the same (`minSampleWeight`,
//!   0.1; VPA 1.8 no longer weighs samples by the container's CPU request), first/last sample
//!   times and the sample count;
//! - `model/container.go`: one memory *peak* per aggregation interval per container (a higher
//!   sample in the same interval replaces the peak), OOM events as bumped-up memory samples,
//!   discarded when older than the latest memory sample minus one interval
//!   (kubernetes/autoscaler#8548);
//! - `logic/recommender.go` and `logic/estimator.go`: target = P90, lower bound = P50, upper
//!   bound = P95, each × (1 + 15 % safety margin); the upper bound × (1 + 1/confidence), the
//!   lower bound × (1 + 0.001/confidence)^−2, where the confidence is
//!   `min(history span in days, samples / 1440)` (`getConfidence`); then at least 25 millicores
//!   and 250 MiB (`--pod-recommendation-min-memory-mb` is multiplied by 1024²).
//! - `updater/priority`: a pod is updated (its containers get the *target* for every resource)
//!   when a request is outside [lower bound, upper bound].
//!
//! **AWARE mapping.** AWARE allocates CPU and memory *limits* per replica, so the limits stand in
//! for the container requests everywhere (OOM bump base, the updater's comparison) and the
//! recommendation is applied to the limits. A replica is one container; the target keeps one
//! memory-peak state (replicas are identical), CPU samples count once per pod.
//!
//! Choices where upstream has alternatives: the first CPU bucket is 0.01 core (VPA ≤ 1.x;
//! kubernetes/autoscaler#7554 proposes 0.001, configurable here); the updater's secondary rule
//! (evict long-lived pods whose target differs by > 10 %) needs pod ages and is not modelled.

use serde::{Deserialize, Serialize};

use super::histogram::{DecayingHistogram, ExponentialBuckets};
use super::{FallbackConfigError, Rule};

const MIB: f64 = 1024.0 * 1024.0;
/// `MaxResourceAmount` of `model/types.go`.
const MAX_RESOURCE_AMOUNT: f64 = 1e14;
/// `minSampleWeight` of `aggregations_config.go`.
const MIN_SAMPLE_WEIGHT: f64 = 0.1;
/// `epsilon = 0.001 × minSampleWeight`.
const EPSILON: f64 = 0.001 * MIN_SAMPLE_WEIGHT;
/// Confidence samples are normalised to one sample per minute.
const SAMPLES_PER_DAY: f64 = 60.0 * 24.0;
const DAY_S: f64 = 86_400.0;

/// VPA settings; defaults are upstream's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VpaConfig {
    /// `--target-cpu-percentile` / `--target-memory-percentile`.
    pub target_percentile: f64,
    /// `--recommendation-lower-bound-{cpu,memory}-percentile`.
    pub lower_bound_percentile: f64,
    /// `--recommendation-upper-bound-{cpu,memory}-percentile`.
    pub upper_bound_percentile: f64,
    /// `--recommendation-margin-fraction`.
    pub safety_margin_fraction: f64,
    /// `--pod-recommendation-min-cpu-millicores`.
    pub pod_min_cpu_millicores: f64,
    /// `--pod-recommendation-min-memory-mb` (upstream multiplies by 1024², i.e. MiB).
    pub pod_min_memory_mb: f64,
    /// Size of the first CPU bucket, cores.
    pub cpu_first_bucket_cores: f64,
    /// Size of the first memory bucket, bytes.
    pub memory_first_bucket_bytes: f64,
    /// Each bucket is this fraction larger than the previous one.
    pub bucket_size_growth: f64,
    /// `--cpu-histogram-decay-half-life`.
    pub cpu_half_life_s: f64,
    /// `--memory-histogram-decay-half-life`.
    pub memory_half_life_s: f64,
    /// `--memory-aggregation-interval`: one memory peak per interval.
    pub memory_aggregation_interval_s: f64,
    /// `--memory-aggregation-interval-count`: history without samples for
    /// interval × count is forgotten (`isExpired`).
    pub memory_aggregation_interval_count: u32,
    /// `--oom-bump-up-ratio`.
    pub oom_bump_up_ratio: f64,
    /// `--oom-min-bump-up-bytes`.
    pub oom_min_bump_up_bytes: f64,
}

impl Default for VpaConfig {
    fn default() -> Self {
        VpaConfig {
            target_percentile: 0.9,
            lower_bound_percentile: 0.5,
            upper_bound_percentile: 0.95,
            safety_margin_fraction: 0.15,
            pod_min_cpu_millicores: 25.0,
            pod_min_memory_mb: 250.0,
            cpu_first_bucket_cores: 0.01,
            memory_first_bucket_bytes: 1e7,
            bucket_size_growth: 0.05,
            cpu_half_life_s: DAY_S,
            memory_half_life_s: DAY_S,
            memory_aggregation_interval_s: DAY_S,
            memory_aggregation_interval_count: 8,
            oom_bump_up_ratio: 1.2,
            oom_min_bump_up_bytes: 100.0 * MIB,
        }
    }
}

impl VpaConfig {
    fn cpu_buckets(&self) -> Option<ExponentialBuckets> {
        ExponentialBuckets::new(
            1000.0,
            self.cpu_first_bucket_cores,
            1.0 + self.bucket_size_growth,
            EPSILON,
        )
    }

    fn memory_buckets(&self) -> Option<ExponentialBuckets> {
        ExponentialBuckets::new(
            1e12,
            self.memory_first_bucket_bytes,
            1.0 + self.bucket_size_growth,
            EPSILON,
        )
    }

    fn window_length_s(&self) -> f64 {
        self.memory_aggregation_interval_s * f64::from(self.memory_aggregation_interval_count)
    }

    pub(crate) fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let fraction = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let nonneg = |v: f64| v.is_finite() && v >= 0.0;
        for (k, v) in [
            ("vpa.target_percentile", self.target_percentile),
            ("vpa.lower_bound_percentile", self.lower_bound_percentile),
            ("vpa.upper_bound_percentile", self.upper_bound_percentile),
        ] {
            if !fraction(v) {
                out.push((k, format!("{v} must be in [0, 1]")));
            }
        }
        for (k, v) in [
            ("vpa.safety_margin_fraction", self.safety_margin_fraction),
            ("vpa.pod_min_cpu_millicores", self.pod_min_cpu_millicores),
            ("vpa.pod_min_memory_mb", self.pod_min_memory_mb),
            ("vpa.oom_min_bump_up_bytes", self.oom_min_bump_up_bytes),
        ] {
            if !nonneg(v) {
                out.push((k, format!("{v} must be ≥ 0")));
            }
        }
        for (k, v) in [
            ("vpa.cpu_half_life_s", self.cpu_half_life_s),
            ("vpa.memory_half_life_s", self.memory_half_life_s),
            (
                "vpa.memory_aggregation_interval_s",
                self.memory_aggregation_interval_s,
            ),
        ] {
            if !positive(v) {
                out.push((k, format!("{v} must be > 0")));
            }
        }
        if !(self.oom_bump_up_ratio.is_finite() && self.oom_bump_up_ratio >= 1.0) {
            out.push((
                "vpa.oom_bump_up_ratio",
                format!("{} must be ≥ 1", self.oom_bump_up_ratio),
            ));
        }
        if self.memory_aggregation_interval_count == 0 {
            out.push((
                "vpa.memory_aggregation_interval_count",
                "must be ≥ 1".to_string(),
            ));
        }
        if self.cpu_buckets().is_none() || self.memory_buckets().is_none() {
            out.push((
                "vpa.bucket_size_growth",
                "first bucket sizes must be > 0 and the growth > 0 (and not absurdly small)"
                    .to_string(),
            ));
        }
        out
    }
}

/// `ScaleResource` / `resourceAmountFromFloat`: truncated to an integer amount, within
/// `[0, MaxResourceAmount]` (0 × ∞ counts as 0).
fn scale_resource(amount: f64, factor: f64) -> f64 {
    let v = amount * factor;
    if v.is_nan() || v < 0.0 {
        0.0
    } else if v > MAX_RESOURCE_AMOUNT {
        MAX_RESOURCE_AMOUNT
    } else {
        v.trunc()
    }
}

/// CPU in millicores and memory in bytes, as upstream's `ResourceAmount`s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Amounts {
    pub cpu_millicores: f64,
    pub memory_bytes: f64,
}

/// Target and bounds of one recommendation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VpaEstimate {
    pub target: Amounts,
    pub lower_bound: Amounts,
    pub upper_bound: Amounts,
    /// `getConfidence`: history length in days, capped by samples / 1440.
    pub confidence: f64,
}

/// One VPA decision for the per-replica CPU and memory limits.
#[derive(Debug, Clone, PartialEq)]
pub struct VpaDecision {
    pub cpu_millicores: u32,
    pub memory_bytes: u64,
    pub estimate: Option<VpaEstimate>,
    pub rules: Vec<Rule>,
}

/// The aggregate state of the target's container (one per target: replicas are identical).
#[derive(Debug, Clone, PartialEq)]
pub struct Vpa {
    config: VpaConfig,
    cpu: DecayingHistogram,
    memory: DecayingHistogram,
    first_sample_s: Option<f64>,
    last_sample_s: Option<f64>,
    total_samples: u64,
    /// `ContainerState` memory-peak bookkeeping.
    window_end_s: Option<f64>,
    last_memory_sample_s: Option<f64>,
    memory_peak: f64,
    oom_peak: f64,
}

impl Vpa {
    /// Fails when the histogram layout is invalid (first bucket or growth not positive).
    pub fn new(config: VpaConfig) -> Result<Self, FallbackConfigError> {
        let problem = |k: &'static str| FallbackConfigError {
            problems: vec![(k, "invalid histogram layout".to_string())],
        };
        let cpu_b = config
            .cpu_buckets()
            .ok_or_else(|| problem("vpa.cpu_first_bucket_cores"))?;
        let mem_b = config
            .memory_buckets()
            .ok_or_else(|| problem("vpa.memory_first_bucket_bytes"))?;
        Ok(Vpa {
            cpu: DecayingHistogram::new(cpu_b, config.cpu_half_life_s),
            memory: DecayingHistogram::new(mem_b, config.memory_half_life_s),
            config,
            first_sample_s: None,
            last_sample_s: None,
            total_samples: 0,
            window_end_s: None,
            last_memory_sample_s: None,
            memory_peak: 0.0,
            oom_peak: 0.0,
        })
    }

    pub fn config(&self) -> &VpaConfig {
        &self.config
    }

    pub fn total_samples(&self) -> u64 {
        self.total_samples
    }

    pub fn cpu_histogram(&self) -> &DecayingHistogram {
        &self.cpu
    }

    pub fn memory_histogram(&self) -> &DecayingHistogram {
        &self.memory
    }

    /// Forgets everything when no CPU sample arrived for interval × count (`isExpired`: the
    /// aggregate is garbage-collected upstream). Returns whether it did.
    pub fn expire(&mut self, now_s: f64) -> bool {
        match self.last_sample_s {
            Some(last) if now_s - last >= self.config.window_length_s() => {
                self.cpu = DecayingHistogram::new(
                    *self.cpu.histogram().options(),
                    self.config.cpu_half_life_s,
                );
                self.memory = DecayingHistogram::new(
                    *self.memory.histogram().options(),
                    self.config.memory_half_life_s,
                );
                self.first_sample_s = None;
                self.last_sample_s = None;
                self.total_samples = 0;
                self.window_end_s = None;
                self.last_memory_sample_s = None;
                self.memory_peak = 0.0;
                self.oom_peak = 0.0;
                true
            }
            _ => false,
        }
    }

    /// `pods` CPU samples of `usage_cores` each (`addCPUSample`), each weighing
    /// `minSampleWeight`. Invalid values are discarded (`isValid`).
    pub fn add_cpu_samples(&mut self, time_s: f64, usage_cores: f64, pods: u32) {
        if pods == 0 || !time_s.is_finite() || !(usage_cores.is_finite() && usage_cores >= 0.0) {
            return;
        }
        // CoresFromCPUAmount(CPUAmountFromCores(x)): whole millicores.
        let usage = scale_resource(usage_cores, 1000.0) / 1000.0;
        let weight = MIN_SAMPLE_WEIGHT * f64::from(pods);
        self.cpu.add_sample(usage, weight, time_s);
        if self.last_sample_s.is_none_or(|l| time_s > l) {
            self.last_sample_s = Some(time_s);
        }
        if self.first_sample_s.is_none_or(|f| time_s < f) {
            self.first_sample_s = Some(time_s);
        }
        self.total_samples = self.total_samples.saturating_add(u64::from(pods));
    }

    fn max_memory_peak(&self) -> f64 {
        self.memory_peak.max(self.oom_peak)
    }

    /// `ContainerState.addMemorySample`: keeps one peak per aggregation interval in the memory
    /// histogram, stamped with the interval's end. Returns false if the sample was discarded.
    pub fn add_memory_sample(&mut self, time_s: f64, bytes: f64, is_oom: bool) -> bool {
        if !(time_s.is_finite() && bytes.is_finite() && bytes >= 0.0) {
            return false;
        }
        if !is_oom && self.last_memory_sample_s.is_some_and(|l| time_s < l) {
            return false;
        }
        let usage = scale_resource(bytes, 1.0);
        self.last_memory_sample_s = Some(time_s);
        let window_end = *self.window_end_s.get_or_insert(time_s);
        let interval = self.config.memory_aggregation_interval_s;
        let mut add_new_peak = false;
        let mut end = window_end;
        if time_s < window_end {
            let old = self.max_memory_peak();
            if old != 0.0 && usage > old {
                self.memory.subtract_sample(old, 1.0, window_end);
                add_new_peak = true;
            }
        } else {
            let elapsed = time_s - window_end;
            end = window_end + (elapsed - elapsed % interval) + interval;
            self.window_end_s = Some(end);
            self.memory_peak = 0.0;
            self.oom_peak = 0.0;
            add_new_peak = true;
        }
        if add_new_peak {
            self.memory.add_sample(usage, 1.0, end);
            if is_oom {
                self.oom_peak = usage;
            } else {
                self.memory_peak = usage;
            }
        }
        true
    }

    /// `ContainerState.RecordOOM`: an OOM kill with `requested_bytes` (the memory limit) adds a
    /// memory sample of max(used + 100 MiB, used × 1.2) with used = max(request, recent peak).
    /// Returns the sample, or `None` if the event is more than one aggregation interval older
    /// than the latest memory sample (measured from that sample, not from the end of its
    /// interval, which can lie up to a whole interval ahead: kubernetes/autoscaler#8548).
    pub fn record_oom(&mut self, time_s: f64, requested_bytes: f64) -> Option<f64> {
        if !time_s.is_finite() {
            return None;
        }
        if let Some(last) = self.last_memory_sample_s {
            if time_s < last - self.config.memory_aggregation_interval_s {
                return None;
            }
        }
        let requested = if requested_bytes.is_finite() {
            scale_resource(requested_bytes, 1.0)
        } else {
            0.0
        };
        let used = requested.max(self.memory_peak);
        let needed = (used + scale_resource(self.config.oom_min_bump_up_bytes, 1.0))
            .max(scale_resource(used, self.config.oom_bump_up_ratio))
            .min(MAX_RESOURCE_AMOUNT);
        self.add_memory_sample(time_s, needed, true)
            .then_some(needed)
    }

    fn confidence(&self) -> f64 {
        let span_days = match (self.first_sample_s, self.last_sample_s) {
            (Some(f), Some(l)) => (l - f) / DAY_S,
            _ => 0.0,
        };
        span_days.min(self.total_samples as f64 / SAMPLES_PER_DAY)
    }

    fn estimate_at(&self, percentile: f64, confidence_factor: Option<(f64, f64)>) -> Amounts {
        let c = &self.config;
        let conf = self.confidence();
        let one = |base: f64, min: f64| {
            let margined = base + scale_resource(base, c.safety_margin_fraction);
            let scaled = match confidence_factor {
                Some((multiplier, exponent)) => {
                    scale_resource(margined, (1.0 + multiplier / conf).powf(exponent))
                }
                None => margined,
            };
            scaled.max(min)
        };
        Amounts {
            cpu_millicores: one(
                scale_resource(self.cpu.percentile(percentile), 1000.0),
                scale_resource(c.pod_min_cpu_millicores, 1.0),
            ),
            memory_bytes: one(
                scale_resource(self.memory.percentile(percentile), 1.0),
                scale_resource(c.pod_min_memory_mb * MIB, 1.0),
            ),
        }
    }

    /// The recommendation (`GetRecommendedPodResources`), `None` before the first CPU sample.
    pub fn estimate(&self) -> Option<VpaEstimate> {
        if self.total_samples == 0 || self.cpu.is_empty() {
            return None;
        }
        Some(VpaEstimate {
            target: self.estimate_at(self.config.target_percentile, None),
            lower_bound: self.estimate_at(self.config.lower_bound_percentile, Some((0.001, -2.0))),
            upper_bound: self.estimate_at(self.config.upper_bound_percentile, Some((1.0, 1.0))),
            confidence: self.confidence(),
        })
    }

    /// The updater: the current per-replica limits move to the target when either lies outside
    /// [lower bound, upper bound]; otherwise they stay.
    pub fn decide(&self, current_cpu_millicores: u32, current_memory_bytes: u64) -> VpaDecision {
        let Some(est) = self.estimate() else {
            return VpaDecision {
                cpu_millicores: current_cpu_millicores,
                memory_bytes: current_memory_bytes,
                estimate: None,
                rules: vec![Rule::VpaNoHistory],
            };
        };
        let cpu = f64::from(current_cpu_millicores);
        let mem = current_memory_bytes as f64;
        let mut outside = Vec::new();
        if cpu < est.lower_bound.cpu_millicores || cpu > est.upper_bound.cpu_millicores {
            outside.push("cpu");
        }
        if mem < est.lower_bound.memory_bytes || mem > est.upper_bound.memory_bytes {
            outside.push("memory");
        }
        let mut rules = vec![Rule::VpaEstimate {
            target_cpu_millicores: est.target.cpu_millicores,
            target_memory_bytes: est.target.memory_bytes,
            lower_cpu_millicores: est.lower_bound.cpu_millicores,
            upper_cpu_millicores: est.upper_bound.cpu_millicores,
            lower_memory_bytes: est.lower_bound.memory_bytes,
            upper_memory_bytes: est.upper_bound.memory_bytes,
            confidence_days: est.confidence,
        }];
        if outside.is_empty() {
            rules.push(Rule::VpaWithinBounds);
            return VpaDecision {
                cpu_millicores: current_cpu_millicores,
                memory_bytes: current_memory_bytes,
                estimate: Some(est),
                rules,
            };
        }
        rules.push(Rule::VpaApplyTarget { outside });
        VpaDecision {
            cpu_millicores: est.target.cpu_millicores.clamp(0.0, f64::from(u32::MAX)) as u32,
            memory_bytes: est.target.memory_bytes.clamp(0.0, MAX_RESOURCE_AMOUNT) as u64,
            estimate: Some(est),
            rules,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: f64 = 3600.0;

    fn start(i: i32, first: f64) -> f64 {
        first * (1.05f64.powi(i) - 1.0) / 0.05
    }

    /// Steady samples every 15 s for `days` (4 pods per step), usage `cores` of a 1-core limit.
    fn steady(v: &mut Vpa, from_s: f64, days: f64, cores: f64, mem: f64) {
        let mut t = from_s;
        while t < from_s + days * DAY_S {
            v.add_cpu_samples(t, cores, 4);
            v.add_memory_sample(t, mem, false);
            t += 15.0;
        }
    }

    #[test]
    fn steady_usage_gives_p90_with_margin() {
        let mut v = Vpa::new(VpaConfig::default()).unwrap();
        steady(&mut v, 0.0, 2.0, 0.5, 300e6);
        let e = v.estimate().unwrap();
        // 0.5 core → bucket 25, P90 = start of 26 = 0.511134 → 511 m; + trunc(511 × 0.15) = 76.
        let p = (start(26, 0.01) * 1000.0).trunc();
        assert_eq!(p, 511.0);
        assert_eq!(e.target.cpu_millicores, 511.0 + 76.0);
        // 300 MB → memory bucket 18, end = start of 19 = 305 390 039 → + 15 % (truncated).
        let m = start(19, 1e7).trunc();
        assert_eq!(e.target.memory_bytes, m + (m * 0.15).trunc());
    }

    #[test]
    fn safety_margin_and_minimums() {
        let mut v = Vpa::new(VpaConfig::default()).unwrap();
        // 1 millicore and 1 MB: P90 is the end of bucket 0 = 10 m → 11 m with margin, below the
        // 25 m minimum; memory end of bucket 0 = 10 MB → 11.5 MB, below 250 MiB.
        steady(&mut v, 0.0, 1.0, 0.001, 1e6);
        let e = v.estimate().unwrap();
        assert_eq!(e.target.cpu_millicores, 25.0);
        assert_eq!(e.target.memory_bytes, 250.0 * MIB);
        assert_eq!(e.lower_bound.cpu_millicores, 25.0);
        // Without minimums the margin shows: 10 m + 1 m (trunc 1.5).
        let mut v = Vpa::new(VpaConfig {
            pod_min_cpu_millicores: 0.0,
            pod_min_memory_mb: 0.0,
            ..VpaConfig::default()
        })
        .unwrap();
        steady(&mut v, 0.0, 1.0, 0.001, 1e6);
        let e = v.estimate().unwrap();
        assert_eq!(e.target.cpu_millicores, 11.0);
        assert_eq!(e.target.memory_bytes, 1e7 + 1.5e6);
    }

    #[test]
    fn confidence_bounds_shrink_as_history_grows() {
        let mut v = Vpa::new(VpaConfig::default()).unwrap();
        steady(&mut v, 0.0, 1.0, 0.5, 300e6);
        let day1 = v.estimate().unwrap();
        // Span 1 day minus one 15 s step; samples 4 × 5760 / 1440 = 16 → confidence = span.
        let conf = (DAY_S - 15.0) / DAY_S;
        assert!((day1.confidence - conf).abs() < 1e-12);
        // P95 of 0.5 core is the same bucket end (511 m) + margin 76 = 587, × (1 + 1/conf).
        assert_eq!(
            day1.upper_bound.cpu_millicores,
            (587.0 * (1.0 + 1.0 / conf)).trunc()
        );
        assert_eq!(
            day1.lower_bound.cpu_millicores,
            (587.0 * (1.0 + 0.001 / conf).powf(-2.0)).trunc()
        );
        steady(&mut v, DAY_S, 6.0, 0.5, 300e6);
        let week = v.estimate().unwrap();
        assert!(week.confidence > 6.9);
        assert!(week.upper_bound.cpu_millicores < day1.upper_bound.cpu_millicores);
        assert!(week.lower_bound.cpu_millicores >= day1.lower_bound.cpu_millicores);
        // ≈ × 1.14 after a week (recommender.go's comment).
        let ratio = week.upper_bound.cpu_millicores / week.target.cpu_millicores;
        assert!(
            (ratio - (1.0 + 1.0 / week.confidence)).abs() < 0.01,
            "{ratio}"
        );
    }

    #[test]
    fn few_samples_cap_confidence() {
        // Two samples a day apart: span 1 day but only 2/1440 "days" of samples.
        let mut v = Vpa::new(VpaConfig::default()).unwrap();
        v.add_cpu_samples(0.0, 0.5, 1);
        v.add_cpu_samples(DAY_S, 0.5, 1);
        let e = v.estimate().unwrap();
        assert!((e.confidence - 2.0 / 1440.0).abs() < 1e-12);
    }

    #[test]
    fn memory_keeps_one_peak_per_interval() {
        let mut v = Vpa::new(VpaConfig::default()).unwrap();
        v.add_memory_sample(0.0, 100e6, false);
        v.add_memory_sample(HOUR, 300e6, false);
        v.add_memory_sample(2.0 * HOUR, 200e6, false);
        let h = v.memory_histogram().histogram();
        // Only the 300 MB peak is left in the first interval (the 100 MB peak was replaced).
        assert_eq!(h.bucket_weight_at(100e6), 0.0);
        assert_eq!(h.bucket_weight_at(200e6), 0.0);
        assert!(h.bucket_weight_at(300e6) > 0.0);
        let w1 = h.total_weight();
        // Next interval (after the window end at 24 h): a new peak of 150 MB.
        v.add_memory_sample(DAY_S + HOUR, 150e6, false);
        let h = v.memory_histogram().histogram();
        assert!(h.bucket_weight_at(150e6) > 0.0);
        assert!(h.bucket_weight_at(300e6) > 0.0);
        // The newer peak weighs twice the older one (stamped one half life later).
        assert!((h.bucket_weight_at(150e6) / w1 - 2.0).abs() < 1e-9);
        // Out-of-order samples are discarded.
        assert!(!v.add_memory_sample(0.0, 900e6, false));
    }

    #[test]
    fn oom_bumps_memory() {
        let mut v = Vpa::new(VpaConfig::default()).unwrap();
        v.add_memory_sample(0.0, 200e6, false);
        // Limit 256 MiB: used = max(256 MiB, 200 MB) → max(+100 MiB, × 1.2) = 356 MiB.
        let bumped = v.record_oom(60.0, 256.0 * MIB).unwrap();
        assert_eq!(bumped, 356.0 * MIB);
        let h = v.memory_histogram().histogram();
        assert!(h.bucket_weight_at(356.0 * MIB) > 0.0);
        assert_eq!(h.bucket_weight_at(200e6), 0.0);
        // An OOM from before the previous interval is discarded.
        v.add_memory_sample(3.0 * DAY_S, 200e6, false);
        assert_eq!(v.record_oom(0.0, 256.0 * MIB), None);
    }

    #[test]
    fn updater_applies_target_only_outside_bounds() {
        let mut v = Vpa::new(VpaConfig::default()).unwrap();
        assert!(matches!(
            v.decide(500, 512 << 20).rules[..],
            [Rule::VpaNoHistory]
        ));
        steady(&mut v, 0.0, 7.0, 0.5, 300e6);
        let e = v.estimate().unwrap();
        // 600 m is inside [lower, upper]: keep.
        let d = v.decide(600, 380_000_000);
        assert_eq!((d.cpu_millicores, d.memory_bytes), (600, 380_000_000));
        assert!(d.rules.contains(&Rule::VpaWithinBounds));
        // 100 m is below the lower bound: both resources get the target.
        let d = v.decide(100, 380_000_000);
        assert_eq!(d.cpu_millicores, e.target.cpu_millicores as u32);
        assert_eq!(d.memory_bytes, e.target.memory_bytes as u64);
        assert!(d.rules.contains(&Rule::VpaApplyTarget {
            outside: vec!["cpu"]
        }));
        // 4 cores is above the upper bound.
        assert_eq!(
            v.decide(4000, 380_000_000).cpu_millicores,
            e.target.cpu_millicores as u32
        );
    }

    #[test]
    fn history_expires_after_eight_days_without_samples() {
        let mut v = Vpa::new(VpaConfig::default()).unwrap();
        v.add_cpu_samples(0.0, 0.5, 1);
        assert!(!v.expire(7.0 * DAY_S));
        assert!(v.estimate().is_some());
        assert!(v.expire(8.0 * DAY_S));
        assert!(v.estimate().is_none());
        assert_eq!(v.total_samples(), 0);
    }

    #[test]
    fn cpu_samples_weigh_the_same_per_pod() {
        let mut v = Vpa::new(VpaConfig::default()).unwrap();
        // VPA 1.8 weighs every sample 0.1 whatever the request (limit): 3 pods at 0.2 core
        // weigh three times 1 pod at 1 core.
        v.add_cpu_samples(0.0, 0.2, 3);
        v.add_cpu_samples(0.0, 1.0, 1);
        let h = v.cpu_histogram().histogram();
        assert!((h.bucket_weight_at(0.2) / h.bucket_weight_at(1.0) - 3.0).abs() < 1e-9);
        assert!((h.bucket_weight_at(1.0) - 0.1).abs() < 1e-12);
        // Invalid samples are dropped.
        v.add_cpu_samples(0.0, f64::NAN, 1);
        v.add_cpu_samples(0.0, -1.0, 1);
        assert_eq!(v.total_samples(), 4);
    }
}
