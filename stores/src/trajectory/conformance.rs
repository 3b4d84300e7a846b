//! The one conformance suite every [`TrajectoryStore`] backend passes.
//!
//! A backend is exercised through a [`Backend`], which opens handles on named, isolated storages
//! (SQLite: one file per key; QuestDB: one table prefix per key). Each case opens its own key(s),
//! so cases are independent. Cases return `Err(Failure)` with a message instead of panicking, so
//! the suite is usable from any test harness; [`run_all`] runs every case and reports them all.

use std::fmt;

use aware_bus_schemas::{DecisionSource, Resources, Stage, Target};

use std::num::NonZeroU64;

use super::{
    sample_ordinals, EpisodeSummary, Forgotten, Pruned, StoreError, TrajectoryStore, Transition,
};

/// Opens handles on isolated storages.
pub trait Backend {
    type Store: TrajectoryStore + 'static;
    /// Opens a handle on the storage named `key`, creating it empty on first use. The same key
    /// opens the same data again (a second handle, or a reopen after the first was dropped);
    /// different keys never share data.
    fn open(&self, key: &str) -> Result<Self::Store, StoreError>;
}

/// A failed check, with what was expected.
#[derive(Debug)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure(format!("store error: {e}"))
    }
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(Failure(format!($($fmt)+)));
        }
    };
}

macro_rules! check_eq {
    ($left:expr, $right:expr, $($fmt:tt)+) => {{
        let (l, r) = (&$left, &$right);
        if l != r {
            return Err(Failure(format!(
                "{}: left {:?} != right {:?}",
                format!($($fmt)+),
                l,
                r
            )));
        }
    }};
}

