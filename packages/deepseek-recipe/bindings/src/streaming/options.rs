//! `ParsingOptions`, `ThinkingInitialStage`, `PromptUsage`, `InferenceFinishReason`, `InferenceChunk`.

use pyo3::prelude::*;

use deepseek_recipe::options::{ParsingOptions, ThinkingInitialStage};
use deepseek_recipe::stream::{FinishReason, InferenceChunk, PromptUsage, TokenLogprob};

use crate::mirror::py_enum;
use crate::tokens::PySpecialTokens;

py_enum!(
    /// Where the stream parser starts in thinking mode.
    PyThinkingInitialStage mirrors ThinkingInitialStage as "ThinkingInitialStage" {
        ReasoningStart, ReasoningContinuation, ContentContinuation,
    }
);

#[pymethods]
impl PyThinkingInitialStage {
    fn starts_in_reasoning(&self) -> bool {
        ThinkingInitialStage::from(*self).starts_in_reasoning()
    }
}

py_enum!(
    /// Why the backend stopped generating.
    PyFinishReason mirrors FinishReason as "InferenceFinishReason" { Stop, Length, ContentFilter }
);

#[pyclass(name = "ParsingOptions", module = "deepseek_recipe._native")]
#[derive(Clone)]
pub struct PyParsingOptions {
    pub inner: ParsingOptions,
}

#[pymethods]
impl PyParsingOptions {
    #[new]
    #[pyo3(signature = (*, parse_tool_calls=true, starts_in_tool_calls=false, parse_json_output=false,
        thinking_initial_stage=None, stop_sequences=None, special_tokens=None))]
    fn new(
        parse_tool_calls: bool,
        starts_in_tool_calls: bool,
        parse_json_output: bool,
        thinking_initial_stage: Option<PyThinkingInitialStage>,
        stop_sequences: Option<Vec<String>>,
        special_tokens: Option<PySpecialTokens>,
    ) -> Self {
        let inner = ParsingOptions {
            parse_tool_calls,
            starts_in_tool_calls,
            parse_json_output,
            thinking_initial_stage: thinking_initial_stage.map(Into::into),
            stop_sequences: stop_sequences.unwrap_or_default(),
            special_tokens: special_tokens.map(|s| s.inner).unwrap_or_default(),
        };
        Self { inner }
    }

    #[getter]
    fn parse_tool_calls(&self) -> bool {
        self.inner.parse_tool_calls
    }
    #[setter]
    fn set_parse_tool_calls(&mut self, value: bool) {
        self.inner.parse_tool_calls = value;
    }
    #[getter]
    fn starts_in_tool_calls(&self) -> bool {
        self.inner.starts_in_tool_calls
    }
    #[setter]
    fn set_starts_in_tool_calls(&mut self, value: bool) {
        self.inner.starts_in_tool_calls = value;
    }
    #[getter]
    fn parse_json_output(&self) -> bool {
        self.inner.parse_json_output
    }
    #[setter]
    fn set_parse_json_output(&mut self, value: bool) {
        self.inner.parse_json_output = value;
    }
    #[getter]
    fn thinking_initial_stage(&self) -> Option<PyThinkingInitialStage> {
        self.inner.thinking_initial_stage.map(Into::into)
    }
    #[setter]
    fn set_thinking_initial_stage(&mut self, value: Option<PyThinkingInitialStage>) {
        self.inner.thinking_initial_stage = value.map(Into::into);
    }
    #[getter]
    fn stop_sequences(&self) -> Vec<String> {
        self.inner.stop_sequences.clone()
    }
    #[setter]
    fn set_stop_sequences(&mut self, value: Vec<String>) {
        self.inner.stop_sequences = value;
    }
    #[getter]
    fn special_tokens(&self) -> PySpecialTokens {
        PySpecialTokens { inner: self.inner.special_tokens.clone() }
    }
    #[setter]
    fn set_special_tokens(&mut self, value: PySpecialTokens) {
        self.inner.special_tokens = value.inner;
    }
}

#[pyclass(name = "PromptUsage", module = "deepseek_recipe._native", frozen)]
#[derive(Clone)]
pub struct PyPromptUsage {
    pub inner: PromptUsage,
}

