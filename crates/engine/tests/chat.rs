//! Multi-turn chat on the default model: the KV cache carried from turn to
//! turn gives the same reply as running the whole conversation afresh.

mod common;

use engine::options::DecodeMode;
use engine::{ChatSession, Engine, FinishReason, GenerateOptions};
use gemma::chat_template::{ChatMessage, Role};
use gemma::load::{load, LoadOptions, ModelSource, WeightStorage};
use mlx_core::Dtype;

fn default_engine() -> Engine {
    let source = ModelSource::Gguf(common::default_model_path());
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

/// The token count of `messages` rendered with the template, ready for the
/// model's reply.
fn rendered_len(engine: &Engine, messages: &[ChatMessage]) -> usize {
    let text = engine
        .loaded
        .chat_template
        .render(messages, true)
        .expect("renders");
    engine
        .tokenizer()
        .expect("tokenizer")
        .encode(&text, false)
        .expect("encodes")
        .len()
}

/// Two turns of a [`ChatSession`], then the second turn again from the whole
/// history on a fresh cache: the same tokens, and the session ran fewer
/// prompt tokens than the history holds.
fn check_second_turn(
    engine: &Engine,
    options: &GenerateOptions,
    first_finish: FinishReason,
    case: &str,
) {
    let mut session = ChatSession::new(engine, None, options.clone()).expect("session");
    assert_eq!(session.cached_tokens(), 0);

    let first_user = "What is the capital of France?";
    let first = session
        .send(engine, first_user, &mut |_| {})
        .expect("first turn");
    assert_eq!(
        first.finish_reason, first_finish,
        "{case}: first reply {:?}",
        first.text
    );
    let after_first = session.cached_tokens();
    let first_prompt = rendered_len(engine, &[ChatMessage::new(Role::User, first_user)]);
    assert_eq!(
        first.metrics.prompt_tokens, first_prompt,
        "{case}: a fresh session runs the whole first prompt"
    );
    // The prompt and the reply, less a last token never fed (the reply
    // ran to max_tokens); no step queued past the reply stays.
    let unfed = usize::from(first_finish == FinishReason::Length);
    assert_eq!(
        after_first,
        first_prompt + first.token_ids.len() - unfed,
        "{case}: the cache holds the prompt and the reply"
    );

    let second_user = "And what is the capital of Germany?";
    let second = session
        .send(engine, second_user, &mut |_| {})
        .expect("second turn");
    assert!(session.cached_tokens() > after_first, "{case}");
    assert_eq!(session.messages().len(), 4, "{case}");
    assert_eq!(session.messages()[1].content, first.text, "{case}");

    let history = [
        ChatMessage::new(Role::User, first_user),
        ChatMessage::new(Role::Assistant, first.text.clone()),
        ChatMessage::new(Role::User, second_user),
    ];
    let fresh = engine
        .chat(&history, options, &mut |_| {})
        .expect("fresh run");
    assert_eq!(
        fresh.metrics.prompt_tokens,
        rendered_len(engine, &history),
        "{case}"
    );
    assert_eq!(
        second.token_ids, fresh.token_ids,
        "{case}: second turn with the cache vs the whole history without"
    );
    assert_eq!(second.text, fresh.text, "{case}");
    assert_eq!(second.finish_reason, fresh.finish_reason, "{case}");
    // The first prompt and the reply's tokens came from the cache.
    assert!(
        second.metrics.prompt_tokens < fresh.metrics.prompt_tokens - first_prompt,
        "{case}: the second turn ran {} prompt tokens; the history has {} (the first prompt alone {first_prompt})",
        second.metrics.prompt_tokens,
        fresh.metrics.prompt_tokens
    );
}

#[test]
fn second_turn_with_cache_equals_the_whole_history_without() {
    let engine = default_engine();
    // The base model's greedy reply runs to max_tokens.
    let length = GenerateOptions {
        max_tokens: 12,
        ..GenerateOptions::default()
    };
    check_second_turn(
        &engine,
        &length,
        FinishReason::Length,
        "reply cut at max_tokens",
    );

    // A bias on <end_of_turn> (106) ends the first reply after 7 tokens; the
    // cache holds <end_of_turn>, as the rendered history does.
    let mut end_of_turn = length.clone();
    end_of_turn.sampler.logit_bias = vec![(106, 12.0)];
    check_second_turn(
        &engine,
        &end_of_turn,
        FinishReason::Stop,
        "reply ended by <end_of_turn>",
    );

    // The same with 8 steps queued per synchronisation: the steps run past
    // <end_of_turn> are trimmed from the cache.
    let batched = GenerateOptions {
        steps_per_sync: 8,
        ..end_of_turn.clone()
    };
    check_second_turn(
        &engine,
        &batched,
        FinishReason::Stop,
        "reply ended by <end_of_turn>, 8 steps per sync",
    );

    // The same with the compiled step (the command line's default on the
    // GPU), whose caches are reserved ahead.
    let compiled = GenerateOptions {
        decode: DecodeMode::Compiled,
        ..batched.clone()
    };
    check_second_turn(
        &engine,
        &compiled,
        FinishReason::Stop,
        "reply ended by <end_of_turn>, 8 steps per sync, compiled step",
    );

    // The reply is cut before "France": the cache holds tokens the history
    // does not, and is rewound.
    let mut stop_string = length;
    stop_string.stop_strings = vec!["France".into()];
    check_second_turn(
        &engine,
        &stop_string,
        FinishReason::StopString,
        "reply cut by a stop string",
    );
}
