//! Protocol output: chunk generators (stream events) and final-response accumulators for
//! Chat Completions, Anthropic Messages and OpenAI Responses.

pub mod chat;
pub mod messages;
pub mod responses;

/// Seconds since the Unix epoch (event timestamps).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Token log-probabilities in the OpenAI layout shared by Chat Completions and Responses:
/// `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}` per token.
pub fn logprob_entries_json(entries: &[crate::stream::LogprobEntry]) -> Vec<serde_json::Value> {
    entries
        .iter()
        .map(|e| {
            let top: Vec<serde_json::Value> = e
                .top
                .iter()
                .map(|(token, bytes, logprob)| serde_json::json!({"token": token, "logprob": logprob, "bytes": bytes}))
                .collect();
            serde_json::json!({"token": e.token, "logprob": e.logprob, "bytes": e.bytes, "top_logprobs": top})
        })
        .collect()
}
