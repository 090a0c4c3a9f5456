//! MDS column encodings: the names Mosaic accepts (`mds/encodings.py:_encodings`), their fixed
//! sizes, and the bytes each one writes and reads.
//!
//! | encoding | size | bytes | decodes to |
//! |---|---|---|---|
//! | `bytes` | var | raw | [`Value::Bytes`] |
//! | `str` | var | UTF-8 | [`Value::Str`] |
//! | `int` | 8 | int64 LE | [`Value::Int`] |
//! | `uint8`..`uint64`, `int8`..`int64`, `float16/32/64` | 1..8 | LE | [`Value::Scalar`] |
//! | `str_int`, `str_float`, `str_decimal` | var | Python `str(x)` | [`Value::StrInt`], [`Value::StrFloat`], [`Value::StrDecimal`] |
//! | `pil` | var | `u32 w, u32 h, u32 len(mode), mode, pixels` | [`Value::Pil`] |
//! | `jpeg`, `png` | var | the image file | [`Value::Image`] |
//! | `jpeg_array` (`jpegarray`) | var | `u32 n (>0), u32 size[n], files` | [`Value::List`] of JPEG images |
//! | `list[pil]`, `list[jpeg]`, `list[png]` | var | `u32 0, u32 n, u32 size[n], elements` | [`Value::List`] |
//! | `pkl` | var | pickle bytes (read only with `allow_unsafe_types`) | [`Value::Pickle`] |
//! | `json` | var | Python `json.dumps(obj)` | [`Value::Json`] |
//! | `ndarray[:DTYPE[:D1,D2..]]` | var, or fixed with dtype and shape | see [`Encoding::NdArray`] | [`Value::NdArray`] |
//!
//! As in Mosaic, a [`Value::Bytes`] is taken as already encoded for *any* encoding (still checked
//! against a fixed size). Values of other kinds are accepted where Mosaic would accept the
//! corresponding Python object; the per-encoding rules are on [`Encoding::encode`].
//!
//! ```
//! use shardstream_sharding::mds::Encoding;
//! use shardstream_sharding::Value;
//! let e = Encoding::parse("str_float").unwrap();
//! assert_eq!(e.encode(&Value::Float(1e-5)).unwrap(), b"1e-05");
//! assert_eq!(Encoding::parse("ndarray:uint8:2,3").unwrap().fixed_size(), Some(6));
//! ```

use std::fmt;

use crate::error::{FormatError, Result};
use crate::value::{DType, Value};

/// One column encoding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// `bytes`: raw bytes.
    Bytes,
    /// `str`: UTF-8 text.
    Str,
    /// `int`: a Python int stored as int64.
    Int,
    /// `uint8` ... `float64`: a numpy scalar (never [`DType::Bool`]).
    Scalar(DType),
    /// `str_int`: decimal digits of an int.
    StrInt,
    /// `str_float`: Python `repr` of a float.
    StrFloat,
    /// `str_decimal`: text of a `decimal.Decimal`.
    StrDecimal,
    /// `pil`: raw pixels with size and mode.
    Pil,
    /// `jpeg`: a JPEG file.
    Jpeg,
    /// `png`: a PNG file.
    Png,
    /// `jpeg_array` / `jpegarray`: a non-empty list of JPEG files.
    JpegArray,
    /// `list[pil]`
    PilList,
    /// `list[jpeg]`
    JpegList,
    /// `list[png]`
    PngList,
    /// `pkl`: pickle bytes, unsafe to read.
    Pickle,
    /// `json`: JSON text.
    Json,
    /// `ndarray`, `ndarray:DTYPE`, `ndarray:DTYPE:D1,D2,...`.
    ///
    /// Layout: `[dtype code u8, if dtype is dynamic] [(ndim << 2) | shape code u8, shape[ndim] as
    /// the smallest uint (code 0..3 = u8..u64) holding max(shape), if shape is dynamic] [values,
    /// C order, LE]`. Dtype codes: uint8 8, int8 9, uint16 16, int16 17, float16 18, uint32 32,
    /// int32 33, float32 34, uint64 64, int64 65, float64 66.
    NdArray {
        /// The dtype, if fixed by the encoding string.
        dtype: Option<DType>,
        /// The shape, if fixed (only together with a dtype).
        shape: Option<Vec<u64>>,
    },
}

const SCALARS: [DType; 11] = [
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
];

