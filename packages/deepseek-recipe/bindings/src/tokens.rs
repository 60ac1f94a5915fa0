//! `SpecialToken` and `SpecialTokens`.

use pyo3::prelude::*;

use deepseek_recipe::tokens::{SpecialToken, SpecialTokens};

use crate::mirror::py_enum;

py_enum!(
    /// A kind of special token the renderer and the stream parser know about.
    PySpecialToken mirrors SpecialToken as "SpecialToken" {
        Bos, Eos, ThinkingStart, ThinkingEnd, System, User, Assistant, LatestReminder, Dsml, Image,
        Ref, RefEnd, Box, BoxEnd, Point, PointEnd, Polygon, PolygonEnd,
    }
);

#[pymethods]
impl PySpecialToken {
    fn default_str(&self) -> &'static str {
        SpecialToken::from(*self).default_str()
    }
}

#[pyclass(name = "SpecialTokens", module = "deepseek_recipe._native", frozen)]
#[derive(Clone)]
pub struct PySpecialTokens {
    pub inner: SpecialTokens,
}

#[pymethods]
impl PySpecialTokens {
    #[new]
    #[pyo3(signature = (*, bos=None, eos=None, thinking_start=None, thinking_end=None, system=None,
        user=None, assistant=None, latest_reminder=None, dsml=None, image=None, r#ref=None,
        ref_end=None, r#box=None, box_end=None, point=None, point_end=None, polygon=None,
        polygon_end=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        bos: Option<String>,
        eos: Option<String>,
        thinking_start: Option<String>,
        thinking_end: Option<String>,
        system: Option<String>,
        user: Option<String>,
        assistant: Option<String>,
        latest_reminder: Option<String>,
        dsml: Option<String>,
        image: Option<String>,
        r#ref: Option<String>,
        ref_end: Option<String>,
        r#box: Option<String>,
        box_end: Option<String>,
        point: Option<String>,
        point_end: Option<String>,
        polygon: Option<String>,
        polygon_end: Option<String>,
    ) -> Self {
        let given = [
            bos, eos, thinking_start, thinking_end, system, user, assistant, latest_reminder, dsml,
            image, r#ref, ref_end, r#box, box_end, point, point_end, polygon, polygon_end,
        ];
        let inner = SpecialToken::ALL
            .into_iter()
            .zip(given)
            .fold(SpecialTokens::default(), |st, (token, spelling)| match spelling {
                Some(s) => st.with(token, s),
                None => st,
            });
        Self { inner }
    }

    fn token(&self, token: PySpecialToken) -> String {
        self.inner.token(token.into()).to_owned()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySpecialToken>()?;
    m.add_class::<PySpecialTokens>()?;
    Ok(())
}
