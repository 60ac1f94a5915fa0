//! The DeepSeek-V4 prompt format.

use super::common::{
    has_tools_section, response_format_section, tool_calls_block, tool_calls_open, tools_section,
};
use super::{PromptBuilder, PromptFormat};
use crate::conversation::{Conversation, ReasoningEffort, ToolChoice};
use crate::messages::Message;
use crate::tokens::SpecialToken;

const FORMAT: PromptFormat = PromptFormat::V4;

const EFFORT_HIGH: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root \
cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial \
scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, \
considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

const EFFORT_MAX: &str = "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n\
You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively \
decompose the problem into its most fundamental components, trace every causal chain to its root, and \
resolve the underlying cause rather than any surface symptom.\nDo not stop reasoning until you have \
independently verified the solution from multiple angles and are certain that no assumption remains \
unchecked and no error remains undiscovered.\n\n";

/// Which kind of message opened the user turn that is still open.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OpenTurn {
    None,
    User,
    Tool,
}

pub(super) fn render(out: &mut PromptBuilder, conversation: &Conversation) {
    out.special(SpecialToken::Bos);
    if conversation.thinking_mode {
        match conversation.reasoning_effort {
            Some(ReasoningEffort::Low) => {}
            Some(ReasoningEffort::Max) => out.text(EFFORT_MAX),
            _ => out.text(EFFORT_HIGH),
        }
    }
    system_part(out, conversation);

    // Tools that cannot be called (tool_choice none) count as absent.
    let tools_declared = has_tools_section(conversation);
    let messages = tool_results_after_calls(&conversation.messages);
    // System messages live in the system part, so "last" means the last non-system message.
    let last = messages.iter().rposition(|m| !matches!(m, Message::System { .. })).unwrap_or(usize::MAX);
    let mut open = OpenTurn::None;
    // A user turn is its tool results, then its user texts: the two parts are joined by a blank line
    // once a user message joins, and empty user texts add no separator among themselves.
    let (mut turn_has_results, mut turn_has_user, mut turn_has_text) = (false, false, false);
    for (i, message) in messages.into_iter().enumerate() {
        match message {
            // All system messages were gathered into the system part.
            Message::System { .. } => {}
            Message::User { content } => {
                if open == OpenTurn::None {
                    out.special(SpecialToken::User);
                    (turn_has_results, turn_has_user, turn_has_text) = (false, false, false);
                }
                if !turn_has_user && turn_has_results {
                    out.text("\n\n");
                }
                turn_has_user = true;
                if !content.text.is_empty() {
                    if turn_has_text {
                        out.text("\n\n");
                    }
                    out.image_content(content);
                    turn_has_text = true;
                }
                open = OpenTurn::User;
            }
            Message::Tool { content, .. } => {
                if open != OpenTurn::Tool {
                    out.special(SpecialToken::User);
                    (turn_has_results, turn_has_user, turn_has_text) = (false, false, false);
                }
                if turn_has_results {
                    out.text("\n\n");
                }
                out.text("<tool_result>");
                out.image_content(content);
                out.text("</tool_result>");
                turn_has_results = true;
                open = OpenTurn::Tool;
            }
            Message::LatestReminder { content } => {
                out.special(SpecialToken::LatestReminder);
                out.text(content);
                open = OpenTurn::None;
            }
            Message::Assistant { content, reasoning_content, tool_calls, prefix } => {
                out.special(SpecialToken::Assistant);
                // A prefix message keeps its reasoning; elsewhere only tool conversations do.
                let reasoning = if tools_declared || *prefix { reasoning_content.as_deref() } else { None };
                if *prefix {
                    prefix_turn(out, conversation.thinking_mode, reasoning, content);
                    if let Some(calls) = tool_calls.as_deref().filter(|c| !c.is_empty()) {
                        tool_calls_block(out, FORMAT, calls);
                    }
                    if i == last {
                        return;
                    }
                    // V4 closes a continued message that is not the last one.
                    out.special(SpecialToken::Eos);
                    open = OpenTurn::None;
                    continue;
                }
                if let Some(rc) = reasoning {
                    out.special(SpecialToken::ThinkingStart);
                    out.text(rc);
                }
                out.special(SpecialToken::ThinkingEnd);
                out.text(content);
                if let Some(calls) = tool_calls.as_deref().filter(|c| !c.is_empty()) {
                    tool_calls_block(out, FORMAT, calls);
                }
                out.special(SpecialToken::Eos);
                open = OpenTurn::None;
            }
        }
    }
    generation_prompt(out, conversation);
}

