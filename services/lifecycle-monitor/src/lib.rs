//! lifecycle-monitor: runs Algorithm 1 of the paper (bootstrapping and the retraining trigger)
//! for every target and publishes `lifecycle` on every change of stage.
//!
//! Rewards are the per-step means of episodes (`episode.mean_reward`), so the profile's
//! thresholds do not depend on the episode length. The decision window holds the rewards of the
//! last `window` episodes *of the current stage*; it is cleared on every transition and a decision
//! needs a full window:
//! - OFFLINE uses the trainer's off-policy estimate of the RL policy: the latest `model`'s
//!   `policy_estimate` decides on its own (it already averages the recent fallback episodes), or
//!   a full window of `episode.policy_estimate`; episodes without an estimate do not count
//!   (there is no RL policy to judge yet). With `require_behaviour` (default) a model's estimate
//!   must also not fall below the behaviour's reward (the model's `behaviour_reward`, else the
//!   mean reward of the recent OFFLINE episodes) by more than `behaviour_margin` (relative); the
//!   episode-estimate window decides on `t_online` alone;
//! - ONLINE and SERVING use the rewards of episodes that ran in that stage.
//!
//! Probation (issue [rl-agent] item 3): after OFFLINE → ONLINE, if the mean reward of the first
//! `probation_episodes` ONLINE episodes falls below the fallback's reward (the mean of the last
//! `fallback_episodes` OFFLINE episodes, which the fallback earned) by more than
//! `probation_margin` (relative), the monitor sends the target back to OFFLINE with a reason, and
//! the recommender's fallback drives from the next step. It then waits for a model trained after
//! the return and `readmit_after_episodes` more OFFLINE episodes before it promotes again.
//! Settings: the `[lifecycle_monitor]` section ([`MonitorConfig`]).

use std::collections::VecDeque;

use std::sync::Arc;

use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, WrapFuture};
use aware_bus_schemas::{
    now_ms, Episode, Event, EventKind, Lifecycle, Model, ModelKind, Schema, Stage, Target,
};
use aware_shared::agents::{run_actors, spawn_publisher, Deliver, Outbox, Retire, TargetActors};
use aware_shared::config::LifecycleProfile;
use aware_shared::launcher::ServiceEntry;
use aware_shared::model_store::{get_verified, open_model_store, ModelStore, ModelStoreConfig};
use aware_shared::registry::{log_change, Change, Registered};
use aware_shared::service::{ServiceContext, ServiceError};
use aware_shared::telemetry::{ServiceMetrics, TelemetryError};
use serde::{Deserialize, Serialize};

pub const NAME: &str = "lifecycle-monitor";
/// `obs` only registers targets: the first one starts the target's agent, which announces its
/// initial stage. `model` carries the trainer's off-policy estimate.
pub const CONSUMES: &[EventKind] = &[
    EventKind::Episode,
    EventKind::Model,
    EventKind::Obs,
    EventKind::Target,
];
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
};

/// The `[lifecycle_monitor]` section: the safety rules around ONLINE.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MonitorConfig {
    /// OFFLINE → ONLINE also needs the estimate ≥ behaviour reward − `behaviour_margin`·|behaviour
    /// reward| (besides ≥ `lifecycle.t_online`).
    pub require_behaviour: bool,
    pub behaviour_margin: f64,
    /// Probation: the first this-many ONLINE episodes after OFFLINE → ONLINE (0: no probation).
    pub probation_episodes: usize,
    /// Back to OFFLINE when their mean reward is below the fallback's by more than this fraction.
    pub probation_margin: f64,
    /// The fallback's reward: the mean of this many last OFFLINE episodes.
    pub fallback_episodes: usize,
    /// After a return to OFFLINE: OFFLINE episodes to wait (besides a newer model) before the
    /// next promotion; doubled after every further failed probation (capped at 1000).
    pub readmit_after_episodes: usize,
    /// Re-baselining (default 10; 0: off, Algorithm 1 as in the paper). When the last
    /// this-many ONLINE episodes no longer improve (the newer half's mean reward is above the
    /// older half's by at most `rebaseline_tolerance`, relative) while the window's std is
    /// within `t_var` and the level is at least `t_online`, the target goes SERVING at the level it reached: it stays
    /// SERVING while the window's mean is at least that level less `rebaseline_margin`
    /// (relative; never above `t_serving`). A workload change that lowers what any policy can
    /// earn then ends in SERVING instead of exploring for ever below a `t_serving` it can no
    /// longer reach. The level is not persisted: after a restart `t_serving` applies again.
    /// Never below what the policy earned before it retrained: while retraining (ONLINE
    /// entered from SERVING) a level below the lowest episode reward of the window that
    /// triggered it, less `rebaseline_margin` (relative), is not served — retraining that
    /// settled there made the policy worse than not retraining. With `rebaseline_rollback`
    /// the target then goes back to SERVING with the policy in force at the trigger; without
    /// it, it keeps learning.
    pub rebaseline_after_episodes: usize,
    pub rebaseline_tolerance: f64,
    pub rebaseline_margin: f64,
    /// While ONLINE, feed only noise-free episodes (`exploring_steps` = 0 with RL steps: the
    /// recommender's `eval_every_episodes`) to the ONLINE → SERVING decision and to
    /// re-baselining, so they judge the policy and not the policy plus its exploration noise.
    /// Exploring episodes still count for probation. Needs `recommender.eval_every_episodes`:
    /// after [`NOISE_FREE_PATIENCE`] ONLINE episodes with RL steps in a row, none noise-free (the
    /// recommender's evaluation episodes are off, or rarer than that) the rule is suspended,
    /// with a warning, and every ONLINE episode is fed again until the next noise-free one, so
    /// a target never stays ONLINE for want of evaluation episodes. Default on.
    pub online_noise_free_only: bool,
    /// Rollback (default on; needs `rebaseline_after_episodes`): a retraining that settled below
    /// what the policy earned before it (see above) ends ONLINE → SERVING with
    /// `Lifecycle::rollback_to` = the base-learner version the monitor last saw before the
    /// trigger. The trainer resumes from that checkpoint and republishes it as a new version,
    /// so the recommenders serve the policy that earned the triggering window again; the
    /// target stays SERVING while the window's mean is at least that window's lowest reward less
    /// `rebaseline_margin` (never above `t_serving`). A monitor that saw no model before the
    /// trigger keeps learning instead.
    pub rebaseline_rollback: bool,
    /// Re-probing (0: off; needs `rebaseline_after_episodes`): a target SERVING at a
    /// re-baselined or rolled-back level (below `t_serving`) retrains again after this many
    /// SERVING episodes there, to look for a better policy than the one retraining settled on.
    /// The re-probe is held to what the served policy earned over those episodes (their mean,
    /// no margin): settling below it rolls back to the version served before the re-probe
    /// (with `rebaseline_rollback`). A re-probe that ends without gaining more than
    /// `rebaseline_tolerance` doubles the wait before the next (capped at 1000 episodes); one
    /// that gains, reaches `t_serving`, or a retraining the rewards trigger, resets it.
    pub reprobe_after_episodes: usize,
    /// Hysteresis of the retraining trigger (relative, 0: off, Algorithm 1 as in the paper): a
    /// target that went SERVING on `t_serving` retrains when the window's mean falls below
    /// `t_serving` less this fraction of it (or its std exceeds `t_var`), so a policy whose
    /// rewards hover at `t_serving` does not retrain on every dip. A re-baselined level already
    /// has `rebaseline_margin` below it.
    pub serving_hysteresis: f64,
    /// The fallback floor (default on): a policy that, after a promotion, would go SERVING
    /// (re-baselined at the level it settled, or on `t_serving`) while earning less than the
    /// fallback's reward by more than `probation_margin` is not served: the target returns to
    /// OFFLINE and the fallback drives again, as after a failed probation (a newer model and
    /// `readmit_after_episodes`, doubled per failure, before the next promotion). The probation
    /// judges only the first ONLINE episodes; this judges the policy learning settled on.
    /// Off: it serves at that level. Retraining (ONLINE entered from SERVING) is held to what
    /// the policy earned before it instead, the workload having moved on since the fallback's
    /// episodes.
    pub fallback_floor: bool,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            require_behaviour: true,
            behaviour_margin: 0.05,
            probation_episodes: 3,
            probation_margin: 0.10,
            fallback_episodes: 5,
            readmit_after_episodes: 2,
            rebaseline_after_episodes: 10,
            rebaseline_tolerance: 0.02,
            rebaseline_margin: 0.05,
            online_noise_free_only: true,
            rebaseline_rollback: true,
            reprobe_after_episodes: 0,
            serving_hysteresis: 0.0,
            fallback_floor: true,
        }
    }
}

/// `online_noise_free_only`: ONLINE episodes with RL steps in a row, none noise-free, after
/// which the rule is suspended (the recommenders evidently have no evaluation episodes).
pub const NOISE_FREE_PATIENCE: usize = 10;

/// A setting out of range; names the key.
#[derive(Debug, thiserror::Error)]
#[error("lifecycle_monitor.{key}: {reason}")]
pub struct MonitorConfigError {
    pub key: &'static str,
    pub reason: &'static str,
}

impl MonitorConfig {
    /// Algorithm 1 as in the paper: no re-baselining, no fallback floor, every ONLINE episode
    /// decides (the other rules at their defaults).
    pub fn algorithm1() -> Self {
        MonitorConfig {
            rebaseline_after_episodes: 0,
            online_noise_free_only: false,
            fallback_floor: false,
            ..MonitorConfig::default()
        }
    }

