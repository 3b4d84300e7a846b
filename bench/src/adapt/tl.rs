//! The transfer-learning baselines (paper §5.2): FIRM's model parameter sharing.
//!
//! `TL`: a DDPG agent (the trainer's 64-64 networks, Table 2 otherwise) is trained online to
//! convergence on one source app; every new app's agent starts as a copy of it — actor, critic,
//! both targets, the state normalizer (and Adam's moments and the exploration state: the whole
//! checkpoint) — and is fine-tuned online there. `TL+`: the same with the extended state
//! `state ‖ TL+ features` ([`super::features`]), for the source agent and the new apps alike.

use aware_loadgen::AppSpec;
use aware_shared_model::{Ddpg, DdpgConfig, ModelError};

use super::features::EXTRA_DIM;
use super::{episode_seed, Learner, RunEpisode};
use crate::BenchError;
use aware_harness::train_meta::STATE_DIM;

/// How the source agent is trained.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceOptions {
    pub hidden: usize,
    pub exploration_sigma: f32,
    pub gradient_steps: u32,
    pub steps_per_episode: usize,
    /// Never stop before this many episodes.
    pub min_episodes: u32,
    /// Never train more than this many episodes.
    pub max_episodes: u32,
    /// Moving-average window of the convergence rule.
    pub window: usize,
    /// Converged when the moving average made no new high by more than `tolerance` (relative)
    /// within the last `patience` episodes.
    pub patience: usize,
    pub tolerance: f64,
    pub seed: u64,
}

/// A trained source agent.
#[derive(Debug, Clone)]
pub struct SourceAgent {
    pub agent: Ddpg,
    pub app: String,
    pub extended: bool,
    pub episodes: u32,
    /// Whether the convergence rule stopped it (false: `max_episodes` reached).
    pub converged: bool,
    /// Per-episode mean per-step reward (with exploration noise).
    pub curve: Vec<f64>,
    /// The last window's mean.
    pub final_reward: f64,
    /// Thread CPU time of the agent's work (acting, features, training).
    pub cpu_seconds: f64,
}

/// The state width of a TL (`extended` false) or TL+ agent.
pub fn state_dim(extended: bool) -> usize {
    if extended {
        STATE_DIM + EXTRA_DIM
    } else {
        STATE_DIM
    }
}

/// A fresh agent of the bench's shape.
pub fn new_agent(extended: bool, hidden: usize, sigma: f32, seed: u64) -> Result<Ddpg, ModelError> {
    let mut cfg = DdpgConfig::with_hidden(state_dim(extended), &[hidden, hidden]);
    cfg.seed = seed;
    cfg.noise.sigma = sigma;
    Ddpg::new(cfg)
}

/// The weight transfer: a new agent that is an exact copy of `source` (actor, critic, targets,
/// normalizer, optimizer moments, exploration state), through the checkpoint format so nothing
/// is shared with the source.
pub fn transfer(source: &Ddpg) -> Result<Ddpg, ModelError> {
    Ddpg::from_bytes(&source.to_bytes()?)
}

/// The convergence rule: the index (1-based episode count) at which the moving average over
/// `window` episodes made no new high by more than `tolerance` (relative) within `patience`
/// episodes, not before `min` episodes; None if never.
pub fn converged_at(
    rewards: &[f64],
    window: usize,
    patience: usize,
    tolerance: f64,
    min: usize,
) -> Option<usize> {
    let w = window.max(1);
    let ma: Vec<f64> = (w..=rewards.len())
        .map(|e| rewards[e - w..e].iter().sum::<f64>() / w as f64)
        .collect();
    // ma[i] is the average ending at episode i + w.
    (0..ma.len()).find_map(|i| {
        let e = i + w;
        if e < min.max(w + patience) {
            return None;
        }
        let before = ma[..=i - patience]
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let recent = ma[i + 1 - patience..=i]
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        (recent <= before + tolerance * before.abs()).then_some(e)
    })
}

