//! Bucketed and decaying histograms of the VPA recommender.
//!
//! A port of `vertical-pod-autoscaler/pkg/recommender/util/histogram_options.go` (exponential
//! bucketing), `histogram.go` (bucket weights, percentiles) and `decaying_histogram.go`
//! (exponential decay with a half life and reference-timestamp renormalisation) of
//! kubernetes/autoscaler. Times are seconds (`f64`) on any monotone clock.

/// Exponentially growing buckets: bucket 0 covers `[0, first_bucket_size)`, bucket `n` has
/// size `first_bucket_size · ratio^n`, so bucket `n ≥ 1` starts at
/// `first_bucket_size · (ratio^n − 1) / (ratio − 1)`; the last bucket starts at or above
/// `max_value` and is unbounded (`NewExponentialHistogramOptions`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExponentialBuckets {
    num_buckets: usize,
    first_bucket_size: f64,
    ratio: f64,
    epsilon: f64,
}

impl ExponentialBuckets {
    /// `None` unless `max_value > 0`, `first_bucket_size > 0`, `ratio > 1`, `epsilon > 0`
    /// (all finite), as upstream requires.
    pub fn new(max_value: f64, first_bucket_size: f64, ratio: f64, epsilon: f64) -> Option<Self> {
        let finite = [max_value, first_bucket_size, ratio, epsilon]
            .iter()
            .all(|v| v.is_finite());
        if !finite || max_value <= 0.0 || first_bucket_size <= 0.0 || ratio <= 1.0 || epsilon <= 0.0
        {
            return None;
        }
        let n = (max_value * (ratio - 1.0) / first_bucket_size + 1.0).ln() / ratio.ln();
        // Bounded: at most a few thousand buckets for sane inputs; refuse absurd ones.
        if !n.is_finite() || n > 100_000.0 {
            return None;
        }
        Some(ExponentialBuckets {
            num_buckets: n.ceil() as usize + 1,
            first_bucket_size,
            ratio,
            epsilon,
        })
    }

    pub fn num_buckets(&self) -> usize {
        self.num_buckets
    }

    /// Minimum weight for a bucket to count as non-empty.
    pub fn epsilon(&self) -> f64 {
        self.epsilon
    }

    /// The bucket a value falls into; values outside the range go to the first or last bucket
    /// (NaN goes to the first).
    pub fn find_bucket(&self, value: f64) -> usize {
        if value.is_nan() || value < self.first_bucket_size {
            return 0;
        }
        let b = (value * (self.ratio - 1.0) / self.first_bucket_size + 1.0).ln() / self.ratio.ln();
        if !b.is_finite() || b >= (self.num_buckets - 1) as f64 {
            return self.num_buckets - 1;
        }
        b as usize
    }

    /// Start of bucket `bucket` (clamped to the last bucket).
    pub fn bucket_start(&self, bucket: usize) -> f64 {
        let bucket = bucket.min(self.num_buckets - 1);
        if bucket == 0 {
            return 0.0;
        }
        self.first_bucket_size * (self.ratio.powi(bucket as i32) - 1.0) / (self.ratio - 1.0)
    }
}

/// Bucket weights (`histogram.go`): each sample adds its weight to exactly one bucket and
/// `percentile` returns the *end* of the bucket where the cumulative weight reaches the
/// requested fraction (the start of the last bucket if it is the last one).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    options: ExponentialBuckets,
    bucket_weight: Vec<f64>,
    total_weight: f64,
    min_bucket: usize,
    max_bucket: usize,
}

impl Histogram {
    pub fn new(options: ExponentialBuckets) -> Self {
        let n = options.num_buckets();
        Histogram {
            options,
            bucket_weight: vec![0.0; n],
            total_weight: 0.0,
            min_bucket: n - 1,
            max_bucket: 0,
        }
    }

    pub fn options(&self) -> &ExponentialBuckets {
        &self.options
    }

    /// Adds `weight` at `value`. Negative, NaN or infinite weights are ignored (upstream
    /// panics on negative weights; a recommender must not).
    pub fn add_sample(&mut self, value: f64, weight: f64) {
        if !weight.is_finite() || weight < 0.0 {
            return;
        }
        let bucket = self.options.find_bucket(value);
        self.bucket_weight[bucket] += weight;
        self.total_weight += weight;
        let eps = self.options.epsilon();
        if bucket < self.min_bucket && self.bucket_weight[bucket] >= eps {
            self.min_bucket = bucket;
        }
        if bucket > self.max_bucket && self.bucket_weight[bucket] >= eps {
            self.max_bucket = bucket;
        }
    }

