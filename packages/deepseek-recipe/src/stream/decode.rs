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

/// Decodes token ids incrementally; caches the bytes of every id it has seen.
pub struct TokenDecoder {
    tokenizer: Tokenizer,
    byte_of: HashMap<char, u8>,
    cache: HashMap<u32, Box<[u8]>>,
    /// Bytes of an incomplete UTF-8 sequence at the end of the previous push.
    carry: Vec<u8>,
}

impl TokenDecoder {
    pub fn new(tokenizer: Tokenizer) -> Self {
        Self { tokenizer, byte_of: byte_level_decoder(), cache: HashMap::new(), carry: Vec::new() }
    }

    /// Whether `id` is an added (special) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.tokenizer.id_to_token(id).is_some_and(|t| self.tokenizer.added_token_id(&t) == Some(id))
    }

    fn token_bytes(&mut self, id: u32) -> &[u8] {
        if !self.cache.contains_key(&id) {
            let bytes: Vec<u8> = match self.tokenizer.id_to_token(id) {
                Some(piece) if self.tokenizer.added_token_id(&piece) == Some(id) => piece.into_bytes(),
                Some(piece) => piece
                    .chars()
                    .map(|c| self.byte_of.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| piece.into_bytes()),
                None => Vec::new(),
            };
            self.cache.insert(id, bytes.into_boxed_slice());
        }
        &self.cache[&id]
    }

    /// The text completed by this token; a trailing incomplete character waits for the next token.
    pub fn decode(&mut self, id: u32) -> String {
        let mut bytes = std::mem::take(&mut self.carry);
        let piece = self.token_bytes(id).to_vec();
        bytes.extend_from_slice(&piece);
        let keep = incomplete_tail(&bytes);
        self.carry = bytes.split_off(bytes.len() - keep);
        String::from_utf8_lossy(&bytes).into_owned()
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
