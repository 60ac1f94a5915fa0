//! Image sources attached to messages: plain data, resolved later by the image pipeline.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ImageDetail {
    Low,
    #[default]
    High,
    Original,
    Auto,
}

impl ImageDetail {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::High => "high",
            Self::Original => "original",
            Self::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "low" => Ok(Self::Low),
            "high" => Ok(Self::High),
            "original" => Ok(Self::Original),
            "auto" => Ok(Self::Auto),
            _ => Err(format!(
                "invalid detail \"{s}\"; expected \"low\", \"high\", \"original\", or \"auto\""
            )),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageData {
    DataUrl(String),
    Url(String),
    Bytes(Vec<u8>),
}

/// Where an image comes from, its requested detail and its location in the request (for errors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSource {
    pub data: ImageData,
    pub detail: ImageDetail,
    pub path: String,
}

impl ImageSource {
    pub fn kind(&self) -> &'static str {
        match self.data {
            ImageData::DataUrl(_) => "data_url",
            ImageData::Url(_) => "url",
            ImageData::Bytes(_) => "bytes",
        }
    }
}

/// Media types an image data URL may declare (compared without case and parameters).
const DATA_URL_IMAGE_TYPES: [&str; 5] = ["image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif"];

/// Why an image URL of a protocol request is rejected at conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageUrlError {
    /// Neither an `http…` URL nor a base64 data URL.
    UnsupportedFormat,
    /// A base64 data URL of a media type that is not an accepted image format.
    UnsupportedImage,
    /// A base64 data URL whose payload does not decode.
    InvalidBase64,
}

impl std::fmt::Display for ImageUrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::UnsupportedFormat => "Unsupported image_url format",
            Self::UnsupportedImage => {
                "You have uploaded an unsupported image. Please make sure your image is valid and has one of the \
                 following formats: webp, png, jpeg, and gif."
            }
            Self::InvalidBase64 => "Invalid base64 data",
        })
    }
}

/// `text` starts with `prefix`, ignoring ASCII case.
pub fn starts_with_ignore_case(text: &str, prefix: &str) -> bool {
    text.as_bytes().get(..prefix.len()).is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
}

impl ImageData {
    /// Classifies a Chat / Responses `image_url` the way the official converter does: anything that
    /// starts with `http` (any case) is fetched later; otherwise it must be a base64 data URL (surrounding
    /// whitespace allowed, `data:` in any case) of an accepted image type whose payload decodes.
    pub fn from_image_url(url: String) -> Result<Self, ImageUrlError> {
        if starts_with_ignore_case(&url, "http") {
            return Ok(Self::Url(url));
        }
        let trimmed = url.trim_matches(|c: char| c <= ' ');
        let (meta, payload) = trimmed
            .get(5..)
            .filter(|_| starts_with_ignore_case(trimmed, "data:"))
            .and_then(|rest| rest.split_once(','))
            .ok_or(ImageUrlError::UnsupportedFormat)?;
        let media_type = meta.strip_suffix(";base64").ok_or(ImageUrlError::UnsupportedFormat)?;
        let essence = media_type.split(';').next().unwrap_or_default().trim();
        if !DATA_URL_IMAGE_TYPES.iter().any(|t| t.eq_ignore_ascii_case(essence)) {
            return Err(ImageUrlError::UnsupportedImage);
        }
        if !is_forgiving_base64(payload) {
            return Err(ImageUrlError::InvalidBase64);
        }
        Ok(Self::DataUrl(url))
    }
}

/// Whether `payload` decodes as "forgiving" base64 (WHATWG): ASCII whitespace ignored, padding optional
/// but, when present, only where it completes a 4-character group.
fn is_forgiving_base64(payload: &str) -> bool {
    let mut chars: Vec<u8> = payload.bytes().filter(|b| !b" \t\n\x0c\r".contains(b)).collect();
    if chars.len() % 4 == 0 {
        let padding = chars.iter().rev().take(2).take_while(|&&b| b == b'=').count();
        chars.truncate(chars.len() - padding);
    }
    chars.len() % 4 != 1 && chars.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_urls_are_classified_like_the_official() {
        let classify = |u: &str| ImageData::from_image_url(u.to_owned()).map(|d| ImageSource {
            data: d,
            detail: ImageDetail::High,
            path: String::new(),
        });
        for ok in ["HTTP://x", "httpx://x", "http", " data:IMAGE/PNG;base64,", "data:image/jpg;charset=x;base64,ab\ncd"] {
            assert!(classify(ok).is_ok(), "{ok}");
        }
        for (url, err) in [
            (" http://x", ImageUrlError::UnsupportedFormat),
            ("data:image/png,abc", ImageUrlError::UnsupportedFormat),
            ("data:image/png;BASE64,", ImageUrlError::UnsupportedFormat),
            ("data:", ImageUrlError::UnsupportedFormat),
            ("data:image/bmp;base64,", ImageUrlError::UnsupportedImage),
            ("data:;base64,xx", ImageUrlError::UnsupportedImage),
            ("data:image/png;base64,x", ImageUrlError::InvalidBase64),
            ("data:image/png;base64,xx=", ImageUrlError::InvalidBase64),
            ("data:image/png;base64,-_-_", ImageUrlError::InvalidBase64),
        ] {
            assert_eq!(classify(url).unwrap_err(), err, "{url}");
        }
        for ok in ["xx", "xxx=", "xx==", " abcd", "abcd "] {
            assert!(is_forgiving_base64(ok), "{ok}");
        }
        for bad in ["abcd=", "a b=", "x", "xy,"] {
            assert!(!is_forgiving_base64(bad), "{bad}");
        }
    }
}
