//! The service around the machines: one actor per target ([`LifecycleAgent`]), the model
//! checks before a promotion, the metrics, and [`run`].

use std::sync::Arc;

use crate::config::*;
use crate::machine::*;
use crate::CONSUMES;
use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, WrapFuture};
use aware_bus_schemas::{now_ms, Event, EventKind, Lifecycle, Model, Schema, Stage, Target};
use aware_shared::agents::{run_actors, spawn_publisher, Deliver, Outbox, Retire, TargetActors};
use aware_shared::model_store::{get_verified, open_model_store, ModelStore, ModelStoreConfig};
use aware_shared::registry::{log_change, Change, Registered};
use aware_shared::service::{ServiceContext, ServiceError};
use aware_shared::telemetry::{ServiceMetrics, TelemetryError};

pub(crate) fn message(target: &Target, episode: u64, step: u32, t: Transition) -> Lifecycle {
    Lifecycle {
        schema: Schema::new(),
        target: target.clone(),
        episode,
        step,
        ts_ms: now_ms(),
        stage: t.to,
        previous: Some(t.from),
        reason: t.reason,
        reward_mean: t.mean,
        reward_std: t.std,
        window: t.window,
        rollback_to: t.rollback_to,
    }
}

/// Every stage, for the metrics' labels.
const STAGES: [Stage; 4] = [
    Stage::Initialized,
    Stage::Offline,
    Stage::Online,
    Stage::Serving,
];

/// The monitor's metrics (in the service's registry).
#[derive(Clone)]
pub struct LifecycleMetrics {
    /// Targets of this monitor per stage (`aware_lifecycle_targets{stage}`).
    pub stages: prometheus::IntGaugeVec,
    /// Stage transitions (`aware_lifecycle_transitions_total{from,to}`).
    pub transitions: prometheus::IntCounterVec,
    /// `model`s whose checkpoint did not load and verify, so they promoted nothing
    /// (`aware_lifecycle_unverified_models_total`).
    pub unverified_models: prometheus::IntCounter,
    /// `episode` and `model` messages refused for a non-finite value
    /// (`aware_lifecycle_non_finite_refused_total{event}`).
    pub non_finite: prometheus::IntCounterVec,
    /// Returns to OFFLINE because the policy burned the SLO's error budget faster than allowed,
    /// by the stage left (`aware_lifecycle_budget_returns_total{from}`).
    pub budget_returns: prometheus::IntCounterVec,
}

impl LifecycleMetrics {
    pub fn new(m: &ServiceMetrics) -> Result<Self, TelemetryError> {
        let stages = m.gauge_vec(
            "lifecycle_targets",
            "Targets with a live actor in this monitor, by stage",
            &["stage"],
        )?;
        // Every series at 0 from the start, so a scrape (and an alert's rate) sees it.
        for s in STAGES {
            stages.with_label_values(&[s.as_str()]);
        }
        let moves = [
            (Stage::Initialized, Stage::Offline),
            (Stage::Initialized, Stage::Online),
            (Stage::Offline, Stage::Online),
            (Stage::Online, Stage::Offline),
            (Stage::Online, Stage::Serving),
            (Stage::Serving, Stage::Online),
            (Stage::Serving, Stage::Offline),
        ]
        .map(|(from, to)| [from.as_str(), to.as_str()]);
        let transitions = m.counter_vec(
            "lifecycle_transitions_total",
            "Stage transitions (Algorithm 1, probation, re-baselining, rollback, the error budget), by from and to",
            &["from", "to"],
            &moves,
        )?;
        let unverified_models = m.counter(
            "lifecycle_unverified_models_total",
            "Models announced with a promoting estimate whose checkpoint was missing, did not match \
             the announced size and SHA-256 or did not load: ignored",
        )?;
        let non_finite = m.counter_vec(
            "lifecycle_non_finite_refused_total",
            "Episode summaries and models refused because a reward or estimate is not finite, by event",
            &["event"],
            &[["episode"], ["model"]],
        )?;
        let budget_returns = m.counter_vec(
            "lifecycle_budget_returns_total",
            "Returns to OFFLINE (the fallback drives) because the RL policy burned the SLO's error \
             budget faster than allowed, by the stage left",
            &["from"],
            &[[Stage::Online.as_str()], [Stage::Serving.as_str()]],
        )?;
        Ok(LifecycleMetrics {
            stages,
            transitions,
            unverified_models,
            non_finite,
            budget_returns,
        })
    }
}

