//! Body shapes the protocols share: fields given as one string or a list, and OpenAI tool choices.

use serde::de::{self, DeserializeOwned, Deserializer};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::tools::RequestedToolChoice;

/// A field given as one string (passed to `one`) or a list (deserialized as `T` and passed to `many`);
/// anything else is an error saying `expected`.
pub fn string_or_list<'de, D, T, R>(
    deserializer: D,
    one: impl FnOnce(String) -> R,
    many: impl FnOnce(T) -> R,
    expected: &str,
) -> Result<R, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    match Value::deserialize(deserializer)? {
        Value::String(text) => Ok(one(text)),
        list @ Value::Array(_) => serde_json::from_value(list).map(many).map_err(de::Error::custom),
        _ => Err(de::Error::custom(expected)),
    }
}

/// An OpenAI tool choice: `none`, `auto`, `required`, or an object that `object` reads (given `None`
/// when the object is not one it accepts); anything else is an error saying `expected`.
pub fn openai_tool_choice<'de, D: Deserializer<'de>>(
    deserializer: D,
    object: impl FnOnce(Map<String, Value>) -> Result<Option<RequestedToolChoice>, D::Error>,
    expected: &str,
) -> Result<RequestedToolChoice, D::Error> {
    let choice = match Value::deserialize(deserializer)? {
        Value::String(s) if s == "none" => Some(RequestedToolChoice::None),
        Value::String(s) if s == "auto" => Some(RequestedToolChoice::Auto),
        Value::String(s) if s == "required" => Some(RequestedToolChoice::Required),
        Value::Object(map) => object(map)?,
        _ => None,
    };
    choice.ok_or_else(|| de::Error::custom(expected))
}
