//! `StreamProcessor`: drives one of the three generators.

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;

use deepseek_recipe::response::chat::ChatGenerator;
use deepseek_recipe::response::messages::MessagesGenerator;
use deepseek_recipe::response::responses::ResponsesGenerator;
use deepseek_recipe::stream::InferenceChunk;
use deepseek_recipe::stream::processor::{StreamError, StreamProcessor};

use crate::tokenizer::PyTokenizer;
use super::generators::{
    PyChatCompletionChunk, PyChatCompletionChunkGenerator, PyMessagesChunkGenerator, PyMessagesStreamEvent,
    PyResponsesChunkGenerator, PyResponsesStreamEvent,
};
use super::options::{PyInferenceChunk, PyParsingOptions};

#[allow(clippy::large_enum_variant)] // one per Python object; boxing buys nothing
enum Processor {
    Chat(StreamProcessor<ChatGenerator>),
    Messages(StreamProcessor<MessagesGenerator>),
    Responses(StreamProcessor<ResponsesGenerator>),
}

#[pyclass(name = "StreamProcessor", module = "deepseek_recipe._native")]
pub struct PyStreamProcessor(Processor);

fn stream_error(e: StreamError) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

fn objects<T: pyo3::PyClass + Into<PyClassInitializer<T>>>(
    py: Python<'_>,
    events: Result<Vec<T>, StreamError>,
) -> PyResult<Vec<PyObject>> {
    events.map_err(stream_error)?.into_iter().map(|e| Ok(Py::new(py, e)?.into_any())).collect()
}

impl PyStreamProcessor {
    fn run(&mut self, py: Python<'_>, chunk: Option<InferenceChunk>) -> PyResult<Vec<PyObject>> {
        macro_rules! step {
            ($p:expr, $wrap:expr) => {{
                let result = py.allow_threads(|| match chunk {
                    Some(chunk) => $p.push(chunk),
                    None => $p.finish(),
                });
                objects(py, result.map(|events| events.into_iter().map($wrap).collect()))
            }};
        }
        match &mut self.0 {
            Processor::Chat(p) => step!(p, PyChatCompletionChunk),
            Processor::Messages(p) => step!(p, PyMessagesStreamEvent),
            Processor::Responses(p) => step!(p, PyResponsesStreamEvent),
        }
    }
}

#[pymethods]
impl PyStreamProcessor {
    #[new]
    #[pyo3(signature = (generator, options, tokenizer=None))]
    fn new(
        generator: &Bound<'_, PyAny>,
        options: PyRef<'_, PyParsingOptions>,
        tokenizer: Option<PyRef<'_, PyTokenizer>>,
    ) -> PyResult<Self> {
        let opts = &options.inner;
        let tok = tokenizer.map(|t| t.inner.clone());
        let processor = if let Ok(g) = generator.downcast::<PyChatCompletionChunkGenerator>() {
            Processor::Chat(StreamProcessor::new(g.get().0.take()?, opts, tok))
        } else if let Ok(g) = generator.downcast::<PyMessagesChunkGenerator>() {
            Processor::Messages(StreamProcessor::new(g.get().0.take()?, opts, tok))
        } else if let Ok(g) = generator.downcast::<PyResponsesChunkGenerator>() {
            Processor::Responses(StreamProcessor::new(g.get().build()?, opts, tok))
        } else {
            return Err(PyTypeError::new_err("expected a protocol chunk generator"));
        };
        Ok(Self(processor))
    }

    #[getter]
    fn finished(&self) -> bool {
        match &self.0 {
            Processor::Chat(p) => p.finished(),
            Processor::Messages(p) => p.finished(),
            Processor::Responses(p) => p.finished(),
        }
    }

    fn push(&mut self, py: Python<'_>, chunk: PyRef<'_, PyInferenceChunk>) -> PyResult<Vec<PyObject>> {
        let chunk = chunk.inner.clone();
        self.run(py, Some(chunk))
    }

    fn finish(&mut self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        self.run(py, None)
    }

    fn close(&mut self) {
        match &mut self.0 {
            Processor::Chat(p) => p.close(),
            Processor::Messages(p) => p.close(),
            Processor::Responses(p) => p.close(),
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStreamProcessor>()
}
