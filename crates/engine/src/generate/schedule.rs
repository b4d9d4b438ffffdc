//! The step schedule: decode steps queued on the device in batches ahead of
//! the tokens read back — the next batch is queued while the device still
//! runs one, as mlx-lm does with `async_eval` — and the read-back of each
//! batch as one array.

use std::collections::VecDeque;

use gemma::cache::LayerCache;
use mlx_core::{async_eval, concatenate, Array};

use super::step::{step_token, Stepper};
use super::timing::{HostClock, Phase};
use crate::error::GenerateError;

/// Batches of steps queued and not yet read back, and the tokens read back
/// and not yet handed on.
pub struct Schedule {
    /// Batches queued and not read back, oldest first, each packed into one
    /// array.
    batches: VecDeque<Array>,
    /// (token id, logits finite) pairs read back and not yet handed on.
    read: VecDeque<(u32, bool)>,
    /// Steps in `batches` and `read`.
    in_flight: usize,
    /// Steps queued so far: each yields one token.
    steps: usize,
    /// Batches queued after the first step, which set the next one's size.
    batches_queued: usize,
    /// The token id of the last step queued, `[1]`: the next step's input.
    last_token: Array,
    /// Most steps in a batch ([`crate::GenerateOptions::steps_per_sync`]).
    steps_per_sync: usize,
    /// Steps that may be queued in all.
    max_steps: usize,
}

impl Schedule {
    /// Queues `first`, the step of the prompt's last token, alone; then at
    /// most `max_steps` steps in all, in batches that grow from one step to
    /// `steps_per_sync`.
    pub fn start(
        first: Array,
        steps_per_sync: usize,
        max_steps: usize,
        clock: &mut HostClock,
    ) -> Result<Schedule, GenerateError> {
        let last_token = step_token(&first)?;
        clock.lap(Phase::Build);
        async_eval(&[&first])?;
        clock.lap(Phase::Queue);
        Ok(Schedule {
            batches: VecDeque::from([first]),
            read: VecDeque::new(),
            in_flight: 1,
            steps: 1,
            batches_queued: 0,
            last_token,
            steps_per_sync,
            max_steps,
        })
    }

    /// Queues the next batch of steps, as one evaluation, while the device
    /// still has a batch to run (no more than `steps_per_sync` steps in
    /// flight).
    pub fn queue(
        &mut self,
        stepper: &mut Stepper<'_>,
        caches: &mut [LayerCache],
        clock: &mut HostClock,
    ) -> Result<(), GenerateError> {
        if self.in_flight > self.steps_per_sync {
            return Ok(());
        }
        let size = batch_size(self.batches_queued, self.steps_per_sync);
        let mut queued: Vec<Array> = Vec::with_capacity(size);
        while queued.len() < size && self.steps < self.max_steps {
            let next = stepper.after(&self.last_token, caches)?;
            self.last_token = step_token(&next)?;
            queued.push(next);
            self.steps += 1;
        }
        clock.lap(Phase::Build);
        if !queued.is_empty() {
            self.batches_queued += 1;
            let packed = pack_steps(&queued)?;
            async_eval(&[&packed])?;
            self.batches.push_back(packed);
            self.in_flight += queued.len();
        }
        clock.lap(Phase::Queue);
        Ok(())
    }

    /// The next step's (token id, logits finite), reading the oldest batch
    /// back when the last one read is used up; `None` when nothing is in
    /// flight.
    pub fn read(&mut self) -> Result<Option<(u32, bool)>, GenerateError> {
        if self.read.is_empty() {
            let Some(packed) = self.batches.pop_front() else {
                return Ok(None);
            };
            self.read.extend(unpack_steps(&packed.to_vec::<u32>()?));
        }
        let next = self.read.pop_front();
        if next.is_some() {
            self.in_flight -= 1;
        }
        Ok(next)
    }

    /// Whether every step queued has been read and handed on.
    pub fn drained(&self) -> bool {
        self.in_flight == 0
    }
}

/// Steps of the batch queued after `queued` others (after the first step):
/// 1, 2, 4, … up to `steps_per_sync`. So only one step is queued ahead when
/// the first token is read (as mlx-lm queues one): the first token is not
/// held back while a whole batch is built, the device starts early, and no
/// more than one step's work can run before the generation's clock starts.
fn batch_size(queued: usize, steps_per_sync: usize) -> usize {
    (1usize << queued.min(usize::BITS as usize - 1)).min(steps_per_sync)
}

/// The `[id, finite]` pairs of a batch of decode steps as one array, so
/// that the evaluation of the batch has a single output: MLX's CUDA backend
/// signals the end of every output of an evaluation with its own kernel
/// (Nsight Compute found one per output on the H200, at 60–250 µs each).
fn pack_steps(steps: &[Array]) -> Result<Array, GenerateError> {
    match steps {
        [one] => Ok(one.clone()),
        _ => Ok(concatenate(&steps.iter().collect::<Vec<_>>(), 0)?),
    }
}

/// The (token id, logits finite) pairs of a batch of steps, read back.
fn unpack_steps(values: &[u32]) -> impl Iterator<Item = (u32, bool)> + '_ {
    values.chunks_exact(2).map(|pair| (pair[0], pair[1] != 0))
}

#[cfg(test)]
mod tests {
    use mlx_core::{Array, Dtype};

    use super::{batch_size, pack_steps, unpack_steps};
    use crate::generate::step::{step_pair, step_token};

    #[test]
    fn batches_grow_from_one_step_to_the_steps_per_sync() {
        let sizes = |limit| (0..6).map(|k| batch_size(k, limit)).collect::<Vec<_>>();
        assert_eq!(sizes(8), [1, 2, 4, 8, 8, 8]);
        assert_eq!(sizes(3), [1, 2, 3, 3, 3, 3]);
        assert_eq!(sizes(1), [1; 6]);
        assert_eq!(batch_size(200, 64), 64);
    }

    #[test]
    fn packed_steps_read_back_as_their_tokens_and_flags() {
        let step = |id: u32, finite: bool| {
            let token = Array::from_slice(&[id], &[1]).unwrap();
            let flag = Array::scalar(f64::from(u8::from(finite)), Dtype::Bool).unwrap();
            let pair = step_pair(&token, &flag).unwrap();
            assert_eq!(step_token(&pair).unwrap().to_vec::<u32>().unwrap(), [id]);
            pair
        };
        let steps = [step(5, true), step(262_143, false), step(0, true)];
        let alone = pack_steps(&steps[..1]).unwrap();
        assert_eq!(alone.to_vec::<u32>().unwrap(), [5, 1]);
        let packed = pack_steps(&steps).unwrap();
        assert_eq!(packed.shape(), vec![6]);
        let values = packed.to_vec::<u32>().unwrap();
        assert_eq!(
            unpack_steps(&values).collect::<Vec<_>>(),
            vec![(5, true), (262_143, false), (0, true)]
        );
    }
}
