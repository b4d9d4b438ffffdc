//! Chat prompts: the built-in Gemma 3 format, the same format as a Jinja
//! template, and arbitrary Jinja templates, on arbitrary messages.
//!
//! The input is a flag byte (bit 0: add the generation prompt; bit 1: the
//! first part is a template source), then parts separated by 0xFF (which
//! UTF-8 never holds): each part is a role byte (modulo 3: system, user,
//! assistant) and the message content (bytes that are not UTF-8 become
//! U+FFFD). Invariants: the built-in format and its Jinja template give the
//! same prompt or the same refusal; a prompt starts with `<bos>`, holds one
//! turn per non-system message with its content trimmed, and ends with the
//! generation prompt when asked; an arbitrary template compiles and renders
//! or fails with an error, never a panic.

#![no_main]

use gemma::chat_template::{
    format_gemma3, ChatMessage, ChatTemplate, ChatTemplateError, JinjaTemplate, Role,
    GEMMA3_BOS_TOKEN, GEMMA3_CHAT_TEMPLATE,
};
use gemma_fuzz::input::{split, Input};
use libfuzzer_sys::fuzz_target;

/// Longest template source tried: longer ones only slow the search.
const MAX_SOURCE: usize = 2048;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let flags = input.byte();
    let add_generation_prompt = flags & 1 == 1;
    let mut parts = split(input.rest(), 0xFF);
    if flags & 2 == 2 {
        let source = String::from_utf8_lossy(parts.next().unwrap_or_default());
        let messages = messages(parts);
        if source.len() <= MAX_SOURCE {
            if let Ok(template) = JinjaTemplate::new(&source, GEMMA3_BOS_TOKEN) {
                let _ = template.render(&messages, add_generation_prompt);
            }
        }
        return;
    }
    let messages = messages(parts);
    let builtin = format_gemma3(&messages, add_generation_prompt);
    let jinja = ChatTemplate::from_source(Some(GEMMA3_CHAT_TEMPLATE), GEMMA3_BOS_TOKEN)
        .expect("the built-in template compiles")
        .render(&messages, add_generation_prompt);
    match (&builtin, &jinja) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "format_gemma3 and its Jinja template differ"),
        (Err(ChatTemplateError::Rejected(a)), Err(ChatTemplateError::Rejected(b))) => {
            assert_eq!(a, b)
        }
        _ => panic!("format_gemma3 gave {builtin:?}, the Jinja template {jinja:?}"),
    }
    if let Ok(prompt) = builtin {
        check_prompt(&prompt, &messages, add_generation_prompt);
    }
});

/// The messages of the remaining parts.
fn messages<'a>(parts: impl Iterator<Item = &'a [u8]>) -> Vec<ChatMessage> {
    parts
        .map(|part| {
            let mut part = Input::new(part);
            let role = match part.byte() % 3 {
                0 => Role::System,
                1 => Role::User,
                _ => Role::Assistant,
            };
            ChatMessage::new(role, String::from_utf8_lossy(part.rest()))
        })
        .collect()
}

/// The shape of an accepted prompt: `<bos>`, one turn per message after a
/// leading system message, each holding its trimmed content, then the
/// generation prompt when asked.
fn check_prompt(prompt: &str, messages: &[ChatMessage], add_generation_prompt: bool) {
    let mut rest = prompt
        .strip_prefix(GEMMA3_BOS_TOKEN)
        .expect("starts with <bos>");
    let (system, turns) = match messages.split_first() {
        Some((first, rest)) if first.role == Role::System => (Some(&first.content), rest),
        _ => (None, messages),
    };
    for (index, turn) in turns.iter().enumerate() {
        let who = if turn.role == Role::Assistant {
            "model"
        } else {
            "user"
        };
        let head = format!("<start_of_turn>{who}\n");
        rest = rest.strip_prefix(head.as_str()).expect("a turn's head");
        if let (0, Some(system)) = (index, system) {
            rest = rest
                .strip_prefix(system.as_str())
                .expect("the system message");
            rest = rest.strip_prefix("\n\n").expect("a blank line after it");
        }
        rest = rest
            .strip_prefix(turn.content.trim())
            .expect("the trimmed content");
        rest = rest
            .strip_prefix("<end_of_turn>\n")
            .expect("the turn's end");
    }
    let tail = if add_generation_prompt {
        "<start_of_turn>model\n"
    } else {
        ""
    };
    assert_eq!(rest, tail, "what follows the turns");
}
