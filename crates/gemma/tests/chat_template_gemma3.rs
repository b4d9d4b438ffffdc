//! The built-in Gemma 3 chat format, the same format as a Jinja template
//! rendered by minijinja, and other Jinja templates.

use gemma::chat_template::{
    format_gemma3, ChatMessage, ChatTemplate, ChatTemplateError, Role, ALTERNATION_MESSAGE,
    GEMMA3_CHAT_TEMPLATE,
};

fn system(text: &str) -> ChatMessage {
    ChatMessage::new(Role::System, text)
}
fn user(text: &str) -> ChatMessage {
    ChatMessage::new(Role::User, text)
}
fn assistant(text: &str) -> ChatMessage {
    ChatMessage::new(Role::Assistant, text)
}

fn conversations() -> Vec<Vec<ChatMessage>> {
    vec![
        vec![user("Hello!")],
        vec![system("You are a terse assistant."), user("What is 2+2?")],
        vec![
            system("Answer in French."),
            user("  Hi there \n"),
            assistant("Bonjour !\n\n"),
            user("How are you?"),
            assistant("Très bien, merci."),
        ],
        vec![
            user("Line one\nLine two\n\n  indented"),
            assistant("ok"),
            user("日本語 😀"),
        ],
        vec![system("Only a system message.")],
        vec![],
    ]
}

