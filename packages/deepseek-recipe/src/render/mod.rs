//! Prompt rendering: a conversation becomes the model's prompt text plus the ranges of the special
//! tokens the renderer emitted (so encoding can map exactly those to added-token ids).

mod common;
mod v4;
mod v41;

use std::ops::Range;

use crate::conversation::Conversation;
use crate::image_source::ImageSource;
use crate::messages::ImageContent;
use crate::tokens::{SpecialToken, SpecialTokens};

/// The two prompt formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptFormat {
    /// DeepSeek-V4-Pro.
    V4,
    /// DeepSeek-V4.1-Flash.
    V41,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RenderedPrompt {
    pub prompt: String,
    /// Ascending, disjoint **byte** ranges of `prompt`, each one emitted special token.
    pub special_ranges: Vec<Range<usize>>,
    /// Image sources in placeholder order.
    pub image_sources: Vec<ImageSource>,
}

/// Renders conversations in one prompt format with one special-token spelling.
#[derive(Clone, Debug, PartialEq)]
pub struct Renderer {
    pub format: PromptFormat,
    pub special_tokens: SpecialTokens,
}

impl Renderer {
    pub fn new(format: PromptFormat) -> Self {
        Self { format, special_tokens: SpecialTokens::default() }
    }

    pub fn with_special_tokens(self, special_tokens: SpecialTokens) -> Self {
        Self { special_tokens, ..self }
    }

    pub fn render(&self, conversation: &Conversation) -> RenderedPrompt {
        let mut out = PromptBuilder::new(&self.special_tokens);
        match self.format {
            PromptFormat::V4 => v4::render(&mut out, conversation),
            PromptFormat::V41 => v41::render(&mut out, conversation),
        }
        out.finish()
    }
}

/// Accumulates prompt text and the ranges of emitted special tokens.
pub(crate) struct PromptBuilder<'a> {
    tokens: &'a SpecialTokens,
    out: RenderedPrompt,
}

impl<'a> PromptBuilder<'a> {
    fn new(tokens: &'a SpecialTokens) -> Self {
        Self { tokens, out: RenderedPrompt::default() }
    }

    pub(crate) fn text(&mut self, text: &str) {
        self.out.prompt.push_str(text);
    }

    pub(crate) fn special(&mut self, token: SpecialToken) {
        let spelling = self.tokens.token(token);
        self.mark_special(spelling);
    }

    fn mark_special(&mut self, spelling: &str) {
        let start = self.out.prompt.len();
        self.out.prompt.push_str(spelling);
        if !spelling.is_empty() {
            self.out.special_ranges.push(start..self.out.prompt.len());
        }
    }

    /// Message text whose image placeholders become special ranges (spelled as in the message).
    pub(crate) fn image_content(&mut self, content: &ImageContent) {
        let mut at = 0;
        for range in &content.placeholders {
            self.text(&content.text[at..range.start]);
            self.mark_special(&content.text[range.clone()]);
            at = range.end;
        }
        self.text(&content.text[at..]);
        self.out.image_sources.extend(content.image_sources.iter().cloned());
    }

    fn finish(self) -> RenderedPrompt {
        self.out
    }
}
