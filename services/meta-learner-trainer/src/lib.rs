//! meta-learner-trainer: trains the base- and meta-learner from the trajectory store and publishes
//! `model` and `embedding`.
//!
//! Wired into the loop: one actor per target follows the target's lifecycle and, at every change,
//! reads what the trajectory store holds for it (transitions, recorded episodes, the best episode:
//! the data offline training and the meta-learner's top-M bundle will use). The store is the one
//! the recorder writes (the `[recorder]` section). Learning arrives with [rl-agent] and
//! [meta-learner].

use std::sync::Arc;

use actix::{Actor, Context, Handler};
use aware_bus_schemas::{Event, EventKind, Target};
use aware_shared::agents::{run_actors, Deliver, TargetActors};
use aware_shared::launcher::ServiceEntry;
use aware_shared::service::{ServiceContext, ServiceError};
use aware_trajectory_recorder::service::{open_store, RecorderConfig};
use aware_trajectory_recorder::store::TrajectoryStore;

pub const NAME: &str = "meta-learner-trainer";
pub const CONSUMES: &[EventKind] = &[EventKind::Lifecycle];
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
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
) -> Result<TrainingData, aware_trajectory_recorder::store::StoreError> {
    let top = store.top_episodes(target, top_m)?;
    Ok(TrainingData {
        transitions: store.count(target)?,
        episodes: top.len(),
        best_episode_reward: top.first().map(|e| e.total_reward),
    })
}

/// The actor of one target.
pub struct TargetTrainer {
    target: Target,
    store: Arc<dyn TrajectoryStore>,
    transitions: prometheus::IntGauge,
}

impl Actor for TargetTrainer {
    type Context = Context<Self>;
}

impl Handler<Deliver> for TargetTrainer {
    type Result = ();

    fn handle(&mut self, Deliver(ev): Deliver, _: &mut Self::Context) {
        let Event::Lifecycle(l) = ev else { return };
        // The paper's top-M bundle (M = 20) is what the meta-learner will read.
        match training_data(self.store.as_ref(), &self.target, 20) {
            Ok(d) => {
                tracing::info!(target = %self.target, stage = %l.stage, transitions = d.transitions, episodes = d.episodes, best = ?d.best_episode_reward, "training data at stage change");
                if let Ok(all) = self.store.count_all() {
                    self.transitions.set(i64::try_from(all).unwrap_or(i64::MAX));
                }
            }
            Err(e) => {
                tracing::warn!(target = %self.target, error = %e, "cannot read the trajectory store")
            }
        }
    }
}

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let cfg: RecorderConfig = ctx.config.section("recorder")?;
    let store = open_store(&cfg)?;
    let transitions = prometheus::IntGauge::new(
        "trainer_transitions_available",
        "Transitions in the trajectory store at the last lifecycle change",
    )
    .map_err(|e| ServiceError::Other(e.to_string()))?;
    ctx.metrics
        .registry()
        .register(Box::new(transitions.clone()))
        .map_err(|e| ServiceError::Other(e.to_string()))?;
    let mut actors = TargetActors::new(&ctx, move |t: &Target| TargetTrainer {
        target: t.clone(),
        store: store.clone(),
        transitions: transitions.clone(),
    });
    run_actors(&ctx, CONSUMES, false, &mut actors).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_trajectory_recorder::store::{EpisodeSummary, SqliteStore};

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
