//! Running state normalization (mean/std), frozen while serving.

use crate::error::{check_dim, check_finite, ModelError};

/// Smallest standard deviation used for scaling: a feature that was constant so far is centred
/// but not blown up when it starts to move (states are O(1) by construction).
pub const STD_FLOOR: f64 = 1e-2;

/// Running per-feature mean and variance (Welford, in f64) used to normalize states to
/// `clamp((x - mean) / max(std, STD_FLOOR), -clip, clip)`.
///
/// Updates are ignored while frozen (policy serving): the statistics a policy was trained with
/// stay the ones it is served with.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalizer {
    pub(crate) mean: Vec<f64>,
    pub(crate) m2: Vec<f64>,
    pub(crate) count: u64,
    pub(crate) frozen: bool,
    pub(crate) clip: f32,
}

impl Normalizer {
    /// An empty normalizer (mean 0, std 1 until the first update).
    pub fn new(dim: usize, clip: f32) -> Self {
        Self {
            mean: vec![0.0; dim],
            m2: vec![0.0; dim],
            count: 0,
            frozen: false,
            clip,
        }
    }

    /// This normalizer with `n` features inserted before feature `at` (clamped to the width),
    /// each at mean 0, std 1 as if every state folded in so far had held a spread of 1 there.
    pub fn with_inserted(&self, at: usize, n: usize) -> Self {
        let at = at.min(self.dim());
        let mut out = self.clone();
        let ones = self.count as f64;
        out.mean.splice(at..at, std::iter::repeat_n(0.0, n));
        out.m2.splice(at..at, std::iter::repeat_n(ones, n));
        out
    }

    /// Feature count.
    pub fn dim(&self) -> usize {
        self.mean.len()
    }

    /// Number of states folded in.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Per-feature running mean.
    pub fn mean(&self) -> &[f64] {
        &self.mean
    }

    /// Per-feature population standard deviation (1 before two samples were seen), floored at
    /// [`STD_FLOOR`].
    pub fn std(&self) -> Vec<f64> {
        self.m2
            .iter()
            .map(|m2| {
                if self.count < 2 {
                    1.0
                } else {
                    (m2 / self.count as f64).sqrt().max(STD_FLOOR)
                }
            })
            .collect()
    }

    /// Stops updates (serving).
    pub fn freeze(&mut self) {
        self.frozen = true;
    }

    /// Resumes updates (training).
    pub fn unfreeze(&mut self) {
        self.frozen = false;
    }

    /// Whether updates are ignored.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Folds one state in; returns whether it was used (false while frozen). Non-finite or
    /// wrongly sized states are refused and leave the statistics unchanged.
    pub fn update(&mut self, x: &[f32]) -> Result<bool, ModelError> {
        check_dim("normalizer update", self.dim(), x.len())?;
        check_finite("normalizer update", x)?;
        if self.frozen {
            return Ok(false);
        }
        self.count += 1;
        let n = self.count as f64;
        for ((m, m2), &v) in self.mean.iter_mut().zip(self.m2.iter_mut()).zip(x) {
            let v = f64::from(v);
            let d = v - *m;
            *m += d / n;
            *m2 += d * (v - *m);
        }
        Ok(true)
    }

    /// Normalizes a state into `out` (same length). Checks dimension and finiteness.
    pub fn normalize_into(&self, x: &[f32], out: &mut [f32]) -> Result<(), ModelError> {
        check_dim("state", self.dim(), x.len())?;
        check_dim("normalized state buffer", self.dim(), out.len())?;
        check_finite("state", x)?;
        let std = self.std();
        let clip = f64::from(self.clip);
        for (((o, &v), m), s) in out.iter_mut().zip(x).zip(&self.mean).zip(&std) {
            *o = ((f64::from(v) - m) / s).clamp(-clip, clip) as f32;
        }
        Ok(())
    }

