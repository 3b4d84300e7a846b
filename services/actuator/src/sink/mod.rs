//! Sinks: where the actuator applies allocations (a Kubernetes cluster or the simulator).
//!
//! A sink implements [`Sink`]. Its methods return boxed futures ([`BoxFuture`]) so the trait is
//! object safe: the service holds an `Arc<dyn Sink>` chosen from configuration, and a new sink is
//! one more `impl Sink` with no change anywhere else. To add one (e.g. the simulator sink):
//!
//! ```ignore
//! impl Sink for SimulatorSink {
//!     fn name(&self) -> &'static str { "simulator" }
//!     fn current_with<'a>(&'a self, target: &'a Target, container: Option<&'a str>)
//!         -> BoxFuture<'a, Result<Resources, SinkError>> {
//!         Box::pin(async move { /* read the allocation in force */ })
//!     }
//!     fn apply_limited<'a>(&'a self, target: &'a Target, desired: Resources,
//!         container: Option<&'a str>, rule: LimitsRule)
//!         -> BoxFuture<'a, Result<ApplyReport, SinkError>> {
//!         Box::pin(async move {
//!             validate_desired(target, &desired)?;
//!             /* apply */
//!             Ok(ApplyReport::new(in_force))
//!         })
//!     }
//! }
//! ```
//!
//! Sink-specific failures that fit no other variant of [`SinkError`] use [`SinkError::Backend`].

pub mod kubernetes;

use aware_bus_schemas::{Resources, Target};
use aware_mdp::{ContainerResources, LimitsPolicy, Resolved};
use aware_shared::spec::TargetSpec;
use futures::future::BoxFuture;
use thiserror::Error;

pub use kubernetes::{KubernetesSink, KubernetesSinkConfig, TargetSinkConfig, VerticalMode};

/// Where allocations are applied.
pub trait Sink: Send + Sync {
    /// `simulator` or `kubernetes`: the `sink` field of `applied`.
    fn name(&self) -> &'static str;

    /// The allocation in force for `target`. `container` is the container the target's
    /// registration names (`TargetSpec::container`, from the AwareAutoscaler's
    /// `resourcePolicy.containerPolicies`); `None` leaves the choice to the sink's
    /// configuration.
    fn current_with<'a>(
        &'a self,
        target: &'a Target,
        container: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Resources, SinkError>>;

    /// Applies `desired` (the requests, already within the target's bounds and guardrails) to
    /// `target` (its `container` as in [`Sink::current_with`]), with the limits `rule` derives
    /// from them; returns the allocation in force afterwards and notes on how it was applied.
    /// Idempotent: applying the allocation in force changes nothing.
    fn apply_limited<'a>(
        &'a self,
        target: &'a Target,
        desired: Resources,
        container: Option<&'a str>,
        rule: LimitsRule,
    ) -> BoxFuture<'a, Result<ApplyReport, SinkError>>;

    /// [`Sink::apply_limited`] with the default limits policy (limits keep the container's
    /// limit:request ratio).
    fn apply_with<'a>(
        &'a self,
        target: &'a Target,
        desired: Resources,
        container: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ApplyReport, SinkError>> {
        self.apply_limited(target, desired, container, LimitsRule::default())
    }

    /// [`Sink::current_with`] with no registered container (the sink's configured choice).
    fn current<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, Result<Resources, SinkError>> {
        self.current_with(target, None)
    }

    /// [`Sink::apply_with`] with no registered container (the sink's configured choice).
    fn apply<'a>(
        &'a self,
        target: &'a Target,
        desired: Resources,
    ) -> BoxFuture<'a, Result<ApplyReport, SinkError>> {
        self.apply_with(target, desired, None)
    }
}

/// How a sink derives a target's limits from the requests it applies: the target's
/// [`LimitsPolicy`] and whether the target is latency-sensitive (its SLO has a latency
/// objective).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitsRule {
    pub policy: LimitsPolicy,
    pub latency_sensitive: bool,
}

impl LimitsRule {
    /// The rule of a target's spec.
    pub fn of(spec: &TargetSpec) -> Self {
        LimitsRule {
            policy: spec.limits,
            latency_sensitive: spec.slo.latency_sensitive(),
        }
    }

    /// The requests and limits to write for `desired`, given the container as read
    /// ([`LimitsPolicy::resolve`]).
    pub fn resolve(&self, desired: Resources, now: &ContainerResources) -> Resolved {
        self.policy.resolve(desired, now, self.latency_sensitive)
    }
}

