//! JSON text with Python `json.dumps` separators (`", "` and `": "`, non-ASCII kept), the layout the
//! prompt formats use for schemas and tool arguments.

use serde_json::Value;

/// How floating-point numbers are spelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatStyle {
    /// serde_json's shortest spelling: `100000.0`, `1.5e-7`, `1e16` (the V4 format).
    Serde,
    /// Python's `repr(float)`: `100000.0`, `1.5e-07`, `1e+16` (the V4.1 format).
    Python,
}

pub fn dumps(value: &Value, style: FloatStyle) -> String {
    let mut out = String::new();
    write_value(&mut out, value, style);
    out
}

fn write_value(out: &mut String, value: &Value, style: FloatStyle) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (style, n.as_f64()) {
            (FloatStyle::Python, Some(f)) if n.is_f64() => out.push_str(&python_float_repr(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item, style);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(out, key);
                out.push_str(": ");
                write_value(out, item, style);
            }
            out.push('}');
        }
    }
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form outside `1e-4 <= |x| < 1e16`.
fn python_float_repr(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() { "NaN" } else if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("exponent is an integer");
    if (-4..16).contains(&exp) {
        let plain = format!("{f}");
        if plain.contains('.') {
            plain
        } else {
            plain + ".0"
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

fn write_string(out: &mut String, s: &str) {
    // serde_json escapes the same characters as Python with ensure_ascii=False.
    out.push_str(&serde_json::to_string(s).expect("strings always serialize"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_like_python() {
        let v: Value = serde_json::from_str(r#"{"a":[1,true,null,1e5,1.5e-7],"b":"é\n"}"#).unwrap();
        assert_eq!(dumps(&v, FloatStyle::Serde), "{\"a\": [1, true, null, 100000.0, 1.5e-7], \"b\": \"é\\n\"}");
        assert_eq!(dumps(&v, FloatStyle::Python), "{\"a\": [1, true, null, 100000.0, 1.5e-07], \"b\": \"é\\n\"}");
    }

    #[test]
    fn python_floats() {
        assert_eq!(python_float_repr(1e16), "1e+16");
        assert_eq!(python_float_repr(0.0001), "0.0001");
        assert_eq!(python_float_repr(123456789012345680.0), "1.2345678901234568e+17");
    }
}
