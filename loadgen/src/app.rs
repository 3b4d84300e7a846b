//! Applications: chains of 1–3 segments, their SLO, objective weight, bounds and load; a
//! reproducible generator; YAML/JSON (de)serialization so anyone can define their own apps.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::load::{LoadPattern, LoadSpec};
use crate::segments::SegmentKind;

pub use aware_mdp::{Allocation, Bounds, Slo, MIB};

/// How a vertical (CPU/memory limit) change is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerticalMode {
    /// In-place resize (`pods/resize`): limits change immediately, no restart. Cutting memory
    /// below the working set OOM-kills.
    #[default]
    InPlace,
    /// Rolling restart (Deployment template patch, maxUnavailable 0): old pods keep serving with
    /// the old limits until the new pods are ready after their cold start.
    Restart,
}

/// One segment of an app with its payload parameter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentSpec {
    /// Which segment.
    pub kind: SegmentKind,
    /// Payload parameter (unit per [`crate::segments::PayloadFamily::unit`]).
    pub payload: f64,
}

/// An application (one Kubernetes Deployment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppSpec {
    /// Name (the Deployment name).
    pub name: String,
    /// Namespace.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Chain of 1–3 segments executed per request.
    pub segments: Vec<SegmentSpec>,
    /// SLO.
    #[serde(default)]
    pub slo: Slo,
    /// Reward weight α in [0, 1].
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Allocation bounds.
    #[serde(default)]
    pub bounds: Bounds,
    /// Allocation at reset.
    #[serde(deserialize_with = "Allocation::deserialize_strict")]
    pub initial: Allocation,
    /// How vertical changes apply.
    #[serde(default)]
    pub vertical: VerticalMode,
    /// Request timeout, seconds (requests waiting longer fail; p99 is capped here).
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Load.
    pub load: LoadSpec,
}

fn default_namespace() -> String {
    "sim".into()
}
fn default_alpha() -> f64 {
    0.5
}
fn default_timeout() -> f64 {
    30.0
}

impl AppSpec {
    /// Validate the spec.
    pub fn validate(&self) -> Result<(), SimError> {
        let err = |m: String| Err(SimError::Config(format!("app {}: {m}", self.name)));
        if self.name.is_empty() {
            return Err(SimError::Config("app with empty name".into()));
        }
        if self.segments.is_empty() || self.segments.len() > 3 {
            return err(format!("needs 1–3 segments, has {}", self.segments.len()));
        }
        if let Some(s) = self
            .segments
            .iter()
            .find(|s| !(s.payload.is_finite() && s.payload >= 0.0))
        {
            return err(format!(
                "segment {} has invalid payload {}",
                s.kind.name(),
                s.payload
            ));
        }
        if !(0.0..=1.0).contains(&self.alpha) {
            return err(format!("alpha must be in [0,1], got {}", self.alpha));
        }
        if let Some(l) = self.slo.latency_p99_ms {
            if !(l.is_finite() && l > 0.0) {
                return err(format!("latency SLO must be > 0, got {l}"));
            }
        }
        if let Some(t) = self.slo.throughput_rps {
            if !(t.is_finite() && t > 0.0) {
                return err(format!("throughput SLO must be > 0, got {t}"));
            }
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return err(format!("timeout_s must be > 0, got {}", self.timeout_s));
        }
        self.bounds
            .validate()
            .map_err(|e| SimError::Config(e.to_string()))
    }
}

/// A set of apps as stored in YAML/JSON files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppSet {
    /// The apps.
    pub apps: Vec<AppSpec>,
}

