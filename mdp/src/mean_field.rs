//! SIMPPO's virtual agent (docs/adr/0027-mean-field-state.md): what every other target on the
//! same cluster does, as a mean field appended to each target's state when
//! `learning.mean_field` is on. Count- and order-agnostic: every feature is a mean over the
//! others or a share of the cluster, so a policy reads the same width whether 2 or 2,000
//! targets share the cluster, and a target joining or leaving changes values, not the shape.
//!
//! | # | name | definition |
//! |---|---|---|
//! | 0 | `others_allocation_change` | mean over the others of their requested cores' relative change since the previous step, in [−1, 1] |
//! | 1 | `cluster_cpu_requested` | Σ CPU requests of placed replicas / allocatable CPU, in [0, 1] (0 without a shared cluster) |
//! | 2 | `cluster_memory_requested` | the same for memory |
//! | 3 | `cluster_pending` | Pending replicas / replicas wanted, cluster-wide, in [0, 1] |
//! | 4 | `others_slo_preservation` | mean SLO preservation of the others (1 with no other) |
//! | 5 | `others_cpu_util` | mean CPU utilization of the others (0 with no other) |

/// Number of mean-field features.
pub const MEAN_FIELD_DIM: usize = 6;

/// Names of the mean-field features, in vector order (after the [`crate::STATE_NAMES`]).
pub const MEAN_FIELD_NAMES: [&str; MEAN_FIELD_DIM] = [
    "others_allocation_change",
    "cluster_cpu_requested",
    "cluster_memory_requested",
    "cluster_pending",
    "others_slo_preservation",
    "others_cpu_util",
];

/// The width of the state vector: [`crate::STATE_DIM`] features, plus [`MEAN_FIELD_DIM`] with
/// the mean field on.
pub fn state_width(mean_field: bool) -> usize {
    crate::STATE_DIM + if mean_field { MEAN_FIELD_DIM } else { 0 }
}

/// One target's contribution to the mean field at a step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Member {
    /// Requested cores (CPU per replica × replicas in force) now.
    pub requested_cores: f64,
    /// Requested cores at the previous step (`None` on the first step: no change).
    pub previous_requested_cores: Option<f64>,
    /// Replicas the target wants (in force, placed or not).
    pub replicas: u32,
    /// SLO preservation, in [0, 1].
    pub slo_preservation: f64,
    /// CPU utilization, in [0, 1].
    pub cpu_util: f64,
}

/// The cluster-wide quantities of the step, from the cluster's own accounting.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClusterShare {
    /// Σ CPU requests of placed replicas / allocatable CPU.
    pub cpu_requested: f64,
    /// Σ memory requests of placed replicas / allocatable memory.
    pub memory_requested: f64,
    /// Replicas Pending.
    pub pending_replicas: u32,
}

/// A finite value clamped to `[lo, hi]`; `fallback` for NaN.
fn bounded(x: f64, lo: f64, hi: f64, fallback: f64) -> f32 {
    if x.is_nan() {
        fallback as f32
    } else {
        x.clamp(lo, hi) as f32
    }
}

fn relative_change(m: &Member) -> f64 {
    match m.previous_requested_cores {
        Some(p) => {
            let now = m.requested_cores;
            let d = (now - p) / now.abs().max(p.abs()).max(1e-3);
            if d.is_finite() {
                d.clamp(-1.0, 1.0)
            } else {
                0.0
            }
        }
        None => 0.0,
    }
}

