//! The `aware bench` command line: one subcommand per benchmark, each with its options
//! (the benchmark's options struct, flattened), and the summary it prints. Research knobs of
//! `bootstrap`, `serve` and `adapt` are accepted but hidden from `--help`; each command's help
//! names them.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::adapt::AdaptBenchOptions;
use crate::bootstrap::BootstrapBenchOptions;
use crate::bus::BusBenchOptions;
use crate::cluster::ClusterBenchOptions;
use crate::control_loop::LoopBenchOptions;
use crate::cost::CostBenchOptions;
use crate::embed::EmbedBenchOptions;
use crate::kube::KubeBenchOptions;
use crate::serve::ServeBenchOptions;
use crate::state::StateBenchOptions;
use crate::store::StoreBenchOptions;
use crate::trainer::TrainerBenchOptions;
use crate::BenchError;

/// `aware bench <name>`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Simulator throughput (target-steps/s, one core) and p99 latency heatmaps.
    Sim(SimArgs),
    /// The control loop end to end over NATS: target-steps/s, decision latency, memory per target.
    Loop(LoopArgs),
    /// Every per-target service in --shards shards, each a process, on one NATS: target-steps/s,
    /// obs→action p99, whether every obs was decided exactly once, resident memory per target
    /// over all processes, the trainers' CPU and time to a first model (--rl), store bytes per
    /// transition; writes scale.json.
    Scale(ScaleArgs),
    /// Offline bootstrapping (paper §5.4): fallback vs bootstrapped vs no-bootstrap RL over the
    /// early window on held-out generated apps; writes bootstrap.json.
    #[command(after_help = BOOTSTRAP_KNOBS)]
    Bootstrap(BootstrapArgs),
    /// What the SLO costs (requested core-hours and GiB-hours, SLO attainment, disruptions) under
    /// AWARE, HPA/VPA at a target tuned per app on a separate window, HPA/VPA at 70%, the VPA
    /// alone and the cheapest-allocation oracle, on the same apps and traces; writes cost.json
    /// and a Pareto plot per app class (cost-pareto-<class>.svg).
    Cost(CostBenchOptions),
    /// Many apps on one shared cluster at --occupancy of its requests: today's agents on it
    /// (independent), the same agents each alone on an empty cluster (isolated) and HPA/VPA
    /// tuned per app; SLO attainment, core- and GiB-hours, Pending replica-seconds and the
    /// degradation against isolated; writes cluster.json and cluster-pareto.svg.
    Cluster(ClusterBenchOptions),
    /// Serving under instability (paper §5.3, Fig. 9): a converged agent meets the §2.3
    /// scenarios with and without the retraining trigger, vs HPA/VPA, the converged policy on the
    /// undisturbed workload and the oracle; writes serve.json and serve-curve.svg.
    #[command(after_help = SERVE_KNOBS)]
    Serve(ServeBenchOptions),
    /// Workload embeddings (paper Fig. 6): apps of known resource classes and load patterns,
    /// their cosine similarities and a PCA projection; writes embed.json and embed-pca.svg.
    Embed(EmbedBenchOptions),
    /// Adaptation to new workloads (paper §5.2, Fig. 8): AWARE's meta-learned base-learner vs
    /// transfer learning (TL) and TL with forecast and resource-table features (TL+) on held-out
    /// apps; episodes and CPU-seconds to 95% of the converged reward, SLO violations; writes
    /// adapt.json and adapt-curve.svg.
    #[command(after_help = ADAPT_KNOBS)]
    Adapt(AdaptArgs),
    /// The trajectory store at the retention bound (`trajectory_store.keep_transitions`): append rate,
    /// the trainer's reads before and after a retention pass, the passes; writes store.json.
    /// With --compare: SQLite against a real QuestDB (write rate, top-M read, bytes per
    /// transition) at --sizes; writes store-compare.json.
    Store(StoreBenchOptions),
    /// Bus throughput and latency, in-process and over NATS on loopback.
    Bus(BusArgs),
    /// A restart's recovery of every target's current state (registrations, models, stages) on
    /// NATS after the telemetry overflowed the capture stream: targets recovered per kind and
    /// read time; writes state.json.
    State(StateArgs),
    /// The trainer's cost while its targets wait for data: CPU of a trainer process with
    /// --targets ONLINE targets and an empty store, reading the store at every look against
    /// reading it after events (the default); writes trainer.json. With --learning, while they
    /// learn from one transition per --interval-ms: cores, rounds, gaps between a target's
    /// models, time to a first model; writes trainer-learning.json.
    Trainer(TrainerBenchOptions),
    /// The controller and the actuator at scale on a real API server (etcd, kube-apiserver with
    /// its default priority and fairness, kwok): time until --targets AwareAutoscalers are
    /// registered, reconcile latency, API requests per target in steady state, controller
    /// memory, decision → API latency; writes kube.json.
    Kube(KubeBenchOptions),
}

