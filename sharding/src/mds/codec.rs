//! Value to bytes and back for every [`Encoding`], following `mds/encodings.py`.

use crate::mds::encoding::Encoding;
use crate::mds::{ndarray, pyjson, pytext};
use crate::value::{DType, ImageFormat, NdArray, PilImage, Scalar, Value};

type Reason = String;

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Bytes(_) => "bytes",
        Value::Str(_) => "str",
        Value::Int(_) => "int",
        Value::Float(_) => "float",
        Value::Bool(_) => "bool",
        Value::Scalar(_) => "numpy scalar",
        Value::StrInt(_) => "str_int",
        Value::StrFloat(_) => "str_float",
        Value::StrDecimal(_) => "str_decimal",
        Value::Json(_) => "json",
        Value::Pil(_) => "pil image",
        Value::Image(ImageFormat::Jpeg, _) => "jpeg image",
        Value::Image(ImageFormat::Png, _) => "png image",
        Value::List(_) => "list",
        Value::NdArray(_) => "ndarray",
        Value::Pickle(_) => "pickle",
    }
}

fn mismatch(expected: &str, value: &Value) -> Reason {
    format!("expected {expected}, got a {} value", kind(value))
}

fn u32_len(len: usize, what: &str) -> Result<[u8; 4], Reason> {
    u32::try_from(len)
        .map(u32::to_le_bytes)
        .map_err(|_| format!("{what} of {len} exceeds the u32 size field"))
}

impl Encoding {
    /// Appends the encoding of `value` to `out`; on error `out` may hold a partial encoding.
    pub(crate) fn encode_into(&self, value: &Value, out: &mut Vec<u8>) -> Result<(), Reason> {
        let start = out.len();
        if let Value::Bytes(b) = value {
            // Mosaic's mds_encode: bytes pass through for any encoding.
            out.extend_from_slice(b);
        } else {
            self.encode_typed(value, out)?;
        }
        if let Some(size) = self.fixed_size() {
            let len = (out.len() - start) as u64;
            if len != size {
                return Err(format!(
                    "encoded to {len} bytes, but the encoding has a fixed size of {size}"
                ));
            }
        }
        Ok(())
    }

    fn encode_typed(&self, value: &Value, out: &mut Vec<u8>) -> Result<(), Reason> {
        match (self, value) {
            (Encoding::Str, Value::Str(s)) => out.extend_from_slice(s.as_bytes()),
            (Encoding::Int, Value::Int(i)) => out.extend_from_slice(&i.to_le_bytes()),
            (Encoding::Int, Value::Bool(b)) => out.extend_from_slice(&i64::from(*b).to_le_bytes()),
            (Encoding::Scalar(d), v) => out.extend_from_slice(&scalar_bytes(*d, v)?),
            (Encoding::StrInt, Value::Int(i)) => out.extend_from_slice(i.to_string().as_bytes()),
            (Encoding::StrInt, Value::StrInt(t)) => {
                let text =
                    pytext::normalize_int(t).ok_or_else(|| format!("{t:?} is not an int"))?;
                out.extend_from_slice(text.as_bytes());
            }
            (Encoding::StrFloat, Value::Float(f) | Value::StrFloat(f)) => {
                out.extend_from_slice(pyjson::float_repr(*f).as_bytes())
            }
            (Encoding::StrDecimal, Value::Int(i)) => {
                out.extend_from_slice(i.to_string().as_bytes())
            }
            (Encoding::StrDecimal, Value::StrDecimal(t)) => {
                let text = pytext::normalize_decimal(t)
                    .ok_or_else(|| format!("{t:?} is not a decimal"))?;
                out.extend_from_slice(text.as_bytes());
            }
            (Encoding::Pil, Value::Pil(p)) => encode_pil(p, out)?,
            (Encoding::Jpeg, Value::Image(ImageFormat::Jpeg, b))
            | (Encoding::Png, Value::Image(ImageFormat::Png, b))
            | (Encoding::Pickle, Value::Pickle(b)) => out.extend_from_slice(b),
            (Encoding::JpegArray, Value::List(items)) => encode_jpeg_array(items, out)?,
            (Encoding::PilList | Encoding::JpegList | Encoding::PngList, Value::List(items)) => {
                self.encode_list(items, out)?
            }
            (Encoding::Json, v) => out.extend_from_slice(json_text(v)?.as_bytes()),
            (Encoding::NdArray { dtype, shape }, Value::NdArray(a)) => {
                ndarray::encode(*dtype, shape.as_deref(), a, out)?
            }
            (enc, v) => return Err(mismatch(&expected_kind(enc), v)),
        }
        Ok(())
    }

