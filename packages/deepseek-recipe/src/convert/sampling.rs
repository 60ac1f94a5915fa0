//! Sampling parameters shared by the protocols, and their validation.

use crate::error::ConversionError;

/// Requested sampling parameters, as parsed (floats arrive as f32 like the protocol types).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_tokens: Option<u32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub n: Option<u32>,
    pub seed: Option<u64>,
    pub logprobs: bool,
    pub top_logprobs: Option<u32>,
    pub stop: Vec<String>,
}

/// How a `max_tokens` above the upper bound is handled.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensPolicy {
    Reject,
    Clamp,
}

fn bad(message: String) -> ConversionError {
    ConversionError::bad_request(message)
}

const MAX_STOP_SEQUENCES: usize = 16;
const MAX_TOP_LOGPROBS: u32 = 20;

impl Sampling {
    /// Validates the parameters, clamping `max_tokens` where the protocol does.
    pub fn validate(&mut self, upper_bound: u32, policy: MaxTokensPolicy) -> Result<(), ConversionError> {
        // The order of the checks decides which error a request with several problems gets.
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(bad("Invalid temperature value, the valid range of temperature is [0, 2]".into()));
            }
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(bad("Invalid top_p value, the valid range of top_p is (0, 1.0]".into()));
            }
        }
        for (name, value) in [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)] {
            if value.is_some_and(|v| !(-2.0..=2.0).contains(&v)) {
                return Err(bad(format!(
                    "Invalid {name} value, the valid range of {name} is [-2, 2]"
                )));
            }
        }
        if self.n.is_some_and(|n| n != 1) {
            return Err(bad("Invalid n value (currently only n = 1 is supported)".into()));
        }
        if self.seed.is_some_and(|s| s >= 1 << 63) {
            return Err(bad("Invalid seed value, the valid range of seed is [0, 2^63)".into()));
        }
        if self.top_logprobs.is_some() && !self.logprobs {
            return Err(bad(
                "Invalid top_logprobs and logprobs value, logprobs must be set to true if top_logprobs is used."
                    .into(),
            ));
        }
        if self.top_logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
            return Err(bad(
                "Invalid top_logprobs value, the valid range of top_logprobs is [0, 20].".into(),
            ));
        }
        validate_stop(&self.stop)?;
        if let Some(m) = self.max_tokens {
            if m > upper_bound && policy == MaxTokensPolicy::Clamp {
                self.max_tokens = Some(upper_bound);
            } else if m == 0 || m > upper_bound {
                return Err(bad(format!(
                    "Invalid max_tokens value, the valid range of max_tokens is [1, {upper_bound}]"
                )));
            }
        }
        Ok(())
    }
}

fn validate_stop(stop: &[String]) -> Result<(), ConversionError> {
    if stop.len() > MAX_STOP_SEQUENCES {
        return Err(bad(format!("Stop string array too long: {}", stop.len())));
    }
    if let Some(i) = stop.iter().position(String::is_empty) {
        return Err(bad(format!(
            "Invalid 'stop[{i}]': empty string. Expected a string with minimum length 1, but got an empty string instead."
        )));
    }
    Ok(())
}
