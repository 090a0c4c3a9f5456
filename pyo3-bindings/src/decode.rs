//! MDS column bytes to the Python objects Mosaic's `StreamingDataset` yields.
//!
//! Decoding runs in two phases so that the GIL is held only to build Python objects:
//! [`parse_sample`] splits and checks a sample's column bytes into [`Value`]s with the GIL
//! released (bounds-checked by the formats crate), then [`Decoder::to_python`] turns them into
//! the objects Mosaic's `mds/encodings.py` returns: `bytes`, `str`, a Python `int` for `int`,
//! numpy scalars for `uint8`..`float64`, `int`/`float`/`Decimal` for the `str_*` encodings,
//! `json.loads` of the text for `json`, `PIL.Image.frombytes` for `pil`,
//! `PIL.Image.open(BytesIO(..))` for `jpeg`/`png`, lists of those, `np.frombuffer(..).reshape`
//! for `ndarray`, `pickle.loads` for `pkl` (only with `allow_unsafe_types`).
//!
//! A WebDataset sample decodes as `webdataset`'s `.decode()` does (`shardstream._wds`):
//! `__key__`, `__url__`, then each member by its extension.
//!
//! Each sample decodes by its own shard's schema ([`RawSample::schema`]), so that streams with
//! different columns (or formats) mix: the dataset's first schema has its names interned once,
//! another one's are made per sample.
//!
//! `bytes`, `json` and `pkl` columns need no parsing: they stay in the sample's read buffer
//! until Python takes them, and a decoder made with `zero_copy` hands `bytes` columns over as a
//! [`Buffer`] into that read instead of copying them into a `bytes` object.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};
use shardstream_sharding::mds::Encoding;
use shardstream_sharding::value::{DType, NdArray, PilImage, Scalar, Value};
use shardstream_sharding::FormatError;
use shardstream_streamer::RawSample;
use shardstream_streamer::SampleSchema;

use crate::buffer::Buffer;

/// A column of a parsed sample.
enum Column {
    /// Parsed.
    Value(Value),
    /// Kept as stored (`bytes`, `json`, `pkl`): the sample's column at this index.
    Stored(usize),
}

/// A sample's columns, checked and parsed, ready to become Python objects. Holds the sample
/// (a shared read buffer, no copy) only when a column is kept as stored: otherwise its read is
/// let go at once, so that the engine can reuse it.
pub struct ParsedSample {
    schema: SampleSchema,
    columns: Vec<Column>,
    raw: Option<RawSample>,
    stored_bytes: usize,
}

impl ParsedSample {
    /// The sample's bytes as stored in its shard.
    pub fn stored_bytes(&self) -> usize {
        self.stored_bytes
    }
}

/// Parses one sample's columns (in `encodings` order). `bytes`, `json` and `pkl` columns are
/// kept as stored: only Python's own `json.loads` / `pickle.loads` give Mosaic's objects, and
/// bytes need no work. `path` names the sample's shard in errors (called only on an error: a
/// sample on the hot path allocates no name).
pub fn parse_sample(
    raw: RawSample,
    path: impl Fn() -> String,
) -> Result<ParsedSample, FormatError> {
    let columns = match raw.schema() {
        SampleSchema::Mds(columns) => Arc::clone(columns),
        SampleSchema::LitData(fields) => {
            let values = fields
                .decoder
                .decode(&path(), raw.index_in_shard(), raw.bytes())?;
            return Ok(ParsedSample {
                schema: raw.schema().clone(),
                columns: values.into_iter().map(Column::Value).collect(),
                stored_bytes: raw.bytes().len(),
                raw: None,
            });
        }
        SampleSchema::Wds(_) => {
            return Ok(ParsedSample {
                schema: raw.schema().clone(),
                columns: (0..raw.num_columns()).map(Column::Stored).collect(),
                stored_bytes: raw.bytes().len(),
                raw: Some(raw),
            })
        }
    };
    let (encodings, names) = (columns.encodings(), columns.names());
    let sample = raw.index_in_shard();
    if raw.num_columns() != encodings.len() {
        return Err(FormatError::corrupt(
            path(),
            format!(
                "sample {sample}: {} columns, the index declares {}",
                raw.num_columns(),
                encodings.len()
            ),
        ));
    }
    let mut values = Vec::with_capacity(encodings.len());
    for (i, (enc, name)) in encodings.iter().zip(names).enumerate() {
        let data = raw.column(i).unwrap_or(&[]);
        let value = match enc {
            Encoding::Json | Encoding::Pickle | Encoding::Bytes => Column::Stored(i),
            _ => Column::Value(enc.decode(data).map_err(|e| match e {
                FormatError::Decode {
                    encoding, reason, ..
                } => FormatError::Decode {
                    path: path(),
                    sample,
                    column: name.clone(),
                    encoding,
                    reason,
                },
                other => other,
            })?),
        };
        values.push(value);
    }
    let keep = values.iter().any(|c| matches!(c, Column::Stored(_)));
    Ok(ParsedSample {
        schema: SampleSchema::Mds(columns),
        columns: values,
        stored_bytes: raw.bytes().len(),
        raw: keep.then_some(raw),
    })
}

