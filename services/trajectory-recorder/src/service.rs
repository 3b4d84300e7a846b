//! The recorder service: one actix actor per target joins `obs`, `action` and `applied` into
//! transitions ([`crate::join`]); one writer task stores them in batches and, once an episode's
//! last transition is stored, stores its summary and publishes `episode`.
//!
//! On NATS the recorder reads the JetStream stream in order (an ordered consumer) rather than live
//! subscriptions, and after every stored batch it persists the *resume point*: the stream sequence
//! of the oldest message it may still need: the lowest sequence of any message of each target's
//! oldest open episode (the minimum over targets; the previous episode's while a step of it waits
//! for a late part, see [`crate::join`]). With the capture in partitions (ADR 0024) each partition's
//! stream numbers its own messages and has its own resume point, the minimum over its targets.
//! A restarted recorder replays from there, rebuilds its joins and
//! episode accumulators, and re-writes what it had already stored (writes are idempotent), so a
//! crash or restart loses no transition and never duplicates a row or an `episode` message.
//!
//! Retention (`trajectory_store.keep_transitions`, default 10^6 per target: the paper's replay-buffer size,
//! Table 2): once a target has had that many plus a tenth more rows stored since its last pass
//! (and on its first batch after a start), the writer prunes its oldest whole episodes
//! ([`TrajectoryStore::prune`]), so the store holds at most 1.1 × `keep_transitions` rows per
//! target and the trainer's replay is the newest `keep_transitions` at most.
//!
//! Forgetting (`trajectory_store.forget_after_secs`, default 7 days): the recorder follows `target/1`. A
//! deregistration (the target's `AwareAutoscaler` deleted) marks the target in the store with the
//! time the recorder received it and stops its episode from holding the resume point back; a registration
//! clears the mark. Once a mark is older than the grace period, the target's data is deleted from
//! the store ([`TrajectoryStore::forget`]). Marks are kept in the store, so a restart does not
//! reset the grace period.
//!
//! Retirement (`actors.retire_after_secs`, [`TargetActors`]): every deregistration releases the
//! target's floor at once, with or without forgetting, and the target's actor stops once the
//! deregistration is `retire_after_secs` old, releasing its floor again (a replay after a
//! restart may have set it since). The recorder acts on nothing and must lose no transition, so
//! an event of a retired target is still recorded, by a new actor retired again after the delay
//! ([`LateEvents::Record`]).
//!
//! Silence (`recorder.release_silent_after_secs`, default an hour): a target whose observations
//! stop without a deregistration would hold the resume point back for good. Its actor releases
//! its floor once no `obs` has arrived for that long; the next `obs`, if it resumes, sets a new
//! one. A restart after the release rebuilds that episode's summary from the replayed steps, and
//! does not join a step spanning the silence.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, ActorContext, AsyncContext, Context, Handler};
use aware_bus_schemas::{Episode, Event, EventKind, Registration, Target};
use aware_shared::agents::{run_actors, sweep_ticks, Deliver, LateEvents, Retire, TargetActors};
use aware_shared::config::ConfigError;
use aware_shared::forget::{ForgetMetrics, Forgetting};
use aware_shared::service::{Replayed, ServiceContext, ServiceError};
use prometheus::{IntCounter, IntCounterVec, IntGauge};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::join::Joiner;
use aware_stores::trajectory::{
    open_store, EpisodeSummary, InvalidSetting, StoreConfig, StoreError, TrajectoryStore,
    Transition,
};

/// The store keys the `[recorder]` section held before the store had its own section.
const MOVED_TO_STORE: [&str; 6] = [
    "store",
    "sqlite_path",
    "questdb_url",
    "questdb_table_prefix",
    "keep_transitions",
    "forget_after_secs",
];

/// The `[recorder]` configuration section, and the trajectory store it writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecorderConfig {
    /// The trajectory store the recorder writes: the `[trajectory_store]` section (the trainer
    /// reads it too), filled in by [`RecorderConfig::read`].
    #[serde(skip)]
    pub store: StoreConfig,
    /// Where the JetStream resume points are kept, one per partition of the capture ([`read_resume`];
    /// default: `<trajectory_store.sqlite_path>.resume`,
    /// with shards `<…>.shard-<index>-of-<count>.resume`: each shard has its own, and a new
    /// shard count starts from the oldest message the stream keeps, the store's upserts
    /// absorbing what is recorded twice).
    pub resume_path: Option<PathBuf>,
    /// Transitions per write batch.
    pub batch: usize,
    /// On NATS: a target whose observations have stopped this long (seconds, wall clock) without
    /// a deregistration stops holding the JetStream resume point back at its open episode's
    /// first `obs` (0: it holds it until the episode completes, however long). Keep it well
    /// above the collector's step interval.
    pub release_silent_after_secs: u64,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        RecorderConfig {
            store: StoreConfig::default(),
            resume_path: None,
            batch: 512,
            release_silent_after_secs: 3600,
        }
    }
}

impl RecorderConfig {
    /// The `[recorder]` and `[trajectory_store]` sections of `cfg`, defaults filled in, checked;
    /// a store key still written under `[recorder]` is refused with the key it moved to.
    pub fn read(cfg: &aware_shared::config::AppConfig) -> Result<RecorderConfig, ConfigError> {
        if let Some(section) = cfg.sections.get("recorder") {
            if let Some(key) = MOVED_TO_STORE.iter().find(|k| section.get(**k).is_some()) {
                let to = if *key == "store" { "backend" } else { key };
                return Err(ConfigError::Invalid {
                    key: format!("recorder.{key}"),
                    reason: format!(
                        "the trajectory store has its own section: set trajectory_store.{to}"
                    ),
                });
            }
        }
        let mut r: RecorderConfig = cfg.section("recorder")?;
        r.store = cfg.section("trajectory_store")?;
        r.validate(cfg.learning.steps_per_episode)?;
        Ok(r)
    }

    /// Refuses settings the recorder cannot honour, naming the key.
    pub fn validate(&self, steps_per_episode: u32) -> Result<(), ConfigError> {
        if !(1..=1_000_000).contains(&self.batch) {
            return Err(ConfigError::Invalid {
                key: "recorder.batch".into(),
                reason: format!("{} (must be in 1..=1000000)", self.batch),
            });
        }
        self.store
            .validate("trajectory_store")
            .map_err(|InvalidSetting { key, reason }| ConfigError::Invalid { key, reason })?;
        let keep = self.store.keep_transitions;
        if keep > 0 && keep < u64::from(steps_per_episode) {
            return Err(ConfigError::Invalid {
                key: "trajectory_store.keep_transitions".into(),
                reason: format!(
                    "{keep} is less than one episode (learning.steps_per_episode = \
                     {steps_per_episode}); use 0 to keep everything"
                ),
            });
        }
        Ok(())
    }

    /// After how long without observations a target's floor is released: `None` never.
    pub fn release_silent_after(&self) -> Option<Duration> {
        (self.release_silent_after_secs > 0)
            .then(|| Duration::from_secs(self.release_silent_after_secs))
    }

