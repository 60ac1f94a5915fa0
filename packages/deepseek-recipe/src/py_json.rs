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
    // Rust's shortest spelling gives the digit count, but when two candidates of that length are equally
    // near the exact value it may take the upper one (562949953421312.25 -> "...312.3"); Python takes the
    // even one ("...312.2"), which is what exact formatting at that length does.
    let shortest = format!("{f:e}");
    let count = shortest.bytes().take_while(|&b| b != b'e').filter(u8::is_ascii_digit).count();
    let sci = format!("{:.*e}", count - 1, f);
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("exponent is an integer");
    if (-4..16).contains(&exp) {
        let sign = if f < 0.0 { "-" } else { "" };
        let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else if point as usize >= digits.len() {
            format!("{sign}{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{sign}{int}.{frac}")
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
        assert_eq!(python_float_repr(-1.5e-5), "-1.5e-05");
        assert_eq!(python_float_repr(-0.00012), "-0.00012");
        assert_eq!(python_float_repr(1e15), "1000000000000000.0");
        assert_eq!(python_float_repr(0.5), "0.5");
    }

    #[test]
    fn python_float_ties_go_to_even() {
        // Exactly halfway between ...312.2 and ...312.3, both of which round-trip.
        assert_eq!(python_float_repr(562949953421312.25), "562949953421312.2");
        assert_eq!(python_float_repr(-562949953421312.25), "-562949953421312.2");
    }
}
