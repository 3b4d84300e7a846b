//! The base-learner's online training (issue [rl-agent] item 4, the learner half of the
//! actor–learner split): one [`Learner`] per target trains a DDPG from minibatches drawn from the
//! trajectory store and writes versioned checkpoints to the model store. Everything here is
//! synchronous (store I/O and gradient steps); the service runs it on the blocking pool.

use std::time::{Duration, Instant};

use aware_bus_schemas::{DecisionSource, Target};
use aware_shared::config::stable_hash;
use aware_shared::model_store::{
    model_key, model_prefix, version_of_key, ModelStore, ModelStoreError, StoredObject,
};
use aware_shared::spec::Bounds;
use aware_shared_model::{Batch, Ddpg, DdpgConfig, ModelError, Transition, ACTION_DIM};
use aware_trajectory_recorder::store::{self as tstore, StoreError, TrajectoryStore};
use serde::{Deserialize, Serialize};

/// The model kind in keys and `model` messages.
pub const BASE_LEARNER: &str = "base_learner";

/// The `[trainer]` configuration section.
///
/// The default network is 64-64 (the AWARE artifact's size): on these 2-core CPU machines dfdx
/// trains it at ~2,800 gradient steps/s against ~340 for 256-256 (`aware-shared-model`'s
/// benchmark, batch 64), so a round of 200 steps per target costs ~70 ms instead of ~0.6 s and
/// the trainer keeps up with many targets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerConfig {
    /// Hidden layer widths of the actor and the critic.
    pub hidden: Vec<usize>,
    /// Train when this many transitions arrived since the last round …
    pub train_every_transitions: u64,
    /// … or when this much time passed since the last round and some arrived (0: never by time).
    pub train_every_ms: u64,
    /// Gradient steps per round.
    pub gradient_steps: usize,
    /// Minibatch size (paper Table 2: 64).
    pub batch_size: usize,
    /// No training before the target has this many transitions.
    pub min_transitions: u64,
    /// How often each target's actor checks whether a round is due.
    pub poll_ms: u64,
    /// Seed of weight initialisation and minibatch sampling (mixed with the target's hash).
    pub seed: u64,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            hidden: vec![64, 64],
            train_every_transitions: 200,
            train_every_ms: 30_000,
            gradient_steps: 200,
            batch_size: 64,
            min_transitions: 64,
            poll_ms: 500,
            seed: 0,
        }
    }
}

/// Errors of the trainer; each names the target or the setting.
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    #[error("trainer.{key}: {reason}")]
    Config { key: &'static str, reason: String },
    #[error("{target}: trajectory store: {source}")]
    Store {
        target: Target,
        #[source]
        source: Box<StoreError>,
    },
    #[error("{target}: model store: {source}")]
    ModelStore {
        target: Target,
        #[source]
        source: ModelStoreError,
    },
    #[error("{target}: model: {source}")]
    Model {
        target: Target,
        #[source]
        source: ModelError,
    },
}

impl TrainerConfig {
    /// The base-learner configuration for `state_dim` inputs and a target's seed.
    pub fn ddpg_config(&self, state_dim: usize, target: &Target) -> DdpgConfig {
        let mut c = DdpgConfig::with_hidden(state_dim, &self.hidden);
        c.seed = self.seed ^ stable_hash(&target.key());
        c
    }

    /// Checks ranges; errors name the key.
    pub fn validate(&self) -> Result<(), TrainerError> {
        let bad = |key, reason: &str| {
            Err(TrainerError::Config {
                key,
                reason: reason.to_string(),
            })
        };
        if let Err(e) = self
            .ddpg_config(aware_loadgen::STATE_DIM, &Target::new("a", "b"))
            .validate()
        {
            return bad("hidden", &e.to_string());
        }
        if self.train_every_transitions == 0 {
            return bad("train_every_transitions", "must be at least 1");
        }
        if !(1..=1_000_000).contains(&self.gradient_steps) {
            return bad("gradient_steps", "must be in 1..=1000000");
        }
        if !(1..=65_536).contains(&self.batch_size) {
            return bad("batch_size", "must be in 1..=65536");
        }
        if self.poll_ms < 10 {
            return bad("poll_ms", "must be at least 10");
        }
        Ok(())
    }
}

