//! The embedded trajectory store: one SQLite file through rusqlite (bundled SQLite).
//!
//! * **Layout.** Tables `transitions` (primary key `(namespace, name, episode, step)`), `episodes`
//!   (primary key `(namespace, name, episode)`, plus an index by total reward for the top-M query)
//!   and `targets` (every target seen, so listing targets does not scan the transitions).
//!   `episode_rows` (schema v3) holds each episode's row count and step range, kept by triggers
//!   on `transitions` in the writing transaction: counts, `sample` (an ordinal maps to an episode
//!   and an offset in it, then to one primary-key read) and retention's cut read it instead of
//!   walking a target's rows. `deregistered` (schema v4) holds the marks of deleted targets
//!   waiting to be forgotten; `forget` deletes a target's rows in transactions of about 10^4
//!   (the lock is held briefly, the WAL stays small), its mark last. Vectors
//!   are BLOBs of little-endian `f32`s, 4 bytes per element (`f32::to_le_bytes`), so they
//!   round-trip bit-exactly and are readable from any language; integers are `INTEGER` (i64),
//!   floats `REAL` (f64), enums their snake-case names.
//! * **Idempotency.** Writes are upserts on the primary keys (`ON CONFLICT … DO UPDATE`): writing
//!   a row again replaces it, like QuestDB's `DEDUP UPSERT KEYS`. A transition whose key holds
//!   one of another time (`ts_ms`: another step that reused the key) is refused, never
//!   overwritten, and counted ([`TrajectoryStore::append_counted`]).
//! * **Batches.** `append` writes a batch in one `BEGIN IMMEDIATE` transaction with a cached
//!   prepared statement: all rows or none, and one commit (one fsync) per batch.
//! * **Migrations.** `PRAGMA user_version` holds the schema version; opening applies the missing
//!   steps of [`MIGRATIONS`] in one transaction, and refuses a file from a newer build.
//! * **Retention.** `prune` deletes a target's oldest episodes (transitions and summaries) in one
//!   transaction and records the cut in `retention` (`below_episode` and the running total
//!   `pruned_rows` per target, schema v2);
//!   `append` and `put_episode` skip rows of earlier episodes. Deleted pages are reused by later
//!   writes, so a pruned file stops growing rather than shrinking (`VACUUM` returns the space).
//! * **Durability.** WAL journal with `synchronous=FULL` by default ([`Durability::Full`]). WAL
//!   alone already survives a *process* crash: a commit has written its frames to the WAL file
//!   (the OS page cache) before returning, and the next open recovers them. `FULL` also fsyncs the
//!   WAL at every commit, so a committed batch survives an OS crash or power loss too. The
//!   recorder acknowledges the JetStream messages of a step after `append` returns; with `NORMAL`
//!   a power loss could drop a batch whose messages were already acknowledged and will never be
//!   redelivered. One fsync per batch is cheap at the recorder's rate (one batch per control
//!   interval and target). [`Durability::Normal`] is there for simulations and benchmarks.
//! * **Concurrency.** A handle owns one connection behind a mutex. Several handles (threads or
//!   processes) may open the same file: WAL lets readers run beside the single writer, and
//!   writers wait for each other up to the busy timeout.

use std::collections::HashMap;
use std::fmt::Display;
use std::num::NonZeroU64;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use aware_bus_schemas::{Resources, Target};
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};

use super::{
    episode_bounds, f32s_to_le_bytes, le_bytes_to_f32s, parse_source, parse_stage, sample_ordinals,
    source_str, EpisodeSummary, Forgotten, Pruned, Sample, StoreError, TrajectoryStore, Transition,
};

