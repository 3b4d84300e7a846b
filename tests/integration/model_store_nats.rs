//! The RL loop with `model_store.backend = "jetstream"`: the trainer writes its checkpoints to a
//! JetStream object store bucket on a real nats-server, announces `nats-object://` uris, and the
//! recommenders read, verify and act with them; on the embedded bus the same setting stops
//! start-up with a configuration error.

use std::sync::Arc;

use aware_shared::bus::Bus;
use aware_shared::config::AppConfig;
use aware_shared::model_store::{get_verified, JetStreamStore, ModelStoreConfig};
use aware_tests::NatsServer;
use tokio_util::sync::CancellationToken;

#[actix_rt::test]
async fn rl_loop_with_the_jetstream_model_store() {
    let server = NatsServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut bus_cfg = AppConfig::default().bus;
    bus_cfg.url = server.url();
    let bus = Bus::connect(&bus_cfg, "rl-loop-test").await.unwrap();
    let store = serde_json::json!({ "backend": "jetstream", "bucket": "rl-models" });
    let models = crate::rl_loop::run_rl_loop(
        dir.path(),
        bus,
        &server.url(),
        store.clone(),
        "nats-object://rl-models/",
    )
    .await;
    assert!(!models.is_empty());
    // Every announced checkpoint is in the bucket (the store is synchronous; its own runtime
    // and connection serve it, so calling it here is safe).
    let cfg: ModelStoreConfig = serde_json::from_value(store).unwrap();
    let objects = JetStreamStore::connect(&server.url(), &bus_cfg, &cfg)
        .await
        .unwrap();
    for m in &models {
        let bytes = get_verified(&objects, &m.uri, &m.sha256, m.size_bytes);
        assert_eq!(bytes.unwrap().len() as u64, m.size_bytes, "{}", m.uri);
    }
}

#[actix_rt::test]
async fn jetstream_model_store_on_the_embedded_bus_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    crate::set_recorder(
        &mut cfg,
        serde_json::json!({ "sqlite_path": dir.path().join("t.db").display().to_string() }),
    );
    cfg.sections.insert(
        "model_store".into(),
        serde_json::json!({ "backend": "jetstream" }),
    );
    let running = aware_shared::launcher::start_on(
        Bus::in_process(1024),
        Arc::new(cfg),
        &[aware_recommender::ENTRY],
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let err = tokio::time::timeout(std::time::Duration::from_secs(30), running.join())
        .await
        .expect("start-up fails at once")
        .unwrap_err()
        .to_string();
    assert!(err.contains("model_store.backend"), "{err}");
    assert!(err.contains("NATS bus"), "{err}");
}
