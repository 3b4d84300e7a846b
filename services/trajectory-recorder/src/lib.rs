//! trajectory-recorder: joins obs, action and applied into transitions in the trajectory store and publishes `episode`.
//!
//! [`join`] builds transitions and episode summaries, the trajectory store of `aware-stores`
//! keeps them (SQLite embedded, QuestDB in production), [`service`] runs it on the bus.

use aware_bus_schemas::EventKind;
use aware_shared::launcher::ServiceEntry;
use aware_shared::service::{ServiceContext, ServiceError};

pub mod join;
pub mod service;

pub const NAME: &str = "trajectory-recorder";
/// What the recorder reads: the three halves of a transition, and registrations (a deleted
/// target's floor released, its actor retired).
pub const CONSUMES: &[EventKind] = &[
    EventKind::Obs,
    EventKind::Action,
    EventKind::Applied,
    EventKind::Target,
];
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
