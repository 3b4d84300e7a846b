//! The actor–learner split end to end on the embedded bus: with bootstrapping disabled the
//! targets go ONLINE at once, the trainer learns from the recorded transitions and publishes
//! `model`, and the recommenders load the weights and act with them (`source: rl`).
//! [`run_rl_loop`] is the same loop on any bus and model store (see `model_store_nats.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use aware_bus_schemas::{subject, DecisionSource, Event, Model, ModelKind, Stage, Target};
use aware_metrics_collector::config::{CollectorConfig, SourceKind};
use aware_shared::bus::Bus;
use aware_shared::config::AppConfig;

#[actix_rt::test]
async fn trainer_publishes_models_and_recommenders_act_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = serde_json::json!({ "dir": dir.path().join("models").display().to_string() });
    let models = run_rl_loop(
        dir.path(),
        Bus::in_process(65_536),
        "embedded",
        store,
        "file://",
    )
    .await;
    assert!(!models.is_empty());
}

/// What the RL-loop tests share: `apps` simulated targets with 20-step episodes, bootstrapping
/// off (ONLINE at once), transitions in SQLite under `dir`, a trainer that rounds every 40
/// transitions, and `[model_store]` = `model_store`.
fn rl_loop_config(
    dir: &std::path::Path,
    bus_url: &str,
    apps: usize,
    model_store: serde_json::Value,
) -> AppConfig {
    let mut cfg = AppConfig::default();
    cfg.bus.url = bus_url.to_string();
    cfg.http.listen = "127.0.0.1:0".into();
    let mut collector = CollectorConfig {
        source: SourceKind::Simulator,
        ..CollectorConfig::default()
    };
    cfg.learning.steps_per_episode = 20;
    collector.simulator.apps = apps;
    collector.simulator.seed = 5;
    collector.simulator.max_steps = 5_000;
    cfg.set_section("collector", &collector).unwrap();
    cfg.lifecycle.bootstrap = false;
    crate::set_recorder(
        &mut cfg,
        serde_json::json!({ "sqlite_path": dir.join("t.db").display().to_string(), "batch": 16 }),
    );
    cfg.sections.insert("model_store".into(), model_store);
    cfg.sections.insert(
        "trainer".into(),
        serde_json::json!({
            "train_every_transitions": 40, "gradient_steps": 20, "batch_size": 32,
            "min_transitions": 32, "poll_ms": 50
        }),
    );
    cfg
}

