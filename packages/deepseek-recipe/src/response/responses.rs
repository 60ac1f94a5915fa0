//! OpenAI Responses: `response.*` stream events and the final `response` object.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::unix_now;
use crate::conversation::Echo;
use crate::stream::processor::{Completion, Delta, Generator};
use crate::stream::{FinishReason, PromptUsage};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResponsesConfig {
    pub thinking_mode: bool,
    pub echo: Echo,
    /// Flattened tool name -> (namespace, local name).
    pub namespace_tool_map: HashMap<String, (String, String)>,
    /// Names of the request's `custom` tools, whose calls are reported as `custom_tool_call` items.
    /// Set from the converted request; `with_echo` does not change it.
    pub custom_tools: Vec<String>,
}

/// The names of the `custom` tools among Responses-format request tools.
pub fn custom_tool_names(tools: &Value) -> Vec<String> {
    let tools = tools.as_array().map(Vec::as_slice).unwrap_or_default();
    tools.iter().filter(|t| t["type"] == "custom").filter_map(|t| t["name"].as_str().map(str::to_owned)).collect()
}

#[derive(Clone, Debug, PartialEq)]
pub struct ResponsesEvent(pub Value);

impl ResponsesEvent {
    pub fn to_json(&self) -> String {
        self.0.to_string()
    }

    pub fn event_type(&self) -> &str {
        self.0["type"].as_str().unwrap_or_default()
    }
}

/// Tools as the response object reports them: every function with `description`, `parameters` and
/// `strict` (null when absent), namespaces with `description` and their normalised tools, web search
/// tools with `search_context_size` and `user_location` (its four fields, null when absent), custom tools
/// by type and name; other keys and other tool types (`web_search_preview`, `file_search`, ...) are
/// dropped.
fn reported_tools(tools: &Value) -> Value {
    let Some(list) = tools.as_array() else { return tools.clone() };
    let field = |tool: &Value, key: &str| tool.get(key).cloned().unwrap_or(Value::Null);
    let report = |tool: &Value| match tool["type"].as_str()? {
        "function" => Some(json!({"type": "function", "name": field(tool, "name"),
            "description": field(tool, "description"), "parameters": field(tool, "parameters"),
            "strict": field(tool, "strict")})),
        "namespace" => Some(json!({"type": "namespace", "name": field(tool, "name"),
            "description": field(tool, "description"), "tools": reported_tools(&field(tool, "tools"))})),
        kind @ ("web_search" | "web_search_2025_08_26") => {
            let location = match tool.get("user_location") {
                Some(l) if l.is_object() => json!({"city": field(l, "city"), "country": field(l, "country"),
                    "region": field(l, "region"), "timezone": field(l, "timezone")}),
                _ => Value::Null,
            };
            Some(json!({"type": kind, "search_context_size": field(tool, "search_context_size"),
                "user_location": location}))
        }
        "custom" => Some(json!({"type": "custom", "name": field(tool, "name")})),
        _ => None,
    };
    Value::Array(list.iter().filter_map(report).collect())
}

/// `text.format` as the response object reports it: a `json_schema` format with `name`, `schema`,
/// `description` and `strict` (null when absent), other formats by type only.
fn reported_format(format: &Value) -> Value {
    let field = |key: &str| format.get(key).cloned().unwrap_or(Value::Null);
    match format["type"].as_str() {
        Some("json_schema") => json!({"type": "json_schema", "name": field("name"), "schema": field("schema"),
            "description": field("description"), "strict": field("strict")}),
        Some(kind) => json!({"type": kind}),
        None => format.clone(),
    }
}

/// The f64 whose shortest spelling is the f32 value's (so 0.9f32 reports as `0.9`).
fn f32_spelling(value: f64) -> f64 {
    (value as f32).to_string().parse().unwrap_or(value)
}