/// A checkpoint written to the model store.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    pub version: u64,
    pub object: StoredObject,
    pub trained_steps: u64,
    /// Gradient steps of this round.
    pub steps: usize,
    /// The latest (episode, step) among the round's minibatches.
    pub latest: (u64, u32),
    pub critic_loss: f32,
    /// Rows skipped because they could not be turned into a training transition.
    pub skipped: usize,
}

/// The training state of one target.
pub struct Learner {
    target: Target,
    bounds: Bounds,
    cfg: TrainerConfig,
    ddpg: Option<Ddpg>,
    /// Last published (or found in the model store) version.
    version: u64,
    trained_at: u64,
    last_round: Option<Instant>,
    rounds: u64,
}

impl Learner {
    pub fn new(target: Target, bounds: Bounds, cfg: TrainerConfig) -> Self {
        Learner {
            target,
            bounds,
            cfg,
            ddpg: None,
            version: 0,
            trained_at: 0,
            last_round: None,
            rounds: 0,
        }
    }

    /// The last version published or found.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether a round is due with `count` transitions in the store at `now`.
    pub fn due(&self, count: u64, now: Instant) -> bool {
        if count < self.cfg.min_transitions.max(1) || count <= self.trained_at {
            return false;
        }
        if count - self.trained_at >= self.cfg.train_every_transitions {
            return true;
        }
        self.cfg.train_every_ms > 0
            && self.last_round.is_some_and(|t| {
                now.duration_since(t) >= Duration::from_millis(self.cfg.train_every_ms)
            })
    }

    /// Runs one round if one is due: samples minibatches, trains, writes the checkpoint.
    pub fn maybe_train(
        &mut self,
        store: &dyn TrajectoryStore,
        models: &dyn ModelStore,
    ) -> Result<Option<Published>, TrainerError> {
        let count = store
            .count(&self.target)
            .map_err(|source| TrainerError::Store {
                target: self.target.clone(),
                source: Box::new(source),
            })?;
        let now = Instant::now();
        if !self.due(count, now) {
            // The time trigger counts from the first moment training was possible.
            if self.last_round.is_none() && count >= self.cfg.min_transitions.max(1) {
                self.last_round = Some(now);
            }
            return Ok(None);
        }
        let published = self.train_round(store, models)?;
        self.trained_at = count;
        self.last_round = Some(now);
        Ok(Some(published))
    }

    fn ddpg(&mut self, models: &dyn ModelStore) -> Result<&mut Ddpg, TrainerError> {
        if self.ddpg.is_none() {
            self.ddpg = Some(self.resume(models)?);
        }
        match self.ddpg.as_mut() {
            Some(d) => Ok(d),
            None => unreachable!("set just above"),
        }
    }

    /// The latest checkpoint of the target in the model store (versions continue after it), or a
    /// fresh network when there is none or it cannot be read.
    fn resume(&mut self, models: &dyn ModelStore) -> Result<Ddpg, TrainerError> {
        let prefix = format!("{}/{BASE_LEARNER}/", model_prefix(&self.target));
        let latest = models
            .keys(&prefix)
            .map_err(|source| TrainerError::ModelStore {
                target: self.target.clone(),
                source,
            })?
            .into_iter()
            .filter_map(|k| version_of_key(&k).map(|v| (v, k)))
            .max();
        let fresh = |t: &Target| {
            Ddpg::new(self.cfg.ddpg_config(aware_loadgen::STATE_DIM, t)).map_err(|source| {
                TrainerError::Model {
                    target: t.clone(),
                    source,
                }
            })
        };
        let Some((v, key)) = latest else {
            return fresh(&self.target);
        };
        self.version = self.version.max(v);
        match models
            .get(&key)
            .map_err(|e| e.to_string())
            .and_then(|b| Ddpg::from_bytes(&b).map_err(|e| e.to_string()))
        {
            Ok(d) if d.config().state_dim == aware_loadgen::STATE_DIM => {
                tracing::info!(target = %self.target, version = v, trained_steps = d.train_steps(), "resuming from the model store");
                Ok(d)
            }
            Ok(_) => {
                tracing::warn!(target = %self.target, version = v, "stored model has another state width; starting afresh");
                fresh(&self.target)
            }
            Err(error) => {
                tracing::warn!(target = %self.target, version = v, %error, "cannot resume from the stored model; starting afresh");
                fresh(&self.target)
            }
        }
    }

