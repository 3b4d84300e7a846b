//! Joins each target's `obs`, `action` and `applied` into transitions
//! (s_t, a_t, r_{t+1}, s_{t+1}) and folds them into episode summaries.
//!
//! obs(t) carries s_t; action(t) and applied(t) the decision for step t; obs(t+1) carries
//! r_{t+1} (the reward of that decision) and s_{t+1}. The three kinds of one step may arrive in
//! any order: with acknowledged publishes a retried message is stored after the messages that
//! answered its first try, and the actuator's `applied` follows the write to the cluster, which
//! can take longer than a step. So events are kept per step (a *slot*) and a step's transition
//! is emitted as soon as obs(t), action(t) and obs(t+1) are known, together with applied(t) once
//! the target's actions have had an `applied` (a target whose actions never had one — no
//! actuator, recommend-only tooling — waits for none; so the very first `applied` of a target
//! must come before the next `obs` to be joined).
//!
//! What is missing waits until the obs [`LATE_STEPS`] steps later (or [`Joiner::flush`]): then a
//! transition without its `applied` takes the action's `current`, the collector's view (which
//! during a rollout can mix the old pods' requests with the new replica count), and a step
//! without an `obs` or an `action` (incomplete metrics: nothing was decided) produces none.
//! Transitions are emitted as soon as they are complete, in whatever order; an episode's summary
//! once every step of it is settled, so it counts them all.
//!
//! For the recorder's resume point the join also keeps, per episode, the lowest stream sequence
//! of its events: [`Joiner::floor`] is the lowest one a replay must start from to rebuild every
//! step still open and the summary of the oldest episode not yet closed.

use std::collections::BTreeMap;

use aware_bus_schemas::{Action, Applied, DecisionSource, Episode, Obs, Schema, Stage, Target};

use aware_mdp::Prices;
use aware_stores::trajectory::Transition;

/// How many steps a step's missing parts are waited for: step t is settled when obs(t +
/// `LATE_STEPS`) has arrived. A collector on a wall clock does not wait for the decisions, so
/// this is the lag behind it that the recommender and the actuator may have (8 steps: 80 s at
/// 10 s steps; a loaded machine running 100 ms steps lags by more than 2). The cost: a step that
/// never gets an action (incomplete metrics) holds its episode's summary and the resume floor
/// back as long; the transitions after it are stored at once.
pub const LATE_STEPS: u64 = 8;

/// Events this many steps before the newest `obs` mean the target's steps started over (its
/// collector restarted and numbers them again): the join starts over with them.
const RESTART_STEPS: u64 = 16;

/// Events this many steps past the newest `obs` are not kept (nothing publishes so far ahead).
const AHEAD_STEPS: u64 = 16;

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

/// What has arrived of one step.
#[derive(Debug, Default, Clone)]
struct Slot {
    obs: Option<Obs>,
    action: Option<Action>,
    applied: Option<Applied>,
    /// Its transition was emitted; the slot stays for its `obs`, the next state of the step
    /// before it, until the steps before it are settled.
    emitted: bool,
}

/// The join state of one target.
#[derive(Debug, Clone)]
pub struct Joiner {
    target: Target,
    spe: u32,
    /// Steps not settled yet, by global step.
    slots: BTreeMap<u64, Slot>,
    /// Every step below this one is settled (its transition emitted, or none possible): its
    /// events are stale and ignored.
    settled_below: u64,
    /// The global step of the newest `obs`.
    newest_obs: Option<u64>,
    /// [`LATE_STEPS`], or what [`Joiner::with_late_steps`] set.
    late_steps: u64,
    /// Whether an `applied` has been seen for this target: only then is one waited for.
    expects_applied: bool,
    episodes: BTreeMap<u64, EpisodeAcc>,
    /// The lowest stream sequence of each episode's events, for [`Joiner::floor`].
    firsts: BTreeMap<u64, u64>,
}

/// What one event produced, in order: the transitions it settled and the summaries of the
/// episodes they completed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Joined {
    pub transitions: Vec<Transition>,
    pub episodes: Vec<Episode>,
}

impl Joiner {
    pub fn new(target: Target, steps_per_episode: u32) -> Self {
        Joiner {
            target,
            spe: steps_per_episode.max(1),
            slots: BTreeMap::new(),
            settled_below: 0,
            newest_obs: None,
            late_steps: LATE_STEPS,
            expects_applied: false,
            episodes: BTreeMap::new(),
            firsts: BTreeMap::new(),
        }
    }

