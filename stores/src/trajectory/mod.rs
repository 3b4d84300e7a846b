//! The trajectory store (docs/design.md §5): transitions (s_t, a_t, r_{t+1}, s_{t+1}) per target and
//! episode summaries, behind one trait with two implementations that pass one conformance suite.
//!
//! * [`SqliteStore`] — the embedded default: one SQLite file (WAL, `synchronous=FULL`).
//! * [`QuestDbStore`] — production: ILP over HTTP for writes, SQL over HTTP `/exec` for reads.
//!
//! # A synchronous trait
//!
//! [`TrajectoryStore`] is a plain synchronous, object-safe trait (`Send + Sync`, methods take
//! `&self`): both backends are blocking underneath (rusqlite, and the blocking HTTP clients of
//! questdb-rs and ureq), and an `async fn` trait could not be used as `dyn`. Async callers (the
//! tokio/actix services) hold an `Arc<dyn TrajectoryStore>` and call it through
//! `tokio::task::spawn_blocking`; a call never needs an async runtime.
//!
//! # Identity and idempotency
//!
//! A transition is identified by `(target, episode, step)` and an episode summary by
//! `(target, episode)`. Writing the same identity again keeps one row, the last one written (both
//! SQLite's upsert and QuestDB's `DEDUP UPSERT KEYS` replace), so a JetStream redelivery after a
//! crash never duplicates rows. QuestDB's dedup key also contains the designated timestamp, so a
//! re-written row must carry the same `ts_ms`: the recorder takes `ts_ms` from the step's `obs`
//! message, which a redelivery repeats unchanged.
//!
//! # What is refused
//!
//! NaN or infinite values are never recorded silently: `append` and `put_episode` validate the
//! whole batch first and fail with [`StoreError::NonFinite`] (naming the target, episode, step,
//! field and vector index) before anything is written. Values that do not fit the databases'
//! signed 64-bit integers (`episode`, `memory_bytes` above `i64::MAX`) or a negative `ts_ms` fail
//! with [`StoreError::OutOfRange`]. Because every stored float is finite, vectors round-trip
//! bit-exactly without any NaN-payload caveat.
//!
//! # Sampling
//!
//! [`TrajectoryStore::sample`] draws `n` rows uniformly *with replacement* (the DDPG replay
//! buffer's minibatch) from the rows in scope, ordered by `(namespace, name, episode, step)`: the
//! ordinals come from [`sample_ordinals`] (ChaCha8 seeded with `seed`), so the same seed on the
//! same data gives the same minibatch, on either backend. SQLite maps each ordinal to an episode
//! through its per-episode row counts and reads one row per draw; QuestDB reads the scope's
//! per-episode row counts and step ranges (one aggregate query), then the drawn rows by
//! `(episode, step)`, many episodes per query.
//!
//! # Retention
//!
//! [`TrajectoryStore::prune`] bounds a target's history like the DDPG replay buffer's capacity
//! (paper Table 2: 10^6): it deletes the target's oldest *whole* episodes, transitions and
//! summaries together, until at most `keep` of its transitions remain, so every episode a reader
//! finds (`episodes`, `top_episodes`) still has its transitions. The cut is remembered: rows and
//! summaries of a pruned episode written again later (a replay after a restart) are ignored, so
//! pruning never un-happens. [`TrajectoryStore::recorded`] counts pruned rows too, so it never
//! decreases. A backend that cannot delete rows per target (QuestDB drops whole time partitions
//! only) answers [`StoreError::Unsupported`] and deletes nothing.
//!
//! # Forgetting deregistered targets
//!
//! When a target's `AwareAutoscaler` is deleted, the recorder marks it
//! ([`TrajectoryStore::mark_deregistered`], with the deregistration's time); a registration clears
//! the mark. Once the mark is older than `trajectory_store.forget_after_secs` the recorder deletes
//! everything the store holds of the target ([`TrajectoryStore::forget`]): rows, summaries, the
//! retention cut and the mark. The mark lives in the store, so a restart (or a bus that no longer
//! retains the deregistration) does not reset the grace period. QuestDB answers
//! [`StoreError::Unsupported`] here too.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::ops::Range;

use aware_bus_schemas::{DecisionSource, Episode, Resources, Schema, Stage, Target};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