    pub fn validate(&self) -> Result<(), MonitorConfigError> {
        let bad = |key, reason| Err(MonitorConfigError { key, reason });
        for (key, v) in [
            ("behaviour_margin", self.behaviour_margin),
            ("probation_margin", self.probation_margin),
            ("rebaseline_tolerance", self.rebaseline_tolerance),
            ("rebaseline_margin", self.rebaseline_margin),
            ("serving_hysteresis", self.serving_hysteresis),
        ] {
            if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                return bad(key, "must be a fraction in [0, 1]");
            }
        }
        if self.probation_episodes > 1_000 {
            return bad("probation_episodes", "must be at most 1000");
        }
        if !(1..=1_000).contains(&self.fallback_episodes) {
            return bad("fallback_episodes", "must be in 1..=1000");
        }
        if self.readmit_after_episodes > 1_000 {
            return bad("readmit_after_episodes", "must be at most 1000");
        }
        if self.reprobe_after_episodes > 1_000 {
            return bad("reprobe_after_episodes", "must be at most 1000");
        }
        if self.rebaseline_after_episodes == 1 || self.rebaseline_after_episodes > 1_000 {
            return bad(
                "rebaseline_after_episodes",
                "must be 0 (off) or in 2..=1000 (an older and a newer half)",
            );
        }
        Ok(())
    }
}

/// A change of stage and what decided it.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub from: Stage,
    pub to: Stage,
    pub reason: String,
    pub mean: Option<f64>,
    pub std: Option<f64>,
    pub window: u32,
    /// A rollback: the base-learner version to serve again (see
    /// [`MonitorConfig::rebaseline_rollback`]).
    pub rollback_to: Option<u64>,
}

/// Algorithm 1 for one target.
#[derive(Debug, Clone)]
pub struct LifecycleMachine {
    profile: LifecycleProfile,
    rules: MonitorConfig,
    stage: Stage,
    rewards: VecDeque<f64>,
    /// The newest episode taken into account: `episode` is delivered at least once, so a repeat
    /// (or an older episode) is ignored.
    last_episode: Option<u64>,
    /// The newest model version seen (repeats and older versions are ignored).
    last_model: Option<u64>,
    /// Mean rewards of the last OFFLINE episodes (earned by the fallback).
    fallback_rewards: VecDeque<f64>,
    /// While on probation: the fallback's reward at promotion and the ONLINE rewards so far.
    probation: Option<(f64, Vec<f64>)>,
    /// After a return to OFFLINE: the newest model version then, and OFFLINE episodes since.
    demoted: Option<(u64, usize)>,
    /// Failed probations so far (the readmission wait doubles with each).
    failures: u32,
    /// Rewards of the ONLINE episodes since the last transition (the last
    /// `rebaseline_after_episodes`), for re-baselining.
    online_rewards: VecDeque<f64>,
    /// SERVING after a re-baseline: the mean reward below which the target retrains.
    serving_floor: Option<f64>,
    /// While retraining (ONLINE entered from SERVING): the lowest episode reward of the window
    /// that triggered it, what the policy earned before it retrained; re-baselining never
    /// serves a level below it (less `rebaseline_margin`).
    retrain_from: Option<f64>,
    /// ONLINE episodes with RL steps since the last noise-free one (see
    /// `online_noise_free_only`).
    without_noise_free: usize,
    /// While retraining: the base-learner version the monitor last saw before the trigger.
    retrain_version: Option<u64>,
    /// SERVING at a re-baselined or rolled-back level: Σ and count of the SERVING episode
    /// rewards since (for re-probing).
    served: (f64, usize),
    /// While ONLINE: entered by a re-probe.
    reprobing: bool,
    /// Re-probes in a row that gained nothing (the wait doubles with each).
    reprobe_failures: u32,
}

fn mean_std(xs: &VecDeque<f64>) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

impl LifecycleMachine {
    pub fn new(profile: LifecycleProfile) -> Self {
        Self::with_rules(profile, MonitorConfig::default())
    }

    pub fn with_rules(profile: LifecycleProfile, rules: MonitorConfig) -> Self {
        LifecycleMachine {
            profile,
            rules,
            stage: Stage::Initialized,
            rewards: VecDeque::new(),
            last_episode: None,
            last_model: None,
            fallback_rewards: VecDeque::new(),
            probation: None,
            demoted: None,
            failures: 0,
            online_rewards: VecDeque::new(),
            serving_floor: None,
            retrain_from: None,
            without_noise_free: 0,
            retrain_version: None,
            served: (0.0, 0),
            reprobing: false,
            reprobe_failures: 0,
        }
    }

    /// The mean reward below which a SERVING target goes back to ONLINE: `t_serving` less
    /// `serving_hysteresis`, or the re-baselined level (never above `t_serving`).
    pub fn serving_bar(&self) -> f64 {
        let t = self.profile.t_serving;
        self.serving_floor
            .map_or(t - self.rules.serving_hysteresis * t.abs(), |f| f.min(t))
    }

    /// Whether the target is SERVING at a re-baselined level.
    pub fn rebaselined(&self) -> bool {
        self.stage == Stage::Serving && self.serving_floor.is_some()
    }

    /// The fallback's reward: the mean of the recent OFFLINE episodes, if any.
    pub fn fallback_reward(&self) -> Option<f64> {
        (!self.fallback_rewards.is_empty()).then(|| mean_std(&self.fallback_rewards).0)
    }

    /// OFFLINE episodes to wait after the last failed probation: `readmit_after_episodes`,
    /// doubled per earlier failure, capped at 1000.
    pub fn readmit_wait(&self) -> usize {
        let doublings = self.failures.saturating_sub(1).min(10);
        (self.rules.readmit_after_episodes << doublings).min(1_000)
    }

    /// Whether the target is in its first ONLINE episodes after a promotion.
    pub fn on_probation(&self) -> bool {
        self.probation.is_some()
    }

    /// OFFLINE → ONLINE on `estimate` if it reaches t_online and (a model's estimate, with
    /// `require_behaviour`) is not below `behaviour` by more than the margin; `None` otherwise.
    fn try_promote(
        &mut self,
        estimate: f64,
        from_model: bool,
        behaviour: Option<f64>,
        source: &str,
        stats: Option<(f64, f64)>,
    ) -> Option<Transition> {
        if let Some((_, episodes)) = self.demoted {
            if episodes < self.readmit_wait() {
                return None;
            }
        }
        let p = &self.profile;
        if estimate < p.t_online {
            return None;
        }
        let mut reason = format!("{source} {estimate:.3} >= t_online {}", p.t_online);
        if self.rules.require_behaviour && from_model {
            let b = behaviour.filter(|b| b.is_finite())?;
            let floor = b - self.rules.behaviour_margin * b.abs();
            if estimate < floor {
                return None;
            }
            reason.push_str(&format!(
                " and not below the fallback's {b:.3} by more than {:.0}%",
                self.rules.behaviour_margin * 100.0
            ));
        }
        let t = self.go(Stage::Online, reason, stats);
        self.demoted = None;
        if self.rules.probation_episodes > 0 {
            if let Some(f) = self.fallback_reward() {
                self.probation = Some((f, Vec::new()));
            }
        }
        Some(t)
    }

    /// Whether `m` could promote the target: a base-learner newer than the last one seen, with a
    /// finite estimate, while OFFLINE. Only such a model is worth verifying in the store first.
    pub fn could_promote(&self, m: &Model) -> bool {
        m.kind == ModelKind::BaseLearner
            && self.last_model.is_none_or(|v| m.version > v)
            && self.stage == Stage::Offline
            && m.policy_estimate.is_some_and(f64::is_finite)
    }

    /// Takes the trainer's `model`: in OFFLINE its off-policy estimate may promote the target.
    pub fn observe_model(&mut self, m: &Model) -> Option<Transition> {
        if m.kind != ModelKind::BaseLearner || self.last_model.is_some_and(|v| m.version <= v) {
            return None;
        }
        self.last_model = Some(m.version);
        if self.stage != Stage::Offline {
            return None;
        }
        let est = m.policy_estimate.filter(|e| e.is_finite())?;
        let behaviour = m.behaviour_reward.or_else(|| self.fallback_reward());
        self.try_promote(est, true, behaviour, "model estimate", Some((est, 0.0)))
    }

    pub fn stage(&self) -> Stage {
        self.stage
    }

    fn go(&mut self, to: Stage, reason: String, stats: Option<(f64, f64)>) -> Transition {
        self.probation = None;
        let t = Transition {
            from: self.stage,
            to,
            reason,
            mean: stats.map(|s| s.0),
            std: stats.map(|s| s.1),
            window: u32::try_from(self.rewards.len()).unwrap_or(u32::MAX),
            rollback_to: None,
        };
        self.stage = to;
        self.rewards.clear();
        self.online_rewards.clear();
        self.serving_floor = None;
        self.retrain_from = None;
        self.retrain_version = None;
        self.served = (0.0, 0);
        self.reprobing = false;
        t
    }

    /// SERVING episodes at a re-baselined level before the next re-probe:
    /// `reprobe_after_episodes`, doubled per re-probe in a row that gained nothing, capped at
    /// 1000; `None` when re-probing is off.
    pub fn reprobe_wait(&self) -> Option<usize> {
        let n = self.rules.reprobe_after_episodes;
        (n > 0 && self.rules.rebaseline_after_episodes > 0)
            .then(|| (n << self.reprobe_failures.min(10)).min(1_000))
    }

    /// Whether the target is ONLINE for a re-probe.
    pub fn reprobing(&self) -> bool {
        self.stage == Stage::Online && self.reprobing
    }

    /// A re-probe ended (`gained`: it settled higher than the served policy earned, by more
    /// than `rebaseline_tolerance`, or reached `t_serving`).
    fn reprobe_ended(&mut self, gained: bool) {
        if self.reprobing {
            self.reprobe_failures = if gained {
                0
            } else {
                self.reprobe_failures.saturating_add(1)
            };
        }
    }

    /// While retraining: the level re-baselining may not go below (see
    /// [`MonitorConfig::rebaseline_after_episodes`]), `None` otherwise.
    pub fn rebaseline_floor(&self) -> Option<f64> {
        let margin = if self.reprobing {
            0.0
        } else {
            self.rules.rebaseline_margin
        };
        self.retrain_from.map(|r| r - margin * r.abs())
    }

