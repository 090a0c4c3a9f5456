"""Adds the `shardstream` CLI binary, taken from maturin's bin wheel of the `cli` crate, to the
package's wheel as `<name>-<version>.data/scripts/shardstream`, with its RECORD line (sha256 and
size); pip installs a wheel's `.data/scripts/` files into the environment's `bin/`, executable.
Called by scripts/build-wheel.sh:

    python scripts/wheel_add_script.py CLI_WHEEL_DIR PACKAGE_WHEEL
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path


def main(cli_dir: Path, wheel: Path) -> None:
    (cli_wheel,) = cli_dir.glob("*.whl")
    with zipfile.ZipFile(cli_wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".data/scripts/shardstream")]
        binary = z.read(name)
    with zipfile.ZipFile(wheel) as z:
        entries = [(info, z.read(info)) for info in z.infolist()]
    record_info, record = next((i, b) for i, b in entries if i.filename.endswith(".dist-info/RECORD"))
    target = record_info.filename.rsplit("/", 1)[0].replace(".dist-info", ".data") + "/scripts/shardstream"
    if any(info.filename == target for info, _ in entries):
        raise SystemExit(f"{wheel} already holds {target}")
    digest = base64.urlsafe_b64encode(hashlib.sha256(binary).digest()).rstrip(b"=").decode()
    lines = record.decode().splitlines()
    lines.insert(len(lines) - 1, f"{target},sha256={digest},{len(binary)}")  # RECORD's own line stays last
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for info, data in entries:
            if info.filename != record_info.filename:
                z.writestr(info, data)
        script = zipfile.ZipInfo(target, date_time=record_info.date_time)
        script.external_attr = 0o100755 << 16  # a regular file, rwxr-xr-x
        script.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(script, binary)
        z.writestr(record_info, "\n".join(lines) + "\n")
    tmp.replace(wheel)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
