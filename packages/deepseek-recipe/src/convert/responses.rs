//! OpenAI Responses requests.

use std::collections::BTreeMap;

use serde::de::{self, Deserializer};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::chat::DetailName;
use super::common::{openai_tool_choice, string_or_list};
use super::content::ContentBuilder;
use super::sampling::MaxTokensPolicy;
use super::tools::{
    apply_tool_choice, validate_definitions, validate_names, RequestedToolChoice,
};
use super::{assemble, bad, checked_response_format, resolve_model, Converted, EffortName, Sampling, Target};
use crate::conversation::{ConversationRequest, ModelVersion, ResponseFormat};
use crate::error::ConversionError;
use crate::image_source::{ImageData, ImageDetail};
use crate::messages::{ImageContent, Message, ToolCall, ToolDefinition};
use crate::options::{ConversionOptions, ReasoningContentBehavior, WebSearchBehavior};
use crate::conversation::Echo;
use crate::tokens::SpecialToken;

#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    pub model: String,
    pub input: Option<Input>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_logprobs: Option<u8>,
    pub user: Option<String>,
    pub tools: Option<Raw<Vec<DeclaredTool>>>,
    pub tool_choice: Option<Raw<ResponsesToolChoice>>,
    pub reasoning: Option<ResponsesReasoningConfig>,
    pub text: Option<Raw<ResponsesTextConfig>>,
    pub stream: Option<bool>,
}

/// A field kept both typed and as the raw JSON the client sent (echoed back in responses).
#[derive(Debug)]
pub struct Raw<T> {
    pub raw: Value,
    pub typed: T,
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Raw<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Value::deserialize(deserializer)?;
        let typed = T::deserialize(&raw).map_err(de::Error::custom)?;
        Ok(Self { raw, typed })
    }
}

#[derive(Debug)]
pub enum Input {
    Text(String),
    Items(Vec<Item>),
}

impl<'de> Deserialize<'de> for Input {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(Self::Text(text)),
            Value::Array(items) => items
                .into_iter()
                .map(|item| Item::from_value(item).map_err(de::Error::custom))
                .collect::<Result<Vec<_>, _>>()
                .map(Self::Items),
            _ => Err(de::Error::custom("input should be a string or a list of input items")),
        }
    }
}

#[derive(Debug)]
pub enum Item {
    Message(InputMessage),
    Reasoning(ReasoningItem),
    FunctionCall(FunctionCallItem),
    FunctionCallOutput(FunctionCallOutputItem),
    /// An item of a type this converter does not know; skipped.
    Unknown,
}

/// An input item with a `type`; other types are skipped.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResponsesTypedInputItem {
    Message(InputMessage),
    Reasoning(ReasoningItem),
    FunctionCall(FunctionCallItem),
    FunctionCallOutput(FunctionCallOutputItem),
    #[serde(other)]
    Unknown,
}

