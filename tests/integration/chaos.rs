//! Chaos (issue [hardening]): the six services as processes on a real nats-server, driving 50
//! simulated apps on wall-clock steps, while every service and the NATS server itself (its
//! JetStream storage kept) are killed with SIGKILL once each, in an order drawn from a seed, and
//! started again. Judged afterwards from the JetStream capture (what was really published, in
//! order) against the recorder's store:
//! - no transition lost: every step whose `obs`, `action` (before the next `obs`) and next `obs`
//!   were published is stored;
//! - none overwritten: no step key was published twice with different observations, and every
//!   stored transition carries the action captured for its step;
//! - control continues: at least 99% of the complete observations got a decision that the
//!   actuator carried out (not rejected);
//! - no stage or model lost: one fresh stage announcement per target (a restarted lifecycle
//!   monitor resumes at the stage it published), model versions only grow (a restarted trainer
//!   resumes its numbering).
//!
//! `AWARE_CHAOS_LOGS=DIR` keeps the last process of every service's log there.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use aware_bus_schemas::{Event, ModelKind, Outcome, Resources, Stage, Target};
use aware_stores::trajectory::{SqliteStore, TrajectoryStore};
use aware_tests::{scrape, wait_ready, NatsServer, Proc};

const APPS: usize = 50;
const SPE: u32 = 20;
/// Wall-clock seconds per control step.
const STEP_SECONDS: f64 = 0.5;
/// Seed of the kill order.
const SEED: u64 = 35;
/// Between two kills.
const KILL_EVERY: Duration = Duration::from_secs(75);
/// How long a killed process stays down before it is started again.
const DOWN: Duration = Duration::from_millis(100);

const SERVICES: [&str; 6] = [
    "aware-metrics-collector",
    "aware-recommender",
    "aware-actuator",
    "aware-trajectory-recorder",
    "aware-meta-learner-trainer",
    "aware-lifecycle-monitor",
];
const NATS: &str = "nats-server";

/// The kill order: the six services and the NATS server, shuffled by `seed` (SplitMix64 and
/// Fisher–Yates, so the order is the same on every machine).
fn kill_order(seed: u64) -> Vec<&'static str> {
    let mut all: Vec<&str> = SERVICES.iter().copied().chain([NATS]).collect();
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    for i in (1..all.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        all.swap(i, j);
    }
    all
}

type Key = (u64, u32);

/// What the capture holds for one target.
#[derive(Default)]
struct Captured {
    /// Stream sequence and state of every `obs` (complete or not) by step.
    obs: BTreeMap<Key, (u64, bool, Vec<f32>)>,
    /// Steps published twice with different observations.
    conflicting: u64,
    /// Stream sequence and desired allocation of the first `action` of every step.
    actions: BTreeMap<Key, (u64, Resources)>,
    /// Steps whose decision the actuator carried out (`applied` not rejected).
    carried_out: BTreeSet<Key>,
    /// `lifecycle` messages announcing a fresh start (no previous stage, or INITIALIZED): one
    /// per target, or a restarted monitor lost the stage it had published.
    fresh_starts: u64,
    /// `model` versions published in an order that went back (a restarted trainer starting its
    /// numbering again).
    model_regressions: u64,
    last_model: Option<u64>,
}

/// Reads the whole capture stream, in order.
async fn read_capture(url: &str) -> BTreeMap<Target, Captured> {
    let mut out: BTreeMap<Target, Captured> = BTreeMap::new();
    for (seq, ev) in aware_tests::capture(url).await {
        let c = out.entry(ev.target().clone()).or_default();
        match ev {
            Event::Obs(o) => {
                let key = (o.episode, o.step);
                match c.obs.get(&key) {
                    Some((_, _, state)) if *state != o.state => c.conflicting += 1,
                    Some(_) => {}
                    None => {
                        c.obs.insert(key, (seq, o.complete, o.state));
                    }
                }
            }
            Event::Action(a) => {
                c.actions
                    .entry((a.episode, a.step))
                    .or_insert((seq, a.desired));
            }
            Event::Applied(a) if a.outcome != Outcome::Rejected => {
                c.carried_out.insert((a.episode, a.step));
            }
            Event::Lifecycle(l) if matches!(l.previous, None | Some(Stage::Initialized)) => {
                c.fresh_starts += 1;
            }
            Event::Model(m) if m.kind == ModelKind::BaseLearner => {
                if c.last_model.is_some_and(|v| m.version <= v) {
                    c.model_regressions += 1;
                }
                c.last_model = Some(m.version);
            }
            _ => {}
        }
    }
    out
}

