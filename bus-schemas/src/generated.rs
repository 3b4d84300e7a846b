//! Generated artefacts: JSON Schemas of every message and golden MessagePack fixtures.
//!
//! Both are committed under `bus-schemas/schemas/` and `bus-schemas/fixtures/` and regenerated with
//! `aware schemas --write bus-schemas`; tests fail when the committed files are stale.

use std::path::Path;

use crate::{
    codec, Action, Applied, ControlledValues, CpuLimit, DecisionSource, Embedding, Episode, Event,
    EventKind, Lifecycle, LimitsPolicy, Model, ModelKind, Obs, Outcome, RawMetrics,
    RegisteredLifecycle, RegisteredSpec, Registration, Resources, Schema, Stage, Target,
};

/// The JSON Schema (draft-07, pretty-printed, trailing newline) of a message kind.
pub fn json_schema(kind: EventKind) -> String {
    let schema = match kind {
        EventKind::Obs => schemars::schema_for!(Obs),
        EventKind::Action => schemars::schema_for!(Action),
        EventKind::Applied => schemars::schema_for!(Applied),
        EventKind::Episode => schemars::schema_for!(Episode),
        EventKind::Lifecycle => schemars::schema_for!(Lifecycle),
        EventKind::Embedding => schemars::schema_for!(Embedding),
        EventKind::Model => schemars::schema_for!(Model),
        EventKind::Target => schemars::schema_for!(Registration),
    };
    let mut text = serde_json::to_string_pretty(&schema).unwrap_or_default();
    text.push('\n');
    text
}

/// File name of a kind's JSON Schema inside `schemas/`.
pub fn schema_file(kind: EventKind) -> String {
    format!("{}.schema.json", kind.as_str())
}

/// File name of a kind's golden fixture inside `fixtures/`.
pub fn fixture_file(kind: EventKind) -> String {
    format!("{}.msgpack", kind.as_str())
}

