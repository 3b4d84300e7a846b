//! `cargo run --release -p aware-shared-model --example bench [steps] [runs]`: DDPG training
//! and inference throughput for 64-64 and 256-256 nets (median of `runs`).

use aware_shared_model::{bench_training, BenchReport, DdpgConfig, ModelError};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<(), ModelError> {
    let mut args = std::env::args().skip(1);
    let steps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    for hidden in [[64, 64], [256, 256]] {
        let cfg = DdpgConfig::with_hidden(9, &hidden);
        let mut reports: Vec<BenchReport> = Vec::new();
        for run in 0..runs {
            let r = bench_training(&cfg, steps)?;
            println!("run {run}: {r}");
            reports.push(r);
        }
        let m = |f: fn(&BenchReport) -> f64| median(reports.iter().map(f).collect());
        println!(
            "MEDIAN {hidden:?}: push {:.0}/s, {:.1} grad steps/s ({:.0} transitions/s), act p50 {:.1} µs, p99 {:.1} µs",
            m(|r| r.transitions_per_s),
            m(|r| r.grad_steps_per_s),
            m(|r| r.trained_transitions_per_s),
            m(|r| r.act_p50_us),
            m(|r| r.act_p99_us),
        );
    }
    Ok(())
}
