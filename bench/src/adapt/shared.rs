//! The `aware_shared` arm: one base-learner per kind of workload, shared by every app of the
//! kind and conditioned on each app's embedding (issue 38, item 2), against `aware`'s copy of
//! the base-learner per app.
//!
//! The held-out apps of a repetition are one kind: they bootstrap from the same meta-learner.
//! Episode k runs on every app in turn, each with the one network and its own embedding
//! (computed as `aware` computes it, from the app's own top-M episodes). After each of an app's
//! transitions the network makes the gradient steps a per-app learner would make, on
//! minibatches drawn from every embedded app's replay in proportion to its size, each row with
//! its own app's embedding. The gradient steps summed over the kind are the per-app arm's sum;
//! what differs is that one network learns from the whole kind's data, and that one network is
//! kept instead of one per app.

use super::{
    app_seed, bundle_of, episode_seed, fail, keep_top, train_meta, AdaptBenchOptions, AppSpec,
    ArmRun, BenchError, Learner, MetaDdpg, RunEpisode, BATCH,
};
use aware_shared_model::Batch;
use cpu_time::ThreadTime;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The shared arm on one kind: each app's per-episode figures, and the minibatch rows drawn
/// from each app's replay (both in the order of the apps).
pub(crate) struct SharedRun {
    pub runs: Vec<ArmRun>,
    pub rows_drawn: Vec<u64>,
    pub updates: u64,
}

/// What makes a kind: the apps that share one network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kinds {
    /// All of a repetition's apps.
    #[default]
    All,
    /// A repetition's apps of one SLO class (latency, throughput, best-effort).
    SloClass,
}

/// The shared arm on every kind of `apps`: each app's per-episode figures and rows drawn, in
/// the order of `apps`, and the gradient steps summed over the kinds.
pub(crate) fn run_kinds(
    opts: &AdaptBenchOptions,
    apps: &[AppSpec],
    held_seed: u64,
    meta: &MetaDdpg,
) -> Result<SharedRun, BenchError> {
    let kind_of = |a: &AppSpec| match opts.shared_kinds {
        Kinds::All => 0,
        Kinds::SloClass => super::SloClass::ALL
            .iter()
            .position(|c| *c == super::SloClass::of(&a.slo))
            .unwrap_or(0),
    };
    let mut out = SharedRun {
        runs: vec![ArmRun::default(); apps.len()],
        rows_drawn: vec![0; apps.len()],
        updates: 0,
    };
    let mut kinds: Vec<usize> = apps.iter().map(kind_of).collect();
    kinds.sort_unstable();
    kinds.dedup();
    for k in kinds {
        let members: Vec<(usize, AppSpec)> = apps
            .iter()
            .enumerate()
            .filter(|(_, a)| kind_of(a) == k)
            .map(|(i, a)| (i, a.clone()))
            .collect();
        let r = run_shared(opts, &members, held_seed, meta)?;
        for (((i, _), run), rows) in members.iter().zip(r.runs).zip(r.rows_drawn) {
            out.runs[*i] = run;
            out.rows_drawn[*i] = rows;
        }
        out.updates += r.updates;
    }
    Ok(out)
}

