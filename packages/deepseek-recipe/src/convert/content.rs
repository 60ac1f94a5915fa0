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
    sources: Vec<ImageSource>,
}

impl<'a> ContentBuilder<'a> {
    pub fn new(model_version: ModelVersion, image_token: &'a str) -> Self {
        Self { model_version, image_token, parts: Vec::new(), sources: Vec::new() }
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
            self.parts.push(self.image_token.to_owned());
            self.sources.push(ImageSource { data, detail, path });
        } else {
            self.parts.push(UNSUPPORTED_IMAGE.to_owned());
        }
    }

    pub fn build(self) -> ImageContent {
        let text = self.parts.join("\n\n");
        match ImageContent::with_images(text.clone(), self.sources.clone(), Some(self.image_token)) {
            Ok(content) => content,
            // An empty image spelling cannot mark placeholders; keep the sources anyway.
            Err(_) => ImageContent { text, image_sources: self.sources, placeholders: Vec::new() },
        }
    }
}
