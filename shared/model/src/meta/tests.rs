use super::*;
use crate::checkpoint::fnv1a;
use crate::Transition;

fn small(seed: u64) -> MetaConfig {
    MetaConfig {
        state_dim: 3,
        hidden: 6,
        layers: 2,
        fc_hidden: 8,
        embed_dim: 4,
        activation: EmbedActivation::Tanh,
        bundle_size: 3,
        seed,
        ..MetaConfig::default()
    }
}

/// A bundle of `m` episodes of `t` steps from a workload with "load level" `level`.
fn bundle(m: usize, t: usize, level: f32, seed: u64) -> EpisodeBundle {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let eps = (0..m)
        .map(|_| {
            (0..t)
                .flat_map(|i| {
                    let s = [
                        level + 0.1 * rng.random_range(-1.0f32..1.0),
                        (i as f32 * 0.3 * level).sin(),
                        rng.random_range(0.0..1.0),
                    ];
                    let a = [rng.random_range(-1.0..1.0), 0.0, level - 0.5];
                    EpisodeBundle::step_vector(&s, &a, 1.0 - (level - 0.5).abs())
                })
                .collect()
        })
        .collect();
    EpisodeBundle::new(3, eps).unwrap()
}

fn batch(n: usize, level: f32, seed: u64) -> Batch {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut b = Batch::with_capacity(3, n);
    for _ in 0..n {
        let s: Vec<f32> = (0..3).map(|_| rng.random_range(-1.0..1.0)).collect();
        let a = [
            rng.random_range(-1.0..1.0),
            rng.random_range(-1.0..1.0),
            rng.random_range(-1.0..1.0),
        ];
        b.push(&Transition {
            reward: -(a[0] - level).powi(2),
            next_state: s.clone(),
            state: s,
            action: a,
            done: false,
        })
        .unwrap();
    }
    b
}

fn agent(seed: u64) -> MetaDdpg {
    MetaDdpg::new(
        DdpgConfig {
            seed,
            ..DdpgConfig::with_hidden(3, &[16, 16])
        },
        small(seed),
    )
    .unwrap()
}

#[test]
fn output_shapes_and_ranges() {
    let m = MetaLearner::new(small(1)).unwrap();
    let e = m.embed(&bundle(3, 7, 0.2, 1)).unwrap();
    assert_eq!(e.len(), 4);
    assert!(e.iter().all(|x| x.is_finite() && x.abs() <= 1.0));
    // Any M and T work for a single bundle; several bundles of one shape in one pass agree with
    // one-by-one embeddings.
    assert_eq!(m.embed(&bundle(1, 1, 0.2, 1)).unwrap().len(), 4);
    let (b1, b2) = (bundle(2, 5, 0.2, 2), bundle(2, 5, 0.9, 3));
    let many = m.embed_many(&[&b1, &b2]).unwrap();
    assert_eq!(many.len(), 2);
    for (got, b) in many.iter().zip([&b1, &b2]) {
        let one = m.embed(b).unwrap();
        for (x, y) in got.iter().zip(&one) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
    }
    assert!(m.embed_many(&[&b1, &bundle(3, 5, 0.2, 1)]).is_err());
    // ReLU output is non-negative; paper sizes have the expected parameter count.
    let relu = MetaLearner::new(MetaConfig {
        activation: EmbedActivation::Relu,
        ..small(1)
    })
    .unwrap();
    assert!(relu
        .embed(&bundle(3, 7, 0.2, 1))
        .unwrap()
        .iter()
        .all(|x| *x >= 0.0));
    let (g, h) = MetaLearner::new(MetaConfig::paper()).unwrap().num_params();
    let hh = 256;
    let layer = |i: usize| 2 * (i * 3 * hh + 3 * hh + hh * 3 * hh + 3 * hh);
    assert_eq!(g, layer(13) + layer(2 * hh));
    assert_eq!(h, 2 * hh * 256 + 256 + 256 * 64 + 64);
}

#[test]
fn the_embedding_depends_on_the_order_and_on_every_episode() {
    let m = MetaLearner::new(small(2)).unwrap();
    let b = bundle(3, 6, 0.4, 5);
    let e0 = m.embed(&b).unwrap();
    // Reversing time changes the embedding (it is a sequence model, not a bag of steps)...
    let w = 3 + STEP_EXTRA;
    let rev: Vec<Vec<f32>> = b
        .episodes
        .iter()
        .map(|e| e.chunks(w).rev().flatten().copied().collect())
        .collect();
    assert_ne!(m.embed(&EpisodeBundle::new(3, rev).unwrap()).unwrap(), e0);
    // ...permuting episodes does not (mean pooling over the bundle)...
    let mut perm = b.episodes.clone();
    perm.rotate_left(1);
    let ep = m.embed(&EpisodeBundle::new(3, perm).unwrap()).unwrap();
    for (x, y) in ep.iter().zip(&e0) {
        assert!((x - y).abs() < 1e-5);
    }
    // ...and changing one value of one episode does.
    let mut one = b.episodes.clone();
    one[2][5] += 0.5;
    assert_ne!(m.embed(&EpisodeBundle::new(3, one).unwrap()).unwrap(), e0);
}

