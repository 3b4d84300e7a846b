//! `aware`: run the services, check the configuration, watch the bus, the demo, meta-training,
//! the simulator alone; `aware bench …` hands over to the benchmarks (`aware-bench`).

use std::path::PathBuf;

use anyhow::{bail, Context};
use aware_bench::cli::BenchCommand;
use aware_cli::demo::DemoArgs;
use aware_harness::train_meta::TrainMetaArgs;
use aware_shared::cli::ConfigArgs;
use aware_shared::config::LogFormat;
use clap::{Args, Parser, Subcommand};

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
        nkeys: Option<PathBuf>,
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
    /// With --write-default: regenerate the default the binaries ship (models/meta-default).
    TrainMeta(TrainMetaArgs),
    /// Print the JSON Schemas of the bus messages, or write them and the golden fixtures.
    Schemas {
        /// Write `schemas/` and `fixtures/` under this directory (the bus-schemas crate).
        #[arg(long, value_name = "DIR")]
        write: Option<PathBuf>,
    },
    /// Run the simulated cluster alone with a fixed policy (or the oracle); JSON lines per step.
    Sim(SimArgs),
    /// The main job: a simulated cluster managed end to end on the embedded bus (bootstrap
    /// behind HPA/VPA → ONLINE → SERVING); live progress, then demo-summary.json and plots.
    Demo(DemoArgs),
    /// Print the AwareAutoscaler CRD YAML (`deploy/crd/awareautoscalers.aware.dev.yaml`).
    Crd,
}

/// `aware sim`.
#[derive(Debug, Args)]
struct SimArgs {
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
    /// Policy: hold, random, hpa, oracle (the paper's reward), oracle-cheapest (per step the
    /// cheapest allocation meeting the SLO given the true load).
    #[arg(long, default_value = "hold")]
    policy: String,
    /// HPA target CPU utilization (policy hpa).
    #[arg(long, default_value_t = 0.7)]
    target_cpu_util: f64,
    /// Price of a core-hour (policy oracle-cheapest; default: AWS Fargate on-demand, us-east-1).
    #[arg(long)]
    core_price: Option<f64>,
    /// Price of a GiB-hour (policy oracle-cheapest; default: AWS Fargate on-demand, us-east-1).
    #[arg(long)]
    gib_price: Option<f64>,
    /// Also compute the oracle's bound along the trajectory.
    #[arg(long)]
    with_oracle: bool,
    /// Write the per-step JSON lines here instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run { service, config } => {
            let Some(entries) = aware_cli::select_services(&service) else {
                bail!(
                    "unknown service `{service}`; expected one of: {}",
                    aware_cli::service_names().join(", ")
                );
            };
            aware_shared::launcher::main(&config, &entries)?;
        }
        Command::Config { config } => print_config(&config)?,
        Command::NatsConfig { nkeys, config } => nats_config(nkeys, &config)?,
        Command::Watch {
            subject,
            limit,
            config,
        } => watch(&subject, limit, &config)?,
        Command::Bench { bench } => aware_bench::cli::run(bench)?,
        Command::TrainMeta(args) => train_meta(args)?,
        Command::Schemas { write } => schemas(write)?,
        Command::Sim(args) => sim(args)?,
        Command::Demo(args) => {
            aware_shared::telemetry::init_tracing_at(LogFormat::Text, "warn")?;
            let opts = args.options();
            actix_rt::System::new().block_on(async move {
                aware_cli::demo::run(&opts, &mut std::io::stdout()).await
            })?;
        }
        Command::Crd => print!("{}", aware_controller::crd::crd_yaml()?),
    }
    Ok(())
}

fn print_config(config: &ConfigArgs) -> anyhow::Result<()> {
    let cfg = aware_shared::config::load(&config.sources()?)?;
    for (_, hint) in cfg.unused_keys() {
        eprintln!("warning: {hint}");
    }
    let effective = aware_cli::config_check::effective(&cfg)?;
    println!("{}", serde_json::to_string_pretty(&effective)?);
    Ok(())
}

fn nats_config(nkeys: Option<PathBuf>, config: &ConfigArgs) -> anyhow::Result<()> {
    let cfg = aware_shared::config::load(&config.sources()?)?;
    let text = match &nkeys {
        Some(dir) => aware_cli::nats_config::with_nkeys(&cfg, dir)?,
        None => aware_cli::nats_config::with_passwords(&cfg)?,
    };
    print!("{text}");
    eprint!("{}", aware_cli::nats_config::client_settings());
    Ok(())
}

