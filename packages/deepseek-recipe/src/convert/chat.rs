//! OpenAI Chat Completions requests.

use std::collections::HashSet;

use serde::de::{self, Deserializer};
use serde::Deserialize;
use serde_json::Value;

use super::common::{openai_tool_choice, string_or_list};
use super::content::ContentBuilder;
use super::sampling::MaxTokensPolicy;
use super::tools::{
    apply_tool_choice, check_tool_choice, validate_tools, RequestedToolChoice,
};
use super::{assemble, bad, checked_response_format, Converted, EffortName, Sampling, Target, ThinkingSwitch};
use crate::conversation::{ConversationRequest, ModelVersion, ResponseFormat};
use crate::error::ConversionError;
use crate::image_source::{ImageData, ImageDetail};
use crate::messages::{Message, ToolCall, ToolDefinition};
use crate::options::{ConversionOptions, ReasoningContentBehavior};
use crate::tokens::SpecialToken;

#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub messages: Vec<ChatMessage>,
    pub model: String,
    #[serde(default)]
    pub tools: Option<Vec<ChatTool>>,
    #[serde(default)]
    pub tool_choice: Option<ChatToolChoice>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_tokens: Option<u32>,
    /// Parsed for compatibility; only `max_tokens` limits the output.
    #[allow(dead_code)]
    pub max_completion_tokens: Option<u32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub n: Option<u8>,
    pub seed: Option<u64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    pub stop: Option<StopSequences>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub response_format: Option<ChatResponseFormat>,
    pub thinking: Option<ThinkingSwitch>,
    pub reasoning_effort: Option<EffortName>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    System { content: ChatContent },
    User { content: ChatContent },
    Assistant {
        #[serde(default)]
        content: Option<ChatContent>,
        reasoning_content: Option<String>,
        tool_calls: Option<Vec<ChatToolCall>>,
        #[serde(default)]
        prefix: bool,
    },
    Tool { content: ChatContent, tool_call_id: String },
    LatestReminder { content: String },
}

#[derive(Debug)]
pub enum ChatContent {
    Text(String),
    Parts(Vec<ChatPart>),
}

impl<'de> Deserialize<'de> for ChatContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        string_or_list(deserializer, Self::Text, Self::Parts, "content should be a string or a list")
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChatPart {
    Text { text: String },
    ImageUrl { image_url: ChatCompletionImageUrl },
    File { file: Option<Value> },
}

