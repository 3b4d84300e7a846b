//! `aware bench store --compare`: the two trajectory stores side by side — the embedded SQLite
//! store and a real QuestDB server (the jar `tests/questdb/install.sh` installs, started on free
//! loopback ports with its data root under `--out`).
//!
//! Per backend, size and run, on fresh storage: `size` transitions of `targets` targets
//! (round-robin, a step every `step_ms` per target, episodes of `steps_per_episode`, 9-d states)
//! appended in the recorder's batches, timed (transitions/s, each `append` acknowledged and
//! visible to reads, as the recorder sees it); then every finished episode's summary, the first
//! `timed_summaries` of them timed (summaries/s) and the rest written without waiting for
//! visibility where the backend can (QuestDB), then a new handle opened; then, `reads` times each, one target's top-M episodes (the trainer's bundle)
//! and one `sample` of a minibatch; last the bytes on disk per transition (allocated blocks of the
//! SQLite file and its WAL; of QuestDB's two tables with their WAL segments). The storage is
//! deleted after each run. A size is skipped, with the reason recorded, when the bytes it would
//! take (from the previous size's bytes per transition, or 600 bytes without one) do not fit in
//! the free space of `--out`'s file system less a reserve. With `--load-limit-s`, a run's load
//! stops after that long and the run measures what it stored (the time bound of a size).

use std::path::{Path, PathBuf};
use std::time::Instant;

use aware_bus_schemas::Target;
use aware_stores::testkit::{QuestDbServer, QuestDbServerOptions};
use aware_stores::trajectory::conformance::{episode, transition};
use aware_stores::trajectory::{
    EpisodeSummary, QuestDbConfig, QuestDbStore, SqliteStore, TrajectoryStore, Transition,
};
use serde::Serialize;

use super::{fail, median, BenchError};
use crate::store::StoreBenchOptions;

/// Bytes per transition assumed before one size has been measured.
const FIRST_GUESS_BYTES_PER_ROW: f64 = 600.0;
/// Free space left untouched on `--out`'s file system.
const DISK_RESERVE_BYTES: u64 = 3 << 30;
const BASE_TS_MS: i64 = 1_700_000_000_000;

/// The two backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    Sqlite,
    Questdb,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Sqlite => "sqlite",
            Backend::Questdb => "questdb",
        })
    }
}

/// One run's measurements.
#[derive(Debug, Clone, Serialize)]
pub struct CompareRun {
    /// Transitions stored: the size, or fewer when `--load-limit-s` stopped the load.
    pub transitions: u64,
    /// Whether `--load-limit-s` stopped the load before the size.
    pub stopped_by_load_limit: bool,
    pub transitions_per_s: f64,
    pub episodes_per_s: f64,
    /// Median over `reads` calls of `top_episodes(target, top_m)`.
    pub top_m_ms: f64,
    /// One `sample(Some(target), compare_sample, 1)`.
    pub sample_ms: f64,
    pub bytes_on_disk: u64,
    pub bytes_per_transition: f64,
}

/// One backend at one size: every run and the medians, or why it was skipped.
#[derive(Debug, Clone, Serialize)]
pub struct CompareCell {
    pub backend: Backend,
    pub transitions: u64,
    pub skipped: Option<String>,
    pub runs: Vec<CompareRun>,
    pub median_transitions_per_s: f64,
    pub median_episodes_per_s: f64,
    pub median_top_m_ms: f64,
    pub median_sample_ms: f64,
    pub median_bytes_per_transition: f64,
}

/// The report: the options and one cell per backend and size.
#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    pub options: StoreBenchOptions,
    pub questdb_version: &'static str,
    pub cells: Vec<CompareCell>,
}

fn targets(n: usize) -> Vec<Target> {
    (0..n.max(1))
        .map(|i| Target::new("bench", format!("app-{i:03}")))
        .collect()
}

