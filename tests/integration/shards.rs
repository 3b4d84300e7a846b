//! Every per-target service sharded by the slot its subjects carry (ADR 0021), as separate
//! processes on a real nats-server, resharded from 2 to 3 mid-run: each instance receives only
//! its own shard's messages (the server filters by slot, nothing is decoded and thrown away),
//! every observation is decided at most once and, with both shard counts, exactly once, every
//! target keeps its stage, and every decided step is stored. The capture is in 6 partitions
//! (ADR 0024; not a power of two): each recorder shard replays only the partitions holding its
//! slots, three of them with 2 shards and two with 3.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use aware_bus_schemas::Stage;
use aware_shared::config::{JetStreamConfig, ShardConfig};
use aware_stores::trajectory::{SqliteStore, TrajectoryStore};
use aware_tests::{scrape, wait_ready, NatsServer, Proc, SHARDED};

const APPS: usize = 8;
const SPE: u32 = 10;
/// Steps run under 2 shards before the reshard, and at least as many after the 3 shards are
/// ready. The run has no fixed length (the collector is stopped once both sides have run): a slow
/// start-up of the 3 shards (every test's processes share the machine) adds steps that no shard
/// decides, never fewer decided after it.
const STEPS_EACH_SIDE: u64 = 50;
/// The collector gives up on a step's missing `applied` after this long: while no shard runs
/// (the reshard), it moves on instead of waiting for the new instances.
const STEP_TIMEOUT_MS: u64 = 1_500;
/// The services that consume `obs`, and their names in the metrics.
const OBS_CONSUMERS: [(&str, &str); 3] = [
    ("aware-recommender", "recommender"),
    ("aware-actuator", "actuator"),
    ("aware-lifecycle-monitor", "lifecycle-monitor"),
];

/// The capture's partitions in this test (`bus.jetstream.partitions`): 2 shards read three
/// each, 3 shards two each.
const PARTITIONS: u32 = 6;

fn capture_config() -> JetStreamConfig {
    JetStreamConfig {
        partitions: PARTITIONS,
        ..Default::default()
    }
}

/// The last sequence of each partition's stream.
async fn last_sequences(url: &str) -> Vec<u64> {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let mut out = Vec::new();
    for name in capture_config().capture_streams() {
        let mut stream = js.get_stream(&name).await.unwrap();
        out.push(stream.info().await.unwrap().state.last_sequence);
    }
    out
}

/// The streams whose replay the recorder at `addr` reads.
fn replayed_streams(addr: std::net::SocketAddr) -> Vec<String> {
    capture_config()
        .capture_streams()
        .into_iter()
        .filter(|s| {
            scrape(
                addr,
                "aware_replay_messages_read_total",
                &[("service", "trajectory-recorder"), ("stream", s)],
            )
            .is_some()
        })
        .collect()
}

/// One shard of every per-target service: (binary, process, HTTP address).
fn start_shard(cfg: &str, shard: ShardConfig) -> Vec<(&'static str, Proc, std::net::SocketAddr)> {
    let flag = format!("{}/{}", shard.index, shard.count);
    let procs: Vec<_> = SHARDED
        .iter()
        .map(|&bin| {
            let p = Proc::spawn(bin, &["--config", cfg, "--shard", &flag], &[]);
            let addr = p.http_addr();
            (bin, p, addr)
        })
        .collect();
    for (_, _, addr) in &procs {
        wait_ready(*addr);
    }
    procs
}