impl AppSet {
    /// Parse YAML.
    pub fn from_yaml(s: &str) -> Result<Self, SimError> {
        let set: AppSet = serde_norway::from_str(s).map_err(|source| SimError::Yaml {
            path: "<memory>".into(),
            source,
        })?;
        set.validate()?;
        Ok(set)
    }
    /// Parse JSON.
    pub fn from_json(s: &str) -> Result<Self, SimError> {
        let set: AppSet = serde_json::from_str(s).map_err(|source| SimError::Json {
            path: "<memory>".into(),
            source,
        })?;
        set.validate()?;
        Ok(set)
    }
    /// Serialize to YAML.
    pub fn to_yaml(&self) -> Result<String, SimError> {
        serde_norway::to_string(self).map_err(|source| SimError::Yaml {
            path: "<memory>".into(),
            source,
        })
    }
    /// Serialize to pretty JSON.
    pub fn to_json(&self) -> Result<String, SimError> {
        serde_json::to_string_pretty(self).map_err(|source| SimError::Json {
            path: "<memory>".into(),
            source,
        })
    }
    /// Read a file; `.json` is JSON, anything else YAML.
    pub fn read(path: &Path) -> Result<Self, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::io(path, e))?;
        let name = path.display().to_string();
        let set: AppSet = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|source| SimError::Json { path: name, source })?
        } else {
            serde_norway::from_str(&text).map_err(|source| SimError::Yaml { path: name, source })?
        };
        let mut set = set;
        // relative trace paths are relative to the app file
        if let Some(dir) = path.parent() {
            for app in &mut set.apps {
                if let LoadPattern::Trace { path: p, .. } = &mut app.load.pattern {
                    if p.is_relative() {
                        *p = dir.join(&*p);
                    }
                }
            }
        }
        set.validate()?;
        Ok(set)
    }
    /// Write a file; `.json` is JSON, anything else YAML.
    pub fn write(&self, path: &Path) -> Result<(), SimError> {
        let text = if path.extension().is_some_and(|e| e == "json") {
            self.to_json()?
        } else {
            self.to_yaml()?
        };
        std::fs::write(path, text).map_err(|e| SimError::io(path, e))
    }
    /// Validate every app and name uniqueness.
    pub fn validate(&self) -> Result<(), SimError> {
        let mut names = std::collections::HashSet::new();
        for a in &self.apps {
            a.validate()?;
            if !names.insert((a.namespace.as_str(), a.name.as_str())) {
                return Err(SimError::Config(format!(
                    "duplicate app {}/{}",
                    a.namespace, a.name
                )));
            }
        }
        Ok(())
    }
}

/// Options of the app generator.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratorOptions {
    /// Fraction of apps with a latency SLO (the rest get a throughput SLO or none).
    pub latency_slo_fraction: f64,
    /// Target utilization of the mean load at the app's mid-size allocation.
    pub load_fraction: f64,
}

impl Default for GeneratorOptions {
    fn default() -> Self {
        GeneratorOptions {
            latency_slo_fraction: 0.8,
            load_fraction: 0.5,
        }
    }
}

/// Generate `n` apps reproducibly from `seed`: chains of 1–3 segments sampled with replacement
/// from the 16-segment pool, payloads from the paper's "before" sets, a latency SLO at 5× the
/// no-contention p99, α ∈ [0.3, 0.7], a synthetic load (constant, diurnal, bursty or on/off)
/// sized to 25–60% of the capacity of 10 replicas × 1 core, and an initial allocation of 1-core,
/// 1 GiB replicas enough for the mean load at ~70% CPU.
pub fn generate_apps(n: usize, seed: u64, opts: &GeneratorOptions) -> Vec<AppSpec> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let len = rng.random_range(1..=3);
            let segments: Vec<SegmentSpec> = (0..len)
                .map(|_| {
                    let kind = SegmentKind::ALL[rng.random_range(0..SegmentKind::ALL.len())];
                    let before = kind.family().before();
                    let payload = before[rng.random_range(0..before.len())];
                    SegmentSpec { kind, payload }
                })
                .collect();
            let cpu: f64 = segments
                .iter()
                .map(|s| s.kind.cost(s.payload).cpu_seconds)
                .sum();
            let wait: f64 = segments
                .iter()
                .map(|s| s.kind.cost(s.payload).wait_seconds)
                .sum();
            let base_ms = (cpu + wait) * 1000.0;
            // capacity of 10 replicas × 1 core
            let cap = 10.0 / cpu;
            let mean = (cap * opts.load_fraction * rng.random_range(0.5..1.2)).max(1.0);
            let pattern = match rng.random_range(0..4) {
                0 => LoadPattern::Constant { rps: mean },
                1 => LoadPattern::Diurnal {
                    mean_rps: mean,
                    amplitude: rng.random_range(0.3..0.8),
                    period_s: 1500.0 * rng.random_range(1.0..4.0),
                    phase_s: rng.random_range(0.0..1000.0),
                },
                2 => LoadPattern::Bursty {
                    base_rps: mean * 0.7,
                    burst_rps: mean * rng.random_range(1.8..3.0),
                    burst_probability: rng.random_range(0.1..0.3),
                    window_s: 60.0 * rng.random_range(1.0..5.0),
                },
                _ => LoadPattern::OnOff {
                    on_rps: mean * 1.5,
                    off_rps: mean * 0.3,
                    on_s: 300.0 * rng.random_range(1.0..3.0),
                    off_s: 300.0 * rng.random_range(1.0..3.0),
                },
            };
            let pattern = round_pattern(pattern);
            let slo = if rng.random_bool(opts.latency_slo_fraction.clamp(0.0, 1.0)) {
                Slo {
                    latency_p99_ms: Some((base_ms * 5.0).max(20.0).round()),
                    throughput_rps: None,
                    objective: None,
                }
            } else if rng.random_bool(0.5) {
                Slo {
                    latency_p99_ms: None,
                    throughput_rps: Some((mean * 0.5).round().max(1.0)),
                    objective: None,
                }
            } else {
                Slo::default()
            };
            AppSpec {
                name: format!("app-{i:04}"),
                namespace: default_namespace(),
                segments,
                slo,
                alpha: (rng.random_range(0.3..0.7f64) * 100.0).round() / 100.0,
                bounds: Bounds::default(),
                // enough 1-core replicas for the mean load at ~70% CPU: peaks still overload
                initial: Allocation {
                    replicas: ((mean * cpu / 0.7).ceil() as u32).clamp(1, 20),
                    cpu_millicores: 1000,
                    memory_bytes: 1024 * MIB,
                },
                vertical: if rng.random_bool(0.5) {
                    VerticalMode::InPlace
                } else {
                    VerticalMode::Restart
                },
                timeout_s: default_timeout(),
                load: LoadSpec {
                    pattern,
                    poisson: true,
                },
            }
        })
        .collect()
}