/// Transition `i` of the whole load: target `i % targets`, that target's `i / targets`-th step.
fn load_row(targets: &[Target], i: u64, o: &StoreBenchOptions) -> Transition {
    let n = targets.len() as u64;
    let k = i / n;
    let spe = u64::from(o.steps_per_episode.max(1));
    let (ep, step) = (k / spe, (k % spe) as u32);
    let target = &targets[(i % n) as usize];
    let mut t = transition(target, ep, step);
    let x = k as f32;
    t.state = (0..9).map(|j| (x * 0.01 + j as f32).sin()).collect();
    t.next_state = (0..9).map(|j| (x * 0.01 + 0.01 + j as f32).sin()).collect();
    t.ts_ms = BASE_TS_MS + (k as i64) * o.step_ms;
    t
}

/// The summary of `target`'s episode `ep`, with a total reward that is not monotone in `ep`.
fn load_episode(target: &Target, ep: u64, o: &StoreBenchOptions) -> EpisodeSummary {
    let spe = i64::from(o.steps_per_episode.max(1));
    let reward = ((ep as f64) * 0.618).fract() * 100.0 - 50.0;
    let mut e = episode(target, ep, reward);
    e.step = o.steps_per_episode.saturating_sub(1);
    e.steps = o.steps_per_episode;
    e.ts_ms = BASE_TS_MS + ((ep as i64 + 1) * spe - 1) * o.step_ms;
    e
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Allocated bytes of the files under `path` (a file or a directory tree).
fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_dir() {
        std::fs::read_dir(path)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| allocated_bytes(&e.path()))
                    .sum()
            })
            .unwrap_or(0)
    } else {
        meta.blocks() * 512
    }
}

/// Free bytes of the file system holding `dir` (`df`), `None` when unknown.
fn free_bytes(dir: &Path) -> Option<u64> {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)?
        .trim()
        .parse()
        .ok()
}