    fn train_round(
        &mut self,
        store: &dyn TrajectoryStore,
        models: &dyn ModelStore,
    ) -> Result<Published, TrainerError> {
        let target = self.target.clone();
        let (steps, batch_size) = (self.cfg.gradient_steps, self.cfg.batch_size);
        let seed = self.cfg.seed ^ stable_hash(&target.key()) ^ self.rounds.rotate_left(32);
        self.rounds += 1;
        // One draw for the whole round: the store scans the target's keys once per call.
        let rows = store
            .sample(Some(&target), steps * batch_size, seed)
            .map_err(|source| TrainerError::Store {
                target: target.clone(),
                source: Box::new(source),
            })?;
        let bounds = self.bounds;
        let mut skipped = 0;
        let mut latest = (0u64, 0u32);
        let mut ts = Vec::with_capacity(rows.len());
        for r in &rows {
            latest = latest.max((r.episode, r.step));
            match to_training(r, &bounds) {
                Some(t) => ts.push(t),
                None => skipped += 1,
            }
        }
        let ddpg = self.ddpg(models)?;
        let model_err = |source| TrainerError::Model {
            target: target.clone(),
            source,
        };
        // The normalizer follows the data: a uniform sample estimates the same statistics as
        // the whole history.
        for t in &ts {
            ddpg.observe(&t.state).map_err(model_err)?;
        }
        let mut critic_loss = f32::NAN;
        let mut done = 0;
        for chunk in ts.chunks(batch_size) {
            if chunk.len() < batch_size.min(ts.len()) {
                break;
            }
            let batch =
                Batch::from_transitions(ddpg.config().state_dim, chunk).map_err(model_err)?;
            critic_loss = ddpg.train_step(&batch).map_err(model_err)?.critic_loss;
            done += 1;
        }
        let trained_steps = ddpg.train_steps();
        let bytes = ddpg.to_bytes().map_err(model_err)?;
        let version = self.version + 1;
        let object = models
            .put(&model_key(&target, BASE_LEARNER, version), &bytes)
            .map_err(|source| TrainerError::ModelStore {
                target: target.clone(),
                source,
            })?;
        self.version = version;
        Ok(Published {
            version,
            object,
            trained_steps,
            steps: done,
            latest,
            critic_loss,
            skipped,
        })
    }
}

/// A stored transition as a training transition: the recommender's raw action when it acted
/// (`source: rl`), else the *behaviour action* — the allocation actually applied expressed in the
/// policy's action space, the inverse of `loadgen::env::map_action` (default scale) from the
/// allocation in force, which the state carries (features 0, 1 and 8 scaled by the bounds).
/// `None` for rows that do not fit (state width, non-finite values).
pub fn to_training(r: &tstore::Transition, bounds: &Bounds) -> Option<Transition> {
    let dim = aware_loadgen::STATE_DIM;
    if r.state.len() != dim || r.next_state.len() != dim || !r.reward.is_finite() {
        return None;
    }
    let action = match (r.source, r.action_raw.as_slice()) {
        (DecisionSource::Rl, [a, b, c]) => [*a, *b, *c],
        _ => behaviour_action(&r.state, r.applied, bounds)?,
    };
    if action.iter().any(|x| !x.is_finite()) {
        return None;
    }
    Some(Transition {
        state: r.state.clone(),
        action: action.map(|x| x.clamp(-1.0, 1.0)),
        reward: r.reward as f32,
        next_state: r.next_state.clone(),
        done: false,
    })
}