const BOOTSTRAP_KNOBS: &str = "Research knobs (accepted, not listed above): --pace-ms, \
--train-every-transitions, --exploration-sigma, --bc-alpha, --probation-margin, \
--behaviour-margin, --recent-fraction, --rebaseline-after, --eval-every";
const SERVE_KNOBS: &str = "Research knobs (accepted, not listed above): --window, \
--gradient-steps, --retrain-gradient-steps, --retrain-recent-fraction, --retrain-recent, \
--retrain-sigma, --retrain-every, --rebaseline-after, --rebaseline-tolerance, \
--rebaseline-margin, --no-rollback, --reprobe-after, --serving-hysteresis, --retrain-shrink, \
--retrain-eval-every, --disturbed-reference, --servable-only, --servable-tolerance, \
--bus-pace-ms";
const ADAPT_KNOBS: &str = "Research knobs (accepted, not listed above): --gradient-steps, \
--fallback-episodes, --embedding-refresh, --fine-tune-sigma, --tl-fine-tune-sigma, \
--critic-warmup, --source-index, --source-max-episodes, --shared-kinds";

/// `aware bench sim` (the simulator's own benchmark, `aware_loadgen::bench`).
#[derive(Debug, Args)]
pub struct SimArgs {
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Timed runs (median reported).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Targets per run.
    #[arg(long, default_value_t = 64)]
    pub targets: usize,
    /// Steps per run.
    #[arg(long, default_value_t = 2000)]
    pub steps: u64,
}

impl SimArgs {
    pub fn options(&self) -> aware_loadgen::bench::SimBenchOptions {
        aware_loadgen::bench::SimBenchOptions {
            out_dir: self.out.clone(),
            runs: self.runs,
            targets: self.targets,
            steps: self.steps,
            ..Default::default()
        }
    }
}

/// `aware bench loop`.
#[derive(Debug, Args)]
pub struct LoopArgs {
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    #[command(flatten)]
    pub options: LoopBenchOptions,
}

/// `aware bench scale`.
#[derive(Debug, Args)]
pub struct ScaleArgs {
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    #[command(flatten)]
    pub options: crate::scale::ScaleBenchOptions,
}

/// `aware bench bootstrap`: the options, their work directory under `--out`.
#[derive(Debug, Args)]
pub struct BootstrapArgs {
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    #[command(flatten)]
    pub options: BootstrapBenchOptions,
}

impl BootstrapArgs {
    pub fn options(&self) -> BootstrapBenchOptions {
        BootstrapBenchOptions {
            work: self.out.join("bootstrap-work"),
            ..self.options.clone()
        }
    }
}

/// `aware bench adapt`: the options and the length of the short meta-training run without
/// `--meta`.
#[derive(Debug, Args)]
pub struct AdaptArgs {
    #[command(flatten)]
    pub options: AdaptBenchOptions,
    /// Iterations of the short meta-training run without --meta.
    #[arg(long, default_value_t = AdaptBenchOptions::default().train.iterations)]
    pub meta_iterations: u64,
}

impl AdaptArgs {
    pub fn options(&self) -> AdaptBenchOptions {
        let mut opts = self.options.clone();
        opts.train.iterations = self.meta_iterations;
        opts
    }
}

/// `aware bench bus`.
#[derive(Debug, Args)]
pub struct BusArgs {
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    #[command(flatten)]
    pub options: BusBenchOptions,
}

/// `aware bench state`.
#[derive(Debug, Args)]
pub struct StateArgs {
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    #[command(flatten)]
    pub options: StateBenchOptions,
}

