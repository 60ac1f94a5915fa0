//! The stream processor: backend chunks in, protocol events out.

use super::chunk::{FinishReason, InferenceChunk, PromptUsage, TokenLogprob};
use super::decode::TokenDecoder;
use super::fragments::{Channel, Fragments, Output};
use super::parser::{Halt, Parser};
use crate::options::ParsingOptions;
use crate::tokenizer::Tokenizer;
use crate::tokens::SpecialToken;

/// The log-probability of one output token, with its display text and bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct LogprobEntry {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f64,
    pub top: Vec<(String, Vec<u8>, f64)>,
}

/// One piece of parsed output, in protocol-neutral form; text deltas carry the log-probabilities of
/// the tokens that produced them (when the backend sent any).
#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    Reasoning(String, Vec<LogprobEntry>),
    Content(String, Vec<LogprobEntry>),
    ToolCallStart { index: usize, id: String, name: String },
    ToolCallArguments { index: usize, fragment: String },
}

/// Token counts of a finished stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: PromptUsage,
    pub completion_tokens: u64,
    /// Reported only when parsing has a thinking stage.
    pub reasoning_tokens: Option<u64>,
}

/// How the stream ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The backend's reason; `None` when the input ended without a finish chunk (reported as a plain
    /// stop even after tool calls). A stop sequence reports `Stop`.
    pub reason: Option<FinishReason>,
    pub tool_calls: usize,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