fn watch(subject: &str, limit: Option<usize>, config: &ConfigArgs) -> anyhow::Result<()> {
    let cfg = aware_shared::config::load(&config.sources()?)?;
    aware_shared::telemetry::init_tracing(cfg.log.format)?;
    if cfg.bus.url == aware_shared::bus::EMBEDDED {
        bail!(
            "`aware watch` needs a NATS bus: pass --bus nats://HOST:4222 (or set AWARE_BUS__URL)"
        );
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
        aware_cli::watch::watch(&bus, subject, &mut out, limit, stop).await?;
        anyhow::Ok(())
    })
}

/// The policy `aware sim` runs, from its flags.
fn sim_policy(args: &SimArgs) -> anyhow::Result<aware_loadgen::run::PolicySpec> {
    use aware_loadgen::run::PolicySpec;
    if (args.core_price.is_some() || args.gib_price.is_some()) && args.policy != "oracle-cheapest" {
        bail!("--core-price and --gib-price apply to --policy oracle-cheapest only");
    }
    Ok(match args.policy.as_str() {
        "hold" => PolicySpec::Hold,
        "random" => PolicySpec::Random { seed: args.seed },
        "hpa" => PolicySpec::Hpa {
            target_cpu_util: args.target_cpu_util,
        },
        "oracle" => PolicySpec::Oracle,
        "oracle-cheapest" => {
            let d = aware_loadgen::oracle::Prices::default();
            let prices = aware_loadgen::oracle::Prices {
                core_hour: args.core_price.unwrap_or(d.core_hour),
                gib_hour: args.gib_price.unwrap_or(d.gib_hour),
            };
            for (flag, p) in [
                ("--core-price", prices.core_hour),
                ("--gib-price", prices.gib_hour),
            ] {
                if !(p.is_finite() && p >= 0.0) {
                    bail!("{flag} {p} must be a price ≥ 0");
                }
            }
            PolicySpec::OracleCheapest { prices }
        }
        other => {
            bail!("unknown policy `{other}`; expected hold, random, hpa, oracle or oracle-cheapest")
        }
    })
}

