//! Starts one or more services in this process: one bus connection, one actix system, one HTTP
//! endpoint for all of them, one pool of arbiters for their per-target actors
//! ([`crate::arbiters`], `actors.arbiters`), graceful shutdown on SIGINT/SIGTERM.

use std::sync::Arc;

use futures::future::LocalBoxFuture;
use tokio_util::sync::CancellationToken;

use crate::arbiters::{arbiters_for, ArbiterError, ArbiterPool};
use crate::bus::Bus;
use crate::config::AppConfig;
use crate::service::{ServiceContext, ServiceError};
use crate::telemetry::{serve_http, HttpState};

/// A service's entry point.
pub type ServiceMain = fn(ServiceContext) -> LocalBoxFuture<'static, Result<(), ServiceError>>;

/// A service that can be launched.
#[derive(Clone, Copy)]
pub struct ServiceEntry {
    pub name: &'static str,
    pub main: ServiceMain,
    /// What the service says at start about its configuration, before anything runs (e.g. the
    /// collector with no source: nothing to manage); `None` when it has nothing to say.
    pub notice: Option<fn(&AppConfig) -> Option<String>>,
    /// A per-target service: it serves the targets of its shard (`shard`, ADR 0021) and reports
    /// `aware_shards{shard}` (the count, labelled by its index) for the alerting rules, which find
    /// a missing shard, one run twice and instances that split the targets differently.
    pub sharded: bool,
}

/// Handle on services started by [`start`].
pub struct Running {
    pub bus: Bus,
    pub http_addr: std::net::SocketAddr,
    pub contexts: Vec<ServiceContext>,
    tasks: Vec<tokio::task::JoinHandle<Result<(), ServiceError>>>,
    arbiters: Option<ArbiterPool>,
}

/// How long [`Running::join`] waits for the actor arbiters' threads once every service ended:
/// an arbiter ends at once unless a blocking task it spawned is still running.
const ARBITERS_STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Running {
    /// Waits for every service to end (after `shutdown` is cancelled). A service that fails,
    /// at start-up or later, stops the others at once (each waited for concurrently, so a
    /// failure of any service is seen, not only of the first): the first failure wins, naming
    /// its service. The actor arbiters are stopped once every service has ended.
    pub async fn join(self) -> Result<(), ServiceError> {
        use futures::StreamExt as _;
        let mut pending: futures::stream::FuturesUnordered<_> = self
            .tasks
            .into_iter()
            .enumerate()
            .map(|(i, task)| async move { (i, task.await) })
            .collect();
        let mut first = Ok(());
        while let Some((i, res)) = pending.next().await {
            let service = self.contexts[i].name;
            let res = match res {
                Ok(r) => r,
                Err(source) => Err(ServiceError::Task {
                    task: "service",
                    source,
                }),
            };
            if let Err(e) = res {
                tracing::error!(service, error = %e, "service failed: stopping the others");
                for ctx in &self.contexts {
                    ctx.shutdown.cancel();
                }
                if first.is_ok() {
                    first = Err(ServiceError::Failed {
                        service,
                        source: Box::new(e),
                    });
                }
            }
        }
        if let Some(arbiters) = &self.arbiters {
            arbiters.stop(ARBITERS_STOP_TIMEOUT).await;
        }
        if let Err(e) = self.bus.flush().await {
            tracing::warn!(error = %e, "final bus flush failed");
        }
        first
    }

    /// The actor arbiters of the process, if it has any.
    pub fn arbiters(&self) -> Option<&ArbiterPool> {
        self.arbiters.as_ref()
    }
}

/// Connects the bus, serves HTTP, starts the actor arbiters and spawns every service as a local
/// task of the current actix system. Services stop when `shutdown` is cancelled.
pub async fn start(
    config: Arc<AppConfig>,
    entries: &[ServiceEntry],
    shutdown: CancellationToken,
) -> Result<Running, ServiceError> {
    let client_name = format!(
        "aware-{}",
        entries.iter().map(|e| e.name).collect::<Vec<_>>().join("+")
    );
    let bus = Bus::connect(&config.bus, &client_name).await?;
    start_on(bus, config, entries, shutdown).await
}

/// As [`start`], on an existing bus (e.g. a shared in-process bus in tests).
pub async fn start_on(
    bus: Bus,
    config: Arc<AppConfig>,
    entries: &[ServiceEntry],
    shutdown: CancellationToken,
) -> Result<Running, ServiceError> {
    let arbiters = match ArbiterPool::start(arbiters_for(config.actors.arbiters)) {
        Ok(pool) => {
            tracing::info!(
                arbiters = pool.len(),
                "per-target actors spread over arbiters"
            );
            Some(pool)
        }
        // Outside an actix system (never for the service binaries): actors on the caller's thread.
        Err(ArbiterError::NoSystem) => None,
        Err(e) => return Err(ServiceError::resource("actors.arbiters", e)),
    };
    let contexts = entries
        .iter()
        .map(|e| {
            let ctx = ServiceContext::new(e.name, bus.clone(), config.clone(), shutdown.clone())?
                .with_arbiters(arbiters.clone());
            if e.sharded {
                ctx.report_shard()?;
            }
            Ok::<_, ServiceError>(ctx)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let state = HttpState {
        metrics: contexts.iter().map(|c| c.metrics.clone()).collect(),
        ready: contexts
            .iter()
            .map(|c| (c.name.to_string(), c.ready.clone()))
            .collect(),
        bus: Some(bus.clone()),
    };
    let http_addr = serve_http(&config.http.listen, state, shutdown.clone()).await?;
    let tasks = entries
        .iter()
        .zip(&contexts)
        .map(|(e, ctx)| {
            tracing::info!(service = e.name, bus = bus.kind(), "starting");
            actix_rt::spawn((e.main)(ctx.clone()))
        })
        .collect();
    Ok(Running {
        bus,
        http_addr,
        contexts,
        tasks,
        arbiters,
    })
}

/// Runs `entries` until SIGINT/SIGTERM on a new actix system: the body of every service binary.
pub fn run_blocking(config: AppConfig, entries: &[ServiceEntry]) -> Result<(), ServiceError> {
    let system = actix_rt::System::new();
    let res = system.block_on(async move {
        let shutdown = CancellationToken::new();
        crate::service::cancel_on_signal(shutdown.clone());
        let running = start(Arc::new(config), entries, shutdown).await?;
        // Tools and tests read this line to find the endpoints when `http.listen` uses port 0.
        println!("aware: listening on http://{}", running.http_addr);
        running.join().await
    });
    tracing::info!("stopped");
    res
}

/// Errors of a service binary's start-up.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TelemetryError),
    #[error(transparent)]
    Service(#[from] ServiceError),
}

/// The whole `main` of a service binary: load configuration (flags last), start telemetry, run.
pub fn main(args: &crate::cli::ConfigArgs, entries: &[ServiceEntry]) -> Result<(), LaunchError> {
    let cfg = crate::config::load(&args.sources()?)?;
    crate::telemetry::init_tracing(cfg.log.format)?;
    for (key, hint) in cfg.unused_keys() {
        tracing::warn!(%key, "{hint}");
    }
    for note in entries.iter().filter_map(|e| e.notice?(&cfg)) {
        tracing::warn!("{note}");
    }
    run_blocking(cfg, entries)?;
    Ok(())
}
