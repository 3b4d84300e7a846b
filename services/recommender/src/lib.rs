//! recommender: one actix actor per owned target picks the action of every step and publishes
//! `action`.
//!
//! The policy behind an actor follows the target's lifecycle stage, which arrives as a message
//! (no restart): the HPA/VPA fallback ([`fallback`]) acts while OFFLINE, and whenever the RL path
//! cannot (no model loaded yet, a NaN state, …) with the reason in `fallback_reason`. The
//! fallback sees every step, so its histograms are warm whenever it has to take over. Targets are
//! sharded across instances by stable hash (`--shard i/N`).

pub mod fallback;

use actix::{Actor, Context, Handler};
use aware_bus_schemas::{
    Action, DecisionSource, Event, EventKind, Obs, Resources, Schema, Stage, Target,
};
use aware_shared::agents::{run_actors, spawn_publisher, Deliver, Outbox, TargetActors};
use aware_shared::launcher::ServiceEntry;
use aware_shared::service::{ServiceContext, ServiceError};
use aware_shared::spec::TargetSpec;
use serde::{Deserialize, Serialize};

use crate::fallback::{Fallback, FallbackConfig};

pub const NAME: &str = "recommender";
pub const CONSUMES: &[EventKind] = &[
    EventKind::Obs,
    EventKind::Lifecycle,
    EventKind::Embedding,
    EventKind::Model,
];
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
};

/// What the recommender knows about one target.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentState {
    pub target: Target,
    pub stage: Stage,
    pub model_version: Option<u64>,
    pub embedding_len: usize,
    pub last_obs: Option<(u64, u32)>,
}

impl AgentState {
    pub fn new(target: Target) -> Self {
        AgentState {
            target,
            stage: Stage::Initialized,
            model_version: None,
            embedding_len: 0,
            last_obs: None,
        }
    }

    /// Folds one event into the state.
    pub fn apply(&mut self, ev: &Event) {
        match ev {
            Event::Lifecycle(l) => self.stage = l.stage,
            Event::Model(m) => {
                self.model_version =
                    Some(self.model_version.map_or(m.version, |v| v.max(m.version)))
            }
            Event::Embedding(e) => self.embedding_len = e.embedding.len(),
            Event::Obs(o) => self.last_obs = Some((o.episode, o.step)),
            _ => {}
        }
    }
}

/// The `[recommender]` configuration section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecommenderConfig {
    pub fallback: FallbackConfig,
}

/// The allocation in force, read from an `obs` (limits rounded to millicores and bytes).
pub fn current_allocation(o: &Obs) -> Resources {
    let m = &o.metrics;
    let finite = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
    Resources {
        replicas: m.replicas,
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
}

/// Bucket bounds of `decision_seconds`: 1 µs … 50 ms.
pub const DECISION_BUCKETS: [f64; 16] = [
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1,
];

impl RecommenderMetrics {
    pub fn new(ctx: &ServiceContext) -> Result<Self, ServiceError> {
        let err = |e: prometheus::Error| ServiceError::Other(e.to_string());
        let decision_seconds = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "recommender_decision_seconds",
                "Time to decide one action, from the obs reaching the target's actor",
            )
            .buckets(DECISION_BUCKETS.to_vec()),
        )
        .map_err(err)?;
        let incomplete_steps = prometheus::IntCounter::new(
            "recommender_incomplete_steps_total",
            "Steps with missing or stale metrics (no action taken)",
        )
        .map_err(err)?;
        let r = ctx.metrics.registry();
        r.register(Box::new(decision_seconds.clone()))
            .map_err(err)?;
        r.register(Box::new(incomplete_steps.clone()))
            .map_err(err)?;
        Ok(RecommenderMetrics {
            decision_seconds,
            incomplete_steps,
        })
    }
}

/// The actor of one target.
pub struct Agent {
    pub state: AgentState,
    spec: TargetSpec,
    fallback: Fallback,
    outbox: Outbox,
    metrics: RecommenderMetrics,
}

impl Agent {
    /// The action for one complete `obs`.
    pub fn decide(&mut self, o: &Obs) -> Action {
        let current = current_allocation(o);
        let now_s = o.ts_ms as f64 / 1000.0;
        let rec = self
            .fallback
            .recommend(now_s, &o.metrics, current, &self.spec.bounds);
        let fallback_reason = match self.state.stage {
            Stage::Online | Stage::Serving => Some("no RL policy is loaded".to_string()),
            Stage::Initialized | Stage::Offline => None,
        };
        tracing::trace!(target = %self.state.target, rules = %rec.rules.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "), "fallback decision");
        Action {
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
            model_version: self.state.model_version,
            exploration: false,
            fallback_reason,
        }
    }
}

impl Actor for Agent {
    type Context = Context<Self>;
}

impl Handler<Deliver> for Agent {
    type Result = ();

    fn handle(&mut self, Deliver(ev): Deliver, _: &mut Self::Context) {
        let before = self.state.stage;
        self.state.apply(&ev);
        if self.state.stage != before {
            tracing::info!(target = %self.state.target, from = %before, to = %self.state.stage, "stage changed");
        }
        if let Event::Obs(o) = ev {
            if !o.complete {
                self.metrics.incomplete_steps.inc();
                tracing::debug!(target = %o.target, missing = ?o.missing, "incomplete step: no action");
                return;
            }
            let t0 = std::time::Instant::now();
            let action = self.decide(&o);
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
    // Validated once at start-up: a bad setting stops the service naming the key.
    let prototype = Fallback::new(cfg.fallback)
        .map_err(|e| ServiceError::Other(format!("recommender.fallback: {e}")))?;
    let metrics = RecommenderMetrics::new(&ctx)?;
    let (outbox, publisher) = spawn_publisher(ctx.clone());
    let specs = ctx.config.targets.clone();
    let mut actors = TargetActors::new(&ctx, move |t: &Target| {
        let spec = specs
            .iter()
            .find(|s| s.namespace == t.namespace && s.name == t.name)
            .cloned()
            .unwrap_or_else(|| TargetSpec::new(t));
        Agent {
            state: AgentState::new(t.clone()),
            spec,
            fallback: prototype.clone(),
            outbox: outbox.clone(),
            metrics: metrics.clone(),
        }
    });
    run_actors(&ctx, CONSUMES, true, &mut actors).await?;
    drop(actors);
    publisher
        .await
        .map_err(|e| ServiceError::Other(format!("publisher task: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
