//! Algorithm 1 for one target ([`LifecycleMachine`]): the pure decision core, without I/O;
//! the service feeds it episodes and models and publishes its transitions.

use std::collections::VecDeque;

use crate::config::*;
use aware_bus_schemas::{Episode, Model, ModelKind, Stage};
use aware_mdp::Prices;
use aware_shared::config::LifecycleProfile;
use aware_shared::spec::Slo;

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
    /// A return to OFFLINE because the policy burned the SLO's error budget faster than allowed
    /// (the guard, or probation's budget verdict; see [`MonitorConfig::error_budget`]).
    pub budget_return: bool,
}

/// SLO-violating control intervals of an episode, and its intervals.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Intervals {
    violating: u64,
    total: u64,
}

impl Intervals {
    fn of(ep: &Episode) -> Self {
        Intervals {
            violating: u64::from(ep.slo_violations.min(ep.steps)),
            total: u64::from(ep.steps),
        }
    }

    fn sum<'a>(xs: impl IntoIterator<Item = &'a Intervals>) -> Intervals {
        xs.into_iter().fold(Intervals::default(), |a, x| Intervals {
            violating: a.violating + x.violating,
            total: a.total + x.total,
        })
    }

    fn share(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.violating as f64 / self.total as f64
        }
    }

    fn burn(&self, objective: f64) -> Option<f64> {
        aware_mdp::burn_rate(self.violating, self.total, objective)
    }
}

/// Whether the fallback drove `ep` (an OFFLINE episode: at least as many fallback steps as RL
/// ones), and whether the RL policy did (more RL steps than fallback ones).
fn fallback_driven(ep: &Episode) -> bool {
    ep.steps > 0 && ep.fallback_steps >= ep.rl_steps
}

fn rl_driven(ep: &Episode) -> bool {
    ep.steps > 0 && ep.rl_steps > ep.fallback_steps
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
    /// The objective of the target's SLO (`slo.objective`), `None` without an SLO: then the
    /// error-budget guard is off for it.
    objective: Option<f64>,
    /// The intervals of the last `budget_long_episodes` OFFLINE episodes the fallback drove.
    fallback_slo: VecDeque<Intervals>,
    /// The intervals and mean rewards of the last `budget_long_episodes` episodes the RL policy
    /// drove since its last promotion (cleared on every return to OFFLINE).
    policy_slo: VecDeque<(Intervals, f64)>,
    /// While on probation: the intervals of its RL-driven episodes so far.
    probation_slo: Intervals,
    /// While on probation: the used shares of its episodes so far (`None` for one without its
    /// requests).
    probation_used: Vec<Option<f64>>,
    /// See [`LifecycleMachine::set_slo_first`].
    slo_first: bool,
    /// The prices that weigh cores against GiB in an episode's used share
    /// ([`LifecycleMachine::set_prices`]).
    prices: Prices,
    /// The used shares ([`Prices::used_share`]) of the last `fallback_episodes` OFFLINE episodes
    /// the fallback drove, when they carried their requests.
    fallback_used: VecDeque<f64>,
    /// Beside each ONLINE or SERVING sample of `rewards`: the episode's intervals and used share
    /// (`None` for an OFFLINE estimate), for the judgement in the objective's units.
    judged: VecDeque<Option<(Intervals, Option<f64>)>>,
    /// SERVING entered on the error budget and cost: the window's used share then.
    serving_used: Option<f64>,
}

/// What the error-budget guard measured (see [`MonitorConfig::error_budget`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetBurn {
    /// The policy's burn rate over the long window, over it without its worst episode, and
    /// over the short window.
    pub long: f64,
    pub long_trimmed: f64,
    pub short: f64,
    /// The fallback's burn rate over its OFFLINE episodes, if any were seen.
    pub fallback: Option<f64>,
    /// What the policy may burn: 1.0 (the budget) or the fallback's rate when higher.
    pub allowed: f64,
}

