//! Chat prompts: turning a conversation into the text Gemma 3 was trained on.
//!
//! A model's own Jinja `chat_template` (from `tokenizer_config.json` or the
//! GGUF key `tokenizer.chat_template`) is rendered with `minijinja`, set up
//! like Hugging Face's `apply_chat_template` (`trim_blocks`, `lstrip_blocks`,
//! `raise_exception`, Python string methods). A model without one gets the
//! built-in Gemma 3 format ([`format_gemma3`]):
//!
//! ```text
//! <bos><start_of_turn>user
//! {system}
//!
//! {user}<end_of_turn>
//! <start_of_turn>model
//! {assistant}<end_of_turn>
//! <start_of_turn>model
//! ```
//!
//! Turn contents are trimmed of surrounding whitespace; the system message
//! (only as the first message) is put, untrimmed and followed by a blank line,
//! in front of the first user turn; the other turns must alternate user,
//! assistant, user, ... The last `<start_of_turn>model\n` asks for the reply
//! and is only there with `add_generation_prompt`.
//! [`GEMMA3_CHAT_TEMPLATE`] is the same format as a Jinja template.

use std::path::Path;

use minijinja::value::Serde;
use minijinja::{context, Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::gguf::GgufFile;

/// Gemma's beginning-of-sequence text, which starts every prompt.
pub const GEMMA3_BOS_TOKEN: &str = "<bos>";

/// The message the Gemma 3 format gives when turns do not alternate user/assistant.
pub const ALTERNATION_MESSAGE: &str =
    "Conversation roles must alternate user/assistant/user/assistant/...";

/// The Gemma 3 chat format as a Jinja template; renders exactly as [`format_gemma3`].
pub const GEMMA3_CHAT_TEMPLATE: &str = r#"{{- bos_token -}}
{%- if messages and messages[0].role == "system" -%}
  {%- set system_prefix = messages[0].content ~ "\n\n" -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set system_prefix = "" -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- for turn in turns -%}
  {%- if turn.role != ("user" if loop.index0 is even else "assistant") -%}
    {{- raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") -}}
  {%- endif -%}
  {{- "<start_of_turn>" ~ ("model" if turn.role == "assistant" else "user") ~ "\n" -}}
  {%- if loop.first -%}
    {{- system_prefix -}}
  {%- endif -%}
  {{- turn.content | trim -}}
  {{- "<end_of_turn>\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- "<start_of_turn>model\n" -}}
{%- endif -%}
"#;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions for the whole conversation.
    System,
    /// The person talking to the model.
    User,
    /// The model; "model" is accepted as a name for it too.
    #[serde(alias = "model")]
    Assistant,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// What it says.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role` saying `content`.
    pub fn new(role: Role, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role,
            content: content.into(),
        }
    }
}

/// What went wrong making a prompt.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The conversation breaks the template's rules; the message is the template's own.
    #[error("{0}")]
    Rejected(String),
    /// The template has a syntax error or failed while rendering.
    #[error("chat template: {0}")]
    Template(String),
    /// A `tokenizer_config.json` could not be read or has no usable template.
    #[error("{path}: {message}")]
    Config {
        /// The file.
        path: String,
        /// The problem.
        message: String,
    },
}

/// A way of turning a conversation into a prompt.
#[derive(Debug)]
pub enum ChatTemplate {
    /// A model's own Jinja template.
    Jinja(Box<JinjaTemplate>),
    /// The built-in Gemma 3 format.
    Gemma3,
}

impl ChatTemplate {
    /// The model's Jinja template when it has one, else the built-in Gemma 3 format.
    pub fn from_source(
        source: Option<&str>,
        bos_token: &str,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        match source {
            Some(source) => Ok(ChatTemplate::Jinja(Box::new(JinjaTemplate::new(
                source, bos_token,
            )?))),
            None => Ok(ChatTemplate::Gemma3),
        }
    }

    /// The template stored under `tokenizer.chat_template` in a GGUF file, else the built-in one.
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTemplate, ChatTemplateError> {
        let source = file
            .get("tokenizer.chat_template")
            .and_then(|value| value.as_str());
        ChatTemplate::from_source(source, GEMMA3_BOS_TOKEN)
    }

    /// The `chat_template` of a `tokenizer_config.json` (its `bos_token` too, when given),
    /// else the built-in one.
    pub fn from_tokenizer_config(path: &Path) -> Result<ChatTemplate, ChatTemplateError> {
        let config_error = |message: String| ChatTemplateError::Config {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| config_error(e.to_string()))?;
        let config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| config_error(e.to_string()))?;
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(source)) => Some(source.as_str()),
            Some(serde_json::Value::Array(named)) => {
                Some(default_named_template(named).ok_or_else(|| {
                    config_error(
                        "chat_template is a list without a template named \"default\"".to_owned(),
                    )
                })?)
            }
            Some(_) => {
                return Err(config_error(
                    "chat_template is neither a string nor a list".to_owned(),
                ))
            }
        };
        let bos_token = match config.get("bos_token") {
            Some(serde_json::Value::String(token)) => token.as_str(),
            Some(serde_json::Value::Object(token)) => token
                .get("content")
                .and_then(|content| content.as_str())
                .unwrap_or(GEMMA3_BOS_TOKEN),
            _ => GEMMA3_BOS_TOKEN,
        };
        ChatTemplate::from_source(source, bos_token)
    }

    /// The prompt for `messages`, ending with the request for the model's reply when
    /// `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        match self {
            ChatTemplate::Jinja(template) => template.render(messages, add_generation_prompt),
            ChatTemplate::Gemma3 => format_gemma3(messages, add_generation_prompt),
        }
    }
}