/// Python callables the decoder uses, imported once per interpreter.
struct Imports {
    np_frombuffer: Py<PyAny>,
    np_types: Vec<(DType, Py<PyAny>)>,
    json_loads: Py<PyAny>,
    pickle_loads: Py<PyAny>,
    bytes_io: Py<PyAny>,
    int: Py<PyAny>,
}

/// `PIL.Image.open` and `PIL.Image.frombytes`, imported on the first image column: importing
/// Pillow takes milliseconds, which a dataset without images would otherwise pay before its
/// first sample.
struct ImageImports {
    open: Py<PyAny>,
    frombytes: Py<PyAny>,
}

static IMPORTS: PyOnceLock<Imports> = PyOnceLock::new();
/// `decimal.Decimal`, imported on the first `str_decimal` value (its C module takes about a
/// millisecond to load, which every other dataset would pay before its first sample).
static DECIMAL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static IMAGE_IMPORTS: PyOnceLock<ImageImports> = PyOnceLock::new();

fn imports(py: Python<'_>) -> PyResult<&Imports> {
    IMPORTS.get_or_try_init(py, || {
        let np = py.import("numpy")?;
        let mut np_types = Vec::new();
        for d in DType::ALL {
            if d != DType::Bool {
                np_types.push((d, np.getattr(d.name())?.unbind()));
            }
        }
        Ok(Imports {
            np_frombuffer: np.getattr("frombuffer")?.unbind(),
            np_types,
            json_loads: py.import("json")?.getattr("loads")?.unbind(),
            pickle_loads: py.import("pickle")?.getattr("loads")?.unbind(),
            bytes_io: py.import("io")?.getattr("BytesIO")?.unbind(),
            int: py.get_type::<pyo3::types::PyInt>().into_any().unbind(),
        })
    })
}

/// Pillow's constructors; a dataset without image columns works without Pillow installed.
fn image_imports(py: Python<'_>) -> PyResult<&ImageImports> {
    IMAGE_IMPORTS.get_or_try_init(py, || {
        let image = py.import("PIL.Image").map_err(|e| {
            pyo3::exceptions::PyImportError::new_err(format!(
                "decoding an image column needs Pillow (pip install pillow): {e}"
            ))
        })?;
        Ok(ImageImports {
            open: image.getattr("open")?.unbind(),
            frombytes: image.getattr("frombytes")?.unbind(),
        })
    })
}

/// Turns parsed samples into Python dicts for one dataset's columns.
pub struct Decoder {
    names: Vec<String>,
    encodings: Vec<Encoding>,
    py_names: Vec<Py<PyString>>,
    zero_copy: bool,
    allow_unsafe: bool,
}

