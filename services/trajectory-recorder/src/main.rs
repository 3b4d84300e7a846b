//! `aware-trajectory-recorder`: the trajectory-recorder service as its own process (for containers).

/// mimalloc rather than glibc's malloc: a bus-bound service makes and drops small buffers for
/// every message, which glibc's allocator serves slowly (docs/adr/0031-mimalloc-for-bus-bound-services.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

#[derive(Parser)]
#[command(name = "aware-trajectory-recorder", version, about)]
struct Args {
    #[command(flatten)]
    config: aware_shared::cli::ConfigArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    aware_shared::launcher::main(&args.config, &[aware_trajectory_recorder::ENTRY])?;
    Ok(())
}
