"""Where the Python dataset caches, by the precedence docs/deploy.md promises: an explicit root,
else SHARDSTREAM_CACHE_DIR as is (the folder `shardstream run` or the pod's volume keyed by run
and node), else <SHARDSTREAM_CACHE_ROOT>/<run>/<node>. Each case runs in a fresh interpreter so
the environment is the process's own."""

import json
import os
import subprocess
import sys

import pytest

from shardstream import ShardWriter

PROBE = """
import json, sys, shardstream
kwargs = json.loads(sys.argv[2])
print(shardstream.StreamingDataset(remote=sys.argv[1], **kwargs).cache_dir)
"""


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds") / "remote"
    with ShardWriter(out=str(out), columns={"x": "int"}) as w:
        for i in range(10):
            w.write({"x": i})
    return str(out)


def cache_dir(remote, env_extra, **kwargs):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDSTREAM_")}
    env.update({"SHARDSTREAM_RUN_ID": "run-a", "SHARDSTREAM_NODE_RANK": "3", **env_extra})
    out = subprocess.run(
        [sys.executable, "-c", PROBE, remote, json.dumps(kwargs)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_cache_dir_env_is_used_as_is(remote, tmp_path):
    given = tmp_path / "volume" / "node"
    got = cache_dir(remote, {"SHARDSTREAM_CACHE_DIR": str(given), "SHARDSTREAM_CACHE_ROOT": str(tmp_path / "root")})
    assert got == str(given)


def test_cache_root_env_is_keyed_by_run_and_node(remote, tmp_path):
    got = cache_dir(remote, {"SHARDSTREAM_CACHE_ROOT": str(tmp_path / "root")})
    assert got == str(tmp_path / "root" / "run-a" / "3")


def test_explicit_root_beats_the_environment(remote, tmp_path):
    got = cache_dir(remote, {"SHARDSTREAM_CACHE_DIR": str(tmp_path / "given")}, cache_root=str(tmp_path / "explicit"))
    assert got == str(tmp_path / "explicit" / "run-a" / "3")
