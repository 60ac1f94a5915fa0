//! The model families this crate renders for; a leaf module so that options and conversations can both
//! name them.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "python", pyo3::pyclass(eq, frozen, module = "deepseek_recipe._native"))]
pub enum ModelVersion {
    DeepseekV4Pro,
    DeepseekV41Flash,
}
