//! The six services as separate processes on a real nats-server, driving a simulated cluster of
//! 10 apps for 20 episodes on the fallback. The recorder is killed (SIGKILL) mid-run and
//! restarted: every executed step is still stored exactly once, and the run's SLO violations and
//! utilization match the same run in-process on the embedded bus.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aware_metrics_collector::config::{CollectorConfig, SourceKind};
use aware_shared::bus::Bus;
use aware_shared::config::AppConfig;
use aware_stores::trajectory::{SqliteStore, TrajectoryStore};
use aware_tests::{scrape, wait_ready, NatsServer, Proc};

const APPS: usize = 10;
const SPE: u32 = 50;
const EPISODES: u64 = 20;
const SEED: u64 = 5;
/// `lifecycle.t_online` of both runs: no agent is promoted, the fallback drives throughout (a
/// promotion's timing depends on the trainer's speed, which would make the runs differ).
const NEVER: f64 = 1e9;
/// `collector.simulator.step_timeout_ms` of both runs: lock-step never gives up on a target, so
/// neither run depends on how loaded the machine is (the in-process run shares the test
/// process with the other tests; a step that times out leaves a target's allocation unchanged,
/// and the runs would differ).
const STEP_TIMEOUT_MS: u64 = 60_000;

fn steps() -> u64 {
    u64::from(SPE) * EPISODES
}

/// Per target: (SLO violations, mean CPU utilization, mean memory utilization) of the stored run.
fn outcome(db: &std::path::Path) -> BTreeMap<String, (u64, f64, f64)> {
    let store = SqliteStore::open_path(db).unwrap();
    store
        .targets()
        .unwrap()
        .into_iter()
        .map(|t| {
            let rows = store.transitions(&t, 0..EPISODES).unwrap();
            let n = rows.len() as f64;
            let viol = rows.iter().filter(|r| r.slo_violation).count() as u64;
            let cpu = rows.iter().map(|r| r.cpu_util).sum::<f64>() / n;
            let mem = rows.iter().map(|r| r.memory_util).sum::<f64>() / n;
            (t.key(), (viol, cpu, mem))
        })
        .collect()
}

fn in_process_run(db: &std::path::Path) {
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    let mut collector = CollectorConfig {
        source: SourceKind::Simulator,
        ..CollectorConfig::default()
    };
    cfg.learning.steps_per_episode = SPE;
    collector.simulator.apps = APPS;
    collector.simulator.seed = SEED;
    collector.simulator.max_steps = steps();
    collector.simulator.step_timeout_ms = STEP_TIMEOUT_MS;
    cfg.set_section("collector", &collector).unwrap();
    cfg.lifecycle.t_online = NEVER;
    crate::set_recorder(
        &mut cfg,
        serde_json::json!({ "sqlite_path": db.display().to_string() }),
    );
    // Its own model store: a trainer resumes from the checkpoints it finds.
    let models = db.with_extension("models");
    cfg.sections.insert(
        "model_store".into(),
        serde_json::json!({ "dir": models.display().to_string() }),
    );
    let system = actix_rt::System::new();
    system.block_on(async move {
        let bus = Bus::in_process(65_536);
        let (mut eps, running, shutdown) =
            crate::start_services(bus, cfg, "aware.v1.episode.*.*.*").await;
        for _ in 0..APPS as u64 * EPISODES {
            tokio::time::timeout(Duration::from_secs(120), eps.next())
                .await
                .unwrap()
                .unwrap();
        }
        shutdown.cancel();
        running.join().await.unwrap();
    });
}