fn sim(args: SimArgs) -> anyhow::Result<()> {
    use aware_loadgen::run::{run_sim, AppSource, RunSimOptions};
    let policy = sim_policy(&args)?;
    let opts = RunSimOptions {
        apps: match args.app_file {
            Some(path) => AppSource::File { path },
            None => AppSource::Generate {
                count: args.apps,
                seed: args.seed,
            },
        },
        steps: args.steps,
        policy,
        config: aware_loadgen::env::SimConfig {
            seed: args.seed,
            ..Default::default()
        },
        with_oracle: args.with_oracle,
        ..Default::default()
    };
    let report = match args.out {
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
    Ok(())
}

fn schemas(write: Option<PathBuf>) -> anyhow::Result<()> {
    match write {
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
    }
    Ok(())
}

fn train_meta(args: TrainMetaArgs) -> anyhow::Result<()> {
    aware_shared::telemetry::init_tracing(LogFormat::Text)?;
    let write_default = args.write_default.clone();
    let opts = args.into_options();
    if let Some(dir) = write_default {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !parent.is_dir() {
                bail!(
                    "--write-default {}: no {} here (run it from the repository's root, or name the directory)",
                    dir.display(),
                    parent.display()
                );
            }
        }
        let m = aware_harness::default_meta::write_default(&opts, &dir)?;
        println!(
            "default meta-learner: trained in {:.1} s (kept restart {}, iteration {}); held-out apps: fallback {:.3}/step, meta-trained agent {:.3}/step; fingerprint {}",
            m.train_seconds,
            m.kept_restart,
            m.best_iteration,
            m.held_out_fallback_mean,
            m.held_out_agent_mean,
            m.fingerprint
        );
        println!(
            "wrote {} (and the full training in {}); rebuild to embed it",
            dir.display(),
            opts.out.display()
        );
        return Ok(());
    }
    let log = aware_harness::train_meta::run(&opts)?;
    println!(
        "meta-training: {} iterations in {:.1} s ({} meta-learner parameters); held-out apps: fallback {:.3}/step, meta-trained agent (no fine-tuning) {:.3}/step",
        log.iterations.len(),
        log.train_seconds,
        log.meta_params,
        log.held_out_fallback_mean,
        log.held_out_agent_mean
    );
    println!("wrote {}", opts.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_bench::{adapt, bootstrap, bus, control_loop, embed, serve, state, store};

    fn parse(args: &[&str]) -> Command {
        let argv = std::iter::once("aware").chain(args.iter().copied());
        Cli::try_parse_from(argv).unwrap().command
    }

    fn bench(args: &[&str]) -> BenchCommand {
        let argv: Vec<&str> = std::iter::once("bench")
            .chain(args.iter().copied())
            .collect();
        match parse(&argv) {
            Command::Bench { bench } => bench,
            _ => unreachable!("parsed a bench command"),
        }
    }

    /// Without flags every bench runs its options' defaults (and `--out` is `bench-out`).
    #[test]
    fn bench_commands_without_flags_parse_to_the_defaults() {
        let same = |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| {
            assert_eq!(format!("{a:?}"), format!("{b:?}"))
        };
        match bench(&["serve"]) {
            BenchCommand::Serve(o) => same(&o, &serve::ServeBenchOptions::default()),
            _ => unreachable!(),
        }
        match bench(&["bootstrap"]) {
            BenchCommand::Bootstrap(a) => {
                same(&a.options(), &bootstrap::BootstrapBenchOptions::default())
            }
            _ => unreachable!(),
        }
        match bench(&["adapt"]) {
            BenchCommand::Adapt(a) => same(&a.options(), &adapt::AdaptBenchOptions::default()),
            _ => unreachable!(),
        }
        match bench(&["embed"]) {
            BenchCommand::Embed(o) => same(&o, &embed::EmbedBenchOptions::default()),
            _ => unreachable!(),
        }
        match bench(&["store"]) {
            BenchCommand::Store(o) => same(&o, &store::StoreBenchOptions::default()),
            _ => unreachable!(),
        }
        match bench(&["bus"]) {
            BenchCommand::Bus(a) => {
                same(&a.options, &bus::BusBenchOptions::default());
                assert_eq!(a.out, PathBuf::from("bench-out"));
            }
            _ => unreachable!(),
        }
        match bench(&["state"]) {
            BenchCommand::State(a) => same(&a.options, &state::StateBenchOptions::default()),
            _ => unreachable!(),
        }
        match bench(&["loop"]) {
            BenchCommand::Loop(a) => same(&a.options, &control_loop::LoopBenchOptions::default()),
            _ => unreachable!(),
        }
        match bench(&["sim"]) {
            BenchCommand::Sim(a) => same(
                &a.options(),
                &aware_loadgen::bench::SimBenchOptions::default(),
            ),
            _ => unreachable!(),
        }
    }

    /// `aware sim --policy oracle-cheapest` runs the SLO-constrained oracle at the default
    /// prices or the ones given; prices are refused when negative, not finite, or given to
    /// another policy.
    #[test]
    fn sim_selects_the_slo_constrained_oracle_and_checks_its_prices() {
        use aware_loadgen::oracle::Prices;
        use aware_loadgen::run::PolicySpec;
        let sim = |args: &[&str]| {
            let cli = Cli::try_parse_from(["aware", "sim"].iter().chain(args)).unwrap();
            let Command::Sim(a) = cli.command else {
                unreachable!()
            };
            sim_policy(&a).map_err(|e| e.to_string())
        };
        assert_eq!(
            sim(&["--policy", "oracle-cheapest"]).unwrap(),
            PolicySpec::OracleCheapest {
                prices: Prices::default()
            }
        );
        assert_eq!(
            sim(&[
                "--policy",
                "oracle-cheapest",
                "--core-price",
                "1",
                "--gib-price",
                "0"
            ])
            .unwrap(),
            PolicySpec::OracleCheapest {
                prices: Prices {
                    core_hour: 1.0,
                    gib_hour: 0.0
                }
            }
        );
        let e = sim(&["--policy", "oracle-cheapest", "--gib-price=-1"]).unwrap_err();
        assert!(e.contains("--gib-price -1"), "{e}");
        let e = sim(&["--policy", "oracle-cheapest", "--core-price", "NaN"]).unwrap_err();
        assert!(e.contains("--core-price NaN"), "{e}");
        let e = sim(&["--policy", "hpa", "--core-price", "1"]).unwrap_err();
        assert!(e.contains("oracle-cheapest only"), "{e}");
        let e = sim(&["--policy", "cheapest"]).unwrap_err();
        assert!(e.contains("oracle-cheapest"), "{e}");
        assert_eq!(sim(&["--policy", "oracle"]).unwrap(), PolicySpec::Oracle);
    }

    /// Without flags, the benches run the services' retraining defaults; 0 turns them off.
    #[test]
    fn bench_retraining_flags_default_to_the_services_defaults() {
        let services = bootstrap::services_retraining_defaults();
        assert_eq!(services, (0.5, 10, 2));
        let BenchCommand::Bootstrap(b) = bench(&["bootstrap"]) else {
            unreachable!()
        };
        let o = b.options();
        assert_eq!(
            (o.recent_fraction, o.rebaseline_after, o.eval_every),
            services
        );
        let BenchCommand::Serve(o) = bench(&["serve"]) else {
            unreachable!()
        };
        assert_eq!(o.retrain_every, 1, "in process: after every transition");
        assert_eq!(
            (
                o.retrain_recent_fraction,
                o.rebaseline_after,
                o.retrain_eval_every
            ),
            services
        );
        assert_eq!(o.retrain_recent, 1000, "20 episodes of 50 steps");
        // trainer.retrain_gradient_steps 200 per 50 transitions; σ 0.2 × 0.5.
        assert_eq!(
            serve::services_retraining_pace(),
            (o.retrain_gradient_steps, o.retrain_sigma)
        );
        assert_eq!((o.retrain_gradient_steps, o.retrain_sigma), (4, 0.1));
        let BenchCommand::Bootstrap(b) = bench(&[
            "bootstrap",
            "--recent-fraction",
            "0",
            "--rebaseline-after",
            "0",
        ]) else {
            unreachable!()
        };
        let o = b.options();
        assert_eq!(
            (o.recent_fraction, o.rebaseline_after, o.eval_every),
            (0.0, 0, 2)
        );
    }

    #[test]
    fn bench_serve_on_the_bus_parses_every_flag() {
        let BenchCommand::Serve(o) = bench(&[
            "serve",
            "--seed",
            "1001",
            "--apps",
            "4",
            "--bus",
            "--bus-pace-ms",
            "60",
            "--bus-set",
            "trainer.train_every_transitions=50",
            "--bus-set",
            "actuator.guardrails.cpu_cooldown_ms=0",
            "--no-oracle",
            "--no-rollback",
            "--servable-only",
            "--retrain-shrink",
            "0.8",
            "--rebaseline-tolerance",
            "0.03",
            "--out",
            "/tmp/x",
        ]) else {
            unreachable!()
        };
        assert!(o.bus);
        assert_eq!((o.seed, o.apps, o.bus_pace_ms), (1001, 4, 60));
        assert_eq!(
            o.bus_settings,
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
        assert!(!o.oracle && !o.rebaseline_rollback && o.servable_only);
        assert_eq!((o.retrain_shrink, o.rebaseline_tolerance), (0.8, 0.03));
        assert_eq!(o.out, PathBuf::from("/tmp/x"));
        let d = serve::ServeBenchOptions::default();
        assert_eq!((o.window, o.train_episodes), (d.window, d.train_episodes));
    }

    #[test]
    fn bench_bootstrap_parses_settings_per_run_and_per_arm() {
        let BenchCommand::Bootstrap(b) = bench(&[
            "bootstrap",
            "--out",
            "o",
            "--bc-alpha",
            "100",
            "--set",
            "trainer.learn_action=applied",
            "--set",
            "trainer.bc_alpha=2",
            "--set-arm",
            "no_bootstrap:trainer.bc_alpha=25",
            "--pace-ms",
            "10",
            "--meta",
            "m",
        ]) else {
            unreachable!()
        };
        let o = b.options();
        assert_eq!(o.bc_alpha, 100.0);
        assert_eq!(o.pace_ms, 10);
        assert_eq!(o.meta, Some(PathBuf::from("m")));
        assert_eq!(o.work, PathBuf::from("o/bootstrap-work"));
        assert_eq!(
            o.settings,
            vec![
                (
                    "trainer.learn_action".to_string(),
                    serde_json::json!("applied")
                ),
                ("trainer.bc_alpha".to_string(), serde_json::json!(2)),
            ]
        );
        assert_eq!(
            o.arm_settings,
            vec![(
                "no_bootstrap".to_string(),
                "trainer.bc_alpha".to_string(),
                serde_json::json!(25)
            )]
        );
        let bad = ["aware", "bench", "bootstrap", "--set-arm", "scratch:x.y=1"];
        let e = Cli::try_parse_from(bad).err().unwrap().to_string();
        assert!(
            e.contains("unknown arm") && e.contains("no_bootstrap"),
            "{e}"
        );
        let bad = ["aware", "bench", "bootstrap", "--set", "no_equals"];
        assert!(Cli::try_parse_from(bad).is_err());
    }

    #[test]
    fn bench_adapt_parses_visible_and_hidden_flags() {
        let BenchCommand::Adapt(a) = bench(&[
            "adapt",
            "--meta",
            "meta-out",
            "--apps",
            "5",
            "--repeats",
            "3",
            "--no-scratch",
            "--critic-warmup",
            "2",
            "--tl-fine-tune-sigma",
            "0.1",
            "--fine-tune-sigma",
            "0.05",
            "--source-index",
            "4",
            "--meta-iterations",
            "7",
        ]) else {
            unreachable!()
        };
        let o = a.options();
        assert_eq!(o.meta, Some(PathBuf::from("meta-out")));
        assert_eq!((o.apps, o.repeats, o.source_index), (5, 3, 4));
        assert!(!o.scratch);
        assert_eq!(o.critic_warmup_episodes, 2);
        assert_eq!((o.tl_fine_tune_sigma, o.fine_tune_sigma), (Some(0.1), 0.05));
        assert_eq!(o.train.iterations, 7);
        let d = adapt::AdaptBenchOptions::default();
        assert_eq!((o.seed, o.episodes), (d.seed, d.episodes));
        assert_eq!(o.train.apps, d.train.apps);
    }

    #[test]
    fn product_commands_parse_to_their_options() {
        let Command::TrainMeta(t) = parse(&["train-meta"]) else {
            unreachable!()
        };
        let o = t.into_options();
        assert_eq!(o.restarts, aware_harness::train_meta::DEFAULT_RESTARTS);
        assert_eq!(o.out, PathBuf::from("meta-out"));
        let d = aware_harness::train_meta::TrainMetaOptions::default();
        assert_eq!(
            aware_harness::train_meta::TrainMetaOptions {
                restarts: d.restarts,
                ..o
            },
            d
        );
        let Command::TrainMeta(t) = parse(&[
            "train-meta",
            "--apps",
            "40",
            "--iterations",
            "200",
            "--hidden",
            "32",
            "--bundle",
            "5",
            "--restarts",
            "1",
            "--resume",
        ]) else {
            unreachable!()
        };
        let o = t.into_options();
        assert_eq!((o.apps, o.iterations, o.restarts), (40, 200, 1));
        assert!(o.resume);
        assert_eq!(
            (o.meta.hidden, o.meta.fc_hidden, o.meta.bundle_size),
            (32, 32, 5)
        );

        let Command::TrainMeta(t) = parse(&["train-meta", "--write-default"]) else {
            unreachable!()
        };
        assert_eq!(t.write_default, Some(PathBuf::from("models/meta-default")));
        // What `aware train-meta` trains without flags is the default `--write-default` accepts.
        let comparable = aware_harness::default_meta::comparable;
        assert_eq!(
            comparable(&t.into_options()),
            comparable(&aware_harness::default_meta::default_options())
        );
        let Command::TrainMeta(t) = parse(&["train-meta", "--write-default", "elsewhere"]) else {
            unreachable!()
        };
        assert_eq!(t.write_default, Some(PathBuf::from("elsewhere")));
        let Command::TrainMeta(t) = parse(&["train-meta"]) else {
            unreachable!()
        };
        assert_eq!(t.write_default, None);
        assert!(
            Cli::try_parse_from(["aware", "train-meta", "--write-default", "--resume"]).is_err()
        );

        let Command::Demo(a) = parse(&["demo"]) else {
            unreachable!()
        };
        assert_eq!(
            format!("{:?}", a.options()),
            format!("{:?}", aware_cli::demo::DemoOptions::default())
        );
        let Command::Demo(a) = parse(&[
            "demo",
            "--apps",
            "2",
            "--pace-ms",
            "5",
            "--no-meta",
            "--set",
            "lifecycle_monitor.probation_episodes=2",
            "--out",
            "d",
        ]) else {
            unreachable!()
        };
        let o = a.options();
        assert_eq!(o.generated_apps, 2);
        assert_eq!(o.pace, std::time::Duration::from_millis(5));
        assert_eq!(o.meta, aware_cli::demo::DemoMeta::Off);
        assert_eq!(o.out_dir, PathBuf::from("d"));
        assert_eq!(
            o.settings,
            vec![(
                "lifecycle_monitor.probation_episodes".to_string(),
                serde_json::json!(2)
            )]
        );
        let Command::Demo(a) = parse(&["demo", "--meta", "m", "--meta-iterations", "9"]) else {
            unreachable!()
        };
        assert_eq!(a.options().meta, aware_cli::demo::DemoMeta::Dir("m".into()));
        assert!(Cli::try_parse_from(["aware", "demo", "--meta", "m", "--no-meta"]).is_err());

        let Command::Sim(s) = parse(&["sim", "--policy", "hpa", "--steps", "10"]) else {
            unreachable!()
        };
        assert_eq!((s.policy.as_str(), s.steps, s.apps), ("hpa", 10, 4));
        assert!(matches!(parse(&["run", "all"]), Command::Run { service, .. } if service == "all"));
        assert!(matches!(parse(&["crd"]), Command::Crd));
    }
}
