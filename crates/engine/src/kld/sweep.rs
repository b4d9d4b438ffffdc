//! The KLD sweep: each corpus chunk runs once through the reference cache
//! format and once through each candidate's, so N candidates cost N + 1
//! forwards per chunk. Each run uses a fresh cache that stores keys and
//! values as they enter, so the chunk attends to them exactly as generation
//! would.

use gemma::cache::{LayerFormats, QueryRounding};
use gemma::linear::gguf::MIN_INPUTS_FOR_MATMUL;
use gemma::model::Gemma3;
use mlx_core::{memory, Array};
use serde::{Deserialize, Serialize};

use crate::error::GenerateError;
use crate::kld::compare::{compare_into, Reference};
use crate::kld::stats::PositionSamples;

/// How the corpus is cut and scored.
#[derive(Debug, Clone, Copy)]
pub struct ChunkSettings {
    /// Tokens per chunk.
    pub ctx: usize,
    /// Most chunks to score.
    pub chunks: usize,
    /// Replace each chunk's first token with `<bos>`.
    pub bos: Option<u32>,
    /// Score only the second half of each chunk.
    pub second_half: bool,
    /// Recompute the reference for every candidate (the existing tool's
    /// method: 2 forwards per candidate), for comparison.
    pub two_forwards: bool,
}

/// One side of a comparison: a model and its caches' formats.
#[derive(Debug, Clone)]
pub struct Side<'a> {
    /// The model.
    pub model: &'a Gemma3,
    /// Each layer's cache format.
    pub formats: LayerFormats,
    /// Tokens kept in the compute dtype before quantizing starts.
    pub start: usize,
    /// How attention treats the queries.
    pub queries: QueryRounding,
}

/// The samples of every candidate, and what it took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepResult {
    /// Per-candidate samples, in order.
    pub samples: Vec<PositionSamples>,
    /// Chunks scored.
    pub chunks: usize,
    /// Forward passes run.
    pub forwards: usize,
    /// KV-cache bytes of the reference at the chunk length.
    pub reference_cache_bytes: usize,
    /// KV-cache bytes of each candidate at the chunk length.
    pub candidate_cache_bytes: Vec<usize>,
    /// MLX's active memory between chunks.
    pub active_memory: ActiveMemory,
}

/// MLX's active memory read after each chunk, when the chunk's caches and
/// logits are gone: what stays is the weights and whatever leaks, so a long
/// sweep's figures show whether memory stays flat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveMemory {
    /// Bytes after the first chunk.
    pub after_first_chunk: usize,
    /// Bytes after the last chunk.
    pub after_last_chunk: usize,
    /// The most bytes after any chunk.
    pub most: usize,
}

impl ActiveMemory {
    /// Takes in a reading after chunk `done` (counted from 1).
    fn record(&mut self, done: usize, bytes: usize) {
        if done == 1 {
            self.after_first_chunk = bytes;
        }
        self.after_last_chunk = bytes;
        self.most = self.most.max(bytes);
    }
}

impl SweepResult {
    /// The result of consecutive shares of a sweep's chunks, given in
    /// chunk order: the samples joined in that order, the counts summed,
    /// the cache sizes and memory readings the largest any share saw (a
    /// share without chunks saw none).
    pub fn merge(shares: Vec<SweepResult>) -> Option<SweepResult> {
        let mut shares = shares.into_iter();
        let mut merged = shares.next()?;
        for share in shares {
            for (all, more) in merged.samples.iter_mut().zip(share.samples) {
                all.extend(more);
            }
            merged.chunks += share.chunks;
            merged.forwards += share.forwards;
            merged.reference_cache_bytes = merged
                .reference_cache_bytes
                .max(share.reference_cache_bytes);
            for (all, more) in merged
                .candidate_cache_bytes
                .iter_mut()
                .zip(share.candidate_cache_bytes)
            {
                *all = (*all).max(more);
            }
            let (a, b) = (&mut merged.active_memory, share.active_memory);
            a.after_first_chunk = a.after_first_chunk.max(b.after_first_chunk);
            a.after_last_chunk = a.after_last_chunk.max(b.after_last_chunk);
            a.most = a.most.max(b.most);
        }
        Some(merged)
    }
}

