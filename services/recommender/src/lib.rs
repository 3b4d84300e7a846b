//! recommender: one actix actor per owned target picks the action of every step (HPA/VPA
//! fallback while OFFLINE, the RL policy otherwise) and publishes `action`.
//!
//! So far each target's actor follows the target's lifecycle stage, model version and
//! embedding; the policies arrive with the [control-loop] and [rl-agent] issues. Targets are
//! sharded across instances by stable hash (`--shard i/N`).

pub mod fallback;

use actix::{Actor, Context, Handler};
use aware_bus_schemas::{Event, EventKind, Stage, Target};
use aware_shared::agents::{run_actors, Deliver, TargetActors};
use aware_shared::launcher::ServiceEntry;
use aware_shared::service::{ServiceContext, ServiceError};

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

/// The actor of one target.
pub struct Agent(pub AgentState);

impl Actor for Agent {
    type Context = Context<Self>;
}

impl Handler<Deliver> for Agent {
    type Result = ();

    fn handle(&mut self, Deliver(ev): Deliver, _: &mut Self::Context) {
        let before = self.0.stage;
        self.0.apply(&ev);
        if self.0.stage != before {
            tracing::info!(target = %self.0.target, from = %before, to = %self.0.stage, "stage changed");
        }
    }
}

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let mut actors = TargetActors::new(&ctx, |t: &Target| Agent(AgentState::new(t.clone())));
    run_actors(&ctx, CONSUMES, true, &mut actors).await
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