/// Turns parsed output into protocol events.
pub trait Generator {
    type Event;
    /// Thinking mode of the request (selects delta shapes and the tool-call id marker).
    fn thinking_mode(&self) -> bool;
    /// Called once, on the `ready` chunk or the first output chunk.
    fn start(&mut self, prompt: &PromptUsage, system_fingerprint: Option<&str>, out: &mut Vec<Self::Event>);
    fn delta(&mut self, delta: Delta, out: &mut Vec<Self::Event>);
    fn complete(&mut self, completion: &Completion, out: &mut Vec<Self::Event>);
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StreamError {
    #[error("token chunk received without a tokenizer")]
    NoTokenizer,
    #[error("invalid log probabilities: {logprobs} log probabilities for {tokens} token IDs")]
    LogprobCount { logprobs: usize, tokens: usize },
    #[error("stream processor has finished")]
    Finished,
    #[error("stream processor is closed")]
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lifecycle {
    Open,
    Completed,
    Closed,
}

pub struct StreamProcessor<G: Generator> {
    generator: G,
    parser: Parser,
    fragments: Fragments,
    decoder: Option<TokenDecoder>,
    lifecycle: Lifecycle,
    started: bool,
    prompt: PromptUsage,
    system_fingerprint: Option<String>,
    completion_tokens: u64,
    piece: u64,
    report_reasoning: bool,
    ids: IdSource,
    released: Vec<Output>,
    /// Id of the `</think>` special token (token input recognises it only by id).
    think_end_id: Option<u32>,
    /// Whether the tokenizer has a token for the DSML spelling.
    dsml_is_token: bool,
    /// Decoded tokens of pushes that ended inside a UTF-8 character.
    carried_units: Vec<Unit>,
    /// Log-probabilities waiting for the delta of their piece and channel.
    logprobs: Vec<(u64, Channel, LogprobEntry)>,
}

/// One decoded token.
enum Unit {
    ThinkEnd,
    Text { text: String, special: bool, logprob: Option<LogprobEntry> },
}

impl<G: Generator> StreamProcessor<G> {
    pub fn new(generator: G, options: &ParsingOptions, tokenizer: Option<Tokenizer>) -> Self {
        let think_end = options.special_tokens.token(SpecialToken::ThinkingEnd);
        let think_end_id = tokenizer.as_ref().and_then(|t| t.added_token_id(think_end));
        let dsml = options.special_tokens.token(SpecialToken::Dsml);
        let dsml_is_token = tokenizer.as_ref().is_some_and(|t| t.added_token_id(dsml).is_some());
        Self {
            generator,
            parser: Parser::new(options),
            fragments: Fragments::default(),
            decoder: tokenizer.map(TokenDecoder::new),
            lifecycle: Lifecycle::Open,
            started: false,
            prompt: PromptUsage::default(),
            system_fingerprint: None,
            completion_tokens: 0,
            piece: 0,
            report_reasoning: options.thinking_initial_stage.is_some(),
            ids: IdSource::new(),
            released: Vec::new(),
            think_end_id,
            dsml_is_token,
            carried_units: Vec::new(),
            logprobs: Vec::new(),
        }
    }

    /// True after a normal completion until `close`.
    pub fn finished(&self) -> bool {
        self.lifecycle == Lifecycle::Completed
    }

    pub fn generator(&self) -> &G {
        &self.generator
    }

    fn check_open(&self) -> Result<(), StreamError> {
        match self.lifecycle {
            Lifecycle::Open => Ok(()),
            Lifecycle::Completed => Err(StreamError::Finished),
            Lifecycle::Closed => Err(StreamError::Closed),
        }
    }

    pub fn push(&mut self, chunk: InferenceChunk) -> Result<Vec<G::Event>, StreamError> {
        self.check_open()?;
        let mut out = Vec::new();
        match chunk {
            InferenceChunk::Ready { prompt_usage, system_fingerprint } => {
                if !self.started {
                    self.prompt = prompt_usage;
                    self.system_fingerprint = system_fingerprint;
                }
                self.ensure_started(&mut out);
            }
            InferenceChunk::Text { content, token_count } => {
                self.ensure_started(&mut out);
                self.completion_tokens += token_count;
                self.feed(&content, &mut out);
            }
            InferenceChunk::Tokens { token_ids, logprobs } => {
                if let Some(lp) = &logprobs {
                    if lp.len() != token_ids.len() {
                        self.lifecycle = Lifecycle::Closed;
                        return Err(StreamError::LogprobCount {
                            logprobs: lp.len(),
                            tokens: token_ids.len(),
                        });
                    }
                }
                if self.decoder.is_none() {
                    self.lifecycle = Lifecycle::Closed;
                    return Err(StreamError::NoTokenizer);
                }
                self.completion_tokens += token_ids.len() as u64;
                self.feed_tokens(&token_ids, logprobs.unwrap_or_default(), &mut out);
            }
            InferenceChunk::Finish(reason) => {
                self.ensure_started(&mut out);
                self.complete(Some(reason), &mut out);
            }
        }
        Ok(out)
    }

    /// Ends the input; after a completion it returns nothing.
    pub fn finish(&mut self) -> Result<Vec<G::Event>, StreamError> {
        match self.lifecycle {
            Lifecycle::Completed => Ok(Vec::new()),
            Lifecycle::Closed => Err(StreamError::Closed),
            Lifecycle::Open => {
                let mut out = Vec::new();
                self.ensure_started(&mut out);
                self.complete(None, &mut out);
                Ok(out)
            }
        }
    }

    pub fn close(&mut self) {
        self.lifecycle = Lifecycle::Closed;
    }

    fn ensure_started(&mut self, out: &mut Vec<G::Event>) {
        if !self.started {
            self.started = true;
            self.generator.start(&self.prompt, self.system_fingerprint.as_deref(), out);
        }
    }

    fn feed(&mut self, text: &str, out: &mut Vec<G::Event>) {
        self.piece += 1;
        self.parser.set_token_input(false, false);
        self.parser.feed_str(text, self.piece, &mut self.fragments);
        self.settle(out);
    }

    /// Decodes a push into units; a push that ends inside a UTF-8 character waits whole for the next.
    fn feed_tokens(&mut self, ids: &[u32], logprobs: Vec<TokenLogprob>, out: &mut Vec<G::Event>) {
        let decoder = self.decoder.as_mut().expect("checked by the caller");
        let mut units = std::mem::take(&mut self.carried_units);
        let plain = logprobs.is_empty()
            && ids.iter().all(|&id| Some(id) != self.think_end_id && !decoder.is_special(id));
        if plain {
            // The common case: ordinary tokens without log-probabilities decode as one text.
            units.push(Unit::Text { text: decoder.decode_run(ids), special: false, logprob: None });
        }
        let ids = if plain { &[][..] } else { ids };
        let mut logprobs = logprobs.into_iter();
        for &id in ids {
            let logprob = logprobs.next().map(|lp| {
                let (token, bytes) = decoder.display(id);
                let top = lp
                    .top
                    .iter()
                    .map(|&(top_id, value)| {
                        let (text, bytes) = decoder.display(top_id);
                        (text, bytes, value)
                    })
                    .collect();
                LogprobEntry { token, bytes, logprob: lp.logprob, top }
            });
            units.push(if Some(id) == self.think_end_id {
                Unit::ThinkEnd
            } else {
                Unit::Text { text: decoder.decode(id), special: decoder.is_special(id), logprob }
            });
        }
        if decoder.has_pending() {
            // Nothing decodable yet: the stream has not visibly started.
            self.carried_units = units;
            return;
        }
        self.ensure_started(out);
        self.feed_units(units);
        self.settle(out);
    }

    fn feed_units(&mut self, units: Vec<Unit>) {
        self.piece += 1;
        self.parser.set_token_input(true, self.dsml_is_token);
        for unit in units {
            match unit {
                Unit::ThinkEnd => {
                    self.piece += 1;
                    self.parser.feed_think_end(self.piece, &mut self.fragments);
                    self.piece += 1;
                }
                // A special token streams as its own fragment.
                Unit::Text { text, special, logprob } => {
                    self.piece += u64::from(special);
                    if let (Some(entry), Some(channel)) = (logprob, self.parser.current_channel()) {
                        self.logprobs.push((self.piece, channel, entry));
                    }
                    self.parser.feed_str(&text, self.piece, &mut self.fragments);
                    self.piece += u64::from(special);
                }
            }
        }
    }

    fn settle(&mut self, out: &mut Vec<G::Event>) {
        if self.parser.halted().is_some() {
            self.complete(Some(FinishReason::Stop), out);
            return;
        }
        self.fragments.release(self.parser.undecided_piece(), &mut self.released);
        self.deliver(out);
    }

    fn deliver(&mut self, out: &mut Vec<G::Event>) {
        for output in std::mem::take(&mut self.released) {
            let delta = match output {
                Output::ToolStart { index, name } => {
                    // `ET_` marks calls made in thinking mode without any reasoning before them.
                    let marker = if self.generator.thinking_mode() && self.parser.reasoning_text().is_empty()
                    {
                        "ET_"
                    } else {
                        ""
                    };
                    let id = format!("call_{index:02}_{marker}{}", self.ids.next_suffix());
                    Delta::ToolCallStart { index, id, name }
                }
                Output::Text { channel: Channel::Reasoning, piece, text } => {
                    Delta::Reasoning(text, self.take_logprobs(piece, Channel::Reasoning))
                }
                Output::Text { channel: Channel::Content, piece, text } => {
                    Delta::Content(text, self.take_logprobs(piece, Channel::Content))
                }
                Output::Text { channel: Channel::Arguments(index), text, .. } => {
                    Delta::ToolCallArguments { index, fragment: text }
                }
            };
            self.generator.delta(delta, out);
        }
    }

    fn take_logprobs(&mut self, piece: u64, channel: Channel) -> Vec<LogprobEntry> {
        let (taken, kept) = std::mem::take(&mut self.logprobs)
            .into_iter()
            .partition(|(p, c, _)| *p == piece && *c == channel);
        self.logprobs = kept;
        taken.into_iter().map(|(_, _, entry)| entry).collect()
    }

    fn complete(&mut self, reason: Option<FinishReason>, out: &mut Vec<G::Event>) {
        if let Some(decoder) = &mut self.decoder {
            let rest = decoder.flush();
            let mut units = std::mem::take(&mut self.carried_units);
            if !rest.is_empty() {
                units.push(Unit::Text { text: rest, special: false, logprob: None });
            }
            if !units.is_empty() {
                self.feed_units(units);
            }
        }
        let stop_sequence = match self.parser.halted() {
            Some(Halt::Stop(i)) => Some(self.parser.stop_sequence(*i).to_owned()),
            None => {
                self.parser.finish(&mut self.fragments);
                None
            }
        };
        self.fragments.release(None, &mut self.released);
        self.deliver(out);
        let reasoning_tokens = self.report_reasoning.then(|| self.count_reasoning_tokens());
        let completion = Completion {
            reason: if stop_sequence.is_some() { Some(FinishReason::Stop) } else { reason },
            tool_calls: self.parser.tool_calls(),
            stop_sequence,
            usage: Usage { prompt: self.prompt, completion_tokens: self.completion_tokens, reasoning_tokens },
        };
        self.generator.complete(&completion, out);
        self.lifecycle = Lifecycle::Completed;
    }

    /// Reasoning tokens are counted by re-encoding the reasoning text.
    fn count_reasoning_tokens(&self) -> u64 {
        let text = self.parser.reasoning_text();
        match &self.decoder {
            Some(d) if !text.is_empty() => d.tokenizer().encode(text).map_or(0, |ids| ids.len() as u64),
            _ => 0,
        }
    }
}

/// Random alphanumeric suffixes for tool-call ids (xorshift seeded from the clock and address).
struct IdSource(u64);

impl IdSource {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let local = 0u8;
        Self(nanos ^ (&local as *const u8 as u64).rotate_left(32) | 1)
    }

    fn next_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..24)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ALPHABET[(self.0 % ALPHABET.len() as u64) as usize] as char
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::ThinkingInitialStage;
    use crate::response::chat::{ChatConfig, ChatGenerator, ChatResponse};

