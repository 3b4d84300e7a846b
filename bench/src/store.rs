//! `aware bench store`: what the trajectory store costs at the retention bound
//! (`trajectory_store.keep_transitions`), on the embedded SQLite store with the recorder's durability
//! (`synchronous=FULL`) and batch size.
//!
//! Per run, in a fresh file under `--out`: one target's `rows` transitions (9-d states, episodes
//! of `steps_per_episode`) appended in batches of `batch`; then, timed, what the trainer does
//! every poll (`rows_after` the position 200 rows back: the learner's poll; and, for comparison,
//! the whole-history `count` and `recorded`) and every round (`sample` of `sample` rows, a round's
//! draw of 200 steps × 64); then the recorder's first retention pass (`prune` to `keep`) and the same
//! reads after it; then `keep / 10` more rows, the amount that makes a target due again, and the
//! steady-state pass over them; last the recorder forgetting the (deleted) target: `forget` of
//! every row left, the one transaction that holds the store's lock longest. Medians over the runs.

use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::time::Instant;

use aware_bus_schemas::Target;
use aware_stores::trajectory::conformance::transition;
use aware_stores::trajectory::{SqliteStore, TrajectoryStore, Transition};
use serde::Serialize;

use super::{fail, median, BenchError};

/// What to run.
#[derive(Debug, Clone, Serialize, clap::Args)]
pub struct StoreBenchOptions {
    #[serde(skip)]
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Rows stored before the first pass.
    #[arg(long, default_value_t = StoreBenchOptions::default().rows, help = "Rows of one target stored before the first pass")]
    pub rows: u64,
    /// `trajectory_store.keep_transitions`.
    #[arg(long, default_value_t = StoreBenchOptions::default().keep)]
    pub keep: u64,
    #[arg(long, default_value_t = StoreBenchOptions::default().steps_per_episode)]
    pub steps_per_episode: u32,
    /// Rows per append (the recorder's `batch`).
    #[arg(skip = StoreBenchOptions::default().batch)]
    pub batch: usize,
    /// Rows per timed `sample`.
    #[arg(long, default_value_t = StoreBenchOptions::default().sample, help = "Rows per timed sample (a trainer round's draw)")]
    pub sample: usize,
    #[arg(long, default_value_t = StoreBenchOptions::default().runs, help = "Runs (medians reported)")]
    pub runs: usize,
    /// Compare the SQLite and QuestDB stores (`store_compare`) instead of the retention passes.
    #[arg(
        long,
        help = "Compare SQLite and a real QuestDB (write rate, top-M read, bytes per transition) instead of the retention passes; writes store-compare.json"
    )]
    pub compare: bool,
    /// `--compare`: transitions stored per run, one measurement per size.
    #[arg(long, value_delimiter = ',', default_values_t = StoreBenchOptions::default().sizes, help = "--compare: transitions per run, comma-separated")]
    pub sizes: Vec<u64>,
    /// `--compare`: targets the transitions are spread over.
    #[arg(long, default_value_t = StoreBenchOptions::default().targets, help = "--compare: targets the transitions are spread over")]
    pub targets: usize,
    /// `--compare`: M of the timed `top_episodes(target, M)`.
    #[arg(long, default_value_t = StoreBenchOptions::default().top_m, help = "--compare: M of the timed top-M episodes read")]
    pub top_m: usize,
    /// `--compare`: timed reads per run (median reported).
    #[arg(long, default_value_t = StoreBenchOptions::default().reads, help = "--compare: timed reads per run")]
    pub reads: usize,
    /// `--compare`: rows of the one timed `sample` per run (default: a trainer round's draw).
    #[arg(long, default_value_t = StoreBenchOptions::default().compare_sample, help = "--compare: rows of the one timed sample per run")]
    pub compare_sample: usize,
    /// `--compare`: episode summaries whose writes are timed (the rest are written untimed).
    #[arg(long, default_value_t = StoreBenchOptions::default().timed_summaries, help = "--compare: episode summaries whose writes are timed")]
    pub timed_summaries: u64,
    /// `--compare`: seconds after which a run stops loading and measures what it stored (0: no
    /// limit).
    #[arg(long, default_value_t = StoreBenchOptions::default().load_limit_s, help = "--compare: stop a run's load after this many seconds and measure what it stored (0: no limit)")]
    pub load_limit_s: u64,
    /// `--compare`: the backends compared.
    #[arg(long, value_delimiter = ',', default_values_t = StoreBenchOptions::default().backends, help = "--compare: backends, comma-separated (sqlite, questdb)")]
    pub backends: Vec<crate::store_compare::Backend>,
    /// `--compare`: milliseconds between a target's steps (the collector's interval).
    #[arg(long, default_value_t = StoreBenchOptions::default().step_ms, help = "--compare: milliseconds between a target's steps")]
    pub step_ms: i64,
}

