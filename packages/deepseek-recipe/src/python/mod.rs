//! PyO3 bindings: the `deepseek_recipe._native` module. Each submodule registers its own classes.
use pyo3::prelude::*;

mod conversion;
mod streaming;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    conversion::register(m)?;
    streaming::register(m)?;
    Ok(())
}
