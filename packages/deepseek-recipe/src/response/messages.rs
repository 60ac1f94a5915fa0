//! Anthropic Messages: stream events (`message_start`, content blocks, `message_delta`, `message_stop`)
//! and the accumulated `message` body.

use serde_json::{json, Map, Value};

use crate::stream::processor::{Completion, Delta, Generator};
use crate::stream::{FinishReason, PromptUsage};

#[derive(Clone, Debug, PartialEq)]
pub struct MessagesEvent(pub Value);

impl MessagesEvent {
    pub fn to_json(&self) -> String {
        self.0.to_string()
    }

    pub fn event_type(&self) -> &str {
        self.0["type"].as_str().unwrap_or_default()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

pub struct MessagesGenerator {
    id: String,
    model: String,
    thinking_mode: bool,
    signature: Option<String>,
    prompt: PromptUsage,
    open: Option<Block>,
    next_index: usize,
    pinged: bool,
}

fn usage(prompt: &PromptUsage, output_tokens: u64) -> Value {
    json!({
        "input_tokens": prompt.prompt_tokens.saturating_sub(prompt.prompt_cache_hit_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": prompt.prompt_cache_hit_tokens,
        "output_tokens": output_tokens,
        "service_tier": "standard",
    })
}

impl MessagesGenerator {
    pub fn new(id: impl Into<String>, model: impl Into<String>, thinking_mode: bool) -> Self {
        Self {
            id: id.into(),
            model: model.into(),
            thinking_mode,
            signature: None,
            prompt: PromptUsage::default(),
            open: None,
            next_index: 0,
            pinged: false,
        }
    }

    /// The signature closing each thinking block (default: the response id).
    pub fn with_signature(mut self, signature: impl Into<String>) -> Self {
        self.signature = Some(signature.into());
        self
    }

    fn index(&self) -> usize {
        self.next_index - 1
    }

    fn close_block(&mut self, out: &mut Vec<MessagesEvent>) {
        let Some(block) = self.open.take() else { return };
        if block == Block::Thinking {
            let signature = self.signature.clone().unwrap_or_else(|| self.id.clone());
            out.push(MessagesEvent(json!({"type": "content_block_delta", "index": self.index(),
                "delta": {"type": "signature_delta", "signature": signature}})));
        }
        out.push(MessagesEvent(json!({"type": "content_block_stop", "index": self.index()})));
    }

    fn open_block(&mut self, block: Block, content_block: Value, out: &mut Vec<MessagesEvent>) {
        self.close_block(out);
        self.open = Some(block);
        self.next_index += 1;
        out.push(MessagesEvent(json!({"type": "content_block_start", "index": self.index(),
            "content_block": content_block})));
        if !self.pinged {
            self.pinged = true;
            out.push(MessagesEvent(json!({"type": "ping"})));
        }
    }

    fn block_delta(&self, delta: Value, out: &mut Vec<MessagesEvent>) {
        out.push(MessagesEvent(
            json!({"type": "content_block_delta", "index": self.index(), "delta": delta}),
        ));
    }
}

pub fn stop_reason(completion: &Completion) -> &'static str {
    match completion.reason {
        Some(FinishReason::Length) => "max_tokens",
        Some(FinishReason::ContentFilter) => "refusal",
        _ if completion.stop_sequence.is_some() => "stop_sequence",
        Some(FinishReason::Stop) if completion.tool_calls > 0 => "tool_use",
        _ => "end_turn",
    }
}

impl Generator for MessagesGenerator {
    type Event = MessagesEvent;

    fn thinking_mode(&self) -> bool {
        self.thinking_mode
    }

    fn start(&mut self, prompt: &PromptUsage, _fingerprint: Option<&str>, out: &mut Vec<MessagesEvent>) {
        self.prompt = *prompt;
        out.push(MessagesEvent(json!({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": usage(prompt, 0),
        }})));
        if self.thinking_mode {
            self.open_block(
                Block::Thinking,
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                out,
            );
        }
    }

    fn delta(&mut self, delta: Delta, out: &mut Vec<MessagesEvent>) {
        match delta {
            Delta::Reasoning(text, _) => {
                if self.open != Some(Block::Thinking) {
                    self.open_block(
                        Block::Thinking,
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        out,
                    );
                }
                self.block_delta(json!({"type": "thinking_delta", "thinking": text}), out);
            }
            Delta::Content(text, _) => {
                if self.open != Some(Block::Text) {
                    self.open_block(Block::Text, json!({"type": "text", "text": ""}), out);
                }
                self.block_delta(json!({"type": "text_delta", "text": text}), out);
            }
            Delta::ToolCallStart { id, name, .. } => {
                let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                self.open_block(Block::ToolUse, block, out);
            }
            Delta::ToolCallArguments { fragment, .. } => {
                self.block_delta(json!({"type": "input_json_delta", "partial_json": fragment}), out);
            }
        }
    }

    fn complete(&mut self, completion: &Completion, out: &mut Vec<MessagesEvent>) {
        self.close_block(out);
        out.push(MessagesEvent(json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(completion), "stop_sequence": completion.stop_sequence},
            "usage": usage(&completion.usage.prompt, completion.usage.completion_tokens)})));
        out.push(MessagesEvent(json!({"type": "message_stop"})));
    }
}