    /// `list[pil]` / `list[jpeg]` / `list[png]`: placeholder, count, sizes, elements.
    fn encode_list(&self, items: &[Value], out: &mut Vec<u8>) -> Result<(), Reason> {
        let element = match self {
            Encoding::PilList => Encoding::Pil,
            Encoding::JpegList => Encoding::Jpeg,
            _ => Encoding::Png,
        };
        let mut encoded = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let mut buf = Vec::new();
            element
                .encode_into(item, &mut buf)
                .map_err(|e| format!("element {i}: {e}"))?;
            encoded.push(buf);
        }
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&u32_len(items.len(), "list length")?);
        for e in &encoded {
            out.extend_from_slice(&u32_len(e.len(), "element")?);
        }
        for e in encoded {
            out.extend_from_slice(&e);
        }
        Ok(())
    }

    /// Decodes one column's bytes.
    pub(crate) fn decode_value(&self, data: &[u8]) -> Result<Value, Reason> {
        if let Some(size) = self.fixed_size() {
            if data.len() as u64 != size {
                return Err(format!("{} bytes, expected {size}", data.len()));
            }
        }
        let utf8 = |data: &[u8]| {
            std::str::from_utf8(data)
                .map(str::to_string)
                .map_err(|e| format!("invalid UTF-8: {e}"))
        };
        Ok(match self {
            Encoding::Bytes => Value::Bytes(data.to_vec()),
            Encoding::Str => Value::Str(utf8(data)?),
            Encoding::Int => Value::Int(i64::from_le_bytes(fixed::<8>(data)?)),
            Encoding::Scalar(d) => Value::Scalar(Scalar {
                dtype: *d,
                bytes: data.to_vec(),
            }),
            Encoding::StrInt => {
                let t = utf8(data)?;
                Value::StrInt(
                    pytext::normalize_int(&t).ok_or_else(|| format!("{t:?} is not an int"))?,
                )
            }
            Encoding::StrFloat => {
                let t = utf8(data)?;
                Value::StrFloat(
                    pytext::parse_float(&t).ok_or_else(|| format!("{t:?} is not a float"))?,
                )
            }
            Encoding::StrDecimal => {
                let t = utf8(data)?;
                Value::StrDecimal(
                    pytext::normalize_decimal(&t)
                        .ok_or_else(|| format!("{t:?} is not a decimal"))?,
                )
            }
            Encoding::Pil => Value::Pil(decode_pil(data)?),
            Encoding::Jpeg => Value::Image(ImageFormat::Jpeg, data.to_vec()),
            Encoding::Png => Value::Image(ImageFormat::Png, data.to_vec()),
            Encoding::JpegArray => {
                let n =
                    u32::from_le_bytes(fixed::<4>(data.get(..4).ok_or("shorter than 4 bytes")?)?);
                if n == 0 {
                    return Err("jpeg_array holds no images".into());
                }
                let parts = split_sized(&data[4..], n)?;
                Value::List(
                    parts
                        .into_iter()
                        .map(|p| Value::Image(ImageFormat::Jpeg, p.to_vec()))
                        .collect(),
                )
            }
            Encoding::PilList | Encoding::JpegList | Encoding::PngList => {
                let head = data.get(..8).ok_or("shorter than the 8-byte list header")?;
                let n = u32::from_le_bytes(fixed::<4>(&head[4..])?);
                let parts = split_sized(&data[8..], n)?;
                let mut items = Vec::with_capacity(parts.len());
                for (i, p) in parts.into_iter().enumerate() {
                    items.push(match self {
                        Encoding::PilList => {
                            Value::Pil(decode_pil(p).map_err(|e| format!("element {i}: {e}"))?)
                        }
                        Encoding::JpegList => Value::Image(ImageFormat::Jpeg, p.to_vec()),
                        _ => Value::Image(ImageFormat::Png, p.to_vec()),
                    });
                }
                Value::List(items)
            }
            Encoding::Pickle => Value::Pickle(data.to_vec()),
            Encoding::Json => {
                Value::Json(serde_json::from_slice(data).map_err(|e| format!("invalid JSON: {e}"))?)
            }
            Encoding::NdArray { dtype, shape } => {
                Value::NdArray(ndarray::decode(*dtype, shape.as_deref(), data)?)
            }
        })
    }
}

