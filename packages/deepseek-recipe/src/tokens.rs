//! Special tokens of the DeepSeek V4 / V4.1 prompt formats and their (overridable) spellings.

/// A kind of special token the renderer and the stream parser know about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpecialToken {
    Bos,
    Eos,
    ThinkingStart,
    ThinkingEnd,
    System,
    User,
    Assistant,
    LatestReminder,
    Dsml,
    Image,
    Ref,
    RefEnd,
    Box,
    BoxEnd,
    Point,
    PointEnd,
    Polygon,
    PolygonEnd,
}

impl SpecialToken {
    pub const ALL: [SpecialToken; 18] = [
        Self::Bos,
        Self::Eos,
        Self::ThinkingStart,
        Self::ThinkingEnd,
        Self::System,
        Self::User,
        Self::Assistant,
        Self::LatestReminder,
        Self::Dsml,
        Self::Image,
        Self::Ref,
        Self::RefEnd,
        Self::Box,
        Self::BoxEnd,
        Self::Point,
        Self::PointEnd,
        Self::Polygon,
        Self::PolygonEnd,
    ];

    /// The spelling used by the released tokenizers.
    pub fn default_str(self) -> &'static str {
        match self {
            Self::Bos => "<｜begin▁of▁sentence｜>",
            Self::Eos => "<｜end▁of▁sentence｜>",
            Self::ThinkingStart => "<think>",
            Self::ThinkingEnd => "</think>",
            Self::System => "<｜System｜>",
            Self::User => "<｜User｜>",
            Self::Assistant => "<｜Assistant｜>",
            Self::LatestReminder => "<｜latest_reminder｜>",
            Self::Dsml => "｜DSML｜",
            Self::Image => "<｜image｜>",
            Self::Ref => "<｜ref｜>",
            Self::RefEnd => "<｜/ref｜>",
            Self::Box => "<｜box｜>",
            Self::BoxEnd => "<｜/box｜>",
            Self::Point => "<｜point｜>",
            Self::PointEnd => "<｜/point｜>",
            Self::Polygon => "<｜polygon｜>",
            Self::PolygonEnd => "<｜/polygon｜>",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The spelling of every special token; starts from the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialTokens {
    spellings: [String; 18],
}

impl Default for SpecialTokens {
    fn default() -> Self {
        Self { spellings: SpecialToken::ALL.map(|t| t.default_str().to_owned()) }
    }
}

impl SpecialTokens {
    pub fn token(&self, token: SpecialToken) -> &str {
        &self.spellings[token.index()]
    }

    /// Returns the mapping with `token` spelled `spelling`.
    pub fn with(mut self, token: SpecialToken, spelling: impl Into<String>) -> Self {
        self.spellings[token.index()] = spelling.into();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_keeps_other_defaults() {
        let st = SpecialTokens::default().with(SpecialToken::User, "[U]");
        assert_eq!(st.token(SpecialToken::User), "[U]");
        assert_eq!(st.token(SpecialToken::Bos), "<｜begin▁of▁sentence｜>");
    }
}
