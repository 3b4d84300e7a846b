//! AWARE integration tests (one binary). They start real servers (`nats-server`) on free ports.

mod bus_conformance;
mod jetstream;
mod run_all;
mod service_http;
