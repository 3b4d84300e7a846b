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
//!
//! A second test does the same for the mean field (`learning.mean_field`) on a shared cluster
//! with Pending replicas, then runs the collector binary on it.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aware_loadgen::app::{generate_apps, GeneratorOptions, Slo};
use aware_loadgen::cluster::{slo_preservation, LATENCY_BUCKETS};
use aware_loadgen::env::{SimConfig, SimEnv};
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

/// The simulator serving its `/metrics` on the wall clock (a step every `STEP` s), scraped
/// every second by a real `prometheus`.
struct Scraped {
    prom: PrometheusServer,
    stop: tokio::sync::watch::Sender<bool>,
    sim: tokio::task::JoinHandle<Result<(), aware_loadgen::SimError>>,
}

impl Scraped {
    /// Starts Prometheus (first, so that every recorded step is scraped), then the simulator,
    /// and records `ticks` ticks: the step, the time, and what `record` reads right after it.
    async fn start<T: Send + 'static>(
        env: SimEnv,
        ticks: usize,
        record: fn(&SimHandle) -> T,
    ) -> (Scraped, Vec<(u64, f64, T)>) {
        let interval = Duration::from_secs_f64(STEP);
        let handle = SimHandle::new(env, Clock::WallClock { interval }).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sim_addr = listener.local_addr().unwrap().to_string();
        let prom = tokio::task::spawn_blocking(move || {
            PrometheusServer::start(&[sim_addr], Duration::from_secs(1))
        })
        .await
        .unwrap()
        .unwrap();
        let mut rx = handle.subscribe();
        let h = handle.clone();
        let recorder = tokio::spawn(async move {
            let mut out = Vec::new();
            while out.len() < ticks && rx.changed().await.is_ok() {
                let step = *rx.borrow_and_update();
                out.push((step, unix_s(), record(&h)));
            }
            out
        });
        let (stop, mut stop_rx) = tokio::sync::watch::channel(false);
        let sim = tokio::spawn(serve_wall_clock(
            handle.clone(),
            listener,
            interval,
            async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            },
        ));
        let recorded = tokio::time::timeout(Duration::from_secs(45), recorder)
            .await
            .expect("the simulator did not tick")
            .unwrap();
        // the last step's evaluation time must be in the past
        tokio::time::sleep(Duration::from_secs_f64(PHASE + 0.3)).await;
        (Scraped { prom, stop, sim }, recorded)
    }

    /// The Prometheus source's configuration on this server (one step per `STEP`), its client
    /// and each target's queries.
    fn source(
        &self,
        specs: &[TargetSpec],
    ) -> (PrometheusSourceConfig, PromClient, Vec<TargetQueries>) {
        let cfg = PrometheusSourceConfig {
            url: self.prom.url(),
            interval_s: STEP,
            staleness_s: 5.0,
            ..PrometheusSourceConfig::default()
        };
        let client = PromClient::new(&cfg.url, Duration::from_secs(5)).unwrap();
        let queries = specs
            .iter()
            .map(|s| TargetQueries::new(&cfg, &s.namespace, &s.name))
            .collect();
        (cfg, client, queries)
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        self.sim.await.unwrap().unwrap();
        drop(self.prom);
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
    let (scraped, ticks) =
        Scraped::start(env, TICKS, |h: &SimHandle| h.observe_all().unwrap()).await;
    let prom = &scraped.prom;
    let (cfg, client, queries) = scraped.source(&specs);

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

    scraped.stop().await;
}

