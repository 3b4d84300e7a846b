//! Run `aware bench sim` without the CLI: `cargo run --release -p aware-loadgen --example
//! bench_sim -- [OUT_DIR]`.

fn main() -> Result<(), aware_loadgen::SimError> {
    let out_dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("bench-out"));
    let opts = aware_loadgen::bench::SimBenchOptions {
        out_dir,
        ..Default::default()
    };
    let r = aware_loadgen::bench::bench_sim(&opts)?;
    println!(
        "target-steps/s median {:.0} (runs {:?}), goal {} met: {}, optimized: {}",
        r.target_steps_per_sec_median,
        r.target_steps_per_sec_runs
            .iter()
            .map(|x| x.round())
            .collect::<Vec<_>>(),
        r.target_steps_per_sec_goal,
        r.meets_goal,
        r.optimized_build
    );
    println!(
        "with observations (SimEnv::step): {:.0} target-steps/s",
        r.observed_target_steps_per_sec_median
    );
    for g in &r.grids {
        println!("{}: {}", g.segment.name(), g.svg.display());
    }
    println!("{}", r.json.display());
    Ok(())
}
