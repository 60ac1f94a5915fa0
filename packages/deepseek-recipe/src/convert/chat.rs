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
use super::{assemble, bad, checked_response_format, Converted, EffortName, Sampling, Target, ThinkingType};
use crate::conversation::{ConversationRequest, ModelVersion, ResponseFormat};
use crate::error::ConversionError;
use crate::image_source::{ImageData, ImageDetail};
use crate::messages::{Message, ToolCall, ToolDefinition};
use crate::options::{ConversionOptions, ReasoningContentBehavior};
use crate::tokens::SpecialToken;

#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub messages: Vec<ChatCompletionRequestMessage>,
    pub model: String,
    #[serde(default)]
    pub tools: Option<Vec<ChatCompletionTool>>,
    #[serde(default)]
    pub tool_choice: Option<ChatToolChoice>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_tokens: Option<u32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub n: Option<u8>,
    pub seed: Option<u64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u8>,
    pub stop: Option<StopSequences>,
    pub stream: Option<bool>,
    pub stream_options: Option<ChatCompletionStreamOptions>,
    pub response_format: Option<ChatCompletionResponseFormat>,
    pub thinking: Option<ChatCompletionThinking>,
    pub reasoning_effort: Option<EffortName>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatCompletionRequestMessage {
    System { content: ChatContent },
    User { content: ChatContent },
    Assistant {
        #[serde(default)]
        content: Option<ChatContent>,
        reasoning_content: Option<String>,
        tool_calls: Option<Vec<ChatCompletionRequestToolCall>>,
        #[serde(default)]
        prefix: bool,
    },
    Tool { content: ChatContent, tool_call_id: String },
    LatestReminder { content: String },
}

#[derive(Debug)]
pub enum ChatContent {
    Text(String),
    Parts(Vec<ChatCompletionRequestContentBlock>),
}

impl<'de> Deserialize<'de> for ChatContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        string_or_list(deserializer, Self::Text, Self::Parts, "content should be a string or a list")
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChatCompletionRequestContentBlock {
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
pub struct ChatCompletionRequestToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    pub function: ChatCompletionRequestFunctionCall,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FunctionKind {
    Function,
}

#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequestFunctionCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Deserialize)]
pub struct ChatCompletionTool {
    /// Always `function`; checked by its type.
    #[serde(rename = "type")]
    #[allow(dead_code)]
    pub kind: FunctionKind,
    pub function: ChatCompletionFunctionDefinition,
}

#[derive(Debug, Deserialize)]
pub struct ChatCompletionFunctionDefinition {
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
            Ok(Some(RequestedToolChoice::Named(function.name)))
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

/// `thinking`: its type, and `budget_tokens`, which is checked but not used.
#[derive(Debug, Deserialize)]
pub struct ChatCompletionThinking {
    #[serde(rename = "type")]
    pub kind: ThinkingType,
    #[allow(dead_code)]
    pub budget_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub struct ChatCompletionStreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChatCompletionResponseFormat {
    JsonObject,
    JsonSchema { json_schema: ChatCompletionResponseFormatJsonSchema },
    Regex { regex: String },
    Text,
}

#[derive(Debug, Deserialize)]
pub struct ChatCompletionResponseFormatJsonSchema {
    #[allow(dead_code)]
    pub name: Option<String>,
    pub schema: Value,
    pub strict: Option<bool>,
}

impl ChatCompletionRequest {
    pub fn convert(self, options: &ConversionOptions) -> Result<ConversationRequest, ConversionError> {
        let switch = self.thinking.as_ref().map(|t| t.kind.enabled());
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
            .map(|ChatCompletionTool { function: f, .. }| ToolDefinition {
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
            None | Some(ChatCompletionResponseFormat::Text) => (ResponseFormat::Text, false),
            Some(ChatCompletionResponseFormat::JsonObject) => (ResponseFormat::JsonObject, false),
            Some(ChatCompletionResponseFormat::JsonSchema { json_schema: format }) => {
                (ResponseFormat::JsonSchema(format.schema), format.strict == Some(true))
            }
            Some(ChatCompletionResponseFormat::Regex { regex }) => (ResponseFormat::Regex(regex), false),
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
            top_logprobs: self.top_logprobs.map(u32::from),
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
                    ChatCompletionRequestContentBlock::Text { text } => out.text(text),
                    ChatCompletionRequestContentBlock::ImageUrl { image_url } => {
                        let url = image_url.url;
                        let data = if out.supports_images() {
                            ImageData::from_image_url(url).map_err(|e| bad(format!("{path}: {e}")))?
                        } else {
                            ImageData::Url(url)
                        };
                        let detail = image_url.detail.map_or(ImageDetail::High, ImageDetail::from);
                        out.image(data, detail, path.clone());
                    }
                    ChatCompletionRequestContentBlock::File { .. } => {
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
    raw: Vec<ChatCompletionRequestMessage>,
    model_version: ModelVersion,
    image_token: &str,
    thinking_mode: bool,
    has_tools: bool,
    reasoning_behavior: ReasoningContentBehavior,
) -> Result<ConvertedMessages, ConversionError> {
    let count = raw.len();
    let last_user = raw.iter().rposition(|m| matches!(m, ChatCompletionRequestMessage::User { .. }));
    let calls_in_history =
        raw.iter().any(|m| matches!(m, ChatCompletionRequestMessage::Assistant { tool_calls: Some(c), .. } if !c.is_empty()));
    let mut messages = Vec::with_capacity(count);
    // Checked after the structure of the whole list, as the reference does.
    let (mut missing_reasoning, mut prefix_with_calls) = (false, false);
    // Tool-call ids of the latest assistant turn still waiting for their results.
    let mut pending: Option<HashSet<String>> = None;
    for (index, message) in raw.into_iter().enumerate() {
        let is_tool = matches!(message, ChatCompletionRequestMessage::Tool { .. });
        if !is_tool {
            if let Some(ids) = &pending {
                if !ids.is_empty() {
                    return Err(insufficient_tool_messages());
                }
            }
            pending = None;
        }
        let converted = match message {
            ChatCompletionRequestMessage::System { content } => {
                let content = content_of(content, index, model_version, image_token)?;
                if content.text.is_empty() {
                    continue;
                }
                Message::System { content, tools: None }
            }
            ChatCompletionRequestMessage::User { content } => {
                Message::User { content: content_of(content, index, model_version, image_token)? }
            }
            ChatCompletionRequestMessage::LatestReminder { content } => Message::LatestReminder { content },
            ChatCompletionRequestMessage::Tool { content, tool_call_id } => {
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
            ChatCompletionRequestMessage::Assistant { content, reasoning_content, tool_calls, prefix } => {
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
