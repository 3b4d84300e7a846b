//! `aware bench cluster`: many apps on one shared cluster (ADR 0018) at a chosen request
//! occupancy, each policy on the same apps, traces and seeds:
//!
//! - `mean_field`: the same agents with `learning.mean_field` (SIMPPO's virtual agent, ADR
//!   0027): each state ends with the others' mean allocation change, the cluster's requested
//!   CPU and memory shares and Pending share, and the others' mean SLO preservation and CPU
//!   utilization;
//! - `independent`: today's agents, one per app, each seeing only its own app: the six
//!   services on the embedded bus, in lock-step with a simulator whose apps share the cluster,
//!   as `aware bench cost` runs `aware`;
//! - `isolated`: the same agents with every app alone on an unlimited cluster (SIMPPO's
//!   reference for degradation);
//! - `hpa_vpa_tuned`: the recommender's HPA/VPA with each app's HPA target tuned on a separate
//!   window of the shared cluster, as `aware bench cost` tunes it.
//!
//! Each app's HPA target is tuned on a separate window (the same apps under another simulator
//! seed) with the app alone, as a team runs it before consolidating; every agent's fallback
//! runs with it too. The cluster has identical nodes, as many as put the tuned HPA/VPA's mean
//! requests over that window at `--occupancy` of the allocatable CPU (or memory, whichever
//! needs more nodes): the request occupancy of the cluster the team would size for it.
//!
//! Per policy and per app: SLO attainment, requested core-hours and GiB-hours, replica-seconds
//! Pending, and the degradation of attainment against `isolated`.
//!
//! With `--join N` the last N apps join at `--join-episode` and with `--leave M` the first M
//! leave at `--leave-episode` (ADR 0028), the same for every policy; each app's figures count
//! its steps on the cluster, and the join report says how soon each newcomer settled.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use aware_loadgen::app::{AppSpec, Slo};
use aware_loadgen::env::{Presence, SimConfig};
use aware_loadgen::oracle::Prices;
use aware_metrics_collector::config::SimClusterConfig;
use serde::Serialize;

use crate::cost::{
    self, choose_target, class_of, default_hpa_targets, AwareFallback, AwareLearning, Baseline,
    CostBenchOptions, CostPolicy, Figures, ParetoPoint, SweepPoint,
};
use crate::BenchError;

/// The policies, as `--policies` and the report name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterPolicy {
    MeanField,
    Independent,
    Isolated,
    HpaVpaTuned,
}

impl ClusterPolicy {
    pub const ALL: [ClusterPolicy; 4] = [
        ClusterPolicy::MeanField,
        ClusterPolicy::Independent,
        ClusterPolicy::Isolated,
        ClusterPolicy::HpaVpaTuned,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ClusterPolicy::MeanField => "mean_field",
            ClusterPolicy::Independent => "independent",
            ClusterPolicy::Isolated => "isolated",
            ClusterPolicy::HpaVpaTuned => "hpa_vpa_tuned",
        }
    }
}

/// `--policies` values.
pub fn parse_policy(s: &str) -> Result<ClusterPolicy, String> {
    ClusterPolicy::ALL
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = ClusterPolicy::ALL.iter().map(|p| p.name()).collect();
            format!("unknown policy {s:?} (one of {})", names.join(", "))
        })
}

#[derive(Debug, Clone, clap::Args)]
pub struct ClusterBenchOptions {
    /// Generated apps.
    #[arg(long, default_value_t = ClusterBenchOptions::default().apps)]
    pub apps: usize,
    /// Generator seed of the apps and simulator seed of the evaluation window (the tuning
    /// window: seed + 1).
    #[arg(long, default_value_t = ClusterBenchOptions::default().seed)]
    pub seed: u64,
    /// The tuned HPA/VPA's mean requests (on the tuning window, each app alone) over the
    /// cluster's allocatable CPU, or memory if that needs more nodes, in (0, 1]: sets the
    /// number of nodes.
    #[arg(long, default_value_t = ClusterBenchOptions::default().occupancy)]
    pub occupancy: f64,
    /// Allocatable CPU per node, millicores.
    #[arg(long, default_value_t = ClusterBenchOptions::default().node_cpu_millicores)]
    pub node_cpu_millicores: u64,
    /// Allocatable memory per node, GiB.
    #[arg(long, default_value_t = ClusterBenchOptions::default().node_memory_gib)]
    pub node_memory_gib: u64,
    /// What a replica without a CPU limit (an app with a latency SLO, by default) may use above
    /// its request, as a share of it: on the shared cluster it comes from its node's unrequested
    /// CPU, alone it is always there. 0: nothing beyond the request.
    #[arg(long, default_value_t = ClusterBenchOptions::default().burst_headroom)]
    pub burst_headroom: f64,
    /// Lend requested but idle CPU to the bursting replicas too, as CFS does (default: only
    /// the node's unrequested CPU).
    #[arg(long)]
    pub lend_idle: bool,
    /// The evaluation window: episodes per app.
    #[arg(long, default_value_t = ClusterBenchOptions::default().episodes)]
    pub episodes: u32,
    /// The last N apps join the cluster at `--join-episode` (created with their initial
    /// allocation, new to every policy); the cluster is sized with them.
    #[arg(long, default_value_t = 0)]
    pub join: usize,
    /// The episode of the window at which the `--join` apps join.
    #[arg(long, default_value_t = 0)]
    pub join_episode: u32,
    /// The first N apps leave the cluster at `--leave-episode` (every replica deleted).
    #[arg(long, default_value_t = 0)]
    pub leave: usize,
    /// The episode of the window at which the `--leave` apps leave.
    #[arg(long, default_value_t = 0)]
    pub leave_episode: u32,
    #[arg(long, default_value_t = ClusterBenchOptions::default().steps_per_episode)]
    pub steps_per_episode: u32,
    /// The SLO objective: the share of control intervals that must meet the SLO.
    #[arg(long, default_value_t = ClusterBenchOptions::default().objective)]
    pub objective: f64,
    /// HPA targets (% CPU) of the tuning sweep.
    #[arg(long, value_delimiter = ',', default_values_t = default_hpa_targets())]
    pub hpa_targets: Vec<u32>,
    /// The policies to run, comma-separated (default: all): mean_field, independent,
    /// isolated, hpa_vpa_tuned.
    #[arg(long, value_delimiter = ',', value_parser = parse_policy)]
    pub policies: Vec<ClusterPolicy>,
    /// An `aware train-meta` output the agents bootstrap from (trainer.meta_dir), as `aware
    /// demo --meta` does; without it, the plain base-learner.
    #[arg(long)]
    pub meta: Option<PathBuf>,
    /// Wall-clock pause after every simulated step of an agents' policy, ms (default: 1 per
    /// app, at least 20: the trainer gets the same wall time per app-step at every size).
    #[arg(long)]
    pub pace_ms: Option<u64>,
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = aware_harness::parse_setting, help = "A setting of the agents' services other than its default, SECTION.KEY=VALUE with a JSON value (repeatable)")]
    pub settings: Vec<(String, serde_json::Value)>,
    /// Output directory: cluster.json, cluster-pareto.svg, the agents' stores under
    /// cost-work/.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Each agents' policy's wall-clock limit.
    #[arg(skip = ClusterBenchOptions::default().timeout)]
    pub timeout: Duration,
}

