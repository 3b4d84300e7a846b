//! Whether a target's SLO can be met within its bounds: the pure core behind `action/1`'s
//! `slo_unreachable` (no bus, no clock; one [`SloReach`] per target, fed every decided step).
//!
//! A step is **short** when the allocation in force sits at a max bound in a dimension the
//! fallback's rule wants to exceed ([`shortage`]): the HPA's replica calculator asks for more
//! replicas than `max_replicas` (or the VPA for more CPU per replica than the CPU bound) while
//! both CPU dimensions are at their max, since the HPA measures utilization against the CPU
//! request and CPU below its bound can still absorb the load; or the VPA asks for more memory
//! than the memory bound while memory is at it. The target becomes **unreachable** once a
//! whole window of steps holds more steps that are both SLO-violating and short than the error
//! budget allows (`1 − objective` of the window) and the latest step is short. It becomes
//! reachable again after a whole window without such a step. Entering and leaving both need a
//! full window, so the verdict cannot flap from step to step.
//! Until the first window is full after a (re)start there is no verdict
//! ([`SloReach::decided`]): the action says so (`slo_judged` false), so that a restarted
//! recommender does not clear a condition it has not judged yet.
//!
//! The allocation reported as needed is the one in force with each short dimension raised to
//! what the rule computed for it: finite integers from the rule's own arithmetic, never a guess.
//! The action itself stays what the policy decided, inside the bounds: at the max of the short
//! dimension, the other dimensions where the rule puts them (the cheapest allocation that comes
//! closest).

use aware_bus_schemas::Resources;
use aware_shared::spec::{Bounds, Slo};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// `[recommender.slo_unreachable]`: how the recommender judges that an SLO cannot be met within
/// the bounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReachConfig {
    /// Steps judged at once (entering and clearing each need a whole window). Default 30
    /// (five minutes at the default 10 s step).
    pub window_steps: u32,
    /// The fraction of steps that must meet the SLO; `1 − objective` of the window is the error
    /// budget. Default 0.99. For a target whose SLO sets its own (`slo.objective`), that one.
    pub objective: f64,
}

impl Default for ReachConfig {
    fn default() -> Self {
        ReachConfig {
            window_steps: 30,
            objective: 0.99,
        }
    }
}

impl ReachConfig {
    /// The first invalid setting as (key, reason).
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if self.window_steps == 0 {
            return Some(("window_steps", "must be at least 1".into()));
        }
        if !(self.objective.is_finite() && self.objective > 0.0 && self.objective <= 1.0) {
            return Some((
                "objective",
                format!("must be in (0, 1], got {}", self.objective),
            ));
        }
        None
    }

    /// Steps of a window that may be SLO-violating and short before the budget is spent, under
    /// `slo`'s own objective when it sets one, else this setting's (rounded to 1e-9 so that a
    /// decimal objective's binary error, e.g. 0.1 × 20 read as 1.9999999999999996, does not
    /// move the threshold by a whole step).
    fn budget_steps(&self, slo: &Slo) -> f64 {
        let objective = slo.objective.unwrap_or(self.objective);
        ((1.0 - objective) * f64::from(self.window_steps) * 1e9).round() / 1e9
    }
}

/// The allocation the rule needs when `current` sits at a max bound in a dimension `unclamped`
/// (the rule's recommendation before the bounds) exceeds; `None` when no dimension is short.
/// The needed allocation is `current` with each short dimension set to `unclamped`'s value.
pub fn shortage(current: Resources, unclamped: Resources, bounds: &Bounds) -> Option<Resources> {
    let max_replicas = bounds.max_replicas.max(bounds.min_replicas);
    let max_cpu = bounds.max_cpu_millicores.max(bounds.min_cpu_millicores);
    let max_memory = bounds.max_memory_bytes.max(bounds.min_memory_bytes);
    let replicas_at_max = current.replicas >= max_replicas;
    let cpu_at_max = current.cpu_millicores >= max_cpu;
    // CPU is supplied by replicas × CPU per replica: one of them asking for more is short only
    // when the other cannot grow either.
    let replicas_short = replicas_at_max && cpu_at_max && unclamped.replicas > max_replicas;
    let cpu_short = replicas_at_max && cpu_at_max && unclamped.cpu_millicores > max_cpu;
    let memory_short = current.memory_bytes >= max_memory && unclamped.memory_bytes > max_memory;
    if !(replicas_short || cpu_short || memory_short) {
        return None;
    }
    Some(Resources {
        replicas: if replicas_short {
            unclamped.replicas
        } else {
            current.replicas
        },
        cpu_millicores: if cpu_short {
            unclamped.cpu_millicores
        } else {
            current.cpu_millicores
        },
        memory_bytes: if memory_short {
            unclamped.memory_bytes
        } else {
            current.memory_bytes
        },
    })
}

