//! Across machines (docs/operations.md, ADR 0022): three hosts, each a network namespace with
//! its own address; a 3-node NATS cluster across them (one server per host; the capture stream
//! and the state bucket with 3 replicas; acknowledged publishes); on each host one shard of every
//! per-target service and its shard's simulator collector, connected to the host's own server
//! first. One host is cut off for 10 s mid-run and put back. It stands still while cut off and
//! the others go on; afterwards every step of every target is decided exactly once and every
//! host's trajectory store holds every step of its targets (retried publishes reach the stream
//! out of order: the recorder's join takes a step's messages in any order).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use aware_bus_schemas::{Stage, Target};
use aware_stores::trajectory::{SqliteStore, TrajectoryStore};
use aware_tests::hosts::{Hosts, NatsCluster};
use aware_tests::{scrape, wait_ready, Proc, SHARDED};

const HOSTS: usize = 3;
const APPS: usize = 12;
const SPE: u32 = 10;
const STEPS: u64 = 500;
/// A step every 100 ms of wall-clock time: the cut spans seconds, as a real one does.
const STEP_SECONDS: f64 = 0.1;
/// The host cut off mid-run.
const CUT: usize = 2;

/// Whether the capture stream has a leader and all its replicas are current, asked of the
/// server at `url` (none while no stream leader answers).
async fn stream_current(url: &str) -> Option<bool> {
    let client = async_nats::connect(url).await.ok()?;
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream("AWARE").await.ok()?;
    let info = stream.info().await.ok()?;
    Some(info.cluster.as_ref().is_some_and(|c| {
        c.leader.is_some() && c.replicas.len() == HOSTS - 1 && c.replicas.iter().all(|r| r.current)
    }))
}

