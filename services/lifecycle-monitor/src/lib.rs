//! lifecycle-monitor: runs Algorithm 1 of the paper (bootstrapping and the retraining trigger)
//! for every target and publishes `lifecycle` on every change of stage.
//!
//! Rewards are the per-step means of episodes (`episode.mean_reward`), so the profile's
//! thresholds do not depend on the episode length. The decision window holds the rewards of the
//! last `window` episodes *of the current stage*; it is cleared on every transition and a decision
//! needs a full window:
//! - OFFLINE uses the trainer's off-policy estimate of the RL policy (`episode.policy_estimate`);
//!   episodes without an estimate do not count (there is no RL policy to judge yet);
//! - ONLINE and SERVING use the rewards of episodes that ran in that stage.

use std::collections::VecDeque;

use actix::{Actor, Context, Handler};
use aware_bus_schemas::{now_ms, Episode, Event, EventKind, Lifecycle, Schema, Stage, Target};
use aware_shared::agents::{run_actors, spawn_publisher, Deliver, Outbox, TargetActors};
use aware_shared::config::LifecycleProfile;
use aware_shared::launcher::ServiceEntry;
use aware_shared::service::{ServiceContext, ServiceError};

pub const NAME: &str = "lifecycle-monitor";
/// `obs` only registers targets: the first one starts the target's agent, which announces its
/// initial stage.
pub const CONSUMES: &[EventKind] = &[EventKind::Episode, EventKind::Obs];
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
};

/// A change of stage and what decided it.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub from: Stage,
    pub to: Stage,
    pub reason: String,
    pub mean: Option<f64>,
    pub std: Option<f64>,
    pub window: u32,
}

/// Algorithm 1 for one target.
#[derive(Debug, Clone)]
pub struct LifecycleMachine {
    profile: LifecycleProfile,
    stage: Stage,
    rewards: VecDeque<f64>,
    /// The newest episode taken into account: `episode` is delivered at least once, so a repeat
    /// (or an older episode) is ignored.
    last_episode: Option<u64>,
}

fn mean_std(xs: &VecDeque<f64>) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

impl LifecycleMachine {
    pub fn new(profile: LifecycleProfile) -> Self {
        LifecycleMachine {
            profile,
            stage: Stage::Initialized,
            rewards: VecDeque::new(),
            last_episode: None,
        }
    }

    pub fn stage(&self) -> Stage {
        self.stage
    }

    fn go(&mut self, to: Stage, reason: String, stats: Option<(f64, f64)>) -> Transition {
        let t = Transition {
            from: self.stage,
            to,
            reason,
            mean: stats.map(|s| s.0),
            std: stats.map(|s| s.1),
            window: u32::try_from(self.rewards.len()).unwrap_or(u32::MAX),
        };
        self.stage = to;
        self.rewards.clear();
        t
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
        let sample = match self.stage {
            Stage::Initialized => return self.start(),
            Stage::Offline => ep.policy_estimate,
            Stage::Online | Stage::Serving if ep.stage == self.stage => Some(ep.mean_reward),
            Stage::Online | Stage::Serving => None,
        };
        let r = sample.filter(|r| r.is_finite())?;
        self.rewards.push_back(r);
        while self.rewards.len() > self.profile.window {
            self.rewards.pop_front();
        }
        if self.rewards.len() < self.profile.window {
            return None;
        }
        let (mean, std) = mean_std(&self.rewards);
        let p = &self.profile;
        let stats = Some((mean, std));
        match self.stage {
            Stage::Offline if mean >= p.t_online => Some(self.go(
                Stage::Online,
                format!("estimated reward {mean:.3} >= t_online {}", p.t_online),
                stats,
            )),
            Stage::Online if mean >= p.t_serving && std <= p.t_var => Some(self.go(
                Stage::Serving,
                format!(
                    "reward mean {mean:.3} >= t_serving {} and std {std:.3} <= t_var {}",
                    p.t_serving, p.t_var
                ),
                stats,
            )),
            Stage::Serving if mean < p.t_serving || std > p.t_var => Some(self.go(
                Stage::Online,
                format!(
                    "retraining: reward mean {mean:.3} (t_serving {}) std {std:.3} (t_var {})",
                    p.t_serving, p.t_var
                ),
                stats,
            )),
            _ => None,
        }
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
    }
}

/// The actor of one target.
pub struct LifecycleAgent {
    target: Target,
    machine: LifecycleMachine,
    outbox: Outbox,
}

impl Actor for LifecycleAgent {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        if let Some(t) = self.machine.start() {
            tracing::info!(target = %self.target, stage = %t.to, "agent initialized");
            self.outbox.send(message(&self.target, 0, 0, t));
        }
    }
}

impl Handler<Deliver> for LifecycleAgent {
    type Result = ();

    fn handle(&mut self, Deliver(ev): Deliver, _: &mut Self::Context) {
        let Event::Episode(ep) = ev else { return };
        if let Some(t) = self.machine.observe(&ep) {
            tracing::info!(target = %self.target, from = %t.from, to = %t.to, reason = %t.reason, "lifecycle transition");
            self.outbox
                .send(message(&self.target, ep.episode, ep.step, t));
        }
    }
}

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let (outbox, publisher) = spawn_publisher(ctx.clone());
    let profile = ctx.config.lifecycle.clone();
    let mut actors = TargetActors::new(&ctx, move |t: &Target| LifecycleAgent {
        target: t.clone(),
        machine: LifecycleMachine::new(profile.clone()),
        outbox: outbox.clone(),
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
        let mut m = LifecycleMachine::new(profile(bootstrap));
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
        let mut m = LifecycleMachine::new(profile(true));
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
        let mut m = LifecycleMachine::new(profile(true));
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
}
