//! The actuator service: one actix actor per target decides every `action` with the guardrails,
//! applies it to the configured sink and publishes `applied` (outcome, allocation in force,
//! clamped dimensions, reason).
//!
//! Sinks: `simulator` — the decision itself is the application: the simulated cluster (owned by
//! the metrics collector) applies every `applied` it receives; `kubernetes` — the Kubernetes API
//! (scale subresource, in-place resize or template patch). Calls to the API are made one at a
//! time per target (the actor waits for them), so a target's decisions apply in order.

use std::sync::Arc;

use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, WrapFuture};
use aware_bus_schemas::{Action, Applied, Event, Outcome, Schema, Target};
use aware_shared::agents::{run_actors, spawn_publisher, Deliver, Outbox, Retire, TargetActors};
use aware_shared::registry::{log_change, Change, Registered};
use aware_shared::service::{ServiceContext, ServiceError};
use aware_shared::spec::TargetSpec;
use aware_shared::telemetry::{ServiceMetrics, TelemetryError};
use prometheus::IntCounterVec;
use serde::{Deserialize, Serialize};

use crate::guardrails::{Decision, GuardState, GuardrailConfig, Guardrails, StepId};
use crate::sink::{KubernetesSink, KubernetesSinkConfig, Sink};

/// Where decisions are applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SinkKind {
    #[default]
    Simulator,
    Kubernetes,
}

/// The `[actuator]` configuration section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActuatorConfig {
    pub sink: SinkKind,
    pub guardrails: GuardrailConfig,
    pub kubernetes: KubernetesSinkConfig,
}

/// The actuator's own metrics.
#[derive(Clone)]
pub struct ActuatorMetrics {
    pub decisions: IntCounterVec,
    pub clamped: IntCounterVec,
    pub sink_errors: IntCounterVec,
    /// The service's `registrations_total`.
    pub registrations: IntCounterVec,
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
        })
    }
}

enum SinkImpl {
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

/// The actor of one target.
pub struct TargetActuator {
    spec: TargetSpec,
    /// Registration by the controller: a deregistered target is never touched again (its
    /// actions are rejected), so it keeps its last applied resources.
    registered: Registered,
    state: GuardState,
    guards: Arc<Guardrails>,
    sink: Arc<SinkImpl>,
    outbox: Outbox,
    metrics: ActuatorMetrics,
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
    fn publish(&mut self, a: &Action, d: &Decision) {
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
                a.current,
                d.applied,
                a.ts_ms,
            );
        }
        self.outbox.send(applied_message(a, d, self.sink.name()));
    }
}

impl Handler<Deliver> for TargetActuator {
    type Result = ();

    fn handle(&mut self, Deliver(ev): Deliver, ctx: &mut Self::Context) {
        let a = match ev {
            Event::Action(a) => a,
            Event::Registration(r) => {
                let change = self.registered.apply(&r);
                log_change(
                    crate::NAME,
                    &self.metrics.registrations,
                    &r.target,
                    r.generation,
                    &change,
                );
                if let Change::Registered { spec, .. } = change {
                    self.spec = spec;
                }
                return;
            }
            _ => return,
        };
        if self.registered.is_deregistered() {
            let d = Decision {
                outcome: Outcome::Rejected,
                applied: a.current,
                recommended: a.current,
                clamped: Vec::new(),
                reason: Some("target deregistered: its AwareAutoscaler was deleted".to_string()),
            };
            self.publish(&a, &d);
            return;
        }
        let step = StepId {
            episode: a.episode,
            step: a.step,
        };
        let decision =
            self.guards
                .decide(&self.spec, &self.state, a.current, step, a.desired, a.ts_ms);
        let needs_call = decision.changes(&a.current);
        match (&*self.sink, needs_call) {
            (SinkImpl::Kubernetes(k), true) => {
                let k = k.clone();
                let target = a.target.clone();
                let desired = decision.applied;
                let fut = async move { k.apply(&target, desired).await };
                ctx.wait(fut.into_actor(self).map(move |res, act, _| {
                    let mut d = decision;
                    match res {
                        Ok(report) => {
                            d.applied = report.in_force;
                            if !report.notes.is_empty() {
                                let notes = report.notes.join("; ");
                                d.reason = Some(match d.reason.take() {
                                    Some(r) => format!("{r}; {notes}"),
                                    None => notes,
                                });
                            }
                        }
                        Err(e) => {
                            act.metrics.sink_errors.with_label_values(&["kubernetes"]).inc();
                            tracing::warn!(target = %a.target, error = %e, "kubernetes sink failed");
                            d.outcome = Outcome::Rejected;
                            d.applied = a.current;
                            d.reason = Some(format!("sink error: {e}"));
                        }
                    }
                    act.publish(&a, &d);
                }));
            }
            _ => self.publish(&a, &decision),
        }
    }
}

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let cfg: ActuatorConfig = ctx.config.section("actuator")?;
    let guards = Arc::new(
        Guardrails::new(cfg.guardrails)
            .map_err(|e| ServiceError::Other(format!("actuator.guardrails: {e}")))?,
    );
    let sink = Arc::new(match cfg.sink {
        SinkKind::Simulator => SinkImpl::Simulator,
        SinkKind::Kubernetes => {
            let client = kube::Client::try_default()
                .await
                .map_err(|e| ServiceError::Other(format!("kubernetes client: {e}")))?;
            SinkImpl::Kubernetes(Arc::new(
                KubernetesSink::new(client, cfg.kubernetes)
                    .map_err(|e| ServiceError::Other(format!("actuator.kubernetes: {e}")))?,
            ))
        }
    });
    let metrics = ActuatorMetrics::new(&ctx.metrics)?;
    let (outbox, publisher) = spawn_publisher(ctx.clone());
    let config = ctx.config.clone();
    let mut actors = TargetActors::new(&ctx, move |t: &Target| TargetActuator {
        spec: config.spec_for(t),
        registered: Registered::default(),
        state: GuardState::default(),
        guards: guards.clone(),
        sink: sink.clone(),
        outbox: outbox.clone(),
        metrics: metrics.clone(),
    });
    run_actors(&ctx, crate::CONSUMES, false, &mut actors).await?;
    drop(actors);
    aware_shared::agents::join_publisher(publisher).await
}