    pub fn resume_path(&self, shard: &aware_shared::config::ShardConfig) -> PathBuf {
        self.resume_path.clone().unwrap_or_else(|| {
            let mut p = self.store.sqlite_path.clone().into_os_string();
            if shard.count > 1 {
                p.push(format!(".shard-{}-of-{}", shard.index, shard.count));
            }
            p.push(".resume");
            PathBuf::from(p)
        })
    }
}

/// Why the persisted resume point cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error("recorder resume point {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("recorder resume point {} is corrupt: `{text}` (expected a sequence, or `partitions <P>` then `<partition> <sequence>` lines)", path.display())]
    Corrupt { path: PathBuf, text: String },
}

/// The resume point of each partition of the capture: the stream sequence a replay of that
/// partition starts from (absent: everything it keeps).
pub type ResumePoints = std::collections::BTreeMap<u32, u64>;

/// The persisted resume points for a capture of `partitions` partitions (empty when none:
/// replay everything the streams keep). One partition's is a bare sequence; several are a
/// `partitions <P>` line then `<partition> <sequence>` lines. Points written for another
/// partition count refer to other streams: they are dropped, with a warning, and the new
/// streams are replayed from their start (the store's upserts absorb what comes twice).
pub fn read_resume(path: &std::path::Path, partitions: u32) -> Result<ResumePoints, ResumeError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ResumePoints::new()),
        Err(source) => {
            return Err(ResumeError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let corrupt = || ResumeError::Corrupt {
        path: path.to_path_buf(),
        text: text.trim().to_string(),
    };
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().ok_or_else(corrupt)?;
    let (written_for, points) = match first.strip_prefix("partitions ") {
        None => {
            let seq: u64 = first.parse().map_err(|_| corrupt())?;
            if lines.next().is_some() {
                return Err(corrupt());
            }
            (1, ResumePoints::from([(0, seq)]))
        }
        Some(p) => {
            let p: u32 = p.trim().parse().map_err(|_| corrupt())?;
            let mut points = ResumePoints::new();
            for l in lines {
                let (k, seq) = l.split_once(' ').ok_or_else(corrupt)?;
                let k: u32 = k.parse().map_err(|_| corrupt())?;
                let seq: u64 = seq.trim().parse().map_err(|_| corrupt())?;
                if k >= p {
                    return Err(corrupt());
                }
                points.insert(k, seq);
            }
            (p, points)
        }
    };
    if written_for != partitions {
        tracing::warn!(path = %path.display(), written_for, partitions, "the resume points were written for another partition count (bus.jetstream.partitions): replaying the capture from its start");
        return Ok(ResumePoints::new());
    }
    Ok(points)
}

/// Writes the resume points atomically (temporary file, fsync, rename), in [`read_resume`]'s
/// format.
pub fn write_resume(
    path: &std::path::Path,
    partitions: u32,
    points: &ResumePoints,
) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    if partitions <= 1 {
        writeln!(f, "{}", points.get(&0).copied().unwrap_or(0))?;
    } else {
        writeln!(f, "partitions {partitions}")?;
        for (k, seq) in points {
            writeln!(f, "{k} {seq}")?;
        }
    }
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

enum Write {
    Transition(Box<Transition>),
    Episode(Box<Episode>),
    /// The oldest stream sequence a target may still need.
    Floor(Target, u64),
    /// The target was deregistered or its actor retired: its floor no longer holds the resume
    /// point back.
    Release(Target),
    /// A partition's stream was recreated: its targets' floors refer to the old one. Its resume
    /// point goes back to its start until their next `obs` set new floors.
    StreamReset(u32),
}

/// An event with its JetStream stream sequence (on NATS).
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct Sequenced(pub Event, pub Option<u64>);

/// The recorder's own metrics.
#[derive(Clone)]
struct RecorderMetrics {
    stored: IntCounter,
    episodes: IntCounter,
    pruned_transitions: IntCounter,
    pruned_episodes: IntCounter,
    forgotten_targets: IntCounter,
    forgotten_transitions: IntCounter,
    deregistered: IntGauge,
    /// How long the oldest open episode has held the resume point back, labelled by its target.
    resume_held: prometheus::IntGaugeVec,
    /// Floors released because their target's observations stopped.
    silent_releases: IntCounter,
    /// Times the stream was found recreated.
    stream_resets: IntCounter,
    store_errors: IntCounterVec,
    /// Transitions refused because their key holds one of another time.
    overwrites_refused: IntCounter,
    /// Observations refused for a non-finite reward, state or utilization.
    non_finite: IntCounter,
}

impl RecorderMetrics {
    fn new(ctx: &ServiceContext) -> Result<Self, ServiceError> {
        let m = &ctx.metrics;
        let resume_held = m.gauge_vec(
            "recorder_resume_held_seconds",
            "How long the oldest open episode has held the JetStream resume point back, by its target (0 and no target: none)",
            &["target"],
        )?;
        resume_held.with_label_values(&[""]).set(0);
        // The replay's series of every partition it reads exist from the start, at 0, so that a
        // first discard shows as an increase.
        let js = &ctx.config.bus.jetstream;
        if js.enabled {
            for k in js.partitions_of(&ctx.config.shard) {
                let stream = js.partition_stream(k);
                m.replay_read.with_label_values(&[&stream]);
                m.replay_discarded.with_label_values(&[&stream]);
                m.capture_span.with_label_values(&[&stream]);
            }
        }
        Ok(RecorderMetrics {
            stored: m.counter("recorder_transitions_stored_total", "Transitions stored")?,
            overwrites_refused: m.counter(
                "recorder_overwrites_refused_total",
                "Transitions refused because their (target, episode, step) holds one of another time",
            )?,
            episodes: m.counter("recorder_episodes_total", "Episode summaries stored")?,
            pruned_transitions: m.counter(
                "recorder_transitions_pruned_total",
                "Transitions deleted by retention (trajectory_store.keep_transitions)",
            )?,
            pruned_episodes: m.counter(
                "recorder_episodes_pruned_total",
                "Episode summaries deleted by retention (trajectory_store.keep_transitions)",
            )?,
            forgotten_targets: m.counter(
                "recorder_targets_forgotten_total",
                "Deregistered targets whose data was deleted (trajectory_store.forget_after_secs)",
            )?,
            forgotten_transitions: m.counter(
                "recorder_transitions_forgotten_total",
                "Transitions of deregistered targets deleted (trajectory_store.forget_after_secs)",
            )?,
            deregistered: m.gauge(
                "recorder_deregistered_targets",
                "Deregistered targets whose data waits for trajectory_store.forget_after_secs",
            )?,
            resume_held,
            stream_resets: m.counter(
                "recorder_stream_resets_total",
                "Times the JetStream stream was found recreated (its server lost its storage): the recorder read it again from its first message",
            )?,
            silent_releases: m.counter(
                "recorder_silent_releases_total",
                "Open episodes that stopped holding the resume point back because their target's observations stopped (recorder.release_silent_after_secs)",
            )?,
            non_finite: m.counter(
                "recorder_non_finite_obs_total",
                "Observations refused because their reward, state or utilization is not finite (no transition is joined across them)",
            )?,
            // Every op at 0 from the start, so a scrape (and an alert's rate) sees the series.
            store_errors: m.counter_vec(
                "recorder_store_errors_total",
                "Failed store operations (retried)",
                &["op"],
                &[
                    &["append"],
                    &["put_episode"],
                    &["episodes"],
                    &["prune"],
                    &["resume"],
                    &["invalid"],
                    &["marks"],
                    &["mark"],
                    &["forget"],
                ],
            )?,
        })
    }
}

/// The first value of `o` that a transition or an episode summary takes and is not finite.
fn non_finite_field(o: &aware_bus_schemas::Obs) -> Option<&'static str> {
    if o.reward.is_some_and(|r| !r.is_finite()) {
        Some("reward")
    } else if o.state.iter().any(|x| !x.is_finite()) {
        Some("state")
    } else if !o.metrics.cpu_util.is_finite() {
        Some("metrics.cpu_util")
    } else if !o.metrics.memory_util.is_finite() {
        Some("metrics.memory_util")
    } else {
        None
    }
}

