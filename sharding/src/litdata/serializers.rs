//! Decoders for LitData's leaf serializers (`streaming/serializers.py`), one per `data_format`
//! entry. Each takes the leaf's bytes and checks every length before it slices.

use crate::value::{DType, ImageFormat, NdArray, PilImage, Value};

use super::nested_json;

/// The serializer a `data_format` entry names, resolved as litdata's `_data_format_to_key` does: for
/// `head:sub`, `sub` if it is itself a serializer name, else `head`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeafFormat {
    /// `str` / `text`: UTF-8.
    Str,
    /// `bool`: one byte.
    Bool,
    /// `int`: little-endian int64.
    Int,
    /// `float`: little-endian float64.
    Float,
    /// `bytes`.
    Bytes,
    /// `numpy`: u32 dtype index, u32 ndim, u32 dims, C-order data (numpy's index table).
    Numpy,
    /// `no_header_numpy:{idx}`: 1-D raw data.
    NoHeaderNumpy(u32),
    /// `tensor`: u32 dtype index, u32 ndim, u32 dims (big-endian since litdata 0.2.4x,
    /// little-endian before; both read), C-order data (torch's index table).
    Tensor,
    /// `no_header_tensor:{idx}`: 1-D raw data.
    NoHeaderTensor(u32),
    /// `pil`: u32 width, height, mode length, mode, raw pixels.
    Pil,
    /// `jpeg`: JPEG file bytes.
    Jpeg,
    /// `jpeg_array`: u32 n, u32 sizes[n], JPEG files.
    JpegArray,
    /// `image:{ext}`: image file bytes.
    Image(String),
    /// `json`: litdata's compact nested encoding, or JSON text.
    Json,
    /// Raw file bytes under another name: `file:{ext}`, `video:{ext}`, `audio:{ext}`, `tifffile`,
    /// `tiff`, `pdf`, `mesh:{ext}`, `nifti:{ext}`.
    File(String),
    /// `pickle`: only with `allow_unsafe_types`.
    Pickle,
    /// A serializer this build cannot decode (`graph`, custom ones); reading it is an error.
    Unsupported(String),
}

const SERIALIZER_NAMES: [&str; 24] = [
    "str",
    "text",
    "bool",
    "int",
    "float",
    "video",
    "audio",
    "image",
    "nifti",
    "mesh",
    "pdf",
    "graph",
    "tifffile",
    "file",
    "pil",
    "jpeg",
    "jpeg_array",
    "bytes",
    "no_header_numpy",
    "numpy",
    "no_header_tensor",
    "tensor",
    "json",
    "pickle",
];

impl LeafFormat {
    /// Parses one `data_format` entry.
    pub fn parse(format: &str) -> std::result::Result<LeafFormat, String> {
        let (key, sub) = match format.split_once(':') {
            None => (format, ""),
            Some((_, rest)) if rest.contains(':') => {
                return Err(format!(
                    "data_format entry {format:?} has more than one ':'"
                ))
            }
            Some((head, sub)) if SERIALIZER_NAMES.contains(&sub) => (sub, head),
            Some((head, sub)) => (head, sub),
        };
        let index = |what: &str| {
            sub.parse::<u32>()
                .map_err(|_| format!("data_format entry {format:?}: {what} needs a dtype index"))
        };
        Ok(match key {
            "str" | "text" => LeafFormat::Str,
            "bool" => LeafFormat::Bool,
            "int" => LeafFormat::Int,
            "float" => LeafFormat::Float,
            "bytes" => LeafFormat::Bytes,
            "numpy" => LeafFormat::Numpy,
            "no_header_numpy" => LeafFormat::NoHeaderNumpy(index("no_header_numpy")?),
            "tensor" => LeafFormat::Tensor,
            "no_header_tensor" => LeafFormat::NoHeaderTensor(index("no_header_tensor")?),
            "pil" => LeafFormat::Pil,
            "jpeg" => LeafFormat::Jpeg,
            "jpeg_array" => LeafFormat::JpegArray,
            "image" => LeafFormat::Image(sub.to_lowercase()),
            "json" => LeafFormat::Json,
            "file" | "video" | "audio" | "tifffile" | "tiff" | "pdf" | "mesh" | "nifti" => {
                LeafFormat::File(sub.to_string())
            }
            "pickle" => LeafFormat::Pickle,
            _ => LeafFormat::Unsupported(format.to_string()),
        })
    }
}

