//! The DSML tool-call block, parsed one character at a time into streamed tool calls.
//!
//! Both dialects are accepted: V4 (`<｜DSML｜tool_calls>`, `<｜DSML｜invoke`, `<｜DSML｜parameter`) and
//! V4.1 (`<｜DSML｜ calls>`, `<｜DSML｜ invoke`, `<｜DSML｜ parameter`). Arguments are built as JSON while the
//! block streams: `{` when the first parameter starts, the key as a JSON string, `: `, then the value
//! (a JSON string for `string="true"`, verbatim otherwise), `, ` between parameters and `}` at the end.

use super::fragments::{Channel, Class, Fragments};

/// The literal tags of the block, spelled with the configured DSML token.
#[derive(Clone, Debug)]
pub struct DsmlTags {
    invoke: [String; 2],
    parameter: [String; 2],
    /// `</｜DSML｜`: closes a value or an invoke.
    close: String,
    /// The closing tags of the block itself (stray closing tags of other kinds are ignored).
    block_close: [String; 2],
    /// `<｜DSML｜`: opens a block from reasoning or content (the block parser reads what follows).
    pub opener: String,
}

impl DsmlTags {
    pub fn new(dsml: &str) -> Self {
        Self {
            invoke: [format!("<{dsml}invoke"), format!("<{dsml} invoke")],
            parameter: [format!("<{dsml}parameter name="), format!("<{dsml} parameter name=")],
            close: format!("</{dsml}"),
            block_close: [format!("</{dsml}tool_calls>"), format!("</{dsml} calls>")],
            opener: format!("<{dsml}"),
        }
    }
}

const NAME_ATTR: &str = " name=\"";

#[derive(Debug)]
enum State {
    /// Between invokes: looking for an invoke or the end of the block; anything else is ignored.
    Block,
    /// After `<｜DSML｜invoke`: expecting ` name="`.
    InvokeAttr,
    InvokeName(String),
    /// Up to the `>` that ends a tag; `holds` when the tag produced output, which then waits for the
    /// rest of the tag if it arrived in the same piece.
    SkipToGt {
        next: Box<State>,
        holds: bool,
    },
    /// Inside an invoke, between parameters.
    Params {
        first: bool,
    },
    /// After `name=` of a parameter: expecting the key's opening quote.
    KeyOpen,
    Key,
    /// After the key: collecting the rest of the parameter tag up to `>`.
    Attributes(String),
    Value {
        string: bool,
    },
    Done,
    Failed,
}

/// Incremental parser of one tool-call block.
#[derive(Debug)]
pub struct DsmlParser {
    tags: DsmlTags,
    state: State,
    /// Characters that may be the start of a tag (with their pieces).
    buf: Vec<(char, u64)>,
    /// Piece of the first character of a closing tag's tail still being read (up to its `>`).
    tail_piece: Option<u64>,
    /// Calls started so far; the current call has index `calls - 1`.
    calls: usize,
}

enum Scan {
    Matched(usize),
    Pending,
    /// The buffer cannot start any tag; the characters in it are ordinary input.
    Mismatch,
}

impl DsmlParser {
    /// A parser positioned inside a block (before its first invoke).
    pub fn new(tags: DsmlTags) -> Self {
        Self { tags, state: State::Block, buf: Vec::new(), tail_piece: None, calls: 0 }
    }

