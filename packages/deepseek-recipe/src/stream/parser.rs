//! The character-level output parser: reasoning, content, tool-call blocks, stop sequences.
//!
//! Characters that cannot be classified yet stay undecided: a partial tag or stop sequence, and
//! trailing newlines, which are dropped when a section ends (`</think>`, a tool-call block) but kept
//! otherwise.

use super::dsml::{DsmlParser, DsmlTags};
use super::fragments::{Channel, Class, Fragments};
use super::json_output::JsonOutput;
use crate::options::ParsingOptions;
use crate::tokens::SpecialToken;

#[derive(Debug)]
enum Mode {
    Reasoning,
    Content,
    Tools(Box<DsmlParser>),
}

/// What a completed tag does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tag {
    ThinkEnd,
    /// Opens a tool-call block.
    Dsml,
    Stop(usize),
}

/// How the parser ended early.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Halt {
    /// A stop sequence matched (its index in the options).
    Stop(usize),
}

#[derive(Debug)]
pub struct Parser {
    mode: Mode,
    think_end: String,
    dsml: DsmlTags,
    stops: Vec<String>,
    parse_tool_calls: bool,
    json: Option<JsonOutput>,
    /// Drop newlines until the first other character of the section.
    at_section_start: bool,
    /// Pieces of held trailing newlines.
    newlines: Vec<u64>,
    /// A possible tag or stop sequence in progress.
    tag: Vec<(char, u64)>,
    reasoning_text: String,
    halted: Option<Halt>,
    /// With token input, `</think>` counts only as its own special token, never as spelled text.
    token_level_think_end: bool,
    /// Token input whose tokenizer has no token for the DSML spelling: no tool-call block can open.
    dsml_blocked: bool,
}

impl Parser {
    pub fn new(options: &ParsingOptions) -> Self {
        let tokens = &options.special_tokens;
        let dsml = DsmlTags::new(tokens.token(SpecialToken::Dsml));
        let starts_in_reasoning = options.thinking_initial_stage.is_some_and(|s| s.starts_in_reasoning());
        let mode = if options.starts_in_tool_calls {
            Mode::Tools(Box::new(DsmlParser::new(dsml.clone())))
        } else if starts_in_reasoning {
            Mode::Reasoning
        } else {
            Mode::Content
        };
        use crate::options::ThinkingInitialStage as S;
        let at_section_start = matches!(options.thinking_initial_stage, None | Some(S::ReasoningStart));
        Self {
            mode,
            think_end: tokens.token(SpecialToken::ThinkingEnd).to_owned(),
            dsml,
            stops: options.stop_sequences.iter().filter(|s| !s.is_empty()).cloned().collect(),
            parse_tool_calls: options.parse_tool_calls,
            json: options.parse_json_output.then(JsonOutput::default),
            at_section_start,
            newlines: Vec::new(),
            tag: Vec::new(),
            reasoning_text: String::new(),
            halted: None,
            token_level_think_end: false,
            dsml_blocked: false,
        }
    }

    pub fn halted(&self) -> Option<&Halt> {
        self.halted.as_ref()
    }

    pub fn stop_sequence(&self, index: usize) -> &str {
        &self.stops[index]
    }

    /// Number of tool calls parsed so far.
    pub fn tool_calls(&self) -> usize {
        match &self.mode {
            Mode::Tools(p) => p.calls(),
            _ => 0,
        }
    }

    /// All reasoning text produced so far (trailing newlines of a finished section trimmed).
    pub fn reasoning_text(&self) -> &str {
        &self.reasoning_text
    }

    /// The piece of the earliest input character not decided yet (and the only class it can become,
    /// when that is known).
    pub fn undecided_piece(&self) -> Option<(u64, Option<Class>)> {
        let text_held = self.newlines.first().copied().or(self.tag.first().map(|&(_, p)| p));
        let json_held = self.json.as_ref().and_then(JsonOutput::undecided_piece);
        match &self.mode {
            Mode::Tools(p) => p.undecided_piece(),
            _ => json_held.or(text_held).map(|p| (p, None)),
        }
    }

