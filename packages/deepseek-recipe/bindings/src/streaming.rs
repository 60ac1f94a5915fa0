//! Output side of the Python API: parsing options, inference chunks, the stream processor, chunk
//! generators with their events and final responses, and images.

use pyo3::prelude::*;

pub mod generators;
mod images;
mod options;
mod processor;

#[allow(unused_imports)] // used by the conversion bindings
pub use generators::{PyChatCompletionChunkGenerator, PyMessagesChunkGenerator, PyResponsesChunkGenerator};
#[allow(unused_imports)]
pub use options::PyParsingOptions;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    options::register(m)?;
    generators::register(m)?;
    processor::register(m)?;
    images::register(m)?;
    Ok(())
}
