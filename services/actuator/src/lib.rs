//! actuator: applies actions to the sink (simulator or Kubernetes) within guardrails and publishes `applied`.
//!
//! See [`service`] for the service, [`guardrails`] for the rules every action passes and [`sink`]
//! for the Kubernetes API calls.

pub mod guardrails;
pub mod service;
pub mod sink;

use aware_bus_schemas::EventKind;
use aware_shared::launcher::ServiceEntry;
use aware_shared::service::{ServiceContext, ServiceError};

pub const NAME: &str = "actuator";
/// `target` carries the controller's registrations (bounds, update mode; a deregistration
/// rejects what is still in flight); `obs` the collector's steps (the only steps an action is
/// decided for) and, with the simulator sink, the allocation in force.
pub const CONSUMES: &[EventKind] = &[EventKind::Action, EventKind::Obs, EventKind::Target];
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(run(ctx)),
    notice: None,
    sharded: true,
};

/// Runs the service until shutdown.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    service::run(ctx).await
}
