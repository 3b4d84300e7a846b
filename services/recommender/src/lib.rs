//! recommender: one actix actor per owned target picks the action of every step and publishes
//! `action`.
//!
//! The policy behind an actor follows the target's lifecycle stage, which arrives as a message
//! (no restart): the HPA/VPA fallback ([`fallback`]) acts while OFFLINE, and whenever the RL path
//! cannot (no model loaded yet, a NaN state, …) with the reason in `fallback_reason`. The
//! fallback sees every step, so its histograms are warm whenever it has to take over. Targets are
//! sharded across instances by stable hash (`--shard i/N`).
//!
//! The RL path ([`rl`]): on a `model` for its target the actor reads the checkpoint from the model
//! store (`[model_store]`), verifies it and swaps it in between two messages, so the next
//! decision uses the new weights; a failed load keeps the previous weights (or the fallback) and
//! counts `recommender_model_load_errors_total`. ONLINE acts with exploration noise, SERVING
//! without noise and with the state normalizer frozen (same state, same action).

pub mod fallback;
pub mod reach;
pub mod rl;

use std::sync::Arc;

use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, WrapFuture};
use aware_bus_schemas::{
    Action, DecisionSource, Event, EventKind, Obs, Resources, Schema, Stage, Target,
};
use aware_shared::agents::{run_actors, spawn_publisher, Deliver, Outbox, Retire, TargetActors};
use aware_shared::config::{stable_hash, ConfigError};
use aware_shared::launcher::ServiceEntry;
use aware_shared::model_store::{open_model_store, ModelStore, ModelStoreConfig};
use aware_shared::registry::{log_change, Change, Registered};
use aware_shared::service::{ServiceContext, ServiceError};
use aware_shared::spec::TargetSpec;
use aware_shared::telemetry::{ServiceMetrics, TelemetryError};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::fallback::{Fallback, FallbackConfig};
use crate::reach::{ReachConfig, SloReach, Transition};
use crate::rl::{load_policy, rl_decide, FallbackReason, RlPolicy};

pub const NAME: &str = "recommender";
pub const CONSUMES: &[EventKind] = &[
    EventKind::Obs,
    EventKind::Lifecycle,
    EventKind::Embedding,
    EventKind::Model,
    EventKind::Target,
];
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
    notice: None,
    sharded: true,
};

/// What the recommender knows about one target.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentState {
    pub target: Target,
    pub stage: Stage,
    pub model_version: Option<u64>,
    pub embedding_len: usize,
    pub last_obs: Option<(u64, u32)>,
    /// ONLINE entered from SERVING (Algorithm 1's retraining trigger) and still ONLINE.
    pub retraining: bool,
}

impl AgentState {
    pub fn new(target: Target) -> Self {
        AgentState {
            target,
            stage: Stage::Initialized,
            model_version: None,
            embedding_len: 0,
            last_obs: None,
            retraining: false,
        }
    }

    /// Folds one event into the state; `false` for a `lifecycle` refused as no move the
    /// lifecycle monitor makes (see [`lifecycle_move_allowed`]), which changes nothing.
    pub fn apply(&mut self, ev: &Event) -> bool {
        match ev {
            Event::Lifecycle(l) => {
                if !lifecycle_move_allowed(self.stage, l.previous, l.stage) {
                    return false;
                }
                self.retraining = l.retraining(self.retraining);
                self.stage = l.stage;
            }
            Event::Model(m) => {
                self.model_version =
                    Some(self.model_version.map_or(m.version, |v| v.max(m.version)))
            }
            Event::Embedding(e) => self.embedding_len = e.embedding.len(),
            Event::Obs(o) => self.last_obs = Some((o.episode, o.step)),
            _ => {}
        }
        true
    }
}

/// Whether a `lifecycle` announcing `to` (after `previous`) is a move the lifecycle monitor makes
/// from the stage `at` this agent knows: any stage while it knows none yet (the first message,
/// possibly the capture's restored stage), a fresh start (`previous` none or INITIALIZED: a
/// monitor that lost its state announces OFFLINE or ONLINE again), or one of Algorithm 1's
/// moves (OFFLINE → ONLINE, ONLINE → OFFLINE or SERVING, SERVING → ONLINE; SERVING → OFFLINE,
/// the error-budget guard's return to the fallback) and announcements of the same stage. Anything else — a SERVING for a target this agent knows OFFLINE, say — did
/// not come from the monitor (forged, with the bus's permissions off) and would switch the target
/// to a policy the monitor never promoted.
pub fn lifecycle_move_allowed(at: Stage, previous: Option<Stage>, to: Stage) -> bool {
    use Stage::{Initialized, Offline, Online, Serving};
    if at == Initialized || at == to {
        return true;
    }
    if matches!(previous, None | Some(Initialized)) {
        return matches!(to, Offline | Online);
    }
    matches!(
        (at, to),
        (Offline, Online)
            | (Online, Offline)
            | (Online, Serving)
            | (Serving, Online)
            | (Serving, Offline)
    )
}

/// The `[recommender]` configuration section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecommenderConfig {
    pub fallback: FallbackConfig,
    /// Seed of the exploration noise (mixed with a stable hash of each target).
    pub seed: u64,
    /// Evaluation episodes while ONLINE: every episode whose number is k − 1 modulo k acts
    /// without exploration noise (the weights still train on it), so the lifecycle monitor can
    /// judge the policy rather than the policy plus its noise
    /// (`lifecycle_monitor.online_noise_free_only`). 0: off, every ONLINE episode explores.
    /// Default 2: every other ONLINE episode.
    pub eval_every_episodes: u32,
    /// While a target retrains (ONLINE entered from SERVING: Algorithm 1's trigger), its
    /// exploration noise is the checkpoint's scaled by this: a converged policy adapting to a
    /// changed workload needs less exploration than one learning from scratch. 1: the
    /// checkpoint's σ; 0: no exploration while retraining. Default 0.5 (σ 0.2 → 0.1;
    /// docs/adr/0006-retraining-defaults.md).
    pub retrain_noise_scale: f32,
    /// How an SLO that cannot be met within the bounds is recognised (`crate::reach`).
    pub slo_unreachable: ReachConfig,
    /// The RL policy never requests less memory per replica than the VPA's lower bound (the
    /// fallback's VPA sees every step): below it upstream's updater evicts a pod as
    /// under-provisioned, and an OOM kill restarts the container and drops its requests in
    /// flight, which no later step undoes. The policy's raw action is rewritten to the
    /// allocation sent, so the trainer learns from what ran. Default on.
    pub memory_floor: bool,
    /// When a target returns to the fallback from ONLINE or SERVING, for up to this many steps
    /// the fallback asks for at least (per dimension) the last allocation it decided while it
    /// drove, until that is in force: the policy may hand back pods it starved into a crash
    /// loop, which report no CPU, so the HPA alone would scale them down and never up again.
    /// 0: off. Default 12.
    pub handback_restore_steps: u32,
    /// The capacity shield (docs/adr/0029-capacity-shield.md): for this many steps after an
    /// observed SLO violation, the RL policy's replicas and CPU per replica are raised to at
    /// least the fallback's recommendation of the step (the target's tuned HPA), and its raw
    /// action rewritten to what is sent. Within the SLO the policy trades capacity freely; once
    /// it misses, it cannot stay below what the rule-based autoscaler would run. Unset (the
    /// default): the error budget's window, the steps over which the target's objective allows
    /// one violation (⌈1 / (1 − objective)⌉, 100 at 0.99). 0: off.
    pub capacity_shield_steps: Option<u32>,
}

impl Default for RecommenderConfig {
    fn default() -> Self {
        RecommenderConfig {
            fallback: FallbackConfig::default(),
            seed: 0,
            eval_every_episodes: 2,
            retrain_noise_scale: 0.5,
            slo_unreachable: ReachConfig::default(),
            memory_floor: true,
            handback_restore_steps: 12,
            capacity_shield_steps: None,
        }
    }
}

impl RecommenderConfig {
    pub fn validate(&self) -> Result<(), ServiceError> {
        if self.eval_every_episodes == 1 {
            return Err(ServiceError::Config(ConfigError::Invalid {
                key: "recommender.eval_every_episodes".into(),
                reason: "must be 0 (off) or at least 2 (1 would never explore)".into(),
            }));
        }
        if !(self.retrain_noise_scale.is_finite() && self.retrain_noise_scale >= 0.0) {
            return Err(ServiceError::Config(ConfigError::Invalid {
                key: "recommender.retrain_noise_scale".into(),
                reason: format!("must be finite and >= 0, got {}", self.retrain_noise_scale),
            }));
        }
        if let Some((key, reason)) = self.slo_unreachable.problem() {
            return Err(ServiceError::Config(ConfigError::Invalid {
                key: format!("recommender.slo_unreachable.{key}"),
                reason,
            }));
        }
        Ok(())
    }
}

/// `recommender.eval_every_episodes` = `k`: whether ONLINE `episode` acts without exploration
/// noise (its number is k − 1 modulo k; never with k = 0).
pub fn is_eval_episode(episode: u64, k: u32) -> bool {
    let k = u64::from(k);
    k > 0 && episode % k == k - 1
}

/// Whether the limits of an `obs` are positive finite numbers, i.e. [`current_allocation`] reads
/// the allocation in force rather than zeros.
pub fn allocation_known(m: &aware_bus_schemas::RawMetrics) -> bool {
    aware_shared::spec::allocation_in_force(m).is_some()
}

/// The allocation in force, read from an `obs` (limits rounded to millicores and bytes).
pub fn current_allocation(o: &Obs) -> Resources {
    let m = &o.metrics;
    let finite = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
    Resources {
        replicas: m.replicas_in_force(),
        cpu_millicores: (finite(m.cpu_limit_cores) * 1000.0).round() as u32,
        memory_bytes: finite(m.memory_limit_bytes).round() as u64,
    }
}