impl Default for ClusterBenchOptions {
    fn default() -> Self {
        ClusterBenchOptions {
            apps: 20,
            seed: 4242,
            occupancy: 0.85,
            node_cpu_millicores: 8000,
            node_memory_gib: 32,
            burst_headroom: 0.0,
            lend_idle: false,
            episodes: 12,
            join: 0,
            join_episode: 0,
            leave: 0,
            leave_episode: 0,
            steps_per_episode: 50,
            objective: 0.99,
            hpa_targets: default_hpa_targets(),
            policies: Vec::new(),
            meta: None,
            pace_ms: None,
            settings: Vec::new(),
            out: PathBuf::from("bench-out"),
            timeout: Duration::from_secs(3600),
        }
    }
}

impl ClusterBenchOptions {
    /// The policies to run, in the report's order.
    pub fn selected(&self) -> Vec<ClusterPolicy> {
        if self.policies.is_empty() {
            return ClusterPolicy::ALL.to_vec();
        }
        let mut v = self.policies.clone();
        v.sort();
        v.dedup();
        v
    }

    /// `--pace-ms`, else 1 ms per app and at least 20.
    pub fn pace(&self) -> u64 {
        self.pace_ms.unwrap_or((self.apps as u64).max(20))
    }

    /// The apps that join or leave (`--join`, `--leave`) among `apps`, in their order.
    pub fn presence(&self, apps: &[AppSpec]) -> Vec<Presence> {
        let spe = u64::from(self.steps_per_episode);
        let n = apps.len();
        apps.iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let joins = self.join > 0 && i >= n.saturating_sub(self.join);
                let leaves = i < self.leave;
                (joins || leaves).then(|| Presence {
                    target: a.name.clone(),
                    join_step: if joins {
                        u64::from(self.join_episode) * spe
                    } else {
                        0
                    },
                    leave_step: leaves.then(|| u64::from(self.leave_episode) * spe),
                })
            })
            .collect()
    }

    /// `aware bench cost`'s options for the same apps, window and agents, on `cluster`.
    fn cost_options(&self, cluster: Option<SimClusterConfig>) -> CostBenchOptions {
        CostBenchOptions {
            apps: Some(self.apps),
            seed: self.seed,
            episodes: self.episodes,
            steps_per_episode: self.steps_per_episode,
            objective: self.objective,
            hpa_targets: self.hpa_targets.clone(),
            meta: self.meta.clone(),
            pace_ms: self.pace(),
            aware_fallback: AwareFallback::Tuned,
            settings: self.settings.clone(),
            out: self.out.clone(),
            timeout: self.timeout,
            cluster,
            burst_headroom: self.burst_headroom,
            ..CostBenchOptions::default()
        }
    }

    /// This benchmark's own flags, then the rest as `aware bench cost` checks them (apps,
    /// window, objective, HPA targets, and `--meta` when agents run).
    fn check(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::Failed(m));
        if !(self.occupancy.is_finite() && self.occupancy > 0.0 && self.occupancy <= 1.0) {
            return bad(format!("--occupancy {} must be in (0, 1]", self.occupancy));
        }
        if !(self.burst_headroom.is_finite() && self.burst_headroom >= 0.0) {
            return bad(format!(
                "--burst-headroom {} must be a finite share of at least 0",
                self.burst_headroom
            ));
        }
        if self.node_cpu_millicores == 0 || self.node_memory_gib == 0 {
            return bad("--node-cpu-millicores and --node-memory-gib must be at least 1".into());
        }
        if self.join + self.leave > self.apps {
            return bad(format!(
                "--join {} and --leave {} name more than the {} --apps",
                self.join, self.leave, self.apps
            ));
        }
        if self.join > 0 && !(1..self.episodes).contains(&self.join_episode) {
            return bad(format!(
                "--join-episode {} must be within the window, from 1 to {}",
                self.join_episode,
                self.episodes.saturating_sub(1)
            ));
        }
        if self.leave > 0 && !(1..self.episodes).contains(&self.leave_episode) {
            return bad(format!(
                "--leave-episode {} must be within the window, from 1 to {}",
                self.leave_episode,
                self.episodes.saturating_sub(1)
            ));
        }
        let agents = self
            .selected()
            .iter()
            .any(|p| *p != ClusterPolicy::HpaVpaTuned);
        let mut cost = self.cost_options(None);
        cost.policies = if agents {
            vec![CostPolicy::HpaVpaTuned, CostPolicy::Aware]
        } else {
            vec![CostPolicy::HpaVpaTuned]
        };
        cost.check()
    }
}

