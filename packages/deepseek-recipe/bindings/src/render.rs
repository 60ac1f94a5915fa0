//! `Conversation`, `RenderedPrompt` and the two prompt encodings.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use deepseek_recipe::conversation::{Conversation, ReasoningEffort, ResponseFormat, ToolChoice};
use deepseek_recipe::render::{PromptFormat, RenderedPrompt, Renderer};
use deepseek_recipe::tokenizer::Tokenizer;

use crate::messages::{PyImageSource, PyMessage, PyToolDefinition};
use crate::tokenizer::PyTokenizer;
use crate::tokens::PySpecialTokens;
use crate::value::{to_py, to_value};

#[pyclass(name = "Conversation", module = "deepseek_recipe._native", frozen)]
#[derive(Clone)]
pub struct PyConversation {
    pub inner: Conversation,
}

fn response_format(
    format: &str,
    schema: Option<serde_json::Value>,
    regex: Option<String>,
) -> Result<ResponseFormat, String> {
    let base = match format {
        "text" => ResponseFormat::Text,
        "json_object" => ResponseFormat::JsonObject,
        other => {
            return Err(format!(
                "invalid response_format \"{other}\"; expected \"text\" or \"json_object\""
            ))
        }
    };
    match (base, schema, regex) {
        (_, Some(_), Some(_)) => Err("response_schema and response_regex cannot be combined".into()),
        (ResponseFormat::JsonObject, Some(_), _) | (ResponseFormat::JsonObject, _, Some(_)) => Err(
            "response_format \"json_object\" cannot be combined with response_schema or response_regex"
                .into(),
        ),
        (_, Some(schema), None) => Ok(ResponseFormat::JsonSchema(schema)),
        (_, None, Some(regex)) => Ok(ResponseFormat::Regex(regex)),
        (base, None, None) => Ok(base),
    }
}

#[pymethods]
impl PyConversation {
    #[new]
    #[pyo3(signature = (messages=None, *, thinking_mode=true, tools=None, tool_choice="auto",
        reasoning_effort=None, response_format="text", response_schema=None, response_regex=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        messages: Option<Vec<PyRef<'_, PyMessage>>>,
        thinking_mode: bool,
        tools: Option<Vec<PyRef<'_, PyToolDefinition>>>,
        tool_choice: &str,
        reasoning_effort: Option<&str>,
        response_format: &str,
        response_schema: Option<&Bound<'_, PyAny>>,
        response_regex: Option<String>,
    ) -> PyResult<Self> {
        let invalid = |e: String| PyValueError::new_err(e);
        let reasoning_effort = reasoning_effort.map(ReasoningEffort::parse).transpose().map_err(invalid)?;
        let tool_choice = ToolChoice::parse(tool_choice).map_err(invalid)?;
        let schema = response_schema.map(to_value).transpose()?;
        let response_format = self::response_format(response_format, schema, response_regex).map_err(invalid)?;
        Ok(Self {
            inner: Conversation {
                messages: messages.unwrap_or_default().iter().map(|m| m.inner.clone()).collect(),
                thinking_mode,
                tools: tools.unwrap_or_default().iter().map(|t| t.inner.clone()).collect(),
                tool_choice,
                reasoning_effort,
                response_format,
            },
        })
    }
    #[getter]
    fn messages(&self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        self.inner.messages.iter().map(|m| PyMessage::to_object(py, m)).collect()
    }
    #[getter]
    fn thinking_mode(&self) -> bool {
        self.inner.thinking_mode
    }
    #[getter]
    fn tools(&self) -> Vec<PyToolDefinition> {
        self.inner.tools.iter().map(|t| PyToolDefinition { inner: t.clone() }).collect()
    }
    #[getter]
    fn tool_choice(&self) -> &'static str {
        self.inner.tool_choice.as_str()
    }
    #[getter]
    fn reasoning_effort(&self) -> Option<&'static str> {
        self.inner.reasoning_effort.map(ReasoningEffort::as_str)
    }
    #[getter]
    fn response_format(&self) -> &'static str {
        self.inner.response_format.name()
    }
    #[getter]
    fn response_schema(&self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        match &self.inner.response_format {
            ResponseFormat::JsonSchema(schema) => to_py(py, schema).map(Some),
            _ => Ok(None),
        }
    }
    #[getter]
    fn response_regex(&self) -> Option<&str> {
        match &self.inner.response_format {
            ResponseFormat::Regex(regex) => Some(regex),
            _ => None,
        }
    }
    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "Conversation(messages={}, thinking_mode={}, tools={}, tool_choice={:?}, reasoning_effort={:?}, response_format={:?})",
            c.messages.len(),
            if c.thinking_mode { "True" } else { "False" },
            c.tools.len(),
            c.tool_choice.as_str(),
            c.reasoning_effort.map(ReasoningEffort::as_str),
            c.response_format.name()
        )
    }
}