/// Accumulates events into the final `message` body.
#[derive(Debug)]
pub struct MessagesResponse {
    id: Value,
    model: Value,
    content: Vec<Value>,
    /// Raw JSON text of each tool_use block's input, parsed at the end.
    partial_json: Vec<Option<String>>,
    stop_reason: Value,
    stop_sequence: Value,
    usage: Value,
}

impl MessagesResponse {
    pub fn new(id: &str, model: &str, prompt: PromptUsage) -> Self {
        Self {
            id: json!(id),
            model: json!(model),
            content: Vec::new(),
            partial_json: Vec::new(),
            stop_reason: Value::Null,
            stop_sequence: Value::Null,
            usage: usage(&prompt, 0),
        }
    }

    pub fn accumulate(&mut self, event: &MessagesEvent) {
        let e = &event.0;
        match event.event_type() {
            "message_start" => {
                self.id = e["message"]["id"].clone();
                self.model = e["message"]["model"].clone();
                self.usage = e["message"]["usage"].clone();
            }
            "content_block_start" => {
                let block = e["content_block"].clone();
                self.partial_json.push((block["type"] == "tool_use").then(String::new));
                self.content.push(block);
            }
            "content_block_delta" => {
                let i = e["index"].as_u64().unwrap_or(0) as usize;
                let d = &e["delta"];
                let (Some(block), Some(partial)) = (self.content.get_mut(i), self.partial_json.get_mut(i))
                else {
                    return;
                };
                let append = |block: &mut Value, key: &str, add: &Value| {
                    if let (Some(Value::String(acc)), Some(s)) = (block.get_mut(key), add.as_str()) {
                        acc.push_str(s);
                    }
                };
                match d["type"].as_str().unwrap_or_default() {
                    "thinking_delta" => append(block, "thinking", &d["thinking"]),
                    "signature_delta" => append(block, "signature", &d["signature"]),
                    "text_delta" => append(block, "text", &d["text"]),
                    "input_json_delta" => {
                        if let (Some(p), Some(s)) = (partial.as_mut(), d["partial_json"].as_str()) {
                            p.push_str(s);
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                self.stop_reason = e["delta"]["stop_reason"].clone();
                self.stop_sequence = e["delta"]["stop_sequence"].clone();
                self.usage = e["usage"].clone();
            }
            _ => {}
        }
    }

    pub fn to_json(&self) -> String {
        let content: Vec<Value> = self
            .content
            .iter()
            .zip(&self.partial_json)
            .map(|(block, partial)| {
                let mut block = block.clone();
                if let Some(text) = partial {
                    let input = serde_json::from_str::<Map<String, Value>>(text).unwrap_or_default();
                    block["input"] = Value::Object(input);
                }
                block
            })
            .collect();
        json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
            "stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence, "usage": self.usage})
        .to_string()
    }
}
