//! Sweeps spread over ranks: processes that MLX's launcher (`mlx.launch`)
//! starts, joined by MLX's distributed group. Each rank takes a contiguous
//! share of the chunks (and prompts); the shares are gathered in rank
//! order, which is the order one process would have met them in, so rank
//! 0 computes every statistic from the same values, summed in the same
//! order, as a single process does.

use std::ops::Range;

use mlx_core::distributed::Group;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::GenerateError;

/// This process's place among the ranks of a run.
pub struct Ranks {
    group: Option<Group>,
    rank: usize,
    size: usize,
}

/// What a rank sends: its share's result, or why it has none.
#[derive(Serialize, Deserialize)]
enum Outcome<T> {
    Done(T),
    Failed(String),
}

impl Ranks {
    /// Joins the ranks the launcher started (MLX picks the backend its
    /// environment configures); a process started alone is rank 0 of 1.
    pub fn join() -> Result<Ranks, GenerateError> {
        let group = Group::init(false, "any")?;
        let rank = group.rank()?;
        let size = group.size()?;
        Ok(Ranks {
            group: Some(group),
            rank,
            size,
        })
    }

    /// This process alone, without asking MLX for a group.
    pub fn alone() -> Ranks {
        Ranks {
            group: None,
            rank: 0,
            size: 1,
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// This rank's share of `n` items (see [`share`]).
    pub fn share(&self, n: usize) -> Range<usize> {
        share(n, self.rank, self.size)
    }

    /// Every rank's result, in rank order; every rank calls it once per
    /// exchange, with its result or its error. When any rank failed, every
    /// rank gets the first failing rank's error, so that no rank writes a
    /// report that looks whole.
    pub fn gather<T: Serialize + DeserializeOwned>(
        &self,
        local: Result<&T, String>,
    ) -> Result<Vec<T>, GenerateError> {
        let outcome = match local {
            Ok(value) => Outcome::Done(value),
            Err(message) => Outcome::Failed(message),
        };
        let bytes = serde_json::to_vec(&outcome).map_err(|e| {
            GenerateError::Input(format!("encoding rank {}'s share: {e}", self.rank))
        })?;
        let mut results = Vec::with_capacity(self.size);
        let all = match &self.group {
            Some(group) => group.all_gather_bytes(&bytes)?,
            None => vec![bytes],
        };
        for (rank, bytes) in all.iter().enumerate() {
            let outcome: Outcome<T> = serde_json::from_slice(bytes)
                .map_err(|e| GenerateError::Input(format!("reading rank {rank}'s share: {e}")))?;
            match outcome {
                Outcome::Done(value) => results.push(value),
                Outcome::Failed(message) => {
                    return Err(GenerateError::Rank {
                        rank,
                        size: self.size,
                        message,
                    })
                }
            }
        }
        Ok(results)
    }
}

/// Rank `rank`'s share of `n` items among `size` ranks: a contiguous run,
/// the runs in rank order covering `0..n`, their lengths differing by at
/// most one.
pub fn share(n: usize, rank: usize, size: usize) -> Range<usize> {
    let size = size.max(1);
    n * rank / size..n * (rank + 1) / size
}

#[cfg(test)]
mod tests {
    use super::{share, Ranks};
    use crate::error::GenerateError;
    use crate::kld::stats::PositionSamples;

    #[test]
    fn a_share_crosses_to_rank_zero_bit_for_bit_and_a_failure_names_its_rank() {
        let mut samples = PositionSamples::default();
        for (i, v) in [
            0.1,
            1.0 / 3.0,
            5e-324,
            1.7976931348623157e308,
            2.0f64.sqrt(),
        ]
        .into_iter()
        .enumerate()
        {
            samples.push(v, i % 2 == 0, -v, (-v).ln_1p().min(0.0));
        }
        samples.push(f64::NAN, true, 0.0, 0.0);
        let ranks = Ranks::alone();
        let back = ranks.gather(Ok(&samples)).unwrap();
        assert_eq!(back.len(), 1);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back[0].kld), bits(&samples.kld));
        assert_eq!(bits(&back[0].logp_cand), bits(&samples.logp_cand));
        assert_eq!(back[0], samples);
        match ranks.gather::<PositionSamples>(Err("out of memory".into())) {
            Err(GenerateError::Rank {
                rank: 0,
                size: 1,
                message,
            }) => assert_eq!(message, "out of memory"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn shares_are_contiguous_in_rank_order_cover_everything_and_differ_by_at_most_one() {
        assert_eq!(share(10, 0, 1), 0..10);
        assert_eq!(
            (0..3).map(|r| share(10, r, 3)).collect::<Vec<_>>(),
            [0..3, 3..6, 6..10]
        );
        assert_eq!(
            (0..4).map(|r| share(2, r, 4)).collect::<Vec<_>>(),
            [0..0, 0..1, 1..1, 1..2]
        );
        for n in 0..40 {
            for size in 1..9 {
                let runs: Vec<_> = (0..size).map(|r| share(n, r, size)).collect();
                assert_eq!(runs[0].start, 0);
                assert_eq!(runs[size - 1].end, n);
                assert!(runs.windows(2).all(|w| w[0].end == w[1].start));
                let lengths: Vec<usize> = runs.iter().map(|r| r.len()).collect();
                let (min, max) = (lengths.iter().min().unwrap(), lengths.iter().max().unwrap());
                assert!(max - min <= 1, "{n} over {size}: {lengths:?}");
            }
        }
    }
}
