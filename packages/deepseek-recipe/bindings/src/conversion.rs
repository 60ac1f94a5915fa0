//! Protocol request classes, `ConversionOptions`, `ConversationRequest` and `ConversionError`.

use std::collections::BTreeMap;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use deepseek_recipe::conversation::{
    ConversationRequest, Echo, InferenceOptions, ModelVersion, OutputConstraint,
};
use deepseek_recipe::convert::{self, chat, messages, responses, Body};
use deepseek_recipe::error::{ConversionError as RustConversionError, RequestParseError};
use deepseek_recipe::options::{
    ConversionOptions, ReasoningContentBehavior, ThinkingInitialStage, WebSearchBehavior,
};
use deepseek_recipe::response::chat::ChatConfig;
use deepseek_recipe::response::messages::MessagesGenerator;
use deepseek_recipe::response::responses::{custom_tool_names, ResponsesConfig};

use crate::mirror::py_enum;
use crate::render::PyConversation;
use crate::streaming::generators::Once;
use crate::streaming::{
    PyChatCompletionChunkGenerator, PyMessagesChunkGenerator, PyParsingOptions, PyResponsesChunkGenerator,
};
use crate::tokens::PySpecialTokens;
use crate::value::to_value;

create_exception!(_native, ConversionError, PyException, "A protocol request is invalid or cannot be converted.");

/// Raises `ConversionError` carrying the HTTP status code and the JSON error body.
pub fn conversion_error(py: Python<'_>, error: RustConversionError) -> PyErr {
    let err = ConversionError::new_err(error.message.clone());
    let value = err.value(py);
    let set = value
        .setattr("status_code", error.status_code)
        .and_then(|_| value.setattr("body", error.body()));
    match set {
        Ok(()) => err,
        Err(e) => e,
    }
}

fn parse_error(error: RequestParseError) -> PyErr {
    PyValueError::new_err(error.to_string())
}

/// Parses a request body given as `dict` (any JSON-like object), JSON `str` or UTF-8 `bytes`.
fn parse_body<T: serde::de::DeserializeOwned>(body: &Bound<'_, PyAny>) -> PyResult<T> {
    let parsed = if let Ok(text) = body.downcast::<PyString>() {
        convert::parse_body(Body::Text(text.to_str()?.as_bytes()))
    } else if let Ok(bytes) = body.downcast::<PyBytes>() {
        convert::parse_body(Body::Text(bytes.as_bytes()))
    } else {
        convert::parse_body(Body::Json(to_value(body)?))
    };
    parsed.map_err(parse_error)
}

fn consumed() -> PyErr {
    PyRuntimeError::new_err("protocol request has been consumed")
}

py_enum!(PyModelVersion mirrors ModelVersion as "ModelVersion" { DeepseekV4Pro, DeepseekV41Flash });
py_enum!(PyWebSearchBehavior mirrors WebSearchBehavior as "WebSearchBehavior" { Drop, Reject });
py_enum!(
    PyReasoningContentBehavior mirrors ReasoningContentBehavior as "ReasoningContentBehavior" {
        FillEmpty, Reject,
    }
);

#[pyclass(name = "ConversionOptions", module = "deepseek_recipe._native", frozen)]
#[derive(Clone)]
pub struct PyConversionOptions {
    pub inner: ConversionOptions,
}

impl PyConversionOptions {
    fn with(&self, change: impl FnOnce(&mut ConversionOptions)) -> Self {
        let mut inner = self.inner.clone();
        change(&mut inner);
        Self { inner }
    }
}

