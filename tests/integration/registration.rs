//! Controller registrations (`target/1`) over a real nats-server, as the recommender and the
//! actuator services (separate tasks, one process) receive them: the registered bounds, update
//! mode and the fallback's HPA target apply; after a deregistration the recommender takes no
//! decision for the target and the actuator rejects whatever still arrives, leaving the workload
//! as it is.

use std::sync::Arc;
use std::time::Duration;

use aware_bus_schemas::generated::samples;
use aware_bus_schemas::{
    subject, Action, Applied, Event, EventKind, Obs, Outcome, Registration, Resources, Schema,
    Target,
};
use aware_shared::bus::{Bus, Subscription};
use aware_shared::config::{AppConfig, BusConfig};
use aware_shared::registry::to_registered;
use aware_shared::spec::{TargetSpec, UpdateMode};
use aware_shared::testkit::NatsServer;
use tokio_util::sync::CancellationToken;

const MIB: u64 = 1024 * 1024;

fn target() -> Target {
    Target::new("shop", "web")
}

fn registration(spec: Option<&TargetSpec>, generation: u64) -> Registration {
    Registration {
        schema: Schema::new(),
        target: target(),
        episode: 0,
        step: 0,
        ts_ms: aware_bus_schemas::now_ms(),
        generation,
        source: "shop/web-aware".into(),
        spec: spec.map(|s| to_registered(s, None)),
    }
}

fn action(step: u32, replicas: u32) -> Action {
    let Some(Event::Action(mut a)) = samples()
        .into_iter()
        .find(|e| e.kind() == EventKind::Action)
    else {
        unreachable!()
    };
    a.target = target();
    a.episode = 0;
    a.step = step;
    a.ts_ms = 1_000 * i64::from(step);
    a.slo_unreachable = None;
    a.current = Resources {
        replicas: 2,
        cpu_millicores: 500,
        memory_bytes: 512 * MIB,
    };
    a.desired = Resources {
        replicas,
        ..a.current
    };
    a
}

fn obs(step: u32) -> Obs {
    let Some(Event::Obs(mut o)) = samples().into_iter().find(|e| e.kind() == EventKind::Obs) else {
        unreachable!()
    };
    o.target = target();
    o.episode = 0;
    o.step = step;
    o.ts_ms = 1_000 * i64::from(step);
    // The allocation in force the actuator reads (the actions' `current`).
    o.metrics.replicas = 2;
    o.metrics.spec_replicas = Some(2);
    o.metrics.cpu_limit_cores = 0.5;
    o.metrics.memory_limit_bytes = (512 * MIB) as f64;
    o
}

async fn publish(bus: &Bus, ev: Event) {
    let subj = subject::subject(ev.kind(), ev.target()).unwrap();
    let bytes = aware_bus_schemas::encode_event(&ev).unwrap();
    bus.publish(&subj, bytes.into()).await.unwrap();
    bus.flush().await.unwrap();
}

/// What a previous run published: shop/web is SERVING (in the JetStream capture, where a
/// starting lifecycle monitor reads it back).
async fn publish_serving_before_start(bus: &Bus, server: &NatsServer) {
    let Some(Event::Lifecycle(mut prior)) = samples()
        .into_iter()
        .find(|e| e.kind() == EventKind::Lifecycle)
    else {
        unreachable!()
    };
    prior.target = target();
    prior.stage = aware_bus_schemas::Stage::Serving;
    publish(bus, prior.into()).await;
    aware_tests::wait_captured(&server.url(), "AWARE", 1).await;
}

async fn next_applied(sub: &mut Subscription, step: u32) -> Option<Applied> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let m = tokio::time::timeout_at(deadline, sub.next()).await.ok()??;
        if let Event::Applied(a) =
            aware_bus_schemas::decode_event(EventKind::Applied, &m.payload).unwrap()
        {
            if a.step == step {
                return Some(a);
            }
        }
    }
}

/// Sends steps (an action, then the collector's `obs`: the actuator decides only for a step the
/// collector reported) until one is decided as `want` says — registrations and actions travel
/// on different subjects, so the first action may overtake the registration — and returns that
/// decision. The recommender acts on the `obs` too; its action for the step arrives later and is
/// rejected as a duplicate (an action for a step not following the last `obs`, after the test
/// went back to step 1, is refused: the next step is then decided).
async fn act_until(
    bus: &Bus,
    sub: &mut Subscription,
    step: &mut u32,
    replicas: u32,
    want: impl Fn(&Applied) -> bool,
) -> Applied {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        *step += 1;
        // The action first: the actuator holds it until the step's `obs` arrives, so it is
        // decided before the recommender's own action for that `obs`.
        publish(bus, action(*step, replicas).into()).await;
        publish(bus, obs(*step).into()).await;
        if let Some(a) = next_applied(sub, *step).await {
            if want(&a) {
                return a;
            }
        }
    }
    panic!("no decision as expected within 20 s");
}