    /// The same join waiting `n` steps (at least 2) instead of [`LATE_STEPS`].
    pub fn with_late_steps(mut self, n: u64) -> Self {
        self.late_steps = n.max(2);
        self
    }

    /// Whether a step before the newest `obs` is still open (waits for a late part).
    pub fn has_pending(&self) -> bool {
        let newest = self.newest_obs.unwrap_or(0);
        self.slots.keys().next().is_some_and(|&g| g < newest)
    }

    /// The lowest stream sequence a replay must start from to rebuild what is still open: every
    /// event of the oldest episode with an open step (its summary is folded from all its
    /// steps) and of every later one. None before any sequenced event (or after
    /// [`Joiner::release_floor`]).
    pub fn floor(&self) -> Option<u64> {
        let oldest = self.slots.keys().next().map(|&g| g / u64::from(self.spe));
        self.firsts
            .range(oldest.unwrap_or(0)..)
            .map(|(_, &seq)| seq)
            .min()
    }

    /// Forgets the sequences seen: the next sequenced event sets a new floor (the recorder
    /// released this target's hold on the resume point).
    pub fn release_floor(&mut self) {
        self.firsts.clear();
    }

    /// Settles every step before the newest `obs` (the target retires, or its observations
    /// stopped): what is complete but for its `applied` is emitted with the action's
    /// `current`, the rest dropped. The newest `obs` stays, to join with the next one.
    pub fn flush(&mut self) -> Joined {
        let upto = self.newest_obs.unwrap_or(0);
        self.settle(Some(upto))
    }

    /// An action for step (a.episode, a.step), with its stream sequence if any.
    pub fn on_action(&mut self, a: Action, seq: Option<u64>) -> Joined {
        let g = global(a.episode, a.step, self.spe);
        if let Some(slot) = self.slot(g, seq) {
            slot.action = Some(a);
        }
        self.settle(None)
    }

    /// An applied decision, with its stream sequence if any.
    pub fn on_applied(&mut self, a: Applied, seq: Option<u64>) -> Joined {
        self.expects_applied = true;
        let g = global(a.episode, a.step, self.spe);
        if let Some(slot) = self.slot(g, seq) {
            slot.applied = Some(a);
        }
        self.settle(None)
    }

    /// An obs, with its stream sequence if any: closes the step before it when that step's
    /// action is known, and settles the steps it makes too old to wait for.
    pub fn on_obs(&mut self, o: Obs, seq: Option<u64>) -> Joined {
        let g = global(o.episode, o.step, self.spe);
        if self
            .newest_obs
            .is_some_and(|n| g.saturating_add(RESTART_STEPS) < n)
        {
            // The target's steps start over: nothing open can be joined with what follows.
            tracing::debug!(target = %self.target, episode = o.episode, step = o.step, "steps started over: the join starts over");
            self.slots.clear();
            self.episodes.clear();
            self.firsts.clear();
            self.settled_below = 0;
            self.newest_obs = None;
        }
        if self.newest_obs.is_none_or(|n| g > n) {
            // What it makes too old to wait for is settled below, in step order.
            self.newest_obs = Some(g);
            self.slots
                .retain(|&k, _| k <= g.saturating_add(AHEAD_STEPS));
        }
        if let Some(slot) = self.slot(g, seq) {
            slot.obs = Some(o);
        }
        self.settle(None)
    }

    /// The slot of global step `g`, unless the step is settled or too far ahead; records the
    /// event's sequence for the floor.
    fn slot(&mut self, g: u64, seq: Option<u64>) -> Option<&mut Slot> {
        if g < self.settled_below
            || self
                .newest_obs
                .is_some_and(|n| g > n.saturating_add(AHEAD_STEPS))
        {
            return None;
        }
        if let Some(seq) = seq {
            let first = self.firsts.entry(g / u64::from(self.spe)).or_insert(seq);
            *first = (*first).min(seq);
        }
        Some(self.slots.entry(g).or_default())
    }