/// `ARM:KEY=VALUE` of `bench bootstrap --set-arm`: an arm's name, then as
/// [`aware_harness::parse_setting`].
pub fn parse_arm_setting(
    s: &str,
) -> Result<(String, String, serde_json::Value), aware_harness::SettingError> {
    let (arm, setting) = s
        .split_once(':')
        .ok_or_else(|| aware_harness::SettingError::Shape {
            expected: "ARM:KEY=VALUE",
            given: s.to_string(),
        })?;
    if !crate::bootstrap::ARM_NAMES.contains(&arm) {
        return Err(aware_harness::SettingError::UnknownArm {
            arm: arm.to_string(),
            given: s.to_string(),
            known: crate::bootstrap::ARM_NAMES.join(", "),
        });
    }
    let (k, v) = aware_harness::parse_setting(setting)?;
    Ok((arm.to_string(), k, v))
}

/// Runs the benchmark, prints its summary and writes its report into `--out`.
pub fn run(command: BenchCommand) -> Result<(), BenchError> {
    let text_logs = || aware_shared::telemetry::init_tracing(aware_shared::config::LogFormat::Text);
    match command {
        BenchCommand::Sim(args) => sim(&args),
        BenchCommand::Loop(args) => {
            text_logs()?;
            control_loop(&args)
        }
        BenchCommand::Scale(args) => {
            text_logs()?;
            scale(&args)
        }
        BenchCommand::Bootstrap(args) => {
            text_logs()?;
            bootstrap(&args)
        }
        BenchCommand::Cost(opts) => {
            text_logs()?;
            cost(&opts)
        }
        BenchCommand::Cluster(opts) => {
            text_logs()?;
            cluster(&opts)
        }
        BenchCommand::Serve(opts) => {
            text_logs()?;
            serve(&opts)
        }
        BenchCommand::Embed(opts) => {
            text_logs()?;
            embed(&opts)
        }
        BenchCommand::Adapt(args) => {
            text_logs()?;
            adapt(&args.options())
        }
        BenchCommand::Store(opts) => store(&opts),
        BenchCommand::Bus(args) => {
            text_logs()?;
            bus(&args)
        }
        BenchCommand::Kube(opts) => {
            text_logs()?;
            kube(&opts)
        }
        BenchCommand::State(args) => {
            text_logs()?;
            state(&args)
        }
        BenchCommand::Trainer(opts) => {
            text_logs()?;
            trainer(&opts)
        }
    }
}

fn sim(args: &SimArgs) -> Result<(), BenchError> {
    let r = aware_loadgen::bench::bench_sim(&args.options())?;
    println!(
        "simulator: median {:.0} target-steps/s on one core (runs: {}; goal {:.0}; optimized build: {}); with observations: {:.0}/s",
        r.target_steps_per_sec_median,
        r.target_steps_per_sec_runs
            .iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
        r.target_steps_per_sec_goal,
        r.optimized_build,
        r.observed_target_steps_per_sec_median,
    );
    println!("wrote {}", r.json.display());
    Ok(())
}

fn scale(args: &ScaleArgs) -> Result<(), BenchError> {
    let opts = args.options.clone();
    let system = actix_rt::System::new();
    let r = system.block_on(async move { crate::scale::run(&opts).await })?;
    for (i, x) in r.runs.iter().enumerate() {
        println!(
            "run {i}: {:.0} target-steps/s; obs→action p50 {:.1} ms p99 {:.1} ms; decided exactly once: {} ({} not); {:.0} B resident per target ({:.1} MiB idle → {:.1} MiB); trainer {:.1} CPU-s ({:.3} per target-hour), first model p50 {}; {} transitions stored, {:.0} B each",
            x.target_steps_per_s,
            x.obs_to_action_p50_ms,
            x.obs_to_action_p99_ms,
            x.decided_exactly_once,
            x.undecided_or_repeated,
            x.resident_bytes_per_target,
            x.resident_bytes_idle as f64 / 1048576.0,
            x.resident_bytes_loaded as f64 / 1048576.0,
            x.trainer_cpu_s,
            x.trainer_cpu_s_per_target_hour,
            x.first_model_after_s_p50
                .map_or("none".to_string(), |s| format!("{s:.1} s")),
            x.transitions_stored,
            x.store_bytes_per_transition,
        );
        for y in &x.restarts {
            let kinds: Vec<String> = y
                .kinds
                .iter()
                .map(|(k, v)| format!("{k} {}/{} in {:.2} s", v.restored, v.expected, v.read_s))
                .collect();
            println!(
                "  restart {}: ready in {:.2} s, read back {} ({}){}",
                y.service,
                y.ready_s,
                kinds.join(", "),
                if y.recovered_all { "all" } else { "NOT all" },
                y.weights_loaded_s.map_or(String::new(), |s| format!(
                    "; every model loaded in {s:.2} s"
                ))
            );
        }
    }
    println!(
        "{} targets × {} steps over {} shards ({} processes), medians of {} runs: {:.0} target-steps/s, obs→action p99 {:.1} ms, {:.0} B per target, decided exactly once: {}",
        r.targets,
        r.steps,
        r.shards,
        r.processes,
        r.runs.len(),
        r.target_steps_per_s,
        r.obs_to_action_p99_ms,
        r.resident_bytes_per_target,
        r.decided_exactly_once
    );
    let by: Vec<String> = r
        .resident_bytes_per_target_by_service
        .iter()
        .map(|(bin, b)| format!("{bin} {b:.0}"))
        .collect();
    println!("resident bytes per target by service: {}", by.join(", "));
    let path = crate::write_json(&args.out, "scale.json", &serde_json::to_value(&r)?)?;
    println!("wrote {path}");
    Ok(())
}