/// The outcome of [`run_all`].
#[derive(Debug, Default)]
pub struct Report {
    pub passed: usize,
    pub failures: Vec<(&'static str, Failure)>,
}

/// The names of the cases, in the order [`run_all`] runs them.
pub const CASE_NAMES: &[&str] = &[
    "append_and_read_in_order",
    "reappend_is_idempotent",
    "counts_per_target_and_total",
    "episode_range_filter",
    "vectors_round_trip_bit_exactly",
    "non_finite_values_are_rejected",
    "sampling_is_reproducible_and_existing",
    "episodes_last_n",
    "top_episodes_by_total_reward",
    "episode_summaries_are_idempotent",
    "targets_are_listed",
    "reopen_keeps_data",
    "concurrent_appends_lose_nothing",
    "pruning_keeps_the_newest_whole_episodes",
    "rows_after_counts_only_newer_rows",
    "forgetting_deletes_everything_of_one_target",
];

type Case<B> = fn(&B) -> Result<(), Failure>;

/// Every case with its name (same order as [`CASE_NAMES`]).
pub fn cases<B: Backend>() -> Vec<(&'static str, Case<B>)> {
    let fns: [Case<B>; 16] = [
        append_and_read_in_order,
        reappend_is_idempotent,
        counts_per_target_and_total,
        episode_range_filter,
        vectors_round_trip_bit_exactly,
        non_finite_values_are_rejected,
        sampling_is_reproducible_and_existing,
        episodes_last_n,
        top_episodes_by_total_reward,
        episode_summaries_are_idempotent,
        targets_are_listed,
        reopen_keeps_data,
        concurrent_appends_lose_nothing,
        pruning_keeps_the_newest_whole_episodes,
        rows_after_counts_only_newer_rows,
        forgetting_deletes_everything_of_one_target,
    ];
    CASE_NAMES.iter().copied().zip(fns).collect()
}

/// Runs every case and reports all failures (a failing case does not stop the others).
pub fn run_all<B: Backend>(backend: &B) -> Report {
    let mut report = Report::default();
    for (name, case) in cases::<B>() {
        match case(backend) {
            Ok(()) => {
                tracing::info!(case = name, "trajectory store conformance case passed");
                report.passed += 1;
            }
            Err(f) => {
                tracing::error!(case = name, failure = %f, "trajectory store conformance case failed");
                report.failures.push((name, f));
            }
        }
    }
    report
}

const BASE_TS_MS: i64 = 1_700_000_000_000;

/// A deterministic transition whose every field depends on (target, episode, step), so rows are
/// pairwise distinct and a mixed-up read is visible.
pub fn transition(target: &Target, episode: u64, step: u32) -> Transition {
    let salt = target
        .key()
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        % 97;
    let e = episode as f32;
    let s = step as f32;
    let k = salt as f32;
    Transition {
        target: target.clone(),
        episode,
        step,
        ts_ms: BASE_TS_MS + (episode as i64) * 1_000_000 + i64::from(step) * 1_000,
        state: vec![e, s / 100.0, k / 7.0, 0.1 * s - 0.3, 1.0 / (1.0 + s)],
        action_raw: vec![(s / 50.0).sin(), -(e / 10.0).cos(), k / 97.0],
        desired: Resources {
            replicas: 1 + step % 5,
            cpu_millicores: 100 + step * 10 + salt,
            memory_bytes: (64 << 20) + u64::from(step) * 4096 + episode,
        },
        applied: Resources {
            replicas: 1 + step % 4,
            cpu_millicores: 100 + step * 9,
            memory_bytes: (64 << 20) + u64::from(step) * 4000,
        },
        source: if step.is_multiple_of(3) {
            DecisionSource::Fallback
        } else {
            DecisionSource::Rl
        },
        stage: match episode % 3 {
            0 => Stage::Offline,
            1 => Stage::Online,
            _ => Stage::Serving,
        },
        reward: 0.5 + f64::from(step) / 1000.0 - (episode as f64) / 7.0 + f64::from(salt) * 1e-3,
        next_state: vec![e, (s + 1.0) / 100.0, k / 7.0, 0.1 * (s + 1.0) - 0.3, -s],
        slo_violation: step % 4 == 1,
        cpu_util: f64::from(step % 10) / 10.0 + 0.01,
        memory_util: 1.0 / (2.0 + f64::from(step)),
    }
}

/// A deterministic episode summary with the given total reward.
pub fn episode(target: &Target, episode: u64, total_reward: f64) -> EpisodeSummary {
    EpisodeSummary {
        target: target.clone(),
        episode,
        step: 99,
        ts_ms: BASE_TS_MS + (episode as i64) * 1_000_000 + 99_000,
        steps: 100,
        total_reward,
        mean_reward: total_reward / 100.0,
        slo_violations: (episode % 7) as u32,
        cpu_util_mean: 0.25 + (episode as f64) / 100.0,
        memory_util_mean: 0.75 - (episode as f64) / 200.0,
        rl_steps: (episode % 100) as u32,
        fallback_steps: 100 - (episode % 100) as u32,
        stage: if episode.is_multiple_of(2) {
            Stage::Offline
        } else {
            Stage::Online
        },
        policy_estimate: if episode.is_multiple_of(2) {
            None
        } else {
            Some(total_reward * 0.9)
        },
    }
}

fn rows(target: &Target, episodes: std::ops::Range<u64>, steps: u32) -> Vec<Transition> {
    episodes
        .flat_map(|e| (0..steps).map(move |s| (e, s)))
        .map(|(e, s)| transition(target, e, s))
        .collect()
}

fn keys(ts: &[Transition]) -> Vec<(String, u64, u32)> {
    ts.iter()
        .map(|t| (t.target.key(), t.episode, t.step))
        .collect()
}

fn episode_numbers(es: &[EpisodeSummary]) -> Vec<u64> {
    es.iter().map(|e| e.episode).collect()
}

fn tgt(name: &str) -> Target {
    Target::new("conformance", name)
}

/// Rows written out of order in several batches read back ordered by (episode, step), equal.
pub fn append_and_read_in_order<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("order")?;
    let a = tgt("a-app");
    let expected = rows(&a, 0..3, 6);
    let mut shuffled = expected.clone();
    shuffled.reverse();
    shuffled.swap(0, 7);
    let (first, second) = shuffled.split_at(5);
    store.append(first)?;
    store.append(second)?;
    let got = store.transitions(&a, 0..u64::MAX)?;
    check_eq!(keys(&got), keys(&expected), "order of transitions()");
    check!(
        got == expected,
        "transitions() differ from what was appended"
    );
    Ok(())
}

