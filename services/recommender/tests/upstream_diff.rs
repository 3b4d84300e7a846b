//! Differential test of the fallback's HPA and VPA ports against upstream's own Go code.
//!
//! The same seeded cases go to the port ([`calculate_replicas`], [`Vpa`]) and to
//! `tests/upstream/`'s driver, built from the Go module proxy at the pinned versions
//! (`k8s.io/kubernetes` `ReplicaCalculator.GetResourceReplicas`; the VPA recommender's `model` and
//! `logic` packages with its default configuration). The driver is found as the Kubernetes
//! end-to-end tests find theirs: `$AWARE_UPSTREAM_BIN` (exported by `tests/run.sh`), else what
//! `tests/upstream/build.sh` prints (it builds once into `~/.cache/aware-rs/upstream-…/`).
//!
//! HPA: replica count and utilization must be equal, and both sides must refuse the same cases.
//! VPA: target, lower and upper bounds (millicores, bytes) must be equal, and so must the number
//! of OOM kills discarded as too old. No tolerance: both sides compute in float64 and truncate to
//! whole millicores and bytes (`resourceAmountFromFloat`) at the same steps. The one place the
//! last bit could differ is `2^x` of the decay (Go's `math.Exp2` against `powf`) and `1.05^n` of
//! the bucket boundaries (`math.Pow` against `powi`); that would show as one unit after
//! truncation, and is counted separately so such a case is told apart from a logic difference.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use aware_recommender::fallback::hpa::{calculate_replicas, PodGroup, PodSample};
use aware_recommender::fallback::vpa::{Vpa, VpaConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

const SEED: u64 = 40;
const HPA_CASES: usize = 400;
/// The sweep: one pod at every whole millicore from 0 to this, against a 100 m request (so the
/// utilization in percent is the millicores: any misread millicore shows).
const HPA_SWEEP_MILLI: i64 = 20_000;
const VPA_CASES: usize = 120;

fn upstream_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("AWARE_UPSTREAM_BIN") {
        return PathBuf::from(p);
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/upstream/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/upstream/build.sh");
    assert!(
        out.status.success(),
        "tests/upstream/build.sh failed ({}); run `bash tests/upstream/build.sh` to see why",
        out.status
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8 path");
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("build.sh prints the binary")
            .trim(),
    )
}

/// Runs every case through the upstream driver; answers come back in order.
fn upstream(cases: &[Value]) -> Vec<Value> {
    let bin = upstream_bin();
    let mut child = Command::new(&bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let mut stdin = child.stdin.take().expect("stdin");
    let input: Vec<u8> = cases
        .iter()
        .flat_map(|c| {
            let mut line = serde_json::to_vec(c).expect("json");
            line.push(b'\n');
            line
        })
        .collect();
    let writer = std::thread::spawn(move || {
        stdin.write_all(&input).expect("write cases");
    });
    let answers: Vec<Value> = BufReader::new(child.stdout.take().expect("stdout"))
        .lines()
        .map(|l| serde_json::from_str(&l.expect("read answer")).expect("answer json"))
        .collect();
    writer.join().expect("writer thread");
    let status = child.wait().expect("wait");
    assert!(status.success(), "upstream driver exited with {status}");
    assert_eq!(answers.len(), cases.len(), "one answer per case");
    for (c, a) in cases.iter().zip(&answers) {
        assert_eq!(c["id"], a["id"], "answers in order");
    }
    answers
}

// ---------------------------------------------------------------------------------------- HPA

const POD_STATES: [&str; 5] = ["ready", "missing", "pending", "not_ready", "initializing"];

/// A case: current replicas, target %, tolerance, per-pod request (millicores), pods as
/// (upstream state, nanocores). Several flavours so every branch of `GetResourceReplicas` is hit.
fn hpa_case(rng: &mut ChaCha8Rng, id: usize) -> Value {
    let flavour = id % 9;
    let n = match rng.random_range(0..10) {
        0 => rng.random_range(13..=40),
        _ => rng.random_range(1..=12),
    };
    let request_milli: i64 = match rng.random_range(0..50) {
        _ if flavour == 8 => [100, 200, 1000][rng.random_range(0..3)],
        0 => 0,
        1..=10 => 1000,
        11..=20 => 500,
        21..=25 => 250,
        26..=30 => 2000,
        _ => rng.random_range(50..=4000),
    };
    let target_percent: i64 = match rng.random_range(0..6) {
        0 => rng.random_range(101..=200),
        _ => rng.random_range(10..=100),
    };
    let tolerance = match rng.random_range(0..8) {
        0 => 0.0,
        1 => 0.05,
        2 => 0.2,
        _ => 0.1,
    };
    let current = match rng.random_range(0..4) {
        0 => (n as i64 + rng.random_range(-3..=3)).max(1),
        _ => n as i64,
    };
    let target_milli = request_milli.max(1) as f64 * target_percent as f64 / 100.0;
    let pods: Vec<Value> = (0..n)
        .map(|_| {
            let state = match flavour {
                // All ready.
                0 | 1 => "ready",
                // Unready pods (every upstream route to "unready").
                2 | 3 => {
                    if rng.random_bool(0.6) {
                        "ready"
                    } else {
                        POD_STATES[rng.random_range(2..5)]
                    }
                }
                // Missing metrics.
                4 => {
                    if rng.random_bool(0.7) {
                        "ready"
                    } else {
                        "missing"
                    }
                }
                // Anything.
                _ => POD_STATES[rng.random_range(0..5)],
            };
            // Usage: around the target (tolerance band), idle, overloaded, or anywhere; whole
            // millicores half the time (a boundary for the millicore rounding), else nanocores.
            let milli = match flavour {
                // Whole millicores of busy pods (beyond 2 cores, where cores × 1000 in
                // floating point can land just above the integer).
                8 => rng.random_range(1500..4500) as f64,
                0 | 2 => target_milli * rng.random_range(0.85..1.15),
                1 | 3 => target_milli * rng.random_range(1.0..4.0),
                _ => match rng.random_range(0..4) {
                    0 => request_milli as f64 * rng.random_range(0.0..0.05),
                    _ => request_milli.max(1) as f64 * rng.random_range(0.0..2.5),
                },
            };
            let nanocores = if rng.random_bool(0.5) {
                (milli.round() as i64) * 1_000_000
            } else {
                (milli * 1e6).round() as i64
            };
            json!({"state": state, "nanocores": nanocores})
        })
        .collect();
    json!({
        "id": id, "kind": "hpa", "current": current, "target_percent": target_percent,
        "tolerance": tolerance, "request_milli": request_milli, "pods": pods,
    })
}

/// The port's answer: Ok((replicas, utilization)) or Err(reason).
fn hpa_port(c: &Value) -> Result<(i64, i64), String> {
    let pods: Vec<PodGroup> = c["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .map(|p| {
            let cores = p["nanocores"].as_i64().expect("nanocores") as f64 / 1e9;
            let pod = match p["state"].as_str().expect("state") {
                "ready" => PodSample {
                    ready: true,
                    cpu_usage_cores: Some(cores),
                },
                "missing" => PodSample {
                    ready: true,
                    cpu_usage_cores: None,
                },
                // Every upstream route to "unready" is the port's unready pod.
                _ => PodSample {
                    ready: false,
                    cpu_usage_cores: None,
                },
            };
            PodGroup::from(pod)
        })
        .collect();
    calculate_replicas(
        c["current"].as_i64().expect("current") as u32,
        &pods,
        c["request_milli"].as_i64().expect("request"),
        c["target_percent"].as_i64().expect("target"),
        c["tolerance"].as_f64().expect("tolerance"),
    )
    .map(|r| (i64::from(r.replicas), r.utilization_percent))
    .map_err(|e| e.to_string())
}

#[test]
fn hpa_replica_calculator_matches_upstream() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let mut cases: Vec<Value> = (0..HPA_CASES).map(|id| hpa_case(&mut rng, id)).collect();
    cases.extend((0..=HPA_SWEEP_MILLI).map(|m| {
        json!({
            "id": HPA_CASES + m as usize, "kind": "hpa", "current": 1, "target_percent": 100,
            "tolerance": 0.1, "request_milli": 100,
            "pods": [{"state": "ready", "nanocores": m * 1_000_000}],
        })
    }));
    let answers = upstream(&cases);
    let mut differing = Vec::new();
    let mut refused = 0;
    let mut changed = 0;
    for (c, a) in cases.iter().zip(&answers) {
        let port = hpa_port(c);
        let agree = match (&port, a["error"].as_str()) {
            (Err(_), Some(_)) => {
                refused += 1;
                true
            }
            (Ok((replicas, util)), None) => {
                let random = c["id"].as_u64().expect("id") < HPA_CASES as u64;
                if random && *replicas != c["current"].as_i64().expect("current") {
                    changed += 1;
                }
                Some(*replicas) == a["replicas"].as_i64()
                    && Some(*util) == a["utilization"].as_i64()
            }
            _ => false,
        };
        if !agree {
            differing.push(format!("case {c}\n  upstream {a}\n  port     {port:?}"));
        }
    }
    eprintln!(
        "HPA: {} cases ({HPA_CASES} random: {refused} refused by both, {changed} changing the count; {} swept), {} differing",
        cases.len(),
        HPA_SWEEP_MILLI + 1,
        differing.len()
    );
    // The generator must reach the interesting branches, or the comparison proves little.
    assert!(
        refused >= 5 && changed >= HPA_CASES / 3,
        "{refused} refused, {changed} changed"
    );
    assert!(
        differing.is_empty(),
        "{} of {} HPA cases differ from upstream; the first ones:\n{}",
        differing.len(),
        cases.len(),
        differing[..differing.len().min(5)].join("\n")
    );
}

