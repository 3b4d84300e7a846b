//! The Kubernetes side of AWARE: the `AwareAutoscaler` custom resource ([`crd`]) and the
//! controller ([`controller`]) that registers each object's Deployment with the services over the
//! bus, writes status from their events and deregisters on deletion (finalizer).

pub mod controller;
pub mod crd;
pub mod leader;
pub use aware_shared::quantity;

pub use crd::{AwareAutoscaler, AwareAutoscalerSpec, AwareAutoscalerStatus, CrdError};

use aware_shared::launcher::ServiceEntry;

pub const NAME: &str = "controller";
pub const ENTRY: ServiceEntry = ServiceEntry {
    name: NAME,
    main: |ctx| Box::pin(controller::run(ctx)),
    notice: None,
    // One leader serves the whole cluster.
    sharded: false,
};
