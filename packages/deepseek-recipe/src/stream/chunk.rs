//! Backend updates fed to the stream processor.

/// Why the backend stopped generating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ContentFilter,
}

/// Prompt-side token counts reported by the backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptUsage {
    pub prompt_tokens: u64,
    pub prompt_cache_hit_tokens: u64,
}

/// The log-probability of one sampled token and the top alternatives `(token id, logprob)`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f64,
    pub top: Vec<(u32, f64)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum InferenceChunk {
    /// The prompt is processed; only the stream's first chunk decides the usage and fingerprint.
    Ready { prompt_usage: PromptUsage, system_fingerprint: Option<String> },
    Text { content: String, token_count: u64 },
    Tokens { token_ids: Vec<u32>, logprobs: Option<Vec<TokenLogprob>> },
    Finish(FinishReason),
}
