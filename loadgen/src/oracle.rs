//! The oracle: per step, the allocation within bounds that maximizes the step reward given the
//! true load of that step.
//!
//! For every candidate allocation on a grid over the bounds (every replica count, CPU in steps of
//! 128 millicores, memory in steps of 256 MiB, plus any extra candidates such as the allocation a
//! policy chose), the oracle clones the target in its current state (backlog, replicas still
//! starting, pending restarts), applies the candidate and advances one step with the step's true
//! arrivals and noise. Because the simulator's noise for step t depends only on (seed, target, t)
//! the candidates are compared on identical randomness, and the oracle's reward is an upper bound
//! of the reward any policy can get at that step from that state.
//!
//! [`oracle_step`] evaluates one state (e.g. along a policy's own trajectory, for per-step
//! regret); [`crate::run::PolicySpec::Oracle`] follows the oracle's choices greedily.

use crate::app::{Allocation, MIB};
use crate::cluster::{SimMetrics, TargetSim};
use crate::env::reward;

/// Candidate grid of the oracle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OracleGrid {
    /// Replica step (1 = every count).
    pub replica_step: u32,
    /// CPU step, millicores.
    pub cpu_step_millicores: u32,
    /// Memory step, bytes.
    pub memory_step_bytes: u64,
}

impl Default for OracleGrid {
    fn default() -> Self {
        OracleGrid {
            replica_step: 1,
            cpu_step_millicores: 128,
            memory_step_bytes: 256 * MIB,
        }
    }
}

/// The oracle's choice for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OracleChoice {
    /// Best allocation.
    pub allocation: Allocation,
    /// Its step reward.
    pub reward: f64,
    /// Its step metrics.
    pub metrics: SimMetrics,
    /// Candidates evaluated.
    pub evaluated: usize,
}

fn axis_u32(min: u32, max: u32, step: u32) -> Vec<u32> {
    let step = step.max(1);
    let mut v: Vec<u32> = (min..=max).step_by(step as usize).collect();
    if v.last() != Some(&max) {
        v.push(max);
    }
    v
}

fn axis_u64(min: u64, max: u64, step: u64) -> Vec<u64> {
    let step = step.max(1);
    let mut v = Vec::new();
    let mut x = min;
    while x < max {
        v.push(x);
        x = x.saturating_add(step);
    }
    v.push(max);
    v
}

/// Evaluate one candidate from `target`'s current state.
pub fn evaluate(target: &TargetSim, candidate: Allocation) -> (f64, SimMetrics) {
    let mut t = target.clone();
    let (a, _) = t.app().bounds.clamp(candidate);
    if a != t.allocation() {
        t.apply(a);
    }
    let m = t.advance();
    (
        reward(t.app().alpha, m.slo_preservation, m.cpu_util, m.memory_util),
        m,
    )
}

