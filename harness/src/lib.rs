//! What the `aware` demo and the benchmarks (`aware-bench`) share: the registry of the
//! services, meta-training on the simulator ([`train_meta`], also the product command
//! `aware train-meta`) and the default meta-learner shipped in the binaries ([`default_meta`]), the six services on an embedded bus paced to the lock-step simulator
//! ([`PacedServices`]), `--set SECTION.KEY=VALUE` overlays of the services' settings and the SVG
//! line charts of learning curves ([`chart`]).

pub mod chart;
pub mod default_meta;
pub mod train_meta;

use aware_shared::launcher::ServiceEntry;

/// Every service, in the order `aware run all` starts them.
pub const SERVICES: [ServiceEntry; 6] = [
    aware_lifecycle_monitor::ENTRY,
    aware_meta_learner_trainer::ENTRY,
    aware_trajectory_recorder::ENTRY,
    aware_actuator::ENTRY,
    aware_recommender::ENTRY,
    aware_metrics_collector::ENTRY,
];

/// Services `aware run` starts only by name: the Kubernetes controller needs an API server, so
/// `all` (which runs anywhere) leaves it out.
pub const BY_NAME_ONLY: [ServiceEntry; 1] = [aware_controller::ENTRY];

/// The services named on the command line (`all` or one service name).
pub fn select_services(name: &str) -> Option<Vec<ServiceEntry>> {
    if name == "all" {
        return Some(SERVICES.to_vec());
    }
    SERVICES
        .iter()
        .chain(BY_NAME_ONLY.iter())
        .find(|e| e.name == name)
        .map(|e| vec![*e])
}

/// Names accepted by `aware run`.
pub fn service_names() -> Vec<&'static str> {
    std::iter::once("all")
        .chain(SERVICES.iter().chain(BY_NAME_ONLY.iter()).map(|e| e.name))
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum ServicesError {
    #[error(transparent)]
    Bus(#[from] aware_shared::bus::BusError),
    #[error(transparent)]
    Service(#[from] aware_shared::service::ServiceError),
    #[error("setting {path:?}: expected section.key[.key…]")]
    Setting { path: String },
    #[error("settings {paths:?}: {reason}")]
    SettingValue { paths: Vec<String>, reason: String },
    #[error(transparent)]
    Config(#[from] aware_shared::config::ConfigError),
}

/// A `--set`-style flag's value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("expected {expected}, got {given:?}")]
    Shape {
        expected: &'static str,
        given: String,
    },
    #[error("empty key in {0:?}")]
    EmptyKey(String),
    #[error("unknown arm {arm:?} in {given:?} (one of {known})")]
    UnknownArm {
        arm: String,
        given: String,
        known: String,
    },
}

/// `KEY=VALUE` with a JSON value (a bare word that is not JSON is taken as a string): the value
/// parser of every `--set`-style flag.
pub fn parse_setting(s: &str) -> Result<(String, serde_json::Value), SettingError> {
    let (k, v) = s.split_once('=').ok_or_else(|| SettingError::Shape {
        expected: "KEY=VALUE",
        given: s.to_string(),
    })?;
    if k.is_empty() {
        return Err(SettingError::EmptyKey(s.to_string()));
    }
    let v = serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.to_string()));
    Ok((k.to_string(), v))
}

/// The trajectory store (SQLite) and the model store of a run, under `dir`.
pub fn set_stores(cfg: &mut aware_shared::config::AppConfig, dir: &std::path::Path) {
    cfg.sections.insert(
        "trajectory_store".into(),
        serde_json::json!({ "sqlite_path": dir.join("trajectories.db").display().to_string() }),
    );
    cfg.sections
        .insert("recorder".into(), serde_json::json!({ "batch": 64 }));
    cfg.sections.insert(
        "model_store".into(),
        serde_json::json!({ "dir": dir.join("models").display().to_string() }),
    );
}

