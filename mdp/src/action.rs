//! The action map: a raw policy output in [−1, 1]³ to a concrete allocation within the bounds.
//!
//! Three values in [−1, 1]: `[replicas, cpu, memory]` — the paper's action space (Table 1): the
//! number of replicas and the per-replica CPU and memory limits. In the default
//! [`ActionMode::Absolute`] each value names a point of its bound range, and the change from the
//! current allocation is bounded per step (see [`ActionMap`]):
//!
//! * target `x = lo + (a + 1)/2 · (hi − lo)` for replicas, CPU millicores and memory bytes
//! * replicas: `n' = n + clamp(round(x − n), ±max_replica_delta)`
//! * CPU: `c' = c + clamp(x − c, ±cpu_delta_fraction · (max_cpu − min_cpu))`, rounded to a millicore
//! * memory: `m' = m + clamp(x − m, ±memory_delta_fraction · (max_mem − min_mem))`, rounded to a MiB
//!
//! A policy holds an allocation by naming it (an interior action), not by producing exactly 0, so
//! a saturated actor does not walk the workload into a corner of the bounds (DDPG on the delta map
//! ends at 1 or 20 replicas on most apps; docs/adr/0011-absolute-action-map.md).
//! [`ActionMode::Delta`] keeps the older map: `n' = n + round(a₀ · max_replica_delta)`,
//! `c' = c + a₁ · cpu_delta_fraction · (max_cpu − min_cpu)`, likewise memory.
//! [`action_for`] is the inverse: the raw action that asks for a given allocation.
//!
//! The result is clamped to the bounds. NaN inputs mean "no change" for that dimension; values
//! outside [−1, 1] are clamped. Every clamp is reported in [`ClampReport`]. Concrete allocations
//! (the simulator's `TargetAction::Desired`, the fallback's) are clamped to the bounds as well.

use serde::{Deserialize, Serialize};

use crate::{Allocation, Bounds, MIB};

/// Number of action dimensions.
pub const ACTION_DIM: usize = 3;

/// How a raw action value is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionMode {
    /// A point of the bound range (the paper's action space); the change per step is bounded.
    #[default]
    Absolute,
    /// A change of the current allocation.
    Delta,
}

/// Mode and per-step scale of the action map.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ActionMap {
    /// How raw values are read.
    #[serde(default)]
    pub mode: ActionMode,
    /// Replicas added/removed at |a₀| = 1.
    pub max_replica_delta: u32,
    /// CPU change at |a₁| = 1, as a fraction of the CPU bound range.
    pub cpu_delta_fraction: f64,
    /// Memory change at |a₂| = 1, as a fraction of the memory bound range.
    pub memory_delta_fraction: f64,
}

impl Default for ActionMap {
    fn default() -> Self {
        ActionMap {
            mode: ActionMode::Absolute,
            max_replica_delta: 4,
            cpu_delta_fraction: 0.25,
            memory_delta_fraction: 0.25,
        }
    }
}

/// What was clamped while mapping an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ClampReport {
    /// Some raw component was NaN (treated as no change).
    pub nan: bool,
    /// Some raw component was outside [−1, 1] (clamped).
    pub out_of_range: bool,
    /// The resulting allocation was outside the bounds (clamped).
    pub bounded: bool,
}

impl ClampReport {
    /// Whether anything was clamped.
    pub fn any(&self) -> bool {
        self.nan || self.out_of_range || self.bounded
    }
}

