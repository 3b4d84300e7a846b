//! The actuator service: one actix actor per target decides every `action` with the guardrails,
//! applies it to the configured sink and publishes `applied` (outcome, allocation in force,
//! clamped dimensions, reason).
//!
//! Sinks: `simulator` — the decision itself is the application: the simulated cluster (owned by
//! the metrics collector) applies every `applied` it receives; `kubernetes` — the Kubernetes API
//! (scale subresource, in-place resize or template patch). Calls to the API are made one at a
//! time per target (the actor waits for them), so a target's decisions apply in order; each
//! decision reads the target once and applies from that read; at most
//! `actuator.kubernetes.max_concurrent_calls` decisions talk to the API at once across targets
//! (the others wait in the actuator).
//!
//! Nothing an `action` claims is trusted but its request: the allocation in force comes from the
//! sink and the step must be the one the collector reported last (see [`TargetActuator`]).
//!
//! **Shutdown** (SIGTERM, SIGINT): the actors take no new action (an action not yet decided —
//! also one still waiting for a sink slot — gets no `applied` and no sink call), the sink calls in flight finish — for at most
//! `actuator.shutdown_timeout_ms` — and queue their `applied`, then the publisher publishes what
//! is queued and flushes the bus. A change written to the Deployment thus has its `applied`,
//! unless the call outlasts the timeout (logged).

use std::sync::Arc;

use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, WrapFuture};
use aware_bus_schemas::{Action, Applied, Event, EventKind, Outcome, Resources, Schema, Target};
use aware_shared::agents::{
    run_actors, spawn_publisher_until, Deliver, Outbox, Retire, TargetActors,
};
use aware_shared::registry::{log_change, Change, Registered};
use aware_shared::service::{ServiceContext, ServiceError};
use aware_shared::spec::TargetSpec;
use aware_shared::telemetry::{ServiceMetrics, TelemetryError};
use prometheus::IntCounterVec;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::guardrails::{Decision, GuardState, GuardrailConfig, Guardrails, StepId};
use crate::sink::{ApplyReport, KubernetesSink, KubernetesSinkConfig, LimitsRule, Sink, SinkError};

/// Where decisions are applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SinkKind {
    #[default]
    Simulator,
    Kubernetes,
}

/// The `[actuator]` configuration section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActuatorConfig {
    pub sink: SinkKind,
    pub guardrails: GuardrailConfig,
    pub kubernetes: KubernetesSinkConfig,
    /// At shutdown, how long the sink calls in flight may take to finish (and have their
    /// `applied` published) before the service exits without them.
    pub shutdown_timeout_ms: u64,
}

impl Default for ActuatorConfig {
    fn default() -> Self {
        ActuatorConfig {
            sink: SinkKind::default(),
            guardrails: GuardrailConfig::default(),
            kubernetes: KubernetesSinkConfig::default(),
            shutdown_timeout_ms: 10_000,
        }
    }
}

/// The sink calls in flight across a service's actors, so that shutdown can wait for them.
#[derive(Debug, Clone)]
pub struct InFlight(Arc<tokio::sync::watch::Sender<usize>>);

/// One sink call in flight; dropping it ends the call (after its `applied` is queued).
#[derive(Debug)]
pub struct InFlightCall(Arc<tokio::sync::watch::Sender<usize>>);

impl Default for InFlight {
    fn default() -> Self {
        InFlight(Arc::new(tokio::sync::watch::channel(0).0))
    }
}

impl InFlight {
    pub fn start(&self) -> InFlightCall {
        self.0.send_modify(|n| *n += 1);
        InFlightCall(self.0.clone())
    }

    pub fn count(&self) -> usize {
        *self.0.borrow()
    }

