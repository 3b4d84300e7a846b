//! `cargo run -p aware-shared-model --example checkpoint_seeds DIR`: writes the checkpoints of a
//! tiny DDPG agent (`ddpg.ckpt`, state 2, hidden 2) and a tiny meta-learner (`meta.ckpt`, hidden
//! 2, one layer, embedding 2) to DIR: the seeds of the `checkpoint` fuzz target (see
//! `fuzz/seed-corpus.sh`), small so that the fuzzer mutates headers and blocks rather than
//! kilobytes of weights.

use std::path::PathBuf;

use aware_shared_model::{Ddpg, DdpgConfig, MetaConfig, MetaLearner, ModelError};

fn main() -> Result<(), ModelError> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| ".".into()));
    std::fs::create_dir_all(&dir)?;
    let agent = Ddpg::new(DdpgConfig::with_hidden(2, &[2]))?;
    std::fs::write(dir.join("ddpg.ckpt"), agent.to_bytes()?)?;
    let meta = MetaLearner::new(MetaConfig {
        state_dim: 2,
        hidden: 2,
        layers: 1,
        fc_hidden: 0,
        embed_dim: 2,
        bundle_size: 1,
        ..MetaConfig::default()
    })?;
    std::fs::write(dir.join("meta.ckpt"), meta.to_bytes()?)?;
    Ok(())
}