fn expected_kind(enc: &Encoding) -> String {
    match enc {
        Encoding::Bytes => "bytes".into(),
        Encoding::Str => "a str".into(),
        Encoding::Int => "an int".into(),
        Encoding::StrInt => "an int".into(),
        Encoding::StrFloat => "a float".into(),
        Encoding::StrDecimal => "a decimal or an int".into(),
        Encoding::Pil => "a pil image".into(),
        Encoding::Jpeg => "a jpeg image".into(),
        Encoding::Png => "a png image".into(),
        Encoding::JpegArray | Encoding::PilList | Encoding::JpegList | Encoding::PngList => {
            "a list of images".into()
        }
        Encoding::Pickle => "pickle bytes".into(),
        Encoding::NdArray { .. } => "an ndarray".into(),
        other => format!("a value for {other}"),
    }
}

fn fixed<const N: usize>(data: &[u8]) -> Result<[u8; N], Reason> {
    data.get(..N)
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or_else(|| format!("expected {N} bytes, got {}", data.len()))
}

/// Reads `n` u32 sizes then the `n` parts they describe; trailing bytes are ignored, as Python's
/// slicing ignores them.
fn split_sized(data: &[u8], n: u32) -> Result<Vec<&[u8]>, Reason> {
    let table_len = u64::from(n) * 4;
    if (data.len() as u64) < table_len {
        return Err(format!(
            "{n} element sizes need {table_len} bytes, {} left",
            data.len()
        ));
    }
    let (table, mut rest) = data.split_at(table_len as usize);
    let mut parts = Vec::with_capacity(n as usize);
    for (i, c) in table.chunks_exact(4).enumerate() {
        let size = u32::from_le_bytes(fixed::<4>(c)?) as usize;
        if size > rest.len() {
            return Err(format!(
                "element {i} of {size} bytes runs past the end ({} left)",
                rest.len()
            ));
        }
        let (part, tail) = rest.split_at(size);
        parts.push(part);
        rest = tail;
    }
    Ok(parts)
}

fn encode_pil(p: &PilImage, out: &mut Vec<u8>) -> Result<(), Reason> {
    out.extend_from_slice(&p.width.to_le_bytes());
    out.extend_from_slice(&p.height.to_le_bytes());
    out.extend_from_slice(&u32_len(p.mode.len(), "mode")?);
    out.extend_from_slice(p.mode.as_bytes());
    out.extend_from_slice(&p.data);
    Ok(())
}

fn decode_pil(data: &[u8]) -> Result<PilImage, Reason> {
    let head = data
        .get(..12)
        .ok_or("shorter than the 12-byte pil header")?;
    let width = u32::from_le_bytes(fixed::<4>(head)?);
    let height = u32::from_le_bytes(fixed::<4>(&head[4..])?);
    let mode_len = u32::from_le_bytes(fixed::<4>(&head[8..])?) as usize;
    let rest = &data[12..];
    if mode_len > rest.len() {
        return Err(format!("mode of {mode_len} bytes runs past the end"));
    }
    let (mode, pixels) = rest.split_at(mode_len);
    let mode = std::str::from_utf8(mode).map_err(|e| format!("mode is not UTF-8: {e}"))?;
    Ok(PilImage {
        width,
        height,
        mode: mode.to_string(),
        data: pixels.to_vec(),
    })
}

fn encode_jpeg_array(items: &[Value], out: &mut Vec<u8>) -> Result<(), Reason> {
    if items.is_empty() {
        // Mosaic writes it, but its reader then refuses the sample.
        return Err("jpeg_array needs at least one image".into());
    }
    let mut files = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::Image(ImageFormat::Jpeg, b) | Value::Bytes(b) => files.push(b.as_slice()),
            other => return Err(format!("element {i}: {}", mismatch("jpeg bytes", other))),
        }
    }
    out.extend_from_slice(&u32_len(files.len(), "image count")?);
    for f in &files {
        out.extend_from_slice(&u32_len(f.len(), "image")?);
    }
    for f in files {
        out.extend_from_slice(f);
    }
    Ok(())
}

/// The JSON text Mosaic's `json` encoding writes for a value (`json.dumps(obj)`).
fn json_text(value: &Value) -> Result<String, Reason> {
    let mut out = String::new();
    match value {
        Value::Json(j) => pyjson::write_value(&mut out, j, false),
        Value::Str(s) => pyjson::write_str(&mut out, s),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::Float(f) => out.push_str(&pyjson::json_float(*f)),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::NdArray(a) => write_ndarray_list(&mut out, a)?,
        other => return Err(mismatch("a JSON-serialisable value", other)),
    }
    Ok(out)
}

