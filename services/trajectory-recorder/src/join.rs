//! Joins each target's `obs`, `action` and `applied` into transitions
//! (s_t, a_t, r_{t+1}, s_{t+1}) and folds them into episode summaries.
//!
//! obs(t) carries s_t; action(t) and applied(t) the decision for step t; obs(t+1) carries
//! r_{t+1} (the reward of that decision) and s_{t+1}. A transition is emitted when obs(t+1)
//! arrives and the action of step t is known (a step without an action — incomplete metrics —
//! produces none). An episode's summary is emitted with the transition of its last step.
//!
//! The transition's `applied` is the allocation in force: the actuator's `applied` for the step.
//! The actuator publishes it after the write to the cluster, which can take longer than a step,
//! so on a bus read in order it may follow obs(t+1). Once a target's actions have had an
//! `applied`, a transition whose `applied` has not come yet waits for it, until obs(t+2) at most
//! (or [`Joiner::flush`]); only then does it take the action's `current`, the collector's view,
//! which during a rollout can mix the old pods' requests with the new replica count. A target
//! whose actions never had an `applied` (no actuator, recommend-only tooling) waits for none.

use std::collections::BTreeMap;

use aware_bus_schemas::{Action, Applied, DecisionSource, Episode, Obs, Schema, Stage, Target};

use aware_mdp::Prices;
use aware_stores::trajectory::Transition;

/// Global step index of (episode, step) with `steps_per_episode`.
pub fn global(episode: u64, step: u32, spe: u32) -> u64 {
    episode * u64::from(spe.max(1)) + u64::from(step)
}

#[derive(Debug, Default, Clone)]
struct EpisodeAcc {
    steps: u32,
    reward: f64,
    slo_violations: u32,
    cpu_util: f64,
    memory_util: f64,
    rl_steps: u32,
    fallback_steps: u32,
    /// Steps whose action explored (`action.exploration`).
    exploring_steps: u32,
    /// Σ over the steps of the requested cores and GiB in force (the transition's `applied`).
    requested_cores: f64,
    requested_gib: f64,
    stages: BTreeMap<&'static str, (u32, Option<Stage>)>,
    last_step: u32,
    last_ts_ms: i64,
}

/// The join state of one target.
#[derive(Debug, Clone)]
pub struct Joiner {
    target: Target,
    spe: u32,
    prev: Option<Obs>,
    action: Option<Action>,
    applied: Option<Applied>,
    /// A transition joined but for its `applied` (see the module documentation).
    pending: Option<Pending>,
    /// Whether an `applied` has been seen for this target: only then is one waited for.
    expects_applied: bool,
    episodes: BTreeMap<u64, EpisodeAcc>,
}

/// A transition waiting for the actuator's `applied`, with what its fold needs.
#[derive(Debug, Clone)]
struct Pending {
    transition: Transition,
    exploring: bool,
    ts_ms: i64,
}

/// What one event produced, in order: at most two transitions (one that waited for its
/// `applied` and the step just closed) and the summaries of the episodes they completed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Joined {
    pub transitions: Vec<Transition>,
    pub episodes: Vec<Episode>,
}

impl Joined {
    fn emit(&mut self, t: Transition, episode: Option<Episode>) {
        self.transitions.push(t);
        self.episodes.extend(episode);
    }
}

impl Joiner {
    pub fn new(target: Target, steps_per_episode: u32) -> Self {
        Joiner {
            target,
            spe: steps_per_episode.max(1),
            prev: None,
            action: None,
            applied: None,
            pending: None,
            expects_applied: false,
            episodes: BTreeMap::new(),
        }
    }

    /// Whether a transition waits for its `applied`.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Emits the transition waiting for its `applied` with the action's `current` (the target
    /// retires, or its observations stopped).
    pub fn flush(&mut self) -> Joined {
        let mut out = Joined::default();
        if let Some(p) = self.pending.take() {
            let episode = self.fold(&p.transition, p.exploring, p.ts_ms);
            out.emit(p.transition, episode);
        }
        out
    }

    fn prev_global(&self) -> Option<u64> {
        self.prev
            .as_ref()
            .map(|o| global(o.episode, o.step, self.spe))
    }