#[test]
fn builtin_format_system_and_user_with_generation_prompt() {
    let prompt = format_gemma3(&[system("Be brief."), user(" Hi ")], true).unwrap();
    assert_eq!(
        prompt,
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
}

#[test]
fn builtin_format_multi_turn_without_generation_prompt() {
    let messages = [user("Hi"), assistant("Hello."), user("Bye")];
    let prompt = format_gemma3(&messages, false).unwrap();
    assert_eq!(
        prompt,
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n"
    );
}

#[test]
fn jinja_gemma3_template_renders_like_the_builtin_format() {
    let jinja = ChatTemplate::from_source(Some(GEMMA3_CHAT_TEMPLATE), "<bos>").unwrap();
    for messages in conversations() {
        for add_generation_prompt in [false, true] {
            assert_eq!(
                jinja.render(&messages, add_generation_prompt).unwrap(),
                format_gemma3(&messages, add_generation_prompt).unwrap(),
                "{messages:?} add_generation_prompt={add_generation_prompt}"
            );
        }
    }
}

#[test]
fn model_without_template_uses_the_builtin_format() {
    let template = ChatTemplate::from_source(None, "<bos>").unwrap();
    assert!(matches!(template, ChatTemplate::Gemma3));
    assert_eq!(
        template.render(&[user("x")], true).unwrap(),
        "<bos><start_of_turn>user\nx<end_of_turn>\n<start_of_turn>model\n"
    );
}

#[test]
fn roles_out_of_order_are_rejected_with_the_template_message() {
    let jinja = ChatTemplate::from_source(Some(GEMMA3_CHAT_TEMPLATE), "<bos>").unwrap();
    let bad = [
        vec![user("a"), user("b")],
        vec![assistant("a")],
        vec![user("a"), assistant("b"), assistant("c")],
        vec![user("a"), system("late system")],
    ];
    for messages in bad {
        for template in [&jinja, &ChatTemplate::Gemma3] {
            match template.render(&messages, true) {
                Err(ChatTemplateError::Rejected(message)) => {
                    assert_eq!(message, ALTERNATION_MESSAGE, "{messages:?}")
                }
                other => panic!("{messages:?}: expected a rejection, got {other:?}"),
            }
        }
    }
    assert_eq!(
        ALTERNATION_MESSAGE,
        "Conversation roles must alternate user/assistant/user/assistant/..."
    );
}

/// Expected strings from Python's jinja2 with `trim_blocks=True, lstrip_blocks=True`, as
/// Hugging Face's `apply_chat_template` sets it up.
#[test]
fn other_jinja_templates_render_like_hugging_face() {
    let messages = [system(" sys "), user("hi")];
    let indented = "{% for m in messages %}\n    <|{{ m.role }}|>{{ m.content.strip() }}\n{% endfor %}\n{% if add_generation_prompt %}<|assistant|>{% endif %}";
    let template = ChatTemplate::from_source(Some(indented), "<s>").unwrap();
    assert_eq!(
        template.render(&messages, true).unwrap(),
        "    <|system|>sys\n    <|user|>hi\n<|assistant|>"
    );
    let nested_blocks = "{% for m in messages %}\n  {% if m.role == \"user\" %}\n<|{{ m.role }}|>{{ m.content.strip() }}\n  {% endif %}\n{% endfor %}";
    let template = ChatTemplate::from_source(Some(nested_blocks), "<s>").unwrap();
    assert_eq!(template.render(&messages, true).unwrap(), "<|user|>hi\n");

    let uses_bos =
        ChatTemplate::from_source(Some("{{ bos_token }}{{ messages | length }}"), "<s>").unwrap();
    assert_eq!(
        uses_bos
            .render(&[user("a"), assistant("b")], false)
            .unwrap(),
        "<s>2"
    );
}

#[test]
fn template_errors_are_reported() {
    let error = ChatTemplate::from_source(Some("{% for m in messages %}"), "<bos>").unwrap_err();
    assert!(matches!(error, ChatTemplateError::Template(_)), "{error:?}");

    let raising =
        ChatTemplate::from_source(Some("{{ raise_exception('no tools here') }}"), "<bos>").unwrap();
    let error = raising.render(&[user("a")], false).unwrap_err();
    assert_eq!(error.to_string(), "no tools here");
}

#[test]
fn a_template_that_runs_too_long_fails_instead_of_hanging() {
    // 10⁸ loop iterations: stopped by the fuel limit, with minijinja's
    // out-of-fuel message.
    let endless = ChatTemplate::from_source(
        Some("{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}"),
        "<bos>",
    )
    .unwrap();
    let error = endless.render(&[user("a")], false).unwrap_err();
    assert!(matches!(error, ChatTemplateError::Template(_)), "{error:?}");
    assert!(error.to_string().contains("fuel"), "{error}");
    // A long conversation stays well within the limit with Gemma 3's template.
    let long: Vec<ChatMessage> = (0..20_000)
        .map(|i| {
            if i % 2 == 0 {
                user("q")
            } else {
                assistant("a")
            }
        })
        .collect();
    let jinja = ChatTemplate::from_source(Some(GEMMA3_CHAT_TEMPLATE), "<bos>").unwrap();
    assert_eq!(
        jinja.render(&long, true).unwrap(),
        format_gemma3(&long, true).unwrap()
    );
}

#[test]
fn roles_read_and_write_as_lowercase_names() {
    let messages: Vec<ChatMessage> = serde_json::from_str(
        r#"[{"role":"system","content":"s"},{"role":"user","content":"u"},
            {"role":"assistant","content":"a"},{"role":"model","content":"m"}]"#,
    )
    .unwrap();
    let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::System, Role::User, Role::Assistant, Role::Assistant]
    );
    assert_eq!(
        serde_json::to_string(&assistant("a")).unwrap(),
        r#"{"role":"assistant","content":"a"}"#
    );
    assert!(serde_json::from_str::<ChatMessage>(r#"{"role":"tool","content":"x"}"#).is_err());
}

#[test]
fn tokenizer_config_template_and_bos_token_are_used() {
    let dir = tempfile::tempdir().unwrap();
    let with_template = dir.path().join("with_template.json");
    std::fs::write(
        &with_template,
        r#"{"bos_token": {"content": "<B>"}, "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}"}"#,
    )
    .unwrap();
    let without_template = dir.path().join("without_template.json");
    std::fs::write(&without_template, r#"{"bos_token": "<bos>"}"#).unwrap();

    let template = ChatTemplate::from_tokenizer_config(&with_template).unwrap();
    assert_eq!(
        template.render(&[user("a"), assistant("b")], true).unwrap(),
        "<B>[a][b]"
    );
    let builtin = ChatTemplate::from_tokenizer_config(&without_template).unwrap();
    assert!(matches!(builtin, ChatTemplate::Gemma3));
    let missing = ChatTemplate::from_tokenizer_config(&dir.path().join("absent.json")).unwrap_err();
    assert!(missing.to_string().contains("absent.json"), "{missing}");
}
