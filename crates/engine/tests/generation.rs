//! The generation loop on tiny random models (no tokenizer: token ids in and
//! out): memory flatness over a long decode, stop conditions, errors, chunked
//! prefill, pipelining, seeded sampling, and decoding through the compiled
//! fixed-shape step.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Mutex, MutexGuard};

use engine::options::DecodeMode;
use engine::{
    generate, Engine, FinishReason, GenerateError, GenerateOptions, Generation, TokenEvent,
};
use gemma::cache::{CacheFormat, LayerCache};
use gemma::config::Gemma3Config;
use gemma::linear::Linear;
use gemma::load::{load, LoadOptions, ModelSource, WeightStorage};
use mlx_core::{device, memory, Array, Dtype};
use sample::SamplerConfig;

static MLX: Mutex<()> = Mutex::new(());

/// Runs one test's MLX work at a time: the tests of a binary run on parallel
/// threads, the machine has two cores, and the memory test reads MLX's
/// process-wide counters.
fn serial() -> MutexGuard<'static, ()> {
    MLX.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

const VOCAB: usize = 512;
const HIDDEN: usize = 64;

/// A tiny Gemma 3: hidden 64, 4 query heads, 1 key/value head of 64, MLP 128,
/// vocabulary 512, sliding window 16 on every other layer (layers 0, 2, … slide,
/// 1, 3, … are global). Its end-of-sequence id lies outside the vocabulary,
/// so it never stops by itself.
fn tiny_config(layers: usize) -> Gemma3Config {
    let mut c = Gemma3Config::published("270m", Some(layers)).expect("published config");
    c.vocab_size = VOCAB;
    c.hidden_size = HIDDEN;
    c.intermediate_size = 128;
    c.num_hidden_layers = layers;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 1;
    c.head_dim = 64;
    c.sliding_window = 16;
    c.sliding_window_pattern = 2;
    c.eos_token_ids = vec![VOCAB as u32 + 1];
    c
}

/// Random float32 weights of `config` (seed 1).
fn engine(config: Gemma3Config) -> Engine {
    let source = ModelSource::Random {
        config: Box::new(config),
        seed: 1,
    };
    let loaded = load(
        &source,
        LoadOptions {
            dtype: Dtype::Float32,
            quantize: None,
            weights: WeightStorage::Dequantized,
        },
        &mut |_, _| {},
    )
    .unwrap_or_else(|e| panic!("{e}"));
    Engine::new(loaded)
}

/// `n` token ids spread over the vocabulary.
fn prompt(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 97 + 13) % VOCAB) as u32).collect()
}

fn options(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        ..GenerateOptions::default()
    }
}

/// [`options`] decoding through the compiled fixed-shape step.
fn compiled(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        decode: DecodeMode::Compiled,
        ..options(max_tokens)
    }
}

