//! The DeepSeek-V4.1 prompt format.

use super::common::{
    has_response_format_section, has_tools_section, response_format_section, tool_calls_block,
    tool_calls_open, tool_schema_lines, tools_section,
};
use super::v4::thinking_tag;
use super::{PromptBuilder, PromptFormat};
use crate::conversation::{Conversation, ReasoningEffort, ToolChoice};
use crate::messages::{ImageContent, Message, ToolDefinition};
use crate::tokens::SpecialToken;

const FORMAT: PromptFormat = PromptFormat::V41;

fn effort_line(effort: Option<ReasoningEffort>) -> String {
    let level = match effort {
        Some(ReasoningEffort::Low) => 50,
        Some(ReasoningEffort::Max) => 100,
        _ => 75,
    };
    format!(
        "Reasoning Effort: {level} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
    )
}

pub(super) fn render(out: &mut PromptBuilder, conversation: &Conversation) {
    out.special(SpecialToken::Bos);
    let messages = &conversation.messages;
    let mut rest = &messages[..];
    let system_block_has_content;
    {
        let leading_system = match messages.first() {
            Some(Message::System { content, tools }) => {
                rest = &messages[1..];
                Some((content, tools))
            }
            _ => None,
        };
        let needed = (conversation.thinking_mode && !messages.is_empty())
            || leading_system.is_some()
            || has_tools_section(conversation)
            || has_response_format_section(&conversation.response_format);
        system_block_has_content = needed
            && (leading_system.is_some()
                || has_tools_section(conversation)
                || has_response_format_section(&conversation.response_format));
        if needed {
            out.special(SpecialToken::System);
            if conversation.thinking_mode {
                out.text(&effort_line(conversation.reasoning_effort));
            }
            if let Some((content, _)) = leading_system {
                out.image_content(content);
            }
            tools_section(out, FORMAT, conversation);
            response_format_section(out, FORMAT, &conversation.response_format);
            if let Some((_, tools)) = leading_system {
                updated_tool_schemas(out, tools.as_deref());
            }
        }
    }

    // Tools that cannot be called (tool_choice none) count as absent.
    let tools_declared = has_tools_section(conversation);
    let mut user_turn_open = false;
    let mut after_reminder = false;
    for (i, message) in rest.iter().enumerate() {
        let is_last = i + 1 == rest.len();
        let was_after_reminder = std::mem::replace(&mut after_reminder, false);
        match message {
            Message::System { content, tools } => {
                out.special(SpecialToken::System);
                out.image_content(content);
                updated_tool_schemas(out, tools.as_deref());
                user_turn_open = false;
            }
            Message::User { content } => {
                user_side(out, &mut user_turn_open, content, false);
            }
            Message::Tool { content, .. } => {
                user_side(out, &mut user_turn_open, content, true);
            }
            Message::LatestReminder { content } => {
                // Only the first of consecutive reminders is rendered.
                if !was_after_reminder {
                    out.special(SpecialToken::LatestReminder);
                    out.text(content);
                }
                after_reminder = true;
                user_turn_open = false;
            }
            Message::Assistant { content, reasoning_content, tool_calls, prefix } => {
                out.special(SpecialToken::Assistant);
                user_turn_open = false;
                // V4.1 continues a prefix message wherever it is: no EOS after it.
                if *prefix {
                    // A continued message that opens the prompt (nothing but the effort line before
                    // it) has no reasoning.
                    let thinking = conversation.thinking_mode && (i > 0 || system_block_has_content);
                    let has_calls = tool_calls.as_ref().is_some_and(|c| !c.is_empty());
                    prefix_turn(out, thinking, reasoning_content.as_deref(), content, has_calls);
                    if let Some(calls) = tool_calls.as_deref().filter(|c| !c.is_empty()) {
                        tool_calls_block(out, FORMAT, calls);
                    }
                    if is_last {
                        return;
                    }
                    continue;
                }
                if conversation.thinking_mode && tools_declared {
                    out.special(SpecialToken::ThinkingStart);
                    out.text(reasoning_content.as_deref().unwrap_or(""));
                }
                out.special(SpecialToken::ThinkingEnd);
                out.text(content);
                if let Some(calls) = tool_calls.as_deref().filter(|c| !c.is_empty()) {
                    tool_calls_block(out, FORMAT, calls);
                }
                out.special(SpecialToken::Eos);
            }
        }
    }
    out.special(SpecialToken::Assistant);
    out.special(thinking_tag(conversation.thinking_mode));
    if conversation.tool_choice == ToolChoice::Required && has_tools_section(conversation) {
        tool_calls_open(out, FORMAT);
    }
}

/// User messages and tool results share one user turn until something else intervenes.
fn user_side(out: &mut PromptBuilder, turn_open: &mut bool, content: &ImageContent, is_tool: bool) {
    if *turn_open {
        out.text("\n\n");
    } else {
        out.special(SpecialToken::User);
    }
    if is_tool {
        out.text("<tool_result>");
        out.image_content(content);
        out.text("</tool_result>");
    } else {
        out.image_content(content);
    }
    *turn_open = true;
}

fn updated_tool_schemas(out: &mut PromptBuilder, tools: Option<&[ToolDefinition]>) {
    if let Some(tools) = tools.filter(|t| !t.is_empty()) {
        out.text("\n\n### Updated Tool Schemas\n\n");
        out.text(&tool_schema_lines(FORMAT, tools.iter()));
    }
}

/// A continued final assistant message; V4.1 drops its reasoning outside thinking mode.
fn prefix_turn(
    out: &mut PromptBuilder,
    thinking_mode: bool,
    reasoning: Option<&str>,
    content: &str,
    has_calls: bool,
) {
    if thinking_mode {
        out.special(SpecialToken::ThinkingStart);
        out.text(reasoning.unwrap_or(""));
        // Reasoning stays open only when nothing follows it.
        if content.is_empty() && !has_calls {
            return;
        }
    }
    out.special(SpecialToken::ThinkingEnd);
    out.text(content);
}
