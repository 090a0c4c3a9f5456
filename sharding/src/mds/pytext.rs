//! Python's text forms of numbers, for the `str_int`, `str_float` and `str_decimal` encodings:
//! what `int(text)`, `float(text)` and `decimal.Decimal(text)` accept, and what `str()` of the
//! result prints.

/// Python's whitespace for number parsing (ASCII subset; Python also strips Unicode spaces).
fn trim(text: &str) -> &str {
    text.trim_matches(|c: char| c.is_ascii_whitespace() || c == '\u{b}')
}

/// Removes `_` separators that sit between two ASCII digits; `None` if any other `_` is present.
fn strip_underscores(text: &str) -> Option<String> {
    if !text.contains('_') {
        return Some(text.to_string());
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'_' {
            let before = i.checked_sub(1).and_then(|j| bytes.get(j));
            let after = bytes.get(i + 1);
            if !matches!((before, after), (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit())
            {
                return None;
            }
        } else {
            out.push(char::from(b));
        }
    }
    Some(out)
}

/// `str(int(text))` for a decimal integer literal, or `None` if Python would refuse it.
pub(crate) fn normalize_int(text: &str) -> Option<String> {
    if !text.is_ascii() {
        return None;
    }
    let t = strip_underscores(trim(text))?;
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t.as_str()),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = digits.trim_start_matches('0');
    Some(match (digits.is_empty(), negative) {
        (true, _) => "0".to_string(),
        (false, true) => format!("-{digits}"),
        (false, false) => digits.to_string(),
    })
}

/// `float(text)`, or `None` if Python would refuse it.
pub(crate) fn parse_float(text: &str) -> Option<f64> {
    if !text.is_ascii() {
        return None;
    }
    let t = strip_underscores(trim(text))?;
    let body = t.trim_start_matches(['+', '-']);
    if t.len() - body.len() > 1 {
        return None;
    }
    // Rust also accepts these words case-insensitively; Python accepts exactly these three.
    let word = body.to_ascii_lowercase();
    if body
        .bytes()
        .any(|b| b.is_ascii_alphabetic() && b != b'e' && b != b'E')
        && !matches!(word.as_str(), "inf" | "infinity" | "nan")
    {
        return None;
    }
    t.parse().ok()
}

/// `str(Decimal(text))`, or `None` if `Decimal` would refuse the text.
pub(crate) fn normalize_decimal(text: &str) -> Option<String> {
    if !text.is_ascii() {
        return None;
    }
    let t = strip_underscores(trim(text))?;
    let (sign, body) = match t.as_bytes().first() {
        Some(b'-') => ("-", &t[1..]),
        Some(b'+') => ("", &t[1..]),
        _ => ("", t.as_str()),
    };
    let lower = body.to_ascii_lowercase();
    if lower == "inf" || lower == "infinity" {
        return Some(format!("{sign}Infinity"));
    }
    for (prefix, name) in [("snan", "sNaN"), ("nan", "NaN")] {
        if let Some(payload) = lower.strip_prefix(prefix) {
            if !payload.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            return Some(format!("{sign}{name}{}", payload.trim_start_matches('0')));
        }
    }
    let (mantissa, exp) = match lower.find('e') {
        Some(i) => (&lower[..i], Some(&lower[i + 1..])),
        None => (lower.as_str(), None),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (int_part.is_empty() && frac_part.is_empty())
        || !all_digits(int_part)
        || !all_digits(frac_part)
    {
        return None;
    }
    let exp: i64 = match exp {
        None => 0,
        Some(e) => {
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits.is_empty() || !all_digits(digits) {
                return None;
            }
            e.parse().ok()?
        }
    };
    let exp = exp.checked_sub(i64::try_from(frac_part.len()).ok()?)?;
    let coefficient = format!("{int_part}{frac_part}");
    let coefficient = match coefficient.trim_start_matches('0') {
        "" => "0",
        c => c,
    };
    // Decimal.__str__ (to-sci-string), eng=False, capitals on.
    let len = i64::try_from(coefficient.len()).ok()?;
    let leftdigits = exp.checked_add(len)?;
    let dotplace = if exp <= 0 && leftdigits > -6 {
        leftdigits
    } else {
        1
    };
    let (intpart, fracpart) = if dotplace <= 0 {
        let zeros = "0".repeat(usize::try_from(-dotplace).ok()?);
        ("0".to_string(), format!(".{zeros}{coefficient}"))
    } else if dotplace >= len {
        let zeros = "0".repeat(usize::try_from(dotplace - len).ok()?);
        (format!("{coefficient}{zeros}"), String::new())
    } else {
        let split = usize::try_from(dotplace).ok()?;
        (
            coefficient[..split].to_string(),
            format!(".{}", &coefficient[split..]),
        )
    };
    let exp_text = if leftdigits == dotplace {
        String::new()
    } else {
        format!("E{:+}", leftdigits - dotplace)
    };
    Some(format!("{sign}{intpart}{fracpart}{exp_text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_like_python() {
        for (text, want) in [
            ("7", "7"),
            (" +007 ", "7"),
            ("-0", "0"),
            ("-12_345", "-12345"),
            ("0_0", "0"),
        ] {
            assert_eq!(normalize_int(text).as_deref(), Some(want), "{text:?}");
        }
        for bad in ["", "-", "1.0", "_1", "1_", "1__0", "0x10", "+-1"] {
            assert_eq!(normalize_int(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn floats_like_python() {
        assert_eq!(parse_float(" 1_0.5 "), Some(10.5));
        assert_eq!(parse_float("-Infinity"), Some(f64::NEG_INFINITY));
        assert!(parse_float("nan").is_some_and(f64::is_nan));
        assert_eq!(parse_float(".5"), Some(0.5));
        assert_eq!(parse_float("1E5"), Some(1e5));
        for bad in ["", "1,5", "0x1p3", "infinit", "--1", "1e", "abc"] {
            assert_eq!(parse_float(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn decimals_like_python() {
        // Right-hand sides printed by CPython 3.11 str(Decimal(lhs)).
        for (text, want) in [
            ("1.50", "1.50"),
            ("1e2", "1E+2"),
            ("+1.5", "1.5"),
            ("inf", "Infinity"),
            ("-Inf", "-Infinity"),
            ("nan", "NaN"),
            ("NaN007", "NaN7"),
            ("-snan", "-sNaN"),
            (".5", "0.5"),
            ("5.", "5"),
            ("1_000", "1000"),
            ("-0", "-0"),
            ("0.0000001", "1E-7"),
            ("0.000001", "0.000001"),
            ("123.456e-10", "1.23456E-8"),
            ("12345e3", "1.2345E+7"),
            ("0e5", "0E+5"),
            ("0.00", "0.00"),
        ] {
            assert_eq!(normalize_decimal(text).as_deref(), Some(want), "{text:?}");
        }
        for bad in ["", ".", "1..2", "1e", "e5", "nan1.5", "abc", "1 2"] {
            assert_eq!(normalize_decimal(bad), None, "{bad:?}");
        }
    }
}
