//! Token ids -> UTF-8 text, carrying incomplete UTF-8 sequences over to the next push.

use std::collections::HashMap;

use crate::tokenizer::Tokenizer;

/// Maps the byte-level BPE alphabet (GPT-2 style: every byte has a printable stand-in char) back to bytes.
fn byte_level_decoder() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut map = HashMap::with_capacity(256);
    let mut extra = 0u32;
    for byte in 0..=255u32 {
        let ch = if printable.contains(&byte) {
            byte
        } else {
            extra += 1;
            255 + extra
        };
        map.insert(char::from_u32(ch).expect("valid code point"), byte as u8);
    }
    map
}

/// The bytes of one token and whether it is an added (special) token.
struct TokenInfo {
    bytes: Box<[u8]>,
    special: bool,
}

/// Decodes token ids incrementally; caches what it learns about every id it has seen.
pub struct TokenDecoder {
    tokenizer: Tokenizer,
    byte_of: HashMap<char, u8>,
    cache: HashMap<u32, TokenInfo>,
    /// Bytes of an incomplete UTF-8 sequence at the end of the previous push.
    carry: Vec<u8>,
}

impl TokenDecoder {
    pub fn new(tokenizer: Tokenizer) -> Self {
        Self { tokenizer, byte_of: byte_level_decoder(), cache: HashMap::new(), carry: Vec::new() }
    }

    fn info(&mut self, id: u32) -> &TokenInfo {
        let Self { tokenizer, byte_of, cache, .. } = self;
        cache.entry(id).or_insert_with(|| match tokenizer.id_to_token(id) {
            Some(piece) if tokenizer.added_token_id(&piece) == Some(id) => {
                TokenInfo { bytes: piece.into_bytes().into_boxed_slice(), special: true }
            }
            Some(piece) => {
                let bytes = piece
                    .chars()
                    .map(|c| byte_of.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| piece.into_bytes());
                TokenInfo { bytes: bytes.into_boxed_slice(), special: false }
            }
            None => TokenInfo { bytes: Box::default(), special: false },
        })
    }

    /// The token's text for log-probability reports (`\\xNN` escapes when it is not valid UTF-8) and
    /// its bytes.
    pub fn display(&mut self, id: u32) -> (String, Vec<u8>) {
        let bytes = self.info(id).bytes.to_vec();
        let text = match std::str::from_utf8(&bytes) {
            Ok(text) => text.to_owned(),
            Err(_) => bytes.iter().map(|b| format!("\\x{b:02x}")).collect(),
        };
        (text, bytes)
    }

    /// Whether `id` is an added (special) token.
    pub fn is_special(&mut self, id: u32) -> bool {
        self.info(id).special
    }

    /// The text completed by these plain (non-special) tokens, decoded in one go.
    pub fn decode_run(&mut self, ids: &[u32]) -> String {
        let mut bytes = std::mem::take(&mut self.carry);
        for &id in ids {
            bytes.extend_from_slice(&self.info(id).bytes);
        }
        self.finish_bytes(bytes)
    }

    /// The text completed by this token; a trailing incomplete character waits for the next token.
    pub fn decode(&mut self, id: u32) -> String {
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(&self.info(id).bytes);
        self.finish_bytes(bytes)
    }

    /// Keeps an incomplete trailing character for later and returns the rest as text.
    fn finish_bytes(&mut self, mut bytes: Vec<u8>) -> String {
        let keep = incomplete_tail(&bytes);
        self.carry = bytes.split_off(bytes.len() - keep);
        match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// Whether an incomplete character waits for more bytes.
    pub fn has_pending(&self) -> bool {
        !self.carry.is_empty()
    }

    /// Whatever incomplete sequence is left at the end of the stream, lossily decoded.
    pub fn flush(&mut self) -> String {
        let bytes = std::mem::take(&mut self.carry);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

/// Length of a trailing, still incomplete (but so far valid) UTF-8 sequence.
fn incomplete_tail(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=n.min(3) {
        let b = bytes[n - back];
        if b & 0xC0 == 0x80 {
            continue;
        }
        let need = if b >= 0xF0 {
            4
        } else if b >= 0xE0 {
            3
        } else if b >= 0xC0 {
            2
        } else {
            1
        };
        return if need > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::incomplete_tail;

    #[test]
    fn tail_detection() {
        let emoji = "🎉".as_bytes();
        assert_eq!(incomplete_tail(&emoji[..2]), 2);
        assert_eq!(incomplete_tail(emoji), 0);
        assert_eq!(incomplete_tail(b"ab"), 0);
        assert_eq!(incomplete_tail(&"é".as_bytes()[..1]), 1);
    }
}