fn control_loop(args: &LoopArgs) -> Result<(), BenchError> {
    let out = &args.out;
    let opts = args.options.clone();
    let system = actix_rt::System::new();
    let r = system.block_on(async move { crate::control_loop::run(&opts).await })?;
    for (i, x) in r.runs.iter().enumerate() {
        println!(
            "run {i}: {:.0} target-steps/s; obs→action p50 {:.0} µs p99 {:.0} µs; decision p50 {:.1} µs p99 {:.1} µs; recommender RSS {:.1} MiB idle → {:.1} MiB ({:.0} B/target)",
            x.target_steps_per_s,
            x.obs_to_action_p50_us,
            x.obs_to_action_p99_us,
            x.decision_p50_us,
            x.decision_p99_us,
            x.recommender_rss_idle_bytes as f64 / 1048576.0,
            x.recommender_rss_loaded_bytes as f64 / 1048576.0,
            x.rss_per_target_bytes,
        );
    }
    println!(
        "{} targets × {} steps, medians of {} runs: {:.0} target-steps/s, decision p50 {:.1} µs p99 {:.1} µs, obs→action p99 {:.0} µs, {:.0} B per target",
        r.targets,
        r.steps,
        r.runs.len(),
        r.median_target_steps_per_s,
        r.median_decision_p50_us,
        r.median_decision_p99_us,
        r.median_obs_to_action_p99_us,
        r.median_rss_per_target_bytes
    );
    let path = crate::write_json(out, "loop.json", &serde_json::to_value(&r)?)?;
    println!("wrote {path}");
    Ok(())
}