/// The chunks of the text's `tokens` under `settings` (an error if there
/// is none). With `bos`, as llama-perplexity cuts them: the text follows a
/// `<bos>`, and each chunk's first token is replaced with `<bos>`, so that
/// chunk i holds the tokens llama-perplexity's chunk i holds.
pub fn chunks(tokens: &[u32], settings: &ChunkSettings) -> Result<Vec<Vec<u32>>, GenerateError> {
    if settings.ctx < 2 {
        return Err(GenerateError::Input(
            "--ctx must be at least 2 tokens".into(),
        ));
    }
    let stream: Vec<u32> = settings.bos.iter().chain(tokens).copied().collect();
    let out: Vec<Vec<u32>> = stream
        .chunks_exact(settings.ctx)
        .take(settings.chunks)
        .map(|c| {
            let mut c = c.to_vec();
            if let Some(bos) = settings.bos {
                c[0] = bos;
            }
            c
        })
        .collect();
    if out.is_empty() {
        return Err(GenerateError::Input(format!(
            "the corpus has {} tokens: not enough for one chunk of {}",
            tokens.len(),
            settings.ctx
        )));
    }
    Ok(out)
}

/// The first row whose logits a chunk of `l` tokens needs when positions
/// from `first` on are scored: `first`, but never fewer than
/// [`MIN_INPUTS_FOR_MATMUL`] rows (or the whole chunk), so that the output
/// head's product takes the path it takes for the whole chunk and each row
/// gets the logits it would get there.
fn logits_from(first: i32, l: i32) -> i32 {
    first.min(l - MIN_INPUTS_FOR_MATMUL as i32).max(0)
}

/// Logits `[L − from, V]` of rows `from..L` of one chunk `[1, L]` through a
/// fresh cache of `side`'s format, and the bytes that cache holds
/// afterwards. Every row runs through the blocks; only the rows asked for
/// go through the output head (half its products, and half the comparison's
/// work, when the second half is scored). With a `start` inside the chunk,
/// the chunk runs in two forwards cut there.
fn run_chunk(side: &Side<'_>, chunk: &Array, from: i32) -> Result<(Array, usize), GenerateError> {
    let mut caches: Vec<_> = side
        .model
        .make_caches(side.formats.clone())?
        .into_iter()
        .map(|c| {
            c.quantize_from(side.start as i32)
                .round_queries(side.queries)
        })
        .collect();
    let l = chunk.dim(1)?;
    let cut = (side.start as i32).min(l);
    let hidden = if cut > 0 && cut < l {
        let first = side
            .model
            .hidden(&chunk.slice(&[0, 0], &[1, cut], &[1, 1])?, &mut caches)?;
        let second = side
            .model
            .hidden(&chunk.slice(&[0, cut], &[1, l], &[1, 1])?, &mut caches)?;
        mlx_core::concatenate(&[&first, &second], 1)?
    } else {
        side.model.hidden(chunk, &mut caches)?
    };
    let width = hidden.dim(2)?;
    let rows = hidden.slice(&[0, from, 0], &[1, l, width], &[1, 1, 1])?;
    let logits = side.model.logits(&rows)?;
    let logits = logits.reshape(&[l - from, logits.dim(2)?])?;
    logits.eval()?;
    Ok((logits, caches.iter().map(|c| c.nbytes()).sum()))
}

/// Logits-sized arrays (`[rows, vocabulary]` float32) that MLX's buffer
/// cache keeps for reuse during a sweep: a chunk makes several (the
/// reference's and candidate's logits, log-probabilities, probabilities),
/// which MLX's default cache (32 MiB) returned to the system and the next
/// chunk had the kernel zero again: about 13 % of a sweep's time on the
/// default model (`clear_page_erms`), 16.2–17.3 s against 12.6–14.1 s with
/// them kept, peak RSS 1.92 against 1.94 GB.
const CACHED_LOGITS_ARRAYS: usize = 8;

