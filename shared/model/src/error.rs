//! The crate's one error type.

/// Everything that can go wrong in the model crate. No operation of this crate panics on bad
/// input; it returns one of these.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A state, action, reward, loss or network output was NaN or infinite. From `act` this
    /// means "use the fallback": no action is produced.
    #[error("non-finite value in {what}")]
    NonFinite {
        /// Which value was non-finite.
        what: &'static str,
    },
    /// A vector had the wrong length.
    #[error("{what}: expected dimension {expected}, got {got}")]
    Dimension {
        /// Which vector.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// The configuration is not usable.
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    /// A batch was requested from a replay buffer holding too few transitions.
    #[error("replay buffer holds {len} transitions, need at least {need}")]
    NotEnoughSamples {
        /// Transitions held.
        len: usize,
        /// Transitions needed.
        need: usize,
    },
    /// The checkpoint ended early.
    #[error("checkpoint truncated while reading {0}")]
    Truncated(&'static str),
    /// The checkpoint does not start with the AWARE model magic bytes.
    #[error("not an AWARE model checkpoint (bad magic)")]
    BadMagic,
    /// The checkpoint was written by an unsupported format version.
    #[error("unsupported checkpoint format version {found} (this build reads {supported})")]
    UnsupportedVersion {
        /// Version found in the file.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The checkpoint's checksum does not match its contents.
    #[error("checkpoint checksum mismatch (corrupt file)")]
    Checksum,
    /// The checkpoint header could not be decoded.
    #[error("checkpoint header: {0}")]
    Header(String),
    /// A tensor in the checkpoint does not have the size the checkpoint's config implies.
    #[error("checkpoint tensor #{index}: expected {expected} values, found {found}")]
    ShapeMismatch {
        /// Position of the tensor block in the file.
        index: usize,
        /// Values the config implies.
        expected: usize,
        /// Values in the file.
        found: usize,
    },
    /// Bytes after the last tensor block.
    #[error("checkpoint has {0} unexpected trailing bytes")]
    TrailingBytes(usize),
    /// The checkpoint is larger than any checkpoint this crate writes.
    #[error("checkpoint larger than {0} bytes")]
    TooLarge(u64),
    /// Reading or writing failed.
    #[error("checkpoint I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The tensor backend reported an error (allocation failure).
    #[error("tensor backend: {0}")]
    Backend(String),
}

pub(crate) fn backend<E: std::fmt::Debug>(e: E) -> ModelError {
    ModelError::Backend(format!("{e:?}"))
}

/// Checks that every value is finite.
pub(crate) fn check_finite(what: &'static str, xs: &[f32]) -> Result<(), ModelError> {
    if xs.iter().all(|x| x.is_finite()) {
        Ok(())
    } else {
        Err(ModelError::NonFinite { what })
    }
}

/// Checks a vector's length.
pub(crate) fn check_dim(what: &'static str, expected: usize, got: usize) -> Result<(), ModelError> {
    if expected == got {
        Ok(())
    } else {
        Err(ModelError::Dimension {
            what,
            expected,
            got,
        })
    }
}