/// Runs the shared arm on `apps` (one kind; each with its index among the repetition's apps,
/// which seeds it as in the other arms).
pub(crate) fn run_shared(
    opts: &AdaptBenchOptions,
    apps: &[(usize, AppSpec)],
    held_seed: u64,
    meta: &MetaDdpg,
) -> Result<SharedRun, BenchError> {
    let (mut shared, learner) = meta.clone().into_parts();
    shared.set_exploration_sigma(opts.fine_tune_sigma)?;
    let m = learner.config().bundle_size;
    let embed_dim = learner.config().embed_dim;
    let gs = opts.gradient_steps as usize;
    let mut members: Vec<Option<Learner>> = Vec::with_capacity(apps.len());
    for (index, _) in apps {
        // Each app keeps its replay, embedding, exploration RNG and features; its `agent`
        // slot holds the shared network only while the app runs.
        let l = Learner::new(
            shared.clone(),
            false,
            embed_dim,
            opts.gradient_steps,
            app_seed(held_seed, *index),
        )?;
        members.push(Some(l));
    }
    shared.normalizer_mut().unfreeze();
    shared.reset_noise();
    let mut stores: Vec<Vec<train_meta::Episode>> = vec![Vec::new(); apps.len()];
    let mut fallback_transitions = vec![0usize; apps.len()];
    let mut runs: Vec<ArmRun> = (0..apps.len())
        .map(|_| ArmRun {
            learns: true,
            policy_from: opts.fallback_episodes,
            ..ArmRun::default()
        })
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(held_seed ^ 0x5a4e_d0c5);
    let mut trained = Trained {
        updates: 0,
        warmup: opts.critic_warmup_updates(),
        rows_drawn: vec![0; apps.len()],
    };
    for k in 0..opts.episodes {
        for (i, (index, app)) in apps.iter().enumerate() {
            let seed = episode_seed(app_seed(held_seed, *index), k as u64);
            let mut me = members[i]
                .take()
                .ok_or_else(|| fail(format!("shared arm: app {i} is already running")))?;
            std::mem::swap(&mut me.agent, &mut shared);
            let ran = (|| -> Result<(), BenchError> {
                if k < opts.fallback_episodes {
                    let ep = me.run_episode(
                        app,
                        opts.steps_per_episode,
                        seed,
                        RunEpisode::FallbackRule,
                    )?;
                    fallback_transitions[i] += opts.steps_per_episode;
                    keep_top(&mut stores[i], ep.as_meta_episode(true), m);
                    runs[i].push(&ep);
                    return Ok(());
                }
                let agent_k = k - opts.fallback_episodes;
                let t = ThreadTime::now();
                if agent_k.is_multiple_of(opts.embedding_refresh.max(1)) {
                    let e = learner.embed(&bundle_of(&stores[i], m)?)?;
                    me.set_embedding(e)?;
                    if agent_k == 0 {
                        // The fallback transitions' gradient steps, as `aware` makes them.
                        train_kind(
                            i,
                            &mut me,
                            &mut members,
                            &mut rng,
                            fallback_transitions[i] * gs,
                            &mut trained,
                        )?;
                    }
                }
                let extra = t.elapsed().as_secs_f64();
                let mut ep = me.run_episode_with(
                    app,
                    opts.steps_per_episode,
                    seed,
                    RunEpisode::Agent,
                    |l| train_kind(i, l, &mut members, &mut rng, gs, &mut trained),
                )?;
                ep.cpu_seconds += extra;
                keep_top(&mut stores[i], ep.as_meta_episode(false), m);
                runs[i].push(&ep);
                Ok(())
            })();
            std::mem::swap(&mut me.agent, &mut shared);
            members[i] = Some(me);
            ran?;
        }
    }
    Ok(SharedRun {
        runs,
        rows_drawn: trained.rows_drawn,
        updates: trained.updates,
    })
}

/// The shared network's gradient-step count, its critic-only warm-up, and the rows drawn from
/// each app's replay.
struct Trained {
    updates: u64,
    warmup: u64,
    rows_drawn: Vec<u64>,
}

