//! The production trajectory store: QuestDB.
//!
//! * **Writes** go through `questdb-rs`'s ILP-over-HTTP sender, one transactional flush per call
//!   (a batch is all-or-nothing), to the `/write` endpoint of [`QuestDbConfig::url`].
//! * **Reads** are SQL over the HTTP `/exec` endpoint of the same URL (JSON answers), through a
//!   small blocking `ureq` client without TLS: the URL must be `http://` (QuestDB runs in-cluster
//!   beside the services; the Helm chart does not put TLS in front of it). Long reads are paged
//!   with `/exec`'s `limit=lo,hi` ([`QuestDbConfig::page_rows`] rows per request).
//! * **Tables** `<prefix>transitions` and `<prefix>episodes` are created on open with
//!   `CREATE TABLE IF NOT EXISTS … TIMESTAMP(ts) PARTITION BY DAY WAL DEDUP UPSERT KEYS(…)`. The
//!   designated timestamp `ts` is the row's `ts_ms` (kept also as a plain `LONG` column, read back
//!   exactly); the dedup keys are `(ts, namespace, name, episode, step)` and
//!   `(ts, namespace, name, episode)`, which makes writes idempotent (see the store contract).
//! * **Vectors** are `VARCHAR` columns holding the lowercase hex of the little-endian `f32` bytes
//!   (the same bytes as SQLite's BLOBs): exact, and readable over JSON, which has no binary type
//!   (ILP cannot write QuestDB's `BINARY` columns, and `DOUBLE[]` arrays would come back as decimal
//!   text). An empty vector is an empty string.
//! * **Doubles** are sent in binary form when the server negotiates ILP protocol version 2 and read
//!   back from JSON with serde_json's `float_roundtrip` parser; exact round trips also need the
//!   server to print shortest round-trip decimals (QuestDB's Ryu-based formatting).
//! * **Visibility.** WAL tables apply committed writes asynchronously. So that a read after a
//!   write sees it (the contract both backends share), `append` and `put_episode` wait until the
//!   table's `writerTxn` reaches its `sequencerTxn` (`wal_tables()`), up to
//!   [`QuestDbConfig::visibility_timeout`]; a zero timeout does not wait. `open` waits the same
//!   way, so a handle opened after a server restart reads every row acknowledged before it.
//! * **Retention.** QuestDB has no row `DELETE`; it drops whole time partitions (by TTL or
//!   `ALTER TABLE … DROP PARTITION`), for every target at once. So [`TrajectoryStore::prune`]
//!   answers [`StoreError::Unsupported`] and the recorder refuses `trajectory_store.keep_transitions`
//!   with this store: bound its tables with `ALTER TABLE <prefix>transitions SET TTL …` instead.

use std::collections::{BTreeSet, HashMap};
use std::num::NonZeroU64;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ::questdb::ingress::{Buffer, Sender, TimestampMicros};
use aware_bus_schemas::{Resources, Target};
use serde_json::Value;

use super::{
    episode_bounds, f32s_to_le_bytes, le_bytes_to_f32s, parse_source, parse_stage, sample_ordinals,
    source_str, EpisodeSummary, Forgotten, Pruned, Sample, StoreError, TrajectoryStore, Transition,
};

/// Where QuestDB is and how to talk to it.
#[derive(Debug, Clone, PartialEq)]
pub struct QuestDbConfig {
    /// HTTP base URL of QuestDB, e.g. `http://questdb:9000` (ILP writes and SQL reads).
    pub url: String,
    /// Prefix of the table names (`<prefix>transitions`, `<prefix>episodes`): ASCII letters,
    /// digits and `_`.
    pub table_prefix: String,
    /// Timeout of one HTTP request (and the ILP sender's retry budget).
    pub request_timeout: Duration,
    /// How long a write waits for its rows to become visible to reads; zero does not wait.
    pub visibility_timeout: Duration,
    /// Rows per `/exec` page on long reads.
    pub page_rows: usize,
}

impl QuestDbConfig {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            table_prefix: "aware_".to_owned(),
            request_timeout: Duration::from_secs(10),
            visibility_timeout: Duration::from_secs(10),
            page_rows: 10_000,
        }
    }

    /// `host:port` of an `http://host:port[/]` URL.
    fn authority(&self) -> Result<&str, StoreError> {
        let rest = self.url.strip_prefix("http://").ok_or_else(|| {
            invalid(
                "url",
                format!(
                    "`{}` must start with http:// (reads use a client without TLS)",
                    self.url
                ),
            )
        })?;
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
            return Err(invalid(
                "url",
                format!(
                    "`{}` must be http://host:port with no path, query or credentials",
                    self.url
                ),
            ));
        }
        Ok(authority)
    }

    fn validate(&self) -> Result<(), StoreError> {
        self.authority()?;
        if !self
            .table_prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(invalid(
                "table_prefix",
                format!(
                    "`{}` may only hold ASCII letters, digits and `_`",
                    self.table_prefix
                ),
            ));
        }
        if self.page_rows == 0 {
            return Err(invalid("page_rows", "must be at least 1".to_owned()));
        }
        if self.request_timeout.is_zero() {
            return Err(invalid("request_timeout", "must be positive".to_owned()));
        }
        Ok(())
    }
}

fn invalid(setting: &'static str, reason: String) -> StoreError {
    StoreError::QuestDbConfig { setting, reason }
}

/// What went wrong with one `/exec` request or its answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("HTTP request failed: {0}")]
    Request(#[source] Box<ureq::Error>),
    #[error("reading the answer failed: {0}")]
    Read(#[source] Box<ureq::Error>),
    #[error("HTTP {status}: answer is not JSON ({source}): {head}")]
    NotJson {
        status: u16,
        /// The answer's first 200 characters.
        head: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("HTTP {status}: {message}{}", position.map_or_else(String::new, |p| format!(" at position {p}")))]
    Refused {
        status: u16,
        message: String,
        position: Option<i64>,
    },
    #[error("HTTP {status}: {answer}")]
    Status { status: u16, answer: Value },
    #[error("dataset row is not an array: {0}")]
    RowNotArray(Value),
    #[error("dataset is not an array: {0}")]
    DatasetNotArray(Value),
    #[error("unexpected answer {0:?}")]
    Unexpected(Vec<Vec<Value>>),
    #[error("the table is suspended{}{} (see wal_tables() and the server log)", if *.resumed { " again after RESUME WAL" } else { "" }, if message.is_empty() { String::new() } else { format!(": {message}") })]
    Suspended {
        /// QuestDB's `errorTag` and `errorMessage` of the failed apply, as one line.
        message: String,
        /// Whether this store had already resumed the table once in this wait.
        resumed: bool,
    },
}

/// Why a cell of an `/exec` row cannot be read as the column's type; names the column.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CellError {
    #[error("row has no column {index} ({column})")]
    Missing { index: usize, column: String },
    #[error("{column} = {value} is not a {expected}")]
    Type {
        column: String,
        value: Value,
        expected: &'static str,
    },
    #[error("{column} = {value} is out of u32 range")]
    OutOfU32 { column: String, value: i64 },
    #[error("{column} = {value} is negative")]
    Negative { column: String, value: i64 },
    #[error("{column} is not hex of little-endian f32s ({chars} chars)")]
    NotF32Hex { column: String, chars: usize },
    #[error("{column} = {value:?}")]
    UnknownName { column: &'static str, value: String },
}

/// The QuestDB trajectory store; see the module documentation.
pub struct QuestDbStore {
    cfg: QuestDbConfig,
    base: String,
    transitions_table: String,
    episodes_table: String,
    sender: Mutex<Sender>,
    agent: ureq::Agent,
}

impl std::fmt::Debug for QuestDbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuestDbStore")
            .field("url", &self.cfg.url)
            .field("transitions_table", &self.transitions_table)
            .field("episodes_table", &self.episodes_table)
            .finish_non_exhaustive()
    }
}

