//! Protocol requests -> [`ConversationRequest`].
//!
//! Each protocol module parses its body with serde (shape errors become [`RequestParseError`]) and
//! converts it, reporting semantic errors as [`ConversionError`]s. This module holds the steps they
//! share: model resolution, reasoning effort, sampling validation and the final assembly.
//!
//! ```no_run
//! use deepseek_recipe::convert::{chat::ChatCompletionRequest, parse_body, Body};
//! use deepseek_recipe::options::ConversionOptions;
//! use deepseek_recipe::render::{PromptFormat, Renderer};
//! use deepseek_recipe::tokenizer::Tokenizer;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let body = br#"{"model":"DeepSeek-V4-Pro","messages":[{"role":"user","content":"Hi"}]}"#;
//! let request: ChatCompletionRequest = parse_body(Body::Text(body))?;
//! let converted = request.convert(&ConversionOptions::default())?;
//! let rendered = Renderer::new(PromptFormat::V4).render(&converted.conversation);
//! let ids = Tokenizer::from_file("tokenizer.json")?.encode_prompt(&rendered)?;
//! # let _ = ids;
//! # Ok(())
//! # }
//! ```

pub mod chat;
mod common;
pub mod content;
pub mod messages;
pub mod responses;
pub mod sampling;
pub mod tools;

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::conversation::{
    Conversation, ConversationRequest, Echo, InferenceOptions, ModelVersion, OutputConstraint,
    ReasoningEffort, ResponseFormat, ToolChoice,
};
use crate::error::{ConversionError, RequestParseError};
use crate::messages::{Message, ToolDefinition};
use crate::options::{ConversionOptions, ParsingOptions, ThinkingInitialStage};

pub use sampling::Sampling;

/// A request body: already-parsed JSON, or JSON text / UTF-8 bytes.
pub enum Body<'a> {
    Json(Value),
    Text(&'a [u8]),
}

/// Parses a body into a protocol request type.
pub fn parse_body<T: DeserializeOwned>(body: Body<'_>) -> Result<T, RequestParseError> {
    let value = match body {
        Body::Json(value) => value,
        Body::Text(bytes) => serde_json::from_slice(bytes)
            .map_err(|e| RequestParseError::Json(e.to_string()))?,
    };
    T::deserialize(value).map_err(|e| RequestParseError::Body(e.to_string()))
}

fn bad(message: impl Into<String>) -> ConversionError {
    ConversionError::bad_request(message)
}

pub fn resolve_model(options: &ConversionOptions, model: &str) -> Result<ModelVersion, ConversionError> {
    options.model_versions_by_name.get(model).copied().ok_or_else(|| {
        let names: Vec<&str> = options.model_versions_by_name.keys().map(String::as_str).collect();
        ConversionError::bad_request(format!(
            "The supported API model names are {}, but you passed {model}.",
            names.join(", ")
        ))
    })
}

/// Requested reasoning effort names, as all three protocols spell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EffortName {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
    Ultra,
    Max,
}

impl EffortName {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Minimal => "minimal",
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::Xhigh => "xhigh",
            Self::Ultra => "ultra",
            Self::Max => "max",
        }
    }
}

/// Thinking mode: an explicit switch wins; otherwise a requested effort turns thinking on (`none`
/// turns it off); otherwise the configured default.
pub fn thinking_mode(switch: Option<bool>, requested: Option<EffortName>, default: bool) -> bool {
    match (switch, requested) {
        (Some(enabled), _) => enabled,
        (None, Some(EffortName::None)) => false,
        (None, Some(_)) => true,
        (None, None) => default,
    }
}

/// The conversation's effort in thinking mode (none when thinking is off).
pub fn effort(thinking_mode: bool, requested: Option<EffortName>) -> Option<ReasoningEffort> {
    if !thinking_mode {
        return None;
    }
    Some(match requested {
        Some(EffortName::Minimal | EffortName::Low) => ReasoningEffort::Low,
        Some(EffortName::Xhigh) => ReasoningEffort::Xhigh,
        Some(EffortName::Ultra | EffortName::Max) => ReasoningEffort::Max,
        _ => ReasoningEffort::High,
    })
}

/// What each protocol settles first: the target model and the thinking mode.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub model_version: ModelVersion,
    pub thinking_mode: bool,
    /// The effort name the request asked for.
    pub requested_effort: Option<EffortName>,
}

impl Target {
    /// Resolves the model name; the thinking mode follows [`thinking_mode`].
    pub fn resolve(
        options: &ConversionOptions,
        model: &str,
        switch: Option<bool>,
        requested_effort: Option<EffortName>,
    ) -> Result<Self, ConversionError> {
        let model_version = resolve_model(options, model)?;
        let thinking_mode = thinking_mode(switch, requested_effort, options.default_thinking_mode);
        Ok(Self { model_version, thinking_mode, requested_effort })
    }
}

/// The type of the `thinking` switch of Chat and Messages.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThinkingType {
    Adaptive,
    Enabled,
    Disabled,
}

impl ThinkingType {
    pub fn enabled(self) -> bool {
        !matches!(self, Self::Disabled)
    }
}

/// Whether the word "json" appears (any case) in some message.
pub fn mentions_json(messages: &[Message]) -> bool {
    messages.iter().any(|m| m.content().to_ascii_lowercase().contains("json"))
}