/// The cluster a run shares: identical nodes, as many as put `cores` and `gib` of requests at
/// `occupancy` of the allocatable CPU or memory, whichever needs more.
pub fn size_cluster(
    cores: f64,
    gib: f64,
    occupancy: f64,
    node_cpu_millicores: u64,
    node_memory_bytes: u64,
    lend_idle: bool,
) -> SimClusterConfig {
    let need = |requested: f64, per_node: f64| (requested / occupancy / per_node).ceil() as u32;
    SimClusterConfig {
        nodes: need(cores, node_cpu_millicores as f64 / 1000.0)
            .max(need(gib, node_memory_bytes as f64 / f64::from(1u32 << 30)))
            .max(1),
        node_cpu_millicores,
        node_memory_bytes,
        lend_idle,
    }
}

/// A policy over all apps.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterPolicyReport {
    #[serde(flatten)]
    pub figures: Figures,
    pub apps_with_slo: usize,
    pub apps_meeting_objective: usize,
    /// `1 − slo_attainment ÷ isolated's slo_attainment` (none without `isolated` or an SLO).
    pub degradation_vs_isolated: Option<f64>,
    /// Requested cores (Pending replicas and a rolling restart's surge included) over the
    /// cluster's allocatable CPU, mean over the window; memory likewise.
    pub cpu_request_share: f64,
    pub memory_request_share: f64,
    /// CPU used (a burst above the requests included) over the cluster's allocatable CPU,
    /// mean over the window: above 1 for `isolated`, the apps alone used more CPU than the
    /// shared cluster has, and no policy on it can give every app what it had alone.
    pub cpu_used_share: f64,
    pub wall_seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learning: Option<AwareLearning>,
}

/// One app.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterAppReport {
    /// `namespace/name`.
    pub name: String,
    pub class: String,
    pub slo: Slo,
    /// The HPA target (% CPU) tuned on the tuning window with the app alone: hpa_vpa_tuned's,
    /// and every agent's fallback's.
    pub hpa_target_tuned: Option<u32>,
    pub policies: BTreeMap<String, Figures>,
    /// Per policy: `1 − attainment ÷ isolated's` for this app (none without an SLO, `isolated`,
    /// or when isolated met it on no step).
    pub degradation_vs_isolated: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    pub seed: u64,
    pub tuning_seed: u64,
    pub apps_count: usize,
    pub steps: u64,
    pub step_seconds: f64,
    pub objective: f64,
    pub occupancy: f64,
    pub cluster: SimClusterConfig,
    pub burst_headroom: f64,
    /// The tuned HPA/VPA's mean requests on the tuning window (each app alone) over the
    /// cluster's allocatable: what sized it.
    pub sized_cpu_request_share: f64,
    pub sized_memory_request_share: f64,
    pub prices: Prices,
    pub policies: BTreeMap<String, ClusterPolicyReport>,
    pub apps: Vec<ClusterAppReport>,
    /// `--join`: how the apps that joined settled, per policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join: Option<JoinReport>,
    /// `--leave`: the apps that left, and the episode.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leave_episode: Option<u32>,
    pub plots: Vec<String>,
}

/// One app's episode of the window: its mean reward, and its steps meeting the SLO (steps off
/// the cluster not counted).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EpisodeStats {
    pub reward: Option<f64>,
    pub steps: u32,
    pub met: u32,
    /// Steps decided by the RL policy.
    pub rl: u32,
}

/// Per episode of `spe` steps, from an app's rows by window step.
pub(crate) fn episode_stats(rows: &[Option<cost::StepRow>], spe: u64) -> Vec<EpisodeStats> {
    rows.chunks(spe.max(1) as usize)
        .map(|ep| {
            let (mut sum, mut k) = (0.0, 0u32);
            let mut e = EpisodeStats::default();
            for r in ep.iter().flatten() {
                e.steps += 1;
                e.met += u32::from(r.met);
                e.rl += u32::from(r.rl);
                if let Some(x) = r.reward {
                    sum += x;
                    k += 1;
                }
            }
            e.reward = (k > 0).then(|| sum / f64::from(k));
            e
        })
        .collect()
}

/// Episodes of the settling test's trailing mean and of the plateau, and its tolerance.
pub const SETTLE_MEAN_EPISODES: usize = 3;
pub const PLATEAU_EPISODES: usize = 5;
pub const SETTLE_TOLERANCE: f64 = 0.05;

/// The mean reward of the last [`PLATEAU_EPISODES`] episodes.
pub fn plateau(rewards: &[f64]) -> Option<f64> {
    let tail = rewards.get(rewards.len().checked_sub(PLATEAU_EPISODES)?..)?;
    Some(tail.iter().sum::<f64>() / tail.len() as f64)
}

/// Episodes an app took to settle after it joined, given its mean reward per episode from the
/// join on: the first episode k (1-based) from which the mean of the last
/// [`SETTLE_MEAN_EPISODES`] episodes up to k stays within [`SETTLE_TOLERANCE`] of the
/// plateau (the mean of the last [`PLATEAU_EPISODES`]) until the end; one more than the
/// episodes when even the last ones are off it (not settled). `None` when the window after the
/// join is shorter than twice the plateau: too short to tell.
pub fn episodes_to_settle(rewards: &[f64]) -> Option<u32> {
    if rewards.len() < 2 * PLATEAU_EPISODES {
        return None;
    }
    let p = plateau(rewards)?;
    let tol = SETTLE_TOLERANCE * p.abs().max(1e-9);
    let trailing = |k: usize| {
        let from = (k + 1).saturating_sub(SETTLE_MEAN_EPISODES);
        let w = &rewards[from..=k];
        w.iter().sum::<f64>() / w.len() as f64
    };
    let mut settled = rewards.len();
    for k in (0..rewards.len()).rev() {
        if (trailing(k) - p).abs() > tol {
            break;
        }
        settled = k;
    }
    u32::try_from(settled + 1).ok()
}