/// Writing the same (target, episode, step) again keeps one row; the last write wins.
pub fn reappend_is_idempotent<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("idempotent")?;
    let a = tgt("a-app");
    let batch = rows(&a, 0..2, 5);
    store.append(&batch)?;
    store.append(&batch)?;
    // Redelivery of a partial batch overlapping what is stored, with a duplicate inside it.
    let mut overlap: Vec<_> = batch[3..7].to_vec();
    overlap.push(batch[4].clone());
    store.append(&overlap)?;
    check_eq!(store.count(&a)?, 10, "count after re-appends");
    check_eq!(store.count_all()?, 10, "count_all after re-appends");
    check!(
        store.transitions(&a, 0..u64::MAX)? == batch,
        "rows changed by identical re-appends"
    );
    // Same identity (and ts_ms), new content: replaced, not added.
    let mut changed = batch[2].clone();
    changed.reward = -42.25;
    changed.state[0] = 9.5;
    store.append(std::slice::from_ref(&changed))?;
    check_eq!(store.count(&a)?, 10, "count after an overwrite");
    let got = store.transitions(&a, 0..1)?;
    check_eq!(got.get(2), Some(&changed), "overwritten row");
    check_eq!(got.len(), 5, "rows of episode 0 after an overwrite");
    Ok(())
}

/// Counts per target and over all targets; unknown targets count zero; empty batches are no-ops.
pub fn counts_per_target_and_total<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("counts")?;
    let (a, bb, c) = (tgt("a-app"), tgt("b-app"), tgt("never-seen"));
    check_eq!(store.count_all()?, 0, "count_all of an empty store");
    store.append(&[])?;
    store.append(&rows(&a, 0..1, 7))?;
    store.append(&rows(&bb, 4..5, 3))?;
    check_eq!(store.count(&a)?, 7, "count(a)");
    check_eq!(store.count(&bb)?, 3, "count(b)");
    check_eq!(store.count(&c)?, 0, "count(unknown)");
    check_eq!(store.count_all()?, 10, "count_all");
    // Same name in another namespace is another target.
    let other_ns = Target::new("other", "a-app");
    check_eq!(store.count(&other_ns)?, 0, "count(other/a-app)");
    Ok(())
}

/// `transitions(target, range)` selects the half-open episode range of that target only.
pub fn episode_range_filter<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("range")?;
    let (a, bb) = (tgt("a-app"), tgt("b-app"));
    let all = rows(&a, 0..6, 3);
    store.append(&all)?;
    store.append(&rows(&bb, 0..6, 3))?;
    let mid = store.transitions(&a, 2..4)?;
    let want: Vec<_> = all
        .iter()
        .filter(|t| (2..4).contains(&t.episode))
        .cloned()
        .collect();
    check!(mid == want, "transitions(a, 2..4): got {:?}", keys(&mid));
    check!(
        store.transitions(&a, 5..5)?.is_empty(),
        "an empty range selects nothing"
    );
    let tail = store.transitions(&a, 4..u64::MAX)?;
    check_eq!(
        tail.iter().map(|t| t.episode).collect::<Vec<_>>(),
        vec![4, 4, 4, 5, 5, 5],
        "episodes of transitions(a, 4..MAX)"
    );
    check!(
        store.transitions(&a, 6..100)?.is_empty(),
        "a range past the last episode selects nothing"
    );
    check!(
        store
            .transitions(&tgt("never-seen"), 0..u64::MAX)?
            .is_empty(),
        "an unknown target has no transitions"
    );
    Ok(())
}

/// Vectors come back with the same bits, including -0.0, subnormals and extremes; empty vectors
/// stay empty.
pub fn vectors_round_trip_bit_exactly<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("bits")?;
    let a = tgt("a-app");
    let special = vec![
        -0.0f32,
        0.0,
        f32::from_bits(1),
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::MIN,
        f32::EPSILON,
        1.0 / 3.0,
        std::f32::consts::PI,
        -1e-38,
        16_777_217.0,
    ];
    let mut t = transition(&a, 0, 0);
    t.state = special.clone();
    t.next_state = special.iter().rev().copied().collect();
    t.action_raw = Vec::new();
    let mut long = transition(&a, 0, 1);
    long.state = (0..74).map(|i| (i as f32).sqrt() - 4.0).collect();
    long.reward = 0.1 + 0.2;
    long.cpu_util = f64::from_bits(1);
    store.append(&[t.clone(), long.clone()])?;
    let got = store.transitions(&a, 0..1)?;
    check_eq!(got.len(), 2, "rows read");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (g, w) in got.iter().zip([&t, &long]) {
        check_eq!(bits(&g.state), bits(&w.state), "state bits of {}", w.key());
        check_eq!(
            bits(&g.next_state),
            bits(&w.next_state),
            "next_state bits of {}",
            w.key()
        );
        check_eq!(
            bits(&g.action_raw),
            bits(&w.action_raw),
            "action_raw bits of {}",
            w.key()
        );
        check_eq!(
            g.reward.to_bits(),
            w.reward.to_bits(),
            "reward bits of {}",
            w.key()
        );
        check_eq!(
            g.cpu_util.to_bits(),
            w.cpu_util.to_bits(),
            "cpu_util bits of {}",
            w.key()
        );
    }
    Ok(())
}