    fn run(pieces: &[&str], options: &ParsingOptions) -> serde_json::Value {
        let config = ChatConfig { thinking_mode: true, reasoning: true, omit_usage: false };
        let mut processor = StreamProcessor::new(ChatGenerator::new(config, "c", "m"), options, None);
        let mut events = Vec::new();
        for piece in pieces {
            let chunk = InferenceChunk::Text { content: (*piece).to_owned(), token_count: 1 };
            events.extend(processor.push(chunk).unwrap());
        }
        events.extend(processor.push(InferenceChunk::Finish(FinishReason::Stop)).unwrap());
        assert!(processor.finished());
        assert_eq!(processor.push(InferenceChunk::Finish(FinishReason::Stop)), Err(StreamError::Finished));
        let mut response = ChatResponse::new("c", "m", 0);
        events.iter().for_each(|e| response.accumulate(e));
        serde_json::from_str(&response.to_json()).unwrap()
    }

    fn thinking() -> ParsingOptions {
        ParsingOptions {
            thinking_initial_stage: Some(ThinkingInitialStage::ReasoningStart),
            ..Default::default()
        }
    }

    #[test]
    fn reasoning_content_and_tool_calls_survive_any_cut() {
        let d = "｜DSML｜";
        let text = format!(
            "\nWeigh it.\n</think>\n\nChecking.\n\n<{d} calls>\n<{d} invoke name=\"f\">\n\
             <{d} parameter name=\"city\" string=\"true\">Pa\"ris</{d} parameter>\n\
             <{d} parameter name=\"days\" string=\"false\">3</{d} parameter>\n</{d} invoke>\n</{d} calls>"
        );
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let by_char: Vec<&str> = chars.iter().map(String::as_str).collect();
        for pieces in [vec![text.as_str()], by_char] {
            let body = run(&pieces, &thinking());
            let message = &body["choices"][0]["message"];
            assert_eq!(message["reasoning_content"], "Weigh it.");
            assert_eq!(message["content"], "Checking.");
            assert_eq!(
                message["tool_calls"][0]["function"]["arguments"],
                r#"{"city": "Pa\"ris", "days": 3}"#
            );
            assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
        }
    }

    #[test]
    fn stop_sequence_cuts_content() {
        let options = ParsingOptions { stop_sequences: vec!["STOP".into()], ..Default::default() };
        let config = ChatConfig::default();
        let mut processor = StreamProcessor::new(ChatGenerator::new(config, "c", "m"), &options, None);
        let events =
            processor.push(InferenceChunk::Text { content: "one ST".into(), token_count: 1 }).unwrap();
        assert!(events.len() == 1 && !processor.finished());
        processor.push(InferenceChunk::Text { content: "OP two".into(), token_count: 1 }).unwrap();
        assert!(processor.finished());
    }

    #[test]
    fn token_chunks_need_a_tokenizer() {
        let mut processor =
            StreamProcessor::new(ChatGenerator::new(ChatConfig::default(), "c", "m"), &thinking(), None);
        let chunk = InferenceChunk::Tokens { token_ids: vec![1], logprobs: None };
        assert_eq!(processor.push(chunk), Err(StreamError::NoTokenizer));
        assert_eq!(processor.finish(), Err(StreamError::Closed));
    }
}