/// The services' configuration of a paced run on the simulated cluster, as `aware demo` runs
/// them: `collector`'s simulator, the trajectory store (SQLite) and the model store under
/// `data_dir`, a trainer that polls often enough for a paced run (bootstrapping from the
/// meta-learner in `meta` with a light imitation term), every other setting the services'
/// default, then `settings` (`--set`).
pub fn paced_sim_config(
    collector: &aware_metrics_collector::config::CollectorConfig,
    steps_per_episode: u32,
    data_dir: &std::path::Path,
    meta: Option<&std::path::Path>,
    settings: &[(String, serde_json::Value)],
) -> Result<aware_shared::config::AppConfig, ServicesError> {
    let mut cfg = aware_shared::config::AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.learning.steps_per_episode = steps_per_episode;
    cfg.set_section("collector", collector)?;
    set_stores(&mut cfg, data_dir);
    let offline_episodes = 4u64;
    let mut trainer = serde_json::json!({
        "poll_ms": 50,
        "train_every_transitions": 100,
        "offline_min_transitions": offline_episodes * u64::from(steps_per_episode),
        "eval_episodes": offline_episodes,
    });
    if let (Some(meta), Some(t)) = (meta, trainer.as_object_mut()) {
        t.insert("meta_dir".into(), meta.display().to_string().into());
        // A light imitation term keeps more of the meta-trained policy (docs/adr/0004-td3-bc-bootstrapping.md).
        t.insert("bc_alpha".into(), 100.0.into());
    }
    cfg.sections.insert("trainer".into(), trainer);
    apply_settings(cfg, settings)
}

/// `cfg` with `settings` (`--set`) applied, to a service's section (`trainer.poll_ms`) or to
/// the configuration's own sections (`learning.objective.mode`) alike; a value of the wrong
/// type for a key of the latter is refused, naming the settings.
pub fn apply_settings(
    cfg: aware_shared::config::AppConfig,
    settings: &[(String, serde_json::Value)],
) -> Result<aware_shared::config::AppConfig, ServicesError> {
    if settings.is_empty() {
        return Ok(cfg);
    }
    let refused = |reason: String| ServicesError::SettingValue {
        paths: settings.iter().map(|(p, _)| p.clone()).collect(),
        reason,
    };
    let mut all: std::collections::BTreeMap<String, serde_json::Value> =
        match serde_json::to_value(&cfg).map_err(|e| refused(e.to_string()))? {
            serde_json::Value::Object(m) => m.into_iter().collect(),
            _ => return Err(refused("the configuration is not an object".into())),
        };
    for (path, value) in settings {
        set_path(&mut all, path, value.clone())?;
    }
    serde_json::from_value(serde_json::Value::Object(all.into_iter().collect()))
        .map_err(|e| refused(e.to_string()))
}

/// Sets `value` at the dotted `path` (`section.key[.key…]`) of the config's sections, creating
/// the objects on the way.
pub fn set_path(
    sections: &mut std::collections::BTreeMap<String, serde_json::Value>,
    path: &str,
    value: serde_json::Value,
) -> Result<(), ServicesError> {
    let bad = || ServicesError::Setting {
        path: path.to_string(),
    };
    let parts: Vec<&str> = path.split('.').collect();
    let (Some((section, keys)), false) = (parts.split_first(), parts.iter().any(|p| p.is_empty()))
    else {
        return Err(bad());
    };
    let Some((leaf, inner)) = keys.split_last() else {
        return Err(bad());
    };
    let mut node = sections
        .entry((*section).to_string())
        .or_insert_with(|| serde_json::json!({}));
    for k in inner {
        node = node
            .as_object_mut()
            .ok_or_else(bad)?
            .entry((*k).to_string())
            .or_insert_with(|| serde_json::json!({}));
    }
    node.as_object_mut()
        .ok_or_else(bad)?
        .insert((*leaf).to_string(), value);
    Ok(())
}

/// The six services on an embedded bus, paced the bus's own way: a subscriber to `obs` sleeps
/// `pace` after every round of the apps' observations, and the bus's back-pressure (small
/// buffers) reaches the lock-step collector within a few steps, so the trainer keeps up.
pub struct PacedServices {
    all: aware_shared::bus::Subscription,
    pacer: tokio::task::JoinHandle<()>,
    running: aware_shared::launcher::Running,
    shutdown: tokio_util::sync::CancellationToken,
    deadline: tokio::time::Instant,
}

