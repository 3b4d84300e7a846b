//! The user's objective: the fewest requested resources subject to the SLO's error budget
//! (docs/adr/0016-constrained-objective.md).
//!
//! The constrained problem is `min E[cost]` subject to `E[violation] ≤ 1 − objective`. Its
//! Lagrangian relaxation pays each step `−cost − λ·violation`; the learner maximizes it for the
//! current multiplier λ ≥ 0, and λ follows the error budget's burn rate by dual ascent
//! ([`Multiplier`]): up while the budget burns faster than it lasts, down while it is spared.
//! [`constrained_reward`] is that pay normalized by `1 + λ` and shifted into
//! [`REWARD_RANGE`](crate::REWARD_RANGE), so the networks see rewards of one scale whatever λ
//! is. [`ObjectiveMode::Weighted`] keeps the paper's reward ([`crate::reward`]).

use serde::{Deserialize, Serialize};

use crate::{Allocation, Bounds, MIB};

/// One GiB in bytes.
pub const GIB: f64 = 1024.0 * MIB as f64;

/// What the learner maximizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectiveMode {
    /// The paper's weighted reward (SLO preservation against utilization, weighted by α), as
    /// the collector computes it.
    Weighted,
    /// The fewest requested cores and GiB subject to the SLO's error budget: the Lagrangian
    /// reward [`constrained_reward`] with a [`Multiplier`] per target.
    #[default]
    Constrained,
}

/// The objective's settings (`learning.objective`): the mode, the prices the cost is counted in,
/// and the multiplier's ascent. Keys left out take their default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Objective {
    pub mode: ObjectiveMode,
    pub prices: Prices,
    pub multiplier: MultiplierConfig,
}

impl Objective {
    /// Problems with the settings, as (key below `objective`, reason).
    pub fn problems(&self) -> Vec<(String, String)> {
        let prices = self.prices.problems().into_iter();
        let multiplier = self.multiplier.problems().into_iter();
        prices
            .map(|(k, r)| (format!("prices.{k}"), r))
            .chain(multiplier.map(|(k, r)| (format!("multiplier.{k}"), r)))
            .collect()
    }
}

/// What requested resources cost per hour: a core, and a GiB of memory. The defaults are AWS
/// Fargate's on-demand prices (Linux/x86, us-east-1): $0.04048 per vCPU-hour and $0.004445 per
/// GB-hour, about nine GiB to the core, in the range of the other clouds' per-resource prices.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Prices {
    /// Price of one core for one hour.
    pub core_hour: f64,
    /// Price of one GiB of memory for one hour.
    pub gib_hour: f64,
}

impl Default for Prices {
    fn default() -> Self {
        Prices {
            core_hour: 0.04048,
            gib_hour: 0.004445,
        }
    }
}

impl Prices {
    /// Cores of an allocation, all replicas.
    pub fn cores(a: &Allocation) -> f64 {
        f64::from(a.replicas) * f64::from(a.cpu_millicores) / 1000.0
    }

    /// GiB of an allocation, all replicas.
    pub fn gib(a: &Allocation) -> f64 {
        f64::from(a.replicas) * a.memory_bytes as f64 / GIB
    }

    /// What the allocation costs per hour.
    pub fn per_hour(&self, a: &Allocation) -> f64 {
        Self::cores(a) * self.core_hour + Self::gib(a) * self.gib_hour
    }

    /// The share of a spend the workload used: requested `cores` and `gib` (the means of an
    /// episode, say) weighted by their prices, each times its utilization (usage over requests,
    /// clamped to [0, 1]). At a given load, the cheaper of two allocations that serve it is the
    /// one with the higher share, so it compares the cost of policies across episodes whose
    /// load differs. `None` when nothing was spent or a value is not finite or negative.
    pub fn used_share(&self, cores: f64, gib: f64, cpu_util: f64, memory_util: f64) -> Option<f64> {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        if !(ok(cores) && ok(gib) && ok(cpu_util) && ok(memory_util)) {
            return None;
        }
        let (c, g) = (cores * self.core_hour, gib * self.gib_hour);
        let spent = c + g;
        let used = c * cpu_util.min(1.0) + g * memory_util.min(1.0);
        (spent > 0.0 && spent.is_finite()).then(|| (used / spent).clamp(0.0, 1.0))
    }