impl Default for StoreBenchOptions {
    fn default() -> Self {
        StoreBenchOptions {
            out: PathBuf::from("bench-out"),
            rows: 1_100_000,
            keep: 1_000_000,
            steps_per_episode: 100,
            batch: 512,
            sample: 200 * 64,
            runs: 3,
            compare: false,
            sizes: vec![1_000_000, 10_000_000],
            targets: 10,
            top_m: 10,
            reads: 20,
            compare_sample: 200 * 64,
            timed_summaries: 2_000,
            load_limit_s: 0,
            backends: vec![
                crate::store_compare::Backend::Sqlite,
                crate::store_compare::Backend::Questdb,
            ],
            step_ms: 10_000,
        }
    }
}

/// One run's measurements (milliseconds unless named otherwise).
#[derive(Debug, Clone, Serialize)]
pub struct StoreRun {
    pub append_rows_per_s: f64,
    pub file_bytes_before: u64,
    pub poll_ms_before: f64,
    pub recorded_ms_before: f64,
    pub count_ms_before: f64,
    pub sample_ms_before: f64,
    pub prune_ms: f64,
    pub pruned_rows: u64,
    pub pruned_episodes: u64,
    pub rows_after: u64,
    pub recorded_after: u64,
    pub poll_ms_after: f64,
    pub recorded_ms_after: f64,
    pub count_ms_after: f64,
    pub sample_ms_after: f64,
    /// The pass after `keep / 10` more rows.
    pub steady_prune_ms: f64,
    pub steady_pruned_rows: u64,
    pub file_bytes_after: u64,
    /// `forget` of the target (every row left after the steady pass).
    pub forget_ms: f64,
    pub forgotten_rows: u64,
    /// The WAL file right after `forget` (bounded by the store's `journal_size_limit`).
    pub wal_bytes_after_forget: u64,
}

/// The report: every run and the medians.
#[derive(Debug, Clone, Serialize)]
pub struct StoreReport {
    pub options: StoreBenchOptions,
    pub runs: Vec<StoreRun>,
    pub median_append_rows_per_s: f64,
    pub median_sample_ms_before: f64,
    pub median_sample_ms_after: f64,
    pub median_poll_ms_before: f64,
    pub median_poll_ms_after: f64,
    pub median_count_ms_before: f64,
    pub median_recorded_ms_before: f64,
    pub median_recorded_ms_after: f64,
    pub median_prune_ms: f64,
    pub median_steady_prune_ms: f64,
    pub median_forget_ms: f64,
}

fn row(target: &Target, index: u64, spe: u32) -> Transition {
    let (episode, step) = (index / u64::from(spe), (index % u64::from(spe)) as u32);
    let mut t = transition(target, episode, step);
    let x = index as f32;
    t.state = (0..9).map(|j| (x * 0.01 + j as f32).sin()).collect();
    t.next_state = (0..9).map(|j| (x * 0.01 + 0.01 + j as f32).sin()).collect();
    t
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// `path` with `suffix` appended to its file name (SQLite's `-wal`, `-shm`).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// The database file and its WAL.
fn file_bytes(path: &Path) -> u64 {
    ["", "-wal"]
        .iter()
        .filter_map(|s| std::fs::metadata(with_suffix(path, s)).ok())
        .map(|m| m.len())
        .sum()
}

fn remove(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(with_suffix(path, suffix));
    }
}

