//! Print generated apps as YAML with their aggregated cost model:
//! `cargo run -p aware-loadgen --example show_apps -- COUNT SEED`.

use aware_loadgen::app::{generate_apps, AppSet, GeneratorOptions};
use aware_loadgen::cluster::AppModel;

fn main() -> Result<(), aware_loadgen::SimError> {
    let args: Vec<String> = std::env::args().collect();
    let n = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let seed = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
    let apps = generate_apps(n, seed, &GeneratorOptions::default());
    for a in &apps {
        let m = AppModel::from_app(a);
        println!(
            "# {}: cpu {:.1} ms/req, off-cpu {:.1} ms, base {:.0} MiB, {:.2} MiB/in-flight, cold {:.1} s, capacity/core {:.0} rps",
            a.name,
            m.cpu_seconds * 1e3,
            m.wait_seconds * 1e3,
            m.mem_base_bytes / 1048576.0,
            m.mem_per_request_bytes / 1048576.0,
            m.cold_start_seconds,
            m.replica_capacity_rps(1.0)
        );
    }
    println!("{}", AppSet { apps }.to_yaml()?);
    Ok(())
}