#[pymethods]
impl PyConversionOptions {
    #[new]
    #[pyo3(signature = (*, default_thinking_mode=true,
        reasoning_content_behavior=PyReasoningContentBehavior::FillEmpty,
        responses_web_search=PyWebSearchBehavior::Drop, messages_web_search=PyWebSearchBehavior::Reject,
        thinking_max_tokens_upper_bound=deepseek_recipe::options::DEFAULT_MAX_TOKENS_UPPER_BOUND,
        non_thinking_max_tokens_upper_bound=deepseek_recipe::options::DEFAULT_MAX_TOKENS_UPPER_BOUND))]
    fn new(
        default_thinking_mode: bool,
        reasoning_content_behavior: PyReasoningContentBehavior,
        responses_web_search: PyWebSearchBehavior,
        messages_web_search: PyWebSearchBehavior,
        thinking_max_tokens_upper_bound: u32,
        non_thinking_max_tokens_upper_bound: u32,
    ) -> Self {
        Self {
            inner: ConversionOptions {
                default_thinking_mode,
                reasoning_content_behavior: reasoning_content_behavior.into(),
                responses_web_search: responses_web_search.into(),
                messages_web_search: messages_web_search.into(),
                thinking_max_tokens_upper_bound,
                non_thinking_max_tokens_upper_bound,
                ..ConversionOptions::default()
            },
        }
    }
    #[getter]
    fn default_thinking_mode(&self) -> bool {
        self.inner.default_thinking_mode
    }
    #[getter]
    fn reasoning_content_behavior(&self) -> PyReasoningContentBehavior {
        self.inner.reasoning_content_behavior.into()
    }
    #[getter]
    fn responses_web_search(&self) -> PyWebSearchBehavior {
        self.inner.responses_web_search.into()
    }
    #[getter]
    fn messages_web_search(&self) -> PyWebSearchBehavior {
        self.inner.messages_web_search.into()
    }
    #[getter]
    fn thinking_max_tokens_upper_bound(&self) -> u32 {
        self.inner.thinking_max_tokens_upper_bound
    }
    #[getter]
    fn non_thinking_max_tokens_upper_bound(&self) -> u32 {
        self.inner.non_thinking_max_tokens_upper_bound
    }
    #[getter]
    fn model_versions_by_name(&self) -> BTreeMap<String, PyModelVersion> {
        let versions = self.inner.model_versions_by_name.iter();
        versions.map(|(name, &version)| (name.clone(), version.into())).collect()
    }
    #[getter]
    fn special_tokens(&self) -> PySpecialTokens {
        PySpecialTokens { inner: self.inner.special_tokens.clone() }
    }
    fn with_default_thinking_mode(&self, default_thinking_mode: bool) -> Self {
        self.with(|o| o.default_thinking_mode = default_thinking_mode)
    }
    fn with_reasoning_content_behavior(&self, reasoning_content_behavior: PyReasoningContentBehavior) -> Self {
        self.with(|o| o.reasoning_content_behavior = reasoning_content_behavior.into())
    }
    fn with_responses_web_search(&self, responses_web_search: PyWebSearchBehavior) -> Self {
        self.with(|o| o.responses_web_search = responses_web_search.into())
    }
    fn with_messages_web_search(&self, messages_web_search: PyWebSearchBehavior) -> Self {
        self.with(|o| o.messages_web_search = messages_web_search.into())
    }
    fn with_special_tokens(&self, special_tokens: &PySpecialTokens) -> Self {
        self.with(|o| o.special_tokens = special_tokens.inner.clone())
    }
    fn with_model_alias(&self, model: String, model_version: PyModelVersion) -> Self {
        self.with(|o| {
            o.model_versions_by_name.insert(model, model_version.into());
        })
    }
    fn with_model_versions_by_name(&self, model_versions_by_name: BTreeMap<String, PyModelVersion>) -> Self {
        let versions = model_versions_by_name.into_iter().map(|(name, v)| (name, v.into())).collect();
        self.with(|o| o.model_versions_by_name = versions)
    }
    fn with_thinking_max_tokens_upper_bound(&self, thinking_max_tokens_upper_bound: u32) -> Self {
        self.with(|o| o.thinking_max_tokens_upper_bound = thinking_max_tokens_upper_bound)
    }
    fn with_non_thinking_max_tokens_upper_bound(&self, non_thinking_max_tokens_upper_bound: u32) -> Self {
        self.with(|o| o.non_thinking_max_tokens_upper_bound = non_thinking_max_tokens_upper_bound)
    }
}

