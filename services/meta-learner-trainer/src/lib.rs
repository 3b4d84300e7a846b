//! meta-learner-trainer: trains the base- and meta-learner from the trajectory store and publishes
//! `model` and `embedding`.
//!
//! One actor per target follows the target's lifecycle. At every change it reads what the
//! trajectory store holds for it (transitions, recorded episodes, the best episode: the data the
//! meta-learner's top-M bundle will use). While the target is OFFLINE or ONLINE it trains the
//! base-learner ([`learner`]). It checks the store whether a round is due
//! (`train_every_transitions` new transitions or `train_every_ms`) when the recorder announces a
//! stored episode (`episode`), after a stage change or a failed round, and at least every
//! `trainer.recheck_ms` ([`Recheck`]); no event, no store read, so idle targets cost nothing but
//! a timer. A round runs on the blocking pool — OFFLINE: `offline_gradient_steps` TD3+BC updates on the fallback's transitions,
//! then the off-policy estimate of the policy on the target's recent fallback episodes; ONLINE:
//! `gradient_steps` DDPG updates (BC term decaying; a round the time trigger brings early makes
//! steps in proportion to its new transitions, ADR 0023) — and writes the checkpoint to the model
//! store; then the actor publishes `model` (kind `base_learner`, version increasing per target;
//! offline rounds carry `policy_estimate` and `behaviour_reward`, which the lifecycle monitor
//! uses for OFFLINE → ONLINE). SERVING does not train. The store is the one the recorder writes
//! (the `[trajectory_store]` section), the model store the `[model_store]` section.
//!
//! With `trainer.meta_dir` set, each actor also computes the target's workload embedding, publishes
//! `embedding` and conditions the base-learner on it ([`embedding`]); the check runs on the same
//! blocking task, before the round, in every stage.

pub mod embedding;
pub mod learner;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, WrapFuture};
use aware_bus_schemas::{Event, EventKind, Model, ModelKind, Registration, Schema, Stage, Target};
use aware_shared::agents::{
    run_actors_retiring, spawn_publisher, Deliver, Outbox, Retire, TargetActors,
};
use aware_shared::config::ConfigError;
use aware_shared::forget::{ForgetMetrics, Forgetting};
use aware_shared::launcher::ServiceEntry;
use aware_shared::model_store::{
    model_prefix, open_model_store, ModelStore, ModelStoreConfig, ModelStoreError,
};
use aware_shared::service::{ServiceContext, ServiceError};
use aware_shared::telemetry::{ServiceMetrics, TelemetryError};
use aware_stores::trajectory::{open_store, StoreConfig, StoreError, TrajectoryStore};

use crate::embedding::{Checked, MetaAssets, TargetMeta};
use crate::learner::{Learner, TrainerConfig, TrainerError};

pub const NAME: &str = "meta-learner-trainer";
/// Routed to the targets' actors. `target` is read beside them (forgetting and retiring deleted
/// targets), and the trajectory store rather than the bus supplies the transitions: an `episode`
/// only says that the recorder stored some (a hint: a forged one costs one store read).
pub const CONSUMES: &[EventKind] = &[EventKind::Lifecycle, EventKind::Episode];

/// When a target's actor reads the store: after an event that may have changed what a round
/// would find, or once the last read is `every` old.
#[derive(Debug, Clone)]
pub struct Recheck {
    pending: bool,
    last: Option<std::time::Instant>,
    every: Duration,
}

impl Recheck {
    /// Due at once (nothing read yet).
    pub fn new(every: Duration) -> Self {
        Recheck {
            pending: true,
            last: None,
            every,
        }
    }

    /// Something changed: the next look reads the store.
    pub fn notify(&mut self) {
        self.pending = true;
    }

    /// Whether to read the store now; if so, the read is counted as done.
    pub fn take(&mut self, now: std::time::Instant) -> bool {
        let due = self.pending
            || self
                .last
                .is_none_or(|l| now.saturating_duration_since(l) >= self.every);
        if due {
            self.pending = false;
            self.last = Some(now);
        }
        due
    }

    /// How long from `now` until a timed read is due: `every` after the last read, `every`
    /// again when that has passed without one (the actor could not read: no stage that trains,
    /// or a round running, whose end looks again), zero when none was taken yet.
    pub fn timed_in(&self, now: std::time::Instant) -> Duration {
        match self.last {
            None => Duration::ZERO,
            Some(l) => match (l + self.every).checked_duration_since(now) {
                Some(d) if !d.is_zero() => d,
                _ => self.every,
            },
        }
    }

    /// The read taken last finished at `now` (its round waited for a worker and ran): the next
    /// timed read counts from here. Counted from the take instead, it came while the round's
    /// `train_every_ms` had not quite passed, and the round waited a second interval.
    pub fn done(&mut self, now: std::time::Instant) {
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
    }
}
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
    notice: None,
    sharded: true,
};

