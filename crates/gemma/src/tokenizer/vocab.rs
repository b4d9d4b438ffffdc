//! A SentencePiece BPE vocabulary (pieces, scores, types) and the
//! `tokenizers` pipeline that encodes exactly like SentencePiece on it.
//!
//! SentencePiece's BPE repeatedly merges the adjacent pair of symbols whose
//! concatenation is a normal piece with the highest score (leftmost first on
//! ties). A `tokenizers` BPE model does the same with merge ranks, so the
//! merges are derived from the scores: every split of a normal piece into two
//! normal pieces becomes a merge, ranked by the merged piece's score.
//! User-defined pieces (`\n`, runs of spaces and tabs, HTML tags) are matched
//! first, longest match first, and never merged, as SentencePiece does: they
//! become non-special added tokens matched on the normalized text. Control and
//! unknown pieces become special added tokens. Spaces are written as `▁`
//! (U+2581); there is no dummy prefix and no other normalization.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;

use super::TokenizerError;

/// SentencePiece's word-boundary marker, which stands for a space.
pub const SPACE_MARKER: &str = "\u{2581}";

/// The piece that starts a sequence in Gemma's vocabulary.
pub const BOS_PIECE: &str = "<bos>";

/// A piece's type, numbered as in SentencePiece and GGUF's `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// An ordinary piece that BPE merges can produce.
    Normal = 1,
    /// The unknown-token piece.
    Unknown = 2,
    /// A control piece (`<bos>`, `<start_of_turn>`, ...), only produced when written as special-token text.
    Control = 3,
    /// A user-defined piece, always matched as a whole in the text.
    UserDefined = 4,
    /// A reserved piece that encoding never produces.
    Unused = 5,
    /// One of the 256 byte-fallback pieces `<0x00>` .. `<0xFF>`.
    Byte = 6,
}

impl TokenType {
    /// The type with SentencePiece/GGUF number `value`, if there is one.
    pub fn from_number(value: i64) -> Option<TokenType> {
        match value {
            1 => Some(TokenType::Normal),
            2 => Some(TokenType::Unknown),
            3 => Some(TokenType::Control),
            4 => Some(TokenType::UserDefined),
            5 => Some(TokenType::Unused),
            6 => Some(TokenType::Byte),
            _ => None,
        }
    }
}

/// Builds the `tokenizers` pipeline for a SentencePiece BPE vocabulary; ids are positions in `tokens`.
pub fn build_pipeline(
    tokens: &[String],
    scores: &[f32],
    types: &[TokenType],
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    if tokens.len() != scores.len() || tokens.len() != types.len() {
        return Err(TokenizerError::Vocab(format!(
            "{} tokens, {} scores and {} types: the three lists must have the same length",
            tokens.len(),
            scores.len(),
            types.len()
        )));
    }
    let ids = token_ids(tokens)?;
    let merges = merges_by_score(tokens, scores, types, &ids);
    let mut builder = BPE::builder()
        .vocab_and_merges(ids, merges)
        .byte_fallback(true);
    if let Some(unknown) = tokens
        .iter()
        .zip(types)
        .find(|(_, kind)| **kind == TokenType::Unknown)
    {
        builder = builder.unk_token(unknown.0.clone());
    }
    let model = builder
        .build()
        .map_err(|e| TokenizerError::Vocab(format!("building the BPE model: {e}")))?;

    let mut pipeline = tokenizers::Tokenizer::new(model);
    let normalizer = Replace::new(" ", SPACE_MARKER)
        .map_err(|e| TokenizerError::Vocab(format!("building the normalizer: {e}")))?;
    pipeline.with_normalizer(Some(normalizer));
    pipeline.with_decoder(Some(decoder()?));
    if let Some(bos) = tokens.iter().position(|t| t == BOS_PIECE) {
        pipeline.with_post_processor(Some(bos_template(bos)?));
    }

    let (special, user_defined): (Vec<AddedToken>, Vec<AddedToken>) = tokens
        .iter()
        .zip(types)
        .filter_map(|(token, kind)| match kind {
            TokenType::Control | TokenType::Unknown => {
                Some(AddedToken::from(token.clone(), true).normalized(false))
            }
            TokenType::UserDefined => Some(AddedToken::from(token.clone(), false).normalized(true)),
            _ => None,
        })
        .partition(|token| token.special);
    pipeline.add_special_tokens(&special);
    pipeline.add_tokens(&user_defined);
    Ok(pipeline)
}

/// Maps each token to its id, rejecting a vocabulary that lists a token twice.
fn token_ids(tokens: &[String]) -> Result<Vocab, TokenizerError> {
    let mut ids = Vocab::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        let id = u32::try_from(id).map_err(|_| {
            TokenizerError::Vocab(format!("{} tokens do not fit u32 ids", tokens.len()))
        })?;
        if let Some(first) = ids.insert(token.clone(), id) {
            return Err(TokenizerError::Vocab(format!(
                "token {token:?} appears twice, as ids {first} and {id}"
            )));
        }
    }
    Ok(ids)
}

/// Every split of a normal piece into two normal pieces, best-scored merged piece first
/// (then lower id, then shorter left part).
fn merges_by_score(
    tokens: &[String],
    scores: &[f32],
    types: &[TokenType],
    ids: &Vocab,
) -> Vec<(String, String)> {
    let is_normal = |piece: &str| {
        ids.get(piece)
            .and_then(|&id| types.get(id as usize))
            .is_some_and(|kind| *kind == TokenType::Normal)
    };
    let mut ranked: Vec<(f32, usize, usize)> = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        if types.get(id) != Some(&TokenType::Normal) {
            continue;
        }
        for (split, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(split);
            if is_normal(left) && is_normal(right) {
                ranked.push((scores.get(id).copied().unwrap_or(f32::MIN), id, split));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    ranked
        .into_iter()
        .filter_map(|(_, id, split)| {
            let (left, right) = tokens.get(id)?.split_at(split);
            Some((left.to_owned(), right.to_owned()))
        })
        .collect()
}

/// `▁` back to spaces, byte-fallback pieces back to bytes, then one string.
fn decoder() -> Result<DecoderWrapper, TokenizerError> {
    let spaces = tokenizers::normalizers::replace::Replace::new(SPACE_MARKER, " ")
        .map_err(|e| TokenizerError::Vocab(format!("building the decoder: {e}")))?;
    Ok(DecoderWrapper::Sequence(Sequence::new(vec![
        DecoderWrapper::Replace(spaces),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ])))
}

/// The post-processor that puts `<bos>` in front when special tokens are added (as Gemma's tokenizer.json does).
fn bos_template(bos: usize) -> Result<TemplateProcessing, TokenizerError> {
    let bos = u32::try_from(bos)
        .map_err(|_| TokenizerError::Vocab(format!("<bos> id {bos} does not fit u32")))?;
    let template_error =
        |e: String| TokenizerError::Vocab(format!("building the <bos> template: {e}"));
    let mut builder = TemplateProcessing::builder();
    builder
        .try_single(format!("{BOS_PIECE} $A"))
        .map_err(template_error)?
        .try_pair(format!("{BOS_PIECE} $A {BOS_PIECE}:1 $B:1"))
        .map_err(template_error)?
        .special_tokens(vec![(BOS_PIECE, bos)]);
    builder.build().map_err(|e| template_error(e.to_string()))
}
