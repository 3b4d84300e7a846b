//! DDPG must learn: a deterministic contextual control task where the best action is a fixed
//! function of the state.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use aware_shared_model::{Ddpg, DdpgConfig, ReplayBuffer, Transition, ACTION_DIM};

/// The ideal action for a state in [−1, 1]³ (inside [−1, 1]³).
fn ideal(s: &[f32]) -> [f32; ACTION_DIM] {
    [0.6 * s[0] - 0.3 * s[1], 0.8 * s[2], -0.5 * s[0] + 0.4]
}

fn reward(s: &[f32], a: &[f32; ACTION_DIM]) -> f32 {
    -ideal(s)
        .iter()
        .zip(a)
        .map(|(f, a)| (a - f).powi(2))
        .sum::<f32>()
}

fn state(rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..3).map(|_| rng.random_range(-1.0..1.0)).collect()
}

#[test]
fn ddpg_beats_random_policy_on_one_step_control() {
    let cfg = DdpgConfig {
        seed: 42,
        actor_lr: 1e-3,
        ..DdpgConfig::with_hidden(3, &[32, 32])
    };
    let mut agent = Ddpg::new(cfg).unwrap();
    let mut env_rng = ChaCha8Rng::seed_from_u64(1);
    let mut noise_rng = ChaCha8Rng::seed_from_u64(2);
    let mut buf = ReplayBuffer::new(ReplayBuffer::DEFAULT_CAPACITY, 3, 3).unwrap();
    let steps = 1500;
    for t in 0..steps {
        // One-step episodes: explore, store, learn.
        let s = state(&mut env_rng);
        let a = agent.act_explore(&s, &mut noise_rng).unwrap();
        let r = reward(&s, &a);
        buf.push(Transition {
            state: s.clone(),
            action: a,
            reward: r,
            next_state: s,
            done: true,
        })
        .unwrap();
        if t >= 64 {
            let b = buf.sample(64).unwrap();
            let st = agent.train_step(&b).unwrap();
            assert!(st.critic_loss.is_finite());
        }
    }
    agent.normalizer_mut().freeze();

    let mut eval_rng = ChaCha8Rng::seed_from_u64(99);
    let mut rand_rng = ChaCha8Rng::seed_from_u64(100);
    let (mut trained, mut random) = (0.0f32, 0.0f32);
    let n = 500;
    for _ in 0..n {
        let s = state(&mut eval_rng);
        trained += reward(&s, &agent.act(&s).unwrap());
        let ra = [
            rand_rng.random_range(-1.0..1.0),
            rand_rng.random_range(-1.0..1.0),
            rand_rng.random_range(-1.0..1.0),
        ];
        random += reward(&s, &ra);
    }
    let (trained, random) = (trained / n as f32, random / n as f32);
    eprintln!("learning test: trained mean reward {trained:.4}, random {random:.4}");
    // Random ≈ −1.4; an untrained (≈ zero-action) policy ≈ −0.43; require far better.
    assert!(random < -1.0, "random baseline {random}");
    assert!(trained > -0.1, "trained mean reward {trained}");
    assert!(
        trained > random * 0.1,
        "trained {trained} vs random {random}"
    );
}

/// Reward grows with every action component: the critic pushes the actor to +1. Without the
/// pre-activation penalty the actor runs deep into tanh saturation (where its gradient vanishes
/// and it could never come back if the critic changed its mind); with it, it stays just inside.
fn saturation_after_training(penalty: f32) -> f32 {
    let cfg = DdpgConfig {
        seed: 7,
        actor_lr: 1e-3,
        actor_preactivation_penalty: penalty,
        ..DdpgConfig::with_hidden(3, &[32, 32])
    };
    let mut agent = Ddpg::new(cfg).unwrap();
    let mut env_rng = ChaCha8Rng::seed_from_u64(3);
    let mut noise_rng = ChaCha8Rng::seed_from_u64(4);
    let mut buf = ReplayBuffer::new(ReplayBuffer::DEFAULT_CAPACITY, 3, 5).unwrap();
    for t in 0..2000 {
        let s = state(&mut env_rng);
        let a = agent.act_explore(&s, &mut noise_rng).unwrap();
        buf.push(Transition {
            state: s.clone(),
            action: a,
            reward: a.iter().sum(),
            next_state: s,
            done: true,
        })
        .unwrap();
        if t >= 64 {
            agent.train_step(&buf.sample(64).unwrap()).unwrap();
        }
    }
    let mut eval_rng = ChaCha8Rng::seed_from_u64(9);
    let n = 200;
    let mut min_gap = f32::INFINITY;
    for _ in 0..n {
        let a = agent.act(&state(&mut eval_rng)).unwrap();
        for x in a {
            min_gap = min_gap.min(1.0 - x);
        }
    }
    min_gap
}

#[test]
fn the_preactivation_penalty_keeps_the_actor_out_of_saturation() {
    let without = saturation_after_training(0.0);
    let with = saturation_after_training(1e-2);
    eprintln!("distance of the closest action to +1: without {without:e}, with {with:e}");
    // both learned to push towards +1 ...
    assert!(with < 0.1, "with penalty {with}");
    // ... but only the unpenalized actor is saturated (tanh' ≈ 0 there)
    assert!(without < 1e-4, "without penalty {without}");
    assert!(with > 1e-3, "with penalty {with}");
}