    /// Emits every transition that is ready, in whatever order, and settles the open steps from
    /// the oldest while each can be: emitted, or missing a part that is no longer waited for
    /// (`force_below`: steps below it are settled whatever is missing). An episode's summary is
    /// emitted once its last step is settled, so it counts every step emitted.
    fn settle(&mut self, force_below: Option<u64>) -> Joined {
        let mut out = Joined::default();
        self.settle_front(force_below, &mut out);
        let ready: Vec<u64> = self
            .slots
            .iter()
            .filter(|(&g, slot)| {
                !slot.emitted
                    && slot.obs.is_some()
                    && slot.action.is_some()
                    && (slot.applied.is_some() || !self.expects_applied)
                    && self.next_reward(g).is_some()
            })
            .map(|(&g, _)| g)
            .collect();
        for g in ready {
            self.emit(g, &mut out);
        }
        self.settle_front(force_below, &mut out);
        let oldest =
            self.slots.keys().next().map_or(self.settled_below, |&g| g) / u64::from(self.spe);
        self.firsts.retain(|&e, _| e >= oldest);
        out
    }

    /// The finite reward obs(g + 1) carries, if it has come.
    fn next_reward(&self, g: u64) -> Option<f64> {
        self.slots
            .get(&(g + 1))
            .and_then(|s| s.obs.as_ref())
            .and_then(|o| o.reward)
            .filter(|r| r.is_finite())
    }

    /// Settles the open steps from the oldest while each can be (see [`Joiner::settle`]).
    fn settle_front(&mut self, force_below: Option<u64>, out: &mut Joined) {
        while let Some((&g, slot)) = self.slots.first_key_value() {
            let has_next = self.slots.get(&(g + 1)).is_some_and(|s| s.obs.is_some());
            // No transition without a finite reward for the step.
            let hopeless = has_next && self.next_reward(g).is_none();
            let forced = force_below.is_some_and(|f| g < f)
                || self
                    .newest_obs
                    .is_some_and(|n| n >= g.saturating_add(self.late_steps));
            if !(slot.emitted || hopeless || forced) {
                break;
            }
            if !slot.emitted && !hopeless && slot.obs.is_some() && slot.action.is_some() && has_next
            {
                // Complete but for its `applied`: the action's `current` stands in.
                self.emit(g, out);
            }
            self.slots.remove(&g);
            self.settled_below = self.settled_below.max(g + 1);
            if (g + 1) % u64::from(self.spe) == 0 {
                out.episodes.extend(self.close(g / u64::from(self.spe)));
            }
        }
    }

    /// Emits the transition of step `g` (its obs, action and next obs known) and folds it into
    /// its episode; the slot stays, marked, for the step before it.
    fn emit(&mut self, g: u64, out: &mut Joined) {
        let Some(next) = self.slots.get(&(g + 1)).and_then(|s| s.obs.as_ref()) else {
            return;
        };
        let reward = self.next_reward(g).unwrap_or_default();
        let (next_state, slo_violation, cpu_util, memory_util, ts_ms) = (
            next.state.clone(),
            next.slo_violation,
            next.metrics.cpu_util,
            next.metrics.memory_util,
            next.ts_ms,
        );
        let Some(slot) = self.slots.get_mut(&g) else {
            return;
        };
        let (Some(prev), Some(action)) = (slot.obs.as_ref(), slot.action.take()) else {
            return;
        };
        slot.emitted = true;
        let t = Transition {
            target: self.target.clone(),
            episode: prev.episode,
            step: prev.step,
            ts_ms: prev.ts_ms,
            state: prev.state.clone(),
            action_raw: action.raw,
            desired: action.desired,
            applied: slot.applied.take().map_or(action.current, |a| a.applied),
            source: action.source,
            stage: action.stage,
            reward,
            next_state,
            slo_violation,
            cpu_util,
            memory_util,
        };
        self.fold(&t, action.exploration, ts_ms);
        out.transitions.push(t);
    }

    fn fold(&mut self, t: &Transition, exploring: bool, ts_ms: i64) {
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
        if acc.steps == 1 || t.step >= acc.last_step {
            acc.last_step = t.step;
            acc.last_ts_ms = ts_ms;
        }
    }