    /// Waits until no call is in flight.
    pub async fn idle(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

impl Drop for InFlightCall {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// The actuator's own metrics.
#[derive(Clone)]
pub struct ActuatorMetrics {
    pub decisions: IntCounterVec,
    pub clamped: IntCounterVec,
    pub sink_errors: IntCounterVec,
    /// The service's `registrations_total`.
    pub registrations: IntCounterVec,
    /// Actions refused without a decision: for a step the collector never reported
    /// (`unreported`), or replaced by a later one while held for their `obs` (`superseded`).
    pub refused: IntCounterVec,
}

impl ActuatorMetrics {
    pub fn new(m: &ServiceMetrics) -> Result<Self, TelemetryError> {
        // Every series at 0 from the start, so a scrape (and an alert's rate) sees it.
        let outcomes = [Outcome::Applied, Outcome::RecommendOnly, Outcome::Rejected]
            .map(|o| [outcome_label(o)]);
        Ok(ActuatorMetrics {
            decisions: m.counter_vec(
                "actuator_decisions_total",
                "Decisions by outcome (applied, recommend_only, rejected)",
                &["outcome"],
                &outcomes,
            )?,
            clamped: m.counter_vec(
                "actuator_clamped_total",
                "Dimensions clamped by bounds, step limits, cooldowns or the minimum change",
                &["dimension"],
                &[&["replicas"], &["cpu"], &["memory"]],
            )?,
            sink_errors: m.counter_vec(
                "actuator_sink_errors_total",
                "Failed sink calls",
                &["sink"],
                &[&["kubernetes"]],
            )?,
            registrations: m.registrations.clone(),
            refused: m.counter_vec(
                "actuator_refused_actions_total",
                "Actions refused undecided: for a step the collector never reported, or superseded while held",
                &["reason"],
                &[&["unreported"], &["superseded"]],
            )?,
        })
    }
}

/// The sink in use.
pub enum SinkImpl {
    Simulator,
    Kubernetes(Arc<KubernetesSink>),
}

impl SinkImpl {
    fn name(&self) -> &'static str {
        match self {
            SinkImpl::Simulator => "simulator",
            SinkImpl::Kubernetes(k) => k.name(),
        }
    }
}

fn outcome_label(o: Outcome) -> &'static str {
    match o {
        Outcome::Applied => "applied",
        Outcome::RecommendOnly => "recommend_only",
        Outcome::Rejected => "rejected",
    }
}

/// The `applied` message for a decision.
pub fn applied_message(a: &Action, d: &Decision, sink: &str) -> Applied {
    Applied {
        schema: Schema::new(),
        target: a.target.clone(),
        episode: a.episode,
        step: a.step,
        ts_ms: a.ts_ms,
        outcome: d.outcome,
        source: a.source,
        requested: a.desired,
        applied: d.applied,
        clamped: d.clamped.clone(),
        reason: d.reason.clone(),
        sink: sink.to_string(),
    }
}

/// The latest `obs` of a target the actuator received from the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    /// Its step: the only step an action is decided for.
    pub step: StepId,
    /// The allocation in force it reports (`None` when incomplete or without usable limits).
    pub allocation: Option<Resources>,
}

/// What the actor does with an action, judged against the collector's own sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// For the step the collector reported last: decided now.
    Decide,
    /// For the step right after it (its `obs` may still be on its way: the `obs` and `action`
    /// subscriptions are delivered independently): held until that `obs` arrives.
    Hold,
    /// For a step the collector has moved past: rejected and reported in `applied`.
    Stale,
    /// For a step the collector never reported (a forged or corrupt number): refused without an
    /// `applied` and without moving any mark.
    Unreported,
}

/// Whether `step` directly follows `last` (the next step of the episode or the first of the
/// next one).
fn follows(step: StepId, last: StepId) -> bool {
    (step.episode == last.episode && Some(step.step) == last.step.checked_add(1))
        || (Some(step.episode) == last.episode.checked_add(1) && step.step == 0)
}

/// How an action for `step` is admitted given the latest reported step (`None`: no `obs` seen
/// yet, e.g. right after a restart: held until the next `obs` says which step is current).
pub fn admit(step: StepId, reported: Option<StepId>) -> Admission {
    match reported {
        None => Admission::Hold,
        Some(r) if step == r => Admission::Decide,
        Some(r) if step < r => Admission::Stale,
        Some(r) if follows(step, r) => Admission::Hold,
        Some(_) => Admission::Unreported,
    }
}

