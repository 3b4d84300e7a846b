//! AWARE's stores, as a library the services open: the trajectory store ([`trajectory`]) the
//! recorder writes and the trainer reads.
//!
//! Feature `testing`: the backends' conformance suite and its data builders
//! ([`trajectory::conformance`]) and a real QuestDB server to run it against ([`testkit`]), for
//! tests and benchmarks.

#[cfg(any(test, feature = "testing"))]
pub mod testkit;
pub mod trajectory;
