//! The Kubernetes side of AWARE. For now: the `AwareAutoscaler` custom resource ([`crd`]) and its
//! Kubernetes quantities ([`quantity`]); the controller loop arrives later.

pub mod crd;
pub use aware_shared::quantity;

pub use crd::{AwareAutoscaler, AwareAutoscalerSpec, AwareAutoscalerStatus, CrdError};