// ---------------------------------------------------------------------------------------- VPA

const DAY: i64 = 86_400;

/// A sample series over up to a week: CPU of 1–5 pods (their count may change), the first pod's
/// memory, and OOM kills (some of them late, some older than a day).
fn vpa_case(rng: &mut ChaCha8Rng, id: usize) -> Value {
    let step: i64 = [60, 60, 120, 300][rng.random_range(0..4)];
    let span: i64 = match id % 5 {
        0 => rng.random_range(600..DAY / 2),
        _ => rng.random_range(DAY / 2..7 * DAY),
    };
    let pattern = id % 4;
    let base = match rng.random_range(0..4) {
        0 => rng.random_range(0.0..0.02),
        _ => rng.random_range(0.05..4.0),
    };
    let mem_base = rng.random_range(5e6..4e9);
    let mut pods: u32 = rng.random_range(1..=5);
    let mut limit = mem_base * 1.2;
    let mut events = Vec::new();
    let mut t = rng.random_range(0..DAY / 2);
    let end = t + span;
    while t < end {
        let day_phase = (t % DAY) as f64 / DAY as f64 * std::f64::consts::TAU;
        let cpu = match pattern {
            // Idle with noise.
            0 => base * rng.random_range(0.5..1.5),
            // Bursty: mostly low, rare spikes.
            1 => {
                if rng.random_bool(0.05) {
                    base * rng.random_range(3.0..10.0)
                } else {
                    base * rng.random_range(0.1..0.5)
                }
            }
            // Diurnal.
            2 => base * (1.2 + day_phase.sin()) * rng.random_range(0.8..1.2),
            // Ramp.
            _ => base * (0.2 + 2.0 * (t - (end - span)) as f64 / span as f64),
        };
        if rng.random_bool(0.002) {
            pods = rng.random_range(1..=5);
        }
        events.push(json!({"t": t, "cpu_cores": cpu, "pods": pods}));
        let mem = match pattern {
            1 => mem_base * rng.random_range(0.9..1.0) + (t % (DAY / 3)) as f64 * 2e3,
            3 => mem_base * (1.0 + (t - (end - span)) as f64 / DAY as f64 * 0.3),
            _ => mem_base * rng.random_range(0.8..1.1),
        };
        events.push(json!({"t": t, "mem_bytes": mem.round()}));
        if rng.random_bool(0.3 / (DAY / step) as f64 * 4.0) {
            // An OOM kill at the current limit, reported now, a little late, or more than a
            // day late (upstream discards those).
            let late = match rng.random_range(0..4) {
                0 => rng.random_range(DAY..2 * DAY),
                1 => rng.random_range(0..DAY),
                _ => 0,
            };
            events.push(json!({"t": (t - late).max(0), "oom_requested_bytes": limit.round()}));
            limit = (limit * 1.2).min(mem_base * 3.0);
        }
        t += step;
    }
    json!({"id": id, "kind": "vpa", "events": events})
}

