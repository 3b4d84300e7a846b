//! The control loop on the embedded bus: the simulated cluster driven by the six services with
//! the HPA/VPA fallback; every executed step is recorded as a transition and every episode is
//! summarised.

use std::sync::Arc;
use std::time::Duration;

use aware_bus_schemas::{subject, Event, Stage, Target};
use aware_metrics_collector::config::{CollectorConfig, SourceKind};
use aware_shared::bus::Bus;
use aware_shared::config::AppConfig;
use aware_stores::trajectory::{SqliteStore, TrajectoryStore};
use tokio_util::sync::CancellationToken;

/// The simulated cluster of `apps` (seed 11) for `steps` steps of `spe`-step episodes, the
/// recorder's section `recorder`.
fn simulated(apps: usize, spe: u32, steps: u64, recorder: serde_json::Value) -> AppConfig {
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    let mut collector = CollectorConfig {
        source: SourceKind::Simulator,
        ..CollectorConfig::default()
    };
    cfg.learning.steps_per_episode = spe;
    collector.simulator.apps = apps;
    collector.simulator.seed = 11;
    collector.simulator.max_steps = steps;
    cfg.set_section("collector", &collector).unwrap();
    crate::set_recorder(&mut cfg, recorder);
    cfg
}

#[actix_rt::test]
async fn fallback_loop_records_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("trajectories.db");
    let (apps, spe, episodes) = (4usize, 20u32, 3u64);
    let steps = u64::from(spe) * episodes;
    let cfg = simulated(
        apps,
        spe,
        steps,
        serde_json::json!({ "sqlite_path": db.display().to_string(), "batch": 64 }),
    );
    let bus = Bus::in_process(65_536);
    let (mut all, running, shutdown) = crate::start_services(bus, cfg, subject::ALL).await;

    let (mut obs, mut actions, mut applied, mut eps) = (0u64, 0u64, 0u64, 0u64);
    let mut offline = std::collections::BTreeSet::<Target>::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    // The run ends when every target has its episode summaries.
    while eps < apps as u64 * episodes {
        match crate::next_event(&mut all, deadline, || {
            "the loop finishes within 120 s".into()
        })
        .await
        {
            Event::Obs(o) => {
                obs += 1;
                assert!(o.complete);
                assert!(o.state.iter().all(|x| x.is_finite()));
                if o.episode == 0 && o.step == 0 {
                    assert!(o.reward.is_none());
                } else {
                    assert!(o.reward.unwrap().is_finite());
                }
            }
            Event::Action(a) => {
                actions += 1;
                assert_eq!(a.source, aware_bus_schemas::DecisionSource::Fallback);
                assert!(a.desired.replicas >= 1 && a.desired.replicas <= 20);
                assert!(a.desired.cpu_millicores >= 128 && a.desired.cpu_millicores <= 2048);
            }
            Event::Applied(_) => applied += 1,
            Event::Episode(e) => {
                eps += 1;
                assert_eq!(e.steps, spe);
                assert_eq!(e.fallback_steps, spe);
                assert!(e.mean_reward.is_finite() && e.mean_reward > 0.0);
            }
            Event::Lifecycle(l) => {
                assert_eq!(l.stage, Stage::Offline, "the fallback bootstraps");
                offline.insert(l.target.clone());
            }
            _ => {}
        }
    }
    shutdown.cancel();
    running.join().await.unwrap();

    let n = apps as u64;
    // obs for steps 0..=steps (the last one is never stepped), one action and applied each.
    assert!(obs >= n * steps, "obs {obs}");
    assert!(
        actions >= n * steps && applied >= n * steps,
        "{actions} {applied}"
    );
    assert_eq!(offline.len(), apps, "every target announced OFFLINE");
    let store = SqliteStore::open_path(&db).unwrap();
    assert_eq!(
        store.count_all().unwrap(),
        n * steps,
        "one transition per executed step"
    );
    for t in store.targets().unwrap() {
        assert_eq!(store.count(&t).unwrap(), steps);
        let recorded = store.episodes(&t, 10).unwrap();
        assert_eq!(recorded.len() as u64, episodes);
        let rows = store.transitions(&t, 0..episodes).unwrap();
        assert_eq!(rows.len() as u64, steps);
        // Consecutive transitions chain: s_{t+1} of one is s_t of the next.
        for w in rows.windows(2) {
            assert_eq!(w[0].next_state, w[1].state);
        }
    }
}

