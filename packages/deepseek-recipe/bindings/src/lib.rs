//! PyO3 bindings of the `deepseek-recipe` core: the `deepseek_recipe._native` module. Each submodule
//! registers its own classes.
use pyo3::prelude::*;

pub mod conversion;
pub mod messages;
mod mirror;
pub mod render;
pub mod streaming;
pub mod tokenizer;
pub mod tokens;
mod value;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tokens::register(m)?;
    messages::register(m)?;
    render::register(m)?;
    tokenizer::register(m)?;
    conversion::register(m)?;
    streaming::register(m)?;
    Ok(())
}
