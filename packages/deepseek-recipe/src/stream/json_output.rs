//! JSON output mode: keep the first JSON value of the answer and blank out the text around it.
//!
//! A value inside a ```` ```json ```` fence is kept and everything else becomes filler (each filler
//! fragment streams as one space). A bare value starts at the first `{` or `[`; from there on the
//! answer is kept as is.

use super::fragments::{Channel, Class, Fragments};

const FENCE: &str = "```json\n";

#[derive(Debug, Default)]
enum State {
    /// Before any JSON; remembers the tail of the text to spot a fence.
    #[default]
    Prefix,
    Fenced(Depth),
    Bare,
    AfterFence,
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
    tail: String,
}

impl JsonOutput {
    pub fn push(&mut self, c: char, piece: u64, out: &mut Fragments) {
        let content = Channel::Content;
        match &mut self.state {
            State::Prefix => {
                if c == '{' || c == '[' {
                    out.push_char(piece, content, Class::JsonStart, c);
                    self.state = State::Bare;
                    return;
                }
                out.push_char(piece, content, Class::Filler, c);
                self.tail.push(c);
                if self.tail.ends_with(FENCE) {
                    self.state = State::Fenced(Depth::default());
                } else if self.tail.len() > 32 {
                    let cut = self.tail.len() - FENCE.len();
                    let cut = (cut..self.tail.len()).find(|&i| self.tail.is_char_boundary(i)).unwrap_or(0);
                    self.tail.drain(..cut);
                }
            }
            State::Fenced(depth) => {
                if depth.depth == 0 && !matches!(c, '{' | '[') {
                    out.push_char(piece, content, Class::Filler, c);
                    return;
                }
                out.push_char(piece, content, Class::Text, c);
                if depth.step(c) {
                    self.state = State::AfterFence;
                }
            }
            State::Bare => out.push_char(piece, content, Class::Text, c),
            State::AfterFence => out.push_char(piece, content, Class::Filler, c),
        }
    }
}
