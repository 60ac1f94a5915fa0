//! The model families this crate renders for; a leaf module so that options and conversations can both
//! name them.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelVersion {
    DeepseekV4Pro,
    DeepseekV41Flash,
}
