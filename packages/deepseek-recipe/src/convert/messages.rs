//! Anthropic Messages requests.

use serde::de::Deserializer;
use serde::Deserialize;
use serde_json::Value;

use super::common::string_or_list;
use super::content::ContentBuilder;
use super::sampling::MaxTokensPolicy;
use super::tools::{apply_tool_choice, validate_tools, RequestedToolChoice};
use super::{assemble, bad, Converted, EffortName, Sampling, Target, ThinkingType};
use crate::conversation::{ConversationRequest, ModelVersion, ResponseFormat};
use crate::error::ConversionError;
use crate::image_source::{starts_with_ignore_case, ImageData, ImageDetail};
use crate::messages::{ImageContent, Message, ToolCall, ToolDefinition};
use crate::options::{ConversionOptions, ReasoningContentBehavior, WebSearchBehavior};
use crate::py_json::{self, FloatStyle};
use crate::tokens::SpecialToken;

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    pub model: String,
    pub messages: Vec<MessagesMessage>,
    pub system: Option<SystemBlocks>,
    pub max_tokens: Option<u32>,
    pub stop_sequences: Option<Vec<String>>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub tools: Option<Vec<AnthropicTool>>,
    pub tool_choice: Option<MessagesToolChoice>,
    pub thinking: Option<MessagesThinking>,
    pub output_config: Option<MessagesOutputConfig>,
    /// Accepted and ignored.
    #[allow(dead_code)]
    pub metadata: Option<MessagesMetadata>,
    pub stream: Option<bool>,
}

/// The `thinking` switch; `budget_tokens` is checked but not used.
#[derive(Clone, Copy, Debug, Deserialize)]
pub struct MessagesThinking {
    #[serde(rename = "type")]
    pub kind: ThinkingType,
    #[allow(dead_code)]
    pub budget_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub struct MessagesMetadata {
    #[allow(dead_code)]
    pub user_id: Option<String>,
}

/// `system`: a string or a list of text blocks.
#[derive(Debug)]
pub struct SystemBlocks(pub Vec<String>);

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum MessagesSystemBlock {
    Text { text: String },
}

impl<'de> Deserialize<'de> for SystemBlocks {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let many = |blocks: Vec<MessagesSystemBlock>| Self(blocks.into_iter().map(|MessagesSystemBlock::Text { text }| text).collect());
        string_or_list(deserializer, |text| Self(vec![text]), many, "expected a string or a list")
    }
}

#[derive(Debug, Deserialize)]
pub struct MessagesOutputConfig {
    pub effort: Option<EffortName>,
}


/// One message: its `role` decides how its `content` blocks are read.
#[derive(Debug, Deserialize)]
#[serde(tag = "role", content = "content", rename_all = "lowercase")]
pub enum MessagesMessage {
    User(Blocks),
    Assistant(Blocks),
    System(Blocks),
}

impl MessagesMessage {
    fn blocks(&self) -> &[MessagesContentBlock] {
        match self {
            Self::User(b) | Self::Assistant(b) | Self::System(b) => &b.0,
        }
    }
}

/// Content: a string (one text block) or a list of blocks.
#[derive(Debug)]
pub struct Blocks(pub Vec<MessagesContentBlock>);