/// Runs the six services on `bus` (whose URL is `bus_url`) with `[model_store]` = `model_store`
/// until every target has acted with RL weights; every `model` uri starts with `uri_prefix`.
/// Returns the `model` messages seen.
pub(crate) async fn run_rl_loop(
    dir: &std::path::Path,
    bus: Bus,
    bus_url: &str,
    model_store: serde_json::Value,
    uri_prefix: &str,
) -> Vec<Model> {
    let apps = 2usize;
    let mut cfg = rl_loop_config(dir, bus_url, apps, model_store);
    // Stay ONLINE (exploring) for the whole test: how fast rewards would reach SERVING depends on
    // when models arrive, which is timing.
    cfg.lifecycle.t_serving = 1e9;
    // Nor by re-baselining (a target ONLINE 10 episodes without improving would be served).
    cfg.sections.insert(
        "lifecycle_monitor".into(),
        serde_json::json!({ "rebaseline_after_episodes": 0 }),
    );
    let (mut all, running, shutdown) = crate::start_services(bus, cfg, subject::ALL).await;

    // Per target: the versions announced, and the RL actions seen after the first model.
    let mut models: BTreeMap<Target, Vec<u64>> = BTreeMap::new();
    let mut announced = Vec::new();
    let mut rl_actions: BTreeMap<Target, u32> = BTreeMap::new();
    let mut online = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while rl_actions.len() < apps || rl_actions.values().any(|&n| n < 5) {
        match crate::next_event(&mut all, deadline, || format!("RL actions on every target within 60 s: models {models:?}, rl actions {rl_actions:?}")).await {
            Event::Lifecycle(l) => {
                assert_eq!(l.stage, Stage::Online, "bootstrapping is disabled");
                online.insert(l.target);
            }
            Event::Model(md) => {
                assert_eq!(md.kind, ModelKind::BaseLearner);
                assert!(md.uri.starts_with(uri_prefix), "{}", md.uri);
                assert_eq!(md.sha256.len(), 64);
                assert!(md.size_bytes > 0 && md.trained_steps > 0);
                let v = models.entry(md.target.clone()).or_default();
                assert!(
                    v.last().is_none_or(|&last| md.version > last),
                    "versions increase"
                );
                v.push(md.version);
                announced.push(md);
            }
            Event::Action(a) => {
                assert!(a.desired.replicas >= 1 && a.desired.replicas <= 20);
                assert!(a.desired.cpu_millicores >= 128 && a.desired.cpu_millicores <= 2048);
                if a.source == DecisionSource::Rl {
                    let announced = models.get(&a.target).expect("a model precedes RL actions");
                    let v = a
                        .model_version
                        .expect("RL actions name their model version");
                    assert!(announced.contains(&v), "{v} not in {announced:?}");
                    assert_eq!(a.stage, Stage::Online);
                    // ONLINE explores, except in the default evaluation episodes
                    let k = aware_recommender::RecommenderConfig::default().eval_every_episodes;
                    assert_eq!(
                        a.exploration,
                        !aware_recommender::is_eval_episode(a.episode, k),
                        "ONLINE explores outside evaluation episodes: {a:?}"
                    );
                    assert_eq!(a.raw.len(), 3);
                    assert!(a.raw.iter().all(|x| (-1.0..=1.0).contains(x)));
                    assert_eq!(a.fallback_reason, None);
                    *rl_actions.entry(a.target).or_default() += 1;
                } else if a.stage == Stage::Online && !models.contains_key(&a.target) {
                    assert_eq!(a.fallback_reason.as_deref(), Some("no RL policy is loaded"));
                }
            }
            _ => {}
        }
    }
    shutdown.cancel();
    running.join().await.unwrap();
    assert_eq!(online.len(), apps);
    assert!(models.len() == apps, "{models:?}");
    announced
}

/// Evaluation episodes end to end on the embedded bus: with `recommender.eval_every_episodes` 2
/// the recommenders act without noise in every odd ONLINE episode, the recorder's `episode`
/// summaries count the exploring steps, and with `lifecycle_monitor.online_noise_free_only` the
/// monitor decides ONLINE → SERVING on a noise-free RL episode only — here at once, as any reward
/// reaches `t_serving`, so without the rule the first ONLINE episode (driven by the fallback
/// until a model arrives) would have decided.
#[actix_rt::test]
async fn evaluation_episodes_act_without_noise_and_alone_decide_serving() {
    use aware_bus_schemas::Episode;
    let dir = tempfile::tempdir().unwrap();
    let apps = 2usize;
    let store = serde_json::json!({ "dir": dir.path().join("models").display().to_string() });
    let mut cfg = rl_loop_config(dir.path(), "embedded", apps, store);
    cfg.lifecycle.t_serving = -1.0;
    cfg.lifecycle.t_var = 10.0;
    cfg.lifecycle.window = 1;
    cfg.sections.insert(
        "recommender".into(),
        serde_json::json!({ "eval_every_episodes": 2 }),
    );
    cfg.sections.insert(
        "lifecycle_monitor".into(),
        serde_json::json!({ "online_noise_free_only": true }),
    );
    let bus = Bus::in_process(65_536);
    let (mut all, running, shutdown) = crate::start_services(bus, cfg, subject::ALL).await;
    let mut served: BTreeMap<Target, u64> = BTreeMap::new();
    let mut episodes: Vec<Episode> = Vec::new();
    let mut rl_actions = [0u32; 2];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while served.len() < apps {
        match crate::next_event(&mut all, deadline, || {
            format!(
                "every target SERVING within 90 s: served {served:?}, rl actions {rl_actions:?}"
            )
        })
        .await
        {
            Event::Action(a) if a.source == DecisionSource::Rl && a.stage == Stage::Online => {
                // odd episodes evaluate, even ones explore
                assert_eq!(a.exploration, a.episode % 2 == 0, "{a:?}");
                rl_actions[usize::from(a.exploration)] += 1;
            }
            Event::Episode(e) if e.stage == Stage::Online => episodes.push(e),
            Event::Lifecycle(l) if l.stage == Stage::Serving => {
                assert_eq!(l.previous, Some(Stage::Online));
                served.insert(l.target, l.episode);
            }
            _ => {}
        }
    }
    shutdown.cancel();
    running.join().await.unwrap();
    // noise-free RL actions, which the decisions need; exploring ones too unless a model
    // arrived first in an odd episode on both targets (timing)
    assert!(rl_actions[0] > 0, "{rl_actions:?}");
    for (t, at) in &served {
        let mine: Vec<&Episode> = episodes
            .iter()
            .filter(|e| &e.target == t && e.episode <= *at)
            .collect();
        // up to the decision every RL step of an even episode explored, none of an odd one
        for e in &mine {
            let expected = if e.episode % 2 == 1 { 0 } else { e.rl_steps };
            assert_eq!(e.exploring_steps, Some(expected), "{e:?}");
        }
        // the deciding episode is the first noise-free one with RL steps: the episodes before
        // it (driven by the fallback until a model arrived, or exploring), which reached
        // t_serving too, did not decide
        assert!(*at > 0, "{t}: {mine:?}");
        let first = mine
            .iter()
            .filter(|e| e.exploring_steps == Some(0) && e.rl_steps > 0)
            .map(|e| e.episode)
            .min();
        assert_eq!(Some(*at), first, "{t}: {mine:?}");
    }
}