impl Item {
    /// An object with a `type`, or a message given by its `role` alone.
    fn from_value(value: Value) -> Result<Self, serde_json::Error> {
        let invalid = || <serde_json::Error as de::Error>::custom("invalid input item");
        let Value::Object(map) = &value else { return Err(invalid()) };
        if !map.contains_key("type") {
            return match map.contains_key("role") {
                true => serde_json::from_value(value).map(Self::Message),
                false => Err(invalid()),
            };
        }
        Ok(match serde_json::from_value(value)? {
            ResponsesTypedInputItem::Message(m) => Self::Message(m),
            ResponsesTypedInputItem::Reasoning(r) => Self::Reasoning(r),
            ResponsesTypedInputItem::FunctionCall(c) => Self::FunctionCall(c),
            ResponsesTypedInputItem::FunctionCallOutput(o) => Self::FunctionCallOutput(o),
            ResponsesTypedInputItem::Unknown => Self::Unknown,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputRole {
    User,
    Assistant,
    System,
    Developer,
}

#[derive(Debug, Deserialize)]
pub struct InputMessage {
    pub role: InputRole,
    pub content: Parts,
}

#[derive(Debug)]
pub struct Parts(pub Vec<ResponsesContentBlock>);

impl<'de> Deserialize<'de> for Parts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let one = |text| Self(vec![ResponsesContentBlock::InputText { text }]);
        string_or_list(deserializer, one, Self, "content should be a string or a list of content blocks")
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponsesContentBlock {
    InputText { text: String },
    OutputText { text: String },
    InputImage { image_url: Option<String>, file_id: Option<String>, detail: Option<DetailName> },
    InputFile {},
}

#[derive(Debug, Deserialize)]
pub struct ReasoningItem {
    #[serde(default)]
    pub content: Vec<ResponsesReasoningContent>,
}

#[derive(Debug, Deserialize)]
pub struct ResponsesReasoningContent {
    pub text: String,
}

#[derive(Debug, Deserialize)]
pub struct FunctionCallItem {
    // Field order decides which missing field a parse error names (as in the official).
    pub arguments: String,
    pub call_id: String,
    pub name: String,
    pub namespace: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct FunctionCallOutputItem {
    pub output: OutputParts,
    pub call_id: String,
}

/// A function call's output: a string or a list of input parts (no `output_text`).
#[derive(Debug)]
pub struct OutputParts(pub Parts);

impl<'de> Deserialize<'de> for OutputParts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let one = |text| Self(Parts(vec![ResponsesContentBlock::InputText { text }]));
        let many = |parts: Vec<ResponsesToolCallOutputItem>| Self(Parts(parts.into_iter().map(ResponsesToolCallOutputItem::into_part).collect()));
        string_or_list(deserializer, one, many, "output should be a string or a list of output content parts")
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResponsesToolCallOutputItem {
    InputText { text: String },
    InputImage { image_url: Option<String>, file_id: Option<String>, detail: Option<DetailName> },
    InputFile {},
}

impl ResponsesToolCallOutputItem {
    fn into_part(self) -> ResponsesContentBlock {
        match self {
            Self::InputText { text } => ResponsesContentBlock::InputText { text },
            Self::InputImage { image_url, file_id, detail } => ResponsesContentBlock::InputImage { image_url, file_id, detail },
            Self::InputFile {} => ResponsesContentBlock::InputFile {},
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponsesTool {
    Function(FunctionTool),
    Namespace { name: String, description: Option<String>, tools: Vec<FunctionTool> },
    #[serde(alias = "web_search_2025_08_26")]
    WebSearch {
        /// Only validated here; the response objects report it.
        #[allow(dead_code)]
        search_context_size: Option<SearchContextSize>,
        /// Only validated here; the response objects report it.
        #[allow(dead_code)]
        user_location: Option<ResponsesUserLocation>,
    },
    WebSearchPreview {},
    /// Only `apply_patch` is supported (checked at conversion).
    Custom { name: String },
}

#[derive(Debug, Deserialize)]
pub struct ResponsesUserLocation {
    pub city: Option<String>,
    pub country: Option<String>,
    pub region: Option<String>,
    pub timezone: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchContextSize {
    Low,
    Medium,
    High,
}

/// The one supported custom tool: its name, the function it is declared as, and its fixed description
/// (V4.1 puts a blank line after the description's second line).
const APPLY_PATCH: &str = "apply_patch";
const APPLY_PATCH_DESCRIPTION: &str = include_str!("apply_patch.txt");

fn apply_patch_definition(model_version: ModelVersion) -> ToolDefinition {
    let description = match model_version {
        ModelVersion::DeepseekV41Flash => {
            let mut lines: Vec<&str> = APPLY_PATCH_DESCRIPTION.split('\n').collect();
            lines.insert(2, "");
            lines.join("\n")
        }
        _ => APPLY_PATCH_DESCRIPTION.to_owned(),
    };
    ToolDefinition {
        name: APPLY_PATCH.to_owned(),
        description: Some(description),
        parameters: serde_json::json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "input": {
                    "type": "string",
                    "description": "The entire contents of the apply_patch command (the *** Begin Patch ... *** End Patch envelope)."
                }
            },
            "required": ["input"]
        }),
        strict: None,
        defer_loading: false,
    }
}

/// A declared tool; tools of unknown types are ignored.
#[derive(Debug)]
pub struct DeclaredTool(pub Option<ResponsesTool>);

impl<'de> Deserialize<'de> for DeclaredTool {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let known = matches!(
            value.get("type").and_then(Value::as_str),
            None | Some(
                "function" | "namespace" | "web_search" | "web_search_2025_08_26" | "web_search_preview" | "custom"
            )
        );
        if !known {
            return Ok(Self(None));
        }
        ResponsesTool::deserialize(value).map(|t| Self(Some(t))).map_err(de::Error::custom)
    }
}

#[derive(Debug, Deserialize)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
}

#[derive(Debug)]
pub struct ResponsesToolChoice(pub RequestedToolChoice);

/// A tool choice object, told apart by `type`; a hosted tool leaves the choice to the model.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResponsesNamedToolChoice {
    Function { name: String },
    WebSearch {},
    #[serde(rename = "web_search_2025_08_26")]
    WebSearch20250826 {},
    Custom { name: String },
}

impl<'de> Deserialize<'de> for ResponsesToolChoice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let object = |map: Map<String, Value>| {
            if !map.contains_key("type") {
                return Ok(None);
            }
            let object = ResponsesNamedToolChoice::deserialize(Value::Object(map)).map_err(de::Error::custom)?;
            Ok(Some(match object {
                ResponsesNamedToolChoice::Function { name } | ResponsesNamedToolChoice::Custom { name } => {
                    RequestedToolChoice::Named(name)
                }
                ResponsesNamedToolChoice::WebSearch {} | ResponsesNamedToolChoice::WebSearch20250826 {} => RequestedToolChoice::Auto,
            }))
        };
        openai_tool_choice(deserializer, object, "expected one of `none`, `auto`, `required` or a tool choice object")
            .map(Self)
    }
}

#[derive(Debug, Deserialize)]
pub struct ResponsesReasoningConfig {
    pub effort: Option<EffortName>,
    /// Checked only.
    #[allow(dead_code)]
    pub summary: Option<ReasoningSummary>,
    /// Checked only.
    #[allow(dead_code)]
    pub generate_summary: Option<ReasoningSummary>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningSummary {
    Auto,
    Concise,
    Detailed,
}

#[derive(Debug, Deserialize)]
pub struct ResponsesTextConfig {
    /// Absent means text; an explicit `null` is rejected.
    #[serde(default, deserialize_with = "present")]
    pub format: Option<TextFormat>,
    /// Only validated here; the response objects report it.
    #[allow(dead_code)]
    pub verbosity: Option<Verbosity>,
}

fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verbosity {
    Low,
    Medium,
    High,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", expecting = "internally tagged enum ResponsesTextFormat")]
pub enum TextFormat {
    Text,
    JsonSchema {
        #[allow(dead_code)]
        name: String,
        schema: Value,
        strict: Option<bool>,
    },
    JsonObject,
}

/// A namespaced function's description: for V4.1 a non-empty namespace description, a newline, then
/// the function's own (joined even when the function has none); V4 keeps the function's own.
fn namespaced_description(model_version: ModelVersion, namespace: Option<&str>, function: Option<&str>) -> Option<String> {
    match namespace {
        Some(ns) if !ns.is_empty() && model_version == ModelVersion::DeepseekV41Flash => {
            Some(format!("{ns}\n{}", function.unwrap_or_default()))
        }
        _ => function.map(str::to_owned),
    }
}

/// The name a namespaced function is known by in the conversation (model-specific separator).
fn namespaced(model_version: ModelVersion, namespace: &str, name: &str) -> String {
    match model_version {
        ModelVersion::DeepseekV4Pro => format!("{namespace}__{name}"),
        ModelVersion::DeepseekV41Flash => format!("{namespace}::{name}"),
    }
}

impl ResponsesRequest {
    /// The requested settings, as the response object reports them.
    pub fn echo(&self) -> Echo {
        let defaults = Echo::default();
        Echo {
            instructions: self.instructions.clone(),
            max_output_tokens: self.max_output_tokens.map(u64::from),
            temperature: self.temperature.map_or(1.0, f64::from),
            top_p: self.top_p.map_or(1.0, f64::from),
            top_logprobs: self.top_logprobs.map_or(0, u64::from),
            user: self.user.clone(),
            reasoning_effort: self.reasoning.as_ref().and_then(|r| r.effort).map(|e| e.as_str().to_owned()),
            text_format: self
                .text
                .as_ref()
                .and_then(|t| t.raw.get("format").cloned())
                .unwrap_or(defaults.text_format),
            verbosity: self.text.as_ref().and_then(|t| t.raw.get("verbosity").cloned()).unwrap_or(Value::Null),
            tool_choice: self.tool_choice.as_ref().map_or(defaults.tool_choice, |c| c.raw.clone()),
            tools: self.tools.as_ref().map_or(defaults.tools, |t| t.raw.clone()),
        }
    }

    /// Flattened function name -> (namespace, local name) for namespace tools.
    pub fn namespace_tool_map(
        &self,
        options: &ConversionOptions,
    ) -> Result<BTreeMap<String, (String, String)>, ConversionError> {
        let model_version = resolve_model(options, &self.model)?;
        self.validate_local_names()?;
        Ok(self.namespaced_functions(model_version).collect())
    }

    /// (flattened function name, (namespace, local name)) for each function of a namespace tool.
    fn namespaced_functions(
        &self,
        model_version: ModelVersion,
    ) -> impl Iterator<Item = (String, (String, String))> + '_ {
        self.declared()
            .filter_map(|tool| match tool {
                ResponsesTool::Namespace { name, tools, .. } => Some((name, tools)),
                _ => None,
            })
            .flat_map(move |(name, tools)| {
                tools.iter().map(move |function| {
                    let flat = namespaced(model_version, name, &function.name);
                    (flat, (name.clone(), function.name.clone()))
                })
            })
    }

    /// Names (of namespaces and of their functions) are checked before they are joined.
    fn validate_local_names(&self) -> Result<(), ConversionError> {
        let indexed = self.tools.iter().flat_map(|t| &t.typed).enumerate();
        for (i, tool) in indexed.filter_map(|(i, t)| t.0.as_ref().map(|t| (i, t))) {
            match tool {
                ResponsesTool::Function(f) => validate_names([f.name.as_str()].into_iter(), &format!("tools[{i}].name"))?,
                ResponsesTool::Namespace { name, tools, .. } => {
                    validate_names([name.as_str()].into_iter(), &format!("tools[{i}].name"))?;
                    validate_names(tools.iter().map(|f| f.name.as_str()), &format!("tools[{i}].tools[{{}}].name"))?;
                }
                ResponsesTool::WebSearch { .. } | ResponsesTool::WebSearchPreview {} | ResponsesTool::Custom { .. } => {}
            }
        }
        Ok(())
    }

    /// Custom tools other than `apply_patch` are rejected before the input is looked at.
    fn check_custom_tools(&self) -> Result<(), ConversionError> {
        for tool in self.declared() {
            if let ResponsesTool::Custom { name } = tool {
                if name != APPLY_PATCH {
                    return Err(bad(format!("Unsupported custom tool: '{name}'. Only 'apply_patch' is supported.")));
                }
            }
        }
        Ok(())
    }

    fn declared(&self) -> impl Iterator<Item = &ResponsesTool> {
        self.tools.iter().flat_map(|t| &t.typed).filter_map(|t| t.0.as_ref())
    }

    fn declared_tools(
        &self,
        model_version: ModelVersion,
        web_search: WebSearchBehavior,
    ) -> Result<Vec<ToolDefinition>, ConversionError> {
        let definition = |name: String, description: Option<String>, f: &FunctionTool| ToolDefinition {
            name,
            description,
            parameters: f.parameters.clone().unwrap_or(Value::Null),
            strict: f.strict,
            defer_loading: false,
        };
        let mut out = Vec::new();
        for tool in self.declared() {
            match tool {
                ResponsesTool::Function(f) => out.push(definition(f.name.clone(), f.description.clone(), f)),
                ResponsesTool::Namespace { name, description, tools } => out.extend(tools.iter().map(|f| {
                    let description = namespaced_description(model_version, description.as_deref(), f.description.as_deref());
                    definition(namespaced(model_version, name, &f.name), description, f)
                })),
                ResponsesTool::WebSearch { .. } => {
                    if web_search == WebSearchBehavior::Reject {
                        return Err(bad("Server tools are not supported"));
                    }
                }
                ResponsesTool::WebSearchPreview {} => {}
                ResponsesTool::Custom { .. } => out.push(apply_patch_definition(model_version)),
            }
        }
        self.validate_local_names()?;
        validate_definitions(out)
    }

    pub fn convert(self, options: &ConversionOptions) -> Result<ConversationRequest, ConversionError> {
        let requested_effort = self.reasoning.as_ref().and_then(|r| r.effort);
        let target = Target::resolve(options, &self.model, None, requested_effort)?;
        let Target { model_version, thinking_mode, .. } = target;
        self.check_custom_tools()?;
        match &self.input {
            None if self.instructions.is_none() => {
                return Err(bad("Either input or instructions must be provided"))
            }
            Some(Input::Items(items)) if items.is_empty() => {
                return Err(bad("Input items array must not be empty"))
            }
            _ => {}
        }
        // Checks run in the reference's order: tools, input, tool choice, text format, sampling.
        let declared = self.declared_tools(model_version, options.responses_web_search)?;
        // The response objects report the request's settings and split namespaced calls, even without
        // `ResponsesChunkGenerator.with_echo` / `with_namespace_tool_map`.
        let responses_echo = self.echo();
        let namespace_tool_map = self.namespaced_functions(model_version).collect();
        let choice = self.tool_choice.map_or(RequestedToolChoice::Auto, |c| c.typed.0);

        let mut messages = Vec::new();
        if let Some(instructions) = self.instructions.filter(|i| !i.is_empty()) {
            messages.push(Message::system(instructions));
        }
        let converter = ItemConverter {
            model_version,
            image_token: options.special_tokens.token(SpecialToken::Image),
            thinking_mode,
        };
        let missing_reasoning = match self.input {
            Some(Input::Text(text)) => {
                messages.push(Message::user(text));
                false
            }
            Some(Input::Items(items)) => converter.convert(items, &mut messages)?,
            None => false,
        };
        if missing_reasoning && options.reasoning_content_behavior == ReasoningContentBehavior::Reject {
            return Err(bad("The `reasoning_text` in the thinking mode must be passed back to the API."));
        }
        let tools = apply_tool_choice(declared, choice, thinking_mode)?;

        let requested_format = match self.text.and_then(|t| t.typed.format) {
            None | Some(TextFormat::Text) => (ResponseFormat::Text, false),
            Some(TextFormat::JsonObject) => (ResponseFormat::JsonObject, false),
            Some(TextFormat::JsonSchema { schema, strict, .. }) => {
                (ResponseFormat::JsonSchema(schema), strict == Some(true))
            }
        };
        let response_format = checked_response_format(
            requested_format,
            &messages,
            "Response input messages must contain the word 'json' in some form to use 'text.format' of type 'json_object'.",
        )?;
        let mut sampling = Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            max_tokens: self.max_output_tokens,
            logprobs: self.top_logprobs.is_some(),
            top_logprobs: self.top_logprobs.map(u32::from),
            ..Sampling::default()
        };
        sampling.validate(options.max_tokens_upper_bound(thinking_mode), MaxTokensPolicy::Reject)?;
        let converted = Converted {
            messages,
            tools,
            response_format,
            sampling,
            stream: self.stream.unwrap_or(false),
            include_usage: false,
        };
        let mut request = assemble(options, target, converted)?;
        request.responses_echo = responses_echo;
        request.namespace_tool_map = namespace_tool_map;
        Ok(request)
    }
}

/// Function calls and their outputs: outputs are matched to calls and emitted in call order.
#[derive(Default)]
struct CallTracker {
    /// Call id -> position among all calls.
    order: std::collections::HashMap<String, usize>,
    /// Calls without an output yet, in call order.
    unanswered: Vec<String>,
    /// Consecutive outputs waiting to be emitted.
    outputs: Vec<(usize, Message)>,
}

impl CallTracker {
    fn called(&mut self, id: &str) {
        let next = self.order.len();
        self.order.entry(id.to_owned()).or_insert(next);
        self.unanswered.push(id.to_owned());
    }

