//! Decoded sample values, shared by every format.
//!
//! A [`Sample`] is an ordered map of column name to [`Value`]. Values keep the distinctions Mosaic's
//! decoders make (a `uint8` column decodes to a numpy `uint8`, `int` to a Python int, `jpeg` to an
//! image), so the Python layer can rebuild exactly the objects Mosaic would yield, while the Rust side
//! never decodes image pixels it does not need.
//!
//! [`Value::to_canonical_json`] gives one JSON rendering of a value that the CLI (`cat --json`) and
//! the interop tests share; its shape is documented in `docs/formats.md`.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value as Json};

/// A sample: column name to value, in column-name order (MDS stores columns sorted by name).
pub type Sample = BTreeMap<String, Value>;

/// Element types of numpy scalars and arrays that MDS can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// `uint8`
    U8,
    /// `uint16`
    U16,
    /// `uint32`
    U32,
    /// `uint64`
    U64,
    /// `int8`
    I8,
    /// `int16`
    I16,
    /// `int32`
    I32,
    /// `int64`
    I64,
    /// `float16`
    F16,
    /// `float32`
    F32,
    /// `float64`
    F64,
    /// `bool` (LitData only; MDS ndarray has no bool)
    Bool,
}

impl DType {
    /// All dtypes, for iteration in tests and parsers.
    pub const ALL: [DType; 12] = [
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::F32,
        DType::F64,
        DType::Bool,
    ];

    /// The numpy name (`uint8`, `float32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::Bool => "bool",
        }
    }

    /// Parses a numpy name.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 | DType::Bool => 1,
            DType::U16 | DType::I16 | DType::F16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    /// Renders little-endian element bytes as JSON numbers (floats that are not finite become the
    /// strings `"nan"`, `"inf"`, `"-inf"`). `bytes.len()` must be a multiple of [`DType::size`].
    pub fn elements_to_json(self, bytes: &[u8]) -> Vec<Json> {
        bytes
            .chunks_exact(self.size())
            .map(|c| self.element_to_json(c))
            .collect()
    }

    fn element_to_json(self, c: &[u8]) -> Json {
        fn float(v: f64) -> Json {
            if v.is_nan() {
                json!("nan")
            } else if v.is_infinite() {
                json!(if v > 0.0 { "inf" } else { "-inf" })
            } else {
                json!(v)
            }
        }
        let b8 = |c: &[u8]| {
            let mut a = [0u8; 8];
            a[..c.len()].copy_from_slice(c);
            a
        };
        match self {
            DType::U8 => json!(c[0]),
            DType::I8 => json!(c[0] as i8),
            DType::Bool => json!(c[0] != 0),
            DType::U16 => json!(u16::from_le_bytes([c[0], c[1]])),
            DType::I16 => json!(i16::from_le_bytes([c[0], c[1]])),
            DType::F16 => float(half::f16::from_le_bytes([c[0], c[1]]).to_f64()),
            DType::U32 => json!(u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::I32 => json!(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::F32 => float(f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
            DType::U64 => json!(u64::from_le_bytes(b8(c))),
            DType::I64 => json!(i64::from_le_bytes(b8(c))),
            DType::F64 => float(f64::from_le_bytes(b8(c))),
        }
    }
}

/// A numpy-style scalar: its dtype and its little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    /// Element type.
    pub dtype: DType,
    /// `dtype.size()` little-endian bytes.
    pub bytes: Vec<u8>,
}

/// An n-dimensional array in C order.
#[derive(Debug, Clone, PartialEq)]
pub struct NdArray {
    /// Element type.
    pub dtype: DType,
    /// Shape; the product times `dtype.size()` equals `data.len()`.
    pub shape: Vec<u64>,
    /// Little-endian element bytes in C order.
    pub data: Vec<u8>,
}

/// A raw-pixel PIL image as MDS `pil` stores it (`Image.tobytes()`).
#[derive(Debug, Clone, PartialEq)]
pub struct PilImage {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// PIL mode (`RGB`, `L`, ...).
    pub mode: String,
    /// Raw pixel bytes.
    pub data: Vec<u8>,
}

/// Which image file format an encoded image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// JPEG file bytes.
    Jpeg,
    /// PNG file bytes.
    Png,
}

/// One decoded column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Raw bytes (`bytes`, WebDataset members, LitData `bytes`/`file`).
    Bytes(Vec<u8>),
    /// Text (`str`).
    Str(String),
    /// A Python int (`int`, LitData `int`).
    Int(i64),
    /// A Python float (LitData `float`).
    Float(f64),
    /// A Python bool (LitData `bool`).
    Bool(bool),
    /// A numpy scalar (`uint8` ... `float64`).
    Scalar(Scalar),
    /// `str_int`: the decimal text of a Python int (kept as text: Python ints are unbounded).
    StrInt(String),
    /// `str_float`: a Python float, written as Python's `repr`.
    StrFloat(f64),
    /// `str_decimal`: the text of a `decimal.Decimal`.
    StrDecimal(String),
    /// Parsed JSON (`json`).
    Json(Json),
    /// A raw-pixel image (`pil`).
    Pil(PilImage),
    /// An encoded image file (`jpeg`, `png`, LitData `jpeg`).
    Image(ImageFormat, Vec<u8>),
    /// A list of images (`jpeg_array`, `list[pil]`, `list[jpeg]`, `list[png]`).
    List(Vec<Value>),
    /// An array (`ndarray`, LitData `numpy`/`tensor`).
    NdArray(NdArray),
    /// Pickle bytes (`pkl`), only produced when the user opted in to unsafe types.
    Pickle(Vec<u8>),
}

