//! Messages, tool calls, tool definitions and image sources.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use deepseek_recipe::image_source::{ImageData, ImageDetail, ImageSource};
use deepseek_recipe::messages::{ImageContent, Message, ToolCall, ToolDefinition};

use crate::value::{to_py, to_value};

#[pyclass(name = "ToolCall", module = "deepseek_recipe._native", frozen)]
#[derive(Clone)]
pub struct PyToolCall {
    pub inner: ToolCall,
}

#[pymethods]
impl PyToolCall {
    #[new]
    fn new(id: String, name: String, arguments: String) -> Self {
        Self { inner: ToolCall { id, name, arguments } }
    }
    #[getter]
    fn id(&self) -> &str {
        &self.inner.id
    }
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    #[getter]
    fn arguments(&self) -> &str {
        &self.inner.arguments
    }
    fn __repr__(&self) -> String {
        let t = &self.inner;
        format!("ToolCall(id={:?}, name={:?}, arguments={:?})", t.id, t.name, t.arguments)
    }
}

#[pyclass(name = "ToolDefinition", module = "deepseek_recipe._native", frozen)]
#[derive(Clone)]
pub struct PyToolDefinition {
    pub inner: ToolDefinition,
}

#[pymethods]
impl PyToolDefinition {
    #[new]
    #[pyo3(signature = (name, description=None, parameters=None, strict=None, defer_loading=false))]
    fn new(
        name: String,
        description: Option<String>,
        parameters: Option<&Bound<'_, PyAny>>,
        strict: Option<bool>,
        defer_loading: bool,
    ) -> PyResult<Self> {
        let parameters = parameters.map(to_value).transpose()?.unwrap_or_default();
        Ok(Self { inner: ToolDefinition { name, description, parameters, strict, defer_loading } })
    }
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    #[getter]
    fn description(&self) -> Option<&str> {
        self.inner.description.as_deref()
    }
    #[getter]
    fn parameters(&self, py: Python<'_>) -> PyResult<PyObject> {
        to_py(py, &self.inner.parameters)
    }
    #[getter]
    fn strict(&self) -> Option<bool> {
        self.inner.strict
    }
    #[getter]
    fn defer_loading(&self) -> bool {
        self.inner.defer_loading
    }
    fn __repr__(&self) -> String {
        let t = &self.inner;
        // The reference prints the optional fields in Rust's debug form (`Some("d")`, `None`).
        format!("ToolDefinition(name={:?}, description={:?}, strict={:?})", t.name, t.description, t.strict)
    }
}

#[pyclass(name = "ImageSource", module = "deepseek_recipe._native", subclass, frozen)]
#[derive(Clone)]
pub struct PyImageSource {
    pub inner: ImageSource,
}

impl PyImageSource {
    /// A Python object of the subclass matching the source kind.
    pub fn to_object(py: Python<'_>, source: &ImageSource) -> PyResult<PyObject> {
        let base = PyClassInitializer::from(PyImageSource { inner: source.clone() });
        Ok(match source.data {
            ImageData::DataUrl(_) => Py::new(py, base.add_subclass(PyDataUrlImageSource))?.into_any(),
            ImageData::Url(_) => Py::new(py, base.add_subclass(PyUrlImageSource))?.into_any(),
            ImageData::Bytes(_) => Py::new(py, base.add_subclass(PyBytesImageSource))?.into_any(),
        })
    }

    fn build(data: ImageData, detail: &str, path: String) -> PyResult<PyClassInitializer<Self>> {
        let detail = ImageDetail::parse(detail).map_err(PyValueError::new_err)?;
        Ok(PyClassInitializer::from(Self { inner: ImageSource { data, detail, path } }))
    }
}

#[pymethods]
impl PyImageSource {
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    #[getter]
    fn detail(&self) -> &'static str {
        self.inner.detail.as_str()
    }
    #[getter]
    fn data_url(&self) -> Option<&str> {
        match &self.inner.data {
            ImageData::DataUrl(u) => Some(u),
            _ => None,
        }
    }
    #[getter]
    fn url(&self) -> Option<&str> {
        match &self.inner.data {
            ImageData::Url(u) => Some(u),
            _ => None,
        }
    }
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        match &self.inner.data {
            ImageData::Bytes(b) => Some(PyBytes::new(py, b)),
            _ => None,
        }
    }
    #[getter]
    fn path(&self) -> &str {
        &self.inner.path
    }
    fn __repr__(&self) -> String {
        let s = &self.inner;
        let (class, shown) = match &s.data {
            ImageData::DataUrl(u) => ("DataUrlImageSource", format!("{u:?}")),
            ImageData::Url(u) => ("UrlImageSource", format!("{u:?}")),
            ImageData::Bytes(b) => ("BytesImageSource", format!("<{} bytes>", b.len())),
        };
        format!("{class}({shown}, detail={:?}, path={:?})", s.detail.as_str(), s.path)
    }
}

