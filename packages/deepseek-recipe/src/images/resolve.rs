//! Resolving image sources (data URLs, URLs, bytes) into preprocessed images, with a per-request quota.

use base64::Engine;

use super::error::{ImageError, ImageErrorKind};
use super::fetch::ImageFetcher;
use super::preprocess::{preprocess, PreprocessOptions};
use super::{ImageInfo, MultiModalData};
use crate::image_source::{ImageData, ImageSource};

/// Images and received (encoded) bytes recorded by the completed resolve calls of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImageQuota {
    pub image_count: u64,
    pub byte_size: u64,
}

/// The bytes of a base64 `data:` URL with an image media type.
pub fn decode_data_url(url: &str) -> Result<Vec<u8>, ImageError> {
    let invalid = |d: &str| ImageError::new(ImageErrorKind::InvalidDataUrl, d);
    let rest = url.strip_prefix("data:").ok_or_else(|| invalid("not a data URL"))?;
    let (meta, payload) = rest.split_once(',').ok_or_else(|| invalid("data URL without a comma"))?;
    let (media_type, base64) = match meta.strip_suffix(";base64") {
        Some(media_type) => (media_type, true),
        None => (meta, false),
    };
    if !media_type.starts_with("image/") || !base64 {
        return Err(ImageError::new(ImageErrorKind::UnsupportedMediaType, meta));
    }
    base64::engine::general_purpose::STANDARD.decode(payload.trim()).map_err(|e| invalid(&e.to_string()))
}

fn is_http(url: &str) -> bool {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// Resolves `sources` in order; the quota changes only when every source succeeded.
pub fn resolve(
    sources: &[ImageSource],
    quota: &mut ImageQuota,
    fetcher: &ImageFetcher,
) -> Result<MultiModalData, ImageError> {
    let mut images: Vec<ImageInfo> = Vec::with_capacity(sources.len());
    let mut byte_size = 0u64;
    for (index, source) in sources.iter().enumerate() {
        let bytes = match &source.data {
            ImageData::DataUrl(url) => decode_data_url(url),
            ImageData::Url(url) if is_http(url) => fetcher.fetch(url),
            ImageData::Url(url) => Err(ImageError::new(ImageErrorKind::InvalidUrl, url.as_str())),
            ImageData::Bytes(bytes) => Ok(bytes.clone()),
        };
        let image = bytes
            .and_then(|b| {
                byte_size += b.len() as u64;
                preprocess(&b, &PreprocessOptions::for_detail(source.detail))
            })
            .map_err(|e| e.at(index))?;
        images.push(image);
    }
    quota.image_count += images.len() as u64;
    // The quota counts the images as received (decoded data URLs, fetched or given bytes).
    quota.byte_size += byte_size;
    Ok(MultiModalData { images })
}