/// The response object before any output: shared by the generator and an empty accumulator. Sampling
/// settings are f32 in requests and are reported with f32 spelling (`0.9`, not `0.8999999761581421`).
pub fn response_object(id: &str, model: &str, created_at: u64, echo: &Echo) -> Value {
    json!({
        "id": id, "object": "response", "created_at": created_at, "status": "in_progress",
        "background": false, "completed_at": null, "content_filters": null, "error": null,
        "frequency_penalty": 0.0, "incomplete_details": null, "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens, "max_tool_calls": null, "model": model,
        "moderation": null, "output": [], "parallel_tool_calls": true, "presence_penalty": 0.0,
        "previous_response_id": null, "prompt_cache_key": null, "prompt_cache_retention": null,
        "reasoning": {"effort": echo.reasoning_effort, "summary": null}, "safety_identifier": null,
        "service_tier": "default", "store": false, "temperature": f32_spelling(echo.temperature),
        "text": {"format": reported_format(&echo.text_format), "verbosity": echo.verbosity}, "tool_choice": echo.tool_choice,
        "tools": reported_tools(&echo.tools), "top_logprobs": echo.top_logprobs, "top_p": f32_spelling(echo.top_p),
        "truncation": "disabled", "usage": null, "user": echo.user, "metadata": {},
    })
}

#[derive(Debug)]
enum Item {
    Reasoning { text: String },
    /// The answer text and the log-probabilities of its tokens (when the inference reports them).
    Message { text: String, logprobs: Vec<Value> },
    FunctionCall { call_id: String, name: String, namespace: Option<String>, arguments: String },
    /// A call of a declared `custom` tool (`apply_patch`): reported with the raw `input` text.
    CustomToolCall { call_id: String, name: String, input: CustomInput },
}

/// The `input` of a custom tool call, derived from the streamed JSON arguments: when they start with
/// the string parameter `input`, its unescaped text (anything after that string is ignored); otherwise
/// the arguments JSON itself.
#[derive(Debug, Default)]
struct CustomInput {
    /// Arguments seen while they could still be the `{"input": "` opening.
    opening: String,
    /// Undecoded tail of the string (an escape cut by a fragment boundary).
    pending: String,
    state: InputState,
    text: String,
}

#[derive(Debug, Default, PartialEq)]
enum InputState {
    #[default]
    Opening,
    InString,
    AfterString,
    Raw,
}

const INPUT_OPENING: &str = "{\"input\": \"";

impl CustomInput {
    /// Feeds one arguments fragment and returns the text it adds to the input.
    fn feed(&mut self, fragment: &str) -> String {
        match self.state {
            InputState::Opening => {
                self.opening.push_str(fragment);
                if let Some(rest) = self.opening.strip_prefix(INPUT_OPENING) {
                    let rest = rest.to_owned();
                    self.state = InputState::InString;
                    self.decode(&rest)
                } else if INPUT_OPENING.starts_with(self.opening.as_str()) {
                    String::new()
                } else {
                    self.state = InputState::Raw;
                    self.text = std::mem::take(&mut self.opening);
                    self.text.clone()
                }
            }
            InputState::InString => self.decode(fragment),
            InputState::AfterString => String::new(),
            InputState::Raw => {
                self.text.push_str(fragment);
                fragment.to_owned()
            }
        }
    }

    /// Decodes JSON string content up to the closing quote, keeping a cut escape for later.
    fn decode(&mut self, fragment: &str) -> String {
        let source = std::mem::take(&mut self.pending) + fragment;
        let mut out = String::new();
        let mut rest = source.as_str();
        while let Some(c) = rest.chars().next() {
            match c {
                '"' => {
                    self.state = InputState::AfterString;
                    rest = "";
                    break;
                }
                '\\' => match decode_escape(rest) {
                    Some((ch, used)) => {
                        out.extend(ch);
                        rest = &rest[used..];
                    }
                    None => break,
                },
                _ => {
                    out.push(c);
                    rest = &rest[c.len_utf8()..];
                }
            }
        }
        self.pending = rest.to_owned();
        self.text.push_str(&out);
        out
    }

    /// Ends the input: arguments still undecided are the input as they are; returns what that adds.
    fn finish(&mut self) -> String {
        if self.state != InputState::Opening {
            return String::new();
        }
        self.state = InputState::Raw;
        self.text = std::mem::take(&mut self.opening);
        self.text.clone()
    }

    fn input(&self) -> &str {
        if self.state == InputState::Opening {
            &self.opening
        } else {
            &self.text
        }
    }
}