impl<'de> Deserialize<'de> for Blocks {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        string_or_list(deserializer, |text| Self(vec![MessagesContentBlock::Text { text }]), Self, "expected a string or a list")
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagesContentBlock {
    Text { text: String },
    Image { source: MessagesImageSource },
    Document { source: Option<DocumentSource> },
    Thinking {
        thinking: String,
        /// Checked to be a string; not used.
        #[allow(dead_code)]
        signature: Option<String>,
    },
    ServerToolUse {},
    ToolUse { id: String, name: String, input: Value },
    ToolResult { tool_use_id: String, content: Option<Blocks> },
    WebSearchToolResult {},
    ToolAddition { tool: ToolReference },
}

impl MessagesContentBlock {
    fn type_name(&self) -> &'static str {
        match self {
            Self::Text { .. } => "text",
            Self::Image { .. } => "image",
            Self::Document { .. } => "document",
            Self::Thinking { .. } => "thinking",
            Self::ServerToolUse {} => "server_tool_use",
            Self::ToolUse { .. } => "tool_use",
            Self::ToolResult { .. } => "tool_result",
            Self::WebSearchToolResult {} => "web_search_tool_result",
            Self::ToolAddition { .. } => "tool_addition",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagesImageSource {
    Base64 { media_type: MediaType, data: String },
    Url { url: String },
    File {},
}

/// The image media types a base64 source may declare.
#[derive(Clone, Copy, Debug, Deserialize)]
pub enum MediaType {
    #[serde(rename = "image/jpeg")]
    Jpeg,
    #[serde(rename = "image/jpg")]
    Jpg,
    #[serde(rename = "image/png")]
    Png,
    #[serde(rename = "image/gif")]
    Gif,
    #[serde(rename = "image/webp")]
    Webp,
}

impl MediaType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Jpeg => "image/jpeg",
            Self::Jpg => "image/jpg",
            Self::Png => "image/png",
            Self::Gif => "image/gif",
            Self::Webp => "image/webp",
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct DocumentSource {
    pub media_type: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ToolReference {
    pub name: String,
}

#[derive(Debug, Deserialize)]
pub struct AnthropicTool {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagesToolChoice {
    Auto {},
    Any {},
    Tool { name: String },
    None {},
}

fn server_tools_unsupported() -> ConversionError {
    bad("Unsupported content block: server tools are not supported")
}

impl MessagesRequest {
    pub fn convert(self, options: &ConversionOptions) -> Result<ConversationRequest, ConversionError> {
        let requested_effort = self.output_config.and_then(|c| c.effort);
        let switch = self.thinking.map(|t| t.kind.enabled());
        let target = Target::resolve(options, &self.model, switch, requested_effort)?;
        let Target { model_version, thinking_mode, .. } = target;
        if self.messages.is_empty() {
            return Err(bad("messages: at least one message is required"));
        }
        // Checks run in the reference's order: tools, messages, tool choice, sampling.
        let declared = client_tools(self.tools.unwrap_or_default(), options.messages_web_search)?;
        let declared = validate_tools(declared, "tools[{}].name")?;
        let declared_all = declared.clone();
        let choice = match self.tool_choice {
            None | Some(MessagesToolChoice::Auto {}) | Some(MessagesToolChoice::Any {}) => RequestedToolChoice::Auto,
            Some(MessagesToolChoice::None {}) => RequestedToolChoice::None,
            Some(MessagesToolChoice::Tool { name }) => RequestedToolChoice::Named(name),
        };
        let last_user_text = self.messages.iter().rposition(|m| {
            matches!(m, MessagesMessage::User(_)) && m.blocks().iter().any(|b| !matches!(b, MessagesContentBlock::ToolResult { .. }))
        });
        let converter = MessageConverter {
            model_version,
            image_token: options.special_tokens.token(SpecialToken::Image),
            thinking_mode,
            web_search: options.messages_web_search,
            declared: &declared_all,
            reject_missing_reasoning: options.reasoning_content_behavior == ReasoningContentBehavior::Reject,
            missing_reasoning: std::cell::Cell::new(false),
            last_user_text,
        };
        let mut messages = Vec::new();
        if let Some(system) = self.system {
            messages.push(Message::system(system.0.join("\n\n")));
        }
        converter.convert(self.messages, &mut messages)?;
        let tools = apply_tool_choice(declared, choice, thinking_mode)?;

        let mut sampling = Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            max_tokens: self.max_tokens,
            stop: self.stop_sequences.unwrap_or_default(),
            ..Sampling::default()
        };
        sampling.validate(options.max_tokens_upper_bound(thinking_mode), MaxTokensPolicy::Clamp)?;

        let converted = Converted {
            messages,
            tools,
            response_format: (ResponseFormat::Text, false),
            sampling,
            stream: self.stream.unwrap_or(false),
            include_usage: false,
        };
        assemble(options, target, converted)
    }
}

/// Client tools; server tools are rejected, except web search when configured to drop it.
fn client_tools(tools: Vec<AnthropicTool>, web_search: WebSearchBehavior) -> Result<Vec<ToolDefinition>, ConversionError> {
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.into_iter().enumerate() {
        match tool.kind.as_deref() {
            None => out.push(ToolDefinition {
                parameters: tool.input_schema.ok_or_else(|| {
                    bad(format!(
                        "Invalid schema for function '{}': null is not of types \"boolean\", \"object\"",
                        tool.name
                    ))
                })?,
                name: tool.name,
                description: tool.description,
                strict: None,
                defer_loading: false,
            }),
            Some(kind) if kind.starts_with("web_search") && web_search == WebSearchBehavior::Drop => {}
            Some(_) => return Err(bad(format!("tools[{i}]: server tools are not supported"))),
        }
    }
    Ok(out)
}

struct MessageConverter<'a> {
    model_version: ModelVersion,
    image_token: &'a str,
    thinking_mode: bool,
    web_search: WebSearchBehavior,
    declared: &'a [ToolDefinition],
    reject_missing_reasoning: bool,
    /// Set when a current-turn assistant message lacks thinking; checked after the whole list.
    missing_reasoning: std::cell::Cell<bool>,
    /// The last user message with more than tool results; later assistant turns must carry thinking.
    last_user_text: Option<usize>,
}

impl MessageConverter<'_> {
    fn convert(&self, raw: Vec<MessagesMessage>, out: &mut Vec<Message>) -> Result<(), ConversionError> {
        // Tool-use ids of the previous message, which tool results must answer.
        let mut previous_tool_uses: Vec<String> = Vec::new();
        for (i, message) in raw.into_iter().enumerate() {
            if message.blocks().is_empty() {
                return Err(bad(format!("messages.{i}: all messages must have non-empty content")));
            }
            let tool_uses = match message {
                MessagesMessage::System(blocks) => {
                    self.system(i, blocks.0, out)?;
                    Vec::new()
                }
                MessagesMessage::User(blocks) => {
                    self.user(i, blocks.0, &previous_tool_uses, out)?;
                    Vec::new()
                }
                MessagesMessage::Assistant(blocks) => self.assistant(i, blocks.0, out)?,
            };
            previous_tool_uses = tool_uses;
        }
        if self.reject_missing_reasoning && self.missing_reasoning.get() {
            return Err(bad("The `content[].thinking` in the thinking mode must be passed back to the API."));
        }
        Ok(())
    }

    fn misplaced(&self, i: usize, block: &MessagesContentBlock, role: &str) -> ConversionError {
        if let MessagesContentBlock::Thinking { .. } = block {
            return bad(format!("messages.{i}.content: thinking blocks may only be in `{role}` messages"));
        }
        bad(format!("messages.{i}: `{}` blocks can only be in `{role}` messages", block.type_name()))
    }

    /// An in-conversation system message: for V4.1 a system message (carrying the tools its
    /// `tool_addition` blocks reference), for V4 a `<system-reminder>` user message.
    fn system(&self, i: usize, blocks: Vec<MessagesContentBlock>, out: &mut Vec<Message>) -> Result<(), ConversionError> {
        let mut texts = Vec::new();
        let mut added = Vec::new();
        for (j, block) in blocks.into_iter().enumerate() {
            match block {
                MessagesContentBlock::Text { text } => texts.push(text),
                MessagesContentBlock::ToolAddition { tool } => match self.declared.iter().find(|t| t.name == tool.name) {
                    Some(definition) => added.push(definition.clone()),
                    None => {
                        return Err(bad(format!(
                            "messages.{i}.content.{j}: `tool_addition` references unknown tool '{}'",
                            tool.name
                        )))
                    }
                },
                other => return Err(self.misplaced(i, &other, "user")),
            }
        }
        let text = texts.join("\n\n");
        if self.model_version == ModelVersion::DeepseekV41Flash {
            let tools = (!added.is_empty()).then_some(added);
            out.push(Message::System { content: ImageContent::text(text), tools });
        } else if !text.is_empty() {
            out.push(Message::user(format!("<system-reminder>\n{text}\n</system-reminder>")));
        }
        Ok(())
    }

    fn user(
        &self,
        i: usize,
        blocks: Vec<MessagesContentBlock>,
        previous_tool_uses: &[String],
        out: &mut Vec<Message>,
    ) -> Result<(), ConversionError> {
        for (j, block) in blocks.into_iter().enumerate() {
            match block {
                MessagesContentBlock::Text { text } => out.push(Message::user(text)),
                MessagesContentBlock::Image { source } => {
                    let mut content = ContentBuilder::new(self.model_version, self.image_token);
                    self.image(&mut content, source, format!("messages.{i}.content[{j}]"))?;
                    out.push(Message::User { content: content.build() });
                }
                MessagesContentBlock::Document { source } => {
                    let media_type = source.and_then(|s| s.media_type).unwrap_or_else(|| "unknown".into());
                    out.push(Message::user(format!("[Unsupported document type: {media_type}]")));
                }
                MessagesContentBlock::ToolResult { tool_use_id, content } => {
                    if !previous_tool_uses.contains(&tool_use_id) {
                        return Err(bad(format!(
                            "unexpected `messages.{i}.content.{j}: tool_use_id` found in `tool_result` blocks: {tool_use_id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                        )));
                    }
                    let content = self.tool_result(i, j, content)?;
                    out.push(Message::Tool { content, tool_call_id: Some(tool_use_id) });
                }
                MessagesContentBlock::ServerToolUse {} | MessagesContentBlock::WebSearchToolResult {}
                    if self.web_search == WebSearchBehavior::Reject =>
                {
                    return Err(server_tools_unsupported())
                }
                other @ MessagesContentBlock::ToolAddition { .. } => return Err(self.misplaced(i, &other, "system")),
                other => return Err(self.misplaced(i, &other, "assistant")),
            }
        }
        Ok(())
    }

    fn tool_result(&self, i: usize, j: usize, content: Option<Blocks>) -> Result<ImageContent, ConversionError> {
        let mut out = ContentBuilder::new(self.model_version, self.image_token);
        for (k, block) in content.map(|b| b.0).unwrap_or_default().into_iter().enumerate() {
            match block {
                MessagesContentBlock::Text { text } => out.text(text),
                MessagesContentBlock::Image { source } => {
                    self.image(&mut out, source, format!("messages.{i}.content.{j}.tool_result.content[{k}]"))?
                }
                other => return Err(self.misplaced(i, &other, "assistant")),
            }
        }
        Ok(out.build())
    }

    /// Adds an image; V4.1 checks that base64 data decodes.
    fn image(&self, out: &mut ContentBuilder, source: MessagesImageSource, path: String) -> Result<(), ConversionError> {
        let data = match source {
            MessagesImageSource::Base64 { media_type, data } => {
                if out.supports_images() && !is_base64(&data) {
                    return Err(bad(format!("{path}: base64 decode error")));
                }
                ImageData::DataUrl(format!("data:{};base64,{data}", media_type.as_str()))
            }
            MessagesImageSource::Url { url } if out.supports_images() && !starts_with_ignore_case(&url, "http") => {
                return Err(bad(format!("{path}: invalid url: {url:?}")))
            }
            MessagesImageSource::Url { url } => ImageData::Url(url),
            MessagesImageSource::File {} if out.supports_images() => {
                return Err(bad(format!(
                    "{path}: file_id is not supported. Pass the image as a base64 data url instead."
                )))
            }
            MessagesImageSource::File {} => {
                out.text(super::content::UNSUPPORTED_IMAGE);
                return Ok(());
            }
        };
        out.image(data, ImageDetail::High, path);
        Ok(())
    }

    /// Returns the ids of the message's tool uses.
    fn assistant(&self, i: usize, blocks: Vec<MessagesContentBlock>, out: &mut Vec<Message>) -> Result<Vec<String>, ConversionError> {
        let mut texts = Vec::new();
        let mut reasoning: Option<String> = None;
        let mut calls: Vec<ToolCall> = Vec::new();
        for (j, block) in blocks.into_iter().enumerate() {
            if !calls.is_empty() && !matches!(block, MessagesContentBlock::ToolUse { .. }) {
                let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
                return Err(bad(format!(
                    "messages.{i}.{j}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                    ids.join(", ")
                )));
            }
            match block {
                MessagesContentBlock::Text { text } => texts.push(text),
                MessagesContentBlock::Thinking { thinking, .. } => reasoning.get_or_insert_with(String::new).push_str(&thinking),
                MessagesContentBlock::ToolUse { id, name, input } => {
                    calls.push(ToolCall { id, name, arguments: py_json::dumps(&input, FloatStyle::Serde) })
                }
                MessagesContentBlock::ServerToolUse {} | MessagesContentBlock::WebSearchToolResult {} => {
                    if self.web_search == WebSearchBehavior::Reject {
                        return Err(server_tools_unsupported());
                    }
                }
                other @ MessagesContentBlock::ToolAddition { .. } => return Err(self.misplaced(i, &other, "system")),
                other => return Err(self.misplaced(i, &other, "user")),
            }
        }
        let ids = calls.iter().map(|c| c.id.clone()).collect();
        let current_turn = self.last_user_text.is_none_or(|u| i > u);
        if self.thinking_mode && current_turn && reasoning.is_none() {
            self.missing_reasoning.set(true);
        }
        let reasoning_content = if self.thinking_mode { Some(reasoning.unwrap_or_default()) } else { None };
        out.push(Message::Assistant {
            content: texts.join("\n\n"),
            reasoning_content,
            tool_calls: (!calls.is_empty()).then_some(calls),
            prefix: false,
        });
        Ok(ids)
    }
}

/// Standard padded base64.
fn is_base64(data: &str) -> bool {
    let bytes = data.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return false;
    }
    let body = data.trim_end_matches('=');
    bytes.len() - body.len() <= 2
        && body.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}
