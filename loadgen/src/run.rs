//! `aware sim`: run an app set under a policy for N steps, writing per-step JSON lines and
//! returning a per-app summary with the oracle's bound.

use std::io::Write;
use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::app::{generate_apps, Allocation, AppSet, AppSpec, GeneratorOptions};
use crate::env::{Observation, SimConfig, SimEnv, TargetAction};
use crate::error::SimError;
use crate::oracle::{candidates_by_cost, cheapest_step, oracle_step, OracleGrid, Prices};

/// Where the apps come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AppSource {
    /// Generate `count` apps from `seed`.
    Generate {
        /// Number of apps.
        count: usize,
        /// Generator seed.
        seed: u64,
    },
    /// Read an app set (YAML, or JSON if the name ends in `.json`).
    File {
        /// Path.
        path: PathBuf,
    },
    /// Apps given directly.
    Inline {
        /// The apps.
        apps: Vec<AppSpec>,
    },
}

impl AppSource {
    /// Load the apps.
    pub fn load(&self) -> Result<Vec<AppSpec>, SimError> {
        match self {
            AppSource::Generate { count, seed } => {
                Ok(generate_apps(*count, *seed, &GeneratorOptions::default()))
            }
            AppSource::File { path } => Ok(AppSet::read(path)?.apps),
            AppSource::Inline { apps } => Ok(apps.clone()),
        }
    }
}

/// Which policy drives the targets.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PolicySpec {
    /// Keep each app's initial allocation.
    Hold,
    /// The same fixed allocation for every app (clamped to each app's bounds).
    Fixed {
        /// The allocation.
        allocation: Allocation,
    },
    /// Uniform random raw actions in [−1, 1]³.
    Random {
        /// Seed of the policy.
        seed: u64,
    },
    /// Kubernetes HPA rule on CPU utilization (replicas only):
    /// `desired = ceil(replicas · util / target)` with a ±10% tolerance.
    Hpa {
        /// Target CPU utilization in (0, 1].
        target_cpu_util: f64,
    },
    /// The greedy oracle (true load of each step known in advance).
    Oracle,
    /// The SLO-constrained oracle: per step, the cheapest allocation under `prices` that meets
    /// the SLO given the step's true load, or the closest the bounds allow
    /// ([`crate::oracle::cheapest_step`]).
    OracleCheapest {
        /// Prices of a core-hour and a GiB-hour.
        prices: Prices,
    },
}

/// Options of `aware sim`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSimOptions {
    /// Apps.
    pub apps: AppSource,
    /// Steps to run.
    pub steps: u64,
    /// Policy.
    pub policy: PolicySpec,
    /// Simulation config (seed, step length, scenario injections, action map).
    pub config: SimConfig,
    /// Also compute the oracle's per-step bound along the policy's trajectory (costs ~4000
    /// step evaluations per target-step).
    pub with_oracle: bool,
    /// Oracle grid.
    #[serde(skip, default)]
    pub oracle_grid: OracleGrid,
}

impl Default for RunSimOptions {
    fn default() -> Self {
        RunSimOptions {
            apps: AppSource::Generate { count: 4, seed: 0 },
            steps: 100,
            policy: PolicySpec::Hold,
            config: SimConfig::default(),
            with_oracle: false,
            oracle_grid: OracleGrid::default(),
        }
    }
}

/// One line of the per-step JSON-lines output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The observation (state, metrics, reward, allocation, clamp).
    #[serde(flatten)]
    pub observation: Observation,
    /// The oracle's reward for this step from the same state (when requested).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oracle_reward: Option<f64>,
    /// The oracle's allocation for this step (when requested).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oracle_allocation: Option<Allocation>,
}

/// Per-app summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppSummary {
    /// `namespace/name`.
    pub target: String,
    /// Σ reward.
    pub total_reward: f64,
    /// Mean reward per step.
    pub mean_reward: f64,
    /// Σ oracle bound (when requested).
    pub oracle_total_reward: Option<f64>,
    /// Steps with an SLO violation.
    pub slo_violations: u64,
    /// Mean CPU utilization.
    pub mean_cpu_util: f64,
    /// Mean memory utilization.
    pub mean_memory_util: f64,
    /// OOM kills.
    pub oom_kills: u64,
    /// Actions that were clamped.
    pub clamped_actions: u64,
}

/// Summary of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSimReport {
    /// Steps run.
    pub steps: u64,
    /// Policy used.
    pub policy: PolicySpec,
    /// Per app.
    pub apps: Vec<AppSummary>,
    /// The shared cluster's totals (`config.cluster`); absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterSummary>,
}