/// The actor of one target.
pub struct TargetRecorder {
    target: Target,
    joiner: Joiner,
    writes: mpsc::UnboundedSender<Write>,
    /// The floor last sent to the writer: the join's [`Joiner::floor`], the lowest stream
    /// sequence a replay needs to rebuild this target's open steps and episode.
    floor: Option<u64>,
    /// Release the floor after this long without an `obs` (`recorder.release_silent_after_secs`).
    silent_after: Option<Duration>,
    /// When the last `obs` arrived (wall clock of this process: replayed events count as arriving
    /// now, so a restart does not release a floor it has just rebuilt).
    last_obs: std::time::Instant,
    silent_releases: IntCounter,
    non_finite: IntCounter,
}

impl Actor for TargetRecorder {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(after) = self.silent_after {
            let every = (after / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
            ctx.run_interval(every, |act, _| act.release_if_silent());
        }
    }
}

impl Handler<Retire> for TargetRecorder {
    type Result = ();

    /// The target was deregistered `actors.retire_after_secs` ago: what the actor still joins is
    /// of a deleted workload, so its floor stops holding the resume point back.
    fn handle(&mut self, _: Retire, ctx: &mut Self::Context) {
        let out = self.joiner.flush();
        self.write(out);
        if self.floor.is_some() {
            let _ = self.writes.send(Write::Release(self.target.clone()));
        }
        ctx.stop();
    }
}

impl TargetRecorder {
    fn new(
        target: &Target,
        steps_per_episode: u32,
        writes: mpsc::UnboundedSender<Write>,
        silent_after: Option<Duration>,
        silent_releases: IntCounter,
        non_finite: IntCounter,
    ) -> Self {
        TargetRecorder {
            target: target.clone(),
            joiner: Joiner::new(target.clone(), steps_per_episode),
            writes,
            floor: None,
            silent_after,
            last_obs: std::time::Instant::now(),
            silent_releases,
            non_finite,
        }
    }

    /// A target whose observations stopped without a deregistration (its collector moved, the
    /// Deployment was scaled away, the source lost it) would hold the resume point back for
    /// good, and every restart would replay everything since. After `silent_after` its floor is
    /// released; if it resumes, the first `obs` sets a new one. What this costs, only when the
    /// recorder restarts after the release: the resumed episode's summary is rebuilt from the
    /// steps replayed (its rewards are per-step means, so the lifecycle monitor reads the same
    /// level), as a replay past the stream's retention would; and a step spanning the silence,
    /// whose `obs` came before it, is not joined. Every transition already stored stays.
    fn release_if_silent(&mut self) {
        self.release_if_silent_at(std::time::Instant::now());
    }

    fn release_if_silent_at(&mut self, now: std::time::Instant) {
        let Some(after) = self.silent_after else {
            return;
        };
        if self.floor.is_none() || now.saturating_duration_since(self.last_obs) < after {
            return;
        }
        let out = self.joiner.flush();
        self.write(out);
        self.joiner.release_floor();
        self.floor = None;
        self.silent_releases.inc();
        tracing::info!(target = %self.target, silent_secs = after.as_secs(), "no observations: the open episode no longer holds the resume point back");
        let _ = self.writes.send(Write::Release(self.target.clone()));
    }

    /// Sends what the join produced to the writer, then the join's floor if it moved: the
    /// writer persists a floor only once what came before it is stored.
    fn write(&mut self, out: crate::join::Joined) {
        for t in out.transitions {
            let _ = self.writes.send(Write::Transition(Box::new(t)));
        }
        for e in out.episodes {
            let _ = self.writes.send(Write::Episode(Box::new(e)));
        }
        if let Some(seq) = self.joiner.floor().filter(|&s| self.floor != Some(s)) {
            self.floor = Some(seq);
            let _ = self.writes.send(Write::Floor(self.target.clone(), seq));
        }
    }

    fn take(&mut self, ev: Event, seq: Option<u64>) {
        let out = match ev {
            Event::Obs(o) => {
                self.last_obs = std::time::Instant::now();
                // A NaN or an infinity would reach the store as a transition it refuses, and the
                // episode's summary (whose mean would be NaN) it does not: the obs is refused
                // whole, so neither the step before nor this one is joined into a transition.
                if let Some(field) = non_finite_field(&o) {
                    self.non_finite.inc();
                    tracing::warn!(target = %o.target, episode = o.episode, step = o.step, field, "observation refused: a value is not finite");
                    return;
                }
                self.joiner.on_obs(o, seq)
            }
            Event::Action(a) => self.joiner.on_action(a, seq),
            Event::Applied(a) => self.joiner.on_applied(a, seq),
            _ => return,
        };
        self.write(out);
    }
}

impl Handler<Deliver> for TargetRecorder {
    type Result = ();

    fn handle(&mut self, Deliver(ev): Deliver, _: &mut Self::Context) {
        self.take(ev, None);
    }
}

impl Handler<Sequenced> for TargetRecorder {
    type Result = ();

    fn handle(&mut self, Sequenced(ev, seq): Sequenced, _: &mut Self::Context) {
        self.take(ev, seq);
    }
}

/// Runs `op` on the blocking pool until it succeeds or shutdown, backing off between attempts.
async fn with_retry<T: Send + 'static>(
    ctx: &ServiceContext,
    metrics: &RecorderMetrics,
    label: &'static str,
    op: impl Fn() -> Result<T, StoreError> + Send + Sync + Clone + 'static,
) -> Option<T> {
    let mut attempt = 0usize;
    loop {
        let f = op.clone();
        match tokio::task::spawn_blocking(f).await {
            Ok(Ok(v)) => return Some(v),
            Ok(Err(e)) => {
                metrics.store_errors.with_label_values(&[label]).inc();
                tracing::error!(op = label, error = %e, attempt, "store operation failed; retrying");
            }
            Err(e) => {
                metrics.store_errors.with_label_values(&[label]).inc();
                tracing::error!(op = label, error = %e, "store task failed; retrying");
            }
        }
        let wait = aware_shared::bus::backoff(attempt, Duration::from_secs(5));
        attempt += 1;
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// The JetStream resume points: each target's floor ([`Joiner::floor`]) and what was
/// persisted, per partition of the capture.
struct Resume {
    path: PathBuf,
    /// The capture's partitions and how a target maps to one.
    capture: aware_shared::config::JetStreamConfig,
    /// Each target's floor and its partition (computed once, not on every pass).
    floors: std::collections::HashMap<Target, (u32, Floor)>,
    /// The same floors ordered by partition, then sequence: a partition's holder is its first
    /// entry, found without a pass over every target (a flush comes every batch).
    order: std::collections::BTreeSet<(u32, u64, Target)>,
    persisted: ResumePoints,
}

/// A target's floor: its stream sequence and when the writer received it (Unix ms).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Floor {
    seq: u64,
    since_ms: i64,
}

/// Each partition's holder: the floor with the partition's lowest sequence, and its target.
type Holders<'a> = std::collections::BTreeMap<u32, (&'a Target, Floor)>;

