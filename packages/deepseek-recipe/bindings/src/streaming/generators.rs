//! Chunk generators, their events and the final-response accumulators.

use std::sync::Mutex;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use deepseek_recipe::response::chat::{ChatChunk, ChatConfig, ChatGenerator, ChatResponse};
use deepseek_recipe::response::messages::{MessagesEvent, MessagesGenerator, MessagesResponse};
use deepseek_recipe::response::responses::{
    ResponsesConfig, ResponsesEvent, ResponsesGenerator, ResponsesResponse,
};
use deepseek_recipe::stream::PromptUsage;

use crate::conversion::PyResponsesEcho;

/// A generator that a stream processor or a builder consumes exactly once.
pub struct Once<T>(Mutex<Option<T>>);

impl<T> Once<T> {
    pub fn new(value: T) -> Self {
        Self(Mutex::new(Some(value)))
    }

    pub fn take(&self) -> PyResult<T> {
        self.0
            .lock()
            .ok()
            .and_then(|mut slot| slot.take())
            .ok_or_else(|| PyRuntimeError::new_err("chunk generator has been consumed"))
    }
}

#[pyclass(name = "ChatCompletionChunkGenerator", module = "deepseek_recipe._native", frozen)]
pub struct PyChatCompletionChunkGenerator(pub Once<ChatGenerator>);

impl PyChatCompletionChunkGenerator {
    pub fn from_config(config: ChatConfig, id: &str, model: &str) -> Self {
        Self(Once::new(ChatGenerator::new(config, id, model)))
    }
}

#[pyclass(name = "MessagesChunkGenerator", module = "deepseek_recipe._native", frozen)]
pub struct PyMessagesChunkGenerator(pub Once<MessagesGenerator>);

#[pymethods]
impl PyMessagesChunkGenerator {
    #[new]
    fn new(id: &str, model: &str, thinking_mode: bool) -> Self {
        Self(Once::new(MessagesGenerator::new(id, model, thinking_mode)))
    }

    fn with_signature(&self, signature: &str) -> PyResult<Self> {
        Ok(Self(Once::new(self.0.take()?.with_signature(signature))))
    }
}

/// A Responses generator is built at the end, once the builders have set its configuration.
pub struct ResponsesSpec {
    config: ResponsesConfig,
    id: String,
    model: String,
}

#[pyclass(name = "ResponsesChunkGenerator", module = "deepseek_recipe._native", frozen)]
pub struct PyResponsesChunkGenerator(pub Once<ResponsesSpec>);

impl PyResponsesChunkGenerator {
    pub fn from_config(config: ResponsesConfig, id: &str, model: &str) -> Self {
        Self(Once::new(ResponsesSpec { config, id: id.to_owned(), model: model.to_owned() }))
    }

    pub fn build(&self) -> PyResult<ResponsesGenerator> {
        let spec = self.0.take()?;
        Ok(ResponsesGenerator::new(spec.config, spec.id, spec.model))
    }
}

#[pymethods]
impl PyResponsesChunkGenerator {
    fn with_echo(&self, echo: PyRef<'_, PyResponsesEcho>) -> PyResult<Self> {
        let mut spec = self.0.take()?;
        spec.config.echo = echo.inner.clone();
        Ok(Self(Once::new(spec)))
    }

    fn with_namespace_tool_map(
        &self,
        namespace_tool_map: std::collections::HashMap<String, (String, String)>,
    ) -> PyResult<Self> {
        let mut spec = self.0.take()?;
        spec.config.namespace_tool_map = namespace_tool_map;
        Ok(Self(Once::new(spec)))
    }
}

macro_rules! event_class {
    ($py:ident, $name:literal, $inner:ty) => {
        #[pyclass(name = $name, module = "deepseek_recipe._native", frozen)]
        pub struct $py(pub $inner);

        #[pymethods]
        impl $py {
            fn to_json(&self) -> String {
                self.0.to_json()
            }
        }
    };
}