#[test]
fn six_processes_over_nats_lose_nothing_when_the_recorder_restarts() {
    let server = NatsServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nats.db");
    let config = dir.path().join("aware.toml");
    std::fs::write(
        &config,
        format!(
            "[bus]\nurl = \"{url}\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
             [lifecycle]\nt_online = {NEVER:.1}\n\
             [learning]\nsteps_per_episode = {SPE}\n\
             [collector]\nsource = \"simulator\"\n\
             [collector.simulator]\napps = {APPS}\nseed = {SEED}\nmax_steps = {steps}\n\
             step_timeout_ms = {STEP_TIMEOUT_MS}\n\
             [trajectory_store]\nsqlite_path = \"{db}\"\n\
             [model_store]\ndir = \"{models}\"\n",
            url = server.url(),
            steps = steps(),
            db = db.display(),
            models = dir.path().join("nats-models").display(),
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
    let mut procs = Vec::new();
    for bin in [
        "aware-lifecycle-monitor",
        "aware-meta-learner-trainer",
        "aware-actuator",
        "aware-recommender",
    ] {
        procs.push(start(bin));
    }
    let (mut recorder, rec_addr) = start("aware-trajectory-recorder");
    let (collector, col_addr) = start("aware-metrics-collector");

    // Kill the recorder a third into the run, once it has stored something, while the loop goes
    // on without it.
    let stored = |addr| scrape(addr, "aware_recorder_transitions_stored_total", &[]).unwrap_or(0.0);
    let sim_steps = |addr| scrape(addr, "aware_collector_sim_steps_total", &[]).unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while sim_steps(col_addr) < steps() as f64 / 3.0 || stored(rec_addr) == 0.0 {
        assert!(Instant::now() < deadline, "the loop stalled");
        std::thread::sleep(Duration::from_millis(5));
    }
    let at_kill = sim_steps(col_addr);
    recorder.child.kill().unwrap();
    recorder.child.wait().unwrap();
    assert!(at_kill < steps() as f64, "the run was over before the kill");
    std::thread::sleep(Duration::from_millis(300));
    let (recorder2, rec2_addr) = start("aware-trajectory-recorder");

    // The run completes and the restarted recorder catches up.
    let deadline = Instant::now() + Duration::from_secs(240);
    while sim_steps(col_addr) < steps() as f64 {
        assert!(
            Instant::now() < deadline,
            "collector stalled at {}",
            sim_steps(col_addr)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        scrape(col_addr, "aware_collector_late_targets_total", &[]),
        Some(0.0),
        "lock-step never timed out, so the run is deterministic"
    );
    let count = || SqliteStore::open_path(&db).unwrap().count_all().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while count() < APPS as u64 * steps() {
        assert!(
            Instant::now() < deadline,
            "stored {} of {}",
            count(),
            APPS as u64 * steps()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A batch's episode summaries are stored right after its transitions: wait for them too.
    let episodes_stored = || {
        let store = SqliteStore::open_path(&db).unwrap();
        store
            .targets()
            .unwrap()
            .iter()
            .map(|t| store.episodes(t, 100).unwrap().len() as u64)
            .sum::<u64>()
    };
    while episodes_stored() < APPS as u64 * EPISODES {
        assert!(
            Instant::now() < deadline,
            "episodes stored {}",
            episodes_stored()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let store = SqliteStore::open_path(&db).unwrap();
    assert_eq!(
        store.count_all().unwrap(),
        APPS as u64 * steps(),
        "transitions stored == steps executed"
    );
    for t in store.targets().unwrap() {
        assert_eq!(store.count(&t).unwrap(), steps());
        assert_eq!(
            store.episodes(&t, 100).unwrap().len() as u64,
            EPISODES,
            "{t}"
        );
    }
    // Episodes were published once each, also across the restart.
    // Every episode reached the lifecycle monitor (at least once: a summary published just before
    // the kill may be published again by the replay).
    let lm = procs[0].1;
    let episodes_in = || {
        scrape(
            lm,
            "aware_messages_in_total",
            &[("service", "lifecycle-monitor"), ("event", "episode")],
        )
        .unwrap_or(0.0)
    };
    let want = (APPS as u64 * EPISODES) as f64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while episodes_in() < want {
        assert!(
            Instant::now() < deadline,
            "episodes delivered {} of {want}",
            episodes_in()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        episodes_in() <= want + APPS as f64,
        "at most one repeat per target"
    );
    let _ = rec2_addr;

    // The same run in-process on the embedded bus.
    let local = dir.path().join("local.db");
    in_process_run(&local);
    let (a, b) = (outcome(&db), outcome(&local));
    assert_eq!(a.len(), APPS);
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let (va, vb): (u64, u64) = (a.values().map(|x| x.0).sum(), b.values().map(|x| x.0).sum());
    let within = |x: f64, y: f64| (x - y).abs() <= 0.05 * y.abs().max(1e-9);
    assert!(
        within(va as f64, vb as f64),
        "SLO violations over NATS {va} vs in-process {vb}"
    );
    for (k, (_, cpu, mem)) in &a {
        let (_, cpu2, mem2) = b[k];
        assert!(within(*cpu, cpu2), "{k}: cpu util {cpu} vs {cpu2}");
        assert!(within(*mem, mem2), "{k}: memory util {mem} vs {mem2}");
    }

    for (mut p, _) in procs
        .into_iter()
        .chain([(collector, col_addr), (recorder2, rec2_addr)])
    {
        let status = p.terminate(Duration::from_secs(15)).unwrap_or_else(|| {
            let err = p.stderr();
            let tail: Vec<&str> = err.lines().rev().take(20).collect();
            panic!(
                "a service did not exit within 15 s of SIGTERM; its last log lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        });
        assert!(status.success(), "{status:?}\n{}", p.stderr());
    }
}
