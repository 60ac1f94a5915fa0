//! Python enums mirroring the core's enums. The core carries no PyO3 attributes, so each Python enum is
//! a copy with the same variants, converted both ways by exhaustive matches (a variant added on one side
//! only fails to compile).

/// `py_enum!(PyName mirrors CoreName as "PythonName" { Variant, ... })`, optionally preceded by doc
/// comments that become the Python class's docstring.
macro_rules! py_enum {
    (
        $(#[doc = $doc:literal])*
        $py:ident mirrors $core:ident as $name:literal { $($variant:ident),+ $(,)? }
    ) => {
        $(#[doc = $doc])*
        #[pyo3::pyclass(eq, frozen, name = $name, module = "deepseek_recipe._native")]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $py {
            $($variant),+
        }

        impl From<$core> for $py {
            fn from(value: $core) -> Self {
                match value {
                    $($core::$variant => Self::$variant),+
                }
            }
        }

        impl From<$py> for $core {
            fn from(value: $py) -> Self {
                match value {
                    $($py::$variant => Self::$variant),+
                }
            }
        }
    };
}

pub(crate) use py_enum;
