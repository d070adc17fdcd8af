//! The ways a command fails, each with its documented exit code.

/// A failure that maps to a documented exit code.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{0}")]
    Held(String),
    #[error("{0}")]
    LeaseLost(String),
    /// `run` could not start its command: 127 if it does not exist, 126 if
    /// it cannot be executed (as `env`, `timeout` and shells answer).
    #[error("{message}")]
    CannotStart { message: String, code: u8 },
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Other(_) => 1,
            Failure::Held(_) => 3,
            Failure::LeaseLost(_) => 4,
            Failure::CannotStart { code, .. } => *code,
        }
    }
}