/// Retention (`trajectory_store.keep_transitions`): with 50 kept per target and 20-step episodes the
/// recorder prunes whole episodes as it goes, so after 8 episodes each target keeps exactly its
/// last two (at least 50 − 19 rows after a pass, at most 50 + 4 before the next), with their
/// summaries, and the metrics count everything deleted.
#[actix_rt::test]
async fn retention_keeps_each_targets_newest_whole_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("trajectories.db");
    let (apps, spe, episodes) = (3usize, 20u32, 8u64);
    let steps = u64::from(spe) * episodes;
    let cfg = simulated(
        apps,
        spe,
        steps,
        serde_json::json!({
            "sqlite_path": db.display().to_string(),
            "batch": 16,
            "keep_transitions": 50,
        }),
    );
    let bus = Bus::in_process(65_536);
    let (mut eps, running, shutdown) =
        crate::start_services(bus, cfg, "aware.v1.episode.*.*.*").await;
    let counter = crate::metrics_of(&running, "trajectory-recorder");
    every_episode(&mut eps, apps as u64 * episodes).await;
    shutdown.cancel();
    running.join().await.unwrap();

    let store = SqliteStore::open_path(&db).unwrap();
    let targets = store.targets().unwrap();
    assert_eq!(targets.len(), apps);
    for t in &targets {
        let rows = store.transitions(t, 0..u64::MAX).unwrap();
        let kept: Vec<(u64, u32)> = rows.iter().map(|r| (r.episode, r.step)).collect();
        let want: Vec<(u64, u32)> = (episodes - 2..episodes)
            .flat_map(|e| (0..spe).map(move |s| (e, s)))
            .collect();
        assert_eq!(kept, want, "{t}: the last two whole episodes");
        let summaries: Vec<u64> = store
            .episodes(t, 100)
            .unwrap()
            .iter()
            .map(|e| e.episode)
            .collect();
        assert_eq!(
            summaries,
            vec![episodes - 2, episodes - 1],
            "{t}: summaries"
        );
    }
    let n = apps as u64;
    assert_eq!(
        counter("aware_recorder_transitions_pruned_total"),
        Some((n * (steps - 2 * u64::from(spe))) as f64)
    );
    assert_eq!(
        counter("aware_recorder_episodes_pruned_total"),
        Some((n * (episodes - 2)) as f64)
    );
    assert_eq!(
        counter("aware_recorder_transitions_stored_total"),
        Some((n * steps) as f64)
    );
}

/// Waits for `n` episode summaries on `eps` (120 s at most).
async fn every_episode(eps: &mut aware_shared::bus::Subscription, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut seen = 0u64;
    while seen < n {
        if let Event::Episode(_) = crate::next_event(eps, deadline, || {
            format!("every episode summary within 120 s ({seen} so far)")
        })
        .await
        {
            seen += 1;
        }
    }
}

/// A registration (`target/1`) of `target` at `ts_ms`: a deregistration when `spec` is `None`.
async fn publish_registration(
    bus: &Bus,
    target: &Target,
    ts_ms: i64,
    spec: Option<aware_bus_schemas::RegisteredSpec>,
) {
    let ev: Event = aware_shared::testkit::registration(target, ts_ms, spec).into();
    let subj = subject::subject(ev.kind(), ev.target()).unwrap();
    let bytes = aware_bus_schemas::encode_event(&ev).unwrap();
    bus.publish(&subj, bytes.into()).await.unwrap();
}

/// Waits until the recorder (`recorder`) and the trainer (`trainer`) have forgotten `n` targets.
async fn wait_forgotten(
    recorder: &impl Fn(&str) -> Option<f64>,
    trainer: &impl Fn(&str) -> Option<f64>,
    n: f64,
    within: Duration,
) {
    crate::wait_for_metric(
        recorder,
        "aware_recorder_targets_forgotten_total",
        n,
        within,
    )
    .await;
    crate::wait_for_metric(trainer, "aware_trainer_targets_forgotten_total", n, within).await;
}

/// The model-store keys of `target` (checkpoints and mark).
fn model_keys(models: &dyn aware_shared::model_store::ModelStore, target: &Target) -> Vec<String> {
    models
        .keys(&format!(
            "{}/",
            aware_shared::model_store::model_prefix(target)
        ))
        .unwrap()
}