#[test]
fn deterministic_with_a_seed() {
    let b = bundle(3, 6, 0.4, 5);
    let (m1, m2, m3) = (
        MetaLearner::new(small(7)).unwrap(),
        MetaLearner::new(small(7)).unwrap(),
        MetaLearner::new(small(8)).unwrap(),
    );
    assert_eq!(m1.embed(&b).unwrap(), m2.embed(&b).unwrap());
    assert_ne!(m1.embed(&b).unwrap(), m3.embed(&b).unwrap());
    let (mut a1, mut a2) = (agent(3), agent(3));
    let (bd, bt) = (bundle(3, 6, 0.4, 5), batch(16, 0.3, 1));
    let g = [MetaGroup {
        bundle: &bd,
        batch: &bt,
    }];
    for _ in 0..3 {
        assert_eq!(a1.train_step(&g).unwrap(), a2.train_step(&g).unwrap());
    }
    assert_eq!(a1.meta().parameters(), a2.meta().parameters());
}

#[test]
fn nan_inputs_are_errors_not_nan_outputs() {
    let mut eps = bundle(2, 4, 0.3, 1).episodes;
    eps[1][3] = f32::NAN;
    assert!(matches!(
        EpisodeBundle::new(3, eps.clone()),
        Err(ModelError::NonFinite { .. })
    ));
    eps[1][3] = f32::INFINITY;
    assert!(EpisodeBundle::new(3, eps).is_err());
    // Ragged, empty and mis-sized bundles.
    let ok = bundle(2, 4, 0.3, 1).episodes;
    let mut ragged = ok.clone();
    ragged[1].truncate(7 * 2);
    assert!(matches!(
        EpisodeBundle::new(3, ragged.clone()),
        Err(ModelError::Dimension { .. })
    ));
    assert_eq!(EpisodeBundle::truncated(3, ragged).unwrap().len(), 2);
    assert!(EpisodeBundle::new(3, vec![]).is_err());
    assert!(EpisodeBundle::new(3, vec![vec![]]).is_err());
    let m = MetaLearner::new(small(1)).unwrap();
    assert!(matches!(
        m.embed(&EpisodeBundle::new(4, vec![vec![0.0; 8]]).unwrap()),
        Err(ModelError::Dimension { .. })
    ));
    // A NaN weight gives an error, not a NaN embedding.
    let mut broken = m.clone();
    let mut p = broken.head.export();
    let last = p.len() - 1;
    p[last][0] = f32::NAN;
    broken.head.import(&p).unwrap();
    assert!(matches!(
        broken.embed(&bundle(2, 4, 0.3, 1)),
        Err(ModelError::NonFinite { what: "embedding" })
    ));
    // The agent refuses NaN states, embeddings and batches, and leaves its weights alone.
    let mut a = agent(1);
    let e = a.embed(&bundle(2, 4, 0.3, 1)).unwrap();
    assert!(a.act(&[0.0, f32::NAN, 0.0], &e).is_err());
    assert!(a.act(&[0.0, 0.0, 0.0], &[f32::NAN; 4]).is_err());
    assert!(a.act(&[0.0, 0.0], &e).is_err());
    let before = a.meta().parameters();
    let bd = bundle(2, 4, 0.3, 1);
    let mut bt = batch(8, 0.3, 1);
    bt.rewards[2] = f32::NAN;
    assert!(a
        .train_step(&[MetaGroup {
            bundle: &bd,
            batch: &bt
        }])
        .is_err());
    assert_eq!(a.meta().parameters(), before);
    assert_eq!(a.base().train_steps(), 0);
}