/// How the apps that joined settled, and how the apps there throughout fared, under a policy.
#[derive(Debug, Clone, Serialize)]
pub struct JoinPolicyReport {
    /// Per app that joined (`JoinReport::apps` order): episodes after the join until its
    /// episode reward (`JoinReport::settled_on`) settled ([`episodes_to_settle`]; none: the
    /// window is too short, or this is the control).
    pub episodes_to_settle: Vec<Option<u32>>,
    pub median_episodes_to_settle: Option<f64>,
    pub max_episodes_to_settle: Option<u32>,
    /// Per app that joined: its plateau reward ([`plateau`]).
    pub plateau_reward: Vec<Option<f64>>,
    /// Per app that joined: the series settling is judged on, one value per episode from the
    /// join on (its learning curve).
    pub curves: Vec<Vec<f64>>,
    /// Mean over the apps that joined of `plateau ÷ isolated's plateau − 1` (SIMPPO's reward
    /// drop is its negative).
    pub plateau_vs_isolated: Option<f64>,
    /// The apps that joined: SLO attainment over their last [`PLATEAU_EPISODES`] episodes.
    pub joined_attainment_at_plateau: Option<f64>,
    /// The apps that joined: the share of their last [`PLATEAU_EPISODES`] episodes' steps the
    /// RL policy decided (0 for the HPA/VPA), and per app the first episode after the join with
    /// an RL decision (none: the fallback decided throughout).
    pub joined_rl_share_at_plateau: Option<f64>,
    pub episodes_to_first_rl: Vec<Option<u32>>,
    /// The apps there throughout: SLO attainment in the episodes before the join and from it on.
    pub incumbents_attainment_before: Option<f64>,
    pub incumbents_attainment_after: Option<f64>,
}

/// `--join`: the apps that joined mid-window, per policy.
#[derive(Debug, Clone, Serialize)]
pub struct JoinReport {
    pub apps: Vec<String>,
    pub join_episode: u32,
    pub episodes_after_join: u32,
    /// What settling is judged on: each episode's mean reward over `hpa_vpa_tuned`'s for the
    /// same app and episode (the control: a policy that does not learn, on the same load), or
    /// the reward itself when `hpa_vpa_tuned` did not run.
    pub settled_on: String,
    pub policies: BTreeMap<String, JoinPolicyReport>,
}

fn attainment(stats: &[&EpisodeStats]) -> Option<f64> {
    let steps: u32 = stats.iter().map(|e| e.steps).sum();
    let met: u32 = stats.iter().map(|e| e.met).sum();
    (steps > 0).then(|| f64::from(met) / f64::from(steps))
}

/// The join report from each policy's episodes per app; `joined` and `incumbents` are app
/// indices (the incumbents with an SLO only count for attainment).
fn join_report(
    episodes: &BTreeMap<String, Vec<Vec<EpisodeStats>>>,
    names: Vec<String>,
    joined: &[usize],
    incumbents: &[usize],
    join_episode: u32,
) -> JoinReport {
    let j = join_episode as usize;
    let after = |e: &[EpisodeStats]| -> Vec<f64> {
        e[j.min(e.len())..]
            .iter()
            .filter_map(|x| x.reward)
            .collect()
    };
    let control = episodes.get(ClusterPolicy::HpaVpaTuned.name());
    let iso: Vec<Option<f64>> = joined
        .iter()
        .map(|&i| {
            episodes
                .get(ClusterPolicy::Isolated.name())
                .and_then(|e| plateau(&after(&e[i])))
        })
        .collect();
    let policies = episodes
        .iter()
        .map(|(name, e)| {
            // Settled on the reward over the control's in the same episode, so that the load's
            // drift over the window (the same for both) is not taken for learning.
            let curves: Vec<Vec<f64>> = joined
                .iter()
                .map(|&i| match control {
                    Some(c) => e[i]
                        .iter()
                        .zip(&c[i])
                        .skip(j)
                        .filter_map(|(a, b)| Some(a.reward? / b.reward.filter(|r| *r > 0.0)?))
                        .collect(),
                    None => after(&e[i]),
                })
                .collect();
            let settle: Vec<Option<u32>> = curves
                .iter()
                .map(|c| {
                    (name != ClusterPolicy::HpaVpaTuned.name())
                        .then(|| episodes_to_settle(c))
                        .flatten()
                })
                .collect();
            let plateaus: Vec<Option<f64>> =
                joined.iter().map(|&i| plateau(&after(&e[i]))).collect();
            let drops: Vec<f64> = plateaus
                .iter()
                .zip(&iso)
                .filter_map(|(p, r)| Some(p.as_ref()? / r.filter(|r| r.abs() > 0.0)? - 1.0))
                .collect();
            let mut known: Vec<u32> = settle.iter().flatten().copied().collect();
            known.sort_unstable();
            let median = (!known.is_empty())
                .then(|| crate::median(&known.iter().map(|&k| f64::from(k)).collect::<Vec<_>>()));
            let tail: Vec<&EpisodeStats> = joined
                .iter()
                .flat_map(|&i| {
                    let n = e[i].len();
                    e[i][n.saturating_sub(PLATEAU_EPISODES)..].iter()
                })
                .collect();
            let inc = |before: bool| -> Option<f64> {
                let v: Vec<&EpisodeStats> = incumbents
                    .iter()
                    .flat_map(|&i| {
                        let (a, b) = e[i].split_at(j.min(e[i].len()));
                        if before {
                            a.iter()
                        } else {
                            b.iter()
                        }
                    })
                    .collect();
                attainment(&v)
            };
            let report = JoinPolicyReport {
                median_episodes_to_settle: median,
                max_episodes_to_settle: (known.len() == settle.len())
                    .then(|| known.last().copied())
                    .flatten(),
                episodes_to_settle: settle,
                plateau_reward: plateaus,
                curves,
                plateau_vs_isolated: (!drops.is_empty())
                    .then(|| drops.iter().sum::<f64>() / drops.len() as f64),
                joined_attainment_at_plateau: attainment(&tail),
                joined_rl_share_at_plateau: {
                    let steps: u32 = tail.iter().map(|e| e.steps).sum();
                    let rl: u32 = tail.iter().map(|e| e.rl).sum();
                    (steps > 0).then(|| f64::from(rl) / f64::from(steps))
                },
                episodes_to_first_rl: joined
                    .iter()
                    .map(|&i| {
                        let k = e[i].get(j..)?.iter().position(|x| x.rl > 0)?;
                        u32::try_from(k + 1).ok()
                    })
                    .collect(),
                incumbents_attainment_before: inc(true),
                incumbents_attainment_after: inc(false),
            };
            (name.clone(), report)
        })
        .collect();
    let episodes_after_join = episodes
        .values()
        .next()
        .and_then(|e| e.first())
        .map_or(0, |e| e.len().saturating_sub(j)) as u32;
    JoinReport {
        apps: names,
        join_episode,
        episodes_after_join,
        settled_on: if control.is_some() {
            "reward ÷ hpa_vpa_tuned's reward".to_string()
        } else {
            "reward".to_string()
        },
        policies,
    }
}