pub mod config;
#[cfg(any(test, feature = "testing"))]
pub mod conformance;
pub mod questdb;
pub mod sqlite;

pub use config::{open_store, InvalidSetting, StoreConfig, StoreConfigError, StoreKind};
pub use questdb::{CellError, QueryError, QuestDbConfig, QuestDbStore};
pub use sqlite::{Durability, SqliteConfig, SqliteStore};

/// One recorded step: state s_t, action a_t, reward r_{t+1} and next state s_{t+1} of a target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub target: Target,
    pub episode: u64,
    pub step: u32,
    /// Unix epoch milliseconds of the step (the `obs` of s_t); QuestDB's designated timestamp.
    pub ts_ms: i64,
    /// Normalized state s_t.
    pub state: Vec<f32>,
    /// Raw policy output in [-1, 1] per dimension; empty for the fallback.
    pub action_raw: Vec<f32>,
    /// The allocation the action asked for.
    pub desired: Resources,
    /// The allocation in force after the actuator's decision.
    pub applied: Resources,
    pub source: DecisionSource,
    pub stage: Stage,
    /// Reward r_{t+1} of the action.
    pub reward: f64,
    /// Normalized state s_{t+1}.
    pub next_state: Vec<f32>,
    pub slo_violation: bool,
    pub cpu_util: f64,
    pub memory_util: f64,
}

/// The summary of a finished episode: the fields of [`aware_bus_schemas::Episode`] without
/// `schema`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeSummary {
    pub target: Target,
    pub episode: u64,
    /// Last step of the episode.
    pub step: u32,
    pub ts_ms: i64,
    pub steps: u32,
    pub total_reward: f64,
    pub mean_reward: f64,
    pub slo_violations: u32,
    pub cpu_util_mean: f64,
    pub memory_util_mean: f64,
    pub rl_steps: u32,
    pub fallback_steps: u32,
    pub stage: Stage,
    pub policy_estimate: Option<f64>,
}

impl From<&Episode> for EpisodeSummary {
    fn from(e: &Episode) -> Self {
        Self {
            target: e.target.clone(),
            episode: e.episode,
            step: e.step,
            ts_ms: e.ts_ms,
            steps: e.steps,
            total_reward: e.total_reward,
            mean_reward: e.mean_reward,
            slo_violations: e.slo_violations,
            cpu_util_mean: e.cpu_util_mean,
            memory_util_mean: e.memory_util_mean,
            rl_steps: e.rl_steps,
            fallback_steps: e.fallback_steps,
            stage: e.stage,
            policy_estimate: e.policy_estimate,
        }
    }
}

impl From<EpisodeSummary> for Episode {
    fn from(s: EpisodeSummary) -> Self {
        Episode {
            schema: Schema::new(),
            target: s.target,
            episode: s.episode,
            step: s.step,
            ts_ms: s.ts_ms,
            steps: s.steps,
            total_reward: s.total_reward,
            mean_reward: s.mean_reward,
            slo_violations: s.slo_violations,
            cpu_util_mean: s.cpu_util_mean,
            memory_util_mean: s.memory_util_mean,
            rl_steps: s.rl_steps,
            fallback_steps: s.fallback_steps,
            stage: s.stage,
            policy_estimate: s.policy_estimate,
            // not stored: unknown for an episode read back
            exploring_steps: None,
            requested_cores_mean: None,
            requested_gib_mean: None,
        }
    }
}

