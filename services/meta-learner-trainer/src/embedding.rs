//! Workload embeddings in the trainer (issue [meta-learner] item 3).
//!
//! With `trainer.meta_dir` set (an `aware train-meta` output directory) the service loads
//! `meta.ckpt` (the meta-learner) and `base.ckpt` (the shared base-learner over
//! `state ‖ embedding`, 9 + 64 inputs by default) once at start ([`load_meta_dir`]). For every
//! target a [`TargetMeta`]:
//!
//! * builds the bundle of the target's top-M episodes by total reward from the trajectory store
//!   (M = the meta-learner's `bundle_size`; each episode's rows as `[state ‖ action ‖ reward]`,
//!   the action being the recommender's raw action or the fallback's behaviour action, exactly
//!   what the learner trains on; episodes cut to the shortest), embeds it and hands back an
//!   `embedding` message (`model_version` = the meta-learner's version, its `train_steps`;
//!   `episodes_used`; `episode`/`step` = the newest recorded episode when it was computed);
//! * recomputes it once `embedding_refresh_episodes` new episodes were recorded;
//! * conditions the target's [`Learner`]: its network starts from `base.ckpt` (or its own
//!   checkpoint of the same width in the model store) and every transition of a round gets the
//!   current embedding appended to its state and next state — the embedding is held fixed for a
//!   round, a refresh applies from the next round. A conditioned target does not train before its
//!   first embedding (after its first recorded episode).
//!
//! The meta-learner is frozen here (inference only); it is trained by `aware train-meta`.
//!
//! Failures never stop the service: a meta dir that cannot be loaded turns meta-learning off for
//! every target; a bundle or embedding that cannot be made (a NaN in the rows, wrong widths) turns
//! it off for that target if it has no embedding yet (it trains a plain 9-d base-learner, as
//! without `meta_dir`), else keeps the previous embedding; a trajectory-store error is retried at
//! the next check. Each is logged and counted in `trainer_embedding_errors_total`.

use std::path::Path;
use std::sync::Arc;

use aware_bus_schemas::{Embedding, Schema, Target};
use aware_shared::spec::Bounds;
use aware_shared_model::{Ddpg, EpisodeBundle, MetaLearner, ModelError, Transition};
use aware_stores::trajectory::{self as tstore, StoreError, TrajectoryStore};

use crate::learner::{to_training, LearnAction, Learner};

/// Errors of the embedding path; each names the file or the target.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddingError {
    #[error("meta_dir {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("meta_dir {path}: checkpoint: {source}")]
    Checkpoint {
        path: String,
        #[source]
        source: ModelError,
    },
    #[error("meta_dir {dir}: {reason}")]
    Shape { dir: String, reason: String },
    #[error("{target}: trajectory store: {source}")]
    Store {
        target: Target,
        #[source]
        source: Box<StoreError>,
    },
    #[error("{target}: episode bundle: {source}")]
    Bundle {
        target: Target,
        #[source]
        source: ModelError,
    },
    #[error("{target}: embedding is not finite")]
    NonFinite { target: Target },
}

impl EmbeddingError {
    /// Whether retrying later may help (the store), as opposed to bad data or files.
    pub fn is_transient(&self) -> bool {
        matches!(self, EmbeddingError::Store { .. })
    }
}

/// What a meta dir provides: the frozen meta-learner and the shared base-learner.
#[derive(Debug)]
pub struct MetaAssets {
    pub meta: MetaLearner,
    pub base: Arc<Ddpg>,
    /// The meta-learner's version in `embedding` messages: its training steps.
    pub version: u64,
}

impl MetaAssets {
    /// Embedding width E.
    pub fn embed_dim(&self) -> usize {
        self.meta.config().embed_dim
    }
}

