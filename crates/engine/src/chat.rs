//! Multi-turn chat that reuses the KV cache of earlier turns.

use gemma::cache::LayerCache;
use gemma::chat_template::{ChatMessage, Role};

use crate::engine::Engine;
use crate::error::GenerateError;
use crate::generate::{generate, Generation, TokenEvent};
use crate::options::GenerateOptions;

/// A conversation whose KV cache carries over from turn to turn: each turn
/// runs only the tokens after the longest prefix the cache already holds.
#[derive(Debug)]
pub struct ChatSession {
    messages: Vec<ChatMessage>,
    caches: Vec<LayerCache>,
    /// Token ids whose keys and values are in `caches`, in order.
    cached_ids: Vec<u32>,
    options: GenerateOptions,
}

impl ChatSession {
    /// A new conversation, optionally with a system message.
    pub fn new(
        engine: &Engine,
        system: Option<&str>,
        options: GenerateOptions,
    ) -> Result<ChatSession, GenerateError> {
        let caches = engine.new_caches(&options)?;
        let messages = system
            .map(|s| vec![ChatMessage::new(Role::System, s)])
            .unwrap_or_default();
        Ok(ChatSession {
            messages,
            caches,
            cached_ids: Vec::new(),
            options,
        })
    }

    /// The conversation so far.
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// Tokens the cache holds (the next turn reuses those its prompt
    /// begins with).
    pub fn cached_tokens(&self) -> usize {
        self.caches.first().map_or(0, |c| c.offset() as usize)
    }

    /// Adds a user message and generates the model's reply.
    pub fn send(
        &mut self,
        engine: &Engine,
        user: &str,
        on_token: &mut dyn FnMut(&TokenEvent<'_>),
    ) -> Result<Generation, GenerateError> {
        self.messages.push(ChatMessage::new(Role::User, user));
        let prompt = engine.loaded.chat_template.render(&self.messages, true)?;
        let ids = engine.tokenizer()?.encode(&prompt, false)?;
        let common = self
            .cached_ids
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count();
        // Keep at least one new token to run; rewind the cache to the common prefix.
        let keep = common.min(ids.len().saturating_sub(1));
        let drop = self.cached_ids.len() - keep;
        let rewound = self
            .caches
            .iter_mut()
            .all(|c| c.trim(drop as i32) == drop as i32);
        let keep = if rewound {
            keep
        } else {
            self.caches = engine.new_caches(&self.options)?;
            0
        };
        self.cached_ids.truncate(keep);
        let result = generate(
            &engine.loaded.model,
            engine.loaded.tokenizer.as_ref(),
            &ids[keep..],
            &mut self.caches,
            &self.options,
            on_token,
        );
        let generation = match result {
            Ok(g) => g,
            Err(e) => {
                self.messages.pop();
                self.caches = engine.new_caches(&self.options)?;
                self.cached_ids.clear();
                return Err(e);
            }
        };
        self.cached_ids.extend_from_slice(&ids[keep..]);
        let fed = self.cached_tokens().saturating_sub(self.cached_ids.len());
        // Steps queued past the end fed tokens that were never returned.
        let past = fed.saturating_sub(generation.token_ids.len());
        if self
            .caches
            .iter_mut()
            .all(|c| c.trim(past as i32) == past as i32)
        {
            self.cached_ids
                .extend(generation.token_ids.iter().take(fed - past));
        } else {
            self.caches = engine.new_caches(&self.options)?;
            self.cached_ids.clear();
        }
        self.messages
            .push(ChatMessage::new(Role::Assistant, generation.text.clone()));
        Ok(generation)
    }
}
