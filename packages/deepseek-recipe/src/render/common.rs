//! Pieces shared by both prompt formats: tool sections, DSML tool-call blocks, response formats.

use serde_json::Value;

use super::{PromptBuilder, PromptFormat};
use crate::conversation::{Conversation, ResponseFormat, ToolChoice};
use crate::messages::{ToolCall, ToolDefinition};
use crate::py_json::{self, FloatStyle};
use crate::tokens::SpecialToken;

/// The words following the DSML token in each tag; V4.1 inserts a space and renames the block.
struct DsmlWords {
    calls: &'static str,
    invoke: &'static str,
    parameter: &'static str,
}

fn dsml_words(format: PromptFormat) -> DsmlWords {
    match format {
        PromptFormat::V4 => DsmlWords { calls: "tool_calls", invoke: "invoke", parameter: "parameter" },
        PromptFormat::V41 => DsmlWords { calls: " calls", invoke: " invoke", parameter: " parameter" },
    }
}

/// Tools section text. Markers: `⟦D⟧` DSML token, `⟦T⟧` / `⟦/T⟧` think tags, `⟦C⟧` / `⟦I⟧` / `⟦P⟧`
/// the calls / invoke / parameter words of the format.
const TOOLS_HEADER: &str = "\n\n## Tools\n\nYou have access to a set of tools to help answer the user's question. \
You can invoke tools by writing a \"<⟦D⟧⟦C⟧>\" block like the following:\n\n<⟦D⟧⟦C⟧>\n\
<⟦D⟧⟦I⟧ name=\"$TOOL_NAME\">\n<⟦D⟧⟦P⟧ name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</⟦D⟧⟦P⟧>\n\
...\n</⟦D⟧⟦I⟧>\n<⟦D⟧⟦I⟧ name=\"$TOOL_NAME2\">\n...\n</⟦D⟧⟦I⟧>\n</⟦D⟧⟦C⟧>\n\n\
String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, \
booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n\
If thinking_mode is enabled (triggered by ⟦T⟧), you MUST output your complete reasoning inside \
⟦T⟧...⟦/T⟧ BEFORE any tool calls or final response.\n\n\
Otherwise, output directly after ⟦/T⟧ with tool calls or final response.\n\n### Available Tool Schemas\n\n";

const TOOLS_FOOTER: &str =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

fn emit_template(out: &mut PromptBuilder, format: PromptFormat, template: &str) {
    let words = dsml_words(format);
    let mut rest = template;
    while let Some(open) = rest.find('⟦') {
        out.text(&rest[..open]);
        let close = rest[open..].find('⟧').expect("template markers are closed") + open;
        match &rest[open + '⟦'.len_utf8()..close] {
            "D" => out.special(SpecialToken::Dsml),
            "T" => out.special(SpecialToken::ThinkingStart),
            "/T" => out.special(SpecialToken::ThinkingEnd),
            "C" => out.text(words.calls),
            "I" => out.text(words.invoke),
            "P" => out.text(words.parameter),
            other => unreachable!("unknown template marker {other}"),
        }
        rest = &rest[close + '⟧'.len_utf8()..];
    }
    out.text(rest);
}

/// One schema line per tool, as the model was trained to read them.
pub(crate) fn float_style(format: PromptFormat) -> FloatStyle {
    match format {
        PromptFormat::V4 => FloatStyle::Serde,
        PromptFormat::V41 => FloatStyle::Python,
    }
}

