"""The type stubs describe the native module as it is: every public name of `shardstream._native`
is in `_native.pyi` and the other way round, every method and property a stub class lists exists
on the runtime class, and the package ships `py.typed`."""

from __future__ import annotations

import ast
from pathlib import Path

import shardstream
import shardstream._native as native

PKG = Path(shardstream.__file__).parent


def _stub() -> ast.Module:
    return ast.parse((PKG / "_native.pyi").read_text())


def test_stub_names_match_module():
    tree = _stub()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    public = {n for n in dir(native) if not n.startswith("_")}
    assert {n for n in names if not n.startswith("_")} == public
    # Private names the package's Python code uses are stubbed too, and must exist.
    assert all(hasattr(native, n) for n in names)


def test_stub_methods_exist():
    for node in _stub().body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Native"):
            cls = getattr(native, node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name != "__init__":
                    assert hasattr(cls, item.name), f"{node.name}.{item.name} is in the stub only"


def test_py_typed_and_public_api():
    assert (PKG / "py.typed").exists()
    for name in shardstream.__all__:
        assert hasattr(shardstream, name)