    /// Problems with the prices, as (key, reason).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        for (key, v) in [("core_hour", self.core_hour), ("gib_hour", self.gib_hour)] {
            if !(v.is_finite() && v >= 0.0) {
                out.push((key, format!("must be finite and ≥ 0, got {v}")));
            }
        }
        if out.is_empty() && self.core_hour + self.gib_hour <= 0.0 {
            out.push(("core_hour", "core_hour and gib_hour are both 0".to_string()));
        }
        out
    }

    /// The allocation's cost as a share of the most the bounds allow (every maximum at once), in
    /// [0, 1]; an allocation outside the bounds is clamped to them. `None` when the maximum
    /// costs nothing (both prices 0) or a value is not finite.
    pub fn cost_fraction(&self, a: &Allocation, bounds: &Bounds) -> Option<f64> {
        let max = self.per_hour(&Allocation {
            replicas: bounds.max_replicas,
            cpu_millicores: bounds.max_cpu_millicores,
            memory_bytes: bounds.max_memory_bytes,
        });
        let c = self.per_hour(a) / max;
        (max > 0.0 && c.is_finite()).then(|| c.clamp(0.0, 1.0))
    }
}

/// The Lagrangian reward of one step: `2·((1 − cost) + λ·(1 − violated)) / (1 + λ)`, in
/// [`REWARD_RANGE`](crate::REWARD_RANGE). `cost` is [`Prices::cost_fraction`] of the allocation
/// the step ran with, `violated` whether the step missed the SLO, λ the target's
/// [`Multiplier`]. Up to the positive factor `2/(1 + λ)` and a constant, this is
/// `−cost − λ·violated`: the same maximizer. A NaN or negative λ is read as 0, a NaN cost as 1.
pub fn constrained_reward(lambda: f64, cost: f64, violated: bool) -> f64 {
    let c = if cost.is_nan() {
        1.0
    } else {
        cost.clamp(0.0, 1.0)
    };
    let met = if violated { 0.0 } else { 1.0 };
    // The weight λ/(1 + λ) of the violation term, written so a huge λ neither overflows nor
    // leaves the range (NaN and λ ≤ 0 weigh nothing).
    let w = if lambda == f64::INFINITY {
        1.0
    } else if lambda > 0.0 {
        lambda / (1.0 + lambda)
    } else {
        0.0
    };
    2.0 * ((1.0 - w) * (1.0 - c) + w * met)
}

/// The settings of the multiplier's dual ascent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MultiplierConfig {
    /// λ before any episode was seen. 1: violating a step costs as much as the whole bound range.
    pub initial: f64,
    /// Step of the ascent in log λ per episode, scaled by how far the burn rate is from 1
    /// (clipped to [−1, 1]): λ at most doubles or halves every `ln 2 / rate` episodes.
    pub rate: f64,
    /// λ stays in [min, max].
    pub min: f64,
    pub max: f64,
}

impl Default for MultiplierConfig {
    fn default() -> Self {
        MultiplierConfig {
            initial: 1.0,
            rate: 0.5,
            min: 0.01,
            max: 100.0,
        }
    }
}

impl MultiplierConfig {
    /// Problems with the settings, as (key, reason).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if !(self.min.is_finite() && self.min > 0.0) {
            out.push(("min", format!("must be finite and > 0, got {}", self.min)));
        }
        if !(self.max.is_finite() && self.max >= self.min) {
            out.push(("max", format!("must be finite and ≥ min, got {}", self.max)));
        }
        if !(self.initial.is_finite() && self.initial >= self.min && self.initial <= self.max) {
            out.push((
                "initial",
                format!("must be in [min, max], got {}", self.initial),
            ));
        }
        if !(self.rate.is_finite() && (0.0..=10.0).contains(&self.rate)) {
            out.push(("rate", format!("must be in [0, 10], got {}", self.rate)));
        }
        out
    }
}