    /// Episode `episode`'s summary, once its last step is settled: none when that step had no
    /// transition (the episode is incomplete).
    fn close(&mut self, episode: u64) -> Option<Episode> {
        let acc = self.episodes.remove(&episode)?;
        // Older unfinished episodes (steps lost before a restart) will never complete.
        self.episodes.retain(|&e, _| e > episode);
        if acc.last_step + 1 < self.spe {
            return None;
        }
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
            episode,
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
        assert_eq!(j.on_obs(obs(0, 0, None, 0.1), None), Joined::default());
        let _ = j.on_action(action(0, 0, DecisionSource::Fallback), None);
        let _ = j.on_applied(applied(0, 0, 7), None);
        let out = j.on_obs(obs(0, 1, Some(1.5), 0.2), None);
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
        let mut j = Joiner::new(Target::new("shop", "checkout"), 100).with_late_steps(2);
        let _ = j.on_obs(obs(0, 0, None, 0.1), None);
        assert!(
            j.on_obs(obs(0, 1, Some(1.0), 0.2), None)
                .transitions
                .is_empty(),
            "no action"
        );
        let _ = j.on_action(action(0, 1, DecisionSource::Fallback), None);
        assert!(
            j.on_obs(obs(0, 3, Some(1.0), 0.2), None)
                .transitions
                .is_empty(),
            "gap"
        );
        // An action for an old step is ignored.
        let _ = j.on_action(action(0, 1, DecisionSource::Fallback), None);
        assert!(j
            .on_obs(obs(0, 4, Some(1.0), 0.2), None)
            .transitions
            .is_empty());
    }

    #[test]
    fn without_an_actuator_the_allocation_in_force_is_the_actions_current() {
        let mut j = Joiner::new(Target::new("shop", "checkout"), 100);
        let _ = j.on_obs(obs(0, 0, None, 0.1), None);
        let a = action(0, 0, DecisionSource::Fallback);
        let current = a.current;
        let _ = j.on_action(a, None);
        let out = j.on_obs(obs(0, 1, Some(1.0), 0.2), None);
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
        let mut j = Joiner::new(Target::new("shop", "checkout"), 3).with_late_steps(2);
        let _ = j.on_obs(obs(0, 0, None, 0.0), None);
        let _ = j.on_action(action(0, 0, DecisionSource::Fallback), None);
        assert_eq!(j.on_applied(applied(0, 0, 4), None).transitions.len(), 0);
        assert_eq!(
            j.on_obs(obs(0, 1, Some(1.0), 0.0), None).transitions.len(),
            1
        );
        // Step 1: the applied comes after obs(0, 2).
        let _ = j.on_action(action(0, 1, DecisionSource::Fallback), None);
        let out = j.on_obs(obs(0, 2, Some(2.0), 0.0), None);
        assert!(out.transitions.is_empty() && j.has_pending(), "{out:?}");
        let out = j.on_applied(applied(0, 1, 5), None);
        let [t] = &out.transitions[..] else {
            panic!("{out:?}")
        };
        assert_eq!((t.step, t.applied.replicas), (1, 5));
        assert!(!j.has_pending());
        // Step 2, the episode's last: no applied before obs(1, 0), nor before obs(1, 1). The
        // transition is stored then with the action's `current`, and closes the episode.
        let a = action(0, 2, DecisionSource::Rl);
        let current = a.current;
        let _ = j.on_action(a, None);
        assert!(j
            .on_obs(obs(1, 0, Some(3.0), 0.0), None)
            .transitions
            .is_empty());
        let _ = j.on_action(action(1, 0, DecisionSource::Rl), None);
        let _ = j.on_applied(applied(1, 0, 6), None);
        // An applied of another step does not complete it.
        assert!(j.on_applied(applied(0, 1, 9), None).transitions.is_empty());
        let out = j.on_obs(obs(1, 1, Some(4.0), 0.0), None);
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
        let _ = j.on_obs(obs(0, 0, None, 0.0), None);
        let _ = j.on_action(action(0, 0, DecisionSource::Fallback), None);
        let _ = j.on_applied(applied(0, 0, 4), None);
        let _ = j.on_obs(obs(0, 1, Some(1.0), 0.0), None);
        let _ = j.on_action(action(0, 1, DecisionSource::Fallback), None);
        assert!(j
            .on_obs(obs(0, 2, Some(1.0), 0.0), None)
            .transitions
            .is_empty());
        assert_eq!(j.flush().transitions.len(), 1);
        assert!(!j.has_pending() && j.flush().transitions.is_empty());
    }

