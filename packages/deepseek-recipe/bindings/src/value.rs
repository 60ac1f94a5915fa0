//! Conversions between Python objects and `serde_json::Value` (dict order preserved).

use pyo3::exceptions::{PyOverflowError, PyRecursionError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// Most containers a JSON value may nest, the same bound serde_json puts on JSON text.
pub const MAX_DEPTH: usize = 128;

/// Converts a JSON-like Python object (None, bool, int, float, str, dict with str keys, list, tuple).
///
/// Nesting beyond [`MAX_DEPTH`] raises `RecursionError` and an object that contains itself raises
/// `ValueError`, instead of recursing until the native stack overflows.
pub fn to_value(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    Walker { open: Vec::new() }.value(obj)
}

/// The containers on the path from the root to the object being converted (by identity).
struct Walker {
    open: Vec<*mut pyo3::ffi::PyObject>,
}

impl Walker {
    fn value(&mut self, obj: &Bound<'_, PyAny>) -> PyResult<Value> {
        if obj.is_none() {
            return Ok(Value::Null);
        }
        if let Ok(s) = obj.downcast::<PyString>() {
            return Ok(Value::String(s.to_str()?.to_owned()));
        }
        if let Ok(b) = obj.downcast::<PyBool>() {
            return Ok(Value::Bool(b.is_true()));
        }
        if let Ok(i) = obj.downcast::<PyInt>() {
            return int_value(i);
        }
        if let Ok(f) = obj.downcast::<PyFloat>() {
            let f = f.value();
            return Number::from_f64(f)
                .map(Value::Number)
                .ok_or_else(|| PyValueError::new_err(format!("{f} is not a finite JSON number")));
        }
        if let Ok(d) = obj.downcast::<PyDict>() {
            self.enter(obj)?;
            let mut map = Map::with_capacity(d.len());
            for (k, v) in d.iter() {
                let key = k
                    .downcast::<PyString>()
                    .map_err(|_| PyTypeError::new_err("JSON object keys must be str"))?;
                map.insert(key.to_str()?.to_owned(), self.value(&v)?);
            }
            self.open.pop();
            return Ok(Value::Object(map));
        }
        if let Ok(l) = obj.downcast::<PyList>() {
            return self.array(obj, l.iter());
        }
        if let Ok(t) = obj.downcast::<PyTuple>() {
            return self.array(obj, t.iter());
        }
        Err(PyTypeError::new_err(format!("{} is not a JSON value", obj.get_type().name()?)))
    }

    fn array<'py>(
        &mut self,
        obj: &Bound<'py, PyAny>,
        items: impl Iterator<Item = Bound<'py, PyAny>>,
    ) -> PyResult<Value> {
        self.enter(obj)?;
        let items = items.map(|v| self.value(&v)).collect::<PyResult<_>>()?;
        self.open.pop();
        Ok(Value::Array(items))
    }

    /// A cycle is reported before depth, so a self-containing object is named as such.
    fn enter(&mut self, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.open.contains(&obj.as_ptr()) {
            return Err(PyValueError::new_err("circular reference in JSON input"));
        }
        if self.open.len() == MAX_DEPTH {
            return Err(PyRecursionError::new_err(format!(
                "JSON input exceeds the maximum nesting depth of {MAX_DEPTH}"
            )));
        }
        self.open.push(obj.as_ptr());
        Ok(())
    }
}

fn int_value(i: &Bound<'_, PyInt>) -> PyResult<Value> {
    if let Ok(v) = i.extract::<i64>() {
        return Ok(Value::Number(v.into()));
    }
    if let Ok(v) = i.extract::<u64>() {
        return Ok(Value::Number(v.into()));
    }
    Err(PyOverflowError::new_err("integer is outside the JSON number range"))
}

pub fn to_py(py: Python<'_>, value: &Value) -> PyResult<PyObject> {
    Ok(match value {
        Value::Null => py.None(),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any().unbind()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any().unbind()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any().unbind()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any().unbind(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, to_py(py, v)?)?;
            }
            dict.into_any().unbind()
        }
    })
}
