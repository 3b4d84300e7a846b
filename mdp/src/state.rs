//! The state (paper Table 1): nine named features, each O(1).
//!
//! | # | name | definition |
//! |---|---|---|
//! | 0 | `cpu_limit` | CPU limit per replica / max CPU bound |
//! | 1 | `memory_limit` | memory limit per replica / max memory bound |
//! | 2 | `cpu_util` | CPU usage / Σ CPU limits, in \[0, 1\] |
//! | 3 | `memory_util` | working set / Σ memory limits, in \[0, 1\] |
//! | 4 | `io_util` | disk bandwidth used / available, in \[0, 1\] |
//! | 5 | `network_util` | network bandwidth used / available, in \[0, 1\] |
//! | 6 | `slo_preservation` | SP = min(SLO/measured, 1); with no SLO, min(served/offered, 1) |
//! | 7 | `load_change` | (λ_t − λ_{t−1}) / max(λ_t, λ_{t−1}, 1), in [−1, 1] |
//! | 8 | `replicas` | replicas / max replicas |
//!
//! The networks read it as a fixed-order `f32` vector ([`State::to_array`], [`State::to_vec`],
//! [`State::from_slice`]); the code reads it by name.

use crate::{Allocation, Bounds, MdpError, RawMetrics};

/// Number of state features.
pub const STATE_DIM: usize = 9;

/// Names of the state features, in vector order.
pub const STATE_NAMES: [&str; STATE_DIM] = [
    "cpu_limit",
    "memory_limit",
    "cpu_util",
    "memory_util",
    "io_util",
    "network_util",
    "slo_preservation",
    "load_change",
    "replicas",
];

/// The state of one target at one step (see the module docs for each feature).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct State {
    /// CPU limit per replica / max CPU bound.
    pub cpu_limit: f32,
    /// Memory limit per replica / max memory bound.
    pub memory_limit: f32,
    /// CPU usage / Σ CPU limits.
    pub cpu_util: f32,
    /// Working set / Σ memory limits.
    pub memory_util: f32,
    /// Disk bandwidth used / available.
    pub io_util: f32,
    /// Network bandwidth used / available.
    pub network_util: f32,
    /// SLO preservation.
    pub slo_preservation: f32,
    /// Relative change of the offered load since the previous step, in [−1, 1].
    pub load_change: f32,
    /// Replicas / max replicas.
    pub replicas: f32,
}

impl State {
    /// The state of a step from its measurements, its SLO preservation, the previous step's
    /// offered load (`None` on the first step: no change) and the target's bounds.
    pub fn observe(
        m: &RawMetrics,
        slo_preservation: f64,
        prev_request_rate_rps: Option<f64>,
        bounds: &Bounds,
    ) -> State {
        let load_change = match prev_request_rate_rps {
            Some(p) => {
                let d = (m.request_rate_rps - p) / m.request_rate_rps.max(p).max(1.0);
                d.clamp(-1.0, 1.0)
            }
            None => 0.0,
        };
        State {
            cpu_limit: (m.cpu_limit_cores * 1000.0 / bounds.max_cpu_millicores as f64) as f32,
            memory_limit: (m.memory_limit_bytes / bounds.max_memory_bytes as f64) as f32,
            cpu_util: m.cpu_util as f32,
            memory_util: m.memory_util as f32,
            io_util: m.io_util as f32,
            network_util: m.network_util as f32,
            slo_preservation: slo_preservation as f32,
            load_change: load_change as f32,
            replicas: (m.replicas as f64 / bounds.max_replicas as f64) as f32,
        }
    }

    /// The network input, in [`STATE_NAMES`] order.
    pub fn to_array(&self) -> [f32; STATE_DIM] {
        [
            self.cpu_limit,
            self.memory_limit,
            self.cpu_util,
            self.memory_util,
            self.io_util,
            self.network_util,
            self.slo_preservation,
            self.load_change,
            self.replicas,
        ]
    }

    /// The network input as a vector (the `obs` message's `state`).
    pub fn to_vec(&self) -> Vec<f32> {
        self.to_array().to_vec()
    }

