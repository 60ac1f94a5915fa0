//! Conversation messages, tool calls and tool definitions.

use std::ops::Range;

use serde_json::Value;

use crate::image_source::ImageSource;
use crate::tokens::SpecialToken;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// Meant to hold a JSON object; not validated.
    pub arguments: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ToolDefinition {
    pub name: String,
    pub description: Option<String>,
    /// The input schema, stored as given (any JSON value).
    pub parameters: Value,
    pub strict: Option<bool>,
    /// Deferred tools are not listed in the prompt.
    pub defer_loading: bool,
}

impl ToolDefinition {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            description: None,
            parameters: Value::Null,
            strict: None,
            defer_loading: false,
        }
    }
}

/// Text content whose first occurrences of an image token stand for the attached images.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ImageContent {
    pub text: String,
    pub image_sources: Vec<ImageSource>,
    /// Byte ranges of `text` that are image placeholders, one per source at most.
    pub placeholders: Vec<Range<usize>>,
}

impl ImageContent {
    /// Plain text without images.
    pub fn text(text: impl Into<String>) -> Self {
        Self { text: text.into(), ..Self::default() }
    }

    /// Marks the first `image_sources.len()` occurrences of `image_token` as placeholders.
    pub fn with_images(
        text: impl Into<String>,
        image_sources: Vec<ImageSource>,
        image_token: Option<&str>,
    ) -> Result<Self, String> {
        let text = text.into();
        let token = image_token.unwrap_or(SpecialToken::Image.default_str());
        if token.is_empty() {
            return Err("image_token must not be empty".to_owned());
        }
        let placeholders = text
            .match_indices(token)
            .take(image_sources.len())
            .map(|(at, m)| at..at + m.len())
            .collect();
        Ok(Self { text, image_sources, placeholders })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    System { content: ImageContent, tools: Option<Vec<ToolDefinition>> },
    User { content: ImageContent },
    Assistant {
        content: String,
        reasoning_content: Option<String>,
        tool_calls: Option<Vec<ToolCall>>,
        /// The final assistant message is continued instead of closed.
        prefix: bool,
    },
    Tool { content: ImageContent, tool_call_id: Option<String> },
    LatestReminder { content: String },
}

impl Message {
    pub fn system(text: impl Into<String>) -> Self {
        Self::System { content: ImageContent::text(text), tools: None }
    }

    pub fn user(text: impl Into<String>) -> Self {
        Self::User { content: ImageContent::text(text) }
    }

    pub fn assistant(text: impl Into<String>) -> Self {
        Self::Assistant {
            content: text.into(),
            reasoning_content: None,
            tool_calls: None,
            prefix: false,
        }
    }

    pub fn role(&self) -> &'static str {
        match self {
            Self::System { .. } => "system",
            Self::User { .. } => "user",
            Self::Assistant { .. } => "assistant",
            Self::Tool { .. } => "tool",
            Self::LatestReminder { .. } => "latest_reminder",
        }
    }

    pub fn content(&self) -> &str {
        match self {
            Self::System { content, .. } | Self::User { content } | Self::Tool { content, .. } => {
                &content.text
            }
            Self::Assistant { content, .. } | Self::LatestReminder { content } => content,
        }
    }

    pub fn image_sources(&self) -> &[ImageSource] {
        match self {
            Self::System { content, .. } | Self::User { content } | Self::Tool { content, .. } => {
                &content.image_sources
            }
            _ => &[],
        }
    }
}