/// One fixed, fully populated example of every message (the golden fixtures).
pub fn samples() -> Vec<Event> {
    let target = Target::new("shop", "checkout");
    let res = Resources {
        replicas: 3,
        cpu_millicores: 500,
        memory_bytes: 512 * 1024 * 1024,
    };
    let ts_ms = 1_767_225_600_000;
    vec![
        Event::Obs(Obs {
            schema: Schema::new(),
            target: target.clone(),
            episode: 7,
            step: 42,
            ts_ms,
            state: vec![0.25, 0.5, 0.75, 0.5, 0.125, 0.0625, 1.0, -0.25, 0.15],
            metrics: RawMetrics {
                replicas: 3,
                ready_replicas: 3,
                cpu_limit_cores: 0.5,
                memory_limit_bytes: 536_870_912.0,
                cpu_usage_cores: 1.125,
                memory_working_set_bytes: 805_306_368.0,
                cpu_util: 0.75,
                memory_util: 0.5,
                io_util: 0.125,
                network_util: 0.0625,
                request_rate_rps: 120.0,
                throughput_rps: 118.5,
                latency_p50_ms: Some(12.5),
                latency_p99_ms: Some(80.0),
                oom_kills: 0,
                spec_replicas: Some(4),
                pending_replicas: None,
            },
            reward: Some(1.625),
            slo_violation: false,
            complete: true,
            missing: vec![],
        }),
        Event::Action(Action {
            schema: Schema::new(),
            target: target.clone(),
            episode: 7,
            step: 42,
            ts_ms,
            source: DecisionSource::Rl,
            stage: Stage::Online,
            raw: vec![0.5, -0.25, 0.0],
            current: Resources {
                replicas: 2,
                cpu_millicores: 750,
                memory_bytes: 512 * 1024 * 1024,
            },
            desired: res,
            model_version: Some(12),
            exploration: true,
            fallback_reason: None,
            slo_unreachable: Some(Resources {
                replicas: 40,
                cpu_millicores: 2500,
                memory_bytes: 4 * 1024 * 1024 * 1024,
            }),
            slo_judged: true,
        }),
        Event::Applied(Applied {
            schema: Schema::new(),
            target: target.clone(),
            episode: 7,
            step: 42,
            ts_ms,
            outcome: Outcome::Applied,
            source: DecisionSource::Rl,
            requested: Resources {
                replicas: 25,
                ..res
            },
            applied: Resources {
                replicas: 20,
                ..res
            },
            clamped: vec!["replicas".to_string()],
            reason: Some("replicas 25 above maxReplicas 20".to_string()),
            sink: "simulator".to_string(),
        }),
        Event::Episode(Episode {
            schema: Schema::new(),
            target: target.clone(),
            episode: 7,
            step: 99,
            ts_ms,
            steps: 100,
            total_reward: 162.5,
            mean_reward: 1.625,
            slo_violations: 3,
            cpu_util_mean: 0.625,
            memory_util_mean: 0.5,
            rl_steps: 100,
            fallback_steps: 0,
            stage: Stage::Online,
            policy_estimate: Some(160.0),
            exploring_steps: Some(100),
            requested_cores_mean: Some(2.5),
            requested_gib_mean: Some(4.0),
        }),
        Event::Lifecycle(Lifecycle {
            schema: Schema::new(),
            target: target.clone(),
            episode: 7,
            step: 99,
            ts_ms,
            stage: Stage::Serving,
            previous: Some(Stage::Online),
            reason: "mean reward 1.6 >= t_serving 1.5 and std 0.05 <= t_var 0.1".to_string(),
            reward_mean: Some(1.625),
            reward_std: Some(0.05),
            window: 10,
            rollback_to: None,
        }),
        Event::Embedding(Embedding {
            schema: Schema::new(),
            target: target.clone(),
            episode: 7,
            step: 99,
            ts_ms,
            model_version: 3,
            embedding: vec![0.0, 0.5, 1.25, 0.0],
            episodes_used: 20,
        }),
        Event::Model(Model {
            schema: Schema::new(),
            target: target.clone(),
            episode: 7,
            step: 99,
            ts_ms,
            kind: ModelKind::BaseLearner,
            version: 12,
            uri: "file:///var/lib/aware/models/shop/checkout/base-12.bin".to_string(),
            sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".to_string(),
            size_bytes: 1_048_576,
            trained_steps: 25_000,
            policy_estimate: Some(1.5),
            behaviour_reward: Some(1.25),
        }),
        Event::Registration(Registration {
            schema: Schema::new(),
            target,
            episode: 0,
            step: 0,
            ts_ms,
            generation: 4,
            source: "shop/checkout-aware".to_string(),
            spec: Some(RegisteredSpec {
                min_replicas: 1,
                max_replicas: 20,
                min_cpu_millicores: 128,
                max_cpu_millicores: 2048,
                min_memory_bytes: 256 * 1024 * 1024,
                max_memory_bytes: 3 * 1024 * 1024 * 1024,
                slo_latency_p99_ms: Some(200.0),
                slo_throughput_rps: None,
                alpha: 0.5,
                recommend_only: false,
                lifecycle: Some(RegisteredLifecycle {
                    bootstrap: true,
                    t_online: 1.0,
                    t_serving: 1.3,
                    t_var: 0.15,
                    window: 10,
                }),
                container: Some("app".to_string()),
                limits: Some(LimitsPolicy {
                    controlled_values: ControlledValues::RequestsOnly,
                    cpu_limit: CpuLimit::UnsetIfLatencySensitive,
                }),
                slo_objective: Some(0.995),
                fallback_hpa_target_cpu_utilization: Some(0.35),
            }),
        }),
    ]
}

/// Errors writing the generated files.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("cannot write {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Encode(#[from] codec::EncodeError),
}

/// Writes `schemas/*.schema.json` and `fixtures/*.msgpack` under `dir` (the bus-schemas crate).
/// Returns the paths written.
pub fn write_all(dir: &Path) -> Result<Vec<String>, GenerateError> {
    let mut written = Vec::new();
    let write = |path: std::path::PathBuf, bytes: &[u8], written: &mut Vec<String>| {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| GenerateError::Io {
                path: parent.display().to_string(),
                source,
            })?;
        }
        std::fs::write(&path, bytes).map_err(|source| GenerateError::Io {
            path: path.display().to_string(),
            source,
        })?;
        written.push(path.display().to_string());
        Ok::<_, GenerateError>(())
    };
    for kind in EventKind::ALL {
        write(
            dir.join("schemas").join(schema_file(kind)),
            json_schema(kind).as_bytes(),
            &mut written,
        )?;
    }
    for ev in samples() {
        let bytes = codec::encode_event(&ev)?;
        write(
            dir.join("fixtures").join(fixture_file(ev.kind())),
            &bytes,
            &mut written,
        )?;
    }
    Ok(written)
}