/// Errors of the trajectory store. Every variant names the operation and the table or target.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{record} {key}: {field} is not finite ({value})")]
    NonFinite {
        /// `transition` or `episode`.
        record: &'static str,
        /// `ns/name episode e step s`.
        key: String,
        /// Field name, with the vector index for vectors (`state[3]`).
        field: String,
        value: f64,
    },
    #[error("{record} {key}: {field} = {value} is out of range ({reason})")]
    OutOfRange {
        record: &'static str,
        key: String,
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("sqlite: cannot open the trajectory store at {path}: {source}")]
    SqliteOpen {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("sqlite: {path} refused the WAL journal mode (it stays in `{mode}` mode)")]
    SqliteNoWal { path: String, mode: String },
    #[error("sqlite: store at {path} has schema version {found}, newer than the {supported} this build knows")]
    SchemaTooNew {
        path: String,
        found: i64,
        supported: i64,
    },
    #[error("sqlite: {op} on table {table} ({scope}) failed: {source}")]
    Sqlite {
        op: &'static str,
        table: &'static str,
        /// The target, `all targets`, or the file for store-wide operations.
        scope: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{backend}: {op} is not supported ({hint})")]
    Unsupported {
        backend: &'static str,
        op: &'static str,
        hint: &'static str,
    },
    #[error("questdb: invalid configuration: {setting} {reason}")]
    QuestDbConfig {
        /// The [`QuestDbConfig`] field.
        setting: &'static str,
        reason: String,
    },
    #[error("questdb: {op} into table {table} at {url} failed: {source}")]
    QuestDbIngest {
        op: &'static str,
        table: String,
        url: String,
        #[source]
        source: Box<::questdb::Error>,
    },
    #[error("questdb: {op} on table {table} at {url} failed: {source} (query: {query})")]
    QuestDbQuery {
        op: &'static str,
        table: String,
        url: String,
        query: String,
        #[source]
        source: Box<self::questdb::QueryError>,
    },
    #[error("questdb: {op}: table {table} at {url} did not apply its WAL within {timeout_ms} ms")]
    QuestDbNotVisible {
        op: &'static str,
        table: String,
        url: String,
        timeout_ms: u64,
    },
    #[error("{op}: corrupt row in table {table} for {key}: {source}")]
    CorruptCell {
        op: &'static str,
        table: String,
        /// The row's identity (`ns/name episode e step s`) when known, else the row.
        key: String,
        #[source]
        source: Box<self::questdb::CellError>,
    },
    #[error("{op}: corrupt row in table {table} for {key}: {detail}")]
    Corrupt {
        op: &'static str,
        table: String,
        /// The row's identity (`ns/name episode e step s`) when known.
        key: String,
        detail: String,
    },
}

/// The trajectory store. See the module documentation for the contract shared by all backends.
pub trait TrajectoryStore: Send + Sync {
    /// Short backend name for logs (`sqlite`, `questdb`).
    fn backend(&self) -> &'static str;

    /// Writes a batch of transitions atomically where the backend allows it (SQLite: one
    /// transaction; QuestDB: one transactional HTTP flush per table). Idempotent per
    /// `(target, episode, step)`; validates the whole batch before writing anything.
    fn append(&self, batch: &[Transition]) -> Result<(), StoreError>;

    /// [`TrajectoryStore::append`], returning how many transitions of the batch were refused
    /// because their key already holds a transition of another time (`ts_ms`): a step numbered
    /// again must never replace the recorded one. Backends that cannot tell (QuestDB replaces by
    /// its upsert keys) report 0.
    fn append_counted(&self, batch: &[Transition]) -> Result<u64, StoreError> {
        self.append(batch).map(|()| 0)
    }

    /// Number of transitions of `target`.
    fn count(&self, target: &Target) -> Result<u64, StoreError>;

    /// Number of transitions of all targets.
    fn count_all(&self) -> Result<u64, StoreError>;

    /// How many of `target`'s transitions come after position `after` (`(episode, step)`,
    /// exclusive; `None`: all of them), and the position of the newest of those (`None` when
    /// there is none). A poller passing the newest position it saw counts only the new rows (an
    /// index range on SQLite, not the history), and retention deleting old rows never changes
    /// the answer. The default reads the rows from `after`'s episode (with `None`, the count and
    /// the rows from the last summarized episode); SQLite answers from one snapshot.
    fn rows_after(
        &self,
        target: &Target,
        after: Option<(u64, u32)>,
    ) -> Result<(u64, Option<(u64, u32)>), StoreError> {
        let (from, all) = match after {
            Some((episode, _)) => (episode, None),
            None => (
                self.episodes(target, 1)?.last().map_or(0, |e| e.episode),
                Some(self.count(target)?),
            ),
        };
        let newer: Vec<(u64, u32)> = self
            .transitions(target, from..u64::MAX)?
            .iter()
            .map(|t| (t.episode, t.step))
            .filter(|&p| after.is_none_or(|a| p > a))
            .collect();
        let n = all.unwrap_or(newer.len() as u64);
        Ok((n, newer.into_iter().max()))
    }