fn bootstrap(args: &BootstrapArgs) -> Result<(), BenchError> {
    let out = &args.out;
    let opts = args.options();
    let system = actix_rt::System::new();
    let r = system.block_on(async move { crate::bootstrap::run(&opts).await })?;
    for a in &r.arms {
        println!(
            "{:>12}: SLO violations {} ({:.2}%), CPU util {:.3}, memory util {:.3}, reward {:.4}/step = {:.1}% of oracle; RL steps {}, apps online {}, returns to OFFLINE {}",
            a.arm, a.slo_violations, 100.0 * a.slo_violation_rate, a.cpu_util_mean, a.memory_util_mean, a.mean_reward, a.oracle_pct, a.rl_steps, a.apps_online, a.returns_to_offline
        );
    }
    println!(
        "{:>12}: SLO violations {} ({:.2}%), CPU util {:.3}, memory util {:.3}; scratch ÷ bootstrapped violations {:.2}x, scratch ÷ oracle {:.2}x",
        "oracle", r.oracle_slo_violations,
        100.0 * r.oracle_slo_violation_rate(),
        r.oracle_cpu_util_mean, r.oracle_memory_util_mean,
        r.slo_violation_ratio_no_bootstrap_vs_bootstrap, r.slo_violation_ratio_no_bootstrap_vs_oracle
    );
    let path = crate::write_json(out, "bootstrap.json", &serde_json::to_value(&r)?)?;
    println!("wrote {path}");
    for (name, svg) in crate::bootstrap::plots(&r) {
        let p = out.join(name);
        std::fs::write(&p, svg).map_err(|source| BenchError::Io {
            path: p.display().to_string(),
            source,
        })?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

fn cluster(opts: &ClusterBenchOptions) -> Result<(), BenchError> {
    let r = crate::cluster::run(opts)?;
    for line in crate::cluster::summary(&r) {
        println!("{line}");
    }
    println!(
        "wrote {} and {}",
        opts.out.join("cluster.json").display(),
        opts.out.join("cluster-pareto.svg").display()
    );
    Ok(())
}

fn cost(opts: &CostBenchOptions) -> Result<(), BenchError> {
    let r = crate::cost::run(opts)?;
    for line in crate::cost::summary(&r) {
        println!("{line}");
    }
    println!(
        "wrote {} and {}",
        opts.out.join("cost.json").display(),
        r.plots
            .iter()
            .map(|p| opts.out.join(p).display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

fn serve(opts: &ServeBenchOptions) -> Result<(), BenchError> {
    let out = &opts.out;
    let r = crate::serve::run(opts)?;
    println!(
        "scenarios injected {}, skipped as beyond the app's bounds {}",
        r.scenarios_injected, r.scenarios_skipped
    );
    for a in &r.arms {
        println!(
            "{:>20}: reward {:.4}/step = {:.1}% of converged, {} of oracle; SLO violations {} ({:.2}%); retrain triggers {}, ONLINE episodes {} ({} without noise), re-baselines {}, rollbacks {}, re-probes {}",
            a.arm,
            a.mean_reward,
            a.pct_of_converged,
            a.pct_of_oracle.map_or("-".to_string(), |p| format!("{p:.1}%")),
            a.slo_violations,
            100.0 * a.slo_violation_rate,
            a.retrain_triggers,
            a.online_episodes,
            a.eval_episodes,
            a.rebaselines, a.rollbacks, a.reprobes
        );
    }
    println!(
        "with retraining vs converged: {:.1}% of reward ({} with the oracle's own loss taken out); SLO violations without ÷ with retraining {:.2}× (at most {:.2}× for any policy: without ÷ max_allocation)",
        r.with_retraining_vs_converged_pct,
        r.with_retraining_vs_converged_oracle_relative_pct
            .map_or("-".to_string(), |p| format!("{p:.1}%")),
        r.slo_ratio_without_vs_with,
        r.slo_ratio_bound
    );
    if let Some(f) = &r.final_regime {
        println!(
            "final regime ({} episodes, every scenario in force) vs RL converged on it ({:.4}/step, {:.1}% against undisturbed): with retraining {:.1}%, without {:.1}%; SLO violations reference {}, with {}, without {}",
            f.episodes,
            f.converged_disturbed_reward,
            f.reference_vs_undisturbed_pct,
            f.with_retraining_vs_reference_pct,
            f.without_retraining_vs_reference_pct,
            f.converged_disturbed_slo_violations,
            f.with_retraining_slo_violations,
            f.without_retraining_slo_violations
        );
        let mut apps: Vec<(&str, f64)> = f
            .per_app
            .iter()
            .map(|a| (a.app.as_str(), a.with_retraining_vs_reference_pct))
            .collect();
        println!(
            "final regime, furthest below the reference with retraining: {}",
            worst(&mut apps, 5)
        );
    }
    if let Some(b) = &r.bus {
        for a in &b.arms {
            println!(
                "{:>22}: reward {:.4}/step, SLO violations {} ({:.2}%), final regime reward {:.1} / {} violations ({} vs RL converged on it); retrain triggers {}, back to SERVING {} ({} rollbacks), ONLINE episodes {}, models published {}, scenarios injected {}, {:.0} s",
                a.arm,
                a.mean_reward,
                a.slo_violations,
                100.0 * a.slo_violation_rate,
                a.final_regime_reward,
                a.final_regime_slo_violations,
                a.final_regime_vs_reference_pct
                    .map_or("-".to_string(), |p| format!("{p:+.1}%")),
                a.retrain_triggers,
                a.returns_to_serving,
                a.rollbacks,
                a.online_episodes,
                a.models_published,
                a.scenarios_injected,
                a.wall_seconds
            );
            let mut apps: Vec<(&str, f64)> = a
                .final_regime_per_app
                .iter()
                .filter_map(|p| Some((p.app.as_str(), p.vs_reference_pct?)))
                .collect();
            if !apps.is_empty() {
                println!(
                    "{:>22}  final regime, furthest below the reference: {}",
                    "",
                    worst(&mut apps, 5)
                );
            }
        }
        println!(
            "on the bus: SLO violations without ÷ with retraining {:.2}×; reward with vs without {:+.1}% (final regime {:+.1}%)",
            b.slo_ratio_without_vs_with,
            b.with_vs_without_reward_pct,
            b.final_regime_with_vs_without_pct
        );
    }
    let path = crate::write_json(out, "serve.json", &serde_json::to_value(&r)?)?;
    println!("wrote {path} and {}", out.join("serve-curve.svg").display());
    Ok(())
}

fn embed(opts: &EmbedBenchOptions) -> Result<(), BenchError> {
    let out = &opts.out;
    let r = crate::embed::run(opts)?;
    for (x, c) in r.relations.iter().zip(&r.centered_relations) {
        println!(
            "{:>12}: mean cosine similarity {:.4} (centered {:.3}) over {} pairs",
            x.relation, x.mean_cosine, c.mean_cosine, x.pairs
        );
    }
    println!(
        "nearest neighbour (centered) is the twin for {:.0}% of apps, same load pattern {:.0}%, same resource class {:.0}%; PCA explains {:.0}% + {:.0}%",
        100.0 * r.twin_nearest_fraction,
        100.0 * r.pattern_nearest_fraction,
        100.0 * r.class_nearest_fraction,
        100.0 * r.pca_explained[0],
        100.0 * r.pca_explained[1]
    );
    println!(
        "wrote {}/embed.json, {}/embed-pca.svg",
        out.display(),
        out.display()
    );
    Ok(())
}

fn adapt(opts: &AdaptBenchOptions) -> Result<(), BenchError> {
    let out = &opts.out;
    let r = crate::adapt::run(opts)?;
    for s in &r.sources {
        println!(
            "r{} {:>8} source agent on {}: {} episodes ({}), final reward {:.3}/step, {:.1} CPU-s",
            s.repeat,
            s.arm,
            s.app,
            s.episodes,
            if s.converged {
                "plateau"
            } else {
                "episode cap"
            },
            s.final_reward,
            s.cpu_seconds
        );
    }
    println!(
        "meta-learner: {} ({} iterations, {:.0} s)",
        r.meta.source, r.meta.iterations, r.meta.train_seconds
    );
    println!(
        "{:>8} | episodes to 95% median / mean (censored) | CPU-s median / mean | SLO viol. adapting / budget | deficit CPU / mem pp | reward/step | final % conv.",
        "arm"
    );
    for a in &r.arms {
        println!(
            "{:>8} | {:>6.1} / {:>6.1} ({:>2}/{})              | {:>6.2} / {:>6.2}     | {:>7} / {:>7}           | {:>5.1} / {:>5.1}        | {:.4}      | {:.1}",
            a.arm,
            a.median_episodes,
            a.mean_episodes,
            a.censored,
            a.apps,
            a.median_cpu_seconds,
            a.mean_cpu_seconds,
            a.slo_violations_adapting,
            a.slo_violations_total,
            a.mean_cpu_util_deficit_pp,
            a.mean_memory_util_deficit_pp,
            a.mean_reward,
            a.mean_final_pct_of_converged
        );
    }
    for s in &r.speed_ups {
        println!(
            "AWARE vs {:>7}: episodes ×{:.3} median, ×{:.3} mean (ratio of medians ×{:.3}, of means ×{:.3}); CPU-s ×{:.3} median, ×{:.3} mean (ratio of means ×{:.3}); SLO violations ×{:.2} adapting, ×{:.2} budget; censored {} vs aware {}",
            s.vs,
            s.median_episodes_ratio,
            s.mean_episodes_ratio,
            s.ratio_of_median_episodes,
            s.ratio_of_mean_episodes,
            s.median_cpu_ratio,
            s.mean_cpu_ratio,
            s.ratio_of_mean_cpu,
            s.slo_ratio_adapting,
            s.slo_ratio_total,
            s.other_censored,
            s.aware_censored
        );
        if let Some([lo, hi]) = s.ratio_of_mean_episodes_ci95 {
            let per: Vec<String> = s
                .per_repeat_ratio_of_mean_episodes
                .iter()
                .map(|x| format!("{x:.2}"))
                .collect();
            println!(
                "             ratio of means per repetition [{}], 95% interval over repetitions ×{lo:.2}–×{hi:.2}",
                per.join(", ")
            );
        }
    }
    let path = crate::write_json(out, "adapt.json", &serde_json::to_value(&r)?)?;
    println!("wrote {path} and {}", out.join("adapt-curve.svg").display());
    Ok(())
}

fn store(opts: &StoreBenchOptions) -> Result<(), BenchError> {
    if opts.compare {
        return store_compare(opts);
    }
    let out = &opts.out;
    let r = crate::store::run(opts)?;
    for (i, x) in r.runs.iter().enumerate() {
        println!(
            "run {i}: append {:.0} rows/s ({:.0} MB); before the pass: poll {:.2} ms, recorded {:.1} ms, count {:.1} ms, sample {:.0} ms; first pass {:.0} ms ({} rows); after: poll {:.2} ms, recorded {:.1} ms, sample {:.0} ms; steady pass {:.0} ms ({} rows); {:.0} MB after; forget {:.0} ms ({} rows, WAL {:.1} MB after)",
            x.append_rows_per_s,
            x.file_bytes_before as f64 / 1e6,
            x.poll_ms_before,
            x.recorded_ms_before,
            x.count_ms_before,
            x.sample_ms_before,
            x.prune_ms,
            x.pruned_rows,
            x.poll_ms_after,
            x.recorded_ms_after,
            x.sample_ms_after,
            x.steady_prune_ms,
            x.steady_pruned_rows,
            x.file_bytes_after as f64 / 1e6,
            x.forget_ms,
            x.forgotten_rows,
            x.wal_bytes_after_forget as f64 / 1e6,
        );
    }
    println!(
        "medians: append {:.0} rows/s; sample {:.0} → {:.0} ms; poll {:.2} → {:.2} ms (count {:.1} ms); recorded {:.1} → {:.1} ms; first pass {:.0} ms; steady pass {:.0} ms; forget {:.0} ms",
        r.median_append_rows_per_s,
        r.median_sample_ms_before,
        r.median_sample_ms_after,
        r.median_poll_ms_before,
        r.median_poll_ms_after,
        r.median_count_ms_before,
        r.median_recorded_ms_before,
        r.median_recorded_ms_after,
        r.median_prune_ms,
        r.median_steady_prune_ms,
        r.median_forget_ms,
    );
    let path = crate::write_json(out, "store.json", &serde_json::to_value(&r)?)?;
    println!("wrote {path}");
    Ok(())
}

fn store_compare(opts: &StoreBenchOptions) -> Result<(), BenchError> {
    let r = crate::store_compare::run(opts)?;
    for c in &r.cells {
        if let Some(why) = &c.skipped {
            println!(
                "{:?} at {} transitions: skipped: {why}",
                c.backend, c.transitions
            );
            continue;
        }
        println!(
            "{:?} at {} transitions ({} runs, medians): write {:.0} transitions/s, summaries {:.0}/s; top-{} read {:.2} ms; sample of {} {:.1} ms; {:.0} bytes per transition",
            c.backend,
            c.transitions,
            c.runs.len(),
            c.median_transitions_per_s,
            c.median_episodes_per_s,
            opts.top_m,
            c.median_top_m_ms,
            opts.compare_sample,
            c.median_sample_ms,
            c.median_bytes_per_transition,
        );
        for (i, x) in c.runs.iter().enumerate() {
            if x.stopped_by_load_limit {
                println!(
                    "  run {i}: the load stopped at --load-limit-s {} after {} transitions",
                    opts.load_limit_s, x.transitions
                );
            }
        }
    }
    let path = crate::write_json(&opts.out, "store-compare.json", &serde_json::to_value(&r)?)?;
    println!("wrote {path}");
    Ok(())
}

fn bus(args: &BusArgs) -> Result<(), BenchError> {
    let out = &args.out;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    let results = rt.block_on(crate::bus::run(&args.options))?;
    for r in &results {
        println!(
            "{:<14} {:>5} B  throughput median {:>10.0} msg/s (runs: {})  lost {}  | at {} msg/s: p50 {:.1} µs  p99 {:.1} µs  max {:.1} µs  lost {}",
            r.transport,
            r.payload_bytes,
            r.throughput_median_msgs_per_s,
            r.throughput_runs_msgs_per_s
                .iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            r.lost_in_throughput_runs,
            r.latency_rate_msgs_per_s,
            r.latency_p50_us,
            r.latency_p99_us,
            r.latency_max_us,
            r.lost_in_latency_run,
        );
    }
    let path = crate::write_json(out, "bus.json", &serde_json::to_value(&results)?)?;
    println!("wrote {path}");
    Ok(())
}

fn state(args: &StateArgs) -> Result<(), BenchError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    let r = rt.block_on(crate::state::run(&args.options))?;
    for line in crate::state::summary(&r) {
        println!("{line}");
    }
    let path = crate::write_json(&args.out, "state.json", &serde_json::to_value(&r)?)?;
    println!("wrote {path}");
    Ok(())
}

fn trainer(opts: &TrainerBenchOptions) -> Result<(), BenchError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    if opts.learning {
        let r = rt.block_on(crate::trainer::run_learning(opts))?;
        for line in crate::trainer::learning_summary(&r) {
            println!("{line}");
        }
        let path = crate::write_json(
            &opts.out,
            "trainer-learning.json",
            &serde_json::to_value(&r)?,
        )?;
        println!("wrote {path}");
        return Ok(());
    }
    let r = rt.block_on(crate::trainer::run(opts))?;
    for line in crate::trainer::summary(&r) {
        println!("{line}");
    }
    let path = crate::write_json(&opts.out, "trainer.json", &serde_json::to_value(&r)?)?;
    println!("wrote {path}");
    Ok(())
}

fn kube(opts: &KubeBenchOptions) -> Result<(), BenchError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    let r = rt.block_on(crate::kube::run(opts))?;
    for line in crate::kube::summary(&r) {
        println!("{line}");
    }
    let path = crate::write_json(&opts.out, "kube.json", &serde_json::to_value(&r)?)?;
    println!("wrote {path}");
    Ok(())
}

/// The `n` lowest of `apps` (name, % against the reference), lowest first: "app-0017 −18.2%, …".
fn worst(apps: &mut [(&str, f64)], n: usize) -> String {
    apps.sort_by(|a, b| a.1.total_cmp(&b.1));
    apps.iter()
        .take(n)
        .map(|(a, p)| format!("{a} {p:+.1}%"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use clap::{Parser, Subcommand};

    #[derive(Parser)]
    struct Bench {
        #[command(subcommand)]
        bench: super::BenchCommand,
    }

    /// `bench cost`: its flags, and without them the options' defaults.
    #[test]
    fn cost_parses_its_flags() {
        use crate::cost::{CostBenchOptions, CostPolicy};
        let parse = |args: &[&str]| match Bench::try_parse_from(
            ["bench", "cost"].iter().chain(args).copied(),
        )
        .unwrap()
        .bench
        {
            super::BenchCommand::Cost(o) => o,
            _ => unreachable!("bench cost"),
        };
        assert_eq!(
            format!("{:?}", parse(&[])),
            format!("{:?}", CostBenchOptions::default())
        );
        let o = parse(&[
            "--app-file",
            "apps.yaml",
            "--policies",
            "oracle,vpa",
            "--hpa-targets",
            "30,45",
            "--gib-price",
            "0.01",
            "--meta",
            "meta-out",
            "--set",
            "trainer.bc_alpha=25",
        ]);
        assert_eq!(o.generated_apps(), 0);
        assert_eq!(o.selected(), [CostPolicy::Vpa, CostPolicy::Oracle]);
        assert_eq!(o.hpa_targets, [30, 45]);
        assert_eq!(o.prices().gib_hour, 0.01);
        assert_eq!(o.meta, Some("meta-out".into()));
        assert_eq!(o.settings.len(), 1);
        assert!(Bench::try_parse_from(["bench", "cost", "--policies", "hpa"]).is_err());
    }

    /// Every flag hidden from a bench's `--help` is named in its after-help line, and only
    /// the research knobs of bootstrap, serve and adapt are hidden.
    #[test]
    fn hidden_flags_are_named_in_the_help() {
        let cmd = super::BenchCommand::augment_subcommands(clap::Command::new("bench"));
        let mut hidden = 0;
        for sub in cmd.get_subcommands() {
            let after = sub
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            for arg in sub.get_arguments().filter(|a| a.is_hide_set()) {
                let long = arg.get_long().unwrap();
                assert!(
                    after.contains(&format!("--{long},")) || after.ends_with(&format!("--{long}")),
                    "bench {}: --{long} is hidden but not named",
                    sub.get_name()
                );
                hidden += 1;
            }
            let named = after.matches("--").count();
            let count = sub.get_arguments().filter(|a| a.is_hide_set()).count();
            assert_eq!(named, count, "bench {}: {after}", sub.get_name());
            if count > 0 {
                assert!(["bootstrap", "serve", "adapt"].contains(&sub.get_name()));
            }
        }
        assert_eq!(hidden, 9 + 19 + 9);
    }
}
