//! Defence in depth of the actuator and the collector over a real nats-server (server-side
//! permissions off: what the services themselves refuse or neutralise).
//!
//! * Forged messages: an action claiming a huge `current` does not widen the per-step limit
//!   (the actuator reads the allocation in force from the collector's `obs`); an action for
//!   episode 2^40 is refused without an `applied` and does not freeze later real actions; a
//!   registration with 10,000 replicas as its maximum cannot take the target above the
//!   actuator's `guardrails.max_replicas`.
//! * A collector killed (SIGKILL) mid-run and restarted resumes its numbering from the JetStream
//!   capture: the actuator keeps deciding (no stale rejection), and the recorder stores every
//!   step exactly once (no transition overwritten under a reused key).

use std::sync::Arc;
use std::time::{Duration, Instant};

use aware_bus_schemas::generated::samples;
use aware_bus_schemas::{
    subject, Action, Applied, Event, EventKind, Obs, Outcome, Registration, Resources, Schema,
    Target,
};
use aware_shared::bus::{Bus, Subscription};
use aware_shared::config::AppConfig;
use aware_shared::registry::to_registered;
use aware_shared::spec::TargetSpec;
use aware_shared::testkit::NatsServer;
use aware_stores::trajectory::{SqliteStore, TrajectoryStore};
use aware_tests::{scrape, wait_ready, Proc};

const MIB: u64 = 1024 * 1024;

fn target() -> Target {
    Target::new("shop", "web")
}

/// The collector's `obs` of step (`episode`, `step`) reporting `in_force`.
fn obs(episode: u64, step: u32, in_force: Resources) -> Obs {
    let Some(Event::Obs(mut o)) = samples().into_iter().find(|e| e.kind() == EventKind::Obs) else {
        unreachable!()
    };
    o.target = target();
    o.episode = episode;
    o.step = step;
    o.ts_ms = 1_000 * i64::from(step);
    o.complete = true;
    o.metrics.replicas = in_force.replicas;
    o.metrics.spec_replicas = Some(in_force.replicas);
    o.metrics.cpu_limit_cores = f64::from(in_force.cpu_millicores) / 1000.0;
    o.metrics.memory_limit_bytes = in_force.memory_bytes as f64;
    o
}

/// An action for (`episode`, `step`) claiming `current` and asking for `desired`.
fn action(episode: u64, step: u32, current: Resources, desired: Resources) -> Action {
    let Some(Event::Action(mut a)) = samples()
        .into_iter()
        .find(|e| e.kind() == EventKind::Action)
    else {
        unreachable!()
    };
    a.target = target();
    a.episode = episode;
    a.step = step;
    a.ts_ms = 1_000 * i64::from(step);
    a.slo_unreachable = None;
    a.current = current;
    a.desired = desired;
    a
}

async fn publish(bus: &Bus, ev: Event) {
    let subj = subject::subject(ev.kind(), ev.target()).unwrap();
    let bytes = aware_bus_schemas::encode_event(&ev).unwrap();
    bus.publish(&subj, bytes.into()).await.unwrap();
    bus.flush().await.unwrap();
}

/// The next `applied` of the target within `within`.
async fn next_applied(sub: &mut Subscription, within: Duration) -> Option<Applied> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let m = tokio::time::timeout_at(deadline, sub.next()).await.ok()??;
        if let Event::Applied(a) =
            aware_bus_schemas::decode_event(EventKind::Applied, &m.payload).unwrap()
        {
            return Some(a);
        }
    }
}

fn res(replicas: u32, cpu_millicores: u32, memory_mib: u64) -> Resources {
    Resources {
        replicas,
        cpu_millicores,
        memory_bytes: memory_mib * MIB,
    }
}