#[actix_rt::test]
async fn registrations_steer_the_recommender_and_the_actuator_over_nats() {
    let server = NatsServer::start().unwrap();
    let mut cfg = AppConfig::default();
    cfg.bus.url = server.url();
    cfg.http.listen = "127.0.0.1:0".into();
    let (running, shutdown) =
        start_ready(&cfg, &[aware_actuator::ENTRY, aware_recommender::ENTRY]).await;
    let bus = Bus::connect(&cfg.bus, "registration-test").await.unwrap();
    let mut applied = bus.subscribe("aware.v1.applied.>").await.unwrap();
    let mut actions = bus.subscribe("aware.v1.action.>").await.unwrap();

    let mut step = 0u32;
    // Unregistered: the configured defaults (1–20 replicas) apply; 2 → 6 is within the step
    // limit (max(4 pods, 100 %)).
    let a = act_until(&bus, &mut applied, &mut step, 6, |a| {
        a.outcome == Outcome::Applied
    })
    .await;
    assert_eq!(a.applied.replicas, 6);

    // Registered with at most 3 replicas: clamped to the registered bounds.
    let mut spec = TargetSpec::new(&target());
    spec.bounds.max_replicas = 3;
    publish(&bus, registration(Some(&spec), 1).into()).await;
    let a = act_until(&bus, &mut applied, &mut step, 6, |a| {
        a.applied.replicas == 3
    })
    .await;
    assert_eq!(a.outcome, Outcome::Applied);
    assert!(a.clamped.iter().any(|c| c == "replicas"), "{a:?}");

    // Recommend-only (updateMode Off): recorded, not applied.
    spec.update_mode = UpdateMode::Off;
    publish(&bus, registration(Some(&spec), 2).into()).await;
    let a = act_until(&bus, &mut applied, &mut step, 3, |a| {
        a.outcome == Outcome::RecommendOnly
    })
    .await;
    assert_eq!(
        a.applied.replicas, 2,
        "nothing changes in recommend-only mode"
    );

    // The recommender decides for the registered target.
    publish(&bus, obs(1).into()).await;
    let m = tokio::time::timeout(Duration::from_secs(5), actions.next())
        .await
        .expect("an action for a registered target")
        .unwrap();
    assert!(m.subject.ends_with(".shop.web"));

    // Deregistered (the AwareAutoscaler was deleted): rejected, allocation left as it is.
    publish(&bus, registration(None, 2).into()).await;
    let a = act_until(&bus, &mut applied, &mut step, 3, |a| {
        a.outcome == Outcome::Rejected
    })
    .await;
    assert_eq!(a.applied, action(0, 3).current);
    assert!(
        a.reason.as_deref().unwrap_or("").contains("deregistered"),
        "{a:?}"
    );
    // … and the recommender decides nothing more for it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while tokio::time::timeout(Duration::from_millis(50), actions.next())
        .await
        .is_ok()
    {}
    for s in 2..6 {
        publish(&bus, obs(s).into()).await;
    }
    assert!(
        tokio::time::timeout(Duration::from_secs(1), actions.next())
            .await
            .is_err(),
        "an action for a deregistered target"
    );

    shutdown.cancel();
    running.join().await.unwrap();
}

/// An `obs` of `t` at step `step` (15 s apart: one HPA sync each) with 2 replicas at 50 % of
/// their 500 m CPU limits.
fn half_loaded_obs(t: &Target, step: u32) -> Obs {
    let mut o = obs(step);
    o.target = t.clone();
    o.ts_ms = 15_000 * i64::from(step);
    o.metrics.ready_replicas = 2;
    o.metrics.cpu_usage_cores = 0.5;
    o
}

/// Sends steps of `t` until the recommender's action asks for `want` replicas (a registration
/// and the steps travel on different subjects: the first steps after one may be decided
/// before it arrives).
async fn recommend_until(bus: &Bus, sub: &mut Subscription, t: &Target, step: &mut u32, want: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while tokio::time::Instant::now() < deadline {
        *step += 1;
        publish(bus, half_loaded_obs(t, *step).into()).await;
        let step_deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while let Ok(Some(m)) = tokio::time::timeout_at(step_deadline, sub.next()).await {
            let Event::Action(a) =
                aware_bus_schemas::decode_event(EventKind::Action, &m.payload).unwrap()
            else {
                continue;
            };
            if a.target != *t || a.step != *step {
                continue;
            }
            if a.desired.replicas == want {
                return;
            }
            seen.push(a.desired.replicas);
            break;
        }
    }
    panic!("{t}: no action for {want} replicas within 20 s; saw {seen:?}");
}

/// A target's own HPA target for the fallback (`[[targets]] fallback.hpa_target_cpu_utilization`,
/// and `target/1`'s `fallback_hpa_target_cpu_utilization` as the controller sends it for
/// `spec.fallback.hpa.targetCPUUtilizationPercentage`) reaches the recommender's fallback over a
/// real nats-server: at 50 % CPU on 2 replicas the configured 70 % keeps 2 replicas and a 35 %
/// target asks for 3; a registration setting it, and one without it, change the target of a
/// running fallback.
#[actix_rt::test]
async fn a_targets_hpa_target_reaches_the_recommenders_fallback_over_nats() {
    let server = NatsServer::start().unwrap();
    let mut cfg = AppConfig::default();
    cfg.bus.url = server.url();
    cfg.http.listen = "127.0.0.1:0".into();
    let tuned = Target::new("shop", "api");
    let mut configured = TargetSpec::new(&tuned);
    configured.fallback.hpa_target_cpu_utilization = Some(0.35);
    cfg.targets.push(configured.clone());
    let (running, shutdown) = start_ready(&cfg, &[aware_recommender::ENTRY]).await;
    let bus = Bus::connect(&cfg.bus, "registration-test").await.unwrap();
    let mut actions = bus.subscribe("aware.v1.action.>").await.unwrap();

    let mut step = 0u32;
    // Unregistered: the configured 70 % for shop/web, the `[[targets]]` 35 % for shop/api.
    recommend_until(&bus, &mut actions, &target(), &mut step, 2).await;
    recommend_until(&bus, &mut actions, &tuned, &mut step, 3).await;

    // The controller registers shop/web with its AwareAutoscaler's 35 %.
    let mut spec = TargetSpec::new(&target());
    spec.fallback.hpa_target_cpu_utilization = Some(0.35);
    let reg = registration(Some(&spec), 1);
    assert_eq!(
        reg.spec
            .as_ref()
            .unwrap()
            .fallback_hpa_target_cpu_utilization,
        Some(0.35)
    );
    publish(&bus, reg.into()).await;
    recommend_until(&bus, &mut actions, &target(), &mut step, 3).await;

    // shop/api registered without one: the configured 70 % again.
    let mut plain = registration(Some(&TargetSpec::new(&tuned)), 1);
    plain.target = tuned.clone();
    assert_eq!(
        plain
            .spec
            .as_ref()
            .unwrap()
            .fallback_hpa_target_cpu_utilization,
        None
    );
    publish(&bus, plain.into()).await;
    recommend_until(&bus, &mut actions, &tuned, &mut step, 2).await;

    shutdown.cancel();
    running.join().await.unwrap();
}

