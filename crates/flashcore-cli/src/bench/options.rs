//! What each dense and packed case takes from the command line.

use crate::cases::Inputs;

/// Query rows checked against the GPU reference after timing (the last rows, which keep
/// the bottom-right alignment of the causal mask and the window when the queries are
/// narrowed).
pub const VERIFY_ROWS: usize = 128;

/// `bench`'s options that every dense and packed case's timing takes.
pub struct CaseOptions {
    /// Split-KV: CTAs per query tile's keys (`--splits`).
    pub splits: Option<usize>,
    /// Timed samples per case.
    pub samples: usize,
    /// Time launches issued one by one instead of CUDA-graph replays.
    pub eager: bool,
    /// How q, k and v are drawn.
    pub inputs: Inputs,
    /// Skip the accuracy check against the GPU reference.
    pub no_verify: bool,
}
