//! The collector's Prometheus source against a real `prometheus` scraping the simulator's
//! wall-clock `/metrics` every second: for every simulated step, the state computed from PromQL
//! equals the simulator's own state of that step.
//!
//! Alignment: the simulator ticks every `STEP` s (simulated step length = real interval, so its
//! counters advance by usage × real seconds). Step k is evaluated at `T = tick_k + 1.4 s`; with a
//! 1 s scrape interval the newest sample at `T` was scraped after tick k and before tick k+1, and
//! the window `(T − STEP, T]` starts in the same phase of step k−1, so the counter differences
//! cover exactly step k.
//!
//! A window that starts before Prometheus' first sample of the simulator has no counter value
//! at its start (the source then counts the counter's whole value, which began at the
//! simulator's start): such windows, and the one after them (whose load change they seed), are
//! not compared. When Prometheus scraped first is read from Prometheus itself.
//!
//! Tolerances (asserted):
//! * gauges (limits, replicas, working set, offered load) and counter differences (CPU usage,
//!   throughput): equal up to float rounding (1e-5 absolute on the state, 1e-6 relative on raw
//!   values) — the exposition prints round-trip floats;
//! * latencies come from `histogram_quantile` over the step's histogram increase, which
//!   interpolates inside a bucket: the p50/p99 read must lie in the bucket (±1 %) holding the
//!   simulator's value, and SP / the reward must lie within what that bucket allows;
//! * `io_util`, `network_util`: not exposed by the simulator, so 0 (no query configured).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aware_loadgen::app::{generate_apps, GeneratorOptions, Slo};
use aware_loadgen::cluster::{slo_preservation, LATENCY_BUCKETS};
use aware_loadgen::env::{Observation, SimConfig, SimEnv};
use aware_loadgen::wallclock::{serve_wall_clock, Clock, SimHandle};
use aware_metrics_collector::config::PrometheusSourceConfig;
use aware_metrics_collector::prometheus::{evaluate, Evaluation, PromClient, TargetQueries};
use aware_metrics_collector::simulator::target_specs;
use aware_shared::spec::TargetSpec;
use aware_shared::testkit::PrometheusServer;

const STEP: f64 = 2.0;
const PHASE: f64 = 1.4;
const TICKS: usize = 14;

fn unix_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Bounds (ms) of the histogram bucket holding `v_ms`, widened by 1 %.
fn bucket_ms(v_ms: f64) -> (f64, f64) {
    let mut lo = 0.0;
    for le in LATENCY_BUCKETS {
        let hi = le * 1000.0;
        if v_ms <= hi {
            return (lo * 0.99, hi * 1.01);
        }
        lo = hi;
    }
    // beyond the last finite bucket histogram_quantile answers that bucket's upper bound
    (lo * 0.99, lo * 1.01)
}