impl Decoder {
    /// A decoder for columns `names` with `encodings` (same order as the raw columns);
    /// `zero_copy` gives `bytes` columns as [`Buffer`]s instead of `bytes`.
    pub fn new(
        py: Python<'_>,
        names: Vec<String>,
        encodings: Vec<Encoding>,
        zero_copy: bool,
        allow_unsafe: bool,
    ) -> Self {
        let py_names = names
            .iter()
            .map(|n| PyString::intern(py, n).unbind())
            .collect();
        Decoder {
            names,
            encodings,
            py_names,
            zero_copy,
            allow_unsafe,
        }
    }

    /// Column names, in raw column order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Column encodings, in raw column order.
    pub fn encodings(&self) -> &[Encoding] {
        &self.encodings
    }

    /// The sample as a dict `{column: object}`, built as Mosaic builds it.
    pub fn to_python<'py>(
        &self,
        py: Python<'py>,
        sample: ParsedSample,
    ) -> PyResult<Bound<'py, PyDict>> {
        if !self.zero_copy {
            crate::allocator::prime_for(sample.stored_bytes);
        }
        let imports = imports(py)?;
        let columns = match &sample.schema {
            SampleSchema::Wds(fields) => return self.wds_to_python(py, imports, fields, &sample),
            SampleSchema::LitData(fields) => {
                let fields = Arc::clone(fields);
                return lit_to_python(py, imports, &fields, sample);
            }
            SampleSchema::Mds(columns) => Arc::clone(columns),
        };
        let dict = PyDict::new(py);
        // Another stream's columns: their names are made for this sample.
        let own: Vec<Py<PyString>>;
        let (py_names, encodings): (&[Py<PyString>], &[Encoding]) =
            if columns.names() == self.names.as_slice() && columns.encodings() == self.encodings {
                (&self.py_names, &self.encodings)
            } else {
                own = columns
                    .names()
                    .iter()
                    .map(|n| PyString::intern(py, n).unbind())
                    .collect();
                (&own, columns.encodings())
            };
        for ((name, enc), column) in py_names.iter().zip(encodings).zip(sample.columns) {
            let object = match column {
                Column::Value(value) => value_to_python(py, imports, enc, value)?,
                Column::Stored(i) => {
                    let data = sample.raw.as_ref().and_then(|r| r.column(i)).unwrap_or(&[]);
                    match enc {
                        Encoding::Bytes if self.zero_copy => sample
                            .raw
                            .as_ref()
                            .and_then(|raw| Buffer::column(raw, i))
                            .unwrap_or_else(|| Buffer::new(bytes::Bytes::new()))
                            .into_pyobject(py)?
                            .into_any(),
                        _ => stored_to_python(py, imports, enc, data)?,
                    }
                }
            };
            dict.set_item(name.bind(py), object)?;
        }
        Ok(dict)
    }
}

impl Decoder {
    /// A WebDataset sample as `webdataset`'s `.decode()` gives it: `__key__`, `__url__`, then
    /// each member by its extension (text, integers and JSON here; the rest through
    /// `shardstream._wds.decode_field`; a member no decoder claims stays `bytes`).
    fn wds_to_python<'py>(
        &self,
        py: Python<'py>,
        imports: &Imports,
        fields: &shardstream_streamer::WdsFields,
        sample: &ParsedSample,
    ) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        let Some(raw) = sample.raw.as_ref() else {
            return Ok(dict);
        };
        dict.set_item("__key__", raw.key().unwrap_or_default())?;
        dict.set_item("__url__", &*fields.url)?;
        for (i, name) in fields.names.iter().enumerate() {
            let data = raw.column(i).unwrap_or(&[]);
            let object = match wds_kind(name) {
                WdsKind::Text => PyString::new(
                    py,
                    std::str::from_utf8(data).map_err(|e| {
                        pyo3::exceptions::PyValueError::new_err(format!(
                            "field {name:?} of sample {:?} is not UTF-8: {e}",
                            raw.key().unwrap_or_default()
                        ))
                    })?,
                )
                .into_any(),
                WdsKind::Int => imports.int.bind(py).call1((PyBytes::new(py, data),))?,
                WdsKind::Json => imports
                    .json_loads
                    .bind(py)
                    .call1((PyBytes::new(py, data),))?,
                WdsKind::Bytes => PyBytes::new(py, data).into_any(),
                WdsKind::Python => WDS_DECODE
                    .import(py, "shardstream._wds", "decode_field")?
                    .call1((name.clone(), PyBytes::new(py, data), self.allow_unsafe))?,
            };
            dict.set_item(name, object)?;
        }
        Ok(dict)
    }
}

