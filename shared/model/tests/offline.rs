//! Offline training (TD3+BC) and the off-policy estimate on synthetic data where the answer is
//! known: i.i.d. states in [−1, 1]³ (the next state does not depend on the action), a behaviour
//! policy that is a fixed function of the state plus small noise, and a reward known in closed
//! form.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use aware_shared_model::{Batch, BcConfig, Ddpg, DdpgConfig, Transition, ACTION_DIM};

/// The behaviour policy's mean action: well inside [−0.45, 0.45]³.
fn behaviour(s: &[f32]) -> [f32; ACTION_DIM] {
    [0.3 * s[0], -0.3 * s[1], 0.2 * s[2] + 0.1]
}

fn state(rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..3).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// `n` behaviour transitions with reward `reward(s, a)` and i.i.d. next states.
fn dataset(
    n: usize,
    noise: f32,
    seed: u64,
    reward: impl Fn(&[f32], &[f32; ACTION_DIM]) -> f32,
) -> Vec<Transition> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut s = state(&mut rng);
    (0..n)
        .map(|_| {
            let mut a = behaviour(&s);
            for x in &mut a {
                let z: f32 = rng.sample(StandardNormal);
                *x = (*x + noise * z).clamp(-1.0, 1.0);
            }
            let next = state(&mut rng);
            let t = Transition {
                reward: reward(&s, &a),
                state: s.clone(),
                action: a,
                next_state: next.clone(),
                done: false,
            };
            s = next;
            t
        })
        .collect()
}

fn agent(seed: u64) -> Ddpg {
    let cfg = DdpgConfig {
        seed,
        gamma: 0.9,
        actor_lr: 1e-3,
        ..DdpgConfig::with_hidden(3, &[32, 32])
    };
    Ddpg::new(cfg).unwrap()
}