    fn answered(&mut self, id: String, content: ImageContent) -> Result<(), ConversionError> {
        let Some(&position) = self.order.get(&id) else {
            return Err(bad(format!("No tool call found for tool output with call_id {id}.")));
        };
        self.unanswered.retain(|pending| *pending != id);
        self.outputs.push((position, Message::Tool { content, tool_call_id: Some(id) }));
        Ok(())
    }

    fn flush_outputs(&mut self, out: &mut Vec<Message>) {
        self.outputs.sort_by_key(|(position, _)| *position);
        out.extend(self.outputs.drain(..).map(|(_, message)| message));
    }

    fn check_all_answered(&self) -> Result<(), ConversionError> {
        match self.unanswered.first() {
            Some(id) => Err(bad(format!("No tool output found for tool call {id}."))),
            None => Ok(()),
        }
    }
}

struct ItemConverter<'a> {
    model_version: ModelVersion,
    image_token: &'a str,
    thinking_mode: bool,
}

impl ItemConverter<'_> {
    /// Converts the items; returns whether a tool-call turn after the last user message came
    /// without reasoning (an error when missing reasoning is rejected).
    fn convert(&self, items: Vec<Item>, out: &mut Vec<Message>) -> Result<bool, ConversionError> {
        let mut missing_reasoning = false;
        let last_user = items
            .iter()
            .rposition(|item| matches!(item, Item::Message(InputMessage { role: InputRole::User, .. })));
        let mut calls = CallTracker::default();
        let mut pending_reasoning: Option<String> = None;
        // Whether the last message is an assistant turn that later assistant items extend.
        let mut assistant_open = false;
        for (index, item) in items.into_iter().enumerate() {
            if !matches!(item, Item::FunctionCallOutput(_)) {
                calls.flush_outputs(out);
            }
            match item {
                Item::Unknown => {}
                Item::Reasoning(reasoning) => {
                    let text = reasoning.content.into_iter().map(|r| r.text).collect::<Vec<_>>().join("\n");
                    pending_reasoning.get_or_insert_with(String::new).push_str(&text);
                    assistant_open = false;
                }
                Item::FunctionCall(call) => {
                    let name = match &call.namespace {
                        Some(ns) => namespaced(self.model_version, ns, &call.name),
                        None => call.name,
                    };
                    calls.called(&call.call_id);
                    let tool_call = ToolCall { id: call.call_id, name, arguments: call.arguments };
                    if !assistant_open {
                        let current_turn = last_user.is_none_or(|u| index > u);
                        missing_reasoning |= self.thinking_mode && current_turn && pending_reasoning.is_none();
                        out.push(self.assistant(String::new(), pending_reasoning.take()));
                        assistant_open = true;
                    }
                    if let Some(Message::Assistant { tool_calls, .. }) = out.last_mut() {
                        tool_calls.get_or_insert_with(Vec::new).push(tool_call);
                    }
                }
                Item::FunctionCallOutput(output) => {
                    let content = self.content(output.output.0, &format!("input[{index}]"))?;
                    calls.answered(output.call_id, content)?;
                    assistant_open = false;
                }
                Item::Message(message) => {
                    calls.check_all_answered()?;
                    let path = format!("input[{index}]");
                    let content = self.content(message.content, &path)?;
                    match message.role {
                        InputRole::Assistant => {
                            out.push(self.assistant(content.text, pending_reasoning.take()));
                            assistant_open = true;
                            continue;
                        }
                        InputRole::System => out.push(Message::System { content, tools: None }),
                        InputRole::Developer if self.model_version == ModelVersion::DeepseekV41Flash => {
                            out.push(Message::System { content, tools: None })
                        }
                        InputRole::User | InputRole::Developer => out.push(Message::User { content }),
                    }
                    assistant_open = false;
                }
            }
        }
        calls.flush_outputs(out);
        calls.check_all_answered()?;
        Ok(missing_reasoning)
    }

    fn assistant(&self, content: String, reasoning: Option<String>) -> Message {
        let reasoning_content = if self.thinking_mode { Some(reasoning.unwrap_or_default()) } else { None };
        Message::Assistant { content, reasoning_content, tool_calls: None, prefix: false }
    }

    fn content(&self, parts: Parts, path: &str) -> Result<ImageContent, ConversionError> {
        let mut out = ContentBuilder::new(self.model_version, self.image_token);
        for (k, part) in parts.0.into_iter().enumerate() {
            match part {
                ResponsesContentBlock::InputText { text } | ResponsesContentBlock::OutputText { text } => out.text(text),
                ResponsesContentBlock::InputFile {} => out.text("[Unsupported Document]"),
                ResponsesContentBlock::InputImage { .. } if !out.supports_images() => out.text(super::content::UNSUPPORTED_IMAGE),
                ResponsesContentBlock::InputImage { image_url, file_id, detail } => {
                    let detail = detail.map_or(ImageDetail::High, ImageDetail::from);
                    // An empty image_url counts as absent.
                    match (image_url.filter(|u| !u.is_empty()), file_id) {
                        (Some(url), None) => {
                            let data = ImageData::from_image_url(url).map_err(|e| bad(format!("{path}: {e}")))?;
                            out.image(data, detail, path.to_owned());
                        }
                        (None, None) => {
                            return Err(bad(format!("{path}.content[{k}]: input_image must have image_url or file_id")))
                        }
                        (Some(_), Some(_)) => {
                            return Err(bad(format!(
                                "{path}.content[{k}]: input_image cannot have both image_url and file_id"
                            )))
                        }
                        (None, Some(_)) => {
                            return Err(bad(format!(
                                "{path}.content[{k}]: file_id is not supported. Pass the image as a base64 data url instead."
                            )))
                        }
                    }
                }
            }
        }
        Ok(out.build())
    }
}
