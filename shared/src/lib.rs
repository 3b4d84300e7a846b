//! Common code of the AWARE services: the bus (NATS and in-process), configuration, telemetry
//! and the service runtime (per-target actix actors, health endpoints, graceful shutdown).

pub mod agents;
pub mod bus;
pub mod cli;
pub mod config;
pub mod forget;
#[cfg(feature = "kube-mock")]
pub mod kube_mock;
pub mod launcher;
pub mod model_store;
pub mod probe;
pub mod quantity;
pub mod registry;
pub mod service;
pub mod slow_consumers;
pub mod spec;
pub mod telemetry;
pub mod testkit;