/// NaN and infinities are refused with a typed error and nothing of the batch is written.
pub fn non_finite_values_are_rejected<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("nonfinite")?;
    let a = tgt("a-app");
    let mut batch = rows(&a, 0..1, 4);
    batch[3].state[2] = f32::NAN;
    match store.append(&batch) {
        Err(StoreError::NonFinite { field, .. }) => {
            check_eq!(field.as_str(), "state[2]", "offending field")
        }
        other => return Err(Failure(format!("NaN state accepted: {other:?}"))),
    }
    let mut inf = transition(&a, 0, 9);
    inf.reward = f64::NEG_INFINITY;
    check!(
        matches!(
            store.append(std::slice::from_ref(&inf)),
            Err(StoreError::NonFinite { .. })
        ),
        "infinite reward accepted"
    );
    let mut ep = episode(&a, 0, 1.0);
    ep.policy_estimate = Some(f64::NAN);
    check!(
        matches!(store.put_episode(&ep), Err(StoreError::NonFinite { .. })),
        "NaN policy_estimate accepted"
    );
    check_eq!(store.count_all()?, 0, "rows written by rejected batches");
    check!(
        store.episodes(&a, 10)?.is_empty(),
        "episode written by a rejected put"
    );
    Ok(())
}

/// Same seed and data → same minibatch; every sampled row is a stored row; the draw follows
/// [`sample_ordinals`] over rows ordered by (namespace, name, episode, step).
pub fn sampling_is_reproducible_and_existing<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("sample")?;
    let (a, bb) = (tgt("a-app"), tgt("b-app"));
    check!(
        store.sample(None, 8, 1)?.is_empty(),
        "sampling an empty store returns nothing"
    );
    let ra = rows(&a, 0..4, 5);
    let rb = rows(&bb, 0..2, 5);
    store.append(&rb)?;
    store.append(&ra)?;

    let s1 = store.sample(Some(&a), 50, 42)?;
    let s2 = store.sample(Some(&a), 50, 42)?;
    check_eq!(s1.len(), 50, "sample size");
    check!(s1 == s2, "same seed gave different samples");
    check!(
        s1.iter().all(|t| ra.contains(t)),
        "sampled a row of another target or a row never written"
    );
    let want = documented_draw(&ra, 50, 42);
    check!(
        s1 == want,
        "sample(a, 50, 42) is not the documented draw: got {:?}",
        keys(&s1)
    );
    let other = store.sample(Some(&a), 50, 43)?;
    check!(other != s1, "a different seed gave the same 50 draws");
    // The compact form: 500 draws of a's 20 rows hold each drawn row once.
    let compact = store.sample_rows(Some(&a), 500, 42)?;
    check_eq!(compact.len(), 500, "draws of sample_rows");
    check!(
        !compact.rows.is_empty() && compact.rows.len() <= ra.len(),
        "sample_rows holds {} rows for 500 draws of {} stored",
        compact.rows.len(),
        ra.len()
    );
    check!(
        compact.clone().into_transitions() == documented_draw(&ra, 500, 42),
        "sample_rows(a, 500, 42) in draw order is not the documented draw"
    );

    let mut all: Vec<_> = ra.iter().chain(rb.iter()).cloned().collect();
    all.sort_by(|x, y| (&x.target, x.episode, x.step).cmp(&(&y.target, y.episode, y.step)));
    let s_all = store.sample(None, 30, 7)?;
    let want_all = documented_draw(&all, 30, 7);
    check!(
        s_all == want_all,
        "sample(all, 30, 7) is not the documented draw: got {:?}",
        keys(&s_all)
    );
    check!(
        s_all.iter().any(|t| t.target == bb),
        "sampling all targets never drew target b (30 draws over 30 rows)"
    );
    check!(
        store.sample(Some(&a), 0, 1)?.is_empty(),
        "n = 0 returns nothing"
    );
    check!(
        store.sample(Some(&tgt("never-seen")), 5, 1)?.is_empty(),
        "sampling an unknown target returns nothing"
    );
    Ok(())
}

