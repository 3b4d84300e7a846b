//! `aware`: run the services, watch the bus, run benchmarks.

use std::path::PathBuf;

use anyhow::{bail, Context};
use aware_cli::bench;
use aware_shared::cli::ConfigArgs;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "aware",
    version,
    about = "AWARE: reinforcement-learning workload autoscaler"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one service, or `all` of them in this process.
    Run {
        /// `all` or a service name (lifecycle-monitor, meta-learner-trainer, trajectory-recorder,
        /// actuator, recommender, metrics-collector).
        service: String,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Print the effective configuration as JSON: defaults, then --config, the AWARE_…
    /// environment and the flags, with every service's section in full, each checked as its
    /// service checks it at start-up; exits non-zero naming the first key a service would refuse.
    Config {
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Print the nats-server `authorization` block: one user per AWARE identity (each service,
    /// and a read-only `watch`), allowed to publish only the events it owns and to subscribe only
    /// to what it consumes. Passwords are read by nats-server from $AWARE_NATS_PASSWORD_<IDENTITY>
    /// unless --nkeys is given.
    NatsConfig {
        /// Use NKeys instead of passwords: generate a pair per identity and write each seed to
        /// DIR/<identity>.nk (the service's `bus.auth.nkey_seed_file`).
        #[arg(long, value_name = "DIR")]
        nkeys: Option<std::path::PathBuf>,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Print bus events as JSON lines.
    Watch {
        /// Subject filter (NATS wildcards `*` and `>`).
        #[arg(default_value = aware_bus_schemas::subject::ALL)]
        subject: String,
        /// Stop after this many events.
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Run a benchmark; writes JSON into --out.
    Bench {
        #[command(subcommand)]
        bench: BenchCommand,
    },
    /// Meta-train the shared base-learner and the meta-learner on a pool of generated apps
    /// (8:2 train/held-out split); writes meta.ckpt, base.ckpt, split.json, train-log.json.
    TrainMeta {
        /// Apps in the generated pool.
        #[arg(long, default_value_t = aware_cli::train_meta::TrainMetaOptions::default().apps)]
        apps: usize,
        /// Meta-training iterations.
        #[arg(long, default_value_t = aware_cli::train_meta::TrainMetaOptions::default().iterations)]
        iterations: u64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value = "meta-out")]
        out: PathBuf,
        /// Continue from the checkpoint in --out.
        #[arg(long)]
        resume: bool,
        #[arg(long, default_value_t = 25)]
        checkpoint_every: u64,
        #[arg(long, default_value_t = 50)]
        steps_per_episode: usize,
        /// GRU hidden width per direction (FC width follows it).
        #[arg(long, default_value_t = 64)]
        hidden: usize,
        /// Episodes per bundle (top-M).
        #[arg(long, default_value_t = 20)]
        bundle: usize,
        #[arg(long, default_value_t = 4)]
        apps_per_iteration: usize,
        #[arg(long, default_value_t = 4)]
        updates_per_iteration: usize,
        /// Base-learner updates per iteration with the embeddings held fixed (cheap: no GRU pass)
        #[arg(long, default_value_t = 32)]
        base_updates_per_iteration: usize,
        /// Exploration σ stored in base.ckpt: what the services explore with while they
        /// fine-tune the base-learner for a new target
        #[arg(long, default_value_t = aware_cli::train_meta::TrainMetaOptions::default().fine_tune_sigma)]
        fine_tune_sigma: f32,
        /// Independent trainings on the same pool (in --out/restart-N, as many at once as there
        /// are cores); --out gets the best-validated agent of all
        #[arg(long, default_value_t = aware_cli::train_meta::DEFAULT_RESTARTS)]
        restarts: u64,
    },
    /// Print the JSON Schemas of the bus messages, or write them and the golden fixtures.
    Schemas {
        /// Write `schemas/` and `fixtures/` under this directory (the bus-schemas crate).
        #[arg(long, value_name = "DIR")]
        write: Option<PathBuf>,
    },
    /// Run the simulated cluster alone with a fixed policy (or the oracle); JSON lines per step.
    Sim {
        /// Generate this many apps (ignored with --app-file).
        #[arg(long, default_value_t = 4)]
        apps: usize,
        /// Generator seed (also the simulation seed).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// App set file (YAML, or JSON when the name ends in .json).
        #[arg(long, value_name = "FILE")]
        app_file: Option<PathBuf>,
        /// Steps to run.
        #[arg(long, default_value_t = 100)]
        steps: u64,
        /// Policy: hold, random, hpa, oracle.
        #[arg(long, default_value = "hold")]
        policy: String,
        /// HPA target CPU utilization (policy hpa).
        #[arg(long, default_value_t = 0.7)]
        target_cpu_util: f64,
        /// Also compute the oracle's bound along the trajectory.
        #[arg(long)]
        with_oracle: bool,
        /// Write the per-step JSON lines here instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// The main job: a simulated cluster managed end to end on the embedded bus (bootstrap
    /// behind HPA/VPA → ONLINE → SERVING); live progress, then demo-summary.json and plots.
    Demo {
        /// Generated apps in addition to the hand-written ones (two on real traces).
        #[arg(long, default_value_t = aware_cli::demo::DemoOptions::default().generated_apps)]
        apps: usize,
        #[arg(long, default_value_t = aware_cli::demo::DemoOptions::default().seed)]
        seed: u64,
        #[arg(long, default_value_t = aware_cli::demo::DemoOptions::default().episodes)]
        episodes: u64,
        #[arg(long, default_value_t = aware_cli::demo::DemoOptions::default().steps_per_episode)]
        steps_per_episode: u32,
        /// Print the progress table every this many steps.
        #[arg(long, default_value_t = aware_cli::demo::DemoOptions::default().print_every)]
        print_every: u32,
        /// Wall-clock pause after every simulated step, ms (time for the trainer).
        #[arg(long, default_value_t = 20)]
        pace_ms: u64,
        /// An `aware train-meta` output to bootstrap from (trainer.meta_dir). Without it the
        /// demo meta-trains one into OUT/meta the first time (`aware train-meta` with two
        /// restarts, about 1.5 min) and reuses it afterwards.
        #[arg(long, conflicts_with = "no_meta")]
        meta: Option<PathBuf>,
        /// The plain base-learner: every app learns from nothing (no meta-learning).
        #[arg(long)]
        no_meta: bool,
        /// Iterations of the demo's own meta-training.
        #[arg(long, default_value_t = aware_cli::train_meta::TrainMetaOptions::default().iterations)]
        meta_iterations: u64,
        /// A setting of the services other than the demo's, SECTION.KEY=VALUE with a JSON value
        /// (repeatable), e.g. --set lifecycle_monitor.probation_episodes=2.
        #[arg(long = "set", value_parser = parse_setting)]
        settings: Vec<(String, serde_json::Value)>,
        /// Output directory (the apps, the stores under data/, the summary and the plots).
        #[arg(long, default_value = "demo-out")]
        out: PathBuf,
    },
    /// Print the AwareAutoscaler CRD YAML (`deploy/crd/awareautoscalers.aware.dev.yaml`).
    Crd,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Simulator throughput (target-steps/s, one core) and p99 latency heatmaps.
    Sim {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// Timed runs (median reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Targets per run.
        #[arg(long, default_value_t = 64)]
        targets: usize,
        /// Steps per run.
        #[arg(long, default_value_t = 2000)]
        steps: u64,
    },
    /// The control loop end to end over NATS: target-steps/s, decision latency, memory per target.
    Loop {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        #[arg(long, default_value_t = 1000)]
        targets: usize,
        #[arg(long, default_value_t = 30)]
        steps: u64,
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Offline bootstrapping (paper §5.4): fallback vs bootstrapped vs no-bootstrap RL over the
    /// early window on held-out generated apps; writes bootstrap.json.
    Bootstrap {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        #[arg(long, default_value_t = 20)]
        apps: usize,
        #[arg(long, default_value_t = 1001)]
        seed: u64,
        #[arg(long, default_value_t = 20)]
        episodes: u32,
        #[arg(long, default_value_t = 50)]
        steps_per_episode: u32,
        #[arg(long, default_value_t = 4)]
        offline_episodes: u32,
        /// Wall-clock pause after every simulated step, ms (time for the trainer).
        #[arg(long, default_value_t = 40)]
        pace_ms: u64,
        #[arg(long, default_value_t = 100)]
        train_every_transitions: u64,
        /// σ of the RL arms' exploration noise.
        #[arg(long, default_value_t = 0.2)]
        exploration_sigma: f32,
        /// TD3+BC λ of the RL arms.
        #[arg(long, default_value_t = 2.5)]
        bc_alpha: f32,
        /// `lifecycle_monitor.probation_margin` of the bootstrap arm.
        #[arg(long, default_value_t = 0.10)]
        probation_margin: f64,
        /// `lifecycle_monitor.behaviour_margin` of the bootstrap arm.
        #[arg(long, default_value_t = 0.05)]
        behaviour_margin: f64,
        /// `trainer.meta_dir` of the bootstrap arm (an `aware train-meta` output): bootstrapping
        /// with the meta-trained, embedding-conditioned base-learner
        #[arg(long)]
        meta: Option<PathBuf>,
        /// `trainer.recent_fraction` of both RL arms (recency-mixed replay while ONLINE; 0: off).
        #[arg(long, default_value_t = bench::bootstrap::services_retraining_defaults().0)]
        recent_fraction: f32,
        /// `lifecycle_monitor.rebaseline_after_episodes` of both RL arms (0: off).
        #[arg(long, default_value_t = bench::bootstrap::services_retraining_defaults().1)]
        rebaseline_after: usize,
        /// `recommender.eval_every_episodes` of both RL arms, with
        /// `lifecycle_monitor.online_noise_free_only` (0: off).
        #[arg(long, default_value_t = bench::bootstrap::services_retraining_defaults().2)]
        eval_every: u32,
        /// A setting of the services other than its default in every arm, SECTION.KEY=VALUE with
        /// a JSON value (repeatable), e.g. --set trainer.learn_action=applied.
        #[arg(long = "set", value_parser = parse_setting)]
        set: Vec<(String, serde_json::Value)>,
        /// A setting of one arm only, ARM:SECTION.KEY=VALUE (ARM: fallback, bootstrap or
        /// no_bootstrap; repeatable), applied after --set, e.g. each RL arm at its own best λ:
        /// --bc-alpha 100 --set-arm no_bootstrap:trainer.bc_alpha=25.
        #[arg(long = "set-arm", value_parser = parse_arm_setting)]
        set_arm: Vec<(String, String, serde_json::Value)>,
    },
    /// Serving under instability (paper §5.3, Fig. 9): a converged agent meets the §2.3
    /// scenarios with and without the retraining trigger, vs HPA/VPA, the converged policy on the
    /// undisturbed workload and the oracle; writes serve.json and serve-curve.svg.
    Serve {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        #[arg(long, default_value_t = 20)]
        apps: usize,
        #[arg(long, default_value_t = 1001)]
        seed: u64,
        /// Online-RL episodes per app before serving.
        #[arg(long, default_value_t = 40)]
        train_episodes: u32,
        #[arg(long, default_value_t = 24)]
        serve_episodes: u32,
        #[arg(long, default_value_t = 50)]
        steps_per_episode: u32,
        /// Episodes between scenario injections.
        #[arg(long, default_value_t = 3)]
        inject_every: u32,
        /// Algorithm 1's decision window, episodes.
        #[arg(long, default_value_t = 3)]
        window: usize,
        /// Gradient steps per transition while learning.
        #[arg(long, default_value_t = 1)]
        gradient_steps: u32,
        /// Gradient steps per transition while retraining (with_retraining, ONLINE; default: the
        /// services' trainer.retrain_gradient_steps ÷ trainer.train_every_transitions, 4).
        #[arg(long, default_value_t = bench::serve::ServeBenchOptions::default().retrain_gradient_steps)]
        retrain_gradient_steps: u32,
        /// Share of each retraining minibatch drawn from the newest --retrain-recent transitions
        /// (default: the services' trainer.recent_fraction; 0: uniform, the paper's replay).
        #[arg(long, default_value_t = bench::serve::ServeBenchOptions::default().retrain_recent_fraction)]
        retrain_recent_fraction: f32,
        /// Newest transitions that share is drawn from (0: uniform over the whole buffer;
        /// default: the services' 20 episodes of 50 steps).
        #[arg(long, default_value_t = bench::serve::ServeBenchOptions::default().retrain_recent)]
        retrain_recent: usize,
        /// Exploration σ while retraining (default: the services' trainer.exploration_sigma ×
        /// recommender.retrain_noise_scale, 0.1).
        #[arg(long, default_value_t = bench::serve::ServeBenchOptions::default().retrain_sigma)]
        retrain_sigma: f32,
        /// Transitions per retraining round, each round taking --retrain-gradient-steps per
        /// transition (1: after every transition; the services train every
        /// trainer.retrain_every_transitions, 50).
        #[arg(long, default_value_t = bench::serve::ServeBenchOptions::default().retrain_every)]
        retrain_every: u32,
        /// Re-baselining of with_retraining's Algorithm 1 (lifecycle_monitor.
        /// rebaseline_after_episodes; 0: off): ONLINE episodes whose rewards no longer improve
        /// before it serves at the level they settled at (default: the services').
        #[arg(long, default_value_t = bench::serve::ServeBenchOptions::default().rebaseline_after)]
        rebaseline_after: usize,
        /// lifecycle_monitor.rebaseline_tolerance: relative improvement that still counts as settled.
        #[arg(long, default_value_t = 0.02)]
        rebaseline_tolerance: f64,
        /// lifecycle_monitor.rebaseline_margin: relative drop below the settled level that retrains.
        #[arg(long, default_value_t = 0.05)]
        rebaseline_margin: f64,
        /// lifecycle_monitor.rebaseline_rollback off: a retraining that settled below what the
        /// policy earned before it keeps learning instead of rolling back to the policy in force
        /// at the trigger.
        #[arg(long)]
        no_rollback: bool,
        /// lifecycle_monitor.reprobe_after_episodes: a target serving at a re-baselined or
        /// rolled-back level retrains again after this many episodes there (0: off).
        #[arg(long, default_value_t = aware_lifecycle_monitor::MonitorConfig::default().reprobe_after_episodes)]
        reprobe_after: usize,
        /// lifecycle_monitor.serving_hysteresis: a target serving on t_serving retrains below
        /// t_serving less this fraction of it.
        #[arg(long, default_value_t = aware_lifecycle_monitor::MonitorConfig::default().serving_hysteresis)]
        serving_hysteresis: f64,
        /// Shrink and perturb α applied to with_retraining's networks at every trigger
        /// (θ ← α·θ + (1 − α)·fresh; 1: off).
        #[arg(long, default_value_t = 1.0)]
        retrain_shrink: f32,
        /// The services' evaluation episodes in with_retraining (recommender.eval_every_episodes
        /// with lifecycle_monitor.online_noise_free_only): ONLINE episodes numbered k − 1 modulo k
        /// run without exploration noise and only those reach its Algorithm 1 (0: off; default:
        /// the services').
        #[arg(long, default_value_t = bench::serve::ServeBenchOptions::default().retrain_eval_every)]
        retrain_eval_every: u32,
        /// Skip the oracle arms (slow: thousands of candidates per step).
        #[arg(long)]
        no_oracle: bool,
        /// Also train a reference agent on the fully disturbed app (converged_disturbed).
        #[arg(long)]
        disturbed_reference: bool,
        /// Schedule only scenarios whose changed workload the app's bounds can serve: with every
        /// resource at its maximum, the share of steps violating the SLO after the injection
        /// rises by at most --servable-tolerance; the others are skipped.
        #[arg(long)]
        servable_only: bool,
        /// The rise in max_allocation's SLO-violation rate a servable scenario may cause.
        #[arg(long, default_value_t = 0.02)]
        servable_tolerance: f64,
        /// Then run the protocol on the six services over the embedded bus, starting from the
        /// same converged agents (bus_with_retraining, bus_without_retraining).
        #[arg(long)]
        bus: bool,
        /// --bus: the pacer's sleep after every round of the apps' observations, ms.
        #[arg(long, default_value_t = 40)]
        bus_pace_ms: u64,
        /// --bus: a setting of the services other than its default, SECTION.KEY=VALUE with a
        /// JSON value (repeatable), e.g. --bus-set trainer.train_every_transitions=50 or
        /// --bus-set actuator.guardrails.cpu_cooldown_ms=0.
        #[arg(long, value_parser = parse_setting)]
        bus_set: Vec<(String, serde_json::Value)>,
    },
    /// Workload embeddings (paper Fig. 6): apps of known resource classes and load patterns,
    /// their cosine similarities and a PCA projection; writes embed.json and embed-pca.svg.
    Embed {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// An `aware train-meta` output directory (default: a short meta-training first).
        #[arg(long)]
        meta: Option<PathBuf>,
        /// Fallback episodes per app (the bundle is their top-M).
        #[arg(long, default_value_t = 8)]
        episodes: usize,
        #[arg(long, default_value_t = 50)]
        steps_per_episode: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// Adaptation to new workloads (paper §5.2, Fig. 8): AWARE's meta-learned base-learner vs
    /// transfer learning (TL) and TL with forecast and resource-table features (TL+) on held-out
    /// apps; episodes and CPU-seconds to 95% of the converged reward, SLO violations; writes
    /// adapt.json and adapt-curve.svg.
    Adapt {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// An `aware train-meta` output directory (default: a short meta-training first).
        #[arg(long)]
        meta: Option<PathBuf>,
        /// Held-out apps (generated from --seed, which must differ from the pool's).
        #[arg(long, default_value_t = 10)]
        apps: usize,
        #[arg(long, default_value_t = 1001)]
        seed: u64,
        /// Episode budget per app and arm.
        #[arg(long, default_value_t = 100)]
        episodes: usize,
        #[arg(long, default_value_t = 50)]
        steps_per_episode: usize,
        /// Gradient steps per transition (every learning arm).
        #[arg(long, default_value_t = 1)]
        gradient_steps: u32,
        /// AWARE: fallback episodes before the first embedding (counted in the budget; 1, as
        /// the trainer, which embeds a target after its first recorded episode).
        #[arg(long, default_value_t = bench::adapt::AdaptBenchOptions::default().fallback_episodes)]
        fallback_episodes: usize,
        /// TL/TL+ source app: index into the meta-training pool's training side (repetition r
        /// uses the next r-th).
        #[arg(long, default_value_t = 0)]
        source_index: usize,
        /// Repetitions, each with another source app and other held-out apps (seed + 1000·r);
        /// the TL source draw moves the speed-ups more than anything else, so the default
        /// averages over ten sources
        #[arg(long, default_value_t = bench::adapt::AdaptBenchOptions::default().repeats)]
        repeats: usize,
        /// Most episodes the TL/TL+ source agents train (they stop earlier on a plateau).
        #[arg(long, default_value_t = 300)]
        source_max_episodes: u32,
        /// Iterations of the short meta-training run without --meta.
        #[arg(long, default_value_t = 60)]
        meta_iterations: u64,
        /// Skip the learning-from-scratch reference arm.
        #[arg(long)]
        no_scratch: bool,
        /// AWARE: recompute the embedding from the app's top-M episodes every this many episodes
        #[arg(long, default_value_t = 5)]
        embedding_refresh: usize,
        /// Exploration σ while fine-tuning a pre-trained policy: AWARE's meta-trained
        /// base-learner and TL's / TL+'s transferred agents alike (`aware train-meta`'s default;
        /// scratch and the TL sources explore with 0.2, Table 2)
        #[arg(long, default_value_t = bench::adapt::AdaptBenchOptions::default().fine_tune_sigma)]
        fine_tune_sigma: f32,
        /// TL's and TL+'s own fine-tuning σ (default: --fine-tune-sigma), to compare every arm
        /// at the σ it does best with
        #[arg(long)]
        tl_fine_tune_sigma: Option<f32>,
        /// Critic warm-up of AWARE, TL and TL+ alike: the gradient steps of the first this many
        /// episodes' transitions train the critic only (0: none)
        #[arg(long, default_value_t = bench::adapt::AdaptBenchOptions::default().critic_warmup_episodes)]
        critic_warmup: usize,
    },
    /// The trajectory store at the retention bound (`recorder.keep_transitions`): append rate,
    /// the trainer's reads before and after a retention pass, the passes; writes store.json.
    Store {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// Rows of one target stored before the first pass.
        #[arg(long, default_value_t = bench::store::StoreBenchOptions::default().rows)]
        rows: u64,
        /// `recorder.keep_transitions`.
        #[arg(long, default_value_t = bench::store::StoreBenchOptions::default().keep)]
        keep: u64,
        #[arg(long, default_value_t = bench::store::StoreBenchOptions::default().steps_per_episode)]
        steps_per_episode: u32,
        /// Rows per timed sample (a trainer round's draw).
        #[arg(long, default_value_t = bench::store::StoreBenchOptions::default().sample)]
        sample: usize,
        /// Runs (medians reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Bus throughput and latency, in-process and over NATS on loopback.
    Bus {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// Messages per throughput run.
        #[arg(long, default_value_t = 500_000)]
        messages: usize,
        /// Throughput runs (median reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Rate of the latency run, messages/s.
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        /// Duration of the latency run, seconds.
        #[arg(long, default_value_t = 3.0)]
        latency_secs: f64,
        /// Use this NATS server instead of starting `nats-server` on a free port.
        #[arg(long)]
        nats: Option<String>,
        /// Only the in-process bus.
        #[arg(long)]
        skip_nats: bool,
    },
}

/// `ARM:KEY=VALUE` of `bench bootstrap --set-arm`: an arm's name, then as [`parse_setting`].
fn parse_arm_setting(s: &str) -> Result<(String, String, serde_json::Value), String> {
    let (arm, setting) = s
        .split_once(':')
        .ok_or_else(|| format!("expected ARM:KEY=VALUE, got {s:?}"))?;
    if !bench::bootstrap::ARM_NAMES.contains(&arm) {
        return Err(format!(
            "unknown arm {arm:?} in {s:?} (one of {})",
            bench::bootstrap::ARM_NAMES.join(", ")
        ));
    }
    let (k, v) = parse_setting(setting)?;
    Ok((arm.to_string(), k, v))
}

/// `KEY=VALUE` with a JSON value (a bare word that is not JSON is taken as a string).
fn parse_setting(s: &str) -> Result<(String, serde_json::Value), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if k.is_empty() {
        return Err(format!("empty key in {s:?}"));
    }
    let v = serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.to_string()));
    Ok((k.to_string(), v))
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

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { service, config } => {
            let Some(entries) = aware_cli::select_services(&service) else {
                bail!(
                    "unknown service `{service}`; expected one of: {}",
                    aware_cli::service_names().join(", ")
                );
            };
            aware_shared::launcher::main(&config, &entries)?;
        }
        Command::Config { config } => {
            let cfg = aware_shared::config::load(&config.sources()?)?;
            for (_, hint) in cfg.unused_keys() {
                eprintln!("warning: {hint}");
            }
            let effective = aware_cli::config_check::effective(&cfg)?;
            println!("{}", serde_json::to_string_pretty(&effective)?);
        }
        Command::NatsConfig { nkeys, config } => {
            let cfg = aware_shared::config::load(&config.sources()?)?;
            let text = match &nkeys {
                Some(dir) => aware_cli::nats_config::with_nkeys(&cfg, dir)?,
                None => aware_cli::nats_config::with_passwords(&cfg)?,
            };
            print!("{text}");
            eprint!("{}", aware_cli::nats_config::client_settings());
        }
        Command::Watch {
            subject,
            limit,
            config,
        } => {
            let cfg = aware_shared::config::load(&config.sources()?)?;
            aware_shared::telemetry::init_tracing(cfg.log.format)?;
            if cfg.bus.url == aware_shared::bus::EMBEDDED {
                bail!("`aware watch` needs a NATS bus: pass --bus nats://HOST:4222 (or set AWARE_BUS__URL)");
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                // Watching only subscribes: no capture stream to declare (the read-only `watch`
                // identity may not).
                let mut bus_cfg = cfg.bus.clone();
                bus_cfg.jetstream.enabled = false;
                let bus = aware_shared::bus::Bus::connect(&bus_cfg, "aware-watch").await?;
                let stop = tokio_util::sync::CancellationToken::new();
                aware_shared::service::cancel_on_signal(stop.clone());
                let mut out = std::io::stdout().lock();
                aware_cli::watch::watch(&bus, &subject, &mut out, limit, stop).await?;
                anyhow::Ok(())
            })?;
        }
        Command::Sim {
            apps,
            seed,
            app_file,
            steps,
            policy,
            target_cpu_util,
            with_oracle,
            out,
        } => {
            use aware_loadgen::run::{run_sim, AppSource, PolicySpec, RunSimOptions};
            let policy = match policy.as_str() {
                "hold" => PolicySpec::Hold,
                "random" => PolicySpec::Random { seed },
                "hpa" => PolicySpec::Hpa { target_cpu_util },
                "oracle" => PolicySpec::Oracle,
                other => bail!("unknown policy `{other}`; expected hold, random, hpa or oracle"),
            };
            let opts = RunSimOptions {
                apps: match app_file {
                    Some(path) => AppSource::File { path },
                    None => AppSource::Generate { count: apps, seed },
                },
                steps,
                policy,
                config: aware_loadgen::env::SimConfig {
                    seed,
                    ..Default::default()
                },
                with_oracle,
                ..Default::default()
            };
            let report = match out {
                Some(path) => {
                    let mut f = std::io::BufWriter::new(
                        std::fs::File::create(&path)
                            .with_context(|| format!("creating {}", path.display()))?,
                    );
                    run_sim(&opts, &mut f)?
                }
                None => run_sim(&opts, &mut std::io::stdout().lock())?,
            };
            eprintln!("{}", serde_json::to_string_pretty(&report)?);
        }
        Command::Bench { bench } => match bench {
            BenchCommand::Loop {
                out,
                targets,
                steps,
                runs,
            } => {
                aware_shared::telemetry::init_tracing(aware_shared::config::LogFormat::Text)?;
                let opts = bench::control_loop::LoopBenchOptions {
                    targets,
                    steps,
                    runs,
                    recommender_bin: None,
                };
                let system = actix_rt::System::new();
                let r = system.block_on(async move { bench::control_loop::run(&opts).await })?;
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
                let path = bench::write_json(&out, "loop.json", &serde_json::to_value(&r)?)?;
                println!("wrote {path}");
            }
            BenchCommand::Bootstrap {
                out,
                apps,
                seed,
                episodes,
                steps_per_episode,
                offline_episodes,
                pace_ms,
                train_every_transitions,
                exploration_sigma,
                bc_alpha,
                probation_margin,
                behaviour_margin,
                meta,
                recent_fraction,
                rebaseline_after,
                eval_every,
                set,
                set_arm,
            } => {
                aware_shared::telemetry::init_tracing(aware_shared::config::LogFormat::Text)?;
                let opts = bench::bootstrap::BootstrapBenchOptions {
                    apps,
                    seed,
                    episodes,
                    steps_per_episode,
                    offline_episodes,
                    pace_ms,
                    train_every_transitions,
                    exploration_sigma,
                    bc_alpha,
                    probation_margin,
                    behaviour_margin,
                    meta,
                    recent_fraction,
                    rebaseline_after,
                    eval_every,
                    settings: set,
                    arm_settings: set_arm,
                    work: out.join("bootstrap-work"),
                    ..Default::default()
                };
                let system = actix_rt::System::new();
                let r = system.block_on(async move { bench::bootstrap::run(&opts).await })?;
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
                let path = bench::write_json(&out, "bootstrap.json", &serde_json::to_value(&r)?)?;
                println!("wrote {path}");
                for (name, svg) in bench::bootstrap::plots(&r) {
                    let p = out.join(name);
                    std::fs::write(&p, svg)
                        .map_err(|e| anyhow::anyhow!("writing {}: {e}", p.display()))?;
                    println!("wrote {}", p.display());
                }
            }
            BenchCommand::Serve {
                out,
                apps,
                seed,
                train_episodes,
                serve_episodes,
                steps_per_episode,
                inject_every,
                window,
                gradient_steps,
                retrain_gradient_steps,
                retrain_recent_fraction,
                retrain_recent,
                retrain_sigma,
                retrain_every,
                rebaseline_after,
                rebaseline_tolerance,
                rebaseline_margin,
                no_rollback,
                reprobe_after,
                serving_hysteresis,
                retrain_shrink,
                retrain_eval_every,
                no_oracle,
                disturbed_reference,
                servable_only,
                servable_tolerance,
                bus,
                bus_pace_ms,
                bus_set,
            } => {
                aware_shared::telemetry::init_tracing(aware_shared::config::LogFormat::Text)?;
                let opts = bench::serve::ServeBenchOptions {
                    apps,
                    seed,
                    train_episodes,
                    serve_episodes,
                    steps_per_episode,
                    inject_every,
                    window,
                    gradient_steps,
                    retrain_gradient_steps,
                    retrain_recent_fraction,
                    retrain_recent,
                    retrain_sigma,
                    retrain_every,
                    rebaseline_after,
                    rebaseline_tolerance,
                    rebaseline_margin,
                    rebaseline_rollback: !no_rollback,
                    reprobe_after,
                    serving_hysteresis,
                    retrain_shrink,
                    retrain_eval_every,
                    oracle: !no_oracle,
                    disturbed_reference,
                    servable_only,
                    servable_tolerance,
                    bus,
                    bus_pace_ms,
                    bus_settings: bus_set,
                    out: out.clone(),
                    ..Default::default()
                };
                let r = bench::serve::run(&opts)?;
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
                let path = bench::write_json(&out, "serve.json", &serde_json::to_value(&r)?)?;
                println!("wrote {path} and {}", out.join("serve-curve.svg").display());
            }
            BenchCommand::Embed {
                out,
                meta,
                episodes,
                steps_per_episode,
                seed,
            } => {
                aware_shared::telemetry::init_tracing(aware_shared::config::LogFormat::Text)?;
                let opts = bench::embed::EmbedBenchOptions {
                    out: out.clone(),
                    meta,
                    episodes,
                    steps_per_episode,
                    seed,
                    ..Default::default()
                };
                let r = bench::embed::run(&opts)?;
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
            }
            BenchCommand::Adapt {
                out,
                meta,
                apps,
                seed,
                episodes,
                steps_per_episode,
                gradient_steps,
                fallback_episodes,
                source_index,
                repeats,
                source_max_episodes,
                meta_iterations,
                no_scratch,
                embedding_refresh,
                fine_tune_sigma,
                tl_fine_tune_sigma,
                critic_warmup,
            } => {
                aware_shared::telemetry::init_tracing(aware_shared::config::LogFormat::Text)?;
                let defaults = bench::adapt::AdaptBenchOptions::default();
                let opts = bench::adapt::AdaptBenchOptions {
                    out: out.clone(),
                    meta,
                    apps,
                    seed,
                    episodes,
                    steps_per_episode,
                    gradient_steps,
                    fallback_episodes,
                    source_index,
                    repeats,
                    source_max_episodes,
                    scratch: !no_scratch,
                    embedding_refresh,
                    fine_tune_sigma,
                    tl_fine_tune_sigma,
                    critic_warmup_episodes: critic_warmup,
                    train: aware_cli::train_meta::TrainMetaOptions {
                        iterations: meta_iterations,
                        ..defaults.train.clone()
                    },
                    ..defaults
                };
                let r = bench::adapt::run(&opts)?;
                for s in &r.sources {
                    println!(
                        "r{} {:>8} source agent on {}: {} episodes ({}), final reward {:.3}/step, {:.1} CPU-s",
                        s.repeat,
                        s.arm,
                        s.app,
                        s.episodes,
                        if s.converged { "plateau" } else { "episode cap" },
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
                let path = bench::write_json(&out, "adapt.json", &serde_json::to_value(&r)?)?;
                println!("wrote {path} and {}", out.join("adapt-curve.svg").display());
            }
            BenchCommand::Sim {
                out,
                runs,
                targets,
                steps,
            } => {
                let opts = aware_loadgen::bench::SimBenchOptions {
                    out_dir: out,
                    runs,
                    targets,
                    steps,
                    ..Default::default()
                };
                let r = aware_loadgen::bench::bench_sim(&opts)?;
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
            }
            BenchCommand::Store {
                out,
                rows,
                keep,
                steps_per_episode,
                sample,
                runs,
            } => {
                let opts = bench::store::StoreBenchOptions {
                    out: out.clone(),
                    rows,
                    keep,
                    steps_per_episode,
                    sample,
                    runs,
                    ..Default::default()
                };
                let r = bench::store::run(&opts)?;
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
                let path = bench::write_json(&out, "store.json", &serde_json::to_value(&r)?)?;
                println!("wrote {path}");
            }
            BenchCommand::Bus {
                out,
                messages,
                runs,
                rate,
                latency_secs,
                nats,
                skip_nats,
            } => {
                aware_shared::telemetry::init_tracing(aware_shared::config::LogFormat::Text)?;
                let opts = bench::bus::BusBenchOptions {
                    messages,
                    runs,
                    rate,
                    latency_secs,
                    nats_url: nats,
                    skip_nats,
                };
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?;
                let results = rt.block_on(bench::bus::run(&opts))?;
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
                let path = bench::write_json(&out, "bus.json", &serde_json::to_value(&results)?)?;
                println!("wrote {path}");
            }
        },
        Command::Schemas { write } => match write {
            Some(dir) => {
                let written = aware_bus_schemas::generated::write_all(&dir)
                    .with_context(|| format!("writing generated files under {}", dir.display()))?;
                for w in written {
                    println!("wrote {w}");
                }
            }
            None => {
                for kind in aware_bus_schemas::EventKind::ALL {
                    print!("{}", aware_bus_schemas::generated::json_schema(kind));
                }
            }
        },
        Command::Demo {
            apps,
            seed,
            episodes,
            steps_per_episode,
            print_every,
            pace_ms,
            meta,
            no_meta,
            meta_iterations,
            settings,
            out,
        } => {
            aware_shared::telemetry::init_tracing_at(
                aware_shared::config::LogFormat::Text,
                "warn",
            )?;
            let opts = aware_cli::demo::DemoOptions {
                generated_apps: apps,
                seed,
                episodes,
                steps_per_episode,
                print_every,
                out_dir: out,
                pace: std::time::Duration::from_millis(pace_ms),
                meta: match (meta, no_meta) {
                    (Some(dir), _) => aware_cli::demo::DemoMeta::Dir(dir),
                    (None, true) => aware_cli::demo::DemoMeta::Off,
                    (None, false) => aware_cli::demo::DemoMeta::trained(meta_iterations),
                },
                settings,
                ..Default::default()
            };
            let system = actix_rt::System::new();
            system.block_on(async move {
                let mut stdout = std::io::stdout();
                aware_cli::demo::run(&opts, &mut stdout).await
            })?;
        }
        Command::Crd => print!("{}", aware_controller::crd::crd_yaml()?),
        Command::TrainMeta {
            apps,
            iterations,
            seed,
            out,
            resume,
            checkpoint_every,
            steps_per_episode,
            hidden,
            bundle,
            apps_per_iteration,
            updates_per_iteration,
            base_updates_per_iteration,
            fine_tune_sigma,
            restarts,
        } => {
            aware_shared::telemetry::init_tracing(aware_shared::config::LogFormat::Text)?;
            let d = aware_cli::train_meta::TrainMetaOptions::default();
            let opts = aware_cli::train_meta::TrainMetaOptions {
                apps,
                iterations,
                seed,
                out: out.clone(),
                resume,
                checkpoint_every,
                steps_per_episode,
                apps_per_iteration,
                updates_per_iteration,
                base_updates_per_iteration,
                fine_tune_sigma,
                restarts,
                meta: aware_shared_model::MetaConfig {
                    hidden,
                    fc_hidden: hidden,
                    bundle_size: bundle,
                    ..d.meta.clone()
                },
                ..d
            };
            let log = aware_cli::train_meta::run(&opts)?;
            println!(
                "meta-training: {} iterations in {:.1} s ({} meta-learner parameters); held-out apps: fallback {:.3}/step, meta-trained agent (no fine-tuning) {:.3}/step",
                log.iterations.len(),
                log.train_seconds,
                log.meta_params,
                log.held_out_fallback_mean,
                log.held_out_agent_mean
            );
            println!("wrote {}", out.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(args: &[&str]) -> BenchCommand {
        let argv = ["aware", "bench"].iter().chain(args).copied();
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Bench { bench } => bench,
            _ => unreachable!("parsed a bench command"),
        }
    }

    /// Without flags, the benches run the services' retraining defaults; 0 turns them off.
    #[test]
    fn bench_retraining_flags_default_to_the_services_defaults() {
        let services = bench::bootstrap::services_retraining_defaults();
        assert_eq!(services, (0.5, 10, 2));
        match bench(&["bootstrap"]) {
            BenchCommand::Bootstrap {
                recent_fraction,
                rebaseline_after,
                eval_every,
                ..
            } => assert_eq!((recent_fraction, rebaseline_after, eval_every), services),
            _ => unreachable!(),
        }
        match bench(&["serve"]) {
            BenchCommand::Serve {
                retrain_recent_fraction,
                retrain_recent,
                rebaseline_after,
                retrain_eval_every,
                retrain_gradient_steps,
                retrain_sigma,
                retrain_every,
                ..
            } => {
                assert_eq!(retrain_every, 1, "in process: after every transition");
                assert_eq!(
                    (
                        retrain_recent_fraction,
                        rebaseline_after,
                        retrain_eval_every
                    ),
                    services
                );
                assert_eq!(retrain_recent, 1000, "20 episodes of 50 steps");
                // trainer.retrain_gradient_steps 200 per 50 transitions; σ 0.2 × 0.5.
                assert_eq!(
                    bench::serve::services_retraining_pace(),
                    (retrain_gradient_steps, retrain_sigma)
                );
                assert_eq!((retrain_gradient_steps, retrain_sigma), (4, 0.1));
            }
            _ => unreachable!(),
        }
        match bench(&[
            "serve",
            "--bus",
            "--bus-set",
            "trainer.train_every_transitions=50",
            "--bus-set",
            "actuator.guardrails.cpu_cooldown_ms=0",
        ]) {
            BenchCommand::Serve { bus, bus_set, .. } => {
                assert!(bus);
                assert_eq!(
                    bus_set,
                    vec![
                        (
                            "trainer.train_every_transitions".to_string(),
                            serde_json::json!(50)
                        ),
                        (
                            "actuator.guardrails.cpu_cooldown_ms".to_string(),
                            serde_json::json!(0)
                        )
                    ]
                );
                let mut sections = std::collections::BTreeMap::new();
                sections.insert("trainer".to_string(), serde_json::json!({ "poll_ms": 50 }));
                for (p, v) in bus_set {
                    bench::serve_bus::set_path(&mut sections, &p, v).unwrap();
                }
                assert_eq!(
                    sections["trainer"],
                    serde_json::json!({ "poll_ms": 50, "train_every_transitions": 50 })
                );
                assert_eq!(
                    sections["actuator"],
                    serde_json::json!({ "guardrails": { "cpu_cooldown_ms": 0 } })
                );
                assert!(bench::serve_bus::set_path(&mut sections, "trainer", 1.into()).is_err());
                assert!(
                    bench::serve_bus::set_path(&mut sections, "trainer.poll_ms.x", 1.into())
                        .is_err(),
                    "poll_ms is not an object"
                );
            }
            _ => unreachable!(),
        }
        assert_eq!(
            parse_arm_setting("no_bootstrap:trainer.bc_alpha=25").unwrap(),
            (
                "no_bootstrap".to_string(),
                "trainer.bc_alpha".to_string(),
                serde_json::json!(25)
            )
        );
        assert!(parse_arm_setting("trainer.bc_alpha=25").is_err(), "no arm");
        let e = parse_arm_setting("scratch:trainer.bc_alpha=25").unwrap_err();
        assert!(
            e.contains("unknown arm") && e.contains("no_bootstrap"),
            "{e}"
        );
        assert!(parse_arm_setting("bootstrap:=1").is_err());
        assert!(parse_setting("no_equals").is_err());
        assert!(parse_setting("=1").is_err());
        assert_eq!(
            parse_setting("mode=fast").unwrap(),
            ("mode".to_string(), serde_json::json!("fast"))
        );
        match bench(&[
            "bootstrap",
            "--recent-fraction",
            "0",
            "--rebaseline-after",
            "0",
        ]) {
            BenchCommand::Bootstrap {
                recent_fraction,
                rebaseline_after,
                eval_every,
                ..
            } => assert_eq!((recent_fraction, rebaseline_after, eval_every), (0.0, 0, 2)),
            _ => unreachable!(),
        }
    }
}
