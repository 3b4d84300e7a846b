//! Error type of the simulator.

use std::path::PathBuf;

/// Everything that can go wrong in the simulator. Every variant names the offending input.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A trace file row could not be parsed.
    #[error("{path}:{line}: {reason}")]
    TraceRow {
        /// File the row came from (or `<memory>`).
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the row.
        reason: String,
    },
    /// A trace had no usable rows or an invalid header.
    #[error("trace {path}: {reason}")]
    Trace {
        /// File the trace came from.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("i/o error on {path}: {source}")]
    Io {
        /// File involved.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An app or simulation configuration is invalid.
    #[error("invalid config: {0}")]
    Config(String),
    /// A YAML app file could not be parsed.
    #[error("yaml error in {path}: {source}")]
    Yaml {
        /// File or `<memory>`.
        path: String,
        /// Underlying error.
        #[source]
        source: serde_norway::Error,
    },
    /// A JSON app file could not be parsed or written.
    #[error("json error in {path}: {source}")]
    Json {
        /// File or `<memory>`.
        path: String,
        /// Underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// A target name or index does not exist.
    #[error("unknown target {0}")]
    UnknownTarget(String),
    /// An action arrived for a step other than the current one.
    #[error("action for target {target} is for step {got}, the simulator is at step {expected}")]
    StepMismatch {
        /// Target name.
        target: String,
        /// Step the simulator is at.
        expected: u64,
        /// Step named by the action.
        got: u64,
    },
    /// The number of actions does not match the number of targets.
    #[error("expected {expected} actions (one per target), got {got}")]
    ActionCount {
        /// Number of targets.
        expected: usize,
        /// Number of actions given.
        got: usize,
    },
    /// A lock guarding shared simulator state was poisoned by a panicking thread.
    #[error("simulator state lock poisoned")]
    Poisoned,
    /// The metrics HTTP server failed.
    #[error("metrics server: {0}")]
    Server(String),
}

impl SimError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SimError::Io {
            path: path.into(),
            source,
        }
    }
}
