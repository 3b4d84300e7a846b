//! `aware config`: the configuration every service would run with, each service's section read
//! by its own type (defaults filled in, unknown keys refused) and checked as the service checks it
//! at start-up, whichever services this process runs.

use aware_shared::config::{AppConfig, ConfigError, CORE_SECTIONS, SERVICE_SECTIONS};
use serde::Serialize;
use serde_json::Value;

/// A section that would stop its service's start-up.
#[derive(Debug, thiserror::Error)]
pub enum ConfigCheckError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("configuration section `{section}`: {reason}")]
    Section {
        section: &'static str,
        reason: String,
    },
    #[error("configuration: {0}")]
    Json(#[from] serde_json::Error),
}

/// Reads section `name` as its service does (`T`, defaults filled in, unknown keys refused),
/// runs the service's own `check` on it and adds it to `out`.
fn add<T, E: std::fmt::Display>(
    out: &mut serde_json::Map<String, Value>,
    cfg: &AppConfig,
    name: &'static str,
    check: impl FnOnce(&T) -> Result<(), E>,
) -> Result<(), ConfigCheckError>
where
    T: serde::de::DeserializeOwned + Default + Serialize,
{
    let typed: T = cfg.section(name)?;
    check(&typed).map_err(|e| ConfigCheckError::Section {
        section: name,
        reason: e.to_string(),
    })?;
    out.insert(name.to_string(), serde_json::to_value(&typed)?);
    Ok(())
}

