"""Turns what the peer libraries yield (numpy scalars and arrays, PIL images, Decimals, bytes) and
what `shardstream cat --json` prints into one comparable form.

Images are compared by their decoded pixels (mode, size, raw bytes) so that a JPEG Mosaic decodes
to a PIL image compares equal to the JPEG bytes shardstream hands over undecoded."""

from __future__ import annotations

import io
import math
from decimal import Decimal

import numpy as np
from PIL import Image


def _img(im: Image.Image) -> tuple:
    return ("image", im.mode, im.size, im.tobytes())


def _float(v) -> object:
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def from_peer(value, encoding: str):
    """Normalises one column value as Mosaic's StreamingDataset yields it."""
    if encoding in ("jpeg", "png", "pil"):
        return _img(value)
    if encoding in ("jpeg_array", "jpegarray") or encoding.startswith("list["):
        return ["list", [_img(v) for v in value]]
    if encoding.startswith("ndarray"):
        arr = np.asarray(value)
        return ("ndarray", str(arr.dtype), list(arr.shape), [_float(x) if arr.dtype.kind == "f" else int(x) for x in arr.ravel()])
    if encoding in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"):
        return ("scalar", encoding, int(value))
    if encoding in ("float16", "float32", "float64"):
        return ("scalar", encoding, _float(value))
    if encoding == "str_int":
        return ("str_int", str(value))
    if encoding == "str_float":
        return ("str_float", _float(value))
    if encoding == "str_decimal":
        assert isinstance(value, Decimal)
        return ("str_decimal", str(value))
    if encoding == "json":
        return ("json", value)
    if encoding == "bytes":
        return ("bytes", bytes(value))
    if encoding in ("str", "int"):
        return value
    if encoding == "pkl":
        return ("pkl", value)
    raise ValueError(f"unknown encoding {encoding}")


def from_shardstream(value):
    """Normalises one canonical JSON value printed by `shardstream cat --json`."""
    if not isinstance(value, dict) or "$type" not in value:
        return value
    ty = value["$type"]
    if ty in ("jpeg", "png"):
        return _img(Image.open(io.BytesIO(bytes.fromhex(value["hex"]))))
    if ty == "pil":
        return ("image", value["mode"], (value["width"], value["height"]), bytes.fromhex(value["hex"]))
    if ty == "list":
        return ["list", [from_shardstream(v) for v in value["items"]]]
    if ty == "ndarray":
        return ("ndarray", value["dtype"], list(value["shape"]), list(value["values"]))
    if ty in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"):
        return ("scalar", ty, int(value["value"]))
    if ty in ("float16", "float32", "float64"):
        return ("scalar", ty, value["value"])
    if ty in ("str_int", "str_decimal"):
        return (ty, value["text"])
    if ty == "str_float":
        return ("str_float", value["value"])
    if ty == "json":
        return ("json", value["value"])
    if ty == "bytes":
        return ("bytes", bytes.fromhex(value["hex"]))
    raise ValueError(f"unknown canonical type {ty}")