/// The port's (target, lower, upper) as [millicores, bytes] and how many OOMs it discarded.
fn vpa_port(c: &Value) -> ([[i64; 2]; 3], i64) {
    let mut v = Vpa::new(VpaConfig::default()).expect("default config");
    let mut discarded = 0;
    for e in c["events"].as_array().expect("events") {
        let t = e["t"].as_i64().expect("t") as f64;
        if let Some(cpu) = e["cpu_cores"].as_f64() {
            let pods = e["pods"].as_u64().expect("pods") as u32;
            v.add_cpu_samples(t, cpu, pods);
        } else if let Some(mem) = e["mem_bytes"].as_f64() {
            v.add_memory_sample(t, mem, false);
        } else if let Some(req) = e["oom_requested_bytes"].as_f64() {
            if v.record_oom(t, req).is_none() {
                discarded += 1;
            }
        }
    }
    let est = v.estimate().expect("samples were added");
    let pair = |a: aware_recommender::fallback::vpa::Amounts| {
        [a.cpu_millicores as i64, a.memory_bytes as i64]
    };
    (
        [
            pair(est.target),
            pair(est.lower_bound),
            pair(est.upper_bound),
        ],
        discarded,
    )
}

#[test]
fn vpa_recommendation_matches_upstream() {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let cases: Vec<Value> = (0..VPA_CASES).map(|id| vpa_case(&mut rng, id)).collect();
    let answers = upstream(&cases);
    let mut differing = Vec::new();
    let mut off_by_one = 0;
    let mut ooms = 0;
    let mut ooms_discarded = 0;
    for (c, a) in cases.iter().zip(&answers) {
        let (port, discarded) = vpa_port(c);
        ooms += c["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e.get("oom_requested_bytes").is_some())
            .count();
        ooms_discarded += a["ooms_discarded"].as_i64().expect("discarded");
        let up: Vec<[i64; 2]> = ["target", "lower", "upper"]
            .iter()
            .map(|k| {
                let v = &a[*k];
                [v[0].as_i64().expect("cpu"), v[1].as_i64().expect("memory")]
            })
            .collect();
        let mut agree = discarded == a["ooms_discarded"].as_i64().expect("discarded");
        for (p, u) in port.iter().zip(&up) {
            for (x, y) in p.iter().zip(u) {
                if (x - y).abs() == 1 {
                    off_by_one += 1;
                }
                agree &= x == y;
            }
        }
        if !agree {
            let events = c["events"].as_array().expect("events").len();
            differing.push(format!(
                "case {} ({events} events)\n  upstream target/lower/upper {up:?}, OOMs discarded {}\n  port     target/lower/upper {port:?}, OOMs discarded {discarded}",
                c["id"], a["ooms_discarded"]
            ));
        }
    }
    eprintln!(
        "VPA: {} cases, {ooms} OOMs ({ooms_discarded} discarded by upstream), {off_by_one} values off by one unit, {} differing",
        cases.len(),
        differing.len()
    );
    assert!(
        ooms >= 20 && ooms_discarded >= 1,
        "{ooms} OOMs, {ooms_discarded} discarded"
    );
    assert!(
        differing.is_empty(),
        "{} of {} VPA cases differ from upstream; the first ones:\n{}",
        differing.len(),
        cases.len(),
        differing[..differing.len().min(5)].join("\n")
    );
}