/// Schema migrations; `MIGRATIONS[i]` takes the schema from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE transitions (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    episode INTEGER NOT NULL,
    step INTEGER NOT NULL,
    ts_ms INTEGER NOT NULL,
    state BLOB NOT NULL,
    action_raw BLOB NOT NULL,
    desired_replicas INTEGER NOT NULL,
    desired_cpu_millicores INTEGER NOT NULL,
    desired_memory_bytes INTEGER NOT NULL,
    applied_replicas INTEGER NOT NULL,
    applied_cpu_millicores INTEGER NOT NULL,
    applied_memory_bytes INTEGER NOT NULL,
    source TEXT NOT NULL,
    stage TEXT NOT NULL,
    reward REAL NOT NULL,
    next_state BLOB NOT NULL,
    slo_violation INTEGER NOT NULL,
    cpu_util REAL NOT NULL,
    memory_util REAL NOT NULL,
    PRIMARY KEY (namespace, name, episode, step)
);
CREATE TABLE episodes (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    episode INTEGER NOT NULL,
    last_step INTEGER NOT NULL,
    ts_ms INTEGER NOT NULL,
    steps INTEGER NOT NULL,
    total_reward REAL NOT NULL,
    mean_reward REAL NOT NULL,
    slo_violations INTEGER NOT NULL,
    cpu_util_mean REAL NOT NULL,
    memory_util_mean REAL NOT NULL,
    rl_steps INTEGER NOT NULL,
    fallback_steps INTEGER NOT NULL,
    stage TEXT NOT NULL,
    policy_estimate REAL,
    PRIMARY KEY (namespace, name, episode)
);
CREATE INDEX episodes_by_reward ON episodes (namespace, name, total_reward DESC, episode DESC);
CREATE TABLE targets (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
"#,
    r#"
CREATE TABLE retention (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    below_episode INTEGER NOT NULL,
    pruned_rows INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
"#,
    r#"
CREATE TABLE episode_rows (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    episode INTEGER NOT NULL,
    rows INTEGER NOT NULL,
    min_step INTEGER NOT NULL,
    max_step INTEGER NOT NULL,
    PRIMARY KEY (namespace, name, episode)
) WITHOUT ROWID;
INSERT INTO episode_rows (namespace, name, episode, rows, min_step, max_step)
    SELECT namespace, name, episode, count(*), min(step), max(step) FROM transitions
    GROUP BY namespace, name, episode;
CREATE TRIGGER transitions_count_insert AFTER INSERT ON transitions BEGIN
    INSERT INTO episode_rows (namespace, name, episode, rows, min_step, max_step)
        VALUES (new.namespace, new.name, new.episode, 1, new.step, new.step)
        ON CONFLICT (namespace, name, episode) DO UPDATE SET
        rows = rows + 1, min_step = min(min_step, excluded.min_step),
        max_step = max(max_step, excluded.max_step);
END;
CREATE TRIGGER transitions_count_delete AFTER DELETE ON transitions BEGIN
    UPDATE episode_rows SET rows = rows - 1
        WHERE namespace = old.namespace AND name = old.name AND episode = old.episode;
    DELETE FROM episode_rows
        WHERE namespace = old.namespace AND name = old.name AND episode = old.episode
        AND rows <= 0;
END;
"#,
    r#"
CREATE TABLE deregistered (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    since_ms INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
"#,
];

/// `PRAGMA journal_size_limit`: the WAL is truncated to this many bytes when a checkpoint
/// resets it.
pub const WAL_SIZE_LIMIT: i64 = 64 << 20;

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How hard a commit is pushed to disk (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=FULL`: committed batches survive process crashes, OS crashes and power loss.
    #[default]
    Full,
    /// `synchronous=NORMAL`: committed batches survive process crashes; the last ones may be lost
    /// on an OS crash or power loss.
    Normal,
}

/// Where and how to open the SQLite store.
#[derive(Debug, Clone, PartialEq)]
pub struct SqliteConfig {
    pub path: PathBuf,
    pub durability: Durability,
    /// How long a write waits for another handle's write transaction.
    pub busy_timeout: Duration,
}

impl SqliteConfig {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            durability: Durability::Full,
            busy_timeout: Duration::from_secs(10),
        }
    }
}

/// The SQLite trajectory store. Cheap to share behind an `Arc`; see the module documentation.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Mutex<Connection>,
    path: String,
}

const TRANSITION_COLS: &str = "namespace, name, episode, step, ts_ms, state, action_raw, \
     desired_replicas, desired_cpu_millicores, desired_memory_bytes, \
     applied_replicas, applied_cpu_millicores, applied_memory_bytes, \
     source, stage, reward, next_state, slo_violation, cpu_util, memory_util";

const EPISODE_COLS: &str = "namespace, name, episode, last_step, ts_ms, steps, total_reward, \
     mean_reward, slo_violations, cpu_util_mean, memory_util_mean, rl_steps, fallback_steps, \
     stage, policy_estimate";

const UPSERT_TRANSITION: &str = "INSERT INTO transitions (namespace, name, episode, step, ts_ms, \
     state, action_raw, desired_replicas, desired_cpu_millicores, desired_memory_bytes, \
     applied_replicas, applied_cpu_millicores, applied_memory_bytes, source, stage, reward, \
     next_state, slo_violation, cpu_util, memory_util) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20) \
     ON CONFLICT (namespace, name, episode, step) DO UPDATE SET \
     ts_ms = excluded.ts_ms, state = excluded.state, action_raw = excluded.action_raw, \
     desired_replicas = excluded.desired_replicas, \
     desired_cpu_millicores = excluded.desired_cpu_millicores, \
     desired_memory_bytes = excluded.desired_memory_bytes, \
     applied_replicas = excluded.applied_replicas, \
     applied_cpu_millicores = excluded.applied_cpu_millicores, \
     applied_memory_bytes = excluded.applied_memory_bytes, \
     source = excluded.source, stage = excluded.stage, reward = excluded.reward, \
     next_state = excluded.next_state, slo_violation = excluded.slo_violation, \
     cpu_util = excluded.cpu_util, memory_util = excluded.memory_util \
     WHERE transitions.ts_ms = excluded.ts_ms";

const UPSERT_EPISODE: &str = "INSERT INTO episodes (namespace, name, episode, last_step, ts_ms, \
     steps, total_reward, mean_reward, slo_violations, cpu_util_mean, memory_util_mean, rl_steps, \
     fallback_steps, stage, policy_estimate) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15) \
     ON CONFLICT (namespace, name, episode) DO UPDATE SET \
     last_step = excluded.last_step, ts_ms = excluded.ts_ms, steps = excluded.steps, \
     total_reward = excluded.total_reward, mean_reward = excluded.mean_reward, \
     slo_violations = excluded.slo_violations, cpu_util_mean = excluded.cpu_util_mean, \
     memory_util_mean = excluded.memory_util_mean, rl_steps = excluded.rl_steps, \
     fallback_steps = excluded.fallback_steps, stage = excluded.stage, \
     policy_estimate = excluded.policy_estimate";

const INSERT_TARGET: &str =
    "INSERT INTO targets (namespace, name) VALUES (?1, ?2) ON CONFLICT DO NOTHING";

fn sq(
    op: &'static str,
    table: &'static str,
    scope: impl Display,
) -> impl FnOnce(rusqlite::Error) -> StoreError {
    let scope = scope.to_string();
    move |source| StoreError::Sqlite {
        op,
        table,
        scope,
        source,
    }
}

fn scope_name(target: Option<&Target>) -> String {
    target.map_or_else(|| "all targets".to_owned(), Target::to_string)
}

/// Saturating `usize` → SQL `LIMIT`.
fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `config.path`, switches it to WAL, sets the
    /// durability and applies pending schema migrations.
    pub fn open(config: &SqliteConfig) -> Result<Self, StoreError> {
        let path = config.path.display().to_string();
        let open_err = |source| StoreError::SqliteOpen {
            path: path.clone(),
            source,
        };
        let mut conn = Connection::open(&config.path).map_err(open_err)?;
        conn.busy_timeout(config.busy_timeout).map_err(open_err)?;
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(open_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::SqliteNoWal { path, mode });
        }
        let sync = match config.durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync)
            .map_err(open_err)?;
        // A large transaction (a retention pass) grows the WAL by the pages it wrote; without a
        // limit the file keeps that size for as long as the connection lives.
        conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)
            .map_err(open_err)?;
        let (from, to) = migrate(&mut conn, &path)?;
        if from == to {
            tracing::info!(path = %path, schema_version = to, durability = sync, "opened sqlite trajectory store");
        } else {
            tracing::info!(path = %path, from, to, durability = sync, "opened sqlite trajectory store and migrated its schema");
        }
        Ok(Self {
            conn: Mutex::new(conn),
            path,
        })
    }

    /// [`SqliteStore::open`] with the default configuration for `path`.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open(&SqliteConfig::new(path.as_ref()))
    }

    /// The schema version of the open file (`PRAGMA user_version`).
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        self.lock()
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(sq("read schema version", "sqlite_master", &self.path))
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock dropped any open transaction (rolled back), so the
        // connection is still consistent.
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Rows of `target` (every target's when `None`), from the per-episode counts.
    fn count_scope(conn: &Connection, target: Option<&Target>) -> Result<u64, StoreError> {
        let n: i64 = match target {
            Some(t) => conn
                .prepare_cached(
                    "SELECT coalesce(sum(rows), 0) FROM episode_rows \
                     WHERE namespace = ?1 AND name = ?2",
                )
                .and_then(|mut s| s.query_row(params![t.namespace, t.name], |r| r.get(0))),
            None => conn
                .prepare_cached("SELECT coalesce(sum(rows), 0) FROM episode_rows")
                .and_then(|mut s| s.query_row([], |r| r.get(0))),
        }
        .map_err(sq("count", "episode_rows", scope_name(target)))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The episodes of `target` (every target's when `None`) in key order, with their row counts
    /// and step ranges.
    fn episode_rows(
        conn: &Connection,
        target: Option<&Target>,
    ) -> Result<Vec<EpisodeRows>, StoreError> {
        let (sql, args): (&str, Vec<&dyn rusqlite::ToSql>) = match target {
            Some(t) => (
                "SELECT namespace, name, episode, rows, min_step, max_step FROM episode_rows \
                 WHERE namespace = ?1 AND name = ?2 ORDER BY namespace, name, episode",
                vec![&t.namespace, &t.name],
            ),
            None => (
                "SELECT namespace, name, episode, rows, min_step, max_step FROM episode_rows \
                 ORDER BY namespace, name, episode",
                vec![],
            ),
        };
        conn.prepare_cached(sql)
            .and_then(|mut s| {
                s.query_map(args.as_slice(), |r| {
                    Ok(EpisodeRows {
                        namespace: r.get(0)?,
                        name: r.get(1)?,
                        episode: r.get(2)?,
                        rows: r.get(3)?,
                        min_step: r.get(4)?,
                        max_step: r.get(5)?,
                    })
                })?
                .collect()
            })
            .map_err(sq(
                "read episode counts",
                "episode_rows",
                scope_name(target),
            ))
    }
}

/// One row of `episode_rows`: how many transitions an episode holds and its lowest and highest
/// step (kept by triggers on `transitions`; after a deletion inside an episode the step range
/// may be wider than the rows, never narrower).
struct EpisodeRows {
    namespace: String,
    name: String,
    episode: i64,
    rows: i64,
    min_step: i64,
    max_step: i64,
}

impl EpisodeRows {
    /// True when the episode's steps are exactly `min_step..=max_step`, so its `k`-th row is
    /// step `min_step + k`.
    fn contiguous(&self) -> bool {
        self.max_step.checked_sub(self.min_step) == self.rows.checked_sub(1)
    }
}

/// Applies the missing migrations in one immediate transaction; returns (from, to) versions.
fn migrate(conn: &mut Connection, path: &str) -> Result<(i64, i64), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sq("begin migration", "sqlite_master", path))?;
    let found: i64 = tx
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(sq("read schema version", "sqlite_master", path))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(found).unwrap_or(0))
    {
        tx.execute_batch(sql).map_err(sq(
            "apply migration",
            "sqlite_master",
            format!("{path} v{i}→v{}", i + 1),
        ))?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(sq("write schema version", "sqlite_master", path))?;
    tx.commit()
        .map_err(sq("commit migration", "sqlite_master", path))?;
    Ok((found, SCHEMA_VERSION))
}

fn i64_of(v: u64) -> i64 {
    // Callers validated the value (`Transition::validate`); saturate rather than wrap regardless.
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn write_transition(
    stmt: &mut rusqlite::CachedStatement<'_>,
    t: &Transition,
) -> rusqlite::Result<usize> {
    stmt.execute(params![
        t.target.namespace,
        t.target.name,
        i64_of(t.episode),
        t.step,
        t.ts_ms,
        f32s_to_le_bytes(&t.state),
        f32s_to_le_bytes(&t.action_raw),
        t.desired.replicas,
        t.desired.cpu_millicores,
        i64_of(t.desired.memory_bytes),
        t.applied.replicas,
        t.applied.cpu_millicores,
        i64_of(t.applied.memory_bytes),
        source_str(t.source),
        t.stage.as_str(),
        t.reward,
        f32s_to_le_bytes(&t.next_state),
        t.slo_violation,
        t.cpu_util,
        t.memory_util,
    ])
}

/// A transition row as SQLite returns it, before range and format checks.
struct RawTransition {
    namespace: String,
    name: String,
    episode: i64,
    step: i64,
    ts_ms: i64,
    state: Vec<u8>,
    action_raw: Vec<u8>,
    desired: [i64; 3],
    applied: [i64; 3],
    source: String,
    stage: String,
    reward: f64,
    next_state: Vec<u8>,
    slo_violation: bool,
    cpu_util: f64,
    memory_util: f64,
}

impl RawTransition {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            namespace: r.get(0)?,
            name: r.get(1)?,
            episode: r.get(2)?,
            step: r.get(3)?,
            ts_ms: r.get(4)?,
            state: r.get(5)?,
            action_raw: r.get(6)?,
            desired: [r.get(7)?, r.get(8)?, r.get(9)?],
            applied: [r.get(10)?, r.get(11)?, r.get(12)?],
            source: r.get(13)?,
            stage: r.get(14)?,
            reward: r.get(15)?,
            next_state: r.get(16)?,
            slo_violation: r.get(17)?,
            cpu_util: r.get(18)?,
            memory_util: r.get(19)?,
        })
    }

    fn key(&self) -> String {
        format!(
            "{}/{} episode {} step {}",
            self.namespace, self.name, self.episode, self.step
        )
    }

    fn decode(self, op: &'static str) -> Result<Transition, StoreError> {
        let key = self.key();
        let bad = |detail: String| StoreError::Corrupt {
            op,
            table: "transitions".to_owned(),
            key: key.clone(),
            detail,
        };
        let vec = |name: &str, b: &[u8]| {
            le_bytes_to_f32s(b)
                .ok_or_else(|| bad(format!("{name} BLOB of {} bytes is not f32s", b.len())))
        };
        let res = |name: &str, v: [i64; 3]| -> Result<Resources, StoreError> {
            Ok(Resources {
                replicas: u32::try_from(v[0])
                    .map_err(|_| bad(format!("{name}_replicas = {}", v[0])))?,
                cpu_millicores: u32::try_from(v[1])
                    .map_err(|_| bad(format!("{name}_cpu_millicores = {}", v[1])))?,
                memory_bytes: u64::try_from(v[2])
                    .map_err(|_| bad(format!("{name}_memory_bytes = {}", v[2])))?,
            })
        };
        Ok(Transition {
            episode: u64::try_from(self.episode)
                .map_err(|_| bad(format!("episode = {}", self.episode)))?,
            step: u32::try_from(self.step).map_err(|_| bad(format!("step = {}", self.step)))?,
            ts_ms: self.ts_ms,
            state: vec("state", &self.state)?,
            action_raw: vec("action_raw", &self.action_raw)?,
            desired: res("desired", self.desired)?,
            applied: res("applied", self.applied)?,
            source: parse_source(&self.source)
                .ok_or_else(|| bad(format!("source = {:?}", self.source)))?,
            stage: parse_stage(&self.stage)
                .ok_or_else(|| bad(format!("stage = {:?}", self.stage)))?,
            reward: self.reward,
            next_state: vec("next_state", &self.next_state)?,
            slo_violation: self.slo_violation,
            cpu_util: self.cpu_util,
            memory_util: self.memory_util,
            target: Target::new(self.namespace, self.name),
        })
    }
}

/// An episode row as SQLite returns it.
struct RawEpisode {
    namespace: String,
    name: String,
    ints: [i64; 2],
    ts_ms: i64,
    steps: i64,
    total_reward: f64,
    mean_reward: f64,
    slo_violations: i64,
    cpu_util_mean: f64,
    memory_util_mean: f64,
    rl_steps: i64,
    fallback_steps: i64,
    stage: String,
    policy_estimate: Option<f64>,
}

impl RawEpisode {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            namespace: r.get(0)?,
            name: r.get(1)?,
            ints: [r.get(2)?, r.get(3)?],
            ts_ms: r.get(4)?,
            steps: r.get(5)?,
            total_reward: r.get(6)?,
            mean_reward: r.get(7)?,
            slo_violations: r.get(8)?,
            cpu_util_mean: r.get(9)?,
            memory_util_mean: r.get(10)?,
            rl_steps: r.get(11)?,
            fallback_steps: r.get(12)?,
            stage: r.get(13)?,
            policy_estimate: r.get(14)?,
        })
    }

    fn decode(self, op: &'static str) -> Result<EpisodeSummary, StoreError> {
        let key = format!("{}/{} episode {}", self.namespace, self.name, self.ints[0]);
        let bad = |detail: String| StoreError::Corrupt {
            op,
            table: "episodes".to_owned(),
            key: key.clone(),
            detail,
        };
        let u32_of =
            |name: &str, v: i64| u32::try_from(v).map_err(|_| bad(format!("{name} = {v}")));
        Ok(EpisodeSummary {
            episode: u64::try_from(self.ints[0])
                .map_err(|_| bad(format!("episode = {}", self.ints[0])))?,
            step: u32_of("last_step", self.ints[1])?,
            ts_ms: self.ts_ms,
            steps: u32_of("steps", self.steps)?,
            total_reward: self.total_reward,
            mean_reward: self.mean_reward,
            slo_violations: u32_of("slo_violations", self.slo_violations)?,
            cpu_util_mean: self.cpu_util_mean,
            memory_util_mean: self.memory_util_mean,
            rl_steps: u32_of("rl_steps", self.rl_steps)?,
            fallback_steps: u32_of("fallback_steps", self.fallback_steps)?,
            stage: parse_stage(&self.stage)
                .ok_or_else(|| bad(format!("stage = {:?}", self.stage)))?,
            policy_estimate: self.policy_estimate,
            target: Target::new(self.namespace, self.name),
        })
    }
}

fn query_episodes(
    conn: &Connection,
    sql: &str,
    target: &Target,
    n: usize,
    op: &'static str,
) -> Result<Vec<EpisodeSummary>, StoreError> {
    let raws = conn
        .prepare_cached(sql)
        .and_then(|mut s| {
            s.query_map(
                params![target.namespace, target.name, limit(n)],
                RawEpisode::from_row,
            )?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sq(op, "episodes", target))?;
    raws.into_iter().map(|r| r.decode(op)).collect()
}

impl TrajectoryStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn append_counted(&self, batch: &[Transition]) -> Result<u64, StoreError> {
        for t in batch {
            t.validate()?;
        }
        if batch.is_empty() {
            return Ok(0);
        }
        let scope = batch
            .first()
            .map(|t| {
                if batch.iter().all(|u| u.target == t.target) {
                    t.target.to_string()
                } else {
                    "several targets".to_owned()
                }
            })
            .unwrap_or_default();
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sq("begin append", "transitions", &scope))?;
        let mut skipped = 0usize;
        let mut refused = 0u64;
        {
            let mut ins = tx.prepare_cached(UPSERT_TRANSITION).map_err(sq(
                "prepare append",
                "transitions",
                &scope,
            ))?;
            let mut tgt = tx.prepare_cached(INSERT_TARGET).map_err(sq(
                "prepare append",
                "targets",
                &scope,
            ))?;
            let mut last: Option<(&Target, i64)> = None;
            for t in batch {
                let below = match last {
                    Some((lt, below)) if lt == &t.target => below,
                    _ => {
                        tgt.execute(params![t.target.namespace, t.target.name])
                            .map_err(sq("append", "targets", &t.target))?;
                        let below = below_episode(&tx, &t.target)?;
                        last = Some((&t.target, below));
                        below
                    }
                };
                if i64_of(t.episode) < below {
                    skipped += 1;
                    continue;
                }
                let written =
                    write_transition(&mut ins, t).map_err(sq("append", "transitions", t.key()))?;
                if written == 0 {
                    refused += 1;
                    tracing::warn!(key = %t.key(), ts_ms = t.ts_ms, "a different transition is stored under this key: kept, the new one refused");
                }
            }
        }
        tx.commit()
            .map_err(sq("commit append", "transitions", &scope))?;
        tracing::debug!(rows = batch.len() - skipped, pruned_skipped = skipped, refused, scope = %scope, "appended transitions");
        Ok(refused)
    }

    fn append(&self, batch: &[Transition]) -> Result<(), StoreError> {
        self.append_counted(batch).map(|_| ())
    }

    fn count(&self, target: &Target) -> Result<u64, StoreError> {
        Self::count_scope(&self.lock(), Some(target))
    }

    fn count_all(&self) -> Result<u64, StoreError> {
        Self::count_scope(&self.lock(), None)
    }

    fn rows_after(
        &self,
        target: &Target,
        after: Option<(u64, u32)>,
    ) -> Result<(u64, Option<(u64, u32)>), StoreError> {
        let mut conn = self.lock();
        // One read transaction: the count and the newest position see the same rows.
        let tx = conn
            .transaction()
            .map_err(sq("begin rows_after", "transitions", target))?;
        let (episode, step) = after.map_or((-1, -1), |(e, s)| (i64_of(e), i64::from(s)));
        let n: i64 = tx
            .prepare_cached(
                "SELECT count(*) FROM transitions WHERE namespace = ?1 AND name = ?2 \
                 AND (episode, step) > (?3, ?4)",
            )
            .and_then(|mut s| {
                s.query_row(params![target.namespace, target.name, episode, step], |r| {
                    r.get(0)
                })
            })
            .map_err(sq("rows_after", "transitions", target))?;
        let newest: Option<(i64, i64)> = tx
            .prepare_cached(
                "SELECT episode, step FROM transitions WHERE namespace = ?1 AND name = ?2 \
                 AND (episode, step) > (?3, ?4) ORDER BY episode DESC, step DESC LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row(params![target.namespace, target.name, episode, step], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
            })
            .map_err(sq("rows_after", "transitions", target))?;
        Ok((
            u64::try_from(n).unwrap_or(0),
            newest.map(|(e, s)| (u64::try_from(e).unwrap_or(0), u32::try_from(s).unwrap_or(0))),
        ))
    }

    fn recorded(&self, target: &Target) -> Result<u64, StoreError> {
        let mut conn = self.lock();
        // One read transaction: the count and the pruned total see the same snapshot.
        let tx = conn
            .transaction()
            .map_err(sq("begin recorded", "transitions", target))?;
        let present = Self::count_scope(&tx, Some(target))?;
        let (_, pruned) = retention(&tx, target)?;
        Ok(present.saturating_add(u64::try_from(pruned).unwrap_or(0)))
    }

    fn transitions(
        &self,
        target: &Target,
        episodes: Range<u64>,
    ) -> Result<Vec<Transition>, StoreError> {
        let Some((lo, hi)) = episode_bounds(&episodes) else {
            return Ok(Vec::new());
        };
        let sql = format!(
            "SELECT {TRANSITION_COLS} FROM transitions WHERE namespace = ?1 AND name = ?2 \
             AND episode >= ?3 AND (?4 IS NULL OR episode < ?4) ORDER BY episode, step"
        );
        let conn = self.lock();
        let raws = conn
            .prepare_cached(&sql)
            .and_then(|mut s| {
                s.query_map(
                    params![target.namespace, target.name, lo, hi],
                    RawTransition::from_row,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(sq("read transitions", "transitions", target))?;
        drop(conn);
        raws.into_iter()
            .map(|r| r.decode("read transitions"))
            .collect()
    }

    fn sample_rows(
        &self,
        target: Option<&Target>,
        n: usize,
        seed: u64,
    ) -> Result<Sample, StoreError> {
        let scope = scope_name(target);
        let mut conn = self.lock();
        // One read transaction: the counts and the row reads see one snapshot.
        let tx = conn
            .transaction()
            .map_err(sq("begin sample", "transitions", &scope))?;
        // Ordinal → (episode, offset) from the per-episode counts: no walk over the rows.
        let eps = Self::episode_rows(&tx, target)?;
        let mut ends = Vec::with_capacity(eps.len());
        let mut rows = 0u64;
        for e in &eps {
            rows = rows.saturating_add(u64::try_from(e.rows).unwrap_or(0));
            ends.push(rows);
        }
        let draws = sample_ordinals(rows, n, seed);
        let mut wanted: Vec<u64> = draws.clone();
        wanted.sort_unstable();
        wanted.dedup();

        let mut by_ordinal: HashMap<u64, Transition> = HashMap::with_capacity(wanted.len());
        {
            let by_step = format!(
                "SELECT {TRANSITION_COLS} FROM transitions \
                 WHERE namespace = ?1 AND name = ?2 AND episode = ?3 AND step = ?4"
            );
            let by_offset = format!(
                "SELECT {TRANSITION_COLS} FROM transitions \
                 WHERE namespace = ?1 AND name = ?2 AND episode = ?3 \
                 ORDER BY step LIMIT 1 OFFSET ?4"
            );
            let mut by_step =
                tx.prepare_cached(&by_step)
                    .map_err(sq("sample", "transitions", &scope))?;
            let mut by_offset =
                tx.prepare_cached(&by_offset)
                    .map_err(sq("sample", "transitions", &scope))?;
            for ordinal in wanted {
                // The first episode ending after the ordinal holds it.
                let i = ends.partition_point(|&end| end <= ordinal);
                let (Some(e), Some(&end)) = (eps.get(i), ends.get(i)) else {
                    break;
                };
                let start = end - u64::try_from(e.rows).unwrap_or(0);
                let offset = i64::try_from(ordinal - start).unwrap_or(i64::MAX);
                let raw = if e.contiguous() {
                    by_step.query_row(
                        params![e.namespace, e.name, e.episode, e.min_step + offset],
                        RawTransition::from_row,
                    )
                } else {
                    by_offset.query_row(
                        params![e.namespace, e.name, e.episode, offset],
                        RawTransition::from_row,
                    )
                }
                .optional()
                .map_err(sq("sample", "transitions", &scope))?
                .ok_or_else(|| StoreError::Corrupt {
                    op: "sample",
                    table: "episode_rows".to_owned(),
                    key: format!("{}/{} episode {}", e.namespace, e.name, e.episode),
                    detail: format!(
                        "counts {} rows (steps {}..={}) but row {offset} is missing",
                        e.rows, e.min_step, e.max_step
                    ),
                })?;
                by_ordinal.insert(ordinal, raw.decode("sample")?);
            }
        }
        tx.finish()
            .map_err(sq("end sample", "transitions", &scope))?;
        drop(conn);
        Ok(Sample::from_ordinals(&draws, by_ordinal))
    }

    fn put_episode(&self, s: &EpisodeSummary) -> Result<(), StoreError> {
        s.validate()?;
        let key = format!("{} episode {}", s.target, s.episode);
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sq("begin put_episode", "episodes", &key))?;
        if i64_of(s.episode) < below_episode(&tx, &s.target)? {
            // A summary of a pruned episode (a replay after a restart): already gone for good.
            return Ok(());
        }
        tx.prepare_cached(UPSERT_EPISODE)
            .and_then(|mut stmt| {
                stmt.execute(params![
                    s.target.namespace,
                    s.target.name,
                    i64_of(s.episode),
                    s.step,
                    s.ts_ms,
                    s.steps,
                    s.total_reward,
                    s.mean_reward,
                    s.slo_violations,
                    s.cpu_util_mean,
                    s.memory_util_mean,
                    s.rl_steps,
                    s.fallback_steps,
                    s.stage.as_str(),
                    s.policy_estimate,
                ])
            })
            .map_err(sq("put_episode", "episodes", &key))?;
        tx.prepare_cached(INSERT_TARGET)
            .and_then(|mut stmt| stmt.execute(params![s.target.namespace, s.target.name]))
            .map_err(sq("put_episode", "targets", &key))?;
        tx.commit()
            .map_err(sq("commit put_episode", "episodes", &key))?;
        Ok(())
    }

    fn episodes(&self, target: &Target, n: usize) -> Result<Vec<EpisodeSummary>, StoreError> {
        let sql = format!(
            "SELECT * FROM (SELECT {EPISODE_COLS} FROM episodes WHERE namespace = ?1 AND name = ?2 \
             ORDER BY episode DESC LIMIT ?3) ORDER BY episode ASC"
        );
        query_episodes(&self.lock(), &sql, target, n, "read episodes")
    }

    fn top_episodes(&self, target: &Target, m: usize) -> Result<Vec<EpisodeSummary>, StoreError> {
        let sql = format!(
            "SELECT {EPISODE_COLS} FROM episodes WHERE namespace = ?1 AND name = ?2 \
             ORDER BY total_reward DESC, episode DESC LIMIT ?3"
        );
        query_episodes(&self.lock(), &sql, target, m, "read top episodes")
    }

    fn targets(&self) -> Result<Vec<Target>, StoreError> {
        let conn = self.lock();
        conn.prepare_cached("SELECT namespace, name FROM targets ORDER BY namespace, name")
            .and_then(|mut s| {
                s.query_map([], |r| {
                    Ok(Target::new(r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })?
                .collect()
            })
            .map_err(sq("list targets", "targets", &self.path))
    }

    fn prune(&self, target: &Target, keep: NonZeroU64) -> Result<Pruned, StoreError> {
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sq("begin prune", "transitions", target))?;
        // The episode of the `keep + 1`-th newest row: it and every earlier episode go.
        let cut = episode_reaching(
            &tx,
            target,
            Order::NewestFirst,
            keep.get().saturating_add(1),
            "prune",
        )?
        .filter(|&(_, reached)| reached)
        .map(|(episode, _)| episode);
        let Some(cut) = cut else {
            let below = below_episode(&tx, target)?;
            return Ok(Pruned {
                below_episode: u64::try_from(below).unwrap_or(0),
                ..Pruned::default()
            });
        };
        let transitions = delete_rows_through(&tx, target, cut, "prune")?;
        let episodes = tx
            .prepare_cached(
                "DELETE FROM episodes WHERE namespace = ?1 AND name = ?2 AND episode <= ?3",
            )
            .and_then(|mut s| s.execute(params![target.namespace, target.name, cut]))
            .map_err(sq("prune", "episodes", target))?;
        let below = cut.saturating_add(1);
        tx.prepare_cached(
            "INSERT INTO retention (namespace, name, below_episode, pruned_rows) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (namespace, name) DO UPDATE SET \
             below_episode = max(below_episode, excluded.below_episode), \
             pruned_rows = pruned_rows + excluded.pruned_rows",
        )
        .and_then(|mut s| {
            s.execute(params![
                target.namespace,
                target.name,
                below,
                i64::try_from(transitions).unwrap_or(i64::MAX)
            ])
        })
        .map_err(sq("prune", "retention", target))?;
        tx.commit()
            .map_err(sq("commit prune", "transitions", target))?;
        tracing::debug!(target = %target, transitions, episodes, below_episode = below, "pruned the oldest episodes");
        Ok(Pruned {
            transitions,
            episodes: episodes as u64,
            below_episode: u64::try_from(below).unwrap_or(0),
        })
    }

    fn mark_deregistered(&self, target: &Target, since_ms: Option<i64>) -> Result<(), StoreError> {
        let conn = self.lock();
        match since_ms {
            Some(since) => conn
                .prepare_cached(
                    "INSERT INTO deregistered (namespace, name, since_ms) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (namespace, name) DO UPDATE SET since_ms = excluded.since_ms",
                )
                .and_then(|mut s| s.execute(params![target.namespace, target.name, since])),
            None => conn
                .prepare_cached("DELETE FROM deregistered WHERE namespace = ?1 AND name = ?2")
                .and_then(|mut s| s.execute(params![target.namespace, target.name])),
        }
        .map_err(sq("mark deregistered", "deregistered", target))?;
        Ok(())
    }

    fn deregistered(&self) -> Result<Vec<(Target, i64)>, StoreError> {
        self.lock()
            .prepare_cached(
                "SELECT namespace, name, since_ms FROM deregistered ORDER BY namespace, name",
            )
            .and_then(|mut s| {
                s.query_map([], |r| {
                    Ok((
                        Target::new(r.get::<_, String>(0)?, r.get::<_, String>(1)?),
                        r.get(2)?,
                    ))
                })?
                .collect()
            })
            .map_err(sq("list deregistered", "deregistered", &self.path))
    }

    fn forget(&self, target: &Target) -> Result<Forgotten, StoreError> {
        // The rows first, oldest episodes first, in transactions of about FORGET_CHUNK_ROWS:
        // each holds the lock briefly (appends of other targets go on in between) and adds a
        // few MB to the WAL, where one transaction over 10^6 rows would grow it by their size.
        // The mark goes in the last transaction, so an interrupted forget is finished by the
        // next attempt.
        let mut chunked = 0u64;
        while let Some(n) = self.forget_oldest_rows(target)? {
            chunked += n;
        }
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sq("begin forget", "transitions", target))?;
        let mut deleted = HashMap::new();
        for &(table, sql) in FORGET {
            let n = tx
                .prepare_cached(sql)
                .and_then(|mut s| s.execute(params![target.namespace, target.name]))
                .map_err(sq("forget", table, target))?;
            deleted.insert(table, n as u64);
        }
        tx.commit()
            .map_err(sq("commit forget", "transitions", target))?;
        let forgotten = Forgotten {
            transitions: chunked + deleted.get("transitions").copied().unwrap_or(0),
            episodes: deleted.get("episodes").copied().unwrap_or(0),
        };
        tracing::debug!(target = %target, transitions = forgotten.transitions, episodes = forgotten.episodes, "forgot a target");
        Ok(forgotten)
    }
}

/// Rows [`TrajectoryStore::forget`] deletes per transaction (whole episodes: at least one).
const FORGET_CHUNK_ROWS: u64 = 10_000;

impl SqliteStore {
    /// Deletes `target`'s oldest episodes holding about [`FORGET_CHUNK_ROWS`] rows in one
    /// transaction; the rows deleted, `None` when it has none left.
    fn forget_oldest_rows(&self, target: &Target) -> Result<Option<u64>, StoreError> {
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sq("begin forget", "transitions", target))?;
        // The oldest episodes holding FORGET_CHUNK_ROWS rows, or all there are.
        let cut = episode_reaching(&tx, target, Order::OldestFirst, FORGET_CHUNK_ROWS, "forget")?
            .map(|(episode, _)| episode);
        let Some(cut) = cut else {
            return Ok(None);
        };
        let n = delete_rows_through(&tx, target, cut, "forget")?;
        tx.commit()
            .map_err(sq("commit forget", "transitions", target))?;
        Ok(Some(n))
    }
}

/// The direction [`episode_reaching`] walks a target's episodes in.
#[derive(Clone, Copy)]
enum Order {
    OldestFirst,
    NewestFirst,
}

/// Walks `target`'s per-episode counts in `order` until they add up to `rows`: that episode and
/// `true`, or the last episode and `false` when they never do; `None` when it has no rows.
fn episode_reaching(
    conn: &Connection,
    target: &Target,
    order: Order,
    rows: u64,
    op: &'static str,
) -> Result<Option<(i64, bool)>, StoreError> {
    let sql = match order {
        Order::OldestFirst => {
            "SELECT episode, rows FROM episode_rows WHERE namespace = ?1 AND name = ?2 \
             ORDER BY episode"
        }
        Order::NewestFirst => {
            "SELECT episode, rows FROM episode_rows WHERE namespace = ?1 AND name = ?2 \
             ORDER BY episode DESC"
        }
    };
    conn.prepare_cached(sql)
        .and_then(|mut s| {
            let mut it = s.query(params![target.namespace, target.name])?;
            let (mut seen, mut last) = (0u64, None);
            while let Some(r) = it.next()? {
                let episode: i64 = r.get(0)?;
                seen = seen.saturating_add(u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0));
                if seen >= rows {
                    return Ok(Some((episode, true)));
                }
                last = Some((episode, false));
            }
            Ok(last)
        })
        .map_err(sq(op, "episode_rows", target))
}

/// Deletes `target`'s transitions of episodes up to and including `cut`, with their counts; the
/// rows deleted. The counts go first, in one statement, so the delete trigger finds none to
/// update for each row.
fn delete_rows_through(
    conn: &Connection,
    target: &Target,
    cut: i64,
    op: &'static str,
) -> Result<u64, StoreError> {
    conn.prepare_cached(
        "DELETE FROM episode_rows WHERE namespace = ?1 AND name = ?2 AND episode <= ?3",
    )
    .and_then(|mut s| s.execute(params![target.namespace, target.name, cut]))
    .map_err(sq(op, "episode_rows", target))?;
    conn.prepare_cached(
        "DELETE FROM transitions WHERE namespace = ?1 AND name = ?2 AND episode <= ?3",
    )
    .and_then(|mut s| s.execute(params![target.namespace, target.name, cut]))
    .map(|n| n as u64)
    .map_err(sq(op, "transitions", target))
}

/// The `DELETE`s of [`TrajectoryStore::forget`], in order (the per-episode counts before the
/// rows, so the delete trigger finds nothing to update), with the table each names.
const FORGET: &[(&str, &str)] = &[
    (
        "episode_rows",
        "DELETE FROM episode_rows WHERE namespace = ?1 AND name = ?2",
    ),
    (
        "transitions",
        "DELETE FROM transitions WHERE namespace = ?1 AND name = ?2",
    ),
    (
        "episodes",
        "DELETE FROM episodes WHERE namespace = ?1 AND name = ?2",
    ),
    (
        "retention",
        "DELETE FROM retention WHERE namespace = ?1 AND name = ?2",
    ),
    (
        "deregistered",
        "DELETE FROM deregistered WHERE namespace = ?1 AND name = ?2",
    ),
    (
        "targets",
        "DELETE FROM targets WHERE namespace = ?1 AND name = ?2",
    ),
];

/// `target`'s retention row: the first episode retention keeps and the rows it deleted so far
/// (both 0: never pruned).
fn retention(conn: &Connection, target: &Target) -> Result<(i64, i64), StoreError> {
    conn.prepare_cached(
        "SELECT below_episode, pruned_rows FROM retention WHERE namespace = ?1 AND name = ?2",
    )
    .and_then(|mut s| {
        s.query_row(params![target.namespace, target.name], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
    })
    .map(Option::unwrap_or_default)
    .map_err(sq("read retention", "retention", target))
}

/// The first episode of `target` that retention keeps (0: never pruned).
fn below_episode(conn: &Connection, target: &Target) -> Result<i64, StoreError> {
    retention(conn, target).map(|(below, _)| below)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::conformance::{self, Backend};

    /// One SQLite file per conformance case in a temporary directory; the same key opens the same
    /// file again.
    struct SqliteBackend {
        dir: tempfile::TempDir,
    }

    impl SqliteBackend {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().unwrap(),
            }
        }
    }

    impl Backend for SqliteBackend {
        type Store = SqliteStore;
        fn open(&self, key: &str) -> Result<SqliteStore, StoreError> {
            SqliteStore::open_path(self.dir.path().join(format!("{key}.sqlite")))
        }
    }

    macro_rules! conformance_tests {
        ($($case:ident),* $(,)?) => {$(
            #[test]
            fn $case() {
                let backend = SqliteBackend::new();
                if let Err(e) = conformance::$case(&backend) {
                    panic!("sqlite conformance: {e}");
                }
            }
        )*};
    }

    /// A transition of another time under a stored key (a step number reused, e.g. by a
    /// collector restarted at episode 0) is refused and counted; the stored one stays. The same
    /// step written again (a replay) still replaces it.
    #[test]
    fn a_different_step_under_a_stored_key_is_refused_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_path(dir.path().join("t.sqlite")).unwrap();
        let a = Target::new("ns", "a-app");
        let first = conformance::transition(&a, 0, 4);
        assert_eq!(
            store.append_counted(std::slice::from_ref(&first)).unwrap(),
            0
        );
        assert_eq!(
            store.append_counted(std::slice::from_ref(&first)).unwrap(),
            0
        );
        let mut later = conformance::transition(&a, 0, 4);
        later.ts_ms += 3_600_000;
        later.reward = -1.0;
        let other = conformance::transition(&a, 0, 5);
        assert_eq!(store.append_counted(&[later, other.clone()]).unwrap(), 1);
        assert_eq!(
            store.transitions(&a, 0..1).unwrap(),
            vec![first.clone(), other],
            "the recorded step kept, the new one beside it stored"
        );
        let mut replay = first;
        replay.reward = 0.125;
        assert_eq!(
            store.append_counted(std::slice::from_ref(&replay)).unwrap(),
            0
        );
        assert_eq!(store.transitions(&a, 0..1).unwrap()[0], replay);
    }

    mod conformance_sqlite {
        use super::*;
        conformance_tests!(
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
        );
    }

    /// The SQLite store without its own `rows_after`: the trait's default, the one QuestDB uses.
    struct DefaultRowsAfter(SqliteStore);

    impl TrajectoryStore for DefaultRowsAfter {
        fn backend(&self) -> &'static str {
            "sqlite-default-rows-after"
        }
        fn append(&self, batch: &[Transition]) -> Result<(), StoreError> {
            self.0.append(batch)
        }
        fn count(&self, target: &Target) -> Result<u64, StoreError> {
            self.0.count(target)
        }
        fn count_all(&self) -> Result<u64, StoreError> {
            self.0.count_all()
        }
        fn transitions(
            &self,
            target: &Target,
            episodes: Range<u64>,
        ) -> Result<Vec<Transition>, StoreError> {
            self.0.transitions(target, episodes)
        }
        fn sample_rows(
            &self,
            target: Option<&Target>,
            n: usize,
            seed: u64,
        ) -> Result<Sample, StoreError> {
            self.0.sample_rows(target, n, seed)
        }
        fn put_episode(&self, summary: &EpisodeSummary) -> Result<(), StoreError> {
            self.0.put_episode(summary)
        }
        fn episodes(&self, target: &Target, n: usize) -> Result<Vec<EpisodeSummary>, StoreError> {
            self.0.episodes(target, n)
        }
        fn top_episodes(
            &self,
            target: &Target,
            m: usize,
        ) -> Result<Vec<EpisodeSummary>, StoreError> {
            self.0.top_episodes(target, m)
        }
        fn targets(&self) -> Result<Vec<Target>, StoreError> {
            self.0.targets()
        }
        fn prune(&self, target: &Target, keep: NonZeroU64) -> Result<Pruned, StoreError> {
            self.0.prune(target, keep)
        }
        fn recorded(&self, target: &Target) -> Result<u64, StoreError> {
            self.0.recorded(target)
        }
        fn mark_deregistered(
            &self,
            target: &Target,
            since_ms: Option<i64>,
        ) -> Result<(), StoreError> {
            self.0.mark_deregistered(target, since_ms)
        }
        fn deregistered(&self) -> Result<Vec<(Target, i64)>, StoreError> {
            self.0.deregistered()
        }
        fn forget(&self, target: &Target) -> Result<Forgotten, StoreError> {
            self.0.forget(target)
        }
    }

    struct DefaultBackend(SqliteBackend);

    impl Backend for DefaultBackend {
        type Store = DefaultRowsAfter;
        fn open(&self, key: &str) -> Result<DefaultRowsAfter, StoreError> {
            self.0.open(key).map(DefaultRowsAfter)
        }
    }

    #[test]
    fn the_default_rows_after_passes_the_suite() {
        let backend = DefaultBackend(SqliteBackend::new());
        let report = conformance::run_all(&backend);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
    }

    #[test]
    fn run_all_covers_every_case() {
        let backend = SqliteBackend::new();
        let report = conformance::run_all(&backend);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(report.passed, conformance::CASE_NAMES.len());
    }

    /// The documented async usage: an `Arc<dyn TrajectoryStore>` called through
    /// `spawn_blocking` from several tasks.
    #[test]
    fn dyn_store_is_usable_from_spawn_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let store: std::sync::Arc<dyn TrajectoryStore> =
            std::sync::Arc::new(SqliteStore::open_path(dir.path().join("d.sqlite")).unwrap());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let target = Target::new("ns", "async");
        rt.block_on(async {
            let tasks: Vec<_> = (0..4u64)
                .map(|e| {
                    let (store, target) = (store.clone(), target.clone());
                    tokio::task::spawn_blocking(move || {
                        let batch: Vec<_> = (0..25)
                            .map(|s| conformance::transition(&target, e, s))
                            .collect();
                        store.append(&batch)
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap().unwrap();
            }
        });
        assert_eq!(store.backend(), "sqlite");
        assert_eq!(store.count(&target).unwrap(), 100);
        assert_eq!(store.transitions(&target, 3..4).unwrap().len(), 25);
    }

    #[test]
    fn open_sets_wal_full_and_current_schema() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_path(dir.path().join("s.sqlite")).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        let conn = store.lock();
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = conn
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 2, "FULL is 2");
    }

    #[test]
    fn a_version_1_file_is_migrated_with_its_rows_and_can_be_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.sqlite");
        let t = Target::new("ns", "old");
        {
            // A file written by a build that knew schema v1 only.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
        }
        {
            let mut conn = Connection::open(&path).unwrap();
            let tx = conn.transaction().unwrap();
            {
                let mut ins = tx.prepare_cached(UPSERT_TRANSITION).unwrap();
                for e in 0..3 {
                    for s in 0..4 {
                        write_transition(&mut ins, &conformance::transition(&t, e, s)).unwrap();
                    }
                }
            }
            tx.commit().unwrap();
        }
        let store = SqliteStore::open_path(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_episode_rows_match(&store);
        assert_eq!(
            store.count(&t).unwrap(),
            12,
            "v1 rows survive the migration"
        );
        let all = store.transitions(&t, 0..u64::MAX).unwrap();
        assert_eq!(
            store.sample(Some(&t), 20, 5).unwrap(),
            conformance::documented_draw(&all, 20, 5),
            "the migrated counts serve the documented draw"
        );
        let p = store.prune(&t, NonZeroU64::new(4).unwrap()).unwrap();
        assert_eq!((p.transitions, p.below_episode), (8, 2));
        assert_eq!(store.transitions(&t, 0..u64::MAX).unwrap().len(), 4);
        assert_episode_rows_match(&store);
    }

    /// A target of 25,000 rows is forgotten in chunks of whole episodes (three transactions of
    /// rows, then the rest), every row counted once; another target keeps everything; the WAL's
    /// size limit is set.
    #[test]
    fn forgetting_a_large_target_goes_in_chunks_and_counts_every_row() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_path(dir.path().join("f.sqlite")).unwrap();
        let (big, small) = (Target::new("ns", "big"), Target::new("ns", "small"));
        let rows = |t: &Target, episodes: u64| -> Vec<Transition> {
            (0..episodes)
                .flat_map(|e| (0..100).map(move |s| (e, s)))
                .map(|(e, s)| conformance::transition(t, e, s))
                .collect()
        };
        for chunk in rows(&big, 250).chunks(5_000) {
            store.append(chunk).unwrap();
        }
        store.append(&rows(&small, 3)).unwrap();
        store.mark_deregistered(&big, Some(1)).unwrap();
        assert_eq!(
            store.forget_oldest_rows(&big).unwrap(),
            Some(FORGET_CHUNK_ROWS),
            "one chunk: the oldest 100 episodes"
        );
        assert_eq!(store.count(&big).unwrap(), 15_000);
        assert_eq!(store.transitions(&big, 0..100).unwrap().len(), 0);
        let f = store.forget(&big).unwrap();
        assert_eq!(f.transitions, 15_000, "the rest, counted once");
        assert_eq!(store.count(&big).unwrap(), 0);
        assert_eq!(store.forget_oldest_rows(&big).unwrap(), None);
        assert!(store.deregistered().unwrap().is_empty());
        assert_eq!(store.count(&small).unwrap(), 300);
        assert_eq!(store.targets().unwrap(), vec![small.clone()]);
        assert_episode_rows_match(&store);
        let limit: i64 = store
            .lock()
            .pragma_query_value(None, "journal_size_limit", |r| r.get(0))
            .unwrap();
        assert_eq!(limit, WAL_SIZE_LIMIT);
    }

    /// `episode_rows` holds exactly the per-episode counts of `transitions`, and no step range
    /// narrower than the episode's rows.
    fn assert_episode_rows_match(store: &SqliteStore) {
        let conn = store.lock();
        let read = |sql: &str| -> Vec<(String, String, i64, i64, i64, i64)> {
            conn.prepare(sql)
                .unwrap()
                .query_map([], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                })
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        };
        let kept = read(
            "SELECT namespace, name, episode, rows, min_step, max_step FROM episode_rows \
             ORDER BY namespace, name, episode",
        );
        let actual = read(
            "SELECT namespace, name, episode, count(*), min(step), max(step) FROM transitions \
             GROUP BY namespace, name, episode ORDER BY namespace, name, episode",
        );
        assert_eq!(kept.len(), actual.len(), "one count per stored episode");
        for (k, a) in kept.iter().zip(&actual) {
            assert_eq!((&k.0, &k.1, k.2, k.3), (&a.0, &a.1, a.2, a.3), "rows");
            assert!(
                k.4 <= a.4 && k.5 >= a.5,
                "step range {k:?} narrower than {a:?}"
            );
        }
    }

    /// Sampling from the per-episode counts draws exactly the documented ordinals over the rows
    /// in key order, through replays, gaps in the steps, retention and a row deleted by hand
    /// inside an episode (its step range then no longer matches its rows).
    #[test]
    fn per_episode_counts_follow_every_write_and_serve_the_documented_draw() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_path(dir.path().join("c.sqlite")).unwrap();
        let (a, b) = (Target::new("ns", "a"), Target::new("ns", "b"));
        let check = |store: &SqliteStore, what: &str| {
            assert_episode_rows_match(store);
            let mut every = Vec::new();
            for t in [&a, &b] {
                let rows = store.transitions(t, 0..u64::MAX).unwrap();
                assert_eq!(store.count(t).unwrap(), rows.len() as u64, "{what}: count");
                for seed in [1, 2, 3] {
                    let want = conformance::documented_draw(&rows, 64, seed);
                    assert_eq!(
                        store.sample(Some(t), 64, seed).unwrap(),
                        want,
                        "{what}: {t}"
                    );
                }
                every.extend(rows);
            }
            assert_eq!(
                store.count_all().unwrap(),
                every.len() as u64,
                "{what}: count_all"
            );
            let want = conformance::documented_draw(&every, 64, 9);
            assert_eq!(
                store.sample(None, 64, 9).unwrap(),
                want,
                "{what}: all targets"
            );
        };
        // Contiguous episodes for a; for b, episodes with gaps (every third step missing).
        let contiguous: Vec<_> = (0..6)
            .flat_map(|e| (0..10).map(move |s| (e, s)))
            .map(|(e, s)| conformance::transition(&a, e, s))
            .collect();
        let gapped: Vec<_> = (0..6)
            .flat_map(|e| (1..15).filter(|s| s % 3 != 0).map(move |s| (e, s)))
            .map(|(e, s)| conformance::transition(&b, e, s))
            .collect();
        store.append(&contiguous).unwrap();
        store.append(&gapped).unwrap();
        check(&store, "first writes");
        // A replay of rows already stored changes no count.
        store.append(&contiguous[5..25]).unwrap();
        store.append(&gapped[..12]).unwrap();
        check(&store, "replays");
        // Retention, then a replay of pruned rows (skipped).
        let p = store.prune(&a, NonZeroU64::new(25).unwrap()).unwrap();
        assert_eq!(
            (p.transitions, p.below_episode),
            (40, 4),
            "a keeps episodes 4 and 5"
        );
        store.prune(&b, NonZeroU64::new(20).unwrap()).unwrap();
        store.append(&contiguous[..20]).unwrap();
        check(&store, "retention");
        // A row deleted by hand in the middle and one at the start of an episode of a.
        store
            .lock()
            .execute_batch(
                "DELETE FROM transitions WHERE name = 'a' AND episode = 4 AND step = 5; \
                 DELETE FROM transitions WHERE name = 'a' AND episode = 5 AND step = 0;",
            )
            .unwrap();
        check(&store, "rows deleted by hand");
        // Reopening keeps the counts.
        drop(store);
        let store = SqliteStore::open_path(dir.path().join("c.sqlite")).unwrap();
        check(&store, "reopen");
    }

    #[test]
    fn durability_normal_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SqliteConfig::new(dir.path().join("n.sqlite"));
        cfg.durability = Durability::Normal;
        let store = SqliteStore::open(&cfg).unwrap();
        let sync: i64 = store
            .lock()
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 1, "NORMAL is 1");
    }

    #[test]
    fn refuses_a_file_from_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.sqlite");
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
                .unwrap();
        }
        match SqliteStore::open_path(&path) {
            Err(StoreError::SchemaTooNew {
                found, supported, ..
            }) => {
                assert_eq!(found, SCHEMA_VERSION + 1);
                assert_eq!(supported, SCHEMA_VERSION);
            }
            other => panic!("expected SchemaTooNew, got {other:?}"),
        }
    }

    #[test]
    fn corrupt_vector_blob_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_path(dir.path().join("c.sqlite")).unwrap();
        let t = conformance::transition(&Target::new("ns", "a"), 0, 0);
        store.append(std::slice::from_ref(&t)).unwrap();
        store
            .lock()
            .execute("UPDATE transitions SET state = x'000102'", [])
            .unwrap();
        let err = store.transitions(&t.target, 0..1).unwrap_err();
        match &err {
            StoreError::Corrupt { table, detail, .. } => {
                assert_eq!(table, "transitions");
                assert!(detail.contains("state BLOB of 3 bytes"), "{detail}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn vectors_are_little_endian_f32_blobs() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_path(dir.path().join("b.sqlite")).unwrap();
        let mut t = conformance::transition(&Target::new("ns", "a"), 0, 0);
        t.state = vec![1.0, -2.5];
        store.append(std::slice::from_ref(&t)).unwrap();
        let blob: Vec<u8> = store
            .lock()
            .query_row("SELECT state FROM transitions", [], |r| r.get(0))
            .unwrap();
        assert_eq!(blob, [0, 0, 0x80, 0x3f, 0, 0, 0x20, 0xc0]);
    }

    const CRASH_ENV: &str = "AWARE_STORE_CRASH_CHILD_PATH";
    const CRASH_ROWS: u32 = 250;

    /// Run only as the child of `committed_rows_survive_a_process_abort`: appends and commits,
    /// then aborts the process without closing the connection (no destructors, no checkpoint).
    #[test]
    #[ignore = "child process of committed_rows_survive_a_process_abort"]
    fn crash_child() {
        let path = std::env::var(CRASH_ENV).expect("run by committed_rows_survive_a_process_abort");
        let store = SqliteStore::open_path(&path).unwrap();
        let target = Target::new("crash", "app");
        for chunk in (0..CRASH_ROWS).collect::<Vec<_>>().chunks(50) {
            let batch: Vec<_> = chunk
                .iter()
                .map(|&s| conformance::transition(&target, 0, s))
                .collect();
            store.append(&batch).unwrap();
        }
        std::process::abort();
    }

    #[test]
    fn committed_rows_survive_a_process_abort() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crash.sqlite");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "trajectory::sqlite::tests::crash_child",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_ENV, &path)
            .output()
            .unwrap();
        let log = || {
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        assert!(
            !out.status.success(),
            "the child must die by abort: {}",
            log()
        );
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(out.status.signal(), Some(6), "SIGABRT expected: {}", log());
        }
        // The WAL still holds the commits: nothing was checkpointed at close.
        assert!(dir.path().join("crash.sqlite-wal").exists());
        let store = SqliteStore::open_path(&path).unwrap();
        let target = Target::new("crash", "app");
        assert_eq!(store.count(&target).unwrap(), u64::from(CRASH_ROWS));
        let rows = store.transitions(&target, 0..1).unwrap();
        assert_eq!(rows.len(), CRASH_ROWS as usize);
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(r, &conformance::transition(&target, 0, i as u32));
        }
    }
}
