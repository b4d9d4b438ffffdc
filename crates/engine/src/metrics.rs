//! What one generation measured.

use serde::Serialize;

/// Speed and memory figures of one generation (MLX's own memory counters).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Metrics {
    /// Prompt tokens run through the model (after any reused cache).
    pub prompt_tokens: usize,
    /// Prompt tokens per second.
    pub prompt_tps: f64,
    /// Tokens generated.
    pub generation_tokens: usize,
    /// Generated tokens per second, after the first.
    pub generation_tps: f64,
    /// Seconds from the call to the first generated token.
    pub ttft_s: f64,
    /// MLX's peak memory during the generation, in bytes.
    pub peak_memory_bytes: usize,
    /// Where the decoding loop's time went on the host.
    pub decode_host: DecodeHostTimes,
}

/// Seconds the decoding loop spent on the host. Until the first token is
/// read (the prompt's last token, and any compiling of the step and its
/// kernels) they are summed apart, so the rest describes the steady state:
/// building each step's graph (the forward call and sampling, with the
/// streaming of the previous token's text), queueing it for the device
/// (`async_eval`), and waiting to read tokens back. With the device busier
/// than the host the waits dominate; otherwise building and queueing do, and
/// the step is bound by host-side cost.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DecodeHostTimes {
    /// Everything until the first token was read.
    pub first_token_s: f64,
    /// Building step graphs (and streaming text) after that.
    pub build_s: f64,
    /// Queueing them.
    pub queue_s: f64,
    /// Waiting for tokens.
    pub wait_s: f64,
}

impl Metrics {
    /// One line for people: `prompt 12 tok (340.1 tok/s) | generated 64 tok (21.3 tok/s) | ttft 0.04 s | peak 1.2 GiB`.
    pub fn summary(&self) -> String {
        format!(
            "prompt {} tok ({:.1} tok/s) | generated {} tok ({:.1} tok/s) | ttft {:.3} s | peak {:.2} GiB",
            self.prompt_tokens,
            self.prompt_tps,
            self.generation_tokens,
            self.generation_tps,
            self.ttft_s,
            self.peak_memory_bytes as f64 / (1u64 << 30) as f64
        )
    }
}
