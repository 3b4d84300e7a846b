//! `cargo run --release -p aware-shared-model --example meta_bench [iters] [hidden...]`: time of
//! one meta-learner BPTT iteration (forward + backward + Adam, a joint `MetaDdpg` step of one
//! bundle of M = 20 episodes × T = 100 steps and 64 transitions) and of one embedding, per GRU
//! width (2 bidirectional layers, FC width = H, E = 64).

use std::time::Instant;

use aware_shared_model::{
    Batch, DdpgConfig, EpisodeBundle, MetaConfig, MetaDdpg, MetaGroup, ModelError, Transition,
};

fn main() -> Result<(), ModelError> {
    let mut args = std::env::args().skip(1);
    let iters: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let mut hidden: Vec<usize> = args.filter_map(|a| a.parse().ok()).collect();
    if hidden.is_empty() {
        hidden = vec![32, 64, 128, 256];
    }
    let (m, t, d) = (20usize, 100usize, 9usize);
    let w = d + 4;
    let eps: Vec<Vec<f32>> = (0..m)
        .map(|e| {
            (0..t * w)
                .map(|i| ((i * 7 + e * 13) % 17) as f32 / 17.0)
                .collect()
        })
        .collect();
    let bundle = EpisodeBundle::new(d, eps)?;
    let mut batch = Batch::with_capacity(d, 64);
    for i in 0..64 {
        let s: Vec<f32> = (0..d).map(|j| ((i + j) % 5) as f32 / 5.0).collect();
        batch.push(&Transition {
            next_state: s.clone(),
            state: s,
            action: [0.1, -0.1, 0.0],
            reward: 1.0,
            done: false,
        })?;
    }
    for h in hidden {
        let meta = MetaConfig {
            state_dim: d,
            hidden: h,
            fc_hidden: h,
            ..MetaConfig::default()
        };
        let mut agent = MetaDdpg::new(DdpgConfig::with_hidden(d, &[64, 64]), meta)?;
        let group = [MetaGroup {
            bundle: &bundle,
            batch: &batch,
        }];
        agent.train_step(&group)?; // warm-up
        let start = Instant::now();
        for _ in 0..iters {
            agent.train_step(&group)?;
        }
        let train_ms = start.elapsed().as_secs_f64() * 1000.0 / iters as f64;
        let start = Instant::now();
        for _ in 0..iters {
            agent.embed(&bundle)?;
        }
        let embed_ms = start.elapsed().as_secs_f64() * 1000.0 / iters as f64;
        let (g, hd) = agent.meta().num_params();
        println!(
            "H = {h:>3}: {:>9} meta params, BPTT iteration (B = {m}, T = {t}) {train_ms:.1} ms, embedding {embed_ms:.1} ms",
            g + hd
        );
    }
    Ok(())
}