/// A LitData item as litdata's `StreamingDataset` gives a flat dict item: each leaf by its
/// serializer (`tensor` leaves as torch tensors, `numpy` as arrays, `pil` as images, `int`,
/// `float`, `bool`, `str`, `bytes` as themselves).
fn lit_to_python<'py>(
    py: Python<'py>,
    imports: &Imports,
    fields: &shardstream_streamer::LitFields,
    sample: ParsedSample,
) -> PyResult<Bound<'py, PyDict>> {
    use shardstream_sharding::litdata::LeafFormat;
    let dict = PyDict::new(py);
    let decoder = &fields.decoder;
    for ((name, format), column) in decoder
        .columns
        .iter()
        .zip(&decoder.formats)
        .zip(sample.columns)
    {
        let Column::Value(value) = column else {
            continue;
        };
        let mut object = value_to_python(py, imports, &Encoding::Bytes, value)?;
        if matches!(format, LeafFormat::Tensor | LeafFormat::NoHeaderTensor(_)) {
            let from_numpy = TORCH_FROM_NUMPY.import(py, "torch", "from_numpy")?;
            object = from_numpy.call1((object.call_method0("copy")?,))?;
        }
        dict.set_item(name, object)?;
    }
    Ok(dict)
}

/// `torch.from_numpy`, imported on the first tensor leaf.
static TORCH_FROM_NUMPY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `shardstream._wds.decode_field`, imported on the first member that needs it.
static WDS_DECODE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// How a WebDataset member decodes, from its extension (`shardstream._wds` says the rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WdsKind {
    Text,
    Int,
    Json,
    Bytes,
    /// Decoded by `shardstream._wds.decode_field` (`.gz`, pickles, numpy, torch and others).
    Python,
}

fn wds_kind(name: &str) -> WdsKind {
    if name.ends_with(".gz") || name == "gz" {
        return WdsKind::Python;
    }
    let ext = name.rsplit('.').next().unwrap_or(name);
    match ext {
        "txt" | "text" | "transcript" => WdsKind::Text,
        "cls" | "cls2" | "index" | "inx" | "id" => WdsKind::Int,
        "json" | "jsn" => WdsKind::Json,
        "pkl" | "pickle" | "pyd" | "pth" | "npy" | "npz" | "ten" | "tb" | "mp" | "msg" | "cbor" => {
            WdsKind::Python
        }
        _ => WdsKind::Bytes,
    }
}

/// A column kept as stored: `json.loads` of its text, `pickle.loads` of its bytes, else `bytes`.
fn stored_to_python<'py>(
    py: Python<'py>,
    imports: &Imports,
    enc: &Encoding,
    data: &[u8],
) -> PyResult<Bound<'py, PyAny>> {
    match enc {
        Encoding::Json => {
            let text = std::str::from_utf8(data).map_err(|e| {
                pyo3::exceptions::PyUnicodeDecodeError::new_err(format!(
                    "json column is not UTF-8: {e}"
                ))
            })?;
            imports.json_loads.bind(py).call1((text,))
        }
        Encoding::Pickle => imports
            .pickle_loads
            .bind(py)
            .call1((PyBytes::new(py, data),)),
        _ => Ok(PyBytes::new(py, data).into_any()),
    }
}