/// Map a raw action to a concrete allocation (see the module docs).
pub fn map_action(
    raw: [f32; ACTION_DIM],
    current: Allocation,
    bounds: &Bounds,
    map: &ActionMap,
) -> (Allocation, ClampReport) {
    let mut rep = ClampReport::default();
    let mut a = [0.0f64; ACTION_DIM];
    for (dst, &v) in a.iter_mut().zip(raw.iter()) {
        if v.is_nan() {
            rep.nan = true;
            *dst = 0.0;
        } else if !(-1.0..=1.0).contains(&v) {
            rep.out_of_range = true;
            *dst = f64::from(v.clamp(-1.0, 1.0));
        } else {
            *dst = f64::from(v);
        }
    }
    let cpu_range = (bounds.max_cpu_millicores - bounds.min_cpu_millicores) as f64;
    let mem_range = (bounds.max_memory_bytes - bounds.min_memory_bytes) as f64;
    let max_cpu_step = map.cpu_delta_fraction * cpu_range;
    let max_mem_step = map.memory_delta_fraction * mem_range;
    let (cur_r, cur_c, cur_m) = (
        current.replicas as f64,
        current.cpu_millicores as f64,
        current.memory_bytes as f64,
    );
    let (replicas, cpu, mem_bytes) = match map.mode {
        ActionMode::Delta => (
            cur_r + (a[0] * map.max_replica_delta as f64).round(),
            cur_c + (a[1] * max_cpu_step).round(),
            cur_m + a[2] * max_mem_step,
        ),
        ActionMode::Absolute => {
            // NaN (a = 0 above) means "no change", not the middle of the range
            let point = |i: usize, lo: f64, hi: f64, cur: f64| {
                if raw[i].is_nan() {
                    cur
                } else {
                    lo + (a[i] + 1.0) / 2.0 * (hi - lo)
                }
            };
            let step = |x: f64, cur: f64, max: f64| cur + (x - cur).clamp(-max, max);
            let r = point(
                0,
                f64::from(bounds.min_replicas),
                f64::from(bounds.max_replicas),
                cur_r,
            );
            let c = point(
                1,
                f64::from(bounds.min_cpu_millicores),
                f64::from(bounds.max_cpu_millicores),
                cur_c,
            );
            let m = point(
                2,
                bounds.min_memory_bytes as f64,
                bounds.max_memory_bytes as f64,
                cur_m,
            );
            let dr = map.max_replica_delta as f64;
            (
                step(r.round(), cur_r, dr),
                step(c, cur_c, max_cpu_step).round(),
                step(m, cur_m, max_mem_step),
            )
        }
    };
    let mem_mib = mem_bytes / MIB as f64;
    let unclamped = Allocation {
        replicas: replicas.clamp(0.0, u32::MAX as f64) as u32,
        cpu_millicores: cpu.clamp(0.0, u32::MAX as f64) as u32,
        memory_bytes: (mem_mib.round().max(0.0) as u64) * MIB,
    };
    let (alloc, bounded) = bounds.clamp(unclamped);
    // memory rounding to a MiB alone is not a bounds clamp
    rep.bounded = bounded
        && (unclamped.replicas != alloc.replicas
            || unclamped.cpu_millicores != alloc.cpu_millicores
            || unclamped.memory_bytes != alloc.memory_bytes);
    (alloc, rep)
}