#[pyclass(name = "DataUrlImageSource", module = "deepseek_recipe._native", extends = PyImageSource, frozen)]
pub struct PyDataUrlImageSource;

#[pymethods]
impl PyDataUrlImageSource {
    #[new]
    #[pyo3(signature = (data_url, detail="high", *, path=String::new()))]
    fn new(data_url: String, detail: &str, path: String) -> PyResult<PyClassInitializer<Self>> {
        Ok(PyImageSource::build(ImageData::DataUrl(data_url), detail, path)?.add_subclass(Self))
    }
}

#[pyclass(name = "UrlImageSource", module = "deepseek_recipe._native", extends = PyImageSource, frozen)]
pub struct PyUrlImageSource;

#[pymethods]
impl PyUrlImageSource {
    #[new]
    #[pyo3(signature = (url, detail="high", *, path=String::new()))]
    fn new(url: String, detail: &str, path: String) -> PyResult<PyClassInitializer<Self>> {
        Ok(PyImageSource::build(ImageData::Url(url), detail, path)?.add_subclass(Self))
    }
}

#[pyclass(name = "BytesImageSource", module = "deepseek_recipe._native", extends = PyImageSource, frozen)]
pub struct PyBytesImageSource;

#[pymethods]
impl PyBytesImageSource {
    #[new]
    #[pyo3(signature = (data, detail="high", *, path=String::new()))]
    fn new(data: Vec<u8>, detail: &str, path: String) -> PyResult<PyClassInitializer<Self>> {
        Ok(PyImageSource::build(ImageData::Bytes(data), detail, path)?.add_subclass(Self))
    }
}

#[pyclass(name = "Message", module = "deepseek_recipe._native", subclass, frozen)]
#[derive(Clone)]
pub struct PyMessage {
    pub inner: Message,
}

impl PyMessage {
    /// A Python object of the subclass matching the message role.
    pub fn to_object(py: Python<'_>, message: &Message) -> PyResult<PyObject> {
        let base = PyClassInitializer::from(PyMessage { inner: message.clone() });
        Ok(match message {
            Message::System { .. } => Py::new(py, base.add_subclass(PySystemMessage))?.into_any(),
            Message::User { .. } => Py::new(py, base.add_subclass(PyUserMessage))?.into_any(),
            Message::Assistant { .. } => Py::new(py, base.add_subclass(PyAssistantMessage))?.into_any(),
            Message::Tool { .. } => Py::new(py, base.add_subclass(PyToolMessage))?.into_any(),
            Message::LatestReminder { .. } => {
                Py::new(py, base.add_subclass(PyLatestReminderMessage))?.into_any()
            }
        })
    }
}

fn image_content(
    content: String,
    image_sources: Option<Vec<PyRef<'_, PyImageSource>>>,
    image_token: Option<&str>,
) -> PyResult<ImageContent> {
    let sources = image_sources.unwrap_or_default().iter().map(|s| s.inner.clone()).collect();
    ImageContent::with_images(content, sources, image_token).map_err(PyValueError::new_err)
}