/// One judged step: SLO violated, and the allocation the rule needed when the step was short.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Step {
    violated: bool,
    short: Option<Resources>,
}

impl Step {
    /// Violated while short: a step of budget the bounds burned.
    fn burned(&self) -> bool {
        self.violated && self.short.is_some()
    }
}

/// A change of the verdict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transition {
    /// The SLO cannot be met within the bounds; the rule needs this allocation.
    Unreachable(Resources),
    /// Reachable again (a whole window without a short, violating step; or the SLO was removed).
    Reachable,
}

/// The verdict of one target over a sliding window of steps.
#[derive(Debug, Clone, PartialEq)]
pub struct SloReach {
    config: ReachConfig,
    window: VecDeque<Step>,
    /// The allocation needed, while unreachable.
    needed: Option<Resources>,
    /// The bounds and SLO the window was judged against: a change starts a new window.
    judged: Option<(Bounds, Slo)>,
    /// A verdict has been reached: a whole window since the start, or no SLO.
    decided: bool,
}

impl SloReach {
    pub fn new(config: ReachConfig) -> Self {
        SloReach {
            config,
            window: VecDeque::new(),
            needed: None,
            judged: None,
            decided: false,
        }
    }

    /// Whether [`SloReach::needed`] is a verdict: a whole window has been judged since the
    /// start (new bounds keep the verdict until their window decides), or there is no SLO.
    /// Before that, `None` says nothing.
    pub fn decided(&self) -> bool {
        self.decided
    }

    /// The allocation needed while the SLO is unreachable.
    pub fn needed(&self) -> Option<Resources> {
        self.needed
    }