/// `trajectory_store.forget_after_secs` and `trainer.forget_after_secs`: a deleted target's trajectories
/// and checkpoints go once its deregistration was received longer ago than the grace period, and
/// only then, and the trainer stops its actor; a target created again keeps everything; the
/// marks survive a restart (the second run has no bus history at all). The grace period counts on
/// the receiver's clock: every deregistration here claims to be two hours old (a skewed or
/// forged `ts_ms`), which used to delete the data at once.
#[actix_rt::test]
async fn a_deleted_targets_data_is_forgotten_after_its_grace_period() {
    use aware_shared::model_store::{model_key, LocalDirStore, ModelStore};
    const GRACE_S: u64 = 4;
    let grace = Duration::from_secs(GRACE_S);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("trajectories.db");
    let (apps, spe, episodes) = (3usize, 10u32, 2u64);
    let recorder = serde_json::json!({
        "sqlite_path": db.display().to_string(),
        "batch": 16,
        "forget_after_secs": GRACE_S,
    });
    let mut cfg = simulated(apps, spe, u64::from(spe) * episodes, recorder);
    cfg.sections.insert(
        "model_store".into(),
        serde_json::json!({ "dir": dir.path().join("models").display().to_string() }),
    );
    cfg.sections.insert(
        "trainer".into(),
        serde_json::json!({ "forget_after_secs": GRACE_S }),
    );
    let bus = Bus::in_process(65_536);
    let (mut eps, running, shutdown) =
        crate::start_services(bus.clone(), cfg.clone(), "aware.v1.episode.*.*.*").await;
    let metric = crate::metrics_of(&running, "trajectory-recorder");
    let trainer = crate::metrics_of(&running, "meta-learner-trainer");
    every_episode(&mut eps, apps as u64 * episodes).await;
    let reader = SqliteStore::open_path(&db).unwrap();
    let targets = reader.targets().unwrap();
    assert_eq!(targets.len(), apps);
    let (gone, later, back) = (&targets[0], &targets[1], &targets[2]);
    let rows = u64::from(spe) * episodes;
    // Two checkpoints per target in the trainer's model store.
    let models = LocalDirStore::open(dir.path().join("models")).unwrap();
    for t in &targets {
        for v in [1, 2] {
            models
                .put(&model_key(t, "base_learner", v), b"ckpt")
                .unwrap();
        }
    }
    // Each target's newest `model` as the bus keeps it: the state a restarted service reads.
    let Some(Event::Model(sample_model)) = aware_bus_schemas::generated::samples()
        .into_iter()
        .find(|e| e.kind() == aware_bus_schemas::EventKind::Model)
    else {
        unreachable!()
    };
    for t in &targets {
        let ev: Event = aware_bus_schemas::Model {
            target: t.clone(),
            ..sample_model.clone()
        }
        .into();
        let subj = subject::subject(ev.kind(), ev.target()).unwrap();
        bus.publish(&subj, aware_bus_schemas::encode_event(&ev).unwrap().into())
            .await
            .unwrap();
    }
    let kept_models = || -> Vec<String> {
        bus.retained(&subject::kind_filter(aware_bus_schemas::EventKind::Model))
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|m| m.subject.to_string())
            .collect()
    };
    let model_subject =
        |t: &Target| subject::subject(aware_bus_schemas::EventKind::Model, t).unwrap();
    crate::wait_for_metric(
        &trainer,
        "aware_targets",
        apps as f64,
        Duration::from_secs(5),
    )
    .await;
    let spec = aware_shared::registry::to_registered(&cfg.spec_for(back), None);
    let old = aware_bus_schemas::now_ms() - 2 * 3_600_000;
    let received = std::time::Instant::now();
    // Deleted (so it says) two hours ago: due GRACE_S after it arrived, not at once.
    publish_registration(&bus, gone, old, None).await;
    // Deleted, then created again: kept.
    publish_registration(&bus, back, old, None).await;
    publish_registration(&bus, back, old + 1, Some(spec)).await;
    crate::wait_for_metric(
        &metric,
        "aware_recorder_deregistered_targets",
        1.0,
        Duration::from_secs(5),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        reader.count(gone).unwrap(),
        rows,
        "{gone}: not before its time"
    );
    assert_eq!(
        model_keys(&models, gone).len(),
        3,
        "{gone}: checkpoints and mark"
    );
    assert_eq!(metric("aware_recorder_targets_forgotten_total"), Some(0.0));
    wait_forgotten(&metric, &trainer, 1.0, Duration::from_secs(20)).await;
    assert!(
        received.elapsed() >= grace,
        "forgotten after {:?}",
        received.elapsed()
    );
    assert_eq!(
        metric("aware_recorder_transitions_forgotten_total"),
        Some(rows as f64)
    );
    assert_eq!(trainer("aware_trainer_models_forgotten_total"), Some(2.0));
    assert_eq!(reader.count(gone).unwrap(), 0, "{gone} forgotten");
    assert!(reader.episodes(gone, 10).unwrap().is_empty());
    assert!(model_keys(&models, gone).is_empty(), "{gone}'s checkpoints");
    let kept = kept_models();
    assert!(
        !kept.contains(&model_subject(gone)),
        "{gone}'s model state: {kept:?}"
    );
    assert!(
        kept.contains(&model_subject(back)),
        "{back}'s model state: {kept:?}"
    );
    crate::wait_for_metric(
        &trainer,
        "aware_targets",
        apps as f64 - 1.0,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(reader.count(back).unwrap(), rows, "{back} registered again");
    assert_eq!(model_keys(&models, back).len(), 2, "{back}'s checkpoints");
    // `later` is deleted just before a restart: its grace period runs on after it.
    let sent = aware_bus_schemas::now_ms();
    publish_registration(&bus, later, old, None).await;
    for m in [&metric, &trainer] {
        let gauge = if m("aware_recorder_deregistered_targets").is_some() {
            "aware_recorder_deregistered_targets"
        } else {
            "aware_trainer_deregistered_targets"
        };
        crate::wait_for_metric(m, gauge, 1.0, Duration::from_secs(5)).await;
    }
    let mark = format!(
        "{}/deregistered",
        aware_shared::model_store::model_prefix(later)
    );
    let marks = reader.deregistered().unwrap();
    assert_eq!(marks.len(), 1, "only the pending mark is stored: {marks:?}");
    assert_eq!(&marks[0].0, later);
    assert!(marks[0].1 >= sent, "marked when received, not at {old}");
    let wait_mark = std::time::Instant::now() + Duration::from_secs(5);
    while model_keys(&models, later).len() < 3 {
        assert!(std::time::Instant::now() < wait_mark, "no mark stored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let at: i64 = String::from_utf8(models.get(&mark).unwrap())
        .unwrap()
        .parse()
        .unwrap();
    assert!(at >= sent, "marked when received, not at {old}");
    assert_eq!(
        reader.count(later).unwrap(),
        rows,
        "{later} in its grace period"
    );
    shutdown.cancel();
    running.join().await.unwrap();

    // A restart: the recorder and the trainer, on a new bus that never carried a registration.
    let shutdown = CancellationToken::new();
    let entries: Vec<_> = aware_cli::SERVICES
        .iter()
        .copied()
        .filter(|e| ["trajectory-recorder", "meta-learner-trainer"].contains(&e.name))
        .collect();
    assert_eq!(entries.len(), 2);
    let running = aware_shared::launcher::start_on(
        Bus::in_process(1_024),
        Arc::new(cfg),
        &entries,
        shutdown.clone(),
    )
    .await
    .unwrap();
    let metric = crate::metrics_of(&running, "trajectory-recorder");
    let trainer = crate::metrics_of(&running, "meta-learner-trainer");
    wait_forgotten(&metric, &trainer, 1.0, Duration::from_secs(30)).await;
    let since = aware_bus_schemas::now_ms() - sent;
    assert!(
        since >= (GRACE_S * 1000) as i64,
        "{later} forgotten {since} ms after it was deleted"
    );
    assert_eq!(
        reader.count(later).unwrap(),
        0,
        "{later} forgotten after the restart"
    );
    assert!(
        model_keys(&models, later).is_empty(),
        "{later}'s checkpoints and mark"
    );
    assert!(reader.deregistered().unwrap().is_empty());
    assert_eq!(reader.targets().unwrap(), vec![back.clone()]);
    assert_eq!(reader.count(back).unwrap(), rows);
    assert_eq!(model_keys(&models, back).len(), 2);
    shutdown.cancel();
    running.join().await.unwrap();
}

/// Three recommender shards on one bus: every target's every step gets exactly one action.
#[actix_rt::test]
async fn three_recommender_shards_serve_every_target_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (apps, steps) = (9usize, 30u64);
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    let mut collector = CollectorConfig {
        source: SourceKind::Simulator,
        ..CollectorConfig::default()
    };
    cfg.learning.steps_per_episode = 10;
    collector.simulator.apps = apps;
    collector.simulator.max_steps = steps;
    cfg.set_section("collector", &collector).unwrap();
    crate::set_recorder(
        &mut cfg,
        serde_json::json!({ "sqlite_path": dir.path().join("t.db").display().to_string() }),
    );
    let bus = Bus::in_process(65_536);
    let mut actions = bus.subscribe("aware.v1.action.*.*.*").await.unwrap();
    let shutdown = CancellationToken::new();
    // The shards first, so they are subscribed before the collector publishes its first obs.
    let mut running = Vec::new();
    for i in 0..3 {
        let mut c = cfg.clone();
        c.shard = aware_shared::config::ShardConfig { index: i, count: 3 };
        running.push(
            aware_shared::launcher::start_on(
                bus.clone(),
                Arc::new(c),
                &[aware_recommender::ENTRY],
                shutdown.clone(),
            )
            .await
            .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let others: Vec<_> = aware_cli::SERVICES
        .iter()
        .copied()
        .filter(|e| e.name != aware_recommender::NAME)
        .collect();
    running.push(
        aware_shared::launcher::start_on(bus.clone(), Arc::new(cfg), &others, shutdown.clone())
            .await
            .unwrap(),
    );
    // (target, global step) → number of actions.
    let mut seen = std::collections::BTreeMap::<(Target, u64), u32>::new();
    let want = apps as u64 * (steps + 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while (seen.len() as u64) < want {
        let m = tokio::time::timeout_at(deadline, actions.next())
            .await
            .expect("every step acted on within 60 s")
            .unwrap();
        let Event::Action(a) =
            aware_bus_schemas::decode_event(aware_bus_schemas::EventKind::Action, &m.payload)
                .unwrap()
        else {
            unreachable!()
        };
        *seen
            .entry((a.target, a.episode * 10 + u64::from(a.step)))
            .or_default() += 1;
    }
    // Nothing more arrives: no shard acted on a target twice.
    if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), actions.next()).await {
        panic!("extra action on {}", m.subject);
    }
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
    let targets: std::collections::BTreeSet<_> = seen.keys().map(|(t, _)| t.clone()).collect();
    assert_eq!(targets.len(), apps);
    // Each shard owns at least one target and their metrics add up to all of them.
    // Each shard names itself and the count for the alerting rules
    // (`AwareShardsMissing` and the others).
    let mut owned = 0.0;
    for (i, r) in running[..3].iter().enumerate() {
        let (_, text) = tokio::task::spawn_blocking({
            let addr = r.http_addr;
            move || aware_tests::http_get(addr, "/metrics").unwrap()
        })
        .await
        .unwrap();
        let parsed = aware_tests::parse_metrics(&text);
        let n =
            aware_tests::metric(&parsed, "aware_targets", &[("service", "recommender")]).unwrap();
        assert!(n >= 1.0, "a shard owns no target");
        owned += n;
        let shard = i.to_string();
        assert_eq!(
            aware_tests::metric(
                &parsed,
                "aware_shards",
                &[("service", "recommender"), ("shard", shard.as_str())],
            ),
            Some(3.0),
            "shard {i}"
        );
        let shards = parsed
            .samples
            .iter()
            .filter(|s| s.metric == "aware_shards")
            .count();
        assert_eq!(shards, 1, "one series per instance");
    }
    assert_eq!(owned, apps as f64);
    shutdown.cancel();
    for r in running {
        r.join().await.unwrap();
    }
}

/// `collector.simulator.injections` on the bus: the collector alone (its lock-step clock steps
/// on the timeout, every allocation held) publishes the same offered load with and without a
/// scheduled load rise, except for the injected app from the configured global step on, where
/// it is three times as high; the rise is counted once.
#[actix_rt::test]
async fn a_scheduled_scenario_reaches_the_observations_on_the_bus() {
    let (apps, steps) = (3usize, 10u64);
    let app1 = aware_metrics_collector::simulator::build_apps(
        &aware_metrics_collector::config::SimulatorSourceConfig {
            apps,
            seed: 13,
            ..Default::default()
        },
    )
    .unwrap()[1]
        .name
        .clone();
    let spe = AppConfig::default().learning.steps_per_episode;
    let run = |injections| held_observations(apps, steps, 0, spe, injections);
    let (base, none) = run(vec![]).await;
    let (risen, one) = run(vec![aware_metrics_collector::config::SimInjection {
        target: app1.clone(),
        step: 6,
        scenario: "load_low_to_high".into(),
    }])
    .await;
    assert_eq!((none, one), (Some(0.0), Some(1.0)));
    for ((name, g), (r, _)) in &risen {
        let b = base[&(name.clone(), *g)].0;
        if *name == app1 && *g >= 6 {
            // × 3 on the expected rate; the per-step noise is drawn the same way in both runs
            assert!((r / b - 3.0).abs() < 0.3, "{name} step {g}: {r} vs {b}");
        } else {
            assert_eq!(*r, b, "{name} step {g}");
        }
    }
}

/// The collector alone (no decisions: every step holds after `step_timeout_ms` 10): each obs of
/// global steps below `steps` as (app, step) → (request rate, state), and the injection counter.
async fn held_observations(
    apps: usize,
    steps: u64,
    start_step: u64,
    steps_per_episode: u32,
    injections: Vec<aware_metrics_collector::config::SimInjection>,
) -> (
    std::collections::BTreeMap<(String, u64), (f64, Vec<f32>)>,
    Option<f64>,
) {
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    let mut collector = CollectorConfig {
        source: SourceKind::Simulator,
        ..CollectorConfig::default()
    };
    cfg.learning.steps_per_episode = steps_per_episode;
    collector.simulator.apps = apps;
    collector.simulator.seed = 13;
    collector.simulator.step_timeout_ms = 10;
    collector.simulator.max_steps = steps;
    collector.simulator.start_step = start_step;
    collector.simulator.injections = injections;
    cfg.set_section("collector", &collector).unwrap();
    let bus = Bus::in_process(65_536);
    let mut obs = bus.subscribe("aware.v1.obs.>").await.unwrap();
    let shutdown = CancellationToken::new();
    let running = aware_shared::launcher::start_on(
        bus,
        Arc::new(cfg),
        &[aware_metrics_collector::ENTRY],
        shutdown.clone(),
    )
    .await
    .unwrap();
    let mut seen = std::collections::BTreeMap::new();
    let want = apps * (steps - start_step) as usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < want {
        if let Event::Obs(o) =
            crate::next_event(&mut obs, deadline, || "the steps within 30 s".into()).await
        {
            let g = o.episode * u64::from(steps_per_episode) + u64::from(o.step);
            if g < steps {
                seen.insert(
                    (o.target.name.clone(), g),
                    (o.metrics.request_rate_rps, o.state.clone()),
                );
            }
        }
    }
    let injected = crate::metrics_of(&running, running.contexts[0].name)(
        "aware_collector_scenarios_injected_total",
    );
    shutdown.cancel();
    running.join().await.unwrap();
    (seen, injected)
}

/// `collector.simulator.start_step`: the first obs is that global step (its episode and step
/// numbered from it), and every obs from there on is exactly what a cluster held from step 0
/// publishes — including a scenario scheduled before the start, which is applied (and
/// counted) during the fast-forward.
#[actix_rt::test]
async fn a_fast_forwarded_cluster_continues_as_if_it_had_run_from_step_0() {
    let (apps, steps, start, spe) = (3usize, 12u64, 7u64, 4u32);
    let app2 = aware_metrics_collector::simulator::build_apps(
        &aware_metrics_collector::config::SimulatorSourceConfig {
            apps,
            seed: 13,
            ..Default::default()
        },
    )
    .unwrap()[2]
        .name
        .clone();
    let inj = vec![aware_metrics_collector::config::SimInjection {
        target: app2.clone(),
        step: 3,
        scenario: "load_low_to_high".into(),
    }];
    let (from_0, n0) = held_observations(apps, steps, 0, spe, inj.clone()).await;
    let (skipped, n1) = held_observations(apps, steps, start, spe, inj).await;
    assert_eq!((n0, n1), (Some(1.0), Some(1.0)));
    assert_eq!(from_0.len(), apps * steps as usize);
    // Nothing before the start step was published, and everything from it was.
    let keys: Vec<u64> = skipped.keys().map(|(_, g)| *g).collect();
    assert_eq!(keys.iter().min(), Some(&start));
    assert_eq!(skipped.len(), apps * (steps - start) as usize);
    for ((name, g), v) in &skipped {
        assert_eq!(v, &from_0[&(name.clone(), *g)], "{name} step {g}");
    }
    // The injected app runs at three times its load in both (so the scenario was applied).
    let (r0, r) = (
        from_0[&(app2.clone(), 2)].0,
        skipped[&(app2.clone(), start)].0,
    );
    assert!(r / r0 > 2.0, "{r} vs {r0}");
}

/// An SLO out of reach of the bounds, said end to end: generated apps held by their bounds to one
/// replica of 128 millicores under their load violate their SLO; the recommender's actions
/// carry `slo_unreachable` once a window of such steps is full, with what the HPA/VPA rule needs
/// beyond those bounds, while the allocation stays inside them. Targets without an SLO never
/// get it.
#[actix_rt::test]
async fn an_slo_out_of_reach_of_the_bounds_is_said_on_the_actions() {
    let (apps, steps, window) = (3usize, 60u64, 10u32);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = simulated(
        apps,
        30,
        steps,
        serde_json::json!({ "sqlite_path": dir.path().join("t.db").display().to_string() }),
    );
    let generated = aware_metrics_collector::simulator::build_apps(
        &aware_metrics_collector::config::SimulatorSourceConfig {
            apps,
            seed: 11,
            ..Default::default()
        },
    )
    .unwrap();
    let mut specs = aware_metrics_collector::simulator::target_specs(&generated);
    for (i, s) in specs.iter_mut().enumerate() {
        s.bounds.min_replicas = 1;
        s.bounds.max_replicas = 1;
        s.bounds.min_cpu_millicores = 128;
        s.bounds.max_cpu_millicores = 128;
        if i == 0 {
            // The first target has no SLO: nothing to reach.
            s.slo = aware_shared::spec::Slo::default();
        } else if s.slo.latency_p99_ms.is_none() && s.slo.throughput_rps.is_none() {
            s.slo.latency_p99_ms = Some(200.0);
        }
    }
    cfg.targets = specs.clone();
    cfg.set_section(
        "recommender",
        &serde_json::json!({ "slo_unreachable": { "window_steps": window } }),
    )
    .unwrap();
    let bus = Bus::in_process(65_536);
    let (mut all, running, shutdown) = crate::start_services(bus, cfg, subject::ALL).await;

    let mut first_said =
        std::collections::BTreeMap::<Target, (u64, aware_bus_schemas::Resources)>::new();
    let mut actions = std::collections::BTreeMap::<Target, u64>::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while actions.values().filter(|&&n| n >= steps).count() < apps {
        if let Event::Action(a) = crate::next_event(&mut all, deadline, || {
            format!("{steps} actions per target within 120 s: {actions:?}")
        })
        .await
        {
            let n = actions.entry(a.target.clone()).or_default();
            let spec = specs
                .iter()
                .find(|s| s.target() == a.target)
                .expect("a configured target");
            // A verdict exists once a window is full (at once without an SLO).
            let has_slo = spec.slo.latency_p99_ms.is_some() || spec.slo.throughput_rps.is_some();
            assert_eq!(
                a.slo_judged,
                !has_slo || *n + 1 >= u64::from(window),
                "action {n}: {a:?}"
            );
            assert_eq!(a.desired.replicas, 1, "{a:?}");
            assert_eq!(a.desired.cpu_millicores, 128, "{a:?}");
            if let Some(needed) = a.slo_unreachable {
                assert!(has_slo, "no SLO, nothing to reach: {a:?}");
                assert!(
                    needed.replicas > 1
                        || needed.cpu_millicores > 128
                        || needed.memory_bytes > spec.bounds.max_memory_bytes,
                    "the need lies beyond the bounds: {needed:?}"
                );
                first_said.entry(a.target.clone()).or_insert((*n, needed));
            }
            *n += 1;
        }
    }
    shutdown.cancel();
    running.join().await.unwrap();
    for s in &specs[1..] {
        let (at, needed) = first_said
            .get(&s.target())
            .unwrap_or_else(|| panic!("{}: never said unreachable", s.target()));
        assert!(
            *at + 1 >= u64::from(window),
            "{}: said at action {at}, before a window was full",
            s.target()
        );
        eprintln!(
            "{}: unreachable from action {at}, needs {needed:?}",
            s.target()
        );
    }
    assert!(!first_said.contains_key(&specs[0].target()));
}