/// The first reward or estimate of an `episode` or a `model` that is not finite: a NaN would
/// pass or fail every threshold of Algorithm 1 at random.
fn non_finite_field(ev: &Event) -> Option<&'static str> {
    let bad = |x: f64| !x.is_finite();
    match ev {
        Event::Episode(e) => [
            ("mean_reward", Some(e.mean_reward)),
            ("total_reward", Some(e.total_reward)),
            ("cpu_util_mean", Some(e.cpu_util_mean)),
            ("memory_util_mean", Some(e.memory_util_mean)),
            ("policy_estimate", e.policy_estimate),
        ]
        .into_iter()
        .find(|(_, v)| v.is_some_and(bad))
        .map(|(k, _)| k),
        Event::Model(m) => [
            ("policy_estimate", m.policy_estimate),
            ("behaviour_reward", m.behaviour_reward),
        ]
        .into_iter()
        .find(|(_, v)| v.is_some_and(bad))
        .map(|(k, _)| k),
        _ => None,
    }
}

/// The actor of one target.
pub struct LifecycleAgent {
    target: Target,
    machine: LifecycleMachine,
    outbox: Outbox,
    registered: Registered,
    registrations: prometheus::IntCounterVec,
    metrics: LifecycleMetrics,
    /// The stage this actor counts in `aware_lifecycle_targets`.
    counted: Option<Stage>,
    /// Where the trainer stores checkpoints: a model promotes only once its checkpoint loads
    /// from here and matches the announced size and SHA-256, so a `model` message naming a
    /// missing or corrupt file (forged, or published before its object) promotes nothing.
    models: Arc<dyn ModelStore>,
}

/// Why a model was not taken.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Store(#[from] aware_shared::model_store::ModelStoreError),
    #[error("checkpoint does not load: {0}")]
    Load(#[from] aware_shared_model::ModelError),
}

/// Reads the checkpoint `m` announces, checks its size and SHA-256 and decodes it as a policy.
pub fn verify_model(store: &dyn ModelStore, m: &Model) -> Result<(), VerifyError> {
    let bytes = get_verified(store, &m.uri, &m.sha256, m.size_bytes)?;
    aware_shared_model::Policy::from_bytes(&bytes)?;
    Ok(())
}

impl LifecycleAgent {
    /// Folds a (verified, where it could promote) model into the machine.
    fn take_model(&mut self, m: &Model) {
        tracing::debug!(target = %self.target, version = m.version, policy_estimate = ?m.policy_estimate, behaviour_reward = ?m.behaviour_reward, stage = %self.machine.stage(), "model");
        let t = self.machine.observe_model(m);
        self.track(t.as_ref());
        if let Some(t) = t {
            tracing::info!(target = %self.target, from = %t.from, to = %t.to, reason = %t.reason, mean = ?t.mean, window = t.window, budget_return = t.budget_return, "lifecycle transition");
            self.outbox
                .send(message(&self.target, m.episode, m.step, t));
        }
    }

    /// Counts a transition and moves the target to its new stage in the per-stage gauge.
    fn track(&mut self, t: Option<&Transition>) {
        if let Some(t) = t {
            self.metrics
                .transitions
                .with_label_values(&[t.from.as_str(), t.to.as_str()])
                .inc();
            if t.budget_return {
                self.metrics
                    .budget_returns
                    .with_label_values(&[t.from.as_str()])
                    .inc();
            }
        }
        let now = self.machine.stage();
        if self.counted != Some(now) {
            if let Some(old) = self.counted {
                self.metrics.stages.with_label_values(&[old.as_str()]).dec();
            }
            self.metrics.stages.with_label_values(&[now.as_str()]).inc();
            self.counted = Some(now);
        }
    }
}

