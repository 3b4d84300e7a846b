//! trajectory-recorder: joins obs, action and applied into transitions in the trajectory store and publishes `episode`.
//!
//! Wired into the bus: it consumes its events (counted, malformed ones dropped and counted) and
//! serves /metrics, /healthz, /readyz. Its control-loop logic arrives with the [control-loop] issue.

use aware_bus_schemas::EventKind;
use aware_shared::launcher::ServiceEntry;
use aware_shared::service::{ServiceContext, ServiceError};

pub mod store;

pub const NAME: &str = "trajectory-recorder";
pub const CONSUMES: &[EventKind] = &[EventKind::Obs, EventKind::Action, EventKind::Applied];
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
};

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    aware_shared::agents::run_intake(&ctx, CONSUMES).await
}