/// The recommender's own metrics.
#[derive(Clone)]
pub struct RecommenderMetrics {
    /// Time to decide one action (from the `obs` reaching the actor to the `action` queued).
    pub decision_seconds: prometheus::Histogram,
    pub incomplete_steps: prometheus::IntCounter,
    /// `model` messages whose weights could not be loaded.
    pub model_load_errors: prometheus::IntCounter,
    /// Weights loaded and swapped in.
    pub models_loaded: prometheus::IntCounter,
    /// Steps where the fallback acted although the stage is RL-driven, by reason.
    pub rl_fallbacks: prometheus::IntCounterVec,
    /// The service's `registrations_total` (shared telemetry).
    pub registrations: prometheus::IntCounterVec,
    /// `lifecycle` messages refused as no move the lifecycle monitor makes.
    pub lifecycle_refused: prometheus::IntCounter,
    /// RL actions whose memory was raised to the VPA's lower bound (`memory_floor`).
    pub memory_floor: prometheus::IntCounter,
    /// RL actions whose replicas or CPU were raised to the fallback's (`capacity_shield_steps`).
    pub capacity_shield: prometheus::IntCounter,
    /// Fallback actions raised to the fallback's own last allocation after a hand-back
    /// (`handback_restore_steps`).
    pub handback_restores: prometheus::IntCounter,
}

/// Bucket bounds of `decision_seconds`: 1 µs … 50 ms.
pub const DECISION_BUCKETS: [f64; 16] = [
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1,
];

impl RecommenderMetrics {
    /// The metrics of an instance, in the service's registry.
    pub fn new(m: &ServiceMetrics) -> Result<Self, TelemetryError> {
        Ok(RecommenderMetrics {
            decision_seconds: m.histogram(
                "recommender_decision_seconds",
                "Time to decide one action, from the obs reaching the target's actor",
                DECISION_BUCKETS.to_vec(),
            )?,
            incomplete_steps: m.counter(
                "recommender_incomplete_steps_total",
                "Steps with missing or stale metrics (no action taken)",
            )?,
            model_load_errors: m.counter(
                "recommender_model_load_errors_total",
                "model messages whose weights could not be loaded (missing, corrupt, wrong checksum)",
            )?,
            models_loaded: m.counter(
                "recommender_models_loaded_total",
                "Base-learner weights loaded and swapped in",
            )?,
            rl_fallbacks: m.counter_vec(
                "recommender_rl_fallbacks_total",
                "Steps where the fallback acted although the stage is ONLINE or SERVING",
                &["reason"],
                &FallbackReason::ALL.map(|r| [r.label()]),
            )?,
            registrations: m.registrations.clone(),
            lifecycle_refused: m.counter(
                "recommender_lifecycle_refused_total",
                "lifecycle messages refused as no move the lifecycle monitor makes (e.g. SERVING for a target known OFFLINE)",
            )?,
            capacity_shield: m.counter(
                "recommender_capacity_shield_total",
                "RL actions whose replicas or CPU were raised to the fallback's after an SLO violation (recommender.capacity_shield_steps)",
            )?,
            memory_floor: m.counter(
                "recommender_memory_floor_total",
                "RL actions whose memory request was raised to the VPA's lower bound (recommender.memory_floor)",
            )?,
            handback_restores: m.counter(
                "recommender_handback_restores_total",
                "Fallback actions raised to the fallback's own last allocation after the RL policy handed the target back (recommender.handback_restore_steps)",
            )?,
        })
    }
}

/// The decisions of one target: fallback, RL policy and the state they follow. Separate from
/// the actor so it can be driven without a bus.
pub struct Decider {
    pub state: AgentState,
    spec: TargetSpec,
    fallback: Fallback,
    models: Arc<dyn ModelStore>,
    policy: Option<RlPolicy>,
    /// The latest `embedding` of the target (fed to a conditioned policy).
    embedding: Option<Vec<f32>>,
    rng: ChaCha8Rng,
    metrics: RecommenderMetrics,
    /// Registration by the controller (`target/1`): a deregistered target gets no action.
    registered: Registered,
    /// `recommender.eval_every_episodes` (0: off).
    eval_every: u32,
    /// `recommender.retrain_noise_scale`.
    retrain_noise_scale: f32,
    /// Whether the SLO can be met within the bounds.
    reach: SloReach,
    /// `recommender.memory_floor`.
    memory_floor: bool,
    /// `recommender.capacity_shield_steps` (`None`: the budget's window), and the steps the
    /// shield still holds (set on an observed violation).
    shield_steps: Option<u32>,
    shield_left: u32,
    /// The HPA target utilization of `recommender.fallback`, for a target whose spec sets none.
    default_hpa_target: f64,
    /// The last allocation the fallback decided while it drove (INITIALIZED or OFFLINE).
    fallback_last: Option<Resources>,
    /// After a hand-back: the allocation restored and the steps the restore may still take.
    restore: Option<(Resources, u32)>,
    /// `recommender.handback_restore_steps`.
    handback_restore_steps: u32,
    /// (episode, step) of the last obs decided.
    last_decided: Option<(u64, u32)>,
}

impl Decider {
    pub fn new(
        spec: TargetSpec,
        fallback: Fallback,
        models: Arc<dyn ModelStore>,
        seed: u64,
        metrics: RecommenderMetrics,
    ) -> Self {
        let target = spec.target();
        let rng = ChaCha8Rng::seed_from_u64(seed ^ stable_hash(&target.key()));
        let default_hpa_target = fallback.hpa().config().target_cpu_utilization;
        let mut decider = Decider {
            state: AgentState::new(target),
            spec,
            fallback,
            models,
            policy: None,
            embedding: None,
            rng,
            metrics,
            registered: Registered::default(),
            eval_every: 0,
            retrain_noise_scale: 1.0,
            reach: SloReach::new(ReachConfig::default()),
            memory_floor: true,
            shield_steps: None,
            shield_left: 0,
            default_hpa_target,
            fallback_last: None,
            restore: None,
            handback_restore_steps: 0,
            last_decided: None,
        };
        decider.apply_fallback_override();
        decider
    }

    /// Sets the fallback's HPA target to the spec's override (the configured one without),
    /// in place: the HPA's stabilization history and the VPA's histograms stay, so a registration
    /// changing the target does not make the fallback forget the workload.
    fn apply_fallback_override(&mut self) {
        let want = self
            .spec
            .fallback
            .hpa_target_cpu_utilization
            .unwrap_or(self.default_hpa_target);
        let was = self.fallback.hpa().config().target_cpu_utilization;
        if want == was {
            return;
        }
        match self.fallback.set_hpa_target_cpu_utilization(want) {
            Ok(()) => {
                tracing::info!(target = %self.state.target, from = was, to = want, overridden = self.spec.fallback.hpa_target_cpu_utilization.is_some(), "fallback HPA target utilization set");
            }
            // Registrations and `[[targets]]` are checked before they get here; a spec built
            // otherwise with an unusable value keeps the target the HPA had.
            Err(e) => {
                tracing::warn!(target = %self.state.target, requested = want, kept = was, error = %e, "fallback HPA target utilization refused");
            }
        }
    }

    /// How an unreachable SLO is recognised (`recommender.slo_unreachable`).
    pub fn set_reach(&mut self, config: ReachConfig) {
        self.reach = SloReach::new(config);
    }

    /// `recommender.memory_floor`: the RL policy's memory never below the VPA's lower bound.
    pub fn set_memory_floor(&mut self, on: bool) {
        self.memory_floor = on;
    }

    /// `recommender.capacity_shield_steps` (`None`: the error budget's window; 0: off).
    pub fn set_capacity_shield_steps(&mut self, steps: Option<u32>) {
        self.shield_steps = steps;
    }

    /// `recommender.handback_restore_steps` (0: off).
    pub fn set_handback_restore_steps(&mut self, steps: u32) {
        self.handback_restore_steps = steps;
    }

    /// Every `k`-th ONLINE episode (episode number k − 1 modulo k) acts without exploration
    /// noise (0: off).
    pub fn set_eval_every(&mut self, k: u32) {
        self.eval_every = k;
    }

    /// The exploration noise's scale while the target retrains (ONLINE entered from SERVING);
    /// 1: the checkpoint's σ.
    pub fn set_retrain_noise_scale(&mut self, scale: f32) {
        self.retrain_noise_scale = scale;
    }

    /// The spec in force (the configured one until the controller registers the target).
    pub fn spec(&self) -> &TargetSpec {
        &self.spec
    }

    /// Folds a registration in: a new spec applies from the next step; after a deregistration
    /// the target gets no action until it is registered again.
    fn on_registration(&mut self, r: &aware_bus_schemas::Registration) {
        let change = self.registered.apply(r);
        log_change(
            NAME,
            &self.metrics.registrations,
            &r.target,
            r.generation,
            &change,
        );
        if let Change::Registered { spec, .. } = change {
            self.spec = spec;
            self.apply_fallback_override();
        }
    }

    /// A hand-back (ONLINE or SERVING to OFFLINE) arms the restore of the fallback's last own
    /// allocation; any other move disarms it.
    fn on_stage_change(&mut self, before: Stage) {
        let handback =
            matches!(before, Stage::Online | Stage::Serving) && self.state.stage == Stage::Offline;
        self.restore = match self.fallback_last {
            Some(last) if handback && self.handback_restore_steps > 0 => {
                tracing::info!(target = %self.state.target, replicas = last.replicas, cpu_millicores = last.cpu_millicores, memory_bytes = last.memory_bytes, steps = self.handback_restore_steps, "hand-back: the fallback restores its last own allocation");
                Some((last, self.handback_restore_steps))
            }
            _ => None,
        };
    }

    /// The fallback's action while it drives: after a hand-back, raised (per dimension, within
    /// the bounds) to the fallback's last own allocation until that is in force or the restore's
    /// steps run out. Raising the replicas releases the HPA's held decision, so between its
    /// syncs it keeps what is in force instead of undoing the restore.
    fn fallback_drives(&mut self, action: &mut Action) {
        if let Some((last, left)) = self.restore {
            let (floor, _) = self.spec.bounds.clamp(last);
            let in_force = covers(action.current, floor);
            if in_force || left == 0 {
                tracing::info!(target = %self.state.target, in_force, "hand-back restore ended");
                self.restore = None;
            } else {
                let d = action.desired;
                let raised = Resources {
                    replicas: d.replicas.max(floor.replicas),
                    cpu_millicores: d.cpu_millicores.max(floor.cpu_millicores),
                    memory_bytes: d.memory_bytes.max(floor.memory_bytes),
                };
                if raised != d {
                    if raised.replicas != d.replicas {
                        self.fallback.release();
                    }
                    self.metrics.handback_restores.inc();
                    tracing::debug!(target = %self.state.target, episode = action.episode, step = action.step, rules_replicas = d.replicas, replicas = raised.replicas, cpu_millicores = raised.cpu_millicores, memory_bytes = raised.memory_bytes, "hand-back: the fallback's action raised to its last own allocation");
                    action.desired = raised;
                }
                self.restore = Some((last, left - 1));
            }
        }
        self.fallback_last = Some(action.desired);
    }