impl BudgetBurn {
    /// The guard's verdict: both windows burn faster than allowed.
    pub fn burning(&self) -> bool {
        self.long_trimmed > self.allowed && self.short > self.allowed
    }
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
            objective: None,
            fallback_slo: VecDeque::new(),
            policy_slo: VecDeque::new(),
            probation_slo: Intervals::default(),
            probation_used: Vec::new(),
            slo_first: false,
            prices: Prices::default(),
            fallback_used: VecDeque::new(),
            judged: VecDeque::new(),
            serving_used: None,
        }
    }

    /// The prices of `learning.objective.prices`: they weigh cores against GiB when an
    /// episode's cost is judged (the default: [`Prices::default`]).
    pub fn set_prices(&mut self, prices: Prices) {
        self.prices = prices;
    }

    /// The share of its requested spend an episode used ([`Prices::used_share`]), when it
    /// carries its requests.
    fn used_share(&self, ep: &Episode) -> Option<f64> {
        self.prices.used_share(
            ep.requested_cores_mean?,
            ep.requested_gib_mean?,
            ep.cpu_util_mean,
            ep.memory_util_mean,
        )
    }

    /// The fallback's used share: the mean over its last OFFLINE episodes, if any carried
    /// their requests.
    pub fn fallback_used_share(&self) -> Option<f64> {
        (!self.fallback_used.is_empty()).then(|| mean_std(&self.fallback_used).0)
    }

    /// SERVING entered on the error budget and cost: the used share it was served at.
    pub fn serving_used_share(&self) -> Option<f64> {
        self.serving_used.filter(|_| self.stage == Stage::Serving)
    }

    /// The judgement in the objective's units ([`LifecycleMachine::set_slo_first`]) over the
    /// decision window, when it applies: SLO first on, the guard on, an SLO, and every episode
    /// of the window an ONLINE or SERVING one that carried its requests. The window's
    /// intervals and mean used share.
    fn constrained_window(&self) -> Option<(Intervals, f64)> {
        if !(self.slo_first
            && self.rules.cost_judgement
            && self.rules.error_budget
            && self.objective.is_some())
        {
            return None;
        }
        if self.judged.is_empty() || self.judged.len() != self.rewards.len() {
            return None;
        }
        let mut intervals = Vec::with_capacity(self.judged.len());
        let mut used = 0.0;
        for j in &self.judged {
            let (i, u) = (*j)?;
            intervals.push(i);
            used += u?;
        }
        Some((Intervals::sum(&intervals), used / self.judged.len() as f64))
    }

    /// SLO first (`learning.objective.mode: constrained`, ADR 0016): the policy's reward is
    /// compared with the fallback's (probation, the fallback floor) only when the fallback met
    /// the error budget. Both then meet the SLO, and the paper's reward, whose SLO term is
    /// then at its ceiling, ranks them by utilization: at the same load, by what they request.
    /// When the fallback burned faster than the budget, a policy within the allowed burn rate
    /// passes whatever its reward: it spends resources on the SLO the fallback missed.
    ///
    /// Probation, ONLINE → SERVING and the retraining trigger then judge in the same order
    /// when the episodes carry their requests (`episode/1`'s requested means). Probation,
    /// within the budget, passes when its episodes used at least the fallback's share of
    /// their requested spend less `probation_margin`. The ONLINE window
    /// must meet the error budget (burn it no faster than it lasts, whatever the fallback
    /// burned), then use at least the fallback's share of its requested spend less
    /// `probation_margin` (when the fallback met the budget; [`Prices::used_share`] compares
    /// cost across loads), with the reward's std within `t_var` (converged); `t_serving` is not
    /// used. A SERVING target so promoted retrains when its window burns the budget faster
    /// than it lasts, uses a share lower than it was served at by more than
    /// `serving_cost_margin`, or its std exceeds `t_var`.
    pub fn set_slo_first(&mut self, on: bool) {
        self.slo_first = on;
    }

    /// Whether [`LifecycleMachine::set_slo_first`] waives the reward comparison: on, with the
    /// guard on and an SLO, and the fallback burned faster than the budget.
    fn reward_comparison_waived(&self) -> bool {
        self.slo_first && self.rules.error_budget && self.fallback_burn().is_some_and(|f| f > 1.0)
    }

    /// Takes the target's SLO (configured or registered): with a latency or throughput
    /// objective, the error-budget guard holds the RL policy to `slo.objective`; without, it is
    /// off for the target. Applies from the next episode.
    pub fn set_slo(&mut self, slo: &Slo) {
        self.objective = slo.is_set().then(|| slo.objective());
    }

    /// The SLO objective the guard holds the target to, if it has an SLO.
    pub fn slo_objective(&self) -> Option<f64> {
        self.objective
    }

    /// The fallback's burn rate over its last OFFLINE episodes, if the target has an SLO and
    /// the fallback drove any.
    pub fn fallback_burn(&self) -> Option<f64> {
        Intervals::sum(&self.fallback_slo).burn(self.objective?)
    }

    /// What the policy may burn: 1.0 (the budget), or the fallback's burn rate when higher.
    fn allowed_burn(&self) -> f64 {
        self.fallback_burn().map_or(1.0, |f| f.max(1.0))
    }

    /// The guard's measurement over the policy's episodes since its promotion, once the long
    /// window is full and the target has an SLO (`None` otherwise, or with the guard off).
    pub fn budget_burn(&self) -> Option<BudgetBurn> {
        let objective = self.objective.filter(|_| self.rules.error_budget)?;
        let n = self.rules.budget_long_episodes;
        let k = self.rules.budget_short_episodes.min(n);
        // Judged from the first episode past the short window on: the long window holds what
        // there is (up to n), so a policy burning from its promotion on is not left to burn
        // until n episodes have passed; one bad episode still never decides.
        if self.policy_slo.len() < (k + 1).min(n) {
            return None;
        }
        let all: Vec<Intervals> = self.policy_slo.iter().map(|(i, _)| *i).collect();
        let long = Intervals::sum(&all);
        // The worst episode: the highest violating share (the first of equals).
        let worst = all
            .iter()
            .enumerate()
            .fold(None::<(usize, f64)>, |best, (k, i)| match best {
                Some((_, s)) if s >= i.share() => best,
                _ => Some((k, i.share())),
            })
            .map(|(k, _)| k);
        let trimmed = Intervals::sum(
            all.iter()
                .enumerate()
                .filter(|(k, _)| Some(*k) != worst)
                .map(|(_, i)| i),
        );
        let short = Intervals::sum(&all[all.len() - k..]);
        Some(BudgetBurn {
            long: long.burn(objective)?,
            // Every episode but the worst with no interval: nothing burned without it.
            long_trimmed: trimmed.burn(objective).unwrap_or(0.0),
            short: short.burn(objective)?,
            fallback: self.fallback_burn(),
            allowed: self.allowed_burn(),
        })
    }

    /// The fallback's burn rate in words, for the reasons.
    fn fallback_words(&self) -> String {
        match self.fallback_burn() {
            Some(f) => format!("the fallback burned {f:.2}x"),
            None => "the fallback's burn rate is unknown".to_string(),
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
        self.probation_slo = Intervals::default();
        self.probation_used.clear();
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
            budget_return: false,
        };
        if to == Stage::Offline {
            // The next policy is judged on its own episodes.
            self.policy_slo.clear();
        }
        self.stage = to;
        self.rewards.clear();
        self.judged.clear();
        self.serving_used = None;
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
        if !self.rules.fallback_floor
            || self.retrain_from.is_some()
            || self.reward_comparison_waived()
        {
            return None;
        }
        self.fallback_reward()
            .filter(|f| level < f - self.rules.probation_margin * f.abs())
    }

    /// Re-baselining (see [`MonitorConfig::rebaseline_after_episodes`]): ONLINE → SERVING at the
    /// level the last ONLINE episodes settled at; `std` is the decision window's.
    fn try_rebaseline(&mut self, std: f64) -> Option<Transition> {
        let n = self.rules.rebaseline_after_episodes;
        if std > self.profile.t_var {
            return None;
        }
        let (older, newer) = self.settled()?;
        let p = &self.profile;
        if newer < p.t_online {
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
            self.judged.pop_front();
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
        let rl_stage = |s: Stage| matches!(s, Stage::Online | Stage::Serving);
        if self.stage == Stage::Offline && ep.stage == Stage::Offline && fallback_driven(ep) {
            self.fallback_slo.push_back(Intervals::of(ep));
            while self.fallback_slo.len() > self.rules.budget_long_episodes {
                self.fallback_slo.pop_front();
            }
            if let Some(u) = self.used_share(ep) {
                self.fallback_used.push_back(u);
                while self.fallback_used.len() > self.rules.fallback_episodes {
                    self.fallback_used.pop_front();
                }
            }
        }
        let by_policy = rl_stage(self.stage)
            && rl_stage(ep.stage)
            && rl_driven(ep)
            && ep.mean_reward.is_finite();
        if by_policy {
            self.policy_slo
                .push_back((Intervals::of(ep), ep.mean_reward));
            while self.policy_slo.len() > self.rules.budget_long_episodes {
                self.policy_slo.pop_front();
            }
        }
        if let Some(t) = self.probation_check(ep) {
            return Some(t);
        }
        if by_policy {
            if let Some(t) = self.budget_check() {
                return Some(t);
            }
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
        self.judged.push_back(
            matches!(self.stage, Stage::Online | Stage::Serving)
                .then(|| (Intervals::of(ep), self.used_share(ep))),
        );
        while self.rewards.len() > self.profile.window {
            self.rewards.pop_front();
            self.judged.pop_front();
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
            Stage::Online if self.constrained_window().is_some() => {
                self.constrained_online(mean, std)
            }
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
            Stage::Serving
                if self.serving_used.is_some() && self.constrained_window().is_some() =>
            {
                self.constrained_serving(mean, std)
            }
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
    /// ONLINE with a full window judged in the objective's units (see
    /// [`LifecycleMachine::set_slo_first`]): SERVING when it meets the error budget (burns it
    /// no faster than it lasts: a fallback that burned faster does not lower the bar for
    /// serving, only for returning to it), uses at least the fallback's share of its spend
    /// (less `probation_margin`) and has converged. Re-baselining, which serves the reward
    /// level a policy settled at, does not apply in these units: a window over the budget is
    /// never served (the error-budget guard returns the target to the fallback when it burns
    /// faster than the fallback did), and a policy that settled within the budget but costlier
    /// than the fallback hands back to the fallback (see
    /// [`LifecycleMachine::settled_costlier`]).
    fn constrained_online(&mut self, mean: f64, std: f64) -> Option<Transition> {
        let (intervals, used) = self.constrained_window()?;
        let burn = intervals.burn(self.objective?)?;
        let n = self.rewards.len();
        let t_var = self.profile.t_var;
        if burn > 1.0 || std > t_var {
            tracing::debug!(
                burn,
                std,
                t_var,
                "not served: over the error budget or not converged"
            );
            return None;
        }
        let fallback = self.fallback_used_share();
        // Cost second, against the fallback when it met the budget too (and not while
        // retraining: the workload has moved on since the fallback's episodes).
        if let Some(f) =
            fallback.filter(|_| self.retrain_from.is_none() && !self.reward_comparison_waived())
        {
            if used < f - self.rules.probation_margin * f {
                tracing::debug!(
                    burn,
                    used,
                    fallback = f,
                    "not served: costlier than the fallback"
                );
                return self.settled_costlier(burn, used, f, (mean, std));
            }
        }
        let fallback_words = match fallback {
            Some(f) => format!("the fallback's {:.1}%", 100.0 * f),
            None => "the fallback's unknown".to_string(),
        };
        let reason = format!(
            "SLO first, then cost: the last {n} ONLINE episodes burned the SLO's error budget at {burn:.2}x ({:.1}% of intervals violating), within the budget ({}), used {:.1}% of their requested spend against {fallback_words}, reward std {std:.3} <= t_var {t_var}",
            100.0 * intervals.share(),
            self.fallback_words(),
            100.0 * used,
        );
        self.reprobe_ended(true);
        let t = self.go(Stage::Serving, reason, Some((mean, std)));
        self.serving_used = Some(used);
        Some(t)
    }

    /// Whether the ONLINE policy has stopped improving: the last `rebaseline_after_episodes`
    /// ONLINE episodes are in, none on probation, and their newer half's mean reward gains no
    /// more than `rebaseline_tolerance` on the older half's. (The reward serves here only as the
    /// learning curve's slope; what a settled policy is worth is judged in the objective's
    /// units.) `None` when not settled, else the two halves' means.
    fn settled(&self) -> Option<(f64, f64)> {
        let n = self.rules.rebaseline_after_episodes;
        if n < 2 || self.online_rewards.len() < n || self.probation.is_some() {
            return None;
        }
        let half = n / 2;
        let len = self.online_rewards.len();
        let older = self.online_rewards.iter().take(half).sum::<f64>() / half as f64;
        let newer = self.online_rewards.iter().skip(len - half).sum::<f64>() / half as f64;
        (newer - older <= self.rules.rebaseline_tolerance * older.abs()).then_some((older, newer))
    }

    /// ONLINE within the error budget but using a smaller share of its requested spend than
    /// the fallback did (less `probation_margin`), with the fallback within the budget too:
    /// once the policy has [settled](LifecycleMachine::settled), the fallback, which meets the
    /// same budget more cheaply, drives again (readmission waits as after a failed probation).
    fn settled_costlier(
        &mut self,
        burn: f64,
        used: f64,
        fallback: f64,
        stats: (f64, f64),
    ) -> Option<Transition> {
        self.settled()?;
        let n = self.rules.rebaseline_after_episodes;
        let reason = format!(
            "settled costlier than the fallback: the last {n} ONLINE episodes stopped improving within the SLO's error budget ({burn:.2}x) but used {:.1}% of their requested spend against the fallback's {:.1}% (less {:.0}%); the fallback drives again",
            100.0 * used,
            100.0 * fallback,
            100.0 * self.rules.probation_margin
        );
        Some(self.demote(reason, stats, n))
    }

    /// SERVING, promoted in the objective's units, with a full window: retrains when it burns
    /// the error budget faster than it lasts, uses a share of its spend lower than it was
    /// served at by more than `serving_cost_margin`, or its std exceeds `t_var`. (Burning faster
    /// than the fallback did, on both of the guard's windows, returns it to OFFLINE first.)
    fn constrained_serving(&mut self, mean: f64, std: f64) -> Option<Transition> {
        let (intervals, used) = self.constrained_window()?;
        let burn = intervals.burn(self.objective?)?;
        let level = self.serving_used?;
        let n = self.rewards.len();
        let t_var = self.profile.t_var;
        let floor = level * (1.0 - self.rules.serving_cost_margin);
        let why = if burn > 1.0 {
            format!(
                "the last {n} SERVING episodes burned the SLO's error budget at {burn:.2}x ({:.1}% of intervals violating), faster than it lasts",
                100.0 * intervals.share()
            )
        } else if used < floor {
            format!(
                "the last {n} SERVING episodes used {:.1}% of their requested spend, below the {:.1}% served at by more than {:.0}%",
                100.0 * used,
                100.0 * level,
                100.0 * self.rules.serving_cost_margin
            )
        } else if std > t_var {
            format!("the last {n} SERVING episodes' reward std {std:.3} > t_var {t_var}")
        } else {
            return None;
        };
        let before = self.rewards.iter().copied().fold(f64::INFINITY, f64::min);
        let t = self.go(
            Stage::Online,
            format!("retraining: {why}"),
            Some((mean, std)),
        );
        self.retrain_from = before.is_finite().then_some(before);
        self.retrain_version = self.last_model;
        self.reprobe_failures = 0;
        Some(t)
    }

    /// The probation rule on one episode; `Some` when it sends the target back to OFFLINE.
    fn probation_check(&mut self, ep: &Episode) -> Option<Transition> {
        if self.stage != Stage::Online || ep.stage != Stage::Online || !ep.mean_reward.is_finite() {
            return None;
        }
        let k = self.rules.probation_episodes;
        let used = self.used_share(ep);
        let (fallback, seen) = self.probation.as_mut()?;
        seen.push(ep.mean_reward);
        self.probation_used.push(used);
        if rl_driven(ep) {
            self.probation_slo = Intervals::sum(&[self.probation_slo, Intervals::of(ep)]);
        }
        if seen.len() < k {
            return None;
        }
        let fallback = *fallback;
        let n = seen.len();
        let mean = seen.iter().sum::<f64>() / n as f64;
        let std = (seen.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        self.probation = None;
        // The budget first: burning faster than allowed fails whatever the reward.
        if let Some(burn) = self
            .objective
            .filter(|_| self.rules.error_budget)
            .and_then(|o| self.probation_slo.burn(o))
        {
            let allowed = self.allowed_burn();
            if burn > allowed {
                let reason = format!(
                    "probation failed on the error budget: the first {n} ONLINE episodes burned the SLO's error budget at {burn:.2}x ({:.1}% of intervals violating, objective {}), faster than the allowed {allowed:.2}x ({}); the fallback drives again",
                    100.0 * self.probation_slo.share(),
                    self.objective.unwrap_or_default(),
                    self.fallback_words()
                );
                let mut t = self.demote(reason, (mean, std), n);
                t.budget_return = true;
                return Some(t);
            }
        }
        if self.reward_comparison_waived() {
            tracing::debug!(mean, fallback, fallback_burn = ?self.fallback_burn(), "probation passed on the error budget: the fallback burned faster than it");
            return None;
        }
        // Then cost, in the objective's units when every episode carried its requests.
        if let Some((used, f)) = self.probation_cost() {
            if used >= f - self.rules.probation_margin * f {
                tracing::debug!(
                    used,
                    fallback = f,
                    "probation passed on the budget and cost"
                );
                return None;
            }
            let reason = format!(
                "probation failed on cost: the first {n} ONLINE episodes met the error budget but used {:.1}% of their requested spend, below the fallback's {:.1}% by more than {:.0}%; the fallback drives again",
                100.0 * used,
                100.0 * f,
                self.rules.probation_margin * 100.0
            );
            return Some(self.demote(reason, (mean, std), n));
        }
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

    /// Probation's episodes' mean used share and the fallback's, when probation is judged in
    /// the objective's units: SLO first on, an SLO, the guard on, and the fallback's and every
    /// probation episode's share known.
    fn probation_cost(&self) -> Option<(f64, f64)> {
        if !(self.slo_first
            && self.rules.cost_judgement
            && self.rules.error_budget
            && self.objective.is_some())
        {
            return None;
        }
        let f = self.fallback_used_share()?;
        let n = self.probation_used.len();
        let sum = self
            .probation_used
            .iter()
            .try_fold(0.0, |a, u| u.map(|u| a + u))?;
        (n > 0).then(|| (sum / n as f64, f))
    }

    /// The error-budget guard on the policy's newest episode: back to OFFLINE when both windows
    /// burn faster than allowed (see [`MonitorConfig::error_budget`]).
    fn budget_check(&mut self) -> Option<Transition> {
        let b = self.budget_burn()?;
        if !b.burning() {
            return None;
        }
        // The long window: the RL episodes there are, up to `budget_long_episodes`.
        let n = self.policy_slo.len();
        let k = self.rules.budget_short_episodes.min(n);
        let what = match self.stage {
            Stage::Serving if self.serving_floor.is_some() => "SERVING (re-baselined)",
            Stage::Serving => "SERVING",
            _ if self.retrain_from.is_some() => "ONLINE (retraining)",
            _ => "ONLINE",
        };
        let reason = format!(
            "error budget: the policy ({what}) burned the SLO's error budget at {:.2}x over the last {n} RL episodes ({:.2}x without the worst one) and {:.2}x over the last {k}, faster than the allowed {:.2}x (the budget at objective {}; {}); the fallback drives again",
            b.long,
            b.long_trimmed,
            b.short,
            b.allowed,
            self.objective.unwrap_or_default(),
            self.fallback_words()
        );
        let rewards: VecDeque<f64> = self.policy_slo.iter().map(|(_, r)| *r).collect();
        let stats = mean_std(&rewards);
        let mut t = self.demote(reason, stats, n);
        t.budget_return = true;
        Some(t)
    }

    /// ONLINE or SERVING → OFFLINE: the fallback drives again; only a model trained after the return, and
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

#[cfg(test)]
pub(crate) mod tests {
    use crate::service::message;
    use aware_bus_schemas::{Event, EventKind, Target};
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

    pub(crate) fn episode(stage: Stage, mean: f64, estimate: Option<f64>) -> Episode {
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

    /// The error-budget guard ([`MonitorConfig::error_budget`]): episodes of 100 intervals.
    mod budget {
        use super::*;
        use Stage::*;

        /// Episode `n` in `stage` earning `mean` per step, `violating` of its 100 intervals
        /// violating the SLO, driven by the RL policy (`rl`) or by the fallback; noise-free.
        fn ep(n: u64, stage: Stage, mean: f64, violating: u32, rl: bool) -> Episode {
            let mut e = episode(stage, mean, None);
            e.episode = n;
            e.steps = 100;
            e.slo_violations = violating;
            (e.rl_steps, e.fallback_steps) = if rl { (100, 0) } else { (0, 100) };
            e.exploring_steps = Some(0);
            // Without its requests, as from a recorder before them: the reward judges.
            e.requested_cores_mean = None;
            e.requested_gib_mean = None;
            e
        }

        /// [`ep`] carrying its requests (2 cores, 4 GiB) and `util` as both utilizations: a
        /// used share of `util` at any prices.
        fn ep_cost(
            n: u64,
            stage: Stage,
            mean: f64,
            violating: u32,
            rl: bool,
            util: f64,
        ) -> Episode {
            Episode {
                requested_cores_mean: Some(2.0),
                requested_gib_mean: Some(4.0),
                cpu_util_mean: util,
                memory_util_mean: util,
                ..ep(n, stage, mean, violating, rl)
            }
        }

        /// A machine holding a 99% SLO first (the constrained objective) after three OFFLINE
        /// episodes of the fallback earning 1.2, violating nothing and using half of its
        /// requested spend, promoted by a model. Returns it and the next episode number.
        fn constrained_online(slo_first: bool) -> (LifecycleMachine, u64) {
            constrained_online_with(slo_first, MonitorConfig::default())
        }

        fn constrained_online_with(
            slo_first: bool,
            rules: MonitorConfig,
        ) -> (LifecycleMachine, u64) {
            let (m, n) = promoted_after_the_fallback(slo_first, rules, 0);
            assert_eq!(m.fallback_used_share(), Some(0.5));
            (m, n)
        }

        /// Like [`constrained_online`], with a fallback that violated 20 intervals of 100 in each
        /// of its episodes (20x the 99% SLO's budget, so the guard allows the policy as much).
        fn online_after_a_fallback_over_its_budget(slo_first: bool) -> (LifecycleMachine, u64) {
            promoted_after_the_fallback(slo_first, MonitorConfig::default(), 20)
        }

        /// A machine with `rules` holding a 99% SLO (first, with `slo_first`) after three
        /// OFFLINE episodes of the fallback earning 1.2, violating `violating` intervals of 100
        /// and using half of its requested spend, promoted by a model. Returns it and the next
        /// episode number.
        fn promoted_after_the_fallback(
            slo_first: bool,
            rules: MonitorConfig,
            violating: u32,
        ) -> (LifecycleMachine, u64) {
            let mut m = LifecycleMachine::with_rules(profile(true), rules);
            m.set_slo(&slo(None));
            m.set_slo_first(slo_first);
            m.start();
            for n in 1..=3 {
                assert!(m
                    .observe(&ep_cost(n, Offline, 1.2, violating, false, 0.5))
                    .is_none());
            }
            assert_eq!(
                m.observe_model(&model(1, Some(1.3), Some(1.2)))
                    .map(|t| t.to),
                Some(Online)
            );
            (m, 4)
        }

        /// Feeds RL episodes in the machine's stage at reward 1.0, each `(violating, util)`.
        fn feed_cost(m: &mut LifecycleMachine, n: &mut u64, eps: &[(u32, f64)]) -> Vec<Transition> {
            let full: Vec<(f64, u32, f64)> = eps.iter().map(|&(v, u)| (1.0, v, u)).collect();
            feed_full(m, n, &full)
        }

        /// SLO first with episodes that carry their requests: a policy earning less reward than
        /// the fallback (1.0 against 1.2, below t_serving 1.3) but meeting the budget and using
        /// more of what it requests (70% against 50%: cheaper at the same load) passes
        /// probation and goes SERVING; the reward alone would have sent it back to OFFLINE.
        #[test]
        fn slo_first_serves_on_the_budget_then_cost_not_on_the_reward() {
            let (mut m, mut n) = constrained_online(true);
            let ts = feed_cost(&mut m, &mut n, &[(0, 0.7); 3]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            let t = &ts[0];
            assert_eq!((t.from, t.to), (Online, Serving));
            assert!(
                t.reason.contains("SLO first, then cost")
                    && t.reason.contains("burned the SLO's error budget at 0.00x")
                    && t.reason.contains("used 70.0%")
                    && t.reason.contains("the fallback's 50.0%"),
                "{}",
                t.reason
            );
            assert!((m.serving_used_share().unwrap() - 0.7).abs() < 1e-12);

            // Without SLO first, or with the cost judgement off, the reward decides: probation
            // fails (1.0 < 1.2 − 10%).
            for (slo_first, cost_judgement) in [(false, true), (true, false)] {
                let rules = MonitorConfig {
                    cost_judgement,
                    ..MonitorConfig::default()
                };
                let (mut m, mut n) = constrained_online_with(slo_first, rules);
                let ts = feed_cost(&mut m, &mut n, &[(0, 0.7); 3]);
                assert_eq!(ts.len(), 1, "{ts:?}");
                assert_eq!(ts[0].to, Offline);
                assert!(
                    ts[0].reason.contains("mean reward 1.000"),
                    "{}",
                    ts[0].reason
                );
            }
        }

        /// A fallback over its budget lowers the bar for returning to it, not for serving: a
        /// window within the allowed burn (the fallback's 20x) but over the budget (5x) passes
        /// probation and keeps learning; it goes SERVING once a window meets the budget.
        #[test]
        fn slo_first_serves_only_a_window_that_meets_the_budget() {
            let (mut m, mut n) = online_after_a_fallback_over_its_budget(true);
            let ts = feed_cost(&mut m, &mut n, &[(5, 0.7); 3]);
            assert!(ts.is_empty(), "{ts:?}");
            assert_eq!(m.stage(), Online);
            let ts = feed_cost(&mut m, &mut n, &[(0, 0.7); 3]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            assert_eq!((ts[0].from, ts[0].to), (Online, Serving));
            assert!(
                ts[0]
                    .reason
                    .contains("within the budget (the fallback burned 20.00x)"),
                "{}",
                ts[0].reason
            );
        }

        /// Within the budget but costlier than the fallback (using 30% of its spend against
        /// 50%): probation fails on cost. Over the budget: on the budget first, whatever the
        /// cost.
        #[test]
        fn slo_first_probation_fails_on_cost_after_the_budget() {
            let (mut m, mut n) = constrained_online(true);
            let ts = feed_cost(&mut m, &mut n, &[(0, 0.3); 3]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            assert_eq!((ts[0].to, ts[0].budget_return), (Offline, false));
            assert!(
                ts[0].reason.contains("probation failed on cost")
                    && ts[0].reason.contains("used 30.0%")
                    && ts[0].reason.contains("fallback's 50.0%"),
                "{}",
                ts[0].reason
            );

            let (mut m, mut n) = constrained_online(true);
            let ts = feed_cost(&mut m, &mut n, &[(3, 0.9); 3]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            assert_eq!((ts[0].to, ts[0].budget_return), (Offline, true));
            assert!(
                ts[0]
                    .reason
                    .contains("probation failed on the error budget"),
                "{}",
                ts[0].reason
            );
        }

        /// Feeds RL episodes in the machine's stage, each `(reward, violating, util)`.
        fn feed_full(
            m: &mut LifecycleMachine,
            n: &mut u64,
            eps: &[(f64, u32, f64)],
        ) -> Vec<Transition> {
            let mut out = Vec::new();
            for &(r, v, u) in eps {
                let stage = m.stage();
                out.extend(m.observe(&ep_cost(*n, stage, r, v, true, u)));
                *n += 1;
            }
            out
        }

        /// A policy that settled over the error budget (5x, with a fallback that burned 20x so
        /// the guard allows it) is not re-baselined in the objective's units: it keeps
        /// learning. Judged by the reward, the same episodes are served at the level they
        /// settled at.
        #[test]
        fn slo_first_never_re_baselines_a_window_over_the_budget() {
            let run = |slo_first: bool| {
                let (mut m, mut n) = online_after_a_fallback_over_its_budget(slo_first);
                let ts = feed_full(&mut m, &mut n, &[(1.2, 5, 0.7); 14]);
                (m, ts)
            };
            let (m, ts) = run(true);
            assert!(ts.is_empty(), "{ts:?}");
            assert_eq!(m.stage(), Online);
            let (m, ts) = run(false);
            assert_eq!(ts.len(), 1, "{ts:?}");
            assert_eq!((ts[0].from, ts[0].to), (Online, Serving));
            assert!(ts[0].reason.starts_with("re-baselined"), "{}", ts[0].reason);
            assert!(m.rebaselined());
        }

        /// Within the budget, a policy that passed probation and then settled using a smaller
        /// share of its spend than the fallback (30% against 50%, beyond the 10% margin) hands
        /// back to the fallback once it has stopped improving, not before.
        #[test]
        fn slo_first_settled_costlier_than_the_fallback_hands_back() {
            let (mut m, mut n) = constrained_online(true);
            // Probation passes on the budget and cost; the rewards' spread keeps it from serving.
            let ts = feed_full(
                &mut m,
                &mut n,
                &[(1.0, 0, 0.5), (1.3, 0, 0.5), (0.7, 0, 0.5)],
            );
            assert!(ts.is_empty(), "{ts:?}");
            assert!(!m.on_probation());
            // Six costlier episodes: not settled yet (fewer than 10 ONLINE episodes).
            let ts = feed_full(&mut m, &mut n, &[(1.0, 0, 0.3); 6]);
            assert!(ts.is_empty(), "{ts:?}");
            assert_eq!(m.stage(), Online);
            let ts = feed_full(&mut m, &mut n, &[(1.0, 0, 0.3)]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            assert_eq!(
                (ts[0].from, ts[0].to, ts[0].budget_return),
                (Online, Offline, false)
            );
            assert!(
                ts[0].reason.contains("settled costlier than the fallback")
                    && ts[0].reason.contains("used 30.0%")
                    && ts[0].reason.contains("the fallback's 50.0%"),
                "{}",
                ts[0].reason
            );
        }

        /// SERVING on the budget and cost, the target retrains when its window burns the budget
        /// faster than allowed (before the guard's long window is full), or when it uses a
        /// share of its spend lower than it was served at by more than `serving_cost_margin`;
        /// a share within the margin keeps it SERVING.
        #[test]
        fn slo_first_retrains_on_the_budget_then_on_cost() {
            let serve = || {
                let (mut m, mut n) = constrained_online(true);
                let ts = feed_cost(&mut m, &mut n, &[(0, 0.7); 3]);
                assert_eq!(ts.last().map(|t| t.to), Some(Serving));
                (m, n)
            };
            let (mut m, mut n) = serve();
            // 2% violating: 2x the budget over the window.
            let ts = feed_cost(&mut m, &mut n, &[(2, 0.7); 3]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            assert_eq!(
                (ts[0].from, ts[0].to, ts[0].budget_return),
                (Serving, Online, false)
            );
            assert!(
                ts[0].reason.contains("retraining: the last 3 SERVING episodes burned the SLO's error budget at 2.00x"),
                "{}",
                ts[0].reason
            );

            let (mut m, mut n) = serve();
            // 65%: within 10% of 70%.
            assert!(feed_cost(&mut m, &mut n, &[(0, 0.65); 3]).is_empty());
            assert_eq!(m.stage(), Serving);
            let ts = feed_cost(&mut m, &mut n, &[(0, 0.55); 3]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            assert_eq!((ts[0].from, ts[0].to), (Serving, Online));
            assert!(
                ts[0]
                    .reason
                    .contains("below the 70.0% served at by more than 10%"),
                "{}",
                ts[0].reason
            );
            // Retraining: no comparison with the fallback's cost; the budget and convergence
            // serve it again.
            let ts = feed_cost(&mut m, &mut n, &[(0, 0.4); 3]);
            assert_eq!(ts.last().map(|t| t.to), Some(Serving), "{ts:?}");
        }

        fn slo(objective: Option<f64>) -> Slo {
            Slo {
                latency_p99_ms: Some(200.0),
                objective,
                ..Slo::default()
            }
        }

        /// A machine with `rules` and a 99% SLO, SERVING after three OFFLINE episodes in which
        /// the fallback violated `fallback_violating` intervals of 100 each (earning 1.2), a
        /// promotion and a probation of three clean ONLINE episodes at 1.5. Returns it and the
        /// next episode number.
        fn serving(rules: MonitorConfig, fallback_violating: u32) -> (LifecycleMachine, u64) {
            let mut m = LifecycleMachine::with_rules(profile(true), rules);
            m.set_slo(&slo(None));
            m.start();
            for n in 1..=3 {
                assert!(m
                    .observe(&ep(n, Offline, 1.2, fallback_violating, false))
                    .is_none());
            }
            assert_eq!(
                m.observe_model(&model(1, Some(1.3), Some(1.2)))
                    .map(|t| t.to),
                Some(Online)
            );
            for n in 4..=5 {
                assert!(m.observe(&ep(n, Online, 1.5, 0, true)).is_none());
            }
            let t = m.observe(&ep(6, Online, 1.5, 0, true)).expect("SERVING");
            assert_eq!((t.to, t.budget_return), (Serving, false));
            (m, 7)
        }

        /// Feeds SERVING (or whatever stage the machine is in) RL episodes at 1.5 with these
        /// violations; returns the transitions.
        fn feed_rl(m: &mut LifecycleMachine, n: &mut u64, violating: &[u32]) -> Vec<Transition> {
            let mut out = Vec::new();
            for &v in violating {
                let stage = m.stage();
                out.extend(m.observe(&ep(*n, stage, 1.5, v, true)));
                *n += 1;
            }
            out
        }

        #[test]
        fn a_serving_policy_burning_the_budget_returns_the_target_to_the_fallback() {
            let (mut m, mut n) = serving(MonitorConfig::default(), 0);
            assert_eq!(m.fallback_burn(), Some(0.0));
            // 5% of intervals violating: 5x the budget, while the reward (1.5) is above
            // t_serving: rewards alone keep it SERVING.
            let ts = feed_rl(&mut m, &mut n, &[5]);
            assert!(ts.is_empty(), "one bad episode never decides: {ts:?}");
            assert_eq!(m.stage(), Serving);
            // The second decides, long before the long window (10) is full: it holds the RL
            // episodes there are.
            let ts = feed_rl(&mut m, &mut n, &[5]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            let t = &ts[0];
            assert_eq!((t.from, t.to, t.window), (Serving, Offline, 5));
            assert!(t.budget_return);
            // 3 clean ONLINE and 2 SERVING episodes at 5%: 2x, 1.25x without the worst,
            // 5x over the last 2; the fallback burned nothing.
            for part in [
                "error budget",
                "SERVING",
                "2.00x over the last 5 RL episodes",
                "1.25x without the worst one",
                "5.00x over the last 2",
                "allowed 1.00x",
                "objective 0.99",
                "the fallback burned 0.00x",
            ] {
                assert!(t.reason.contains(part), "{part}: {}", t.reason);
            }
            assert!((t.mean.unwrap() - 1.5).abs() < 1e-12);
            // Readmitted as after a failed probation: a newer model, after 2 OFFLINE episodes.
            assert_eq!(m.readmit_wait(), 2);
            assert!(m.observe_model(&model(2, Some(1.3), Some(1.2))).is_none());
            // Rewards alone would have kept it SERVING.
            let (mut m, mut n) = serving(
                MonitorConfig {
                    error_budget: false,
                    ..MonitorConfig::default()
                },
                0,
            );
            assert!(feed_rl(&mut m, &mut n, &[5; 30]).is_empty());
            assert_eq!(m.stage(), Serving);
        }

        #[test]
        fn a_policy_burning_no_faster_than_the_fallback_stays() {
            // The fallback violated 8% of its intervals: 8x the budget.
            let (mut m, mut n) = serving(MonitorConfig::default(), 8);
            assert_eq!(m.fallback_burn().map(|b| (b * 100.0).round()), Some(800.0));
            // The policy burns 5x: beyond the budget, but slower than the fallback did.
            assert!(feed_rl(&mut m, &mut n, &[5; 30]).is_empty());
            assert_eq!(m.stage(), Serving);
            let b = m.budget_burn().unwrap();
            assert!(
                (b.long - 5.0).abs() < 1e-9 && (b.allowed - 8.0).abs() < 1e-9,
                "{b:?}"
            );
            assert!(!b.burning());
            // Faster than the fallback (12x): back to it.
            let ts = feed_rl(&mut m, &mut n, &[12; 10]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            assert_eq!((ts[0].from, ts[0].to), (Serving, Offline));
            assert!(ts[0].reason.contains("allowed 8.00x"), "{}", ts[0].reason);
            assert!(
                ts[0].reason.contains("the fallback burned 8.00x"),
                "{}",
                ts[0].reason
            );
        }

        #[test]
        fn one_bad_episode_or_a_burn_that_stopped_does_not_return_the_target() {
            let (mut m, mut n) = serving(MonitorConfig::default(), 0);
            // A full window of clean episodes, then one at 60%: it is the newest and the short
            // window burns 30x, but without it the long window burns nothing.
            assert!(feed_rl(&mut m, &mut n, &[0; 9]).is_empty());
            assert!(feed_rl(&mut m, &mut n, &[60]).is_empty());
            let b = m.budget_burn().unwrap();
            assert!(
                b.long > 5.0 && b.short > 20.0 && b.long_trimmed == 0.0,
                "{b:?}"
            );
            assert!(feed_rl(&mut m, &mut n, &[0; 12]).is_empty());
            assert_eq!(m.stage(), Serving);
            // Bad episodes apart, each diluted by the clean ones around it, never make both
            // windows burn at once.
            let (mut m, mut n) = serving(MonitorConfig::default(), 0);
            assert!(feed_rl(&mut m, &mut n, &[0, 0, 0, 0, 0, 0, 0, 2, 0, 2, 0, 2, 0]).is_empty());
            assert_eq!(m.stage(), Serving);
            // A burn that has stopped (the short window clean) does not decide either.
            let stopped = BudgetBurn {
                long: 3.0,
                long_trimmed: 2.0,
                short: 0.0,
                fallback: Some(0.0),
                allowed: 1.0,
            };
            assert!(!stopped.burning());
            // Two bad episodes in a row are no longer one episode's doing.
            let ts = feed_rl(&mut m, &mut n, &[30, 30]);
            assert_eq!(ts.iter().map(|t| t.to).collect::<Vec<_>>(), [Offline]);
            // From the first episode past the short window on: probation (3 episodes) aside, a
            // policy burning from its promotion is returned at its third RL episode.
            let mut m = LifecycleMachine::with_rules(
                profile(true),
                MonitorConfig {
                    budget_short_episodes: 1,
                    ..MonitorConfig::default()
                },
            );
            m.set_slo(&slo(None));
            m.start();
            assert!(m.observe(&ep(1, Offline, 1.2, 0, false)).is_none());
            m.observe_model(&model(1, Some(1.3), Some(1.2))).unwrap();
            let mut n = 2;
            assert!(feed_rl(&mut m, &mut n, &[20]).is_empty());
            let ts = feed_rl(&mut m, &mut n, &[20]);
            assert_eq!(
                ts.iter().map(|t| (t.to, t.window)).collect::<Vec<_>>(),
                [(Offline, 2)]
            );
        }

        #[test]
        fn without_an_slo_or_with_the_guard_off_the_budget_never_decides() {
            for (rules, slo) in [
                (MonitorConfig::default(), Slo::default()),
                (
                    MonitorConfig {
                        error_budget: false,
                        ..MonitorConfig::default()
                    },
                    slo(Some(0.99)),
                ),
            ] {
                let (mut m, mut n) = serving(rules, 0);
                m.set_slo(&slo);
                assert!(feed_rl(&mut m, &mut n, &[50; 30]).is_empty());
                assert_eq!(m.stage(), Serving);
                assert_eq!(m.budget_burn(), None);
            }
            // An objective without a latency or throughput objective is no SLO.
            let mut m = paper_machine(profile(true));
            m.set_slo(&Slo {
                objective: Some(0.9),
                ..Slo::default()
            });
            assert_eq!(m.slo_objective(), None);
            m.set_slo(&slo(Some(0.9)));
            assert_eq!(m.slo_objective(), Some(0.9));
        }

        #[test]
        fn the_objective_sets_the_budget() {
            // 5% violating at a 95% objective spends the budget exactly: no faster than allowed.
            let (mut m, mut n) = serving(MonitorConfig::default(), 0);
            m.set_slo(&slo(Some(0.95)));
            assert!(feed_rl(&mut m, &mut n, &[5; 20]).is_empty());
            assert!((m.budget_burn().unwrap().long - 1.0).abs() < 1e-9);
            // At 99.9%, one violating interval in 100 is 10x.
            m.set_slo(&slo(Some(0.999)));
            let ts = feed_rl(&mut m, &mut n, &[1]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            assert!(ts[0].reason.contains("objective 0.999"), "{}", ts[0].reason);
        }

        /// SLO first (the constrained objective): a policy within the allowed burn passes
        /// probation whatever its reward when the fallback burned faster than the budget; when
        /// the fallback met the budget, the reward comparison stands. Without it, the reward
        /// decides as before.
        #[test]
        fn slo_first_waives_the_reward_comparison_only_against_a_fallback_over_its_budget() {
            let run = |slo_first: bool, fallback_violating: u32, rl_violating: u32| {
                let mut m = LifecycleMachine::with_rules(profile(true), MonitorConfig::default());
                m.set_slo(&slo(None));
                m.set_slo_first(slo_first);
                m.start();
                for n in 1..=3 {
                    m.observe(&ep(n, Offline, 1.4, fallback_violating, false));
                }
                assert_eq!(
                    m.observe_model(&model(1, Some(1.5), Some(1.4)))
                        .map(|t| t.to),
                    Some(Online)
                );
                // Three ONLINE episodes earning 1.0, more than 10% below the fallback's 1.4.
                let ts: Vec<Transition> = (4..=6)
                    .filter_map(|n| m.observe(&ep(n, Online, 1.0, rl_violating, true)))
                    .collect();
                (m.stage(), ts)
            };
            // The fallback violated 20% (20x the budget), the policy 5% (within the allowed 20x).
            let (stage, ts) = run(true, 20, 5);
            assert_eq!(stage, Online, "{ts:?}");
            let (stage, ts) = run(false, 20, 5);
            assert_eq!(stage, Offline);
            assert!(
                ts[0].reason.contains("mean reward 1.000"),
                "{}",
                ts[0].reason
            );
            // The fallback met the budget: the reward stands in for what the policy requests.
            let (stage, ts) = run(true, 0, 0);
            assert_eq!(stage, Offline);
            assert!(
                ts[0].reason.contains("mean reward 1.000"),
                "{}",
                ts[0].reason
            );
        }

        #[test]
        fn probation_fails_on_the_budget_before_the_reward_and_readmission_doubles() {
            let rules = MonitorConfig::default();
            let mut m = LifecycleMachine::with_rules(profile(true), rules.clone());
            m.set_slo(&slo(None));
            m.start();
            let mut n = 1;
            let offline = |m: &mut LifecycleMachine, n: &mut u64| {
                m.observe(&ep(*n, Offline, 1.2, 0, false));
                *n += 1;
            };
            offline(&mut m, &mut n);
            m.observe_model(&model(1, Some(1.3), Some(1.2))).unwrap();
            assert!(m.on_probation());
            // Earning more than the fallback (1.5 against 1.2), but violating 10% of intervals
            // where the fallback violated none.
            let ts = feed_rl(&mut m, &mut n, &[10, 10, 10]);
            assert_eq!(ts.len(), 1, "{ts:?}");
            let t = &ts[0];
            assert_eq!((t.from, t.to, t.window), (Online, Offline, 3));
            assert!(t.budget_return);
            assert!(
                t.reason.contains("probation failed on the error budget")
                    && t.reason.contains("10.00x")
                    && t.reason.contains("the fallback burned 0.00x"),
                "{}",
                t.reason
            );
            assert_eq!(m.readmit_wait(), 2);
            // Readmitted after 2 OFFLINE episodes and a newer model...
            offline(&mut m, &mut n);
            assert!(m.observe_model(&model(2, Some(1.3), Some(1.2))).is_none());
            offline(&mut m, &mut n);
            assert_eq!(
                m.observe_model(&model(3, Some(1.3), Some(1.2)))
                    .map(|t| t.to),
                Some(Online)
            );
            // ...it passes probation clean, goes SERVING, then burns the budget there: the
            // second return doubles the wait.
            assert_eq!(
                feed_rl(&mut m, &mut n, &[0, 0, 0])
                    .iter()
                    .map(|t| t.to)
                    .collect::<Vec<_>>(),
                [Serving]
            );
            let ts = feed_rl(&mut m, &mut n, &[20; 2]);
            assert_eq!(
                ts.iter().map(|t| (t.from, t.to)).collect::<Vec<_>>(),
                [(Serving, Offline)]
            );
            assert_eq!(m.readmit_wait(), 4);
            for v in 4..7 {
                offline(&mut m, &mut n);
                let t = m.observe_model(&model(v, Some(1.3), Some(1.2)));
                assert!(t.is_none(), "{v}: {t:?}");
            }
            offline(&mut m, &mut n);
            assert_eq!(
                m.observe_model(&model(7, Some(1.3), Some(1.2)))
                    .map(|t| t.to),
                Some(Online)
            );
            // A probation within the budget is judged on the reward as before.
            let ts = feed_rl(&mut m, &mut n, &[0, 0, 0]);
            assert_eq!(ts.iter().map(|t| t.to).collect::<Vec<_>>(), [Serving]);
        }
    }
}