#[derive(Default)]
struct MaxErr(HashMap<&'static str, f64>);

impl MaxErr {
    fn add(&mut self, k: &'static str, v: f64) {
        let e = self.0.entry(k).or_insert(0.0);
        *e = e.max(v);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_source_matches_simulator_states() {
    let apps = generate_apps(3, 7, &GeneratorOptions::default());
    let specs: Vec<TargetSpec> = target_specs(&apps);
    let env = SimEnv::new(
        apps,
        SimConfig {
            step_seconds: STEP,
            seed: 7,
            ..SimConfig::default()
        },
    )
    .unwrap();
    let interval = Duration::from_secs_f64(STEP);
    let handle = SimHandle::new(env, Clock::WallClock { interval }).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim_addr = listener.local_addr().unwrap().to_string();

    // Prometheus first, so that every recorded step is scraped.
    let prom = tokio::task::spawn_blocking(move || {
        PrometheusServer::start(&[sim_addr], Duration::from_secs(1))
    })
    .await
    .unwrap()
    .unwrap();

    let mut rx = handle.subscribe();
    let h = handle.clone();
    let recorder = tokio::spawn(async move {
        let mut ticks: Vec<(u64, f64, Vec<Observation>)> = Vec::new();
        while ticks.len() < TICKS && rx.changed().await.is_ok() {
            let step = *rx.borrow_and_update();
            let t = unix_s();
            ticks.push((step, t, h.observe_all().unwrap()));
        }
        ticks
    });
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let sim = tokio::spawn(serve_wall_clock(
        handle.clone(),
        listener,
        interval,
        async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        },
    ));
    let ticks = tokio::time::timeout(Duration::from_secs(45), recorder)
        .await
        .expect("the simulator did not tick")
        .unwrap();
    // the last step's evaluation time must be in the past
    tokio::time::sleep(Duration::from_secs_f64(PHASE + 0.3)).await;

    let cfg = PrometheusSourceConfig {
        url: prom.url(),
        interval_s: STEP,
        staleness_s: 5.0,
        ..PrometheusSourceConfig::default()
    };
    let client = PromClient::new(&cfg.url, Duration::from_secs(5)).unwrap();
    let queries: Vec<TargetQueries> = specs
        .iter()
        .map(|s| TargetQueries::new(&cfg, &s.namespace, &s.name))
        .collect();

    let mut err = MaxErr::default();
    let mut compared = 0usize;
    let mut prev: Vec<Option<f64>> = vec![None; specs.len()];
    let mut latency_checked = 0usize;
    // Prometheus' first sample of the offered-load counter (a 250 ms subquery over the run
    // finds the oldest sample timestamp exactly: the scrape interval is 1 s).
    let (_, t_end, _) = ticks[ticks.len() - 1];
    let first_sample = client
        .query(
            "min(min_over_time(timestamp(http_requests_total)[2m:250ms]))",
            t_end + PHASE,
        )
        .await
        .unwrap()
        .first()
        .map(|s| s.value)
        .expect("Prometheus has no sample of http_requests_total");
    let mut seeded = false;
    for i in 1..ticks.len() {
        let (step, t, obs) = &ticks[i];
        assert_eq!(*step, ticks[i - 1].0 + 1, "a tick was missed");
        // Alignment needs each gap above 1.6 s (the sample at T − STEP, up to one scrape older,
        // must postdate the previous tick) and the next tick after T = tick + 1.4 s; a late tick
        // on a loaded machine only moves the window inside its step, so the upper limit is loose.
        let gap = t - ticks[i - 1].1;
        assert!((1.65..3.5).contains(&gap), "tick gap {gap} s");
        let time = t + PHASE;
        let evals: Vec<Evaluation> = futures::future::join_all(
            specs
                .iter()
                .zip(&queries)
                .zip(&prev)
                .map(|((spec, q), p)| evaluate(&client, q, spec, time, *p, cfg.staleness_s)),
        )
        .await;
        for (j, e) in evals.iter().enumerate() {
            prev[j] = Some(e.metrics.request_rate_rps);
        }
        if time - STEP < first_sample || !seeded {
            // A window starting before Prometheus' first scrape counts the counter's whole
            // value; the first window after them only seeds `prev` (the load change).
            seeded = time - STEP >= first_sample;
            continue;
        }
        for ((e, o), spec) in evals.iter().zip(obs).zip(&specs) {
            let name = &spec.name;
            assert!(
                e.missing.is_empty(),
                "{name} step {step}: missing {:?}\n{}",
                e.missing,
                prom.log()
            );
            let s = e.state.unwrap();
            let sim = aware_loadgen::env::State::from_slice(&o.state).unwrap();
            let m = &o.metrics;
            for (k, got, want, tol) in [
                ("cpu_limit", s.cpu_limit, sim.cpu_limit, 1e-5f32),
                ("memory_limit", s.memory_limit, sim.memory_limit, 1e-5),
                ("cpu_util", s.cpu_util, sim.cpu_util, 1e-5),
                ("memory_util", s.memory_util, sim.memory_util, 1e-5),
                ("load_change", s.load_change, sim.load_change, 1e-5),
                ("replicas", s.replicas, sim.replicas, 1e-6),
            ] {
                let d = (got - want).abs();
                err.add(k, f64::from(d));
                assert!(d <= tol, "{name} step {step}: {k} prom {got} sim {want}");
            }
            assert_eq!(
                (s.io_util, s.network_util),
                (0.0, 0.0),
                "io/network are not exposed"
            );
            let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-9);
            for (k, a, b) in [
                (
                    "cpu_usage_cores",
                    e.metrics.cpu_usage_cores,
                    m.cpu_usage_cores,
                ),
                ("throughput_rps", e.metrics.throughput_rps, m.throughput_rps),
                (
                    "memory_working_set_bytes",
                    e.metrics.memory_working_set_bytes,
                    m.memory_working_set_bytes,
                ),
                (
                    "request_rate_rps",
                    e.metrics.request_rate_rps,
                    m.offered_rps,
                ),
            ] {
                let r = if b.abs() < 1e-9 { a.abs() } else { rel(a, b) };
                err.add(k, r);
                assert!(r <= 1e-6, "{name} step {step}: {k} prom {a} sim {b}");
            }
            assert_eq!(e.metrics.replicas, m.replicas);
            assert_eq!(e.metrics.ready_replicas, m.ready_replicas);

            // latency: bucket granularity
            let slo = Slo {
                latency_p99_ms: spec.slo.latency_p99_ms,
                throughput_rps: spec.slo.throughput_rps,
                objective: None,
            };
            let (sp_lo, sp_hi) = if m.throughput_rps > 0.0 {
                latency_checked += 1;
                for (k, got, want) in [
                    ("p50", e.metrics.latency_p50_ms, m.p50_ms),
                    ("p99", e.metrics.latency_p99_ms, m.p99_ms),
                ] {
                    let got = got.unwrap_or_else(|| panic!("{name} step {step}: no {k}"));
                    let (lo, hi) = bucket_ms(want);
                    assert!(
                        (lo..=hi).contains(&got),
                        "{name} step {step}: {k} prom {got} ms outside the bucket [{lo}, {hi}] of sim {want} ms"
                    );
                    err.add(
                        if k == "p50" { "p50_ratio" } else { "p99_ratio" },
                        (got / want).max(want / got) - 1.0,
                    );
                }
                let (lo, hi) = bucket_ms(m.p99_ms);
                let at = |p99| slo_preservation(&slo, p99, m.throughput_rps, m.offered_rps).0;
                (at(hi), at(lo))
            } else {
                assert_eq!(e.metrics.latency_p99_ms, None);
                (m.slo_preservation, m.slo_preservation)
            };
            let sp = f64::from(s.slo_preservation);
            assert!(
                sp >= sp_lo - 1e-5 && sp <= sp_hi + 1e-5,
                "{name} step {step}: SP prom {sp} outside [{sp_lo}, {sp_hi}] (sim {})",
                m.slo_preservation
            );
            err.add("slo_preservation", (sp - m.slo_preservation).abs());
            let r = e.reward.unwrap();
            let r_tol = spec.alpha * 2.0 * (sp_hi - sp_lo) + 1e-4;
            err.add("reward", (r - o.reward).abs());
            assert!(
                (r - o.reward).abs() <= r_tol,
                "{name} step {step}: reward prom {r} sim {} (tolerance {r_tol})",
                o.reward
            );
            compared += 1;
        }
    }
    assert!(compared >= 8 * specs.len(), "only {compared} comparisons");
    assert!(latency_checked > 0, "no step served requests");
    let mut report: Vec<_> = err.0.iter().collect();
    report.sort_by(|a, b| a.0.cmp(b.0));
    eprintln!("prometheus_source: {compared} target-steps compared; max errors: {report:?}");

    // a target Prometheus has no series for: incomplete, no state, names listed
    let (_, t_last, _) = ticks[ticks.len() - 1];
    let ghost = TargetSpec::new(&aware_bus_schemas::Target::new("sim", "ghost"));
    let gq = TargetQueries::new(&cfg, "sim", "ghost");
    let e = evaluate(&client, &gq, &ghost, t_last + PHASE, None, cfg.staleness_s).await;
    assert_eq!(e.state, None);
    assert_eq!(e.reward, None);
    for n in [
        "pod_sample_time",
        "cpu_usage_cores",
        "replicas",
        "latency_p99_ms",
    ] {
        assert!(
            e.missing.iter().any(|m| m == n),
            "{n} not in {:?}",
            e.missing
        );
    }
    let obs = aware_metrics_collector::prometheus::to_obs(&e, &ghost.target(), 5, 100);
    assert!(!obs.complete && obs.state.is_empty() && obs.reward.is_none());

    // stale samples: evaluate 0.6 s after a scrape with staleness_s = 0.3
    let probe = format!(
        "max(timestamp(kube_deployment_status_replicas{{namespace=\"{}\",deployment=\"{}\"}}))",
        specs[0].namespace, specs[0].name
    );
    let sample_t = client.query(&probe, t_last + PHASE).await.unwrap()[0].value;
    let e = evaluate(&client, &queries[0], &specs[0], sample_t + 0.6, None, 0.3).await;
    assert_eq!(e.state, None, "stale samples must not give a state");
    for n in ["deployment_sample_time", "replicas", "ready_replicas"] {
        assert!(
            e.missing.iter().any(|m| m == n),
            "{n} not in {:?}",
            e.missing
        );
    }
    let fresh = evaluate(&client, &queries[0], &specs[0], sample_t + 0.6, None, 5.0).await;
    assert!(fresh.missing.is_empty(), "{:?}", fresh.missing);

    // an unreachable server: every query failed and is counted
    let dead = PromClient::new(
        &format!(
            "http://127.0.0.1:{}",
            aware_shared::testkit::free_port().unwrap()
        ),
        Duration::from_millis(500),
    )
    .unwrap();
    let e = evaluate(&dead, &queries[0], &specs[0], unix_s(), None, 5.0).await;
    assert_eq!(e.errors as usize, queries[0].queries.len());
    assert_eq!(e.state, None);

    stop_tx.send(true).unwrap();
    sim.await.unwrap().unwrap();
    drop(prom);
}