/// What [`TrajectoryStore::sample`] must return for `n` and `seed` when the scope holds exactly
/// `rows`, in key order ([`sample_ordinals`] over them).
pub fn documented_draw(rows: &[Transition], n: usize, seed: u64) -> Vec<Transition> {
    sample_ordinals(rows.len() as u64, n, seed)
        .into_iter()
        .map(|o| rows[o as usize].clone())
        .collect()
}

/// `episodes(target, n)`: the n highest episode numbers, ascending.
pub fn episodes_last_n<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("episodes")?;
    let (a, bb) = (tgt("a-app"), tgt("b-app"));
    for e in [3u64, 0, 7, 1, 5, 2, 6, 4] {
        store.put_episode(&episode(&a, e, e as f64))?;
    }
    store.put_episode(&episode(&bb, 100, 1.0))?;
    let last3 = store.episodes(&a, 3)?;
    check_eq!(episode_numbers(&last3), vec![5, 6, 7], "episodes(a, 3)");
    check!(
        last3.first() == Some(&episode(&a, 5, 5.0)),
        "episode summary fields changed on the way"
    );
    check_eq!(
        episode_numbers(&store.episodes(&a, 100)?),
        (0..8).collect::<Vec<_>>(),
        "episodes(a, 100)"
    );
    check!(store.episodes(&a, 0)?.is_empty(), "episodes(a, 0)");
    check_eq!(
        episode_numbers(&store.episodes(&bb, 5)?),
        vec![100],
        "episodes(b, 5)"
    );
    Ok(())
}

/// `top_episodes(target, m)`: by total reward descending, ties to the higher episode.
pub fn top_episodes_by_total_reward<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("top")?;
    let (a, bb) = (tgt("a-app"), tgt("b-app"));
    for (e, r) in [
        (0u64, 1.0),
        (1, 5.0),
        (2, 3.0),
        (3, 5.0),
        (4, -2.0),
        (5, 4.5),
    ] {
        store.put_episode(&episode(&a, e, r))?;
    }
    store.put_episode(&episode(&bb, 9, 100.0))?;
    let top3 = store.top_episodes(&a, 3)?;
    check_eq!(episode_numbers(&top3), vec![3, 1, 5], "top_episodes(a, 3)");
    check!(
        top3.first() == Some(&episode(&a, 3, 5.0)),
        "episode summary fields changed on the way"
    );
    check_eq!(
        episode_numbers(&store.top_episodes(&a, 10)?),
        vec![3, 1, 5, 2, 0, 4],
        "top_episodes(a, 10)"
    );
    check!(store.top_episodes(&a, 0)?.is_empty(), "top_episodes(a, 0)");
    check!(
        store.top_episodes(&tgt("never-seen"), 3)?.is_empty(),
        "top_episodes of an unknown target"
    );
    Ok(())
}

/// Writing an episode summary again keeps one; the last write wins.
pub fn episode_summaries_are_idempotent<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("episode-idem")?;
    let a = tgt("a-app");
    let first = episode(&a, 4, 2.0);
    store.put_episode(&first)?;
    store.put_episode(&first)?;
    check_eq!(
        store.episodes(&a, 10)?,
        vec![first.clone()],
        "after a re-put"
    );
    let mut second = first.clone();
    second.total_reward = 7.5;
    second.policy_estimate = Some(3.25);
    store.put_episode(&second)?;
    check_eq!(
        store.episodes(&a, 10)?,
        vec![second.clone()],
        "after an overwrite"
    );
    check_eq!(
        store.top_episodes(&a, 10)?,
        vec![second],
        "top after an overwrite"
    );
    Ok(())
}