/// Trains a source agent online on `app` until the convergence rule or `max_episodes`.
pub fn train_source(
    app: &AppSpec,
    extended: bool,
    opts: &SourceOptions,
) -> Result<SourceAgent, BenchError> {
    let agent = new_agent(
        extended,
        opts.hidden,
        opts.exploration_sigma,
        opts.seed ^ 0x50c3,
    )?;
    let mut learner = Learner::new(agent, extended, 0, opts.gradient_steps, opts.seed)?;
    let mut curve = Vec::new();
    let mut cpu = 0.0;
    let mut converged = false;
    for k in 0..opts.max_episodes {
        let ep = learner.run_episode(
            app,
            opts.steps_per_episode,
            episode_seed(opts.seed, u64::from(k)),
            RunEpisode::Agent,
        )?;
        cpu += ep.cpu_seconds;
        curve.push(ep.reward);
        if converged_at(
            &curve,
            opts.window,
            opts.patience,
            opts.tolerance,
            opts.min_episodes as usize,
        )
        .is_some()
        {
            converged = true;
            break;
        }
    }
    let w = opts.window.clamp(1, curve.len().max(1));
    let final_reward = curve.iter().rev().take(w).sum::<f64>() / w as f64;
    tracing::info!(
        app = %app.name,
        extended,
        episodes = curve.len(),
        converged,
        final_reward,
        cpu_seconds = cpu,
        "TL source agent trained"
    );
    Ok(SourceAgent {
        agent: learner.into_agent(),
        app: app.name.clone(),
        extended,
        episodes: curve.len() as u32,
        converged,
        curve,
        final_reward,
        cpu_seconds: cpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn transfer_copies_every_weight_and_nothing_is_shared() {
        let mut src = new_agent(true, 16, 0.2, 1).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let dim = state_dim(true);
        let state = |rng: &mut ChaCha8Rng| -> Vec<f32> {
            (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect()
        };
        // Train the source a little so its weights and normalizer are not the initial ones.
        let mut replay = aware_shared_model::ReplayBuffer::new(1000, dim, 3).unwrap();
        for _ in 0..200 {
            let s = state(&mut rng);
            let a = src.act_explore(&s, &mut rng).unwrap();
            replay
                .push(aware_shared_model::Transition {
                    reward: f32::from(a[0] > 0.0),
                    next_state: state(&mut rng),
                    state: s,
                    action: a,
                    done: false,
                })
                .unwrap();
        }
        for _ in 0..20 {
            src.train_step(&replay.sample(32).unwrap()).unwrap();
        }
        let fresh = new_agent(true, 16, 0.2, 9).unwrap();
        let mut copy = transfer(&src).unwrap();
        assert_eq!(copy.normalizer(), src.normalizer());
        assert_eq!(copy.train_steps(), src.train_steps());
        let probes: Vec<Vec<f32>> = (0..16).map(|_| state(&mut rng)).collect();
        for s in &probes {
            let a = src.act(s).unwrap();
            assert_eq!(copy.act(s).unwrap(), a);
            assert_eq!(copy.q_value(s, &a).unwrap(), src.q_value(s, &a).unwrap());
            assert_ne!(fresh.act(s).unwrap(), a);
        }
        // The targets are copied too: one identical update keeps them identical.
        let b = replay.sample(32).unwrap();
        let mut src2 = src.clone();
        let s1 = src2.train_step(&b).unwrap();
        let s2 = copy.train_step(&b).unwrap();
        assert_eq!(s1.critic_loss, s2.critic_loss);
        assert_eq!(src2.act(&probes[0]).unwrap(), copy.act(&probes[0]).unwrap());
        // Fine-tuning the copy leaves the source alone.
        for _ in 0..10 {
            copy.train_step(&replay.sample(32).unwrap()).unwrap();
        }
        assert_ne!(copy.act(&probes[0]).unwrap(), src.act(&probes[0]).unwrap());
    }

    #[test]
    fn convergence_rule_waits_for_a_plateau() {
        // Rising for 40 episodes, then flat.
        let r: Vec<f64> = (0..80).map(|e| f64::from(e.min(40))).collect();
        let at = converged_at(&r, 10, 20, 0.01, 30).unwrap();
        // The average is within 1% of its plateau (40) from episode 48 on (39.7); the rule
        // fires 20 episodes later.
        assert_eq!(at, 68);
        assert_eq!(converged_at(&r[..60], 10, 20, 0.01, 30), None);
        // Flat from the start: the minimum applies.
        let flat = vec![1.0; 50];
        assert_eq!(converged_at(&flat, 10, 20, 0.01, 40), Some(40));
        assert_eq!(converged_at(&flat, 10, 20, 0.01, 0), Some(30));
        assert_eq!(converged_at(&[], 10, 20, 0.01, 0), None);
    }
}
