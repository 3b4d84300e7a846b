//! AWARE integration tests (one binary). They start real servers (`nats-server`) on free ports.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bootstrap_loop;
mod bus_conformance;
mod control_loop;
mod jetstream;
mod loop_nats;
mod meta_loop;
mod model_store_nats;
mod prometheus_source;
mod registration;
mod rl_loop;
mod run_all;
mod service_http;