/// Each member's mean field (in `members`' order), in O(n): the others' means are the sums less
/// the member's own share. `cluster` is `None` without a shared cluster (no capacity to share:
/// the cluster features are 0). Every feature is finite and bounded whatever the inputs.
pub fn mean_fields(
    members: &[Member],
    cluster: Option<&ClusterShare>,
) -> Vec<[f32; MEAN_FIELD_DIM]> {
    let finite01 = |x: f64| {
        if x.is_finite() {
            x.clamp(0.0, 1.0)
        } else {
            0.0
        }
    };
    let changes: Vec<f64> = members.iter().map(relative_change).collect();
    let sp: Vec<f64> = members
        .iter()
        .map(|m| finite01(m.slo_preservation))
        .collect();
    let util: Vec<f64> = members.iter().map(|m| finite01(m.cpu_util)).collect();
    let (sum_change, sum_sp, sum_util) = (
        changes.iter().sum::<f64>(),
        sp.iter().sum::<f64>(),
        util.iter().sum::<f64>(),
    );
    let wanted: u64 = members.iter().map(|m| u64::from(m.replicas)).sum();
    let (cpu, memory, pending) = match cluster {
        Some(c) => (
            bounded(c.cpu_requested, 0.0, 1.0, 0.0),
            bounded(c.memory_requested, 0.0, 1.0, 0.0),
            if wanted > 0 {
                bounded(f64::from(c.pending_replicas) / wanted as f64, 0.0, 1.0, 0.0)
            } else {
                0.0
            },
        ),
        None => (0.0, 0.0, 0.0),
    };
    let others = members.len().saturating_sub(1) as f64;
    (0..members.len())
        .map(|i| {
            let mean = |sum: f64, own: f64, none: f64| {
                if others > 0.0 {
                    (sum - own) / others
                } else {
                    none
                }
            };
            [
                bounded(mean(sum_change, changes[i], 0.0), -1.0, 1.0, 0.0),
                cpu,
                memory,
                pending,
                bounded(mean(sum_sp, sp[i], 1.0), 0.0, 1.0, 1.0),
                bounded(mean(sum_util, util[i], 0.0), 0.0, 1.0, 0.0),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(cores: f64, prev: Option<f64>, sp: f64, util: f64) -> Member {
        Member {
            requested_cores: cores,
            previous_requested_cores: prev,
            replicas: 2,
            slo_preservation: sp,
            cpu_util: util,
        }
    }

    #[test]
    fn each_target_sees_the_others_and_the_cluster() {
        let ms = [
            member(2.0, Some(1.0), 0.5, 0.9),
            member(1.0, Some(1.0), 1.0, 0.5),
            member(1.0, Some(2.0), 1.0, 0.1),
        ];
        let share = ClusterShare {
            cpu_requested: 0.8,
            memory_requested: 0.4,
            pending_replicas: 3,
        };
        let f = mean_fields(&ms, Some(&share));
        assert_eq!(f.len(), 3);
        // target 0: others changed 0 and −0.5; SP 1 and 1; util 0.5 and 0.1
        assert_eq!(f[0], [-0.25, 0.8, 0.4, 0.5, 1.0, 0.3]);
        // target 2: others changed +0.5 and 0
        assert_eq!(f[2][0], 0.25);
        assert_eq!(f[2][4], 0.75);
        // 3 Pending of 6 wanted, the same for everyone
        assert!(f.iter().all(|x| x[3] == 0.5 && x[1] == 0.8));
    }

    #[test]
    fn the_width_does_not_depend_on_how_many_share_or_their_order() {
        let a = member(1.0, Some(2.0), 0.7, 0.2);
        let b = member(3.0, Some(3.0), 0.9, 0.6);
        let c = member(1.0, None, 0.4, 0.4);
        let abc = mean_fields(&[a, b, c], None);
        let cba = mean_fields(&[c, b, a], None);
        assert_eq!(abc[0], cba[2]);
        assert_eq!(abc[1], cba[1]);
        let many: Vec<Member> = std::iter::repeat_n(b, 500).chain([a]).collect();
        let f = mean_fields(&many, None);
        assert_eq!(f.len(), 501);
        assert!(f.iter().all(|x| x.len() == MEAN_FIELD_DIM));
        assert_eq!(f[500][4], 0.9, "the last one sees 500 copies of b");
        assert_eq!(state_width(true), crate::STATE_DIM + MEAN_FIELD_DIM);
        assert_eq!(state_width(false), crate::STATE_DIM);
    }

    #[test]
    fn alone_or_without_a_cluster_the_field_is_neutral() {
        let f = mean_fields(&[member(1.0, Some(0.5), 0.2, 0.9)], None);
        assert_eq!(f, vec![[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]]);
        assert!(mean_fields(&[], None).is_empty());
    }

    #[test]
    fn nothing_unbounded_or_nan_gets_through() {
        let bad = [
            member(f64::NAN, Some(1.0), f64::NAN, f64::INFINITY),
            member(f64::INFINITY, Some(0.0), -3.0, 7.0),
            member(0.0, Some(0.0), 1.0, 0.5),
        ];
        let share = ClusterShare {
            cpu_requested: f64::NAN,
            memory_requested: 9.0,
            pending_replicas: 1_000,
        };
        for row in mean_fields(&bad, Some(&share)) {
            for (x, name) in row.iter().zip(MEAN_FIELD_NAMES) {
                assert!(x.is_finite(), "{name}");
                assert!((-1.0..=1.0).contains(x), "{name} = {x}");
            }
        }
    }
}