    /// Normalizes a state.
    pub fn normalize(&self, x: &[f32]) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0.0; x.len()];
        self.normalize_into(x, &mut out)?;
        Ok(out)
    }

    /// Passes the features from index `from` on through unchanged (mean 0, std 1), whatever was
    /// folded in: an embedding appended to the state (`state ‖ embedding`) keeps the scale the
    /// meta-learner gave it, as `MetaDdpg::observe` does. Call it after updates.
    pub fn pin_identity(&mut self, from: usize) {
        let count = self.count as f64;
        for i in from..self.mean.len() {
            self.mean[i] = 0.0;
            self.m2[i] = count;
        }
    }

    /// Normalizes `rows` states stored back to back.
    pub(crate) fn normalize_rows(&self, xs: &[f32]) -> Result<Vec<f32>, ModelError> {
        let dim = self.dim();
        let mut out = vec![0.0; xs.len()];
        if dim == 0 {
            return Ok(out);
        }
        for (x, o) in xs.chunks(dim).zip(out.chunks_mut(dim)) {
            self.normalize_into(x, o)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_features_pass_through() {
        let mut n = Normalizer::new(3, 5.0);
        for i in 0..10 {
            n.update(&[i as f32, 0.7, -0.3]).unwrap();
        }
        n.pin_identity(1);
        assert_eq!(&n.mean()[1..], &[0.0, 0.0]);
        assert_eq!(&n.std()[1..], &[1.0, 1.0]);
        let out = n.normalize(&[4.5, 0.7, -0.3]).unwrap();
        assert!(out[0].abs() < 1e-6);
        assert!((out[1] - 0.7).abs() < 1e-6 && (out[2] + 0.3).abs() < 1e-6);
    }

    #[test]
    fn statistics_match_two_pass_computation() {
        let data: Vec<[f32; 2]> = (0..1000)
            .map(|i| {
                let x = i as f32 * 0.01;
                [x.sin() * 3.0 + 1.0, 5.0 - x]
            })
            .collect();
        let mut n = Normalizer::new(2, 5.0);
        for d in &data {
            assert!(n.update(d).unwrap());
        }
        for j in 0..2 {
            let mean: f64 = data.iter().map(|d| f64::from(d[j])).sum::<f64>() / 1000.0;
            let var: f64 = data
                .iter()
                .map(|d| (f64::from(d[j]) - mean).powi(2))
                .sum::<f64>()
                / 1000.0;
            assert!((n.mean()[j] - mean).abs() < 1e-9, "mean {j}");
            assert!((n.std()[j] - var.sqrt()).abs() < 1e-9, "std {j}");
        }
        assert_eq!(n.count(), 1000);
        // Normalized data has mean ~0 and std ~1.
        let normed: Vec<Vec<f32>> = data.iter().map(|d| n.normalize(d).unwrap()).collect();
        for j in 0..2 {
            let m: f32 = normed.iter().map(|v| v[j]).sum::<f32>() / 1000.0;
            let v: f32 = normed.iter().map(|x| (x[j] - m).powi(2)).sum::<f32>() / 1000.0;
            assert!(m.abs() < 1e-4, "normalized mean {m}");
            assert!((v - 1.0).abs() < 1e-3, "normalized var {v}");
        }
    }

    #[test]
    fn frozen_ignores_updates_and_clip_applies() {
        let mut n = Normalizer::new(1, 2.0);
        for x in [0.0, 1.0, 2.0, 3.0] {
            n.update(&[x]).unwrap();
        }
        n.freeze();
        let before = n.clone();
        assert!(!n.update(&[100.0]).unwrap());
        assert_eq!(n, before);
        assert_eq!(n.normalize(&[1000.0]).unwrap(), vec![2.0]);
        assert_eq!(n.normalize(&[-1000.0]).unwrap(), vec![-2.0]);
        n.unfreeze();
        assert!(n.update(&[100.0]).unwrap());
        assert_eq!(n.count(), 5);
    }

    #[test]
    fn empty_and_constant_features_are_safe() {
        let mut n = Normalizer::new(2, 5.0);
        assert_eq!(n.normalize(&[0.5, -0.5]).unwrap(), vec![0.5, -0.5]);
        for _ in 0..10 {
            n.update(&[3.0, 1.0]).unwrap();
        }
        assert_eq!(n.std(), vec![STD_FLOOR, STD_FLOOR]);
        let out = n.normalize(&[3.0, 1.01]).unwrap();
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 1.0).abs() < 1e-3);
    }

    #[test]
    fn refuses_nan_and_wrong_dimension() {
        let mut n = Normalizer::new(2, 5.0);
        assert!(matches!(
            n.update(&[f32::NAN, 0.0]),
            Err(ModelError::NonFinite { .. })
        ));
        assert!(matches!(
            n.normalize(&[0.0, f32::INFINITY]),
            Err(ModelError::NonFinite { .. })
        ));
        assert!(matches!(
            n.update(&[0.0]),
            Err(ModelError::Dimension { .. })
        ));
        assert_eq!(n.count(), 0);
    }
}