/// What the store holds for a target.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingData {
    pub transitions: u64,
    pub episodes: usize,
    pub best_episode_reward: Option<f64>,
}

/// Reads the training data available for `target`.
pub fn training_data(
    store: &dyn TrajectoryStore,
    target: &Target,
    top_m: usize,
) -> Result<TrainingData, StoreError> {
    let top = store.top_episodes(target, top_m)?;
    Ok(TrainingData {
        transitions: store.count(target)?,
        episodes: top.len(),
        best_episode_reward: top.first().map(|e| e.total_reward),
    })
}

/// The trainer's metrics.
#[derive(Clone)]
pub struct TrainerMetrics {
    pub transitions: prometheus::IntGauge,
    /// A whole-store count for `transitions` is running (one at a time across targets).
    counting_all: Arc<AtomicBool>,
    pub rounds: prometheus::IntCounter,
    pub round_errors: prometheus::IntCounter,
    /// Stored checkpoints that could not be read when resuming (the version before is used).
    pub corrupt_checkpoints: prometheus::IntCounter,
    /// Stored rows a round refused for a non-finite value.
    pub non_finite_rows: prometheus::IntCounter,
    pub gradient_steps: prometheus::IntCounter,
    /// Rounds due that wait for a worker.
    pub rounds_waiting: prometheus::IntGauge,
    pub round_seconds: prometheus::Histogram,
    pub embeddings: prometheus::IntCounter,
    pub embedding_errors: prometheus::IntCounter,
    pub rollbacks: prometheus::IntCounter,
    pub models_pruned: prometheus::IntCounter,
    pub prune_errors: prometheus::IntCounter,
    /// Networks kept in memory between rounds (`trainer.held_networks`), and reads of a
    /// released network's checkpoint.
    pub networks_held: prometheus::IntGauge,
    pub network_reloads: prometheus::IntCounter,
    /// Forgetting deleted targets (`trainer.forget_after_secs`).
    pub forget: ForgetMetrics,
}

impl TrainerMetrics {
    pub fn new(m: &ServiceMetrics) -> Result<Self, TelemetryError> {
        Ok(TrainerMetrics {
            transitions: m.gauge(
                "trainer_transitions_available",
                "Transitions in the trajectory store at the last lifecycle change",
            )?,
            counting_all: Arc::new(AtomicBool::new(false)),
            rounds: m.counter(
                "trainer_rounds_total",
                "Training rounds that published a base-learner model",
            )?,
            round_errors: m.counter(
                "trainer_round_errors_total",
                "Training rounds that failed (store, model store or non-finite training)",
            )?,
            corrupt_checkpoints: m.counter(
                "trainer_corrupt_checkpoints_total",
                "Stored checkpoints that failed to read or verify when resuming (corrupt, truncated); the newest intact version before is used",
            )?,
            non_finite_rows: m.counter(
                "trainer_non_finite_rows_total",
                "Stored transitions a training round refused because a value (state, reward, action) is not finite",
            )?,
            gradient_steps: m.counter("trainer_gradient_steps_total", "DDPG gradient steps taken")?,
            rounds_waiting: m.gauge(
                "trainer_rounds_waiting",
                "Rounds due that wait for a worker (trainer.workers): a level that keeps growing means the trainer falls behind",
            )?,
            round_seconds: m.histogram(
                "trainer_round_seconds",
                "Duration of one training round (sampling, gradient steps, checkpoint write)",
                prometheus::exponential_buckets(0.005, 2.0, 14)?,
            )?,
            embeddings: m.counter(
                "trainer_embeddings_published_total",
                "Workload embeddings computed and published (meta-learning)",
            )?,
            embedding_errors: m.counter(
                "trainer_embedding_errors_total",
                "Meta-learning failures: meta dir not loadable, bad bundle or embedding, store errors",
            )?,
            rollbacks: m.counter(
                "trainer_rollbacks_total",
                "Rollbacks (lifecycle rollback_to): a version republished as the newest",
            )?,
            models_pruned: m.counter(
                "trainer_models_pruned_total",
                "Base-learner versions deleted from the model store (trainer.keep_versions)",
            )?,
            prune_errors: m.counter(
                "trainer_prune_errors_total",
                "Retention passes that failed (model store errors); the versions stay",
            )?,
            networks_held: m.gauge(
                "trainer_networks_held",
                "Networks kept in memory between rounds (at most trainer.held_networks)",
            )?,
            network_reloads: m.counter(
                "trainer_network_reloads_total",
                "Networks read back from their checkpoint for a round (targets beyond trainer.held_networks)",
            )?,
            forget: ForgetMetrics {
                targets: m.counter(
                    "trainer_targets_forgotten_total",
                    "Deleted targets whose checkpoints were deleted (trainer.forget_after_secs)",
                )?,
                items: m.counter(
                    "trainer_models_forgotten_total",
                    "Checkpoints of deleted targets deleted (trainer.forget_after_secs)",
                )?,
                waiting: m.gauge(
                    "trainer_deregistered_targets",
                    "Deleted targets whose checkpoints wait for trainer.forget_after_secs",
                )?,
                errors: m.counter_vec(
                    "trainer_forget_errors_total",
                    "Failed operations of forgetting (retried), by op: the model store's marks, mark and forget, the state bucket's forget_state",
                    &["op"],
                    &[&["marks"], &["mark"], &["forget"], &["forget_state"]],
                )?,
            },
        })
    }
}