/// Runs the sweep; `progress(done, total)` after each chunk. MLX's buffer
/// cache is raised while it runs to hold eight arrays of a chunk's logits.
pub fn sweep(
    reference: &Side<'_>,
    candidates: &[Side<'_>],
    chunks: &[Vec<u32>],
    settings: &ChunkSettings,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SweepResult, GenerateError> {
    let mut samples = vec![PositionSamples::default(); candidates.len()];
    let mut forwards = 0;
    let mut reference_cache_bytes = 0;
    let mut candidate_cache_bytes = vec![0; candidates.len()];
    let mut active_memory = ActiveMemory::default();
    let longest = chunks.iter().map(Vec::len).max().unwrap_or(0);
    let logits_bytes = longest * reference.model.config.vocab_size * std::mem::size_of::<f32>();
    let _cache = memory::CacheLimitRaised::at_least(CACHED_LOGITS_ARRAYS * logits_bytes)?;
    for (done, chunk) in chunks.iter().enumerate() {
        let ids: Vec<i32> = chunk.iter().map(|&t| t as i32).collect();
        let l = ids.len() as i32;
        let input = Array::from_slice(&ids, &[1, l])?;
        let first = if settings.second_half { l / 2 } else { 0 };
        let from = logits_from(first, l);
        let next = Array::from_slice(&ids[from as usize + 1..], &[l - 1 - from])?;
        let mut shared: Option<Reference> = None;
        for (i, cand) in candidates.iter().enumerate() {
            let reference_now = match (&shared, settings.two_forwards) {
                (Some(_), false) => None,
                _ => {
                    let (logits, bytes) = run_chunk(reference, &input, from)?;
                    forwards += 1;
                    reference_cache_bytes = bytes;
                    Some(Reference::new(&logits)?)
                }
            };
            if let Some(r) = reference_now {
                shared = Some(r);
            }
            let Some(reference_logprobs) = shared.as_ref() else {
                return Err(GenerateError::Input("no reference computed".into()));
            };
            let (logits, bytes) = run_chunk(cand, &input, from)?;
            forwards += 1;
            candidate_cache_bytes[i] = bytes;
            compare_into(
                reference_logprobs,
                &logits,
                &next,
                first - from,
                &mut samples[i],
            )?;
        }
        drop(shared);
        active_memory.record(done + 1, memory::active_bytes()?);
        progress(done + 1, chunks.len());
    }
    Ok(SweepResult {
        samples,
        chunks: chunks.len(),
        forwards,
        reference_cache_bytes,
        candidate_cache_bytes,
        active_memory,
    })
}

#[cfg(test)]
mod tests {
    use super::{logits_from, ActiveMemory, SweepResult};
    use crate::kld::stats::PositionSamples;

    fn samples(kld: &[f64], non_finite: usize) -> PositionSamples {
        PositionSamples {
            kld: kld.to_vec(),
            same_top: kld.iter().map(|&k| k < 0.5).collect(),
            logp_ref: kld.iter().map(|k| -k).collect(),
            logp_cand: kld.iter().map(|k| -2.0 * k).collect(),
            non_finite,
        }
    }

    fn share(klds: [&[f64]; 2], chunks: usize, memory: [usize; 3]) -> SweepResult {
        SweepResult {
            samples: vec![samples(klds[0], chunks), samples(klds[1], 0)],
            chunks,
            forwards: 3 * chunks,
            reference_cache_bytes: 100,
            candidate_cache_bytes: vec![40 * chunks.min(1), 20 * chunks.min(1)],
            active_memory: ActiveMemory {
                after_first_chunk: memory[0],
                after_last_chunk: memory[1],
                most: memory[2],
            },
        }
    }

    #[test]
    fn shares_merge_in_chunk_order_with_counts_summed() {
        let first = share([&[0.1, 0.2], &[0.9]], 2, [10, 12, 15]);
        let empty = share([&[], &[]], 0, [0, 0, 0]);
        let last = share([&[0.3], &[0.7, 0.8]], 1, [11, 11, 11]);
        let merged = SweepResult::merge(vec![first, empty, last]).unwrap();
        assert_eq!(merged.samples[0], samples(&[0.1, 0.2, 0.3], 3));
        assert_eq!(merged.samples[1], samples(&[0.9, 0.7, 0.8], 0));
        assert_eq!((merged.chunks, merged.forwards), (3, 9));
        assert_eq!(merged.reference_cache_bytes, 100);
        assert_eq!(merged.candidate_cache_bytes, [40, 20]);
        assert_eq!(
            merged.active_memory,
            ActiveMemory {
                after_first_chunk: 11,
                after_last_chunk: 12,
                most: 15,
            }
        );
        assert!(SweepResult::merge(Vec::new()).is_none());
    }

    #[test]
    fn the_head_takes_the_scored_rows_and_never_fewer_than_a_matmul_takes() {
        // A 512-token chunk scored on its second half: rows 256 on.
        assert_eq!(logits_from(256, 512), 256);
        // Every position scored: every row.
        assert_eq!(logits_from(0, 512), 0);
        // 128 tokens: the second half is exactly 64 rows.
        assert_eq!(logits_from(64, 128), 64);
        // 100 tokens: 64 rows, from 36, though scoring starts at 50.
        assert_eq!(logits_from(50, 100), 36);
        // Chunks shorter than 64 tokens: the whole chunk, as before.
        assert_eq!(logits_from(16, 32), 0);
    }

    #[test]
    fn active_memory_keeps_the_first_last_and_largest_readings() {
        let mut memory = ActiveMemory::default();
        for (done, bytes) in [(1, 100), (2, 130), (3, 90), (4, 110)] {
            memory.record(done, bytes);
        }
        assert_eq!(
            memory,
            ActiveMemory {
                after_first_chunk: 100,
                after_last_chunk: 110,
                most: 130,
            }
        );
    }
}