/// The result of [`Sink::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    /// The allocation in force after the call.
    pub in_force: Resources,
    /// How it was applied when that is worth reporting (e.g. a fallback from in-place resize to a
    /// template patch); meant for `applied.reason`.
    pub notes: Vec<String>,
}

impl ApplyReport {
    pub fn new(in_force: Resources) -> Self {
        ApplyReport {
            in_force,
            notes: Vec::new(),
        }
    }
}

/// Why a sink could not read or apply an allocation.
#[derive(Debug, Error)]
pub enum SinkError {
    /// The desired allocation holds a value no sink may apply (zero replicas, CPU or memory).
    #[error("refusing to apply {dimension} = {value} to {target}: {why}")]
    InvalidValue {
        target: String,
        dimension: &'static str,
        value: u64,
        why: &'static str,
    },
    /// The target (or an object it needs) does not exist.
    #[error("{target}: {what} not found")]
    NotFound { target: String, what: String },
    /// The target exists but cannot be managed as configured (no container, no selector, …).
    #[error("{target} cannot be managed: {why}")]
    Unmanageable { target: String, why: String },
    /// The API refused a request (not retried, or not retryable).
    #[error("{operation} for {target} failed: HTTP {code} {reason}: {message}")]
    Api {
        target: String,
        operation: String,
        code: u16,
        reason: String,
        message: String,
    },
    /// A retryable failure persisted through every attempt.
    #[error("{operation} for {target} gave up after {attempts} attempts; last error: {last}")]
    RetriesExhausted {
        target: String,
        operation: String,
        attempts: u32,
        #[source]
        last: Box<SinkError>,
    },
    /// The API could not be reached or answered something unreadable.
    #[error("{operation} for {target}: {message}")]
    Transport {
        target: String,
        operation: String,
        message: String,
    },
    /// Any other failure of a sink.
    #[error("{sink} sink: {message}")]
    Backend { sink: &'static str, message: String },
}

impl SinkError {
    /// HTTP status of an API error (also through `RetriesExhausted`).
    pub fn status_code(&self) -> Option<u16> {
        match self {
            SinkError::Api { code, .. } => Some(*code),
            SinkError::RetriesExhausted { last, .. } => last.status_code(),
            _ => None,
        }
    }
}

/// Refuses a desired allocation with a zero dimension (every sink calls this first). Values are
/// integers, so they are always finite; zero replicas is refused too because AWARE never scales a
/// target to zero (`Bounds::problems` requires `min_replicas ≥ 1`).
pub fn validate_desired(target: &Target, desired: &Resources) -> Result<(), SinkError> {
    for (dimension, value) in [
        ("replicas", u64::from(desired.replicas)),
        ("cpu", u64::from(desired.cpu_millicores)),
        ("memory", desired.memory_bytes),
    ] {
        if value == 0 {
            return Err(SinkError::InvalidValue {
                target: target.key(),
                dimension,
                value,
                why: "must be positive",
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_dimensions_are_refused_with_a_typed_error() {
        let t = Target::new("ns", "web");
        let ok = Resources {
            replicas: 1,
            cpu_millicores: 1,
            memory_bytes: 1,
        };
        assert!(validate_desired(&t, &ok).is_ok());
        for (zeroed, name) in [
            (Resources { replicas: 0, ..ok }, "replicas"),
            (
                Resources {
                    cpu_millicores: 0,
                    ..ok
                },
                "cpu",
            ),
            (
                Resources {
                    memory_bytes: 0,
                    ..ok
                },
                "memory",
            ),
        ] {
            let err = validate_desired(&t, &zeroed).unwrap_err();
            assert!(
                matches!(err, SinkError::InvalidValue { dimension, value: 0, .. } if dimension == name)
            );
            assert_eq!(
                err.to_string(),
                format!("refusing to apply {name} = 0 to ns/web: must be positive")
            );
        }
    }

    #[test]
    fn status_code_looks_through_retries() {
        let api = SinkError::Api {
            target: "ns/web".into(),
            operation: "scale".into(),
            code: 503,
            reason: "ServiceUnavailable".into(),
            message: "etcd".into(),
        };
        assert_eq!(api.status_code(), Some(503));
        let exhausted = SinkError::RetriesExhausted {
            target: "ns/web".into(),
            operation: "scale".into(),
            attempts: 3,
            last: Box::new(api),
        };
        assert_eq!(exhausted.status_code(), Some(503));
        assert_eq!(
            exhausted.to_string(),
            "scale for ns/web gave up after 3 attempts; last error: scale for ns/web failed: HTTP 503 ServiceUnavailable: etcd"
        );
    }
}
