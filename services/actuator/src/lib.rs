//! actuator: applies actions to the sink (simulator or Kubernetes) within guardrails and publishes `applied`.
//!
//! Wired into the bus: it consumes its events (counted, malformed ones dropped and counted) and
//! serves /metrics, /healthz, /readyz. Its control-loop logic arrives with the [control-loop] issue.

pub mod guardrails;
pub mod sink;

use aware_bus_schemas::EventKind;
use aware_shared::launcher::ServiceEntry;
use aware_shared::service::{ServiceContext, ServiceError};

pub const NAME: &str = "actuator";
pub const CONSUMES: &[EventKind] = &[EventKind::Action];
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
};

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    aware_shared::agents::run_intake(&ctx, CONSUMES).await
}