/// The best allocation for the next step of `target` over the grid and `extra` candidates
/// (ties go to the first found: fewer replicas, less CPU, less memory; extras last).
pub fn oracle_step(target: &TargetSim, grid: &OracleGrid, extra: &[Allocation]) -> OracleChoice {
    let b = target.app().bounds;
    let reps = axis_u32(b.min_replicas, b.max_replicas, grid.replica_step);
    let cpus = axis_u32(
        b.min_cpu_millicores,
        b.max_cpu_millicores,
        grid.cpu_step_millicores,
    );
    let mems = axis_u64(
        b.min_memory_bytes,
        b.max_memory_bytes,
        grid.memory_step_bytes,
    );
    let current = target.allocation();
    let (r0, m0) = evaluate(target, current);
    let mut best = OracleChoice {
        allocation: current,
        reward: r0,
        metrics: m0,
        evaluated: 1,
    };
    let consider = |a: Allocation, best: &mut OracleChoice| {
        let (r, m) = evaluate(target, a);
        best.evaluated += 1;
        if r > best.reward {
            best.allocation = a;
            best.reward = r;
            best.metrics = m;
        }
    };
    for &replicas in &reps {
        for &cpu_millicores in &cpus {
            for &memory_bytes in &mems {
                consider(
                    Allocation {
                        replicas,
                        cpu_millicores,
                        memory_bytes,
                    },
                    &mut best,
                );
            }
        }
    }
    for &a in extra {
        consider(b.clamp(a).0, &mut best);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{generate_apps, GeneratorOptions};
    use crate::env::{SimConfig, SimEnv, TargetAction};
    use proptest::prelude::*;

    fn coarse() -> OracleGrid {
        OracleGrid {
            replica_step: 3,
            cpu_step_millicores: 384,
            memory_step_bytes: 768 * MIB,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Along any fixed policy's own trajectory, the oracle's step reward is ≥ the policy's.
        #[test]
        fn oracle_bounds_fixed_policy_every_step(
            seed in 0u64..10_000, r in 1u32..=20, c in 128u32..=2048, m in 256u64..=3072,
        ) {
            let apps = generate_apps(2, seed, &GeneratorOptions::default());
            let mut env = SimEnv::new(apps, SimConfig { seed, ..SimConfig::default() }).unwrap();
            let fixed = Allocation { replicas: r, cpu_millicores: c, memory_bytes: m * MIB };
            for _ in 0..8 {
                let bounds: Vec<_> = (0..env.len())
                    .map(|i| oracle_step(&env.target_at_next_step(i).unwrap(), &coarse(), &[fixed]).reward)
                    .collect();
                let obs = env.step(&vec![TargetAction::Desired(fixed); env.len()]).unwrap();
                for (o, b) in obs.iter().zip(bounds) {
                    prop_assert!(b >= o.reward - 1e-12, "oracle {} < policy {}", b, o.reward);
                }
            }
        }
    }

    #[test]
    fn greedy_oracle_beats_every_fixed_policy_over_a_run() {
        for seed in [1u64, 2, 3] {
            let apps = generate_apps(2, seed, &GeneratorOptions::default());
            let cfg = SimConfig {
                seed,
                ..SimConfig::default()
            };
            let steps = 30;
            // oracle trajectory
            let mut env = SimEnv::new(apps.clone(), cfg.clone()).unwrap();
            let mut oracle_total = vec![0.0; env.len()];
            for _ in 0..steps {
                let acts: Vec<_> = (0..env.len())
                    .map(|i| {
                        let t = env.target_at_next_step(i).unwrap();
                        TargetAction::Desired(oracle_step(&t, &coarse(), &[]).allocation)
                    })
                    .collect();
                for (tot, o) in oracle_total.iter_mut().zip(env.step(&acts).unwrap()) {
                    *tot += o.reward;
                }
            }
            // fixed policies on a grid
            for r in [1u32, 4, 10, 20] {
                for c in [128u32, 512, 1024, 2048] {
                    for m in [256u64, 1024, 3072] {
                        let fixed = Allocation {
                            replicas: r,
                            cpu_millicores: c,
                            memory_bytes: m * MIB,
                        };
                        let mut env = SimEnv::new(apps.clone(), cfg.clone()).unwrap();
                        let mut total = vec![0.0; env.len()];
                        for _ in 0..steps {
                            let obs = env
                                .step(&vec![TargetAction::Desired(fixed); env.len()])
                                .unwrap();
                            for (tot, o) in total.iter_mut().zip(obs) {
                                *tot += o.reward;
                            }
                        }
                        for (o, f) in oracle_total.iter().zip(&total) {
                            assert!(
                                o >= f,
                                "seed {seed} fixed {fixed:?}: oracle {o} < fixed {f}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn axes_include_bounds() {
        assert_eq!(axis_u32(1, 20, 3).last(), Some(&20));
        assert_eq!(axis_u32(1, 20, 1).len(), 20);
        assert_eq!(axis_u64(256, 3072, 256).len(), 12);
    }
}