fn append(
    store: &SqliteStore,
    target: &Target,
    range: std::ops::Range<u64>,
    o: &StoreBenchOptions,
) -> Result<(), BenchError> {
    let mut next = range.start;
    while next < range.end {
        let end = (next + o.batch.max(1) as u64).min(range.end);
        let batch: Vec<Transition> = (next..end)
            .map(|i| row(target, i, o.steps_per_episode))
            .collect();
        store.append(&batch).map_err(fail)?;
        next = end;
    }
    Ok(())
}

/// The trainer's reads, each timed.
struct Reads {
    poll_ms: f64,
    recorded: u64,
    recorded_ms: f64,
    count: u64,
    count_ms: f64,
    sample_ms: f64,
}

fn reads(
    store: &SqliteStore,
    target: &Target,
    o: &StoreBenchOptions,
    seed: u64,
    stored: u64,
) -> Result<Reads, BenchError> {
    let back = stored.saturating_sub(201);
    let spe = u64::from(o.steps_per_episode.max(1));
    let at = (back / spe, (back % spe) as u32);
    let t = Instant::now();
    let (new, _) = store.rows_after(target, Some(at)).map_err(fail)?;
    let poll_ms = ms(t);
    if new != stored.min(200) {
        return Err(fail(format!("rows_after counted {new} new rows, not 200")));
    }
    let t = Instant::now();
    let recorded = store.recorded(target).map_err(fail)?;
    let recorded_ms = ms(t);
    let t = Instant::now();
    let count = store.count(target).map_err(fail)?;
    let count_ms = ms(t);
    let t = Instant::now();
    let drawn = store.sample(Some(target), o.sample, seed).map_err(fail)?;
    let sample_ms = ms(t);
    if drawn.len() != o.sample {
        return Err(fail(format!(
            "sample returned {} rows, not {}",
            drawn.len(),
            o.sample
        )));
    }
    Ok(Reads {
        poll_ms,
        recorded,
        recorded_ms,
        count,
        count_ms,
        sample_ms,
    })
}

fn one_run(o: &StoreBenchOptions, run: usize) -> Result<StoreRun, BenchError> {
    let keep = NonZeroU64::new(o.keep).ok_or_else(|| fail("--keep must be at least 1"))?;
    std::fs::create_dir_all(&o.out).map_err(|source| BenchError::Io {
        path: o.out.display().to_string(),
        source,
    })?;
    let path = o.out.join(format!("bench-store-{run}.sqlite"));
    remove(&path);
    let store = SqliteStore::open_path(&path).map_err(fail)?;
    let target = Target::new("bench", "store");

    let t = Instant::now();
    append(&store, &target, 0..o.rows, o)?;
    let append_rows_per_s = o.rows as f64 / t.elapsed().as_secs_f64();
    let file_bytes_before = file_bytes(&path);
    let before = reads(&store, &target, o, 1, o.rows)?;

    let t = Instant::now();
    let p = store.prune(&target, keep).map_err(fail)?;
    let prune_ms = ms(t);
    let after = reads(&store, &target, o, 2, o.rows)?;

    let due = (o.keep / 10).max(1);
    append(&store, &target, o.rows..o.rows + due, o)?;
    let t = Instant::now();
    let steady = store.prune(&target, keep).map_err(fail)?;
    let steady_prune_ms = ms(t);
    let file_bytes_after = file_bytes(&path);
    let t = Instant::now();
    let forgotten = store.forget(&target).map_err(fail)?;
    let forget_ms = ms(t);
    let wal_bytes_after_forget =
        std::fs::metadata(with_suffix(&path, "-wal")).map_or(0, |m| m.len());
    let left = store.count(&target).map_err(fail)?;
    if left != 0 {
        return Err(fail(format!("{left} rows left after forget")));
    }
    drop(store);
    remove(&path);
    Ok(StoreRun {
        append_rows_per_s,
        file_bytes_before,
        poll_ms_before: before.poll_ms,
        recorded_ms_before: before.recorded_ms,
        count_ms_before: before.count_ms,
        sample_ms_before: before.sample_ms,
        prune_ms,
        pruned_rows: p.transitions,
        pruned_episodes: p.episodes,
        rows_after: after.count,
        recorded_after: after.recorded,
        poll_ms_after: after.poll_ms,
        recorded_ms_after: after.recorded_ms,
        count_ms_after: after.count_ms,
        sample_ms_after: after.sample_ms,
        steady_prune_ms,
        steady_pruned_rows: steady.transitions,
        file_bytes_after,
        forget_ms,
        forgotten_rows: forgotten.transitions,
        wal_bytes_after_forget,
    })
}

