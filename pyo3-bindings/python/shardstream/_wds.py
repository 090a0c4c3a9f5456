"""WebDataset field decoding, as ``webdataset``'s ``.decode()`` with no arguments decodes.

``webdataset.autodecode.Decoder`` with its default handlers: a ``.gz`` field is inflated and
decoded by the extension before it (the field keeps its name, ``txt.gz``), then the last
extension picks the decoder of ``autodecode.decoders``; a field no decoder claims (images,
audio, unknown extensions) stays ``bytes``. The native layer decodes text, integers and JSON
itself and calls :func:`decode_field` for the rest. Pickles (``pkl``, ``pickle``, ``pyd``) and
``pth`` are loaded only with ``allow_unsafe_types=True``: webdataset loads them by default
(unless ``WDS_SECURE=1``), shardstream does not run code from data unless asked.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

_TEXT = {"txt", "text", "transcript"}
_INT = {"cls", "cls2", "index", "inx", "id"}
_JSON = {"json", "jsn"}
_PICKLE = {"pkl", "pickle", "pyd"}


def _extension(key: str) -> str:
    # ``re.sub(r".*[.]", "", key)``: what follows the last dot.
    return key.rsplit(".", 1)[-1]


def decode_field(name: str, data: bytes, allow_unsafe: bool) -> Any:
    """Field ``name`` (its extension, ``jpg`` or ``seg.png``) of a sample, decoded."""
    key = "." + name
    if key.endswith(".gz"):
        import gzip

        with gzip.open(io.BytesIO(data)) as stream:
            data = stream.read()
        key = key[:-3]
    ext = _extension(key)
    if ext in _TEXT:
        return data.decode("utf-8")
    if ext in _INT:
        return int(data)
    if ext in _JSON:
        return json.loads(data)
    if ext in _PICKLE or ext == "pth":
        if not allow_unsafe:
            raise ValueError(
                f"field {name!r} is a {ext} file, which runs code when loaded: pass "
                "allow_unsafe_types=True to load it (webdataset loads it by default)"
            )
        if ext == "pth":
            import torch

            weights_only = os.environ.get("WDS_PYTORCH_WEIGHTS_ONLY", "0") == "1"
            return torch.load(io.BytesIO(data), weights_only=weights_only, map_location="cpu")
        import pickle

        return pickle.loads(data)
    if ext == "npy":
        import numpy.lib.format

        return numpy.lib.format.read_array(io.BytesIO(data))
    if ext == "npz":
        import numpy as np

        return dict(np.load(io.BytesIO(data)))
    if ext in ("ten", "tb"):
        from webdataset import tenbin

        return tenbin.decode_buffer(data)
    if ext in ("mp", "msg"):
        import msgpack

        return msgpack.unpackb(data)
    if ext == "cbor":
        import cbor  # type: ignore[import-not-found]

        return cbor.loads(data)
    return data


def needs_python(name: str) -> bool:
    """Whether :func:`decode_field` does more for ``name`` than the native text, int and JSON
    decoders and plain bytes."""
    key = "." + name
    if key.endswith(".gz"):
        return True
    ext = _extension(key)
    return ext in _PICKLE or ext in {"pth", "npy", "npz", "ten", "tb", "mp", "msg", "cbor"}