    /// Removes `weight` from the bucket of `value` and from the total; either drops to 0 when
    /// less than epsilon would remain (upstream's `safeSubtract`, so neither goes negative).
    pub fn subtract_sample(&mut self, value: f64, weight: f64) {
        if !weight.is_finite() || weight < 0.0 {
            return;
        }
        let bucket = self.options.find_bucket(value);
        let eps = self.options.epsilon();
        let safe_subtract = |from: f64| {
            let left = from - weight;
            if left < eps {
                0.0
            } else {
                left
            }
        };
        self.total_weight = safe_subtract(self.total_weight);
        self.bucket_weight[bucket] = safe_subtract(self.bucket_weight[bucket]);
        self.update_min_and_max_bucket();
    }

    pub fn is_empty(&self) -> bool {
        self.bucket_weight[self.min_bucket] < self.options.epsilon()
    }

    pub fn total_weight(&self) -> f64 {
        self.total_weight
    }

    /// Weight held by the bucket `value` falls into.
    pub fn bucket_weight_at(&self, value: f64) -> f64 {
        self.bucket_weight[self.options.find_bucket(value)]
    }

    /// The `percentile` (in `[0, 1]`) of the distribution; 0 when empty.
    pub fn percentile(&self, percentile: f64) -> f64 {
        if self.is_empty() {
            return 0.0;
        }
        let threshold = percentile * self.total_weight;
        let mut partial = 0.0;
        let mut bucket = self.min_bucket;
        while bucket < self.max_bucket {
            partial += self.bucket_weight[bucket];
            if partial >= threshold {
                break;
            }
            bucket += 1;
        }
        if bucket < self.options.num_buckets() - 1 {
            self.options.bucket_start(bucket + 1)
        } else {
            self.options.bucket_start(bucket)
        }
    }

    /// Multiplies all weights by `factor ≥ 0` (percentiles are unchanged).
    fn scale(&mut self, factor: f64) {
        if !factor.is_finite() || factor < 0.0 {
            return;
        }
        if self.min_bucket <= self.max_bucket {
            for w in &mut self.bucket_weight[self.min_bucket..=self.max_bucket] {
                *w *= factor;
            }
        }
        self.total_weight *= factor;
        self.update_min_and_max_bucket();
    }

    fn update_min_and_max_bucket(&mut self) {
        let eps = self.options.epsilon();
        let last = self.options.num_buckets() - 1;
        while self.bucket_weight[self.min_bucket] < eps && self.min_bucket < last {
            self.min_bucket += 1;
        }
        while self.bucket_weight[self.max_bucket] < eps && self.max_bucket > 0 {
            self.max_bucket -= 1;
        }
    }
}

/// When the decay factor would exceed `2^MAX_DECAY_EXPONENT` the reference time moves forward.
const MAX_DECAY_EXPONENT: f64 = 100.0;

/// A histogram whose samples lose half their weight every `half_life_s` (`decaying_histogram.go`):
/// a sample at time `t` is added with weight `w · 2^((t − reference) / half_life)`, so only the
/// relative age of samples matters; the reference (an integer multiple of the half life) is
/// shifted forward and all weights rescaled when the exponent grows past 100.
#[derive(Debug, Clone, PartialEq)]
pub struct DecayingHistogram {
    histogram: Histogram,
    half_life_s: f64,
    reference_s: f64,
}

impl DecayingHistogram {
    /// `half_life_s` must be positive and finite (checked by the configuration).
    pub fn new(options: ExponentialBuckets, half_life_s: f64) -> Self {
        DecayingHistogram {
            histogram: Histogram::new(options),
            half_life_s,
            reference_s: 0.0,
        }
    }

    pub fn add_sample(&mut self, value: f64, weight: f64, time_s: f64) {
        let factor = self.decay_factor(time_s);
        self.histogram.add_sample(value, weight * factor);
    }

    pub fn subtract_sample(&mut self, value: f64, weight: f64, time_s: f64) {
        let factor = self.decay_factor(time_s);
        self.histogram.subtract_sample(value, weight * factor);
    }

    pub fn percentile(&self, percentile: f64) -> f64 {
        self.histogram.percentile(percentile)
    }

    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// The underlying bucket weights (relative to the current reference time).
    pub fn histogram(&self) -> &Histogram {
        &self.histogram
    }

    fn shift_reference(&mut self, new_reference_s: f64) {
        let hl = self.half_life_s;
        let new_reference_s = (new_reference_s / hl).round() * hl;
        let exponent = ((self.reference_s - new_reference_s) / hl).round();
        self.histogram.scale(2f64.powf(exponent));
        self.reference_s = new_reference_s;
    }

