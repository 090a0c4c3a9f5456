"""What the first sample costs in imports: Pillow is imported by the first image column and
`decimal` by the first `str_decimal` value, not by every dataset. Importing it took most of the time to the first sample of a dataset without images
(about 7 ms of 10), so a non-image dataset must stream without it, and an image dataset must
still decode its images as Mosaic does (tests/python/test_dataset_interop.py compares them)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import write_ids

CHILD = r"""
import sys
import shardstream
assert "PIL" not in sys.modules, "importing shardstream imported Pillow"
sys.modules.pop("decimal", None)  # whatever imported it before, the stream must not need it
ds = shardstream.StreamingDataset(local=sys.argv[1])
ids = [int(s["id"]) for s in ds]
assert ids == list(range(int(sys.argv[2]))), ids[:10]
sample = ds[3]
assert sample["pad"] == bytes([3]) * 16
print("PIL" in sys.modules, "decimal" in sys.modules)
"""


def test_a_dataset_without_images_or_decimals_imports_neither(tmp_path, stream_env):
    root = tmp_path / "mds"
    write_ids(root, 20, extra=16)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), "20"],
        capture_output=True,
        text=True,
        env={**os.environ, **stream_env},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False False", (
        "streaming a dataset without image or str_decimal columns imported Pillow or decimal: "
        + proc.stdout
    )


def test_an_image_column_still_decodes_to_a_pil_image(tmp_path, stream_env):
    from PIL import Image
    from streaming import MDSWriter

    import shardstream

    root = tmp_path / "img"
    image = Image.new("RGB", (4, 3), (10, 20, 30))
    with MDSWriter(out=str(root), columns={"id": "int", "img": "pil"}) as w:
        w.write({"id": 0, "img": image})
    [sample] = list(shardstream.StreamingDataset(local=str(root)))
    assert isinstance(sample["img"], Image.Image)
    assert sample["img"].tobytes() == image.tobytes()
    assert sample["img"].size == (4, 3) and sample["img"].mode == "RGB"


def test_a_str_decimal_column_still_decodes_to_a_decimal(tmp_path, stream_env):
    from decimal import Decimal

    from streaming import MDSWriter

    import shardstream

    root = tmp_path / "dec"
    with MDSWriter(out=str(root), columns={"id": "int", "d": "str_decimal"}) as w:
        w.write({"id": 0, "d": Decimal("3.14159265358979323846")})
    [sample] = list(shardstream.StreamingDataset(local=str(root)))
    assert isinstance(sample["d"], Decimal)
    assert sample["d"] == Decimal("3.14159265358979323846")


WORKER_CHILD = r"""
import sys
import shardstream
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

class WorkerModules(IterableDataset):
    def __iter__(self):
        yield get_worker_info().id

ds = shardstream.StreamingDataset(local=sys.argv[1])
print("numpy.random" in sys.modules)
print(sorted(int(w) for w in DataLoader(WorkerModules(), batch_size=None, num_workers=2)))
"""


def test_forked_workers_inherit_numpy_random(tmp_path, stream_env):
    """torch seeds `numpy.random` in each DataLoader worker once numpy is loaded, importing it
    in the worker (12-15 ms per worker per epoch) if the parent had not; `import shardstream`
    imports it once in the parent instead."""
    root = tmp_path / "mds"
    write_ids(root, 4)
    proc = subprocess.run(
        [sys.executable, "-c", WORKER_CHILD, str(root)],
        capture_output=True,
        text=True,
        env={**os.environ, **stream_env},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "[0,", "1]"], proc.stdout