/// Checks a requested response format (with whether its JSON schema is strict): `json_object` needs
/// the word "json" in some message (else `json_object_error`), a JSON schema must normalise.
pub fn checked_response_format(
    requested: (ResponseFormat, bool),
    messages: &[Message],
    json_object_error: &str,
) -> Result<(ResponseFormat, bool), ConversionError> {
    match &requested {
        (ResponseFormat::JsonObject, _) if !mentions_json(messages) => return Err(bad(json_object_error)),
        (ResponseFormat::JsonSchema(schema), strict) => {
            tools::normalised_response_schema(schema, *strict)?;
        }
        _ => {}
    }
    Ok(requested)
}

/// The constraint of a response format (tool-call constraints take precedence elsewhere).
pub fn response_constraint(format: &ResponseFormat, strict_schema: bool) -> Result<Option<OutputConstraint>, ConversionError> {
    let constraint = |kind: &str, schema: String| OutputConstraint { kind: kind.to_owned(), schema };
    Ok(match format {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => Some(constraint("json", String::new())),
        ResponseFormat::JsonSchema(schema) => Some(constraint(
            "json",
            tools::normalised_response_schema(schema, strict_schema)?.to_string(),
        )),
        ResponseFormat::Regex(regex) => Some(constraint("regex", regex.clone())),
    })
}

/// Where output parsing starts: in a new reasoning block, or continuing a prefix message.
fn thinking_initial_stage(conversation: &Conversation) -> Option<ThinkingInitialStage> {
    if !conversation.thinking_mode {
        return None;
    }
    Some(match conversation.messages.last() {
        Some(Message::Assistant { prefix: true, content, reasoning_content, .. }) => {
            match (content.is_empty(), reasoning_content.as_deref().unwrap_or("").is_empty()) {
                (false, _) => ThinkingInitialStage::ContentContinuation,
                (true, false) => ThinkingInitialStage::ReasoningContinuation,
                (true, true) => ThinkingInitialStage::ReasoningStart,
            }
        }
        _ => ThinkingInitialStage::ReasoningStart,
    })
}

/// Sampling values for the target model: thinking mode pins temperature (and V4 Pro's top_p).
fn sampling_for_model(version: ModelVersion, conversation: &Conversation, sampling: &Sampling) -> (f64, f64) {
    let requested = |v: Option<f32>| v.map_or(1.0, f64::from);
    let thinking = conversation.thinking_mode;
    match (version, thinking) {
        (ModelVersion::DeepseekV4Pro, true) => {
            let top_p = if conversation.tools.is_empty() { 1.0 } else { f64::from(0.95f32) };
            (1.0, top_p)
        }
        (ModelVersion::DeepseekV4Pro, false) => (requested(sampling.temperature), requested(sampling.top_p)),
        (ModelVersion::DeepseekV41Flash, true) => {
            (1.0, sampling.top_p.map_or(1.0, |p| f64::from(p.max(0.95))))
        }
        (ModelVersion::DeepseekV41Flash, false) => (requested(sampling.temperature), 1.0),
    }
}

/// Everything a protocol module hands over after converting its request.
pub struct Converted {
    pub messages: Vec<Message>,
    /// The tools and tool choice, as `tool_choice` left them.
    pub tools: (Vec<ToolDefinition>, ToolChoice),
    /// The response format, and whether a `json_schema` format asked for a strict schema.
    pub response_format: (ResponseFormat, bool),
    pub sampling: Sampling,
    pub stream: bool,
    pub include_usage: bool,
}

/// Builds the final request: the conversation, inference options, output constraint and parsing options.
pub fn assemble(
    options: &ConversionOptions,
    target: Target,
    converted: Converted,
) -> Result<ConversationRequest, ConversionError> {
    let Target { model_version, thinking_mode, requested_effort } = target;
    let Converted {
        messages,
        tools: (tools, tool_choice),
        response_format: (response_format, strict_response_schema),
        sampling,
        stream,
        include_usage,
    } = converted;
    let conversation = Conversation {
        messages,
        thinking_mode,
        tools,
        tool_choice,
        reasoning_effort: effort(thinking_mode, requested_effort),
        response_format,
    };
    let (temperature, top_p) = sampling_for_model(model_version, &conversation, &sampling);
    let output_constraint = match tools::tool_call_constraint(&conversation.tools, conversation.tool_choice) {
        Some(constraint) => Some(constraint),
        None => response_constraint(&conversation.response_format, strict_response_schema)?,
    };
    let has_tools = !conversation.tools.is_empty();
    let parsing_options = ParsingOptions {
        parse_tool_calls: has_tools,
        starts_in_tool_calls: has_tools && conversation.tool_choice == ToolChoice::Required,
        parse_json_output: conversation.response_format == ResponseFormat::JsonObject,
        thinking_initial_stage: thinking_initial_stage(&conversation),
        stop_sequences: sampling.stop.clone(),
        special_tokens: options.special_tokens.clone(),
    };
    let inference_options = InferenceOptions {
        max_tokens: sampling.max_tokens,
        temperature: Some(temperature),
        top_p: Some(top_p),
        logprobs: sampling.logprobs,
        top_logprobs: sampling.top_logprobs,
        seed: sampling.seed,
        output_constraint,
    };
    Ok(ConversationRequest {
        conversation,
        inference_options,
        parsing_options,
        model_version,
        stream,
        include_usage,
        responses_echo: Echo::default(),
        namespace_tool_map: HashMap::new(),
    })
}
