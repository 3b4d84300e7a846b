//! `cargo run --release -p aware-shared-model --example policy_memory [agent|policy] [targets]
//! [hidden] [state_dim]`: the resident memory a recommender holding `targets` loaded
//! checkpoints (default 1,000 of the trainer's default 64-64 base-learner on the 9 + 64 input
//! of meta-learning) gains, each kept as the whole agent (`agent`, what the recommender held
//! before) or as its acting half (`policy`, [`aware_shared_model::Policy`]). Run each in its own
//! process: the allocator keeps what a first run freed. Linux only (`/proc/self/statm`).

use aware_shared_model::{Ddpg, DdpgConfig, ModelError, Policy};

/// Resident set size, bytes.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() -> Result<(), ModelError> {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "policy".into());
    let targets: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let hidden: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let state_dim: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(73);
    let bytes = Ddpg::new(DdpgConfig::with_hidden(state_dim, &[hidden, hidden]))?.to_bytes()?;
    let before = rss_bytes();
    let (held, params) = match kind.as_str() {
        "agent" => {
            let v: Vec<Ddpg> = (0..targets)
                .map(|_| Ddpg::from_bytes(&bytes))
                .collect::<Result<_, _>>()?;
            let (a, c) = v[0].num_params();
            (rss_bytes(), 4 * (a + c))
        }
        _ => {
            let v: Vec<Policy> = (0..targets)
                .map(|_| Policy::from_bytes(&bytes))
                .collect::<Result<_, _>>()?;
            (rss_bytes(), v[0].num_params())
        }
    };
    let per_target = held.saturating_sub(before) as f64 / targets as f64;
    println!(
        "{kind}: {targets} targets of {hidden}-{hidden} on a {state_dim}-d input (checkpoint {} bytes, \
         {params} floats held each): RSS +{:.1} MiB, {:.1} KiB per target",
        bytes.len(),
        held.saturating_sub(before) as f64 / (1024.0 * 1024.0),
        per_target / 1024.0
    );
    Ok(())
}
