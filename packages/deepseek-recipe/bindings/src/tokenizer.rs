//! `Tokenizer`.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use deepseek_recipe::tokenizer::Tokenizer;

#[pyclass(name = "Tokenizer", module = "deepseek_recipe._native", frozen)]
pub struct PyTokenizer {
    pub inner: Tokenizer,
}

fn runtime(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

#[pymethods]
impl PyTokenizer {
    #[staticmethod]
    fn from_file(py: Python<'_>, path: &str) -> PyResult<Self> {
        let inner = py.allow_threads(|| Tokenizer::from_file(path)).map_err(runtime)?;
        Ok(Self { inner })
    }

    #[staticmethod]
    fn from_str(py: Python<'_>, text: &str) -> PyResult<Self> {
        let inner = py.allow_threads(|| Tokenizer::from_str(text)).map_err(runtime)?;
        Ok(Self { inner })
    }

    /// Offline builds cannot reach the Hub; only an already cached `tokenizer.json` is used.
    #[staticmethod]
    #[pyo3(signature = (identifier, revision=None, token=None))]
    fn from_pretrained(
        identifier: &str,
        revision: Option<&str>,
        token: Option<&str>,
    ) -> PyResult<Self> {
        let _ = token;
        let cached = hub_cache_path(identifier, revision.unwrap_or("main")).ok_or_else(|| {
            runtime(format!("tokenizer.json of {identifier} is not in the local Hugging Face cache"))
        })?;
        Ok(Self { inner: Tokenizer::from_file(cached).map_err(runtime)? })
    }

    fn encode(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        py.allow_threads(|| self.inner.encode(text)).map_err(runtime)
    }
}

/// `$HF_HOME/hub/models--{org}--{name}/snapshots/{commit}/tokenizer.json` for a cached revision.
fn hub_cache_path(identifier: &str, revision: &str) -> Option<std::path::PathBuf> {
    let home = std::env::var_os("HF_HOME").map(std::path::PathBuf::from).or_else(|| {
        std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/huggingface"))
    })?;
    let repo = home.join("hub").join(format!("models--{}", identifier.replace('/', "--")));
    let commit = std::fs::read_to_string(repo.join("refs").join(revision))
        .map(|c| c.trim().to_owned())
        .unwrap_or_else(|_| revision.to_owned());
    let path = repo.join("snapshots").join(commit).join("tokenizer.json");
    path.is_file().then_some(path)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTokenizer>()
}
