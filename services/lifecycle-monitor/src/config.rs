//! The `[lifecycle_monitor]` section: the safety rules around ONLINE, with its validation.

use serde::{Deserialize, Serialize};

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
    /// The error-budget guard (default on; see ADR 0014). For a target with an SLO (a latency or
    /// throughput objective and `slo.objective`, default 0.99), the burn rate of a set of
    /// episodes is their share of control intervals violating the SLO over `1 - objective`. At
    /// any RL-driven stage (ONLINE: probation, first learning, retraining; SERVING, also at a
    /// re-baselined level) the target returns to OFFLINE, the fallback driving, when the RL
    /// policy burns faster than allowed — 1.0 (the budget), or the fallback's own burn rate
    /// over its last `budget_long_episodes` OFFLINE episodes when that is higher — on two
    /// windows of the policy's episodes (those its actions drove, since its last promotion):
    /// the last `budget_long_episodes` with their worst episode left out, and the last
    /// `budget_short_episodes` (it is still burning), judged from the policy's
    /// (`budget_short_episodes` + 1)-th episode on, the long window holding the episodes there
    /// are until it is full. One bad episode never decides. The
    /// readmission waits as after a failed probation (a newer model, `readmit_after_episodes`
    /// doubled per failure). Probation's verdict also fails on the budget (over its episodes,
    /// against the same allowed burn) before it looks at the reward. Off, or without an SLO:
    /// rewards alone decide, as before.
    pub error_budget: bool,
    /// The long window of the error-budget guard, in RL episodes (also the fallback's).
    pub budget_long_episodes: usize,
    /// The short window of the error-budget guard, in RL episodes.
    pub budget_short_episodes: usize,
    /// The cost side of the retraining trigger in the objective's units (`learning.objective.mode:
    /// constrained`, a target with an SLO): a target that went SERVING on the error budget and
    /// cost retrains when its window uses a share of its requested spend lower than the share
    /// it was served at by more than this fraction (relative). A fraction in [0, 1].
    pub serving_cost_margin: f64,
    /// Judge probation, ONLINE → SERVING and the retraining trigger by the error budget, then
    /// the used share of the requested spend, under the constrained objective (default on; see
    /// `LifecycleMachine::set_slo_first`). Off: the reward comparisons, waived only against a
    /// fallback over its budget, and `t_serving`.
    pub cost_judgement: bool,
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
            error_budget: true,
            budget_long_episodes: 10,
            budget_short_episodes: 2,
            serving_cost_margin: 0.10,
            cost_judgement: true,
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
            error_budget: false,
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
            ("serving_cost_margin", self.serving_cost_margin),
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
        if !(2..=1_000).contains(&self.budget_long_episodes) {
            return bad(
                "budget_long_episodes",
                "must be in 2..=1000 (its worst episode is left out)",
            );
        }
        if !(1..=self.budget_long_episodes).contains(&self.budget_short_episodes) {
            return bad(
                "budget_short_episodes",
                "must be in 1..=budget_long_episodes",
            );
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            (
                d.error_budget,
                d.budget_long_episodes,
                d.budget_short_episodes
            ),
            (true, 10, 2)
        );
        assert!(!a.error_budget, "the paper's monitor has no error budget");
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
            MonitorConfig {
                budget_long_episodes: 1,
                budget_short_episodes: 1,
                ..MonitorConfig::default()
            },
            MonitorConfig {
                budget_short_episodes: 0,
                ..MonitorConfig::default()
            },
            MonitorConfig {
                budget_long_episodes: 4,
                budget_short_episodes: 5,
                ..MonitorConfig::default()
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
}
