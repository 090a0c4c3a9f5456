"""Every `SHARDSTREAM_*` variable that a manifest, the Dockerfile or the Airflow DAG sets is read
by the product's code: a ConfigMap key that nothing reads is a setting the user believes in and
nobody honours (the memory budget stayed at its default while the ConfigMap said 4GiB). A
variable counts as read when the Rust sources (outside tests) or the Python package name it as a
string, or when the manifests themselves substitute it into a command (`$(SHARDSTREAM_X)`); and
docs/configuration.md lists every variable the code reads."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VAR = re.compile(r"\bSHARDSTREAM_[A-Z0-9_]+\b")
# Names a manifest sets: ConfigMap data keys, `- name: X` env entries, Dockerfile ENV, the DAG's
# V1EnvVar(name="X").
SET = re.compile(r"(?:^\s*(SHARDSTREAM_[A-Z0-9_]+):|name:\s*\"?(SHARDSTREAM_[A-Z0-9_]+)\"?|"
                 r"ENV\s+(SHARDSTREAM_[A-Z0-9_]+)|name=\"(SHARDSTREAM_[A-Z0-9_]+)\")", re.M)


def deploy_files() -> list[Path]:
    out = []
    for p in (ROOT / "deploy").rglob("*"):
        if p.is_file() and p.suffix in (".yaml", ".yml", ".py", "") and "schemas" not in p.parts:
            out.append(p)
    return out


def set_by_manifests() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for p in deploy_files():
        for m in SET.finditer(p.read_text(errors="replace")):
            name = next(g for g in m.groups() if g)
            found.setdefault(name, []).append(str(p.relative_to(ROOT)))
    return found


def substituted_by_manifests() -> set[str]:
    names = set()
    for p in deploy_files():
        names.update(re.findall(r"\$\((SHARDSTREAM_[A-Z0-9_]+)\)", p.read_text(errors="replace")))
    return names


def read_by_code() -> set[str]:
    names: set[str] = set()
    sources = [p for p in ROOT.glob("*/src/**/*.rs")]
    sources += list((ROOT / "pyo3-bindings" / "python").rglob("*.py"))
    for p in sources:
        text = p.read_text(errors="replace")
        # Quoted names only: a doc comment that mentions a variable does not read it.
        names.update(re.findall(r"\"(SHARDSTREAM_[A-Z0-9_]+)\"", text))
    return names


def test_every_variable_a_manifest_sets_is_read_by_code():
    code = read_by_code() | substituted_by_manifests()
    unread = {name: where for name, where in set_by_manifests().items() if name not in code}
    assert not unread, f"set by manifests but read by no code: {unread}"


def test_the_check_catches_an_unread_variable(tmp_path):
    sample = "data:\n  SHARDSTREAM_NOT_A_SETTING: 1\n"
    names = {next(g for g in m.groups() if g) for m in SET.finditer(sample)}
    assert names == {"SHARDSTREAM_NOT_A_SETTING"}
    assert "SHARDSTREAM_NOT_A_SETTING" not in read_by_code()


def test_configuration_doc_lists_every_variable_the_code_reads():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    listed = set(VAR.findall(doc))
    # Test-only and internal variables are not settings.
    internal = {n for n in read_by_code() if re.search(r"_TEST_|^SHARDSTREAM_BENCH|_PAUSE_AT$", n)}
    missing = read_by_code() - internal - listed
    assert not missing, f"read by code but missing from docs/configuration.md: {sorted(missing)}"
