//! Image errors: a kind (the protocol-visible classification) and the index of the failing image.

/// What went wrong with an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageErrorKind {
    EmptyImage,
    UnsupportedMediaType,
    Decode,
    Encode,
    InvalidDataUrl,
    InvalidUrl,
    ImageDimensionsTooLarge,
    TooLarge,
    Fetch,
    DestinationRejected,
}

impl ImageErrorKind {
    pub fn name(&self) -> &'static str {
        match self {
            Self::EmptyImage => "EmptyImage",
            Self::UnsupportedMediaType => "UnsupportedMediaType",
            Self::Decode => "Decode",
            Self::Encode => "Encode",
            Self::InvalidDataUrl => "InvalidDataUrl",
            Self::InvalidUrl => "InvalidUrl",
            Self::ImageDimensionsTooLarge => "ImageDimensionsTooLarge",
            Self::TooLarge => "TooLarge",
            Self::Fetch => "Fetch",
            Self::DestinationRejected => "DestinationRejected",
        }
    }

    /// Only network failures are worth retrying.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Fetch)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageError {
    pub kind: ImageErrorKind,
    /// Position of the image among the resolved sources.
    pub index: usize,
    /// The URL for URL and download errors; otherwise internal detail that clients never see.
    pub detail: String,
}

impl std::fmt::Display for ImageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self { kind, index, detail } = self;
        match kind {
            ImageErrorKind::InvalidUrl => write!(f, "invalid url: \"{detail}\""),
            ImageErrorKind::Fetch | ImageErrorKind::DestinationRejected | ImageErrorKind::TooLarge => {
                write!(f, "image[{index}]: Failed to download image from {detail}")
            }
            _ => write!(
                f,
                "image[{index}]: You have uploaded an unsupported image. Please make sure your image is valid \
                 and has one of the following formats: webp, png, jpeg, and gif."
            ),
        }
    }
}

impl std::error::Error for ImageError {}

impl ImageError {
    pub fn new(kind: ImageErrorKind, detail: impl Into<String>) -> Self {
        Self { kind, index: 0, detail: detail.into() }
    }

    pub fn at(mut self, index: usize) -> Self {
        self.index = index;
        self
    }
}
