//! Building message content from protocol content parts: text parts joined with blank lines,
//! images as placeholders (V4.1) or as a text marker (V4).

use crate::conversation::ModelVersion;
use crate::image_source::{ImageData, ImageDetail, ImageSource};
use crate::messages::ImageContent;

pub const UNSUPPORTED_IMAGE: &str = "[Unsupported Image]";

pub struct ContentBuilder<'a> {
    model_version: ModelVersion,
    image_token: &'a str,
    parts: Vec<String>,
    /// Indices into `parts` of the placeholders this builder inserted (typed text stays text).
    image_parts: Vec<usize>,
    sources: Vec<ImageSource>,
}

impl<'a> ContentBuilder<'a> {
    pub fn new(model_version: ModelVersion, image_token: &'a str) -> Self {
        Self { model_version, image_token, parts: Vec::new(), image_parts: Vec::new(), sources: Vec::new() }
    }

    pub fn text(&mut self, text: impl Into<String>) {
        self.parts.push(text.into());
    }

    pub fn supports_images(&self) -> bool {
        self.model_version == ModelVersion::DeepseekV41Flash
    }

    /// An image: a placeholder plus its source for V4.1, a text marker for V4.
    pub fn image(&mut self, data: ImageData, detail: ImageDetail, path: String) {
        if self.supports_images() {
            self.image_parts.push(self.parts.len());
            self.parts.push(self.image_token.to_owned());
            self.sources.push(ImageSource { data, detail, path });
        } else {
            self.parts.push(UNSUPPORTED_IMAGE.to_owned());
        }
    }

    /// Joins the parts with blank lines; each image's placeholder is the one inserted for it, even
    /// when user text also spells the image token.
    pub fn build(self) -> ImageContent {
        let mut text = String::new();
        let mut placeholders = Vec::with_capacity(self.image_parts.len());
        let mut images = self.image_parts.iter().peekable();
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                text.push_str("\n\n");
            }
            if images.next_if_eq(&&i).is_some() && !part.is_empty() {
                placeholders.push(text.len()..text.len() + part.len());
            }
            text.push_str(part);
        }
        ImageContent { text, image_sources: self.sources, placeholders }
    }
}