    /// The latest embedding received for the target.
    pub fn embedding(&self) -> Option<&[f32]> {
        self.embedding.as_deref()
    }

    /// Version of the weights in use.
    pub fn policy_version(&self) -> Option<u64> {
        self.policy.as_ref().map(|p| p.version)
    }

    /// Folds one event into the agent; returns the action for a complete `obs`.
    pub fn handle(&mut self, ev: &Event) -> Option<Action> {
        let before = self.state.stage;
        // The same step again is a repeat, never a new decision: a publisher that retries until
        // JetStream stores its message (`bus.jetstream.ack_publishes`) delivers each try.
        if let Event::Obs(o) = ev {
            if self.last_decided == Some((o.episode, o.step)) {
                tracing::debug!(target = %o.target, episode = o.episode, step = o.step, "repeated obs: already decided");
                return None;
            }
        }
        if !self.state.apply(ev) {
            self.metrics.lifecycle_refused.inc();
            if let Event::Lifecycle(l) = ev {
                tracing::warn!(target = %l.target, at = %before, previous = ?l.previous, to = %l.stage, "lifecycle refused: not a move the lifecycle monitor makes");
            }
            return None;
        }
        if self.state.stage != before {
            tracing::info!(target = %self.state.target, from = %before, to = %self.state.stage, retraining = self.state.retraining, "stage changed");
            self.on_stage_change(before);
        }
        match ev {
            Event::Model(m) => {
                self.on_model(m);
                None
            }
            Event::Registration(r) => {
                self.on_registration(r);
                None
            }
            Event::Embedding(e) => {
                tracing::debug!(target = %e.target, model_version = e.model_version, episodes_used = e.episodes_used, dim = e.embedding.len(), "embedding received");
                self.embedding = Some(e.embedding.clone());
                None
            }
            Event::Obs(o) if self.registered.is_deregistered() => {
                tracing::trace!(target = %o.target, step = o.step, "deregistered target: no action");
                None
            }
            Event::Obs(o) if !o.complete => {
                self.metrics.incomplete_steps.inc();
                tracing::debug!(target = %o.target, missing = ?o.missing, "incomplete step: no action");
                None
            }
            Event::Obs(o) if !allocation_known(&o.metrics) => {
                // A complete obs whose limits are not positive finite numbers would read as a
                // zero allocation: treated as incomplete, never acted on.
                self.metrics.incomplete_steps.inc();
                tracing::warn!(target = %o.target, cpu_limit_cores = o.metrics.cpu_limit_cores, memory_limit_bytes = o.metrics.memory_limit_bytes, "obs without a usable allocation: no action");
                None
            }
            Event::Obs(o) => {
                self.last_decided = Some((o.episode, o.step));
                Some(self.decide(o))
            }
            _ => None,
        }
    }

    /// Loads the weights a `model` announces and swaps them in; on failure keeps what it had.
    pub fn on_model(&mut self, m: &aware_bus_schemas::Model) {
        if self.wants_model(m) {
            let loaded = load_policy(self.models.as_ref(), m);
            self.install_model(m, loaded);
        }
    }

    /// Whether `m` is newer than the weights in use.
    pub fn wants_model(&self, m: &aware_bus_schemas::Model) -> bool {
        match self.policy_version() {
            Some(v) if m.version <= v => {
                tracing::debug!(target = %m.target, version = m.version, loaded = v, "older or same model version ignored");
                false
            }
            _ => true,
        }
    }

    /// Swaps in the weights loaded for `m`; on failure keeps what it had.
    pub fn install_model(
        &mut self,
        m: &aware_bus_schemas::Model,
        loaded: Result<RlPolicy, crate::rl::LoadError>,
    ) {
        match loaded {
            Ok(p) => {
                tracing::info!(target = %m.target, version = p.version, trained_steps = p.trained_steps, "model loaded");
                self.metrics.models_loaded.inc();
                self.policy = Some(p);
            }
            Err(e) => {
                self.metrics.model_load_errors.inc();
                tracing::warn!(target = %m.target, version = m.version, uri = %m.uri, error = %e, kept = ?self.policy_version(), "cannot load model; keeping the previous policy");
            }
        }
    }

    /// The action for one complete `obs`.
    pub fn decide(&mut self, o: &Obs) -> Action {
        let current = current_allocation(o);
        let now_s = o.ts_ms as f64 / 1000.0;
        // The fallback sees every step, so it is warm whenever it has to take over.
        let rec = self
            .fallback
            .recommend(now_s, &o.metrics, current, &self.spec.bounds);
        match self.reach.observe(
            &self.spec.slo,
            o.slo_violation,
            current,
            rec.unclamped,
            &self.spec.bounds,
        ) {
            Some(Transition::Unreachable(needed)) => {
                let b = &self.spec.bounds;
                tracing::warn!(target = %o.target, episode = o.episode, step = o.step, needed_replicas = needed.replicas, needed_cpu_millicores = needed.cpu_millicores, needed_memory_bytes = needed.memory_bytes, max_replicas = b.max_replicas, max_cpu_millicores = b.max_cpu_millicores, max_memory_bytes = b.max_memory_bytes, "SLO unreachable within the bounds");
            }
            Some(Transition::Reachable) => {
                tracing::info!(target = %o.target, episode = o.episode, step = o.step, "SLO reachable within the bounds again");
            }
            None => {}
        }
        let mut action = Action {
            schema: Schema::new(),
            target: o.target.clone(),
            episode: o.episode,
            step: o.step,
            ts_ms: o.ts_ms,
            source: DecisionSource::Fallback,
            stage: self.state.stage,
            raw: Vec::new(),
            current,
            desired: rec.desired,
            model_version: self.policy_version(),
            exploration: false,
            fallback_reason: None,
            slo_unreachable: self.reach.needed(),
            slo_judged: self.reach.decided(),
        };
        // The shield holds for `shield_steps` steps from each observed violation.
        self.shield_left = if o.slo_violation {
            self.shield_steps
                .unwrap_or_else(|| budget_window(self.spec.slo.objective()))
        } else {
            self.shield_left.saturating_sub(1)
        };
        let explore = match self.state.stage {
            Stage::Initialized | Stage::Offline => {
                tracing::trace!(target = %self.state.target, rules = %rec.rules.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "), "fallback decision");
                self.fallback_drives(&mut action);
                return action;
            }
            Stage::Online if is_eval_episode(o.episode, self.eval_every) => None,
            Stage::Online if self.state.retraining => Some(self.retrain_noise_scale),
            Stage::Online => Some(1.0),
            Stage::Serving => None,
        };
        let decided = match self.policy.as_mut() {
            None => Err(FallbackReason::NoModel),
            Some(p) => rl_decide(
                p,
                &o.state,
                self.embedding.as_deref(),
                current,
                &self.spec.bounds,
                explore,
                &mut self.rng,
            ),
        };
        match decided {
            Ok(mut d) => {
                // The policy set the allocation: the HPA's earlier decision no longer stands.
                self.fallback.release();
                if self.memory_floor {
                    if let Some(floor) = rec.vpa_estimate.map(|e| e.lower_bound.memory_bytes) {
                        if let Some((raw, desired)) =
                            raise_memory(d.raw, d.desired, floor, current, &self.spec.bounds)
                        {
                            self.metrics.memory_floor.inc();
                            tracing::debug!(target = %o.target, asked_bytes = d.desired.memory_bytes, floor_bytes = desired.memory_bytes, "memory raised to the VPA's lower bound");
                            d.raw = raw;
                            d.desired = desired;
                        }
                    }
                }
                if self.shield_left > 0 {
                    if let Some((raw, desired)) =
                        raise_capacity(d.raw, d.desired, rec.desired, current, &self.spec.bounds)
                    {
                        self.metrics.capacity_shield.inc();
                        tracing::debug!(target = %o.target, asked_replicas = d.desired.replicas, asked_cpu_millicores = d.desired.cpu_millicores, replicas = desired.replicas, cpu_millicores = desired.cpu_millicores, "capacity raised to the fallback's after an SLO violation");
                        d.raw = raw;
                        d.desired = desired;
                    }
                }
                action.source = DecisionSource::Rl;
                action.raw = d.raw.to_vec();
                action.desired = d.desired;
                action.exploration = d.exploration;
            }
            Err(reason) => {
                self.metrics
                    .rl_fallbacks
                    .with_label_values(&[reason.label()])
                    .inc();
                if reason != FallbackReason::NoModel {
                    tracing::warn!(target = %o.target, episode = o.episode, step = o.step, reason = reason.label(), "RL path failed; the fallback acts");
                }
                action.fallback_reason = Some(reason.describe().to_string());
            }
        }
        action
    }
}

/// Whether the allocation in force is at least `floor` in every dimension; CPU and memory within
/// 1% (they are read back as averages over the pods, rounded).
fn covers(current: Resources, floor: Resources) -> bool {
    current.replicas >= floor.replicas
        && f64::from(current.cpu_millicores) >= 0.99 * f64::from(floor.cpu_millicores)
        && current.memory_bytes as f64 >= 0.99 * floor.memory_bytes as f64
}

/// `desired` with its memory raised to `floor` (bytes per replica, rounded up to a MiB, within
/// the bounds) and the raw action that asks for it from `current`, when the policy asked for
/// less; `None` when it did not (or the floor is not a finite positive number).
pub fn raise_memory(
    raw: [f32; aware_mdp::ACTION_DIM],
    desired: Resources,
    floor: f64,
    current: Resources,
    bounds: &aware_shared::spec::Bounds,
) -> Option<([f32; aware_mdp::ACTION_DIM], Resources)> {
    if !(floor.is_finite() && floor > 0.0) {
        return None;
    }
    let mib = aware_mdp::MIB as f64;
    let floor = ((floor / mib).ceil() * mib).min(bounds.max_memory_bytes as f64) as u64;
    if desired.memory_bytes >= floor {
        return None;
    }
    let raised = Resources {
        memory_bytes: floor,
        ..desired
    };
    // Only the memory dimension changes: the others keep the policy's own values.
    Some(ask_for(raw, raised, 2..3, current, bounds))
}

/// `raw` with its dimensions `dims` rewritten to ask for `raised` from `current`
/// ([`aware_mdp::action_for`] under the default action map; the other dimensions keep the
/// policy's values), and the allocation it maps to: what a floor sends, so the trainer learns
/// from what ran.
fn ask_for(
    raw: [f32; aware_mdp::ACTION_DIM],
    raised: Resources,
    dims: std::ops::Range<usize>,
    current: Resources,
    bounds: &aware_shared::spec::Bounds,
) -> ([f32; aware_mdp::ACTION_DIM], Resources) {
    let asked = aware_mdp::action_for(raised, current, bounds, &aware_mdp::ActionMap::default());
    let mut raw = raw;
    raw[dims.clone()].copy_from_slice(&asked[dims]);
    (raw, crate::rl::map_raw(raw, current, bounds))
}

/// The steps over which an SLO objective's error budget allows one violation:
/// ⌈1 / (1 − objective)⌉ (100 at 0.99; 1 for an objective that is not a fraction below 1).
pub fn budget_window(objective: f64) -> u32 {
    // Less a rounding margin: 1 / (1 − 0.99) is 100.00000000000009 in floating point.
    let w = (1.0 / (1.0 - objective) - 1e-6).ceil();
    if aware_mdp::Slo::valid_objective(objective) && w.is_finite() {
        w.min(f64::from(u32::MAX)) as u32
    } else {
        1
    }
}

/// `desired` with its replicas and CPU per replica raised to at least `floor`'s (the
/// fallback's recommendation; within the bounds) and the raw action that asks for it from
/// `current` (replicas and CPU rewritten, memory kept), when the policy asked for less in
/// either; `None` when it did not.
pub fn raise_capacity(
    raw: [f32; aware_mdp::ACTION_DIM],
    desired: Resources,
    floor: Resources,
    current: Resources,
    bounds: &aware_shared::spec::Bounds,
) -> Option<([f32; aware_mdp::ACTION_DIM], Resources)> {
    let (floor, _) = bounds.clamp(floor);
    if desired.replicas >= floor.replicas && desired.cpu_millicores >= floor.cpu_millicores {
        return None;
    }
    let raised = Resources {
        replicas: desired.replicas.max(floor.replicas),
        cpu_millicores: desired.cpu_millicores.max(floor.cpu_millicores),
        ..desired
    };
    // Replicas and CPU change; memory keeps the policy's (or the memory floor's) value.
    Some(ask_for(raw, raised, 0..2, current, bounds))
}

/// The actor of one target.
pub struct Agent {
    decider: Decider,
    outbox: Outbox,
    metrics: RecommenderMetrics,
}

impl Actor for Agent {
    type Context = Context<Self>;
}

impl Handler<Retire> for Agent {
    type Result = ();

