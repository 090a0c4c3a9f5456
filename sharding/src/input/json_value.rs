//! JSON values to sample values, for JSONL inputs.
//!
//! Inference from a record's value ([`infer_encoding`]): string → `str`, integer → `int` (`uint64`
//! above `i64::MAX`), other number → `float64`, bool → `uint8` (0 or 1: MDS has no bool encoding,
//! and a fixed-size numpy `uint8` collates into tensors), null, array or object → `json`.
//!
//! Conversion for a given encoding ([`json_to_value`]):
//! - `str`: a string. `bytes`: a string (its UTF-8 bytes) or an array of integers 0..=255.
//! - `int`, `uint8`...`int64`: an integer in range (a bool counts as 0/1).
//!   `float16`/`float32`/`float64`: any number.
//! - `str_int`: an integer (or a string of digits); `str_float`: a number; `str_decimal`: a number or
//!   a string (the text is kept as written).
//! - `json`: anything. `ndarray[:DTYPE[:SHAPE]]`: a (nested, rectangular) array of numbers; without
//!   a dtype, `int64` when every element is an integer, else `float64`.
//!
//! Image, pickle and list encodings cannot come from JSON and are refused.

use serde_json::Value as Json;

use crate::value::{DType, NdArray, Scalar, Value};

/// The encoding inferred for a JSON value (see the module doc).
pub fn infer_encoding(value: &Json) -> &'static str {
    match value {
        Json::String(_) => "str",
        Json::Bool(_) => "uint8",
        Json::Number(n) if n.is_i64() => "int",
        Json::Number(n) if n.is_u64() => "uint64",
        Json::Number(_) => "float64",
        Json::Null | Json::Array(_) | Json::Object(_) => "json",
    }
}

/// Whether [`json_to_value`] can produce values of `encoding` (checked once per column, before any
/// record is read).
pub fn check_encoding(encoding: &str) -> Result<(), String> {
    match encoding {
        "str" | "bytes" | "int" | "str_int" | "str_float" | "str_decimal" | "json" => Ok(()),
        e if scalar_dtype(e).is_some() => Ok(()),
        e if e == "ndarray" || e.starts_with("ndarray:") => parse_ndarray(e).map(|_| ()),
        e => Err(format!("encoding {e:?} cannot be read from JSON")),
    }
}