/// Retirement over NATS (`actors.retire_after_secs`): a deregistered target's actors in the
/// recommender, the actuator and the lifecycle monitor stop after the delay; messages of the
/// target arriving later are counted and dropped (a new actor started from the defaults would
/// act on the deleted workload again); a registration brings the target back with fresh actors.
#[actix_rt::test]
async fn deregistered_targets_are_retired_and_their_late_messages_dropped_over_nats() {
    let server = NatsServer::start().unwrap();
    let mut cfg = AppConfig::default();
    cfg.bus.url = server.url();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.actors.retire_after_secs = 1;
    let services = [
        aware_actuator::ENTRY,
        aware_recommender::ENTRY,
        aware_lifecycle_monitor::ENTRY,
    ];
    let bus = Bus::connect(&cfg.bus, "retirement-test").await.unwrap();
    // The monitor's first actor of the target resumes SERVING; one started after a retirement
    // (the object created again) starts afresh.
    publish_serving_before_start(&bus, &server).await;
    let mut lifecycle = bus.subscribe("aware.v1.lifecycle.>").await.unwrap();
    let (running, shutdown) = start_ready(&cfg, &services).await;
    let metrics: Vec<_> = services
        .iter()
        .map(|e| (e.name, crate::metrics_of(&running, e.name)))
        .collect();
    let mut applied = bus.subscribe("aware.v1.applied.>").await.unwrap();
    let mut actions = bus.subscribe("aware.v1.action.>").await.unwrap();
    let spec = TargetSpec::new(&target());

    // Registered: every service has the target's actor, the recommender and actuator act.
    publish(&bus, registration(Some(&spec), 1).into()).await;
    let mut step = 0u32;
    act_until(&bus, &mut applied, &mut step, 3, |a| {
        a.outcome == Outcome::Applied
    })
    .await;
    publish(&bus, obs(1).into()).await;
    tokio::time::timeout(Duration::from_secs(5), actions.next())
        .await
        .expect("an action for a registered target")
        .unwrap();
    let before = (aware_bus_schemas::now_ms() / 1000) as f64;
    for (name, m) in &metrics {
        assert_eq!(m("aware_targets"), Some(1.0), "{name}");
        // What `AwareRegistrationsStopped` reads.
        assert_eq!(m("aware_registered_targets"), Some(1.0), "{name}");
        let at = m("aware_registration_last_received_timestamp_seconds").unwrap();
        assert!(at > before - 60.0 && at <= before + 1.0, "{name}: {at}");
    }

    // Deregistered: a second later every actor is stopped.
    publish(&bus, registration(None, 2).into()).await;
    for (_, m) in &metrics {
        crate::wait_for_metric(
            m,
            "aware_targets_retired_total",
            1.0,
            Duration::from_secs(10),
        )
        .await;
        crate::wait_for_metric(m, "aware_targets", 0.0, Duration::from_secs(10)).await;
        assert_eq!(m("aware_registered_targets"), Some(0.0));
    }
    // The monitor's stopped actor no longer counts in its stage.
    let stages = crate::labelled_metrics_of(&running, aware_lifecycle_monitor::NAME);
    assert_eq!(
        stages("aware_lifecycle_targets", &[("stage", "serving")]),
        Some(0.0)
    );
    while tokio::time::timeout(Duration::from_millis(50), actions.next())
        .await
        .is_ok()
    {}
    // Late messages: no action, no decision, no new actor; each counted.
    let (recommender, actuator) = (&metrics[1].1, &metrics[0].1);
    for s in 2..6 {
        publish(&bus, obs(s).into()).await;
    }
    crate::wait_for_metric(
        recommender,
        "aware_retired_target_events_total",
        4.0,
        Duration::from_secs(5),
    )
    .await;
    assert!(
        tokio::time::timeout(Duration::from_secs(1), actions.next())
            .await
            .is_err(),
        "an action for a retired target"
    );
    for s in 1..4 {
        publish(&bus, action(step + s, 3).into()).await;
    }
    step += 3;
    // The actuator counts the four `obs` (it reads the collector's steps) and the three actions.
    crate::wait_for_metric(
        actuator,
        "aware_retired_target_events_total",
        7.0,
        Duration::from_secs(5),
    )
    .await;
    assert!(
        next_applied(&mut applied, step).await.is_none(),
        "a decision for a retired target"
    );
    for (name, m) in &metrics {
        assert_eq!(m("aware_targets"), Some(0.0), "{name}: no new actor");
    }

    assert!(
        tokio::time::timeout(Duration::from_millis(200), lifecycle.next())
            .await
            .is_err(),
        "the first actor resumed SERVING without announcing a stage"
    );

    // Created again: fresh actors, the recommender and the actuator act again; the monitor
    // starts the target OFFLINE (bootstrapping behind the fallback) instead of resuming SERVING.
    publish(&bus, registration(Some(&spec), 3).into()).await;
    let l = next_lifecycle(&mut lifecycle).await;
    assert_eq!(
        (l.target, l.stage),
        (target(), aware_bus_schemas::Stage::Offline)
    );
    assert_eq!(
        stages("aware_lifecycle_targets", &[("stage", "offline")]),
        Some(1.0)
    );
    act_until(&bus, &mut applied, &mut step, 3, |a| {
        a.outcome == Outcome::Applied
    })
    .await;
    publish(&bus, obs(6).into()).await;
    tokio::time::timeout(Duration::from_secs(5), actions.next())
        .await
        .expect("an action for the target registered again")
        .unwrap();
    for (name, m) in &metrics {
        assert_eq!(m("aware_targets"), Some(1.0), "{name}");
        assert_eq!(m("aware_targets_retired_total"), Some(1.0), "{name}");
    }

    shutdown.cancel();
    running.join().await.unwrap();
}