#[derive(Debug, Deserialize)]
pub struct ChatCompletionImageUrl {
    pub url: String,
    pub detail: Option<DetailName>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DetailName {
    Low,
    High,
    Original,
    Auto,
}

impl From<DetailName> for ImageDetail {
    fn from(d: DetailName) -> Self {
        match d {
            DetailName::Low => ImageDetail::Low,
            DetailName::High => ImageDetail::High,
            DetailName::Original => ImageDetail::Original,
            DetailName::Auto => ImageDetail::Auto,
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct ChatToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    pub function: ChatFunctionCall,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FunctionKind {
    Function,
}

#[derive(Debug, Deserialize)]
pub struct ChatFunctionCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChatTool {
    Function { function: ChatFunctionDefinition },
}

#[derive(Debug, Deserialize)]
pub struct ChatFunctionDefinition {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
}

#[derive(Debug)]
pub struct ChatToolChoice(pub RequestedToolChoice);

#[derive(Debug, Deserialize)]
struct ChatCompletionToolChoiceFunction {
    name: String,
}

impl<'de> Deserialize<'de> for ChatToolChoice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let named = |mut map: serde_json::Map<String, Value>| {
            let kind = map.remove("type").unwrap_or(Value::Null);
            FunctionKind::deserialize(kind).map_err(|e| de::Error::custom(format!("field `type`: {e}")))?;
            let function = map.remove("function").unwrap_or(Value::Null);
            let function: ChatCompletionToolChoiceFunction = serde_json::from_value(function)
                .map_err(|e| de::Error::custom(format!("field `function`: {e}")))?;
            Ok(function.name)
        };
        openai_tool_choice(deserializer, named, "expected one of `none`, `auto`, `required` or a tool").map(Self)
    }
}

/// `stop`: one string or a list of strings.
#[derive(Debug)]
pub enum StopSequences {
    One(String),
    Many(Vec<String>),
}

impl StopSequences {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

impl<'de> Deserialize<'de> for StopSequences {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        string_or_list(deserializer, Self::One, Self::Many, "expected a string or a list")
    }
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChatResponseFormat {
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
    Regex { regex: String },
    Text,
}

#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    #[allow(dead_code)]
    pub name: Option<String>,
    pub schema: Value,
    pub strict: Option<bool>,
}

impl ChatCompletionRequest {
    pub fn convert(self, options: &ConversionOptions) -> Result<ConversationRequest, ConversionError> {
        let switch = self.thinking.map(ThinkingSwitch::enabled);
        let target = Target::resolve(options, &self.model, switch, self.reasoning_effort)?;
        let Target { model_version, thinking_mode, .. } = target;
        if self.messages.is_empty() {
            return Err(bad("Empty input messages"));
        }
        // Checks run in the reference's order: messages, response format, tools, tool choice, sampling.
        let choice = self.tool_choice.map_or(RequestedToolChoice::Auto, |c| c.0);
        let declared: Vec<ToolDefinition> = self
            .tools
            .unwrap_or_default()
            .into_iter()
            .map(|ChatTool::Function { function: f }| ToolDefinition {
                name: f.name,
                description: f.description,
                parameters: f.parameters.unwrap_or(Value::Null),
                strict: f.strict,
                defer_loading: false,
            })
            .collect();
        let has_tools = !declared.is_empty();
        let image_token = options.special_tokens.token(SpecialToken::Image);
        let ConvertedMessages { messages, prefix_with_calls } = convert_messages(
            self.messages,
            model_version,
            image_token,
            thinking_mode,
            has_tools,
            options.reasoning_content_behavior,
        )?;
        let requested_format = match self.response_format {
            None | Some(ChatResponseFormat::Text) => (ResponseFormat::Text, false),
            Some(ChatResponseFormat::JsonObject) => (ResponseFormat::JsonObject, false),
            Some(ChatResponseFormat::JsonSchema { json_schema: format }) => {
                (ResponseFormat::JsonSchema(format.schema), format.strict == Some(true))
            }
            Some(ChatResponseFormat::Regex { regex }) => (ResponseFormat::Regex(regex), false),
        };
        let response_format = checked_response_format(
            requested_format,
            &messages,
            "Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'.",
        )?;
        // `tool_choice: none` drops the tools unchecked.
        let declared = match choice {
            RequestedToolChoice::None => declared,
            _ => validate_tools(declared, "tools[{}].function.name")?,
        };
        check_tool_choice(&declared, &choice, thinking_mode)?;
        if prefix_with_calls {
            return Err(bad("Function call should not be used with prefix"));
        }
        let tools = apply_tool_choice(declared, choice, thinking_mode)?;

        let mut sampling = Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            max_tokens: self.max_tokens,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            n: self.n.map(u32::from),
            seed: self.seed,
            logprobs: self.logprobs.unwrap_or(false),
            top_logprobs: self.top_logprobs,
            stop: Vec::new(),
        };
        if let Some(StopSequences::One(stop)) = &self.stop {
            if stop.is_empty() {
                return Err(bad(
                    "Invalid 'stop': empty string. Expected a string with minimum length 1, but got an empty string instead.",
                ));
            }
        }
        sampling.stop = self.stop.map(StopSequences::into_vec).unwrap_or_default();
        sampling.validate(options.max_tokens_upper_bound(thinking_mode), MaxTokensPolicy::Reject)?;

