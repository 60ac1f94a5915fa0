//! Hugging Face `tokenizer.json` tokenizers and prompt encoding.
//!
//! Prompt encoding maps every special range of a rendered prompt to its added-token id and encodes
//! the text between them with the base vocabulary only, so user text that spells a special token
//! stays ordinary text.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokenizers::{OffsetType, PreTokenizedString};

use crate::error::EncodeError;
use crate::render::RenderedPrompt;

pub type Error = tokenizers::Error;

#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// Added-token spelling -> id.
    added: Arc<HashMap<String, u32>>,
    /// Ids of long plain-text segments. Prompts repeat long texts (tool sections, schemas, system
    /// prompts) and segments are encoded independently of their neighbours, so reuse is exact.
    segments: Arc<Mutex<HashMap<String, Arc<[u32]>>>>,
}

/// Segments shorter than this are cheap to encode and not worth a cache entry; longer than the
/// maximum they are unlikely to repeat and would make the cache large.
const CACHED_SEGMENT_MIN_BYTES: usize = 256;
const CACHED_SEGMENT_MAX_BYTES: usize = 64 * 1024;
/// The cache is dropped wholesale when it reaches this many entries (bounded memory, no LRU upkeep).
const CACHED_SEGMENTS_MAX: usize = 2048;

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
        Self { inner: Arc::new(inner), added: Arc::new(added), segments: Arc::default() }
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

    /// Like [`Self::encode_plain`], reusing the ids of long segments seen before.
    fn encode_segment(&self, text: &str, ids: &mut Vec<u32>) -> Result<(), Error> {
        if !(CACHED_SEGMENT_MIN_BYTES..=CACHED_SEGMENT_MAX_BYTES).contains(&text.len()) {
            return self.encode_plain(text, ids);
        }
        if let Some(cached) = self.segments.lock().ok().and_then(|c| c.get(text).cloned()) {
            ids.extend_from_slice(&cached);
            return Ok(());
        }
        let start = ids.len();
        self.encode_plain(text, ids)?;
        if let Ok(mut cache) = self.segments.lock() {
            if cache.len() >= CACHED_SEGMENTS_MAX {
                cache.clear();
            }
            cache.insert(text.to_owned(), ids[start..].into());
        }
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
            self.encode_segment(text, ids).map_err(|e| EncodeError::Tokenizer(e.to_string()))
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