    fn decay_factor(&mut self, time_s: f64) -> f64 {
        if !time_s.is_finite() {
            return 0.0;
        }
        if time_s > self.reference_s + self.half_life_s * MAX_DECAY_EXPONENT {
            self.shift_reference(time_s);
        }
        2f64.powf((time_s - self.reference_s) / self.half_life_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu_buckets() -> ExponentialBuckets {
        ExponentialBuckets::new(1000.0, 0.01, 1.05, 1e-4).unwrap()
    }

    #[test]
    fn exponential_buckets_match_upstream_layout() {
        let o = cpu_buckets();
        // ceil(log_1.05(1000·0.05/0.01 + 1)) + 1 = ceil(174.57) + 1
        assert_eq!(o.num_buckets(), 176);
        assert_eq!(o.find_bucket(0.0), 0);
        assert_eq!(o.find_bucket(0.0099), 0);
        assert_eq!(o.find_bucket(0.01), 1);
        assert_eq!(o.bucket_start(1), 0.01);
        assert!((o.bucket_start(2) - 0.0205).abs() < 1e-12);
        // floor(ln(6)/ln(1.05)) = 36
        assert_eq!(o.find_bucket(1.0), 36);
        assert_eq!(o.find_bucket(1e9), 175);
        assert_eq!(o.find_bucket(f64::NAN), 0);
        assert!(ExponentialBuckets::new(1000.0, 0.01, 1.0, 1e-4).is_none());
        assert!(ExponentialBuckets::new(f64::NAN, 0.01, 1.05, 1e-4).is_none());
    }

    #[test]
    fn percentiles_return_bucket_ends_on_a_known_sample_set() {
        let mut h = Histogram::new(cpu_buckets());
        assert_eq!(h.percentile(0.5), 0.0);
        for _ in 0..5 {
            h.add_sample(1.0, 1.0);
            h.add_sample(2.0, 1.0);
        }
        // P50: the cumulative weight reaches 5 in bucket 36 (1.0) → end of bucket 36 =
        // start of 37 = 0.01·(1.05^37 − 1)/0.05 = 1.016281.
        assert!((h.percentile(0.5) - 1.016_281).abs() < 1e-5);
        // P90 and P95 fall in bucket 49 (2.0) → start of 50 = 2.093480.
        assert!((h.percentile(0.9) - 2.093_480).abs() < 1e-5);
        assert!((h.percentile(0.95) - 2.093_480).abs() < 1e-5);
        // Weighting moves the median: 3× weight on 2.0.
        h.add_sample(2.0, 10.0);
        assert!((h.percentile(0.5) - 2.093_480).abs() < 1e-5);
    }

    #[test]
    fn subtract_removes_weight_and_never_goes_negative() {
        let mut h = Histogram::new(cpu_buckets());
        h.add_sample(0.5, 1.0);
        h.add_sample(2.0, 1.0);
        h.subtract_sample(2.0, 0.5);
        assert!((h.bucket_weight_at(2.0) - 0.5).abs() < 1e-12);
        assert!((h.total_weight() - 1.5).abs() < 1e-12);
        // Like upstream's safeSubtract, subtracting more than a bucket holds empties the bucket
        // and takes the whole weight off the total (floored at 0), not only what the bucket had.
        h.subtract_sample(2.0, 5.0);
        assert_eq!(h.bucket_weight_at(2.0), 0.0);
        assert_eq!(h.total_weight(), 0.0);
        assert!((h.percentile(0.99) - 0.511_134).abs() < 1e-5);
        h.subtract_sample(0.5, 1.0);
        assert!(h.is_empty());
        h.add_sample(1.0, f64::NAN);
        h.add_sample(1.0, -1.0);
        assert!(h.is_empty());
    }

    #[test]
    fn a_sample_one_half_life_older_weighs_half() {
        let day = 86_400.0;
        let mut h = DecayingHistogram::new(cpu_buckets(), day);
        h.add_sample(1.0, 1.0, 10.0 * day);
        h.add_sample(2.0, 1.0, 11.0 * day);
        let old = h.histogram().bucket_weight_at(1.0);
        let new = h.histogram().bucket_weight_at(2.0);
        assert!((new / old - 2.0).abs() < 1e-9, "ratio {}", new / old);
        // Two days apart: a quarter.
        h.add_sample(0.5, 1.0, 13.0 * day);
        let newest = h.histogram().bucket_weight_at(0.5);
        assert!((newest / new - 4.0).abs() < 1e-9);
    }

    #[test]
    fn renormalisation_keeps_relative_weights_and_finite_values() {
        let hl = 3600.0;
        let mut h = DecayingHistogram::new(cpu_buckets(), hl);
        h.add_sample(1.0, 1.0, 0.0);
        h.add_sample(2.0, 1.0, hl);
        // 150 half lives later: the reference shifts, old weights scale by 2^-150.
        h.add_sample(0.5, 1.0, 150.0 * hl);
        let w = h.histogram().bucket_weight_at(0.5);
        assert!(w.is_finite() && w > 0.0);
        assert!(h.histogram().total_weight().is_finite());
        // The old samples are negligible next to the new one: P50 is the new sample's bucket.
        assert!((h.percentile(0.5) - 0.511_134).abs() < 1e-5);
    }
}