/// One step of `t` for the recorder: its obs, an action, then the next obs closing the
/// transition.
fn recorder_step(t: &Target, episode: u64, step: u32) -> [Event; 3] {
    let mut o = obs(step);
    o.target = t.clone();
    o.episode = episode;
    o.reward = Some(1.0);
    let mut a = action(step, 3);
    a.target = t.clone();
    a.episode = episode;
    let mut next = obs(step + 1);
    next.target = t.clone();
    next.episode = episode;
    next.reward = Some(1.0);
    [Event::from(o), a.into(), next.into()]
}

/// Publishes one step and waits until the recorder has stored its transition (`stored` counts
/// them).
async fn recorded(
    bus: &Bus,
    m: &impl Fn(&str) -> Option<f64>,
    stored: &mut f64,
    events: [Event; 3],
) {
    for ev in events {
        publish(bus, ev).await;
    }
    *stored += 1.0;
    crate::wait_for_metric(
        m,
        "aware_recorder_transitions_stored_total",
        *stored,
        Duration::from_secs(10),
    )
    .await;
}

/// A recorder alone on a real nats-server, storing into `db` one transition per batch, with
/// `actors.retire_after_secs` and the `[recorder]` and `[trajectory_store]` settings of `extra`.
struct RecorderRig {
    running: aware_shared::launcher::Running,
    shutdown: CancellationToken,
    /// A client of the same server, to publish the steps.
    bus: Bus,
    /// Reads the persisted resume point.
    resume: Box<dyn Fn() -> u64>,
}

