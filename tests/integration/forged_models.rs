//! A `model` message promotes a target only once its checkpoint loads from the model store and
//! matches the announced size and SHA-256: a forged `model` with a high estimate and a missing
//! or corrupt file (issue [hardening]) leaves the target OFFLINE on the fallback.

use std::sync::Arc;
use std::time::Duration;

use aware_bus_schemas::generated::samples;
use aware_bus_schemas::{subject, Event, EventKind, Model, ModelKind, Stage, Target};
use aware_shared::bus::{Bus, Subscription};
use aware_shared::config::{AppConfig, LifecycleProfile};
use aware_shared::model_store::{model_key, LocalDirStore, ModelStore};
use tokio_util::sync::CancellationToken;

fn target() -> Target {
    Target::new("shop", "web")
}

async fn publish(bus: &Bus, ev: Event) {
    let subj = subject::subject(ev.kind(), ev.target()).unwrap();
    let bytes = aware_bus_schemas::encode_event(&ev).unwrap();
    bus.publish(&subj, bytes.into()).await.unwrap();
}

fn model(version: u64, uri: &str, sha256: &str, size_bytes: u64) -> Event {
    let Some(Event::Model(mut m)) = samples().into_iter().find(|e| e.kind() == EventKind::Model)
    else {
        unreachable!()
    };
    let m: &mut Model = &mut m;
    m.target = target();
    m.kind = ModelKind::BaseLearner;
    m.version = version;
    m.uri = uri.to_string();
    m.sha256 = sha256.to_string();
    m.size_bytes = size_bytes;
    m.policy_estimate = Some(10.0);
    m.behaviour_reward = Some(1.0);
    Event::Model(m.clone())
}

/// The next lifecycle stage of the target within `wait`, if any.
async fn next_stage(sub: &mut Subscription, wait: Duration) -> Option<Stage> {
    let m = tokio::time::timeout(wait, sub.next()).await.ok()??;
    match aware_bus_schemas::decode_event(EventKind::Lifecycle, &m.payload).unwrap() {
        Event::Lifecycle(l) => Some(l.stage),
        other => panic!("{other:?}"),
    }
}

#[actix_rt::test]
async fn a_forged_model_with_a_missing_or_corrupt_checkpoint_promotes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.lifecycle = LifecycleProfile {
        bootstrap: true,
        t_online: 1.0,
        ..Default::default()
    };
    cfg.sections.insert(
        "model_store".into(),
        serde_json::json!({ "backend": "local", "dir": dir.path() }),
    );
    let bus = Bus::in_process(1024);
    let mut lifecycle = bus.subscribe("aware.v1.lifecycle.>").await.unwrap();
    let shutdown = CancellationToken::new();
    let running = aware_shared::launcher::start_on(
        bus.clone(),
        Arc::new(cfg),
        &[aware_lifecycle_monitor::ENTRY],
        shutdown.clone(),
    )
    .await
    .unwrap();
    crate::wait_ready(&running).await;

    let Some(Event::Obs(mut o)) = samples().into_iter().find(|e| e.kind() == EventKind::Obs) else {
        unreachable!()
    };
    o.target = target();
    publish(&bus, Event::Obs(o)).await;
    assert_eq!(
        next_stage(&mut lifecycle, Duration::from_secs(10)).await,
        Some(Stage::Offline)
    );

    let store = LocalDirStore::open(dir.path()).unwrap();
    // A file that does not exist, with a promoting estimate.
    let missing = model_key(&target(), "base_learner", 1);
    let uri = format!("file://{}", dir.path().join(&missing).display());
    publish(&bus, model(1, &uri, &"0".repeat(64), 1234)).await;
    // A file that exists but is not the announced one (its digest differs).
    let agent = aware_shared_model::Ddpg::new(aware_shared_model::DdpgConfig::default()).unwrap();
    let bytes = agent.to_bytes().unwrap();
    let stored = store
        .put(&model_key(&target(), "base_learner", 2), &bytes)
        .unwrap();
    publish(
        &bus,
        model(2, &stored.uri, &"f".repeat(64), stored.size_bytes),
    )
    .await;
    // A file with the announced digest that is not a checkpoint.
    let junk = store
        .put(
            &model_key(&target(), "base_learner", 3),
            b"not a checkpoint",
        )
        .unwrap();
    publish(&bus, model(3, &junk.uri, &junk.sha256, junk.size_bytes)).await;
    assert_eq!(
        next_stage(&mut lifecycle, Duration::from_secs(2)).await,
        None,
        "a model that does not verify promoted the target"
    );
    let m = crate::labelled_metrics_of(&running, aware_lifecycle_monitor::NAME);
    assert_eq!(m("aware_lifecycle_unverified_models_total", &[]), Some(3.0));

    // The genuine checkpoint, as announced: promoted.
    publish(
        &bus,
        model(4, &stored.uri, &stored.sha256, stored.size_bytes),
    )
    .await;
    assert_eq!(
        next_stage(&mut lifecycle, Duration::from_secs(10)).await,
        Some(Stage::Online)
    );
    shutdown.cancel();
    running.join().await.unwrap();
}
