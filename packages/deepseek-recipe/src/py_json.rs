//! JSON text with Python `json.dumps` separators (`", "` and `": "`, non-ASCII kept), the layout the
//! prompt formats use for schemas and tool arguments.

use serde_json::Value;

pub fn dumps(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        // Numbers keep serde_json's spelling (`100000.0`, `1.5e-7`), as the reference does.
        Value::Number(n) => out.push_str(&n.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_like_python() {
        let v: Value = serde_json::from_str(r#"{"a":[1,true,null,1e5,1.5e-7],"b":"é\n"}"#).unwrap();
        assert_eq!(dumps(&v), "{\"a\": [1, true, null, 100000.0, 1.5e-7], \"b\": \"é\\n\"}");
    }
}