/// Loads `meta.ckpt` and `base.ckpt` from `dir` and checks that they fit together and the
/// collector's state (`meta.state_dim` = 9, `base.state_dim` = 9 + E). With a wider recorded
/// state (`state_width`, [`aware_mdp::state_width`]: `learning.mean_field`) the base-learner's
/// inputs for the features after the nine are inserted with zero weights
/// ([`Ddpg::with_inputs_inserted`]): it starts acting as meta-trained, and fine-tuning learns
/// what the mean field adds. The meta-learner embeds the target's own nine features.
pub fn load_meta_dir(dir: &Path, state_width: usize) -> Result<MetaAssets, EmbeddingError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| EmbeddingError::Io {
            path: path.display().to_string(),
            source,
        })
    };
    let ckpt = |name: &'static str| {
        move |source| EmbeddingError::Checkpoint {
            path: dir.join(name).display().to_string(),
            source,
        }
    };
    let meta = MetaLearner::from_bytes(&read("meta.ckpt")?).map_err(ckpt("meta.ckpt"))?;
    let base = Ddpg::from_bytes(&read("base.ckpt")?).map_err(ckpt("base.ckpt"))?;
    let state = aware_mdp::STATE_DIM;
    let (d, e) = (meta.config().state_dim, meta.config().embed_dim);
    let shape = |reason: String| EmbeddingError::Shape {
        dir: dir.display().to_string(),
        reason,
    };
    if d != state {
        return Err(shape(format!(
            "meta.ckpt reads {d}-d states, the collector's have {state}"
        )));
    }
    if base.config().state_dim != d + e {
        return Err(shape(format!(
            "base.ckpt takes {} inputs, not state {d} + embedding {e}",
            base.config().state_dim
        )));
    }
    let base = match state_width.checked_sub(state) {
        Some(0) => base,
        Some(extra) => base
            .with_inputs_inserted(state, extra)
            .map_err(ckpt("base.ckpt"))?,
        None => {
            return Err(shape(format!(
                "the recorded states have {state_width} features, fewer than the {state} the \
                 meta-learner reads"
            )))
        }
    };
    Ok(MetaAssets {
        version: meta.train_steps(),
        meta,
        base: Arc::new(base),
    })
}

/// What a conditioned [`Learner`] starts from and appends.
#[derive(Debug, Clone)]
pub struct Conditioning {
    /// The shared base-learner (`base.ckpt`).
    pub base: Arc<Ddpg>,
    /// The target's current embedding.
    pub embedding: Vec<f32>,
}

/// `t` with `embedding` appended to its state and next state.
pub fn append_embedding(mut t: Transition, embedding: &[f32]) -> Transition {
    t.state.extend_from_slice(embedding);
    t.next_state.extend_from_slice(embedding);
    t
}

/// One recorded episode's rows as step vectors `[state ‖ action ‖ reward]`: the learner's
/// training view of each row with its intended action, as `aware train-meta` saw its episodes
/// ([`to_training`]; rows it cannot use are left out). The state is the target's own nine
/// features: a mean field after them (`learning.mean_field`) is not the workload's behaviour.
pub fn episode_steps(rows: &[tstore::Transition], bounds: &Bounds) -> Vec<f32> {
    let own = aware_mdp::STATE_DIM;
    let mut out = Vec::new();
    for t in rows
        .iter()
        .filter(|r| r.state.len() >= own)
        .filter_map(|r| to_training(r, bounds, LearnAction::Intent, r.state.len()))
    {
        out.extend_from_slice(&EpisodeBundle::step_vector(
            &t.state[..own],
            &t.action,
            t.reward,
        ));
    }
    out
}

/// A bundle and what it was made of.
#[derive(Debug, Clone)]
pub struct Bundled {
    pub bundle: EpisodeBundle,
    pub episodes_used: u32,
}

/// The bundle of episodes given as their rows (best first); `None` when no episode has a usable
/// row. Episodes are cut to the shortest; a non-finite value is an error.
pub fn bundle_of_rows(
    episodes: &[Vec<tstore::Transition>],
    bounds: &Bounds,
) -> Result<Option<Bundled>, ModelError> {
    let steps: Vec<Vec<f32>> = episodes
        .iter()
        .map(|rows| episode_steps(rows, bounds))
        .filter(|s| !s.is_empty())
        .collect();
    if steps.is_empty() {
        return Ok(None);
    }
    let n = u32::try_from(steps.len()).unwrap_or(u32::MAX);
    let bundle = EpisodeBundle::truncated(aware_mdp::STATE_DIM, steps)?;
    Ok(Some(Bundled {
        bundle,
        episodes_used: n,
    }))
}

