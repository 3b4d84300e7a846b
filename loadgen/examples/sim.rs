//! Run `aware sim` without the CLI: `cargo run -p aware-loadgen --example sim -- POLICY STEPS
//! [APPS_FILE]` with POLICY one of hold, random, hpa, oracle. Per-step JSON lines go to
//! `sim-steps.jsonl`; the summary is printed.

use aware_loadgen::run::{AppSource, PolicySpec, RunSimOptions};

fn main() -> Result<(), aware_loadgen::SimError> {
    let args: Vec<String> = std::env::args().collect();
    let policy = match args.get(1).map(String::as_str) {
        Some("random") => PolicySpec::Random { seed: 1 },
        Some("hpa") => PolicySpec::Hpa {
            target_cpu_util: 0.6,
        },
        Some("oracle") => PolicySpec::Oracle,
        _ => PolicySpec::Hold,
    };
    let steps = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100);
    let apps = match args.get(3) {
        Some(p) => AppSource::File { path: p.into() },
        None => AppSource::Generate { count: 4, seed: 0 },
    };
    let opts = RunSimOptions {
        apps,
        steps,
        policy,
        with_oracle: true,
        ..RunSimOptions::default()
    };
    let path = std::path::Path::new("sim-steps.jsonl");
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| {
        aware_loadgen::SimError::Io {
            path: path.into(),
            source: e,
        }
    })?);
    let report = aware_loadgen::run_sim(&opts, &mut out)?;
    for a in &report.apps {
        println!(
            "{:<16} reward {:>7.2} (oracle bound {:>7.2})  SLO violations {:>3}  cpu {:.2} mem {:.2}  oom {}",
            a.target,
            a.total_reward,
            a.oracle_total_reward.unwrap_or(f64::NAN),
            a.slo_violations,
            a.mean_cpu_util,
            a.mean_memory_util,
            a.oom_kills
        );
    }
    Ok(())
}
