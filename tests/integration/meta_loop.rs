//! Meta-learning in the services (issue [meta-learner] item 3) on the embedded bus: a tiny
//! `aware train-meta` run writes a meta dir, the trainer (with `trainer.meta_dir`) publishes each
//! target's `embedding` (64-d, the meta-learner's version) and trains base-learners over
//! `state ‖ embedding` starting from `base.ckpt`, and the recommenders act with them: their RL
//! actions name model versions whose checkpoints take 9 + 64 inputs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use aware_bus_schemas::{subject, DecisionSource, Event, Stage, Target};
use aware_cli::train_meta::{self, TrainMetaOptions};
use aware_metrics_collector::config::{CollectorConfig, SourceKind};
use aware_shared::bus::Bus;
use aware_shared::config::AppConfig;
use aware_shared::model_store::{get_verified, LocalDirStore};
use aware_shared_model::{Ddpg, MetaConfig};

#[actix_rt::test]
async fn trainer_publishes_embeddings_and_recommenders_act_on_state_and_embedding() {
    let dir = tempfile::tempdir().unwrap();
    let meta_dir = dir.path().join("meta");
    // A tiny meta-training: 4 apps, 3 iterations, small networks, E = 64.
    let opts = TrainMetaOptions {
        apps: 4,
        iterations: 3,
        seed: 1,
        out: meta_dir.clone(),
        checkpoint_every: 3,
        steps_per_episode: 8,
        apps_per_iteration: 2,
        updates_per_iteration: 1,
        batch: 8,
        meta: MetaConfig {
            hidden: 8,
            fc_hidden: 16,
            bundle_size: 4,
            ..MetaConfig::default()
        },
        base_hidden: vec![16, 16],
        progress_every: 0,
        ..TrainMetaOptions::default()
    };
    tokio::task::spawn_blocking(move || train_meta::run(&opts))
        .await
        .unwrap()
        .unwrap();
    let meta_version = train_meta::load_agent(&meta_dir)
        .unwrap()
        .meta()
        .train_steps();

    let apps = 2usize;
    let mut cfg = AppConfig::default();
    cfg.bus.url = "embedded".into();
    cfg.http.listen = "127.0.0.1:0".into();
    let mut collector = CollectorConfig {
        source: SourceKind::Simulator,
        ..CollectorConfig::default()
    };
    cfg.learning.steps_per_episode = 10;
    collector.simulator.apps = apps;
    collector.simulator.seed = 5;
    collector.simulator.max_steps = 5_000;
    cfg.set_section("collector", &collector).unwrap();
    cfg.lifecycle.bootstrap = false;
    cfg.lifecycle.t_serving = 1e9;
    // Nor by re-baselining (a target ONLINE 10 episodes without improving would be served).
    cfg.sections.insert(
        "lifecycle_monitor".into(),
        serde_json::json!({ "rebaseline_after_episodes": 0 }),
    );
    crate::set_recorder(
        &mut cfg,
        serde_json::json!({ "sqlite_path": dir.path().join("t.db").display().to_string(), "batch": 16 }),
    );
    let models_dir = dir.path().join("models");
    cfg.sections.insert(
        "model_store".into(),
        serde_json::json!({ "dir": models_dir.display().to_string() }),
    );
    cfg.sections.insert(
        "trainer".into(),
        serde_json::json!({
            "train_every_transitions": 40, "gradient_steps": 20, "batch_size": 32,
            "min_transitions": 32, "poll_ms": 50,
            "meta_dir": meta_dir.display().to_string(), "embedding_refresh_episodes": 2
        }),
    );
    let bus = Bus::in_process(65_536);
    let (mut all, running, shutdown) = crate::start_services(bus, cfg, subject::ALL).await;

    let mut embeddings: BTreeMap<Target, u32> = BTreeMap::new();
    let mut models: BTreeMap<Target, BTreeMap<u64, String>> = BTreeMap::new();
    let mut rl_actions: BTreeMap<Target, u32> = BTreeMap::new();
    let mut rl_versions: BTreeSet<(Target, u64)> = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while rl_actions.len() < apps || rl_actions.values().any(|&n| n < 5) {
        match crate::next_event(&mut all, deadline, || format!("RL actions on every target within 60 s: embeddings {embeddings:?}, models {models:?}, rl actions {rl_actions:?}")).await {
            Event::Embedding(e) => {
                assert_eq!(e.embedding.len(), 64);
                assert!(e.embedding.iter().all(|x| x.is_finite()));
                assert_eq!(e.model_version, meta_version);
                assert!((1..=4).contains(&e.episodes_used), "{}", e.episodes_used);
                *embeddings.entry(e.target).or_default() += 1;
            }
            Event::Model(md) => {
                assert!(
                    embeddings.contains_key(&md.target),
                    "a conditioned target trains after its first embedding"
                );
                models
                    .entry(md.target.clone())
                    .or_default()
                    .insert(md.version, md.uri.clone());
                // Verified right away: later rounds do not delete it, but keep the test honest.
                let store = LocalDirStore::open(&models_dir).unwrap();
                let d = Ddpg::from_bytes(
                    &get_verified(&store, &md.uri, &md.sha256, md.size_bytes).unwrap(),
                )
                .unwrap();
                assert_eq!(d.config().state_dim, 9 + 64, "{}", md.uri);
            }
            Event::Action(a) if a.source == DecisionSource::Rl => {
                let v = a.model_version.expect("RL actions name their model");
                assert!(
                    models.get(&a.target).is_some_and(|m| m.contains_key(&v)),
                    "{v} not announced"
                );
                assert_eq!(a.stage, Stage::Online);
                assert_eq!(a.fallback_reason, None);
                rl_versions.insert((a.target.clone(), v));
                *rl_actions.entry(a.target).or_default() += 1;
            }
            _ => {}
        }
    }
    shutdown.cancel();
    running.join().await.unwrap();
    assert_eq!(embeddings.len(), apps, "{embeddings:?}");
    assert!(!rl_versions.is_empty());
}