/// Round generated numbers to 3 decimals so YAML/JSON round-trips are exact and readable.
fn round_pattern(p: LoadPattern) -> LoadPattern {
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    match p {
        LoadPattern::Constant { rps } => LoadPattern::Constant { rps: r(rps) },
        LoadPattern::Diurnal {
            mean_rps,
            amplitude,
            period_s,
            phase_s,
        } => LoadPattern::Diurnal {
            mean_rps: r(mean_rps),
            amplitude: r(amplitude),
            period_s: r(period_s),
            phase_s: r(phase_s),
        },
        LoadPattern::Bursty {
            base_rps,
            burst_rps,
            burst_probability,
            window_s,
        } => LoadPattern::Bursty {
            base_rps: r(base_rps),
            burst_rps: r(burst_rps),
            burst_probability: r(burst_probability),
            window_s: r(window_s),
        },
        LoadPattern::OnOff {
            on_rps,
            off_rps,
            on_s,
            off_s,
        } => LoadPattern::OnOff {
            on_rps: r(on_rps),
            off_rps: r(off_rps),
            on_s: r(on_s),
            off_s: r(off_s),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_is_reproducible_and_valid() {
        let a = generate_apps(50, 7, &GeneratorOptions::default());
        let b = generate_apps(50, 7, &GeneratorOptions::default());
        let c = generate_apps(50, 8, &GeneratorOptions::default());
        assert_eq!(a, b);
        assert_ne!(a, c);
        let set = AppSet { apps: a };
        set.validate().unwrap();
        assert!(set.apps.iter().all(|a| (1..=3).contains(&a.segments.len())));
        // all 16 segments show up over 50 apps × ~2 segments (sampled with replacement)
        let kinds: std::collections::HashSet<_> = set
            .apps
            .iter()
            .flat_map(|a| a.segments.iter().map(|s| s.kind))
            .collect();
        assert!(kinds.len() >= 12, "{}", kinds.len());
    }

    #[test]
    fn yaml_and_json_roundtrip() {
        let set = AppSet {
            apps: generate_apps(5, 1, &GeneratorOptions::default()),
        };
        let y = set.to_yaml().unwrap();
        assert_eq!(AppSet::from_yaml(&y).unwrap(), set);
        let j = set.to_json().unwrap();
        assert_eq!(AppSet::from_json(&j).unwrap(), set);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("apps.yaml");
        set.write(&p).unwrap();
        assert_eq!(AppSet::read(&p).unwrap(), set);
        let pj = dir.path().join("apps.json");
        set.write(&pj).unwrap();
        assert_eq!(AppSet::read(&pj).unwrap(), set);
    }

    #[test]
    fn handwritten_yaml_with_defaults() {
        let y = r#"
apps:
  - name: thumbnails
    segments:
      - { kind: image_resize, payload: 40 }
      - { kind: object_store_write, payload: 256 }
    slo: { latency_p99_ms: 200 }
    initial: { replicas: 2, cpu_millicores: 500, memory_bytes: 536870912 }
    load:
      pattern: { kind: diurnal, mean_rps: 50, amplitude: 0.5, period_s: 3600 }
"#;
        let set = AppSet::from_yaml(y).unwrap();
        let a = &set.apps[0];
        assert_eq!(a.alpha, 0.5);
        assert_eq!(a.bounds, Bounds::default());
        assert!(a.load.poisson);
        assert_eq!(a.namespace, "sim");
    }

    /// Every key of a hand-written app file is checked: a misspelt one (here `offest_s`, which
    /// left the trace at offset 0 silently) is refused naming it, at every level.
    #[test]
    fn unknown_keys_in_app_files_are_refused_naming_them() {
        let app = |extra: &str, load: &str| {
            format!(
                "apps:\n  - name: a\n    segments: [{{ kind: image_resize, payload: 40 }}]\n    \
                 initial: {{ replicas: 2, cpu_millicores: 500, memory_bytes: 536870912 }}\n    \
                 load: {load}\n{extra}"
            )
        };
        let constant = "{ pattern: { kind: constant, rps: 5 } }";
        let trace = |scaling: &str| {
            format!(
                "{{ pattern: {{ kind: trace, path: t.csv, format: rate_csv, scaling: {scaling} }} }}"
            )
        };
        assert!(AppSet::from_yaml(&app("", constant)).is_ok());
        for (text, named) in [
            (
                app(
                    "",
                    &trace("{ time_scale: 1, offest_s: 60, rate: { kind: factor, value: 1 } }"),
                ),
                "offest_s",
            ),
            (
                app(
                    "",
                    &trace("{ time_scale: 1, rate: { kind: factor, value: 1, unit: rps } }"),
                ),
                "unit",
            ),
            (app("    timeout: 5\n", constant), "timeout"),
            (
                app("    slo: { latency_p99: 100 }\n", constant),
                "latency_p99",
            ),
            (
                app("    bounds: { max_replica: 3 }\n", constant),
                "max_replica",
            ),
            (
                app("", "{ pattern: { kind: constant, rps: 5, burst: 2 } }"),
                "burst",
            ),
            (
                app("", "{ pattern: { kind: constant, rps: 5 }, noise: false }"),
                "noise",
            ),
            (format!("{}version: 2\n", app("", constant)), "version"),
            (
                app("", constant).replace("536870912 }", "536870912, gpus: 1 }"),
                "gpus",
            ),
        ] {
            let err = AppSet::from_yaml(&text).unwrap_err().to_string();
            assert!(err.contains(named), "{text}: `{err}` does not name {named}");
            let json: serde_json::Value = serde_norway::from_str(&text).unwrap();
            let err = AppSet::from_json(&json.to_string())
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{json}: `{err}` does not name {named}");
        }
    }

    #[test]
    fn example_app_file_with_trace_runs() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/apps.yaml");
        let set = AppSet::read(&p).unwrap();
        assert_eq!(set.apps.len(), 3);
        let mut env = crate::env::SimEnv::new(set.apps, crate::env::SimConfig::default()).unwrap();
        let mut offered = 0.0;
        for _ in 0..10 {
            for o in env
                .step(&vec![crate::env::TargetAction::Hold; env.len()])
                .unwrap()
            {
                assert!(o.reward.is_finite());
                offered += o.metrics.offered_rps;
            }
        }
        assert!(offered > 0.0);
    }

    /// The example apps (the demo's hand-written ones) are Deployments an autoscaler can run:
    /// under the HPA rule alone none is ever OOM-killed and each earns a reward that only
    /// serving its load gives. (The WorldCup app once started at a twelfth of what its trace
    /// needed: its overloaded pods were OOM-killed by their queues from the first step, reported
    /// no CPU use, and no autoscaler in the demo got it out of the crash loop: reward 0.03.)
    #[test]
    fn example_apps_are_servable_by_the_hpa_rule() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/apps.yaml");
        let opts = crate::run::RunSimOptions {
            apps: crate::run::AppSource::File { path },
            steps: 300,
            policy: crate::run::PolicySpec::Hpa {
                target_cpu_util: 0.7,
            },
            ..Default::default()
        };
        let report = crate::run::run_sim(&opts, &mut std::io::sink()).unwrap();
        assert_eq!(report.apps.len(), 3);
        for a in &report.apps {
            assert_eq!(a.oom_kills, 0, "{a:?}");
            assert!(a.mean_reward >= 1.0, "{a:?}");
        }
    }

    #[test]
    fn invalid_specs_are_rejected_with_reason() {
        let mut a = generate_apps(1, 1, &GeneratorOptions::default()).remove(0);
        a.alpha = 1.5;
        let e = a.validate().unwrap_err().to_string();
        assert!(e.contains("alpha"), "{e}");
        a.alpha = 0.5;
        a.segments.clear();
        assert!(a
            .validate()
            .unwrap_err()
            .to_string()
            .contains("1–3 segments"));
    }
}