/// The actor of one target.
///
/// **Where the allocation in force comes from.** Never from the `action` (its `current` is what
/// the sender claims): with the Kubernetes sink it is read from the Deployment before every
/// decision ([`Sink::current`]); with the simulator sink it is the allocation the collector
/// reports in the `obs` of the step being decided. The simulated cluster lives in the
/// collector, and its `obs` is the only account of what is in force there: the actuator's own
/// record of what it last applied would be wrong after a collector restart (the cluster is
/// rebuilt), after a late step (the collector held the allocation) and after an actuator
/// restart (no record). The per-step limits are computed from that value.
///
/// **Staleness.** An action is decided only for the step the collector reported last (the
/// newest `obs` received, see [`admit`]); the guardrails' duplicate check ([`GuardState`]) then
/// keeps one decision per step. A number chosen by a sender never moves the mark: an action for
/// a step that was never reported is refused and counted. When the collector's numbering goes
/// back (a collector restarted without its capture starts again at episode 0), the actuator
/// follows it and forgets its last applied step.
pub struct TargetActuator {
    spec: TargetSpec,
    /// Registration by the controller: a deregistered target is never touched again (its
    /// actions are rejected), so it keeps its last applied resources.
    registered: Registered,
    state: GuardState,
    reported: Option<Reported>,
    /// An action for the step after the reported one, waiting for its `obs`.
    held: Option<Action>,
    /// The last allocation known to be in force (from an `obs` or the sink), for the `applied`
    /// of a rejection.
    last_known: Option<Resources>,
    guards: Arc<Guardrails>,
    sink: Arc<SinkImpl>,
    outbox: Outbox,
    metrics: ActuatorMetrics,
    /// The service's shutdown: once cancelled, no new action is taken.
    shutdown: CancellationToken,
    in_flight: InFlight,
}

impl Actor for TargetActuator {
    type Context = Context<Self>;
}

impl Handler<Retire> for TargetActuator {
    type Result = ();

