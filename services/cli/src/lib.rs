//! The `aware` command's library: the product commands' code (`config`, `demo`, `nats-config`,
//! `watch`). The service registry and meta-training live in `aware-harness` (re-exported here),
//! the benchmarks in `aware-bench`.

pub mod config_check;
pub mod demo;
pub mod nats_config;
pub mod watch;

pub use aware_harness::train_meta;
pub use aware_harness::{select_services, service_names, BY_NAME_ONLY, SERVICES};
