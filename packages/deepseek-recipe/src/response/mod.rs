//! Protocol output: chunk generators (stream events) and final-response accumulators for
//! Chat Completions, Anthropic Messages and OpenAI Responses.

pub mod chat;
pub mod messages;
pub mod responses;

/// Seconds since the Unix epoch (event timestamps).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