    /// The state a vector in [`STATE_NAMES`] order holds; exactly [`STATE_DIM`] values.
    pub fn from_slice(v: &[f32]) -> Result<State, MdpError> {
        match *v {
            [cpu_limit, memory_limit, cpu_util, memory_util, io_util, network_util, slo_preservation, load_change, replicas] => {
                Ok(State {
                    cpu_limit,
                    memory_limit,
                    cpu_util,
                    memory_util,
                    io_util,
                    network_util,
                    slo_preservation,
                    load_change,
                    replicas,
                })
            }
            _ => Err(MdpError::StateWidth {
                expected: STATE_DIM,
                got: v.len(),
            }),
        }
    }

    /// The allocation the state encodes (`cpu_limit`, `memory_limit` and `replicas` scaled back
    /// by the bounds, rounded to a millicore, a byte and a replica), or `None` when one of them
    /// is not finite.
    pub fn allocation(&self, bounds: &Bounds) -> Option<Allocation> {
        let cpu = f64::from(self.cpu_limit) * f64::from(bounds.max_cpu_millicores);
        let mem = f64::from(self.memory_limit) * bounds.max_memory_bytes as f64;
        let rep = f64::from(self.replicas) * f64::from(bounds.max_replicas);
        if ![cpu, mem, rep].iter().all(|x| x.is_finite()) {
            return None;
        }
        Some(Allocation {
            replicas: rep.round().max(0.0) as u32,
            cpu_millicores: cpu.round().max(0.0) as u32,
            memory_bytes: mem.round().max(0.0) as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MIB;

    fn metrics() -> RawMetrics {
        RawMetrics {
            replicas: 5,
            ready_replicas: 5,
            cpu_limit_cores: 1.024,
            memory_limit_bytes: (1536 * MIB) as f64,
            cpu_util: 0.5,
            memory_util: 0.25,
            io_util: 0.125,
            network_util: 0.0625,
            request_rate_rps: 100.0,
            ..RawMetrics::default()
        }
    }

    #[test]
    fn features_are_named_and_ordered_as_documented() {
        let b = Bounds::default();
        let s = State::observe(&metrics(), 0.75, Some(50.0), &b);
        assert_eq!(s.cpu_limit, 0.5);
        assert_eq!(s.memory_limit, 0.5);
        assert_eq!(s.cpu_util, 0.5);
        assert_eq!(s.memory_util, 0.25);
        assert_eq!(s.io_util, 0.125);
        assert_eq!(s.network_util, 0.0625);
        assert_eq!(s.slo_preservation, 0.75);
        assert_eq!(s.load_change, 0.5, "(100 - 50) / 100");
        assert_eq!(s.replicas, 0.25);
        assert_eq!(
            s.to_array(),
            [0.5, 0.5, 0.5, 0.25, 0.125, 0.0625, 0.75, 0.5, 0.25]
        );
        let i = |name| STATE_NAMES.iter().position(|n| *n == name).unwrap();
        assert_eq!(s.to_vec()[i("load_change")], s.load_change);
        assert_eq!(s.to_vec()[i("replicas")], s.replicas);
        assert_eq!(State::from_slice(&s.to_vec()), Ok(s));
        assert_eq!(
            State::from_slice(&[0.0; 10]),
            Err(MdpError::StateWidth {
                expected: STATE_DIM,
                got: 10
            })
        );
    }

    #[test]
    fn load_change_is_relative_and_bounded() {
        let b = Bounds::default();
        let m = metrics();
        assert_eq!(State::observe(&m, 1.0, None, &b).load_change, 0.0);
        assert_eq!(State::observe(&m, 1.0, Some(200.0), &b).load_change, -0.5);
        let idle = RawMetrics {
            request_rate_rps: 0.0,
            ..m.clone()
        };
        // below 1 rps the denominator is 1: noise on an idle target is not a full swing
        assert_eq!(State::observe(&idle, 1.0, Some(0.5), &b).load_change, -0.5);
        let burst = RawMetrics {
            request_rate_rps: 1e6,
            ..m.clone()
        };
        assert!(State::observe(&burst, 1.0, Some(0.0), &b).load_change <= 1.0);
    }

    #[test]
    fn the_encoded_allocation_is_read_back() {
        let b = Bounds::default();
        let s = State::observe(&metrics(), 1.0, None, &b);
        assert_eq!(
            s.allocation(&b),
            Some(Allocation {
                replicas: 5,
                cpu_millicores: 1024,
                memory_bytes: 1536 * MIB,
            })
        );
        let nan = State {
            replicas: f32::NAN,
            ..s
        };
        assert_eq!(nan.allocation(&b), None);
    }
}