    /// An action: kept when it is for the step of the latest obs.
    pub fn on_action(&mut self, a: Action) {
        if self.prev_global() == Some(global(a.episode, a.step, self.spe)) {
            self.action = Some(a);
        }
    }

    /// An applied decision: kept when it is for the step of the latest obs; completes the
    /// transition waiting for it.
    pub fn on_applied(&mut self, a: Applied) -> Joined {
        self.expects_applied = true;
        let (g, spe) = (global(a.episode, a.step, self.spe), self.spe);
        if let Some(p) = self
            .pending
            .as_mut()
            .filter(|p| global(p.transition.episode, p.transition.step, spe) == g)
        {
            p.transition.applied = a.applied;
            return self.flush();
        }
        if self.prev_global() == Some(g) {
            self.applied = Some(a);
        }
        Joined::default()
    }

    /// An obs: closes the previous step's transition when it directly follows it.
    pub fn on_obs(&mut self, o: Obs) -> Joined {
        let g = global(o.episode, o.step, self.spe);
        let mut out = self.flush();
        if let (Some(prev), Some(action)) = (&self.prev, &self.action) {
            let follows = self.prev_global().map(|p| p + 1) == Some(g);
            let reward = o.reward.filter(|r| r.is_finite());
            if let (true, Some(reward)) = (follows, reward) {
                let known = self.applied.as_ref().map(|a| a.applied);
                let applied = known.unwrap_or(action.current);
                let exploring = action.exploration;
                let t = Transition {
                    target: self.target.clone(),
                    episode: prev.episode,
                    step: prev.step,
                    ts_ms: prev.ts_ms,
                    state: prev.state.clone(),
                    action_raw: action.raw.clone(),
                    desired: action.desired,
                    applied,
                    source: action.source,
                    stage: action.stage,
                    reward,
                    next_state: o.state.clone(),
                    slo_violation: o.slo_violation,
                    cpu_util: o.metrics.cpu_util,
                    memory_util: o.metrics.memory_util,
                };
                if known.is_none() && self.expects_applied {
                    self.pending = Some(Pending {
                        transition: t,
                        exploring,
                        ts_ms: o.ts_ms,
                    });
                } else {
                    let episode = self.fold(&t, exploring, o.ts_ms);
                    out.emit(t, episode);
                }
            }
        }
        self.prev = Some(o);
        self.action = None;
        self.applied = None;
        out
    }