/// The mean field (`learning.mean_field`) read from a real `prometheus` scraping the simulator
/// on a shared cluster too small for every replica: for every step, the cluster's requested CPU
/// and memory shares and its Pending replicas over the replicas wanted equal the simulator's own
/// accounting, each target's Pending replicas are the simulator's, and the others' means are
/// those of the other targets' PromQL states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mean_field_read_from_prometheus_is_the_simulators_cluster() {
    use aware_loadgen::nodes::ClusterConfig;
    use aware_metrics_collector::prometheus::{add_mean_fields, evaluate_cluster, ClusterQueries};

    let apps = generate_apps(3, 7, &GeneratorOptions::default());
    let specs: Vec<TargetSpec> = target_specs(&apps);
    // One node with 60% of the CPU the apps request at the start: some replicas stay Pending.
    let alone = SimEnv::new(apps.clone(), SimConfig::default()).unwrap();
    let requested_m: f64 = (0..alone.len())
        .map(|i| {
            let a = alone.observe(i).unwrap().allocation;
            f64::from(a.replicas) * f64::from(a.cpu_millicores)
        })
        .sum();
    let env = SimEnv::new(
        apps,
        SimConfig {
            step_seconds: STEP,
            seed: 7,
            cluster: Some(ClusterConfig::uniform(
                1,
                (requested_m * 0.6) as u64,
                64 << 30,
            )),
            ..SimConfig::default()
        },
    )
    .unwrap();
    let (scraped, ticks) = Scraped::start(env, 8, |h: &SimHandle| {
        (
            h.observe_all().unwrap(),
            h.cluster_occupancy().unwrap().unwrap(),
        )
    })
    .await;
    let prom = &scraped.prom;
    let (cfg, client, queries) = scraped.source(&specs);
    let cluster_queries = ClusterQueries::new(&cfg);
    let mut compared = 0;
    let mut pending_seen = false;
    let mut previous: Vec<Option<f64>> = vec![None; specs.len()];
    // The first ticks may precede Prometheus' first scrape of the simulator.
    for (step, t, (obs, occupancy)) in ticks.iter().skip(3) {
        let time = t + PHASE;
        let mut evals: Vec<Evaluation> = futures::future::join_all(
            specs
                .iter()
                .zip(&queries)
                .map(|(spec, q)| evaluate(&client, q, spec, time, None, cfg.staleness_s)),
        )
        .await;
        let reading = evaluate_cluster(&client, &cluster_queries, time, cfg.staleness_s).await;
        let [cpu, memory] = reading
            .shares
            .clone()
            .unwrap_or_else(|m| panic!("step {step}: cluster missing {m:?}\n{}", prom.log()));
        assert!(
            (cpu - occupancy.cpu_requested_share).abs() < 1e-6,
            "step {step}: CPU share prom {cpu} sim {}",
            occupancy.cpu_requested_share
        );
        assert!(
            (memory - occupancy.memory_requested_share).abs() < 1e-6,
            "step {step}: memory share prom {memory} sim {}",
            occupancy.memory_requested_share
        );
        for (j, e) in evals.iter().enumerate() {
            assert!(e.missing.is_empty(), "step {step}: {:?}", e.missing);
            assert_eq!(
                e.metrics.pending_replicas,
                Some(occupancy.pending_by_target[j]),
                "step {step}: {} Pending",
                specs[j].name
            );
        }
        pending_seen |= occupancy.pending_replicas > 0;
        add_mean_fields(&mut evals, &previous, &reading);
        let wanted: u32 = obs.iter().map(|o| o.allocation.replicas).sum();
        for (j, e) in evals.iter().enumerate() {
            let f = e.mean_field.expect("a complete step has its mean field");
            let others: Vec<&Evaluation> = evals
                .iter()
                .enumerate()
                .filter(|(k, _)| *k != j)
                .map(|(_, e)| e)
                .collect();
            let mean = |g: fn(&Evaluation) -> f64| {
                others.iter().map(|e| g(e)).sum::<f64>() / others.len() as f64
            };
            let want = [
                (1, cpu, "cluster_cpu_requested"),
                (2, memory, "cluster_memory_requested"),
                (
                    3,
                    f64::from(occupancy.pending_replicas) / f64::from(wanted),
                    "cluster_pending",
                ),
                (
                    4,
                    mean(|e| f64::from(e.state.unwrap().slo_preservation)),
                    "others_slo_preservation",
                ),
                (5, mean(|e| e.metrics.cpu_util), "others_cpu_util"),
            ];
            for (k, v, name) in want {
                assert!(
                    (f64::from(f[k]) - v).abs() < 1e-5,
                    "step {step} {}: {name} {} want {v}",
                    specs[j].name,
                    f[k]
                );
            }
            // Nothing acts on the cluster: the others' allocations do not change.
            assert_eq!(f[0], 0.0);
            compared += 1;
        }
        previous = evals
            .iter()
            .map(|e| Some(aware_metrics_collector::prometheus::requested_cores(e)))
            .collect();
    }
    assert!(compared >= 3 * specs.len(), "only {compared} compared");
    assert!(
        pending_seen,
        "no replica was Pending: the cluster is too large"
    );

    // The collector binary with `learning.mean_field` on the same Prometheus: every target's
    // complete `obs` carries the wider state, its mean field the cluster's.
    let nats = tokio::task::spawn_blocking(|| aware_tests::NatsServer::start().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("aware.toml");
    let targets: String = specs
        .iter()
        .map(|s| {
            format!(
                "[[targets]]\nnamespace = \"{}\"\nname = \"{}\"\n",
                s.namespace, s.name
            )
        })
        .collect();
    std::fs::write(
        &config,
        format!(
            "[bus]\nurl = \"{}\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
             [learning]\nmean_field = true\n\
             [collector]\nsource = \"prometheus\"\n\
             [collector.prometheus]\nurl = \"{}\"\ninterval_s = {STEP}\nstaleness_s = 5.0\n{targets}",
            nats.url(),
            prom.url(),
        ),
    )
    .unwrap();
    let cfg_path = config.to_str().unwrap().to_string();
    let collector = tokio::task::spawn_blocking(move || {
        let p = aware_tests::Proc::spawn("aware-metrics-collector", &["--config", &cfg_path], &[]);
        aware_tests::wait_ready(p.http_addr());
        p
    })
    .await
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let events = aware_tests::capture(&nats.url()).await;
        let complete: Vec<aware_bus_schemas::Obs> = events
            .into_iter()
            .filter_map(|(_, e)| match e {
                aware_bus_schemas::Event::Obs(o) if o.complete => Some(o),
                _ => None,
            })
            .collect();
        let every = specs
            .iter()
            .all(|s| complete.iter().filter(|o| o.target == s.target()).count() >= 2);
        if every {
            for o in &complete {
                assert_eq!(o.state.len(), 15, "{}: {:?}", o.target, o.state);
                let f = &o.state[9..];
                assert!(f.iter().all(|x| x.is_finite()), "{:?}", f);
                assert!(
                    f[1] > 0.5 && f[3] > 0.0,
                    "{}: a full cluster with Pending replicas: {f:?}",
                    o.target
                );
                assert!(o.metrics.pending_replicas.is_some());
            }
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every target's complete obs: {} complete\n{}",
            complete.len(),
            collector.stderr()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(collector);

    scraped.stop().await;
}