        let converted = Converted {
            messages,
            tools,
            response_format,
            sampling,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
        };
        assemble(options, target, converted)
    }
}

fn content_of(
    content: ChatContent,
    index: usize,
    model_version: ModelVersion,
    image_token: &str,
) -> Result<crate::messages::ImageContent, ConversionError> {
    let mut out = ContentBuilder::new(model_version, image_token);
    match content {
        ChatContent::Text(text) => out.text(text),
        ChatContent::Parts(parts) => {
            let path = format!(".messages[{index}]");
            for part in parts {
                match part {
                    ChatPart::Text { text } => out.text(text),
                    ChatPart::ImageUrl { image_url } => {
                        let url = image_url.url;
                        let data = if url.starts_with("data:") {
                            ImageData::DataUrl(url)
                        } else if url.starts_with("http://") || url.starts_with("https://") {
                            ImageData::Url(url)
                        } else if out.supports_images() {
                            return Err(bad(format!("{path}: Unsupported image_url format")));
                        } else {
                            ImageData::Url(url)
                        };
                        let detail = image_url.detail.map_or(ImageDetail::High, ImageDetail::from);
                        out.image(data, detail, path.clone());
                    }
                    ChatPart::File { .. } => {
                        if out.supports_images() {
                            return Err(bad(format!("{path}: file must have a file_id or file_data")));
                        }
                        out.text(super::content::UNSUPPORTED_IMAGE);
                    }
                }
            }
        }
    }
    Ok(out.build())
}

/// Converted messages, plus whether a prefix message meets function calling (reported after the
/// tools are validated).
struct ConvertedMessages {
    messages: Vec<Message>,
    prefix_with_calls: bool,
}

fn convert_messages(
    raw: Vec<ChatMessage>,
    model_version: ModelVersion,
    image_token: &str,
    thinking_mode: bool,
    has_tools: bool,
    reasoning_behavior: ReasoningContentBehavior,
) -> Result<ConvertedMessages, ConversionError> {
    let count = raw.len();
    let last_user = raw.iter().rposition(|m| matches!(m, ChatMessage::User { .. }));
    let calls_in_history =
        raw.iter().any(|m| matches!(m, ChatMessage::Assistant { tool_calls: Some(c), .. } if !c.is_empty()));
    let mut messages = Vec::with_capacity(count);
    // Checked after the structure of the whole list, as the reference does.
    let (mut missing_reasoning, mut prefix_with_calls) = (false, false);
    // Tool-call ids of the latest assistant turn still waiting for their results.
    let mut pending: Option<HashSet<String>> = None;
    for (index, message) in raw.into_iter().enumerate() {
        let is_tool = matches!(message, ChatMessage::Tool { .. });
        if !is_tool {
            if let Some(ids) = &pending {
                if !ids.is_empty() {
                    return Err(insufficient_tool_messages());
                }
            }
            pending = None;
        }
        let converted = match message {
            ChatMessage::System { content } => {
                let content = content_of(content, index, model_version, image_token)?;
                if content.text.is_empty() {
                    continue;
                }
                Message::System { content, tools: None }
            }
            ChatMessage::User { content } => {
                Message::User { content: content_of(content, index, model_version, image_token)? }
            }
            ChatMessage::LatestReminder { content } => Message::LatestReminder { content },
            ChatMessage::Tool { content, tool_call_id } => {
                let Some(ids) = pending.as_mut() else {
                    return Err(bad(
                        "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'",
                    ));
                };
                if !ids.remove(&tool_call_id) {
                    return Err(bad(format!(
                        "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id', The following tool_call_ids did not have response messages: {tool_call_id}"
                    )));
                }
                if ids.is_empty() {
                    pending = None;
                }
                Message::Tool {
                    content: content_of(content, index, model_version, image_token)?,
                    tool_call_id: Some(tool_call_id),
                }
            }
            ChatMessage::Assistant { content, reasoning_content, tool_calls, prefix } => {
                let current_turn = last_user.is_none_or(|u| index > u);
                let reasoning_content = match (thinking_mode, reasoning_content) {
                    (false, _) => None,
                    (true, Some(rc)) => Some(rc),
                    (true, None) => {
                        missing_reasoning |= current_turn;
                        Some(String::new())
                    }
                };
                if prefix {
                    if index + 1 != count {
                        return Err(bad(
                            "Invalid completion message: prefix set true with message which is not final message or message role is not assistant",
                        ));
                    }
                    prefix_with_calls = has_tools || calls_in_history;
                }
                let content = match content {
                    Some(c) => {
                        let content = content_of(c, index, model_version, image_token)?;
                        if !content.image_sources.is_empty() {
                            return Err(bad("Image in assistant message is not supported"));
                        }
                        content.text
                    }
                    None => String::new(),
                };
                let tool_calls: Option<Vec<ToolCall>> = tool_calls.map(|calls| {
                    calls
                        .into_iter()
                        .map(|c| ToolCall { id: c.id, name: c.function.name, arguments: c.function.arguments })
                        .collect()
                });
                if let Some(calls) = &tool_calls {
                    if calls.is_empty() {
                        return Err(bad(format!(
                            "Invalid 'messages[{index}].tool_calls': empty array. Expected an array with minimum length 1, but got an empty array instead."
                        )));
                    }
                    pending = Some(calls.iter().map(|c| c.id.clone()).collect());
                }
                Message::Assistant { content, reasoning_content, tool_calls, prefix }
            }
        };
        messages.push(converted);
    }
    if pending.is_some_and(|ids| !ids.is_empty()) {
        return Err(insufficient_tool_messages());
    }
    if missing_reasoning && reasoning_behavior == ReasoningContentBehavior::Reject {
        return Err(bad("The `reasoning_content` in the thinking mode must be passed back to the API."));
    }
    Ok(ConvertedMessages { messages, prefix_with_calls })
}

fn insufficient_tool_messages() -> ConversionError {
    bad("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. (insufficient tool messages following tool_calls message)")
}