/// The trainer's side of forgetting ([`aware_shared::forget`]): a deleted target's mark is the
/// object `<namespace>/<name>/deregistered` (when the trainer received the deregistration, decimal milliseconds) in
/// the model store, next to its checkpoints; forgetting deletes every object under
/// `<namespace>/<name>/`, the mark last.
pub struct ModelForgetting(pub Arc<dyn ModelStore>);

/// The model-store key of `target`'s deregistration mark.
pub fn mark_key(target: &Target) -> String {
    format!("{}/{MARK}", model_prefix(target))
}

const MARK: &str = "deregistered";

/// Why forgetting in the model store failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelForgetError {
    #[error(transparent)]
    Store(#[from] ModelStoreError),
    #[error("deregistration mark {key} is not a time in ms")]
    BadMark { key: String },
}

impl Forgetting for ModelForgetting {
    type Error = ModelForgetError;

    /// The target's newest `model` and `embedding` go with its checkpoints.
    fn state_kinds(&self) -> &'static [EventKind] {
        &[EventKind::Model, EventKind::Embedding]
    }

    fn marks(&self) -> Result<Vec<(Target, i64)>, ModelForgetError> {
        let mut marks = Vec::new();
        for key in self.0.keys("")? {
            let parts: Vec<&str> = key.split('/').collect();
            let [namespace, name, MARK] = parts.as_slice() else {
                continue;
            };
            let bytes = self.0.get(&key)?;
            let since = std::str::from_utf8(&bytes)
                .ok()
                .and_then(|t| t.trim().parse::<i64>().ok())
                .ok_or_else(|| ModelForgetError::BadMark { key: key.clone() })?;
            marks.push((Target::new(*namespace, *name), since));
        }
        Ok(marks)
    }

    fn mark(&self, target: &Target, since_ms: Option<i64>) -> Result<(), ModelForgetError> {
        let key = mark_key(target);
        match since_ms {
            Some(since) => self.0.put(&key, since.to_string().as_bytes()).map(|_| ()),
            None => self.0.delete(&key),
        }?;
        Ok(())
    }

    fn forget(&self, target: &Target) -> Result<u64, ModelForgetError> {
        let mark = mark_key(target);
        let keys = self.0.keys(&format!("{}/", model_prefix(target)))?;
        let mut deleted = 0u64;
        for key in keys.iter().filter(|k| **k != mark) {
            self.0.delete(key)?;
            deleted += 1;
        }
        self.0.delete(&mark)?;
        Ok(deleted)
    }
}

/// The actor of one target.
pub struct TargetTrainer {
    target: Target,
    store: Arc<dyn TrajectoryStore>,
    models: Arc<dyn ModelStore>,
    /// How soon after an event the actor looks (`trainer.poll_ms`): events in between are
    /// looked at together.
    poll: Duration,
    /// When to read the store ([`Recheck`]).
    recheck: Recheck,
    /// The next look, when one is scheduled, and its timer. An actor looks `poll` after an
    /// event and otherwise only when its timed read is due: an idle target costs one timer
    /// per `trainer.recheck_ms`, not one per `poll_ms`.
    next_look: Option<(std::time::Instant, actix::SpawnHandle)>,
    stage: Stage,
    /// ONLINE entered from SERVING (`Lifecycle::retraining`): rounds take
    /// `trainer.retrain_gradient_steps`.
    retraining: bool,
    /// A rollback to run before the next round: the version and the lifecycle message's
    /// (episode, step).
    rollback: Option<(u64, (u64, u32))>,
    /// The target went SERVING: a retention pass (`trainer.keep_versions`) is due once no round
    /// runs.
    prune_due: bool,
    /// `None` while a round waits for a worker or runs on the blocking pool.
    learner: Option<Learner>,
    /// The workers (`trainer.workers`) every target's rounds share.
    workers: Arc<tokio::sync::Semaphore>,
    /// Meta-learning (`None`: off); taken with the learner while a round runs.
    meta: Option<TargetMeta>,
    outbox: Outbox,
    metrics: TrainerMetrics,
    /// Stops a running round (the learner's cancel token: a child of the service's shutdown),
    /// so a target forgotten mid-round gets no checkpoint after its checkpoints were deleted.
    cancel: tokio_util::sync::CancellationToken,
}

