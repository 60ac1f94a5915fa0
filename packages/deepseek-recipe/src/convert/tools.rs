//! Tool declarations: name and schema validation, strict-schema normalisation, tool choice and
//! the tool-call output constraint.

use serde_json::{json, Map, Value};

use crate::conversation::{OutputConstraint, ToolChoice};
use crate::error::ConversionError;
use crate::messages::ToolDefinition;

type Result<T> = std::result::Result<T, ConversionError>;

/// A requested tool choice before it is checked against the declared tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestedToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

/// Validates and normalises declared tools. `field` is the protocol's path of a tool name, with
/// `{}` standing for the tool index (e.g. `tools[{}].function.name`).
pub fn validate_tools(tools: Vec<ToolDefinition>, field: &str) -> Result<Vec<ToolDefinition>> {
    validate_names(tools.iter().map(|t| t.name.as_str()), field)?;
    validate_definitions(tools)
}

/// Checks tool names against the allowed pattern; `field` as for [`validate_tools`].
pub fn validate_names<'a>(names: impl Iterator<Item = &'a str>, field: &str) -> Result<()> {
    for (i, name) in names.enumerate() {
        validate_name(name, &field.replace("{}", &i.to_string()))?;
    }
    Ok(())
}

/// Uniqueness, parameter schemas and strict normalisation of already name-checked tools.
pub fn validate_definitions(tools: Vec<ToolDefinition>) -> Result<Vec<ToolDefinition>> {
    let mut seen = std::collections::HashSet::new();
    if !tools.iter().all(|t| seen.insert(t.name.as_str())) {
        return Err(ConversionError::bad_request("Tool names must be unique."));
    }
    let tools = tools
        .into_iter()
        .map(|mut tool| {
            tool.parameters = checked_parameters(&tool.name, tool.parameters)?;
            if tool.strict == Some(true) {
                normalise_strict(&mut tool.parameters)?;
            }
            Ok(tool)
        })
        .collect::<Result<Vec<_>>>()?;
    let strict = tools.iter().filter(|t| t.strict == Some(true)).count();
    if strict > 0 && strict < tools.len() {
        return Err(ConversionError::bad_request(
            "Cannot use strict tool with non-strict tool in the same request",
        ));
    }
    Ok(tools)
}

fn validate_name(name: &str, field: &str) -> Result<()> {
    if name.is_empty() {
        return Err(ConversionError::bad_request(format!(
            "Invalid '{field}': empty string. Expected a string with minimum length 1, but got an empty string instead."
        )));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(ConversionError::bad_request(format!(
            "Invalid '{field}': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
        )));
    }
    Ok(())
}

/// Parameters must be an object schema; a missing schema is kept as `{}`.
fn checked_parameters(name: &str, parameters: Value) -> Result<Value> {
    let invalid = |detail: String| {
        ConversionError::bad_request(format!("Invalid schema for function '{name}': {detail}"))
    };
    let schema_type = match &parameters {
        Value::Null => return Ok(Value::Object(Map::new())),
        Value::Object(map) => map.get("type").cloned().unwrap_or(Value::Null),
        Value::Bool(_) => Value::Null,
        other => return Err(invalid(format!("{other} is not of types \"boolean\", \"object\""))),
    };
    if schema_type != json!("object") {
        return Err(invalid(format!(
            "schema must be a JSON Schema of 'type: \"object\"', got 'type: {schema_type}'."
        )));
    }
    Ok(parameters)
}

/// Strict schemas: every object schema closes (`additionalProperties: false`) and requires all of
/// its properties.
fn normalise_strict(schema: &mut Value) -> Result<()> {
    let Value::Object(map) = schema else { return Ok(()) };
    if !["type", "anyOf", "$ref"].iter().any(|k| map.contains_key(*k)) {
        return Err(ConversionError::bad_request(
            "Invalid tool parameters schema : one of `type`, `anyOf`, `$ref` field is required",
        ));
    }
    map.remove("$defs");
    if let Some(Value::Array(variants)) = map.get_mut("anyOf") {
        for variant in variants {
            normalise_strict(variant)?;
        }
    }
    if let Some(items) = map.get_mut("items") {
        normalise_strict(items)?;
    }
    if map.get("type") != Some(&json!("object")) {
        return Ok(());
    }
    let properties = match map.entry("properties").or_insert_with(|| Value::Object(Map::new())) {
        Value::Object(properties) => properties,
        _ => return Ok(()),
    };
    let names: Vec<Value> = properties.keys().map(|k| Value::String(k.clone())).collect();
    for property in properties.values_mut() {
        normalise_strict(property)?;
    }
    if let Some(Value::Array(required)) = map.get("required") {
        let mut given: Vec<&Value> = required.iter().collect();
        let mut all: Vec<&Value> = names.iter().collect();
        given.sort_by_key(|v| v.to_string());
        all.sort_by_key(|v| v.to_string());
        if given != all {
            return Err(ConversionError::bad_request(
                "Required properties must match all properties in the object",
            ));
        }
    }
    // Both keys move to the end, in this order, whether or not they were given.
    map.remove("additionalProperties");
    map.remove("required");
    map.insert("additionalProperties".into(), Value::Bool(false));
    map.insert("required".into(), Value::Array(names));
    Ok(())
}

