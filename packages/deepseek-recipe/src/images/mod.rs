//! V4.1 images: token-count arithmetic, preprocessing (decode, resize, WebP), fetching and resolving
//! image sources into `MultiModalData`.

pub mod error;
pub mod fetch;
pub mod preprocess;
pub mod resolve;
pub mod tokens;

pub use error::{ImageError, ImageErrorKind};

/// A preprocessed image: encoded bytes and its size in pixels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    pub data: Vec<u8>,
    pub width: u32,
    pub height: u32,
}

/// Images in placeholder order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MultiModalData {
    pub images: Vec<ImageInfo>,
}

impl MultiModalData {
    /// Prompt tokens beyond the one placeholder token each image occupies.
    pub fn image_token_adjustment(&self) -> Result<u64, tokens::CalcResizeError> {
        self.images
            .iter()
            .try_fold(0, |sum, image| Ok(sum + tokens::calc_resize(image.width, image.height)?.tokens - 1))
    }
}