/// A round counted in `aware_trainer_rounds_waiting` from its creation to its drop.
struct Waiting(prometheus::IntGauge);

impl Waiting {
    fn new(gauge: prometheus::IntGauge) -> Self {
        gauge.inc();
        Waiting(gauge)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What a round leaves: the learner and the meta state back, the embedding check, the round's
/// result and time, and the retention pass after a published round.
type RoundDone = (
    Learner,
    Option<TargetMeta>,
    Option<Checked>,
    Result<Option<learner::Published>, TrainerError>,
    Duration,
    Option<Result<usize, TrainerError>>,
);

/// One target's round on the blocking pool: the embedding check (meta-learning), then the round
/// if one is due, then the retention pass if it published.
fn round(
    store: Arc<dyn TrajectoryStore>,
    models: Arc<dyn ModelStore>,
    mut learner: Learner,
    mut meta: Option<TargetMeta>,
    stage: Stage,
) -> RoundDone {
    let checked = meta.as_mut().map(|m| m.check(store.as_ref(), &mut learner));
    let ready = meta.as_ref().is_none_or(TargetMeta::ready);
    let t0 = std::time::Instant::now();
    let res = if ready {
        learner.maybe_train_in(stage, store.as_ref(), models.as_ref())
    } else {
        Ok(None) // conditioned, and no embedding yet
    };
    let took = t0.elapsed();
    let pruned = matches!(res, Ok(Some(_))).then(|| learner.prune(models.as_ref()));
    (learner, meta, checked, res, took, pruned)
}

impl TargetTrainer {
    /// Looks (`tick`) `after` from now, unless a look is scheduled by then already.
    fn look_in(&mut self, ctx: &mut Context<Self>, after: Duration) {
        let at = std::time::Instant::now() + after;
        if let Some((when, handle)) = self.next_look {
            if when <= at {
                return;
            }
            ctx.cancel_future(handle);
        }
        let handle = ctx.run_later(after, |act, ctx| {
            act.next_look = None;
            act.tick(ctx);
            let timed = act.recheck.timed_in(std::time::Instant::now());
            act.look_in(ctx, timed.max(act.poll));
        });
        self.next_look = Some((at, handle));
    }

    /// Something the next look acts on happened (an event, a round or a pass ended).
    fn look_soon(&mut self, ctx: &mut Context<Self>) {
        let poll = self.poll;
        self.look_in(ctx, poll);
    }

    /// The learner back from the blocking pool; the gauge of networks kept follows.
    fn put_back(&mut self, learner: Learner) {
        if let Some(n) = learner.networks_held() {
            self.metrics
                .networks_held
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.learner = Some(learner);
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.rollback.is_some() {
            self.roll_back(ctx);
            return;
        }
        if self.prune_due {
            self.prune(ctx);
            return;
        }
        if learner::RoundMode::of(self.stage).is_none() && self.meta.is_none() {
            return;
        }
        let stage = self.stage;
        if self.learner.is_none() {
            return; // a round is running
        }
        if !self.recheck.take(std::time::Instant::now()) {
            return; // nothing new since the last read
        }
        let Some(mut learner) = self.learner.take() else {
            return;
        };
        learner.set_retraining(self.retraining);
        let meta = self.meta.take();
        let (store, models) = (self.store.clone(), self.models.clone());
        let (workers, waiting) = (self.workers.clone(), self.metrics.rounds_waiting.clone());
        let fut = async move {
            // Counted while waiting, also when the actor stops meanwhile (the guard's drop).
            let queued = Waiting::new(waiting);
            // Closed never (the service owns it); without a permit the round runs anyway.
            let permit = workers.acquire_owned().await.ok();
            drop(queued);
            tokio::task::spawn_blocking(move || {
                let _permit = permit;
                round(store, models, learner, meta, stage)
            })
            .await
        };
        ctx.spawn(fut.into_actor(self).map(|joined, act, ctx| {
            act.look_soon(ctx);
            match joined {
                Ok((learner, meta, checked, res, took, pruned)) => {
                    act.recheck.done(std::time::Instant::now());
                    act.put_back(learner);
                    act.meta = meta;
                    if let Some(c) = checked {
                        act.finish_embedding(c);
                    }
                    act.finish_round(res, took);
                    if let Some(p) = pruned {
                        act.finish_prune(p);
                    }
                }
                Err(e) => {
                    // The round panicked: the learner is lost; start again from the model store.
                    act.recheck.notify();
                    act.metrics.round_errors.inc();
                    tracing::error!(target = %act.target, error = %e, "training round aborted");
                }
            }
        }));
    }

    /// Runs the pending rollback on the blocking pool (once no round runs).
    fn roll_back(&mut self, ctx: &mut Context<Self>) {
        let Some((to, at)) = self.rollback else {
            return;
        };
        let Some(mut learner) = self.learner.take() else {
            return; // a round is running: the next tick
        };
        self.rollback = None;
        learner.set_retraining(self.retraining);
        let models = self.models.clone();
        let fut = tokio::task::spawn_blocking(move || {
            let res = learner.roll_back(to, at, models.as_ref());
            let pruned = res.is_ok().then(|| learner.prune(models.as_ref()));
            (learner, res, pruned)
        });
        ctx.spawn(fut.into_actor(self).map(move |joined, act, ctx| {
            act.look_soon(ctx);
            match joined {
            Ok((learner, res, pruned)) => {
                act.put_back(learner);
                if let Some(p) = pruned {
                    act.finish_prune(p);
                }
                match res {
                    Ok(p) => {
                        act.metrics.rollbacks.inc();
                        tracing::info!(target = %act.target, to, version = p.version, trained_steps = p.trained_steps, "rolled back: republished the version in force at the retraining trigger");
                        act.publish(&p);
                    }
                    Err(e) => {
                        act.metrics.round_errors.inc();
                        tracing::warn!(target = %act.target, to, error = %e, "cannot roll back; the recommenders keep the newest version");
                    }
                }
            }
            Err(e) => {
                act.metrics.round_errors.inc();
                tracing::error!(target = %act.target, to, error = %e, "rollback aborted");
            }
            }
        }));
    }

    /// The retention pass due since the target went SERVING, on the blocking pool (once no
    /// round runs).
    fn prune(&mut self, ctx: &mut Context<Self>) {
        let Some(mut learner) = self.learner.take() else {
            return; // a round is running: the next tick
        };
        self.prune_due = false;
        learner.set_retraining(self.retraining);
        let models = self.models.clone();
        let serving = self.stage == Stage::Serving;
        let fut = tokio::task::spawn_blocking(move || {
            let res = learner.prune(models.as_ref());
            // SERVING does not train: nothing of the network stays in memory.
            if serving {
                learner.release_network();
            }
            (learner, res)
        });
        ctx.spawn(fut.into_actor(self).map(|joined, act, ctx| {
            act.look_soon(ctx);
            match joined {
                Ok((learner, res)) => {
                    act.put_back(learner);
                    act.finish_prune(res);
                }
                Err(e) => {
                    act.metrics.prune_errors.inc();
                    tracing::error!(target = %act.target, error = %e, "retention pass aborted");
                }
            }
        }));
    }

    fn finish_prune(&mut self, res: Result<usize, learner::TrainerError>) {
        match res {
            Ok(0) => {}
            Ok(n) => {
                self.metrics.models_pruned.inc_by(n as u64);
                tracing::debug!(target = %self.target, deleted = n, "deleted old base-learner versions");
            }
            Err(e) => {
                self.metrics.prune_errors.inc();
                tracing::warn!(target = %self.target, error = %e, "cannot delete old base-learner versions; they stay");
            }
        }
    }

    /// Announces a checkpoint written to the model store.
    fn publish(&self, p: &learner::Published) {
        let est = p.estimate;
        let ts_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        self.outbox.send(Model {
            schema: Schema::new(),
            target: self.target.clone(),
            episode: p.latest.0,
            step: p.latest.1,
            ts_ms,
            kind: ModelKind::BaseLearner,
            version: p.version,
            uri: p.object.uri.clone(),
            sha256: p.object.sha256.clone(),
            size_bytes: p.object.size_bytes,
            trained_steps: p.trained_steps,
            policy_estimate: est.map(|e| e.estimate).filter(|x| x.is_finite()),
            behaviour_reward: est.map(|e| e.behaviour_reward).filter(|x| x.is_finite()),
        });
    }

    fn finish_embedding(&mut self, c: Checked) {
        if let Some(e) = c.error {
            self.metrics.embedding_errors.inc();
            if c.disabled {
                tracing::error!(target = %self.target, error = %e, "cannot compute the embedding; the target trains without meta-learning");
            } else {
                tracing::warn!(target = %self.target, error = %e, "cannot compute the embedding; keeping the previous one");
            }
        }
        if let Some(m) = c.published {
            self.metrics.embeddings.inc();
            tracing::info!(target = %self.target, model_version = m.model_version, episodes_used = m.episodes_used, episode = m.episode, dim = m.embedding.len(), "published embedding");
            self.outbox.send(m);
        }
    }

    fn finish_round(
        &mut self,
        res: Result<Option<learner::Published>, TrainerError>,
        took: Duration,
    ) {
        match res {
            Ok(None) => {}
            Ok(Some(p)) => {
                self.metrics.rounds.inc();
                self.metrics.gradient_steps.inc_by(p.steps as u64);
                self.metrics.non_finite_rows.inc_by(p.non_finite as u64);
                self.metrics.round_seconds.observe(took.as_secs_f64());
                let est = p.estimate;
                tracing::info!(target = %self.target, mode = p.mode.label(), version = p.version, trained_steps = p.trained_steps, steps = p.steps, critic_loss = p.critic_loss, bc_weight = p.bc_weight, skipped = p.skipped, policy_estimate = ?est.map(|e| e.estimate), behaviour_reward = ?est.map(|e| e.behaviour_reward), direct_estimate = ?est.map(|e| e.direct), action_gap = ?est.map(|e| e.action_gap), eval_rows = ?est.map(|e| e.rows), size_bytes = p.object.size_bytes, took_ms = took.as_millis() as u64, "published base-learner");
                self.publish(&p);
            }
            Err(learner::TrainerError::Cancelled { .. }) => {
                tracing::debug!(target = %self.target, "training round cancelled at shutdown");
            }
            Err(e) => {
                // Tried again at the next looks, after the learner's back-off.
                self.recheck.notify();
                self.metrics.round_errors.inc();
                tracing::warn!(target = %self.target, error = %e, "training round failed");
            }
        }
    }
}

impl Actor for TargetTrainer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.look_soon(ctx);
    }
}

impl Handler<Retire> for TargetTrainer {
    type Result = ();