event_class!(PyChatCompletionChunk, "ChatCompletionChunk", ChatChunk);
event_class!(PyMessagesStreamEvent, "MessagesStreamEvent", MessagesEvent);
event_class!(PyResponsesStreamEvent, "ResponsesStreamEvent", ResponsesEvent);

#[pyclass(name = "ChatCompletionResponse", module = "deepseek_recipe._native")]
pub struct PyChatCompletionResponse(ChatResponse);

#[pymethods]
impl PyChatCompletionResponse {
    #[new]
    #[allow(unused_variables)] // usage comes from the final chunk
    fn new(id: &str, model: &str, created: u64, prompt_tokens: u64, prompt_cache_hit_tokens: u64) -> Self {
        Self(ChatResponse::new(id, model, created))
    }
    fn accumulate(&mut self, chunk: PyRef<'_, PyChatCompletionChunk>) {
        self.0.accumulate(&chunk.0);
    }
    fn to_json(&self) -> String {
        self.0.to_json()
    }
    #[staticmethod]
    #[allow(unused_variables)]
    fn sse_event_name(chunk: PyRef<'_, PyChatCompletionChunk>) -> Option<String> {
        None
    }
    #[staticmethod]
    fn sse_done_data() -> Option<&'static str> {
        Some("[DONE]")
    }
}

#[pyclass(name = "MessagesResponse", module = "deepseek_recipe._native")]
pub struct PyMessagesResponse(MessagesResponse);

#[pymethods]
impl PyMessagesResponse {
    #[new]
    #[allow(unused_variables)]
    fn new(id: &str, model: &str, created: u64, prompt_tokens: u64, prompt_cache_hit_tokens: u64) -> Self {
        Self(MessagesResponse::new(id, model, PromptUsage { prompt_tokens, prompt_cache_hit_tokens }))
    }
    fn accumulate(&mut self, chunk: PyRef<'_, PyMessagesStreamEvent>) {
        self.0.accumulate(&chunk.0);
    }
    fn to_json(&self) -> String {
        self.0.to_json()
    }
    #[staticmethod]
    fn sse_event_name(chunk: PyRef<'_, PyMessagesStreamEvent>) -> Option<String> {
        Some(chunk.0.event_type().to_owned())
    }
    #[staticmethod]
    fn sse_done_data() -> Option<&'static str> {
        None
    }
}

#[pyclass(name = "ResponsesResponse", module = "deepseek_recipe._native")]
pub struct PyResponsesResponse(ResponsesResponse);

#[pymethods]
impl PyResponsesResponse {
    #[new]
    #[allow(unused_variables)]
    fn new(id: &str, model: &str, created: u64, prompt_tokens: u64, prompt_cache_hit_tokens: u64) -> Self {
        Self(ResponsesResponse::new(id, model, created))
    }
    fn accumulate(&mut self, chunk: PyRef<'_, PyResponsesStreamEvent>) {
        self.0.accumulate(&chunk.0);
    }
    fn to_json(&self) -> String {
        self.0.to_json()
    }
    #[staticmethod]
    fn sse_event_name(chunk: PyRef<'_, PyResponsesStreamEvent>) -> Option<String> {
        Some(chunk.0.event_type().to_owned())
    }
    #[staticmethod]
    fn sse_done_data() -> Option<&'static str> {
        None
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyChatCompletionChunkGenerator>()?;
    m.add_class::<PyMessagesChunkGenerator>()?;
    m.add_class::<PyResponsesChunkGenerator>()?;
    m.add_class::<PyChatCompletionChunk>()?;
    m.add_class::<PyMessagesStreamEvent>()?;
    m.add_class::<PyResponsesStreamEvent>()?;
    m.add_class::<PyChatCompletionResponse>()?;
    m.add_class::<PyMessagesResponse>()?;
    m.add_class::<PyResponsesResponse>()?;
    Ok(())
}
