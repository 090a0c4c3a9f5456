//! Python's `json.dumps` and `repr(float)`, reproduced byte for byte.
//!
//! MDS stores JSON written by Python in three places: `index.json`
//! (`json.dump(obj, sort_keys=True)`), the config at the head of every shard
//! (`json.dumps(config, sort_keys=True)`) and `json` columns (`json.dumps(obj)`). A byte-compatible
//! writer must match the default separators (`", "` and `": "`), `ensure_ascii` escaping (every
//! character outside `' '..='~'` as `\uXXXX`, surrogate pairs above the BMP, lowercase hex) and
//! Python's float repr (`1.0`, `1e-05`, `1e+16`), which `serde_json`'s formatter does not.
//!
//! ```
//! use shardstream_sharding::mds::pyjson::{dumps, float_repr};
//! let v = serde_json::json!({"b": [1, 2.5, "é"], "a": null});
//! assert_eq!(dumps(&v, true), r#"{"a": null, "b": [1, 2.5, "\u00e9"]}"#);
//! assert_eq!(float_repr(1e16), "1e+16");
//! assert_eq!(float_repr(0.0001), "0.0001");
//! ```

use std::fmt::Write as _;

use serde_json::Value as Json;

/// `json.dumps(value, sort_keys=sort_keys)` with every other argument at its default.
pub fn dumps(value: &Json, sort_keys: bool) -> String {
    let mut out = String::new();
    write_value(&mut out, value, sort_keys);
    out
}

/// Appends `json.dumps(value, sort_keys=...)` to `out`.
pub fn write_value(out: &mut String, value: &Json, sort_keys: bool) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(true) => out.push_str("true"),
        Json::Bool(false) => out.push_str("false"),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else {
                out.push_str(&json_float(n.as_f64().unwrap_or(f64::NAN)));
            }
        }
        Json::String(s) => write_str(out, s),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item, sort_keys);
            }
            out.push(']');
        }
        Json::Object(map) => {
            let mut entries: Vec<(&String, &Json)> = map.iter().collect();
            if sort_keys {
                // Rust orders strings by UTF-8 bytes, which is code-point order, as Python sorts.
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(out, key);
                out.push_str(": ");
                write_value(out, item, sort_keys);
            }
            out.push('}');
        }
    }
}

/// Appends a JSON string literal with `ensure_ascii=True` escaping.
pub fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

/// How `json.dumps` writes a float: `repr`, except the non-finite values.
pub fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        float_repr(f)
    }
}

/// Python's `repr(float)` (and `str(float)`): the shortest digits that round-trip, in fixed
/// notation when the decimal exponent is in `-4..16`, else scientific with a signed two-digit
/// (at least) exponent; integral values keep a `.0`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    let (digits, exp) = shortest_digits(f.abs());
    let mut out = String::from(if f.is_sign_negative() { "-" } else { "" });
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// Splits `{:e}` output of a non-negative number into its digits and decimal exponent.
fn split_sci(sci: &str) -> (String, i32) {
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci, "0"));
    let digits = mantissa.chars().filter(|c| *c != '.').collect();
    (digits, exp.parse().unwrap_or(0))
}

/// The shortest digits that round-trip to `a` (finite, non-negative) and its exponent, chosen as
/// CPython's dtoa (mode 0) chooses: nearest the exact value, ties to an even last digit.
fn shortest_digits(a: f64) -> (String, i32) {
    // Rust's `{:e}` prints the shortest round-tripping digits nearest the exact value; it only
    // differs from Python when two candidates are equally near (exact value = ...d5).
    let (digits, exp) = split_sci(&format!("{a:e}"));
    let n = digits.len();
    if a == 0.0 {
        return (digits, exp);
    }
    // A tie needs the exact expansion to stop right after one more digit, a 5.
    let probe = split_sci(&format!("{a:.*e}", n + 20)).0;
    let tie_shape = |d: &str| {
        d.as_bytes().get(n) == Some(&b'5')
            && d.get(n + 1..)
                .is_some_and(|rest| rest.bytes().all(|b| b == b'0'))
    };
    if !tie_shape(&probe) {
        return (digits, exp);
    }
    let (exact, exact_exp) = split_sci(&format!("{a:.800e}"));
    if exact_exp != exp || !tie_shape(&exact) {
        return (digits, exp);
    }
    // The two candidates: the exact value truncated to n digits, and one unit above it.
    let lower = exact.get(..n).unwrap_or_default().to_string();
    let mut upper = lower.clone().into_bytes();
    // A carry would change the length; keep Rust's answer in that (never observed) case.
    if let Some(last) = upper.last_mut() {
        if *last == b'9' {
            return (digits, exp);
        }
        *last += 1;
    }
    let upper = String::from_utf8(upper).unwrap_or_default();
    let lower_even = lower.bytes().last().is_some_and(|b| b % 2 == 0);
    let even_first = if lower_even {
        [&lower, &upper]
    } else {
        [&upper, &lower]
    };
    for cand in even_first {
        let (head, tail) = cand.split_at(1.min(cand.len()));
        let text = format!("{head}.{tail}e{exp}");
        if text.parse::<f64>() == Ok(a) {
            return (cand.trim_end_matches('0').to_string(), exp);
        }
    }
    (digits, exp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn float_repr_matches_python() {
        // Each pair printed by CPython 3.11 `repr(x)`.
        let cases: [(f64, &str); 23] = [
            (0.1, "0.1"),
            (1e-05, "1e-05"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (123456789.125, "123456789.125"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (f64::MIN_POSITIVE, "2.2250738585072014e-308"),
            (0.30000000000000004, "0.30000000000000004"),
            (1234567890123456.7, "1234567890123456.8"),
            (-1006567402717677.2, "-1006567402717677.2"),
            (12345678901234567.0, "1.2345678901234568e+16"),
            (0.00012345, "0.00012345"),
            (0.000012345, "1.2345e-05"),
            (1e100, "1e+100"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f:e}");
        }
        assert_eq!(float_repr(f64::NAN), "nan");
        assert_eq!(json_float(f64::NAN), "NaN");
        assert_eq!(json_float(f64::NEG_INFINITY), "-Infinity");
    }

    #[test]
    fn dumps_matches_python() {
        // Expected strings printed by CPython 3.11 json.dumps.
        let v = json!({"z": 1, "a": [true, false, null, -3, 18446744073709551615u64, 0.5], "m": {}, "e": []});
        assert_eq!(
            dumps(&v, true),
            r#"{"a": [true, false, null, -3, 18446744073709551615, 0.5], "e": [], "m": {}, "z": 1}"#
        );
        assert_eq!(
            dumps(&v, false),
            r#"{"z": 1, "a": [true, false, null, -3, 18446744073709551615, 0.5], "m": {}, "e": []}"#
        );
        let s = json!("q\"b\\s/\n\r\t\u{8}\u{c}\u{1}\u{7f}é€😀");
        assert_eq!(
            dumps(&s, false),
            r#""q\"b\\s/\n\r\t\b\f\u0001\u007f\u00e9\u20ac\ud83d\ude00""#
        );
        assert_eq!(dumps(&json!(1e16), false), "1e+16");
        assert_eq!(dumps(&json!(100.0), false), "100.0");
    }
}
