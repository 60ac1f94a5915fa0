//! DeepSeek V4 / V4.1 protocol and token layer.
//!
//! Converts Chat Completions, Anthropic Messages and OpenAI Responses requests into a conversation,
//! renders it into the DeepSeek V4 / V4.1 prompt and token ids, and parses model output back into
//! reasoning, content and tool calls, producing protocol responses and stream chunks.
//! The `python` feature adds the PyO3 bindings exposed as `deepseek_recipe._native`.

#[cfg(feature = "python")]
mod python;
