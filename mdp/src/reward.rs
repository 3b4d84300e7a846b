//! The objective.

/// The range of [`reward`]: `[0, 2]` (SP, RU_cpu, RU_mem each in [0, 1], α in [0, 1]).
pub const REWARD_RANGE: [f64; 2] = [0.0, 2.0];

/// The paper's reward: `α·SP·|R| + (1−α)·(RU_cpu + RU_mem)`, |R| = 2 resources. SP is
/// [`crate::slo_preservation`], RU the [`crate::utilization`] of the CPU and memory limits.
pub fn reward(alpha: f64, slo_preservation: f64, cpu_util: f64, memory_util: f64) -> f64 {
    alpha * slo_preservation * 2.0 + (1.0 - alpha) * (cpu_util + memory_util)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_formula() {
        assert_eq!(reward(0.5, 1.0, 0.5, 0.5), 1.5);
        assert_eq!(reward(1.0, 0.25, 0.9, 0.9), 0.5);
        assert_eq!(reward(0.0, 0.0, 0.3, 0.2), 0.5);
        assert_eq!(reward(0.5, 1.0, 1.0, 1.0), REWARD_RANGE[1]);
        assert_eq!(reward(0.5, 0.0, 0.0, 0.0), REWARD_RANGE[0]);
    }
}