/// The shared cluster over a run ([`crate::nodes::ClusterOccupancy`] of every step).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ClusterSummary {
    /// Mean over the steps of the requested share of the schedulable nodes' allocatable CPU.
    pub mean_cpu_requested_share: f64,
    /// The same for memory.
    pub mean_memory_requested_share: f64,
    /// Most replicas Pending in one step.
    pub max_pending_replicas: u32,
    /// Pending replica-seconds of the run, cluster-wide.
    pub pending_replica_seconds: f64,
    /// Pending replica-seconds of the run per app (app order).
    pub pending_replica_seconds_by_target: Vec<f64>,
}

fn policy_actions(
    policy: &PolicySpec,
    env: &SimEnv,
    last: &[Observation],
    rng: &mut ChaCha8Rng,
    grid: &OracleGrid,
) -> Result<Vec<TargetAction>, SimError> {
    (0..env.len())
        .map(|i| {
            Ok(match policy {
                PolicySpec::Hold => TargetAction::Hold,
                PolicySpec::Fixed { allocation } => TargetAction::Desired(*allocation),
                PolicySpec::Random { .. } => TargetAction::Raw([
                    rng.random_range(-1.0..=1.0),
                    rng.random_range(-1.0..=1.0),
                    rng.random_range(-1.0..=1.0),
                ]),
                PolicySpec::Hpa { target_cpu_util } => {
                    let o = &last[i];
                    let mut a = o.allocation;
                    let target = target_cpu_util.clamp(0.01, 1.0);
                    let ratio = o.metrics.cpu_util / target;
                    // no metrics yet right after reset
                    if (ratio - 1.0).abs() > 0.1 && o.metrics.time_s > 0.0 {
                        a.replicas = ((a.replicas as f64 * ratio).ceil() as u32).max(1);
                    }
                    TargetAction::Desired(a)
                }
                PolicySpec::Oracle => {
                    let t = env.target_at_next_step(i)?;
                    TargetAction::Desired(oracle_step(&t, grid, &[]).allocation)
                }
                PolicySpec::OracleCheapest { prices } => {
                    let t = env.target_at_next_step(i)?;
                    let sorted = candidates_by_cost(&t.app().bounds, grid, prices);
                    TargetAction::Desired(cheapest_step(&t, &sorted, prices, &[]).allocation)
                }
            })
        })
        .collect()
}