    /// Number of transitions ever stored for `target`, pruned ones included: never decreases,
    /// so retention does not fool a reader comparing it over time. A whole-history count, like
    /// [`TrajectoryStore::count`] (to which it is equal on a backend that never prunes); a poller
    /// counting new rows uses [`TrajectoryStore::rows_after`].
    fn recorded(&self, target: &Target) -> Result<u64, StoreError> {
        self.count(target)
    }

    /// The transitions of `target` whose episode is in `episodes` (half-open), ordered by
    /// `(episode, step)`. `0..u64::MAX` selects every episode.
    fn transitions(
        &self,
        target: &Target,
        episodes: Range<u64>,
    ) -> Result<Vec<Transition>, StoreError>;

    /// `n` transitions drawn uniformly with replacement from `target`'s rows (or every target's
    /// when `None`), as their distinct rows and the draws in order ([`Sample`]); reproducible
    /// for the same seed and data (see [`sample_ordinals`]). Empty when the scope has no rows.
    fn sample_rows(
        &self,
        target: Option<&Target>,
        n: usize,
        seed: u64,
    ) -> Result<Sample, StoreError>;

    /// The draws of [`TrajectoryStore::sample_rows`] as transitions, in draw order (a row drawn
    /// twice is there twice).
    fn sample(
        &self,
        target: Option<&Target>,
        n: usize,
        seed: u64,
    ) -> Result<Vec<Transition>, StoreError> {
        Ok(self.sample_rows(target, n, seed)?.into_transitions())
    }

    /// Records an episode summary; idempotent per `(target, episode)` (last write wins).
    fn put_episode(&self, summary: &EpisodeSummary) -> Result<(), StoreError>;

    /// The last `n` episodes of `target` (highest episode numbers), in ascending episode order.
    fn episodes(&self, target: &Target, n: usize) -> Result<Vec<EpisodeSummary>, StoreError>;

    /// The `m` episodes of `target` with the highest total reward, best first; ties go to the
    /// more recent (higher) episode. The meta-learner's top-M bundle.
    fn top_episodes(&self, target: &Target, m: usize) -> Result<Vec<EpisodeSummary>, StoreError>;

    /// Every target with at least one transition or episode, ordered by `(namespace, name)`.
    fn targets(&self) -> Result<Vec<Target>, StoreError>;

    /// Retention (see the module documentation): deletes `target`'s oldest whole episodes, with
    /// their summaries, so that at most `keep` of its transitions remain — every episode up to and
    /// including the one holding its `keep + 1`-th newest transition — and ignores later writes
    /// of rows or summaries of those episodes. Nothing is deleted when `target` has at most `keep`
    /// transitions. [`StoreError::Unsupported`] from a backend that cannot delete per target.
    fn prune(&self, target: &Target, keep: NonZeroU64) -> Result<Pruned, StoreError>;

    /// Marks `target` deregistered since `since_ms` (Unix milliseconds; a later mark replaces an
    /// earlier one), or clears its mark (`None`). Idempotent.
    fn mark_deregistered(&self, target: &Target, since_ms: Option<i64>) -> Result<(), StoreError>;

    /// Every marked target with the time of its mark, ordered by `(namespace, name)`.
    fn deregistered(&self) -> Result<Vec<(Target, i64)>, StoreError>;

    /// Deletes everything stored of `target`: transitions, summaries, its retention cut, its
    /// mark, and its place in [`TrajectoryStore::targets`]. A backend may delete the rows in
    /// several transactions (SQLite: whole episodes, about 10^4 rows each, oldest first); the
    /// mark goes in the last one, so an interrupted call is finished by the next. A target with
    /// nothing stored is not an error.
    fn forget(&self, target: &Target) -> Result<Forgotten, StoreError>;
}

/// What one [`TrajectoryStore::forget`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// Transitions deleted.
    pub transitions: u64,
    /// Episode summaries deleted.
    pub episodes: u64,
}

/// What one [`TrajectoryStore::prune`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Transitions deleted.
    pub transitions: u64,
    /// Episode summaries deleted.
    pub episodes: u64,
    /// The target's first retained episode after this call (0 when it was never pruned): rows
    /// and summaries of earlier episodes are ignored from now on.
    pub below_episode: u64,
}