/// The raw action in [−1, 1]³ that moves the allocation encoded in `state` to `applied`.
pub fn behaviour_action(
    state: &[f32],
    applied: aware_bus_schemas::Resources,
    bounds: &Bounds,
) -> Option<[f32; ACTION_DIM]> {
    let map = aware_loadgen::env::ActionMap::default();
    let cur_cpu = f64::from(*state.first()?) * f64::from(bounds.max_cpu_millicores);
    let cur_mem = f64::from(*state.get(1)?) * bounds.max_memory_bytes as f64;
    let cur_rep = f64::from(*state.get(8)?) * f64::from(bounds.max_replicas);
    let cpu_range = f64::from(
        bounds
            .max_cpu_millicores
            .saturating_sub(bounds.min_cpu_millicores),
    )
    .max(1.0);
    let mem_range = (bounds
        .max_memory_bytes
        .saturating_sub(bounds.min_memory_bytes) as f64)
        .max(1.0);
    let a = [
        (f64::from(applied.replicas) - cur_rep) / f64::from(map.max_replica_delta.max(1)),
        (f64::from(applied.cpu_millicores) - cur_cpu) / (map.cpu_delta_fraction * cpu_range),
        (applied.memory_bytes as f64 - cur_mem) / (map.memory_delta_fraction * mem_range),
    ];
    if a.iter().any(|x| !x.is_finite()) {
        return None;
    }
    Some(a.map(|x| x.clamp(-1.0, 1.0) as f32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_bus_schemas::{Resources, Stage};
    use aware_shared::model_store::{get_verified, LocalDirStore};
    use aware_trajectory_recorder::store::SqliteStore;

    const MIB: u64 = 1024 * 1024;

    fn row(t: &Target, episode: u64, step: u32) -> tstore::Transition {
        let x = (episode * 100 + u64::from(step)) as f32;
        let state: Vec<f32> = (0..9)
            .map(|j| 0.5 + 0.4 * (x * 0.3 + j as f32).sin())
            .collect();
        let next: Vec<f32> = (0..9)
            .map(|j| 0.5 + 0.4 * (x * 0.3 + 0.3 + j as f32).sin())
            .collect();
        let r = Resources {
            replicas: 3,
            cpu_millicores: 500,
            memory_bytes: 512 * MIB,
        };
        tstore::Transition {
            target: t.clone(),
            episode,
            step,
            ts_ms: 1_700_000_000_000 + i64::from(step),
            state,
            action_raw: if step.is_multiple_of(2) {
                vec![0.2, -0.1, 0.0]
            } else {
                vec![]
            },
            desired: r,
            applied: r,
            source: if step.is_multiple_of(2) {
                DecisionSource::Rl
            } else {
                DecisionSource::Fallback
            },
            stage: Stage::Online,
            reward: 1.0 + f64::from(state_sum(x)),
            next_state: next,
            slo_violation: false,
            cpu_util: 0.5,
            memory_util: 0.5,
        }
    }

    fn state_sum(x: f32) -> f32 {
        (x * 0.1).cos() * 0.3
    }

    fn cfg() -> TrainerConfig {
        TrainerConfig {
            train_every_transitions: 50,
            train_every_ms: 0,
            gradient_steps: 5,
            batch_size: 16,
            min_transitions: 20,
            ..TrainerConfig::default()
        }
    }

    #[test]
    fn config_defaults_validate_and_nonsense_is_refused() {
        TrainerConfig::default().validate().unwrap();
        assert_eq!(TrainerConfig::default().hidden, vec![64, 64]);
        let bad = [
            TrainerConfig {
                hidden: vec![],
                ..TrainerConfig::default()
            },
            TrainerConfig {
                hidden: vec![0],
                ..TrainerConfig::default()
            },
            TrainerConfig {
                batch_size: 0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                gradient_steps: 0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                train_every_transitions: 0,
                ..TrainerConfig::default()
            },
            TrainerConfig {
                poll_ms: 1,
                ..TrainerConfig::default()
            },
        ];
        for c in bad {
            assert!(
                matches!(c.validate(), Err(TrainerError::Config { .. })),
                "{c:?}"
            );
        }
        let parsed: Result<TrainerConfig, _> =
            serde_json::from_value(serde_json::json!({ "hidden": [32], "no_such_key": 1 }));
        assert!(parsed.is_err(), "unknown keys are refused");
    }

    #[test]
    fn trains_when_due_and_publishes_increasing_verified_versions() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_path(dir.path().join("t.db")).unwrap();
        let models = LocalDirStore::open(dir.path().join("models")).unwrap();
        let t = Target::new("shop", "cart");
        let mut l = Learner::new(t.clone(), Bounds::default(), cfg());
        // Below min_transitions: nothing.
        store
            .append(&(0..10).map(|s| row(&t, 0, s)).collect::<Vec<_>>())
            .unwrap();
        assert_eq!(l.maybe_train(&store, &models).unwrap(), None);
        // 60 rows: due (≥ 50 new).
        store
            .append(&(10..60).map(|s| row(&t, 0, s)).collect::<Vec<_>>())
            .unwrap();
        let p1 = l.maybe_train(&store, &models).unwrap().expect("a round");
        assert_eq!((p1.version, p1.steps, p1.trained_steps), (1, 5, 5));
        assert_eq!(p1.skipped, 0);
        assert!(p1.critic_loss.is_finite());
        assert!(p1.latest.1 < 60);
        let bytes = get_verified(
            &models,
            &p1.object.uri,
            &p1.object.sha256,
            p1.object.size_bytes,
        )
        .unwrap();
        let d = Ddpg::from_bytes(&bytes).unwrap();
        assert_eq!(d.train_steps(), 5);
        assert_eq!(d.config().actor_hidden, vec![64, 64]);
        assert!(d.normalizer().count() > 0, "the normalizer saw the data");
        // Not due again until 50 more transitions.
        assert_eq!(l.maybe_train(&store, &models).unwrap(), None);
        store
            .append(&(0..50).map(|s| row(&t, 1, s)).collect::<Vec<_>>())
            .unwrap();
        let p2 = l
            .maybe_train(&store, &models)
            .unwrap()
            .expect("a second round");
        assert_eq!((p2.version, p2.trained_steps), (2, 10));
        assert_ne!(p2.object.sha256, p1.object.sha256);
        // A restarted trainer resumes from the latest checkpoint and continues the versions.
        let mut again = Learner::new(t.clone(), Bounds::default(), cfg());
        store
            .append(&(0..50).map(|s| row(&t, 2, s)).collect::<Vec<_>>())
            .unwrap();
        let p3 = again
            .maybe_train(&store, &models)
            .unwrap()
            .expect("a round");
        assert_eq!((p3.version, p3.trained_steps), (3, 15));
    }

    #[test]
    fn time_trigger_needs_new_transitions() {
        let t = Target::new("a", "b");
        let mut c = cfg();
        c.train_every_ms = 1_000;
        let mut l = Learner::new(t, Bounds::default(), c);
        let now = Instant::now();
        assert!(!l.due(10, now), "below the minimum");
        assert!(l.due(50, now), "enough new transitions");
        l.trained_at = 50;
        l.last_round = Some(now);
        assert!(!l.due(60, now + Duration::from_millis(500)));
        assert!(l.due(60, now + Duration::from_millis(1_500)));
        assert!(
            !l.due(50, now + Duration::from_millis(1_500)),
            "nothing new"
        );
    }

    #[test]
    fn behaviour_action_inverts_the_action_map() {
        let b = Bounds::default();
        // The allocation in force, as the state encodes it.
        let cur = Resources {
            replicas: 4,
            cpu_millicores: 1024,
            memory_bytes: 1536 * MIB,
        };
        let mut state = vec![0.0f32; 9];
        state[0] = (f64::from(cur.cpu_millicores) / f64::from(b.max_cpu_millicores)) as f32;
        state[1] = (cur.memory_bytes as f64 / b.max_memory_bytes as f64) as f32;
        state[8] = (f64::from(cur.replicas) / f64::from(b.max_replicas)) as f32;
        // Replicas +2 (of 4 per unit), CPU +240 m (of 480 per unit), memory −176 MiB (of 704).
        let applied = Resources {
            replicas: 6,
            cpu_millicores: 1264,
            memory_bytes: 1360 * MIB,
        };
        let a = behaviour_action(&state, applied, &b).unwrap();
        for (got, want) in a.iter().zip([0.5f32, 0.5, -0.25]) {
            assert!((got - want).abs() < 1e-3, "{a:?}");
        }
        // Beyond one unit: clamped.
        let far = Resources {
            replicas: 20,
            ..applied
        };
        assert_eq!(behaviour_action(&state, far, &b).unwrap()[0], 1.0);
        // Rows that do not fit are skipped.
        let t = Target::new("a", "b");
        let mut r = row(&t, 0, 1);
        r.state.truncate(4);
        assert!(to_training(&r, &b).is_none());
        let mut r = row(&t, 0, 2);
        r.reward = f64::NAN;
        assert!(to_training(&r, &b).is_none());
        // RL rows keep the recommender's raw action.
        let r = row(&t, 0, 2);
        assert_eq!(to_training(&r, &b).unwrap().action, [0.2, -0.1, 0.0]);
    }
}