/// One escape at the start of `s` (which begins with a backslash): the character (none for a lone
/// surrogate) and the bytes used, or `None` while the escape is incomplete.
fn decode_escape(s: &str) -> Option<(Option<char>, usize)> {
    let b = s.as_bytes();
    let simple = match *b.get(1)? {
        b'n' => '\n',
        b't' => '\t',
        b'r' => '\r',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'u' => {
            let hex = |at: usize| s.get(at..at + 4).and_then(|h| u32::from_str_radix(h, 16).ok());
            let unit = hex(2)?;
            if (0xD800..0xDC00).contains(&unit) {
                if s.len() < 12 {
                    return None;
                }
                if &s[6..8] == "\\u" {
                    if let Some(low) = hex(8).filter(|l| (0xDC00..0xE000).contains(l)) {
                        let code = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                        return Some((char::from_u32(code), 12));
                    }
                }
                return Some((None, 6));
            }
            return Some((char::from_u32(unit), 6));
        }
        other => other as char,
    };
    Some((Some(simple), 2))
}

pub struct ResponsesGenerator {
    config: ResponsesConfig,
    id: String,
    response: Value,
    sequence: u64,
    items: Vec<Value>,
    open: Option<Item>,
}

impl ResponsesGenerator {
    pub fn new(config: ResponsesConfig, id: impl Into<String>, model: impl Into<String>) -> Self {
        let id = id.into();
        let response = response_object(&id, &model.into(), unix_now(), &config.echo);
        Self { config, id, response, sequence: 0, items: Vec::new(), open: None }
    }

    /// Emits an event; `fields` must not contain `type` or `sequence_number` (added here, in the
    /// alphabetical key order the protocol uses after `type`).
    fn event(&mut self, kind: &str, fields: Value, out: &mut Vec<ResponsesEvent>) {
        let mut sorted: Vec<(String, Value)> = match fields {
            Value::Object(map) => map.into_iter().collect(),
            _ => Vec::new(),
        };
        sorted.push(("sequence_number".to_owned(), json!(self.sequence)));
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut event = serde_json::Map::new();
        event.insert("type".to_owned(), json!(kind));
        event.extend(sorted);
        self.sequence += 1;
        out.push(ResponsesEvent(Value::Object(event)));
    }

    /// Whether `name` is a declared `custom` tool (only `apply_patch` passes conversion).
    fn is_custom_tool(&self, name: &str) -> bool {
        self.config.custom_tools.iter().any(|t| t == name)
    }

    fn output_index(&self) -> usize {
        self.items.len()
    }

