//! Image preprocessing: decode (png, jpeg, webp, gif), check limits, shrink low-detail images, resize
//! to the token rule's size and re-encode as WebP.

use std::io::Cursor;

use image::imageops::FilterType;
use image::{DynamicImage, ImageFormat, ImageReader};

use super::error::{ImageError, ImageErrorKind};
use super::tokens::calc_resize;
use super::ImageInfo;
use crate::image_source::ImageDetail;

/// WebP cannot store a side above 16383 px; sizes are capped to the largest multiple of 14 below.
const MAX_WEBP_SIDE: u32 = 16380;
/// The vision encoder needs at least two patches per side.
const MIN_SIDE: u32 = 28;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreprocessOptions {
    pub detail: ImageDetail,
    /// Larger inputs are rejected.
    pub max_dimension_px: u32,
    /// Low-detail inputs are first shrunk to fit this.
    pub low_detail_max_dimension_px: u32,
}

impl PreprocessOptions {
    /// What the resolver uses for a source with this detail.
    pub fn for_detail(detail: ImageDetail) -> Self {
        Self { detail, max_dimension_px: 8192, low_detail_max_dimension_px: 512 }
    }
}

fn error(kind: ImageErrorKind, detail: impl std::fmt::Display) -> ImageError {
    ImageError::new(kind, detail.to_string())
}

fn decode(data: &[u8]) -> Result<DynamicImage, ImageError> {
    if data.is_empty() {
        return Err(error(ImageErrorKind::EmptyImage, "empty image"));
    }
    let format = image::guess_format(data).map_err(|e| error(ImageErrorKind::UnsupportedMediaType, e))?;
    if !matches!(format, ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif) {
        return Err(error(ImageErrorKind::UnsupportedMediaType, format!("{format:?}")));
    }
    ImageReader::with_format(Cursor::new(data), format).decode().map_err(|e| error(ImageErrorKind::Decode, e))
}

/// `(width, height)` scaled so the longer side is at most `limit`.
fn fit_within(width: u32, height: u32, limit: u32) -> (u32, u32) {
    let longest = width.max(height);
    if longest <= limit {
        return (width, height);
    }
    let scale = f64::from(limit) / f64::from(longest);
    let side = |v: u32| ((f64::from(v) * scale).round() as u32).max(1);
    (side(width), side(height))
}

pub fn preprocess(data: &[u8], options: &PreprocessOptions) -> Result<ImageInfo, ImageError> {
    let image = decode(data)?;
    let (width, height) = (image.width(), image.height());
    if width.max(height) > options.max_dimension_px {
        return Err(error(ImageErrorKind::ImageDimensionsTooLarge, format!("{width}x{height}")));
    }
    let (width, height) = match options.detail {
        ImageDetail::Low => fit_within(width, height, options.low_detail_max_dimension_px),
        _ => (width, height),
    };
    let target = calc_resize(width, height).map_err(|e| error(ImageErrorKind::Decode, e))?;
    let side = |v: u32| v.clamp(MIN_SIDE, MAX_WEBP_SIDE);
    let (w, h) = (side(target.width), side(target.height));
    let resized = image.resize_exact(w, h, FilterType::Triangle).into_rgb8();
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgb8(resized)
        .write_to(&mut out, ImageFormat::WebP)
        .map_err(|e| error(ImageErrorKind::Encode, e))?;
    Ok(ImageInfo { data: out.into_inner(), width: w, height: h })
}