const TRANSITION_COLS: &str = "namespace, name, episode, step, ts_ms, state, action_raw, \
     desired_replicas, desired_cpu_millicores, desired_memory_bytes, \
     applied_replicas, applied_cpu_millicores, applied_memory_bytes, \
     source, stage, reward, next_state, slo_violation, cpu_util, memory_util";

const EPISODE_COLS: &str = "namespace, name, episode, last_step, ts_ms, steps, total_reward, \
     mean_reward, slo_violations, cpu_util_mean, memory_util_mean, rl_steps, fallback_steps, \
     stage, policy_estimate";

/// Largest response body read from `/exec`.
const MAX_BODY_BYTES: u64 = 512 << 20;

fn create_transitions_sql(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\
         ts TIMESTAMP, namespace SYMBOL, name SYMBOL, episode LONG, step LONG, ts_ms LONG, \
         state VARCHAR, action_raw VARCHAR, \
         desired_replicas LONG, desired_cpu_millicores LONG, desired_memory_bytes LONG, \
         applied_replicas LONG, applied_cpu_millicores LONG, applied_memory_bytes LONG, \
         source SYMBOL, stage SYMBOL, reward DOUBLE, next_state VARCHAR, slo_violation BOOLEAN, \
         cpu_util DOUBLE, memory_util DOUBLE\
         ) TIMESTAMP(ts) PARTITION BY DAY WAL DEDUP UPSERT KEYS(ts, namespace, name, episode, step)"
    )
}

fn create_episodes_sql(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\
         ts TIMESTAMP, namespace SYMBOL, name SYMBOL, episode LONG, last_step LONG, ts_ms LONG, \
         steps LONG, total_reward DOUBLE, mean_reward DOUBLE, slo_violations LONG, \
         cpu_util_mean DOUBLE, memory_util_mean DOUBLE, rl_steps LONG, fallback_steps LONG, \
         stage SYMBOL, policy_estimate DOUBLE\
         ) TIMESTAMP(ts) PARTITION BY DAY WAL DEDUP UPSERT KEYS(ts, namespace, name, episode)"
    )
}

/// A SQL string literal.
pub(crate) fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn target_filter(t: &Target) -> String {
    format!(
        "namespace = {} AND name = {}",
        lit(&t.namespace),
        lit(&t.name)
    )
}

pub(crate) fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

pub(crate) fn hex_decode(s: &str) -> Option<Vec<u8>> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some((nibble(p[0])? << 4) | nibble(p[1])?))
        .collect()
}

fn vec_to_hex(v: &[f32]) -> String {
    hex_encode(&f32s_to_le_bytes(v))
}