impl Actor for LifecycleAgent {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        let t = self.machine.start();
        self.track(t.as_ref());
        if let Some(t) = t {
            tracing::info!(target = %self.target, stage = %t.to, "agent initialized");
            self.outbox.send(message(&self.target, 0, 0, t));
        }
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(old) = self.counted.take() {
            self.metrics.stages.with_label_values(&[old.as_str()]).dec();
        }
    }
}

impl Handler<Retire> for LifecycleAgent {
    type Result = ();

    /// Its target was deregistered `actors.retire_after_secs` ago.
    fn handle(&mut self, _: Retire, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<Deliver> for LifecycleAgent {
    type Result = ();

    fn handle(&mut self, Deliver(ev): Deliver, ctx: &mut Self::Context) {
        if let Some(field) = non_finite_field(&ev) {
            self.metrics
                .non_finite
                .with_label_values(&[ev.kind().as_str()])
                .inc();
            tracing::warn!(target = %self.target, event = %ev.kind(), episode = ev.episode(), field, "refused: a value is not finite");
            return;
        }
        let (t, episode, step) = match &ev {
            Event::Episode(ep) => (self.machine.observe(ep), ep.episode, ep.step),
            Event::Model(m) if self.machine.could_promote(m) => {
                // Verified on the blocking pool (the store may read over the network); the
                // mailbox waits, so the next event sees the outcome.
                let (models, m) = (self.models.clone(), m.clone());
                let verify = tokio::task::spawn_blocking(move || {
                    let res = verify_model(models.as_ref(), &m);
                    (m, res)
                });
                ctx.wait(verify.into_actor(self).map(|joined, act, _| match joined {
                    Ok((m, Ok(()))) => act.take_model(&m),
                    Ok((m, Err(e))) => {
                        act.metrics.unverified_models.inc();
                        tracing::warn!(target = %act.target, version = m.version, uri = %m.uri, error = %e, "model ignored: its checkpoint does not verify");
                    }
                    Err(e) => {
                        act.metrics.unverified_models.inc();
                        tracing::error!(target = %act.target, error = %e, "model verification task failed");
                    }
                }));
                return;
            }
            Event::Model(m) => {
                self.take_model(m);
                return;
            }
            Event::Registration(r) => {
                let change = self.registered.apply(r);
                log_change(
                    crate::NAME,
                    &self.registrations,
                    &r.target,
                    r.generation,
                    &change,
                );
                match change {
                    Change::Registered {
                        spec, lifecycle, ..
                    } => {
                        self.machine.set_slo(&spec.slo);
                        match lifecycle {
                            Some(p) => (self.machine.set_profile(p), 0, 0),
                            None => return,
                        }
                    }
                    _ => return,
                }
            }
            _ => return,
        };
        self.track(t.as_ref());
        if let Some(t) = t {
            tracing::info!(target = %self.target, from = %t.from, to = %t.to, reason = %t.reason, mean = ?t.mean, window = t.window, budget_return = t.budget_return, "lifecycle transition");
            self.outbox.send(message(&self.target, episode, step, t));
        }
    }
}

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let (outbox, publisher) = spawn_publisher(ctx.clone());
    let profile = ctx.config.lifecycle.clone();
    let rules: MonitorConfig = ctx.config.section("lifecycle_monitor")?;
    rules.validate().map_err(|e| {
        ServiceError::Config(aware_shared::config::ConfigError::Invalid {
            key: format!("lifecycle_monitor.{}", e.key),
            reason: e.reason.to_string(),
        })
    })?;
    // A restart resumes every target at the stage the previous run published (NATS with the
    // JetStream capture; the embedded bus's retained messages).
    let restored: std::collections::HashMap<Target, Stage> = ctx
        .current_state(EventKind::Lifecycle)
        .await
        .into_iter()
        .filter_map(|ev| match ev {
            Event::Lifecycle(l) => Some((l.target, l.stage)),
            _ => None,
        })
        .collect();
    if !restored.is_empty() {
        tracing::info!(targets = restored.len(), "stages restored from the capture");
    }
    // Shared by the actors' factory and the retirement hook, both called on the intake's thread.
    let restored = std::rc::Rc::new(std::cell::RefCell::new(restored));
    let store_cfg: ModelStoreConfig = ctx.config.section("model_store")?;
    let models = open_model_store(&store_cfg, &ctx.bus, &ctx.config.bus)
        .await
        .map_err(|e| ServiceError::resource("model_store", e))?;
    let registrations = ctx.metrics.registrations.clone();
    let metrics = LifecycleMetrics::new(&ctx.metrics)?;
    let config = ctx.config.clone();
    let resume = restored.clone();
    let retiring_outbox = outbox.clone();
    let mut actors = TargetActors::spread(&ctx, move |t: &Target| {
        let mut machine = LifecycleMachine::with_rules(profile.clone(), rules.clone());
        // The configured SLO until a registration brings the target's own.
        machine.set_slo(&config.spec_for(t).slo);
        machine
            .set_slo_first(config.learning.objective.mode == aware_mdp::ObjectiveMode::Constrained);
        machine.set_prices(config.learning.objective.prices);
        // Only the target's first actor resumes there: one started again after a retirement is
        // for a target deleted and created again.
        if let Some(stage) = resume.borrow_mut().remove(t) {
            machine.restore(stage);
        }
        LifecycleAgent {
            target: t.clone(),
            machine,
            outbox: outbox.clone(),
            registered: Registered::default(),
            registrations: registrations.clone(),
            metrics: metrics.clone(),
            counted: None,
            models: models.clone(),
        }
    })
    // A retired target (deleted, and not created again within `actors.retire_after_secs`) has
    // its stage forgotten on the bus and here: created again after a restart, it starts afresh
    // as it would in this run, not at a stage whose model the trainer forgets.
    .with_on_retired(move |t: &Target| {
        restored.borrow_mut().remove(t);
        retiring_outbox.forget_state(EventKind::Lifecycle, t);
    });
    for spec in &ctx.config.targets {
        actors.get_or_start(&spec.target());
    }
    run_actors(&ctx, CONSUMES, &mut actors).await?;
    drop(actors);
    aware_shared::agents::join_publisher(publisher).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::tests::episode;

    /// A NaN or an infinite reward or estimate is refused before Algorithm 1 sees it (NaN
    /// compares false with every threshold: it used to count as an episode that fails them all).
    #[test]
    fn episodes_and_models_with_non_finite_values_are_refused() {
        let e = episode(Stage::Offline, 1.0, Some(0.9));
        assert_eq!(non_finite_field(&Event::Episode(e.clone())), None);
        let mut bad = e.clone();
        bad.mean_reward = f64::NAN;
        assert_eq!(non_finite_field(&Event::Episode(bad)), Some("mean_reward"));
        let mut bad = e.clone();
        bad.policy_estimate = Some(f64::INFINITY);
        assert_eq!(
            non_finite_field(&Event::Episode(bad)),
            Some("policy_estimate")
        );
        let Some(Event::Model(mut m)) = aware_bus_schemas::generated::samples()
            .into_iter()
            .find(|e| matches!(e, Event::Model(_)))
        else {
            unreachable!()
        };
        m.policy_estimate = Some(1.0);
        m.behaviour_reward = Some(0.5);
        assert_eq!(non_finite_field(&Event::Model(m.clone())), None);
        m.behaviour_reward = Some(f64::NAN);
        assert_eq!(non_finite_field(&Event::Model(m)), Some("behaviour_reward"));
    }
}