/// `n` gradient steps of the shared network (in `me`'s agent slot) on minibatches drawn from
/// every embedded app of the kind, in proportion to its replay's size, each row with its own
/// app's embedding. None before a minibatch's worth of embedded transitions.
fn train_kind(
    me_index: usize,
    me: &mut Learner,
    others: &mut [Option<Learner>],
    rng: &mut ChaCha8Rng,
    n: usize,
    trained: &mut Trained,
) -> Result<(), BenchError> {
    let Some(mine) = me.embedding.clone() else {
        return Ok(());
    };
    let sizes: Vec<usize> = others
        .iter()
        .map(|o| {
            o.as_ref()
                .filter(|l| l.embedding.is_some())
                .map_or(0, |l| l.replay.len())
        })
        .collect();
    let own = me.replay.len();
    let total = own + sizes.iter().sum::<usize>();
    if total < BATCH {
        return Ok(());
    }
    let mut counts = vec![0usize; others.len()];
    for _ in 0..n {
        counts.iter_mut().for_each(|c| *c = 0);
        let mut own_n = 0;
        for _ in 0..BATCH {
            let mut u = rng.random_range(0..total);
            if u < own {
                own_n += 1;
                continue;
            }
            u -= own;
            for (c, s) in counts.iter_mut().zip(&sizes) {
                if u < *s {
                    *c += 1;
                    break;
                }
                u -= s;
            }
        }
        let mut b = Batch::with_capacity(me.replay.state_dim() + mine.len(), BATCH);
        if own_n > 0 {
            b.extend(&me.replay.sample(own_n)?.with_suffix(&mine))?;
            trained.rows_drawn[me_index] += own_n as u64;
        }
        for (j, (o, &c)) in others.iter_mut().zip(&counts).enumerate() {
            if c == 0 {
                continue;
            }
            if let Some(l) = o {
                if let Some(e) = &l.embedding {
                    b.extend(&l.replay.sample(c)?.with_suffix(e))?;
                    trained.rows_drawn[j] += c as u64;
                }
            }
        }
        if trained.updates < trained.warmup {
            me.agent.train_critic_step(&b)?;
        } else {
            me.agent.train_step(&b)?;
        }
        trained.updates += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_harness::train_meta::{tiny_meta, STATE_DIM};
    use aware_loadgen::app::{generate_apps, GeneratorOptions};
    use aware_shared_model::{DdpgConfig, MetaConfig};

    fn meta() -> MetaDdpg {
        MetaDdpg::new(
            DdpgConfig {
                seed: 7,
                ..DdpgConfig::with_hidden(STATE_DIM, &[16, 16])
            },
            MetaConfig {
                state_dim: STATE_DIM,
                seed: 7,
                ..tiny_meta()
            },
        )
        .unwrap()
    }

    /// One network trains on every app of the kind: its minibatches draw rows from each app's
    /// replay, as many rows as its gradient steps need; the same seeds give the same figures.
    #[test]
    fn one_network_learns_from_every_app_of_the_kind_and_is_reproducible() {
        let opts = AdaptBenchOptions {
            episodes: 3,
            steps_per_episode: 40,
            fallback_episodes: 1,
            embedding_refresh: 2,
            ..AdaptBenchOptions::default()
        };
        let meta = meta();
        let apps: Vec<(usize, AppSpec)> = generate_apps(3, 1001, &GeneratorOptions::default())
            .into_iter()
            .enumerate()
            .collect();
        let a = run_shared(&opts, &apps, 1001, &meta).unwrap();
        let b = run_shared(&opts, &apps, 1001, &meta).unwrap();
        assert_eq!(a.runs.len(), 3);
        for (x, y) in a.runs.iter().zip(&b.runs) {
            assert_eq!(x.episode_rewards.len(), 3);
            assert_eq!(x.episode_rewards, y.episode_rewards);
            assert!(x.episode_rewards.iter().all(|r| r.is_finite()));
        }
        // At most 3 apps × (40 fallback transitions' steps + 2 agent episodes × 40): none
        // before a minibatch's worth of embedded rows.
        assert!(a.updates > 0 && a.updates <= 3 * 120);
        assert_eq!(a.rows_drawn.iter().sum::<u64>(), a.updates * BATCH as u64);
        assert!(a.rows_drawn.iter().all(|&r| r > 0), "{:?}", a.rows_drawn);
        assert_eq!(a.rows_drawn, b.rows_drawn);
    }

    /// By SLO class, each class's apps share a network of their own: their figures are those of
    /// the shared arm run on that class alone, and differ from one network for all.
    #[test]
    fn kinds_by_slo_class_train_one_network_per_class() {
        let opts = AdaptBenchOptions {
            episodes: 3,
            steps_per_episode: 40,
            fallback_episodes: 1,
            embedding_refresh: 2,
            shared_kinds: Kinds::SloClass,
            ..AdaptBenchOptions::default()
        };
        let meta = meta();
        let apps = generate_apps(8, 1001, &GeneratorOptions::default());
        let class = |a: &AppSpec| super::super::SloClass::of(&a.slo);
        let first = class(&apps[0]);
        assert!(apps.iter().any(|a| class(a) != first), "one class only");
        let by_class = run_kinds(&opts, &apps, 1001, &meta).unwrap();
        let members: Vec<(usize, AppSpec)> = apps
            .iter()
            .cloned()
            .enumerate()
            .filter(|(_, a)| class(a) == first)
            .collect();
        let alone = run_shared(&opts, &members, 1001, &meta).unwrap();
        for ((i, _), run) in members.iter().zip(&alone.runs) {
            assert_eq!(by_class.runs[*i].episode_rewards, run.episode_rewards);
        }
        let all = run_kinds(
            &AdaptBenchOptions {
                shared_kinds: Kinds::All,
                ..opts
            },
            &apps,
            1001,
            &meta,
        )
        .unwrap();
        assert!(by_class.runs.iter().all(|r| r.episode_rewards.len() == 3));
        assert_ne!(
            by_class
                .runs
                .iter()
                .map(|r| r.episode_rewards.clone())
                .collect::<Vec<_>>(),
            all.runs
                .iter()
                .map(|r| r.episode_rewards.clone())
                .collect::<Vec<_>>()
        );
    }
}