fn run(engine: &Engine, ids: &[u32], options: &GenerateOptions) -> Generation {
    engine
        .generate_ids(ids, options, &mut |_| {})
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Greedy generation after `ids` on `caches`, which take the tokens.
fn run_on(
    engine: &Engine,
    ids: &[u32],
    caches: &mut [LayerCache],
    options: &GenerateOptions,
) -> Generation {
    generate(
        &engine.loaded.model,
        None,
        ids,
        caches,
        options,
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// [`run`] on fresh caches that the caller gets back.
fn run_keeping_caches(
    engine: &Engine,
    ids: &[u32],
    options: &GenerateOptions,
) -> (Generation, Vec<LayerCache>) {
    let mut caches = engine.new_caches(options).expect("caches");
    let g = run_on(engine, ids, &mut caches, options);
    (g, caches)
}

fn cache_bytes(caches: &[LayerCache]) -> usize {
    caches.iter().map(LayerCache::nbytes).sum()
}

/// Memory that is neither weights nor KV cache must not grow while decoding.
///
/// Method: one greedy decode of 4,000 tokens after a 10-token prompt, on a
/// 4-layer model. When the callback sees token 1,000 and token 4,000 it waits
/// for the device (`synchronize`) and reads MLX's active bytes. From each
/// reading it subtracts the weights' bytes and the caches' own bytes at that
/// moment. The callback cannot read the caches (`generate` holds them), so
/// their bytes are read from caches that are in the same state:
/// - at token 4,000 (the last; no further step queued), the caches after the
///   run itself: prompt + 3,999 tokens;
/// - at token 1,000 (the step feeding it already queued), the caches after a
///   second run of the same prompt with `max_tokens` 1,001: prompt + 1,000.
///
/// The global layers' caches grow by 512 bytes per token, so the caches alone
/// grow by 3 MB between the two readings; what is left must stay within 1 MiB.
#[test]
fn decoding_memory_is_flat() {
    let _mlx = serial();
    let engine = engine(tiny_config(4));
    let model = &engine.loaded.model;
    let ids = prompt(10);
    let long_options = options(4000);
    let mut caches = engine.new_caches(&long_options).expect("caches");
    let mut active = Vec::new();
    let mut on_token = |event: &TokenEvent<'_>| {
        if event.index == 999 || event.index == 3999 {
            device::synchronize().expect("synchronize");
            active.push(memory::active_bytes().expect("active bytes"));
        }
    };
    let long =
        generate(model, None, &ids, &mut caches, &long_options, &mut on_token).expect("generates");
    assert_eq!(
        (long.token_ids.len(), long.finish_reason),
        (4000, FinishReason::Length)
    );
    assert_eq!(active.len(), 2);
    assert_eq!(caches[1].offset(), 10 + 3999);
    let cache_at_4000 = cache_bytes(&caches);

    let mut short_caches = engine.new_caches(&long_options).expect("caches");
    let short = generate(
        model,
        None,
        &ids,
        &mut short_caches,
        &options(1001),
        &mut |_| {},
    )
    .expect("generates");
    assert_eq!(short.token_ids[..], long.token_ids[..1001]);
    assert_eq!(short_caches[1].offset(), 10 + 1000);
    let cache_at_1000 = cache_bytes(&short_caches);

    let weights = model.weight_bytes();
    let other_at_1000 = active[0] as i64 - (weights + cache_at_1000) as i64;
    let other_at_4000 = active[1] as i64 - (weights + cache_at_4000) as i64;
    eprintln!(
        "active bytes: {} at token 1000, {} at token 4000; weights {weights}; caches {cache_at_1000} and {cache_at_4000}; \
         other {other_at_1000} and {other_at_4000} (growth {})",
        active[0],
        active[1],
        other_at_4000 - other_at_1000
    );
    assert!(
        cache_at_4000 - cache_at_1000 > 3_000_000,
        "the caches grew by {} bytes only",
        cache_at_4000 - cache_at_1000
    );
    assert!(
        (other_at_4000 - other_at_1000).abs() <= 1 << 20,
        "memory besides weights and caches grew from {other_at_1000} to {other_at_4000} bytes"
    );
}

#[test]
fn stops_after_max_tokens() {
    let _mlx = serial();
    let engine = engine(tiny_config(2));
    let mut events = Vec::new();
    let g = engine
        .generate_ids(&prompt(5), &options(7), &mut |e| {
            events.push((e.index, e.id))
        })
        .expect("generates");
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(g.token_ids.len(), 7);
    assert_eq!(
        events,
        g.token_ids.iter().copied().enumerate().collect::<Vec<_>>()
    );
    assert_eq!(g.text, "", "a model without tokenizer has no text");
    assert_eq!(
        (g.metrics.prompt_tokens, g.metrics.generation_tokens),
        (5, 7)
    );
    let none = run(&engine, &prompt(5), &options(0));
    assert_eq!(
        (none.token_ids.len(), none.finish_reason),
        (0, FinishReason::Length)
    );
}

#[test]
fn stops_on_an_end_of_sequence_token() {
    let _mlx = serial();
    // Forced at once by a logit bias: <eos> (1) of the published configuration.
    let mut config = tiny_config(2);
    config.eos_token_ids = vec![1, 106];
    let with_eos = engine(config);
    let mut forced = options(20);
    forced.sampler.logit_bias = vec![(1, 1e4)];
    let mut texts = Vec::new();
    let g = with_eos
        .generate_ids(&prompt(5), &forced, &mut |e| {
            texts.push((e.id, e.text.to_string()))
        })
        .expect("generates");
    assert_eq!(
        (g.token_ids, g.finish_reason),
        (vec![1], FinishReason::Stop)
    );
    assert_eq!(texts, [(1, String::new())]);

    // Mid-way: the fourth greedy token made an end-of-sequence id.
    let free = run(&engine(tiny_config(2)), &prompt(5), &options(10));
    let stop = free.token_ids[3];
    let first = free
        .token_ids
        .iter()
        .position(|&id| id == stop)
        .expect("present");
    let mut config = tiny_config(2);
    config.eos_token_ids = vec![stop];
    let g = run(&engine(config), &prompt(5), &options(10));
    assert_eq!(g.finish_reason, FinishReason::Stop);
    assert_eq!(g.token_ids, free.token_ids[..=first]);
}

#[test]
fn cancellation_from_another_thread() {
    let _mlx = serial();
    let engine = engine(tiny_config(2));
    let options = options(2000);
    let cancel = options.cancel.clone();
    let (tx, rx) = mpsc::channel();
    let canceller = std::thread::spawn(move || {
        if rx.recv().is_ok() {
            cancel.store(true, Ordering::Relaxed);
        }
    });
    let mut on_token = |e: &TokenEvent<'_>| {
        if e.index == 2 {
            tx.send(()).expect("the canceller listens");
        }
    };
    let g = engine
        .generate_ids(&prompt(5), &options, &mut on_token)
        .expect("generates");
    canceller.join().expect("the canceller ends");
    assert_eq!(g.finish_reason, FinishReason::Cancelled);
    assert!(
        (3..2000).contains(&g.token_ids.len()),
        "{} tokens",
        g.token_ids.len()
    );

    // The flag is still set: the next generation stops before its first token.
    let g = run(&engine, &prompt(5), &options);
    assert_eq!(
        (g.token_ids.len(), g.finish_reason),
        (0, FinishReason::Cancelled)
    );
}

#[test]
fn prompt_longer_than_the_context_is_refused() {
    let _mlx = serial();
    let mut config = tiny_config(2);
    config.max_position_embeddings = 32;
    let engine = engine(config);
    let model = &engine.loaded.model;
    match engine.generate_ids(&prompt(33), &options(4), &mut |_| {}) {
        Err(GenerateError::PromptTooLong {
            tokens: 33,
            context: 32,
        }) => {}
        other => panic!("expected PromptTooLong for 33 tokens, got {other:?}"),
    }
    // Tokens already in the cache count too.
    let mut caches = engine.new_caches(&options(4)).expect("caches");
    generate(
        model,
        None,
        &prompt(20),
        &mut caches,
        &options(5),
        &mut |_| {},
    )
    .expect("generates");
    assert_eq!(caches[0].offset(), 24);
    let err = generate(
        model,
        None,
        &prompt(9),
        &mut caches,
        &options(4),
        &mut |_| {},
    )
    .expect_err("33 > 32");
    assert!(
        matches!(
            err,
            GenerateError::PromptTooLong {
                tokens: 33,
                context: 32
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the prompt needs 33 tokens but the model's context is 32 tokens"
    );
}

#[test]
fn generation_stops_when_the_context_is_full() {
    let _mlx = serial();
    let mut config = tiny_config(2);
    config.max_position_embeddings = 32;
    let engine = engine(config);
    // Every token fed to the model sits at a position below 32: after a
    // 30-token prompt, tokens 0 and 1 are fed at positions 30 and 31, and
    // token 2 is predicted from all 32 but not fed. The same when decoding
    // through the compiled step, whose caches are reserved up to the context.
    for decoding in [options(100), compiled(100)] {
        for (prompt_len, generated) in [(30, 3), (31, 2), (32, 1)] {
            let (g, caches) = run_keeping_caches(&engine, &prompt(prompt_len), &decoding);
            let case = format!("prompt of {prompt_len}, {:?}", decoding.decode);
            assert_eq!(
                (g.token_ids.len(), g.finish_reason),
                (generated, FinishReason::Length),
                "{case}"
            );
            assert_eq!(g.decode, decoding.decode, "{case}");
            assert_eq!(caches[1].offset(), 32, "{case}");
        }
    }
}

#[test]
fn empty_and_out_of_vocabulary_prompts_are_refused() {
    let _mlx = serial();
    let engine = engine(tiny_config(2));
    let err = engine
        .generate_ids(&[], &options(4), &mut |_| {})
        .expect_err("empty prompt");
    assert!(matches!(err, GenerateError::Input(_)), "{err:?}");
    assert!(err.to_string().contains("no tokens"), "{err}");
    let err = engine
        .generate_ids(&[2, 512], &options(4), &mut |_| {})
        .expect_err("id 512");
    assert!(
        err.to_string().contains("512") && err.to_string().contains("vocabulary"),
        "{err}"
    );
    let mut zero_chunk = options(4);
    zero_chunk.prefill_chunk = 0;
    let err = engine
        .generate_ids(&prompt(4), &zero_chunk, &mut |_| {})
        .expect_err("chunk 0");
    assert!(matches!(err, GenerateError::Input(_)), "{err:?}");
    let zero_steps = batched(options(4), 0);
    let err = engine
        .generate_ids(&prompt(4), &zero_steps, &mut |_| {})
        .expect_err("0 steps per sync");
    assert!(err.to_string().contains("at least 1 decode step"), "{err}");
    let err = engine
        .generate("text", &options(4), &mut |_| {})
        .expect_err("no tokenizer");
    assert!(err.to_string().contains("no tokenizer"), "{err}");
}

/// The poisoned token of [`poisoned_engine`].
const POISON: u32 = 300;

/// A tiny model whose token [`POISON`] overflows: its embedding row is 1e38
/// in one dimension (×√64 at the input: infinity, hence NaN after the first
/// RMSNorm), while the final norm's weight is 0 in that dimension, so the
/// tied output projection still gives it a finite logit (exactly 0) when it is
/// not in the input.
fn poisoned_engine() -> Engine {
    let mut engine = engine(tiny_config(2));
    let model = &mut engine.loaded.model;
    let Linear::Dense(embed) = &model.embed else {
        panic!("random weights are dense")
    };
    let mut rows: Vec<f32> = embed.to_vec().expect("embedding");
    let row = POISON as usize * HIDDEN;
    rows[row..row + HIDDEN].fill(0.0);
    rows[row + 5] = 1e38;
    model.embed =
        Linear::Dense(Array::from_slice(&rows, &[VOCAB as i32, HIDDEN as i32]).expect("array"));
    let mut norm: Vec<f32> = model.norm.to_vec().expect("norm");
    norm[5] = 0.0;
    model.norm = Array::from_slice(&norm, &[HIDDEN as i32]).expect("array");
    engine
}

#[test]
fn non_finite_logits_name_the_step() {
    let _mlx = serial();
    let engine = poisoned_engine();
    // In the prompt: the first generated token's logits are NaN.
    let mut ids = prompt(6);
    ids[3] = POISON;
    let err = engine
        .generate_ids(&ids, &options(5), &mut |_| {})
        .expect_err("NaN");
    assert!(
        matches!(err, GenerateError::NonFinite { step: 0 }),
        "{err:?}"
    );
    // Generated first (a logit bias picks it): the second token's logits are NaN.
    let mut options = options(5);
    options.sampler.logit_bias = vec![(POISON, 100.0)];
    let mut seen = Vec::new();
    let err = engine
        .generate_ids(&prompt(6), &options, &mut |e| seen.push(e.id))
        .expect_err("NaN");
    assert!(
        matches!(err, GenerateError::NonFinite { step: 1 }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "non-finite logits (NaN or infinity) at generation step 1"
    );
    assert_eq!(seen, [POISON]);
}

#[test]
fn chunked_prefill_matches_one_chunk() {
    let _mlx = serial();
    let engine = engine(tiny_config(4));
    let ids = prompt(100);
    let whole = run(&engine, &ids, &options(40));
    let mut chunked = options(40);
    chunked.prefill_chunk = 7;
    let (g, caches) = run_keeping_caches(&engine, &ids, &chunked);
    assert_eq!(g.token_ids, whole.token_ids);
    assert_eq!(caches[1].offset(), 100 + 39);
}

/// Greedy decoding the plain way: a forward pass over the whole prompt, then
/// one token at a time, each read back before the next step is built.
fn naive_greedy(engine: &Engine, ids: &[u32], n: usize) -> Vec<u32> {
    let model = &engine.loaded.model;
    let mut caches = model.make_caches(CacheFormat::COMPUTE).expect("caches");
    let as_i32: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
    let mut input = Array::from_slice(&as_i32, &[1, as_i32.len() as i32]).expect("array");
    let mut out = Vec::new();
    for _ in 0..n {
        let logits = model.forward(&input, &mut caches).expect("forward");
        let l = logits.dim(1).expect("length");
        let last = logits
            .slice(&[0, l - 1, 0], &[1, l, VOCAB as i32], &[1, 1, 1])
            .expect("slice");
        let id: u32 = last
            .reshape(&[-1])
            .and_then(|x| x.argmax(0, false))
            .and_then(|x| x.astype(Dtype::Uint32))
            .and_then(|x| x.item())
            .expect("argmax");
        out.push(id);
        input = Array::from_slice(&[id as i32], &[1, 1]).expect("array");
    }
    out
}

/// [`options`] queueing `steps` decode steps per synchronisation.
fn batched(options: GenerateOptions, steps: usize) -> GenerateOptions {
    GenerateOptions {
        steps_per_sync: steps,
        ..options
    }
}

/// Pipelined generation, eager or compiled, one step or a batch of steps per
/// synchronisation, gives the naive loop's tokens.
#[test]
fn batched_steps_give_the_tokens_of_single_steps() {
    let _mlx = serial();
    let plain = engine(tiny_config(4));
    let ids = prompt(12);
    // 50 tokens: the sliding layers' window of 16 wraps three times.
    let naive = naive_greedy(&plain, &ids, 50);
    for steps in [1, 2, 3, 8] {
        for decoding in [options(50), compiled(50)] {
            let case = format!("{steps} steps per sync, {:?}", decoding.decode);
            let (g, caches) = run_keeping_caches(&plain, &ids, &batched(decoding, steps));
            assert_eq!(g.token_ids, naive, "{case}");
            // Never a step past max_tokens: the last token is not fed.
            assert!(caches.iter().all(|c| c.offset() == 12 + 49), "{case}");
        }
    }

    // A stop mid-batch: the same tokens, and the caches took the steps
    // queued past the stop, fewer than two batches.
    let stop = naive[3];
    let first = naive.iter().position(|&id| id == stop).expect("present");
    let mut config = tiny_config(4);
    config.eos_token_ids = vec![stop];
    let stopping = engine(config);
    for steps in [1, 2, 8] {
        let (g, caches) = run_keeping_caches(&stopping, &ids, &batched(options(50), steps));
        assert_eq!(
            (g.token_ids.as_slice(), g.finish_reason),
            (&naive[..=first], FinishReason::Stop),
            "{steps} steps per sync"
        );
        let run_steps = caches[1].offset() as usize - (ids.len() - 1);
        let past = run_steps - g.token_ids.len();
        assert!(
            (1..2 * steps).contains(&past),
            "{steps} steps per sync: {past} steps past the stop"
        );
    }

    // Penalties over the recent tokens and seeded sampling see the same
    // tokens and random draws, step by step, whatever the batch.
    let sampled = GenerateOptions {
        sampler: SamplerConfig {
            temperature: 1.0,
            seed: 7,
            repetition_penalty: Some(1.5),
            repetition_window: 6,
            ..SamplerConfig::default()
        },
        ..options(40)
    };
    let single = run(&plain, &ids, &sampled).token_ids;
    assert_eq!(
        run(&plain, &ids, &batched(sampled.clone(), 8)).token_ids,
        single
    );
    assert_ne!(single, naive[..40], "sampling gave the greedy ids");

    // The context bound holds for every step of a batch.
    let mut config = tiny_config(2);
    config.max_position_embeddings = 32;
    let short = engine(config);
    for decoding in [options(100), compiled(100)] {
        let (g, caches) = run_keeping_caches(&short, &prompt(30), &batched(decoding, 8));
        assert_eq!(
            (g.token_ids.len(), g.finish_reason),
            (3, FinishReason::Length)
        );
        assert_eq!(caches[1].offset(), 32);
    }
}

#[test]
fn seeded_sampling_is_reproducible() {
    let _mlx = serial();
    let engine = engine(tiny_config(2));
    let sampled = |seed: u64| {
        let options = GenerateOptions {
            max_tokens: 24,
            sampler: SamplerConfig {
                temperature: 1.0,
                seed,
                ..SamplerConfig::default()
            },
            ..GenerateOptions::default()
        };
        run(&engine, &prompt(5), &options).token_ids
    };
    let a = sampled(7);
    assert_eq!(a, sampled(7));
    assert_ne!(a, sampled(8));
    assert_ne!(
        a,
        run(&engine, &prompt(5), &options(24)).token_ids,
        "sampling at temperature 1 gave the greedy ids"
    );
}

#[test]
fn compiled_decoding_continues_a_conversation_as_eager_decoding_does() {
    let _mlx = serial();
    let engine = engine(tiny_config(4));
    let turns = |options: &GenerateOptions| -> Vec<Vec<u32>> {
        let mut caches = engine.new_caches(options).expect("caches");
        [prompt(20), prompt(7)]
            .iter()
            .map(|ids| run_on(&engine, ids, &mut caches, options).token_ids)
            .collect()
    };
    let eager = turns(&options(30));
    assert_eq!(turns(&compiled(30)), eager);
    let (g, _) = run_keeping_caches(&engine, &prompt(20), &compiled(5));
    assert_eq!(g.decode, DecodeMode::Compiled);
    // An 8-bit cache takes fixed-shape steps too, and gives the tokens of
    // eager decoding in both turns.
    let q8 = gemma::cache::KvFormat::Quantized {
        bits: 8,
        group_size: 64,
    };
    let quantized = |decode| GenerateOptions {
        decode,
        cache_formats: CacheFormat {
            keys: q8,
            values: q8,
            ..CacheFormat::COMPUTE
        }
        .into(),
        ..options(30)
    };
    assert_eq!(
        turns(&quantized(DecodeMode::Compiled)),
        turns(&quantized(DecodeMode::Eager))
    );
    let (g, _) = run_keeping_caches(&engine, &prompt(20), &quantized(DecodeMode::Compiled));
    assert_eq!(g.decode, DecodeMode::Compiled);
    // A cache that keeps floats past the prompt changes its format while
    // generating: compiled falls back to eager decoding, and says so.
    let later = GenerateOptions {
        kv_start: 25,
        ..quantized(DecodeMode::Compiled)
    };
    let (g, _) = run_keeping_caches(&engine, &prompt(20), &later);
    assert_eq!(g.decode, DecodeMode::Eager);
}

#[test]
fn compiled_decoding_names_the_step_of_non_finite_logits() {
    let _mlx = serial();
    let engine = poisoned_engine();
    let mut options = compiled(5);
    options.sampler.logit_bias = vec![(POISON, 100.0)];
    let err = engine
        .generate_ids(&prompt(6), &options, &mut |_| {})
        .expect_err("NaN");
    assert!(
        matches!(err, GenerateError::NonFinite { step: 1 }),
        "{err:?}"
    );
}