pub(crate) fn tool_schema_lines<'a>(
    format: PromptFormat,
    tools: impl Iterator<Item = &'a ToolDefinition>,
) -> String {
    tools
        .map(|tool| {
            let mut line = serde_json::Map::new();
            line.insert("name".into(), Value::String(tool.name.clone()));
            line.insert(
                "description".into(),
                Value::String(tool.description.clone().unwrap_or_default()),
            );
            line.insert("parameters".into(), tool.parameters.clone());
            py_json::dumps(&Value::Object(line), float_style(format))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The tools section: present when the conversation has tools and may call them; deferred tools
/// are not listed.
pub(crate) fn tools_section(out: &mut PromptBuilder, format: PromptFormat, conversation: &Conversation) {
    if !has_tools_section(conversation) {
        return;
    }
    emit_template(out, format, TOOLS_HEADER);
    let lines = tool_schema_lines(format, conversation.tools.iter().filter(|t| !t.defer_loading));
    if lines.is_empty() && format == PromptFormat::V4 {
        // V4 writes each schema line after a newline, so an empty list leaves one newline fewer.
        out.text(&TOOLS_FOOTER[1..]);
    } else {
        out.text(&lines);
        out.text(TOOLS_FOOTER);
    }
}

pub(crate) fn has_tools_section(conversation: &Conversation) -> bool {
    !conversation.tools.is_empty() && conversation.tool_choice != ToolChoice::None
}

const RESPONSE_SCHEMA_INTRO: &str =
    "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

pub(crate) fn response_format_section(out: &mut PromptBuilder, format: PromptFormat, response: &ResponseFormat) {
    match (response, format) {
        (ResponseFormat::JsonObject, PromptFormat::V4) => out.text(
            "\n\nYou are a helpful assistant designed to output JSON.\n## Response Format:\n\nReply with JSON object ONLY.",
        ),
        (ResponseFormat::JsonObject, PromptFormat::V41) => {
            out.text(RESPONSE_SCHEMA_INTRO);
            out.text("{\"type\": \"json_object\"}");
        }
        (ResponseFormat::JsonSchema(schema), _) => {
            out.text(RESPONSE_SCHEMA_INTRO);
            out.text(&py_json::dumps(schema, float_style(format)));
        }
        (ResponseFormat::Text | ResponseFormat::Regex(_), _) => {}
    }
}

pub(crate) fn has_response_format_section(response: &ResponseFormat) -> bool {
    matches!(response, ResponseFormat::JsonObject | ResponseFormat::JsonSchema(_))
}

fn dsml_open(out: &mut PromptBuilder, word: &str) {
    out.text("<");
    out.special(SpecialToken::Dsml);
    out.text(word);
}

fn dsml_close(out: &mut PromptBuilder, word: &str) {
    out.text("</");
    out.special(SpecialToken::Dsml);
    out.text(word);
    out.text(">");
}

/// Opens the tool-call block: `'\n\n<DSML calls>\n'`.
pub(crate) fn tool_calls_open(out: &mut PromptBuilder, format: PromptFormat) {
    out.text("\n\n");
    dsml_open(out, dsml_words(format).calls);
    out.text(">\n");
}

/// The parameters of one call: object keys in order, strings raw, other values as JSON; anything
/// that is not a JSON object becomes a single raw `arguments` string parameter.
fn call_parameters(format: PromptFormat, arguments: &str) -> Vec<(String, bool, String)> {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => map
            .into_iter()
            .map(|(key, value)| match value {
                Value::String(s) => (key, true, s),
                other => (key, false, py_json::dumps(&other, float_style(format))),
            })
            .collect(),
        _ => vec![("arguments".to_owned(), true, arguments.to_owned())],
    }
}

/// A complete tool-call block of a history assistant turn.
pub(crate) fn tool_calls_block(out: &mut PromptBuilder, format: PromptFormat, calls: &[ToolCall]) {
    let words = dsml_words(format);
    tool_calls_open(out, format);
    for call in calls {
        dsml_open(out, words.invoke);
        out.text(&format!(" name=\"{}\">\n", call.name));
        let parameters = call_parameters(format, &call.arguments);
        for (i, (name, is_string, value)) in parameters.iter().enumerate() {
            if format == PromptFormat::V41 && i > 0 {
                out.text("\n");
            }
            dsml_open(out, words.parameter);
            out.text(&format!(" name=\"{name}\" string=\"{is_string}\">{value}"));
            dsml_close(out, words.parameter);
            if format == PromptFormat::V4 {
                out.text("\n");
            }
        }
        if format == PromptFormat::V41 {
            out.text("\n");
        }
        dsml_close(out, words.invoke);
        out.text("\n");
    }
    dsml_close(out, words.calls);
}