fn i64_of(v: u64) -> i64 {
    // Callers validated the value; saturate rather than wrap regardless.
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn micros(ts_ms: i64) -> TimestampMicros {
    TimestampMicros::new(ts_ms.saturating_mul(1000))
}

/// The parts of an `/exec` JSON answer the store reads.
#[derive(Debug, PartialEq)]
pub(crate) struct ExecAnswer {
    pub columns: Vec<String>,
    pub dataset: Vec<Vec<Value>>,
}

/// Parses an `/exec` answer: `{"columns": [{"name": …}], "dataset": [[…]]}` on success,
/// `{"error": "…", "position": n}` on failure (any HTTP status), `{"ddl": "OK"}` for DDL.
pub(crate) fn parse_exec_answer(status: u16, body: &str) -> Result<ExecAnswer, QueryError> {
    let v: Value = serde_json::from_str(body).map_err(|source| QueryError::NotJson {
        status,
        head: body.chars().take(200).collect(),
        source,
    })?;
    if let Some(err) = v.get("error").and_then(Value::as_str) {
        return Err(QueryError::Refused {
            status,
            message: err.to_owned(),
            position: v.get("position").and_then(Value::as_i64),
        });
    }
    if !(200..300).contains(&status) {
        return Err(QueryError::Status { status, answer: v });
    }
    let columns = v
        .get("columns")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let dataset = match v.get("dataset") {
        None => Vec::new(),
        Some(Value::Array(rows)) => rows
            .iter()
            .map(|r| match r {
                Value::Array(cells) => Ok(cells.clone()),
                other => Err(QueryError::RowNotArray(other.clone())),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(QueryError::DatasetNotArray(other.clone())),
    };
    Ok(ExecAnswer { columns, dataset })
}

/// Typed access to one `/exec` row; errors name the column.
struct Cells<'a> {
    row: &'a [Value],
}

impl Cells<'_> {
    fn cell(&self, i: usize, col: &str) -> Result<&Value, CellError> {
        self.row.get(i).ok_or_else(|| CellError::Missing {
            index: i,
            column: col.to_owned(),
        })
    }
    fn typed<'v, T>(
        v: &'v Value,
        col: &str,
        expected: &'static str,
        read: impl Fn(&'v Value) -> Option<T>,
    ) -> Result<T, CellError> {
        read(v).ok_or_else(|| CellError::Type {
            column: col.to_owned(),
            value: v.clone(),
            expected,
        })
    }
    fn i64(&self, i: usize, col: &str) -> Result<i64, CellError> {
        Self::typed(self.cell(i, col)?, col, "LONG", Value::as_i64)
    }
    fn u32(&self, i: usize, col: &str) -> Result<u32, CellError> {
        let v = self.i64(i, col)?;
        u32::try_from(v).map_err(|_| CellError::OutOfU32 {
            column: col.to_owned(),
            value: v,
        })
    }
    fn u64(&self, i: usize, col: &str) -> Result<u64, CellError> {
        let v = self.i64(i, col)?;
        u64::try_from(v).map_err(|_| CellError::Negative {
            column: col.to_owned(),
            value: v,
        })
    }
    fn f64(&self, i: usize, col: &str) -> Result<f64, CellError> {
        Self::typed(self.cell(i, col)?, col, "DOUBLE", Value::as_f64)
    }
    fn opt_f64(&self, i: usize, col: &str) -> Result<Option<f64>, CellError> {
        match self.cell(i, col)? {
            Value::Null => Ok(None),
            v => Self::typed(v, col, "DOUBLE", Value::as_f64).map(Some),
        }
    }
    fn bool(&self, i: usize, col: &str) -> Result<bool, CellError> {
        Self::typed(self.cell(i, col)?, col, "BOOLEAN", Value::as_bool)
    }
    fn str(&self, i: usize, col: &str) -> Result<&str, CellError> {
        Self::typed(self.cell(i, col)?, col, "string", Value::as_str)
    }
    /// A hex-encoded vector; NULL (an empty string may come back as NULL) is empty.
    fn vector(&self, i: usize, col: &str) -> Result<Vec<f32>, CellError> {
        match self.cell(i, col)? {
            Value::Null => Ok(Vec::new()),
            Value::String(s) => hex_decode(s)
                .and_then(|b| le_bytes_to_f32s(&b))
                .ok_or_else(|| CellError::NotF32Hex {
                    column: col.to_owned(),
                    chars: s.len(),
                }),
            v => Self::typed(v, col, "string", |_| None::<Vec<f32>>),
        }
    }
    fn key(&self) -> String {
        let s = |i| {
            self.row
                .get(i)
                .map_or_else(String::new, |v: &Value| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
        };
        format!("{}/{} episode {} step {}", s(0), s(1), s(2), s(3))
    }
}

fn unknown(column: &'static str, value: &str) -> CellError {
    CellError::UnknownName {
        column,
        value: value.to_owned(),
    }
}

/// Decodes a row selected with `TRANSITION_COLS`.
pub(crate) fn decode_transition(row: &[Value]) -> Result<Transition, (String, CellError)> {
    let c = Cells { row };
    let inner = || -> Result<Transition, CellError> {
        let res = |base: usize, name: &str| -> Result<Resources, CellError> {
            Ok(Resources {
                replicas: c.u32(base, &format!("{name}_replicas"))?,
                cpu_millicores: c.u32(base + 1, &format!("{name}_cpu_millicores"))?,
                memory_bytes: c.u64(base + 2, &format!("{name}_memory_bytes"))?,
            })
        };
        let source = c.str(13, "source")?;
        let stage = c.str(14, "stage")?;
        Ok(Transition {
            target: Target::new(c.str(0, "namespace")?, c.str(1, "name")?),
            episode: c.u64(2, "episode")?,
            step: c.u32(3, "step")?,
            ts_ms: c.i64(4, "ts_ms")?,
            state: c.vector(5, "state")?,
            action_raw: c.vector(6, "action_raw")?,
            desired: res(7, "desired")?,
            applied: res(10, "applied")?,
            source: parse_source(source).ok_or_else(|| unknown("source", source))?,
            stage: parse_stage(stage).ok_or_else(|| unknown("stage", stage))?,
            reward: c.f64(15, "reward")?,
            next_state: c.vector(16, "next_state")?,
            slo_violation: c.bool(17, "slo_violation")?,
            cpu_util: c.f64(18, "cpu_util")?,
            memory_util: c.f64(19, "memory_util")?,
        })
    };
    inner().map_err(|detail| (c.key(), detail))
}

/// Decodes a row selected with `EPISODE_COLS`.
pub(crate) fn decode_episode(row: &[Value]) -> Result<EpisodeSummary, (String, CellError)> {
    let c = Cells { row };
    let inner = || -> Result<EpisodeSummary, CellError> {
        let stage = c.str(13, "stage")?;
        Ok(EpisodeSummary {
            target: Target::new(c.str(0, "namespace")?, c.str(1, "name")?),
            episode: c.u64(2, "episode")?,
            step: c.u32(3, "last_step")?,
            ts_ms: c.i64(4, "ts_ms")?,
            steps: c.u32(5, "steps")?,
            total_reward: c.f64(6, "total_reward")?,
            mean_reward: c.f64(7, "mean_reward")?,
            slo_violations: c.u32(8, "slo_violations")?,
            cpu_util_mean: c.f64(9, "cpu_util_mean")?,
            memory_util_mean: c.f64(10, "memory_util_mean")?,
            rl_steps: c.u32(11, "rl_steps")?,
            fallback_steps: c.u32(12, "fallback_steps")?,
            stage: parse_stage(stage).ok_or_else(|| unknown("stage", stage))?,
            policy_estimate: c.opt_f64(14, "policy_estimate")?,
        })
    };
    inner().map_err(|detail| {
        let key = format!(
            "{}/{} episode {}",
            c.str(0, "namespace").unwrap_or("?"),
            c.str(1, "name").unwrap_or("?"),
            c.i64(2, "episode")
                .map_or_else(|_| "?".to_owned(), |e| e.to_string())
        );
        (key, detail)
    })
}

/// Contiguous runs `[start, end)` covering sorted, deduplicated ordinals.
fn runs(sorted: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &o in sorted {
        match out.last_mut() {
            Some((_, end)) if *end == o => *end += 1,
            _ => out.push((o, o + 1)),
        }
    }
    out
}

/// One episode of the sampled scope: its row count and step range.
#[derive(Debug, Clone, PartialEq)]
struct EpisodeGroup {
    target: Target,
    episode: i64,
    rows: u64,
    lo: i64,
    hi: i64,
    /// Earliest and latest `ts_ms` of the episode's rows.
    first_ms: i64,
    last_ms: i64,
}

impl EpisodeGroup {
    /// Steps `lo..=hi`, each once.
    fn contiguous(&self) -> bool {
        self.hi
            .checked_sub(self.lo)
            .and_then(|d| u64::try_from(d).ok())
            .is_some_and(|d| d + 1 == self.rows)
    }
}

/// Longest SQL text of one keyed sample query (it travels in the URL of a GET).
const MAX_SAMPLE_SQL: usize = 6_000;

impl QuestDbStore {
    /// Connects (the ILP sender negotiates its protocol version with the server) and creates the
    /// tables when absent.
    pub fn open(cfg: QuestDbConfig) -> Result<Self, StoreError> {
        cfg.validate()?;
        let authority = cfg.authority()?.to_owned();
        let base = format!("http://{authority}");
        let transitions_table = format!("{}transitions", cfg.table_prefix);
        let episodes_table = format!("{}episodes", cfg.table_prefix);
        let timeout_ms = cfg.request_timeout.as_millis();
        let conf = format!(
            "http::addr={authority};request_timeout={timeout_ms};retry_timeout={timeout_ms};"
        );
        let sender = Sender::from_conf(&conf).map_err(|source| StoreError::QuestDbIngest {
            op: "connect ILP sender",
            table: transitions_table.clone(),
            url: base.clone(),
            source: Box::new(source),
        })?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(cfg.request_timeout))
            .build()
            .into();
        let store = Self {
            cfg,
            base,
            transitions_table,
            episodes_table,
            sender: Mutex::new(sender),
            agent,
        };
        store.exec(
            &create_transitions_sql(&store.transitions_table),
            "create table",
            &store.transitions_table,
            None,
        )?;
        store.exec(
            &create_episodes_sql(&store.episodes_table),
            "create table",
            &store.episodes_table,
            None,
        )?;
        // After a server restart the tables apply the WAL committed before it asynchronously:
        // wait, so that the first read of a new handle sees every acknowledged row.
        store.wait_visible(&store.transitions_table, "open")?;
        store.wait_visible(&store.episodes_table, "open")?;
        tracing::info!(
            url = %store.base,
            transitions = %store.transitions_table,
            episodes = %store.episodes_table,
            "opened questdb trajectory store"
        );
        Ok(store)
    }

    pub fn config(&self) -> &QuestDbConfig {
        &self.cfg
    }

    fn lock(&self) -> MutexGuard<'_, Sender> {
        self.sender.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs one `/exec` request; `limit` is `/exec`'s row window `(lo, hi)`.
    fn exec(
        &self,
        sql: &str,
        op: &'static str,
        table: &str,
        limit: Option<(u64, u64)>,
    ) -> Result<ExecAnswer, StoreError> {
        let query_err = |source: QueryError| StoreError::QuestDbQuery {
            op,
            table: table.to_owned(),
            url: self.base.clone(),
            query: sql.to_owned(),
            source: Box::new(source),
        };
        let mut req = self
            .agent
            .get(format!("{}/exec", self.base))
            .query("query", sql);
        if let Some((lo, hi)) = limit {
            req = req.query("limit", format!("{lo},{hi}"));
        }
        let resp = req
            .call()
            .map_err(|e| query_err(QueryError::Request(Box::new(e))))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .into_with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_string()
            .map_err(|e| query_err(QueryError::Read(Box::new(e))))?;
        parse_exec_answer(status, &body).map_err(query_err)
    }

    /// Every row of a SELECT, paged.
    fn select_all(
        &self,
        sql: &str,
        op: &'static str,
        table: &str,
    ) -> Result<Vec<Vec<Value>>, StoreError> {
        let page = self.cfg.page_rows as u64;
        let mut out = Vec::new();
        let mut lo = 0u64;
        loop {
            let got = self.exec(sql, op, table, Some((lo, lo + page)))?.dataset;
            let n = got.len() as u64;
            out.extend(got);
            if n < page {
                return Ok(out);
            }
            lo += page;
        }
    }

    fn count_where(&self, filter: Option<&Target>) -> Result<u64, StoreError> {
        let table = &self.transitions_table;
        let sql = match filter {
            Some(t) => format!("SELECT count() FROM {table} WHERE {}", target_filter(t)),
            None => format!("SELECT count() FROM {table}"),
        };
        let ans = self.exec(&sql, "count", table, None)?;
        let n = ans
            .dataset
            .first()
            .and_then(|r| r.first())
            .and_then(Value::as_u64)
            .ok_or_else(|| StoreError::QuestDbQuery {
                op: "count",
                table: table.clone(),
                url: self.base.clone(),
                query: sql.clone(),
                source: Box::new(QueryError::Unexpected(ans.dataset.clone())),
            })?;
        Ok(n)
    }

    /// Per episode of the scope, in `(namespace, name, episode)` order: rows and step range.
    fn episode_groups(&self, target: Option<&Target>) -> Result<Vec<EpisodeGroup>, StoreError> {
        let table = &self.transitions_table;
        let filter = target
            .map(|t| format!(" WHERE {}", target_filter(t)))
            .unwrap_or_default();
        let sql = format!(
            "SELECT namespace, name, episode, count() rows, min(step) lo, max(step) hi, \
             min(ts_ms) first_ms, max(ts_ms) last_ms \
             FROM {table}{filter} ORDER BY namespace, name, episode"
        );
        self.select_all(&sql, "sample", table)?
            .iter()
            .map(|row| {
                let c = Cells { row };
                let g = || -> Result<EpisodeGroup, CellError> {
                    Ok(EpisodeGroup {
                        target: Target::new(c.str(0, "namespace")?, c.str(1, "name")?),
                        episode: c.i64(2, "episode")?,
                        rows: c.u64(3, "rows")?,
                        lo: c.i64(4, "lo")?,
                        hi: c.i64(5, "hi")?,
                        first_ms: c.i64(6, "first_ms")?,
                        last_ms: c.i64(7, "last_ms")?,
                    })
                };
                g().map_err(|source| StoreError::CorruptCell {
                    op: "sample",
                    table: table.clone(),
                    key: format!("{row:?}"),
                    source: Box::new(source),
                })
            })
            .collect()
    }

    /// Queries reading the given steps of the given episodes, one target per query, each at
    /// most about [`MAX_SAMPLE_SQL`] long. Each query also bounds the designated timestamp to its
    /// episodes' time span, so QuestDB scans only those partitions and rows, not the whole
    /// history.
    fn keyed_sample_queries(
        &self,
        groups: &[EpisodeGroup],
        keyed: &[(usize, Vec<i64>)],
    ) -> Vec<String> {
        struct Query<'a> {
            target: &'a Target,
            head: String,
            terms: String,
            first_ms: i64,
            last_ms: i64,
        }
        let close = |q: Query<'_>| {
            format!(
                "{}{}) AND ts >= {} AND ts <= {}",
                q.head,
                q.terms,
                micros(q.first_ms).as_i64(),
                micros(q.last_ms).as_i64()
            )
        };
        let mut out = Vec::new();
        let mut current: Option<Query<'_>> = None;
        for (gi, steps) in keyed {
            let g = &groups[*gi];
            let list = steps
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",");
            let term = format!("(episode = {} AND step IN ({list}))", g.episode);
            let fits = current.as_ref().is_some_and(|q| {
                q.target == &g.target && q.head.len() + q.terms.len() + term.len() < MAX_SAMPLE_SQL
            });
            if fits {
                if let Some(q) = current.as_mut() {
                    q.terms.push_str(" OR ");
                    q.terms.push_str(&term);
                    q.first_ms = q.first_ms.min(g.first_ms);
                    q.last_ms = q.last_ms.max(g.last_ms);
                }
            } else {
                if let Some(q) = current.take() {
                    out.push(close(q));
                }
                let head = format!(
                    "SELECT {TRANSITION_COLS} FROM {} WHERE {} AND (",
                    self.transitions_table,
                    target_filter(&g.target)
                );
                current = Some(Query {
                    target: &g.target,
                    head,
                    terms: term,
                    first_ms: g.first_ms,
                    last_ms: g.last_ms,
                });
            }
        }
        if let Some(q) = current.take() {
            out.push(close(q));
        }
        out
    }

    /// Flushes `buf` into `table` as one transaction, then waits for visibility.
    fn flush(&self, buf: &mut Buffer, table: &str, op: &'static str) -> Result<(), StoreError> {
        {
            let mut sender = self.lock();
            sender
                .flush_and_keep_with_flags(buf, true)
                .map_err(|source| StoreError::QuestDbIngest {
                    op,
                    table: table.to_owned(),
                    url: self.base.clone(),
                    source: Box::new(source),
                })?;
        }
        buf.clear();
        self.wait_visible(table, op)
    }

    /// Waits until `table` has applied every committed WAL transaction.
    ///
    /// A table whose WAL apply failed is *suspended*: QuestDB keeps accepting (and durably
    /// committing) writes but applies none. The causes QuestDB names (`errorTag`: out of memory,
    /// mmap area or file handles, a full disk) are mostly transient, and the failed transaction
    /// is still in the WAL, so the wait resumes the table once (`ALTER TABLE … RESUME WAL`, which
    /// retries from the failed transaction and loses nothing) and fails with QuestDB's error if
    /// the table is suspended again.
    fn wait_visible(&self, table: &str, op: &'static str) -> Result<(), StoreError> {
        let timeout = self.cfg.visibility_timeout;
        if timeout.is_zero() {
            return Ok(());
        }
        let start = Instant::now();
        let mut pause = Duration::from_millis(5);
        let mut resumed = false;
        let sql = format!(
            "SELECT writerTxn, sequencerTxn, suspended, errorTag, errorMessage FROM wal_tables() \
             WHERE name = {}",
            lit(table)
        );
        loop {
            let ans = self.exec(&sql, op, table, None)?;
            if let Some(row) = ans.dataset.first() {
                let c = Cells { row };
                let writer = c.i64(0, "writerTxn");
                let sequencer = c.i64(1, "sequencerTxn");
                if c.bool(2, "suspended").unwrap_or(false) {
                    let message = format!(
                        "{} {}",
                        c.str(3, "errorTag").unwrap_or_default(),
                        c.str(4, "errorMessage").unwrap_or_default()
                    )
                    .trim()
                    .to_owned();
                    if resumed {
                        return Err(StoreError::QuestDbQuery {
                            op,
                            table: table.to_owned(),
                            url: self.base.clone(),
                            query: sql.clone(),
                            source: Box::new(QueryError::Suspended { message, resumed }),
                        });
                    }
                    tracing::warn!(
                        table = %table,
                        op,
                        error = %message,
                        "questdb suspended the table's WAL apply; resuming it once"
                    );
                    self.exec(&format!("ALTER TABLE {table} RESUME WAL"), op, table, None)?;
                    resumed = true;
                    continue;
                }
                if let (Ok(w), Ok(s)) = (writer, sequencer) {
                    if w >= s {
                        return Ok(());
                    }
                }
            }
            if start.elapsed() >= timeout {
                return Err(StoreError::QuestDbNotVisible {
                    op,
                    table: table.to_owned(),
                    url: self.base.clone(),
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    fn ingest_err(&self, op: &'static str, table: &str) -> impl Fn(::questdb::Error) -> StoreError {
        let (table, url) = (table.to_owned(), self.base.clone());
        move |source| StoreError::QuestDbIngest {
            op,
            table: table.clone(),
            url: url.clone(),
            source: Box::new(source),
        }
    }

    fn corrupt(op: &'static str, table: &str) -> impl Fn((String, CellError)) -> StoreError {
        let table = table.to_owned();
        move |(key, source)| StoreError::CorruptCell {
            op,
            table: table.clone(),
            key,
            source: Box::new(source),
        }
    }

    fn write_transition(&self, buf: &mut Buffer, t: &Transition) -> Result<(), ::questdb::Error> {
        buf.table(self.transitions_table.as_str())?
            .symbol("namespace", t.target.namespace.as_str())?
            .symbol("name", t.target.name.as_str())?
            .symbol("source", source_str(t.source))?
            .symbol("stage", t.stage.as_str())?
            .column_i64("episode", i64_of(t.episode))?
            .column_i64("step", i64::from(t.step))?
            .column_i64("ts_ms", t.ts_ms)?
            .column_str("state", vec_to_hex(&t.state))?
            .column_str("action_raw", vec_to_hex(&t.action_raw))?
            .column_i64("desired_replicas", i64::from(t.desired.replicas))?
            .column_i64(
                "desired_cpu_millicores",
                i64::from(t.desired.cpu_millicores),
            )?
            .column_i64("desired_memory_bytes", i64_of(t.desired.memory_bytes))?
            .column_i64("applied_replicas", i64::from(t.applied.replicas))?
            .column_i64(
                "applied_cpu_millicores",
                i64::from(t.applied.cpu_millicores),
            )?
            .column_i64("applied_memory_bytes", i64_of(t.applied.memory_bytes))?
            .column_f64("reward", t.reward)?
            .column_str("next_state", vec_to_hex(&t.next_state))?
            .column_bool("slo_violation", t.slo_violation)?
            .column_f64("cpu_util", t.cpu_util)?
            .column_f64("memory_util", t.memory_util)?
            .at(micros(t.ts_ms))
    }

    fn write_episode(&self, buf: &mut Buffer, s: &EpisodeSummary) -> Result<(), ::questdb::Error> {
        buf.table(self.episodes_table.as_str())?
            .symbol("namespace", s.target.namespace.as_str())?
            .symbol("name", s.target.name.as_str())?
            .symbol("stage", s.stage.as_str())?
            .column_i64("episode", i64_of(s.episode))?
            .column_i64("last_step", i64::from(s.step))?
            .column_i64("ts_ms", s.ts_ms)?
            .column_i64("steps", i64::from(s.steps))?
            .column_f64("total_reward", s.total_reward)?
            .column_f64("mean_reward", s.mean_reward)?
            .column_i64("slo_violations", i64::from(s.slo_violations))?
            .column_f64("cpu_util_mean", s.cpu_util_mean)?
            .column_f64("memory_util_mean", s.memory_util_mean)?
            .column_i64("rl_steps", i64::from(s.rl_steps))?
            .column_i64("fallback_steps", i64::from(s.fallback_steps))?
            .column_f64_opt("policy_estimate", s.policy_estimate)?
            .at(micros(s.ts_ms))
    }

    fn select_transitions(
        &self,
        sql: &str,
        op: &'static str,
    ) -> Result<Vec<Transition>, StoreError> {
        let table = &self.transitions_table;
        self.select_all(sql, op, table)?
            .iter()
            .map(|r| decode_transition(r).map_err(Self::corrupt(op, table)))
            .collect()
    }

    fn select_episodes(
        &self,
        sql: &str,
        op: &'static str,
    ) -> Result<Vec<EpisodeSummary>, StoreError> {
        let table = &self.episodes_table;
        self.select_all(sql, op, table)?
            .iter()
            .map(|r| decode_episode(r).map_err(Self::corrupt(op, table)))
            .collect()
    }
}

impl TrajectoryStore for QuestDbStore {
    fn backend(&self) -> &'static str {
        "questdb"
    }

    fn append(&self, batch: &[Transition]) -> Result<(), StoreError> {
        for t in batch {
            t.validate()?;
        }
        if batch.is_empty() {
            return Ok(());
        }
        let table = self.transitions_table.clone();
        let mut buf = self.lock().new_buffer();
        for t in batch {
            self.write_transition(&mut buf, t)
                .map_err(self.ingest_err("encode transition", &table))?;
        }
        self.flush(&mut buf, &table, "append")?;
        tracing::debug!(rows = batch.len(), table = %table, "appended transitions");
        Ok(())
    }

    fn count(&self, target: &Target) -> Result<u64, StoreError> {
        self.count_where(Some(target))
    }

    fn count_all(&self) -> Result<u64, StoreError> {
        self.count_where(None)
    }

    fn transitions(
        &self,
        target: &Target,
        episodes: Range<u64>,
    ) -> Result<Vec<Transition>, StoreError> {
        let Some((lo, hi)) = episode_bounds(&episodes) else {
            return Ok(Vec::new());
        };
        let upper = hi
            .map(|h| format!(" AND episode < {h}"))
            .unwrap_or_default();
        let sql = format!(
            "SELECT {TRANSITION_COLS} FROM {} WHERE {} AND episode >= {lo}{upper} \
             ORDER BY episode, step",
            self.transitions_table,
            target_filter(target)
        );
        self.select_transitions(&sql, "read transitions")
    }

    fn sample_rows(
        &self,
        target: Option<&Target>,
        n: usize,
        seed: u64,
    ) -> Result<Sample, StoreError> {
        let groups = self.episode_groups(target)?;
        let mut starts = Vec::with_capacity(groups.len());
        let mut rows = 0u64;
        for g in &groups {
            starts.push(rows);
            rows += g.rows;
        }
        let draws = sample_ordinals(rows, n, seed);
        let mut wanted = draws.clone();
        wanted.sort_unstable();
        wanted.dedup();
        // Each drawn ordinal as (episode group, offset in the group's step order).
        let mut by_group: Vec<(usize, Vec<(u64, u64)>)> = Vec::new();
        for &o in &wanted {
            let gi = starts.partition_point(|&s| s <= o).saturating_sub(1);
            let off = o - starts[gi];
            match by_group.last_mut() {
                Some((g, offs)) if *g == gi => offs.push((o, off)),
                _ => by_group.push((gi, vec![(o, off)])),
            }
        }
        let mut by_ordinal: HashMap<u64, Transition> = HashMap::with_capacity(wanted.len());
        // Episodes whose steps are lo..=hi without a gap: the row at offset k is step lo + k, read
        // by key, many episodes per query. Any other episode: by position in its step order.
        let mut by_key: HashMap<(usize, i64), u64> = HashMap::new();
        let mut keyed: Vec<(usize, Vec<i64>)> = Vec::new();
        for (gi, offs) in &by_group {
            let g = &groups[*gi];
            if g.contiguous() {
                let steps: Vec<i64> = offs
                    .iter()
                    .map(|&(o, off)| {
                        let step = g.lo.saturating_add(i64::try_from(off).unwrap_or(i64::MAX));
                        by_key.insert((*gi, step), o);
                        step
                    })
                    .collect();
                keyed.push((*gi, steps));
            } else {
                let offsets: Vec<u64> = offs.iter().map(|&(_, off)| off).collect();
                for (a, b) in runs(&offsets) {
                    let sql = format!(
                        "SELECT {TRANSITION_COLS} FROM {} WHERE {} AND episode = {} \
                         ORDER BY step LIMIT {a}, {b}",
                        self.transitions_table,
                        target_filter(&g.target),
                        g.episode
                    );
                    let got = self.select_transitions(&sql, "sample")?;
                    for (off, t) in (a..b).zip(got) {
                        by_ordinal.insert(starts[*gi] + off, t);
                    }
                }
            }
        }
        for sql in self.keyed_sample_queries(&groups, &keyed) {
            for t in self.select_transitions(&sql, "sample")? {
                let gi = groups
                    .partition_point(|g| (&g.target, g.episode) < (&t.target, i64_of(t.episode)));
                if let Some(&o) = by_key.get(&(gi, i64::from(t.step))) {
                    by_ordinal.insert(o, t);
                }
            }
        }
        Ok(Sample::from_ordinals(&draws, by_ordinal))
    }

    fn put_episode(&self, summary: &EpisodeSummary) -> Result<(), StoreError> {
        summary.validate()?;
        let table = self.episodes_table.clone();
        let mut buf = self.lock().new_buffer();
        self.write_episode(&mut buf, summary)
            .map_err(self.ingest_err("encode episode", &table))?;
        self.flush(&mut buf, &table, "put_episode")
    }

    fn episodes(&self, target: &Target, n: usize) -> Result<Vec<EpisodeSummary>, StoreError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT {EPISODE_COLS} FROM {} WHERE {} ORDER BY episode DESC LIMIT {n}",
            self.episodes_table,
            target_filter(target)
        );
        let mut out = self.select_episodes(&sql, "read episodes")?;
        out.reverse();
        Ok(out)
    }

    fn top_episodes(&self, target: &Target, m: usize) -> Result<Vec<EpisodeSummary>, StoreError> {
        if m == 0 {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT {EPISODE_COLS} FROM {} WHERE {} ORDER BY total_reward DESC, episode DESC \
             LIMIT {m}",
            self.episodes_table,
            target_filter(target)
        );
        self.select_episodes(&sql, "read top episodes")
    }

    fn targets(&self) -> Result<Vec<Target>, StoreError> {
        let mut set = BTreeSet::new();
        for table in [&self.transitions_table, &self.episodes_table] {
            let sql = format!("SELECT DISTINCT namespace, name FROM {table}");
            for row in self.select_all(&sql, "list targets", table)? {
                let c = Cells { row: &row };
                let t = c
                    .str(0, "namespace")
                    .and_then(|ns| Ok(Target::new(ns, c.str(1, "name")?)))
                    .map_err(|source| StoreError::CorruptCell {
                        op: "list targets",
                        table: table.clone(),
                        key: format!("{row:?}"),
                        source: Box::new(source),
                    })?;
                set.insert(t);
            }
        }
        Ok(set.into_iter().collect())
    }

    fn prune(&self, _target: &Target, _keep: NonZeroU64) -> Result<Pruned, StoreError> {
        Err(StoreError::Unsupported {
            backend: "questdb",
            op: "prune",
            hint: "QuestDB deletes whole time partitions only: bound the tables with \
                   `ALTER TABLE … SET TTL` and set trajectory_store.keep_transitions = 0",
        })
    }

    fn mark_deregistered(
        &self,
        _target: &Target,
        _since_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        Err(forget_unsupported("mark_deregistered"))
    }

    fn deregistered(&self) -> Result<Vec<(Target, i64)>, StoreError> {
        Err(forget_unsupported("deregistered"))
    }

    fn forget(&self, _target: &Target) -> Result<Forgotten, StoreError> {
        Err(forget_unsupported("forget"))
    }
}

/// QuestDB cannot delete one target's rows, so it does not forget deregistered targets.
fn forget_unsupported(op: &'static str) -> StoreError {
    StoreError::Unsupported {
        backend: "questdb",
        op,
        hint: "QuestDB deletes whole time partitions only: set trajectory_store.forget_after_secs = 0 \
               (the tables' TTL bounds a deleted target's rows)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::conformance::{self, Backend};
    use serde_json::json;

    use crate::testkit::QuestDbServer;

    /// One table prefix per conformance case and run, so runs never share rows.
    struct QuestDbBackend {
        url: String,
        run: String,
    }

    impl Backend for QuestDbBackend {
        type Store = QuestDbStore;
        fn open(&self, key: &str) -> Result<QuestDbStore, StoreError> {
            let mut cfg = QuestDbConfig::new(self.url.clone());
            cfg.table_prefix = format!("{}_{}_", self.run, key.replace('-', "_"));
            QuestDbStore::open(cfg)
        }
    }

    fn start_server() -> QuestDbServer {
        QuestDbServer::start().unwrap_or_else(|e| panic!("starting QuestDB: {e}"))
    }

    /// Every case of the conformance suite against a real QuestDB (one server, one table prefix
    /// per case); every failing case is reported.
    #[test]
    fn conformance_against_a_real_questdb() {
        let server = start_server();
        let backend = QuestDbBackend {
            url: server.url(),
            run: "conf".to_owned(),
        };
        let report = conformance::run_all(&backend);
        for (case, failure) in &report.failures {
            eprintln!("questdb conformance case {case} failed: {failure}");
        }
        assert!(
            report.failures.is_empty(),
            "{:?}\nserver log:\n{}",
            report.failures,
            server.log_tail(40)
        );
        assert_eq!(report.passed, conformance::CASE_NAMES.len());
    }

    /// Rows acknowledged before the server is killed (SIGKILL, no shutdown) are all there when it
    /// starts again on the same data root — read by a new handle at once, and by a handle opened
    /// before the crash, which also goes on writing; a batch re-sent after the restart replaces.
    #[test]
    fn acknowledged_rows_survive_a_questdb_crash() {
        let mut server = start_server();
        let a = Target::new("durable", "a-app");
        let written: Vec<Transition> = (0..4)
            .flat_map(|e| (0..50).map(move |s| (e, s)))
            .map(|(e, s)| conformance::transition(&a, e, s))
            .collect();
        let ep = conformance::episode(&a, 3, 12.5);
        let cfg = QuestDbConfig::new(server.url());
        let before = QuestDbStore::open(cfg.clone()).unwrap();
        before.append(&written[..120]).unwrap();
        before.append(&written[120..]).unwrap();
        before.put_episode(&ep).unwrap();

        server.restart().unwrap();

        let after = QuestDbStore::open(cfg).unwrap();
        assert_eq!(after.count(&a).unwrap(), 200, "{}", server.log_tail(40));
        assert!(after.transitions(&a, 0..u64::MAX).unwrap() == written);
        assert_eq!(after.episodes(&a, 10).unwrap(), vec![ep.clone()]);
        // The handle from before the crash reconnects, reads and writes.
        assert_eq!(before.count(&a).unwrap(), 200);
        let more = conformance::transition(&a, 4, 0);
        before.append(std::slice::from_ref(&more)).unwrap();
        // The recorder re-sending its last batch after the restart: replaced, not duplicated.
        before.append(&written[120..]).unwrap();
        assert_eq!(after.count(&a).unwrap(), 201);
        assert_eq!(after.top_episodes(&a, 1).unwrap(), vec![ep]);
    }

    /// Rows committed to the WAL but not yet applied to the table when the server is killed
    /// (the writer does not wait for visibility) are applied after the restart, and a store
    /// opened then reads all of them at once.
    #[test]
    fn rows_committed_but_not_applied_before_a_crash_are_read_after_it() {
        let mut server = start_server();
        let a = Target::new("durable", "b-app");
        let mut cfg = QuestDbConfig::new(server.url());
        cfg.visibility_timeout = Duration::ZERO;
        let writer = QuestDbStore::open(cfg.clone()).unwrap();
        let batches: Vec<Vec<Transition>> = (0..40)
            .map(|e| {
                (0..500)
                    .map(|s| conformance::transition(&a, e, s))
                    .collect()
            })
            .collect();
        for b in &batches {
            writer.append(b).unwrap();
        }
        server.restart().unwrap();
        let reader = QuestDbStore::open(QuestDbConfig::new(server.url())).unwrap();
        assert_eq!(reader.count(&a).unwrap(), 20_000, "{}", server.log_tail(40));
        let last = reader.transitions(&a, 39..40).unwrap();
        assert!(last == batches[39], "the last batch read back differs");
    }

    /// A table whose WAL apply is suspended (here by `SUSPEND WAL`, as QuestDB does itself when
    /// an apply fails for lack of memory, mmap area or disk) is resumed by the next write's wait,
    /// and the rows written while it was suspended are read back.
    #[test]
    fn a_suspended_table_is_resumed_and_loses_nothing() {
        let server = QuestDbServer::start_with(crate::testkit::QuestDbServerOptions {
            dev_mode: true,
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("starting QuestDB: {e}"));
        let a = Target::new("suspend", "a-app");
        let store = QuestDbStore::open(QuestDbConfig::new(server.url())).unwrap();
        let first: Vec<Transition> = (0..10).map(|s| conformance::transition(&a, 0, s)).collect();
        store.append(&first).unwrap();
        for table in [&store.transitions_table, &store.episodes_table] {
            store
                .exec(
                    &format!("ALTER TABLE {table} SUSPEND WAL"),
                    "test",
                    table,
                    None,
                )
                .unwrap();
        }
        let second: Vec<Transition> = (0..10).map(|s| conformance::transition(&a, 1, s)).collect();
        store
            .append(&second)
            .unwrap_or_else(|e| panic!("{e}\n{}", server.log_tail(40)));
        let ep = conformance::episode(&a, 1, 3.5);
        store
            .put_episode(&ep)
            .unwrap_or_else(|e| panic!("{e}\n{}", server.log_tail(40)));
        assert_eq!(store.count(&a).unwrap(), 20);
        assert!(store.transitions(&a, 1..2).unwrap() == second);
        assert_eq!(store.episodes(&a, 1).unwrap().len(), 1);
    }

    /// The same seed draws the same minibatch from QuestDB as from SQLite on the same rows, with
    /// episodes whose steps have gaps (read by position) beside gapless ones (read by key), over
    /// one target and over all of them.
    #[test]
    fn sampling_matches_sqlite_with_and_without_step_gaps() {
        let server = start_server();
        let dir = tempfile::tempdir().unwrap();
        let sqlite = crate::trajectory::SqliteStore::open_path(dir.path().join("s.db")).unwrap();
        let questdb = QuestDbStore::open(QuestDbConfig::new(server.url())).unwrap();
        let (a, b) = (Target::new("s", "a-app"), Target::new("s", "b-app"));
        let mut rows = Vec::new();
        for e in 0..30u64 {
            for s in 0..40u32 {
                // Episodes 3, 4 and 17 of a skip steps; b has gaps in every fifth episode.
                if !([3, 4, 17].contains(&e) && s % 3 == 1) {
                    rows.push(conformance::transition(&a, e, s));
                }
                if !(e % 5 == 0 && s % 7 == 2) {
                    rows.push(conformance::transition(&b, e, s));
                }
            }
        }
        for chunk in rows.chunks(500) {
            sqlite.append(chunk).unwrap();
            questdb.append(chunk).unwrap();
        }
        for (scope, n, seed) in [(Some(&a), 300, 1), (Some(&b), 64, 2), (None, 2_000, 3)] {
            let want = sqlite.sample(scope, n, seed).unwrap();
            assert_eq!(want.len(), n);
            let got = questdb.sample(scope, n, seed).unwrap();
            assert!(
                got == want,
                "sample({scope:?}, {n}, {seed}) differs from sqlite's"
            );
        }
    }

    #[test]
    fn config_accepts_plain_http_only() {
        assert_eq!(
            QuestDbConfig::new("http://questdb:9000")
                .authority()
                .unwrap(),
            "questdb:9000"
        );
        assert_eq!(
            QuestDbConfig::new("http://questdb:9000/")
                .authority()
                .unwrap(),
            "questdb:9000"
        );
        for bad in [
            "https://questdb:9000",
            "questdb:9000",
            "http://",
            "http://questdb:9000/exec",
            "http://user:pw@questdb:9000",
        ] {
            let err = QuestDbConfig::new(bad).validate().unwrap_err();
            assert!(
                matches!(err, StoreError::QuestDbConfig { setting: "url", .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains(bad), "{err}");
        }
        let mut cfg = QuestDbConfig::new("http://q:9000");
        cfg.table_prefix = "bad-prefix;".to_owned();
        assert!(cfg.validate().is_err());
        cfg.table_prefix = "ok_1_".to_owned();
        cfg.page_rows = 0;
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn open_fails_cleanly_when_nothing_listens() {
        // Bind then drop a listener: the port is (very likely) closed right after.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = QuestDbConfig::new(format!("http://127.0.0.1:{port}"));
        cfg.request_timeout = Duration::from_millis(300);
        let err = QuestDbStore::open(cfg).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
        assert!(
            matches!(
                err,
                StoreError::QuestDbIngest { .. } | StoreError::QuestDbQuery { .. }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let bytes: Vec<u8> = (0..=255).collect();
        let s = hex_encode(&bytes);
        assert_eq!(&s[..8], "00010203");
        assert_eq!(&s[s.len() - 4..], "feff");
        assert_eq!(hex_decode(&s).unwrap(), bytes);
        assert_eq!(hex_decode("ABcd").unwrap(), vec![0xab, 0xcd]);
        assert!(hex_decode("abc").is_none());
        assert!(hex_decode("zz").is_none());
        assert_eq!(vec_to_hex(&[1.0]), "0000803f");
        assert_eq!(vec_to_hex(&[]), "");
    }

    #[test]
    fn sql_literals_are_escaped() {
        assert_eq!(lit("a'b"), "'a''b'");
        assert_eq!(
            target_filter(&Target::new("ns", "x' OR '1'='1")),
            "namespace = 'ns' AND name = 'x'' OR ''1''=''1'"
        );
    }

    #[test]
    fn ordinal_runs_are_contiguous_windows() {
        assert_eq!(runs(&[]), vec![]);
        assert_eq!(runs(&[0, 1, 2, 5, 7, 8]), vec![(0, 3), (5, 6), (7, 9)]);
    }

    #[test]
    fn exec_answers_and_errors_parse() {
        let ok = r#"{"query":"SELECT x FROM long_sequence(2);","columns":[{"name":"x","type":"LONG"}],"timestamp":-1,"dataset":[[1],[2]],"count":2}"#;
        let ans = parse_exec_answer(200, ok).unwrap();
        assert_eq!(ans.columns, vec!["x".to_owned()]);
        assert_eq!(ans.dataset, vec![vec![json!(1)], vec![json!(2)]]);
        let ddl = parse_exec_answer(200, r#"{"ddl":"OK"}"#).unwrap();
        assert!(ddl.dataset.is_empty());
        let err = parse_exec_answer(
            400,
            r#"{"query":"SELECT nope","error":"Invalid column: nope","position":7}"#,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "HTTP 400: Invalid column: nope at position 7"
        );
        let err = parse_exec_answer(502, "<html>bad gateway</html>").unwrap_err();
        assert!(
            matches!(err, QueryError::NotJson { status: 502, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("HTTP 502"), "{err}");
        let err = parse_exec_answer(503, r#"{"status":"busy"}"#).unwrap_err();
        assert!(
            matches!(err, QueryError::Status { status: 503, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn transition_rows_decode_exactly() {
        let t = conformance::transition(&Target::new("ns", "app"), 3, 7);
        let row = vec![
            json!(t.target.namespace),
            json!(t.target.name),
            json!(t.episode),
            json!(t.step),
            json!(t.ts_ms),
            json!(vec_to_hex(&t.state)),
            Value::Null,
            json!(t.desired.replicas),
            json!(t.desired.cpu_millicores),
            json!(t.desired.memory_bytes),
            json!(t.applied.replicas),
            json!(t.applied.cpu_millicores),
            json!(t.applied.memory_bytes),
            json!(source_str(t.source)),
            json!(t.stage.as_str()),
            json!(t.reward),
            json!(vec_to_hex(&t.next_state)),
            json!(t.slo_violation),
            json!(t.cpu_util),
            json!(t.memory_util),
        ];
        // Through JSON text, as /exec delivers it.
        let row: Vec<Value> = serde_json::from_str(&serde_json::to_string(&row).unwrap()).unwrap();
        let got = decode_transition(&row).unwrap();
        let mut want = t.clone();
        want.action_raw = Vec::new(); // NULL reads as an empty vector
        assert_eq!(got, want);

        let mut bad = row.clone();
        bad[14] = json!("paused");
        let (key, detail) = decode_transition(&bad).unwrap_err();
        assert_eq!(key, "ns/app episode 3 step 7");
        assert_eq!(
            detail,
            CellError::UnknownName {
                column: "stage",
                value: "paused".to_owned()
            }
        );
        let mut bad = row;
        bad[5] = json!("0000803");
        let (_, detail) = decode_transition(&bad).unwrap_err();
        assert!(
            matches!(&detail, CellError::NotF32Hex { column, .. } if column == "state"),
            "{detail}"
        );
    }

    #[test]
    fn episode_rows_decode_with_null_policy_estimate() {
        let e = conformance::episode(&Target::new("ns", "app"), 4, 12.5);
        assert_eq!(e.policy_estimate, None);
        let row = vec![
            json!("ns"),
            json!("app"),
            json!(4),
            json!(e.step),
            json!(e.ts_ms),
            json!(e.steps),
            json!(e.total_reward),
            json!(e.mean_reward),
            json!(e.slo_violations),
            json!(e.cpu_util_mean),
            json!(e.memory_util_mean),
            json!(e.rl_steps),
            json!(e.fallback_steps),
            json!(e.stage.as_str()),
            Value::Null,
        ];
        assert_eq!(decode_episode(&row).unwrap(), e);
        let mut bad = row;
        bad[8] = json!(-1);
        let (key, detail) = decode_episode(&bad).unwrap_err();
        assert_eq!(key, "ns/app episode 4");
        assert_eq!(
            detail,
            CellError::OutOfU32 {
                column: "slo_violations".to_owned(),
                value: -1
            }
        );
    }

    #[test]
    fn ilp_rows_encode_symbols_first_and_the_step_timestamp() {
        let sender_cfg = "http::addr=127.0.0.1:1;protocol_version=1;";
        let sender = Sender::from_conf(sender_cfg).unwrap();
        let store_like = QuestDbStore {
            cfg: QuestDbConfig::new("http://127.0.0.1:1"),
            base: "http://127.0.0.1:1".to_owned(),
            transitions_table: "aware_transitions".to_owned(),
            episodes_table: "aware_episodes".to_owned(),
            agent: ureq::Agent::new_with_defaults(),
            sender: Mutex::new(sender),
        };
        let t = conformance::transition(&Target::new("ns", "app"), 1, 2);
        let mut buf = store_like.lock().new_buffer();
        store_like.write_transition(&mut buf, &t).unwrap();
        let line = String::from_utf8_lossy(buf.as_bytes()).to_string();
        assert!(
            line.starts_with("aware_transitions,namespace=ns,name=app,source=rl,stage=online "),
            "{line}"
        );
        assert!(line.contains("episode=1i,step=2i,"), "{line}");
        assert!(
            line.contains(&format!("state=\"{}\"", vec_to_hex(&t.state))),
            "{line}"
        );
        // ILP v1 carries the designated timestamp in nanoseconds.
        assert!(
            line.trim_end()
                .ends_with(&format!(" {}", t.ts_ms * 1_000_000)),
            "{line}"
        );
    }
}