    /// Folds one decided step in: whether the step violated `slo`, the allocation in force, the
    /// rule's recommendation before the bounds, and the bounds. Returns the change of verdict,
    /// if any; [`SloReach::needed`] is the verdict after it.
    pub fn observe(
        &mut self,
        slo: &Slo,
        violated: bool,
        current: Resources,
        unclamped: Resources,
        bounds: &Bounds,
    ) -> Option<Transition> {
        if slo.latency_p99_ms.is_none() && slo.throughput_rps.is_none() {
            // No SLO, nothing to reach.
            self.window.clear();
            self.judged = None;
            self.decided = true;
            return self.needed.take().map(|_| Transition::Reachable);
        }
        let judged = (*bounds, *slo);
        if self.judged != Some(judged) {
            // Steps judged against other bounds or another SLO say nothing about these: the
            // verdict stands until a whole window under the new ones decides.
            self.window.clear();
            self.judged = Some(judged);
        }
        let short = shortage(current, unclamped, bounds);
        let window = self.config.window_steps as usize;
        self.window.push_back(Step { violated, short });
        while self.window.len() > window {
            self.window.pop_front();
        }
        if self.window.len() < window {
            return None;
        }
        self.decided = true;
        let burned = self.window.iter().filter(|s| s.burned()).count();
        match self.needed {
            None => {
                if burned as f64 > self.config.budget_steps(slo) {
                    if let Some(needed) = short {
                        self.needed = Some(needed);
                        return Some(Transition::Unreachable(needed));
                    }
                }
                None
            }
            Some(_) if burned == 0 => {
                self.needed = None;
                Some(Transition::Reachable)
            }
            Some(_) => {
                if let Some(needed) = short {
                    self.needed = Some(needed);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1024 * 1024 * 1024;

    fn bounds() -> Bounds {
        Bounds {
            min_replicas: 1,
            max_replicas: 10,
            min_cpu_millicores: 100,
            max_cpu_millicores: 1000,
            min_memory_bytes: GIB / 4,
            max_memory_bytes: 2 * GIB,
        }
    }

    fn slo() -> Slo {
        Slo {
            latency_p99_ms: Some(200.0),
            ..Slo::default()
        }
    }

    fn res(replicas: u32, cpu_millicores: u32, memory_bytes: u64) -> Resources {
        Resources {
            replicas,
            cpu_millicores,
            memory_bytes,
        }
    }

    /// At the replica and CPU ceilings, the rule asking for 14 replicas.
    const AT_MAX: Resources = Resources {
        replicas: 10,
        cpu_millicores: 1000,
        memory_bytes: GIB,
    };
    const WANTS_MORE: Resources = Resources {
        replicas: 14,
        cpu_millicores: 1000,
        memory_bytes: GIB,
    };

    fn config(window_steps: u32) -> ReachConfig {
        ReachConfig {
            window_steps,
            objective: 0.99,
        }
    }

    #[test]
    fn a_dimension_is_short_only_at_its_bound_with_the_rule_asking_beyond_it() {
        let b = bounds();
        assert_eq!(shortage(AT_MAX, WANTS_MORE, &b), Some(res(14, 1000, GIB)));
        // Below the replica bound the HPA can still scale.
        assert_eq!(shortage(res(9, 1000, GIB), WANTS_MORE, &b), None);
        // CPU below its bound can still absorb the load the HPA measures against it.
        assert_eq!(shortage(res(10, 800, GIB), WANTS_MORE, &b), None);
        // At both ceilings with the rule within them: nothing asked beyond the bounds.
        assert_eq!(shortage(AT_MAX, AT_MAX, &b), None);
        // The VPA asking for more CPU per replica at both ceilings.
        assert_eq!(
            shortage(AT_MAX, res(10, 1500, GIB), &b),
            Some(res(10, 1500, GIB))
        );
        // Memory is per replica: short at its own bound, whatever the replicas.
        assert_eq!(
            shortage(res(3, 500, 2 * GIB), res(3, 500, 3 * GIB), &b),
            Some(res(3, 500, 3 * GIB))
        );
        // Inverted bounds are read with min and max swapped.
        let inverted = Bounds {
            min_replicas: 10,
            max_replicas: 1,
            ..b
        };
        assert_eq!(
            shortage(AT_MAX, WANTS_MORE, &inverted),
            Some(res(14, 1000, GIB))
        );
    }

    #[test]
    fn an_slo_met_at_the_ceiling_is_reachable() {
        let mut r = SloReach::new(config(10));
        for i in 0..50 {
            assert_eq!(
                r.observe(&slo(), false, AT_MAX, WANTS_MORE, &bounds()),
                None
            );
            assert_eq!(r.decided(), i >= 9, "step {i}");
        }
        assert_eq!(r.needed(), None);
    }

    #[test]
    fn violations_below_the_ceiling_are_reachable() {
        // Violated every step, but the HPA can still scale: the SLO is not out of reach.
        let mut r = SloReach::new(config(10));
        for _ in 0..50 {
            assert_eq!(
                r.observe(&slo(), true, res(6, 1000, GIB), WANTS_MORE, &bounds()),
                None
            );
        }
        assert_eq!(r.needed(), None);
    }

    #[test]
    fn violations_at_the_ceiling_become_unreachable_after_a_window_then_clear_after_one() {
        let mut r = SloReach::new(config(10));
        for i in 0..9 {
            assert_eq!(
                r.observe(&slo(), true, AT_MAX, WANTS_MORE, &bounds()),
                None,
                "step {i}: the window is not full yet"
            );
            assert!(!r.decided(), "step {i}: no verdict yet");
        }
        assert_eq!(
            r.observe(&slo(), true, AT_MAX, WANTS_MORE, &bounds()),
            Some(Transition::Unreachable(res(14, 1000, GIB)))
        );
        assert_eq!(r.needed(), Some(res(14, 1000, GIB)));
        // The need grows: reported, without another transition.
        let more = res(18, 1000, GIB);
        assert_eq!(r.observe(&slo(), true, AT_MAX, more, &bounds()), None);
        assert_eq!(r.needed(), Some(more));
        // Load falls: the SLO holds. The verdict stands for a whole window, then clears.
        for i in 0..9 {
            assert_eq!(
                r.observe(&slo(), false, AT_MAX, AT_MAX, &bounds()),
                None,
                "step {i}: the last burned step is still in the window"
            );
            assert_eq!(r.needed(), Some(more));
        }
        assert_eq!(
            r.observe(&slo(), false, AT_MAX, AT_MAX, &bounds()),
            Some(Transition::Reachable)
        );
        assert_eq!(r.needed(), None);
    }

    #[test]
    fn alternating_steps_do_not_flap() {
        // Every other step violated at the ceiling: the verdict is entered once and stays.
        let mut r = SloReach::new(config(10));
        let mut transitions = Vec::new();
        for i in 0..200 {
            let violated = i % 2 == 0;
            if let Some(t) = r.observe(&slo(), violated, AT_MAX, WANTS_MORE, &bounds()) {
                transitions.push((i, t));
            }
        }
        assert_eq!(
            transitions,
            vec![(9, Transition::Unreachable(res(14, 1000, GIB)))]
        );
        // One burned step in each window keeps it: no step-by-step flapping.
        let mut r = SloReach::new(config(10));
        let mut changes = 0;
        for i in 0..200 {
            let violated = i % 9 == 0;
            changes += usize::from(
                r.observe(&slo(), violated, AT_MAX, WANTS_MORE, &bounds())
                    .is_some(),
            );
        }
        assert_eq!(changes, 1);
    }

    #[test]
    fn the_error_budget_is_spent_before_the_verdict() {
        // objective 0.9 over 20 steps: 2 burned steps are within the budget, 3 are not.
        let cfg = ReachConfig {
            window_steps: 20,
            objective: 0.9,
        };
        let run = |burned: usize| {
            let mut r = SloReach::new(cfg);
            let mut last = None;
            for i in 0..20 {
                last = r.observe(&slo(), i < burned, AT_MAX, WANTS_MORE, &bounds());
            }
            last
        };
        assert_eq!(run(2), None);
        assert_eq!(run(3), Some(Transition::Unreachable(res(14, 1000, GIB))));
        // The target's own objective (`slo.objective`) is the budget, not the setting's: at 0.8
        // over 20 steps, 4 burned steps are within it; at 0.99, one is already too many.
        let own = |objective: f64, burned: usize| {
            let slo = Slo {
                objective: Some(objective),
                ..slo()
            };
            let mut r = SloReach::new(cfg);
            let mut last = None;
            for i in 0..20 {
                last = r.observe(&slo, i < burned, AT_MAX, WANTS_MORE, &bounds());
            }
            last
        };
        assert_eq!(own(0.8, 3), None);
        assert_eq!(own(0.8, 4), None);
        assert!(own(0.8, 5).is_some());
        assert!(own(0.99, 1).is_some());
    }

    #[test]
    fn without_an_slo_never_unreachable_and_removing_it_clears() {
        let none = Slo::default();
        let mut r = SloReach::new(config(5));
        for _ in 0..50 {
            assert_eq!(r.observe(&none, true, AT_MAX, WANTS_MORE, &bounds()), None);
            assert!(r.decided(), "no SLO: reachable is a verdict");
        }
        for _ in 0..5 {
            r.observe(&slo(), true, AT_MAX, WANTS_MORE, &bounds());
        }
        assert!(r.needed().is_some());
        assert_eq!(
            r.observe(&none, true, AT_MAX, WANTS_MORE, &bounds()),
            Some(Transition::Reachable)
        );
        assert_eq!(r.needed(), None);
    }

    #[test]
    fn new_bounds_are_judged_over_a_new_window() {
        let mut r = SloReach::new(config(5));
        for _ in 0..5 {
            r.observe(&slo(), true, AT_MAX, WANTS_MORE, &bounds());
        }
        assert_eq!(r.needed(), Some(res(14, 1000, GIB)));
        // The user raises maxReplicas to 20: the HPA can scale again and the SLO holds.
        let raised = Bounds {
            max_replicas: 20,
            ..bounds()
        };
        for i in 0..4 {
            assert_eq!(
                r.observe(&slo(), false, res(14, 1000, GIB), WANTS_MORE, &raised),
                None,
                "step {i}"
            );
            assert!(
                r.needed().is_some(),
                "the verdict stands until a window decides"
            );
            assert!(r.decided());
        }
        assert_eq!(
            r.observe(&slo(), false, res(14, 1000, GIB), WANTS_MORE, &raised),
            Some(Transition::Reachable)
        );
    }

    #[test]
    fn settings_are_checked() {
        assert_eq!(ReachConfig::default().problem(), None);
        for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            let c = ReachConfig {
                objective: bad,
                ..ReachConfig::default()
            };
            assert_eq!(c.problem().map(|p| p.0), Some("objective"), "{bad}");
        }
        let c = ReachConfig {
            window_steps: 0,
            ..ReachConfig::default()
        };
        assert_eq!(c.problem().map(|p| p.0), Some("window_steps"));
    }
}