    #[test]
    fn episode_summary_at_the_last_step() {
        let mut j = Joiner::new(Target::new("shop", "checkout"), 3);
        let _ = j.on_obs(obs(0, 0, None, 0.0), None);
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
            let _ = j.on_action(a, None);
            // 2, 4 and 6 replicas of 500 millicores and 1 GiB each, applied
            let mut ap = applied(0, i as u32, 2 * (i as u32 + 1));
            ap.applied.cpu_millicores = 500;
            ap.applied.memory_bytes = 1 << 30;
            let _ = j.on_applied(ap, None);
            let mut o = obs(e, s, Some(rewards[i]), 0.0);
            o.slo_violation = i == 1;
            let out = j.on_obs(o, None);
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

    /// One step's events, in the order they were published.
    fn step_events(t: u64, spe: u32) -> [Event; 3] {
        let (e, s) = (t / u64::from(spe), (t % u64::from(spe)) as u32);
        [
            Event::Obs(obs(e, s, (t > 0).then_some(t as f64), t as f32)),
            Event::Action(action(e, s, DecisionSource::Rl)),
            Event::Applied(applied(e, s, 10 + t as u32)),
        ]
    }

    fn feed(j: &mut Joiner, ev: Event, seq: Option<u64>) -> Joined {
        match ev {
            Event::Obs(o) => j.on_obs(o, seq),
            Event::Action(a) => j.on_action(a, seq),
            Event::Applied(a) => j.on_applied(a, seq),
            _ => unreachable!(),
        }
    }

    /// (episode, step, applied replicas, reward) of each transition.
    type Steps = Vec<(u64, u32, u32, f64)>;
    /// (episode, steps, total reward) of each episode closed.
    type Episodes = Vec<(u64, u32, f64)>;

    fn run(events: &[Event], spe: u32) -> (Steps, Episodes) {
        let mut j = Joiner::new(Target::new("shop", "checkout"), spe);
        let mut out = Joined::default();
        for ev in events {
            let o = feed(&mut j, ev.clone(), None);
            out.transitions.extend(o.transitions);
            out.episodes.extend(o.episodes);
        }
        let o = j.flush();
        out.transitions.extend(o.transitions);
        out.episodes.extend(o.episodes);
        // The store keys transitions by step: the order they come in does not matter.
        out.transitions.sort_by_key(|t| (t.episode, t.step));
        (
            out.transitions
                .iter()
                .map(|t| (t.episode, t.step, t.applied.replicas, t.reward))
                .collect(),
            out.episodes
                .iter()
                .map(|e| (e.episode, e.steps, e.total_reward))
                .collect(),
        )
    }

    /// Each of the six orders of one step's obs, action and applied, before the next obs: the
    /// same transition, with the actuator's `applied`.
    #[test]
    fn a_steps_three_events_join_in_any_order() {
        let orders = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        for order in orders {
            let mut events = Vec::new();
            for t in 0..4 {
                let evs = step_events(t, 100);
                events.extend(order.iter().map(|&i| evs[i].clone()));
            }
            let (transitions, _) = run(&events, 100);
            assert_eq!(
                transitions,
                vec![(0, 0, 10, 1.0), (0, 1, 11, 2.0), (0, 2, 12, 3.0)],
                "order {order:?}"
            );
        }
    }

    /// A step's action or applied stored after the next step's obs (a retried publish) still
    /// joins, as long as it comes before the obs `late_steps` later.
    #[test]
    fn an_action_or_applied_after_the_next_obs_still_joins() {
        let [o0, a0, p0] = step_events(0, 100);
        let [o1, a1, p1] = step_events(1, 100);
        let [o2, a2, p2] = step_events(2, 100);
        let [o3, ..] = step_events(3, 100);
        let events = [o0, o1, p0, a1, a0, o2, p1, a2, p2, o3];
        let (transitions, _) = run(&events, 100);
        assert_eq!(
            transitions,
            vec![(0, 0, 10, 1.0), (0, 1, 11, 2.0), (0, 2, 12, 3.0)]
        );
        // Later than that, the step is settled without it: no transition, and the steps after
        // it are not held back.
        let mut j = Joiner::new(Target::new("shop", "checkout"), 100).with_late_steps(2);
        let [o0, a0, _] = step_events(0, 100);
        let [o1, a1, _] = step_events(1, 100);
        let [o2, a2, _] = step_events(2, 100);
        let [o3, ..] = step_events(3, 100);
        let mut steps = Vec::new();
        for ev in [o0, o1, a1, o2, a2, o3, a0] {
            steps.extend(feed(&mut j, ev, None).transitions.iter().map(|t| t.step));
        }
        assert_eq!(steps, vec![1, 2]);
    }

    /// By default a step's action is waited for until the obs [`LATE_STEPS`] later: one that
    /// comes just before it joins; one after it does not. The steps after it do not wait.
    #[test]
    fn by_default_a_late_action_is_waited_for_late_steps() {
        for (late_by, joined) in [(LATE_STEPS - 1, true), (LATE_STEPS, false)] {
            let mut j = Joiner::new(Target::new("shop", "checkout"), 1000);
            let [o0, a0, p0] = step_events(0, 1000);
            let mut steps = Vec::new();
            for ev in [o0, p0] {
                steps.extend(feed(&mut j, ev, None).transitions.iter().map(|t| t.step));
            }
            for t in 1..=late_by {
                for ev in step_events(t, 1000) {
                    steps.extend(feed(&mut j, ev, None).transitions.iter().map(|t| t.step));
                }
            }
            let last = feed(&mut j, a0, None);
            // The later steps were stored as they completed, without waiting for step 0.
            assert_eq!(steps, (1..late_by as u32).collect::<Vec<_>>());
            assert_eq!(
                last.transitions.iter().map(|t| t.step).collect::<Vec<_>>(),
                if joined { vec![0] } else { vec![] },
                "action after obs({late_by})"
            );
        }
    }

    /// Many runs of two episodes whose events are each displaced by up to a step's worth of
    /// events (a fixed-seed shuffle): every run joins what the in-order run joins and closes the
    /// same episodes, with the same sums.
    #[test]
    fn displaced_events_join_as_in_order_ones() {
        let spe = 4;
        let steps = 9;
        let in_order: Vec<Event> = (0..steps).flat_map(|t| step_events(t, spe)).collect();
        let expected = run(&in_order, spe);
        assert_eq!(expected.0.len(), 8, "{expected:?}");
        assert_eq!(expected.1, vec![(0, 4, 10.0), (1, 4, 26.0)]);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..500 {
            let mut keyed: Vec<(u64, usize, Event)> = in_order
                .iter()
                .enumerate()
                .map(|(i, ev)| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    // Up to 3 positions later: before the obs two steps on (6 positions).
                    // The first `applied` comes in time: until one has come none is waited for.
                    let delay = if i == 2 { 0 } else { seed % 4 };
                    (i as u64 + delay, i, ev.clone())
                })
                .collect();
            keyed.sort_by_key(|(k, i, _)| (*k, *i));
            let events: Vec<Event> = keyed.into_iter().map(|(_, _, ev)| ev).collect();
            assert_eq!(run(&events, spe), expected);
        }
    }