#[test]
fn actor_loss_trains_the_meta_learner_and_nothing_flows_when_detached() {
    let (b1, b2) = (bundle(3, 6, 0.1, 1), bundle(3, 6, 0.9, 2));
    let (t1, t2) = (batch(16, -0.5, 3), batch(16, 0.5, 4));
    let groups = [
        MetaGroup {
            bundle: &b1,
            batch: &t1,
        },
        MetaGroup {
            bundle: &b2,
            batch: &t2,
        },
    ];
    // The actor loss alone (critic weight 0) reaches every GRU and head parameter.
    let mut a = MetaDdpg::new(
        DdpgConfig {
            seed: 5,
            ..DdpgConfig::with_hidden(3, &[16, 16])
        },
        MetaConfig {
            critic_weight: 0.0,
            ..small(5)
        },
    )
    .unwrap();
    let before = a.meta().parameters();
    let st = a.train_step(&groups).unwrap();
    assert!(st.meta_grad_norm > 0.0, "{st:?}");
    let after = a.meta().parameters();
    let changed = before.iter().zip(&after).filter(|(x, y)| x != y).count();
    assert!(
        changed > before.len() * 9 / 10,
        "{changed}/{}",
        before.len()
    );
    assert_eq!(a.meta().train_steps(), 1);
    // With the critic's TD loss as well the gradient differs (both losses contribute).
    let mut both = agent(5);
    assert_eq!(both.meta().parameters(), before);
    let st2 = both.train_step(&groups).unwrap();
    assert!(st2.meta_grad_norm > 0.0 && st2.meta_grad_norm != st.meta_grad_norm);
    assert_ne!(both.meta().parameters(), after);

    let mut frozen = agent(5);
    frozen.set_meta_trainable(false);
    let st = frozen.train_step(&groups).unwrap();
    assert_eq!(st.meta_grad_norm, 0.0);
    assert_eq!(frozen.meta().parameters(), before);
    assert_eq!(frozen.meta().train_steps(), 0);
    // The base-learner still trained.
    assert_eq!(frozen.base().train_steps(), 1);
}

