//! Chat Completions: `chat.completion.chunk` events and the accumulated `chat.completion` body.

use serde_json::{json, Map, Value};

use super::unix_now;
use crate::stream::processor::{Completion, Delta, Generator};
use crate::stream::{FinishReason, PromptUsage};

/// What the request decided about the chunk format.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatConfig {
    /// Thinking mode: content deltas carry `"reasoning_content": null`.
    pub thinking_mode: bool,
    /// Parsing starts in reasoning (any thinking stage but a content continuation): the first delta
    /// opens `reasoning_content`.
    pub reasoning: bool,
    /// `stream: true` without `stream_options.include_usage`: non-final chunks carry no `usage` key.
    pub omit_usage: bool,
}

/// One `chat.completion.chunk`, kept as JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatChunk(pub Value);

impl ChatChunk {
    pub fn to_json(&self) -> String {
        self.0.to_string()
    }
}

pub struct ChatGenerator {
    config: ChatConfig,
    id: String,
    model: String,
    created: u64,
    system_fingerprint: Option<String>,
}

impl ChatGenerator {
    pub fn new(config: ChatConfig, id: impl Into<String>, model: impl Into<String>) -> Self {
        Self { config, id: id.into(), model: model.into(), created: unix_now(), system_fingerprint: None }
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>, usage: Option<Value>) -> ChatChunk {
        self.chunk_with_logprobs(delta, Value::Null, finish_reason, usage)
    }

    fn chunk_with_logprobs(
        &self,
        delta: Value,
        logprobs: Value,
        finish_reason: Option<&str>,
        usage: Option<Value>,
    ) -> ChatChunk {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        });
        if usage.is_some() || !self.config.omit_usage {
            chunk["usage"] = usage.unwrap_or(Value::Null);
        }
        ChatChunk(chunk)
    }

    fn content_delta(&self, content: &str) -> Value {
        let mut delta = json!({"content": content});
        if self.config.thinking_mode {
            delta["reasoning_content"] = Value::Null;
        }
        delta
    }
}

pub fn finish_reason(completion: &Completion) -> &'static str {
    match completion.reason {
        Some(FinishReason::Length) => "length",
        Some(FinishReason::ContentFilter) => "content_filter",
        Some(FinishReason::Stop) if completion.tool_calls > 0 && completion.stop_sequence.is_none() => {
            "tool_calls"
        }
        _ => "stop",
    }
}

fn usage_json(completion: &Completion, thinking_mode: bool) -> Value {
    let u = &completion.usage;
    let mut usage = json!({
        "prompt_tokens": u.prompt.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.prompt.prompt_cache_hit_tokens},
    });
    if let Some(reasoning) = u.reasoning_tokens.filter(|_| thinking_mode) {
        usage["completion_tokens_details"] = json!({"reasoning_tokens": reasoning});
    }
    usage["prompt_cache_hit_tokens"] = json!(u.prompt.prompt_cache_hit_tokens);
    usage["prompt_cache_miss_tokens"] =
        json!(u.prompt.prompt_tokens.saturating_sub(u.prompt.prompt_cache_hit_tokens));
    usage
}

impl Generator for ChatGenerator {
    type Event = ChatChunk;

    fn thinking_mode(&self) -> bool {
        self.config.thinking_mode
    }

    fn start(&mut self, _prompt: &PromptUsage, system_fingerprint: Option<&str>, out: &mut Vec<ChatChunk>) {
        self.system_fingerprint = system_fingerprint.map(str::to_owned);
        let delta = if self.config.reasoning {
            json!({"role": "assistant", "content": null, "reasoning_content": ""})
        } else {
            let mut d = json!({"role": "assistant", "content": ""});
            if self.config.thinking_mode {
                d["reasoning_content"] = Value::Null;
            }
            d
        };
        out.push(self.chunk(delta, None, None));
    }

    fn delta(&mut self, delta: Delta, out: &mut Vec<ChatChunk>) {
        let (delta, logprobs) = match delta {
            Delta::Reasoning(text, lp) => {
                (json!({"content": null, "reasoning_content": text}), logprobs_json("reasoning_content", &lp))
            }
            Delta::Content(text, lp) => (self.content_delta(&text), logprobs_json("content", &lp)),
            other => (Self::tool_delta(other), Value::Null),
        };
        out.push(self.chunk_with_logprobs(delta, logprobs, None, None));
    }

    fn complete(&mut self, completion: &Completion, out: &mut Vec<ChatChunk>) {
        let delta = self.content_delta("");
        out.push(self.chunk(
            delta,
            Some(finish_reason(completion)),
            Some(usage_json(completion, self.config.thinking_mode)),
        ));
    }
}

