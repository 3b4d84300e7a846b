//! `aware-controller`: the Kubernetes controller as its own process (for containers).

use clap::Parser;

#[derive(Parser)]
#[command(name = "aware-controller", version, about)]
struct Args {
    #[command(flatten)]
    config: aware_shared::cli::ConfigArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    aware_shared::launcher::main(&args.config, &[aware_controller::ENTRY])?;
    Ok(())
}