/// Loads, reads and measures one opened store; `bytes` measures its storage afterwards.
fn measure(
    store: &dyn TrajectoryStore,
    bulk: &dyn TrajectoryStore,
    after_bulk: &dyn Fn() -> Result<Box<dyn TrajectoryStore>, BenchError>,
    size: u64,
    o: &StoreBenchOptions,
    bytes: &dyn Fn() -> u64,
) -> Result<CompareRun, BenchError> {
    let targets = targets(o.targets);
    let batch = o.batch.max(1) as u64;
    let t = Instant::now();
    let limit = (o.load_limit_s > 0).then(|| std::time::Duration::from_secs(o.load_limit_s));
    let mut next = 0;
    let mut stopped_by_load_limit = false;
    while next < size {
        if limit.is_some_and(|l| t.elapsed() >= l) {
            stopped_by_load_limit = true;
            break;
        }
        let end = (next + batch).min(size);
        let rows: Vec<Transition> = (next..end).map(|i| load_row(&targets, i, o)).collect();
        store.append(&rows).map_err(fail)?;
        next = end;
    }
    let size = next;
    let transitions_per_s = size as f64 / t.elapsed().as_secs_f64();

    // Every episode the load finished, target by target: the first `timed_summaries` timed
    // through `store`, the rest through `bulk` (the same store, or for QuestDB a handle that
    // does not wait for each summary to become visible).
    let per_target = size / targets.len() as u64;
    let episodes = per_target / u64::from(o.steps_per_episode.max(1));
    let mut put = 0u64;
    let mut timed = std::time::Duration::ZERO;
    for ep in 0..episodes {
        for target in &targets {
            let summary = load_episode(target, ep, o);
            if put < o.timed_summaries {
                let t = Instant::now();
                store.put_episode(&summary).map_err(fail)?;
                timed += t.elapsed();
            } else {
                bulk.put_episode(&summary).map_err(fail)?;
            }
            put += 1;
        }
    }
    let episodes_per_s = put.min(o.timed_summaries) as f64 / timed.as_secs_f64().max(1e-9);
    let store = after_bulk()?;
    let store = store.as_ref();

    let target = &targets[0];
    let want_top = (o.top_m as u64).min(episodes) as usize;
    let mut top_ms = Vec::new();
    for _ in 0..o.reads.max(1) {
        let t = Instant::now();
        let top = store.top_episodes(target, o.top_m).map_err(fail)?;
        top_ms.push(ms(t));
        if top.len() != want_top {
            return Err(fail(format!(
                "{}: top_episodes returned {} episodes, not {want_top}",
                store.backend(),
                top.len()
            )));
        }
    }
    let t = Instant::now();
    let drawn = store
        .sample(Some(target), o.compare_sample, 1)
        .map_err(fail)?;
    let sample_ms = ms(t);
    if drawn.len() != o.compare_sample {
        return Err(fail(format!(
            "{}: sample returned {} rows, not {}",
            store.backend(),
            drawn.len(),
            o.compare_sample
        )));
    }
    let counted = store.count_all().map_err(fail)?;
    if counted != size {
        return Err(fail(format!(
            "{}: {counted} transitions stored, not {size}",
            store.backend()
        )));
    }
    let bytes_on_disk = bytes();
    Ok(CompareRun {
        transitions: size,
        stopped_by_load_limit,
        transitions_per_s,
        episodes_per_s,
        top_m_ms: median(&top_ms),
        sample_ms,
        bytes_on_disk,
        bytes_per_transition: bytes_on_disk as f64 / size.max(1) as f64,
    })
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn sqlite_run(size: u64, o: &StoreBenchOptions, run: usize) -> Result<CompareRun, BenchError> {
    let path = o.out.join(format!("bench-store-compare-{run}.sqlite"));
    let files = |p: &Path| -> Vec<PathBuf> {
        ["", "-wal", "-shm"]
            .iter()
            .map(|s| {
                let mut x = p.as_os_str().to_owned();
                x.push(s);
                PathBuf::from(x)
            })
            .collect()
    };
    for f in files(&path) {
        let _ = std::fs::remove_file(f);
    }
    let result = (|| {
        let store = SqliteStore::open_path(&path).map_err(fail)?;
        let bytes = || {
            files(&path)
                .iter()
                .take(2)
                .map(|f| allocated_bytes(f))
                .sum()
        };
        let reopen = || -> Result<Box<dyn TrajectoryStore>, BenchError> {
            Ok(Box::new(SqliteStore::open_path(&path).map_err(fail)?))
        };
        measure(&store, &store, &reopen, size, o, &bytes)
    })();
    for f in files(&path) {
        let _ = std::fs::remove_file(f);
    }
    result
}

fn questdb_run(size: u64, o: &StoreBenchOptions, run: usize) -> Result<CompareRun, BenchError> {
    let root = o.out.join(format!("bench-store-compare-questdb-{run}"));
    let _ = std::fs::remove_dir_all(&root);
    let server = QuestDbServer::start_in(
        root.clone(),
        true,
        QuestDbServerOptions {
            log_levels: "ERROR,CRITICAL,ADVISORY",
            // QuestDB's own defaults, as a deployment runs it.
            append_page_kib: None,
            ..QuestDbServerOptions::default()
        },
    )
    .map_err(fail)?;
    let cfg = QuestDbConfig::new(server.url());
    let store = QuestDbStore::open(cfg.clone()).map_err(fail)?;
    let db = root.join("db");
    let bytes = || {
        // Table directories are `<table name>~<id>`; the WAL segments live inside them.
        std::fs::read_dir(&db)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        name.starts_with(&cfg.table_prefix)
                    })
                    .map(|e| allocated_bytes(&e.path()))
                    .sum()
            })
            .unwrap_or(0)
    };
    let mut quiet = cfg.clone();
    quiet.visibility_timeout = std::time::Duration::ZERO;
    let bulk = QuestDbStore::open(quiet).map_err(fail)?;
    // A new handle waits on open until every summary written is visible.
    let reopen = || -> Result<Box<dyn TrajectoryStore>, BenchError> {
        Ok(Box::new(QuestDbStore::open(cfg.clone()).map_err(fail)?))
    };
    let r = measure(&store, &bulk, &reopen, size, o, &bytes);
    drop(bulk);
    drop(store);
    drop(server);
    r
}

