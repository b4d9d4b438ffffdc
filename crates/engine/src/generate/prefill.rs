//! Prefill: the prompt but its last token, run through the model in chunks
//! that fill the caches.

use gemma::cache::LayerCache;
use gemma::model::Gemma3;
use mlx_core::Array;

use super::token_array;
use crate::error::GenerateError;
use crate::options::GenerateOptions;

/// Runs `head` (the prompt but its last token, after the `cached` tokens the
/// caches hold) through the model in chunks of `options.prefill_chunk`;
/// only the caches are evaluated.
pub fn prefill(
    model: &Gemma3,
    head: &[u32],
    cached: usize,
    options: &GenerateOptions,
    caches: &mut [LayerCache],
) -> Result<(), GenerateError> {
    for chunk in prefill_chunks(head, cached, options.prefill_chunk, options.kv_start) {
        model.hidden(&token_array(chunk)?, caches)?;
        let arrays: Vec<&Array> = caches.iter().flat_map(LayerCache::arrays).collect();
        mlx_core::eval(&arrays)?;
    }
    Ok(())
}

/// `tokens` (which follow `cached` tokens) cut into chunks of at most
/// `size`, with a cut where the cache reaches `kv_start` tokens so that the
/// tokens from there on are quantized as they enter.
fn prefill_chunks(tokens: &[u32], cached: usize, size: usize, kv_start: usize) -> Vec<&[u32]> {
    let split = kv_start.saturating_sub(cached).min(tokens.len());
    let (before, after) = tokens.split_at(split);
    before.chunks(size).chain(after.chunks(size)).collect()
}

#[cfg(test)]
mod tests {
    use super::prefill_chunks;

    #[test]
    fn prefill_chunks_are_cut_where_quantization_starts() {
        let t: Vec<u32> = (0..10).collect();
        let lens = |c: Vec<&[u32]>| c.iter().map(|c| c.len()).collect::<Vec<_>>();
        assert_eq!(lens(prefill_chunks(&t, 0, 4, 0)), vec![4, 4, 2]);
        assert_eq!(lens(prefill_chunks(&t, 0, 4, 6)), vec![4, 2, 4]);
        assert_eq!(lens(prefill_chunks(&t, 3, 4, 6)), vec![3, 4, 3]);
        assert_eq!(lens(prefill_chunks(&t, 8, 4, 6)), vec![4, 4, 2]);
    }
}