    /// The fallback floor ([`MonitorConfig::fallback_floor`]): the fallback's reward when
    /// `level`, reached while first learning (not retraining), is below it by more than
    /// `probation_margin`.
    fn below_fallback(&self, level: f64) -> Option<f64> {
        if !self.rules.fallback_floor || self.retrain_from.is_some() {
            return None;
        }
        self.fallback_reward()
            .filter(|f| level < f - self.rules.probation_margin * f.abs())
    }

    /// Re-baselining (see [`MonitorConfig::rebaseline_after_episodes`]): ONLINE → SERVING at the
    /// level the last ONLINE episodes settled at; `std` is the decision window's.
    fn try_rebaseline(&mut self, std: f64) -> Option<Transition> {
        let n = self.rules.rebaseline_after_episodes;
        if n < 2 || self.online_rewards.len() < n || self.probation.is_some() {
            return None;
        }
        let p = &self.profile;
        if std > p.t_var {
            return None;
        }
        let half = n / 2;
        let len = self.online_rewards.len();
        let older = self.online_rewards.iter().take(half).sum::<f64>() / half as f64;
        let newer = self.online_rewards.iter().skip(len - half).sum::<f64>() / half as f64;
        if newer - older > self.rules.rebaseline_tolerance * older.abs() || newer < p.t_online {
            return None;
        }
        if let Some(fallback) = self.below_fallback(newer) {
            let reason = format!(
                "settled below the fallback: the last {n} ONLINE episodes settled at {newer:.3}, below the fallback's {fallback:.3} by more than {:.0}%; the fallback drives again",
                self.rules.probation_margin * 100.0
            );
            return Some(self.demote(reason, (newer, std), n));
        }
        if let (Some(before), Some(earned)) = (self.rebaseline_floor(), self.retrain_from) {
            if newer < before {
                if let Some(v) = self
                    .retrain_version
                    .filter(|_| self.rules.rebaseline_rollback)
                {
                    let floor =
                        (earned - self.rules.rebaseline_margin * earned.abs()).min(p.t_serving);
                    let what = if self.reprobing {
                        "re-probe"
                    } else {
                        "retraining"
                    };
                    let reason = format!(
                        "rolled back to version {v}: {what} settled at {newer:.3} (last {n} ONLINE episodes, std {std:.3}), below the {earned:.3} the policy earned before it; serving that policy while the mean stays >= {floor:.3}"
                    );
                    self.reprobe_ended(false);
                    let mut t = self.go(Stage::Serving, reason, Some((newer, std)));
                    t.rollback_to = Some(v);
                    self.serving_floor = Some(floor);
                    return Some(t);
                }
                tracing::debug!(
                    settled = newer,
                    before,
                    "not re-baselined: retraining settled below what the policy earned before it"
                );
                return None;
            }
        }
        let floor = (newer - self.rules.rebaseline_margin * newer.abs()).min(p.t_serving);
        let reason = format!(
            "re-baselined: the last {n} ONLINE episodes settled at {newer:.3} (older half {older:.3}, t_serving {} out of reach) with std {std:.3} <= t_var {}; serving while the mean stays >= {floor:.3}",
            p.t_serving, p.t_var
        );
        let gained = self
            .retrain_from
            .is_some_and(|e| newer > e + self.rules.rebaseline_tolerance * e.abs());
        self.reprobe_ended(gained);
        let t = self.go(Stage::Serving, reason, Some((newer, std)));
        self.serving_floor = Some(floor);
        Some(t)
    }

    /// Applies the profile the controller registered for the target (`AwareAutoscaler`
    /// `spec.lifecycle`). Thresholds and the window apply from the next decision; turning
    /// `bootstrap` off while the target is still bootstrapping with no episode seen takes it
    /// ONLINE now.
    pub fn set_profile(&mut self, profile: LifecycleProfile) -> Option<Transition> {
        if self.profile == profile {
            return None;
        }
        self.profile = profile;
        while self.rewards.len() > self.profile.window {
            self.rewards.pop_front();
        }
        if !self.profile.bootstrap && self.stage == Stage::Offline && self.last_episode.is_none() {
            return Some(self.go(
                Stage::Online,
                "bootstrapping disabled in the registered profile".into(),
                None,
            ));
        }
        None
    }

    /// Restores the stage a previous run of the monitor published (read back from the JetStream
    /// capture at start-up), so a restart does not send a SERVING target back to OFFLINE. The
    /// decision window refills from the next episodes.
    pub fn restore(&mut self, stage: Stage) {
        if self.stage == Stage::Initialized && stage != Stage::Initialized {
            self.stage = stage;
        }
    }

    /// Lines 4–9: leaves INITIALIZED for OFFLINE (bootstrapping) or ONLINE.
    pub fn start(&mut self) -> Option<Transition> {
        if self.stage != Stage::Initialized {
            return None;
        }
        Some(if self.profile.bootstrap {
            self.go(
                Stage::Offline,
                "bootstrapping: the HPA/VPA fallback drives while the policy trains offline".into(),
                None,
            )
        } else {
            self.go(
                Stage::Online,
                "bootstrapping disabled in the profile".into(),
                None,
            )
        })
    }

    /// Lines 10–21: takes one finished episode and returns the transition it causes, if any.
    pub fn observe(&mut self, ep: &Episode) -> Option<Transition> {
        if self.last_episode.is_some_and(|last| ep.episode <= last) {
            return None;
        }
        self.last_episode = Some(ep.episode);
        if self.stage == Stage::Offline && ep.stage == Stage::Offline && ep.mean_reward.is_finite()
        {
            self.fallback_rewards.push_back(ep.mean_reward);
            while self.fallback_rewards.len() > self.rules.fallback_episodes {
                self.fallback_rewards.pop_front();
            }
            if let Some((_, n)) = self.demoted.as_mut() {
                *n += 1;
            }
        }
        if let Some(t) = self.probation_check(ep) {
            return Some(t);
        }
        let noise_free = ep.exploring_steps == Some(0) && ep.rl_steps > 0;
        // Only episodes the policy acted in tell whether the recommenders evaluate (one driven by
        // the fallback, before a model arrives, says nothing).
        if ep.stage == Stage::Online && ep.rl_steps > 0 {
            if noise_free {
                self.without_noise_free = 0;
            } else {
                self.without_noise_free = self.without_noise_free.saturating_add(1);
                if self.rules.online_noise_free_only
                    && self.without_noise_free == NOISE_FREE_PATIENCE
                {
                    tracing::warn!(
                        episode = ep.episode,
                        patience = NOISE_FREE_PATIENCE,
                        "online_noise_free_only: no noise-free ONLINE episode (is \
                         recommender.eval_every_episodes 0?); exploring episodes decide until one \
                         arrives"
                    );
                }
            }
        }
        let sample = match self.stage {
            Stage::Initialized => return self.start(),
            Stage::Offline => ep.policy_estimate,
            Stage::Online
                if ep.stage == Stage::Online
                    && self.rules.online_noise_free_only
                    && !noise_free
                    && self.without_noise_free < NOISE_FREE_PATIENCE =>
            {
                None
            }
            Stage::Online | Stage::Serving if ep.stage == self.stage => Some(ep.mean_reward),
            Stage::Online | Stage::Serving => None,
        };
        let r = sample.filter(|r| r.is_finite())?;
        self.rewards.push_back(r);
        while self.rewards.len() > self.profile.window {
            self.rewards.pop_front();
        }
        if self.stage == Stage::Serving && self.serving_floor.is_some() {
            self.served.0 += r;
            self.served.1 += 1;
        }
        if self.stage == Stage::Online && self.rules.rebaseline_after_episodes > 0 {
            self.online_rewards.push_back(r);
            while self.online_rewards.len() > self.rules.rebaseline_after_episodes {
                self.online_rewards.pop_front();
            }
        }
        if self.rewards.len() < self.profile.window {
            return None;
        }
        let (mean, std) = mean_std(&self.rewards);
        let p = &self.profile;
        let stats = Some((mean, std));
        match self.stage {
            // The episode-estimate path decides on t_online alone, as before the trainer
            // published estimates with the behaviour's reward on the same data.
            Stage::Offline => self.try_promote(mean, false, None, "estimated reward", stats),
            Stage::Online if mean >= p.t_serving && std <= p.t_var => {
                if let Some(fallback) = self.below_fallback(mean) {
                    let n = self.rewards.len();
                    let reason = format!(
                        "settled below the fallback: the last {n} ONLINE episodes' mean reward {mean:.3} reaches t_serving {} but is below the fallback's {fallback:.3} by more than {:.0}%; the fallback drives again",
                        p.t_serving,
                        self.rules.probation_margin * 100.0
                    );
                    return Some(self.demote(reason, (mean, std), n));
                }
                let reason = format!(
                    "reward mean {mean:.3} >= t_serving {} and std {std:.3} <= t_var {}",
                    p.t_serving, p.t_var
                );
                self.reprobe_ended(true);
                Some(self.go(Stage::Serving, reason, stats))
            }
            Stage::Online => self.try_rebaseline(std),
            Stage::Serving if mean < self.serving_bar() || std > p.t_var => {
                let bar = match self.serving_floor {
                    Some(_) => format!("re-baselined level {:.3}", self.serving_bar()),
                    None if self.rules.serving_hysteresis > 0.0 => format!(
                        "t_serving {} less {:.0}% hysteresis: {:.3}",
                        p.t_serving,
                        100.0 * self.rules.serving_hysteresis,
                        self.serving_bar()
                    ),
                    None => format!("t_serving {}", p.t_serving),
                };
                let before = self.rewards.iter().copied().fold(f64::INFINITY, f64::min);
                let t = self.go(
                    Stage::Online,
                    format!(
                        "retraining: reward mean {mean:.3} ({bar}) std {std:.3} (t_var {})",
                        p.t_var
                    ),
                    stats,
                );
                self.retrain_from = before.is_finite().then_some(before);
                self.retrain_version = self.last_model;
                self.reprobe_failures = 0;
                Some(t)
            }
            Stage::Serving
                if self.serving_floor.is_some()
                    && self.reprobe_wait().is_some_and(|w| self.served.1 >= w) =>
            {
                let (sum, n) = self.served;
                let earned = sum / n as f64;
                let t = self.go(
                    Stage::Online,
                    format!(
                        "re-probing: served {n} episodes at {earned:.3} below t_serving {} (re-baselined level {:.3}); retraining to look for a better policy, held to {earned:.3}",
                        p.t_serving,
                        self.serving_bar()
                    ),
                    stats,
                );
                self.retrain_from = Some(earned);
                self.retrain_version = self.last_model;
                self.reprobing = true;
                Some(t)
            }
            _ => None,
        }
    }
}