impl ChatGenerator {
    fn tool_delta(delta: Delta) -> Value {
        match delta {
            Delta::ToolCallStart { index, id, name } => json!({"tool_calls": [{
                "index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}
            }]}),
            Delta::ToolCallArguments { index, fragment } => {
                json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
            }
            Delta::Reasoning(..) | Delta::Content(..) => Value::Null,
        }
    }
}

/// `{"<key>": [entries]}` in the Chat Completions layout, or null without entries.
fn logprobs_json(key: &str, entries: &[crate::stream::LogprobEntry]) -> Value {
    if entries.is_empty() {
        return Value::Null;
    }
    let mut map = Map::new();
    map.insert(key.to_owned(), Value::Array(super::logprob_entries_json(entries)));
    Value::Object(map)
}

/// Accumulates chunks into the final `chat.completion` body.
#[derive(Debug)]
pub struct ChatResponse {
    id: String,
    model: String,
    created: u64,
    message: Option<Map<String, Value>>,
    tool_calls: Vec<Value>,
    /// Accumulated log-probabilities per key (`content`, `reasoning_content`).
    logprobs: Vec<(String, Vec<Value>)>,
    finish_reason: Value,
    usage: Option<Value>,
    system_fingerprint: Value,
}

impl ChatResponse {
    pub fn new(id: impl Into<String>, model: impl Into<String>, created: u64) -> Self {
        Self {
            id: id.into(),
            model: model.into(),
            created,
            message: None,
            tool_calls: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: Value::Null,
            usage: None,
            system_fingerprint: Value::Null,
        }
    }

    pub fn accumulate(&mut self, chunk: &ChatChunk) {
        let c = &chunk.0;
        self.system_fingerprint = c["system_fingerprint"].clone();
        if let Some(usage) = c.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(usage.clone());
        }
        let choice = &c["choices"][0];
        if !choice["finish_reason"].is_null() {
            self.finish_reason = choice["finish_reason"].clone();
        }
        if let Some(lp) = choice["logprobs"].as_object() {
            for (key, entries) in lp {
                let add = entries.as_array().cloned().unwrap_or_default();
                match self.logprobs.iter_mut().find(|(k, _)| k == key) {
                    Some((_, list)) => list.extend(add),
                    None => self.logprobs.push((key.clone(), add)),
                }
            }
        }
        let delta = &choice["delta"];
        let message = self.message.get_or_insert_with(Map::new);
        for key in ["role", "content", "reasoning_content"] {
            match (delta.get(key), message.get_mut(key)) {
                (Some(Value::String(s)), Some(Value::String(acc))) => acc.push_str(s),
                (Some(Value::String(s)), _) => {
                    message.insert(key.to_owned(), Value::String(s.clone()));
                }
                (Some(Value::Null), None) if key != "reasoning_content" => {
                    message.insert(key.to_owned(), Value::Null);
                }
                _ => {}
            }
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            for call in calls {
                let index = call["index"].as_u64().unwrap_or(0) as usize;
                if call.get("id").is_some() {
                    self.tool_calls.push(call.clone());
                } else if let Some(existing) = self.tool_calls.get_mut(index) {
                    let add = call["function"]["arguments"].as_str().unwrap_or("");
                    if let Some(Value::String(args)) = existing["function"].get_mut("arguments") {
                        args.push_str(add);
                    }
                }
            }
        }
    }

    /// Content entries first, then reasoning entries; null when there are none.
    fn logprobs_json(&self) -> Value {
        if self.logprobs.is_empty() {
            return Value::Null;
        }
        let mut map = Map::new();
        for key in ["content", "reasoning_content"] {
            if let Some((_, list)) = self.logprobs.iter().find(|(k, _)| k == key) {
                map.insert(key.to_owned(), Value::Array(list.clone()));
            }
        }
        Value::Object(map)
    }

    pub fn to_json(&self) -> String {
        let mut body =
            json!({"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model});
        match &self.message {
            None => body["choices"] = json!([]),
            Some(message) => {
                let mut message = message.clone();
                if !self.tool_calls.is_empty() {
                    message.insert("tool_calls".to_owned(), Value::Array(self.tool_calls.clone()));
                }
                body["choices"] = json!([{
                    "index": 0, "message": message, "logprobs": self.logprobs_json(), "finish_reason": self.finish_reason
                }]);
                if let Some(usage) = &self.usage {
                    body["usage"] = usage.clone();
                }
            }
        }
        body["system_fingerprint"] = self.system_fingerprint.clone();
        body.to_string()
    }
}
