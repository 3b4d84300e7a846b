//! Training/inference throughput benchmark (wired into `aware bench` by the CLI).

use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::config::DdpgConfig;
use crate::ddpg::Ddpg;
use crate::error::ModelError;
use crate::replay::{Batch, ReplayBuffer, Transition};

/// Minibatch size of the paper (Table 2).
pub const BENCH_BATCH: usize = 64;

/// Benchmark results.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    /// Hidden widths of the actor (critic is the same in the default benches).
    pub actor_hidden: Vec<usize>,
    /// Critic hidden widths.
    pub critic_hidden: Vec<usize>,
    /// Trainable parameters (actor + critic).
    pub params: usize,
    /// Transitions pushed into the replay buffer per second.
    pub transitions_per_s: f64,
    /// Gradient steps (sample a 64-batch + DDPG update) per second.
    pub grad_steps_per_s: f64,
    /// Transitions consumed by training per second (grad steps × batch).
    pub trained_transitions_per_s: f64,
    /// `act` latency median, microseconds.
    pub act_p50_us: f64,
    /// `act` latency 99th percentile, microseconds.
    pub act_p99_us: f64,
    /// Critic loss of the last step (sanity: finite).
    pub last_critic_loss: f32,
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "actor {:?} critic {:?} ({} params): push {:.0} transitions/s, train {:.1} grad steps/s \
             ({:.0} transitions/s), act p50 {:.1} µs p99 {:.1} µs",
            self.actor_hidden,
            self.critic_hidden,
            self.params,
            self.transitions_per_s,
            self.grad_steps_per_s,
            self.trained_transitions_per_s,
            self.act_p50_us,
            self.act_p99_us
        )
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Fills a replay buffer with 10 000 synthetic transitions, runs `steps` gradient steps
/// (minibatch 64) and times 2 000 single-state `act` calls.
pub fn bench_training(cfg: &DdpgConfig, steps: usize) -> Result<BenchReport, ModelError> {
    let mut agent = Ddpg::new(cfg.clone())?;
    let d = cfg.state_dim;
    let n = 10_000;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5eed);
    let transitions: Vec<Transition> = (0..n)
        .map(|_| {
            let state: Vec<f32> = (0..d).map(|_| rng.random_range(0.0..1.0)).collect();
            let action = [
                rng.random_range(-1.0..1.0),
                rng.random_range(-1.0..1.0),
                rng.random_range(-1.0..1.0),
            ];
            Transition {
                reward: 1.0 - (action[0] - state[0]).abs(),
                next_state: state.iter().map(|x| (x * 0.9 + 0.05).min(1.0)).collect(),
                state,
                action,
                done: false,
            }
        })
        .collect();
    for t in &transitions {
        agent.observe(&t.state)?;
    }
    let mut buf = ReplayBuffer::new(ReplayBuffer::DEFAULT_CAPACITY, d, cfg.seed)?;
    let t0 = Instant::now();
    for t in transitions {
        buf.push(t)?;
    }
    let push_s = t0.elapsed().as_secs_f64();

    let mut batch = Batch::with_capacity(d, BENCH_BATCH);
    let mut last_critic_loss = f32::NAN;
    let t0 = Instant::now();
    for _ in 0..steps {
        buf.sample_into(BENCH_BATCH, &mut batch)?;
        last_critic_loss = agent.train_step(&batch)?.critic_loss;
    }
    let train_s = t0.elapsed().as_secs_f64();

    let states: Vec<Vec<f32>> = (0..2000)
        .map(|_| (0..d).map(|_| rng.random_range(0.0..1.0)).collect())
        .collect();
    let mut lat = Vec::with_capacity(states.len());
    for s in &states {
        let t0 = Instant::now();
        let a = agent.act(s)?;
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
        std::hint::black_box(a);
    }
    lat.sort_by(f64::total_cmp);
    let (pa, pc) = agent.num_params();
    let gsps = steps as f64 / train_s.max(1e-12);
    Ok(BenchReport {
        actor_hidden: cfg.actor_hidden.clone(),
        critic_hidden: cfg.critic_hidden.clone(),
        params: pa + pc,
        transitions_per_s: n as f64 / push_s.max(1e-12),
        grad_steps_per_s: gsps,
        trained_transitions_per_s: gsps * BENCH_BATCH as f64,
        act_p50_us: quantile(&lat, 0.5),
        act_p99_us: quantile(&lat, 0.99),
        last_critic_loss,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_reports_measured_numbers() {
        let cfg = DdpgConfig::with_hidden(9, &[8, 8]);
        let r = bench_training(&cfg, 5).unwrap();
        assert!(r.grad_steps_per_s > 0.0 && r.grad_steps_per_s.is_finite());
        assert!(r.transitions_per_s > 0.0);
        assert!(r.act_p50_us > 0.0 && r.act_p99_us >= r.act_p50_us);
        assert!(r.last_critic_loss.is_finite());
        assert_eq!(
            r.params,
            (9 * 8 + 8 + 8 * 8 + 8 + 8 * 3 + 3) + (12 * 8 + 8 + 8 * 8 + 8 + 8 + 1)
        );
    }
}