/// Why a leaf could not be decoded.
#[derive(Debug)]
pub(crate) enum LeafError {
    /// The bytes do not fit the format.
    Bad(String),
    /// The format is valid but not readable by this build.
    Unsupported(String),
    /// Pickle without the opt-in.
    Unsafe,
}

type LeafResult<T> = std::result::Result<T, LeafError>;

fn bad<T>(reason: impl Into<String>) -> LeafResult<T> {
    Err(LeafError::Bad(reason.into()))
}

fn u32_le(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u32_be(b: &[u8], at: usize) -> Option<u32> {
    u32_le(b, at).map(u32::swap_bytes)
}

/// numpy's `_NUMPY_SCTYPES` order (`constants.py`).
fn numpy_dtype(idx: u32) -> LeafResult<DType> {
    Ok(match idx {
        0 => DType::I8,
        1 => DType::I16,
        2 => DType::I32,
        3 => DType::I64,
        4 => DType::U8,
        5 => DType::U16,
        6 => DType::U32,
        7 => DType::U64,
        8 => DType::F16,
        9 => DType::F32,
        10 => DType::F64,
        13 => DType::Bool,
        11 | 12 => return Err(LeafError::Unsupported("complex numpy arrays".into())),
        14..=17 => {
            return Err(LeafError::Unsupported(
                "numpy object/bytes/str/void arrays".into(),
            ))
        }
        _ => return bad(format!("unknown numpy dtype index {idx}")),
    })
}

/// torch's `_TORCH_DTYPES_MAPPING`, aliases included (writers emit the last alias of each type).
fn torch_dtype(idx: u32) -> LeafResult<DType> {
    Ok(match idx {
        0 | 1 => DType::F32,
        2 | 3 => DType::F64,
        8 | 9 => DType::F16,
        11 => DType::U8,
        12 => DType::I8,
        13 | 14 => DType::I16,
        15 | 16 => DType::I32,
        17 | 18 => DType::I64,
        19 => DType::Bool,
        20 => DType::U16,
        4..=7 => return Err(LeafError::Unsupported("complex tensors".into())),
        10 => return Err(LeafError::Unsupported("bfloat16 tensors".into())),
        _ => return bad(format!("unknown torch dtype index {idx}")),
    })
}

fn one_d(dtype: DType, data: &[u8]) -> LeafResult<Value> {
    if !data.len().is_multiple_of(dtype.size()) {
        return bad(format!(
            "{} bytes is not a whole number of {} elements",
            data.len(),
            dtype.name()
        ));
    }
    Ok(Value::NdArray(NdArray {
        dtype,
        shape: vec![(data.len() / dtype.size()) as u64],
        data: data.to_vec(),
    }))
}

/// Parses `u32 dtype, u32 ndim, u32 dims[ndim]` then data; `Err` unless the data is exactly
/// the shape's size.
fn shaped(
    b: &[u8],
    read: fn(&[u8], usize) -> Option<u32>,
    dtype_of: fn(u32) -> LeafResult<DType>,
) -> LeafResult<NdArray> {
    let (Some(idx), Some(ndim)) = (read(b, 0), read(b, 4)) else {
        return bad("array header shorter than 8 bytes");
    };
    if ndim > 64 {
        return bad(format!("array with {ndim} dimensions"));
    }
    let dtype = dtype_of(idx)?;
    let mut shape = Vec::with_capacity(ndim as usize);
    for d in 0..ndim as usize {
        match read(b, 8 + 4 * d) {
            Some(v) => shape.push(u64::from(v)),
            None => return bad("array shape runs past the leaf"),
        }
    }
    let start = 8 + 4 * ndim as usize;
    let data = &b[start..];
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.size() as u64));
    if elements != Some(data.len() as u64) {
        return bad(format!(
            "array of shape {shape:?} ({}) needs {} bytes, the leaf holds {}",
            dtype.name(),
            elements.map_or("too many".to_string(), |n| n.to_string()),
            data.len()
        ));
    }
    Ok(NdArray {
        dtype,
        shape,
        data: data.to_vec(),
    })
}

