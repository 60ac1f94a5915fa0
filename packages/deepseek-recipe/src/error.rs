//! Errors of request parsing, conversion and encoding.

use thiserror::Error;

/// A semantic request error, reported to the client as an HTTP error with an OpenAI-style body.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct ConversionError {
    pub status_code: u16,
    pub message: String,
}

impl ConversionError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self { status_code: 400, message: message.into() }
    }

    /// The JSON error body sent to the client.
    pub fn body(&self) -> String {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": "invalid_request_error",
                "param": null,
                "code": "invalid_request_error",
            }
        })
        .to_string()
    }
}

/// A request body that is not JSON or does not have the protocol's shape.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RequestParseError {
    #[error("invalid JSON request: {0}")]
    Json(String),
    #[error("invalid request body: {0}")]
    Body(String),
}

/// Prompt encoding failures.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum EncodeError {
    #[error("failed to encode conversation: special token \"{0}\" is not in the added vocabulary")]
    MissingSpecialToken(String),
    #[error("failed to encode conversation: {0}")]
    Tokenizer(String),
}