/// A sample with replacement held compactly: each drawn row once, and the draws as indices into
/// them. A training round draws many times from few rows (500 minibatches of 64 from a target's
/// few hundred rows), so its memory is bounded by the rows, not by the draws.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// The distinct rows drawn, in store order.
    pub rows: Vec<Transition>,
    /// Per draw, in draw order, the index of its row in `rows`.
    pub draws: Vec<usize>,
}

impl Sample {
    /// The sample of `draws` (ordinals in draw order) from the rows read for them; a draw whose
    /// row was not read is left out.
    pub fn from_ordinals(draws: &[u64], mut by_ordinal: HashMap<u64, Transition>) -> Self {
        let mut ordinals: Vec<u64> = by_ordinal.keys().copied().collect();
        ordinals.sort_unstable();
        let mut at = HashMap::with_capacity(ordinals.len());
        let mut rows = Vec::with_capacity(ordinals.len());
        for o in ordinals {
            if let Some(t) = by_ordinal.remove(&o) {
                at.insert(o, rows.len());
                rows.push(t);
            }
        }
        let draws = draws.iter().filter_map(|o| at.get(o).copied()).collect();
        Sample { rows, draws }
    }

    /// Number of draws.
    pub fn len(&self) -> usize {
        self.draws.len()
    }

    pub fn is_empty(&self) -> bool {
        self.draws.is_empty()
    }

    /// The drawn rows in draw order.
    pub fn iter(&self) -> impl Iterator<Item = &Transition> + '_ {
        self.draws.iter().filter_map(|&i| self.rows.get(i))
    }

    /// The draws as transitions, in draw order.
    pub fn into_transitions(self) -> Vec<Transition> {
        self.iter().cloned().collect()
    }
}

/// The ordinals (0-based positions in `(namespace, name, episode, step)` order among `rows` rows)
/// that [`TrajectoryStore::sample`] returns for `n` and `seed`: `n` uniform draws with
/// replacement from a ChaCha8 generator seeded with `seed`. Empty when `rows` is 0.
pub fn sample_ordinals(rows: u64, n: usize, seed: u64) -> Vec<u64> {
    if rows == 0 {
        return Vec::new();
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..rows)).collect()
}

