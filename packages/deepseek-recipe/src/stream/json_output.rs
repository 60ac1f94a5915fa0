//! JSON output mode: keep the first JSON value of the answer and blank out the text around it.
//!
//! A value inside a code fence is kept and everything else becomes filler (each filler fragment streams
//! as one space); the fences themselves (the opening ```` ``` ```` with its language line, the closing
//! `\n``` `) produce nothing. A bare value starts at the first `{` or `[`; from there on the answer is
//! kept as is.

use super::fragments::{Channel, Class, Fragments};

const OPEN_FENCE: &str = "```";
const CLOSE_FENCE: &str = "\n```";

#[derive(Debug, Default)]
enum State {
    /// Before any JSON.
    #[default]
    Prefix,
    /// The rest of the fence's line (its language), dropped.
    Language,
    /// Inside the fence: filler until the value starts, then the value.
    Fenced(Depth),
    /// After the fenced value: filler; a closing fence is dropped.
    AfterValue,
    /// After the closing fence: filler.
    After,
    Bare,
}

/// Bracket depth of a JSON value, aware of strings.
#[derive(Debug, Default)]
struct Depth {
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl Depth {
    /// Tracks `c`; returns true when it closes the outermost value.
    fn step(&mut self, c: char) -> bool {
        if self.in_string {
            match (self.escaped, c) {
                (true, _) => self.escaped = false,
                (false, '\\') => self.escaped = true,
                (false, '"') => self.in_string = false,
                _ => {}
            }
            return false;
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                return self.depth == 0;
            }
            _ => {}
        }
        false
    }
}

#[derive(Debug, Default)]
pub struct JsonOutput {
    state: State,
    /// A possible fence in progress (characters with their pieces).
    fence: Vec<(char, u64)>,
    /// While the opening fence's language line is read: the piece where the fence began.
    language_piece: Option<u64>,
}

impl JsonOutput {
    /// The piece of the earliest character not settled yet.
    pub fn undecided_piece(&self) -> Option<u64> {
        self.fence.first().map(|&(_, p)| p).or(self.language_piece)
    }

    /// Text outside the value: filler, except where a fence may start.
    fn outside(&mut self, c: char, piece: u64, out: &mut Fragments) {
        let fence = match self.state {
            State::Prefix => OPEN_FENCE,
            State::AfterValue => CLOSE_FENCE,
            _ => "",
        };
        if fence.is_empty() || (self.fence.is_empty() && !fence.starts_with(c)) {
            out.push_char(piece, Channel::Content, Class::Filler, c);
            return;
        }
        self.fence.push((c, piece));
        let s: String = self.fence.iter().map(|&(c, _)| c).collect();
        if s == fence {
            let start = self.fence[0].1;
            self.fence.clear();
            if matches!(self.state, State::Prefix) {
                self.language_piece = Some(start);
                self.state = State::Language;
            } else {
                self.state = State::After;
            }
        } else if !fence.starts_with(&s) {
            let held = std::mem::take(&mut self.fence);
            let (c0, p0) = held[0];
            out.push_char(p0, Channel::Content, Class::Filler, c0);
            for (c, p) in held.into_iter().skip(1) {
                self.push(c, p, out);
            }
        }
    }

    /// The newline that ends a fence's language line is read at once, not held as a trailing newline.
    pub fn takes_newline(&self) -> bool {
        matches!(self.state, State::Language)
    }

    /// End of input: a partial fence was text after all.
    pub fn finish(&mut self, out: &mut Fragments) {
        for (c, p) in std::mem::take(&mut self.fence) {
            out.push_char(p, Channel::Content, Class::Filler, c);
        }
        self.language_piece = None;
    }

    pub fn push(&mut self, c: char, piece: u64, out: &mut Fragments) {
        let content = Channel::Content;
        match &mut self.state {
            State::Prefix if self.fence.is_empty() && matches!(c, '{' | '[') => {
                out.push_char(piece, content, Class::JsonStart, c);
                self.state = State::Bare;
            }
            State::Prefix | State::AfterValue => self.outside(c, piece, out),
            State::Language => {
                if c == '\n' {
                    self.language_piece = None;
                    self.state = State::Fenced(Depth::default());
                }
            }
            State::After => out.push_char(piece, content, Class::Filler, c),
            State::Fenced(depth) => {
                if depth.depth == 0 && !matches!(c, '{' | '[') {
                    out.push_char(piece, content, Class::Filler, c);
                    return;
                }
                out.push_char(piece, content, Class::Text, c);
                if depth.step(c) {
                    self.state = State::AfterValue;
                }
            }
            State::Bare => out.push_char(piece, content, Class::Text, c),
        }
    }
}