#[pyclass(name = "OutputConstraint", module = "deepseek_recipe._native", frozen)]
pub struct PyOutputConstraint {
    inner: OutputConstraint,
}

#[pymethods]
impl PyOutputConstraint {
    #[getter]
    fn kind(&self) -> &str {
        &self.inner.kind
    }
    #[getter]
    fn schema(&self) -> &str {
        &self.inner.schema
    }
}

#[pyclass(name = "InferenceOptions", module = "deepseek_recipe._native", frozen)]
pub struct PyInferenceOptions {
    inner: InferenceOptions,
}

#[pymethods]
impl PyInferenceOptions {
    #[getter]
    fn max_tokens(&self) -> Option<u32> {
        self.inner.max_tokens
    }
    #[getter]
    fn temperature(&self) -> Option<f64> {
        self.inner.temperature
    }
    #[getter]
    fn top_p(&self) -> Option<f64> {
        self.inner.top_p
    }
    #[getter]
    fn logprobs(&self) -> bool {
        self.inner.logprobs
    }
    #[getter]
    fn top_logprobs(&self) -> Option<u32> {
        self.inner.top_logprobs
    }
    #[getter]
    fn seed(&self) -> Option<u64> {
        self.inner.seed
    }
    #[getter]
    fn output_constraint(&self) -> Option<PyOutputConstraint> {
        self.inner.output_constraint.clone().map(|inner| PyOutputConstraint { inner })
    }
}

#[pyclass(name = "ConversationRequest", module = "deepseek_recipe._native", frozen)]
pub struct PyConversationRequest {
    pub inner: ConversationRequest,
}

#[pymethods]
impl PyConversationRequest {
    #[new]
    fn new(conversation: &PyConversation, model_version: PyModelVersion) -> Self {
        Self { inner: ConversationRequest::new(conversation.inner.clone(), model_version.into()) }
    }
    #[getter]
    fn conversation(&self) -> PyConversation {
        PyConversation { inner: self.inner.conversation.clone() }
    }
    #[getter]
    fn inference_options(&self) -> PyInferenceOptions {
        PyInferenceOptions { inner: self.inner.inference_options.clone() }
    }
    #[getter]
    fn parsing_options(&self) -> PyParsingOptions {
        PyParsingOptions { inner: self.inner.parsing_options.clone() }
    }
    #[getter]
    fn model_version(&self) -> PyModelVersion {
        self.inner.model_version.into()
    }
    #[getter]
    fn stream(&self) -> bool {
        self.inner.stream
    }
    fn resolve_max_tokens(&self, py: Python<'_>, prompt_tokens: u64, context_limit: u64) -> PyResult<u64> {
        self.inner
            .resolve_max_tokens(prompt_tokens, context_limit)
            .map_err(|e| conversion_error(py, e))
    }
}

/// Defines a protocol request pyclass: built from a request body, it reports its `model` and is
/// consumed by `convert`. Protocol-specific methods follow in the braces.
macro_rules! protocol_request {
    ($py_name:tt, $name:ident, $request:ty, { $($methods:tt)* }) => {
        #[pyclass(name = $py_name, module = "deepseek_recipe._native")]
        pub struct $name {
            request: Option<$request>,
        }

        impl $name {
            fn unconsumed(&self) -> PyResult<&$request> {
                self.request.as_ref().ok_or_else(consumed)
            }
        }

        #[pymethods]
        impl $name {
            #[new]
            fn new(body: &Bound<'_, PyAny>) -> PyResult<Self> {
                Ok(Self { request: Some(parse_body(body)?) })
            }
            #[getter]
            fn model(&self) -> PyResult<String> {
                Ok(self.unconsumed()?.model.clone())
            }
            fn convert(&mut self, py: Python<'_>, options: &PyConversionOptions) -> PyResult<PyConversationRequest> {
                let request = self.request.take().ok_or_else(consumed)?;
                let inner = request.convert(&options.inner).map_err(|e| conversion_error(py, e))?;
                Ok(PyConversationRequest { inner })
            }
            $($methods)*
        }
    };
}