fn share(num: f64, den: f64) -> f64 {
    if den > 0.0 {
        num / den
    } else {
        0.0
    }
}

/// `1 − a ÷ reference`, when both exist and the reference is positive.
fn degradation(a: Option<f64>, reference: Option<f64>) -> Option<f64> {
    let (a, r) = (a?, reference?);
    (r > 0.0).then(|| 1.0 - a / r)
}

/// Runs the selected policies, writes `cluster.json` and `cluster-pareto.svg` into `opts.out`,
/// and returns the report.
pub fn run(opts: &ClusterBenchOptions) -> Result<ClusterReport, BenchError> {
    opts.check()?;
    let mut alone = opts.cost_options(None);
    let (apps, alone_sim) = cost::apps_and_sim(&alone)?;
    let presence = opts.presence(&apps);
    let steps = alone.steps();
    let prices = alone.prices();
    let n = apps.len();
    let hours = steps as f64 * alone_sim.step_seconds / 3600.0;
    // Each app's HPA target, tuned on the tuning window with the app alone.
    let tuning = SimConfig {
        seed: alone.tuning_seed(),
        ..alone_sim
    };
    let tuned: Vec<Option<SweepPoint>> =
        cost::sweep(&apps, &tuning, steps, &opts.hpa_targets, &prices)?
            .iter()
            .map(|pts| choose_target(pts, opts.objective))
            .collect();
    let targets: Vec<u32> = tuned
        .iter()
        .map(|c| c.map_or(70, |c| c.target_percent))
        .collect();
    // The tuned HPA/VPA's mean requests there size the cluster.
    let (tuned_cores, tuned_gib) = tuned.iter().flatten().fold((0.0, 0.0), |(c, g), p| {
        (c + p.core_hours / hours, g + p.gib_hours / hours)
    });
    let cluster = size_cluster(
        tuned_cores,
        tuned_gib,
        opts.occupancy,
        opts.node_cpu_millicores,
        opts.node_memory_gib << 30,
        opts.lend_idle,
    );
    alone.presence = presence.clone();
    let mut shared = opts.cost_options(Some(cluster));
    shared.presence = presence.clone();
    let mut mean_field = shared.clone();
    mean_field.settings.push((
        "learning.mean_field".to_string(),
        serde_json::Value::Bool(true),
    ));
    let (_, sim) = cost::apps_and_sim(&shared)?;
    let cores = f64::from(cluster.nodes) * cluster.node_cpu_millicores as f64 / 1000.0;
    let gib = f64::from(cluster.nodes) * cluster.node_memory_bytes as f64 / f64::from(1u32 << 30);
    let mut per_app: Vec<BTreeMap<String, Figures>> = vec![BTreeMap::new(); n];
    let mut policies: BTreeMap<String, ClusterPolicyReport> = BTreeMap::new();
    let mut episodes: BTreeMap<String, Vec<Vec<EpisodeStats>>> = BTreeMap::new();
    let spe = u64::from(opts.steps_per_episode.max(1));
    let apps_with_slo = apps.iter().filter(|a| cost::has_slo(&a.slo)).count();
    for p in opts.selected() {
        let started = Instant::now();
        let (rows, learning) = match p {
            ClusterPolicy::HpaVpaTuned => {
                let mut b = Baseline::fallbacks(&targets, false)?;
                (cost::simulate(&apps, &sim, steps, &mut b)?, None)
            }
            ClusterPolicy::MeanField | ClusterPolicy::Independent | ClusterPolicy::Isolated => {
                let o = match p {
                    ClusterPolicy::MeanField => &mean_field,
                    ClusterPolicy::Independent => &shared,
                    _ => &alone,
                };
                let (rows, learning) = cost::aware_rows(o, &apps, Some(&targets))?;
                (rows, Some(learning))
            }
        };
        episodes.insert(
            p.name().to_string(),
            rows.iter().map(|r| episode_stats(r, spe)).collect(),
        );
        let figs = cost::figures_of(&apps, &rows, sim.step_seconds, &prices);
        let total = Figures::sum(&figs, &prices);
        let report = ClusterPolicyReport {
            apps_with_slo,
            apps_meeting_objective: cost::apps_meeting(&figs, opts.objective),
            degradation_vs_isolated: None,
            cpu_request_share: share(total.core_hours, hours * cores),
            cpu_used_share: share(total.used_core_hours, hours * cores),
            memory_request_share: share(total.gib_hours, hours * gib),
            wall_seconds: started.elapsed().as_secs_f64(),
            learning,
            figures: total,
        };
        tracing::info!(
            policy = p.name(),
            slo_attainment = ?report.figures.slo_attainment,
            core_hours = report.figures.core_hours,
            pending_replica_seconds = report.figures.pending_replica_seconds,
            wall_s = report.wall_seconds,
            "policy done"
        );
        for (m, f) in per_app.iter_mut().zip(figs) {
            m.insert(p.name().to_string(), f);
        }
        policies.insert(p.name().to_string(), report);
    }
    let isolated = ClusterPolicy::Isolated.name();
    let reference = policies
        .get(isolated)
        .and_then(|r| r.figures.slo_attainment);
    for r in policies.values_mut() {
        r.degradation_vs_isolated = degradation(r.figures.slo_attainment, reference);
    }
    let app_reports: Vec<ClusterAppReport> = apps
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let own = per_app[i].get(isolated).and_then(|f| f.slo_attainment);
            ClusterAppReport {
                name: format!("{}/{}", a.namespace, a.name),
                class: class_of(a).to_string(),
                slo: a.slo,
                hpa_target_tuned: tuned[i].map(|c| c.target_percent),
                degradation_vs_isolated: per_app[i]
                    .iter()
                    .filter_map(|(p, f)| Some((p.clone(), degradation(f.slo_attainment, own)?)))
                    .collect(),
                policies: per_app[i].clone(),
            }
        })
        .collect();
    let name_of = |i: usize| format!("{}/{}", apps[i].namespace, apps[i].name);
    let joined: Vec<usize> = (n.saturating_sub(opts.join)..n).collect();
    let join = (opts.join > 0).then(|| {
        let incumbents: Vec<usize> = (opts.leave..n.saturating_sub(opts.join))
            .filter(|&i| cost::has_slo(&apps[i].slo))
            .collect();
        join_report(
            &episodes,
            joined.iter().map(|&i| name_of(i)).collect(),
            &joined,
            &incumbents,
            opts.join_episode,
        )
    });
    let mut report = ClusterReport {
        seed: opts.seed,
        tuning_seed: shared.tuning_seed(),
        apps_count: n,
        steps,
        step_seconds: sim.step_seconds,
        objective: opts.objective,
        occupancy: opts.occupancy,
        cluster,
        burst_headroom: opts.burst_headroom,
        sized_cpu_request_share: share(tuned_cores, cores),
        sized_memory_request_share: share(tuned_gib, gib),
        prices,
        policies,
        apps: app_reports,
        join,
        left: (0..opts.leave.min(n)).map(name_of).collect(),
        leave_episode: (opts.leave > 0).then_some(opts.leave_episode),
        plots: Vec::new(),
    };
    let name = "cluster-pareto.svg".to_string();
    let path = opts.out.join(&name);
    std::fs::create_dir_all(&opts.out)
        .and_then(|()| std::fs::write(&path, plot(&report)))
        .map_err(|source| BenchError::Io {
            path: path.display().to_string(),
            source,
        })?;
    report.plots.push(name);
    crate::write_json(&opts.out, "cluster.json", &serde_json::to_value(&report)?)?;
    Ok(report)
}

