//! `ShardWriter`: Mosaic's `MDSWriter` over the formats crate's [`MdsWriter`].
//!
//! Python objects are turned into column bytes exactly as Mosaic's `mds_encode` does (`bytes`
//! pass through; images are saved with PIL; `json` is `json.dumps`; scalars are
//! `np.<dtype>(x).tobytes()`), with the GIL held; assembling, compressing, hashing and storing
//! shards then run with the GIL released.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use shardstream_sharding::compression::Compression;
use shardstream_sharding::hashing::HashAlgorithm;
use shardstream_sharding::mds::{Encoding, LocalDirSink, MdsWriter, MdsWriterOptions, ShardSink};
use shardstream_sharding::value::{DType, NdArray, PilImage, Value};
use shardstream_sharding::{FormatError, Sample};
use shardstream_storage::{named_options, Env, Location, StorageOptions};

use crate::errors::{from_format, from_storage};
use crate::runtime::runtime;

/// Stores files in an object store; blocks the writer thread until the PUT is done.
struct StoreSink {
    location: Location,
    runtime: Arc<tokio::runtime::Runtime>,
}

impl ShardSink for StoreSink {
    fn put(&self, name: &str, data: Vec<u8>) -> Result<(), FormatError> {
        self.runtime
            .block_on(self.location.put(name, Bytes::from(data)))
            .map_err(|e| FormatError::Io {
                path: self.location.url_of(name),
                source: std::io::Error::other(e.to_string()),
            })
    }
}

/// Writes an MDS dataset that Mosaic's `StreamingDataset` reads (native half of
/// `shardstream.ShardWriter`).
#[pyclass(module = "shardstream._native")]
pub struct NativeShardWriter {
    columns: Vec<(String, Encoding)>,
    writer: Mutex<Option<MdsWriter>>,
    out: String,
}

fn parse_or_value_error<T>(r: Result<T, FormatError>) -> PyResult<T> {
    r.map_err(|e| PyValueError::new_err(e.to_string()))
}

#[pymethods]
impl NativeShardWriter {
    #[new]
    #[pyo3(signature = (out, columns, compression=None, hashes=None, size_limit=Some(1 << 26), allow_unsafe_types=false, storage_options=Vec::new()))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's keywords, one each
    fn new(
        py: Python<'_>,
        out: String,
        columns: Vec<(String, String)>,
        compression: Option<String>,
        hashes: Option<Vec<String>>,
        size_limit: Option<u64>,
        allow_unsafe_types: bool,
        storage_options: Vec<(String, String)>,
    ) -> PyResult<Self> {
        let mut parsed = Vec::with_capacity(columns.len());
        for (name, enc) in &columns {
            let e = Encoding::parse(enc)
                .map_err(|e| PyValueError::new_err(format!("column {name:?}: {e}")))?;
            if e.is_unsafe() && !allow_unsafe_types {
                return Err(PyValueError::new_err(format!(
                    "column {name:?} uses the unsafe encoding {enc:?}; pass allow_unsafe_types=True to write it"
                )));
            }
            parsed.push((name.clone(), e));
        }
        let compression = compression
            .map(|c| parse_or_value_error(Compression::parse(&c)))
            .transpose()?;
        let hashes = parse_or_value_error(HashAlgorithm::parse_list(&hashes.unwrap_or_default()))?;
        let options = MdsWriterOptions {
            compression,
            hashes,
            size_limit,
            ..MdsWriterOptions::default()
        };
        let writer = py.detach(|| -> PyResult<MdsWriter> {
            let location = named_options::apply(&out, &storage_options, StorageOptions::default())
                .and_then(|options| Location::open_with(&out, &options, &Env::from_process()))
                .map_err(from_storage)?;
            let sink: Arc<dyn ShardSink> = match location.local_root() {
                Some(dir) => Arc::new(LocalDirSink::new(dir).map_err(from_format)?),
                None => Arc::new(StoreSink {
                    location: location.clone(),
                    runtime: runtime()?,
                }),
            };
            MdsWriter::new(&columns, options, sink).map_err(from_format)
        })?;
        Ok(NativeShardWriter {
            columns: parsed,
            writer: Mutex::new(Some(writer)),
            out,
        })
    }

    /// Encodes and adds one sample (a mapping of every column to its value).
    fn write(&self, py: Python<'_>, sample: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut encoded = Sample::new();
        for (name, enc) in &self.columns {
            let value = sample.get_item(name).map_err(|_| {
                pyo3::exceptions::PyKeyError::new_err(format!("sample has no column {name:?}"))
            })?;
            let bytes = encode_column(py, enc, &value).map_err(|e| {
                let msg = format!("column {name:?} ({enc}): {e}");
                if e.is_instance_of::<PyTypeError>(py) {
                    PyTypeError::new_err(msg)
                } else {
                    PyValueError::new_err(msg)
                }
            })?;
            encoded.insert(name.clone(), Value::Bytes(bytes));
        }
        py.detach(|| {
            let mut guard = self.writer.lock().unwrap_or_else(|p| p.into_inner());
            let writer = guard.as_mut().ok_or_else(|| closed(&self.out))?;
            writer.write(&encoded).map_err(from_format)
        })
    }

    /// Number of samples written so far.
    #[getter]
    fn samples_written(&self) -> u64 {
        let guard = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().map_or(0, MdsWriter::samples_written)
    }

    /// Flushes the last shard and writes `index.json`; returns the number of shards.
    fn finish(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| {
            let writer = self
                .writer
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .ok_or_else(|| closed(&self.out))?;
            writer
                .finish()
                .map(|index| index.shards.len())
                .map_err(from_format)
        })
    }
}