/// The step after `k` within the run (the next step of the episode, or the first of the next).
fn successor(k: Key) -> Key {
    if k.1 + 1 >= SPE {
        (k.0 + 1, 0)
    } else {
        (k.0, k.1 + 1)
    }
}

/// About ten minutes: each kill costs a second or two of control, so the run is long enough for
/// 99% to be a fair bar. Run alone (its timing would disturb the other tests and theirs it) by
/// the README's test command: `cargo test -p aware-tests --test integration chaos -- --ignored`.
#[test]
#[ignore = "ten minutes; tests/run.sh runs it on its own after the suite"]
fn every_service_and_nats_killed_once_lose_no_transition_and_control_continues() {
    let store_dir = tempfile::tempdir().unwrap();
    let mut server = Some(NatsServer::start_with_store(store_dir.path().to_path_buf()).unwrap());
    let port = server.as_ref().unwrap().port();
    let url = server.as_ref().unwrap().url();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("chaos.db");
    let config = dir.path().join("aware.toml");
    std::fs::write(
        &config,
        format!(
            "[bus]\nurl = \"{url}\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
             [learning]\nsteps_per_episode = {SPE}\n\
             [collector]\nsource = \"simulator\"\n\
             [collector.simulator]\napps = {APPS}\nseed = 7\nclock = \"wallclock\"\n\
             step_seconds = {STEP_SECONDS:?}\n\
             [trajectory_store]\nsqlite_path = \"{db}\"\n\
             [model_store]\ndir = \"{models}\"\n",
            db = db.display(),
            models = dir.path().join("models").display(),
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap().to_string();
    let start = |bin: &str| {
        let p = Proc::spawn(bin, &["--config", &cfg], &[]);
        let addr = p.http_addr();
        wait_ready(addr);
        (p, addr)
    };
    let mut procs: BTreeMap<&str, (Proc, std::net::SocketAddr)> = BTreeMap::new();
    // Consumers first, the collector last.
    for bin in SERVICES.iter().rev() {
        procs.insert(bin, start(bin));
    }
    let sim_steps = |procs: &BTreeMap<&str, (Proc, std::net::SocketAddr)>| {
        scrape(
            procs["aware-metrics-collector"].1,
            "aware_collector_sim_steps_total",
            &[],
        )
        .unwrap_or(0.0)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while sim_steps(&procs) < 10.0 {
        assert!(Instant::now() < deadline, "the loop never started");
        std::thread::sleep(Duration::from_millis(50));
    }

    let order = kill_order(SEED);
    eprintln!("chaos: kill order {order:?}");
    for victim in &order {
        std::thread::sleep(KILL_EVERY);
        if *victim == NATS {
            drop(server.take());
            std::thread::sleep(DOWN);
            server = Some(NatsServer::start_on(port, store_dir.path().to_path_buf()).unwrap());
        } else {
            let (mut p, _) = procs.remove(victim).unwrap();
            p.child.kill().unwrap();
            p.child.wait().unwrap();
            std::thread::sleep(DOWN);
            procs.insert(victim, start(victim));
        }
        eprintln!("chaos: killed and restarted {victim}");
    }
    std::thread::sleep(KILL_EVERY);
    // Stop the collector first so the last steps settle, then the rest.
    let (mut collector, _) = procs.remove("aware-metrics-collector").unwrap();
    assert!(collector.terminate(Duration::from_secs(15)).is_some());
    // The recorder may still be reading the capture (its consumer is recreated some seconds
    // after the server's restart): wait until its store stops growing before stopping it.
    let count = || {
        SqliteStore::open_path(&db)
            .and_then(|s| s.count_all())
            .unwrap_or(0)
    };
    let (mut last, mut since) = (count(), Instant::now());
    let deadline = Instant::now() + Duration::from_secs(120);
    while since.elapsed() < Duration::from_secs(15) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let now = count();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }

    for (name, (mut p, _)) in procs {
        let status = p.terminate(Duration::from_secs(20));
        if let Ok(d) = std::env::var("AWARE_CHAOS_LOGS") {
            let _ = std::fs::write(format!("{d}/{name}.log"), p.stderr());
        }
        assert!(
            status.is_some_and(|s| s.success()),
            "{name} did not stop cleanly: {status:?}\n{}",
            p.stderr()
        );
    }

    let captured = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(read_capture(&url));
    let store = SqliteStore::open_path(&db).unwrap();
    let (mut complete, mut decided, mut expected, mut lost, mut wrong, mut conflicting) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut lost_examples = Vec::new();
    let (mut fresh_starts, mut model_regressions, mut models) = (0u64, 0u64, 0u64);
    // Undecided observations per ten global steps (every target), to see which outage cost what.
    let mut undecided: BTreeMap<u64, u64> = BTreeMap::new();
    let mut lost_per: BTreeMap<u64, u64> = BTreeMap::new();
    for (target, c) in &captured {
        conflicting += c.conflicting;
        fresh_starts += c.fresh_starts;
        model_regressions += c.model_regressions;
        models += u64::from(c.last_model.is_some());
        let stored: BTreeMap<Key, Resources> = store
            .transitions(target, 0..u64::MAX)
            .unwrap()
            .into_iter()
            .map(|t| ((t.episode, t.step), t.desired))
            .collect();
        for (key, (seq, is_complete, _)) in &c.obs {
            if !is_complete {
                continue;
            }
            complete += 1;
            let bucket = (key.0 * u64::from(SPE) + u64::from(key.1)) / 10;
            if c.carried_out.contains(key) {
                decided += 1;
            } else {
                *undecided.entry(bucket).or_default() += 1;
            }
            let Some((aseq, desired)) = c.actions.get(key) else {
                continue;
            };
            let Some((next_seq, _, _)) = c.obs.get(&successor(*key)) else {
                continue;
            };
            if aseq > next_seq || aseq < seq {
                continue;
            }
            expected += 1;
            match stored.get(key) {
                None => {
                    lost += 1;
                    *lost_per
                        .entry((key.0 * u64::from(SPE) + u64::from(key.1)) / 10)
                        .or_default() += 1;
                    if lost_examples.len() < 5 {
                        lost_examples.push(format!("{target} {key:?}"));
                    }
                }
                Some(d) if d != desired => wrong += 1,
                Some(_) => {}
            }
        }
    }
    let fraction = decided as f64 / complete.max(1) as f64;
    eprintln!("chaos: undecided per ten steps {undecided:?}; lost per ten steps {lost_per:?}");
    eprintln!(
        "chaos: {} targets, {complete} complete observations, {decided} decided ({:.2}%), \
         {expected} transitions expected, {lost} lost, {wrong} stored with another action, \
         {conflicting} steps published twice with different observations",
        captured.len(),
        100.0 * fraction
    );
    eprintln!(
        "chaos: {fresh_starts} fresh stage announcements, {models} targets with models, \
         {model_regressions} model versions published out of order"
    );
    assert_eq!(captured.len(), APPS, "every app observed");
    assert_eq!(
        fresh_starts, APPS as u64,
        "one fresh start per target: a restart lost a stage"
    );
    assert_eq!(model_regressions, 0, "a restart lost the model versions");
    assert!(complete > 0);
    assert_eq!(lost, 0, "transitions lost, e.g. {lost_examples:?}");
    assert_eq!(wrong, 0, "transitions stored with another step's action");
    assert_eq!(
        conflicting, 0,
        "steps published twice with different observations"
    );
    assert!(
        fraction >= 0.99,
        "{decided} of {complete} observations decided ({:.2}%)",
        100.0 * fraction
    );
}