/// Backpropagation through time matches finite differences of the embedding.
#[test]
fn gru_gradients_match_finite_differences() {
    let cfg = MetaConfig {
        hidden: 4,
        fc_hidden: 3,
        embed_dim: 2,
        ..small(9)
    };
    let m = MetaLearner::new(cfg).unwrap();
    let (b1, b2) = (bundle(2, 4, 0.3, 1), bundle(2, 4, 0.8, 2));
    let bundles = [&b1, &b2];
    // Loss: Σ_k Σ_j c_j · e_kj with fixed weights c.
    let c = [0.7f32, -1.3];
    let loss_of = |m: &MetaLearner| -> f64 {
        m.embed_many(&bundles)
            .unwrap()
            .iter()
            .flat_map(|e| e.iter().zip(&c).map(|(x, w)| f64::from(x * w)))
            .sum()
    };
    let e = m.forward::<gru::Taped>(&bundles).unwrap();
    let weights = net::mat(&m.dev, vec![0.7, -1.3, 0.7, -1.3], 2, 2);
    let mut grads = net::backward(gru::weighted_sum(e, weights));
    // Check a few entries of every GRU block (both layers, both directions, W and U, biases)
    // and of the head.
    let mut checked = 0;
    for (net_i, bag) in [&m.gru, &m.head].into_iter().enumerate() {
        for li in 0..bag.layers.len() {
            for which in 0..2 {
                let g = {
                    let l = &bag.layers[li];
                    if which == 0 {
                        grads.get_or_alloc_mut(&l.w).unwrap().to_vec()
                    } else {
                        grads.get_or_alloc_mut(&l.b).unwrap().to_vec()
                    }
                };
                for idx in [0, g.len() / 2, g.len() - 1] {
                    let eps = 1e-2f32;
                    let bump = |delta: f32| -> f64 {
                        let mut mm = m.clone();
                        let target = if net_i == 0 {
                            &mut mm.gru
                        } else {
                            &mut mm.head
                        };
                        let mut p = target.export();
                        p[2 * li + which][idx] += delta;
                        target.import(&p).unwrap();
                        loss_of(&mm)
                    };
                    let fd = (bump(eps) - bump(-eps)) / (2.0 * f64::from(eps));
                    let an = f64::from(g[idx]);
                    assert!(
                        (fd - an).abs() <= 2e-3 + 2e-2 * fd.abs().max(an.abs()),
                        "net {net_i} layer {li} {} [{idx}]: finite difference {fd} vs backprop {an}",
                        if which == 0 { "w" } else { "b" }
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 3 * 2 * (8 + 2));
}

#[test]
fn checkpoint_round_trip_and_corruption() {
    let mut a = agent(4);
    let (bd, bt) = (bundle(3, 6, 0.4, 5), batch(16, 0.3, 1));
    let g = [MetaGroup {
        bundle: &bd,
        batch: &bt,
    }];
    for s in bt.states.chunks(3) {
        a.observe(s).unwrap();
    }
    for _ in 0..3 {
        a.train_step(&g).unwrap();
    }
    let meta_bytes = a.meta().to_bytes().unwrap();
    let base_bytes = a.base().to_bytes().unwrap();
    let m2 = MetaLearner::from_bytes(&meta_bytes).unwrap();
    assert_eq!(m2.config(), a.meta().config());
    assert_eq!(m2.train_steps(), 3);
    assert_eq!(m2.parameters(), a.meta().parameters());
    assert_eq!(m2.to_bytes().unwrap(), meta_bytes);
    let mut b = MetaDdpg::from_parts(Ddpg::from_bytes(&base_bytes).unwrap(), m2).unwrap();
    let e = a.embed(&bd).unwrap();
    assert_eq!(e, b.embed(&bd).unwrap());
    let s = [0.2, -0.4, 0.9];
    assert_eq!(a.act(&s, &e).unwrap(), b.act(&s, &e).unwrap());
    // The base checkpoint alone is a plain DDPG over state ‖ embedding.
    let plain = Ddpg::from_bytes(&base_bytes).unwrap();
    let mut full = s.to_vec();
    full.extend_from_slice(&e);
    assert_eq!(plain.act(&full).unwrap(), a.act(&s, &e).unwrap());
    // Optimizer state survived: the next joint step is identical.
    assert_eq!(a.train_step(&g).unwrap(), b.train_step(&g).unwrap());
    assert_eq!(a.meta().parameters(), b.meta().parameters());

    // Corruption.
    for cut in [0, 4, 8, 12, 20, meta_bytes.len() / 2, meta_bytes.len() - 1] {
        assert!(MetaLearner::from_bytes(&meta_bytes[..cut]).is_err());
    }
    let mut flipped = meta_bytes.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 1;
    assert!(matches!(
        MetaLearner::from_bytes(&flipped),
        Err(ModelError::Checksum)
    ));
    let mut version = meta_bytes.clone();
    version[8] = 7;
    assert!(matches!(
        MetaLearner::from_bytes(&version),
        Err(ModelError::UnsupportedVersion { found: 7, .. })
    ));
    // A DDPG checkpoint is not a meta-learner checkpoint and vice versa.
    assert!(matches!(
        MetaLearner::from_bytes(&base_bytes),
        Err(ModelError::BadMagic)
    ));
    assert!(matches!(
        Ddpg::from_bytes(&meta_bytes),
        Err(ModelError::BadMagic)
    ));
    // A header whose config disagrees with the blocks, re-signed.
    let body = &meta_bytes[..meta_bytes.len() - 8];
    let hlen = u32::from_le_bytes([body[12], body[13], body[14], body[15]]) as usize;
    let header = std::str::from_utf8(&body[16..16 + hlen]).unwrap();
    let wider = header.replacen("\"hidden\":6", "\"hidden\":7", 1);
    assert_ne!(wider, header);
    let mut bad = body[..12].to_vec();
    bad.extend_from_slice(&(wider.len() as u32).to_le_bytes());
    bad.extend_from_slice(wider.as_bytes());
    bad.extend_from_slice(&body[16 + hlen..]);
    let s = fnv1a(&bad);
    bad.extend_from_slice(&s.to_le_bytes());
    assert!(matches!(
        MetaLearner::from_bytes(&bad),
        Err(ModelError::ShapeMismatch { .. })
    ));
    // Mismatched parts.
    let other = MetaLearner::new(MetaConfig {
        embed_dim: 5,
        ..small(1)
    })
    .unwrap();
    assert!(MetaDdpg::from_parts(Ddpg::from_bytes(&base_bytes).unwrap(), other).is_err());
}

#[test]
fn conditioned_policy_separates_two_workloads() {
    // Two workloads whose best replica action differs (−0.5 vs +0.5); the only thing telling
    // them apart at a state is the embedding. After joint training the policy follows it.
    let (b1, b2) = (bundle(3, 6, 0.1, 1), bundle(3, 6, 0.9, 2));
    let mut a = MetaDdpg::new(
        DdpgConfig {
            seed: 6,
            actor_lr: 1e-3,
            ..DdpgConfig::with_hidden(3, &[32, 32])
        },
        MetaConfig {
            lr: 1e-3,
            ..small(6)
        },
    )
    .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for it in 0..400 {
        let (t1, t2) = (batch(32, -0.5, 2 * it), batch(32, 0.5, 2 * it + 1));
        for s in t1.states.chunks(3) {
            a.observe(s).unwrap();
        }
        a.train_step(&[
            MetaGroup {
                bundle: &b1,
                batch: &t1,
            },
            MetaGroup {
                bundle: &b2,
                batch: &t2,
            },
        ])
        .unwrap();
    }
    let (e1, e2) = (a.embed(&b1).unwrap(), a.embed(&b2).unwrap());
    let mut gap = 0.0;
    for _ in 0..20 {
        let s: Vec<f32> = (0..3).map(|_| rng.random_range(-1.0..1.0)).collect();
        let (x1, x2) = (a.act(&s, &e1).unwrap()[0], a.act(&s, &e2).unwrap()[0]);
        gap += x2 - x1;
    }
    println!("embeddings {e1:?} {e2:?}, mean action gap {}", gap / 20.0);
    assert!(gap / 20.0 > 0.3, "mean action gap {}", gap / 20.0);
}

#[test]
fn base_steps_with_fixed_embeddings_train_the_base_learner_only() {
    let (b1, b2) = (bundle(3, 6, 0.1, 1), bundle(3, 6, 0.9, 2));
    let mut a = agent(7);
    let (e1, e2) = (a.embed(&b1).unwrap(), a.embed(&b2).unwrap());
    let meta_before = a.meta().parameters();
    let s = [0.2f32, -0.1, 0.4];
    let act_before = a.act(&s, &e1).unwrap();
    let st = a
        .train_base_step(
            &[e1.clone(), e2.clone()],
            &[batch(16, -0.5, 3), batch(16, 0.5, 4)],
        )
        .unwrap();
    assert!(st.critic_loss.is_finite());
    assert_eq!(a.base().train_steps(), 1);
    assert_eq!(a.meta().parameters(), meta_before);
    assert_eq!(a.meta().train_steps(), 0);
    assert_ne!(a.act(&s, &e1).unwrap(), act_before);
    // The same as a plain DDPG step on the joined rows.
    let twin = agent(7);
    let mut joined = Batch::with_capacity(3 + e1.len(), 32);
    for (e, b) in [(&e1, batch(16, -0.5, 3)), (&e2, batch(16, 0.5, 4))] {
        for i in 0..b.len() {
            let mut st = b.states[i * 3..(i + 1) * 3].to_vec();
            st.extend_from_slice(e);
            let mut ns = b.next_states[i * 3..(i + 1) * 3].to_vec();
            ns.extend_from_slice(e);
            joined
                .push(&Transition {
                    state: st,
                    action: [b.actions[i * 3], b.actions[i * 3 + 1], b.actions[i * 3 + 2]],
                    reward: b.rewards[i],
                    next_state: ns,
                    done: false,
                })
                .unwrap();
        }
    }
    let (mut base, _) = twin.into_parts();
    base.train_step(&joined).unwrap();
    let row = &joined.states[..3 + e1.len()];
    assert_eq!(base.act(row).unwrap(), a.base().act(row).unwrap());
    // Wrong shapes are errors and change nothing.
    let steps = a.base().train_steps();
    assert!(a
        .train_base_step(
            std::slice::from_ref(&e1),
            &[batch(4, 0.0, 5), batch(4, 0.0, 6)]
        )
        .is_err());
    assert!(a
        .train_base_step(&[vec![0.0; 2]], &[batch(4, 0.0, 5)])
        .is_err());
    assert!(a.train_base_step(&[], &[]).is_err());
    assert_eq!(a.base().train_steps(), steps);
}

#[test]
fn agent_is_send() {
    fn is_send<T: Send + 'static>() {}
    is_send::<MetaDdpg>();
    is_send::<MetaLearner>();
}

#[test]
fn joint_updates_respect_the_target_bounds() {
    // Never-ending reward 1 (true value 100): the joint update's critic target is clamped to the
    // configured bounds, so Q settles at the bound instead of climbing past it.
    let run = |bounds: Option<[f32; 2]>| {
        let mut a = MetaDdpg::new(
            DdpgConfig {
                seed: 4,
                tau: 0.5,
                target_bounds: bounds,
                ..DdpgConfig::with_hidden(3, &[16, 16])
            },
            small(4),
        )
        .unwrap();
        let (bu, ba) = (
            bundle(2, 5, 0.3, 1),
            crate::ddpg::tests::endless_reward_one(32),
        );
        let mut q = 0.0;
        for _ in 0..400 {
            q = a
                .train_step(&[MetaGroup {
                    bundle: &bu,
                    batch: &ba,
                }])
                .unwrap()
                .mean_q;
        }
        q
    };
    let free = run(None);
    let capped = run(Some([0.0, 10.0]));
    assert!(free > 20.0, "unclamped Q {free} should climb towards 100");
    assert!((8.0..=10.5).contains(&capped), "clamped Q {capped}");
}
