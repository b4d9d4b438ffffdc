//! KV-cache fidelity evaluation: KL divergence of next-token distributions
//! against a reference cache format, and greedy-trajectory agreement.

pub mod compare;
pub mod cpu_rows;
pub mod ranks;
pub mod report;
pub mod stats;
pub mod sweep;
pub mod trajectory;