    pub fn calls(&self) -> usize {
        self.calls
    }

    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done | State::Failed)
    }

    /// The piece of the earliest input character not settled yet: a possible closing tag inside a
    /// value, or the tail of a tag being read.
    pub fn undecided_piece(&self) -> Option<(u64, Option<Class>)> {
        match self.state {
            // A possible closing tag can only turn out to be more value text.
            State::Value { .. } => self.buf.first().map(|&(_, p)| (p, Some(Class::Value))),
            State::SkipToGt { .. } => self.tail_piece.map(|p| (p, None)),
            _ => None,
        }
    }

    pub fn feed(&mut self, c: char, piece: u64, out: &mut Fragments) {
        let args = Channel::Arguments(self.calls.saturating_sub(1));
        match std::mem::replace(&mut self.state, State::Failed) {
            State::Block => {
                self.buf.push((c, piece));
                let [v4, v41] = &self.tags.invoke;
                let [end4, end41] = &self.tags.block_close;
                let cands = [v4.as_str(), v41.as_str(), end4.as_str(), end41.as_str()];
                self.state = match scan_ignoring(&mut self.buf, &cands) {
                    Some((2 | 3, _)) => State::Done,
                    Some(_) => State::InvokeAttr,
                    None => State::Block,
                };
            }
            State::InvokeAttr => {
                self.buf.push((c, piece));
                self.state = match scan(&self.buf, &[NAME_ATTR]) {
                    Scan::Matched(_) => {
                        self.buf.clear();
                        State::InvokeName(String::new())
                    }
                    Scan::Pending => State::InvokeAttr,
                    Scan::Mismatch => {
                        // Not an invoke after all: go back to scanning the block with this input.
                        let rest = std::mem::take(&mut self.buf);
                        self.state = State::Block;
                        for (c, p) in rest {
                            self.feed(c, p, out);
                        }
                        return;
                    }
                };
            }
            State::InvokeName(mut name) => {
                self.state = if c == '"' {
                    out.push_tool_start(piece, self.calls, std::mem::take(&mut name));
                    self.calls += 1;
                    skip_to_gt(State::Params { first: true }, false)
                } else {
                    name.push(c);
                    State::InvokeName(name)
                };
            }
            State::SkipToGt { next, mut holds } => {
                // A V4.1 tag name (after a space) does not hold back what its closing tag produced.
                if holds && self.tail_piece.is_none() && c == ' ' {
                    holds = false;
                }
                if holds {
                    self.tail_piece.get_or_insert(piece);
                }
                self.state = if c == '>' {
                    self.tail_piece = None;
                    *next
                } else {
                    State::SkipToGt { next, holds }
                };
            }
            State::Params { first } => {
                self.buf.push((c, piece));
                let [v4, v41] = &self.tags.parameter;
                let cands = [v4.as_str(), v41.as_str(), self.tags.close.as_str()];
                self.state = match scan_ignoring(&mut self.buf, &cands) {
                    Some((2, start)) => {
                        out.push_str(start, args, Class::ArgsClose, if first { "{}" } else { "}" });
                        skip_to_gt(State::Block, true)
                    }
                    Some((_, start)) => {
                        let (text, class) =
                            if first { ("{", Class::ArgsOpen) } else { (", ", Class::Separator) };
                        out.push_str(start, args, class, text);
                        State::KeyOpen
                    }
                    None => State::Params { first },
                };
            }
            State::KeyOpen => {
                self.state = if c == '"' {
                    out.push_char(piece, args, Class::Key, '"');
                    State::Key
                } else {
                    State::Failed
                };
            }
            State::Key => {
                if c == '"' {
                    out.push_char(piece, args, Class::Key, '"');
                    self.state = State::Attributes(String::new());
                } else {
                    push_json_escaped(out, piece, args, Class::Key, c);
                    self.state = State::Key;
                }
            }
            State::Attributes(mut attrs) => {
                if attrs.is_empty() {
                    out.push_str(piece, args, Class::Colon, ": ");
                }
                if c != '>' {
                    attrs.push(c);
                    self.state = State::Attributes(attrs);
                    return;
                }
                self.state = match attrs.trim() {
                    "string=\"true\"" => {
                        out.push_char(piece, args, Class::ValueOpen, '"');
                        State::Value { string: true }
                    }
                    "string=\"false\"" => State::Value { string: false },
                    _ => State::Failed,
                };
            }
            State::Value { string } => {
                self.state = State::Value { string };
                self.feed_value(c, piece, string, out);
            }
            State::Done => self.state = State::Done,
            State::Failed => {}
        }
    }

    fn feed_value(&mut self, c: char, piece: u64, string: bool, out: &mut Fragments) {
        let args = Channel::Arguments(self.calls.saturating_sub(1));
        if self.buf.is_empty() && c != '<' {
            push_value_char(out, piece, args, string, c);
            return;
        }
        self.buf.push((c, piece));
        match scan(&self.buf, &[self.tags.close.as_str()]) {
            Scan::Matched(_) => {
                let start = self.buf[0].1;
                self.buf.clear();
                if string {
                    out.push_char(start, args, Class::ValueClose, '"');
                }
                self.state = skip_to_gt(State::Params { first: false }, string);
            }
            Scan::Pending => {}
            Scan::Mismatch => {
                let mut rest = std::mem::take(&mut self.buf).into_iter();
                let (c0, p0) = rest.next().expect("non-empty buffer");
                push_value_char(out, p0, args, string, c0);
                for (c, p) in rest {
                    self.feed_value(c, p, string, out);
                }
            }
        }
    }
}

fn skip_to_gt(next: State, holds: bool) -> State {
    State::SkipToGt { next: Box::new(next), holds }
}

fn scan(buf: &[(char, u64)], candidates: &[&str]) -> Scan {
    let s: String = buf.iter().map(|&(c, _)| c).collect();
    if let Some(i) = candidates.iter().position(|c| *c == s) {
        return Scan::Matched(i);
    }
    if candidates.iter().any(|c| c.starts_with(&s)) {
        Scan::Pending
    } else {
        Scan::Mismatch
    }
}

/// Tag scanning where unmatched input is ignored: drops leading characters until the buffer is again
/// a possible tag start. Returns the index of a completed tag and the piece where the tag began
/// (output a tag produces belongs to that piece).
fn scan_ignoring(buf: &mut Vec<(char, u64)>, candidates: &[&str]) -> Option<(usize, u64)> {
    loop {
        match scan(buf, candidates) {
            Scan::Matched(i) => {
                let start = buf[0].1;
                buf.clear();
                return Some((i, start));
            }
            Scan::Pending => return None,
            Scan::Mismatch => {
                buf.remove(0);
                if buf.is_empty() {
                    return None;
                }
            }
        }
    }
}

fn push_value_char(out: &mut Fragments, piece: u64, args: Channel, string: bool, c: char) {
    if string {
        push_json_escaped(out, piece, args, Class::Value, c);
    } else {
        out.push_char(piece, args, Class::Value, c);
    }
}

fn push_json_escaped(out: &mut Fragments, piece: u64, channel: Channel, class: Class, c: char) {
    match c {
        '"' => out.push_str(piece, channel, class, "\\\""),
        '\\' => out.push_str(piece, channel, class, "\\\\"),
        '\n' => out.push_str(piece, channel, class, "\\n"),
        '\r' => out.push_str(piece, channel, class, "\\r"),
        '\t' => out.push_str(piece, channel, class, "\\t"),
        '\u{8}' => out.push_str(piece, channel, class, "\\b"),
        '\u{c}' => out.push_str(piece, channel, class, "\\f"),
        c if (c as u32) < 0x20 => out.push_str(piece, channel, class, &format!("\\u{:04x}", c as u32)),
        c => out.push_char(piece, channel, class, c),
    }
}