/// Runs the benchmark `opts.runs` times.
pub fn run(opts: &StoreBenchOptions) -> Result<StoreReport, BenchError> {
    let runs = (0..opts.runs.max(1))
        .map(|i| one_run(opts, i))
        .collect::<Result<Vec<_>, _>>()?;
    let m = |f: fn(&StoreRun) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    Ok(StoreReport {
        options: opts.clone(),
        median_append_rows_per_s: m(|r| r.append_rows_per_s),
        median_sample_ms_before: m(|r| r.sample_ms_before),
        median_sample_ms_after: m(|r| r.sample_ms_after),
        median_poll_ms_before: m(|r| r.poll_ms_before),
        median_poll_ms_after: m(|r| r.poll_ms_after),
        median_count_ms_before: m(|r| r.count_ms_before),
        median_recorded_ms_before: m(|r| r.recorded_ms_before),
        median_recorded_ms_after: m(|r| r.recorded_ms_after),
        median_prune_ms: m(|r| r.prune_ms),
        median_steady_prune_ms: m(|r| r.steady_prune_ms),
        median_forget_ms: m(|r| r.forget_ms),
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small run: the first pass cuts whole episodes down to `keep`, `recorded` counts what
    /// it cut, the steady pass cuts what the extra tenth added, forgetting deletes the rest, and
    /// the files are removed.
    #[test]
    fn the_passes_cut_whole_episodes_down_to_keep() {
        let dir = std::env::temp_dir().join(format!("aware-bench-store-{}", std::process::id()));
        let o = StoreBenchOptions {
            out: dir.clone(),
            rows: 3_050,
            keep: 2_000,
            steps_per_episode: 100,
            batch: 64,
            sample: 500,
            runs: 2,
            ..StoreBenchOptions::default()
        };
        let r = run(&o).unwrap();
        assert_eq!(r.runs.len(), 2);
        for x in &r.runs {
            // 3,050 rows: the 2,001st newest is episode 10's, so episodes 0–10 go (1,100 rows).
            assert_eq!((x.pruned_rows, x.pruned_episodes), (1_100, 0));
            assert_eq!(x.rows_after, 1_950);
            assert_eq!(x.recorded_after, 3_050);
            // 200 more: 2,150 rows, the 2,001st newest is in episode 12 (rows 1,100–1,199 and
            // 1,200–1,299 are episodes 11 and 12), so 200 go.
            assert_eq!(x.steady_pruned_rows, 200);
            // 2,150 − 200 rows left, all forgotten (the run checks none remain).
            assert_eq!(x.forgotten_rows, 1_950);
            assert!(x.append_rows_per_s > 0.0 && x.sample_ms_before >= 0.0);
            assert!(x.file_bytes_before > 0);
        }
        assert!(r.median_prune_ms.is_finite());
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "the run files are removed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