/// A target's Lagrange multiplier λ and the last episode its ascent has seen. The ascent is in
/// log λ (λ spans orders of magnitude: from the cost's scale to many times the SLO's), one step
/// per finished episode, so it moves with the data, not with how often the learner trains.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Multiplier {
    pub lambda: f64,
    /// The newest episode whose violations moved λ (`None`: none yet).
    pub through_episode: Option<u64>,
}

impl Multiplier {
    /// λ = `cfg.initial`, no episode seen.
    pub fn new(cfg: &MultiplierConfig) -> Self {
        Multiplier {
            lambda: cfg.initial,
            through_episode: None,
        }
    }

    /// One ascent step for a finished episode with `violations` of its `steps` missing the SLO,
    /// against the budget of `objective` (the share of steps that must meet it): `log λ +=
    /// rate · clip(burn − 1, −1, 1)`, burn = violation rate / (1 − objective), then λ clamped to
    /// [min, max]. An episode at or before `through_episode`, or without steps, changes nothing
    /// (an episode is counted once, whatever order the rounds see them in).
    pub fn observe(
        &mut self,
        cfg: &MultiplierConfig,
        episode: u64,
        violations: u32,
        steps: u32,
        objective: f64,
    ) {
        if steps == 0 || self.through_episode.is_some_and(|e| episode <= e) {
            return;
        }
        let Some(burn) = crate::burn_rate(
            u64::from(violations.min(steps)),
            u64::from(steps),
            objective,
        ) else {
            return;
        };
        self.through_episode = Some(episode);
        let step = cfg.rate * (burn - 1.0).clamp(-1.0, 1.0);
        let lambda = if self.lambda.is_finite() && self.lambda > 0.0 {
            self.lambda
        } else {
            cfg.initial
        };
        self.lambda = (lambda.ln() + step).exp().clamp(cfg.min, cfg.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::REWARD_RANGE;

    fn bounds() -> Bounds {
        Bounds::default()
    }

    #[test]
    fn the_used_share_weighs_utilization_by_price() {
        let p = Prices {
            core_hour: 3.0,
            gib_hour: 1.0,
        };
        // 2 cores at half use (3.0 of 6.0 spent) and 2 GiB fully used (2.0 of 2.0).
        let s = p.used_share(2.0, 2.0, 0.5, 1.0).unwrap();
        assert!((s - 5.0 / 8.0).abs() < 1e-12, "{s}");
        // Usage above the requests counts as all of it.
        assert_eq!(p.used_share(1.0, 0.0, 1.7, 0.0), Some(1.0));
        // Nothing spent, or a bad value: no share.
        assert_eq!(p.used_share(0.0, 0.0, 0.5, 0.5), None);
        assert_eq!(p.used_share(f64::NAN, 1.0, 0.5, 0.5), None);
        assert_eq!(p.used_share(1.0, 1.0, -0.1, 0.5), None);
        assert_eq!(p.used_share(1.0, f64::INFINITY, 0.5, 0.5), None);
    }

    #[test]
    fn cost_fraction_is_the_share_of_the_maximum() {
        let p = Prices::default();
        let b = bounds();
        let max = Allocation {
            replicas: b.max_replicas,
            cpu_millicores: b.max_cpu_millicores,
            memory_bytes: b.max_memory_bytes,
        };
        assert_eq!(p.cost_fraction(&max, &b), Some(1.0));
        let half = Allocation {
            replicas: b.max_replicas / 2,
            ..max
        };
        assert!((p.cost_fraction(&half, &b).unwrap() - 0.5).abs() < 1e-12);
        let over = Allocation {
            replicas: b.max_replicas * 3,
            ..max
        };
        assert_eq!(p.cost_fraction(&over, &b), Some(1.0));
        let free = Prices {
            core_hour: 0.0,
            gib_hour: 0.0,
        };
        assert_eq!(free.cost_fraction(&half, &b), None);
        assert!(!free.problems().is_empty());
        assert!(p.problems().is_empty());
        let nan = Prices {
            core_hour: f64::NAN,
            gib_hour: 1.0,
        };
        assert_eq!(nan.problems()[0].0, "core_hour");
    }

    #[test]
    fn the_reward_trades_cost_against_violations_by_lambda() {
        // λ = 1: a violation weighs as much as the whole bound range.
        assert_eq!(constrained_reward(1.0, 0.0, false), REWARD_RANGE[1]);
        assert_eq!(constrained_reward(1.0, 1.0, true), REWARD_RANGE[0]);
        assert_eq!(constrained_reward(1.0, 0.5, false), 1.5);
        // Cheaper is better at equal violation, whatever λ.
        for l in [0.0, 0.01, 1.0, 100.0, 1e300] {
            assert!(constrained_reward(l, 0.2, false) >= constrained_reward(l, 0.3, false));
            assert!(constrained_reward(l, 0.2, false) >= constrained_reward(l, 0.2, true));
            let r = constrained_reward(l, 0.3, true);
            assert!((REWARD_RANGE[0]..=REWARD_RANGE[1]).contains(&r), "{l}: {r}");
        }
        // A large λ makes a violation cost more than any saving; a small one, less.
        assert!(constrained_reward(10.0, 1.0, false) > constrained_reward(10.0, 0.0, true));
        assert!(constrained_reward(0.1, 1.0, false) < constrained_reward(0.1, 0.0, true));
        // Nonsense never leaves the range.
        for (l, c) in [(f64::NAN, 0.5), (-3.0, f64::NAN), (f64::INFINITY, 2.0)] {
            let r = constrained_reward(l, c, true);
            assert!(
                (REWARD_RANGE[0]..=REWARD_RANGE[1]).contains(&r),
                "{l} {c}: {r}"
            );
        }
    }

    #[test]
    fn lambda_rises_while_the_budget_burns_and_falls_while_it_is_spared() {
        let cfg = MultiplierConfig::default();
        let mut m = Multiplier::new(&cfg);
        // 10 of 50 steps violated against a 1% budget: burn 20, λ up by e^0.5 per episode.
        m.observe(&cfg, 0, 10, 50, 0.99);
        assert!((m.lambda - 0.5f64.exp()).abs() < 1e-9, "{}", m.lambda);
        // The same episode again (a round that reads it twice) changes nothing.
        m.observe(&cfg, 0, 10, 50, 0.99);
        assert!((m.lambda - 0.5f64.exp()).abs() < 1e-9);
        for e in 1..40 {
            m.observe(&cfg, e, 10, 50, 0.99);
        }
        assert_eq!(m.lambda, cfg.max);
        // No violation: burn 0, λ down by e^0.5 per episode, to the floor.
        for e in 40..100 {
            m.observe(&cfg, e, 0, 50, 0.99);
        }
        assert_eq!(m.lambda, cfg.min);
        assert_eq!(m.through_episode, Some(99));
        // Exactly on budget: λ stays.
        let mut m = Multiplier::new(&cfg);
        m.observe(&cfg, 0, 1, 100, 0.99);
        assert!((m.lambda - cfg.initial).abs() < 1e-9);
        // An empty episode is not an observation.
        m.observe(&cfg, 1, 0, 0, 0.99);
        assert_eq!(m.through_episode, Some(0));
    }

    #[test]
    fn multiplier_settings_are_checked() {
        assert!(MultiplierConfig::default().problems().is_empty());
        let bad = MultiplierConfig {
            initial: 1000.0,
            ..MultiplierConfig::default()
        };
        assert_eq!(bad.problems()[0].0, "initial");
        let bad = MultiplierConfig {
            min: 0.0,
            ..MultiplierConfig::default()
        };
        assert_eq!(bad.problems()[0].0, "min");
        let bad = MultiplierConfig {
            rate: f64::NAN,
            ..MultiplierConfig::default()
        };
        assert_eq!(bad.problems()[0].0, "rate");
    }
}