    fn fold(&mut self, t: &Transition, exploring: bool, ts_ms: i64) -> Option<Episode> {
        let acc = self.episodes.entry(t.episode).or_default();
        acc.steps += 1;
        acc.exploring_steps += u32::from(exploring);
        acc.reward += t.reward;
        acc.slo_violations += u32::from(t.slo_violation);
        acc.cpu_util += t.cpu_util;
        acc.memory_util += t.memory_util;
        acc.requested_cores += Prices::cores(&t.applied);
        acc.requested_gib += Prices::gib(&t.applied);
        match t.source {
            DecisionSource::Rl => acc.rl_steps += 1,
            DecisionSource::Fallback => acc.fallback_steps += 1,
        }
        let e = acc.stages.entry(t.stage.as_str()).or_insert((0, None));
        e.0 += 1;
        e.1 = Some(t.stage);
        acc.last_step = t.step;
        acc.last_ts_ms = ts_ms;
        if t.step + 1 < self.spe {
            return None;
        }
        let acc = self.episodes.remove(&t.episode)?;
        // Older unfinished episodes (steps lost before a restart) will never complete.
        self.episodes.retain(|&e, _| e > t.episode);
        let n = f64::from(acc.steps.max(1));
        let stage = acc
            .stages
            .values()
            .max_by_key(|(count, _)| *count)
            .and_then(|(_, s)| *s)
            .unwrap_or(Stage::Offline);
        Some(Episode {
            schema: Schema::new(),
            target: self.target.clone(),
            episode: t.episode,
            step: acc.last_step,
            ts_ms: acc.last_ts_ms,
            steps: acc.steps,
            total_reward: acc.reward,
            mean_reward: acc.reward / n,
            slo_violations: acc.slo_violations,
            cpu_util_mean: acc.cpu_util / n,
            memory_util_mean: acc.memory_util / n,
            rl_steps: acc.rl_steps,
            fallback_steps: acc.fallback_steps,
            stage,
            policy_estimate: None,
            exploring_steps: Some(acc.exploring_steps),
            requested_cores_mean: Some(acc.requested_cores / n),
            requested_gib_mean: Some(acc.requested_gib / n),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_bus_schemas::generated::samples;
    use aware_bus_schemas::Event;

    fn obs(e: u64, s: u32, reward: Option<f64>, state0: f32) -> Obs {
        let Some(Event::Obs(mut o)) = samples().into_iter().find(|e| matches!(e, Event::Obs(_)))
        else {
            unreachable!()
        };
        o.episode = e;
        o.step = s;
        o.reward = reward;
        o.state[0] = state0;
        o
    }

    fn action(e: u64, s: u32, source: DecisionSource) -> Action {
        let Some(Event::Action(mut a)) = samples()
            .into_iter()
            .find(|e| matches!(e, Event::Action(_)))
        else {
            unreachable!()
        };
        a.episode = e;
        a.step = s;
        a.source = source;
        a
    }

    fn applied(e: u64, s: u32, replicas: u32) -> Applied {
        let Some(Event::Applied(mut a)) = samples()
            .into_iter()
            .find(|e| matches!(e, Event::Applied(_)))
        else {
            unreachable!()
        };
        a.episode = e;
        a.step = s;
        a.applied.replicas = replicas;
        a
    }

    #[test]
    fn joins_state_action_reward_next_state() {
        let mut j = Joiner::new(Target::new("shop", "checkout"), 3);
        assert_eq!(j.on_obs(obs(0, 0, None, 0.1)), Joined::default());
        j.on_action(action(0, 0, DecisionSource::Fallback));
        j.on_applied(applied(0, 0, 7));
        let out = j.on_obs(obs(0, 1, Some(1.5), 0.2));
        let [t] = &out.transitions[..] else {
            panic!("{out:?}")
        };
        assert_eq!((t.episode, t.step), (0, 0));
        assert_eq!(t.state[0], 0.1);
        assert_eq!(t.next_state[0], 0.2);
        assert_eq!(t.reward, 1.5);
        assert_eq!(t.applied.replicas, 7);
        assert!(out.episodes.is_empty());
    }

    #[test]
    fn no_action_no_transition_and_gaps_break_the_chain() {
        let mut j = Joiner::new(Target::new("shop", "checkout"), 100);
        j.on_obs(obs(0, 0, None, 0.1));
        assert!(
            j.on_obs(obs(0, 1, Some(1.0), 0.2)).transitions.is_empty(),
            "no action"
        );
        j.on_action(action(0, 1, DecisionSource::Fallback));
        assert!(
            j.on_obs(obs(0, 3, Some(1.0), 0.2)).transitions.is_empty(),
            "gap"
        );
        // An action for an old step is ignored.
        j.on_action(action(0, 1, DecisionSource::Fallback));
        assert!(j.on_obs(obs(0, 4, Some(1.0), 0.2)).transitions.is_empty());
    }

    #[test]
    fn without_an_actuator_the_allocation_in_force_is_the_actions_current() {
        let mut j = Joiner::new(Target::new("shop", "checkout"), 100);
        j.on_obs(obs(0, 0, None, 0.1));
        let a = action(0, 0, DecisionSource::Fallback);
        let current = a.current;
        j.on_action(a);
        let out = j.on_obs(obs(0, 1, Some(1.0), 0.2));
        assert_eq!(
            out.transitions.len(),
            1,
            "no applied was ever seen: none is waited for"
        );
        assert_eq!(out.transitions[0].applied, current);
    }

    /// The actuator's `applied` for step t arrives after obs(t+1): the transition waits for it
    /// and stores what the actuator put in force, not the collector's view.
    #[test]
    fn a_late_applied_is_waited_for_until_the_next_obs() {
        let mut j = Joiner::new(Target::new("shop", "checkout"), 3);
        j.on_obs(obs(0, 0, None, 0.0));
        j.on_action(action(0, 0, DecisionSource::Fallback));
        assert_eq!(j.on_applied(applied(0, 0, 4)).transitions.len(), 0);
        assert_eq!(j.on_obs(obs(0, 1, Some(1.0), 0.0)).transitions.len(), 1);
        // Step 1: the applied comes after obs(0, 2).
        j.on_action(action(0, 1, DecisionSource::Fallback));
        let out = j.on_obs(obs(0, 2, Some(2.0), 0.0));
        assert!(out.transitions.is_empty() && j.has_pending(), "{out:?}");
        let out = j.on_applied(applied(0, 1, 5));
        let [t] = &out.transitions[..] else {
            panic!("{out:?}")
        };
        assert_eq!((t.step, t.applied.replicas), (1, 5));
        assert!(!j.has_pending());
        // Step 2, the episode's last: no applied before obs(1, 0), nor before obs(1, 1). The
        // transition is stored then with the action's `current`, and closes the episode.
        let a = action(0, 2, DecisionSource::Rl);
        let current = a.current;
        j.on_action(a);
        assert!(j.on_obs(obs(1, 0, Some(3.0), 0.0)).transitions.is_empty());
        j.on_action(action(1, 0, DecisionSource::Rl));
        j.on_applied(applied(1, 0, 6));
        // An applied of another step does not complete it.
        assert!(j.on_applied(applied(0, 1, 9)).transitions.is_empty());
        let out = j.on_obs(obs(1, 1, Some(4.0), 0.0));
        assert_eq!(
            out.transitions
                .iter()
                .map(|t| (t.episode, t.step, t.applied.replicas))
                .collect::<Vec<_>>(),
            vec![(0, 2, current.replicas), (1, 0, 6)],
            "the waiting transition first, then the step just closed"
        );
        let [e] = &out.episodes[..] else {
            panic!("{out:?}")
        };
        assert_eq!((e.episode, e.steps, e.total_reward), (0, 3, 6.0));
    }

    #[test]
    fn a_flush_stores_the_waiting_transition() {
        let mut j = Joiner::new(Target::new("shop", "checkout"), 100);
        j.on_obs(obs(0, 0, None, 0.0));
        j.on_action(action(0, 0, DecisionSource::Fallback));
        j.on_applied(applied(0, 0, 4));
        j.on_obs(obs(0, 1, Some(1.0), 0.0));
        j.on_action(action(0, 1, DecisionSource::Fallback));
        assert!(j.on_obs(obs(0, 2, Some(1.0), 0.0)).transitions.is_empty());
        assert_eq!(j.flush().transitions.len(), 1);
        assert!(!j.has_pending() && j.flush().transitions.is_empty());
    }

    #[test]
    fn episode_summary_at_the_last_step() {
        let mut j = Joiner::new(Target::new("shop", "checkout"), 3);
        j.on_obs(obs(0, 0, None, 0.0));
        let mut episode = None;
        let rewards = [1.0, 2.0, 3.0];
        for (i, (e, s)) in [(0u64, 1u32), (0, 2), (1, 0)].into_iter().enumerate() {
            let mut a = action(
                0,
                i as u32,
                if i == 0 {
                    DecisionSource::Rl
                } else {
                    DecisionSource::Fallback
                },
            );
            // the RL step explored
            a.exploration = i == 0;
            j.on_action(a);
            // 2, 4 and 6 replicas of 500 millicores and 1 GiB each, applied
            let mut ap = applied(0, i as u32, 2 * (i as u32 + 1));
            ap.applied.cpu_millicores = 500;
            ap.applied.memory_bytes = 1 << 30;
            j.on_applied(ap);
            let mut o = obs(e, s, Some(rewards[i]), 0.0);
            o.slo_violation = i == 1;
            let out = j.on_obs(o);
            assert_eq!(out.transitions.len(), 1);
            if let Some(e) = out.episodes.into_iter().next() {
                episode = Some(e);
            }
        }
        let ep = episode.expect("episode 0 closes with the transition of step 2");
        assert_eq!(ep.episode, 0);
        assert_eq!(ep.steps, 3);
        assert_eq!(ep.total_reward, 6.0);
        assert_eq!(ep.mean_reward, 2.0);
        assert_eq!(ep.slo_violations, 1);
        assert_eq!((ep.rl_steps, ep.fallback_steps), (1, 2));
        assert_eq!(ep.exploring_steps, Some(1));
        assert_eq!(ep.step, 2);
        // The means of the requests in force: 4 replicas on average.
        assert_eq!(ep.requested_cores_mean, Some(2.0));
        assert_eq!(ep.requested_gib_mean, Some(4.0));
    }
}