/// Checks a tool choice against the declared tools without applying it.
pub fn check_tool_choice(
    tools: &[ToolDefinition],
    choice: &RequestedToolChoice,
    thinking_mode: bool,
) -> Result<()> {
    if tools.is_empty() {
        return Ok(());
    }
    // A named function that is not declared is reported before the thinking-mode restriction.
    if let RequestedToolChoice::Named(name) = choice {
        if !tools.iter().any(|t| &t.name == name) {
            return Err(ConversionError::bad_request(format!(
                "Invalid value for 'tool_call': no function named '{name}' was specified in the 'tools' parameter."
            )));
        }
    }
    let forced = matches!(choice, RequestedToolChoice::Required | RequestedToolChoice::Named(_));
    if forced && thinking_mode {
        return Err(ConversionError::bad_request("Thinking mode does not support this tool_choice"));
    }
    Ok(())
}

/// Applies the tool choice: returns the remaining tools and the conversation's choice.
/// Without tools a forcing choice is moot and becomes `auto`.
pub fn apply_tool_choice(
    tools: Vec<ToolDefinition>,
    choice: RequestedToolChoice,
    thinking_mode: bool,
) -> Result<(Vec<ToolDefinition>, ToolChoice)> {
    if tools.is_empty() {
        // Nothing to force; an explicit `none` is kept.
        let choice = if choice == RequestedToolChoice::None { ToolChoice::None } else { ToolChoice::Auto };
        return Ok((tools, choice));
    }
    check_tool_choice(&tools, &choice, thinking_mode)?;
    Ok(match choice {
        RequestedToolChoice::Auto => (tools, ToolChoice::Auto),
        RequestedToolChoice::None => (Vec::new(), ToolChoice::None),
        RequestedToolChoice::Required => (tools, ToolChoice::Required),
        RequestedToolChoice::Named(name) => {
            (tools.into_iter().filter(|t| t.name == name).collect(), ToolChoice::Required)
        }
    })
}

/// The constraint describing the allowed tool calls, as Chat Completions function tools.
pub fn tool_call_constraint(tools: &[ToolDefinition], choice: ToolChoice) -> Option<OutputConstraint> {
    if tools.is_empty() {
        return None;
    }
    let listed: Vec<Value> = tools
        .iter()
        .map(|t| {
            let mut function = json!({
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": t.strict,
            });
            if t.defer_loading {
                function["defer_loading"] = Value::Bool(true);
            }
            json!({"type": "function", "function": function})
        })
        .collect();
    let kind = if choice == ToolChoice::Required { "tool_call_required" } else { "tool_call" };
    Some(OutputConstraint { kind: kind.to_owned(), schema: Value::Array(listed).to_string() })
}

/// A response schema must be a JSON Schema (object or boolean); a strict one is normalised for the
/// constraint only and may not contain property-less objects.
pub fn normalised_response_schema(schema: &Value, strict: bool) -> Result<Value> {
    if !matches!(schema, Value::Object(_) | Value::Bool(_)) {
        return Err(ConversionError::bad_request(format!(
            "Invalid json schema: {schema} is not of types \"boolean\", \"object\""
        )));
    }
    let mut schema = schema.clone();
    if strict {
        reject_empty_objects(&schema)?;
        normalise_strict(&mut schema)?;
    }
    Ok(schema)
}

fn reject_empty_objects(schema: &Value) -> Result<()> {
    let Value::Object(map) = schema else { return Ok(()) };
    let properties = map.get("properties").and_then(Value::as_object);
    if map.get("type") == Some(&json!("object")) && properties.is_none_or(Map::is_empty) {
        return Err(ConversionError::bad_request("An object with no properties is not allowed."));
    }
    let nested = properties.into_iter().flat_map(|p| p.values());
    let items = map.get("items").into_iter();
    let variants = map.get("anyOf").and_then(Value::as_array).into_iter().flatten();
    nested.chain(items).chain(variants).try_for_each(reject_empty_objects)
}