    /// Whether the following input comes from token ids (see `token_level_think_end`); with token input
    /// a tool-call block opens only when the DSML spelling is a token of its own (`dsml_is_token`).
    pub fn set_token_input(&mut self, token_input: bool, dsml_is_token: bool) {
        self.token_level_think_end = token_input;
        self.dsml_blocked = token_input && !dsml_is_token;
    }

    /// The tag that opens a tool-call block; when blocked, a `<` still waits for the next token but
    /// nothing can complete it.
    fn dsml_opener(&self) -> &str {
        if self.dsml_blocked {
            "<\u{ffff}"
        } else {
            &self.dsml.opener
        }
    }

    /// The `</think>` special token, with token input.
    pub fn feed_think_end(&mut self, piece: u64, out: &mut Fragments) {
        if self.halted.is_some() {
            return;
        }
        if let Mode::Tools(parser) = &mut self.mode {
            for c in self.think_end.clone().chars() {
                parser.feed(c, piece, out);
            }
            return;
        }
        // A pending partial tag cannot continue across the special token.
        for (c, p) in std::mem::take(&mut self.tag) {
            self.text_char(c, p, out);
        }
        self.on_tag(Tag::ThinkEnd, piece, out);
    }

    pub fn feed_str(&mut self, text: &str, piece: u64, out: &mut Fragments) {
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            if self.halted.is_some() {
                return;
            }
            let run = self.plain_run(rest);
            if run > 0 {
                self.emit_run(&rest[..run], piece, out);
                rest = &rest[run..];
            } else {
                self.feed(c, piece, out);
                rest = &rest[c.len_utf8()..];
            }
        }
    }

    /// Length of the leading run of `text` that is certainly plain section text (no newline, no
    /// possible tag start, nothing held), which can be emitted in one go.
    fn plain_run(&self, text: &str) -> usize {
        if !self.tag.is_empty() || !self.newlines.is_empty() || self.at_section_start || self.json.is_some() {
            return 0;
        }
        if matches!(self.mode, Mode::Tools(_)) {
            return 0;
        }
        text.char_indices().find(|&(_, c)| c == '\n' || self.may_start_tag(c)).map_or(text.len(), |(i, _)| i)
    }

    fn emit_run(&mut self, run: &str, piece: u64, out: &mut Fragments) {
        let channel = self.channel();
        if channel == Channel::Reasoning {
            self.reasoning_text.push_str(run);
        }
        out.push_str(piece, channel, Class::Text, run);
    }

    fn feed(&mut self, c: char, piece: u64, out: &mut Fragments) {
        if let Mode::Tools(parser) = &mut self.mode {
            parser.feed(c, piece, out);
            return;
        }
        if self.tag.is_empty() && !self.may_start_tag(c) {
            self.text_char(c, piece, out);
            return;
        }
        self.tag.push((c, piece));
        match self.match_tag() {
            Some(Ok(tag)) => {
                self.tag.clear();
                self.on_tag(tag, piece, out);
            }
            Some(Err(())) => {
                let mut held = std::mem::take(&mut self.tag).into_iter();
                let (c0, p0) = held.next().expect("non-empty tag buffer");
                self.text_char(c0, p0, out);
                for (c, p) in held {
                    self.feed(c, p, out);
                }
            }
            None => {
                // In the answer, held newlines only wait for a tool-call block that would trim them.
                if matches!(self.mode, Mode::Content) && !self.newlines.is_empty() && !self.tag_may_open_tools() {
                    self.release_newlines(out);
                }
            }
        }
    }

    /// Whether the pending tag characters can still become the tool-call block opener.
    fn tag_may_open_tools(&self) -> bool {
        let pending: String = self.tag.iter().map(|&(c, _)| c).collect();
        self.parse_tool_calls && self.dsml_opener().starts_with(&pending)
    }

    fn tags(&self) -> impl Iterator<Item = (&str, Tag)> {
        let think_end = (!self.token_level_think_end).then_some((self.think_end.as_str(), Tag::ThinkEnd));
        let dsml = self.parse_tool_calls.then_some((self.dsml_opener(), Tag::Dsml));
        let stops = matches!(self.mode, Mode::Content).then_some(&self.stops).into_iter().flatten();
        think_end.into_iter().chain(dsml).chain(stops.enumerate().map(|(i, s)| (s.as_str(), Tag::Stop(i))))
    }

    fn may_start_tag(&self, c: char) -> bool {
        let starts = |t: &str| t.starts_with(c);
        (!self.token_level_think_end && starts(&self.think_end))
            || (self.parse_tool_calls && starts(self.dsml_opener()))
            || (matches!(self.mode, Mode::Content) && self.stops.iter().any(|s| starts(s)))
    }

    /// `Some(Ok)` on a complete tag, `Some(Err)` when the buffer can no longer become one.
    fn match_tag(&self) -> Option<Result<Tag, ()>> {
        let s: String = self.tag.iter().map(|&(c, _)| c).collect();
        let mut prefix = false;
        for (t, tag) in self.tags() {
            if t == s {
                return Some(Ok(tag));
            }
            prefix |= t.starts_with(&s);
        }
        (!prefix).then_some(Err(()))
    }

    fn holds_newlines(&self) -> bool {
        match self.mode {
            Mode::Reasoning => true,
            Mode::Content => {
                self.parse_tool_calls && !self.json.as_ref().is_some_and(JsonOutput::takes_newline)
            }
            Mode::Tools(_) => false,
        }
    }

    /// Where the next character would go (`None` inside a tool-call block).
    pub fn current_channel(&self) -> Option<Channel> {
        match self.mode {
            Mode::Tools(_) => None,
            _ => Some(self.channel()),
        }
    }

    fn channel(&self) -> Channel {
        match self.mode {
            Mode::Reasoning => Channel::Reasoning,
            _ => Channel::Content,
        }
    }

    fn text_char(&mut self, c: char, piece: u64, out: &mut Fragments) {
        if c == '\n' {
            if self.at_section_start {
                return;
            }
            if self.holds_newlines() {
                self.newlines.push(piece);
                return;
            }
        }
        self.at_section_start = false;
        self.release_newlines(out);
        self.emit(c, piece, out);
    }

    fn release_newlines(&mut self, out: &mut Fragments) {
        for piece in std::mem::take(&mut self.newlines) {
            self.emit('\n', piece, out);
        }
    }

    fn emit(&mut self, c: char, piece: u64, out: &mut Fragments) {
        let channel = self.channel();
        if channel == Channel::Reasoning {
            self.reasoning_text.push(c);
            out.push_char(piece, channel, Class::Text, c);
        } else if let Some(json) = &mut self.json {
            json.push(c, piece, out);
        } else {
            out.push_char(piece, channel, Class::Text, c);
        }
    }

    fn on_tag(&mut self, tag: Tag, piece: u64, out: &mut Fragments) {
        if tag == Tag::ThinkEnd && !matches!(self.mode, Mode::Reasoning) {
            // A closing think tag inside the answer is dropped, but like text it ends a run of
            // trailing newlines, which stay with the piece they came in.
            self.release_newlines(out);
        }
        out.seal();
        match (tag, &self.mode) {
            (Tag::ThinkEnd, Mode::Reasoning) => {
                self.newlines.clear();
                self.mode = Mode::Content;
                self.at_section_start = true;
            }
            // A closing think tag inside the answer is dropped; the section goes on.
            (Tag::ThinkEnd, _) => {}
            (Tag::Dsml, _) => {
                self.newlines.clear();
                let mut parser = DsmlParser::new(self.dsml.clone());
                for c in self.dsml.opener.chars() {
                    parser.feed(c, piece, out);
                }
                self.mode = Mode::Tools(Box::new(parser));
            }
            (Tag::Stop(i), _) => {
                self.release_newlines(out);
                self.halted = Some(Halt::Stop(i));
            }
        }
    }

    /// End of input: undecided characters become text.
    pub fn finish(&mut self, out: &mut Fragments) {
        if matches!(self.mode, Mode::Tools(_)) {
            return;
        }
        let held = std::mem::take(&mut self.tag);
        for (c, p) in held {
            self.text_char(c, p, out);
        }
        self.release_newlines(out);
        if let Some(json) = &mut self.json {
            json.finish(out);
        }
    }
}