fn tensor(b: &[u8]) -> LeafResult<Value> {
    // Current litdata packs the header big-endian (`struct ">II"`); older releases wrote it with
    // numpy, little-endian. Only one reading makes the shape match the data, save for headers
    // that read the same both ways.
    match shaped(b, u32_be, torch_dtype) {
        Ok(a) => Ok(Value::NdArray(a)),
        Err(be_err) => match shaped(b, u32_le, torch_dtype) {
            Ok(a) => Ok(Value::NdArray(a)),
            Err(_) => Err(be_err),
        },
    }
}

fn pil(b: &[u8]) -> LeafResult<Value> {
    let (Some(width), Some(height), Some(mode_len)) = (u32_le(b, 0), u32_le(b, 4), u32_le(b, 8))
    else {
        return bad("pil header shorter than 12 bytes");
    };
    let mode_end = 12usize.saturating_add(mode_len as usize);
    let Some(mode) = b.get(12..mode_end) else {
        return bad(format!("pil mode of {mode_len} bytes runs past the leaf"));
    };
    let mode = std::str::from_utf8(mode)
        .map_err(|_| LeafError::Bad("pil mode is not UTF-8".into()))?
        .to_string();
    Ok(Value::Pil(PilImage {
        width,
        height,
        mode,
        data: b[mode_end..].to_vec(),
    }))
}

fn jpeg_array(b: &[u8]) -> LeafResult<Value> {
    let Some(n) = u32_le(b, 0) else {
        return bad("jpeg_array shorter than 4 bytes");
    };
    if n == 0 {
        return bad("jpeg_array with no images");
    }
    let body = 4 + 4 * u64::from(n);
    if (b.len() as u64) < body {
        return bad(format!("jpeg_array of {n} images: sizes run past the leaf"));
    }
    let mut images = Vec::new();
    let mut pos = body as usize;
    for i in 0..n as usize {
        let size = u32_le(b, 4 + 4 * i).unwrap_or(0) as usize;
        let Some(img) = pos.checked_add(size).and_then(|end| b.get(pos..end)) else {
            return bad(format!("jpeg_array image {i} runs past the leaf"));
        };
        images.push(Value::Image(ImageFormat::Jpeg, img.to_vec()));
        pos += size;
    }
    if pos != b.len() {
        return bad(format!("jpeg_array has {} trailing bytes", b.len() - pos));
    }
    Ok(Value::List(images))
}

fn fixed<const N: usize>(b: &[u8], what: &str) -> LeafResult<[u8; N]> {
    b.try_into()
        .map_err(|_| LeafError::Bad(format!("{what} leaf of {} bytes, expected {N}", b.len())))
}

/// Decodes one leaf.
pub(crate) fn decode_leaf(format: &LeafFormat, b: &[u8], allow_pickle: bool) -> LeafResult<Value> {
    match format {
        LeafFormat::Str => std::str::from_utf8(b)
            .map(|s| Value::Str(s.to_string()))
            .map_err(|e| LeafError::Bad(format!("not UTF-8: {e}"))),
        LeafFormat::Bool => Ok(Value::Bool(fixed::<1>(b, "bool")?[0] != 0)),
        LeafFormat::Int => Ok(Value::Int(i64::from_le_bytes(fixed(b, "int")?))),
        LeafFormat::Float => Ok(Value::Float(f64::from_le_bytes(fixed(b, "float")?))),
        LeafFormat::Bytes | LeafFormat::File(_) => Ok(Value::Bytes(b.to_vec())),
        LeafFormat::Numpy => shaped(b, u32_le, numpy_dtype).map(Value::NdArray),
        LeafFormat::NoHeaderNumpy(idx) => one_d(numpy_dtype(*idx)?, b),
        LeafFormat::Tensor => tensor(b),
        LeafFormat::NoHeaderTensor(idx) => one_d(torch_dtype(*idx)?, b),
        LeafFormat::Pil => pil(b),
        LeafFormat::Jpeg => Ok(Value::Image(ImageFormat::Jpeg, b.to_vec())),
        LeafFormat::JpegArray => jpeg_array(b),
        LeafFormat::Image(ext) => Ok(match ext.as_str() {
            "jpg" | "jpeg" => Value::Image(ImageFormat::Jpeg, b.to_vec()),
            "png" => Value::Image(ImageFormat::Png, b.to_vec()),
            _ => Value::Bytes(b.to_vec()),
        }),
        LeafFormat::Json => nested_json::decode(b)
            .map(Value::Json)
            .map_err(LeafError::Bad),
        LeafFormat::Pickle if allow_pickle => Ok(Value::Pickle(b.to_vec())),
        LeafFormat::Pickle => Err(LeafError::Unsafe),
        LeafFormat::Unsupported(name) => {
            Err(LeafError::Unsupported(format!("the {name:?} serializer")))
        }
    }
}