impl Resume {
    fn new(
        path: PathBuf,
        capture: aware_shared::config::JetStreamConfig,
        persisted: ResumePoints,
    ) -> Self {
        Resume {
            path,
            capture,
            floors: Default::default(),
            order: Default::default(),
            persisted,
        }
    }

    /// `target`'s floor (replacing its previous one).
    fn set_floor(&mut self, target: Target, floor: Floor) {
        let k = self.capture.partition_of(&target);
        let previous = self.floors.insert(target.clone(), (k, floor));
        let mut key = (k, floor.seq, target);
        if let Some((k0, f0)) = previous {
            if (k0, f0.seq) == (k, floor.seq) {
                return;
            }
            let stale = (k0, f0.seq, key.2);
            self.order.remove(&stale);
            key.2 = stale.2;
        }
        self.order.insert(key);
    }

    /// `target` no longer holds a resume point back (deregistered, retired or silent).
    fn release(&mut self, target: &Target) {
        if let Some((t, (k, f))) = self.floors.remove_entry(target) {
            self.order.remove(&(k, f.seq, t));
        }
    }

    /// `partition`'s stream was recreated: its targets' floors refer to the old one.
    fn reset_partition(&mut self, partition: u32) {
        self.floors.retain(|_, (k, _)| *k != partition);
        self.order.retain(|(k, _, _)| *k != partition);
    }

    /// Each partition's holder: the first floor of each partition in `order`, one lookup per
    /// partition.
    fn holders(&self) -> Holders<'_> {
        let mut holders = Holders::new();
        let mut next = self.order.first();
        while let Some((k, _, t)) = next {
            if let Some((_, f)) = self.floors.get(t) {
                holders.insert(*k, (t, *f));
            }
            next = k
                .checked_add(1)
                .and_then(|k1| self.order.range((k1, 0, Target::new("", ""))..).next());
        }
        holders
    }

    /// The floor that has held a resume point back longest and its target, if any: of the
    /// partitions' holders, the one received first.
    fn oldest<'a>(holders: &Holders<'a>) -> Option<(&'a Target, Floor)> {
        holders.values().copied().min_by_key(|(_, f)| f.since_ms)
    }

    /// Each partition's resume point: its holder's sequence. A partition without a floor keeps
    /// what was persisted.
    fn points(&self, holders: &Holders<'_>) -> ResumePoints {
        let mut points = self.persisted.clone();
        points.extend(holders.iter().map(|(k, (_, f))| (*k, f.seq)));
        points
    }
}

impl Floor {
    /// How long, at `now_ms`, this floor has held the resume point back, in seconds: a target
    /// whose episode never completes (its observations stopped without a deregistration) holds
    /// it for good, and a restart replays everything since.
    fn held_secs(&self, now_ms: i64) -> i64 {
        now_ms.saturating_sub(self.since_ms).max(0) / 1000
    }
}

/// Retention's bookkeeping: rows stored per target since its last prune.
struct Retention {
    keep: Option<NonZeroU64>,
    /// Rows stored since the last pass that make a target due again (a tenth of `keep`).
    slack: u64,
    since: HashMap<Target, u64>,
}

impl Retention {
    fn new(keep: Option<NonZeroU64>) -> Self {
        Retention {
            keep,
            slack: keep.map_or(0, |k| (k.get() / 10).max(1)),
            since: HashMap::new(),
        }
    }

    /// Counts a stored batch; the targets now due for a pass (each once, in batch order). A
    /// target not seen since the start is due on its first batch.
    fn stored(&mut self, batch: &[Transition]) -> Vec<Target> {
        if self.keep.is_none() {
            return Vec::new();
        }
        let mut due = Vec::new();
        for t in batch {
            let n = self.since.entry(t.target.clone()).or_insert(self.slack);
            *n += 1;
            if *n >= self.slack && !due.contains(&t.target) {
                due.push(t.target.clone());
            }
        }
        due
    }
}

/// One retention pass over `due`. A failed pass is counted and logged; the target is tried again
/// once another tenth of `keep` rows has been stored.
async fn prune(
    store: &Arc<dyn TrajectoryStore>,
    metrics: &RecorderMetrics,
    retention: &mut Retention,
    due: Vec<Target>,
) {
    let Some(keep) = retention.keep else { return };
    for target in due {
        retention.since.insert(target.clone(), 0);
        let (s, t) = (store.clone(), target.clone());
        let outcome = match tokio::task::spawn_blocking(move || s.prune(&t, keep)).await {
            Ok(r) => r.map_err(PruneError::Store),
            Err(e) => Err(PruneError::Task(e)),
        };
        match outcome {
            Ok(p) => {
                metrics.pruned_transitions.inc_by(p.transitions);
                metrics.pruned_episodes.inc_by(p.episodes);
                if p.transitions > 0 || p.episodes > 0 {
                    tracing::info!(target = %target, keep = keep.get(), transitions = p.transitions, episodes = p.episodes, below_episode = p.below_episode, "retention pruned the oldest episodes");
                }
            }
            Err(e) => {
                metrics.store_errors.with_label_values(&["prune"]).inc();
                tracing::warn!(target = %target, error = %e, "retention pass failed; retrying later");
            }
        }
    }
}

/// A failed retention pass (logged and counted; tried again later).
#[derive(Debug, thiserror::Error)]
enum PruneError {
    #[error(transparent)]
    Store(StoreError),
    #[error("blocking task: {0}")]
    Task(tokio::task::JoinError),
}

/// The recorder's side of forgetting ([`aware_shared::forget`]): marks and data in the
/// trajectory store.
struct StoreForgetting(Arc<dyn TrajectoryStore>);

impl Forgetting for StoreForgetting {
    type Error = StoreError;

    fn marks(&self) -> Result<Vec<(Target, i64)>, StoreError> {
        self.0.deregistered()
    }

    fn mark(&self, target: &Target, since_ms: Option<i64>) -> Result<(), StoreError> {
        self.0.mark_deregistered(target, since_ms)
    }

    fn forget(&self, target: &Target) -> Result<u64, StoreError> {
        let f = self.0.forget(target)?;
        tracing::debug!(target = %target, transitions = f.transitions, episodes = f.episodes, "trajectories forgotten");
        Ok(f.transitions)
    }
}