/// `targets()`: every target with a transition or an episode, sorted, once.
pub fn targets_are_listed<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("targets")?;
    check!(store.targets()?.is_empty(), "targets of an empty store");
    let (a, bb, c) = (tgt("a-app"), tgt("b-app"), Target::new("another", "c-app"));
    store.append(&rows(&bb, 0..1, 2))?;
    store.append(&rows(&a, 0..2, 2))?;
    store.put_episode(&episode(&a, 0, 1.0))?;
    store.put_episode(&episode(&c, 0, 1.0))?;
    check_eq!(store.targets()?, vec![c, a, bb], "targets()");
    Ok(())
}

/// Dropping a handle and opening the same storage again finds everything.
pub fn reopen_keeps_data<B: Backend>(b: &B) -> Result<(), Failure> {
    let a = tgt("a-app");
    let written = rows(&a, 0..2, 4);
    let ep = episode(&a, 1, 3.5);
    {
        let store = b.open("reopen")?;
        store.append(&written)?;
        store.put_episode(&ep)?;
    }
    let store = b.open("reopen")?;
    check_eq!(store.count(&a)?, 8, "count after reopen");
    check!(
        store.transitions(&a, 0..u64::MAX)? == written,
        "transitions after reopen"
    );
    check_eq!(store.episodes(&a, 5)?, vec![ep], "episodes after reopen");
    Ok(())
}