#[pyclass(name = "RenderedPrompt", module = "deepseek_recipe._native", frozen)]
pub struct PyRenderedPrompt {
    inner: RenderedPrompt,
}

/// Converts ascending byte ranges into code point ranges in one pass.
fn char_ranges(prompt: &str, ranges: &[std::ops::Range<usize>]) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(ranges.len());
    let (mut byte_at, mut char_at) = (0, 0);
    let mut advance = |to: usize| {
        char_at += prompt[byte_at..to].chars().count();
        byte_at = to;
        char_at
    };
    for range in ranges {
        let start = advance(range.start);
        let end = advance(range.end);
        out.push((start, end));
    }
    out
}

#[pymethods]
impl PyRenderedPrompt {
    #[getter]
    fn prompt(&self) -> &str {
        &self.inner.prompt
    }
    #[getter]
    fn special_ranges(&self) -> Vec<(usize, usize)> {
        char_ranges(&self.inner.prompt, &self.inner.special_ranges)
    }
    #[getter]
    fn image_sources(&self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        self.inner.image_sources.iter().map(|s| PyImageSource::to_object(py, s)).collect()
    }
    fn __repr__(&self) -> String {
        format!(
            "RenderedPrompt(prompt=<{} characters>, image_sources={})",
            self.inner.prompt.chars().count(),
            self.inner.image_sources.len()
        )
    }
}

/// What both encoding classes hold: a renderer and an optional tokenizer.
#[derive(Clone)]
pub struct Encoding {
    pub renderer: Renderer,
    pub tokenizer: Option<Tokenizer>,
}

impl Encoding {
    fn new(format: PromptFormat) -> Self {
        Self { renderer: Renderer::new(format), tokenizer: None }
    }

    fn render(&self, conversation: &PyConversation) -> PyRenderedPrompt {
        PyRenderedPrompt { inner: self.renderer.render(&conversation.inner) }
    }

    fn encode(&self, py: Python<'_>, conversation: &PyConversation) -> PyResult<Vec<u32>> {
        let tokenizer = self
            .tokenizer
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("no tokenizer is attached to the encoding"))?;
        py.allow_threads(|| {
            let rendered = self.renderer.render(&conversation.inner);
            tokenizer.encode_prompt(&rendered)
        })
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }
}

macro_rules! encoding_class {
    ($rust:ident, $py:literal, $format:expr) => {
        #[pyclass(name = $py, module = "deepseek_recipe._native", frozen)]
        pub struct $rust {
            pub inner: Encoding,
        }

        #[pymethods]
        impl $rust {
            #[new]
            fn new() -> Self {
                Self { inner: Encoding::new($format) }
            }
            fn with_tokenizer(&self, tokenizer: &PyTokenizer) -> Self {
                Self { inner: Encoding { tokenizer: Some(tokenizer.inner.clone()), ..self.inner.clone() } }
            }
            fn with_special_tokens(&self, special_tokens: &PySpecialTokens) -> Self {
                let renderer = self.inner.renderer.clone().with_special_tokens(special_tokens.inner.clone());
                Self { inner: Encoding { renderer, ..self.inner.clone() } }
            }
            fn render_conversation(&self, conversation: &PyConversation) -> PyRenderedPrompt {
                self.inner.render(conversation)
            }
            fn encode(&self, py: Python<'_>, conversation: &PyConversation) -> PyResult<Vec<u32>> {
                self.inner.encode(py, conversation)
            }
        }
    };
}

encoding_class!(PyDeepseekV4Encoding, "DeepseekV4Encoding", PromptFormat::V4);
encoding_class!(PyDeepseekV41Encoding, "DeepseekV41Encoding", PromptFormat::V41);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyConversation>()?;
    m.add_class::<PyRenderedPrompt>()?;
    m.add_class::<PyDeepseekV4Encoding>()?;
    m.add_class::<PyDeepseekV41Encoding>()?;
    Ok(())
}
