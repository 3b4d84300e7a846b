//! metrics-collector: reads metrics, computes each target's state and reward, publishes `obs`.
//!
//! Sources (`collector.source`): `simulator` (the simulated cluster, see [`simulator`]);
//! `prometheus` (the Prometheus HTTP API, see [`prometheus`]); `none` (idle).

pub mod metrics;
pub mod prometheus;
pub mod simulator;

use aware_bus_schemas::EventKind;
use aware_shared::config::SourceKind;
use aware_shared::launcher::ServiceEntry;
use aware_shared::service::{ServiceContext, ServiceError};

pub const NAME: &str = "metrics-collector";
/// The simulator source consumes `applied` (the actuator's decisions).
pub const CONSUMES: &[EventKind] = &[EventKind::Applied];
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
};

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let metrics = metrics::CollectorMetrics::new(&ctx.metrics)?;
    match ctx.config.collector.source {
        SourceKind::None => aware_shared::agents::run_intake(&ctx, &[]).await,
        SourceKind::Simulator => simulator::run(ctx, metrics).await,
        SourceKind::Prometheus => prometheus::run(ctx, metrics).await,
    }
}