async fn start_recorder(
    server: &NatsServer,
    db: &std::path::Path,
    retire_after_secs: u64,
    extra: serde_json::Value,
) -> RecorderRig {
    let mut cfg = AppConfig::default();
    cfg.bus.url = server.url();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.actors.retire_after_secs = retire_after_secs;
    let mut section = serde_json::json!({
        "sqlite_path": db.display().to_string(),
        "batch": 1,
    });
    if let (Some(s), Some(e)) = (section.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    crate::set_recorder(&mut cfg, section);
    let (running, shutdown) = start_ready(&cfg, &[aware_trajectory_recorder::ENTRY]).await;
    let bus = Bus::connect(&cfg.bus, "recorder-test").await.unwrap();
    let path = db.with_extension("db.resume");
    RecorderRig {
        running,
        shutdown,
        bus,
        resume: Box::new(move || {
            let points = aware_trajectory_recorder::service::read_resume(&path, 1).unwrap();
            points.get(&0).copied().unwrap_or(0)
        }),
    }
}

/// The recorder's retirement over NATS (JetStream replay): a deregistration releases the
/// deleted target's floor (the resume point moves past its unfinished episode) and its actor stops
/// after `actors.retire_after_secs`. A late step of the target is still recorded, by a new actor
/// that holds the resume point back only until it is retired again.
#[actix_rt::test]
async fn the_recorder_retires_a_deleted_targets_actor_and_still_records_its_late_steps() {
    let server = NatsServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("trajectories.db");
    // Forgetting off (as with QuestDB): the release does not depend on it.
    let rig = start_recorder(&server, &db, 1, serde_json::json!({"forget_after_secs": 0})).await;
    let RecorderRig {
        running,
        shutdown,
        bus,
        resume,
    } = rig;
    let m = crate::metrics_of(&running, aware_trajectory_recorder::NAME);
    let (gone, kept) = (target(), Target::new("shop", "kept"));
    let mut stored = 0.0;

    // Both targets mid-episode: the resume point is the deleted one's floor, the older.
    publish(&bus, registration(Some(&TargetSpec::new(&gone)), 1).into()).await;
    recorded(&bus, &m, &mut stored, recorder_step(&gone, 0, 0)).await;
    recorded(&bus, &m, &mut stored, recorder_step(&kept, 0, 0)).await;
    let held_by_gone = resume();
    assert!(held_by_gone > 0);

    // Deregistered: its floor no longer holds the resume point back, and its actor stops.
    publish(&bus, registration(None, 2).into()).await;
    crate::wait_for_metric(
        &m,
        "aware_targets_retired_total",
        1.0,
        Duration::from_secs(10),
    )
    .await;
    crate::wait_for_metric(&m, "aware_targets", 1.0, Duration::from_secs(10)).await;
    recorded(&bus, &m, &mut stored, recorder_step(&kept, 0, 2)).await;
    let after_release = resume();
    assert!(
        after_release > held_by_gone,
        "{after_release} vs {held_by_gone}"
    );

    // A late step of the deleted target: recorded by a new actor, which its first event started
    // (counted).
    recorded(&bus, &m, &mut stored, recorder_step(&gone, 0, 5)).await;
    assert_eq!(m("aware_retired_target_events_total"), Some(1.0));
    assert_eq!(m("aware_targets"), Some(2.0));
    // The kept target starts a new episode: its floor moves past the late actor's, which now
    // holds the resume point (the kept target's floor does not move again below).
    recorded(&bus, &m, &mut stored, recorder_step(&kept, 1, 0)).await;
    let held_by_late = resume();
    assert!(
        held_by_late > after_release,
        "{held_by_late} vs {after_release}"
    );
    // The late actor is retired in its turn and releases its floor.
    crate::wait_for_metric(
        &m,
        "aware_targets_retired_total",
        2.0,
        Duration::from_secs(10),
    )
    .await;
    crate::wait_for_metric(&m, "aware_targets", 1.0, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    recorded(&bus, &m, &mut stored, recorder_step(&kept, 1, 2)).await;
    assert!(resume() > held_by_late, "{} vs {held_by_late}", resume());
    // The kept target's open episode has held the resume point for over a second.
    let labelled = crate::labelled_metrics_of(&running, aware_trajectory_recorder::NAME);
    let held = labelled(
        "aware_recorder_resume_held_seconds",
        &[("target", "shop/kept")],
    );
    assert!(held.is_some_and(|h| (1.0..60.0).contains(&h)), "{held:?}");

    shutdown.cancel();
    running.join().await.unwrap();
    let store = aware_stores::trajectory::SqliteStore::open_path(&db).unwrap();
    use aware_stores::trajectory::TrajectoryStore as _;
    assert_eq!(store.count(&gone).unwrap(), 2, "the late step is recorded");
    assert_eq!(store.count(&kept).unwrap(), 4);
}

/// A target whose observations stop without a deregistration stops holding the recorder's
/// JetStream resume point back after `recorder.release_silent_after_secs`, while a target that
/// keeps stepping keeps its floor; when the silent one resumes, its next obs holds it again, and
/// every transition of both is stored.
#[actix_rt::test]
async fn a_silent_target_stops_holding_the_recorders_resume_point() {
    let server = NatsServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("trajectories.db");
    let rig = start_recorder(
        &server,
        &db,
        3600,
        serde_json::json!({"release_silent_after_secs": 1}),
    )
    .await;
    let RecorderRig {
        running,
        shutdown,
        bus,
        resume,
    } = rig;
    let m = crate::metrics_of(&running, aware_trajectory_recorder::NAME);
    let labelled = crate::labelled_metrics_of(&running, aware_trajectory_recorder::NAME);
    let (quiet, busy) = (Target::new("shop", "quiet"), Target::new("shop", "busy"));
    let mut stored = 0.0;

    // Both mid-episode: the quiet target's floor, the older, holds the resume point.
    recorded(&bus, &m, &mut stored, recorder_step(&quiet, 0, 0)).await;
    recorded(&bus, &m, &mut stored, recorder_step(&busy, 0, 0)).await;
    let held_by_quiet = resume();
    assert!(held_by_quiet > 0);
    assert_eq!(m("aware_recorder_silent_releases_total"), Some(0.0));

    // The busy target keeps stepping; the quiet one sends nothing. Within a few checks the quiet
    // target's floor is released and the resume point moves up to the busy one's.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut s = 2;
    while m("aware_recorder_silent_releases_total") < Some(1.0) {
        assert!(std::time::Instant::now() < deadline, "never released");
        recorded(&bus, &m, &mut stored, recorder_step(&busy, 0, s)).await;
        s += 2;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    recorded(&bus, &m, &mut stored, recorder_step(&busy, 0, s)).await;
    let held_by_busy = resume();
    assert!(
        held_by_busy > held_by_quiet,
        "{held_by_busy} vs {held_by_quiet}"
    );
    assert!(
        labelled(
            "aware_recorder_resume_held_seconds",
            &[("target", "shop/busy")]
        )
        .is_some(),
        "the busy target holds it now"
    );

    // The quiet target resumes mid-episode: that obs is its new floor. Once the busy target
    // starts its next episode (a floor past it), the quiet one holds the resume point again.
    recorded(&bus, &m, &mut stored, recorder_step(&quiet, 0, 40)).await;
    recorded(&bus, &m, &mut stored, recorder_step(&busy, 1, 0)).await;
    let held_again = resume();
    assert!(held_again > held_by_busy, "{held_again} vs {held_by_busy}");
    assert!(
        labelled(
            "aware_recorder_resume_held_seconds",
            &[("target", "shop/quiet")]
        )
        .is_some(),
        "the resumed quiet target holds it"
    );

    shutdown.cancel();
    running.join().await.unwrap();
    let store = aware_stores::trajectory::SqliteStore::open_path(&db).unwrap();
    use aware_stores::trajectory::TrajectoryStore as _;
    assert_eq!(
        store.count(&quiet).unwrap(),
        2,
        "nothing lost by the release"
    );
    assert_eq!(store.count(&busy).unwrap(), stored as u64 - 2);
}

/// The lifecycle monitor over NATS: a restarted monitor resumes a target at the stage its previous
/// run published (read back from the JetStream capture) instead of announcing OFFLINE again, and a
/// registered lifecycle profile that turns bootstrapping off takes a new target ONLINE.
#[actix_rt::test]
async fn the_lifecycle_monitor_restores_stages_and_honours_registered_profiles() {
    use aware_bus_schemas::Stage;
    let server = NatsServer::start().unwrap();
    let mut cfg = AppConfig::default();
    cfg.bus.url = server.url();
    cfg.http.listen = "127.0.0.1:0".into();
    let bus = Bus::connect(&cfg.bus, "lifecycle-restart-test")
        .await
        .unwrap();
    publish_serving_before_start(&bus, &server).await;

    let mut lifecycle = bus.subscribe("aware.v1.lifecycle.>").await.unwrap();
    let (running, shutdown) = start_ready(&cfg, &[aware_lifecycle_monitor::ENTRY]).await;

    // A target with no history is announced OFFLINE (bootstrapping) at its first obs...
    let mut fresh = obs(1);
    fresh.target = Target::new("shop", "fresh");
    publish(&bus, fresh.into()).await;
    let l = decode_lifecycle(
        tokio::time::timeout(Duration::from_secs(10), lifecycle.next())
            .await
            .expect("the new target is announced")
            .unwrap(),
    );
    assert_eq!((l.target.name.as_str(), l.stage), ("fresh", Stage::Offline));
    // ...the restored one is not: it stays SERVING.
    publish(&bus, obs(1).into()).await;
    // A registration that turns bootstrapping off takes a new, still bootstrapping target ONLINE.
    let mut spec = TargetSpec::new(&Target::new("shop", "eager"));
    spec.namespace = "shop".into();
    let mut reg = registration(None, 1);
    reg.target = Target::new("shop", "eager");
    reg.spec = Some(to_registered(
        &spec,
        Some(&aware_shared::config::LifecycleProfile {
            bootstrap: false,
            ..Default::default()
        }),
    ));
    publish(&bus, reg.into()).await;
    let mut seen = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(3), lifecycle.next()).await {
        let l = decode_lifecycle(m);
        seen.push((l.target.name.clone(), l.stage));
        if l.target.name == "eager" && l.stage == Stage::Online {
            break;
        }
    }
    assert!(
        seen.contains(&("eager".to_string(), Stage::Online)),
        "{seen:?}"
    );
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(1), lifecycle.next()).await {
        let l = decode_lifecycle(m);
        seen.push((l.target.name.clone(), l.stage));
    }
    assert!(
        seen.iter().all(|(name, _)| name != "web"),
        "the restored target was announced again: {seen:?}"
    );
    // The monitor's metrics: one target per stage, and the transitions it made (a restored
    // stage is counted, not a transition).
    let m = crate::labelled_metrics_of(&running, aware_lifecycle_monitor::NAME);
    for (stage, n) in [
        ("initialized", 0.0),
        ("offline", 1.0),
        ("online", 1.0),
        ("serving", 1.0),
    ] {
        assert_eq!(
            m("aware_lifecycle_targets", &[("stage", stage)]),
            Some(n),
            "{stage}"
        );
    }
    let moved = |from: &str, to: &str| {
        m(
            "aware_lifecycle_transitions_total",
            &[("from", from), ("to", to)],
        )
    };
    assert_eq!(
        moved("initialized", "offline"),
        Some(2.0),
        "fresh and eager"
    );
    assert_eq!(moved("offline", "online"), Some(1.0), "eager");
    assert_eq!(moved("online", "serving"), Some(0.0));
    shutdown.cancel();
    running.join().await.unwrap();
}

/// A deleted target's stage goes with it: once the lifecycle monitor retires a deregistered
/// target (`actors.retire_after_secs`) it purges the target's `lifecycle` key, so a monitor
/// restarted later does not resume a target created again under the same name at the stage of
/// the deleted one (whose model the trainer forgets); it bootstraps afresh, as it would have
/// without the restart.
#[actix_rt::test]
async fn a_retired_targets_stage_is_forgotten_so_a_recreated_target_starts_afresh_after_a_restart()
{
    use aware_bus_schemas::Stage;
    let server = NatsServer::start().unwrap();
    let mut cfg = AppConfig::default();
    cfg.bus.url = server.url();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.actors.retire_after_secs = 1;
    let bus = Bus::connect(&cfg.bus, "lifecycle-forget-test")
        .await
        .unwrap();
    publish_serving_before_start(&bus, &server).await;
    let spec = TargetSpec::new(&target());

    let (running, shutdown) = start_ready(&cfg, &[aware_lifecycle_monitor::ENTRY]).await;
    publish(&bus, registration(Some(&spec), 1).into()).await;
    publish(&bus, obs(1).into()).await;
    publish(&bus, registration(None, 2).into()).await;
    // Retired a second after the deregistration (swept every 100 ms), then the key is purged.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let m = crate::labelled_metrics_of(&running, aware_lifecycle_monitor::NAME);
    assert_eq!(m("aware_targets_retired_total", &[]), Some(1.0));
    shutdown.cancel();
    running.join().await.unwrap();

    // Created again, then the monitor restarts: it starts the target afresh (OFFLINE, announced)
    // instead of resuming the deleted target's SERVING.
    let mut lifecycle = bus.subscribe("aware.v1.lifecycle.>").await.unwrap();
    let (running, shutdown) = start_ready(&cfg, &[aware_lifecycle_monitor::ENTRY]).await;
    publish(&bus, registration(Some(&spec), 3).into()).await;
    publish(&bus, obs(2).into()).await;
    let l = next_lifecycle(&mut lifecycle).await;
    assert_eq!(
        (l.target, l.stage, l.previous),
        (target(), Stage::Offline, Some(Stage::Initialized))
    );
    shutdown.cancel();
    running.join().await.unwrap();
}

/// Re-baselining over NATS: with `[lifecycle_monitor] rebaseline_after_episodes` set, a target
/// whose ONLINE rewards settle below `t_serving` is published SERVING at the settled level, and
/// published ONLINE again when its rewards fall below that level by more than the margin.
#[actix_rt::test]
async fn the_lifecycle_monitor_re_baselines_a_settled_target_over_nats() {
    use aware_bus_schemas::{Episode, Stage};
    let server = NatsServer::start().unwrap();
    let mut cfg = AppConfig::default();
    cfg.bus.url = server.url();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.lifecycle = aware_shared::config::LifecycleProfile {
        bootstrap: false,
        t_online: 1.0,
        t_serving: 1.3,
        t_var: 0.1,
        window: 3,
    };
    cfg.sections.insert(
        "lifecycle_monitor".into(),
        serde_json::json!({ "rebaseline_after_episodes": 6, "rebaseline_margin": 0.05 }),
    );
    let bus = Bus::connect(&cfg.bus, "rebaseline-test").await.unwrap();
    let mut lifecycle = bus.subscribe("aware.v1.lifecycle.>").await.unwrap();
    let (running, shutdown) = start_ready(&cfg, &[aware_lifecycle_monitor::ENTRY]).await;
    publish(&bus, obs(1).into()).await;
    let l = next_lifecycle(&mut lifecycle).await;
    assert_eq!(l.stage, Stage::Online, "bootstrapping is off");
    let Some(Event::Episode(sample)) = samples()
        .into_iter()
        .find(|e| e.kind() == EventKind::Episode)
    else {
        unreachable!()
    };
    let episode = |n: u64, stage: Stage, mean: f64| -> Event {
        let mut e: Episode = sample.clone();
        e.target = target();
        e.episode = n;
        e.stage = stage;
        e.mean_reward = mean;
        e.total_reward = mean * f64::from(e.steps);
        e.policy_estimate = None;
        // noise-free episodes of the policy (the default `online_noise_free_only` feeds only
        // those to the decision while ONLINE)
        e.rl_steps = e.steps;
        e.fallback_steps = 0;
        e.exploring_steps = Some(0);
        e.into()
    };
    // Retraining settles at 1.1, below t_serving 1.3.
    for (n, r) in (1u64..).zip([1.1, 1.08, 1.1, 1.1, 1.12, 1.08]) {
        publish(&bus, episode(n, Stage::Online, r)).await;
    }
    let l = next_lifecycle(&mut lifecycle).await;
    assert_eq!((l.previous, l.stage), (Some(Stage::Online), Stage::Serving));
    assert!(l.reason.starts_with("re-baselined"), "{}", l.reason);
    assert!((l.reward_mean.unwrap() - 1.1).abs() < 1e-9, "{l:?}");
    // It serves at that level, then retrains below 1.1 × 0.95 = 1.045.
    for (n, r) in (7u64..).zip([1.09, 1.1, 1.07, 1.0, 1.0, 1.0]) {
        publish(&bus, episode(n, Stage::Serving, r)).await;
    }
    let l = next_lifecycle(&mut lifecycle).await;
    assert_eq!((l.previous, l.stage), (Some(Stage::Serving), Stage::Online));
    assert!(
        l.reason.contains("re-baselined level 1.045"),
        "{}",
        l.reason
    );
    assert_eq!(
        l.episode, 11,
        "the window (1.07, 1.0, 1.0) is the first below the level"
    );
    shutdown.cancel();
    running.join().await.unwrap();
}

/// The error-budget guard over NATS: a SERVING target (restored from the capture) whose RL
/// episodes earn rewards above `t_serving` but violate the SLO on 5% of their intervals stays
/// SERVING under its configured objective (90%: a 10% budget), and is published OFFLINE — the
/// fallback drives — with the reason, once a registration sets the objective to 99% (5x the
/// budget), and the budget return is counted.
#[actix_rt::test]
async fn the_lifecycle_monitor_returns_a_target_burning_its_error_budget_to_the_fallback() {
    use aware_bus_schemas::{Episode, Stage};
    let server = NatsServer::start().unwrap();
    let mut cfg = AppConfig::default();
    cfg.bus.url = server.url();
    cfg.http.listen = "127.0.0.1:0".into();
    let mut spec = TargetSpec::new(&target());
    spec.slo.latency_p99_ms = Some(200.0);
    spec.slo.objective = Some(0.9);
    cfg.targets.push(spec.clone());
    let bus = Bus::connect(&cfg.bus, "budget-test").await.unwrap();
    publish_serving_before_start(&bus, &server).await;
    let mut lifecycle = bus.subscribe("aware.v1.lifecycle.>").await.unwrap();
    let (running, shutdown) = start_ready(&cfg, &[aware_lifecycle_monitor::ENTRY]).await;
    let Some(Event::Episode(sample)) = samples()
        .into_iter()
        .find(|e| e.kind() == EventKind::Episode)
    else {
        unreachable!()
    };
    // Episodes the policy drove while SERVING: 1.625 per step (above t_serving 1.3, std 0, so
    // the rewards never retrain it), 5 of 100 intervals violating the SLO.
    let episode = |n: u64| -> Event {
        let mut e: Episode = sample.clone();
        e.target = target();
        e.episode = n;
        e.stage = Stage::Serving;
        e.steps = 100;
        e.slo_violations = 5;
        e.rl_steps = 100;
        e.fallback_steps = 0;
        e.policy_estimate = None;
        e.into()
    };
    for n in 1..=10 {
        publish(&bus, episode(n)).await;
    }
    // The registration's objective replaces the configured one. Sent once the monitor has
    // received the ten episodes (one intake, one mailbox per target: it decides on them first);
    // once it applied it, the next episode decides.
    let m = crate::labelled_metrics_of(&running, aware_lifecycle_monitor::NAME);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while m("aware_messages_in_total", &[("event", "episode")]) != Some(10.0) {
        assert!(std::time::Instant::now() < deadline, "episodes received");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut wire = to_registered(&spec, None);
    wire.slo_objective = Some(0.99);
    let mut reg = registration(None, 1);
    reg.spec = Some(wire);
    publish(&bus, reg.into()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while m("aware_registrations_total", &[("change", "registered")]) != Some(1.0) {
        assert!(std::time::Instant::now() < deadline, "registration applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    publish(&bus, episode(11)).await;
    let l = next_lifecycle(&mut lifecycle).await;
    assert_eq!(
        (l.previous, l.stage, l.episode),
        (Some(Stage::Serving), Stage::Offline, 11),
        "the first episode under the 99% objective returns it, none under 90%: {l:?}"
    );
    for part in [
        "error budget",
        "5.00x over the last 10 RL episodes",
        "allowed 1.00x",
        "objective 0.99",
        "the fallback's burn rate is unknown",
        "the fallback drives again",
    ] {
        assert!(l.reason.contains(part), "{part}: {}", l.reason);
    }
    assert!((l.reward_mean.unwrap() - 1.625).abs() < 1e-9, "{l:?}");
    assert_eq!(
        m(
            "aware_lifecycle_budget_returns_total",
            &[("from", "serving")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m(
            "aware_lifecycle_transitions_total",
            &[("from", "serving"), ("to", "offline")]
        ),
        Some(1.0)
    );
    shutdown.cancel();
    running.join().await.unwrap();
}

/// Starts `services` on `cfg` and waits until every one is ready.
async fn start_ready(
    cfg: &AppConfig,
    services: &[aware_shared::launcher::ServiceEntry],
) -> (aware_shared::launcher::Running, CancellationToken) {
    let shutdown = CancellationToken::new();
    let running = aware_shared::launcher::start(Arc::new(cfg.clone()), services, shutdown.clone())
        .await
        .unwrap();
    crate::wait_ready(&running).await;
    (running, shutdown)
}

fn decode_lifecycle(m: aware_shared::bus::Message) -> aware_bus_schemas::Lifecycle {
    match aware_bus_schemas::decode_event(EventKind::Lifecycle, &m.payload).unwrap() {
        Event::Lifecycle(l) => l,
        other => panic!("{other:?}"),
    }
}

async fn next_lifecycle(sub: &mut Subscription) -> aware_bus_schemas::Lifecycle {
    decode_lifecycle(
        tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("a lifecycle message")
            .unwrap(),
    )
}

/// Stops `server` and starts another on its port with an empty store (a server that lost its
/// JetStream storage), once `bus`, if given, has seen the first one go.
async fn restart_empty(server: NatsServer, bus: Option<&Bus>) -> (NatsServer, tempfile::TempDir) {
    let port = server.port();
    drop(server);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while bus.is_some_and(|b| b.is_connected()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the client never noticed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let store = tempfile::tempdir().unwrap();
    let server = NatsServer::start_on(port, store.path().join("js")).unwrap();
    (server, store)
}

/// The NATS server loses its JetStream storage twice. While the recorder runs, the stream is
/// declared again by the next publish and numbers its messages from 1: the recorder finds it
/// recreated, reads it from its first message and keeps recording. When it starts after such a
/// loss with a resume point past the new stream's end, it reads the new stream from its start.
/// Every step is stored.
#[actix_rt::test]
async fn the_recorder_reads_a_recreated_stream_from_its_start() {
    let server = NatsServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("trajectories.db");
    let RecorderRig {
        running,
        shutdown,
        bus,
        resume,
    } = start_recorder(&server, &db, 3600, serde_json::json!({})).await;
    let m = crate::metrics_of(&running, aware_trajectory_recorder::NAME);
    let t = target();
    // Messages the recorder does not read push the stream's sequences up.
    let pad = |bus: Bus, n: u64| async move {
        for g in 1..=n {
            publish(
                &bus,
                registration(Some(&TargetSpec::new(&target())), g).into(),
            )
            .await;
        }
    };
    pad(bus.clone(), 30).await;
    let mut stored = 0.0;
    recorded(&bus, &m, &mut stored, recorder_step(&t, 0, 0)).await;
    recorded(&bus, &m, &mut stored, recorder_step(&t, 0, 2)).await;
    let before = resume();
    assert!(before > 30, "{before}");

    let reconnected = |bus: Bus| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !bus.is_connected() {
            assert!(std::time::Instant::now() < deadline, "never reconnected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // The server restarts with an empty store.
    let (server, _store) = restart_empty(server, Some(&bus)).await;
    reconnected(bus.clone()).await;
    // Stored although the recorder's consumer stood at a sequence the new stream has not reached.
    recorded(&bus, &m, &mut stored, recorder_step(&t, 0, 4)).await;
    recorded(&bus, &m, &mut stored, recorder_step(&t, 0, 6)).await;
    assert_eq!(m("aware_recorder_stream_resets_total"), Some(1.0));
    let after = resume();
    assert!(after < before, "numbered again: {after} vs {before}");
    // A new episode after more unread messages: the resume point is its first obs.
    pad(bus.clone(), 30).await;
    recorded(&bus, &m, &mut stored, recorder_step(&t, 1, 0)).await;
    let held = resume();
    assert!(held > 30, "{held}");
    shutdown.cancel();
    running.join().await.unwrap();
    drop(bus);

    // Stopped, the storage lost again, two steps published: the resume point is past the new
    // stream's end.
    let (server, _store2) = restart_empty(server, None).await;
    let cfg = BusConfig {
        url: server.url(),
        ..BusConfig::default()
    };
    let bus = Bus::connect(&cfg, "recorder-test-publisher").await.unwrap();
    for s in [2, 4] {
        for ev in recorder_step(&t, 1, s) {
            publish(&bus, ev).await;
        }
    }
    let RecorderRig {
        running, shutdown, ..
    } = start_recorder(&server, &db, 3600, serde_json::json!({})).await;
    let m = crate::metrics_of(&running, aware_trajectory_recorder::NAME);
    crate::wait_for_metric(
        &m,
        "aware_recorder_transitions_stored_total",
        2.0,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(m("aware_recorder_stream_resets_total"), Some(1.0));
    shutdown.cancel();
    running.join().await.unwrap();
    let store = aware_stores::trajectory::SqliteStore::open_path(&db).unwrap();
    use aware_stores::trajectory::TrajectoryStore as _;
    assert_eq!(store.count(&t).unwrap(), stored as u64 + 2, "every step");
}

/// A capture stream that reached its limits while the recorder was away discarded messages the
/// recorder still needed (its resume point lies before the stream's oldest message): the replay
/// counts exactly what it lost, and reports the time span the stream holds.
#[actix_rt::test]
async fn a_replay_counts_what_the_capture_discarded_before_it_read_it() {
    let server = NatsServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("trajectories.db");
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    // The capture, kept to its newest 10 messages.
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "AWARE".into(),
        subjects: vec![subject::ALL.to_string()],
        max_messages: 10,
        ..Default::default()
    })
    .await
    .unwrap();
    let t = target();
    for step in 0..10u32 {
        for ev in recorder_step(&t, 0, step) {
            let subj = subject::subject(ev.kind(), ev.target()).unwrap();
            let bytes = aware_bus_schemas::encode_event(&ev).unwrap();
            js.publish(subj, bytes.into()).await.unwrap().await.unwrap();
        }
    }
    let info = js.get_stream("AWARE").await.unwrap().cached_info().clone();
    assert_eq!(
        (info.state.first_sequence, info.state.last_sequence),
        (21, 30)
    );
    // The recorder had stored everything before sequence 5 when it stopped.
    aware_trajectory_recorder::service::write_resume(
        &db.with_extension("db.resume"),
        1,
        &std::collections::BTreeMap::from([(0, 5)]),
    )
    .unwrap();
    let RecorderRig {
        running, shutdown, ..
    } = start_recorder(&server, &db, 3600, serde_json::json!({})).await;
    let m = crate::labelled_metrics_of(&running, aware_trajectory_recorder::NAME);
    let stream = [("stream", "AWARE")];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while m("aware_replay_messages_read_total", &stream) != Some(10.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the replay read {:?}",
            m("aware_replay_messages_read_total", &stream)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        m("aware_replay_discarded_messages_total", &stream),
        Some(16.0),
        "sequences 5 to 20 were discarded unread"
    );
    let span = m("aware_capture_span_seconds", &stream).unwrap();
    assert!(span > 0.0 && span < 60.0, "{span}");
    shutdown.cancel();
    running.join().await.unwrap();
}