/// `cfg` (already validated by [`aware_shared::config::load`]) with every service section in
/// full, as JSON; the first section a service would refuse is an error naming it.
pub fn effective(cfg: &AppConfig) -> Result<Value, ConfigCheckError> {
    // Secrets (a password or token in `bus.url` or `bus.auth`) are masked.
    let shown = AppConfig {
        bus: cfg.bus.redacted(),
        ..cfg.clone()
    };
    let core = serde_json::to_value(&shown)?;
    // The core sections; the raw service sections and stray top-level scalars (unrelated
    // `AWARE_*` variables) are left out.
    let mut out: serde_json::Map<String, Value> = CORE_SECTIONS
        .iter()
        .map(|name| (name.to_string(), core[name].clone()))
        .collect();
    add(
        &mut out,
        cfg,
        "actuator",
        |a: &aware_actuator::service::ActuatorConfig| {
            aware_actuator::guardrails::Guardrails::new(a.guardrails)
                .map(drop)
                .map_err(|e| e.to_string())?;
            a.kubernetes.validate().map_err(|e| e.to_string())
        },
    )?;
    // The collector's section is read (and checked) as the collector reads it.
    let collector = aware_metrics_collector::config::CollectorConfig::read(cfg)?;
    out.insert("collector".into(), serde_json::to_value(&collector)?);
    add(
        &mut out,
        cfg,
        "controller",
        aware_controller::controller::ControllerConfig::validate,
    )?;
    add(
        &mut out,
        cfg,
        "lifecycle_monitor",
        aware_lifecycle_monitor::MonitorConfig::validate,
    )?;
    add(
        &mut out,
        cfg,
        "model_store",
        aware_shared::model_store::ModelStoreConfig::validate,
    )?;
    add(
        &mut out,
        cfg,
        "recommender",
        aware_recommender::RecommenderConfig::validate,
    )?;
    let recorder = aware_trajectory_recorder::service::RecorderConfig::read(cfg)?;
    out.insert("recorder".into(), serde_json::to_value(&recorder)?);
    out.insert(
        "trajectory_store".into(),
        serde_json::to_value(&recorder.store)?,
    );
    add(
        &mut out,
        cfg,
        "trainer",
        aware_meta_learner_trainer::learner::TrainerConfig::validate,
    )?;
    debug_assert!(SERVICE_SECTIONS.iter().all(|s| out.contains_key(*s)));
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_shared::config::{load, ConfigSources};
    use std::collections::HashMap;

    fn load_with(text: &str) -> Result<Value, ConfigCheckError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("aware.toml");
        std::fs::write(&file, text).unwrap();
        let cfg = load(&ConfigSources {
            file: Some(file),
            env: Some(HashMap::from([(
                "AWARE_BIN".to_string(),
                "/usr/bin/aware".to_string(),
            )])),
            overrides: vec![("shard.count".into(), "3".into())],
        })?;
        effective(&cfg)
    }

    #[test]
    fn every_section_is_filled_in_and_layered() {
        let v = load_with("[trainer]\nseed = 7\n[bus]\nchannel_capacity = 8\n").unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want: Vec<&str> = CORE_SECTIONS
            .iter()
            .chain(&SERVICE_SECTIONS)
            .copied()
            .collect();
        want.sort_unstable();
        assert_eq!(keys, want, "every section, and no stray AWARE_BIN");
        assert_eq!(v["trainer"]["seed"], 7);
        // The rest of the section at its defaults.
        assert_eq!(v["trainer"]["batch_size"], 64);
        assert_eq!(v["bus"]["channel_capacity"], 8);
        assert_eq!(v["shard"]["count"], 3);
        assert_eq!(v["recorder"]["batch"], 512);
    }

    #[test]
    fn a_section_its_service_would_refuse_is_named() {
        for (text, section) in [
            // An unknown key of a service this process may not even run.
            ("[trainer]\ngradient_step = 10\n", "trainer"),
            // Values each service's own check refuses.
            ("[trainer]\ntrain_every_transitions = 0\n", "trainer"),
            (
                "[lifecycle_monitor]\nprobation_margin = -1.0\n",
                "lifecycle_monitor",
            ),
            (
                "[trajectory_store]\nbackend = \"questdb\"\n",
                "trajectory_store",
            ),
            // A store key where it was before the store had its own section.
            (
                "[recorder]\nstore = \"questdb\"\n",
                "trajectory_store.backend",
            ),
            (
                "[model_store]\nbackend = \"jetstream\"\nbucket = \"no spaces\"\n",
                "model_store",
            ),
            (
                "[actuator.guardrails]\nreplicas_up_ratio = -1.0\n",
                "actuator",
            ),
            // A trainer key in the recommender's section, and a misspelt fallback key: each
            // was ignored before the recommender's types denied unknown keys.
            (
                "[recommender]\nexploration_sigma = 0.5\n",
                "exploration_sigma",
            ),
            (
                "[recommender.fallback.hpa]\ntarget_cpu_utilisation = 0.5\n",
                "target_cpu_utilisation",
            ),
            (
                "[recommender.fallback.hpa.scale_up]\nstabilisation_window_s = 5\n",
                "stabilisation_window_s",
            ),
            (
                "[recommender.fallback.vpa]\nsafety_margin = 0.2\n",
                "safety_margin",
            ),
            // A NaN or an infinity is named by its key, not as "invalid type: null".
            (
                "[recommender]\nretrain_noise_scale = nan\n",
                "`recommender.retrain_noise_scale`: must be a finite number",
            ),
            (
                "[actuator.guardrails]\ncpu_min_change_ratio = inf\n",
                "`actuator.guardrails.cpu_min_change_ratio`: must be a finite number",
            ),
            // Sizes of 0 or less, and type errors, named by their full key.
            ("[recorder]\nbatch = 0\n", "recorder.batch"),
            ("[recorder]\nbatch = -1\n", "`recorder.batch`"),
            ("[recorder]\nbatch = \"many\"\n", "`recorder.batch`"),
            ("[trainer]\nbatch_size = -64\n", "`trainer.batch_size`"),
            (
                "[recommender.fallback.hpa]\ntarget_cpu_utilization = \"high\"\n",
                "`recommender.fallback.hpa.target_cpu_utilization`",
            ),
            (
                "[bus]\nreconnect_max_delay_ms = 0\n",
                "bus.reconnect_max_delay_ms",
            ),
            ("[bus]\nchannel_capacity = -1\n", "bus.channel_capacity"),
            (
                "[model_store]\ntimeout_ms = -1\n",
                "`model_store.timeout_ms`",
            ),
        ] {
            let err = load_with(text).unwrap_err().to_string();
            assert!(
                err.contains(section),
                "{text:?}: `{err}` does not name {section}"
            );
        }
    }
}