/// The bundle of `target`'s top-`m` episodes by total reward in `store`.
pub fn top_bundle(
    store: &dyn TrajectoryStore,
    target: &Target,
    m: usize,
    bounds: &Bounds,
) -> Result<Option<Bundled>, EmbeddingError> {
    let store_err = |source| EmbeddingError::Store {
        target: target.clone(),
        source: Box::new(source),
    };
    let top = store.top_episodes(target, m).map_err(store_err)?;
    let mut episodes = Vec::with_capacity(top.len());
    for e in &top {
        episodes.push(
            store
                .transitions(target, e.episode..e.episode.saturating_add(1))
                .map_err(store_err)?,
        );
    }
    bundle_of_rows(&episodes, bounds).map_err(|source| EmbeddingError::Bundle {
        target: target.clone(),
        source,
    })
}

/// The embedding of `bundle`, checked finite.
pub fn embed(
    assets: &MetaAssets,
    target: &Target,
    bundle: &EpisodeBundle,
) -> Result<Vec<f32>, EmbeddingError> {
    let e = assets
        .meta
        .embed(bundle)
        .map_err(|source| EmbeddingError::Bundle {
            target: target.clone(),
            source,
        })?;
    if e.iter().any(|x| !x.is_finite()) {
        return Err(EmbeddingError::NonFinite {
            target: target.clone(),
        });
    }
    Ok(e)
}

/// The current embedding of a target.
#[derive(Debug, Clone, PartialEq)]
struct Current {
    embedding: Vec<f32>,
    /// The newest recorded episode when it was computed.
    episode: u64,
}

/// What one check of a target's embedding gave.
#[derive(Debug, Default)]
pub struct Checked {
    /// A new embedding to publish.
    pub published: Option<Embedding>,
    /// What went wrong (logged and counted by the caller).
    pub error: Option<EmbeddingError>,
    /// Whether meta-learning was turned off for the target by this check.
    pub disabled: bool,
}

/// The meta-learning state of one target.
pub struct TargetMeta {
    target: Target,
    bounds: Bounds,
    assets: Arc<MetaAssets>,
    refresh_episodes: usize,
    current: Option<Current>,
    /// Meta-learning turned off for this target (a bad bundle before any embedding).
    disabled: bool,
}

impl TargetMeta {
    pub fn new(
        target: Target,
        bounds: Bounds,
        assets: Arc<MetaAssets>,
        refresh_episodes: usize,
    ) -> Self {
        TargetMeta {
            target,
            bounds,
            assets,
            refresh_episodes: refresh_episodes.max(1),
            current: None,
            disabled: false,
        }
    }

    /// The embedding in force.
    pub fn embedding(&self) -> Option<&[f32]> {
        self.current.as_ref().map(|c| c.embedding.as_slice())
    }

    /// Whether meta-learning is off for this target.
    pub fn is_disabled(&self) -> bool {
        self.disabled
    }

    /// Whether the learner may train now: always without meta-learning, else once the target
    /// has an embedding.
    pub fn ready(&self) -> bool {
        self.disabled || self.current.is_some()
    }

    /// Computes the embedding if the target has none yet or `refresh_episodes` new episodes were
    /// recorded since, and conditions `learner` on it.
    pub fn check(&mut self, store: &dyn TrajectoryStore, learner: &mut Learner) -> Checked {
        if self.disabled {
            return Checked::default();
        }
        match self.refresh(store) {
            Ok(None) => Checked::default(),
            Ok(Some(msg)) => {
                learner.set_conditioning(Conditioning {
                    base: self.assets.base.clone(),
                    embedding: msg.embedding.clone(),
                });
                Checked {
                    published: Some(msg),
                    ..Checked::default()
                }
            }
            Err(e) => {
                // Bad data before the first embedding: the target goes on without meta-learning
                // (its network does not exist yet, so its width is still free).
                let disable = !e.is_transient() && self.current.is_none() && !learner.has_network();
                self.disabled = disable;
                Checked {
                    published: None,
                    error: Some(e),
                    disabled: disable,
                }
            }
        }
    }