/// Two handles on one storage appending from two threads at once lose no row.
pub fn concurrent_appends_lose_nothing<B: Backend>(b: &B) -> Result<(), Failure> {
    let h1 = b.open("concurrent")?;
    let h2 = b.open("concurrent")?;
    let (a, bb) = (tgt("a-app"), tgt("b-app"));
    let results: Vec<Result<(), Failure>> = std::thread::scope(|s| {
        let mut joins = Vec::new();
        for (handle, target, episode0) in [
            (&h1, &a, 0u64),
            (&h2, &a, 10),
            (&h1, &bb, 0),
            (&h2, &bb, 10),
        ] {
            joins.push(s.spawn(move || -> Result<(), Failure> {
                for e in episode0..episode0 + 5 {
                    handle.append(&rows(target, e..e + 1, 20))?;
                }
                Ok(())
            }));
        }
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(Failure("an appender thread panicked".to_owned())))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    check_eq!(h1.count(&a)?, 200, "count(a) seen by handle 1");
    check_eq!(h2.count(&bb)?, 200, "count(b) seen by handle 2");
    check_eq!(h2.count_all()?, 400, "count_all");
    let mut want = rows(&a, 0..5, 20);
    want.extend(rows(&a, 10..15, 20));
    check!(
        h2.transitions(&a, 0..u64::MAX)? == want,
        "transitions of a after concurrent appends"
    );
    Ok(())
}

/// Retention: `prune(a, keep)` deletes a's oldest whole episodes, rows and summaries, until at most
/// `keep` rows remain; other targets are untouched; re-writes of pruned episodes are ignored, also
/// after a reopen; a target within `keep` loses nothing. A backend that cannot prune says so
/// ([`StoreError::Unsupported`]) and deletes nothing.
pub fn pruning_keeps_the_newest_whole_episodes<B: Backend>(b: &B) -> Result<(), Failure> {
    let keep = |n: u64| NonZeroU64::new(n).ok_or_else(|| Failure("keep 0".into()));
    let store = b.open("prune")?;
    let (a, bb) = (tgt("a-app"), tgt("b-app"));
    let ra = rows(&a, 0..10, 5);
    let rb = rows(&bb, 0..4, 5);
    store.append(&ra)?;
    store.append(&rb)?;
    for e in 0..10 {
        store.put_episode(&episode(&a, e, e as f64))?;
    }
    for e in 0..4 {
        store.put_episode(&episode(&bb, e, 10.0 + e as f64))?;
    }
    // 22 rows kept at most: the 23rd newest row is episode 5's, so episodes 0–5 go.
    let pruned = match store.prune(&a, keep(22)?) {
        Err(StoreError::Unsupported { .. }) => {
            check_eq!(store.count(&a)?, 50, "count(a) after an unsupported prune");
            check_eq!(store.recorded(&a)?, 50, "recorded(a) without pruning");
            check_eq!(
                store.episodes(&a, 100)?.len(),
                10,
                "episodes(a) after an unsupported prune"
            );
            return Ok(());
        }
        other => other?,
    };
    check_eq!(
        pruned,
        Pruned {
            transitions: 30,
            episodes: 6,
            below_episode: 6
        },
        "prune(a, 22)"
    );
    let kept: Vec<_> = ra.iter().filter(|t| t.episode >= 6).cloned().collect();
    check!(
        store.transitions(&a, 0..u64::MAX)? == kept,
        "prune(a, 22) did not keep exactly episodes 6-9"
    );
    check_eq!(store.count(&a)?, 20, "count(a) after the prune");
    check_eq!(store.recorded(&a)?, 50, "recorded(a) counts pruned rows");
    check_eq!(store.recorded(&bb)?, 20, "recorded(b), never pruned");
    check_eq!(store.count_all()?, 40, "count_all after the prune");
    check_eq!(
        episode_numbers(&store.episodes(&a, 100)?),
        vec![6, 7, 8, 9],
        "episodes(a) after the prune"
    );
    check_eq!(
        episode_numbers(&store.top_episodes(&a, 100)?),
        vec![9, 8, 7, 6],
        "top_episodes(a) after the prune"
    );
    check!(
        store
            .sample(Some(&a), 40, 3)?
            .iter()
            .all(|t| kept.contains(t)),
        "sampled a pruned row"
    );
    check!(
        store.transitions(&bb, 0..u64::MAX)? == rb && store.episodes(&bb, 100)?.len() == 4,
        "pruning a changed another target"
    );
    // Again, or with exactly `keep` rows left: nothing more goes.
    check_eq!(
        store.prune(&a, keep(22)?)?,
        Pruned {
            below_episode: 6,
            ..Pruned::default()
        },
        "prune(a, 22) again"
    );
    check_eq!(store.prune(&a, keep(20)?)?.transitions, 0, "prune(a, 20)");
    check_eq!(
        store.prune(&bb, keep(100)?)?,
        Pruned::default(),
        "prune(b, 100)"
    );
    // A replay of pruned episodes is ignored, also after a reopen; new rows are kept.
    drop(store);
    let store = b.open("prune")?;
    store.append(&ra[..15])?;
    store.put_episode(&episode(&a, 2, 99.0))?;
    check_eq!(
        store.count(&a)?,
        20,
        "count(a) after re-appending pruned rows"
    );
    check_eq!(
        episode_numbers(&store.top_episodes(&a, 1)?),
        vec![9],
        "a re-written summary of a pruned episode came back"
    );
    store.append(&rows(&a, 10..11, 1))?;
    check_eq!(store.count(&a)?, 21, "count(a) after a new row");
    check_eq!(store.recorded(&a)?, 51, "recorded(a) after a new row");
    // keep 5: the 6th newest row is episode 9's first, so only episode 10's row stays.
    let p = store.prune(&a, keep(5)?)?;
    check_eq!((p.transitions, p.below_episode), (20, 10), "prune(a, 5)");
    check_eq!(store.recorded(&a)?, 51, "recorded(a) never decreases");
    check_eq!(
        keys(&store.transitions(&a, 0..u64::MAX)?),
        keys(&rows(&a, 10..11, 1)),
        "rows of a after prune(a, 5)"
    );
    check!(
        store.targets()?.contains(&a),
        "a pruned target is still listed"
    );
    Ok(())
}

/// `rows_after(target, position)`: the rows after the position and the newest of them; `None`
/// counts every row; other targets and (where the backend prunes) pruned rows do not count.
pub fn rows_after_counts_only_newer_rows<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("rows-after")?;
    let (a, bb) = (tgt("a-app"), tgt("b-app"));
    check_eq!(store.rows_after(&a, None)?, (0, None), "an empty target");
    store.append(&rows(&a, 0..6, 5))?;
    store.append(&rows(&bb, 0..9, 5))?;
    for e in 0..5 {
        store.put_episode(&episode(&a, e, 1.0))?;
    }
    check_eq!(
        store.rows_after(&a, None)?,
        (30, Some((5, 4))),
        "rows_after(a, None)"
    );
    check_eq!(
        store.rows_after(&a, Some((3, 2)))?,
        (12, Some((5, 4))),
        "rows_after(a, (3, 2))"
    );
    check_eq!(
        store.rows_after(&a, Some((5, 4)))?,
        (0, None),
        "after the newest"
    );
    check_eq!(
        store.rows_after(&a, Some((9, 0)))?,
        (0, None),
        "after a future position"
    );
    // A poller: the rows it has not counted yet, and nothing twice.
    store.append(&rows(&a, 6..7, 3))?;
    check_eq!(
        store.rows_after(&a, Some((5, 4)))?,
        (3, Some((6, 2))),
        "three new rows"
    );
    let pruned = match store.prune(
        &a,
        NonZeroU64::new(10).ok_or_else(|| Failure("keep".into()))?,
    ) {
        Err(StoreError::Unsupported { .. }) => return Ok(()),
        other => other?,
    };
    check!(pruned.transitions > 0, "keep 10 of 33 pruned nothing");
    check_eq!(
        store.rows_after(&a, Some((5, 4)))?,
        (3, Some((6, 2))),
        "pruning older rows changes nothing after a position"
    );
    Ok(())
}