/// Little-endian f32 bytes of a vector: the SQLite BLOB layout and, hex-encoded, QuestDB's.
pub(crate) fn f32s_to_le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Inverse of [`f32s_to_le_bytes`]; `None` when the length is not a multiple of 4.
pub(crate) fn le_bytes_to_f32s(b: &[u8]) -> Option<Vec<f32>> {
    if !b.len().is_multiple_of(4) {
        return None;
    }
    Some(
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

fn record_key(target: &Target, episode: u64, step: u32) -> String {
    format!("{target} episode {episode} step {step}")
}

fn check_vec(
    record: &'static str,
    target: &Target,
    episode: u64,
    step: u32,
    name: &str,
    v: &[f32],
) -> Result<(), StoreError> {
    match v.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(StoreError::NonFinite {
            record,
            key: record_key(target, episode, step),
            field: format!("{name}[{i}]"),
            value: f64::from(v[i]),
        }),
    }
}

fn check_f64(
    record: &'static str,
    target: &Target,
    episode: u64,
    step: u32,
    name: &str,
    x: f64,
) -> Result<(), StoreError> {
    if x.is_finite() {
        Ok(())
    } else {
        Err(StoreError::NonFinite {
            record,
            key: record_key(target, episode, step),
            field: name.to_owned(),
            value: x,
        })
    }
}

fn out_of_range(
    record: &'static str,
    target: &Target,
    episode: u64,
    step: u32,
    field: &'static str,
    value: impl ToString,
    reason: &'static str,
) -> StoreError {
    StoreError::OutOfRange {
        record,
        key: record_key(target, episode, step),
        field,
        value: value.to_string(),
        reason,
    }
}

fn check_common(
    record: &'static str,
    target: &Target,
    episode: u64,
    step: u32,
    ts_ms: i64,
) -> Result<(), StoreError> {
    if i64::try_from(episode).is_err() {
        return Err(out_of_range(
            record,
            target,
            episode,
            step,
            "episode",
            episode,
            "above i64::MAX",
        ));
    }
    // QuestDB's designated timestamp is in microseconds and cannot precede the epoch.
    if ts_ms < 0 || ts_ms.checked_mul(1000).is_none() {
        return Err(out_of_range(
            record,
            target,
            episode,
            step,
            "ts_ms",
            ts_ms,
            "must be epoch milliseconds in 0..=i64::MAX/1000",
        ));
    }
    Ok(())
}

impl Transition {
    /// Checks what both backends require: finite floats, integers that fit `i64`, a timestamp at
    /// or after the epoch.
    pub fn validate(&self) -> Result<(), StoreError> {
        const R: &str = "transition";
        let (t, e, s) = (&self.target, self.episode, self.step);
        check_common(R, t, e, s, self.ts_ms)?;
        check_vec(R, t, e, s, "state", &self.state)?;
        check_vec(R, t, e, s, "action_raw", &self.action_raw)?;
        check_vec(R, t, e, s, "next_state", &self.next_state)?;
        check_f64(R, t, e, s, "reward", self.reward)?;
        check_f64(R, t, e, s, "cpu_util", self.cpu_util)?;
        check_f64(R, t, e, s, "memory_util", self.memory_util)?;
        for (field, r) in [
            ("desired.memory_bytes", &self.desired),
            ("applied.memory_bytes", &self.applied),
        ] {
            if i64::try_from(r.memory_bytes).is_err() {
                return Err(out_of_range(
                    R,
                    t,
                    e,
                    s,
                    field,
                    r.memory_bytes,
                    "above i64::MAX",
                ));
            }
        }
        Ok(())
    }

    /// `ns/name episode e step s`, for errors and logs.
    pub fn key(&self) -> String {
        record_key(&self.target, self.episode, self.step)
    }
}

impl EpisodeSummary {
    /// Checks what both backends require (see [`Transition::validate`]).
    pub fn validate(&self) -> Result<(), StoreError> {
        const R: &str = "episode";
        let (t, e, s) = (&self.target, self.episode, self.step);
        check_common(R, t, e, s, self.ts_ms)?;
        check_f64(R, t, e, s, "total_reward", self.total_reward)?;
        check_f64(R, t, e, s, "mean_reward", self.mean_reward)?;
        check_f64(R, t, e, s, "cpu_util_mean", self.cpu_util_mean)?;
        check_f64(R, t, e, s, "memory_util_mean", self.memory_util_mean)?;
        if let Some(p) = self.policy_estimate {
            check_f64(R, t, e, s, "policy_estimate", p)?;
        }
        Ok(())
    }
}

/// The stored spelling of a decision source.
pub(crate) fn source_str(s: DecisionSource) -> &'static str {
    match s {
        DecisionSource::Fallback => "fallback",
        DecisionSource::Rl => "rl",
    }
}

pub(crate) fn parse_source(s: &str) -> Option<DecisionSource> {
    match s {
        "fallback" => Some(DecisionSource::Fallback),
        "rl" => Some(DecisionSource::Rl),
        _ => None,
    }
}

pub(crate) fn parse_stage(s: &str) -> Option<Stage> {
    [
        Stage::Initialized,
        Stage::Offline,
        Stage::Online,
        Stage::Serving,
    ]
    .into_iter()
    .find(|st| st.as_str() == s)
}

