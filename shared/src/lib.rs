//! Common code of the AWARE services: the bus (NATS and in-process), configuration, telemetry
//! and the service runtime (per-target actix actors, health endpoints, graceful shutdown).
//!
//! Feature `testing` (tests and benchmarks only): `testkit`, `probe` and `kube_mock`.

pub mod agents;
pub mod arbiters;
pub mod bus;
pub mod cli;
pub mod config;
pub mod forget;
#[cfg(feature = "testing")]
pub mod kube_mock;
pub mod launcher;
pub mod model_store;
#[cfg(any(test, feature = "testing"))]
pub mod probe;
pub mod quantity;
pub mod registry;
pub mod service;
pub mod slow_consumers;
pub mod spec;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testkit;