fn closed(out: &str) -> PyErr {
    PyValueError::new_err(format!("the ShardWriter for {out} is already finished"))
}

/// `mds_encode(encoding, obj)`.
fn encode_column(py: Python<'_>, enc: &Encoding, obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    let via_rust = |v: Value| -> PyResult<Vec<u8>> {
        enc.encode(&v)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    };
    match enc {
        Encoding::Bytes => Err(PyTypeError::new_err(format!(
            "expected bytes, got {}",
            obj.get_type().name()?
        ))),
        Encoding::Str => via_rust(Value::Str(obj.cast::<PyString>()?.to_str()?.to_owned())),
        Encoding::Int => via_rust(Value::Int(obj.extract::<i64>()?)),
        Encoding::Scalar(d) => {
            let ty = py.import("numpy")?.getattr(d.name())?;
            Ok(ty
                .call1((obj,))?
                .call_method0("tobytes")?
                .extract::<Vec<u8>>()?)
        }
        Encoding::StrInt | Encoding::StrFloat | Encoding::StrDecimal => {
            Ok(obj.str()?.to_str()?.as_bytes().to_vec())
        }
        Encoding::Pil => via_rust(Value::Pil(pil_value(obj)?)),
        Encoding::Jpeg => save_image(py, obj, "JPEG"),
        Encoding::Png => save_image(py, obj, "PNG"),
        Encoding::JpegArray => {
            let items: Vec<Vec<u8>> = obj.extract()?;
            let mut out = (items.len() as u32).to_le_bytes().to_vec();
            join_sized(&mut out, &items)?;
            Ok(out)
        }
        Encoding::PilList | Encoding::JpegList | Encoding::PngList => {
            let list = obj.cast::<PyList>()?;
            let mut items = Vec::with_capacity(list.len());
            for item in list.iter() {
                items.push(match enc {
                    Encoding::PilList => Encoding::Pil
                        .encode(&Value::Pil(pil_value(&item)?))
                        .map_err(|e| PyValueError::new_err(e.to_string()))?,
                    Encoding::JpegList => save_image(py, &item, "JPEG")?,
                    _ => save_image(py, &item, "PNG")?,
                });
            }
            let mut out = 0u32.to_le_bytes().to_vec();
            out.extend_from_slice(&(items.len() as u32).to_le_bytes());
            join_sized(&mut out, &items)?;
            Ok(out)
        }
        Encoding::Pickle => Ok(py
            .import("pickle")?
            .call_method1("dumps", (obj,))?
            .extract::<Vec<u8>>()?),
        Encoding::Json => {
            let np = py.import("numpy")?;
            let obj = if obj.is_instance(&np.getattr("ndarray")?)? {
                obj.call_method0("tolist")?
            } else {
                obj.clone()
            };
            let text = py.import("json")?.call_method1("dumps", (obj,))?;
            Ok(text.cast::<PyString>()?.to_str()?.as_bytes().to_vec())
        }
        Encoding::NdArray { .. } => {
            let dtype_name: String = obj.getattr("dtype")?.getattr("name")?.extract()?;
            let dtype = DType::from_name(&dtype_name).ok_or_else(|| {
                PyValueError::new_err(format!("unsupported ndarray dtype {dtype_name}"))
            })?;
            let shape: Vec<u64> = obj.getattr("shape")?.extract()?;
            let data: Vec<u8> = obj.call_method0("tobytes")?.extract()?;
            via_rust(Value::NdArray(NdArray { dtype, shape, data }))
        }
    }
}

/// Appends `u32 size[n]` then the items.
fn join_sized(out: &mut Vec<u8>, items: &[Vec<u8>]) -> PyResult<()> {
    for item in items {
        let len = u32::try_from(item.len())
            .map_err(|_| PyValueError::new_err("a list element exceeds 4 GiB"))?;
        out.extend_from_slice(&len.to_le_bytes());
    }
    for item in items {
        out.extend_from_slice(item);
    }
    Ok(())
}

fn pil_value(obj: &Bound<'_, PyAny>) -> PyResult<PilImage> {
    let (width, height): (u32, u32) = obj.getattr("size")?.extract()?;
    Ok(PilImage {
        width,
        height,
        mode: obj.getattr("mode")?.extract()?,
        data: obj.call_method0("tobytes")?.extract()?,
    })
}

/// Mosaic's `JPEG.encode` / `PNG.encode`: a JPEG opened from a file is stored as that file's
/// bytes; anything else is saved in memory with PIL.
fn save_image(py: Python<'_>, obj: &Bound<'_, PyAny>, format: &str) -> PyResult<Vec<u8>> {
    let image_mod = py.import("PIL.Image")?;
    if !obj.is_instance(&image_mod.getattr("Image")?)? {
        return Err(PyTypeError::new_err(format!(
            "expected a PIL image, got {}",
            obj.get_type().name()?
        )));
    }
    if format == "JPEG" {
        let jpeg_file = py.import("PIL.JpegImagePlugin")?.getattr("JpegImageFile")?;
        if obj.is_instance(&jpeg_file)? {
            if let Ok(name) = obj.getattr("filename") {
                if let Ok(path) = name.extract::<String>() {
                    if !path.is_empty() {
                        match py.detach(|| std::fs::read(&path)) {
                            Ok(data) => return Ok(data),
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => {
                                return Err(pyo3::exceptions::PyOSError::new_err(format!(
                                    "{path}: {e}"
                                )))
                            }
                        }
                    }
                }
            }
        }
    }
    let buf = py.import("io")?.getattr("BytesIO")?.call0()?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("format", format)?;
    obj.call_method("save", PyTuple::new(py, [&buf])?, Some(&kwargs))?;
    buf.call_method0("getvalue")?.extract()
}
