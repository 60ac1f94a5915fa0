//! Options of conversion and of output parsing.

use std::collections::BTreeMap;

use crate::model_version::ModelVersion;
use crate::tokens::SpecialTokens;

/// Where the stream parser starts in thinking mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinkingInitialStage {
    /// A new assistant turn: leading newlines of the reasoning are dropped.
    ReasoningStart,
    /// A prefix continuation whose reasoning is still open.
    ReasoningContinuation,
    /// A prefix continuation whose reasoning has ended.
    ContentContinuation,
}

impl ThinkingInitialStage {
    pub fn starts_in_reasoning(self) -> bool {
        !matches!(self, Self::ContentContinuation)
    }
}

/// Settings of the stream parser; conversion derives them from the request.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsingOptions {
    pub parse_tool_calls: bool,
    /// The prompt already opened the tool-call block (required tool choice).
    pub starts_in_tool_calls: bool,
    pub parse_json_output: bool,
    /// `None` means thinking mode is off.
    pub thinking_initial_stage: Option<ThinkingInitialStage>,
    pub stop_sequences: Vec<String>,
    pub special_tokens: SpecialTokens,
}

impl Default for ParsingOptions {
    fn default() -> Self {
        Self {
            parse_tool_calls: true,
            starts_in_tool_calls: false,
            parse_json_output: false,
            thinking_initial_stage: None,
            stop_sequences: Vec::new(),
            special_tokens: SpecialTokens::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebSearchBehavior {
    Drop,
    Reject,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningContentBehavior {
    FillEmpty,
    Reject,
}

pub const DEFAULT_MAX_TOKENS_UPPER_BOUND: u32 = 393216;

#[derive(Clone, Debug, PartialEq)]
pub struct ConversionOptions {
    pub default_thinking_mode: bool,
    pub reasoning_content_behavior: ReasoningContentBehavior,
    pub responses_web_search: WebSearchBehavior,
    pub messages_web_search: WebSearchBehavior,
    pub thinking_max_tokens_upper_bound: u32,
    pub non_thinking_max_tokens_upper_bound: u32,
    /// Accepted request model names; sorted so error messages list them in order.
    pub model_versions_by_name: BTreeMap<String, ModelVersion>,
    pub special_tokens: SpecialTokens,
}

impl Default for ConversionOptions {
    fn default() -> Self {
        Self {
            default_thinking_mode: true,
            reasoning_content_behavior: ReasoningContentBehavior::FillEmpty,
            responses_web_search: WebSearchBehavior::Drop,
            messages_web_search: WebSearchBehavior::Reject,
            thinking_max_tokens_upper_bound: DEFAULT_MAX_TOKENS_UPPER_BOUND,
            non_thinking_max_tokens_upper_bound: DEFAULT_MAX_TOKENS_UPPER_BOUND,
            model_versions_by_name: BTreeMap::from([
                ("DeepSeek-V4-Pro".to_owned(), ModelVersion::DeepseekV4Pro),
                ("DeepSeek-V4.1-Flash".to_owned(), ModelVersion::DeepseekV41Flash),
            ]),
            special_tokens: SpecialTokens::default(),
        }
    }
}

impl ConversionOptions {
    pub fn max_tokens_upper_bound(&self, thinking_mode: bool) -> u32 {
        if thinking_mode {
            self.thinking_max_tokens_upper_bound
        } else {
            self.non_thinking_max_tokens_upper_bound
        }
    }
}
