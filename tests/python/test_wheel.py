"""The release wheel as a pip user gets it: built by scripts/build-wheel.sh (abi3, manylinux_2_28,
zig), installed into a fresh venv of another CPython than the tests' own, where `import
shardstream` works, the `shardstream` command is on the venv's PATH and answers `--version`, and
the metadata a package index shows is there (readme, URLs, classifiers, license,
requires-python).

The release build is two release builds (15-25 minutes cold on the 2-core development VM), so by
default the test builds the quick variant (`SHARDSTREAM_WHEEL_QUICK=1`: the same layout and abi3
module from the dev profile the tests already built, tagged `linux_x86_64`, no manylinux check).
`SHARDSTREAM_WHEEL=<path to a built wheel>` installs that one instead (the release wheel: its
manylinux_2_28 tag is then checked too). `SHARDSTREAM_WHEEL_PYTHON` picks the interpreter
(default: the first of pyenv's 3.12, 3.13 found).

    .venv/bin/python -m pytest -q tests/python/test_wheel.py
    SHARDSTREAM_WHEEL=$(bash scripts/build-wheel.sh) .venv/bin/python -m pytest -q tests/python/test_wheel.py
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_CANDIDATES = [
    os.environ.get("SHARDSTREAM_WHEEL_PYTHON"),
    "/root/.pyenv/versions/3.12.1/bin/python3",
    "/root/.pyenv/versions/3.13.0/bin/python3",
    shutil.which("python3.12"),
    shutil.which("python3.13"),
]


def _other_python() -> str | None:
    for c in _CANDIDATES:
        if c and Path(c).exists():
            version = subprocess.run([c, "-c", "import sys; print(sys.version_info[:2])"],
                                     capture_output=True, text=True).stdout.strip()
            if version and version != str(tuple(sys.version_info[:2])):
                return c
    return None


@pytest.fixture(scope="module")
def wheel() -> Path:
    given = os.environ.get("SHARDSTREAM_WHEEL")
    if given:
        return Path(given)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "build-wheel.sh"), str(ROOT / "target" / "wheels-quick")],
                         capture_output=True, text=True,
                         env=dict(os.environ, SHARDSTREAM_PYTHON=sys.executable, SHARDSTREAM_WHEEL_QUICK="1"))
    assert out.returncode == 0, out.stderr[-4000:]
    return Path(out.stdout.strip().splitlines()[-1])


def test_wheel_tags_and_metadata(wheel):
    name = wheel.name
    assert "-cp311-abi3-" in name, name
    if os.environ.get("SHARDSTREAM_WHEEL"):  # the release wheel; the quick one is plain linux
        assert "manylinux_2_28_x86_64" in name, name
    else:
        assert name.endswith("-linux_x86_64.whl"), name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(z.read(meta_name))
        assert any(n.endswith(".data/scripts/shardstream") for n in names), "no shardstream command"
        assert any(n.endswith("_native.abi3.so") for n in names), names
        assert "shardstream/py.typed" in names
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["License-Expression"] == "Apache-2.0" or "Apache" in (meta["License"] or "")
    assert "pip install shardstream" in meta.get_payload()
    assert meta["Description-Content-Type"].startswith("text/markdown")
    urls = meta.get_all("Project-URL")
    assert any(u.startswith("Repository,") for u in urls), urls
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3.12" in classifiers


def test_installs_into_another_python(wheel, tmp_path):
    python = _other_python()
    if python is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no CPython other than the tests' own (pyenv 3.12 or 3.13) on this machine")
        pytest.skip("no CPython other than the tests' own (pyenv 3.12 or 3.13) on this machine")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-4000:]
    # Run from outside the checkout, so that nothing of it can be imported by accident.
    code = ("import shardstream, sys; print(shardstream.__version__, shardstream.__file__); "
            "print(sys.version_info[:2])")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert str(venv) in out.stdout
    cli = venv / "bin" / "shardstream"
    assert cli.exists() and os.access(cli, os.X_OK)
    version = subprocess.run([str(cli), "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("shardstream "), version.stdout
    # On PATH of the activated venv, as `pip install` users run it.
    env = dict(os.environ, PATH=f"{venv / 'bin'}:{os.environ.get('PATH', '')}")
    on_path = subprocess.run(["shardstream", "--version"], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert on_path.stdout == version.stdout