/// The dtype of a `TokensLoader` dataset's items (`no_header_numpy:N` / `no_header_tensor:N`).
pub(crate) fn token_dtype(format: &LeafFormat) -> LeafResult<DType> {
    match format {
        LeafFormat::NoHeaderNumpy(i) => numpy_dtype(*i),
        LeafFormat::NoHeaderTensor(i) => torch_dtype(*i),
        other => Err(LeafError::Unsupported(format!(
            "TokensLoader data_format {other:?} (litdata accepts only no_header_numpy / no_header_tensor)"
        ))),
    }
}

pub(crate) fn tokens(dtype: DType, b: &[u8]) -> LeafResult<Value> {
    one_d(dtype, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_format_names_like_litdata() {
        assert_eq!(
            LeafFormat::parse("no_header_numpy:9").unwrap(),
            LeafFormat::NoHeaderNumpy(9)
        );
        assert_eq!(
            LeafFormat::parse("file:txt").unwrap(),
            LeafFormat::File("txt".into())
        );
        // `file:jpeg` names the jpeg serializer, as `_data_format_to_key` resolves it.
        assert_eq!(LeafFormat::parse("file:jpeg").unwrap(), LeafFormat::Jpeg);
        assert_eq!(
            LeafFormat::parse("image:PNG").unwrap(),
            LeafFormat::Image("png".into())
        );
        assert!(LeafFormat::parse("a:b:c").is_err());
        assert!(LeafFormat::parse("no_header_tensor:x").is_err());
        assert_eq!(
            LeafFormat::parse("graph").unwrap(),
            LeafFormat::Unsupported("graph".into())
        );
    }

    #[test]
    fn tensors_read_in_both_header_byte_orders() {
        let data: Vec<u8> = (0..6i32).flat_map(|v| v.to_le_bytes()).collect();
        let mut be = Vec::new();
        for v in [16u32, 2, 2, 3] {
            be.extend_from_slice(&v.to_be_bytes());
        }
        be.extend_from_slice(&data);
        let mut le = Vec::new();
        for v in [16u32, 2, 2, 3] {
            le.extend_from_slice(&v.to_le_bytes());
        }
        le.extend_from_slice(&data);
        for bytes in [be, le] {
            match decode_leaf(&LeafFormat::Tensor, &bytes, false).unwrap() {
                Value::NdArray(a) => {
                    assert_eq!((a.dtype, a.shape.clone()), (DType::I32, vec![2, 3]));
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(decode_leaf(
            &LeafFormat::Tensor,
            &[0, 0, 0, 16, 0, 0, 0, 1, 0, 0, 0, 9],
            false
        )
        .is_err());
    }

    #[test]
    fn short_or_malformed_leaves_are_errors() {
        assert!(decode_leaf(&LeafFormat::Int, &[1, 2, 3], false).is_err());
        assert!(decode_leaf(&LeafFormat::Bool, &[], false).is_err());
        assert!(decode_leaf(&LeafFormat::Str, &[0xff], false).is_err());
        assert!(decode_leaf(&LeafFormat::Numpy, &[9, 0, 0, 0, 255, 255, 255, 255], false).is_err());
        assert!(decode_leaf(
            &LeafFormat::Pil,
            &[1, 0, 0, 0, 1, 0, 0, 0, 200, 0, 0, 0, b'L'],
            false
        )
        .is_err());
        assert!(decode_leaf(&LeafFormat::JpegArray, &[255, 255, 255, 255], false).is_err());
        assert!(matches!(
            decode_leaf(&LeafFormat::Pickle, b"x", false),
            Err(LeafError::Unsafe)
        ));
        assert!(matches!(
            decode_leaf(&LeafFormat::Tensor, &[0, 0, 0, 10, 0, 0, 0, 0, 0, 0], false),
            Err(LeafError::Unsupported(_))
        ));
    }
}
