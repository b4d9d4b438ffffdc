//! The decoding loop's clock: where its host time goes, and the speeds of
//! a finished generation.

use std::time::Instant;

use mlx_core::memory;

use crate::error::GenerateError;
use crate::metrics::{DecodeHostTimes, Metrics};

/// What a lap of the decoding loop's host time is counted as.
#[derive(Debug, Clone, Copy)]
pub enum Phase {
    /// Building step graphs.
    Build,
    /// Queueing them on the device.
    Queue,
    /// Waiting to read tokens back.
    Wait,
}

/// Laps of the decoding loop, and when its first token was read.
pub struct HostClock {
    /// The laps so far (since the first token, once it is read).
    times: DecodeHostTimes,
    /// The end of the last lap.
    lap_end: Instant,
    /// When the first token was read.
    first_token_at: Option<Instant>,
}

impl HostClock {
    /// A clock whose first lap starts now.
    pub fn start() -> HostClock {
        HostClock {
            times: DecodeHostTimes::default(),
            lap_end: Instant::now(),
            first_token_at: None,
        }
    }

    /// Counts the time since the last lap as `phase`.
    pub fn lap(&mut self, phase: Phase) {
        let now = Instant::now();
        let into = match phase {
            Phase::Build => &mut self.times.build_s,
            Phase::Queue => &mut self.times.queue_s,
            Phase::Wait => &mut self.times.wait_s,
        };
        *into += (now - self.lap_end).as_secs_f64();
        self.lap_end = now;
    }

    /// Notes that a token was read: at the first, the laps so far become
    /// [`DecodeHostTimes::first_token_s`] and the phases start from zero.
    pub fn token_read(&mut self) {
        if self.first_token_at.is_none() {
            let t = &self.times;
            self.times = DecodeHostTimes {
                first_token_s: t.build_s + t.queue_s + t.wait_s,
                ..DecodeHostTimes::default()
            };
            self.first_token_at = Some(Instant::now());
        }
    }

    /// The metrics of a generation called at `start` that ran
    /// `prompt_tokens` and generated `generated` tokens, ending now.
    pub fn metrics(
        self,
        start: Instant,
        prompt_tokens: usize,
        generated: usize,
    ) -> Result<Metrics, GenerateError> {
        let end = Instant::now();
        let first = self.first_token_at.unwrap_or(end);
        let prefill_s = (first - start).as_secs_f64();
        let decode_s = (end - first).as_secs_f64();
        Ok(Metrics {
            prompt_tokens,
            prompt_tps: if prefill_s > 0.0 {
                prompt_tokens as f64 / prefill_s
            } else {
                0.0
            },
            generation_tokens: generated,
            generation_tps: if decode_s > 0.0 && generated > 1 {
                (generated - 1) as f64 / decode_s
            } else {
                0.0
            },
            ttft_s: prefill_s,
            peak_memory_bytes: memory::peak_bytes()?,
            decode_host: self.times,
        })
    }
}
