//! What AWARE needs to know about a managed target: allocation bounds, SLO, reward weight and
//! update mode (the CRD of the [kubernetes] issue carries the same fields).

use aware_bus_schemas::{Resources, Target};
use serde::{Deserialize, Serialize};

/// The allocation in force that an `obs` reports (limits rounded to millicores and bytes), or
/// `None` when its CPU or memory limit is not a positive finite number: a NaN or a missing limit
/// must never read as a zero allocation.
pub fn allocation_in_force(m: &aware_bus_schemas::RawMetrics) -> Option<Resources> {
    let known = |x: f64| x.is_finite() && x > 0.0;
    if !(known(m.cpu_limit_cores) && known(m.memory_limit_bytes)) {
        return None;
    }
    Some(Resources {
        replicas: m.replicas,
        // `as` saturates: an absurdly large limit stays absurdly large, never wraps to 0.
        cpu_millicores: ((m.cpu_limit_cores * 1000.0).round() as u32).max(1),
        memory_bytes: (m.memory_limit_bytes.round() as u64).max(1),
    })
}

/// Allocation bounds of a target. Defaults are those of the AWARE artifact: 1–20 replicas,
/// 128–2048 millicores, 256–3072 MiB per replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Bounds {
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub min_cpu_millicores: u32,
    pub max_cpu_millicores: u32,
    pub min_memory_bytes: u64,
    pub max_memory_bytes: u64,
}

const MIB: u64 = 1024 * 1024;

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            min_replicas: 1,
            max_replicas: 20,
            min_cpu_millicores: 128,
            max_cpu_millicores: 2048,
            min_memory_bytes: 256 * MIB,
            max_memory_bytes: 3072 * MIB,
        }
    }
}

impl Bounds {
    /// Problems with the bounds themselves (min above max, zero replicas), as (key, reason).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.min_replicas == 0 {
            out.push(("min_replicas", "must be at least 1".to_string()));
        }
        if self.min_replicas > self.max_replicas {
            out.push((
                "min_replicas",
                format!(
                    "{} above max_replicas {}",
                    self.min_replicas, self.max_replicas
                ),
            ));
        }
        if self.min_cpu_millicores == 0 || self.min_cpu_millicores > self.max_cpu_millicores {
            out.push((
                "min_cpu_millicores",
                format!(
                    "must be in 1..=max_cpu_millicores ({})",
                    self.max_cpu_millicores
                ),
            ));
        }
        if self.min_memory_bytes == 0 || self.min_memory_bytes > self.max_memory_bytes {
            out.push((
                "min_memory_bytes",
                format!(
                    "must be in 1..=max_memory_bytes ({})",
                    self.max_memory_bytes
                ),
            ));
        }
        out
    }

    /// `r` clamped into the bounds, with the names of the clamped dimensions.
    pub fn clamp(&self, r: Resources) -> (Resources, Vec<&'static str>) {
        let mut clamped = Vec::new();
        let replicas = r.replicas.clamp(self.min_replicas, self.max_replicas);
        if replicas != r.replicas {
            clamped.push("replicas");
        }
        let cpu = r
            .cpu_millicores
            .clamp(self.min_cpu_millicores, self.max_cpu_millicores);
        if cpu != r.cpu_millicores {
            clamped.push("cpu");
        }
        let mem = r
            .memory_bytes
            .clamp(self.min_memory_bytes, self.max_memory_bytes);
        if mem != r.memory_bytes {
            clamped.push("memory");
        }
        (
            Resources {
                replicas,
                cpu_millicores: cpu,
                memory_bytes: mem,
            },
            clamped,
        )
    }
}

/// The service-level objective used for SLO preservation and violations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Slo {
    pub latency_p99_ms: Option<f64>,
    pub throughput_rps: Option<f64>,
}

/// `Auto` applies actions; `Off` only records them (recommend-only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateMode {
    #[default]
    Auto,
    Off,
}

/// A managed target and its settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub bounds: Bounds,
    #[serde(default)]
    pub slo: Slo,
    /// Reward weight of SLO preservation against utilization, in [0, 1].
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    #[serde(default)]
    pub update_mode: UpdateMode,
}

fn default_alpha() -> f64 {
    0.5
}

impl TargetSpec {
    pub fn new(target: &Target) -> Self {
        TargetSpec {
            namespace: target.namespace.clone(),
            name: target.name.clone(),
            bounds: Bounds::default(),
            slo: Slo::default(),
            alpha: default_alpha(),
            update_mode: UpdateMode::Auto,
        }
    }

    pub fn target(&self) -> Target {
        Target::new(self.namespace.clone(), self.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamp_reports_dimensions() {
        let b = Bounds::default();
        let (r, c) = b.clamp(Resources {
            replicas: 50,
            cpu_millicores: 64,
            memory_bytes: 512 * MIB,
        });
        assert_eq!(r.replicas, 20);
        assert_eq!(r.cpu_millicores, 128);
        assert_eq!(r.memory_bytes, 512 * MIB);
        assert_eq!(c, vec!["replicas", "cpu"]);
        assert!(b.problems().is_empty());
        let bad = Bounds {
            min_replicas: 5,
            max_replicas: 2,
            ..b
        };
        assert_eq!(bad.problems()[0].0, "min_replicas");
    }
}