/// Waits until the cluster's JetStream answers (a meta leader is elected).
async fn wait_jetstream(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let error = match async_nats::connect(url).await {
            // The account-info request answers without an `error` once a meta leader is elected.
            Ok(client) => match client.request("$JS.API.INFO", "".into()).await {
                Ok(m) => match serde_json::from_slice::<serde_json::Value>(&m.payload) {
                    Ok(v) if v.get("error").is_none() => return,
                    Ok(v) => v.to_string(),
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "no JetStream on {url} after 60 s: {error}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn three_hosts_on_a_nats_cluster_lose_nothing_when_one_is_cut_off_and_restored() {
    let hosts = Hosts::create(HOSTS).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cluster = NatsCluster::start(&hosts, dir.path()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(wait_jetstream(&cluster.url(0)));

    // One shard of every service per host, each host with its own configuration and stores.
    let mut procs: Vec<Vec<(&str, Proc, SocketAddr)>> = (0..HOSTS).map(|_| Vec::new()).collect();
    let mut configs = Vec::new();
    for h in 0..HOSTS {
        let home = dir.path().join(format!("h{h}"));
        let config = home.join("aware.toml");
        std::fs::write(
            &config,
            format!(
                "[bus]\nurl = \"{urls}\"\n[bus.jetstream]\nreplicas = {HOSTS}\nack_publishes = true\n\
                 [http]\nlisten = \"{addr}:0\"\n\
                 [lifecycle]\nt_online = 1e9\n\
                 [learning]\nsteps_per_episode = {SPE}\n\
                 [collector]\nsource = \"simulator\"\n\
                 [collector.simulator]\napps = {APPS}\nseed = 11\nmax_steps = {STEPS}\n\
                 clock = \"wallclock\"\nstep_seconds = {STEP_SECONDS}\n\
                 [trajectory_store]\nsqlite_path = \"{db}\"\n\
                 [model_store]\ndir = \"{models}\"\n",
                urls = cluster.urls_from(h),
                addr = hosts.addr(h),
                db = home.join("t.db").display(),
                models = home.join("models").display(),
            ),
        )
        .unwrap();
        let (cfg, shard) = (config.to_str().unwrap().to_string(), format!("{h}/{HOSTS}"));
        configs.push((cfg, shard));
    }
    // The collectors last, once every host's services are ready: the loop starts together.
    for bins in [&SHARDED[..], &["aware-metrics-collector"]] {
        for (h, (cfg, shard)) in configs.iter().enumerate() {
            for &bin in bins {
                let p = Proc::spawn_on(&hosts, h, bin, &["--config", cfg, "--shard", shard], &[]);
                let addr = p.http_addr();
                wait_ready(addr);
                procs[h].push((bin, p, addr));
            }
        }
    }
    let collector = |h: usize| procs[h].last().map(|(_, _, a)| *a).unwrap();
    let sim_steps = |h: usize| scrape(collector(h), "aware_collector_sim_steps_total", &[]);
    let wait_steps = |hs: &[usize], at_least: f64, why: &str| {
        let deadline = Instant::now() + Duration::from_secs(240);
        while hs.iter().any(|&h| sim_steps(h).unwrap_or(0.0) < at_least) {
            let now: Vec<_> = hs.iter().map(|&h| sim_steps(h)).collect();
            assert!(Instant::now() < deadline, "{why}: stalled at {now:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let all: Vec<usize> = (0..HOSTS).collect();
    let others: Vec<usize> = all.iter().copied().filter(|&h| h != CUT).collect();
    wait_steps(&all, STEPS as f64 / 4.0, "before the cut");

    // The cut: host CUT's link goes down mid-run. The other two keep a quorum and keep going.
    hosts.cut(CUT).unwrap();
    // The cut lasts 10 s, longer than the cluster's elections take, and at least while the
    // other hosts take 40 more steps: they keep a quorum and go on.
    let cut_at = Instant::now();
    let at_cut = others
        .iter()
        .map(|&h| sim_steps(h).unwrap_or(0.0))
        .fold(0.0, f64::max);
    wait_steps(&others, at_cut + 40.0, "the other hosts during the cut");
    std::thread::sleep(Duration::from_secs(10).saturating_sub(cut_at.elapsed()));
    hosts.restore(CUT).unwrap();

    // Healed: the stream's replicas are all current again. The cut host stood still while cut
    // off (its publishes waited for the cluster to store them), then goes on.
    let deadline = Instant::now() + Duration::from_secs(120);
    while rt.block_on(stream_current(&cluster.url(CUT))) != Some(true) {
        assert!(Instant::now() < deadline, "the stream did not heal");
        std::thread::sleep(Duration::from_millis(200));
    }
    let steps: Vec<f64> = (0..HOSTS).map(|h| sim_steps(h).unwrap_or(0.0)).collect();
    assert!(
        others.iter().all(|&h| steps[h] >= steps[CUT] + 30.0),
        "the cut host went on while cut off: steps {steps:?}"
    );
    wait_steps(&all, STEPS as f64, "after the restore");
    // (`capture` reads again from a message it passed over: a read of the stream just after it
    // healed has been seen to miss one.)
    let captured = rt.block_on(aware_tests::capture_by_target(&cluster.url(0)));
    assert_eq!(captured.len(), APPS, "{:?}", captured.keys());

    // Whose targets are whose: each host's lifecycle monitor counts its own.
    let owned: Vec<f64> = procs
        .iter()
        .map(|p| {
            scrape(p[3].2, "aware_targets", &[("service", "lifecycle-monitor")]).unwrap_or(0.0)
        })
        .collect();
    assert!(
        owned.iter().all(|&n| n > 0.0),
        "targets per host: {owned:?}"
    );
    assert_eq!(owned.iter().sum::<f64>(), APPS as f64);

    // Every step decided exactly once, the cut included: every publish goes on only once the
    // cluster has stored it, so nothing is decided that the capture does not hold (each
    // target's last step may still be in flight).
    let mut checked = 0u64;
    for (t, c) in &captured {
        let twice: Vec<_> = c.actions.iter().filter(|(_, &n)| n != 1).collect();
        assert!(twice.is_empty(), "{t}: decided more than once: {twice:?}");
        let last = c.obs.keys().next_back().copied();
        for key in c.obs.keys().filter(|k| Some(**k) != last) {
            checked += 1;
            assert_eq!(c.actions.get(key), Some(&1), "{t} step {key:?}");
        }
        let orphans: Vec<_> = c
            .actions
            .keys()
            .filter(|k| !c.obs.contains_key(k))
            .collect();
        if !orphans.is_empty() {
            let near: Vec<String> = rt
                .block_on(aware_tests::capture(&cluster.url(0)))
                .into_iter()
                .filter(|(_, ev)| ev.target() == t)
                .filter_map(|(seq, ev)| {
                    let key = match &ev {
                        aware_bus_schemas::Event::Obs(o) => (o.episode, o.step),
                        aware_bus_schemas::Event::Action(a) => (a.episode, a.step),
                        aware_bus_schemas::Event::Applied(a) => (a.episode, a.step),
                        _ => return None,
                    };
                    orphans
                        .iter()
                        .any(|o| o.0 == key.0 && o.1.abs_diff(key.1) <= 2)
                        .then(|| format!("{seq} {:?} {key:?}", ev.kind()))
                })
                .collect();
            panic!("{t}: actions without their obs {orphans:?}; around them: {near:?}");
        }
        // Started once and stayed OFFLINE (no promotion in this run).
        let fresh = c
            .stages
            .iter()
            .filter(|(_, previous)| matches!(previous, None | Some(Stage::Initialized)))
            .count();
        assert_eq!(fresh, 1, "{t}: {:?}", c.stages);
    }
    assert!(checked >= APPS as u64 * (STEPS - 1), "{checked} checked");

    // Nothing lost: every host's store holds every step its targets took, including the cut
    // host's steps during the cut, which no stream holds (its recorder took them in live from
    // its own server). Each target took STEPS steps; the last may be in flight.
    let deadline = Instant::now() + Duration::from_secs(60);
    let short = || -> Vec<String> {
        let mut short = Vec::new();
        for (h, &owned) in owned.iter().enumerate() {
            let store = SqliteStore::open_path(dir.path().join(format!("h{h}/t.db"))).unwrap();
            let mine: BTreeSet<Target> = store.targets().unwrap().into_iter().collect();
            for t in &mine {
                let n = store.count(t).unwrap();
                if n + 1 < STEPS {
                    let idx: Vec<u64> = store
                        .transitions(t, 0..u64::MAX)
                        .unwrap()
                        .iter()
                        .map(|r| r.episode * u64::from(SPE) + u64::from(r.step))
                        .collect();
                    let gaps: Vec<String> = idx
                        .windows(2)
                        .filter(|w| w[1] > w[0] + 1)
                        .map(|w| format!("{}..{}", w[0] + 1, w[1]))
                        .collect();
                    short.push(format!(
                        "host {h}: {t} has {n} of {STEPS} steps, {:?}..={:?}, gaps {gaps:?}",
                        idx.first(),
                        idx.last()
                    ));
                }
            }
            if mine.len() as f64 != owned {
                short.push(format!(
                    "host {h}: {} targets stored of {owned}",
                    mine.len()
                ));
            }
        }
        short
    };
    loop {
        let s = short();
        if s.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = procs
                .iter()
                .map(|p| {
                    let text = p[2].1.stderr();
                    let warn: Vec<&str> = text.lines().filter(|l| !l.contains("INFO")).collect();
                    warn[warn.len().saturating_sub(30)..].join("\n")
                })
                .collect();
            panic!(
                "not stored: {s:?}\nthe recorders' warnings:\n{}",
                logs.join("\n---\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(procs);
}