    /// The floor is the lowest sequence of any event of the oldest episode with an open step,
    /// including an action stored before its obs; it moves on when that episode's last
    /// transition is emitted, not before.
    #[test]
    fn the_floor_covers_every_event_of_the_open_episode() {
        let mut j = Joiner::new(Target::new("shop", "checkout"), 2);
        assert_eq!(j.floor(), None);
        let [o0, a0, p0] = step_events(0, 2);
        let [o1, a1, p1] = step_events(1, 2);
        let [o2, a2, _] = step_events(2, 2);
        let [o3, ..] = step_events(3, 2);
        feed(&mut j, a0, Some(10));
        feed(&mut j, o0, Some(11));
        assert_eq!(j.floor(), Some(10), "the action came first");
        feed(&mut j, p0, Some(12));
        feed(&mut j, o1, Some(13));
        feed(&mut j, a1, Some(14));
        // obs(1, 0) before the last step's applied: episode 0 stays open.
        assert!(feed(&mut j, o2, Some(15)).transitions.is_empty());
        feed(&mut j, a2, Some(16));
        assert_eq!(j.floor(), Some(10));
        let out = feed(&mut j, p1, Some(17));
        assert_eq!(out.episodes.len(), 1);
        assert_eq!(j.floor(), Some(15), "episode 1's first event");
        feed(&mut j, o3, Some(18));
        assert_eq!(j.floor(), Some(15));
        j.release_floor();
        assert_eq!(j.floor(), None);
    }

    /// A collector that restarts and numbers its steps from 0 again: the join starts over and
    /// joins the new steps.
    #[test]
    fn steps_that_start_over_are_joined_again() {
        let spe = 5;
        let mut events: Vec<Event> = (40..44).flat_map(|t| step_events(t, spe)).collect();
        events.extend((0..3).flat_map(|t| step_events(t, spe)));
        let (transitions, _) = run(&events, spe);
        let steps: Vec<_> = transitions.iter().map(|t| (t.0, t.1)).collect();
        assert_eq!(steps, vec![(0, 0), (0, 1), (8, 0), (8, 1), (8, 2)]);
    }
}
