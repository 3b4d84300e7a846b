//! Simulated cluster for AWARE.
pub mod app;
pub mod cluster;
pub mod error;
pub mod load;
pub mod segments;
pub use error::SimError;
pub mod bench;
pub mod env;
pub mod oracle;
pub mod run;
pub mod scenario;
pub mod wallclock;