/// Deregistration marks and `forget`: marks are set, replaced, cleared and listed; forgetting a
/// target deletes its rows, summaries, retention cut, mark and listing, and nothing of another
/// target; its data written again afterwards is stored afresh (no retention cut survives), also
/// after a reopen. A backend that cannot forget says so ([`StoreError::Unsupported`]) and deletes
/// nothing.
pub fn forgetting_deletes_everything_of_one_target<B: Backend>(b: &B) -> Result<(), Failure> {
    let store = b.open("forget")?;
    let (a, bb) = (tgt("a-app"), tgt("b-app"));
    let ra = rows(&a, 0..6, 5);
    let rb = rows(&bb, 0..3, 5);
    store.append(&ra)?;
    store.append(&rb)?;
    for e in 0..6 {
        store.put_episode(&episode(&a, e, e as f64))?;
    }
    store.put_episode(&episode(&bb, 0, 1.0))?;
    match store.mark_deregistered(&a, Some(1_000)) {
        Err(StoreError::Unsupported { .. }) => {
            check!(
                matches!(store.forget(&a), Err(StoreError::Unsupported { .. })),
                "a backend that cannot mark cannot forget either"
            );
            check_eq!(store.count(&a)?, 30, "count(a) after an unsupported forget");
            return Ok(());
        }
        other => other?,
    }
    store.mark_deregistered(&bb, Some(2_000))?;
    store.mark_deregistered(&a, Some(3_000))?;
    check_eq!(
        store.deregistered()?,
        vec![(a.clone(), 3_000), (bb.clone(), 2_000)],
        "marks (a later mark replaces an earlier one)"
    );
    store.mark_deregistered(&bb, None)?;
    store.mark_deregistered(&bb, None)?;
    check_eq!(
        store.deregistered()?,
        vec![(a.clone(), 3_000)],
        "a cleared mark (twice: idempotent)"
    );
    // A retention cut for a, which forgetting must drop too.
    store.prune(
        &a,
        NonZeroU64::new(20).ok_or_else(|| Failure("keep 0".into()))?,
    )?;
    let f = store.forget(&a)?;
    check_eq!(
        f,
        Forgotten {
            transitions: 20,
            episodes: 4
        },
        "forget(a) after retention kept episodes 2-5"
    );
    check_eq!(store.count(&a)?, 0, "count(a) after forget");
    check!(
        store.episodes(&a, 100)?.is_empty(),
        "episodes(a) after forget"
    );
    check!(
        store.sample(Some(&a), 10, 1)?.is_empty(),
        "sample(a) after forget"
    );
    check_eq!(
        store.targets()?,
        vec![bb.clone()],
        "targets after forget(a)"
    );
    check!(
        store.deregistered()?.is_empty(),
        "the mark goes with the target"
    );
    check!(store.transitions(&bb, 0..u64::MAX)? == rb, "b untouched");
    check_eq!(store.episodes(&bb, 100)?.len(), 1, "b's summary untouched");
    check_eq!(store.forget(&a)?, Forgotten::default(), "forgetting again");
    // Re-registered later: its old episodes are stored afresh, below the old cut too.
    store.append(&ra[..10])?;
    store.put_episode(&episode(&a, 0, 0.5))?;
    drop(store);
    let store = b.open("forget")?;
    check!(
        store.transitions(&a, 0..u64::MAX)? == ra[..10],
        "a's rows written after forget"
    );
    check_eq!(store.recorded(&a)?, 10, "recorded(a) starts afresh");
    check_eq!(
        episode_numbers(&store.episodes(&a, 10)?),
        vec![0],
        "a's new summary"
    );
    Ok(())
}