/// Retraining over the bus, with the test in the lifecycle monitor's place: it moves the target
/// ONLINE (from INITIALIZED: first learning), then SERVING and back ONLINE (Algorithm 1's
/// retraining trigger). The trainer's online rounds take `gradient_steps` while the target first
/// learns and `retrain_gradient_steps` once it retrains; the recommender keeps exploring (its
/// noise scale while retraining is checked in its unit tests). Then a rollback (ONLINE →
/// SERVING with `rollback_to` the version in force at the trigger, as the monitor names it):
/// the trainer republishes that checkpoint as the next version and the recommender acts with
/// it, without noise. Retention (`keep_versions` 2) deleted nothing while the target retrained.
#[actix_rt::test]
async fn retraining_after_serving_takes_the_retrain_gradient_steps() {
    use aware_bus_schemas::{Lifecycle, Schema};
    let dir = tempfile::tempdir().unwrap();
    let store = serde_json::json!({ "dir": dir.path().join("models").display().to_string() });
    let mut cfg = rl_loop_config(dir.path(), "embedded", 1, store);
    cfg.sections.insert(
        "trainer".into(),
        serde_json::json!({
            "train_every_transitions": 40, "gradient_steps": 20, "retrain_gradient_steps": 60,
            "retrain_every_transitions": 40, "batch_size": 32, "min_transitions": 32, "poll_ms": 50,
            "keep_versions": 2
        }),
    );
    // Every ONLINE action explores (no evaluation episodes).
    cfg.sections.insert(
        "recommender".into(),
        serde_json::json!({ "eval_every_episodes": 0 }),
    );
    // The simulator is not paced: on a loaded machine the rounds this test waits for come after
    // more steps than the shared configuration's 5,000, and the rollback needs steps after them
    // (0: no limit; the test ends the services).
    let mut collector = CollectorConfig::read(&cfg).unwrap();
    collector.simulator.max_steps = 0;
    cfg.set_section("collector", &collector).unwrap();
    let apps = aware_metrics_collector::simulator::build_apps(&collector.simulator).unwrap();
    let target = Target::new(apps[0].namespace.clone(), apps[0].name.clone());
    let services: Vec<aware_shared::launcher::ServiceEntry> = aware_cli::SERVICES
        .iter()
        .filter(|s| s.name != aware_lifecycle_monitor::NAME)
        .copied()
        .collect();
    assert_eq!(services.len(), 5);
    let bus = Bus::in_process(65_536);
    let mut all = bus.subscribe(subject::ALL).await.unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = aware_shared::launcher::start_on(
        bus.clone(),
        std::sync::Arc::new(cfg),
        &services,
        shutdown.clone(),
    )
    .await
    .unwrap();
    // Subscribed: the first lifecycle message reaches the trainer and the recommender.
    crate::wait_ready(&running).await;
    let publish_to = |stage: Stage, previous: Stage, rollback_to: Option<u64>| {
        let ev = Event::Lifecycle(Lifecycle {
            schema: Schema::new(),
            target: target.clone(),
            episode: 0,
            step: 0,
            ts_ms: aware_bus_schemas::now_ms(),
            stage,
            previous: Some(previous),
            reason: "set by the test".into(),
            reward_mean: None,
            reward_std: None,
            window: 0,
            rollback_to,
        });
        let (bus, subj) = (
            bus.clone(),
            subject::subject(ev.kind(), ev.target()).unwrap(),
        );
        async move {
            let bytes = aware_bus_schemas::encode_event(&ev).unwrap();
            bus.publish(&subj, bytes.into()).await.unwrap();
            bus.flush().await.unwrap();
        }
    };
    let publish = |stage: Stage, previous: Stage| publish_to(stage, previous, None);
    publish(Stage::Online, Stage::Initialized).await;
    let mut models: Vec<aware_bus_schemas::Model> = Vec::new();
    // Gradient steps of each round (differences of `trained_steps`), before and after the
    // trigger.
    let (mut first, mut retrain) = (Vec::new(), Vec::new());
    let mut trained = 0u64;
    let mut rl_actions = 0u32;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while retrain.iter().filter(|&&s| s == 60).count() < 3 {
        match crate::next_event(&mut all, deadline, || {
            format!("three retraining rounds within 120 s: first {first:?}, retrain {retrain:?}")
        })
        .await
        {
            Event::Model(m) if m.target == target => {
                let steps = m.trained_steps - trained;
                trained = m.trained_steps;
                models.push(m.clone());
                if first.len() < 2 {
                    first.push(steps);
                    if first.len() == 2 {
                        publish(Stage::Serving, Stage::Online).await;
                        publish(Stage::Online, Stage::Serving).await;
                    }
                } else {
                    retrain.push(steps);
                }
            }
            Event::Action(a) if a.source == DecisionSource::Rl && a.stage == Stage::Online => {
                assert!(a.exploration, "{a:?}");
                rl_actions += 1;
            }
            _ => {}
        }
    }
    // The rollback, to the version in force at the trigger: the last first-learning round's (a
    // round already running at the trigger publishes after it).
    let in_force = if retrain[0] == 20 { 2 } else { 1 };
    let (back, newest) = (&models[in_force], models.last().unwrap().version);
    publish_to(Stage::Serving, Stage::Online, Some(back.version)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut republished: Option<aware_bus_schemas::Model> = None;
    let mut acted_with_it = 0u32;
    while acted_with_it < 3 {
        match crate::next_event(&mut all, deadline, || {
            format!(
                "the rollback to {} republished and acted on within 60 s: {republished:?}",
                back.version
            )
        })
        .await
        {
            // A round running at the rollback may still publish first.
            Event::Model(m) if m.target == target && m.sha256 != back.sha256 => {
                assert!(republished.is_none(), "no round after the rollback: {m:?}");
            }
            Event::Model(m) if m.target == target => republished = Some(m),
            Event::Action(a)
                if a.source == DecisionSource::Rl
                    && a.stage == Stage::Serving
                    && republished
                        .as_ref()
                        .is_some_and(|m| a.model_version == Some(m.version)) =>
            {
                assert!(!a.exploration, "SERVING acts without noise: {a:?}");
                acted_with_it += 1;
            }
            _ => {}
        }
    }
    let m = republished.unwrap();
    assert!(m.version > newest, "{} after {newest}", m.version);
    assert_eq!(
        (m.trained_steps, m.size_bytes),
        (back.trained_steps, back.size_bytes),
        "the checkpoint in force at the trigger"
    );
    // The stage changes set the trainer's gauge of stored transitions (counted off the actor's
    // thread, so it may trail the last change briefly).
    let metric = crate::metrics_of(&running, "meta-learner-trainer");
    let gauge = || metric("aware_trainer_transitions_available").unwrap_or(0.0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while gauge() <= 0.0 {
        assert!(tokio::time::Instant::now() < deadline, "the gauge stays 0");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    running.join().await.unwrap();
    // Retention (keep_versions 2): nothing was deleted while the target retrained (three rounds
    // or more), or the version in force at the trigger could not have come back; after the
    // rollback only the newest two remain.
    use aware_shared::model_store::ModelStore as _;
    let kept: Vec<u64> = aware_shared::model_store::LocalDirStore::open(dir.path().join("models"))
        .unwrap()
        .keys(&format!(
            "{}/base_learner/",
            aware_shared::model_store::model_prefix(&target)
        ))
        .unwrap()
        .iter()
        .filter_map(|k| aware_shared::model_store::version_of_key(k))
        .collect();
    assert_eq!(kept, [m.version - 1, m.version], "{models:?}");
    assert_eq!(first, [20, 20], "first learning: gradient_steps");
    // A round already running at the trigger may still take 20; every later one takes 60.
    let later = if retrain[0] == 20 {
        &retrain[1..]
    } else {
        &retrain[..]
    };
    assert!(later.iter().all(|&s| s == 60), "{retrain:?}");
    assert!(rl_actions > 0);
}

/// `bench serve --bus`: the six services on the embedded bus start from the bench's converged
/// agents — adopted through the stores and the bus's retained state, never the fallback — meet
/// the same scenarios as the in-process arms, and only the arm whose registered profile lets
/// Algorithm 1 leave SERVING retrains: the trainer resumes from the adopted checkpoint (every
/// published model has more gradient steps than it) and the recorder appends to the training
/// history the bench stored.
#[test]
fn serve_on_the_bus_adopts_the_converged_agents_and_retrains_only_with_the_trigger() {
    use aware_bench::serve::{run, ServeBenchOptions};
    use aware_stores::trajectory::{SqliteStore, TrajectoryStore};

    let dir = tempfile::tempdir().unwrap();
    // Small rounds, so a debug build keeps up with the paced loop.
    let settings = vec![
        ("trainer.train_every_transitions".to_string(), 40.into()),
        ("trainer.retrain_gradient_steps".to_string(), 20.into()),
        ("trainer.gradient_steps".to_string(), 5.into()),
    ];
    let opts = ServeBenchOptions {
        apps: 2,
        seed: 1001,
        train_episodes: 8,
        serve_episodes: 12,
        steps_per_episode: 20,
        inject_every: 3,
        oracle: false,
        disturbed_reference: true,
        bus: true,
        bus_pace_ms: 20,
        bus_settings: settings,
        out: dir.path().to_path_buf(),
        ..ServeBenchOptions::default()
    };
    let r = run(&opts).unwrap();
    let bus = r.bus.as_ref().expect("the bus arms ran");
    let arm = |n: &str| bus.arms.iter().find(|a| a.arm == n).unwrap();
    let (with, without) = (arm("bus_with_retraining"), arm("bus_without_retraining"));
    // 64 transitions fill the replay, then one gradient step per transition.
    let adopted = 8 * 20 - 63;
    for a in [with, without] {
        assert_eq!((a.apps, a.episodes), (2, 24), "{}", a.arm);
        assert_eq!(a.steps, 2 * 12 * 20, "{}", a.arm);
        // The adopted agents decide every step, but for the first of an app whose model
        // snapshot is still loading when its first obs arrives (the fallback acts then).
        assert_eq!(a.rl_steps + a.fallback_steps, a.steps, "{}", a.arm);
        assert!(a.fallback_steps <= 2, "{a:?}");
        // The collector injected what the in-process arms did.
        assert_eq!(
            a.scenarios_injected as usize, r.scenarios_injected,
            "{}",
            a.arm
        );
        assert!(a.scenarios_injected > 0);
    }
    assert_eq!(
        (
            without.retrain_triggers,
            without.online_episodes,
            without.models_published
        ),
        (0, 0, 0)
    );
    // Each bus arm's final regime covers the in-process final regime's episodes and is
    // compared per step with RL converged on the changed workload.
    let f = r.final_regime.as_ref().expect("--disturbed-reference");
    for a in [with, without] {
        assert_eq!(a.final_regime_steps, f.episodes as u64 * 20, "{}", a.arm);
        let per_step = a.final_regime_reward / a.final_regime_steps as f64;
        let want = 100.0 * (per_step / f.converged_disturbed_reward - 1.0);
        let got = a.final_regime_vs_reference_pct.expect("a reference");
        assert!((got - want).abs() < 1e-9, "{}: {got} vs {want}", a.arm);
        // Per app: the same episodes as in process, against the same app's reference.
        assert_eq!(a.final_regime_per_app.len(), f.per_app.len(), "{}", a.arm);
        for (b, p) in a.final_regime_per_app.iter().zip(&f.per_app) {
            assert_eq!(b.app, p.app);
            assert_eq!(b.steps, p.episodes as u64 * 20, "{}", b.app);
            let want = 100.0 * (b.reward / p.converged_disturbed_reward - 1.0);
            let got = b.vs_reference_pct.expect("a reference");
            assert!((got - want).abs() < 1e-9, "{}: {got} vs {want}", b.app);
        }
        let reward: f64 = a
            .final_regime_per_app
            .iter()
            .map(|b| b.reward * b.steps as f64)
            .sum();
        assert!((reward - a.final_regime_reward).abs() < 1e-6, "{}", a.arm);
    }
    assert!(with.retrain_triggers >= 1, "{with:?}");
    assert!(with.online_episodes >= 1, "{with:?}");
    assert!(with.models_published >= 1, "{with:?}");
    assert!(
        with.min_trained_steps.unwrap() > adopted,
        "the trainer resumed from the adopted agent ({adopted} steps): {with:?}"
    );
    // The store holds the training history and every serve step after it.
    let store = SqliteStore::open_path(dir.path().join("bus/bus_with_retraining/t.db")).unwrap();
    let targets = store.targets().unwrap();
    assert_eq!(targets.len(), 2);
    for t in &targets {
        assert_eq!(store.transitions(t, 0..8).unwrap().len(), 8 * 20, "{t}");
        assert!(store.transitions(t, 8..20).unwrap().len() >= 12 * 20, "{t}");
    }
}

/// `bench trainer --learning` at a tiny size: ONLINE targets whose data is stored before the
/// trainer starts each get a first model, then keep learning from one transition per 400 ms.
/// A round the time trigger (1 s) brings with a few new transitions makes a few gradient steps,
/// not a full round's 200 (ADR 0023).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_trainer_learning_makes_rounds_in_proportion_to_new_transitions() {
    let opts = aware_bench::trainer::TrainerBenchOptions {
        targets: 12,
        seconds: 6,
        runs: 1,
        out: std::path::PathBuf::from("unused"),
        learning: true,
        interval_ms: 400,
        train_every_ms: Some(1_000),
        recheck_ms: Some(500),
        // 4 of the 12 networks kept between rounds: the others are read back each round.
        held_networks: Some(4),
        bin_dir: aware_tests::bin_path("aware-meta-learner-trainer")
            .parent()
            .map(std::path::Path::to_path_buf),
    };
    let r = aware_bench::trainer::run_learning(&opts).await.unwrap();
    let run = &r.runs[0];
    assert_eq!(run.targets_learning, 12, "{run:?}");
    assert!(run.first_model_after_s_max < 60.0, "{run:?}");
    // The joiner's data came during the window, announced by an `episode`: its first model
    // follows within the window, not at the next recheck of the store.
    assert_eq!((run.joiners, run.joiners_with_a_model), (1, 1), "{run:?}");
    assert!(run.rounds_per_s > 0.0 && run.cores > 0.0, "{run:?}");
    assert_eq!(r.held_networks, 4);
    // 8 targets beyond the 4 kept: their rounds read their networks back, and they learn.
    assert!(run.network_reloads_per_s > 0.0, "{run:?}");
    // About 2–4 new transitions per round: steps in proportion, far below a full round's 200.
    let steps_per_round = run.gradient_steps_per_s / run.rounds_per_s;
    assert!(
        (1.0..=20.0).contains(&steps_per_round),
        "{steps_per_round} gradient steps per round: {run:?}"
    );
}
