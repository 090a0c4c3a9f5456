//! The `ndarray` encoding's byte layout (Mosaic's `NDArray.encode` / `decode`).

use crate::mds::encoding::NDARRAY_DTYPES;
use crate::value::{DType, NdArray};

type Reason = String;

fn code_of(dtype: DType) -> Result<u8, Reason> {
    NDARRAY_DTYPES
        .into_iter()
        .find(|(d, _)| *d == dtype)
        .map(|(_, c)| c)
        .ok_or_else(|| format!("unsupported dtype {}", dtype.name()))
}

fn dtype_of(code: u8) -> Result<DType, Reason> {
    NDARRAY_DTYPES
        .into_iter()
        .find(|(_, c)| *c == code)
        .map(|(d, _)| d)
        .ok_or_else(|| format!("unknown dtype code {code}"))
}

/// The number of value bytes an array of `dtype` and `shape` holds, if it fits in a `u64`.
pub(crate) fn data_len(dtype: DType, shape: &[u64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
}

/// Appends the encoding of `arr` for a column with the given static dtype and shape.
pub(crate) fn encode(
    static_dtype: Option<DType>,
    static_shape: Option<&[u64]>,
    arr: &NdArray,
    out: &mut Vec<u8>,
) -> Result<(), Reason> {
    let code = code_of(arr.dtype)?;
    match static_dtype {
        None => out.push(code),
        Some(d) if d != arr.dtype => {
            return Err(format!(
                "wrong dtype: expected {}, got {}",
                d.name(),
                arr.dtype.name()
            ))
        }
        Some(_) => {}
    }
    let expected = data_len(arr.dtype, &arr.shape).ok_or("shape overflows")?;
    if expected != arr.data.len() as u64 {
        return Err(format!(
            "array data holds {} bytes, its shape {:?} needs {expected}",
            arr.data.len(),
            arr.shape
        ));
    }
    if arr.shape.is_empty() {
        return Err("a 0-d array cannot use the ndarray encoding; use a scalar encoding".into());
    }
    if expected == 0 {
        return Err("attempting to encode an array with 0 elements".into());
    }
    match static_shape {
        None => {
            let ndim = arr.shape.len();
            if ndim >= 64 {
                return Err(format!("array has too many axes: maximum 63, got {ndim}"));
            }
            let max = arr.shape.iter().copied().max().unwrap_or(0);
            let shape_code: u8 = match max {
                m if m < 1 << 8 => 0,
                m if m < 1 << 16 => 1,
                m if m < 1 << 32 => 2,
                _ => 3,
            };
            out.push(((ndim as u8) << 2) | shape_code);
            for &dim in &arr.shape {
                out.extend_from_slice(&dim.to_le_bytes()[..1 << shape_code]);
            }
        }
        Some(shape) if shape != arr.shape.as_slice() => {
            return Err(format!(
                "wrong shape: expected {shape:?}, got {:?}",
                arr.shape
            ))
        }
        Some(_) => {}
    }
    out.extend_from_slice(&arr.data);
    Ok(())
}

/// Decodes an array for a column with the given static dtype and shape.
pub(crate) fn decode(
    static_dtype: Option<DType>,
    static_shape: Option<&[u64]>,
    data: &[u8],
) -> Result<NdArray, Reason> {
    let mut rest = data;
    let dtype = match static_dtype {
        Some(d) => d,
        None => {
            let (&code, tail) = rest.split_first().ok_or("missing dtype byte")?;
            rest = tail;
            dtype_of(code)?
        }
    };
    let shape = match static_shape {
        Some(shape) => shape.to_vec(),
        None => {
            let (&byte, tail) = rest.split_first().ok_or("missing shape byte")?;
            rest = tail;
            let ndim = usize::from(byte >> 2);
            let width = 1usize << (byte & 3);
            let need = ndim * width;
            if rest.len() < need {
                return Err(format!("shape needs {need} bytes, {} left", rest.len()));
            }
            let (dims, tail) = rest.split_at(need);
            rest = tail;
            dims.chunks_exact(width)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b[..width].copy_from_slice(c);
                    u64::from_le_bytes(b)
                })
                .collect()
        }
    };
    let expected = data_len(dtype, &shape).ok_or("shape overflows")?;
    if expected != rest.len() as u64 {
        return Err(format!(
            "values hold {} bytes, shape {shape:?} of {} needs {expected}",
            rest.len(),
            dtype.name()
        ));
    }
    Ok(NdArray {
        dtype,
        shape,
        data: rest.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr(dtype: DType, shape: Vec<u64>, data: Vec<u8>) -> NdArray {
        NdArray { dtype, shape, data }
    }

    #[test]
    fn dynamic_layout_matches_research_hexdump() {
        // Sample 0 of the verified shard: ndarray:uint16 [0, 1, 2].
        let a = arr(DType::U16, vec![3], vec![0, 0, 1, 0, 2, 0]);
        let mut out = Vec::new();
        encode(Some(DType::U16), None, &a, &mut out).unwrap();
        assert_eq!(out, [0x04, 0x03, 0, 0, 1, 0, 2, 0]);
        assert_eq!(decode(Some(DType::U16), None, &out).unwrap(), a);
        // Fully dynamic: dtype byte first.
        out.clear();
        encode(None, None, &a, &mut out).unwrap();
        assert_eq!(out[..3], [16, 0x04, 0x03]);
        assert_eq!(decode(None, None, &out).unwrap(), a);
    }

    #[test]
    fn shape_width_grows_with_the_largest_dim() {
        for (dim, code) in [(255u64, 0u8), (256, 1), (65536, 2)] {
            let a = arr(DType::U8, vec![1, dim], vec![7; dim as usize]);
            let mut out = Vec::new();
            encode(Some(DType::U8), None, &a, &mut out).unwrap();
            assert_eq!(out[0], (2 << 2) | code);
            assert_eq!(decode(Some(DType::U8), None, &out).unwrap(), a);
        }
    }

    #[test]
    fn refusals() {
        let mut out = Vec::new();
        let zero_d = arr(DType::F32, vec![], vec![0; 4]);
        assert!(encode(None, None, &zero_d, &mut out).is_err());
        let empty = arr(DType::F32, vec![0], vec![]);
        assert!(encode(None, None, &empty, &mut out).is_err());
        let b = arr(DType::Bool, vec![1], vec![1]);
        assert!(encode(None, None, &b, &mut out).is_err());
        let a = arr(DType::U8, vec![2], vec![1, 2]);
        assert!(encode(Some(DType::I8), None, &a, &mut out).is_err());
        assert!(encode(Some(DType::U8), Some(&[3]), &a, &mut out).is_err());
        assert!(decode(None, None, &[99, 4, 1, 0]).is_err());
        assert!(decode(Some(DType::U16), None, &[4, 2, 0, 0]).is_err());
        assert!(decode(Some(DType::U16), None, &[0xfc]).is_err());
    }
}
