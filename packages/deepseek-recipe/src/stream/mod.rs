//! Output parsing: streamed model output (token ids or text) -> reasoning, content and tool calls.
//!
//! `processor::StreamProcessor` drives the pipeline: `decode` turns token ids into text pieces,
//! `parser` splits each piece into reasoning / content / tool-call output (with `dsml` for the tool-call
//! block and `json_output` for JSON mode), `fragments` groups that output into protocol deltas, and a
//! `crate::response` generator turns the deltas into protocol events.

pub mod chunk;
pub mod decode;
pub mod dsml;
pub mod fragments;
pub mod json_output;
pub mod parser;
pub mod processor;

pub use chunk::{FinishReason, InferenceChunk, PromptUsage, TokenLogprob};
pub use processor::{Completion, Delta, LogprobEntry, StreamError, StreamProcessor, Usage};