    /// Its target was deregistered `actors.retire_after_secs` ago: the policy's weights go.
    fn handle(&mut self, _: Retire, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<Deliver> for Agent {
    type Result = ();

    fn handle(&mut self, Deliver(ev): Deliver, ctx: &mut Self::Context) {
        // The model store may read over the network (JetStream): load on the blocking pool and
        // hold this actor's mailbox until the swap (the next message sees the new weights)
        // without blocking the arbiter's other actors.
        if let Event::Model(m) = &ev {
            if self.decider.wants_model(m) {
                let _ = self.decider.state.apply(&ev);
                let (models, m) = (self.decider.models.clone(), m.clone());
                let load = tokio::task::spawn_blocking(move || {
                    let loaded = load_policy(models.as_ref(), &m);
                    (m, loaded)
                });
                ctx.wait(load.into_actor(self).map(|joined, act, _| match joined {
                    Ok((m, loaded)) => act.decider.install_model(&m, loaded),
                    Err(e) => {
                        act.metrics.model_load_errors.inc();
                        tracing::error!(error = %e, "model load task failed");
                    }
                }));
                return;
            }
        }
        let t0 = std::time::Instant::now();
        if let Some(action) = self.decider.handle(&ev) {
            self.outbox.send(action);
            self.metrics
                .decision_seconds
                .observe(t0.elapsed().as_secs_f64());
        }
    }
}

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let cfg: RecommenderConfig = ctx.config.section("recommender")?;
    cfg.validate()?;
    // Validated once at start-up: a bad setting stops the service naming the key.
    let prototype = Fallback::new(cfg.fallback)
        .map_err(|e| ServiceError::resource("recommender.fallback", e))?;
    let store_cfg: ModelStoreConfig = ctx.config.section("model_store")?;
    let models = open_model_store(&store_cfg, &ctx.bus, &ctx.config.bus)
        .await
        .map_err(|e| ServiceError::resource("model_store", e))?;
    let metrics = RecommenderMetrics::new(&ctx.metrics)?;
    let (outbox, publisher) = spawn_publisher(ctx.clone());
    let specs = ctx.config.spec_index();
    let mut actors = TargetActors::spread(&ctx, move |t: &Target| {
        let spec = specs.spec_for(t);
        let mut decider = Decider::new(
            spec,
            prototype.clone(),
            models.clone(),
            cfg.seed,
            metrics.clone(),
        );
        decider.set_eval_every(cfg.eval_every_episodes);
        decider.set_retrain_noise_scale(cfg.retrain_noise_scale);
        decider.set_reach(cfg.slo_unreachable);
        decider.set_memory_floor(cfg.memory_floor);
        decider.set_capacity_shield_steps(cfg.capacity_shield_steps);
        decider.set_handback_restore_steps(cfg.handback_restore_steps);
        Agent {
            decider,
            outbox: outbox.clone(),
            metrics: metrics.clone(),
        }
    });
    run_actors(&ctx, CONSUMES, &mut actors).await?;
    drop(actors);
    aware_shared::agents::join_publisher(publisher).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memory floor raises only the memory the policy asked for, and only when it asked for
    /// less than the floor; the rewritten raw action maps to the raised allocation.
    #[test]
    fn the_memory_floor_raises_memory_only_and_rewrites_the_raw_action() {
        let b = aware_shared::spec::Bounds::default();
        let mib = aware_mdp::MIB;
        let current = Resources {
            replicas: 4,
            cpu_millicores: 500,
            memory_bytes: 1024 * mib,
        };
        let raw = [0.1, -0.2, -0.9];
        let asked = crate::rl::map_raw(raw, current, &b);
        assert!(asked.memory_bytes < 1024 * mib);
        let floor = 900.5 * mib as f64;
        let (raw2, raised) = raise_memory(raw, asked, floor, current, &b).unwrap();
        assert_eq!((raw2[0], raw2[1]), (raw[0], raw[1]));
        assert!(raw2[2] > raw[2]);
        assert_eq!(raised, crate::rl::map_raw(raw2, current, &b));
        assert_eq!(
            (raised.replicas, raised.cpu_millicores),
            (asked.replicas, asked.cpu_millicores)
        );
        // Rounded up to a MiB: 901 MiB.
        assert_eq!(raised.memory_bytes, 901 * mib);
        // Asked for at least the floor, or no usable floor: nothing changes.
        assert_eq!(
            raise_memory(raw, asked, 100.0 * mib as f64, current, &b),
            None
        );
        for bad in [f64::NAN, f64::INFINITY, 0.0, -1.0] {
            assert_eq!(raise_memory(raw, asked, bad, current, &b), None);
        }
        // Never above the bounds.
        let (_, top) = raise_memory(raw, asked, 1e18, current, &b).unwrap();
        assert!(top.memory_bytes <= b.max_memory_bytes);
    }
    use aware_bus_schemas::generated::samples;

    #[test]
    fn state_follows_lifecycle_model_and_obs() {
        let mut s = AgentState::new(Target::new("shop", "checkout"));
        for ev in samples() {
            s.apply(&ev);
        }
        assert_eq!(s.stage, Stage::Serving);
        assert_eq!(s.model_version, Some(12));
        assert_eq!(s.embedding_len, 4);
        assert_eq!(s.last_obs, Some((7, 42)));
    }

    /// A `lifecycle` of shop/checkout moving to `stage` after `previous`.
    fn lifecycle_event(previous: Option<Stage>, stage: Stage) -> Event {
        Event::Lifecycle(aware_bus_schemas::Lifecycle {
            schema: Schema::new(),
            target: Target::new("shop", "checkout"),
            episode: 0,
            step: 0,
            ts_ms: 0,
            stage,
            previous,
            reason: String::new(),
            reward_mean: None,
            reward_std: None,
            window: 0,
            rollback_to: None,
        })
    }

    /// A `lifecycle` that is no move of the lifecycle monitor (forged with the bus's permissions
    /// off) changes nothing: a target known OFFLINE is not switched to the policy by a SERVING.
    #[test]
    fn lifecycle_messages_the_monitor_never_sends_are_refused() {
        let msg = lifecycle_event;
        let mut s = AgentState::new(Target::new("shop", "checkout"));
        assert!(s.apply(&msg(Some(Stage::Initialized), Stage::Offline)));
        for forged in [
            msg(Some(Stage::Offline), Stage::Serving),
            msg(Some(Stage::Online), Stage::Serving),
            msg(None, Stage::Serving),
            msg(Some(Stage::Initialized), Stage::Serving),
        ] {
            assert!(!s.apply(&forged), "{forged:?}");
            assert_eq!(s.stage, Stage::Offline);
        }
        // Algorithm 1's moves and a monitor starting afresh are taken.
        assert!(s.apply(&msg(Some(Stage::Offline), Stage::Online)));
        assert!(s.apply(&msg(Some(Stage::Online), Stage::Serving)));
        assert!(s.apply(&msg(Some(Stage::Serving), Stage::Online)));
        assert!(s.retraining);
        assert!(s.apply(&msg(Some(Stage::Initialized), Stage::Offline)));
        assert_eq!(s.stage, Stage::Offline);
        // The error-budget guard returns a SERVING target to the fallback.
        assert!(s.apply(&msg(Some(Stage::Offline), Stage::Online)));
        assert!(s.apply(&msg(Some(Stage::Online), Stage::Serving)));
        assert!(s.apply(&msg(Some(Stage::Serving), Stage::Offline)));
        assert_eq!(s.stage, Stage::Offline);
        // The first stage an agent learns may be any (the capture's restored stage).
        let mut fresh = AgentState::new(Target::new("shop", "checkout"));
        assert!(fresh.apply(&msg(Some(Stage::Online), Stage::Serving)));
        assert_eq!(fresh.stage, Stage::Serving);
    }

    mod rl_path {
        use super::*;
        use aware_bus_schemas::{Model, ModelKind};
        use aware_shared::model_store::{model_key, LocalDirStore};
        use aware_shared_model::{Batch, DdpgConfig};

        struct Fixture {
            _dir: tempfile::TempDir,
            store: Arc<LocalDirStore>,
            decider: Decider,
            registry: prometheus::Registry,
        }

        fn fixture() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let store = Arc::new(LocalDirStore::open(dir.path()).unwrap());
            let service = ServiceMetrics::new("recommender").unwrap();
            let registry = service.registry().clone();
            let metrics = RecommenderMetrics::new(&service).unwrap();
            let t = Target::new("shop", "checkout");
            let decider = Decider::new(
                TargetSpec::new(&t),
                Fallback::new(FallbackConfig::default()).unwrap(),
                store.clone(),
                3,
                metrics,
            );
            Fixture {
                _dir: dir,
                store,
                decider,
                registry,
            }
        }

        /// A trained 64-64 base-learner stored as `version`; returns its `model` message.
        fn publish(store: &LocalDirStore, version: u64, seed: u64) -> Model {
            publish_dim(store, version, seed, 9)
        }

        /// Like [`publish`] with `dim` inputs (9 + 64: conditioned on an embedding).
        fn publish_dim(store: &LocalDirStore, version: u64, seed: u64, dim: usize) -> Model {
            let mut cfg = DdpgConfig::with_hidden(dim, &[64, 64]);
            cfg.seed = seed;
            let mut ddpg = aware_shared_model::Ddpg::new(cfg).unwrap();
            let mut b = Batch::with_capacity(dim, 8);
            for i in 0..8 {
                let s: Vec<f32> = (0..dim)
                    .map(|j| ((i * dim + j) as f32 * 0.37).sin())
                    .collect();
                b.push(&aware_shared_model::Transition {
                    state: s.clone(),
                    action: [0.1, -0.2, 0.3],
                    reward: 1.0,
                    next_state: s,
                    done: false,
                })
                .unwrap();
            }
            ddpg.train_step(&b).unwrap();
            let bytes = ddpg.to_bytes().unwrap();
            let t = Target::new("shop", "checkout");
            let obj = store
                .put(&model_key(&t, "base_learner", version), &bytes)
                .unwrap();
            Model {
                schema: Schema::new(),
                target: t,
                episode: 0,
                step: 0,
                ts_ms: 0,
                kind: ModelKind::BaseLearner,
                version,
                uri: obj.uri,
                sha256: obj.sha256,
                size_bytes: obj.size_bytes,
                trained_steps: ddpg.train_steps(),
                policy_estimate: None,
                behaviour_reward: None,
            }
        }

        fn obs(state: Vec<f32>) -> Obs {
            let Some(Event::Obs(mut o)) =
                samples().into_iter().find(|e| e.kind() == EventKind::Obs)
            else {
                unreachable!()
            };
            o.state = state;
            o
        }

        fn counter(r: &prometheus::Registry, name: &str, reason: Option<&str>) -> f64 {
            r.gather()
                .iter()
                .filter(|f| f.name() == format!("aware_{name}"))
                .flat_map(|f| f.get_metric().iter())
                .filter(|m| {
                    reason.is_none_or(|want| {
                        m.get_label()
                            .iter()
                            .any(|l| l.name() == "reason" && l.value() == want)
                    })
                })
                .map(|m| m.get_counter().get_value())
                .sum()
        }

        fn in_bounds(d: Resources, b: &aware_shared::spec::Bounds) -> bool {
            (b.min_replicas..=b.max_replicas).contains(&d.replicas)
                && (b.min_cpu_millicores..=b.max_cpu_millicores).contains(&d.cpu_millicores)
                && (b.min_memory_bytes..=b.max_memory_bytes).contains(&d.memory_bytes)
        }

        /// Between HPA syncs the fallback holds the replica count in force — the Deployment's
        /// spec, as upstream's HPA reads `scale.spec.replicas` — not the pods running, which lag
        /// a scale: it must not undo its own scale-up while the new pods are created.
        #[test]
        fn the_fallback_holds_its_scale_up_while_the_pods_catch_up() {
            let mut f = fixture();
            f.decider.state.stage = Stage::Offline;
            let mut o = obs(vec![0.5; 9]);
            o.metrics.replicas = 4;
            o.metrics.ready_replicas = 4;
            o.metrics.spec_replicas = Some(4);
            o.metrics.cpu_limit_cores = 0.5;
            // 100 % of the limit on every pod: above the 70 % target
            o.metrics.cpu_usage_cores = 2.0;
            let first = f.decider.decide(&o);
            assert_eq!(first.current.replicas, 4);
            let up = first.desired.replicas;
            assert!(up > 4, "{first:?}");
            // The actuator scaled the spec; the pods have not caught up (4 running) and the next
            // HPA sync is 15 s away.
            for k in 1..=5u32 {
                let mut next = o.clone();
                next.step += k;
                next.ts_ms += 2_000 * i64::from(k);
                next.metrics.spec_replicas = Some(up);
                let a = f.decider.decide(&next);
                assert_eq!(a.current.replicas, up, "step {k}: {a:?}");
                assert_eq!(a.desired.replicas, up, "step {k}: {a:?}");
            }
        }

        /// A policy that hands back pods it starved into a crash loop (none ready, no CPU
        /// reported, OOM kills) gets the fallback's own last allocation back until it is in force:
        /// the HPA alone keeps what is in force while no pod is ready, and the VPA alone would
        /// leave one replica at the memory ceiling. Once in force the rules drive again, and
        /// with the restore off the trap is what the fallback does.
        #[test]
        fn a_hand_back_restores_the_fallbacks_own_allocation_until_in_force() {
            let lifecycle = |stage, previous| lifecycle_event(Some(previous), stage);
            let healthy = |step: u32| {
                let mut o = obs(vec![0.5; 9]);
                o.step = step;
                o.ts_ms = 1_000_000 + 10_000 * i64::from(step);
                o.metrics.replicas = 4;
                o.metrics.ready_replicas = 4;
                o.metrics.spec_replicas = Some(4);
                o.metrics.cpu_limit_cores = 0.5;
                o.metrics.cpu_usage_cores = 1.4;
                o.metrics.memory_limit_bytes = 512.0 * 1024.0 * 1024.0;
                o.metrics.memory_working_set_bytes = 4.0 * 200.0 * 1024.0 * 1024.0;
                o.metrics.oom_kills = 0;
                o
            };
            // One replica left by the policy, crash-looping: nothing ready, no CPU, OOM kills.
            let starved = |step: u32| {
                let mut o = healthy(step);
                o.metrics.replicas = 1;
                o.metrics.ready_replicas = 0;
                o.metrics.spec_replicas = Some(1);
                o.metrics.cpu_limit_cores = 0.25;
                o.metrics.cpu_usage_cores = 0.0;
                o.metrics.memory_limit_bytes = 256.0 * 1024.0 * 1024.0;
                o.metrics.memory_working_set_bytes = 250.0 * 1024.0 * 1024.0;
                o.metrics.oom_kills = 1;
                o
            };
            let run = |restore_steps: u32| {
                let mut f = fixture();
                f.decider.set_handback_restore_steps(restore_steps);
                f.decider
                    .handle(&lifecycle(Stage::Offline, Stage::Initialized));
                let mut own = None;
                for step in 0..6 {
                    own = f.decider.handle(&Event::Obs(healthy(step)));
                }
                let own = own.unwrap().desired;
                assert_eq!(own.replicas, 4, "{own:?}");
                // ONLINE without a model: the fallback acts, but does not drive as its own.
                f.decider.handle(&lifecycle(Stage::Online, Stage::Offline));
                for step in 6..12 {
                    f.decider.handle(&Event::Obs(starved(step)));
                }
                f.decider.handle(&lifecycle(Stage::Offline, Stage::Online));
                let first = f.decider.handle(&Event::Obs(starved(12))).unwrap();
                (f, own, first)
            };

            let (mut f, own, first) = run(12);
            assert_eq!(first.source, DecisionSource::Fallback);
            assert!(first.desired.replicas >= own.replicas, "{first:?}");
            assert!(
                first.desired.cpu_millicores >= own.cpu_millicores,
                "{first:?}"
            );
            assert!(first.desired.memory_bytes >= own.memory_bytes, "{first:?}");
            assert_eq!(
                counter(&f.registry, "recommender_handback_restores_total", None),
                1.0
            );
            // Not in force yet (the pods are still starting): the restore holds, and the HPA
            // between syncs does not undo it.
            let second = f.decider.handle(&Event::Obs(starved(13))).unwrap();
            assert_eq!(
                second.desired.replicas, first.desired.replicas,
                "{second:?}"
            );
            // In force and healthy: the rules drive from what is in force, no longer raised.
            let mut in_force = healthy(14);
            in_force.metrics.replicas = first.desired.replicas;
            in_force.metrics.ready_replicas = first.desired.replicas;
            in_force.metrics.spec_replicas = Some(first.desired.replicas);
            in_force.metrics.cpu_limit_cores = f64::from(first.desired.cpu_millicores) / 1000.0;
            in_force.metrics.memory_limit_bytes = first.desired.memory_bytes as f64;
            f.decider.handle(&Event::Obs(in_force));
            assert_eq!(
                counter(&f.registry, "recommender_handback_restores_total", None),
                2.0
            );

            // Off: the fallback keeps the starved replica.
            let (_, _, trapped) = run(0);
            assert_eq!(trapped.desired.replicas, 1, "{trapped:?}");
        }

        /// Under sustained overload at the replica and CPU ceilings with the SLO violated, the
        /// actions say the SLO is unreachable once a window is full, with the allocation the
        /// HPA/VPA rule needs beyond the bounds — and the allocation itself stays the fallback's
        /// own: at the max of the short dimensions, memory where the VPA puts it, not grown to
        /// its bound (the cheapest allocation that comes closest). When the load falls and the
        /// SLO holds, the verdict clears after a window.
        #[test]
        fn an_slo_out_of_reach_is_said_on_the_action_and_the_allocation_stays_the_rules() {
            const WINDOW: u32 = 6;
            let mut f = fixture();
            f.decider.state.stage = Stage::Offline;
            f.decider.spec.slo.latency_p99_ms = Some(200.0);
            f.decider.set_reach(crate::reach::ReachConfig {
                window_steps: WINDOW,
                objective: 0.99,
            });
            let b = f.decider.spec.bounds;
            let mut alone = Fallback::new(FallbackConfig::default()).unwrap();
            let step = |k: u32, cores_per_pod: f64, violated: bool| {
                let mut o = obs(vec![0.5; 9]);
                o.step = k;
                o.ts_ms = 1_000_000 + 10_000 * i64::from(k);
                o.metrics.replicas = b.max_replicas;
                o.metrics.ready_replicas = b.max_replicas;
                o.metrics.spec_replicas = Some(b.max_replicas);
                o.metrics.cpu_limit_cores = f64::from(b.max_cpu_millicores) / 1000.0;
                o.metrics.cpu_usage_cores = cores_per_pod * f64::from(b.max_replicas);
                o.metrics.memory_limit_bytes = 512.0 * 1024.0 * 1024.0;
                o.metrics.memory_working_set_bytes =
                    300.0 * 1024.0 * 1024.0 * f64::from(b.max_replicas);
                o.metrics.oom_kills = 0;
                o.slo_violation = violated;
                o
            };
            let mut k = 0;
            // Every pod at its whole CPU limit: the HPA asks for 100/70 of the replicas.
            let mut needed = None;
            for _ in 0..WINDOW {
                let o = step(k, f64::from(b.max_cpu_millicores) / 1000.0, true);
                let a = f.decider.decide(&o);
                let by_rule = alone
                    .recommend(
                        o.ts_ms as f64 / 1000.0,
                        &o.metrics,
                        current_allocation(&o),
                        &b,
                    )
                    .desired;
                assert_eq!(
                    a.desired, by_rule,
                    "step {k}: the verdict changes no allocation"
                );
                assert_eq!(a.desired.replicas, b.max_replicas, "step {k}");
                assert_eq!(a.desired.cpu_millicores, b.max_cpu_millicores, "step {k}");
                assert!(
                    a.desired.memory_bytes < b.max_memory_bytes,
                    "step {k}: memory not grown to its bound: {a:?}"
                );
                needed = a.slo_unreachable;
                assert_eq!(a.slo_judged, k + 1 >= WINDOW, "step {k}: {a:?}");
                k += 1;
            }
            let needed = needed.expect("unreachable once the window is full");
            assert!(needed.replicas > b.max_replicas, "{needed:?}");
            assert!(
                needed.replicas <= (b.max_replicas * 100).div_ceil(70) + 1,
                "{needed:?}"
            );
            assert!(needed.cpu_millicores >= b.max_cpu_millicores, "{needed:?}");
            assert_eq!(
                needed.memory_bytes,
                512 * 1024 * 1024,
                "memory is not short"
            );
            // The encoded action carries it.
            let a = f.decider.decide(&step(k, 2.0, true));
            k += 1;
            let bytes = aware_bus_schemas::encode(&a).unwrap();
            let Event::Action(back) = aware_bus_schemas::decode_any(&bytes).unwrap() else {
                unreachable!()
            };
            assert!(back.slo_unreachable.is_some());
            // The load falls to half the limit and the SLO holds: a window later, reachable.
            let mut cleared_at = None;
            for i in 0..2 * WINDOW {
                let a = f.decider.decide(&step(k, 1.0, false));
                k += 1;
                if a.slo_unreachable.is_none() && cleared_at.is_none() {
                    cleared_at = Some(i);
                }
                if cleared_at.is_some() {
                    assert_eq!(a.slo_unreachable, None, "no flapping back");
                }
            }
            assert_eq!(cleared_at, Some(WINDOW - 1));
        }

        /// The same step again (a publisher's retry delivers each try) is not decided twice;
        /// the next step is.
        #[test]
        fn a_repeated_obs_is_decided_once() {
            let mut f = fixture();
            let o = obs(vec![0.1; 9]);
            assert!(f.decider.handle(&Event::Obs(o.clone())).is_some());
            assert!(f.decider.handle(&Event::Obs(o.clone())).is_none());
            let mut next = o;
            next.step += 1;
            assert!(f.decider.handle(&Event::Obs(next)).is_some());
        }

        /// A complete obs whose limits are NaN, infinite, negative or zero gets no action (and
        /// counts as incomplete): its `current` would read as a zero allocation.
        #[test]
        fn an_obs_without_a_usable_allocation_gets_no_action() {
            let mut f = fixture();
            let good = obs(vec![0.1; 9]);
            assert!(allocation_known(&good.metrics));
            let a = f.decider.handle(&Event::Obs(good.clone())).unwrap();
            assert!(a.current.cpu_millicores > 0 && a.current.memory_bytes > 0);
            for v in [f64::NAN, f64::INFINITY, -1.0, 0.0] {
                for cpu in [true, false] {
                    let mut o = good.clone();
                    o.step += 1;
                    if cpu {
                        o.metrics.cpu_limit_cores = v;
                    } else {
                        o.metrics.memory_limit_bytes = v;
                    }
                    assert!(f.decider.handle(&Event::Obs(o)).is_none(), "{v} cpu={cpu}");
                }
            }
            assert_eq!(
                counter(&f.registry, "recommender_incomplete_steps_total", None),
                8.0
            );
        }

        #[test]
        fn registrations_set_the_spec_and_deregistration_stops_actions() {
            use aware_bus_schemas::Registration;
            use aware_shared::registry::to_registered;
            let mut f = fixture();
            let t = Target::new("shop", "checkout");
            let reg = |spec: Option<&TargetSpec>, generation| {
                Event::Registration(Registration {
                    schema: Schema::new(),
                    target: t.clone(),
                    episode: 0,
                    step: 0,
                    ts_ms: 0,
                    generation,
                    source: "shop/checkout".into(),
                    spec: spec.map(|s| to_registered(s, None)),
                })
            };
            let first = obs(vec![0.5; 9]);
            let o = Event::Obs(first.clone());
            // The fixture's obs asks for more replicas than 2 under heavy CPU use.
            let free = f.decider.handle(&o).expect("an action").desired;
            // Each check its own later step (the same step again would be a repeat).
            let at = |k: u32| {
                Event::Obs(Obs {
                    step: first.step + k,
                    ..first.clone()
                })
            };
            let mut narrow = TargetSpec::new(&t);
            narrow.bounds.max_replicas = 2;
            narrow.bounds.min_replicas = 2;
            assert!(f.decider.handle(&reg(Some(&narrow), 1)).is_none());
            assert_eq!(f.decider.spec(), &narrow);
            let bounded = f.decider.handle(&at(1)).expect("an action").desired;
            assert_eq!(
                bounded.replicas, 2,
                "registered bounds apply (was {free:?})"
            );
            // Deregistered: no action at all, however many steps come.
            assert!(f.decider.handle(&reg(None, 1)).is_none());
            assert!(f.decider.handle(&at(2)).is_none());
            assert!(f.decider.handle(&at(3)).is_none());
            // An invalid registration is refused and counted; the target stays deregistered.
            let mut bad = narrow.clone();
            bad.bounds.min_replicas = 5;
            assert!(f.decider.handle(&reg(Some(&bad), 2)).is_none());
            assert!(f.decider.handle(&at(4)).is_none());
            assert_eq!(
                f.decider
                    .metrics
                    .registrations
                    .with_label_values(&["refused"])
                    .get(),
                1
            );
            // Registered again: acting again.
            assert!(f.decider.handle(&reg(Some(&narrow), 3)).is_none());
            assert!(f.decider.handle(&at(5)).is_some());
        }

        /// `n` OFFLINE steps 15 s apart (one HPA sync each) of 2 replicas at 50 % of their
        /// 500 m limits.
        fn half_loaded(from_step: u32, n: u32) -> Vec<Obs> {
            (from_step..from_step + n)
                .map(|k| {
                    let mut o = obs(vec![0.5; 9]);
                    o.step = k;
                    o.ts_ms = 15_000 * i64::from(k);
                    o.metrics.replicas = 2;
                    o.metrics.ready_replicas = 2;
                    o.metrics.spec_replicas = Some(2);
                    o.metrics.cpu_limit_cores = 0.5;
                    o.metrics.cpu_usage_cores = 0.5;
                    o
                })
                .collect()
        }

        /// A target whose spec sets its own HPA target (35 %, as a latency-sensitive API's HPA
        /// is tuned) gets more replicas from the fallback than the configured 70 % gives on the
        /// same observations: 50 % / 35 % → ceil(2 × 1.43) = 3, against 50 % / 70 % → 2.
        #[test]
        fn a_targets_hpa_target_override_drives_its_fallback() {
            let mut tuned = fixture();
            let mut spec = TargetSpec::new(&Target::new("shop", "checkout"));
            spec.fallback.hpa_target_cpu_utilization = Some(0.35);
            tuned.decider = Decider::new(
                spec,
                Fallback::new(FallbackConfig::default()).unwrap(),
                tuned.store.clone(),
                3,
                tuned.decider.metrics.clone(),
            );
            let mut global = fixture();
            assert_eq!(tuned.decider.fallback.hpa().config().target_percent(), 35);
            assert_eq!(global.decider.fallback.hpa().config().target_percent(), 70);
            for o in half_loaded(1, 4) {
                let (t, g) = (tuned.decider.decide(&o), global.decider.decide(&o));
                assert_eq!(t.source, DecisionSource::Fallback);
                assert_eq!((t.desired.replicas, g.desired.replicas), (3, 2), "{o:?}");
            }
        }

        /// A registration that sets, changes or drops the HPA target changes the fallback's
        /// target from the next HPA sync, in place: the VPA's histograms stay as they were.
        #[test]
        fn a_registration_sets_the_fallbacks_hpa_target_in_place() {
            use aware_bus_schemas::Registration;
            use aware_shared::registry::to_registered;
            let mut f = fixture();
            let t = Target::new("shop", "checkout");
            let reg = |spec: &TargetSpec, generation| {
                Event::Registration(Registration {
                    schema: Schema::new(),
                    target: t.clone(),
                    episode: 0,
                    step: 0,
                    ts_ms: 0,
                    generation,
                    source: "shop/checkout".into(),
                    spec: Some(to_registered(spec, None)),
                })
            };
            let steps = half_loaded(1, 6);
            let a = f.decider.handle(&Event::Obs(steps[0].clone())).unwrap();
            assert_eq!(a.desired.replicas, 2);
            let samples = f.decider.fallback.vpa().total_samples();
            assert!(samples > 0);

            let mut spec = TargetSpec::new(&t);
            spec.fallback.hpa_target_cpu_utilization = Some(0.35);
            assert!(f.decider.handle(&reg(&spec, 1)).is_none());
            assert_eq!(f.decider.fallback.hpa().config().target_percent(), 35);
            assert_eq!(f.decider.fallback.vpa().total_samples(), samples);
            let a = f.decider.handle(&Event::Obs(steps[1].clone())).unwrap();
            assert_eq!(a.desired.replicas, 3, "{a:?}");

            // A registration from before the field (or an AwareAutoscaler without it): the
            // configured target again.
            spec.fallback.hpa_target_cpu_utilization = None;
            assert!(f.decider.handle(&reg(&spec, 2)).is_none());
            assert_eq!(f.decider.fallback.hpa().config().target_percent(), 70);
            // A refused registration (out of range) leaves the target in force.
            let mut wire = to_registered(&spec, None);
            wire.fallback_hpa_target_cpu_utilization = Some(1.5);
            let Event::Registration(mut bad) = reg(&spec, 3) else {
                unreachable!()
            };
            bad.spec = Some(wire);
            assert!(f.decider.handle(&Event::Registration(bad)).is_none());
            assert_eq!(f.decider.fallback.hpa().config().target_percent(), 70);
            assert!(f.decider.fallback.vpa().total_samples() > samples);
        }

        #[test]
        fn online_with_a_model_acts_rl_within_bounds() {
            let mut f = fixture();
            f.decider.state.stage = Stage::Online;
            // ONLINE without a model: the fallback, with the reason, counted.
            let a = f.decider.decide(&obs(vec![0.5; 9]));
            assert_eq!(a.source, DecisionSource::Fallback);
            assert_eq!(a.fallback_reason.as_deref(), Some("no RL policy is loaded"));
            assert_eq!(
                counter(
                    &f.registry,
                    "recommender_rl_fallbacks_total",
                    Some("no_model")
                ),
                1.0
            );

            let m = publish(&f.store, 1, 5);
            f.decider.handle(&Event::Model(m));
            assert_eq!(f.decider.policy_version(), Some(1));
            let bounds = aware_shared::spec::Bounds::default();
            let mut distinct = std::collections::BTreeSet::new();
            for i in 0..50 {
                let state: Vec<f32> = (0..9).map(|j| ((i * 9 + j) as f32 * 0.71).cos()).collect();
                let a = f.decider.decide(&obs(state));
                assert_eq!(a.source, DecisionSource::Rl, "{a:?}");
                assert_eq!(a.model_version, Some(1));
                assert!(a.exploration);
                assert_eq!(a.fallback_reason, None);
                assert_eq!(a.raw.len(), 3);
                assert!(
                    a.raw.iter().all(|x| (-1.0..=1.0).contains(x)),
                    "{:?}",
                    a.raw
                );
                assert!(in_bounds(a.desired, &bounds), "{:?}", a.desired);
                // `desired` is the raw action mapped from the allocation in force.
                assert_eq!(
                    a.desired,
                    rl::map_raw([a.raw[0], a.raw[1], a.raw[2]], a.current, &bounds)
                );
                distinct.insert(a.raw.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
            assert!(distinct.len() > 40, "exploration noise varies the actions");
            // A newer model swaps in; an older announcement is ignored.
            f.decider.handle(&Event::Model(publish(&f.store, 3, 6)));
            assert_eq!(f.decider.policy_version(), Some(3));
            f.decider.handle(&Event::Model(publish(&f.store, 2, 7)));
            assert_eq!(f.decider.policy_version(), Some(3));
            assert_eq!(
                counter(&f.registry, "recommender_models_loaded_total", None),
                2.0
            );
            // OFFLINE: the fallback, and no RL fallback counted.
            f.decider.state.stage = Stage::Offline;
            let a = f.decider.decide(&obs(vec![0.5; 9]));
            assert_eq!(
                (a.source, a.fallback_reason),
                (DecisionSource::Fallback, None)
            );
        }

        /// The capacity shield: for `capacity_shield_steps` steps from an observed violation the
        /// policy's replicas and CPU are at least the fallback's recommendation (what the same
        /// fallback decides for the same steps when it drives), its raw action rewritten to
        /// what is sent; then the policy's own action again. Off, the policy's action throughout.
        #[test]
        fn the_capacity_shield_holds_the_policy_at_the_fallbacks_capacity_after_a_violation() {
            let loaded = |step: u32, violation: bool| {
                let mut o = obs(vec![0.5; 9]);
                o.step = step;
                o.metrics.replicas = 20;
                o.metrics.ready_replicas = 20;
                o.metrics.spec_replicas = Some(20);
                o.metrics.cpu_limit_cores = 2.0;
                // 400 % of the requests: the HPA scales up.
                o.metrics.cpu_usage_cores = 160.0;
                o.slo_violation = violation;
                o
            };
            let steps = [true, false, false, false];
            let run = |stage: Stage, shield: u32| {
                let mut f = fixture();
                f.decider.state.stage = stage;
                f.decider.set_capacity_shield_steps(Some(shield));
                f.decider.handle(&Event::Model(publish(&f.store, 1, 5)));
                let actions: Vec<Action> = steps
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| f.decider.decide(&loaded(i as u32, v)))
                    .collect();
                let raised = counter(&f.registry, "recommender_capacity_shield_total", None);
                (actions, raised)
            };
            let (fallback, _) = run(Stage::Offline, 0);
            let (own, none) = run(Stage::Serving, 0);
            let (shielded, raised) = run(Stage::Serving, 2);
            assert_eq!(none, 0.0);
            let b = aware_shared::spec::Bounds::default();
            let below = |a: &Action, f: &Action| {
                a.desired.replicas < f.desired.replicas
                    || a.desired.cpu_millicores < f.desired.cpu_millicores
            };
            assert!(
                below(&own[0], &fallback[0]),
                "the policy asks for less than the HPA: {:?} {:?}",
                own[0].desired,
                fallback[0].desired
            );
            for i in 0..2 {
                let (a, f) = (&shielded[i], &fallback[i]);
                assert_eq!(a.source, DecisionSource::Rl);
                assert!(
                    !below(a, f),
                    "step {i}: {:?} under {:?}",
                    a.desired,
                    f.desired
                );
                assert_eq!(a.desired.memory_bytes, own[i].desired.memory_bytes);
                assert_eq!(
                    a.desired,
                    rl::map_raw([a.raw[0], a.raw[1], a.raw[2]], a.current, &b)
                );
            }
            assert_eq!(raised, 2.0);
            for i in 2..4 {
                assert_eq!(
                    shielded[i].desired, own[i].desired,
                    "step {i}: the shield ended"
                );
            }
        }

        /// Unset, the shield lasts the error budget's window.
        #[test]
        fn the_capacity_shield_lasts_the_budgets_window_by_default() {
            assert_eq!(budget_window(0.99), 100);
            assert_eq!(budget_window(0.9), 10);
            assert_eq!(budget_window(0.995), 200);
            for bad in [1.0, 0.0, f64::NAN, 2.0] {
                assert_eq!(budget_window(bad), 1);
            }
            let mut f = fixture();
            f.decider.spec.slo.objective = Some(0.9);
            f.decider.set_capacity_shield_steps(None);
            let mut o = obs(vec![0.5; 9]);
            o.slo_violation = true;
            f.decider.decide(&o);
            assert_eq!(f.decider.shield_left, 10);
            o.slo_violation = false;
            f.decider.decide(&o);
            assert_eq!(f.decider.shield_left, 9);
            f.decider.set_capacity_shield_steps(Some(0));
            o.slo_violation = true;
            f.decider.decide(&o);
            assert_eq!(f.decider.shield_left, 0, "off");
        }

        #[test]
        fn a_conditioned_policy_acts_on_state_and_embedding() {
            let mut f = fixture();
            let t = Target::new("shop", "checkout");
            f.decider.state.stage = Stage::Serving;
            let m = publish_dim(&f.store, 1, 5, 73);
            let served = aware_shared_model::Ddpg::from_bytes(
                &aware_shared::model_store::get_verified(
                    f.store.as_ref(),
                    &m.uri,
                    &m.sha256,
                    m.size_bytes,
                )
                .unwrap(),
            )
            .unwrap();
            f.decider.handle(&Event::Model(m));
            let state = vec![0.5f32; 9];
            let embedding = |n: usize, k: f32| {
                Event::Embedding(aware_bus_schemas::Embedding {
                    schema: Schema::new(),
                    target: t.clone(),
                    episode: 3,
                    step: 19,
                    ts_ms: 0,
                    model_version: 7,
                    embedding: (0..n).map(|i| (i as f32 * k).sin()).collect(),
                    episodes_used: 4,
                })
            };
            // No embedding yet, then one of another width: the fallback, with the reason.
            let a = f.decider.decide(&obs(state.clone()));
            assert_eq!(a.source, DecisionSource::Fallback);
            assert_eq!(
                a.fallback_reason.as_deref(),
                Some(FallbackReason::NoEmbedding.describe())
            );
            f.decider.handle(&embedding(32, 0.1));
            let a = f.decider.decide(&obs(state.clone()));
            assert_eq!(a.source, DecisionSource::Fallback);
            assert_eq!(
                counter(
                    &f.registry,
                    "recommender_rl_fallbacks_total",
                    Some("no_embedding")
                ),
                2.0
            );
            // A 64-d embedding: RL, the actor fed state ‖ embedding.
            for k in [0.1f32, 0.9] {
                let ev = embedding(64, k);
                f.decider.handle(&ev);
                let Event::Embedding(e) = ev else {
                    unreachable!()
                };
                assert_eq!(f.decider.embedding(), Some(e.embedding.as_slice()));
                let a = f.decider.decide(&obs(state.clone()));
                assert_eq!((a.source, a.model_version), (DecisionSource::Rl, Some(1)));
                let mut x = state.clone();
                x.extend_from_slice(&e.embedding);
                assert_eq!(a.raw, served.act(&x).unwrap().to_vec());
            }
            // A 9-d policy ignores the embedding.
            f.decider.handle(&Event::Model(publish(&f.store, 2, 6)));
            let a = f.decider.decide(&obs(state));
            assert_eq!((a.source, a.model_version), (DecisionSource::Rl, Some(2)));
        }

        #[test]
        fn non_finite_state_falls_back_and_counts() {
            let mut f = fixture();
            let m = publish(&f.store, 1, 5);
            f.decider.on_model(&m);
            for (stage, bad) in [
                (Stage::Online, f32::NAN),
                (Stage::Serving, f32::INFINITY),
                (Stage::Online, f32::NEG_INFINITY),
            ] {
                f.decider.state.stage = stage;
                let s = aware_mdp::State {
                    io_util: bad,
                    ..aware_mdp::State::from_slice(&[0.5; aware_mdp::STATE_DIM]).unwrap()
                };
                let a = f.decider.decide(&obs(s.to_vec()));
                assert_eq!(a.source, DecisionSource::Fallback);
                assert!(a.raw.is_empty());
                assert_eq!(
                    a.fallback_reason.as_deref(),
                    Some("NaN or infinite value in the state")
                );
            }
            assert_eq!(
                counter(
                    &f.registry,
                    "recommender_rl_fallbacks_total",
                    Some("non_finite_state")
                ),
                3.0
            );
            // A state of the wrong width is refused by the model, not acted on.
            f.decider.state.stage = Stage::Online;
            let a = f.decider.decide(&obs(vec![0.5; 4]));
            assert_eq!(a.source, DecisionSource::Fallback);
            assert_eq!(
                counter(
                    &f.registry,
                    "recommender_rl_fallbacks_total",
                    Some("state_dim")
                ),
                1.0
            );
            // The next finite state is served by the policy again.
            let a = f.decider.decide(&obs(vec![0.5; 9]));
            assert_eq!(a.source, DecisionSource::Rl);
        }

        #[test]
        fn corrupt_or_missing_checkpoints_keep_the_previous_policy() {
            let mut f = fixture();
            f.decider.state.stage = Stage::Online;
            // Missing file.
            let mut gone = publish(&f.store, 1, 5);
            std::fs::remove_file(gone.uri.strip_prefix("file://").unwrap()).unwrap();
            f.decider.handle(&Event::Model(gone.clone()));
            assert_eq!(f.decider.policy_version(), None);
            // Wrong checksum.
            let mut bad_sum = publish(&f.store, 2, 5);
            bad_sum.sha256 = "00".repeat(32);
            f.decider.handle(&Event::Model(bad_sum));
            // Bytes that are not a checkpoint, announced with their true checksum.
            let t = Target::new("shop", "checkout");
            let junk = b"definitely not a checkpoint".to_vec();
            let obj = f
                .store
                .put(&model_key(&t, "base_learner", 3), &junk)
                .unwrap();
            let mut not_ckpt = publish(&f.store, 4, 5);
            not_ckpt.version = 3;
            not_ckpt.uri = obj.uri;
            not_ckpt.sha256 = obj.sha256;
            not_ckpt.size_bytes = obj.size_bytes;
            f.decider.handle(&Event::Model(not_ckpt));
            // A uri outside the store.
            gone.version = 5;
            gone.uri = "file:///etc/passwd".into();
            f.decider.handle(&Event::Model(gone));
            assert_eq!(f.decider.policy_version(), None);
            assert_eq!(
                counter(&f.registry, "recommender_model_load_errors_total", None),
                4.0
            );
            let a = f.decider.decide(&obs(vec![0.5; 9]));
            assert_eq!(a.source, DecisionSource::Fallback);
            assert_eq!(a.model_version, None);
            // A good model, then a corrupted newer one: the good one stays in use.
            f.decider.handle(&Event::Model(publish(&f.store, 6, 5)));
            let mut torn = publish(&f.store, 7, 5);
            let path = torn.uri.strip_prefix("file://").unwrap().to_string();
            let mut bytes = std::fs::read(&path).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0xff;
            std::fs::write(&path, &bytes).unwrap();
            f.decider.handle(&Event::Model(torn.clone()));
            // Even with the matching sha256 the checkpoint's own checksum refuses it.
            torn.sha256 = aware_shared::model_store::sha256_hex(&bytes);
            torn.version = 8;
            f.decider.handle(&Event::Model(torn));
            assert_eq!(f.decider.policy_version(), Some(6));
            assert_eq!(
                counter(&f.registry, "recommender_model_load_errors_total", None),
                6.0
            );
            let a = f.decider.decide(&obs(vec![0.5; 9]));
            assert_eq!((a.source, a.model_version), (DecisionSource::Rl, Some(6)));
        }

        #[test]
        fn serving_is_deterministic_and_freezes_the_normalizer() {
            let mut f = fixture();
            f.decider.on_model(&publish(&f.store, 1, 9));
            f.decider.state.stage = Stage::Online;
            // Exploring folds states into the normalizer.
            for i in 0..20 {
                f.decider.decide(&obs(vec![0.1 * i as f32; 9]));
            }
            f.decider.state.stage = Stage::Serving;
            let s = vec![0.3, 0.6, 0.9, 0.2, 0.1, 0.0, 1.0, 0.1, 0.2];
            let first = f.decider.decide(&obs(s.clone()));
            assert_eq!(first.source, DecisionSource::Rl);
            assert!(!first.exploration);
            for i in 0..10 {
                // Other states in between must not move the normalizer.
                f.decider.decide(&obs(vec![5.0 + i as f32; 9]));
                let again = f.decider.decide(&obs(s.clone()));
                assert_eq!(again.raw, first.raw);
                assert_eq!(again.desired, first.desired);
            }
            // Back ONLINE: noise again.
            f.decider.state.stage = Stage::Online;
            let explored = f.decider.decide(&obs(s));
            assert!(explored.exploration);
            assert_ne!(explored.raw, first.raw);
        }

        #[test]
        fn retraining_after_serving_explores_with_the_scaled_noise() {
            let lifecycle = |stage, previous| lifecycle_event(Some(previous), stage);
            let s = vec![0.3, 0.6, 0.9, 0.2, 0.1, 0.0, 1.0, 0.1, 0.2];
            // One exploring action after `events`, and the policy's own action on the same
            // normalizer (SERVING).
            let act = |scale: f32, events: &[Event]| {
                let mut f = fixture();
                f.decider.on_model(&publish(&f.store, 1, 9));
                f.decider.set_retrain_noise_scale(scale);
                for ev in events {
                    f.decider.handle(ev);
                }
                let retraining = f.decider.state.retraining;
                let a = f.decider.decide(&obs(s.clone()));
                assert_eq!((a.source, a.exploration), (DecisionSource::Rl, true));
                f.decider.state.stage = Stage::Serving;
                let mu = f.decider.decide(&obs(s.clone())).raw;
                (a.raw, mu, retraining)
            };
            let first_learning = [
                lifecycle(Stage::Offline, Stage::Initialized),
                lifecycle(Stage::Online, Stage::Offline),
            ];
            let retrain = [
                lifecycle(Stage::Serving, Stage::Online),
                lifecycle(Stage::Online, Stage::Serving),
            ];
            let (full, mu, r) = act(0.5, &first_learning);
            assert!(
                !r,
                "ONLINE from OFFLINE is first learning: the checkpoint's noise"
            );
            let (scaled, mu2, r) = act(0.5, &retrain);
            assert!(r);
            assert_eq!(mu, mu2);
            // The same draw, half as far from the policy's action (no clamping here).
            for i in 0..full.len() {
                assert!(full[i].abs() < 1.0);
                assert!(
                    (scaled[i] - mu[i] - 0.5 * (full[i] - mu[i])).abs() < 1e-5,
                    "{i}"
                );
            }
            assert_ne!(scaled, full);
            // Scale 1 is the checkpoint's noise; leaving ONLINE ends the retraining.
            assert_eq!(act(1.0, &retrain).0, full);
            let mut left = retrain.to_vec();
            left.push(lifecycle(Stage::Offline, Stage::Online));
            left.push(lifecycle(Stage::Online, Stage::Offline));
            let (again, _, r) = act(0.5, &left);
            assert!(!r);
            assert_eq!(again, full);
            // Configuration: default 0.5; not finite or negative is refused, naming the key.
            assert_eq!(RecommenderConfig::default().retrain_noise_scale, 0.5);
            for bad in [f32::NAN, -0.1, f32::INFINITY] {
                let cfg = RecommenderConfig {
                    retrain_noise_scale: bad,
                    ..Default::default()
                };
                assert!(cfg
                    .validate()
                    .unwrap_err()
                    .to_string()
                    .contains("recommender.retrain_noise_scale"));
            }
        }

        #[test]
        fn every_kth_online_episode_acts_without_noise() {
            let mut f = fixture();
            f.decider.on_model(&publish(&f.store, 1, 9));
            f.decider.set_eval_every(3);
            f.decider.state.stage = Stage::Online;
            let s = vec![0.3, 0.6, 0.9, 0.2, 0.1, 0.0, 1.0, 0.1, 0.2];
            let at = |episode: u64| {
                let mut o = obs(s.clone());
                o.episode = episode;
                o
            };
            let explored: Vec<bool> = (0..7)
                .map(|e| {
                    let a = f.decider.decide(&at(e));
                    assert_eq!(a.source, DecisionSource::Rl);
                    a.exploration
                })
                .collect();
            assert_eq!(explored, [true, true, false, true, true, false, true]);
            // an evaluation episode acts as SERVING would on the same weights and normalizer
            let eval = f.decider.decide(&at(8));
            f.decider.state.stage = Stage::Serving;
            let serving = f.decider.decide(&at(9));
            assert!(!eval.exploration && !serving.exploration);
            assert_eq!(eval.raw, serving.raw);
            // off by default
            let mut g = fixture();
            g.decider.on_model(&publish(&g.store, 1, 9));
            g.decider.state.stage = Stage::Online;
            assert!((0..6).all(|e| g.decider.decide(&at(e)).exploration));
            let bad = RecommenderConfig {
                eval_every_episodes: 1,
                ..Default::default()
            };
            assert!(bad
                .validate()
                .unwrap_err()
                .to_string()
                .contains("recommender.eval_every_episodes"));
            assert!(RecommenderConfig::default().validate().is_ok());
        }
    }
}
