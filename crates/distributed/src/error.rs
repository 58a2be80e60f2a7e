//! Errors of the communication layer: always say which rank failed, in which operation, and (after a collective
//! failed) what the heartbeats say about the other ranks.
use std::fmt;

/// A failed rendezvous, collective or store operation on one rank.
#[derive(Debug, Clone, thiserror::Error)]
pub struct CommError {
    pub rank: usize,
    pub world_size: usize,
    /// What was being done, e.g. "all-reduce of gradients (backward, step 12)".
    pub op: String,
    /// The c10d/Gloo/NCCL message, followed by the diagnosis of the other ranks when there is one.
    pub detail: String,
}

impl fmt::Display for CommError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {}/{}: {} failed: {}",
            self.rank, self.world_size, self.op, self.detail
        )
    }
}