fn value_to_python<'py>(
    py: Python<'py>,
    imports: &Imports,
    enc: &Encoding,
    value: Value,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Bytes(b) => stored_to_python(py, imports, enc, &b)?,
        Value::Str(s) => PyString::new(py, &s).into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Float(f) | Value::StrFloat(f) => f.into_pyobject(py)?.into_any(),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Scalar(s) => scalar_to_python(py, imports, &s)?,
        Value::StrInt(text) => py
            .get_type::<pyo3::types::PyInt>()
            .call1((PyString::new(py, &text),))?,
        Value::StrDecimal(text) => DECIMAL.import(py, "decimal", "Decimal")?.call1((text,))?,
        Value::Json(j) => imports.json_loads.bind(py).call1((j.to_string(),))?,
        Value::Pil(p) => pil_to_python(py, p)?,
        Value::Image(_, data) => image_to_python(py, imports, &data)?,
        Value::List(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(value_to_python(py, imports, enc, item)?)?;
            }
            list.into_any()
        }
        Value::NdArray(a) => ndarray_to_python(py, imports, a)?,
        Value::Pickle(b) => imports
            .pickle_loads
            .bind(py)
            .call1((PyBytes::new(py, &b),))?,
    })
}

fn np_type<'py>(py: Python<'py>, imports: &Imports, dtype: DType) -> PyResult<Bound<'py, PyAny>> {
    imports
        .np_types
        .iter()
        .find(|(d, _)| *d == dtype)
        .map(|(_, t)| t.bind(py).clone())
        .ok_or_else(|| {
            pyo3::exceptions::PyTypeError::new_err(format!("no numpy type for {}", dtype.name()))
        })
}

/// `np.frombuffer(data, dtype)[0]`, as Mosaic's `Scalar.decode`; integer and 32/64-bit float
/// scalars are built from their value, which gives the same object faster.
fn scalar_to_python<'py>(
    py: Python<'py>,
    imports: &Imports,
    s: &Scalar,
) -> PyResult<Bound<'py, PyAny>> {
    let ty = np_type(py, imports, s.dtype)?;
    let mut b8 = [0u8; 8];
    let n = s.bytes.len().min(8);
    b8[..n].copy_from_slice(&s.bytes[..n]);
    match s.dtype {
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => ty.call1((u64::from_le_bytes(b8),)),
        DType::I8 => ty.call1((i64::from(b8[0] as i8),)),
        DType::I16 => ty.call1((i64::from(i16::from_le_bytes([b8[0], b8[1]])),)),
        DType::I32 => ty.call1((i64::from(i32::from_le_bytes([b8[0], b8[1], b8[2], b8[3]])),)),
        DType::I64 => ty.call1((i64::from_le_bytes(b8),)),
        DType::F32 => ty.call1((f64::from(f32::from_le_bytes([b8[0], b8[1], b8[2], b8[3]])),)),
        DType::F64 => ty.call1((f64::from_le_bytes(b8),)),
        DType::F16 | DType::Bool => imports
            .np_frombuffer
            .bind(py)
            .call1((PyBytes::new(py, &s.bytes), ty))?
            .get_item(0),
    }
}

fn pil_to_python<'py>(py: Python<'py>, p: PilImage) -> PyResult<Bound<'py, PyAny>> {
    let size = PyTuple::new(py, [p.width, p.height])?;
    image_imports(py)?
        .frombytes
        .bind(py)
        .call1((p.mode, size, PyBytes::new(py, &p.data)))
}

fn image_to_python<'py>(
    py: Python<'py>,
    imports: &Imports,
    data: &[u8],
) -> PyResult<Bound<'py, PyAny>> {
    let buf = imports.bytes_io.bind(py).call1((PyBytes::new(py, data),))?;
    image_imports(py)?.open.bind(py).call1((buf,))
}

fn ndarray_to_python<'py>(
    py: Python<'py>,
    imports: &Imports,
    a: NdArray,
) -> PyResult<Bound<'py, PyAny>> {
    let flat = imports
        .np_frombuffer
        .bind(py)
        .call1((PyBytes::new(py, &a.data), a.dtype.name()))?;
    let shape = PyTuple::new(py, &a.shape)?;
    flat.call_method1("reshape", (shape,))
}