impl Encoding {
    /// Every encoding name Mosaic registers (without ndarray arguments).
    pub const NAMES: [&'static str; 28] = [
        "bytes",
        "str",
        "int",
        "ndarray",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "float32",
        "float64",
        "str_int",
        "str_float",
        "str_decimal",
        "pil",
        "jpeg",
        "jpeg_array",
        "jpegarray",
        "png",
        "list[pil]",
        "list[jpeg]",
        "list[png]",
        "pkl",
        "json",
    ];

    /// Parses an encoding string as Mosaic's `_get_coder` does; unknown names (and arguments to
    /// anything but `ndarray`) are [`FormatError::Unknown`].
    pub fn parse(text: &str) -> Result<Encoding> {
        let unknown = |why: &str| FormatError::Unknown {
            kind: "encoding",
            name: if why.is_empty() {
                text.to_string()
            } else {
                format!("{text}: {why}")
            },
        };
        if let Some((name, config)) = text.split_once(':') {
            if name != "ndarray" {
                return Err(unknown("only ndarray takes arguments"));
            }
            return parse_ndarray(config).map_err(|why| unknown(&why));
        }
        Ok(match text {
            "bytes" => Encoding::Bytes,
            "str" => Encoding::Str,
            "int" => Encoding::Int,
            "ndarray" => Encoding::NdArray {
                dtype: None,
                shape: None,
            },
            "str_int" => Encoding::StrInt,
            "str_float" => Encoding::StrFloat,
            "str_decimal" => Encoding::StrDecimal,
            "pil" => Encoding::Pil,
            "jpeg" => Encoding::Jpeg,
            "png" => Encoding::Png,
            "jpeg_array" | "jpegarray" => Encoding::JpegArray,
            "list[pil]" => Encoding::PilList,
            "list[jpeg]" => Encoding::JpegList,
            "list[png]" => Encoding::PngList,
            "pkl" => Encoding::Pickle,
            "json" => Encoding::Json,
            other => match SCALARS.into_iter().find(|d| d.name() == other) {
                Some(dtype) => Encoding::Scalar(dtype),
                None => return Err(unknown("")),
            },
        })
    }

    /// The fixed encoded size in bytes, or `None` for a variable-size encoding (what Mosaic writes
    /// in `column_sizes`).
    pub fn fixed_size(&self) -> Option<u64> {
        match self {
            Encoding::Int => Some(8),
            Encoding::Scalar(d) => Some(d.size() as u64),
            Encoding::NdArray {
                dtype: Some(d),
                shape: Some(shape),
            } => shape
                .iter()
                .try_fold(d.size() as u64, |acc, &dim| acc.checked_mul(dim)),
            _ => None,
        }
    }

    /// Whether reading this encoding can run code (`pkl`), refused unless the user opts in.
    pub fn is_unsafe(&self) -> bool {
        matches!(self, Encoding::Pickle)
    }

    /// Encodes `value`, wrapping failures as [`FormatError::Encode`] with no column name (the
    /// writer adds it).
    pub fn encode(&self, value: &Value) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.encode_into(value, &mut out)
            .map_err(|reason| FormatError::Encode {
                column: String::new(),
                encoding: self.to_string(),
                reason,
            })?;
        Ok(out)
    }

    /// Decodes one column's bytes, wrapping failures as [`FormatError::Decode`] with no file
    /// context (the shard reader adds it).
    pub fn decode(&self, data: &[u8]) -> Result<Value> {
        self.decode_value(data)
            .map_err(|reason| FormatError::Decode {
                path: String::new(),
                sample: 0,
                column: String::new(),
                encoding: self.to_string(),
                reason,
            })
    }
}

impl fmt::Display for Encoding {
    /// The canonical spelling (`jpeg_array` for both of its names).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Encoding::Bytes => "bytes",
            Encoding::Str => "str",
            Encoding::Int => "int",
            Encoding::Scalar(d) => d.name(),
            Encoding::StrInt => "str_int",
            Encoding::StrFloat => "str_float",
            Encoding::StrDecimal => "str_decimal",
            Encoding::Pil => "pil",
            Encoding::Jpeg => "jpeg",
            Encoding::Png => "png",
            Encoding::JpegArray => "jpeg_array",
            Encoding::PilList => "list[pil]",
            Encoding::JpegList => "list[jpeg]",
            Encoding::PngList => "list[png]",
            Encoding::Pickle => "pkl",
            Encoding::Json => "json",
            Encoding::NdArray { dtype, shape } => {
                f.write_str("ndarray")?;
                if let Some(d) = dtype {
                    write!(f, ":{}", d.name())?;
                }
                if let Some(shape) = shape {
                    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
                    write!(f, ":{}", dims.join(","))?;
                }
                return Ok(());
            }
        };
        f.write_str(name)
    }
}