impl PacedServices {
    /// Starts the services on `bus` (built with small buffers) with `cfg`; events are read
    /// until `timeout` from now.
    pub async fn start(
        bus: aware_shared::bus::Bus,
        cfg: aware_shared::config::AppConfig,
        apps: usize,
        pace: std::time::Duration,
        timeout: std::time::Duration,
    ) -> Result<Self, ServicesError> {
        let all = bus.subscribe(aware_bus_schemas::subject::ALL).await?;
        let mut obs = bus.subscribe("aware.v1.obs.>").await?;
        let apps = apps.max(1);
        let pacer = tokio::spawn(async move {
            let mut n = 0usize;
            while obs.next().await.is_some() {
                n += 1;
                if n.is_multiple_of(apps) {
                    tokio::time::sleep(pace).await;
                }
            }
        });
        let shutdown = tokio_util::sync::CancellationToken::new();
        let running = aware_shared::launcher::start_on(
            bus,
            std::sync::Arc::new(cfg),
            &SERVICES,
            shutdown.clone(),
        )
        .await?;
        Ok(PacedServices {
            all,
            pacer,
            running,
            shutdown,
            deadline: tokio::time::Instant::now() + timeout,
        })
    }

    /// The next event on the bus; `None` at the deadline or when the bus closes (messages that
    /// do not decode are skipped).
    pub async fn next_event(&mut self) -> Option<aware_bus_schemas::Event> {
        loop {
            let m = tokio::time::timeout_at(self.deadline, self.all.next())
                .await
                .ok()??;
            let Ok(p) = aware_bus_schemas::subject::parse(&m.subject) else {
                continue;
            };
            if let Ok(ev) = aware_bus_schemas::decode_event(p.kind, &m.payload) {
                return Some(ev);
            }
        }
    }

    /// The sum of a counter over every service's registry.
    pub fn counter(&self, name: &str) -> f64 {
        self.running
            .contexts
            .iter()
            .flat_map(|c| c.metrics.registry().gather())
            .filter(|f| f.name() == name)
            .flat_map(|f| {
                f.get_metric()
                    .iter()
                    .map(|m| m.get_counter().get_value())
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// Shuts the services down and waits for them.
    pub async fn stop(self) -> Result<(), ServicesError> {
        self.shutdown.cancel();
        self.pacer.abort();
        drop(self.all);
        self.running.join().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_all_or_one() {
        assert_eq!(select_services("all").unwrap().len(), 6);
        assert_eq!(
            select_services("recommender").unwrap()[0].name,
            "recommender"
        );
        assert_eq!(select_services("controller").unwrap()[0].name, "controller");
        assert!(select_services("all")
            .unwrap()
            .iter()
            .all(|e| e.name != "controller"));
        assert!(select_services("nope").is_none());
        assert_eq!(service_names().len(), 8);
    }

    #[test]
    fn settings_parse_and_set_nested_paths() {
        assert!(parse_setting("no_equals").is_err());
        assert!(parse_setting("=1").is_err());
        assert_eq!(
            parse_setting("mode=fast").unwrap(),
            ("mode".to_string(), serde_json::json!("fast"))
        );
        let mut sections = std::collections::BTreeMap::new();
        sections.insert("trainer".to_string(), serde_json::json!({ "poll_ms": 50 }));
        set_path(&mut sections, "trainer.train_every_transitions", 50.into()).unwrap();
        set_path(
            &mut sections,
            "actuator.guardrails.cpu_cooldown_ms",
            0.into(),
        )
        .unwrap();
        assert_eq!(
            sections["trainer"],
            serde_json::json!({ "poll_ms": 50, "train_every_transitions": 50 })
        );
        assert_eq!(
            sections["actuator"],
            serde_json::json!({ "guardrails": { "cpu_cooldown_ms": 0 } })
        );
        assert!(set_path(&mut sections, "trainer", 1.into()).is_err());
        // The configuration's own sections take settings too; a wrong value is refused.
        let cfg = apply_settings(
            aware_shared::config::AppConfig::default(),
            &[
                ("learning.objective.mode".into(), "constrained".into()),
                ("trainer.poll_ms".into(), 50.into()),
            ],
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(cfg.learning.objective.mode).unwrap(),
            serde_json::json!("constrained")
        );
        assert_eq!(cfg.learning.steps_per_episode, 100);
        assert_eq!(
            cfg.sections["trainer"],
            serde_json::json!({ "poll_ms": 50 })
        );
        let bad = apply_settings(
            aware_shared::config::AppConfig::default(),
            &[("learning.objective.mode".into(), "cheapest".into())],
        )
        .unwrap_err();
        assert!(bad.to_string().contains("learning.objective.mode"), "{bad}");
        assert!(
            set_path(&mut sections, "trainer.poll_ms.x", 1.into()).is_err(),
            "poll_ms is not an object"
        );
    }
}