#[test]
fn every_service_sharded_by_slot_takes_only_its_targets_and_a_reshard_loses_nothing() {
    let server = NatsServer::start().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let config = dir.path().join("aware.toml");
    std::fs::write(
        &config,
        format!(
            "[bus]\nurl = \"{url}\"\n[bus.jetstream]\npartitions = {PARTITIONS}\n\
             [http]\nlisten = \"127.0.0.1:0\"\n\
             [lifecycle]\nt_online = 1e9\n\
             [learning]\nsteps_per_episode = {SPE}\n\
             [collector]\nsource = \"simulator\"\n\
             [collector.simulator]\napps = {APPS}\nseed = 11\nmax_steps = 0\n\
             step_timeout_ms = {STEP_TIMEOUT_MS}\n\
             [trajectory_store]\nsqlite_path = \"{db}\"\n\
             [model_store]\ndir = \"{models}\"\n",
            url = server.url(),
            db = db.display(),
            models = dir.path().join("models").display(),
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();

    // Two shards of every per-target service first, then the collector (one instance: it owns
    // the simulated cluster).
    let mut two: Vec<_> = (0..2)
        .flat_map(|index| start_shard(cfg, ShardConfig { index, count: 2 }))
        .collect();
    let mut collector = Proc::spawn("aware-metrics-collector", &["--config", cfg], &[]);
    let col = collector.http_addr();
    wait_ready(col);
    let sim_steps = || scrape(col, "aware_collector_sim_steps_total", &[]).unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while sim_steps() < STEPS_EACH_SIDE as f64 {
        assert!(
            Instant::now() < deadline,
            "the loop stalled at {}",
            sim_steps()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Each instance received only the `obs` of its own targets: the sum over the shards of
    // what each consumer took in is what the collector published, not twice that.
    let published = || scrape(col, "aware_messages_out_total", &[("event", "obs")]).unwrap_or(0.0);
    let took_in = |procs: &[(&str, Proc, std::net::SocketAddr)], bin: &str, service: &str| {
        procs
            .iter()
            .filter(|(b, _, _)| *b == bin)
            .map(|(_, _, a)| {
                scrape(
                    *a,
                    "aware_messages_in_total",
                    &[("service", service), ("event", "obs")],
                )
                .unwrap_or(0.0)
            })
            .collect::<Vec<f64>>()
    };
    let before = published();
    let per_shard: Vec<Vec<f64>> = OBS_CONSUMERS
        .iter()
        .map(|(bin, service)| took_in(&two, bin, service))
        .collect();
    let after = published();
    for ((bin, _), took) in OBS_CONSUMERS.iter().zip(&per_shard) {
        assert!(took.iter().all(|&n| n > 0.0), "{bin}: {took:?}");
        let sum: f64 = took.iter().sum();
        assert!(
            sum <= after && sum >= before - APPS as f64,
            "{bin}: shards took in {took:?} of {before}..{after} obs published"
        );
    }

    // Each recorder shard replays only the partitions holding its slots.
    for (bin, _, addr) in two
        .iter()
        .filter(|(b, _, _)| *b == "aware-trajectory-recorder")
    {
        let streams = replayed_streams(*addr);
        assert!(
            streams == ["AWARE_0", "AWARE_2", "AWARE_4"]
                || streams == ["AWARE_1", "AWARE_3", "AWARE_5"],
            "{bin} replays {streams:?}"
        );
    }

    // The reshard: every 2-shard instance stops, then 3 shards start.
    let stop_seq = rt.block_on(last_sequences(&server.url()));
    for (bin, p, _) in &mut two {
        let status = p.terminate(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "{bin} did not stop cleanly: {status:?}\n{}",
            p.stderr()
        );
    }
    drop(two);
    // Each 2-shard recorder kept a resume point per partition of its own that holds a target.
    for i in 0..2 {
        let path = dir.path().join(format!("t.db.shard-{i}-of-2.resume"));
        let points = aware_trajectory_recorder::service::read_resume(&path, PARTITIONS).unwrap();
        // A partition none of the few targets hashed into has no point.
        assert!(
            !points.is_empty() && points.keys().all(|&k| k as usize % 2 == i),
            "{}: {points:?}",
            path.display()
        );
    }
    let three: Vec<_> = (0..3)
        .flat_map(|index| start_shard(cfg, ShardConfig { index, count: 3 }))
        .collect();
    let resumed_seq = rt.block_on(last_sequences(&server.url()));
    let resumed_at = sim_steps();

    let deadline = Instant::now() + Duration::from_secs(240);
    while sim_steps() < resumed_at + STEPS_EACH_SIDE as f64 {
        assert!(
            Instant::now() < deadline,
            "the loop stalled at {}",
            sim_steps()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The collector stops; the capture is read once the shards have decided every step
    // published after they were ready (or a minute has passed: the checks below then fail).
    let status = collector.terminate(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "the collector did not stop cleanly: {status:?}\n{}",
        collector.stderr()
    );
    let streams = capture_config().capture_streams();
    let deadline = Instant::now() + Duration::from_secs(60);
    let captured = loop {
        let captured = rt.block_on(aware_tests::capture_by_target_in(&server.url(), &streams));
        let undecided = captured.iter().any(|(t, c)| {
            let resumed_seq = resumed_seq[capture_config().partition_of(t) as usize];
            c.obs
                .iter()
                .any(|(key, &seq)| seq > resumed_seq && !c.actions.contains_key(key))
        });
        if !undecided || Instant::now() >= deadline {
            break captured;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(captured.len(), APPS);
    // Each partition's stream holds its own slots' targets only.
    let mut holding = 0;
    for (k, name) in streams.iter().enumerate() {
        let events = rt.block_on(aware_tests::capture_of(&server.url(), name));
        holding += usize::from(!events.is_empty());
        for (_, ev) in &events {
            assert_eq!(
                capture_config().partition_of(ev.target()),
                k as u32,
                "{name} holds {}",
                ev.target()
            );
        }
    }
    assert!(holding >= 2, "{holding} partitions hold messages");

    // Decided at most once ever, and exactly once under either shard count: every `obs`
    // published before the stop (but each target's last, which may have been in flight) and
    // every one published after the 3 shards were ready has exactly one `action`.
    let (mut decided, mut checked_before, mut checked_after) = (0u64, 0u64, 0u64);
    for (t, c) in &captured {
        assert!(c.actions.values().all(|&n| n == 1), "{t}: {:?}", c.actions);
        // Its sequences are its partition's.
        let k = capture_config().partition_of(t) as usize;
        let (stop_seq, resumed_seq) = (stop_seq[k], resumed_seq[k]);
        let last_before_stop = c.obs.values().filter(|&&s| s <= stop_seq).max().copied();
        for (key, &seq) in &c.obs {
            let must = (seq <= stop_seq && Some(seq) != last_before_stop) || seq > resumed_seq;
            if must {
                if seq > resumed_seq {
                    checked_after += 1;
                } else {
                    checked_before += 1;
                }
                assert_eq!(c.actions.get(key), Some(&1), "{t} step {key:?} (seq {seq})");
            }
            decided += u64::from(c.actions.contains_key(key));
        }
        assert!(
            c.actions.keys().all(|k| c.obs.contains_key(k)),
            "{t}: an action without its obs"
        );
        // The stage survived the reshard: the target started once (from nothing) and stayed
        // OFFLINE (no promotion in this run).
        let fresh = c
            .stages
            .iter()
            .filter(|(_, previous)| matches!(previous, None | Some(Stage::Initialized)))
            .count();
        assert_eq!(fresh, 1, "{t}: {:?}", c.stages);
        assert!(
            c.stages.iter().all(|(s, _)| *s == Stage::Offline),
            "{t}: {:?}",
            c.stages
        );
    }
    // Both shard counts decided most of their steps: each target's steps before the stop (but
    // its last) and every step after the 3 shards were ready.
    let each_side = APPS as u64 * (STEPS_EACH_SIDE - 1);
    assert!(
        checked_before >= each_side && checked_after >= each_side,
        "{checked_before} checked before the stop, {checked_after} after the 3 shards were ready"
    );

    // Each instance reports its shard for the alerting rules (`aware_shards`).
    for (i, (bin, _, addr)) in three.iter().enumerate() {
        let shard = (i / SHARDED.len()).to_string();
        assert_eq!(
            scrape(*addr, "aware_shards", &[("shard", shard.as_str())]),
            Some(3.0),
            "{bin} shard {shard}"
        );
    }

    // Each recorder shard of 3 replays the two partitions holding its slots (s mod 3 = i).
    for (i, (bin, _, addr)) in three
        .iter()
        .filter(|(b, _, _)| *b == "aware-trajectory-recorder")
        .enumerate()
    {
        let own = vec![streams[i].clone(), streams[i + 3].clone()];
        assert_eq!(replayed_streams(*addr), own, "{bin} shard {i}");
    }

    // The 3 shards split the targets between them, each counting only its own.
    for (bin, service) in OBS_CONSUMERS {
        let took = took_in(&three, bin, service);
        assert!(took.iter().all(|&n| n > 0.0), "{bin}: {took:?}");
    }
    let owned: f64 = three
        .iter()
        .filter(|(b, _, _)| *b == "aware-lifecycle-monitor")
        .map(|(_, _, a)| scrape(*a, "aware_targets", &[("service", "lifecycle-monitor")]).unwrap())
        .sum();
    assert_eq!(owned, APPS as f64);

    // Every decided step is stored, once: the new recorders replay the stream from its start
    // (their resume points are new) and the store's upserts absorb what was recorded twice.
    let store = || SqliteStore::open_path(&db).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let missing = |store: &SqliteStore| -> Vec<String> {
        let mut missing = Vec::new();
        for (t, c) in &captured {
            let stored: BTreeSet<(u64, u32)> = store
                .transitions(t, 0..u64::MAX)
                .unwrap()
                .iter()
                .map(|r| (r.episode, r.step))
                .collect();
            let last = c.actions.keys().next_back().copied();
            missing.extend(
                c.actions
                    .keys()
                    .filter(|k| Some(**k) != last && !stored.contains(k))
                    .map(|k| format!("{t} {k:?}")),
            );
        }
        missing
    };
    loop {
        let m = missing(&store());
        if m.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "not stored: {m:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let s = store();
    let stored: u64 = captured.keys().map(|t| s.count(t).unwrap()).sum();
    assert!(
        stored >= decided - APPS as u64,
        "{stored} stored, {decided} decided"
    );
    drop(three);
}

/// `aware bench scale` at a tiny size, paced (a step every 250 ms, its `obs` spread over half of
/// it): every per-target service in 2 shards as processes; every `obs` decided exactly once,
/// every step stored, and every figure filled in.
#[actix_rt::test]
async fn bench_scale_at_a_tiny_size_reports_every_figure() {
    let (targets, steps) = (24usize, 8u64);
    let opts = aware_bench::scale::ScaleBenchOptions {
        targets,
        shards: 2,
        steps,
        runs: 1,
        rl: false,
        // Acknowledged publishes (ADR 0022): every figure filled in with them too.
        ack_publishes: true,
        partitions: 1,
        step_ms: 250,
        spread: 0.5,
        restart: false,
        held_networks: None,
        timeout_secs: 120,
        bin_dir: aware_tests::bin_path("aware-recommender")
            .parent()
            .map(std::path::Path::to_path_buf),
    };
    let r = aware_bench::scale::run(&opts).await.unwrap();
    let run = &r.runs[0];
    assert_eq!((r.processes, r.step_ms), (10, 250));
    assert!(r.decided_exactly_once, "{run:?}");
    assert_eq!(run.undecided_or_repeated, 0);
    assert_eq!(run.transitions_stored, targets as u64 * steps, "{run:?}");
    assert!(
        r.target_steps_per_s > 0.0 && r.obs_to_action_p99_ms > 0.0,
        "{run:?}"
    );
    assert!(r.resident_bytes_per_target > 0.0, "{run:?}");
    // Per service: the five services (no trainer without --rl), summing to the whole.
    let by = &run.resident_bytes_per_target_by_service;
    assert_eq!(by.len(), 5, "{by:?}");
    assert!(!by.contains_key("aware-meta-learner-trainer"), "{by:?}");
    let sum: f64 = by.values().sum();
    assert!(
        sum >= run.resident_bytes_per_target - 1e-6,
        "{sum} < {}",
        run.resident_bytes_per_target
    );
    assert_eq!(r.resident_bytes_per_target_by_service.len(), 5);
    assert!(r.store_bytes_per_transition > 0.0, "{run:?}");
    assert_eq!(run.trainer_cpu_s, 0.0, "no trainer without --rl");
    // every service's CPU is counted, each of them worked
    let cpu = &run.cpu_us_per_target_step_by_service;
    assert_eq!(cpu.len(), 5, "{cpu:?}");
    assert!(cpu.values().all(|us| *us > 0.0), "{cpu:?}");
    // One capture stream: each of the 2 recorder shards reads all of it.
    assert!(
        run.replay_read_per_captured > 1.5 && run.replay_read_per_captured <= 2.0,
        "{run:?}"
    );
    assert!(run.capture_bytes_per_target_step > 0.0, "{run:?}");
    assert_eq!(r.first_model_after_s_p50, None);
}

/// `aware bench scale --restart` at a tiny size, RL on: after the run every service's shards are
/// killed and started again at once, and each restarted process reads back every target's state
/// it follows: the registrations (the bench registered every target), the stages the lifecycle
/// monitors published, the models and embeddings, the newest `obs` (from its own partition of
/// the capture).
#[actix_rt::test]
async fn bench_scale_restarts_every_service_and_each_reads_back_every_targets_state() {
    let targets = 24usize;
    let opts = aware_bench::scale::ScaleBenchOptions {
        targets,
        shards: 2,
        steps: 6,
        runs: 1,
        rl: true,
        restart: true,
        // The capture in 2 partitions: each shard reads its targets' newest `obs` (and any
        // state the bucket lacks) from its own partition only (ADR 0024).
        partitions: 2,
        // 4 of each trainer's 12 networks kept between rounds: the others are read back from
        // their checkpoints, and every target still gets its model.
        held_networks: Some(4),
        // Debug builds of 12 processes beside the other tests: room for a slow run.
        timeout_secs: 300,
        bin_dir: aware_tests::bin_path("aware-recommender")
            .parent()
            .map(std::path::Path::to_path_buf),
        ..Default::default()
    };
    let r = aware_bench::scale::run(&opts).await.unwrap();
    let run = &r.runs[0];
    assert!(r.decided_exactly_once, "{run:?}");
    // Two partitions, two shards: each recorder shard reads its own partition only.
    assert!(
        run.replay_read_per_captured > 0.5 && run.replay_read_per_captured <= 1.0,
        "{run:?}"
    );
    let services: Vec<&str> = run.restarts.iter().map(|x| x.service.as_str()).collect();
    assert_eq!(
        services,
        [
            "recommender",
            "actuator",
            "trajectory-recorder",
            "lifecycle-monitor",
            "meta-learner-trainer",
            "metrics-collector"
        ]
    );
    for x in &run.restarts {
        assert!(x.recovered_all, "{x:?}");
        assert!(x.ready_s > 0.0 && x.ready_s < 120.0, "{x:?}");
    }
    let of = |service: &str, kind: &str| {
        let x = run.restarts.iter().find(|x| x.service == service).unwrap();
        x.kinds
            .get(kind)
            .unwrap_or_else(|| panic!("{service} read no {kind}: {x:?}"))
            .clone()
    };
    // Every target registered and staged, each read back by the services that follow it.
    for (service, kind) in [
        ("recommender", "target"),
        ("recommender", "lifecycle"),
        ("lifecycle-monitor", "lifecycle"),
        ("metrics-collector", "obs"),
        ("actuator", "obs"),
    ] {
        let k = of(service, kind);
        assert_eq!(
            (k.restored, k.expected),
            (targets as u64, targets as u64),
            "{service} {kind}"
        );
    }
    let model = of("recommender", "model");
    assert_eq!(model.restored, model.expected);
    let recommender = &run.restarts[0];
    assert!(
        recommender.weights_loaded_s.is_some(),
        "the restarted recommender loads every model it read back: {recommender:?}"
    );
    assert_eq!(r.restart_recovered_all, Some(true));
    assert_eq!(r.restart_ready_s.len(), 6);
}
