//! JSON text exactly as Python's `json.dumps(value, ensure_ascii=False)` writes it: `", "` and
//! `": "` separators and Python float spelling. The prompt formats were defined with Python.

use serde_json::{Number, Value};

pub fn dumps(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item);
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
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

fn write_string(out: &mut String, s: &str) {
    // serde_json escapes the same characters as Python with ensure_ascii=False.
    out.push_str(&serde_json::to_string(s).expect("strings always serialize"));
}

fn write_number(out: &mut String, n: &Number) {
    match n.as_f64() {
        Some(f) if n.is_f64() => out.push_str(&python_float_repr(f)),
        _ => out.push_str(&n.to_string()),
    }
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form outside `1e-4 <= |x| < 1e16`.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_python() {
        assert_eq!(python_float_repr(1.5), "1.5");
        assert_eq!(python_float_repr(1e5), "100000.0");
        assert_eq!(python_float_repr(1e16), "1e+16");
        assert_eq!(python_float_repr(1.5e-5), "1.5e-05");
        assert_eq!(python_float_repr(0.0001), "0.0001");
        assert_eq!(python_float_repr(123456789012345680.0), "1.2345678901234568e+17");
    }

    #[test]
    fn separators_like_python() {
        let v: Value = serde_json::from_str(r#"{"a":[1,true,null],"b":"é\n"}"#).unwrap();
        assert_eq!(dumps(&v), "{\"a\": [1, true, null], \"b\": \"é\\n\"}");
    }
}