/// `json.dumps(arr.tolist())`: nested lists, ints as ints, floats by their double's repr.
fn write_ndarray_list(out: &mut String, a: &NdArray) -> Result<(), Reason> {
    let expected = ndarray::data_len(a.dtype, &a.shape).ok_or("shape overflows")?;
    if expected != a.data.len() as u64 {
        return Err("array data does not match its shape".into());
    }
    let elements = a.dtype.elements_to_json(&a.data);
    fn rec(out: &mut String, shape: &[u64], elements: &[serde_json::Value], dtype: DType) {
        match shape.split_first() {
            None => match elements.first() {
                Some(serde_json::Value::String(s)) => out.push_str(match s.as_str() {
                    "nan" => "NaN",
                    "inf" => "Infinity",
                    _ => "-Infinity",
                }),
                Some(serde_json::Value::Number(n))
                    if matches!(dtype, DType::F16 | DType::F32 | DType::F64) =>
                {
                    out.push_str(&pyjson::float_repr(n.as_f64().unwrap_or(0.0)))
                }
                Some(v) => pyjson::write_value(out, v, false),
                None => {}
            },
            Some((&dim, rest)) => {
                let step = rest.iter().product::<u64>() as usize;
                out.push('[');
                for i in 0..dim as usize {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    let chunk = elements.get(i * step..(i + 1) * step).unwrap_or(&[]);
                    rec(out, rest, chunk, dtype);
                }
                out.push(']');
            }
        }
    }
    rec(out, &a.shape, &elements, a.dtype);
    Ok(())
}

/// Numeric value of a scalar-ish input, as numpy's scalar constructors see it.
enum Num {
    Int(i128),
    Float(f64),
}

fn num_of(value: &Value) -> Result<Num, Reason> {
    Ok(match value {
        Value::Int(i) => Num::Int(i128::from(*i)),
        Value::Bool(b) => Num::Int(i128::from(*b)),
        Value::Float(f) => Num::Float(*f),
        Value::Scalar(s) => {
            let json = s.dtype.elements_to_json(&s.bytes);
            let Some(v) = json.first().filter(|_| s.bytes.len() == s.dtype.size()) else {
                return Err(format!(
                    "scalar of {} holds {} bytes",
                    s.dtype.name(),
                    s.bytes.len()
                ));
            };
            match v {
                serde_json::Value::Number(n) if n.is_f64() => Num::Float(n.as_f64().unwrap_or(0.0)),
                serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                    (Some(i), _) => Num::Int(i128::from(i)),
                    (None, Some(u)) => Num::Int(i128::from(u)),
                    _ => return Err("unreadable scalar".into()),
                },
                serde_json::Value::Bool(b) => Num::Int(i128::from(*b)),
                serde_json::Value::String(s) => Num::Float(match s.as_str() {
                    "nan" => f64::NAN,
                    "inf" => f64::INFINITY,
                    _ => f64::NEG_INFINITY,
                }),
                _ => return Err("unreadable scalar".into()),
            }
        }
        other => return Err(mismatch("a number", other)),
    })
}

/// `np.<dtype>(value).tobytes()`, refusing values numpy would reject or silently wrap.
fn scalar_bytes(dtype: DType, value: &Value) -> Result<Vec<u8>, Reason> {
    if let Value::Scalar(s) = value {
        if s.dtype == dtype && s.bytes.len() == dtype.size() {
            return Ok(s.bytes.clone());
        }
    }
    let num = num_of(value)?;
    let int = |num: Num| -> Result<i128, Reason> {
        match num {
            Num::Int(i) => Ok(i),
            // numpy truncates a float toward zero when it fits the integer type.
            Num::Float(f) if f.is_finite() => Ok(f.trunc() as i128),
            Num::Float(f) => Err(format!("{f} does not fit {}", dtype.name())),
        }
    };
    let float = |num: Num| match num {
        // A Python int becomes a double first, as numpy converts it.
        Num::Int(i) => i as f64,
        Num::Float(f) => f,
    };
    let out_of_range = |i: i128| format!("{i} is out of range for {}", dtype.name());
    macro_rules! int_bytes {
        ($t:ty) => {{
            let i = int(num)?;
            <$t>::try_from(i)
                .map_err(|_| out_of_range(i))?
                .to_le_bytes()
                .to_vec()
        }};
    }
    Ok(match dtype {
        DType::U8 => int_bytes!(u8),
        DType::U16 => int_bytes!(u16),
        DType::U32 => int_bytes!(u32),
        DType::U64 => int_bytes!(u64),
        DType::I8 => int_bytes!(i8),
        DType::I16 => int_bytes!(i16),
        DType::I32 => int_bytes!(i32),
        DType::I64 => int_bytes!(i64),
        DType::F16 => half::f16::from_f64(float(num)).to_le_bytes().to_vec(),
        DType::F32 => (float(num) as f32).to_le_bytes().to_vec(),
        DType::F64 => float(num).to_le_bytes().to_vec(),
        DType::Bool => return Err("bool is not an MDS scalar encoding".into()),
    })
}