/// Converts `value` for a column of `encoding`; the error says what is wrong (the caller adds the
/// file, line and column).
pub fn json_to_value(value: &Json, encoding: &str) -> Result<Value, String> {
    let mismatch = || format!("{} does not fit encoding {encoding}", kind(value));
    match encoding {
        "str" => value
            .as_str()
            .map(|s| Value::Str(s.to_string()))
            .ok_or_else(mismatch),
        "bytes" => match value {
            Json::String(s) => Ok(Value::Bytes(s.as_bytes().to_vec())),
            Json::Array(items) => items
                .iter()
                .map(|v| v.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect::<Option<Vec<u8>>>()
                .map(Value::Bytes)
                .ok_or_else(|| "bytes arrays hold integers 0..=255".to_string()),
            _ => Err(mismatch()),
        },
        "int" => integer(value).map(Value::Int).ok_or_else(mismatch),
        "str_int" => match value {
            Json::Number(n) if n.is_i64() || n.is_u64() => Ok(Value::StrInt(n.to_string())),
            Json::String(s) if is_integer_text(s) => Ok(Value::StrInt(s.clone())),
            _ => Err(mismatch()),
        },
        "str_float" => value.as_f64().map(Value::StrFloat).ok_or_else(mismatch),
        "str_decimal" => match value {
            Json::Number(n) => Ok(Value::StrDecimal(n.to_string())),
            Json::String(s) => Ok(Value::StrDecimal(s.clone())),
            _ => Err(mismatch()),
        },
        "json" => Ok(Value::Json(value.clone())),
        e if e == "ndarray" || e.starts_with("ndarray:") => to_ndarray(value, e),
        e => match scalar_dtype(e) {
            Some(dtype) => element_bytes(value, dtype)
                .map(|bytes| Value::Scalar(Scalar { dtype, bytes }))
                .ok_or_else(mismatch),
            None => Err(format!("encoding {e:?} cannot be read from JSON")),
        },
    }
}

fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a bool",
        Json::Number(n) if n.is_f64() => "a float",
        Json::Number(_) => "an integer",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

fn is_integer_text(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn integer(value: &Json) -> Option<i64> {
    match value {
        Json::Bool(b) => Some(i64::from(*b)),
        Json::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// The numpy scalar encodings (`uint8` ... `float64`; `bool` is not an MDS encoding).
fn scalar_dtype(encoding: &str) -> Option<DType> {
    DType::from_name(encoding).filter(|d| *d != DType::Bool)
}

/// The little-endian bytes of a JSON number as `dtype`, if it fits.
fn element_bytes(value: &Json, dtype: DType) -> Option<Vec<u8>> {
    let int = || -> Option<i128> {
        match value {
            Json::Bool(b) => Some(i128::from(*b)),
            Json::Number(n) => n
                .as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from)),
            _ => None,
        }
    };
    let float = || {
        value
            .as_f64()
            .or_else(|| value.as_bool().map(|b| f64::from(u8::from(b))))
    };
    Some(match dtype {
        DType::U8 => u8::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::U16 => u16::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::U32 => u32::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::U64 => u64::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::I8 => i8::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::I16 => i16::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::I32 => i32::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::I64 => i64::try_from(int()?).ok()?.to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(float()?).to_le_bytes().to_vec(),
        DType::F32 => (float()? as f32).to_le_bytes().to_vec(),
        DType::F64 => float()?.to_le_bytes().to_vec(),
        DType::Bool => return None,
    })
}

/// `ndarray[:DTYPE[:D1,D2,...]]` → (dtype, shape).
type NdSpec = (Option<DType>, Option<Vec<u64>>);

fn parse_ndarray(encoding: &str) -> Result<NdSpec, String> {
    let bad = || format!("invalid ndarray encoding {encoding:?}");
    let mut parts = encoding.splitn(3, ':');
    parts.next();
    let dtype = match parts.next() {
        None => None,
        Some(name) => Some(scalar_dtype(name).ok_or_else(bad)?),
    };
    let shape = match parts.next() {
        None => None,
        Some(dims) => Some(
            dims.split(',')
                .map(|d| d.trim().parse::<u64>().ok().filter(|d| *d > 0))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(bad)?,
        ),
    };
    Ok((dtype, shape))
}

fn to_ndarray(value: &Json, encoding: &str) -> Result<Value, String> {
    let (dtype, want_shape) = parse_ndarray(encoding)?;
    let mut shape = Vec::new();
    let mut level = value;
    while let Json::Array(items) = level {
        shape.push(items.len() as u64);
        match items.first() {
            Some(first) => level = first,
            None => break,
        }
    }
    if shape.is_empty() || shape.contains(&0) {
        return Err("an ndarray needs a non-empty (nested) array".into());
    }
    let mut leaves = Vec::new();
    flatten(value, &shape, &mut leaves)?;
    let dtype = dtype.unwrap_or(if leaves.iter().all(|v| v.is_i64()) {
        DType::I64
    } else {
        DType::F64
    });
    if let Some(want) = want_shape {
        if want != shape {
            return Err(format!("array of shape {shape:?} does not fit {encoding}"));
        }
    }
    let mut data = Vec::with_capacity(leaves.len() * dtype.size());
    for leaf in leaves {
        let bytes = element_bytes(leaf, dtype)
            .ok_or_else(|| format!("element {leaf} does not fit dtype {}", dtype.name()))?;
        data.extend_from_slice(&bytes);
    }
    Ok(Value::NdArray(NdArray { dtype, shape, data }))
}

/// Collects the leaves of a rectangular nested array of `shape`, in C order.
fn flatten<'a>(value: &'a Json, shape: &[u64], out: &mut Vec<&'a Json>) -> Result<(), String> {
    match (shape.split_first(), value) {
        (None, Json::Number(_)) => {
            out.push(value);
            Ok(())
        }
        (Some((len, rest)), Json::Array(items)) if items.len() as u64 == *len => {
            items.iter().try_for_each(|item| flatten(item, rest, out))
        }
        _ => Err("an ndarray needs a rectangular array of numbers".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn infers_documented_encodings() {
        assert_eq!(infer_encoding(&json!("a")), "str");
        assert_eq!(infer_encoding(&json!(3)), "int");
        assert_eq!(infer_encoding(&json!(u64::MAX)), "uint64");
        assert_eq!(infer_encoding(&json!(1.5)), "float64");
        assert_eq!(infer_encoding(&json!(true)), "uint8");
        assert_eq!(infer_encoding(&json!([1])), "json");
        assert_eq!(infer_encoding(&json!(null)), "json");
    }

    #[test]
    fn converts_scalars_with_range_checks() {
        assert_eq!(json_to_value(&json!(7), "int").unwrap(), Value::Int(7));
        assert!(json_to_value(&json!(1.5), "int").is_err());
        assert!(json_to_value(&json!("7"), "int").is_err());
        assert_eq!(
            json_to_value(&json!(true), "uint8").unwrap(),
            Value::Scalar(Scalar {
                dtype: DType::U8,
                bytes: vec![1]
            })
        );
        assert!(json_to_value(&json!(256), "uint8").is_err());
        assert!(json_to_value(&json!(-1), "uint32").is_err());
        assert_eq!(
            json_to_value(&json!(2), "float32").unwrap(),
            Value::Scalar(Scalar {
                dtype: DType::F32,
                bytes: 2f32.to_le_bytes().to_vec()
            })
        );
        assert_eq!(
            json_to_value(&json!("-12"), "str_int").unwrap(),
            Value::StrInt("-12".into())
        );
        assert!(json_to_value(&json!("1e3"), "str_int").is_err());
        assert_eq!(
            json_to_value(&json!([0, 255]), "bytes").unwrap(),
            Value::Bytes(vec![0, 255])
        );
        assert!(json_to_value(&json!("x"), "jpeg").is_err());
    }

    #[test]
    fn converts_nested_arrays() {
        let v = json_to_value(&json!([[1, 2], [3, 4]]), "ndarray:uint16:2,2").unwrap();
        let Value::NdArray(a) = v else {
            panic!("not an ndarray")
        };
        assert_eq!((a.dtype, a.shape.clone()), (DType::U16, vec![2, 2]));
        assert_eq!(
            a.data,
            [1u16, 2, 3, 4]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<_>>()
        );
        let Value::NdArray(f) = json_to_value(&json!([1, 2.5]), "ndarray").unwrap() else {
            panic!("not an ndarray")
        };
        assert_eq!(f.dtype, DType::F64);
        assert!(json_to_value(&json!([[1], [2, 3]]), "ndarray").is_err());
        assert!(json_to_value(&json!([]), "ndarray").is_err());
        assert!(json_to_value(&json!([1, 2]), "ndarray:int8:3").is_err());
        assert!(check_encoding("ndarray:float32:3,224,224").is_ok());
        assert!(check_encoding("ndarray:bool").is_err());
        assert!(check_encoding("pkl").is_err());
    }
}