/// Episode range bounds as stored integers: `None` when the range selects nothing storable.
pub(crate) fn episode_bounds(episodes: &Range<u64>) -> Option<(i64, Option<i64>)> {
    if episodes.start >= episodes.end {
        return None;
    }
    let lo = i64::try_from(episodes.start).ok()?;
    // Every stored episode is <= i64::MAX, so an end beyond it is no bound at all.
    let hi = i64::try_from(episodes.end).ok();
    Some((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transition() -> Transition {
        Transition {
            target: Target::new("ns", "app"),
            episode: 1,
            step: 2,
            ts_ms: 1_700_000_000_000,
            state: vec![0.5, -1.0],
            action_raw: vec![0.1],
            desired: Resources {
                replicas: 1,
                cpu_millicores: 100,
                memory_bytes: 1 << 20,
            },
            applied: Resources {
                replicas: 1,
                cpu_millicores: 100,
                memory_bytes: 1 << 20,
            },
            source: DecisionSource::Rl,
            stage: Stage::Online,
            reward: 0.5,
            next_state: vec![0.25, 1.0],
            slo_violation: false,
            cpu_util: 0.4,
            memory_util: 0.6,
        }
    }

    #[test]
    fn validate_names_the_offending_vector_element() {
        let mut t = transition();
        t.next_state[1] = f32::NAN;
        let err = t.validate().unwrap_err();
        match &err {
            StoreError::NonFinite { field, .. } => assert_eq!(field, "next_state[1]"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("ns/app episode 1 step 2"), "{err}");
    }

    #[test]
    fn validate_rejects_infinite_scalars_and_out_of_range_integers() {
        let mut t = transition();
        t.reward = f64::INFINITY;
        assert!(matches!(t.validate(), Err(StoreError::NonFinite { .. })));
        let mut t = transition();
        t.applied.memory_bytes = u64::MAX;
        assert!(matches!(
            t.validate(),
            Err(StoreError::OutOfRange {
                field: "applied.memory_bytes",
                ..
            })
        ));
        let mut t = transition();
        t.ts_ms = -1;
        assert!(matches!(
            t.validate(),
            Err(StoreError::OutOfRange { field: "ts_ms", .. })
        ));
        let mut t = transition();
        t.episode = u64::MAX;
        assert!(matches!(
            t.validate(),
            Err(StoreError::OutOfRange {
                field: "episode",
                ..
            })
        ));
        assert!(transition().validate().is_ok());
    }

    #[test]
    fn le_bytes_round_trip_and_reject_ragged_input() {
        let v = vec![1.5f32, -0.0, f32::MIN_POSITIVE, 3.4e38];
        let b = f32s_to_le_bytes(&v);
        assert_eq!(b.len(), 16);
        assert_eq!(&b[0..4], &1.5f32.to_le_bytes());
        let back = le_bytes_to_f32s(&b).unwrap();
        assert_eq!(
            back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert!(le_bytes_to_f32s(&b[..5]).is_none());
    }

    #[test]
    fn sample_ordinals_are_seeded_and_in_range() {
        let a = sample_ordinals(10, 100, 7);
        assert_eq!(a, sample_ordinals(10, 100, 7));
        assert_ne!(a, sample_ordinals(10, 100, 8));
        assert!(a.iter().all(|&i| i < 10));
        // 100 draws from 10 values hit more than one value.
        assert!(a.iter().any(|&i| i != a[0]));
        assert!(sample_ordinals(0, 5, 1).is_empty());
    }

    #[test]
    fn episode_bounds_clamp_to_storable_range() {
        assert_eq!(episode_bounds(&(3..5)), Some((3, Some(5))));
        assert_eq!(episode_bounds(&(0..u64::MAX)), Some((0, None)));
        assert_eq!(episode_bounds(&(5..5)), None);
        assert_eq!(episode_bounds(&(u64::MAX - 1..u64::MAX)), None);
    }

    #[test]
    fn episode_message_round_trips_through_summary() {
        let s = EpisodeSummary {
            target: Target::new("a", "b"),
            episode: 3,
            step: 99,
            ts_ms: 5,
            steps: 100,
            total_reward: 12.5,
            mean_reward: 0.125,
            slo_violations: 2,
            cpu_util_mean: 0.5,
            memory_util_mean: 0.25,
            rl_steps: 60,
            fallback_steps: 40,
            stage: Stage::Offline,
            policy_estimate: Some(1.0),
        };
        let msg: Episode = s.clone().into();
        assert_eq!(EpisodeSummary::from(&msg), s);
    }

    #[test]
    fn stored_enum_spellings_parse_back() {
        for s in [DecisionSource::Fallback, DecisionSource::Rl] {
            assert_eq!(parse_source(source_str(s)), Some(s));
        }
        for s in [
            Stage::Initialized,
            Stage::Offline,
            Stage::Online,
            Stage::Serving,
        ] {
            assert_eq!(parse_stage(s.as_str()), Some(s));
        }
        assert_eq!(parse_source("hpa"), None);
        assert_eq!(parse_stage("paused"), None);
    }
}