/// The template named "default" in a list of `{"name", "template"}` entries.
fn default_named_template(named: &[serde_json::Value]) -> Option<&str> {
    named
        .iter()
        .find(|entry| entry.get("name").and_then(|name| name.as_str()) == Some("default"))
        .and_then(|entry| entry.get("template"))
        .and_then(|template| template.as_str())
}

/// A compiled Jinja chat template with the `bos_token` it is rendered with.
#[derive(Debug)]
pub struct JinjaTemplate {
    environment: Environment<'static>,
    bos_token: String,
}

/// Template instructions one rendering may run: Gemma 3's template renders a
/// conversation of 20,000 messages within it (a test does), while a template
/// that loops without end (or nests loops over long ranges) stops within a
/// fraction of a second with an error instead of hanging the caller.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// The name the template is stored under in its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// The error `raise_exception` returns, so that its message can be told from other failures.
#[derive(Debug, thiserror::Error)]
#[error("raised by the chat template")]
struct RaisedByTemplate;

impl JinjaTemplate {
    /// Compiles `source`, to be rendered with `bos_token`.
    pub fn new(source: &str, bos_token: &str) -> Result<JinjaTemplate, ChatTemplateError> {
        let mut environment = Environment::new();
        let mut syntax = minijinja::syntax::SyntaxConfig::builder();
        syntax.trim_blocks(true).lstrip_blocks(true);
        environment.set_syntax(syntax.build().map_err(template_error)?);
        environment
            .set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        environment.set_fuel(Some(TEMPLATE_FUEL));
        environment.add_function(
            "raise_exception",
            |message: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message)
                    .with_source(RaisedByTemplate))
            },
        );
        environment
            .add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(template_error)?;
        Ok(JinjaTemplate {
            environment,
            bos_token: bos_token.to_owned(),
        })
    }

    /// Renders the template for `messages`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .environment
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        template
            .render(context! {
                messages => Value::from(Serde(messages)),
                bos_token => self.bos_token.as_str(),
                add_generation_prompt => add_generation_prompt,
            })
            .map_err(template_error)
    }
}

/// A template's failure: the message alone when the template raised it, else the full error.
fn template_error(error: minijinja::Error) -> ChatTemplateError {
    let raised = std::error::Error::source(&error)
        .is_some_and(|source| source.downcast_ref::<RaisedByTemplate>().is_some());
    match (raised, error.detail()) {
        (true, Some(message)) => ChatTemplateError::Rejected(message.to_owned()),
        _ => ChatTemplateError::Template(error.to_string()),
    }
}

/// The built-in Gemma 3 format (see the module documentation).
pub fn format_gemma3(
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<String, ChatTemplateError> {
    let (system, turns) = match messages.split_first() {
        Some((first, rest)) if first.role == Role::System => (Some(first.content.as_str()), rest),
        _ => (None, messages),
    };
    let mut prompt = String::from(GEMMA3_BOS_TOKEN);
    for (index, turn) in turns.iter().enumerate() {
        let expected = if index % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        if turn.role != expected {
            return Err(ChatTemplateError::Rejected(ALTERNATION_MESSAGE.to_owned()));
        }
        prompt.push_str("<start_of_turn>");
        prompt.push_str(if turn.role == Role::Assistant {
            "model"
        } else {
            "user"
        });
        prompt.push('\n');
        if let (0, Some(system)) = (index, system) {
            prompt.push_str(system);
            prompt.push_str("\n\n");
        }
        prompt.push_str(turn.content.trim());
        prompt.push_str("<end_of_turn>\n");
    }
    if add_generation_prompt {
        prompt.push_str("<start_of_turn>model\n");
    }
    Ok(prompt)
}
