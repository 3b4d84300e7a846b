//! Requests and limits as Kubernetes has them.
//!
//! The agent's vertical action sets **requests**: what the scheduler packs and the user pays for.
//! An [`Allocation`] is the requested allocation. The **limits** follow from it by a per-target
//! [`LimitsPolicy`], after the VPA's `controlledValues`:
//!
//! - [`ControlledValues::RequestsAndLimits`] (the default, as in the VPA): each limit keeps the
//!   workload's limit:request ratio, `limit = round(request × L / R)` with `L` and `R` the
//!   container's limit and request as the workload has them (a limit without a request counts as
//!   ratio 1: Kubernetes defaults a missing request to the limit). A resource without a limit
//!   stays without one.
//! - [`ControlledValues::RequestsOnly`]: the limits stay as the workload has them (or unset). A
//!   request above such a limit is capped at it: Kubernetes refuses a pod whose request exceeds
//!   its limit.
//!
//! The CPU limit has its own rule ([`CpuLimit`]): follow `controlled_values`, none for a
//! latency-sensitive target (the default), or none at all. A target is **latency-sensitive** when its SLO
//! has a latency objective (`slo.latency_p99_ms`): a CPU limit is enforced by the CFS quota per
//! 100 ms period, so a burst of requests that uses the period's quota early waits for the next
//! period even when the mean usage is far below the limit — the delay lands in the tail latency
//! the objective bounds. A throughput-only or best-effort target pays no such price and keeps the
//! isolation a limit gives its neighbours.
//!
//! [`LimitsPolicy::resolve`] is the one definition: the actuator's Kubernetes sink writes what it
//! returns, the simulator throttles and OOM-kills by it, and the requests it returns never exceed
//! its limits. Integers only: no value can be NaN.

use serde::{Deserialize, Deserializer, Serialize};

use crate::{Allocation, Slo};

/// Which of a container's values the agent controls (the VPA's `controlledValues`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum ControlledValues {
    /// Requests, and limits scaled with them at the workload's limit:request ratio.
    #[default]
    RequestsAndLimits,
    /// Requests only; limits stay as the workload has them (unset stays unset).
    RequestsOnly,
}

/// What happens to the CPU limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum CpuLimit {
    /// As `controlled_values` says for every resource.
    Controlled,
    /// No CPU limit for a latency-sensitive target (an SLO with a latency objective); otherwise
    /// as `Controlled`. The default.
    #[default]
    UnsetIfLatencySensitive,
    /// Never a CPU limit (an existing one is removed).
    Unset,
}

/// How a target's limits follow its requested allocation.
//
// On the bus (`target/1`'s `spec.limits`) it is read ignoring unknown keys, like every message
// field; files a user writes read it with [`LimitsPolicy::deserialize_strict`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default)]
pub struct LimitsPolicy {
    /// Requests and limits, or requests only.
    pub controlled_values: ControlledValues,
    /// The CPU limit's own rule.
    pub cpu_limit: CpuLimit,
}

/// [`LimitsPolicy`] read refusing unknown keys.
#[derive(Deserialize)]
#[serde(remote = "LimitsPolicy", deny_unknown_fields)]
struct StrictLimitsPolicy {
    #[serde(default)]
    controlled_values: ControlledValues,
    #[serde(default)]
    cpu_limit: CpuLimit,
}

/// A container's CPU and memory as the workload has them (its pod template, or a pod): requests
/// and limits, each of which may be unset. The limits and their ratio come from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContainerResources {
    pub cpu_request_millicores: Option<u32>,
    pub cpu_limit_millicores: Option<u32>,
    pub memory_request_bytes: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
}

impl ContainerResources {
    /// A container whose requests equal its limits (Kubernetes' Guaranteed class), at `a`'s CPU
    /// and memory.
    pub fn guaranteed(a: &Allocation) -> Self {
        ContainerResources {
            cpu_request_millicores: Some(a.cpu_millicores),
            cpu_limit_millicores: Some(a.cpu_millicores),
            memory_request_bytes: Some(a.memory_bytes),
            memory_limit_bytes: Some(a.memory_bytes),
        }
    }
}

/// Limits per replica; `None` = no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Limits {
    /// CPU limit, millicores.
    pub cpu_millicores: Option<u32>,
    /// Memory limit, bytes.
    pub memory_bytes: Option<u64>,
}