impl LifecycleMachine {
    /// The probation rule on one episode; `Some` when it sends the target back to OFFLINE.
    fn probation_check(&mut self, ep: &Episode) -> Option<Transition> {
        if self.stage != Stage::Online || ep.stage != Stage::Online || !ep.mean_reward.is_finite() {
            return None;
        }
        let k = self.rules.probation_episodes;
        let (fallback, seen) = self.probation.as_mut()?;
        seen.push(ep.mean_reward);
        if seen.len() < k {
            return None;
        }
        let fallback = *fallback;
        let n = seen.len();
        let mean = seen.iter().sum::<f64>() / n as f64;
        let std = (seen.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        self.probation = None;
        let floor = fallback - self.rules.probation_margin * fallback.abs();
        if mean >= floor {
            tracing::debug!(mean, fallback, "probation passed");
            return None;
        }
        let reason = format!(
            "probation failed: the first {n} ONLINE episodes' mean reward {mean:.3} is below the fallback's {fallback:.3} by more than {:.0}%; the fallback drives again",
            self.rules.probation_margin * 100.0
        );
        Some(self.demote(reason, (mean, std), n))
    }

    /// ONLINE → OFFLINE: the fallback drives again; only a model trained after the return, and
    /// `readmit_wait` OFFLINE episodes, promote again. `n`: the episodes that decided.
    fn demote(&mut self, reason: String, stats: (f64, f64), n: usize) -> Transition {
        let newest = self.last_model.unwrap_or(0);
        let mut t = self.go(Stage::Offline, reason, Some(stats));
        t.window = u32::try_from(n).unwrap_or(u32::MAX);
        self.demoted = Some((newest, 0));
        self.failures = self.failures.saturating_add(1);
        // Only models trained after the return may promote again.
        self.last_model = Some(newest);
        t
    }
}

fn message(target: &Target, episode: u64, step: u32, t: Transition) -> Lifecycle {
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
        ]
        .map(|(from, to)| [from.as_str(), to.as_str()]);
        let transitions = m.counter_vec(
            "lifecycle_transitions_total",
            "Stage transitions (Algorithm 1, probation, re-baselining, rollback), by from and to",
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
        Ok(LifecycleMetrics {
            stages,
            transitions,
            unverified_models,
            non_finite,
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
            tracing::info!(target = %self.target, from = %t.from, to = %t.to, reason = %t.reason, mean = ?t.mean, window = t.window, "lifecycle transition");
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
                        lifecycle: Some(p), ..
                    } => (self.machine.set_profile(p), 0, 0),
                    _ => return,
                }
            }
            _ => return,
        };
        self.track(t.as_ref());
        if let Some(t) = t {
            tracing::info!(target = %self.target, from = %t.from, to = %t.to, reason = %t.reason, mean = ?t.mean, window = t.window, "lifecycle transition");
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
    let mut restored: std::collections::HashMap<Target, Stage> = ctx
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
    let store_cfg: ModelStoreConfig = ctx.config.section("model_store")?;
    let models = open_model_store(&store_cfg, &ctx.bus, &ctx.config.bus)
        .await
        .map_err(|e| ServiceError::resource("model_store", e))?;
    let registrations = ctx.metrics.registrations.clone();
    let metrics = LifecycleMetrics::new(&ctx.metrics)?;
    let mut actors = TargetActors::new(&ctx, move |t: &Target| {
        let mut machine = LifecycleMachine::with_rules(profile.clone(), rules.clone());
        // Only the target's first actor resumes there: one started again after a retirement is
        // for a target deleted and created again.
        if let Some(stage) = restored.remove(t) {
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
    });
    for spec in &ctx.config.targets {
        actors.get_or_start(&spec.target());
    }
    run_actors(&ctx, CONSUMES, false, &mut actors).await?;
    drop(actors);
    aware_shared::agents::join_publisher(publisher).await
}

#[cfg(test)]
mod tests {
    /// A machine with the paper's Algorithm 1 rules (the defaults add re-baselining and
    /// noise-free decisions).
    fn paper_machine(profile: LifecycleProfile) -> LifecycleMachine {
        LifecycleMachine::with_rules(profile, MonitorConfig::algorithm1())
    }

    use super::*;
    use aware_bus_schemas::generated::samples;

    fn profile(bootstrap: bool) -> LifecycleProfile {
        LifecycleProfile {
            bootstrap,
            t_online: 1.0,
            t_serving: 1.3,
            t_var: 0.1,
            window: 3,
        }
    }

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

    #[test]
    fn a_registered_profile_applies_and_can_switch_bootstrapping_off() {
        let mut m = paper_machine(profile(true));
        assert_eq!(m.start().unwrap().to, Stage::Offline);
        // Same profile: nothing.
        assert!(m.set_profile(profile(true)).is_none());
        // Bootstrapping off while nothing was seen: ONLINE now.
        let t = m.set_profile(profile(false)).expect("a transition");
        assert_eq!((t.from, t.to), (Stage::Offline, Stage::Online));
        assert!(t.reason.contains("registered profile"), "{}", t.reason);

        // Once episodes were seen, switching bootstrapping off changes nothing by itself, but
        // the thresholds apply: a lower t_online promotes on an estimate that did not.
        let mut m = paper_machine(profile(true));
        m.start();
        for n in 1..=3 {
            let mut e = episode(Stage::Offline, 1.0, Some(0.9));
            e.episode = n;
            assert!(m.observe(&e).is_none(), "0.9 < t_online 1.0");
        }
        assert!(m
            .set_profile(LifecycleProfile {
                bootstrap: false,
                t_online: 0.8,
                ..profile(true)
            })
            .is_none());
        let mut e = episode(Stage::Offline, 1.0, Some(0.9));
        e.episode = 4;
        assert_eq!(m.observe(&e).map(|t| t.to), Some(Stage::Online));
    }

    #[test]
    fn a_restored_stage_is_kept_and_not_announced_again() {
        let mut m = paper_machine(profile(true));
        m.restore(Stage::Serving);
        assert_eq!(m.stage(), Stage::Serving);
        assert!(
            m.start().is_none(),
            "no OFFLINE announcement after a restart"
        );
        // Only an undecided machine is restored.
        m.restore(Stage::Offline);
        assert_eq!(m.stage(), Stage::Serving);
    }

    fn episode(stage: Stage, mean: f64, estimate: Option<f64>) -> Episode {
        let Some(Event::Episode(mut e)) = samples()
            .into_iter()
            .find(|e| e.kind() == EventKind::Episode)
        else {
            panic!("sample episode")
        };
        e.stage = stage;
        e.mean_reward = mean;
        e.policy_estimate = estimate;
        e
    }

    /// Drives a machine through `start` and `feed` and returns its stage and last transition.
    fn run_case(
        bootstrap: bool,
        start_at: Option<Stage>,
        feed: &[(Stage, f64, Option<f64>)],
    ) -> (Stage, Option<Transition>) {
        let mut m = paper_machine(profile(bootstrap));
        m.start();
        if let Some(s) = start_at {
            m.stage = s;
        }
        let mut last = None;
        for (n, &(stage, mean, est)) in (1u64..).zip(feed) {
            let mut e = episode(stage, mean, est);
            e.episode = n;
            if let Some(t) = m.observe(&e) {
                last = Some(t);
            }
        }
        (m.stage(), last)
    }

    #[test]
    fn every_transition_of_algorithm_1() {
        use Stage::*;
        type Feed = &'static [(Stage, f64, Option<f64>)];
        let cases: &[(&str, bool, Option<Stage>, Feed, Stage)] = &[
            (
                "bootstrap on: INITIALIZED → OFFLINE",
                true,
                None,
                &[],
                Offline,
            ),
            (
                "bootstrap off: INITIALIZED → ONLINE",
                false,
                None,
                &[],
                Online,
            ),
            (
                "OFFLINE stays below t_online",
                true,
                None,
                &[
                    (Offline, 2.0, Some(0.9)),
                    (Offline, 2.0, Some(0.9)),
                    (Offline, 2.0, Some(0.9)),
                ],
                Offline,
            ),
            (
                "OFFLINE → ONLINE when the estimate reaches t_online",
                true,
                None,
                &[
                    (Offline, 0.1, Some(1.0)),
                    (Offline, 0.1, Some(1.1)),
                    (Offline, 0.1, Some(1.2)),
                ],
                Online,
            ),
            (
                "OFFLINE ignores episodes without an estimate",
                true,
                None,
                &[
                    (Offline, 2.0, None),
                    (Offline, 2.0, None),
                    (Offline, 2.0, None),
                ],
                Offline,
            ),
            (
                "OFFLINE waits for a full window",
                true,
                None,
                &[(Offline, 0.1, Some(5.0)), (Offline, 0.1, Some(5.0))],
                Offline,
            ),
            (
                "ONLINE → SERVING on high mean and low std",
                true,
                Some(Online),
                &[
                    (Online, 1.4, None),
                    (Online, 1.45, None),
                    (Online, 1.5, None),
                ],
                Serving,
            ),
            (
                "ONLINE stays when std is above t_var",
                true,
                Some(Online),
                &[
                    (Online, 1.4, None),
                    (Online, 1.9, None),
                    (Online, 1.4, None),
                ],
                Online,
            ),
            (
                "ONLINE stays when mean is below t_serving",
                true,
                Some(Online),
                &[
                    (Online, 1.2, None),
                    (Online, 1.2, None),
                    (Online, 1.2, None),
                ],
                Online,
            ),
            (
                "SERVING → ONLINE when the mean degrades",
                true,
                Some(Serving),
                &[
                    (Serving, 1.0, None),
                    (Serving, 1.0, None),
                    (Serving, 1.0, None),
                ],
                Online,
            ),
            (
                "SERVING → ONLINE when the variance grows",
                true,
                Some(Serving),
                &[
                    (Serving, 1.4, None),
                    (Serving, 1.9, None),
                    (Serving, 1.4, None),
                ],
                Online,
            ),
            (
                "SERVING stays while good",
                true,
                Some(Serving),
                &[
                    (Serving, 1.5, None),
                    (Serving, 1.5, None),
                    (Serving, 1.5, None),
                ],
                Serving,
            ),
            (
                "stale episodes of another stage are ignored",
                true,
                Some(Serving),
                &[
                    (Online, 0.0, None),
                    (Online, 0.0, None),
                    (Online, 0.0, None),
                ],
                Serving,
            ),
            (
                "non-finite rewards are ignored",
                true,
                Some(Serving),
                &[
                    (Serving, f64::NAN, None),
                    (Serving, f64::NAN, None),
                    (Serving, f64::NAN, None),
                ],
                Serving,
            ),
        ];
        for (name, bootstrap, start_at, feed, want) in cases {
            let (got, _) = run_case(*bootstrap, *start_at, feed);
            assert_eq!(got, *want, "{name}");
        }
    }

    #[test]
    fn transition_reports_window_statistics_and_clears_it() {
        use Stage::*;
        let mut m = paper_machine(profile(true));
        m.start();
        let mut n = 0u64;
        let mut next = |stage, mean, est| {
            n += 1;
            let mut e = episode(stage, mean, est);
            e.episode = n;
            e
        };
        let mut t = None;
        for r in [1.0, 1.2, 1.4] {
            t = m.observe(&next(Offline, 0.0, Some(r)));
        }
        let t = t.unwrap();
        assert_eq!((t.from, t.to, t.window), (Offline, Online, 3));
        assert!((t.mean.unwrap() - 1.2).abs() < 1e-12);
        assert!((t.std.unwrap() - (0.08f64 / 3.0).sqrt()).abs() < 1e-12);
        // The window restarts in ONLINE: two good episodes are not enough.
        assert!(m.observe(&next(Online, 1.5, None)).is_none());
        assert!(m.observe(&next(Online, 1.5, None)).is_none());
        assert_eq!(m.observe(&next(Online, 1.5, None)).unwrap().to, Serving);
    }

    #[test]
    fn repeated_and_old_episodes_are_ignored() {
        use Stage::*;
        let mut m = paper_machine(profile(true));
        m.start();
        let mut e = episode(Offline, 0.0, Some(5.0));
        e.episode = 7;
        assert!(m.observe(&e).is_none());
        // The same episode twice (at-least-once delivery) and an older one do not count.
        assert!(m.observe(&e).is_none());
        e.episode = 3;
        assert!(m.observe(&e).is_none());
        assert_eq!(m.rewards.len(), 1);
        e.episode = 8;
        assert!(m.observe(&e).is_none());
        e.episode = 9;
        assert_eq!(m.observe(&e).unwrap().to, Online);
    }

    /// One input of the machine.
    #[derive(Clone, Copy)]
    enum In {
        /// An episode: stage it ran in, mean reward, episode.policy_estimate.
        Ep(Stage, f64, Option<f64>),
        /// A model: version, policy_estimate, behaviour_reward.
        Model(u64, Option<f64>, Option<f64>),
    }

    fn model(version: u64, est: Option<f64>, behaviour: Option<f64>) -> Model {
        let Some(Event::Model(mut m)) =
            samples().into_iter().find(|e| e.kind() == EventKind::Model)
        else {
            panic!("sample model")
        };
        m.kind = ModelKind::BaseLearner;
        m.version = version;
        m.policy_estimate = est;
        m.behaviour_reward = behaviour;
        m
    }

    /// Runs a machine (bootstrapping on, window 3) through `feed`; returns the final stage and
    /// every transition.
    fn drive(rules: MonitorConfig, feed: &[In]) -> (Stage, Vec<Transition>) {
        let mut m = LifecycleMachine::with_rules(profile(true), rules);
        m.start();
        let mut out = Vec::new();
        let mut n = 0u64;
        for i in feed {
            let t = match *i {
                In::Ep(stage, mean, est) => {
                    n += 1;
                    let mut e = episode(stage, mean, est);
                    e.episode = n;
                    m.observe(&e)
                }
                In::Model(v, est, b) => m.observe_model(&model(v, est, b)),
            };
            out.extend(t);
        }
        (m.stage(), out)
    }

    #[test]
    fn model_estimates_and_probation_table() {
        use In::{Ep, Model as M};
        use Stage::*;
        let on = MonitorConfig::algorithm1();
        let no_behaviour = MonitorConfig {
            require_behaviour: false,
            ..MonitorConfig::algorithm1()
        };
        let no_probation = MonitorConfig {
            probation_episodes: 0,
            ..MonitorConfig::algorithm1()
        };
        // Two OFFLINE episodes earned 1.2 (the fallback's reward), then a promotion.
        const FB: [In; 2] = [Ep(Offline, 1.2, None), Ep(Offline, 1.2, None)];
        const PROMOTE: In = M(1, Some(1.25), Some(1.2));
        let cases: Vec<(&str, &MonitorConfig, Vec<In>, Stage)> = vec![
            (
                "OFFLINE → ONLINE on a model estimate ≥ t_online and ≥ the behaviour's",
                &on,
                vec![M(1, Some(1.1), Some(1.05))],
                Online,
            ),
            (
                "a model estimate below t_online keeps OFFLINE",
                &on,
                vec![M(1, Some(0.95), Some(0.5))],
                Offline,
            ),
            (
                "an estimate below the behaviour's by more than the margin keeps OFFLINE",
                &on,
                vec![M(1, Some(1.1), Some(1.3))],
                Offline,
            ),
            (
                "within the margin (5%) of the behaviour's is enough",
                &on,
                vec![M(1, Some(1.1), Some(1.15))],
                Online,
            ),
            (
                "require_behaviour off: t_online alone decides",
                &no_behaviour,
                vec![M(1, Some(1.1), Some(1.3))],
                Online,
            ),
            (
                "no behaviour reward in the model: the OFFLINE episodes' rewards stand in",
                &on,
                vec![Ep(Offline, 1.5, None), M(1, Some(1.1), None)],
                Offline,
            ),
            (
                "no behaviour reward at all: no promotion while it is required",
                &on,
                vec![M(1, Some(1.1), None)],
                Offline,
            ),
            (
                "a model without an estimate does not count",
                &on,
                vec![M(1, None, Some(0.5))],
                Offline,
            ),
            (
                "a repeated or older model version is ignored",
                &on,
                vec![M(2, None, None), M(2, Some(5.0), Some(1.0)), M(1, Some(5.0), Some(1.0))],
                Offline,
            ),
            (
                "models do not move ONLINE or SERVING targets",
                &on,
                vec![
                    M(1, Some(1.1), Some(1.0)),
                    M(2, Some(0.0), Some(1.0)),
                    M(3, Some(9.0), Some(1.0)),
                ],
                Online,
            ),
            (
                "the episode-estimate window decides on t_online alone",
                &on,
                vec![
                    Ep(Offline, 2.0, Some(1.1)),
                    Ep(Offline, 2.0, Some(1.1)),
                    Ep(Offline, 2.0, Some(1.1)),
                ],
                Online,
            ),
            (
                "probation passed: first 3 ONLINE episodes at the fallback's reward",
                &on,
                [&FB[..], &[PROMOTE, Ep(Online, 1.2, None), Ep(Online, 1.15, None), Ep(Online, 1.2, None)]].concat(),
                Online,
            ),
            (
                "probation failed: first 3 ONLINE episodes > 10% below the fallback → OFFLINE",
                &on,
                [&FB[..], &[PROMOTE, Ep(Online, 1.0, None), Ep(Online, 1.05, None), Ep(Online, 1.0, None)]].concat(),
                Offline,
            ),
            (
                "probation needs K episodes: two bad ones are not enough",
                &on,
                [&FB[..], &[PROMOTE, Ep(Online, 0.5, None), Ep(Online, 0.5, None)]].concat(),
                Online,
            ),
            (
                "exactly at the margin (1.2 − 10% = 1.08) passes",
                &on,
                [&FB[..], &[PROMOTE, Ep(Online, 1.08, None), Ep(Online, 1.08, None), Ep(Online, 1.08, None)]].concat(),
                Online,
            ),
            (
                "only the first K count: bad episodes after a passed probation stay ONLINE",
                &on,
                [&FB[..], &[
                    PROMOTE,
                    Ep(Online, 1.2, None),
                    Ep(Online, 1.2, None),
                    Ep(Online, 1.2, None),
                    Ep(Online, 0.2, None),
                    Ep(Online, 0.2, None),
                    Ep(Online, 0.2, None),
                ]].concat(),
                Online,
            ),
            (
                "probation off (K = 0)",
                &no_probation,
                [&FB[..], &[PROMOTE, Ep(Online, 0.1, None), Ep(Online, 0.1, None), Ep(Online, 0.1, None)]].concat(),
                Online,
            ),
            (
                "episodes of another stage do not count towards probation",
                &on,
                [&FB[..], &[PROMOTE, Ep(Offline, 0.1, None), Ep(Offline, 0.1, None), Ep(Offline, 0.1, None)]].concat(),
                Online,
            ),
            (
                "after a return to OFFLINE, no promotion before readmit_after_episodes OFFLINE episodes",
                &on,
                [&FB[..], &[
                    PROMOTE,
                    Ep(Online, 0.5, None),
                    Ep(Online, 0.5, None),
                    Ep(Online, 0.5, None),
                    Ep(Offline, 1.2, None),
                    M(2, Some(1.3), Some(1.2)),
                ]].concat(),
                Offline,
            ),
            (
                "… then a newer model promotes again",
                &on,
                [&FB[..], &[
                    PROMOTE,
                    Ep(Online, 0.5, None),
                    Ep(Online, 0.5, None),
                    Ep(Online, 0.5, None),
                    Ep(Offline, 1.2, None),
                    Ep(Offline, 1.2, None),
                    M(2, Some(1.3), Some(1.2)),
                ]].concat(),
                Online,
            ),
        ];
        for (name, rules, feed, want) in cases {
            let (got, _) = drive(rules.clone(), &feed);
            assert_eq!(got, want, "{name}");
        }
    }

    /// The fallback floor: a promoted policy that settles below the fallback's reward by more
    /// than the probation margin goes back to OFFLINE instead of SERVING, whichever way it would
    /// have gone SERVING; one at or above the floor serves; off, both serve.
    #[test]
    fn a_policy_settling_below_the_fallback_is_not_served() {
        use In::{Ep, Model as M};
        use Stage::*;
        let on = MonitorConfig {
            rebaseline_after_episodes: 4,
            ..MonitorConfig::algorithm1()
        };
        assert!(
            !on.fallback_floor,
            "Algorithm 1 as in the paper has no floor"
        );
        let on = MonitorConfig {
            fallback_floor: true,
            ..on
        };
        let off = MonitorConfig {
            fallback_floor: false,
            ..on.clone()
        };
        // Re-baselining: fallback 1.25 (floor 1.125 at 10%); probation passed at 1.15; the
        // last 4 ONLINE episodes settle at 1.10 (newer half), below t_serving 1.3.
        let rebaseline = |settled: f64| {
            vec![
                Ep(Offline, 1.25, None),
                Ep(Offline, 1.25, None),
                M(1, Some(1.3), Some(1.25)),
                Ep(Online, 1.15, None),
                Ep(Online, 1.15, None),
                Ep(Online, 1.15, None),
                Ep(Online, settled, None),
            ]
        };
        let (stage, ts) = drive(on.clone(), &rebaseline(1.05));
        assert_eq!(stage, Offline, "{ts:?}");
        let t = ts.last().unwrap();
        assert_eq!((t.from, t.to, t.window), (Online, Offline, 4));
        assert!(
            t.reason.contains("settled below the fallback")
                && t.reason.contains("1.100")
                && t.reason.contains("1.250")
                && t.reason.contains("10%"),
            "{}",
            t.reason
        );
        let (stage, ts) = drive(off.clone(), &rebaseline(1.05));
        assert_eq!(stage, Serving, "{ts:?}");
        assert!(ts.last().unwrap().reason.contains("re-baselined"));
        // Settled at 1.15 (no change), above the floor: served at that level.
        let (stage, ts) = drive(on.clone(), &rebaseline(1.15));
        assert_eq!(stage, Serving, "{ts:?}");

        // t_serving: fallback 1.6 (floor 1.44); the probation passes at 1.45 with a std above
        // t_var, then the window's mean 1.383 reaches t_serving 1.3 below the floor.
        let serving = [
            Ep(Offline, 1.6, None),
            M(1, Some(1.65), Some(1.6)),
            Ep(Online, 1.7, None),
            Ep(Online, 1.2, None),
            Ep(Online, 1.45, None),
            Ep(Online, 1.35, None),
            Ep(Online, 1.35, None),
        ];
        let (stage, ts) = drive(on.clone(), &serving);
        assert_eq!(stage, Offline, "{ts:?}");
        let t = ts.last().unwrap();
        assert!(
            t.reason.contains("reaches t_serving 1.3") && t.reason.contains("1.600"),
            "{}",
            t.reason
        );
        let (stage, _) = drive(off, &serving);
        assert_eq!(stage, Serving);

        // Sent back, it is readmitted like after a failed probation: only a model trained after
        // the return, after readmit_after_episodes (2) OFFLINE episodes.
        let mut feed = rebaseline(1.05);
        feed.extend([
            M(1, Some(9.0), Some(1.25)),
            Ep(Offline, 1.25, None),
            M(2, Some(1.3), Some(1.25)),
            Ep(Offline, 1.25, None),
            M(3, Some(1.3), Some(1.25)),
        ]);
        let (stage, ts) = drive(on, &feed);
        assert_eq!(stage, Online, "{ts:?}");
        assert_eq!(ts.len(), 3, "{ts:?}");
    }

    #[test]
    fn probation_failure_reports_why_and_the_next_promotion_is_probed_again() {
        use In::{Ep, Model as M};
        use Stage::*;
        let feed = [
            Ep(Offline, 1.0, None),
            Ep(Offline, 1.4, None),
            M(1, Some(1.3), Some(1.2)),
            Ep(Online, 0.9, None),
            Ep(Online, 1.0, None),
            Ep(Online, 1.1, None),
        ];
        let (stage, ts) = drive(MonitorConfig::default(), &feed);
        assert_eq!(stage, Offline);
        assert_eq!(ts.len(), 2, "{ts:?}");
        let up = &ts[0];
        assert_eq!((up.from, up.to), (Offline, Online));
        assert!(up.reason.contains("model estimate 1.300"), "{}", up.reason);
        assert_eq!(up.mean, Some(1.3));
        let down = &ts[1];
        assert_eq!((down.from, down.to, down.window), (Online, Offline, 3));
        assert!(down.reason.contains("probation failed"), "{}", down.reason);
        assert!(
            down.reason.contains("1.000") && down.reason.contains("1.200"),
            "{}",
            down.reason
        );
        assert!((down.mean.unwrap() - 1.0).abs() < 1e-12);
        // Readmitted later, the new ONLINE period is on probation again.
        let mut m = paper_machine(profile(true));
        m.start();
        let mut n = 0;
        let mut ep = |stage, mean| {
            n += 1;
            let mut e = episode(stage, mean, None);
            e.episode = n;
            e
        };
        m.observe(&ep(Offline, 1.0));
        m.observe_model(&model(1, Some(1.1), Some(1.0))).unwrap();
        assert!(m.on_probation());
        for _ in 0..3 {
            m.observe(&ep(Online, 0.1));
        }
        assert_eq!(m.stage(), Offline);
        m.observe(&ep(Offline, 1.0));
        m.observe(&ep(Offline, 1.0));
        assert_eq!(m.fallback_reward(), Some(1.0));
        m.observe_model(&model(2, Some(1.1), Some(1.0))).unwrap();
        assert!(m.on_probation());
        // A second failure doubles the wait: 4 OFFLINE episodes before the next promotion.
        for _ in 0..3 {
            m.observe(&ep(Online, 0.1));
        }
        assert_eq!((m.stage(), m.readmit_wait()), (Offline, 4));
        for v in 3..6 {
            m.observe(&ep(Offline, 1.0));
            assert!(m.observe_model(&model(v, Some(1.1), Some(1.0))).is_none());
        }
        m.observe(&ep(Offline, 1.0));
        assert_eq!(
            m.observe_model(&model(6, Some(1.1), Some(1.0))).unwrap().to,
            Online
        );
    }

    #[test]
    fn monitor_config_defaults_validate_and_nonsense_is_refused() {
        let d = MonitorConfig::default();
        d.validate().unwrap();
        assert!(d.require_behaviour);
        assert_eq!((d.probation_episodes, d.probation_margin), (3, 0.10));
        assert_eq!(
            (d.rebaseline_after_episodes, d.online_noise_free_only),
            (10, true)
        );
        let a = MonitorConfig::algorithm1();
        a.validate().unwrap();
        assert_eq!(
            (a.rebaseline_after_episodes, a.online_noise_free_only),
            (0, false)
        );
        for bad in [
            MonitorConfig {
                probation_margin: 1.5,
                ..MonitorConfig::algorithm1()
            },
            MonitorConfig {
                behaviour_margin: f64::NAN,
                ..MonitorConfig::algorithm1()
            },
            MonitorConfig {
                fallback_episodes: 0,
                ..MonitorConfig::algorithm1()
            },
            MonitorConfig {
                rebaseline_after_episodes: 1,
                ..MonitorConfig::algorithm1()
            },
            MonitorConfig {
                rebaseline_margin: -0.1,
                ..MonitorConfig::algorithm1()
            },
            MonitorConfig {
                rebaseline_tolerance: f64::INFINITY,
                ..MonitorConfig::algorithm1()
            },
            MonitorConfig {
                reprobe_after_episodes: 1_001,
                ..MonitorConfig::algorithm1()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let parsed: Result<MonitorConfig, _> =
            serde_json::from_value(serde_json::json!({ "probation_episodes": 2, "nope": 1 }));
        assert!(parsed.is_err(), "unknown keys are refused");
        let parsed: MonitorConfig =
            serde_json::from_value(serde_json::json!({ "probation_episodes": 5 })).unwrap();
        assert_eq!(parsed.probation_episodes, 5);
        assert!(parsed.require_behaviour);
    }

    /// Feeds `m` one episode per reward in `rewards` (numbered from `from`, each in the
    /// machine's current stage); returns every transition.
    fn feed(m: &mut LifecycleMachine, from: u64, rewards: &[f64]) -> Vec<Transition> {
        let mut out = Vec::new();
        for (i, &r) in (from..).zip(rewards) {
            let mut e = episode(m.stage(), r, None);
            e.episode = i;
            out.extend(m.observe(&e));
        }
        out
    }

    /// An ONLINE machine (profile: t_online 1.0, t_serving 1.3, t_var 0.1, window 3) with
    /// re-baselining after `n` episodes, fed `rewards`; returns it and every transition.
    fn rebaseline_run(n: usize, rewards: &[f64]) -> (LifecycleMachine, Vec<Transition>) {
        let rules = MonitorConfig {
            rebaseline_after_episodes: n,
            ..MonitorConfig::algorithm1()
        };
        let mut m = LifecycleMachine::with_rules(profile(false), rules);
        assert_eq!(m.start().unwrap().to, Stage::Online);
        let out = feed(&mut m, 1, rewards);
        (m, out)
    }

    #[test]
    fn with_online_noise_free_only_only_evaluation_episodes_decide_serving() {
        let ep = |n: u64, mean: f64, exploring: Option<u32>, rl_steps: u32| {
            let mut e = episode(Stage::Online, mean, None);
            e.episode = n;
            e.exploring_steps = exploring;
            e.rl_steps = rl_steps;
            e
        };
        let rules = MonitorConfig {
            online_noise_free_only: true,
            ..MonitorConfig::algorithm1()
        };
        let mut m = LifecycleMachine::with_rules(profile(false), rules.clone());
        assert_eq!(m.start().map(|t| t.to), Some(Stage::Online));
        // exploring episodes well above t_serving 1.3, an unknown one and a noise-free one
        // driven by the fallback: none is fed
        for n in 0..4 {
            assert_eq!(m.observe(&ep(n, 1.5, Some(100), 100)), None);
        }
        assert_eq!(m.observe(&ep(4, 1.5, None, 100)), None);
        assert_eq!(m.observe(&ep(5, 1.5, Some(0), 0)), None);
        // three noise-free episodes fill the window; a poor exploring one in between is ignored
        assert_eq!(m.observe(&ep(6, 1.35, Some(0), 100)), None);
        assert_eq!(m.observe(&ep(7, 0.2, Some(100), 100)), None);
        assert_eq!(m.observe(&ep(8, 1.35, Some(0), 100)), None);
        assert_eq!(m.stage(), Stage::Online);
        let t = m.observe(&ep(9, 1.35, Some(0), 100)).unwrap();
        assert_eq!((t.to, t.window), (Stage::Serving, 3));
        assert!((t.mean.unwrap() - 1.35).abs() < 1e-12, "{t:?}");
        // without the rule the first three exploring episodes decide
        let mut m = paper_machine(profile(false));
        m.start();
        assert_eq!(m.observe(&ep(0, 1.5, Some(100), 100)), None);
        assert_eq!(m.observe(&ep(1, 1.5, Some(100), 100)), None);
        let t = m.observe(&ep(2, 1.5, Some(100), 100)).unwrap();
        assert_eq!(t.to, Stage::Serving);
        // SERVING episodes are fed either way
        let mut m = LifecycleMachine::with_rules(profile(false), rules);
        m.restore(Stage::Serving);
        let serving = |n: u64| {
            let mut e = ep(n, 0.5, None, 100);
            e.stage = Stage::Serving;
            e
        };
        assert_eq!(m.observe(&serving(0)), None);
        assert_eq!(m.observe(&serving(1)), None);
        assert_eq!(m.observe(&serving(2)).map(|t| t.to), Some(Stage::Online));
    }

    #[test]
    fn without_evaluation_episodes_the_noise_free_rule_suspends_itself_after_its_patience() {
        let ep = |n: u64, mean: f64, exploring: u32| {
            let mut e = episode(Stage::Online, mean, None);
            e.episode = n;
            e.exploring_steps = Some(exploring);
            e.rl_steps = 100;
            e
        };
        let rules = MonitorConfig {
            online_noise_free_only: true,
            ..MonitorConfig::algorithm1()
        };
        // the recommender never evaluates: the first PATIENCE − 1 exploring episodes are
        // ignored, from the PATIENCE-th on they are fed (window 3: SERVING at PATIENCE + 2)
        let mut m = LifecycleMachine::with_rules(profile(false), rules.clone());
        m.start();
        let p = NOISE_FREE_PATIENCE as u64;
        // episodes the fallback drove (no model yet) neither decide nor use up the patience
        for n in 0..2 * p {
            let mut e = ep(n, 1.5, 0);
            e.rl_steps = 0;
            assert_eq!(m.observe(&e), None, "fallback-driven episode {n}");
        }
        for n in 2 * p..3 * p + 1 {
            assert_eq!(m.observe(&ep(n, 1.5, 100)), None, "episode {n}");
        }
        let t = m.observe(&ep(3 * p + 1, 1.5, 100)).unwrap();
        assert_eq!((t.to, t.window), (Stage::Serving, 3));
        // a noise-free episode re-arms the rule: exploring ones are ignored again
        let mut m = LifecycleMachine::with_rules(profile(false), rules);
        m.start();
        for n in 0..p - 1 {
            assert_eq!(m.observe(&ep(n, 1.5, 100)), None);
        }
        assert_eq!(m.observe(&ep(p - 1, 0.2, 0)), None);
        for n in p..2 * p - 1 {
            assert_eq!(m.observe(&ep(n, 1.5, 100)), None, "episode {n}");
        }
        assert_eq!(m.stage(), Stage::Online);
    }

    #[test]
    fn a_settled_online_level_below_t_serving_is_served_after_re_baselining() {
        // Retraining converged at 1.1, below t_serving 1.3: plain Algorithm 1 explores for ever.
        let settled = [1.1, 1.08, 1.1, 1.1, 1.12, 1.08, 1.1, 1.1];
        let (m, ts) = rebaseline_run(0, &settled);
        assert_eq!((m.stage(), ts.len()), (Stage::Online, 0), "off by default");
        let (m, ts) = rebaseline_run(6, &settled[..5]);
        assert_eq!(
            (m.stage(), ts.len()),
            (Stage::Online, 0),
            "needs 6 episodes"
        );
        let (mut m, ts) = rebaseline_run(6, &settled[..6]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        let t = &ts[0];
        assert_eq!((t.from, t.to), (Stage::Online, Stage::Serving));
        assert!(t.reason.starts_with("re-baselined"), "{}", t.reason);
        // The newer half: (1.1 + 1.12 + 1.08) / 3 = 1.1; the bar 1.1 × 0.95 = 1.045.
        assert!((t.mean.unwrap() - 1.1).abs() < 1e-9, "{t:?}");
        assert!(m.rebaselined());
        assert!((m.serving_bar() - 1.045).abs() < 1e-9);
        // Serving holds at the settled level (which t_serving 1.3 would have sent back) ...
        assert!(feed(&mut m, 7, &[1.08, 1.1, 1.06, 1.07]).is_empty());
        assert_eq!(m.stage(), Stage::Serving);
        // ... and retrains when the mean falls below the re-baselined level.
        let ts = feed(&mut m, 11, &[1.0, 1.0]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert_eq!(ts[0].to, Stage::Online);
        assert!(
            ts[0].reason.contains("re-baselined level 1.045"),
            "{}",
            ts[0].reason
        );
        assert!(!m.rebaselined());
        assert_eq!(
            m.serving_bar(),
            1.3,
            "the next ONLINE period aims at t_serving again"
        );
    }

    /// Retraining that settles below what the policy earned before it (the lowest reward of
    /// the window that triggered it, less the margin) is not served: the target keeps learning
    /// and is re-baselined once it settles above that. First learning has no such floor.
    #[test]
    fn retraining_is_not_re_baselined_below_what_the_policy_earned_before_it() {
        let profile = LifecycleProfile {
            t_online: 0.0,
            ..profile(false)
        };
        let rules = MonitorConfig {
            rebaseline_after_episodes: 6,
            ..MonitorConfig::algorithm1()
        };
        let mut m = LifecycleMachine::with_rules(profile.clone(), rules.clone());
        m.restore(Stage::Serving);
        assert_eq!(m.rebaseline_floor(), None, "not retraining");
        // The trigger: mean 1.267 < t_serving 1.3; the policy earned at least 1.0 before.
        let ts = feed(&mut m, 1, &[1.4, 1.4, 1.0]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert_eq!((ts[0].from, ts[0].to), (Stage::Serving, Stage::Online));
        let floor = m.rebaseline_floor().expect("retraining");
        assert!((floor - 0.95).abs() < 1e-9, "1.0 less 5%: {floor}");
        // Retraining collapses and settles at 0.5: not served; with no model seen there is
        // nothing to roll back to, so it keeps learning.
        assert!(feed(&mut m, 4, &[0.5; 8]).is_empty());
        assert_eq!(m.stage(), Stage::Online);
        // It recovers and settles at 0.97, above the floor: re-baselined there.
        let ts = feed(&mut m, 12, &[0.97; 6]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert!(ts[0].reason.starts_with("re-baselined"), "{}", ts[0].reason);
        assert!(m.rebaselined());
        assert_eq!(m.rebaseline_floor(), None, "left retraining");
        // First learning (ONLINE from the start) has no such floor: 0.5 settled is served.
        let mut first = LifecycleMachine::with_rules(profile, rules);
        assert_eq!(first.start().unwrap().to, Stage::Online);
        let ts = feed(&mut first, 1, &[0.5; 6]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert!(first.rebaselined());
    }

    #[test]
    fn a_retraining_that_settles_below_what_the_policy_earned_rolls_back_to_the_version_in_force() {
        let profile = LifecycleProfile {
            t_online: 0.0,
            ..profile(false)
        };
        let run = |rollback: bool| {
            let rules = MonitorConfig {
                rebaseline_after_episodes: 6,
                rebaseline_rollback: rollback,
                ..MonitorConfig::algorithm1()
            };
            let mut m = LifecycleMachine::with_rules(profile.clone(), rules);
            m.restore(Stage::Serving);
            // Version 7 serves; the trigger (mean 1.267 < t_serving 1.3, lowest 1.0).
            assert_eq!(m.observe_model(&model(7, None, None)), None);
            let ts = feed(&mut m, 1, &[1.4, 1.4, 1.0]);
            assert_eq!((ts[0].from, ts[0].to), (Stage::Serving, Stage::Online));
            assert_eq!(ts[0].rollback_to, None);
            // The trainer publishes while the target retrains, which collapses to 0.5.
            assert_eq!(m.observe_model(&model(8, None, None)), None);
            assert_eq!(m.observe_model(&model(9, None, None)), None);
            let ts = feed(&mut m, 4, &[0.5; 6]);
            (m, ts)
        };
        let (mut m, ts) = run(true);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert_eq!((ts[0].from, ts[0].to), (Stage::Online, Stage::Serving));
        assert_eq!(ts[0].rollback_to, Some(7), "the version before the trigger");
        assert!(
            ts[0].reason.starts_with("rolled back to version 7"),
            "{}",
            ts[0].reason
        );
        assert_eq!(ts[0].mean, Some(0.5));
        let msg = message(&Target::new("ns", "app"), 9, 500, ts[0].clone());
        assert_eq!(msg.rollback_to, Some(7));
        // Served while the old policy earns what it did: the floor is 1.0 less 5%.
        assert!((m.serving_bar() - 0.95).abs() < 1e-9, "{}", m.serving_bar());
        assert!(feed(&mut m, 10, &[1.0, 1.1, 1.0, 1.0]).is_empty());
        assert_eq!(m.stage(), Stage::Serving);
        // A further drop retrains again, from the rolled-back policy.
        let ts = feed(&mut m, 14, &[0.9, 0.9, 0.9]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert_eq!((ts[0].from, ts[0].to), (Stage::Serving, Stage::Online));
        // Without the rule the collapsed target keeps learning.
        let (m, ts) = run(false);
        assert!(ts.is_empty(), "{ts:?}");
        assert_eq!(m.stage(), Stage::Online);
        // Without a model seen before the trigger there is nothing to roll back to.
        let rules = MonitorConfig {
            rebaseline_after_episodes: 6,
            ..MonitorConfig::algorithm1()
        };
        let mut m = LifecycleMachine::with_rules(profile.clone(), rules);
        m.restore(Stage::Serving);
        feed(&mut m, 1, &[1.4, 1.4, 1.0]);
        assert!(feed(&mut m, 4, &[0.5; 8]).is_empty());
        assert_eq!(m.stage(), Stage::Online);
    }

    #[test]
    fn with_hysteresis_a_policy_serving_at_t_serving_retrains_only_below_the_band() {
        let serving = |h: f64| {
            let rules = MonitorConfig {
                serving_hysteresis: h,
                rebaseline_after_episodes: 6,
                ..MonitorConfig::algorithm1()
            };
            let mut m = LifecycleMachine::with_rules(profile(false), rules);
            m.restore(Stage::Serving);
            m
        };
        // t_serving 1.3: a mean of 1.28 is a dip inside a 3% band (1.261), 1.25 is below it.
        let mut m = serving(0.03);
        assert!(
            (m.serving_bar() - 1.261).abs() < 1e-9,
            "{}",
            m.serving_bar()
        );
        assert!(feed(&mut m, 1, &[1.28; 6]).is_empty());
        assert_eq!(m.stage(), Stage::Serving);
        let ts = feed(&mut m, 7, &[1.25; 3]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert_eq!((ts[0].from, ts[0].to), (Stage::Serving, Stage::Online));
        assert!(
            ts[0]
                .reason
                .contains("t_serving 1.3 less 3% hysteresis: 1.261"),
            "{}",
            ts[0].reason
        );
        // The std rule is unchanged.
        let mut m = serving(0.03);
        assert_eq!(feed(&mut m, 1, &[1.6, 1.3, 1.6]).len(), 1);
        // Without it (Algorithm 1) the dip retrains.
        let mut m = serving(0.0);
        assert_eq!(feed(&mut m, 1, &[1.28; 3]).len(), 1);
        // A re-baselined level keeps its own margin: retraining from 1.0 settles at 1.1, served
        // while the mean stays >= 1.045, hysteresis or not.
        let mut m = serving(0.03);
        feed(&mut m, 1, &[1.0; 3]);
        assert_eq!(feed(&mut m, 4, &[1.1; 6]).len(), 1);
        assert!(m.rebaselined());
        assert!(
            (m.serving_bar() - 1.045).abs() < 1e-9,
            "{}",
            m.serving_bar()
        );
    }

    #[test]
    fn a_target_serving_below_t_serving_re_probes_and_keeps_only_what_gains() {
        let profile = LifecycleProfile {
            t_online: 0.0,
            ..profile(false)
        };
        let rules = |reprobe: usize| MonitorConfig {
            rebaseline_after_episodes: 6,
            reprobe_after_episodes: reprobe,
            ..MonitorConfig::algorithm1()
        };
        // Version 7 serves until a drop (lowest 1.0) retrains; retraining settles at 1.1 under
        // version 8, out of t_serving's (1.3) reach: re-baselined.
        let rebaselined = |reprobe: usize| {
            let mut m = LifecycleMachine::with_rules(profile.clone(), rules(reprobe));
            m.restore(Stage::Serving);
            m.observe_model(&model(7, None, None));
            assert_eq!(feed(&mut m, 1, &[1.4, 1.4, 1.0]).len(), 1);
            m.observe_model(&model(8, None, None));
            let ts = feed(&mut m, 4, &[1.1; 6]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            assert!(m.rebaselined() && ts[0].rollback_to.is_none(), "{ts:?}");
            m
        };
        // Off: served for ever at the re-baselined level.
        let mut m = rebaselined(0);
        assert_eq!(m.reprobe_wait(), None);
        assert!(feed(&mut m, 10, &[1.1; 40]).is_empty());
        let mut m = rebaselined(4);
        assert_eq!(m.reprobe_wait(), Some(4));
        // The 4th SERVING episode there re-probes.
        assert!(feed(&mut m, 10, &[1.1; 3]).is_empty());
        let ts = feed(&mut m, 13, &[1.1]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert_eq!((ts[0].from, ts[0].to), (Stage::Serving, Stage::Online));
        assert!(
            ts[0]
                .reason
                .starts_with("re-probing: served 4 episodes at 1.100"),
            "{}",
            ts[0].reason
        );
        assert!(m.reprobing());
        // Held to what the served policy earned, without margin: settling at 1.05 (above the
        // re-baselined level's margin, 1.045) rolls back to version 8, served before it.
        m.observe_model(&model(9, None, None));
        let ts = feed(&mut m, 14, &[1.05; 6]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert_eq!(ts[0].rollback_to, Some(8), "{ts:?}");
        assert!(
            ts[0].reason.contains("re-probe settled at 1.050"),
            "{}",
            ts[0].reason
        );
        assert!(!m.reprobing());
        assert!(
            (m.serving_bar() - 1.045).abs() < 1e-9,
            "{}",
            m.serving_bar()
        );
        // Nothing gained: the next re-probe waits twice as long.
        assert_eq!(m.reprobe_wait(), Some(8));
        assert!(feed(&mut m, 20, &[1.1; 7]).is_empty());
        let ts = feed(&mut m, 27, &[1.1]);
        assert_eq!(
            (ts[0].from, ts[0].to),
            (Stage::Serving, Stage::Online),
            "{ts:?}"
        );
        // This one settles higher (1.2 > 1.1 + 2%): re-baselined there, the wait back to 4.
        m.observe_model(&model(10, None, None));
        let ts = feed(&mut m, 28, &[1.2; 6]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert!(m.rebaselined() && ts[0].rollback_to.is_none(), "{ts:?}");
        assert_eq!(m.reprobe_wait(), Some(4));
        assert!((m.serving_bar() - 1.14).abs() < 1e-9, "{}", m.serving_bar());
        // A re-probe that reaches t_serving serves normally, with no more re-probes.
        let ts = feed(&mut m, 34, &[1.2; 4]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        let ts = feed(&mut m, 38, &[1.35; 3]);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert_eq!((ts[0].from, ts[0].to), (Stage::Online, Stage::Serving));
        assert!(!m.rebaselined());
        assert!(feed(&mut m, 41, &[1.35; 40]).is_empty());
        assert_eq!(m.stage(), Stage::Serving);
    }

    #[test]
    fn re_baselining_waits_while_rewards_improve_vary_or_stay_below_t_online() {
        let cases: &[(&str, &[f64])] = &[
            ("still improving", &[0.9, 1.0, 1.05, 1.1, 1.15, 1.2]),
            ("std above t_var", &[1.1, 1.1, 1.1, 0.9, 1.3, 0.9]),
            ("below t_online", &[0.8, 0.8, 0.8, 0.8, 0.8, 0.8]),
        ];
        for (what, rewards) in cases {
            let (m, ts) = rebaseline_run(6, rewards);
            assert_eq!((m.stage(), ts.len()), (Stage::Online, 0), "{what}: {ts:?}");
        }
        // A fall within the tolerance still counts as settled; the window std (0.0) holds.
        let (m, ts) = rebaseline_run(4, &[1.2, 1.2, 1.1, 1.1]);
        assert_eq!((m.stage(), ts.len()), (Stage::Serving, 1), "{ts:?}");
        // Reaching t_serving is plain Algorithm 1 (no re-baselined level).
        let (m, ts) = rebaseline_run(6, &[1.4, 1.4, 1.4]);
        assert_eq!(ts.len(), 1);
        assert!(ts[0].reason.contains(">= t_serving"), "{}", ts[0].reason);
        assert!(!m.rebaselined());
        assert_eq!(m.serving_bar(), 1.3);
    }
}