    fn item_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}_{}", self.id, self.output_index())
    }

    fn item_json(&self, item: &Item, status: &str, phase: &str) -> Value {
        let n = self.output_index();
        match item {
            Item::Reasoning { text } => {
                json!({"type": "reasoning", "id": self.item_id("rs"), "status": status,
                "content": if status == "in_progress" { json!([]) } else { json!([{"type": "reasoning_text", "text": text}]) },
                "summary": [], "encrypted_content": format!("{}-{n}", self.id)})
            }
            Item::Message { text, logprobs } => json!({"type": "message", "id": self.item_id("msg"), "status": status,
                "role": "assistant", "phase": phase,
                "content": if status == "in_progress" { json!([]) } else { json!([output_text(text, logprobs)]) }}),
            Item::FunctionCall { call_id, name, namespace, arguments } => {
                let mut item = json!({"type": "function_call", "id": self.item_id("fc"), "status": status,
                    "call_id": call_id, "name": name});
                if let Some(ns) = namespace {
                    item["namespace"] = json!(ns);
                }
                item["arguments"] = json!(arguments);
                item
            }
            Item::CustomToolCall { call_id, name, input } => {
                json!({"type": "custom_tool_call", "id": self.item_id("ctc"), "status": status,
                    "call_id": call_id, "name": name, "input": input.input()})
            }
        }
    }

    fn open_item(&mut self, item: Item, out: &mut Vec<ResponsesEvent>) {
        self.close_item("completed", false, out);
        let n = self.output_index();
        let added = self.item_json(&item, "in_progress", "final_answer");
        self.event("response.output_item.added", json!({"item": added, "output_index": n}), out);
        let part = match &item {
            Item::Reasoning { .. } => Some(json!({"type": "reasoning_text", "text": ""})),
            Item::Message { .. } => Some(output_text("", &[])),
            Item::FunctionCall { .. } | Item::CustomToolCall { .. } => None,
        };
        if let Some(part) = part {
            let item_id = added["id"].clone();
            self.event(
                "response.content_part.added",
                json!({"content_index": 0, "item_id": item_id, "output_index": n, "part": part}),
                out,
            );
        }
        self.open = Some(item);
    }

    /// Closes the open item; `tools_follow` marks a message as commentary before tool calls.
    fn close_item(&mut self, status: &str, tools_follow: bool, out: &mut Vec<ResponsesEvent>) {
        let Some(mut item) = self.open.take() else { return };
        let n = self.output_index();
        if let Item::CustomToolCall { input, .. } = &mut item {
            let rest = input.finish();
            if !rest.is_empty() {
                let item_id = self.item_id("ctc");
                self.event(
                    "response.custom_tool_call_input.delta",
                    json!({"delta": rest, "item_id": item_id, "output_index": n}),
                    out,
                );
            }
        }
        let phase = if tools_follow { "commentary" } else { "final_answer" };
        let done = self.item_json(&item, status, phase);
        let item_id = done["id"].clone();
        match &item {
            Item::Reasoning { text } => {
                self.event(
                    "response.reasoning_text.done",
                    json!({"content_index": 0, "item_id": item_id, "output_index": n, "text": text}),
                    out,
                );
                self.event(
                    "response.content_part.done",
                    json!({"content_index": 0, "item_id": item_id,
                    "output_index": n, "part": {"type": "reasoning_text", "text": text}}),
                    out,
                );
            }
            Item::Message { text, logprobs } => {
                self.event(
                    "response.output_text.done",
                    json!({"content_index": 0, "item_id": item_id,
                    "logprobs": logprobs, "output_index": n, "text": text}),
                    out,
                );
                self.event(
                    "response.content_part.done",
                    json!({"content_index": 0, "item_id": item_id,
                    "output_index": n, "part": output_text(text, logprobs)}),
                    out,
                );
            }
            Item::FunctionCall { arguments, .. } => {
                self.event(
                    "response.function_call_arguments.done",
                    json!({"arguments": arguments, "item_id": item_id, "output_index": n}),
                    out,
                );
            }
            Item::CustomToolCall { input, .. } => {
                self.event(
                    "response.custom_tool_call_input.done",
                    json!({"input": input.input(), "item_id": item_id, "output_index": n}),
                    out,
                );
            }
        }
        self.event("response.output_item.done", json!({"item": done, "output_index": n}), out);
        self.items.push(done);
    }
}

fn output_text(text: &str, logprobs: &[Value]) -> Value {
    json!({"type": "output_text", "annotations": [], "logprobs": logprobs, "text": text})
}

impl Generator for ResponsesGenerator {
    type Event = ResponsesEvent;

    fn thinking_mode(&self) -> bool {
        self.config.thinking_mode
    }

    fn start(&mut self, _prompt: &PromptUsage, _fingerprint: Option<&str>, out: &mut Vec<ResponsesEvent>) {
        let response = self.response.clone();
        self.event("response.created", json!({"response": response}), out);
        self.event("response.in_progress", json!({"response": response}), out);
    }

    fn delta(&mut self, delta: Delta, out: &mut Vec<ResponsesEvent>) {
        let n = self.output_index();
        match delta {
            Delta::Reasoning(text, _) => {
                if !matches!(self.open, Some(Item::Reasoning { .. })) {
                    self.open_item(Item::Reasoning { text: String::new() }, out);
                }
                if let Some(Item::Reasoning { text: acc }) = &mut self.open {
                    acc.push_str(&text);
                }
                let item_id = self.item_id("rs");
                self.event(
                    "response.reasoning_text.delta",
                    json!({"content_index": 0, "delta": text, "item_id": item_id, "output_index": n}),
                    out,
                );
            }
            Delta::Content(text, entries) => {
                if !matches!(self.open, Some(Item::Message { .. })) {
                    self.open_item(Item::Message { text: String::new(), logprobs: Vec::new() }, out);
                }
                let n = self.output_index();
                let logprobs = super::logprob_entries_json(&entries);
                if let Some(Item::Message { text: acc, logprobs: acc_logprobs }) = &mut self.open {
                    acc.push_str(&text);
                    acc_logprobs.extend(logprobs.iter().cloned());
                }
                let item_id = self.item_id("msg");
                self.event(
                    "response.output_text.delta",
                    json!({"content_index": 0, "delta": text,
                    "item_id": item_id, "logprobs": logprobs, "output_index": n}),
                    out,
                );
            }
            Delta::ToolCallStart { id, name, .. } => {
                self.close_item("completed", true, out);
                if self.is_custom_tool(&name) {
                    let item = Item::CustomToolCall { call_id: id, name, input: CustomInput::default() };
                    self.open_item(item, out);
                    return;
                }
                let (namespace, name) = match self.config.namespace_tool_map.get(&name) {
                    Some((ns, local)) => (Some(ns.clone()), local.clone()),
                    None => (None, name),
                };
                self.open_item(
                    Item::FunctionCall { call_id: id, name, namespace, arguments: String::new() },
                    out,
                );
            }
            Delta::ToolCallArguments { fragment, .. } => {
                if let Some(Item::CustomToolCall { input, .. }) = &mut self.open {
                    let delta = input.feed(&fragment);
                    if !delta.is_empty() {
                        let item_id = self.item_id("ctc");
                        self.event(
                            "response.custom_tool_call_input.delta",
                            json!({"delta": delta, "item_id": item_id, "output_index": n}),
                            out,
                        );
                    }
                    return;
                }
                if let Some(Item::FunctionCall { arguments, .. }) = &mut self.open {
                    arguments.push_str(&fragment);
                }
                let item_id = self.item_id("fc");
                self.event(
                    "response.function_call_arguments.delta",
                    json!({"delta": fragment, "item_id": item_id, "output_index": n}),
                    out,
                );
            }
        }
    }