impl Value {
    /// The canonical JSON rendering used by `shardstream cat --json` and the interop tests.
    ///
    /// Plain JSON types map to themselves (`str`, `int`, `float`, `bool`); everything else is an
    /// object with one `"$type"` key: `{"$type": "bytes", "hex": ...}`,
    /// `{"$type": "uint8", "value": 3}`, `{"$type": "ndarray", "dtype", "shape", "values"}`,
    /// `{"$type": "pil", "width", "height", "mode", "hex"}`, `{"$type": "jpeg"|"png", "hex"}`,
    /// `{"$type": "json", "value"}`, `{"$type": "str_int"|"str_decimal", "text"}`,
    /// `{"$type": "str_float", "value"}`, `{"$type": "list", "items": [...]}`,
    /// `{"$type": "pkl", "hex"}`.
    pub fn to_canonical_json(&self) -> Json {
        fn tagged(ty: &str, fields: Vec<(&str, Json)>) -> Json {
            let mut m = Map::new();
            m.insert("$type".into(), json!(ty));
            for (k, v) in fields {
                m.insert(k.into(), v);
            }
            Json::Object(m)
        }
        match self {
            Value::Bytes(b) => tagged("bytes", vec![("hex", json!(hex::encode(b)))]),
            Value::Str(s) => json!(s),
            Value::Int(i) => json!(i),
            Value::Float(f) => DType::F64.elements_to_json(&f.to_le_bytes())[0].clone(),
            Value::Bool(b) => json!(b),
            Value::Scalar(s) => {
                let v = s
                    .dtype
                    .elements_to_json(&s.bytes)
                    .into_iter()
                    .next()
                    .unwrap_or(Json::Null);
                tagged(s.dtype.name(), vec![("value", v)])
            }
            Value::StrInt(t) => tagged("str_int", vec![("text", json!(t))]),
            Value::StrFloat(f) => tagged(
                "str_float",
                vec![(
                    "value",
                    DType::F64.elements_to_json(&f.to_le_bytes())[0].clone(),
                )],
            ),
            Value::StrDecimal(t) => tagged("str_decimal", vec![("text", json!(t))]),
            Value::Json(j) => tagged("json", vec![("value", j.clone())]),
            Value::Pil(p) => tagged(
                "pil",
                vec![
                    ("width", json!(p.width)),
                    ("height", json!(p.height)),
                    ("mode", json!(p.mode)),
                    ("hex", json!(hex::encode(&p.data))),
                ],
            ),
            Value::Image(ImageFormat::Jpeg, b) => {
                tagged("jpeg", vec![("hex", json!(hex::encode(b)))])
            }
            Value::Image(ImageFormat::Png, b) => {
                tagged("png", vec![("hex", json!(hex::encode(b)))])
            }
            Value::List(items) => tagged(
                "list",
                vec![(
                    "items",
                    Json::Array(items.iter().map(Value::to_canonical_json).collect()),
                )],
            ),
            Value::NdArray(a) => tagged(
                "ndarray",
                vec![
                    ("dtype", json!(a.dtype.name())),
                    ("shape", json!(a.shape)),
                    ("values", Json::Array(a.dtype.elements_to_json(&a.data))),
                ],
            ),
            Value::Pickle(b) => tagged("pkl", vec![("hex", json!(hex::encode(b)))]),
        }
    }
}

/// Renders a whole sample as a JSON object of canonical values.
pub fn sample_to_canonical_json(sample: &Sample) -> Json {
    Json::Object(
        sample
            .iter()
            .map(|(k, v)| (k.clone(), v.to_canonical_json()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_of_scalars_and_arrays() {
        let s = Value::Scalar(Scalar {
            dtype: DType::U16,
            bytes: 513u16.to_le_bytes().to_vec(),
        });
        assert_eq!(
            s.to_canonical_json(),
            json!({"$type": "uint16", "value": 513})
        );
        let a = Value::NdArray(NdArray {
            dtype: DType::F32,
            shape: vec![2],
            data: [1.5f32.to_le_bytes(), f32::NAN.to_le_bytes()].concat(),
        });
        assert_eq!(
            a.to_canonical_json(),
            json!({"$type": "ndarray", "dtype": "float32", "shape": [2], "values": [1.5, "nan"]})
        );
        assert_eq!(
            Value::Bytes(vec![0, 255]).to_canonical_json(),
            json!({"$type": "bytes", "hex": "00ff"})
        );
    }

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
    }
}