#[actix_rt::test]
async fn forged_actions_and_registrations_neither_freeze_nor_widen_the_actuator() {
    let server = NatsServer::start().unwrap();
    let mut cfg = AppConfig::default();
    cfg.bus.url = server.url();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.sections.insert(
        "actuator".into(),
        serde_json::json!({ "guardrails": { "max_replicas": 50 } }),
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = aware_shared::launcher::start(
        Arc::new(cfg.clone()),
        &[aware_actuator::ENTRY],
        shutdown.clone(),
    )
    .await
    .unwrap();
    crate::wait_ready(&running).await;
    let refused = crate::labelled_metrics_of(&running, aware_actuator::NAME);
    let bus = Bus::connect(&cfg.bus, "defence-test").await.unwrap();
    let mut applied = bus.subscribe("aware.v1.applied.>").await.unwrap();
    let in_force = res(2, 500, 512);

    // A forged `current` (64 cores, 256 GiB) does not widen the step limit: CPU moves at most
    // max(100m, 50 %) from the 500m the collector reports.
    publish(&bus, obs(0, 1, in_force).into()).await;
    let forged_current = res(2, 64_000, 256 * 1024);
    publish(&bus, action(0, 1, forged_current, res(2, 4000, 512)).into()).await;
    let a = next_applied(&mut applied, Duration::from_secs(5))
        .await
        .expect("a decision for step 1");
    assert_eq!(a.outcome, Outcome::Applied, "{a:?}");
    assert_eq!(a.applied.cpu_millicores, 750, "{a:?}");
    assert!(
        a.reason.as_deref().unwrap_or("").contains("from 500m"),
        "{a:?}"
    );

    // A forged episode 2^40: refused, no `applied`, and the real next step is still decided.
    publish(&bus, obs(0, 2, res(2, 750, 512)).into()).await;
    publish(&bus, action(1 << 40, 0, in_force, res(3, 750, 512)).into()).await;
    assert_eq!(
        next_applied(&mut applied, Duration::from_millis(500)).await,
        None,
        "no decision for a step the collector never reported"
    );
    crate::wait_for_metric(
        &|n| refused(n, &[("reason", "unreported")]),
        "aware_actuator_refused_actions_total",
        1.0,
        Duration::from_secs(5),
    )
    .await;
    publish(&bus, action(0, 2, in_force, res(3, 750, 512)).into()).await;
    let a = next_applied(&mut applied, Duration::from_secs(5))
        .await
        .expect("a decision for step 2");
    assert_eq!(
        (a.episode, a.step, a.outcome),
        (0, 2, Outcome::Applied),
        "{a:?}"
    );
    assert_eq!(a.applied.replicas, 3);

    // A registration widening the bounds to 10,000 replicas: the actuator's ceiling (50 here)
    // still holds, step after step.
    let mut spec = TargetSpec::new(&target());
    spec.bounds.max_replicas = 10_000;
    let reg = Registration {
        schema: Schema::new(),
        target: target(),
        episode: 0,
        step: 0,
        ts_ms: aware_bus_schemas::now_ms(),
        generation: 1,
        source: "shop/web-aware".into(),
        spec: Some(to_registered(&spec, None)),
    };
    publish(&bus, reg.into()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut now = res(3, 750, 512);
    let mut highest = 0;
    for step in 3..20 {
        publish(&bus, obs(0, step, now).into()).await;
        publish(&bus, action(0, step, now, res(10_000, 750, 512)).into()).await;
        let a = next_applied(&mut applied, Duration::from_secs(5))
            .await
            .expect("a decision");
        assert_eq!(a.step, step);
        highest = highest.max(a.applied.replicas);
        now = a.applied;
    }
    assert_eq!(highest, 50, "the ceiling, reached and never passed");

    shutdown.cancel();
    running.join().await.unwrap();
}

const APPS: usize = 4;
const SPE: u32 = 20;
const STEPS: u64 = 300;

/// The collector killed with SIGKILL a third into a lock-step run and started again: it resumes
/// after its last captured step, the actuator decides every later step (none rejected as
/// stale), and the recorder ends with exactly one transition per executed step — as many rows
/// as it stored, so none was overwritten under a reused (target, episode, step) key.
#[test]
fn a_restarted_collector_resumes_its_numbering_and_actuation_continues() {
    let server = NatsServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("defence.db");
    let config = dir.path().join("aware.toml");
    std::fs::write(
        &config,
        format!(
            "[bus]\nurl = \"{url}\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
             [lifecycle]\nt_online = 1e9\n\
             [learning]\nsteps_per_episode = {SPE}\n\
             [collector]\nsource = \"simulator\"\n\
             [collector.simulator]\napps = {APPS}\nseed = 3\nmax_steps = {STEPS}\n\
             [trajectory_store]\nsqlite_path = \"{db}\"\n",
            url = server.url(),
            db = db.display(),
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let start = |bin: &str| {
        let p = Proc::spawn(bin, &["--config", cfg], &[]);
        let addr = p.http_addr();
        wait_ready(addr);
        (p, addr)
    };
    let (_actuator, act_addr) = start("aware-actuator");
    let (_recommender, _) = start("aware-recommender");
    let (_recorder, rec_addr) = start("aware-trajectory-recorder");
    let (mut collector, col_addr) = start("aware-metrics-collector");

    let sim_steps = |addr| scrape(addr, "aware_collector_sim_steps_total", &[]).unwrap_or(0.0);
    let decisions = |outcome| {
        scrape(
            act_addr,
            "aware_actuator_decisions_total",
            &[("outcome", outcome)],
        )
        .unwrap_or(0.0)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while sim_steps(col_addr) < STEPS as f64 / 3.0 {
        assert!(Instant::now() < deadline, "the loop stalled");
        std::thread::sleep(Duration::from_millis(5));
    }
    collector.child.kill().unwrap();
    collector.child.wait().unwrap();
    let at_kill = (decisions("applied"), decisions("rejected"));
    assert!(at_kill.0 > 0.0);
    let (_collector2, col2_addr) = start("aware-metrics-collector");
    // The restarted collector starts at the step after the last one captured, far from 0 (its
    // step counter includes the steps fast-forwarded).
    let resumed_steps = sim_steps(col2_addr);
    assert!(
        resumed_steps >= STEPS as f64 / 3.0,
        "resumed at {resumed_steps}"
    );

    // The run completes: the restarted collector reaches max_steps.
    let deadline = Instant::now() + Duration::from_secs(180);
    while sim_steps(col2_addr) < STEPS as f64 {
        assert!(
            Instant::now() < deadline,
            "collector stalled at {}",
            sim_steps(col2_addr)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Decisions went on: at most the step in flight at the kill was rejected.
    let rejected = decisions("rejected") - at_kill.1;
    assert!(
        rejected <= APPS as f64,
        "{rejected} rejections after the restart"
    );
    // … and every step from the one resumed at was decided and applied.
    let applied_after = decisions("applied") - at_kill.0;
    assert!(
        applied_after >= APPS as f64 * (STEPS as f64 - resumed_steps),
        "{applied_after} decisions applied after resuming at {resumed_steps}"
    );

    // Every step stored once: as many rows as steps, and as many as the recorder stored.
    let count = || SqliteStore::open_path(&db).unwrap().count_all().unwrap();
    let want = APPS as u64 * STEPS;
    let deadline = Instant::now() + Duration::from_secs(60);
    while count() < want {
        assert!(Instant::now() < deadline, "stored {} of {want}", count());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let store = SqliteStore::open_path(&db).unwrap();
    assert_eq!(store.count_all().unwrap(), want);
    let stored = scrape(rec_addr, "aware_recorder_transitions_stored_total", &[]).unwrap();
    assert_eq!(
        stored, want as f64,
        "every stored transition has its own row: none overwritten"
    );
    assert_eq!(
        scrape(rec_addr, "aware_recorder_overwrites_refused_total", &[]),
        Some(0.0),
        "no step number was reused"
    );
    for t in store.targets().unwrap() {
        let rows = store
            .transitions(&t, 0..STEPS / u64::from(SPE) + 1)
            .unwrap();
        assert_eq!(rows.len() as u64, STEPS, "{t}");
        let mut keys: Vec<(u64, u32)> = rows.iter().map(|r| (r.episode, r.step)).collect();
        keys.dedup();
        assert_eq!(keys.len() as u64, STEPS, "{t}: one row per step");
    }
}
