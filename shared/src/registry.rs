//! Targets registered over the bus (`target/1`, published by the controller for every
//! `AwareAutoscaler`) and their conversion to and from the services' [`TargetSpec`].
//!
//! A registration carries the spec; a deregistration carries none. Services apply them in
//! arrival order (one controller publishes them, in order, on one connection); a registration
//! repeated by the controller's periodic resync is a no-op. A deregistered target is left alone:
//! the recommender stops deciding for it, the actuator stops applying to it and the collector
//! stops observing it, so the workload keeps its last applied resources.

use std::collections::HashMap;

use aware_bus_schemas::{RegisteredLifecycle, RegisteredSpec, Registration, Target};

use crate::config::LifecycleProfile;
use crate::spec::{Bounds, FallbackOverride, Slo, TargetSpec, UpdateMode};

/// The wire form of a spec (and optional lifecycle profile).
pub fn to_registered(spec: &TargetSpec, lifecycle: Option<&LifecycleProfile>) -> RegisteredSpec {
    let b = &spec.bounds;
    RegisteredSpec {
        min_replicas: b.min_replicas,
        max_replicas: b.max_replicas,
        min_cpu_millicores: b.min_cpu_millicores,
        max_cpu_millicores: b.max_cpu_millicores,
        min_memory_bytes: b.min_memory_bytes,
        max_memory_bytes: b.max_memory_bytes,
        slo_latency_p99_ms: spec.slo.latency_p99_ms,
        slo_throughput_rps: spec.slo.throughput_rps,
        slo_objective: spec.slo.objective,
        alpha: spec.alpha,
        recommend_only: spec.update_mode == UpdateMode::Off,
        lifecycle: lifecycle.map(|l| RegisteredLifecycle {
            bootstrap: l.bootstrap,
            t_online: l.t_online,
            t_serving: l.t_serving,
            t_var: l.t_var,
            window: u32::try_from(l.window).unwrap_or(u32::MAX),
        }),
        container: spec.container.clone(),
        limits: Some(spec.limits),
        fallback_hpa_target_cpu_utilization: spec.fallback.hpa_target_cpu_utilization,
    }
}

/// Why a registration cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("registration of {target} rejected: {reason}")]
pub struct RegistrationError {
    pub target: Target,
    pub reason: String,
}

