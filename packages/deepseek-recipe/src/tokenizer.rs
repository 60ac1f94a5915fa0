//! Hugging Face `tokenizer.json` tokenizers and prompt encoding.
//!
//! Prompt encoding maps every special range of a rendered prompt to its added-token id and encodes
//! the text between them with the base vocabulary only, so user text that spells a special token
//! stays ordinary text.

use std::collections::HashMap;
use std::sync::Arc;

use tokenizers::{OffsetType, PreTokenizedString};

use crate::error::EncodeError;
use crate::render::RenderedPrompt;

pub type Error = tokenizers::Error;

#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// Added-token spelling -> id.
    added: Arc<HashMap<String, u32>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("added_tokens", &self.added.len()).finish()
    }
}

impl Tokenizer {
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Self, Error> {
        Ok(Self::wrap(tokenizers::Tokenizer::from_file(path)?))
    }

    #[allow(clippy::should_implement_trait)]
    pub fn from_str(json: &str) -> Result<Self, Error> {
        Ok(Self::wrap(json.parse()?))
    }

    fn wrap(inner: tokenizers::Tokenizer) -> Self {
        let added = inner
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, token)| (token.content, id))
            .collect();
        Self { inner: Arc::new(inner), added: Arc::new(added) }
    }

    /// Encodes with the full vocabulary: special-token spellings in `text` become their ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, Error> {
        Ok(self.inner.encode_fast(text, false)?.get_ids().to_vec())
    }

    /// Encodes `text` with the base vocabulary only (added tokens are not recognised).
    pub fn encode_plain(&self, text: &str, ids: &mut Vec<u32>) -> Result<(), Error> {
        if text.is_empty() {
            return Ok(());
        }
        let mut pretokenized = PreTokenizedString::from(text);
        if let Some(normalizer) = self.inner.get_normalizer() {
            pretokenized.normalize(|s| tokenizers::Normalizer::normalize(normalizer, s))?;
        }
        if let Some(pre_tokenizer) = self.inner.get_pre_tokenizer() {
            tokenizers::PreTokenizer::pre_tokenize(pre_tokenizer, &mut pretokenized)?;
        }
        let model = self.inner.get_model();
        pretokenized.tokenize(|normalized| tokenizers::Model::tokenize(model, normalized.get()))?;
        let encoding = pretokenized.into_encoding(None, 0, OffsetType::None)?;
        ids.extend_from_slice(encoding.get_ids());
        Ok(())
    }

    /// The id of an added token, by spelling.
    pub fn added_token_id(&self, spelling: &str) -> Option<u32> {
        self.added.get(spelling).copied()
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, Error> {
        self.inner.decode(ids, skip_special_tokens)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Token ids of a rendered prompt: special ranges as single added tokens, the rest as plain text.
    pub fn encode_prompt(&self, rendered: &RenderedPrompt) -> Result<Vec<u32>, EncodeError> {
        let prompt = rendered.prompt.as_str();
        let mut ids = Vec::with_capacity(prompt.len() / 3);
        let plain = |text: &str, ids: &mut Vec<u32>| {
            self.encode_plain(text, ids).map_err(|e| EncodeError::Tokenizer(e.to_string()))
        };
        let mut at = 0;
        for range in &rendered.special_ranges {
            plain(&prompt[at..range.start], &mut ids)?;
            let spelling = &prompt[range.clone()];
            let id = self
                .added_token_id(spelling)
                .ok_or_else(|| EncodeError::MissingSpecialToken(spelling.to_owned()))?;
            ids.push(id);
            at = range.end;
        }
        plain(&prompt[at..], &mut ids)?;
        Ok(ids)
    }
}
