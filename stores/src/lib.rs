//! AWARE's stores, as a library the services open: the trajectory store ([`trajectory`]) the
//! recorder writes and the trainer reads.
//!
//! Feature `testing`: the backends' conformance suite and its data builders
//! ([`trajectory::conformance`]), for tests and benchmarks.

pub mod trajectory;
