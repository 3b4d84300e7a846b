//! The recorder service: one actix actor per target joins `obs`, `action` and `applied` into
//! transitions ([`crate::join`]); one writer task stores them in batches and, once an episode's
//! last transition is stored, stores its summary and publishes `episode`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Context, Handler};
use aware_bus_schemas::{Episode, Event, EventKind, Target};
use aware_shared::agents::{run_actors, Deliver, TargetActors};
use aware_shared::service::{ServiceContext, ServiceError};
use prometheus::{IntCounter, IntCounterVec};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::join::Joiner;
use crate::store::{EpisodeSummary, SqliteConfig, SqliteStore, TrajectoryStore, Transition};

/// The `[recorder]` configuration section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecorderConfig {
    /// SQLite database file of the embedded store.
    pub sqlite_path: PathBuf,
    /// Transitions per write batch.
    pub batch: usize,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        RecorderConfig {
            sqlite_path: PathBuf::from("aware-data/trajectories.db"),
            batch: 512,
        }
    }
}

enum Write {
    Transition(Box<Transition>),
    Episode(Box<Episode>),
}

/// The recorder's own metrics.
#[derive(Clone)]
struct RecorderMetrics {
    stored: IntCounter,
    episodes: IntCounter,
    store_errors: IntCounterVec,
}

impl RecorderMetrics {
    fn new(ctx: &ServiceContext) -> Result<Self, ServiceError> {
        let r = ctx.metrics.registry();
        let err = |e: prometheus::Error| ServiceError::Other(e.to_string());
        let stored = IntCounter::new("recorder_transitions_stored_total", "Transitions stored")
            .map_err(err)?;
        let episodes =
            IntCounter::new("recorder_episodes_total", "Episode summaries stored").map_err(err)?;
        let store_errors = IntCounterVec::new(
            prometheus::Opts::new(
                "recorder_store_errors_total",
                "Failed store operations (retried)",
            ),
            &["op"],
        )
        .map_err(err)?;
        r.register(Box::new(stored.clone())).map_err(err)?;
        r.register(Box::new(episodes.clone())).map_err(err)?;
        r.register(Box::new(store_errors.clone())).map_err(err)?;
        Ok(RecorderMetrics {
            stored,
            episodes,
            store_errors,
        })
    }
}

/// The actor of one target.
pub struct TargetRecorder {
    joiner: Joiner,
    writes: mpsc::UnboundedSender<Write>,
}

impl Actor for TargetRecorder {
    type Context = Context<Self>;
}

impl Handler<Deliver> for TargetRecorder {
    type Result = ();

    fn handle(&mut self, Deliver(ev): Deliver, _: &mut Self::Context) {
        match ev {
            Event::Obs(o) => {
                let out = self.joiner.on_obs(o);
                if let Some(t) = out.transition {
                    let _ = self.writes.send(Write::Transition(Box::new(t)));
                }
                if let Some(e) = out.episode {
                    let _ = self.writes.send(Write::Episode(Box::new(e)));
                }
            }
            Event::Action(a) => self.joiner.on_action(a),
            Event::Applied(a) => self.joiner.on_applied(a),
            _ => {}
        }
    }
}

/// Runs `op` on the blocking pool until it succeeds or shutdown, backing off between attempts.
async fn with_retry<T: Send + 'static>(
    ctx: &ServiceContext,
    metrics: &RecorderMetrics,
    label: &'static str,
    op: impl Fn() -> Result<T, crate::store::StoreError> + Send + Sync + Clone + 'static,
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

async fn writer(
    ctx: ServiceContext,
    store: Arc<dyn TrajectoryStore>,
    mut rx: mpsc::UnboundedReceiver<Write>,
    metrics: RecorderMetrics,
    batch_size: usize,
) {
    let mut batch: Vec<Transition> = Vec::new();
    let mut episodes: Vec<Episode> = Vec::new();
    loop {
        let first = tokio::select! {
            w = rx.recv() => w,
            _ = ctx.shutdown.cancelled() => None,
        };
        let Some(first) = first else { break };
        let mut next = Some(first);
        while let Some(w) = next {
            match w {
                Write::Transition(t) => batch.push(*t),
                Write::Episode(e) => episodes.push(*e),
            }
            next = if batch.len() < batch_size {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        flush(&ctx, &store, &metrics, &mut batch, &mut episodes).await;
    }
    // Shutdown: store what is still queued.
    while let Ok(w) = rx.try_recv() {
        match w {
            Write::Transition(t) => batch.push(*t),
            Write::Episode(e) => episodes.push(*e),
        }
    }
    flush(&ctx, &store, &metrics, &mut batch, &mut episodes).await;
}

async fn flush(
    ctx: &ServiceContext,
    store: &Arc<dyn TrajectoryStore>,
    metrics: &RecorderMetrics,
    batch: &mut Vec<Transition>,
    episodes: &mut Vec<Episode>,
) {
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
        if with_retry(ctx, metrics, "append", move || s.append(&valid))
            .await
            .is_some()
        {
            metrics.stored.inc_by(kept);
        }
    }
    for e in std::mem::take(episodes) {
        let summary = EpisodeSummary::from(&e);
        let s = store.clone();
        if with_retry(ctx, metrics, "put_episode", move || s.put_episode(&summary))
            .await
            .is_some()
        {
            metrics.episodes.inc();
            let _ = ctx.publish(&e).await;
        }
    }
}

/// Opens the configured store.
pub fn open_store(cfg: &RecorderConfig) -> Result<Arc<dyn TrajectoryStore>, ServiceError> {
    if let Some(dir) = cfg.sqlite_path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(|e| {
                ServiceError::Other(format!("recorder.sqlite_path {}: {e}", dir.display()))
            })?;
        }
    }
    let store = SqliteStore::open(&SqliteConfig::new(&cfg.sqlite_path))
        .map_err(|e| ServiceError::Other(format!("recorder.sqlite_path: {e}")))?;
    Ok(Arc::new(store))
}

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let cfg: RecorderConfig = ctx.config.section("recorder")?;
    let store = open_store(&cfg)?;
    let metrics = RecorderMetrics::new(&ctx)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let writer_task = tokio::spawn(writer(ctx.clone(), store, rx, metrics, cfg.batch.max(1)));
    let spe = ctx.config.collector.steps_per_episode;
    let mut actors = TargetActors::new(&ctx, move |t: &Target| TargetRecorder {
        joiner: Joiner::new(t.clone(), spe),
        writes: tx.clone(),
    });
    run_actors(
        &ctx,
        &[EventKind::Obs, EventKind::Action, EventKind::Applied],
        false,
        &mut actors,
    )
    .await?;
    drop(actors);
    writer_task
        .await
        .map_err(|e| ServiceError::Other(format!("writer task: {e}")))
}