/// Run `aware sim`: step the apps under the policy, write one JSON line per target per step to
/// `out` (pass `std::io::sink()` to skip), return per-app totals.
pub fn run_sim(opts: &RunSimOptions, out: &mut dyn Write) -> Result<RunSimReport, SimError> {
    let apps = opts.apps.load()?;
    let mut env = SimEnv::new(apps, opts.config.clone())?;
    let mut last = env.reset(opts.config.seed)?;
    let seed = match opts.policy {
        PolicySpec::Random { seed } => seed,
        _ => opts.config.seed,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = env.len();
    let mut sums = vec![
        AppSummary {
            target: String::new(),
            total_reward: 0.0,
            mean_reward: 0.0,
            oracle_total_reward: opts.with_oracle.then_some(0.0),
            slo_violations: 0,
            mean_cpu_util: 0.0,
            mean_memory_util: 0.0,
            oom_kills: 0,
            clamped_actions: 0,
        };
        n
    ];
    for (s, r) in sums.iter_mut().zip(env.target_refs()) {
        s.target = format!("{}/{}", r.namespace, r.name);
    }
    let mut cluster = env.cluster_occupancy().map(|_| ClusterSummary::default());
    for _ in 0..opts.steps {
        let actions = policy_actions(&opts.policy, &env, &last, &mut rng, &opts.oracle_grid)?;
        let oracle: Vec<Option<(f64, Allocation)>> = if opts.with_oracle {
            (0..n)
                .map(|i| {
                    let t = env.target_at_next_step(i)?;
                    let (own, _) = env.resolve_action(i, &actions[i])?;
                    let c = oracle_step(&t, &opts.oracle_grid, &[own]);
                    Ok(Some((c.reward, c.allocation)))
                })
                .collect::<Result<_, SimError>>()?
        } else {
            vec![None; n]
        };
        let obs = env.step(&actions)?;
        if let (Some(c), Some(o)) = (cluster.as_mut(), env.cluster_occupancy()) {
            c.mean_cpu_requested_share += o.cpu_requested_share;
            c.mean_memory_requested_share += o.memory_requested_share;
            c.max_pending_replicas = c.max_pending_replicas.max(o.pending_replicas);
            c.pending_replica_seconds = o.pending_replica_seconds;
            c.pending_replica_seconds_by_target = o.pending_replica_seconds_by_target.clone();
        }
        for ((o, s), orc) in obs.iter().zip(sums.iter_mut()).zip(oracle) {
            s.total_reward += o.reward;
            s.slo_violations += u64::from(o.metrics.slo_violation);
            s.mean_cpu_util += o.metrics.cpu_util;
            s.mean_memory_util += o.metrics.memory_util;
            s.oom_kills += u64::from(o.metrics.oom_kills);
            s.clamped_actions += u64::from(o.clamp.any());
            if let (Some(tot), Some((r, _))) = (s.oracle_total_reward.as_mut(), orc) {
                *tot += r;
            }
            let rec = StepRecord {
                observation: o.clone(),
                oracle_reward: orc.map(|x| x.0),
                oracle_allocation: orc.map(|x| x.1),
            };
            let line = serde_json::to_string(&rec).map_err(|source| SimError::Json {
                path: "<output>".into(),
                source,
            })?;
            writeln!(out, "{line}").map_err(|e| SimError::io("<output>", e))?;
        }
        last = obs;
    }
    let steps = opts.steps.max(1) as f64;
    for s in &mut sums {
        s.mean_reward = s.total_reward / steps;
        s.mean_cpu_util /= steps;
        s.mean_memory_util /= steps;
    }
    if let Some(c) = cluster.as_mut() {
        c.mean_cpu_requested_share /= steps;
        c.mean_memory_requested_share /= steps;
    }
    Ok(RunSimReport {
        steps: opts.steps,
        policy: opts.policy,
        apps: sums,
        cluster,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::MIB;

    #[test]
    fn run_writes_lines_and_oracle_bounds_policy() {
        let opts = RunSimOptions {
            apps: AppSource::Generate { count: 2, seed: 4 },
            steps: 6,
            policy: PolicySpec::Hpa {
                target_cpu_util: 0.6,
            },
            with_oracle: true,
            oracle_grid: OracleGrid {
                replica_step: 4,
                cpu_step_millicores: 512,
                memory_step_bytes: 1024 * MIB,
            },
            ..RunSimOptions::default()
        };
        let mut buf = Vec::new();
        let rep = run_sim(&opts, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert_eq!(text.lines().count(), 12);
        let rec: StepRecord = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(rec.observation.step, 0);
        for a in &rep.apps {
            assert!(
                a.oracle_total_reward.unwrap() >= a.total_reward - 1e-9,
                "{a:?}"
            );
        }
    }

    /// With a shared cluster the report has its totals, and the per-step lines the apps'
    /// Pending replicas; without one neither appears.
    #[test]
    fn a_run_on_a_shared_cluster_reports_its_occupancy() {
        let mut opts = RunSimOptions {
            apps: AppSource::Generate { count: 4, seed: 2 },
            steps: 10,
            policy: PolicySpec::Fixed {
                allocation: Allocation {
                    replicas: 6,
                    cpu_millicores: 1000,
                    memory_bytes: 512 * MIB,
                },
            },
            ..RunSimOptions::default()
        };
        let mut plain = Vec::new();
        let rep = run_sim(&opts, &mut plain).unwrap();
        assert!(rep.cluster.is_none());
        let text = String::from_utf8(plain).unwrap();
        assert!(!text.contains("pending_replicas"));
        assert!(!serde_json::to_string(&rep).unwrap().contains("cluster"));
        // 4 apps × 6 cores on 2 nodes of 8 cores: 8 replicas wait at every step
        opts.config.cluster = Some(crate::nodes::ClusterConfig::uniform(2, 8000, 64 << 30));
        let mut buf = Vec::new();
        let rep = run_sim(&opts, &mut buf).unwrap();
        let c = rep.cluster.unwrap();
        assert_eq!(c.max_pending_replicas, 8);
        assert!((c.mean_cpu_requested_share - 1.0).abs() < 1e-12, "{c:?}");
        assert!(
            (c.pending_replica_seconds - 8.0 * 10.0 * 10.0).abs() < 1e-9,
            "{c:?}"
        );
        let pending: u32 = String::from_utf8(buf)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<StepRecord>(l).unwrap())
            .filter(|r| r.observation.step == 9)
            .map(|r| r.observation.metrics.pending_replicas)
            .sum();
        assert_eq!(pending, 8);
    }

    #[test]
    fn policies_run_and_are_deterministic() {
        for policy in [
            PolicySpec::Hold,
            PolicySpec::Random { seed: 3 },
            PolicySpec::Fixed {
                allocation: Allocation {
                    replicas: 3,
                    cpu_millicores: 700,
                    memory_bytes: 900 * MIB,
                },
            },
        ] {
            let opts = RunSimOptions {
                steps: 20,
                policy,
                ..RunSimOptions::default()
            };
            let a = run_sim(&opts, &mut std::io::sink()).unwrap();
            let b = run_sim(&opts, &mut std::io::sink()).unwrap();
            assert_eq!(a, b);
            assert!(a.apps.iter().all(|s| s.total_reward > 0.0));
        }
    }
}
