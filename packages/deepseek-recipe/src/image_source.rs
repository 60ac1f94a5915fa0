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
