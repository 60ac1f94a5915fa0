//! Image classes: `ImageInfo`, `MultiModalData`, `ImageQuota`, `PreprocessOptions`,
//! `ReqwestImageFetcher`, `OpenCvImagePreprocessor`, `ImageResolver`, `ImageError`, `CalcResizeError`.

use std::sync::{Arc, Mutex};

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use deepseek_recipe::image_source::ImageDetail;
use deepseek_recipe::images::fetch::ImageFetcher;
use deepseek_recipe::images::preprocess::{preprocess, PreprocessOptions};
use deepseek_recipe::images::resolve::{resolve, ImageQuota};
use deepseek_recipe::images::tokens::CalcResizeError as RustCalcResizeError;
use deepseek_recipe::images::{ImageError as RustImageError, ImageInfo, MultiModalData};

use crate::messages::PyImageSource;

create_exception!(_native, ImageError, PyException, "A failure to resolve, fetch, or preprocess images.");
create_exception!(_native, CalcResizeError, PyValueError, "The image token calculation did not converge.");

fn image_error(py: Python<'_>, error: RustImageError) -> PyErr {
    let err = ImageError::new_err(error.to_string());
    let value = err.value(py);
    let set = value
        .setattr("kind", error.kind.name())
        .and_then(|_| value.setattr("is_retryable", error.kind.is_retryable()));
    match set {
        Ok(()) => err,
        Err(e) => e,
    }
}

fn calc_error(error: RustCalcResizeError) -> PyErr {
    CalcResizeError::new_err(error.to_string())
}

#[pyclass(name = "ImageInfo", module = "deepseek_recipe._native", frozen)]
#[derive(Clone)]
pub struct PyImageInfo(ImageInfo);

#[pymethods]
impl PyImageInfo {
    #[new]
    fn new(data: Vec<u8>, width: u32, height: u32) -> Self {
        Self(ImageInfo { data, width, height })
    }
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.data)
    }
    #[getter]
    fn width(&self) -> u32 {
        self.0.width
    }
    #[getter]
    fn height(&self) -> u32 {
        self.0.height
    }
}

#[pyclass(name = "MultiModalData", module = "deepseek_recipe._native", frozen)]
pub struct PyMultiModalData(MultiModalData);

#[pymethods]
impl PyMultiModalData {
    #[new]
    #[pyo3(signature = (images=None))]
    fn new(images: Option<Vec<PyImageInfo>>) -> Self {
        Self(MultiModalData { images: images.unwrap_or_default().into_iter().map(|i| i.0).collect() })
    }
    #[getter]
    fn images(&self) -> Vec<PyImageInfo> {
        self.0.images.iter().cloned().map(PyImageInfo).collect()
    }
    fn is_empty(&self) -> bool {
        self.0.images.is_empty()
    }
    fn image_token_adjustment(&self) -> PyResult<u64> {
        self.0.image_token_adjustment().map_err(calc_error)
    }
}

#[pyclass(name = "ImageQuota", module = "deepseek_recipe._native")]
pub struct PyImageQuota(ImageQuota);

#[pymethods]
impl PyImageQuota {
    #[new]
    fn new() -> Self {
        Self(ImageQuota::default())
    }
    fn image_count(&self) -> u64 {
        self.0.image_count
    }
    fn byte_size(&self) -> u64 {
        self.0.byte_size
    }
}

#[pyclass(name = "PreprocessOptions", module = "deepseek_recipe._native", frozen)]
pub struct PyPreprocessOptions(PreprocessOptions);

#[pymethods]
impl PyPreprocessOptions {
    #[new]
    fn new(detail: &str, max_dimension_px: u32, low_detail_max_dimension_px: u32) -> PyResult<Self> {
        let detail = ImageDetail::parse(detail).map_err(PyValueError::new_err)?;
        Ok(Self(PreprocessOptions { detail, max_dimension_px, low_detail_max_dimension_px }))
    }
    #[getter]
    fn detail(&self) -> &'static str {
        self.0.detail.as_str()
    }
    #[getter]
    fn max_dimension_px(&self) -> u32 {
        self.0.max_dimension_px
    }
    #[getter]
    fn low_detail_max_dimension_px(&self) -> u32 {
        self.0.low_detail_max_dimension_px
    }
}