/// The raw action that asks for `desired` from `current` under `map`: the inverse of
/// [`map_action`] (exact up to rounding while `desired` is inside the bounds and, for
/// [`ActionMode::Delta`], within one step's reach), clamped to [−1, 1]. Used to express a
/// fallback's decisions as behaviour actions in the policy's action space.
pub fn action_for(
    desired: Allocation,
    current: Allocation,
    bounds: &Bounds,
    map: &ActionMap,
) -> [f32; ACTION_DIM] {
    let unit = |x: f64| {
        if x.is_finite() {
            x.clamp(-1.0, 1.0) as f32
        } else {
            0.0
        }
    };
    let cpu_range = (bounds
        .max_cpu_millicores
        .saturating_sub(bounds.min_cpu_millicores) as f64)
        .max(1.0);
    let mem_range = (bounds
        .max_memory_bytes
        .saturating_sub(bounds.min_memory_bytes) as f64)
        .max(1.0);
    match map.mode {
        ActionMode::Absolute => {
            let rep_range =
                (bounds.max_replicas.saturating_sub(bounds.min_replicas) as f64).max(1.0);
            let point = |x: f64, lo: f64, range: f64| unit(2.0 * (x - lo) / range - 1.0);
            [
                point(
                    f64::from(desired.replicas),
                    f64::from(bounds.min_replicas),
                    rep_range,
                ),
                point(
                    f64::from(desired.cpu_millicores),
                    f64::from(bounds.min_cpu_millicores),
                    cpu_range,
                ),
                point(
                    desired.memory_bytes as f64,
                    bounds.min_memory_bytes as f64,
                    mem_range,
                ),
            ]
        }
        ActionMode::Delta => [
            unit(
                (f64::from(desired.replicas) - f64::from(current.replicas))
                    / f64::from(map.max_replica_delta.max(1)),
            ),
            unit(
                (f64::from(desired.cpu_millicores) - f64::from(current.cpu_millicores))
                    / (map.cpu_delta_fraction * cpu_range),
            ),
            unit(
                (desired.memory_bytes as f64 - current.memory_bytes as f64)
                    / (map.memory_delta_fraction * mem_range),
            ),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn absolute_action_map_documented_behaviour() {
        let b = Bounds::default();
        let m = ActionMap::default();
        assert_eq!(m.mode, ActionMode::Absolute);
        let cur = Allocation {
            replicas: 5,
            cpu_millicores: 1000,
            memory_bytes: 1024 * MIB,
        };
        // the middle of every range: 10.5 → 11 replicas is 6 away, 4 per step
        let (a, r) = map_action([0.0, 0.0, 0.0], cur, &b, &m);
        assert_eq!(a.replicas, 9);
        assert_eq!(a.cpu_millicores, 1088);
        assert_eq!(a.memory_bytes, 1664 * MIB);
        assert!(!r.any());
        // a point within one step is reached exactly; holding = naming the current allocation
        let (a, _) = map_action(action_for(cur, cur, &b, &m), cur, &b, &m);
        assert_eq!(a, cur);
        let near = Allocation {
            replicas: 7,
            cpu_millicores: 1400,
            memory_bytes: 600 * MIB,
        };
        let (a, _) = map_action(action_for(near, cur, &b, &m), cur, &b, &m);
        assert_eq!(a, near);
        // far points are approached by at most one step per dimension
        let (a, _) = map_action([1.0, -1.0, 1.0], cur, &b, &m);
        assert_eq!(a.replicas, 9);
        assert_eq!(a.cpu_millicores, 1000 - 480);
        assert_eq!(a.memory_bytes, (1024 + 704) * MIB);
        // NaN keeps that dimension, out of range is clamped
        let (a, r) = map_action([f32::NAN, 5.0, f32::NAN], cur, &b, &m);
        assert_eq!(a.replicas, 5);
        assert_eq!(a.cpu_millicores, 1480);
        assert_eq!(a.memory_bytes, 1024 * MIB);
        assert!(r.nan && r.out_of_range && !r.bounded);
        // the ends of the ranges are the bounds
        let low = Allocation {
            replicas: 2,
            cpu_millicores: 200,
            memory_bytes: 300 * MIB,
        };
        let (a, r) = map_action([-1.0, -1.0, -1.0], low, &b, &m);
        assert_eq!(
            (a.replicas, a.cpu_millicores, a.memory_bytes),
            (1, 128, 256 * MIB)
        );
        assert!(!r.bounded);
        assert_eq!(action_for(a, low, &b, &m), [-1.0, -1.0, -1.0]);
    }

    #[test]
    fn delta_action_map_documented_behaviour() {
        let b = Bounds::default();
        let m = ActionMap {
            mode: ActionMode::Delta,
            ..ActionMap::default()
        };
        let cur = Allocation {
            replicas: 5,
            cpu_millicores: 1000,
            memory_bytes: 1024 * MIB,
        };
        let (a, r) = map_action([0.0, 0.0, 0.0], cur, &b, &m);
        assert_eq!(a, cur);
        assert!(!r.any());
        let (a, r) = map_action([1.0, 1.0, -1.0], cur, &b, &m);
        assert_eq!(a.replicas, 9);
        assert_eq!(a.cpu_millicores, 1000 + 480);
        assert_eq!(a.memory_bytes, (1024 - 704) * MIB);
        assert!(!r.any());
        let (a, r) = map_action([f32::NAN, 5.0, 0.0], cur, &b, &m);
        assert_eq!(a.replicas, 5);
        assert_eq!(a.cpu_millicores, 1480);
        assert!(r.nan && r.out_of_range && !r.bounded);
        let (a, r) = map_action(
            [-1.0, -1.0, -1.0],
            Allocation {
                replicas: 2,
                cpu_millicores: 200,
                memory_bytes: 300 * MIB,
            },
            &b,
            &m,
        );
        assert_eq!(a.replicas, 1);
        assert_eq!(a.cpu_millicores, 128);
        assert_eq!(a.memory_bytes, 256 * MIB);
        assert!(r.bounded);
        let up = Allocation {
            replicas: 7,
            cpu_millicores: 1200,
            memory_bytes: 1200 * MIB,
        };
        let (a, _) = map_action(action_for(up, cur, &b, &m), cur, &b, &m);
        assert_eq!(a, up);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn mapped_actions_stay_in_bounds(raw in prop::array::uniform3(prop_oneof![any::<f32>(), -1.0f32..1.0]),
            r in 1u32..=20, c in 128u32..=2048, m in 256u64..=3072) {
            let b = Bounds::default();
            let cur = Allocation { replicas: r, cpu_millicores: c, memory_bytes: m * MIB };
            for mode in [ActionMode::Absolute, ActionMode::Delta] {
                let map = ActionMap { mode, ..ActionMap::default() };
                let (a, rep) = map_action(raw, cur, &b, &map);
                prop_assert_eq!(b.clamp(a).1, false);
                if raw.iter().any(|v| v.is_nan()) { prop_assert!(rep.nan); }
                if raw.iter().any(|v| v.is_infinite()) { prop_assert!(rep.out_of_range); }
                // one step never moves further than the map's per-step limits
                prop_assert!(a.replicas.abs_diff(cur.replicas) <= map.max_replica_delta);
                prop_assert!(f64::from(a.cpu_millicores.abs_diff(cur.cpu_millicores)) <= 0.25 * 1920.0 + 1.0);
                prop_assert!(a.memory_bytes.abs_diff(cur.memory_bytes) as f64 <= 0.25 * 2816.0 * MIB as f64 + MIB as f64);
            }
        }

        #[test]
        fn action_for_inverts_the_absolute_map(r0 in 1u32..=20, c0 in 128u32..=2048, m0 in 256u64..=3072,
            r1 in 1u32..=20, c1 in 128u32..=2048, m1 in 256u64..=3072) {
            let b = Bounds::default();
            let map = ActionMap::default();
            let mut cur = Allocation { replicas: r0, cpu_millicores: c0, memory_bytes: m0 * MIB };
            let want = Allocation { replicas: r1, cpu_millicores: c1, memory_bytes: m1 * MIB };
            let raw = action_for(want, cur, &b, &map);
            prop_assert!(raw.iter().all(|v| (-1.0..=1.0).contains(v)));
            // repeating the same action reaches the allocation within a few steps and stays
            for _ in 0..6 {
                cur = map_action(raw, cur, &b, &map).0;
            }
            prop_assert_eq!(cur.replicas, want.replicas);
            prop_assert!(cur.cpu_millicores.abs_diff(want.cpu_millicores) <= 1);
            prop_assert!(cur.memory_bytes.abs_diff(want.memory_bytes) <= MIB);
        }
    }
}
