//! A conversation with its prompt configuration, and the converted request around it.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::error::ConversionError;
use crate::messages::{Message, ToolDefinition};
use crate::options::ParsingOptions;

pub use crate::model_version::ModelVersion;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    Required,
}

impl ToolChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::None => "none",
            Self::Required => "required",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "none" => Ok(Self::None),
            "required" => Ok(Self::Required),
            _ => Err(format!(
                "invalid tool_choice \"{s}\"; expected \"auto\", \"none\", or \"required\""
            )),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningEffort {
    Low,
    High,
    Xhigh,
    Max,
}

impl ReasoningEffort {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::High => "high",
            Self::Xhigh => "xhigh",
            Self::Max => "max",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "low" => Ok(Self::Low),
            "high" => Ok(Self::High),
            "xhigh" => Ok(Self::Xhigh),
            "max" => Ok(Self::Max),
            _ => Err(format!(
                "invalid reasoning_effort \"{s}\"; expected \"low\", \"high\", \"xhigh\", or \"max\""
            )),
        }
    }
}

/// The requested answer format; the schema/regex variants carry their constraint.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum ResponseFormat {
    #[default]
    Text,
    JsonObject,
    JsonSchema(Value),
    Regex(String),
}

impl ResponseFormat {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::JsonObject => "json_object",
            Self::JsonSchema(_) => "json_schema",
            Self::Regex(_) => "regex",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub thinking_mode: bool,
    pub tools: Vec<ToolDefinition>,
    pub tool_choice: ToolChoice,
    pub reasoning_effort: Option<ReasoningEffort>,
    pub response_format: ResponseFormat,
}

impl Default for Conversation {
    fn default() -> Self {
        Self {
            messages: Vec::new(),
            thinking_mode: true,
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            reasoning_effort: None,
            response_format: ResponseFormat::Text,
        }
    }
}

impl Conversation {
    pub fn new(messages: Vec<Message>) -> Self {
        Self { messages, ..Self::default() }
    }
}

/// A constraint the backend may enforce by constrained decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputConstraint {
    /// `json`, `regex`, `tool_call` or `tool_call_required`.
    pub kind: String,
    /// Compact JSON schema, the regex, the tool list as JSON, or `""` for any JSON value.
    pub schema: String,
}

/// Sampling parameters resolved by conversion; `None` where the request left them open.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct InferenceOptions {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub logprobs: bool,
    pub top_logprobs: Option<u32>,
    pub seed: Option<u64>,
    pub output_constraint: Option<OutputConstraint>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ConversationRequest {
    pub conversation: Conversation,
    pub inference_options: InferenceOptions,
    pub parsing_options: ParsingOptions,
    pub model_version: ModelVersion,
    /// The protocol request's `stream` flag.
    pub stream: bool,
    /// Chat `stream_options.include_usage`.
    pub include_usage: bool,
    /// What the Responses response objects report for this request (the requested settings and tools);
    /// the defaults unless the request was a converted Responses request.
    pub responses_echo: Echo,
    /// Responses namespace tools: flattened function name -> (namespace, local name); empty otherwise.
    pub namespace_tool_map: HashMap<String, (String, String)>,
}

const DEFAULT_MAX_TOKENS_NON_THINKING: u64 = 8192;
const DEFAULT_MAX_TOKENS_THINKING: u64 = 65536;
const DEFAULT_MAX_TOKENS_THINKING_MAX: u64 = 131072;

impl ConversationRequest {
    pub fn new(conversation: Conversation, model_version: ModelVersion) -> Self {
        Self {
            conversation,
            inference_options: InferenceOptions::default(),
            parsing_options: ParsingOptions::default(),
            model_version,
            stream: false,
            include_usage: false,
            responses_echo: Echo::default(),
            namespace_tool_map: HashMap::new(),
        }
    }

    /// The `max_tokens` to send to the backend for a prompt of `prompt_tokens` tokens.
    pub fn resolve_max_tokens(
        &self,
        prompt_tokens: u64,
        context_limit: u64,
    ) -> Result<u64, ConversionError> {
        let requested = self.inference_options.max_tokens.map(u64::from);
        let needed = prompt_tokens.saturating_add(requested.unwrap_or(0));
        if needed > context_limit {
            return Err(ConversionError::bad_request(format!(
                "This model's maximum context length is {context_limit} tokens. However, you requested \
                 {needed} tokens ({prompt_tokens} in the messages, {} in the completion). Please reduce \
                 the length of the messages or completion.",
                requested.unwrap_or(0)
            )));
        }
        let conversation = &self.conversation;
        let wanted = requested.unwrap_or(match conversation.thinking_mode {
            false => DEFAULT_MAX_TOKENS_NON_THINKING,
            true if conversation.reasoning_effort == Some(ReasoningEffort::Max) => {
                DEFAULT_MAX_TOKENS_THINKING_MAX
            }
            true => DEFAULT_MAX_TOKENS_THINKING,
        });
        Ok(wanted.min(context_limit - prompt_tokens).max(1))
    }
}

/// Request settings the response object reports back.
#[derive(Clone, Debug, PartialEq)]
pub struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub temperature: f64,
    pub top_p: f64,
    pub top_logprobs: u64,
    pub user: Option<String>,
    /// The requested effort name (`"none"`, `"high"`, ...).
    pub reasoning_effort: Option<String>,
    /// `text.format` as requested.
    pub text_format: Value,
    /// `text.verbosity` as requested (null when absent).
    pub verbosity: Value,
    pub tool_choice: Value,
    pub tools: Value,
}

impl Default for Echo {
    fn default() -> Self {
        Self {
            instructions: None,
            max_output_tokens: None,
            temperature: 1.0,
            top_p: 1.0,
            top_logprobs: 0,
            user: None,
            reasoning_effort: None,
            text_format: json!({"type": "text"}),
            verbosity: Value::Null,
            tool_choice: json!("auto"),
            tools: json!([]),
        }
    }
}