#[pymethods]
impl PyPromptUsage {
    #[new]
    #[pyo3(signature = (*, prompt_tokens=0, prompt_cache_hit_tokens=0))]
    fn new(prompt_tokens: u64, prompt_cache_hit_tokens: u64) -> Self {
        Self { inner: PromptUsage { prompt_tokens, prompt_cache_hit_tokens } }
    }
    #[getter]
    fn prompt_tokens(&self) -> u64 {
        self.inner.prompt_tokens
    }
    #[getter]
    fn prompt_cache_hit_tokens(&self) -> u64 {
        self.inner.prompt_cache_hit_tokens
    }
}

/// One `(logprob, [(token id, logprob), ...])` pair per token, as Python passes it.
type PyLogprobs = Vec<(f64, Vec<(u32, f64)>)>;

#[pyclass(name = "InferenceChunk", module = "deepseek_recipe._native", frozen)]
pub struct PyInferenceChunk {
    pub inner: InferenceChunk,
}

#[pymethods]
impl PyInferenceChunk {
    #[staticmethod]
    #[pyo3(signature = (*, prompt_usage=None, system_fingerprint=None))]
    fn ready(prompt_usage: Option<PyPromptUsage>, system_fingerprint: Option<String>) -> Self {
        Self {
            inner: InferenceChunk::Ready {
                prompt_usage: prompt_usage.map(|p| p.inner).unwrap_or_default(),
                system_fingerprint,
            },
        }
    }

    #[staticmethod]
    #[pyo3(signature = (content, token_count=0))]
    fn text(content: String, token_count: u64) -> Self {
        Self { inner: InferenceChunk::Text { content, token_count } }
    }

    #[staticmethod]
    #[pyo3(signature = (token_ids, logprobs=None))]
    fn tokens(token_ids: Vec<u32>, logprobs: Option<PyLogprobs>) -> Self {
        let logprobs =
            logprobs.map(|lp| lp.into_iter().map(|(logprob, top)| TokenLogprob { logprob, top }).collect());
        Self { inner: InferenceChunk::Tokens { token_ids, logprobs } }
    }

    #[staticmethod]
    fn finish(finish_reason: PyFinishReason) -> Self {
        Self { inner: InferenceChunk::Finish(finish_reason.into()) }
    }

    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner {
            InferenceChunk::Ready { .. } => "ready",
            InferenceChunk::Text { .. } => "text",
            InferenceChunk::Tokens { .. } => "tokens",
            InferenceChunk::Finish(_) => "finish",
        }
    }
    #[getter]
    fn content(&self) -> Option<String> {
        match &self.inner {
            InferenceChunk::Text { content, .. } => Some(content.clone()),
            _ => None,
        }
    }
    #[getter]
    fn token_ids(&self) -> Option<Vec<u32>> {
        match &self.inner {
            InferenceChunk::Tokens { token_ids, .. } => Some(token_ids.clone()),
            _ => None,
        }
    }
    #[getter]
    fn finish_reason(&self) -> Option<PyFinishReason> {
        match self.inner {
            InferenceChunk::Finish(reason) => Some(reason.into()),
            _ => None,
        }
    }
    #[getter]
    fn prompt_usage(&self) -> Option<PyPromptUsage> {
        match &self.inner {
            InferenceChunk::Ready { prompt_usage, .. } => Some(PyPromptUsage { inner: *prompt_usage }),
            _ => None,
        }
    }
    #[getter]
    fn token_count(&self) -> Option<u64> {
        match &self.inner {
            InferenceChunk::Text { token_count, .. } => Some(*token_count),
            _ => None,
        }
    }
    #[getter]
    fn system_fingerprint(&self) -> Option<String> {
        match &self.inner {
            InferenceChunk::Ready { system_fingerprint, .. } => system_fingerprint.clone(),
            _ => None,
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyThinkingInitialStage>()?;
    m.add_class::<PyParsingOptions>()?;
    m.add_class::<PyPromptUsage>()?;
    m.add_class::<PyFinishReason>()?;
    m.add_class::<PyInferenceChunk>()?;
    Ok(())
}