/// The spec of a registration, checked as the services' own configuration is (a registration is
/// input from the bus: a bad one is refused, never half-applied).
pub fn from_registered(
    target: &Target,
    r: &RegisteredSpec,
) -> Result<(TargetSpec, Option<LifecycleProfile>), RegistrationError> {
    let refuse = |reason: String| RegistrationError {
        target: target.clone(),
        reason,
    };
    let bounds = Bounds {
        min_replicas: r.min_replicas,
        max_replicas: r.max_replicas,
        min_cpu_millicores: r.min_cpu_millicores,
        max_cpu_millicores: r.max_cpu_millicores,
        min_memory_bytes: r.min_memory_bytes,
        max_memory_bytes: r.max_memory_bytes,
    };
    let problems = bounds.problems();
    if !problems.is_empty() {
        return Err(refuse(
            problems
                .iter()
                .map(|(k, why)| format!("{k} {why}"))
                .collect::<Vec<_>>()
                .join("; "),
        ));
    }
    if !(0.0..=1.0).contains(&r.alpha) {
        return Err(refuse(format!("alpha {} outside [0, 1]", r.alpha)));
    }
    for (name, v) in [
        ("slo_latency_p99_ms", r.slo_latency_p99_ms),
        ("slo_throughput_rps", r.slo_throughput_rps),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v > 0.0) {
                return Err(refuse(format!("{name} {v} is not a positive number")));
            }
        }
    }
    if let Some(o) = r.slo_objective.filter(|o| !Slo::valid_objective(*o)) {
        return Err(refuse(format!("slo_objective {o} is not in (0, 1)")));
    }
    if let Some(u) = r
        .fallback_hpa_target_cpu_utilization
        .filter(|u| !FallbackOverride::valid_hpa_target(*u))
    {
        return Err(refuse(format!(
            "fallback_hpa_target_cpu_utilization {u} is not from 0.01 (1 %) to 1 (100 %)"
        )));
    }
    if let Some(c) = &r.container {
        // The controller sends no name for "every container" (`*`), so a `*` here is not ours.
        if c.is_empty() || c == "*" {
            return Err(refuse(format!(
                "container `{c}` is not a container name (absent = the actuator's own choice)"
            )));
        }
    }
    let lifecycle = match &r.lifecycle {
        None => None,
        Some(l) => {
            if !(l.t_online.is_finite() && l.t_serving.is_finite() && l.t_var.is_finite()) {
                return Err(refuse("lifecycle thresholds must be finite".into()));
            }
            if l.t_var < 0.0 || l.window == 0 {
                return Err(refuse(
                    "lifecycle t_var must be ≥ 0 and window ≥ 1".to_string(),
                ));
            }
            Some(LifecycleProfile {
                bootstrap: l.bootstrap,
                t_online: l.t_online,
                t_serving: l.t_serving,
                t_var: l.t_var,
                window: usize::try_from(l.window).unwrap_or(usize::MAX),
            })
        }
    };
    Ok((
        TargetSpec {
            namespace: target.namespace.clone(),
            name: target.name.clone(),
            bounds,
            slo: Slo {
                latency_p99_ms: r.slo_latency_p99_ms,
                throughput_rps: r.slo_throughput_rps,
                // Absent (unset, or a controller from before the field): the default objective.
                objective: r.slo_objective,
            },
            alpha: r.alpha,
            update_mode: if r.recommend_only {
                UpdateMode::Off
            } else {
                UpdateMode::Auto
            },
            container: r.container.clone(),
            // Absent (a controller from before the field): the default policy.
            limits: r.limits.unwrap_or_default(),
            // Absent (unset, or a controller from before the field): the recommender's setting.
            fallback: FallbackOverride {
                hpa_target_cpu_utilization: r.fallback_hpa_target_cpu_utilization,
            },
        },
        lifecycle,
    ))
}

/// What a registration changes for a target.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Managed with this spec (new, changed, or a repeat of the current one).
    Registered {
        spec: TargetSpec,
        lifecycle: Option<LifecycleProfile>,
        /// False when it repeats the registration in force (a resync).
        changed: bool,
    },
    /// No longer managed.
    Deregistered,
    /// Refused (invalid spec); what was in force stays.
    Refused(RegistrationError),
}

/// The registration state of one target, as a service's actor keeps it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Registered {
    /// `Some(true)`: registered; `Some(false)`: deregistered; `None`: never heard of (the
    /// target is managed with the configured spec, as without a controller).
    pub managed: Option<bool>,
    pub generation: Option<u64>,
    /// The registered spec and profile in force (while registered).
    current: Option<(TargetSpec, Option<LifecycleProfile>)>,
}

impl Registered {
    /// Folds one registration in.
    pub fn apply(&mut self, r: &Registration) -> Change {
        match &r.spec {
            None => {
                self.managed = Some(false);
                self.generation = Some(r.generation);
                self.current = None;
                Change::Deregistered
            }
            Some(s) => match from_registered(&r.target, s) {
                Err(e) => Change::Refused(e),
                Ok(now) => {
                    let changed = self.current.as_ref() != Some(&now);
                    self.managed = Some(true);
                    self.generation = Some(r.generation);
                    self.current = Some(now.clone());
                    Change::Registered {
                        spec: now.0,
                        lifecycle: now.1,
                        changed,
                    }
                }
            },
        }
    }

    /// True when the controller deregistered the target (and has not registered it again).
    pub fn is_deregistered(&self) -> bool {
        self.managed == Some(false)
    }

    /// The registered spec in force, if registered.
    pub fn spec(&self) -> Option<&TargetSpec> {
        self.current.as_ref().map(|(spec, _)| spec)
    }
}