/// V4 puts the tool results of an assistant's calls right after it, ordered by call (results naming
/// no call first): the results that follow it directly, or else the run of results that follows
/// the user, reminder or empty assistant message right after it, which then follows those results.
fn tool_results_after_calls(messages: &[Message]) -> Vec<&Message> {
    let is_tool = |j: &usize| matches!(messages[*j], Message::Tool { .. });
    let mut ordered: Vec<&Message> = Vec::with_capacity(messages.len());
    let mut moved = vec![false; messages.len()];
    for (i, message) in messages.iter().enumerate() {
        if moved[i] {
            continue;
        }
        ordered.push(message);
        let Message::Assistant { tool_calls: Some(calls), .. } = message else { continue };
        let call_position = |j: &usize| match &messages[*j] {
            Message::Tool { tool_call_id: Some(id), .. } => calls.iter().position(|c| &c.id == id).unwrap_or(0),
            _ => 0,
        };
        let start = match messages.get(i + 1) {
            Some(Message::Tool { .. }) => i + 1,
            Some(Message::User { .. } | Message::LatestReminder { .. }) => i + 2,
            // An empty assistant turn in between is passed over too.
            Some(Message::Assistant { content, tool_calls, .. })
                if content.is_empty() && tool_calls.as_ref().is_none_or(Vec::is_empty) =>
            {
                i + 2
            }
            _ => continue,
        };
        let mut run: Vec<usize> = (start..messages.len()).take_while(is_tool).collect();
        run.sort_by_key(call_position);
        for j in run {
            moved[j] = true;
            ordered.push(&messages[j]);
        }
    }
    ordered
}

fn system_part(out: &mut PromptBuilder, conversation: &Conversation) {
    let mut first = true;
    for message in &conversation.messages {
        if let Message::System { content, .. } = message {
            if content.text.is_empty() {
                continue;
            }
            if !first {
                out.text("\n\n");
            }
            out.image_content(content);
            first = false;
        }
    }
    tools_section(out, FORMAT, conversation);
    response_format_section(out, FORMAT, &conversation.response_format);
}

/// A continued final assistant message: no EOS, no new generation prompt.
fn prefix_turn(out: &mut PromptBuilder, thinking_mode: bool, reasoning: Option<&str>, content: &str) {
    if thinking_mode && reasoning.is_none() && content.is_empty() {
        return;
    }
    match reasoning {
        Some(rc) if thinking_mode && content.is_empty() => {
            out.special(SpecialToken::ThinkingStart);
            out.text(rc);
            return;
        }
        Some(rc) => {
            out.special(SpecialToken::ThinkingStart);
            out.text(rc);
        }
        None => {}
    }
    out.special(SpecialToken::ThinkingEnd);
    out.text(content);
}

pub(super) fn thinking_tag(thinking_mode: bool) -> SpecialToken {
    if thinking_mode {
        SpecialToken::ThinkingStart
    } else {
        SpecialToken::ThinkingEnd
    }
}

fn generation_prompt(out: &mut PromptBuilder, conversation: &Conversation) {
    out.special(SpecialToken::Assistant);
    out.special(thinking_tag(conversation.thinking_mode));
    if conversation.tool_choice == ToolChoice::Required && has_tools_section(conversation) {
        tool_calls_open(out, FORMAT);
    }
}
