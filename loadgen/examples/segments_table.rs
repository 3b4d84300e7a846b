//! Print the segment model as a Markdown table (used in loadgen/README.md):
//! `cargo run -p aware-loadgen --example segments_table`.

use aware_loadgen::SegmentKind;

fn main() {
    println!("| segment | payload (unit) | before → after | CPU ms/req | par | base MiB | MiB/in-flight req | disk KiB/req | net KiB/req | off-CPU ms | cold start s | cv |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for k in SegmentKind::ALL {
        let f = k.family();
        let c = k.cost(k.default_payload());
        let a = k.cost(f.after()[f.after().len() - 1]);
        println!(
            "| `{}` | {} | {:?} → {:?} | {:.2} → {:.2} | {} | {:.0} | {:.2} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2} |",
            k.name(),
            f.unit(),
            f.before(),
            f.after(),
            c.cpu_seconds * 1e3,
            a.cpu_seconds * 1e3,
            c.parallelism,
            c.mem_base_bytes / 1048576.0,
            c.mem_per_request_bytes / 1048576.0,
            c.io_bytes / 1024.0,
            c.net_bytes / 1024.0,
            c.wait_seconds * 1e3,
            c.cold_start_seconds,
            c.noise_cv
        );
    }
}