impl std::str::FromStr for Encoding {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self> {
        Encoding::parse(s)
    }
}

/// `NDArray.from_str`: `""`, `DTYPE` or `DTYPE:D1,D2,...`, dims parsed like Python `int()` and
/// each at least 1.
fn parse_ndarray(config: &str) -> std::result::Result<Encoding, String> {
    if config.is_empty() {
        return Ok(Encoding::NdArray {
            dtype: None,
            shape: None,
        });
    }
    let args: Vec<&str> = config.split(':').collect();
    if args.len() > 2 {
        return Err("expected ndarray:DTYPE:SHAPE at most".into());
    }
    let dtype = ndarray_dtype_code_of(args[0])
        .map(|(d, _)| d)
        .ok_or_else(|| format!("unsupported ndarray dtype {:?}", args[0]))?;
    let shape = match args.get(1) {
        None => None,
        Some(dims) => {
            let mut shape = Vec::new();
            for dim in dims.split(',') {
                let parsed = parse_python_uint(dim)
                    .filter(|&d| d >= 1)
                    .ok_or_else(|| format!("invalid dimension {dim:?}"))?;
                shape.push(parsed);
            }
            Some(shape)
        }
    };
    let enc = Encoding::NdArray {
        dtype: Some(dtype),
        shape,
    };
    if matches!(&enc, Encoding::NdArray { shape: Some(_), .. }) && enc.fixed_size().is_none() {
        return Err("shape too large".into());
    }
    Ok(enc)
}

/// Python `int(text)` for non-negative values: surrounding whitespace, an optional `+`, and `_`
/// between digits.
pub(crate) fn parse_python_uint(text: &str) -> Option<u64> {
    let t = text.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.is_empty() || t.starts_with('_') || t.ends_with('_') || t.contains("__") {
        return None;
    }
    let digits: String = t.chars().filter(|c| *c != '_').collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The ndarray value dtype table: name to (dtype, code).
pub(crate) fn ndarray_dtype_code_of(name: &str) -> Option<(DType, u8)> {
    NDARRAY_DTYPES.into_iter().find(|(d, _)| d.name() == name)
}

/// `NDArray._value_dtype2int`.
pub(crate) const NDARRAY_DTYPES: [(DType, u8); 11] = [
    (DType::U8, 8),
    (DType::I8, 9),
    (DType::U16, 16),
    (DType::I16, 17),
    (DType::F16, 18),
    (DType::U32, 32),
    (DType::I32, 33),
    (DType::F32, 34),
    (DType::U64, 64),
    (DType::I64, 65),
    (DType::F64, 66),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mosaic_name_parses() {
        for name in Encoding::NAMES {
            let e = Encoding::parse(name).unwrap();
            if name != "jpegarray" {
                assert_eq!(e.to_string(), name);
            }
        }
    }

    #[test]
    fn fixed_sizes_match_mosaic() {
        let cases = [
            ("int", Some(8)),
            ("uint8", Some(1)),
            ("int16", Some(2)),
            ("float16", Some(2)),
            ("uint32", Some(4)),
            ("float64", Some(8)),
            ("str", None),
            ("ndarray", None),
            ("ndarray:float32", None),
            ("ndarray:float32:3,224,224", Some(3 * 224 * 224 * 4)),
            ("ndarray:uint8:7", Some(7)),
        ];
        for (name, size) in cases {
            assert_eq!(Encoding::parse(name).unwrap().fixed_size(), size, "{name}");
        }
    }

    #[test]
    fn ndarray_arguments() {
        assert_eq!(
            Encoding::parse("ndarray:").unwrap(),
            Encoding::NdArray {
                dtype: None,
                shape: None
            }
        );
        assert_eq!(
            Encoding::parse("ndarray:int8: 2,+3,1_0").unwrap(),
            Encoding::NdArray {
                dtype: Some(DType::I8),
                shape: Some(vec![2, 3, 10])
            }
        );
        for bad in [
            "ndarray:bool",
            "ndarray:uint8:0",
            "ndarray:uint8:-1",
            "ndarray:uint8:",
            "ndarray:uint8:2:3",
            "ndarray::3",
            "ndarray:uint8:4294967296,4294967296,4294967296",
            "str:x",
            "jpeg_array:x",
            "list[bytes]",
            "Str",
            "",
        ] {
            assert!(Encoding::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