/// What to write for a requested allocation: the requests (the request capped at its limit
/// where one is kept and lower) and the limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The requested allocation, each request at most its limit.
    pub requests: Allocation,
    pub limits: Limits,
    /// The dimensions whose request was capped at its limit (`cpu`, `memory`).
    pub capped: Vec<&'static str>,
}

impl Slo {
    /// True when the SLO has a latency objective: such a target is latency-sensitive (see the
    /// module documentation).
    pub fn latency_sensitive(&self) -> bool {
        self.latency_p99_ms.is_some()
    }
}

impl LimitsPolicy {
    /// Deserializes a policy refusing unknown keys: `#[serde(deserialize_with =
    /// "LimitsPolicy::deserialize_strict")]` on a field of a user-written file.
    pub fn deserialize_strict<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        StrictLimitsPolicy::deserialize(d)
    }

    /// True when the target's CPU limit is removed (see [`CpuLimit`]).
    pub fn unsets_cpu_limit(&self, latency_sensitive: bool) -> bool {
        match self.cpu_limit {
            CpuLimit::Controlled => false,
            CpuLimit::UnsetIfLatencySensitive => latency_sensitive,
            CpuLimit::Unset => true,
        }
    }

    /// The requests and limits to write for `requested`, given the container as the workload has
    /// it (`current`: where limits and their ratio come from) and whether the target is
    /// latency-sensitive. See the module documentation.
    pub fn resolve(
        &self,
        requested: Allocation,
        current: &ContainerResources,
        latency_sensitive: bool,
    ) -> Resolved {
        let cpu_limit = if self.unsets_cpu_limit(latency_sensitive) {
            None
        } else {
            self.limit(
                u64::from(requested.cpu_millicores),
                current.cpu_request_millicores.map(u64::from),
                current.cpu_limit_millicores.map(u64::from),
            )
            .map(|l| u32::try_from(l).unwrap_or(u32::MAX))
        };
        let memory_limit = self.limit(
            requested.memory_bytes,
            current.memory_request_bytes,
            current.memory_limit_bytes,
        );
        let mut requests = requested;
        let mut capped = Vec::new();
        if let Some(l) = cpu_limit {
            if requests.cpu_millicores > l {
                requests.cpu_millicores = l;
                capped.push("cpu");
            }
        }
        if let Some(l) = memory_limit {
            if requests.memory_bytes > l {
                requests.memory_bytes = l;
                capped.push("memory");
            }
        }
        Resolved {
            requests,
            limits: Limits {
                cpu_millicores: cpu_limit,
                memory_bytes: memory_limit,
            },
            capped,
        }
    }

    /// One resource's new limit for a new request `q`, from the current request `r` and limit
    /// `l`.
    fn limit(&self, q: u64, r: Option<u64>, l: Option<u64>) -> Option<u64> {
        let l = l?;
        match self.controlled_values {
            ControlledValues::RequestsOnly => Some(l),
            ControlledValues::RequestsAndLimits => {
                // A missing request is the limit (Kubernetes' default): ratio 1.
                let r = r.unwrap_or(l);
                if r == 0 || l == 0 {
                    return Some(q);
                }
                let scaled = (u128::from(q) * u128::from(l) + u128::from(r) / 2) / u128::from(r);
                // Never below the request (a limit under its request is refused by Kubernetes).
                Some(u64::try_from(scaled).unwrap_or(u64::MAX).max(q))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MIB;
    use proptest::prelude::*;

    fn alloc(cpu: u32, mem_mib: u64) -> Allocation {
        Allocation {
            replicas: 3,
            cpu_millicores: cpu,
            memory_bytes: mem_mib * MIB,
        }
    }

    fn container(
        cpu_req: Option<u32>,
        cpu_lim: Option<u32>,
        mem_req: Option<u64>,
        mem_lim: Option<u64>,
    ) -> ContainerResources {
        ContainerResources {
            cpu_request_millicores: cpu_req,
            cpu_limit_millicores: cpu_lim,
            memory_request_bytes: mem_req.map(|m| m * MIB),
            memory_limit_bytes: mem_lim.map(|m| m * MIB),
        }
    }

    const RL: LimitsPolicy = LimitsPolicy {
        controlled_values: ControlledValues::RequestsAndLimits,
        cpu_limit: CpuLimit::Controlled,
    };
    const RO: LimitsPolicy = LimitsPolicy {
        controlled_values: ControlledValues::RequestsOnly,
        cpu_limit: CpuLimit::Controlled,
    };

    /// The default keeps a Guaranteed container's limits equal to its requests, except the CPU
    /// limit of a latency-sensitive target, which it removes.
    #[test]
    fn the_default_on_a_guaranteed_container_sets_limits_to_the_requests_but_frees_latency_cpu() {
        assert_eq!(
            LimitsPolicy::default(),
            LimitsPolicy {
                cpu_limit: CpuLimit::UnsetIfLatencySensitive,
                ..RL
            }
        );
        let now = ContainerResources::guaranteed(&alloc(1000, 1024));
        for latency in [false, true] {
            let r = LimitsPolicy::default().resolve(alloc(700, 300), &now, latency);
            assert_eq!(r.requests, alloc(700, 300));
            assert_eq!(
                r.limits,
                Limits {
                    cpu_millicores: (!latency).then_some(700),
                    memory_bytes: Some(300 * MIB)
                }
            );
            assert!(r.capped.is_empty());
        }
    }

    #[test]
    fn requests_and_limits_keeps_the_workloads_ratio() {
        // 250m:500m and 128Mi:256Mi (1:2); 400m:500m (4:5).
        let now = container(Some(250), Some(500), Some(128), Some(256));
        let r = RL.resolve(alloc(750, 384), &now, false);
        assert_eq!(r.requests, alloc(750, 384));
        assert_eq!(r.limits.cpu_millicores, Some(1500));
        assert_eq!(r.limits.memory_bytes, Some(768 * MIB));
        let r = RL.resolve(
            alloc(1000, 100),
            &container(Some(400), Some(500), None, None),
            false,
        );
        assert_eq!(r.limits.cpu_millicores, Some(1250));
        // no memory limit: none is added
        assert_eq!(r.limits.memory_bytes, None);
        // a limit without a request: ratio 1 (Kubernetes defaults the request to the limit)
        let r = RL.resolve(
            alloc(333, 100),
            &container(None, Some(500), None, Some(64)),
            false,
        );
        assert_eq!(r.limits.cpu_millicores, Some(333));
        assert_eq!(r.limits.memory_bytes, Some(100 * MIB));
        // rounded to the nearest millicore: 333 × 3/2 = 499.5 → 500
        let r = RL.resolve(
            alloc(333, 100),
            &container(Some(200), Some(300), None, None),
            false,
        );
        assert_eq!(r.limits.cpu_millicores, Some(500));
    }

    #[test]
    fn requests_only_keeps_the_limits_and_caps_a_request_above_one() {
        let now = container(Some(250), Some(500), Some(128), None);
        let r = RO.resolve(alloc(400, 2048), &now, false);
        assert_eq!(r.requests, alloc(400, 2048));
        assert_eq!(r.limits.cpu_millicores, Some(500));
        assert_eq!(r.limits.memory_bytes, None, "unset stays unset");
        assert!(r.capped.is_empty());
        let r = RO.resolve(alloc(800, 64), &now, false);
        assert_eq!(
            r.requests,
            alloc(500, 64),
            "request capped at the kept limit"
        );
        assert_eq!(r.capped, vec!["cpu"]);
        let both = container(Some(100), Some(200), Some(100), Some(200));
        let r = RO.resolve(alloc(300, 300), &both, false);
        assert_eq!(r.requests, alloc(200, 200));
        assert_eq!(r.capped, vec!["cpu", "memory"]);
    }

    #[test]
    fn the_cpu_limit_rule() {
        let now = container(Some(500), Some(500), Some(512), Some(512));
        let unset_if = LimitsPolicy {
            cpu_limit: CpuLimit::UnsetIfLatencySensitive,
            ..RL
        };
        let r = unset_if.resolve(alloc(800, 256), &now, true);
        assert_eq!(r.limits.cpu_millicores, None);
        assert_eq!(
            r.limits.memory_bytes,
            Some(256 * MIB),
            "memory keeps its limit"
        );
        let r = unset_if.resolve(alloc(800, 256), &now, false);
        assert_eq!(r.limits.cpu_millicores, Some(800));
        for controlled_values in [
            ControlledValues::RequestsAndLimits,
            ControlledValues::RequestsOnly,
        ] {
            let never = LimitsPolicy {
                controlled_values,
                cpu_limit: CpuLimit::Unset,
            };
            for latency in [false, true] {
                let r = never.resolve(alloc(4000, 256), &now, latency);
                assert_eq!(r.limits.cpu_millicores, None);
                // no CPU limit: nothing caps the CPU request
                assert_eq!(r.requests.cpu_millicores, 4000);
            }
        }
        assert!(Slo {
            latency_p99_ms: Some(200.0),
            throughput_rps: None,
            objective: None,
        }
        .latency_sensitive());
        assert!(!Slo {
            latency_p99_ms: None,
            throughput_rps: Some(10.0),
            objective: None,
        }
        .latency_sensitive());
        assert!(!Slo::default().latency_sensitive());
    }

    #[test]
    fn policies_read_leniently_on_the_bus_and_strictly_in_files() {
        let p: LimitsPolicy = serde_json::from_str(
            r#"{"controlled_values": "RequestsOnly", "cpu_limit": "Unset", "later": 1}"#,
        )
        .unwrap();
        assert_eq!(
            p,
            LimitsPolicy {
                controlled_values: ControlledValues::RequestsOnly,
                cpu_limit: CpuLimit::Unset
            }
        );
        let mut de = serde_json::Deserializer::from_str(r#"{"cpu_limits": "Unset"}"#);
        let e = LimitsPolicy::deserialize_strict(&mut de).unwrap_err();
        assert!(e.to_string().contains("cpu_limits"), "{e}");
        let mut de =
            serde_json::Deserializer::from_str(r#"{"cpu_limit": "UnsetIfLatencySensitive"}"#);
        assert_eq!(
            LimitsPolicy::deserialize_strict(&mut de).unwrap(),
            LimitsPolicy {
                cpu_limit: CpuLimit::UnsetIfLatencySensitive,
                ..LimitsPolicy::default()
            }
        );
        let mut de = serde_json::Deserializer::from_str(r#"{"controlled_values": "Requests"}"#);
        assert!(LimitsPolicy::deserialize_strict(&mut de).is_err());
    }

    fn opt<T: std::fmt::Debug + Clone>(
        s: impl Strategy<Value = T>,
    ) -> impl Strategy<Value = Option<T>> {
        prop::option::of(s)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the policy and the workload (any valid container: request ≤ limit), every
        /// request written is at most its limit, and a request is only lowered where a limit is
        /// kept (RequestsOnly).
        #[test]
        fn requests_never_exceed_limits(
            cpu in 1u32..=64_000, mem in 1u64..=(1 << 40),
            cpu_req in opt(1u32..=64_000), cpu_extra in opt(0u32..=64_000),
            mem_req in opt(1u64..=(1 << 40)), mem_extra in opt(0u64..=(1 << 40)),
            only in any::<bool>(), cpu_rule in 0u8..3, latency in any::<bool>(),
        ) {
            let current = ContainerResources {
                cpu_request_millicores: cpu_req,
                cpu_limit_millicores: cpu_extra.map(|e| cpu_req.unwrap_or(1).saturating_add(e)),
                memory_request_bytes: mem_req,
                memory_limit_bytes: mem_extra.map(|e| mem_req.unwrap_or(1).saturating_add(e)),
            };
            let policy = LimitsPolicy {
                controlled_values: if only { ControlledValues::RequestsOnly } else { ControlledValues::RequestsAndLimits },
                cpu_limit: [CpuLimit::Controlled, CpuLimit::UnsetIfLatencySensitive, CpuLimit::Unset][cpu_rule as usize],
            };
            let want = Allocation { replicas: 2, cpu_millicores: cpu, memory_bytes: mem };
            let r = policy.resolve(want, &current, latency);
            prop_assert_eq!(r.requests.replicas, 2);
            if let Some(l) = r.limits.cpu_millicores {
                prop_assert!(r.requests.cpu_millicores <= l);
            }
            if let Some(l) = r.limits.memory_bytes {
                prop_assert!(r.requests.memory_bytes <= l);
            }
            prop_assert!(r.requests.cpu_millicores <= cpu && r.requests.memory_bytes <= mem);
            if !only {
                prop_assert_eq!(r.requests, want, "RequestsAndLimits never lowers a request");
                prop_assert!(r.capped.is_empty());
            }
            prop_assert!(r.requests.cpu_millicores > 0 && r.requests.memory_bytes > 0);
        }
    }
}