/// Each policy's cost per app-hour against its SLO attainment, over the apps with an SLO.
pub fn plot(r: &ClusterReport) -> String {
    let with_slo = r.apps.iter().filter(|a| cost::has_slo(&a.slo)).count();
    let app_hours = r.steps as f64 * r.step_seconds / 3600.0 * with_slo.max(1) as f64;
    let points: Vec<ParetoPoint> = r
        .policies
        .keys()
        .filter_map(|p| {
            let f = Figures::sum(
                r.apps
                    .iter()
                    .filter(|a| cost::has_slo(&a.slo))
                    .filter_map(|a| a.policies.get(p)),
                &r.prices,
            );
            Some(ParetoPoint {
                label: p.clone(),
                cost_per_app_hour: f.cost / app_hours,
                attainment: f.slo_attainment?,
            })
        })
        .collect();
    let title = format!(
        "{} apps on {} nodes (sized at {:.0}% of CPU), {} steps",
        r.apps_count,
        r.cluster.nodes,
        100.0 * r.sized_cpu_request_share,
        r.steps
    );
    cost::pareto_svg(&title, &points, &[], r.objective)
}

/// The report's lines for the terminal.
pub fn summary(r: &ClusterReport) -> Vec<String> {
    let mut out = vec![format!(
        "{} apps, seed {}, {} steps on {} nodes of {} cores / {} GiB, sized for the tuned HPA/VPA alone at {:.0}% of CPU and {:.0}% of memory",
        r.apps_count,
        r.seed,
        r.steps,
        r.cluster.nodes,
        r.cluster.node_cpu_millicores as f64 / 1000.0,
        r.cluster.node_memory_bytes >> 30,
        100.0 * r.sized_cpu_request_share,
        100.0 * r.sized_memory_request_share,
    )];
    if r.burst_headroom > 0.0 {
        out.push(format!(
            "replicas without a CPU limit may burst {:.0}% above their requests",
            100.0 * r.burst_headroom
        ));
    }
    if r.cluster.lend_idle {
        out.push("requested but idle CPU is lent to them (as CFS does)".to_string());
    }
    for (name, p) in &r.policies {
        let f = &p.figures;
        out.push(format!(
            "{name:<14} SLO {} ({}/{} apps at objective), degradation vs isolated {}, {:.1} core-h, {:.1} GiB-h, {:.0} pending replica-s, CPU requested {:.0}%, used {:.0}%",
            f.slo_attainment
                .map_or("-".to_string(), |a| format!("{:.2}%", 100.0 * a)),
            p.apps_meeting_objective,
            p.apps_with_slo,
            p.degradation_vs_isolated
                .map_or("-".to_string(), |d| format!("{:.1}%", 100.0 * d)),
            f.core_hours,
            f.gib_hours,
            f.pending_replica_seconds,
            100.0 * p.cpu_request_share,
            100.0 * p.cpu_used_share,
        ));
    }
    if !r.left.is_empty() {
        out.push(format!(
            "{} apps left at episode {}",
            r.left.len(),
            r.leave_episode.unwrap_or(0)
        ));
    }
    if let Some(j) = &r.join {
        out.push(format!(
            "{} apps joined at episode {} ({} episodes after): episodes to settle (median, max), plateau reward vs isolated, their attainment and RL-decided share at plateau; the others' attainment before → after",
            j.apps.len(),
            j.join_episode,
            j.episodes_after_join
        ));
        let pct = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x));
        for (name, p) in &j.policies {
            out.push(format!(
                "{name:<14} settle {} / {}, plateau {}, attainment {}, RL-decided {}; others {} → {}",
                p.median_episodes_to_settle
                    .map_or("-".to_string(), |m| format!("{m:.1}")),
                p.max_episodes_to_settle
                    .map_or("-".to_string(), |m| m.to_string()),
                p.plateau_vs_isolated
                    .map_or("-".to_string(), |d| format!("{:+.1}%", 100.0 * d)),
                pct(p.joined_attainment_at_plateau),
                pct(p.joined_rl_share_at_plateau),
                pct(p.incumbents_attainment_before),
                pct(p.incumbents_attainment_after),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_is_sized_by_the_resource_that_needs_more_nodes() {
        // 4 cores and 4 GiB requested; at 50%, 8 cores: two 4-core nodes (memory needs one)
        let c = size_cluster(4.0, 4.0, 0.5, 4000, 32 << 30, false);
        assert_eq!(c.nodes, 2);
        // memory-bound: 8 GiB at 50% on 2-GiB nodes
        let c = size_cluster(4.0, 4.0, 0.5, 64_000, 2 << 30, false);
        assert_eq!(c.nodes, 4);
        assert_eq!(
            size_cluster(4.0, 4.0, 1.0, 1_000_000, 1 << 40, false).nodes,
            1
        );
        assert_eq!(size_cluster(4.1, 0.0, 1.0, 4000, 1 << 30, false).nodes, 2);
    }

    #[test]
    fn policies_parse_by_name_and_default_to_all() {
        assert_eq!(parse_policy("isolated"), Ok(ClusterPolicy::Isolated));
        assert_eq!(parse_policy("mean_field"), Ok(ClusterPolicy::MeanField));
        assert!(parse_policy("simppo").is_err());
        assert_eq!(
            ClusterBenchOptions::default().selected(),
            ClusterPolicy::ALL.to_vec()
        );
        let o = ClusterBenchOptions {
            policies: vec![ClusterPolicy::HpaVpaTuned, ClusterPolicy::Independent],
            ..ClusterBenchOptions::default()
        };
        assert_eq!(
            o.selected(),
            [ClusterPolicy::Independent, ClusterPolicy::HpaVpaTuned]
        );
    }

    #[test]
    fn the_pace_grows_with_the_apps() {
        let o = |apps, pace_ms| ClusterBenchOptions {
            apps,
            pace_ms,
            ..ClusterBenchOptions::default()
        };
        assert_eq!(o(20, None).pace(), 20);
        assert_eq!(o(5, None).pace(), 20);
        assert_eq!(o(100, None).pace(), 100);
        assert_eq!(o(100, Some(3)).pace(), 3);
    }

    #[test]
    fn bad_options_are_refused_naming_the_flag() {
        // joins and leaves outside the window or naming more apps than run, too
        for (o, flag) in [
            (
                ClusterBenchOptions {
                    occupancy: 1.5,
                    ..ClusterBenchOptions::default()
                },
                "--occupancy",
            ),
            (
                ClusterBenchOptions {
                    burst_headroom: -1.0,
                    ..ClusterBenchOptions::default()
                },
                "--burst-headroom",
            ),
            (
                ClusterBenchOptions {
                    apps: 0,
                    ..ClusterBenchOptions::default()
                },
                "--apps",
            ),
            (
                ClusterBenchOptions {
                    hpa_targets: vec![120],
                    ..ClusterBenchOptions::default()
                },
                "--hpa-targets",
            ),
            (
                ClusterBenchOptions {
                    join: 15,
                    leave: 6,
                    join_episode: 2,
                    leave_episode: 2,
                    ..ClusterBenchOptions::default()
                },
                "--join 15 and --leave 6",
            ),
            (
                ClusterBenchOptions {
                    join: 2,
                    join_episode: 12,
                    ..ClusterBenchOptions::default()
                },
                "--join-episode",
            ),
            (
                ClusterBenchOptions {
                    join: 2,
                    ..ClusterBenchOptions::default()
                },
                "--join-episode",
            ),
            (
                ClusterBenchOptions {
                    leave: 1,
                    leave_episode: 0,
                    ..ClusterBenchOptions::default()
                },
                "--leave-episode",
            ),
        ] {
            let err = run(&o).unwrap_err().to_string();
            assert!(err.contains(flag), "{err}");
        }
    }

    /// A small run of every policy: the shared cluster is crowded enough that replicas wait
    /// Pending under the agents and the HPA, while the isolated agents never wait; the
    /// degradations follow from the attainments, and the report and plot are written.
    #[test]
    fn a_crowded_cluster_makes_replicas_wait_and_is_measured_against_isolated() {
        let dir = std::env::temp_dir().join(format!("aware-bench-cluster-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let opts = ClusterBenchOptions {
            apps: 3,
            seed: 12,
            occupancy: 1.0,
            episodes: 2,
            steps_per_episode: 10,
            hpa_targets: vec![20, 50, 90],
            pace_ms: Some(0),
            timeout: Duration::from_secs(120),
            out: dir.clone(),
            ..ClusterBenchOptions::default()
        };
        let r = run(&opts).unwrap();
        assert_eq!(r.policies.len(), 4);
        assert!(
            r.sized_cpu_request_share <= 1.0 && r.sized_memory_request_share <= 1.0,
            "{r:?}"
        );
        assert!(r.sized_cpu_request_share.max(r.sized_memory_request_share) > 0.5);
        let iso = &r.policies["isolated"];
        assert_eq!(iso.figures.pending_replica_seconds, 0.0);
        assert_eq!(iso.degradation_vs_isolated, Some(0.0));
        for name in ["mean_field", "independent", "hpa_vpa_tuned"] {
            let p = &r.policies[name];
            assert_eq!(p.figures.steps, 3 * 20, "{name}");
            let want = degradation(p.figures.slo_attainment, iso.figures.slo_attainment);
            assert_eq!(p.degradation_vs_isolated, want, "{name}");
        }
        // A cluster sized for the tuned HPA's mean: replicas wait, under the HPA and under the agents
        // (whose collector runs the shared cluster and reports Pending in each `obs`).
        for name in ["mean_field", "independent", "hpa_vpa_tuned"] {
            let p = &r.policies[name];
            assert!(p.figures.pending_replica_seconds > 0.0, "{name}: {p:?}");
        }
        // Only the mean_field agents' states carry the others.
        let width = |name: &str| r.policies[name].learning.as_ref().unwrap().state_width;
        assert_eq!(width("mean_field"), aware_mdp::state_width(true));
        assert_eq!(width("independent"), aware_mdp::STATE_DIM);
        for (name, p) in &r.policies {
            assert!(
                p.cpu_used_share > 0.0 && p.figures.used_core_hours > 0.0,
                "{name}"
            );
        }
        assert_eq!(summary(&r).len(), 5);
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("cluster.json")).unwrap()).unwrap();
        for p in ["mean_field", "independent", "isolated", "hpa_vpa_tuned"] {
            for k in [
                "slo_attainment",
                "core_hours",
                "gib_hours",
                "pending_replica_seconds",
                "degradation_vs_isolated",
            ] {
                assert!(json["policies"][p].get(k).is_some(), "{p}.{k}");
            }
        }
        assert_eq!(json["apps"].as_array().unwrap().len(), 3);
        let svg = std::fs::read_to_string(dir.join("cluster-pareto.svg")).unwrap();
        assert!(svg.contains("independent") && svg.contains("isolated"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_app_settles_when_its_trailing_reward_stays_near_its_plateau() {
        // too short to tell
        assert_eq!(episodes_to_settle(&[0.5; 9]), None);
        // not settled: the last three episodes are off the plateau of the last five
        let mut late = vec![1.0; 10];
        late[9] = 0.5;
        assert_eq!(episodes_to_settle(&late), Some(11));
        // flat from the start
        assert_eq!(episodes_to_settle(&[0.5; 10]), Some(1));
        // a ramp over 10 episodes, then flat at 1.0: the trailing mean of 3 is within 5% of 1.0
        // from the episode whose last three average ≥ 0.95
        let mut r: Vec<f64> = (0..10).map(|k| f64::from(k) / 10.0).collect();
        r.extend([1.0; 20]);
        // episodes 11, 12, 13 (1-based) are 1.0, 1.0, 1.0; episode 12's window is 0.9, 1, 1
        assert_eq!(episodes_to_settle(&r), Some(12));
        // a late dip (episode 21) outside the tolerance: the trailing means of episodes 21–23
        // include it
        let mut dip = vec![1.0; 30];
        dip[20] = 0.5;
        assert_eq!(episodes_to_settle(&dip), Some(24));
        assert_eq!(plateau(&[0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]), Some(1.0));
        assert_eq!(plateau(&[1.0; 4]), None);
    }

    #[test]
    fn the_last_apps_join_and_the_first_leave() {
        let apps = aware_loadgen::app::generate_apps(
            5,
            3,
            &aware_loadgen::app::GeneratorOptions::default(),
        );
        let o = ClusterBenchOptions {
            apps: 5,
            join: 2,
            join_episode: 3,
            leave: 1,
            leave_episode: 7,
            steps_per_episode: 10,
            ..ClusterBenchOptions::default()
        };
        let p = o.presence(&apps);
        assert_eq!(p.len(), 3);
        assert_eq!(
            (p[0].target.as_str(), p[0].join_step, p[0].leave_step),
            (apps[0].name.as_str(), 0, Some(70))
        );
        for (q, a) in p[1..].iter().zip(&apps[3..]) {
            assert_eq!(
                (q.target.as_str(), q.join_step, q.leave_step),
                (a.name.as_str(), 30, None)
            );
        }
        assert!(ClusterBenchOptions::default().presence(&apps).is_empty());
    }

    /// An app joining mid-window and one leaving, through the six services: each app's figures
    /// count only the steps it was on the cluster, the agents wait for no `obs` of an app off
    /// it, and the join is reported per policy.
    #[test]
    fn apps_joining_and_leaving_count_only_their_steps_on_the_cluster() {
        let dir = std::env::temp_dir().join(format!("aware-bench-join-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let opts = ClusterBenchOptions {
            apps: 3,
            seed: 12,
            occupancy: 1.0,
            episodes: 2,
            steps_per_episode: 10,
            join: 1,
            join_episode: 1,
            leave: 1,
            leave_episode: 1,
            hpa_targets: vec![20, 50, 90],
            policies: vec![ClusterPolicy::Independent, ClusterPolicy::HpaVpaTuned],
            pace_ms: Some(0),
            timeout: Duration::from_secs(120),
            out: dir.clone(),
            ..ClusterBenchOptions::default()
        };
        let r = run(&opts).unwrap();
        for p in ["independent", "hpa_vpa_tuned"] {
            let steps: Vec<u64> = r.apps.iter().map(|a| a.policies[p].steps).collect();
            assert_eq!(steps, [10, 20, 10], "{p}");
            assert_eq!(r.policies[p].figures.steps, 40, "{p}");
        }
        assert_eq!(r.left, [r.apps[0].name.clone()]);
        assert_eq!(r.leave_episode, Some(1));
        let j = r.join.as_ref().unwrap();
        assert_eq!(j.apps, [r.apps[2].name.clone()]);
        assert_eq!((j.join_episode, j.episodes_after_join), (1, 1));
        assert_eq!(j.policies.len(), 2);
        for p in j.policies.values() {
            // one episode after the join is too short to tell when it settled
            assert_eq!(p.episodes_to_settle, [None]);
            assert!(p.joined_attainment_at_plateau.is_some());
        }
        let hpa = &j.policies["hpa_vpa_tuned"];
        assert_eq!(hpa.joined_rl_share_at_plateau, Some(0.0));
        assert_eq!(hpa.episodes_to_first_rl, [None]);
        assert!(j.settled_on.contains("hpa_vpa_tuned"), "{}", j.settled_on);
        assert!(hpa.curves[0].iter().all(|x| (x - 1.0).abs() < 1e-12));
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("cluster.json")).unwrap()).unwrap();
        assert!(json["join"]["policies"]["independent"]
            .get("median_episodes_to_settle")
            .is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