/// Registrations of every target, for services without per-target actors (the collector).
#[derive(Debug, Default)]
pub struct Registry {
    targets: HashMap<Target, Registered>,
}

impl Registry {
    /// Folds one registration in and returns what changed.
    pub fn apply(&mut self, r: &Registration) -> Change {
        self.targets.entry(r.target.clone()).or_default().apply(r)
    }

    /// Targets registered now, with their specs (sorted by target).
    pub fn registered(&self) -> Vec<TargetSpec> {
        let mut out: Vec<TargetSpec> = self
            .targets
            .values()
            .filter_map(|r| r.spec().cloned())
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out
    }

    /// True when the target was deregistered.
    pub fn is_deregistered(&self, target: &Target) -> bool {
        self.targets
            .get(target)
            .is_some_and(Registered::is_deregistered)
    }
}

/// Logs a registration change with structured fields (one wording for every service) and counts
/// it in the service's `registrations_total` (`counter`; repeats are not counted).
pub fn log_change(
    service: &str,
    counter: &prometheus::IntCounterVec,
    target: &Target,
    generation: u64,
    change: &Change,
) {
    let label = match change {
        Change::Registered { changed: false, .. } => None,
        Change::Registered { .. } => Some("registered"),
        Change::Deregistered => Some("deregistered"),
        Change::Refused(_) => Some("refused"),
    };
    if let Some(l) = label {
        counter.with_label_values(&[l]).inc();
    }
    match change {
        Change::Registered { changed: false, .. } => {
            tracing::trace!(service, %target, generation, "registration repeated")
        }
        Change::Registered { spec, .. } => {
            tracing::info!(service, %target, generation, bounds = ?spec.bounds, alpha = spec.alpha, update_mode = ?spec.update_mode, limits = ?spec.limits, "target registered")
        }
        Change::Deregistered => {
            tracing::info!(service, %target, generation, "target deregistered: left at its last applied resources")
        }
        Change::Refused(e) => {
            tracing::warn!(service, %target, generation, error = %e, "registration refused")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_bus_schemas::Schema;

    fn registration(spec: Option<RegisteredSpec>, generation: u64) -> Registration {
        Registration {
            schema: Schema::new(),
            target: Target::new("shop", "web"),
            episode: 0,
            step: 0,
            ts_ms: 1,
            generation,
            source: "shop/web-aware".into(),
            spec,
        }
    }

    fn spec() -> TargetSpec {
        let mut s = TargetSpec::new(&Target::new("shop", "web"));
        s.bounds.max_replicas = 7;
        s.slo.latency_p99_ms = Some(150.0);
        s.slo.objective = Some(0.995);
        s.alpha = 0.75;
        s.update_mode = UpdateMode::Off;
        s.container = Some("sidecar".into());
        s.limits = crate::spec::LimitsPolicy {
            controlled_values: crate::spec::ControlledValues::RequestsOnly,
            cpu_limit: crate::spec::CpuLimit::UnsetIfLatencySensitive,
        };
        s.fallback.hpa_target_cpu_utilization = Some(0.35);
        s
    }

    #[test]
    fn specs_round_trip_through_the_wire_form() {
        let profile = LifecycleProfile {
            window: 4,
            ..LifecycleProfile::default()
        };
        let wire = to_registered(&spec(), Some(&profile));
        assert!(wire.recommend_only);
        let (back, lifecycle) = from_registered(&Target::new("shop", "web"), &wire).unwrap();
        assert_eq!(back, spec());
        assert_eq!(lifecycle, Some(profile));
        // A registration without a policy (from a controller before the field): the default.
        let old = RegisteredSpec {
            limits: None,
            ..wire.clone()
        };
        let (back, _) = from_registered(&Target::new("shop", "web"), &old).unwrap();
        assert_eq!(back.limits, crate::spec::LimitsPolicy::default());
        // Nor an objective: the default one.
        assert_eq!(wire.slo_objective, Some(0.995));
        let old = RegisteredSpec {
            slo_objective: None,
            ..wire.clone()
        };
        let (back, _) = from_registered(&Target::new("shop", "web"), &old).unwrap();
        assert_eq!((back.slo.objective, back.slo.objective()), (None, 0.99));
        // Nor a fallback override: none (the recommender's own HPA target).
        assert_eq!(wire.fallback_hpa_target_cpu_utilization, Some(0.35));
        let old = RegisteredSpec {
            fallback_hpa_target_cpu_utilization: None,
            ..wire
        };
        let (back, _) = from_registered(&Target::new("shop", "web"), &old).unwrap();
        assert_eq!(back.fallback, crate::spec::FallbackOverride::default());
    }

    #[test]
    fn bad_registrations_are_refused_and_keep_what_was_in_force() {
        let mut r = Registered::default();
        assert!(matches!(
            r.apply(&registration(Some(to_registered(&spec(), None)), 1)),
            Change::Registered { changed: true, .. }
        ));
        for bad in [
            RegisteredSpec {
                min_replicas: 9,
                ..to_registered(&spec(), None)
            },
            RegisteredSpec {
                alpha: f64::NAN,
                ..to_registered(&spec(), None)
            },
            RegisteredSpec {
                slo_latency_p99_ms: Some(-1.0),
                ..to_registered(&spec(), None)
            },
            RegisteredSpec {
                container: Some(String::new()),
                ..to_registered(&spec(), None)
            },
            RegisteredSpec {
                slo_objective: Some(1.0),
                ..to_registered(&spec(), None)
            },
            RegisteredSpec {
                slo_objective: Some(f64::NAN),
                ..to_registered(&spec(), None)
            },
            RegisteredSpec {
                container: Some("*".into()),
                ..to_registered(&spec(), None)
            },
            RegisteredSpec {
                fallback_hpa_target_cpu_utilization: Some(0.0),
                ..to_registered(&spec(), None)
            },
            RegisteredSpec {
                fallback_hpa_target_cpu_utilization: Some(1.5),
                ..to_registered(&spec(), None)
            },
            RegisteredSpec {
                fallback_hpa_target_cpu_utilization: Some(f64::NAN),
                ..to_registered(&spec(), None)
            },
            RegisteredSpec {
                lifecycle: Some(RegisteredLifecycle {
                    bootstrap: true,
                    t_online: 1.0,
                    t_serving: f64::INFINITY,
                    t_var: 0.1,
                    window: 3,
                }),
                ..to_registered(&spec(), None)
            },
        ] {
            match r.apply(&registration(Some(bad), 2)) {
                Change::Refused(e) => assert!(e.to_string().contains("shop/web"), "{e}"),
                other => panic!("accepted: {other:?}"),
            }
            assert_eq!(
                r.generation,
                Some(1),
                "a refused registration changes nothing"
            );
            assert_eq!(r.managed, Some(true));
        }
    }

    #[test]
    fn resyncs_are_no_ops_and_deregistration_is_remembered() {
        let mut reg = Registry::default();
        let t = Target::new("shop", "web");
        assert!(!reg.is_deregistered(&t));
        let wire = to_registered(&spec(), None);
        assert!(matches!(
            reg.apply(&registration(Some(wire.clone()), 1)),
            Change::Registered { changed: true, .. }
        ));
        assert!(matches!(
            reg.apply(&registration(Some(wire.clone()), 1)),
            Change::Registered { changed: false, .. }
        ));
        assert_eq!(reg.registered(), vec![spec()]);
        assert_eq!(
            reg.apply(&registration(None, 1)),
            Change::Deregistered,
            "deregistered"
        );
        assert!(reg.is_deregistered(&t));
        assert!(reg.registered().is_empty());
        // Created again: managed again.
        assert!(matches!(
            reg.apply(&registration(Some(wire), 1)),
            Change::Registered { changed: true, .. }
        ));
        assert!(!reg.is_deregistered(&t));
    }
}