    /// Its target was deregistered `actors.retire_after_secs` ago.
    fn handle(&mut self, _: Retire, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl TargetActuator {
    /// The actor of a target with `spec` (from the configuration until a registration arrives).
    /// It takes no action once `shutdown` is cancelled, and counts its sink calls in `in_flight`.
    pub fn new(
        spec: TargetSpec,
        guards: Arc<Guardrails>,
        sink: Arc<SinkImpl>,
        outbox: Outbox,
        metrics: ActuatorMetrics,
        shutdown: CancellationToken,
        in_flight: InFlight,
    ) -> Self {
        TargetActuator {
            spec,
            registered: Registered::default(),
            state: GuardState::default(),
            reported: None,
            held: None,
            last_known: None,
            guards,
            sink,
            outbox,
            metrics,
            shutdown,
            in_flight,
        }
    }

    /// `current` was in force before the decision `d` for `a`.
    fn publish(&mut self, a: &Action, d: &Decision, current: Resources) {
        self.metrics
            .decisions
            .with_label_values(&[outcome_label(d.outcome)])
            .inc();
        for dim in &d.clamped {
            self.metrics
                .clamped
                .with_label_values(&[dim.as_str()])
                .inc();
        }
        if d.outcome == Outcome::Applied {
            self.state.record(
                StepId {
                    episode: a.episode,
                    step: a.step,
                },
                current,
                d.applied,
                a.ts_ms,
            );
            self.last_known = Some(d.applied);
        }
        self.outbox.send(applied_message(a, d, self.sink.name()));
    }

    /// Rejects `a` with `reason`, reporting the allocation last known to be in force (the
    /// action's own claim only when nothing is known: the simulated cluster holds its
    /// allocation on a rejection whatever it says).
    fn reject(&mut self, a: &Action, reason: String) {
        let current = self.last_known.unwrap_or(a.current);
        let d = Decision {
            outcome: Outcome::Rejected,
            applied: current,
            recommended: current,
            clamped: Vec::new(),
            reason: Some(reason),
        };
        self.publish(a, &d, current);
    }

    /// Refuses an action for a step the collector never reported: counted and logged, no
    /// `applied` (it would record a step that never happened).
    fn refuse(&mut self, a: &Action, why: &str) {
        self.metrics.refused.with_label_values(&[why]).inc();
        tracing::warn!(target = %a.target, episode = a.episode, step = a.step, reported = ?self.reported.map(|r| r.step), why, "action refused: not for a step the collector reported");
    }

    fn on_obs(&mut self, o: &aware_bus_schemas::Obs, ctx: &mut Context<Self>) {
        let step = StepId {
            episode: o.episode,
            step: o.step,
        };
        if let Some(prev) = self.reported {
            if step < prev.step {
                tracing::info!(target = %o.target, from = %prev.step, to = %step, "the collector's numbering went back (restarted without its capture): following it");
                self.state.last_applied = None;
            }
        }
        let allocation = if o.complete {
            aware_shared::spec::allocation_in_force(&o.metrics)
        } else {
            None
        };
        if allocation.is_some() {
            self.last_known = allocation;
        }
        self.reported = Some(Reported { step, allocation });
        if let Some(a) = self.held.take() {
            let held = StepId {
                episode: a.episode,
                step: a.step,
            };
            if held == step {
                self.decide(a, ctx);
            } else {
                self.refuse(&a, "unreported");
            }
        }
    }

    fn on_action(&mut self, a: Action, ctx: &mut Context<Self>) {
        if self.registered.is_deregistered() {
            self.reject(
                &a,
                "target deregistered: its AwareAutoscaler was deleted".to_string(),
            );
            return;
        }
        let step = StepId {
            episode: a.episode,
            step: a.step,
        };
        match admit(step, self.reported.map(|r| r.step)) {
            Admission::Decide => self.decide(a, ctx),
            Admission::Hold => {
                if let Some(prev) = self.held.replace(a) {
                    self.refuse(&prev, "superseded");
                }
            }
            Admission::Stale => {
                let last = self.reported.map(|r| r.step).unwrap_or(step);
                self.reject(
                    &a,
                    format!("stale action: {step} is older than the collector's current {last}"),
                );
            }
            Admission::Unreported => self.refuse(&a, "unreported"),
        }
    }

    /// Decides an action for the reported step with the allocation in force read from the sink
    /// (see the type's documentation), applies it and publishes `applied`.
    fn decide(&mut self, a: Action, ctx: &mut Context<Self>) {
        let step = StepId {
            episode: a.episode,
            step: a.step,
        };
        // Counted before the check: shutdown either sees this call in flight or it sees the
        // cancellation and never starts.
        let call = self.in_flight.start();
        if self.shutdown.is_cancelled() {
            tracing::info!(target = %a.target, %step, "shutting down: action not taken");
            return;
        }
        match &*self.sink {
            SinkImpl::Simulator => {
                let Some(current) = self.reported.and_then(|r| r.allocation) else {
                    self.reject(
                        &a,
                        "allocation in force unknown: the step's obs is incomplete".to_string(),
                    );
                    return;
                };
                let d =
                    self.guards
                        .decide(&self.spec, &self.state, current, step, a.desired, a.ts_ms);
                self.publish(&a, &d, current);
            }
            SinkImpl::Kubernetes(k) => {
                let k = k.clone();
                let guards = self.guards.clone();
                let spec = self.spec.clone();
                let state = self.state;
                let target = a.target.clone();
                let (desired, ts_ms) = (a.desired, a.ts_ms);
                let shutdown = self.shutdown.clone();
                // One call at a time per target (`wait`): decisions apply in order.
                let fut = async move {
                    // The container is the registration's (or the configuration's), never the
                    // action's: the actuator trusts only its own registration state.
                    let container = spec.container.as_deref();
                    // At most `max_concurrent_calls` decisions talk to the API at once; the
                    // others wait here, in order of arrival. One still waiting at shutdown has
                    // not been decided: it is dropped like an action arriving after it.
                    let _slot = tokio::select! {
                        slot = k.slot() => slot,
                        () = shutdown.cancelled() => return KubeOutcome::NotTaken,
                    };
                    // One read: decided from it, applied from it (its `resourceVersion` is the
                    // template patch's precondition).
                    let read = match k.read(&target, container).await {
                        Ok(r) => r,
                        Err(e) => return KubeOutcome::Failed(None, e),
                    };
                    let current = read.in_force;
                    let d = guards.decide_within(
                        &spec,
                        &state,
                        current,
                        step,
                        desired,
                        ts_ms,
                        &read.container_resources,
                    );
                    if !d.changes(&current) {
                        return KubeOutcome::Decided(current, d);
                    }
                    let rule = LimitsRule::of(&spec);
                    match k.apply_read(&target, &read, d.applied, rule).await {
                        Ok(report) => KubeOutcome::Decided(current, with_report(d, report)),
                        Err(e) => KubeOutcome::Failed(Some(current), e),
                    }
                };
                ctx.wait(fut.into_actor(self).map(move |res, act, _| {
                    match res {
                        KubeOutcome::Decided(current, d) => act.publish(&a, &d, current),
                        KubeOutcome::NotTaken => {
                            tracing::info!(target = %a.target, %step, "shutting down: action not taken");
                        }
                        KubeOutcome::Failed(current, e) => {
                            act.metrics
                                .sink_errors
                                .with_label_values(&["kubernetes"])
                                .inc();
                            tracing::warn!(target = %a.target, error = %e, "kubernetes sink failed");
                            if current.is_some() {
                                act.last_known = current;
                            }
                            act.reject(&a, format!("sink error: {e}"));
                        }
                    }
                    // The `applied` is queued: the call is over.
                    drop(call);
                }));
            }
        }
    }
}

/// What a decision with the Kubernetes sink came to.
enum KubeOutcome {
    /// Decided with the allocation read from the Deployment (and applied, if it changes it).
    Decided(Resources, Decision),
    /// Reading (no allocation known) or applying failed.
    Failed(Option<Resources>, SinkError),
    /// The service shut down while the decision waited for a sink slot: nothing was read or
    /// written, nothing is published.
    NotTaken,
}

/// The decision `d` after the sink applied it: the allocation in force it reports and its
/// notes.
fn with_report(mut d: Decision, report: ApplyReport) -> Decision {
    d.applied = report.in_force;
    if !report.notes.is_empty() {
        let notes = report.notes.join("; ");
        d.reason = Some(match d.reason.take() {
            Some(r) => format!("{r}; {notes}"),
            None => notes,
        });
    }
    d
}

impl Handler<Deliver> for TargetActuator {
    type Result = ();

    fn handle(&mut self, Deliver(ev): Deliver, ctx: &mut Self::Context) {
        match ev {
            Event::Action(a) => self.on_action(a, ctx),
            Event::Obs(o) => self.on_obs(&o, ctx),
            Event::Registration(r) => {
                let change = self.registered.apply(&r);
                log_change(
                    crate::NAME,
                    &self.metrics.registrations,
                    &r.target,
                    r.generation,
                    &change,
                );
                if let Change::Registered { spec, changed, .. } = change {
                    let capped = self.guards.config().capped(&spec.bounds);
                    if changed && capped != spec.bounds {
                        tracing::warn!(target = %r.target, registered = ?spec.bounds, applied = ?capped, "registered bounds above the actuator's ceilings (actuator.guardrails.max_*): capped");
                    }
                    self.spec = spec;
                }
            }
            _ => {}
        }
    }
}

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let cfg: ActuatorConfig = ctx.config.section("actuator")?;
    let sink = Arc::new(match cfg.sink {
        SinkKind::Simulator => SinkImpl::Simulator,
        SinkKind::Kubernetes => {
            let client = kube::Client::try_default()
                .await
                .map_err(|e| ServiceError::resource("kubernetes client", e))?;
            SinkImpl::Kubernetes(Arc::new(
                KubernetesSink::new(client, cfg.kubernetes.clone())
                    .map_err(|e| ServiceError::resource("actuator.kubernetes", e))?,
            ))
        }
    });
    run_with_sink(ctx, cfg, sink).await
}

/// [`run`] with the sink given (`cfg.sink` and `cfg.kubernetes` are not read).
pub async fn run_with_sink(
    ctx: ServiceContext,
    cfg: ActuatorConfig,
    sink: Arc<SinkImpl>,
) -> Result<(), ServiceError> {
    let guards = Arc::new(
        Guardrails::new(cfg.guardrails)
            .map_err(|e| ServiceError::resource("actuator.guardrails", e))?,
    );
    let metrics = ActuatorMetrics::new(&ctx.metrics)?;
    // The publisher outlives the shutdown until the sink calls in flight have queued their
    // `applied` (see the module's documentation).
    let publishing = CancellationToken::new();
    let (outbox, publisher) = spawn_publisher_until(ctx.clone(), publishing.clone());
    let in_flight = InFlight::default();
    let specs = ctx.config.spec_index();
    // Cancelled with the service's shutdown, or when the intake fails.
    let stopping = ctx.shutdown.child_token();
    let (shutdown, calls) = (stopping.clone(), in_flight.clone());
    let mut actors = TargetActors::spread(&ctx, move |t: &Target| {
        TargetActuator::new(
            specs.spec_for(t),
            guards.clone(),
            sink.clone(),
            outbox.clone(),
            metrics.clone(),
            shutdown.clone(),
            calls.clone(),
        )
    });
    // The newest captured `obs` of every target first: after a restart, the action of the step
    // in flight is decided instead of waiting for the next step.
    for ev in ctx.current_state(EventKind::Obs).await {
        actors.route(ev);
    }
    let ran = run_actors(&ctx, crate::CONSUMES, &mut actors).await;
    // No new action from here on (the actors see the cancellation); the calls in flight finish.
    stopping.cancel();
    let timeout = std::time::Duration::from_millis(cfg.shutdown_timeout_ms);
    if tokio::time::timeout(timeout, in_flight.idle())
        .await
        .is_err()
    {
        tracing::warn!(
            in_flight = in_flight.count(),
            timeout_ms = cfg.shutdown_timeout_ms,
            "sink calls still in flight at the shutdown timeout: exiting without their applied"
        );
    }
    drop(actors);
    publishing.cancel();
    let published = aware_shared::agents::join_publisher(publisher).await;
    ran?;
    published
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(episode: u64, step: u32) -> StepId {
        StepId { episode, step }
    }

    /// Only the reported step is decided; the next one waits for its `obs`; anything older is
    /// stale; anything further (a forged episode 2^40, a skipped step) was never reported.
    #[test]
    fn actions_are_admitted_against_the_collectors_last_reported_step() {
        let r = Some(at(38, 12));
        assert_eq!(admit(at(38, 12), r), Admission::Decide);
        assert_eq!(admit(at(38, 13), r), Admission::Hold);
        assert_eq!(admit(at(39, 0), r), Admission::Hold);
        assert_eq!(admit(at(38, 11), r), Admission::Stale);
        assert_eq!(admit(at(0, 4), r), Admission::Stale);
        assert_eq!(admit(at(1 << 40, 0), r), Admission::Unreported);
        assert_eq!(admit(at(38, 14), r), Admission::Unreported);
        assert_eq!(admit(at(39, 1), r), Admission::Unreported);
        assert_eq!(
            admit(at(u64::MAX, u32::MAX), Some(at(u64::MAX, u32::MAX))),
            Admission::Decide
        );
        assert_eq!(
            admit(at(0, 0), Some(at(u64::MAX, u32::MAX))),
            Admission::Stale
        );
        // Nothing reported yet (a restart): held until the next `obs` says which step is current.
        assert_eq!(admit(at(1 << 40, 0), None), Admission::Hold);
    }

    fn deployment(cpu: &str) -> serde_json::Value {
        let container = serde_json::json!({
            "name": "app",
            "image": "ghcr.io/example/web:1.4.2",
            "resources": {
                "limits": {"cpu": cpu, "memory": "512Mi"},
                "requests": {"cpu": cpu, "memory": "512Mi"}
            }
        });
        serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [container]}
                }
            }
        })
    }

    /// With the Kubernetes sink the allocation in force is read from the Deployment: an action
    /// claiming 64 cores in force moves the CPU request of a 500m Deployment by the step limit
    /// around 500m (to 750m, its limit with it), not around what the action claims (which
    /// allowed 2048m).
    #[actix::test]
    async fn the_kubernetes_sink_decides_from_the_deployment_not_the_action() {
        use aware_shared::kube_mock::{get, patch, serve};
        const DEPLOY: &str = "/apis/apps/v1/namespaces/shop/deployments/web";
        // One read of the Deployment: the decision is made from it and applied from it.
        let script = vec![
            get(DEPLOY, 200, deployment("500m")),
            patch(
                &format!("{DEPLOY}?&fieldManager=aware-actuator"),
                "application/strategic-merge-patch+json",
                serde_json::json!({"spec": {"template": {"spec": {"containers": [{"name": "app",
                    "resources": {"limits": {"cpu": "750m", "memory": "512Mi"},
                                  "requests": {"cpu": "750m", "memory": "512Mi"}}}]}}}}),
                200,
                deployment("750m"),
            ),
        ];
        let (client, server) = serve(script);
        let sink_cfg = KubernetesSinkConfig {
            defaults: crate::sink::TargetSinkConfig {
                vertical_mode: crate::sink::VerticalMode::TemplatePatch,
                ..Default::default()
            },
            ..Default::default()
        };
        let sink = Arc::new(SinkImpl::Kubernetes(Arc::new(
            KubernetesSink::new(client, sink_cfg).unwrap(),
        )));
        let bus = aware_shared::bus::Bus::in_process(64);
        let ctx = ServiceContext::new(
            crate::NAME,
            bus.clone(),
            Arc::new(aware_shared::config::AppConfig::default()),
            tokio_util::sync::CancellationToken::new(),
        )
        .unwrap();
        let mut applied = bus.subscribe("aware.v1.applied.>").await.unwrap();
        let (outbox, _publisher) = aware_shared::agents::spawn_publisher(ctx.clone());
        let t = Target::new("shop", "web");
        let actor = TargetActuator::new(
            TargetSpec::new(&t),
            Arc::new(Guardrails::new(GuardrailConfig::default()).unwrap()),
            sink,
            outbox,
            ActuatorMetrics::new(&ctx.metrics).unwrap(),
            CancellationToken::new(),
            InFlight::default(),
        )
        .start();
        let samples = aware_bus_schemas::generated::samples();
        let Some(Event::Obs(mut o)) = samples.iter().find(|e| e.kind() == EventKind::Obs).cloned()
        else {
            unreachable!()
        };
        let Some(Event::Action(mut a)) =
            samples.into_iter().find(|e| e.kind() == EventKind::Action)
        else {
            unreachable!()
        };
        (o.target, o.episode, o.step) = (t.clone(), 0, 1);
        (a.target, a.episode, a.step) = (t, 0, 1);
        a.current = Resources {
            replicas: 2,
            cpu_millicores: 64_000,
            memory_bytes: 256 << 30,
        };
        a.desired = Resources {
            replicas: 2,
            cpu_millicores: 4000,
            memory_bytes: 512 << 20,
        };
        actor.do_send(Deliver(Event::Obs(o)));
        actor.do_send(Deliver(Event::Action(a)));
        let m = tokio::time::timeout(std::time::Duration::from_secs(5), applied.next())
            .await
            .unwrap()
            .unwrap();
        let Ok(Event::Applied(d)) = aware_bus_schemas::decode_event(EventKind::Applied, &m.payload)
        else {
            unreachable!()
        };
        assert_eq!(d.outcome, Outcome::Applied, "{d:?}");
        assert_eq!(d.applied.cpu_millicores, 750, "{d:?}");
        // The actor (and with it the client) gone, the server checks its whole script was served.
        drop(actor);
        tokio::time::timeout(std::time::Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
    }

    /// SIGTERM while a sink call is in flight: the call finishes, its `applied` is published
    /// before the service exits (the Deployment was written: the recorder must see it), and
    /// neither an action queued behind it nor another target's action waiting for the only sink
    /// slot is taken (the API server's script has no further request).
    #[actix::test]
    async fn shutdown_lets_the_sink_call_in_flight_publish_its_applied() {
        use aware_shared::kube_mock::{get, patch, serve};
        const DEPLOY: &str = "/apis/apps/v1/namespaces/shop/deployments/web";
        let arrived = Arc::new(tokio::sync::Notify::new());
        // One read of the Deployment: the decision is made from it and applied from it.
        let script = vec![
            get(DEPLOY, 200, deployment("500m")),
            patch(
                &format!("{DEPLOY}?&fieldManager=aware-actuator"),
                "application/strategic-merge-patch+json",
                serde_json::json!({"spec": {"template": {"spec": {"containers": [{"name": "app",
                    "resources": {"limits": {"cpu": "750m", "memory": "512Mi"},
                                  "requests": {"cpu": "750m", "memory": "512Mi"}}}]}}}}),
                200,
                deployment("750m"),
            )
            .slow(std::time::Duration::from_millis(1500), arrived.clone()),
        ];
        let (client, server) = serve(script);
        let cfg = ActuatorConfig {
            kubernetes: KubernetesSinkConfig {
                defaults: crate::sink::TargetSinkConfig {
                    vertical_mode: crate::sink::VerticalMode::TemplatePatch,
                    ..Default::default()
                },
                max_concurrent_calls: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let sink = Arc::new(SinkImpl::Kubernetes(Arc::new(
            KubernetesSink::new(client, cfg.kubernetes.clone()).unwrap(),
        )));
        let bus = aware_shared::bus::Bus::in_process(64);
        let ctx = ServiceContext::new(
            crate::NAME,
            bus.clone(),
            Arc::new(aware_shared::config::AppConfig::default()),
            CancellationToken::new(),
        )
        .unwrap();
        let mut applied = bus.subscribe("aware.v1.applied.>").await.unwrap();
        let service = actix::spawn(run_with_sink(ctx.clone(), cfg, sink));
        for _ in 0..500 {
            if ctx.ready.get() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(ctx.ready.get(), "the actuator never became ready");

        let samples = aware_bus_schemas::generated::samples();
        let Some(Event::Obs(mut o)) = samples.iter().find(|e| e.kind() == EventKind::Obs).cloned()
        else {
            unreachable!()
        };
        let Some(Event::Action(mut a)) =
            samples.into_iter().find(|e| e.kind() == EventKind::Action)
        else {
            unreachable!()
        };
        let t = Target::new("shop", "web");
        (o.target, o.episode, o.step) = (t.clone(), 0, 1);
        (a.target, a.episode, a.step) = (t, 0, 1);
        a.desired = Resources {
            replicas: 2,
            cpu_millicores: 4000,
            memory_bytes: 512 << 20,
        };
        ctx.publish_event(&Event::Obs(o.clone())).await.unwrap();
        ctx.publish_event(&Event::Action(a.clone())).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), arrived.notified())
            .await
            .expect("the template patch never reached the API server");
        // Another target's action, waiting for the only sink slot (`max_concurrent_calls` 1).
        let (mut other_obs, mut other) = (o.clone(), a.clone());
        (other_obs.target, other.target) = (Target::new("shop", "api"), Target::new("shop", "api"));
        ctx.publish_event(&Event::Obs(other_obs)).await.unwrap();
        ctx.publish_event(&Event::Action(other)).await.unwrap();
        // The next step's action, queued behind the call in flight.
        (o.step, a.step) = (2, 2);
        ctx.publish_event(&Event::Obs(o)).await.unwrap();
        ctx.publish_event(&Event::Action(a)).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        // SIGTERM.
        ctx.shutdown.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(10), service)
            .await
            .expect("the actuator did not stop")
            .unwrap()
            .unwrap();
        let m = tokio::time::timeout(std::time::Duration::from_secs(2), applied.next())
            .await
            .expect("the applied of the call in flight was never published")
            .unwrap();
        let Ok(Event::Applied(d)) = aware_bus_schemas::decode_event(EventKind::Applied, &m.payload)
        else {
            unreachable!()
        };
        assert_eq!((d.episode, d.step), (0, 1), "{d:?}");
        assert_eq!(d.outcome, Outcome::Applied, "{d:?}");
        assert_eq!(d.applied.cpu_millicores, 750, "{d:?}");
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(300), applied.next())
                .await
                .is_err(),
            "an action queued at shutdown (behind the call in flight, or waiting for a sink slot) was taken"
        );
        // The server saw its whole script and nothing more once the service let go of the client.
        tokio::time::timeout(std::time::Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
    }
}
