//! Allocations and their bounds.

use serde::{Deserialize, Deserializer, Serialize};

use crate::MdpError;

/// One MiB in bytes.
pub const MIB: u64 = 1024 * 1024;

/// A concrete allocation for a target: the requested resources (what the scheduler packs and
/// the user pays for). The limits follow from it by the target's
/// [`LimitsPolicy`](crate::LimitsPolicy).
//
// On the bus it is `Resources` (`action.current`, `applied.applied`, …): its JSON Schema keeps
// that name and its docs, and readers ignore unknown fields (no `deny_unknown_fields`; files a
// user writes read it with [`Allocation::deserialize_strict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(rename = "Resources")
)]
pub struct Allocation {
    // Number of replicas.
    pub replicas: u32,
    /// CPU request per replica, millicores.
    pub cpu_millicores: u32,
    /// Memory request per replica, bytes.
    pub memory_bytes: u64,
}

/// The bus's name for an [`Allocation`].
pub type Resources = Allocation;

/// [`Allocation`] read refusing unknown keys (a misspelt key in a file a user writes is an error,
/// not a silently ignored field).
#[derive(Deserialize)]
#[serde(remote = "Allocation", deny_unknown_fields)]
struct StrictAllocation {
    replicas: u32,
    cpu_millicores: u32,
    memory_bytes: u64,
}

impl Allocation {
    /// Deserializes an allocation refusing unknown keys: `#[serde(deserialize_with =
    /// "Allocation::deserialize_strict")]` on a field of a user-written file.
    pub fn deserialize_strict<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        StrictAllocation::deserialize(d)
    }
}

/// Allocation bounds of a target; defaults from the authors' artifact: 1–20 replicas,
/// 128–2048 millicores, 256–3072 MiB per replica. Keys left out take their default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Bounds {
    /// Minimum replicas.
    pub min_replicas: u32,
    /// Maximum replicas.
    pub max_replicas: u32,
    /// Minimum CPU request, millicores.
    pub min_cpu_millicores: u32,
    /// Maximum CPU request, millicores.
    pub max_cpu_millicores: u32,
    /// Minimum memory request, bytes.
    pub min_memory_bytes: u64,
    /// Maximum memory request, bytes.
    pub max_memory_bytes: u64,
}

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
    /// Problems with the bounds themselves (min above max, zero minimum), as (key, reason).
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

    /// Check min ≤ max and non-zero minimums.
    pub fn validate(&self) -> Result<(), MdpError> {
        if self.problems().is_empty() {
            Ok(())
        } else {
            Err(MdpError::InvalidBounds(*self))
        }
    }

    /// Clamp an allocation into the bounds; returns the clamped allocation and whether any
    /// field changed.
    pub fn clamp(&self, a: Allocation) -> (Allocation, bool) {
        let c = Allocation {
            replicas: a.replicas.clamp(self.min_replicas, self.max_replicas),
            cpu_millicores: a
                .cpu_millicores
                .clamp(self.min_cpu_millicores, self.max_cpu_millicores),
            memory_bytes: a
                .memory_bytes
                .clamp(self.min_memory_bytes, self.max_memory_bytes),
        };
        (c, c != a)
    }

    /// `a` clamped into the bounds, with the names of the clamped dimensions (`replicas`, `cpu`,
    /// `memory`, in that order).
    pub fn clamp_dimensions(&self, a: Allocation) -> (Allocation, Vec<&'static str>) {
        let (c, _) = self.clamp(a);
        let mut clamped = Vec::new();
        if c.replicas != a.replicas {
            clamped.push("replicas");
        }
        if c.cpu_millicores != a.cpu_millicores {
            clamped.push("cpu");
        }
        if c.memory_bytes != a.memory_bytes {
            clamped.push("memory");
        }
        (c, clamped)
    }

    /// The largest allocation.
    pub fn max_allocation(&self) -> Allocation {
        Allocation {
            replicas: self.max_replicas,
            cpu_millicores: self.max_cpu_millicores,
            memory_bytes: self.max_memory_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_clamp_reports() {
        let b = Bounds::default();
        let (c, clamped) = b.clamp(Allocation {
            replicas: 50,
            cpu_millicores: 10,
            memory_bytes: 512 * MIB,
        });
        assert!(clamped);
        assert_eq!(c.replicas, 20);
        assert_eq!(c.cpu_millicores, 128);
        let (_, clamped) = b.clamp(c);
        assert!(!clamped);
    }

    #[test]
    fn clamp_reports_dimensions() {
        let b = Bounds::default();
        let (r, c) = b.clamp_dimensions(Resources {
            replicas: 50,
            cpu_millicores: 64,
            memory_bytes: 512 * MIB,
        });
        assert_eq!(r.replicas, 20);
        assert_eq!(r.cpu_millicores, 128);
        assert_eq!(r.memory_bytes, 512 * MIB);
        assert_eq!(c, vec!["replicas", "cpu"]);
        let (_, c) = b.clamp_dimensions(Allocation {
            memory_bytes: 8192 * MIB,
            ..r
        });
        assert_eq!(c, vec!["memory"]);
        assert!(b.problems().is_empty());
        assert_eq!(b.validate(), Ok(()));
        let bad = Bounds {
            min_replicas: 5,
            max_replicas: 2,
            ..b
        };
        assert_eq!(bad.problems()[0].0, "min_replicas");
        assert_eq!(bad.validate(), Err(MdpError::InvalidBounds(bad)));
        for zero in [
            Bounds {
                min_replicas: 0,
                ..b
            },
            Bounds {
                min_cpu_millicores: 0,
                ..b
            },
            Bounds {
                min_memory_bytes: 0,
                ..b
            },
        ] {
            assert!(zero.validate().is_err(), "{zero:?}");
        }
    }

    #[test]
    fn bounds_keys_left_out_take_their_default_and_unknown_keys_are_refused() {
        let b: Bounds = serde_json::from_str(r#"{"max_replicas": 5}"#).unwrap();
        assert_eq!(
            b,
            Bounds {
                max_replicas: 5,
                ..Bounds::default()
            }
        );
        let e = serde_json::from_str::<Bounds>(r#"{"max_replica": 5}"#).unwrap_err();
        assert!(e.to_string().contains("max_replica"), "{e}");
    }

    /// The bus reads an allocation ignoring fields it does not know (a newer writer may add
    /// some); a user's file is read strictly.
    #[test]
    fn allocations_are_lenient_on_the_bus_and_strict_in_files() {
        let text = r#"{"replicas": 2, "cpu_millicores": 500, "memory_bytes": 1024, "gpu": 1}"#;
        let a: Allocation = serde_json::from_str(text).unwrap();
        assert_eq!(
            a,
            Allocation {
                replicas: 2,
                cpu_millicores: 500,
                memory_bytes: 1024
            }
        );
        let mut de = serde_json::Deserializer::from_str(text);
        let e = Allocation::deserialize_strict(&mut de).unwrap_err();
        assert!(e.to_string().contains("gpu"), "{e}");
        let mut de = serde_json::Deserializer::from_str(
            r#"{"replicas": 2, "cpu_millicores": 500, "memory_bytes": 1024}"#,
        );
        assert_eq!(Allocation::deserialize_strict(&mut de).unwrap(), a);
    }
}