/// Trains on minibatches drawn from `data`: TD3+BC when `bc` is given, plain DDPG otherwise.
fn train(agent: &mut Ddpg, data: &[Transition], steps: usize, bc: Option<BcConfig>, seed: u64) {
    for t in data {
        agent.observe(&t.state).unwrap();
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for _ in 0..steps {
        let rows: Vec<Transition> = (0..64)
            .map(|_| data[rng.random_range(0..data.len())].clone())
            .collect();
        let b = Batch::from_transitions(3, &rows).unwrap();
        let st = match &bc {
            Some(c) => agent.train_step_bc(&b, c).unwrap(),
            None => agent.train_step(&b).unwrap(),
        };
        assert!(st.critic_loss.is_finite() && st.actor_loss.is_finite());
    }
}

/// The reward rises with every action dimension: the best action (+1, +1, +1) lies far outside
/// the data, where the critic has never seen an action.
fn rising(_: &[f32], a: &[f32; ACTION_DIM]) -> f32 {
    1.0 + 0.3 * a.iter().sum::<f32>()
}

#[test]
fn td3bc_stays_on_the_data_where_ddpg_extrapolates() {
    let data = dataset(4_000, 0.05, 1, rising);
    let data_max = data.iter().flat_map(|t| t.action).fold(f32::MIN, f32::max);
    assert!(data_max < 0.55, "data actions reach {data_max}");

    let mut bc = agent(7);
    train(&mut bc, &data, 2_000, Some(BcConfig::default()), 3);
    let mut plain = agent(7);
    train(&mut plain, &data, 2_000, None, 3);

    // Evaluate on the recorded states.
    let (mut gap_bc, mut max_bc, mut mean_plain) = (0.0f32, f32::MIN, 0.0f32);
    let eval = &data[..500];
    for t in eval {
        let want = behaviour(&t.state);
        let a = bc.act(&t.state).unwrap();
        gap_bc += a.iter().zip(&want).map(|(x, y)| (x - y).abs()).sum::<f32>() / 3.0;
        max_bc = a.iter().copied().fold(max_bc, f32::max);
        mean_plain += plain.act(&t.state).unwrap().iter().sum::<f32>() / 3.0;
    }
    let n = eval.len() as f32;
    let (gap_bc, mean_plain) = (gap_bc / n, mean_plain / n);
    eprintln!(
        "TD3+BC mean |π − behaviour| {gap_bc:.3}, max action {max_bc:.3}; DDPG mean action {mean_plain:.3}; data max {data_max:.3}"
    );
    assert!(
        gap_bc < 0.15,
        "TD3+BC reproduces the behaviour: gap {gap_bc}"
    );
    assert!(
        max_bc < data_max + 0.2,
        "TD3+BC stays near the data's action range: {max_bc} vs {data_max}"
    );
    assert!(
        mean_plain > data_max + 0.2,
        "unconstrained DDPG drifts out of the data: mean action {mean_plain} vs data max {data_max}"
    );
}

#[test]
fn td3bc_clones_the_behaviour_when_the_critic_is_indifferent() {
    // Constant reward: the Q term carries no preference, so only the BC term acts.
    let data = dataset(3_000, 0.02, 2, |_, _| 1.0);
    let mut bc = agent(11);
    train(&mut bc, &data, 1_500, Some(BcConfig::default()), 4);
    let mut gap = 0.0f32;
    for t in &data[..300] {
        let want = behaviour(&t.state);
        let a = bc.act(&t.state).unwrap();
        gap += a.iter().zip(&want).map(|(x, y)| (x - y).abs()).sum::<f32>() / 3.0;
    }
    let gap = gap / 300.0;
    assert!(gap < 0.06, "behaviour reproduced within {gap}");
}

/// The best action is `ideal(s)`, away from the behaviour; reward 1 − ‖a − ideal(s)‖².
fn ideal(s: &[f32]) -> [f32; ACTION_DIM] {
    [0.3 * s[0] + 0.3, -0.3 * s[1], 0.2 * s[2] - 0.2]
}

fn peaked(s: &[f32], a: &[f32; ACTION_DIM]) -> f32 {
    1.0 - ideal(s)
        .iter()
        .zip(a)
        .map(|(f, a)| (a - f).powi(2))
        .sum::<f32>()
}

#[test]
fn policy_estimate_matches_the_known_reward() {
    let data = dataset(4_000, 0.25, 5, peaked);
    let mut ag = agent(13);
    let bcfg = BcConfig {
        alpha: 10.0,
        ..BcConfig::default()
    };
    train(&mut ag, &data, 3_000, Some(bcfg), 6);
    let eval: Vec<Transition> = data[..2_000].to_vec();
    let batch = Batch::from_transitions(3, &eval).unwrap();
    let est = ag.estimate_policy(&batch).unwrap();
    // The truth: the policy's own reward on the same states (the next state does not depend on
    // the action, so the per-step reward is the whole story).
    let truth = eval
        .iter()
        .map(|t| f64::from(peaked(&t.state, &ag.act(&t.state).unwrap())))
        .sum::<f64>()
        / eval.len() as f64;
    let recorded = eval.iter().map(|t| f64::from(t.reward)).sum::<f64>() / eval.len() as f64;
    eprintln!(
        "estimate {:.4} (advantage {:.4}, direct {:.4}, gap {:.3}), truth {truth:.4}, behaviour {recorded:.4}",
        est.estimate, est.advantage, est.direct, est.action_gap
    );
    assert!((est.behaviour_reward - recorded).abs() < 1e-9);
    assert_eq!(est.rows, 2_000);
    assert!(
        truth > recorded + 0.05,
        "the policy improved on the behaviour: {truth} vs {recorded}"
    );
    // Within 0.08 of the truth (a fifth of the improvement; the critic's maximisation bias
    // over-estimates a little), and far closer than the direct (1 − γ)·mean Q, whose level the
    // critic has not reached yet.
    assert!(
        (est.estimate - truth).abs() < 0.08,
        "estimate {} vs truth {truth}",
        est.estimate
    );
    assert!((est.direct - truth).abs() > 2.0 * (est.estimate - truth).abs());
    // The estimate ranks the policy above the behaviour, as the truth does.
    assert!(est.estimate > est.behaviour_reward);
}

#[test]
fn policy_estimate_of_the_behaviour_itself_is_its_reward() {
    // Constant reward: every policy earns exactly 1.
    let data = dataset(2_000, 0.1, 8, |_, _| 1.0);
    let mut ag = agent(17);
    train(&mut ag, &data, 800, Some(BcConfig::default()), 9);
    let batch = Batch::from_transitions(3, &data[..1_000]).unwrap();
    let est = ag.estimate_policy(&batch).unwrap();
    assert!((est.behaviour_reward - 1.0).abs() < 1e-9);
    assert!((est.estimate - 1.0).abs() < 0.02, "{est:?}");
    assert!(est.action_gap < 0.2, "{est:?}");
}

#[test]
fn bc_parameters_are_validated_and_empty_batches_refused() {
    let mut ag = agent(1);
    let data = dataset(64, 0.1, 1, rising);
    let b = Batch::from_transitions(3, &data).unwrap();
    for bad in [
        BcConfig {
            alpha: f32::NAN,
            ..BcConfig::default()
        },
        BcConfig {
            bc_weight: -1.0,
            ..BcConfig::default()
        },
    ] {
        assert!(ag.train_step_bc(&b, &bad).is_err());
    }
    assert_eq!(ag.train_steps(), 0);
    assert!(ag
        .estimate_policy(&Batch::from_transitions(3, &[]).unwrap())
        .is_err());
    let st = ag.train_step_bc(&b, &BcConfig::default()).unwrap();
    assert!(st.bc_loss > 0.0 && st.bc_loss.is_finite());
}