protocol_request!("ChatCompletionRequest", PyChatCompletionRequest, chat::ChatCompletionRequest, {
    #[staticmethod]
    fn chunk_generator(request: &PyConversationRequest, id: &str, model: &str) -> PyChatCompletionChunkGenerator {
        let r = &request.inner;
        let config = ChatConfig {
            thinking_mode: r.conversation.thinking_mode,
            reasoning: r.parsing_options.thinking_initial_stage.is_some_and(ThinkingInitialStage::starts_in_reasoning),
            omit_usage: r.stream && !r.include_usage,
        };
        PyChatCompletionChunkGenerator::from_config(config, id, model)
    }
});

protocol_request!("MessagesRequest", PyMessagesRequest, messages::MessagesRequest, {
    #[staticmethod]
    fn chunk_generator(request: &PyConversationRequest, id: &str, model: &str) -> PyMessagesChunkGenerator {
        let thinking_mode = request.inner.conversation.thinking_mode;
        PyMessagesChunkGenerator(Once::new(MessagesGenerator::new(id, model, thinking_mode)))
    }
});

#[pyclass(name = "ResponsesEcho", module = "deepseek_recipe._native", frozen)]
#[derive(Clone)]
pub struct PyResponsesEcho {
    pub inner: Echo,
}

#[pymethods]
impl PyResponsesEcho {
    #[new]
    fn new() -> Self {
        Self { inner: Echo::default() }
    }
    #[getter]
    fn instructions(&self) -> Option<&str> {
        self.inner.instructions.as_deref()
    }
    #[getter]
    fn max_output_tokens(&self) -> Option<u64> {
        self.inner.max_output_tokens
    }
    #[getter]
    fn temperature(&self) -> f64 {
        self.inner.temperature
    }
    #[getter]
    fn top_p(&self) -> f64 {
        self.inner.top_p
    }
    #[getter]
    fn top_logprobs(&self) -> u64 {
        self.inner.top_logprobs
    }
    #[getter]
    fn user(&self) -> Option<&str> {
        self.inner.user.as_deref()
    }
}

protocol_request!("ResponsesRequest", PyResponsesRequest, responses::ResponsesRequest, {
    fn echo(&self) -> PyResult<PyResponsesEcho> {
        Ok(PyResponsesEcho { inner: self.unconsumed()?.echo() })
    }
    fn namespace_tool_map(
        &self,
        py: Python<'_>,
        options: &PyConversionOptions,
    ) -> PyResult<BTreeMap<String, (String, String)>> {
        self.unconsumed()?.namespace_tool_map(&options.inner).map_err(|e| conversion_error(py, e))
    }
    #[staticmethod]
    fn chunk_generator(request: &PyConversationRequest, id: &str, model: &str) -> PyResponsesChunkGenerator {
        let r = &request.inner;
        let config = ResponsesConfig {
            thinking_mode: r.conversation.thinking_mode,
            echo: r.responses_echo.clone(),
            namespace_tool_map: r.namespace_tool_map.clone(),
            custom_tools: custom_tool_names(&r.responses_echo.tools),
        };
        PyResponsesChunkGenerator::from_config(config, id, model)
    }
});

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ConversionError", m.py().get_type::<ConversionError>())?;
    m.add_class::<PyModelVersion>()?;
    m.add_class::<PyWebSearchBehavior>()?;
    m.add_class::<PyReasoningContentBehavior>()?;
    m.add_class::<PyConversionOptions>()?;
    m.add_class::<PyOutputConstraint>()?;
    m.add_class::<PyInferenceOptions>()?;
    m.add_class::<PyConversationRequest>()?;
    m.add_class::<PyChatCompletionRequest>()?;
    m.add_class::<PyMessagesRequest>()?;
    m.add_class::<PyResponsesEcho>()?;
    m.add_class::<PyResponsesRequest>()?;
    Ok(())
}