/// Runs the comparison.
pub fn run(o: &StoreBenchOptions) -> Result<CompareReport, BenchError> {
    std::fs::create_dir_all(&o.out).map_err(io_err(&o.out))?;
    let mut cells = Vec::new();
    let mut bytes_per_row = [FIRST_GUESS_BYTES_PER_ROW; 2];
    for &size in &o.sizes {
        for (bi, backend) in [Backend::Sqlite, Backend::Questdb].into_iter().enumerate() {
            if !o.backends.contains(&backend) {
                continue;
            }
            let mut cell = CompareCell {
                backend,
                transitions: size,
                skipped: None,
                runs: Vec::new(),
                median_transitions_per_s: f64::NAN,
                median_episodes_per_s: f64::NAN,
                median_top_m_ms: f64::NAN,
                median_sample_ms: f64::NAN,
                median_bytes_per_transition: f64::NAN,
            };
            let need = (bytes_per_row[bi] * size as f64 * 1.2) as u64;
            let free = free_bytes(&o.out);
            if let Some(free) = free {
                if need.saturating_add(DISK_RESERVE_BYTES) > free {
                    let why = format!(
                        "needs about {:.1} GB on disk ({:.0} bytes per transition), {:.1} GB free \
                         with {:.0} GB kept in reserve",
                        need as f64 / 1e9,
                        bytes_per_row[bi],
                        free as f64 / 1e9,
                        DISK_RESERVE_BYTES as f64 / 1e9
                    );
                    tracing::warn!(?backend, size, reason = %why, "skipping a store bench size");
                    cell.skipped = Some(why);
                    cells.push(cell);
                    continue;
                }
            }
            for run in 0..o.runs.max(1) {
                let r = match backend {
                    Backend::Sqlite => sqlite_run(size, o, run)?,
                    Backend::Questdb => questdb_run(size, o, run)?,
                };
                tracing::info!(
                    ?backend,
                    size,
                    run,
                    transitions_per_s = r.transitions_per_s,
                    episodes_per_s = r.episodes_per_s,
                    top_m_ms = r.top_m_ms,
                    sample_ms = r.sample_ms,
                    bytes_per_transition = r.bytes_per_transition,
                    "store comparison run"
                );
                cell.runs.push(r);
            }
            let m =
                |f: fn(&CompareRun) -> f64| median(&cell.runs.iter().map(f).collect::<Vec<_>>());
            cell.median_transitions_per_s = m(|r| r.transitions_per_s);
            cell.median_episodes_per_s = m(|r| r.episodes_per_s);
            cell.median_top_m_ms = m(|r| r.top_m_ms);
            cell.median_sample_ms = m(|r| r.sample_ms);
            cell.median_bytes_per_transition = m(|r| r.bytes_per_transition);
            bytes_per_row[bi] = cell.median_bytes_per_transition;
            cells.push(cell);
        }
    }
    Ok(CompareReport {
        options: o.clone(),
        questdb_version: aware_stores::testkit::QUESTDB_VERSION,
        cells,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small comparison against a real QuestDB: both backends store every transition and
    /// summary, read the top-M and a sample, report bytes, and leave nothing behind.
    #[test]
    fn both_backends_are_measured_and_cleaned_up() {
        let dir = std::env::temp_dir().join(format!("aware-bench-compare-{}", std::process::id()));
        let o = StoreBenchOptions {
            out: dir.clone(),
            compare: true,
            sizes: vec![3_000],
            targets: 3,
            top_m: 4,
            reads: 2,
            compare_sample: 64,
            timed_summaries: 20,
            runs: 1,
            batch: 256,
            ..StoreBenchOptions::default()
        };
        let r = run(&o).unwrap();
        assert_eq!(r.cells.len(), 2);
        for c in &r.cells {
            assert!(c.skipped.is_none(), "{c:?}");
            assert_eq!(c.runs.len(), 1);
            let x = &c.runs[0];
            assert!(x.transitions_per_s > 0.0 && x.episodes_per_s > 0.0, "{c:?}");
            assert!(x.bytes_per_transition > 50.0, "{c:?}");
            assert!(x.top_m_ms >= 0.0 && x.sample_ms >= 0.0, "{c:?}");
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "the run's storage is removed: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_load_spreads_targets_and_episodes() {
        let o = StoreBenchOptions::default();
        let ts = targets(3);
        let r = load_row(&ts, 3 * 250 + 2, &o);
        assert_eq!(r.target, ts[2]);
        assert_eq!((r.episode, r.step), (2, 50));
        assert_eq!(r.ts_ms, BASE_TS_MS + 250 * o.step_ms);
        let e = load_episode(&ts[0], 2, &o);
        assert_eq!(e.ts_ms, BASE_TS_MS + 299 * o.step_ms);
        assert_eq!(e.steps, o.steps_per_episode);
    }
}
