//! Groups parser output into deltas the way the protocols stream them.
//!
//! Every pushed piece of text is parsed on its own: the output that one piece produces for one channel
//! and class forms one fragment, and a fragment is released whole once nothing undecided from its piece
//! can still join it (a held trailing newline or a partial tag stays with the fragment it came from).

use std::collections::VecDeque;

/// Where parsed output goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    Reasoning,
    Content,
    /// Arguments of the tool call with this index.
    Arguments(usize),
}

/// Kinds of output that never share a fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Text,
    /// Text around JSON output: a whole fragment of it becomes one space.
    Filler,
    /// The bracket that opens bare JSON output.
    JsonStart,
    ArgsOpen,
    Key,
    Colon,
    ValueOpen,
    Value,
    ValueClose,
    Separator,
    ArgsClose,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// `piece` is the pushed piece the text came from.
    Text {
        channel: Channel,
        piece: u64,
        text: String,
    },
    ToolStart {
        index: usize,
        name: String,
    },
}

#[derive(Debug)]
struct Fragment {
    /// No more output joins this fragment (a tag was removed right after it).
    sealed: bool,
    piece: u64,
    channel: Channel,
    class: Class,
    output: Output,
}

#[derive(Debug, Default)]
pub struct Fragments {
    queue: VecDeque<Fragment>,
}

impl Fragments {
    pub fn push_char(&mut self, piece: u64, channel: Channel, class: Class, c: char) {
        if let Some(last) = self.queue.back_mut() {
            if !last.sealed && last.piece == piece && last.channel == channel && last.class == class {
                if let Output::Text { text, .. } = &mut last.output {
                    if class != Class::Filler {
                        text.push(c);
                    }
                    return;
                }
            }
        }
        let text = if class == Class::Filler { " ".to_owned() } else { c.to_string() };
        self.queue.push_back(Fragment {
            sealed: false,
            piece,
            channel,
            class,
            output: Output::Text { channel, piece, text },
        });
    }

    pub fn push_str(&mut self, piece: u64, channel: Channel, class: Class, s: &str) {
        let mut chars = s.chars();
        let Some(first) = chars.next() else { return };
        self.push_char(piece, channel, class, first);
        if class == Class::Filler {
            return;
        }
        if let Some(Fragment { output: Output::Text { text, .. }, .. }) = self.queue.back_mut() {
            text.push_str(chars.as_str());
        }
    }

    pub fn push_tool_start(&mut self, piece: u64, index: usize, name: String) {
        self.queue.push_back(Fragment {
            sealed: true,
            piece,
            channel: Channel::Arguments(index),
            class: Class::ArgsOpen,
            output: Output::ToolStart { index, name },
        });
    }

    /// Ends the current fragment: output after a removed tag streams separately.
    pub fn seal(&mut self) {
        if let Some(last) = self.queue.back_mut() {
            last.sealed = true;
        }
    }

    /// Releases every settled fragment. `undecided` is the piece of the earliest input character the
    /// parser has not decided yet and, when known, the class it can only become; the last fragment
    /// waits while that character could still join it.
    pub fn release(&mut self, undecided: Option<(u64, Option<Class>)>, out: &mut Vec<Output>) {
        let keep_last = match (self.queue.back(), undecided) {
            (Some(last), Some((p, class))) => {
                !last.sealed && last.piece == p && class.is_none_or(|c| c == last.class)
            }
            _ => false,
        };
        let n = self.queue.len() - usize::from(keep_last);
        out.extend(self.queue.drain(..n).map(|f| f.output));
    }
}