#[pymethods]
impl PyMessage {
    #[getter]
    fn role(&self) -> &'static str {
        self.inner.role()
    }
    #[getter]
    fn content(&self) -> &str {
        self.inner.content()
    }
    #[getter]
    fn reasoning_content(&self) -> Option<&str> {
        match &self.inner {
            Message::Assistant { reasoning_content, .. } => reasoning_content.as_deref(),
            _ => None,
        }
    }
    #[getter]
    fn tool_calls(&self) -> Option<Vec<PyToolCall>> {
        match &self.inner {
            Message::Assistant { tool_calls, .. } => tool_calls
                .as_ref()
                .map(|calls| calls.iter().map(|c| PyToolCall { inner: c.clone() }).collect()),
            _ => None,
        }
    }
    #[getter]
    fn tool_call_id(&self) -> Option<&str> {
        match &self.inner {
            Message::Tool { tool_call_id, .. } => tool_call_id.as_deref(),
            _ => None,
        }
    }
    #[getter]
    fn image_sources(&self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        self.inner.image_sources().iter().map(|s| PyImageSource::to_object(py, s)).collect()
    }
    #[getter]
    fn prefix(&self) -> bool {
        matches!(self.inner, Message::Assistant { prefix: true, .. })
    }
    fn __repr__(&self) -> String {
        match &self.inner {
            Message::System { content, .. } => format!("SystemMessage({:?})", content.text),
            Message::User { content } => format!(
                "UserMessage({:?}, image_sources={})",
                content.text,
                content.image_sources.len()
            ),
            Message::Assistant { content, reasoning_content, tool_calls, prefix } => format!(
                "AssistantMessage({content:?}, reasoning_content={}, tool_calls={}, prefix={})",
                py_bool(reasoning_content.is_some()),
                tool_calls.as_ref().map_or(0, Vec::len),
                py_bool(*prefix)
            ),
            Message::Tool { content, tool_call_id } => format!(
                "ToolMessage({:?}, tool_call_id={tool_call_id:?}, image_sources={})",
                content.text,
                content.image_sources.len()
            ),
            Message::LatestReminder { content } => format!("LatestReminderMessage({content:?})"),
        }
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

#[pyclass(name = "SystemMessage", module = "deepseek_recipe._native", extends = PyMessage, frozen)]
pub struct PySystemMessage;

#[pymethods]
impl PySystemMessage {
    #[new]
    #[pyo3(signature = (content, image_sources=None, tools=None, *, image_token=None))]
    fn new(
        content: String,
        image_sources: Option<Vec<PyRef<'_, PyImageSource>>>,
        tools: Option<Vec<PyRef<'_, PyToolDefinition>>>,
        image_token: Option<&str>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let content = image_content(content, image_sources, image_token)?;
        let tools = tools.map(|ts| ts.iter().map(|t| t.inner.clone()).collect());
        Ok(PyClassInitializer::from(PyMessage { inner: Message::System { content, tools } })
            .add_subclass(Self))
    }
    #[getter]
    fn tools(self_: PyRef<'_, Self>) -> Option<Vec<PyToolDefinition>> {
        match &self_.as_super().inner {
            Message::System { tools, .. } => tools
                .as_ref()
                .map(|ts| ts.iter().map(|t| PyToolDefinition { inner: t.clone() }).collect()),
            _ => None,
        }
    }
}

#[pyclass(name = "UserMessage", module = "deepseek_recipe._native", extends = PyMessage, frozen)]
pub struct PyUserMessage;

#[pymethods]
impl PyUserMessage {
    #[new]
    #[pyo3(signature = (content, image_sources=None, *, image_token=None))]
    fn new(
        content: String,
        image_sources: Option<Vec<PyRef<'_, PyImageSource>>>,
        image_token: Option<&str>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let content = image_content(content, image_sources, image_token)?;
        Ok(PyClassInitializer::from(PyMessage { inner: Message::User { content } }).add_subclass(Self))
    }
}

#[pyclass(name = "AssistantMessage", module = "deepseek_recipe._native", extends = PyMessage, frozen)]
pub struct PyAssistantMessage;

#[pymethods]
impl PyAssistantMessage {
    #[new]
    #[pyo3(signature = (content, reasoning_content=None, tool_calls=None, prefix=false))]
    fn new(
        content: String,
        reasoning_content: Option<String>,
        tool_calls: Option<Vec<PyRef<'_, PyToolCall>>>,
        prefix: bool,
    ) -> PyClassInitializer<Self> {
        let tool_calls = tool_calls.map(|cs| cs.iter().map(|c| c.inner.clone()).collect());
        let inner = Message::Assistant { content, reasoning_content, tool_calls, prefix };
        PyClassInitializer::from(PyMessage { inner }).add_subclass(Self)
    }
}

#[pyclass(name = "ToolMessage", module = "deepseek_recipe._native", extends = PyMessage, frozen)]
pub struct PyToolMessage;

#[pymethods]
impl PyToolMessage {
    #[new]
    #[pyo3(signature = (content, tool_call_id=None, image_sources=None, *, image_token=None))]
    fn new(
        content: String,
        tool_call_id: Option<String>,
        image_sources: Option<Vec<PyRef<'_, PyImageSource>>>,
        image_token: Option<&str>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let content = image_content(content, image_sources, image_token)?;
        Ok(PyClassInitializer::from(PyMessage { inner: Message::Tool { content, tool_call_id } })
            .add_subclass(Self))
    }
}

#[pyclass(name = "LatestReminderMessage", module = "deepseek_recipe._native", extends = PyMessage, frozen)]
pub struct PyLatestReminderMessage;

#[pymethods]
impl PyLatestReminderMessage {
    #[new]
    fn new(content: String) -> PyClassInitializer<Self> {
        PyClassInitializer::from(PyMessage { inner: Message::LatestReminder { content } })
            .add_subclass(Self)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyToolCall>()?;
    m.add_class::<PyToolDefinition>()?;
    m.add_class::<PyImageSource>()?;
    m.add_class::<PyDataUrlImageSource>()?;
    m.add_class::<PyUrlImageSource>()?;
    m.add_class::<PyBytesImageSource>()?;
    m.add_class::<PyMessage>()?;
    m.add_class::<PySystemMessage>()?;
    m.add_class::<PyUserMessage>()?;
    m.add_class::<PyAssistantMessage>()?;
    m.add_class::<PyToolMessage>()?;
    m.add_class::<PyLatestReminderMessage>()?;
    Ok(())
}