    fn refresh(
        &mut self,
        store: &dyn TrajectoryStore,
    ) -> Result<Option<Embedding>, EmbeddingError> {
        let store_err = |source| EmbeddingError::Store {
            target: self.target.clone(),
            source: Box::new(source),
        };
        let recent = store
            .episodes(&self.target, self.refresh_episodes)
            .map_err(store_err)?;
        let Some(newest) = recent.last() else {
            return Ok(None); // no episode recorded yet
        };
        if let Some(c) = &self.current {
            let new = recent.iter().filter(|e| e.episode > c.episode).count();
            if new < self.refresh_episodes {
                return Ok(None);
            }
        }
        let (episode, step) = (newest.episode, newest.step);
        let m = self.assets.meta.config().bundle_size;
        let Some(b) = top_bundle(store, &self.target, m, &self.bounds)? else {
            return Ok(None);
        };
        let embedding = embed(&self.assets, &self.target, &b.bundle)?;
        self.current = Some(Current {
            embedding: embedding.clone(),
            episode,
        });
        let ts_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Ok(Some(Embedding {
            schema: Schema::new(),
            target: self.target.clone(),
            episode,
            step,
            ts_ms,
            model_version: self.assets.version,
            embedding,
            episodes_used: b.episodes_used,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learner::TrainerConfig;
    use aware_bus_schemas::{DecisionSource, Event, EventKind, Resources, Stage};
    use aware_shared::model_store::{get_verified, LocalDirStore};
    use aware_shared_model::{DdpgConfig, MetaConfig, MetaDdpg};
    use aware_stores::trajectory::{EpisodeSummary, SqliteStore};

    const E: usize = 8;

    fn meta_cfg() -> MetaConfig {
        MetaConfig {
            hidden: 4,
            fc_hidden: 8,
            embed_dim: E,
            bundle_size: 2,
            seed: 3,
            ..MetaConfig::default()
        }
    }

    /// A tiny `aware train-meta`-like output dir.
    fn meta_dir(dir: &Path) -> MetaDdpg {
        let agent = MetaDdpg::new(DdpgConfig::with_hidden(9, &[8]), meta_cfg()).unwrap();
        std::fs::write(dir.join("meta.ckpt"), agent.meta().to_bytes().unwrap()).unwrap();
        std::fs::write(dir.join("base.ckpt"), agent.base().to_bytes().unwrap()).unwrap();
        agent
    }

    fn row(t: &Target, episode: u64, step: u32) -> tstore::Transition {
        let x = (episode * 100 + u64::from(step)) as f32;
        let s = |o: f32| {
            (0..9)
                .map(|j| 0.5 + 0.4 * (x * 0.3 + o + j as f32).sin())
                .collect()
        };
        let r = Resources {
            replicas: 3,
            cpu_millicores: 500,
            memory_bytes: 512 << 20,
        };
        tstore::Transition {
            target: t.clone(),
            episode,
            step,
            ts_ms: 1_700_000_000_000 + i64::from(step),
            state: s(0.0),
            action_raw: vec![0.2, -0.1, (episode as f32 * 0.1).min(1.0)],
            desired: r,
            applied: r,
            source: DecisionSource::Rl,
            stage: Stage::Online,
            reward: 1.0 + 0.1 * episode as f64,
            next_state: s(0.3),
            slo_violation: false,
            cpu_util: 0.5,
            memory_util: 0.5,
        }
    }

    /// Records episode `ep` (`steps` rows, total reward `reward`).
    fn record(store: &SqliteStore, t: &Target, ep: u64, steps: u32, reward: f64) {
        record_wide(store, t, ep, steps, reward, 0);
    }

    /// [`record`] with `extra` features after each state's nine (a mean field).
    fn record_wide(
        store: &SqliteStore,
        t: &Target,
        ep: u64,
        steps: u32,
        reward: f64,
        extra: usize,
    ) {
        let wide = |s: u32| {
            let mut r = row(t, ep, s);
            for v in [&mut r.state, &mut r.next_state] {
                v.extend((0..extra).map(|j| 0.1 * (j as f32 + s as f32 * 0.01)));
            }
            r
        };
        store
            .append(&(0..steps).map(wide).collect::<Vec<_>>())
            .unwrap();
        let Some(Event::Episode(e)) = aware_bus_schemas::generated::samples()
            .into_iter()
            .find(|e| e.kind() == EventKind::Episode)
        else {
            unreachable!()
        };
        let mut s = EpisodeSummary::from(&e);
        s.target = t.clone();
        s.episode = ep;
        s.step = steps - 1;
        s.steps = steps;
        s.total_reward = reward;
        store.put_episode(&s).unwrap();
    }

    fn trainer_cfg() -> TrainerConfig {
        TrainerConfig {
            hidden: vec![16],
            train_every_transitions: 20,
            train_every_ms: 0,
            gradient_steps: 4,
            batch_size: 8,
            min_transitions: 8,
            ..TrainerConfig::default()
        }
    }

    /// An ONLINE round of `learner`, and the network it published, read back verified.
    fn online_round(
        learner: &mut Learner,
        store: &SqliteStore,
        models: &LocalDirStore,
    ) -> (crate::learner::Published, Ddpg) {
        let p = learner
            .maybe_train_in(Stage::Online, store, models)
            .unwrap()
            .expect("a round");
        let bytes =
            get_verified(models, &p.object.uri, &p.object.sha256, p.object.size_bytes).unwrap();
        (p, Ddpg::from_bytes(&bytes).unwrap())
    }

    #[test]
    fn embeds_the_top_episodes_publishes_and_refreshes() {
        let dir = tempfile::tempdir().unwrap();
        let agent = meta_dir(dir.path());
        let assets = Arc::new(load_meta_dir(dir.path(), aware_mdp::STATE_DIM).unwrap());
        assert_eq!(
            (assets.embed_dim(), assets.base.config().state_dim),
            (E, 9 + E)
        );
        let store = SqliteStore::open_path(dir.path().join("t.db")).unwrap();
        let t = Target::new("shop", "cart");
        let b = Bounds::default();
        let mut meta = TargetMeta::new(t.clone(), b, assets.clone(), 2);
        let mut learner = Learner::new(t.clone(), b, trainer_cfg());
        // Nothing recorded: no embedding, no training yet.
        let c = meta.check(&store, &mut learner);
        assert!(c.published.is_none() && c.error.is_none());
        assert!(!meta.ready());
        assert_eq!(learner.state_dim(), 9);

        // Three episodes (lengths 12, 10, 12; rewards 5, 9, 7): the top-2 are 1 and 2.
        record(&store, &t, 0, 12, 5.0);
        record(&store, &t, 1, 10, 9.0);
        record(&store, &t, 2, 12, 7.0);
        let c = meta.check(&store, &mut learner);
        assert!(c.error.is_none(), "{:?}", c.error);
        let m = c.published.expect("an embedding");
        assert_eq!(m.target, t);
        assert_eq!((m.episode, m.step), (2, 11), "the newest episode");
        assert_eq!(m.model_version, agent.meta().train_steps());
        assert_eq!(m.episodes_used, 2);
        assert_eq!(m.embedding.len(), E);
        assert!(m.embedding.iter().all(|x| x.is_finite()));
        // Exactly the meta-learner's embedding of episodes 1 and 2 (cut to 10 steps).
        let rows = |ep: u64| store.transitions(&t, ep..ep + 1).unwrap();
        let steps: Vec<Vec<f32>> = [1, 2].map(|ep| episode_steps(&rows(ep), &b)).to_vec();
        assert_eq!(steps[0].len(), 10 * 13);
        let want = agent
            .embed(&EpisodeBundle::truncated(9, steps).unwrap())
            .unwrap();
        assert_eq!(m.embedding, want);
        assert!(meta.ready());
        assert_eq!(meta.embedding(), Some(want.as_slice()));
        assert_eq!(learner.state_dim(), 9 + E);
        assert_eq!(learner.conditioning().unwrap().embedding, want);

        // One new episode: below embedding_refresh_episodes = 2, unchanged.
        record(&store, &t, 3, 12, 1.0);
        assert!(meta.check(&store, &mut learner).published.is_none());
        // Two new episodes, one of them the best: recomputed from episodes 4 and 1.
        record(&store, &t, 4, 12, 20.0);
        let m2 = meta
            .check(&store, &mut learner)
            .published
            .expect("refreshed");
        assert_eq!((m2.episode, m2.episodes_used), (4, 2));
        assert_ne!(m2.embedding, m.embedding);
        assert_eq!(learner.conditioning().unwrap().embedding, m2.embedding);
        assert!(meta.check(&store, &mut learner).published.is_none());
    }

    #[test]
    fn a_conditioned_learner_starts_from_the_base_and_trains_on_state_and_embedding() {
        let dir = tempfile::tempdir().unwrap();
        let agent = meta_dir(dir.path());
        let assets = Arc::new(load_meta_dir(dir.path(), aware_mdp::STATE_DIM).unwrap());
        let store = SqliteStore::open_path(dir.path().join("t.db")).unwrap();
        let models = LocalDirStore::open(dir.path().join("models")).unwrap();
        let t = Target::new("shop", "cart");
        let mut meta = TargetMeta::new(t.clone(), Bounds::default(), assets, 1);
        let mut learner = Learner::new(t.clone(), Bounds::default(), trainer_cfg());
        record(&store, &t, 0, 30, 3.0);
        let e = meta
            .check(&store, &mut learner)
            .published
            .unwrap()
            .embedding;
        let (p, d) = online_round(&mut learner, &store, &models);
        assert_eq!(d.config().state_dim, 9 + E);
        assert_eq!(
            d.config().actor_hidden,
            vec![8],
            "base.ckpt's network, not trainer.hidden"
        );
        assert_eq!(d.train_steps(), agent.base().train_steps() + p.steps as u64);
        // The embedding features keep the meta-learner's scale.
        assert!(d.normalizer().count() > 0);
        assert!(d.normalizer().mean()[9..].iter().all(|&m| m == 0.0));
        assert!(d.normalizer().std()[9..].iter().all(|&s| s == 1.0));
        // And the policy acts on state ‖ embedding.
        let mut s = row(&t, 0, 0).state;
        assert!(d.act(&s).is_err(), "a 9-d state does not fit");
        s.extend_from_slice(&e);
        assert!(d.act(&s).is_ok());
    }

    /// With `learning.mean_field` the base-learner gets the mean field's inputs with zero
    /// weights: it acts as meta-trained whatever the mean field holds. The meta-learner embeds
    /// the target's own nine features (the same embedding as without the mean field), and the
    /// learner trains and publishes networks over state ‖ mean field ‖ embedding.
    #[test]
    fn a_mean_field_learner_starts_from_the_widened_base() {
        let dir = tempfile::tempdir().unwrap();
        let agent = meta_dir(dir.path());
        let width = aware_mdp::state_width(true);
        let assets = Arc::new(load_meta_dir(dir.path(), width).unwrap());
        assert_eq!(assets.base.config().state_dim, width + E);
        let narrow = agent.base();
        let t = Target::new("shop", "cart");
        let e: Vec<f32> = (0..E).map(|j| 0.3 - 0.1 * j as f32).collect();
        for step in 0..10 {
            let s = row(&t, 0, step).state;
            let field: Vec<f32> = (0..width - 9)
                .map(|j| ((j + step as usize) % 3) as f32)
                .collect();
            let a = narrow.act(&[&s[..], &e].concat()).unwrap();
            let b = assets.base.act(&[&s[..], &field, &e].concat()).unwrap();
            assert!(
                a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-6),
                "{a:?} {b:?}"
            );
        }
        assert!(
            load_meta_dir(dir.path(), 5).is_err(),
            "narrower than the nine"
        );

        let store = SqliteStore::open_path(dir.path().join("t.db")).unwrap();
        let models = LocalDirStore::open(dir.path().join("models")).unwrap();
        let mut meta = TargetMeta::new(t.clone(), Bounds::default(), assets, 1);
        let mut learner = Learner::new(t.clone(), Bounds::default(), trainer_cfg());
        learner.set_state_width(width);
        record_wide(&store, &t, 0, 30, 3.0, width - 9);
        let m = meta
            .check(&store, &mut learner)
            .published
            .expect("an embedding");
        // The own features' embedding: that of the same rows without the mean field.
        let narrow_rows: Vec<tstore::Transition> = (0..30).map(|s| row(&t, 0, s)).collect();
        let steps = episode_steps(&narrow_rows, &Bounds::default());
        let want = agent
            .embed(&EpisodeBundle::truncated(9, vec![steps]).unwrap())
            .unwrap();
        assert_eq!(m.embedding, want);
        assert_eq!(learner.state_dim(), width + E);
        let (_, d) = online_round(&mut learner, &store, &models);
        assert_eq!(d.config().state_dim, width + E);
        assert!(d.normalizer().std()[width..].iter().all(|&s| s == 1.0));
        let mut s = store.transitions(&t, 0..1).unwrap()[0].state.clone();
        s.extend_from_slice(&m.embedding);
        assert!(d.act(&s).is_ok());
    }

    #[test]
    fn config_keys() {
        let c = TrainerConfig::default();
        assert!(c.meta_dir.is_empty(), "meta-learning is off by default");
        let bad = TrainerConfig {
            embedding_refresh_episodes: 0,
            ..c
        };
        assert!(bad.validate().is_err());
        let parsed: TrainerConfig = serde_json::from_value(serde_json::json!({
            "meta_dir": "/m", "embedding_refresh_episodes": 3
        }))
        .unwrap();
        assert_eq!(
            (parsed.meta_dir.as_str(), parsed.embedding_refresh_episodes),
            ("/m", 3)
        );
    }

    #[test]
    fn a_bad_meta_dir_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = load_meta_dir(dir.path(), aware_mdp::STATE_DIM).unwrap_err();
        assert!(matches!(e, EmbeddingError::Io { .. }), "{e}");
        assert!(e.to_string().contains("meta.ckpt"), "{e}");
        meta_dir(dir.path());
        std::fs::write(dir.path().join("base.ckpt"), b"garbage").unwrap();
        let e = load_meta_dir(dir.path(), aware_mdp::STATE_DIM).unwrap_err();
        assert!(matches!(e, EmbeddingError::Checkpoint { .. }), "{e}");
        assert!(e.to_string().contains("base.ckpt"), "{e}");
        // A base-learner that does not take state ‖ embedding.
        let plain = Ddpg::new(DdpgConfig::with_hidden(9, &[8])).unwrap();
        std::fs::write(dir.path().join("base.ckpt"), plain.to_bytes().unwrap()).unwrap();
        let e = load_meta_dir(dir.path(), aware_mdp::STATE_DIM).unwrap_err();
        assert!(matches!(e, EmbeddingError::Shape { .. }), "{e}");
    }

    #[test]
    fn bad_bundles_turn_meta_learning_off_for_the_target() {
        let b = Bounds::default();
        let t = Target::new("a", "b");
        // A NaN in the rows fails the bundle.
        let mut rows: Vec<_> = (0..5).map(|s| row(&t, 0, s)).collect();
        rows[2].state = aware_mdp::State {
            io_util: f32::NAN,
            ..aware_mdp::State::from_slice(&rows[2].state).unwrap()
        }
        .to_vec();
        assert!(bundle_of_rows(&[rows], &b).is_err());
        assert!(bundle_of_rows(&[vec![]], &b).unwrap().is_none());

        // A meta-learner that cannot embed the store's rows (built for 5-d states).
        let dir = tempfile::tempdir().unwrap();
        let agent = MetaDdpg::new(
            DdpgConfig::with_hidden(5, &[8]),
            MetaConfig {
                state_dim: 5,
                ..meta_cfg()
            },
        )
        .unwrap();
        let (base, meta) = agent.into_parts();
        let assets = Arc::new(MetaAssets {
            meta,
            base: Arc::new(base),
            version: 1,
        });
        let store = SqliteStore::open_path(dir.path().join("t.db")).unwrap();
        let models = LocalDirStore::open(dir.path().join("models")).unwrap();
        record(&store, &t, 0, 30, 3.0);
        let mut tm = TargetMeta::new(t.clone(), b, assets, 1);
        let mut learner = Learner::new(t.clone(), b, trainer_cfg());
        let c = tm.check(&store, &mut learner);
        assert!(c.published.is_none());
        assert!(
            matches!(c.error, Some(EmbeddingError::Bundle { .. })),
            "{:?}",
            c.error
        );
        assert!(c.disabled && tm.is_disabled() && tm.ready());
        // The target trains a plain base-learner.
        assert!(learner.conditioning().is_none());
        let p = learner
            .maybe_train_in(Stage::Online, &store, &models)
            .unwrap()
            .expect("a plain round");
        assert_eq!(p.version, 1);
        assert_eq!(learner.state_dim(), 9);
        // Later checks do nothing.
        let c = tm.check(&store, &mut learner);
        assert!(c.error.is_none() && c.published.is_none());
    }
}