async fn writer(
    ctx: ServiceContext,
    store: Arc<dyn TrajectoryStore>,
    mut rx: mpsc::UnboundedReceiver<Write>,
    metrics: RecorderMetrics,
    batch_size: usize,
    mut resume: Resume,
    mut retention: Retention,
) {
    let mut batch: Vec<Transition> = Vec::new();
    let mut episodes: Vec<Episode> = Vec::new();
    let take = |w: Write,
                batch: &mut Vec<Transition>,
                episodes: &mut Vec<Episode>,
                resume: &mut Resume| match w {
        Write::Transition(t) => batch.push(*t),
        Write::Episode(e) => episodes.push(*e),
        Write::Floor(t, seq) => {
            let since_ms = aware_bus_schemas::now_ms();
            resume.set_floor(t, Floor { seq, since_ms });
        }
        Write::Release(t) => resume.release(&t),
        Write::StreamReset(partition) => {
            resume.reset_partition(partition);
            let capture = &resume.capture;
            let mut points = resume.persisted.clone();
            points.insert(partition, 0);
            match write_resume(&resume.path, capture.partitions, &points) {
                Ok(()) => resume.persisted = points,
                Err(e) => {
                    tracing::error!(path = %resume.path.display(), error = %e, "cannot reset the resume point")
                }
            }
        }
    };
    loop {
        let first = tokio::select! {
            w = rx.recv() => w,
            _ = ctx.shutdown.cancelled() => None,
        };
        let Some(first) = first else { break };
        let mut next = Some(first);
        while let Some(w) = next {
            take(w, &mut batch, &mut episodes, &mut resume);
            next = if batch.len() < batch_size {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        let due = retention.stored(&batch);
        if flush(&ctx, &store, &metrics, &mut batch, &mut episodes).await {
            persist_resume(&mut resume, &metrics);
            prune(&store, &metrics, &mut retention, due).await;
        }
    }
    // Shutdown: store what is still queued.
    while let Ok(w) = rx.try_recv() {
        take(w, &mut batch, &mut episodes, &mut resume);
    }
    if flush(&ctx, &store, &metrics, &mut batch, &mut episodes).await {
        persist_resume(&mut resume, &metrics);
    }
}

/// Persists each partition's lowest floor once everything received before it is stored, and
/// reports how long the oldest floor has held a resume point back.
fn persist_resume(resume: &mut Resume, metrics: &RecorderMetrics) {
    let holders = resume.holders();
    let oldest = Resume::oldest(&holders).map(|(t, f)| (t.to_string(), f));
    let (holder, held) = match &oldest {
        Some((t, f)) => (t.as_str(), f.held_secs(aware_bus_schemas::now_ms())),
        None => ("", 0),
    };
    metrics.resume_held.reset();
    metrics.resume_held.with_label_values(&[holder]).set(held);
    let points = resume.points(&holders);
    drop(holders);
    if points == resume.persisted {
        return;
    }
    match write_resume(&resume.path, resume.capture.partitions, &points) {
        Ok(()) => resume.persisted = points,
        Err(e) => {
            metrics.store_errors.with_label_values(&["resume"]).inc();
            tracing::error!(path = %resume.path.display(), error = %e, "cannot persist the resume point");
        }
    }
}

/// Stores the batch and the episode summaries; false when shutdown interrupted a retry.
async fn flush(
    ctx: &ServiceContext,
    store: &Arc<dyn TrajectoryStore>,
    metrics: &RecorderMetrics,
    batch: &mut Vec<Transition>,
    episodes: &mut Vec<Episode>,
) -> bool {
    if !batch.is_empty() {
        // Invalid rows (non-finite values) are refused by the store: drop them, keep the rest.
        let valid: Vec<Transition> = std::mem::take(batch)
            .into_iter()
            .filter(|t| match t.validate() {
                Ok(()) => true,
                Err(e) => {
                    metrics.store_errors.with_label_values(&["invalid"]).inc();
                    tracing::warn!(error = %e, "transition refused");
                    false
                }
            })
            .collect();
        let kept = valid.len() as u64;
        let valid = Arc::new(valid);
        let s = store.clone();
        let Some(refused) =
            with_retry(ctx, metrics, "append", move || s.append_counted(&valid)).await
        else {
            return false;
        };
        metrics.overwrites_refused.inc_by(refused);
        metrics.stored.inc_by(kept.saturating_sub(refused));
    }
    for e in std::mem::take(episodes) {
        // At least once: publish, then store. A replay after a restart re-derives summaries; one
        // already stored was already published and is not repeated; one published but not yet
        // stored when the recorder died is published again (the lifecycle monitor ignores
        // repeated episodes).
        let s = store.clone();
        let (target, episode) = (e.target.clone(), e.episode);
        let Some(stored) = with_retry(ctx, metrics, "episodes", move || {
            Ok(s.episodes(&target, 1)?
                .last()
                .is_some_and(|last| last.episode >= episode))
        })
        .await
        else {
            return false;
        };
        if stored {
            continue;
        }
        let _ = ctx.publish(&e).await;
        let summary = EpisodeSummary::from(&e);
        let s = store.clone();
        if with_retry(ctx, metrics, "put_episode", move || s.put_episode(&summary))
            .await
            .is_none()
        {
            return false;
        }
        metrics.episodes.inc();
    }
    true
}

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let cfg = RecorderConfig::read(&ctx.config)?;
    let store = open_store(&cfg.store, "trajectory_store")
        .map_err(|e| ServiceError::resource("trajectory store", e))?;
    let metrics = RecorderMetrics::new(&ctx)?;
    let resume_path = cfg.resume_path(&ctx.config.shard);
    let capture = ctx.config.bus.jetstream.clone();
    let start = read_resume(&resume_path, capture.partitions)
        .map_err(|e| ServiceError::resource("recorder.resume_path", e))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let resume = Resume::new(resume_path, capture, start.clone());
    let forget_task = match cfg.store.forget_after() {
        Some(after) => {
            let registrations = ctx.subscribe_events(&[EventKind::Target]).await?;
            let forget_metrics = ForgetMetrics {
                targets: metrics.forgotten_targets.clone(),
                items: metrics.forgotten_transitions.clone(),
                waiting: metrics.deregistered.clone(),
                errors: metrics.store_errors.clone(),
            };
            Some(tokio::spawn(aware_shared::forget::run(
                ctx.clone(),
                Arc::new(StoreForgetting(store.clone())),
                after,
                registrations,
                forget_metrics,
                |_: &Registration| {},
                |_: &Target| {},
            )))
        }
        None => None,
    };
    let silent_releases = metrics.silent_releases.clone();
    let non_finite = metrics.non_finite.clone();
    let stream_resets = metrics.stream_resets.clone();
    let writer_task = tokio::spawn(writer(
        ctx.clone(),
        store,
        rx,
        metrics,
        cfg.batch.max(1),
        resume,
        Retention::new(cfg.store.keep()),
    ));
    let spe = ctx.config.learning.steps_per_episode;
    let writes = tx.clone();
    let silent_after = cfg.release_silent_after();
    let mut actors = TargetActors::spread(&ctx, move |t: &Target| {
        TargetRecorder::new(
            t,
            spe,
            writes.clone(),
            silent_after,
            silent_releases.clone(),
            non_finite.clone(),
        )
    })
    .with_late_events(LateEvents::Record);
    let kinds = [EventKind::Obs, EventKind::Action, EventKind::Applied];
    let replay =
        matches!(ctx.bus, aware_shared::bus::Bus::Nats(_)) && ctx.config.bus.jetstream.enabled;
    if replay {
        let mut rx = ctx.subscribe_replay(&kinds, &start).await?;
        // Registrations live (and the bus's retained state), not replayed: they release floors
        // and retire actors, whatever the replay has reached.
        let mut registrations = ctx.subscribe_events(&[EventKind::Target]).await?;
        actors.follow_registrations(true);
        let mut sweeps = actors.sweep_every().map(sweep_ticks);
        ctx.ready.set(true);
        tracing::info!(
            service = ctx.name,
            from_seq = ?start,
            "ready (JetStream replay)"
        );
        loop {
            tokio::select! {
                _ = ctx.shutdown.cancelled() => break,
                ev = rx.recv() => match ev {
                    Some(Replayed::Event(ev, seq)) => {
                        if actors.admit_at(&ev, aware_bus_schemas::now_ms()) {
                            let target = ev.target().clone();
                            actors.get_or_start(&target).do_send(Sequenced(*ev, seq));
                        }
                    }
                    Some(Replayed::Reset { partition, reason }) => {
                        stream_resets.inc();
                        tracing::warn!(partition, %reason, "the stream starts over: its resume point reset, floors set again by the next observations");
                        let _ = tx.send(Write::StreamReset(partition));
                    }
                    None => break,
                },
                ev = registrations.recv() => match ev {
                    Some(ev) => {
                        if let Event::Registration(r) = &ev {
                            if r.spec.is_none() {
                                let _ = tx.send(Write::Release(r.target.clone()));
                            }
                        }
                        actors.route(ev);
                    }
                    None => break,
                },
                _ = async { sweeps.as_mut()?.tick().await; Some(()) }, if sweeps.is_some() => {
                    actors.sweep(aware_bus_schemas::now_ms());
                }
            }
        }
        ctx.ready.set(false);
    } else {
        // No stream sequences, so no floors: registrations only retire actors.
        run_actors(&ctx, crate::CONSUMES, &mut actors).await?;
    }
    drop(actors);
    drop(tx);
    if let Some(task) = forget_task {
        task.await.map_err(|source| ServiceError::Task {
            task: "forget",
            source,
        })?;
    }
    writer_task.await.map_err(|source| ServiceError::Task {
        task: "writer",
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_stores::trajectory::StoreKind;

    /// The store has its own section; a store key still under `[recorder]` names its new key,
    /// and unknown keys are refused in both sections.
    #[test]
    fn the_store_has_its_own_section_and_old_keys_name_their_new_place() {
        let mut cfg = aware_shared::config::AppConfig::default();
        cfg.sections.insert(
            "trajectory_store".into(),
            serde_json::json!({
                "backend": "questdb",
                "questdb_url": "http://q:9000",
                "keep_transitions": 0,
                "forget_after_secs": 0,
            }),
        );
        cfg.sections.insert(
            "recorder".into(),
            serde_json::json!({ "batch": 7, "release_silent_after_secs": 5 }),
        );
        let r = RecorderConfig::read(&cfg).unwrap();
        assert_eq!(r.store.backend, StoreKind::Questdb);
        assert_eq!(r.store.questdb_url, "http://q:9000");
        assert_eq!(r.store.questdb_table_prefix, "aware_", "a default");
        assert_eq!((r.batch, r.release_silent_after_secs), (7, 5));
        assert!(serde_json::to_value(&r).unwrap().get("backend").is_none());

        let mut old = cfg.clone();
        old.sections
            .insert("recorder".into(), serde_json::json!({ "store": "questdb" }));
        let e = RecorderConfig::read(&old).unwrap_err().to_string();
        assert!(
            e.contains("recorder.store") && e.contains("trajectory_store.backend"),
            "{e}"
        );
        old.sections.insert(
            "recorder".into(),
            serde_json::json!({ "sqlite_path": "/x" }),
        );
        let e = RecorderConfig::read(&old).unwrap_err().to_string();
        assert!(e.contains("trajectory_store.sqlite_path"), "{e}");

        let mut typo = cfg.clone();
        typo.sections.insert(
            "trajectory_store".into(),
            serde_json::json!({ "sqlite_pth": "/x" }),
        );
        let e = RecorderConfig::read(&typo).unwrap_err().to_string();
        assert!(e.contains("sqlite_pth"), "{e}");
    }

    #[test]
    fn resume_point_round_trips_and_rejects_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r");
        assert!(
            read_resume(&p, 1).unwrap().is_empty(),
            "absent: replay everything"
        );
        write_resume(&p, 1, &ResumePoints::from([(0, 12345)])).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "12345\n",
            "as before partitions"
        );
        assert_eq!(
            read_resume(&p, 1).unwrap(),
            ResumePoints::from([(0, 12345)])
        );
        assert!(
            read_resume(&p, 4).unwrap().is_empty(),
            "a single stream's point means nothing in four partitions"
        );
        let four = ResumePoints::from([(0, 7), (3, 90)]);
        write_resume(&p, 4, &four).unwrap();
        assert_eq!(read_resume(&p, 4).unwrap(), four);
        assert!(read_resume(&p, 8).unwrap().is_empty(), "another layout");
        for garbage in [
            "twelve",
            "1\n2",
            "partitions 4\n4 10",
            "partitions 4\n1",
            "",
        ] {
            std::fs::write(&p, garbage).unwrap();
            let e = read_resume(&p, 4).unwrap_err().to_string();
            assert!(e.contains("corrupt"), "{garbage}: {e}");
        }
        let cfg = RecorderConfig {
            store: StoreConfig {
                sqlite_path: "/x/t.db".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let shard = |index, count| aware_shared::config::ShardConfig { index, count };
        assert_eq!(
            cfg.resume_path(&shard(0, 1)),
            PathBuf::from("/x/t.db.resume")
        );
        assert_eq!(
            cfg.resume_path(&shard(1, 3)),
            PathBuf::from("/x/t.db.shard-1-of-3.resume")
        );
    }

    #[test]
    fn the_oldest_floor_holds_the_resume_point_and_its_age_is_reported() {
        let (a, b) = (Target::new("ns", "a"), Target::new("ns", "b"));
        let mut r = Resume::new(
            PathBuf::from("/nonexistent/r"),
            Default::default(),
            Default::default(),
        );
        let held = |r: &Resume, now_ms| {
            Resume::oldest(&r.holders()).map_or(0, |(_, f)| f.held_secs(now_ms))
        };
        assert_eq!((Resume::oldest(&r.holders()), held(&r, 5_000)), (None, 0));
        r.set_floor(
            a.clone(),
            Floor {
                seq: 10,
                since_ms: 1_000,
            },
        );
        r.set_floor(
            b.clone(),
            Floor {
                seq: 7,
                since_ms: 3_000,
            },
        );
        assert_eq!(
            Resume::oldest(&r.holders()).map(|(t, f)| (t.clone(), f.seq)),
            Some((b.clone(), 7)),
            "the lowest sequence"
        );
        assert_eq!(held(&r, 63_999), 60, "held since b's floor");
        // b's episode completes: its next floor is past a's, which now holds it.
        r.set_floor(
            b,
            Floor {
                seq: 12,
                since_ms: 70_000,
            },
        );
        assert_eq!(held(&r, 71_000), 70);
        r.release(&a);
        assert_eq!(held(&r, 71_000), 1);
        assert_eq!(held(&r, 0), 0, "a clock gone back reports 0");
    }

    /// The ordered index gives every partition the holder a pass over all floors would, after
    /// any mix of moved, released and reset floors.
    #[test]
    fn holders_are_each_partitions_lowest_floor_after_any_updates() {
        let capture = aware_shared::config::JetStreamConfig {
            partitions: 8,
            ..Default::default()
        };
        let mut r = Resume::new(
            PathBuf::from("/nonexistent/r"),
            capture,
            ResumePoints::new(),
        );
        let targets: Vec<Target> = (0..40)
            .map(|n| Target::new("ns", format!("app-{n}")))
            .collect();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut draw = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for i in 0..5_000u64 {
            let t = &targets[draw(40) as usize];
            match draw(20) {
                0..=15 => r.set_floor(
                    t.clone(),
                    Floor {
                        seq: draw(300),
                        since_ms: i as i64,
                    },
                ),
                16..=18 => r.release(t),
                _ => r.reset_partition(draw(8) as u32),
            }
            let mut brute: Holders<'_> = Holders::new();
            for (t, (k, f)) in &r.floors {
                let e = brute.entry(*k).or_insert((t, *f));
                if (f.seq, t) < (e.1.seq, e.0) {
                    *e = (t, *f);
                }
            }
            assert_eq!(r.holders(), brute, "after update {i}");
            assert_eq!(r.order.len(), r.floors.len(), "after update {i}");
        }
    }

    /// Each partition's stream numbers its own messages: its resume point is the lowest floor
    /// of its own targets, whatever the other partitions' floors.
    #[test]
    fn each_partition_resumes_from_the_lowest_floor_of_its_own_targets() {
        let capture = aware_shared::config::JetStreamConfig {
            partitions: 4,
            ..Default::default()
        };
        let in_partition = |k: u32, skip: usize| {
            (0..)
                .map(|n| Target::new("ns", format!("app-{n}")))
                .filter(|t| capture.partition_of(t) == k)
                .nth(skip)
                .unwrap()
        };
        let (a, a2, b) = (in_partition(1, 0), in_partition(1, 1), in_partition(2, 0));
        let mut r = Resume::new(
            PathBuf::from("/nonexistent/r"),
            capture.clone(),
            ResumePoints::from([(0, 5), (1, 3)]),
        );
        let floor = |seq, since_ms| Floor { seq, since_ms };
        r.set_floor(a.clone(), floor(40, 2_000));
        r.set_floor(a2.clone(), floor(30, 3_000));
        r.set_floor(b.clone(), floor(2, 4_000));
        assert_eq!(
            r.points(&r.holders()),
            ResumePoints::from([(0, 5), (1, 30), (2, 2)]),
            "partition 0 has no floor and keeps its point"
        );
        assert_eq!(
            Resume::oldest(&r.holders()).map(|(t, f)| (t.clone(), f.seq)),
            Some((a2.clone(), 30)),
            "partition 1's holder came before partition 2's, though its sequence is higher"
        );
        r.release(&a2);
        assert_eq!(
            r.points(&r.holders())[&1],
            40,
            "a2's episode done: a holds partition 1"
        );
    }

    #[test]
    fn a_silent_targets_floor_is_released_and_set_again_when_it_resumes() {
        use aware_bus_schemas::generated::samples;
        let target = Target::new("ns", "quiet");
        let obs = |step: u32| {
            let Some(Event::Obs(mut o)) =
                samples().into_iter().find(|e| matches!(e, Event::Obs(_)))
            else {
                unreachable!()
            };
            o.target = target.clone();
            o.episode = 0;
            o.step = step;
            Event::Obs(o)
        };
        // What reached the writer: floors and releases only.
        let drain = |rx: &mut mpsc::UnboundedReceiver<Write>| {
            let mut out = Vec::new();
            while let Ok(w) = rx.try_recv() {
                match w {
                    Write::Floor(t, seq) => out.push(format!("floor {t} {seq}")),
                    Write::Release(t) => out.push(format!("release {t}")),
                    _ => {}
                }
            }
            out
        };
        let after = Duration::from_secs(60);
        let counter = IntCounter::new("c", "c").unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut r = TargetRecorder::new(
            &target,
            100,
            tx,
            Some(after),
            counter.clone(),
            IntCounter::new("n", "n").unwrap(),
        );

        // Nothing to release before the first obs.
        r.release_if_silent_at(r.last_obs + after * 2);
        assert!(drain(&mut rx).is_empty());
        r.take(obs(0), Some(5));
        r.take(obs(1), Some(9));
        assert_eq!(
            drain(&mut rx),
            ["floor ns/quiet 5"],
            "the episode's first obs"
        );
        let seen = r.last_obs;
        r.release_if_silent_at(seen + after - Duration::from_millis(1));
        assert!(drain(&mut rx).is_empty(), "not yet silent long enough");
        assert_eq!(r.floor, Some(5));
        r.release_if_silent_at(seen + after);
        assert_eq!(drain(&mut rx), ["release ns/quiet"]);
        assert_eq!((r.floor, counter.get()), (None, 1));
        r.release_if_silent_at(seen + after * 3);
        assert!(drain(&mut rx).is_empty(), "released once");
        assert_eq!(counter.get(), 1);
        // It resumes mid-episode: that obs holds the resume point from now on.
        r.take(obs(2), Some(40));
        r.take(obs(3), Some(44));
        assert_eq!(drain(&mut rx), ["floor ns/quiet 40"]);
        assert!(r.last_obs >= seen);

        // Off: the floor holds however long the target is silent.
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut r = TargetRecorder::new(
            &target,
            100,
            tx,
            None,
            counter.clone(),
            IntCounter::new("n", "n").unwrap(),
        );
        r.take(obs(0), Some(5));
        r.release_if_silent_at(r.last_obs + Duration::from_secs(1_000_000));
        assert_eq!(drain(&mut rx), ["floor ns/quiet 5"]);
        assert_eq!((r.floor, counter.get()), (Some(5), 1));
        assert_eq!(
            RecorderConfig::default().release_silent_after(),
            Some(Duration::from_secs(3600))
        );
    }

    /// The last transition of an episode waits for its late `applied`: the new episode's floor
    /// is held back until it is written, so a restart in between replays that transition's obs.
    #[test]
    fn a_new_episodes_floor_waits_for_the_last_transition_of_the_previous() {
        use aware_bus_schemas::generated::samples;
        let target = Target::new("ns", "late");
        let event = |kind: EventKind, episode: u64, step: u32| {
            let mut ev = samples().into_iter().find(|e| e.kind() == kind).unwrap();
            match &mut ev {
                Event::Obs(o) => {
                    (o.target, o.episode, o.step) = (target.clone(), episode, step);
                    o.reward = Some(1.0);
                }
                Event::Action(a) => (a.target, a.episode, a.step) = (target.clone(), episode, step),
                Event::Applied(a) => {
                    (a.target, a.episode, a.step) = (target.clone(), episode, step)
                }
                _ => unreachable!(),
            }
            ev
        };
        let drain = |rx: &mut mpsc::UnboundedReceiver<Write>| {
            let mut out = Vec::new();
            while let Ok(w) = rx.try_recv() {
                match w {
                    Write::Floor(_, seq) => out.push(format!("floor {seq}")),
                    Write::Transition(t) => out.push(format!("step {}/{}", t.episode, t.step)),
                    Write::Episode(e) => out.push(format!("episode {}", e.episode)),
                    Write::Release(_) => out.push("release".into()),
                    _ => {}
                }
            }
            out
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut r = TargetRecorder::new(
            &target,
            2,
            tx,
            None,
            IntCounter::new("s", "s").unwrap(),
            IntCounter::new("n", "n").unwrap(),
        );
        r.take(event(EventKind::Obs, 0, 0), Some(1));
        r.take(event(EventKind::Action, 0, 0), Some(2));
        r.take(event(EventKind::Applied, 0, 0), Some(3));
        r.take(event(EventKind::Obs, 0, 1), Some(4));
        r.take(event(EventKind::Action, 0, 1), Some(5));
        assert_eq!(drain(&mut rx), ["floor 1", "step 0/0"]);
        // obs(1, 0) before the applied of step (0, 1): the episode's floor stays.
        r.take(event(EventKind::Obs, 1, 0), Some(6));
        assert!(drain(&mut rx).is_empty());
        assert_eq!(r.floor, Some(1));
        r.take(event(EventKind::Applied, 0, 1), Some(7));
        assert_eq!(drain(&mut rx), ["step 0/1", "episode 0", "floor 6"]);
        // A flush (the target retires or falls silent) stores a transition still waiting.
        r.take(event(EventKind::Action, 1, 0), Some(8));
        r.take(event(EventKind::Obs, 1, 1), Some(9));
        assert!(drain(&mut rx).is_empty());
        let out = r.joiner.flush();
        r.write(out);
        assert_eq!(drain(&mut rx), ["step 1/0"]);
    }

    /// An observation with a NaN or an infinite reward, state or utilization is refused whole
    /// and counted: it sets no resume floor and joins no transition (it used to be taken, its
    /// NaN utilization summed into the episode).
    #[test]
    fn observations_with_non_finite_values_are_refused_and_counted() {
        use aware_bus_schemas::generated::samples;
        let target = Target::new("ns", "nan");
        let obs = |spoil: fn(&mut aware_bus_schemas::Obs)| {
            let Some(Event::Obs(mut o)) =
                samples().into_iter().find(|e| matches!(e, Event::Obs(_)))
            else {
                unreachable!()
            };
            o.target = target.clone();
            o.episode = 0;
            o.step = 0;
            spoil(&mut o);
            Event::Obs(o)
        };
        let non_finite = IntCounter::new("n", "n").unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut r = TargetRecorder::new(
            &target,
            100,
            tx,
            None,
            IntCounter::new("c", "c").unwrap(),
            non_finite.clone(),
        );
        for spoil in [
            (|o: &mut aware_bus_schemas::Obs| o.reward = Some(f64::NAN))
                as fn(&mut aware_bus_schemas::Obs),
            |o| o.state[0] = f32::INFINITY,
            |o| o.metrics.cpu_util = f64::NAN,
            |o| o.metrics.memory_util = f64::NEG_INFINITY,
        ] {
            r.take(obs(spoil), Some(5));
        }
        assert_eq!(non_finite.get(), 4);
        assert!(rx.try_recv().is_err(), "nothing reached the writer");
        assert_eq!(r.floor, None);
        r.take(obs(|_| {}), Some(6));
        assert_eq!(non_finite.get(), 4);
        assert_eq!(r.floor, Some(6), "a finite one is taken");
    }

    #[test]
    fn retention_settings_are_validated() {
        let ok = RecorderConfig::default();
        assert_eq!(
            ok.store.keep_transitions, 1_000_000,
            "the paper's replay size"
        );
        ok.validate(100).unwrap();
        let keep = |store, keep_transitions| RecorderConfig {
            store: StoreConfig {
                backend: store,
                keep_transitions,
                forget_after_secs: 0,
                ..Default::default()
            },
            ..Default::default()
        };
        let e = keep(StoreKind::Questdb, 1_000_000)
            .validate(100)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("trajectory_store.keep_transitions") && e.contains("TTL"),
            "{e}"
        );
        keep(StoreKind::Questdb, 0).validate(100).unwrap();
        let e = keep(StoreKind::Sqlite, 99)
            .validate(100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("less than one episode"), "{e}");
        keep(StoreKind::Sqlite, 100).validate(100).unwrap();
        assert_eq!(keep(StoreKind::Sqlite, 0).store.keep(), None);
    }

    #[test]
    fn forgetting_settings_are_validated() {
        let ok = RecorderConfig::default();
        assert_eq!(
            ok.store.forget_after(),
            Some(Duration::from_secs(7 * 24 * 3600))
        );
        let cfg = |store, forget_after_secs| RecorderConfig {
            store: StoreConfig {
                backend: store,
                forget_after_secs,
                keep_transitions: 0,
                ..Default::default()
            },
            ..Default::default()
        };
        let e = cfg(StoreKind::Questdb, 60)
            .validate(100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("trajectory_store.forget_after_secs"), "{e}");
        cfg(StoreKind::Questdb, 0).validate(100).unwrap();
        assert_eq!(cfg(StoreKind::Sqlite, 0).store.forget_after(), None);
    }

    fn rows(target: &Target, n: u32) -> Vec<Transition> {
        (0..n)
            .map(|s| aware_stores::trajectory::conformance::transition(target, 0, s))
            .collect()
    }

    #[test]
    fn a_target_is_due_on_its_first_batch_then_after_a_tenth_of_keep() {
        let (a, b) = (Target::new("ns", "a"), Target::new("ns", "b"));
        let mut r = Retention::new(NonZeroU64::new(100));
        assert_eq!(r.slack, 10);
        let mut batch = rows(&a, 3);
        batch.extend(rows(&b, 2));
        assert_eq!(r.stored(&batch), vec![a.clone(), b.clone()], "first batch");
        // The pass resets the counters (as `prune` does).
        r.since.insert(a.clone(), 0);
        r.since.insert(b.clone(), 0);
        assert!(r.stored(&rows(&a, 9)).is_empty(), "9 of 10");
        assert_eq!(r.stored(&rows(&a, 1)), vec![a.clone()], "10 of 10");
        assert!(
            Retention::new(None).stored(&batch).is_empty(),
            "keep everything"
        );
    }
}
