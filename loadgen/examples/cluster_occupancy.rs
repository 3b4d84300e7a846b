//! N generated apps on a shared cluster sized for a chosen request occupancy, under one fixed
//! allocation policy, against the same apps each alone on an unlimited cluster:
//!
//! `cargo run --release -p aware-loadgen --example cluster_occupancy -- [APPS] [SEED]
//! [OCCUPANCY] [STEPS] [POLICY]`, defaults 20 apps, seed 1, occupancy 0.85, 360 steps, `hpa`
//! (the HPA rule at 60% CPU; or `hold`, each app's initial allocation).
//!
//! The cluster has nodes of 8 cores and 32 GiB allocatable, as many as put the apps' initial CPU
//! requests at OCCUPANCY of its CPU. Prints the cluster's mean requested shares, the most
//! replicas Pending in a step, the pending replica-seconds, and SLO attainment (share of steps
//! without a violation) shared and alone, with each app's degradation against alone.

use aware_loadgen::app::{generate_apps, GeneratorOptions};
use aware_loadgen::env::SimConfig;
use aware_loadgen::nodes::ClusterConfig;
use aware_loadgen::run::{run_sim, AppSource, PolicySpec, RunSimOptions, RunSimReport};
use aware_loadgen::SimError;

const NODE_CPU_MILLICORES: u64 = 8000;
const NODE_MEMORY_BYTES: u64 = 32 << 30;

fn attainment(r: &RunSimReport) -> Vec<f64> {
    let steps = r.steps.max(1) as f64;
    r.apps
        .iter()
        .map(|a| 1.0 - a.slo_violations as f64 / steps)
        .collect()
}

fn main() -> Result<(), SimError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let n: usize = arg(0).and_then(|s| s.parse().ok()).unwrap_or(20);
    let seed: u64 = arg(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let occupancy: f64 = arg(2).and_then(|s| s.parse().ok()).unwrap_or(0.85);
    let steps: u64 = arg(3).and_then(|s| s.parse().ok()).unwrap_or(360);
    let policy = match arg(4) {
        Some("hold") => PolicySpec::Hold,
        _ => PolicySpec::Hpa {
            target_cpu_util: 0.6,
        },
    };
    if !(occupancy > 0.0 && occupancy.is_finite()) {
        return Err(SimError::Config(format!(
            "occupancy must be > 0, got {occupancy}"
        )));
    }
    let apps = generate_apps(n, seed, &GeneratorOptions::default());
    let requested: u64 = apps
        .iter()
        .map(|a| u64::from(a.initial.replicas) * u64::from(a.initial.cpu_millicores))
        .sum();
    let nodes = ((requested as f64 / occupancy) / NODE_CPU_MILLICORES as f64)
        .ceil()
        .max(1.0) as u32;
    let run = |cluster: Option<ClusterConfig>| {
        run_sim(
            &RunSimOptions {
                apps: AppSource::Inline { apps: apps.clone() },
                steps,
                policy,
                config: SimConfig {
                    seed,
                    cluster,
                    ..SimConfig::default()
                },
                ..RunSimOptions::default()
            },
            &mut std::io::sink(),
        )
    };
    let shared = run(Some(ClusterConfig::uniform(
        nodes,
        NODE_CPU_MILLICORES,
        NODE_MEMORY_BYTES,
    )))?;
    let alone = run(None)?;
    let c = shared.cluster.clone().unwrap_or_default();
    println!(
        "{n} apps, seed {seed}, {steps} steps, policy {policy:?}: {nodes} nodes of {} cores / {} GiB, initial CPU requests {:.1} cores ({:.0}% of the cluster)",
        NODE_CPU_MILLICORES / 1000,
        NODE_MEMORY_BYTES >> 30,
        requested as f64 / 1000.0,
        100.0 * requested as f64 / (f64::from(nodes) * NODE_CPU_MILLICORES as f64)
    );
    println!(
        "requested share: CPU {:.3}, memory {:.3} (mean over steps); most Pending in a step {}; pending replica-seconds {:.0}",
        c.mean_cpu_requested_share,
        c.mean_memory_requested_share,
        c.max_pending_replicas,
        c.pending_replica_seconds
    );
    let (a_shared, a_alone) = (attainment(&shared), attainment(&alone));
    println!(
        "{:<16} {:>10} {:>10} {:>12} {:>10}",
        "app", "SLO shared", "SLO alone", "degradation", "pending s"
    );
    for (i, a) in shared.apps.iter().enumerate() {
        let (s, l) = (a_shared[i], a_alone[i]);
        println!(
            "{:<16} {:>10.3} {:>10.3} {:>11.1}% {:>10.0}",
            a.target,
            s,
            l,
            if l > 0.0 { 100.0 * (l - s) / l } else { 0.0 },
            c.pending_replica_seconds_by_target
                .get(i)
                .copied()
                .unwrap_or(0.0)
        );
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (ms, ml) = (mean(&a_shared), mean(&a_alone));
    println!(
        "mean SLO attainment: shared {ms:.3}, alone {ml:.3}, degradation {:.1}%",
        if ml > 0.0 {
            100.0 * (ml - ms) / ml
        } else {
            0.0
        }
    );
    Ok(())
}