    fn handle(&mut self, _: Retire, ctx: &mut Self::Context) {
        tracing::info!(target = %self.target, "target forgotten: its trainer stops");
        self.cancel.cancel();
        ctx.stop();
    }
}

impl Handler<Deliver> for TargetTrainer {
    type Result = ();

    fn handle(&mut self, Deliver(ev): Deliver, ctx: &mut Self::Context) {
        let l = match ev {
            Event::Lifecycle(l) => l,
            Event::Episode(_) => {
                self.recheck.notify();
                self.look_soon(ctx);
                return;
            }
            _ => return,
        };
        self.recheck.notify();
        self.look_soon(ctx);
        self.stage = l.stage;
        self.retraining = l.retraining(self.retraining);
        self.prune_due |= l.stage == Stage::Serving;
        if let Some(to) = l.rollback_to {
            tracing::info!(target = %self.target, to, reason = %l.reason, "rollback requested");
            self.rollback = Some((to, (l.episode, l.step)));
        }
        // The paper's top-M bundle (M = 20) is what the meta-learner will read. Counting may
        // walk the store's rows (QuestDB, every target's for the gauge: seconds at the retention
        // bound with many targets; SQLite sums per-episode counts), so it runs on the blocking
        // pool, never on the actor's thread, and one whole-store count at a time.
        let (store, target, metrics) = (
            self.store.clone(),
            self.target.clone(),
            self.metrics.clone(),
        );
        let (stage, retraining) = (l.stage, self.retraining);
        tokio::task::spawn_blocking(move || {
            match training_data(store.as_ref(), &target, 20) {
                Ok(d) => {
                    tracing::info!(target = %target, stage = %stage, retraining, transitions = d.transitions, episodes = d.episodes, best = ?d.best_episode_reward, "training data at stage change");
                }
                Err(e) => {
                    tracing::warn!(target = %target, error = %e, "cannot read the trajectory store");
                    return;
                }
            }
            if metrics.counting_all.swap(true, Ordering::AcqRel) {
                return; // another target's count is running
            }
            if let Ok(all) = store.count_all() {
                metrics
                    .transitions
                    .set(i64::try_from(all).unwrap_or(i64::MAX));
            }
            metrics.counting_all.store(false, Ordering::Release);
        });
    }
}

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    // The store the recorder writes.
    let cfg: StoreConfig = ctx.config.section("trajectory_store")?;
    let trainer: TrainerConfig = ctx.config.section("trainer")?;
    trainer.validate().map_err(|e| match e {
        TrainerError::Config { key, reason } => ServiceError::Config(ConfigError::Invalid {
            key: format!("trainer.{key}"),
            reason,
        }),
        other => ServiceError::resource("trainer", other),
    })?;
    let store_cfg: ModelStoreConfig = ctx.config.section("model_store")?;
    let models = open_model_store(&store_cfg, &ctx.bus, &ctx.config.bus)
        .await
        .map_err(|e| ServiceError::resource("model_store", e))?;
    let store = open_store(&cfg, "trajectory_store")
        .map_err(|e| ServiceError::resource("trajectory store", e))?;
    let forget_models = models.clone();
    let forget_after = Duration::from_secs(trainer.forget_after_secs);
    let metrics = TrainerMetrics::new(&ctx.metrics)?;
    let forget_metrics = metrics.forget.clone();
    let (outbox, publisher) = spawn_publisher(ctx.clone());
    let assets = load_assets(&trainer, &metrics, &ctx.config.learning);
    let config = ctx.config.clone();
    let poll = Duration::from_millis(trainer.poll_ms);
    let recheck = Duration::from_millis(trainer.recheck_ms);
    let shutdown = ctx.shutdown.clone();
    let workers = match trainer.workers {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    tracing::info!(workers, "training rounds run this many at once");
    let workers = Arc::new(tokio::sync::Semaphore::new(workers));
    let budget = learner::NetworkBudget::new(trainer.held_networks);
    let mut actors = TargetActors::spread(&ctx, move |t: &Target| {
        let spec = config.spec_for(t);
        let bounds = spec.bounds;
        let cancel = shutdown.child_token();
        TargetTrainer {
            target: t.clone(),
            store: store.clone(),
            models: models.clone(),
            poll,
            recheck: Recheck::new(recheck),
            next_look: None,
            stage: Stage::Initialized,
            retraining: false,
            rollback: None,
            prune_due: false,
            workers: workers.clone(),
            learner: Some({
                let mut l = Learner::new(t.clone(), bounds, trainer.clone());
                l.set_objective(config.learning.objective, spec.slo);
                l.set_state_width(aware_mdp::state_width(config.learning.mean_field));
                l.set_cancel(cancel.clone());
                l.set_corrupt_counter(metrics.corrupt_checkpoints.clone());
                l.set_budget(budget.clone());
                l.set_reload_counter(metrics.network_reloads.clone());
                l
            }),
            meta: assets.as_ref().map(|a| {
                TargetMeta::new(
                    t.clone(),
                    bounds,
                    a.clone(),
                    trainer.embedding_refresh_episodes,
                )
            }),
            outbox: outbox.clone(),
            metrics: metrics.clone(),
            cancel,
        }
    });
    let (retire_tx, retire) = tokio::sync::mpsc::unbounded_channel();
    let forget_task = if forget_after.is_zero() {
        None
    } else {
        let registrations = ctx.subscribe_events(&[EventKind::Target]).await?;
        Some(tokio::spawn(aware_shared::forget::run(
            ctx.clone(),
            Arc::new(ModelForgetting(forget_models)),
            forget_after,
            registrations,
            forget_metrics,
            |_: &Registration| {},
            move |t: &Target| {
                let _ = retire_tx.send(t.clone());
            },
        )))
    };
    run_actors_retiring(&ctx, CONSUMES, &mut actors, retire).await?;
    drop(actors);
    if let Some(task) = forget_task {
        task.await.map_err(|source| ServiceError::Task {
            task: "forget",
            source,
        })?;
    }
    aware_shared::agents::join_publisher(publisher).await
}

/// The meta dir's networks, or `None` (meta-learning off: no `meta_dir`, or it cannot be loaded;
/// the latter is logged and counted, and the service trains without meta-learning).
pub fn load_assets(
    cfg: &TrainerConfig,
    metrics: &TrainerMetrics,
    learning: &aware_shared::config::LearningConfig,
) -> Option<Arc<MetaAssets>> {
    if cfg.meta_dir.is_empty() {
        return None;
    }
    let width = aware_mdp::state_width(learning.mean_field);
    match embedding::load_meta_dir(std::path::Path::new(&cfg.meta_dir), width) {
        Ok(a) => {
            tracing::info!(meta_dir = %cfg.meta_dir, meta_version = a.version, embed_dim = a.embed_dim(), base_inputs = a.base.config().state_dim, "meta-learning on");
            Some(Arc::new(a))
        }
        Err(e) => {
            metrics.embedding_errors.inc();
            tracing::error!(meta_dir = %cfg.meta_dir, error = %e, "cannot load the meta-learner; training without meta-learning");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_stores::trajectory::{EpisodeSummary, SqliteStore};

    /// Marks are objects next to the checkpoints; forgetting deletes every object of the target
    /// (mark last) and nothing of another target, also not of one whose name extends it.
    #[test]
    fn model_forgetting_marks_and_deletes_one_targets_objects() {
        use aware_shared::model_store::{model_key, LocalDirStore};
        let dir = tempfile::tempdir().unwrap();
        let models: Arc<dyn ModelStore> = Arc::new(LocalDirStore::open(dir.path()).unwrap());
        let f = ModelForgetting(models.clone());
        let (a, a2, b) = (
            Target::new("ns", "a"),
            Target::new("ns", "a-2"),
            Target::new("other", "b"),
        );
        for t in [&a, &a2, &b] {
            for v in 1..=3 {
                models
                    .put(&model_key(t, "base_learner", v), b"ckpt")
                    .unwrap();
            }
        }
        assert!(f.marks().unwrap().is_empty());
        f.mark(&a, Some(1_000)).unwrap();
        f.mark(&b, Some(2_000)).unwrap();
        f.mark(&a, Some(3_000)).unwrap();
        assert_eq!(
            f.marks().unwrap(),
            vec![(a.clone(), 3_000), (b.clone(), 2_000)],
            "a later mark replaces an earlier one"
        );
        f.mark(&b, None).unwrap();
        f.mark(&b, None).unwrap();
        assert_eq!(f.marks().unwrap(), vec![(a.clone(), 3_000)]);
        assert_eq!(f.forget(&a).unwrap(), 3, "a's three versions");
        assert!(f.marks().unwrap().is_empty(), "the mark goes last");
        let left = models.keys("").unwrap();
        assert_eq!(left.len(), 6, "{left:?}");
        assert!(left.iter().all(|k| !k.starts_with("ns/a/")), "{left:?}");
        assert_eq!(f.forget(&a).unwrap(), 0, "forgetting again");
        // A mark that is not a time is an error naming the key, not a silent skip.
        models.put(&mark_key(&b), b"yesterday").unwrap();
        let e = f.marks().unwrap_err().to_string();
        assert!(e.contains("other/b/deregistered"), "{e}");
    }

    /// The store is read at once, then only after an event or once the last read is old.
    #[test]
    fn the_store_is_read_after_an_event_or_a_recheck_interval() {
        let t0 = std::time::Instant::now();
        let every = Duration::from_secs(30);
        let mut r = Recheck::new(every);
        assert!(r.take(t0), "the first look reads");
        assert!(!r.take(t0 + Duration::from_millis(500)), "nothing new");
        assert!(!r.take(t0 + Duration::from_secs(29)));
        r.notify();
        assert!(
            r.take(t0 + Duration::from_secs(29)),
            "an episode was stored"
        );
        assert!(
            !r.take(t0 + Duration::from_secs(30)),
            "counted from the last read"
        );
        assert!(r.take(t0 + Duration::from_secs(59)), "the recheck interval");
        assert!(!r.take(t0 + Duration::from_secs(60)));
        // The read at 59 s waited 4 s for a worker: the next timed read counts from its end.
        r.done(t0 + Duration::from_secs(63));
        assert!(!r.take(t0 + Duration::from_secs(90)));
        assert!(
            r.take(t0 + Duration::from_secs(93)),
            "30 s after the round ended"
        );
    }

    /// An idle actor's next look is its timed read, not the next `poll_ms`.
    #[test]
    fn the_next_timed_read_is_due_a_recheck_interval_after_the_last() {
        let t0 = std::time::Instant::now();
        let every = Duration::from_secs(30);
        let mut r = Recheck::new(every);
        assert_eq!(r.timed_in(t0), Duration::ZERO, "nothing read yet");
        assert!(r.take(t0));
        assert_eq!(
            r.timed_in(t0 + Duration::from_secs(10)),
            Duration::from_secs(20)
        );
        // Passed without a read (no stage that trains): the next one interval on.
        assert_eq!(r.timed_in(t0 + Duration::from_secs(30)), every);
        assert_eq!(r.timed_in(t0 + Duration::from_secs(45)), every);
        r.done(t0 + Duration::from_secs(40));
        assert_eq!(
            r.timed_in(t0 + Duration::from_secs(45)),
            Duration::from_secs(25)
        );
    }

    #[test]
    fn reads_counts_and_the_best_episode() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_path(dir.path().join("t.db")).unwrap();
        let t = Target::new("shop", "cart");
        assert_eq!(
            training_data(&store, &t, 20).unwrap(),
            TrainingData {
                transitions: 0,
                episodes: 0,
                best_episode_reward: None
            }
        );
        let Some(Event::Episode(e)) = aware_bus_schemas::generated::samples()
            .into_iter()
            .find(|e| e.kind() == EventKind::Episode)
        else {
            unreachable!()
        };
        for (n, r) in [(1u64, 10.0), (2, 30.0), (3, 20.0)] {
            let mut s = EpisodeSummary::from(&e);
            s.target = t.clone();
            s.episode = n;
            s.total_reward = r;
            store.put_episode(&s).unwrap();
        }
        let d = training_data(&store, &t, 2).unwrap();
        assert_eq!(d.episodes, 2);
        assert_eq!(d.best_episode_reward, Some(30.0));
    }
}
