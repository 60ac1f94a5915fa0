//! DeepSeek V4 / V4.1 protocol and token layer.
//!
//! Converts Chat Completions, Anthropic Messages and OpenAI Responses requests into a conversation,
//! renders it into the DeepSeek V4 / V4.1 prompt and token ids, and parses model output back into
//! reasoning, content and tool calls, producing protocol responses and stream chunks.
//! No Python here: the `deepseek-recipe-python` crate in `bindings/` builds `deepseek_recipe._native` on it.

pub mod conversation;
pub mod convert;
pub mod error;
pub mod image_source;
pub mod messages;
pub mod model_version;
pub mod options;
pub mod py_json;
pub mod images;
pub mod render;
pub mod response;
pub mod stream;
pub mod tokenizer;
pub mod tokens;