    fn complete(&mut self, completion: &Completion, out: &mut Vec<ResponsesEvent>) {
        let (status, incomplete) = match completion.reason {
            Some(FinishReason::Length) => ("incomplete", Some("max_output_tokens")),
            Some(FinishReason::ContentFilter) => ("incomplete", Some("content_filter")),
            _ => ("completed", None),
        };
        self.close_item(status, false, out);
        let u = &completion.usage;
        let mut response = self.response.clone();
        response["status"] = json!(status);
        response["completed_at"] = json!(unix_now());
        response["incomplete_details"] = incomplete.map_or(Value::Null, |r| json!({"reason": r}));
        response["output"] = Value::Array(self.items.clone());
        response["usage"] = json!({
            "input_tokens": u.prompt.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.prompt.prompt_cache_hit_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens.unwrap_or(0)},
            "total_tokens": u.prompt.prompt_tokens + u.completion_tokens,
        });
        let kind = if status == "completed" { "response.completed" } else { "response.incomplete" };
        self.event(kind, json!({"response": response}), out);
    }
}

/// The final response: the latest response object carried by the stream.
#[derive(Debug)]
pub struct ResponsesResponse {
    response: Value,
}

impl ResponsesResponse {
    pub fn new(id: &str, model: &str, created: u64) -> Self {
        Self { response: response_object(id, model, created, &Echo::default()) }
    }

    pub fn accumulate(&mut self, event: &ResponsesEvent) {
        if let Some(response) = event.0.get("response") {
            self.response = response.clone();
        }
    }

    pub fn to_json(&self) -> String {
        self.response.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::CustomInput;

    fn feed_all(fragments: &[&str]) -> (Vec<String>, String) {
        let mut input = CustomInput::default();
        let mut deltas: Vec<String> = fragments.iter().map(|f| input.feed(f)).collect();
        deltas.push(input.finish());
        deltas.retain(|d| !d.is_empty());
        (deltas, input.input().to_owned())
    }

    #[test]
    fn custom_input_is_the_unescaped_input_string() {
        let fragments = ["{", "\"input\"", ": ", "\"", "a\\", "nb \\ud83c", "\\udf89\\\"", "\"", "}"];
        let (deltas, input) = feed_all(&fragments);
        assert_eq!(deltas, ["a", "\nb ", "🎉\""]);
        assert_eq!(input, "a\nb 🎉\"");
    }

    #[test]
    fn custom_input_falls_back_to_the_arguments_json() {
        let expected = (vec!["{\"input\": 5".to_owned(), "}".to_owned()], "{\"input\": 5}".to_owned());
        assert_eq!(feed_all(&["{", "\"input\"", ": ", "5", "}"]), expected);
        assert_eq!(feed_all(&["{", "\"input\"", ": "]), (vec!["{\"input\": ".into()], "{\"input\": ".into()));
        assert_eq!(feed_all(&["{\"input\": \"x\"", ", \"other\": 1}"]).1, "x");
    }
}