#[pyclass(name = "ReqwestImageFetcher", module = "deepseek_recipe._native", frozen)]
#[derive(Clone)]
pub struct PyImageFetcher(ImageFetcher);

#[pymethods]
impl PyImageFetcher {
    #[new]
    fn new() -> Self {
        Self(ImageFetcher::default())
    }

    #[staticmethod]
    fn with_max_bytes(max_bytes: u64) -> Self {
        Self(ImageFetcher { max_bytes, ..ImageFetcher::default() })
    }

    fn with_destination_filter(&self, destination_filter: PyObject) -> PyResult<Self> {
        let callable = Python::with_gil(|py| destination_filter.bind(py).is_callable());
        if !callable {
            return Err(PyTypeError::new_err("destination_filter must be callable"));
        }
        // A filter that raises or returns a non-bool rejects the address.
        let filter = move |host: &str, address: &str| {
            Python::with_gil(|py| {
                destination_filter
                    .call1(py, (host, address))
                    .ok()
                    .and_then(|v| {
                        v.extract::<bool>(py)
                            .ok()
                            .filter(|_| v.bind(py).is_instance_of::<pyo3::types::PyBool>())
                    })
                    .unwrap_or(false)
            })
        };
        Ok(Self(ImageFetcher { destination_filter: Some(Arc::new(filter)), ..self.0.clone() }))
    }

    fn fetch<'py>(&self, py: Python<'py>, url: &str) -> PyResult<Bound<'py, PyBytes>> {
        let fetcher = self.0.clone();
        let bytes = py.allow_threads(|| fetcher.fetch(url)).map_err(|e| image_error(py, e))?;
        Ok(PyBytes::new(py, &bytes))
    }
}

#[pyclass(name = "OpenCvImagePreprocessor", module = "deepseek_recipe._native", frozen)]
#[derive(Clone)]
pub struct PyImagePreprocessor;

#[pymethods]
impl PyImagePreprocessor {
    #[new]
    fn new() -> Self {
        Self
    }

    fn preprocess(
        &self,
        py: Python<'_>,
        data: Vec<u8>,
        options: PyRef<'_, PyPreprocessOptions>,
    ) -> PyResult<PyImageInfo> {
        let options = options.0;
        py.allow_threads(|| preprocess(&data, &options)).map(PyImageInfo).map_err(|e| image_error(py, e))
    }
}

#[pyclass(name = "ImageResolver", module = "deepseek_recipe._native", frozen)]
pub struct PyImageResolver {
    fetcher: ImageFetcher,
    /// Serialises resolve calls that share this resolver (the quota is per call's argument).
    lock: Mutex<()>,
}

#[pymethods]
impl PyImageResolver {
    #[new]
    #[allow(unused_variables)] // the preprocessor has no settings
    fn new(fetcher: PyRef<'_, PyImageFetcher>, preprocessor: PyRef<'_, PyImagePreprocessor>) -> Self {
        Self { fetcher: fetcher.0.clone(), lock: Mutex::new(()) }
    }

    fn resolve(
        &self,
        py: Python<'_>,
        sources: Vec<PyRef<'_, PyImageSource>>,
        mut quota: PyRefMut<'_, PyImageQuota>,
    ) -> PyResult<PyMultiModalData> {
        let sources: Vec<_> = sources.iter().map(|s| s.inner.clone()).collect();
        let mut local = quota.0;
        let result = py.allow_threads(|| {
            let _guard = self.lock.lock();
            resolve(&sources, &mut local, &self.fetcher)
        });
        let data = result.map_err(|e| image_error(py, e))?;
        quota.0 = local;
        Ok(PyMultiModalData(data))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ImageError", py.get_type::<ImageError>())?;
    m.add("CalcResizeError", py.get_type::<CalcResizeError>())?;
    m.add_class::<PyImageInfo>()?;
    m.add_class::<PyMultiModalData>()?;
    m.add_class::<PyImageQuota>()?;
    m.add_class::<PyPreprocessOptions>()?;
    m.add_class::<PyImageFetcher>()?;
    m.add_class::<PyImagePreprocessor>()?;
    m.add_class::<PyImageResolver>()?;
    Ok(())
}
